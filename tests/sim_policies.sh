#!/usr/bin/env bash
# Properties of the policies on the simulated machines (StarPU's SimGrid build; times are
# simulated, so the run is deterministic): on every machine `dos` is no slower than the
# better of dmda and stride (k = 2), and within 1.05x the bound where whole subgroups allow
# it; with a GPU memory limit no policy's peak exceeds it; after the final flush every
# subgroup's state is valid on the host; in whole simulated training iterations dos is no
# slower than dmda; a model that declares less GPU memory than it uses is planned around
# once its use is measured; on the 4-GPU node dos uses every GPU within its limit, near
# the bound that counts them all, and a training iteration there takes at most 1.5x one
# GPU's; a fresh run's state created by tasks makes the first iteration cheap, lands where
# the plan keeps it, and leaves dos no slower than dmda; subgroups small enough for
# StarPU's suballocator that overflow the GPU complete; a GPU where StarPU deadlocks makes
# dos-train fail with a message, not exit 0. Writes a test-suite-style summary (# PASS / # FAIL
# lines) to the file named by $2.
#
# Usage: tests/sim_policies.sh BUILD_SIMGRID_DIR SUMMARY_FILE
set -uo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bench=${1:?usage: sim_policies.sh BUILD_SIMGRID_DIR SUMMARY_FILE}/dos-bench
summary=${2:?usage: sim_policies.sh BUILD_SIMGRID_DIR SUMMARY_FILE}
home=$(mktemp -d)
trap 'rm -rf "$home"' EXIT
. "$top"/tests/check_lib.sh

steady() { # the simulated steady iteration in dos-train output FILE
	sed -n 's/.*steady iteration \([0-9.]*\) simulated s.*/\1/p' "$1"
}
per_step() { # the simulated seconds per step in dos-train output FILE
	sed -n 's/.*(\([0-9.]*\) s per step).*/\1/p' "$1"
}

# column OUT POLICY NAME: the value in the column named NAME in the table's header of
# POLICY's row in the dos-bench output OUT
column() {
	awk -v p="$2" -v name="$3" '$1 == "policy" {for (i = 1; i <= NF; i++) if ($i == name) c = i} c && $1 == p {print $c}' "$1"
}

# peak_within OUT LIMIT_MIB POLICY_REGEX: every row of those policies in the dos-bench
# output OUT has a peak of GPU memory, within LIMIT_MIB
peak_within() {
	awk -v lim="$2" -v policies="^($3)$" '
		$1 == "policy" {for (i = 1; i <= NF; i++) if ($i == "peakMiB") c = i}
		c && $1 ~ policies && ($c == "-" || $c > lim) {bad = 1}
		END {exit bad || !c}' "$1"
}

# check_dos_to_bound OUT LABEL MAX [MAX_WHOLE]: dos's row in the dos-bench output OUT is
# at least the bound and at most MAX times it, and at most MAX_WHOLE (default 1.05) times
# the bound in whole subgroups (sched/bound.c): what no schedule of these tasks beats
check_dos_to_bound() {
	local to_bound to_whole
	to_bound=$(column "$1" dos /bound)
	to_whole=$(column "$1" dos /whole)
	awk -v r="$to_bound" -v max="$3" 'BEGIN {exit !(r != "" && r >= 1 && r <= max)}'
	check "$2: dos at ${to_bound}x the bound (at least 1, at most ${3}x)" $?
	awk -v r="$to_whole" -v max="${4:-1.05}" 'BEGIN {exit !(r != "" && r >= 1 && r <= max)}'
	check "$2: dos at ${to_whole}x the bound in whole subgroups (at least 1, at most ${4:-1.05}x)" $?
}

# check_no_slower_than_dmda LABEL DOS_S DMDA_S: dos's seconds are no more than dmda's
# (within 0.1 %, the simulated times' printed precision)
check_no_slower_than_dmda() {
	awk -v d="$2" -v m="$3" 'BEGIN {exit !(d != "" && m != "" && d <= m * 1.001)}'
	check "$1: dos $2 s <= dmda $3 s" $?
}

# case MACHINE GPU_MEM_MIB HOMES [TO_BOUND]: 2e9 params in 1e8 subgroups under dos, stride
# and dmda, gradients and 16-bit weights in host memory or (HOMES=gpu) on the GPU as in
# training; dos at most TO_BOUND times the bound when given
run_case() {
	local machine=$1 mem=$2 homes=$3 max_to_bound=${4:-}
	local label="$machine (gpu-mem-mib $mem, homes $homes)" out=$home/$1-$2-$3.txt
	(
		eval "$("$top"/tools/sim-env.sh "$machine" "$home/$machine-$mem-$homes")"
		"$bench" optimizer --params 2e9 --subgroup 1e8 --steps 2 --gpu-mem-mib "$mem" --homes "$homes" \
			--policies dos,stride,dmda >"$out" 2>&1
	)
	local rc=$?
	check "$label: dos-bench ran" $rc
	[[ $rc == 0 ]] || { tail -n 20 "$out"; return; }
	grep -E '^(dos|stride|dmda) ' "$out"
	local dos stride dmda
	dos=$(awk '$1 == "dos" {print $2}' "$out")
	stride=$(awk '$1 == "stride" {print $2}' "$out")
	dmda=$(awk '$1 == "dmda" {print $2}' "$out")
	awk -v d="$dos" -v s="$stride" -v m="$dmda" 'BEGIN {b = s < m ? s : m; exit !(d <= b * 1.001)}'
	check "$label: dos ${dos} ms <= min(stride ${stride}, dmda ${dmda}) ms" $?
	if [[ -n $max_to_bound ]]; then
		check_dos_to_bound "$out" "$label" "$max_to_bound"
	fi
	if [[ $mem != 0 ]]; then
		peak_within "$out" "$mem" 'dos|stride|dmda'
		check "$label: peak GPU memory within the limit" $?
	fi
	local home_lines
	home_lines=$(grep -c 'state valid on the host after it: \([0-9]*\) of \1 handles' "$out")
	[[ $home_lines == 3 ]]
	check "$label: all state valid on the host after the flush (3 policies)" $?
}

# Subgroups small enough for StarPU's suballocator (8e5 parameters: 3.2 MB buffers, ten
# to a 32 MiB chunk) whose state overflows the whole GPU: the plan counts the chunks StarPU
# charges, not the buffers' bytes; counting bytes, the resident state it pinned left the
# staged updates no room and SimGrid found StarPU deadlocked at 4.1 simulated s.
small_out=$home/suballocated.txt
(
	eval "$("$top"/tools/sim-env.sh h100-pcie5 "$home/suballocated")"
	timeout 600 "$bench" optimizer --params 8e9 --subgroup 8e5 --steps 1 --policies dos >"$small_out" 2>&1
)
! grep -q 'Deadlock detected' "$small_out" && awk '$1 == "dos" && $2 + 0 > 0 {ok = 1} END {exit !ok}' "$small_out" &&
	grep -q 'state valid on the host after it: \([0-9]*\) of \1 handles' "$small_out"
check "h100-pcie5: 8e9 params in 10,000 suballocated subgroups: dos completes, state home ($(awk '$1 == "dos" {print $2}' "$small_out") ms)" $?

# GPUs that hold 6 or 7 subgroups' state but not their gradients' and 16-bit weights'
# copies too (subgroups of 1e8, host homes, 8 GiB per GPU): the plan kept as many
# resident as the budget held, pinned, and the first GPU update found no room: SimGrid
# saw StarPU deadlocked (one GPU at 0.42 simulated s; the 4-GPU node of issue 17's
# tables too). Resident state now leaves one update's copies room (cost_model.h).
full_gpu_case() { # MACHINE PARAMS
	local out=$home/full-$1.txt
	(
		eval "$("$top"/tools/sim-env.sh "$1" "$home/full-$1")"
		timeout 300 "$bench" optimizer --params "$2" --subgroup 1e8 --steps 2 --gpu-mem-mib 8192 --policies dos >"$out" 2>&1
	)
	! grep -q 'Deadlock detected' "$out" && awk '$1 == "dos" && $2 + 0 > 0 {ok = 1} END {exit !ok}' "$out" && peak_within "$out" 8192 dos &&
		grep -q 'state valid on the host after it: \([0-9]*\) of \1 handles' "$out"
	check "$1, 8 GiB per GPU: $2 params in subgroups of 1e8, host homes: dos completes within the limit, state home ($(awk '$1 == "dos" {print $2}' "$out") ms)" $?
}
full_gpu_case h100-pcie5 1e9
full_gpu_case h100-pcie5-x4 4e9
# The issue's 20B per GPU on the 4-GPU node with 8 GiB each: GPU 3 has no room to stage,
# and GPUs 2 and 3 share one switch. Counted per GPU at half its switch, GPU 2 got no more
# staging than GPU 0 or 1, and switch (0,1) carried 49 GB a step against 23 GB (2211.7
# ms); counted per switch, each carries about half. The first GPU of each pair stages
# with three slots, the others hold the resident state: 1600.3 ms, 1.062x the bound (two
# slots: 1753.5 ms, 1.164x; one: 1924.6). results/full-gpu-2026-12-03.md
pairs_out=$home/x4-20b.txt
(
	eval "$("$top"/tools/sim-env.sh h100-pcie5-x4 "$home/x4-20b")"
	timeout 300 "$bench" optimizer --params 2e10 --subgroup 1e8 --steps 3 --gpu-mem-mib 8192 --policies dos >"$pairs_out" 2>&1
)
grep -E '^# dos: per step|^dos ' "$pairs_out"
pairs_h2d=$(sed -n 's/^# dos: per step.*CUDA 0 [0-9.]* (H2D \([0-9.]*\) GB.*CUDA 1 [0-9.]* (H2D \([0-9.]*\) GB.*CUDA 2 [0-9.]* (H2D \([0-9.]*\) GB.*CUDA 3 [0-9.]* (H2D \([0-9.]*\) GB.*/\1 \2 \3 \4/p' "$pairs_out")
echo "$pairs_h2d" | awk '{a = $1 + $2; b = $3 + $4; exit !(NF == 4 && a > 0 && b / a >= 0.8 && b / a <= 1.25)}'
check "h100-pcie5-x4, 8 GiB per GPU, 20B: both switches carry the staging alike (H2D GB per step, GPUs 0 1 2 3: $pairs_h2d)" $?
# 1.10x both ways, issue 17's target on several GPUs: both bounds pool the 4 GPUs into
# one (bound.c), which no placement of whole subgroups on separate GPUs need reach
# (1.056x in whole subgroups, 1601.3 ms)
check_dos_to_bound "$pairs_out" "h100-pcie5-x4, 8 GiB per GPU, 20B" 1.10 1.10

python3 "$top"/tools/gen-machine.py --check >/dev/null
check "sched/machines matches tools/gen-machine.py" $?
# Several GPUs in one process (issue 17): on the 4-GPU node (4e8 params in 1e7 subgroups)
# dos plans every GPU: each one updates subgroups, no GPU exceeds its limit, and dos comes
# within the issue's 1.10x of the bound that counts every GPU (1.058x, with the whole
# GPUs and with 1024 MiB per GPU, where the plan of GPU 0 alone gave 3.216x and the
# pooled plan, staging through the few GPUs with room, 1.250x), faster than lws, which
# spreads updates over the GPUs without a plan, and than the static splits.
x4_case() { # MEM_MIB MAX_TO_BOUND
	local mem=$1 max=$2 out=$home/x4-$1.txt label="h100-pcie5-x4 (gpu-mem-mib $1)"
	(
		eval "$("$top"/tools/sim-env.sh h100-pcie5-x4 "$home/x4-$mem")"
		timeout 300 "$bench" optimizer --params 4e8 --subgroup 1e7 --steps 2 --gpu-mem-mib "$mem" \
			--policies dos,lws,resident,stride >"$out" 2>&1
	)
	check "$label: dos-bench ran" $?
	grep -E '^(dos|lws|resident|stride) |^# dos: per step' "$out"
	grep -q '^# dos: 1 CPU worker, 4 CUDA workers' "$out"
	check "$label: StarPU runs 4 CUDA workers" $?
	local k used=0
	for k in 0 1 2 3; do
		grep -qE "^# dos: per step, updates .*CUDA $k [1-9]" "$out" && used=$((used + 1))
	done
	[[ $used == 4 ]]
	check "$label: dos updates subgroups on each of the 4 GPUs ($used)" $?
	local dos other
	dos=$(awk '$1 == "dos" {print $2}' "$out")
	check_dos_to_bound "$out" "$label" "$max"
	for other in lws resident stride; do
		local t
		t=$(awk -v p=$other '$1 == p {print $2}' "$out")
		awk -v d="$dos" -v o="$t" 'BEGIN {exit !(d != "" && o != "" && d < o)}'
		check "$label: dos ${dos} ms < $other ${t} ms" $?
	done
	if [[ $mem != 0 ]]; then
		peak_within "$out" "$mem" 'dos|lws|resident|stride'
		check "$label: peak GPU memory within the limit" $?
	fi
}
x4_case 0 1.10
x4_case 1024 1.10
# The bound splits the parameters continuously; with 20 subgroups each CPU update is a
# tenth of the step, so where the optimum falls between whole subgroups no placement
# reaches it. On h100-pcie5 the same model over whole subgroups is 1.088x the bound with
# 8192 MiB (dos is there) and 1.051x with 16384 MiB and the training layout (dos 1.10x:
# its 7 staged subgroups also fill a two-slot pipeline): those two are not held to it.
run_case h100-pcie5 8192 host
run_case h100-pcie5 16384 gpu
run_case a100-pcie4 0 host 1.05
run_case h200 0 host 1.05
# The training layout with room for all the state, under StarPU's default background
# write-back: the state the plan keeps resident must stay out of its reach (docs/policy.md).
run_case h200 0 gpu 1.05

# Whole training iterations (dos-train --simulate: forward and backward on the GPU, the
# optimizer's updates placed by the policy): on the 1b preset dos is no slower than dmda,
# and it plans every step.
train_case() { # MACHINE [PRECISION [MICRO_BATCHES]]
	local machine=$1 precision=${2:-fp32} acc=${3:-1} out=$home/train-$1-${2:-fp32}-acc${3:-1} dos dmda
	for policy in dos dmda; do
		DOS_SCHED_VERBOSE=1 "${bench%/dos-bench}/dos-train" --simulate "$machine" --preset 1b --steps 4 \
			--precision "$precision" --accumulate "$acc" --policy "$policy" --quiet >"$out-$policy.txt" 2>&1
		check "$machine: dos-train --simulate --preset 1b --precision $precision --accumulate $acc --policy $policy ran" $?
	done
	# the steady iteration, which issue 21's targets judge: dos has a one-off slower
	# third step here, which dmda no longer has with subgroups that follow the tensors
	# (h100-pcie5 fp32: 0.185 s against 0.162; results/subgroup-layout-sim-2026-12-04.md)
	dos=$(steady "$out-dos.txt")
	dmda=$(steady "$out-dmda.txt")
	check_no_slower_than_dmda "$machine steady training iteration ($precision, $acc micro-batches)" "$dos" "$dmda"
	grep -q 'dos: .* 4 steps planned' "$out-dos.txt"
	check "$machine training ($precision, $acc micro-batches): dos planned each of the 4 overlapping steps" $?
}
train_case h100-pcie5
train_case h200
out=$home/train-x4.txt
timeout 120 "${bench%/dos-bench}/dos-train" --simulate h100-pcie5-x4 --preset tiny --steps 3 --quiet >"$out" 2>&1
check "h100-pcie5-x4: dos-train --simulate --preset tiny completes" $?
# (what it ran on, or its last lines, in the check's line: this failed once, unexplained)
workers=$(grep -o '[0-9]* CPU + [0-9]* CUDA workers' "$out" | head -n 1)
[ "$workers" = "1 CPU + 4 CUDA workers" ]
check "h100-pcie5-x4: dos-train runs on 4 CUDA workers (${workers:-no such line: $(tail -n 3 "$out" | tr '\n' ' ')})" $?
# The same training iteration on 4 GPUs and on one (1b, bf16, one micro-batch per step).
# Forward and backward follow the weights to the GPU that updated them, and every task
# that read across a subgroup boundary copied the neighbour's whole buffer: with
# neighbouring subgroups' state interleaved over the GPUs the 4-GPU iteration took 2.05x
# the one-GPU one (0.133 s against 0.065 s); kept in runs, one per GPU, 1.38x. With
# subgroups that follow the tensors (dos-train's default in one process) no task reads
# across a boundary. One process runs one chain of layers, so 4 GPUs cannot beat one on a
# model one GPU holds: they take turns, and each turn adds a copy of the activations
# between GPUs. Since the link costs count data without a home where it is made (on the
# GPU), both iterations keep the state resident, 0.0387 s on 4 GPUs against 0.0366 on
# one (1.06x; 0.059 against 0.082 before, when the one GPU ran updates on the CPU); held
# to 1.10x. Both from host memory (--state-on-host), which the
# plan must move in over the first steps.
for machine in h100-pcie5 h100-pcie5-x4; do
	DOS_SCHED_VERBOSE=1 timeout 120 "${bench%/dos-bench}/dos-train" --simulate $machine --preset 1b \
		--precision bf16 --steps 6 --state-on-host --quiet >"$home/steady-$machine.txt" 2>&1
	check "$machine: dos-train --simulate --preset 1b --precision bf16 --steps 6 ran" $?
done
one=$(steady "$home/steady-h100-pcie5.txt")
four=$(steady "$home/steady-h100-pcie5-x4.txt")
awk -v o="$one" -v f="$four" 'BEGIN {exit !(o != "" && f != "" && f <= 1.10 * o)}'
check "training iteration on 4 GPUs ${four} s <= 1.10 x on one ${one} s" $?
# A fresh run on the 4 GPUs makes its state by tasks (the default), each GPU an even share
# in runs of neighbouring subgroups, which the first plan finds resident where it was made:
# the first iteration within 3x the steady one (measured 0.0824 s against 0.0380; with the
# state copied on the host, as above, 0.3879 against 0.0387: 8 GB over the links at once).
x4_fresh=$home/fresh-h100-pcie5-x4.txt
DOS_SCHED_VERBOSE=1 timeout 120 "${bench%/dos-bench}/dos-train" --simulate h100-pcie5-x4 --preset 1b --precision bf16 \
	--steps 6 --quiet >"$x4_fresh" 2>&1
check "h100-pcie5-x4 1b bf16, state by tasks: dos-train ran" $?
grep -qE 'state created by [1-9][0-9]* tasks on GPU \(kept there\), 0 on CPU' "$x4_fresh"
check "h100-pcie5-x4 1b bf16: the state made on the GPUs, none on the CPU" $?
x4_first=$(sed -n 's/.*steady iteration [0-9.]* simulated s.*the first \([0-9.]*\) s.*/\1/p' "$x4_fresh")
awk -v f="$x4_first" -v s="$(steady "$x4_fresh")" 'BEGIN {exit !(f != "" && s != "" && f <= 3 * s)}'
check "h100-pcie5-x4 1b bf16, state by tasks: first iteration $x4_first s <= 3 x steady $(steady "$x4_fresh") s" $?
# With 6000 MiB per GPU the model's data leaves little room beside it. The training graph
# declares the model's weights and activations as a share per GPU (StarPU spreads them),
# the policy learns the rest over the first iterations (10 steps: a median of 9
# intervals, 3 of them still learning): the steady iteration as with the whole GPUs
# (0.0379 s against 0.0380) and below dmda (0.0948); declared whole on every GPU, the
# state had 0.26 GB of room per GPU and the iteration took 0.0738 s.
for pol in dos dmda; do
	STARPU_LIMIT_CUDA_MEM=6000 timeout 120 "${bench%/dos-bench}/dos-train" --simulate h100-pcie5-x4 --preset 1b \
		--precision bf16 --steps 10 --policy $pol --quiet >"$home/tight-x4-$pol.txt" 2>&1
	check "h100-pcie5-x4 1b bf16, 6000 MiB per GPU, $pol: dos-train ran" $?
done
tight=$(steady "$home/tight-x4-dos.txt")
awk -v t="$tight" -v w="$(steady "$x4_fresh")" -v d="$(steady "$home/tight-x4-dmda.txt")" \
	'BEGIN {exit !(t != "" && w != "" && d != "" && t <= 1.10 * w && t <= d)}'
check "h100-pcie5-x4 1b bf16, 6000 MiB per GPU: dos steady $tight s <= 1.10 x whole GPUs $(steady "$x4_fresh") s and <= dmda $(steady "$home/tight-x4-dmda.txt") s" $?
# With 3000 MiB per GPU the model's own data no longer fits beside the state: the
# application's tasks spread over the GPUs, and each GPU's share of the model is what the
# plan leaves room for. Placed by earliest finish alone they landed on another GPU each
# step, the budgets and the plan's residents moved with them, and dos was slower than
# dmda (0.2007 s against 0.1729); each repeated task now goes back to the GPU it used
# last when that one is not far behind (worker_queues.c): 0.1534 s.
for pol in dos dmda; do
	STARPU_LIMIT_CUDA_MEM=3000 timeout 120 "${bench%/dos-bench}/dos-train" --simulate h100-pcie5-x4 --preset 1b \
		--precision bf16 --steps 10 --policy $pol --quiet >"$home/tighter-x4-$pol.txt" 2>&1
	check "h100-pcie5-x4 1b bf16, 3000 MiB per GPU, $pol: dos-train ran" $?
done
check_no_slower_than_dmda "h100-pcie5-x4 1b bf16, 3000 MiB per GPU, steady iteration" \
	"$(steady "$home/tighter-x4-dos.txt")" "$(steady "$home/tighter-x4-dmda.txt")"
# 16-bit compute (tensor-core products): the GPU is no longer the bottleneck, the update is.
# With 4 micro-batches a step the 33 norm tensors' updates (2048 params each) cost the GPU
# more in its fixed cost per task than in work: dos, like dmda, runs them on the CPU
# during backward (0.0984 s a step both; 0.0987 with them on the GPU).
train_case h100-pcie5 bf16
train_case h100-pcie5 bf16 4

# A fresh run creates its optimizer state by tasks (dos-train's default). On a GPU that
# holds it all (1b bf16, 80 GB) nothing then crosses the link in the first iteration,
# which takes at most 1.5x the steady one (measured 0.056 s against 0.043; with the state
# copied on the host 0.475 s against 0.065). On a 12000 MiB GPU the dos policy creates on
# the GPU the state its first plan keeps there and writes the rest home at once, on the
# GPU (none on the CPU, which the update phase needs), and dos stays no slower than dmda.
first_of() { sed -n 's/.*steady iteration [0-9.]* simulated s.*the first \([0-9.]*\) s.*/\1/p' "$1"; }
timeout 300 "${bench%/dos-bench}/dos-train" --simulate h100-pcie5 --preset 1b --precision bf16 --steps 6 --quiet \
	>"$home/fresh-whole.txt" 2>&1
check "h100-pcie5 1b bf16, state by tasks: dos-train ran" $?
awk -v f="$(first_of "$home/fresh-whole.txt")" -v s="$(steady "$home/fresh-whole.txt")" \
	'BEGIN {exit !(f != "" && s != "" && f <= 1.5 * s)}'
check "h100-pcie5 1b bf16, state by tasks: first iteration $(first_of "$home/fresh-whole.txt") s <= 1.5 x steady $(steady "$home/fresh-whole.txt") s" $?
for policy in dos dmda; do
	STARPU_LIMIT_CUDA_MEM=12000 DOS_SCHED_VERBOSE=1 timeout 300 "${bench%/dos-bench}/dos-train" --simulate h100-pcie5 \
		--preset 1b --precision bf16 --steps 6 --policy $policy --quiet >"$home/fresh-12000-$policy.txt" 2>&1
	check "h100-pcie5 12000 MiB 1b bf16, state by tasks, $policy: dos-train ran" $?
done
grep -qE 'state created by [1-9][0-9]* tasks on GPU \(kept there\), 0 on CPU, [1-9][0-9]* on GPU and written home' \
	"$home/fresh-12000-dos.txt"
check "h100-pcie5 12000 MiB: the state is created on the GPU where the plan keeps it, the rest written home" $?
check_no_slower_than_dmda "h100-pcie5 12000 MiB, state by tasks" "$(steady "$home/fresh-12000-dos.txt")" \
	"$(steady "$home/fresh-12000-dmda.txt")"
# The state the first plan keeps is made on the GPU: the first iteration is no slower than
# the steady one (0.166 against 0.201 s; 0.224 while the plan kept room for copies that the
# application's forecast already held: results/suballocator-chunks-2026-12-03.md).
awk -v f="$(first_of "$home/fresh-12000-dos.txt")" -v s="$(steady "$home/fresh-12000-dos.txt")" \
	'BEGIN {exit !(f != "" && s != "" && f <= s)}'
check "h100-pcie5 12000 MiB, state by tasks: dos first iteration $(first_of "$home/fresh-12000-dos.txt") s <= steady $(steady "$home/fresh-12000-dos.txt") s" $?

# A GPU 16000 MiB in size, where 1b bf16 just fits: StarPU kept up to 128 MiB of empty
# suballocator chunks through every failed allocation and wrote a live 200 MB buffer home
# instead, each iteration under dos (0.058 s against dmda's 0.043). Our StarPU patch
# (tools/patches/starpu-1.4-release-free-chunks.patch) gives those chunks back first.
# Twelve steps: the steady state of the median of 11 intervals.
for policy in dos dmda; do
	STARPU_LIMIT_CUDA_MEM=16000 timeout 300 "${bench%/dos-bench}/dos-train" --simulate h100-pcie5 \
		--preset 1b --precision bf16 --steps 12 --policy $policy --quiet >"$home/full-16000-$policy.txt" 2>&1
	check "h100-pcie5 16000 MiB 1b bf16, $policy: dos-train ran" $?
done
check_no_slower_than_dmda "h100-pcie5 16000 MiB" "$(steady "$home/full-16000-dos.txt")" \
	"$(steady "$home/full-16000-dmda.txt")"

# A GPU just too small (1b bf16, 15500 MiB; also 15450 and 15600, but not 15400 or 15550):
# StarPU's suballocator deadlocks in the first iteration, under dmda as under dos, and
# SimGrid stops the simulation. dos-train must then fail and say so, not exit 0 as if it
# had trained; should StarPU stop deadlocking there, the run must simply complete.
out=$home/stuck-15500.txt
STARPU_LIMIT_CUDA_MEM=15500 timeout 300 "${bench%/dos-bench}/dos-train" --simulate h100-pcie5 --preset 1b \
	--precision bf16 --steps 3 --quiet >"$out" 2>&1
rc=$?
{ [[ $rc == 0 ]] && grep -q '^summary: steady iteration' "$out"; } ||
	{ [[ $rc == 1 ]] && grep -q 'dos-train: the simulation stopped before training ended' "$out"; }
check "h100-pcie5 15500 MiB 1b bf16: dos-train completes or fails saying the simulation stopped (exit $rc)" $?

# Small subgroups: the tiny preset in its default 4096-param subgroups ends in a
# 672-param one, below the smallest size the machines' perfmodels once covered (the
# simulation aborted there). Every size down to one parameter must be predicted.
out=$home/tiny.txt
timeout 120 "${bench%/dos-bench}/dos-train" --simulate h200 --preset tiny --steps 3 --quiet >"$out" 2>&1
check "h200: dos-train --simulate --preset tiny (a 672-param last subgroup) completes" $?

# --plot only observes: the simulated run (its plans, what each learned, its time) is the
# same with it and without. Its recorder once drained the pipeline before the last step,
# which then started on an idle machine and taught the dos forecast another iteration.
for plot in no yes; do
	plot_args=()
	[[ $plot == yes ]] && plot_args=(--plot "$home/plot.svg")
	DOS_SCHED_VERBOSE=2 timeout 120 "${bench%/dos-bench}/dos-train" --simulate h100-pcie5 --preset tiny --steps 3 \
		--quiet "${plot_args[@]}" >"$home/plot-$plot.txt" 2>&1
	check "h100-pcie5 tiny, --plot $plot: dos-train completes" $?
	grep -E 'plan of step|^summary: .* tokens/s' "$home/plot-$plot.txt" >"$home/plot-$plot.run"
done
[[ -s $home/plot-no.run ]] && cmp -s "$home/plot-no.run" "$home/plot-yes.run" && [[ -s $home/plot.svg ]]
check "h100-pcie5 tiny: the same plans and simulated time with --plot and without" $?

# Less GPU memory than the plan would like (STARPU_LIMIT_CUDA_MEM): with 7600 MiB the
# model (7.8 GB declared) leaves no room for optimizer state in subgroups cut across
# tensors, not even the small last subgroup's 0.16 GB (with 8000 MiB it fits beside the
# 0.5 % safety margin that resident state keeps), so every update runs on the CPU, the
# run completes, and dos says so once (following the tensors, the norms' subgroups of a
# few KB would fit); with 6 GB even the model's weights and activations do not fit and
# StarPU evicts its data, but the run still completes (no deadlock).
for mem in 7600 6000; do
	out=$home/limited-$mem.txt
	STARPU_LIMIT_CUDA_MEM=$mem timeout 300 "${bench%/dos-bench}/dos-train" --simulate h100-pcie5 --preset 1b \
		--subgroup-layout flat --steps 3 --quiet >"$out" 2>&1
	check "h100-pcie5 with a ${mem} MiB GPU: dos-train completes" $?
	grep -q 'updates ran [1-9][0-9]* on CPU workers, 0 on GPU workers' "$out"
	check "h100-pcie5 with a ${mem} MiB GPU: every update on the CPU" $?
	[[ $(grep -c 'no GPU memory left for optimizer state' "$out") == 1 ]]
	check "h100-pcie5 with a ${mem} MiB GPU: dos says so once" $?
done
# The application declares less GPU memory than it uses (DOS_GPU_DECLARED_MIB=0 in place
# of the model's declaration), 14000 MiB GPU: planning with the declaration alone
# (DOS_GPU_FORECAST=declared) puts state where the model's data is and StarPU evicts it
# back and forth; the forecast learned from the model's tasks leaves the model the room
# it measured (the plan's GPU budget shrinks by at least that much) and is faster.
for fc in declared learned; do
	STARPU_LIMIT_CUDA_MEM=14000 DOS_GPU_DECLARED_MIB=0 DOS_GPU_FORECAST=$fc DOS_SCHED_VERBOSE=2 timeout 300 \
		"${bench%/dos-bench}/dos-train" --simulate h100-pcie5 --preset 1b --steps 3 --quiet >"$home/undeclared-$fc.txt" 2>&1
	check "h100-pcie5 14000 MiB, model declares nothing, forecast $fc: dos-train completes" $?
done
declared=$(per_step "$home/undeclared-declared.txt")
learned=$(per_step "$home/undeclared-learned.txt")
awk -v l="$learned" -v d="$declared" 'BEGIN {exit !(l != "" && d != "" && l < 0.9 * d)}'
check "model declares nothing: learned forecast ${learned} s/step < 0.9 x declared-only ${declared} s/step" $?
budget_of() { sed -n 's/.*plan of step 3 .*GPU budget \([0-9.]*\) GB.*/\1/p' "$1"; }
measured=$(sed -n 's/.*plan of step 3 .*forecast [0-9.]* GB (learned; measured \([0-9.]*\) GB).*/\1/p' \
	"$home/undeclared-learned.txt")
# (the policy prints 3 significant digits: 13.6 GB may be 13.65, hence the 0.06)
awk -v l="$(budget_of "$home/undeclared-learned.txt")" -v d="$(budget_of "$home/undeclared-declared.txt")" \
	-v m="$measured" 'BEGIN {exit !(l != "" && d != "" && m > 0 && l <= d - m + 0.06)}'
check "model declares nothing: step 3 is planned with the learned forecast (${measured} GB), leaving the model that room" $?
end_checks sim-policies "$summary"
