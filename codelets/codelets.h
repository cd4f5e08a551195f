/* The codelets, for code that must recognise their tasks (the scheduling policy) or
 * calibrate them (benchmarks). Tasks are made with the dos_*_task_create functions. */
#ifndef DOS_CODELETS_H
#define DOS_CODELETS_H

#include <starpu.h>

extern struct starpu_codelet _dos_adam_codelet;
extern struct starpu_codelet _dos_cast_codelet;
extern struct starpu_codelet _dos_grad_stats_codelet;
extern struct starpu_codelet _dos_grad_scale_codelet;
extern struct starpu_codelet _dos_init_state_codelet;

/* A task that creates a subgroup's optimizer state (init_state.h): master (the initial
 * values of parameters [begin, begin + its length)), m and v (zero), all fp32 vectors of
 * one length, written only. Errors: -EINVAL naming the bad argument, -ENOMEM. */
struct dos_init_layout;
int _dos_init_state_task_create(starpu_data_handle_t master, starpu_data_handle_t m, starpu_data_handle_t v,
				const struct dos_init_layout *layout, uint64_t begin, struct starpu_task **task_out);

/* The buffers of a dos_adam task, in this order. The optimizer state (master weights, m
 * and v: fp32, read and written) is what a policy keeps on the GPU or stages there; the
 * step data (the gradient, read, and the 16-bit weights, written when the task makes
 * them) is made for one update and dropped after it. A non-finite flag, when the task
 * reports one (dos_adam_task_report_nonfinite), comes after the step data: the host
 * reads it one step later, so a policy sends it home once the update has written it. */
enum _dos_adam_buffer {
	DOS_ADAM_BUF_MASTER = 0,
	DOS_ADAM_BUF_M = 1,
	DOS_ADAM_BUF_V = 2,
	DOS_ADAM_BUF_GRAD = 3,
	DOS_ADAM_BUF_WEIGHT16 = 4,
};
/* master, m and v: the buffers before DOS_ADAM_BUF_GRAD */
#define DOS_ADAM_STATE_BUFFERS 3

/* What a scheduler needs to know of a dos_adam task: its step number, gradient and
 * 16-bit weight dtypes (weight_dtype is DOS_FP32 when the task writes no 16-bit weights),
 * and its subgroup size. Returns 0, or -1 when `task` is not a dos_adam task. */
#include "dos.h"
int _dos_adam_task_info(const struct starpu_task *task, uint64_t *step, enum dos_dtype *grad_dtype,
			enum dos_dtype *weight_dtype, size_t *params);
/* The end of dos_adam task `task`'s step data: its buffers [DOS_ADAM_BUF_GRAD, end) are
 * the gradient and, when it writes them, the 16-bit weights. */
int _dos_adam_step_data_end(const struct starpu_task *task);
/* The buffer of dos_adam task `task`'s non-finite flag, or -1 when it reports none. */
int _dos_adam_flag_buffer(const struct starpu_task *task);

#endif /* DOS_CODELETS_H */
