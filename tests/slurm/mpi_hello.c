/* Launcher wiring under srun: every rank gets its rank and the world size from MPI itself
 * (MPI_Comm_rank/size, i.e. Slurm's PMIx reached Open MPI), they agree with what Slurm
 * says (SLURM_PROCID, the expected size), and the ranks can talk (an allreduce).
 * Usage: mpi_hello EXPECTED_SIZE */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	int rank, size, expected = argc > 1 ? atoi(argv[1]) : -1;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	const char *procid = getenv("SLURM_PROCID");
	int rank_sum = -1;
	MPI_Allreduce(&rank, &rank_sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
	int ok = size == expected && procid && atoi(procid) == rank && rank_sum == size * (size - 1) / 2;
	printf("mpi_hello: rank %d of %d (SLURM_PROCID %s, sum of ranks %d): %s\n", rank, size,
	       procid ? procid : "unset", rank_sum, ok ? "ok" : "WRONG");
	MPI_Finalize();
	return ok ? 0 : 1;
}
