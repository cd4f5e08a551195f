#!/bin/sh
# Training on the GPU simulator's GPUs (tests/gpusim_lane.sh runs this with STARPU_NCUDA
# and the simulator's settings, in a fresh folder), against the same training on CPU
# workers only, bit for bit: the optimizer's state made, kept and updated on the simulated
# GPUs where the dos policy puts it, and the policy must have given updates to every GPU.
# A training loop's worth of the optimizer's graph (state made by tasks, gradients
# gathered, updates, weights cast back, loss-scale statistics) is thus checked across GPU
# counts, where tests/test_cuda_worker.c checks codelets one by one. Two programs:
# - examples/tile_app (NNTile's pattern: its own tiles, its own tasks on the CPUs);
# - dos-train with --model-on-cpu: forward and backward on the CPUs (their GPU products
#   need cuBLAS, which the simulator cannot run), in fp32, and in fp16 with loss scaling
#   and two micro-batches.
set -u
build=${DOS_BUILD_DIR:?DOS_BUILD_DIR: the build folder, set by tests/gpusim_lane.sh}
gpus=${STARPU_NCUDA:?STARPU_NCUDA: the simulated GPUs, set by tests/gpusim_lane.sh}
fail() {
	echo "gpusim_training: FAIL: $*" >&2
	exit 1
}

# same_bits_on_gpus NAME COUNTS PROGRAM ARGS...: PROGRAM ARGS --dump FILE on the CPU
# workers alone and on the simulated GPUs must write the same bytes; COUNTS is a sed
# expression that turns the GPU run's output into "ON_CPU ON_GPU", its update counts.
# Each program starts without the codelet timings the one before it measured (the lane's
# StarPU home keeps only the bus's): measured on the simulator, they tell the dos policy
# that the GPU is a thousand times slower than it is, and it put none of dos-train's
# updates on two GPUs after tile_app and another dos-train had run.
same_bits_on_gpus() {
	name=$1 counts=$2
	shift 2
	rm -rf "${STARPU_HOME:?STARPU_HOME: set by tests/gpusim_lane.sh}/.starpu/sampling/codelets"
	STARPU_NCUDA=0 "$@" --dump "$name-cpu.bin" >"$name-cpu.log" 2>&1 ||
		fail "$name, CPU-only run: $(tail -n 5 "$name-cpu.log")"
	DOS_SCHED_VERBOSE=2 "$@" --dump "$name-gpu.bin" >"$name-gpu.log" 2>&1 ||
		fail "$name, run on $gpus GPUs: $(tail -n 5 "$name-gpu.log")"
	cmp -s "$name-cpu.bin" "$name-gpu.bin" || fail "$name: the result on $gpus GPUs differs from the CPU-only run's"
	n=$(sed -n "$counts" "$name-gpu.log")
	[ -n "$n" ] || fail "$name: no update counts in its output: $(grep -v '^GPGPU-Sim' "$name-gpu.log" | tail -n 3)"
	on_cpu=${n% *} on_gpu=${n#* }
	[ "$on_gpu" -gt 0 ] || fail "$name: no update was placed on a GPU ($on_cpu on CPU)"
	if [ "$gpus" -gt 1 ]; then
		k=0
		while [ $k -lt "$gpus" ]; do
			grep -q "plan of step .*GPU$k [1-9]" "$name-gpu.log" ||
				fail "$name: no plan gave GPU $k an update: $(grep 'plan of step' "$name-gpu.log" | head -n 3)"
			k=$((k + 1))
		done
	fi
	echo "$name: $on_cpu updates on CPU and $on_gpu on $gpus simulated GPU(s) == the CPU-only run, bit for bit"
}

same_bits_on_gpus tile_app 's/^tile_app: route api: .*updates placed by plan (\([0-9]*\) on CPU, \([0-9]*\) on GPU).*/\1 \2/p' \
	"$build/examples/tile_app" --route api
dos_train_counts='s/^summary: subgroup updates ran \([0-9]*\) on CPU workers, \([0-9]*\) on GPU workers.*/\1 \2/p'
same_bits_on_gpus dos-train-fp32 "$dos_train_counts" \
	"$build/dos-train" --preset tiny --steps 6 --model-on-cpu --quiet
same_bits_on_gpus dos-train-fp16 "$dos_train_counts" \
	"$build/dos-train" --preset tiny --steps 4 --accumulate 2 --precision fp16 --model-on-cpu --quiet
