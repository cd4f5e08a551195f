/* The host application's own model: a two-layer perceptron (ReLU hidden layer, linear
 * output) fitted by mean squared error to a fixed random linear teacher, on synthetic
 * batches that depend only on the step number. Its data and its CPU codelets are the
 * application's; it knows nothing of starpu-dos. Shared by examples/host_app.c and the
 * test that trains the same model through the optimizer's internal path. */
#ifndef MLP_H
#define MLP_H

#include <stdint.h>

#include <starpu.h>

#define MLP_IN 32
#define MLP_HIDDEN 64
#define MLP_OUT 8
#define MLP_BATCH 16

/* The parameters in flat order: W1 [IN x HIDDEN], b1, W2 [HIDDEN x OUT], b2. */
enum { MLP_W1, MLP_B1, MLP_W2, MLP_B2, MLP_NTENSORS };

/* The training recipe both programs follow. 600-parameter subgroups cut the 2632
 * parameters into 5 subgroups that straddle tensors; the last one holds only W2 and b2,
 * whose gradients are ready first. */
#define MLP_STEPS 30
#define MLP_SUBGROUP 600
#define MLP_LR 1e-2
#define MLP_WEIGHT_DECAY 1e-2

struct mlp {
	float *weights[MLP_NTENSORS], *grads[MLP_NTENSORS]; /* the application's arrays */
	starpu_data_handle_t weight[MLP_NTENSORS], grad[MLP_NTENSORS];
	/* activations and their gradients, reused every step */
	starpu_data_handle_t x, target, hidden, out, dout, dhidden;
	float *losses; /* [steps]: the loss of each step, written by its loss task */
	uint64_t steps;
	/* optional: set as the callback of every task the model submits */
	void (*task_done)(void *arg);
	void *task_done_arg;
};

/* Elements of tensor t, and of all of them. */
uint64_t mlp_numel(int t);
uint64_t mlp_nparams(void);

/* The initial weights (deterministic) into the four arrays of mlp_numel(t) floats. */
void mlp_init_weights(float *const weights[MLP_NTENSORS]);
/* Forward and backward of step `step` (0-based) on the calling thread, without StarPU,
 * with the codelets' kernels: grads from weights; returns the loss. What an application
 * that does not use StarPU itself computes. */
float mlp_host_step(float *const weights[MLP_NTENSORS], float *const grads[MLP_NTENSORS], uint64_t step);

/* After starpu_init: allocates the arrays, initialises the weights (deterministically)
 * and registers everything. Returns 0 or -ENOMEM. */
int mlp_create(struct mlp *m, uint64_t steps);
/* Submits the tasks of step `step` (0-based): its batch, forward, loss, backward. The
 * gradients are overwritten, the weights only read: the optimizer updates them. */
void mlp_submit_step(struct mlp *m, uint64_t step);
/* Waits for the model's tasks, unregisters and frees (m->weights hold the last values
 * until then). */
void mlp_destroy(struct mlp *m);

#endif /* MLP_H */
