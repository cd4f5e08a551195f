/* Which tasks are optimizer updates that the dos policy plans, and what each of their
 * buffers is: our dos_adam tasks, and the tasks of update codelets registered by name
 * (another framework's Adam: dos_sched_register_update_codelet, DOS_UPDATE_CODELETS).
 * The policy sees an update through this view only, so that it plans, prefetches and
 * keeps resident a foreign update's state exactly as it does ours. */
#ifndef DOS_UPDATE_TASKS_H
#define DOS_UPDATE_TASKS_H

#include <starpu.h>

#include "codelets.h"
#include "dos.h"

/* An update task's buffers by role: role r (enum _dos_adam_buffer: master or weights, m,
 * v, gradient, 16-bit weights) is buffer buffer[r]. Roles [0, DOS_ADAM_STATE_BUFFERS)
 * are the state the policy keeps on the GPU or stages there; [DOS_ADAM_BUF_GRAD,
 * step_data_end) the step data, made for one update. */
struct _dos_update_view {
	int buffer[DOS_ADAM_BUF_WEIGHT16 + 1];
	int step_data_end;
	int flag;      /* the non-finite flag buffer (dos_adam only), or -1 */
	double params; /* fp32 parameters of the same state bytes: state bytes / 12 */
	enum dos_dtype grad_dtype;
	enum dos_dtype weight_dtype; /* of the 16-bit weights written; DOS_FP32: none */
	int has_step;                /* dos_adam: step is its step number; foreign: none */
	uint64_t step;
	int foreign;
	/* the home node of each input (grad, 16-bit weights; -1: none), which does not change
	 * after registration: asked once, when the dos policy collects the update, and read
	 * by each plan (dos_policy.c). Not filled by _dos_update_view */
	int input_home[DOS_ADAM_BUF_WEIGHT16 + 1];
};

/* 0 and *u filled when `task` is an update, else -1. */
int _dos_update_view(const struct starpu_task *task, struct _dos_update_view *u);
/* Whether `task` is an update (cheap: a pointer compare, or a cached codelet lookup). */
int _dos_is_update(const struct starpu_task *task);

static inline starpu_data_handle_t _dos_update_handle(const struct starpu_task *task, const struct _dos_update_view *u,
						      int role)
{
	return STARPU_TASK_GET_HANDLE(task, u->buffer[role]);
}

/* Registers the codelets named in DOS_UPDATE_CODELETS, once per process; a malformed
 * entry is reported on stderr and skipped (a policy cannot fail to start). */
void _dos_update_codelets_from_env(void);

#endif /* DOS_UPDATE_TASKS_H */
