#!/bin/sh
# dos-bench's command line and its product-rate benchmark (bench/gemm.c): a small CPU
# product gives a positive rate in the printed format, the GPU line says why there is
# none without one, and bad arguments are refused with exit status 2 and a message
# naming the option and the value.
set -u
bench=./dos-bench
# shellcheck source=tests/test_lib.sh
. "$(dirname "$0")/test_lib.sh"

$bench gemm --cpu-size 128 --gpu-size 256 --reps 3 >"$work/gemm.log" 2>&1 || fail "dos-bench gemm failed: $(cat "$work/gemm.log")"
rate=$(sed -n 's/^gemm cpu fp32 n=128: \([0-9.]*\) GFLOP\/s.*/\1/p' "$work/gemm.log")
awk -v r="$rate" 'BEGIN {exit !(r != "" && r > 0)}' || fail "no positive CPU rate: $(cat "$work/gemm.log")"
grep -qE '^gemm gpu( bf16 n=256: [0-9.]+ TFLOP/s|: no CUDA device|: not built with CUDA)' "$work/gemm.log" ||
	fail "no GPU line: $(cat "$work/gemm.log")"
echo "dos-bench gemm: CPU sgemm 128^3 at $rate GFLOP/s"

expect_refusal() { # expected message, arguments...
	want=$1
	shift
	$bench "$@" >"$work/out" 2>&1
	rc=$?
	[ "$rc" = 2 ] || fail "dos-bench $*: exit status $rc, expected 2: $(cat "$work/out")"
	grep -qF -- "$want" "$work/out" || fail "dos-bench $*: no '$want' in: $(cat "$work/out")"
}
expect_refusal "--reps 2: expected a whole number in [3, 50]" gemm --reps 2
expect_refusal "--cpu-size abc" gemm --cpu-size abc
expect_refusal "--gpu-size -5" gemm --gpu-size -5
expect_refusal "--cpu-size (missing)" gemm --cpu-size
expect_refusal "unknown option '--fast'" gemm --fast
# a misspelt policy, before any row runs (it left an empty row and exit status 0)
expect_refusal "--policies: 'dmad' is not a scheduling policy" optimizer --params 1e4 --subgroup 1e3 --policies dos,dmad
expect_refusal "unknown subcommand 'nosuch'" nosuch
echo "dos-bench: 6 bad command lines refused"
