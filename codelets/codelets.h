/* The codelets, for code that must recognise their tasks (the scheduling policy) or
 * calibrate them (benchmarks). Tasks are made with the dos_*_task_create functions. */
#ifndef DOS_CODELETS_H
#define DOS_CODELETS_H

#include <starpu.h>

extern struct starpu_codelet _dos_adam_codelet;
extern struct starpu_codelet _dos_cast_codelet;
extern struct starpu_codelet _dos_grad_stats_codelet;
extern struct starpu_codelet _dos_grad_scale_codelet;

#endif /* DOS_CODELETS_H */
