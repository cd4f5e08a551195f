/* dos-bench contention: how much slower CPU Adam runs while DMA streams through host
 * memory in both directions at full speed, as it does while the GPU side of a dos plan
 * runs. The ratio is recorded for this host (dos_host_contention_record), where the dos
 * policy's cost model finds it. Needs a GPU: the DMA is the GPU's copy engines, which no
 * CPU loop imitates (a CPU memcpy would also take the cores Adam needs). */
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
#include "kernels.h"
#include "numerics.h"

#ifndef DOS_USE_CUDA
int bench_contention(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	printf("dos-bench contention: built without CUDA: no DMA engine to measure against; nothing recorded\n");
	return 0;
}
#else
#include <cuda_runtime.h>

#define SUBGROUP_PARAMS 10000000 /* per CPU thread: far beyond the caches */
#define DMA_BYTES (256u << 20)   /* per direction, pinned */
#define PHASE_SECONDS 1.0
#define ROUNDS 3

static double now_seconds(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

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

struct dma {
	pthread_t thread;
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

/* CPU Adam params/s over all `n` threads for one phase, with or without DMA. */
static double run_phase(struct cpu_worker *w, int n, struct dma *d, int with_dma, double *dma_bytes_per_s)
{
	atomic_int stop = 0;
	for (int i = 0; i < n; i++) {
		w[i].stop = &stop;
		pthread_create(&w[i].thread, NULL, cpu_worker_main, &w[i]);
	}
	d->stop = &stop;
	if (with_dma)
		pthread_create(&d->thread, NULL, dma_main, d);
	double start = now_seconds();
	usleep((useconds_t)(PHASE_SECONDS * 1e6));
	atomic_store(&stop, 1);
	double params = 0;
	for (int i = 0; i < n; i++) {
		pthread_join(w[i].thread, NULL);
		params += w[i].params_done;
	}
	double elapsed = now_seconds() - start;
	if (with_dma) {
		pthread_join(d->thread, NULL);
		*dma_bytes_per_s = d->bytes / elapsed;
	}
	return params / elapsed;
}

static int compare_doubles(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int bench_contention(int argc, char **argv)
{
	if (argc > 2) {
		fprintf(stderr, "dos-bench contention: unexpected argument '%s'\nusage: dos-bench contention\n",
			argv[2]);
		return 2;
	}
	int devices = 0;
	if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
		printf("dos-bench contention: no CUDA device: nothing measured, nothing recorded\n");
		return 0;
	}
	/* one core is left to the thread that drives the copies */
	long online = sysconf(_SC_NPROCESSORS_ONLN);
	int n = online > 1 ? (int)online - 1 : 1;
	struct cpu_worker *w = calloc((size_t)n, sizeof *w);
	struct dma d = {0};
	int ok = w != NULL;
	for (int i = 0; ok && i < n; i++) {
		w[i].p = calloc(SUBGROUP_PARAMS, 4), w[i].m = calloc(SUBGROUP_PARAMS, 4);
		w[i].v = malloc((size_t)SUBGROUP_PARAMS * 4);
		w[i].g = malloc((size_t)SUBGROUP_PARAMS * 2), w[i].w = malloc((size_t)SUBGROUP_PARAMS * 2);
		ok = w[i].p && w[i].m && w[i].v && w[i].g && w[i].w;
		for (size_t k = 0; ok && k < SUBGROUP_PARAMS; k++) {
			w[i].v[k] = 1e-6f;
			w[i].g[k] = dos_float_to_fp16(1e-3f * (float)((k % 7) + 1));
		}
	}
	ok = ok && cudaHostAlloc(&d.host_in, DMA_BYTES, cudaHostAllocDefault) == cudaSuccess &&
	     cudaHostAlloc(&d.host_out, DMA_BYTES, cudaHostAllocDefault) == cudaSuccess &&
	     cudaMalloc(&d.dev_in, DMA_BYTES) == cudaSuccess && cudaMalloc(&d.dev_out, DMA_BYTES) == cudaSuccess &&
	     cudaStreamCreate(&d.up) == cudaSuccess && cudaStreamCreate(&d.down) == cudaSuccess;
	int status = 1;
	if (!ok) {
		fprintf(stderr, "dos-bench contention: error: cannot allocate the buffers\n");
	} else {
		double factors[ROUNDS], dma_rate = 0, unused;
		printf("# CPU Adam (%d threads x %d params, %s kernels) alone and with DMA both ways (2 x %u MiB "
		       "pinned), %.1f s each, %d rounds\n",
		       n, SUBGROUP_PARAMS, dos_cpu_isa_name(dos_cpu_isa_selected()), DMA_BYTES >> 20, PHASE_SECONDS,
		       ROUNDS);
		for (int r = 0; r < ROUNDS && !d.failed; r++) {
			double alone = run_phase(w, n, &d, 0, &unused);
			double shared = run_phase(w, n, &d, 1, &dma_rate);
			factors[r] = alone / shared;
			printf("round %d: alone %.3f G params/s, with DMA %.3f G params/s (DMA %.1f GB/s both ways): "
			       "factor %.3f\n",
			       r + 1, alone * 1e-9, shared * 1e-9, dma_rate * 1e-9, factors[r]);
		}
		if (d.failed) {
			fprintf(stderr, "dos-bench contention: error: a CUDA copy failed\n");
		} else {
			qsort(factors, ROUNDS, sizeof factors[0], compare_doubles);
			double factor = fmax(1.0, factors[ROUNDS / 2]);
			if (starpu_init(NULL) == 0) {
				int err = dos_host_contention_record(factor);
				starpu_shutdown();
				printf("host contention factor (median): %.3f %s\n", factor,
				       err ? "NOT recorded" : "recorded for this host");
				status = err ? 1 : 0;
			}
		}
	}
	cudaFreeHost(d.host_in), cudaFreeHost(d.host_out), cudaFree(d.dev_in), cudaFree(d.dev_out);
	for (int i = 0; w && i < n; i++)
		free(w[i].p), free(w[i].m), free(w[i].v), free(w[i].g), free(w[i].w);
	free(w);
	return status;
}
#endif
