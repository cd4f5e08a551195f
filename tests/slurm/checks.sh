#!/usr/bin/env bash
# What `make check-slurm` runs on the local Slurm of tools/slurm-local.sh: MPI programs
# launched by srun, each checking for itself that the launcher wired it correctly. One
# line per check at the bottom; a new one (say, dos-train in data-parallel mode) is one
# more `srun_check` line.
#
# Usage: tools/slurm-local.sh tests/slurm/checks.sh BUILD_DIR
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
top=$(cd "$here/../.." && pwd)
build=$(cd "${1:?usage: tools/slurm-local.sh tests/slurm/checks.sh BUILD_DIR}" && pwd)
: "${SLURM_CONF:?run me through tools/slurm-local.sh}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pass=0 fail=0

# The programs, with Debian's mpicc; the StarPU-MPI one against the cached StarPU.
starpu_prefix=$("$top"/tools/deps.sh --print-prefix native)
export PKG_CONFIG_PATH=$starpu_prefix/lib/pkgconfig
# (StarPU's cflags pull in CUDA headers full of deprecation warnings: shown on failure only)
# shellcheck disable=SC2046 # pkg-config's output is a word list
build_programs() {
	mpicc -Wall -Werror -o "$work/mpi_hello" "$here/mpi_hello.c" &&
		mpicc -o "$work/starpu_mpi_exchange" "$here/starpu_mpi_exchange.c" \
			$(pkg-config --cflags --libs starpumpi-1.4) -Wl,-rpath,"$starpu_prefix/lib"
}
if ! build_programs >"$work/cc.log" 2>&1; then
	cat "$work/cc.log"
	echo "check-slurm: the test programs do not build"
	exit 1
fi

# Every task's StarPU keeps out of ~/.starpu, says nothing unasked, and uses one CPU
# worker: two ranks share this 2-core machine with StarPU-MPI's progress threads.
export STARPU_HOME=$work/starpu-home STARPU_SILENT=1 STARPU_NCPU=1 STARPU_NCUDA=0
export DOS_SOURCE_DIR=$top

# srun_check DESCRIPTION NTASKS COMMAND [ARG...]: PASS when every task exits 0 within
# two minutes (srun's own limit; --kill-on-bad-exit ends the others when one fails).
# --overcommit: NTASKS may exceed the node's real CPU count (4 ranks on 2 cores), which
# Slurm would otherwise leave pending forever; --immediate: fail, not wait, when Slurm
# cannot start the job at all.
srun_check() {
	local what=$1 n=$2 start rc=0
	shift 2
	start=$EPOCHREALTIME
	srun -n "$n" --overcommit --immediate=30 --time=2 --kill-on-bad-exit=1 "$@" >"$work/out" 2>&1 || rc=$?
	sed 's/^/    /' "$work/out"
	if [[ $rc == 0 ]]; then
		pass=$((pass + 1))
		printf 'PASS: %s (srun -n %d, %.1f s)\n' "$what" "$n" "$(awk "BEGIN {print $EPOCHREALTIME - $start}")"
	else
		fail=$((fail + 1))
		printf 'FAIL: %s (srun -n %d: exit %d)\n' "$what" "$n" "$rc"
	fi
}

srun_check "MPI ranks and size from Slurm's PMIx" 2 "$work/mpi_hello" 2
srun_check "MPI ranks and size from Slurm's PMIx, more ranks than cores" 4 "$work/mpi_hello" 4
srun_check "StarPU-MPI vector from rank 0 to rank 1" 2 "$work/starpu_mpi_exchange"

# dos-train as a 2-rank data-parallel job under srun ends bit-identical to one process
# accumulating the same global batch (tests/test_data_parallel.sh does the same with mpirun)
"$build/dos-train" --preset tiny --steps 8 --quiet --accumulate 4 --dump "$work/one.bin" >"$work/one.log" 2>&1 ||
	{ cat "$work/one.log"; echo "check-slurm: dos-train alone failed"; exit 1; }
srun_check "dos-train data-parallel job" 2 "$build/dos-train" --preset tiny --steps 8 --quiet --accumulate 2 \
	--dump "$work/dp.bin"
if cmp -s "$work/one.bin" "$work/dp.bin"; then
	pass=$((pass + 1))
	echo "PASS: dos-train under srun -n 2 bit-identical to one process with the same global batch"
else
	fail=$((fail + 1))
	echo "FAIL: dos-train under srun -n 2 differs from one process with the same global batch"
fi

echo "check-slurm: $pass passed, $fail failed"
printf '# PASS: %d\n# FAIL: %d\n' "$pass" "$fail" >"$build/check-slurm.log"
[[ $fail == 0 ]]
