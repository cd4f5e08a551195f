/* The host application's model (mlp.h): its codelets, CPU only, with plain loops in a
 * fixed order, so every run computes the same bits wherever its tasks run. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "mlp.h"

static const uint64_t numel[MLP_NTENSORS] = {MLP_IN * MLP_HIDDEN, MLP_HIDDEN, MLP_HIDDEN *MLP_OUT, MLP_OUT};

uint64_t mlp_numel(int t)
{
	return numel[t];
}

uint64_t mlp_nparams(void)
{
	return numel[MLP_W1] + numel[MLP_B1] + numel[MLP_W2] + numel[MLP_B2];
}

/* splitmix64: the synthetic data and the initial weights are functions of their indices */
static uint64_t mix(uint64_t x)
{
	x += 0x9E3779B97F4A7C15ull;
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
	x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
	return x ^ (x >> 31);
}

/* Uniform in [-1, 1), from three indices. */
static float uniform(uint64_t a, uint64_t b, uint64_t c)
{
	uint64_t r = mix(mix(mix(a) ^ b) ^ c);
	return (float)((double)(r >> 40) * 0x1.0p-23 - 1.0);
}

/* ---- kernels: plain pointers, called by the codelets and by mlp_host_step ------------- */

/* x [BATCH x IN] and target [BATCH x OUT] = x times a fixed teacher matrix */
static void make_batch(uint64_t step, float *x, float *t)
{
	for (int i = 0; i < MLP_BATCH; i++)
		for (int j = 0; j < MLP_IN; j++)
			x[i * MLP_IN + j] = uniform(1, step * MLP_BATCH + (uint64_t)i, (uint64_t)j);
	for (int i = 0; i < MLP_BATCH; i++)
		for (int k = 0; k < MLP_OUT; k++) {
			float s = 0;
			for (int j = 0; j < MLP_IN; j++)
				s += x[i * MLP_IN + j] * (0.5f * uniform(2, (uint64_t)j, (uint64_t)k));
			t[i * MLP_OUT + k] = s;
		}
}

/* y [BATCH x N] = act(a [BATCH x K] w [K x N] + b) */
static void dense(const float *a, const float *w, const float *b, float *y, int k_dim, int n_dim, int relu)
{
	for (int i = 0; i < MLP_BATCH; i++)
		for (int n = 0; n < n_dim; n++) {
			float s = b[n];
			for (int k = 0; k < k_dim; k++)
				s += a[i * k_dim + k] * w[k * n_dim + n];
			y[i * n_dim + n] = relu && s < 0 ? 0 : s;
		}
}

/* loss = mean of (out - target)^2 / 2; dout = its gradient */
static float mse(const float *out, const float *t, float *dout)
{
	const int n = MLP_BATCH * MLP_OUT;
	double sum = 0;
	for (int i = 0; i < n; i++) {
		float d = out[i] - t[i];
		sum += (double)d * d;
		dout[i] = d / (float)n;
	}
	return (float)(sum / (2.0 * n));
}

/* dW [K x N] = a^T dy, db = column sums of dy */
static void weight_grads(const float *a, const float *dy, float *dw, float *db, int k_dim, int n_dim)
{
	for (int k = 0; k < k_dim; k++)
		for (int n = 0; n < n_dim; n++) {
			float s = 0;
			for (int i = 0; i < MLP_BATCH; i++)
				s += a[i * k_dim + k] * dy[i * n_dim + n];
			dw[k * n_dim + n] = s;
		}
	for (int n = 0; n < n_dim; n++) {
		float s = 0;
		for (int i = 0; i < MLP_BATCH; i++)
			s += dy[i * n_dim + n];
		db[n] = s;
	}
}

/* dhidden = (dout W2^T) where hidden > 0 */
static void hidden_grad(const float *dout, const float *w2, const float *h, float *dh)
{
	for (int i = 0; i < MLP_BATCH; i++)
		for (int k = 0; k < MLP_HIDDEN; k++) {
			float s = 0;
			for (int n = 0; n < MLP_OUT; n++)
				s += dout[i * MLP_OUT + n] * w2[k * MLP_OUT + n];
			dh[i * MLP_HIDDEN + k] = h[i * MLP_HIDDEN + k] > 0 ? s : 0;
		}
}

float mlp_host_step(float *const weights[MLP_NTENSORS], float *const grads[MLP_NTENSORS], uint64_t step)
{
	float x[MLP_BATCH * MLP_IN], t[MLP_BATCH * MLP_OUT], h[MLP_BATCH * MLP_HIDDEN], out[MLP_BATCH * MLP_OUT],
		dout[MLP_BATCH * MLP_OUT], dh[MLP_BATCH * MLP_HIDDEN];
	make_batch(step, x, t);
	dense(x, weights[MLP_W1], weights[MLP_B1], h, MLP_IN, MLP_HIDDEN, 1);
	dense(h, weights[MLP_W2], weights[MLP_B2], out, MLP_HIDDEN, MLP_OUT, 0);
	float loss = mse(out, t, dout);
	weight_grads(h, dout, grads[MLP_W2], grads[MLP_B2], MLP_HIDDEN, MLP_OUT);
	hidden_grad(dout, weights[MLP_W2], h, dh);
	weight_grads(x, dh, grads[MLP_W1], grads[MLP_B1], MLP_IN, MLP_HIDDEN);
	return loss;
}

void mlp_init_weights(float *const weights[MLP_NTENSORS])
{
	/* uniform in +-1/sqrt(fan_in), biases zero */
	for (int j = 0; j < MLP_IN * MLP_HIDDEN; j++)
		weights[MLP_W1][j] = uniform(3, 0, (uint64_t)j) * 0.17677669f;
	for (int j = 0; j < MLP_HIDDEN * MLP_OUT; j++)
		weights[MLP_W2][j] = uniform(3, 1, (uint64_t)j) * 0.125f;
	memset(weights[MLP_B1], 0, MLP_HIDDEN * sizeof(float));
	memset(weights[MLP_B2], 0, MLP_OUT * sizeof(float));
}

/* ---- codelets: the kernels on the tasks' buffers ---------------------------------------- */

#define PTR(i) ((float *)STARPU_VECTOR_GET_PTR(buffers[i]))

static void batch_cpu(void *buffers[], void *arg)
{
	uint64_t step;
	starpu_codelet_unpack_args(arg, &step);
	make_batch(step, PTR(0), PTR(1));
}

static void forward1_cpu(void *buffers[], void *arg)
{
	(void)arg;
	dense(PTR(0), PTR(1), PTR(2), PTR(3), MLP_IN, MLP_HIDDEN, 1);
}

static void forward2_cpu(void *buffers[], void *arg)
{
	(void)arg;
	dense(PTR(0), PTR(1), PTR(2), PTR(3), MLP_HIDDEN, MLP_OUT, 0);
}

static void loss_cpu(void *buffers[], void *arg)
{
	(void)arg;
	*(float *)STARPU_VARIABLE_GET_PTR(buffers[3]) = mse(PTR(0), PTR(1), PTR(2));
}

static void backward2_cpu(void *buffers[], void *arg)
{
	(void)arg;
	weight_grads(PTR(0), PTR(1), PTR(2), PTR(3), MLP_HIDDEN, MLP_OUT);
}

static void backward_hidden_cpu(void *buffers[], void *arg)
{
	(void)arg;
	hidden_grad(PTR(0), PTR(1), PTR(2), PTR(3));
}

static void backward1_cpu(void *buffers[], void *arg)
{
	(void)arg;
	weight_grads(PTR(0), PTR(1), PTR(2), PTR(3), MLP_IN, MLP_HIDDEN);
}

static struct starpu_codelet batch_cl = {
	.name = "mlp_batch", .cpu_funcs = {batch_cpu}, .nbuffers = 2, .modes = {STARPU_W, STARPU_W}};
static struct starpu_codelet forward1_cl = {.name = "mlp_forward1",
					    .cpu_funcs = {forward1_cpu},
					    .nbuffers = 4,
					    .modes = {STARPU_R, STARPU_R, STARPU_R, STARPU_W}};
static struct starpu_codelet forward2_cl = {.name = "mlp_forward2",
					    .cpu_funcs = {forward2_cpu},
					    .nbuffers = 4,
					    .modes = {STARPU_R, STARPU_R, STARPU_R, STARPU_W}};
static struct starpu_codelet loss_cl = {
	.name = "mlp_loss", .cpu_funcs = {loss_cpu}, .nbuffers = 4, .modes = {STARPU_R, STARPU_R, STARPU_W, STARPU_W}};
static struct starpu_codelet backward2_cl = {.name = "mlp_backward2",
					     .cpu_funcs = {backward2_cpu},
					     .nbuffers = 4,
					     .modes = {STARPU_R, STARPU_R, STARPU_W, STARPU_W}};
static struct starpu_codelet backward_hidden_cl = {.name = "mlp_backward_hidden",
						   .cpu_funcs = {backward_hidden_cpu},
						   .nbuffers = 4,
						   .modes = {STARPU_R, STARPU_R, STARPU_R, STARPU_W}};
static struct starpu_codelet backward1_cl = {.name = "mlp_backward1",
					     .cpu_funcs = {backward1_cpu},
					     .nbuffers = 4,
					     .modes = {STARPU_R, STARPU_R, STARPU_W, STARPU_W}};

/* ---- the model ------------------------------------------------------------------------- */

int mlp_create(struct mlp *m, uint64_t steps)
{
	memset(m, 0, sizeof *m);
	m->steps = steps;
	m->losses = calloc(steps ? steps : 1, sizeof *m->losses);
	if (!m->losses)
		return -ENOMEM;
	for (int t = 0; t < MLP_NTENSORS; t++) {
		m->weights[t] = malloc(numel[t] * sizeof(float));
		m->grads[t] = calloc(numel[t], sizeof(float));
		if (!m->weights[t] || !m->grads[t])
			return -ENOMEM; /* the caller exits */
	}
	mlp_init_weights(m->weights);
	for (int t = 0; t < MLP_NTENSORS; t++) {
		starpu_vector_data_register(&m->weight[t], STARPU_MAIN_RAM, (uintptr_t)m->weights[t],
					    (uint32_t)numel[t], sizeof(float));
		starpu_vector_data_register(&m->grad[t], STARPU_MAIN_RAM, (uintptr_t)m->grads[t], (uint32_t)numel[t],
					    sizeof(float));
	}
	/* activations: no home, StarPU allocates them where the tasks run */
	starpu_vector_data_register(&m->x, -1, 0, MLP_BATCH * MLP_IN, sizeof(float));
	starpu_vector_data_register(&m->target, -1, 0, MLP_BATCH * MLP_OUT, sizeof(float));
	starpu_vector_data_register(&m->hidden, -1, 0, MLP_BATCH * MLP_HIDDEN, sizeof(float));
	starpu_vector_data_register(&m->out, -1, 0, MLP_BATCH * MLP_OUT, sizeof(float));
	starpu_vector_data_register(&m->dout, -1, 0, MLP_BATCH * MLP_OUT, sizeof(float));
	starpu_vector_data_register(&m->dhidden, -1, 0, MLP_BATCH * MLP_HIDDEN, sizeof(float));
	return 0;
}

static void submit(struct mlp *m, struct starpu_codelet *cl, starpu_data_handle_t a, starpu_data_handle_t b,
		   starpu_data_handle_t c, starpu_data_handle_t d, uint64_t step)
{
	int err;
	if (cl == &batch_cl)
		err = starpu_task_insert(cl, STARPU_W, a, STARPU_W, b, STARPU_VALUE, &step, sizeof step,
					 STARPU_CALLBACK_WITH_ARG, m->task_done, m->task_done_arg, 0);
	else
		err = starpu_task_insert(cl, cl->modes[0], a, cl->modes[1], b, cl->modes[2], c, cl->modes[3], d,
					 STARPU_CALLBACK_WITH_ARG, m->task_done, m->task_done_arg, 0);
	STARPU_CHECK_RETURN_VALUE(err, "starpu_task_insert %s", cl->name);
}

void mlp_submit_step(struct mlp *m, uint64_t step)
{
	starpu_data_handle_t loss;
	starpu_variable_data_register(&loss, STARPU_MAIN_RAM, (uintptr_t)&m->losses[step], sizeof(float));
	submit(m, &batch_cl, m->x, m->target, NULL, NULL, step);
	submit(m, &forward1_cl, m->x, m->weight[MLP_W1], m->weight[MLP_B1], m->hidden, step);
	submit(m, &forward2_cl, m->hidden, m->weight[MLP_W2], m->weight[MLP_B2], m->out, step);
	submit(m, &loss_cl, m->out, m->target, m->dout, loss, step);
	/* the last layer's gradients first: the optimizer can update their subgroups while
	 * the first layer's backward still runs */
	submit(m, &backward2_cl, m->hidden, m->dout, m->grad[MLP_W2], m->grad[MLP_B2], step);
	submit(m, &backward_hidden_cl, m->dout, m->weight[MLP_W2], m->hidden, m->dhidden, step);
	submit(m, &backward1_cl, m->x, m->dhidden, m->grad[MLP_W1], m->grad[MLP_B1], step);
	starpu_data_unregister_submit(loss);
}

void mlp_destroy(struct mlp *m)
{
	starpu_data_handle_t all[] = {m->x, m->target, m->hidden, m->out, m->dout, m->dhidden};
	for (size_t i = 0; i < sizeof all / sizeof *all; i++)
		starpu_data_unregister(all[i]);
	for (int t = 0; t < MLP_NTENSORS; t++) {
		starpu_data_unregister(m->weight[t]);
		starpu_data_unregister(m->grad[t]);
		free(m->weights[t]);
		free(m->grads[t]);
	}
	free(m->losses);
}
