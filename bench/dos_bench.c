/* dos-bench: how close the Adam subgroup update comes to this machine's memory bandwidth,
 * as a bare kernel and through StarPU on the CPU, and on the GPU when there is one.
 * A benchmark, not a test: missed targets are reported, only real errors fail the run. */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <starpu.h>

#include "bench.h"
#include "data.h"
#include "dos.h"
#include "errors.h"
#include "kernels.h"
#include "numerics.h"
#include "parse.h"

/* Bytes one update moves per parameter, counted the same way in every benchmark: read p, m,
 * v (12) and the fp16 gradient (2), write p, m, v (12) and the bf16 working weight (2). */
#define ADAM_BYTES_PER_PARAM 28.0
/* STREAM's count for a float64 triad: read b and c, write a (write-allocate not counted). */
#define TRIAD_BYTES_PER_ELEMENT 24.0
/* 3 x 256 MiB: far larger than any last-level cache. */
#define TRIAD_ELEMENTS ((size_t)32 << 20)
/* A timed batch this long drowns clock resolution and thread start-up. */
#define MIN_BATCH_SECONDS 0.2
/* Share of the available memory a size may use; the rest is left to everyone else. */
#define MEMORY_HEADROOM 0.8
/* The GPU buffers are filled from a host staging buffer of at most this many params. */
#define GPU_FILL_CHUNK ((size_t)1 << 20)
#define MAX_SIZES 16
#define MAX_REPS 1000

#define TARGET_CPU_VS_TRIAD 0.80
#define TARGET_STARPU_VS_BARE 0.95
#define TARGET_GPU_VS_COPY 0.80
#define STARPU_TARGET_MIN_SIZE 10000000 /* below this, per-task overhead is expected to show */

static const char usage[] =
	"usage: dos-bench adam [--sizes 1e5,1e6,1e7,1e8] [--reps N] [--isa auto|scalar|avx2|avx512] [--quick]\n"
	"       dos-bench calibrate [--max-size N] [--reps R]\n"
	"       dos-bench host\n"
	"       dos-bench optimizer [--params P] [--subgroup S] [--grad fp16|bf16|fp32] [--weight fp16|bf16|none]\n"
	"                           [--steps K] [--policies p1,p2,...] [--gpu-mem-mib M]\n"
	"       dos-bench gemm [--cpu-size N] [--gpu-size N] [--reps R]\n";

/* Exit status 2 for a bad command line (the usage follows the message), 1 for a failure. */
#define usage_error(...) exit_with_message(2, __VA_ARGS__)
#define die(...) exit_with_message(1, __VA_ARGS__)
static void exit_with_message(int status, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
static void exit_with_message(int status, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	bench_vreport("dos-bench", status, usage, fmt, ap);
	va_end(ap);
	exit(status);
}

static void *xcalloc(size_t count, size_t size)
{
	void *p = calloc(count, size);
	if (!p)
		die("out of memory allocating %zu x %zu bytes", count, size);
	return p;
}

/* ---- Options ------------------------------------------------------------------------ */

struct options {
	size_t sizes[MAX_SIZES];
	int nsizes;
	int reps;
};

static void parse_sizes(const char *text, struct options *o)
{
	o->nsizes = 0;
	for (const char *item = text;; item++) {
		size_t len = strcspn(item, ",");
		char one[64];
		double x = 0;
		snprintf(one, sizeof one, "%.*s", (int)(len < sizeof one - 1 ? len : sizeof one - 1), item);
		/* The codelets count elements in 32 bits. */
		if (len == 0 || len >= sizeof one || _dos_parse_double(one, &x) != 0 || !(x >= 1 && x <= UINT32_MAX) ||
		    x != floor(x))
			usage_error("--sizes %s: '%.*s' is not a whole number in [1, %u]", text, (int)len, item,
				    UINT32_MAX);
		if (o->nsizes == MAX_SIZES)
			usage_error("--sizes %s: more than %d sizes", text, MAX_SIZES);
		o->sizes[o->nsizes++] = (size_t)x;
		item += len;
		if (*item == '\0')
			return;
	}
}

static int parse_reps(const char *text)
{
	uint64_t reps;
	if (_dos_parse_u64(text, 3, MAX_REPS, &reps) != 0)
		usage_error("--reps %s: expected a whole number in [3, %d] (medians need at least 3)", text, MAX_REPS);
	return (int)reps;
}

static void select_isa(const char *text)
{
	for (int isa = DOS_CPU_ISA_AUTO; isa <= DOS_CPU_ISA_AVX512; isa++) {
		if (strcmp(text, dos_cpu_isa_name((enum dos_cpu_isa)isa)) != 0)
			continue;
		if (dos_cpu_isa_select((enum dos_cpu_isa)isa) != 0)
			usage_error("--isa %s: this CPU cannot run it", text);
		return;
	}
	usage_error("--isa %s: expected auto, scalar, avx2 or avx512", text);
}

/* The value of option `name` at argv[*i], given as "name value" or "name=value"; NULL when
 * argv[*i] is another option. */
static const char *option_value(int argc, char **argv, int *i, const char *name)
{
	size_t len = strlen(name);
	if (strncmp(argv[*i], name, len) != 0)
		return NULL;
	if (argv[*i][len] == '=')
		return argv[*i] + len + 1;
	if (argv[*i][len] != '\0')
		return NULL;
	if (*i + 1 >= argc)
		usage_error("%s: missing value", name);
	return argv[++*i];
}

static void parse_options(int argc, char **argv, struct options *o)
{
	if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
		fputs(usage, stdout);
		exit(0);
	}
	if (argc < 2)
		usage_error("missing subcommand");
	if (strcmp(argv[1], "adam") != 0)
		usage_error("unknown subcommand '%s'", argv[1]);
	const char *sizes = NULL, *value;
	int quick = 0;
	o->reps = 5;
	for (int i = 2; i < argc; i++) {
		if ((value = option_value(argc, argv, &i, "--sizes")))
			sizes = value;
		else if ((value = option_value(argc, argv, &i, "--reps")))
			o->reps = parse_reps(value);
		else if ((value = option_value(argc, argv, &i, "--isa")))
			select_isa(value);
		else if (!strcmp(argv[i], "--quick"))
			quick = 1;
		else
			usage_error("unknown option '%s'", argv[i]);
	}
	parse_sizes(sizes ? sizes : quick ? "1e5,1e6,1e7" : "1e5,1e6,1e7,1e8", o);
}

/* ---- Machine ------------------------------------------------------------------------ */

/* MemAvailable counts reclaimable page cache, which _SC_AVPHYS_PAGES (free pages only)
 * does not: after reading big files the latter would skip sizes that fit. */
static double available_memory_bytes(void)
{
	FILE *f = fopen("/proc/meminfo", "r");
	char line[256];
	unsigned long long kib;
	while (f && fgets(line, sizeof line, f)) {
		if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
			fclose(f);
			return (double)kib * 1024.0;
		}
	}
	if (f)
		fclose(f);
	return (double)sysconf(_SC_AVPHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
}

static void print_context(int ncores)
{
	char model[256] = "unknown", line[512], date[64];
	FILE *f = fopen("/proc/cpuinfo", "r");
	while (f && fgets(line, sizeof line, f)) {
		char *colon = strchr(line, ':');
		if (!strncmp(line, "model name", 10) && colon) {
			snprintf(model, sizeof model, "%s", colon + 1 + strspn(colon + 1, " \t"));
			model[strcspn(model, "\n")] = '\0';
			break;
		}
	}
	if (f)
		fclose(f);
	time_t now = time(NULL);
	strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S %Z", localtime(&now));
	int major, minor, release;
	starpu_get_version(&major, &minor, &release);
	printf("# dos-bench adam, starpu-dos %s, StarPU %d.%d.%d, %s\n", dos_version_string(), major, minor, release,
	       date);
	printf("# CPU: %s, %d online cores, CPU kernels: %s, %.1f GB available\n", model, ncores,
	       dos_cpu_isa_name(dos_cpu_isa_selected()), available_memory_bytes() / 1e9);
}

/* ---- Timing ------------------------------------------------------------------------- */

/* Runs `calls` calls back to back and returns how long they took, in seconds. */
typedef double (*timed_batch_fn)(void *ctx, long calls);

/* Median over `reps` batches of the seconds per call, each batch at least
 * MIN_BATCH_SECONDS long, after an untimed warm-up (page faults, lazy initialisation). */
static double median_seconds_per_call(timed_batch_fn batch, void *ctx, int reps)
{
	double per_call[MAX_REPS];
	batch(ctx, 1);
	double one = batch(ctx, 1);
	long calls = (long)ceil(MIN_BATCH_SECONDS / fmax(one, 1e-7));
	if (calls < 1)
		calls = 1;
	for (int r = 0; r < reps; r++)
		per_call[r] = batch(ctx, calls) / (double)calls;
	return bench_median(per_call, reps);
}

typedef void (*thread_body_fn)(void *ctx, int thread, long calls);

struct thread_start {
	thread_body_fn body;
	void *ctx;
	int thread;
	long calls;
};

static void *thread_main(void *arg)
{
	struct thread_start *s = arg;
	s->body(s->ctx, s->thread, s->calls);
	return NULL;
}

/* Runs body(ctx, i, calls) on fresh threads i = 0 .. nthreads - 1 and waits for them all. */
static void run_on_threads(int nthreads, thread_body_fn body, void *ctx, long calls)
{
	pthread_t *ids = xcalloc((size_t)nthreads, sizeof *ids);
	struct thread_start *starts = xcalloc((size_t)nthreads, sizeof *starts);
	for (int i = 0; i < nthreads; i++) {
		starts[i] = (struct thread_start){body, ctx, i, calls};
		int err = pthread_create(&ids[i], NULL, thread_main, &starts[i]);
		if (err)
			die("pthread_create (thread %d of %d): %s", i, nthreads, strerror(err));
	}
	for (int i = 0; i < nthreads; i++)
		pthread_join(ids[i], NULL);
	free(ids);
	free(starts);
}

/* ---- STREAM-like triad --------------------------------------------------------------- */

struct triad {
	double *a, *b, *c;
	size_t n;
	int nthreads;
};

/* One core streams no faster than it issues loads and stores: at -O2 (no loop vectorizer)
 * and baseline SSE2 the triad would be bound by instructions, not memory, and the kernel
 * would beat the "bandwidth". So: explicit vectors of 8 doubles, compiled for the widest
 * instruction set the CPU has (GCC picks the clone at load time). */
typedef double triad_vector __attribute__((vector_size(64)));
#if defined(DOS_CPU_X86_64) && defined(__GNUC__) && !defined(__clang__)
#define WIDEST_ISA_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define WIDEST_ISA_CLONES
#endif

WIDEST_ISA_CLONES static void triad_body(void *ctx, int thread, long calls)
{
	const struct triad *t = ctx;
	size_t nvec = t->n / 8; /* n is a multiple of 8 and the arrays are 64-byte aligned */
	size_t begin = nvec * (size_t)thread / (size_t)t->nthreads;
	size_t end = nvec * (size_t)(thread + 1) / (size_t)t->nthreads;
	triad_vector *restrict a = (triad_vector *)t->a, *restrict b = (triad_vector *)t->b,
			       *restrict c = (triad_vector *)t->c;
	if (calls == 0) { /* first touch by the thread that will stream the chunk */
		for (size_t i = begin; i < end; i++) {
			a[i] = (triad_vector){0};
			b[i] = (triad_vector){0} + 1.0;
			c[i] = (triad_vector){0} + 2.0;
		}
	}
	for (long k = 0; k < calls; k++)
		for (size_t i = begin; i < end; i++)
			a[i] = b[i] + 3.0 * c[i];
}

static double triad_batch(void *ctx, long calls)
{
	double start = bench_now_seconds();
	run_on_threads(((struct triad *)ctx)->nthreads, triad_body, ctx, calls);
	return bench_now_seconds() - start;
}

/* Host memory bandwidth in bytes/s for each entry of core_counts. */
static void measure_triad(const int *core_counts, int ncounts, int reps, double *bandwidth)
{
	struct triad t = {.n = TRIAD_ELEMENTS, .nthreads = core_counts[ncounts - 1]};
	size_t bytes = t.n * sizeof(double);
	if (posix_memalign((void **)&t.a, 64, bytes) || posix_memalign((void **)&t.b, 64, bytes) ||
	    posix_memalign((void **)&t.c, 64, bytes))
		die("out of memory allocating the 3 x %zu MiB triad arrays", bytes >> 20);
	run_on_threads(t.nthreads, triad_body, &t, 0);
	printf("\n# Host memory bandwidth: triad a[i] = b[i] + s*c[i], float64, 3 x %zu MiB, counted as %.0f B/element "
	       "(read b, c; write a), median of %d\n",
	       bytes >> 20, TRIAD_BYTES_PER_ELEMENT, reps);
	for (int c = 0; c < ncounts; c++) {
		t.nthreads = core_counts[c];
		bandwidth[c] = TRIAD_BYTES_PER_ELEMENT * (double)t.n / median_seconds_per_call(triad_batch, &t, reps);
		/* The store to a[] first reads its line (write-allocate): the memory really moves 32 B. */
		printf("#   %3d %-6s %8.2f GB/s   (%.2f GB/s counting the write-allocate read)\n", core_counts[c],
		       core_counts[c] > 1 ? "cores:" : "core:", bandwidth[c] / 1e9, bandwidth[c] * 32.0 / 24.0 / 1e9);
		fflush(stdout);
	}
	free(t.a);
	free(t.b);
	free(t.c);
}

/* ---- Adam subgroups ------------------------------------------------------------------ */

enum buffer { MASTER, MOMENT1, MOMENT2, GRAD, WEIGHT16, NBUFFERS };
static const size_t elem_size[NBUFFERS] = {sizeof(float), sizeof(float), sizeof(float), sizeof(uint16_t),
					   sizeof(uint16_t)};
#define FOOTPRINT_PER_PARAM 16 /* sum of elem_size */

struct subgroup {
	void *buf[NBUFFERS];
};

enum allocator { PLAIN_ALLOC, STARPU_ALLOC };

static void subgroup_free(struct subgroup *g, size_t n, enum allocator how)
{
	for (int b = 0; b < NBUFFERS; b++) {
		if (g->buf[b] && how == STARPU_ALLOC)
			starpu_free_noflag(g->buf[b], n * elem_size[b]);
		else
			free(g->buf[b]);
		g->buf[b] = NULL;
	}
}

/* 0, or -ENOMEM with nothing left allocated. */
static int subgroup_alloc(struct subgroup *g, size_t n, enum allocator how)
{
	for (int b = 0; b < NBUFFERS; b++) {
		int err = how == STARPU_ALLOC ? starpu_malloc(&g->buf[b], n * elem_size[b])
					      : posix_memalign(&g->buf[b], 64, n * elem_size[b]);
		if (err) {
			g->buf[b] = NULL;
			subgroup_free(g, n, how);
			return -ENOMEM;
		}
	}
	return 0;
}

static float uniform01(uint64_t *state)
{
	return (float)(_dos_splitmix64(state) >> 40) * 0x1.0p-24f;
}

/* Plausible training values: parameters roughly N(0, 1), small moments, positive v, and
 * fp16 gradients of magnitude 1e-4 .. 1e-2 (normal in fp16), so no subnormal path is timed. */
static void subgroup_fill(struct subgroup *g, size_t n, uint64_t seed)
{
	float *p = g->buf[MASTER], *m = g->buf[MOMENT1], *v = g->buf[MOMENT2];
	uint16_t *grad = g->buf[GRAD], *w = g->buf[WEIGHT16];
	for (size_t i = 0; i < n; i++) {
		float irwin_hall = uniform01(&seed) + uniform01(&seed) + uniform01(&seed) + uniform01(&seed) - 2.0f;
		p[i] = 1.7320508f * irwin_hall; /* variance 4/12, scaled to 1 */
		m[i] = 1e-3f * (uniform01(&seed) - 0.5f);
		v[i] = 1e-6f * (0.5f + uniform01(&seed));
		float g_abs = 1e-4f + 1e-2f * uniform01(&seed);
		grad[i] = dos_float_to_fp16(_dos_splitmix64(&seed) & 1 ? -g_abs : g_abs);
		w[i] = 0;
	}
}

static struct dos_adam_step adam_step(uint64_t step)
{
	static const struct dos_adam_hparams hp = {
		.mode = DOS_ADAMW, .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 1e-2};
	struct dos_adam_step s;
	if (dos_adam_step_init(&s, &hp, step, 1.0))
		die("dos_adam_step_init(step = %llu): %s", (unsigned long long)step, dos_last_error());
	return s;
}

/* One subgroup per core, updated side by side. */
struct adam_set {
	struct subgroup *groups;
	starpu_data_handle_t (*handles)[NBUFFERS];
	int count;
	size_t n;
	struct dos_adam_step step; /* bare: the same scalars every call */
	uint64_t step_number;      /* starpu: a new step per call */
};

static void adam_fill_body(void *ctx, int thread, long calls)
{
	struct adam_set *s = ctx;
	subgroup_fill(&s->groups[thread], s->n, 0x5eed0000ull + (uint64_t)thread);
}

static void adam_bare_body(void *ctx, int thread, long calls)
{
	const struct adam_set *s = ctx;
	void *const *b = s->groups[thread].buf;
	const struct _dos_cpu_kernels *k = _dos_cpu_kernels_selected();
	for (long c = 0; c < calls; c++)
		k->adam(&s->step, b[MASTER], b[MOMENT1], b[MOMENT2], b[GRAD], DOS_FP16, b[WEIGHT16], DOS_BF16, s->n);
}

static double adam_bare_batch(void *ctx, long calls)
{
	double start = bench_now_seconds();
	run_on_threads(((struct adam_set *)ctx)->count, adam_bare_body, ctx, calls);
	return bench_now_seconds() - start;
}

/* One optimizer step per call, waited for as a training loop would before its next forward. */
static double adam_starpu_batch(void *ctx, long calls)
{
	struct adam_set *s = ctx;
	double start = bench_now_seconds();
	for (long c = 0; c < calls; c++) {
		struct dos_adam_step step = adam_step(++s->step_number);
		for (int g = 0; g < s->count; g++) {
			starpu_data_handle_t *h = s->handles[g];
			struct starpu_task *task;
			if (dos_adam_task_create(&step, h[MASTER], h[MOMENT1], h[MOMENT2], h[GRAD], DOS_FP16,
						 h[WEIGHT16], DOS_BF16, &task))
				die("dos_adam_task_create (subgroup %d): %s", g, dos_last_error());
			int err = starpu_task_submit(task);
			if (err)
				die("starpu_task_submit (subgroup %d): %s", g, strerror(-err));
		}
		int err = starpu_task_wait_for_all();
		if (err)
			die("starpu_task_wait_for_all: %s", strerror(-err));
	}
	return bench_now_seconds() - start;
}

enum variant { BARE, STARPU, NVARIANTS };
static const char *const variant_names[NVARIANTS] = {"bare", "starpu"};

static int too_big(double bytes, double available, const char *what)
{
	if (bytes <= MEMORY_HEADROOM * available)
		return 0;
	printf("%s skipped: needs %.1f GB, %.1f GB available\n", what, bytes / 1e9, available / 1e9);
	return 1;
}

/* Params/s of `cores` subgroups of n params updated side by side; NAN when skipped. */
static double measure_cpu_adam(enum variant variant, int cores, size_t n, int reps)
{
	char what[64];
	snprintf(what, sizeof what, "%12zu %5d  %-7s", n, cores, variant_names[variant]);
	if (too_big((double)cores * (double)n * FOOTPRINT_PER_PARAM, available_memory_bytes(), what))
		return NAN;
	enum allocator how = variant == STARPU ? STARPU_ALLOC : PLAIN_ALLOC;
	struct adam_set s = {.count = cores, .n = n, .step = adam_step(1000)};
	s.groups = xcalloc((size_t)cores, sizeof *s.groups);
	s.handles = xcalloc((size_t)cores, sizeof *s.handles);
	double seconds = NAN;
	for (int g = 0; g < cores; g++) {
		if (subgroup_alloc(&s.groups[g], n, how)) {
			printf("%s skipped: allocation failed\n", what);
			goto free_groups;
		}
	}
	run_on_threads(cores, adam_fill_body, &s, 0);
	if (variant == BARE) {
		seconds = median_seconds_per_call(adam_bare_batch, &s, reps);
	} else {
		for (int g = 0; g < cores; g++)
			for (int b = 0; b < NBUFFERS; b++)
				starpu_vector_data_register(&s.handles[g][b], STARPU_MAIN_RAM,
							    (uintptr_t)s.groups[g].buf[b], n, elem_size[b]);
		seconds = median_seconds_per_call(adam_starpu_batch, &s, reps);
		for (int g = 0; g < cores; g++)
			for (int b = 0; b < NBUFFERS; b++)
				starpu_data_unregister(s.handles[g][b]);
	}
free_groups: /* subgroup_free() skips what was never allocated */
	for (int g = 0; g < cores; g++)
		subgroup_free(&s.groups[g], n, how);
	free(s.groups);
	free(s.handles);
	return (double)cores * (double)n / seconds;
}

static void print_rate_row(size_t n, const char *where, const char *variant, double rate, double reference_bw,
			   double other_rate)
{
	printf("%12zu %5s  %-7s %9.3f %9.2f %8.3f", n, where, variant, rate / 1e9, rate * ADAM_BYTES_PER_PARAM / 1e9,
	       rate * ADAM_BYTES_PER_PARAM / reference_bw);
	if (!isnan(other_rate))
		printf(" %11.3f", rate / other_rate);
	putchar('\n');
	fflush(stdout);
}

/* eager (one central queue, no performance model): nothing is calibrated inside a timed
 * batch, and with one subgroup per worker there is no placement decision to measure. */
static void start_starpu(int ncpus)
{
	struct starpu_conf conf;
	starpu_conf_init(&conf);
	/* The bench decides what it measures: STARPU_NCPU and friends do not change it. */
	conf.precedence_over_environment_variables = 1;
	conf.ncpus = ncpus;
	conf.ncuda = conf.nhip = conf.nopencl = conf.nmax_fpga = conf.nmpi_ms = 0;
	conf.sched_policy_name = "eager";
	conf.calibrate = 0;
	conf.bus_calibrate = 0;
	int err = starpu_init(&conf);
	char why[900];
	if (err)
		die("%d CPU workers: %s", ncpus, _dos_starpu_init_explained(err, "starpu_init", why, sizeof why));
	if (starpu_cpu_worker_get_count() != (unsigned)ncpus)
		die("starpu_init gave %u CPU workers, asked for %d (StarPU built with a smaller --enable-maxcpus?)",
		    starpu_cpu_worker_get_count(), ncpus);
	/* The bare variant's alignment, so that the comparison measures StarPU, not alignment. */
	starpu_malloc_set_align(64);
	printf("# StarPU: %d CPU worker%s, scheduler %s, no calibration\n", ncpus, ncpus > 1 ? "s" : "",
	       starpu_sched_ctx_get_sched_policy(0)->policy_name);
}

/* ---- GPU ---------------------------------------------------------------------------- */

/* Sets *copy_ratio to Adam vs copy bandwidth at the largest size measured, *at_size; leaves
 * them when the GPU part is skipped. */
static void run_gpu(const struct options *o, double *copy_ratio, size_t *at_size);

#ifdef DOS_USE_CUDA
#define CUDA_CHECK(call) cuda_check((call), #call)
static void cuda_check(cudaError_t err, const char *call)
{
	if (err != cudaSuccess)
		die("%s: %s", call, cudaGetErrorString(err));
}

/* Device work is timed with events on its stream, not by the host clock, which would add
 * launch latency and synchronisation. */
struct gpu_bench {
	cudaStream_t stream;
	cudaEvent_t start, stop;
	void *src, *dst; /* copy */
	size_t bytes;
	struct subgroup dev; /* adam */
	size_t n;
	struct dos_adam_step step;
	uint32_t *nonfinite; /* the update's non-finite flag, as training asks for it */
};

static double gpu_elapsed_since_start(struct gpu_bench *g)
{
	float ms;
	CUDA_CHECK(cudaEventRecord(g->stop, g->stream));
	CUDA_CHECK(cudaEventSynchronize(g->stop));
	CUDA_CHECK(cudaEventElapsedTime(&ms, g->start, g->stop));
	return ms * 1e-3;
}

static double gpu_copy_batch(void *ctx, long calls)
{
	struct gpu_bench *g = ctx;
	CUDA_CHECK(cudaEventRecord(g->start, g->stream));
	for (long c = 0; c < calls; c++)
		CUDA_CHECK(cudaMemcpyAsync(g->dst, g->src, g->bytes, cudaMemcpyDeviceToDevice, g->stream));
	return gpu_elapsed_since_start(g);
}

static double gpu_adam_batch(void *ctx, long calls)
{
	struct gpu_bench *g = ctx;
	void *const *b = g->dev.buf;
	CUDA_CHECK(cudaEventRecord(g->start, g->stream));
	for (long c = 0; c < calls; c++)
		CUDA_CHECK(_dos_adam_cuda(&g->step, b[MASTER], b[MOMENT1], b[MOMENT2], b[GRAD], DOS_FP16, b[WEIGHT16],
					  DOS_BF16, g->n, g->nonfinite, g->stream));
	return gpu_elapsed_since_start(g);
}

/* Repeats one host-filled chunk over the device buffers: the values only need to be plausible. */
static void gpu_subgroup_fill(struct subgroup *dev, size_t n)
{
	size_t chunk = n < GPU_FILL_CHUNK ? n : GPU_FILL_CHUNK;
	struct subgroup host;
	if (subgroup_alloc(&host, chunk, PLAIN_ALLOC))
		die("out of memory allocating a %zu-param staging subgroup", chunk);
	subgroup_fill(&host, chunk, 0x5eedull);
	for (size_t done = 0; done < n; done += chunk) {
		size_t len = n - done < chunk ? n - done : chunk;
		for (int b = 0; b < NBUFFERS; b++)
			CUDA_CHECK(cudaMemcpy((char *)dev->buf[b] + done * elem_size[b], host.buf[b],
					      len * elem_size[b], cudaMemcpyHostToDevice));
	}
	subgroup_free(&host, chunk, PLAIN_ALLOC);
}

static void run_gpu(const struct options *o, double *copy_ratio, size_t *at_size)
{
	int ndevices = 0;
	cudaError_t status = cudaGetDeviceCount(&ndevices);
	if (status != cudaSuccess || ndevices == 0) {
		printf("\n# GPU part skipped: no CUDA device (%s)\n",
		       status != cudaSuccess ? cudaGetErrorString(status) : "device count 0");
		return;
	}
	struct cudaDeviceProp prop;
	struct gpu_bench g = {0};
	size_t free_bytes, total_bytes;
	CUDA_CHECK(cudaSetDevice(0));
	CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
	CUDA_CHECK(cudaStreamCreate(&g.stream));
	CUDA_CHECK(cudaEventCreate(&g.start));
	CUDA_CHECK(cudaEventCreate(&g.stop));
	CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
	g.bytes = free_bytes / 4 < ((size_t)1 << 30) ? free_bytes / 4 : (size_t)1 << 30;
	CUDA_CHECK(cudaMalloc(&g.src, g.bytes));
	CUDA_CHECK(cudaMalloc(&g.dst, g.bytes));
	CUDA_CHECK(cudaMemset(g.src, 1, g.bytes));
	CUDA_CHECK(cudaMemset(g.dst, 0, g.bytes));
	double copy_bw = 2.0 * (double)g.bytes / median_seconds_per_call(gpu_copy_batch, &g, o->reps);
	CUDA_CHECK(cudaFree(g.src));
	CUDA_CHECK(cudaFree(g.dst));
	printf("\n# GPU 0: %s, %.1f GB; device-to-device copy of %zu MiB: %.1f GB/s counted as read + write\n",
	       prop.name, (double)total_bytes / 1e9, g.bytes >> 20, copy_bw / 1e9);
	printf("%12s %5s  %-7s %9s %9s %8s\n", "params", "where", "variant", "Gparam/s", "GB/s", "/copy");
	g.step = adam_step(1000);
	CUDA_CHECK(cudaMalloc((void **)&g.nonfinite, sizeof *g.nonfinite));
	for (int s = 0; s < o->nsizes; s++) {
		char what[64];
		g.n = o->sizes[s];
		snprintf(what, sizeof what, "%12zu %5s  %-7s", g.n, "gpu0", "cuda");
		CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
		if (too_big((double)g.n * FOOTPRINT_PER_PARAM, (double)free_bytes, what))
			continue;
		for (int b = 0; b < NBUFFERS; b++)
			CUDA_CHECK(cudaMalloc(&g.dev.buf[b], g.n * elem_size[b]));
		gpu_subgroup_fill(&g.dev, g.n);
		double rate = (double)g.n / median_seconds_per_call(gpu_adam_batch, &g, o->reps);
		print_rate_row(g.n, "gpu0", "cuda", rate, copy_bw, NAN);
		if (g.n >= *at_size) {
			*copy_ratio = rate * ADAM_BYTES_PER_PARAM / copy_bw;
			*at_size = g.n;
		}
		for (int b = 0; b < NBUFFERS; b++)
			CUDA_CHECK(cudaFree(g.dev.buf[b]));
	}
	CUDA_CHECK(cudaFree(g.nonfinite));
	CUDA_CHECK(cudaEventDestroy(g.start));
	CUDA_CHECK(cudaEventDestroy(g.stop));
	CUDA_CHECK(cudaStreamDestroy(g.stream));
}
#else
static void run_gpu(const struct options *o, double *copy_ratio, size_t *at_size)
{
	printf("\n# GPU part skipped: built without CUDA\n");
}
#endif

/* ---- Summary ------------------------------------------------------------------------ */

static void print_target(const char *what, double ratio, double target)
{
	printf("  %-58s %7.3f  >= %.2f  %s\n", what, ratio, target,
	       isnan(ratio)      ? "not measured"
	       : ratio >= target ? "met"
				 : "MISSED");
}

int main(int argc, char **argv)
{
	if (argc >= 2 && !strcmp(argv[1], "calibrate"))
		return bench_calibrate(argc, argv);
	if (argc >= 2 && !strcmp(argv[1], "host"))
		return bench_host(argc, argv);
	if (argc >= 2 && !strcmp(argv[1], "optimizer"))
		return bench_optimizer(argc, argv);
	if (argc >= 2 && !strcmp(argv[1], "gemm"))
		return bench_gemm(argc, argv);
	struct options o;
	parse_options(argc, argv, &o);
	long online = sysconf(_SC_NPROCESSORS_ONLN);
	int ncores = online > 0 ? (int)online : 1;
	int core_counts[2] = {1, ncores}, ncounts = ncores > 1 ? 2 : 1;
	double triad_bw[2];
	double rate[MAX_SIZES][2][NVARIANTS];

	print_context(ncores);
	measure_triad(core_counts, ncounts, o.reps, triad_bw);

	printf("\n# Adam/AdamW update: fp32 master/m/v, fp16 grad, bf16 weight16. GB/s counts %.0f B/param: read p,m,v "
	       "(12) + grad (2), write p,m,v (12) + weight16 (2)\n",
	       ADAM_BYTES_PER_PARAM);
	printf("# bare: one thread per core, each updating its own subgroup; starpu: one task per subgroup per step, "
	       "wait_for_all after each step\n");
	printf("# each value: median of %d batches of >= %.1f s; /triad: against the triad with the same cores\n",
	       o.reps, MIN_BATCH_SECONDS);
	for (int c = 0; c < ncounts; c++) {
		int cores = core_counts[c];
		char where[16];
		snprintf(where, sizeof where, "%d", cores);
		printf("%12s %5s  %-7s %9s %9s %8s %11s\n", "params", "cores", "variant", "Gparam/s", "GB/s", "/triad",
		       "starpu/bare");
		/* Bare first, without StarPU running: an idle StarPU keeps one worker spinning. */
		for (int s = 0; s < o.nsizes; s++) {
			rate[s][c][BARE] = measure_cpu_adam(BARE, cores, o.sizes[s], o.reps);
			if (!isnan(rate[s][c][BARE]))
				print_rate_row(o.sizes[s], where, "bare", rate[s][c][BARE], triad_bw[c], NAN);
		}
		start_starpu(cores);
		for (int s = 0; s < o.nsizes; s++) {
			rate[s][c][STARPU] = measure_cpu_adam(STARPU, cores, o.sizes[s], o.reps);
			if (!isnan(rate[s][c][STARPU]))
				print_rate_row(o.sizes[s], where, "starpu", rate[s][c][STARPU], triad_bw[c],
					       rate[s][c][BARE]);
		}
		starpu_shutdown();
	}

	double gpu_ratio = NAN;
	size_t gpu_size = 0;
	run_gpu(&o, &gpu_ratio, &gpu_size);

	/* The key ratios: the CPU kernel at its largest measured size on all cores, the worst
	 * StarPU overhead where it should vanish, and the GPU kernel at its largest size. */
	int all = ncounts - 1;
	double cpu_ratio = NAN, starpu_ratio = NAN;
	char cpu_what[96] = "CPU bare, all cores, largest size / triad", starpu_what[96] = "StarPU / bare, >= 1e7";
	char gpu_what[96] = "GPU / device copy, largest size";
	for (int s = 0, largest = -1; s < o.nsizes; s++) {
		if (!isnan(rate[s][all][BARE]) && (largest < 0 || o.sizes[s] > o.sizes[largest])) {
			largest = s;
			cpu_ratio = rate[s][all][BARE] * ADAM_BYTES_PER_PARAM / triad_bw[all];
			snprintf(cpu_what, sizeof cpu_what, "CPU bare, %d cores, %zu params / triad", ncores,
				 o.sizes[s]);
		}
		for (int c = 0; c < ncounts; c++) {
			double r = rate[s][c][STARPU] / rate[s][c][BARE];
			if (o.sizes[s] >= STARPU_TARGET_MIN_SIZE && !isnan(r) && !(r >= starpu_ratio)) {
				starpu_ratio = r;
				snprintf(starpu_what, sizeof starpu_what,
					 "StarPU / bare, >= 1e7, worst: %zu params, %d core%s", o.sizes[s],
					 core_counts[c], core_counts[c] > 1 ? "s" : "");
			}
		}
	}
	if (gpu_size)
		snprintf(gpu_what, sizeof gpu_what, "GPU / device copy, %zu params", gpu_size);
	printf("\n# Summary (targets are goals, not failures)\n");
	print_target(cpu_what, cpu_ratio, TARGET_CPU_VS_TRIAD);
	print_target(starpu_what, starpu_ratio, TARGET_STARPU_VS_BARE);
	print_target(gpu_what, gpu_ratio, TARGET_GPU_VS_COPY);
	return 0;
}
