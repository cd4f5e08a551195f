/* A step's micro-batches run in their order on a worker. Nothing in the graph orders
 * micro-batch m+1's forward after micro-batch m's backward (a forward reads only the
 * weights), so train.c ranks them by priority; unranked, a worker runs every ready forward
 * first, and a GPU then holds the activations of all the micro-batches of the step. So a
 * micro-batch's forward starts after the previous one's backward has started (model.c).
 * Checked with one CPU worker under the dos policy, in every step. */
#include <errno.h>
#include <pthread.h>

#include "dos_policy.h"
#include "test_util.h"
#include "train.h"

#define ACCUMULATION 4
#define STEPS 3
#define MAX_TASKS 100000

/* The model's tasks in the order they started: micro-batch (counted over the run) and
 * whether forward. */
static struct started {
	uint32_t microbatch;
	int forward;
} started[MAX_TASKS];
static size_t nstarted;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* The micro-batch being submitted: a forward task after a backward one begins the next. */
static uint32_t submitting;
static int last_was_backward;

static void record_start(void *arg)
{
	pthread_mutex_lock(&lock);
	if (nstarted < MAX_TASKS)
		started[nstarted++] = *(const struct started *)arg;
	pthread_mutex_unlock(&lock);
}

static void hook(void *arg, struct starpu_task *task, enum _dos_task_phase phase, uint32_t subgroup)
{
	(void)arg, (void)subgroup;
	if (phase != DOS_TASK_FORWARD && phase != DOS_TASK_BACKWARD)
		return;
	if (phase == DOS_TASK_FORWARD && last_was_backward)
		submitting++;
	last_was_backward = phase == DOS_TASK_BACKWARD;
	struct started *s = test_malloc(sizeof *s);
	*s = (struct started){submitting, phase == DOS_TASK_FORWARD};
	CHECK(!task->prologue_callback_func, "a model task with a prologue of its own");
	task->prologue_callback_func = record_start;
	task->prologue_callback_arg = s;
	task->prologue_callback_arg_free = 1;
}

int main(void)
{
	const char *src = getenv("DOS_SOURCE_DIR");
	char corpus[4096];
	snprintf(corpus, sizeof corpus, "%s/data/corpus.txt", src ? src : "..");
	setenv("STARPU_NCPU", "1", 1);
	setenv("STARPU_NCUDA", "0", 1);
	struct starpu_conf conf;
	starpu_conf_init(&conf);
	conf.sched_policy = dos_sched_policy("dos");
	conf.sched_policy_name = NULL;
	int ret = starpu_init(&conf);
	if (ret == -ENODEV)
		return TEST_SKIP;
	CHECK(ret == 0, "starpu_init: %d", ret);

	struct dos_train_config cfg = {
		.shape = {.vocab = 256, .hidden = 32, .heads = 2, .ffn = 64, .layers = 3, .seq_len = 16},
		.micro_batch = 2,
		.accumulation = ACCUMULATION,
		.steps = STEPS,
		.seed = 7,
		.data_path = corpus,
		.opt = {.subgroup_size = 4000,
			.weight_dtype = DOS_FP32,
			.grad_dtype = DOS_FP32,
			.hp = {DOS_ADAMW, 1e-3, 0.9, 0.999, 1e-8, 0.01}},
		.hook = hook,
	};
	CHECK(_dos_train_run(&cfg, NULL) == 0, "training failed: %s", dos_last_error());
	starpu_task_wait_for_all();
	starpu_shutdown();

	uint32_t microbatches = submitting + 1;
	CHECK(microbatches == ACCUMULATION * STEPS, "%u micro-batches submitted, expected %u", microbatches,
	      ACCUMULATION * STEPS);
	CHECK(nstarted < MAX_TASKS, "more than %d model tasks", MAX_TASKS);
	for (uint32_t m = 0; m + 1 < microbatches; m++) {
		if ((m + 1) % ACCUMULATION == 0) /* the next step's forward waits for the updates anyway */
			continue;
		size_t first_backward = nstarted, first_next_forward = nstarted;
		for (size_t i = nstarted; i-- > 0;) {
			if (started[i].microbatch == m && !started[i].forward)
				first_backward = i;
			if (started[i].microbatch == m + 1 && started[i].forward)
				first_next_forward = i;
		}
		CHECK(first_backward < first_next_forward,
		      "micro-batch %u's forward started (task %zu of %zu) before micro-batch %u's backward (task %zu)",
		      m + 1, first_next_forward, nstarted, m, first_backward);
	}
	printf("micro-batch order: %u micro-batches in %d steps, %zu model tasks on one worker: each micro-batch's "
	       "backward started before the next one's forward\n",
	       microbatches, STEPS, nstarted);
	return 0;
}
