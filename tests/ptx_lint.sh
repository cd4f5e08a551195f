#!/bin/sh
# The PTX of the update-path kernels (Adam, cast, statistics, scale: codelets/kernels_cuda.cu;
# flat copy: codelets/flat_cuda.cu), compiled with the library's nvcc flags (Makefile.am),
# holds no approximate or contractible floating-point arithmetic, which would make GPU
# results differ from the CPU's:
#   - add, sub, mul, fma, mad on floats only with .rn: with -fmad=false nvcc writes .rn on
#     each of them, which forbids ptxas to fuse a mul and an add into an fma;
#   - div, sqrt, rcp on floats only with .rn (IEEE); none of rsqrt, ex2, lg2, sin, cos,
#     tanh, and no .approx or .ftz anywhere (denormals are kept: -ftz=false).
# This covers what the GPU simulator cannot see (it computes approximate instructions
# exactly). Runs in the build folder under make check; exits 77 in a build without CUDA.
# Usage: tests/ptx_lint.sh [FILE.ptx...]   (default: the two files above, built by make check)
set -u
if [ $# -eq 0 ]; then
	if ! grep -q '^#define DOS_USE_CUDA 1' config.h 2>/dev/null; then
		echo "built without CUDA: skipped"
		exit 77
	fi
	set -- codelets/kernels_cuda.ptx codelets/flat_cuda.ptx
fi
status=0
for f in "$@"; do
	[ -s "$f" ] || {
		echo "FAIL: $f: missing or empty (make check builds it)" >&2
		exit 1
	}
	awk -v file="$f" '
	function bad(why) {
		if (!(NR in reported)) {
			printf "FAIL: %s:%d: %s: %s\n", file, NR, why, line > "/dev/stderr"
			failures++
		}
		reported[NR] = 1
	}
	/^[ \t]*(\.visible[ \t]+|\.weak[ \t]+)?\.entry[ \t]/ { entries++ }
	{
		line = $0
		sub(/\/\/.*/, "", line)
		sub(/^[ \t]+/, "", line)
		sub(/^@!?%[A-Za-z0-9_]+[ \t]+/, "", line)
		if (line !~ /^[a-z]/)
			next # directives, labels, braces, blank lines
		op = line
		sub(/[ \t;].*/, "", op)
		n = split(op, part, ".")
		base = part[1]
		float = 0
		rn = 0
		for (i = 2; i <= n; i++) {
			if (part[i] ~ /^(f16|f16x2|bf16|bf16x2|f32|f64)$/)
				float = 1
			if (part[i] == "rn")
				rn = 1
			if (part[i] == "approx")
				bad("approximate instruction")
			if (part[i] == "ftz")
				bad("flushes denormals to zero")
		}
		if (base ~ /^(rsqrt|ex2|lg2|sin|cos|tanh)$/)
			bad("approximate-only instruction")
		else if (float && base ~ /^(add|sub|mul|fma|mad)$/) {
			checked++
			if (!rn)
				bad("contractible: no .rn")
		} else if (float && base ~ /^(div|sqrt|rcp)$/) {
			checked++
			if (!rn)
				bad("not IEEE-rounded: no .rn")
		}
	}
	END {
		if (!entries) {
			printf "FAIL: %s: no kernel entry point: not the PTX of our kernels?\n", file > "/dev/stderr"
			exit 1
		}
		printf "%s: %d kernels, %d floating-point arithmetic instructions checked, %d rejected\n", file, entries,
			checked, failures
		exit failures != 0
	}' "$f" || status=1
done
exit $status
