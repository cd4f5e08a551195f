/* dos-bench optimizer: the optimizer phase of one training step (every subgroup's Adam
 * update) under several scheduling policies, one after the other in one run, so that they
 * meet the same machine, the same data layout and the same StarPU settings; one table at
 * the end. Simulated machines (StarPU's SimGrid build) run it unchanged. */
#define _GNU_SOURCE /* dladdr */
#include "config.h"

#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <starpu.h>

#include "bench.h"
#include "dos.h"
#include "dos_policy.h"

#define MAX_POLICIES 32
#define MAX_POLICY_NAME 64
#define MAX_STEPS 1000
#define MAX_SUBGROUPS 1000000
/* Share of the available memory the state may use natively; the rest is left to everyone else. */
#define MEMORY_HEADROOM 0.8
/* Folded (simulated) allocations map one file of this many MiB again and again; Linux
 * allows vm.max_map_count = 65530 mappings per process by default, so bigger states need a
 * bigger file: keep below this many mappings. */
#define MAX_FOLDED_MAPPINGS 16384.0

static const char usage[] =
	"usage: dos-bench optimizer [--params P] [--subgroup S] [--grad fp16|bf16|fp32]\n"
	"           [--weight fp16|bf16|none] [--steps K] [--policies p1,p2,...] [--gpu-mem-mib M]\n"
	"           [--homes host|gpu]\n";

/* The baselines every row is compared with, in the order of the table's columns. */
static const char *const baseline_names[] = {"dmda", "all-cpu", "stride"};
#define NBASELINES ((int)(sizeof baseline_names / sizeof baseline_names[0]))

/* ---- Options ------------------------------------------------------------------------ */

struct options {
	double params;   /* per rank */
	double subgroup; /* params per subgroup (the last one may be smaller) */
	enum dos_dtype grad;
	int has_weight; /* 0: training in fp32, no 16-bit working copy */
	enum dos_dtype weight;
	int steps;
	int npolicies;
	char policies[MAX_POLICIES][MAX_POLICY_NAME];
	long gpu_mem_mib; /* -1: leave STARPU_LIMIT_CUDA_MEM as the environment has it */
	/* where gradients and 16-bit weights live: 1 = on the GPU, as in training (backward
	 * writes gradients there, forward reads the weights there); 0 = host memory */
	int homes_on_gpu;
};

/* Prints the message and the usage; returns the exit status of a bad command line. */
static int bad_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int bad_usage(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	bench_vreport("dos-bench optimizer", 2, usage, fmt, ap);
	va_end(ap);
	return 2;
}

/* A failure after the command line was accepted: nothing sensible is left to measure. */
static void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	bench_vreport("dos-bench optimizer", 1, NULL, fmt, ap);
	va_end(ap);
	exit(1);
}

/* A whole number in [min, max], written as an integer or in floating-point notation (5e9). */
static int parse_count(const char *option, const char *text, double min, double max, double *out)
{
	if (bench_parse_count(text, min, max, out))
		return bad_usage("%s %s: expected a whole number in [%.0f, %.0f]", option, text, min, max);
	return 0;
}

static int parse_dtype(const char *option, const char *text, int allow_fp32, int allow_none, enum dos_dtype *out,
		       int *present)
{
	static const enum dos_dtype all[] = {DOS_FP16, DOS_BF16, DOS_FP32};
	for (size_t k = 0; k < sizeof all / sizeof all[0]; k++)
		if (!strcmp(text, dos_dtype_name(all[k])) && (all[k] != DOS_FP32 || allow_fp32)) {
			*out = all[k];
			*present = 1;
			return 0;
		}
	if (allow_none && !strcmp(text, "none")) {
		*present = 0;
		return 0;
	}
	return bad_usage("%s %s: expected %s", option, text, allow_fp32 ? "fp16, bf16 or fp32" : "fp16, bf16 or none");
}

static int parse_policies(const char *text, struct options *o)
{
	o->npolicies = 0;
	for (const char *item = text;; item++) {
		size_t len = strcspn(item, ",");
		if (len == 0 || len >= MAX_POLICY_NAME)
			return bad_usage("--policies %s: '%.*s' is not a policy name (1 to %d characters)", text,
					 (int)len, item, MAX_POLICY_NAME - 1);
		if (o->npolicies == MAX_POLICIES)
			return bad_usage("--policies %s: more than %d policies", text, MAX_POLICIES);
		snprintf(o->policies[o->npolicies++], MAX_POLICY_NAME, "%.*s", (int)len, item);
		item += len;
		if (*item == '\0')
			return 0;
	}
}

static int parse_options(int argc, char **argv, struct options *o)
{
	static const char *const known[] = {"--params", "--subgroup", "--grad",        "--weight",
					    "--steps",  "--policies", "--gpu-mem-mib", "--homes"};
	const char *policies = "dos,all-cpu,stride,resident,dmda,dmdas,eager,lws";
	double steps = 3, mib = -1;
	int err = 0, grad_present;
	*o = (struct options){.params = 1e9, .subgroup = 1e8, .grad = DOS_FP16, .has_weight = 1, .weight = DOS_BF16};
	for (int i = 2; i < argc && !err; i++) {
		const char *arg = argv[i], *eq = strchr(arg, '=');
		if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
			fputs(usage, stdout);
			exit(0);
		}
		/* "--name value" or "--name=value" */
		size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
		const char *name = NULL;
		for (size_t k = 0; k < sizeof known / sizeof known[0]; k++)
			if (strlen(known[k]) == len && !strncmp(arg, known[k], len))
				name = known[k];
		if (!name) {
			err = bad_usage("unknown option '%s'", arg);
			break;
		}
		const char *value = eq ? eq + 1 : i + 1 < argc ? argv[++i] : "";
		if (!*value)
			err = bad_usage("%s: missing value", name);
		else if (!strcmp(name, "--params"))
			err = parse_count(name, value, 1, 1e13, &o->params);
		else if (!strcmp(name, "--subgroup")) /* the codelets count elements in 32 bits */
			err = parse_count(name, value, 1, UINT32_MAX, &o->subgroup);
		else if (!strcmp(name, "--grad"))
			err = parse_dtype(name, value, 1, 0, &o->grad, &grad_present);
		else if (!strcmp(name, "--weight"))
			err = parse_dtype(name, value, 0, 1, &o->weight, &o->has_weight);
		else if (!strcmp(name, "--steps"))
			err = parse_count(name, value, 1, MAX_STEPS, &steps);
		else if (!strcmp(name, "--policies"))
			policies = value;
		else if (!strcmp(name, "--homes")) {
			o->homes_on_gpu = !strcmp(value, "gpu");
			if (!o->homes_on_gpu && strcmp(value, "host"))
				err = bad_usage("--homes %s: expected host or gpu", value);
		} else
			err = parse_count(name, value, 0, 1 << 30, &mib);
	}
	if (!err)
		err = parse_policies(policies, o);
	double gpu_homed_mib = o->params * (double)(dos_dtype_size(o->grad) + (o->has_weight ? 2 : 0)) / 1048576.0;
	if (!err && o->homes_on_gpu && mib > 0 && gpu_homed_mib > mib)
		err = bad_usage("--homes gpu keeps %.0f MiB of gradients and 16-bit weights on the GPU, more than "
				"--gpu-mem-mib %.0f",
				gpu_homed_mib, mib);
	if (!err && ceil(o->params / o->subgroup) > MAX_SUBGROUPS)
		err = bad_usage("--params %.0f with --subgroup %.0f: %.0f subgroups, more than %d", o->params,
				o->subgroup, ceil(o->params / o->subgroup), MAX_SUBGROUPS);
	o->steps = (int)steps;
	o->gpu_mem_mib = (long)mib; /* -1 when not given */
	return err;
}

/* ---- Environment and policies ---------------------------------------------------------- */

/* Path of the loaded libstarpu-dos, or NULL when it is linked statically into the program. */
static const char *loaded_library_path(void)
{
	Dl_info info;
	if (!dladdr((void *)dos_version_string, &info) || !info.dli_fname || !strstr(info.dli_fname, ".so"))
		return NULL;
	return info.dli_fname;
}

/* StarPU's hook into a policy library: NULL when `path` cannot be loaded or lacks it. */
typedef struct starpu_sched_policy *(*sched_lib_lookup_fn)(const char *name);
static sched_lib_lookup_fn sched_lib_lookup(const char *path)
{
	void *lib = path ? dlopen(path, RTLD_NOW) : NULL;
	sched_lib_lookup_fn fn = NULL;
	if (lib)
		*(void **)&fn = dlsym(lib, "starpu_get_sched_lib_policy");
	return fn; /* the library stays loaded: StarPU will open it too */
}

/* Points StarPU at our policies (dos, all-cpu, stride, resident) unless the user chose a
 * library; returns a note for the header. */
static const char *set_sched_lib(char *note, size_t size)
{
	const char *user = getenv("STARPU_SCHED_LIB");
	if (user) {
		snprintf(note, size, "%s (from the environment)%s", user,
			 sched_lib_lookup(user) ? "" : ": cannot be loaded or lacks starpu_get_sched_lib_policy");
		return note;
	}
	const char *ours = loaded_library_path();
	if (!ours)
		snprintf(note, size, "unset (libstarpu-dos is linked statically: no library to name)");
	else if (!sched_lib_lookup(ours))
		/* Naming a library without the hook would only make StarPU warn at every lookup. */
		snprintf(note, size, "unset (%s has no starpu_get_sched_lib_policy yet)", ours);
	else if (setenv("STARPU_SCHED_LIB", ours, 1) != 0)
		die("setenv STARPU_SCHED_LIB: %s", strerror(errno));
	else
		snprintf(note, size, "%s (set by dos-bench)", ours);
	return note;
}

/* Whether StarPU will find `name`: an unknown name would make it warn and silently run
 * its default policy instead, which must never end up in the table under that name. */
static int policy_exists(const char *name)
{
	sched_lib_lookup_fn lookup = sched_lib_lookup(getenv("STARPU_SCHED_LIB"));
	if (lookup && lookup(name))
		return 1;
	for (struct starpu_sched_policy **p = starpu_sched_get_predefined_policies(); *p; p++)
		if ((*p)->policy_name && !strcmp((*p)->policy_name, name))
			return 1;
	return 0;
}

static void print_env(const char *name, const char *when_unset)
{
	const char *value = getenv(name);
	printf("#   %-30s %s\n", name, value ? value : when_unset);
}

/* Under SimGrid the state is folded (no real memory); size the folding file so that the
 * number of mappings stays under the kernel's limit. */
static void size_simulation_folding(double state_bytes)
{
#ifdef STARPU_SIMGRID
	if (getenv("STARPU_MALLOC_SIMULATION_FOLD"))
		return;
	unsigned long mib = 1;
	while ((double)mib * 1048576.0 * MAX_FOLDED_MAPPINGS < state_bytes)
		mib *= 2;
	char text[32];
	snprintf(text, sizeof text, "%lu", mib);
	setenv("STARPU_MALLOC_SIMULATION_FOLD", text, 1);
#else
	(void)state_bytes;
#endif
}

#ifndef STARPU_SIMGRID
/* MemAvailable counts reclaimable page cache, which free pages alone do not. */
static double available_memory_bytes(void)
{
	FILE *f = fopen("/proc/meminfo", "r");
	char line[256];
	unsigned long long kib;
	double bytes = NAN;
	while (f && fgets(line, sizeof line, f))
		if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
			bytes = (double)kib * 1024.0;
			break;
		}
	if (f)
		fclose(f);
	return bytes;
}
#endif

/* ---- Subgroups ------------------------------------------------------------------------- */

enum buffer { MASTER, MOMENT1, MOMENT2, GRAD, WEIGHT16, NBUFFERS };

struct subgroup {
	size_t n;
	void *buf[NBUFFERS];
	starpu_data_handle_t h[NBUFFERS];
};

struct state {
	struct subgroup *groups;
	int count;
	size_t elem[NBUFFERS]; /* 0 for an absent buffer */
	int gpu_home;          /* memory node of GPU-homed gradients and weights, or -1 */
};

#ifdef STARPU_SIMGRID
/* Simulated transfers and kernels never touch the data: fold it onto one file. */
#define STATE_MALLOC_FLAGS (STARPU_MALLOC_PINNED | STARPU_MALLOC_SIMULATION_FOLDED)
#else
#define STATE_MALLOC_FLAGS STARPU_MALLOC_PINNED
#endif

static double state_bytes_per_param(const struct options *o)
{
	return 12.0 + (double)dos_dtype_size(o->grad) + (o->has_weight ? (double)dos_dtype_size(o->weight) : 0.0);
}

/* Every buffer homed in main RAM, pinned (after starpu_init, so that StarPU pins it for its
 * CUDA workers). The gradient too: in training, backward produces it on the GPU and a
 * policy that updates on the CPU pays its D2H copy; here it starts on the host, so a GPU
 * update pays an H2D copy instead (2 or 4 B/param). Putting gradients where backward
 * leaves them is the training-graph issue's job. */
/* Zeroes a gradient where it lives, with a task (its memory may be the GPU's). */
static void clear_gradient(starpu_data_handle_t h, enum dos_dtype dtype)
{
	struct starpu_task *task;
	if (dos_grad_scale_task_create(h, dtype, 0.0f, &task) || starpu_task_submit(task))
		die("clearing a gradient: %s", dos_last_error());
}

static void register_state(const struct options *o, struct state *s)
{
	size_t total = (size_t)o->params, per = (size_t)o->subgroup;
	s->count = (int)((total + per - 1) / per);
	s->elem[MASTER] = s->elem[MOMENT1] = s->elem[MOMENT2] = sizeof(float);
	s->elem[GRAD] = dos_dtype_size(o->grad);
	s->elem[WEIGHT16] = o->has_weight ? dos_dtype_size(o->weight) : 0;
	s->groups = calloc((size_t)s->count, sizeof *s->groups);
	if (!s->groups)
		die("out of memory for %d subgroups", s->count);
	int cuda = starpu_worker_get_by_type(STARPU_CUDA_WORKER, 0);
	s->gpu_home = o->homes_on_gpu && cuda >= 0 ? (int)starpu_worker_get_memory_node((unsigned)cuda) : -1;
	for (int g = 0; g < s->count; g++) {
		struct subgroup *sg = &s->groups[g];
		sg->n = g == s->count - 1 ? total - (size_t)g * per : per;
		for (int b = 0; b < NBUFFERS; b++) {
			if (!s->elem[b])
				continue;
			size_t bytes = sg->n * s->elem[b];
			if (s->gpu_home >= 0 && (b == GRAD || b == WEIGHT16)) {
				sg->buf[b] = (void *)starpu_malloc_on_node((unsigned)s->gpu_home, bytes);
				if (!sg->buf[b])
					die("cannot allocate %zu bytes on the GPU for subgroup %d", bytes, g);
				starpu_vector_data_register(&sg->h[b], s->gpu_home, (uintptr_t)sg->buf[b],
							    (uint32_t)sg->n, s->elem[b]);
				if (b == GRAD)
					clear_gradient(sg->h[b], o->grad); /* defined values where they live */
				continue;
			}
			if (starpu_malloc_flags(&sg->buf[b], bytes, STATE_MALLOC_FLAGS) != 0)
				die("cannot allocate %zu bytes for subgroup %d", bytes, g);
#ifndef STARPU_SIMGRID
			/* Real values the kernels see every step: no zero-division shortcuts
			 * (v > 0), no subnormals. */
			memset(sg->buf[b], 0, bytes);
			if (b == MOMENT2)
				for (size_t i = 0; i < sg->n; i++)
					((float *)sg->buf[b])[i] = 1e-6f;
#endif
			starpu_vector_data_register(&sg->h[b], STARPU_MAIN_RAM, (uintptr_t)sg->buf[b], (uint32_t)sg->n,
						    s->elem[b]);
		}
	}
}

static void unregister_state(struct state *s)
{
	for (int g = 0; g < s->count; g++) {
		struct subgroup *sg = &s->groups[g];
		for (int b = 0; b < NBUFFERS; b++) {
			if (!sg->h[b])
				continue;
			/* master, m, v are home after the flush; the gradient was only read;
			 * the 16-bit weights are thrown away, wherever they are */
			if (b == WEIGHT16)
				starpu_data_unregister_no_coherency(sg->h[b]);
			else
				starpu_data_unregister(sg->h[b]);
			if (s->gpu_home >= 0 && (b == GRAD || b == WEIGHT16))
				starpu_free_on_node((unsigned)s->gpu_home, (uintptr_t)sg->buf[b], sg->n * s->elem[b]);
			else
				starpu_free_flags(sg->buf[b], sg->n * s->elem[b], STATE_MALLOC_FLAGS);
		}
	}
	free(s->groups);
	s->groups = NULL;
}

/* ---- One step ------------------------------------------------------------------------- */

/* What the update tasks of the timed steps saw, written from their callbacks. */
struct step_stats {
	unsigned long cpu_tasks, cuda_tasks, other_tasks;
	size_t peak_gpu_bytes; /* largest StarPU allocation total on one CUDA node */
	unsigned cuda_nodes[STARPU_MAXNODES];
	int ncuda_nodes;
	unsigned long tasks_on_gpu[STARPU_MAXNODES]; /* by position in cuda_nodes */
};

/* Position of memory node `node` in st->cuda_nodes, or -1. */
static int cuda_node_index(const struct step_stats *st, unsigned node)
{
	for (int k = 0; k < st->ncuda_nodes; k++)
		if (st->cuda_nodes[k] == node)
			return k;
	return -1;
}

/* StarPU's own count of the bytes it holds on each CUDA node (data replicas and its
 * allocation cache, as accounted by starpu_memory_get_used); sampled when a task ends,
 * which is when the set of live replicas changes. */
static void sample_gpu_memory(struct step_stats *st)
{
	for (int k = 0; k < st->ncuda_nodes; k++) {
		size_t used = starpu_memory_get_used(st->cuda_nodes[k]);
		size_t peak = __atomic_load_n(&st->peak_gpu_bytes, __ATOMIC_RELAXED);
		while (used > peak && !__atomic_compare_exchange_n(&st->peak_gpu_bytes, &peak, used, 0,
								   __ATOMIC_RELAXED, __ATOMIC_RELAXED))
			;
	}
}

static void update_done(void *arg)
{
	struct step_stats *st = arg;
	struct starpu_task *task = starpu_task_get_current();
	/* the worker that ran the task, as profiling recorded it; the callback's own thread
	 * is the same worker in StarPU 1.4 and serves when profiling is off */
	int worker = task && task->profiling_info ? task->profiling_info->workerid : starpu_worker_get_id();
	enum starpu_worker_archtype type = worker >= 0 ? starpu_worker_get_type(worker) : STARPU_ANY_WORKER;
	unsigned long *counter = type == STARPU_CPU_WORKER    ? &st->cpu_tasks
				 : type == STARPU_CUDA_WORKER ? &st->cuda_tasks
							      : &st->other_tasks;
	__atomic_fetch_add(counter, 1, __ATOMIC_RELAXED);
	int k = type == STARPU_CUDA_WORKER ? cuda_node_index(st, starpu_worker_get_memory_node((unsigned)worker)) : -1;
	if (k >= 0)
		__atomic_fetch_add(&st->tasks_on_gpu[k], 1, __ATOMIC_RELAXED);
	sample_gpu_memory(st);
}

static struct dos_adam_step step_scalars(uint64_t step)
{
	/* the published runs' settings (Adam betas 0.9/0.95, weight decay 0.1) */
	static const struct dos_adam_hparams hp = {
		.mode = DOS_ADAMW, .lr = 1e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
	struct dos_adam_step s;
	if (dos_adam_step_init(&s, &hp, step, 1.0))
		die("dos_adam_step_init(step = %llu): %s", (unsigned long long)step, dos_last_error());
	return s;
}

/* Backward of the next step writes new gradients where they live (see register_state).
 * Without this, a GPU copy of the previous step's gradient would stay valid and the GPU
 * updates would read it for free. Acquiring for writing moves no data. */
static void refresh_gradients(struct state *s)
{
	for (int g = 0; g < s->count; g++) {
		starpu_data_handle_t h = s->groups[g].h[GRAD];
		int err = starpu_data_acquire_on_node(h, starpu_data_get_home_node(h), STARPU_W);
		if (err)
			die("starpu_data_acquire (gradient of subgroup %d): %s", g, strerror(-err));
		starpu_data_release(s->groups[g].h[GRAD]);
	}
}

/* One optimizer step: every update task waits for a "gradients ready" task with no
 * codelet, submitted last, so that a policy's submit_hook sees the whole step before any
 * update becomes ready. Returns the seconds from the first submission to the end of the
 * last update (simulated seconds under SimGrid). */
static double run_step(const struct options *o, struct state *s, uint64_t step, struct step_stats *st)
{
	struct dos_adam_step scalars = step_scalars(step);
	refresh_gradients(s);
	struct starpu_task *ready = starpu_task_create();
	ready->cl = NULL;
	ready->name = "gradients_ready";
	double start = starpu_timing_now();
	for (int g = 0; g < s->count; g++) {
		starpu_data_handle_t *h = s->groups[g].h;
		struct starpu_task *task;
		if (dos_adam_task_create(&scalars, h[MASTER], h[MOMENT1], h[MOMENT2], h[GRAD], o->grad, h[WEIGHT16],
					 o->weight, &task))
			die("dos_adam_task_create (subgroup %d): %s", g, dos_last_error());
		starpu_task_declare_deps_array(task, 1, &ready);
		if (st) {
			task->callback_func = update_done;
			task->callback_arg = st;
		}
		int err = starpu_task_submit(task);
		if (err)
			die("starpu_task_submit (subgroup %d): %s", g, strerror(-err));
	}
	int err = starpu_task_submit(ready);
	if (err)
		die("starpu_task_submit (gradients ready): %s", strerror(-err));
	if ((err = starpu_task_wait_for_all()))
		die("starpu_task_wait_for_all: %s", strerror(-err));
	return (starpu_timing_now() - start) * 1e-6;
}

static void release_after_fetch(void *arg)
{
	starpu_data_release(arg);
}

/* Brings master, m and v home (the state a checkpoint or the next step on the host reads).
 * All fetches are requested at once, so they share the link instead of queueing one by
 * one; then each handle is acquired, which returns once its copy is home. */
static double flush_state(struct state *s)
{
	double start = starpu_timing_now();
	for (int pass = 0; pass < 2; pass++)
		for (int g = 0; g < s->count; g++)
			for (int b = MASTER; b <= MOMENT2; b++) {
				starpu_data_handle_t h = s->groups[g].h[b];
				int err = pass == 0 ? starpu_data_acquire_cb(h, STARPU_R, release_after_fetch, h)
						    : starpu_data_acquire(h, STARPU_R);
				if (err)
					die("starpu_data_acquire%s (subgroup %d): %s", pass == 0 ? "_cb" : "", g,
					    strerror(-err));
				if (pass == 1)
					starpu_data_release(h);
			}
	return (starpu_timing_now() - start) * 1e-6;
}

/* How many state handles hold a valid copy in host memory: all of them, after a flush. */
static int state_handles_home(struct state *s, int *total)
{
	int home = 0;
	*total = 0;
	for (int g = 0; g < s->count; g++)
		for (int b = MASTER; b <= MOMENT2; b++, (*total)++)
			home += starpu_data_is_on_node(s->groups[g].h[b], STARPU_MAIN_RAM) != 0;
	return home;
}

/* Bytes moved host to device and device to host since the last call (which resets
 * StarPU's per-bus counters), in all and, when `per_gpu` is given, by GPU (host to GPU k
 * in per_gpu[2k], GPU k to host in per_gpu[2k + 1], k the position in st->cuda_nodes).
 * StarPU counts every transfer its data management issues (fetches, prefetches,
 * write-backs, evictions), also when simulated; copies between GPUs are not counted here. */
static void bus_bytes_since_last(const struct step_stats *st, double *h2d, double *d2h, double *per_gpu)
{
	*h2d = *d2h = 0.0;
	if (per_gpu)
		for (int k = 0; k < 2 * st->ncuda_nodes; k++)
			per_gpu[k] = 0.0;
	for (int bus = 0; bus < starpu_bus_get_count(); bus++) {
		struct starpu_profiling_bus_info info;
		starpu_bus_get_profiling_info(bus, &info);
		unsigned src_node = (unsigned)starpu_bus_get_src(bus), dst_node = (unsigned)starpu_bus_get_dst(bus);
		enum starpu_node_kind src = starpu_node_get_kind(src_node), dst = starpu_node_get_kind(dst_node);
		double bytes = (double)info.transferred_bytes;
		int k = -1;
		if (src == STARPU_CPU_RAM && dst == STARPU_CUDA_RAM) {
			*h2d += bytes;
			k = 2 * cuda_node_index(st, dst_node);
		} else if (src == STARPU_CUDA_RAM && dst == STARPU_CPU_RAM) {
			*d2h += bytes;
			k = 2 * cuda_node_index(st, src_node) + 1;
		}
		if (per_gpu && k >= 0)
			per_gpu[k] += bytes;
	}
}

/* ---- Models and the bound ------------------------------------------------------------ */

/* The times the update of one step cannot beat on this machine (sched/bound.c), from
 * StarPU's perfmodels, bus model and GPU memory, for this benchmark's data homes: the
 * parameters split continuously, and in whole subgroups (each update is one task). */
struct bounds {
	double continuous, whole_subgroups; /* s; NAN: not known */
};

/* Call with StarPU running. */
static struct bounds bound_seconds(const struct options *o)
{
	struct bounds b = {NAN, NAN};
	int on_gpu = o->homes_on_gpu && starpu_cuda_worker_get_count() > 0;
	enum dos_dtype weight = o->has_weight ? o->weight : DOS_FP32;
	double seconds;
	if (!dos_bound_update_seconds(0, o->params, o->subgroup, o->grad, weight, on_gpu, on_gpu, &seconds))
		b.continuous = seconds;
	if (!dos_bound_update_whole_subgroups_seconds(0, o->params, o->subgroup, o->grad, weight, on_gpu, on_gpu,
						      &seconds))
		b.whole_subgroups = seconds;
	return b;
}

/* What the schedulers will believe: the Adam model for one full subgroup on each kind of
 * worker, and the bus model between RAM and the first GPU. */
static void print_model_state(const struct options *o, struct state *s)
{
	struct starpu_task *probe;
	starpu_data_handle_t *h = s->groups[0].h;
	struct dos_adam_step scalars = step_scalars(1);
	if (dos_adam_task_create(&scalars, h[MASTER], h[MOMENT1], h[MOMENT2], h[GRAD], o->grad, h[WEIGHT16], o->weight,
				 &probe))
		die("dos_adam_task_create (model probe): %s", dos_last_error());
	static const struct {
		enum starpu_worker_archtype type;
		const char *name;
	} kinds[] = {{STARPU_CPU_WORKER, "CPU"}, {STARPU_CUDA_WORKER, "CUDA"}};
	printf("# perfmodel dos_adam, %zu params:", s->groups[0].n);
	for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
		int worker = starpu_worker_get_by_type(kinds[k].type, 0);
		if (worker < 0)
			continue;
		double us = starpu_task_expected_length(probe, starpu_worker_get_perf_archtype(worker, 0), 0);
		if (isnan(us))
			printf(" %s uncalibrated", kinds[k].name);
		else
			printf(" %s %.3f ms", kinds[k].name, us * 1e-3);
	}
	putchar('\n');
	probe->destroy = 0; /* never submitted */
	starpu_task_destroy(probe);
	int cuda = starpu_worker_get_by_type(STARPU_CUDA_WORKER, 0);
	if (cuda >= 0) {
		unsigned gpu = starpu_worker_get_memory_node((unsigned)cuda);
		/* starpu_transfer_bandwidth is in bytes per microsecond, i.e. MB/s */
		printf("# bus model RAM<->CUDA 0: H2D %.2f GB/s, D2H %.2f GB/s, latency %.1f us\n",
		       starpu_transfer_bandwidth(STARPU_MAIN_RAM, gpu) * 1e-3,
		       starpu_transfer_bandwidth(gpu, STARPU_MAIN_RAM) * 1e-3,
		       starpu_transfer_latency(STARPU_MAIN_RAM, gpu));
	}
}

/* ---- One policy ----------------------------------------------------------------------- */

enum row_status { ROW_RAN, ROW_FAILED };

struct row {
	const char *policy;
	enum row_status status;
	double step_s; /* median over the timed steps */
	double gpu_share;
	double h2d_per_step, d2h_per_step; /* bytes */
	double peak_gpu_mib;               /* NAN without a CUDA worker */
	double flush_s;
	char note[96];
};

static void print_workers(const char *policy)
{
	char name[128];
	printf("# %s: %u CPU worker%s, %u CUDA worker%s", policy, starpu_cpu_worker_get_count(),
	       starpu_cpu_worker_get_count() == 1 ? "" : "s", starpu_cuda_worker_get_count(),
	       starpu_cuda_worker_get_count() == 1 ? "" : "s");
	for (unsigned k = 0; k < starpu_cuda_worker_get_count(); k++) {
		starpu_worker_get_name(starpu_worker_get_by_type(STARPU_CUDA_WORKER, (int)k), name, sizeof name);
		printf("%s%s", k ? ", " : " (", name);
	}
	puts(starpu_cuda_worker_get_count() ? ")" : "");
}

/* Where the updates went and what crossed each GPU's link, per step: with several GPUs, a
 * policy that plans one of them shows it here. */
static void print_per_gpu(const struct options *o, const char *policy, const struct step_stats *st,
			  const double *per_gpu)
{
	if (st->ncuda_nodes == 0)
		return;
	printf("# %s: per step, updates on CPU %.1f", policy, (double)st->cpu_tasks / o->steps);
	for (int k = 0; k < st->ncuda_nodes; k++)
		printf(", CUDA %d %.1f (H2D %.2f GB, D2H %.2f GB)", k, (double)st->tasks_on_gpu[k] / o->steps,
		       per_gpu[2 * k] / o->steps * 1e-9, per_gpu[2 * k + 1] / o->steps * 1e-9);
	puts("");
}

/* Runs the warm-up and timed steps of one policy in its own StarPU session; *bound is set
 * from the first session that gets that far. r->policy and r->status are already set. */
static void run_policy(const struct options *o, struct row *r, struct bounds *bound, int *models_shown)
{
	const char *policy = r->policy;
	struct starpu_conf conf;
	starpu_conf_init(&conf);
	conf.sched_policy_name = policy;
	int err = starpu_init(&conf);
	if (err) {
		fprintf(stderr, "dos-bench optimizer: starpu_init with policy '%s': %s; its row is left empty\n",
			policy, strerror(-err));
		snprintf(r->note, sizeof r->note, "starpu_init failed: %s", strerror(-err));
		return;
	}
	const char *running = starpu_sched_get_sched_policy()->policy_name;
	if (!running || strcmp(running, policy) != 0) {
		fprintf(stderr, "dos-bench optimizer: asked StarPU for policy '%s', it runs '%s'; row left empty\n",
			policy, running ? running : "(unnamed)");
		snprintf(r->note, sizeof r->note, "StarPU ran '%s' instead", running ? running : "(unnamed)");
		starpu_shutdown();
		return;
	}
	starpu_profiling_status_set(STARPU_PROFILING_ENABLE);
	print_workers(policy);

	struct state s;
	register_state(o, &s);
	if (!*models_shown) {
		print_model_state(o, &s);
		*models_shown = 1;
	}
	struct step_stats st = {0};
	for (unsigned node = 0; node < starpu_memory_nodes_get_count(); node++)
		if (starpu_node_get_kind(node) == STARPU_CUDA_RAM)
			st.cuda_nodes[st.ncuda_nodes++] = node;

	uint64_t step = 1;
	double warm = run_step(o, &s, step++, NULL);
	double h2d, d2h, seconds[MAX_STEPS], per_gpu[2 * STARPU_MAXNODES];
	bus_bytes_since_last(&st, &h2d, &d2h, NULL); /* forget the warm-up's transfers */
	sample_gpu_memory(&st);
	for (int k = 0; k < o->steps; k++)
		seconds[k] = run_step(o, &s, step++, &st);
	bus_bytes_since_last(&st, &h2d, &d2h, per_gpu);
	/* after the steps: their runs are samples of StarPU's models too */
	if (isnan(bound->continuous))
		*bound = bound_seconds(o);
	r->flush_s = flush_state(&s);
	int total, home = state_handles_home(&s, &total);

	unsigned long ran = st.cpu_tasks + st.cuda_tasks + st.other_tasks;
	r->status = ROW_RAN;
	r->note[0] = '\0';
	r->gpu_share = ran ? (double)st.cuda_tasks / (double)ran : NAN;
	r->h2d_per_step = h2d / o->steps;
	r->d2h_per_step = d2h / o->steps;
	r->peak_gpu_mib = st.ncuda_nodes ? (double)st.peak_gpu_bytes / 1048576.0 : NAN;
	printf("# %s: warm-up %.1f ms, steps", policy, warm * 1e3);
	for (int k = 0; k < o->steps; k++)
		printf(" %.1f", seconds[k] * 1e3);
	printf(" ms (in order), flush %.1f ms, state valid on the host after it: %d of %d handles\n", r->flush_s * 1e3,
	       home, total);
	r->step_s = bench_median(seconds, o->steps); /* sorts them: after they are printed in order */
	if (home != total)
		snprintf(r->note, sizeof r->note, "flush left %d of %d handles away", total - home, total);
	if (st.other_tasks)
		printf("# %s: %lu update tasks ran on workers that are neither CPU nor CUDA\n", policy, st.other_tasks);
	print_per_gpu(o, policy, &st, per_gpu);
	struct dos_sched_stats stats;
	if (_dos_sched_ctx_is_ours(0) &&
	    dos_sched_get_stats(0, &stats) == 0) /* one of our policies: its decision cost */
		printf("# %s: decision cost %.2f us per task placed (%lu tasks), %lu plans for %d steps (one "
		       "each: the step contract of dos.h), planning %.3f ms per plan (%lu subgroups)\n",
		       policy, 1e6 * stats.decision_seconds / (double)(stats.decisions ? stats.decisions : 1),
		       stats.decisions, stats.plans, o->steps + 1,
		       1e3 * stats.plan_seconds / (double)(stats.plans ? stats.plans : 1),
		       (unsigned long)stats.last_subgroups);
	fflush(stdout);
	unregister_state(&s);
	starpu_shutdown();
}

/* What a policy's process hands back. */
struct policy_report {
	struct row row;
	struct bounds bound;
	int models_shown;
};

/* Runs one policy in a child process and fills *r from its report. A child, because
 * StarPU 1.4.10 cannot restart under SimGrid (starpu_shutdown joins its simulated transfer
 * actors but leaves them recorded, so the next session's first transfer waits forever),
 * and so that a policy that crashes loses its row, not the table. The parent never starts
 * StarPU (nor CUDA), so forking is safe. */
static void run_policy_in_child(const struct options *o, const char *policy, struct row *r, struct bounds *bound,
				int *models_shown)
{
	*r = (struct row){.policy = policy,
			  .status = ROW_FAILED,
			  .step_s = NAN,
			  .gpu_share = NAN,
			  .h2d_per_step = NAN,
			  .d2h_per_step = NAN,
			  .peak_gpu_mib = NAN,
			  .flush_s = NAN};
	int fds[2];
	if (pipe(fds) != 0)
		die("pipe: %s", strerror(errno));
	fflush(stdout);
	fflush(stderr);
	pid_t pid = fork();
	if (pid < 0)
		die("fork: %s", strerror(errno));
	if (pid == 0) {
		struct policy_report rep = {.row = *r, .bound = *bound, .models_shown = *models_shown};
		close(fds[0]);
		run_policy(o, &rep.row, &rep.bound, &rep.models_shown);
		fflush(stdout);
		fflush(stderr);
		/* one write of a few hundred bytes to a pipe is atomic */
		_exit(write(fds[1], &rep, sizeof rep) == (ssize_t)sizeof rep ? 0 : 1);
	}
	close(fds[1]);
	struct policy_report rep;
	size_t got = 0;
	while (got < sizeof rep) {
		ssize_t n = read(fds[0], (char *)&rep + got, sizeof rep - got);
		if (n > 0)
			got += (size_t)n;
		else if (n == 0 || errno != EINTR)
			break; /* the child ended without reporting */
	}
	close(fds[0]);
	int status;
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (got == sizeof rep) {
		*r = rep.row;
		r->policy = policy;
		if (!isnan(rep.bound.continuous))
			*bound = rep.bound;
		*models_shown = rep.models_shown;
	} else if (WIFSIGNALED(status)) {
		snprintf(r->note, sizeof r->note, "crashed: %s", strsignal(WTERMSIG(status)));
		fprintf(stderr, "dos-bench optimizer: policy '%s' crashed (%s); its row is left empty\n", policy,
			strsignal(WTERMSIG(status)));
	} else {
		snprintf(r->note, sizeof r->note, "failed: exit status %d",
			 WIFEXITED(status) ? WEXITSTATUS(status) : -1);
	}
}

/* ---- Table ------------------------------------------------------------------------------ */

static void print_cell(double x, const char *fmt)
{
	if (isnan(x))
		printf(" %9s", "-");
	else
		printf(fmt, x);
}

static void print_table(const struct options *o, const struct row *rows, int n, struct bounds bound)
{
	double baseline[NBASELINES];
	for (int b = 0; b < NBASELINES; b++) {
		baseline[b] = NAN;
		for (int i = 0; i < n; i++)
			if (rows[i].status == ROW_RAN && !strcmp(rows[i].policy, baseline_names[b]))
				baseline[b] = rows[i].step_s;
	}
	printf("\n# optimizer phase, %.4g params in %d subgroups of %.4g, grad %s, weight %s: median of %d steps\n",
	       o->params, (int)ceil(o->params / o->subgroup), o->subgroup, dos_dtype_name(o->grad),
	       o->has_weight ? dos_dtype_name(o->weight) : "none", o->steps);
	printf("# /X: this row's time divided by policy X's (< 1: faster than X; '-': X not run); /bound: divided "
	       "by the cost model's lower bound, /whole: by the same counting whole subgroups (%s)\n",
	       isnan(bound.continuous) ? "not available yet" : "printed below");
	printf("%-12s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s  %s\n", "policy", "ms/step", "/dmda", "/all-cpu",
	       "/stride", "/bound", "/whole", "gpu%", "GB_h2d", "GB_d2h", "peakMiB", "flush_ms", "note");
	for (int i = 0; i < n; i++) {
		const struct row *r = &rows[i];
		printf("%-12s", r->policy);
		print_cell(r->step_s * 1e3, " %9.2f");
		for (int b = 0; b < NBASELINES; b++)
			print_cell(r->step_s / baseline[b], " %9.3f");
		print_cell(r->step_s / bound.continuous, " %9.3f");
		print_cell(r->step_s / bound.whole_subgroups, " %9.3f");
		print_cell(r->gpu_share * 100.0, " %9.1f");
		print_cell(r->h2d_per_step * 1e-9, " %9.3f");
		print_cell(r->d2h_per_step * 1e-9, " %9.3f");
		print_cell(r->peak_gpu_mib, " %9.0f");
		print_cell(r->flush_s * 1e3, " %9.2f");
		printf("  %s\n", r->note);
	}
	if (!isnan(bound.continuous))
		printf("# bound: %.2f ms per step\n", bound.continuous * 1e3);
	if (!isnan(bound.whole_subgroups))
		printf("# bound in whole subgroups: %.2f ms per step\n", bound.whole_subgroups * 1e3);
}

/* ---- Entry -------------------------------------------------------------------------------- */

int bench_optimizer(int argc, char **argv)
{
	struct options o;
	int err = parse_options(argc, argv, &o);
	if (err)
		return err;
	double state_bytes = o.params * state_bytes_per_param(&o);
#ifndef STARPU_SIMGRID
	double available = available_memory_bytes();
	if (!isnan(available) && state_bytes > MEMORY_HEADROOM * available) {
		fprintf(stderr,
			"dos-bench optimizer: --params %.0f needs %.1f GB of host memory, %.1f GB available: use "
			"fewer params or a simulated machine\n",
			o.params, state_bytes / 1e9, available / 1e9);
		return 1;
	}
#endif
	size_simulation_folding(state_bytes);
	if (o.gpu_mem_mib == 0) {
		unsetenv("STARPU_LIMIT_CUDA_MEM");
	} else if (o.gpu_mem_mib > 0) {
		char text[32];
		snprintf(text, sizeof text, "%ld", o.gpu_mem_mib);
		setenv("STARPU_LIMIT_CUDA_MEM", text, 1);
	}
	if (getenv("STARPU_SCHED")) {
		/* it would override every row's policy */
		fprintf(stderr, "dos-bench optimizer: ignoring STARPU_SCHED=%s: --policies chooses\n",
			getenv("STARPU_SCHED"));
		unsetenv("STARPU_SCHED");
	}
	char sched_lib_note[1024];
	set_sched_lib(sched_lib_note, sizeof sched_lib_note);
	/* a misspelt policy is bad usage, found before any row runs: it used to leave an empty
	 * row in the table and the run ended with status 0, which a script took for success */
	for (int i = 0; i < o.npolicies; i++)
		if (!policy_exists(o.policies[i]))
			return bad_usage("--policies: '%s' is not a scheduling policy (not a StarPU built-in, and "
					 "STARPU_SCHED_LIB=%s does not provide it)",
					 o.policies[i],
					 getenv("STARPU_SCHED_LIB") ? getenv("STARPU_SCHED_LIB") : "(unset)");

	int major, minor, release;
	starpu_get_version(&major, &minor, &release);
	printf("# dos-bench optimizer, starpu-dos %s, StarPU %d.%d.%d%s\n", dos_version_string(), major, minor, release,
#ifdef STARPU_SIMGRID
	       " (SimGrid: simulated machine and time; state allocations folded, values not real)"
#else
	       ""
#endif
	);
	printf("# %.4g params, %.1f GB of state on the host (fp32 master/m/v, %s grad, %s weight), %d timed steps "
	       "after 1 warm-up, per policy\n",
	       o.params, state_bytes / 1e9, dos_dtype_name(o.grad), o.has_weight ? dos_dtype_name(o.weight) : "no",
	       o.steps);
	printf("# gradients and 16-bit weights live %s; every update waits for one 'gradients ready' task "
	       "submitted last\n",
	       o.homes_on_gpu ? "on the GPU, as in training (--homes gpu; on the host without a GPU)"
			      : "in host memory (--homes host; in training they live on the GPU)");
	printf("# StarPU settings:\n");
	print_env("STARPU_MINIMUM_CLEAN_BUFFERS", "unset (StarPU default 5 %)");
	print_env("STARPU_TARGET_CLEAN_BUFFERS", "unset (StarPU default 10 %)");
	print_env("STARPU_LIMIT_CUDA_MEM", "unset (whole GPU)");
	printf("#   %-30s %s\n", "STARPU_SCHED_LIB", sched_lib_note);
	print_env("STARPU_CALIBRATE", "unset (0: models used as they are, not updated)");
	print_env("STARPU_HOSTNAME", "unset (this host's name)");
	print_env("STARPU_PERF_MODEL_DIR", "unset ($STARPU_HOME/.starpu/sampling)");
	print_env("STARPU_PREFETCH", "unset (1)");
#ifdef STARPU_SIMGRID
	print_env("STARPU_MALLOC_SIMULATION_FOLD", "unset (1 MiB)");
#endif
	fflush(stdout);

	struct row rows[MAX_POLICIES];
	struct bounds bound = {NAN, NAN};
	int models_shown = 0;
	for (int i = 0; i < o.npolicies; i++)
		run_policy_in_child(&o, o.policies[i], &rows[i], &bound, &models_shown);
	print_table(&o, rows, o.npolicies, bound);
	return 0;
}
