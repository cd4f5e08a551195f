/* The task graph's reusable entry points (graph/: the corpus, the model, the optimizer
 * and its non-finite flags, the training loop) refuse bad input with the right error code and a message naming the
 * argument and its value, and change nothing: their output structures keep their bytes,
 * no task is submitted (the workers are paused, so a submitted task would still be
 * counted), and the training loop writes no checkpoint. */
#include <dirent.h>
#include <sys/stat.h>
#include <errno.h>
#include <unistd.h>

#include "data.h"
#include "dos.h"
#include "optimizer.h"
#include "model.h"
#include "test_starpu.h"
#include "test_util.h"
#include "train.h"

static int refusals;

/* Checks a refused call: its code, its message, and that no task was submitted. */
static void expect(int err, int code, const char *needle)
{
	CHECK(err == code, "expected %d for '%s', got %d (%s)", code, needle, err, dos_last_error());
	CHECK(strstr(dos_last_error(), needle) != NULL, "message '%s' does not mention '%s'", dos_last_error(), needle);
	CHECK(starpu_task_nsubmitted() == 0, "a refused call submitted %d tasks ('%s')", starpu_task_nsubmitted(),
	      needle);
	refusals++;
}

#define EXPECT_UNTOUCHED(object, pattern, needle)                                                            \
	do {                                                                                                 \
		const unsigned char *bytes_ = (const unsigned char *)&(object);                              \
		for (size_t i_ = 0; i_ < sizeof(object); i_++)                                               \
			CHECK(bytes_[i_] == (pattern), "a refused call changed %s ('%s')", #object, needle); \
	} while (0)

/* Whether the folder holds nothing but, perhaps, the lock file of a run that took it
 * (graph/checkpoint.h: lock files stay, so that no two processes ever lock two files). */
static int directory_is_empty(const char *path)
{
	DIR *d = opendir(path);
	CHECK(d, "opendir %s", path);
	int n = 0;
	for (struct dirent *e; (e = readdir(d));)
		n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && strcmp(e->d_name, ".starpu-dos.lock");
	closedir(d);
	return n == 0;
}

static const struct dos_model_shape tiny = {
	.vocab = 256, .hidden = 32, .heads = 2, .ffn = 64, .layers = 2, .seq_len = 16};

static void shape_and_model(void)
{
	struct dos_model_shape s;
	expect(_dos_model_shape_check(NULL), -EINVAL, "shape is NULL");
	s = tiny, s.ffn = 0;
	expect(_dos_model_shape_check(&s), -EINVAL, "model ffn = 0");
	s = tiny, s.heads = 3;
	expect(_dos_model_shape_check(&s), -EINVAL, "hidden = 32 is not a multiple of heads = 3");
	s = tiny, s.layers = DOS_MODEL_MAX_LAYERS + 1;
	expect(_dos_model_shape_check(&s), -EINVAL, "model layers = 100001");
	s = tiny, s.hidden = 40000, s.heads = 1;
	expect(_dos_model_shape_check(&s), -EINVAL, "3 hidden x hidden (qkv) = 4800000000 elements");

	struct dos_model model;
	memset(&model, 0xa5, sizeof model);
	expect(_dos_model_create(NULL, &tiny, 1, 1, DOS_FP32, 0, 0, 0), -EINVAL, "model is NULL");
	expect(_dos_model_create(&model, NULL, 1, 1, DOS_FP32, 0, 0, 0), -EINVAL, "shape is NULL");
	s = tiny, s.vocab = 0;
	expect(_dos_model_create(&model, &s, 1, 1, DOS_FP32, 0, 0, 0), -EINVAL, "model vocab = 0");
	expect(_dos_model_create(&model, &tiny, 0, 1, DOS_FP32, 0, 0, 0), -EINVAL, "micro-batch = 0");
	/* 2^20 sequences of 16 tokens: 2^32 logits, one more than a StarPU vector holds */
	expect(_dos_model_create(&model, &tiny, 1u << 20, 1, DOS_BF16, 0, 0, 0), -EINVAL,
	       "micro-batch = 1048576 sequences of 16 tokens: activations of 4294967296 elements");
	expect(_dos_model_create(&model, &tiny, 1, 1, (enum dos_dtype)7, 0, 0, 0), -EINVAL,
	       "model dtype = 7 is not fp32, fp16 or bf16");
	expect(_dos_model_create(&model, &tiny, 1, 1, DOS_FP16, 0, 0, 7), -EINVAL,
	       "sched_ctx = 7 is not a scheduling context");
	EXPECT_UNTOUCHED(model, 0xa5, "_dos_model_create");
}

static void corpus(const char *corpus_path, const char *dir)
{
	struct dos_corpus c;
	memset(&c, 0xa5, sizeof c);
	char path[4096];
	expect(_dos_corpus_load(NULL, corpus_path, 16, 1), -EINVAL, "NULL argument (corpus (nil)");
	expect(_dos_corpus_load(&c, NULL, 16, 1), -EINVAL, "path (nil)");
	expect(_dos_corpus_load(&c, corpus_path, 0, 1), -EINVAL, "seq_len = 0");
	snprintf(path, sizeof path, "%s/missing.txt", dir);
	expect(_dos_corpus_load(&c, path, 16, 1), -ENOENT, "cannot open the data file");
	CHECK(strstr(dos_last_error(), path), "the message names the file: %s", dos_last_error());
	expect(_dos_corpus_load(&c, dir, 16, 1), -EISDIR, "is not a regular file but a directory");
	/* a FIFO nobody writes into: refused at once, not waited on */
	snprintf(path, sizeof path, "%s/fifo", dir);
	CHECK(mkfifo(path, 0600) == 0, "mkfifo %s", path);
	expect(_dos_corpus_load(&c, path, 16, 1), -EINVAL, "is not a regular file but a FIFO");
	unlink(path);
	snprintf(path, sizeof path, "%s/short.txt", dir);
	FILE *f = fopen(path, "w");
	CHECK(f && fputs("0123456789", f) >= 0 && fclose(f) == 0, "write %s", path);
	expect(_dos_corpus_load(&c, path, 16, 1), -EINVAL, "has 10 bytes, fewer than seq_len + 1 = 17");
	unlink(path);
	EXPECT_UNTOUCHED(c, 0xa5, "_dos_corpus_load");
}

static void optimizer(void)
{
	/* two tensors of 100 and 60 parameters */
	enum { T0 = 100, T1 = 60 };
	static float weights[T0 + T1], initial[T0 + T1];
	static uint16_t half[T0];
	uint64_t numel[] = {T0, T1}, empty[] = {T0, 0};
	starpu_data_handle_t w[2], g[2], g_half[2], w_short[2];
	starpu_vector_data_register(&w[0], STARPU_MAIN_RAM, (uintptr_t)weights, T0, sizeof(float));
	starpu_vector_data_register(&w[1], STARPU_MAIN_RAM, (uintptr_t)(weights + T0), T1, sizeof(float));
	starpu_vector_data_register(&g[0], -1, 0, T0, sizeof(float));
	starpu_vector_data_register(&g[1], -1, 0, T1, sizeof(float));
	starpu_vector_data_register(&g_half[0], STARPU_MAIN_RAM, (uintptr_t)half, T0, 2);
	g_half[1] = g[1];
	w_short[0] = w[0];
	starpu_vector_data_register(&w_short[1], STARPU_MAIN_RAM, (uintptr_t)(weights + T0), T1 - 1, sizeof(float));

	const struct _dos_optimizer_config good = {.subgroup_size = 64,
						   .weight_dtype = DOS_FP32,
						   .grad_dtype = DOS_FP32,
						   .hp = {DOS_ADAMW, 1e-3, 0.9, 0.999, 1e-8, 0.01},
						   .loss_scale_window = 1000};
	struct _dos_optimizer_config c;
	struct _dos_optimizer *opt;
	memset(&opt, 0xa5, sizeof opt);
#define CREATE(cfg) _dos_optimizer_create(&opt, (cfg), 2, numel, w, g, initial)
	expect(_dos_optimizer_create(NULL, &good, 2, numel, w, g, initial), -EINVAL, "NULL argument (opt (nil)");
	expect(CREATE(NULL), -EINVAL, "cfg (nil)");
	expect(_dos_optimizer_create(&opt, &good, 2, numel, w, g, NULL), -EINVAL, "initial (nil)");
	expect(_dos_optimizer_create(&opt, &good, 0, numel, w, g, initial), -EINVAL, "ntensors = 0");
	expect(_dos_optimizer_create(&opt, &good, 2, numel, w_short, g, initial), -EINVAL,
	       "weights[1] has 59 elements but numel[1] = 60");
	expect(_dos_optimizer_create(&opt, &good, 2, numel, w, g_half, initial), -EINVAL,
	       "grads[0] is a vector of 2-byte elements, expected 4");
	expect(_dos_optimizer_create(&opt, &good, 2, empty, w, g, initial), -EINVAL,
	       "weights[1] has 60 elements but numel[1] = 0");
	c = good, c.subgroup_size = 0;
	expect(CREATE(&c), -EINVAL, "subgroup_size = 0 must be in [1, 160]");
	c = good, c.subgroup_size = 161;
	expect(CREATE(&c), -EINVAL, "subgroup_size = 161 must be in [1, 160]");
	c = good, c.weight_dtype = (enum dos_dtype)7;
	expect(CREATE(&c), -EINVAL, "weight_dtype = 7");
	c = good, c.weight_dtype = DOS_FP16, c.grad_dtype = DOS_BF16;
	expect(CREATE(&c), -EINVAL, "grad_dtype = 2 (bf16) must be fp32 or the weight dtype fp16");
	c = good, c.tensor_grad_dtype = (enum dos_dtype)7;
	expect(CREATE(&c), -EINVAL, "tensor_grad_dtype = 7 (invalid) must be fp32 or the tensor dtype fp32");
	/* mixed precision's 16-bit weights with fp32 gradients pass; 16-bit gradients of
	 * another 16-bit format than the weights' do not */
	c = good, c.tensor_dtype = c.weight_dtype = c.grad_dtype = DOS_BF16;
	CHECK(_dos_optimizer_config_check(&c, T0 + T1) == 0, "bf16 tensors, fp32 gradients: %s", dos_last_error());
	c.tensor_grad_dtype = DOS_FP16;
	expect(_dos_optimizer_config_check(&c, T0 + T1), -EINVAL,
	       "tensor_grad_dtype = 1 (fp16) must be fp32 or the tensor dtype bf16");
	c = good, c.hp.lr = -1e-3;
	expect(CREATE(&c), -EINVAL, "hp->lr = -0.001");
	c = good, c.hp.beta1 = 1.0;
	expect(CREATE(&c), -EINVAL, "hp->beta1 = 1");
	c = good, c.hp.beta2 = 1.5;
	expect(CREATE(&c), -EINVAL, "hp->beta2 = 1.5");
	c = good, c.hp.eps = 0;
	expect(CREATE(&c), -EINVAL, "hp->eps = 0");
	c = good, c.hp.weight_decay = -1;
	expect(CREATE(&c), -EINVAL, "hp->weight_decay = -1");
	c = good, c.hp.mode = (enum dos_adam_mode)3;
	expect(CREATE(&c), -EINVAL, "hp->mode = 3");
	c = good, c.clip_norm = -1;
	expect(CREATE(&c), -EINVAL, "clip_norm = -1");
	c = good, c.clip_norm = NAN;
	expect(CREATE(&c), -EINVAL, "clip_norm = nan");
	c = good, c.dynamic_loss_scale = 1, c.loss_scale_init = 0.5;
	expect(CREATE(&c), -EINVAL, "loss_scale_init = 0.5");
	c = good, c.dynamic_loss_scale = 1, c.loss_scale_init = 1024, c.loss_scale_window = 0;
	expect(CREATE(&c), -EINVAL, "loss_scale_window = 0");
	c = good, c.sched_ctx = 9;
	expect(CREATE(&c), -EINVAL, "sched_ctx = 9 is not a scheduling context");
	EXPECT_UNTOUCHED(opt, 0xa5, "_dos_optimizer_create");

	struct _dos_step_report report;
	memset(&report, 0xa5, sizeof report);
	expect(_dos_optimizer_submit_step(NULL, &report), -EINVAL, "NULL argument (opt (nil)");
	EXPECT_UNTOUCHED(report, 0xa5, "_dos_optimizer_submit_step");

	/* the same arguments, corrected, work; then a NULL report is refused */
	starpu_resume();
	CHECK(CREATE(&good) == 0, "%s", dos_last_error());
	starpu_pause();
	expect(_dos_optimizer_submit_step(opt, NULL), -EINVAL, "report (nil)");
	/* no update has run: there are no flags to read yet */
	uint32_t count = 0xa5a5a5a5, subgroup = 0xa5a5a5a5, bits = 0xa5a5a5a5;
	expect(_dos_optimizer_update_nonfinite(opt, 1, &count, &subgroup, &bits), -EINVAL,
	       "update = 1: its flags are not there (the latest update is 0)");
	expect(_dos_optimizer_update_nonfinite(opt, 0, &count, &subgroup, &bits), -EINVAL, "update = 0");
	expect(_dos_optimizer_update_nonfinite(opt, 1, NULL, &subgroup, &bits), -EINVAL, "count (nil)");
	expect(_dos_optimizer_update_nonfinite(NULL, 1, &count, &subgroup, &bits), -EINVAL, "NULL argument (opt (nil)");
	CHECK(count == 0xa5a5a5a5 && subgroup == 0xa5a5a5a5 && bits == 0xa5a5a5a5,
	      "a refused _dos_optimizer_update_nonfinite wrote its outputs");
	starpu_resume();
	_dos_optimizer_destroy(opt);
	starpu_data_handle_t all[] = {w[0], w[1], g[0], g[1], g_half[0], w_short[1]};
	for (size_t i = 0; i < sizeof all / sizeof *all; i++)
		starpu_data_unregister(all[i]);
	starpu_pause();
#undef CREATE
}

static void training(const char *corpus_path, const char *dir)
{
	const struct dos_train_config good = {
		.shape = tiny,
		.micro_batch = 2,
		.accumulation = 1,
		.steps = 3,
		.data_path = corpus_path,
		.opt = {.subgroup_size = 4096,
			.weight_dtype = DOS_FP32,
			.grad_dtype = DOS_FP32,
			.hp = {DOS_ADAMW, 1e-3, 0.9, 0.999, 1e-8, 0.01}},
		.checkpoint_dir = dir,
		.checkpoint_every = 1,
	};
	struct dos_train_config c;
	struct dos_train_output out;
	memset(&out, 0xa5, sizeof out);
	char path[4096];
	expect(_dos_train_run(NULL, &out), -EINVAL, "cfg is NULL");
	c = good, c.micro_batch = 0;
	expect(_dos_train_run(&c, &out), -EINVAL, "micro_batch = 0");
	c = good, c.accumulation = 0;
	expect(_dos_train_run(&c, &out), -EINVAL, "accumulation = 0");
	c = good, c.steps = 0;
	expect(_dos_train_run(&c, &out), -EINVAL, "steps = 0");
	c = good, c.data_path = NULL;
	expect(_dos_train_run(&c, &out), -EINVAL, "data_path is NULL");
	c = good, c.shape.vocab = 100;
	expect(_dos_train_run(&c, &out), -EINVAL, "vocab = 100");
	c = good, c.shape.seq_len = 0;
	expect(_dos_train_run(&c, &out), -EINVAL, "model seq_len = 0");
	c = good, c.opt.subgroup_size = 0;
	expect(_dos_train_run(&c, &out), -EINVAL, "subgroup_size = 0");
	c = good, c.opt.subgroup_size = 1u << 30;
	expect(_dos_train_run(&c, &out), -EINVAL, "subgroup_size = 1073741824 must be in [1, 33440]");
	c = good, c.opt.hp.eps = -1;
	expect(_dos_train_run(&c, &out), -EINVAL, "hp->eps = -1");
	c = good, c.opt.weight_dtype = DOS_FP16, c.opt.grad_dtype = DOS_FP16, c.opt.dynamic_loss_scale = 1;
	expect(_dos_train_run(&c, &out), -EINVAL, "loss_scale_init = 0");
	c = good, c.checkpoint_dir = NULL;
	expect(_dos_train_run(&c, &out), -EINVAL, "checkpoint_every = 1: both need a checkpoint_dir");
	c = good, c.sched_ctx = 5;
	expect(_dos_train_run(&c, &out), -EINVAL, "sched_ctx = 5 is not a scheduling context");
	snprintf(path, sizeof path, "%s/missing.txt", dir);
	c = good, c.data_path = path;
	expect(_dos_train_run(&c, &out), -ENOENT, "missing.txt");
	c = good, c.resume = 1;
	expect(_dos_train_run(&c, &out), -ENOENT, "--resume: no checkpoint in");
	EXPECT_UNTOUCHED(out, 0xa5, "_dos_train_run");
	CHECK(directory_is_empty(dir), "a refused training run wrote into its checkpoint directory");
}

int main(void)
{
	const char *src = getenv("DOS_SOURCE_DIR");
	char corpus_path[4096], dir[] = "/tmp/dos-bad-arguments-XXXXXX";
	snprintf(corpus_path, sizeof corpus_path, "%s/data/corpus.txt", src ? src : "..");
	CHECK(mkdtemp(dir), "mkdtemp");
	test_starpu_init(NULL);
	starpu_pause(); /* a task submitted by a refused call would stay counted */
	shape_and_model();
	corpus(corpus_path, dir);
	optimizer();
	training(corpus_path, dir);
	starpu_resume();
	starpu_shutdown();
	test_remove_folder(dir);
	printf("graph bad arguments: %d refusals, each naming the argument and its value, nothing changed\n", refusals);
	return 0;
}
