/* CPU kernels of the example model (docs/model.md, interface in model_kernels.h).
 *
 * Products go to OpenBLAS, made single-threaded once: StarPU's CPU workers are the
 * parallelism, and one BLAS thread pool per worker would oversubscribe the cores.
 *
 * Everything that is not a product is a plain loop in float whose order is part of the
 * definition, so that a CUDA thread running the same loop (model_cuda.cu, built with
 * -fmad=false) gets the same bits wherever the elementary functions agree:
 *  - reductions over tokens (embedding backward, rmsnorm dw) add one token at a time in
 *    increasing token order, into the (zeroed or accumulated) output;
 *  - reductions along a row (rmsnorm's sum of squares, the softmax maxima and sums, the
 *    softmax backward's dot product) run left to right from 0.0f in one float accumulator;
 *  - the order of the operations of each element formula is the one written (no FMA: the
 *    build uses -ffp-contract=off).
 * The products (linear layers, q k^T, p v and their gradients) are not reproducible across
 * BLAS libraries and are not meant to be.
 *
 * 16-bit compute (dtype fp16 or bf16, model_kernels.h): every element is widened exactly on
 * load, the loops above run in float unchanged, and each stored element is rounded once to
 * nearest even (numerics.h, the one home of the conversions). Products widen their 16-bit
 * operands to fp32 scratch and call cblas_sgemm: a product of two 16-bit values is exact in
 * fp32, so this is a 16-bit-input, fp32-accumulate product up to summation order (what
 * cublasGemmEx with CUBLAS_COMPUTE_32F does). OpenBLAS's cblas_sbgemm would skip the
 * widening, but Debian's 0.3.21 declares it without exporting it. With dtype fp32 the
 * loads and stores are plain float accesses and the products get the caller's own
 * buffers: the fp32 results are bit for bit those of the fp32-only kernels before. */
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "config.h"
#include "model_kernels.h"
#include "numerics.h"

#ifdef HAVE_OPENBLAS_SET_NUM_THREADS
/* Not in every cblas.h (the netlib one lacks it); an identical redeclaration is harmless. */
void openblas_set_num_threads(int num_threads);
#endif

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;

static void blas_single_thread(void)
{
#ifdef HAVE_OPENBLAS_SET_NUM_THREADS
	openblas_set_num_threads(1);
#endif
}

static int blas_int(size_t v)
{
	if (v > (size_t)INT_MAX) {
		fprintf(stderr, "starpu-dos: model kernel dimension %zu exceeds the BLAS int range\n", v);
		abort();
	}
	return (int)v;
}

/* Row-major C[M, N] = alpha * op(A) op(B) + beta * C, beta 0 (overwrite, C may hold
 * anything) or 1. Degenerate sizes, which BLAS rejects through its leading-dimension
 * checks, are handled here: an empty product is zero. */
static void gemm(int trans_a, int trans_b, size_t M, size_t N, size_t K, float alpha, const float *A, size_t lda,
		 const float *B, size_t ldb, float beta, float *C, size_t ldc)
{
	if (M == 0 || N == 0)
		return;
	if (K == 0) {
		if (beta == 0.0f)
			for (size_t i = 0; i < M; i++)
				memset(C + i * ldc, 0, N * sizeof(float));
		return;
	}
	pthread_once(&blas_once, blas_single_thread);
	cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
		    blas_int(M), blas_int(N), blas_int(K), alpha, A, blas_int(lda), B, blas_int(ldb), beta, C,
		    blas_int(ldc));
}

static void *scratch_alloc(size_t bytes)
{
	void *p = malloc(bytes ? bytes : 1);
	if (!p) {
		fprintf(stderr, "starpu-dos: model kernel out of memory for %zu bytes of scratch\n", bytes);
		abort();
	}
	return p;
}

/* An unknown dtype reaching a kernel is a bug of the caller (the codelets and the graph
 * builder check theirs first). */
static void check_dtype(enum dos_dtype dtype, const char *kernel)
{
	if (dtype != DOS_FP32 && dtype != DOS_FP16 && dtype != DOS_BF16) {
		fprintf(stderr, "starpu-dos: %s: dtype = %d is not fp32, fp16 or bf16\n", kernel, (int)dtype);
		abort();
	}
}

/* Element `offset` of an array of `dtype` (pointer arithmetic over either element size). */
static const void *at(const void *base, size_t offset, enum dos_dtype dtype)
{
	return (const char *)base + offset * dos_dtype_size(dtype);
}

static void *at_mut(void *base, size_t offset, enum dos_dtype dtype)
{
	return (char *)base + offset * dos_dtype_size(dtype);
}

/* The [rows, cols] block at leading dimension ld of a 16-bit array, widened to a compact
 * fp32 array (leading dimension cols); the caller frees it. */
static float *widen_block(const void *src, enum dos_dtype dtype, size_t rows, size_t cols, size_t ld)
{
	float *out = scratch_alloc(rows * cols * sizeof(float));
	for (size_t i = 0; i < rows; i++)
		for (size_t j = 0; j < cols; j++)
			out[i * cols + j] = dos_load_elem(src, i * ld + j, dtype);
	return out;
}

static void narrow_block(const float *src, void *dst, enum dos_dtype dtype, size_t rows, size_t cols, size_t ld)
{
	for (size_t i = 0; i < rows; i++)
		for (size_t j = 0; j < cols; j++)
			dos_store_elem(dst, i * ld + j, dtype, src[i * cols + j]);
}

/* gemm() over operands of any dtype: 16-bit A or B are widened (exactly) to fp32 scratch,
 * a 16-bit C is computed in fp32 scratch (from its widened content when beta is 1) and
 * rounded once at the end. All-fp32 calls go straight to gemm() on the caller's buffers. */
static void gemm_dt(int trans_a, int trans_b, size_t M, size_t N, size_t K, float alpha, const void *A,
		    enum dos_dtype a_dtype, size_t lda, const void *B, enum dos_dtype b_dtype, size_t ldb, float beta,
		    void *C, enum dos_dtype c_dtype, size_t ldc)
{
	if (a_dtype == DOS_FP32 && b_dtype == DOS_FP32 && c_dtype == DOS_FP32) {
		gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
		return;
	}
	if (M == 0 || N == 0)
		return;
	/* op(A) is [M, K], stored [K, M] when transposed; likewise op(B) [K, N] */
	float *a = NULL, *b = NULL, *c = NULL;
	if (a_dtype != DOS_FP32 && K) {
		a = trans_a ? widen_block(A, a_dtype, K, M, lda) : widen_block(A, a_dtype, M, K, lda);
		lda = trans_a ? M : K;
	}
	if (b_dtype != DOS_FP32 && K) {
		b = trans_b ? widen_block(B, b_dtype, N, K, ldb) : widen_block(B, b_dtype, K, N, ldb);
		ldb = trans_b ? K : N;
	}
	size_t ldc32 = ldc;
	if (c_dtype != DOS_FP32) {
		c = beta != 0.0f ? widen_block(C, c_dtype, M, N, ldc) : scratch_alloc(M * N * sizeof(float));
		ldc32 = N;
	}
	gemm(trans_a, trans_b, M, N, K, alpha, a ? a : A, lda, b ? b : B, ldb, beta, c ? c : C, ldc32);
	if (c) {
		narrow_block(c, C, c_dtype, M, N, ldc);
		free(c);
	}
	free(a);
	free(b);
}

/* ---- embeddings ------------------------------------------------------------------------ */

void _dos_embed_fwd_cpu(const int32_t *ids, const void *tok, const void *pos, void *x, size_t n, size_t T, size_t d,
			enum dos_dtype dtype)
{
	check_dtype(dtype, __func__);
	for (size_t i = 0; i < n; i++) {
		size_t t = (size_t)ids[i] * d, p = (i % T) * d;
		for (size_t j = 0; j < d; j++)
			dos_store_elem(x, i * d + j, dtype,
				       dos_load_elem(tok, t + j, dtype) + dos_load_elem(pos, p + j, dtype));
	}
}

void _dos_embed_bwd_cpu(const int32_t *ids, const void *dx, float *dtok, float *dpos, size_t n, size_t T, size_t d,
			size_t V, int accumulate, enum dos_dtype dtype)
{
	check_dtype(dtype, __func__);
	if (!accumulate) {
		memset(dtok, 0, V * d * sizeof(float));
		memset(dpos, 0, T * d * sizeof(float));
	}
	/* Token order: the sum into a row of dtok hit by several tokens is the same anywhere. */
	for (size_t i = 0; i < n; i++) {
		float *t = dtok + (size_t)ids[i] * d, *p = dpos + (i % T) * d;
		for (size_t j = 0; j < d; j++) {
			const float g = dos_load_elem(dx, i * d + j, dtype);
			t[j] += g;
			p[j] += g;
		}
	}
}

/* ---- RMSNorm --------------------------------------------------------------------------- */

/* 1 / sqrtf(mean of squares + eps) of row i: sum left to right in float, then / d. */
static float row_rstd(const void *x, size_t i, size_t d, enum dos_dtype dtype)
{
	float ss = 0.0f;
	for (size_t j = 0; j < d; j++) {
		const float xj = dos_load_elem(x, i * d + j, dtype);
		ss += xj * xj;
	}
	return 1.0f / sqrtf(ss / (float)d + DOS_RMSNORM_EPS);
}

void _dos_rmsnorm_fwd_cpu(const void *x, const void *w, void *y, float *rstd, size_t n, size_t d, enum dos_dtype dtype)
{
	check_dtype(dtype, __func__);
	for (size_t i = 0; i < n; i++) {
		const float r = row_rstd(x, i, d, dtype);
		rstd[i] = r;
		for (size_t j = 0; j < d; j++)
			dos_store_elem(y, i * d + j, dtype,
				       dos_load_elem(x, i * d + j, dtype) * r * dos_load_elem(w, j, dtype));
	}
}

/* y_j = x_j r w_j with r = (mean(x^2) + eps)^-1/2, dr/dx_k = -r^3 x_k / d, so
 *   dx_k = (w_k dy_k) r - x_k c,  c = (sum_j (w_j dy_j) x_j) / d * r^3,
 *   dw_j = sum over tokens of dy_j x_j r. */
void _dos_rmsnorm_bwd_cpu(const void *x, const void *w, const float *rstd, const void *dy, void *dx, float *dw,
			  size_t n, size_t d, int accumulate_dx, int accumulate_dw, enum dos_dtype dtype)
{
	check_dtype(dtype, __func__);
	if (!accumulate_dw)
		memset(dw, 0, d * sizeof(float));
	for (size_t i = 0; i < n; i++) {
		const size_t row = i * d;
		const float r = rstd[i];
		float dot = 0.0f;
		for (size_t j = 0; j < d; j++)
			dot += dos_load_elem(w, j, dtype) * dos_load_elem(dy, row + j, dtype) *
			       dos_load_elem(x, row + j, dtype);
		const float c = dot / (float)d * (r * r * r);
		for (size_t j = 0; j < d; j++) {
			const float g = dos_load_elem(w, j, dtype) * dos_load_elem(dy, row + j, dtype) * r -
					dos_load_elem(x, row + j, dtype) * c;
			dos_store_elem(dx, row + j, dtype, accumulate_dx ? dos_load_elem(dx, row + j, dtype) + g : g);
		}
		/* dw in token order (this loop over i is the reduction). */
		for (size_t j = 0; j < d; j++)
			dw[j] += dos_load_elem(dy, row + j, dtype) * dos_load_elem(x, row + j, dtype) * r;
	}
}

/* ---- linear layers --------------------------------------------------------------------- */

void _dos_linear_fwd_cpu(const void *x, const void *w, const void *residual, void *y, size_t n, size_t in, size_t out,
			 enum dos_dtype dtype)
{
	check_dtype(dtype, __func__);
	if (residual && residual != y)
		memcpy(y, residual, n * out * dos_dtype_size(dtype));
	gemm_dt(0, 1, n, out, in, 1.0f, x, dtype, in, w, dtype, in, residual ? 1.0f : 0.0f, y, dtype, out);
}

void _dos_linear_bwd_data_cpu(const void *dy, const void *w, void *dx, size_t n, size_t in, size_t out, int accumulate,
			      enum dos_dtype dtype)
{
	check_dtype(dtype, __func__);
	gemm_dt(0, 0, n, in, out, 1.0f, dy, dtype, out, w, dtype, in, accumulate ? 1.0f : 0.0f, dx, dtype, in);
}

void _dos_linear_bwd_weight_cpu(const void *dy, const void *x, float *dw, size_t n, size_t in, size_t out,
				int accumulate, enum dos_dtype dtype)
{
	check_dtype(dtype, __func__);
	gemm_dt(1, 0, out, in, n, 1.0f, dy, dtype, out, x, dtype, in, accumulate ? 1.0f : 0.0f, dw, DOS_FP32, in);
}

/* ---- causal attention ------------------------------------------------------------------ */

/* Row i of the [T, T] block s holds the scaled scores; replaces columns 0..i by their
 * softmax (max, then exp and sum left to right, then divide) and the rest by 0. */
static void causal_softmax(float *s, size_t T)
{
	for (size_t i = 0; i < T; i++) {
		float *row = s + i * T;
		float m = row[0];
		for (size_t j = 1; j <= i; j++)
			if (row[j] > m)
				m = row[j];
		float sum = 0.0f;
		for (size_t j = 0; j <= i; j++) {
			row[j] = expf(row[j] - m);
			sum += row[j];
		}
		for (size_t j = 0; j <= i; j++)
			row[j] = row[j] / sum;
		for (size_t j = i + 1; j < T; j++)
			row[j] = 0.0f;
	}
}

/* Per sequence b and head h, with q, k, v the [T, hd] column blocks (leading dimension 3d)
 * of qkv: probs = causal_softmax(q k^T / sqrt(hd)), out block = probs v. The products run
 * over the full [T, T] block (the zeros above the diagonal cost a factor of 2, not an
 * order). In 16 bits the scores and the softmax stay in an fp32 scratch block and only
 * the probabilities are rounded, once, into probs. */
void _dos_attention_fwd_cpu(const void *qkv, void *out, void *probs, size_t B, size_t T, size_t H, size_t hd,
			    enum dos_dtype dtype)
{
	check_dtype(dtype, __func__);
	const size_t d = H * hd, ld = 3 * d;
	const float scale = 1.0f / sqrtf((float)hd);
	float *scores = dtype == DOS_FP32 ? NULL : scratch_alloc(T * T * sizeof(float));
	for (size_t b = 0; b < B; b++)
		for (size_t h = 0; h < H; h++) {
			const size_t q = b * T * ld + h * hd, k = q + d, v = q + 2 * d;
			void *p = at_mut(probs, (b * H + h) * T * T, dtype);
			float *s = scores ? scores : p;
			gemm_dt(0, 1, T, T, hd, scale, at(qkv, q, dtype), dtype, ld, at(qkv, k, dtype), dtype, ld, 0.0f,
				s, DOS_FP32, T);
			causal_softmax(s, T);
			if (scores)
				narrow_block(scores, p, dtype, T, T, T);
			gemm_dt(0, 0, T, hd, T, 1.0f, p, dtype, T, at(qkv, v, dtype), dtype, ld, 0.0f,
				at_mut(out, b * T * d + h * hd, dtype), dtype, d);
		}
	free(scores);
}

/* With S = scale q k^T, P = softmax(S), O = P v and G = dO:
 *   dv = P^T G,  dP = G v^T,  dS_ij = P_ij (dP_ij - sum_k P_ik dP_ik),
 *   dq = scale dS k,  dk = scale dS^T q.
 * dP and dS are computed in fp32; in 16 bits dS is rounded to the dtype before its two
 * products, as a GPU must (its 16-bit products take 16-bit operands only). */
void _dos_attention_bwd_cpu(const void *qkv, const void *probs, const void *dout, void *dqkv, size_t B, size_t T,
			    size_t H, size_t hd, enum dos_dtype dtype)
{
	check_dtype(dtype, __func__);
	const size_t d = H * hd, ld = 3 * d;
	const float scale = 1.0f / sqrtf((float)hd);
	float *ds = scratch_alloc(T * T * sizeof(float));
	for (size_t b = 0; b < B; b++)
		for (size_t h = 0; h < H; h++) {
			const size_t q = b * T * ld + h * hd, k = q + d, v = q + 2 * d;
			const size_t p = (b * H + h) * T * T, g = b * T * d + h * hd;
			gemm_dt(1, 0, T, hd, T, 1.0f, at(probs, p, dtype), dtype, T, at(dout, g, dtype), dtype, d, 0.0f,
				at_mut(dqkv, v, dtype), dtype, ld);
			gemm_dt(0, 1, T, T, hd, 1.0f, at(dout, g, dtype), dtype, d, at(qkv, v, dtype), dtype, ld, 0.0f,
				ds, DOS_FP32, T);
			for (size_t i = 0; i < T; i++) {
				const size_t pi = p + i * T;
				float *row = ds + i * T;
				float dot = 0.0f;
				for (size_t j = 0; j <= i; j++)
					dot += dos_load_elem(probs, pi + j, dtype) * row[j];
				for (size_t j = 0; j <= i; j++)
					row[j] = dos_round_elem(dos_load_elem(probs, pi + j, dtype) * (row[j] - dot),
								dtype);
				for (size_t j = i + 1; j < T; j++)
					row[j] = 0.0f;
			}
			gemm_dt(0, 0, T, hd, T, scale, ds, DOS_FP32, T, at(qkv, k, dtype), dtype, ld, 0.0f,
				at_mut(dqkv, q, dtype), dtype, ld);
			gemm_dt(1, 0, T, hd, T, scale, ds, DOS_FP32, T, at(qkv, q, dtype), dtype, ld, 0.0f,
				at_mut(dqkv, k, dtype), dtype, ld);
		}
	free(ds);
}

/* ---- GELU ------------------------------------------------------------------------------ */

#define DOS_INV_SQRT2 0.70710678118654752440f    /* 1 / sqrt(2) */
#define DOS_INV_SQRT_2PI 0.39894228040143267794f /* 1 / sqrt(2 pi) */

void _dos_gelu_fwd_cpu(const void *x, void *y, size_t n, enum dos_dtype dtype)
{
	check_dtype(dtype, __func__);
	for (size_t i = 0; i < n; i++) {
		const float u = dos_load_elem(x, i, dtype);
		dos_store_elem(y, i, dtype, 0.5f * u * (1.0f + erff(u * DOS_INV_SQRT2)));
	}
}

/* gelu'(x) = Phi(x) + x phi(x), Phi and phi the normal cdf and pdf. */
void _dos_gelu_bwd_cpu(const void *x, const void *dy, void *dx, size_t n, enum dos_dtype dtype)
{
	check_dtype(dtype, __func__);
	for (size_t i = 0; i < n; i++) {
		const float u = dos_load_elem(x, i, dtype);
		const float cdf = 0.5f * (1.0f + erff(u * DOS_INV_SQRT2));
		const float pdf = DOS_INV_SQRT_2PI * expf(-0.5f * u * u);
		dos_store_elem(dx, i, dtype, dos_load_elem(dy, i, dtype) * (cdf + u * pdf));
	}
}

/* ---- cross-entropy --------------------------------------------------------------------- */

/* Per row: max, sum of exp(l - max) left to right, loss = max + log(sum) - l[target],
 * dlogits = (exp(l - max) / sum - onehot) * grad_scale. A target outside [0, V) gives a NaN
 * loss and no onehot term (never an out-of-bounds read). In 16 bits the logits are widened,
 * all of this runs in float, the loss stays fp32 and each dlogit is rounded once. */
void _dos_xent_cpu(const void *logits, const int32_t *targets, float *loss, void *dlogits, size_t n, size_t V,
		   float grad_scale, enum dos_dtype dtype)
{
	check_dtype(dtype, __func__);
	for (size_t i = 0; i < n; i++) {
		const size_t row = i * V;
		const int32_t t = targets[i];
		const int valid = t >= 0 && (size_t)t < V;
		if (V == 0) {
			loss[i] = NAN;
			continue;
		}
		float m = dos_load_elem(logits, row, dtype);
		for (size_t j = 1; j < V; j++)
			if (dos_load_elem(logits, row + j, dtype) > m)
				m = dos_load_elem(logits, row + j, dtype);
		float sum = 0.0f;
		for (size_t j = 0; j < V; j++)
			sum += expf(dos_load_elem(logits, row + j, dtype) - m);
		loss[i] = valid ? m + logf(sum) - dos_load_elem(logits, row + (size_t)t, dtype) : NAN;
		for (size_t j = 0; j < V; j++) {
			const float prob = expf(dos_load_elem(logits, row + j, dtype) - m) / sum;
			dos_store_elem(dlogits, row + j, dtype,
				       (valid && j == (size_t)t ? prob - 1.0f : prob) * grad_scale);
		}
	}
}
