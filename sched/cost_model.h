/* The cost model of the dos policy, in one place: what one subgroup update costs on the
 * CPU and on the GPU, what it moves over each direction of the link, and how much GPU
 * memory the optimizer may use. The planner (planner.c) and the bound (bound.c) read
 * it; rates.c fills it from StarPU's calibrated perfmodels and bus model. Pure data and
 * arithmetic: testable without StarPU. Times in seconds, sizes in bytes. */
#ifndef DOS_COST_MODEL_H
#define DOS_COST_MODEL_H

#include <math.h>
#include <stddef.h>

#define DOS_STATE_BYTES_PER_PARAM 12.0 /* fp32 master, m, v */

/* Where the gradient and the 16-bit weights of every subgroup live. */
struct dos_data_homes {
	double grad_bytes_per_param;   /* 2 for fp16/bf16, 4 for fp32 */
	double weight_bytes_per_param; /* 2, or 0 when training in fp32 */
	int grads_on_gpu;              /* produced by backward on the GPU */
	int weights_on_gpu;            /* read by forward on the GPU */
	/* Registered in host memory, as opposed to no home at all: data without a home is
	 * made by the application's tasks where they run, and its GPU copies count in the
	 * application's memory forecast, which the GPU budget already leaves out. */
	int grads_homed_on_host;
	int weights_homed_on_host;
};

struct dos_machine_costs {
	int ncpu_workers;
	double cpu_seconds_per_param; /* one CPU worker, one subgroup, alone */
	double gpu_seconds_per_param; /* the GPU, one subgroup */
	/* What every update task costs beside its parameters' share (StarPU's driver, a kernel
	 * launch), on a CPU worker and on the GPU: it decides the updates of a few thousand
	 * parameters (norms, biases), whose GPU time is mostly this. 0: not measured. */
	double cpu_task_seconds, gpu_task_seconds;
	double h2d_bytes_per_second, d2h_bytes_per_second; /* full duplex: each way */
	double link_latency_seconds;
	/* CPU Adam slows down while DMA shares host memory bandwidth: CPU times are
	 * multiplied by this factor (>= 1) */
	double host_contention;
	/* GPU memory the optimizer's state may occupy throughout the iteration (resident
	 * state), after the forecast of what forward and backward need */
	double gpu_budget_bytes;
	/* further room during the update window only, where the application needs less
	 * (learned: its peak over the iteration minus its peak in the window): for state
	 * staged for its update and written back within the window */
	double gpu_update_extra_bytes;
	/* kept free on top of the budget while state is staged: staging allocates and frees
	 * buffers every step, which StarPU serves from its cache of freed buffers and by
	 * writing back or evicting, so it needs headroom that state allocated once and kept
	 * resident does not */
	double staging_margin_bytes;
	/* The rest of the iteration, as the plan sees it. The GPU's application work queued
	 * ahead of the updates (the end of backward): the GPU is not free before it ends. */
	double gpu_busy_ahead_seconds;
	/* State that may move to the GPU between two update phases, on the link left idle
	 * while the GPU runs the application (learned from the last iteration; 0: none). */
	double promote_bytes;
	struct dos_data_homes homes;
	/* The whole node, for the bound only (the planner plans the GPU above): the number of
	 * GPUs of the context, each taken to be like the one above (rates, budget), and what
	 * the transfers of all of them together reach each way, GPUs behind one PCIe switch
	 * or host bridge sharing its bandwidth. ngpus <= 1: that GPU alone, node rates unused. */
	int ngpus;
	double node_h2d_bytes_per_second, node_d2h_bytes_per_second;
	/* The GPUs that the one above pools for the placement rule (dos_policy.c,
	 * step_costs); 0 or 1: it is one GPU. */
	int pooled_gpus;
};

/* GPU memory left for staging state beside `resident_bytes` of resident state. */
static inline double dos_staging_room_bytes(const struct dos_machine_costs *m, double resident_bytes)
{
	return m->gpu_budget_bytes + (m->gpu_update_extra_bytes > 0 ? m->gpu_update_extra_bytes : 0.0) -
	       m->staging_margin_bytes - resident_bytes;
}

/* GPU bytes per parameter that a subgroup's update on the GPU needs beside its state: the
 * GPU copies of a host-homed gradient and 16-bit weights (dropped afterwards). */
static inline double dos_update_copy_bytes_per_param(const struct dos_machine_costs *m)
{
	return (m->homes.grads_on_gpu ? 0.0 : m->homes.grad_bytes_per_param) +
	       (m->homes.weights_on_gpu ? 0.0 : m->homes.weight_bytes_per_param);
}

/* GPU bytes per parameter of a subgroup while it is updated on the GPU: its state plus
 * those copies. */
static inline double dos_staging_bytes_per_param(const struct dos_machine_costs *m)
{
	return DOS_STATE_BYTES_PER_PARAM + dos_update_copy_bytes_per_param(m);
}

/* Staging buffers for state that passes through a GPU: two allow double buffering (one
 * transferring while the other computes); a third covers the write-back. */
#define DOS_MAX_STAGING_SLOTS 3

/* The staging slots a GPU has beside `resident_bytes` of resident state: what its room
 * holds of the largest subgroup (`biggest_params`), at most DOS_MAX_STAGING_SLOTS. */
static inline int dos_staging_slots(const struct dos_machine_costs *m, double resident_bytes, double biggest_params)
{
	double per = biggest_params * dos_staging_bytes_per_param(m);
	double slots = per > 0 ? floor(dos_staging_room_bytes(m, resident_bytes) / per) : 0;
	return slots < 0 ? 0 : slots > DOS_MAX_STAGING_SLOTS ? DOS_MAX_STAGING_SLOTS : (int)slots;
}

/* GPU memory that resident state may take out of a budget of `budget_bytes`: the budget
 * less the copies that one GPU update of the largest subgroup (`biggest_params`) brings
 * in beside it and that no forecast counts, those of a gradient and 16-bit weights homed
 * in host memory. Resident state is pinned on the GPU: a budget filled with it leaves a
 * GPU update no room for its gradient, and StarPU waits forever (simulated: 1e9 params
 * in subgroups of 1e8 with host homes on an 8 GiB h100-pcie5, 7 subgroups resident).
 * Without a home (dos-train's gradients and 16-bit weights) the forecast has them:
 * taking them off again cost a resident subgroup, 0.166 -> 0.224 s in the first 1b
 * iteration on a 12000 MiB GPU (results/suballocator-chunks-2026-12-03.md). */
static inline double dos_resident_room_bytes(const struct dos_machine_costs *m, double budget_bytes,
					     double biggest_params)
{
	double copies = (m->homes.grads_homed_on_host ? m->homes.grad_bytes_per_param : 0.0) +
			(m->homes.weights_homed_on_host ? m->homes.weight_bytes_per_param : 0.0);
	return budget_bytes - biggest_params * copies;
}

/* Link bytes of one subgroup of `params` parameters by path and direction. */
static inline double dos_gpu_path_h2d_bytes(const struct dos_machine_costs *m, double params, int state_resident)
{
	return params * ((state_resident ? 0.0 : DOS_STATE_BYTES_PER_PARAM) +
			 (m->homes.grads_on_gpu ? 0.0 : m->homes.grad_bytes_per_param));
}

static inline double dos_gpu_path_d2h_bytes(const struct dos_machine_costs *m, double params, int stays_resident)
{
	return params * ((stays_resident ? 0.0 : DOS_STATE_BYTES_PER_PARAM) +
			 (m->homes.weights_on_gpu ? 0.0 : m->homes.weight_bytes_per_param));
}

static inline double dos_cpu_path_h2d_bytes(const struct dos_machine_costs *m, double params)
{
	return params * (m->homes.weights_on_gpu ? m->homes.weight_bytes_per_param : 0.0);
}

static inline double dos_cpu_path_d2h_bytes(const struct dos_machine_costs *m, double params)
{
	return params * (m->homes.grads_on_gpu ? m->homes.grad_bytes_per_param : 0.0);
}

#endif /* DOS_COST_MODEL_H */
