/* CUDA kernels of the example model (docs/model.md, interface in model_kernels.h).
 * Compiled with -fmad=false -prec-div=true -prec-sqrt=true -ftz=false, so every kernel
 * that does not call a transcendental function computes what the plain C loop of
 * model_cpu.c computes, bit for bit, as long as both evaluate the same expression in the
 * same order. The orders are fixed here and must stay in step with model_cpu.c:
 *
 * - Reductions over tokens (embedding backward into dtok/dpos, rmsnorm's dw) run
 *   sequentially in increasing token order, starting from 0.0f (or from the existing
 *   value when accumulating): one thread owns an output element and loops over tokens.
 * - Per-row reductions (rmsnorm's mean of squares and its backward dot product, the
 *   softmax max and sum, logsumexp, the attention backward row dot product) are a plain
 *   left-to-right float loop over the row: lane 0 of a warp does it while the other lanes
 *   wait, then the whole warp writes the row's outputs, each element computed with the
 *   same expression as the CPU's. A faster deterministic version would split each row into
 *   fixed lane-strided partial sums combined in a fixed tree (as grad_stats does), which
 *   changes the order, so the CPU would have to adopt the same order.
 * - expf/erff/logf are CUDA's, not glibc's: they are within an ulp or two but not
 *   correctly rounded, so GELU, softmax, cross-entropy and attention can differ from the
 *   CPU in the last bits even though the order of operations is the same.
 * - Products go through cuBLAS (column-major; the row-major matrices here are read as
 *   their transposes) and their summation order is cuBLAS's: they match the CPU's OpenBLAS
 *   only to rounding. TF32 stays off: the handle keeps its default math mode (never
 *   CUBLAS_TF32_TENSOR_OP_MATH), and NVIDIA_TF32_OVERRIDE must not be set for this process
 *   (it overrides the libraries' TF32 choices process-wide; 0, which forbids TF32, would be
 *   harmless, but nothing here should depend on it). alpha and beta are host scalars: the
 *   handle must be in the default host pointer mode.
 *
 * Every function enqueues its work on `stream` (the cuBLAS handle must already be bound to
 * it: StarPU's local handle is bound to StarPU's local stream), checks every launch and
 * returns the first error; none synchronises. */
#include <climits>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "model_kernels.h"

static const int threads_per_block = 256;
static const unsigned warp_size = 32;
static const unsigned full_mask = 0xffffffffu;
/* Grid-stride loops: enough blocks to fill any current GPU several times over. */
static const size_t max_blocks = 8192;

static unsigned blocks_for(size_t work_items)
{
	size_t b = (work_items + threads_per_block - 1) / threads_per_block;
	return (unsigned)(b < max_blocks ? (b ? b : 1) : max_blocks);
}

/* Blocks for one warp per row. */
static unsigned blocks_for_rows(size_t rows)
{
	return blocks_for(rows * warp_size);
}

__device__ __forceinline__ size_t global_thread(void)
{
	return blockIdx.x * (size_t)blockDim.x + threadIdx.x;
}

__device__ __forceinline__ size_t thread_count(void)
{
	return (size_t)gridDim.x * blockDim.x;
}

/* ---- embedding ---------------------------------------------------------------------- */

__global__ void embed_fwd_kernel(const int32_t *ids, const float *tok, const float *pos, float *x, size_t n, size_t T,
				 size_t d)
{
	for (size_t e = global_thread(); e < n * d; e += thread_count()) {
		size_t i = e / d, j = e % d;
		x[e] = tok[(size_t)ids[i] * d + j] + pos[(i % T) * d + j];
	}
}

extern "C" cudaError_t _dos_embed_fwd_cuda(const int32_t *ids, const float *tok, const float *pos, float *x, size_t n,
					   size_t T, size_t d, cudaStream_t stream)
{
	if (n == 0 || d == 0)
		return cudaSuccess;
	if (T == 0)
		return cudaErrorInvalidValue;
	embed_fwd_kernel<<<blocks_for(n * d), threads_per_block, 0, stream>>>(ids, tok, pos, x, n, T, d);
	return cudaGetLastError();
}

/* One thread per column of dtok: it adds the rows of dx in increasing token order, so
 * every element of dtok sees the CPU's order. Ids outside [0, V) are skipped (the CPU
 * would write out of bounds: callers never pass them). Only d threads: a faster
 * deterministic version would first sort the token indices by id (a stable counting sort)
 * and give each (id, column) its own thread summing its tokens in increasing order. */
__global__ void embed_bwd_tok_kernel(const int32_t *ids, const float *dx, float *dtok, size_t n, size_t d, size_t V)
{
	for (size_t j = global_thread(); j < d; j += thread_count())
		for (size_t i = 0; i < n; i++) {
			int32_t id = ids[i];
			if (id >= 0 && (size_t)id < V)
				dtok[(size_t)id * d + j] += dx[i * d + j];
		}
}

/* One thread per element (t, j) of dpos: tokens t, T + t, 2T + t, ... in increasing order,
 * the order in which the CPU's single pass over tokens reaches dpos[t, j]. */
__global__ void embed_bwd_pos_kernel(const float *dx, float *dpos, size_t n, size_t T, size_t d)
{
	for (size_t e = global_thread(); e < T * d; e += thread_count()) {
		float acc = dpos[e];
		for (size_t i = e / d; i < n; i += T)
			acc += dx[i * d + e % d];
		dpos[e] = acc;
	}
}

extern "C" cudaError_t _dos_embed_bwd_cuda(const int32_t *ids, const float *dx, float *dtok, float *dpos, size_t n,
					   size_t T, size_t d, size_t V, int accumulate, cudaStream_t stream)
{
	cudaError_t err;
	if (d == 0)
		return cudaSuccess;
	if (T == 0)
		return cudaErrorInvalidValue;
	if (!accumulate) {
		if (V && (err = cudaMemsetAsync(dtok, 0, V * d * sizeof(float), stream)) != cudaSuccess)
			return err;
		if ((err = cudaMemsetAsync(dpos, 0, T * d * sizeof(float), stream)) != cudaSuccess)
			return err;
	}
	if (n == 0)
		return cudaSuccess;
	if (V) {
		embed_bwd_tok_kernel<<<blocks_for(d), threads_per_block, 0, stream>>>(ids, dx, dtok, n, d, V);
		if ((err = cudaGetLastError()) != cudaSuccess)
			return err;
	}
	embed_bwd_pos_kernel<<<blocks_for(T * d), threads_per_block, 0, stream>>>(dx, dpos, n, T, d);
	return cudaGetLastError();
}

/* ---- RMSNorm ------------------------------------------------------------------------ */

/* One warp per row. CPU order:
 *   ss = 0; for j: ss += x[j] * x[j];   r = 1.0f / sqrtf(ss / (float)d + EPS);
 *   y[j] = x[j] * r * w[j]              (i.e. (x[j] * r) * w[j]) */
__global__ void rmsnorm_fwd_kernel(const float *x, const float *w, float *y, float *rstd, size_t n, size_t d)
{
	const unsigned lane = threadIdx.x % warp_size;
	for (size_t i = global_thread() / warp_size; i < n; i += thread_count() / warp_size) {
		const float *xr = x + i * d;
		float r = 0.0f;
		if (lane == 0) {
			float ss = 0.0f;
			for (size_t j = 0; j < d; j++)
				ss += xr[j] * xr[j];
			r = 1.0f / sqrtf(ss / (float)d + DOS_RMSNORM_EPS);
			rstd[i] = r;
		}
		r = __shfl_sync(full_mask, r, 0);
		for (size_t j = lane; j < d; j += warp_size)
			y[i * d + j] = xr[j] * r * w[j];
	}
}

extern "C" cudaError_t _dos_rmsnorm_fwd_cuda(const float *x, const float *w, float *y, float *rstd, size_t n, size_t d,
					     cudaStream_t stream)
{
	if (n == 0 || d == 0)
		return cudaSuccess;
	rmsnorm_fwd_kernel<<<blocks_for_rows(n), threads_per_block, 0, stream>>>(x, w, y, rstd, n, d);
	return cudaGetLastError();
}

/* dx, one warp per row. With r = (mean(x^2) + eps)^-1/2, dr/dx_k = -r^3 x_k / d, so
 *   dx_k = (w_k dy_k) r - x_k c,  c = (sum_j (w_j dy_j) x_j) / d * r^3.
 * CPU order:
 *   dot = 0; for j: dot += w[j] * dy[j] * x[j];         (i.e. (w[j] * dy[j]) * x[j])
 *   c = dot / (float)d * (r * r * r);
 *   v = w[j] * dy[j] * r - x[j] * c;   dx[j] = v  or  dx[j] += v */
__global__ void rmsnorm_bwd_dx_kernel(const float *x, const float *w, const float *rstd, const float *dy, float *dx,
				      size_t n, size_t d, int accumulate)
{
	const unsigned lane = threadIdx.x % warp_size;
	for (size_t i = global_thread() / warp_size; i < n; i += thread_count() / warp_size) {
		const float *xr = x + i * d, *dyr = dy + i * d;
		const float r = rstd[i];
		float c = 0.0f;
		if (lane == 0) {
			float dot = 0.0f;
			for (size_t j = 0; j < d; j++)
				dot += w[j] * dyr[j] * xr[j];
			c = dot / (float)d * (r * r * r);
		}
		c = __shfl_sync(full_mask, c, 0);
		for (size_t j = lane; j < d; j += warp_size) {
			const float v = w[j] * dyr[j] * r - xr[j] * c;
			dx[i * d + j] = accumulate ? dx[i * d + j] + v : v;
		}
	}
}

/* dw, one thread per column, tokens in increasing order:
 *   acc = accumulate ? dw[j] : 0.0f; for i: acc += dy[i, j] * x[i, j] * rstd[i]; dw[j] = acc */
__global__ void rmsnorm_bwd_dw_kernel(const float *x, const float *rstd, const float *dy, float *dw, size_t n, size_t d,
				      int accumulate)
{
	for (size_t j = global_thread(); j < d; j += thread_count()) {
		float acc = accumulate ? dw[j] : 0.0f;
		for (size_t i = 0; i < n; i++)
			acc += dy[i * d + j] * x[i * d + j] * rstd[i];
		dw[j] = acc;
	}
}

extern "C" cudaError_t _dos_rmsnorm_bwd_cuda(const float *x, const float *w, const float *rstd, const float *dy,
					     float *dx, float *dw, size_t n, size_t d, int accumulate_dx,
					     int accumulate_dw, cudaStream_t stream)
{
	cudaError_t err;
	if (d == 0)
		return cudaSuccess;
	if (n) {
		rmsnorm_bwd_dx_kernel<<<blocks_for_rows(n), threads_per_block, 0, stream>>>(x, w, rstd, dy, dx, n, d,
											    accumulate_dx);
		if ((err = cudaGetLastError()) != cudaSuccess)
			return err;
	}
	rmsnorm_bwd_dw_kernel<<<blocks_for(d), threads_per_block, 0, stream>>>(x, rstd, dy, dw, n, d, accumulate_dw);
	return cudaGetLastError();
}

/* ---- linear layers (cuBLAS) --------------------------------------------------------- */

static bool fits_int(size_t v)
{
	return v <= (size_t)INT_MAX;
}

static cublasStatus_t status_of(cudaError_t err)
{
	return err == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

/* The stream `blas` is bound to, for the few copies around a product. */
static cublasStatus_t stream_of(cublasHandle_t blas, cudaStream_t *stream)
{
	return cublasGetStream(blas, stream);
}

/* C[rows, cols] (row-major) = 0 when !accumulate: a product with an empty inner dimension. */
static cublasStatus_t empty_product(cublasHandle_t blas, float *c, size_t rows, size_t cols, int accumulate)
{
	cudaStream_t stream;
	cublasStatus_t st = stream_of(blas, &stream);
	if (st != CUBLAS_STATUS_SUCCESS || accumulate || rows * cols == 0)
		return st;
	return status_of(cudaMemsetAsync(c, 0, rows * cols * sizeof(float), stream));
}

/* Row-major y[n, out] = x[n, in] @ w[out, in]^T is, column-major, y^T[out, n] =
 * op_T(w^T)[out, in] @ x^T[in, n] where w^T (ld in) and x^T (ld in) are the same bytes. */
extern "C" cublasStatus_t _dos_linear_fwd_cuda(cublasHandle_t blas, const float *x, const float *w,
					       const float *residual, float *y, size_t n, size_t in, size_t out,
					       cudaStream_t stream)
{
	cudaStream_t bound;
	cublasStatus_t st = stream_of(blas, &bound);
	if (st != CUBLAS_STATUS_SUCCESS)
		return st;
	if (bound != stream) /* the copy and the product would race */
		return CUBLAS_STATUS_INVALID_VALUE;
	if (n == 0 || out == 0)
		return CUBLAS_STATUS_SUCCESS;
	if (!fits_int(n) || !fits_int(in) || !fits_int(out))
		return CUBLAS_STATUS_INVALID_VALUE;
	/* residual == y is the in-place residual update: nothing to copy */
	if (residual && residual != y) {
		cudaError_t err =
			cudaMemcpyAsync(y, residual, n * out * sizeof(float), cudaMemcpyDeviceToDevice, stream);
		if (err != cudaSuccess)
			return status_of(err);
	}
	if (in == 0)
		return empty_product(blas, y, n, out, residual != NULL);
	const float alpha = 1.0f, beta = residual ? 1.0f : 0.0f;
	return cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)out, (int)n, (int)in, &alpha, w, (int)in, x, (int)in,
			   &beta, y, (int)out);
}

/* Row-major dx[n, in] = dy[n, out] @ w[out, in]: column-major dx^T[in, n] = w^T[in, out] @
 * dy^T[out, n], both operands as stored. */
extern "C" cublasStatus_t _dos_linear_bwd_data_cuda(cublasHandle_t blas, const float *dy, const float *w, float *dx,
						    size_t n, size_t in, size_t out, int accumulate)
{
	if (n == 0 || in == 0)
		return CUBLAS_STATUS_SUCCESS;
	if (!fits_int(n) || !fits_int(in) || !fits_int(out))
		return CUBLAS_STATUS_INVALID_VALUE;
	if (out == 0)
		return empty_product(blas, dx, n, in, accumulate);
	const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
	return cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)in, (int)n, (int)out, &alpha, w, (int)in, dy, (int)out,
			   &beta, dx, (int)in);
}

/* Row-major dw[out, in] = dy[n, out]^T @ x[n, in]: column-major dw^T[in, out] = x^T[in, n] @
 * op_T(dy^T)[n, out]. */
extern "C" cublasStatus_t _dos_linear_bwd_weight_cuda(cublasHandle_t blas, const float *dy, const float *x, float *dw,
						      size_t n, size_t in, size_t out, int accumulate)
{
	if (in == 0 || out == 0)
		return CUBLAS_STATUS_SUCCESS;
	if (!fits_int(n) || !fits_int(in) || !fits_int(out))
		return CUBLAS_STATUS_INVALID_VALUE;
	if (n == 0)
		return empty_product(blas, dw, out, in, accumulate);
	const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
	return cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, (int)in, (int)out, (int)n, &alpha, x, (int)in, dy, (int)out,
			   &beta, dw, (int)in);
}

/* ---- attention ---------------------------------------------------------------------- */

/* The attention functions return cudaError_t: cuBLAS failures are translated. */
static cudaError_t cuda_error_of(cublasStatus_t st)
{
	switch (st) {
	case CUBLAS_STATUS_SUCCESS:
		return cudaSuccess;
	case CUBLAS_STATUS_ALLOC_FAILED:
		return cudaErrorMemoryAllocation;
	case CUBLAS_STATUS_INVALID_VALUE:
		return cudaErrorInvalidValue;
	case CUBLAS_STATUS_NOT_SUPPORTED:
	case CUBLAS_STATUS_ARCH_MISMATCH:
		return cudaErrorNotSupported;
	case CUBLAS_STATUS_NOT_INITIALIZED:
		return cudaErrorInitializationError;
	default:
		return cudaErrorUnknown;
	}
}

static cudaError_t check_attention_args(cublasHandle_t blas, size_t T, size_t H, size_t hd, cudaStream_t stream)
{
	cudaStream_t bound;
	cublasStatus_t st = stream_of(blas, &bound);
	if (st != CUBLAS_STATUS_SUCCESS)
		return cuda_error_of(st);
	if (bound != stream) /* the products and the kernels would race */
		return cudaErrorInvalidValue;
	/* hd == 0 (an empty model) has no sensible softmax: refused */
	if (hd == 0 || !fits_int(T) || !fits_int(H) || !fits_int(3 * H * hd))
		return cudaErrorInvalidValue;
	return cudaSuccess;
}

/* A strided batch over the H heads of one sequence (C = alpha op(A) op(B), beta = 0). */
static cudaError_t gemm_heads(cublasHandle_t blas, cublasOperation_t ta, cublasOperation_t tb, size_t m, size_t n,
			      size_t k, float alpha, const float *a, size_t lda, size_t stride_a, const float *b,
			      size_t ldb, size_t stride_b, float *c, size_t ldc, size_t stride_c, size_t H)
{
	const float beta = 0.0f;
	return cuda_error_of(cublasSgemmStridedBatched(blas, ta, tb, (int)m, (int)n, (int)k, &alpha, a, (int)lda,
						       (long long)stride_a, b, (int)ldb, (long long)stride_b, &beta, c,
						       (int)ldc, (long long)stride_c, (int)H));
}

/* Causal softmax in place on rows of scores [rows = B*H*T, T], one warp per row; row r is
 * query position i = r % T. CPU order over j = 0..i:
 *   m = s[0]; for j >= 1: if (s[j] > m) m = s[j];
 *   sum = 0; for j: sum += expf(s[j] - m);
 *   p[j] = expf(s[j] - m) / sum for j <= i, 0 above the diagonal. */
__global__ void causal_softmax_kernel(float *probs, size_t rows, size_t T)
{
	const unsigned lane = threadIdx.x % warp_size;
	for (size_t r = global_thread() / warp_size; r < rows; r += thread_count() / warp_size) {
		float *s = probs + r * T;
		const size_t i = r % T;
		float m = 0.0f, sum = 0.0f;
		if (lane == 0) {
			m = s[0];
			for (size_t j = 1; j <= i; j++)
				if (s[j] > m)
					m = s[j];
			for (size_t j = 0; j <= i; j++)
				sum += expf(s[j] - m);
		}
		m = __shfl_sync(full_mask, m, 0);
		sum = __shfl_sync(full_mask, sum, 0);
		for (size_t j = lane; j < T; j += warp_size)
			s[j] = j <= i ? expf(s[j] - m) / sum : 0.0f;
	}
}

/* scale = 1 / sqrtf(hd) for the scores and their gradients. */
static float attention_scale(size_t hd)
{
	return 1.0f / sqrtf((float)hd);
}

/* Per sequence b, with Q, K, V the [T, hd] blocks of head h (row stride 3d):
 *   S = Q K^T * scale   column-major: S^T[T, T] = op_T(K^T) @ Q^T      (H heads batched)
 *   P = causal_softmax(S), kept in probs
 *   O = P V             column-major: O^T[hd, T] = V^T @ P^T */
extern "C" cudaError_t _dos_attention_fwd_cuda(cublasHandle_t blas, const float *qkv, float *out, float *probs,
					       size_t B, size_t T, size_t H, size_t hd, cudaStream_t stream)
{
	if (B == 0 || T == 0 || H == 0)
		return cudaSuccess;
	cudaError_t err = check_attention_args(blas, T, H, hd, stream);
	if (err != cudaSuccess)
		return err;
	const size_t d = H * hd, ld = 3 * d, TT = T * T;
	const float scale = attention_scale(hd);
	for (size_t b = 0; b < B; b++) {
		const float *q = qkv + b * T * ld, *k = q + d;
		if ((err = gemm_heads(blas, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hd, scale, k, ld, hd, q, ld, hd,
				      probs + b * H * TT, T, TT, H)) != cudaSuccess)
			return err;
	}
	causal_softmax_kernel<<<blocks_for_rows(B * H * T), threads_per_block, 0, stream>>>(probs, B * H * T, T);
	if ((err = cudaGetLastError()) != cudaSuccess)
		return err;
	for (size_t b = 0; b < B; b++) {
		const float *v = qkv + b * T * ld + 2 * d;
		if ((err = gemm_heads(blas, CUBLAS_OP_N, CUBLAS_OP_N, hd, T, T, 1.0f, v, ld, hd, probs + b * H * TT, T,
				      TT, out + b * T * d, d, hd, H)) != cudaSuccess)
			return err;
	}
	return cudaSuccess;
}

/* dS = P * (dP - rowsum(dP * P)) in place on dP [rows, T], one warp per row, row r being
 * query position i = r % T. CPU order:
 *   dot = 0; for j = 0..i: dot += dP[j] * P[j];
 *   dS[j] = P[j] * (dP[j] - dot) for j <= i, 0 above the diagonal. */
__global__ void softmax_bwd_kernel(const float *probs, float *dp, size_t rows, size_t T)
{
	const unsigned lane = threadIdx.x % warp_size;
	for (size_t r = global_thread() / warp_size; r < rows; r += thread_count() / warp_size) {
		const float *p = probs + r * T;
		float *g = dp + r * T;
		const size_t i = r % T;
		float dot = 0.0f;
		if (lane == 0)
			for (size_t j = 0; j <= i; j++)
				dot += g[j] * p[j];
		dot = __shfl_sync(full_mask, dot, 0);
		for (size_t j = lane; j < T; j += warp_size)
			g[j] = j <= i ? p[j] * (g[j] - dot) : 0.0f;
	}
}

/* Per sequence b (H heads batched), with dO the [T, hd] block of head h of dout:
 *   dV = P^T dO          column-major: dV^T[hd, T] = dO^T @ op_T(P^T)
 *   dP = dO V^T          column-major: dP^T[T, T] = op_T(V^T) @ dO^T
 *   dS = P * (dP - rowsum(dP * P))
 *   dQ = dS K * scale    column-major: dQ^T[hd, T] = K^T @ dS^T
 *   dK = dS^T Q * scale  column-major: dK^T[hd, T] = Q^T @ op_T(dS^T)
 * dP/dS live in a stream-ordered scratch of one sequence ([H, T, T]), reused for every b. */
extern "C" cudaError_t _dos_attention_bwd_cuda(cublasHandle_t blas, const float *qkv, const float *probs,
					       const float *dout, float *dqkv, size_t B, size_t T, size_t H, size_t hd,
					       cudaStream_t stream)
{
	if (B == 0 || T == 0 || H == 0)
		return cudaSuccess;
	cudaError_t err = check_attention_args(blas, T, H, hd, stream);
	if (err != cudaSuccess)
		return err;
	const size_t d = H * hd, ld = 3 * d, TT = T * T;
	const float scale = attention_scale(hd);
	float *ds = NULL;
	if ((err = cudaMallocAsync((void **)&ds, H * TT * sizeof(float), stream)) != cudaSuccess)
		return err;
	for (size_t b = 0; b < B && err == cudaSuccess; b++) {
		const float *q = qkv + b * T * ld, *k = q + d, *v = q + 2 * d;
		const float *p = probs + b * H * TT, *dO = dout + b * T * d;
		float *dq = dqkv + b * T * ld, *dk = dq + d, *dv = dq + 2 * d;
		if ((err = gemm_heads(blas, CUBLAS_OP_N, CUBLAS_OP_T, hd, T, T, 1.0f, dO, d, hd, p, T, TT, dv, ld, hd,
				      H)) != cudaSuccess)
			break;
		if ((err = gemm_heads(blas, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hd, 1.0f, v, ld, hd, dO, d, hd, ds, T, TT,
				      H)) != cudaSuccess)
			break;
		softmax_bwd_kernel<<<blocks_for_rows(H * T), threads_per_block, 0, stream>>>(p, ds, H * T, T);
		if ((err = cudaGetLastError()) != cudaSuccess)
			break;
		if ((err = gemm_heads(blas, CUBLAS_OP_N, CUBLAS_OP_N, hd, T, T, scale, k, ld, hd, ds, T, TT, dq, ld, hd,
				      H)) != cudaSuccess)
			break;
		err = gemm_heads(blas, CUBLAS_OP_N, CUBLAS_OP_T, hd, T, T, scale, q, ld, hd, ds, T, TT, dk, ld, hd, H);
	}
	cudaError_t freed = cudaFreeAsync(ds, stream);
	return err != cudaSuccess ? err : freed;
}

/* ---- GELU --------------------------------------------------------------------------- */

/* CPU order, with s = 0.70710678f (float(1/sqrt(2))) and c = 0.39894228f (float(1/sqrt(2 pi))):
 *   y  = 0.5f * x * (1.0f + erff(x * s))                    (i.e. ((0.5f * x) * (1 + erf)))
 *   dx = dy * (0.5f * (1.0f + erff(x * s)) + x * (c * expf(-0.5f * x * x))) */
#define DOS_GELU_SQRT1_2 0.70710678118654752440f
#define DOS_GELU_INV_SQRT_2PI 0.39894228040143267794f

__global__ void gelu_fwd_kernel(const float *x, float *y, size_t n)
{
	for (size_t i = global_thread(); i < n; i += thread_count()) {
		const float u = x[i];
		y[i] = 0.5f * u * (1.0f + erff(u * DOS_GELU_SQRT1_2));
	}
}

__global__ void gelu_bwd_kernel(const float *x, const float *dy, float *dx, size_t n)
{
	for (size_t i = global_thread(); i < n; i += thread_count()) {
		const float u = x[i];
		const float cdf = 0.5f * (1.0f + erff(u * DOS_GELU_SQRT1_2));
		const float pdf = DOS_GELU_INV_SQRT_2PI * expf(-0.5f * u * u);
		dx[i] = dy[i] * (cdf + u * pdf);
	}
}

extern "C" cudaError_t _dos_gelu_fwd_cuda(const float *x, float *y, size_t n, cudaStream_t stream)
{
	if (n == 0)
		return cudaSuccess;
	gelu_fwd_kernel<<<blocks_for(n), threads_per_block, 0, stream>>>(x, y, n);
	return cudaGetLastError();
}

extern "C" cudaError_t _dos_gelu_bwd_cuda(const float *x, const float *dy, float *dx, size_t n, cudaStream_t stream)
{
	if (n == 0)
		return cudaSuccess;
	gelu_bwd_kernel<<<blocks_for(n), threads_per_block, 0, stream>>>(x, dy, dx, n);
	return cudaGetLastError();
}

/* ---- cross-entropy ------------------------------------------------------------------ */

/* One warp per token. CPU order over j = 0..V-1:
 *   m = z[0]; for j >= 1: if (z[j] > m) m = z[j];
 *   sum = 0; for j: sum += expf(z[j] - m);
 *   loss = (m + logf(sum)) - z[t];
 *   dz[j] = (expf(z[j] - m) / sum - (j == t ? 1.0f : 0.0f)) * grad_scale
 * (prob - 0.0f is prob exactly, so this is the CPU's "target ? prob - 1 : prob".) A target
 * outside [0, V) gives a NaN loss and no one-hot term (callers never pass one); V == 0 a
 * NaN loss. */
__global__ void xent_kernel(const float *logits, const int32_t *targets, float *loss, float *dlogits, size_t n,
			    size_t V, float grad_scale)
{
	const unsigned lane = threadIdx.x % warp_size;
	for (size_t i = global_thread() / warp_size; i < n; i += thread_count() / warp_size) {
		const float *z = logits + i * V;
		const int32_t t = targets[i];
		const bool valid = t >= 0 && (size_t)t < V;
		float m = 0.0f, sum = 0.0f;
		if (V == 0) {
			if (lane == 0)
				loss[i] = __int_as_float(0x7fc00000);
			continue;
		}
		if (lane == 0) {
			m = z[0];
			for (size_t j = 1; j < V; j++)
				if (z[j] > m)
					m = z[j];
			for (size_t j = 0; j < V; j++)
				sum += expf(z[j] - m);
			loss[i] = valid ? (m + logf(sum)) - z[t] : __int_as_float(0x7fc00000);
		}
		m = __shfl_sync(full_mask, m, 0);
		sum = __shfl_sync(full_mask, sum, 0);
		for (size_t j = lane; j < V; j += warp_size) {
			const float onehot = valid && j == (size_t)t ? 1.0f : 0.0f;
			dlogits[i * V + j] = (expf(z[j] - m) / sum - onehot) * grad_scale;
		}
	}
}

extern "C" cudaError_t _dos_xent_cuda(const float *logits, const int32_t *targets, float *loss, float *dlogits,
				      size_t n, size_t V, float grad_scale, cudaStream_t stream)
{
	if (n == 0)
		return cudaSuccess;
	xent_kernel<<<blocks_for_rows(n), threads_per_block, 0, stream>>>(logits, targets, loss, dlogits, n, V,
									  grad_scale);
	return cudaGetLastError();
}
