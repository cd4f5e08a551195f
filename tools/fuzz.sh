#!/usr/bin/env bash
# Bounded libFuzzer runs under ASan and UBSan, one after the other, each given about half
# of SECONDS:
#   checkpoint  the checkpoint reader (_dos_checkpoint_load, graph/checkpoint.c):
#               tests/fuzz/fuzz_checkpoint.c with graph/checkpoint.c, base/files.c,
#               base/errors.c
#               and codelets/dtype.c; seeds: valid checkpoints;
#   options     dos-train's option parser (dos_train_parse_options, tools/train_options.c):
#               tests/fuzz/fuzz_options.c with tools/train_options.c, graph/model.c,
#               base/parse.c, base/errors.c and codelets/step.c (the hyperparameters'
#               rule); seeds: the command lines of tests/test_train.sh.
# Plain C, no libstarpu: StarPU only for its headers (include/dos.h includes starpu.h).
# One summary line per target:
#   fuzz: checkpoint reader: N runs in S s, coverage C, crashes K
#   fuzz: option parser: N runs in S s, coverage C, crashes K
# Exits 1 when a run found a crash (crash-*, leak-*, timeout-* or oom-* file), printing the
# file, a hexdump and the command that reproduces it. See tests/fuzz/README.md.
#
# Usage: tools/fuzz.sh [SECONDS]     (default 60, in all; `make fuzz FUZZ_SECONDS=...`)
# Environment: FUZZ_DIR      build and run folder (default /tmp/starpu-dos-fuzz): the
#                            binaries, and per target (checkpoint/, options/) seeds/,
#                            corpus/ (kept and grown across runs), artifacts/ (crash
#                            files), fuzz.log (libFuzzer's output)
#              FUZZ_TARGETS  which targets, in order (default "checkpoint options"); a
#                            single one gets all of SECONDS
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
read -r -a targets <<<"${FUZZ_TARGETS:-checkpoint options}"
[[ ${#targets[@]} -gt 0 ]] || die "FUZZ_TARGETS is empty"
for target in "${targets[@]}"; do
	[[ $target == checkpoint || $target == options ]] ||
		die "unknown target '$target' in FUZZ_TARGETS (checkpoint, options)"
done
dir=${FUZZ_DIR:-/tmp/starpu-dos-fuzz}
cc=${FUZZ_CC:-clang}
command -v "$cc" >/dev/null || die "no $cc (libFuzzer comes with clang: apt-get install clang)"

prefix=${STARPU_PREFIX:-$("$top"/tools/deps.sh --print-prefix native)}
starpu_include=$prefix/include/starpu/1.4
[[ -f $starpu_include/starpu.h ]] || die "no starpu.h in $starpu_include (set STARPU_PREFIX)"

mkdir -p "$dir/include"
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

# config.h is made by configure too; the fuzzed files need none of its switches (no CUDA,
# no MPI here), only the file.
printf '/* tools/fuzz.sh: a CPU-only build */\n#define DOS_HAVE_MPI 0\n' >"$dir/include/config.h.new"
cmp -s "$dir/include/config.h.new" "$dir/include/config.h" 2>/dev/null || mv "$dir/include/config.h.new" "$dir/include/config.h"
rm -f "$dir/include/config.h.new"

sanitize=(-g -O1 -fno-omit-frame-pointer "-fsanitize=fuzzer,address,undefined" -fno-sanitize-recover=all -std=gnu11)
includes=(-I "$dir/include" -I "$top/include" -I "$top/base" -I "$top/graph" -I "$top/codelets"
	-I "$top/tests" -I "$top/tools" -I "$starpu_include")

# ---- checkpoint: the binary, valid checkpoints as seeds, the format's tokens ------------
prepare_checkpoint() {
	local bin=$dir/fuzz_checkpoint work=$dir/checkpoint
	echo "fuzz: building $bin" >&2
	"$cc" "${sanitize[@]}" -Wall -Wextra -Werror "${includes[@]}" \
		"$top/tests/fuzz/fuzz_checkpoint.c" "$top/graph/checkpoint.c" "$top/base/files.c" \
		"$top/base/errors.c" \
		"$top/codelets/dtype.c" -lpthread -o "$bin.new"
	mv "$bin.new" "$bin"

	# Seeds: valid checkpoints written by _dos_checkpoint_save itself, fresh every run,
	rm -rf "$work/seeds"
	mkdir -p "$work/seeds"
	DOS_FUZZ_WRITE_SEEDS=$work/seeds "$bin" || die "writing the checkpoint seed corpus failed"
	# and two damaged ones: one byte short, and trailing bytes (libFuzzer only slowly grows
	# its inputs beyond the largest seed).
	head -c 675 "$work/seeds/checkpoint-101.dos" >"$work/seeds/truncated.dos"
	{
		cat "$work/seeds/checkpoint-202.dos"
		printf 'trailing'
	} >"$work/seeds/trailing-garbage.dos"
	# Tokens of the format (libFuzzer's dictionary syntax).
	cat >"$work/fuzz.dict" <<'EOF'
magic="DOSCKPT\x00"
version="\x03\x00\x00\x00"
version_2="\x02\x00\x00\x00"
marker="\x04\x03\x02\x01"
marker_swapped="\x01\x02\x03\x04"
header_len="\xbc\x00\x00\x00"
tag_master="master\x00\x00"
tag_m="adam_m\x00\x00"
tag_v="adam_v\x00\x00"
section_len="\x94\x00\x00\x00\x00\x00\x00\x00"
EOF
}

# ---- options: the binary, command lines as seeds, the options' names ---------------------
prepare_options() {
	local bin=$dir/fuzz_options work=$dir/options
	echo "fuzz: building $bin" >&2
	# configure's warnings (WARN_CFLAGS): graph/model.c is built with them
	"$cc" "${sanitize[@]}" -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
		-Wno-unused-parameter -Werror "${includes[@]}" \
		"$top/tests/fuzz/fuzz_options.c" "$top/tools/train_options.c" "$top/graph/model.c" \
		"$top/base/parse.c" "$top/base/errors.c" "$top/codelets/dtype.c" "$top/codelets/step.c" -lm -o "$bin.new"
	mv "$bin.new" "$bin"

	# Seeds: the command lines of tests/test_train.sh (runs and refusals) and a few more
	# forms (every option, --name=value, abbreviations, --help), one word a line.
	rm -rf "$work/seeds"
	mkdir -p "$work/seeds"
	local n=0 line
	while IFS= read -r line; do
		n=$((n + 1))
		printf '%s' "$line" | tr ' ' '\n' >"$work/seeds/cmdline-$n"
	done <<'EOF'
--preset tiny --steps 12 --quiet --precision fp32 --dump out.bin --policy dos
--preset tiny --steps 12 --quiet --precision bf16 --dump out.bin --policy dmda --subgroup-size 33440
--preset tiny --steps 12 --quiet --precision fp16 --clip 0.5 --dump out.bin --policy dos --checkpoint-activations
--preset tiny --steps 12 --quiet --precision fp16 --clip 0.5 --dump out.bin --policy stride --subgroup-size 777
--steps 60 --quiet
--quiet
--preset tiny --steps 5 --clip 1.0 --quiet
--preset tiny --steps 4 --precision fp16 --loss-scale 1e30 --quiet --dump skipped.bin
--preset tiny --steps 12 --quiet --precision fp16 --clip 0.5 --checkpoint-dir ck --resume --dump resumed.bin
--preset tiny --steps 300 --quiet --checkpoint-dir kill-1 --checkpoint-every 1
--preset tiny --layers 3 --resume --checkpoint-dir other
--preset tiny --steps 4 --lr 1e38 --weight-decay 0
--preset tiny --steps 3 --quiet --plot last.svg
--preset tiny --steps 3 --quiet --trace trace
--quiet --preset huge
--quiet --steps 0
--quiet --steps -3
--quiet --micro-batch x
--quiet --preset tiny --policy nosuch
--quiet --preset tiny --subgroup-size 100000000
--quiet --precision fp8
--quiet --preset tiny --heads 3
--quiet --preset tiny --data /nonexistent/corpus
--quiet --preset tiny --beta2 1 --eps 0
--quiet --preset tiny --loss-scale 0.5
--quiet --preset tiny extra
--quiet --preset tiny --resume
--preset 7b --vocab 32000 --hidden 4096 --heads 32 --ffn 11008 --layers 32 --seq-len 4096 --micro-batch 2 --accumulate 8 --seed 7 --data corpus.txt --lr 1e-4 --beta1 0.9 --beta2 0.999 --eps 1e-6 --weight-decay 0.01 --simulate h200
--preset=1b --steps=0x10 --seed=0 --loss-scale=0 --precision=bf16 --policy=eager --checkpoint-every=5 --checkpoint-dir=ck
--pres 20b --sub 1 --lo 65536 --prec fp16 --acc 1048576 --mi 1048576 --hid 64 --voc 1 --ff 1 --lay 1
--pre 20b --hid 4294967295 --voc 1 --ff 1 --lay 1
--preset tiny --hidden 2147483648 --vocab 4294967295 --ffn 4294967295 --seq-len 1 --layers 1 --heads 1
--steps 0 --help
--help
EOF

	# Tokens: the option names (from train_options.c's table), presets, precisions, and
	# numbers at the edges of the ranges.
	{
		sed -n 's/.*OPTION(O_[A-Z0-9_]*, "\([a-z0-9-]*\)".*/"--\1"/p' "$top/tools/train_options.c"
		for token in tiny small 1b 7b 13b 20b fp32 bf16 fp16 dos dmda = 0 1 -1 0x 1e 1e308 1e-400 nan inf \
			65535 65536 1048576 1048577 2147483648 4294967295 4294967296 9223372036854775807 \
			9223372036854775808 18446744073709551615 18446744073709551616; do
			printf '"%s"\n' "$token"
		done
		printf '"\\x0a"\n"\\x00"\n'
	} >"$work/fuzz.dict"
	[[ $(grep -c '^"--' "$work/fuzz.dict") -ge 30 ]] || die "found no option names in tools/train_options.c"
}

# ---- one run: TARGET LABEL SECONDS MAX_LEN; prints the summary line, 1 on a crash -------
run_target() {
	local target=$1 label=$2 seconds=$3 max_len=$4
	local bin=$dir/fuzz_$target work=$dir/$target
	mkdir -p "$work/corpus" "$work/artifacts" "$work/tmp"
	# Artifacts of this run only are counted (older ones stay for whoever is looking at them).
	local stamp=$work/artifacts/.run-start log=$work/fuzz.log
	touch "$stamp"
	echo "fuzz: running $target for $seconds s (libFuzzer's output in $log)" >&2
	local rc=0
	# The fuzzer's temporary folder in $work/tmp: an aborted run leaves it there, not in /tmp.
	# shellcheck disable=SC2086 # FUZZ_ARGS is words on purpose
	TMPDIR=$work/tmp "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len="$max_len" \
		-use_value_profile=1 -print_final_stats=1 -dict="$work/fuzz.dict" -artifact_prefix="$work/artifacts/" \
		${FUZZ_ARGS:-} "$work/corpus" "$work/seeds" >"$log" 2>&1 || rc=$?

	local runs secs cov found
	runs=$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' "$log" | tail -n 1)
	[[ -n $runs ]] || runs=$(sed -n 's/^#\([0-9]*\).*/\1/p' "$log" | tail -n 1)
	secs=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -n 1)
	[[ -n $secs ]] || secs=$(($(date +%s) - $(stat -c %Y "$stamp")))
	cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | cut -d' ' -f2 || true)
	mapfile -t found < <(find "$work/artifacts" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'leak-*' \
		-o -name 'timeout-*' -o -name 'oom-*' \) -newer "$stamp" | sort)
	echo "fuzz: $label: ${runs:-?} runs in $secs s, coverage ${cov:-?}, crashes ${#found[@]}"

	if [[ ${#found[@]} -gt 0 || $rc -ne 0 ]]; then
		echo "fuzz: $target: libFuzzer exited with $rc; the end of $log:" >&2
		tail -n 60 "$log" >&2
		local f
		for f in "${found[@]}"; do
			echo "fuzz: found $f ($(stat -c %s "$f") bytes):" >&2
			od -A x -t x1z -v "$f" | head -n 64 >&2
			echo "fuzz: reproduce with: DOS_QUIET=0 $bin $f" >&2
		done
		return 1
	fi
}

# Build everything first: a compile error stops the script before any fuzzing time is spent.
for target in "${targets[@]}"; do
	case $target in
	checkpoint) prepare_checkpoint ;;
	options) prepare_options ;;
	esac
done
# Split SECONDS: the first target gets the odd second; each at least 1.
status=0
left=$duration
for i in "${!targets[@]}"; do
	remaining=$((${#targets[@]} - i))
	share=$(((left + remaining - 1) / remaining))
	((share >= 1)) || share=1
	left=$((left - share))
	case ${targets[$i]} in
	checkpoint) run_target checkpoint "checkpoint reader" "$share" 4096 || status=1 ;;
	options) run_target options "option parser" "$share" 2048 || status=1 ;;
	esac
done
exit $status
