/* The StarPU codelets of the example model: one per kernel of model_kernels.h, each with a
 * CPU and a CUDA implementation and a regression perfmodel. The graph builder
 * (graph/model.c) inserts them with the buffers in the order listed and cl_arg pointing to
 * a struct _dos_model_args (STARPU_CL_ARGS with a malloc'd copy, not STARPU_VALUE, which
 * would pack it). All buffers are vector handles. */
#ifndef DOS_MODEL_CODELETS_H
#define DOS_MODEL_CODELETS_H

#include <starpu.h>
#include <stdint.h>

#include "dos.h"

/* Sizes shared by every model codelet; each codelet reads the fields it needs. */
struct _dos_model_args {
	uint32_t n;       /* tokens in the micro-batch (B*T) */
	uint32_t B, T;    /* sequences, tokens per sequence */
	uint32_t H, hd;   /* heads, head width */
	uint32_t d;       /* row width of the tensor at hand (hidden size, or `in` of a linear) */
	uint32_t out;     /* linear: output features */
	uint32_t V;       /* vocabulary (embedding backward, cross-entropy) */
	int accumulate;   /* backward: add to the output gradient instead of overwriting it */
	int accumulate2;  /* rmsnorm backward: the same for dw (accumulate applies to dx) */
	float grad_scale; /* cross-entropy: multiplier of dlogits */
	/* the model's compute dtype (model_kernels.h): of the weights, activations and
	 * activation gradients; weight gradients, rstd and losses are fp32 whatever it is */
	enum dos_dtype dtype;
};

/* buffers: ids (int32, R), tok_emb (R), pos_emb (R), x (W) */
extern struct starpu_codelet _dos_embed_fwd_codelet;
/* buffers: ids (R), dx (R), dtok (W or RW), dpos (W or RW) */
extern struct starpu_codelet _dos_embed_bwd_codelet;
/* buffers: x (R), w (R), y (W), rstd (W) */
extern struct starpu_codelet _dos_rmsnorm_fwd_codelet;
/* buffers: x (R), w (R), rstd (R), dy (R), dx (W or RW), dw (W or RW) */
extern struct starpu_codelet _dos_rmsnorm_bwd_codelet;
/* buffers: x (R), w (R), y (W) and optionally residual (R) as a 4th buffer: y = residual +
 * x w^T (variable number of buffers: 3 or 4). d = in, out = out. */
extern struct starpu_codelet _dos_linear_fwd_codelet;
/* buffers: dy (R), w (R), dx (W or RW) */
extern struct starpu_codelet _dos_linear_bwd_data_codelet;
/* buffers: dy (R), x (R), dw (W or RW) */
extern struct starpu_codelet _dos_linear_bwd_weight_codelet;
/* buffers: qkv (R), out (W), probs (W) */
extern struct starpu_codelet _dos_attention_fwd_codelet;
/* buffers: qkv (R), probs (R), dout (R), dqkv (W) */
extern struct starpu_codelet _dos_attention_bwd_codelet;
/* The five products above in 16-bit compute (same kernels and buffers, perfmodels of
 * their own: "dos_linear_fwd16", ...); graph/model.c picks one by the model's dtype. */
extern struct starpu_codelet _dos_linear_fwd16_codelet, _dos_linear_bwd_data16_codelet,
	_dos_linear_bwd_weight16_codelet, _dos_attention_fwd16_codelet, _dos_attention_bwd16_codelet;
/* buffers: x (R), y (W) */
extern struct starpu_codelet _dos_gelu_fwd_codelet;
/* buffers: x (R), dy (R), dx (W) */
extern struct starpu_codelet _dos_gelu_bwd_codelet;
/* buffers: logits (R), targets (int32, R), loss (W, n floats), dlogits (W) */
extern struct starpu_codelet _dos_xent_codelet;

/* Every model codelet is declared with STARPU_VARIABLE_NBUFFERS and no modes, so each task
 * carries its own: outputs marked "W or RW" are STARPU_W when the task overwrites them and
 * STARPU_RW when it accumulates (StarPU reads cl->modes, not the task's, for codelets with
 * a fixed buffer count). */

/* Makes StarPU's per-worker cuBLAS handles exist (starpu_cublas_init) when there are CUDA
 * workers and nobody created them yet: the products' CUDA implementations take
 * starpu_cublas_get_local_handle(), which is NULL until then. Call after starpu_init,
 * outside tasks, before submitting model tasks. No-op without CUDA. */
void _dos_model_codelets_prepare(void);

/* The "size" the products' perfmodels regress on: floating-point operations. */
size_t _dos_linear_flops(struct starpu_task *task, unsigned nimpl);
size_t _dos_attention_fwd_flops(struct starpu_task *task, unsigned nimpl);
size_t _dos_attention_bwd_flops(struct starpu_task *task, unsigned nimpl);

#endif /* DOS_MODEL_CODELETS_H */
