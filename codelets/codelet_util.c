/* Argument checks and task construction shared by every codelet's task creator. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "codelet_util.h"
#include "errors.h"

int _dos_check_vector(const char *function, const char *name, starpu_data_handle_t h, size_t elemsize, uint32_t *nx)
{
	if (!h)
		return _dos_fail(-EINVAL, function, "%s is NULL", name);
	if (starpu_data_get_interface_id(h) != STARPU_VECTOR_INTERFACE_ID)
		return _dos_fail(-EINVAL, function, "%s is not a vector handle (interface id %d)", name,
				 (int)starpu_data_get_interface_id(h));
	size_t got = starpu_vector_get_elemsize(h);
	if (got != elemsize)
		return _dos_fail(-EINVAL, function, "%s has %zu-byte elements, expected %zu", name, got, elemsize);
	*nx = starpu_vector_get_nx(h);
	return 0;
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
