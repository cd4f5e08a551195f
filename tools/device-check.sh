#!/usr/bin/env bash
# The one-call GPU check, for the lent machine (see README "GPU checks"): runs the CUDA
# parity tests, every other test on that machine's CPU, StarPU's bus calibration, the
# Adam benchmark (CPU and GPU), the codelet calibration, the host measurements (CPU rate, DMA contention)
# and the policy comparison, writes every log and model under one output folder, and
# prints a short table last. Runs without a GPU too (the
# CUDA steps then report SKIP), which is how it is tested here. Later issues add steps.
#
# The run tool brings back at most 8 files of $OUT, none deeper than two folders, and
# kills a command after its timeout (600 s at most). So the logs, plots and StarPU's
# calibration (starpu-home/.starpu/sampling/...) are written to a work folder elsewhere
# and packed, after every step, into OUT_DIR/device-check.tar.gz (next to a copy of
# summary.txt): whatever stops the run, the steps finished so far come back. Unpack with
# `mkdir r && tar -xzf device-check.tar.gz -C r`. Steps start only while the time budget
# (DEVICE_CHECK_BUDGET seconds, default 540: under the tool's 600) lasts; the others are
# reported NOTRUN, and count as a failure.
#
# The steps come in three groups, run in the order given (default: all three, in this
# order, most precious first, so that a spent budget costs the least):
#   gpu    what only a GPU can show: StarPU sees it, the CUDA kernels' parity with the
#          CPU, StarPU tests that place tasks there, CPU-versus-GPU placement invariance;
#   bench  product rates, bus and codelet calibration, the Adam benchmark, whole training
#          iterations of a ~1 B model per policy (issue 5), host measurements, the policy
#          comparison (issue 4);
#   tests  the other tests (CPU-only: they pass on our machines too) and test_train.sh
#          with forward and backward on the GPU.
# A session whose first call left steps NOTRUN runs the rest in a second call, e.g.
# `tools/device-check.sh device-bundle "$OUT" tests`.
#
# Usage: tools/device-check.sh [BUNDLE_DIR] [OUT_DIR] [GROUP...]   (defaults: device-bundle, $OUT)
set -uo pipefail
started=$(date +%s)
bundle=$(cd "${1:-device-bundle}" && pwd) || {
	echo "no bundle: run 'make device-bundle' first" >&2
	exit 2
}
results=${2:-${OUT:-device-results}}
shift $(($# < 2 ? $# : 2))
groups=("$@")
((${#groups[@]})) || groups=(gpu bench tests)
for g in "${groups[@]}"; do
	case $g in gpu | bench | tests) ;; *)
		echo "device-check: unknown group '$g' (gpu, bench, tests)" >&2
		exit 2
		;;
	esac
done
mkdir -p "$results"
results=$(cd "$results" && pwd)
out=${DEVICE_CHECK_WORK:-$(mktemp -d "${TMPDIR:-/tmp}/device-check.XXXXXX")}
mkdir -p "$out"
out=$(cd "$out" && pwd)
step_limit=${DEVICE_CHECK_STEP_LIMIT:-240}
deadline=$((started + ${DEVICE_CHECK_BUDGET:-540}))

# CUDA toolkit libraries are not bundled: take them from the CUDA install or from the
# nvidia-* Python packages PyTorch brings, whichever has them.
cuda_dirs=$(
	for d in "${CUDA_HOME:-/usr/local/cuda}"/lib64 /usr/local/cuda*/lib64 /usr/local/cuda*/targets/*/lib; do
		[ -d "$d" ] && echo "$d"
	done
	python3 -c 'import glob, os, site
for s in site.getsitepackages() + [site.getusersitepackages()]:
    for d in glob.glob(os.path.join(s, "nvidia", "*", "lib")) + glob.glob(os.path.join(s, "nvidia", "cu*", "lib")):
        print(d)' 2>/dev/null
)
export LD_LIBRARY_PATH=$bundle/lib:$(echo "$cuda_dirs" | paste -sd:)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export STARPU_HOME=$out/starpu-home STARPU_SILENT=1 DOS_QUIET=1
export DOS_GOLDEN_DIR=$bundle/share/golden DOS_SOURCE_DIR=$bundle/share
mkdir -p "$STARPU_HOME"

summary=$out/summary.txt
: >"$summary"
# On a machine where nvidia-smi lists a GPU, a GPU test that skips ("no CUDA device") means
# the GPU was never exercised (a driver, runtime or library mismatch), not that the check
# passed: those skips are failures there, as is a StarPU that finds no CUDA worker.
gpu_present=0
{ nvidia-smi -L 2>/dev/null | grep -q '^GPU ' || [ -e /dev/nvidia0 ]; } && gpu_present=1
gpu_tests=" test_cuda_parity test_model_cuda test_flat_cuda test_cuda_worker "
# pack: the work folder (less the multi-megabyte state dumps, only compared here) into
# $results/device-check.tar.gz, replaced atomically; the plots go first if it would not
# come back (16 MiB per file).
pack() {
	local tarball=$results/device-check.tar.gz
	tar -czf "$tarball.part" -C "$out" --exclude='*.bin' . 2>/dev/null
	if (($(stat -c %s "$tarball.part" 2>/dev/null || echo 0) > 15 * 1024 * 1024)); then
		echo "device-check.tar.gz over 15 MiB: packed without the *.svg plots" >>"$out/pack.txt"
		tar -czf "$tarball.part" -C "$out" --exclude='*.bin' --exclude='*.svg' . 2>/dev/null
	fi
	mv -f "$tarball.part" "$tarball"
	cp "$summary" "$results/summary.txt"
}
# step NAME COMMAND...: runs COMMAND with a time limit (the smaller of the step limit and
# what is left of the budget, 15 s kept for packing), log in $out/NAME.log.
step() {
	local name=$1 start rc status limit
	shift
	start=$(date +%s%N)
	limit=$((deadline - $(date +%s) - 15))
	((limit > step_limit)) && limit=$step_limit
	if ((limit < 10)); then
		printf '%-28s %-10s %8d ms\n' "$name" NOTRUN 0 >>"$summary"
		echo "  [$name] not run: the ${DEVICE_CHECK_BUDGET:-540} s budget is spent"
		cp "$summary" "$results/summary.txt"
		return
	fi
	timeout -k 10 "$limit" "$@" >"$out/$name.log" 2>&1
	rc=$?
	case $rc in
	0) status=PASS ;;
	77)
		status=SKIP
		((gpu_present)) && [[ $gpu_tests == *" $name "* ]] && status="FAIL(skip)"
		;;
	124 | 137) status=TIMEOUT ;;
	*) status="FAIL($rc)" ;;
	esac
	printf '%-28s %-10s %8d ms\n' "$name" "$status" $((($(date +%s%N) - start) / 1000000)) >>"$summary"
	tail -n 3 "$out/$name.log" | sed "s/^/  [$name] /"
	pack
}

{
	date -u +%Y-%m-%dT%H:%M:%SZ
	uname -a
	nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max --format=csv 2>&1
	lscpu | grep -E 'Model name|^CPU\(s\)|NUMA node\(s\)'
} >"$out/machine.txt"
ldd "$bundle/lib/libstarpu-1.4.so" "$bundle/lib/libstarpu-dos.so" >"$out/ldd.txt" 2>&1
if grep -q 'not found' "$out/ldd.txt"; then
	echo "missing shared libraries (searched: $LD_LIBRARY_PATH):" >&2
	grep 'not found' "$out/ldd.txt" | sort -u >&2
fi
step starpu_machine_display "$bundle/bin/starpu_machine_display"
if ((gpu_present)); then
	step starpu_sees_the_gpu grep -E '^[0-9]+ CUDA workers?:' "$out/starpu_machine_display.log"
fi
run_tests() {
	local t name
	for t in "$@"; do
		name=$(basename "$t")
		case $name in *.sh) continue ;; esac
		grep -q "^$name " "$summary" || step "$name" "$t"
	done
}

group_gpu() {
	if ((gpu_present)); then
		step starpu_sees_the_gpu grep -E '^[0-9]+ CUDA workers?:' "$out/starpu_machine_display.log"
	fi
	run_tests "$bundle"/tests/test_{cuda_parity,model_cuda,flat_cuda,cuda_worker,codelets_starpu,train_nonfinite,policy_starpu}
	# the optimizer's placement must not change the result with a GPU either: every update
	# on the CPU against every update on the GPU (resident ratio 1), forward/backward on the
	# GPU
	step invariance_cpu_gpu sh -c "'$bundle/bin/dos-train' --preset tiny --steps 12 --quiet --policy all-cpu \
		--dump '$out/all-cpu.bin' && DOS_RESIDENT_RATIO=1 '$bundle/bin/dos-train' --preset tiny --steps 12 --quiet \
		--policy resident --dump '$out/all-gpu.bin' && cmp '$out/all-cpu.bin' '$out/all-gpu.bin'"
	# the same in bf16: the model computes in 16 bits on the GPU (tensor-core products), the
	# optimizer's state stays fp32 wherever each update runs
	step invariance_cpu_gpu_bf16 sh -c "'$bundle/bin/dos-train' --preset tiny --steps 12 --quiet --precision bf16 \
		--policy all-cpu --dump '$out/all-cpu-bf16.bin' && DOS_RESIDENT_RATIO=1 '$bundle/bin/dos-train' --preset tiny \
		--steps 12 --quiet --precision bf16 --policy resident --dump '$out/all-gpu-bf16.bin' && \
		cmp '$out/all-cpu-bf16.bin' '$out/all-gpu-bf16.bin'"
	# equal dumps prove nothing if no update ran on the GPU (no CUDA worker: both on the CPU)
	if ((gpu_present)); then
		step invariance_used_the_gpu sh -c "for p in '' _bf16; do grep -E 'ran [0-9]+ on CPU workers, [1-9][0-9]* on GPU' \
			\"$out/invariance_cpu_gpu\$p.log\" || exit 1; done"
	fi
}

group_bench() {
	# the product rates forward and backward are measured against (dos-train's summary
	# prints the rate its products reached)
	step gemm "$bundle/bin/dos-bench" gemm
	step calibrate_bus "$bundle/bin/starpu_calibrate_bus"
	step bench_adam "$bundle/bin/dos-bench" adam
	step calibrate_codelets env STARPU_CALIBRATE=1 "$bundle/bin/dos-bench" calibrate
	# whole training iterations of a ~1 B model (issue 5's target): iteration time per
	# policy, the last iteration of each drawn; DEVICE_CHECK_TRAIN_PRESET for another size,
	# DEVICE_CHECK_TRAIN_PRECISION for another precision (bf16: the mixed-precision model)
	for policy in dos dmda all-cpu stride; do
		step "train_$policy" env STARPU_MINIMUM_CLEAN_BUFFERS=0 STARPU_TARGET_CLEAN_BUFFERS=0 \
			"$bundle/bin/dos-train" --preset "${DEVICE_CHECK_TRAIN_PRESET:-1b}" --steps 6 --policy "$policy" \
			--precision "${DEVICE_CHECK_TRAIN_PRECISION:-bf16}" --plot "$out/train_$policy.svg"
	done
	step host_measurements "$bundle/bin/dos-bench" host
	# the policies on the real GPU, with the models and host measurements just taken
	# (2e9 params: 32 GB of host state; DEVICE_CHECK_POLICY_PARAMS for smaller hosts)
	step policies env DOS_SCHED_VERBOSE=1 "$bundle/bin/dos-bench" optimizer --params "${DEVICE_CHECK_POLICY_PARAMS:-2e9}" \
		--subgroup 1e8 --steps 3 --policies dos,all-cpu,stride,resident,dmda,lws
}

group_tests() {
	run_tests "$bundle"/tests/test_*
	# dos-train's end-to-end test expects ./dos-train (forward and backward on the GPU)
	(cd "$bundle/bin" && DOS_QUICK_CHECK=1 step test_train.sh sh ../tests/test_train.sh)
}

for g in "${groups[@]}"; do
	"group_$g"
done

echo
echo "== device check: $(head -n 1 "$out/machine.txt"), work folder $out"
sed -n '/^# Summary/,$p' "$out/bench_adam.log" 2>/dev/null
grep -E '^(policy|dos|all-cpu|stride|resident|dmda|lws) |^# bound' "$out/policies.log" 2>/dev/null
grep -H '^gemm ' "$out/gemm.log" 2>/dev/null
grep -H '^summary: ' "$out"/train_*.log 2>/dev/null
cat "$summary"
pack
echo "(all logs: $results/device-check.tar.gz)"
! grep -qE 'FAIL|TIMEOUT|NOTRUN' "$summary"
