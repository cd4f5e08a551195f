#!/usr/bin/env bash
# Weak scaling of data-parallel training on simulated clusters (tools/sim-cluster.sh):
# each rank keeps its micro-batches (the global batch grows with the nodes) and 1/N of the
# optimizer state. For every preset, node count, exchange (chain, scatter) and policy it
# runs dos-train and records the steady iteration and the gradient tail (from the end of
# backward to the last owner's reduced gradient), then prints one markdown table per
# preset: seconds per iteration, weak-scaling efficiency T(1) / T(N) of the same policy,
# and the tails. Times are simulated (deterministic); the wall time and peak memory of
# each simulation are recorded beside them.
#
#   tools/sim-scaling.sh --out /tmp/scaling     # the whole table (hours for 64 nodes of 7b)
#   tools/sim-scaling.sh --presets 1b --nodes "1 2 4" --policies "dos dmda" --out /tmp/s
#
# Options (defaults in brackets):
#   --presets "LIST"    ["1b 7b"] (bf16; 7b with --checkpoint-activations)
#   --nodes "LIST"      ["1 2 4 8 16 32 64"]
#   --policies "LIST"   ["dos dmda all-cpu stride"]
#   --exchanges "LIST"  ["chain scatter"] (one run at 1 node: nothing is exchanged)
#   --steps S           [5] (the steady iteration: median of the last S - 1 intervals)
#   --accumulate A      [the preset's] micro-batches per rank and step (the per-rank work
#                       that the exchange's cost is set against)
#   --machine NAME      [h100-pcie5]    --network NAME [ib-ndr400]
#   --build DIR         [build-smpi]
#   --out DIR           where the runs' logs and runs.tsv go [a temporary folder]; a run
#                       already in DIR/runs.tsv is not run again (an interrupted table
#                       resumes)
# A model whose state exceeds the host's memory (7b) needs `sysctl vm.overcommit_memory=1`.
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

presets="1b 7b" nodes="1 2 4 8 16 32 64" policies="dos dmda all-cpu stride" exchanges="chain scatter"
steps=5 accumulate='' machine=h100-pcie5 network=ib-ndr400 build=$top/build-smpi out=''
while [[ $# -gt 0 ]]; do
	case $1 in
	--presets | --nodes | --policies | --exchanges | --steps | --accumulate | --machine | --network | --build | --out)
		[[ $# -ge 2 ]] || { echo "sim-scaling: $1 needs a value" >&2; exit 2; }
		declare "${1#--}=$2"
		shift 2
		;;
	*)
		echo "sim-scaling: unknown argument '$1' (see the top of $0)" >&2
		exit 2
		;;
	esac
done
if [[ -z $out ]]; then
	out=$(mktemp -d)
	trap 'rm -rf "$out"' EXIT
fi
mkdir -p "$out"
tsv=$out/runs.tsv
[[ -f $tsv ]] || printf 'preset\taccumulate\tnodes\texchange\tpolicy\titeration_s\ttail_s\twall_s\tpeak_rss_gib\n' >"$tsv"
[[ -z $accumulate || $accumulate =~ ^[1-9][0-9]*$ ]] || { echo "sim-scaling: --accumulate = '$accumulate' is not a positive number" >&2; exit 2; }
if [[ " $presets " == *" 7b "* && $(cat /proc/sys/vm/overcommit_memory) != 1 ]]; then
	echo "sim-scaling: the 7b preset needs 'sysctl vm.overcommit_memory=1' (SMPI maps its state, it never fills it)" >&2
	exit 2
fi

run() { # preset nodes exchange policy (exchange '-' on one node: nothing is exchanged)
	local preset=$1 n=$2 exchange=$3 policy=$4 log extra=()
	if awk -F'\t' -v p="$preset" -v a="${accumulate:-preset}" -v n="$n" -v x="$exchange" -v y="$policy" \
		'$1 == p && $2 == a && $3 == n && $4 == x && $5 == y {found = 1} END {exit !found}' "$tsv"; then
		return 0
	fi
	[[ $preset == 7b ]] && extra=(--checkpoint-activations)
	[[ -n $accumulate ]] && extra+=(--accumulate "$accumulate")
	[[ $exchange != - ]] && extra+=(--dp-exchange "$exchange")
	log=$out/$preset-${accumulate:-preset}-$n-${exchange/-/none}-$policy.log
	local start=$SECONDS
	if ! /usr/bin/time -f 'peak_rss_kib %M' tools/sim-cluster.sh --build "$build" --nodes "$n" --network "$network" \
		"$machine" --preset "$preset" "${extra[@]}" --precision bf16 --steps "$steps" --quiet \
		--policy "$policy" >"$log" 2>&1; then
		echo "sim-scaling: $preset, $n nodes, $exchange, $policy failed; see $log" >&2
		tail -n 5 "$log" >&2
		return 1
	fi
	local iteration tail rss
	iteration=$(sed -n 's/^summary: steady iteration \([0-9.]*\) simulated s.*/\1/p' "$log")
	tail=$(sed -n 's/^summary: gradient tail \([0-9.]*\) simulated s.*/\1/p' "$log")
	rss=$(sed -n 's/^peak_rss_kib //p' "$log")
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.1f\n' "$preset" "${accumulate:-preset}" "$n" "$exchange" "$policy" "${iteration:--}" \
		"${tail:--}" $((SECONDS - start)) "$(awk -v k="${rss:-0}" 'BEGIN {print k / 1048576}')" >>"$tsv"
	echo "sim-scaling: $preset, $n nodes, $exchange, $policy: ${iteration:-?} s per iteration, tail ${tail:-?} s" \
		"($((SECONDS - start)) s of wall time)" >&2
}

cd "$top"
for preset in $presets; do
	for n in $nodes; do
		for exchange in $exchanges; do
			[[ $n == 1 ]] && exchange=-
			for policy in $policies; do
				run "$preset" "$n" "$exchange" "$policy" || true
			done
			[[ $n == 1 ]] && break
		done
	done
done

python3 - "$tsv" "$machine" "$network" "$steps" <<'PY'
import csv, sys
path, machine, network, steps = sys.argv[1:]
rows = list(csv.DictReader(open(path), delimiter='\t'))
def num(x):
    try:
        return float(x)
    except ValueError:
        return None
for preset, accumulate in dict.fromkeys((r['preset'], r['accumulate']) for r in rows):
    runs = [r for r in rows if r['preset'] == preset and r['accumulate'] == accumulate]
    policies = list(dict.fromkeys(r['policy'] for r in runs))
    base = {r['policy']: num(r['iteration_s']) for r in runs if r['nodes'] == '1'}
    batch = "the preset's micro-batches" if accumulate == 'preset' else f"{accumulate} micro-batches"
    print(f"\n### {preset} bf16, {batch} per rank, on {machine} nodes, {network}: "
          "seconds per iteration (weak-scaling efficiency)\n")
    print('| nodes | exchange | ' + ' | '.join(policies) + ' | dos gradient tail (s) | longest simulation: wall (s), peak RSS (GiB) |')
    print('|---|---|' + '---|' * len(policies) + '---|---|')
    keys = list(dict.fromkeys((r['nodes'], r['exchange']) for r in runs))
    keys.sort(key=lambda k: (int(k[0]), k[1]))
    for n, exchange in keys:
        cells, tail, wall, rss = [], '-', 0, 0.0
        for p in policies:
            r = next((r for r in runs if r['nodes'] == n and r['exchange'] == exchange and r['policy'] == p), None)
            t = num(r['iteration_s']) if r else None
            if t is None:
                cells.append('-')
                continue
            e = base.get(p)
            cells.append(f"{t:.3f} ({100 * e / t:.0f} %)" if e else f"{t:.3f}")
            if p == 'dos':
                tail = r['tail_s']
            wall, rss = max(wall, int(r['wall_s'])), max(rss, float(r['peak_rss_gib']))
        print(f"| {n} | {exchange} | " + ' | '.join(cells) + f" | {tail} | {wall}, {rss:.1f} |")
print(f"\nSteady iteration: the median of the last {int(steps) - 1} intervals between consecutive steps' losses; "
      "efficiency: the same policy's time on 1 node over this one (the same micro-batches per rank; each "
      "rank's share of the updates shrinks as 1/N). "
      "Peak RSS counts a folded page once per mapping of it, so it exceeds the memory the simulation really uses.")
PY
