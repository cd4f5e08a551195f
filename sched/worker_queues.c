/* The policies' per-worker queues: placement of any task, the order of each queue,
 * stealing by idle workers, parallel tasks on combined workers, workers leaving a context.
 *
 * Locking, as StarPU's own policies do it: a worker's queue and counters change only
 * under its scheduling mutex taken with starpu_worker_lock (or starpu_worker_trylock),
 * which waits until that worker is outside a scheduling operation or relaxed in one, or
 * by the worker itself in its pop_task before it relaxes (StarPU calls pop_task without
 * the mutex, in a scheduling operation). The end of the task a worker runs is its own to
 * write. Placement reads other workers' counters without their locks: an estimate, as in
 * dmda. */
#include <math.h>
#include <string.h>

#include <starpu.h>
#include <starpu_scheduler.h>

#include "worker_queues.h"

void _dos_queues_init(struct dos_worker_queues *q, int (*planned)(const struct starpu_task *task))
{
	for (int w = 0; w < STARPU_NMAXWORKERS; w++) {
		starpu_task_list_init(&q->of[w].tasks);
		q->of[w].ntasks = q->of[w].nunclaimed = 0;
		q->of[w].queued_us = q->of[w].running_end_us = 0;
	}
	q->planned = planned;
	memset(q->last_gpu, 0, sizeof q->last_gpu);
	q->generation = 0;
	STARPU_PTHREAD_MUTEX_INIT(&q->parallel_lock, NULL);
}

void _dos_queues_destroy(struct dos_worker_queues *q)
{
	STARPU_PTHREAD_MUTEX_DESTROY(&q->parallel_lock);
}

/* A task the workers of a combined worker may run together (StarPU's SPMD and fork-join
 * codelets). */
static int is_parallel(const struct starpu_task *task)
{
	return task->cl && task->cl->type != STARPU_SEQ && task->cl->max_parallelism > 1;
}

/* Queued without a predicted length: no model claims the task for its worker. */
static int unclaimed(const struct starpu_task *task)
{
	return !(task->predicted > 0);
}

/* What an idle worker may take from another's queue: an unclaimed task that no plan
 * placed and that is not a parallel task's alias (which must run on its worker). */
static int stealable(const struct dos_worker_queues *q, const struct starpu_task *task)
{
	return unclaimed(task) && !is_parallel(task) && !q->planned(task);
}

/* ---- the order of a queue ------------------------------------------------------------ */

/* Whether `task`, queued after `queued`, may run before it: tasks run by priority, first
 * come first served among equals, except that a planned task never passes another (the
 * plan's order, which its fetch windows follow) and no task passes a parallel task's
 * alias (the workers of a combined worker must all reach its barrier, in the same order
 * for every parallel task, or they wait for each other forever). */
static int may_pass(const struct dos_worker_queues *q, const struct starpu_task *task, const struct starpu_task *queued)
{
	return task->priority > queued->priority && !is_parallel(queued) && !(q->planned(task) && q->planned(queued));
}

/* Worker w's counters, for `task` joining (+1) or leaving (-1) its queue. An empty queue
 * resets the sums: rounding never accumulates, and neither does the count of unclaimed
 * tasks when a codelet changes its type while tasks of it are queued (StarPU's cholesky
 * makes its gemm parallel midway); that count only tells thieves where to look. */
static void count(struct dos_worker_queues *q, int w, const struct starpu_task *task, int sign)
{
	struct dos_worker_queue *wq = &q->of[w];
	wq->ntasks += sign;
	wq->nunclaimed = wq->ntasks ? wq->nunclaimed + sign * stealable(q, task) : 0;
	wq->queued_us = wq->ntasks ? fmax(0.0, wq->queued_us + sign * (unclaimed(task) ? 0 : task->predicted)) : 0;
}

static void enqueue(struct dos_worker_queues *q, int w, struct starpu_task *task)
{
	struct dos_worker_queue *wq = &q->of[w];
	struct starpu_task_list passed;
	starpu_task_list_init(&passed);
	while (!starpu_task_list_empty(&wq->tasks) && may_pass(q, task, starpu_task_list_back(&wq->tasks)))
		starpu_task_list_push_front(&passed, starpu_task_list_pop_back(&wq->tasks));
	starpu_task_list_push_back(&wq->tasks, task);
	while (!starpu_task_list_empty(&passed))
		starpu_task_list_push_back(&wq->tasks, starpu_task_list_pop_front(&passed));
	count(q, w, task, 1);
}

static void dequeue(struct dos_worker_queues *q, int w, struct starpu_task *task)
{
	starpu_task_list_erase(&q->of[w].tasks, task);
	count(q, w, task, -1);
}

/* ---- placement ------------------------------------------------------------------------- */

/* The basic workers behind `w`: itself, or the members of a combined worker. */
static int members_of(int w, int **members, int *single)
{
	if (!starpu_worker_is_combined_worker(w)) {
		*single = w;
		*members = single;
		return 1;
	}
	int n;
	starpu_combined_worker_get_description(w, &n, members);
	return n;
}

/* When worker w (basic or combined) could start a new task, predicted. */
static double free_at(const struct dos_worker_queues *q, int w, double now)
{
	int single, *members, n = members_of(w, &members, &single);
	double at = now;
	for (int i = 0; i < n; i++) {
		const struct dos_worker_queue *wq = &q->of[members[i]];
		at = fmax(at, fmax(now, wq->running_end_us) + wq->queued_us);
	}
	return at;
}

/* Tasks ahead of a new one on worker w, counting the one it runs. */
static int tasks_ahead(const struct dos_worker_queues *q, int w)
{
	int single, *members, n = members_of(w, &members, &single), most = 0;
	for (int i = 0; i < n; i++) {
		const struct dos_worker_queue *wq = &q->of[members[i]];
		int ahead = wq->ntasks + (wq->running_end_us > 0);
		most = ahead > most ? ahead : most;
	}
	return most;
}

/* Whether worker w may run `task` (only workers of type `only_type` when >= 0; combined
 * workers only parallel tasks), with the implementation in *impl. */
static int can_run(int w, struct starpu_task *task, int only_type, unsigned *impl)
{
	if (!starpu_worker_is_combined_worker(w))
		return (only_type < 0 || starpu_worker_get_type(w) == (enum starpu_worker_archtype)only_type) &&
		       starpu_worker_can_execute_task_first_impl((unsigned)w, task, impl);
	if (!is_parallel(task) || (only_type >= 0 && only_type != STARPU_CPU_WORKER))
		return 0;
	for (*impl = 0; *impl < STARPU_MAXIMPLEMENTATIONS; (*impl)++)
		if (starpu_combined_worker_can_execute_task((unsigned)w, task, *impl))
			return 1;
	return 0;
}

/* ---- the GPU a repeated task used last ------------------------------------------------ */

/* A training iteration submits the same tasks every step, on the same data. Placed by
 * earliest finish alone, with every GPU about as busy, each lands on whichever GPU the
 * queues favour at that instant, another one each step: every GPU then holds a changing
 * part of the model, so what each GPU has left for the dos policy's resident state moves
 * from step to step, and the plans with it (4 GPUs of 3000 MiB, 1b bf16:
 * results/sim-compare-rerun-2026-12-04.md). So a task goes back to the GPU it was placed
 * on last time when that GPU is not far behind the best. The table is keyed by a hash of
 * the codelet and the handles; an entry packs the key's high 48 bits, the generation it
 * was stored in (8 bits) and the memory node plus one (8 bits; 0: empty) in one word, read
 * and written atomically by whichever thread places a task. A collision or a handle
 * address reused only misleads a hint; but the addresses, and so the collisions, change
 * from run to run: with one slot per key the same simulated run took 0.163 to 0.198 s a
 * step from one run to the next, so a key probes a few slots after its own. And tasks on
 * data made anew each step (a new key each time) would fill the table in a few steps:
 * the dos policy starts a generation at each plan, and an entry two generations old is
 * free for another key (1b bf16, 4 micro-batches: 2 of every 7 stores overwrote a live
 * hint by the tenth step without). */
static uint64_t task_key(const struct starpu_task *task)
{
	uint64_t h = (uint64_t)(uintptr_t)task->cl * 0x9e3779b97f4a7c15ULL;
	unsigned n = STARPU_TASK_GET_NBUFFERS(task);
	for (unsigned i = 0; i < n; i++)
		h = (h ^ (uint64_t)(uintptr_t)STARPU_TASK_GET_HANDLE(task, i)) * 0xff51afd7ed558ccdULL;
	return h ^ (h >> 29);
}

#define HINT_SLOT(key) ((unsigned)(((key) >> 16) % DOS_QUEUES_GPU_HINTS))
#define HINT_TAG(key) ((key) & ~(uint64_t)0xffff)
#define HINT_GENERATION(e) ((unsigned)((e) >> 8) & 0xff)
#define HINT_PROBES 8 /* slots a key may take after its own */

void _dos_queues_next_generation(struct dos_worker_queues *q)
{
	__atomic_store_n(&q->generation, (__atomic_load_n(&q->generation, __ATOMIC_RELAXED) + 1) & 0xff,
			 __ATOMIC_RELAXED);
}

/* The memory node `task` was last placed on, or -1. */
static int gpu_hint(const struct dos_worker_queues *q, uint64_t key)
{
	for (unsigned i = 0; i < HINT_PROBES; i++) {
		uint64_t e =
			__atomic_load_n(&q->last_gpu[(HINT_SLOT(key) + i) % DOS_QUEUES_GPU_HINTS], __ATOMIC_RELAXED);
		if (e == 0)
			return -1;
		if (HINT_TAG(e) == HINT_TAG(key))
			return (int)(e & 0xff) - 1;
	}
	return -1;
}

/* Into the key's own slot, else the first empty or stale one after it, else over the
 * first (two threads placing at once may both take a slot: a duplicate, harmless). */
static void remember_gpu(struct dos_worker_queues *q, uint64_t key, unsigned node)
{
	if (node >= 0xff)
		return;
	unsigned now = __atomic_load_n(&q->generation, __ATOMIC_RELAXED), at = HINT_SLOT(key), free_at = ~0u;
	for (unsigned i = 0; i < HINT_PROBES; i++) {
		unsigned slot = (HINT_SLOT(key) + i) % DOS_QUEUES_GPU_HINTS;
		uint64_t e = __atomic_load_n(&q->last_gpu[slot], __ATOMIC_RELAXED);
		if (e != 0 && HINT_TAG(e) == HINT_TAG(key)) {
			free_at = slot;
			break;
		}
		if (free_at == ~0u && (e == 0 || ((now - HINT_GENERATION(e)) & 0xff) >= 2))
			free_at = slot;
	}
	if (free_at != ~0u)
		at = free_at;
	__atomic_store_n(&q->last_gpu[at], HINT_TAG(key) | (uint64_t)now << 8 | (node + 1), __ATOMIC_RELAXED);
}

/* Earliest predicted finish (queued and running work, StarPU's transfer prediction,
 * perfmodel length; dmda's rule without its fixed transfer fudge). A task that some
 * candidate has no prediction for (no model: 0, no samples yet: NAN) is placed instead
 * as StarPU's own policies place it: by queue length relative to the worker's speed,
 * among the workers still without samples if there are any, since StarPU learns the
 * times of a kind of worker only from tasks that run on one. Only workers whose memory
 * node is `only_node` (-1: any) are candidates. */
static int choose(struct dos_worker_queues *q, struct starpu_task *task, unsigned sched_ctx, int only_type,
		  int only_node, double *predicted_us)
{
	struct starpu_worker_collection *workers = starpu_sched_ctx_get_worker_collection(sched_ctx);
	struct starpu_sched_ctx_iterator it;
	double now = starpu_timing_now();
	int best = -1, by_length = -1, unknown = 0, calibrating = 0;
	double best_end = INFINITY, best_len = NAN, least_load = INFINITY, by_length_len = NAN;
	/* The candidates first, the cheap test (the memory node) before StarPU's: a task
	 * placed on one GPU's workers would otherwise ask StarPU about every worker of the
	 * machine. With one candidate, there is no finish time to compare: no transfer
	 * prediction (a bus model query per buffer). */
	int room = workers->nworkers > 0 ? (int)workers->nworkers : 1, candidate[room], ncandidates = 0, gpus = 0;
	unsigned impl_of[room];
	/* skips the workers that a parallel section of another context has booked */
	workers->init_iterator_for_parallel_tasks(workers, &it, task);
	while (workers->has_next(workers, &it)) {
		int w = (int)workers->get_next(workers, &it);
		if (only_node >= 0 && (starpu_worker_is_combined_worker(w) ||
				       starpu_worker_get_memory_node((unsigned)w) != (unsigned)only_node))
			continue;
		if (ncandidates < room && can_run(w, task, only_type, &impl_of[ncandidates])) {
			gpus += starpu_worker_get_type(w) == STARPU_CUDA_WORKER;
			candidate[ncandidates++] = w;
		}
	}
	/* the GPU of the last time, for the application's tasks that a GPU may run (hints
	 * name GPUs only: without one among the candidates, no key is worth computing) */
	int hinted =
		only_node < 0 && ncandidates > 1 && gpus > 0 && task->cl && !is_parallel(task) && !q->planned(task);
	uint64_t key = hinted ? task_key(task) : 0;
	int hint_node = hinted ? gpu_hint(q, key) : -1, on_hint = -1;
	double on_hint_end = INFINITY, on_hint_len = NAN;
	for (int c = 0; c < ncandidates; c++) {
		int w = candidate[c];
		double len = starpu_task_worker_expected_length(task, (unsigned)w, sched_ctx, impl_of[c]);
		double load = (tasks_ahead(q, w) + 1) /
			      starpu_worker_get_relative_speedup(starpu_worker_get_perf_archtype(w, sched_ctx));
		if (isnan(len) && !calibrating) { /* from now on, only workers still calibrating */
			calibrating = 1;
			least_load = INFINITY;
		}
		if ((isnan(len) || !calibrating) && load < least_load) {
			least_load = load;
			by_length = w;
			by_length_len = len;
		}
		if (!(len > 0)) {
			unknown = 1;
			continue;
		}
		if (ncandidates == 1) { /* nothing to compare its finish with */
			best = w;
			best_len = len;
			break;
		}
		double xfer = starpu_task_expected_data_transfer_time_for(task, (unsigned)w);
		double end = free_at(q, w, now) + (isfinite(xfer) ? xfer : 0) + len;
		if (end < best_end) {
			best_end = end;
			best = w;
			best_len = len;
		}
		if (hint_node >= 0 && starpu_worker_get_memory_node((unsigned)w) == (unsigned)hint_node &&
		    end < on_hint_end) {
			on_hint_end = end;
			on_hint = w;
			on_hint_len = len;
		}
	}
	if (unknown) {
		*predicted_us = by_length_len;
		return by_length;
	}
	/* not far behind: it ends within one more of the task's own length there */
	if (on_hint >= 0 && on_hint_end <= best_end + on_hint_len) {
		best = on_hint;
		best_len = on_hint_len;
	}
	if (hinted && best >= 0) {
		unsigned node = starpu_worker_get_memory_node((unsigned)best);
		if (starpu_node_get_kind(node) == STARPU_CUDA_RAM)
			remember_gpu(q, key, node);
	}
	*predicted_us = best_len;
	return best;
}

int _dos_queues_choose(struct dos_worker_queues *q, struct starpu_task *task, unsigned sched_ctx, int only_type,
		       double *predicted_us)
{
	return choose(q, task, sched_ctx, only_type, -1, predicted_us);
}

int _dos_queues_choose_on_node(struct dos_worker_queues *q, struct starpu_task *task, unsigned sched_ctx, unsigned node,
			       double *predicted_us)
{
	return choose(q, task, sched_ctx, -1, (int)node, predicted_us);
}

/* ---- pushing --------------------------------------------------------------------------- */

/* Blocking drivers sleep when they find no task: an unclaimed task queued for a busy
 * worker must wake the others, which may take it. Polling drivers find it themselves. */
static void wake_others(unsigned sched_ctx, int pushed_to)
{
#ifndef STARPU_NON_BLOCKING_DRIVERS
	struct starpu_worker_collection *workers = starpu_sched_ctx_get_worker_collection(sched_ctx);
	struct starpu_sched_ctx_iterator it;
	workers->init_iterator(workers, &it);
	while (workers->has_next(workers, &it)) {
		int w = (int)workers->get_next(workers, &it);
		if (w != pushed_to && !starpu_worker_is_combined_worker(w))
			starpu_wake_worker_relax_light(w);
	}
#else
	(void)sched_ctx;
	(void)pushed_to;
#endif
}

/* A parallel task on combined worker `worker`: one alias per member, all queued under
 * the parallel lock so that every member sees the parallel tasks in the same order (as
 * StarPU does for a task forced on a combined worker). */
static void push_parallel(struct dos_worker_queues *q, struct starpu_task *task, int worker, double predicted_us)
{
	int n, *members;
	starpu_combined_worker_get_description(worker, &n, &members);
	starpu_parallel_task_barrier_init(task, worker);
	/* now: the task is gone once the last alias has run */
	starpu_push_task_end(task);
	starpu_worker_relax_on();
	STARPU_PTHREAD_MUTEX_LOCK(&q->parallel_lock);
	starpu_worker_relax_off();
	for (int i = 0; i < n; i++) {
		struct starpu_task *alias = starpu_task_dup(task);
		alias->destroy = 1;
		alias->predicted = predicted_us;
		starpu_worker_lock(members[i]);
		enqueue(q, members[i], alias);
		starpu_wake_worker_locked(members[i]);
		starpu_worker_unlock(members[i]);
	}
	STARPU_PTHREAD_MUTEX_UNLOCK(&q->parallel_lock);
}

void _dos_queues_push(struct dos_worker_queues *q, struct starpu_task *task, int worker, double predicted_us,
		      int prefetch)
{
	task->predicted = predicted_us;
	/* before the task is visible: once queued, a worker may run and free it (and the
	 * handles it was the last user of) at any moment */
	if (prefetch && starpu_get_prefetch_flag() && !task->prefetched) /* StarPU allows one */
		starpu_prefetch_task_input_for(task, (unsigned)worker);
	if (starpu_worker_is_combined_worker(worker)) {
		push_parallel(q, task, worker, predicted_us);
		return;
	}
	unsigned sched_ctx = task->sched_ctx;
	int wake = stealable(q, task);
	starpu_worker_lock(worker);
	enqueue(q, worker, task);
	starpu_push_task_end(task);
	starpu_wake_worker_locked(worker);
	starpu_worker_unlock(worker);
	if (wake)
		wake_others(sched_ctx, worker);
}

/* ---- taking ---------------------------------------------------------------------------- */

static void started(struct dos_worker_queues *q, int w, const struct starpu_task *task)
{
	q->of[w].running_end_us = starpu_timing_now() + (unclaimed(task) ? 0 : task->predicted);
}

const struct starpu_task *_dos_queues_front(const struct dos_worker_queues *q, int w)
{
	return starpu_task_list_empty(&q->of[w].tasks) ? NULL : starpu_task_list_front(&q->of[w].tasks);
}

struct starpu_task *_dos_queues_pop(struct dos_worker_queues *q, int w,
				    struct starpu_task *(*pick)(struct starpu_task_list *tasks, int w))
{
	struct dos_worker_queue *wq = &q->of[w];
	if (starpu_task_list_empty(&wq->tasks))
		return NULL;
	struct starpu_task *task = pick ? pick(&wq->tasks, w) : starpu_task_list_front(&wq->tasks);
	dequeue(q, w, task);
	started(q, w, task);
	return task;
}

/* Whether `thief` may take `task`: one it can run, and for which its own model has no
 * prediction either. A task sent to a kind of worker to calibrate its model stays there
 * when the thief's model is calibrated, or StarPU would never learn that kind's times. */
static int may_steal(const struct dos_worker_queues *q, struct starpu_task *task, int thief, unsigned sched_ctx)
{
	unsigned impl;
	return stealable(q, task) && starpu_worker_can_execute_task_first_impl((unsigned)thief, task, &impl) &&
	       !(starpu_task_worker_expected_length(task, (unsigned)thief, sched_ctx, impl) > 0);
}

struct starpu_task *_dos_queues_steal(struct dos_worker_queues *q, int thief, unsigned sched_ctx)
{
	struct starpu_worker_collection *workers = starpu_sched_ctx_get_worker_collection(sched_ctx);
	struct starpu_sched_ctx_iterator it;
	workers->init_iterator(workers, &it);
	while (workers->has_next(workers, &it)) {
		int victim = (int)workers->get_next(workers, &it);
		/* a hint read without the victim's lock; a busy victim is left alone (lws does so) */
		if (victim == thief || starpu_worker_is_combined_worker(victim) || q->of[victim].nunclaimed <= 0 ||
		    starpu_worker_trylock(victim) != 0)
			continue;
		struct starpu_task *task = NULL;
		for (struct starpu_task *t = starpu_task_list_begin(&q->of[victim].tasks);
		     t != starpu_task_list_end(&q->of[victim].tasks) && !task; t = starpu_task_list_next(t))
			if (may_steal(q, t, thief, sched_ctx))
				task = t;
		if (task)
			dequeue(q, victim, task);
		starpu_worker_unlock(victim);
		if (task) {
			started(q, thief, task);
			return task;
		}
	}
	return NULL;
}

void _dos_queues_task_ended(struct dos_worker_queues *q, int w)
{
	q->of[w].running_end_us = 0;
}

void _dos_queues_hand_over(struct dos_worker_queues *q, int w, unsigned sched_ctx)
{
	struct starpu_task_list moving, staying;
	starpu_task_list_init(&moving);
	starpu_task_list_init(&staying);
	/* the pushes below take other workers' locks: never while holding w's */
	starpu_worker_lock(w);
	while (!starpu_task_list_empty(&q->of[w].tasks)) {
		struct starpu_task *task = starpu_task_list_front(&q->of[w].tasks);
		dequeue(q, w, task);
		starpu_task_list_push_back(&moving, task);
	}
	q->of[w].running_end_us = 0;
	starpu_worker_unlock(w);
	while (!starpu_task_list_empty(&moving)) {
		struct starpu_task *task = starpu_task_list_pop_front(&moving);
		double predicted = NAN;
		int to = is_parallel(task) || q->planned(task) ? -1
							       : _dos_queues_choose(q, task, sched_ctx, -1, &predicted);
		if (to >= 0 && to != w)
			_dos_queues_push(q, task, to, predicted, 1);
		else
			starpu_task_list_push_back(&staying, task);
	}
	/* what stays goes back ahead of anything queued meanwhile, in its order */
	starpu_worker_lock(w);
	while (!starpu_task_list_empty(&staying)) {
		struct starpu_task *task = starpu_task_list_pop_back(&staying);
		starpu_task_list_push_front(&q->of[w].tasks, task);
		count(q, w, task, 1);
	}
	starpu_worker_unlock(w);
}
