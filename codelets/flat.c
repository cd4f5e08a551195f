/* The flat-copy codelet (gradient gather and weight refresh between tensors and
 * subgroups, see flat_kernels.h) and the CPU-only batch codelet of the data loader. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "codelet_util.h"
#include "flat.h"
#include "numerics.h"

void _dos_flat_copy_cpu(void *destination, const void *const *sources, const struct dos_flat_copy_args *args)
{
	size_t dst_size = dos_dtype_size(args->destination_dtype), src_size = dos_dtype_size(args->source_dtype);
	for (uint32_t k = 0; k < args->npieces; k++) {
		const struct dos_flat_piece *p = &args->pieces[k];
		char *dst = (char *)destination + p->destination_offset * dst_size;
		const char *src = (const char *)sources[p->source] + p->source_offset * src_size;
		if (args->source_dtype == args->destination_dtype) {
			memcpy(dst, src, p->len * dst_size);
			continue;
		}
		for (uint64_t i = 0; i < p->len; i++)
			dos_store_elem(dst, i, args->destination_dtype, dos_load_elem(src, i, args->source_dtype));
	}
}

void _dos_batch_cpu(const uint8_t *corpus, const uint64_t *starts, uint32_t nseq, uint32_t len, int32_t *ids,
		    int32_t *targets)
{
	for (uint32_t s = 0; s < nseq; s++)
		for (uint32_t t = 0; t < len; t++) {
			ids[(size_t)s * len + t] = corpus[starts[s] + t];
			targets[(size_t)s * len + t] = corpus[starts[s] + t + 1];
		}
}

/* buffers[0] is the destination, the others the sources, in piece order. Returns the
 * sources' pointers (to free), for either device. */
static const void **source_pointers(void *buffers[])
{
	unsigned nsources = (unsigned)STARPU_TASK_GET_NBUFFERS(starpu_task_get_current()) - 1;
	const void **sources = calloc(nsources ? nsources : 1, sizeof *sources);
	if (!sources)
		STARPU_ABORT_MSG("out of memory for %u source pointers", nsources);
	for (unsigned s = 0; s < nsources; s++)
		sources[s] = _dos_buffer_ptr(buffers[s + 1]);
	return sources;
}

static void flat_copy_cpu(void *buffers[], void *cl_arg)
{
	const void **sources = source_pointers(buffers);
	_dos_flat_copy_cpu(_dos_buffer_ptr(buffers[0]), sources, cl_arg);
	free(sources);
}

#ifdef DOS_USE_CUDA
static void flat_copy_cuda(void *buffers[], void *cl_arg)
{
	const void **sources = source_pointers(buffers);
	DOS_CUDA_CHECK(
		_dos_flat_copy_cuda(_dos_buffer_ptr(buffers[0]), sources, cl_arg, starpu_cuda_get_local_stream()));
	free(sources);
}
#endif

DOS_DEFINE_CODELET(flat_copy, flat_copy_cpu, flat_copy_cuda, STARPU_VARIABLE_NBUFFERS);

static void batch_cpu(void *buffers[], void *cl_arg)
{
	const uint64_t *starts = cl_arg;
	uint32_t nseq = (uint32_t)(starpu_task_get_current()->cl_arg_size / sizeof *starts);
	uint32_t len = STARPU_VECTOR_GET_NX(buffers[1]) / nseq;
	_dos_batch_cpu((const uint8_t *)STARPU_VECTOR_GET_PTR(buffers[0]), starts, nseq, len,
		       (int32_t *)STARPU_VECTOR_GET_PTR(buffers[1]), (int32_t *)STARPU_VECTOR_GET_PTR(buffers[2]));
}

static struct starpu_perfmodel batch_model = {.type = STARPU_NL_REGRESSION_BASED, .symbol = "dos_batch"};
struct starpu_codelet _dos_batch_codelet = {
	.name = "dos_batch",
	.cpu_funcs = {batch_cpu},
	.cpu_funcs_name = {"batch_cpu"},
	.nbuffers = 3,
	.modes = {STARPU_R, STARPU_W, STARPU_W},
	.model = &batch_model,
};

/* StarPU reads the target node of each buffer of a task from its codelet
 * (STARPU_CODELET_GET_NODE: dyn_nodes when set, else the STARPU_NMAXBUFS nodes of the
 * codelet itself), for every buffer, specific nodes or not: a gather or refresh of more
 * pieces than that would read past the codelet (a crash with tens of thousands of
 * subgroups of one tensor). So the codelet gets dyn_nodes as long as the longest task;
 * they only grow, and older arrays are never freed, as a task being submitted elsewhere
 * may be reading one. */
static void cover_buffers(int nbuffers)
{
	static starpu_pthread_mutex_t lock = STARPU_PTHREAD_MUTEX_INITIALIZER;
	static int covered = STARPU_NMAXBUFS;
	STARPU_PTHREAD_MUTEX_LOCK(&lock);
	if (nbuffers > covered) {
		int n = nbuffers > 2 * covered ? nbuffers : 2 * covered;
		int *nodes = malloc((size_t)n * sizeof *nodes);
		STARPU_ASSERT_MSG(nodes, "out of memory for the target nodes of %d buffers", n);
		for (int i = 0; i < n; i++)
			nodes[i] = STARPU_SPECIFIC_NODE_LOCAL;
		__atomic_store_n(&_dos_flat_copy_codelet.dyn_nodes, nodes, __ATOMIC_RELEASE);
		covered = n;
	}
	STARPU_PTHREAD_MUTEX_UNLOCK(&lock);
}

int _dos_flat_copy_task_create(starpu_data_handle_t destination, enum dos_dtype destination_dtype,
			       const starpu_data_handle_t *sources, enum dos_dtype source_dtype, uint32_t nsources,
			       const struct dos_flat_piece *pieces, uint32_t npieces, unsigned sched_ctx,
			       struct starpu_task **task_out)
{
	size_t size = sizeof(struct dos_flat_copy_args) + npieces * sizeof(struct dos_flat_piece);
	struct dos_flat_copy_args *args = malloc(size);
	struct starpu_task *task = starpu_task_create();
	if (!args || !task) {
		free(args);
		if (task)
			starpu_task_destroy(task);
		return -ENOMEM;
	}
	args->source_dtype = source_dtype;
	args->destination_dtype = destination_dtype;
	args->npieces = npieces;
	args->pad_ = 0;
	memcpy(args->pieces, pieces, npieces * sizeof *pieces);
	task->cl = &_dos_flat_copy_codelet;
	task->cl_arg = args;
	task->cl_arg_size = size;
	task->cl_arg_free = 1;
	task->sched_ctx = sched_ctx;
	task->nbuffers = (int)nsources + 1;
	cover_buffers(task->nbuffers);
	if (task->nbuffers > STARPU_NMAXBUFS) {
		task->dyn_handles = malloc(task->nbuffers * sizeof *task->dyn_handles);
		task->dyn_modes = malloc(task->nbuffers * sizeof *task->dyn_modes);
		if (!task->dyn_handles || !task->dyn_modes) {
			starpu_task_destroy(task);
			return -ENOMEM;
		}
	}
	STARPU_TASK_SET_HANDLE(task, destination, 0);
	STARPU_TASK_SET_MODE(task, STARPU_W, 0);
	for (uint32_t s = 0; s < nsources; s++) {
		STARPU_TASK_SET_HANDLE(task, sources[s], s + 1);
		STARPU_TASK_SET_MODE(task, STARPU_R, s + 1);
	}
	*task_out = task;
	return 0;
}
