#!/usr/bin/env bash
# The policy comparison on the simulated machines, as recorded in results/: the 20B
# setup of docs/background.md (5e9 params per rank in 1e8 subgroups, fp16 gradients, bf16
# weights) on each machine with its whole GPU, on h100-pcie5 with 8 GB left for the
# optimizer, and on h100-pcie5 with gradients and 16-bit weights living on the GPU as in
# training (whole GPU, and 32 GB). Needs build-simgrid/ (make check-sim builds it).
# With --nodes: the nodes of several GPUs driven by one process (the -xG machines), the
# same setup per GPU (G x 5e9 params), with the whole GPUs and with 8 GB per GPU.
# Usage: tools/sim-compare.sh [--nodes [MACHINE...]]
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
		DOS_SCHED_VERBOSE=1 "$bench" optimizer --params "${params:-5e9}" --subgroup 1e8 --steps 2 \
			--gpu-mem-mib "$mem" --homes "$homes" 2>&1 | grep -vE '^\[|^$|simgrid_update_xml'
	)
}
if [[ ${1:-} == --nodes ]]; then
	shift
	machines=("$@")
	[[ ${#machines[@]} -gt 0 ]] || machines=(h100-pcie5-x4 h100-pcie5-x8 a100-pcie4-x4 h200-x8)
	for m in "${machines[@]}"; do
		gpus=$(sed -n 's/^STARPU_NCUDA=//p' "$top/sched/machines/$m/sim.env")
		params=$((gpus * 5))e9
		run "$m" 0
		run "$m" 8192
	done
	exit 0
fi
run h100-pcie5 0
run h100-pcie5 8192
run a100-pcie4 0
run h200 0
run h100-pcie5 0 gpu
run h100-pcie5 32768 gpu
