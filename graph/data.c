/* The corpus and the batch order (data.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data.h"
#include "errors.h"
#include "flat.h"

int dos_corpus_load(struct dos_corpus *c, const char *path, uint32_t seq_len, uint64_t seed)
{
	if (!c || !path)
		return DOS_FAIL(-EINVAL, "corpus or path is NULL");
	*c = (struct dos_corpus){0};
	FILE *f = fopen(path, "rb");
	if (!f)
		return DOS_FAIL(-errno, "cannot open the data file %s: %s", path, strerror(errno));
	long len = -1;
	if (fseek(f, 0, SEEK_END) == 0)
		len = ftell(f);
	if (len < 0 || fseek(f, 0, SEEK_SET) != 0) {
		int err = errno ? errno : EIO;
		fclose(f);
		return DOS_FAIL(-err, "cannot size the data file %s: %s", path, strerror(err));
	}
	if ((uint64_t)len < (uint64_t)seq_len + 1) {
		fclose(f);
		return DOS_FAIL(-EINVAL, "the data file %s has %ld bytes, fewer than seq_len + 1 = %u", path, len,
				seq_len + 1);
	}
	if (starpu_malloc((void **)&c->bytes, (size_t)len) != 0) {
		fclose(f);
		return DOS_FAIL(-ENOMEM, "no memory for the %ld bytes of %s", len, path);
	}
	size_t got = fread(c->bytes, 1, (size_t)len, f);
	int read_error = ferror(f);
	fclose(f);
	if (got != (size_t)len || read_error) {
		starpu_free_noflag(c->bytes, (size_t)len);
		c->bytes = NULL;
		return DOS_FAIL(-EIO, "short read of the data file %s (%zu of %ld bytes)", path, got, len);
	}
	c->len = (uint64_t)len;
	c->rng = seed ^ DOS_DATA_SEED_MIX;
	starpu_vector_data_register(&c->handle, STARPU_MAIN_RAM, (uintptr_t)c->bytes, (uint32_t)len, 1);
	return 0;
}

void dos_corpus_free(struct dos_corpus *c)
{
	if (!c || !c->bytes)
		return;
	starpu_data_unregister(c->handle);
	starpu_free_noflag(c->bytes, c->len);
	*c = (struct dos_corpus){0};
}

int dos_corpus_next_batch(struct dos_corpus *c, uint32_t nseq, uint32_t seq_len, unsigned sched_ctx,
			  starpu_data_handle_t *ids, starpu_data_handle_t *targets)
{
	uint64_t *starts = malloc(nseq * sizeof *starts);
	if (!starts)
		return DOS_FAIL(-ENOMEM, "no memory for %u batch offsets", nseq);
	for (uint32_t s = 0; s < nseq; s++)
		starts[s] = dos_splitmix64(&c->rng) % (c->len - seq_len);
	uint32_t n = nseq * seq_len;
	starpu_vector_data_register(ids, -1, 0, n, sizeof(int32_t));
	starpu_vector_data_register(targets, -1, 0, n, sizeof(int32_t));
	int err = starpu_task_insert(&_dos_batch_codelet, STARPU_R, c->handle, STARPU_W, *ids, STARPU_W, *targets,
				     STARPU_CL_ARGS, starts, nseq * sizeof *starts, STARPU_SCHED_CTX, sched_ctx, 0);
	return err ? DOS_FAIL(err, "submitting the batch task failed (%d)", err) : 0;
}

void dos_corpus_skip_batch(struct dos_corpus *c, uint32_t nseq)
{
	for (uint32_t s = 0; s < nseq; s++)
		(void)dos_splitmix64(&c->rng);
}
