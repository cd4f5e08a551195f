/* The policies' per-worker queues (worker_queues.c): on which worker a task runs, and in
 * which order each worker runs what it was given. The optimizer's updates are placed by
 * the plan (dos_policy.c); every other task by the rules here, which any StarPU program
 * meets under STARPU_SCHED=dos. */
#ifndef DOS_WORKER_QUEUES_H
#define DOS_WORKER_QUEUES_H

#include <starpu.h>

#include <stdint.h>

#define DOS_QUEUES_GPU_HINTS 16384

struct dos_worker_queue {
	struct starpu_task_list tasks; /* in the order the worker runs them */
	int ntasks;
	int nunclaimed;        /* of which idle workers may take (no predicted length): a hint */
	double queued_us;      /* predicted length of the queued tasks that have one */
	double running_end_us; /* predicted end of the task it runs (StarPU's clock); 0: none */
};

struct dos_worker_queues {
	struct dos_worker_queue of[STARPU_NMAXWORKERS]; /* by basic worker id */
	/* Whether a task was placed by a plan: such tasks keep their order among themselves in
	 * a queue and stay with the worker they were given. */
	int (*planned)(const struct starpu_task *task);
	/* Held while a parallel task's aliases are queued on its workers, so that all of them
	 * meet the parallel tasks' barriers in the same order. */
	starpu_pthread_mutex_t parallel_lock;
	/* The GPU each repeated task (same codelet, same data) was last placed on: a lossy
	 * table of hints, see worker_queues.c's `gpu_hint`. */
	uint64_t last_gpu[DOS_QUEUES_GPU_HINTS];
	unsigned generation; /* of the hints: _dos_queues_next_generation */
};

void _dos_queues_init(struct dos_worker_queues *q, int (*planned)(const struct starpu_task *task));
void _dos_queues_destroy(struct dos_worker_queues *q);

/* The worker of `sched_ctx` (only of type `only_type` when it is >= 0) that should run
 * `task`, or -1 when none can; its predicted length there in *predicted_us (NAN or 0 when
 * no model gives one). A parallel task may get a combined worker. A task submitted again
 * (same codelet and handles) goes back to the GPU it was given last time unless that GPU
 * ends it more than its own length after the best. */
int _dos_queues_choose(struct dos_worker_queues *q, struct starpu_task *task, unsigned sched_ctx, int only_type,
		       double *predicted_us);

/* The same among the basic workers whose memory node is `node` (the workers of one GPU). */
int _dos_queues_choose_on_node(struct dos_worker_queues *q, struct starpu_task *task, unsigned sched_ctx, unsigned node,
			       double *predicted_us);

/* A new generation of the GPU hints (at each step the dos policy plans): hints not
 * renewed for two generations make room for others. */
void _dos_queues_next_generation(struct dos_worker_queues *q);

/* Queues `task` for `worker` (basic, or combined: then an alias for each of its workers),
 * prefetching its inputs there when `prefetch`, and wakes the worker(s). The task must
 * not be touched afterwards: a worker may already run it. */
void _dos_queues_push(struct dos_worker_queues *q, struct starpu_task *task, int worker, double predicted_us,
		      int prefetch);

/* The task at the front of worker w's queue (the next by priority), or NULL; it stays
 * queued. Called by w in its pop_task; the pointer holds only until w relaxes
 * (starpu_worker_relax_on), when a thief may take the task, run it, and StarPU free it. */
const struct starpu_task *_dos_queues_front(const struct dos_worker_queues *q, int w);

/* The next task of worker w's queue, or NULL; `pick` chooses it among the queued tasks
 * (the front when NULL). Called by w in its pop_task. */
struct starpu_task *_dos_queues_pop(struct dos_worker_queues *q, int w,
				    struct starpu_task *(*pick)(struct starpu_task_list *tasks, int w));

/* For an idle worker of `sched_ctx`: a task that no model claimed, taken from another
 * worker's queue, or NULL. Called by `thief` in its pop_task. */
struct starpu_task *_dos_queues_steal(struct dos_worker_queues *q, int thief, unsigned sched_ctx);

/* Worker w has finished the task it ran (its post-execution hook). */
void _dos_queues_task_ended(struct dos_worker_queues *q, int w);

/* Worker w is no longer in `sched_ctx`: the tasks queued for it are placed again on the
 * workers that remain. It keeps those none of them can run, planned tasks and parallel
 * tasks' aliases. */
void _dos_queues_hand_over(struct dos_worker_queues *q, int w, unsigned sched_ctx);

#endif /* DOS_WORKER_QUEUES_H */
