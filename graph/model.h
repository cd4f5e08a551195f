/* The example model of docs/model.md as StarPU tasks: parameters as per-tensor handles
 * over one flat array of the model's compute dtype (fp32, or fp16/bf16 for mixed
 * precision), and the forward and backward pass of one micro-batch
 * submitted as a task graph (activations registered per micro-batch, released after their
 * last use, so GPU memory rises in forward and falls in backward). */
#ifndef DOS_MODEL_H
#define DOS_MODEL_H

#include <starpu.h>
#include <stdint.h>

#include "dos.h"
#include "init_state.h"
#include "phase.h"

struct dos_model_shape {
	uint32_t vocab, hidden, heads, ffn, layers, seq_len;
};

/* Tensor indices in flat order (docs/model.md). */
enum {
	DOS_T_TOK_EMB = 0,
	DOS_T_POS_EMB = 1,
	DOS_T_LAYER0 = 2, /* then per layer: */
	DOS_T_LN1 = 0,
	DOS_T_QKV = 1,
	DOS_T_O = 2,
	DOS_T_LN2 = 3,
	DOS_T_FC1 = 4,
	DOS_T_FC2 = 5,
	DOS_T_PER_LAYER = 6,
};

struct dos_model {
	struct dos_model_shape shape;
	uint32_t batch;             /* sequences per micro-batch */
	int checkpoint_activations; /* keep only layer inputs; recompute the rest in backward */
	uint32_t where; /* forward and backward tasks run on STARPU_CUDA or STARPU_CPU workers only; 0: any */
	/* the compute dtype: of the working weights, the activations and the activation
	 * gradients; in fp16/bf16 the kernels compute in fp32 inside and round their outputs
	 * once (codelets/model_kernels.h). Weight gradients are fp32 in every dtype. */
	enum dos_dtype dtype;
	unsigned sched_ctx;
	uint32_t ntensors;
	uint64_t *numel; /* [ntensors] */
	uint64_t nparams;
	void *weights;                /* flat working weights (of dtype), home of the weight handles */
	int weights_pinned;           /* how _dos_host_alloc made them */
	starpu_data_handle_t *weight; /* [ntensors] */
	starpu_data_handle_t *grad;   /* [ntensors] fp32 gradients (no home) */
	/* within _dos_model_submit_eval: its tasks are in the evaluation phase, and named
	 * "dos_eval" in traces */
	int evaluating;
	/* the StarPU priority of the tasks being submitted: 0, except that train.c ranks a
	 * step's micro-batches, the earlier above the later */
	int priority;
	/* the head's activation gradient of the training micro-batch submitted last, kept
	 * registered until the next one's forward is ordered after its writer (model.c;
	 * NULL: none) */
	starpu_data_handle_t previous_backward;
	_dos_task_hook hook; /* optional: every task, before its submission (phase.h) */
	void *hook_arg;
};

#define DOS_MODEL_MAX_LAYERS 100000

/* Tensors of a shape in flat order: the two embeddings, DOS_T_PER_LAYER per layer, the
 * final norm and the head (a checked shape's count fits 32 bits). */
static inline uint32_t _dos_model_tensor_count(const struct dos_model_shape *shape)
{
	return DOS_T_LAYER0 + DOS_T_PER_LAYER * shape->layers + 2;
}

/* Checks a shape: every size > 0, hidden divisible by heads, at most DOS_MODEL_MAX_LAYERS
 * layers, every tensor within the 32-bit element count of a StarPU vector. Returns 0 or
 * -EINVAL naming the field and value. */
int _dos_model_shape_check(const struct dos_model_shape *shape);
/* Parameters of a shape, and each tensor's element count in flat order (numel may be
 * NULL; it has 2 + 6 * layers + 2 entries). */
uint64_t _dos_model_param_count(const struct dos_model_shape *shape, uint64_t *numel);
/* The initial weights of docs/model.md (bit-exact with the PyTorch reference). */
void _dos_model_init_weights(const struct dos_model_shape *shape, uint64_t seed, float *flat);
/* The same values, one parameter at a time (init_state.h): what they depend on. */
struct dos_init_layout _dos_model_init_layout(const struct dos_model_shape *shape, uint64_t seed);

/* After starpu_init: allocates and registers the parameters, initialised from `seed` (in
 * 16 bits: those values rounded to nearest even, as the optimizer's weight refresh rounds
 * its fp32 master weights). Forward and backward run on the GPUs when there are some,
 * on the CPU workers alone with on_cpu. Errors: those of _dos_model_shape_check, -EINVAL
 * for a NULL model, batch 0, a dtype that is not fp32, fp16 or bf16, activations beyond a
 * 32-bit vector, a scheduling context that does not exist, or on_cpu without a CPU
 * worker; -ENOMEM naming what could not be allocated. *model is left untouched then. */
int _dos_model_create(struct dos_model *model, const struct dos_model_shape *shape, uint32_t batch, uint64_t seed,
		      enum dos_dtype dtype, int checkpoint_activations, int on_cpu, unsigned sched_ctx);
/* Waits for the model's tasks, unregisters and frees (model->weights is up to date). */
void _dos_model_destroy(struct dos_model *model);

/* The activations forward and backward of one micro-batch of `batch` sequences keep alive
 * at once at their peak, in bytes (an upper bound from the shape): 16-bit activations in fp16/bf16, so
 * about half of fp32's (the few fp32 ones: RMSNorm's rstd, the per-token losses). */
uint64_t _dos_model_activation_bytes(const struct dos_model_shape *shape, uint32_t batch, enum dos_dtype dtype,
				     int checkpoint_activations);

/* Submits forward and backward of one micro-batch (ids and targets: int32 handles of
 * batch * seq_len tokens, unregistered here after their last use). Gradients are written
 * (accumulate = 0) or added (accumulate = 1) into model->grad, scaled by grad_scale (which
 * folds in 1 / (tokens * micro-batches) and the loss scale). *loss receives a new handle
 * of per-token losses (fp32, unscaled), which the caller reads and unregisters. */
int _dos_model_submit_microbatch(struct dos_model *model, starpu_data_handle_t ids, starpu_data_handle_t targets,
				 float grad_scale, int accumulate, starpu_data_handle_t *loss);
/* Submits the forward and loss of one micro-batch for evaluation, without backward: the
 * same losses submit_microbatch gives for these weights, nothing kept but them. Same
 * arguments and errors as _dos_model_submit_microbatch. */
int _dos_model_submit_eval(struct dos_model *model, starpu_data_handle_t ids, starpu_data_handle_t targets,
			   starpu_data_handle_t *loss);

#endif /* DOS_MODEL_H */
