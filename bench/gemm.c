/* dos-bench gemm: the matrix-product rate this machine offers the model, measured the
 * way the model's kernels multiply (codelets/model_cpu.c, codelets/model_cuda.cu), so
 * that dos-train's forward and backward rate can be read as a share of it:
 *  - CPU: one thread of OpenBLAS sgemm (each StarPU CPU worker runs OpenBLAS on one
 *    thread);
 *  - GPU: cublasGemmEx with fp32, bf16 and fp16 inputs and outputs, accumulating in
 *    fp32 (CUBLAS_COMPUTE_32F), as the model computes in each precision.
 * Square products of n x n, each rate the median of --reps timed runs after a warm-up. */
#include "config.h"

#include <cblas.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#ifdef DOS_USE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>
#endif

#ifdef HAVE_OPENBLAS_SET_NUM_THREADS
void openblas_set_num_threads(int num_threads);
#endif

#define MAX_REPS 50

static const char usage[] = "usage: dos-bench gemm [--cpu-size N] [--gpu-size N] [--reps R]\n"
			    "  CPU (one OpenBLAS thread, fp32) and, with a GPU, cuBLAS (fp32, bf16, fp16 in and out,\n"
			    "  fp32 accumulation) products of N x N matrices; defaults 1024, 8192, 5\n";

static void gemm_usage_error(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	bench_vreport("dos-bench gemm", 2, usage, fmt, ap);
	va_end(ap);
	exit(2);
}

static int parse_count(const char *name, const char *text, double lo, double hi)
{
	double v;
	if (!text || bench_parse_count(text, lo, hi, &v))
		gemm_usage_error("%s %s: expected a whole number in [%.0f, %.0f]", name, text ? text : "(missing)", lo,
				 hi);
	return (int)v;
}

static double cpu_sgemm_gflops(int n, int reps)
{
	size_t count = (size_t)n * n;
	float *a = malloc(count * sizeof *a), *b = malloc(count * sizeof *b), *c = malloc(count * sizeof *c);
	if (!a || !b || !c) {
		free(a);
		free(b);
		free(c);
		return -1;
	}
	for (size_t i = 0; i < count; i++) {
		a[i] = (float)((i * 7) % 13) / 13.0f;
		b[i] = (float)((i * 5) % 11) / 11.0f;
	}
#ifdef HAVE_OPENBLAS_SET_NUM_THREADS
	openblas_set_num_threads(1);
#endif
	double rate[MAX_REPS];
	for (int r = -1; r < reps; r++) { /* r = -1: warm-up */
		double t0 = bench_now_seconds();
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
		double t = bench_now_seconds() - t0;
		if (r >= 0)
			rate[r] = 2.0 * n * n * (double)n / t * 1e-9;
	}
	free(a);
	free(b);
	free(c);
	return bench_median(rate, reps);
}

#ifdef DOS_USE_CUDA
/* TFLOP/s of cublasGemmEx on n x n operands of `type`, or a negative value when the GPU
 * refused (the reason printed). */
static double gpu_gemm_tflops(cublasHandle_t blas, int n, cudaDataType_t type, size_t elem, int reps)
{
	size_t bytes = (size_t)n * n * elem;
	void *a = NULL, *b = NULL, *c = NULL;
	cudaEvent_t start = NULL, stop = NULL;
	double result = -1;
	if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess ||
	    cudaMalloc(&c, bytes) != cudaSuccess) {
		fprintf(stderr, "dos-bench gemm: cannot allocate 3 x %zu bytes on the GPU\n", bytes);
		goto out;
	}
	/* zeros: the rate of a dense product does not depend on the values */
	cudaMemset(a, 0, bytes);
	cudaMemset(b, 0, bytes);
	cudaEventCreate(&start);
	cudaEventCreate(&stop);
	const float one = 1.0f, zero = 0.0f;
	double rate[MAX_REPS];
	for (int r = -1; r < reps; r++) {
		cudaEventRecord(start, 0);
		cublasStatus_t st = cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, type, n, b, type, n,
						 &zero, c, type, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
		cudaEventRecord(stop, 0);
		if (st != CUBLAS_STATUS_SUCCESS || cudaEventSynchronize(stop) != cudaSuccess) {
			fprintf(stderr, "dos-bench gemm: cublasGemmEx failed (status %d)\n", (int)st);
			goto out;
		}
		float ms;
		cudaEventElapsedTime(&ms, start, stop);
		if (r >= 0)
			rate[r] = 2.0 * n * n * (double)n / (ms * 1e-3) * 1e-12;
	}
	result = bench_median(rate, reps);
out:
	if (start)
		cudaEventDestroy(start);
	if (stop)
		cudaEventDestroy(stop);
	cudaFree(a);
	cudaFree(b);
	cudaFree(c);
	return result;
}
#endif

int bench_gemm(int argc, char **argv)
{
	int cpu_n = 1024, gpu_n = 8192, reps = 5;
	for (int i = 2; i < argc; i++) {
		if (!strcmp(argv[i], "--cpu-size"))
			cpu_n = parse_count("--cpu-size", i + 1 < argc ? argv[++i] : NULL, 16, 16384);
		else if (!strcmp(argv[i], "--gpu-size"))
			gpu_n = parse_count("--gpu-size", i + 1 < argc ? argv[++i] : NULL, 16, 65536);
		else if (!strcmp(argv[i], "--reps"))
			reps = parse_count("--reps", i + 1 < argc ? argv[++i] : NULL, 3, MAX_REPS);
		else
			gemm_usage_error("unknown option '%s'", argv[i]);
	}
	printf("# matrix products, n x n, median of %d runs\n", reps);
	double cpu = cpu_sgemm_gflops(cpu_n, reps);
	if (cpu < 0) {
		fprintf(stderr, "dos-bench gemm: cannot allocate three %d x %d fp32 matrices\n", cpu_n, cpu_n);
		return 1;
	}
	printf("gemm cpu fp32 n=%d: %.1f GFLOP/s (one OpenBLAS thread)\n", cpu_n, cpu);
#ifdef DOS_USE_CUDA
	int devices = 0;
	if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
		printf("gemm gpu: no CUDA device\n");
		return 0;
	}
	cublasHandle_t blas;
	if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) {
		fprintf(stderr, "dos-bench gemm: cublasCreate failed\n");
		return 1;
	}
	const struct {
		const char *name;
		cudaDataType_t type;
		size_t elem;
	} types[] = {{"fp32", CUDA_R_32F, 4}, {"bf16", CUDA_R_16BF, 2}, {"fp16", CUDA_R_16F, 2}};
	int status = 0;
	for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
		double tflops = gpu_gemm_tflops(blas, gpu_n, types[t].type, types[t].elem, reps);
		if (tflops < 0)
			status = 1;
		else
			printf("gemm gpu %s n=%d: %.1f TFLOP/s (cublasGemmEx, fp32 accumulation)\n", types[t].name,
			       gpu_n, tflops);
	}
	cublasDestroy(blas);
	return status;
#else
	(void)gpu_n;
	printf("gemm gpu: not built with CUDA\n");
	return 0;
#endif
}
