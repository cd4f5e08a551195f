/* The policies' per-worker queues keep the order they promise: priority first, first
 * come first served among equals, planned updates in their plan's order, nothing ahead
 * of a parallel task's alias; their counters follow what is queued; and a task that no
 * model predicts is placed by queue length. Queues of worker_queues.c are filled and
 * emptied by hand here (no task runs), against a StarPU with two CPU workers. */
#include <math.h>

#include <starpu.h>

#include "test_starpu.h"
#include "test_util.h"
#include "worker_queues.h"

static void nothing(void *buffers[], void *arg)
{
	(void)buffers;
	(void)arg;
}
static struct starpu_codelet app_cl = {.cpu_funcs = {nothing}, .nbuffers = 0, .name = "app"};
static struct starpu_codelet planned_cl = {.cpu_funcs = {nothing}, .nbuffers = 0, .name = "planned"};
static struct starpu_codelet parallel_cl = {
	.type = STARPU_SPMD, .max_parallelism = 2, .cpu_funcs = {nothing}, .nbuffers = 0, .name = "parallel"};

static double cost_100us(struct starpu_task *task, unsigned nimpl)
{
	(void)task;
	(void)nimpl;
	return 100;
}
static struct starpu_perfmodel modelled = {.type = STARPU_COMMON, .cost_function = cost_100us, .symbol = "dos_test_q"};
static struct starpu_codelet modelled_cl = {.cpu_funcs = {nothing}, .nbuffers = 0, .model = &modelled};

static int is_planned(const struct starpu_task *task)
{
	return task->cl == &planned_cl;
}

static struct starpu_task *make(struct starpu_codelet *cl, int priority, int id)
{
	struct starpu_task *t = starpu_task_create();
	t->cl = cl;
	t->priority = priority;
	t->sched_ctx = 0;
	t->destroy = 0;
	t->tag_id = (starpu_tag_t)id; /* only a label here: the tasks are never submitted */
	return t;
}

/* Pushes tasks[0..n) to worker w, pops them all, and compares the ids with `expected`. */
static void check_order(struct dos_worker_queues *q, int w, struct starpu_task **tasks, int n, const int *expected,
			const char *what)
{
	for (int i = 0; i < n; i++)
		_dos_queues_push(q, tasks[i], w, 10.0, 0);
	CHECK(q->of[w].ntasks == n, "%s: %d queued, expected %d", what, q->of[w].ntasks, n);
	CHECK(fabs(q->of[w].queued_us - 10.0 * n) < 1e-9, "%s: %g us queued", what, q->of[w].queued_us);
	for (int i = 0; i < n; i++) {
		struct starpu_task *t = _dos_queues_pop(q, w, NULL);
		CHECK(t && (int)t->tag_id == expected[i], "%s: position %d holds task %d, expected %d", what, i,
		      t ? (int)t->tag_id : -1, expected[i]);
		_dos_queues_task_ended(q, w);
		starpu_task_destroy(t);
	}
	CHECK(_dos_queues_pop(q, w, NULL) == NULL && q->of[w].ntasks == 0 && q->of[w].queued_us == 0,
	      "%s: queue empty after popping everything", what);
}

static struct dos_worker_queues queues;

int main(void)
{
	struct starpu_conf conf;
	starpu_conf_init(&conf);
	conf.ncpus = 2;
	conf.ncuda = 0;
	conf.sched_policy_name = "eager"; /* not ours: the queues below are driven by hand */
	test_starpu_init(&conf);
	if (starpu_cpu_worker_get_count() < 2) {
		starpu_shutdown();
		return TEST_SKIP;
	}
	_dos_queues_init(&queues, is_planned);
	struct dos_worker_queues *q = &queues;

	/* priority first, first come first served among equals */
	{
		struct starpu_task *t[6] = {make(&app_cl, 0, 0), make(&app_cl, 5, 1), make(&app_cl, -1, 2),
					    make(&app_cl, 5, 3), make(&app_cl, 3, 4), make(&app_cl, 0, 5)};
		static const int expected[6] = {1, 3, 4, 0, 5, 2};
		check_order(q, 0, t, 6, expected, "priorities");
	}
	/* a planned update passes application tasks of lower priority, never another update */
	{
		struct starpu_task *t[4] = {make(&planned_cl, 0, 0), make(&app_cl, 0, 1), make(&planned_cl, 9, 2),
					    make(&app_cl, 9, 3)};
		static const int expected[4] = {0, 2, 3, 1};
		check_order(q, 0, t, 4, expected, "planned updates");
	}
	/* nothing passes a parallel task: its workers must all reach its barrier */
	{
		struct starpu_task *t[3] = {make(&app_cl, 0, 0), make(&parallel_cl, 0, 1), make(&app_cl, 9, 2)};
		static const int expected[3] = {0, 1, 2};
		check_order(q, 0, t, 3, expected, "parallel tasks");
	}

	/* counters: tasks without a prediction are the ones idle workers may take, unless
	 * planned or parallel; a popped task is running until it ends */
	{
		struct starpu_task *a = make(&app_cl, 0, 0), *b = make(&app_cl, 0, 1), *c = make(&planned_cl, 0, 2),
				   *d = make(&parallel_cl, 0, 3);
		_dos_queues_push(q, a, 1, NAN, 0);
		_dos_queues_push(q, b, 1, 0.0, 0);
		_dos_queues_push(q, c, 1, NAN, 0);
		_dos_queues_push(q, d, 1, NAN, 0);
		CHECK(q->of[1].ntasks == 4 && q->of[1].nunclaimed == 2 && q->of[1].queued_us == 0,
		      "4 queued (%d), 2 of them unclaimed (%d), no predicted work (%g)", q->of[1].ntasks,
		      q->of[1].nunclaimed, q->of[1].queued_us);
		for (int i = 0; i < 4; i++) {
			struct starpu_task *t = _dos_queues_pop(q, 1, NULL);
			CHECK(q->of[1].running_end_us > 0, "a popped task runs");
			_dos_queues_task_ended(q, 1);
			CHECK(q->of[1].running_end_us == 0, "an ended task does not");
			starpu_task_destroy(t);
		}
		CHECK(q->of[1].ntasks == 0 && q->of[1].nunclaimed == 0, "counters back to 0: %d, %d", q->of[1].ntasks,
		      q->of[1].nunclaimed);
	}

	/* placement: without a model by queue length; with one by earliest predicted finish */
	{
		struct starpu_task *queued[5];
		for (int i = 0; i < 5; i++)
			queued[i] = make(&app_cl, 0, i);
		for (int i = 0; i < 3; i++)
			_dos_queues_push(q, queued[i], 0, 10.0, 0); /* worker 0: 3 tasks, 30 us */
		_dos_queues_push(q, queued[3], 1, 25.0, 0);         /* worker 1: 2 tasks, 50 us */
		_dos_queues_push(q, queued[4], 1, 25.0, 0);
		double predicted;
		struct starpu_task *unmodelled = make(&app_cl, 0, 9), *task = make(&modelled_cl, 0, 10);
		int chosen = _dos_queues_choose(q, unmodelled, 0, -1, &predicted);
		CHECK(chosen == 1 && !(predicted > 0), "no model: the shorter queue (worker 1), got %d (%g us)", chosen,
		      predicted);
		chosen = _dos_queues_choose(q, task, 0, -1, &predicted);
		double length = starpu_task_expected_length(task, starpu_worker_get_perf_archtype(0, 0), 0);
		CHECK(chosen == 0 && predicted == length && length > 0,
		      "a model: the earlier finish (worker 0), got %d (%g us, the model says %g)", chosen, predicted,
		      length);
		CHECK(_dos_queues_choose(q, task, 0, STARPU_CUDA_WORKER, &predicted) == -1, "no CUDA worker here");
		for (int i = 0; i < 5; i++)
			starpu_task_destroy(_dos_queues_pop(q, i < 3 ? 0 : 1, NULL));
		starpu_task_destroy(unmodelled);
		starpu_task_destroy(task);
	}
	_dos_queues_destroy(q);
	starpu_shutdown();
	printf("queues: priority order, plan order, parallel barriers, counters and placement as expected\n");
	return 0;
}
