/* The Adam/AdamW subgroup update codelet: its CPU and CUDA implementations, perfmodel and
 * task creator. Buffers (enum _dos_adam_buffer): master, m, v (fp32, RW), grad (R),
 * optionally the 16-bit working weights (W), and optionally a uint32_t flag (W) receiving
 * the non-finite bits of what the update wrote; so the codelet has a variable number of
 * buffers (4 to 6). */
#include <errno.h>
#include <math.h>

#include "codelet_util.h"
#include "codelets.h"
#include "errors.h"
#include "kernels.h"

/* the buffers of the fullest update task live in the task itself */
_Static_assert(STARPU_NMAXBUFS >= 6, "dos_adam tasks need 6 buffers");

struct adam_args {
	struct dos_adam_step step;
	enum dos_dtype grad_dtype;
	enum dos_dtype weight_dtype;
	uint32_t has_weight16; /* buffer DOS_ADAM_BUF_WEIGHT16 */
	uint32_t has_flag;     /* the buffer after the step data (dos_adam_task_report_nonfinite) */
};

/* Where a task with these arguments has its flag: right after its step data. */
static int flag_buffer(const struct adam_args *a)
{
	return DOS_ADAM_BUF_WEIGHT16 + (int)a->has_weight16;
}

static void adam_cpu(void *buffers[], void *cl_arg)
{
	const struct adam_args *a = cl_arg;
	uint32_t nonfinite = _dos_cpu_kernels_selected()->adam(
		&a->step, (float *)_dos_buffer_ptr(buffers[DOS_ADAM_BUF_MASTER]),
		(float *)_dos_buffer_ptr(buffers[DOS_ADAM_BUF_M]), (float *)_dos_buffer_ptr(buffers[DOS_ADAM_BUF_V]),
		(const void *)_dos_buffer_ptr(buffers[DOS_ADAM_BUF_GRAD]), a->grad_dtype,
		a->has_weight16 ? (void *)_dos_buffer_ptr(buffers[DOS_ADAM_BUF_WEIGHT16]) : NULL, a->weight_dtype,
		_dos_buffer_count(buffers[DOS_ADAM_BUF_MASTER], sizeof(float)));
	if (a->has_flag)
		*(uint32_t *)STARPU_VARIABLE_GET_PTR(buffers[flag_buffer(a)]) = nonfinite;
}

#ifdef DOS_USE_CUDA
static void adam_cuda(void *buffers[], void *cl_arg)
{
	const struct adam_args *a = cl_arg;
	DOS_CUDA_CHECK(_dos_adam_cuda(&a->step, (float *)_dos_buffer_ptr(buffers[DOS_ADAM_BUF_MASTER]),
				      (float *)_dos_buffer_ptr(buffers[DOS_ADAM_BUF_M]),
				      (float *)_dos_buffer_ptr(buffers[DOS_ADAM_BUF_V]),
				      (const void *)_dos_buffer_ptr(buffers[DOS_ADAM_BUF_GRAD]), a->grad_dtype,
				      a->has_weight16 ? (void *)_dos_buffer_ptr(buffers[DOS_ADAM_BUF_WEIGHT16]) : NULL,
				      a->weight_dtype, _dos_buffer_count(buffers[DOS_ADAM_BUF_MASTER], sizeof(float)),
				      a->has_flag ? (uint32_t *)STARPU_VARIABLE_GET_PTR(buffers[flag_buffer(a)]) : NULL,
				      starpu_cuda_get_local_stream()));
}
#endif

DOS_DEFINE_CODELET(adam, adam_cpu, adam_cuda, STARPU_VARIABLE_NBUFFERS);

/* The scalars are copied into the task and trusted by every kernel: a hand-made or
 * corrupted struct would turn the whole state into NaN one subgroup at a time, so each
 * field must lie where dos_adam_step_init() puts it. */
static int check_step(const struct dos_adam_step *s)
{
	const struct {
		const char *name;
		float value;
		int ok;
	} fields[] = {
		{"grad_multiplier", s->grad_multiplier, s->grad_multiplier > 0.0f && isfinite(s->grad_multiplier)},
		{"lerp_coeff", s->lerp_coeff, s->lerp_coeff >= -1.0f && s->lerp_coeff <= 1.0f},
		{"beta2", s->beta2, s->beta2 >= 0.0f && s->beta2 <= 1.0f}, /* beta2 < 1 may round to 1 */
		{"one_minus_beta2", s->one_minus_beta2, s->one_minus_beta2 > 0.0f && s->one_minus_beta2 <= 1.0f},
		{"bc2_sqrt", s->bc2_sqrt, s->bc2_sqrt > 0.0f && s->bc2_sqrt <= 1.0f},
		{"eps", s->eps, s->eps > 0.0f && isfinite(s->eps)},
		{"neg_step_size", s->neg_step_size, s->neg_step_size <= 0.0f && isfinite(s->neg_step_size)},
		{"decay", s->decay, isfinite(s->decay)},
		{"weight_decay", s->weight_decay, s->weight_decay >= 0.0f && isfinite(s->weight_decay)},
	};
	if (s->step == 0 || s->decay_kind > DOS_DECAY_L2 || s->lerp_from_grad > 1)
		return DOS_FAIL(-EINVAL,
				"step was not filled by dos_adam_step_init (step = %llu, decay_kind = %u, "
				"lerp_from_grad = %u)",
				(unsigned long long)s->step, s->decay_kind, s->lerp_from_grad);
	for (size_t i = 0; i < sizeof fields / sizeof *fields; i++)
		if (!fields[i].ok)
			return DOS_FAIL(-EINVAL,
					"step->%s = %g is out of range: step was not filled by dos_adam_step_init",
					fields[i].name, (double)fields[i].value);
	return 0;
}

int dos_adam_task_create(const struct dos_adam_step *step, starpu_data_handle_t master, starpu_data_handle_t m,
			 starpu_data_handle_t v, starpu_data_handle_t grad, enum dos_dtype grad_dtype,
			 starpu_data_handle_t weight16, enum dos_dtype weight_dtype, struct starpu_task **task_out)
{
	static const char *const names[] = {[DOS_ADAM_BUF_MASTER] = "master",
					    [DOS_ADAM_BUF_M] = "m",
					    [DOS_ADAM_BUF_V] = "v",
					    [DOS_ADAM_BUF_GRAD] = "grad",
					    [DOS_ADAM_BUF_WEIGHT16] = "weight16"};
	starpu_data_handle_t handles[] = {[DOS_ADAM_BUF_MASTER] = master,
					  [DOS_ADAM_BUF_M] = m,
					  [DOS_ADAM_BUF_V] = v,
					  [DOS_ADAM_BUF_GRAD] = grad,
					  [DOS_ADAM_BUF_WEIGHT16] = weight16};
	uint32_t n[DOS_ADAM_BUF_WEIGHT16 + 1] = {0};
	int err;
	if (!task_out)
		return DOS_FAIL(-EINVAL, "task_out is NULL");
	if (!step)
		return DOS_FAIL(-EINVAL, "step is NULL");
	if ((err = check_step(step)))
		return err;
	if ((err = _dos_check_dtype(__func__, "grad_dtype", grad_dtype, 0)))
		return err;
	if (weight16 && (err = _dos_check_dtype(__func__, "weight_dtype", weight_dtype, 1)))
		return err;
	int nbuffers = weight16 ? DOS_ADAM_BUF_WEIGHT16 + 1 : DOS_ADAM_BUF_WEIGHT16;
	for (int i = 0; i < nbuffers; i++) {
		size_t elemsize = i < DOS_ADAM_STATE_BUFFERS ? sizeof(float)
				  : i == DOS_ADAM_BUF_GRAD   ? dos_dtype_size(grad_dtype)
							     : dos_dtype_size(weight_dtype);
		if ((err = _dos_check_contiguous(__func__, names[i], handles[i], elemsize, &n[i])))
			return err;
		if (n[i] != n[DOS_ADAM_BUF_MASTER])
			return DOS_FAIL(-EINVAL, "%s has %u elements but master has %u", names[i], n[i],
					n[DOS_ADAM_BUF_MASTER]);
	}
	if ((err = _dos_check_distinct(__func__, handles, names, DOS_ADAM_BUF_WEIGHT16 + 1)))
		return err;

	struct adam_args args = {.step = *step,
				 .grad_dtype = grad_dtype,
				 .weight_dtype = weight_dtype,
				 .has_weight16 = weight16 != NULL};
	struct starpu_task *task = _dos_task_with_args(__func__, &_dos_adam_codelet, &args, sizeof args);
	if (!task)
		return -ENOMEM;
	static const enum starpu_data_access_mode modes[] = {[DOS_ADAM_BUF_MASTER] = STARPU_RW,
							     [DOS_ADAM_BUF_M] = STARPU_RW,
							     [DOS_ADAM_BUF_V] = STARPU_RW,
							     [DOS_ADAM_BUF_GRAD] = STARPU_R,
							     [DOS_ADAM_BUF_WEIGHT16] = STARPU_W};
	task->nbuffers = nbuffers;
	for (int i = 0; i < nbuffers; i++) {
		task->handles[i] = handles[i];
		task->modes[i] = modes[i];
	}
	*task_out = task;
	return 0;
}

int dos_adam_task_report_nonfinite(struct starpu_task *task, starpu_data_handle_t flag)
{
	if (!task)
		return DOS_FAIL(-EINVAL, "task is NULL");
	if (task->cl != &_dos_adam_codelet || !task->cl_arg)
		return DOS_FAIL(-EINVAL, "task is a %s task, not a dos_adam task",
				task->cl && task->cl->name ? task->cl->name : "codelet-less");
	if (task->status != STARPU_TASK_INIT)
		return DOS_FAIL(-EINVAL, "task was already submitted (status %d)", (int)task->status);
	struct adam_args *a = task->cl_arg; /* the task's own copy (_dos_task_with_args) */
	if (a->has_flag)
		return DOS_FAIL(-EINVAL, "task already reports into a flag");
	if (!flag)
		return DOS_FAIL(-EINVAL, "flag is NULL");
	if (starpu_data_get_interface_id(flag) != STARPU_VARIABLE_INTERFACE_ID)
		return DOS_FAIL(-EINVAL, "flag must be a variable handle, not interface id %d",
				(int)starpu_data_get_interface_id(flag));
	if (starpu_variable_get_elemsize(flag) != sizeof(uint32_t))
		return DOS_FAIL(-EINVAL, "flag must be a variable handle of 4 bytes (uint32_t), not %zu",
				starpu_variable_get_elemsize(flag));
	STARPU_ASSERT(task->nbuffers == flag_buffer(a));
	task->handles[task->nbuffers] = flag;
	task->modes[task->nbuffers] = STARPU_W;
	task->nbuffers++;
	a->has_flag = 1;
	return 0;
}

int _dos_adam_task_info(const struct starpu_task *task, uint64_t *step, enum dos_dtype *grad_dtype,
			enum dos_dtype *weight_dtype, size_t *params)
{
	if (!task || task->cl != &_dos_adam_codelet || !task->cl_arg)
		return -1;
	const struct adam_args *a = task->cl_arg;
	*step = a->step.step;
	*grad_dtype = a->grad_dtype;
	*weight_dtype = a->has_weight16 ? a->weight_dtype : DOS_FP32;
	*params = _dos_handle_count(STARPU_TASK_GET_HANDLE(task, DOS_ADAM_BUF_MASTER), sizeof(float));
	return 0;
}

int _dos_adam_step_data_end(const struct starpu_task *task)
{
	STARPU_ASSERT(task && task->cl == &_dos_adam_codelet && task->cl_arg);
	return flag_buffer(task->cl_arg);
}

int _dos_adam_flag_buffer(const struct starpu_task *task)
{
	STARPU_ASSERT(task && task->cl == &_dos_adam_codelet && task->cl_arg);
	const struct adam_args *a = task->cl_arg;
	return a->has_flag ? flag_buffer(a) : -1;
}
