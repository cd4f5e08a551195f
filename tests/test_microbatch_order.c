/* The model's tasks start in an order that bounds the activations alive at once, on one
 * CPU worker under the dos policy, over several steps of several micro-batches:
 *  - a micro-batch's forward starts after the previous micro-batch's backward has
 *    started. A forward reads only the weights, so nothing in the data orders it after
 *    the previous backward, and a worker would run every ready forward of a step first
 *    and hold the activations of all its micro-batches (graph/model.c orders them);
 *  - with activation checkpointing, a layer's recomputation starts after the backward of
 *    the layer above (the head's, for the last layer) has started: it reads only the
 *    layer's saved input, and all the recomputations would otherwise run at the start of
 *    backward, the recomputed activations of every layer alive at once.
 * In submission order a training micro-batch's tasks alternate between runs of forward
 * and of backward tasks: its forward, the head's backward, then per layer from the last
 * its recomputation (with checkpointing) and its backward. Each forward run after the
 * first must start after the backward run before it (in the micro-batch or, for a
 * forward, the previous micro-batch's first backward run) has. */
#include <errno.h>
#include <pthread.h>

#include "dos_policy.h"
#include "test_starpu.h"
#include "test_util.h"
#include "train.h"

#define ACCUMULATION 4
#define STEPS 3
#define LAYERS 3
#define MAX_TASKS 100000

/* The model's tasks in the order they started: the run of the task (counted in
 * submission order over the whole training). */
static uint32_t started[MAX_TASKS];
static size_t nstarted;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* the run being submitted, and the phase of the task submitted last */
static uint32_t submitting;
static int last_phase = -1;

static void record_start(void *arg)
{
	pthread_mutex_lock(&lock);
	if (nstarted < MAX_TASKS)
		started[nstarted++] = *(const uint32_t *)arg;
	pthread_mutex_unlock(&lock);
}

static void hook(void *arg, struct starpu_task *task, enum _dos_task_phase phase, uint32_t subgroup)
{
	(void)arg, (void)subgroup;
	if (phase != DOS_TASK_FORWARD && phase != DOS_TASK_BACKWARD)
		return;
	if (last_phase >= 0 && (int)phase != last_phase)
		submitting++;
	last_phase = (int)phase;
	uint32_t *run = test_malloc(sizeof *run);
	*run = submitting;
	CHECK(!task->prologue_callback_func, "a model task with a prologue of its own");
	task->prologue_callback_func = record_start;
	task->prologue_callback_arg = run;
	task->prologue_callback_arg_free = 1;
}

/* The position in the start order of the first task of run r. */
static size_t first_start(uint32_t r)
{
	for (size_t i = 0; i < nstarted; i++)
		if (started[i] == r)
			return i;
	return nstarted;
}

static void check_order(const char *corpus, int checkpoint_activations)
{
	submitting = 0, last_phase = -1, nstarted = 0;
	struct dos_train_config cfg = {
		.shape = {.vocab = 256, .hidden = 32, .heads = 2, .ffn = 64, .layers = LAYERS, .seq_len = 16},
		.micro_batch = 2,
		.accumulation = ACCUMULATION,
		.steps = STEPS,
		.seed = 7,
		.checkpoint_activations = checkpoint_activations,
		.data_path = corpus,
		.opt = {.subgroup_size = 4000,
			.weight_dtype = DOS_FP32,
			.grad_dtype = DOS_FP32,
			.hp = {DOS_ADAMW, 1e-3, 0.9, 0.999, 1e-8, 0.01}},
		.hook = hook,
	};
	CHECK(_dos_train_run(&cfg, NULL) == 0, "training failed: %s", dos_last_error());
	starpu_task_wait_for_all();

	/* forward; head backward; per layer, recomputation and backward */
	uint32_t per_microbatch = checkpoint_activations ? 2 + 2 * LAYERS : 2;
	uint32_t nruns = submitting + 1;
	CHECK(nruns == per_microbatch * ACCUMULATION * STEPS, "%u runs of forward or backward tasks, expected %u",
	      nruns, per_microbatch * ACCUMULATION * STEPS);
	CHECK(nstarted < MAX_TASKS, "more than %d model tasks", MAX_TASKS);
	for (uint32_t r = 2; r < nruns; r += 2) {
		uint32_t m = r / per_microbatch, k = r % per_microbatch;
		/* a forward waits for the previous micro-batch's first backward run; a
		 * recomputation for the backward run just before it */
		uint32_t after = k == 0 ? r - per_microbatch + 1 : r - 1;
		size_t first = first_start(r), before = first_start(after);
		CHECK(before < first,
		      "checkpointing %d: micro-batch %u's %s %u started (task %zu of %zu) before backward run %u "
		      "(task %zu)",
		      checkpoint_activations, m, k == 0 ? "forward" : "recomputation run", k, first, nstarted,
		      after % per_microbatch, before);
	}
	printf("checkpointing %d: %u micro-batches in %d steps, %zu model tasks on one worker: every forward and "
	       "recomputation started after the backward before it\n",
	       checkpoint_activations, ACCUMULATION * STEPS, STEPS, nstarted);
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
	test_starpu_init_policy(&conf, "dos");
	check_order(corpus, 0);
	check_order(corpus, 1);
	starpu_shutdown();
	return 0;
}
