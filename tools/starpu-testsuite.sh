#!/usr/bin/env bash
# StarPU's own test suite and examples (tests/ and examples/ of its source) run under
# STARPU_SCHED_LIB=<our library> with STARPU_SCHED=dos, then with STARPU_SCHED=dmda, and
# compared: the programs that pass under dmda and not under dos are listed, and the
# script fails when there is one. StarPU is configured as tools/deps.sh builds its native
# variant, plus its tests and examples (in quick-check mode) and the system BLAS, in
# WORK_DIR; building takes about 40 minutes on 2 cores, each run about 15.
#
# Usage: tools/starpu-testsuite.sh WORK_DIR [BUILD_DIR]   (BUILD_DIR: default build)
# Environment: POLICIES (default "dos dmda"; the first is compared with the last),
# JOBS (default 2), STARPU_TIMEOUT_ENV (seconds per program, default 300).
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
work=${1:?usage: tools/starpu-testsuite.sh WORK_DIR [BUILD_DIR]}
build=$(cd "${2:-$top/build}" && pwd)
lib=$build/.libs/libstarpu-dos.so
[[ -f $lib ]] || {
	echo "no $lib: build the library first (make -C $build)" >&2
	exit 2
}
read -r -a policies <<<"${POLICIES:-dos dmda}"
jobs=${JOBS:-2}
src=$("$top"/tools/deps.sh --print-source)
prefix=$("$top"/tools/deps.sh --print-prefix native)
mkdir -p "$work"
work=$(cd "$work" && pwd)

# The native variant's configure flags, with tests, examples and a BLAS.
flags=$(sed -n 's/^configure flags: //p' "$prefix/share/starpu-dos-build.txt")
flags=$(echo "$flags" | sed -e 's/--disable-build-examples/--enable-build-examples/' \
	-e 's/--disable-build-tests/--enable-build-tests/' -e 's/--enable-blas-lib=none//')
if [[ ! -f $work/.built ]]; then
	echo "starpu-testsuite: building StarPU's tests and examples in $work (log: $work/build.log)" >&2
	# shellcheck disable=SC2086 # word lists on purpose
	(cd "$work" && "$src/configure" $flags && make -j"$jobs" &&
		for dir in tests examples; do
			make -C $dir -j"$jobs" check TESTS= CFLAGS="-g -O2 -DSTARPU_QUICK_CHECK=1" || exit 1
		done) >"$work/build.log" 2>&1 || {
		tail -n 30 "$work/build.log" >&2
		exit 1
	}
	touch "$work/.built"
fi

# One policy's results: "directory/program PASS|FAIL|SKIP|ERROR" lines, from automake's
# .trs files.
export STARPU_SCHED_LIB=$lib STARPU_SILENT=1 STARPU_TIMEOUT_ENV=${STARPU_TIMEOUT_ENV:-300}
for policy in "${policies[@]}"; do
	echo "starpu-testsuite: running under $policy" >&2
	for dir in tests examples; do
		STARPU_SCHED=$policy make -C "$work/$dir" -k -j"$jobs" check >"$work/check-$policy-$dir.log" 2>&1 || true
	done
	(cd "$work" && find tests examples -name '*.trs' | sort | while read -r trs; do
		echo "${trs%.trs} $(sed -n 's/^:test-result: //p' "$trs" | head -n 1)"
	done) >"$work/results-$policy.txt"
	awk '{n[$2]++} END {for (r in n) printf "%s %d  ", r, n[r]; print ""}' "$work/results-$policy.txt" |
		sed "s/^/$policy: /"
done
first=${policies[0]} last=${policies[${#policies[@]} - 1]}
join "$work/results-$first.txt" "$work/results-$last.txt" >"$work/compared.txt"
skipped=$(awk '$3 == "PASS" && $2 == "SKIP" {printf " %s", $1}' "$work/compared.txt")
[[ -z $skipped ]] || echo "passing under $last, skipped under $first:$skipped"
regressions=$(awk '$3 == "PASS" && $2 != "PASS" && $2 != "SKIP" {print $1, $2}' "$work/compared.txt")
if [[ -n $regressions ]]; then
	echo "passing under $last, failing under $first:"
	echo "$regressions"
	exit 1
fi
echo "every program that passes under $last passes under $first (logs: $work/*/*.log)"
