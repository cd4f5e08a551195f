/* The optimizer half of a training iteration: fp32 master weights and Adam moments of
 * every subgroup, and the tasks one step submits (graph/README.md):
 *
 *   gather   per subgroup: its gradient from the tensor gradients it straddles (narrowed
 *            to the gradient dtype); depends only on those tensors' final gradients;
 *   stats    per subgroup, then one host-side reduction in subgroup order: only when
 *            clipping or dynamic loss scaling is on (the barrier they need);
 *   update   per subgroup: dos_adam (placed by the scheduling policy), which also
 *            reports whether it wrote an inf or NaN into a flag read one step later;
 *   refresh  per tensor: its working weights from the updated subgroups (in the
 *            tensors' dtype), which the next forward reads.
 *
 * Nothing else: with clipping and loss scaling off, an update starts as soon as its
 * subgroup's tensors have their final gradients, while backward still runs below it.
 * The same builder serves dos-train's model and host applications: it only needs the
 * tensors' weight and gradient handles. */
#ifndef DOS_ITERATION_H
#define DOS_ITERATION_H

#include <starpu.h>

#include "dos.h"
#include "data_parallel.h"
#include "model.h"
#include "subgroups.h"

struct dos_optimizer_config {
	uint64_t subgroup_size;
	/* DOS_FP32: the working weights are copies of the master weights; DOS_FP16/DOS_BF16:
	 * the update also writes 16-bit weights, which the refresh copies into 16-bit tensors
	 * (a mixed-precision model) or widens into fp32 ones */
	enum dos_dtype weight_dtype;
	enum dos_dtype grad_dtype; /* the subgroup gradient's dtype (fp32, or = weight_dtype) */
	struct dos_adam_hparams hp;
	struct dos_lr_schedule lr_schedule; /* of hp.lr over the updates; zero: constant */
	double clip_norm;                   /* global-norm clipping threshold; 0 = off */
	int dynamic_loss_scale;             /* skip steps whose gradients overflow; scale backs off / grows */
	double loss_scale_init;             /* dynamic: initial scale (e.g. 65536); else ignored (1) */
	uint32_t loss_scale_window;         /* dynamic: steps without overflow before the scale doubles */
	unsigned sched_ctx;
	/* dtype of every tensor's weight and gradient handle: DOS_FP32 (the default: zero), or
	 * a 16-bit dtype for applications that keep 16-bit tensors; the gather then widens or
	 * copies their gradients, the refresh narrows the master weights (fp32 mode) or copies
	 * the 16-bit weights, so it must equal weight_dtype and grad_dtype unless they are fp32
	 * (a conversion between two 16-bit formats would round twice) */
	enum dos_dtype tensor_dtype;
	/* dtype of every tensor's gradient handle when it differs from tensor_dtype: mixed
	 * precision keeps 16-bit weights (tensor_dtype) but fp32 gradients, which the
	 * micro-batches accumulate into without rounding (Megatron's fp32 main_grad); the
	 * gather narrows them to grad_dtype. DOS_FP32 (zero) or tensor_dtype; a 16-bit one
	 * must equal grad_dtype unless that is fp32 */
	enum dos_dtype tensor_grad_dtype;
	/* data parallelism (data_parallel.h): this rank keeps the state of its own subgroups
	 * only; zero: a single process */
	struct dos_data_parallel dp;
};

struct dos_optimizer {
	struct dos_optimizer_config cfg;
	struct dos_subgroup_map map;
	/* this rank's subgroups [own_first, own_end), whose state it keeps: the parameters
	 * [state_begin, state_begin + state_len) of the flat space (all of them in a single
	 * process); master, m and v hold that range, one block from dos_host_alloc (master
	 * first) */
	uint32_t own_first, own_end;
	uint64_t state_begin, state_len;
	float *master, *m, *v;
	int state_pinned; /* how dos_host_alloc made it */
	/* per subgroup; m_h and v_h are NULL for subgroups of other ranks, and so is master_h
	 * in 16-bit precision (in fp32 it receives the owner's updated weights) */
	starpu_data_handle_t *master_h, *m_h, *v_h, *grad_h, *weight16_h, *stats_h;
	starpu_data_handle_t *tensor_weight, *tensor_grad; /* not owned */
	/* each update's non-finite bits per subgroup, in two slots by update parity, so the
	 * host reads update u's while u + 1 runs: [slot * nsubgroups + s] (own subgroups) */
	uint32_t *nonfinite;
	starpu_data_handle_t *nonfinite_h;
	uint64_t nonfinite_update[2]; /* the update whose bits each slot holds (0: none yet) */
	uint64_t step;                /* updates applied so far */
	uint64_t skipped_steps;       /* steps dropped for overflow */
	double loss_scale;            /* 1 without dynamic loss scaling */
	uint32_t good_steps;          /* since the last change of the scale */
	int copies_on_gpu;            /* gathers and refreshes run on CUDA workers (there are some) */
	struct dos_scatter *scatter;  /* the chunk handles of a DOS_DP_SCATTER job (scatter.h), else NULL */
	dos_task_hook hook;
	void *hook_arg;
};

/* What subgroup s's refresh reads: its 16-bit weights, or in fp32 its master weights. */
static inline starpu_data_handle_t dos_optimizer_updated_weights(const struct dos_optimizer *opt, uint32_t s)
{
	return opt->cfg.weight_dtype != DOS_FP32 ? opt->weight16_h[s] : opt->master_h[s];
}

/* Submits one of the optimizer's tasks: in its scheduling context, through its hook. */
void dos_optimizer_submit_task(struct dos_optimizer *opt, struct starpu_task *task);

/* What one submitted step did. */
struct dos_step_report {
	int applied;      /* 0 when skipped for overflow */
	double grad_norm; /* unscaled global norm, when clipping or loss scaling is on; else -1 */
	double loss_scale_used;
	uint32_t overflow_subgroup; /* first subgroup with inf/nan gradients, when skipped */
	uint64_t update;            /* 1-based number of the update applied (0 when skipped) */
	double lr;                  /* the learning rate it applied (the schedule's), 0 when skipped */
};

/* Checks a configuration for a model of `nparams` parameters: dtypes (tensor_dtype
 * included), subgroup size in [1, min(nparams, 2^32 - 1)], hyper-parameters
 * (dos_adam_step_init's checks), clip_norm >= 0, loss-scale settings, the data-parallel
 * rank (not the scheduling context: callable before StarPU starts).
 * Returns 0 or -EINVAL naming the field and its value. */
int dos_optimizer_config_check(const struct dos_optimizer_config *cfg, uint64_t nparams);

/* Creates the optimizer over `ntensors` tensors (weights: vector handles of
 * cfg->tensor_dtype and numel[t] elements the refresh writes; grads: of
 * cfg->tensor_grad_dtype, written by backward), with master weights initialised from `initial` (flat, fp32). Errors:
 * -EINVAL naming the bad argument or field (NULL, no tensors, empty tensors, handles that
 * are not vectors of cfg->tensor_dtype (grads: tensor_grad_dtype) and numel[t] elements, a scheduling context that
 * does not exist, and dos_optimizer_config_check's), -ENOMEM naming what could not be allocated; *opt is left
 * untouched then. */
int dos_optimizer_create(struct dos_optimizer *opt, const struct dos_optimizer_config *cfg, uint32_t ntensors,
			 const uint64_t *numel, starpu_data_handle_t *weights, starpu_data_handle_t *grads,
			 const float *initial);
/* Submits one step over the gradients the graph has produced (or will produce: tasks
 * depend on them through the handles). Blocks only when clipping or loss scaling needs
 * the global statistics. Returns 0 or a negative errno. */
int dos_optimizer_submit_step(struct dos_optimizer *opt, struct dos_step_report *report);
/* Sets hp.lr, the rate the schedule scales, for the steps submitted from now on (those
 * already submitted keep theirs). Errors: -EINVAL for a NULL opt, or an lr that
 * dos_adam_step_init refuses with the other hyper-parameters (named with its value). */
int dos_optimizer_set_lr(struct dos_optimizer *opt, double lr);
/* Whether update `update` (a dos_step_report's) left non-finite values in the state: the
 * number of subgroups it did that to in *count (0: none), the first of them in *subgroup
 * and the enum dos_nonfinite_bits of that one in *bits. Waits for that update's tasks
 * only (not for later steps'), reading the flags its update tasks wrote, not the state.
 * Call it before update + 2 is submitted, which reuses the flags. Errors: -EINVAL for
 * NULL arguments or an update whose flags are not (or no longer) there. */
int dos_optimizer_update_nonfinite(struct dos_optimizer *opt, uint64_t update, uint32_t *count, uint32_t *subgroup,
				   uint32_t *bits);
/* Waits for the optimizer's tasks and frees everything (master, m, v are up to date). */
void dos_optimizer_destroy(struct dos_optimizer *opt);

/* Brings every subgroup's master, m and v home and holds them there in `mode` (STARPU_R to
 * read opt->master, m, v; STARPU_RW to also write them), waiting for the updates submitted
 * so far; dos_optimizer_release_state lets them go again. Between the two the arrays are
 * the state, for checkpoints and the finiteness check. */
void dos_optimizer_hold_state(const struct dos_optimizer *opt, enum starpu_data_access_mode mode);
void dos_optimizer_release_state(const struct dos_optimizer *opt);
/* With the state held: -ERANGE naming the first non-finite value of master, m or v (array,
 * parameter, subgroup, after step `steps_done`), so that a NaN in the state is reported
 * instead of being saved or trained on silently; else 0. */
int dos_optimizer_check_finite(const struct dos_optimizer *opt, uint64_t steps_done);
/* Submits the tasks that make every tensor's working weights what the weight refresh
 * makes of the current master weights (in 16-bit modes through the 16-bit weights, cast
 * first): after a checkpoint's state was loaded into opt->master, the next forward then
 * reads exactly what it would have read without the interruption. */
void dos_optimizer_rebuild_weights(struct dos_optimizer *opt);

#endif /* DOS_ITERATION_H */
