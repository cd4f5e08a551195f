#!/usr/bin/env bash
# Valgrind memcheck of the CPU path: the model kernels and codelets under StarPU, the
# checkpoint reader and writer, and short dos-train runs (forward, backward, the
# optimizer step, checkpoint and resume; and the model in bf16), with StarPU's own suppression files (they cover
# a small hwloc allocation StarPU keeps for the whole process). Any error fails.
#
# Usage: tools/valgrind-check.sh BUILD_DIR
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$(cd "${1:?usage: valgrind-check.sh BUILD_DIR}" && pwd)
command -v valgrind >/dev/null || {
	echo "valgrind-check: valgrind is not installed (Debian: valgrind)" >&2
	exit 1
}
suppressions=()
for f in "$("$top"/tools/deps.sh --print-source)"/tools/dev/valgrind/*.suppr; do
	[[ -f $f ]] && suppressions+=("--suppressions=$f")
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export LD_LIBRARY_PATH=$build/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export STARPU_HOME=$work/home STARPU_SILENT=1 DOS_QUIET=1 DOS_SOURCE_DIR=$top STARPU_NCPU=2
mkdir -p "$STARPU_HOME" "$work/ck"

run() { # NAME PROGRAM ARGS...
	local name=$1 start=$SECONDS
	shift
	if valgrind -q --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite,indirect \
		"${suppressions[@]}" "$@" >"$work/$name.log" 2>&1; then
		echo "valgrind-check: $name: no errors ($((SECONDS - start)) s)"
	else
		cat "$work/$name.log" >&2
		echo "valgrind-check: $name: ERRORS (log above)" >&2
		exit 1
	fi
}
run test_checkpoint "$build/tests/.libs/test_checkpoint"
run test_model_kernels "$build/tests/.libs/test_model_kernels"
run test_model_kernels16 "$build/tests/.libs/test_model_kernels16"
run dos-train "$build/.libs/dos-train" --preset tiny --steps 4 --quiet --checkpoint-dir "$work/ck"
run dos-train-resume "$build/.libs/dos-train" --preset tiny --steps 6 --quiet --checkpoint-dir "$work/ck" --resume
# the 16-bit model path (scratch widening around every product)
run dos-train-bf16 "$build/.libs/dos-train" --preset tiny --steps 3 --quiet --precision bf16
