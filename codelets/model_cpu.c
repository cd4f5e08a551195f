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
 * BLAS libraries and are not meant to be. */
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "config.h"
#include "model_kernels.h"

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

/* ---- embeddings ------------------------------------------------------------------------ */

void _dos_embed_fwd_cpu(const int32_t *ids, const float *tok, const float *pos, float *x, size_t n, size_t T, size_t d)
{
	for (size_t i = 0; i < n; i++) {
		const float *t = tok + (size_t)ids[i] * d, *p = pos + (i % T) * d;
		float *row = x + i * d;
		for (size_t j = 0; j < d; j++)
			row[j] = t[j] + p[j];
	}
}

void _dos_embed_bwd_cpu(const int32_t *ids, const float *dx, float *dtok, float *dpos, size_t n, size_t T, size_t d,
			size_t V, int accumulate)
{
	if (!accumulate) {
		memset(dtok, 0, V * d * sizeof(float));
		memset(dpos, 0, T * d * sizeof(float));
	}
	/* Token order: the sum into a row of dtok hit by several tokens is the same anywhere. */
	for (size_t i = 0; i < n; i++) {
		const float *g = dx + i * d;
		float *t = dtok + (size_t)ids[i] * d, *p = dpos + (i % T) * d;
		for (size_t j = 0; j < d; j++) {
			t[j] += g[j];
			p[j] += g[j];
		}
	}
}

/* ---- RMSNorm --------------------------------------------------------------------------- */

/* 1 / sqrtf(mean of squares + eps) of one row: sum left to right in float, then / d. */
static float row_rstd(const float *x, size_t d)
{
	float ss = 0.0f;
	for (size_t j = 0; j < d; j++)
		ss += x[j] * x[j];
	return 1.0f / sqrtf(ss / (float)d + DOS_RMSNORM_EPS);
}

void _dos_rmsnorm_fwd_cpu(const float *x, const float *w, float *y, float *rstd, size_t n, size_t d)
{
	for (size_t i = 0; i < n; i++) {
		const float *xi = x + i * d;
		float *yi = y + i * d;
		const float r = row_rstd(xi, d);
		rstd[i] = r;
		for (size_t j = 0; j < d; j++)
			yi[j] = xi[j] * r * w[j];
	}
}

/* y_j = x_j r w_j with r = (mean(x^2) + eps)^-1/2, dr/dx_k = -r^3 x_k / d, so
 *   dx_k = (w_k dy_k) r - x_k c,  c = (sum_j (w_j dy_j) x_j) / d * r^3,
 *   dw_j = sum over tokens of dy_j x_j r. */
void _dos_rmsnorm_bwd_cpu(const float *x, const float *w, const float *rstd, const float *dy, float *dx, float *dw,
			  size_t n, size_t d, int accumulate_dx, int accumulate_dw)
{
	if (!accumulate_dw)
		memset(dw, 0, d * sizeof(float));
	for (size_t i = 0; i < n; i++) {
		const float *xi = x + i * d, *gi = dy + i * d;
		float *dxi = dx + i * d;
		const float r = rstd[i];
		float dot = 0.0f;
		for (size_t j = 0; j < d; j++)
			dot += w[j] * gi[j] * xi[j];
		const float c = dot / (float)d * (r * r * r);
		for (size_t j = 0; j < d; j++) {
			const float g = w[j] * gi[j] * r - xi[j] * c;
			dxi[j] = accumulate_dx ? dxi[j] + g : g;
		}
		/* dw in token order (this loop over i is the reduction). */
		for (size_t j = 0; j < d; j++)
			dw[j] += gi[j] * xi[j] * r;
	}
}

/* ---- linear layers --------------------------------------------------------------------- */

void _dos_linear_fwd_cpu(const float *x, const float *w, const float *residual, float *y, size_t n, size_t in,
			 size_t out)
{
	if (residual && residual != y)
		memcpy(y, residual, n * out * sizeof(float));
	gemm(0, 1, n, out, in, 1.0f, x, in, w, in, residual ? 1.0f : 0.0f, y, out);
}

void _dos_linear_bwd_data_cpu(const float *dy, const float *w, float *dx, size_t n, size_t in, size_t out,
			      int accumulate)
{
	gemm(0, 0, n, in, out, 1.0f, dy, out, w, in, accumulate ? 1.0f : 0.0f, dx, in);
}

void _dos_linear_bwd_weight_cpu(const float *dy, const float *x, float *dw, size_t n, size_t in, size_t out,
				int accumulate)
{
	gemm(1, 0, out, in, n, 1.0f, dy, out, x, in, accumulate ? 1.0f : 0.0f, dw, in);
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
 * order). */
void _dos_attention_fwd_cpu(const float *qkv, float *out, float *probs, size_t B, size_t T, size_t H, size_t hd)
{
	const size_t d = H * hd, ld = 3 * d;
	const float scale = 1.0f / sqrtf((float)hd);
	for (size_t b = 0; b < B; b++)
		for (size_t h = 0; h < H; h++) {
			const float *q = qkv + b * T * ld + h * hd, *k = q + d, *v = q + 2 * d;
			float *p = probs + (b * H + h) * T * T;
			gemm(0, 1, T, T, hd, scale, q, ld, k, ld, 0.0f, p, T);
			causal_softmax(p, T);
			gemm(0, 0, T, hd, T, 1.0f, p, T, v, ld, 0.0f, out + b * T * d + h * hd, d);
		}
}

/* With S = scale q k^T, P = softmax(S), O = P v and G = dO:
 *   dv = P^T G,  dP = G v^T,  dS_ij = P_ij (dP_ij - sum_k P_ik dP_ik),
 *   dq = scale dS k,  dk = scale dS^T q. */
void _dos_attention_bwd_cpu(const float *qkv, const float *probs, const float *dout, float *dqkv, size_t B, size_t T,
			    size_t H, size_t hd)
{
	const size_t d = H * hd, ld = 3 * d;
	const float scale = 1.0f / sqrtf((float)hd);
	float *ds = scratch_alloc(T * T * sizeof(float));
	for (size_t b = 0; b < B; b++)
		for (size_t h = 0; h < H; h++) {
			const float *q = qkv + b * T * ld + h * hd, *k = q + d, *v = q + 2 * d;
			const float *p = probs + (b * H + h) * T * T, *g = dout + b * T * d + h * hd;
			float *dq = dqkv + b * T * ld + h * hd, *dk = dq + d, *dv = dq + 2 * d;
			gemm(1, 0, T, hd, T, 1.0f, p, T, g, d, 0.0f, dv, ld);
			gemm(0, 1, T, T, hd, 1.0f, g, d, v, ld, 0.0f, ds, T);
			for (size_t i = 0; i < T; i++) {
				const float *pi = p + i * T;
				float *row = ds + i * T;
				float dot = 0.0f;
				for (size_t j = 0; j <= i; j++)
					dot += pi[j] * row[j];
				for (size_t j = 0; j <= i; j++)
					row[j] = pi[j] * (row[j] - dot);
				for (size_t j = i + 1; j < T; j++)
					row[j] = 0.0f;
			}
			gemm(0, 0, T, hd, T, scale, ds, T, k, ld, 0.0f, dq, ld);
			gemm(1, 0, T, hd, T, scale, ds, T, q, ld, 0.0f, dk, ld);
		}
	free(ds);
}

/* ---- GELU ------------------------------------------------------------------------------ */

#define DOS_INV_SQRT2 0.70710678118654752440f    /* 1 / sqrt(2) */
#define DOS_INV_SQRT_2PI 0.39894228040143267794f /* 1 / sqrt(2 pi) */

void _dos_gelu_fwd_cpu(const float *x, float *y, size_t n)
{
	for (size_t i = 0; i < n; i++)
		y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * DOS_INV_SQRT2));
}

/* gelu'(x) = Phi(x) + x phi(x), Phi and phi the normal cdf and pdf. */
void _dos_gelu_bwd_cpu(const float *x, const float *dy, float *dx, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		const float cdf = 0.5f * (1.0f + erff(x[i] * DOS_INV_SQRT2));
		const float pdf = DOS_INV_SQRT_2PI * expf(-0.5f * x[i] * x[i]);
		dx[i] = dy[i] * (cdf + x[i] * pdf);
	}
}

/* ---- cross-entropy --------------------------------------------------------------------- */

/* Per row: max, sum of exp(l - max) left to right, loss = max + log(sum) - l[target],
 * dlogits = (exp(l - max) / sum - onehot) * grad_scale. A target outside [0, V) gives a NaN
 * loss and no onehot term (never an out-of-bounds read). */
void _dos_xent_cpu(const float *logits, const int32_t *targets, float *loss, float *dlogits, size_t n, size_t V,
		   float grad_scale)
{
	for (size_t i = 0; i < n; i++) {
		const float *l = logits + i * V;
		float *g = dlogits + i * V;
		const int32_t t = targets[i];
		const int valid = t >= 0 && (size_t)t < V;
		if (V == 0) {
			loss[i] = NAN;
			continue;
		}
		float m = l[0];
		for (size_t j = 1; j < V; j++)
			if (l[j] > m)
				m = l[j];
		float sum = 0.0f;
		for (size_t j = 0; j < V; j++)
			sum += expf(l[j] - m);
		loss[i] = valid ? m + logf(sum) - l[t] : NAN;
		for (size_t j = 0; j < V; j++) {
			const float prob = expf(l[j] - m) / sum;
			g[j] = (valid && j == (size_t)t ? prob - 1.0f : prob) * grad_scale;
		}
	}
}
