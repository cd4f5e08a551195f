/* StarPU-MPI under srun: two ranks, StarPU's MPI layer initialising MPI itself; rank 0
 * sends a vector with starpu_mpi_isend_detached, rank 1 receives it with starpu_mpi_irecv
 * and checks every element. */
#include <starpu_mpi.h>
#include <stdio.h>

#define N 4096
#define TAG 42

static float value(int i)
{
	return 1.0f + 0.25f * (float)i;
}

int main(int argc, char **argv)
{
	if (starpu_mpi_init_conf(&argc, &argv, 1, MPI_COMM_WORLD, NULL) != 0) {
		fprintf(stderr, "starpu_mpi_exchange: starpu_mpi_init_conf failed\n");
		return 1;
	}
	int rank = starpu_mpi_world_rank(), size = starpu_mpi_world_size();
	if (size != 2) {
		fprintf(stderr, "starpu_mpi_exchange: rank %d: world size %d, expected 2\n", rank, size);
		starpu_mpi_shutdown();
		return 1;
	}
	static float v[N];
	for (int i = 0; i < N; i++)
		v[i] = rank == 0 ? value(i) : 0.0f;
	starpu_data_handle_t handle;
	starpu_vector_data_register(&handle, STARPU_MAIN_RAM, (uintptr_t)v, N, sizeof(float));
	int err = 0;
	if (rank == 0) {
		err = starpu_mpi_isend_detached(handle, 1, TAG, MPI_COMM_WORLD, NULL, NULL);
	} else {
		starpu_mpi_req req;
		MPI_Status status;
		err = starpu_mpi_irecv(handle, &req, 0, TAG, MPI_COMM_WORLD);
		if (!err)
			err = starpu_mpi_wait(&req, &status);
	}
	starpu_mpi_wait_for_all(MPI_COMM_WORLD);
	starpu_data_unregister(handle);
	starpu_mpi_shutdown();

	int wrong = 0;
	for (int i = 0; i < N; i++)
		wrong += v[i] != value(i);
	if (err || wrong) {
		fprintf(stderr, "starpu_mpi_exchange: rank %d: error %d, %d of %d elements wrong\n", rank, err, wrong,
			N);
		return 1;
	}
	printf("starpu_mpi_exchange: rank %d of %d: %s %d floats, all as sent\n", rank, size,
	       rank == 0 ? "sent" : "received", N);
	return 0;
}
