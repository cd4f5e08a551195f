#!/bin/sh
# examples/tile_app trained on the GPU simulator's GPUs (tests/gpusim_lane.sh runs this
# with STARPU_NCUDA and the simulator's settings, in a fresh folder): the optimizer's state
# made, kept and updated on the simulated GPUs where the dos policy puts it, and the
# application's own tasks on the CPUs, it must end with the bits of the same training on
# CPU workers only; and the policy must have given updates to every GPU. A training
# loop's worth of the optimizer's graph (state made by tasks, gradients gathered, updates,
# weights cast back) is thus checked across GPU counts, where tests/test_cuda_worker.c
# checks codelets one by one.
set -u
app=${DOS_BUILD_DIR:?DOS_BUILD_DIR: the build folder, set by tests/gpusim_lane.sh}/examples/tile_app
gpus=${STARPU_NCUDA:?STARPU_NCUDA: the simulated GPUs, set by tests/gpusim_lane.sh}
fail() {
	echo "gpusim_tile_app: FAIL: $*" >&2
	exit 1
}

STARPU_NCUDA=0 "$app" --route api --dump cpu.bin >cpu.log 2>&1 || fail "CPU-only run: $(tail -n 5 cpu.log)"
DOS_SCHED_VERBOSE=2 "$app" --route api --dump gpu.bin >gpu.log 2>&1 || fail "run on $gpus GPUs: $(tail -n 5 gpu.log)"
cmp -s cpu.bin gpu.bin || fail "weights, m and v after the run on $gpus GPUs differ from the CPU-only run's"
counts=$(sed -n 's/^tile_app: route api: .*updates placed by plan (\([0-9]*\) on CPU, \([0-9]*\) on GPU).*/\1 \2/p' gpu.log)
[ -n "$counts" ] || fail "no plan counts from tile_app: $(grep '^tile_app' gpu.log)"
on_cpu=${counts% *} on_gpu=${counts#* }
[ "$on_gpu" -gt 0 ] || fail "no update was placed on a GPU ($on_cpu on CPU)"
if [ "$gpus" -gt 1 ]; then
	k=0
	while [ $k -lt "$gpus" ]; do
		grep -q "plan of step .*GPU$k [1-9]" gpu.log || fail "no plan gave GPU $k an update: $(grep 'plan of step' gpu.log | head -n 3)"
		k=$((k + 1))
	done
fi
echo "tile_app, 8 steps: $on_cpu updates on CPU and $on_gpu on $gpus simulated GPU(s) == the CPU-only run, bit for bit"
