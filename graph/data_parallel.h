/* Data parallelism over StarPU-MPI (docs/data-parallel.md). Every rank runs forward and
 * backward of its own micro-batches; each subgroup's optimizer state (fp32 master, m, v)
 * lives on one rank only, its owner (ZeRO-1 sharding of the 12 B/param state). Per step:
 *
 *   tensor gradients  travel down a chain rank 0 -> 1 -> ... -> N-1: rank r receives the
 *                     sum of the micro-batches before its own, adds its own in order with
 *                     the same kernels a single process uses to accumulate, and passes it
 *                     on; so the sum is formed in global micro-batch order, the same bits
 *                     as one process accumulating the whole global batch;
 *   subgroup grads    the last rank gathers every subgroup and sends it to its owner;
 *   statistics        (clipping, loss scaling) each owner sends its subgroups' statistics
 *                     to every rank, which all reduce them in subgroup order;
 *   update            on the owner, placed by the scheduling policy;
 *   weights           the owner sends the updated (16-bit or fp32) weights of its
 *                     subgroups to every rank, which refreshes its tensors from them.
 *
 * All transfers are StarPU-MPI detached sends and receives on StarPU handles, ordered with
 * the tasks that use those handles like tasks reading (send) or writing (receive) them.
 * Built only when StarPU-MPI and MPI are found (DOS_HAVE_MPI); without them every
 * process is a single rank. */
#ifndef DOS_DATA_PARALLEL_H
#define DOS_DATA_PARALLEL_H

#include <starpu.h>
#include <stdint.h>

#include "rank_binding.h"

/* How a step's gradients and weights travel between the ranks (docs/data-parallel.md). */
enum dos_dp_exchange {
	/* gradients summed along the chain 0 -> 1 -> ... -> N-1 in global micro-batch order:
	 * the same bits as one process accumulating the global batch, but the last gradient
	 * reaches its owner N hops after backward; each owner sends its weights to every rank */
	DOS_DP_CHAIN = 0,
	/* scatter.h: each rank sums one chunk of every subgroup, in rank order, and passes one
	 * chunk of every owner's weights on: what follows backward does not grow with N, but
	 * the bits depend on N */
	DOS_DP_SCATTER,
};

/* This process's place in the job. {0, 0} and {0, 1} both mean a single process. */
struct dos_data_parallel {
	int rank, nranks;
	enum dos_dp_exchange exchange;
};

static inline int _dos_dp_size(const struct dos_data_parallel *dp)
{
	return dp->nranks > 1 ? dp->nranks : 1;
}

/* What a message carries; with its index (tensor, subgroup, micro-batch) it makes the tag. */
enum dos_dp_message {
	DOS_DP_TENSOR_GRAD = 1, /* index: tensor */
	DOS_DP_SUBGROUP_GRAD,   /* index: subgroup */
	DOS_DP_STATS,           /* index: subgroup */
	DOS_DP_WEIGHTS,         /* index: subgroup */
	DOS_DP_LOSS,            /* index: micro-batch of the global batch, and the step's parity */
	DOS_DP_SUM,             /* _dos_dp_sum, _dos_dp_max: 0 towards rank 0, 1 back */
	DOS_DP_EVAL_LOSS,       /* index: held-out micro-batch, and the step's parity */
	DOS_DP_GRAD_CHUNK,      /* scatter: a rank's partial gradient; index: subgroup x N + chunk */
	DOS_DP_GRAD_SUM,        /* scatter: a chunk's summed gradient, to the owner; the same index */
	DOS_DP_WEIGHT_CHUNK,    /* scatter: a chunk of the owner's updated weights; the same index */
};

/* The subgroups [*first, *end) that `rank` owns: contiguous blocks as equal as possible, so
 * that a rank's state is one range of the flat parameter space (one checkpoint shard). */
void _dos_dp_owned_subgroups(const struct dos_data_parallel *dp, int rank, uint32_t nsubgroups, uint32_t *first,
			     uint32_t *end);
int _dos_dp_owner(const struct dos_data_parallel *dp, uint32_t nsubgroups, uint32_t subgroup);
/* 1 when this library was built with StarPU-MPI. */
int _dos_dp_available(void);

/* Launched by mpirun or srun (the launcher's environment names a job of any size)? */
int _dos_dp_launched(void);

/* MPI, this rank's binding on its node (_dos_bind_rank: its GPU and the cores nearest it),
 * then starpu_mpi_init_conf; this process's rank and job size into *dp. Returns 0,
 * -ENOSYS without StarPU-MPI, or the failing step's error. */
int _dos_dp_init(int *argc, char ***argv, struct starpu_conf *conf, struct dos_data_parallel *dp,
		 struct dos_rank_binding *binding);
/* Every rank reaches it (_dos_dp_barrier), then waits for every transfer,
 * starpu_mpi_shutdown and MPI_Finalize. */
void _dos_dp_shutdown(void);
/* Every rank reaches this point before any goes on. Like every wait for another rank
 * (_dos_dp_sum, _dos_dp_max, an acquire after _dos_dp_recv), StarPU's watchdog sees it:
 * a rank that never comes ends the job on STARPU_WATCHDOG_TIMEOUT, not a hang for good. */
void _dos_dp_barrier(void);
/* Sum of x over the ranks in rank order, the same on every rank (agreements on errors,
 * reports); every rank must call it at the same point. */
double _dos_dp_sum(double x);
/* The largest x over the ranks, the same on every rank; called like _dos_dp_sum. */
double _dos_dp_max(double x);

/* Detached, ordered like a task reading (send) or writing (receive) the handle; a receive
 * keeps a task that runs nowhere submitted until its message is in (the watchdog). */
void _dos_dp_send(starpu_data_handle_t h, int to, enum dos_dp_message kind, uint64_t index);
void _dos_dp_recv(starpu_data_handle_t h, int from, enum dos_dp_message kind, uint64_t index);

#endif /* DOS_DATA_PARALLEL_H */
