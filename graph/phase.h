/* The phases of a training iteration, as the code that submits a task knows them: each
 * submitter hands its phase to the task hook with the task, so that whoever watches the
 * tasks (dos-train's accounting and timeline, the embedding API's step times) never has
 * to guess it from a task's name or from the order of submission. */
#ifndef DOS_PHASE_H
#define DOS_PHASE_H

#include <starpu.h>
#include <stdint.h>

enum _dos_task_phase {
	DOS_TASK_DATA,       /* a training micro-batch's tokens from the corpus */
	DOS_TASK_FORWARD,    /* the model's forward and loss (also when recomputed in backward) */
	DOS_TASK_BACKWARD,   /* the model's backward */
	DOS_TASK_GATHER,     /* the optimizer: a subgroup's gradient from the tensors' */
	DOS_TASK_STATISTICS, /* ... the gradient statistics (clipping, loss scaling) */
	DOS_TASK_UPDATE,     /* ... Adam */
	DOS_TASK_REFRESH,    /* ... the tensors' working weights from the subgroups */
	DOS_TASK_EVALUATION, /* the held-out evaluation: its data and forward */
	DOS_TASK_STATE_INIT, /* the optimizer: a subgroup's state made where it runs (fresh runs) */
	DOS_TASK_PHASES,
};

/* The name of a phase, for summaries and legends ("data", "forward", ...). */
static inline const char *_dos_task_phase_name(enum _dos_task_phase phase)
{
	static const char *const names[DOS_TASK_PHASES] = {
		[DOS_TASK_DATA] = "data",
		[DOS_TASK_FORWARD] = "forward",
		[DOS_TASK_BACKWARD] = "backward",
		[DOS_TASK_GATHER] = "gather",
		[DOS_TASK_STATISTICS] = "statistics",
		[DOS_TASK_UPDATE] = "update",
		[DOS_TASK_REFRESH] = "refresh",
		[DOS_TASK_EVALUATION] = "held-out evaluation",
		[DOS_TASK_STATE_INIT] = "state init",
	};
	return phase < DOS_TASK_PHASES ? names[phase] : "invalid";
}

/* No subgroup: what the hook receives for a task that is not per subgroup. */
#define DOS_NO_SUBGROUP UINT32_MAX

/* Called on every task the model, the data loader or the optimizer creates, just before
 * its submission, with its phase and, for the optimizer's tasks per subgroup (gathers,
 * statistics, updates, the casts of a weight rebuild), its subgroup (else
 * DOS_NO_SUBGROUP). The hook may replace the task's callbacks (chaining the ones it
 * finds). */
typedef void (*_dos_task_hook)(void *arg, struct starpu_task *task, enum _dos_task_phase phase, uint32_t subgroup);

#endif /* DOS_PHASE_H */
