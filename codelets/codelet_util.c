/* Argument checks and task construction shared by every codelet's task creator. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "codelet_util.h"
#include "errors.h"

/* The layout of one copy of a handle: element size, count, and whether any padding
 * separates its rows, planes or cubes. -1 for an interface that is not one of ours. */
static int layout_of(void *iface, size_t *elemsize, uint64_t *count, int *padded)
{
	*padded = 0;
	switch (*(enum starpu_data_interface_id *)iface) {
	case STARPU_VECTOR_INTERFACE_ID:
		*elemsize = STARPU_VECTOR_GET_ELEMSIZE(iface);
		*count = STARPU_VECTOR_GET_NX(iface);
		return 0;
	case STARPU_VARIABLE_INTERFACE_ID: /* its "element" is the whole variable */
		*elemsize = STARPU_VARIABLE_GET_ELEMSIZE(iface);
		*count = 1;
		return 0;
	case STARPU_MATRIX_INTERFACE_ID: {
		uint64_t nx = STARPU_MATRIX_GET_NX(iface), ny = STARPU_MATRIX_GET_NY(iface);
		*elemsize = STARPU_MATRIX_GET_ELEMSIZE(iface);
		*count = nx * ny;
		*padded = ny > 1 && STARPU_MATRIX_GET_LD(iface) != nx;
		return 0;
	}
	case STARPU_BLOCK_INTERFACE_ID: {
		uint64_t nx = STARPU_BLOCK_GET_NX(iface), ny = STARPU_BLOCK_GET_NY(iface),
			 nz = STARPU_BLOCK_GET_NZ(iface);
		*elemsize = STARPU_BLOCK_GET_ELEMSIZE(iface);
		*count = nx * ny * nz;
		*padded = (ny > 1 && STARPU_BLOCK_GET_LDY(iface) != nx) ||
			  (nz > 1 && STARPU_BLOCK_GET_LDZ(iface) != nx * ny);
		return 0;
	}
	case STARPU_TENSOR_INTERFACE_ID: {
		uint64_t nx = STARPU_TENSOR_GET_NX(iface), ny = STARPU_TENSOR_GET_NY(iface),
			 nz = STARPU_TENSOR_GET_NZ(iface), nt = STARPU_TENSOR_GET_NT(iface);
		*elemsize = STARPU_TENSOR_GET_ELEMSIZE(iface);
		*count = nx * ny * nz * nt;
		*padded = (ny > 1 && STARPU_TENSOR_GET_LDY(iface) != nx) ||
			  (nz > 1 && STARPU_TENSOR_GET_LDZ(iface) != nx * ny) ||
			  (nt > 1 && STARPU_TENSOR_GET_LDT(iface) != nx * ny * nz);
		return 0;
	}
	default:
		return -1;
	}
}

static const char *interface_name(enum starpu_data_interface_id id)
{
	switch (id) {
	case STARPU_VECTOR_INTERFACE_ID:
		return "vector";
	case STARPU_VARIABLE_INTERFACE_ID:
		return "variable";
	case STARPU_MATRIX_INTERFACE_ID:
		return "matrix";
	case STARPU_BLOCK_INTERFACE_ID:
		return "block";
	case STARPU_TENSOR_INTERFACE_ID:
		return "tensor";
	default:
		return "unsupported";
	}
}

int _dos_check_contiguous(const char *function, const char *name, starpu_data_handle_t h, size_t elemsize,
			  uint32_t *count)
{
	if (!h)
		return _dos_fail(-EINVAL, function, "%s is NULL", name);
	/* StarPU asserts on a task or an acquire on the whole of a partitioned handle */
	int pieces = starpu_data_get_nb_children(h);
	if (pieces > 0)
		return _dos_fail(-EINVAL, function,
				 "%s is partitioned into %d pieces (starpu_data_partition): a task may use the pieces, "
				 "not the whole; unpartition it first, or give the pieces",
				 name, pieces);
	enum starpu_data_interface_id id = starpu_data_get_interface_id(h);
	/* the home copy is the application's layout; a handle with no home gets packed
	 * copies only, wherever StarPU allocates them */
	int home = starpu_data_get_home_node(h);
	void *iface = starpu_data_get_interface_on_node(h, home >= 0 ? (unsigned)home : STARPU_MAIN_RAM);
	size_t got;
	uint64_t n;
	int padded;
	if (layout_of(iface, &got, &n, &padded))
		return _dos_fail(-EINVAL, function,
				 "%s has interface id %d: expected a vector, variable, matrix, block or tensor handle",
				 name, (int)id);
	if (padded)
		return _dos_fail(-EINVAL, function,
				 "%s is a %s handle with padding between its rows (leading dimensions larger than "
				 "the sizes): its elements are not contiguous",
				 name, interface_name(id));
	if (id == STARPU_VARIABLE_INTERFACE_ID) {
		if (got % elemsize)
			return _dos_fail(-EINVAL, function,
					 "%s is a variable of %zu bytes, not a whole number of %zu-byte elements", name,
					 got, elemsize);
		n = got / elemsize;
	} else if (got != elemsize)
		return _dos_fail(-EINVAL, function, "%s is a %s of %zu-byte elements, expected %zu%s", name,
				 interface_name(id), got, elemsize,
				 got == 8 ? " (fp64 is not supported: fp32, fp16 or bf16)" : "");
	if (n == 0 || n > UINT32_MAX)
		return _dos_fail(-EINVAL, function, "%s holds %llu elements, expected 1 to 2^32 - 1", name,
				 (unsigned long long)n);
	*count = (uint32_t)n;
	return 0;
}

uint32_t _dos_handle_count(starpu_data_handle_t h, size_t elemsize)
{
	return (uint32_t)(starpu_data_get_size(h) / elemsize);
}

void *_dos_buffer_ptr(void *iface)
{
	switch (*(enum starpu_data_interface_id *)iface) {
	case STARPU_VECTOR_INTERFACE_ID:
		return (void *)STARPU_VECTOR_GET_PTR(iface);
	case STARPU_VARIABLE_INTERFACE_ID:
		return (void *)STARPU_VARIABLE_GET_PTR(iface);
	case STARPU_MATRIX_INTERFACE_ID:
		return (void *)STARPU_MATRIX_GET_PTR(iface);
	case STARPU_BLOCK_INTERFACE_ID:
		return (void *)STARPU_BLOCK_GET_PTR(iface);
	case STARPU_TENSOR_INTERFACE_ID:
		return (void *)STARPU_TENSOR_GET_PTR(iface);
	default:
		STARPU_ABORT_MSG("a starpu-dos codelet got a buffer of interface id %d",
				 (int)*(enum starpu_data_interface_id *)iface);
		return NULL;
	}
}

uint32_t _dos_buffer_count(void *iface, size_t elemsize)
{
	size_t size;
	uint64_t n;
	int padded;
	int bad = layout_of(iface, &size, &n, &padded);
	STARPU_ASSERT_MSG(!bad && !padded, "a starpu-dos codelet got a padded or unknown buffer");
	return (uint32_t)(n * size / elemsize);
}

int _dos_check_dtype(const char *function, const char *name, enum dos_dtype dtype, int sixteen_bit_only)
{
	if (dos_dtype_size(dtype) == 0)
		return _dos_fail(-EINVAL, function, "%s = %d is not an enum dos_dtype value", name, (int)dtype);
	if (sixteen_bit_only && dtype == DOS_FP32)
		return _dos_fail(-EINVAL, function, "%s = fp32, expected fp16 or bf16", name);
	return 0;
}

int _dos_check_distinct(const char *function, starpu_data_handle_t *handles, const char *const *names, int n)
{
	for (int i = 0; i < n; i++)
		for (int j = i + 1; j < n; j++)
			if (handles[i] && handles[i] == handles[j])
				return _dos_fail(-EINVAL, function, "%s and %s are the same handle", names[i],
						 names[j]);
	return 0;
}

int _dos_check_sched_ctx(const char *function, const char *name, unsigned sched_ctx)
{
	if (!starpu_is_initialized())
		return _dos_fail(-EINVAL, function,
				 "StarPU is not initialised (call between starpu_init and starpu_shutdown)");
	/* a context that was never created, or was deleted, has no worker collection */
	if (sched_ctx >= STARPU_NMAX_SCHED_CTXS || !starpu_sched_ctx_get_worker_collection(sched_ctx))
		return _dos_fail(-EINVAL, function, "%s = %u is not a scheduling context of this StarPU", name,
				 sched_ctx);
	return 0;
}

struct starpu_task *_dos_task_with_args(const char *function, struct starpu_codelet *cl, const void *args, size_t size)
{
	void *copy = malloc(size);
	if (!copy) {
		_dos_fail(-ENOMEM, function, "out of memory for %zu bytes of task arguments", size);
		return NULL;
	}
	memcpy(copy, args, size);
	struct starpu_task *task = starpu_task_create();
	task->cl = cl;
	task->cl_arg = copy;
	task->cl_arg_size = size;
	task->cl_arg_free = 1;
	return task;
}

#if !defined(DOS_USE_CUDA) && defined(STARPU_SIMGRID)
void _dos_simulated_cuda(void *buffers[], void *cl_arg)
{
	(void)buffers;
	(void)cl_arg;
	/* SimGrid never runs codelet bodies unless STARPU_CODELET_SIMGRID_EXECUTE is set */
	STARPU_ABORT_MSG("a simulated CUDA implementation was called outside SimGrid");
}
#endif
