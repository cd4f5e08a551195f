/* The corpus and the batch order (data.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data.h"
#include "errors.h"
#include "flat.h"
#include "host_memory.h"

int dos_corpus_load(struct dos_corpus *out, const char *path, uint32_t seq_len, uint64_t seed)
{
	if (!out || !path)
		return DOS_FAIL(-EINVAL, "NULL argument (corpus %p, path %p)", (void *)out, (const void *)path);
	if (seq_len == 0)
		return DOS_FAIL(-EINVAL, "seq_len = 0: sequences need at least one token");
	FILE *f = fopen(path, "rb");
	if (!f)
		return DOS_FAIL(-errno, "cannot open the data file %s: %s", path, strerror(errno));
	/* a directory opens fine and reads as an error much later: refuse it here */
	struct stat st;
	if (fstat(fileno(f), &st) != 0) {
		int err = errno;
		fclose(f);
		return DOS_FAIL(-err, "cannot size the data file %s: %s", path, strerror(err));
	}
	if (!S_ISREG(st.st_mode)) {
		fclose(f);
		return DOS_FAIL(S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL, "the data file %s is not a regular file%s",
				path, S_ISDIR(st.st_mode) ? " but a directory" : "");
	}
	uint64_t len = (uint64_t)st.st_size;
	if (len < (uint64_t)seq_len + 1) {
		fclose(f);
		return DOS_FAIL(-EINVAL, "the data file %s has %llu bytes, fewer than seq_len + 1 = %llu", path,
				(unsigned long long)len, (unsigned long long)seq_len + 1);
	}
	/* the corpus is one StarPU vector of bytes, whose length is 32-bit */
	if (len > UINT32_MAX) {
		fclose(f);
		return DOS_FAIL(-EINVAL, "the data file %s has %llu bytes, more than 2^32 - 1", path,
				(unsigned long long)len);
	}
	struct dos_corpus c = {0};
	char what[4200];
	snprintf(what, sizeof what, "the data file %s", path);
	int err = dos_host_alloc((void **)&c.bytes, (size_t)len, what, &c.pinned);
	if (err) {
		fclose(f);
		return err;
	}
	size_t got = fread(c.bytes, 1, (size_t)len, f);
	int read_error = ferror(f);
	fclose(f);
	if (got != (size_t)len || read_error) {
		dos_host_free(c.bytes, (size_t)len, c.pinned);
		return DOS_FAIL(-EIO, "short read of the data file %s (%zu of %llu bytes)", path, got,
				(unsigned long long)len);
	}
	c.len = len;
	c.rng = seed ^ DOS_DATA_SEED_MIX;
	starpu_vector_data_register(&c.handle, STARPU_MAIN_RAM, (uintptr_t)c.bytes, (uint32_t)len, 1);
	*out = c;
	return 0;
}

void dos_corpus_free(struct dos_corpus *c)
{
	if (!c || !c->bytes)
		return;
	starpu_data_unregister(c->handle);
	dos_host_free(c->bytes, c->len, c->pinned);
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
