/* The example model's task graph (model.h, docs/model.md). Every operation is one task
 * of a model codelet; StarPU's sequential consistency orders them through the handles,
 * so the graph is the program order below and the runtime finds the parallelism (the
 * weight-gradient products of a layer run beside the next data-gradient products, and
 * the optimizer's updates of a layer can start as soon as its gradients are final). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codelet_util.h"
#include "data.h"
#include "errors.h"
#include "host_memory.h"
#include "model.h"
#include "model_codelets.h"
#include "numerics.h"

int _dos_model_shape_check(const struct dos_model_shape *s)
{
	if (!s)
		return DOS_FAIL(-EINVAL, "shape is NULL");
	const struct {
		const char *name;
		uint32_t value;
	} fields[] = {{"vocab", s->vocab}, {"hidden", s->hidden}, {"heads", s->heads},
		      {"ffn", s->ffn},     {"layers", s->layers}, {"seq_len", s->seq_len}};
	for (size_t i = 0; i < sizeof fields / sizeof *fields; i++)
		if (fields[i].value == 0)
			return DOS_FAIL(-EINVAL, "model %s = 0: every size must be positive", fields[i].name);
	if (s->hidden % s->heads)
		return DOS_FAIL(-EINVAL, "model hidden = %u is not a multiple of heads = %u", s->hidden, s->heads);
	/* the tensor count is 32-bit, and a layer count beyond this is no model anyone trains */
	if (s->layers > DOS_MODEL_MAX_LAYERS)
		return DOS_FAIL(-EINVAL, "model layers = %u: at most %u", s->layers, DOS_MODEL_MAX_LAYERS);
	/* every tensor must fit a StarPU vector's 32-bit element count */
	uint64_t d = s->hidden;
	const struct {
		const char *name;
		uint64_t elements;
	} tensors[] = {{"vocab x hidden (embedding, head)", s->vocab * d},
		       {"seq_len x hidden (positions)", s->seq_len * d},
		       {"3 hidden x hidden (qkv)", 3 * d * d},
		       {"ffn x hidden (MLP)", s->ffn * d}};
	for (size_t i = 0; i < sizeof tensors / sizeof *tensors; i++)
		if (tensors[i].elements > UINT32_MAX)
			return DOS_FAIL(-EINVAL, "model %s = %llu elements: a tensor holds at most 2^32 - 1",
					tensors[i].name, (unsigned long long)tensors[i].elements);
	return 0;
}

/* What tensor t is, in flat order (_dos_model_tensor_count): the one place that decodes
 * the order, for the tensors' sizes and their initial values. */
enum tensor_kind { TOKEN_EMBEDDING, POSITIONS, NORM, QKV, ATTENTION_OUT, MLP, HEAD };

static enum tensor_kind tensor_kind(const struct dos_model_shape *s, uint32_t t)
{
	uint32_t layers_end = DOS_T_LAYER0 + DOS_T_PER_LAYER * s->layers;
	if (t == DOS_T_TOK_EMB)
		return TOKEN_EMBEDDING;
	if (t == DOS_T_POS_EMB)
		return POSITIONS;
	if (t >= layers_end)
		return t == layers_end ? NORM : HEAD; /* the final norm, the head */
	switch ((t - DOS_T_LAYER0) % DOS_T_PER_LAYER) {
	case DOS_T_QKV:
		return QKV;
	case DOS_T_O:
		return ATTENTION_OUT;
	case DOS_T_FC1:
	case DOS_T_FC2:
		return MLP;
	default: /* DOS_T_LN1, DOS_T_LN2 */
		return NORM;
	}
}

static uint64_t tensor_numel(const struct dos_model_shape *s, uint32_t t)
{
	uint64_t d = s->hidden;
	switch (tensor_kind(s, t)) {
	case TOKEN_EMBEDDING:
	case HEAD:
		return (uint64_t)s->vocab * d;
	case POSITIONS:
		return (uint64_t)s->seq_len * d;
	case QKV:
		return 3 * d * d;
	case ATTENTION_OUT:
		return d * d;
	case MLP:
		return (uint64_t)s->ffn * d;
	default: /* NORM */
		return d;
	}
}

uint64_t _dos_model_param_count(const struct dos_model_shape *s, uint64_t *numel)
{
	uint64_t total = 0;
	for (uint32_t t = 0; t < _dos_model_tensor_count(s); t++) {
		uint64_t n = tensor_numel(s, t);
		if (numel)
			numel[t] = n;
		total += n;
	}
	return total;
}

void _dos_model_init_weights(const struct dos_model_shape *s, uint64_t seed, float *flat)
{
	uint32_t ntensors = _dos_model_tensor_count(s);
	const float amplitude = dos_init_amplitude();
	uint64_t rng = seed;
	for (uint32_t t = 0; t < ntensors; t++) {
		uint64_t numel = tensor_numel(s, t); /* not an array of them: 100,000 layers would not fit a stack */
		int norm = tensor_kind(s, t) == NORM;
		for (uint64_t i = 0; i < numel; i++) {
			if (norm) {
				*flat++ = 1.0f;
				continue;
			}
			float u = (float)(_dos_splitmix64(&rng) >> 40) * 0x1.0p-24f;
			*flat++ = (2.0f * u - 1.0f) * amplitude;
		}
	}
}

struct dos_init_layout _dos_model_init_layout(const struct dos_model_shape *s, uint64_t seed)
{
	return (struct dos_init_layout){.seed = seed,
					.vocab = s->vocab,
					.seq_len = s->seq_len,
					.hidden = s->hidden,
					.ffn = s->ffn,
					.layers = s->layers,
					.amplitude = dos_init_amplitude()};
}

/* The initial working weights: docs/model.md's values, in 16 bits rounded once from a
 * transient fp32 copy. */
static int init_weights(struct dos_model *m, uint64_t seed)
{
	if (m->dtype == DOS_FP32) {
		_dos_model_init_weights(&m->shape, seed, m->weights);
		return 0;
	}
	float *flat = malloc(m->nparams * sizeof(float));
	if (!flat)
		return DOS_FAIL(-ENOMEM, "no memory for the %llu fp32 initial weights to round to %s",
				(unsigned long long)m->nparams, dos_dtype_name(m->dtype));
	_dos_model_init_weights(&m->shape, seed, flat);
	for (uint64_t i = 0; i < m->nparams; i++)
		dos_store_elem(m->weights, i, m->dtype, flat[i]);
	free(flat);
	return 0;
}

uint64_t _dos_model_activation_bytes(const struct dos_model_shape *s, uint32_t batch, enum dos_dtype dtype,
				     int checkpoint_activations)
{
	uint64_t n = (uint64_t)batch * s->seq_len, d = s->hidden, F = s->ffn, V = s->vocab;
	/* elements of the model dtype: what one layer's backward needs from its forward
	 * (layer_activations, and x), the head's (hf, x_L, logits, dlogits) and backward's
	 * transients (da, du, dh, datt, dqkv, dx) */
	uint64_t layer = 8 * n * d + 2 * n * F + (uint64_t)batch * s->heads * s->seq_len * s->seq_len;
	uint64_t saved = checkpoint_activations ? s->layers * n * d + layer : s->layers * layer;
	uint64_t head = 2 * n * d + 2 * n * V;
	uint64_t transients = 2 * n * F + 6 * n * d;
	/* fp32 in every dtype: rstd1 and rstd2 per saved layer, rstdf and the losses */
	uint64_t saved_rows = (checkpoint_activations ? 1 : s->layers) * 2 * n;
	return dos_dtype_size(dtype) * (saved + head + transients) + 4 * (saved_rows + 2 * n);
}

int _dos_model_create(struct dos_model *out, const struct dos_model_shape *shape, uint32_t batch, uint64_t seed,
		      enum dos_dtype dtype, int checkpoint_activations, int on_cpu, unsigned sched_ctx)
{
	int err;
	if (!out)
		return DOS_FAIL(-EINVAL, "model is NULL");
	if ((err = _dos_model_shape_check(shape)))
		return err;
	if (batch == 0)
		return DOS_FAIL(-EINVAL, "micro-batch = 0 sequences");
	if (dtype != DOS_FP32 && dtype != DOS_FP16 && dtype != DOS_BF16)
		return DOS_FAIL(-EINVAL, "model dtype = %d is not fp32, fp16 or bf16", (int)dtype);
	/* the widest activations (logits, qkv, attention scores) are StarPU vectors too; in
	 * double, since a product of four 32-bit sizes can wrap 64 bits */
	double tokens = (double)batch * shape->seq_len;
	double widest =
		fmax(fmax(tokens * shape->vocab, tokens * 3.0 * shape->hidden), tokens * shape->heads * shape->seq_len);
	if (widest > (double)UINT32_MAX)
		return DOS_FAIL(-EINVAL,
				"micro-batch = %u sequences of %u tokens: activations of %.0f elements exceed 2^32 - 1",
				batch, shape->seq_len, widest);
	if ((err = _dos_check_sched_ctx(__func__, "sched_ctx", sched_ctx)))
		return err;
	if (on_cpu && starpu_cpu_worker_get_count() == 0)
		return DOS_FAIL(-EINVAL,
				"model_on_cpu: StarPU has no CPU worker to run forward and backward (STARPU_NCPU = %s)",
				getenv("STARPU_NCPU") ? getenv("STARPU_NCPU") : "unset");
	/* built aside and copied out at the end: a refused or failed call leaves *out as it was */
	struct dos_model model = {0}, *m = &model;
	m->shape = *shape;
	m->batch = batch;
	m->checkpoint_activations = checkpoint_activations;
	m->dtype = dtype;
	m->sched_ctx = sched_ctx;
	m->ntensors = _dos_model_tensor_count(shape);
	m->numel = calloc(m->ntensors, sizeof *m->numel);
	m->weight = calloc(m->ntensors, sizeof *m->weight);
	m->grad = calloc(m->ntensors, sizeof *m->grad);
	if (!m->numel || !m->weight || !m->grad) {
		err = DOS_FAIL(-ENOMEM, "no memory for the tables of %u tensors", m->ntensors);
		goto fail;
	}
	m->nparams = _dos_model_param_count(shape, m->numel);
	const size_t es = dos_dtype_size(dtype);
	char what[64];
	snprintf(what, sizeof what, "the model's %s working weights", dos_dtype_name(dtype));
	if ((err = _dos_host_alloc(&m->weights, m->nparams * es, what, &m->weights_pinned)))
		goto fail;
	if (DOS_VALUES_ARE_REAL && (err = init_weights(m, seed))) {
		_dos_host_free(m->weights, m->nparams * es, m->weights_pinned);
		goto fail;
	}
	/* as in real training, forward and backward run on the GPU when there is one, unless
	 * asked to stay on the CPU; the GPU's products need StarPU's cuBLAS handles (without
	 * them every GPU product aborts), which the CPU's do not */
	m->where = on_cpu ? STARPU_CPU : starpu_cuda_worker_get_count() > 0 ? STARPU_CUDA : 0;
	if (m->where != STARPU_CPU)
		_dos_model_codelets_prepare();
	uint64_t offset = 0;
	for (uint32_t t = 0; t < m->ntensors; t++) {
		starpu_vector_data_register(&m->weight[t], STARPU_MAIN_RAM,
					    (uintptr_t)((char *)m->weights + offset * es), (uint32_t)m->numel[t], es);
		starpu_vector_data_register(&m->grad[t], -1, 0, (uint32_t)m->numel[t], sizeof(float));
		offset += m->numel[t];
	}
	*out = model;
	return 0;
fail:
	free(m->numel);
	free(m->weight);
	free(m->grad);
	return err;
}

void _dos_model_destroy(struct dos_model *m)
{
	if (!m || !m->numel)
		return;
	for (uint32_t t = 0; t < m->ntensors; t++) {
		starpu_data_unregister(m->weight[t]);
		starpu_data_unregister(m->grad[t]);
	}
	if (m->previous_backward)
		starpu_data_unregister(m->previous_backward);
	_dos_host_free(m->weights, m->nparams * dos_dtype_size(m->dtype), m->weights_pinned);
	free(m->numel);
	free(m->weight);
	free(m->grad);
	*m = (struct dos_model){0};
}

/* ---- task submission ------------------------------------------------------------------ */

struct buffer {
	starpu_data_handle_t handle;
	enum starpu_data_access_mode mode;
};

/* A product's codelet for the model's dtype: the 16-bit compute ones keep perfmodels of
 * their own (codelets/model_codelets.c). */
static struct starpu_codelet *product(const struct dos_model *m, struct starpu_codelet *fp32,
				      struct starpu_codelet *sixteen)
{
	return m->dtype == DOS_FP32 ? fp32 : sixteen;
}

/* The phase of the forward tasks being submitted: a training forward, or an evaluation. */
static enum _dos_task_phase forward_phase(const struct dos_model *m)
{
	return m->evaluating ? DOS_TASK_EVALUATION : DOS_TASK_FORWARD;
}

/* One task of `cl` in `phase` over `buffers` with a private copy of `args`. Submission
 * errors abort: they mean a broken graph (a bug), and a half-submitted iteration cannot be
 * undone. */
static void submit(struct dos_model *m, enum _dos_task_phase phase, struct starpu_codelet *cl,
		   const struct _dos_model_args *args, const struct buffer *buffers, int nbuffers)
{
	struct starpu_task *task = starpu_task_create();
	struct _dos_model_args *copy = malloc(sizeof *copy);
	STARPU_ASSERT_MSG(task && copy, "out of memory submitting %s", cl->name);
	STARPU_ASSERT(nbuffers <= STARPU_NMAXBUFS);
	*copy = *args;
	copy->dtype = m->dtype;
	task->cl = cl;
	task->cl_arg = copy;
	task->cl_arg_size = sizeof *copy;
	task->cl_arg_free = 1;
	task->sched_ctx = m->sched_ctx;
	task->priority = m->priority;
	/* so that traces, timelines and dos-train's accounting tell evaluation from training */
	if (m->evaluating)
		task->name = "dos_eval";
	if (m->where)
		task->where = m->where;
	task->nbuffers = nbuffers;
	for (int i = 0; i < nbuffers; i++) {
		task->handles[i] = buffers[i].handle;
		task->modes[i] = buffers[i].mode;
	}
	if (m->hook)
		m->hook(m->hook_arg, task, phase, DOS_NO_SUBGROUP);
	int err = starpu_task_submit(task);
	STARPU_ASSERT_MSG(err == 0, "submitting %s failed (%d)", cl->name, err);
}

/* An activation (or activation gradient) of `count` elements of the model dtype. */
static starpu_data_handle_t activation(const struct dos_model *m, uint64_t count)
{
	starpu_data_handle_t h;
	starpu_vector_data_register(&h, -1, 0, (uint32_t)count, dos_dtype_size(m->dtype));
	return h;
}

/* Per-row statistics (RMSNorm's rstd) stay fp32 in every dtype: n values, and backward
 * needs them exact. */
static starpu_data_handle_t row_stats(uint64_t count)
{
	starpu_data_handle_t h;
	starpu_vector_data_register(&h, -1, 0, (uint32_t)count, sizeof(float));
	return h;
}

static void release(starpu_data_handle_t *h)
{
	if (*h) {
		starpu_data_unregister_submit(*h);
		*h = NULL;
	}
}

/* Runs nothing (StarPU skips it once its data accesses allow it): it reads `after` and
 * writes `before`, so the next task to write `before` starts only once `after`'s last
 * writer has ended. StarPU orders the accesses of each handle as they were submitted, so
 * this orders a task after one submitted earlier without keeping that task, which a task
 * dependency would need (and which races with its termination in StarPU 1.4.10). */
static struct starpu_codelet order_codelet = {
	.where = STARPU_NOWHERE,
	.nbuffers = 2,
	.modes = {STARPU_R, STARPU_W},
	.name = "dos_order",
};

static void order_after(struct dos_model *m, starpu_data_handle_t after, starpu_data_handle_t before)
{
	struct starpu_task *task = starpu_task_create();
	STARPU_ASSERT_MSG(task, "out of memory submitting dos_order");
	task->cl = &order_codelet;
	task->sched_ctx = m->sched_ctx;
	task->handles[0] = after;
	task->handles[1] = before;
	int err = starpu_task_submit(task);
	STARPU_ASSERT_MSG(err == 0, "submitting dos_order failed (%d)", err);
}

static enum starpu_data_access_mode out_mode(int accumulate)
{
	return accumulate ? STARPU_RW : STARPU_W;
}

static void linear_fwd(struct dos_model *m, starpu_data_handle_t x, starpu_data_handle_t w,
		       starpu_data_handle_t residual, starpu_data_handle_t y, uint32_t n, uint32_t in, uint32_t out)
{
	struct _dos_model_args a = {.n = n, .d = in, .out = out};
	struct buffer b[] = {{x, STARPU_R}, {w, STARPU_R}, {y, STARPU_W}, {residual, STARPU_R}};
	submit(m, forward_phase(m), product(m, &_dos_linear_fwd_codelet, &_dos_linear_fwd16_codelet), &a, b,
	       residual ? 4 : 3);
}

/* dx (+)= dy w and dw (+)= dy^T x for y = x w^T. */
static void linear_bwd(struct dos_model *m, starpu_data_handle_t dy, starpu_data_handle_t w, starpu_data_handle_t x,
		       starpu_data_handle_t dx, int accumulate_dx, starpu_data_handle_t dw, int accumulate_dw,
		       uint32_t n, uint32_t in, uint32_t out)
{
	struct _dos_model_args a = {.n = n, .d = in, .out = out, .accumulate = accumulate_dx};
	struct buffer bd[] = {{dy, STARPU_R}, {w, STARPU_R}, {dx, out_mode(accumulate_dx)}};
	submit(m, DOS_TASK_BACKWARD, product(m, &_dos_linear_bwd_data_codelet, &_dos_linear_bwd_data16_codelet), &a, bd,
	       3);
	a.accumulate = accumulate_dw;
	struct buffer bw[] = {{dy, STARPU_R}, {x, STARPU_R}, {dw, out_mode(accumulate_dw)}};
	submit(m, DOS_TASK_BACKWARD, product(m, &_dos_linear_bwd_weight_codelet, &_dos_linear_bwd_weight16_codelet), &a,
	       bw, 3);
}

static void rmsnorm_fwd(struct dos_model *m, starpu_data_handle_t x, starpu_data_handle_t w, starpu_data_handle_t y,
			starpu_data_handle_t rstd, uint32_t n)
{
	struct _dos_model_args a = {.n = n, .d = m->shape.hidden};
	struct buffer b[] = {{x, STARPU_R}, {w, STARPU_R}, {y, STARPU_W}, {rstd, STARPU_W}};
	submit(m, forward_phase(m), &_dos_rmsnorm_fwd_codelet, &a, b, 4);
}

static void rmsnorm_bwd(struct dos_model *m, starpu_data_handle_t x, starpu_data_handle_t w, starpu_data_handle_t rstd,
			starpu_data_handle_t dy, starpu_data_handle_t dx, int accumulate_dx, starpu_data_handle_t dw,
			int accumulate_dw, uint32_t n)
{
	struct _dos_model_args a = {
		.n = n, .d = m->shape.hidden, .accumulate = accumulate_dx, .accumulate2 = accumulate_dw};
	struct buffer b[] = {{x, STARPU_R},
			     {w, STARPU_R},
			     {rstd, STARPU_R},
			     {dy, STARPU_R},
			     {dx, out_mode(accumulate_dx)},
			     {dw, out_mode(accumulate_dw)}};
	submit(m, DOS_TASK_BACKWARD, &_dos_rmsnorm_bwd_codelet, &a, b, 6);
}

/* What one layer's backward pass needs from its forward pass. */
struct layer_activations {
	starpu_data_handle_t h1, rstd1, qkv, att, probs, xmid, h2, rstd2, u, a;
};

static void release_layer(struct layer_activations *act)
{
	starpu_data_handle_t *all[] = {&act->h1,   &act->rstd1, &act->qkv,   &act->att, &act->probs,
				       &act->xmid, &act->h2,    &act->rstd2, &act->u,   &act->a};
	for (size_t i = 0; i < sizeof all / sizeof *all; i++)
		release(all[i]);
}

static starpu_data_handle_t layer_param(struct dos_model *m, starpu_data_handle_t *array, uint32_t l, int k)
{
	return array[DOS_T_LAYER0 + DOS_T_PER_LAYER * l + k];
}

/* Layer l's forward from x; returns x_out unless `recompute` (backward needs only the
 * activations, not the layer's output). A recomputation starts once the writer of
 * `after` (NULL: none) has ended. */
static starpu_data_handle_t layer_forward(struct dos_model *m, uint32_t l, starpu_data_handle_t x,
					  struct layer_activations *act, int recompute, starpu_data_handle_t after)
{
	const struct dos_model_shape *s = &m->shape;
	uint32_t n = m->batch * s->seq_len, d = s->hidden, F = s->ffn;
	act->h1 = activation(m, (uint64_t)n * d);
	act->rstd1 = row_stats(n);
	if (after)
		order_after(m, after, act->h1);
	rmsnorm_fwd(m, x, layer_param(m, m->weight, l, DOS_T_LN1), act->h1, act->rstd1, n);
	act->qkv = activation(m, (uint64_t)n * 3 * d);
	linear_fwd(m, act->h1, layer_param(m, m->weight, l, DOS_T_QKV), NULL, act->qkv, n, d, 3 * d);
	act->att = activation(m, (uint64_t)n * d);
	act->probs = activation(m, (uint64_t)m->batch * s->heads * s->seq_len * s->seq_len);
	struct _dos_model_args aa = {.n = n, .B = m->batch, .T = s->seq_len, .H = s->heads, .hd = d / s->heads, .d = d};
	struct buffer ab[] = {{act->qkv, STARPU_R}, {act->att, STARPU_W}, {act->probs, STARPU_W}};
	submit(m, forward_phase(m), product(m, &_dos_attention_fwd_codelet, &_dos_attention_fwd16_codelet), &aa, ab, 3);
	act->xmid = activation(m, (uint64_t)n * d);
	linear_fwd(m, act->att, layer_param(m, m->weight, l, DOS_T_O), x, act->xmid, n, d, d);
	act->h2 = activation(m, (uint64_t)n * d);
	act->rstd2 = row_stats(n);
	rmsnorm_fwd(m, act->xmid, layer_param(m, m->weight, l, DOS_T_LN2), act->h2, act->rstd2, n);
	act->u = activation(m, (uint64_t)n * F);
	linear_fwd(m, act->h2, layer_param(m, m->weight, l, DOS_T_FC1), NULL, act->u, n, d, F);
	act->a = activation(m, (uint64_t)n * F);
	struct _dos_model_args ga = {.n = n * F};
	struct buffer gb[] = {{act->u, STARPU_R}, {act->a, STARPU_W}};
	submit(m, forward_phase(m), &_dos_gelu_fwd_codelet, &ga, gb, 2);
	if (recompute)
		return NULL;
	starpu_data_handle_t x_out = activation(m, (uint64_t)n * d);
	linear_fwd(m, act->a, layer_param(m, m->weight, l, DOS_T_FC2), act->xmid, x_out, n, F, d);
	return x_out;
}

/* Layer l's backward: dx holds d(x_out) and becomes d(x_in). *started is what its first
 * task writes, left registered for the caller to order later tasks after that task. */
static void layer_backward(struct dos_model *m, uint32_t l, starpu_data_handle_t x, struct layer_activations *act,
			   starpu_data_handle_t dx, int accumulate, starpu_data_handle_t *started)
{
	const struct dos_model_shape *s = &m->shape;
	uint32_t n = m->batch * s->seq_len, d = s->hidden, F = s->ffn;
	starpu_data_handle_t da = activation(m, (uint64_t)n * F);
	linear_bwd(m, dx, layer_param(m, m->weight, l, DOS_T_FC2), act->a, da, 0, layer_param(m, m->grad, l, DOS_T_FC2),
		   accumulate, n, F, d);
	starpu_data_handle_t du = activation(m, (uint64_t)n * F);
	struct _dos_model_args ga = {.n = n * F};
	struct buffer gb[] = {{act->u, STARPU_R}, {da, STARPU_R}, {du, STARPU_W}};
	submit(m, DOS_TASK_BACKWARD, &_dos_gelu_bwd_codelet, &ga, gb, 3);
	*started = da;
	starpu_data_handle_t dh = activation(m, (uint64_t)n * d);
	linear_bwd(m, du, layer_param(m, m->weight, l, DOS_T_FC1), act->h2, dh, 0,
		   layer_param(m, m->grad, l, DOS_T_FC1), accumulate, n, d, F);
	release(&du);
	rmsnorm_bwd(m, act->xmid, layer_param(m, m->weight, l, DOS_T_LN2), act->rstd2, dh, dx, 1,
		    layer_param(m, m->grad, l, DOS_T_LN2), accumulate, n);
	starpu_data_handle_t datt = activation(m, (uint64_t)n * d);
	linear_bwd(m, dx, layer_param(m, m->weight, l, DOS_T_O), act->att, datt, 0, layer_param(m, m->grad, l, DOS_T_O),
		   accumulate, n, d, d);
	starpu_data_handle_t dqkv = activation(m, (uint64_t)n * 3 * d);
	struct _dos_model_args aa = {.n = n, .B = m->batch, .T = s->seq_len, .H = s->heads, .hd = d / s->heads, .d = d};
	struct buffer ab[] = {{act->qkv, STARPU_R}, {act->probs, STARPU_R}, {datt, STARPU_R}, {dqkv, STARPU_W}};
	submit(m, DOS_TASK_BACKWARD, product(m, &_dos_attention_bwd_codelet, &_dos_attention_bwd16_codelet), &aa, ab,
	       4);
	release(&datt);
	linear_bwd(m, dqkv, layer_param(m, m->weight, l, DOS_T_QKV), act->h1, dh, 0,
		   layer_param(m, m->grad, l, DOS_T_QKV), accumulate, n, d, 3 * d);
	release(&dqkv);
	rmsnorm_bwd(m, x, layer_param(m, m->weight, l, DOS_T_LN1), act->rstd1, dh, dx, 1,
		    layer_param(m, m->grad, l, DOS_T_LN1), accumulate, n);
	release(&dh);
}

/* Forward and loss of a micro-batch: x[l] is layer l's input, acts[l] its activations;
 * *hf, *rstdf the final norm's output and row statistics, *dlogits the loss gradient
 * (scaled by grad_scale), *loss the per-token losses. For evaluation (eval = 1) everything
 * but the losses is released after its last use; for backward, x, hf, rstdf, dlogits, ids
 * and (without activation checkpointing) acts stay for it. */
static void forward_loss(struct dos_model *m, starpu_data_handle_t ids, starpu_data_handle_t targets, float grad_scale,
			 int eval, starpu_data_handle_t *x, struct layer_activations *acts, starpu_data_handle_t *hf,
			 starpu_data_handle_t *rstdf, starpu_data_handle_t *dlogits, starpu_data_handle_t *loss)
{
	const struct dos_model_shape *s = &m->shape;
	uint32_t n = m->batch * s->seq_len, d = s->hidden, V = s->vocab, L = s->layers;
	uint32_t lnf = DOS_T_LAYER0 + DOS_T_PER_LAYER * L, head = lnf + 1;
	x[0] = activation(m, (uint64_t)n * d);
	/* A training forward starts once the previous micro-batch's backward has: it reads
	 * only the weights, so nothing else keeps a worker from running the forwards of all
	 * of a step's micro-batches first and holding all their activations at once. After
	 * the backward's first task, not a later one: those write weight gradients, which on
	 * the ranks after the first of a chain wait for another rank. */
	if (!eval && m->previous_backward) {
		order_after(m, m->previous_backward, x[0]);
		release(&m->previous_backward);
	}
	struct _dos_model_args ea = {.n = n, .T = s->seq_len, .d = d, .V = V};
	struct buffer eb[] = {{ids, STARPU_R},
			      {m->weight[DOS_T_TOK_EMB], STARPU_R},
			      {m->weight[DOS_T_POS_EMB], STARPU_R},
			      {x[0], STARPU_W}};
	submit(m, forward_phase(m), &_dos_embed_fwd_codelet, &ea, eb, 4);
	if (eval)
		release(&ids);
	for (uint32_t l = 0; l < L; l++) {
		x[l + 1] = layer_forward(m, l, x[l], &acts[l], 0, NULL);
		if (m->checkpoint_activations || eval)
			release_layer(&acts[l]);
		if (eval)
			release(&x[l]);
	}
	*hf = activation(m, (uint64_t)n * d), *rstdf = row_stats(n);
	rmsnorm_fwd(m, x[L], m->weight[lnf], *hf, *rstdf, n);
	starpu_data_handle_t logits = activation(m, (uint64_t)n * V);
	*dlogits = activation(m, (uint64_t)n * V);
	linear_fwd(m, *hf, m->weight[head], NULL, logits, n, d, V);
	starpu_vector_data_register(loss, -1, 0, n, sizeof(float));
	struct _dos_model_args xa = {.n = n, .V = V, .grad_scale = grad_scale};
	struct buffer xb[] = {{logits, STARPU_R}, {targets, STARPU_R}, {*loss, STARPU_W}, {*dlogits, STARPU_W}};
	submit(m, forward_phase(m), &_dos_xent_codelet, &xa, xb, 4);
	release(&logits);
	release(&targets);
	if (eval) {
		release(&x[L]);
		release(hf);
		release(rstdf);
		release(dlogits);
	}
}

/* The arguments both submitters check. */
static int check_batch(const struct dos_model *m, starpu_data_handle_t ids, starpu_data_handle_t targets,
		       starpu_data_handle_t *loss)
{
	if (!m || !m->numel || !ids || !targets || !loss)
		return DOS_FAIL(-EINVAL, "NULL argument (model %p, ids %p, targets %p, loss %p)", (const void *)m,
				(void *)ids, (void *)targets, (void *)loss);
	uint32_t n = m->batch * m->shape.seq_len;
	if (starpu_vector_get_nx(ids) != n || starpu_vector_get_nx(targets) != n)
		return DOS_FAIL(-EINVAL, "ids/targets have %u/%u tokens, the micro-batch has %u",
				starpu_vector_get_nx(ids), starpu_vector_get_nx(targets), n);
	return 0;
}

int _dos_model_submit_eval(struct dos_model *m, starpu_data_handle_t ids, starpu_data_handle_t targets,
			   starpu_data_handle_t *loss)
{
	int err = check_batch(m, ids, targets, loss);
	if (err)
		return err;
	uint32_t L = m->shape.layers;
	starpu_data_handle_t x[L + 1], hf, rstdf, dlogits;
	struct layer_activations acts[L];
	memset(acts, 0, sizeof acts);
	m->evaluating = 1;
	forward_loss(m, ids, targets, 1.0f, 1, x, acts, &hf, &rstdf, &dlogits, loss);
	m->evaluating = 0;
	return 0;
}

int _dos_model_submit_microbatch(struct dos_model *m, starpu_data_handle_t ids, starpu_data_handle_t targets,
				 float grad_scale, int accumulate, starpu_data_handle_t *loss)
{
	int err = check_batch(m, ids, targets, loss);
	if (err)
		return err;
	if (!isfinite(grad_scale) || grad_scale <= 0)
		return DOS_FAIL(-EINVAL, "grad_scale = %g must be finite and positive", grad_scale);
	const struct dos_model_shape *s = &m->shape;
	uint32_t n = m->batch * s->seq_len, d = s->hidden, V = s->vocab, L = s->layers;
	uint32_t lnf = DOS_T_LAYER0 + DOS_T_PER_LAYER * L, head = lnf + 1;

	/* forward: x[l] is layer l's input, kept for backward */
	starpu_data_handle_t x[L + 1], hf, rstdf, dlogits;
	struct layer_activations acts[L];
	memset(acts, 0, sizeof acts);
	forward_loss(m, ids, targets, grad_scale, 0, x, acts, &hf, &rstdf, &dlogits, loss);

	/* backward, last layer first: each layer's weight gradients are final (for this
	 * micro-batch) as soon as its backward tasks end */
	starpu_data_handle_t dhf = activation(m, (uint64_t)n * d), dx = activation(m, (uint64_t)n * d);
	linear_bwd(m, dlogits, m->weight[head], hf, dhf, 0, m->grad[head], accumulate, n, d, V);
	release(&dlogits);
	rmsnorm_bwd(m, x[L], m->weight[lnf], rstdf, dhf, dx, 0, m->grad[lnf], accumulate, n);
	release(&hf);
	release(&rstdf);
	release(&x[L]);
	/* the head's backward has started once dhf is written: the next micro-batch's forward
	 * starts after it (forward_loss) */
	m->previous_backward = dhf;
	/* A layer's recomputation reads only its saved input and the weights, so all of them
	 * would be ready, and run, at the start of backward, the recomputed activations of
	 * every layer live at once: each starts once the backward of the layer above (the
	 * head's, for the last layer) has started. */
	starpu_data_handle_t above_started = dhf;
	for (uint32_t l = L; l-- > 0;) {
		if (m->checkpoint_activations)
			layer_forward(m, l, x[l], &acts[l], 1, above_started);
		if (above_started != dhf)
			release(&above_started);
		layer_backward(m, l, x[l], &acts[l], dx, accumulate, &above_started);
		release_layer(&acts[l]);
		release(&x[l]);
	}
	release(&above_started);
	struct _dos_model_args ea = {.n = n, .T = s->seq_len, .d = d, .V = V, .accumulate = accumulate};
	struct buffer bb[] = {{ids, STARPU_R},
			      {dx, STARPU_R},
			      {m->grad[DOS_T_TOK_EMB], out_mode(accumulate)},
			      {m->grad[DOS_T_POS_EMB], out_mode(accumulate)}};
	submit(m, DOS_TASK_BACKWARD, &_dos_embed_bwd_codelet, &ea, bb, 4);
	release(&dx);
	release(&ids);
	return 0;
}
