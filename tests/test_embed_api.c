/* The embedding API (dos_opt_*, include/dos.h) beyond what examples/host_app shows:
 *  1. every function refuses bad arguments with -EINVAL (or the stated code) and a message
 *     naming the argument and its value, and changes nothing: a refused create leaves
 *     StarPU as it was (not started, or started again and stopped), registers nothing and
 *     creates no context; a refused load leaves the state bit for bit;
 *  2. 16-bit application tensors train exactly as fp32 tensors holding the same values
 *     (bf16 tensors with bf16 weights and gradients; fp16 tensors with fp32 ones), and the
 *     refresh writes them the rounded master weights;
 *  3. buffers registered by the API train exactly as the application's own handles;
 *  4. clipping and loss scaling: the statistics phase, the report, a skipped step that
 *     leaves the state bit for bit, the loss scale halved;
 *  5. StarPU started by the API stays up while any optimizer needs it;
 *  6. the runtime version is the compiled one;
 *  7. a learning-rate schedule is the rates it reports, applied: the same bits as those
 *     rates given one by one with dos_opt_set_lr;
 *  8. one owner each: a tensor (handle or memory) belongs to one live optimizer, and a
 *     checkpoint folder to one run and one optimizer at a time (its lock, the run's
 *     identity in every checkpoint, stale temporary files removed, the newest checkpoint
 *     that verifies found past damaged ones);
 *  9. an optimizer already destroyed, or whose StarPU the application shut down, is
 *     refused by every call, destroy included, rather than crashing. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dos.h"
#include "numerics.h"
#include "test_starpu.h"
#include "test_util.h"

#define T 3     /* tensors */
#define SUB 500 /* subgroup size: 3 subgroups over the tensors below, straddling them */
static const uint64_t numel[T] = {700, 13, 600};
#define N (700 + 13 + 600)
#define STEPS 4

static int refusals;

/* A call that must fail with `code` and a message containing `needle`. */
static void expect(int err, int code, const char *needle)
{
	CHECK(err == code, "expected %d for '%s', got %d (%s)", code, needle, err, dos_last_error());
	CHECK(strstr(dos_last_error(), needle) != NULL, "message '%s' does not mention '%s'", dos_last_error(), needle);
	refusals++;
}

static struct dos_opt_config base_config(void)
{
	struct dos_opt_config cfg;
	CHECK(dos_opt_config_init(&cfg) == 0, "%s", dos_last_error());
	cfg.hp = (struct dos_adam_hparams){DOS_ADAMW, 1e-2, 0.9, 0.999, 1e-8, 0.01};
	cfg.subgroup_size = SUB;
	return cfg;
}

/* A value exactly representable in `dtype` (fp16 or bf16; bf16 for fp32), so that fp32
 * and 16-bit runs can be given the same numbers. */
static float value(uint64_t seed, uint64_t i, enum dos_dtype dtype, double scale)
{
	uint64_t s = seed * 1000003 + i + 1;
	float x = (float)(scale * test_normal(&s));
	return dtype == DOS_FP16 ? dos_fp16_to_float(dos_float_to_fp16(x)) : dos_bf16_to_float(dos_float_to_bf16(x));
}

/* ---- an application's tensors as handles over its own arrays --------------------------- */

struct app {
	enum dos_dtype dtype;
	void *w[T], *g[T];
	starpu_data_handle_t hw[T], hg[T];
	struct dos_opt_tensor tensors[T];
};

/* Weights from `seed`, representable in `values` (the dtype the comparison runs share). */
static void app_init(struct app *a, enum dos_dtype dtype, enum dos_dtype values, int buffers)
{
	a->dtype = dtype;
	for (int t = 0; t < T; t++) {
		a->w[t] = test_malloc(numel[t] * 4);
		a->g[t] = calloc(numel[t], 4);
		for (uint64_t i = 0; i < numel[t]; i++)
			dos_store_elem(a->w[t], i, dtype, value(t, i, values, 0.5));
		a->tensors[t] = (struct dos_opt_tensor){.numel = numel[t]};
		if (buffers) {
			a->tensors[t].weight_ptr = a->w[t];
			a->tensors[t].grad_ptr = a->g[t];
			a->hw[t] = a->hg[t] = NULL;
			continue;
		}
		starpu_vector_data_register(&a->hw[t], STARPU_MAIN_RAM, (uintptr_t)a->w[t], (uint32_t)numel[t],
					    dos_dtype_size(dtype));
		starpu_vector_data_register(&a->hg[t], STARPU_MAIN_RAM, (uintptr_t)a->g[t], (uint32_t)numel[t],
					    dos_dtype_size(dtype));
		a->tensors[t].weight = a->hw[t];
		a->tensors[t].grad = a->hg[t];
	}
}

/* The application's backward of step k: writes the gradients (through its handles, after
 * the optimizer's previous gather read them; into its buffers, after dos_opt_wait). */
static void app_backward(struct app *a, uint64_t k, enum dos_dtype values, const float *poison)
{
	for (int t = 0; t < T; t++) {
		if (a->hg[t])
			starpu_data_acquire(a->hg[t], STARPU_W);
		for (uint64_t i = 0; i < numel[t]; i++)
			dos_store_elem(a->g[t], i, a->dtype, poison ? *poison : value(100 + k * T + t, i, values, 0.1));
		if (a->hg[t])
			starpu_data_release(a->hg[t]);
	}
}

/* The model's weights as floats, once the optimizer wrote them. */
static void app_weights(struct app *a, float *out)
{
	for (int t = 0, at = 0; t < T; at += (int)numel[t], t++) {
		if (a->hw[t])
			starpu_data_acquire(a->hw[t], STARPU_R);
		for (uint64_t i = 0; i < numel[t]; i++)
			out[at + i] = dos_load_elem(a->w[t], i, a->dtype);
		if (a->hw[t])
			starpu_data_release(a->hw[t]);
	}
}

static void app_free(struct app *a)
{
	for (int t = 0; t < T; t++) {
		if (a->hw[t]) {
			starpu_data_unregister(a->hw[t]);
			starpu_data_unregister(a->hg[t]);
		}
		free(a->w[t]);
		free(a->g[t]);
	}
}

struct state {
	float master[N], m[N], v[N], weights[N];
};

/* STEPS steps of the optimizer over `a`, and its state and the model's weights after. */
static void train(struct app *a, struct dos_opt_config cfg, enum dos_dtype values, struct state *out)
{
	dos_opt_t opt;
	cfg.tensor_dtype = a->dtype;
	CHECK(dos_opt_create(&opt, &cfg, T, a->tensors) == 0, "%s", dos_last_error());
	for (uint64_t k = 0; k < STEPS; k++) {
		app_backward(a, k, values, NULL);
		CHECK(dos_opt_submit_step(opt, NULL) == 0, "%s", dos_last_error());
		if (!a->hw[0])
			CHECK(dos_opt_wait(opt) == 0, "%s", dos_last_error());
	}
	CHECK(dos_opt_wait(opt) == 0, "%s", dos_last_error());
	CHECK(dos_opt_read_state(opt, out->master, out->m, out->v, N) == 0, "%s", dos_last_error());
	app_weights(a, out->weights);
	dos_opt_destroy(opt);
}

static void same_state(const struct state *x, const struct state *y, const char *what)
{
	CHECK(test_first_difference(x->master, y->master, N, 4) < 0, "%s: master weights differ", what);
	CHECK(test_first_difference(x->m, y->m, N, 4) < 0, "%s: m differs", what);
	CHECK(test_first_difference(x->v, y->v, N, 4) < 0, "%s: v differs", what);
}

/* ---- 1. refusals ---------------------------------------------------------------------- */

/* With StarPU down: nothing may start it for good. */
static void refusals_without_starpu(void)
{
	struct dos_opt_config cfg = base_config(), bad;
	static float w[T][700], g[T][700];
	struct dos_opt_tensor ok[T], x[T];
	for (int t = 0; t < T; t++)
		ok[t] = (struct dos_opt_tensor){.numel = numel[t], .weight_ptr = w[t], .grad_ptr = g[t]};
	dos_opt_t opt = (dos_opt_t)&cfg; /* must become NULL */

	expect(dos_opt_config_init(NULL), -EINVAL, "cfg is NULL");
	expect(dos_opt_create(NULL, &cfg, T, ok), -EINVAL, "out is NULL");
	expect(dos_opt_create(&opt, NULL, T, ok), -EINVAL, "cfg is NULL");
	CHECK(opt == NULL, "a refused create must set *out to NULL");
	expect(dos_opt_create(&opt, &cfg, T, NULL), -EINVAL, "tensors = (nil), ntensors = 3");
	expect(dos_opt_create(&opt, &cfg, 0, ok), -EINVAL, "ntensors = 0");
#define BAD_CONFIG(field_set, needle)                                         \
	do {                                                                  \
		bad = cfg;                                                    \
		field_set;                                                    \
		expect(dos_opt_create(&opt, &bad, T, ok), -EINVAL, (needle)); \
	} while (0)
	BAD_CONFIG(bad.policy = "nosuch", "policy = 'nosuch'");
	BAD_CONFIG(bad.app_gpu_bytes = -1, "app_gpu_bytes = -1");
	BAD_CONFIG(bad.subgroup_size = 0, "subgroup_size = 0");
	BAD_CONFIG(bad.hp.lr = -1, "hp->lr = -1");
	BAD_CONFIG(bad.hp.beta2 = 1, "beta2 = 1");
	BAD_CONFIG(bad.tensor_dtype = (enum dos_dtype)7, "tensor_dtype = 7");
	BAD_CONFIG(bad.weight_dtype = (enum dos_dtype)9, "weight_dtype = 9");
	BAD_CONFIG((bad.tensor_dtype = DOS_FP16, bad.weight_dtype = bad.grad_dtype = DOS_BF16),
		   "tensor_dtype = fp16 needs weight_dtype (bf16)");
	BAD_CONFIG(bad.grad_dtype = DOS_BF16, "grad_dtype = 2 (bf16) must be fp32 or the weight dtype fp32");
	BAD_CONFIG(bad.clip_norm = -1, "clip_norm = -1");
	BAD_CONFIG((bad.lr_schedule.warmup_steps = 5, bad.lr_schedule.decay_steps = 5),
		   "lr_schedule.decay_steps = 5 must be 0 (no decay) or above warmup_steps = 5");
	BAD_CONFIG(bad.lr_schedule.min_ratio = 1.5, "lr_schedule.min_ratio = 1.5");
	BAD_CONFIG((bad.dynamic_loss_scale = 1, bad.loss_scale_init = 0.5),
		   "loss_scale_init = 0.5: dynamic loss scaling needs a scale in [1, 2^127");
	BAD_CONFIG((bad.dynamic_loss_scale = 1, bad.loss_scale_init = 1e300),
		   "loss_scale_init = 1e+300: dynamic loss scaling needs a scale in [1, 2^127");
#define BAD_TENSOR(change, needle)                                           \
	do {                                                                 \
		memcpy(x, ok, sizeof x);                                     \
		change;                                                      \
		expect(dos_opt_create(&opt, &cfg, T, x), -EINVAL, (needle)); \
	} while (0)
	BAD_TENSOR(x[1].numel = 0, "tensors[1].numel = 0");
	BAD_TENSOR(x[0].numel = (uint64_t)1 << 32, "tensors[0].numel = 4294967296");
	BAD_TENSOR(x[2].weight_ptr = NULL, "tensors[2]: give exactly one of weight ((nil)) and weight_ptr ((nil))");
	BAD_TENSOR(x[0].grad = (starpu_data_handle_t)g, "tensors[0]: give exactly one of grad");
	BAD_TENSOR(x[1].grad_ptr = w[1], "tensors[1]: weight_ptr and grad_ptr are the same buffer");
	BAD_TENSOR(x[0].location = (enum dos_memory)5, "tensors[0].location = 5");
	BAD_TENSOR((x[1].location = DOS_MEMORY_CUDA, x[1].cuda_device = -1), "tensors[1].cuda_device = -1");
	/* refused once StarPU runs: it must be stopped again */
	BAD_TENSOR((x[2].location = DOS_MEMORY_CUDA, x[2].cuda_device = 999),
		   "tensors[2].cuda_device = 999: no StarPU CUDA worker");
	BAD_TENSOR((x[0].weight_ptr = NULL, x[0].weight = (starpu_data_handle_t)w[0]), /* never dereferenced */
		   "StarPU is not initialised");
	CHECK(!starpu_is_initialized(), "a refused create left StarPU running");
	CHECK(opt == NULL, "a refused create must leave *out NULL");
}

/* With the application's StarPU up: its handles, and every function on a live optimizer. */
static void refusals_with_starpu(void)
{
	struct dos_opt_config cfg = base_config();
	struct app a;
	app_init(&a, DOS_FP32, DOS_BF16, 0);
	static uint16_t half[700];
	static float longer[701], dummy;
	starpu_data_handle_t h16, hlong, hvar;
	starpu_vector_data_register(&h16, STARPU_MAIN_RAM, (uintptr_t)half, 700, 2);
	starpu_vector_data_register(&hlong, STARPU_MAIN_RAM, (uintptr_t)longer, 701, 4);
	starpu_variable_data_register(&hvar, STARPU_MAIN_RAM, (uintptr_t)&dummy, sizeof dummy);
	struct dos_opt_tensor x[T], *ok = a.tensors;
	dos_opt_t opt;
	BAD_TENSOR((x[0].weight = hvar), "tensors[0].weight has 1 elements but numel = 700");
	BAD_TENSOR((x[0].grad = h16), "tensors[0].grad is a vector of 2-byte elements, expected 4");
	BAD_TENSOR((x[0].weight = hlong), "tensors[0].weight has 701 elements but numel = 700");
	BAD_TENSOR((x[1].grad = x[1].weight), "is given twice");
	/* StarPU asserts on an acquire or a task of a partitioned handle's whole */
	struct starpu_data_filter quarters = {.filter_func = starpu_vector_filter_block, .nchildren = 4};
	starpu_data_partition(a.hw[0], &quarters);
	BAD_TENSOR((void)0, "tensors[0].weight is partitioned into 4 pieces");
	starpu_data_unpartition(a.hw[0], STARPU_MAIN_RAM);
	/* and on a context given a worker twice */
	struct dos_opt_config twice = cfg;
	const int worker_twice[] = {0, 0};
	twice.ctx_workers = worker_twice;
	twice.ctx_nworkers = 2;
	expect(dos_opt_create(&opt, &twice, T, a.tensors), -EINVAL, "ctx_workers[1] = 0 is ctx_workers[0] too");
	struct dos_opt_config bf16 = cfg;
	bf16.tensor_dtype = DOS_BF16;
	expect(dos_opt_create(&opt, &bf16, T, a.tensors), -EINVAL,
	       "tensors[0].weight is a vector of 4-byte elements, expected 2");

	/* none of that made a context: ours is the first one created after StarPU's own */
	CHECK(dos_opt_create(&opt, &cfg, T, a.tensors) == 0, "%s", dos_last_error());
	struct dos_opt_info info;
	CHECK(dos_opt_get_info(opt, &info) == 0 && info.sched_ctx == 1 && !info.owns_starpu && info.nsubgroups == 3 &&
		      info.nparams == N,
	      "info: context %u, owns %d, %u subgroups, %llu parameters", info.sched_ctx, info.owns_starpu,
	      info.nsubgroups, (unsigned long long)info.nparams);

	expect(dos_opt_submit_step(NULL, NULL), -EINVAL, "opt is NULL");
	expect(dos_opt_wait(NULL), -EINVAL, "opt is NULL");
	expect(dos_opt_get_info(NULL, &info), -EINVAL, "opt (nil)");
	expect(dos_opt_get_info(opt, NULL), -EINVAL, "out (nil)");
	enum dos_device where[4];
	expect(dos_opt_get_placements(NULL, where, 3), -EINVAL, "opt (nil)");
	expect(dos_opt_get_placements(opt, NULL, 3), -EINVAL, "where (nil)");
	expect(dos_opt_get_placements(opt, where, 4), -EINVAL, "count = 4 but the optimizer has 3 subgroups");
	struct dos_opt_step_times times;
	expect(dos_opt_get_step_times(NULL, &times), -EINVAL, "opt (nil)");
	expect(dos_opt_get_step_times(opt, NULL), -EINVAL, "out (nil)");
	static struct state before, after;
	expect(dos_opt_read_state(NULL, before.master, NULL, NULL, N), -EINVAL, "opt is NULL");
	expect(dos_opt_read_state(opt, NULL, NULL, NULL, N), -EINVAL, "master, m and v are all NULL");
	expect(dos_opt_read_state(opt, before.master, NULL, NULL, N - 1), -EINVAL,
	       "count = 1312 but the optimizer has 1313 parameters");

	/* nothing has run yet: no placement, no step times */
	CHECK(dos_opt_get_placements(opt, where, 3) == 0 && where[0] == DOS_DEVICE_NONE && where[2] == DOS_DEVICE_NONE,
	      "placements before any step");
	CHECK(dos_opt_get_step_times(opt, &times) == 0 && times.step == 0, "step times before any step");
	app_backward(&a, 0, DOS_BF16, NULL);
	CHECK(dos_opt_submit_step(opt, NULL) == 0, "%s", dos_last_error());
	CHECK(dos_opt_read_state(opt, before.master, before.m, before.v, N) == 0, "%s", dos_last_error());
	/* refused state writes: the state stays that of step 1 (compared after the save below) */
	static struct state odd;
	memcpy(&odd, &before, sizeof odd);
	expect(dos_opt_write_state(NULL, odd.master, NULL, NULL, N, 1), -EINVAL, "opt is NULL");
	expect(dos_opt_write_state(opt, NULL, NULL, NULL, N, 1), -EINVAL, "master, m and v are all NULL");
	expect(dos_opt_write_state(opt, odd.master, NULL, NULL, N + 1, 1), -EINVAL,
	       "count = 1314 but the optimizer has 1313");
	expect(dos_opt_write_state(opt, odd.master, odd.m, odd.v, N, UINT64_MAX), -EINVAL,
	       "updates = 18446744073709551615: the next update's number t = updates + 1 would overflow");
	odd.v[5] = -1;
	expect(dos_opt_write_state(opt, NULL, NULL, odd.v, N, 1), -EINVAL,
	       "v[5] = -1: the state must be finite, and v >= 0");
	odd.m[7] = NAN;
	expect(dos_opt_write_state(opt, NULL, odd.m, NULL, N, 1), -EINVAL, "m[7] = nan");

	/* checkpoints */
	char dir[] = "/tmp/dos-embed-XXXXXX", path[4200], small[8];
	CHECK(mkdtemp(dir), "mkdtemp");
	expect(dos_opt_save(NULL, dir, 1, NULL, 0), -EINVAL, "opt (nil)");
	expect(dos_opt_save(opt, NULL, 1, NULL, 0), -EINVAL, "dir (nil)");
	expect(dos_opt_save(opt, dir, 0, NULL, 0), -EINVAL, "keep = 0");
	expect(dos_opt_save(opt, dir, 1, small, sizeof small), -ENAMETOOLONG, "path_size = 8 is too small");
	expect(dos_opt_latest_checkpoint(dir, path, sizeof path), -ENOENT, "no checkpoint-<N>.dos in");
	expect(dos_opt_latest_checkpoint(NULL, path, sizeof path), -EINVAL, "dir is NULL");
	expect(dos_opt_latest_checkpoint(dir, NULL, 0), -EINVAL, "path is NULL");
	CHECK(dos_opt_save(opt, dir, 1, path, sizeof path) == 0 && strstr(path, "checkpoint-1.dos"), "save: %s",
	      dos_last_error());
	char latest[4200];
	CHECK(dos_opt_latest_checkpoint(dir, latest, sizeof latest) == 0 && !strcmp(latest, path), "latest: %s",
	      dos_last_error());

	/* a second step, then refused loads: the state must stay that of step 2 */
	app_backward(&a, 1, DOS_BF16, NULL);
	CHECK(dos_opt_submit_step(opt, NULL) == 0, "%s", dos_last_error());
	static struct state two, now;
	CHECK(dos_opt_read_state(opt, two.master, two.m, two.v, N) == 0, "%s", dos_last_error());
	expect(dos_opt_load(NULL, path), -EINVAL, "opt (nil)");
	expect(dos_opt_load(opt, NULL), -EINVAL, "path (nil)");
	expect(dos_opt_load(opt, "/nonexistent/checkpoint-1.dos"), -ENOENT, "/nonexistent/checkpoint-1.dos");
	char corrupt[4300];
	snprintf(corrupt, sizeof corrupt, "%s/corrupt.dos", dir);
	FILE *in = fopen(path, "rb"), *out = fopen(corrupt, "wb");
	CHECK(in && out, "copying the checkpoint");
	for (long at = 0, c; (c = fgetc(in)) != EOF; at++)
		fputc(at == 2000 ? c ^ 1 : (int)c, out); /* one bit of master's section */
	fclose(in);
	fclose(out);
	expect(dos_opt_load(opt, corrupt), -EIO, "is corrupted");
	/* a checkpoint of another layout: tensors of the same sizes, other subgroups */
	struct dos_opt_config other = cfg;
	other.subgroup_size = 400;
	dos_opt_t opt2;
	struct app b;
	app_init(&b, DOS_FP32, DOS_BF16, 0);
	CHECK(dos_opt_create(&opt2, &other, T, b.tensors) == 0, "%s", dos_last_error());
	expect(dos_opt_load(opt2, path), -EINVAL, "subgroup_size = 500, but the model has 400");
	dos_opt_destroy(opt2);
	app_free(&b);
	CHECK(dos_opt_read_state(opt, now.master, now.m, now.v, N) == 0, "%s", dos_last_error());
	same_state(&two, &now, "refused loads");
	CHECK(dos_opt_get_info(opt, &info) == 0 && info.steps_submitted == 2 && info.updates_applied == 2,
	      "refused loads changed the counters");

	/* a load that works: back to the state after step 1, and the model's weights too */
	CHECK(dos_opt_load(opt, path) == 0, "%s", dos_last_error());
	CHECK(dos_opt_read_state(opt, after.master, after.m, after.v, N) == 0, "%s", dos_last_error());
	same_state(&before, &after, "save then load");
	CHECK(dos_opt_get_info(opt, &info) == 0 && info.steps_submitted == 1 && info.updates_applied == 1,
	      "load: counters %llu, %llu", (unsigned long long)info.steps_submitted,
	      (unsigned long long)info.updates_applied);
	CHECK(dos_opt_wait(opt) == 0, "%s", dos_last_error());
	app_weights(&a, after.weights);
	CHECK(test_first_difference(after.weights, before.master, N, 4) < 0,
	      "after a load the model's weights are not the loaded master weights");
	/* a newer checkpoint of the run that does not verify (what dos_opt_latest_checkpoint
	 * skips): the first save after the load renames it out of retention's way, which
	 * would otherwise have kept it and deleted the one loaded */
	char newer[4300], aside[4400];
	snprintf(newer, sizeof newer, "%s/checkpoint-2.dos", dir);
	snprintf(aside, sizeof aside, "%s.damaged", newer);
	CHECK(rename(corrupt, newer) == 0, "rename %s", corrupt);
	CHECK(dos_opt_save(opt, dir, 2, NULL, 0) == 0, "%s", dos_last_error());
	CHECK(access(aside, F_OK) == 0 && access(newer, F_OK) != 0 && access(path, F_OK) == 0,
	      "the damaged newer checkpoint not set aside, or the loaded one gone");
	unlink(aside);
	unlink(path);
	test_remove_folder(dir);

	dos_opt_destroy(opt);
	dos_opt_destroy(NULL);
	starpu_data_unregister(h16);
	starpu_data_unregister(hlong);
	starpu_data_unregister(hvar);
	app_free(&a);
}

/* A state that stops being finite is refused by save, naming the value. */
static void save_refuses_non_finite(void)
{
	struct dos_opt_config cfg = base_config();
	/* decoupled decay multiplies the weights by 1 - lr * wd = -1e37 each step: inf soon */
	cfg.hp.mode = DOS_ADAMW;
	cfg.hp.lr = 1e37;
	cfg.hp.weight_decay = 1;
	struct app a;
	app_init(&a, DOS_FP32, DOS_BF16, 0);
	dos_opt_t opt;
	CHECK(dos_opt_create(&opt, &cfg, T, a.tensors) == 0, "%s", dos_last_error());
	for (uint64_t k = 0; k < 3; k++) {
		app_backward(&a, k, DOS_BF16, NULL);
		CHECK(dos_opt_submit_step(opt, NULL) == 0, "%s", dos_last_error());
	}
	char dir[] = "/tmp/dos-embed-XXXXXX", path[4200];
	CHECK(mkdtemp(dir), "mkdtemp");
	expect(dos_opt_save(opt, dir, 1, NULL, 0), -ERANGE, "the optimizer state is not finite: master weight");
	CHECK(dos_opt_latest_checkpoint(dir, path, sizeof path) == -ENOENT, "a refused save wrote %s", path);
	test_remove_folder(dir);
	dos_opt_destroy(opt);
	app_free(&a);
}

/* ---- 2, 3. 16-bit tensors and buffers ---------------------------------------------------- */

static void sixteen_bit_and_buffers(void)
{
	static struct state ref, got;
	struct app a;
	float narrowed[N];

	/* bf16 tensors, bf16 weights and gradients against fp32 tensors with the same values */
	struct dos_opt_config cfg = base_config();
	cfg.weight_dtype = cfg.grad_dtype = DOS_BF16;
	app_init(&a, DOS_FP32, DOS_BF16, 0);
	train(&a, cfg, DOS_BF16, &ref);
	app_free(&a);
	app_init(&a, DOS_BF16, DOS_BF16, 0);
	train(&a, cfg, DOS_BF16, &got);
	app_free(&a);
	same_state(&ref, &got, "bf16 tensors");
	CHECK(test_first_difference(ref.weights, got.weights, N, 4) < 0, "bf16 tensors: weights differ");
	for (int i = 0; i < N; i++)
		narrowed[i] = dos_bf16_to_float(dos_float_to_bf16(ref.master[i]));
	CHECK(test_first_difference(narrowed, got.weights, N, 4) < 0, "bf16 tensors: weights are not rounded masters");

	/* fp16 tensors with fp32 weights and gradients: the refresh narrows the masters */
	cfg = base_config();
	app_init(&a, DOS_FP32, DOS_FP16, 0);
	train(&a, cfg, DOS_FP16, &ref);
	app_free(&a);
	app_init(&a, DOS_FP16, DOS_FP16, 0);
	train(&a, cfg, DOS_FP16, &got);
	app_free(&a);
	same_state(&ref, &got, "fp16 tensors");
	for (int i = 0; i < N; i++)
		narrowed[i] = dos_fp16_to_float(dos_float_to_fp16(ref.master[i]));
	CHECK(test_first_difference(narrowed, got.weights, N, 4) < 0, "fp16 tensors: weights are not rounded masters");
	CHECK(test_first_difference(ref.master, got.weights, N, 4) >= 0, "fp16 weights equal fp32 masters: vacuous");

	/* buffers the API registers against the application's handles (the fp32 run above) */
	app_init(&a, DOS_FP32, DOS_FP16, 1);
	train(&a, cfg, DOS_FP16, &got);
	app_free(&a);
	same_state(&ref, &got, "buffers");
	CHECK(test_first_difference(ref.weights, got.weights, N, 4) < 0, "buffers: weights differ");
	printf("16-bit tensors (bf16; fp16 with fp32 state) and API-registered buffers: bit-identical to fp32 "
	       "handles\n");
}

/* ---- 4. clipping and loss scaling --------------------------------------------------------- */

static void clipping_and_loss_scaling(void)
{
	struct dos_opt_config cfg = base_config();
	cfg.clip_norm = 0.5;
	cfg.dynamic_loss_scale = 1;
	cfg.loss_scale_init = 1024;
	cfg.loss_scale_window = 1000;
	struct app a;
	app_init(&a, DOS_FP32, DOS_BF16, 0);
	dos_opt_t opt;
	CHECK(dos_opt_create(&opt, &cfg, T, a.tensors) == 0, "%s", dos_last_error());
	struct dos_opt_step_report report;
	app_backward(&a, 0, DOS_BF16, NULL);
	CHECK(dos_opt_submit_step(opt, &report) == 0 && report.applied && report.grad_norm > 0 &&
		      report.loss_scale_used == 1024,
	      "step 1: applied %d, norm %g, scale %g", report.applied, report.grad_norm, report.loss_scale_used);
	CHECK(dos_opt_wait(opt) == 0, "wait");
	struct dos_opt_step_times times;
	CHECK(dos_opt_get_step_times(opt, &times) == 0 && times.step == 1 && times.tasks[DOS_PHASE_STATS] == 3 &&
		      times.tasks[DOS_PHASE_GATHER] == 3 && times.tasks[DOS_PHASE_UPDATE] == 3 &&
		      times.tasks[DOS_PHASE_REFRESH] == T && times.busy_seconds[DOS_PHASE_UPDATE] > 0 &&
		      times.span_seconds[DOS_PHASE_UPDATE] <= times.step_seconds,
	      "step times with statistics");
	static struct state before, after;
	CHECK(dos_opt_read_state(opt, before.master, before.m, before.v, N) == 0, "%s", dos_last_error());
	float inf = INFINITY;
	app_backward(&a, 1, DOS_BF16, &inf);
	CHECK(dos_opt_submit_step(opt, &report) == 0 && !report.applied && report.overflow_subgroup == 0, "overflow");
	CHECK(dos_opt_read_state(opt, after.master, after.m, after.v, N) == 0, "%s", dos_last_error());
	same_state(&before, &after, "a skipped step");
	struct dos_opt_info info;
	CHECK(dos_opt_get_info(opt, &info) == 0 && info.skipped_steps == 1 && info.updates_applied == 1 &&
		      info.steps_submitted == 2 && info.loss_scale == 512,
	      "after an overflow: skipped %llu, scale %g", (unsigned long long)info.skipped_steps, info.loss_scale);
	CHECK(dos_opt_wait(opt) == 0 && dos_opt_get_step_times(opt, &times) == 0 && times.step == 2 &&
		      times.tasks[DOS_PHASE_UPDATE] == 0 && times.tasks[DOS_PHASE_STATS] == 3,
	      "a skipped step's times");
	dos_opt_destroy(opt);
	/* at the largest scale a float holds, a window without overflow keeps it there: doubled,
	 * the next step's gradient scale would be infinite */
	CHECK(DOS_LOSS_SCALE_MAX == ldexp(1, 127), "DOS_LOSS_SCALE_MAX = %.17g is not 2^127", DOS_LOSS_SCALE_MAX);
	cfg.loss_scale_init = DOS_LOSS_SCALE_MAX;
	cfg.loss_scale_window = 1;
	CHECK(dos_opt_create(&opt, &cfg, T, a.tensors) == 0, "%s", dos_last_error());
	app_backward(&a, 2, DOS_BF16, NULL);
	CHECK(dos_opt_submit_step(opt, &report) == 0 && report.applied, "a step at the largest scale");
	CHECK(dos_opt_wait(opt) == 0 && dos_opt_get_info(opt, &info) == 0 && info.loss_scale == DOS_LOSS_SCALE_MAX,
	      "after a window at the largest scale: %g (at most %g)", info.loss_scale, DOS_LOSS_SCALE_MAX);
	dos_opt_destroy(opt);
	app_free(&a);
	printf("clipping and loss scaling: statistics phase timed, a skipped step leaves the state, scale halved, "
	       "and kept at its largest\n");
}

/* ---- 7. learning-rate schedules ------------------------------------------------------- */

/* STEPS steps with `cfg`, setting the rate lr[k] before step k when lr is given; the
 * rates the steps report go to reported[k]. */
static void train_with_rates(struct dos_opt_config cfg, const double *lr, double *reported, struct state *out)
{
	struct app a;
	app_init(&a, DOS_FP32, DOS_BF16, 0);
	dos_opt_t opt;
	CHECK(dos_opt_create(&opt, &cfg, T, a.tensors) == 0, "%s", dos_last_error());
	for (uint64_t k = 0; k < STEPS; k++) {
		app_backward(&a, k, DOS_BF16, NULL);
		if (lr)
			CHECK(dos_opt_set_lr(opt, lr[k]) == 0, "%s", dos_last_error());
		struct dos_opt_step_report report;
		CHECK(dos_opt_submit_step(opt, &report) == 0 && report.applied, "%s", dos_last_error());
		reported[k] = report.lr;
	}
	CHECK(dos_opt_wait(opt) == 0 && dos_opt_read_state(opt, out->master, out->m, out->v, N) == 0, "%s",
	      dos_last_error());
	app_free(&a);
	dos_opt_destroy(opt);
}

static void lr_schedules(void)
{
	struct dos_opt_config constant = base_config(), scheduled = constant;
	/* updates 1..4 of a warmup over 2 and a decay to a quarter by update 4: factors 1/2, 1,
	 * (1 + 1/4) / 2 at half the decay, 1/4 */
	scheduled.lr_schedule = (struct dos_lr_schedule){.warmup_steps = 2, .decay_steps = 4, .min_ratio = 0.25};
	const double peak = scheduled.hp.lr, factors[STEPS] = {0.5, 1.0, 0.625, 0.25};
	double want[STEPS], got[STEPS], given[STEPS];
	for (int k = 0; k < STEPS; k++) {
		want[k] = peak * factors[k];
		CHECK(fabs(dos_lr_schedule_factor(&scheduled.lr_schedule, (uint64_t)k + 1) - factors[k]) < 1e-15,
		      "factor of update %d: %.17g, expected %g", k + 1,
		      dos_lr_schedule_factor(&scheduled.lr_schedule, (uint64_t)k + 1), factors[k]);
	}
	static struct state by_schedule, by_hand, unscheduled;
	train_with_rates(scheduled, NULL, got, &by_schedule);
	for (int k = 0; k < STEPS; k++)
		CHECK(fabs(got[k] - want[k]) <= 1e-15 * peak, "update %d reports lr %.17g, expected %.17g", k + 1,
		      got[k], want[k]);
	/* the rates, set one by one on an optimizer without a schedule */
	train_with_rates(constant, got, given, &by_hand);
	same_state(&by_schedule, &by_hand, "a schedule against its rates set by dos_opt_set_lr");
	for (int k = 0; k < STEPS; k++)
		CHECK(given[k] == got[k], "update %d: set lr %.17g, reported %.17g", k + 1, got[k], given[k]);
	/* and the rates matter: the constant rate ends elsewhere */
	train_with_rates(constant, NULL, given, &unscheduled);
	CHECK(test_first_difference(by_schedule.master, unscheduled.master, N, 4) >= 0,
	      "the schedule changed nothing against a constant rate");

	struct app a;
	app_init(&a, DOS_FP32, DOS_BF16, 0);
	dos_opt_t opt;
	CHECK(dos_opt_create(&opt, &constant, T, a.tensors) == 0, "%s", dos_last_error());
	expect(dos_opt_set_lr(NULL, 1e-3), -EINVAL, "opt is NULL");
	expect(dos_opt_set_lr(opt, -1), -EINVAL, "lr = -1");
	expect(dos_opt_set_lr(opt, NAN), -EINVAL, "lr = nan");
	expect(dos_opt_set_lr(opt, 1e38), -EINVAL, "step size"); /* lr / (1 - beta1) overflows float */
	app_backward(&a, 0, DOS_BF16, NULL);
	struct dos_opt_step_report report;
	CHECK(dos_opt_submit_step(opt, &report) == 0 && report.lr == peak,
	      "after refused rates the step ran at %g, expected the unchanged %g", report.lr, peak);
	dos_opt_destroy(opt);
	app_free(&a);
	printf("learning-rate schedule: the rates reported, bit for bit as set by hand; 4 refusals\n");
}

/* ---- 5. a StarPU the API started ----------------------------------------------------------- */

static void api_owned_starpu(void)
{
	struct dos_opt_config cfg = base_config();
	struct app a, b;
	app_init(&a, DOS_FP32, DOS_BF16, 1);
	app_init(&b, DOS_FP32, DOS_BF16, 1);
	dos_opt_t first, second;
	CHECK(dos_opt_create(&first, &cfg, T, a.tensors) == 0, "%s", dos_last_error());
	CHECK(starpu_is_initialized(), "dos_opt_create did not start StarPU");
	CHECK(dos_opt_create(&second, &cfg, T, b.tensors) == 0, "%s", dos_last_error());
	struct dos_opt_info i1, i2;
	CHECK(dos_opt_get_info(first, &i1) == 0 && dos_opt_get_info(second, &i2) == 0, "info");
	CHECK(i1.owns_starpu && i2.owns_starpu && i1.sched_ctx == 0 && i2.sched_ctx != 0,
	      "the first optimizer runs StarPU's context under dos, the second its own (%u, %u)", i1.sched_ctx,
	      i2.sched_ctx);
	struct dos_sched_stats st;
	CHECK(dos_sched_get_stats(0, &st) == 0 && dos_sched_get_stats(i2.sched_ctx, &st) == 0,
	      "both contexts run the dos policy");
	app_backward(&a, 0, DOS_BF16, NULL);
	CHECK(dos_opt_submit_step(first, NULL) == 0, "%s", dos_last_error());
	dos_opt_destroy(first);
	CHECK(starpu_is_initialized(), "StarPU stopped while the second optimizer needs it");
	app_backward(&b, 0, DOS_BF16, NULL);
	CHECK(dos_opt_submit_step(second, NULL) == 0 && dos_opt_wait(second) == 0, "%s", dos_last_error());
	dos_opt_destroy(second);
	CHECK(!starpu_is_initialized(), "StarPU still runs after the last optimizer");
	app_free(&a);
	app_free(&b);
	printf("API-owned StarPU: started by the first optimizer, stopped with the last\n");
}

/* ---- 8. one owner for each tensor and each checkpoint folder ------------------------------- */

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	CHECK(f && fputs(text, f) >= 0 && fclose(f) == 0, "writing %s", path);
}

static int exists(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0;
}

static void one_owner_each(void)
{
	struct dos_opt_config cfg = base_config();
	struct app a, b;
	app_init(&a, DOS_FP32, DOS_BF16, 0);
	app_init(&b, DOS_FP32, DOS_BF16, 1);
	dos_opt_t opt, other = NULL;
	struct dos_opt_tensor x[T];
	CHECK(dos_opt_create(&opt, &cfg, T, a.tensors) == 0, "%s", dos_last_error());

	/* tensors: the same handles, one of them, or memory under them, in a second optimizer */
	expect(dos_opt_create(&other, &cfg, T, a.tensors), -EBUSY, "tensors[0].weight: handle");
	memcpy(x, b.tensors, sizeof x);
	x[1].grad_ptr = NULL;
	x[1].grad = a.hg[1];
	expect(dos_opt_create(&other, &cfg, T, x), -EBUSY, "is tensors[1].grad of another live optimizer");
	memcpy(x, b.tensors, sizeof x);
	x[2].weight_ptr = (float *)a.w[0] + 100; /* inside a's tensor 0, given as a buffer */
	expect(dos_opt_create(&other, &cfg, T, x), -EBUSY, "overlaps tensors[0].weight");
	/* overlapping buffers of one optimizer: two tensors, a weight and its own gradient */
	memcpy(x, b.tensors, sizeof x);
	x[1].grad_ptr = (float *)b.w[0] + numel[0] - 1;
	expect(dos_opt_create(&other, &cfg, T, x), -EINVAL, "tensors[0].weight (2800 bytes");
	memcpy(x, b.tensors, sizeof x);
	x[2].grad_ptr = (float *)b.w[2] + 1;
	expect(dos_opt_create(&other, &cfg, T, x), -EINVAL, "overlap: each weight and gradient needs memory");
	CHECK(other == NULL, "a refused create left an optimizer");

	/* folders: created with their parents; the optimizer that saves holds it */
	char top[] = "/tmp/dos-owner-XXXXXX", dir[4200], path[4200], latest[4200], junk[4300];
	CHECK(mkdtemp(top), "mkdtemp");
	snprintf(dir, sizeof dir, "%s/runs/one", top);
	app_backward(&a, 0, DOS_BF16, NULL);
	CHECK(dos_opt_submit_step(opt, NULL) == 0, "%s", dos_last_error());
	CHECK(dos_opt_save(opt, dir, 2, path, sizeof path) == 0, "save into a new folder: %s", dos_last_error());
	CHECK(dos_opt_create(&other, &cfg, T, b.tensors) == 0, "%s", dos_last_error());
	app_backward(&b, 0, DOS_BF16, NULL);
	CHECK(dos_opt_submit_step(other, NULL) == 0 && dos_opt_wait(other) == 0, "%s", dos_last_error());
	expect(dos_opt_save(other, dir, 2, NULL, 0), -EBUSY, "is in use by this process");
	/* released with its optimizer: then the folder is another run's for `other` */
	dos_opt_destroy(opt);
	expect(dos_opt_save(other, dir, 2, NULL, 0), -EEXIST,
	       "holds 1 checkpoint file of another run (checkpoint-1.dos");
	CHECK(dos_opt_latest_checkpoint(dir, latest, sizeof latest) == 0 && !strcmp(latest, path), "latest: %s",
	      dos_last_error());

	/* the newest that verifies, past damaged and stray files; stale temporaries removed
	 * when an optimizer takes the folder */
	snprintf(junk, sizeof junk, "%s/checkpoint-7.dos", dir);
	write_file(junk, "DOSCKPT");
	snprintf(junk, sizeof junk, "%s/checkpoint-18446744073709551615.dos", dir);
	write_file(junk, "");
	CHECK(dos_opt_latest_checkpoint(dir, latest, sizeof latest) == 0 && !strcmp(latest, path),
	      "latest past damaged files: %s (%s)", latest, dos_last_error());
	snprintf(junk, sizeof junk, "%s/.checkpoint-5.dos.tmp-99999", dir);
	write_file(junk, "half a save");
	/* `other` continues the run it loads: its saves go into that run's folder */
	CHECK(dos_opt_load(other, latest) == 0, "%s", dos_last_error());
	app_backward(&b, 1, DOS_BF16, NULL);
	CHECK(dos_opt_submit_step(other, NULL) == 0, "%s", dos_last_error());
	CHECK(dos_opt_save(other, dir, 2, path, sizeof path) == 0 && strstr(path, "checkpoint-2.dos"),
	      "save after loading the folder's run: %s", dos_last_error());
	CHECK(!exists(junk), "the temporary file of a killed save is still there");
	snprintf(junk, sizeof junk, "%s/checkpoint-7.dos", dir);
	CHECK(exists(junk), "retention removed a file it cannot read (%s)", junk);
	dos_opt_destroy(other);

	/* a fresh optimizer refuses a folder holding checkpoint files it cannot read */
	char bare[4200];
	snprintf(bare, sizeof bare, "%s/runs/bare", top);
	CHECK(mkdir(bare, 0755) == 0, "mkdir %s", bare);
	snprintf(junk, sizeof junk, "%s/checkpoint-3.dos", bare);
	write_file(junk, "not a checkpoint");
	CHECK(dos_opt_create(&opt, &cfg, T, a.tensors) == 0, "%s", dos_last_error());
	app_backward(&a, 0, DOS_BF16, NULL);
	CHECK(dos_opt_submit_step(opt, NULL) == 0, "%s", dos_last_error());
	expect(dos_opt_save(opt, bare, 2, NULL, 0), -EEXIST, "1 checkpoint file that cannot be read (checkpoint-3.dos");
	dos_opt_destroy(opt);
	char cmd[4300];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", top);
	CHECK(system(cmd) == 0, "%s", cmd);
	app_free(&a);
	app_free(&b);
	printf("one owner each: tensors shared with a live optimizer or overlapping refused; a checkpoint folder held "
	       "by one optimizer, of one run, stale temporaries removed, damaged checkpoints passed over\n");
}

/* ---- 9. an optimizer handed back after its end -------------------------------------------- */

/* Destroyed, or left behind by the application's starpu_shutdown: refused, not crashed
 * into (StarPU runs at the call; it is stopped before it returns). */
static void after_the_end(void)
{
	struct dos_opt_config cfg = base_config();
	struct app a;
	app_init(&a, DOS_FP32, DOS_BF16, 1);
	dos_opt_t opt;
	struct dos_opt_info info;
	CHECK(dos_opt_create(&opt, &cfg, T, a.tensors) == 0, "%s", dos_last_error());
	dos_opt_destroy(opt);
	expect(dos_opt_submit_step(opt, NULL), -EINVAL, "is not a live optimizer: dos_opt_destroy freed it");
	expect(dos_opt_get_info(opt, &info), -EINVAL, "is not a live optimizer");
	expect(dos_opt_save(opt, "/nonexistent", 1, NULL, 0), -EINVAL, "is not a live optimizer");
	dos_opt_destroy(opt); /* twice: refused */
	CHECK(strstr(dos_last_error(), "dos_opt_destroy: opt = ") != NULL, "a second destroy: '%s'", dos_last_error());

	/* the application stops StarPU first: the optimizer is left alone (it stays reachable
	 * from the list of live ones, so no leak is reported) */
	CHECK(dos_opt_create(&opt, &cfg, T, a.tensors) == 0, "%s", dos_last_error());
	app_backward(&a, 0, DOS_BF16, NULL);
	CHECK(dos_opt_submit_step(opt, NULL) == 0 && dos_opt_wait(opt) == 0, "%s", dos_last_error());
	starpu_shutdown();
	expect(dos_opt_submit_step(opt, NULL), -EINVAL, "StarPU is not running: starpu_shutdown was called");
	expect(dos_opt_save(opt, "/nonexistent", 1, NULL, 0), -EINVAL, "StarPU is not running");
	CHECK(dos_opt_get_info(opt, &info) == 0 && info.steps_submitted == 1, "info after starpu_shutdown");
	dos_opt_destroy(opt);
	CHECK(strstr(dos_last_error(), "dos_opt_destroy: StarPU is not running") != NULL,
	      "destroy after shutdown: '%s'", dos_last_error());
	app_free(&a);
	printf("after the end: a destroyed optimizer, and one whose StarPU was shut down, refused\n");
}

int main(void)
{
	CHECK(dos_version_number() == DOS_VERSION_NUMBER && !strcmp(dos_version_string(), DOS_VERSION_STRING) &&
		      DOS_VERSION_NUMBER == DOS_VERSION_MAJOR * 10000 + DOS_VERSION_MINOR * 100 + DOS_VERSION_PATCH,
	      "runtime version %s (%u) against compiled %s (%u)", dos_version_string(), dos_version_number(),
	      DOS_VERSION_STRING, DOS_VERSION_NUMBER);

	refusals_without_starpu();
	api_owned_starpu();

	test_starpu_init(NULL);
	refusals_with_starpu();
	one_owner_each();
	save_refuses_non_finite();
	sixteen_bit_and_buffers();
	clipping_and_loss_scaling();
	lr_schedules();
	after_the_end(); /* stops StarPU */
	printf("bad arguments: %d refusals, each naming the argument and its value, none with a side effect\n",
	       refusals);
	return 0;
}
