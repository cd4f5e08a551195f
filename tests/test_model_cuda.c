/* The CUDA kernels of the example model (codelets/model_cuda.cu) against the CPU ones
 * (codelets/model_cpu.c) on the same random inputs, over several shapes (odd sizes, T up to
 * 64, accumulate and overwrite modes). Three levels of agreement:
 *  - bitwise: kernels whose CPU and GPU loops evaluate the same float expressions in the
 *    same order without a transcendental function (embedding, RMSNorm);
 *  - a few ulps, or a tiny fraction of the output's largest magnitude where a difference
 *    feeds a cancellation: the same order, but CUDA's expf/erff/logf are not glibc's
 *    (GELU, cross-entropy);
 *  - relative 1e-5 of the largest magnitude: cuBLAS against OpenBLAS products (linear
 *    layers, attention).
 * The 16-bit path (bf16 and fp16: 16-bit inputs rounded once, fp32 arithmetic inside, each
 * output rounded once; cublasGemmEx with fp32 accumulation) is checked the same way, GPU
 * against the CPU's 16-bit kernels on the same 16-bit inputs:
 *  - bitwise where the fp32 path is bitwise (the same float results round the same way);
 *  - one 16-bit ulp for GELU and cross-entropy (fp32 results a few ulps apart may round to
 *    neighbouring 16-bit values);
 *  - products: 2u of the largest magnitude (u = 2^-8 bf16, 2^-11 fp16), each side rounding
 *    once a differently ordered fp32 sum; attention 4u (it also rounds the probabilities,
 *    and dS in backward, before its products); the fp32 weight gradients of 16-bit inputs
 *    1e-5 as in fp32 (exact products, fp32 sums in different orders).
 * Every mismatch is reported with the kernel, shape, output, index and both values; the
 * test goes on through every kernel and fails at the end. Exits 77 (skipped) without a
 * usable GPU. DOS_TEST_NO_CUBLAS=1 leaves out the kernels that need cuBLAS (linear layers,
 * attention), and says so: the GPU simulator runs the others (tests/gpusim_lane.sh). */
#include "config.h"
#include "test_util.h"

#ifndef DOS_USE_CUDA
int main(void)
{
	printf("built without CUDA: skipped\n");
	return TEST_SKIP;
}
#else
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "model_kernels.h"
#include "numerics.h"

#define BLAS_OK(call)                                                                                         \
	do {                                                                                                  \
		cublasStatus_t s_ = (call);                                                                   \
		CHECK(s_ == CUBLAS_STATUS_SUCCESS, "%s: %s (%d)", #call, cublasGetStatusString(s_), (int)s_); \
	} while (0)

static cudaStream_t stream;
static cublasHandle_t blas; /* NULL under DOS_TEST_NO_CUBLAS=1 */

/* ---- tolerances and per-kernel statistics ---------------------------------------------- */

/* An element passes when its bits equal the CPU's (any NaN equals any NaN), or it is at
 * most `ulp` ulps away, or |cuda - cpu| <= rel * scale, where scale is the largest finite
 * |cpu| of the compared output or, when larger, a floor given by the caller: the magnitude
 * the rounding errors scale with when the output itself can be much smaller (a loss that
 * is a difference of logits, probabilities that are all small). */
struct tol {
	uint32_t ulp;
	double rel;
	const char *name;
};
static const struct tol bitwise = {0, 0.0, "bitwise"};
static const struct tol transcendental = {4, 1e-6, "<= 4 ulp or 1e-6 of scale"};
static const struct tol product = {0, 1e-5, "1e-5 of max |cpu|"};

enum kernel {
	EMBED_FWD,
	EMBED_BWD,
	RMSNORM_FWD,
	RMSNORM_BWD,
	LINEAR_FWD,
	LINEAR_FWD_INPLACE,
	LINEAR_BWD_DATA,
	LINEAR_BWD_WEIGHT,
	ATTENTION_FWD,
	ATTENTION_BWD,
	GELU_FWD,
	GELU_BWD,
	XENT,
	MIXED_BF16,
	MIXED_FP16,
	NKERNELS
};
static const char *const kernel_names[NKERNELS] = {
	"embed_fwd",     "embed_bwd",         "rmsnorm_fwd",     "rmsnorm_bwd",
	"linear_fwd",    "linear_fwd(y=res)", "linear_bwd_data", "linear_bwd_weight",
	"attention_fwd", "attention_bwd",     "gelu_fwd",        "gelu_bwd",
	"xent",          "bf16 (all)",        "fp16 (all)",
};

static struct {
	const struct tol *tol;
	size_t checks, values, bitwise, failures;
	uint32_t max_ulp;
	double max_rel;
} stats[NKERNELS];

static size_t total_failures;

static uint32_t float_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

/* Compares rows x cols elements (leading dimension ld) of the CPU output `ref` and the GPU
 * output `got`. `ctx` names the kernel's shape and mode, `what` the output. */
static void compare(enum kernel k, const char *ctx, const char *what, const float *ref, const float *got, size_t rows,
		    size_t cols, size_t ld, const struct tol *tol, double floor_scale)
{
	double scale = floor_scale;
	for (size_t r = 0; r < rows; r++)
		for (size_t c = 0; c < cols; c++)
			if (isfinite(ref[r * ld + c]) && fabs(ref[r * ld + c]) > scale)
				scale = fabs(ref[r * ld + c]);
	size_t failures = 0;
	stats[k].tol = tol;
	stats[k].checks++;
	for (size_t r = 0; r < rows; r++)
		for (size_t c = 0; c < cols; c++) {
			const size_t idx = r * ld + c;
			const float a = ref[idx], b = got[idx];
			stats[k].values++;
			if (float_bits(a) == float_bits(b) || (isnan(a) && isnan(b))) {
				stats[k].bitwise++;
				continue;
			}
			const uint32_t ulp = isnan(a) || isnan(b) ? UINT32_MAX : test_ulp_distance(a, b);
			const double diff = fabs((double)a - (double)b);
			const double rel = scale > 0.0 ? diff / scale : INFINITY;
			if (ulp > stats[k].max_ulp)
				stats[k].max_ulp = ulp;
			if (isfinite(rel) && rel > stats[k].max_rel)
				stats[k].max_rel = rel;
			const int ok = !isnan(a) && !isnan(b) && (ulp <= tol->ulp || diff <= tol->rel * scale);
			if (ok)
				continue;
			if (failures < 5)
				fprintf(stderr,
					"FAIL %s %s: %s at [%zu, %zu] (flat index %zu): cpu %.9g (0x%08x), cuda %.9g "
					"(0x%08x): %" PRIu32 " ulp, |diff| %.3g = %.3g of scale %.6g; allowed: %s\n",
					kernel_names[k], ctx, what, r, c, idx, (double)a, float_bits(a), (double)b,
					float_bits(b), ulp, diff, rel, scale, tol->name);
			failures++;
		}
	if (failures) {
		fprintf(stderr, "FAIL %s %s: %s: %zu of %zu elements out of tolerance\n", kernel_names[k], ctx, what,
			failures, rows * cols);
		stats[k].failures += failures;
		total_failures += failures;
	}
}

/* The GPU wrote exact zeros (+0.0f) above the diagonal of every [T, T] block of probs. */
static void check_causal_zeros(const char *ctx, const float *probs, size_t blocks, size_t T)
{
	size_t failures = 0;
	for (size_t b = 0; b < blocks; b++)
		for (size_t i = 0; i < T; i++)
			for (size_t j = i + 1; j < T; j++) {
				const float v = probs[(b * T + i) * T + j];
				if (float_bits(v) == 0)
					continue;
				if (failures < 5)
					fprintf(stderr,
						"FAIL attention_fwd %s: probs block %zu [%zu, %zu] above the diagonal: "
						"cuda %.9g (0x%08x), expected +0\n",
						ctx, b, i, j, (double)v, float_bits(v));
				failures++;
			}
	if (failures) {
		fprintf(stderr, "FAIL attention_fwd %s: %zu nonzero probabilities above the diagonal\n", ctx, failures);
		stats[ATTENTION_FWD].failures += failures;
		total_failures += failures;
	}
}

/* ---- buffers --------------------------------------------------------------------------- */

static float *host_normal(uint64_t *rng, size_t count, double sigma)
{
	float *p = test_malloc(count * sizeof(float));
	for (size_t i = 0; i < count; i++)
		p[i] = (float)(test_normal(rng) * sigma);
	return p;
}

static float *host_fill(size_t count, float value)
{
	float *p = test_malloc(count * sizeof(float));
	for (size_t i = 0; i < count; i++)
		p[i] = value;
	return p;
}

static double max_abs(const float *p, size_t count)
{
	double m = 0.0;
	for (size_t i = 0; i < count; i++)
		if (isfinite(p[i]) && fabs(p[i]) > m)
			m = fabs(p[i]);
	return m;
}

/* Copies host[0 .. bytes) to dev on the test's stream and waits. Not cudaMemcpy: that one
 * runs on the legacy default stream, which a cudaStreamNonBlocking stream does not wait
 * for, and from pageable memory it may return before the data reaches the device, so a
 * kernel launched next on `stream` could read the buffer's old content. */
static void copy_to_device(void *dev, const void *host, size_t bytes)
{
	if (!bytes)
		return;
	CUDA_OK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream));
	CUDA_OK(cudaStreamSynchronize(stream));
}

static void *upload(const void *host, size_t bytes)
{
	void *dev = NULL;
	CUDA_OK(cudaMalloc(&dev, bytes ? bytes : 1));
	copy_to_device(dev, host, bytes);
	return dev;
}

static float *upload_f(const float *host, size_t count)
{
	return upload(host, count * sizeof(float));
}

/* Waits for the stream and copies the device buffer back into a new host buffer. */
static float *download(const float *dev, size_t count)
{
	float *host = test_malloc(count * sizeof(float));
	CUDA_OK(cudaStreamSynchronize(stream));
	CUDA_OK(cudaGetLastError());
	if (count)
		CUDA_OK(cudaMemcpy(host, dev, count * sizeof(float), cudaMemcpyDeviceToHost));
	return host;
}

/* ---- shapes ---------------------------------------------------------------------------- */

struct shape {
	size_t B, T, H, hd, V, F;
};

static const struct shape shapes[] = {
	{1, 1, 1, 1, 3, 2},       /* every dimension minimal */
	{2, 7, 3, 5, 11, 37},     /* odd everything, d = 15 < a warp */
	{1, 33, 2, 24, 50, 129},  /* T just past a warp, d = 48 */
	{2, 64, 3, 13, 97, 101},  /* d = 39: rows not a multiple of 32 */
	{3, 64, 4, 16, 256, 256}, /* the byte vocabulary, d = 64 */
	{1, 64, 1, 96, 5, 160},   /* one head of 96, tiny vocabulary (many repeated ids) */
};

static void shape_name(char *buf, size_t size, const struct shape *s)
{
	snprintf(buf, size, "B=%zu T=%zu H=%zu hd=%zu (n=%zu d=%zu) V=%zu F=%zu", s->B, s->T, s->H, s->hd, s->B * s->T,
		 s->H * s->hd, s->V, s->F);
}

/* ---- kernels --------------------------------------------------------------------------- */

static void check_embedding(const struct shape *s, const char *sname, uint64_t *rng)
{
	const size_t n = s->B * s->T, d = s->H * s->hd, T = s->T, V = s->V;
	int32_t *ids = test_malloc(n * sizeof(int32_t));
	for (size_t i = 0; i < n; i++)
		ids[i] = (int32_t)(test_rand(rng) % V);
	float *tok = host_normal(rng, V * d, 0.02), *pos = host_normal(rng, T * d, 0.02);
	int32_t *dids = upload(ids, n * sizeof(int32_t));
	float *dtok_w = upload_f(tok, V * d), *dpos_w = upload_f(pos, T * d);
	char ctx[256];

	/* forward */
	float *x = host_fill(n * d, NAN), *dx_dev = upload_f(x, n * d);
	_dos_embed_fwd_cpu(ids, tok, pos, x, n, T, d, DOS_FP32);
	CUDA_OK(_dos_embed_fwd_cuda(dids, dtok_w, dpos_w, dx_dev, n, T, d, DOS_FP32, stream));
	float *got = download(dx_dev, n * d);
	snprintf(ctx, sizeof ctx, "%s", sname);
	compare(EMBED_FWD, ctx, "x", x, got, n, d, d, &bitwise, 0.0);
	free(got);

	/* backward, both modes: outputs start as NaN (overwrite) or random (accumulate) */
	float *g = host_normal(rng, n * d, 1.0), *dg = upload_f(g, n * d);
	for (int acc = 0; acc <= 1; acc++) {
		float *dtok = acc ? host_normal(rng, V * d, 1.0) : host_fill(V * d, NAN);
		float *dpos = acc ? host_normal(rng, T * d, 1.0) : host_fill(T * d, NAN);
		float *ddtok = upload_f(dtok, V * d), *ddpos = upload_f(dpos, T * d);
		_dos_embed_bwd_cpu(ids, g, dtok, dpos, n, T, d, V, acc, DOS_FP32);
		CUDA_OK(_dos_embed_bwd_cuda(dids, dg, ddtok, ddpos, n, T, d, V, acc, DOS_FP32, stream));
		float *gtok = download(ddtok, V * d), *gpos = download(ddpos, T * d);
		snprintf(ctx, sizeof ctx, "%s accumulate=%d", sname, acc);
		compare(EMBED_BWD, ctx, "dtok", dtok, gtok, V, d, d, &bitwise, 0.0);
		compare(EMBED_BWD, ctx, "dpos", dpos, gpos, T, d, d, &bitwise, 0.0);
		free(gtok), free(gpos), free(dtok), free(dpos);
		CUDA_OK(cudaFree(ddtok));
		CUDA_OK(cudaFree(ddpos));
	}
	CUDA_OK(cudaFree(dids));
	CUDA_OK(cudaFree(dtok_w));
	CUDA_OK(cudaFree(dpos_w));
	CUDA_OK(cudaFree(dx_dev));
	CUDA_OK(cudaFree(dg));
	free(ids), free(tok), free(pos), free(x), free(g);
}

static void check_rmsnorm(const struct shape *s, const char *sname, uint64_t *rng)
{
	const size_t n = s->B * s->T, d = s->H * s->hd;
	float *x = host_normal(rng, n * d, 3.0), *w = host_normal(rng, d, 0.1);
	for (size_t j = 0; j < d; j++)
		w[j] += 1.0f;
	float *dx_in = upload_f(x, n * d), *dw_in = upload_f(w, d);
	char ctx[256];

	float *y = host_fill(n * d, NAN), *rstd = host_fill(n, NAN);
	float *dy_out = upload_f(y, n * d), *drstd = upload_f(rstd, n);
	_dos_rmsnorm_fwd_cpu(x, w, y, rstd, n, d, DOS_FP32);
	CUDA_OK(_dos_rmsnorm_fwd_cuda(dx_in, dw_in, dy_out, drstd, n, d, DOS_FP32, stream));
	float *gy = download(dy_out, n * d), *grstd = download(drstd, n);
	compare(RMSNORM_FWD, sname, "y", y, gy, n, d, d, &bitwise, 0.0);
	compare(RMSNORM_FWD, sname, "rstd", rstd, grstd, 1, n, n, &bitwise, 0.0);
	free(gy), free(grstd);

	/* backward from the CPU's rstd (the forward's bits are checked above) */
	copy_to_device(drstd, rstd, n * sizeof(float));
	float *g = host_normal(rng, n * d, 1.0), *dg = upload_f(g, n * d);
	for (int mode = 0; mode < 4; mode++) {
		const int acc_dx = mode & 1, acc_dw = mode >> 1;
		float *dx = acc_dx ? host_normal(rng, n * d, 1.0) : host_fill(n * d, NAN);
		float *dw = acc_dw ? host_normal(rng, d, 1.0) : host_fill(d, NAN);
		float *ddx = upload_f(dx, n * d), *ddw = upload_f(dw, d);
		_dos_rmsnorm_bwd_cpu(x, w, rstd, g, dx, dw, n, d, acc_dx, acc_dw, DOS_FP32);
		CUDA_OK(_dos_rmsnorm_bwd_cuda(dx_in, dw_in, drstd, dg, ddx, ddw, n, d, acc_dx, acc_dw, DOS_FP32,
					      stream));
		float *gdx = download(ddx, n * d), *gdw = download(ddw, d);
		snprintf(ctx, sizeof ctx, "%s accumulate_dx=%d accumulate_dw=%d", sname, acc_dx, acc_dw);
		compare(RMSNORM_BWD, ctx, "dx", dx, gdx, n, d, d, &bitwise, 0.0);
		compare(RMSNORM_BWD, ctx, "dw", dw, gdw, 1, d, d, &bitwise, 0.0);
		free(gdx), free(gdw), free(dx), free(dw);
		CUDA_OK(cudaFree(ddx));
		CUDA_OK(cudaFree(ddw));
	}
	CUDA_OK(cudaFree(dx_in));
	CUDA_OK(cudaFree(dw_in));
	CUDA_OK(cudaFree(dy_out));
	CUDA_OK(cudaFree(drstd));
	CUDA_OK(cudaFree(dg));
	free(x), free(w), free(y), free(rstd), free(g);
}

static void check_linear_one(const char *sname, size_t n, size_t in, size_t out, uint64_t *rng)
{
	float *x = host_normal(rng, n * in, 1.0), *w = host_normal(rng, out * in, 0.05);
	float *res = host_normal(rng, n * out, 1.0), *g = host_normal(rng, n * out, 1.0);
	float *dx_in = upload_f(x, n * in), *dw_in = upload_f(w, out * in), *dres = upload_f(res, n * out),
	      *dg = upload_f(g, n * out);
	char ctx[320];

	/* forward, without and with the residual; then the in-place residual (residual == y)
	 * against the out-of-place GPU result, bit for bit */
	for (int with_res = 0; with_res <= 1; with_res++) {
		float *y = host_fill(n * out, NAN), *dy = upload_f(y, n * out);
		_dos_linear_fwd_cpu(x, w, with_res ? res : NULL, y, n, in, out, DOS_FP32);
		BLAS_OK(_dos_linear_fwd_cuda(blas, dx_in, dw_in, with_res ? dres : NULL, dy, n, in, out, DOS_FP32,
					     stream));
		float *gy = download(dy, n * out);
		snprintf(ctx, sizeof ctx, "%s n=%zu in=%zu out=%zu residual=%s", sname, n, in, out,
			 with_res ? "yes" : "no");
		compare(LINEAR_FWD, ctx, "y", y, gy, n, out, out, &product, 0.0);
		if (with_res) {
			float *dinplace = upload_f(res, n * out);
			BLAS_OK(_dos_linear_fwd_cuda(blas, dx_in, dw_in, dinplace, dinplace, n, in, out, DOS_FP32,
						     stream));
			float *ginplace = download(dinplace, n * out);
			snprintf(ctx, sizeof ctx,
				 "%s n=%zu in=%zu out=%zu residual==y (vs the out-of-place CUDA result)", sname, n, in,
				 out);
			compare(LINEAR_FWD_INPLACE, ctx, "y", gy, ginplace, n, out, out, &bitwise, 0.0);
			free(ginplace);
			CUDA_OK(cudaFree(dinplace));
		}
		free(y), free(gy);
		CUDA_OK(cudaFree(dy));
	}

	for (int acc = 0; acc <= 1; acc++) {
		float *dx = acc ? host_normal(rng, n * in, 1.0) : host_fill(n * in, NAN);
		float *ddx = upload_f(dx, n * in);
		_dos_linear_bwd_data_cpu(g, w, dx, n, in, out, acc, DOS_FP32);
		BLAS_OK(_dos_linear_bwd_data_cuda(blas, dg, dw_in, ddx, n, in, out, acc, DOS_FP32));
		float *gdx = download(ddx, n * in);
		snprintf(ctx, sizeof ctx, "%s n=%zu in=%zu out=%zu accumulate=%d", sname, n, in, out, acc);
		compare(LINEAR_BWD_DATA, ctx, "dx", dx, gdx, n, in, in, &product, 0.0);
		free(dx), free(gdx);
		CUDA_OK(cudaFree(ddx));

		float *dw = acc ? host_normal(rng, out * in, 1.0) : host_fill(out * in, NAN);
		float *ddw = upload_f(dw, out * in);
		_dos_linear_bwd_weight_cpu(g, x, dw, n, in, out, acc, DOS_FP32);
		BLAS_OK(_dos_linear_bwd_weight_cuda(blas, dg, dx_in, ddw, n, in, out, acc, DOS_FP32));
		float *gdw = download(ddw, out * in);
		compare(LINEAR_BWD_WEIGHT, ctx, "dw", dw, gdw, out, in, in, &product, 0.0);
		free(dw), free(gdw);
		CUDA_OK(cudaFree(ddw));
	}
	CUDA_OK(cudaFree(dx_in));
	CUDA_OK(cudaFree(dw_in));
	CUDA_OK(cudaFree(dres));
	CUDA_OK(cudaFree(dg));
	free(x), free(w), free(res), free(g);
}

static void check_linear(const struct shape *s, const char *sname, uint64_t *rng)
{
	const size_t n = s->B * s->T, d = s->H * s->hd;
	check_linear_one(sname, n, d, 3 * d, rng); /* w_qkv */
	check_linear_one(sname, n, d, s->F, rng);  /* w_fc1 */
	check_linear_one(sname, n, s->F, d, rng);  /* w_fc2 */
	check_linear_one(sname, n, d, s->V, rng);  /* w_head */
}

static void check_attention(const struct shape *s, const char *sname, uint64_t *rng)
{
	const size_t B = s->B, T = s->T, H = s->H, hd = s->hd, n = B * T, d = H * hd, np = B * H * T * T;
	/* entries of sd 1.5: scores of sd ~2.25, peaked but not one-hot softmax rows */
	float *qkv = host_normal(rng, n * 3 * d, 1.5), *dqkv_in = upload_f(qkv, n * 3 * d);

	float *out = host_fill(n * d, NAN), *probs = host_fill(np, NAN);
	float *dout_buf = upload_f(out, n * d), *dprobs = upload_f(probs, np);
	_dos_attention_fwd_cpu(qkv, out, probs, B, T, H, hd, DOS_FP32);
	CUDA_OK(_dos_attention_fwd_cuda(blas, dqkv_in, dout_buf, dprobs, B, T, H, hd, DOS_FP32, stream));
	float *gout = download(dout_buf, n * d), *gprobs = download(dprobs, np);
	compare(ATTENTION_FWD, sname, "probs [B*H*T, T]", probs, gprobs, B * H * T, T, T, &product, 0.0);
	check_causal_zeros(sname, gprobs, B * H, T);
	compare(ATTENTION_FWD, sname, "out", out, gout, n, d, d, &product, 0.0);
	free(gout), free(gprobs);

	/* backward from the CPU's probs, dqkv starting as NaN (overwritten) */
	copy_to_device(dprobs, probs, np * sizeof(float));
	float *g = host_normal(rng, n * d, 1.0), *dg = upload_f(g, n * d);
	float *dqkv = host_fill(n * 3 * d, NAN), *ddqkv = upload_f(dqkv, n * 3 * d);
	_dos_attention_bwd_cpu(qkv, probs, g, dqkv, B, T, H, hd, DOS_FP32);
	CUDA_OK(_dos_attention_bwd_cuda(blas, dqkv_in, dprobs, dg, ddqkv, B, T, H, hd, DOS_FP32, stream));
	float *gdqkv = download(ddqkv, n * 3 * d);
	compare(ATTENTION_BWD, sname, "dq (columns [0, d) of dqkv)", dqkv, gdqkv, n, d, 3 * d, &product, 0.0);
	compare(ATTENTION_BWD, sname, "dk (columns [d, 2d) of dqkv)", dqkv + d, gdqkv + d, n, d, 3 * d, &product, 0.0);
	compare(ATTENTION_BWD, sname, "dv (columns [2d, 3d) of dqkv)", dqkv + 2 * d, gdqkv + 2 * d, n, d, 3 * d,
		&product, 0.0);
	free(gdqkv);
	CUDA_OK(cudaFree(dqkv_in));
	CUDA_OK(cudaFree(dout_buf));
	CUDA_OK(cudaFree(dprobs));
	CUDA_OK(cudaFree(dg));
	CUDA_OK(cudaFree(ddqkv));
	free(qkv), free(out), free(probs), free(g), free(dqkv);
}

static void check_gelu(const struct shape *s, const char *sname, uint64_t *rng)
{
	const size_t count = s->B * s->T * s->F;
	float *x = host_normal(rng, count, 3.0);
	/* awkward values where there is room: signed zeros, tiny, the tails, saturated erf (not
	 * huge values: they would set the scale of the relative tolerance) */
	static const float special[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-7f, -5.5f, -9.0f, -12.0f, 7.0f, 30.0f, -30.0f};
	for (size_t i = 0; i < sizeof special / sizeof special[0] && i < count; i++)
		x[i] = special[i];
	float *dx_in = upload_f(x, count);

	float *y = host_fill(count, NAN), *dy = upload_f(y, count);
	_dos_gelu_fwd_cpu(x, y, count, DOS_FP32);
	CUDA_OK(_dos_gelu_fwd_cuda(dx_in, dy, count, DOS_FP32, stream));
	float *gy = download(dy, count);
	/* erff's error is absolute (near 1), times 0.5 x: scale at least max |x| */
	compare(GELU_FWD, sname, "y", y, gy, 1, count, count, &transcendental, max_abs(x, count));

	float *g = host_normal(rng, count, 1.0), *dg = upload_f(g, count);
	float *dx = host_fill(count, NAN), *ddx = upload_f(dx, count);
	_dos_gelu_bwd_cpu(x, g, dx, count, DOS_FP32);
	CUDA_OK(_dos_gelu_bwd_cuda(dx_in, dg, ddx, count, DOS_FP32, stream));
	float *gdx = download(ddx, count);
	/* gelu' is within [-0.17, 1.13]: scale at least max |dy| */
	compare(GELU_BWD, sname, "dx", dx, gdx, 1, count, count, &transcendental, max_abs(g, count));
	free(gy), free(gdx);
	CUDA_OK(cudaFree(dx_in));
	CUDA_OK(cudaFree(dy));
	CUDA_OK(cudaFree(dg));
	CUDA_OK(cudaFree(ddx));
	free(x), free(y), free(g), free(dx);
}

static void check_xent(const struct shape *s, const char *sname, uint64_t *rng)
{
	const size_t n = s->B * s->T, V = s->V;
	float *logits = host_normal(rng, n * V, 3.0);
	int32_t *targets = test_malloc(n * sizeof(int32_t));
	for (size_t i = 0; i < n; i++)
		targets[i] = (int32_t)(test_rand(rng) % V);
	if (n > 2)
		targets[n / 2] = -1; /* out of range: NaN loss, no one-hot term, on both */
	const float grad_scale = 1024.0f / (float)(n * 2);
	float *dlogits_in = upload_f(logits, n * V);
	int32_t *dtargets = upload(targets, n * sizeof(int32_t));
	float *loss = host_fill(n, 0.0f), *dl = host_fill(n * V, NAN);
	float *dloss = upload_f(loss, n), *ddl = upload_f(dl, n * V);
	_dos_xent_cpu(logits, targets, loss, dl, n, V, grad_scale, DOS_FP32);
	CUDA_OK(_dos_xent_cuda(dlogits_in, dtargets, dloss, ddl, n, V, grad_scale, DOS_FP32, stream));
	float *gloss = download(dloss, n), *gdl = download(ddl, n * V);
	char ctx[300];
	snprintf(ctx, sizeof ctx, "%s grad_scale=%g", sname, (double)grad_scale);
	/* the loss is max + log(sum) - logit: its rounding is that of the logits' magnitude; the
	 * gradient's that of |prob - onehot| <= 1 times grad_scale */
	compare(XENT, ctx, "loss", loss, gloss, 1, n, n, &transcendental, max_abs(logits, n * V) + log((double)V));
	compare(XENT, ctx, "dlogits", dl, gdl, n, V, V, &transcendental, fabs((double)grad_scale));
	free(gloss), free(gdl);
	CUDA_OK(cudaFree(dlogits_in));
	CUDA_OK(cudaFree(dtargets));
	CUDA_OK(cudaFree(dloss));
	CUDA_OK(cudaFree(ddl));
	free(logits), free(targets), free(loss), free(dl);
}

/* ---- the 16-bit path ---------------------------------------------------------------- */

/* Normal values rounded to dtype (16-bit storage). */
static uint16_t *host16(uint64_t *rng, size_t count, double sigma, enum dos_dtype dt)
{
	uint16_t *p = test_malloc(count * 2);
	for (size_t i = 0; i < count; i++)
		p[i] = dt == DOS_BF16 ? dos_float_to_bf16((float)(test_normal(rng) * sigma))
				      : dos_float_to_fp16((float)(test_normal(rng) * sigma));
	return p;
}

static uint16_t *host16_nan(size_t count, enum dos_dtype dt)
{
	uint16_t *p = test_malloc(count * 2);
	for (size_t i = 0; i < count; i++)
		p[i] = dt == DOS_BF16 ? 0x7fc0 : 0x7e00;
	return p;
}

/* 16-bit values widened (exactly) to floats, for compare(). */
static float *widen16(const uint16_t *h, size_t count, enum dos_dtype dt)
{
	float *f = test_malloc(count * sizeof(float));
	for (size_t i = 0; i < count; i++)
		f[i] = dt == DOS_BF16 ? dos_bf16_to_float(h[i]) : dos_fp16_to_float(h[i]);
	return f;
}

static float *download16(const void *dev, size_t count, enum dos_dtype dt)
{
	uint16_t *h = test_malloc(count * 2 + 2);
	CUDA_OK(cudaStreamSynchronize(stream));
	CUDA_OK(cudaGetLastError());
	if (count)
		CUDA_OK(cudaMemcpy(h, dev, count * 2, cudaMemcpyDeviceToHost));
	float *f = widen16(h, count, dt);
	free(h);
	return f;
}

/* compare() on a 16-bit CPU result against a 16-bit device buffer. */
static void compare16(enum kernel k, const char *ctx, const char *what, const uint16_t *cpu, const void *dev,
		      size_t count, enum dos_dtype dt, const struct tol *tol, double floor_scale)
{
	float *ref = widen16(cpu, count, dt), *got = download16(dev, count, dt);
	compare(k, ctx, what, ref, got, 1, count, count, tol, floor_scale);
	free(ref), free(got);
}

/* Every kernel in dtype dt on one shape, the device against the CPU. */
static void check_sixteen(const struct shape *s, const char *sname, uint64_t *rng, enum dos_dtype dt)
{
	const enum kernel k = dt == DOS_BF16 ? MIXED_BF16 : MIXED_FP16;
	const size_t B = s->B, T = s->T, H = s->H, hd = s->hd, V = s->V, F = s->F;
	const size_t n = B * T, d = H * hd, np = B * H * T * T;
	const double u = dt == DOS_BF16 ? 0x1p-8 : 0x1p-11;
	/* one 16-bit ulp in fp32 ulps (normal values), 2^-24 of the scale for fp16 subnormals */
	const struct tol one16 = {dt == DOS_BF16 ? 1u << 16 : 1u << 13, 0x1p-24, "<= 1 16-bit ulp"};
	const struct tol product16 = {0, 2 * u, "2u of max |cpu|"};
	const struct tol attention16 = {0, 4 * u, "4u of max |cpu|"};
	char ctx[320];
	snprintf(ctx, sizeof ctx, "%s %s", sname, dos_dtype_name(dt));

	/* embedding, RMSNorm: bitwise */
	int32_t *ids = test_malloc(n * sizeof(int32_t));
	for (size_t i = 0; i < n; i++)
		ids[i] = (int32_t)(test_rand(rng) % V);
	int32_t *dids = upload(ids, n * sizeof(int32_t));
	uint16_t *tok = host16(rng, V * d, 0.02, dt), *pos = host16(rng, T * d, 0.02, dt), *x = host16_nan(n * d, dt);
	void *dtok = upload(tok, V * d * 2), *dpos = upload(pos, T * d * 2), *dx = upload(x, n * d * 2);
	_dos_embed_fwd_cpu(ids, tok, pos, x, n, T, d, dt);
	CUDA_OK(_dos_embed_fwd_cuda(dids, dtok, dpos, dx, n, T, d, dt, stream));
	compare16(k, ctx, "embed_fwd x", x, dx, n * d, dt, &bitwise, 0.0);
	uint16_t *g = host16(rng, n * d, 1.0, dt);
	void *dg = upload(g, n * d * 2);
	float *gtok = host_normal(rng, V * d, 1.0), *gpos = host_normal(rng, T * d, 1.0);
	float *dgtok = upload_f(gtok, V * d), *dgpos = upload_f(gpos, T * d);
	_dos_embed_bwd_cpu(ids, g, gtok, gpos, n, T, d, V, 1, dt);
	CUDA_OK(_dos_embed_bwd_cuda(dids, dg, dgtok, dgpos, n, T, d, V, 1, dt, stream));
	float *got = download(dgtok, V * d);
	compare(k, ctx, "embed_bwd dtok (fp32)", gtok, got, 1, V * d, V * d, &bitwise, 0.0);
	free(got);
	got = download(dgpos, T * d);
	compare(k, ctx, "embed_bwd dpos (fp32)", gpos, got, 1, T * d, T * d, &bitwise, 0.0);
	free(got);

	uint16_t *w = host16(rng, d, 1.0, dt), *y = host16_nan(n * d, dt), *dxr = host16(rng, n * d, 1.0, dt);
	float *rstd = host_fill(n, NAN), *dw = host_fill(d, NAN);
	void *dw_in = upload(w, d * 2), *dy = upload(y, n * d * 2), *ddxr = upload(dxr, n * d * 2);
	float *drstd = upload_f(rstd, n), *ddw = upload_f(dw, d);
	_dos_rmsnorm_fwd_cpu(x, w, y, rstd, n, d, dt);
	CUDA_OK(_dos_rmsnorm_fwd_cuda(dx, dw_in, dy, drstd, n, d, dt, stream));
	compare16(k, ctx, "rmsnorm_fwd y", y, dy, n * d, dt, &bitwise, 0.0);
	got = download(drstd, n);
	compare(k, ctx, "rmsnorm_fwd rstd (fp32)", rstd, got, 1, n, n, &bitwise, 0.0);
	free(got);
	copy_to_device(drstd, rstd, n * sizeof(float));
	_dos_rmsnorm_bwd_cpu(x, w, rstd, g, dxr, dw, n, d, 1, 0, dt);
	CUDA_OK(_dos_rmsnorm_bwd_cuda(dx, dw_in, drstd, dg, ddxr, ddw, n, d, 1, 0, dt, stream));
	compare16(k, ctx, "rmsnorm_bwd accumulated dx", dxr, ddxr, n * d, dt, &bitwise, 0.0);
	got = download(ddw, d);
	compare(k, ctx, "rmsnorm_bwd dw (fp32)", dw, got, 1, d, d, &bitwise, 0.0);
	free(got);

	/* a linear layer d -> F (both directions), the weight gradient fp32 */
	uint16_t *wl = host16(rng, F * d, 0.05, dt), *res = host16(rng, n * F, 1.0, dt), *yl = host16_nan(n * F, dt);
	uint16_t *gl = host16(rng, n * F, 1.0, dt), *dxl = host16_nan(n * d, dt);
	float *dwl = host_normal(rng, F * d, 1.0);
	void *dwl_in = upload(wl, F * d * 2), *dres = upload(res, n * F * 2), *dyl = upload(yl, n * F * 2);
	void *dgl = upload(gl, n * F * 2), *ddxl = upload(dxl, n * d * 2);
	float *ddwl = upload_f(dwl, F * d);
	if (blas) {
		_dos_linear_fwd_cpu(x, wl, res, yl, n, d, F, dt);
		BLAS_OK(_dos_linear_fwd_cuda(blas, dx, dwl_in, dres, dyl, n, d, F, dt, stream));
		compare16(k, ctx, "linear_fwd y with residual", yl, dyl, n * F, dt, &product16, 0.0);
		_dos_linear_bwd_data_cpu(gl, wl, dxl, n, d, F, 0, dt);
		BLAS_OK(_dos_linear_bwd_data_cuda(blas, dgl, dwl_in, ddxl, n, d, F, 0, dt));
		compare16(k, ctx, "linear_bwd_data dx", dxl, ddxl, n * d, dt, &product16, 0.0);
		_dos_linear_bwd_weight_cpu(gl, x, dwl, n, d, F, 1, dt);
		BLAS_OK(_dos_linear_bwd_weight_cuda(blas, dgl, dx, ddwl, n, d, F, 1, dt));
		got = download(ddwl, F * d);
		compare(k, ctx, "linear_bwd_weight accumulated dw (fp32)", dwl, got, 1, F * d, F * d, &product, 0.0);
		free(got);
	}

	/* attention, backward from the CPU's probabilities */
	uint16_t *qkv = host16(rng, n * 3 * d, 1.5, dt), *att = host16_nan(n * d, dt), *probs = host16_nan(np, dt);
	uint16_t *gatt = host16(rng, n * d, 1.0, dt), *dqkv = host16_nan(n * 3 * d, dt);
	void *dqkv_in = upload(qkv, n * 3 * d * 2), *datt = upload(att, n * d * 2), *dprobs = upload(probs, np * 2);
	void *dgatt = upload(gatt, n * d * 2), *ddqkv = upload(dqkv, n * 3 * d * 2);
	if (blas) {
		_dos_attention_fwd_cpu(qkv, att, probs, B, T, H, hd, dt);
		CUDA_OK(_dos_attention_fwd_cuda(blas, dqkv_in, datt, dprobs, B, T, H, hd, dt, stream));
		compare16(k, ctx, "attention_fwd probs", probs, dprobs, np, dt, &attention16, 0.0);
		compare16(k, ctx, "attention_fwd out", att, datt, n * d, dt, &attention16, 0.0);
		copy_to_device(dprobs, probs, np * 2);
		_dos_attention_bwd_cpu(qkv, probs, gatt, dqkv, B, T, H, hd, dt);
		CUDA_OK(_dos_attention_bwd_cuda(blas, dqkv_in, dprobs, dgatt, ddqkv, B, T, H, hd, dt, stream));
		compare16(k, ctx, "attention_bwd dqkv", dqkv, ddqkv, n * 3 * d, dt, &attention16, 0.0);
	}

	/* GELU and cross-entropy: one 16-bit ulp */
	uint16_t *u16 = host16(rng, n * F, 3.0, dt), *a16 = host16_nan(n * F, dt), *da16 = host16_nan(n * F, dt);
	void *du16 = upload(u16, n * F * 2), *da = upload(a16, n * F * 2), *dda = upload(da16, n * F * 2);
	_dos_gelu_fwd_cpu(u16, a16, n * F, dt);
	CUDA_OK(_dos_gelu_fwd_cuda(du16, da, n * F, dt, stream));
	compare16(k, ctx, "gelu_fwd", a16, da, n * F, dt, &one16, 0.0);
	_dos_gelu_bwd_cpu(u16, gl, da16, n * F, dt);
	CUDA_OK(_dos_gelu_bwd_cuda(du16, dgl, dda, n * F, dt, stream));
	compare16(k, ctx, "gelu_bwd", da16, dda, n * F, dt, &one16, 0.0);
	uint16_t *logits = host16(rng, n * V, 3.0, dt), *dl = host16_nan(n * V, dt);
	int32_t *targets = test_malloc(n * sizeof(int32_t));
	for (size_t i = 0; i < n; i++)
		targets[i] = (int32_t)(test_rand(rng) % V);
	float *loss = host_fill(n, NAN), *dloss = upload_f(loss, n);
	void *dlogits = upload(logits, n * V * 2), *ddl = upload(dl, n * V * 2);
	int32_t *dtargets = upload(targets, n * sizeof(int32_t));
	const float grad_scale = 1024.0f / (float)(n * 2);
	_dos_xent_cpu(logits, targets, loss, dl, n, V, grad_scale, dt);
	CUDA_OK(_dos_xent_cuda(dlogits, dtargets, dloss, ddl, n, V, grad_scale, dt, stream));
	got = download(dloss, n);
	compare(k, ctx, "xent loss (fp32)", loss, got, 1, n, n, &transcendental, 3.0 * 5 + log((double)V));
	free(got);
	compare16(k, ctx, "xent dlogits", dl, ddl, n * V, dt, &one16, 0.0);

	void *dev[] = {dids,   dtok,  dpos,   dx,   dg,  dgtok, dgpos, dw_in,   dy,      ddxr,
		       drstd,  ddw,   dwl_in, dres, dyl, dgl,   ddxl,  ddwl,    dqkv_in, datt,
		       dprobs, dgatt, ddqkv,  du16, da,  dda,   dloss, dlogits, ddl,     dtargets};
	for (size_t i = 0; i < sizeof dev / sizeof *dev; i++)
		CUDA_OK(cudaFree(dev[i]));
	void *host[] = {ids, tok, pos, x,   g,   gtok,  gpos, w,    y,   dxr, rstd, dw,     wl, res,     yl,
			gl,  dxl, dwl, qkv, att, probs, gatt, dqkv, u16, a16, da16, logits, dl, targets, loss};
	for (size_t i = 0; i < sizeof host / sizeof *host; i++)
		free(host[i]);
}

int main(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0); /* interleave with the FAIL lines on stderr in logs */
	int devices = 0;
	cudaError_t err = cudaGetDeviceCount(&devices);
	if (err != cudaSuccess || devices == 0) {
		printf("no usable CUDA device (%s): skipped\n",
		       err != cudaSuccess ? cudaGetErrorString(err) : "none found");
		return TEST_SKIP;
	}
	struct cudaDeviceProp prop;
	CUDA_OK(cudaGetDeviceProperties(&prop, 0));
	const char *tf32 = getenv("NVIDIA_TF32_OVERRIDE");
	printf("device 0: %s (sm_%d%d); NVIDIA_TF32_OVERRIDE %s%s\n", prop.name, prop.major, prop.minor,
	       tf32 ? "= " : "unset", tf32 ? tf32 : "");
	CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
	const char *no_cublas = getenv("DOS_TEST_NO_CUBLAS");
	if (no_cublas && strcmp(no_cublas, "1") == 0) {
		printf("DOS_TEST_NO_CUBLAS=1: the kernels that need cuBLAS (linear layers, attention) are left out\n");
	} else {
		BLAS_OK(cublasCreate(&blas));
		BLAS_OK(cublasSetStream(blas, stream));
	}

	for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
		const struct shape *s = &shapes[si];
		char sname[160];
		shape_name(sname, sizeof sname, s);
		uint64_t rng = 0x5eed0000ULL + si * 0x9E3779B97F4A7C15ULL;
		check_embedding(s, sname, &rng);
		check_rmsnorm(s, sname, &rng);
		if (blas) {
			check_linear(s, sname, &rng);
			check_attention(s, sname, &rng);
		}
		check_gelu(s, sname, &rng);
		check_xent(s, sname, &rng);
		check_sixteen(s, sname, &rng, DOS_BF16);
		check_sixteen(s, sname, &rng, DOS_FP16);
	}

	for (int k = 0; k < NKERNELS; k++)
		printf("%-17s %2zu checks, %7zu values, %7zu bitwise equal, max %" PRIu32
		       " ulp and %.3g of scale otherwise; allowed %s: %s\n",
		       kernel_names[k], stats[k].checks, stats[k].values, stats[k].bitwise, stats[k].max_ulp,
		       stats[k].max_rel, stats[k].tol ? stats[k].tol->name : "-",
		       stats[k].failures ? "FAILED"
		       : stats[k].checks ? "ok"
					 : "not run");

	if (blas)
		BLAS_OK(cublasDestroy(blas));
	CUDA_OK(cudaStreamDestroy(stream));
	if (total_failures) {
		fprintf(stderr, "%zu elements out of tolerance (details above)\n", total_failures);
		return 1;
	}
	printf("all CUDA model kernels%s agree with the CPU ones\n", blas ? "" : " but those that need cuBLAS");
	return 0;
}
#endif /* DOS_USE_CUDA */
