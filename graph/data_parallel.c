/* Data parallelism over StarPU-MPI (data_parallel.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "config.h"
#include "data_parallel.h"
#include "errors.h"

#if DOS_HAVE_MPI
#include <starpu_mpi.h>
#endif

void _dos_dp_owned_subgroups(const struct dos_data_parallel *dp, int rank, uint32_t nsubgroups, uint32_t *first,
			     uint32_t *end)
{
	uint64_t n = (uint64_t)_dos_dp_size(dp);
	*first = (uint32_t)((uint64_t)rank * nsubgroups / n);
	*end = (uint32_t)((uint64_t)(rank + 1) * nsubgroups / n);
}

int _dos_dp_owner(const struct dos_data_parallel *dp, uint32_t nsubgroups, uint32_t subgroup)
{
	/* the largest rank whose block starts at or before the subgroup (blocks may be empty
	 * when there are fewer subgroups than ranks) */
	int n = _dos_dp_size(dp);
	int r = (int)(((uint64_t)subgroup * n + n - 1) / nsubgroups);
	for (;; r--) {
		uint32_t first, end;
		_dos_dp_owned_subgroups(dp, r, nsubgroups, &first, &end);
		if (first <= subgroup && subgroup < end)
			return r;
	}
}

int _dos_dp_launched(void)
{
#if DOS_SMPI
	return 1; /* built for SMPI: every run is a rank of starpu_smpirun, even alone */
#else
	/* Open MPI's mpirun, Slurm's srun (a step with tasks), and PMI/PMIx launchers */
	const char *names[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"};
	for (size_t i = 0; i < sizeof names / sizeof *names; i++)
		if (getenv(names[i]))
			return 1;
	return 0;
#endif
}

/* A message's tag: kind in the high bits, index below. */
static int64_t message_tag(enum dos_dp_message kind, uint64_t index)
{
	return (int64_t)((uint64_t)kind << 48 | (index & ((UINT64_C(1) << 48) - 1)));
}

#if DOS_HAVE_MPI

/* _dos_dp_init ran: MPI is there (the collectives are no-ops in a single process) */
static int mpi_running;

int _dos_dp_available(void)
{
	return 1;
}

#if DOS_SMPI
/* Under SMPI, StarPU-MPI has initialised MPI (single-threaded: no direct MPI call may
 * race its progress thread) before our main, each rank is one simulated node with its
 * own simulated GPU, and there is no real core to bind: nothing to learn or choose. */
static int init_mpi_and_bind(int *argc, char ***argv, struct starpu_conf *conf, struct dos_rank_binding *binding)
{
	(void)argc, (void)argv, (void)conf;
	*binding = (struct dos_rank_binding){.gpu = -1, .local_size = 1};
	snprintf(binding->text, sizeof binding->text, "a simulated node of its own (SMPI): nothing to bind");
	return 0;
}

static void finalize_mpi(void)
{
	/* StarPU-MPI's shutdown finalises the MPI it initialised */
}
#else
/* MPI first (StarPU-MPI's thread level), to learn the ranks of this node and bind this
 * one before StarPU creates its workers. */
static int init_mpi_and_bind(int *argc, char ***argv, struct starpu_conf *conf, struct dos_rank_binding *binding)
{
	int provided, err;
	if (MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
		return DOS_FAIL(-EIO, "MPI_Init_thread failed");
	MPI_Comm node;
	int local_rank = 0, local_size = 1;
	if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
		MPI_Comm_rank(node, &local_rank);
		MPI_Comm_size(node, &local_size);
		MPI_Comm_free(&node);
	}
	if ((err = _dos_bind_rank(local_rank, local_size, conf, binding)))
		MPI_Finalize();
	return err;
}

static void finalize_mpi(void)
{
	MPI_Finalize(); /* ours: StarPU-MPI did not initialise it */
}
#endif

int _dos_dp_init(int *argc, char ***argv, struct starpu_conf *conf, struct dos_data_parallel *dp,
		 struct dos_rank_binding *binding)
{
	int err = init_mpi_and_bind(argc, argv, conf, binding);
	if (err)
		return err;
	err = starpu_mpi_init_conf(argc, argv, 0, MPI_COMM_WORLD, conf);
	if (err) {
		finalize_mpi();
		return DOS_STARPU_INIT_FAILED(err, "starpu_mpi_init_conf");
	}
	starpu_mpi_comm_rank(MPI_COMM_WORLD, &dp->rank);
	starpu_mpi_comm_size(MPI_COMM_WORLD, &dp->nranks);
	mpi_running = 1;
	return 0;
}

static double combine_over_ranks(double x, int largest);

void _dos_dp_shutdown(void)
{
	_dos_dp_barrier(); /* watched, unlike StarPU-MPI's: every rank is here, nothing more will come */
	mpi_running = 0;
	starpu_mpi_wait_for_all(MPI_COMM_WORLD);
	starpu_mpi_barrier(MPI_COMM_WORLD);
	starpu_mpi_shutdown();
	finalize_mpi();
}

/* A sum that every rank must reach: not starpu_mpi_barrier, which waits in MPI where
 * StarPU's watchdog does not look (see _dos_dp_recv). */
void _dos_dp_barrier(void)
{
	(void)combine_over_ranks(0, 0);
}

/* Through StarPU-MPI like every other message: MPI is initialised for one thread at a
 * time (MPI_THREAD_SERIALIZED; SMPI: MPI_THREAD_SINGLE), and StarPU-MPI's progress thread
 * is the one that talks. Rank 0 combines the values in rank order (a sum, or the largest
 * when `largest`) and sends the result back. The receives are _dos_dp_recv's, watched. */
static double combine_over_ranks(double x, int largest)
{
	if (!mpi_running)
		return x;
	int rank, size;
	starpu_mpi_comm_rank(MPI_COMM_WORLD, &rank);
	starpu_mpi_comm_size(MPI_COMM_WORLD, &size);
	double value = x;
	starpu_data_handle_t h;
	starpu_variable_data_register(&h, STARPU_MAIN_RAM, (uintptr_t)&value, sizeof value);
	if (rank == 0) { /* in rank order: the same sum on every run */
		double sum = x;
		for (int r = 1; r < size; r++) {
			_dos_dp_recv(h, r, DOS_DP_SUM, 0);
			starpu_data_acquire(h, STARPU_R);
			sum = largest ? (value > sum ? value : sum) : sum + value;
			starpu_data_release(h);
		}
		starpu_data_acquire(h, STARPU_W);
		value = sum;
		starpu_data_release(h);
		for (int r = 1; r < size; r++)
			_dos_dp_send(h, r, DOS_DP_SUM, 1);
	} else {
		_dos_dp_send(h, 0, DOS_DP_SUM, 0);
		_dos_dp_recv(h, 0, DOS_DP_SUM, 1);
	}
	starpu_data_unregister(h); /* after the transfers; brings the value home */
	return value;
}

double _dos_dp_sum(double x)
{
	return combine_over_ranks(x, 0);
}

double _dos_dp_max(double x)
{
	return combine_over_ranks(x, 1);
}

void _dos_dp_send(starpu_data_handle_t h, int to, enum dos_dp_message kind, uint64_t index)
{
	int err = starpu_mpi_isend_detached(h, to, message_tag(kind, index), MPI_COMM_WORLD, NULL, NULL);
	/* a refused transfer leaves a half-built step that cannot be undone: a bug */
	STARPU_ASSERT_MSG(err == 0, "StarPU-MPI refused a send to rank %d (%d)", to, err);
}

/* StarPU's watchdog (STARPU_WATCHDOG_TIMEOUT; dos-train's stop_hung_run) looks only while
 * tasks are submitted and none ends. A rank waiting for another's message with nothing
 * submitted, in a sum or an acquire, was not watched: with the other rank stopped
 * (SIGSTOP, a hung node), rank 0 waited in the per-step agreement on stop requests for
 * good. A task that reads what arrives, and runs nowhere, stays submitted until the
 * message is in: a wait for any message is a hang the watchdog sees. */
static struct starpu_codelet arrival_cl = {
	.where = STARPU_NOWHERE, .nbuffers = 1, .modes = {STARPU_R}, .name = "dos_dp_arrival"};

void _dos_dp_recv(starpu_data_handle_t h, int from, enum dos_dp_message kind, uint64_t index)
{
	int err = starpu_mpi_irecv_detached(h, from, message_tag(kind, index), MPI_COMM_WORLD, NULL, NULL);
	STARPU_ASSERT_MSG(err == 0, "StarPU-MPI refused a receive from rank %d (%d)", from, err);
	err = starpu_task_insert(&arrival_cl, STARPU_R, h, 0);
	STARPU_ASSERT_MSG(err == 0, "StarPU refused the task that waits for a message from rank %d (%d)", from, err);
}

#else /* a single process: nothing is ever sent */

int _dos_dp_available(void)
{
	return 0;
}

int _dos_dp_init(int *argc, char ***argv, struct starpu_conf *conf, struct dos_data_parallel *dp,
		 struct dos_rank_binding *binding)
{
	(void)argc, (void)argv, (void)conf, (void)dp, (void)binding;
	return DOS_FAIL(-ENOSYS, "this starpu-dos was built without StarPU-MPI: no data-parallel runs");
}

void _dos_dp_shutdown(void)
{
}

void _dos_dp_barrier(void)
{
}

double _dos_dp_sum(double x)
{
	return x;
}

double _dos_dp_max(double x)
{
	return x;
}

void _dos_dp_send(starpu_data_handle_t h, int to, enum dos_dp_message kind, uint64_t index)
{
	(void)h, (void)to, (void)message_tag(kind, index);
	STARPU_ABORT_MSG("_dos_dp_send in a single-process build");
}

void _dos_dp_recv(starpu_data_handle_t h, int from, enum dos_dp_message kind, uint64_t index)
{
	(void)h, (void)from, (void)message_tag(kind, index);
	STARPU_ABORT_MSG("_dos_dp_recv in a single-process build");
}

#endif
