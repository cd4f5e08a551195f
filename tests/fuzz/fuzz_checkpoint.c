/* libFuzzer target for the checkpoint reader (graph/checkpoint.c): every input is written
 * to a file and handed to _dos_checkpoint_load with a fixed small layout. Beside it lie the
 * two shards of a sharded checkpoint of that layout after step SHARD_STEP, so that an
 * input that is a manifest (of those shards, or almost) reaches the sharded path. Built and run by
 * tools/fuzz.sh (`make fuzz`), not by the autotools build; see tests/fuzz/README.md.
 *
 * Each input is tried twice: as it is, and with its CRC32Cs recomputed wherever its own
 * header_len and section lengths (or, for a manifest, its length) put them, so that mutations reach the checks behind
 * the checksums (version, layout, tags, lengths) instead of all dying at the header's CRC.
 *
 * The oracle is independent of the reader: the format of the comment at the top of
 * graph/checkpoint.c, checked here byte by byte for the expected layout. For every file:
 *  - the load succeeds exactly when the file is a valid checkpoint of that layout, or a
 *    valid manifest of the shards beside it;
 *  - on success *got holds the header's fields (numel pointing to expect's) and master,
 *    m and v hold the sections' bytes;
 *  - on failure the code is -EINVAL or -EIO (or -ENOENT for a manifest naming shards
 *    that are not there), dos_last_error() names the file (or the shard), and *got
 *    and the three arrays are untouched (still the sentinel);
 *  - no file descriptor is leaked (ASan's leak check covers memory).
 * A broken rule calls abort(), which libFuzzer reports as a crash with the input saved.
 *
 * With DOS_FUZZ_WRITE_SEEDS=DIR in the environment the program instead writes valid
 * checkpoints (_dos_checkpoint_save) into DIR as the seed corpus and exits. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "crc32c_reference.h"

/* The layout every input is loaded against. */
#define NPARAMS 37
#define NTENSORS 3
#define SUBGROUP 16
static const uint64_t expect_numel[NTENSORS] = {10, 20, 7};
static const struct dos_checkpoint_meta expect = {
	.nparams = NPARAMS,
	.subgroup_size = SUBGROUP,
	.ntensors = NTENSORS,
	.numel = expect_numel,
	.weight_dtype = DOS_FP32,
	.grad_dtype = DOS_FP32,
};

/* The format (graph/checkpoint.c), for that layout: version 3, and version 2 without the
 * run's identity (numel at 160 instead of 176). */
#define NUMEL_AT(version) ((version) >= 3 ? 176 : 160)
#define HEADER_LEN_OF(version) (NUMEL_AT(version) + 8 * NTENSORS + 4)
#define HEADER_LEN HEADER_LEN_OF(3) /* what _dos_checkpoint_save writes */
#define SECTION_LEN (16 + 4 * NPARAMS + 4)
static const char section_tags[3][8] = {"master", "adam_m", "adam_v"};

#define SENTINEL_BYTE 0xA5

static char input_path[4096];
static char input_dir[4096];
/* Which of the two tries of an input is running, for the messages. */
static const char *variant = "";

#define REQUIRE(cond, ...)                                                                                    \
	do {                                                                                                  \
		if (!(cond)) {                                                                                \
			fprintf(stderr, "fuzz_checkpoint: %s:%d: %s (input %s): ", __FILE__, __LINE__, #cond, \
				variant);                                                                     \
			fprintf(stderr, __VA_ARGS__);                                                         \
			fprintf(stderr, "\n");                                                                \
			abort();                                                                              \
		}                                                                                             \
	} while (0)

static uint32_t u32_at(const unsigned char *p, size_t off)
{
	uint32_t x;
	memcpy(&x, p + off, sizeof x);
	return x;
}

static uint64_t u64_at(const unsigned char *p, size_t off)
{
	uint64_t x;
	memcpy(&x, p + off, sizeof x);
	return x;
}

/* Whether `data` is a valid checkpoint of `expect`'s layout. */
static int oracle_valid(const unsigned char *data, size_t size)
{
	if (size < 20)
		return 0;
	uint32_t version = u32_at(data, 8);
	if (version != 2 && version != 3)
		return 0;
	size_t header_len = HEADER_LEN_OF(version);
	if (size != header_len + 3 * SECTION_LEN)
		return 0;
	if (memcmp(data, "DOSCKPT\0", 8) != 0 || u32_at(data, 12) != 0x01020304u || u32_at(data, 16) != header_len)
		return 0;
	if (ref_crc32c(data, header_len - 4) != u32_at(data, header_len - 4))
		return 0;
	if (u32_at(data, 20) != NTENSORS || u64_at(data, 24) != NPARAMS || u64_at(data, 32) != SUBGROUP ||
	    u32_at(data, 40) != DOS_FP32 || u32_at(data, 44) != DOS_FP32 || u64_at(data, 144) != 0 ||
	    u64_at(data, 152) != NPARAMS)
		return 0;
	for (int i = 0; i < NTENSORS; i++)
		if (u64_at(data, NUMEL_AT(version) + 8 * (size_t)i) != expect_numel[i])
			return 0;
	for (int s = 0; s < 3; s++) {
		size_t off = header_len + (size_t)s * SECTION_LEN;
		if (memcmp(data + off, section_tags[s], 8) != 0 || u64_at(data, off + 8) != 4 * NPARAMS)
			return 0;
		if (ref_crc32c(data + off, SECTION_LEN - 4) != u32_at(data, off + SECTION_LEN - 4))
			return 0;
	}
	return 1;
}

/* ---- the sharded checkpoint beside the input ---------------------------------------------- */

#define SHARD_STEP 5
/* a manifest: version 2 (the run's identity at 40, entries from 56), version 1 (from 40) */
#define MANIFEST_ENTRIES_AT(version) ((version) >= 2 ? 56 : 40)
static const uint64_t shard_begin[3] = {0, 20, NPARAMS};
static float shard_arrays[3][NPARAMS]; /* master, m, v of the whole layout */
static uint32_t shard_crcs[2][4];      /* each shard's header and sections' CRCs */
static unsigned char shard_header[HEADER_LEN];

static int is_manifest(const unsigned char *data, size_t size)
{
	return size >= 8 && memcmp(data, "DOSMANI\0", 8) == 0;
}

/* Whether `data` is a valid manifest of the two shards beside it. */
static int oracle_valid_manifest(const unsigned char *data, size_t size)
{
	uint32_t version = size >= 12 ? u32_at(data, 8) : 0;
	if ((version != 1 && version != 2) || size != MANIFEST_ENTRIES_AT(version) + 2 * 32 + 4 ||
	    !is_manifest(data, size) || u32_at(data, 12) != 0x01020304u || u32_at(data, 16) != 2 ||
	    u64_at(data, 24) != NPARAMS || u64_at(data, 32) != SHARD_STEP ||
	    ref_crc32c(data, size - 4) != u32_at(data, size - 4))
		return 0;
	for (int i = 0; i < 2; i++) {
		const unsigned char *e = data + MANIFEST_ENTRIES_AT(version) + 32 * i;
		if (u64_at(e, 0) != shard_begin[i] || u64_at(e, 8) != shard_begin[i + 1] - shard_begin[i])
			return 0;
		for (int k = 0; k < 4; k++)
			if (u32_at(e, 16 + 4 * (size_t)k) != shard_crcs[i][k])
				return 0;
	}
	return 1;
}

/* Writes the two shards of SHARD_STEP into `dir` and records their CRCs (read back from
 * the files, as the format places them). */
static void write_shards(const char *dir)
{
	for (int s = 0; s < 3; s++)
		for (int i = 0; i < NPARAMS; i++)
			shard_arrays[s][i] = (float)((s + 2) * (i - 11)) / 3.0f;
	struct dos_checkpoint_meta meta = expect;
	meta.steps_done = SHARD_STEP;
	meta.step = 4;
	meta.loss_scale = 1;
	meta.hp = (struct dos_adam_hparams){.mode = DOS_ADAMW, .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
	for (int i = 0; i < 2; i++) {
		meta.state_begin = shard_begin[i];
		meta.state_len = shard_begin[i + 1] - shard_begin[i];
		uint64_t b = shard_begin[i];
		int err = _dos_checkpoint_save_shard(dir, &meta, (uint32_t)i, 2, shard_arrays[0] + b,
						     shard_arrays[1] + b, shard_arrays[2] + b);
		REQUIRE(err == 0, "cannot write shard %d: %s", i, dos_last_error());
		char path[4200];
		snprintf(path, sizeof path, "%s/checkpoint-%d.shard-%d-of-2.dos", dir, SHARD_STEP, i);
		FILE *f = fopen(path, "rb");
		REQUIRE(f, "cannot read %s", path);
		unsigned char buf[4096];
		size_t n = fread(buf, 1, sizeof buf, f);
		fclose(f);
		size_t section = 16 + 4 * (size_t)meta.state_len + 4;
		REQUIRE(n == HEADER_LEN + 3 * section, "shard %d has %zu bytes", i, n);
		shard_crcs[i][0] = u32_at(buf, HEADER_LEN - 4);
		for (int k = 0; k < 3; k++)
			shard_crcs[i][k + 1] = u32_at(buf, HEADER_LEN + (size_t)(k + 1) * section - 4);
		if (i == 0)
			memcpy(shard_header, buf, sizeof shard_header);
	}
}

/* Recomputes the CRCs where the file's own header_len and section lengths put them (a
 * manifest's at its end). */
static void fix_crcs(unsigned char *data, size_t size)
{
	if (size < 20)
		return;
	if (is_manifest(data, size)) {
		uint32_t crc = ref_crc32c(data, size - 4);
		memcpy(data + size - 4, &crc, sizeof crc);
		return;
	}
	uint64_t header_len = u32_at(data, 16);
	if (header_len < 24 || header_len > size)
		return;
	uint32_t crc = ref_crc32c(data, header_len - 4);
	memcpy(data + header_len - 4, &crc, sizeof crc);
	uint64_t off = header_len;
	for (int s = 0; s < 3; s++) {
		if (size - off < 16)
			return;
		uint64_t len = u64_at(data, off + 8);
		if (len > size - off - 16 || size - off - 16 - len < 4)
			return;
		crc = ref_crc32c(data + off, 16 + len);
		memcpy(data + off + 16 + len, &crc, sizeof crc);
		off += 16 + len + 4;
	}
}

/* Overwritten in place, then cut to size: ext4 flushes a file truncated to 0 and rewritten
 * when it is closed (auto_da_alloc), which made O_TRUNC a hundred times slower. */
static void write_input(const unsigned char *data, size_t size)
{
	int fd = open(input_path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
	REQUIRE(fd >= 0, "cannot create %s: %s", input_path, strerror(errno));
	for (size_t done = 0; done < size;) {
		ssize_t n = pwrite(fd, data + done, size - done, (off_t)done);
		REQUIRE(n > 0, "cannot write %s: %s", input_path, strerror(errno));
		done += (size_t)n;
	}
	REQUIRE(ftruncate(fd, (off_t)size) == 0, "cannot truncate %s: %s", input_path, strerror(errno));
	REQUIRE(close(fd) == 0, "cannot close %s: %s", input_path, strerror(errno));
}

/* The lowest free file descriptor. */
static int lowest_free_fd(void)
{
	int fd = dup(2);
	REQUIRE(fd >= 0, "dup: %s", strerror(errno));
	close(fd);
	return fd;
}

static void check_one(const unsigned char *data, size_t size)
{
	static float arrays[3][NPARAMS], sentinel_arrays[3][NPARAMS];
	static struct dos_checkpoint_meta got, sentinel_got;
	memset(arrays, SENTINEL_BYTE, sizeof arrays);
	memset(sentinel_arrays, SENTINEL_BYTE, sizeof sentinel_arrays);
	memset(&got, SENTINEL_BYTE, sizeof got);
	memset(&sentinel_got, SENTINEL_BYTE, sizeof sentinel_got);

	write_input(data, size);
	int manifest = is_manifest(data, size);
	int valid = manifest ? oracle_valid_manifest(data, size) : oracle_valid(data, size);
	int fd_before = lowest_free_fd();
	int err = _dos_checkpoint_load(input_path, &expect, &got, arrays[0], arrays[1], arrays[2]);
	REQUIRE(lowest_free_fd() == fd_before, "a file descriptor leaked (err = %d)", err);

	if (err) {
		REQUIRE(!valid, "a valid checkpoint of %zu bytes refused: %d (%s)", size, err, dos_last_error());
		REQUIRE(err == -EINVAL || err == -EIO || (manifest && err == -ENOENT),
			"error %d for a malformed file, not -EINVAL or -EIO (%s)", err, dos_last_error());
		REQUIRE(strstr(dos_last_error(), manifest ? input_dir : input_path),
			"the message does not name the file: %s", dos_last_error());
		REQUIRE(memcmp(&got, &sentinel_got, sizeof got) == 0, "*got written on error %d (%s)", err,
			dos_last_error());
		REQUIRE(memcmp(arrays, sentinel_arrays, sizeof arrays) == 0, "arrays written on error %d (%s)", err,
			dos_last_error());
		return;
	}
	REQUIRE(valid, "a malformed file of %zu bytes accepted", size);
	if (manifest) { /* the shards' state, and their header's fields */
		REQUIRE(memcmp(arrays, shard_arrays, sizeof arrays) == 0, "the shards' data differ");
		data = shard_header;
		REQUIRE(got.state_begin == 0 && got.state_len == NPARAMS, "the range loaded");
	}
	REQUIRE(got.nparams == expect.nparams && got.subgroup_size == expect.subgroup_size &&
			got.ntensors == expect.ntensors && got.numel == expect.numel &&
			got.weight_dtype == expect.weight_dtype && got.grad_dtype == expect.grad_dtype,
		"the layout of *got differs from expect's");
	REQUIRE(got.step == u64_at(data, 48) && got.skipped_steps == u64_at(data, 56) &&
			got.steps_done == u64_at(data, 64) && got.good_steps == u32_at(data, 80) &&
			(uint32_t)got.hp.mode == u32_at(data, 84) && got.seed == u64_at(data, 88) &&
			got.data_rng == u64_at(data, 96),
		"the progress fields of *got differ from the header's");
	static const unsigned char unknown_run[16];
	REQUIRE(memcmp(got.run.bytes, u32_at(data, 8) >= 3 ? data + 160 : unknown_run, 16) == 0,
		"the run of *got differs from the header's");
	const double *doubles[] = {&got.loss_scale, &got.hp.lr,  &got.hp.beta1,
				   &got.hp.beta2,   &got.hp.eps, &got.hp.weight_decay};
	const size_t double_offs[] = {72, 104, 112, 120, 128, 136};
	for (int i = 0; i < 6; i++)
		REQUIRE(memcmp(doubles[i], data + double_offs[i], 8) == 0, "double field at offset %zu differs",
			double_offs[i]);
	for (int s = 0; s < 3 && !manifest; s++)
		REQUIRE(memcmp(arrays[s], data + HEADER_LEN_OF(u32_at(data, 8)) + (size_t)s * SECTION_LEN + 16,
			       4 * NPARAMS) == 0,
			"section %d's data differ from the file's", s);
}

static void remove_input(void)
{
	unlink(input_path);
	for (int i = 0; i < 2; i++) {
		char path[4200];
		snprintf(path, sizeof path, "%s/checkpoint-%d.shard-%d-of-2.dos", input_dir, SHARD_STEP, i);
		unlink(path);
	}
	rmdir(input_dir);
}

/* Valid checkpoints into `dir`: the layout above with various contents, and two of other
 * layouts (they reach the refusals of another model). */
static int write_seeds(const char *dir)
{
	static float arrays[3][NPARAMS];
	uint64_t other_numel[2] = {3, 2};
	struct dos_checkpoint_meta meta = expect;
	char path[4096];
	for (int k = 0; k < 5; k++) {
		for (int s = 0; s < 3; s++)
			for (int i = 0; i < NPARAMS; i++)
				arrays[s][i] = k == 0 ? 0.0f : (float)((s + 1) * (i - 17) * k) / 7.0f;
		meta.step = 100u * (unsigned)k;
		meta.skipped_steps = (unsigned)k;
		meta.steps_done = 101u * (unsigned)k;
		meta.loss_scale = k == 0 ? 1.0 : 65536.0 / k;
		meta.good_steps = 10u * (unsigned)k;
		meta.seed = 0x5eed0000u + (unsigned)k;
		meta.data_rng = 0x123456789abcdefull * (unsigned)(k + 1);
		meta.hp = (struct dos_adam_hparams){.mode = k % 2 ? DOS_ADAMW : DOS_ADAM_L2,
						    .lr = 1e-3 * (k + 1),
						    .beta1 = 0.9,
						    .beta2 = 0.999,
						    .eps = 1e-8,
						    .weight_decay = 0.01 * k};
		if (_dos_checkpoint_save(dir, &meta, arrays[0], arrays[1], arrays[2], 1000, path, sizeof path) != 0) {
			fprintf(stderr, "fuzz_checkpoint: cannot write a seed in %s: %s\n", dir, dos_last_error());
			return 1;
		}
	}
	struct dos_checkpoint_meta other = meta;
	other.nparams = 5;
	other.ntensors = 2;
	other.numel = other_numel;
	other.steps_done = 7777;
	other.weight_dtype = DOS_BF16;
	other.grad_dtype = DOS_FP16;
	if (_dos_checkpoint_save(dir, &other, arrays[0], arrays[1], arrays[2], 1000, path, sizeof path) != 0) {
		fprintf(stderr, "fuzz_checkpoint: cannot write a seed in %s: %s\n", dir, dos_last_error());
		return 1;
	}
	/* a sharded checkpoint of the shards the fuzzer lays beside its inputs: its manifest */
	write_shards(dir);
	other = expect;
	other.steps_done = SHARD_STEP;
	if (_dos_checkpoint_save_manifest(dir, &other, 2, 1000, path, sizeof path) != 0) {
		fprintf(stderr, "fuzz_checkpoint: cannot write the manifest seed in %s: %s\n", dir, dos_last_error());
		return 1;
	}
	other = meta;
	other.subgroup_size = 8;
	other.steps_done = 8888;
	if (_dos_checkpoint_save(dir, &other, arrays[0], arrays[1], arrays[2], 1000, path, sizeof path) != 0) {
		fprintf(stderr, "fuzz_checkpoint: cannot write a seed in %s: %s\n", dir, dos_last_error());
		return 1;
	}
	return 0;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	const char *seeds = getenv("DOS_FUZZ_WRITE_SEEDS");
	if (seeds && seeds[0])
		exit(write_seeds(seeds));
	setenv("DOS_QUIET", "1", 0); /* DOS_QUIET=0 shows the messages */
	const char *tmp = getenv("TMPDIR");
	snprintf(input_dir, sizeof input_dir, "%s/fuzz-checkpoint-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
	if (!mkdtemp(input_dir)) {
		fprintf(stderr, "fuzz_checkpoint: mkdtemp %s: %s\n", input_dir, strerror(errno));
		exit(1);
	}
	snprintf(input_path, sizeof input_path, "%s/input.dos", input_dir);
	atexit(remove_input);
	write_shards(input_dir);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	variant = "as given";
	check_one(data, size);
	if (size < 20)
		return 0;
	unsigned char *fixed = malloc(size);
	REQUIRE(fixed, "no memory for %zu bytes", size);
	memcpy(fixed, data, size);
	fix_crcs(fixed, size);
	variant = "with its CRCs recomputed";
	if (memcmp(fixed, data, size) != 0)
		check_one(fixed, size);
	free(fixed);
	return 0;
}
