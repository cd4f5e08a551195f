/* The codelets, for code that must recognise their tasks (the scheduling policy) or
 * calibrate them (benchmarks). Tasks are made with the dos_*_task_create functions. */
#ifndef DOS_CODELETS_H
#define DOS_CODELETS_H

#include <starpu.h>

extern struct starpu_codelet _dos_adam_codelet;
extern struct starpu_codelet _dos_cast_codelet;
extern struct starpu_codelet _dos_grad_stats_codelet;
extern struct starpu_codelet _dos_grad_scale_codelet;

/* What a scheduler needs to know of a dos_adam task: its step number, gradient and
 * 16-bit weight dtypes (weight_dtype is DOS_FP32 when the task writes no 16-bit weights),
 * and its subgroup size. Returns 0, or -1 when `task` is not a dos_adam task. */
#include "dos.h"
int _dos_adam_task_info(const struct starpu_task *task, uint64_t *step, enum dos_dtype *grad_dtype,
			enum dos_dtype *weight_dtype, size_t *params);

#endif /* DOS_CODELETS_H */
