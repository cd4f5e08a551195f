/* Training data: the corpus (bytes are tokens) and the reproducible order in which
 * micro-batches are drawn from it (docs/model.md: the PyTorch reference draws the same). */
#ifndef DOS_DATA_H
#define DOS_DATA_H

#include <starpu.h>
#include <stddef.h>
#include <stdint.h>

#include "init_state.h"
#include "phase.h"

/* splitmix64: the generator of docs/model.md, for weights and batches alike (its mixing
 * function in init_state.h, which also computes any weight's draw directly). */
static inline uint64_t _dos_splitmix64(uint64_t *state)
{
	return dos_splitmix64_mix(*state += DOS_SPLITMIX64_GAMMA);
}

#define DOS_DATA_SEED_MIX 0xD1B54A32D192ED03ull

struct dos_corpus {
	uint8_t *bytes; /* from _dos_host_alloc (pinned when CUDA workers exist and it can be) */
	int pinned;
	uint64_t len;
	/* training batches come from bytes [0, train_len); [train_len, len) is held out for
	 * evaluation (_dos_corpus_hold_out; train_len = len without) */
	uint64_t train_len;
	starpu_data_handle_t handle; /* the bytes as a vector of uint8, home in main memory */
	uint64_t rng;                /* batch-order generator */
	/* optional: every batch task, before its submission (phase.h): a training
	 * micro-batch's in DOS_TASK_DATA, a held-out one's in DOS_TASK_EVALUATION */
	_dos_task_hook hook;
	void *hook_arg;
};

/* The rules a data file of `len` bytes meets before it is read (dos-train applies them
 * from the file's size before StarPU starts): at least seq_len + 1 bytes, one sequence and
 * its last target, and at most 2^32 - 1 (one StarPU vector). 0 or -EINVAL naming the file
 * and the sizes. */
int _dos_corpus_length_check(const char *path, uint64_t len, uint32_t seq_len);

/* The split _dos_corpus_hold_out makes of a corpus of `len` bytes, or why it cannot: the
 * same rule and message, from the size alone. */
int _dos_corpus_split_check(uint64_t len, double fraction, uint32_t nseq, uint32_t seq_len, uint64_t *train_len,
			    uint32_t *eval_batches);

/* Reads `path` (after starpu_init) and registers it. Errors: -EINVAL for NULL arguments,
 * seq_len 0, a file shorter than seq_len + 1 or longer than 2^32 - 1 bytes (the message
 * names the file and the sizes), -EISDIR for a directory, -errno when it cannot be read
 * (the message names the file), -ENOMEM. *c is left untouched then. */
int _dos_corpus_load(struct dos_corpus *c, const char *path, uint32_t seq_len, uint64_t seed);
void _dos_corpus_free(struct dos_corpus *c);

/* Draws the next micro-batch of `nseq` sequences of `seq_len` tokens: returns registered
 * ids and targets handles (int32, no home: StarPU allocates them where they are used) and
 * submits the task that fills them. The caller unregisters them (submit) after their last
 * use. Returns 0 or a negative errno. */
int _dos_corpus_next_batch(struct dos_corpus *c, uint32_t nseq, uint32_t seq_len, unsigned sched_ctx,
			   starpu_data_handle_t *ids, starpu_data_handle_t *targets);

/* Holds out the last `fraction` of the corpus (in (0, 0.5]) for evaluation: training
 * batches are drawn from the rest from now on (another order than without a held-out
 * part). *eval_batches receives the number of whole micro-batches of `nseq` sequences of
 * `seq_len` tokens the held-out part holds, side by side. Errors: -EINVAL naming the
 * fraction when it is out of range, or leaves fewer than seq_len + 1 bytes for training
 * or fewer than nseq sequences held out (the message names the sizes); *c unchanged. */
int _dos_corpus_hold_out(struct dos_corpus *c, double fraction, uint32_t nseq, uint32_t seq_len,
			 uint32_t *eval_batches);

/* Like _dos_corpus_next_batch, the held-out micro-batch `index` (< _dos_corpus_hold_out's
 * count): the same tokens every time, without touching the batch order. */
int _dos_corpus_eval_batch(struct dos_corpus *c, uint32_t index, uint32_t nseq, uint32_t seq_len, unsigned sched_ctx,
			   starpu_data_handle_t *ids, starpu_data_handle_t *targets);

/* Advances the batch order past a micro-batch of `nseq` sequences another rank of a
 * data-parallel job draws: every rank keeps the same generator state. */
void _dos_corpus_skip_batch(struct dos_corpus *c, uint32_t nseq);

#endif /* DOS_DATA_H */
