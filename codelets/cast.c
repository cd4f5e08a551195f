/* The fp32 -> 16-bit cast codelet: refreshes the working weights of a subgroup from its
 * master copy (round to nearest even), for subgroups updated without writing them. */
#include <errno.h>

#include "codelet_util.h"
#include "codelets.h"
#include "errors.h"
#include "kernels.h"

static void cast_cpu(void *buffers[], void *cl_arg)
{
	const enum dos_dtype *dt = cl_arg;
	_dos_cpu_kernels_selected()->cast((const float *)_dos_buffer_ptr(buffers[0]), _dos_buffer_ptr(buffers[1]), *dt,
					  _dos_buffer_count(buffers[0], sizeof(float)));
}

#ifdef DOS_USE_CUDA
static void cast_cuda(void *buffers[], void *cl_arg)
{
	const enum dos_dtype *dt = cl_arg;
	DOS_CUDA_CHECK(_dos_cast_cuda((const float *)_dos_buffer_ptr(buffers[0]), _dos_buffer_ptr(buffers[1]), *dt,
				      _dos_buffer_count(buffers[0], sizeof(float)), starpu_cuda_get_local_stream()));
}
#endif

DOS_DEFINE_CODELET(cast, cast_cpu, cast_cuda, 2, STARPU_R, STARPU_W);

int dos_cast_task_create(starpu_data_handle_t master, starpu_data_handle_t weight16, enum dos_dtype weight_dtype,
			 struct starpu_task **task_out)
{
	uint32_t n_master, n_weight;
	int err;
	if (!task_out)
		return DOS_FAIL(-EINVAL, "task_out is NULL");
	if ((err = _dos_check_dtype(__func__, "weight_dtype", weight_dtype, 1)) ||
	    (err = _dos_check_contiguous(__func__, "master", master, sizeof(float), &n_master)) ||
	    (err = _dos_check_contiguous(__func__, "weight16", weight16, 2, &n_weight)))
		return err;
	if (n_weight != n_master)
		return DOS_FAIL(-EINVAL, "weight16 has %u elements but master has %u", n_weight, n_master);
	struct starpu_task *task =
		_dos_task_with_args(__func__, &_dos_cast_codelet, &weight_dtype, sizeof weight_dtype);
	if (!task)
		return -ENOMEM;
	task->handles[0] = master;
	task->handles[1] = weight16;
	*task_out = task;
	return 0;
}
