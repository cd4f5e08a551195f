/* dos-train: trains the example model (docs/model.md) on the bundled corpus with the
 * optimizer's updates placed by a StarPU scheduling policy (`dos` by default), showing
 * progress and ending with a summary. With no arguments it trains the default small model
 * for a few hundred steps; see --help. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench.h"
#include "config.h"
#include "data.h"
#include "dos.h"
#include "dos_policy.h"
#include "errors.h"
#include "files.h"
#include "kernels.h"
#include "parse.h"
#include "subgroups.h"
#include "timeline.h"
#include "train.h"
#include "train_options.h"

/* where `make install` puts data/corpus.txt and sched/machines/ (Makefile.am: pkgdatadir)
 * and the program itself (bindir), as configured */
#ifndef DOS_DATA_DIR
#define DOS_DATA_DIR "."
#endif
#ifndef DOS_BIN_DIR
#define DOS_BIN_DIR "."
#endif

/* The configured data folder relative to the configured program folder ("../share/
 * starpu-dos" by default), so that an installation moved as a whole, or made with
 * `make install prefix=...`, finds its data next to its program. */
static void data_dir_from_bin_dir(char *rel, size_t size)
{
	const char *bin = DOS_BIN_DIR, *data = DOS_DATA_DIR;
	size_t common = 0; /* where their common leading folders end */
	for (size_t i = 0;; i++) {
		if ((bin[i] == '/' || !bin[i]) && (data[i] == '/' || !data[i]))
			common = i;
		if (!bin[i] || bin[i] != data[i])
			break;
	}
	size_t len = (size_t)snprintf(rel, size, ".");
	for (const char *p = bin + common; *p && len < size; p++) /* ".." per folder of bin below them */
		if (*p == '/' && p[1] && p[1] != '/')
			len += (size_t)snprintf(rel + len, size - len, "/..");
	if (len < size)
		snprintf(rel + len, size - len, "%s", data + common);
}

/* A file or folder shipped at `rel` in the source tree and installed at `installed`
 * (under the data folder). An installed dos-train reads the installed one, found next to
 * the program (the working folder never matters). An uninstalled one (run from a build
 * folder) reads DOS_SOURCE_DIR's when that is set, else the one of the source tree its
 * build folder lies in (found from the program's own location), else the installed one
 * at its configured place. */
static const char *shipped_path(const char *rel, const char *installed, char *buf, size_t size)
{
	char exe[4096], rel_data[1024];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
	char *slash = n > 0 ? (exe[n] = 0, strrchr(exe, '/')) : NULL;
	if (slash) {
		*slash = 0; /* the program's folder */
		data_dir_from_bin_dir(rel_data, sizeof rel_data);
		char found[PATH_MAX];
		if ((size_t)snprintf(buf, size, "%s/%s/%s", exe, rel_data, installed) < size &&
		    access(buf, R_OK) == 0 && realpath(buf, found) && strlen(found) < size) /* without the "/./../" */
			return strcpy(buf, found);
	}
	const char *srcdir = getenv("DOS_SOURCE_DIR");
	if (srcdir && *srcdir) {
		snprintf(buf, size, "%s/%s", srcdir, rel);
		return buf;
	}
	/* build/.libs/dos-train, build/dos-train, a VPATH build's _build/sub/.libs/dos-train */
	for (int up = 1; slash && up <= 4; up++) {
		char *parent = strrchr(exe, '/');
		if (!parent)
			break;
		*parent = 0;
		if ((size_t)snprintf(buf, size, "%s/%s", exe, rel) < size && access(buf, R_OK) == 0)
			return buf;
	}
	snprintf(buf, size, "%s/%s", DOS_DATA_DIR, installed);
	return buf;
}

/* ---- one voice: rank 0 reports the job ----------------------------------------------- */

#if DOS_SMPI
/* Under SMPI every simulated rank runs in this one process and shares its stdout, which a
 * rank that does not report therefore cannot send to /dev/null as a real rank does: its
 * lines are dropped here instead (SMPI gives each rank its own copy of this flag). */
static int stdout_silenced;

static int rank_printf(const char *format, ...)
{
	if (stdout_silenced)
		return 0;
	va_list ap;
	va_start(ap, format);
	int n = vprintf(format, ap);
	va_end(ap);
	return n;
}
#define printf rank_printf

static int silence_stdout(void)
{
	stdout_silenced = 1;
	return 1;
}
#else
static int silence_stdout(void)
{
	return freopen("/dev/null", "w", stdout) != NULL;
}
#endif

/* ---- --simulate: a machine of sched/machines/ under StarPU's SimGrid variant ---------- */

#ifdef STARPU_SIMGRID
/* The machines' folder: DOS_MACHINES_DIR in the environment, else the shipped one. */
static const char *machines_dir(void)
{
	static char path[4096];
	const char *env = getenv("DOS_MACHINES_DIR");
	return env && *env ? env : shipped_path("sched/machines", "machines", path, sizeof path);
}

static void set_default(const char *name, const char *value)
{
	setenv(name, value, 0); /* the user's own settings win */
}

/* StarPU's SimGrid main() loads the machine before it calls ours, so --simulate NAME takes
 * effect here, before main, from the command line in /proc/self/cmdline: the environment
 * tools/sim-env.sh prints for NAME. */
__attribute__((constructor)) static void simulate_from_command_line(void)
{
	static char cmdline[65536];
	FILE *f = fopen("/proc/self/cmdline", "rb");
	if (!f)
		return;
	size_t len = fread(cmdline, 1, sizeof cmdline - 1, f);
	fclose(f);
	cmdline[len] = 0;
	const char *name = NULL;
	for (size_t i = 0; i < len; i += strlen(cmdline + i) + 1) {
		const char *arg = cmdline + i;
		if (!strcmp(arg, "--simulate") && i + strlen(arg) + 1 < len)
			name = arg + strlen(arg) + 1;
		else if (!strncmp(arg, "--simulate=", 11))
			name = arg + 11;
	}
	if (!name)
		return;
	char dir[4096], path[4200], line[256];
	snprintf(dir, sizeof dir, "%s/%s", machines_dir(), name);
	snprintf(path, sizeof path, "%s/sim.env", dir);
	f = *name && !strchr(name, '/') ? fopen(path, "r") : NULL;
	if (!f) {
		fprintf(stderr, "dos-train: --simulate = '%s': no such machine in %s (see sched/machines/README.md)\n",
			name, machines_dir());
		_exit(2);
	}
	while (fgets(line, sizeof line, f)) { /* STARPU_NCPU, STARPU_NCUDA, STARPU_LIMIT_CUDA_MEM */
		char *eq = strchr(line, '=');
		if (line[0] == '#' || !eq)
			continue;
		*eq = 0;
		eq[1 + strcspn(eq + 1, "\n")] = 0;
		set_default(line, eq + 1);
	}
	fclose(f);
	setenv("STARPU_HOSTNAME", name, 1);
	setenv("STARPU_PERF_MODEL_DIR", dir, 1);
	set_default("STARPU_NOPENCL", "0");
	/* the simulated machine's own costs only, as tools/sim-env.sh */
	set_default("STARPU_SIMGRID_TRANSFER_COST", "1");
	const char *zero[] = {"STARPU_SIMGRID_CUDA_MALLOC_COST",    "STARPU_SIMGRID_CUDA_QUEUE_COST",
			      "STARPU_SIMGRID_TASK_SUBMIT_COST",    "STARPU_SIMGRID_TASK_PUSH_COST",
			      "STARPU_SIMGRID_FETCHING_INPUT_COST", "STARPU_SIMGRID_SCHED_COST"};
	for (size_t i = 0; i < sizeof zero / sizeof *zero; i++)
		set_default(zero[i], "0");
	/* folded host arrays: 64 MiB pages keep a 20 B model's state under 16384 mappings */
	set_default("STARPU_MALLOC_SIMULATION_FOLD", "64");
}
#endif

/* ---- phase times and update placement, from task profiling --------------------------- */

/* Time intervals (us), to tell how many updates ran while backward was still running. */
struct intervals {
	double (*at)[2];
	size_t n, cap;
};

/* Overlap is counted over the first steps only, so that the recorded intervals stay
 * bounded on long runs (a soak of 10,000 steps grew by 65 MiB when all were kept). */
#define OVERLAP_STEPS 100

struct accounting {
	pthread_mutex_t lock;
	uint64_t microbatches_submitted; /* embedding forwards: accumulation per step */
	uint32_t accumulation;
	double busy[DOS_TASK_PHASES];      /* task seconds, summed over workers */
	double busy_cuda[DOS_TASK_PHASES]; /* the part of busy[] that CUDA workers ran */
	uint64_t updates_cpu, updates_gpu;
	/* the model's matrix products (the codelets whose perfmodel counts floating-point
	 * operations), by worker type: 0 CPU, 1 CUDA */
	double product_flops[2], product_seconds[2];
	struct intervals backward, updates;
	/* per step of this run ([steps]): the latest end of a backward task, and the latest
	 * moment an update's inputs were all there (its subgroup's summed gradient, on the
	 * rank that owns it): the gradient tail lies between the two */
	double *backward_end, *gradient_ready;
	uint64_t steps;
	struct dos_timeline *timeline;
	/* the last step's submission began: its tasks are drawn (set and read on the
	 * submitting thread) */
	int last_step_submitted;
};

static void intervals_add(struct intervals *iv, double start, double end)
{
	if (iv->n == iv->cap) {
		size_t cap = iv->cap ? 2 * iv->cap : 4096;
		double(*grown)[2] = realloc(iv->at, cap * sizeof *grown);
		if (!grown)
			return; /* the overlap count is a statistic: losing entries only lowers it */
		iv->at = grown;
		iv->cap = cap;
	}
	iv->at[iv->n][0] = start;
	iv->at[iv->n][1] = end;
	iv->n++;
}

static int by_start(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* Updates that started while some backward task was running. */
static size_t updates_during_backward(struct intervals *backward, struct intervals *updates)
{
	if (backward->n == 0) /* none recorded (a resumed run with nothing left to do): qsort wants an array */
		return 0;
	qsort(backward->at, backward->n, sizeof *backward->at, by_start);
	for (size_t i = 1; i < backward->n; i++) /* end becomes the running maximum */
		backward->at[i][1] = fmax(backward->at[i][1], backward->at[i - 1][1]);
	size_t count = 0;
	for (size_t u = 0; u < updates->n; u++) {
		double t = updates->at[u][0];
		size_t lo = 0, hi = backward->n; /* first interval starting after t */
		while (lo < hi) {
			size_t mid = (lo + hi) / 2;
			if (backward->at[mid][0] <= t)
				lo = mid + 1;
			else
				hi = mid;
		}
		count += lo > 0 && backward->at[lo - 1][1] > t;
	}
	return count;
}

struct watched {
	struct accounting *acc;
	void (*callback)(void *);
	void *callback_arg;
	enum _dos_task_phase phase;
	int record_interval; /* a task of the first OVERLAP_STEPS steps of this run */
	double flops;        /* a matrix product's floating-point operations, else 0 */
	uint64_t step;       /* of this run, 0-based */
};

static void record_latest(double *at, uint64_t step, uint64_t steps, double t)
{
	if (at && step < steps && t > at[step])
		at[step] = t;
}

static void account_task(void *arg)
{
	struct watched *w = arg;
	struct starpu_task *task = starpu_task_get_current();
	struct starpu_profiling_task_info *info = task ? task->profiling_info : NULL;
	if (info) {
		double seconds = starpu_timing_timespec_delay_us(&info->start_time, &info->end_time) * 1e-6;
		double start = starpu_timing_timespec_to_us(&info->start_time);
		double end = starpu_timing_timespec_to_us(&info->end_time);
		int on_gpu = starpu_worker_get_type(info->workerid) == STARPU_CUDA_WORKER;
		pthread_mutex_lock(&w->acc->lock);
		w->acc->busy[w->phase] += seconds;
		if (on_gpu)
			w->acc->busy_cuda[w->phase] += seconds;
		if (w->flops > 0) {
			w->acc->product_flops[on_gpu] += w->flops;
			w->acc->product_seconds[on_gpu] += seconds;
		}
		if (w->phase == DOS_TASK_BACKWARD) {
			if (w->record_interval)
				intervals_add(&w->acc->backward, start, end);
			record_latest(w->acc->backward_end, w->step, w->acc->steps, end);
		}
		if (w->phase == DOS_TASK_UPDATE) {
			/* pushed to the scheduler once its last input (the gradient) was there */
			record_latest(w->acc->gradient_ready, w->step, w->acc->steps,
				      starpu_timing_timespec_to_us(&info->push_start_time));
			if (w->record_interval)
				intervals_add(&w->acc->updates, start, end);
			if (on_gpu)
				w->acc->updates_gpu++;
			else
				w->acc->updates_cpu++;
		}
		pthread_mutex_unlock(&w->acc->lock);
	}
	if (w->callback)
		w->callback(w->callback_arg);
	free(w);
}

static void watch_task(void *arg, struct starpu_task *task, enum _dos_task_phase phase, uint32_t subgroup)
{
	(void)subgroup;
	struct accounting *acc = arg;
	struct watched *w = malloc(sizeof *w);
	/* tasks are submitted in step order, and each training micro-batch starts with its
	 * data task */
	if (phase == DOS_TASK_DATA)
		acc->microbatches_submitted++;
	if (w) {
		/* the data task of this task's micro-batch is counted: its step follows */
		uint64_t step = acc->microbatches_submitted ? (acc->microbatches_submitted - 1) / acc->accumulation : 0;
		*w = (struct watched){acc,
				      task->callback_func,
				      task->callback_arg,
				      phase,
				      acc->microbatches_submitted <= (uint64_t)OVERLAP_STEPS * acc->accumulation,
				      0,
				      step};
		/* the products' perfmodels regress on their operation count
		 * (codelets/model_codelets.c): the same count gives their rate */
		if ((phase == DOS_TASK_FORWARD || phase == DOS_TASK_BACKWARD) && task->cl && task->cl->model &&
		    task->cl->model->size_base)
			w->flops = (double)task->cl->model->size_base(task, 0);
		task->callback_func = account_task;
		task->callback_arg = w;
	}
	/* the picture is of the last training step: not the tasks of the steps before it,
	 * which may still run beside it, nor the held-out evaluation after it */
	if (acc->timeline && acc->last_step_submitted && phase != DOS_TASK_EVALUATION)
		dos_timeline_watch(acc->timeline, task, phase);
}

static void start_timeline(void *arg)
{
	struct accounting *acc = arg;
	dos_timeline_reset(acc->timeline);
	acc->last_step_submitted = 1;
}

/* ---- progress ---------------------------------------------------------------------- */

/* Single-step losses are noisy (each step sees other text): the summary also compares
 * the mean of the first and of the last LOSS_WINDOW steps. */
#define LOSS_WINDOW 10

struct progress {
	int tty, quiet;
	double first_loss, last_loss;
	double first_sum, recent[LOSS_WINDOW];
	uint64_t skipped, seen;
	double first_eval, last_eval; /* held-out losses, once evaluations > 0 */
	uint64_t first_eval_step, last_eval_step, evaluations;
	double *loss_at; /* [seen]: seconds into the run when each step's loss was known */
	uint64_t loss_at_cap;
};

static void format_duration(double s, char *buf, size_t size)
{
	if (!(s >= 0) || s > 1e7)
		snprintf(buf, size, "?");
	else if (s >= 60)
		snprintf(buf, size, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
	else
		snprintf(buf, size, "%.1fs", s);
}

static void on_step(void *arg, const struct dos_train_progress *p)
{
	struct progress *pr = arg;
	if (pr->seen == 0)
		pr->first_loss = p->loss;
	pr->last_loss = p->loss;
	if (pr->seen < LOSS_WINDOW)
		pr->first_sum += p->loss;
	if (pr->seen == pr->loss_at_cap) {
		uint64_t cap = pr->loss_at_cap ? 2 * pr->loss_at_cap : 64;
		double *grown = realloc(pr->loss_at, cap * sizeof *grown);
		if (grown)
			pr->loss_at = grown, pr->loss_at_cap = cap;
	}
	if (pr->seen < pr->loss_at_cap)
		pr->loss_at[pr->seen] = p->elapsed;
	pr->recent[pr->seen++ % LOSS_WINDOW] = p->loss;
	pr->skipped += !p->applied;
	int evaluated = !isnan(p->eval_loss);
	if (evaluated) {
		if (!pr->evaluations++)
			pr->first_eval = p->eval_loss, pr->first_eval_step = p->step;
		pr->last_eval = p->eval_loss, pr->last_eval_step = p->step;
	}
	if (pr->quiet)
		return;
	double rate = p->tokens / p->elapsed, eta = (p->steps - p->step) * p->elapsed / p->step;
	char eta_text[32];
	format_duration(eta, eta_text, sizeof eta_text);
	int every = p->steps <= 50 ? 1 : (int)(p->steps / 50);
	if (!pr->tty && p->step % every && p->step != p->steps && !evaluated)
		return;
	char loss_text[32], eval_text[32] = "";
	snprintf(loss_text, sizeof loss_text, isnan(p->loss) ? "n/a" : "%.4f", p->loss);
	if (evaluated)
		snprintf(eval_text, sizeof eval_text, "  held-out %.4f", p->eval_loss);
	/* a terminal keeps the lines with a held-out loss */
	printf("%sstep %5llu/%llu  loss %s%s  lr %.2e  %8.0f tokens/s  ETA %s%s%s", pr->tty ? "\r" : "",
	       (unsigned long long)p->step, (unsigned long long)p->steps, loss_text, eval_text, p->lr, rate, eta_text,
	       p->applied ? "" : "  (skipped: overflow)", !pr->tty || evaluated ? "\n" : "   ");
	fflush(stdout);
}

/* The steady iteration time: the median interval between one step's loss and the next
 * (a whole iteration: backward, update, next forward), so that one-time costs of the
 * first steps (a policy moving state onto the GPU for good, calibration) do not weigh
 * as they do in the mean over a short run. Prints nothing under 3 steps. */
static void print_steady_iteration(struct progress *pr, const char *clock)
{
	uint64_t n = pr->seen <= pr->loss_at_cap ? pr->seen : 0;
	if (n < 3)
		return;
	double first = pr->loss_at[1] - pr->loss_at[0];
	for (uint64_t i = 0; i + 1 < n; i++)
		pr->loss_at[i] = pr->loss_at[i + 1] - pr->loss_at[i];
	printf("summary: steady iteration %.4f%s s (median of the %llu intervals between consecutive steps' "
	       "losses; the first %.4f s)\n",
	       bench_median(pr->loss_at, (int)(n - 1)), clock, (unsigned long long)(n - 1), first);
}

/* The gradient tail of each step: from the end of backward to the moment the last update
 * of the job had its gradient (reduced over the ranks, on the rank that owns its
 * subgroup): what the reduction adds after backward. The end of backward is the first
 * rank's: every rank computes the same, but along the chain a rank's last backward tasks
 * wait for the previous rank's gradients, which is the tail itself. The median over the
 * steps after the first, as the steady iteration. Every rank calls it (the extremes are
 * over the ranks); prints nothing under 2 steps. */
static void print_gradient_tail(const struct accounting *acc, uint64_t steps, const char *clock)
{
	double *tail = malloc((steps ? steps : 1) * sizeof *tail);
	uint64_t n = 0;
	for (uint64_t k = 0; k < steps; k++) {
		double backward_end = -_dos_dp_max(-acc->backward_end[k]), ready = _dos_dp_max(acc->gradient_ready[k]);
		if (tail && backward_end > 0 && ready > 0)
			tail[n++] = (ready - backward_end) * 1e-6;
	}
	if (n >= 2)
		printf("summary: gradient tail %.3f%s s (median of the %llu steps after the first, from the end of the "
		       "first rank's backward to the last update's reduced gradient on its owner; the first %.3f s)\n",
		       bench_median(tail + 1, (int)(n - 1)), clock, (unsigned long long)(n - 1), tail[0]);
	free(tail);
}

/* ---- files: the default corpus, --dump (the options are train_options.c's) ------------- */

static const char *default_data_path(void)
{
	static char path[4096];
	return shipped_path("data/corpus.txt", "corpus.txt", path, sizeof path);
}

/* The final master, m, v and working weights, params floats each, one after the other.
 * In a data-parallel job every rank writes the state it keeps into the same file (rank 0
 * creates it and writes the weights), so the file is the one a single process writes. */
static int write_dump(const char *path, const struct dos_train_output *out, uint64_t params,
		      const struct dos_data_parallel *dp)
{
	char tmp[4096];
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	int fd = dp->rank == 0 ? open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644) : -1;
	int ok = dp->rank != 0 || fd >= 0;
	if (!ok)
		fprintf(stderr, "dos-train: --dump %s: %s\n", tmp, strerror(errno));
	_dos_dp_barrier(); /* the file exists before the other ranks open it */
	if (dp->rank != 0)
		ok = (fd = open(tmp, O_WRONLY)) >= 0;
	const float *arrays[] = {out->master, out->m, out->v, out->weights};
	for (int i = 0; i < 4 && ok; i++) {
		uint64_t begin = i < 3 ? out->state_begin : 0, count = i < 3 ? out->state_len : params;
		if (i == 3 && dp->rank != 0)
			break;
		size_t bytes = count * sizeof(float);
		ok = pwrite(fd, arrays[i] + begin, bytes, (off_t)((i * params + begin) * sizeof(float))) ==
		     (ssize_t)bytes;
	}
	if (fd >= 0)
		ok &= close(fd) == 0;
	ok = _dos_dp_sum(ok) == _dos_dp_size(dp); /* every rank wrote its part */
	if (dp->rank == 0 && (!ok || rename(tmp, path) != 0)) {
		fprintf(stderr, "dos-train: --dump %s: writing failed\n", path);
		unlink(tmp);
		return -EIO;
	}
	return ok ? 0 : -EIO;
}

/* The subgroups the optimizer will cut the model into: the map it builds from the same
 * settings. 0, or an error the optimizer will meet and report itself. */
static int subgroups_of(const struct dos_train_config *cfg, struct dos_subgroup_map *map)
{
	uint32_t ntensors = _dos_model_tensor_count(&cfg->shape);
	uint64_t *numel = malloc(ntensors * sizeof *numel);
	if (!numel)
		return -ENOMEM;
	_dos_model_param_count(&cfg->shape, numel);
	int err = _dos_subgroup_map_build(map, numel, ntensors, cfg->opt.subgroup_size,
					  cfg->opt.subgroups_follow_tensors);
	free(numel);
	return err;
}

/* In a data-parallel job, each rank's line: its subgroups and the share of the optimizer
 * state (fp32 master, m, v: 12 bytes per parameter) it keeps. */
static void print_rank_share(const struct dos_train_config *cfg, const struct dos_subgroup_map *map, unsigned ncpu,
			     unsigned ncuda, const struct dos_rank_binding *binding)
{
	uint32_t first, end;
	_dos_dp_owned_subgroups(&cfg->dp, cfg->dp.rank, map->nsubgroups, &first, &end);
	uint64_t mine = map->subgroup_start[end] - map->subgroup_start[first], params = map->nparams;
	char host[256] = "?";
#if DOS_SMPI
	snprintf(host, sizeof host, "simulated node %d", cfg->dp.rank);
#else
	gethostname(host, sizeof host - 1);
#endif
	printf("dos-train: rank %d of %d on %s (%u CPU + %u CUDA workers): subgroups [%u, %u), optimizer state "
	       "%.1f MiB of %.1f MiB (%.3f of it)\n",
	       cfg->dp.rank, cfg->dp.nranks, host, ncpu, ncuda, first, end, 12.0 * mine / 1048576,
	       12.0 * params / 1048576, (double)mine / params);
	printf("dos-train: rank %d binding: %s\n", cfg->dp.rank, binding->text);
	fflush(stdout);
}

/* StarPU's (and, in a data-parallel job, MPI's) end. */
static void shutdown_runtime(const struct dos_data_parallel *dp)
{
	if (dp->nranks > 0)
		_dos_dp_shutdown();
	else
		starpu_shutdown();
}

/* ---- before StarPU: every file the run reads or writes ---------------------------------- */

/* Whether `path` ends in ".svg" (any case): --plot draws SVG and nothing else. */
static int has_svg_extension(const char *path)
{
	size_t len = strlen(path);
	return len > 4 && strcasecmp(path + len - 4, ".svg") == 0;
}

/* The training text: a regular file (a FIFO would block the read, a folder fail late). */
static int check_data_file(const struct dos_train_config *cfg, int given)
{
	const char *path = cfg->data_path;
	struct stat st;
	if (stat(path, &st) != 0) {
		if (!given && errno == ENOENT)
			fprintf(stderr,
				"dos-train: the bundled corpus is not at %s: this dos-train is neither installed nor "
				"run "
				"from a build folder inside its source tree; give the training text with --data FILE, "
				"or "
				"the source tree with DOS_SOURCE_DIR=DIR\n",
				path);
		else
			fprintf(stderr, "dos-train: --data %s: %s\n", path, strerror(errno));
		return 2;
	}
	if (!S_ISREG(st.st_mode)) {
		fprintf(stderr, "dos-train: --data %s: not a regular file (%s): give the training text as a file\n",
			path,
			S_ISDIR(st.st_mode)    ? "a folder"
			: S_ISFIFO(st.st_mode) ? "a FIFO, which would block until something writes into it"
					       : "a device or socket");
		return 2;
	}
	/* the corpus's size rules (graph/data.h), from its size: applied when it is read,
	 * they stopped the run only after StarPU had started and the model was built */
	uint64_t len = (uint64_t)st.st_size, train;
	uint32_t batches;
	if (_dos_corpus_length_check(path, len, cfg->shape.seq_len) ||
	    (cfg->eval_fraction > 0 && _dos_corpus_split_check(len, cfg->eval_fraction, cfg->micro_batch,
							       cfg->shape.seq_len, &train, &batches))) {
		dos_train_print_library_error(stderr);
		return 2;
	}
	return 0;
}

/* A folder the run writes into: created with its parents, and it must take new files. */
static int check_output_folder(const char *option, const char *path)
{
	char why[700];
	if (_dos_make_folder(path, why, sizeof why) || _dos_check_writable_folder(path, why, sizeof why)) {
		fprintf(stderr, "dos-train: %s %s: %s\n", option, path, why);
		return 2;
	}
	return 0;
}

static int check_output_file(const char *option, const char *path)
{
	char why[700];
	if (_dos_check_output_file(path, why, sizeof why)) {
		fprintf(stderr, "dos-train: %s '%s': %s\n", option, path, why);
		return 2;
	}
	return 0;
}

/* Checks the data and every output before StarPU starts, so that a bad path is refused at
 * once, naming the option and the path, instead of after the training: the data file,
 * --plot (an SVG file), --dump, --trace and --checkpoint-dir (folders, created with their
 * parents when missing). Sets the default data path. Returns 0, or 2 after a message. */
static int check_files(struct train_options *o)
{
	struct dos_train_config *cfg = &o->cfg;
	int given = cfg->data_path != NULL;
	if (!given)
		cfg->data_path = default_data_path();
	if (check_data_file(cfg, given))
		return 2;
	if (o->plot && *o->plot && !has_svg_extension(o->plot)) {
		fprintf(stderr, "dos-train: --plot '%s': the picture is SVG; give a file name ending in .svg\n",
			o->plot);
		return 2;
	}
	if ((o->plot && check_output_file("--plot", o->plot)) || (o->dump && check_output_file("--dump", o->dump)))
		return 2;
	if (o->trace) {
#ifndef STARPU_USE_FXT
		fprintf(stderr, "dos-train: --trace %s: this StarPU was built without FxT (configure --with-fxt)\n",
			o->trace);
		return 2;
#endif
		if (check_output_folder("--trace", o->trace))
			return 2;
	}
	if (cfg->checkpoint_dir && check_output_folder("--checkpoint-dir", cfg->checkpoint_dir))
		return 2;
	return 0;
}

/* ---- StarPU, and the policy that really runs ------------------------------------------- */

static void list_policies(FILE *f)
{
	fprintf(f, "dos, all-cpu, stride, resident (ours)");
	for (struct starpu_sched_policy **p = starpu_sched_get_predefined_policies(); *p; p++)
		fprintf(f, ", %s", (*p)->policy_name);
}

/* StarPU can wait forever when a GPU is too small for what its queued tasks hold at once
 * (seen in simulation at STARPU_LIMIT_CUDA_MEM = 15450-15600 MiB for 1b bf16, with dmda as
 * with dos; results/state-by-tasks-sim-2026-12-02.md). On a real machine that is a silent
 * hang: StarPU's watchdog (a default of 10 minutes without any task ending while tasks
 * wait; STARPU_WATCHDOG_TIMEOUT, in microseconds, changes it, 0 turns it off) ends the run
 * with this message instead. Not under SimGrid, which reports a deadlock itself. */
#define HANG_TIMEOUT_US "600000000"

#ifndef STARPU_SIMGRID
/* StarPU keeps the performance models it measures (the bus's, the codelets') in its first
 * model folder, which it creates with its parents, and aborts with a backtrace when it
 * cannot (_starpu_mkpath_and_check, StarPU's src/common/utils.c): STARPU_PERF_MODEL_DIR
 * when set and not empty, else .starpu/sampling in StarPU's home, the first set of
 * XDG_CACHE_HOME, STARPU_HOME, HOME, TMPDIR, TEMP and TMP, else /tmp
 * (_starpu_set_perf_model_dirs in src/core/perfmodel/perfmodel.c, _starpu_get_home_path).
 * With STARPU_PERF_MODEL_DIR set, the home is not written (tried: STARPU_HOME=/etc/passwd
 * runs). A folder that does not exist yet is fine when StarPU can make it; nothing is
 * created here. Not under SimGrid, which reads the models of a machine and writes none.
 * Returns 0, or 2 after a message naming the variable, its value and what is wrong. */
static int check_starpu_model_folder(void)
{
	static const char *const homes[] = {"XDG_CACHE_HOME", "STARPU_HOME", "HOME", "TMPDIR", "TEMP", "TMP"};
	const char *name = "STARPU_PERF_MODEL_DIR", *value = getenv(name);
	char folder[PATH_MAX + 32], why[PATH_MAX + 300];
	if (value && *value)
		snprintf(folder, sizeof folder, "%s", value);
	else {
		name = NULL;
		value = "/tmp";
		for (size_t i = 0; i < sizeof homes / sizeof *homes && !name; i++)
			if (getenv(homes[i]))
				name = homes[i], value = getenv(homes[i]);
		snprintf(folder, sizeof folder, "%s/.starpu/sampling", value);
	}
	if (_dos_check_folder_can_be_made(folder, why, sizeof why) == 0)
		return 0;
	if (name)
		fprintf(stderr, "dos-train: %s = '%s': StarPU cannot keep its performance models in %s: %s\n", name,
			value, folder, why);
	else
		fprintf(stderr,
			"dos-train: StarPU cannot keep its performance models in %s (none of XDG_CACHE_HOME, "
			"STARPU_HOME, HOME, TMPDIR, TEMP, TMP is set): %s\n",
			folder, why);
	return 2;
}
#endif

/* Checks, before StarPU starts, the environment variables that would otherwise fail late
 * or oddly: StarPU aborts with a backtrace on a worker count that is not a whole number
 * (STARPU_NCPU=abc) or is negative; STARPU_WATCHDOG_TIMEOUT was read with atoll, so that
 * "abc" or "-1" turned the watchdog off without a word and "10x" stopped the run as stuck
 * after 10 us; with a DOS_CPU_ISA it cannot use, the library warns from a worker and runs
 * another variant, which a run that forces one to measure it should not do; StarPU also
 * aborts on a model folder (STARPU_HOME, STARPU_PERF_MODEL_DIR) it cannot make. An empty
 * worker count is left to StarPU: it means no worker, which start_starpu explains.
 * Returns 0, or 2 after a message naming the variable and its value. */
static int check_environment(void)
{
	static const char *const counts[] = {"STARPU_NCPU",    "STARPU_NCPUS", "STARPU_NCUDA",
					     "STARPU_NOPENCL", "STARPU_NHIP",  "STARPU_RESERVE_NCPU"};
	uint64_t x;
	for (size_t i = 0; i < sizeof counts / sizeof *counts; i++) {
		const char *value = getenv(counts[i]);
		if (value && *value && _dos_parse_u64(value, 0, INT_MAX, &x) != 0) {
			fprintf(stderr, "dos-train: %s = '%s': expected a whole number in base 10 in [0, %d]\n",
				counts[i], value, INT_MAX);
			return 2;
		}
	}
	const char *watchdog = getenv("STARPU_WATCHDOG_TIMEOUT");
	if (watchdog && _dos_parse_u64(watchdog, 0, INT64_MAX, &x) != 0) {
		fprintf(stderr,
			"dos-train: STARPU_WATCHDOG_TIMEOUT = '%s': expected a whole number of microseconds in base 10 "
			"(0 turns the watchdog off; unset, it is %s)\n",
			watchdog, HANG_TIMEOUT_US);
		return 2;
	}
	char why[256];
	enum dos_cpu_isa isa;
	if (_dos_cpu_isa_from_env(&isa, why, sizeof why) != 0) {
		fprintf(stderr, "dos-train: %s\n", why);
		return 2;
	}
	/* the policies' own settings: a policy warns and keeps its default (it cannot refuse
	 * to start), which would run another experiment than the one asked for */
	if (_dos_policy_settings_check(why, sizeof why) != 0) {
		fprintf(stderr, "dos-train: %s\n", why);
		return 2;
	}
#ifndef STARPU_SIMGRID
	return check_starpu_model_folder();
#else
	return 0;
#endif
}

static void stop_hung_run(void *arg)
{
	const struct dos_data_parallel *dp = arg;
	const char *limit = getenv("STARPU_LIMIT_CUDA_MEM"), *timeout = getenv("STARPU_WATCHDOG_TIMEOUT");
	/* in a job, the usual cause is another rank: its tasks wait for that rank's messages */
	char rank[160] = "";
	if (_dos_dp_size(dp) > 1)
		snprintf(rank, sizeof rank,
			 ", or another rank of this job of %d that stopped sending (hung, stopped, or much slower); "
			 "this is rank %d",
			 _dos_dp_size(dp), dp->rank);
	fflush(stdout);
	fprintf(stderr,
		"dos-train: no task ended for %g s with %d tasks submitted (STARPU_WATCHDOG_TIMEOUT = %s us): StarPU "
		"seems stuck, e.g. on a GPU too small for what its queued tasks need at once (STARPU_LIMIT_CUDA_MEM "
		"= %s)%s; stopping the run\n",
		timeout ? atof(timeout) / 1e6 : 0.0, starpu_task_nsubmitted(), timeout ? timeout : "?",
		limit ? limit : "unset, the whole GPU", rank);
	_exit(1);
}

/* Starts StarPU (or StarPU-MPI, under mpirun or srun) with the policy asked for: --policy,
 * or STARPU_SCHED, which overrides it (and may name ours too), and, with --trace, FxT
 * writing into its folder. StarPU runs its default policy when it does not know the name:
 * such a name is refused, naming where it came from. Returns 0 (*running: the policy's
 * name), 1 (StarPU did not start) or 2 (bad usage), after a message. */
static int start_starpu(struct train_options *o, int *argc, char ***argv, struct dos_rank_binding *binding,
			const char **running)
{
	struct dos_train_config *cfg = &o->cfg;
	if (o->trace) {
		char prefix[4096];
		snprintf(prefix, sizeof prefix, "%s/", o->trace);
		setenv("STARPU_FXT_PREFIX", prefix, 1);
		setenv("STARPU_FXT_TRACE", "1", 1);
	}
	const char *env = getenv("STARPU_SCHED");
	const char *requested = env && *env ? env : o->policy, *source = env && *env ? "STARPU_SCHED" : "--policy";
	struct starpu_sched_policy *ours = dos_sched_policy(requested);
	if (ours && env) /* StarPU would look the name up among its own policies, and not find it */
		unsetenv("STARPU_SCHED");
#ifndef STARPU_SIMGRID
	setenv("STARPU_WATCHDOG_TIMEOUT", HANG_TIMEOUT_US, 0); /* the user's own setting wins */
#endif
	const char *watchdog = getenv("STARPU_WATCHDOG_TIMEOUT");
	if (watchdog && atoll(watchdog) == 0) /* 0 turns it off (StarPU would check without pause) */
		unsetenv("STARPU_WATCHDOG_TIMEOUT");
	starpu_task_watchdog_set_hook(stop_hung_run, &o->cfg.dp);
	struct starpu_conf conf;
	starpu_conf_init(&conf);
	if (ours)
		conf.sched_policy = ours;
	else
		conf.sched_policy_name = requested;
	/* under mpirun or srun: a data-parallel job over StarPU-MPI, one rank per process */
	int err, launched = _dos_dp_launched() && (!o->simulate || _dos_dp_available());
	if (launched && !_dos_dp_available()) {
		fprintf(stderr, "dos-train: launched by mpirun or srun, but built without StarPU-MPI: each process "
				"would train alone; rebuild with MPI (configure --with-mpi)\n");
		return 2;
	}
	err = launched ? _dos_dp_init(argc, argv, &conf, &cfg->dp, binding) : starpu_init(&conf);
	if (err) {
		char why[900];
		fprintf(stderr, "dos-train: %s\n",
			launched ? dos_last_error() : _dos_starpu_init_explained(err, "starpu_init", why, sizeof why));
		return 1;
	}
	struct starpu_sched_policy *policy = starpu_sched_get_sched_policy();
	*running = policy && policy->policy_name ? policy->policy_name : "?";
	if (strcmp(*running, requested) != 0) {
		fprintf(stderr,
			"dos-train: %s = '%s': not one of ours nor a StarPU policy (StarPU would run '%s' instead); "
			"known: ",
			source, requested, *running);
		list_policies(stderr);
		fprintf(stderr, "\n");
		shutdown_runtime(&cfg->dp);
		return 2;
	}
	return 0;
}

/* ---- one job: every rank with the same settings ------------------------------------------ */

/* The size of the file at `path` and a hash of its bytes (FNV-1a), both 0 when it cannot
 * be read (the corpus loader then says why). */
static void file_fingerprint(const char *path, double *bytes, uint64_t *hash)
{
	*bytes = 0;
	*hash = 0;
	FILE *f = fopen(path, "rb");
	if (!f)
		return;
	uint64_t h = 0xcbf29ce484222325ull, n = 0;
	unsigned char buf[65536];
	for (size_t got; (got = fread(buf, 1, sizeof buf, f)) > 0; n += got)
		for (size_t i = 0; i < got; i++)
			h = (h ^ buf[i]) * 0x100000001b3ull;
	fclose(f);
	*bytes = (double)n;
	*hash = h;
}

/* The ranks of a data-parallel job must train one model on one corpus with one schedule.
 * Given other options, they hung (another --steps or --accumulate: a rank waits for
 * messages the other never sends), aborted in StarPU-MPI (another shape, precision or
 * subgroup size: messages of other sizes) or trained on without a word (another --lr,
 * --seed or --data). So each setting's smallest and largest value over the ranks are
 * compared before the run (values exact below 2^53, as doubles carry them); the corpus by
 * its size and content, not its path, which may differ between nodes. Settings that do
 * not change the result (--policy, where the state is made) may differ. Rank 0 names
 * every setting that differs; every rank returns 2 then. */
static int check_same_job(const struct train_options *o)
{
	const struct dos_train_config *cfg = &o->cfg;
	if (_dos_dp_size(&cfg->dp) < 2)
		return 0;
	double data_bytes;
	uint64_t data_hash;
	file_fingerprint(cfg->data_path, &data_bytes, &data_hash);
	const struct dos_adam_hparams *hp = &cfg->opt.hp;
	const struct {
		const char *option;
		double value;
		const char *text; /* rank 0's value, told instead of the numbers */
	} settings[] = {
		{"--vocab", cfg->shape.vocab, NULL},
		{"--hidden", cfg->shape.hidden, NULL},
		{"--heads", cfg->shape.heads, NULL},
		{"--ffn", cfg->shape.ffn, NULL},
		{"--layers", cfg->shape.layers, NULL},
		{"--seq-len", cfg->shape.seq_len, NULL},
		{"--precision", cfg->opt.weight_dtype, o->precision},
		{"--subgroup-size", (double)cfg->opt.subgroup_size, NULL},
		{"--subgroup-layout", cfg->opt.subgroups_follow_tensors,
		 cfg->opt.subgroups_follow_tensors ? "tensors" : "flat"},
		{"--steps", (double)cfg->steps, NULL},
		{"--micro-batch", cfg->micro_batch, NULL},
		{"--accumulate", cfg->accumulation, NULL},
		{"--seed", (double)cfg->seed, NULL},
		{"--data (its size in bytes)", data_bytes, NULL},
		{"--data (its content)", (double)(data_hash >> 11), "the file given"},
		{"--lr", hp->lr, NULL},
		{"--beta1", hp->beta1, NULL},
		{"--beta2", hp->beta2, NULL},
		{"--eps", hp->eps, NULL},
		{"--weight-decay", hp->weight_decay, NULL},
		{"--warmup", (double)cfg->opt.lr_schedule.warmup_steps, NULL},
		{"--decay-steps", (double)cfg->opt.lr_schedule.decay_steps, NULL},
		{"--min-lr-ratio", cfg->opt.lr_schedule.min_ratio, NULL},
		{"--clip", cfg->opt.clip_norm, NULL},
		{"--loss-scale", cfg->opt.dynamic_loss_scale ? cfg->opt.loss_scale_init : 0, NULL},
		{"--eval-every", (double)cfg->eval_every, NULL},
		{"--eval-fraction", cfg->eval_fraction, NULL},
		{"--eval-batches", cfg->eval_batches, NULL},
		{"--dp-exchange", cfg->dp.exchange, cfg->dp.exchange == DOS_DP_SCATTER ? "scatter" : "chain"},
		{"--checkpoint-every", cfg->checkpoint_dir ? (double)cfg->checkpoint_every : 0, NULL},
		{"--resume", cfg->resume, cfg->resume ? "--resume" : "no --resume"},
	};
	int differ = 0;
	for (size_t i = 0; i < sizeof settings / sizeof *settings; i++) {
		double x = settings[i].value, lo = -_dos_dp_max(-x), hi = _dos_dp_max(x);
		if (lo == hi)
			continue;
		differ = 1;
		if (cfg->dp.rank != 0)
			continue;
		if (settings[i].text) {
			fprintf(stderr, "dos-train: %s differs between the ranks of this job: rank 0 has %s\n",
				settings[i].option, settings[i].text);
			continue;
		}
		/* the shortest digits that tell the two apart */
		char mine[40], other[40];
		for (int digits = 6; digits <= 17; digits++) {
			snprintf(mine, sizeof mine, "%.*g", digits, x);
			snprintf(other, sizeof other, "%.*g", digits, x == lo ? hi : lo);
			if (strcmp(mine, other) != 0)
				break;
		}
		fprintf(stderr, "dos-train: %s differs between the ranks of this job: rank 0 has %s, another %s\n",
			settings[i].option, mine, other);
	}
	if (differ && cfg->dp.rank == 0)
		fprintf(stderr,
			"dos-train: every rank of a data-parallel job needs the same options and the same data: "
			"nothing was run\n");
	return differ ? 2 : 0;
}

/* ---- the run ----------------------------------------------------------------------------- */

static void checkpoint_skipped(void *arg, const char *path, const char *why)
{
	(void)arg;
	fprintf(stderr, "dos-train: --resume: skipping %s: %s\n", path, why);
}

static void checkpoint_set_aside(void *arg, const char *path, const char *why)
{
	(void)arg;
	fprintf(stderr, "dos-train: --resume: set aside %s: %s\n", path, why);
}

/* The job's header: each rank's share of a data-parallel job, then (rank 0 alone: the
 * others are silenced here, *quiet set when that fails) the model, the batch, the policy
 * that runs, the workers. */
static void print_header(const struct train_options *o, const struct dos_train_config *cfg, const char *running,
			 const struct dos_rank_binding *binding, int *quiet)
{
	uint64_t params = o->params;
	int ranks = _dos_dp_size(&cfg->dp);
	unsigned ncpu = starpu_worker_get_count_by_type(STARPU_CPU_WORKER);
	unsigned ncuda = starpu_worker_get_count_by_type(STARPU_CUDA_WORKER);
	struct dos_subgroup_map map;
	int have_map = subgroups_of(cfg, &map) == 0;
	if (ranks > 1 && have_map) /* before the job's header, which rank 0 prints */
		print_rank_share(cfg, &map, ncpu, ncuda, binding);
	if (cfg->dp.rank != 0 && !silence_stdout()) /* rank 0 reports the job */
		*quiet = 1;
	char count[32] = "?";
	if (have_map)
		snprintf(count, sizeof count, "%u", map.nsubgroups);
	printf("dos-train: %s model (V %u, hidden %u, heads %u, FFN %u, layers %u, seq %u): %.3g M parameters, "
	       "%s subgroups of at most %llu, %s\n",
	       o->preset->name, cfg->shape.vocab, cfg->shape.hidden, cfg->shape.heads, cfg->shape.ffn,
	       cfg->shape.layers, cfg->shape.seq_len, params / 1e6, count, (unsigned long long)cfg->opt.subgroup_size,
	       cfg->opt.subgroups_follow_tensors ? "following the tensors" : "across tensors");
	if (have_map)
		_dos_subgroup_map_free(&map);
	printf("dos-train: %llu steps of %u x %u sequences%s, %s, policy %s, %u CPU + %u CUDA workers, data %s\n",
	       (unsigned long long)cfg->steps, cfg->accumulation * ranks, cfg->micro_batch,
	       ranks == 1                           ? ""
	       : cfg->dp.exchange == DOS_DP_SCATTER ? " (the global batch, exchanged by scatter)"
						    : " (the global batch, exchanged by chain)",
	       o->precision, running, ncpu, ncuda, cfg->data_path);
	/* what mixed precision saves: 16-bit activations are half of fp32's */
	uint64_t act_bytes = _dos_model_activation_bytes(&cfg->shape, cfg->micro_batch, cfg->opt.weight_dtype,
							 cfg->checkpoint_activations);
	printf("dos-train: model computes in %s: activations %llu bytes (%.1f MiB) per micro-batch at their peak\n",
	       dos_dtype_name(cfg->opt.weight_dtype), (unsigned long long)act_bytes, act_bytes / 1048576.0);
	fflush(stdout);
}

#ifdef STARPU_SIMGRID
#define CLOCK " simulated"
#else
#define CLOCK ""
#endif

static void print_phase_seconds(const char *label, const double seconds[DOS_TASK_PHASES])
{
	printf("summary: %s:", label);
	for (int p = 0; p < DOS_TASK_PHASES; p++)
		printf(" %s %.2f s%s", _dos_task_phase_name((enum _dos_task_phase)p), seconds[p],
		       p + 1 < DOS_TASK_PHASES ? "," : "\n");
}

/* The summary of a finished run: losses, times, where the updates ran. */
static void print_summary(const struct train_options *o, const struct dos_train_config *cfg,
			  const struct dos_train_output *out, struct progress *pr, struct accounting *acc)
{
	int ranks = _dos_dp_size(&cfg->dp);
	uint64_t steps_run = cfg->steps > out->resumed_from ? cfg->steps - out->resumed_from : 0;
	if (out->resumed_from)
		printf("dos-train: resumed after step %llu from %s\n", (unsigned long long)out->resumed_from,
		       out->resumed_path);
	uint64_t tokens = steps_run * (uint64_t)cfg->accumulation * ranks * cfg->micro_batch * cfg->shape.seq_len;
	for (int p = 0; p < DOS_TASK_PHASES; p++) { /* the job's, over every rank's workers */
		acc->busy[p] = _dos_dp_sum(acc->busy[p]);
		acc->busy_cuda[p] = _dos_dp_sum(acc->busy_cuda[p]);
	}
	acc->updates_cpu = (uint64_t)_dos_dp_sum((double)acc->updates_cpu);
	acc->updates_gpu = (uint64_t)_dos_dp_sum((double)acc->updates_gpu);
	for (int g = 0; g < 2; g++) {
		acc->product_flops[g] = _dos_dp_sum(acc->product_flops[g]);
		acc->product_seconds[g] = _dos_dp_sum(acc->product_seconds[g]);
	}
	if (steps_run == 0) {
		printf("summary: nothing to do: the checkpoint is at step %llu, --steps is %llu\n",
		       (unsigned long long)out->resumed_from, (unsigned long long)cfg->steps);
	} else if (isnan(pr->first_loss)) {
		printf("summary: %llu steps (%llu skipped) in %.3f" CLOCK " s (%.3f s per step), %.0f tokens/s; no "
		       "losses (no task body runs in simulation)\n",
		       (unsigned long long)steps_run, (unsigned long long)out->skipped_steps, out->seconds,
		       out->seconds / (double)steps_run, tokens / out->seconds);
	} else {
		printf("summary: loss %.4f -> %.4f over %llu steps (%llu skipped), %.1f" CLOCK " s, %.0f tokens/s\n",
		       pr->first_loss, pr->last_loss, (unsigned long long)steps_run,
		       (unsigned long long)out->skipped_steps, out->seconds, tokens / out->seconds);
		uint64_t window = pr->seen < LOSS_WINDOW ? pr->seen : LOSS_WINDOW;
		double recent_sum = 0;
		for (uint64_t i = 0; i < window; i++)
			recent_sum += pr->recent[i];
		printf("summary: mean loss of the first %llu steps %.4f, of the last %llu steps %.4f\n",
		       (unsigned long long)window, pr->first_sum / (double)window, (unsigned long long)window,
		       recent_sum / (double)window);
		if (pr->evaluations)
			printf("summary: held-out loss %.4f after step %llu, %.4f after step %llu (%llu evaluations on "
			       "the last %g of the data, not trained on)\n",
			       pr->first_eval, (unsigned long long)pr->first_eval_step, pr->last_eval,
			       (unsigned long long)pr->last_eval_step, (unsigned long long)pr->evaluations,
			       o->cfg.eval_fraction);
	}
	print_steady_iteration(pr, CLOCK);
	print_gradient_tail(acc, steps_run < acc->steps ? steps_run : acc->steps, CLOCK);
	print_phase_seconds("task time by phase (summed over workers)", acc->busy);
	/* where the exchange's copies ran is where their data crossed the link, or did not */
	print_phase_seconds("of which on CUDA workers", acc->busy_cuda);
	/* Against `dos-bench gemm` (one OpenBLAS thread; cuBLAS per precision): the share of
	 * the machine's product rate that forward and backward reach. */
	for (int g = 0; g < 2; g++)
		if (acc->product_seconds[g] > 0 && steps_run > 0)
			printf("summary: forward and backward matrix products on %s workers: %.4g GFLOP per step, %.2f "
			       "GFLOP/s over their %.2f s of task time\n",
			       g ? "CUDA" : "CPU", acc->product_flops[g] * 1e-9 / (double)steps_run,
			       acc->product_flops[g] * 1e-9 / acc->product_seconds[g], acc->product_seconds[g]);
	printf("summary: subgroup updates ran %llu on CPU workers, %llu on GPU workers; %zu of those of the first %d "
	       "steps started while backward was still running\n",
	       (unsigned long long)acc->updates_cpu, (unsigned long long)acc->updates_gpu,
	       updates_during_backward(&acc->backward, &acc->updates), OVERLAP_STEPS);
}

static int train_main(int argc, char **argv);

/* SIGTERM (Slurm at the job's time limit, `scancel`) or SIGINT (Ctrl-C): the first stops
 * the run after the step in progress, with a checkpoint when it has a folder (the batch
 * system's grace period, 30 s by default, is several steps of a large model); a second
 * one ends the process at once, as without a handler. */
static volatile sig_atomic_t stop_signal;

static void on_stop_signal(int sig)
{
	if (stop_signal) {
		signal(sig, SIG_DFL);
		raise(sig);
		return;
	}
	stop_signal = sig;
	static const char said[] = "\ndos-train: stop requested by a signal: ending after the step in progress "
				   "(a second signal ends the process at once)\n";
	ssize_t ignored = write(STDERR_FILENO, said, sizeof said - 1);
	(void)ignored;
}

/* After StarPU started: its own SIGINT handler (for its FxT trace) is replaced. */
static void catch_stop_signals(void)
{
	struct sigaction sa = {.sa_handler = on_stop_signal};
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
}

#if defined(STARPU_SIMGRID) && !DOS_SMPI
/* When every simulated activity waits on another (a deadlock in StarPU, e.g. a GPU too
 * small for its suballocator's chunks), SimGrid stops the simulation and StarPU's main()
 * returns 0 without ours having returned: a script would take the run for a success. */
static int train_main_returned;

static void fail_if_simulation_stopped(void)
{
	if (train_main_returned)
		return;
	fflush(stdout);
	fprintf(stderr,
		"dos-train: the simulation stopped before training ended (SimGrid's \"Deadlock detected\" "
		"above: every worker waits on memory or a transfer); STARPU_LIMIT_CUDA_MEM = %s\n",
		getenv("STARPU_LIMIT_CUDA_MEM") ? getenv("STARPU_LIMIT_CUDA_MEM") : "unset, the whole GPU");
	_exit(1);
}

int main(int argc, char **argv)
{
	atexit(fail_if_simulation_stopped);
	int status = train_main(argc, argv);
	train_main_returned = 1;
	return status;
}
#else
int main(int argc, char **argv)
{
	return train_main(argc, argv);
}
#endif

static int train_main(int argc, char **argv)
{
	_dos_errors_printed_by_caller(); /* we print the library's error messages ourselves, once */
	struct train_options opts;
	switch (dos_train_parse_options(argc, argv, &opts, stderr)) {
	case TRAIN_OPTIONS_RUN:
		break;
	case TRAIN_OPTIONS_HELP:
		return 0;
	default:
		return 2;
	}
	/* dos-train's warnings follow the library's rule (DOS_QUIET=1 silences both) */
	if (!_dos_warnings_silenced())
		dos_train_warn_options(&opts, stderr);
	struct dos_train_config *cfg = &opts.cfg;
	if (_dos_model_shape_check(&cfg->shape) != 0) { /* before StarPU starts */
		fprintf(stderr, "dos-train: %s\n", dos_last_error());
		return 2;
	}
#ifdef STARPU_SIMGRID
	if (!opts.simulate) {
		const char *machine = getenv("STARPU_HOSTNAME");
		printf("dos-train: simulated machine %s (environment set by the caller)\n", machine ? machine : "?");
	}
#else
	if (opts.simulate) {
		fprintf(stderr,
			"dos-train: --simulate = '%s': this dos-train runs on the real machine; use the one built "
			"against StarPU's SimGrid variant (build-simgrid/dos-train)\n",
			opts.simulate);
		return 2;
	}
#endif
	int status = check_files(&opts);
	if (!status)
		status = check_environment();
	if (status)
		return status;
	struct dos_rank_binding binding = {0};
	const char *running;
	if ((status = start_starpu(&opts, &argc, &argv, &binding, &running)))
		return status;
	dos_train_resolve_layout(&opts); /* the ranks are known now */
	if ((status = check_same_job(&opts))) {
		shutdown_runtime(&cfg->dp);
		return status;
	}

	int reporter = cfg->dp.rank == 0, quiet = opts.quiet;
	const char *plot = reporter ? opts.plot : NULL; /* one voice: rank 0 reports the job */
	struct accounting acc = {.lock = PTHREAD_MUTEX_INITIALIZER, .accumulation = cfg->accumulation};
	acc.backward_end = calloc(cfg->steps, sizeof *acc.backward_end);
	acc.gradient_ready = calloc(cfg->steps, sizeof *acc.gradient_ready);
	acc.steps = acc.backward_end && acc.gradient_ready ? cfg->steps : 0; /* a statistic: none without memory */
	struct progress pr = {.tty = isatty(STDOUT_FILENO), .quiet = quiet || !reporter};
	struct dos_train_output out = {0};
	int err = 0;
	starpu_profiling_status_set(STARPU_PROFILING_ENABLE);
	if (plot && (err = dos_timeline_create(&acc.timeline)))
		fprintf(stderr, "dos-train: --plot: cannot record the timeline (%d)\n", err);
	float **arrays[] = {&out.master, &out.m, &out.v, &out.weights};
	for (int i = 0; i < 4 && opts.dump && !err; i++)
		if (!(*arrays[i] = malloc(opts.params * sizeof(float))))
			err = -ENOMEM, fprintf(stderr, "dos-train: no memory for --dump\n");
	if (err) {
		dos_timeline_destroy(acc.timeline);
		free(acc.backward_end);
		free(acc.gradient_ready);
		shutdown_runtime(&cfg->dp);
		return 1;
	}
	cfg->on_step = on_step;
	cfg->on_step_arg = &pr;
	cfg->hook = watch_task;
	cfg->hook_arg = &acc;
	cfg->checkpoint_skipped = checkpoint_skipped;
	cfg->checkpoint_set_aside = checkpoint_set_aside;
	if (plot) {
		cfg->before_last_step = start_timeline;
		cfg->before_last_step_arg = &acc;
	}
	print_header(&opts, cfg, running, &binding, &pr.quiet);

	cfg->stop_requested = &stop_signal;
	catch_stop_signals();
	err = _dos_train_run(cfg, &out);
	if (pr.tty && !pr.quiet)
		printf("\n");
	if (err == -EINTR) { /* as a shell reports a process ended by that signal */
		fprintf(stderr, "dos-train: %s\n", dos_last_error());
		status = 128 + (stop_signal ? stop_signal : SIGTERM);
	} else if (err) {
		dos_train_print_library_error(stderr); /* naming the options, not the library's fields */
		status =
			err == -EINVAL || err == -ENOENT || err == -EISDIR || err == -EEXIST || err == -ENOTDIR ? 2 : 1;
	} else {
		print_summary(&opts, cfg, &out, &pr, &acc);
		if (plot) {
			char title[256];
			snprintf(title, sizeof title, "dos-train: last training iteration, %s model, policy %s%s",
				 opts.preset->name, running,
				 cfg->eval_every ? " (the held-out evaluation after it not drawn)" : "");
			if ((err = dos_timeline_write_svg(acc.timeline, plot, title))) {
				fprintf(stderr, "dos-train: --plot %s: %s\n", plot, strerror(-err));
				status = 1;
			} else
				printf("dos-train: picture of the last training iteration in %s\n", plot);
		}
		if (opts.dump && write_dump(opts.dump, &out, opts.params, &cfg->dp))
			status = 1;
	}
	free(pr.loss_at);
	dos_timeline_destroy(acc.timeline);
	free(acc.backward.at);
	free(acc.backward_end);
	free(acc.gradient_ready);
	free(acc.updates.at);
	for (int i = 0; i < 4; i++)
		free(*arrays[i]);
	shutdown_runtime(&cfg->dp);
	if (opts.trace && !err)
		printf("dos-train: FxT trace in %s/ (starpu_fxt_tool -i %s/prof_file_*)\n", opts.trace, opts.trace);
	/* a report that did not reach its file (stdout redirected to a full disk) is a failed
	 * run for a batch script, which would otherwise find an empty log and status 0 */
	int flushed = fflush(stdout), why = errno;
	if (flushed != 0 || ferror(stdout)) {
		fprintf(stderr, "dos-train: cannot write the report on standard output: %s\n",
			flushed ? strerror(why) : "a write failed");
		if (!status)
			status = 1;
	}
	return status;
}
