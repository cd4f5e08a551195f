/* Fills the cost model from what StarPU knows now: calibrated perfmodels for update
 * times, the bus model for link bandwidth and latency, the memory manager for GPU
 * capacity (STARPU_LIMIT_CUDA_MEM included). Until StarPU has samples (first steps, or
 * never calibrated), conservative bandwidth-based defaults stand in; `calibrated` says
 * which. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
/* Headroom kept free, beyond the forecast, of the GPU memory StarPU manages (by default
 * 90 % of the GPU: StarPU leaves the rest to the CUDA context and libraries, unless
 * STARPU_LIMIT_CUDA_MEM says otherwise), a share of small GPUs capped on big ones.
 * Always a little, for StarPU's own small allocations: state allocated once and kept
 * resident needs no more, and every subgroup of state kept off a GPU that would hold it
 * costs a CPU update per step. More while state is staged, for the buffers staging
 * allocates and frees every step (StarPU's cache of freed buffers, its write-back and
 * evictions to make room): planned closer, a nearly full GPU stalls the staged updates.
 * What StarPU evicts of resident state raises both (dos_policy.c,
 * learn_from_evictions). */
#define GPU_SAFETY_FRACTION 0.005
#define GPU_SAFETY_MAX_BYTES (256.0 * 1048576.0)
#define GPU_STAGING_SAFETY_FRACTION 0.08
#define GPU_STAGING_SAFETY_MAX_BYTES (1024.0 * 1048576.0)

int _dos_workers_of_type(unsigned sched_ctx, enum starpu_worker_archtype type, int *ids, int max)
{
	struct starpu_worker_collection *workers = starpu_sched_ctx_get_worker_collection(sched_ctx);
	struct starpu_sched_ctx_iterator it;
	int n = 0;
	workers->init_iterator(workers, &it);
	while (workers->has_next(workers, &it)) {
		int w = (int)workers->get_next(workers, &it);
		if (starpu_worker_is_combined_worker(w) || starpu_worker_get_type(w) != type)
			continue;
		if (n < max)
			ids[n] = w;
		n++;
	}
	return n;
}

int _dos_first_worker_of_type(unsigned sched_ctx, enum starpu_worker_archtype type)
{
	int first = -1;
	_dos_workers_of_type(sched_ctx, type, &first, 1);
	return first;
}

int _dos_count_workers_of_type(unsigned sched_ctx, enum starpu_worker_archtype type)
{
	return _dos_workers_of_type(sched_ctx, type, NULL, 0);
}

int _dos_context_gpu_nodes(unsigned sched_ctx, unsigned *nodes, int max)
{
	int workers[STARPU_NMAXWORKERS];
	int nworkers = _dos_workers_of_type(sched_ctx, STARPU_CUDA_WORKER, workers, STARPU_NMAXWORKERS);
	int n = 0;
	for (int i = 0; i < nworkers && i < STARPU_NMAXWORKERS; i++) {
		unsigned node = starpu_worker_get_memory_node((unsigned)workers[i]);
		int seen = 0;
		for (int j = 0; j < n; j++)
			seen |= nodes[j] == node;
		if (!seen && n < max)
			nodes[n++] = node;
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

#ifdef STARPU_SIMGRID
/* The bridge GPU `devid` crosses to host memory, from the simulated machine's platform
 * file: the first "... through" link of its route from RAM (tools/gen-machine.py writes
 * them, as StarPU's own platform writer does). Copied into `name`; 0 when found. */
static int platform_bridge(const char *xml, int devid, char *name, size_t size)
{
	char route[64];
	snprintf(route, sizeof route, "<route src=\"RAM\" dst=\"CUDA%d\"", devid);
	const char *start = strstr(xml, route);
	const char *end = start ? strstr(start, "</route>") : NULL;
	for (const char *at = start; at && end && (at = strstr(at, "<link_ctn id=\"")) && at < end;) {
		at += strlen("<link_ctn id=\"");
		const char *quote = strchr(at, '"');
		size_t len = quote ? (size_t)(quote - at) : 0;
		if (len > 8 && len < size && !strncmp(quote - 8, " through", 8)) {
			memcpy(name, at, len);
			name[len] = '\0';
			return 0;
		}
	}
	return -1;
}

/* The bridge of each simulated GPU, from one platform file, read once: the file is the
 * simulated machine's and does not change during a run, and reading and scanning it
 * for every GPU, twice per plan, was a visible part of a plan (perf, 8 GPUs and 10,000
 * subgroups: results/multigpu-sim-2026-12-02.md, fifth round). */
#define MAX_SIMULATED_GPUS 64
struct simulated_bridges {
	char path[4096];
	char name[MAX_SIMULATED_GPUS][128]; /* "": none found */
};

/* The bridges read from `path`, or NULL when it cannot be read. */
static struct simulated_bridges *read_bridges(const char *path)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return NULL;
	char *xml = NULL;
	long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
	if (size > 0 && fseek(f, 0, SEEK_SET) == 0 && (xml = malloc((size_t)size + 1)) != NULL) {
		size = (long)fread(xml, 1, (size_t)size, f);
		xml[size] = '\0';
	}
	fclose(f);
	struct simulated_bridges *b = xml ? calloc(1, sizeof *b) : NULL;
	if (b) {
		snprintf(b->path, sizeof b->path, "%s", path);
		for (int devid = 0; devid < MAX_SIMULATED_GPUS; devid++)
			if (platform_bridge(xml, devid, b->name[devid], sizeof b->name[devid]))
				b->name[devid][0] = '\0';
	}
	free(xml);
	return b;
}

/* Whether simulated GPUs `a` and `b` (device ids) cross the same bridge, by the platform
 * file ($STARPU_PERF_MODEL_DIR/bus/$STARPU_HOSTNAME.platform.v4.xml, as tools/sim-env.sh
 * sets them): 1 or 0; -1 when it cannot tell. StarPU 1.4.10 cannot: its
 * _starpu_simgrid_count_ngpus runs before the CUDA driver registers the peer buses it
 * would annotate, so every peer bus reads "shared by all GPUs". The first file read is
 * kept for the process (lock-free: the first to publish wins); another file, should the
 * environment name one, is read each time. */
static int simulated_same_bridge(int a, int b)
{
	static struct simulated_bridges *kept;
	const char *dir = getenv("STARPU_PERF_MODEL_DIR"), *host = getenv("STARPU_HOSTNAME");
	char path[4096];
	if (!dir || !host || snprintf(path, sizeof path, "%s/bus/%s.platform.v4.xml", dir, host) >= (int)sizeof path)
		return -1;
	struct simulated_bridges *bridges = __atomic_load_n(&kept, __ATOMIC_ACQUIRE), *fresh = NULL;
	if (!bridges || strcmp(bridges->path, path)) {
		bridges = fresh = read_bridges(path);
		struct simulated_bridges *none = NULL;
		if (fresh && __atomic_compare_exchange_n(&kept, &none, fresh, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
			fresh = NULL; /* kept now, never freed: one per process */
	}
	int same = -1;
	if (bridges && a >= 0 && a < MAX_SIMULATED_GPUS && b >= 0 && b < MAX_SIMULATED_GPUS && bridges->name[a][0] &&
	    bridges->name[b][0])
		same = !strcmp(bridges->name[a], bridges->name[b]);
	free(fresh);
	return same;
}
#endif

/* Whether GPUs `k` and `j` of `gpu_nodes` cross the same PCIe switch or host bridge on
 * their way to host memory, `k_share` being how many GPUs share k's (gpus_sharing_bridge);
 * 1 or 0. In simulation, by the machine file's "through" links; on a real machine, when
 * the bridge where the two meet is shared by exactly that many GPUs. */
static int same_bridge(const unsigned *gpu_nodes, int k, int j, int k_share)
{
	if (j == k)
		return 1;
#ifdef STARPU_SIMGRID
	int simulated = simulated_same_bridge(starpu_memory_node_get_devid(gpu_nodes[k]),
					      starpu_memory_node_get_devid(gpu_nodes[j]));
	if (simulated >= 0)
		return simulated;
#endif
	int bus = starpu_bus_get_id((int)gpu_nodes[k], (int)gpu_nodes[j]);
	return k_share >= 2 && bus >= 0 && starpu_bus_get_ngpus(bus) == k_share;
}

/* How many GPUs share the nearest PCIe switch or host bridge of GPU `k` of `gpu_nodes` on
 * its way to host memory, as StarPU reports it for peer copies: for each other GPU, the
 * number of GPUs below the bridge the two meet at (hwloc's common ancestor on a real
 * machine, the machine file's "through" link in simulation; 1 for a direct NVLink, which
 * says nothing about the host side). The smallest count of 2 or more is GPU k's own
 * bridge; none: the GPU has its link to itself. StarPU measured each link alone, and a
 * bridge is taken to carry one GPU link's bandwidth (an x16 uplink), so a GPU's share is
 * its rate over that count. On a real machine the common ancestor may be a whole socket
 * rather than a bridge, which overstates sharing: then the bound is looser, still a
 * bound. */
static int gpus_sharing_bridge(const unsigned *gpu_nodes, int k, int ngpus)
{
#ifdef STARPU_SIMGRID
	int simulated = 0;
	for (int j = 0; j < ngpus && simulated >= 0; j++) {
		int same = j == k ? 1
				  : simulated_same_bridge(starpu_memory_node_get_devid(gpu_nodes[k]),
							  starpu_memory_node_get_devid(gpu_nodes[j]));
		simulated = same < 0 ? -1 : simulated + same;
	}
	if (simulated > 0)
		return simulated;
#endif
	int share = 1;
	for (int j = 0; j < ngpus; j++) {
		if (j == k)
			continue;
		int bus = starpu_bus_get_id((int)gpu_nodes[k], (int)gpu_nodes[j]);
		int n = bus >= 0 ? starpu_bus_get_ngpus(bus) : 0;
		if (n >= 2 && (share == 1 || n < share))
			share = n;
	}
	return share;
}

void _dos_gpu_link_shares(const unsigned *nodes, int ngpus, double *h2d, double *d2h, int *link)
{
	for (int k = 0; k < ngpus; k++) {
		int share = gpus_sharing_bridge(nodes, k, ngpus);
		h2d[k] = link_rate(STARPU_MAIN_RAM, nodes[k]) / share;
		d2h[k] = link_rate(nodes[k], STARPU_MAIN_RAM) / share;
		if (link) { /* the first GPU behind the same bridge names it */
			link[k] = k;
			for (int j = 0; j < k && link[k] == k; j++)
				if (same_bridge(nodes, k, j, share))
					link[k] = link[j];
		}
	}
}

static double safety_bytes(unsigned node, double fraction, double max_bytes)
{
	return fmin((double)starpu_memory_get_total(node) * fraction, max_bytes);
}

double _dos_gpu_budget_bytes(unsigned node, double reserved_gpu_bytes)
{
	double total = (double)starpu_memory_get_total(node);
	return fmax(0.0, total - safety_bytes(node, GPU_SAFETY_FRACTION, GPU_SAFETY_MAX_BYTES) - reserved_gpu_bytes);
}

/* StarPU 1.4 (src/datawizard/malloc.c) carves every GPU buffer of at most 4 MiB out of
 * 32 MiB chunks, in blocks of 16 KiB, and charges the GPU's memory for whole chunks,
 * unless STARPU_SUBALLOCATOR=0. A subgroup of 8e5 parameters has 3.2 MB fp32 buffers: ten
 * to a chunk, 4.9 % more than their size, which a plan counting bytes exactly overran on
 * a full GPU: resident state, pinned there, left the staged updates no room, and StarPU
 * waited forever (simulated 8e9 parameters in subgroups of 8e5 on one h100-pcie5). */
#define SUBALLOC_CHUNK_BYTES (32.0 * 1048576.0)
#define SUBALLOC_MAX_BYTES (SUBALLOC_CHUNK_BYTES / 8)
#define SUBALLOC_BLOCK_BYTES (16.0 * 1024.0)

double _dos_gpu_charged_bytes(double bytes)
{
	static int suballocator = -1; /* read once, as StarPU does at its start */
	if (suballocator < 0) {
		const char *env = getenv("STARPU_SUBALLOCATOR");
		suballocator = !(env && atoi(env) == 0);
	}
	if (!suballocator || bytes <= 0 || bytes > SUBALLOC_MAX_BYTES)
		return bytes;
	double per_chunk = floor(SUBALLOC_CHUNK_BYTES / (ceil(bytes / SUBALLOC_BLOCK_BYTES) * SUBALLOC_BLOCK_BYTES));
	return SUBALLOC_CHUNK_BYTES / per_chunk;
}

double _dos_gpu_staging_margin_bytes(unsigned node)
{
	return fmax(0.0, safety_bytes(node, GPU_STAGING_SAFETY_FRACTION, GPU_STAGING_SAFETY_MAX_BYTES) -
				 safety_bytes(node, GPU_SAFETY_FRACTION, GPU_SAFETY_MAX_BYTES));
}

/* The node's GPUs and their links all together (cost_model.h: for the bound). */
static void measure_node_links(unsigned sched_ctx, struct dos_machine_costs *out)
{
	unsigned nodes[STARPU_MAXNODES];
	double h2d[STARPU_MAXNODES], d2h[STARPU_MAXNODES];
	out->ngpus = _dos_context_gpu_nodes(sched_ctx, nodes, STARPU_MAXNODES);
	_dos_gpu_link_shares(nodes, out->ngpus, h2d, d2h, NULL);
	out->node_h2d_bytes_per_second = out->node_d2h_bytes_per_second = 0;
	for (int k = 0; k < out->ngpus; k++) {
		out->node_h2d_bytes_per_second += h2d[k];
		out->node_d2h_bytes_per_second += d2h[k];
	}
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
		out->gpu_budget_bytes = _dos_gpu_budget_bytes(node, reserved_gpu_bytes);
		out->staging_margin_bytes = _dos_gpu_staging_margin_bytes(node);
	}
	measure_node_links(sched_ctx, out);
	return 0;
}

/* The fixed cost of a task on `worker` (seconds), from the predictions at two sizes; 0
 * when it cannot be told. */
static double fixed_task_seconds(struct starpu_task *big, double big_params, struct starpu_task *small,
				 double small_params, int worker, unsigned sched_ctx)
{
	if (worker < 0 || !(small_params > 0 && small_params < big_params))
		return 0.0;
	struct starpu_perfmodel_arch *arch = starpu_worker_get_perf_archtype(worker, sched_ctx);
	double t_big = starpu_task_expected_length(big, arch, 0) * 1e-6;
	double t_small = starpu_task_expected_length(small, arch, 0) * 1e-6;
	if (!isfinite(t_big) || !isfinite(t_small) || t_big <= 0 || t_small <= 0)
		return 0.0;
	double slope = (t_big - t_small) / (big_params - small_params);
	double fixed = t_small - slope * small_params;
	return fixed > 0 ? fmin(fixed, t_small) : 0.0;
}

void _dos_measure_task_costs(struct starpu_task *big, double big_params, struct starpu_task *small, double small_params,
			     unsigned sched_ctx, struct dos_machine_costs *out)
{
	int cpu = _dos_first_worker_of_type(sched_ctx, STARPU_CPU_WORKER);
	int gpu = _dos_first_worker_of_type(sched_ctx, STARPU_CUDA_WORKER);
	out->cpu_task_seconds = fixed_task_seconds(big, big_params, small, small_params, cpu, sched_ctx);
	out->gpu_task_seconds = fixed_task_seconds(big, big_params, small, small_params, gpu, sched_ctx);
}

/* dos_bound_update_seconds and dos_bound_update_whole_subgroups_seconds (named `api` in
 * errors). */
static int bound_update_seconds(const char *api, unsigned sched_ctx, double params, double subgroup_params,
				enum dos_dtype grad_dtype, enum dos_dtype weight_dtype, int grads_on_gpu,
				int weights_on_gpu, int whole_subgroups, double *seconds)
{
	if (!seconds)
		return _dos_fail(-EINVAL, api, "seconds is NULL");
	if (!(params >= 1 && params < 1e15))
		return _dos_fail(-EINVAL, api, "params = %g must be in [1, 1e15)", params);
	if (!(subgroup_params >= 1 && subgroup_params <= 4294967295.0 && subgroup_params <= params))
		return _dos_fail(-EINVAL, api, "subgroup_params = %g must be in [1, min(params, 2^32 - 1)]",
				 subgroup_params);
	int err;
	if ((err = _dos_check_dtype(api, "grad_dtype", grad_dtype, 0)) ||
	    (err = _dos_check_dtype(api, "weight_dtype", weight_dtype, 0)) ||
	    (err = _dos_check_sched_ctx(api, "sched_ctx", sched_ctx)))
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
			.grads_homed_on_host = grads_on_gpu == 0,
			.weights_homed_on_host = weight_dtype != DOS_FP32 && weights_on_gpu == 0,
		};
		struct dos_machine_costs m;
		int calibrated;
		/* gradients and 16-bit weights that live on the GPU are not the optimizer's room */
		double homed = params * ((homes.grads_on_gpu ? homes.grad_bytes_per_param : 0.0) +
					 (homes.weights_on_gpu ? homes.weight_bytes_per_param : 0.0));
		_dos_measure_costs(probe, subgroup_params, sched_ctx, &homes, homed, &m, &calibrated);
		if (!calibrated)
			err = _dos_fail(-ENODATA, api,
					"StarPU's dos_adam perfmodel has no measurements for subgroups of %g params on "
					"this machine yet: a bound from default rates would mean nothing",
					subgroup_params);
		int count = (int)ceil(params / subgroup_params);
		struct dos_plan_subgroup *sg = err ? NULL : malloc((size_t)count * sizeof *sg);
		if (!err && !sg)
			err = _dos_fail(-ENOMEM, api, "out of memory for %d subgroups", count);
		if (!err) {
			for (int i = 0; i < count; i++)
				sg[i] = (struct dos_plan_subgroup){
					.params = fmin(subgroup_params, params - (double)i * subgroup_params),
					.resident_now = 0};
			*seconds = whole_subgroups ? _dos_bound_whole_subgroups_seconds(&m, sg, count)
						   : _dos_bound_seconds(&m, sg, count, NULL);
		}
		free(sg);
		probe->destroy = 0; /* never submitted */
		starpu_task_destroy(probe);
	}
	for (int b = 0; b < 5; b++)
		starpu_data_unregister_no_coherency(h[b]);
	return err;
}

int dos_bound_update_seconds(unsigned sched_ctx, double params, double subgroup_params, enum dos_dtype grad_dtype,
			     enum dos_dtype weight_dtype, int grads_on_gpu, int weights_on_gpu, double *seconds)
{
	return bound_update_seconds(__func__, sched_ctx, params, subgroup_params, grad_dtype, weight_dtype,
				    grads_on_gpu, weights_on_gpu, 0, seconds);
}

int dos_bound_update_whole_subgroups_seconds(unsigned sched_ctx, double params, double subgroup_params,
					     enum dos_dtype grad_dtype, enum dos_dtype weight_dtype, int grads_on_gpu,
					     int weights_on_gpu, double *seconds)
{
	return bound_update_seconds(__func__, sched_ctx, params, subgroup_params, grad_dtype, weight_dtype,
				    grads_on_gpu, weights_on_gpu, 1, seconds);
}
