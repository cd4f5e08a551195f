/* The dos scheduling policy and its static baselines, as StarPU policies.
 *
 * Any task: per-worker queues (worker_queues.c): earliest finish time over the workers
 * of the context, from StarPU's perfmodels and transfer predictions, with input prefetch
 * (dmda's rule, for tasks we know nothing special about); queue length where no model
 * predicts, with idle workers taking such tasks from others; priority order within a
 * queue; parallel tasks on combined workers.
 *
 * Update tasks (ours, dos_adam, and the foreign codelets registered by name:
 * update_tasks.h): placed by a plan made once per step. submit_hook collects every
 * update task of a step as it is submitted, before its gradients are ready; the step is
 * planned once, when it is complete (the step contract of dos.h) and one of its updates
 * is ready; a ready update of a step not yet complete waits in the step (parked) while
 * its completion is sure to be announced. The whole step is planned at once
 * (planner.c) from the cost model (rates.c: perfmodels as measured in the previous
 * steps, bus model, GPU memory left after the forecast of what the application's own
 * tasks used, host contention). Then:
 *  - CPU-placed updates wait in one pool that any CPU worker takes from;
 *  - state newly kept resident is prefetched at plan time, so its transfer overlaps
 *    whatever still runs before the update (the end of backward); staged state and the
 *    gradients of GPU updates are fetched a few ahead of the GPU (fetch windows);
 *  - GPU-transient state is marked for write-back (starpu_data_wont_use) as soon as its
 *    update ends, and written home at once when the GPU cannot keep it until the next
 *    update phase, so the link works during the rest of the phase and memory is freed;
 *  - GPU-resident state stays on the GPU across steps, and is found there by the next
 *    plan: no transfer at all, while memory allows;
 *  - on the GPU, an update whose inputs are still crossing the link yields to the
 *    application tasks queued behind it (the end of backward), instead of holding them up.
 * The tasks that create a fresh run's state (codelets/init_state.c) run where the first
 * plan will find it useful: on the GPU for the state it will keep there, else on the GPU
 * with the state written home at once (one GPU) or on the CPU (several GPUs:
 * place_state_init).
 * docs/policy.md explains the algorithm.
 * The policy names select the placement rule: "dos" (the plan above), "all-cpu"
 * (ZeRO-Offload), "stride" (the DOS prototype: every k-th subgroup, k = DOS_STRIDE_K,
 * default 2, state in and out every step), "resident" (Twin-Flow: the first
 * DOS_RESIDENT_RATIO share, default 0.5, kept on the GPU). Everything else is shared, so
 * they differ only in the placement rule. Every GPU of the context is planned for: the
 * rule places the step on the GPUs pooled into one (the bound's view of a node), then
 * assign_gpus gives each GPU-placed update a GPU (its state's, the next of a run of
 * neighbours, the least busy), and prefer_residency_only replaces that plan by filling
 * every GPU with resident state where that is faster GPU by GPU; each GPU has its own
 * budget, forecast, windows and queue. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <starpu.h>
#include <starpu_scheduler.h>

#include "app_memory.h"
#include "codelet_util.h"
#include "codelets.h"
#include "dos.h"
#include "dos_policy.h"
#include "planner.h"
#include "errors.h"
#include "parse.h"
#include "rates.h"
#include "update_tasks.h"
#include "worker_queues.h"

enum placement_rule { RULE_DOS, RULE_ALL_CPU, RULE_STRIDE, RULE_RESIDENT };

/* Updates of the planned step, in plan order, whose inputs (buffers first..last, of enum
 * _dos_adam_buffer) are fetched to `node` `ahead` tasks ahead of the workers that run
 * them: each update that ends starts the next fetch, so transfers run ahead of the work
 * without taking more memory than the plan allows.
 * Two kinds of fetch. The state (the optimizer's own) and inputs with a home node are
 * fetched by handle as soon as the window reaches them, even before the update
 * is ready (staged state during backward). A gradient or 16-bit weights with no home is
 * data the step produces and may drop once consumed (the training graph does, so that
 * StarPU never writes dead data back), and StarPU refuses a handle prefetch once such a
 * drop has been submitted, whatever the order of the tasks; so those are fetched with
 * the task itself (starpu_prefetch_task_input_on_node), once it is ready (pushed) and the
 * window has reached it.
 * An update whose only fetch is task-level (a resident subgroup's gradient made by the
 * step) is fetched instead in the order updates become ready, up to `ahead` fetched and
 * not started (fetch_ready_in_order), not when the window reaches it: updates become
 * ready in the order backward ends their gradients (the last layers first), not in plan
 * order, and they run in the order they became ready (a worker's queue). Fetched in plan
 * order, the first-ready updates at the front of the GPU's queue waited for fetches that
 * the window would issue only once the updates queued behind them had ended; each ran
 * only when the worker, finding no application task behind it, took it and fetched for
 * itself (simulated 7b on 4 nodes, whose exchange keeps application tasks queued: 175 ms). */
struct fetch_entry {
	starpu_data_handle_t handle[4]; /* copied at plan time: the task may be gone later */
	int nhandles;
	int fetch_task_inputs;    /* some input of the window has no home: fetch with the task */
	struct starpu_task *task; /* valid from push to start only (the plan lock held) */
	int pushed;               /* ready: the task-level fetch may run */
	int task_fetched;         /* it did (StarPU allows one per task) */
	int started;              /* the update began: fetching for it now would be late or stale */
	double gpu_bytes;         /* what its update takes on the GPU (staged: state and copies) */
};

struct prefetch_request {
	starpu_data_handle_t handle;
	unsigned node;
	int prio;
	int idle; /* only when the link has nothing else to do */
};

struct deferred_prefetches {
	struct prefetch_request *at;
	int n, cap;
};

struct fetch_window {
	struct fetch_entry *entries;
	int n, next, ended, cap, ahead;
	/* entries whose only fetch is task-level, in the order they were pushed: those from
	 * `ready_head` on are still to fetch (fetch_ready_in_order) */
	int *ready, ready_head, ready_tail;
	int task_fetches_pending; /* task-level fetches issued for updates not started yet */
	int first_buffer, last_buffer;
	int node;
	/* > 0: GPU memory that the fetched updates not ended, and the last one ended (its
	 * state still being written back), may take together (staged state written back
	 * eagerly) */
	double room_bytes;
};

/* Gradients of resident subgroups are small (2 B/param against 12 of state): a couple
 * fetched ahead keep the GPU busy, within the safety margin of the budget. */
#define RESIDENT_GRADIENTS_AHEAD 2

/* The update tasks of one step, collected at submission until the step is planned. */
struct step_tasks {
	uint64_t step;
	int n, cap;
	struct starpu_task **tasks;
	/* each task's view (update_tasks.h), made once as it is collected: its buffers and
	 * sizes do not change before it runs, and the plan reads them several times */
	struct _dos_update_view *views;
	int planned;
	int closed;                     /* all its updates are submitted (dos.h's step contract) */
	uint32_t epoch;                 /* of this use of the slot, in its tasks' COLLECTED_TAG */
	struct starpu_task_list parked; /* ready updates waiting for the plan */
};

/* The weight handles updated in the step being submitted, for foreign updates (which
 * carry no step number): a handle updated again starts the next step. */
struct handle_set {
	starpu_data_handle_t *at; /* open addressing, NULL: empty */
	size_t cap, n;
};

/* One GPU of the context, as the plan uses it. */
struct gpu_plan {
	int node;   /* its memory node */
	int worker; /* its first worker in the context: the queue the plan reads */
	double h2d_bytes_per_second, d2h_bytes_per_second; /* with all GPUs transferring */
	/* the GPU behind the same PCIe switch or host bridge that names the link they share
	 * (rates.c; its own index when it has its link to itself), and what that link carries
	 * each way for all of them together */
	int link;
	double link_h2d_bytes_per_second, link_d2h_bytes_per_second;
	struct fetch_window staged;   /* to this GPU: state and gradient, `staging slots` ahead */
	struct fetch_window resident; /* to this GPU: gradient only, RESIDENT_GRADIENTS_AHEAD ahead */
	/* staged state is written home as its update ends (post_exec_hook), not lazily: the
	 * GPU cannot keep it beside the resident state until the next update phase */
	int eager_writeback;
	/* the application's GPU memory on this GPU: learned from its GPU tasks over the last
	 * iteration (app_memory.c) */
	struct dos_app_memory app_memory;
	/* the last plan's: the room for optimizer state and what it kept resident */
	double budget_bytes, update_extra_bytes, resident_bytes;
	/* a fresh run's state created and kept here by init tasks (place_state_init) */
	double born_state_bytes;
};

/* The GPU index of a placed update lives in its placement tag: 4 bits. */
#define MAX_GPUS 16

struct policy {
	enum placement_rule rule;
	int stride_k;
	double resident_ratio;
	starpu_pthread_mutex_t plan_lock; /* guards everything but the queues */
	/* A training loop submits step k+1 before step k's gradients are ready, so several
	 * steps are collected at once; each is planned once (dos.h's step contract). */
#define STEP_SLOTS DOS_STEPS_IN_FLIGHT
	struct step_tasks steps[STEP_SLOTS];
	int announced; /* the submitter calls dos_sched_step_submitted */
	/* Updates of the last complete step (0: none complete yet), counted per step number,
	 * not per plan: a first step planned in parts as its updates became ready still
	 * counts whole, so that later steps can wait for their plan. */
	int last_step_size;
	uint64_t counting_step; /* the newest step submitted, and its updates so far */
	int counted;
	int warned_window; /* the step-window warning is printed once */
	struct handle_set foreign_seen;
	uint64_t foreign_step;               /* step number given to foreign updates */
	struct fetch_window on_cpu;          /* to host memory: GPU-homed gradients, as soon as final */
	uint32_t generation;                 /* of the current plan (and windows) */
	struct deferred_prefetches deferred; /* decided under the plan lock, issued after */
	int said_no_gpu_room;                /* the no-GPU-room warning is printed once */
	int verbose;                         /* DOS_SCHED_VERBOSE: 1 a summary, 2 also each plan */
	/* the optimizer's own data, which no GPU's forecast counts as the application's */
	struct dos_app_exclusions optimizer_data;
	/* the GPUs planned for: the context's, known before the first plan so that the
	 * forecasts of the application's memory learn from the first forward and backward */
	int ngpus;
	struct gpu_plan gpu[MAX_GPUS];
	int residency_only; /* the last plan is prefer_residency_only's, not the pool's */
	/* the application's GPU memory besides what each GPU learns: declared by it (the
	 * prior, and the floor when it runs tasks we do not see), and extra headroom asked
	 * for by the user */
	double app_reserve_bytes;       /* dos_sched_reserve_gpu_bytes */
	double declared_reserve_bytes;  /* DOS_GPU_RESERVE_MIB */
	int forecast_declared_only;     /* DOS_GPU_FORECAST=declared */
	double declared_override_bytes; /* DOS_GPU_DECLARED_MIB in place of the declaration; -1: none */
	/* what StarPU evicted of the state planned resident: added to the forecast */
	double eviction_margin_bytes;
	enum dos_placement *last_place; /* the last plan, to see what was evicted since */
	int last_n;
	/* plan_step's working arrays, kept from plan to plan (a step of 10,000 updates needs
	 * 250 kB, which malloc hands back to the system after each plan) with room for
	 * plan_cap updates; the next plan's placements (the last's are last_place) */
	struct dos_plan_subgroup *plan_sg;
	int *plan_where;
	unsigned char *plan_gpu_of;
	enum dos_placement *plan_place;
	int plan_cap;
	/* init tasks of a fresh run's state (place_state_init), by where they were placed */
	unsigned long state_inits_on_gpu, state_inits_on_cpu, state_inits_home_via_gpu;
	/* a fresh run's state announced (_dos_sched_state_coming), and how much of it the
	 * init tasks placed so far make */
	double state_coming_bytes, state_placed_bytes;
	/* updates whose only fetch is task-level that started before the policy fetched for
	 * them (their worker then fetched alone, late): none when the windows keep ahead */
	unsigned long started_unfetched;
	/* GPU pops where an update at the queue's front, its inputs not arrived, let a task
	 * behind it go first (next_gpu_task) */
	unsigned long gpu_yields;
	/* CPU-planned updates: one pool any CPU worker of the context takes from, as
	 * DeepSpeed's CPU Adam takes the next subgroup (cheaper than predicting which of
	 * several cores sharing memory bandwidth finishes first) */
	starpu_pthread_mutex_t pool_lock;
	struct starpu_task_list cpu_pool;
	/* every other task, and GPU-planned updates: per-worker queues (worker_queues.c) */
	struct dos_worker_queues queues;
	struct dos_sched_stats stats;
};

/* task->sched_data carries an update task's planned placement (offset by one so that a
 * NULL means "no plan"), the index of its GPU in policy.gpu (0 for CPU updates), its index
 * in its fetch window, and the plan's generation: with steps overlapping, a task of an
 * older plan must not touch the current windows. Bits: 0-7 placement, 8-11 GPU, 12-31
 * window index, 32-63 generation. */
#define MAX_STEP_UPDATES (1 << 20)
#define PLACEMENT_TAG(p, gpu, index, generation)                                                                   \
	((void *)(uintptr_t)(((uint64_t)(generation) << 32) | ((uint64_t)(index) << 12) | ((uint64_t)(gpu) << 8) | \
			     (uint64_t)((p) + 1)))
#define TAG_PLACEMENT(d) ((enum dos_placement)(((uintptr_t)(d)&0xff) - 1))
#define TAG_GPU(d) ((int)(((uintptr_t)(d) >> 8) & 0xf))
#define TAG_INDEX(d) ((int)(((uintptr_t)(d) >> 12) & 0xfffff))
#define TAG_GENERATION(d) ((uint32_t)((uint64_t)(uintptr_t)(d) >> 32))
/* Before its plan, an update's sched_data names its step's slot and the slot's epoch. */
#define COLLECTED_TAG(slot, epoch) \
	((void *)(uintptr_t)(((uint64_t)(epoch) << 32) | ((uint64_t)(slot) << 8) | (uint64_t)0xff))
#define IS_COLLECTED(d) (((uintptr_t)(d)&0xff) == 0xff)
#define IS_PLACED(d) ((d) != NULL && !IS_COLLECTED(d))

/* Updates placed by a plan keep their order in a queue and stay on their worker. */
static int is_planned_update(const struct starpu_task *task)
{
	return _dos_is_update(task) && IS_PLACED(task->sched_data);
}

static double seconds_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static struct policy *policy_of(unsigned sched_ctx)
{
	return starpu_sched_ctx_get_policy_data(sched_ctx);
}

static void lock_plan(struct policy *p)
{
	/* a worker blocking here must stay wakeable by others (StarPU's locking rule) */
	starpu_worker_relax_on();
	STARPU_PTHREAD_MUTEX_LOCK(&p->plan_lock);
	starpu_worker_relax_off();
}

static void unlock_plan(struct policy *p)
{
	STARPU_PTHREAD_MUTEX_UNLOCK(&p->plan_lock);
}

/* The policies' numeric settings and their ranges: one rule for init_policy, which warns
 * and keeps the default (a scheduling policy cannot refuse to start), and for
 * _dos_policy_settings_check, with which a program refuses them before StarPU starts. */
static const struct setting {
	const char *name;
	int whole; /* a whole number in base 10, else a decimal one */
	double lo, hi;
} settings[] = {
	{"DOS_STRIDE_K", 1, 1, 1000000},     /* stride: every k-th update on the GPU */
	{"DOS_RESIDENT_RATIO", 0, 0, 1},     /* resident: the share kept on the GPU */
	{"DOS_GPU_RESERVE_MIB", 0, 0, 1e9},  /* GPU memory the plans leave alone */
	{"DOS_SCHED_VERBOSE", 1, 0, 9},      /* what the policies print at shutdown */
	{"DOS_GPU_DECLARED_MIB", 0, 0, 1e9}, /* overrides the application's declared GPU memory */
};

/* Setting `name`'s value into *x: 1 if set and valid, 0 if unset or empty, -1 if bad
 * (with why[] saying so). */
static int read_setting(const char *name, double *x, char *why, size_t size)
{
	const struct setting *st = NULL;
	for (size_t i = 0; i < sizeof settings / sizeof *settings && !st; i++)
		if (!strcmp(settings[i].name, name))
			st = &settings[i];
	STARPU_ASSERT_MSG(st, "%s is not one of the policy's settings", name);
	const char *s = getenv(name);
	if (!s || !*s)
		return 0;
	uint64_t u;
	if (st->whole ? _dos_parse_u64(s, (uint64_t)st->lo, (uint64_t)st->hi, &u) == 0
		      : _dos_parse_double(s, x) == 0 && *x >= st->lo && *x <= st->hi) {
		if (st->whole)
			*x = (double)u;
		return 1;
	}
	snprintf(why, size, "%s = '%s' is not a %s in [%.15g, %.15g]", name, s,
		 st->whole ? "whole number in base 10" : "decimal number", st->lo, st->hi);
	return -1;
}

static double env_setting(const char *name, double fallback)
{
	char why[256];
	double x;
	int got = read_setting(name, &x, why, sizeof why);
	if (got < 0)
		fprintf(stderr, "starpu-dos: %s; using %g\n", why, fallback);
	return got > 0 ? x : fallback;
}

/* DOS_GPU_FORECAST: whether plans use the declaration alone (1: "declared") or also what
 * is learned (0: "learned", the default); -1 if bad (with why[] saying so). */
static int read_forecast(char *why, size_t size)
{
	const char *forecast = getenv("DOS_GPU_FORECAST");
	if (!forecast || !*forecast || !strcmp(forecast, "learned"))
		return 0;
	if (!strcmp(forecast, "declared"))
		return 1;
	snprintf(why, size, "DOS_GPU_FORECAST = '%s' is neither 'learned' nor 'declared'", forecast);
	return -1;
}

int _dos_policy_settings_check(char *why, size_t size)
{
	double x;
	for (size_t i = 0; i < sizeof settings / sizeof *settings; i++)
		if (read_setting(settings[i].name, &x, why, size) < 0)
			return -EINVAL;
	return read_forecast(why, size) < 0 ? -EINVAL : 0;
}

static void init_policy(unsigned sched_ctx, enum placement_rule rule)
{
	struct policy *p = calloc(1, sizeof *p);
	STARPU_ASSERT_MSG(p, "out of memory for the dos policy");
	p->rule = rule;
	p->stride_k = (int)env_setting("DOS_STRIDE_K", 2);
	p->resident_ratio = env_setting("DOS_RESIDENT_RATIO", 0.5);
	p->declared_reserve_bytes = env_setting("DOS_GPU_RESERVE_MIB", 0) * 1048576.0;
	p->verbose = (int)env_setting("DOS_SCHED_VERBOSE", 0);
	double declared_mib = env_setting("DOS_GPU_DECLARED_MIB", -1);
	p->declared_override_bytes = declared_mib >= 0 ? declared_mib * 1048576.0 : -1;
	char why[256];
	int forecast = read_forecast(why, sizeof why);
	if (forecast < 0)
		fprintf(stderr, "starpu-dos: %s; using learned\n", why);
	p->forecast_declared_only = forecast == 1;
	for (int k = 0; k < MAX_GPUS; k++)
		_dos_app_memory_init(&p->gpu[k].app_memory, &p->optimizer_data);
	_dos_update_codelets_from_env();
	p->foreign_step = 1;
	for (int i = 0; i < STEP_SLOTS; i++)
		starpu_task_list_init(&p->steps[i].parked);
	/* the first window of the forecast: from now to the first plan (forward and backward
	 * of the first step) */
	for (int k = 0; k < MAX_GPUS; k++)
		_dos_app_memory_plan(&p->gpu[k].app_memory, starpu_timing_now() * 1e-6);
	STARPU_PTHREAD_MUTEX_INIT(&p->plan_lock, NULL);
	STARPU_PTHREAD_MUTEX_INIT(&p->pool_lock, NULL);
	starpu_task_list_init(&p->cpu_pool);
	_dos_queues_init(&p->queues, is_planned_update);
	/* The queues honour any priority: unless the application set a range, StarPU would
	 * clamp every task's priority to the default one, [0, 0] (lws and dmdas do the same). */
	if (!starpu_sched_ctx_min_priority_is_set(sched_ctx))
		starpu_sched_ctx_set_min_priority(sched_ctx, INT_MIN);
	if (!starpu_sched_ctx_max_priority_is_set(sched_ctx))
		starpu_sched_ctx_set_max_priority(sched_ctx, INT_MAX);
	starpu_sched_ctx_set_policy_data(sched_ctx, p);
}

static void init_dos(unsigned ctx)
{
	init_policy(ctx, RULE_DOS);
}
static void init_all_cpu(unsigned ctx)
{
	init_policy(ctx, RULE_ALL_CPU);
}
static void init_stride(unsigned ctx)
{
	init_policy(ctx, RULE_STRIDE);
}
static void init_resident(unsigned ctx)
{
	init_policy(ctx, RULE_RESIDENT);
}

static const char *rule_name(enum placement_rule rule)
{
	static const char *const names[] = {"dos", "all-cpu", "stride", "resident"};
	return names[rule];
}

static void window_free(struct fetch_window *w)
{
	free(w->entries);
	free(w->ready);
}

static void deinit_policy(unsigned sched_ctx)
{
	struct policy *p = policy_of(sched_ctx);
	if (p->verbose >= 1)
		fprintf(stderr,
			"starpu-dos: %s: %lu tasks placed (%.2f us each), %lu steps planned, %lu updates on CPU, %lu "
			"on GPU; last plan: %u of %u subgroups on GPU, predicted %.4g s, bound %.4g s, GPU budget %.3g "
			"GB, application forecast %.3g GB (%s)%s\n",
			rule_name(p->rule), p->stats.decisions,
			p->stats.decisions ? 1e6 * p->stats.decision_seconds / (double)p->stats.decisions : 0.0,
			p->stats.plans, p->stats.cpu_updates, p->stats.gpu_updates, p->stats.last_gpu_subgroups,
			p->stats.last_subgroups, p->stats.last_predicted_seconds, p->stats.last_bound_seconds,
			p->stats.gpu_budget_bytes * 1e-9, p->stats.app_forecast_bytes * 1e-9,
			p->stats.app_forecast_learned ? "learned" : "declared",
			p->stats.calibrated ? "" : " (uncalibrated)");
	if (p->verbose >= 1 && p->stats.gpu_updates > 0)
		fprintf(stderr,
			"starpu-dos: %s: %lu GPU updates started before their gradient was fetched for them; "
			"%lu times an update waiting for its inputs let a task behind it go first\n",
			rule_name(p->rule), p->started_unfetched, p->gpu_yields);
	if (p->verbose >= 1 && p->state_inits_on_gpu + p->state_inits_on_cpu + p->state_inits_home_via_gpu > 0)
		fprintf(stderr,
			"starpu-dos: %s: a fresh run's state created by %lu tasks on GPU (kept there), %lu on CPU, "
			"%lu on GPU and written home\n",
			rule_name(p->rule), p->state_inits_on_gpu, p->state_inits_on_cpu, p->state_inits_home_via_gpu);
	STARPU_PTHREAD_MUTEX_DESTROY(&p->plan_lock);
	STARPU_PTHREAD_MUTEX_DESTROY(&p->pool_lock);
	_dos_queues_destroy(&p->queues);
	for (int i = 0; i < STEP_SLOTS; i++) {
		free(p->steps[i].tasks);
		free(p->steps[i].views);
	}
	free(p->deferred.at);
	free(p->foreign_seen.at);
	for (int k = 0; k < MAX_GPUS; k++) {
		window_free(&p->gpu[k].staged);
		window_free(&p->gpu[k].resident);
		_dos_app_memory_free(&p->gpu[k].app_memory);
	}
	_dos_app_exclusions_free(&p->optimizer_data);
	window_free(&p->on_cpu);
	free(p->last_place);
	free(p->plan_sg);
	free(p->plan_where);
	free(p->plan_gpu_of);
	free(p->plan_place);
	free(p);
}

/* ---- collecting and planning a step -------------------------------------------------- */

/* The step still collecting `step`'s updates, if any (plan lock held). */
static struct step_tasks *collecting_slot(struct policy *p, uint64_t step)
{
	for (int i = 0; i < STEP_SLOTS; i++)
		if (p->steps[i].n > 0 && !p->steps[i].planned && p->steps[i].step == step)
			return &p->steps[i];
	return NULL;
}

static void plan_step(struct policy *p, struct step_tasks *s, unsigned sched_ctx);

/* The newest step submitted is complete (plan lock held): its size is the next steps'.
 * Its count goes on should more of its updates come (a wait within a step). */
static void newest_step_complete(struct policy *p)
{
	if (p->counted > 0)
		p->last_step_size = p->counted;
}

/* Marks step s complete (plan lock held): its size is known, and its parked updates are
 * planned and moved to `release`, for the caller to place once the lock is released. */
static void close_step(struct policy *p, struct step_tasks *s, unsigned sched_ctx, struct starpu_task_list *release)
{
	if (s->closed || s->planned || s->n == 0)
		return;
	s->closed = 1;
	if (starpu_task_list_empty(&s->parked))
		return;
	plan_step(p, s, sched_ctx);
	while (!starpu_task_list_empty(&s->parked))
		starpu_task_list_push_back(release, starpu_task_list_pop_front(&s->parked));
}

/* Where a submitted update of `step` goes: its step's slot, else a free or planned slot.
 * A new step completes the steps still collecting (a training loop submits its steps in
 * order). With DOS_STEPS_IN_FLIGHT steps unplanned already, the oldest is planned now,
 * early, to free its slot. Updates submitted after their step was planned start a new
 * batch (a plan of their own). */
static struct step_tasks *slot_for_submission(struct policy *p, uint64_t step, unsigned sched_ctx,
					      struct starpu_task_list *release)
{
	struct step_tasks *s = collecting_slot(p, step), *oldest = NULL;
	if (s)
		return s;
	for (int i = 0; i < STEP_SLOTS; i++)
		close_step(p, &p->steps[i], sched_ctx, release);
	for (int i = 0; i < STEP_SLOTS && !s; i++)
		if (p->steps[i].n == 0 || p->steps[i].planned)
			s = &p->steps[i];
	for (int i = 0; i < STEP_SLOTS && !s; i++)
		if (!oldest || p->steps[i].step < oldest->step)
			oldest = &p->steps[i];
	if (!s) {
		s = oldest;
		if (!p->warned_window) {
			p->warned_window = 1;
			fprintf(stderr,
				"starpu-dos: %s: step %llu is submitted while %d steps are still unplanned "
				"(DOS_STEPS_IN_FLIGHT): the oldest, step %llu, is planned early, before its updates "
				"are ready\n",
				p->rule == RULE_DOS ? "dos" : "policy", (unsigned long long)step, STEP_SLOTS,
				(unsigned long long)s->step);
		}
		p->stats.early_plans++;
		plan_step(p, s, sched_ctx);
		while (!starpu_task_list_empty(&s->parked))
			starpu_task_list_push_back(release, starpu_task_list_pop_front(&s->parked));
	}
	s->step = step;
	s->n = 0;
	s->planned = 0;
	s->closed = 0;
	s->epoch++;
	return s;
}

/* Adds h to the set; returns 1 when it was there already. */
static int handle_set_add(struct handle_set *set, starpu_data_handle_t h)
{
	if (2 * (set->n + 1) > set->cap) {
		struct handle_set grown = {.cap = set->cap ? 2 * set->cap : 256};
		grown.at = calloc(grown.cap, sizeof *grown.at);
		STARPU_ASSERT_MSG(grown.at, "out of memory for %zu handles", grown.cap);
		for (size_t i = 0; i < set->cap; i++)
			if (set->at[i])
				handle_set_add(&grown, set->at[i]);
		free(set->at);
		*set = grown;
	}
	size_t i = ((uintptr_t)h >> 4) * 0x9E3779B97F4A7C15ull % set->cap;
	for (; set->at[i]; i = (i + 1) % set->cap)
		if (set->at[i] == h)
			return 1;
	set->at[i] = h;
	set->n++;
	return 0;
}

/* The step of a foreign update (plan lock held): the current one, unless its weights were
 * updated in it already. */
static uint64_t foreign_step_of(struct policy *p, starpu_data_handle_t weight)
{
	if (handle_set_add(&p->foreign_seen, weight)) {
		p->foreign_step++;
		memset(p->foreign_seen.at, 0, p->foreign_seen.cap * sizeof *p->foreign_seen.at);
		p->foreign_seen.n = 0;
		handle_set_add(&p->foreign_seen, weight);
	}
	return p->foreign_step;
}

static int node_is_gpu(int node)
{
	return node >= 0 && starpu_node_get_kind((unsigned)node) == STARPU_CUDA_RAM;
}

static int home_is_gpu(starpu_data_handle_t h)
{
	return node_is_gpu(starpu_data_get_home_node(h));
}

static int node_is_host(int node)
{
	return node >= 0 && starpu_node_get_kind((unsigned)node) == STARPU_CPU_RAM;
}

/* Whether an update input is on a GPU when the update is planned, for the link costs:
 * homed there, or without a home in a context with GPUs, made by the application's tasks,
 * which run there (dos-train's gradients from backward and 16-bit weights from the
 * refresh, NNTile's tiles). Costed as if in host memory, a gradient made on the GPU
 * crossed the link up for every GPU update and never down for a CPU one: the plans of
 * dos-train on a 9000 MiB h100-pcie5 (1b, bf16) took 0.3153 s a step against 0.2635, and
 * on 4 GPUs 0.0586 against 0.0387 (results/task-costs-sim-2026-12-04.md). Its memory is
 * still the application's (home_is_gpu above). */
static int made_on_gpu(const struct policy *p, int home)
{
	return node_is_gpu(home) || (home < 0 && p->ngpus > 0);
}

static void dispatch_released(struct policy *p, struct starpu_task_list *release, unsigned sched_ctx);

static void submit_hook(struct starpu_task *task)
{
	struct _dos_update_view u;
	if (_dos_update_view(task, &u))
		return;
	unsigned ctx = task->sched_ctx;
	struct policy *p = policy_of(ctx);
	struct starpu_task_list release;
	starpu_task_list_init(&release);
	lock_plan(p);
	uint64_t step = u.has_step ? u.step : foreign_step_of(p, _dos_update_handle(task, &u, DOS_ADAM_BUF_MASTER));
	if (step != p->counting_step) { /* a new step: the one before is complete */
		newest_step_complete(p);
		p->counted = 0;
	}
	p->counting_step = step;
	p->counted++;
	struct step_tasks *s = slot_for_submission(p, step, ctx, &release);
	if (s->n == s->cap) {
		int cap = s->cap ? 2 * s->cap : 256;
		struct starpu_task **grown = realloc(s->tasks, (size_t)cap * sizeof *grown);
		STARPU_ASSERT_MSG(grown, "out of memory for %d update tasks", cap);
		s->tasks = grown;
		struct _dos_update_view *views = realloc(s->views, (size_t)cap * sizeof *views);
		STARPU_ASSERT_MSG(views, "out of memory for %d update tasks", cap);
		s->views = views;
		s->cap = cap;
	}
	for (int r = DOS_ADAM_STATE_BUFFERS; r < u.step_data_end; r++)
		u.input_home[r] = starpu_data_get_home_node(_dos_update_handle(task, &u, r));
	s->views[s->n] = u;
	s->tasks[s->n++] = task;
	task->sched_data = COLLECTED_TAG(s - p->steps, s->epoch);
	/* The state and the inputs homed on the GPU are planned for as the optimizer's
	 * (resident or staged state, gpu_homed_inputs_bytes): not the application's memory,
	 * even where its tasks use them too (an fp32 model's refresh reads the master
	 * weights). A gradient or 16-bit weights with no home on the GPU is measured with the
	 * application's data: its GPU copy lives from the task that makes it there (the
	 * gather, the GPU update) to the last that uses it (the update, the refresh), which
	 * post_exec_hook records for the update. */
	for (int r = 0; r < u.step_data_end; r++) {
		starpu_data_handle_t h = _dos_update_handle(task, &u, r);
		if (r >= DOS_ADAM_STATE_BUFFERS && !node_is_gpu(u.input_home[r]))
			continue;
		int added = _dos_app_exclusions_add(&p->optimizer_data, h);
		STARPU_ASSERT_MSG(added >= 0, "out of memory for %lu optimizer handles", p->optimizer_data.count + 1);
		for (int k = 0; added && k < p->ngpus; k++) /* uses recorded before it was known */
			_dos_app_memory_exclude(&p->gpu[k].app_memory, h);
	}
	/* as many updates as the last step had: this one is complete */
	if (p->counted == p->last_step_size)
		close_step(p, s, ctx, &release);
	unlock_plan(p);
	dispatch_released(p, &release, ctx);
}

/* Whether the whole state of an update (master weights, m and v) is on GPU memory node
 * `node` or on its way there (starpu_data_is_on_node: a requested fetch counts, so that
 * state being prefetched is neither fetched again nor planned elsewhere). The master
 * alone is not enough, as a model that computes in fp32 reads the master weights on the
 * GPU in forward while m and v stay home (then 8 of the 12 bytes per parameter still
 * have to cross the link). */
static int state_on_node(struct starpu_task *update, const struct _dos_update_view *u, unsigned node)
{
	for (int r = 0; r < DOS_ADAM_STATE_BUFFERS; r++)
		if (!starpu_data_is_on_node(_dos_update_handle(update, u, r), node))
			return 0;
	return 1;
}

/* The index of the GPU that holds an update's whole state, or -1 (plan lock held). */
static int gpu_holding_state(const struct policy *p, struct starpu_task *update, const struct _dos_update_view *u)
{
	for (int k = 0; k < p->ngpus; k++)
		if (state_on_node(update, u, (unsigned)p->gpu[k].node))
			return k;
	return -1;
}

/* The index of GPU memory node `node` among the planned GPUs, or -1. */
static int gpu_index_of_node(const struct policy *p, unsigned node)
{
	for (int k = 0; k < p->ngpus; k++)
		if ((unsigned)p->gpu[k].node == node)
			return k;
	return -1;
}

/* The context's GPUs, as they are now (plan lock held, or before any task). A GPU keeps
 * its index (its forecast, its windows) while the context keeps the same GPUs. */
static void find_gpus(struct policy *p, unsigned sched_ctx)
{
	unsigned nodes[MAX_GPUS];
	int workers[STARPU_NMAXWORKERS];
	p->ngpus = _dos_context_gpu_nodes(sched_ctx, nodes, MAX_GPUS);
	int nworkers = _dos_workers_of_type(sched_ctx, STARPU_CUDA_WORKER, workers, STARPU_NMAXWORKERS);
	double h2d[MAX_GPUS], d2h[MAX_GPUS];
	int link[MAX_GPUS], sharing[MAX_GPUS] = {0};
	_dos_gpu_link_shares(nodes, p->ngpus, h2d, d2h, link);
	for (int k = 0; k < p->ngpus; k++)
		sharing[link[k]]++;
	for (int k = 0; k < p->ngpus; k++) {
		struct gpu_plan *g = &p->gpu[k];
		g->node = (int)nodes[k];
		g->worker = -1;
		for (int i = 0; i < nworkers && i < STARPU_NMAXWORKERS && g->worker < 0; i++)
			if (starpu_worker_get_memory_node((unsigned)workers[i]) == nodes[k])
				g->worker = workers[i];
		g->h2d_bytes_per_second = h2d[k];
		g->d2h_bytes_per_second = d2h[k];
		g->link = link[k];
		g->link_h2d_bytes_per_second = h2d[k] * sharing[link[k]];
		g->link_d2h_bytes_per_second = d2h[k] * sharing[link[k]];
	}
}

/* Whether h's copy on memory node `node` is valid: arrived, not merely requested or in
 * flight (which starpu_data_is_on_node also counts). */
static int valid_on_node(starpu_data_handle_t h, unsigned node)
{
	int allocated, valid, loading, requested;
	starpu_data_query_status2(h, (int)node, &allocated, &valid, &loading, &requested);
	return valid;
}

/* Whether some memory node holds a valid copy of h. A gradient that a task of this step
 * will produce first (in a training graph, the gather after backward) has none yet, and
 * StarPU asserts on a prefetch of data that was never written. */
static int has_valid_copy(starpu_data_handle_t h)
{
	for (unsigned node = 0; node < starpu_memory_nodes_get_count(); node++)
		if (valid_on_node(h, node))
			return 1;
	return 0;
}

/* Whether a prefetch of h to `node` may do anything: not when `node` is host memory and
 * h is valid there already (the on_cpu window asks for each CPU update's gradient in
 * host memory, where it lives unless homed on a GPU; StarPU would only mark that copy
 * recently used), nor when no node has a valid copy (has_valid_copy). A valid GPU copy
 * is still asked for: marking it recently used changes what StarPU evicts (skipped, the
 * stride rule's step on h100-pcie5 with 16 GiB and homes on the GPU went from 483.19 to
 * 488.39 simulated ms, with more traffic). One status query first, then all nodes. */
static int prefetch_has_work(starpu_data_handle_t h, unsigned node)
{
	return !(node == STARPU_MAIN_RAM && valid_on_node(h, node)) && has_valid_copy(h);
}

/* Prefetches decided under the plan lock are issued after it is released: a prefetch can
 * complete at once and release a task that depends on the data, which StarPU then pushes,
 * from this very thread, into push_task, which takes the plan lock: the thread would wait
 * for itself. */
static void defer_prefetch(struct policy *p, starpu_data_handle_t h, unsigned node, int prio, int idle)
{
	struct deferred_prefetches *d = &p->deferred;
	if (d->n == d->cap) {
		int cap = d->cap ? 2 * d->cap : 64;
		struct prefetch_request *grown = realloc(d->at, (size_t)cap * sizeof *grown);
		if (!grown)
			return; /* a prefetch is only a hint */
		d->at = grown;
		d->cap = cap;
	}
	d->at[d->n++] = (struct prefetch_request){h, node, prio, idle};
}

/* Issues the deferred prefetches; call without the plan lock, and never from push_task on
 * a worker thread: there the worker is inside a scheduling operation, and a prefetch that
 * completes at once releases the next task waiting for that data (the next step's gather
 * waits to overwrite a gradient), which StarPU pushes from this same thread, nested: it
 * asserts (!state_sched_op_pending). Those prefetches wait for the next pre- or
 * post-execution hook of one of our tasks, which run outside any scheduling operation. */
static void issue_deferred_prefetches(struct policy *p)
{
	lock_plan(p);
	struct deferred_prefetches d = p->deferred;
	p->deferred = (struct deferred_prefetches){0};
	unlock_plan(p);
	for (int i = 0; i < d.n; i++)
		if (!prefetch_has_work(d.at[i].handle, d.at[i].node))
			continue;
		else if (d.at[i].idle)
			starpu_data_idle_prefetch_on_node_prio(d.at[i].handle, d.at[i].node, 1, d.at[i].prio);
		else
			starpu_data_prefetch_on_node_prio(d.at[i].handle, d.at[i].node, 1, d.at[i].prio);
	free(d.at);
}

/* Prefetches the buffers of roles [first, last] of update `task`, of view u. */
static void prefetch_buffers(struct policy *p, struct starpu_task *task, const struct _dos_update_view *u, int first,
			     int last, unsigned node, int prio)
{
	for (int r = first; r <= last && r < u->step_data_end; r++)
		defer_prefetch(p, _dos_update_handle(task, u, r), node, prio, 0);
}

static void window_reset(struct fetch_window *w, int capacity, int first, int last, int node)
{
	if (w->cap < capacity) {
		free(w->entries);
		free(w->ready);
		w->entries = malloc((size_t)capacity * sizeof *w->entries);
		w->ready = malloc((size_t)capacity * sizeof *w->ready);
		STARPU_ASSERT_MSG(w->entries && w->ready, "out of memory planning %d subgroups", capacity);
		w->cap = capacity;
	}
	w->n = w->next = w->ended = w->ready_head = w->ready_tail = w->task_fetches_pending = 0;
	w->room_bytes = 0;
	w->first_buffer = first;
	w->last_buffer = last;
	w->node = node;
}

/* The task-level fetch of entry i's update (plan lock held: the update cannot start, so
 * the task stays valid; a task prefetch releases no other task, unlike a handle one). */
static void fetch_task_inputs(struct fetch_window *w, int i)
{
	struct fetch_entry *e = &w->entries[i];
	if (!e->fetch_task_inputs || !e->pushed || e->started || e->task_fetched)
		return;
	e->task_fetched = 1;
	w->task_fetches_pending++;
	if (!e->task->prefetched) /* StarPU allows one per task */
		starpu_prefetch_task_input_on_node_prio(e->task, (unsigned)w->node, w->n - i);
}

/* Whether entry i's only fetch is task-level (see struct fetch_entry). */
static int only_task_fetch(const struct fetch_window *w, int i)
{
	return w->entries[i].fetch_task_inputs && w->entries[i].nhandles == 0;
}

/* Fetches ready updates whose only fetch is task-level, in the order they became ready,
 * while fewer than `ahead` fetched ones have not started (plan lock held). Each entry
 * passes once: the cost per update placed stays constant whatever the subgroups. */
static void fetch_ready_in_order(struct fetch_window *w)
{
	while (w->task_fetches_pending < w->ahead && w->ready_head < w->ready_tail)
		fetch_task_inputs(w, w->ready[w->ready_head++]); /* nothing for a started one */
}

/* Whether entry `next` of window w fits beside the entries fetched for updates not ended
 * and the last one ended (`ended` - 1), whose state is still on its way home. */
static int fits_in_window(const struct fetch_window *w, int ended, int next)
{
	double bytes = 0;
	for (int i = ended > 0 ? ended - 1 : 0; i <= next; i++)
		bytes += w->entries[i].gpu_bytes;
	return bytes <= w->room_bytes;
}

/* Starts fetches until `ahead` are in flight or done beyond the updates that ended, and,
 * with a room in bytes, while they fit in it (one is always fetched). */
static void window_advance(struct policy *p, struct fetch_window *w, int ended)
{
	for (; w->next < w->n && w->next < ended + w->ahead; w->next++) {
		if (w->room_bytes > 0 && w->next > ended && !fits_in_window(w, ended, w->next))
			break;
		const struct fetch_entry *e = &w->entries[w->next];
		for (int h = 0; h < e->nhandles && !e->started; h++)
			defer_prefetch(p, e->handle[h], (unsigned)w->node, w->n - w->next, 0);
		if (!only_task_fetch(w, w->next)) /* those go in ready order (fetch_ready_in_order) */
			fetch_task_inputs(w, w->next);
	}
}

/* Adds `task`, of view u, to window w (at plan time, while the task is alive and not
 * started). */
static int window_add(struct fetch_window *w, struct starpu_task *task, const struct _dos_update_view *u)
{
	struct fetch_entry *e = &w->entries[w->n];
	*e = (struct fetch_entry){.task = task};
	for (int b = w->first_buffer; b <= w->last_buffer && b < u->step_data_end; b++) {
		starpu_data_handle_t h = _dos_update_handle(task, u, b);
		if (b < DOS_ADAM_STATE_BUFFERS || u->input_home[b] >= 0)
			e->handle[e->nhandles++] = h;
		else
			e->fetch_task_inputs = 1;
	}
	return w->n++;
}

/* The fetch window of updates placed at `place`, on GPU `gpu` (an index in p->gpu). */
static struct fetch_window *window_of(struct policy *p, enum dos_placement place, int gpu)
{
	return place == DOS_PLACE_GPU_TRANSIENT  ? &p->gpu[gpu].staged
	       : place == DOS_PLACE_GPU_RESIDENT ? &p->gpu[gpu].resident
						 : &p->on_cpu; /* DOS_PLACE_CPU, DOS_PLACE_CPU_THEN_RESIDENT */
}

/* GPU memory that gradients and 16-bit weights homed on each planned GPU occupy for good
 * (as in training): not the plan's to use; into bytes[k] for GPU k. One pass over the
 * step's handles, their homes asked when they were collected: StarPU's queries, not the
 * GPUs, set the cost of a plan. */
static void gpu_homed_inputs_bytes(const struct policy *p, const struct step_tasks *s, double *bytes)
{
	for (int k = 0; k < p->ngpus; k++)
		bytes[k] = 0;
	for (int i = 0; i < s->n; i++) {
		const struct _dos_update_view *u = &s->views[i];
		for (int r = DOS_ADAM_BUF_GRAD; r < u->step_data_end; r++) {
			int home = u->input_home[r]; /* p->gpu holds CUDA nodes only */
			int k = home >= 0 ? gpu_index_of_node(p, (unsigned)home) : -1;
			if (k >= 0)
				bytes[k] += (double)starpu_data_get_size(_dos_update_handle(s->tasks[i], u, r));
		}
	}
}

/* The application's memory on GPU k over the coming iteration (plan lock held), and in
 * *update_extra how much less it needs during the update window; in *learned whether the
 * measure decided. What the application declared (dos_sched_reserve_gpu_bytes, or
 * DOS_GPU_DECLARED_MIB in its place; the training graph declares weights, gradients and
 * activations from the model's shape) is a floor, on every GPU: it knows what the measure
 * cannot see (buffers StarPU keeps between uses, tasks in other contexts). The measure
 * (app_memory.c: the peak of what the application's tasks on this GPU kept live over the
 * last iteration, from the start to the first plan for the first step) raises the
 * forecast when the application uses more than it declared, or declared nothing.
 * DOS_GPU_FORECAST=declared: the declaration alone. DOS_GPU_RESERVE_MIB, what StarPU
 * evicted of resident state, and the gradients and 16-bit weights homed on the GPU come
 * on top (step_costs). */
static double app_memory_forecast(const struct policy *p, int k, double *update_extra, int *learned)
{
	const struct dos_app_forecast *f = &p->gpu[k].app_memory.last;
	double declared = p->declared_override_bytes >= 0 ? p->declared_override_bytes : p->app_reserve_bytes;
	*update_extra = 0;
	*learned = f->learned && !p->forecast_declared_only && f->iteration_peak_bytes > declared;
	if (!*learned)
		return declared;
	/* the measure decides: in the update window the application needs only its peak there */
	*update_extra = f->iteration_peak_bytes - fmax(f->update_peak_bytes, declared);
	return f->iteration_peak_bytes;
}

/* State the previous plan kept resident that StarPU has evicted since (to make room for
 * data the forecast did not foresee): the forecast was short by that much, and stays
 * raised by the largest such shortfall for the rest of the run (plan lock held). The
 * largest, not the sum: StarPU also evicts for reasons of its own (some subgroup every
 * step on a nearly full GPU, whatever the plan), and a sum would shrink
 * the budget by that much every step until no state is left on the GPU. Subgroups are
 * matched by their position in the step, which a training loop keeps. */
static void learn_from_evictions(struct policy *p, const struct step_tasks *s, const struct dos_plan_subgroup *sg)
{
	double evicted = 0;
	if (p->last_place && p->last_n == s->n)
		for (int i = 0; i < s->n; i++)
			if (p->last_place[i] == DOS_PLACE_GPU_RESIDENT && !sg[i].resident_now)
				evicted += sg[i].params * DOS_STATE_BYTES_PER_PARAM;
	p->stats.evicted_state_bytes += evicted;
	/* what the forecast grew by since that plan (a measure replacing a declaration) was
	 * foreseen now: evictions it explains are no shortfall (state a fresh run created on
	 * the GPU beyond what the application then turned out to need) */
	double grown = 0;
	for (int k = 0; k < p->ngpus && p->stats.plans > 0; k++) {
		double extra;
		int learned;
		grown = fmax(grown, app_memory_forecast(p, k, &extra, &learned) - p->stats.app_forecast_bytes);
	}
	/* Not from the first plan, made before any forecast was measured: a shortfall that
	 * lasts shows again and is learned one plan later, while what StarPU did in the first
	 * iteration on its own would shrink the budget for good. State a fresh run created on
	 * the GPU (place_state_init) is there from the first forward on, beyond the part of an
	 * iteration the first forecast had measured: StarPU evicts some of it once (simulated
	 * 1b bf16 on a 12000 MiB h100-pcie5: 6 subgroups resident instead of 8, 0.217 s steady
	 * against 0.197). And the first plan's resident state is not pinned yet
	 * (pin_resident_state): StarPU's background write-back cleans it, and StarPU then
	 * takes clean buffers for the staged state (simulated 20B on a100-pcie4, gradients
	 * and weights on the GPU: one subgroup's 1.2 GB learned, 11 subgroups resident instead
	 * of 12, 2201 ms a step against 2097 with the write-back off). */
	if (!p->forecast_declared_only && p->stats.plans > 1)
		p->eviction_margin_bytes = fmax(p->eviction_margin_bytes, evicted - grown);
}

/* The share of the GPU memory StarPU charges for the state of step s's subgroups that the
 * state itself fills (below 1 where its buffers are small enough for StarPU's
 * suballocator, rates.c): the plans count the state's own bytes against a budget scaled
 * by it. */
static double state_packing(const struct step_tasks *s, const struct dos_plan_subgroup *sg)
{
	double state = 0, charged = 0;
	for (int i = 0; i < s->n; i++) {
		double buffer = sg[i].params * (DOS_STATE_BYTES_PER_PARAM / DOS_ADAM_STATE_BUFFERS);
		state += DOS_ADAM_STATE_BUFFERS * buffer;
		charged += DOS_ADAM_STATE_BUFFERS * _dos_gpu_charged_bytes(buffer);
	}
	return charged > 0 ? state / charged : 1.0;
}

/* The cost model of step s's plan (plan lock held): the machine as StarPU measures it
 * (rates.c), with each GPU's memory left after the forecast of what the application
 * keeps there, and what the rest of the iteration leaves of the GPUs and their links.
 * Ends the iteration measured since the previous plan. *m describes the first GPU (and
 * the node, for the bound: cost_model.h); *pool the GPUs pooled into one, which the
 * placement rule plans for: G times one GPU's speed, the links of all of them together
 * (shared bridges counted once), the sum of their budgets, as the bound pools them
 * (bound.c), but from each GPU's own budget. With one GPU the pool is that GPU. */
static void step_costs(struct policy *p, const struct step_tasks *s, unsigned sched_ctx,
		       const struct dos_plan_subgroup *sg, struct dos_machine_costs *m, struct dos_machine_costs *pool,
		       int *calibrated)
{
	struct starpu_task *first = s->tasks[0];
	struct _dos_update_view u = s->views[0];
	enum dos_dtype wt = u.weight_dtype;
	const int *home = u.input_home; /* the first update's inputs stand for all */
	struct dos_data_homes homes = {
		.grad_bytes_per_param = (double)dos_dtype_size(u.grad_dtype),
		.weight_bytes_per_param = wt == DOS_FP32 ? 0.0 : 2.0,
		.grads_on_gpu = made_on_gpu(p, home[DOS_ADAM_BUF_GRAD]),
		.weights_on_gpu = wt != DOS_FP32 && made_on_gpu(p, home[DOS_ADAM_BUF_WEIGHT16]),
		.grads_homed_on_host = node_is_host(home[DOS_ADAM_BUF_GRAD]),
		.weights_homed_on_host = wt != DOS_FP32 && node_is_host(home[DOS_ADAM_BUF_WEIGHT16]),
	};
	double now = starpu_timing_now() * 1e-6;
	for (int k = 0; k < p->ngpus; k++)
		_dos_app_memory_plan(&p->gpu[k].app_memory, now);
	learn_from_evictions(p, s, sg);
	double reserve[MAX_GPUS] = {0}, extra[MAX_GPUS] = {0}, homed[MAX_GPUS];
	gpu_homed_inputs_bytes(p, s, homed);
	double packing = state_packing(s, sg);
	p->stats.app_forecast_bytes = 0;
	p->stats.app_forecast_learned = 0;
	for (int k = 0; k < p->ngpus; k++) {
		int learned;
		double app = app_memory_forecast(p, k, &extra[k], &learned);
		if (k == 0 || app > p->stats.app_forecast_bytes) { /* the largest, in the statistics */
			p->stats.app_forecast_bytes = app;
			p->stats.app_forecast_learned = learned;
		}
		reserve[k] = app + p->eviction_margin_bytes + p->declared_reserve_bytes + homed[k];
		p->gpu[k].budget_bytes = packing * _dos_gpu_budget_bytes((unsigned)p->gpu[k].node, reserve[k]);
		p->gpu[k].update_extra_bytes = extra[k];
	}
	_dos_measure_costs(first, u.params, sched_ctx, &homes, reserve[0], m, calibrated);
	int big = 0, small = 0;
	for (int i = 1; i < s->n; i++) {
		big = sg[i].params > sg[big].params ? i : big;
		small = sg[i].params < sg[small].params ? i : small;
	}
	_dos_measure_task_costs(s->tasks[big], sg[big].params, s->tasks[small], sg[small].params, sched_ctx, m);
	m->gpu_budget_bytes *= packing;
	m->gpu_update_extra_bytes = extra[0];
	/* The rest of the iteration: each GPU's application work queued now (StarPU's
	 * predictions of the tasks in its queue; read without its lock: a hint) comes before
	 * any update placed there; and a link idles while its GPU runs the application
	 * outside the update window (the last iteration's, half of it kept for the
	 * application's own transfers), which can carry state becoming resident. */
	double busy[MAX_GPUS] = {0}, promote[MAX_GPUS] = {0};
	for (int k = 0; k < p->ngpus; k++) {
		const struct dos_app_forecast *f = &p->gpu[k].app_memory.last;
		double idle_link = fmin(f->gpu_busy_seconds, f->iteration_seconds - f->update_window_seconds);
		double h2d = p->ngpus == 1 ? m->h2d_bytes_per_second : p->gpu[k].h2d_bytes_per_second;
		busy[k] = p->gpu[k].worker >= 0 ? p->queues.of[p->gpu[k].worker].queued_us * 1e-6 : 0.0;
		promote[k] = f->learned && idle_link > 0 ? 0.5 * idle_link * h2d : 0.0;
	}
	m->gpu_busy_ahead_seconds = busy[0];
	m->promote_bytes = promote[0];
	*pool = *m;
	if (p->ngpus <= 1)
		return;
	double g = p->ngpus;
	pool->ngpus = 1; /* to the placement rule, one GPU */
	pool->pooled_gpus = p->ngpus;
	pool->gpu_seconds_per_param = m->gpu_seconds_per_param / g;
	pool->gpu_task_seconds = m->gpu_task_seconds / g; /* G tasks at a time */
	pool->h2d_bytes_per_second = m->node_h2d_bytes_per_second;
	pool->d2h_bytes_per_second = m->node_d2h_bytes_per_second;
	pool->gpu_update_extra_bytes = 0;
	pool->staging_margin_bytes = m->staging_margin_bytes * g; /* each GPU that stages keeps its own */
	pool->gpu_busy_ahead_seconds = pool->promote_bytes = 0;
	/* Staged state needs room on the GPU that updates it, which a sum of budgets does not
	 * show: the pool holds what each GPU holds beside one staging slot of its own, plus
	 * the two slots that the planner keeps free in the pool's budget for its own choice
	 * between residency and staging (planner.c). */
	double slot = sg[big].params * dos_staging_bytes_per_param(m);
	pool->gpu_budget_bytes = 2 * slot;
	for (int k = 0; k < p->ngpus; k++) {
		pool->gpu_budget_bytes += fmax(0.0, p->gpu[k].budget_bytes - slot);
		pool->gpu_update_extra_bytes += fmax(0.0, extra[k]);
		pool->gpu_busy_ahead_seconds += busy[k] / g; /* the pool's work, spread evenly */
		pool->promote_bytes += promote[k];
	}
}

/* Where each of the n subgroups goes: the policy's placement rule, on the pooled GPUs. */
static void place_subgroups(const struct policy *p, const struct dos_machine_costs *pool,
			    const struct dos_plan_subgroup *sg, int n, enum dos_placement *place)
{
	if (p->ngpus == 0 || p->rule == RULE_ALL_CPU)
		_dos_plan_all_cpu(n, place);
	else if (p->rule == RULE_STRIDE)
		_dos_plan_stride(n, p->stride_k, place);
	else if (p->rule == RULE_RESIDENT)
		_dos_plan_resident(n, p->resident_ratio, place);
	else
		_dos_plan_step(pool, sg, n, place);
}

/* The index of the GPU with the most room left for resident state. */
static int roomiest_gpu(const struct policy *p)
{
	int best = 0;
	for (int k = 1; k < p->ngpus; k++)
		if (p->gpu[k].budget_bytes - p->gpu[k].resident_bytes >
		    p->gpu[best].budget_bytes - p->gpu[best].resident_bytes)
			best = k;
	return best;
}

/* Which GPU runs each GPU-placed update of the plan (plan lock held; into gpu_of[],
 * 0 for CPU updates). Three passes, O(G) per update:
 *  1. state resident on a GPU stays there, while that GPU's budget holds it beside one
 *     update's copies (cost_model.h, dos_resident_room_bytes): nothing crosses a link
 *     for it;
 *  2. state that becomes resident goes, in plan order, to the GPU of the one before it
 *     while that GPU has room and its run is shorter than its share (the newcomers
 *     divided evenly over the GPUs), else to the GPU with the most room left. Plan
 *     order is the order the updates were submitted, the parameters' order in
 *     dos-train, and neighbouring subgroups share tensors and layers: interleaved over
 *     the GPUs, every task that reads across a subgroup boundary (the gradient gather,
 *     the weight refresh) would copy a whole subgroup's buffer from GPU to GPU, and
 *     forward and backward, which follow the weights, would change GPU at every
 *     subgroup;
 *  3. staged state goes to the GPU that finishes its share soonest: the longest of the
 *     time its link takes each way and of its update time, for what it was given so
 *     far. GPUs behind one PCIe switch or host bridge share its link (rates.c): its time
 *     counts what all of them move, so every link works and a pair behind a switch
 *     gets the link work of one GPU with a link of its own; a GPU whose neighbour has
 *     no room to stage takes the pair's whole share (counted per GPU at half the link,
 *     such a pair carried half what the other pair did: 20B per GPU on the 4-GPU node
 *     with 8 GiB each, results/full-gpu-2026-12-03.md). On a tie within a pair, the GPU
 *     with fewer staged per staging slot stages. Only GPUs with room to stage one
 *     subgroup beside their resident state qualify; under the dos rule, with none, the
 *     update stays on the CPU. Staged state that is on a GPU already (resident state
 *     that no longer fits) is updated there.
 * The placement rule planned the pool: it sees the GPUs' budgets as one sum, not in
 * subgroups per GPU. Under the dos rule, resident state that fits no GPU is staged
 * instead, or stays a CPU update when it was to move in after one; a static rule's
 * split is kept as it is, as with one GPU (it may overfill). With one GPU this keeps
 * the plan as it is: the same sums in the same order as the planner's. */
static void assign_gpus(struct policy *p, int n, const struct dos_plan_subgroup *sg, const int *where,
			const struct dos_machine_costs *m, enum dos_placement *place, unsigned char *gpu_of)
{
	int demote = p->rule == RULE_DOS;
	double max_params = 0;
	for (int i = 0; i < n; i++)
		max_params = fmax(max_params, sg[i].params);
	double room[MAX_GPUS]; /* what resident state may take on each GPU */
	for (int k = 0; k < p->ngpus; k++) {
		p->gpu[k].resident_bytes = 0;
		room[k] = dos_resident_room_bytes(m, p->gpu[k].budget_bytes, max_params);
	}
	memset(gpu_of, 0, (size_t)n);
	if (p->ngpus == 0)
		return;
	/* GPUs behind one switch share its link, and one of them staging with several slots
	 * keeps it busier than several staging with one each (each slot is held from the
	 * transfer in to the end of the write-back, and two GPUs at once halve each other's
	 * transfers). So where the plan stages at least two subgroups per shared link, the
	 * first GPU behind each keeps room for as many slots as it will stage there, up to
	 * the DOS_MAX_STAGING_SLOTS that cover transfer in, update and write-back, and the
	 * others hold the resident state. 20B per GPU on the 4-GPU node with 8 GiB each:
	 * 1924.6 ms with one slot, 1753.5 with two, 1600.3 with three
	 * (results/full-gpu-2026-12-03.md). */
	int staged = 0, sharing[MAX_GPUS] = {0}, shared_links = 0;
	for (int i = 0; i < n; i++)
		staged += place[i] == DOS_PLACE_GPU_TRANSIENT;
	for (int k = 0; k < p->ngpus; k++)
		shared_links += ++sharing[p->gpu[k].link] == 2;
	int link_slots = shared_links > 0 ? staged / shared_links : 0;
	if (link_slots > DOS_MAX_STAGING_SLOTS)
		link_slots = DOS_MAX_STAGING_SLOTS;
	for (int k = 0; k < p->ngpus && demote && link_slots >= 2; k++)
		if (p->gpu[k].link == k && sharing[k] > 1) {
			struct dos_machine_costs mine = *m; /* this GPU's room */
			mine.gpu_budget_bytes = p->gpu[k].budget_bytes;
			mine.gpu_update_extra_bytes = p->gpu[k].update_extra_bytes;
			double slots_room = dos_staging_room_bytes(&mine, 0) -
					    link_slots * max_params * dos_staging_bytes_per_param(m);
			room[k] = fmin(room[k], fmax(0.0, slots_room));
		}
	for (int i = 0; i < n; i++) { /* 1 */
		if (place[i] != DOS_PLACE_GPU_RESIDENT || where[i] < 0)
			continue;
		struct gpu_plan *g = &p->gpu[where[i]];
		double state = sg[i].params * DOS_STATE_BYTES_PER_PARAM;
		gpu_of[i] = (unsigned char)where[i];
		if (g->resident_bytes + state <= room[where[i]] || !demote)
			g->resident_bytes += state;
		else
			place[i] = DOS_PLACE_GPU_TRANSIENT;
	}
	int newcomers = 0, placed = 0, runs = 0, run_gpu = -1;
	for (int i = 0; i < n; i++)
		newcomers +=
			(place[i] == DOS_PLACE_GPU_RESIDENT && where[i] < 0) || place[i] == DOS_PLACE_CPU_THEN_RESIDENT;
	for (int i = 0; i < n; i++) { /* 2 */
		if (!(place[i] == DOS_PLACE_GPU_RESIDENT && where[i] < 0) && place[i] != DOS_PLACE_CPU_THEN_RESIDENT)
			continue;
		double state = sg[i].params * DOS_STATE_BYTES_PER_PARAM;
		/* the r-th run ends after r / G of the newcomers: runs differ by one at most */
		int k = run_gpu >= 0 && placed < runs * newcomers / p->ngpus &&
					(p->gpu[run_gpu].resident_bytes + state <= room[run_gpu] || !demote)
				? run_gpu
				: roomiest_gpu(p);
		struct gpu_plan *g = &p->gpu[k];
		if (g->resident_bytes + state <= room[k] || !demote) {
			g->resident_bytes += state;
			gpu_of[i] = (unsigned char)k;
			runs += k != run_gpu;
			run_gpu = k;
			placed++;
		} else {
			place[i] = place[i] == DOS_PLACE_GPU_RESIDENT ? DOS_PLACE_GPU_TRANSIENT : DOS_PLACE_CPU;
		}
	}
	/* 3: busy time so far, per resource: each link in and out (shared by the GPUs behind
	 * one bridge: one GPU may use all of it while its neighbour has no room to stage),
	 * each GPU's updates */
	double in[MAX_GPUS] = {0}, out[MAX_GPUS] = {0}, run[MAX_GPUS] = {0};
	int slots[MAX_GPUS], staged_on[MAX_GPUS] = {0};
	for (int k = 0; k < p->ngpus; k++) {
		struct dos_machine_costs mine = *m; /* this GPU's room */
		mine.gpu_budget_bytes = p->gpu[k].budget_bytes;
		mine.gpu_update_extra_bytes = p->gpu[k].update_extra_bytes;
		slots[k] = dos_staging_slots(&mine, p->gpu[k].resident_bytes, max_params);
		if (!demote && slots[k] == 0)
			slots[k] = 1; /* a static split stages anyway */
	}
	for (int i = 0; i < n; i++)
		if (place[i] == DOS_PLACE_GPU_RESIDENT) {
			struct gpu_plan *g = &p->gpu[gpu_of[i]];
			in[g->link] += dos_gpu_path_h2d_bytes(m, sg[i].params, 1) / g->link_h2d_bytes_per_second;
			out[g->link] += dos_gpu_path_d2h_bytes(m, sg[i].params, 1) / g->link_d2h_bytes_per_second;
			run[gpu_of[i]] += sg[i].params * m->gpu_seconds_per_param;
		}
	for (int i = 0; i < n; i++) {
		if (place[i] != DOS_PLACE_GPU_TRANSIENT)
			continue;
		int best = where[i];
		double best_end = INFINITY;
		for (int k = 0; k < p->ngpus && where[i] < 0; k++) {
			const struct gpu_plan *g = &p->gpu[k];
			if (slots[k] == 0)
				continue;
			double end = fmax(in[g->link] + dos_gpu_path_h2d_bytes(m, sg[i].params, 0) /
								g->link_h2d_bytes_per_second,
					  out[g->link] + dos_gpu_path_d2h_bytes(m, sg[i].params, 0) /
								 g->link_d2h_bytes_per_second);
			end = fmax(end, run[k] + sg[i].params * m->gpu_seconds_per_param);
			/* GPUs behind one link end at the same time by it: the one with fewer
			 * staged per staging slot takes it */
			if (end < best_end || (best >= 0 && end == best_end &&
					       (staged_on[k] + 1) * slots[best] < (staged_on[best] + 1) * slots[k])) {
				best_end = end;
				best = k;
			}
		}
		if (best < 0) {
			place[i] = DOS_PLACE_CPU;
			continue;
		}
		const struct gpu_plan *g = &p->gpu[best];
		in[g->link] += dos_gpu_path_h2d_bytes(m, sg[i].params, where[i] >= 0) / g->link_h2d_bytes_per_second;
		out[g->link] += dos_gpu_path_d2h_bytes(m, sg[i].params, 0) / g->link_d2h_bytes_per_second;
		run[best] += sg[i].params * m->gpu_seconds_per_param;
		staged_on[best]++;
		gpu_of[i] = (unsigned char)best;
	}
}

/* The steady-state update phase of a placement on the GPUs one by one (what every step
 * costs once its resident state is there), in two parts: *cpu, the CPU pool's updates
 * spread over its workers; *gpus, the busiest of each link direction (one per switch or
 * bridge that GPUs share: rates.c), each GPU's updates after the application work queued
 * there, and the node's links with the CPU path's copies. */
static void steady_parts(const struct policy *p, int n, const struct dos_plan_subgroup *sg,
			 const enum dos_placement *place, const unsigned char *gpu_of,
			 const struct dos_machine_costs *m, double *cpu, double *gpus)
{
	double in[MAX_GPUS] = {0}, out[MAX_GPUS] = {0}, run[MAX_GPUS], cpu_params = 0, node_in = 0, node_out = 0;
	for (int k = 0; k < p->ngpus; k++)
		run[k] = p->gpu[k].worker >= 0 ? p->queues.of[p->gpu[k].worker].queued_us * 1e-6 : 0.0;
	for (int i = 0; i < n; i++) {
		double x = sg[i].params;
		if (place[i] == DOS_PLACE_CPU) {
			cpu_params += x;
			node_in += dos_cpu_path_h2d_bytes(m, x);
			node_out += dos_cpu_path_d2h_bytes(m, x);
			continue;
		}
		int k = gpu_of[i], keep = place[i] != DOS_PLACE_GPU_TRANSIENT; /* then resident: resident */
		const struct gpu_plan *g = &p->gpu[k];
		in[g->link] += dos_gpu_path_h2d_bytes(m, x, keep) / g->link_h2d_bytes_per_second;
		out[g->link] += dos_gpu_path_d2h_bytes(m, x, keep) / g->link_d2h_bytes_per_second;
		run[k] += x * m->gpu_seconds_per_param;
		node_in += dos_gpu_path_h2d_bytes(m, x, keep);
		node_out += dos_gpu_path_d2h_bytes(m, x, keep);
	}
	*cpu = cpu_params * m->cpu_seconds_per_param * m->host_contention / (m->ncpu_workers > 0 ? m->ncpu_workers : 1);
	*gpus = fmax(node_in / m->node_h2d_bytes_per_second, node_out / m->node_d2h_bytes_per_second);
	for (int k = 0; k < p->ngpus; k++)
		*gpus = fmax(*gpus, fmax(run[k], fmax(in[k], out[k])));
}

/* The residency-only placement with `resident` subgroups kept on the GPUs (those there
 * already first, then the others in plan order; the rest on the CPU), given its GPUs by
 * assign_gpus; its steady-state parts in *cpu and *gpus. */
static void residency_only(struct policy *p, int n, const struct dos_plan_subgroup *sg, const int *where,
			   const struct dos_machine_costs *m, int resident, enum dos_placement *place,
			   unsigned char *gpu_of, double *cpu, double *gpus)
{
	int taken = 0;
	for (int pass = 0; pass < 2; pass++)
		for (int i = 0; i < n; i++)
			if ((where[i] >= 0) == (pass == 0))
				place[i] = taken++ < resident ? DOS_PLACE_GPU_RESIDENT : DOS_PLACE_CPU;
	assign_gpus(p, n, sg, where, m, place, gpu_of);
	steady_parts(p, n, sg, place, gpu_of, m, cpu, gpus);
}

/* Under the dos rule with several GPUs, keeps the pooled plan (place, gpu_of) or replaces
 * it by the best residency-only placement, whichever is faster in steady state on the
 * GPUs one by one (plan lock held). The pool plans the links of all GPUs together, as if
 * staged state spread evenly over them; but a GPU can stage only with a staging slot
 * free beside its resident state, and where memory is tight that slot costs a resident
 * subgroup on every GPU that stages, while the staged state then loads only the links
 * of the GPUs with room (a pair behind one switch sharing it). Filling every GPU with
 * resident state in whole subgroups instead, and leaving the rest to the CPU, then
 * finishes sooner. The resident count is searched by bisection on where the CPU's part,
 * which falls as it grows, meets the GPUs' part, which rises; the pooled plan stays
 * unless the other is faster by more than the estimate's own slack (1 %), so that where
 * both are as good the planner's choices (its pipeline, state moving in after a CPU
 * update) are kept. O(n G log n). */
static void prefer_residency_only(struct policy *p, int n, const struct dos_plan_subgroup *sg, const int *where,
				  const struct dos_machine_costs *m, enum dos_placement *place, unsigned char *gpu_of)
{
	double biggest = 0;
	for (int i = 0; i < n; i++)
		biggest = fmax(biggest, sg[i].params);
	int fits = 0; /* whole subgroups each GPU holds */
	for (int k = 0; k < p->ngpus && biggest > 0; k++)
		fits += (int)fmin(n, fmax(0.0, floor(dos_resident_room_bytes(m, p->gpu[k].budget_bytes, biggest) /
						     (biggest * DOS_STATE_BYTES_PER_PARAM))));
	fits = fits < n ? fits : n;
	enum dos_placement *alt = malloc((size_t)n * sizeof *alt);
	unsigned char *alt_gpu = malloc((size_t)n);
	p->residency_only = 0;
	if (!alt || !alt_gpu || fits == 0) {
		free(alt);
		free(alt_gpu);
		return;
	}
	double cpu, gpus, kept[MAX_GPUS];
	steady_parts(p, n, sg, place, gpu_of, m, &cpu, &gpus);
	double pooled = fmax(cpu, gpus);
	for (int k = 0; k < p->ngpus; k++)
		kept[k] = p->gpu[k].resident_bytes;
	int lo = 0, hi = fits; /* the fewest resident subgroups where the CPU's part <= the GPUs' */
	while (lo < hi) {
		int mid = lo + (hi - lo) / 2;
		residency_only(p, n, sg, where, m, mid, alt, alt_gpu, &cpu, &gpus);
		if (cpu <= gpus)
			hi = mid;
		else
			lo = mid + 1;
	}
	int best = -1;
	double best_seconds = 0.99 * pooled;
	for (int r = lo > 0 ? lo - 1 : lo; r <= lo; r++) {
		residency_only(p, n, sg, where, m, r, alt, alt_gpu, &cpu, &gpus);
		if (fmax(cpu, gpus) < best_seconds) {
			best_seconds = fmax(cpu, gpus);
			best = r;
		}
	}
	if (best >= 0)
		residency_only(p, n, sg, where, m, best, place, gpu_of, &cpu, &gpus);
	else
		for (int k = 0; k < p->ngpus; k++) /* the pooled plan's, which the search overwrote */
			p->gpu[k].resident_bytes = kept[k];
	p->residency_only = best >= 0;
	free(alt);
	free(alt_gpu);
}

/* Whether the application's GPU memory is known well enough to pin resident state on the
 * GPUs (plan lock held): pinned state cannot be evicted, so an application that needs more
 * than the forecast would wait for memory nobody frees. Known: measured over a whole
 * iteration on every GPU, or no application task ran on it at all; not when the plan goes
 * by the declaration alone (DOS_GPU_FORECAST=declared). */
static int forecast_is_measured(const struct policy *p)
{
	if (p->forecast_declared_only)
		return 0;
	for (int k = 0; k < p->ngpus; k++) {
		const struct dos_app_forecast *f = &p->gpu[k].app_memory.last;
		if (!(f->learned && (f->whole_iteration || f->gpu_busy_seconds == 0)))
			return 0;
	}
	return 1;
}

/* Whether the application ran tasks on some planned GPU over the last iteration. */
static int application_uses_gpus(const struct policy *p)
{
	for (int k = 0; k < p->ngpus; k++)
		if (p->gpu[k].app_memory.last.gpu_busy_seconds > 0)
			return 1;
	return 0;
}

/* Pins the state the plan keeps resident on a GPU there, and unpins the rest (plan lock
 * held). StarPU's background write-back ("tidy": when fewer than
 * STARPU_MINIMUM_CLEAN_BUFFERS % of a GPU's buffers are clean, it writes dirty ones home
 * until STARPU_TARGET_CLEAN_BUFFERS % are) takes resident state, dirty there on purpose,
 * for any dirty data: it writes it home behind the plan, and the copy holds the handle
 * read-only until it ends, so the next update waits for it; on a GPU that the resident
 * state fills, the tidy runs again every step and the copies pile up on the link. The
 * GPU's bit in a handle's write-through mask keeps the tidy and eviction away from its
 * GPU copy. Only state updated on the GPU and kept there is pinned: a write on another
 * node is copied through to the GPU at once, which a subgroup updated on the CPU before
 * it moves in (DOS_PLACE_CPU_THEN_RESIDENT) must not do, since its move waits for the
 * link to idle. Application data keeps StarPU's settings. Pinning needs a measured
 * forecast (forecast_is_measured); until then StarPU may evict resident state, which
 * the eviction signal learns from. Nor is anything pinned while the plan stages state
 * beside an application that runs on the GPUs: the staging slots then share the room the
 * application leaves, which its measured peak does not describe exactly (StarPU's cache
 * of freed buffers, allocation granularity); where it falls short, evicting resident
 * state is what frees the room, and pinned, the staged copies and the application's
 * data evict each other instead. Only the dos rule pins: its resident state fits the
 * budget with room to stage beside it, while a static split may plan more resident state
 * than the GPU holds, and pinned, the updates that need room would wait forever. */
static void pin_resident_state(struct policy *p, struct step_tasks *s, const enum dos_placement *place,
			       const unsigned char *gpu_of)
{
	int pin = p->rule == RULE_DOS && p->ngpus > 0 && forecast_is_measured(p);
	for (int i = 0; i < s->n && pin && application_uses_gpus(p); i++)
		pin = place[i] != DOS_PLACE_GPU_TRANSIENT;
	for (int i = 0; i < s->n; i++) {
		int node = p->ngpus > 0 ? p->gpu[gpu_of[i]].node : -1;
		unsigned mask = pin && place[i] == DOS_PLACE_GPU_RESIDENT && node < 32 ? 1u << (unsigned)node : 0u;
		for (int r = 0; r < DOS_ADAM_STATE_BUFFERS; r++)
			starpu_data_set_wt_mask(_dos_update_handle(s->tasks[i], &s->views[i], r), mask);
	}
}

/* Tags each update with its placement and GPU and starts the transfers of the plan (plan
 * lock held); returns the number of updates placed on a GPU. The state the plan newly
 * keeps resident is prefetched now (it fits by construction); each GPU's staged
 * subgroups' state and gradient, and its resident ones' gradients, go through that GPU's
 * fetch windows: fetching every staged state at once would overflow the budget and make
 * StarPU evict state it still needs (what dmda does). */
static int start_transfers(struct policy *p, struct step_tasks *s, const struct dos_plan_subgroup *sg,
			   const enum dos_placement *place, const unsigned char *gpu_of,
			   const struct dos_machine_costs *m)
{
	int ngpu = 0;
	p->generation++;
	double resident_bytes[MAX_GPUS] = {0}, staged_bytes[MAX_GPUS] = {0};
	for (int k = 0; k < p->ngpus; k++) {
		window_reset(&p->gpu[k].staged, s->n, DOS_ADAM_BUF_MASTER, DOS_ADAM_BUF_GRAD, p->gpu[k].node);
		window_reset(&p->gpu[k].resident, s->n, DOS_ADAM_BUF_GRAD, DOS_ADAM_BUF_GRAD, p->gpu[k].node);
	}
	window_reset(&p->on_cpu, s->n, DOS_ADAM_BUF_GRAD, DOS_ADAM_BUF_GRAD, STARPU_MAIN_RAM);
	for (int i = 0; i < s->n; i++) {
		int k = gpu_of[i];
		struct fetch_window *w = window_of(p, place[i], k);
		if (place[i] == DOS_PLACE_GPU_TRANSIENT)
			staged_bytes[k] += sg[i].params * DOS_STATE_BYTES_PER_PARAM;
		int entry = window_add(w, s->tasks[i], &s->views[i]);
		w->entries[entry].gpu_bytes = sg[i].params * dos_staging_bytes_per_param(m);
		s->tasks[i]->sched_data = PLACEMENT_TAG(place[i], k, entry, p->generation);
		if (place[i] == DOS_PLACE_CPU_THEN_RESIDENT)
			resident_bytes[k] += sg[i].params * DOS_STATE_BYTES_PER_PARAM; /* arrives after */
		if (place[i] == DOS_PLACE_CPU || place[i] == DOS_PLACE_CPU_THEN_RESIDENT)
			continue;
		ngpu++;
		if (place[i] == DOS_PLACE_GPU_RESIDENT) {
			resident_bytes[k] += sg[i].params * DOS_STATE_BYTES_PER_PARAM;
			if (!sg[i].resident_now)
				prefetch_buffers(p, s->tasks[i], &s->views[i], DOS_ADAM_BUF_MASTER, DOS_ADAM_BUF_V,
						 (unsigned)p->gpu[k].node, s->n - i);
		}
	}
	for (int k = 0; k < p->ngpus; k++) {
		struct gpu_plan *g = &p->gpu[k];
		struct dos_machine_costs mine = *m; /* this GPU's room */
		mine.gpu_budget_bytes = g->budget_bytes;
		mine.gpu_update_extra_bytes = g->update_extra_bytes;
		g->eager_writeback = resident_bytes[k] + staged_bytes[k] > g->budget_bytes;
		g->staged.ahead = dos_staging_slots(&mine, resident_bytes[k], sg[0].params);
		/* Written back eagerly, a staged subgroup keeps its GPU memory until its state is
		 * home, while the next ones come in: fetched as far ahead as the slots alone
		 * allow, one of them found no room, and StarPU evicted state it fetched again
		 * (simulated 20B on an 8 GiB a100-pcie4: 1.0 GB more up the link a step,
		 * 2734 ms against 2618). So the window counts the bytes of the last one ended
		 * too. */
		if (g->eager_writeback)
			g->staged.room_bytes = fmax(0.0, dos_staging_room_bytes(&mine, resident_bytes[k]));
		g->resident.ahead = RESIDENT_GRADIENTS_AHEAD;
		window_advance(p, &g->staged, 0);
		window_advance(p, &g->resident, 0);
	}
	/* A CPU update's GPU-homed gradient goes to host memory as soon as it is final (its
	 * update ready), not a few ahead of the CPU workers: host memory has room for all of
	 * them, and fetched late the CPU updates waited for them at the end of the step, a
	 * wait the plan's cost model does not count. */
	p->on_cpu.ahead = s->n;
	window_advance(p, &p->on_cpu, 0);
	return ngpu;
}

/* What the plan of step `step` decided, in the statistics and, as asked, on stderr. */
static void report_plan(struct policy *p, uint64_t step, const struct dos_plan_subgroup *sg, int n,
			const enum dos_placement *place, const unsigned char *gpu_of, int ngpu,
			const struct dos_machine_costs *m, const struct dos_machine_costs *pool, int calibrated)
{
	p->stats.last_step = step;
	p->stats.last_subgroups = (unsigned)n;
	p->stats.last_gpu_subgroups = (unsigned)ngpu;
	p->stats.last_predicted_seconds = _dos_plan_predict(pool, sg, n, place);
	p->stats.last_bound_seconds = _dos_bound_seconds(m, sg, n, NULL);
	p->stats.calibrated = calibrated;
	p->stats.gpu_budget_bytes = m->gpu_budget_bytes;
	if (p->ngpus > 0 && !p->said_no_gpu_room) {
		/* the smallest subgroup: subgroups that follow the tensors range from a norm's
		 * few thousand parameters to a whole layer's matrix (looked for until said) */
		double smallest = sg[0].params;
		for (int i = 1; i < n; i++)
			smallest = fmin(smallest, sg[i].params);
		double per = smallest * dos_staging_bytes_per_param(m);
		/* the roomiest GPU: judged by the first alone, 4 GPUs of 3000 MiB (1b bf16) were
		 * told so in a plan that put 72 of 102 updates on the GPUs */
		double roomiest = 0;
		for (int k = 0; k < p->ngpus; k++)
			roomiest = fmax(roomiest, p->gpu[k].budget_bytes);
		if (roomiest < per) {
			/* less GPU memory than even the smallest subgroup needs: every update runs
			 * on the CPU, which is correct but slow; the user should know, once */
			p->said_no_gpu_room = 1;
			fprintf(stderr,
				"starpu-dos: %s: no GPU memory left for optimizer state (budget %.3g GB after what "
				"the application keeps there, the smallest subgroup needs %.3g GB): updates run "
				"on the CPU\n",
				rule_name(p->rule), roomiest * 1e-9, per * 1e-9);
		}
	}
	if (p->verbose < 2)
		return;
	/* one line per plan: what it kept, took on, staged and left on the CPU, and the
	 * forecast it planned with; with several GPUs, the updates each one got */
	int count[5] = {0}, kept = 0, on_gpu[MAX_GPUS] = {0};
	for (int i = 0; i < n; i++) {
		count[place[i]]++;
		kept += place[i] == DOS_PLACE_GPU_RESIDENT && sg[i].resident_now;
		on_gpu[gpu_of[i]] += place[i] == DOS_PLACE_GPU_RESIDENT || place[i] == DOS_PLACE_GPU_TRANSIENT;
	}
	char per_gpu[16 * MAX_GPUS] = "";
	for (int k = 0; p->ngpus > 1 && k < p->ngpus; k++)
		snprintf(per_gpu + strlen(per_gpu), sizeof per_gpu - strlen(per_gpu), "%sGPU%d %d", k ? ", " : " (", k,
			 on_gpu[k]);
	if (p->ngpus > 1)
		strcat(per_gpu, p->residency_only ? "; residency only)" : ")");
	fprintf(stderr,
		"starpu-dos: %s: plan of step %llu at %.3f s: %d resident (%d already), %d staged%s, %d on CPU "
		"(%d then resident); GPU budget %.3g GB (+%.3g GB in the update window), application "
		"forecast %.3g GB (%s; measured %.3g GB), GPU busy %.3g s ahead, %.3g GB may move after CPU "
		"updates; an update task's fixed cost %.3g us on a CPU worker, %.3g us on a GPU; "
		"predicted %.4g s\n",
		rule_name(p->rule), (unsigned long long)step, starpu_timing_now() * 1e-6, count[DOS_PLACE_GPU_RESIDENT],
		kept, count[DOS_PLACE_GPU_TRANSIENT], per_gpu,
		count[DOS_PLACE_CPU] + count[DOS_PLACE_CPU_THEN_RESIDENT], count[DOS_PLACE_CPU_THEN_RESIDENT],
		pool->gpu_budget_bytes * 1e-9, pool->gpu_update_extra_bytes * 1e-9, p->stats.app_forecast_bytes * 1e-9,
		p->stats.app_forecast_learned ? "learned" : "declared",
		p->gpu[0].app_memory.last.iteration_peak_bytes * 1e-9, pool->gpu_busy_ahead_seconds,
		pool->promote_bytes * 1e-9, m->cpu_task_seconds * 1e6, m->gpu_task_seconds * 1e6,
		p->stats.last_predicted_seconds);
}

/* Plans the updates of s (plan lock held): its subgroups as they are now (on which GPU
 * their state is), the cost model, the placement on the pooled GPUs, the GPU of each
 * GPU update, the transfers it starts. */
static void plan_step(struct policy *p, struct step_tasks *s, unsigned sched_ctx)
{
	double t0 = seconds_now();
	STARPU_ASSERT_MSG(s->n <= MAX_STEP_UPDATES, "a step of %d updates: the dos policy plans at most %d", s->n,
			  MAX_STEP_UPDATES);
	find_gpus(p, sched_ctx);
	_dos_queues_next_generation(&p->queues);
	if (s->n > p->plan_cap) {
		free(p->plan_sg);
		free(p->plan_where);
		free(p->plan_gpu_of);
		free(p->plan_place);
		p->plan_sg = malloc((size_t)s->n * sizeof *p->plan_sg);
		p->plan_where = malloc((size_t)s->n * sizeof *p->plan_where);
		p->plan_gpu_of = malloc((size_t)s->n);
		p->plan_place = malloc((size_t)s->n * sizeof *p->plan_place);
		/* the last plan's placements, read by this one (learn_from_evictions), grow with
		 * the others: the two placement arrays trade places after each plan */
		p->last_place = realloc(p->last_place, (size_t)s->n * sizeof *p->last_place);
		STARPU_ASSERT_MSG(p->plan_sg && p->plan_where && p->plan_gpu_of && p->plan_place && p->last_place,
				  "out of memory planning %d subgroups", s->n);
		p->plan_cap = s->n;
	}
	struct dos_plan_subgroup *sg = p->plan_sg;
	enum dos_placement *place = p->plan_place;
	int *where = p->plan_where;
	unsigned char *gpu_of = p->plan_gpu_of;
	for (int i = 0; i < s->n; i++) {
		sg[i].params = s->views[i].params;
		where[i] = gpu_holding_state(p, s->tasks[i], &s->views[i]);
		sg[i].resident_now = where[i] >= 0;
	}
	struct dos_machine_costs m, pool;
	int calibrated;
	step_costs(p, s, sched_ctx, sg, &m, &pool, &calibrated);
	place_subgroups(p, &pool, sg, s->n, place);
	assign_gpus(p, s->n, sg, where, &m, place, gpu_of);
	if (p->rule == RULE_DOS && p->ngpus > 1)
		prefer_residency_only(p, s->n, sg, where, &m, place, gpu_of);
	int ngpu = start_transfers(p, s, sg, place, gpu_of, &m);
	pin_resident_state(p, s, place, gpu_of);
	report_plan(p, s->step, sg, s->n, place, gpu_of, ngpu, &m, &pool, calibrated);
	s->planned = 1;
	/* this plan's placements become the last plan's; the last's array, the next plan's */
	p->plan_place = p->last_place;
	p->last_place = place;
	p->last_n = s->n;
	p->stats.plan_seconds += seconds_now() - t0;
	p->stats.plans++;
}

/* ---- pushing to workers ---------------------------------------------------------------- */

static void record_decision(struct policy *p, double started)
{
	lock_plan(p);
	p->stats.decisions++;
	p->stats.decision_seconds += seconds_now() - started;
	unlock_plan(p);
}

/* Queues `task` in the CPU pool and wakes the CPU workers; -1 when no CPU worker of the
 * context can run it (task->where, implementations), so that the caller places it. */
static int push_to_cpu_pool(struct policy *p, struct starpu_task *task, unsigned sched_ctx)
{
	struct starpu_worker_collection *workers = starpu_sched_ctx_get_worker_collection(sched_ctx);
	struct starpu_sched_ctx_iterator it;
	int able = 0;
	workers->init_iterator(workers, &it);
	while (!able && workers->has_next(workers, &it)) {
		int w = (int)workers->get_next(workers, &it);
		unsigned impl;
		able = !starpu_worker_is_combined_worker(w) && starpu_worker_get_type(w) == STARPU_CPU_WORKER &&
		       starpu_worker_can_execute_task_first_impl((unsigned)w, task, &impl);
	}
	if (!able)
		return -1;
	starpu_worker_relax_on();
	STARPU_PTHREAD_MUTEX_LOCK(&p->pool_lock);
	starpu_worker_relax_off();
	starpu_task_list_push_back(&p->cpu_pool, task);
	starpu_push_task_end(task);
	STARPU_PTHREAD_MUTEX_UNLOCK(&p->pool_lock);
	workers->init_iterator(workers, &it);
	while (workers->has_next(workers, &it)) {
		int w = (int)workers->get_next(workers, &it);
		if (!starpu_worker_is_combined_worker(w) && starpu_worker_get_type(w) == STARPU_CPU_WORKER)
			starpu_wake_worker_relax_light(w);
	}
	return 0;
}

/* The slot of a collected update's step, or NULL when the slot went on to another step
 * (plan lock held). */
static struct step_tasks *collected_slot(struct policy *p, struct starpu_task *task)
{
	if (!task->sched_data || !IS_COLLECTED(task->sched_data))
		return NULL;
	struct step_tasks *s = &p->steps[((uintptr_t)task->sched_data >> 8) & 0xff];
	return s->epoch == TAG_GENERATION(task->sched_data) ? s : NULL;
}

/* A ready update whose step is planned (plan lock held): the worker type its plan chose
 * (-1: none, no plan), in *gpu_node the memory node of its GPU (-1: none), and its window
 * may now fetch its task-level inputs. */
static int ready_update(struct policy *p, struct starpu_task *task, int *gpu_node)
{
	*gpu_node = -1;
	if (!IS_PLACED(task->sched_data))
		return -1;
	enum dos_placement place = TAG_PLACEMENT(task->sched_data);
	int cpu = place == DOS_PLACE_CPU || place == DOS_PLACE_CPU_THEN_RESIDENT;
	if (cpu)
		p->stats.cpu_updates++;
	else
		p->stats.gpu_updates++;
	if (!cpu)
		*gpu_node = p->gpu[TAG_GPU(task->sched_data)].node;
	if (TAG_GENERATION(task->sched_data) == p->generation) {
		/* ready now: its gradient may be fetched, if its window is there */
		struct fetch_window *w = window_of(p, place, TAG_GPU(task->sched_data));
		int i = TAG_INDEX(task->sched_data);
		w->entries[i].pushed = 1;
		if (only_task_fetch(w, i) && w->ready_tail < w->n) /* pushed once per plan */
			w->ready[w->ready_tail++] = i;
		else if (i < w->next)
			fetch_task_inputs(w, i);
		fetch_ready_in_order(w);
	}
	return cpu ? STARPU_CPU_WORKER : STARPU_CUDA_WORKER;
}

/* Queues a ready task: in the CPU pool, or on the earliest-finishing worker of GPU memory
 * node `gpu_node` (>= 0: the update's planned GPU), else of the type `only_type` (-1: any). */
static void place_ready(struct policy *p, struct starpu_task *task, unsigned ctx, int only_type, int gpu_node)
{
	if (only_type == STARPU_CPU_WORKER && push_to_cpu_pool(p, task, ctx) == 0)
		return;
	double predicted = NAN;
	int worker =
		gpu_node >= 0 ? _dos_queues_choose_on_node(&p->queues, task, ctx, (unsigned)gpu_node, &predicted) : -1;
	if (worker < 0)
		worker = _dos_queues_choose(&p->queues, task, ctx, only_type, &predicted);
	if (worker < 0) /* the planned kind cannot run it (e.g. task->where): any worker */
		worker = _dos_queues_choose(&p->queues, task, ctx, -1, &predicted);
	STARPU_ASSERT_MSG(worker >= 0, "no worker of the context can execute task %s", starpu_task_get_name(task));
	/* GPU-planned updates are prefetched by the plan, a few at a time (plan_step) */
	_dos_queues_push(&p->queues, task, worker, predicted, only_type != STARPU_CUDA_WORKER);
}

/* Places the parked updates of steps just planned (without the plan lock). */
static void dispatch_released(struct policy *p, struct starpu_task_list *release, unsigned sched_ctx)
{
	if (starpu_task_list_empty(release))
		return;
	while (!starpu_task_list_empty(release)) {
		struct starpu_task *task = starpu_task_list_pop_front(release);
		lock_plan(p);
		int gpu_node;
		int only_type = ready_update(p, task, &gpu_node);
		unlock_plan(p);
		place_ready(p, task, sched_ctx, only_type, gpu_node);
	}
	if (starpu_worker_get_id() < 0)
		issue_deferred_prefetches(p);
}

/* Whether `task` creates a subgroup's optimizer state (codelets/init_state.c). */
static int is_state_init(const struct starpu_task *task)
{
	return task->cl == &_dos_init_state_codelet;
}

/* An init task run on the GPU whose state goes home as soon as it is made (its
 * task->sched_data from push to post_exec_hook). */
#define STATE_GOES_HOME ((void *)(uintptr_t)0xfe)

/* Where the dos rule creates a fresh run's subgroup state (plan lock held): on a GPU while
 * the state created there fits in the budget the first plan will give it (step_costs: the
 * application's forecast and the margins), so that the plan finds it resident and keeps
 * it. The tasks come in the order of the updates (graph/optimizer.c), so the GPU gets the
 * first subgroups of the step, which a plan keeps resident first. The rest, which the
 * plan will update on the CPU or stage, must end in host memory: made on the GPU and
 * written home at once, while the link idles in the first forward, not by a CPU core,
 * which the first update phase needs (simulated 1b
 * bf16 with a 12000 MiB h100-pcie5: first iteration 0.293 s against 0.376 s with one of
 * the three made on the CPU, 0.27 s per 1e8 parameters there). Left on a GPU that cannot
 * keep it, such state would be written home by StarPU's evictions during the first
 * forward and backward, at StarPU's moment, as the application's data needs the room.
 * With several GPUs, each makes an even share of the state the optimizer announced
 * (_dos_sched_state_coming), in runs of neighbouring subgroups as assign_gpus keeps
 * resident state (pass 1 then finds it where it was made): GPU k the k-th share, by
 * bytes. Kept wherever each init task happened to run (2026-12-02), the state made the
 * simulated 4-GPU 1b bf16 iteration 0.131 s against 0.089 from host memory; in runs,
 * 0.0380 s steady and 0.082 s first against 0.0387 and 0.388 from host memory
 * (results/state-by-tasks-multigpu-sim-2026-12-04.md). Without an announcement (or
 * without GPUs) the CPU makes it, in host memory as --state-on-host would. With several
 * GPUs the state beyond a GPU's budget is made by the CPU too: written home by every GPU
 * at once, it crossed links the GPUs share in pairs while the first forward moved
 * activations between them (simulated 1b bf16, 4 h100-pcie5 of 3000 MiB: first iteration
 * 0.2697 s, steady 0.2034, against 0.3980 and 0.2511 through the GPUs; every multi-GPU
 * case measured gained: results/state-init-tight-multigpu-sim-2026-12-04.md). With one
 * GPU the two are even (steady, made on the CPU against through the GPU: 9000 MiB 0.2676 s
 * against 0.2644, 6000 MiB 0.4318 against 0.4455) and the state goes home through the GPU.
 * Returns the worker type (-1: any), in *gpu_node the chosen GPU's memory node (-1: none),
 * and in *goes_home whether the state is written home after the task. */
static int place_state_init(struct policy *p, struct starpu_task *task, unsigned sched_ctx, int *gpu_node,
			    int *goes_home)
{
	*gpu_node = -1;
	*goes_home = 0;
	if (p->rule != RULE_DOS)
		return -1;
	find_gpus(p, sched_ctx);
	double bytes = 0, state = 0;
	for (unsigned b = 0; b < STARPU_TASK_GET_NBUFFERS(task); b++) {
		double size = (double)starpu_data_get_size(STARPU_TASK_GET_HANDLE(task, b));
		state += size;
		bytes += _dos_gpu_charged_bytes(size);
	}
	/* several GPUs: only the state announced (sizes are whole numbers of bytes, summed
	 * exactly in a double) */
	int announced = p->state_placed_bytes + state <= p->state_coming_bytes;
	if (p->ngpus == 0 || (p->ngpus > 1 && !announced)) {
		p->state_inits_on_cpu++;
		return STARPU_CPU_WORKER;
	}
	int k = 0;
	if (p->ngpus > 1) {
		double share = p->state_coming_bytes / p->ngpus;
		k = (int)fmin(p->ngpus - 1, floor((p->state_placed_bytes + 0.5 * state) / share));
		p->state_placed_bytes += state;
	}
	struct gpu_plan *g = &p->gpu[k];
	double extra;
	int learned;
	double reserve =
		app_memory_forecast(p, k, &extra, &learned) + p->eviction_margin_bytes + p->declared_reserve_bytes;
	*gpu_node = g->node;
	if (_dos_gpu_budget_bytes((unsigned)g->node, reserve) - g->born_state_bytes >= bytes) {
		g->born_state_bytes += bytes;
		p->state_inits_on_gpu++;
	} else if (p->ngpus > 1) {
		*gpu_node = -1;
		p->state_inits_on_cpu++;
		return STARPU_CPU_WORKER;
	} else {
		p->state_inits_home_via_gpu++;
		*goes_home = 1;
	}
	/* State kept: any type, so that the queue allocates its buffers on the GPU when it is
	 * queued, as for a task we know nothing special about; queued without (as a
	 * GPU-placed update), StarPU allocated the state later and evicted two of eleven kept
	 * subgroups in the second iteration on a 16000 MiB GPU (1b bf16: 0.067 s steady
	 * against 0.058). State going home is allocated only when it runs, after the kept
	 * state, and leaves clean copies StarPU evicts first. */
	return *goes_home ? STARPU_CUDA_WORKER : -1;
}

/* Whether a ready update of an open step may wait for the step to complete: only when
 * its completion is sure to come (dos.h's step contract). */
static int may_park(const struct policy *p)
{
	return p->announced || p->last_step_size > 0;
}

static int push_task(struct starpu_task *task)
{
	unsigned ctx = task->sched_ctx;
	struct policy *p = policy_of(ctx);
	double t0 = seconds_now();
	int only_type = -1, gpu_node = -1;
	if (_dos_is_update(task)) {
		lock_plan(p);
		struct step_tasks *s = collected_slot(p, task);
		if (s && !s->planned) {
			if (!s->closed && may_park(p)) { /* its plan waits for the whole step */
				starpu_task_list_push_back(&s->parked, task);
				/* StarPU's push ends here; placing it later only moves its push end time */
				starpu_push_task_end(task);
				unlock_plan(p);
				record_decision(p, t0);
				return 0;
			}
			plan_step(p, s, ctx);
		}
		only_type = ready_update(p, task, &gpu_node);
		unlock_plan(p);
		if (starpu_worker_get_id() < 0) /* the application's thread, submitting */
			issue_deferred_prefetches(p);
	} else if (is_state_init(task)) {
		int goes_home;
		lock_plan(p);
		only_type = place_state_init(p, task, ctx, &gpu_node, &goes_home);
		unlock_plan(p);
		task->sched_data = goes_home ? STATE_GOES_HOME : NULL;
	}
	place_ready(p, task, ctx, only_type, gpu_node);
	record_decision(p, t0);
	return 0;
}

/* StarPU calls it before the application waits: every step collected so far is complete,
 * and its parked updates are planned and placed (nothing may wait on a wait). */
static void do_schedule(unsigned sched_ctx)
{
	struct policy *p = policy_of(sched_ctx);
	struct starpu_task_list release;
	starpu_task_list_init(&release);
	lock_plan(p);
	newest_step_complete(p);
	for (int i = 0; i < STEP_SLOTS; i++)
		close_step(p, &p->steps[i], sched_ctx, &release);
	unlock_plan(p);
	dispatch_released(p, &release, sched_ctx);
}

/* Whether every buffer `task` reads is valid on memory node `node` already: arrived, not
 * on its way. (starpu_data_is_on_node also says yes while a fetch to the node is only
 * requested or in flight: with that test an update whose gradient the window had asked
 * for never yielded, and the worker held every task behind it for the whole transfer;
 * 7b on 2 simulated nodes, results/cluster-fetch-order-2026-12-03.md.) */
static int inputs_on_node(struct starpu_task *task, unsigned node)
{
	for (int b = 0; b < (int)STARPU_TASK_GET_NBUFFERS(task); b++)
		if ((STARPU_TASK_GET_MODE(task, b) & STARPU_R) && !valid_on_node(STARPU_TASK_GET_HANDLE(task, b), node))
			return 0;
	return 1;
}

/* The next task of GPU worker w's queue. A worker runs its tasks in order, and one whose
 * inputs are still to cross the link holds up every task behind it: a GPU update whose
 * state is still being fetched (staged state, 1 GB or more per subgroup) would stall
 * the end of backward for that long, and with it the gradients every other update waits
 * for. So such an update yields to the first application task queued behind it; it runs
 * when its inputs have arrived, or when no application task is queued. Updates keep
 * their plan order among themselves: the fetch windows follow it, and a later update
 * whose state happens to arrive first would run ahead of the fetches planned for the
 * earlier ones (slower: results/full-gpu-sim-2026-11-29.md). */
static struct starpu_task *next_gpu_task(struct starpu_task_list *queue, int w)
{
	struct starpu_task *front = starpu_task_list_front(queue);
	unsigned node = starpu_worker_get_memory_node((unsigned)w);
	if (_dos_is_update(front) && !inputs_on_node(front, node))
		for (struct starpu_task *t = starpu_task_list_next(front); t != starpu_task_list_end(queue);
		     t = starpu_task_list_next(t))
			if (!_dos_is_update(t))
				return t;
	return front;
}

/* The first pooled update CPU worker w can run (task->where may exclude some), or NULL. */
static struct starpu_task *take_from_cpu_pool(struct policy *p, int w)
{
	if (starpu_task_list_empty(&p->cpu_pool))
		return NULL;
	struct starpu_task *task = NULL;
	starpu_worker_relax_on();
	STARPU_PTHREAD_MUTEX_LOCK(&p->pool_lock);
	starpu_worker_relax_off();
	for (struct starpu_task *t = starpu_task_list_begin(&p->cpu_pool); t != starpu_task_list_end(&p->cpu_pool);
	     t = starpu_task_list_next(t)) {
		unsigned impl;
		if (starpu_worker_can_execute_task_first_impl((unsigned)w, t, &impl)) {
			starpu_task_list_erase(&p->cpu_pool, t);
			task = t;
			break;
		}
	}
	STARPU_PTHREAD_MUTEX_UNLOCK(&p->pool_lock);
	return task;
}

/* Whether CPU worker w should take a pooled update before its own queue: when the
 * queue's next task does not outrank the first pooled update. A ready update is the
 * step's critical work (the next forward waits for its weights, on every rank of a
 * data-parallel job), while a CPU worker's queue may hold hundreds of milliseconds of
 * other ready tasks (the scatter exchange's sums and chunk copies): taken only once the
 * queue was empty, a CPU update waited behind all of them, and the forward of the next
 * step with it (7b on 8 simulated nodes: results/cluster-scaling-sim-2026-12-02.md). A
 * micro-batch ranked above the optimizer (train.c) still goes first. */
static int pool_first(struct policy *p, int w)
{
	const struct starpu_task *queued = _dos_queues_front(&p->queues, w);
	int first = 0;
	if (!queued)
		return 0;
	/* read before relaxing: a relaxed worker's queue is open to thieves, which may take
	 * this task and run it to its end (and StarPU free it) before the pool lock is ours */
	int queued_priority = queued->priority;
	starpu_worker_relax_on();
	STARPU_PTHREAD_MUTEX_LOCK(&p->pool_lock);
	starpu_worker_relax_off();
	if (!starpu_task_list_empty(&p->cpu_pool))
		first = starpu_task_list_front(&p->cpu_pool)->priority >= queued_priority;
	STARPU_PTHREAD_MUTEX_UNLOCK(&p->pool_lock);
	return first;
}

/* A CPU worker runs pooled CPU updates before the tasks of its queue that do not outrank
 * them (pool_first); otherwise a worker runs its own queue first, then pooled CPU
 * updates, then what it may take from other workers' queues. A worker removed from the
 * context (StarPU lets it pop there until it finds nothing) hands its queue over to the
 * workers that remain, and takes pooled updates only when no CPU worker remains to take
 * them. */
static struct starpu_task *pop_task(unsigned sched_ctx)
{
	struct policy *p = policy_of(sched_ctx);
	int w = starpu_worker_get_id_check();
	int member = starpu_sched_ctx_contains_worker(w, sched_ctx);
	int cpu = starpu_worker_get_type(w) == STARPU_CPU_WORKER;
	if (!member)
		_dos_queues_hand_over(&p->queues, w, sched_ctx);
	struct starpu_task *task = cpu && member && pool_first(p, w) ? take_from_cpu_pool(p, w) : NULL;
	if (!task && starpu_worker_get_type(w) == STARPU_CUDA_WORKER) {
		const struct starpu_task *front = _dos_queues_front(&p->queues, w);
		task = _dos_queues_pop(&p->queues, w, next_gpu_task);
		if (task != front) /* next_gpu_task let a task pass an update waiting for its inputs */
			__atomic_fetch_add(&p->gpu_yields, 1, __ATOMIC_RELAXED);
	} else if (!task)
		task = _dos_queues_pop(&p->queues, w, NULL);
	if (!task && cpu && (member || _dos_count_workers_of_type(sched_ctx, STARPU_CPU_WORKER) == 0))
		task = take_from_cpu_pool(p, w);
	if (!task && member)
		task = _dos_queues_steal(&p->queues, w, sched_ctx);
	return task;
}

/* task->sched_data of an application task running on the planned GPU: its start time
 * (StarPU's clock, in us, plus one so that it is never NULL). */
#define START_TAG(us) ((void *)(uintptr_t)((uint64_t)(us) + 1))
#define TAG_START_US(d) ((double)((uint64_t)(uintptr_t)(d)-1))

static void pre_exec_hook(struct starpu_task *task, unsigned sched_ctx)
{
	struct policy *p = policy_of(sched_ctx);
	issue_deferred_prefetches(p); /* those a push on a worker thread had to leave */
	if (_dos_is_update(task)) {
		/* the update began: its window must not fetch for it any more */
		lock_plan(p);
		if (IS_PLACED(task->sched_data) && TAG_GENERATION(task->sched_data) == p->generation) {
			struct fetch_window *w =
				window_of(p, TAG_PLACEMENT(task->sched_data), TAG_GPU(task->sched_data));
			struct fetch_entry *e = &w->entries[TAG_INDEX(task->sched_data)];
			e->started = 1;
			if (e->task_fetched && w->task_fetches_pending > 0)
				w->task_fetches_pending--;
			else if (only_task_fetch(w, TAG_INDEX(task->sched_data)) && w != &p->on_cpu)
				p->started_unfetched++;
			fetch_ready_in_order(w);
		}
		unlock_plan(p);
		return;
	}
	if (is_state_init(task)) /* the optimizer's own state, not the application's memory */
		return;
	/* an application task on a planned GPU: when it used its data is what that GPU's
	 * forecast of the application's memory learns from (app_memory.c) */
	int w = starpu_worker_get_id();
	if (starpu_worker_get_type(w) == STARPU_CUDA_WORKER &&
	    gpu_index_of_node(p, starpu_worker_get_memory_node((unsigned)w)) >= 0)
		task->sched_data = START_TAG(starpu_timing_now());
}

static void post_exec_hook(struct starpu_task *task, unsigned sched_ctx)
{
	_dos_queues_task_ended(&policy_of(sched_ctx)->queues, starpu_worker_get_id_check());
	if (is_state_init(task)) {
		if (task->sched_data == STATE_GOES_HOME &&
		    starpu_worker_get_type(starpu_worker_get_id_check()) == STARPU_CUDA_WORKER) {
			/* state the first plan will not keep on this GPU: home now, while the link
			 * idles before the first forward needs the room; its GPU copy, clean
			 * then, is the first evicted */
			struct policy *p = policy_of(sched_ctx);
			for (unsigned b = 0; b < STARPU_TASK_GET_NBUFFERS(task); b++)
				starpu_data_wont_use(STARPU_TASK_GET_HANDLE(task, b));
			lock_plan(p);
			for (unsigned b = 0; b < STARPU_TASK_GET_NBUFFERS(task); b++)
				defer_prefetch(p, STARPU_TASK_GET_HANDLE(task, b), STARPU_MAIN_RAM, 0, 0);
			unlock_plan(p);
		}
		task->sched_data = NULL;
		return;
	}
	struct _dos_update_view u;
	if (_dos_update_view(task, &u)) {
		if (task->sched_data) { /* an application task that ran on the GPU */
			struct policy *p = policy_of(sched_ctx);
			double start = TAG_START_US(task->sched_data) * 1e-6, end = starpu_timing_now() * 1e-6;
			task->sched_data = NULL;
			lock_plan(p);
			int k = gpu_index_of_node(p, starpu_worker_get_memory_node(starpu_worker_get_id_check()));
			struct dos_app_memory *am = k >= 0 ? &p->gpu[k].app_memory : NULL;
			for (int b = 0; am && b < (int)STARPU_TASK_GET_NBUFFERS(task); b++) {
				starpu_data_handle_t h = STARPU_TASK_GET_HANDLE(task, b);
				_dos_app_memory_use(am, h, (double)starpu_data_get_size(h), home_is_gpu(h),
						    (STARPU_TASK_GET_MODE(task, b) & STARPU_R) != 0, start, end);
			}
			if (am)
				_dos_app_memory_task(am, start, end);
			unlock_plan(p);
		}
		return;
	}
	if (!IS_PLACED(task->sched_data))
		return;
	enum dos_placement place = TAG_PLACEMENT(task->sched_data);
	int gpu = TAG_GPU(task->sched_data);
	uint32_t generation = TAG_GENERATION(task->sched_data);
	task->sched_data = NULL;
	int on_cuda = starpu_worker_get_type(starpu_worker_get_id()) == STARPU_CUDA_WORKER;
	struct policy *p = policy_of(sched_ctx);
	if (place != DOS_PLACE_CPU && place != DOS_PLACE_CPU_THEN_RESIDENT && on_cuda) {
		/* The gradient and the 16-bit weights are done with on the GPU (each is written
		 * home or dropped when its home is the host): their copies must not crowd out
		 * resident state. Staged state is written back now, and its GPU copy is the
		 * first evicted. */
		for (int r = place == DOS_PLACE_GPU_TRANSIENT ? DOS_ADAM_BUF_MASTER : DOS_ADAM_BUF_GRAD;
		     r < u.step_data_end; r++)
			starpu_data_wont_use(_dos_update_handle(task, &u, r));
		/* The host reads the non-finite flag one step later: written home while the link
		 * idles, it is there when asked, instead of each read waiting for a transfer on
		 * the submitting thread. */
		int flag = u.flag;
		if (flag >= 0)
			starpu_data_wont_use(STARPU_TASK_GET_HANDLE(task, flag));
	}
	double now = starpu_timing_now() * 1e-6;
	lock_plan(p);
	/* the span of its gradient's and 16-bit weights' GPU copies, on whichever GPU the
	 * application's tasks used them */
	for (int k = 0; k < p->ngpus; k++)
		for (int r = DOS_ADAM_BUF_GRAD; r < u.step_data_end; r++) {
			starpu_data_handle_t h = _dos_update_handle(task, &u, r);
			if (!home_is_gpu(h))
				_dos_app_memory_update_use(&p->gpu[k].app_memory, h,
							   (STARPU_TASK_GET_MODE(task, u.buffer[r]) & STARPU_R) != 0,
							   now);
		}
	if (place == DOS_PLACE_CPU_THEN_RESIDENT && !on_cuda && p->ngpus > 0)
		/* its state moves to the GPU now that the CPU has updated it, when the link has
		 * nothing else to do (the next forward and backward): resident next step */
		for (int r = 0; r < DOS_ADAM_STATE_BUFFERS; r++)
			defer_prefetch(p, _dos_update_handle(task, &u, r), (unsigned)p->gpu[gpu].node, 0, 1);
	if (place == DOS_PLACE_GPU_TRANSIENT && on_cuda && p->gpu[gpu].eager_writeback)
		/* When the GPU cannot keep every staged subgroup beside the resident state until
		 * the next update phase, staged state goes home now, as the plan assumes, not
		 * when StarPU finds the link idle (wont_use): left dirty, its copies are evicted
		 * on demand and the next forward's allocations wait for those write-backs. A
		 * fetch to host memory leaves the GPU copy clean, so evicting it then costs
		 * nothing. When the GPU can keep them, the lazy write-back often never happens
		 * before the next step stages the same state again, which then moves nothing:
		 * writing back eagerly there only adds traffic. (Measured both ways:
		 * results/full-gpu-sim-2026-11-29.md, results/comment-evidence-2026-12-01.md.) */
		for (int r = 0; r < DOS_ADAM_STATE_BUFFERS; r++)
			defer_prefetch(p, _dos_update_handle(task, &u, r), STARPU_MAIN_RAM, 0, 0);
	if (generation == p->generation) { /* not an update of an older plan */
		/* one more update of its window ended: start the next fetch */
		for (int k = 0; k < p->ngpus; k++)
			_dos_app_memory_update_ended(&p->gpu[k].app_memory, now);
		struct fetch_window *w = window_of(p, place, gpu);
		w->ended++;
		window_advance(p, w, w->ended);
	}
	unlock_plan(p);
	issue_deferred_prefetches(p);
}

static void add_workers(unsigned sched_ctx, int *workerids, unsigned nworkers)
{
	(void)workerids;
	(void)nworkers;
	struct policy *p = policy_of(sched_ctx);
	/* Parallel tasks run on combined workers, which StarPU creates on request and adds to
	 * the main context (0) only (peager does the same; earlier, in init_sched, is too early). */
	if (sched_ctx == 0)
		starpu_sched_find_all_worker_combinations();
	/* the GPUs planned for, known before the first plan so that the forecasts of the
	 * application's memory learn from the first forward and backward */
	find_gpus(p, sched_ctx);
}

/* Called by StarPU as it deletes the context (1.4 does not call it when workers are
 * removed from a live context: pop_task sees that). Anything still queued for a removed
 * worker goes to the workers that remain. */
static void remove_workers(unsigned sched_ctx, int *workerids, unsigned nworkers)
{
	struct policy *p = policy_of(sched_ctx);
	for (unsigned i = 0; i < nworkers; i++)
		if (!starpu_worker_is_combined_worker(workerids[i]))
			_dos_queues_hand_over(&p->queues, workerids[i], sched_ctx);
}

#define DOS_POLICY(var, name_, init_fn, description)                                                                  \
	struct starpu_sched_policy var = {                                                                            \
		.init_sched = init_fn,                                                                                \
		.deinit_sched = deinit_policy,                                                                        \
		.push_task = push_task,                                                                               \
		.pop_task = pop_task,                                                                                 \
		.submit_hook = submit_hook,                                                                           \
		.do_schedule = do_schedule,                                                                           \
		.pre_exec_hook = pre_exec_hook,                                                                       \
		.post_exec_hook = post_exec_hook,                                                                     \
		.add_workers = add_workers,                                                                           \
		.remove_workers = remove_workers,                                                                     \
		.policy_name = name_,                                                                                 \
		.policy_description = description,                                                                    \
		.worker_type = STARPU_WORKER_LIST, /* we prefetch ourselves (push, plan): StarPU must not also, or it \
						      asserts */                                                      \
		.prefetches = 1,                                                                                      \
	}

DOS_POLICY(_dos_policy_dos, "dos", init_dos,
	   "starpu-dos: optimizer updates split CPU/GPU by a cost-model plan per step");
DOS_POLICY(_dos_policy_all_cpu, "all-cpu", init_all_cpu,
	   "starpu-dos baseline: every optimizer update on the CPU (ZeRO-Offload)");
DOS_POLICY(_dos_policy_stride, "stride", init_stride,
	   "starpu-dos baseline: every k-th update on the GPU, state in and out (DOS prototype; DOS_STRIDE_K)");
DOS_POLICY(_dos_policy_resident, "resident", init_resident,
	   "starpu-dos baseline: a fixed share kept on the GPU (Twin-Flow; DOS_RESIDENT_RATIO)");

static struct starpu_sched_policy *all_policies[] = {&_dos_policy_dos, &_dos_policy_all_cpu, &_dos_policy_stride,
						     &_dos_policy_resident, NULL};

struct starpu_sched_policy *dos_sched_policy(const char *name)
{
	for (int i = 0; name && all_policies[i]; i++)
		if (strcmp(all_policies[i]->policy_name, name) == 0)
			return all_policies[i];
	return NULL;
}

/* StarPU's plugin entry points: STARPU_SCHED_LIB=libstarpu-dos.so STARPU_SCHED=dos. */
struct starpu_sched_policy *starpu_get_sched_lib_policy(const char *name)
{
	return dos_sched_policy(name);
}

struct starpu_sched_policy **starpu_get_sched_lib_policies(void)
{
	return all_policies;
}

/* Our policy's state in `sched_ctx`, or NULL when another policy runs it. */
static struct policy *our_policy(unsigned sched_ctx)
{
	/* StarPU keeps its own copy of the policy structure: recognise ours by its code */
	struct starpu_sched_policy *pol = starpu_sched_ctx_get_sched_policy(sched_ctx);
	return pol && pol->push_task == push_task ? policy_of(sched_ctx) : NULL;
}

int _dos_sched_ctx_is_ours(unsigned sched_ctx)
{
	return starpu_is_initialized() && sched_ctx < STARPU_NMAX_SCHED_CTXS && our_policy(sched_ctx) != NULL;
}

/* Our policy's state in `sched_ctx`, or NULL with the error recorded. */
static struct policy *checked_policy(const char *function, unsigned sched_ctx)
{
	if (_dos_check_sched_ctx(function, "sched_ctx", sched_ctx))
		return NULL;
	struct policy *p = our_policy(sched_ctx);
	if (!p) {
		struct starpu_sched_policy *pol = starpu_sched_ctx_get_sched_policy(sched_ctx);
		_dos_fail(-EINVAL, function, "sched_ctx = %u is run by %s, not by a starpu-dos policy", sched_ctx,
			  pol && pol->policy_name ? pol->policy_name : "no policy");
	}
	return p;
}

void _dos_sched_state_coming(unsigned sched_ctx, double bytes)
{
	struct policy *p = _dos_sched_ctx_is_ours(sched_ctx) ? our_policy(sched_ctx) : NULL;
	if (!p)
		return;
	lock_plan(p);
	p->state_coming_bytes = bytes;
	p->state_placed_bytes = 0;
	unlock_plan(p);
}

int dos_sched_reserve_gpu_bytes(unsigned sched_ctx, double bytes)
{
	if (!(bytes >= 0) || !isfinite(bytes))
		return DOS_FAIL(-EINVAL, "bytes = %g must be finite and >= 0", bytes);
	struct policy *p = checked_policy(__func__, sched_ctx);
	if (!p)
		return -EINVAL;
	lock_plan(p);
	p->app_reserve_bytes = bytes;
	unlock_plan(p);
	return 0;
}

int dos_sched_step_submitted(unsigned sched_ctx)
{
	struct policy *p = checked_policy(__func__, sched_ctx);
	if (!p)
		return -EINVAL;
	struct starpu_task_list release;
	starpu_task_list_init(&release);
	lock_plan(p);
	p->announced = 1;
	newest_step_complete(p);
	/* the step being submitted: the newest still collecting */
	struct step_tasks *newest = NULL;
	for (int i = 0; i < STEP_SLOTS; i++) {
		struct step_tasks *s = &p->steps[i];
		if (s->n > 0 && !s->planned && !s->closed && (!newest || s->step > newest->step))
			newest = s;
	}
	if (newest)
		close_step(p, newest, sched_ctx, &release);
	unlock_plan(p);
	dispatch_released(p, &release, sched_ctx);
	return 0;
}

int dos_sched_get_stats(unsigned sched_ctx, struct dos_sched_stats *out)
{
	if (!out)
		return DOS_FAIL(-EINVAL, "out is NULL");
	struct policy *p = checked_policy(__func__, sched_ctx);
	if (!p)
		return -EINVAL;
	lock_plan(p);
	*out = p->stats;
	unlock_plan(p);
	return 0;
}
