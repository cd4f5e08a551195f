/* The optimizer: the fp32 master weights and Adam moments of every subgroup, the tasks
 * one step submits, and the checkpoints of that state. This file and optimizer.c are
 * its one owner: struct _dos_optimizer is opaque elsewhere, and only the functions below
 * save, load or read out its state. A step's tasks (graph/README.md):
 *
 *   gather      per subgroup: its gradient from the tensor gradients it straddles
 *               (narrowed to the gradient dtype); depends only on those tensors' final
 *               gradients;
 *   statistics  per subgroup, then one host-side reduction in subgroup order: only when
 *               clipping or dynamic loss scaling is on (the barrier they need);
 *   update      per subgroup: dos_adam (placed by the scheduling policy), which also
 *               reports whether it wrote an inf or NaN into a flag read one step later;
 *   refresh     per tensor: its working weights from the updated subgroups (in the
 *               tensors' dtype), which the next forward reads.
 *
 * Nothing else: with clipping and loss scaling off, an update starts as soon as its
 * subgroup's tensors have their final gradients, while backward still runs below it.
 * The same builder serves dos-train's loop (train.c) and host applications (the
 * embedding API, integration/optimizer_api.c): it only needs the tensors' weight and
 * gradient handles. */
#ifndef DOS_OPTIMIZER_H
#define DOS_OPTIMIZER_H

#include <errno.h>
#include <math.h>
#include <starpu.h>

#include "dos.h"
#include "errors.h"
#include "data_parallel.h"
#include "checkpoint.h"
#include "phase.h"

struct _dos_optimizer_config {
	uint64_t subgroup_size;
	/* cut the subgroups following the tensors (subgroups.h): a subgroup that is exactly
	 * one tensor whose gradient has the subgroup gradient's dtype updates from that
	 * gradient handle itself, with no gather copy (a single process only) */
	int subgroups_follow_tensors;
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
	/* optional: every task the optimizer submits, before its submission (phase.h) */
	_dos_task_hook hook;
	void *hook_arg;
};

/* An optimizer, made by _dos_optimizer_create (optimizer.c alone sees inside). */
struct _dos_optimizer;

/* What one submitted step did. */
struct _dos_step_report {
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
int _dos_optimizer_config_check(const struct _dos_optimizer_config *cfg, uint64_t nparams);

/* Three of its rules alone, for a program that checks its settings before StarPU starts
 * (dos-train's options): the same rules, so that both refuse the same values. Inline, so
 * that such a check needs nothing of the optimizer linked in (tests/fuzz/fuzz_options.c
 * links the option parser without it). Each returns 0 or -EINVAL naming the field
 * (clip_norm, loss_scale_init, subgroup_size) and its value. */
static inline int _dos_clip_norm_check(double clip_norm)
{
	if (!(clip_norm >= 0) || !isfinite(clip_norm))
		return DOS_FAIL(-EINVAL, "clip_norm = %g must be finite and >= 0 (0 turns clipping off)", clip_norm);
	return 0;
}

static inline int _dos_loss_scale_check(int dynamic, double loss_scale_init)
{
	if (dynamic && !(loss_scale_init >= 1 && loss_scale_init <= DOS_LOSS_SCALE_MAX))
		return DOS_FAIL(-EINVAL, "loss_scale_init = %g: dynamic loss scaling needs a scale in [1, 2^127 = %g]",
				loss_scale_init, DOS_LOSS_SCALE_MAX);
	return 0;
}

/* a subgroup is one StarPU vector, whose length is 32-bit */
static inline int _dos_subgroup_size_check(uint64_t subgroup_size, uint64_t nparams)
{
	uint64_t max_subgroup = nparams < UINT32_MAX ? nparams : UINT32_MAX;
	if (subgroup_size == 0 || subgroup_size > max_subgroup)
		return DOS_FAIL(-EINVAL,
				"subgroup_size = %llu must be in [1, %llu] (the model's parameter count, at most "
				"2^32 - 1)",
				(unsigned long long)subgroup_size, (unsigned long long)max_subgroup);
	return 0;
}

/* Creates the optimizer over `ntensors` tensors (weights: vector handles of
 * cfg->tensor_dtype and numel[t] elements the refresh writes; grads: of
 * cfg->tensor_grad_dtype, written by backward), with master weights initialised from
 * `initial` (flat, fp32), into *opt. Errors: -EINVAL naming the bad argument or field
 * (NULL, no tensors, empty tensors, handles that are not vectors of cfg->tensor_dtype
 * (grads: tensor_grad_dtype) and numel[t] elements, a scheduling context that does not
 * exist, and _dos_optimizer_config_check's), -ENOMEM naming what could not be allocated;
 * *opt is left untouched then. */
int _dos_optimizer_create(struct _dos_optimizer **opt, const struct _dos_optimizer_config *cfg, uint32_t ntensors,
			  const uint64_t *numel, starpu_data_handle_t *weights, starpu_data_handle_t *grads,
			  const float *initial);
/* The same, the state made by tasks instead (a fresh run's: master weights the initial
 * values of `layout`, init_state.h; m = v = 0): one per subgroup, submitted here before
 * any other of the optimizer's tasks, each run where the scheduler places it, so that
 * state a GPU will keep is created there. The state's host arrays hold nothing until
 * something reads the state on the host (a checkpoint, _dos_optimizer_read_state). */
struct dos_init_layout;
int _dos_optimizer_create_generated(struct _dos_optimizer **opt, const struct _dos_optimizer_config *cfg,
				    uint32_t ntensors, const uint64_t *numel, starpu_data_handle_t *weights,
				    starpu_data_handle_t *grads, const struct dos_init_layout *layout);
/* Waits for the optimizer's tasks and frees everything. NULL does nothing. */
void _dos_optimizer_destroy(struct _dos_optimizer *opt);

/* What an optimizer is and where it stands. */
struct _dos_optimizer_info {
	uint64_t nparams, subgroup_size;
	uint32_t ntensors, nsubgroups;
	uint64_t updates;       /* applied so far: Adam's step count t */
	uint64_t skipped_steps; /* steps dropped for overflow */
	double loss_scale;      /* for the next step's loss gradient; 1 without dynamic loss scaling */
	/* the parameters whose state this rank keeps (all of them in a single process) */
	uint64_t state_begin, state_len;
};
void _dos_optimizer_get_info(const struct _dos_optimizer *opt, struct _dos_optimizer_info *info);

/* Submits one step over the gradients the graph has produced (or will produce: tasks
 * depend on them through the handles). Blocks only when clipping or loss scaling needs
 * the global statistics. Returns 0 or a negative errno. */
int _dos_optimizer_submit_step(struct _dos_optimizer *opt, struct _dos_step_report *report);
/* Sets hp.lr, the rate the schedule scales, for the steps submitted from now on (those
 * already submitted keep theirs). Errors: -EINVAL for a NULL opt, or an lr that
 * dos_adam_step_init refuses with the other hyper-parameters (named with its value). */
int _dos_optimizer_set_lr(struct _dos_optimizer *opt, double lr);

/* Whether update `update` (a _dos_step_report's) left non-finite values in the state: the
 * number of subgroups it did that to in *count (0: none), the first of them in *subgroup
 * and the enum dos_nonfinite_bits of that one in *bits. Waits for that update's tasks
 * only (not for later steps'), reading the flags its update tasks wrote, not the state.
 * Call it before update + 2 is submitted, which reuses the flags. Errors: -EINVAL for
 * NULL arguments or an update whose flags are not (or no longer) there. */
int _dos_optimizer_update_nonfinite(struct _dos_optimizer *opt, uint64_t update, uint32_t *count, uint32_t *subgroup,
				    uint32_t *bits);
/* The same as an error: -ERANGE naming the step `steps_done`, the first subgroup, its
 * parameters and the arrays that update `update` left with an inf or NaN, so that a NaN
 * in the state is reported at the step where it appears instead of being saved or
 * trained on; 0 when they are finite, for update 0 (a skipped step wrote nothing), and
 * under SimGrid (no values). Errors of _dos_optimizer_update_nonfinite otherwise. */
int _dos_optimizer_check_update(struct _dos_optimizer *opt, uint64_t update, uint64_t steps_done);

/* Copies this rank's state after the updates submitted so far (it waits for them) into
 * master, m and v: state_len floats each (_dos_optimizer_info), or NULL to skip one.
 * Nothing under SimGrid (no values). */
void _dos_optimizer_read_state(struct _dos_optimizer *opt, float *master, float *m, float *v);

/* Replaces this rank's state after the updates submitted so far (it waits for them) with
 * master, m and v (state_len floats each, or NULL to keep that array), sets Adam's step
 * count t to `updates`, and, when master is given, submits the tasks that make the
 * tensors' working weights follow it (_dos_optimizer_rebuild_weights). The values must
 * be finite and v >= 0: -EINVAL naming the array and the first bad index otherwise, and
 * nothing changes. Nothing under SimGrid but the step count (no values). */
int _dos_optimizer_write_state(struct _dos_optimizer *opt, const float *master, const float *m, const float *v,
			       uint64_t updates);

/* ---- checkpoints (graph/checkpoint.h holds the format) ---- */

/* What a checkpoint records of the run around the optimizer: the steps taken, skipped
 * ones included, the data loader's seed and batch-order state (0 without one), and the
 * run's identity (graph/checkpoint.h). */
struct _dos_run_position {
	uint64_t steps_done, seed, data_rng;
	struct _dos_run_id run;
};

/* How a save makes sure that the state it writes is finite (a checkpoint never holds an
 * inf or a NaN): by the non-finite flags of the latest update (cheap, and it names the
 * arrays and the subgroup; for a loop that checks every update's flags as it goes), or
 * by reading every value of the state (it names the value). */
enum _dos_save_check {
	DOS_SAVE_CHECK_FLAGS,
	DOS_SAVE_CHECK_VALUES,
};

/* Saves the state after the updates submitted so far (it waits for them), its counters
 * and `at` as checkpoint-<at->steps_done>.dos in the existing directory `dir`, atomically,
 * then deletes the checkpoints there beyond the `keep` most recent; the path written
 * goes to path_out (of path_size bytes) unless it is NULL. In a data-parallel job every
 * rank calls it: each rank that keeps state saves its shard, then rank 0 the manifest
 * (the directory must be shared), and every rank fails when one does. Errors: -ERANGE
 * when the state is not finite (nothing written), and _dos_checkpoint_save's. */
int _dos_optimizer_save(struct _dos_optimizer *opt, const char *dir, unsigned keep, const struct _dos_run_position *at,
			enum _dos_save_check check, char *path_out, size_t path_size);
/* Replaces this rank's state and the counters with those of the checkpoint at `path` (a
 * whole checkpoint or a manifest, of any number of shards: a job resumes on any number
 * of ranks; a rank that keeps no state reads the counters only), verified before
 * anything changes, and returns the run's position in *at. Call it when the optimizer's
 * tasks so far have ended; then _dos_optimizer_rebuild_weights (in a data-parallel job,
 * once every rank has loaded). Errors: _dos_checkpoint_load_range's. */
int _dos_optimizer_load(struct _dos_optimizer *opt, const char *path, struct _dos_run_position *at);
/* Submits the tasks that make every tensor's working weights what the weight refresh
 * makes of the current master weights (in 16-bit modes through the 16-bit weights, cast
 * first): after a load, the next forward then reads exactly what it would have read
 * without the interruption. */
void _dos_optimizer_rebuild_weights(struct _dos_optimizer *opt);

#endif /* DOS_OPTIMIZER_H */
