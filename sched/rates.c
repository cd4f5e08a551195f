/* Fills the cost model from what StarPU knows now: calibrated perfmodels for update
 * times, the bus model for link bandwidth and latency, the memory manager for GPU
 * capacity (STARPU_LIMIT_CUDA_MEM included). Until StarPU has samples (first steps, or
 * never calibrated), conservative bandwidth-based defaults stand in; `calibrated` says
 * which. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "codelet_util.h"
#include "codelets.h"
#include "errors.h"
#include "planner.h"
#include "rates.h"

/* Defaults before calibration: 28 B/param at a few GB/s per CPU core, at ~1 TB/s on a
 * GPU, ~12 GB/s each way on PCIe: about right for any recent machine, and replaced by
 * StarPU's measurements as soon as they exist. */
#define DEFAULT_CPU_SECONDS_PER_PARAM (28.0 / 3e9)
#define DEFAULT_GPU_SECONDS_PER_PARAM (28.0 / 1e12)
#define DEFAULT_LINK_BYTES_PER_SECOND 12e9
/* Headroom kept free on the GPU beyond the forecast, for StarPU's own allocations and
 * its cache of freed buffers: a share of small GPUs, capped on big ones (on an 80 GB GPU
 * 8% would keep four 1e8-param subgroups of state off it for nothing). */
#define GPU_SAFETY_FRACTION 0.08
#define GPU_SAFETY_MAX_BYTES (1024.0 * 1048576.0)

int _dos_first_worker_of_type(unsigned sched_ctx, enum starpu_worker_archtype type)
{
	struct starpu_worker_collection *workers = starpu_sched_ctx_get_worker_collection(sched_ctx);
	struct starpu_sched_ctx_iterator it;
	workers->init_iterator(workers, &it);
	while (workers->has_next(workers, &it)) {
		int w = (int)workers->get_next(workers, &it);
		if (!starpu_worker_is_combined_worker(w) && starpu_worker_get_type(w) == type)
			return w;
	}
	return -1;
}

int _dos_count_workers_of_type(unsigned sched_ctx, enum starpu_worker_archtype type)
{
	struct starpu_worker_collection *workers = starpu_sched_ctx_get_worker_collection(sched_ctx);
	struct starpu_sched_ctx_iterator it;
	int n = 0;
	workers->init_iterator(workers, &it);
	while (workers->has_next(workers, &it)) {
		int w = (int)workers->get_next(workers, &it);
		n += !starpu_worker_is_combined_worker(w) && starpu_worker_get_type(w) == type;
	}
	return n;
}

/* Seconds per parameter of `task` on `worker`, or NAN when the model has no samples. */
static double seconds_per_param(struct starpu_task *task, int worker, unsigned sched_ctx, double params)
{
	if (worker < 0 || params <= 0)
		return NAN;
	double us = starpu_task_expected_length(task, starpu_worker_get_perf_archtype(worker, sched_ctx), 0);
	return isfinite(us) && us > 0 ? us * 1e-6 / params : NAN;
}

static double link_rate(unsigned src, unsigned dst)
{
	double mb_per_s = starpu_transfer_bandwidth(src, dst); /* StarPU: bytes per microsecond */
	return isfinite(mb_per_s) && mb_per_s > 0 ? mb_per_s * 1e6 : DEFAULT_LINK_BYTES_PER_SECOND;
}

int _dos_measure_costs(struct starpu_task *update, double params, unsigned sched_ctx,
		       const struct dos_data_homes *homes, double reserved_gpu_bytes, struct dos_machine_costs *out,
		       int *calibrated)
{
	int cpu = _dos_first_worker_of_type(sched_ctx, STARPU_CPU_WORKER);
	int gpu = _dos_first_worker_of_type(sched_ctx, STARPU_CUDA_WORKER);
	double c = seconds_per_param(update, cpu, sched_ctx, params);
	double g = seconds_per_param(update, gpu, sched_ctx, params);
	*calibrated = isfinite(c) && (gpu < 0 || isfinite(g));
	/* n workers share the host's memory bandwidth: none of them goes faster than its
	 * share of the aggregate rate measured with every core busy */
	int ncpu = _dos_count_workers_of_type(sched_ctx, STARPU_CPU_WORKER);
	double aggregate = _dos_host_cpu_rate();
	if (isfinite(c) && aggregate > 0 && ncpu > 0)
		c = fmax(c, (double)ncpu / aggregate);
	*out = (struct dos_machine_costs){
		.ncpu_workers = ncpu,
		.cpu_seconds_per_param = isfinite(c) ? c : DEFAULT_CPU_SECONDS_PER_PARAM,
		.gpu_seconds_per_param = gpu < 0       ? INFINITY
					 : isfinite(g) ? g
						       : DEFAULT_GPU_SECONDS_PER_PARAM,
		.h2d_bytes_per_second = DEFAULT_LINK_BYTES_PER_SECOND,
		.d2h_bytes_per_second = DEFAULT_LINK_BYTES_PER_SECOND,
		.link_latency_seconds = 0,
		.host_contention = _dos_host_contention(),
		.gpu_budget_bytes = 0,
		.homes = *homes,
	};
	if (gpu >= 0) {
		unsigned node = starpu_worker_get_memory_node((unsigned)gpu);
		out->h2d_bytes_per_second = link_rate(STARPU_MAIN_RAM, node);
		out->d2h_bytes_per_second = link_rate(node, STARPU_MAIN_RAM);
		double lat = starpu_transfer_latency(STARPU_MAIN_RAM, node);
		out->link_latency_seconds = isfinite(lat) && lat > 0 ? lat * 1e-6 : 0;
		double total = (double)starpu_memory_get_total(node);
		double safety = fmin(total * GPU_SAFETY_FRACTION, GPU_SAFETY_MAX_BYTES);
		out->gpu_budget_bytes = fmax(0.0, total - safety - reserved_gpu_bytes);
	}
	return 0;
}

int dos_bound_update_seconds(unsigned sched_ctx, double params, double subgroup_params, enum dos_dtype grad_dtype,
			     enum dos_dtype weight_dtype, int grads_on_gpu, int weights_on_gpu, double *seconds)
{
	if (!seconds)
		return DOS_FAIL(-EINVAL, "seconds is NULL");
	if (!(params >= 1 && params < 1e15))
		return DOS_FAIL(-EINVAL, "params = %g must be in [1, 1e15)", params);
	if (!(subgroup_params >= 1 && subgroup_params <= 4294967295.0 && subgroup_params <= params))
		return DOS_FAIL(-EINVAL, "subgroup_params = %g must be in [1, min(params, 2^32 - 1)]", subgroup_params);
	int err;
	if ((err = _dos_check_dtype(__func__, "grad_dtype", grad_dtype, 0)) ||
	    (err = _dos_check_dtype(__func__, "weight_dtype", weight_dtype, 0)) ||
	    (err = _dos_check_sched_ctx(__func__, "sched_ctx", sched_ctx)))
		return err;
	/* a probe update task on handles with no memory behind them: only its sizes matter */
	uint32_t n = (uint32_t)subgroup_params;
	starpu_data_handle_t h[5];
	static const size_t state_elem = sizeof(float);
	for (int b = 0; b < 3; b++)
		starpu_vector_data_register(&h[b], -1, 0, n, state_elem);
	starpu_vector_data_register(&h[3], -1, 0, n, dos_dtype_size(grad_dtype));
	starpu_vector_data_register(&h[4], -1, 0, n, 2);
	struct dos_adam_hparams hp = {DOS_ADAMW, 1e-3, 0.9, 0.999, 1e-8, 0.0};
	struct dos_adam_step step;
	struct starpu_task *probe = NULL;
	err = dos_adam_step_init(&step, &hp, 1, 1.0);
	if (!err)
		err = dos_adam_task_create(&step, h[0], h[1], h[2], h[3], grad_dtype,
					   weight_dtype == DOS_FP32 ? NULL : h[4], weight_dtype, &probe);
	if (!err) {
		struct dos_data_homes homes = {
			.grad_bytes_per_param = (double)dos_dtype_size(grad_dtype),
			.weight_bytes_per_param = weight_dtype == DOS_FP32 ? 0.0 : 2.0,
			.grads_on_gpu = grads_on_gpu != 0,
			.weights_on_gpu = weight_dtype != DOS_FP32 && weights_on_gpu != 0,
		};
		struct dos_machine_costs m;
		int calibrated;
		/* gradients and 16-bit weights that live on the GPU are not the optimizer's room */
		double homed = params * ((homes.grads_on_gpu ? homes.grad_bytes_per_param : 0.0) +
					 (homes.weights_on_gpu ? homes.weight_bytes_per_param : 0.0));
		_dos_measure_costs(probe, subgroup_params, sched_ctx, &homes, homed, &m, &calibrated);
		if (!calibrated)
			err = DOS_FAIL(-ENODATA,
				       "StarPU's dos_adam perfmodel has no measurements for subgroups of %g params on "
				       "this machine yet: a bound from default rates would mean nothing",
				       subgroup_params);
		int count = (int)ceil(params / subgroup_params);
		struct dos_plan_subgroup *sg = err ? NULL : malloc((size_t)count * sizeof *sg);
		if (!err && !sg)
			err = DOS_FAIL(-ENOMEM, "out of memory for %d subgroups", count);
		if (!err) {
			for (int i = 0; i < count; i++)
				sg[i] = (struct dos_plan_subgroup){
					.params = fmin(subgroup_params, params - (double)i * subgroup_params),
					.resident_now = 0};
			*seconds = _dos_bound_seconds(&m, sg, count, NULL);
		}
		free(sg);
		probe->destroy = 0; /* never submitted */
		starpu_task_destroy(probe);
	}
	for (int b = 0; b < 5; b++)
		starpu_data_unregister_no_coherency(h[b]);
	return err;
}
