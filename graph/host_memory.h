/* Host memory for the big arrays of the model, the optimizer and the corpus (weights,
 * master weights, m, v, tokens): pinned when CUDA workers exist, so that StarPU's
 * transfers to and from the GPUs are asynchronous DMA; pageable when pinning fails, said
 * once on stderr (graph/README.md); a clear -ENOMEM when there is no memory at all. In a
 * build against StarPU's SimGrid variant the simulated machine has far more memory than
 * this one: the arrays are then folded (many virtual pages on a few real ones), and so are
 * the host copies StarPU allocates itself once dos_host_alloc has run; since no task body
 * runs in simulation no value is real (DOS_VALUES_ARE_REAL is 0): nothing initialises or
 * reads them. */
#ifndef DOS_HOST_MEMORY_H
#define DOS_HOST_MEMORY_H

#include <stddef.h>

#include <starpu.h>

#ifdef STARPU_SIMGRID
#define DOS_VALUES_ARE_REAL 0
#else
#define DOS_VALUES_ARE_REAL 1
#endif

/* Allocates `bytes` (page-aligned) for `what`, which names the array in messages. Sets
 * *pinned to tell _dos_host_free how it was made. Returns 0, or -ENOMEM with a message
 * naming `what` and `bytes`, leaving *ptr untouched. Call after starpu_init. */
int _dos_host_alloc(void **ptr, size_t bytes, const char *what, int *pinned);
/* Frees what _dos_host_alloc made (nothing for NULL). Call before starpu_shutdown. */
void _dos_host_free(void *ptr, size_t bytes, int pinned);

#endif /* DOS_HOST_MEMORY_H */
