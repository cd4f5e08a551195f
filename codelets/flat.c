/* The flat-copy codelet (gradient gather and weight refresh between tensors and
 * subgroups, see flat_kernels.h) and the CPU-only batch codelet of the data loader. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "codelet_util.h"
#include "flat.h"
#include "numerics.h"

void _dos_flat_copy_cpu(void *const *destinations, const void *const *sources, const struct dos_flat_copy_args *args)
{
	size_t dst_size = dos_dtype_size(args->destination_dtype), src_size = dos_dtype_size(args->source_dtype);
	for (uint32_t k = 0; k < args->npieces; k++) {
		const struct dos_flat_piece *p = &args->pieces[k];
		char *dst = (char *)destinations[p->destination] + p->destination_offset * dst_size;
		const char *src = (const char *)sources[p->source] + p->source_offset * src_size;
		if (args->source_dtype == args->destination_dtype) {
			memcpy(dst, src, p->len * dst_size);
			continue;
		}
		for (uint64_t i = 0; i < p->len; i++)
			dos_store_elem(dst, i, args->destination_dtype, dos_load_elem(src, i, args->source_dtype));
	}
}

void _dos_grad_sum_cpu(void *out, enum dos_dtype out_dtype, const void *const *partials, uint32_t npartials,
		       enum dos_dtype partial_dtype, uint64_t len)
{
	/* a block of sums stays in cache while every partial is added to it */
	enum { BLOCK = 2048 };
	float acc[BLOCK];
	for (uint64_t begin = 0; begin < len; begin += BLOCK) {
		uint64_t n = len - begin < BLOCK ? len - begin : BLOCK;
		for (uint64_t i = 0; i < n; i++)
			acc[i] = dos_load_elem(partials[0], begin + i, partial_dtype);
		for (uint32_t r = 1; r < npartials; r++)
			for (uint64_t i = 0; i < n; i++)
				acc[i] = acc[i] + dos_load_elem(partials[r], begin + i, partial_dtype);
		for (uint64_t i = 0; i < n; i++)
			dos_store_elem(out, begin + i, out_dtype, acc[i]);
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

/* The pointers of the task's buffers (vectors), for either device; to free. */
static void **buffer_pointers(void *buffers[])
{
	unsigned n = (unsigned)STARPU_TASK_GET_NBUFFERS(starpu_task_get_current());
	void **pointers = calloc(n ? n : 1, sizeof *pointers);
	if (!pointers)
		STARPU_ABORT_MSG("out of memory for %u buffer pointers", n);
	for (unsigned b = 0; b < n; b++)
		pointers[b] = _dos_buffer_ptr(buffers[b]);
	return pointers;
}

/* The destinations come first among the buffers, then the sources. */
static void flat_copy_cpu(void *buffers[], void *cl_arg)
{
	const struct dos_flat_copy_args *args = cl_arg;
	void **pointers = buffer_pointers(buffers);
	_dos_flat_copy_cpu(pointers, (const void *const *)(pointers + args->ndestinations), args);
	free(pointers);
}

#ifdef DOS_USE_CUDA
static void flat_copy_cuda(void *buffers[], void *cl_arg)
{
	const struct dos_flat_copy_args *args = cl_arg;
	void **pointers = buffer_pointers(buffers);
	DOS_CUDA_CHECK(_dos_flat_copy_cuda(pointers, (const void *const *)(pointers + args->ndestinations), args,
					   starpu_cuda_get_local_stream()));
	free(pointers);
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
 * pieces than that, or a sum of more partials, would read past the codelet (a crash with
 * tens of thousands of subgroups of one tensor). So the codelet gets dyn_nodes as long as
 * its longest task (*covered of them so far); they only grow, and older arrays are never
 * freed, as a task being submitted elsewhere may be reading one. */
static void cover_buffers(struct starpu_codelet *cl, int *covered, int nbuffers)
{
	static starpu_pthread_mutex_t lock = STARPU_PTHREAD_MUTEX_INITIALIZER;
	STARPU_PTHREAD_MUTEX_LOCK(&lock);
	if (nbuffers > *covered) {
		int n = nbuffers > 2 * *covered ? nbuffers : 2 * *covered;
		int *nodes = malloc((size_t)n * sizeof *nodes);
		STARPU_ASSERT_MSG(nodes, "out of memory for the target nodes of %d buffers", n);
		for (int i = 0; i < n; i++)
			nodes[i] = STARPU_SPECIFIC_NODE_LOCAL;
		__atomic_store_n(&cl->dyn_nodes, nodes, __ATOMIC_RELEASE);
		*covered = n;
	}
	STARPU_PTHREAD_MUTEX_UNLOCK(&lock);
}

/* A task of `cl` (whose dyn_nodes cover *covered buffers: cover_buffers) on `nw` handles
 * written, then `nr` read (any number: dynamic handles beyond StarPU's static ones), in
 * context `sched_ctx`, with cl_arg `args` (freed with the task). Returns NULL (args freed)
 * when memory runs out. */
static struct starpu_task *task_on_handles(struct starpu_codelet *cl, int *covered, const starpu_data_handle_t *written,
					   uint32_t nw, const starpu_data_handle_t *read, uint32_t nr,
					   unsigned sched_ctx, void *args, size_t args_size)
{
	struct starpu_task *task = starpu_task_create();
	if (!task) {
		free(args);
		return NULL;
	}
	task->cl = cl;
	task->cl_arg = args;
	task->cl_arg_size = args_size;
	task->cl_arg_free = 1;
	task->sched_ctx = sched_ctx;
	task->nbuffers = (int)(nw + nr);
	cover_buffers(cl, covered, task->nbuffers);
	if (task->nbuffers > STARPU_NMAXBUFS) {
		task->dyn_handles = malloc(task->nbuffers * sizeof *task->dyn_handles);
		task->dyn_modes = malloc(task->nbuffers * sizeof *task->dyn_modes);
		if (!task->dyn_handles || !task->dyn_modes) {
			starpu_task_destroy(task);
			return NULL;
		}
	}
	for (uint32_t b = 0; b < nw + nr; b++) {
		enum starpu_data_access_mode mode = b < nw ? STARPU_W : STARPU_R;
		STARPU_TASK_SET_HANDLE(task, b < nw ? written[b] : read[b - nw], b);
		STARPU_TASK_SET_MODE(task, mode, b);
	}
	return task;
}

int _dos_flat_copy_task_create(const starpu_data_handle_t *destinations, uint32_t ndestinations,
			       enum dos_dtype destination_dtype, const starpu_data_handle_t *sources,
			       enum dos_dtype source_dtype, uint32_t nsources, const struct dos_flat_piece *pieces,
			       uint32_t npieces, unsigned sched_ctx, struct starpu_task **task_out)
{
	size_t size = sizeof(struct dos_flat_copy_args) + npieces * sizeof(struct dos_flat_piece);
	struct dos_flat_copy_args *args = malloc(size);
	if (!args)
		return -ENOMEM;
	args->source_dtype = source_dtype;
	args->destination_dtype = destination_dtype;
	args->npieces = npieces;
	args->ndestinations = ndestinations;
	memcpy(args->pieces, pieces, npieces * sizeof *pieces);
	static int covered = STARPU_NMAXBUFS;
	*task_out = task_on_handles(&_dos_flat_copy_codelet, &covered, destinations, ndestinations, sources, nsources,
				    sched_ctx, args, size);
	return *task_out ? 0 : -ENOMEM;
}

/* buffers[0] is the sum, the others the partials in rank order. */
static void grad_sum_cpu(void *buffers[], void *cl_arg)
{
	const enum dos_dtype *dtypes = cl_arg; /* the sum's, the partials' */
	void **pointers = buffer_pointers(buffers);
	unsigned n = (unsigned)STARPU_TASK_GET_NBUFFERS(starpu_task_get_current());
	_dos_grad_sum_cpu(pointers[0], dtypes[0], (const void *const *)(pointers + 1), n - 1, dtypes[1],
			  STARPU_VECTOR_GET_NX(buffers[0]));
	free(pointers);
}

/* CPU only: the partials arrive from the network in host memory, where one pass over them
 * costs what moving them to a GPU would. */
static struct starpu_perfmodel grad_sum_model = {.type = STARPU_NL_REGRESSION_BASED, .symbol = "dos_grad_sum"};
struct starpu_codelet _dos_grad_sum_codelet = {
	.name = "dos_grad_sum",
	.cpu_funcs = {grad_sum_cpu},
	.cpu_funcs_name = {"grad_sum_cpu"},
	.nbuffers = STARPU_VARIABLE_NBUFFERS,
	.model = &grad_sum_model,
};

int _dos_grad_sum_task_create(starpu_data_handle_t sum, enum dos_dtype sum_dtype, const starpu_data_handle_t *partials,
			      uint32_t npartials, enum dos_dtype partial_dtype, unsigned sched_ctx,
			      struct starpu_task **task_out)
{
	enum dos_dtype *dtypes = malloc(2 * sizeof *dtypes);
	if (!dtypes)
		return -ENOMEM;
	dtypes[0] = sum_dtype;
	dtypes[1] = partial_dtype;
	static int covered = STARPU_NMAXBUFS;
	*task_out = task_on_handles(&_dos_grad_sum_codelet, &covered, &sum, 1, partials, npartials, sched_ctx, dtypes,
				    2 * sizeof *dtypes);
	return *task_out ? 0 : -ENOMEM;
}
