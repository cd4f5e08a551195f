/* The cores and GPU of one rank of a data-parallel job on its node (rank_binding.c). */
#ifndef DOS_RANK_BINDING_H
#define DOS_RANK_BINDING_H

#include <starpu.h>

struct dos_rank_binding {
	int local_rank, local_size; /* among the ranks of this node */
	int gpu;                    /* the first CUDA device this rank drives, -1 for none */
	int ngpus;                  /* how many it drives: gpu, gpu + 1, ... */
	int ncores;                 /* cores it is bound to */
	char text[512];             /* what was chosen, for the user */
};

/* The GPUs local rank `local_rank` of `local_size` drives among `ngpus` visible ones:
 * returns how many (0 without GPUs) and sets *first. With at least as many ranks as GPUs
 * (one rank per GPU, or several ranks sharing one), rank r drives GPU r mod ngpus; with
 * fewer (one rank per node driving all its GPUs, StarPU's convention), the GPUs are
 * shared out in contiguous blocks, the later ranks getting the larger ones. */
int _dos_rank_gpus(int local_rank, int local_size, int ngpus, int *first);

/* Chooses, for local rank `local_rank` of `local_size` on this node, its GPUs
 * (_dos_rank_gpus) and a block of the allowed cores nearest them (shared out between the
 * ranks near the same GPUs); binds the process there (its threads, hence the pages they
 * first touch: the pinned optimizer state) and sets conf's CUDA workers to those GPUs
 * unless STARPU_NCUDA or STARPU_WORKERS_CUDAID are set. DOS_BIND=none in the environment
 * leaves the launcher's binding. Call before StarPU starts. Returns 0 or a negative
 * errno (message in dos_last_error()). */
int _dos_bind_rank(int local_rank, int local_size, struct starpu_conf *conf, struct dos_rank_binding *out);

#endif /* DOS_RANK_BINDING_H */
