/* Checkpoints (graph/checkpoint.h) in a temporary directory: bit-exact round trips, the
 * retention of the most recent files, leftovers of a crashed save, a refusal for every
 * kind of damaged or foreign file with the caller's state left untouched, failed saves
 * that leave neither a temporary file nor a changed checkpoint behind, the previous
 * format versions read, and folders held by one run and one process (lock, identity,
 * stale temporaries, resuming past damaged checkpoints). */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "checkpoint.h"
#include "crc32c_reference.h"
#include "test_util.h"

/* snprintf into an array, which must be large enough */
#define FORMAT(buf, ...) CHECK((size_t)snprintf((buf), sizeof(buf), __VA_ARGS__) < sizeof(buf), "%s is too long", #buf)

/* ---- an independent CRC32C and file helpers ------------------------------------------- */

static unsigned char *read_whole(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	CHECK(f, "cannot open %s", path);
	CHECK(fseek(f, 0, SEEK_END) == 0, "seek %s", path);
	long n = ftell(f);
	CHECK(n >= 0, "tell %s", path);
	rewind(f);
	unsigned char *buf = test_malloc((size_t)n);
	CHECK(fread(buf, 1, (size_t)n, f) == (size_t)n, "read %s", path);
	fclose(f);
	*len = (size_t)n;
	return buf;
}

static void write_whole(const char *path, const void *buf, size_t len)
{
	FILE *f = fopen(path, "wb");
	CHECK(f, "cannot create %s", path);
	CHECK(fwrite(buf, 1, len, f) == len, "write %s", path);
	CHECK(fclose(f) == 0, "close %s", path);
}

static int file_exists(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0;
}

/* The names of `dir`, sorted, joined by spaces. */
static void list_dir(const char *dir, char *out, size_t size)
{
	char names[64][128];
	int n = 0;
	DIR *d = opendir(dir);
	CHECK(d, "opendir %s", dir);
	struct dirent *e;
	while ((e = readdir(d)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
			CHECK(n < 64, "too many files in %s", dir);
			FORMAT(names[n], "%s", e->d_name);
			n++;
		}
	closedir(d);
	for (int i = 1; i < n; i++)
		for (int j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
			char t[128];
			memcpy(t, names[j], sizeof t);
			memcpy(names[j], names[j - 1], sizeof t);
			memcpy(names[j - 1], t, sizeof t);
		}
	out[0] = 0;
	for (int i = 0; i < n; i++)
		snprintf(out + strlen(out), size - strlen(out), "%s%s", i ? " " : "", names[i]);
}

static void put32(unsigned char *buf, size_t off, uint32_t x)
{
	memcpy(buf + off, &x, 4);
}

static uint32_t get32(const unsigned char *buf, size_t off)
{
	uint32_t x;
	memcpy(&x, buf + off, 4);
	return x;
}

static uint64_t get64(const unsigned char *buf, size_t off)
{
	uint64_t x;
	memcpy(&x, buf + off, 8);
	return x;
}

/* ---- a model and its state ------------------------------------------------------------ */

#define MAX_TENSORS 8

struct state {
	uint64_t numel[MAX_TENSORS];
	struct dos_checkpoint_meta meta;
	float *master, *m, *v;
};

/* Random bits, with the values a careless copy would change: NaNs with payloads
 * (quiet and signalling, both signs), -0.0, denormals, infinities. */
static void fill_array(float *a, uint64_t n, uint64_t *rng)
{
	static const uint32_t special[] = {0x7fc12345u, 0xffc00001u, 0x7fa00001u, 0xff800001u, 0x80000000u,
					   0x00000001u, 0x807fffffu, 0x00400000u, 0x7f800000u, 0xff800000u};
	for (uint64_t i = 0; i < n; i++) {
		uint32_t bits = (uint32_t)(test_rand(rng) >> 32);
		if (i < sizeof special / sizeof special[0])
			bits = special[i];
		memcpy(&a[i], &bits, 4);
	}
}

static void make_state(struct state *s, uint64_t nparams, uint32_t ntensors, uint64_t seed)
{
	uint64_t rng = seed * 0x9E3779B97F4A7C15ULL + 1;
	memset(s, 0, sizeof *s);
	CHECK(ntensors >= 1 && ntensors <= MAX_TENSORS, "ntensors %u", ntensors);
	uint64_t left = nparams;
	for (uint32_t t = 0; t + 1 < ntensors; t++) {
		s->numel[t] = left / 2;
		left -= s->numel[t];
	}
	s->numel[ntensors - 1] = left;
	s->meta = (struct dos_checkpoint_meta){
		.nparams = nparams,
		.subgroup_size = 1 + test_rand(&rng) % nparams,
		.ntensors = ntensors,
		.numel = s->numel,
		.weight_dtype = (enum dos_dtype)(test_rand(&rng) % 3),
		.grad_dtype = (enum dos_dtype)(test_rand(&rng) % 3),
		.step = test_rand(&rng),
		.skipped_steps = test_rand(&rng),
		.steps_done = test_rand(&rng) % 1000,
		.loss_scale = 65536.0 * test_uniform(&rng),
		.good_steps = (uint32_t)test_rand(&rng),
		.seed = test_rand(&rng),
		.data_rng = test_rand(&rng),
		.hp = {.mode = (enum dos_adam_mode)(test_rand(&rng) % 2),
		       .lr = test_uniform(&rng),
		       .beta1 = test_uniform(&rng),
		       .beta2 = test_uniform(&rng),
		       .eps = test_uniform(&rng) * 1e-8,
		       .weight_decay = test_uniform(&rng)},
	};
	for (size_t i = 0; i < sizeof s->meta.run.bytes; i++)
		s->meta.run.bytes[i] = (unsigned char)test_rand(&rng);
	s->master = test_malloc(nparams * 4);
	s->m = test_malloc(nparams * 4);
	s->v = test_malloc(nparams * 4);
	fill_array(s->master, nparams, &rng);
	fill_array(s->m, nparams, &rng);
	fill_array(s->v, nparams, &rng);
}

static void free_state(struct state *s)
{
	free(s->master);
	free(s->m);
	free(s->v);
}

static void save_ok(const char *dir, const struct state *s, unsigned keep, char *path, size_t size)
{
	int err = _dos_checkpoint_save(dir, &s->meta, s->master, s->m, s->v, keep, path, size);
	CHECK(err == 0, "save in %s: %d %s", dir, err, dos_last_error());
}

static int meta_equal(const struct dos_checkpoint_meta *a, const struct dos_checkpoint_meta *b)
{
	return a->nparams == b->nparams && a->subgroup_size == b->subgroup_size && a->ntensors == b->ntensors &&
	       a->numel == b->numel && a->weight_dtype == b->weight_dtype && a->grad_dtype == b->grad_dtype &&
	       a->step == b->step && a->skipped_steps == b->skipped_steps && a->steps_done == b->steps_done &&
	       memcmp(&a->loss_scale, &b->loss_scale, 8) == 0 && a->good_steps == b->good_steps && a->seed == b->seed &&
	       a->data_rng == b->data_rng && a->hp.mode == b->hp.mode && memcmp(&a->hp.lr, &b->hp.lr, 8) == 0 &&
	       memcmp(&a->hp.beta1, &b->hp.beta1, 8) == 0 && memcmp(&a->hp.beta2, &b->hp.beta2, 8) == 0 &&
	       memcmp(&a->hp.eps, &b->hp.eps, 8) == 0 && memcmp(&a->hp.weight_decay, &b->hp.weight_decay, 8) == 0 &&
	       _dos_run_id_equal(&a->run, &b->run);
}

/* Checks the stored CRCs against the reference CRC32C and the file's length. */
static void check_file_crcs(const char *path, const struct state *s)
{
	size_t len;
	unsigned char *f = read_whole(path, &len);
	uint64_t n = s->meta.nparams;
	size_t header_len = 180 + 8 * (size_t)s->meta.ntensors, section = 20 + 4 * n;
	CHECK(len == header_len + 3 * section, "%s: %zu bytes, expected %zu", path, len, header_len + 3 * section);
	CHECK(memcmp(f, "DOSCKPT", 8) == 0, "%s: magic", path);
	CHECK(get32(f, 16) == header_len, "%s: header_len %u", path, get32(f, 16));
	CHECK(get32(f, header_len - 4) == ref_crc32c(f, header_len - 4), "%s: header CRC 0x%08x != 0x%08x", path,
	      get32(f, header_len - 4), ref_crc32c(f, header_len - 4));
	for (int k = 0; k < 3; k++) {
		const unsigned char *sec = f + header_len + k * section;
		CHECK(get64(sec, 8) == 4 * n, "%s: section %d length", path, k);
		CHECK(get32(sec, 16 + 4 * n) == ref_crc32c(sec, 16 + 4 * n), "%s: section %d CRC", path, k);
	}
	free(f);
}

/* ---- round trip ----------------------------------------------------------------------- */

static void round_trip(const char *dir, uint64_t nparams, uint32_t ntensors, uint64_t seed)
{
	struct state s;
	make_state(&s, nparams, ntensors, seed);
	char saved[4096], latest[4096];
	save_ok(dir, &s, 1, saved, sizeof saved);
	char want[4096];
	FORMAT(want, "%s/checkpoint-%" PRIu64 ".dos", dir, s.meta.steps_done);
	CHECK(strcmp(saved, want) == 0, "path_out %s, expected %s", saved, want);
	CHECK(_dos_checkpoint_latest(dir, latest, sizeof latest) == 0, "latest: %s", dos_last_error());
	CHECK(strcmp(latest, saved) == 0, "latest %s, saved %s", latest, saved);
	check_file_crcs(saved, &s);

	float *master = test_malloc(nparams * 4), *m = test_malloc(nparams * 4), *v = test_malloc(nparams * 4);
	memset(master, 0x5a, nparams * 4);
	memset(m, 0x5a, nparams * 4);
	memset(v, 0x5a, nparams * 4);
	struct dos_checkpoint_meta expect = s.meta, got;
	memset(&got, 0x5a, sizeof got);
	/* only the layout counts: the progress fields of `expect` are not compared */
	expect.step = expect.steps_done = expect.seed = 0;
	expect.loss_scale = 0;
	int err = _dos_checkpoint_load(latest, &expect, &got, master, m, v);
	CHECK(err == 0, "load %s: %d %s", latest, err, dos_last_error());
	CHECK(memcmp(master, s.master, nparams * 4) == 0, "master differs at %ld",
	      test_first_difference(master, s.master, nparams, 4));
	CHECK(memcmp(m, s.m, nparams * 4) == 0, "m differs at %ld", test_first_difference(m, s.m, nparams, 4));
	CHECK(memcmp(v, s.v, nparams * 4) == 0, "v differs at %ld", test_first_difference(v, s.v, nparams, 4));
	CHECK(meta_equal(&got, &s.meta), "the loaded meta differs from the saved one");
	CHECK(got.numel == expect.numel, "got.numel does not point to expect->numel");
	free(master);
	free(m);
	free(v);
	remove(saved);
	free_state(&s);
}

/* ---- refusals ------------------------------------------------------------------------- */

#define SENTINEL 0xA7

/* The caller's side of a load that must fail: arrays and *got filled with a sentinel. */
struct dest {
	uint64_t n;
	float *master, *m, *v;
	struct dos_checkpoint_meta got;
};

static void dest_fill(struct dest *d)
{
	memset(d->master, SENTINEL, d->n * 4);
	memset(d->m, SENTINEL, d->n * 4);
	memset(d->v, SENTINEL, d->n * 4);
	memset(&d->got, SENTINEL, sizeof d->got);
}

static int all_sentinel(const void *p, size_t len)
{
	const unsigned char *b = p;
	for (size_t i = 0; i < len; i++)
		if (b[i] != SENTINEL)
			return 0;
	return 1;
}

static unsigned refusals;

/* Loads `path` into sentinel-filled destinations; checks the code, the words of the
 * message (each of the NULL-terminated list) and that nothing was written. */
static void expect_refusal_(int line, const char *path, const struct dos_checkpoint_meta *expect, struct dest *d,
			    int code, const char *const *words)
{
	dest_fill(d);
	int err = _dos_checkpoint_load(path, expect, &d->got, d->master, d->m, d->v);
	const char *msg = dos_last_error();
	if (err != code) {
		fprintf(stderr, "line %d: load of %s returned %d (%s), expected %d (%s): %s\n", line, path, err,
			strerror(-err), code, strerror(-code), msg);
		exit(1);
	}
	for (; *words; words++)
		CHECK(strstr(msg, *words), "line %d: message '%s' lacks '%s'", line, msg, *words);
	CHECK(all_sentinel(d->master, d->n * 4) && all_sentinel(d->m, d->n * 4) && all_sentinel(d->v, d->n * 4),
	      "line %d: a refused load of %s wrote the arrays", line, path);
	CHECK(all_sentinel(&d->got, sizeof d->got), "line %d: a refused load of %s wrote *got", line, path);
	refusals++;
}

#define expect_refusal(path, expect, d, code, ...) \
	expect_refusal_(__LINE__, (path), (expect), (d), (code), (const char *const[]){__VA_ARGS__, NULL})

/* Writes `base` with byte `off` xor `mask` to `path`. */
static void write_flipped(const char *path, const unsigned char *base, size_t len, size_t off, unsigned char mask)
{
	unsigned char *f = test_malloc(len);
	memcpy(f, base, len);
	f[off] ^= mask;
	write_whole(path, f, len);
	free(f);
}

static void refusals_group(const char *dir)
{
	struct state s;
	const uint64_t n = 1001;
	make_state(&s, n, 3, 7);
	s.meta.steps_done = 42;
	s.meta.weight_dtype = DOS_BF16;
	s.meta.grad_dtype = DOS_FP16;
	char good[4096], bad[4096];
	save_ok(dir, &s, 1, good, sizeof good);
	FORMAT(bad, "%s/bad.dos", dir);
	size_t len;
	unsigned char *base = read_whole(good, &len);
	const size_t header_len = 180 + 8 * 3, section = 20 + 4 * n;
	CHECK(len == header_len + 3 * section, "file of %zu bytes", len);
	struct dest d = {.n = n, .master = test_malloc(n * 4), .m = test_malloc(n * 4), .v = test_malloc(n * 4)};
	const struct dos_checkpoint_meta *expect = &s.meta;
	static const char *const names[3] = {"section master", "section m", "section v"};

	/* truncated: inside the header, inside each section, one byte short */
	size_t cuts[32], ncuts = 0;
	cuts[ncuts++] = 0;
	cuts[ncuts++] = 5;
	cuts[ncuts++] = 12;
	cuts[ncuts++] = 19;
	cuts[ncuts++] = 100;
	cuts[ncuts++] = header_len - 1;
	for (int k = 0; k < 3; k++) {
		size_t start = header_len + k * section;
		cuts[ncuts++] = start;
		cuts[ncuts++] = start + 9;
		cuts[ncuts++] = start + 16 + 2 * n;
		cuts[ncuts++] = start + section - 2;
	}
	cuts[ncuts++] = len - 1;
	for (size_t i = 0; i < ncuts; i++) {
		write_whole(bad, base, cuts[i]);
		expect_refusal(bad, expect, &d, -EIO, "truncated");
	}
	write_whole(bad, base, len - 1);
	char words[128];
	FORMAT(words, "truncated: %zu bytes, expected %zu", len - 1, len);
	expect_refusal(bad, expect, &d, -EIO, words);
	printf("checkpoint: truncated files (%zu cuts) refused, nothing written\n", ncuts);

	/* every single bit of the header */
	for (size_t off = 0; off < header_len; off++)
		for (int bit = 0; bit < 8; bit++) {
			write_flipped(bad, base, len, off, (unsigned char)(1u << bit));
			if (off < 8)
				expect_refusal(bad, expect, &d, -EINVAL, "not a starpu-dos checkpoint");
			else if (off >= 16 && off < 20)
				expect_refusal(bad, expect, &d, -EIO,
					       "checkpoint"); /* header length: truncated or corrupted */
			else
				expect_refusal(bad, expect, &d, -EIO, "corrupted header");
		}
	printf("checkpoint: each of the %zu bits of the header flipped: refused, nothing written\n", 8 * header_len);

	/* bits of each section: its header, its data (first, middle, last and random bytes)
	 * and its CRC */
	uint64_t rng = 99;
	unsigned flips = 0;
	for (int k = 0; k < 3; k++) {
		size_t start = header_len + k * section;
		size_t offs[64], noffs = 0;
		for (size_t b = 0; b < 16; b++)
			offs[noffs++] = start + b;
		offs[noffs++] = start + 16;
		offs[noffs++] = start + 16 + 2 * n + 1;
		offs[noffs++] = start + 16 + 4 * n - 1;
		for (int r = 0; r < 20; r++)
			offs[noffs++] = start + 16 + test_rand(&rng) % (4 * n);
		for (size_t b = 0; b < 4; b++)
			offs[noffs++] = start + 16 + 4 * n + b;
		for (size_t i = 0; i < noffs; i++) {
			write_flipped(bad, base, len, offs[i], (unsigned char)(1u << (test_rand(&rng) % 8)));
			expect_refusal(bad, expect, &d, -EIO, names[k], "corrupted");
			flips++;
		}
		/* a data bit and a CRC bit, each fully: all 8 bits of one byte */
		for (int bit = 0; bit < 8; bit++) {
			write_flipped(bad, base, len, start + 16 + 4 * (n / 3) + 2, (unsigned char)(1u << bit));
			expect_refusal(bad, expect, &d, -EIO, names[k], "corrupted");
			write_flipped(bad, base, len, start + section - 1, (unsigned char)(1u << bit));
			expect_refusal(bad, expect, &d, -EIO, names[k], "corrupted");
			flips += 2;
		}
	}
	printf("checkpoint: %u bits flipped in the sections' headers, data and CRCs: refused, nothing written\n",
	       flips);

	unsigned char *f = test_malloc(len + 4096);
	/* wrong magic; a text file; an empty file is a (very) truncated one */
	memcpy(f, base, len);
	memcpy(f, "DOSCKPX", 8);
	write_whole(bad, f, len);
	expect_refusal(bad, expect, &d, -EINVAL, "not a starpu-dos checkpoint");
	write_whole(bad, "hello, world\n", 13);
	expect_refusal(bad, expect, &d, -EINVAL, "not a starpu-dos checkpoint");
	write_whole(bad, "", 0);
	expect_refusal(bad, expect, &d, -EIO, "truncated: 0 bytes");

	/* versions 4 and 1, header re-CRCed so that only the version differs */
	memcpy(f, base, len);
	put32(f, 8, 4);
	put32(f, header_len - 4, ref_crc32c(f, header_len - 4));
	write_whole(bad, f, len);
	expect_refusal(bad, expect, &d, -EINVAL, "version 4, this program reads versions 2 to 3");
	put32(f, 8, 1);
	put32(f, header_len - 4, ref_crc32c(f, header_len - 4));
	write_whole(bad, f, len);
	expect_refusal(bad, expect, &d, -EINVAL, "version 1, this program reads versions 2 to 3");

	/* the other byte order's marker, re-CRCed too, so that the marker alone refuses it */
	memcpy(f, base, len);
	put32(f, 12, 0x04030201u);
	put32(f, header_len - 4, ref_crc32c(f, header_len - 4));
	write_whole(bad, f, len);
	expect_refusal(bad, expect, &d, -EINVAL, "byte order", "endianness");
	/* a marker that is neither */
	put32(f, 12, 0x01020305u);
	put32(f, header_len - 4, ref_crc32c(f, header_len - 4));
	write_whole(bad, f, len);
	expect_refusal(bad, expect, &d, -EINVAL, "endianness marker");

	/* trailing garbage: one byte, a page */
	memcpy(f, base, len);
	memset(f + len, 0, 4096);
	write_whole(bad, f, len + 1);
	expect_refusal(bad, expect, &d, -EIO, "trailing garbage");
	write_whole(bad, f, len + 4096);
	expect_refusal(bad, expect, &d, -EIO, "trailing garbage");
	free(f);
	printf("checkpoint: wrong magic, versions 4 and 1, other byte order, trailing garbage: refused, nothing "
	       "written\n");

	/* another model */
	struct dos_checkpoint_meta other = s.meta;
	uint64_t numel[MAX_TENSORS];
	memcpy(numel, s.numel, sizeof numel);
	other.nparams = n + 1;
	expect_refusal(good, &other, &d, -EINVAL, "nparams = 1001, but the model has 1002");
	other = s.meta;
	other.subgroup_size = s.meta.subgroup_size + 1;
	expect_refusal(good, &other, &d, -EINVAL, "subgroup_size");
	other = s.meta;
	other.ntensors = 2;
	expect_refusal(good, &other, &d, -EINVAL, "ntensors = 3, but the model has 2");
	other = s.meta;
	other.numel = numel;
	numel[1]++;
	FORMAT(words, "numel[1] = %" PRIu64 ", but the model has %" PRIu64, s.numel[1], numel[1]);
	expect_refusal(good, &other, &d, -EINVAL, words);
	other = s.meta;
	other.weight_dtype = DOS_FP16;
	expect_refusal(good, &other, &d, -EINVAL, "weight_dtype", "bf16", "fp16");
	other = s.meta;
	other.grad_dtype = DOS_FP32;
	expect_refusal(good, &other, &d, -EINVAL, "grad_dtype", "fp16", "fp32");
	printf("checkpoint: another model (nparams, subgroup_size, ntensors, numel, dtypes): refused, nothing "
	       "written\n");

	/* not a file */
	FORMAT(bad, "%s/no-such-checkpoint.dos", dir);
	expect_refusal(bad, expect, &d, -ENOENT, "no-such-checkpoint.dos");
	expect_refusal(dir, expect, &d, -EISDIR, "directory");
	printf("checkpoint: a nonexistent file and a directory: refused, nothing written\n");

	/* arguments */
	expect_refusal(NULL, expect, &d, -EINVAL, "path is NULL");
	expect_refusal(good, NULL, &d, -EINVAL, "expect is NULL");
	other = s.meta;
	other.nparams = 0;
	expect_refusal(good, &other, &d, -EINVAL, "nparams = 0");
	other = s.meta;
	other.numel = NULL;
	expect_refusal(good, &other, &d, -EINVAL, "numel is NULL", "ntensors = 3");
	CHECK(_dos_checkpoint_load(good, expect, NULL, d.master, d.m, d.v) == -EINVAL, "got NULL");
	CHECK(_dos_checkpoint_load(good, expect, &d.got, d.master, NULL, d.v) == -EINVAL, "m NULL");
	CHECK(strstr(dos_last_error(), "m is NULL"), "%s", dos_last_error());

	/* and the good file still loads */
	CHECK(_dos_checkpoint_load(good, expect, &d.got, d.master, d.m, d.v) == 0, "%s", dos_last_error());
	CHECK(memcmp(d.v, s.v, n * 4) == 0, "v after the refusals");
	printf("checkpoint: %u refusals checked\n", refusals);
	free(base);
	free(d.master);
	free(d.m);
	free(d.v);
	remove(good);
	remove(bad);
	free_state(&s);
}

/* ---- retention and crash leftovers ---------------------------------------------------- */

static void keep_group(const char *dir)
{
	struct state s;
	make_state(&s, 333, 2, 3);
	char path[4096], listing[4096];
	FORMAT(path, "%s/notes.txt", dir);
	write_whole(path, "hello\n", 6);
	FORMAT(path, "%s/checkpoint-x.dos", dir);
	write_whole(path, "x", 1);
	FORMAT(path, "%s/checkpoint-01.dos", dir); /* not canonical: not ours */
	write_whole(path, "x", 1);
	FORMAT(path, "%s/checkpoint-2.dos.bak", dir);
	write_whole(path, "x", 1);
	for (uint64_t step = 1; step <= 5; step++) {
		s.meta.steps_done = step;
		save_ok(dir, &s, 2, NULL, 0);
	}
	list_dir(dir, listing, sizeof listing);
	CHECK(strcmp(listing, "checkpoint-01.dos checkpoint-2.dos.bak checkpoint-4.dos checkpoint-5.dos "
			      "checkpoint-x.dos notes.txt") == 0,
	      "after saving 1..5 with keep = 2: %s", listing);
	printf("checkpoint: steps 1..5 with keep = 2 leave checkpoint-4 and -5, other files alone\n");

	/* a crashed save of step 9 left its temporary file: latest and load ignore it, and
	 * later saves leave it alone (it may be another live process's) */
	FORMAT(path, "%s/.checkpoint-9.dos.tmp-123", dir);
	unsigned char junk[1000];
	memset(junk, 0xEE, sizeof junk);
	write_whole(path, junk, sizeof junk);
	char latest[4096], want[4096];
	CHECK(_dos_checkpoint_latest(dir, latest, sizeof latest) == 0, "%s", dos_last_error());
	FORMAT(want, "%s/checkpoint-5.dos", dir);
	CHECK(strcmp(latest, want) == 0, "latest %s, expected %s", latest, want);
	struct dest d = {
		.n = 333, .master = test_malloc(333 * 4), .m = test_malloc(333 * 4), .v = test_malloc(333 * 4)};
	CHECK(_dos_checkpoint_load(latest, &s.meta, &d.got, d.master, d.m, d.v) == 0, "%s", dos_last_error());
	CHECK(d.got.steps_done == 5 && memcmp(d.master, s.master, 333 * 4) == 0, "load of %s", latest);
	s.meta.steps_done = 6;
	save_ok(dir, &s, 2, NULL, 0);
	CHECK(file_exists(path), "a later save removed %s", path);
	list_dir(dir, listing, sizeof listing);
	CHECK(strstr(listing, "checkpoint-5.dos checkpoint-6.dos") && !strstr(listing, "checkpoint-4.dos"),
	      "after saving 6: %s", listing);
	printf("checkpoint: a crashed save's temporary file is ignored by latest, load and later saves\n");

	/* a save whose N is lower than the directory's newest (a run restarted from scratch)
	 * keeps the file it has just written, and the newest by N */
	s.meta.steps_done = 3;
	save_ok(dir, &s, 1, NULL, 0);
	list_dir(dir, listing, sizeof listing);
	CHECK(strstr(listing, "checkpoint-3.dos checkpoint-6.dos") && !strstr(listing, "checkpoint-5.dos"),
	      "after saving 3 with keep = 1: %s", listing);
	CHECK(_dos_checkpoint_latest(dir, latest, sizeof latest) == 0 && strstr(latest, "checkpoint-6.dos"), "%s",
	      latest);
	/* latest: too small a buffer, an empty and a nonexistent directory */
	CHECK(_dos_checkpoint_latest(dir, latest, strlen(dir) + 5) == -ENAMETOOLONG, "small path_size");
	CHECK(strstr(dos_last_error(), "path_size"), "%s", dos_last_error());
	FORMAT(path, "%s/empty", dir);
	CHECK(mkdir(path, 0755) == 0, "mkdir %s", path);
	CHECK(_dos_checkpoint_latest(path, latest, sizeof latest) == -ENOENT, "latest of an empty directory");
	CHECK(strstr(dos_last_error(), path), "%s", dos_last_error());
	/* names that are not checkpoint-<N>.dos with N in canonical decimal are not ours */
	static const char *const foreign[] = {"checkpoint-007.dos",
					      "checkpoint-.dos",
					      "checkpoint-1.dosx",
					      "checkpoint--1.dos",
					      "checkpoint-18446744073709551616.dos",
					      "checkpoint-1 .dos",
					      ".checkpoint-9.dos.tmp-1"};
	for (size_t i = 0; i < sizeof foreign / sizeof foreign[0]; i++) {
		char name[4096];
		FORMAT(name, "%s/%s", path, foreign[i]);
		write_whole(name, "x", 1);
	}
	CHECK(_dos_checkpoint_latest(path, latest, sizeof latest) == -ENOENT, "latest found %s among foreign names",
	      latest);
	FORMAT(want, "%s/checkpoint-18446744073709551615.dos", path);
	write_whole(want, "x", 1);
	CHECK(_dos_checkpoint_latest(path, latest, sizeof latest) == 0 && strcmp(latest, want) == 0,
	      "latest %s, expected %s", latest, want);
	FORMAT(path, "%s/none", dir);
	CHECK(_dos_checkpoint_latest(path, latest, sizeof latest) == -ENOENT, "latest of a nonexistent directory");
	CHECK(_dos_checkpoint_latest(NULL, latest, sizeof latest) == -EINVAL, "latest NULL dir");
	printf("checkpoint: a lower N keeps the file just written; latest's errors\n");
	free(d.master);
	free(d.m);
	free(d.v);
	free_state(&s);
}

/* ---- failed saves --------------------------------------------------------------------- */

/* Every file of `dir` with its contents, to compare before and after. */
static void snapshot(const char *dir, char *listing, size_t size, unsigned char **contents, size_t *lens, int max)
{
	list_dir(dir, listing, size);
	char copy[4096], *save = NULL;
	FORMAT(copy, "%s", listing);
	int i = 0;
	for (char *name = strtok_r(copy, " ", &save); name; name = strtok_r(NULL, " ", &save)) {
		CHECK(i < max, "too many files");
		char path[4096];
		FORMAT(path, "%s/%s", dir, name);
		contents[i] = read_whole(path, &lens[i]);
		i++;
	}
	for (; i < max; i++)
		contents[i] = NULL;
}

static void expect_unchanged(int line, const char *dir, const char *listing, unsigned char **contents,
			     const size_t *lens, int max)
{
	char now[4096];
	unsigned char *now_contents[8];
	size_t now_lens[8];
	snapshot(dir, now, sizeof now, now_contents, now_lens, max);
	CHECK(strcmp(now, listing) == 0, "line %d: the directory holds '%s', before '%s'", line, now, listing);
	for (int i = 0; i < max && contents[i]; i++) {
		CHECK(now_lens[i] == lens[i] && memcmp(now_contents[i], contents[i], lens[i]) == 0,
		      "line %d: file %d changed", line, i);
		free(now_contents[i]);
	}
}

static void save_errors_group(const char *dir)
{
	struct state s;
	make_state(&s, 5000, 2, 11);
	char sub[4096], path[4096], listing[4096];
	FORMAT(sub, "%s/saves", dir);
	CHECK(mkdir(sub, 0755) == 0, "mkdir %s", sub);
	s.meta.steps_done = 1;
	save_ok(sub, &s, 2, NULL, 0);
	s.meta.steps_done = 2;
	save_ok(sub, &s, 2, NULL, 0);
	unsigned char *contents[8];
	size_t lens[8];
	snapshot(sub, listing, sizeof listing, contents, lens, 8);
	CHECK(strcmp(listing, "checkpoint-1.dos checkpoint-2.dos") == 0, "%s", listing);
	s.meta.steps_done = 3;

	/* nonexistent directory */
	FORMAT(path, "%s/no-such-dir", dir);
	int err = _dos_checkpoint_save(path, &s.meta, s.master, s.m, s.v, 2, NULL, 0);
	CHECK(err == -ENOENT, "save into %s: %d", path, err);
	CHECK(strstr(dos_last_error(), "no-such-dir") && strstr(dos_last_error(), "open"), "%s", dos_last_error());
	CHECK(!file_exists(path), "%s was created", path);

	/* a write that fails half-way (the file size limit: EFBIG, as a full disk would give
	 * ENOSPC): no temporary file, the earlier checkpoints as they were */
	struct rlimit old;
	CHECK(getrlimit(RLIMIT_FSIZE, &old) == 0, "getrlimit");
	struct rlimit small = old;
	small.rlim_cur = 10000;
	signal(SIGXFSZ, SIG_IGN);
	CHECK(setrlimit(RLIMIT_FSIZE, &small) == 0, "setrlimit");
	err = _dos_checkpoint_save(sub, &s.meta, s.master, s.m, s.v, 1, NULL, 0);
	CHECK(setrlimit(RLIMIT_FSIZE, &old) == 0, "restoring the file size limit");
	CHECK(err == -EFBIG, "save over the file size limit returned %d: %s", err, dos_last_error());
	CHECK(strstr(dos_last_error(), ".checkpoint-3.dos.tmp-") && strstr(dos_last_error(), "write"), "%s",
	      dos_last_error());
	expect_unchanged(__LINE__, sub, listing, contents, lens, 8);
	printf("checkpoint: a nonexistent directory and a failing write leave no temporary file and the "
	       "checkpoints as they were\n");

	/* read-only directory: root ignores permissions, so the check would not fail */
	if (geteuid() == 0) {
		printf("checkpoint: read-only directory: skipped (running as root, which ignores permissions)\n");
	} else {
		CHECK(chmod(sub, 0555) == 0, "chmod %s", sub);
		err = _dos_checkpoint_save(sub, &s.meta, s.master, s.m, s.v, 1, NULL, 0);
		CHECK(chmod(sub, 0755) == 0, "chmod %s", sub);
		CHECK(err == -EACCES, "save into a read-only directory returned %d", err);
		CHECK(strstr(dos_last_error(), "Permission denied") && strstr(dos_last_error(), sub), "%s",
		      dos_last_error());
		expect_unchanged(__LINE__, sub, listing, contents, lens, 8);
		printf("checkpoint: a read-only directory: -EACCES, nothing written\n");
	}

	/* arguments, each refused before anything is written */
	char small_path[8];
	err = _dos_checkpoint_save(sub, &s.meta, s.master, s.m, s.v, 1, small_path, sizeof small_path);
	CHECK(err == -ENAMETOOLONG && strstr(dos_last_error(), "path_size = 8"), "%d %s", err, dos_last_error());
	err = _dos_checkpoint_save(sub, &s.meta, s.master, s.m, s.v, 0, NULL, 0);
	CHECK(err == -EINVAL && strstr(dos_last_error(), "keep = 0"), "%d %s", err, dos_last_error());
	struct dos_checkpoint_meta bad = s.meta;
	bad.nparams = 0;
	err = _dos_checkpoint_save(sub, &bad, s.master, s.m, s.v, 1, NULL, 0);
	CHECK(err == -EINVAL && strstr(dos_last_error(), "nparams = 0"), "%d %s", err, dos_last_error());
	bad = s.meta;
	bad.numel = NULL;
	err = _dos_checkpoint_save(sub, &bad, s.master, s.m, s.v, 1, NULL, 0);
	CHECK(err == -EINVAL && strstr(dos_last_error(), "numel is NULL"), "%d %s", err, dos_last_error());
	bad = s.meta;
	bad.grad_dtype = (enum dos_dtype)7;
	err = _dos_checkpoint_save(sub, &bad, s.master, s.m, s.v, 1, NULL, 0);
	CHECK(err == -EINVAL && strstr(dos_last_error(), "grad_dtype = 7"), "%d %s", err, dos_last_error());
	err = _dos_checkpoint_save(sub, &s.meta, s.master, s.m, NULL, 1, NULL, 0);
	CHECK(err == -EINVAL && strstr(dos_last_error(), "v is NULL"), "%d %s", err, dos_last_error());
	err = _dos_checkpoint_save(NULL, &s.meta, s.master, s.m, s.v, 1, NULL, 0);
	CHECK(err == -EINVAL && strstr(dos_last_error(), "dir is NULL"), "%d %s", err, dos_last_error());
	err = _dos_checkpoint_save(sub, NULL, s.master, s.m, s.v, 1, NULL, 0);
	CHECK(err == -EINVAL && strstr(dos_last_error(), "meta is NULL"), "%d %s", err, dos_last_error());
	expect_unchanged(__LINE__, sub, listing, contents, lens, 8);
	printf("checkpoint: bad arguments refused with nothing written\n");

	for (int i = 0; i < 8 && contents[i]; i++)
		free(contents[i]);
	for (int i = 1; i <= 2; i++) {
		FORMAT(path, "%s/checkpoint-%d.dos", sub, i);
		remove(path);
	}
	rmdir(sub);
	free_state(&s);
}

/* ---- sharded checkpoints of a data-parallel job ---------------------------------------- */

enum { SHARDS = 3 };
static const uint64_t shard_begin[SHARDS + 1] = {0, 3000, 7000, 10007};

/* Saves `s` as SHARDS shards and, unless without_manifest, the manifest. */
static void save_sharded(const char *dir, const struct state *s, unsigned keep, int without_manifest)
{
	for (uint32_t i = 0; i < SHARDS; i++) {
		struct dos_checkpoint_meta meta = s->meta;
		uint64_t b = shard_begin[i];
		meta.state_begin = b;
		meta.state_len = shard_begin[i + 1] - b;
		int err = _dos_checkpoint_save_shard(dir, &meta, i, SHARDS, s->master + b, s->m + b, s->v + b);
		CHECK(err == 0, "shard %u: %d %s", i, err, dos_last_error());
	}
	if (!without_manifest) {
		int err = _dos_checkpoint_save_manifest(dir, &s->meta, SHARDS, keep, NULL, 0);
		CHECK(err == 0, "manifest: %d %s", err, dos_last_error());
	}
}

/* Loads [begin, begin + len) of `path` and compares it with `s`, bit for bit. */
static void expect_range(const char *path, const struct state *s, uint64_t begin, uint64_t len)
{
	struct dest d = {
		.n = len, .master = test_malloc(len * 4), .m = test_malloc(len * 4), .v = test_malloc(len * 4)};
	int err = _dos_checkpoint_load_range(path, &s->meta, begin, len, &d.got, d.master, d.m, d.v);
	CHECK(err == 0, "load [%" PRIu64 ", +%" PRIu64 ") of %s: %d %s", begin, len, path, err, dos_last_error());
	CHECK(!memcmp(d.master, s->master + begin, len * 4) && !memcmp(d.m, s->m + begin, len * 4) &&
		      !memcmp(d.v, s->v + begin, len * 4),
	      "[%" PRIu64 ", +%" PRIu64 ") of %s differs", begin, len, path);
	CHECK(meta_equal(&d.got, &s->meta) && d.got.state_begin == begin && d.got.state_len == len,
	      "meta of [%" PRIu64 ", +%" PRIu64 ") of %s", begin, len, path);
	free(d.master);
	free(d.m);
	free(d.v);
}

static void shards_group(const char *dir)
{
	struct state s, other;
	make_state(&s, shard_begin[SHARDS], 3, 31);
	make_state(&other, shard_begin[SHARDS], 3, 32);
	other.meta = s.meta; /* the same layout and counters, other data */
	other.meta.numel = other.numel;
	char path[4096], listing[4096], latest[4096];
	uint64_t n = s.meta.steps_done;

	/* shards without their manifest are no checkpoint */
	save_sharded(dir, &s, 2, 1);
	CHECK(_dos_checkpoint_latest(dir, latest, sizeof latest) == -ENOENT, "shards alone count as a checkpoint");
	CHECK(_dos_checkpoint_save_manifest(dir, &s.meta, 4, 2, NULL, 0) == -ENOENT, "a manifest of 4 shards of 3");
	CHECK(_dos_checkpoint_latest(dir, latest, sizeof latest) == -ENOENT, "a refused manifest was written");
	CHECK(_dos_checkpoint_save_manifest(dir, &s.meta, SHARDS, 2, path, sizeof path) == 0, "%s", dos_last_error());
	CHECK(_dos_checkpoint_latest(dir, latest, sizeof latest) == 0 && !strcmp(latest, path), "latest %s", latest);

	/* resharding: the whole state, and ranges of other rank counts, across shard borders */
	expect_range(path, &s, 0, shard_begin[SHARDS]);
	for (uint64_t ranks = 1; ranks <= 5; ranks++)
		for (uint64_t r = 0; r < ranks; r++) {
			uint64_t b = r * shard_begin[SHARDS] / ranks, e = (r + 1) * shard_begin[SHARDS] / ranks;
			expect_range(path, &s, b, e - b);
		}
	expect_range(path, &s, 2999, 2);
	expect_range(path, &s, 10006, 1);
	struct dest d = {.n = shard_begin[SHARDS]};
	d.master = test_malloc(d.n * 4);
	d.m = test_malloc(d.n * 4);
	d.v = test_malloc(d.n * 4);
	CHECK(_dos_checkpoint_load_range(path, &s.meta, 0, d.n, &d.got, d.master, NULL, NULL) == 0 &&
		      !memcmp(d.master, s.master, d.n * 4),
	      "master alone: %s", dos_last_error());
	CHECK(_dos_checkpoint_load_range(path, &s.meta, 5, d.n, &d.got, d.master, d.m, d.v) == -EINVAL &&
		      strstr(dos_last_error(), "begin = 5, len = 10007"),
	      "a range past the end: %s", dos_last_error());

	/* damage: each refused with nothing written */
	char shard[4096], saved[4096];
	FORMAT(shard, "%s/checkpoint-%" PRIu64 ".shard-1-of-3.dos", dir, n);
	FORMAT(saved, "%s/saved-shard", dir);
	size_t len;
	unsigned char *good = read_whole(shard, &len);
	CHECK(rename(shard, saved) == 0, "rename");
	expect_refusal(path, &s.meta, &d, -ENOENT, "cannot open checkpoint", "shard-1-of-3");
	write_flipped(shard, good, len, len - 100, 0x10);
	expect_refusal(path, &s.meta, &d, -EIO, "shard-1-of-3", "corrupted");
	write_whole(shard, good, len - 1);
	expect_refusal(path, &s.meta, &d, -EIO, "shard-1-of-3", "truncated");
	/* a shard of another save with the same header: its sections' CRCs tell */
	struct dos_checkpoint_meta meta = other.meta;
	meta.state_begin = shard_begin[1];
	meta.state_len = shard_begin[2] - shard_begin[1];
	CHECK(_dos_checkpoint_save_shard(dir, &meta, 1, SHARDS, other.master + shard_begin[1], other.m + shard_begin[1],
					 other.v + shard_begin[1]) == 0,
	      "%s", dos_last_error());
	expect_refusal(path, &s.meta, &d, -EIO, "shard-1-of-3", "not the one the manifest names");
	write_whole(shard, good, len);
	expect_range(path, &s, 0, shard_begin[SHARDS]);
	unlink(saved);

	/* the manifest itself: every bit flipped, truncated, another model */
	unsigned char *manifest = read_whole(path, &len);
	for (size_t bit = 0; bit < 8 * len; bit++) {
		write_flipped(path, manifest, len, bit / 8, (unsigned char)(1u << (bit % 8)));
		dest_fill(&d);
		int err = _dos_checkpoint_load(path, &s.meta, &d.got, d.master, d.m, d.v);
		CHECK(err == -EIO || err == -EINVAL, "manifest bit %zu flipped: %d", bit, err);
		CHECK(all_sentinel(d.master, d.n * 4) && all_sentinel(&d.got, sizeof d.got),
		      "manifest bit %zu flipped: arrays written", bit);
		refusals++;
	}
	write_whole(path, manifest, len - 1);
	expect_refusal(path, &s.meta, &d, -EIO, "manifest", "corrupted");
	write_whole(path, manifest, len);
	struct dos_checkpoint_meta bigger = s.meta;
	bigger.nparams++;
	dest_fill(&d);
	CHECK(_dos_checkpoint_load(path, &bigger, &d.got, d.master, d.m, d.v) == -EINVAL &&
		      strstr(dos_last_error(), "nparams = 10007"),
	      "another model: %s", dos_last_error());

	/* a crash between the shards and the manifest of the next save leaves this one the
	 * latest; the save after that removes the orphans and, beyond keep, the older ones */
	s.meta.steps_done = n + 1;
	save_sharded(dir, &s, 1, 1);
	CHECK(_dos_checkpoint_latest(dir, latest, sizeof latest) == 0 && !strcmp(latest, path), "latest %s", latest);
	s.meta.steps_done = n + 2;
	save_sharded(dir, &s, 1, 0);
	list_dir(dir, listing, sizeof listing);
	char want[4096];
	FORMAT(want,
	       "checkpoint-%" PRIu64 ".dos checkpoint-%" PRIu64 ".shard-0-of-3.dos checkpoint-%" PRIu64
	       ".shard-1-of-3.dos checkpoint-%" PRIu64 ".shard-2-of-3.dos",
	       n + 2, n + 2, n + 2, n + 2);
	CHECK(!strcmp(listing, want), "after keep = 1: '%s', expected '%s'", listing, want);
	s.meta.steps_done = n;
	printf("checkpoint: 3 shards + manifest: loaded whole and as ranges of 1..5 ranks, bit-identical; missing, "
	       "damaged, truncated and foreign shards and %zu flipped manifest bits refused, nothing written; shards "
	       "without a manifest are no checkpoint and are removed by the next save\n",
	       8 * len);
	free(good);
	free(manifest);
	free(d.master);
	free(d.m);
	free(d.v);
	free_state(&s);
	free_state(&other);
}

/* ---- the previous format versions ------------------------------------------------------- */

/* A version 2 file of the version 3 one `v3`: no identity (numel at 160), re-CRCed. */
static unsigned char *to_version_2(const unsigned char *v3, size_t len, uint32_t ntensors, size_t *out_len)
{
	size_t header3 = 180 + 8 * (size_t)ntensors, header2 = header3 - 16;
	unsigned char *v2 = test_malloc(len - 16);
	memcpy(v2, v3, 160);
	memcpy(v2 + 160, v3 + 176, len - 176);
	put32(v2, 8, 2);
	put32(v2, 16, (uint32_t)header2);
	put32(v2, header2 - 4, ref_crc32c(v2, header2 - 4));
	*out_len = len - 16;
	return v2;
}

static void versions_group(const char *dir)
{
	struct state s;
	make_state(&s, 5000, 3, 21);
	s.meta.steps_done = 8;
	char path[4096], old[4096];
	save_ok(dir, &s, 2, path, sizeof path);
	size_t len, len2;
	unsigned char *v3 = read_whole(path, &len);
	unsigned char *v2 = to_version_2(v3, len, 3, &len2);
	FORMAT(old, "%s/checkpoint-2.dos", dir);
	write_whole(old, v2, len2);
	/* read: the same arrays and meta, the run unknown */
	struct dos_checkpoint_meta expect = s.meta, got;
	float *master = test_malloc(5000 * 4), *m = test_malloc(5000 * 4), *v = test_malloc(5000 * 4);
	CHECK(_dos_checkpoint_load(old, &expect, &got, master, m, v) == 0, "version 2: %s", dos_last_error());
	CHECK(!memcmp(master, s.master, 5000 * 4) && !memcmp(v, s.v, 5000 * 4), "version 2: arrays differ");
	CHECK(!_dos_run_id_known(&got.run) && got.steps_done == 8 && got.step == s.meta.step,
	      "version 2: meta (run known %d, steps_done %" PRIu64 ")", _dos_run_id_known(&got.run), got.steps_done);
	/* and still refused when damaged */
	v2[200] ^= 4;
	write_whole(old, v2, len2);
	CHECK(_dos_checkpoint_load(old, &expect, &got, master, m, v) == -EIO, "a damaged version 2 file loaded");
	printf("checkpoint: version 2 files (no identity) load bit-identical, the run unknown; damaged ones are "
	       "refused\n");
	free(v3);
	free(v2);
	free(master);
	free(m);
	free(v);
	remove(old);
	remove(path);
	free_state(&s);
}

/* ---- folders: one run, one process -------------------------------------------------------- */

/* A resume's loader: the whole state into the arrays, as a run's optimizer would. */
struct load_into {
	const struct dos_checkpoint_meta *expect;
	struct dos_checkpoint_meta *got;
	float *master, *m, *v;
	uint64_t n;
};

static int load_into(void *arg, const char *path)
{
	struct load_into *l = arg;
	return _dos_checkpoint_load_range(path, l->expect, 0, l->n, l->got, l->master, l->m, l->v);
}

static void skipped_count(void *arg, const char *path, const char *why)
{
	CHECK(path && why && *why, "skipped without a path or a reason");
	(*(int *)arg)++;
}

static void folders_group(const char *top)
{
	char dir[4096], path[4096], name[4200], listing[4096];
	struct _dos_checkpoint_folder f = DOS_CHECKPOINT_FOLDER_INIT, g;
	/* created with its parents; a file in the way is refused */
	FORMAT(dir, "%s/a/b/c", top);
	CHECK(_dos_checkpoint_folder_take(&f, dir, 1) == 0, "take %s: %s", dir, dos_last_error());
	_dos_checkpoint_folder_release(&f);
	FORMAT(name, "%s/a/file", top);
	write_whole(name, "x", 1);
	FORMAT(path, "%s/a/file/d", top);
	CHECK(_dos_checkpoint_folder_take(&f, path, 1) == -ENOTDIR && strstr(dos_last_error(), "not a folder"),
	      "a folder under a file: %s", dos_last_error());
	CHECK(f.dir == NULL && f.lock_fd == -1, "a refused take left the folder set");

	/* the lock: another process holding it is named; it goes when that process dies */
	int ready[2], go[2];
	CHECK(pipe(ready) == 0 && pipe(go) == 0, "pipe");
	pid_t child = fork();
	CHECK(child >= 0, "fork");
	if (child == 0) {
		char c = 0;
		struct _dos_checkpoint_folder mine;
		int ok = _dos_checkpoint_folder_take(&mine, dir, 1) == 0;
		if (write(ready[1], &ok, sizeof ok) != (ssize_t)sizeof ok || read(go[0], &c, 1) < 0)
			_exit(2);
		pause(); /* until killed: the kernel, not the program, must release the lock */
		_exit(0);
	}
	int ok = 0;
	CHECK(read(ready[0], &ok, sizeof ok) == (ssize_t)sizeof ok && ok, "the child could not take %s", dir);
	char holder[64];
	FORMAT(holder, "pid %ld on", (long)child);
	CHECK(_dos_checkpoint_folder_take(&f, dir, 1) == -EBUSY && strstr(dos_last_error(), holder) &&
		      strstr(dos_last_error(), dir),
	      "a folder held by pid %ld: %s", (long)child, dos_last_error());
	CHECK(write(go[1], "x", 1) == 1, "pipe");
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
	close(ready[0]), close(ready[1]), close(go[0]), close(go[1]);
	CHECK(_dos_checkpoint_folder_take(&f, dir, 1) == 0, "after SIGKILL of its holder: %s", dos_last_error());
	/* a second taker in this process too (two optimizers) */
	CHECK(_dos_checkpoint_folder_take(&g, dir, 1) == -EBUSY && strstr(dos_last_error(), "this process"),
	      "a second take in one process: %s", dos_last_error());

	/* a fresh run claims an empty folder; its saves carry its identity */
	struct state s, other;
	make_state(&s, 3000, 2, 31);
	make_state(&other, 3000, 2, 32);
	other.meta.subgroup_size = s.meta.subgroup_size;
	other.meta.weight_dtype = s.meta.weight_dtype;
	other.meta.grad_dtype = s.meta.grad_dtype;
	memcpy(other.numel, s.numel, sizeof s.numel);
	struct _dos_run_id run;
	CHECK(_dos_run_id_new(&run) == 0 && _dos_run_id_known(&run), "_dos_run_id_new");
	CHECK(_dos_checkpoint_folder_claim(&f, &run, 1, "ADVICE") == 0, "claim an empty folder: %s", dos_last_error());
	s.meta.run = run;
	for (uint64_t k = 1; k <= 3; k++) {
		s.meta.steps_done = k;
		CHECK(_dos_checkpoint_folder_check(&f) == 0, "check before save %" PRIu64 ": %s", k, dos_last_error());
		save_ok(dir, &s, 2, NULL, 0);
	}
	/* another run's checkpoint appears: the next check refuses, naming it; retention
	 * never deletes it */
	other.meta.steps_done = 1;
	save_ok(dir, &other, 1, NULL, 0);
	CHECK(_dos_checkpoint_folder_check(&f) == -EEXIST && strstr(dos_last_error(), "checkpoint-1.dos") &&
		      strstr(dos_last_error(), "of another run"),
	      "check with another run's file: %s", dos_last_error());
	s.meta.steps_done = 4;
	save_ok(dir, &s, 1, NULL, 0);
	list_dir(dir, listing, sizeof listing);
	CHECK(!strcmp(listing, ".starpu-dos.lock checkpoint-1.dos checkpoint-4.dos"), "retention: %s", listing);
	_dos_checkpoint_folder_release(&f);
	FORMAT(name, "%s/checkpoint-1.dos", dir);
	remove(name);

	/* a fresh run refuses a folder with any checkpoint, even an unreadable one */
	CHECK(_dos_checkpoint_folder_take(&f, dir, 1) == 0, "%s", dos_last_error());
	struct _dos_run_id fresh;
	CHECK(_dos_run_id_new(&fresh) == 0, "_dos_run_id_new");
	CHECK(_dos_checkpoint_folder_claim(&f, &fresh, 1, "ADVICE") == -EEXIST &&
		      strstr(dos_last_error(), "checkpoint-4.dos") && strstr(dos_last_error(), "ADVICE"),
	      "a fresh run in a folder with checkpoints: %s", dos_last_error());
	_dos_checkpoint_folder_release(&f);

	/* resume: past a damaged newer one, a truncated one and an empty stray, each reported;
	 * temporaries of killed saves removed when the folder is taken */
	s.meta.steps_done = 5;
	save_ok(dir, &s, 3, path, sizeof path);
	size_t len;
	unsigned char *bytes = read_whole(path, &len);
	bytes[len / 2] ^= 1;
	FORMAT(name, "%s/checkpoint-6.dos", dir);
	write_whole(name, bytes, len);
	FORMAT(name, "%s/checkpoint-7.dos", dir);
	write_whole(name, bytes, 100);
	FORMAT(name, "%s/checkpoint-18446744073709551615.dos", dir);
	write_whole(name, "", 0);
	FORMAT(name, "%s/.checkpoint-8.dos.tmp-12345", dir);
	write_whole(name, "half", 4);
	FORMAT(name, "%s/.checkpoint-8.shard-0-of-2.dos.tmp-12345", dir);
	write_whole(name, "half", 4);
	free(bytes);
	CHECK(_dos_checkpoint_folder_take(&f, dir, 1) == 0, "%s", dos_last_error());
	list_dir(dir, listing, sizeof listing);
	CHECK(!strstr(listing, ".tmp-"), "temporaries left after taking the folder: %s", listing);
	int skipped = 0;
	struct _dos_checkpoint_search search = {.skipped = skipped_count, .arg = &skipped};
	struct dos_checkpoint_meta got;
	float *master = test_malloc(3000 * 4), *m = test_malloc(3000 * 4), *v = test_malloc(3000 * 4);
	char loaded[4096];
	struct load_into into = {&s.meta, &got, master, m, v, 3000};
	CHECK(_dos_checkpoint_folder_resume(&f, load_into, &into, &search, "ADVICE", loaded, sizeof loaded) == 0,
	      "resume: %s", dos_last_error());
	CHECK(!strcmp(loaded, path) && got.steps_done == 5 && skipped == 3 && _dos_run_id_equal(&f.run, &run) &&
		      !memcmp(master, s.master, 3000 * 4),
	      "resumed from %s (step %" PRIu64 ", %d skipped)", loaded, got.steps_done, skipped);
	char newest[4096];
	CHECK(_dos_checkpoint_newest_valid(dir, NULL, newest, sizeof newest) == 0 && !strcmp(newest, path),
	      "newest valid: %s %s", newest, dos_last_error());
	/* the run's damaged newer one is set aside, so that retention keeps the one that
	 * loaded instead of it; the truncated one and the stray (no run to read) stay */
	list_dir(dir, listing, sizeof listing);
	FORMAT(name, "%s/checkpoint-6.dos", dir);
	CHECK(strstr(listing, "checkpoint-6.dos.damaged") && access(name, F_OK) != 0 &&
		      strstr(listing, "checkpoint-7.dos") && strstr(listing, "checkpoint-18446744073709551615.dos"),
	      "after resuming past them: %s", listing);
	s.meta.steps_done = 9;
	save_ok(dir, &s, 2, NULL, 0);
	list_dir(dir, listing, sizeof listing);
	CHECK(strstr(listing, "checkpoint-9.dos") && strstr(listing, path + strlen(dir) + 1) &&
		      strstr(listing, "checkpoint-6.dos.damaged"),
	      "retention after the resume (keep 2): %s", listing);
	FORMAT(name, "%s/checkpoint-9.dos", dir);
	remove(name);
	char aside[4096];
	FORMAT(name, "%s/checkpoint-6.dos", dir);
	FORMAT(aside, "%s/checkpoint-6.dos.damaged", dir);
	CHECK(rename(aside, name) == 0, "rename %s back", aside);
	_dos_checkpoint_folder_release(&f);
	/* with another run's checkpoint beside them: refused before anything is loaded */
	other.meta.steps_done = 2;
	save_ok(dir, &other, 1, NULL, 0);
	CHECK(_dos_checkpoint_folder_take(&f, dir, 1) == 0, "%s", dos_last_error());
	memset(master, 0, 3000 * 4);
	CHECK(_dos_checkpoint_folder_resume(&f, load_into, &into, NULL, "ADVICE", NULL, 0) == -EEXIST &&
		      strstr(dos_last_error(), "checkpoint-2.dos") && master[5] == 0,
	      "resume beside another run's checkpoint: %s", dos_last_error());
	_dos_checkpoint_folder_release(&f);
	/* nothing that loads: every reason given */
	FORMAT(name, "%s/checkpoint-2.dos", dir);
	remove(name);
	remove(path);
	FORMAT(name, "%s/checkpoint-4.dos", dir);
	remove(name);
	CHECK(_dos_checkpoint_folder_take(&f, dir, 1) == 0, "%s", dos_last_error());
	CHECK(_dos_checkpoint_folder_resume(&f, load_into, &into, NULL, "ADVICE", NULL, 0) == -ENOENT &&
		      strstr(dos_last_error(), "none of the 3 checkpoints") &&
		      strstr(dos_last_error(), "checkpoint-6.dos") && strstr(dos_last_error(), "corrupted"),
	      "nothing to resume from: %s", dos_last_error());
	_dos_checkpoint_folder_release(&f);
	printf("checkpoint folders: created with parents; held by one process (its pid named, released by SIGKILL); a "
	       "fresh run refuses checkpoints there, a save another run's; retention keeps other runs' files; resume "
	       "passes damaged and stray files (each reported), refuses a folder of two runs; stale temporaries "
	       "removed\n");
	free(master);
	free(m);
	free(v);
	free_state(&s);
	free_state(&other);
}

static void remove_tree(const char *dir)
{
	DIR *d = opendir(dir);
	if (!d)
		return;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		char path[4096];
		FORMAT(path, "%s/%s", dir, e->d_name);
		struct stat st;
		if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode))
			remove_tree(path);
		else
			unlink(path);
	}
	closedir(d);
	rmdir(dir);
}

int main(void)
{
	/* refusals are provoked on purpose: their messages are checked, not printed (set
	 * DOS_QUIET=0 to see them) */
	setenv("DOS_QUIET", "1", 0);
	CHECK(ref_crc32c("123456789", 9) == 0xE3069283u, "reference CRC32C 0x%08x", ref_crc32c("123456789", 9));

	const char *tmpdir = getenv("TMPDIR");
	char dir[4096];
	FORMAT(dir, "%s/dos-checkpoint-XXXXXX", tmpdir && *tmpdir ? tmpdir : "/tmp");
	CHECK(mkdtemp(dir), "mkdtemp %s: %s", dir, strerror(errno));

	round_trip(dir, 100003, 7, 1);
	for (uint64_t n = 1; n <= 17; n++)
		round_trip(dir, n, n < 8 ? (uint32_t)n : 1, 100 + n);
	printf("checkpoint: round trips of 100003 floats (NaN payloads, -0.0, denormals) and of 1..17: bit-identical "
	       "arrays and meta; stored CRCs equal a bitwise CRC32C (checked on \"123456789\")\n");

	char sub[4096];
	FORMAT(sub, "%s/keep", dir);
	CHECK(mkdir(sub, 0755) == 0, "mkdir %s", sub);
	keep_group(sub);
	FORMAT(sub, "%s/refusals", dir);
	CHECK(mkdir(sub, 0755) == 0, "mkdir %s", sub);
	refusals_group(sub);
	save_errors_group(dir);
	FORMAT(sub, "%s/shards", dir);
	CHECK(mkdir(sub, 0755) == 0, "mkdir %s", sub);
	shards_group(sub);
	FORMAT(sub, "%s/versions", dir);
	CHECK(mkdir(sub, 0755) == 0, "mkdir %s", sub);
	versions_group(sub);
	FORMAT(sub, "%s/folders", dir);
	CHECK(mkdir(sub, 0755) == 0, "mkdir %s", sub);
	folders_group(sub);
	remove_tree(dir);
	return 0;
}
