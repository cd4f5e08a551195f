/* StarPU's measurements turned into the cost model (rates.c). */
#ifndef DOS_RATES_H
#define DOS_RATES_H

#include <starpu.h>

#include "cost_model.h"

/* Fills *out for subgroups like `update` (an update task of `params` parameters: a
 * dos_adam task, or a foreign one, measured by its codelet's own perfmodel) in
 * `sched_ctx`, with `reserved_gpu_bytes` of GPU memory set aside for the application;
 * *calibrated tells whether StarPU's models had samples for both sides (without them,
 * the defaults of cost_model.h). Returns 0. */
int _dos_measure_costs(struct starpu_task *update, double params, unsigned sched_ctx,
		       const struct dos_data_homes *homes, double reserved_gpu_bytes, struct dos_machine_costs *out,
		       int *calibrated);

/* The contention factor for this host: DOS_HOST_CONTENTION, else what
 * dos_host_contention_record() stored for it, else 1 (host_measurements.c). */
double _dos_host_contention(void);
/* The aggregate CPU Adam rate (params/s) recorded for this host, or 0 if none. */
double _dos_host_cpu_rate(void);

/* The first worker of `sched_ctx` of `type`, or -1; how many there are. Combined workers
 * (groups of CPU workers for parallel tasks) are not counted. */
int _dos_first_worker_of_type(unsigned sched_ctx, enum starpu_worker_archtype type);
int _dos_count_workers_of_type(unsigned sched_ctx, enum starpu_worker_archtype type);

#endif /* DOS_RATES_H */
