#!/usr/bin/env bash
# A bounded libFuzzer run of the checkpoint reader (dos_checkpoint_load, graph/checkpoint.c)
# under ASan and UBSan: builds tests/fuzz/fuzz_checkpoint.c with graph/checkpoint.c,
# integration/errors.c and codelets/dtype.c (plain C; StarPU only for its headers, which
# include/dos.h includes), writes a seed corpus of valid checkpoints, fuzzes for SECONDS and
# prints one summary line:
#   fuzz: checkpoint reader: N runs in S s, coverage C, crashes K
# Exits 1 when the run found a crash (crash-*, leak-*, timeout-* or oom-* file), printing
# the file, a hexdump and the command that reproduces it. See tests/fuzz/README.md.
#
# Usage: tools/fuzz.sh [SECONDS]     (default 60; `make fuzz FUZZ_SECONDS=...`)
# Environment: FUZZ_DIR      build and run folder (default /tmp/starpu-dos-fuzz): the
#                            binary, seeds/, corpus/ (kept and grown across runs),
#                            artifacts/ (crash files), fuzz.log (libFuzzer's output)
#              FUZZ_CC       the compiler (default clang; needs -fsanitize=fuzzer)
#              FUZZ_ARGS     extra libFuzzer arguments, e.g. "-jobs=4 -workers=4" or "-seed=1"
#              STARPU_PREFIX a StarPU 1.4 install (default: tools/deps.sh --print-prefix native)
set -euo pipefail

die() {
	printf 'fuzz: error: %s\n' "$*" >&2
	exit 2
}

top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
duration=${1:-60}
[[ $duration =~ ^[1-9][0-9]*$ ]] || die "SECONDS must be a positive integer, got '$duration'"
dir=${FUZZ_DIR:-/tmp/starpu-dos-fuzz}
cc=${FUZZ_CC:-clang}
command -v "$cc" >/dev/null || die "no $cc (libFuzzer comes with clang: apt-get install clang)"

prefix=${STARPU_PREFIX:-$("$top"/tools/deps.sh --print-prefix native)}
starpu_include=$prefix/include/starpu/1.4
[[ -f $starpu_include/starpu.h ]] || die "no starpu.h in $starpu_include (set STARPU_PREFIX)"

mkdir -p "$dir/include" "$dir/corpus" "$dir/artifacts"
dir=$(cd "$dir" && pwd)

# include/dos_version.h is made by configure; the same substitution, from configure.ac.
version=$(sed -n 's/^AC_INIT(\[[^]]*\], *\[\([0-9.]*\)\].*/\1/p' "$top/configure.ac")
[[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "cannot read the version from configure.ac (got '$version')"
IFS=. read -r major minor patch <<<"$version"
sed -e "s/@DOS_VERSION_MAJOR@/$major/" -e "s/@DOS_VERSION_MINOR@/$minor/" -e "s/@DOS_VERSION_PATCH@/$patch/" \
	-e "s/@PACKAGE_VERSION@/$version/" "$top/include/dos_version.h.in" >"$dir/include/dos_version.h.new"
cmp -s "$dir/include/dos_version.h.new" "$dir/include/dos_version.h" 2>/dev/null ||
	mv "$dir/include/dos_version.h.new" "$dir/include/dos_version.h"
rm -f "$dir/include/dos_version.h.new"

bin=$dir/fuzz_checkpoint
echo "fuzz: building $bin" >&2
"$cc" -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
	-Wall -Wextra -Werror -std=gnu11 \
	-I "$dir/include" -I "$top/include" -I "$top/integration" -I "$top/graph" -I "$top/codelets" -I "$top/tests" \
	-I "$starpu_include" \
	"$top/tests/fuzz/fuzz_checkpoint.c" "$top/graph/checkpoint.c" "$top/integration/errors.c" \
	"$top/codelets/dtype.c" -lpthread -o "$bin.new"
mv "$bin.new" "$bin"

# Seeds: valid checkpoints written by dos_checkpoint_save itself, fresh every run,
rm -rf "$dir/seeds"
mkdir "$dir/seeds"
DOS_FUZZ_WRITE_SEEDS=$dir/seeds "$bin" || die "writing the seed corpus failed"
# and two damaged ones: one byte short, and trailing bytes (libFuzzer only slowly grows its
# inputs beyond the largest seed).
head -c 675 "$dir/seeds/checkpoint-101.dos" >"$dir/seeds/truncated.dos"
{
	cat "$dir/seeds/checkpoint-202.dos"
	printf 'trailing'
} >"$dir/seeds/trailing-garbage.dos"
# Tokens of the format (libFuzzer's dictionary syntax).
cat >"$dir/checkpoint.dict" <<'EOF'
magic="DOSCKPT\x00"
version="\x01\x00\x00\x00"
marker="\x04\x03\x02\x01"
marker_swapped="\x01\x02\x03\x04"
header_len="\xac\x00\x00\x00"
tag_master="master\x00\x00"
tag_m="adam_m\x00\x00"
tag_v="adam_v\x00\x00"
section_len="\x94\x00\x00\x00\x00\x00\x00\x00"
EOF

# Artifacts of this run only are counted (older ones stay for whoever is looking at them).
stamp=$dir/artifacts/.run-start
touch "$stamp"
log=$dir/fuzz.log
echo "fuzz: running for $duration s (libFuzzer's output in $log)" >&2
# The fuzzer's temporary folder in $dir/tmp: an aborted run leaves it there, not in /tmp.
mkdir -p "$dir/tmp"
rc=0
# shellcheck disable=SC2086 # FUZZ_ARGS is words on purpose
TMPDIR=$dir/tmp "$bin" -max_total_time="$duration" -timeout=10 -rss_limit_mb=2048 -max_len=4096 -use_value_profile=1 \
	-print_final_stats=1 -dict="$dir/checkpoint.dict" -artifact_prefix="$dir/artifacts/" ${FUZZ_ARGS:-} \
	"$dir/corpus" "$dir/seeds" >"$log" 2>&1 || rc=$?

runs=$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' "$log" | tail -n 1)
[[ -n $runs ]] || runs=$(sed -n 's/^#\([0-9]*\).*/\1/p' "$log" | tail -n 1)
secs=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -n 1)
[[ -n $secs ]] || secs=$(($(date +%s) - $(stat -c %Y "$stamp")))
cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | cut -d' ' -f2 || true)
mapfile -t found < <(find "$dir/artifacts" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'leak-*' \
	-o -name 'timeout-*' -o -name 'oom-*' \) -newer "$stamp" | sort)
echo "fuzz: checkpoint reader: ${runs:-?} runs in $secs s, coverage ${cov:-?}, crashes ${#found[@]}"

if [[ ${#found[@]} -gt 0 || $rc -ne 0 ]]; then
	echo "fuzz: libFuzzer exited with $rc; the end of $log:" >&2
	tail -n 60 "$log" >&2
	for f in "${found[@]}"; do
		echo "fuzz: found $f ($(stat -c %s "$f") bytes):" >&2
		od -A x -t x1z -v "$f" | head -n 64 >&2
		echo "fuzz: reproduce with: DOS_QUIET=0 $bin $f" >&2
	done
	exit 1
fi
