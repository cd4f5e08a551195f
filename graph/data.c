/* The corpus and the batch order (data.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data.h"
#include "errors.h"
#include "flat.h"
#include "host_memory.h"

int _dos_corpus_length_check(const char *path, uint64_t len, uint32_t seq_len)
{
	if (len < (uint64_t)seq_len + 1)
		return DOS_FAIL(-EINVAL, "the data file %s has %llu bytes, fewer than seq_len + 1 = %llu", path,
				(unsigned long long)len, (unsigned long long)seq_len + 1);
	/* the corpus is one StarPU vector of bytes, whose length is 32-bit */
	if (len > UINT32_MAX)
		return DOS_FAIL(-EINVAL, "the data file %s has %llu bytes, more than 2^32 - 1", path,
				(unsigned long long)len);
	return 0;
}

int _dos_corpus_split_check(uint64_t len, double fraction, uint32_t nseq, uint32_t seq_len, uint64_t *train_len,
			    uint32_t *eval_batches)
{
	if (!(fraction > 0 && fraction <= 0.5))
		return DOS_FAIL(-EINVAL, "eval_fraction = %g must be in (0, 0.5]", fraction);
	uint64_t held = (uint64_t)((double)len * fraction), train = len - held;
	/* a held-out sequence's targets reach one byte past it */
	uint64_t sequences = held > 0 ? (held - 1) / seq_len : 0;
	if (train < (uint64_t)seq_len + 1 || sequences < nseq)
		return DOS_FAIL(-EINVAL,
				"eval_fraction = %g of the %llu-byte corpus: %llu bytes for training (need %llu) and "
				"%llu held-out sequences of %u tokens (need a micro-batch of %u)",
				fraction, (unsigned long long)len, (unsigned long long)train,
				(unsigned long long)seq_len + 1, (unsigned long long)sequences, seq_len, nseq);
	*train_len = train;
	*eval_batches = (uint32_t)(sequences / nseq < UINT32_MAX ? sequences / nseq : UINT32_MAX);
	return 0;
}

int _dos_corpus_load(struct dos_corpus *out, const char *path, uint32_t seq_len, uint64_t seed)
{
	if (!out || !path)
		return DOS_FAIL(-EINVAL, "NULL argument (corpus %p, path %p)", (void *)out, (const void *)path);
	if (seq_len == 0)
		return DOS_FAIL(-EINVAL, "seq_len = 0: sequences need at least one token");
	/* O_NONBLOCK: a FIFO would block the open until something writes into it; it is
	 * refused below, as a directory is (it opens fine and reads as an error much later) */
	int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	FILE *f = fd < 0 ? NULL : fdopen(fd, "rb");
	if (!f) {
		int err = errno;
		if (fd >= 0)
			close(fd);
		return DOS_FAIL(-err, "cannot open the data file %s: %s", path, strerror(err));
	}
	struct stat st;
	if (fstat(fileno(f), &st) != 0) {
		int err = errno;
		fclose(f);
		return DOS_FAIL(-err, "cannot size the data file %s: %s", path, strerror(err));
	}
	if (!S_ISREG(st.st_mode)) {
		fclose(f);
		return DOS_FAIL(S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL, "the data file %s is not a regular file%s",
				path,
				S_ISDIR(st.st_mode)    ? " but a directory"
				: S_ISFIFO(st.st_mode) ? " but a FIFO"
						       : "");
	}
	uint64_t len = (uint64_t)st.st_size;
	int err = _dos_corpus_length_check(path, len, seq_len);
	if (err) {
		fclose(f);
		return err;
	}
	struct dos_corpus c = {0};
	char what[4200];
	snprintf(what, sizeof what, "the data file %s", path);
	err = _dos_host_alloc((void **)&c.bytes, (size_t)len, what, &c.pinned);
	if (err) {
		fclose(f);
		return err;
	}
	size_t got = fread(c.bytes, 1, (size_t)len, f);
	int read_error = ferror(f);
	fclose(f);
	if (got != (size_t)len || read_error) {
		_dos_host_free(c.bytes, (size_t)len, c.pinned);
		return DOS_FAIL(-EIO, "short read of the data file %s (%zu of %llu bytes)", path, got,
				(unsigned long long)len);
	}
	c.len = c.train_len = len;
	c.rng = seed ^ DOS_DATA_SEED_MIX;
	starpu_vector_data_register(&c.handle, STARPU_MAIN_RAM, (uintptr_t)c.bytes, (uint32_t)len, 1);
	*out = c;
	return 0;
}

void _dos_corpus_free(struct dos_corpus *c)
{
	if (!c || !c->bytes)
		return;
	starpu_data_unregister(c->handle);
	_dos_host_free(c->bytes, c->len, c->pinned);
	*c = (struct dos_corpus){0};
}

/* Registers the ids and targets of the sequences starting at starts[0 .. nseq) and submits
 * the task that fills them, in `phase` (it frees starts). */
static int submit_batch(struct dos_corpus *c, uint64_t *starts, uint32_t nseq, uint32_t seq_len, unsigned sched_ctx,
			enum _dos_task_phase phase, starpu_data_handle_t *ids, starpu_data_handle_t *targets)
{
	uint32_t n = nseq * seq_len;
	starpu_vector_data_register(ids, -1, 0, n, sizeof(int32_t));
	starpu_vector_data_register(targets, -1, 0, n, sizeof(int32_t));
	struct starpu_task *task =
		starpu_task_build(&_dos_batch_codelet, STARPU_R, c->handle, STARPU_W, *ids, STARPU_W, *targets,
				  STARPU_CL_ARGS, starts, nseq * sizeof *starts, STARPU_SCHED_CTX, sched_ctx, 0);
	if (!task)
		return DOS_FAIL(-ENOMEM, "no memory for the batch task");
	if (c->hook)
		c->hook(c->hook_arg, task, phase, DOS_NO_SUBGROUP);
	int err = starpu_task_submit(task);
	if (err)
		starpu_task_destroy(task);
	return err ? DOS_FAIL(err, "submitting the batch task failed (%d)", err) : 0;
}

int _dos_corpus_next_batch(struct dos_corpus *c, uint32_t nseq, uint32_t seq_len, unsigned sched_ctx,
			   starpu_data_handle_t *ids, starpu_data_handle_t *targets)
{
	uint64_t *starts = malloc(nseq * sizeof *starts);
	if (!starts)
		return DOS_FAIL(-ENOMEM, "no memory for %u batch offsets", nseq);
	for (uint32_t s = 0; s < nseq; s++)
		starts[s] = _dos_splitmix64(&c->rng) % (c->train_len - seq_len);
	return submit_batch(c, starts, nseq, seq_len, sched_ctx, DOS_TASK_DATA, ids, targets);
}

int _dos_corpus_hold_out(struct dos_corpus *c, double fraction, uint32_t nseq, uint32_t seq_len, uint32_t *eval_batches)
{
	uint64_t train;
	uint32_t batches;
	int err = _dos_corpus_split_check(c->len, fraction, nseq, seq_len, &train, &batches);
	if (err)
		return err;
	c->train_len = train;
	*eval_batches = batches;
	return 0;
}

int _dos_corpus_eval_batch(struct dos_corpus *c, uint32_t index, uint32_t nseq, uint32_t seq_len, unsigned sched_ctx,
			   starpu_data_handle_t *ids, starpu_data_handle_t *targets)
{
	uint64_t *starts = malloc(nseq * sizeof *starts);
	if (!starts)
		return DOS_FAIL(-ENOMEM, "no memory for %u batch offsets", nseq);
	for (uint32_t s = 0; s < nseq; s++)
		starts[s] = c->train_len + ((uint64_t)index * nseq + s) * seq_len;
	return submit_batch(c, starts, nseq, seq_len, sched_ctx, DOS_TASK_EVALUATION, ids, targets);
}

void _dos_corpus_skip_batch(struct dos_corpus *c, uint32_t nseq)
{
	for (uint32_t s = 0; s < nseq; s++)
		(void)_dos_splitmix64(&c->rng);
}
