/* libFuzzer target for dos-train's command line (dos_train_parse_options,
 * tools/train_options.c). Built and run by tools/fuzz.sh (`make fuzz`), not by the
 * autotools build; see tests/fuzz/README.md.
 *
 * An input is a command line: words separated by NUL or newline bytes (at most
 * MAX_WORDS words of at most MAX_WORD bytes; longer ones are cut, one empty word after a
 * final separator is dropped), each in its own allocation of its exact size so that
 * AddressSanitizer sees any read past a word's end. "dos-train" goes before them.
 *
 * Every command line is parsed twice, from two fresh copies of argv (getopt_long permutes
 * the one it is given): both parses must agree, which they do only if the parser resets
 * getopt's state, and keeps none of its own. The oracle, from train_options.h's contract
 * and dos-train's --help:
 *  - the result is one of run, help, bad usage; bad usage writes to err, run does not
 *    (help writes to stdout, sent to /dev/null here, after any messages about options
 *    before --help);
 *  - on run: every shape size >= 1; params is the count of docs/model.md in 128 bits (so
 *    it did not wrap), >= 1, and _dos_model_param_count's value (asked only up to
 *    MAX_WALKED_LAYERS layers: it walks them); steps in
 *    [1, 2^63 - 1], micro-batch and accumulation in [1, 2^20]; the subgroup size >= 1,
 *    and the preset's capped at params unless a --su... word gave it; dtypes match the
 *    precision's name; the loss scale is 0 (off) or >= 1, finite, dynamic exactly when
 *    > 0, and the precision's default unless a --lo... word gave it; AdamW's and
 *    clipping's numbers finite; --resume and --checkpoint-every only with a directory;
 *    every string is a constant default or lies within one of the words;
 *  - no leak (libFuzzer's leak check), no sanitizer report.
 * A broken rule calls abort(), which libFuzzer reports as a crash with the input saved.
 *
 * Only train_options.c, graph/model.c (for _dos_model_param_count), base/parse.c,
 * base/errors.c and codelets/step.c (Adam's hyperparameters) are linked, without
 * libstarpu: the rest of graph/model.c creates StarPU tasks and data, which the parser
 * never reaches, so the StarPU functions and model codelets it refers to are stand-ins at
 * the end of this file that abort if called. */
#define _GNU_SOURCE
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codelet_util.h"
#include "host_memory.h"
#include "model_codelets.h"
#include "train_options.h"

#define MAX_WORDS 64
#define MAX_WORD 256
#define MAX_WALKED_LAYERS 65536

#define REQUIRE(cond, ...)                                                                       \
	do {                                                                                     \
		if (!(cond)) {                                                                   \
			fprintf(stderr, "fuzz_options: %s:%d: %s: ", __FILE__, __LINE__, #cond); \
			fprintf(stderr, __VA_ARGS__);                                            \
			fprintf(stderr, "\n");                                                   \
			abort();                                                                 \
		}                                                                                \
	} while (0)

/* err: a stream that keeps nothing and counts the bytes written to it (unbuffered, so
 * the count is current after every call). Opened once. */
static size_t err_bytes;

static ssize_t count_write(void *cookie, const char *buf, size_t size)
{
	(void)cookie;
	(void)buf;
	err_bytes += size;
	return (ssize_t)size;
}

static FILE *err_stream;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	err_stream = fopencookie(NULL, "w", (cookie_io_functions_t){.write = count_write});
	if (!err_stream || setvbuf(err_stream, NULL, _IONBF, 0) != 0) {
		fprintf(stderr, "fuzz_options: cannot open the counting stream\n");
		exit(1);
	}
	/* --help's text would fill libFuzzer's log */
	if (!freopen("/dev/null", "w", stdout)) {
		fprintf(stderr, "fuzz_options: cannot send stdout to /dev/null\n");
		exit(1);
	}
	return 0;
}

struct words {
	int n;
	char *word[MAX_WORDS];
	size_t len[MAX_WORDS];
};

static void split(const uint8_t *data, size_t size, struct words *w)
{
	w->n = 0;
	size_t start = 0;
	while (start <= size && w->n < MAX_WORDS) {
		size_t end = start;
		while (end < size && data[end] != 0 && data[end] != '\n')
			end++;
		if (end == size && start == size && size > 0)
			break; /* the empty word after a final separator */
		size_t len = end - start < MAX_WORD ? end - start : MAX_WORD;
		char *word = malloc(len + 1);
		REQUIRE(word, "no memory");
		memcpy(word, data + start, len);
		word[len] = 0;
		w->word[w->n] = word;
		w->len[w->n++] = len;
		start = end + 1;
	}
}

/* Whether p points into one of the words (a whole word, or the value after '=' in
 * --option=value). */
static bool in_words(const struct words *w, const char *p)
{
	for (int i = 0; i < w->n; i++)
		if (p >= w->word[i] && p <= w->word[i] + w->len[i])
			return true;
	return false;
}

/* Whether some word starts with prefix (getopt_long takes any unambiguous abbreviation,
 * so "--su" and longer are --subgroup-size, "--lo" and longer --loss-scale). */
static bool some_word_starts(const struct words *w, const char *prefix)
{
	for (int i = 0; i < w->n; i++)
		if (!strncmp(w->word[i], prefix, strlen(prefix)))
			return true;
	return false;
}

/* A string of the result: NULL when allowed, a constant default, or within a word. */
static void check_string(const struct words *w, const char *what, const char *s, bool may_be_null,
			 const char *default_value)
{
	if (!s) {
		REQUIRE(may_be_null, "%s is NULL", what);
		return;
	}
	REQUIRE(in_words(w, s) || (default_value && !strcmp(s, default_value)),
		"%s = '%s' is neither its default nor within a word of the command line", what, s);
}

/* docs/model.md's parameter count, in 128 bits: never wraps for 32-bit sizes. */
static unsigned __int128 model_md_params(const struct dos_model_shape *s)
{
	unsigned __int128 V = s->vocab, d = s->hidden, F = s->ffn, T = s->seq_len, L = s->layers;
	unsigned __int128 per_layer = d + 3 * d * d + d * d + d + F * d + d * F;
	return V * d + T * d + L * per_layer + d + V * d;
}

static void check_run(const struct words *w, const struct train_options *o)
{
	const struct dos_train_config *c = &o->cfg;
	static const char *const preset_names[] = {"tiny", "small", "1b", "7b", "13b", "20b"};
	bool known = false;
	REQUIRE(o->preset, "no preset");
	for (size_t i = 0; i < sizeof preset_names / sizeof *preset_names; i++)
		known |= !strcmp(o->preset->name, preset_names[i]);
	REQUIRE(known, "unknown preset '%s'", o->preset->name);

	const struct dos_model_shape *s = &c->shape;
	REQUIRE(s->vocab && s->hidden && s->heads && s->ffn && s->layers && s->seq_len,
		"a shape size is 0: V %u, hidden %u, heads %u, FFN %u, layers %u, seq %u", s->vocab, s->hidden,
		s->heads, s->ffn, s->layers, s->seq_len);
	/* _dos_model_param_count walks the layers: asked only of shapes it counts quickly */
	if (s->layers <= MAX_WALKED_LAYERS)
		REQUIRE(o->params == _dos_model_param_count(s, NULL),
			"params %llu is not _dos_model_param_count's %llu", (unsigned long long)o->params,
			(unsigned long long)_dos_model_param_count(s, NULL));
	REQUIRE(o->params == model_md_params(s) && o->params >= 1,
		"params %llu is not docs/model.md's count (wrapped?): V %u, hidden %u, FFN %u, layers %u, seq %u",
		(unsigned long long)o->params, s->vocab, s->hidden, s->ffn, s->layers, s->seq_len);

	REQUIRE(c->steps >= 1 && c->steps <= UINT64_MAX / 2, "steps %llu", (unsigned long long)c->steps);
	REQUIRE(c->micro_batch >= 1 && c->micro_batch <= 1u << 20, "micro-batch %u", c->micro_batch);
	REQUIRE(c->accumulation >= 1 && c->accumulation <= 1u << 20, "accumulation %u", c->accumulation);
	uint64_t sub = c->opt.subgroup_size;
	REQUIRE(sub >= 1, "subgroup size 0");
	if (!some_word_starts(w, "--su")) {
		uint64_t want = o->preset->subgroup_size < o->params ? o->preset->subgroup_size : o->params;
		REQUIRE(sub == want, "subgroup size %llu, not the preset's %llu capped at params %llu",
			(unsigned long long)sub, (unsigned long long)o->preset->subgroup_size,
			(unsigned long long)o->params);
	}

	static const struct {
		const char *name;
		enum dos_dtype dtype;
	} precisions[] = {{"fp32", DOS_FP32}, {"bf16", DOS_BF16}, {"fp16", DOS_FP16}};
	bool matched = false;
	REQUIRE(o->precision, "precision is NULL");
	for (size_t i = 0; i < sizeof precisions / sizeof *precisions; i++)
		if (!strcmp(o->precision, precisions[i].name)) {
			REQUIRE(c->opt.weight_dtype == precisions[i].dtype && c->opt.grad_dtype == precisions[i].dtype,
				"precision %s with dtypes %d and %d", o->precision, c->opt.weight_dtype,
				c->opt.grad_dtype);
			matched = true;
		}
	REQUIRE(matched, "precision '%s' accepted", o->precision);

	double scale = c->opt.loss_scale_init;
	REQUIRE(isfinite(scale) && (scale == 0 || scale >= 1), "loss scale %g", scale);
	REQUIRE(c->opt.dynamic_loss_scale == (scale > 0), "dynamic loss scale %d with scale %g",
		c->opt.dynamic_loss_scale, scale);
	if (!some_word_starts(w, "--lo"))
		REQUIRE(scale == (c->opt.weight_dtype == DOS_FP16 ? 65536 : 0), "default loss scale %g for %s", scale,
			o->precision);
	REQUIRE(c->opt.loss_scale_window == 1000, "loss-scale window %u", c->opt.loss_scale_window);
	REQUIRE(c->opt.hp.mode == DOS_ADAMW, "optimizer mode %d", (int)c->opt.hp.mode);
	const double numbers[] = {c->opt.hp.lr,
				  c->opt.hp.beta1,
				  c->opt.hp.beta2,
				  c->opt.hp.eps,
				  c->opt.hp.weight_decay,
				  c->opt.clip_norm,
				  c->opt.lr_schedule.min_ratio,
				  c->eval_fraction};
	for (size_t i = 0; i < sizeof numbers / sizeof *numbers; i++)
		REQUIRE(isfinite(numbers[i]), "AdamW/clip/schedule number %zu is %g", i, numbers[i]);

	REQUIRE(!(c->resume || c->checkpoint_every) || c->checkpoint_dir,
		"--resume (%d) or --checkpoint-every (%llu) without --checkpoint-dir", c->resume,
		(unsigned long long)c->checkpoint_every);
	REQUIRE(!c->on_step && !c->hook && !c->before_last_step && !c->sched_ctx, "callbacks or context set");
	REQUIRE(o->quiet == 0 || o->quiet == 1, "quiet %d", o->quiet);

	check_string(w, "policy", o->policy, false, "dos");
	check_string(w, "precision", o->precision, false, "fp32");
	check_string(w, "plot", o->plot, true, NULL);
	check_string(w, "trace", o->trace, true, NULL);
	check_string(w, "dump", o->dump, true, NULL);
	check_string(w, "simulate", o->simulate, true, NULL);
	check_string(w, "data", c->data_path, true, NULL);
	check_string(w, "checkpoint-dir", c->checkpoint_dir, true, NULL);
}

/* Two results of the same command line hold the same settings (numbers bit for bit,
 * strings the same pointers into the words). Field by field: padding is not compared. */
static void check_same(const struct train_options *x, const struct train_options *y)
{
#define SAME(field) REQUIRE(!memcmp(&x->field, &y->field, sizeof x->field), "two parses differ in " #field)
	SAME(cfg.shape.vocab);
	SAME(cfg.shape.hidden);
	SAME(cfg.shape.heads);
	SAME(cfg.shape.ffn);
	SAME(cfg.shape.layers);
	SAME(cfg.shape.seq_len);
	SAME(cfg.micro_batch);
	SAME(cfg.accumulation);
	SAME(cfg.steps);
	SAME(cfg.seed);
	SAME(cfg.checkpoint_activations);
	SAME(cfg.data_path);
	SAME(cfg.opt.subgroup_size);
	SAME(cfg.opt.weight_dtype);
	SAME(cfg.opt.grad_dtype);
	SAME(cfg.opt.hp.mode);
	SAME(cfg.opt.hp.lr);
	SAME(cfg.opt.hp.beta1);
	SAME(cfg.opt.hp.beta2);
	SAME(cfg.opt.hp.eps);
	SAME(cfg.opt.hp.weight_decay);
	SAME(cfg.eval_every);
	SAME(cfg.eval_fraction);
	SAME(cfg.eval_batches);
	SAME(cfg.opt.lr_schedule.warmup_steps);
	SAME(cfg.opt.lr_schedule.decay_steps);
	SAME(cfg.opt.lr_schedule.min_ratio);
	SAME(cfg.opt.clip_norm);
	SAME(cfg.opt.dynamic_loss_scale);
	SAME(cfg.opt.loss_scale_init);
	SAME(cfg.opt.loss_scale_window);
	SAME(cfg.checkpoint_dir);
	SAME(cfg.checkpoint_every);
	SAME(cfg.resume);
	SAME(preset);
	SAME(params);
	SAME(policy);
	SAME(precision);
	SAME(plot);
	SAME(trace);
	SAME(dump);
	SAME(simulate);
	SAME(quiet);
#undef SAME
}

/* One parse of a fresh argv: "dos-train" and the words. */
static int parse(const struct words *w, struct train_options *o, size_t *err_written)
{
	char program[] = "dos-train";
	char *argv[MAX_WORDS + 2];
	argv[0] = program;
	for (int i = 0; i < w->n; i++)
		argv[i + 1] = w->word[i];
	argv[w->n + 1] = NULL;
	err_bytes = 0;
	int rc = dos_train_parse_options(w->n + 1, argv, o, err_stream);
	*err_written = err_bytes;
	return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct words w;
	split(data, size, &w);

	struct train_options first, second;
	size_t err_first, err_second;
	int rc = parse(&w, &first, &err_first);
	REQUIRE(rc == TRAIN_OPTIONS_RUN || rc == TRAIN_OPTIONS_HELP || rc == TRAIN_OPTIONS_BAD, "result %d", rc);
	/* help may follow messages: --steps 0 --help says what is wrong with --steps, then helps */
	REQUIRE(rc == TRAIN_OPTIONS_HELP || (rc == TRAIN_OPTIONS_BAD) == (err_first > 0),
		"result %d with %zu bytes written to err", rc, err_first);
	if (rc == TRAIN_OPTIONS_RUN)
		check_run(&w, &first);

	int rc2 = parse(&w, &second, &err_second);
	REQUIRE(rc2 == rc && err_second == err_first, "a second parse gave %d (%zu bytes to err), the first %d (%zu)",
		rc2, err_second, rc, err_first);
	if (rc == TRAIN_OPTIONS_RUN)
		check_same(&first, &second);

	for (int i = 0; i < w.n; i++)
		free(w.word[i]);
	return 0;
}

/* ---- graph/model.c without StarPU ----------------------------------------------------
 * Stand-ins for what the StarPU half of graph/model.c refers to (_dos_model_create,
 * _dos_model_submit_microbatch, ...), so that it links without libstarpu. The parser only
 * calls _dos_model_param_count; reaching any of these is a bug. When graph/model.c comes to
 * use another StarPU function, the link in tools/fuzz.sh names it: add it here. */
static _Noreturn void stand_in(const char *name)
{
	fprintf(stderr, "fuzz_options: %s called: the option parser must not reach StarPU\n", name);
	abort();
}

unsigned starpu_cuda_worker_get_count(void)
{
	stand_in(__func__);
}
void starpu_data_unregister(starpu_data_handle_t handle)
{
	stand_in(__func__);
}
void starpu_data_unregister_submit(starpu_data_handle_t handle)
{
	stand_in(__func__);
}
int starpu_malloc_flags(void **A, size_t dim, int flags)
{
	stand_in(__func__);
}
int starpu_free_flags(void *A, size_t dim, int flags)
{
	stand_in(__func__);
}
struct starpu_task *starpu_task_create(void)
{
	stand_in(__func__);
}
int(starpu_task_submit)(struct starpu_task *task) /* a macro when StarPU has FxT */
{
	stand_in(__func__);
}
void starpu_vector_data_register(starpu_data_handle_t *handle, int home_node, uintptr_t ptr, uint32_t nx,
				 size_t elemsize)
{
	stand_in(__func__);
}
uint32_t starpu_vector_get_nx(starpu_data_handle_t handle)
{
	stand_in(__func__);
}
int _dos_check_sched_ctx(const char *function, const char *name, unsigned sched_ctx)
{
	stand_in(__func__);
}
int _dos_host_alloc(void **ptr, size_t bytes, const char *what, int *pinned)
{
	stand_in(__func__);
}
void _dos_host_free(void *ptr, size_t bytes, int pinned)
{
	stand_in(__func__);
}
void _dos_model_codelets_prepare(void)
{
	stand_in(__func__);
}
struct starpu_codelet _dos_embed_fwd_codelet, _dos_embed_bwd_codelet, _dos_rmsnorm_fwd_codelet,
	_dos_rmsnorm_bwd_codelet, _dos_linear_fwd_codelet, _dos_linear_bwd_data_codelet, _dos_linear_bwd_weight_codelet,
	_dos_attention_fwd_codelet, _dos_attention_bwd_codelet, _dos_gelu_fwd_codelet, _dos_gelu_bwd_codelet,
	_dos_xent_codelet, _dos_linear_fwd16_codelet, _dos_linear_bwd_data16_codelet, _dos_linear_bwd_weight16_codelet,
	_dos_attention_fwd16_codelet, _dos_attention_bwd16_codelet;
