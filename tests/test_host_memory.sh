#!/bin/sh
# Host memory exhaustion, for real: dos-train under an address-space limit (ulimit -v)
# that leaves room for StarPU and the model's weights but not for the optimizer state. It
# must end with exit status 1 (not a crash, not a hang) and the -ENOMEM message naming
# the optimizer state and its size in bytes. Without a GPU nothing is pinned, so this is
# the last resort of graph/host_memory.c, not its pageable fallback. Skipped (77) without
# /proc, or under AddressSanitizer, which reserves terabytes of address space and cannot
# run under such a limit.
set -u
train=./dos-train
# shellcheck source=tests/test_lib.sh
. "$(dirname "$0")/test_lib.sh"
# One BLAS thread: OpenBLAS's worker threads allocate their buffers on their own and,
# when that fails under the limit, spin until exit waits for them forever. At most two
# malloc arenas: each reserves 64 MiB of address space, more with more threads.
export OPENBLAS_NUM_THREADS=1 MALLOC_ARENA_MAX=2
[ -r /proc/self/status ] || {
	echo "no /proc to read the address space from: skipped"
	exit 77
}
if ldd .libs/dos-train 2>/dev/null | grep -q libasan; then
	echo "AddressSanitizer build: skipped"
	exit 77
fi

# The address space dos-train needs besides the model: the peak of a tiny run, read while
# it trains (the libtool wrapper execs the program, which keeps the pid).
$train --preset tiny --steps 1000000 --quiet >"$work/tiny.log" 2>&1 &
pid=$!
wait_for_line 'steps of' "$work/tiny.log" 100
sleep 0.5
base_kb=$(awk '/^VmPeak:/ {print $2}' "/proc/$pid/status" 2>/dev/null)
kill "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
[ -n "$base_kb" ] || fail "could not read the address space of a running dos-train: $(cat "$work/tiny.log")"

# A model of 63466496 parameters: 254 MB of fp32 weights, 762 MB of optimizer state.
V=256 d=1024 F=4096 L=5 T=16
params=$((2 * V * d + T * d + L * (2 * d + 4 * d * d + 2 * F * d) + d))
weights=$((4 * params))
state=$((12 * params))
run_limited() { # limit in KiB
	(
		ulimit -v "$1" || exit 3
		exec timeout 60 $train --preset tiny --vocab $V --hidden $d --heads 8 --ffn $F --layers $L \
			--seq-len $T --subgroup-size 8000000 --steps 1 --quiet
	) >"$work/run.log" 2>&1
}

# The tiny run's peak exceeds what the big one has mapped when it allocates (the tiny one
# has trained: BLAS buffers, activations), by about 300 MB here: room for the weights,
# not for the state (3 x 254 MB more).
run_limited $((base_kb + weights / 1024))
status=$?
[ $status -eq 1 ] || fail "out of memory for the state: exit status $status, expected 1: $(cat "$work/run.log")"
want="no host memory for the optimizer state (fp32 master weights, Adam m and v of $params parameters): $state bytes"
grep -qF "$want" "$work/run.log" || fail "expected '$want' in: $(cat "$work/run.log")"
echo "host memory: under ulimit -v $((base_kb + weights / 1024)) KiB, the optimizer state ($state bytes) refused with -ENOMEM and the message, exit status 1"
