/* Pinned host memory for the big arrays of the model and the optimizer (weights, master
 * weights, m, v). In a build against StarPU's SimGrid variant the simulated machine has
 * far more memory than this one: the arrays are then folded (many virtual pages on a few
 * real ones), and since no task body runs in simulation no value is real
 * (DOS_VALUES_ARE_REAL is 0): nothing initialises or reads them. */
#ifndef DOS_HOST_MEMORY_H
#define DOS_HOST_MEMORY_H

#include <starpu.h>

#ifdef STARPU_SIMGRID
#define DOS_HOST_MEMORY_FLAGS (STARPU_MALLOC_PINNED | STARPU_MALLOC_SIMULATION_FOLDED)
#define DOS_VALUES_ARE_REAL 0
#else
#define DOS_HOST_MEMORY_FLAGS STARPU_MALLOC_PINNED
#define DOS_VALUES_ARE_REAL 1
#endif

static inline int dos_host_alloc(void **ptr, size_t bytes)
{
	return starpu_malloc_flags(ptr, bytes, DOS_HOST_MEMORY_FLAGS);
}

static inline void dos_host_free(void *ptr, size_t bytes)
{
	if (ptr)
		starpu_free_flags(ptr, bytes, DOS_HOST_MEMORY_FLAGS);
}

#endif /* DOS_HOST_MEMORY_H */
