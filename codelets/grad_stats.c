/* The gradient statistics codelet: sum of squares (for global-norm clipping) and the
 * inf/nan flag (for loss-scale overflow) of one subgroup's gradient, identical on every
 * device thanks to the fixed reduction order of numerics.h. */
#include <errno.h>

#include "codelet_util.h"
#include "codelets.h"
#include "errors.h"
#include "kernels.h"

static void grad_stats_cpu(void *buffers[], void *cl_arg)
{
	const enum dos_dtype *gt = cl_arg;
	_dos_cpu_kernels_selected()->grad_stats((const void *)_dos_buffer_ptr(buffers[0]), *gt,
						_dos_buffer_count(buffers[0], dos_dtype_size(*gt)),
						(struct dos_grad_stats *)STARPU_VARIABLE_GET_PTR(buffers[1]));
}

#ifdef DOS_USE_CUDA
static void grad_stats_cuda(void *buffers[], void *cl_arg)
{
	const enum dos_dtype *gt = cl_arg;
	DOS_CUDA_CHECK(_dos_grad_stats_cuda(
		(const void *)_dos_buffer_ptr(buffers[0]), *gt, _dos_buffer_count(buffers[0], dos_dtype_size(*gt)),
		(struct dos_grad_stats *)STARPU_VARIABLE_GET_PTR(buffers[1]), starpu_cuda_get_local_stream()));
}
#endif

DOS_DEFINE_CODELET(grad_stats, grad_stats_cpu, grad_stats_cuda, 2, STARPU_R, STARPU_W);

int dos_grad_stats_task_create(starpu_data_handle_t grad, enum dos_dtype grad_dtype, starpu_data_handle_t stats,
			       struct starpu_task **task_out)
{
	uint32_t n;
	int err;
	if (!task_out)
		return DOS_FAIL(-EINVAL, "task_out is NULL");
	if ((err = _dos_check_dtype(__func__, "grad_dtype", grad_dtype, 0)) ||
	    (err = _dos_check_contiguous(__func__, "grad", grad, dos_dtype_size(grad_dtype), &n)))
		return err;
	if (!stats)
		return DOS_FAIL(-EINVAL, "stats is NULL");
	if (starpu_data_get_interface_id(stats) != STARPU_VARIABLE_INTERFACE_ID)
		return DOS_FAIL(-EINVAL, "stats must be a variable handle, not interface id %d",
				(int)starpu_data_get_interface_id(stats));
	if (starpu_variable_get_elemsize(stats) != sizeof(struct dos_grad_stats))
		return DOS_FAIL(-EINVAL,
				"stats must be a variable handle of sizeof(struct dos_grad_stats) = %zu bytes, not %zu",
				sizeof(struct dos_grad_stats), starpu_variable_get_elemsize(stats));
	struct starpu_task *task =
		_dos_task_with_args(__func__, &_dos_grad_stats_codelet, &grad_dtype, sizeof grad_dtype);
	if (!task)
		return -ENOMEM;
	task->handles[0] = grad;
	task->handles[1] = stats;
	*task_out = task;
	return 0;
}
