/* A NaN that appears in the optimizer state is reported at the step where it appears, with
 * the subgroup and the arrays it reached, and training stops before any later checkpoint
 * is written. The NaN is planted by a task that the training graph's own task hook puts
 * just before one subgroup's update at a chosen step: into its Adam m (the state itself)
 * or into its gradient (with loss scaling and clipping off, nothing else looks at it). */
#include <dirent.h>
#include <errno.h>
#include <unistd.h>

#include "codelets.h"
#include "test_starpu.h"
#include "test_util.h"
#include "train.h"

struct plant {
	uint64_t step;     /* 1-based step whose update gets the NaN (0: none) */
	uint32_t subgroup; /* which subgroup's */
	int buffer;        /* which buffer of its update task: DOS_ADAM_BUF_M or DOS_ADAM_BUF_GRAD */
	int planted;
};

static void plant_nan_cpu(void *buffers[], void *cl_arg)
{
	(void)cl_arg;
	float *x = (float *)STARPU_VECTOR_GET_PTR(buffers[0]);
	x[STARPU_VECTOR_GET_NX(buffers[0]) / 2] = NAN;
}

static struct starpu_codelet plant_nan_cl = {
	.cpu_funcs = {plant_nan_cpu}, .nbuffers = 1, .modes = {STARPU_RW}, .name = "test_plant_nan"};

/* Called on every task of the training graph just before it is submitted. */
static void hook(void *arg, struct starpu_task *task, enum _dos_task_phase phase, uint32_t subgroup)
{
	struct plant *p = arg;
	uint64_t step;
	enum dos_dtype gt, wt;
	size_t params;
	if (!p->step || phase != DOS_TASK_UPDATE || subgroup != p->subgroup ||
	    _dos_adam_task_info(task, &step, &gt, &wt, &params) || step != p->step)
		return;
	CHECK(starpu_task_insert(&plant_nan_cl, STARPU_RW, STARPU_TASK_GET_HANDLE(task, p->buffer), 0) == 0,
	      "plant a NaN");
	p->planted = 1;
}

/* The highest step of a checkpoint file in `dir` (0: none), and removes them all. */
static uint64_t latest_checkpoint_and_clear(const char *dir)
{
	DIR *d = opendir(dir);
	CHECK(d, "opendir %s", dir);
	uint64_t latest = 0;
	for (struct dirent *e; (e = readdir(d));) {
		unsigned long long step;
		if (sscanf(e->d_name, "checkpoint-%llu.dos", &step) == 1 && step > latest)
			latest = step;
		if (e->d_name[0] != '.') {
			char path[4200];
			snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
			unlink(path);
		}
	}
	closedir(d);
	return latest;
}

/* Trains `steps` steps with `plant`, saving a checkpoint after every step into `dir` (or
 * none when `dir` is NULL), and checks the outcome against `expected`. */
static void run(const char *corpus, const char *dir, uint64_t steps, struct plant plant, const char *expected)
{
	struct dos_train_config cfg = {
		.shape = {.vocab = 256, .hidden = 32, .heads = 2, .ffn = 64, .layers = 2, .seq_len = 16},
		.micro_batch = 2,
		.accumulation = 1,
		.steps = steps,
		.seed = 7,
		.data_path = corpus,
		.opt = {.subgroup_size = 4000, /* 9 subgroups */
			.weight_dtype = DOS_FP32,
			.grad_dtype = DOS_FP32,
			.hp = {DOS_ADAMW, 1e-3, 0.9, 0.999, 1e-8, 0.01}},
		.checkpoint_dir = dir,
		.checkpoint_every = dir ? 1 : 0,
		.hook = hook,
		.hook_arg = &plant,
	};
	int err = _dos_train_run(&cfg, NULL);
	uint64_t latest = dir ? latest_checkpoint_and_clear(dir) : 0;
	if (!plant.step) {
		CHECK(err == 0, "a clean run failed: %s", dos_last_error());
		CHECK(!dir || latest == steps, "a clean run saved up to step %llu of %llu", (unsigned long long)latest,
		      (unsigned long long)steps);
		return;
	}
	CHECK(plant.planted, "no NaN was planted at step %llu", (unsigned long long)plant.step);
	CHECK(err == -ERANGE, "a NaN planted at step %llu: error %d (%s)", (unsigned long long)plant.step, err,
	      dos_last_error());
	CHECK(strstr(dos_last_error(), expected), "the message '%s' does not say '%s'", dos_last_error(), expected);
	CHECK(!strstr(dos_last_error(), "more subgroups"), "one subgroup had a NaN: %s", dos_last_error());
	CHECK(!dir || latest == plant.step - 1, "a NaN at step %llu: the latest checkpoint is of step %llu",
	      (unsigned long long)plant.step, (unsigned long long)latest);
	printf("NaN in buffer %d of subgroup %u at step %llu of %llu: '%s'; latest checkpoint: step %llu\n",
	       plant.buffer, plant.subgroup, (unsigned long long)plant.step, (unsigned long long)steps,
	       dos_last_error(), (unsigned long long)latest);
}

int main(void)
{
	const char *src = getenv("DOS_SOURCE_DIR");
	char corpus[4096], dir[] = "/tmp/dos-train-nonfinite-XXXXXX";
	snprintf(corpus, sizeof corpus, "%s/data/corpus.txt", src ? src : "..");
	CHECK(mkdtemp(dir), "mkdtemp");
	test_starpu_init(NULL);

	run(corpus, dir, 5, (struct plant){0}, NULL);
	/* m of subgroup 3 at step 4: m, and through the step the master weights */
	run(corpus, dir, 6, (struct plant){.step = 4, .subgroup = 3, .buffer = DOS_ADAM_BUF_M},
	    "after step 4 the optimizer state is not finite: master weight, Adam m of subgroup 3 (parameters 12000 to "
	    "15999); not saved");
	/* the gradient of subgroup 8 (the short last one) at step 2: all three arrays */
	run(corpus, dir, 6, (struct plant){.step = 2, .subgroup = 8, .buffer = DOS_ADAM_BUF_GRAD},
	    "after step 2 the optimizer state is not finite: master weight, Adam m, Adam v of subgroup 8 "
	    "(parameters 32000 to 33439)");
	/* without checkpoints too: at its step, not at the end of the run */
	run(corpus, NULL, 8, (struct plant){.step = 2, .subgroup = 5, .buffer = DOS_ADAM_BUF_M},
	    "after step 2 the optimizer state is not finite: master weight, Adam m of subgroup 5");
	/* at the last step, whose checkpoint is the final one */
	run(corpus, dir, 3, (struct plant){.step = 3, .subgroup = 0, .buffer = DOS_ADAM_BUF_M},
	    "after step 3 the optimizer state is not finite: master weight, Adam m of subgroup 0 (parameters 0 to "
	    "3999)");
	starpu_shutdown();
	test_remove_folder(dir);
	return 0;
}
