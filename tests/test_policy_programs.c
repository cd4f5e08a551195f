/* The dos policy as the scheduler of an ordinary StarPU program (what
 * STARPU_SCHED_LIB=libstarpu-dos.so STARPU_SCHED=dos gives any program), on two CPU
 * workers:
 *  - tasks without a model, or with one still calibrating, are spread over the workers,
 *    and the model is calibrated afterwards;
 *  - an idle worker takes such tasks from a busy worker's queue, unless its own model
 *    predicts them (they were sent where the model still lacks samples);
 *  - tasks run in priority order;
 *  - a worker removed from a context with tasks queued for it leaves them to the others;
 *  - parallel tasks run on a combined worker, beside sequential ones. */
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include <starpu.h>

#include "dos.h"
#include "test_starpu.h"
#include "test_util.h"

#define NTASKS 200

static double now_seconds(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void start(int ncpus, int single_combined_worker)
{
	struct starpu_conf conf;
	starpu_conf_init(&conf);
	conf.ncpus = ncpus;
	conf.ncuda = 0;
	conf.calibrate = 2; /* models start empty (the tests share one STARPU_HOME) */
	/* A 1 ms sleep on a loaded machine lasts several times longer now and then; past
	 * StarPU's default 50 % deviation StarPU flushes the history and predicts nothing,
	 * which says nothing about the policy under test */
	setenv("STARPU_HISTORY_MAX_ERROR", "100000", 0);
	conf.single_combined_worker = single_combined_worker;
	test_starpu_init_policy(&conf, "dos");
	if ((int)starpu_cpu_worker_get_count() < ncpus) {
		starpu_shutdown();
		exit(TEST_SKIP);
	}
}

/* ---- tasks that record who ran them ---- */

static atomic_int ran_on[STARPU_NMAXWORKERS], ran_total;

static void sleep_1ms(void *buffers[], void *arg)
{
	(void)buffers;
	(void)arg;
	usleep(1000);
	atomic_fetch_add(&ran_on[starpu_worker_get_id()], 1);
	atomic_fetch_add(&ran_total, 1);
}

static struct starpu_perfmodel calibrating = {.type = STARPU_HISTORY_BASED, .symbol = "dos_test_programs_sleep"};
static struct starpu_codelet unmodelled_cl = {.cpu_funcs = {sleep_1ms}, .nbuffers = 0, .name = "unmodelled"};
static struct starpu_codelet calibrating_cl = {
	.cpu_funcs = {sleep_1ms}, .nbuffers = 0, .model = &calibrating, .name = "calibrating"};

static double cost_1ms(struct starpu_task *task, struct starpu_perfmodel_arch *arch, unsigned nimpl)
{
	(void)task;
	(void)arch;
	(void)nimpl;
	return 1000;
}
static struct starpu_perfmodel predicted = {
	.type = STARPU_PER_ARCH, .arch_cost_function = cost_1ms, .symbol = "dos_test_programs_predicted"};

static void reset_counts(void)
{
	for (int w = 0; w < STARPU_NMAXWORKERS; w++)
		atomic_store(&ran_on[w], 0);
	atomic_store(&ran_total, 0);
}

static void submit(struct starpu_codelet *cl, int n, unsigned sched_ctx)
{
	for (int i = 0; i < n; i++) {
		struct starpu_task *t = starpu_task_create();
		t->cl = cl;
		CHECK(starpu_task_submit_to_ctx(t, sched_ctx) == 0, "submit");
	}
}

/* Independent tasks that no model predicts go to both workers: on the first one only,
 * they would take twice as long. (About half each; a tenth each at least, as a loaded
 * machine may stall one worker while the other takes its tasks.) */
static void spread(struct starpu_codelet *cl, const char *what)
{
	start(2, 0);
	reset_counts();
	submit(cl, NTASKS, 0);
	starpu_task_wait_for_all();
	CHECK(ran_on[0] + ran_on[1] == NTASKS, "%s: %d of %d tasks ran", what, ran_on[0] + ran_on[1], NTASKS);
	CHECK(ran_on[0] >= NTASKS / 10 && ran_on[1] >= NTASKS / 10, "%s: split %d / %d", what, ran_on[0], ran_on[1]);
	printf("%s: %d tasks split %d / %d\n", what, NTASKS, ran_on[0], ran_on[1]);
	if (cl->model) { /* StarPU learnt the task's length from the runs */
		struct starpu_task *t = starpu_task_create();
		t->cl = cl;
		double len = starpu_task_expected_length(t, starpu_worker_get_perf_archtype(0, 0), 0);
		CHECK(len > 0 && isfinite(len), "%s: still no prediction after %d runs (%g)", what, NTASKS, len);
		t->destroy = 0;
		starpu_task_destroy(t);
		printf("%s: calibrated, %.0f us predicted\n", what, len);
	}
	starpu_shutdown();
}

/* ---- holding a worker: a task that runs until released, which the policy places on
 * that worker (task->workerids); not pushed there directly (execute_on_a_specific_worker):
 * StarPU's own queue for such tasks leaks a node at shutdown, which LeakSanitizer sees ---- */

static atomic_int holding, hold_timed_out;

struct hold_spec {
	int (*released)(void);
};

static void hold(void *buffers[], void *arg)
{
	(void)buffers;
	const struct hold_spec *spec = arg;
	atomic_store(&holding, 1);
	double deadline = now_seconds() + 20;
	while (!spec->released())
		if (now_seconds() > deadline) {
			atomic_store(&hold_timed_out, 1);
			return;
		} else
			usleep(200);
}
static struct starpu_codelet hold_cl = {.cpu_funcs = {hold}, .nbuffers = 0, .name = "hold"};

/* Submits a hold task for `worker` and returns once it runs. */
static void hold_worker(int worker, const struct hold_spec *spec)
{
	static uint32_t mask; /* read by StarPU until the task ends */
	mask = 1u << worker;
	atomic_store(&holding, 0);
	atomic_store(&hold_timed_out, 0);
	struct starpu_task *t = starpu_task_create();
	t->cl = &hold_cl;
	t->cl_arg = (void *)spec;
	t->workerids = &mask;
	t->workerids_len = 1;
	CHECK(starpu_task_submit(t) == 0, "submit the holding task");
	while (!atomic_load(&holding))
		usleep(100);
}

/* ---- stealing: worker 1 is held until worker 0 has done most of the work, which it can
 * only do by taking tasks queued for worker 1 ---- */

static int most_done(void)
{
	return atomic_load(&ran_total) >= NTASKS - 10;
}

static void steal(void)
{
	start(2, 0);
	reset_counts();
	static const struct hold_spec until_most_done = {most_done};
	hold_worker(1, &until_most_done);
	submit(&unmodelled_cl, NTASKS, 0);
	starpu_task_wait_for_all();
	CHECK(!hold_timed_out, "worker 0 did %d tasks and worker 1 %d: nobody took worker 1's queue", ran_on[0],
	      ran_on[1]);
	CHECK(ran_on[0] + ran_on[1] == NTASKS, "%d of %d ran", ran_on[0] + ran_on[1], NTASKS);
	printf("steal: worker 0 ran %d tasks while worker 1 was held\n", ran_on[0]);
	starpu_shutdown();
}

/* ---- calibration first: tasks sent to the worker whose model still lacks samples stay
 * there; an idle worker whose own model predicts them leaves them alone ---- */

static double known_on_worker_1(struct starpu_task *task, unsigned workerid, unsigned nimpl)
{
	(void)task;
	(void)nimpl;
	return workerid == 1 ? 1000 : NAN;
}
static struct starpu_perfmodel half_calibrated = {
	.type = STARPU_PER_WORKER, .worker_cost_function = known_on_worker_1, .symbol = "dos_test_programs_half"};
static struct starpu_codelet half_calibrated_cl = {
	.cpu_funcs = {sleep_1ms}, .nbuffers = 0, .model = &half_calibrated, .name = "half_calibrated"};

static void calibration_first(void)
{
	start(2, 0);
	reset_counts();
	submit(&half_calibrated_cl, 40, 0);
	starpu_task_wait_for_all();
	CHECK(ran_on[0] == 40,
	      "worker 1, whose model predicts these tasks, ran %d of the 40 sent to calibrate worker 0", ran_on[1]);
	printf("calibration first: the 40 tasks ran on the worker whose model lacked samples\n");
	starpu_shutdown();
}

/* ---- priorities: one worker, held while tasks of mixed priorities are queued ---- */

#define NPRIO 60
static atomic_int submitted, order_n;
static int order_prio[NPRIO], order_index[NPRIO];

static int all_submitted(void)
{
	return atomic_load(&submitted);
}

/* the priority given to task i (StarPU clamps priorities to the context's range: the
 * policy must open it) */
static int priority_of(int i)
{
	return (i * 7) % 11 - 5;
}

static void record(void *buffers[], void *arg)
{
	(void)buffers;
	int index = (int)(intptr_t)arg, k = atomic_fetch_add(&order_n, 1);
	order_index[k] = index;
	order_prio[k] = priority_of(index);
}
static struct starpu_codelet record_cl = {.cpu_funcs = {record}, .nbuffers = 0, .name = "record"};

static void priorities(void)
{
	start(1, 0);
	static const struct hold_spec until_submitted = {all_submitted};
	hold_worker(0, &until_submitted);
	for (int i = 0; i < NPRIO; i++) {
		struct starpu_task *t = starpu_task_create();
		t->cl = &record_cl;
		t->cl_arg = (void *)(intptr_t)i;
		t->priority = priority_of(i);
		CHECK(starpu_task_submit(t) == 0, "submit");
	}
	atomic_store(&submitted, 1);
	starpu_task_wait_for_all();
	CHECK(order_n == NPRIO, "%d of %d ran", order_n, NPRIO);
	for (int k = 1; k < NPRIO; k++)
		CHECK(order_prio[k] < order_prio[k - 1] ||
			      (order_prio[k] == order_prio[k - 1] && order_index[k] > order_index[k - 1]),
		      "position %d: task %d (priority %d) ran after task %d (priority %d)", k, order_index[k],
		      order_prio[k], order_index[k - 1], order_prio[k - 1]);
	printf("priorities: %d tasks ran by priority, in submission order among equals\n", NPRIO);
	starpu_shutdown();
}

/* ---- removal: a context of two workers loses one with half the tasks queued for it ---- */

static atomic_int removed, ran_after_removal;

static void sleep_1ms_watch(void *buffers[], void *arg)
{
	(void)buffers;
	(void)arg;
	if (atomic_load(&removed) && starpu_worker_get_id() == 1)
		atomic_fetch_add(&ran_after_removal, 1);
	sleep_1ms(NULL, NULL);
}
static struct starpu_codelet watched_cl = {
	.cpu_funcs = {sleep_1ms_watch}, .nbuffers = 0, .model = &predicted, .name = "watched"};

static void remove_worker(void)
{
	start(2, 0);
	reset_counts();
	int both[2] = {0, 1}, leaving = 1;
	unsigned ctx =
		starpu_sched_ctx_create(both, 2, "two", STARPU_SCHED_CTX_POLICY_STRUCT, dos_sched_policy("dos"), 0);
	/* with a prediction, so that worker 0 takes none of them by itself */
	submit(&watched_cl, NTASKS, ctx);
	starpu_sched_ctx_remove_workers(&leaving, 1, ctx);
	atomic_store(&removed, 1);
	starpu_task_wait_for_all();
	CHECK(ran_total == NTASKS, "%d of %d ran", ran_total, NTASKS);
	/* the one it was running, and perhaps the one it had just popped */
	CHECK(ran_after_removal <= 2, "the removed worker ran %d tasks after it left the context (%d before)",
	      ran_after_removal, ran_on[1] - ran_after_removal);
	printf("removal: worker 1 ran %d tasks before it left, %d after; worker 0 ran %d\n",
	       ran_on[1] - ran_after_removal, ran_after_removal, ran_on[0]);
	starpu_sched_ctx_delete(ctx);
	starpu_shutdown();
}

/* ---- parallel tasks: an SPMD task runs on both workers of the combined worker ---- */

#define NPARALLEL 20
static int ranks_seen[NPARALLEL][2];
static atomic_int combined_runs;

static void spmd(void *buffers[], void *arg)
{
	(void)buffers;
	int index = (int)(intptr_t)arg, rank = starpu_combined_worker_get_rank();
	if (starpu_combined_worker_get_size() == 2) {
		ranks_seen[index][rank] = 1;
		if (rank == 0)
			atomic_fetch_add(&combined_runs, 1);
	} else {
		ranks_seen[index][0] = ranks_seen[index][1] = 1;
	}
	usleep(500);
}
static struct starpu_codelet spmd_cl = {
	.type = STARPU_SPMD, .max_parallelism = 2, .cpu_funcs = {spmd}, .nbuffers = 0, .name = "spmd"};

static void parallel(void)
{
	start(2, 1); /* STARPU_SINGLE_COMBINED_WORKER: the policy asks for one of both CPUs */
	CHECK(starpu_combined_worker_get_count() > 0, "no combined worker");
	reset_counts();
	for (int i = 0; i < NPARALLEL; i++) {
		struct starpu_task *t = starpu_task_create();
		t->cl = &spmd_cl;
		t->cl_arg = (void *)(intptr_t)i;
		t->priority = i % 3;
		CHECK(starpu_task_submit(t) == 0, "submit");
		/* sequential tasks of higher priority between them: none may overtake a parallel
		 * task on one of its workers only, or the workers would wait for each other */
		for (int k = 0; k < 3; k++) {
			struct starpu_task *s = starpu_task_create();
			s->cl = &unmodelled_cl;
			s->priority = 5;
			CHECK(starpu_task_submit(s) == 0, "submit");
		}
	}
	starpu_task_wait_for_all();
	for (int i = 0; i < NPARALLEL; i++)
		CHECK(ranks_seen[i][0] && ranks_seen[i][1], "parallel task %d not run by both ranks", i);
	CHECK(combined_runs > 0, "no parallel task ran on the combined worker");
	CHECK(ran_total == 3 * NPARALLEL, "%d of %d sequential tasks ran", ran_total, 3 * NPARALLEL);
	printf("parallel: %d of %d parallel tasks ran on the combined worker of 2\n", combined_runs, NPARALLEL);
	starpu_shutdown();
}

int main(void)
{
	spread(&unmodelled_cl, "no model");
	spread(&calibrating_cl, "calibrating model");
	steal();
	calibration_first();
	priorities();
	remove_worker();
	parallel();
	return 0;
}
