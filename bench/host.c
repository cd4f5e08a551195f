/* dos-bench host: measures what the dos policy's cost model needs of this host beyond
 * StarPU's models, and records it (host_measurements.c):
 *  - the Adam rate of all CPU cores together: the cores share memory bandwidth, so n
 *    workers do not go n times as fast as one;
 *  - with a GPU, how much slower CPU Adam runs while the GPU's copy engines stream
 *    through host memory both ways (DMA, which no CPU loop imitates: a CPU memcpy would
 *    also take the cores Adam needs). */
#include "config.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <starpu.h>

#include "bench.h"
#include "dos.h"
#include "errors.h"
#include "kernels.h"
#include "numerics.h"

#ifdef DOS_USE_CUDA
#include <cuda_runtime.h>
#endif

#define SUBGROUP_PARAMS 10000000 /* per CPU thread: far beyond the caches */
#define DMA_BYTES (256u << 20)   /* per direction, pinned */
#define PHASE_SECONDS 1.0
#define ROUNDS 3

struct cpu_worker {
	pthread_t thread;
	float *p, *m, *v;
	uint16_t *g, *w;
	atomic_int *stop;
	double params_done;
};

static void *cpu_worker_main(void *arg)
{
	struct cpu_worker *c = arg;
	struct dos_adam_hparams hp = {DOS_ADAMW, 1e-4, 0.9, 0.999, 1e-8, 0.01};
	struct dos_adam_step step;
	c->params_done = 0;
	for (uint64_t t = 1; !atomic_load(c->stop); t++) {
		dos_adam_step_init(&step, &hp, t, 1.0);
		_dos_cpu_kernels_selected()->adam(&step, c->p, c->m, c->v, c->g, DOS_FP16, c->w, DOS_BF16,
						  SUBGROUP_PARAMS);
		c->params_done += SUBGROUP_PARAMS;
	}
	return NULL;
}

static int worker_alloc(struct cpu_worker *w)
{
	w->p = calloc(SUBGROUP_PARAMS, 4), w->m = calloc(SUBGROUP_PARAMS, 4);
	w->v = malloc((size_t)SUBGROUP_PARAMS * 4);
	w->g = malloc((size_t)SUBGROUP_PARAMS * 2), w->w = malloc((size_t)SUBGROUP_PARAMS * 2);
	if (!(w->p && w->m && w->v && w->g && w->w))
		return -1;
	for (size_t k = 0; k < SUBGROUP_PARAMS; k++) {
		w->v[k] = 1e-6f; /* no zero division shortcuts, no subnormals */
		w->g[k] = dos_float_to_fp16(1e-3f * (float)((k % 7) + 1));
	}
	return 0;
}

static void worker_free(struct cpu_worker *w)
{
	free(w->p), free(w->m), free(w->v), free(w->g), free(w->w);
}

/* Something that runs beside the CPU threads during a phase (the DMA streams). */
struct companion {
	void *(*main)(void *);
	void *arg;
	atomic_int **stop;
};

/* CPU Adam params/s over `n` threads for one phase, with `beside` running if not NULL. */
static double run_phase(struct cpu_worker *w, int n, const struct companion *beside, double *elapsed_out)
{
	atomic_int stop = 0;
	pthread_t companion_thread;
	for (int i = 0; i < n; i++) {
		w[i].stop = &stop;
		pthread_create(&w[i].thread, NULL, cpu_worker_main, &w[i]);
	}
	if (beside) {
		*beside->stop = &stop;
		pthread_create(&companion_thread, NULL, beside->main, beside->arg);
	}
	double start = bench_now_seconds();
	usleep((useconds_t)(PHASE_SECONDS * 1e6));
	atomic_store(&stop, 1);
	double params = 0;
	for (int i = 0; i < n; i++) {
		pthread_join(w[i].thread, NULL);
		params += w[i].params_done;
	}
	if (beside)
		pthread_join(companion_thread, NULL);
	*elapsed_out = bench_now_seconds() - start;
	return params / *elapsed_out;
}

#ifdef DOS_USE_CUDA
struct dma {
	void *host_in, *host_out, *dev_in, *dev_out;
	cudaStream_t up, down;
	atomic_int *stop;
	double bytes;
	int failed;
};

/* Both directions at once, each kept busy until told to stop. */
static void *dma_main(void *arg)
{
	struct dma *d = arg;
	d->bytes = 0;
	while (!atomic_load(d->stop)) {
		if (cudaMemcpyAsync(d->dev_in, d->host_in, DMA_BYTES, cudaMemcpyHostToDevice, d->up) != cudaSuccess ||
		    cudaMemcpyAsync(d->host_out, d->dev_out, DMA_BYTES, cudaMemcpyDeviceToHost, d->down) !=
			    cudaSuccess ||
		    cudaStreamSynchronize(d->up) != cudaSuccess || cudaStreamSynchronize(d->down) != cudaSuccess) {
			d->failed = 1;
			return NULL;
		}
		d->bytes += 2.0 * DMA_BYTES;
	}
	return NULL;
}

/* The contention factor (median of ROUNDS), 0 when there is no GPU, negative on failure.
 * One core is left to the thread that drives the copies. */
static double measure_contention(struct cpu_worker *w, int online)
{
	int devices = 0;
	if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
		return 0;
	int n = online > 1 ? online - 1 : 1;
	struct dma d = {0};
	struct companion beside = {dma_main, &d, &d.stop};
	double factors[ROUNDS], elapsed, result = -1;
	if (cudaHostAlloc(&d.host_in, DMA_BYTES, cudaHostAllocDefault) == cudaSuccess &&
	    cudaHostAlloc(&d.host_out, DMA_BYTES, cudaHostAllocDefault) == cudaSuccess &&
	    cudaMalloc(&d.dev_in, DMA_BYTES) == cudaSuccess && cudaMalloc(&d.dev_out, DMA_BYTES) == cudaSuccess &&
	    cudaStreamCreate(&d.up) == cudaSuccess && cudaStreamCreate(&d.down) == cudaSuccess) {
		for (int r = 0; r < ROUNDS && !d.failed; r++) {
			double alone = run_phase(w, n, NULL, &elapsed);
			double shared = run_phase(w, n, &beside, &elapsed);
			factors[r] = alone / shared;
			printf("contention round %d (%d threads): alone %.3f G params/s, with DMA %.3f G params/s (DMA "
			       "%.1f GB/s both ways): factor %.3f\n",
			       r + 1, n, alone * 1e-9, shared * 1e-9, d.bytes / elapsed * 1e-9, factors[r]);
		}
		if (!d.failed) {
			result = fmax(1.0, bench_median(factors, ROUNDS));
		}
	}
	if (result < 0)
		fprintf(stderr, "dos-bench host: error: a CUDA allocation or copy failed\n");
	cudaFreeHost(d.host_in), cudaFreeHost(d.host_out), cudaFree(d.dev_in), cudaFree(d.dev_out);
	return result;
}
#else
static double measure_contention(struct cpu_worker *w, int online)
{
	(void)w;
	(void)online;
	return 0; /* built without CUDA: no DMA engine to measure against */
}
#endif

int bench_host(int argc, char **argv)
{
	if (argc > 2) {
		fprintf(stderr, "dos-bench host: unexpected argument '%s'\nusage: dos-bench host\n", argv[2]);
		return 2;
	}
	long online_cores = sysconf(_SC_NPROCESSORS_ONLN);
	int online = online_cores > 0 ? (int)online_cores : 1;
	struct cpu_worker *w = calloc((size_t)online, sizeof *w);
	int ok = w != NULL;
	for (int i = 0; ok && i < online; i++)
		ok = worker_alloc(&w[i]) == 0;
	if (!ok) {
		fprintf(stderr, "dos-bench host: error: cannot allocate %d x %d params of Adam state\n", online,
			SUBGROUP_PARAMS);
		for (int i = 0; w && i < online; i++)
			worker_free(&w[i]);
		free(w);
		return 1;
	}
	printf("# CPU Adam, %d params per thread, %s kernels, fp16 grad, bf16 weight; %.1f s phases, median of %d\n",
	       SUBGROUP_PARAMS, dos_cpu_isa_name(dos_cpu_isa_selected()), PHASE_SECONDS, ROUNDS);
	double rates[ROUNDS], elapsed;
	run_phase(w, online, NULL, &elapsed); /* first touch of every page: not measured */
	for (int r = 0; r < ROUNDS; r++) {
		rates[r] = run_phase(w, online, NULL, &elapsed);
		printf("all %d cores, round %d: %.3f G params/s\n", online, r + 1, rates[r] * 1e-9);
	}
	double rate = bench_median(rates, ROUNDS);
	double factor = measure_contention(w, online);
	for (int i = 0; i < online; i++)
		worker_free(&w[i]);
	free(w);
	if (factor < 0)
		return 1;
	if (factor == 0)
		printf("no CUDA device (or built without CUDA): contention not measured\n");

	int err = starpu_init(NULL);
	if (err) {
		char why[900];
		fprintf(stderr, "dos-bench host: error: %s\n",
			_dos_starpu_init_explained(err, "starpu_init", why, sizeof why));
		return 1;
	}
	err = dos_host_cpu_rate_record(rate);
	if (!err && factor > 0)
		err = dos_host_contention_record(factor);
	starpu_shutdown();
	printf("recorded for this host: CPU Adam rate %.3f G params/s (all %d cores)", rate * 1e-9, online);
	if (factor > 0)
		printf(", contention factor %.3f", factor);
	printf("%s\n", err ? " FAILED" : "");
	return err ? 1 : 0;
}
