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
 * 16-bit compute (dtype fp16/bf16, model_kernels.h): the kernels load through numerics.h
 * (exact widening), compute in float exactly as in fp32, and round each stored element once
 * to nearest even, as the CPU does; products are cublasGemmEx / cublasGemmStridedBatchedEx
 * with 16-bit A and B and CUBLAS_COMPUTE_32F (fp32 accumulation), C 16-bit, or fp32 for the
 * weight gradients and the attention scores. In fp32 the products stay cublasSgemm and
 * the kernels do what they did before 16-bit compute, bit for bit.
 *
 * Every function enqueues its work on `stream` (the cuBLAS handle must already be bound to
 * it: StarPU's local handle is bound to StarPU's local stream), checks every launch and
 * returns the first error; none synchronises. */
#include <climits>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "cuda_grid.h"
#include "model_kernels.h"
#include "numerics.h"

static const int threads_per_block = 256;
static const unsigned warp_size = 32;
static const unsigned full_mask = 0xffffffffu;

static unsigned blocks_for(size_t work_items)
{
	return _dos_cuda_blocks_for(work_items, threads_per_block);
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

static bool known_dtype(enum dos_dtype t)
{
	return t == DOS_FP32 || t == DOS_FP16 || t == DOS_BF16;
}

/* Element `offset` of an array of dtype t. */
static const void *at(const void *base, size_t offset, enum dos_dtype t)
{
	return (const char *)base + offset * dos_dtype_size(t);
}

static void *at_mut(void *base, size_t offset, enum dos_dtype t)
{
	return (char *)base + offset * dos_dtype_size(t);
}

/* ---- embedding ---------------------------------------------------------------------- */

__global__ void embed_fwd_kernel(const int32_t *ids, const void *tok, const void *pos, void *x, size_t n, size_t T,
				 size_t d, enum dos_dtype t)
{
	for (size_t e = global_thread(); e < n * d; e += thread_count()) {
		size_t i = e / d, j = e % d;
		dos_store_elem(x, e, t,
			       dos_load_elem(tok, (size_t)ids[i] * d + j, t) + dos_load_elem(pos, (i % T) * d + j, t));
	}
}

extern "C" cudaError_t _dos_embed_fwd_cuda(const int32_t *ids, const void *tok, const void *pos, void *x, size_t n,
					   size_t T, size_t d, enum dos_dtype dtype, cudaStream_t stream)
{
	if (!known_dtype(dtype))
		return cudaErrorInvalidValue;
	if (n == 0 || d == 0)
		return cudaSuccess;
	if (T == 0)
		return cudaErrorInvalidValue;
	embed_fwd_kernel<<<blocks_for(n * d), threads_per_block, 0, stream>>>(ids, tok, pos, x, n, T, d, dtype);
	return cudaGetLastError();
}

/* One thread per column of dtok: it adds the rows of dx in increasing token order, so
 * every element of dtok sees the CPU's order. Ids outside [0, V) are skipped (the CPU
 * would write out of bounds: callers never pass them). Only d threads: a faster
 * deterministic version would first sort the token indices by id (a stable counting sort)
 * and give each (id, column) its own thread summing its tokens in increasing order. */
__global__ void embed_bwd_tok_kernel(const int32_t *ids, const void *dx, float *dtok, size_t n, size_t d, size_t V,
				     enum dos_dtype t)
{
	for (size_t j = global_thread(); j < d; j += thread_count())
		for (size_t i = 0; i < n; i++) {
			int32_t id = ids[i];
			if (id >= 0 && (size_t)id < V)
				dtok[(size_t)id * d + j] += dos_load_elem(dx, i * d + j, t);
		}
}

/* One thread per element (t, j) of dpos: tokens t, T + t, 2T + t, ... in increasing order,
 * the order in which the CPU's single pass over tokens reaches dpos[t, j]. */
__global__ void embed_bwd_pos_kernel(const void *dx, float *dpos, size_t n, size_t T, size_t d, enum dos_dtype t)
{
	for (size_t e = global_thread(); e < T * d; e += thread_count()) {
		float acc = dpos[e];
		for (size_t i = e / d; i < n; i += T)
			acc += dos_load_elem(dx, i * d + e % d, t);
		dpos[e] = acc;
	}
}

extern "C" cudaError_t _dos_embed_bwd_cuda(const int32_t *ids, const void *dx, float *dtok, float *dpos, size_t n,
					   size_t T, size_t d, size_t V, int accumulate, enum dos_dtype dtype,
					   cudaStream_t stream)
{
	cudaError_t err;
	if (!known_dtype(dtype))
		return cudaErrorInvalidValue;
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
		embed_bwd_tok_kernel<<<blocks_for(d), threads_per_block, 0, stream>>>(ids, dx, dtok, n, d, V, dtype);
		if ((err = cudaGetLastError()) != cudaSuccess)
			return err;
	}
	embed_bwd_pos_kernel<<<blocks_for(T * d), threads_per_block, 0, stream>>>(dx, dpos, n, T, d, dtype);
	return cudaGetLastError();
}

/* ---- RMSNorm ------------------------------------------------------------------------ */

/* One warp per row. CPU order:
 *   ss = 0; for j: ss += x[j] * x[j];   r = 1.0f / sqrtf(ss / (float)d + EPS);
 *   y[j] = x[j] * r * w[j]              (i.e. (x[j] * r) * w[j]) */
__global__ void rmsnorm_fwd_kernel(const void *x, const void *w, void *y, float *rstd, size_t n, size_t d,
				   enum dos_dtype t)
{
	const unsigned lane = threadIdx.x % warp_size;
	for (size_t i = global_thread() / warp_size; i < n; i += thread_count() / warp_size) {
		const size_t row = i * d;
		float r = 0.0f;
		if (lane == 0) {
			float ss = 0.0f;
			for (size_t j = 0; j < d; j++) {
				const float xj = dos_load_elem(x, row + j, t);
				ss += xj * xj;
			}
			r = 1.0f / sqrtf(ss / (float)d + DOS_RMSNORM_EPS);
			rstd[i] = r;
		}
		r = __shfl_sync(full_mask, r, 0);
		for (size_t j = lane; j < d; j += warp_size)
			dos_store_elem(y, row + j, t, dos_load_elem(x, row + j, t) * r * dos_load_elem(w, j, t));
	}
}

extern "C" cudaError_t _dos_rmsnorm_fwd_cuda(const void *x, const void *w, void *y, float *rstd, size_t n, size_t d,
					     enum dos_dtype dtype, cudaStream_t stream)
{
	if (!known_dtype(dtype))
		return cudaErrorInvalidValue;
	if (n == 0 || d == 0)
		return cudaSuccess;
	rmsnorm_fwd_kernel<<<blocks_for_rows(n), threads_per_block, 0, stream>>>(x, w, y, rstd, n, d, dtype);
	return cudaGetLastError();
}

/* dx, one warp per row. With r = (mean(x^2) + eps)^-1/2, dr/dx_k = -r^3 x_k / d, so
 *   dx_k = (w_k dy_k) r - x_k c,  c = (sum_j (w_j dy_j) x_j) / d * r^3.
 * CPU order:
 *   dot = 0; for j: dot += w[j] * dy[j] * x[j];         (i.e. (w[j] * dy[j]) * x[j])
 *   c = dot / (float)d * (r * r * r);
 *   v = w[j] * dy[j] * r - x[j] * c;   dx[j] = v  or  dx[j] += v */
__global__ void rmsnorm_bwd_dx_kernel(const void *x, const void *w, const float *rstd, const void *dy, void *dx,
				      size_t n, size_t d, int accumulate, enum dos_dtype t)
{
	const unsigned lane = threadIdx.x % warp_size;
	for (size_t i = global_thread() / warp_size; i < n; i += thread_count() / warp_size) {
		const size_t row = i * d;
		const float r = rstd[i];
		float c = 0.0f;
		if (lane == 0) {
			float dot = 0.0f;
			for (size_t j = 0; j < d; j++)
				dot += dos_load_elem(w, j, t) * dos_load_elem(dy, row + j, t) *
				       dos_load_elem(x, row + j, t);
			c = dot / (float)d * (r * r * r);
		}
		c = __shfl_sync(full_mask, c, 0);
		for (size_t j = lane; j < d; j += warp_size) {
			const float v = dos_load_elem(w, j, t) * dos_load_elem(dy, row + j, t) * r -
					dos_load_elem(x, row + j, t) * c;
			dos_store_elem(dx, row + j, t, accumulate ? dos_load_elem(dx, row + j, t) + v : v);
		}
	}
}

/* dw, one thread per column, tokens in increasing order:
 *   acc = accumulate ? dw[j] : 0.0f; for i: acc += dy[i, j] * x[i, j] * rstd[i]; dw[j] = acc */
__global__ void rmsnorm_bwd_dw_kernel(const void *x, const float *rstd, const void *dy, float *dw, size_t n, size_t d,
				      int accumulate, enum dos_dtype t)
{
	for (size_t j = global_thread(); j < d; j += thread_count()) {
		float acc = accumulate ? dw[j] : 0.0f;
		for (size_t i = 0; i < n; i++)
			acc += dos_load_elem(dy, i * d + j, t) * dos_load_elem(x, i * d + j, t) * rstd[i];
		dw[j] = acc;
	}
}

extern "C" cudaError_t _dos_rmsnorm_bwd_cuda(const void *x, const void *w, const float *rstd, const void *dy, void *dx,
					     float *dw, size_t n, size_t d, int accumulate_dx, int accumulate_dw,
					     enum dos_dtype dtype, cudaStream_t stream)
{
	cudaError_t err;
	if (!known_dtype(dtype))
		return cudaErrorInvalidValue;
	if (d == 0)
		return cudaSuccess;
	if (n) {
		rmsnorm_bwd_dx_kernel<<<blocks_for_rows(n), threads_per_block, 0, stream>>>(x, w, rstd, dy, dx, n, d,
											    accumulate_dx, dtype);
		if ((err = cudaGetLastError()) != cudaSuccess)
			return err;
	}
	rmsnorm_bwd_dw_kernel<<<blocks_for(d), threads_per_block, 0, stream>>>(x, rstd, dy, dw, n, d, accumulate_dw,
									       dtype);
	return cudaGetLastError();
}

/* ---- products (cuBLAS) -------------------------------------------------------------- */

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

static cudaDataType_t cuda_type(enum dos_dtype t)
{
	return t == DOS_FP16 ? CUDA_R_16F : t == DOS_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

/* Column-major C = alpha op(A) op(B) + beta C. All fp32: cublasSgemm, as before 16-bit
 * compute. Otherwise A and B are of one 16-bit dtype and the product accumulates in fp32
 * (CUBLAS_COMPUTE_32F; tensor cores where the GPU has them), C 16-bit or fp32. */
static cublasStatus_t gemm(cublasHandle_t blas, cublasOperation_t ta, cublasOperation_t tb, size_t m, size_t n,
			   size_t k, float alpha, const void *a, enum dos_dtype ab_dtype, size_t lda, const void *b,
			   size_t ldb, float beta, void *c, enum dos_dtype c_dtype, size_t ldc)
{
	if (ab_dtype == DOS_FP32 && c_dtype == DOS_FP32)
		return cublasSgemm(blas, ta, tb, (int)m, (int)n, (int)k, &alpha, (const float *)a, (int)lda,
				   (const float *)b, (int)ldb, &beta, (float *)c, (int)ldc);
	return cublasGemmEx(blas, ta, tb, (int)m, (int)n, (int)k, &alpha, a, cuda_type(ab_dtype), (int)lda, b,
			    cuda_type(ab_dtype), (int)ldb, &beta, c, cuda_type(c_dtype), (int)ldc, CUBLAS_COMPUTE_32F,
			    CUBLAS_GEMM_DEFAULT);
}

/* C[rows, cols] (row-major, of dtype t) = 0 when !accumulate: a product with an empty
 * inner dimension. */
static cublasStatus_t empty_product(cublasHandle_t blas, void *c, enum dos_dtype t, size_t rows, size_t cols,
				    int accumulate)
{
	cudaStream_t stream;
	cublasStatus_t st = stream_of(blas, &stream);
	if (st != CUBLAS_STATUS_SUCCESS || accumulate || rows * cols == 0)
		return st;
	return status_of(cudaMemsetAsync(c, 0, rows * cols * dos_dtype_size(t), stream));
}

/* Row-major y[n, out] = x[n, in] @ w[out, in]^T is, column-major, y^T[out, n] =
 * op_T(w^T)[out, in] @ x^T[in, n] where w^T (ld in) and x^T (ld in) are the same bytes. */
extern "C" cublasStatus_t _dos_linear_fwd_cuda(cublasHandle_t blas, const void *x, const void *w, const void *residual,
					       void *y, size_t n, size_t in, size_t out, enum dos_dtype dtype,
					       cudaStream_t stream)
{
	if (!known_dtype(dtype))
		return CUBLAS_STATUS_INVALID_VALUE;
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
			cudaMemcpyAsync(y, residual, n * out * dos_dtype_size(dtype), cudaMemcpyDeviceToDevice, stream);
		if (err != cudaSuccess)
			return status_of(err);
	}
	if (in == 0)
		return empty_product(blas, y, dtype, n, out, residual != NULL);
	return gemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, 1.0f, w, dtype, in, x, in, residual ? 1.0f : 0.0f, y,
		    dtype, out);
}

/* Row-major dx[n, in] = dy[n, out] @ w[out, in]: column-major dx^T[in, n] = w^T[in, out] @
 * dy^T[out, n], both operands as stored. */
extern "C" cublasStatus_t _dos_linear_bwd_data_cuda(cublasHandle_t blas, const void *dy, const void *w, void *dx,
						    size_t n, size_t in, size_t out, int accumulate,
						    enum dos_dtype dtype)
{
	if (!known_dtype(dtype))
		return CUBLAS_STATUS_INVALID_VALUE;
	if (n == 0 || in == 0)
		return CUBLAS_STATUS_SUCCESS;
	if (!fits_int(n) || !fits_int(in) || !fits_int(out))
		return CUBLAS_STATUS_INVALID_VALUE;
	if (out == 0)
		return empty_product(blas, dx, dtype, n, in, accumulate);
	return gemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, in, n, out, 1.0f, w, dtype, in, dy, out, accumulate ? 1.0f : 0.0f,
		    dx, dtype, in);
}

/* Row-major dw[out, in] = dy[n, out]^T @ x[n, in]: column-major dw^T[in, out] = x^T[in, n] @
 * op_T(dy^T)[n, out]. dw is fp32 whatever the dtype: micro-batches accumulate into it. */
extern "C" cublasStatus_t _dos_linear_bwd_weight_cuda(cublasHandle_t blas, const void *dy, const void *x, float *dw,
						      size_t n, size_t in, size_t out, int accumulate,
						      enum dos_dtype dtype)
{
	if (!known_dtype(dtype))
		return CUBLAS_STATUS_INVALID_VALUE;
	if (in == 0 || out == 0)
		return CUBLAS_STATUS_SUCCESS;
	if (!fits_int(n) || !fits_int(in) || !fits_int(out))
		return CUBLAS_STATUS_INVALID_VALUE;
	if (n == 0)
		return empty_product(blas, dw, DOS_FP32, out, in, accumulate);
	return gemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, in, out, n, 1.0f, x, dtype, in, dy, out, accumulate ? 1.0f : 0.0f,
		    dw, DOS_FP32, in);
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

/* A strided batch over the H heads of one sequence (C = alpha op(A) op(B), beta = 0), with
 * A and B of ab_dtype, C of c_dtype; all fp32 is cublasSgemmStridedBatched as before,
 * otherwise 16-bit inputs with fp32 accumulation. */
static cudaError_t gemm_heads(cublasHandle_t blas, cublasOperation_t ta, cublasOperation_t tb, size_t m, size_t n,
			      size_t k, float alpha, const void *a, size_t lda, size_t stride_a, const void *b,
			      size_t ldb, size_t stride_b, enum dos_dtype ab_dtype, void *c, size_t ldc,
			      size_t stride_c, enum dos_dtype c_dtype, size_t H)
{
	const float beta = 0.0f;
	if (ab_dtype == DOS_FP32 && c_dtype == DOS_FP32)
		return cuda_error_of(cublasSgemmStridedBatched(blas, ta, tb, (int)m, (int)n, (int)k, &alpha,
							       (const float *)a, (int)lda, (long long)stride_a,
							       (const float *)b, (int)ldb, (long long)stride_b, &beta,
							       (float *)c, (int)ldc, (long long)stride_c, (int)H));
	return cuda_error_of(cublasGemmStridedBatchedEx(
		blas, ta, tb, (int)m, (int)n, (int)k, &alpha, a, cuda_type(ab_dtype), (int)lda, (long long)stride_a, b,
		cuda_type(ab_dtype), (int)ldb, (long long)stride_b, &beta, c, cuda_type(c_dtype), (int)ldc,
		(long long)stride_c, (int)H, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

/* Causal softmax of the fp32 scores [rows, T] into probs [rows, T] of dtype t (in place
 * when fp32), one warp per row; row r is query position i = r % T. CPU order over j = 0..i:
 *   m = s[0]; for j >= 1: if (s[j] > m) m = s[j];
 *   sum = 0; for j: sum += expf(s[j] - m);
 *   p[j] = expf(s[j] - m) / sum for j <= i, 0 above the diagonal (rounded once to t).
 * Each element is read and then written by the same thread, so in place is safe. */
__global__ void causal_softmax_kernel(const float *scores, void *probs, size_t rows, size_t T, enum dos_dtype t)
{
	const unsigned lane = threadIdx.x % warp_size;
	for (size_t r = global_thread() / warp_size; r < rows; r += thread_count() / warp_size) {
		const float *s = scores + r * T;
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
			dos_store_elem(probs, r * T + j, t, j <= i ? expf(s[j] - m) / sum : 0.0f);
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
 *   O = P V             column-major: O^T[hd, T] = V^T @ P^T
 * S is fp32: in probs itself in fp32, in a stream-ordered scratch of one sequence in 16
 * bits (only P is rounded). */
extern "C" cudaError_t _dos_attention_fwd_cuda(cublasHandle_t blas, const void *qkv, void *out, void *probs, size_t B,
					       size_t T, size_t H, size_t hd, enum dos_dtype dtype, cudaStream_t stream)
{
	if (!known_dtype(dtype))
		return cudaErrorInvalidValue;
	if (B == 0 || T == 0 || H == 0)
		return cudaSuccess;
	cudaError_t err = check_attention_args(blas, T, H, hd, stream);
	if (err != cudaSuccess)
		return err;
	const size_t d = H * hd, ld = 3 * d, TT = T * T;
	const float scale = attention_scale(hd);
	float *scratch = NULL;
	if (dtype != DOS_FP32 &&
	    (err = cudaMallocAsync((void **)&scratch, H * TT * sizeof(float), stream)) != cudaSuccess)
		return err;
	for (size_t b = 0; b < B && err == cudaSuccess; b++) {
		const size_t q = b * T * ld, k = q + d, v = q + 2 * d;
		void *p = at_mut(probs, b * H * TT, dtype);
		float *s = scratch ? scratch : (float *)p;
		if ((err = gemm_heads(blas, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hd, scale, at(qkv, k, dtype), ld, hd,
				      at(qkv, q, dtype), ld, hd, dtype, s, T, TT, DOS_FP32, H)) != cudaSuccess)
			break;
		causal_softmax_kernel<<<blocks_for_rows(H * T), threads_per_block, 0, stream>>>(s, p, H * T, T, dtype);
		if ((err = cudaGetLastError()) != cudaSuccess)
			break;
		err = gemm_heads(blas, CUBLAS_OP_N, CUBLAS_OP_N, hd, T, T, 1.0f, at(qkv, v, dtype), ld, hd, p, T, TT,
				 dtype, at_mut(out, b * T * d, dtype), d, hd, dtype, H);
	}
	if (scratch) {
		cudaError_t freed = cudaFreeAsync(scratch, stream);
		return err != cudaSuccess ? err : freed;
	}
	return err;
}

/* dS = P * (dP - rowsum(dP * P)) from the fp32 dP [rows, T] into ds of dtype t (in place
 * when fp32), one warp per row, row r being query position i = r % T. CPU order:
 *   dot = 0; for j = 0..i: dot += dP[j] * P[j];
 *   dS[j] = P[j] * (dP[j] - dot) for j <= i, 0 above the diagonal (rounded once to t). */
__global__ void softmax_bwd_kernel(const void *probs, const float *dp, void *ds, size_t rows, size_t T,
				   enum dos_dtype t)
{
	const unsigned lane = threadIdx.x % warp_size;
	for (size_t r = global_thread() / warp_size; r < rows; r += thread_count() / warp_size) {
		const float *g = dp + r * T;
		const size_t i = r % T, row = r * T;
		float dot = 0.0f;
		if (lane == 0)
			for (size_t j = 0; j <= i; j++)
				dot += g[j] * dos_load_elem(probs, row + j, t);
		dot = __shfl_sync(full_mask, dot, 0);
		for (size_t j = lane; j < T; j += warp_size)
			dos_store_elem(ds, row + j, t, j <= i ? dos_load_elem(probs, row + j, t) * (g[j] - dot) : 0.0f);
	}
}

/* Per sequence b (H heads batched), with dO the [T, hd] block of head h of dout:
 *   dV = P^T dO          column-major: dV^T[hd, T] = dO^T @ op_T(P^T)
 *   dP = dO V^T          column-major: dP^T[T, T] = op_T(V^T) @ dO^T
 *   dS = P * (dP - rowsum(dP * P))
 *   dQ = dS K * scale    column-major: dQ^T[hd, T] = K^T @ dS^T
 *   dK = dS^T Q * scale  column-major: dK^T[hd, T] = Q^T @ op_T(dS^T)
 * dP (fp32) and, in 16 bits, dS (rounded, the operand of two 16-bit products) live in
 * stream-ordered scratch of one sequence ([H, T, T]), reused for every b. */
extern "C" cudaError_t _dos_attention_bwd_cuda(cublasHandle_t blas, const void *qkv, const void *probs,
					       const void *dout, void *dqkv, size_t B, size_t T, size_t H, size_t hd,
					       enum dos_dtype dtype, cudaStream_t stream)
{
	if (!known_dtype(dtype))
		return cudaErrorInvalidValue;
	if (B == 0 || T == 0 || H == 0)
		return cudaSuccess;
	cudaError_t err = check_attention_args(blas, T, H, hd, stream);
	if (err != cudaSuccess)
		return err;
	const size_t d = H * hd, ld = 3 * d, TT = T * T;
	const float scale = attention_scale(hd);
	float *dp = NULL;
	void *ds16 = NULL;
	if ((err = cudaMallocAsync((void **)&dp, H * TT * sizeof(float), stream)) != cudaSuccess)
		return err;
	if (dtype != DOS_FP32 &&
	    (err = cudaMallocAsync(&ds16, H * TT * dos_dtype_size(dtype), stream)) != cudaSuccess) {
		cudaFreeAsync(dp, stream);
		return err;
	}
	void *ds = ds16 ? ds16 : dp;
	for (size_t b = 0; b < B && err == cudaSuccess; b++) {
		const size_t q = b * T * ld, k = q + d, v = q + 2 * d;
		const void *p = at(probs, b * H * TT, dtype), *dO = at(dout, b * T * d, dtype);
		if ((err = gemm_heads(blas, CUBLAS_OP_N, CUBLAS_OP_T, hd, T, T, 1.0f, dO, d, hd, p, T, TT, dtype,
				      at_mut(dqkv, v, dtype), ld, hd, dtype, H)) != cudaSuccess)
			break;
		if ((err = gemm_heads(blas, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hd, 1.0f, at(qkv, v, dtype), ld, hd, dO, d,
				      hd, dtype, dp, T, TT, DOS_FP32, H)) != cudaSuccess)
			break;
		softmax_bwd_kernel<<<blocks_for_rows(H * T), threads_per_block, 0, stream>>>(p, dp, ds, H * T, T,
											     dtype);
		if ((err = cudaGetLastError()) != cudaSuccess)
			break;
		if ((err = gemm_heads(blas, CUBLAS_OP_N, CUBLAS_OP_N, hd, T, T, scale, at(qkv, k, dtype), ld, hd, ds, T,
				      TT, dtype, at_mut(dqkv, q, dtype), ld, hd, dtype, H)) != cudaSuccess)
			break;
		err = gemm_heads(blas, CUBLAS_OP_N, CUBLAS_OP_T, hd, T, T, scale, at(qkv, q, dtype), ld, hd, ds, T, TT,
				 dtype, at_mut(dqkv, k, dtype), ld, hd, dtype, H);
	}
	cudaError_t freed = cudaFreeAsync(dp, stream);
	if (ds16 && freed == cudaSuccess)
		freed = cudaFreeAsync(ds16, stream);
	return err != cudaSuccess ? err : freed;
}

/* ---- GELU --------------------------------------------------------------------------- */

/* CPU order, with s = 0.70710678f (float(1/sqrt(2))) and c = 0.39894228f (float(1/sqrt(2 pi))):
 *   y  = 0.5f * x * (1.0f + erff(x * s))                    (i.e. ((0.5f * x) * (1 + erf)))
 *   dx = dy * (0.5f * (1.0f + erff(x * s)) + x * (c * expf(-0.5f * x * x))) */
#define DOS_GELU_SQRT1_2 0.70710678118654752440f
#define DOS_GELU_INV_SQRT_2PI 0.39894228040143267794f

__global__ void gelu_fwd_kernel(const void *x, void *y, size_t n, enum dos_dtype t)
{
	for (size_t i = global_thread(); i < n; i += thread_count()) {
		const float u = dos_load_elem(x, i, t);
		dos_store_elem(y, i, t, 0.5f * u * (1.0f + erff(u * DOS_GELU_SQRT1_2)));
	}
}

__global__ void gelu_bwd_kernel(const void *x, const void *dy, void *dx, size_t n, enum dos_dtype t)
{
	for (size_t i = global_thread(); i < n; i += thread_count()) {
		const float u = dos_load_elem(x, i, t);
		const float cdf = 0.5f * (1.0f + erff(u * DOS_GELU_SQRT1_2));
		const float pdf = DOS_GELU_INV_SQRT_2PI * expf(-0.5f * u * u);
		dos_store_elem(dx, i, t, dos_load_elem(dy, i, t) * (cdf + u * pdf));
	}
}

extern "C" cudaError_t _dos_gelu_fwd_cuda(const void *x, void *y, size_t n, enum dos_dtype dtype, cudaStream_t stream)
{
	if (!known_dtype(dtype))
		return cudaErrorInvalidValue;
	if (n == 0)
		return cudaSuccess;
	gelu_fwd_kernel<<<blocks_for(n), threads_per_block, 0, stream>>>(x, y, n, dtype);
	return cudaGetLastError();
}

extern "C" cudaError_t _dos_gelu_bwd_cuda(const void *x, const void *dy, void *dx, size_t n, enum dos_dtype dtype,
					  cudaStream_t stream)
{
	if (!known_dtype(dtype))
		return cudaErrorInvalidValue;
	if (n == 0)
		return cudaSuccess;
	gelu_bwd_kernel<<<blocks_for(n), threads_per_block, 0, stream>>>(x, dy, dx, n, dtype);
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
 * NaN loss. In 16 bits z is widened, the loss stays fp32 and each dz is rounded once. */
__global__ void xent_kernel(const void *logits, const int32_t *targets, float *loss, void *dlogits, size_t n, size_t V,
			    float grad_scale, enum dos_dtype dt)
{
	const unsigned lane = threadIdx.x % warp_size;
	for (size_t i = global_thread() / warp_size; i < n; i += thread_count() / warp_size) {
		const size_t row = i * V;
		const int32_t t = targets[i];
		const bool valid = t >= 0 && (size_t)t < V;
		float m = 0.0f, sum = 0.0f;
		if (V == 0) {
			if (lane == 0)
				loss[i] = __int_as_float(0x7fc00000);
			continue;
		}
		if (lane == 0) {
			m = dos_load_elem(logits, row, dt);
			for (size_t j = 1; j < V; j++)
				if (dos_load_elem(logits, row + j, dt) > m)
					m = dos_load_elem(logits, row + j, dt);
			for (size_t j = 0; j < V; j++)
				sum += expf(dos_load_elem(logits, row + j, dt) - m);
			loss[i] = valid ? (m + logf(sum)) - dos_load_elem(logits, row + (size_t)t, dt)
					: __int_as_float(0x7fc00000);
		}
		m = __shfl_sync(full_mask, m, 0);
		sum = __shfl_sync(full_mask, sum, 0);
		for (size_t j = lane; j < V; j += warp_size) {
			const float onehot = valid && j == (size_t)t ? 1.0f : 0.0f;
			dos_store_elem(dlogits, row + j, dt,
				       (expf(dos_load_elem(logits, row + j, dt) - m) / sum - onehot) * grad_scale);
		}
	}
}

extern "C" cudaError_t _dos_xent_cuda(const void *logits, const int32_t *targets, float *loss, void *dlogits, size_t n,
				      size_t V, float grad_scale, enum dos_dtype dtype, cudaStream_t stream)
{
	if (!known_dtype(dtype))
		return cudaErrorInvalidValue;
	if (n == 0)
		return cudaSuccess;
	xent_kernel<<<blocks_for_rows(n), threads_per_block, 0, stream>>>(logits, targets, loss, dlogits, n, V,
									  grad_scale, dtype);
	return cudaGetLastError();
}
