#!/usr/bin/env bash
# The CUDA lane: runs our CUDA test programs on GPGPU-Sim, a functional simulator of an
# NVIDIA GPU (tools/gpusim.sh builds it), so that the PTX nvcc emits for our kernels
# executes on every CI run, GPU or not. The programs are the build's own, unchanged: the
# simulator stands in for CUDA's runtime library, and settings shrink the work:
#   DOS_QUICK_CHECK=1        the tests' short variants (no sizes past a thousand)
#   DOS_CUDA_MAX_BLOCKS=8    grids of 8 blocks, so small sizes run every grid-stride loop
#                            several times (codelets/cuda_grid.h)
#   DOS_TEST_NO_CUBLAS=1     test_model_cuda leaves out what needs cuBLAS (the simulator
#                            runs PTX; cuBLAS ships machine code only)
#   DOS_TEST_GPU_UPDATES=1   test_cuda_worker fails unless the dos policy put an update on
#                            the simulated GPU
#   STARPU_NCUDA=1           StarPU drives the simulated GPU with its CUDA worker
# A TEST given as TEST@N runs with N simulated GPUs (DOS_GPUSIM_DEVICES=N, STARPU_NCUDA=N,
# one StarPU thread driving them all: tools/gpusim/cuda13_runtime.c says why), so that the
# same bits are checked with the work spread over several GPUs.
# StarPU measures the bus to the simulated GPUs once per count (minutes: every copy is
# simulated) and the lane keeps the result with the simulator for later runs
# (STARPU_HOSTNAME=gpgpu-sim, gpgpu-sim-xN).
# A test that exits 77 (skipped) counts as failed: here it means the simulator was not
# seen as a GPU.
#
# Usage: tests/gpusim_lane.sh BUILD_DIR LOG TEST[@N]...
#   BUILD_DIR  a build configured with CUDA, the TESTs built (make check-gpusim does it)
#   TEST       a program of the build (a path relative to BUILD_DIR), or a script by its
#              absolute path, run in a fresh folder with DOS_BUILD_DIR=BUILD_DIR
#   LOG        gets "# PASS: n" / "# FAIL: n" for make check's summary
# Environment: DOS_GPUSIM_TIMEOUT (seconds per test, default 1800); GPGPUSIM_SOURCE and
# the others of tools/gpusim.sh.
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[[ $# -ge 3 ]] || {
	echo "usage: $0 BUILD_DIR LOG TEST..." >&2
	exit 2
}
build=$(cd "$1" && pwd)
log=$2
shift 2
: >"$log"

if ! grep -q '^#define DOS_USE_CUDA 1' "$build/config.h"; then
	echo "check-gpusim: skipped: $build is built without CUDA (configure found no nvcc or no CUDA-enabled StarPU)"
	exit 0
fi
rc=0
reason=$("$top/tools/gpusim.sh" --source 2>&1 >/dev/null) || rc=$?
if [[ $rc == 3 ]]; then
	echo "check-gpusim: skipped: ${reason#gpusim: }"
	exit 0
elif [[ $rc != 0 ]]; then
	echo "check-gpusim: $reason" >&2
	exit 1
fi
kernels=$build/.libs/libstarpu-dos.so
prefix=$("$top/tools/gpusim.sh")
eval "$("$top/tools/gpusim.sh" --env "$kernels")"

# The simulated GPU (an RTX 3070's configuration, functional mode) takes the compute
# capability of the PTX our build ships (sm_90 by default: NVCC_ARCH_FLAGS), since it only
# runs PTX written for its own capability or below; ptxas's register counts are asked for
# that capability too.
sm=$("$CUDA_INSTALL_PATH/bin/cuobjdump" -lptx "$kernels" | sed -n 's/.*\.sm_\([0-9]*\)\.ptx.*/\1/p' | sort -n | tail -n 1)
[[ -n $sm ]] || {
	echo "check-gpusim: FAIL: no PTX in $kernels (cuobjdump -lptx): the simulator has nothing to run" >&2
	exit 1
}
configure_gpu() {
	sed -e "s/^-gpgpu_ptx_force_max_capability .*/-gpgpu_ptx_force_max_capability $sm/" \
		-e "s/^-gpgpu_occupancy_sm_number .*/-gpgpu_occupancy_sm_number $sm/" \
		-e "s/^-gpgpu_compute_capability_major .*/-gpgpu_compute_capability_major $((sm / 10))/" \
		-e "s/^-gpgpu_compute_capability_minor .*/-gpgpu_compute_capability_minor $((sm % 10))/" \
		"$DOS_GPUSIM_CONFIG/gpgpusim.config" >"$1/gpgpusim.config"
	cp "$DOS_GPUSIM_CONFIG"/*.icnt "$1/"
}

lane=$build/gpusim
rm -rf "$lane"
bus_cache=$(dirname "$prefix")/starpu-bus # beside the simulator's build: its runtime may be relinked
mkdir -p "$lane" "$bus_cache"
pass=0 fail=0
t_lane=$SECONDS
# the machine name StarPU files the bus measurements under, one per count of GPUs
bus_host() { if [[ $1 == 1 ]]; then echo gpgpu-sim; else echo "gpgpu-sim-x$1"; fi; }
# run_test TEST RUN_DIR GPUS: the test in a fresh folder (the simulator writes its scratch
# files there) with a fresh StarPU home holding only the bus files: codelet timings
# measured on the simulator would tell the dos policy that the GPU is a thousand times
# slower than it is.
run_test() {
	local t=$1 run=$2 gpus=$3
	rm -rf "$run"
	mkdir -p "$run/home/.starpu/sampling/bus"
	configure_gpu "$run"
	cp "$bus_cache/$(bus_host "$gpus")".* "$run/home/.starpu/sampling/bus/" 2>/dev/null || true
	(
		cd "$run" &&
			STARPU_HOME=$run/home STARPU_HOSTNAME=$(bus_host "$gpus") STARPU_NCUDA=$gpus \
				DOS_GPUSIM_DEVICES=$gpus STARPU_CUDA_THREAD_PER_DEV=0 STARPU_SILENT=1 \
				DOS_QUICK_CHECK=1 DOS_CUDA_MAX_BLOCKS=8 DOS_TEST_NO_CUBLAS=1 DOS_TEST_GPU_UPDATES=1 \
				DOS_GOLDEN_DIR=$top/tests/golden DOS_SOURCE_DIR=$top DOS_QUIET=1 \
				DOS_BUILD_DIR=$build timeout "${DOS_GPUSIM_TIMEOUT:-1800}" "$t" >"$run/stdout.log" 2>"$run/stderr.log"
	)
}

for entry in "$@"; do
	t=${entry%@*} gpus=1 name=$(basename "${entry%@*}")
	[[ $t == /* ]] || t=$build/$t
	if [[ $entry == *@* ]]; then
		gpus=${entry##*@}
		name+="@$gpus"
	fi
	run=$lane/$name
	t0=$SECONDS
	rc=0
	run_test "$t" "$run" "$gpus" || rc=$?
	# The simulator can abort on an assertion of its own that reads uninitialised memory
	# (a kernel's info in ptx_ir.h): such an abort is run once more. A test's own failures
	# exit 1, not 134, and an abort that our code causes comes back the second time.
	if [[ $rc == 134 ]] && grep -q 'Assertion .* failed' "$run/stderr.log"; then
		echo "RERUN: $name: the simulator aborted: $(grep -m 1 'Assertion' "$run/stderr.log")"
		mv "$run" "$run.aborted"
		rc=0
		run_test "$t" "$run" "$gpus" || rc=$?
	fi
	# the simulator talks on stdout (thousands of lines); the test's verdict is its last
	# line there, its failures are on stderr
	verdict=$(grep -v '^GPGPU-Sim' "$run/stdout.log" | tail -n 1)
	if [[ $rc == 0 ]]; then
		pass=$((pass + 1))
		echo "PASS: $name ($((SECONDS - t0)) s): $verdict"
	else
		fail=$((fail + 1))
		case $rc in
		77) why="skipped (exit 77): the simulated GPU was not seen" ;;
		124) why="timed out after ${DOS_GPUSIM_TIMEOUT:-1800} s" ;;
		*) why="exit $rc" ;;
		esac
		echo "FAIL: $name ($((SECONDS - t0)) s): $why; the end of its stderr (all in $run):"
		tail -n 15 "$run/stderr.log" | sed 's/^/    /'
		echo "    (last line of its stdout: $verdict)"
	fi
	# StarPU measured the bus to the simulated GPU (again, when the cached files were for
	# another machine): keep the files for the next runs
	for f in "$run/home/.starpu/sampling/bus/$(bus_host "$gpus")".*; do
		if [[ -f $f ]] && ! cmp -s "$f" "$bus_cache/${f##*/}"; then
			cp "$f" "$bus_cache/.${f##*/}.$$" && mv -f "$bus_cache/.${f##*/}.$$" "$bus_cache/${f##*/}"
		fi
	done
done
{
	echo "# PASS: $pass"
	echo "# FAIL: $fail"
} >"$log"
echo "check-gpusim: $pass passed, $fail failed ($((SECONDS - t_lane)) s on GPGPU-Sim)"
[[ $fail == 0 ]]
