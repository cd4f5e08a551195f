/* The CUDA kernels against the scalar CPU reference, bit for bit (any NaN equals any
 * NaN), on every output and dtype combination, odd sizes, unaligned starts (which take
 * the non-vectorised path) and awkward values; the update's non-finite bits equal the
 * CPU's. One size runs every grid-stride loop several times over the grid in force
 * (DOS_CUDA_MAX_BLOCKS), one more the statistics over several segments.
 * DOS_QUICK_CHECK=1 leaves out the two sizes past a thousand, which cost minutes under
 * the GPU simulator (with DOS_CUDA_MAX_BLOCKS=8 there, the grid-stride size is 16389).
 * Exits 77 (skipped) without a GPU. */
#include "config.h"
#include "test_util.h"

#ifndef DOS_USE_CUDA
int main(void)
{
	printf("built without CUDA: skipped\n");
	return TEST_SKIP;
}
#else
#include <cuda_runtime.h>

#include "cuda_grid.h"
#include "kernels.h"
#include "parity_util.h"

/* the last two only without DOS_QUICK_CHECK */
static const size_t sizes[] = {1, 7, 8, 15, 17, 100, 1003, 65536 * 3 + 1000, 1000003};
static const size_t quick_sizes = 7;
static const size_t offsets[] = {0, 1, 3};

/* A device copy of host[0 .. bytes) placed `offset_bytes` past a 256-byte boundary. */
static void *to_device(void **base, const void *host, size_t bytes, size_t offset_bytes)
{
	CUDA_OK(cudaMalloc(base, bytes + offset_bytes + 1));
	void *dev = (char *)*base + offset_bytes;
	CUDA_OK(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice));
	return dev;
}

static void *from_device(const void *dev, size_t bytes)
{
	void *host = test_malloc(bytes);
	CUDA_OK(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
	return host;
}

static const struct dos_adam_hparams hparam_sets[] = {
	{DOS_ADAMW, 1e-3, 0.9, 0.999, 1e-8, 0.01},
	{DOS_ADAM_L2, 1e-2, 0.9, 0.95, 1e-6, 0.1},
	{DOS_ADAMW, 0.1, 0.8, 0.99, 1e-8, 0.0},
	{DOS_ADAMW, 3e-4, 0.3, 0.5, 1e-8, 0.1},
};

static void check_adam(size_t n, size_t off, enum dos_dtype gt, enum dos_dtype wt, int with_weight, uint64_t seed)
{
	size_t gs = dos_dtype_size(gt), ws = dos_dtype_size(wt);
	float *p = test_malloc(n * 4), *m = test_malloc(n * 4), *v = test_malloc(n * 4);
	void *g = test_malloc(n * gs), *w = test_malloc(n * ws);
	uint64_t rng = seed;
	for (size_t i = 0; i < n; i++) {
		p[i] = value_mix(&rng, 0);
		m[i] = value_mix(&rng, 0);
		v[i] = fabsf(value_mix(&rng, 0));
		dos_store_elem(g, i, gt, value_mix(&rng, 1));
	}
	memset(w, 0, n * ws);
	void *bases[5];
	float *dp = to_device(&bases[0], p, n * 4, off * 4), *dm = to_device(&bases[1], m, n * 4, off * 4),
	      *dv = to_device(&bases[2], v, n * 4, off * 4);
	void *dg = to_device(&bases[3], g, n * gs, off * gs), *dw = to_device(&bases[4], w, n * ws, off * ws);
	uint32_t *dflag;
	CUDA_OK(cudaMalloc((void **)&dflag, sizeof *dflag));
	for (size_t h = 0; h < sizeof hparam_sets / sizeof hparam_sets[0]; h++)
		for (uint64_t t = 1; t <= 2; t++) {
			struct dos_adam_step s;
			CHECK(dos_adam_step_init(&s, &hparam_sets[h], t + 10 * h, h == 1 ? 1.0 / 1024 : 1.0) == 0, "%s",
			      dos_last_error());
			uint32_t cpu_nonfinite =
				_dos_cpu_kernels_scalar.adam(&s, p, m, v, g, gt, with_weight ? w : NULL, wt, n);
			CUDA_OK(cudaMemset(dflag, 0xff, sizeof *dflag)); /* stale: the kernel must clear it */
			CUDA_OK(_dos_adam_cuda(&s, dp, dm, dv, dg, gt, with_weight ? dw : NULL, wt, n, dflag, 0));
			CUDA_OK(cudaDeviceSynchronize());
			uint32_t gpu_nonfinite;
			CUDA_OK(cudaMemcpy(&gpu_nonfinite, dflag, sizeof gpu_nonfinite, cudaMemcpyDeviceToHost));
			float *rp = from_device(dp, n * 4), *rm = from_device(dm, n * 4), *rv = from_device(dv, n * 4);
			void *rw = from_device(dw, n * ws);
			char ctx[160];
			snprintf(ctx, sizeof ctx, "cuda adam n=%zu offset=%zu grad=%s weight=%s hparams=%zu step=%llu",
				 n, off, dos_dtype_name(gt), with_weight ? dos_dtype_name(wt) : "none", h,
				 (unsigned long long)t);
			compare_f32("master", p, rp, n, ctx);
			compare_f32("m", m, rm, n, ctx);
			compare_f32("v", v, rv, n, ctx);
			if (with_weight)
				compare_elems("weight16", w, rw, wt, n, ctx);
			CHECK(gpu_nonfinite == cpu_nonfinite, "%s: non-finite bits %#x on the GPU, %#x on the CPU", ctx,
			      gpu_nonfinite, cpu_nonfinite);
			free(rp), free(rm), free(rv), free(rw);
		}
	CUDA_OK(cudaFree(dflag));
	for (int k = 0; k < 5; k++)
		CUDA_OK(cudaFree(bases[k]));
	free(p), free(m), free(v), free(g), free(w);
}

/* The statistics of the n gradients g (host) and dg (device). */
static void check_grad_stats(const void *g, const void *dg, enum dos_dtype t, size_t n, const char *ctx)
{
	struct dos_grad_stats ref, *dstats, got;
	_dos_cpu_kernels_scalar.grad_stats(g, t, n, &ref);
	CUDA_OK(cudaMalloc((void **)&dstats, sizeof *dstats));
	CUDA_OK(_dos_grad_stats_cuda(dg, t, n, dstats, 0));
	CUDA_OK(cudaMemcpy(&got, dstats, sizeof got, cudaMemcpyDeviceToHost));
	CHECK(memcmp(&ref.sum_sq, &got.sum_sq, 8) == 0 || (isnan(ref.sum_sq) && isnan(got.sum_sq)),
	      "%s: grad_stats %a vs %a", ctx, ref.sum_sq, got.sum_sq);
	CHECK(ref.nonfinite == got.nonfinite, "%s: nonfinite %u vs %u", ctx, ref.nonfinite, got.nonfinite);
	CUDA_OK(cudaFree(dstats));
}

/* The statistics alone, of finite values (a sum that stays finite), over several segments. */
static void check_stats_segments(size_t n, size_t off, enum dos_dtype t, uint64_t seed)
{
	size_t es = dos_dtype_size(t);
	void *g = test_malloc(n * es), *base;
	uint64_t rng = seed;
	for (size_t i = 0; i < n; i++)
		dos_store_elem(g, i, t, value_mix(&rng, 0));
	void *dg = to_device(&base, g, n * es, off * es);
	char ctx[128];
	snprintf(ctx, sizeof ctx, "cuda n=%zu (%zu segments) offset=%zu dtype=%s", n,
		 (n + DOS_STATS_SEGMENT - 1) / DOS_STATS_SEGMENT, off, dos_dtype_name(t));
	check_grad_stats(g, dg, t, n, ctx);
	CUDA_OK(cudaFree(base));
	free(g);
}

static void check_companions(size_t n, size_t off, enum dos_dtype t, uint64_t seed)
{
	size_t es = dos_dtype_size(t);
	float *master = test_malloc(n * 4);
	void *g = test_malloc(n * es), *w = test_malloc(n * 2);
	uint64_t rng = seed;
	for (size_t i = 0; i < n; i++) {
		master[i] = value_mix(&rng, 1);
		dos_store_elem(g, i, t, value_mix(&rng, 1));
	}
	char ctx[128];
	snprintf(ctx, sizeof ctx, "cuda n=%zu offset=%zu dtype=%s", n, off, dos_dtype_name(t));
	void *bases[3];
	float *dmaster = to_device(&bases[0], master, n * 4, off * 4);
	void *dg = to_device(&bases[1], g, n * es, off * es);
	void *dw = to_device(&bases[2], w, n * 2, off * 2);

	if (t != DOS_FP32) {
		_dos_cpu_kernels_scalar.cast(master, w, t, n);
		CUDA_OK(_dos_cast_cuda(dmaster, dw, t, n, 0));
		CUDA_OK(cudaDeviceSynchronize());
		void *rw = from_device(dw, n * 2);
		compare_elems("cast", w, rw, t, n, ctx);
		free(rw);
	}

	check_grad_stats(g, dg, t, n, ctx);

	static const float factors[] = {0.37f, 1.0f / 1024, 3e4f, 0.0f};
	for (int f = 0; f < 4; f++) {
		_dos_cpu_kernels_scalar.grad_scale(g, t, n, factors[f]);
		CUDA_OK(_dos_grad_scale_cuda(dg, t, n, factors[f], 0));
		CUDA_OK(cudaDeviceSynchronize());
		void *rg = from_device(dg, n * es);
		compare_elems("grad_scale", g, rg, t, n, ctx);
		free(rg);
	}
	for (int k = 0; k < 3; k++)
		CUDA_OK(cudaFree(bases[k]));
	free(master), free(g), free(w);
}

int main(void)
{
	int devices = 0;
	if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
		printf("no CUDA device: skipped\n");
		return TEST_SKIP;
	}
	struct cudaDeviceProp prop;
	CUDA_OK(cudaGetDeviceProperties(&prop, 0));
	const size_t nsizes = test_quick() ? quick_sizes : sizeof sizes / sizeof sizes[0];
	/* Past what one pass of the kernels' grids covers (max_blocks blocks of 256 threads, 4
	 * elements a thread in the aligned update): every grid-stride loop runs several times.
	 * The sizes above fit in one pass of the default grid. */
	const size_t max_blocks = _dos_cuda_max_blocks();
	const size_t large_size = 2 * max_blocks * 256 * 4 + 5;
	/* grad_stats: one block per segment, whatever the cap; more than two segments */
	const size_t stats_size = 2 * DOS_STATS_SEGMENT + 5;
	for (size_t si = 0; si < nsizes; si++)
		for (size_t oi = 0; oi < sizeof offsets / sizeof offsets[0]; oi++)
			for (int gt = DOS_FP32; gt <= DOS_BF16; gt++) {
				size_t n = sizes[si], off = offsets[oi];
				uint64_t seed = 0xc0ffeeULL + n * 31 + off * 7 + (uint64_t)gt;
				check_companions(n, off, (enum dos_dtype)gt, seed);
				check_adam(n, off, (enum dos_dtype)gt, DOS_FP16, 0, seed);
				for (int wt = DOS_FP16; wt <= DOS_BF16; wt++)
					check_adam(n, off, (enum dos_dtype)gt, (enum dos_dtype)wt, 1,
						   seed + (uint64_t)wt);
			}
	for (size_t off = 0; off <= 1; off++) { /* aligned (vec4) and unaligned (scalar) paths */
		check_companions(large_size, off, DOS_FP16, 0x1a53ULL + off);
		check_adam(large_size, off, DOS_FP16, DOS_BF16, 1, 0x1a53ULL + off);
	}
	for (int t = DOS_FP32; t <= DOS_BF16; t++)
		check_stats_segments(stats_size, 1, (enum dos_dtype)t, 0x5e65ULL + (uint64_t)t);
	printf("CUDA (%s) == scalar on every output: %zu sizes up to %zu x %zu offsets x 3 grad dtypes x 3 weight "
	       "kinds; %zu elements (fp16 grad, bf16 weight) at 2 offsets, past 2 passes of the grid (%zu blocks); "
	       "grad_stats over %zu elements in 3 dtypes\n",
	       prop.name, nsizes, sizes[nsizes - 1], sizeof offsets / sizeof offsets[0], large_size, max_blocks,
	       stats_size);
	return 0;
}
#endif
