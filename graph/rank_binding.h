/* The cores and GPU of one rank of a data-parallel job on its node (rank_binding.c). */
#ifndef DOS_RANK_BINDING_H
#define DOS_RANK_BINDING_H

#include <starpu.h>

struct dos_rank_binding {
	int local_rank, local_size; /* among the ranks of this node */
	int gpu;                    /* the CUDA device this rank drives, -1 for none */
	int ncores;                 /* cores it is bound to */
	char text[512];             /* what was chosen, for the user */
};

/* Chooses, for local rank `local_rank` of `local_size` on this node, the GPU local_rank
 * modulo the visible GPUs and a block of the allowed cores nearest that GPU (shared out
 * between the ranks near the same GPU); binds the process there (its threads, hence the
 * pages they first touch: the pinned optimizer state) and sets conf's CUDA worker to that
 * GPU unless STARPU_NCUDA or STARPU_WORKERS_CUDAID are set. DOS_BIND=none in the
 * environment leaves the launcher's binding. Call before StarPU starts. Returns 0 or a
 * negative errno (message in dos_last_error()). */
int _dos_bind_rank(int local_rank, int local_size, struct starpu_conf *conf, struct dos_rank_binding *out);

#endif /* DOS_RANK_BINDING_H */
