/* The training loop (train.h). Submission runs one step ahead of the results: the loss
 * of step k, and whether its updates left the optimizer state finite, are read after step
 * k+1 has been submitted, so the host never idles the workers, except where loss scaling
 * or clipping needs the gradient statistics. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "data.h"
#include "dos_policy.h"
#include "errors.h"
#include "host_memory.h"
#include "numerics.h"
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
	struct dos_step_report report;
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
	dos_dp_recv(*slot, from, kind, tag);
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
	dos_dp_send(loss, 0, kind, tag);
	starpu_data_unregister_submit(loss);
}

/* Submits the held-out evaluation after step k + 1 into q: its E micro-batches shared by
 * the ranks (every rank has the job's weights), micro-batch i on rank i mod N, their
 * losses to rank 0, which sums them in micro-batch order. */
static int submit_evaluation(const struct dos_train_config *cfg, struct dos_corpus *corpus, struct dos_model *model,
			     struct pending_step *q, uint32_t E, uint64_t k)
{
	const struct dos_data_parallel *dp = &cfg->dp;
	int ranks = dos_dp_size(dp), reporter = dp->rank == 0;
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
		int err = dos_corpus_eval_batch(corpus, i, cfg->micro_batch, cfg->shape.seq_len, cfg->sched_ctx, &ids,
						&targets);
		if (err || (err = dos_model_submit_eval(model, ids, targets, &loss)))
			return err;
		deliver_loss(loss, reporter, &q->eval_loss[q->evaluated], DOS_DP_EVAL_LOSS, tag);
		q->evaluated += reporter;
	}
	return 0;
}

/* Copies a flat array of `dtype` whose slices are the handles [first, end) (homed in it)
 * into `to`, widened to fp32 (exactly), after bringing every slice home. */
static void copy_home(starpu_data_handle_t *h, uint32_t first, uint32_t end, const void *flat, enum dos_dtype dtype,
		      float *to, uint64_t count)
{
	if (!to || !DOS_VALUES_ARE_REAL)
		return;
	for (uint32_t i = first; i < end; i++)
		starpu_data_acquire(h[i], STARPU_R);
	if (dtype == DOS_FP32)
		memcpy(to, flat, count * sizeof(float));
	else
		for (uint64_t i = 0; i < count; i++)
			to[i] = dos_load_elem(flat, i, dtype);
	for (uint32_t i = first; i < end; i++)
		starpu_data_release(h[i]);
}

/* Tells a starpu-dos policy what the iteration keeps on the GPU besides the optimizer's
 * state: the model's working weights (throughout) and a micro-batch's activations at
 * their peak (two when micro-batches of a step may run side by side). Not what lives for part of the iteration only,
 * which the policy measures from the tasks themselves: the tensors' fp32 gradients (from backward to the gather; the
 * loop drops them after the step), the subgroups' gradients (from the gather to their update) and 16-bit weights (from
 * their update to the refresh), which the optimizer drops once used. Declared for the whole iteration they would keep
 * from the optimizer's state up to 8 B per parameter that the application never holds at once. Other policies have
 * nothing to be told. */
static void declare_gpu_memory(const struct dos_train_config *cfg, const struct dos_model *model)
{
	if (starpu_cuda_worker_get_count() == 0 || !_dos_sched_ctx_is_ours(cfg->sched_ctx))
		return;
	double weights = (double)dos_dtype_size(model->dtype) * (double)model->nparams;
	double activations = (double)dos_model_activation_bytes(&model->shape, model->batch, model->dtype,
								model->checkpoint_activations);
	dos_sched_reserve_gpu_bytes(cfg->sched_ctx, weights + activations * (cfg->accumulation > 1 ? 2 : 1));
}

/* The checkpoint's description of this run after `steps_done` steps. */
static struct dos_checkpoint_meta checkpoint_meta(const struct dos_train_config *cfg, const struct dos_model *model,
						  const struct dos_optimizer *opt, const struct dos_corpus *corpus,
						  uint64_t steps_done)
{
	return (struct dos_checkpoint_meta){.nparams = model->nparams,
					    .subgroup_size = opt->cfg.subgroup_size,
					    .ntensors = model->ntensors,
					    .numel = model->numel,
					    .weight_dtype = opt->cfg.weight_dtype,
					    .grad_dtype = opt->cfg.grad_dtype,
					    .step = opt->step,
					    .skipped_steps = opt->skipped_steps,
					    .steps_done = steps_done,
					    .loss_scale = opt->loss_scale,
					    .good_steps = opt->good_steps,
					    .seed = cfg->seed,
					    .data_rng = corpus->rng,
					    .hp = opt->cfg.hp};
}

/* An error naming the step, the first subgroup and the arrays that the step's update left
 * with an inf or NaN (from the flags the update tasks wrote: the state is not read), so
 * that a NaN in the state is reported at the step where it appears instead of being
 * saved or trained on. A skipped step wrote nothing: its state was checked before. */
static int check_update_finite(struct dos_optimizer *opt, const struct dos_step_report *report, uint64_t step)
{
	if (!DOS_VALUES_ARE_REAL || !report->update)
		return 0;
	uint32_t count, s, bits;
	int err = dos_optimizer_update_nonfinite(opt, report->update, &count, &s, &bits);
	if (err || count == 0)
		return err;
	static const char *const names[] = {"master weight", "Adam m", "Adam v"};
	char arrays[64] = "", others[64] = "";
	for (int a = 0; a < 3; a++)
		if (bits & (1u << a))
			snprintf(arrays + strlen(arrays), sizeof arrays - strlen(arrays), "%s%s", *arrays ? ", " : "",
				 names[a]);
	if (count > 1)
		snprintf(others, sizeof others, " (and %u more subgroups)", count - 1);
	uint64_t first = (uint64_t)s * opt->map.subgroup_size;
	return DOS_FAIL(-ERANGE,
			"after step %llu the optimizer state is not finite: %s of subgroup %u (parameters %llu to "
			"%llu)%s; not saved, training stopped",
			(unsigned long long)step, arrays, s, (unsigned long long)first,
			(unsigned long long)(first + dos_subgroup_len(&opt->map, s) - 1), others);
}

/* In a data-parallel job every rank that keeps state saves its shard and, once all have
 * (or one failed: then every rank fails), rank 0 writes the manifest. The checkpoint
 * directory must be shared by the ranks (a parallel file system on a cluster). */
static int save_checkpoint(const struct dos_train_config *cfg, const struct dos_model *model, struct dos_optimizer *opt,
			   const struct dos_corpus *corpus, const struct dos_step_report *report, uint64_t steps_done)
{
	const struct dos_data_parallel *dp = &opt->cfg.dp;
	int ranks = dos_dp_size(dp);
	/* shards: the ranks that keep state (with fewer subgroups than ranks, some keep none) */
	uint32_t shards = 0, my_shard = 0;
	for (int r = 0; r < ranks; r++) {
		uint32_t first, end;
		dos_dp_owned_subgroups(dp, r, opt->map.nsubgroups, &first, &end);
		my_shard += r < dp->rank && end > first;
		shards += end > first;
	}
	dos_optimizer_hold_state(opt, STARPU_R);
	struct dos_checkpoint_meta meta = checkpoint_meta(cfg, model, opt, corpus, steps_done);
	int err = check_update_finite(opt, report, steps_done);
	if (!err && shards == 1 && opt->state_len > 0)
		err = dos_checkpoint_save(cfg->checkpoint_dir, &meta, opt->master, opt->m, opt->v, 2, NULL, 0);
	else if (!err && opt->state_len > 0) {
		meta.state_begin = opt->state_begin;
		meta.state_len = opt->state_len;
		err = dos_checkpoint_save_shard(cfg->checkpoint_dir, &meta, my_shard, shards, opt->master, opt->m,
						opt->v);
	}
	dos_optimizer_release_state(opt);
	if (ranks == 1)
		return err;
	if (dos_dp_sum(err != 0) > 0)
		return err ? err
			   : DOS_FAIL(-EIO, "checkpoint after step %llu: another rank could not save its shard",
				      (unsigned long long)steps_done);
	if (dp->rank == 0 && shards > 1) {
		meta.state_begin = meta.state_len = 0;
		err = dos_checkpoint_save_manifest(cfg->checkpoint_dir, &meta, shards, 2, NULL, 0);
	}
	if (dos_dp_sum(err != 0) > 0)
		return err ? err
			   : DOS_FAIL(-EIO, "checkpoint after step %llu: rank 0 could not write the manifest",
				      (unsigned long long)steps_done);
	return 0;
}

/* Before any task runs (every handle's only copy is its home): the latest checkpoint's
 * state, the step counters and the batch order; the caller then has tasks make the working
 * weights what the weight refresh makes of those master weights (once every rank has
 * loaded: the rebuild sends each rank's weights to the others). */
static int resume_from_checkpoint(const struct dos_train_config *cfg, const struct dos_model *model,
				  struct dos_optimizer *opt, struct dos_corpus *corpus, uint64_t *steps_done)
{
	char path[4096];
	int err = dos_checkpoint_latest(cfg->checkpoint_dir, path, sizeof path);
	if (err)
		return err == -ENOENT ? DOS_FAIL(-ENOENT, "--resume: no checkpoint in %s", cfg->checkpoint_dir) : err;
	struct dos_checkpoint_meta expect = checkpoint_meta(cfg, model, opt, corpus, 0), got;
	/* A rank of a data-parallel job reads its own part of the state (a rank that keeps
	 * none, only the counters); the weight rebuild sends each rank's to the others. Either
	 * kind of checkpoint, of any number of shards, serves any number of ranks. */
	if (opt->state_len)
		err = dos_checkpoint_load_range(path, &expect, opt->state_begin, opt->state_len, &got, opt->master,
						opt->m, opt->v);
	else
		err = dos_checkpoint_load_range(path, &expect, 0, 1, &got, NULL, NULL, NULL);
	if (err)
		return err;
	opt->step = got.step;
	opt->skipped_steps = got.skipped_steps;
	opt->loss_scale = got.loss_scale;
	opt->good_steps = got.good_steps;
	corpus->rng = got.data_rng;
	*steps_done = got.steps_done;
	return 0;
}

static int check_config(const struct dos_train_config *c)
{
	int err;
	if ((err = dos_model_shape_check(&c->shape)))
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
	if (!(c->eval_fraction == 0 || (c->eval_fraction > 0 && c->eval_fraction <= 0.5)))
		return DOS_FAIL(-EINVAL, "eval_fraction = %g must be 0 (nothing held out) or in (0, 0.5]",
				c->eval_fraction);
	if (c->eval_every && c->eval_fraction == 0)
		return DOS_FAIL(-EINVAL, "eval_every = %llu needs held-out data: eval_fraction is 0",
				(unsigned long long)c->eval_every);
	if ((c->resume || c->checkpoint_every) && !c->checkpoint_dir)
		return DOS_FAIL(-EINVAL, "resume = %d, checkpoint_every = %llu: both need a checkpoint_dir", c->resume,
				(unsigned long long)c->checkpoint_every);
	/* the optimizer's own checks, before anything is loaded or allocated */
	struct dos_optimizer_config oc = c->opt;
	oc.sched_ctx = c->sched_ctx;
	oc.dp = c->dp;
	return dos_optimizer_config_check(&oc, dos_model_param_count(&c->shape, NULL));
}

/* The end of a submitted step, once its updates have run: the finiteness of the state
 * they wrote, then the step's loss and progress. */
static int finish_step(const struct dos_train_config *cfg, struct dos_optimizer *opt, struct pending_step *q,
		       double start, struct dos_train_output *out)
{
	/* each rank checks the subgroups it updated; all stop when one finds a NaN (no value
	 * is real in simulation: nothing to check or agree on) */
	int err = check_update_finite(opt, &q->report, q->step);
	if (DOS_VALUES_ARE_REAL && dos_dp_sum(err != 0) > 0)
		return err ? err
			   : DOS_FAIL(-ERANGE,
				      "after step %llu another rank's optimizer state is not finite; training stopped",
				      (unsigned long long)q->step);
	if (cfg->dp.rank != 0) /* rank 0 reads the job's losses and reports */
		return 0;
	uint32_t A = cfg->accumulation * (uint32_t)dos_dp_size(&cfg->dp),
		 tokens = cfg->micro_batch * cfg->shape.seq_len;
	double loss = collect_loss(q->loss, A, tokens), eval_loss = NAN;
	if (q->evaluated)
		eval_loss = collect_loss(q->eval_loss, q->evaluated, tokens);
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
						.tokens = q->step * (uint64_t)tokens * A};
		cfg->on_step(cfg->on_step_arg, &pr);
	}
	return 0;
}

int dos_train_run(const struct dos_train_config *cfg, struct dos_train_output *out)
{
	int err;
	if (!cfg)
		return DOS_FAIL(-EINVAL, "cfg is NULL");
	if ((err = check_config(cfg)))
		return err;
	uint64_t params = dos_model_param_count(&cfg->shape, NULL);
	/* the global batch: micro-batches [first_mb, first_mb + accumulation) are this rank's */
	const struct dos_data_parallel *dp = &cfg->dp;
	int ranks = dos_dp_size(dp), reporter = dp->rank == 0;
	if ((uint64_t)cfg->accumulation * (uint64_t)ranks > UINT32_MAX)
		return DOS_FAIL(-EINVAL, "accumulation = %u micro-batches on each of %d ranks: too many per step",
				cfg->accumulation, ranks);
	uint32_t A = cfg->accumulation * (uint32_t)ranks, first_mb = cfg->accumulation * (uint32_t)dp->rank;
	int chain = dp->exchange == DOS_DP_CHAIN; /* else each rank's gradients are its own (scatter.h) */
	/* the loss handles of the step being read and the step being submitted; on the heap,
	 * as up to 2^20 micro-batches per step would overflow the stack */
	starpu_data_handle_t *loss_slots = calloc(2 * (size_t)A, sizeof *loss_slots);
	if (!loss_slots)
		return DOS_FAIL(-ENOMEM, "no memory for the loss handles of %u micro-batches", A);

	struct dos_corpus corpus;
	struct dos_model model;
	struct dos_optimizer opt;
	if ((err = dos_corpus_load(&corpus, cfg->data_path, cfg->shape.seq_len, cfg->seed))) {
		free(loss_slots);
		return err;
	}
	/* E held-out micro-batches per evaluation, their loss handles after the steps' */
	uint32_t E = 0;
	if (cfg->eval_fraction > 0) {
		starpu_data_handle_t *grown = NULL;
		if (!(err = dos_corpus_hold_out(&corpus, cfg->eval_fraction, cfg->micro_batch, cfg->shape.seq_len,
						&E))) {
			if (cfg->eval_batches && cfg->eval_batches < E)
				E = cfg->eval_batches;
			if (!(grown = realloc(loss_slots, 2 * ((size_t)A + E) * sizeof *loss_slots)))
				err = DOS_FAIL(-ENOMEM, "no memory for the loss handles of %u held-out micro-batches",
					       E);
		}
		if (err) {
			dos_corpus_free(&corpus);
			free(loss_slots);
			return err;
		}
		loss_slots = grown;
		memset(loss_slots + 2 * (size_t)A, 0, 2 * (size_t)E * sizeof *loss_slots);
	}
	if ((err = dos_model_create(&model, &cfg->shape, cfg->micro_batch, cfg->seed, cfg->opt.weight_dtype,
				    cfg->checkpoint_activations, cfg->sched_ctx))) {
		dos_corpus_free(&corpus);
		free(loss_slots);
		return err;
	}
	model.hook = cfg->hook;
	model.hook_arg = cfg->hook_arg;
	struct dos_optimizer_config oc = cfg->opt;
	oc.sched_ctx = cfg->sched_ctx;
	oc.dp = cfg->dp;
	/* mixed precision: the model computes in the 16-bit weight dtype on 16-bit working
	 * weights, which the refresh copies from the update's 16-bit weights; its gradients
	 * stay fp32 (the micro-batches accumulate into them), narrowed by the gather */
	oc.tensor_dtype = model.dtype;
	oc.tensor_grad_dtype = DOS_FP32;
	/* the master weights start from the exact fp32 initial values, which a 16-bit model
	 * holds only rounded: generated once more here (never read under SimGrid) */
	float *initial = model.dtype == DOS_FP32 ? model.weights : NULL;
	if (!initial && DOS_VALUES_ARE_REAL) {
		if (!(initial = malloc(model.nparams * sizeof(float))))
			err = DOS_FAIL(-ENOMEM, "no memory for the %llu fp32 initial master weights",
				       (unsigned long long)model.nparams);
		else
			dos_model_init_weights(&cfg->shape, cfg->seed, initial);
	}
	if (!err)
		err = dos_optimizer_create(&opt, &oc, model.ntensors, model.numel, model.weight, model.grad,
					   initial ? initial : (const float *)model.weights);
	if (initial != model.weights)
		free(initial);
	if (err) {
		dos_model_destroy(&model);
		dos_corpus_free(&corpus);
		free(loss_slots);
		return err;
	}
	opt.hook = cfg->hook;
	opt.hook_arg = cfg->hook_arg;

	declare_gpu_memory(cfg, &model);
	uint64_t first_step = 0;
	if (cfg->resume && DOS_VALUES_ARE_REAL)
		err = resume_from_checkpoint(cfg, &model, &opt, &corpus, &first_step);
	if (dos_dp_sum(err != 0) > 0 && !err) /* every rank resumes, or none */
		err = DOS_FAIL(-EIO, "--resume: another rank could not load its part of the checkpoint");
	if (!err && first_step > 0)
		dos_optimizer_rebuild_weights(&opt);
	if (err) {
		dos_optimizer_destroy(&opt);
		dos_model_destroy(&model);
		dos_corpus_free(&corpus);
		free(loss_slots);
		return err;
	}
	if (out)
		out->resumed_from = first_step;
	uint32_t tokens = cfg->micro_batch * cfg->shape.seq_len;
	struct pending_step pending[2] = {{.loss = loss_slots, .eval_loss = loss_slots + 2 * (size_t)A},
					  {.loss = loss_slots + A, .eval_loss = loss_slots + 2 * (size_t)A + E}};
	int have_pending = 0;
	double start = now_seconds();
	for (uint64_t k = first_step; k < cfg->steps && !err; k++) {
		if (k + 1 == cfg->steps && cfg->before_last_step) {
			starpu_task_wait_for_all();
			cfg->before_last_step(cfg->before_last_step_arg);
		}
		struct pending_step *p = &pending[k % 2];
		/* the loss gradient carries 1/(tokens * A) (a mean over the step's tokens) and
		 * the loss scale */
		float grad_scale = (float)(opt.loss_scale / ((double)tokens * A));
		/* the sum of the gradients of the micro-batches before ours, which ours add to
		 * (the chain; scattered, each rank's sum starts from its own micro-batches) */
		if (chain && first_mb > 0)
			for (uint32_t t = 0; t < model.ntensors; t++)
				dos_dp_recv(model.grad[t], dp->rank - 1, DOS_DP_TENSOR_GRAD, t);
		for (uint32_t g = 0; g < A && !err; g++) {
			uint64_t loss_tag = g + (uint64_t)A * (k % 2);
			if (g < first_mb || g >= first_mb + cfg->accumulation) {
				dos_corpus_skip_batch(&corpus, cfg->micro_batch);
				if (reporter) /* another rank's micro-batch: its losses come here */
					receive_loss(&p->loss[g], tokens, (int)(g / cfg->accumulation), DOS_DP_LOSS,
						     loss_tag);
				continue;
			}
			starpu_data_handle_t ids, targets, loss;
			if ((err = dos_corpus_next_batch(&corpus, cfg->micro_batch, cfg->shape.seq_len, cfg->sched_ctx,
							 &ids, &targets)))
				break;
			if ((err = dos_model_submit_microbatch(&model, ids, targets, grad_scale,
							       g > (chain ? 0 : first_mb), &loss)))
				break;
			deliver_loss(loss, reporter, &p->loss[g], DOS_DP_LOSS, loss_tag);
		}
		if (err)
			break;
		if (chain && first_mb + cfg->accumulation < A)
			for (uint32_t t = 0; t < model.ntensors; t++)
				dos_dp_send(model.grad[t], dp->rank + 1, DOS_DP_TENSOR_GRAD, t);
		p->step = k + 1;
		if ((err = dos_optimizer_submit_step(&opt, &p->report)))
			break;
		/* The step has read the tensor gradients (gathered, or sent on); the next
		 * backward writes them before reading them (its first micro-batch does not
		 * accumulate). Dropped now, they cost nothing to evict: otherwise StarPU writes
		 * 4 B per parameter of dead gradients back to the host whenever it needs GPU
		 * memory before that backward. */
		for (uint32_t t = 0; t < model.ntensors; t++)
			starpu_data_invalidate_submit(model.grad[t]);
		/* the held-out loss of the weights this step's refresh writes, read with its loss */
		if (E && cfg->eval_every && ((k + 1) % cfg->eval_every == 0 || k + 1 == cfg->steps) &&
		    (err = submit_evaluation(cfg, &corpus, &model, p, E, k)))
			break;
		/* the previous step while this one runs: first whether its updates left the state
		 * finite (before anything can save it), then its loss */
		if (have_pending && (err = finish_step(cfg, &opt, &pending[(k + 1) % 2], start, out)))
			break;
		have_pending = 1;
		if (cfg->checkpoint_dir && DOS_VALUES_ARE_REAL &&
		    (k + 1 == cfg->steps || (cfg->checkpoint_every && (k + 1) % cfg->checkpoint_every == 0)) &&
		    (err = save_checkpoint(cfg, &model, &opt, &corpus, &p->report, k + 1)))
			break;
		if (k + 1 == cfg->steps && (err = finish_step(cfg, &opt, p, start, out)))
			break;
	}
	starpu_task_wait_for_all();
	for (size_t i = 0; i < 2 * ((size_t)A + E); i++) /* left by an error */
		if (loss_slots[i])
			starpu_data_unregister(loss_slots[i]);
	free(loss_slots);
	if (out) {
		out->seconds = now_seconds() - start;
		out->skipped_steps = opt.skipped_steps;
		out->state_begin = opt.state_begin;
		out->state_len = opt.state_len;
		uint32_t f = opt.own_first, e = opt.own_end;
		uint64_t b = opt.state_begin, n = opt.state_len;
		copy_home(opt.master_h, f, e, opt.master, DOS_FP32, out->master ? out->master + b : NULL, n);
		copy_home(opt.m_h, f, e, opt.m, DOS_FP32, out->m ? out->m + b : NULL, n);
		copy_home(opt.v_h, f, e, opt.v, DOS_FP32, out->v ? out->v + b : NULL, n);
		copy_home(model.weight, 0, model.ntensors, model.weights, model.dtype, out->weights, params);
	}
	dos_optimizer_destroy(&opt);
	dos_model_destroy(&model);
	dos_corpus_free(&corpus);
	return err;
}
