#!/usr/bin/env bash
# The policy comparison on the simulated machines, as recorded in results/: the 20B
# setup of docs/background.md (5e9 params per rank in 1e8 subgroups, fp16 gradients, bf16
# weights) on each machine with its whole GPU, on h100-pcie5 with 8 GB left for the
# optimizer, and on h100-pcie5 with gradients and 16-bit weights living on the GPU as in
# training (whole GPU, and 32 GB). Needs build-simgrid/ (make check-sim builds it).
# Usage: tools/sim-compare.sh
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bench=$top/build-simgrid/dos-bench
[[ -x $bench ]] || {
	echo "no $bench: run 'make check-sim' (or configure build-simgrid) first" >&2
	exit 2
}
home=$(mktemp -d)
trap 'rm -rf "$home"' EXIT
run() {
	local machine=$1 mem=$2 homes=${3:-host}
	echo "=== $machine, --gpu-mem-mib $mem (0: the whole GPU), --homes $homes"
	(
		eval "$("$top"/tools/sim-env.sh "$machine" "$home/$machine-$mem-$homes")"
		DOS_SCHED_VERBOSE=1 "$bench" optimizer --params 5e9 --subgroup 1e8 --steps 2 --gpu-mem-mib "$mem" \
			--homes "$homes" 2>&1 | grep -vE '^\[|^$|simgrid_update_xml'
	)
}
run h100-pcie5 0
run h100-pcie5 8192
run a100-pcie4 0
run h200 0
run h100-pcie5 0 gpu
run h100-pcie5 32768 gpu
