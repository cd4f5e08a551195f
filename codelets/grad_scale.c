/* The gradient scale/zero codelet: multiplies a gradient in its own dtype (unscaling,
 * averaging accumulated micro-batches) or clears it with factor 0. */
#include <errno.h>
#include <math.h>

#include "codelet_util.h"
#include "codelets.h"
#include "errors.h"
#include "kernels.h"

struct grad_scale_args {
	enum dos_dtype grad_dtype;
	float factor;
};

static void grad_scale_cpu(void *buffers[], void *cl_arg)
{
	const struct grad_scale_args *a = cl_arg;
	_dos_cpu_kernels_selected()->grad_scale(_dos_buffer_ptr(buffers[0]), a->grad_dtype,
						_dos_buffer_count(buffers[0], dos_dtype_size(a->grad_dtype)),
						a->factor);
}

#ifdef DOS_USE_CUDA
static void grad_scale_cuda(void *buffers[], void *cl_arg)
{
	const struct grad_scale_args *a = cl_arg;
	DOS_CUDA_CHECK(_dos_grad_scale_cuda(_dos_buffer_ptr(buffers[0]), a->grad_dtype,
					    _dos_buffer_count(buffers[0], dos_dtype_size(a->grad_dtype)), a->factor,
					    starpu_cuda_get_local_stream()));
}
#endif

DOS_DEFINE_CODELET(grad_scale, grad_scale_cpu, grad_scale_cuda, 1, STARPU_RW);

int dos_grad_scale_task_create(starpu_data_handle_t grad, enum dos_dtype grad_dtype, float factor,
			       struct starpu_task **task_out)
{
	uint32_t n;
	int err;
	if (!task_out)
		return DOS_FAIL(-EINVAL, "task_out is NULL");
	if (!isfinite(factor))
		return DOS_FAIL(-EINVAL, "factor = %g must be finite", (double)factor);
	if ((err = _dos_check_dtype(__func__, "grad_dtype", grad_dtype, 0)) ||
	    (err = _dos_check_contiguous(__func__, "grad", grad, dos_dtype_size(grad_dtype), &n)))
		return err;
	struct grad_scale_args args = {.grad_dtype = grad_dtype, .factor = factor};
	struct starpu_task *task = _dos_task_with_args(__func__, &_dos_grad_scale_codelet, &args, sizeof args);
	if (!task)
		return -ENOMEM;
	task->handles[0] = grad;
	*task_out = task;
	return 0;
}
