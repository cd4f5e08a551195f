#!/usr/bin/env bash
# A data-parallel dos-train job on a simulated cluster: N nodes, each one of the machines of
# sched/machines/, one rank per node, on a network of tools/gen-machine.py's NETWORKS, run
# by StarPU's starpu_smpirun (StarPU-MPI over SimGrid's SMPI: every rank a simulated node,
# all of them in this one process). Times are simulated; no loss is computed.
#
#   tools/sim-cluster.sh --nodes 16 h100-pcie5 --preset 7b --precision bf16 --steps 6
#
# Usage: tools/sim-cluster.sh [--nodes N] [--network NAME] [--build DIR] MACHINE [dos-train options...]
#   --nodes N       simulated nodes (default 4)
#   --network NAME  ib-ndr400 (default) or ib-hdr200 (sched/machines/README.md)
#   --build DIR     a build of dos-train against StarPU's SMPI variant (default build-smpi:
#                   tools/bootstrap.sh build-smpi --smpi && make -C build-smpi dos-train)
# Environment: SIM_CLUSTER_DIR keeps the platform, host file and StarPU home in that folder
# (default: a temporary one, removed at the end). A model whose state exceeds the host's
# memory (the 7b preset) needs `sysctl vm.overcommit_memory=1`: SMPI maps, it never fills.
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

usage() {
	sed -n 's/^# \{0,1\}//; 9,16p' "${BASH_SOURCE[0]}" >&2
	exit 2
}

nodes=4 network=ib-ndr400 build=$top/build-smpi
while [[ $# -gt 0 ]]; do
	case $1 in
	--nodes) nodes=${2:?--nodes needs a number}; shift 2 ;;
	--network) network=${2:?--network needs a name}; shift 2 ;;
	--build) build=${2:?--build needs a folder}; shift 2 ;;
	-h | --help) usage ;;
	-*) echo "sim-cluster: unknown option '$1' before the machine's name" >&2; usage ;;
	*) break ;;
	esac
done
[[ $# -ge 1 ]] || usage
machine=$1
shift
[[ $nodes =~ ^[1-9][0-9]*$ ]] || { echo "sim-cluster: --nodes = '$nodes' is not a positive number" >&2; exit 2; }
grep -q 'define DOS_SMPI 1' "$build/config.h" 2>/dev/null && [[ -f $build/dos-train ]] || {
	echo "sim-cluster: --build = '$build' has no dos-train built against StarPU's SMPI variant" \
		"(tools/bootstrap.sh $build --smpi && make -C $build dos-train)" >&2
	exit 2
}
prefix=$(sed -n 's/^STARPU_PREFIX = //p' "$build/Makefile")

dir=${SIM_CLUSTER_DIR:-}
if [[ -z $dir ]]; then
	dir=$(mktemp -d)
	trap 'rm -rf "$dir"' EXIT
fi
mkdir -p "$dir"
python3 "$top"/tools/gen-machine.py --cluster "$nodes" --network "$network" --out "$dir/platform"
eval "$("$top"/tools/sim-env.sh "$machine" "$dir/home")"
export DOS_SOURCE_DIR=${DOS_SOURCE_DIR:-$top}
mapfile -t smpi_options <"$dir/platform/smpi-options"

# SMPI maps shared allocations block by block: 64 MiB blocks keep a 7B model's folded
# arrays on 64 ranks under Linux's default of 65530 mappings.
"$prefix"/bin/starpu_smpirun -platform "$dir/platform/cluster.xml" -hostfile "$dir/platform/hostfile" \
	-np "$nodes" "$build/dos-train" --simulate "$machine" "$@" "${smpi_options[@]}" \
	--cfg=smpi/shared-malloc-blocksize:$((64 << 20))
