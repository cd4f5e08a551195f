/* Evaluation on held-out data (graph/data.h's _dos_corpus_hold_out and eval batches,
 * graph/model.h's _dos_model_submit_eval):
 *  1. once the last part of the corpus is held out, no training batch reads a byte of it,
 *     and the held-out micro-batches are its consecutive sequences, the same every time;
 *  2. an evaluation's per-token losses are bit for bit those of a training forward of the
 *     same batch with the same weights (fp32 and bf16, with and without activation
 *     checkpointing), and it writes no gradient;
 *  3. hold-out sizes that leave too little to train on or to evaluate are refused with
 *     a message naming the fraction and the sizes, and the corpus is left as it was. */
#include <errno.h>
#include <string.h>

#include "data.h"
#include "model.h"
#include "test_starpu.h"
#include "test_util.h"

#define T 16 /* tokens per sequence */
#define B 3  /* sequences per micro-batch */

/* The B * T elements of a batch's tokens or losses, read back to the host; the handle is
 * unregistered. */
static void read_back(starpu_data_handle_t h, void *out)
{
	starpu_data_acquire(h, STARPU_R);
	memcpy(out, (const void *)starpu_vector_get_local_ptr(h), B * T * starpu_vector_get_elemsize(h));
	starpu_data_release(h);
	starpu_data_unregister(h);
}

static void held_out_data(const char *path)
{
	struct dos_corpus c;
	CHECK(_dos_corpus_load(&c, path, T, 7) == 0, "%s", dos_last_error());
	uint64_t len = c.len;
	uint32_t batches = 0;
	/* refusals: out of range, and a corpus part too small for a micro-batch */
	const double bad[] = {0.0, -0.1, 0.6, NAN};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		CHECK(_dos_corpus_hold_out(&c, bad[i], B, T, &batches) == -EINVAL, "fraction %g accepted", bad[i]);
		CHECK(strstr(dos_last_error(), "eval_fraction = ") && strstr(dos_last_error(), "(0, 0.5]"),
		      "message '%s' does not name the fraction and its range", dos_last_error());
	}
	double tiny = (double)(B * T) / (double)len; /* fewer than B sequences of T + 1 bytes */
	CHECK(_dos_corpus_hold_out(&c, tiny, B, T, &batches) == -EINVAL,
	      "a held-out part under a micro-batch accepted");
	CHECK(strstr(dos_last_error(), "held-out sequences of 16 tokens (need a micro-batch of 3)"), "message '%s'",
	      dos_last_error());
	CHECK(c.train_len == len && batches == 0, "a refused hold-out changed the corpus or the count");

	CHECK(_dos_corpus_hold_out(&c, 0.1, B, T, &batches) == 0, "%s", dos_last_error());
	uint64_t held = len - c.train_len;
	CHECK(held == (uint64_t)((double)len * 0.1) && batches == (held - 1) / T / B,
	      "held out %llu of %llu bytes in %u batches", (unsigned long long)held, (unsigned long long)len, batches);

	/* every training sequence lies in [0, train_len): its tokens and targets match the
	 * corpus at a start below train_len - T (the last target at train_len - 1 at most) */
	int32_t ids[B * T], targets[B * T];
	for (int k = 0; k < 200; k++) {
		starpu_data_handle_t hi, ht;
		CHECK(_dos_corpus_next_batch(&c, B, T, 0, &hi, &ht) == 0, "%s", dos_last_error());
		read_back(hi, ids);
		read_back(ht, targets);
		for (int s = 0; s < B; s++) {
			int found = 0;
			for (uint64_t at = 0; at + T < c.train_len && !found; at++) {
				found = 1;
				for (int i = 0; i < T && found; i++)
					found = ids[s * T + i] == c.bytes[at + i] &&
						targets[s * T + i] == c.bytes[at + i + 1];
			}
			CHECK(found, "training batch %d, sequence %d: not a sequence of the first %llu bytes", k, s,
			      (unsigned long long)c.train_len);
		}
	}
	/* held-out batch i: sequences train_len + (i B + s) T, the same on every call */
	for (uint32_t i = 0; i < batches; i++)
		for (int again = 0; again < 2; again++) {
			starpu_data_handle_t hi, ht;
			CHECK(_dos_corpus_eval_batch(&c, i, B, T, 0, &hi, &ht) == 0, "%s", dos_last_error());
			read_back(hi, ids);
			read_back(ht, targets);
			for (int s = 0; s < B; s++)
				for (int t = 0; t < T; t++) {
					uint64_t at = c.train_len + ((uint64_t)i * B + s) * T + t;
					CHECK(at + 1 < len && ids[s * T + t] == c.bytes[at] &&
						      targets[s * T + t] == c.bytes[at + 1],
					      "held-out batch %u, sequence %d, token %d is not corpus byte %llu", i, s,
					      t, (unsigned long long)at);
				}
		}
	_dos_corpus_free(&c);
	printf("held-out data: %llu of %llu bytes, %u micro-batches; 200 training batches outside it; 5 refusals\n",
	       (unsigned long long)held, (unsigned long long)len, batches);
}

/* Sets every weight gradient to NaN. */
static void poison_gradients(struct dos_model *m)
{
	for (uint32_t t = 0; t < m->ntensors; t++) {
		starpu_data_acquire(m->grad[t], STARPU_W);
		float *g = (float *)starpu_vector_get_local_ptr(m->grad[t]);
		for (uint32_t i = 0; i < starpu_vector_get_nx(m->grad[t]); i++)
			g[i] = NAN;
		starpu_data_release(m->grad[t]);
	}
}

static void eval_equals_training_forward(const char *path, enum dos_dtype dtype, int checkpoint)
{
	struct dos_model_shape shape = {.vocab = 256, .hidden = 32, .heads = 4, .ffn = 64, .layers = 2, .seq_len = T};
	struct dos_model m;
	CHECK(_dos_model_create(&m, &shape, B, 11, dtype, checkpoint, 0, 0) == 0, "%s", dos_last_error());
	struct dos_corpus c;
	uint32_t batches;
	CHECK(_dos_corpus_load(&c, path, T, 7) == 0 && _dos_corpus_hold_out(&c, 0.2, B, T, &batches) == 0, "%s",
	      dos_last_error());
	float trained[B * T], evaluated[B * T];
	for (uint32_t i = 0; i < 2; i++) {
		poison_gradients(&m); /* an evaluation must leave them so */
		starpu_data_handle_t ids, targets, loss;
		CHECK(_dos_corpus_eval_batch(&c, i, B, T, 0, &ids, &targets) == 0 &&
			      _dos_model_submit_eval(&m, ids, targets, &loss) == 0,
		      "%s", dos_last_error());
		read_back(loss, evaluated);
		for (uint32_t t = 0; t < m.ntensors; t++) {
			starpu_data_acquire(m.grad[t], STARPU_R);
			const float *g = (const float *)starpu_vector_get_local_ptr(m.grad[t]);
			for (uint32_t k = 0; k < starpu_vector_get_nx(m.grad[t]); k++)
				CHECK(isnan(g[k]), "the evaluation wrote gradient %u[%u]", t, k);
			starpu_data_release(m.grad[t]);
		}
		CHECK(_dos_corpus_eval_batch(&c, i, B, T, 0, &ids, &targets) == 0 &&
			      _dos_model_submit_microbatch(&m, ids, targets, 1.0f, 0, &loss) == 0,
		      "%s", dos_last_error());
		read_back(loss, trained);
		for (int k = 0; k < B * T; k++)
			CHECK(memcmp(&trained[k], &evaluated[k], sizeof(float)) == 0 && isfinite(trained[k]) &&
				      trained[k] > 0,
			      "%s%s batch %u token %d: evaluation %.9g, training forward %.9g", dos_dtype_name(dtype),
			      checkpoint ? " checkpointed" : "", i, k, evaluated[k], trained[k]);
	}
	starpu_task_wait_for_all();
	_dos_corpus_free(&c);
	_dos_model_destroy(&m);
	printf("evaluation == training forward, bit for bit, no gradient written: %s%s\n", dos_dtype_name(dtype),
	       checkpoint ? ", activation checkpointing" : "");
}

int main(void)
{
	const char *src = getenv("DOS_SOURCE_DIR");
	char path[4096];
	snprintf(path, sizeof path, "%s/data/corpus.txt", src ? src : "..");
	test_starpu_init(NULL);
	held_out_data(path);
	eval_equals_training_forward(path, DOS_FP32, 0);
	eval_equals_training_forward(path, DOS_FP32, 1);
	eval_equals_training_forward(path, DOS_BF16, 0);
	starpu_shutdown();
	return 0;
}
