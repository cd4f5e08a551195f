/* Checkpoints of the optimizer state that never lie: a versioned, self-describing file per
 * save (header with magic, version, endianness, dtypes, sizes, the model's tensor sizes,
 * the subgroup size and the run's identity; sections master / m / v, each with its own
 * CRC32C; the format is at the top of checkpoint.c), written to a temporary file, fsynced,
 * renamed into place and the directory fsynced, so a crash at any moment leaves the
 * previous checkpoint intact and loadable. Loading checks everything before it changes
 * anything: a truncated, corrupted, wrong-version or wrong-model file is refused with a
 * message saying which, and the caller's state is left untouched.
 *
 * A checkpoint folder belongs to one run, and one process at a time: see "folders"
 * below, the one home of that logic for dos-train and for dos_opt_save and dos_opt_load. */
#ifndef DOS_CHECKPOINT_H
#define DOS_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "dos.h"

#define DOS_CHECKPOINT_VERSION 3

/* The identity of a training run: 16 random bytes drawn when it starts from scratch, kept
 * in every checkpoint it saves, and taken over by a run resumed from one of them. All
 * zeros: unknown (checkpoints of format version 2 and manifests of version 1, from before
 * identities). */
struct _dos_run_id {
	unsigned char bytes[16];
};
#define DOS_RUN_ID_TEXT 48 /* bytes of _dos_run_id_text's text */

/* A new identity. Returns 0 or a negative errno (getrandom failed). */
int _dos_run_id_new(struct _dos_run_id *run);
int _dos_run_id_equal(const struct _dos_run_id *a, const struct _dos_run_id *b);
int _dos_run_id_known(const struct _dos_run_id *run);
/* 32 hex digits (or a note that it is unknown) into text; returns text. */
const char *_dos_run_id_text(const struct _dos_run_id *run, char text[DOS_RUN_ID_TEXT]);

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
	/* the run that saved it: on save, retention deletes only this run's older files */
	struct _dos_run_id run;
};

/* Writes a checkpoint of `meta` and the nparams-float arrays master, m and v into
 * directory `dir` (which must exist) as "checkpoint-<steps_done>.dos", atomically, then
 * deletes older checkpoint-*.dos files of that directory beyond the `keep` most recent of
 * meta->run (keep >= 1; files of other runs, or whose run cannot be read, stay). The chosen path is copied into
 * path_out (size path_size) when non-NULL. The file just written is never deleted by `keep`. Returns 0, or a negative
 * errno with a message in dos_last_error() naming the file and the failing operation: before the rename the previous
 * checkpoints are untouched; a failure after it (syncing the directory, removing old files) leaves the new checkpoint
 * in place and says so. */
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
 * it (_dos_checkpoint_load does; _dos_checkpoint_newest_valid finds one that verifies). */
int _dos_checkpoint_latest(const char *dir, char *path, size_t path_size);

/* How a search for a checkpoint to resume from goes on (both optional, arg is theirs):
 * agree, in a data-parallel job, turns each rank's result of loading a candidate into the
 * job's (nonzero when any rank failed, so that all go on to the next together); skipped
 * is told of each newer checkpoint passed over and why. */
struct _dos_checkpoint_search {
	int (*agree)(void *arg, int err);
	void (*skipped)(void *arg, const char *path, const char *why);
	/* told of each file a resume set aside (_dos_checkpoint_folder_set_aside_damaged) */
	void (*set_aside)(void *arg, const char *path, const char *why);
	void *arg;
};

/* The newest "checkpoint-<N>.dos" of `dir` that verifies on its own (every file it
 * involves, every CRC: it reads them whole), into path (size path_size). Newer ones that do
 * not are passed to search->skipped. Returns 0, -ENOENT when none verifies (the message
 * says why each failed), or a negative errno. */
int _dos_checkpoint_newest_valid(const char *dir, const struct _dos_checkpoint_search *search, char *path,
				 size_t path_size);

/* ---- folders: one run, one process at a time ---------------------------------------------
 *
 * A run takes its folder (_dos_checkpoint_folder_take): the folder is created with its
 * parents when missing, must take new files, and gets locked (an advisory lock on its
 * ".starpu-dos.lock", released by the kernel whenever the process ends, even by SIGKILL;
 * a second process is refused, told the holder's pid and host); temporary files of saves
 * that were killed are removed then. The run then says whose it is: a fresh run claims
 * it with a new identity (_dos_checkpoint_folder_claim), which is refused when any
 * checkpoint is there already (an optimizer of the embedding API claims it with its own
 * identity, which may be one it loaded); a resumed run loads the newest checkpoint that verifies
 * and takes over its identity (_dos_checkpoint_folder_resume), refused when checkpoints of
 * another run are there too. Before each save, _dos_checkpoint_folder_check refuses a
 * folder into which another run's checkpoint has come since. */
struct _dos_checkpoint_folder {
	char *dir;              /* NULL: none taken */
	int lock_fd;            /* -1: not locked (the other ranks of a data-parallel job) */
	struct _dos_run_id run; /* the run it belongs to, once claimed or resumed */
	int claimed;
};
#define DOS_CHECKPOINT_FOLDER_INIT \
	{                          \
		NULL, -1, {{0}}, 0 \
	}

/* Takes `dir` (see above) with its lock when `lock` (in a data-parallel job, rank 0 locks
 * for the job). Errors, the message naming the folder: -EBUSY when another process (or
 * another optimizer of this one) holds it, -ENOTDIR, -EACCES, -EROFS and the like when it
 * cannot be created or written, -ENOMEM. On error *f is left as DOS_CHECKPOINT_FOLDER_INIT. */
int _dos_checkpoint_folder_take(struct _dos_checkpoint_folder *f, const char *dir, int lock);

/* Unlocks and forgets the folder (*f becomes DOS_CHECKPOINT_FOLDER_INIT). */
void _dos_checkpoint_folder_release(struct _dos_checkpoint_folder *f);

/* The folder becomes `run`'s, refused with -EEXIST when it holds a checkpoint (whole,
 * manifest or shard) of another run, or, when `strict` (a run that has never loaded a
 * checkpoint: a fresh one), one whose run cannot be read: the message names the folder,
 * what it holds (the files, their run, the latest step) and ends with `advice` (what the
 * caller can do: resume, or another folder). */
int _dos_checkpoint_folder_claim(struct _dos_checkpoint_folder *f, const struct _dos_run_id *run, int strict,
				 const char *advice);

/* A resumed run: loads the newest checkpoint of the folder that verifies and fits, by
 * load(load_arg, path) (which returns 0, or a negative errno with a message: the file does
 * not load, and nothing of the caller's changed), passing newer ones that do not to
 * search->skipped, then makes the folder the loaded checkpoint's run's, and sets aside
 * the newer ones of that run that do not verify (below; search->set_aside is told); refused with
 * -EEXIST (and advice) before anything is loaded when checkpoints of another run are
 * there too. The loaded path goes to path (size path_size) unless it is NULL. -ENOENT
 * when the folder holds no checkpoint, or none that loads (the message gives each one's
 * reason). */
int _dos_checkpoint_folder_resume(struct _dos_checkpoint_folder *f, int (*load)(void *arg, const char *path),
				  void *load_arg, const struct _dos_checkpoint_search *search, const char *advice,
				  char *path, size_t path_size);

/* A run that continues from its checkpoint after step `after`, while the folder holds
 * newer checkpoints of that run which do not verify on their own (damaged bits, a
 * truncated file, a damaged or missing shard): retention, which keeps a run's newest
 * files, would keep those in place of the one loaded, and delete that one. So the folder's
 * lock holder renames their files "<name>.damaged" (".damaged-<k>" when taken; a data-
 * parallel job's manifest and shards alike), out of retention's way and never deleted,
 * and tells told(arg, path, why) of each (why: what is wrong, what was renamed). Newer
 * ones that verify, and files whose run cannot be read, stay. 0, or a negative errno from
 * reading the folder. */
int _dos_checkpoint_folder_set_aside_damaged(const struct _dos_checkpoint_folder *f, uint64_t after,
					     void (*told)(void *arg, const char *path, const char *why), void *arg);

/* Before a save: -EEXIST when a checkpoint of another run has come into the claimed
 * folder (one whose run cannot be read is left to retention, which never deletes it). */
int _dos_checkpoint_folder_check(const struct _dos_checkpoint_folder *f);

#endif /* DOS_CHECKPOINT_H */
