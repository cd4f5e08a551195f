/* Checkpoints of the optimizer state (checkpoint.h): the file format, its CRC32C, the
 * atomic save with its retention of the most recent files, and the load that verifies the
 * whole file before it writes anything of the caller's.
 *
 * File format, version 2. Every field is in the writer's native byte order, which is
 * little-endian on every platform starpu-dos runs on (x86-64, aarch64, ppc64le); the
 * byte-order marker lets a reader of the other byte order refuse the file instead of
 * misreading it. Offsets in bytes; n = ntensors, L = state_len (nparams in a whole
 * checkpoint, the shard's share in a shard of a data-parallel job).
 *
 *   header (header_len = 164 + 8 n bytes)
 *      0  char[8]   magic "DOSCKPT\0"                      } these four fields keep their
 *      8  uint32    version (DOS_CHECKPOINT_VERSION = 2)     } place in every version, so
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
 *    160  uint64    numel[n]
 *  160+8n uint32    CRC32C of header bytes [0, header_len - 4)
 *
 *   then three sections, master, m and v, in that order, each 4 L + 20 bytes:
 *      0  char[8]   tag: "master\0\0", "adam_m\0\0", "adam_v\0\0"
 *      8  uint64    byte length of the data = 4 L
 *     16  float32   data[L]
 *   16+4L uint32    CRC32C of the section's bytes [0, 16 + 4 L): its header and its data
 *
 *   and nothing after them: the file is exactly header_len + 3 (4 L + 20) bytes.
 *   (Version 1 had no state_begin and state_len: it always held every parameter.)
 *
 * A data-parallel job saves one shard per rank, "checkpoint-<N>.shard-<i>-of-<R>.dos" (the
 * format above, each with its rank's range), then rank 0 writes the manifest
 * "checkpoint-<N>.dos", which makes the checkpoint exist; its format, version 1:
 *
 *      0  char[8]   magic "DOSMANI\0"
 *      8  uint32    version (MANIFEST_VERSION = 1)
 *     12  uint32    byte-order marker 0x01020304
 *     16  uint32    R, the number of shards
 *     20  uint32    zero
 *     24  uint64    nparams
 *     32  uint64    steps_done
 *     40  R times:  uint64 state_begin, uint64 state_len, uint32 the shard's header CRC32C,
 *                   uint32[3] its sections' CRC32Cs (these bind the shard files to this
 *                   manifest: a shard of another save is refused)
 *  40+32R uint32    CRC32C of bytes [0, 40 + 32 R)
 *
 * The shards tile [0, nparams) in order. Any range of parameters can be loaded from either
 * kind of checkpoint, so a job resumes on any number of ranks.
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
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "checkpoint.h"
#include "errors.h"

_Static_assert(sizeof(float) == 4, "the sections hold IEEE binary32 floats");
_Static_assert(sizeof(double) == 8, "the header holds IEEE binary64 doubles");

static const char checkpoint_magic[8] = "DOSCKPT";
#define BYTE_ORDER_MARKER 0x01020304u
#define BYTE_ORDER_SWAPPED 0x04030201u

/* Offsets of the version 1 header (see the top of the file). */
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
	HEADER_FIXED = 160,  /* bytes before numel */
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

static uint64_t header_len_of(uint32_t ntensors)
{
	return HEADER_FIXED + 8 * (uint64_t)ntensors + CRC_BYTES;
}

static uint64_t section_len_of(uint64_t nparams)
{
	return SECTION_HEADER + 4 * nparams + CRC_BYTES;
}

static uint64_t file_len_of(uint32_t ntensors, uint64_t nparams)
{
	return header_len_of(ntensors) + NSECTIONS * section_len_of(nparams);
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
	put_u32(h, OFF_HEADER_LEN, (uint32_t)header_len_of(meta->ntensors));
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

/* Deletes the checkpoints of `dir` beyond the `keep` highest N, but never `written`, the
 * one just saved (a run restarted from scratch in a directory that holds a later run's
 * checkpoints must not lose the file it has just been told is saved). */
static int n_is_kept(uint64_t n, const uint64_t *kept, size_t count)
{
	for (size_t i = 0; i < count; i++)
		if (kept[i] == n)
			return 1;
	return 0;
}

static int remove_old_checkpoints(const char *dir, int dfd, const char *saved, uint64_t written, unsigned keep)
{
	uint64_t *ns;
	size_t count;
	int err = list_checkpoints(dir, &ns, &count);
	if (err)
		return err;
	int removed = 0;
	for (size_t i = keep; i < count && !err; i++) {
		if (ns[i] == written)
			continue;
		char name[64];
		snprintf(name, sizeof name, "checkpoint-%" PRIu64 ".dos", ns[i]);
		if (unlinkat(dfd, name, 0) == 0)
			removed = 1;
		else if (errno != ENOENT) /* ENOENT: someone else removed it: fine */
			err = DOS_FAIL(-errno,
				       "%s is saved, but the old checkpoint %s/%s could not be removed: unlink: %s",
				       saved, dir, name, strerror(errno));
	}
	/* shards of the removed checkpoints, and of saves that never got their manifest (a
	 * crash between the shards and the manifest), up to the one just written */
	DIR *d = err ? NULL : opendir(dir);
	size_t kept = count < keep ? count : keep;
	for (struct dirent *e; d && !err && (e = readdir(d));) {
		uint64_t n;
		int shard;
		if (!parse_checkpoint_name(e->d_name, &n, &shard) || !shard || n >= written || n_is_kept(n, ns, kept))
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

/* Writes dir/name atomically: write(fd, ctx) into a temporary file of dir, fsync, rename,
 * fsync of dir. On success *dfd_out is the open directory (the caller closes it) and the
 * path is in path (size PATH_MAX). */
static int save_atomically(const char *dir, const char *name, int (*write)(int fd, const void *ctx), const void *ctx,
			   char *path, int *dfd_out)
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
	int err = write(fd, ctx);
	if (err)
		DOS_FAIL(err, "cannot write %s: write: %s", tmp_path, strerror(-err));
	else if (fsync(fd) != 0)
		err = DOS_FAIL(-errno, "cannot write %s: fsync: %s", tmp_path, strerror(errno));
	if (close(fd) != 0 && !err)
		err = DOS_FAIL(-errno, "cannot write %s: close: %s", tmp_path, strerror(errno));
	if (!err && renameat(dfd, tmp_name, dfd, name) != 0)
		err = DOS_FAIL(-errno, "cannot rename %s to %s: rename: %s", tmp_path, path, strerror(errno));
	if (err) {
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
	int dfd;
	if ((err = save_atomically(dir, name, write_checkpoint_file, &w, path, &dfd)))
		return err;
	err = give_path(path, path_out, path_size);
	if (!err)
		err = remove_old_checkpoints(dir, dfd, path, meta->steps_done, keep);
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
	int dfd;
	if ((err = save_atomically(dir, name, write_checkpoint_file, &w, path, &dfd)))
		return err;
	close(dfd);
	return 0;
}

/* ---- the manifest of a sharded checkpoint ---------------------------------------------- */

static const char manifest_magic[8] = "DOSMANI";
#define MANIFEST_VERSION 1
enum { MANIFEST_FIXED = 40, MANIFEST_ENTRY = 32 };

struct shard_entry {
	uint64_t begin, len;
	uint32_t header_crc, section_crc[NSECTIONS];
};

struct manifest {
	uint32_t nshards;
	uint64_t nparams, steps_done;
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
	struct manifest mf = {.nshards = nshards, .nparams = meta->nparams, .steps_done = meta->steps_done};
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
		if (mf.shards[i].begin != next || get_u64(fixed, OFF_STEPS_DONE) != meta->steps_done)
			err = DOS_FAIL(-EINVAL,
				       "shard %s holds parameters from %" PRIu64 " after step %" PRIu64
				       ", expected from %" PRIu64 " after step %" PRIu64,
				       path, mf.shards[i].begin, get_u64(fixed, OFF_STEPS_DONE), next,
				       meta->steps_done);
		next += mf.shards[i].len;
	}
	if (!err && next != meta->nparams)
		err = DOS_FAIL(-EINVAL, "the shards hold %" PRIu64 " parameters, the model has %" PRIu64, next,
			       meta->nparams);
	char name[64], path[PATH_MAX];
	snprintf(name, sizeof name, "checkpoint-%" PRIu64 ".dos", meta->steps_done);
	int dfd;
	if (!err && !(err = save_atomically(dir, name, write_manifest, &mf, path, &dfd))) {
		err = give_path(path, path_out, path_size);
		if (!err)
			err = remove_old_checkpoints(dir, dfd, path, meta->steps_done, keep);
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
static int first_numel_difference(const struct reader *r, const struct dos_checkpoint_meta *expect, uint32_t *index,
				  uint64_t *file_value)
{
	size_t per_chunk = IO_CHUNK / 8;
	*index = UINT32_MAX;
	for (uint32_t i = 0; i < expect->ntensors; i += (uint32_t)per_chunk) {
		size_t n = expect->ntensors - i < per_chunk ? expect->ntensors - i : per_chunk;
		int err = read_exact(r, r->chunk, 8 * n, HEADER_FIXED + 8 * (uint64_t)i);
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

/* Verifies everything that precedes the sections: identity, header CRC, version, the
 * model against `expect`, and the file's length. */
static int check_header(const struct reader *r, const unsigned char *fixed, const struct dos_checkpoint_meta *expect)
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
	if (version != DOS_CHECKPOINT_VERSION)
		return DOS_FAIL(-EINVAL, "checkpoint %s has format version %" PRIu32 ", this program reads version %d",
				path, version, DOS_CHECKPOINT_VERSION);
	if (marker != BYTE_ORDER_MARKER)
		return DOS_FAIL(-EINVAL, "checkpoint %s: endianness marker 0x%08" PRIx32 " is not 0x%08x", path, marker,
				BYTE_ORDER_MARKER);
	uint32_t ntensors = get_u32(fixed, OFF_NTENSORS);
	uint64_t nparams = get_u64(fixed, OFF_NPARAMS);
	if (header_len != header_len_of(ntensors) || nparams > MAX_NPARAMS)
		return DOS_FAIL(-EIO,
				"checkpoint %s: corrupted header (header length %" PRIu32 " for %" PRIu32
				" tensors, nparams = %" PRIu64 ")",
				path, header_len, ntensors, nparams);

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
	if ((err = first_numel_difference(r, expect, &index, &value)))
		return err;
	if (index != UINT32_MAX)
		return DOS_FAIL(-EINVAL, "checkpoint %s: numel[%" PRIu32 "] = %" PRIu64 ", but the model has %" PRIu64,
				path, index, value, expect->numel[index]);

	uint64_t begin = get_u64(fixed, OFF_STATE_BEGIN), len = get_u64(fixed, OFF_STATE_LEN);
	if (begin >= nparams || len == 0 || len > nparams - begin)
		return DOS_FAIL(
			-EIO, "checkpoint %s: corrupted header (parameters [%" PRIu64 ", +%" PRIu64 ") of %" PRIu64 ")",
			path, begin, len, nparams);
	uint64_t want = file_len_of(ntensors, len);
	if (size < want)
		return DOS_FAIL(-EIO, "checkpoint %s is truncated: %" PRIu64 " bytes, expected %" PRIu64, path, size,
				want);
	if (size > want)
		return DOS_FAIL(-EIO, "checkpoint %s has trailing garbage: %" PRIu64 " bytes, expected %" PRIu64, path,
				size, want);
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
}

/* A checkpoint file (whole, or a shard) being loaded: its reader, verified header and the
 * CRCs of its sections from the verifying pass. */
struct checkpoint_file {
	struct reader r;
	unsigned char fixed[HEADER_FIXED];
	uint64_t begin, len; /* the parameters it holds */
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
	f->begin = get_u64(f->fixed, OFF_STATE_BEGIN);
	f->len = get_u64(f->fixed, OFF_STATE_LEN);
	return read_exact(r, &f->header_crc, sizeof f->header_crc, header_len_of(expect->ntensors) - CRC_BYTES);
}

/* The first pass over f: every section verified, nothing of the caller's written. */
static int verify_sections(struct checkpoint_file *f, const struct dos_checkpoint_meta *expect)
{
	uint64_t header_len = header_len_of(expect->ntensors);
	for (int s = 0; s < NSECTIONS; s++) {
		uint32_t stored, computed;
		uint64_t off = header_len + (uint64_t)s * section_len_of(f->len);
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
static int copy_sections(struct checkpoint_file *f, const struct dos_checkpoint_meta *expect, uint64_t want_begin,
			 uint64_t want_len, float *const arrays[NSECTIONS])
{
	uint64_t from = f->begin > want_begin ? f->begin : want_begin;
	uint64_t to = f->begin + f->len < want_begin + want_len ? f->begin + f->len : want_begin + want_len;
	if (from >= to)
		return 0;
	uint64_t header_len = header_len_of(expect->ntensors);
	for (int s = 0; s < NSECTIONS; s++) {
		if (!arrays[s])
			continue;
		uint32_t stored, computed;
		uint64_t off = header_len + (uint64_t)s * section_len_of(f->len);
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
 * parameter count, shards tiling it). */
static int read_manifest(const char *path, struct reader *r, const struct dos_checkpoint_meta *expect,
			 struct manifest *mf)
{
	const uint64_t max_shards = (UINT32_MAX - MANIFEST_FIXED) / MANIFEST_ENTRY;
	if (r->size < MANIFEST_FIXED + CRC_BYTES)
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
	uint32_t nshards = err ? 0 : get_u32(b, 16);
	if (err) {
	} else if (get_u32(b, 12) == BYTE_ORDER_SWAPPED)
		err = DOS_FAIL(-EINVAL, "checkpoint manifest %s was written on a machine of the other byte order",
			       path);
	else if (stored != computed)
		err = DOS_FAIL(-EIO,
			       "checkpoint manifest %s is corrupted (CRC32C 0x%08" PRIx32 ", stored 0x%08" PRIx32 ")",
			       path, computed, stored);
	else if (get_u32(b, 8) != MANIFEST_VERSION)
		err = DOS_FAIL(-EINVAL,
			       "checkpoint manifest %s has format version %" PRIu32 ", this program reads version %d",
			       path, get_u32(b, 8), MANIFEST_VERSION);
	else if (get_u32(b, 12) != BYTE_ORDER_MARKER || nshards < 2 ||
		 r->size != MANIFEST_FIXED + (uint64_t)nshards * MANIFEST_ENTRY + CRC_BYTES)
		err = DOS_FAIL(-EIO, "checkpoint manifest %s is corrupted (%" PRIu32 " shards in %" PRIu64 " bytes)",
			       path, nshards, r->size);
	else if (get_u64(b, 24) != expect->nparams)
		err = DOS_FAIL(-EINVAL, "checkpoint %s: nparams = %" PRIu64 ", but the model has %" PRIu64, path,
			       get_u64(b, 24), expect->nparams);
	else if (!(mf->shards = calloc(nshards, sizeof *mf->shards)))
		err = DOS_FAIL(-ENOMEM, "no memory for the %" PRIu32 " shards of %s", nshards, path);
	uint64_t next = 0;
	for (uint32_t i = 0; !err && i < nshards; i++) {
		const unsigned char *e = b + MANIFEST_FIXED + (size_t)i * MANIFEST_ENTRY;
		mf->shards[i] = (struct shard_entry){
			get_u64(e, 0), get_u64(e, 8), get_u32(e, 16), {get_u32(e, 20), get_u32(e, 24), get_u32(e, 28)}};
		if (mf->shards[i].begin != next || mf->shards[i].len == 0 || mf->shards[i].len > expect->nparams - next)
			err = DOS_FAIL(-EIO,
				       "checkpoint manifest %s is corrupted (shard %" PRIu32 " holds [%" PRIu64
				       ", +%" PRIu64 "))",
				       path, i, mf->shards[i].begin, mf->shards[i].len);
		next += mf->shards[i].len;
	}
	if (!err && next != expect->nparams)
		err = DOS_FAIL(-EIO,
			       "checkpoint manifest %s is corrupted (its shards hold %" PRIu64 " of %" PRIu64
			       " parameters)",
			       path, next, expect->nparams);
	if (!err) {
		mf->nshards = nshards;
		mf->nparams = expect->nparams;
		mf->steps_done = get_u64(b, 32);
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
				 header_len_of(expect->ntensors) + (uint64_t)(k + 1) * section_len_of(f.len) -
					 CRC_BYTES);
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
			err = verify_sections(&files[i], expect);
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
		err = copy_sections(&files[i], expect, begin, len, arrays);
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
