/* Checkpoints of the optimizer state (checkpoint.h): the file format, its CRC32C, the
 * atomic save with its retention of the most recent files, and the load that verifies the
 * whole file before it writes anything of the caller's.
 *
 * File format, version 3. Every field is in the writer's native byte order, which is
 * little-endian on every platform starpu-dos runs on (x86-64, aarch64, ppc64le); the
 * byte-order marker lets a reader of the other byte order refuse the file instead of
 * misreading it. Offsets in bytes; n = ntensors, L = state_len (nparams in a whole
 * checkpoint, the shard's share in a shard of a data-parallel job).
 *
 *   header (header_len = 180 + 8 n bytes)
 *      0  char[8]   magic "DOSCKPT\0"                      } these four fields keep their
 *      8  uint32    version (DOS_CHECKPOINT_VERSION = 3)     } place in every version, so
 *     12  uint32    byte-order marker 0x01020304             } that any reader can check
 *     16  uint32    header_len                               } them and the header's CRC
 *     20  uint32    ntensors
 *     24  uint64    nparams
 *     32  uint64    subgroup_size
 *     40  uint32    weight_dtype (enum dos_dtype)
 *     44  uint32    grad_dtype (enum dos_dtype)
 *     48  uint64    step
 *     56  uint64    skipped_steps
 *     64  uint64    steps_done
 *     72  float64   loss_scale (IEEE binary64)
 *     80  uint32    good_steps
 *     84  uint32    hp.mode (enum dos_adam_mode)
 *     88  uint64    seed
 *     96  uint64    data_rng
 *    104  float64   hp.lr
 *    112  float64   hp.beta1
 *    120  float64   hp.beta2
 *    128  float64   hp.eps
 *    136  float64   hp.weight_decay
 *    144  uint64    state_begin: the sections hold parameters [state_begin, state_begin + L)
 *    152  uint64    state_len L
 *    160  uint8[16] the run's identity (struct _dos_run_id; all zeros: unknown)
 *    176  uint64    numel[n]
 *  176+8n uint32    CRC32C of header bytes [0, header_len - 4)
 *
 *   then three sections, master, m and v, in that order, each 4 L + 20 bytes:
 *      0  char[8]   tag: "master\0\0", "adam_m\0\0", "adam_v\0\0"
 *      8  uint64    byte length of the data = 4 L
 *     16  float32   data[L]
 *   16+4L uint32    CRC32C of the section's bytes [0, 16 + 4 L): its header and its data
 *
 *   and nothing after them: the file is exactly header_len + 3 (4 L + 20) bytes.
 *   Version 2 is read too: it has no identity (numel at 160, header_len = 164 + 8 n), which
 *   reads as the unknown one. (Version 1, refused, had no state_begin and state_len.)
 *
 * A data-parallel job saves one shard per rank, "checkpoint-<N>.shard-<i>-of-<R>.dos" (the
 * format above, each with its rank's range), then rank 0 writes the manifest
 * "checkpoint-<N>.dos", which makes the checkpoint exist; its format, version 2:
 *
 *      0  char[8]   magic "DOSMANI\0"
 *      8  uint32    version (MANIFEST_VERSION = 2)
 *     12  uint32    byte-order marker 0x01020304
 *     16  uint32    R, the number of shards
 *     20  uint32    zero
 *     24  uint64    nparams
 *     32  uint64    steps_done
 *     40  uint8[16] the run's identity, the same as its shards'
 *     56  R times:  uint64 state_begin, uint64 state_len, uint32 the shard's header CRC32C,
 *                   uint32[3] its sections' CRC32Cs (these bind the shard files to this
 *                   manifest: a shard of another save is refused)
 *  56+32R uint32    CRC32C of bytes [0, 56 + 32 R)
 *
 * (Version 1, read too, has no identity: its entries start at 40.)
 *
 * The shards tile [0, nparams) in order. Any range of parameters can be loaded from either
 * kind of checkpoint, so a job resumes on any number of ranks.
 *
 * A checkpoint folder belongs to one run (checkpoint.h): the run's identity is in every
 * file it saves, a process holds the folder by an advisory lock on the file LOCK_NAME in
 * it, and retention only ever deletes files of the run that saves.
 *
 * CRC32C is the Castagnoli CRC (reflected polynomial 0x82F63B78, initial value and final
 * xor 0xFFFFFFFF), the one of iSCSI, ext4 and SSE4.2's crc32 instruction. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <unistd.h>

#include "checkpoint.h"
#include "errors.h"
#include "files.h"

_Static_assert(sizeof(float) == 4, "the sections hold IEEE binary32 floats");
_Static_assert(sizeof(double) == 8, "the header holds IEEE binary64 doubles");

static const char checkpoint_magic[8] = "DOSCKPT";
#define BYTE_ORDER_MARKER 0x01020304u
#define BYTE_ORDER_SWAPPED 0x04030201u

/* Offsets of the header (see the top of the file). */
enum {
	OFF_VERSION = 8,
	OFF_MARKER = 12,
	OFF_HEADER_LEN = 16,
	OFF_NTENSORS = 20,
	OFF_NPARAMS = 24,
	OFF_SUBGROUP = 32,
	OFF_WEIGHT_DTYPE = 40,
	OFF_GRAD_DTYPE = 44,
	OFF_STEP = 48,
	OFF_SKIPPED = 56,
	OFF_STEPS_DONE = 64,
	OFF_LOSS_SCALE = 72,
	OFF_GOOD_STEPS = 80,
	OFF_HP_MODE = 84,
	OFF_SEED = 88,
	OFF_DATA_RNG = 96,
	OFF_HP_LR = 104,
	OFF_HP_BETA1 = 112,
	OFF_HP_BETA2 = 120,
	OFF_HP_EPS = 128,
	OFF_HP_WEIGHT_DECAY = 136,
	OFF_STATE_BEGIN = 144,
	OFF_STATE_LEN = 152,
	OFF_RUN = 160,       /* version 3 on */
	HEADER_FIXED = 176,  /* bytes before numel (version 3 on; 160 in version 2) */
	HEADER_ID = 20,      /* magic, version, marker, header_len: the same in every version */
	SECTION_HEADER = 16, /* tag and byte length */
	CRC_BYTES = 4,
};

#define NSECTIONS 3
static const char section_tags[NSECTIONS][8] = {"master", "adam_m", "adam_v"};
static const char *const section_names[NSECTIONS] = {"master", "m", "v"};

/* Bounds that keep every size of the file within uint64 and the header within uint32. */
#define MAX_NPARAMS (UINT64_MAX / 16)
#define MAX_NTENSORS ((UINT32_MAX - HEADER_FIXED - CRC_BYTES) / 8)

/* Files are read and written in pieces of this size: the arrays may hold billions of
 * floats, and the CRC of a piece is computed while it is still in cache. */
#define IO_CHUNK ((size_t)1 << 20)

/* ---- CRC32C, slicing by 8 ------------------------------------------------------------- */

static uint32_t crc32c_table[8][256];
static pthread_once_t crc32c_once = PTHREAD_ONCE_INIT;

static void crc32c_init_tables(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++)
			c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
		crc32c_table[0][i] = c;
	}
	for (int t = 1; t < 8; t++)
		for (int i = 0; i < 256; i++) {
			uint32_t c = crc32c_table[t - 1][i];
			crc32c_table[t][i] = (c >> 8) ^ crc32c_table[0][c & 0xff];
		}
}

static inline uint32_t load32_le(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* CRC32C of `len` bytes continuing `crc` (0 to start): crc32c(crc32c(0, a), b) is the
 * CRC of a followed by b. */
static uint32_t crc32c(uint32_t crc, const void *buf, size_t len)
{
	const uint32_t(*t)[256] = (const uint32_t(*)[256])crc32c_table;
	const unsigned char *p = buf;
	pthread_once(&crc32c_once, crc32c_init_tables);
	crc = ~crc;
	for (; len >= 8; len -= 8, p += 8) {
		uint32_t lo = crc ^ load32_le(p), hi = load32_le(p + 4);
		crc = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^
		      t[3][hi & 0xff] ^ t[2][(hi >> 8) & 0xff] ^ t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
	}
	for (; len > 0; len--, p++)
		crc = (crc >> 8) ^ t[0][(crc ^ *p) & 0xff];
	return ~crc;
}

/* ---- small helpers -------------------------------------------------------------------- */

static void put_u32(unsigned char *buf, size_t off, uint32_t x)
{
	memcpy(buf + off, &x, sizeof x);
}

static void put_u64(unsigned char *buf, size_t off, uint64_t x)
{
	memcpy(buf + off, &x, sizeof x);
}

static void put_f64(unsigned char *buf, size_t off, double x)
{
	memcpy(buf + off, &x, sizeof x);
}

static uint32_t get_u32(const unsigned char *buf, size_t off)
{
	uint32_t x;
	memcpy(&x, buf + off, sizeof x);
	return x;
}

static uint64_t get_u64(const unsigned char *buf, size_t off)
{
	uint64_t x;
	memcpy(&x, buf + off, sizeof x);
	return x;
}

static double get_f64(const unsigned char *buf, size_t off)
{
	double x;
	memcpy(&x, buf + off, sizeof x);
	return x;
}

/* Where numel starts in a header of `version` (2 or 3). */
static uint32_t numel_offset(uint32_t version)
{
	return version >= 3 ? HEADER_FIXED : OFF_RUN;
}

static uint64_t header_len_of(uint32_t version, uint32_t ntensors)
{
	return numel_offset(version) + 8 * (uint64_t)ntensors + CRC_BYTES;
}

static uint64_t section_len_of(uint64_t nparams)
{
	return SECTION_HEADER + 4 * nparams + CRC_BYTES;
}

static uint64_t file_len_of(uint32_t version, uint32_t ntensors, uint64_t nparams)
{
	return header_len_of(version, ntensors) + NSECTIONS * section_len_of(nparams);
}

/* The parameters a meta's arrays hold: state_len, 0 meaning all of them. */
static uint64_t state_len_of(const struct dos_checkpoint_meta *meta)
{
	return meta->state_len ? meta->state_len : meta->nparams - meta->state_begin;
}

static const char *dtype_label(uint32_t dtype)
{
	return dos_dtype_name((enum dos_dtype)dtype);
}

/* A canonical decimal number at *p (digits only, no leading zero, no overflow), *p moved
 * past it; 0 when there is none. */
static int parse_decimal(const char **p, uint64_t *n)
{
	const char *q = *p;
	if (*q < '0' || *q > '9' || (q[0] == '0' && q[1] >= '0' && q[1] <= '9'))
		return 0;
	uint64_t x = 0;
	for (; *q >= '0' && *q <= '9'; q++) {
		unsigned d = (unsigned)(*q - '0');
		if (x > (UINT64_MAX - d) / 10)
			return 0;
		x = 10 * x + d;
	}
	*p = q;
	*n = x;
	return 1;
}

/* Whether `name` is "checkpoint-<N>.dos" (a whole checkpoint or a manifest: *shard = 0) or
 * "checkpoint-<N>.shard-<i>-of-<R>.dos" (*shard = 1): the names this file writes and the
 * only ones it deletes. */
static int parse_checkpoint_name(const char *name, uint64_t *n, int *shard)
{
	static const char prefix[] = "checkpoint-";
	const char *p = name + sizeof prefix - 1;
	uint64_t i, r;
	if (strncmp(name, prefix, sizeof prefix - 1) != 0 || !parse_decimal(&p, n))
		return 0;
	*shard = strncmp(p, ".shard-", 7) == 0;
	if (*shard) {
		p += 7;
		if (!parse_decimal(&p, &i) || strncmp(p, "-of-", 4) != 0)
			return 0;
		p += 4;
		if (!parse_decimal(&p, &r) || i >= r)
			return 0;
	}
	return strcmp(p, ".dos") == 0;
}

static int compare_desc(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? 1 : x > y ? -1 : 0;
}

/* The N of every checkpoint-<N>.dos of `dir`, highest first, in a malloc'ed array. */
static int list_checkpoints(const char *dir, uint64_t **out, size_t *count)
{
	DIR *d = opendir(dir);
	if (!d)
		return DOS_FAIL(-errno, "cannot read the checkpoint directory %s: opendir: %s", dir, strerror(errno));
	uint64_t *ns = NULL;
	size_t len = 0, cap = 0;
	int err = 0;
	for (;;) {
		errno = 0;
		struct dirent *e = readdir(d);
		if (!e) {
			if (errno)
				err = DOS_FAIL(-errno, "cannot read the checkpoint directory %s: readdir: %s", dir,
					       strerror(errno));
			break;
		}
		uint64_t n;
		int shard;
		if (!parse_checkpoint_name(e->d_name, &n, &shard) || shard)
			continue;
		if (len == cap) {
			size_t ncap = cap ? 2 * cap : 16;
			uint64_t *grown = realloc(ns, ncap * sizeof *grown);
			if (!grown) {
				err = DOS_FAIL(-ENOMEM, "no memory to list the checkpoints of %s", dir);
				break;
			}
			ns = grown;
			cap = ncap;
		}
		ns[len++] = n;
	}
	closedir(d);
	if (err) {
		free(ns);
		return err;
	}
	if (len > 1) /* qsort wants a non-NULL array even when empty */
		qsort(ns, len, sizeof *ns, compare_desc);
	*out = ns;
	*count = len;
	return 0;
}

/* fsync of a directory; some file systems cannot sync one (EINVAL) and need not. */
static int sync_directory(int dfd)
{
	if (fsync(dfd) != 0 && errno != EINVAL)
		return -errno;
	return 0;
}

/* ---- save ----------------------------------------------------------------------------- */

static int write_all(int fd, const void *buf, size_t len)
{
	const unsigned char *p = buf;
	while (len > 0) {
		ssize_t n = write(fd, p, len < IO_CHUNK ? len : IO_CHUNK);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return -EIO;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* Writes `len` bytes and adds them to *crc. */
static int write_crc(int fd, const void *buf, size_t len, uint32_t *crc)
{
	const unsigned char *p = buf;
	while (len > 0) {
		size_t piece = len < IO_CHUNK ? len : IO_CHUNK;
		*crc = crc32c(*crc, p, piece);
		int err = write_all(fd, p, piece);
		if (err)
			return err;
		p += piece;
		len -= piece;
	}
	return 0;
}

/* The whole file, in the order of the format; returns 0 or -errno of the failing write. */
static int write_checkpoint(int fd, const struct dos_checkpoint_meta *meta, const float *const arrays[NSECTIONS])
{
	unsigned char h[HEADER_FIXED] = {0};
	memcpy(h, checkpoint_magic, sizeof checkpoint_magic);
	put_u32(h, OFF_VERSION, DOS_CHECKPOINT_VERSION);
	put_u32(h, OFF_MARKER, BYTE_ORDER_MARKER);
	put_u32(h, OFF_HEADER_LEN, (uint32_t)header_len_of(DOS_CHECKPOINT_VERSION, meta->ntensors));
	put_u32(h, OFF_NTENSORS, meta->ntensors);
	put_u64(h, OFF_NPARAMS, meta->nparams);
	put_u64(h, OFF_SUBGROUP, meta->subgroup_size);
	put_u32(h, OFF_WEIGHT_DTYPE, (uint32_t)meta->weight_dtype);
	put_u32(h, OFF_GRAD_DTYPE, (uint32_t)meta->grad_dtype);
	put_u64(h, OFF_STEP, meta->step);
	put_u64(h, OFF_SKIPPED, meta->skipped_steps);
	put_u64(h, OFF_STEPS_DONE, meta->steps_done);
	put_f64(h, OFF_LOSS_SCALE, meta->loss_scale);
	put_u32(h, OFF_GOOD_STEPS, meta->good_steps);
	put_u32(h, OFF_HP_MODE, (uint32_t)meta->hp.mode);
	put_u64(h, OFF_SEED, meta->seed);
	put_u64(h, OFF_DATA_RNG, meta->data_rng);
	put_f64(h, OFF_HP_LR, meta->hp.lr);
	put_f64(h, OFF_HP_BETA1, meta->hp.beta1);
	put_f64(h, OFF_HP_BETA2, meta->hp.beta2);
	put_f64(h, OFF_HP_EPS, meta->hp.eps);
	put_f64(h, OFF_HP_WEIGHT_DECAY, meta->hp.weight_decay);
	put_u64(h, OFF_STATE_BEGIN, meta->state_begin);
	put_u64(h, OFF_STATE_LEN, state_len_of(meta));
	memcpy(h + OFF_RUN, meta->run.bytes, sizeof meta->run.bytes);
	uint32_t crc = 0;
	int err;
	if ((err = write_crc(fd, h, sizeof h, &crc)) ||
	    (err = write_crc(fd, meta->numel, 8 * (size_t)meta->ntensors, &crc)) ||
	    (err = write_all(fd, &crc, sizeof crc)))
		return err;
	for (int s = 0; s < NSECTIONS; s++) {
		unsigned char sh[SECTION_HEADER];
		memcpy(sh, section_tags[s], 8);
		put_u64(sh, 8, 4 * state_len_of(meta));
		crc = 0;
		if ((err = write_crc(fd, sh, sizeof sh, &crc)) ||
		    (err = write_crc(fd, arrays[s], 4 * (size_t)state_len_of(meta), &crc)) ||
		    (err = write_all(fd, &crc, sizeof crc)))
			return err;
	}
	return 0;
}

static int n_is_kept(uint64_t n, const uint64_t *kept, size_t count)
{
	for (size_t i = 0; i < count; i++)
		if (kept[i] == n)
			return 1;
	return 0;
}

static int file_identity(const char *dir, const char *name, struct _dos_run_id *run, char *why, size_t why_size);

/* Deletes the checkpoints of `run` in `dir` beyond the `keep` highest N, but never
 * `written`, the one just saved (a run resumed from an older checkpoint than its
 * folder's latest must not lose the file it has just been told is saved), with their
 * shards and the shards of its saves that never got a manifest (a crash between the
 * shards and the manifest), up to the one just written. Files of another run, or whose
 * run cannot be read, are never touched. */
static int remove_old_checkpoints(const char *dir, int dfd, const char *saved, uint64_t written, unsigned keep,
				  const struct _dos_run_id *run)
{
	uint64_t *ns;
	size_t count;
	int err = list_checkpoints(dir, &ns, &count);
	if (err)
		return err;
	char name[160], why[16];
	size_t ours = 0;
	for (size_t i = 0; i < count; i++) { /* this run's, still highest first */
		struct _dos_run_id id;
		snprintf(name, sizeof name, "checkpoint-%" PRIu64 ".dos", ns[i]);
		if (file_identity(dir, name, &id, why, sizeof why) == 0 && _dos_run_id_equal(&id, run))
			ns[ours++] = ns[i];
	}
	int removed = 0;
	for (size_t i = keep; i < ours && !err; i++) {
		if (ns[i] == written)
			continue;
		snprintf(name, sizeof name, "checkpoint-%" PRIu64 ".dos", ns[i]);
		if (unlinkat(dfd, name, 0) == 0)
			removed = 1;
		else if (errno != ENOENT) /* ENOENT: someone else removed it: fine */
			err = DOS_FAIL(-errno,
				       "%s is saved, but the old checkpoint %s/%s could not be removed: unlink: %s",
				       saved, dir, name, strerror(errno));
	}
	DIR *d = err ? NULL : opendir(dir);
	size_t kept = ours < keep ? ours : keep;
	for (struct dirent *e; d && !err && (e = readdir(d));) {
		uint64_t n;
		int shard;
		struct _dos_run_id id;
		if (!parse_checkpoint_name(e->d_name, &n, &shard) || !shard || n >= written || n_is_kept(n, ns, kept) ||
		    file_identity(dir, e->d_name, &id, why, sizeof why) != 0 || !_dos_run_id_equal(&id, run))
			continue;
		if (unlinkat(dfd, e->d_name, 0) == 0)
			removed = 1;
		else if (errno != ENOENT)
			err = DOS_FAIL(-errno, "%s is saved, but the old shard %s/%s could not be removed: unlink: %s",
				       saved, dir, e->d_name, strerror(errno));
	}
	if (d)
		closedir(d);
	free(ns);
	if (!err && removed && (err = sync_directory(dfd)))
		err = DOS_FAIL(err,
			       "%s is saved, but the directory %s could not be synced after removing old checkpoints: "
			       "fsync: %s",
			       saved, dir, strerror(-err));
	return err;
}

/* The checks every save makes of `meta` and the arrays. */
static int check_save_arguments(const char *dir, const struct dos_checkpoint_meta *meta, const float *master,
				const float *m, const float *v)
{
	if (!dir)
		return DOS_FAIL(-EINVAL, "dir is NULL");
	if (!meta)
		return DOS_FAIL(-EINVAL, "meta is NULL");
	if (!master || !m || !v)
		return DOS_FAIL(-EINVAL, "%s is NULL", !master ? "master" : !m ? "m" : "v");
	if (meta->nparams == 0)
		return DOS_FAIL(-EINVAL, "meta->nparams = 0: nothing to save");
	if (meta->nparams > MAX_NPARAMS || meta->nparams > SIZE_MAX / 4)
		return DOS_FAIL(-EINVAL, "meta->nparams = %" PRIu64 " is too large", meta->nparams);
	if (meta->state_begin >= meta->nparams || meta->state_len > meta->nparams - meta->state_begin)
		return DOS_FAIL(-EINVAL,
				"meta->state_begin = %" PRIu64 ", meta->state_len = %" PRIu64
				": not a range of the %" PRIu64 " parameters",
				meta->state_begin, meta->state_len, meta->nparams);
	if (meta->ntensors > MAX_NTENSORS)
		return DOS_FAIL(-EINVAL, "meta->ntensors = %" PRIu32 " is more than the format's %u", meta->ntensors,
				(unsigned)MAX_NTENSORS);
	if (!meta->numel && meta->ntensors > 0)
		return DOS_FAIL(-EINVAL, "meta->numel is NULL but meta->ntensors = %" PRIu32, meta->ntensors);
	if (dos_dtype_size(meta->weight_dtype) == 0)
		return DOS_FAIL(-EINVAL, "meta->weight_dtype = %d is not a dos_dtype", (int)meta->weight_dtype);
	if (dos_dtype_size(meta->grad_dtype) == 0)
		return DOS_FAIL(-EINVAL, "meta->grad_dtype = %d is not a dos_dtype", (int)meta->grad_dtype);
	return 0;
}

/* What a save needs room for, said when the disk is full: what the file is ("a
 * checkpoint") and its size, and how many checkpoints the folder keeps beside the one
 * being written (0: not said, for a shard or a manifest, whose siblings other calls
 * write). */
struct save_room {
	const char *what;
	uint64_t bytes;
	unsigned keep;
};

static void format_size(uint64_t bytes, char *buf, size_t size)
{
	if (bytes >= (uint64_t)1 << 30)
		snprintf(buf, size, "%.2f GiB", (double)bytes / (1 << 30));
	else
		snprintf(buf, size, "%.1f MiB", (double)bytes / (1 << 20));
}

/* Why a write into `dir` (open as dfd) ran out of room, in numbers, after ";" into buf:
 * the file's size, what the file system has free (once the partial file is removed), and
 * what retention needs at its fullest: the folder's `keep` latest checkpoints are removed
 * only once the next one is in place beside them. "No space left on device" alone did
 * not say that a folder with room for one checkpoint stops every run at its second save. */
static void describe_room(const char *dir, int dfd, int err, const struct save_room *room, char *buf, size_t size)
{
	char text[32];
	size_t len = 0;
	int n;
	format_size(room->bytes, text, sizeof text);
	n = snprintf(buf, size, "; %s takes %" PRIu64 " bytes (%s)", room->what, room->bytes, text);
	len += n > 0 ? (size_t)n : 0;
	struct statvfs fs;
	if (len < size && fstatvfs(dfd, &fs) == 0) {
		uint64_t avail = (uint64_t)fs.f_bavail * fs.f_frsize;
		format_size(avail, text, sizeof text);
		n = snprintf(buf + len, size - len, ", the file system of %s has %" PRIu64 " bytes (%s) free%s", dir,
			     avail, text, err == -EDQUOT ? ", but the disk quota is used up" : "");
		len += n > 0 ? (size_t)n : 0;
	}
	if (len < size && room->keep) {
		uint64_t need = room->bytes * (room->keep + 1);
		format_size(need, text, sizeof text);
		if (room->keep == 1)
			snprintf(buf + len, size - len,
				 "; the folder keeps the run's latest checkpoint and writes the next beside it before "
				 "removing it: it needs room for 2 checkpoints, %" PRIu64 " bytes (%s)",
				 need, text);
		else
			snprintf(buf + len, size - len,
				 "; the folder keeps the run's %u latest checkpoints and writes the next beside them "
				 "before removing the oldest: it needs room for %u checkpoints, %" PRIu64 " bytes (%s)",
				 room->keep, room->keep + 1, need, text);
	}
}

/* Writes dir/name atomically: write(fd, ctx) into a temporary file of dir, fsync, rename,
 * fsync of dir. On success *dfd_out is the open directory (the caller closes it) and the
 * path is in path (size PATH_MAX). A full disk is reported with `room`'s numbers. */
static int save_atomically(const char *dir, const char *name, int (*write)(int fd, const void *ctx), const void *ctx,
			   const struct save_room *room, char *path, int *dfd_out)
{
	char tmp_name[160], tmp_path[PATH_MAX];
	snprintf(tmp_name, sizeof tmp_name, ".%s.tmp-%ld", name, (long)getpid());
	int len = snprintf(path, PATH_MAX, "%s/%s", dir, name);
	if (len < 0 || len >= PATH_MAX || snprintf(tmp_path, sizeof tmp_path, "%s/%s", dir, tmp_name) >= PATH_MAX)
		return DOS_FAIL(-ENAMETOOLONG, "dir = '%.200s...' (%zu bytes) is too long for a checkpoint path", dir,
				strlen(dir));
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return DOS_FAIL(-errno, "cannot open the checkpoint directory %s: open: %s", dir, strerror(errno));
	int fd = openat(dfd, tmp_name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0) {
		int err = DOS_FAIL(-errno, "cannot create %s: open: %s", tmp_path, strerror(errno));
		close(dfd);
		return err;
	}
	const char *op = "write";
	int err = write(fd, ctx);
	if (!err && fsync(fd) != 0) /* a file system may report a full disk only here or at close */
		err = -errno, op = "fsync";
	if (close(fd) != 0 && !err)
		err = -errno, op = "close";
	if (err) {
		unlinkat(dfd, tmp_name, 0); /* before the free space is measured */
		char numbers[600] = "";
		if (err == -ENOSPC || err == -EDQUOT)
			describe_room(dir, dfd, err, room, numbers, sizeof numbers);
		DOS_FAIL(err, "cannot write %s: %s: %s%s", tmp_path, op, strerror(-err), numbers);
		close(dfd);
		return err;
	}
	if (renameat(dfd, tmp_name, dfd, name) != 0) {
		err = DOS_FAIL(-errno, "cannot rename %s to %s: rename: %s", tmp_path, path, strerror(errno));
		unlinkat(dfd, tmp_name, 0);
		close(dfd);
		return err;
	}
	/* From here on the new file is in place; what fails is reported, but it stays. */
	if ((err = sync_directory(dfd))) {
		err = DOS_FAIL(err, "%s is written but the directory %s could not be synced: fsync: %s", path, dir,
			       strerror(-err));
		close(dfd);
		return err;
	}
	*dfd_out = dfd;
	return 0;
}

struct checkpoint_writing {
	const struct dos_checkpoint_meta *meta;
	const float *const *arrays;
};

static int write_checkpoint_file(int fd, const void *ctx)
{
	const struct checkpoint_writing *w = ctx;
	return write_checkpoint(fd, w->meta, w->arrays);
}

/* The path of a saved file into path_out, when asked for and it fits. */
static int give_path(const char *path, char *path_out, size_t path_size)
{
	if (!path_out)
		return 0;
	size_t len = strlen(path);
	if (len >= path_size)
		return DOS_FAIL(-ENAMETOOLONG, "path_size = %zu is too small for the checkpoint path %s (%zu bytes)",
				path_size, path, len + 1);
	memcpy(path_out, path, len + 1);
	return 0;
}

int _dos_checkpoint_save(const char *dir, const struct dos_checkpoint_meta *meta, const float *master, const float *m,
			 const float *v, unsigned keep, char *path_out, size_t path_size)
{
	int err = check_save_arguments(dir, meta, master, m, v);
	if (err)
		return err;
	if (keep == 0)
		return DOS_FAIL(-EINVAL, "keep = 0: keep at least the checkpoint being written");
	if (meta->state_begin != 0 || state_len_of(meta) != meta->nparams)
		return DOS_FAIL(-EINVAL,
				"meta->state_begin = %" PRIu64 ", meta->state_len = %" PRIu64
				": a whole checkpoint holds every parameter (a shard: _dos_checkpoint_save_shard)",
				meta->state_begin, meta->state_len);
	char name[64], path[PATH_MAX];
	snprintf(name, sizeof name, "checkpoint-%" PRIu64 ".dos", meta->steps_done);
	if (path_out && (size_t)snprintf(NULL, 0, "%s/%s", dir, name) >= path_size)
		return DOS_FAIL(-ENAMETOOLONG, "path_size = %zu is too small for the checkpoint path %s/%s", path_size,
				dir, name);
	const float *const arrays[NSECTIONS] = {master, m, v};
	struct checkpoint_writing w = {meta, arrays};
	struct save_room room = {"a checkpoint",
				 file_len_of(DOS_CHECKPOINT_VERSION, meta->ntensors, state_len_of(meta)), keep};
	int dfd;
	if ((err = save_atomically(dir, name, write_checkpoint_file, &w, &room, path, &dfd)))
		return err;
	err = give_path(path, path_out, path_size);
	if (!err)
		err = remove_old_checkpoints(dir, dfd, path, meta->steps_done, keep, &meta->run);
	close(dfd);
	return err;
}

static void shard_name(char *name, size_t size, uint64_t steps_done, uint32_t shard, uint32_t nshards)
{
	snprintf(name, size, "checkpoint-%" PRIu64 ".shard-%" PRIu32 "-of-%" PRIu32 ".dos", steps_done, shard, nshards);
}

int _dos_checkpoint_save_shard(const char *dir, const struct dos_checkpoint_meta *meta, uint32_t shard,
			       uint32_t nshards, const float *master, const float *m, const float *v)
{
	int err = check_save_arguments(dir, meta, master, m, v);
	if (err)
		return err;
	if (nshards < 2 || shard >= nshards)
		return DOS_FAIL(-EINVAL,
				"shard = %" PRIu32 " of nshards = %" PRIu32 ": need shard < nshards, nshards >= 2",
				shard, nshards);
	if (meta->state_len == 0)
		return DOS_FAIL(-EINVAL, "meta->state_len = 0: a shard holds its rank's range");
	char name[128], path[PATH_MAX];
	shard_name(name, sizeof name, meta->steps_done, shard, nshards);
	const float *const arrays[NSECTIONS] = {master, m, v};
	struct checkpoint_writing w = {meta, arrays};
	struct save_room room = {"this shard", file_len_of(DOS_CHECKPOINT_VERSION, meta->ntensors, meta->state_len), 0};
	int dfd;
	if ((err = save_atomically(dir, name, write_checkpoint_file, &w, &room, path, &dfd)))
		return err;
	close(dfd);
	return 0;
}

/* ---- the manifest of a sharded checkpoint ---------------------------------------------- */

static const char manifest_magic[8] = "DOSMANI";
#define MANIFEST_VERSION 2
enum { MANIFEST_RUN = 40, MANIFEST_FIXED = 56, MANIFEST_ENTRY = 32 };

/* Where the shard entries start in a manifest of `version` (1 or 2). */
static uint32_t manifest_fixed(uint32_t version)
{
	return version >= 2 ? MANIFEST_FIXED : MANIFEST_RUN;
}

struct shard_entry {
	uint64_t begin, len;
	uint32_t header_crc, section_crc[NSECTIONS];
};

struct manifest {
	uint32_t nshards;
	uint64_t nparams, steps_done;
	struct _dos_run_id run;
	struct shard_entry *shards;
};

static int write_manifest(int fd, const void *ctx)
{
	const struct manifest *mf = ctx;
	unsigned char h[MANIFEST_FIXED] = {0};
	memcpy(h, manifest_magic, sizeof manifest_magic);
	put_u32(h, 8, MANIFEST_VERSION);
	put_u32(h, 12, BYTE_ORDER_MARKER);
	put_u32(h, 16, mf->nshards);
	put_u64(h, 24, mf->nparams);
	put_u64(h, 32, mf->steps_done);
	memcpy(h + MANIFEST_RUN, mf->run.bytes, sizeof mf->run.bytes);
	uint32_t crc = 0;
	int err = write_crc(fd, h, sizeof h, &crc);
	for (uint32_t i = 0; i < mf->nshards && !err; i++) {
		unsigned char e[MANIFEST_ENTRY] = {0};
		put_u64(e, 0, mf->shards[i].begin);
		put_u64(e, 8, mf->shards[i].len);
		put_u32(e, 16, mf->shards[i].header_crc);
		for (int k = 0; k < NSECTIONS; k++)
			put_u32(e, 20 + 4 * (size_t)k, mf->shards[i].section_crc[k]);
		err = write_crc(fd, e, sizeof e, &crc);
	}
	return err ? err : write_all(fd, &crc, sizeof crc);
}

static int read_shard_header(const char *path, const struct dos_checkpoint_meta *expect, struct shard_entry *entry,
			     unsigned char fixed[HEADER_FIXED]);
static void parse_meta(const unsigned char *h, const struct dos_checkpoint_meta *expect,
		       struct dos_checkpoint_meta *got);

int _dos_checkpoint_save_manifest(const char *dir, const struct dos_checkpoint_meta *meta, uint32_t nshards,
				  unsigned keep, char *path_out, size_t path_size)
{
	if (!dir || !meta)
		return DOS_FAIL(-EINVAL, "%s is NULL", !dir ? "dir" : "meta");
	if (nshards < 2 || nshards > (UINT32_MAX - MANIFEST_FIXED) / MANIFEST_ENTRY)
		return DOS_FAIL(-EINVAL, "nshards = %" PRIu32 ": a sharded checkpoint has at least 2", nshards);
	if (keep == 0)
		return DOS_FAIL(-EINVAL, "keep = 0: keep at least the checkpoint being written");
	if (meta->nparams == 0 || (!meta->numel && meta->ntensors > 0))
		return DOS_FAIL(-EINVAL, "meta describes no model (nparams = %" PRIu64 ", numel %p)", meta->nparams,
				(const void *)meta->numel);
	struct manifest mf = {
		.nshards = nshards, .nparams = meta->nparams, .steps_done = meta->steps_done, .run = meta->run};
	if (!(mf.shards = calloc(nshards, sizeof *mf.shards)))
		return DOS_FAIL(-ENOMEM, "no memory for a manifest of %" PRIu32 " shards", nshards);
	int err = 0;
	uint64_t next = 0;
	for (uint32_t i = 0; i < nshards && !err; i++) {
		char name[128], path[PATH_MAX];
		unsigned char fixed[HEADER_FIXED];
		shard_name(name, sizeof name, meta->steps_done, i, nshards);
		snprintf(path, sizeof path, "%s/%s", dir, name);
		if ((err = read_shard_header(path, meta, &mf.shards[i], fixed)))
			break;
		struct dos_checkpoint_meta shard;
		parse_meta(fixed, meta, &shard);
		if (mf.shards[i].begin != next || get_u64(fixed, OFF_STEPS_DONE) != meta->steps_done)
			err = DOS_FAIL(-EINVAL,
				       "shard %s holds parameters from %" PRIu64 " after step %" PRIu64
				       ", expected from %" PRIu64 " after step %" PRIu64,
				       path, mf.shards[i].begin, get_u64(fixed, OFF_STEPS_DONE), next,
				       meta->steps_done);
		else if (!_dos_run_id_equal(&shard.run, &meta->run)) {
			char theirs[DOS_RUN_ID_TEXT], ours[DOS_RUN_ID_TEXT];
			err = DOS_FAIL(-EINVAL, "shard %s is of run %s, not of this run %s", path,
				       _dos_run_id_text(&shard.run, theirs), _dos_run_id_text(&meta->run, ours));
		}
		next += mf.shards[i].len;
	}
	if (!err && next != meta->nparams)
		err = DOS_FAIL(-EINVAL, "the shards hold %" PRIu64 " parameters, the model has %" PRIu64, next,
			       meta->nparams);
	char name[64], path[PATH_MAX];
	snprintf(name, sizeof name, "checkpoint-%" PRIu64 ".dos", meta->steps_done);
	struct save_room room = {"the manifest", MANIFEST_FIXED + (uint64_t)nshards * MANIFEST_ENTRY + CRC_BYTES, 0};
	int dfd;
	if (!err && !(err = save_atomically(dir, name, write_manifest, &mf, &room, path, &dfd))) {
		err = give_path(path, path_out, path_size);
		if (!err)
			err = remove_old_checkpoints(dir, dfd, path, meta->steps_done, keep, &meta->run);
		close(dfd);
	}
	free(mf.shards);
	return err;
}

/* ---- load ----------------------------------------------------------------------------- */

/* Reads up to `len` bytes at `off`; fewer only at the end of the file. Returns the count
 * or -errno. */
static int64_t read_at(int fd, void *buf, size_t len, uint64_t off)
{
	unsigned char *p = buf;
	size_t done = 0;
	while (done < len) {
		size_t want = len - done < IO_CHUNK ? len - done : IO_CHUNK;
		ssize_t n = pread(fd, p + done, want, (off_t)(off + done));
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			break;
		done += (size_t)n;
	}
	return (int64_t)done;
}

/* An open checkpoint being read. */
struct reader {
	const char *path;
	int fd;
	uint64_t size;        /* of the file when opened */
	unsigned char *chunk; /* IO_CHUNK bytes, for the first pass */
};

/* Reads exactly `len` bytes at `off` into buf; the file's length was checked, so a short
 * read means it shrank under us. */
static int read_exact(const struct reader *r, void *buf, size_t len, uint64_t off)
{
	int64_t n = read_at(r->fd, buf, len, off);
	if (n < 0)
		return DOS_FAIL((int)n, "cannot read checkpoint %s: read at offset %" PRIu64 ": %s", r->path, off,
				strerror((int)-n));
	if ((uint64_t)n != len)
		return DOS_FAIL(-EIO,
				"checkpoint %s changed while being read: %" PRIu64 " bytes at offset %" PRIu64
				" instead of %zu",
				r->path, (uint64_t)n, off, len);
	return 0;
}

/* CRC32C of the `len` bytes at `off`, read in chunks; the bytes [win, win + win_len) of
 * them (counted from off) are copied into `dest` too when it is non-NULL. */
static int crc_of_range(const struct reader *r, uint64_t off, uint64_t len, uint64_t win, uint64_t win_len,
			unsigned char *dest, uint32_t *crc)
{
	for (uint64_t done = 0; done < len;) {
		size_t piece = len - done < IO_CHUNK ? (size_t)(len - done) : IO_CHUNK;
		int err = read_exact(r, r->chunk, piece, off + done);
		if (err)
			return err;
		*crc = crc32c(*crc, r->chunk, piece);
		uint64_t from = done > win ? done : win,
			 to = done + piece < win + win_len ? done + piece : win + win_len;
		if (dest && from < to)
			memcpy(dest + (from - win), r->chunk + (from - done), (size_t)(to - from));
		done += piece;
	}
	return 0;
}

/* The first differing numel entry between the file and `expect`, or UINT32_MAX. */
static int first_numel_difference(const struct reader *r, uint32_t version, const struct dos_checkpoint_meta *expect,
				  uint32_t *index, uint64_t *file_value)
{
	size_t per_chunk = IO_CHUNK / 8;
	*index = UINT32_MAX;
	for (uint32_t i = 0; i < expect->ntensors; i += (uint32_t)per_chunk) {
		size_t n = expect->ntensors - i < per_chunk ? expect->ntensors - i : per_chunk;
		int err = read_exact(r, r->chunk, 8 * n, numel_offset(version) + 8 * (uint64_t)i);
		if (err)
			return err;
		for (size_t k = 0; k < n; k++) {
			uint64_t x = get_u64(r->chunk, 8 * k);
			if (x != expect->numel[i + k]) {
				*index = i + (uint32_t)k;
				*file_value = x;
				return 0;
			}
		}
	}
	return 0;
}

/* Verifies what a checkpoint's header says of the file itself: magic, header CRC,
 * version, its parameter range and the file's length. */
static int check_header_integrity(const struct reader *r, const unsigned char *fixed)
{
	const char *path = r->path;
	uint64_t size = r->size;
	size_t have = size < HEADER_FIXED ? (size_t)size : HEADER_FIXED;
	size_t magic_have = have < sizeof checkpoint_magic ? have : sizeof checkpoint_magic;
	if (memcmp(fixed, checkpoint_magic, magic_have) != 0)
		return DOS_FAIL(-EINVAL, "%s is not a starpu-dos checkpoint (no DOSCKPT magic)", path);
	if (size < HEADER_ID)
		return DOS_FAIL(-EIO, "checkpoint %s is truncated: %" PRIu64 " bytes, expected at least %d", path, size,
				HEADER_ID);
	uint32_t marker = get_u32(fixed, OFF_MARKER);
	if (marker == BYTE_ORDER_SWAPPED)
		return DOS_FAIL(-EINVAL,
				"checkpoint %s was written on a machine of the other byte order (endianness marker "
				"0x%08" PRIx32 "); this program cannot read it",
				path, marker);
	uint32_t header_len = get_u32(fixed, OFF_HEADER_LEN);
	if (header_len < HEADER_ID + CRC_BYTES)
		return DOS_FAIL(-EIO, "checkpoint %s: corrupted header (header length %" PRIu32 ")", path, header_len);
	if (size < header_len)
		return DOS_FAIL(-EIO,
				"checkpoint %s is truncated: %" PRIu64 " bytes, expected at least %" PRIu32
				" for its header",
				path, size, header_len);
	/* the CRC covers [0, header_len - 4): the fixed part as already read, then the rest */
	uint32_t covered = header_len - CRC_BYTES, in_fixed = covered < HEADER_FIXED ? covered : HEADER_FIXED;
	uint32_t stored, computed = crc32c(0, fixed, in_fixed);
	int err = crc_of_range(r, in_fixed, covered - in_fixed, 0, 0, NULL, &computed);
	if (!err)
		err = read_exact(r, &stored, sizeof stored, covered);
	if (err)
		return err;
	if (stored != computed)
		return DOS_FAIL(-EIO,
				"checkpoint %s: corrupted header (CRC32C 0x%08" PRIx32 ", stored 0x%08" PRIx32 ")",
				path, computed, stored);
	/* A header with a valid CRC is what its writer meant: from here on, refusals are of
	 * another format or another model, not of damage. */
	uint32_t version = get_u32(fixed, OFF_VERSION);
	if (version < 2 || version > DOS_CHECKPOINT_VERSION)
		return DOS_FAIL(-EINVAL,
				"checkpoint %s has format version %" PRIu32 ", this program reads versions 2 to %d",
				path, version, DOS_CHECKPOINT_VERSION);
	if (marker != BYTE_ORDER_MARKER)
		return DOS_FAIL(-EINVAL, "checkpoint %s: endianness marker 0x%08" PRIx32 " is not 0x%08x", path, marker,
				BYTE_ORDER_MARKER);
	uint32_t ntensors = get_u32(fixed, OFF_NTENSORS);
	uint64_t nparams = get_u64(fixed, OFF_NPARAMS);
	if (header_len != header_len_of(version, ntensors) || nparams > MAX_NPARAMS)
		return DOS_FAIL(-EIO,
				"checkpoint %s: corrupted header (header length %" PRIu32 " for %" PRIu32
				" tensors, nparams = %" PRIu64 ")",
				path, header_len, ntensors, nparams);
	uint64_t begin = get_u64(fixed, OFF_STATE_BEGIN), len = get_u64(fixed, OFF_STATE_LEN);
	if (begin >= nparams || len == 0 || len > nparams - begin)
		return DOS_FAIL(
			-EIO, "checkpoint %s: corrupted header (parameters [%" PRIu64 ", +%" PRIu64 ") of %" PRIu64 ")",
			path, begin, len, nparams);
	uint64_t want = file_len_of(version, ntensors, len);
	if (size < want)
		return DOS_FAIL(-EIO, "checkpoint %s is truncated: %" PRIu64 " bytes, expected %" PRIu64, path, size,
				want);
	if (size > want)
		return DOS_FAIL(-EIO, "checkpoint %s has trailing garbage: %" PRIu64 " bytes, expected %" PRIu64, path,
				size, want);
	return 0;
}

/* Verifies a checkpoint's header (check_header_integrity), then that it is of the model
 * `expect` describes. */
static int check_header(const struct reader *r, const unsigned char *fixed, const struct dos_checkpoint_meta *expect)
{
	int err = check_header_integrity(r, fixed);
	if (err)
		return err;
	const char *path = r->path;
	uint32_t version = get_u32(fixed, OFF_VERSION), ntensors = get_u32(fixed, OFF_NTENSORS);
	uint64_t nparams = get_u64(fixed, OFF_NPARAMS);
	if (nparams != expect->nparams)
		return DOS_FAIL(-EINVAL, "checkpoint %s: nparams = %" PRIu64 ", but the model has %" PRIu64, path,
				nparams, expect->nparams);
	uint64_t subgroup = get_u64(fixed, OFF_SUBGROUP);
	if (subgroup != expect->subgroup_size)
		return DOS_FAIL(-EINVAL, "checkpoint %s: subgroup_size = %" PRIu64 ", but the model has %" PRIu64, path,
				subgroup, expect->subgroup_size);
	if (ntensors != expect->ntensors)
		return DOS_FAIL(-EINVAL, "checkpoint %s: ntensors = %" PRIu32 ", but the model has %" PRIu32, path,
				ntensors, expect->ntensors);
	uint32_t wd = get_u32(fixed, OFF_WEIGHT_DTYPE), gd = get_u32(fixed, OFF_GRAD_DTYPE);
	if (wd != (uint32_t)expect->weight_dtype)
		return DOS_FAIL(-EINVAL, "checkpoint %s: weight_dtype = %" PRIu32 " (%s), but the model has %d (%s)",
				path, wd, dtype_label(wd), (int)expect->weight_dtype,
				dos_dtype_name(expect->weight_dtype));
	if (gd != (uint32_t)expect->grad_dtype)
		return DOS_FAIL(-EINVAL, "checkpoint %s: grad_dtype = %" PRIu32 " (%s), but the model has %d (%s)",
				path, gd, dtype_label(gd), (int)expect->grad_dtype, dos_dtype_name(expect->grad_dtype));
	uint32_t index;
	uint64_t value = 0;
	if ((err = first_numel_difference(r, version, expect, &index, &value)))
		return err;
	if (index != UINT32_MAX)
		return DOS_FAIL(-EINVAL, "checkpoint %s: numel[%" PRIu32 "] = %" PRIu64 ", but the model has %" PRIu64,
				path, index, value, expect->numel[index]);
	return 0;
}

/* Damage found in a section: corruption in the first pass; in the second, the file has
 * changed since the first pass verified it. */
static int section_damage(const struct reader *r, int second_pass, int s, const char *what)
{
	if (second_pass)
		return DOS_FAIL(-EIO, "checkpoint %s changed while being read (section %s: %s)", r->path,
				section_names[s], what);
	return DOS_FAIL(-EIO, "checkpoint %s: section %s is corrupted (%s)", r->path, section_names[s], what);
}

/* Section `s` at `off`, of `len` floats: its tag and length, then its data (the floats
 * [win, win + win_len) of it into `dest` when non-NULL) and its CRC; *stored and
 * *computed receive the CRC the file holds and the one of the bytes read. */
static int read_section(const struct reader *r, int second_pass, int s, uint64_t off, uint64_t len, uint64_t win,
			uint64_t win_len, float *dest, uint32_t *stored, uint32_t *computed)
{
	unsigned char sh[SECTION_HEADER];
	int err = read_exact(r, sh, sizeof sh, off);
	if (err)
		return err;
	if (memcmp(sh, section_tags[s], 8) != 0)
		return section_damage(r, second_pass, s, "its tag is wrong");
	if (get_u64(sh, 8) != 4 * len) {
		char what[96];
		snprintf(what, sizeof what, "length %" PRIu64 " bytes, expected %" PRIu64, get_u64(sh, 8), 4 * len);
		return section_damage(r, second_pass, s, what);
	}
	*computed = crc32c(0, sh, sizeof sh);
	if ((err = crc_of_range(r, off + SECTION_HEADER, 4 * len, 4 * win, 4 * win_len, (unsigned char *)dest,
				computed)))
		return err;
	return read_exact(r, stored, sizeof *stored, off + SECTION_HEADER + 4 * len);
}

/* The meta a verified header describes; numel is the caller's. */
static void parse_meta(const unsigned char *h, const struct dos_checkpoint_meta *expect,
		       struct dos_checkpoint_meta *got)
{
	*got = (struct dos_checkpoint_meta){
		.nparams = get_u64(h, OFF_NPARAMS),
		.subgroup_size = get_u64(h, OFF_SUBGROUP),
		.ntensors = get_u32(h, OFF_NTENSORS),
		.numel = expect->numel,
		.weight_dtype = (enum dos_dtype)get_u32(h, OFF_WEIGHT_DTYPE),
		.grad_dtype = (enum dos_dtype)get_u32(h, OFF_GRAD_DTYPE),
		.step = get_u64(h, OFF_STEP),
		.skipped_steps = get_u64(h, OFF_SKIPPED),
		.steps_done = get_u64(h, OFF_STEPS_DONE),
		.loss_scale = get_f64(h, OFF_LOSS_SCALE),
		.good_steps = get_u32(h, OFF_GOOD_STEPS),
		.seed = get_u64(h, OFF_SEED),
		.data_rng = get_u64(h, OFF_DATA_RNG),
		.hp = {.mode = (enum dos_adam_mode)get_u32(h, OFF_HP_MODE),
		       .lr = get_f64(h, OFF_HP_LR),
		       .beta1 = get_f64(h, OFF_HP_BETA1),
		       .beta2 = get_f64(h, OFF_HP_BETA2),
		       .eps = get_f64(h, OFF_HP_EPS),
		       .weight_decay = get_f64(h, OFF_HP_WEIGHT_DECAY)},
	};
	if (get_u32(h, OFF_VERSION) >= 3) /* else unknown: all zeros */
		memcpy(got->run.bytes, h + OFF_RUN, sizeof got->run.bytes);
}

/* A checkpoint file (whole, or a shard) being loaded: its reader, verified header and the
 * CRCs of its sections from the verifying pass. */
struct checkpoint_file {
	struct reader r;
	unsigned char fixed[HEADER_FIXED];
	uint64_t header_len, begin, len; /* the header's bytes; the parameters it holds */
	uint32_t header_crc, section_crc[NSECTIONS];
	uint32_t entry_crc[NSECTIONS]; /* a shard's: the section CRCs its manifest records */
};

/* Opens `path` for reading: a regular file, not a FIFO or a directory. */
static int open_reader(struct reader *r, const char *path)
{
	/* O_NONBLOCK: a FIFO given as path is refused below instead of blocking here. */
	*r = (struct reader){.path = path, .fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK)};
	if (r->fd < 0)
		return DOS_FAIL(-errno, "cannot open checkpoint %s: %s", path, strerror(errno));
	struct stat st;
	int err = 0;
	if (fstat(r->fd, &st) != 0)
		err = DOS_FAIL(-errno, "cannot read checkpoint %s: fstat: %s", path, strerror(errno));
	else if (S_ISDIR(st.st_mode))
		err = DOS_FAIL(-EISDIR, "checkpoint %s is a directory", path);
	else if (!S_ISREG(st.st_mode))
		err = DOS_FAIL(-EINVAL, "checkpoint %s is not a regular file", path);
	else if (!(r->chunk = malloc(IO_CHUNK)))
		err = DOS_FAIL(-ENOMEM, "no memory to read checkpoint %s", path);
	if (err) {
		close(r->fd);
		r->fd = -1;
		return err;
	}
	r->size = (uint64_t)st.st_size;
	return 0;
}

static void close_reader(struct reader *r)
{
	free(r->chunk);
	if (r->fd >= 0)
		close(r->fd);
	r->chunk = NULL;
	r->fd = -1;
}

/* Reads and verifies f's header against `expect`: its range, its header CRC. */
static int verify_header(struct checkpoint_file *f, const struct dos_checkpoint_meta *expect)
{
	struct reader *r = &f->r;
	memset(f->fixed, 0, sizeof f->fixed);
	int64_t n = read_at(r->fd, f->fixed, sizeof f->fixed, 0);
	if (n < 0)
		return DOS_FAIL((int)n, "cannot read checkpoint %s: read: %s", r->path, strerror((int)-n));
	if ((uint64_t)n != (r->size < HEADER_FIXED ? r->size : HEADER_FIXED))
		return DOS_FAIL(-EIO,
				"checkpoint %s changed while being read (%" PRId64 " header bytes of %" PRIu64 ")",
				r->path, n, r->size);
	int err = check_header(r, f->fixed, expect);
	if (err)
		return err;
	f->header_len = get_u32(f->fixed, OFF_HEADER_LEN);
	f->begin = get_u64(f->fixed, OFF_STATE_BEGIN);
	f->len = get_u64(f->fixed, OFF_STATE_LEN);
	return read_exact(r, &f->header_crc, sizeof f->header_crc, f->header_len - CRC_BYTES);
}

/* The first pass over f: every section verified, nothing of the caller's written. */
static int verify_sections(struct checkpoint_file *f)
{
	for (int s = 0; s < NSECTIONS; s++) {
		uint32_t stored, computed;
		uint64_t off = f->header_len + (uint64_t)s * section_len_of(f->len);
		int err = read_section(&f->r, 0, s, off, f->len, 0, 0, NULL, &stored, &computed);
		if (err)
			return err;
		if (stored != computed)
			return DOS_FAIL(-EIO,
					"checkpoint %s: section %s is corrupted (CRC32C 0x%08" PRIx32
					", stored 0x%08" PRIx32 ")",
					f->r.path, section_names[s], computed, stored);
		f->section_crc[s] = computed;
	}
	return 0;
}

/* The second pass over a verified f: the parameters [begin, begin + count) it holds of
 * those the caller wants go into the caller's arrays (indexed from want_begin; a NULL
 * array is not wanted), each section's CRC computed again and compared with the first
 * pass's, so that a file rewritten in place in between is noticed. Only in that unlikely
 * case are the arrays left partly written (and -EIO "changed while being read"
 * returned). */
static int copy_sections(struct checkpoint_file *f, uint64_t want_begin, uint64_t want_len,
			 float *const arrays[NSECTIONS])
{
	uint64_t from = f->begin > want_begin ? f->begin : want_begin;
	uint64_t to = f->begin + f->len < want_begin + want_len ? f->begin + f->len : want_begin + want_len;
	if (from >= to)
		return 0;
	for (int s = 0; s < NSECTIONS; s++) {
		if (!arrays[s])
			continue;
		uint32_t stored, computed;
		uint64_t off = f->header_len + (uint64_t)s * section_len_of(f->len);
		int err = read_section(&f->r, 1, s, off, f->len, from - f->begin, to - from,
				       arrays[s] + (from - want_begin), &stored, &computed);
		if (err)
			return err;
		if (stored != f->section_crc[s] || computed != f->section_crc[s])
			return DOS_FAIL(-EIO, "checkpoint %s changed while being read (section %s)", f->r.path,
					section_names[s]);
	}
	return 0;
}

/* A manifest's shards, read from `path` and verified (magic, version, CRC, the model's
 * parameter count, shards tiling it); expect NULL: the manifest's own parameter count. */
static int read_manifest(const char *path, struct reader *r, const struct dos_checkpoint_meta *expect,
			 struct manifest *mf)
{
	const uint64_t max_shards = (UINT32_MAX - MANIFEST_FIXED) / MANIFEST_ENTRY;
	if (r->size < MANIFEST_RUN + CRC_BYTES)
		return DOS_FAIL(-EIO, "checkpoint manifest %s is truncated: %" PRIu64 " bytes", path, r->size);
	if (r->size > MANIFEST_FIXED + max_shards * MANIFEST_ENTRY + CRC_BYTES)
		return DOS_FAIL(-EIO, "checkpoint manifest %s is corrupted: %" PRIu64 " bytes", path, r->size);
	unsigned char *b = malloc((size_t)r->size);
	if (!b)
		return DOS_FAIL(-ENOMEM, "no memory to read checkpoint manifest %s", path);
	int err = read_exact(r, b, (size_t)r->size, 0);
	uint32_t stored = 0, computed = 0;
	if (!err) {
		stored = get_u32(b, (size_t)r->size - CRC_BYTES);
		computed = crc32c(0, b, (size_t)r->size - CRC_BYTES);
	}
	uint32_t nshards = err ? 0 : get_u32(b, 16), version = err ? 0 : get_u32(b, 8);
	uint64_t nparams = err ? 0 : expect ? expect->nparams : get_u64(b, 24);
	if (err) {
	} else if (get_u32(b, 12) == BYTE_ORDER_SWAPPED)
		err = DOS_FAIL(-EINVAL, "checkpoint manifest %s was written on a machine of the other byte order",
			       path);
	else if (stored != computed)
		err = DOS_FAIL(-EIO,
			       "checkpoint manifest %s is corrupted (CRC32C 0x%08" PRIx32 ", stored 0x%08" PRIx32 ")",
			       path, computed, stored);
	else if (version < 1 || version > MANIFEST_VERSION)
		err = DOS_FAIL(-EINVAL,
			       "checkpoint manifest %s has format version %" PRIu32
			       ", this program reads versions 1 to %d",
			       path, version, MANIFEST_VERSION);
	else if (get_u32(b, 12) != BYTE_ORDER_MARKER || nshards < 2 ||
		 r->size != manifest_fixed(version) + (uint64_t)nshards * MANIFEST_ENTRY + CRC_BYTES)
		err = DOS_FAIL(-EIO, "checkpoint manifest %s is corrupted (%" PRIu32 " shards in %" PRIu64 " bytes)",
			       path, nshards, r->size);
	else if (get_u64(b, 24) != nparams)
		err = DOS_FAIL(-EINVAL, "checkpoint %s: nparams = %" PRIu64 ", but the model has %" PRIu64, path,
			       get_u64(b, 24), nparams);
	else if (!(mf->shards = calloc(nshards, sizeof *mf->shards)))
		err = DOS_FAIL(-ENOMEM, "no memory for the %" PRIu32 " shards of %s", nshards, path);
	uint64_t next = 0;
	for (uint32_t i = 0; !err && i < nshards; i++) {
		const unsigned char *e = b + manifest_fixed(version) + (size_t)i * MANIFEST_ENTRY;
		mf->shards[i] = (struct shard_entry){
			get_u64(e, 0), get_u64(e, 8), get_u32(e, 16), {get_u32(e, 20), get_u32(e, 24), get_u32(e, 28)}};
		if (mf->shards[i].begin != next || mf->shards[i].len == 0 || mf->shards[i].len > nparams - next)
			err = DOS_FAIL(-EIO,
				       "checkpoint manifest %s is corrupted (shard %" PRIu32 " holds [%" PRIu64
				       ", +%" PRIu64 "))",
				       path, i, mf->shards[i].begin, mf->shards[i].len);
		next += mf->shards[i].len;
	}
	if (!err && next != nparams)
		err = DOS_FAIL(-EIO,
			       "checkpoint manifest %s is corrupted (its shards hold %" PRIu64 " of %" PRIu64
			       " parameters)",
			       path, next, nparams);
	if (!err) {
		mf->nshards = nshards;
		mf->nparams = nparams;
		mf->steps_done = get_u64(b, 32);
		memset(mf->run.bytes, 0, sizeof mf->run.bytes); /* version 1: unknown */
		if (version >= 2)
			memcpy(mf->run.bytes, b + MANIFEST_RUN, sizeof mf->run.bytes);
	} else {
		free(mf->shards);
		mf->shards = NULL;
	}
	free(b);
	return err;
}

static int read_shard_header(const char *path, const struct dos_checkpoint_meta *expect, struct shard_entry *entry,
			     unsigned char fixed[HEADER_FIXED])
{
	struct checkpoint_file f;
	int err = open_reader(&f.r, path);
	if (err)
		return err;
	if (!(err = verify_header(&f, expect))) {
		*entry = (struct shard_entry){f.begin, f.len, f.header_crc, {0}};
		memcpy(fixed, f.fixed, HEADER_FIXED);
	}
	/* the sections' stored CRCs (the loader verifies them against the data) */
	for (int k = 0; !err && k < NSECTIONS; k++)
		err = read_exact(&f.r, &entry->section_crc[k], CRC_BYTES,
				 f.header_len + (uint64_t)(k + 1) * section_len_of(f.len) - CRC_BYTES);
	close_reader(&f.r);
	return err;
}

static int check_load_arguments(const char *path, const struct dos_checkpoint_meta *expect,
				const struct dos_checkpoint_meta *got)
{
	if (!path)
		return DOS_FAIL(-EINVAL, "path is NULL");
	if (!expect)
		return DOS_FAIL(-EINVAL, "expect is NULL");
	if (!got)
		return DOS_FAIL(-EINVAL, "got is NULL");
	if (expect->nparams == 0)
		return DOS_FAIL(-EINVAL, "expect->nparams = 0");
	if (expect->nparams > MAX_NPARAMS || expect->nparams > SIZE_MAX / 4)
		return DOS_FAIL(-EINVAL, "expect->nparams = %" PRIu64 " is too large", expect->nparams);
	if (expect->ntensors > MAX_NTENSORS)
		return DOS_FAIL(-EINVAL, "expect->ntensors = %" PRIu32 " is more than the format's %u",
				expect->ntensors, (unsigned)MAX_NTENSORS);
	if (!expect->numel && expect->ntensors > 0)
		return DOS_FAIL(-EINVAL, "expect->numel is NULL but expect->ntensors = %" PRIu32, expect->ntensors);
	return 0;
}

int _dos_checkpoint_load_range(const char *path, const struct dos_checkpoint_meta *expect, uint64_t begin, uint64_t len,
			       struct dos_checkpoint_meta *got, float *master, float *m, float *v)
{
	int err = check_load_arguments(path, expect, got);
	if (err)
		return err;
	if (len == 0 || begin >= expect->nparams || len > expect->nparams - begin)
		return DOS_FAIL(-EINVAL,
				"begin = %" PRIu64 ", len = %" PRIu64 ": not a range of the model's %" PRIu64
				" parameters",
				begin, len, expect->nparams);
	struct reader top;
	if ((err = open_reader(&top, path)))
		return err;
	unsigned char magic[8] = {0};
	int64_t n = read_at(top.fd, magic, sizeof magic, 0);
	int is_manifest = n == (int64_t)sizeof magic && memcmp(magic, manifest_magic, sizeof magic) == 0;

	/* the files that hold the range: the checkpoint itself, or the manifest's shards */
	struct manifest mf = {0};
	struct checkpoint_file *files = NULL;
	uint32_t nfiles = 0;
	char **paths = NULL;
	if (!is_manifest) {
		if (!(files = calloc(1, sizeof *files)))
			err = DOS_FAIL(-ENOMEM, "no memory to read checkpoint %s", path);
		else {
			files[0].r = top;
			top.fd = -1;
			top.chunk = NULL;
			nfiles = 1;
		}
	} else if (!(err = read_manifest(path, &top, expect, &mf))) {
		const char *slash = strrchr(path, '/');
		int dir_len = slash ? (int)(slash - path) : 1;
		const char *dir = slash ? path : ".";
		files = calloc(mf.nshards, sizeof *files);
		paths = calloc(mf.nshards, sizeof *paths);
		if (!files || !paths)
			err = DOS_FAIL(-ENOMEM, "no memory to read the shards of %s", path);
		for (uint32_t i = 0; !err && i < mf.nshards; i++) {
			const struct shard_entry *e = &mf.shards[i];
			if (e->begin + e->len <= begin || e->begin >= begin + len)
				continue; /* holds nothing wanted */
			char name[128];
			shard_name(name, sizeof name, mf.steps_done, i, mf.nshards);
			if (!(paths[nfiles] = malloc(PATH_MAX)))
				err = DOS_FAIL(-ENOMEM, "no memory to read the shards of %s", path);
			else if (snprintf(paths[nfiles], PATH_MAX, "%.*s/%s", dir_len, dir, name) >= PATH_MAX)
				err = DOS_FAIL(-ENAMETOOLONG, "the shards of %s have too long a path", path);
			else if (!(err = open_reader(&files[nfiles].r, paths[nfiles]))) {
				if (!(err = verify_header(&files[nfiles], expect)) &&
				    (files[nfiles].header_crc != e->header_crc || files[nfiles].begin != e->begin ||
				     files[nfiles].len != e->len ||
				     get_u64(files[nfiles].fixed, OFF_STEPS_DONE) != mf.steps_done))
					err = DOS_FAIL(-EIO,
						       "checkpoint %s: shard %s is not the one the manifest names "
						       "(header CRC32C 0x%08" PRIx32 ", the manifest says 0x%08" PRIx32
						       ")",
						       path, paths[nfiles], files[nfiles].header_crc, e->header_crc);
				memcpy(files[nfiles].entry_crc, e->section_crc, sizeof e->section_crc);
				nfiles++;
			}
		}
	}
	close_reader(&top);

	/* first pass over every file, then the second: nothing is written unless all verify */
	for (uint32_t i = 0; !err && i < nfiles; i++) {
		if (!is_manifest && !(err = verify_header(&files[i], expect)) &&
		    (files[i].begin > begin || files[i].begin + files[i].len < begin + len))
			err = DOS_FAIL(-EINVAL,
				       "checkpoint %s holds parameters [%" PRIu64 ", %" PRIu64 "), not all of [%" PRIu64
				       ", %" PRIu64 ")",
				       path, files[i].begin, files[i].begin + files[i].len, begin, begin + len);
		if (!err)
			err = verify_sections(&files[i]);
		for (int k = 0; !err && is_manifest && k < NSECTIONS; k++)
			if (files[i].section_crc[k] != files[i].entry_crc[k])
				err = DOS_FAIL(-EIO,
					       "checkpoint %s: shard %s is not the one the manifest names (section %s "
					       "CRC32C 0x%08" PRIx32 ", the manifest says 0x%08" PRIx32 ")",
					       path, files[i].r.path, section_names[k], files[i].section_crc[k],
					       files[i].entry_crc[k]);
	}
	float *const arrays[NSECTIONS] = {master, m, v};
	for (uint32_t i = 0; !err && i < nfiles; i++)
		err = copy_sections(&files[i], begin, len, arrays);
	if (!err) {
		parse_meta(files[0].fixed, expect, got);
		got->state_begin = begin;
		got->state_len = len;
	}
	for (uint32_t i = 0; i < nfiles; i++)
		close_reader(&files[i].r);
	for (uint32_t i = 0; paths && i < mf.nshards; i++)
		free(paths[i]);
	free(paths);
	free(files);
	free(mf.shards);
	return err;
}

int _dos_checkpoint_load(const char *path, const struct dos_checkpoint_meta *expect, struct dos_checkpoint_meta *got,
			 float *master, float *m, float *v)
{
	int err = check_load_arguments(path, expect, got);
	if (err)
		return err;
	if (!master || !m || !v)
		return DOS_FAIL(-EINVAL, "%s is NULL", !master ? "master" : !m ? "m" : "v");
	return _dos_checkpoint_load_range(path, expect, 0, expect->nparams, got, master, m, v);
}

/* ---- latest --------------------------------------------------------------------------- */

int _dos_checkpoint_latest(const char *dir, char *path, size_t path_size)
{
	if (!dir)
		return DOS_FAIL(-EINVAL, "dir is NULL");
	if (!path)
		return DOS_FAIL(-EINVAL, "path is NULL");
	uint64_t *ns;
	size_t count;
	int err = list_checkpoints(dir, &ns, &count);
	if (err)
		return err;
	if (count == 0) {
		free(ns);
		return DOS_FAIL(-ENOENT, "no checkpoint-<N>.dos in %s", dir);
	}
	uint64_t latest = ns[0];
	free(ns);
	int len = snprintf(NULL, 0, "%s/checkpoint-%" PRIu64 ".dos", dir, latest);
	if (len < 0 || (size_t)len >= path_size)
		return DOS_FAIL(-ENAMETOOLONG,
				"path_size = %zu is too small for %s/checkpoint-%" PRIu64 ".dos (%d bytes)", path_size,
				dir, latest, len + 1);
	snprintf(path, path_size, "%s/checkpoint-%" PRIu64 ".dos", dir, latest);
	return 0;
}

/* ---- run identities -------------------------------------------------------------------- */

int _dos_run_id_new(struct _dos_run_id *run)
{
	size_t got = 0;
	while (got < sizeof run->bytes) {
		ssize_t n = getrandom(run->bytes + got, sizeof run->bytes - got, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return DOS_FAIL(n < 0 ? -errno : -EIO, "cannot draw a run identity: getrandom: %s",
					n < 0 ? strerror(errno) : "no bytes");
		got += (size_t)n;
	}
	if (!_dos_run_id_known(run)) /* all zeros means unknown: never drawn as an identity */
		run->bytes[0] = 1;
	return 0;
}

int _dos_run_id_equal(const struct _dos_run_id *a, const struct _dos_run_id *b)
{
	return memcmp(a->bytes, b->bytes, sizeof a->bytes) == 0;
}

int _dos_run_id_known(const struct _dos_run_id *run)
{
	static const struct _dos_run_id unknown;
	return !_dos_run_id_equal(run, &unknown);
}

const char *_dos_run_id_text(const struct _dos_run_id *run, char text[DOS_RUN_ID_TEXT])
{
	if (!_dos_run_id_known(run)) {
		snprintf(text, DOS_RUN_ID_TEXT, "(unknown: saved before runs had identities)");
		return text;
	}
	for (size_t i = 0; i < sizeof run->bytes; i++)
		snprintf(text + 2 * i, DOS_RUN_ID_TEXT - 2 * i, "%02x", run->bytes[i]);
	return text;
}

/* `why` with every mention of `path` cut to its file name (the folder is said once, by
 * whoever reports it). */
static void shorten_reason(char *why, const char *path)
{
	const char *name = strrchr(path, '/');
	size_t cut = name ? (size_t)(name + 1 - path) : 0;
	for (char *at; cut && (at = strstr(why, path));)
		memmove(at, at + cut, strlen(at + cut) + 1);
}

/* The run the checkpoint file, shard or manifest dir/name belongs to, from its header
 * alone (whose CRC is checked; its data is not read). Returns 0, or a negative errno with
 * what is wrong in why (and not printed, nor left in dos_last_error: an unreadable file
 * is the caller's finding, not an error). */
static int file_identity(const char *dir, const char *name, struct _dos_run_id *run, char *why, size_t why_size)
{
	char path[PATH_MAX];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	struct dos_error_hold hold;
	_dos_hold_errors(&hold);
	struct reader r;
	int err = open_reader(&r, path);
	unsigned char fixed[HEADER_FIXED] = {0};
	int64_t n = err ? 0 : read_at(r.fd, fixed, sizeof fixed, 0);
	if (!err && n < (int64_t)sizeof manifest_magic)
		err = DOS_FAIL(-EIO, "%s is truncated: %" PRIu64 " bytes", path, r.size);
	else if (!err && memcmp(fixed, manifest_magic, sizeof manifest_magic) == 0) {
		struct manifest mf = {0};
		if (!(err = read_manifest(path, &r, NULL, &mf)))
			*run = mf.run;
		free(mf.shards);
	} else if (!err && !(err = check_header_integrity(&r, fixed))) {
		struct dos_checkpoint_meta meta = {0}, got;
		parse_meta(fixed, &meta, &got);
		*run = got.run;
	}
	close_reader(&r);
	if (err) {
		snprintf(why, why_size, "%s", _dos_last_error_message());
		shorten_reason(why, path);
	}
	_dos_release_errors(&hold);
	return err;
}

/* ---- a checkpoint on its own ------------------------------------------------------------ */

/* The layout a whole checkpoint or shard at `path` describes in its header (checked for
 * integrity, not against any model): meta, with its numel in *numel (malloc'ed). */
static int describe_file(const char *path, struct dos_checkpoint_meta *meta, uint64_t **numel)
{
	struct reader r;
	int err = open_reader(&r, path);
	unsigned char fixed[HEADER_FIXED] = {0};
	if (!err && read_at(r.fd, fixed, sizeof fixed, 0) < 0)
		err = DOS_FAIL(-EIO, "cannot read checkpoint %s", path);
	if (!err)
		err = check_header_integrity(&r, fixed);
	*numel = NULL;
	if (!err) {
		struct dos_checkpoint_meta none = {0};
		parse_meta(fixed, &none, meta);
		size_t bytes = 8 * (size_t)meta->ntensors;
		if (!(*numel = malloc(bytes ? bytes : 1)))
			err = DOS_FAIL(-ENOMEM, "no memory for the %" PRIu32 " tensor sizes of %s", meta->ntensors,
				       path);
		else
			err = read_exact(&r, *numel, bytes, numel_offset(get_u32(fixed, OFF_VERSION)));
		meta->numel = *numel;
	}
	close_reader(&r);
	if (err) {
		free(*numel);
		*numel = NULL;
	}
	return err;
}

/* Verifies the checkpoint at `path` (a whole one or a manifest with its shards) entirely,
 * against the layout it describes itself. */
static int verify_on_its_own(const char *path)
{
	struct reader r;
	int err = open_reader(&r, path);
	unsigned char magic[sizeof manifest_magic] = {0};
	if (!err && read_at(r.fd, magic, sizeof magic, 0) < 0)
		err = DOS_FAIL(-EIO, "cannot read checkpoint %s", path);
	char described[PATH_MAX];
	snprintf(described, sizeof described, "%s", path);
	if (!err && memcmp(magic, manifest_magic, sizeof magic) == 0) {
		/* a manifest describes no layout: its first shard does */
		struct manifest mf = {0};
		if (!(err = read_manifest(path, &r, NULL, &mf))) {
			char name[128];
			const char *slash = strrchr(path, '/');
			shard_name(name, sizeof name, mf.steps_done, 0, mf.nshards);
			snprintf(described, sizeof described, "%.*s%s", slash ? (int)(slash - path + 1) : 0, path,
				 name);
		}
		free(mf.shards);
	}
	close_reader(&r);
	struct dos_checkpoint_meta meta, got;
	uint64_t *numel = NULL;
	if (!err && !(err = describe_file(described, &meta, &numel)))
		err = _dos_checkpoint_load_range(path, &meta, 0, meta.nparams, &got, NULL, NULL, NULL);
	free(numel);
	return err;
}

/* The path of checkpoint N of dir into path (PATH_MAX bytes). */
static int checkpoint_path(const char *dir, uint64_t n, char *path)
{
	if (snprintf(path, PATH_MAX, "%s/checkpoint-%" PRIu64 ".dos", dir, n) >= PATH_MAX)
		return DOS_FAIL(-ENAMETOOLONG, "dir = '%.200s...' is too long for a checkpoint path", dir);
	return 0;
}

/* Appends "; <name>: <why>" to a list of reasons (size bytes), or " ..." once it is full. */
static void add_reason(char *list, size_t size, const char *name, const char *why)
{
	size_t len = strlen(list);
	if (len + 8 >= size)
		return;
	int n = snprintf(list + len, size - len, "%s%s: %s", len ? "; " : "", name, why);
	if (n < 0 || (size_t)n >= size - len)
		snprintf(list + (size - 5), 5, "...");
}

int _dos_checkpoint_newest_valid(const char *dir, const struct _dos_checkpoint_search *search, char *path,
				 size_t path_size)
{
	if (!dir)
		return DOS_FAIL(-EINVAL, "dir is NULL");
	if (!path)
		return DOS_FAIL(-EINVAL, "path is NULL");
	uint64_t *ns;
	size_t count;
	int err = list_checkpoints(dir, &ns, &count);
	if (err)
		return err;
	char candidate[PATH_MAX], reasons[400] = "";
	int found = 0;
	for (size_t i = 0; i < count && !found && !err; i++) {
		if ((err = checkpoint_path(dir, ns[i], candidate)))
			break;
		struct dos_error_hold hold;
		_dos_hold_errors(&hold);
		int bad = verify_on_its_own(candidate);
		char why[512];
		snprintf(why, sizeof why, "%s", _dos_last_error_message());
		_dos_release_errors(&hold);
		shorten_reason(why, candidate);
		if (!bad) {
			found = 1;
			break;
		}
		if (search && search->skipped)
			search->skipped(search->arg, candidate, why);
		add_reason(reasons, sizeof reasons, strrchr(candidate, '/') + 1, why);
	}
	free(ns);
	if (err)
		return err;
	if (!found)
		return count ? DOS_FAIL(-ENOENT, "none of the %zu checkpoints in %s verifies: %s", count, dir, reasons)
			     : DOS_FAIL(-ENOENT, "no checkpoint-<N>.dos in %s", dir);
	return give_path(candidate, path, path_size);
}

/* ---- folders ----------------------------------------------------------------------------- */

#define LOCK_NAME ".starpu-dos.lock"

/* Whether `name` is the temporary file of a save (save_atomically's ".<name>.tmp-<pid>")
 * or a probe of the folder (base/files.c). */
static int is_temporary(const char *name)
{
	return (strncmp(name, ".checkpoint-", 12) == 0 && strstr(name, ".dos.tmp-")) ||
	       strncmp(name, ".dos-probe-", 11) == 0;
}

/* Removes the temporary files of saves that were killed: called with the folder's lock
 * held, when no save of this folder can be under way. */
static void remove_stale_temporaries(const char *dir)
{
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = dfd < 0 ? NULL : fdopendir(dfd);
	if (!d) {
		if (dfd >= 0)
			close(dfd);
		return;
	}
	unsigned removed = 0;
	for (struct dirent *e; (e = readdir(d));)
		if (is_temporary(e->d_name) && unlinkat(dfd, e->d_name, 0) == 0)
			removed++;
	if (removed)
		sync_directory(dfd);
	closedir(d);
}

/* Locks dir's LOCK_NAME for this process, writing "pid P on HOST" into it. */
static int lock_folder(struct _dos_checkpoint_folder *f)
{
	char path[PATH_MAX], host[256] = "?", holder[160] = "";
	if (snprintf(path, sizeof path, "%s/%s", f->dir, LOCK_NAME) >= (int)sizeof path)
		return DOS_FAIL(-ENAMETOOLONG, "checkpoint folder '%.200s...' has too long a name", f->dir);
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
	if (fd < 0)
		return DOS_FAIL(-errno, "checkpoint folder %s: cannot create its lock file %s: %s", f->dir, LOCK_NAME,
				strerror(errno));
	if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
		int err = errno;
		if (err == EWOULDBLOCK) {
			ssize_t n = pread(fd, holder, sizeof holder - 1, 0);
			holder[n > 0 ? n : 0] = 0;
			holder[strcspn(holder, "\n")] = 0;
			long pid = 0;
			char on[256] = "";
			gethostname(host, sizeof host - 1);
			int ours = sscanf(holder, "pid %ld on %255s", &pid, on) == 2 && pid == (long)getpid() &&
				   !strcmp(on, host);
			close(fd);
			return _dos_fail(
				-EBUSY, "_dos_checkpoint_folder_take",
				"checkpoint folder %s is in use by %s (%s): a folder takes one run at a time; wait "
				"for it to end, or use another folder",
				f->dir, ours ? "this process (another optimizer?)" : "another process",
				*holder ? holder : "its pid not written yet");
		}
		/* a file system without locks: say so, and go on without */
		_dos_warn("checkpoint folder %s cannot be locked (flock: %s): nothing keeps a second process out of it",
			  f->dir, strerror(err));
		close(fd);
		return 0;
	}
	gethostname(host, sizeof host - 1);
	int len = snprintf(holder, sizeof holder, "pid %ld on %s\n", (long)getpid(), host);
	if (ftruncate(fd, 0) != 0 || pwrite(fd, holder, (size_t)len, 0) != len) {
		/* the lock holds all the same; only the message of a refused process is poorer */
	}
	f->lock_fd = fd;
	return 1;
}

int _dos_checkpoint_folder_take(struct _dos_checkpoint_folder *f, const char *dir, int lock)
{
	if (!f)
		return DOS_FAIL(-EINVAL, "f is NULL");
	*f = (struct _dos_checkpoint_folder)DOS_CHECKPOINT_FOLDER_INIT;
	if (!dir)
		return DOS_FAIL(-EINVAL, "dir is NULL");
	char why[600];
	int err = _dos_make_folder(dir, why, sizeof why);
	if (!err)
		err = _dos_check_writable_folder(dir, why, sizeof why);
	if (err)
		return DOS_FAIL(err, "checkpoint folder %s: %s", dir, why);
	if (!(f->dir = strdup(dir)))
		return DOS_FAIL(-ENOMEM, "no memory for the name of the checkpoint folder %s", dir);
	if (lock) {
		int locked = lock_folder(f);
		if (locked < 0) {
			_dos_checkpoint_folder_release(f);
			return locked;
		}
		if (locked)
			remove_stale_temporaries(dir);
	}
	return 0;
}

void _dos_checkpoint_folder_release(struct _dos_checkpoint_folder *f)
{
	if (!f)
		return;
	if (f->lock_fd >= 0)
		close(f->lock_fd); /* the lock goes with the last descriptor */
	free(f->dir);
	*f = (struct _dos_checkpoint_folder)DOS_CHECKPOINT_FOLDER_INIT;
}

/* Refuses (-EEXIST) a folder holding checkpoints (whole, manifests, shards) of a run other
 * than `run`, or, when strict, whose run cannot be read; the message lists them. */
static int refuse_others(const char *function, const char *dir, const struct _dos_run_id *run, int strict,
			 const char *advice)
{
	DIR *d = opendir(dir);
	if (!d)
		return DOS_FAIL(-errno, "cannot read the checkpoint folder %s: %s", dir, strerror(errno));
	char names[240] = "", unreadable[240] = "", other[DOS_RUN_ID_TEXT] = "";
	/* unfinished: shards whose manifest was never written (a job killed in its save) */
	size_t others = 0, damaged = 0, unfinished = 0;
	uint64_t latest = 0;
	for (struct dirent *e; (e = readdir(d));) {
		uint64_t n;
		int shard;
		struct _dos_run_id id;
		char why[200];
		if (!parse_checkpoint_name(e->d_name, &n, &shard))
			continue;
		if (file_identity(dir, e->d_name, &id, why, sizeof why) != 0) {
			if (strict && damaged++ < 2)
				add_reason(unreadable, sizeof unreadable, e->d_name, why);
			continue;
		}
		if (_dos_run_id_equal(&id, run))
			continue;
		char manifest[64];
		snprintf(manifest, sizeof manifest, "checkpoint-%" PRIu64 ".dos", n);
		if (shard && faccessat(dirfd(d), manifest, F_OK, 0) != 0)
			unfinished++;
		if (!others++ || n > latest) {
			latest = n;
			_dos_run_id_text(&id, other);
		}
		size_t len = strlen(names);
		if (others <= 4)
			snprintf(names + len, sizeof names - len, "%s%.60s", len ? ", " : "", e->d_name);
	}
	closedir(d);
	if (!others && !damaged)
		return 0;
	char what[700] = "";
	if (others && unfinished == others && !damaged)
		/* nothing there can be resumed, and --resume says so: say what to do with them */
		return _dos_fail(-EEXIST, function,
				 "checkpoint folder %s holds only the shards of an unfinished save of another run "
				 "(%s%s; run %s, step %" PRIu64 "; no checkpoint-<N>.dos: nothing to resume from); "
				 "remove them, or give another folder",
				 dir, names, others > 4 ? ", ..." : "", other, latest);
	if (others)
		snprintf(what, sizeof what,
			 "%zu checkpoint file%s of another run (%s%s; run %s, the latest after step %" PRIu64 ")",
			 others, others > 1 ? "s" : "", names, others > 4 ? ", ..." : "", other, latest);
	if (damaged)
		snprintf(what + strlen(what), sizeof what - strlen(what),
			 "%s%zu checkpoint file%s that cannot be read (%s%s)", others ? " and " : "", damaged,
			 damaged > 1 ? "s" : "", unreadable, damaged > 2 ? "; ..." : "");
	if (!others)
		/* every checkpoint there is unreadable: --resume finds none that loads, and refuses
		 * too; sending the user to it made a loop */
		return _dos_fail(
			-EEXIST, function,
			"checkpoint folder %s holds %s and nothing that can be resumed; move them away, or give "
			"another folder",
			dir, what);
	return _dos_fail(-EEXIST, function, "checkpoint folder %s holds %s; %s", dir, what, advice);
}

int _dos_checkpoint_folder_claim(struct _dos_checkpoint_folder *f, const struct _dos_run_id *run, int strict,
				 const char *advice)
{
	if (!f || !f->dir || !run)
		return DOS_FAIL(-EINVAL, "no folder taken, or run is NULL");
	int err = refuse_others(__func__, f->dir, run, strict, advice ? advice : "use another folder");
	if (err)
		return err;
	f->run = *run;
	f->claimed = 1;
	return 0;
}

int _dos_checkpoint_folder_check(const struct _dos_checkpoint_folder *f)
{
	if (!f || !f->dir || !f->claimed)
		return DOS_FAIL(-EINVAL, "no checkpoint folder claimed");
	return refuse_others(__func__, f->dir, &f->run, 0,
			     "another process wrote into it; move those files away, or use another folder");
}

/* A data-parallel job's verdict on this rank's err: nonzero when any rank failed. */
static int agreed(const struct _dos_checkpoint_search *search, int err)
{
	return search && search->agree ? search->agree(search->arg, err) : err != 0;
}

/* Renames dir's `name` "<name>.damaged" (or ".damaged-<k>" when that is taken): 0 or a
 * negative errno. Never over another file (rename would replace it): link, then unlink. */
static int rename_damaged(int dfd, const char *name, char *aside, size_t aside_size)
{
	int err = -EEXIST;
	for (int k = 0; k < 100 && err == -EEXIST; k++) {
		if (k == 0)
			snprintf(aside, aside_size, "%s.damaged", name);
		else
			snprintf(aside, aside_size, "%s.damaged-%d", name, k);
		err = linkat(dfd, name, dfd, aside, 0) == 0 ? 0 : -errno;
		if (!err && unlinkat(dfd, name, 0) != 0) {
			err = -errno;
			unlinkat(dfd, aside, 0);
		}
	}
	return err;
}

/* Renames the files of dir's checkpoint n, `name` (the whole file, or a data-parallel
 * job's manifest, and its shards) "<name>.damaged"; appends what happened to why. */
static void set_damaged_aside(const char *dir, const char *name, uint64_t n, char *why, size_t why_size)
{
	char aside[200];
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int err = dfd < 0 ? -errno : rename_damaged(dfd, name, aside, sizeof aside);
	size_t len = strlen(why);
	if (err) {
		snprintf(why + len, why_size - len, "; left in place (renaming it failed: %s)", strerror(-err));
		if (dfd >= 0)
			close(dfd);
		return;
	}
	snprintf(why + len, why_size - len, "; renamed %s", aside);
	DIR *d = opendir(dir);
	int shards = 0;
	for (struct dirent *e; d && (e = readdir(d));) {
		uint64_t m;
		int shard;
		char shard_aside[200];
		if (parse_checkpoint_name(e->d_name, &m, &shard) && shard && m == n &&
		    rename_damaged(dfd, e->d_name, shard_aside, sizeof shard_aside) == 0)
			shards++;
	}
	if (d)
		closedir(d);
	len = strlen(why);
	if (shards)
		snprintf(why + len, why_size - len, " (and its %d shards alike)", shards);
	len = strlen(why);
	snprintf(why + len, why_size - len, ", so that the folder keeps an older checkpoint that loads");
	sync_directory(dfd); /* at worst the rename is undone by a crash: the resume redoes it */
	close(dfd);
}

int _dos_checkpoint_folder_set_aside_damaged(const struct _dos_checkpoint_folder *f, uint64_t after,
					     void (*told)(void *arg, const char *path, const char *why), void *arg)
{
	if (!f || !f->dir || !f->claimed)
		return DOS_FAIL(-EINVAL, "no checkpoint folder claimed");
	if (f->lock_fd < 0) /* the lock holder does it for the job */
		return 0;
	uint64_t *ns;
	size_t count;
	int err = list_checkpoints(f->dir, &ns, &count);
	if (err)
		return err;
	char path[PATH_MAX], why[700];
	for (size_t i = 0; i < count && ns[i] > after; i++) { /* highest first */
		struct _dos_run_id run;
		const char *name;
		if (checkpoint_path(f->dir, ns[i], path))
			continue;
		name = strrchr(path, '/') + 1;
		if (file_identity(f->dir, name, &run, why, sizeof why) != 0 || !_dos_run_id_equal(&run, &f->run))
			continue; /* not known to be this run's: not ours to move */
		struct dos_error_hold hold;
		_dos_hold_errors(&hold);
		int damaged = verify_on_its_own(path) != 0;
		snprintf(why, sizeof why, "%s", _dos_last_error_message());
		_dos_release_errors(&hold);
		if (!damaged)
			continue;
		shorten_reason(why, path);
		set_damaged_aside(f->dir, name, ns[i], why, sizeof why);
		if (told)
			told(arg, path, why);
	}
	free(ns);
	return 0;
}

int _dos_checkpoint_folder_resume(struct _dos_checkpoint_folder *f, int (*load)(void *arg, const char *path),
				  void *load_arg, const struct _dos_checkpoint_search *search, const char *advice,
				  char *path, size_t path_size)
{
	if (!f || !f->dir || !load)
		return DOS_FAIL(-EINVAL, "no checkpoint folder taken, or load is NULL");
	uint64_t *ns;
	size_t count;
	int err = list_checkpoints(f->dir, &ns, &count);
	if (agreed(search, err))
		return err ? err : DOS_FAIL(-EIO, "another rank cannot read the checkpoint folder %s", f->dir);
	char candidate[PATH_MAX], reasons[400] = "";
	int loaded = 0;
	uint64_t loaded_n = 0;
	/* every rank goes through the same candidates, agreeing at the same points */
	for (size_t i = 0; i < count && !loaded; i++) {
		if ((err = checkpoint_path(f->dir, ns[i], candidate)))
			break;
		const char *name = strrchr(candidate, '/') + 1;
		struct _dos_run_id run;
		char why[512];
		/* the run it is of, and the folder holding no other run's checkpoint */
		int bad = file_identity(f->dir, name, &run, why, sizeof why), fatal = 0;
		if (!bad)
			fatal = refuse_others(__func__, f->dir, &run, 0, advice ? advice : "use another folder");
		if (agreed(search, fatal)) {
			free(ns);
			return fatal ? fatal
				     : DOS_FAIL(-EEXIST, "another rank found checkpoints of another run in %s", f->dir);
		}
		if (!bad) {
			struct dos_error_hold hold;
			_dos_hold_errors(&hold);
			bad = load(load_arg, candidate);
			if (bad) {
				snprintf(why, sizeof why, "%s", _dos_last_error_message());
				shorten_reason(why, candidate);
			}
			_dos_release_errors(&hold);
		}
		if (agreed(search, bad) && !bad) {
			bad = -EIO;
			snprintf(why, sizeof why, "another rank could not load its part");
		}
		if (!bad) {
			loaded = 1;
			loaded_n = ns[i];
			f->run = run;
			f->claimed = 1;
			break;
		}
		if (search && search->skipped)
			search->skipped(search->arg, candidate, why);
		add_reason(reasons, sizeof reasons, name, why);
	}
	free(ns);
	if (err)
		return err;
	if (!count)
		return DOS_FAIL(-ENOENT, "no checkpoint in %s", f->dir);
	if (!loaded)
		return DOS_FAIL(-ENOENT, "none of the %zu checkpoints in %s loads: %s", count, f->dir, reasons);
	/* the run's newer ones passed over for damage, out of retention's way (a folder that
	 * cannot be listed now leaves them where they are: nothing is lost) */
	_dos_checkpoint_folder_set_aside_damaged(f, loaded_n, search ? search->set_aside : NULL,
						 search ? search->arg : NULL);
	return path ? give_path(candidate, path, path_size) : 0;
}
