/* sim-check: one optimizer step of N subgroups, each a dos_adam task, on the machine StarPU
 * runs on; prints the makespan, the tasks per worker and the bytes moved per link. Built
 * against StarPU's SimGrid variant (main() is renamed by starpu.h and run inside the
 * simulator), it checks a simulated machine of sched/machines/ against the numbers it was
 * built from: starpu_timing_now() is then simulated time and no buffer is ever touched. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <starpu.h>

#include "bench.h"
#include "dos.h"
#include "errors.h"

static const char usage[] =
	"usage: sim-check [--subgroups N] [--size S] [--where cpu|cuda|any] [--g16-home host|cuda]\n"
	"                 [--no-writeback]\n"
	"  --subgroups N    subgroups, one dos_adam task each (default 50)\n"
	"  --size S         parameters per subgroup, e.g. 1e8 (default 1e8)\n"
	"  --where W        where the tasks may run (default any)\n"
	"  --g16-home H     home of the fp16 gradients and bf16 weights: the GPU, as in training\n"
	"                   (default when there is a CUDA worker), or host memory\n"
	"  --no-writeback   leave updated fp32 state where it was updated (default: each\n"
	"                   subgroup's written buffers go back to their home node after its task)\n"
	"The fp32 state (master, m, v) always starts in host memory.\n";

/* Under SimGrid, main() runs as a simulated actor: exit() there makes the simulator
 * complain at length, so leave without the atexit handlers. */
static void quit(int status) __attribute__((noreturn));
static void quit(int status)
{
	fflush(stdout);
	fflush(stderr);
	_exit(status);
}

static void usage_error(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void usage_error(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	bench_vreport("sim-check", 2, usage, fmt, ap);
	va_end(ap);
	quit(2);
}

static void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	bench_vreport("sim-check", 1, NULL, fmt, ap);
	va_end(ap);
	quit(1);
}

enum g16_home { G16_DEFAULT, G16_HOST, G16_CUDA };

struct options {
	unsigned subgroups;
	uint32_t size;
	uint32_t where; /* STARPU_CPU, STARPU_CUDA, or 0 for the codelet's own */
	enum g16_home g16_home;
	int writeback;
};

static double parse_count(const char *name, const char *text, double max)
{
	double x;
	if (bench_parse_count(text, 1, max, &x))
		usage_error("%s %s: expected a whole number in [1, %.0f]", name, text, max);
	return x;
}

static uint32_t parse_where(const char *value)
{
	if (!strcmp(value, "cpu"))
		return STARPU_CPU;
	if (!strcmp(value, "cuda"))
		return STARPU_CUDA;
	if (!strcmp(value, "any"))
		return 0;
	usage_error("--where %s: expected cpu, cuda or any", value);
}

static enum g16_home parse_g16_home(const char *value)
{
	if (!strcmp(value, "host"))
		return G16_HOST;
	if (!strcmp(value, "cuda"))
		return G16_CUDA;
	usage_error("--g16-home %s: expected host or cuda", value);
}

static void parse_options(int argc, char **argv, struct options *o)
{
	*o = (struct options){.subgroups = 50, .size = 100000000, .where = 0, .writeback = 1};
	for (int i = 1; i < argc; i++) {
		const char *arg = argv[i];
		if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
			fputs(usage, stdout);
			quit(0);
		}
		if (!strcmp(arg, "--no-writeback")) {
			o->writeback = 0;
			continue;
		}
		if (i + 1 >= argc)
			usage_error("%s: unknown option or missing value", arg);
		const char *value = argv[++i];
		if (!strcmp(arg, "--subgroups"))
			o->subgroups = (unsigned)parse_count(arg, value, 1e6);
		else if (!strcmp(arg, "--size")) /* the codelets count elements in 32 bits */
			o->size = (uint32_t)parse_count(arg, value, UINT32_MAX);
		else if (!strcmp(arg, "--where"))
			o->where = parse_where(value);
		else if (!strcmp(arg, "--g16-home"))
			o->g16_home = parse_g16_home(value);
		else
			usage_error("%s: unknown option", arg);
	}
}

/* ---- buffers ----------------------------------------------------------------------- */

enum { MASTER, MOMENT1, MOMENT2, GRAD, WEIGHT16, NBUFS };
static const size_t elem_size[NBUFS] = {4, 4, 4, 2, 2};
static const char *const buf_name[NBUFS] = {"master", "m", "v", "grad", "weight16"};

struct subgroup {
	void *host_ptr[NBUFS]; /* NULL for buffers allocated on the GPU */
	uintptr_t gpu_ptr[NBUFS];
	starpu_data_handle_t h[NBUFS];
};

/* Host buffers are folded under SimGrid (one small file mapped over and over: 5e9 params
 * of state cost no memory) and pinned, as the optimizer state of a real run is. */
#define HOST_FLAGS (STARPU_MALLOC_PINNED | STARPU_MALLOC_SIMULATION_FOLDED)
/* GPU buffers are counted against the GPU's memory, as StarPU's own allocations are. */
#define GPU_FLAGS STARPU_MALLOC_COUNT

static void register_subgroup(struct subgroup *g, uint32_t n, int gpu_node)
{
	for (int b = 0; b < NBUFS; b++) {
		size_t bytes = (size_t)n * elem_size[b];
		int on_gpu = (b == GRAD || b == WEIGHT16) && gpu_node >= 0;
		int home = on_gpu ? gpu_node : STARPU_MAIN_RAM;
		uintptr_t ptr;
		if (on_gpu) {
			g->gpu_ptr[b] = starpu_malloc_on_node_flags((unsigned)gpu_node, bytes, GPU_FLAGS);
			if (!g->gpu_ptr[b])
				die("no GPU memory for a %zu-byte %s buffer (STARPU_LIMIT_CUDA_MEM?)", bytes,
				    buf_name[b]);
			ptr = g->gpu_ptr[b];
		} else {
			if (starpu_malloc_flags(&g->host_ptr[b], bytes, HOST_FLAGS) != 0)
				die("no host memory for a %zu-byte %s buffer", bytes, buf_name[b]);
			ptr = (uintptr_t)g->host_ptr[b];
		}
		starpu_vector_data_register(&g->h[b], home, ptr, n, elem_size[b]);
	}
}

static void unregister_subgroup(struct subgroup *g, uint32_t n, int gpu_node)
{
	for (int b = 0; b < NBUFS; b++) {
		size_t bytes = (size_t)n * elem_size[b];
		starpu_data_unregister(g->h[b]);
		if (g->host_ptr[b])
			starpu_free_flags(g->host_ptr[b], bytes, HOST_FLAGS);
		else
			starpu_free_on_node_flags((unsigned)gpu_node, g->gpu_ptr[b], bytes, GPU_FLAGS);
	}
}

/* ---- tasks ------------------------------------------------------------------------- */

static unsigned tasks_on_worker[STARPU_NMAXWORKERS];

static void count_task(void *arg)
{
	(void)arg;
	int worker = starpu_worker_get_id();
	if (worker >= 0)
		__atomic_fetch_add(&tasks_on_worker[worker], 1, __ATOMIC_RELAXED);
}

static void release_on_home(void *arg)
{
	starpu_data_handle_t h = arg;
	starpu_data_release_on_node(h, starpu_data_get_home_node(h));
}

static struct starpu_task *adam_task(const struct dos_adam_step *step, struct subgroup *g)
{
	struct starpu_task *task;
	int err = dos_adam_task_create(step, g->h[MASTER], g->h[MOMENT1], g->h[MOMENT2], g->h[GRAD], DOS_FP16,
				       g->h[WEIGHT16], DOS_BF16, &task);
	if (err)
		die("dos_adam_task_create: %s", dos_last_error());
	return task;
}

/* What the perfmodels predict for one task on the first worker of each kind (ms), or NAN. */
static double predicted_ms(struct starpu_task *task, enum starpu_worker_archtype type)
{
	int worker;
	if (starpu_worker_get_ids_by_type(type, &worker, 1) < 1)
		return NAN;
	struct starpu_perfmodel_arch *arch = starpu_worker_get_perf_archtype(worker, STARPU_NMAX_SCHED_CTXS);
	return starpu_task_expected_length(task, arch, 0) / 1e3;
}

/* "NUMA0", "CUDA0": StarPU's memory node name without its space, one field for awk. */
static void node_name(int node, char *name, size_t size)
{
	char spaced[32];
	starpu_memory_node_get_name((unsigned)node, spaced, sizeof spaced);
	size_t j = 0;
	for (size_t i = 0; spaced[i] && j + 1 < size; i++)
		if (spaced[i] != ' ')
			name[j++] = spaced[i];
	name[j] = '\0';
}

static const char *where_name(uint32_t where)
{
	return where == STARPU_CPU ? "cpu" : where == STARPU_CUDA ? "cuda" : "any";
}

int main(int argc, char **argv)
{
	struct options o;
	parse_options(argc, argv, &o);

	char why[900];
	int init_err = starpu_init(NULL);
	if (init_err != 0)
		die("%s", _dos_starpu_init_explained(init_err, "starpu_init", why, sizeof why));
	starpu_profiling_status_set(STARPU_PROFILING_ENABLE);

	int ncpu = (int)starpu_worker_get_count_by_type(STARPU_CPU_WORKER);
	int ncuda = (int)starpu_worker_get_count_by_type(STARPU_CUDA_WORKER);
	int gpu_node = -1;
	if (o.g16_home == G16_CUDA || (o.g16_home == G16_DEFAULT && ncuda > 0)) {
		int worker;
		if (starpu_worker_get_ids_by_type(STARPU_CUDA_WORKER, &worker, 1) < 1)
			usage_error("--g16-home cuda: there is no CUDA worker");
		gpu_node = (int)starpu_worker_get_memory_node((unsigned)worker);
	}
	if ((o.where == STARPU_CPU && ncpu == 0) || (o.where == STARPU_CUDA && ncuda == 0))
		usage_error("--where %s: there is no such worker", where_name(o.where));

	struct dos_adam_hparams hp = {
		.mode = DOS_ADAMW, .lr = 1e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
	struct dos_adam_step step;
	if (dos_adam_step_init(&step, &hp, 1, 1.0) != 0)
		die("dos_adam_step_init: %s", dos_last_error());

	struct subgroup *groups = calloc(o.subgroups, sizeof *groups);
	if (!groups)
		die("out of memory");
	for (unsigned i = 0; i < o.subgroups; i++)
		register_subgroup(&groups[i], o.size, gpu_node);

	double start = starpu_timing_now();
	for (unsigned i = 0; i < o.subgroups; i++) {
		struct starpu_task *task = adam_task(&step, &groups[i]);
		if (o.where)
			task->where = (int32_t)o.where;
		task->callback_func = count_task;
		int err = starpu_task_submit(task);
		if (err)
			die("starpu_task_submit: %d (%s)", err, err == -ENODEV ? "no worker can run it" : "?");
		if (!o.writeback)
			continue;
		/* Each written buffer goes back home once its task is done, as an offloaded
		 * optimizer needs: updated state to host memory, new 16-bit weights to the GPU. */
		static const int written[] = {MASTER, MOMENT1, MOMENT2, WEIGHT16};
		for (size_t k = 0; k < sizeof written / sizeof written[0]; k++) {
			starpu_data_handle_t h = groups[i].h[written[k]];
			if (starpu_data_acquire_on_node_cb(h, starpu_data_get_home_node(h), STARPU_R, release_on_home,
							   h) != 0)
				die("starpu_data_acquire_on_node_cb failed");
		}
	}
	starpu_task_wait_for_all();
	/* Waits for the last write-backs, whose callbacks tasks do not wait for. */
	for (unsigned i = 0; i < o.subgroups; i++)
		for (int b = 0; b < NBUFS; b++) {
			int home = starpu_data_get_home_node(groups[i].h[b]);
			starpu_data_acquire_on_node(groups[i].h[b], home, STARPU_R);
			starpu_data_release_on_node(groups[i].h[b], home);
		}
	double makespan = (starpu_timing_now() - start) / 1e6;

	/* The models are loaded by now: ask them about one more (never submitted) task. */
	struct starpu_task *probe = adam_task(&step, &groups[0]);
	double cpu_ms = predicted_ms(probe, STARPU_CPU_WORKER);
	double cuda_ms = predicted_ms(probe, STARPU_CUDA_WORKER);
	probe->destroy = 0;
	starpu_task_destroy(probe);

	const char *host = getenv("STARPU_HOSTNAME");
	struct starpu_sched_policy *policy = starpu_sched_ctx_get_sched_policy(0); /* the initial context */
#ifdef STARPU_SIMGRID
	const char *mode = "simulated (SimGrid)";
#else
	const char *mode = "real";
#endif
	printf("# sim-check: machine %s, %s time, scheduler %s, %d CPU + %d CUDA workers\n",
	       host ? host : "(this host)", mode, policy && policy->policy_name ? policy->policy_name : "?", ncpu,
	       ncuda);
	printf("# %u subgroups x %u params, where %s; fp32 state homed in host memory, fp16 grads and bf16 "
	       "weights in %s; write-back %s\n",
	       o.subgroups, o.size, where_name(o.where), gpu_node >= 0 ? "GPU memory" : "host memory",
	       o.writeback ? "after each task" : "off");
	printf("makespan_s %.6f\n", makespan);
	printf("per_subgroup_ms %.3f\n", makespan * 1e3 / o.subgroups);
	printf("model_ms_per_task cpu %.3f cuda %.3f\n", cpu_ms, cuda_ms);
	for (int bus = 0; bus < starpu_bus_get_count(); bus++) {
		struct starpu_profiling_bus_info info;
		if (starpu_bus_get_profiling_info(bus, &info) != 0)
			continue;
		char src[32], dst[32];
		node_name(starpu_bus_get_src(bus), src, sizeof src);
		node_name(starpu_bus_get_dst(bus), dst, sizeof dst);
		printf("bus %s->%s bytes %lld transfers %d\n", src, dst, info.transferred_bytes, info.transfer_count);
	}
	for (unsigned w = 0; w < starpu_worker_get_count(); w++) {
		char name[64];
		starpu_worker_get_name((int)w, name, sizeof name);
		printf("worker %u %s tasks %u\n", w, name, tasks_on_worker[w]);
	}

	for (unsigned i = 0; i < o.subgroups; i++)
		unregister_subgroup(&groups[i], o.size, gpu_node);
	free(groups);
	starpu_shutdown();
	return 0;
}
