/* The training loop (train.h). Submission runs one step ahead of the results: the loss
 * of step k, and whether its updates left the optimizer state finite, are read after step
 * k+1 has been submitted, so the host never idles the workers, except where loss scaling
 * or clipping needs the gradient statistics. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "data.h"
#include "dos_policy.h"
#include "errors.h"
#include "host_memory.h"
#include "numerics.h"
#include "rates.h"
#include "train.h"

/* StarPU's clock: simulated time under SimGrid, real time otherwise. */
static double now_seconds(void)
{
	return starpu_timing_now() * 1e-6;
}

/* The losses of one submitted step, read later. */
struct pending_step {
	starpu_data_handle_t *loss;      /* [micro-batches of the global batch] on rank 0, else none */
	starpu_data_handle_t *eval_loss; /* [held-out micro-batches] on rank 0, after an evaluation */
	int evaluated;
	struct _dos_step_report report;
	uint64_t step;
};

/* Mean loss over `count` handles of `tokens` per-token losses each, summed in token order,
 * in double (NAN under SimGrid, where no task body runs). Unregisters the handles. */
static double collect_loss(starpu_data_handle_t *loss, uint32_t count, uint32_t tokens)
{
	double sum = 0;
	for (uint32_t a = 0; a < count; a++) {
		starpu_data_acquire(loss[a], STARPU_R);
		const float *l = (const float *)starpu_vector_get_local_ptr(loss[a]);
		for (uint32_t i = 0; i < tokens; i++)
			sum += DOS_VALUES_ARE_REAL ? l[i] : NAN;
		starpu_data_release(loss[a]);
		starpu_data_unregister(loss[a]);
		loss[a] = NULL;
	}
	return sum / ((double)tokens * count);
}

/* Rank 0 reads every loss of the job: those of another rank's micro-batch arrive in *slot
 * (registered here: `tokens` floats). */
static void receive_loss(starpu_data_handle_t *slot, uint32_t tokens, int from, enum dos_dp_message kind, uint64_t tag)
{
	starpu_vector_data_register(slot, -1, 0, tokens, sizeof(float));
	_dos_dp_recv(*slot, from, kind, tag);
}

/* The losses of a micro-batch this rank ran: kept in *slot on rank 0, sent there from the
 * others. */
static void deliver_loss(starpu_data_handle_t loss, int reporter, starpu_data_handle_t *slot, enum dos_dp_message kind,
			 uint64_t tag)
{
	if (reporter) {
		*slot = loss;
		return;
	}
	_dos_dp_send(loss, 0, kind, tag);
	starpu_data_unregister_submit(loss);
}

/* Submits the held-out evaluation after step k + 1 into q: its E micro-batches shared by
 * the ranks (every rank has the job's weights), micro-batch i on rank i mod N, their
 * losses to rank 0, which sums them in micro-batch order. */
static int submit_evaluation(const struct dos_train_config *cfg, struct dos_corpus *corpus, struct dos_model *model,
			     struct pending_step *q, uint32_t E, uint64_t k)
{
	const struct dos_data_parallel *dp = &cfg->dp;
	int ranks = _dos_dp_size(dp), reporter = dp->rank == 0;
	uint32_t tokens = cfg->micro_batch * cfg->shape.seq_len;
	for (uint32_t i = 0; i < E; i++) {
		int owner = (int)(i % (uint32_t)ranks);
		uint64_t tag = i + (uint64_t)E * (k % 2);
		if (owner != dp->rank) {
			if (reporter)
				receive_loss(&q->eval_loss[q->evaluated++], tokens, owner, DOS_DP_EVAL_LOSS, tag);
			continue;
		}
		starpu_data_handle_t ids, targets, loss;
		int err = _dos_corpus_eval_batch(corpus, i, cfg->micro_batch, cfg->shape.seq_len, cfg->sched_ctx, &ids,
						 &targets);
		if (err || (err = _dos_model_submit_eval(model, ids, targets, &loss)))
			return err;
		deliver_loss(loss, reporter, &q->eval_loss[q->evaluated], DOS_DP_EVAL_LOSS, tag);
		q->evaluated += reporter;
	}
	return 0;
}

/* Tells a starpu-dos policy what the iteration keeps on each GPU besides the optimizer's
 * state: the model's working weights (throughout) and a micro-batch's activations at
 * their peak (two when micro-batches of a step may run side by side), spread over the
 * GPUs of the context, as StarPU spreads forward and backward. The declaration is the
 * policy's floor, and it plans with what it measures on each GPU when that is more: the
 * whole model declared on every GPU left 8 GPUs of 4000 MiB (1b bf16) 0.26 GB of room
 * for state each, where each used at most 1.13 GB, and the steady iteration took 0.1312 s
 * against 0.0406 with this share (results/gpu-declaration-multigpu-sim-2026-12-04.md).
 * Not what lives for part of the iteration only, which the policy measures from the tasks
 * themselves: the tensors' fp32 gradients (from backward to the gather; the loop drops
 * them after the step), the subgroups' gradients (from the gather to their update) and
 * 16-bit weights (from their update to the refresh), which the optimizer drops once used.
 * Declared for the whole iteration they would keep from the optimizer's state up to 8 B
 * per parameter that the application never holds at once. Other policies have nothing to
 * be told, nor has dos of a model whose tasks do not run on the GPUs (no GPU, or
 * model_on_cpu). */
static void declare_gpu_memory(const struct dos_train_config *cfg, const struct dos_model *model)
{
	if (model->where != STARPU_CUDA || !_dos_sched_ctx_is_ours(cfg->sched_ctx))
		return;
	double weights = (double)dos_dtype_size(model->dtype) * (double)model->nparams;
	double activations = (double)_dos_model_activation_bytes(&model->shape, model->batch, model->dtype,
								 model->checkpoint_activations);
	unsigned nodes[STARPU_MAXNODES];
	int gpus = _dos_context_gpu_nodes(cfg->sched_ctx, nodes, STARPU_MAXNODES);
	dos_sched_reserve_gpu_bytes(cfg->sched_ctx,
				    (weights + activations * (cfg->accumulation > 1 ? 2 : 1)) / (gpus > 0 ? gpus : 1));
}

static int check_config(const struct dos_train_config *c)
{
	int err;
	if ((err = _dos_model_shape_check(&c->shape)))
		return err;
	if (c->micro_batch == 0)
		return DOS_FAIL(-EINVAL, "micro_batch = 0: need at least one sequence per micro-batch");
	if (c->accumulation == 0)
		return DOS_FAIL(-EINVAL, "accumulation = 0: need at least one micro-batch per step");
	if (c->steps == 0)
		return DOS_FAIL(-EINVAL, "steps = 0");
	if (!c->data_path)
		return DOS_FAIL(-EINVAL, "data_path is NULL");
	if (c->shape.vocab < 256)
		return DOS_FAIL(-EINVAL, "vocab = %u: the byte-level corpus needs at least 256", c->shape.vocab);
	if ((err = _dos_train_eval_check(c->eval_fraction, c->eval_every)))
		return err;
	if ((c->resume || c->checkpoint_every) && !c->checkpoint_dir)
		return DOS_FAIL(-EINVAL, "resume = %d, checkpoint_every = %llu: both need a checkpoint_dir", c->resume,
				(unsigned long long)c->checkpoint_every);
	/* the optimizer's own checks, before anything is loaded or allocated */
	struct _dos_optimizer_config oc = c->opt;
	oc.sched_ctx = c->sched_ctx;
	oc.dp = c->dp;
	if ((err = _dos_optimizer_config_check(&oc, _dos_model_param_count(&c->shape, NULL))))
		return err;
	int ranks = _dos_dp_size(&c->dp);
	if ((uint64_t)c->accumulation * (uint64_t)ranks > UINT32_MAX)
		return DOS_FAIL(-EINVAL, "accumulation = %u micro-batches on each of %d ranks: too many per step",
				c->accumulation, ranks);
	return 0;
}

/* What one training run holds, from start_run to end_run. */
struct run {
	const struct dos_train_config *cfg;
	struct dos_corpus corpus;
	struct dos_model model;
	struct _dos_optimizer *opt;
	int have_corpus, have_model;
	/* the global batch of a step: A micro-batches, [first_mb, first_mb + accumulation)
	 * this rank's; E held-out micro-batches per evaluation; tokens per micro-batch */
	uint32_t A, first_mb, E, tokens;
	/* the loss handles of the step being read and the step being submitted (2 A), then
	 * of their evaluations (2 E); on the heap, as up to 2^20 micro-batches per step would
	 * overflow the stack */
	starpu_data_handle_t *loss_slots;
	struct pending_step pending[2];
	struct _dos_checkpoint_folder *folder; /* taken before the run starts */
};

/* Frees what start_run made; the loss handles an error left registered are dropped. */
static void end_run(struct run *r)
{
	starpu_task_wait_for_all();
	/* in a job, every rank here before any lets its handles go: unregistering waits for
	 * its sends to the others, which a stopped rank never takes, where StarPU's watchdog
	 * does not look; this wait it sees (_dos_dp_barrier) */
	_dos_dp_barrier();
	for (size_t i = 0; r->loss_slots && i < 2 * ((size_t)r->A + r->E); i++)
		if (r->loss_slots[i])
			starpu_data_unregister(r->loss_slots[i]);
	free(r->loss_slots);
	_dos_optimizer_destroy(r->opt);
	if (r->have_model)
		_dos_model_destroy(&r->model);
	if (r->have_corpus)
		_dos_corpus_free(&r->corpus);
}

/* The held-out part of the corpus, when there is one: E micro-batches per evaluation,
 * whose loss handles follow the steps'. */
static int hold_out(struct run *r)
{
	const struct dos_train_config *cfg = r->cfg;
	if (cfg->eval_fraction == 0)
		return 0;
	int err = _dos_corpus_hold_out(&r->corpus, cfg->eval_fraction, cfg->micro_batch, cfg->shape.seq_len, &r->E);
	if (err)
		return err;
	if (cfg->eval_batches && cfg->eval_batches < r->E)
		r->E = cfg->eval_batches;
	starpu_data_handle_t *grown = realloc(r->loss_slots, 2 * ((size_t)r->A + r->E) * sizeof *grown);
	if (!grown) {
		uint32_t E = r->E;
		r->E = 0; /* the slots are as they were */
		return DOS_FAIL(-ENOMEM, "no memory for the loss handles of %u held-out micro-batches", E);
	}
	r->loss_slots = grown;
	memset(r->loss_slots + 2 * (size_t)r->A, 0, 2 * (size_t)r->E * sizeof *r->loss_slots);
	return 0;
}

/* The optimizer over the model's tensors, its master weights from the model's exact fp32
 * initial values: made by tasks when the run is fresh, unless the configuration asks for
 * host memory; copied on the host otherwise (a resumed run's load needs every handle's
 * only copy at home). */
static int create_optimizer(struct run *r)
{
	const struct dos_train_config *cfg = r->cfg;
	struct dos_model *model = &r->model;
	struct _dos_optimizer_config oc = cfg->opt;
	oc.sched_ctx = cfg->sched_ctx;
	oc.dp = cfg->dp;
	oc.hook = cfg->hook;
	oc.hook_arg = cfg->hook_arg;
	/* mixed precision: the model computes in the 16-bit weight dtype on 16-bit working
	 * weights, which the refresh copies from the update's 16-bit weights; its gradients
	 * stay fp32 (the micro-batches accumulate into them), narrowed by the gather */
	oc.tensor_dtype = model->dtype;
	oc.tensor_grad_dtype = DOS_FP32;
	/* Made by tasks where the policy places them: dos makes each GPU's even, contiguous
	 * share of it there (place_state_init); the host copy made the simulated 4-GPU 1b
	 * bf16 run's first iteration 0.388 s against 0.082 by tasks
	 * (results/state-by-tasks-multigpu-sim-2026-12-04.md). */
	int by_tasks = !cfg->state_on_host && !cfg->resume;
	if (by_tasks) {
		struct dos_init_layout layout = _dos_model_init_layout(&cfg->shape, cfg->seed);
		return _dos_optimizer_create_generated(&r->opt, &oc, model->ntensors, model->numel, model->weight,
						       model->grad, &layout);
	}
	/* a 16-bit model holds its initial values only rounded: generated once more here
	 * (never read under SimGrid) */
	float *initial = model->dtype == DOS_FP32 ? model->weights : NULL;
	if (!initial && DOS_VALUES_ARE_REAL) {
		if (!(initial = malloc(model->nparams * sizeof(float))))
			return DOS_FAIL(-ENOMEM, "no memory for the %llu fp32 initial master weights",
					(unsigned long long)model->nparams);
		_dos_model_init_weights(&cfg->shape, cfg->seed, initial);
	}
	int err = _dos_optimizer_create(&r->opt, &oc, model->ntensors, model->numel, model->weight, model->grad,
					initial ? initial : (const float *)model->weights);
	if (initial != model->weights)
		free(initial);
	return err;
}

/* Everything a run needs, in the order that lets each error name what went wrong first:
 * the corpus, its held-out part, the model, the optimizer. On an error what was made is
 * freed again. */
static int start_run(const struct dos_train_config *cfg, struct run *r)
{
	const struct dos_data_parallel *dp = &cfg->dp;
	int ranks = _dos_dp_size(dp);
	*r = (struct run){.cfg = cfg,
			  .A = cfg->accumulation * (uint32_t)ranks,
			  .first_mb = cfg->accumulation * (uint32_t)dp->rank,
			  .tokens = cfg->micro_batch * cfg->shape.seq_len};
	if (!(r->loss_slots = calloc(2 * (size_t)r->A, sizeof *r->loss_slots)))
		return DOS_FAIL(-ENOMEM, "no memory for the loss handles of %u micro-batches", r->A);
	int err = _dos_corpus_load(&r->corpus, cfg->data_path, cfg->shape.seq_len, cfg->seed);
	r->have_corpus = !err;
	if (!err && !(err = hold_out(r)) &&
	    !(err = _dos_model_create(&r->model, &cfg->shape, cfg->micro_batch, cfg->seed, cfg->opt.weight_dtype,
				      cfg->checkpoint_activations, cfg->model_on_cpu, cfg->sched_ctx))) {
		r->have_model = 1;
		/* before the optimizer: the policy places the tasks that create its state
		 * from the room the application leaves on the GPU */
		declare_gpu_memory(cfg, &r->model);
		err = create_optimizer(r);
	}
	if (err) {
		end_run(r);
		return err;
	}
	r->corpus.hook = r->model.hook = cfg->hook;
	r->corpus.hook_arg = r->model.hook_arg = cfg->hook_arg;
	uint32_t A = r->A, E = r->E;
	r->pending[0] = (struct pending_step){.loss = r->loss_slots, .eval_loss = r->loss_slots + 2 * (size_t)A};
	r->pending[1] =
		(struct pending_step){.loss = r->loss_slots + A, .eval_loss = r->loss_slots + 2 * (size_t)A + E};
	return 0;
}

/* What a run told to start afresh in a folder holding checkpoints, or to resume in one
 * holding another run's too, can do. */
#define FOLDER_ADVICE                                                                                              \
	"continue the run of the latest one with --resume, or give another --checkpoint-dir (or move those files " \
	"away)"

/* Every rank's error into the job's: nonzero when any rank failed. */
static int job_failed(void *arg, int err)
{
	(void)arg;
	return _dos_dp_sum(err != 0) > 0;
}

/* Takes the checkpoint folder for the run, before anything is loaded: rank 0 locks it for
 * the job; a fresh run draws its identity (rank 0, for every rank) and claims the
 * folder, which must hold no checkpoint (a resumed run claims it when it loads). */
static int take_checkpoint_folder(const struct dos_train_config *cfg, struct _dos_checkpoint_folder *folder)
{
	const struct dos_data_parallel *dp = &cfg->dp;
	int err = _dos_checkpoint_folder_take(folder, cfg->checkpoint_dir, dp->rank == 0);
	if (job_failed(NULL, err))
		return err ? err
			   : DOS_FAIL(-EIO, "another rank cannot use the checkpoint folder %s", cfg->checkpoint_dir);
	if (cfg->resume)
		return 0;
	struct _dos_run_id run = {{0}};
	if (dp->rank == 0)
		err = _dos_run_id_new(&run);
	if (_dos_dp_size(dp) > 1) /* rank 0's identity to every rank, 24 bits at a time: exact in a double */
		for (size_t i = 0; i < sizeof run.bytes; i += 3) {
			uint32_t part = 0;
			for (size_t k = 0; k < 3 && i + k < sizeof run.bytes; k++)
				part |= (uint32_t)run.bytes[i + k] << (8 * k);
			part = (uint32_t)_dos_dp_sum(dp->rank == 0 ? (double)part : 0.0);
			for (size_t k = 0; k < 3 && i + k < sizeof run.bytes; k++)
				run.bytes[i + k] = (unsigned char)(part >> (8 * k));
		}
	if (!err)
		err = _dos_checkpoint_folder_claim(folder, &run, 1, FOLDER_ADVICE);
	if (job_failed(NULL, err))
		return err ? err
			   : DOS_FAIL(-EEXIST, "another rank refused the checkpoint folder %s", cfg->checkpoint_dir);
	return 0;
}

/* A candidate checkpoint of the folder, loaded into the run's optimizer. */
struct candidate {
	struct run *r;
	struct _dos_run_position at;
};

static int load_candidate(void *arg, const char *path)
{
	struct candidate *c = arg;
	return _dos_optimizer_load(c->r->opt, path, &c->at);
}

/* Before any task runs (every handle's only copy is its home): the newest checkpoint of
 * the folder that loads (its path into path, of path_size bytes), its state, counters
 * and batch order, on every rank or none; then tasks make the working weights what the
 * weight refresh makes of those master weights (the rebuild sends each rank's to the
 * others). *first_step is the number of steps the checkpoint had done. */
static int resume(struct run *r, uint64_t *first_step, char *path, size_t path_size)
{
	const struct dos_train_config *cfg = r->cfg;
	int err = 0;
	*first_step = 0;
	if (cfg->resume && DOS_VALUES_ARE_REAL) {
		struct candidate c = {.r = r};
		/* rank 0 reports for the job */
		struct _dos_checkpoint_search search = {.agree = _dos_dp_size(&cfg->dp) > 1 ? job_failed : NULL,
							.skipped = cfg->dp.rank == 0 ? cfg->checkpoint_skipped : NULL,
							.set_aside =
								cfg->dp.rank == 0 ? cfg->checkpoint_set_aside : NULL,
							.arg = cfg->checkpoint_skipped_arg};
		err = _dos_checkpoint_folder_resume(r->folder, load_candidate, &c, &search, FOLDER_ADVICE, path,
						    path_size);
		if (err == -ENOENT) {
			char why[1024];
			snprintf(why, sizeof why, "%s", _dos_last_error_message());
			/* a job script that always passes --resume fails on its first start:
			 * say how to start the run */
			int empty = !strncmp(why, "no checkpoint in ", 17);
			err = DOS_FAIL(-ENOENT, "--resume: %s%s", why,
				       empty ? " (a run's first start goes without --resume)" : "");
		}
		if (!err) {
			r->corpus.rng = c.at.data_rng;
			*first_step = c.at.steps_done;
		}
	}
	if (_dos_dp_sum(err != 0) > 0 && !err)
		err = DOS_FAIL(-EIO, "--resume: another rank could not load its part of the checkpoint");
	if (!err && *first_step > 0)
		_dos_optimizer_rebuild_weights(r->opt);
	return err;
}

/* Submits the micro-batches of step k + 1 (this rank's forward and backward; the losses
 * of the others' come to rank 0) into p: with the chain exchange, the tensors' gradients
 * summed down the chain of ranks in global micro-batch order; with scatter, each rank's
 * own, which the optimizer's step reduces. */
static int submit_microbatches(struct run *r, struct pending_step *p, uint64_t k)
{
	const struct dos_train_config *cfg = r->cfg;
	const struct dos_data_parallel *dp = &cfg->dp;
	struct dos_model *model = &r->model;
	int reporter = dp->rank == 0;
	int chain = dp->exchange == DOS_DP_CHAIN; /* else each rank's gradients are its own (scatter.h) */
	struct _dos_optimizer_info info;
	_dos_optimizer_get_info(r->opt, &info);
	/* the loss gradient carries 1/(tokens * A) (a mean over the step's tokens) and the
	 * loss scale */
	float grad_scale = (float)(info.loss_scale / ((double)r->tokens * r->A));
	/* the sum of the gradients of the micro-batches before ours, which ours add to
	 * (the chain; scattered, each rank's sum starts from its own micro-batches) */
	if (chain && r->first_mb > 0)
		for (uint32_t t = 0; t < model->ntensors; t++)
			_dos_dp_recv(model->grad[t], dp->rank - 1, DOS_DP_TENSOR_GRAD, t);
	for (uint32_t g = 0; g < r->A; g++) {
		uint64_t loss_tag = g + (uint64_t)r->A * (k % 2);
		if (g < r->first_mb || g >= r->first_mb + cfg->accumulation) {
			_dos_corpus_skip_batch(&r->corpus, cfg->micro_batch);
			if (reporter) /* another rank's micro-batch: its losses come here */
				receive_loss(&p->loss[g], r->tokens, (int)(g / cfg->accumulation), DOS_DP_LOSS,
					     loss_tag);
			continue;
		}
		starpu_data_handle_t ids, targets, loss;
		int err = _dos_corpus_next_batch(&r->corpus, cfg->micro_batch, cfg->shape.seq_len, cfg->sched_ctx, &ids,
						 &targets);
		/* A micro-batch's forward starts once the previous one's backward has (model.c);
		 * ranked above the next, a micro-batch's backward then keeps the worker while both
		 * have tasks ready, and the next forward only fills its gaps, so that at most two
		 * micro-batches' activations are live (what declare_gpu_memory declares). The last
		 * micro-batch keeps priority 0, as the optimizer's tasks, so that one micro-batch
		 * per step runs as before. */
		uint32_t from_end = r->first_mb + cfg->accumulation - 1 - g;
		model->priority = from_end > INT_MAX ? INT_MAX : (int)from_end;
		err = err ? err
			  : _dos_model_submit_microbatch(model, ids, targets, grad_scale, g > (chain ? 0 : r->first_mb),
							 &loss);
		model->priority = 0;
		if (err)
			return err;
		deliver_loss(loss, reporter, &p->loss[g], DOS_DP_LOSS, loss_tag);
	}
	if (chain && r->first_mb + cfg->accumulation < r->A)
		for (uint32_t t = 0; t < model->ntensors; t++)
			_dos_dp_send(model->grad[t], dp->rank + 1, DOS_DP_TENSOR_GRAD, t);
	return 0;
}

/* Submits step k + 1 into p: its micro-batches, the optimizer's step over their
 * gradients, and the held-out evaluation when one is due after it. */
static int submit_step(struct run *r, struct pending_step *p, uint64_t k)
{
	const struct dos_train_config *cfg = r->cfg;
	int err = submit_microbatches(r, p, k);
	if (err)
		return err;
	p->step = k + 1;
	if ((err = _dos_optimizer_submit_step(r->opt, &p->report)))
		return err;
	/* The step has read the tensor gradients (gathered, or sent on); the next backward
	 * writes them before reading them (its first micro-batch does not accumulate).
	 * Dropped now, they cost nothing to evict: otherwise StarPU writes 4 B per parameter
	 * of dead gradients back to the host whenever it needs GPU memory before that
	 * backward. */
	for (uint32_t t = 0; t < r->model.ntensors; t++)
		starpu_data_invalidate_submit(r->model.grad[t]);
	/* the held-out loss of the weights this step's refresh writes, read with its loss */
	if (r->E && cfg->eval_every && ((k + 1) % cfg->eval_every == 0 || k + 1 == cfg->steps))
		err = submit_evaluation(cfg, &r->corpus, &r->model, p, r->E, k);
	return err;
}

/* The end of a submitted step, once its updates have run: the finiteness of the state
 * they wrote, then the step's loss and progress. */
static int finish_step(struct run *r, struct pending_step *q, double start, struct dos_train_output *out)
{
	const struct dos_train_config *cfg = r->cfg;
	/* each rank checks the subgroups it updated; all stop when one finds a NaN (no value
	 * is real in simulation: nothing to check or agree on) */
	int err = _dos_optimizer_check_update(r->opt, q->report.update, q->step);
	if (DOS_VALUES_ARE_REAL && _dos_dp_sum(err != 0) > 0)
		return err ? err
			   : DOS_FAIL(-ERANGE,
				      "after step %llu another rank's optimizer state is not finite; training stopped",
				      (unsigned long long)q->step);
	if (cfg->dp.rank != 0) /* rank 0 reads the job's losses and reports */
		return 0;
	double loss = collect_loss(q->loss, r->A, r->tokens), eval_loss = NAN;
	if (q->evaluated)
		eval_loss = collect_loss(q->eval_loss, q->evaluated, r->tokens);
	q->evaluated = 0;
	if (out && out->losses)
		out->losses[q->step - 1] = loss;
	if (out && out->eval_losses)
		out->eval_losses[q->step - 1] = eval_loss;
	if (cfg->on_step) {
		struct dos_train_progress pr = {.step = q->step,
						.steps = cfg->steps,
						.loss = loss,
						.applied = q->report.applied,
						.grad_norm = q->report.grad_norm,
						.loss_scale = q->report.loss_scale_used,
						.lr = q->report.lr,
						.eval_loss = eval_loss,
						.elapsed = now_seconds() - start,
						.tokens = q->step * (uint64_t)r->tokens * r->A};
		cfg->on_step(cfg->on_step_arg, &pr);
	}
	return 0;
}

/* In a data-parallel job every rank saves its shard of the state (the directory must be
 * shared by the ranks: a parallel file system on a cluster), once rank 0 has found the
 * folder still the run's alone. */
static int save_checkpoint(struct run *r, uint64_t steps_done)
{
	const struct dos_data_parallel *dp = &r->cfg->dp;
	int err = dp->rank == 0 ? _dos_checkpoint_folder_check(r->folder) : 0;
	if (_dos_dp_size(dp) > 1 && _dos_dp_sum(err != 0) > 0 && !err)
		err = DOS_FAIL(-EEXIST, "checkpoint after step %llu: rank 0 found another run's checkpoints",
			       (unsigned long long)steps_done);
	if (err)
		return err;
	struct _dos_run_position at = {
		.steps_done = steps_done, .seed = r->cfg->seed, .data_rng = r->corpus.rng, .run = r->folder->run};
	return _dos_optimizer_save(r->opt, r->folder->dir, 2, &at, DOS_SAVE_CHECK_FLAGS, NULL, 0);
}

/* Whether the run submits no further step: a stop request seen here, or in a
 * data-parallel job on any rank, so that all stop after the same step (a rank still
 * submitting would wait forever for the gradients of one that stopped). */
static int stop_agreed(const struct dos_train_config *cfg)
{
	if (!cfg->stop_requested)
		return 0;
	int here = *cfg->stop_requested != 0;
	if (_dos_dp_size(&cfg->dp) <= 1)
		return here;
	return DOS_VALUES_ARE_REAL && _dos_dp_max(here) > 0;
}

/* A run stopped on request with `steps_done` steps submitted, the last of them `last`
 * (NULL: none in this run), not yet finished: it is finished, and saved unless its
 * checkpoint exists already, as at the end of a run. Returns -EINTR, or the error that
 * kept the state from being saved. */
static int stop_early(struct run *r, uint64_t steps_done, struct pending_step *last, double start,
		      struct dos_train_output *out)
{
	const struct dos_train_config *cfg = r->cfg;
	int save = last && cfg->checkpoint_dir && DOS_VALUES_ARE_REAL &&
		   !(cfg->checkpoint_every && steps_done % cfg->checkpoint_every == 0);
	int err = save ? save_checkpoint(r, steps_done) : 0;
	if (!err && last)
		err = finish_step(r, last, start, out);
	if (err)
		return err;
	if (!cfg->checkpoint_dir || !DOS_VALUES_ARE_REAL || steps_done == 0)
		return DOS_FAIL(-EINTR, "stopped on request after step %llu of %llu; nothing saved (%s)",
				(unsigned long long)steps_done, (unsigned long long)cfg->steps,
				!cfg->checkpoint_dir   ? "no checkpoint folder"
				: !DOS_VALUES_ARE_REAL ? "a simulation saves no checkpoint"
						       : "no step done");
	return DOS_FAIL(-EINTR,
			"stopped on request after step %llu of %llu; the run continues from its checkpoint in %s "
			"with --resume",
			(unsigned long long)steps_done, (unsigned long long)cfg->steps, cfg->checkpoint_dir);
}

/* The outputs the caller asked for, once every task has ended. */
static void write_outputs(struct run *r, struct dos_train_output *out)
{
	struct _dos_optimizer_info info;
	_dos_optimizer_get_info(r->opt, &info);
	out->skipped_steps = info.skipped_steps;
	out->state_begin = info.state_begin;
	out->state_len = info.state_len;
	uint64_t b = info.state_begin;
	_dos_optimizer_read_state(r->opt, out->master ? out->master + b : NULL, out->m ? out->m + b : NULL,
				  out->v ? out->v + b : NULL);
	struct dos_model *model = &r->model;
	if (!out->weights || !DOS_VALUES_ARE_REAL)
		return;
	for (uint32_t t = 0; t < model->ntensors; t++)
		starpu_data_acquire(model->weight[t], STARPU_R);
	if (model->dtype == DOS_FP32)
		memcpy(out->weights, model->weights, model->nparams * sizeof(float));
	else /* widened exactly */
		for (uint64_t i = 0; i < model->nparams; i++)
			out->weights[i] = dos_load_elem(model->weights, i, model->dtype);
	for (uint32_t t = 0; t < model->ntensors; t++)
		starpu_data_release(model->weight[t]);
}

int _dos_train_run(const struct dos_train_config *cfg, struct dos_train_output *out)
{
	int err;
	if (!cfg)
		return DOS_FAIL(-EINVAL, "cfg is NULL");
	struct run r;
	/* the checkpoint folder before the data is read */
	struct _dos_checkpoint_folder folder = DOS_CHECKPOINT_FOLDER_INIT;
	if ((err = check_config(cfg)) ||
	    (cfg->checkpoint_dir && DOS_VALUES_ARE_REAL && (err = take_checkpoint_folder(cfg, &folder))))
		return err;
	if ((err = start_run(cfg, &r))) {
		_dos_checkpoint_folder_release(&folder);
		return err;
	}
	r.folder = &folder;
	uint64_t first_step;
	if ((err = resume(&r, &first_step, out ? out->resumed_path : NULL, out ? sizeof out->resumed_path : 0))) {
		end_run(&r);
		_dos_checkpoint_folder_release(&folder);
		return err;
	}
	if (out)
		out->resumed_from = first_step;
	int have_pending = 0;
	double start = now_seconds();
	uint64_t k;
	for (k = first_step; k < cfg->steps && !err; k++) {
		if (stop_agreed(cfg)) {
			err = stop_early(&r, k, have_pending ? &r.pending[(k + 1) % 2] : NULL, start, out);
			break;
		}
		/* called without waiting for the earlier steps: an observer that drained the
		 * pipeline here would change what it observes (the last step would start on an
		 * idle machine, and the dos policy would learn and plan from that) */
		if (k + 1 == cfg->steps && cfg->before_last_step)
			cfg->before_last_step(cfg->before_last_step_arg);
		struct pending_step *p = &r.pending[k % 2];
		if ((err = submit_step(&r, p, k)))
			break;
		/* the previous step while this one runs: first whether its updates left the state
		 * finite (before anything can save it), then its loss */
		if (have_pending && (err = finish_step(&r, &r.pending[(k + 1) % 2], start, out)))
			break;
		have_pending = 1;
		if (cfg->checkpoint_dir && DOS_VALUES_ARE_REAL &&
		    (k + 1 == cfg->steps || (cfg->checkpoint_every && (k + 1) % cfg->checkpoint_every == 0)) &&
		    (err = save_checkpoint(&r, k + 1)))
			break;
		if (k + 1 == cfg->steps && (err = finish_step(&r, p, start, out)))
			break;
	}
	starpu_task_wait_for_all();
	if (out) {
		out->steps_done = k;
		out->seconds = now_seconds() - start;
		write_outputs(&r, out);
	}
	end_run(&r);
	_dos_checkpoint_folder_release(&folder);
	return err;
}
