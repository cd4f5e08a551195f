/* Checkpoints of the optimizer state that never lie: a versioned, self-describing file per
 * save (header with magic, version, endianness, dtypes, sizes, the model's tensor sizes
 * and the subgroup size; sections master / m / v, each with its own CRC32C), written to a
 * temporary file, fsynced, renamed into place and the directory fsynced, so a crash at any
 * moment leaves the previous checkpoint intact and loadable. Loading checks everything
 * before it changes anything: a truncated, corrupted, wrong-version or wrong-model file is
 * refused with a message saying which, and the caller's state is left untouched. */
#ifndef DOS_CHECKPOINT_H
#define DOS_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "dos.h"

#define DOS_CHECKPOINT_VERSION 2

/* Everything but the three big arrays. */
struct dos_checkpoint_meta {
	/* the model and the optimizer's layout: must match on load */
	uint64_t nparams;
	uint64_t subgroup_size;
	uint32_t ntensors;
	const uint64_t *numel; /* [ntensors] */
	enum dos_dtype weight_dtype, grad_dtype;
	/* progress */
	uint64_t step;          /* optimizer updates applied */
	uint64_t skipped_steps; /* steps dropped for overflow */
	uint64_t steps_done;    /* training steps taken (applied + skipped) */
	double loss_scale;
	uint32_t good_steps;
	/* what the data loader needs to continue: the seed and the batch generator's state */
	uint64_t seed, data_rng;
	/* hyper-parameters, informational (a resumed run may change them on purpose) */
	struct dos_adam_hparams hp;
	/* the parameters [state_begin, state_begin + state_len) the arrays hold: all of them
	 * in a whole checkpoint (state_len 0 on save means up to nparams), a rank's share in a
	 * shard */
	uint64_t state_begin, state_len;
};

/* Writes a checkpoint of `meta` and the nparams-float arrays master, m and v into
 * directory `dir` (which must exist) as "checkpoint-<steps_done>.dos", atomically, then
 * deletes older checkpoint-*.dos files of that directory beyond the `keep` most recent
 * (keep >= 1). The chosen path is copied into path_out (size path_size) when non-NULL.
 * The file just written is never deleted by `keep`. Returns 0, or a negative errno with a
 * message in dos_last_error() naming the file and the failing operation: before the
 * rename the previous checkpoints are untouched; a failure after it (syncing the
 * directory, removing old files) leaves the new checkpoint in place and says so. */
int _dos_checkpoint_save(const char *dir, const struct dos_checkpoint_meta *meta, const float *master, const float *m,
			 const float *v, unsigned keep, char *path_out, size_t path_size);

/* Reads the checkpoint at `path`. `expect` gives the layout the caller has (nparams,
 * subgroup_size, ntensors, numel, weight_dtype, grad_dtype); any difference is refused
 * (-EINVAL, message naming the field, the file's value and the expected one). Then the
 * whole file is verified (magic, version, endianness, sizes, every section's checksum)
 * before master, m and v (nparams floats each) and *got are written; *got's numel points
 * to expect->numel. Errors: -ENOENT/-EACCES/-EISDIR/... from opening, -EINVAL for a file
 * that is not a checkpoint, of another version or another model, -EIO for a truncated or
 * corrupted file (message says which section); on any error nothing is written, except
 * for -EIO "changed while being read" (the file changed between the verifying pass and
 * the reading pass), after which the arrays may be partly written. */
int _dos_checkpoint_load(const char *path, const struct dos_checkpoint_meta *expect, struct dos_checkpoint_meta *got,
			 float *master, float *m, float *v);

/* A data-parallel job's checkpoint: each rank saves its shard (meta's state range, the
 * rank's share; steps_done, counters and layout the same on every rank) as
 * "checkpoint-<steps_done>.shard-<shard>-of-<nshards>.dos", atomically like a whole
 * checkpoint; once every shard is saved, one rank calls _dos_checkpoint_save_manifest,
 * which reads the shards' headers, checks that they tile the model, and writes the
 * manifest "checkpoint-<steps_done>.dos" atomically: from then on the checkpoint exists
 * (a crash before leaves the previous one the latest). It then deletes checkpoints beyond
 * the `keep` most recent, with their shards and shards of saves that never got a manifest.
 * Errors as _dos_checkpoint_save's; -EINVAL when the shards do not tile the model. */
int _dos_checkpoint_save_shard(const char *dir, const struct dos_checkpoint_meta *meta, uint32_t shard,
			       uint32_t nshards, const float *master, const float *m, const float *v);
int _dos_checkpoint_save_manifest(const char *dir, const struct dos_checkpoint_meta *meta, uint32_t nshards,
				  unsigned keep, char *path_out, size_t path_size);

/* Loads the parameters [begin, begin + len) of the checkpoint at `path` (a whole one or a
 * manifest, whatever the number of shards: a job resumes on any number of ranks) into
 * master, m and v (len floats each; a NULL array is verified but not read), after
 * verifying every file involved as _dos_checkpoint_load does. A manifest's shard that is
 * missing, damaged or not the one the manifest names is refused. got->state_begin and
 * got->state_len are the range loaded. */
int _dos_checkpoint_load_range(const char *path, const struct dos_checkpoint_meta *expect, uint64_t begin, uint64_t len,
			       struct dos_checkpoint_meta *got, float *master, float *m, float *v);

/* The path of the most recent "checkpoint-<N>.dos" of `dir` (highest N) into path (size
 * path_size). Returns 0, -ENOENT when there is none, or a negative errno. Does not verify
 * it (_dos_checkpoint_load does). */
int _dos_checkpoint_latest(const char *dir, char *path, size_t path_size);

#endif /* DOS_CHECKPOINT_H */
