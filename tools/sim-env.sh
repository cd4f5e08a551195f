#!/usr/bin/env bash
# Prepares a StarPU home for one of the simulated machines of sched/machines/ and prints
# the environment that makes a program built against StarPU's SimGrid variant run on it:
#
#   eval "$(tools/sim-env.sh h100-pcie5 /tmp/simhome)"
#
# Usage: tools/sim-env.sh NAME [STARPU_HOME_DIR]
#   STARPU_HOME_DIR defaults to ${TMPDIR:-/tmp}/starpu-dos-sim. Several machines can share
#   one: StarPU's files are named after the machine. DOS_MACHINES_DIR (default
#   sched/machines) selects another set, e.g. one made by gen-machine.py --out.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
machines=${DOS_MACHINES_DIR:-$here/../sched/machines}

known() {
	for d in "$machines"/*/sim.env; do
		[ -e "$d" ] && basename "$(dirname "$d")"
	done | paste -sd' '
}

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
	echo "usage: $0 NAME [STARPU_HOME_DIR]   (machines: $(known))" >&2
	exit 2
fi
name=$1
dir=$machines/$name
if [ -z "$name" ] || [ ! -f "$dir/sim.env" ] || [ ! -f "$dir/bus/$name.platform.v4.xml" ]; then
	echo "sim-env: unknown machine '$name'; known machines: $(known)" >&2
	exit 2
fi
home=${2:-${TMPDIR:-/tmp}/starpu-dos-sim}
sampling=$home/.starpu/sampling
mkdir -p "$sampling/bus" "$sampling/codelets/45"
home=$(cd "$home" && pwd)
sampling=$home/.starpu/sampling
cp -f "$dir"/bus/"$name".* "$sampling/bus/"
cp -f "$dir"/codelets/45/*."$name" "$sampling/codelets/45/"

# STARPU_NCPU, STARPU_NCUDA, STARPU_LIMIT_CUDA_MEM: generated with the machine's files.
ncpu=$(sed -n 's/^STARPU_NCPU=//p' "$dir/sim.env")
ncuda=$(sed -n 's/^STARPU_NCUDA=//p' "$dir/sim.env")
cuda_mem=$(sed -n 's/^STARPU_LIMIT_CUDA_MEM=//p' "$dir/sim.env")

printf 'export STARPU_HOME=%q\n' "$home"
printf 'export STARPU_PERF_MODEL_DIR=%q\n' "$sampling"
cat <<EOF
export STARPU_HOSTNAME=$name
export STARPU_NCPU=$ncpu
export STARPU_NCUDA=$ncuda
export STARPU_NOPENCL=0
export STARPU_LIMIT_CUDA_MEM=$cuda_mem
export STARPU_SIMGRID_TRANSFER_COST=1
export STARPU_SIMGRID_CUDA_MALLOC_COST=0
export STARPU_SIMGRID_CUDA_QUEUE_COST=0
export STARPU_SIMGRID_TASK_SUBMIT_COST=0
export STARPU_SIMGRID_TASK_PUSH_COST=0
export STARPU_SIMGRID_FETCHING_INPUT_COST=0
export STARPU_SIMGRID_SCHED_COST=0
export STARPU_MALLOC_SIMULATION_FOLD=16
export STARPU_MINIMUM_CLEAN_BUFFERS=5
export STARPU_TARGET_CLEAN_BUFFERS=10
EOF
