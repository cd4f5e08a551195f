/* One training run of the example model: data, model, optimizer and the step loop, in one
 * place for dos-train and the tests. StarPU must be initialised by the caller (so it
 * chooses the policy, the workers and the scheduling context). */
#ifndef DOS_TRAIN_H
#define DOS_TRAIN_H

#include <signal.h>

#include "optimizer.h"
#include "model.h"

struct dos_train_progress {
	uint64_t step, steps; /* 1-based step just finished, of steps */
	double loss;          /* mean loss of that step (before its update) */
	int applied;          /* 0: skipped for overflow */
	double grad_norm;     /* -1 when not computed */
	double loss_scale;
	double lr;        /* the learning rate the step's update applied (0: skipped) */
	double eval_loss; /* mean loss on the held-out data after this step; NAN when not evaluated */
	double elapsed;   /* seconds since the run started */
	uint64_t tokens;  /* trained so far */
};

struct dos_train_config {
	struct dos_model_shape shape;
	uint32_t micro_batch;  /* sequences per micro-batch */
	uint32_t accumulation; /* micro-batches per step and rank */
	uint64_t steps, seed;
	int checkpoint_activations;
	/* 1: forward and backward run on CPU workers even where there are GPUs (the
	 * optimizer's updates still go where the policy puts them; the same results); 0 (the
	 * default): on the GPUs when there are some. The GPU simulator, which cannot run
	 * cuBLAS, trains this way (tests/gpusim_training.sh) */
	int model_on_cpu;
	const char *data_path;
	/* held-out data: the last eval_fraction (0: none, else in (0, 0.5]) of the corpus is
	 * never trained on (the batches come from the rest: another order than without);
	 * every eval_every steps (and after the last; 0: never) its mean loss is evaluated,
	 * forward only, the ranks sharing its micro-batches. A resumed run needs the
	 * interrupted run's fraction */
	uint64_t eval_every;
	double eval_fraction;
	uint32_t eval_batches; /* micro-batches per evaluation, at most what is held out; 0: all */
	struct _dos_optimizer_config opt;
	unsigned sched_ctx;
	/* a data-parallel job (graph/data_parallel.h): the global batch of a step is
	 * accumulation micro-batches on each rank, rank r taking the r-th share of the batch
	 * order; with the chain exchange (the default) the result is the same bits as one
	 * process accumulating the global batch. Losses and on_step are rank 0's; zero: a
	 * single process */
	struct dos_data_parallel dp;
	/* optional checkpoints (graph/checkpoint.h) in this folder, created when missing and
	 * held by the run (its lock; a fresh run refuses a folder that holds checkpoints):
	 * every checkpoint_every steps (0: only after the last step), the run's two latest
	 * kept; with resume, the run continues from the newest checkpoint there that loads
	 * (steps counts from the start of training, so the run ends at the same step either
	 * way), telling checkpoint_skipped (optional) of each newer one it passed over, and
	 * checkpoint_set_aside (optional) of each newer one of the run it renamed
	 * "<name>.damaged" (_dos_checkpoint_folder_set_aside_damaged) */
	const char *checkpoint_dir;
	uint64_t checkpoint_every;
	int resume;
	/* where a fresh run's optimizer state begins: 0 (the default), made by tasks wherever
	 * the scheduler runs them (_dos_optimizer_create_generated: state created on a GPU
	 * never crosses the link to get there; the dos policy runs each where its first plan
	 * updates it); 1, in host memory, copied from the initial weights (as a resumed run
	 * loads it). The same values either way; resumed runs load it on the host */
	int state_on_host;
	void (*checkpoint_skipped)(void *arg, const char *path, const char *why);
	void (*checkpoint_set_aside)(void *arg, const char *path, const char *why);
	void *checkpoint_skipped_arg; /* both callbacks' */
	/* optional: every finished step (called on the submitting thread) */
	void (*on_step)(void *arg, const struct dos_train_progress *progress);
	void *on_step_arg;
	/* optional: every task before submission */
	_dos_task_hook hook;
	void *hook_arg;
	/* optional: called before the last step is submitted, while the earlier steps may
	 * still run (dos-train starts its timeline there) */
	void (*before_last_step)(void *arg);
	void *before_last_step_arg;
	/* optional: once *stop_requested is nonzero (set by a signal handler: a batch system
	 * ending the job), the run submits no further step. It ends the steps submitted, saves
	 * a checkpoint after the last of them when it has a checkpoint_dir, and returns
	 * -EINTR. The ranks of a data-parallel job stop after the same step: the first that
	 * sees a request stops them all (ignored in a simulated data-parallel job, where
	 * nothing is saved) */
	const volatile sig_atomic_t *stop_requested;
};

/* Optional outputs, each NULL or an array of the stated size. */
struct dos_train_output {
	double *losses;                  /* [steps] (rank 0) */
	double *eval_losses;             /* [steps] (rank 0): NAN after steps not evaluated */
	float *master, *m, *v, *weights; /* [nparams] each, after the last step; master, m and v
					  * only in [state_begin, state_begin + state_len) */
	uint64_t state_begin, state_len; /* the parameters whose state this rank keeps */
	uint64_t skipped_steps;
	double seconds;
	uint64_t resumed_from;   /* steps already done by the checkpoint resumed from (0: none) */
	uint64_t steps_done;     /* by the end of the run: cfg->steps unless it stopped early */
	char resumed_path[4096]; /* that checkpoint */
};

/* Runs the training. Every setting is checked before anything is loaded (the model's
 * shape, sizes, the optimizer's configuration, checkpoint settings), and the checkpoint
 * folder is taken before the data is read. Errors: -EINVAL naming the bad setting and
 * its value, data-file errors, checkpoint-folder errors (-EBUSY: another process holds
 * it; -EEXIST: it holds another run's checkpoints; -ENOENT: nothing to resume from; or
 * the file system's), -ENOMEM naming what could not be allocated, -ERANGE when the
 * optimizer state stops being finite, -EINTR when it stopped on a request
 * (stop_requested); the message is in dos_last_error(). A refused
 * configuration leaves *out untouched. */
int _dos_train_run(const struct dos_train_config *cfg, struct dos_train_output *out);

/* The held-out data's rule of the configuration, alone, for a program that checks its
 * settings before StarPU starts (dos-train's options; inline for the reason of
 * optimizer.h's _dos_clip_norm_check): eval_fraction 0 or in (0, 0.5], and eval_every 0
 * when nothing is held out. Returns 0 or -EINVAL naming the fields and their values. */
static inline int _dos_train_eval_check(double eval_fraction, uint64_t eval_every)
{
	if (!(eval_fraction == 0 || (eval_fraction > 0 && eval_fraction <= 0.5)))
		return DOS_FAIL(-EINVAL, "eval_fraction = %g must be 0 (nothing held out) or in (0, 0.5]",
				eval_fraction);
	if (eval_every && eval_fraction == 0)
		return DOS_FAIL(-EINVAL, "eval_every = %llu needs held-out data: eval_fraction is 0",
				(unsigned long long)eval_every);
	return 0;
}

#endif /* DOS_TRAIN_H */
