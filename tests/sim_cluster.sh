#!/usr/bin/env bash
# A data-parallel job on a simulated cluster (tools/sim-cluster.sh: StarPU-MPI over
# SimGrid's SMPI, 4 nodes of h100-pcie5 on 400 Gb/s InfiniBand, the tiny preset), with the
# chain and with the scatter exchange: it ends, every rank trains its share, plans the
# updates of its own subgroups under dos, and every subgroup is updated once per step;
# and 1b with scatter: every GPU update's gradient is fetched before the update starts, the
# owners' weight chunks are not held behind queued tasks, and on 2 nodes the gradient sums
# overlap the gradients' crossing of the GPU-to-host link.
# Writes a test-suite-style summary (# PASS / # FAIL lines) to the file named by $2.
#
# Usage: tests/sim_cluster.sh BUILD_SMPI_DIR SUMMARY_FILE
set -uo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:?usage: sim_cluster.sh BUILD_SMPI_DIR SUMMARY_FILE}
summary=${2:?usage: sim_cluster.sh BUILD_SMPI_DIR SUMMARY_FILE}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. "$top"/tests/check_lib.sh

nodes=4 steps=3 subgroups=9 # the tiny preset: 33,408 parameters in subgroups of 4096
for exchange in chain scatter; do
	out=$work/tiny-$exchange.txt
	DOS_SCHED_VERBOSE=1 timeout 120 "$top"/tools/sim-cluster.sh --build "$build" --nodes $nodes h100-pcie5 \
		--preset tiny --steps $steps --dp-exchange $exchange >"$out" 2>&1
	rc=$?
	check "$exchange: $nodes simulated nodes, tiny preset: the job ends (rc $rc)" $rc
	grep -q "^summary: $steps steps (0 skipped) in .* simulated s" "$out"
	check "$exchange: the job reports its $steps steps in simulated time" $?
	for ((r = 0; r < nodes; r++)); do
		grep -q "^dos-train: rank $r of $nodes on simulated node $r .* subgroups \[" "$out"
		check "$exchange: rank $r of $nodes keeps its share of the optimizer state" $?
	done
	[[ $(grep -c "dos: .* $steps steps planned" "$out") == "$nodes" ]]
	check "$exchange: each of the $nodes ranks' dos policy planned its updates of the $steps steps" $?
	updates=$(sed -n 's/^summary: subgroup updates ran \([0-9]*\) on CPU workers, \([0-9]*\) on GPU workers.*/\1 + \2/p' "$out")
	[[ -n $updates && $((updates)) == $((subgroups * steps)) ]]
	check "$exchange: every subgroup updated once per step (${updates:-none} = $subgroups x $steps)" $?
	[[ $fail == 0 ]] || tail -n 40 "$out"
done

# The 1b preset (11 subgroups per rank): updates become ready in the order backward ends
# their gradients, not in plan order, while the exchange keeps application tasks queued on
# the GPU. Each resident update's gradient must be fetched for it before it starts
# (fetched in plan order, three of the four ranks started 3 updates each unfetched, and
# those waited: sched/dos_policy.c).
out=$work/1b-scatter.txt
DOS_SCHED_VERBOSE=1 timeout 300 "$top"/tools/sim-cluster.sh --build "$build" --nodes $nodes h100-pcie5 \
	--preset 1b --precision bf16 --steps $steps --dp-exchange scatter >"$out" 2>&1
rc=$?
check "1b bf16, scatter: $nodes simulated nodes: the job ends (rc $rc)" $rc
unfetched=$(sed -n 's/^starpu-dos: dos: \([0-9]*\) GPU updates started before their gradient was fetched.*/\1/p' "$out" | sort -u | tr '\n' ' ')
[[ $(grep -c "^starpu-dos: dos: .* GPU updates started before" "$out") == "$nodes" && $unfetched == "0 " ]]
check "1b bf16, scatter: no rank's GPU update started before its gradient was fetched for it (per rank: ${unfetched:-none})" $?
# While a fetched gradient is still crossing the link, the GPU runs the tasks queued behind
# its update (the exchange's copies) instead of holding them for the transfer. Judged
# "arrived" by starpu_data_is_on_node (yes once a fetch is requested), no rank ever let
# one pass (this check failed); judged by validity, 2 37 51 16 times (sched/dos_policy.c,
# inputs_on_node).
yields=$(sed -n 's/^starpu-dos: dos: .* \([0-9]*\) times an update waiting for its inputs let a task behind it go first$/\1/p' "$out" | tr '\n' ' ')
[[ $(wc -w <<<"$yields") == "$nodes" && $(tr ' ' '\n' <<<"$yields" | sort -n | tail -n 1) -gt 0 ]]
check "1b bf16, scatter: a GPU lets queued tasks pass an update whose gradient is still crossing the link (per rank: ${yields:-none})" $?
# The owner's copies that cut its updated weights into the chunks it sends go ahead of the
# refreshes and updates queued on its GPU waiting for their transfers (graph/scatter.c):
# 0.195 s per iteration; queued behind them, 0.214 s.
steady=$(sed -n 's/^summary: steady iteration \([0-9.]*\) simulated s.*/\1/p' "$out")
[[ -n $steady ]] && awk -v t="$steady" 'BEGIN { exit !(t <= 0.205) }'
check "1b bf16, scatter: the owners' weight chunks leave ahead of the tasks waiting on their GPUs (iteration ${steady:-none} s <= 0.205)" $?
[[ $fail == 0 ]] || tail -n 40 "$out"

# On 2 nodes each rank sums half of every subgroup on its CPU worker (dos_grad_sum has no
# GPU version) while its GPU-to-host link carries its whole partial gradient (2.2 GB,
# about 88 ms). Fetched only once the sum was ready, the rank's own half queued behind
# every half it sends, and the sums ran after the link's whole traffic: a gradient tail
# of 0.173 s. Copied to the host as its gather ends (graph/scatter.c), the sums keep pace
# with the link: 0.125 s (0.101 s once the owners' weight chunks go first, above).
out=$work/1b-scatter-2.txt
timeout 300 "$top"/tools/sim-cluster.sh --build "$build" --nodes 2 h100-pcie5 \
	--preset 1b --precision bf16 --steps $steps --dp-exchange scatter >"$out" 2>&1
rc=$?
check "1b bf16, scatter: 2 simulated nodes: the job ends (rc $rc)" $rc
tail_s=$(sed -n 's/^summary: gradient tail \([0-9.]*\) simulated s.*/\1/p' "$out")
[[ -n $tail_s ]] && awk -v t="$tail_s" 'BEGIN { exit !(t <= 0.150) }'
check "1b bf16, scatter, 2 nodes: the gradient sums keep pace with the link (tail ${tail_s:-none} s <= 0.150)" $?
[[ $fail == 0 ]] || tail -n 40 "$out"

end_checks sim-cluster "$summary"
