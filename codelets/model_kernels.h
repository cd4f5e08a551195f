/* The compute kernels of the example model (docs/model.md), on plain pointers so they are
 * testable without StarPU. CPU versions use OpenBLAS (one thread: parallelism comes from
 * StarPU's workers); CUDA versions run on the given stream and use cuBLAS for products.
 *
 * Conventions: row-major arrays. `dtype` is the model's compute dtype: the weights, the
 * activations and the activation gradients are of it (fp32, fp16 or bf16); the weight
 * gradients (dw, dtok, dpos), RMSNorm's rstd and the per-token losses are always fp32.
 * In 16 bits every kernel widens what it reads exactly, computes in fp32 and rounds each
 * output once (to nearest even); products take 16-bit inputs and accumulate in fp32.
 * `n` is the number of tokens of
 * a micro-batch (B sequences of T tokens), `d` the row width. Backward kernels follow an
 * `accumulate` flag: 0 overwrites the output gradient, 1 adds to it (gradient accumulation
 * across micro-batches, and the residual stream). Reductions over tokens (weight gradients
 * of norms and embeddings) run sequentially in token order on every device, so their
 * results do not depend on where the task ran. */
#ifndef DOS_MODEL_KERNELS_H
#define DOS_MODEL_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "dos.h"

#define DOS_RMSNORM_EPS 1e-5f

/* ---- CPU ---------------------------------------------------------------------------- */

/* x[i, :] = tok[ids[i], :] + pos[i % T, :]  for i < n. */
void _dos_embed_fwd_cpu(const int32_t *ids, const void *tok, const void *pos, void *x, size_t n, size_t T, size_t d,
			enum dos_dtype dtype);
/* dtok[ids[i], :] += dx[i, :] and dpos[i % T, :] += dx[i, :], i in increasing order; when
 * !accumulate, dtok ([V, d]) and dpos ([T, d]) are zeroed first. */
void _dos_embed_bwd_cpu(const int32_t *ids, const void *dx, float *dtok, float *dpos, size_t n, size_t T, size_t d,
			size_t V, int accumulate, enum dos_dtype dtype);

/* y = x * rstd * w per row, rstd[i] = 1 / sqrtf(mean(x[i,:]^2) + DOS_RMSNORM_EPS). */
void _dos_rmsnorm_fwd_cpu(const void *x, const void *w, void *y, float *rstd, size_t n, size_t d, enum dos_dtype dtype);
/* Given dy = dL/dy: dx (+)= dL/dx (accumulate_dx), dw (+)= dL/dw (accumulate_dw). */
void _dos_rmsnorm_bwd_cpu(const void *x, const void *w, const float *rstd, const void *dy, void *dx, float *dw,
			  size_t n, size_t d, int accumulate_dx, int accumulate_dw, enum dos_dtype dtype);

/* y[n, out] = (residual ? residual : 0) + x[n, in] @ w[out, in]^T. */
void _dos_linear_fwd_cpu(const void *x, const void *w, const void *residual, void *y, size_t n, size_t in, size_t out,
			 enum dos_dtype dtype);
/* dx[n, in] (+)= dy[n, out] @ w[out, in]. */
void _dos_linear_bwd_data_cpu(const void *dy, const void *w, void *dx, size_t n, size_t in, size_t out, int accumulate,
			      enum dos_dtype dtype);
/* dw[out, in] (+)= dy[n, out]^T @ x[n, in]  (dw fp32 whatever the dtype). */
void _dos_linear_bwd_weight_cpu(const void *dy, const void *x, float *dw, size_t n, size_t in, size_t out,
				int accumulate, enum dos_dtype dtype);

/* Causal multi-head attention. qkv is [n, 3d] (q, k, v blocks of d columns, head h at
 * columns h*hd within each), n = B*T, d = H*hd; out is [n, d]; probs is [B, H, T, T], the
 * softmax (zero above the diagonal), kept for the backward pass. */
void _dos_attention_fwd_cpu(const void *qkv, void *out, void *probs, size_t B, size_t T, size_t H, size_t hd,
			    enum dos_dtype dtype);
/* dqkv[n, 3d] = gradient of the attention w.r.t. qkv (overwritten), given dout [n, d]. */
void _dos_attention_bwd_cpu(const void *qkv, const void *probs, const void *dout, void *dqkv, size_t B, size_t T,
			    size_t H, size_t hd, enum dos_dtype dtype);

/* y = gelu(x), exact erf form; dx = dy * gelu'(x) (overwritten). */
void _dos_gelu_fwd_cpu(const void *x, void *y, size_t n, enum dos_dtype dtype);
void _dos_gelu_bwd_cpu(const void *x, const void *dy, void *dx, size_t n, enum dos_dtype dtype);

/* Softmax cross-entropy of logits [n, V] against targets: loss[i] = logsumexp(logits[i]) -
 * logits[i, targets[i]] (per token, not averaged, fp32 whatever the dtype), and dlogits =
 * (softmax - onehot) * grad_scale (grad_scale folds in 1/(n*A) and the loss scale). */
void _dos_xent_cpu(const void *logits, const int32_t *targets, float *loss, void *dlogits, size_t n, size_t V,
		   float grad_scale, enum dos_dtype dtype);

/* ---- CUDA (same semantics; asynchronous on `stream`) -------------------------------- */
#ifdef DOS_USE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>
#ifdef __cplusplus
extern "C" {
#endif
/* An unknown dtype is refused with cudaErrorInvalidValue (CUBLAS_STATUS_INVALID_VALUE). */
cudaError_t _dos_embed_fwd_cuda(const int32_t *ids, const void *tok, const void *pos, void *x, size_t n, size_t T,
				size_t d, enum dos_dtype dtype, cudaStream_t stream);
cudaError_t _dos_embed_bwd_cuda(const int32_t *ids, const void *dx, float *dtok, float *dpos, size_t n, size_t T,
				size_t d, size_t V, int accumulate, enum dos_dtype dtype, cudaStream_t stream);
cudaError_t _dos_rmsnorm_fwd_cuda(const void *x, const void *w, void *y, float *rstd, size_t n, size_t d,
				  enum dos_dtype dtype, cudaStream_t stream);
cudaError_t _dos_rmsnorm_bwd_cuda(const void *x, const void *w, const float *rstd, const void *dy, void *dx, float *dw,
				  size_t n, size_t d, int accumulate_dx, int accumulate_dw, enum dos_dtype dtype,
				  cudaStream_t stream);
/* The products use `blas`, already bound to `stream` by the caller (StarPU's handle is).
 * fp32: cublasSgemm; fp16/bf16: cublasGemmEx with 16-bit inputs and CUBLAS_COMPUTE_32F. */
cublasStatus_t _dos_linear_fwd_cuda(cublasHandle_t blas, const void *x, const void *w, const void *residual, void *y,
				    size_t n, size_t in, size_t out, enum dos_dtype dtype, cudaStream_t stream);
cublasStatus_t _dos_linear_bwd_data_cuda(cublasHandle_t blas, const void *dy, const void *w, void *dx, size_t n,
					 size_t in, size_t out, int accumulate, enum dos_dtype dtype);
cublasStatus_t _dos_linear_bwd_weight_cuda(cublasHandle_t blas, const void *dy, const void *x, float *dw, size_t n,
					   size_t in, size_t out, int accumulate, enum dos_dtype dtype);
cudaError_t _dos_attention_fwd_cuda(cublasHandle_t blas, const void *qkv, void *out, void *probs, size_t B, size_t T,
				    size_t H, size_t hd, enum dos_dtype dtype, cudaStream_t stream);
cudaError_t _dos_attention_bwd_cuda(cublasHandle_t blas, const void *qkv, const void *probs, const void *dout,
				    void *dqkv, size_t B, size_t T, size_t H, size_t hd, enum dos_dtype dtype,
				    cudaStream_t stream);
cudaError_t _dos_gelu_fwd_cuda(const void *x, void *y, size_t n, enum dos_dtype dtype, cudaStream_t stream);
cudaError_t _dos_gelu_bwd_cuda(const void *x, const void *dy, void *dx, size_t n, enum dos_dtype dtype,
			       cudaStream_t stream);
cudaError_t _dos_xent_cuda(const void *logits, const int32_t *targets, float *loss, void *dlogits, size_t n, size_t V,
			   float grad_scale, enum dos_dtype dtype, cudaStream_t stream);
#ifdef __cplusplus
}
#endif
#endif /* DOS_USE_CUDA */

#endif /* DOS_MODEL_KERNELS_H */
