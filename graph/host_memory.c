/* The big host arrays (host_memory.h). Pinning is done here rather than by
 * starpu_malloc_flags(STARPU_MALLOC_PINNED): when cudaHostAlloc fails there, StarPU
 * reports the CUDA error and aborts the process, so a machine short of pinnable memory
 * could not train at all. Here the memory is allocated pageable first and then pinned
 * with starpu_memory_pin (cudaHostRegister), whose failure is an answer, not an abort. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "errors.h"
#include "host_memory.h"

#ifdef STARPU_SIMGRID
/* simulated pinning costs time in the simulation; folding keeps real memory small */
#define SIMULATED_FLAGS (STARPU_MALLOC_PINNED | STARPU_MALLOC_SIMULATION_FOLDED)

int _dos_host_alloc(void **ptr, size_t bytes, const char *what, int *pinned)
{
	/* StarPU's own host copies too (handles registered without a home: the gradients
	 * a rank sends, data written back from the GPU): real memory for a 7B model's
	 * gradients otherwise, per simulated rank. Not counted either: the machines' host
	 * memory is not modelled, and StarPU would take this host's as every simulated
	 * rank's, then wait forever for room when a job's ranks outgrow it */
	starpu_malloc_on_node_set_default_flags(STARPU_MAIN_RAM, SIMULATED_FLAGS);
	void *p = NULL;
	if (starpu_malloc_flags(&p, bytes, SIMULATED_FLAGS) != 0 || !p)
		return DOS_FAIL(-ENOMEM, "no host memory for %s: %zu bytes (%.2f GiB)", what, bytes,
				(double)bytes / (1 << 30));
	*pinned = 1;
	*ptr = p;
	return 0;
}

void _dos_host_free(void *ptr, size_t bytes, int pinned)
{
	(void)pinned;
	if (ptr)
		starpu_free_flags(ptr, bytes, SIMULATED_FLAGS);
}
#else
static atomic_int pageable_said;

int _dos_host_alloc(void **ptr, size_t bytes, const char *what, int *pinned)
{
	void *p = NULL;
	long page = sysconf(_SC_PAGESIZE);
	if (posix_memalign(&p, page > 0 ? (size_t)page : 4096, bytes ? bytes : 1) != 0)
		return DOS_FAIL(-ENOMEM, "no host memory for %s: %zu bytes (%.2f GiB)", what, bytes,
				(double)bytes / (1 << 30));
	*pinned = 0;
	/* pinned memory only pays for transfers to GPUs, and is scarce: no GPU, no pinning */
	if (starpu_cuda_worker_get_count() > 0) {
		if (starpu_memory_pin(p, bytes) == 0)
			*pinned = 1;
		else if (atomic_exchange(&pageable_said, 1) == 0)
			/* a notice, not an error: training goes on, only its transfers are slower,
			 * so it is printed whatever DOS_QUIET says */
			fprintf(stderr,
				"starpu-dos: notice: could not pin %.2f GiB of host memory for %s; using pageable "
				"memory there (and wherever else pinning fails): its transfers to and from the "
				"GPUs are slower and do not overlap computation\n",
				(double)bytes / (1 << 30), what);
	}
	*ptr = p;
	return 0;
}

void _dos_host_free(void *ptr, size_t bytes, int pinned)
{
	if (!ptr)
		return;
	if (pinned)
		starpu_memory_unpin(ptr, bytes);
	free(ptr);
}
#endif
