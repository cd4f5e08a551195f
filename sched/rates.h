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

/* Fills out->cpu_task_seconds and out->gpu_task_seconds, the fixed part of an update's
 * time, from what StarPU's perfmodels predict for two updates of the step, `big` of
 * `big_params` and `small` of fewer `small_params`: the line through both predictions
 * at zero parameters. Left 0 where the sizes are equal or a prediction is missing. */
void _dos_measure_task_costs(struct starpu_task *big, double big_params, struct starpu_task *small, double small_params,
			     unsigned sched_ctx, struct dos_machine_costs *out);

/* The contention factor for this host: DOS_HOST_CONTENTION, else what
 * dos_host_contention_record() stored for it, else 1 (host_measurements.c). */
double _dos_host_contention(void);
/* The aggregate CPU Adam rate (params/s) recorded for this host, or 0 if none. */
double _dos_host_cpu_rate(void);

/* The basic workers of `sched_ctx` of `type` (combined workers, groups of CPU workers for
 * parallel tasks, are not counted), in the context's order: the first `max` of them in
 * ids[]; returns how many there are. The first one (-1: none); how many. */
int _dos_workers_of_type(unsigned sched_ctx, enum starpu_worker_archtype type, int *ids, int max);
int _dos_first_worker_of_type(unsigned sched_ctx, enum starpu_worker_archtype type);
int _dos_count_workers_of_type(unsigned sched_ctx, enum starpu_worker_archtype type);

/* The memory nodes of the context's GPUs, each once (several workers may drive one GPU),
 * in the order of their first workers; returns how many, at most `max`. */
int _dos_context_gpu_nodes(unsigned sched_ctx, unsigned *nodes, int max);

/* Each of the `ngpus` GPUs' link rate each way (bytes/s) while all of them transfer at
 * once: a GPU behind a PCIe switch or host bridge that k GPUs share gets 1/k of it. With
 * `link` not NULL, link[k] is the index of the first GPU behind the same bridge as GPU k
 * (k itself when it has its link to itself): the GPUs with one link[] value share
 * k times a GPU's share, however they divide it. */
void _dos_gpu_link_shares(const unsigned *nodes, int ngpus, double *h2d, double *d2h, int *link);

/* GPU memory node `node`'s room for optimizer state: its capacity less a safety margin
 * and `reserved_gpu_bytes` (the application's forecast, homed inputs, reserves). */
double _dos_gpu_budget_bytes(unsigned node, double reserved_gpu_bytes);

/* The GPU memory StarPU charges for one buffer of `bytes` (its suballocator packs small
 * buffers into chunks). */
double _dos_gpu_charged_bytes(double bytes);

/* What staging keeps free on GPU memory node `node` beyond that margin
 * (cost_model.h: staging_margin_bytes). */
double _dos_gpu_staging_margin_bytes(unsigned node);

#endif /* DOS_RATES_H */
