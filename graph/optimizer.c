/* The optimizer (optimizer.h): its state, the tasks of a step, its checkpoints. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "codelets.h"
#include "dos_policy.h"
#include "codelet_util.h"
#include "errors.h"
#include "flat.h"
#include "host_memory.h"
#include "optimizer.h"
#include "scatter.h"
#include "subgroups.h"

struct _dos_optimizer {
	struct _dos_optimizer_config cfg;
	struct dos_subgroup_map map;
	uint64_t *numel; /* [map.ntensors]: each tensor's size, as checkpoints record it */
	/* this rank's subgroups [own_first, own_end), whose state it keeps: the parameters
	 * [state_begin, state_begin + state_len) of the flat space (all of them in a single
	 * process); master, m and v hold that range, one block from _dos_host_alloc (master
	 * first) */
	uint32_t own_first, own_end;
	uint64_t state_begin, state_len;
	float *master, *m, *v;
	int state_pinned; /* how _dos_host_alloc made it */
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
	struct _dos_scatter *scatter; /* the chunks of a DOS_DP_SCATTER job (scatter.h), else NULL */
};

/* Tells a starpu-dos policy running the optimizer's context that the step's updates are
 * all submitted (dos.h's step contract: one plan per step); called once at creation too,
 * which tells it that every step will be announced. Other policies plan no steps. */
static void announce_step(const struct _dos_optimizer *opt)
{
	if (_dos_sched_ctx_is_ours(opt->cfg.sched_ctx))
		dos_sched_step_submitted(opt->cfg.sched_ctx);
}

static void submit_task(struct _dos_optimizer *opt, struct starpu_task *task, enum _dos_task_phase phase,
			uint32_t subgroup)
{
	task->sched_ctx = opt->cfg.sched_ctx;
	if (opt->cfg.hook)
		opt->cfg.hook(opt->cfg.hook_arg, task, phase, subgroup);
	int err = starpu_task_submit(task);
	/* a refused submission leaves a half-built step that cannot be undone: a bug */
	STARPU_ASSERT_MSG(err == 0, "submitting %s failed (%d)", task->cl->name, err);
}

/* The scatter exchange's way of submitting (scatter.h): the phase and subgroup its
 * tasks serve. */
static void submit_for_scatter(void *opt, struct starpu_task *task, enum _dos_task_phase phase, uint32_t subgroup)
{
	submit_task(opt, task, phase, subgroup);
}

int _dos_optimizer_config_check(const struct _dos_optimizer_config *c, uint64_t nparams)
{
	struct dos_adam_step probe;
	int err;
	if (!c)
		return DOS_FAIL(-EINVAL, "cfg is NULL");
	if (c->weight_dtype != DOS_FP32 && c->weight_dtype != DOS_FP16 && c->weight_dtype != DOS_BF16)
		return DOS_FAIL(-EINVAL, "weight_dtype = %d is not fp32, fp16 or bf16", (int)c->weight_dtype);
	if (c->grad_dtype != DOS_FP32 && c->grad_dtype != c->weight_dtype)
		return DOS_FAIL(-EINVAL, "grad_dtype = %d (%s) must be fp32 or the weight dtype %s", (int)c->grad_dtype,
				dos_dtype_name(c->grad_dtype), dos_dtype_name(c->weight_dtype));
	if (c->tensor_dtype != DOS_FP32 && c->tensor_dtype != DOS_FP16 && c->tensor_dtype != DOS_BF16)
		return DOS_FAIL(-EINVAL, "tensor_dtype = %d is not fp32, fp16 or bf16", (int)c->tensor_dtype);
	/* 16-bit tensors convert to and from fp32 exactly or not at all: between fp16 and bf16
	 * a value would be rounded twice */
	if (c->tensor_dtype != DOS_FP32 && ((c->weight_dtype != DOS_FP32 && c->weight_dtype != c->tensor_dtype) ||
					    (c->grad_dtype != DOS_FP32 && c->grad_dtype != c->tensor_dtype)))
		return DOS_FAIL(-EINVAL,
				"tensor_dtype = %s needs weight_dtype (%s) and grad_dtype (%s) each fp32 or %s: "
				"converting between fp16 and bf16 would round twice",
				dos_dtype_name(c->tensor_dtype), dos_dtype_name(c->weight_dtype),
				dos_dtype_name(c->grad_dtype), dos_dtype_name(c->tensor_dtype));
	if (c->tensor_grad_dtype != DOS_FP32 && c->tensor_grad_dtype != c->tensor_dtype)
		return DOS_FAIL(-EINVAL, "tensor_grad_dtype = %d (%s) must be fp32 or the tensor dtype %s",
				(int)c->tensor_grad_dtype, dos_dtype_name(c->tensor_grad_dtype),
				dos_dtype_name(c->tensor_dtype));
	if ((err = _dos_subgroup_size_check(c->subgroup_size, nparams)) ||
	    (err = dos_adam_step_init(&probe, &c->hp, 1, 1.0)) || (err = dos_lr_schedule_check(&c->lr_schedule)) ||
	    (err = _dos_clip_norm_check(c->clip_norm)) ||
	    (err = _dos_loss_scale_check(c->dynamic_loss_scale, c->loss_scale_init)))
		return err;
	if (c->dynamic_loss_scale && c->loss_scale_window == 0)
		return DOS_FAIL(-EINVAL, "loss_scale_window = 0: dynamic loss scaling needs a window > 0");
	if (c->dp.nranks < 0 || c->dp.rank < 0 || c->dp.rank >= _dos_dp_size(&c->dp))
		return DOS_FAIL(-EINVAL, "dp.rank = %d is not a rank of a job of %d", c->dp.rank, c->dp.nranks);
	if (c->dp.exchange != DOS_DP_CHAIN && c->dp.exchange != DOS_DP_SCATTER)
		return DOS_FAIL(-EINVAL, "dp.exchange = %d is neither DOS_DP_CHAIN (%d) nor DOS_DP_SCATTER (%d)",
				(int)c->dp.exchange, DOS_DP_CHAIN, DOS_DP_SCATTER);
	if (_dos_dp_size(&c->dp) > 1 && !_dos_dp_available())
		return DOS_FAIL(-EINVAL, "dp.nranks = %d: this starpu-dos was built without StarPU-MPI", c->dp.nranks);
	return 0;
}

/* Each tensor's weight and gradient handle: contiguous data of numel[t] elements of the
 * tensor dtypes' sizes (the gathers and refreshes copy exactly that many). */
static int check_tensor_handles(uint32_t ntensors, const uint64_t *numel, starpu_data_handle_t *weights,
				starpu_data_handle_t *grads, size_t weight_elemsize, size_t grad_elemsize)
{
	for (uint32_t t = 0; t < ntensors; t++) {
		starpu_data_handle_t *lists[] = {weights, grads};
		const char *list_names[] = {"weights", "grads"};
		for (int l = 0; l < 2; l++) {
			char name[32];
			uint32_t nx;
			snprintf(name, sizeof name, "%s[%u]", list_names[l], t);
			int err = _dos_check_contiguous("_dos_optimizer_create", name, lists[l][t],
							l ? grad_elemsize : weight_elemsize, &nx);
			if (err)
				return err;
			if (nx != numel[t])
				return DOS_FAIL(-EINVAL, "%s has %u elements but numel[%u] = %llu", name, nx, t,
						(unsigned long long)numel[t]);
		}
	}
	return 0;
}

/* Whether subgroup s updates from its tensor's gradient handle itself: it is exactly one
 * tensor, whose gradient has the subgroup gradient's dtype, in a single process (in a
 * data-parallel job the gathering rank sends subgroup gradients to their owners). */
static int borrows_gradient(const struct _dos_optimizer *opt, uint32_t s)
{
	return opt->map.follows_tensors && _dos_dp_size(&opt->cfg.dp) == 1 &&
	       opt->cfg.tensor_grad_dtype == opt->cfg.grad_dtype && _dos_subgroup_whole_tensor(&opt->map, s) >= 0;
}

/* Registers every subgroup's handles: its state where this rank keeps it (home in the
 * state block), or, in fp32, the master weights it receives from their owner; its
 * gradient, 16-bit weights and statistics (no home: made by tasks); and the non-finite
 * flags (home in opt->nonfinite, read by the host). */
static void register_handles(struct _dos_optimizer *opt)
{
	const struct _dos_optimizer_config *cfg = &opt->cfg;
	int sixteen = cfg->weight_dtype != DOS_FP32;
	uint32_t N = opt->map.nsubgroups;
	for (uint32_t s = 0; s < N; s++) {
		uint64_t begin = opt->map.subgroup_start[s] - opt->state_begin;
		uint32_t len = (uint32_t)_dos_subgroup_len(&opt->map, s);
		if (s >= opt->own_first && s < opt->own_end) { /* ours: the state lives here */
			starpu_vector_data_register(&opt->master_h[s], STARPU_MAIN_RAM,
						    (uintptr_t)(opt->master + begin), len, sizeof(float));
			starpu_vector_data_register(&opt->m_h[s], STARPU_MAIN_RAM, (uintptr_t)(opt->m + begin), len,
						    sizeof(float));
			starpu_vector_data_register(&opt->v_h[s], STARPU_MAIN_RAM, (uintptr_t)(opt->v + begin), len,
						    sizeof(float));
		} else if (!sixteen) /* receives the owner's updated weights */
			starpu_vector_data_register(&opt->master_h[s], -1, 0, len, sizeof(float));
		if (borrows_gradient(opt, s))
			opt->grad_h[s] = opt->tensor_grad[_dos_subgroup_whole_tensor(&opt->map, s)];
		else
			starpu_vector_data_register(&opt->grad_h[s], -1, 0, len, dos_dtype_size(cfg->grad_dtype));
		if (sixteen)
			starpu_vector_data_register(&opt->weight16_h[s], -1, 0, len, 2);
		starpu_variable_data_register(&opt->stats_h[s], -1, 0, sizeof(struct dos_grad_stats));
	}
	for (size_t f = 0; f < 2 * (size_t)N; f++)
		starpu_variable_data_register(&opt->nonfinite_h[f], STARPU_MAIN_RAM, (uintptr_t)&opt->nonfinite[f],
					      sizeof *opt->nonfinite);
}

/* Submits the tasks that create this rank's state (one per subgroup, in subgroup order:
 * init_state.h), on a fresh optimizer whose state arrays hold nothing yet. The tasks only
 * write, so wherever the scheduler runs one, the state is made there and nothing crosses
 * the link; the host copy is valid again only when someone reads it there. */
static void submit_state_init(struct _dos_optimizer *opt, const struct dos_init_layout *layout)
{
	double bytes = 0;
	for (uint32_t s = opt->own_first; s < opt->own_end; s++)
		bytes += (double)(starpu_data_get_size(opt->master_h[s]) + starpu_data_get_size(opt->m_h[s]) +
				  starpu_data_get_size(opt->v_h[s]));
	_dos_sched_state_coming(opt->cfg.sched_ctx, bytes);
	for (uint32_t s = opt->own_first; s < opt->own_end; s++) {
		struct starpu_task *task;
		int err = _dos_init_state_task_create(opt->master_h[s], opt->m_h[s], opt->v_h[s], layout,
						      opt->map.subgroup_start[s], &task);
		STARPU_ASSERT_MSG(err == 0, "creating subgroup %u's state: %d", s, err);
		submit_task(opt, task, DOS_TASK_STATE_INIT, s);
	}
}

/* _dos_optimizer_create's work, the state from `initial` (copied on the host) or, when it
 * is NULL, from `layout` (by tasks). */
static int create(struct _dos_optimizer **out, const struct _dos_optimizer_config *cfg, uint32_t ntensors,
		  const uint64_t *numel, starpu_data_handle_t *weights, starpu_data_handle_t *grads,
		  const float *initial, const struct dos_init_layout *layout)
{
	int err;
	if (ntensors == 0)
		return DOS_FAIL(-EINVAL, "ntensors = 0: the optimizer needs at least one tensor");
	/* an unknown tensor dtype has size 0: _dos_optimizer_config_check names it below */
	if (dos_dtype_size(cfg->tensor_dtype) && dos_dtype_size(cfg->tensor_grad_dtype) &&
	    (err = check_tensor_handles(ntensors, numel, weights, grads, dos_dtype_size(cfg->tensor_dtype),
					dos_dtype_size(cfg->tensor_grad_dtype))))
		return err;
	uint64_t nparams = 0; /* no overflow: each count matched a 32-bit vector length */
	for (uint32_t t = 0; t < ntensors; t++)
		nparams += numel[t];
	if ((err = _dos_optimizer_config_check(cfg, nparams)) ||
	    (err = _dos_check_sched_ctx("_dos_optimizer_create", "cfg->sched_ctx", cfg->sched_ctx)))
		return err;
	/* *out is set at the end only: a refused or failed call leaves it as it was */
	struct _dos_optimizer *opt = calloc(1, sizeof *opt);
	if (!opt || !(opt->numel = malloc(ntensors * sizeof *opt->numel))) {
		free(opt);
		return DOS_FAIL(-ENOMEM, "no memory for an optimizer of %u tensors", ntensors);
	}
	memcpy(opt->numel, numel, ntensors * sizeof *numel);
	if ((err = _dos_subgroup_map_build(&opt->map, numel, ntensors, cfg->subgroup_size,
					   cfg->subgroups_follow_tensors))) {
		free(opt->numel);
		free(opt);
		return err;
	}
	opt->cfg = *cfg;
	opt->tensor_weight = weights;
	opt->tensor_grad = grads;
	opt->loss_scale = cfg->dynamic_loss_scale ? cfg->loss_scale_init : 1.0;

	uint64_t P = opt->map.nparams;
	uint32_t N = opt->map.nsubgroups;
	_dos_dp_owned_subgroups(&cfg->dp, cfg->dp.rank, N, &opt->own_first, &opt->own_end);
	opt->state_begin = opt->map.subgroup_start[opt->own_first];
	opt->state_len = opt->map.subgroup_start[opt->own_end] - opt->state_begin;
	uint64_t L = opt->state_len;
	/* one block: the state is pinned, or not, as a whole */
	float *state;
	char what[160];
	snprintf(what, sizeof what, "the optimizer state (fp32 master weights, Adam m and v of %llu parameters%s)",
		 (unsigned long long)L, L < P ? ", this rank's share" : "");
	if ((err = _dos_host_alloc((void **)&state, 3 * L * sizeof(float), what, &opt->state_pinned))) {
		_dos_subgroup_map_free(&opt->map);
		free(opt->numel);
		free(opt);
		return err;
	}
	opt->master = state;
	opt->m = state + L;
	opt->v = state + 2 * L;
	starpu_data_handle_t **arrays[] = {&opt->master_h, &opt->m_h,        &opt->v_h,
					   &opt->grad_h,   &opt->weight16_h, &opt->stats_h};
	for (size_t i = 0; i < sizeof arrays / sizeof *arrays; i++)
		if (!(*arrays[i] = calloc(N, sizeof(starpu_data_handle_t))))
			goto no_memory;
	if (!(opt->nonfinite = calloc(2 * (size_t)N, sizeof *opt->nonfinite)) ||
	    !(opt->nonfinite_h = calloc(2 * (size_t)N, sizeof *opt->nonfinite_h)))
		goto no_memory;
	if (initial && DOS_VALUES_ARE_REAL && L) {
		memcpy(opt->master, initial + opt->state_begin, L * sizeof(float));
		memset(opt->m, 0, L * sizeof(float));
		memset(opt->v, 0, L * sizeof(float));
	}
	/* the copies between tensors and subgroups run where the tensors live: on the GPU
	 * when there is one (the gradients come from backward there, the weights go to
	 * forward there) */
	opt->copies_on_gpu = starpu_cuda_worker_get_count() > 0;
	register_handles(opt);
	if (!initial)
		submit_state_init(opt, layout);
	if (_dos_dp_size(&cfg->dp) > 1 && cfg->dp.exchange == DOS_DP_SCATTER) {
		struct _dos_scatter_context sc = {.map = &opt->map,
						  .cfg = &opt->cfg,
						  .tensor_grad = opt->tensor_grad,
						  .copies_on_gpu = opt->copies_on_gpu,
						  .submit = submit_for_scatter,
						  .opt = opt};
		if ((err = _dos_scatter_create(&opt->scatter, &sc))) {
			_dos_optimizer_destroy(opt);
			return err;
		}
	}
	announce_step(opt);
	*out = opt;
	return 0;
no_memory:
	_dos_optimizer_destroy(opt);
	return DOS_FAIL(-ENOMEM, "no memory for the handle tables of %u subgroups", N);
}

int _dos_optimizer_create(struct _dos_optimizer **out, const struct _dos_optimizer_config *cfg, uint32_t ntensors,
			  const uint64_t *numel, starpu_data_handle_t *weights, starpu_data_handle_t *grads,
			  const float *initial)
{
	if (!out || !cfg || !numel || !weights || !grads || !initial)
		return DOS_FAIL(-EINVAL, "NULL argument (opt %p, cfg %p, numel %p, weights %p, grads %p, initial %p)",
				(void *)out, (const void *)cfg, (const void *)numel, (void *)weights, (void *)grads,
				(const void *)initial);
	return create(out, cfg, ntensors, numel, weights, grads, initial, NULL);
}

int _dos_optimizer_create_generated(struct _dos_optimizer **out, const struct _dos_optimizer_config *cfg,
				    uint32_t ntensors, const uint64_t *numel, starpu_data_handle_t *weights,
				    starpu_data_handle_t *grads, const struct dos_init_layout *layout)
{
	if (!out || !cfg || !numel || !weights || !grads || !layout)
		return DOS_FAIL(-EINVAL, "NULL argument (opt %p, cfg %p, numel %p, weights %p, grads %p, layout %p)",
				(void *)out, (const void *)cfg, (const void *)numel, (void *)weights, (void *)grads,
				(const void *)layout);
	return create(out, cfg, ntensors, numel, weights, grads, NULL, layout);
}

void _dos_optimizer_destroy(struct _dos_optimizer *opt)
{
	if (!opt)
		return;
	_dos_scatter_destroy(opt->scatter);
	starpu_data_handle_t *arrays[] = {opt->master_h, opt->m_h,        opt->v_h,
					  opt->grad_h,   opt->weight16_h, opt->stats_h};
	for (size_t i = 0; i < sizeof arrays / sizeof *arrays; i++) {
		for (uint32_t s = 0; arrays[i] && s < opt->map.nsubgroups; s++)
			if (arrays[i][s] && !(arrays[i] == opt->grad_h && borrows_gradient(opt, s)))
				starpu_data_unregister(arrays[i][s]);
		free(arrays[i]);
	}
	for (size_t f = 0; opt->nonfinite_h && f < 2 * (size_t)opt->map.nsubgroups; f++)
		if (opt->nonfinite_h[f])
			starpu_data_unregister(opt->nonfinite_h[f]);
	free(opt->nonfinite_h);
	free(opt->nonfinite);
	_dos_host_free(opt->master, 3 * opt->state_len * sizeof(float), opt->state_pinned);
	_dos_subgroup_map_free(&opt->map);
	free(opt->numel);
	free(opt);
}

/* What the refresh reads, per subgroup: the 16-bit weights, or in fp32 the master weights. */
static starpu_data_handle_t *updated_weights(const struct _dos_optimizer *opt)
{
	return opt->cfg.weight_dtype != DOS_FP32 ? opt->weight16_h : opt->master_h;
}

/* Subgroup s's gradient from the tensor gradients its pieces lie in. */
static void submit_gather(struct _dos_optimizer *opt, uint32_t s)
{
	const struct dos_subgroup_map *map = &opt->map;
	uint32_t first = map->subgroup_first[s], count = map->subgroup_first[s + 1] - first;
	starpu_data_handle_t sources[count];
	struct dos_flat_piece pieces[count];
	for (uint32_t k = 0; k < count; k++) {
		const struct dos_piece *p = &map->pieces[first + k];
		sources[k] = opt->tensor_grad[p->tensor];
		pieces[k] = (struct dos_flat_piece){.source = k,
						    .source_offset = p->tensor_offset,
						    .destination_offset = p->subgroup_offset,
						    .len = p->len};
	}
	struct starpu_task *task;
	int err =
		_dos_flat_copy_task_create(&opt->grad_h[s], 1, opt->cfg.grad_dtype, sources, opt->cfg.tensor_grad_dtype,
					   count, pieces, count, opt->cfg.sched_ctx, &task);
	STARPU_ASSERT_MSG(err == 0, "out of memory building the gradient gather of subgroup %u", s);
	if (opt->copies_on_gpu)
		task->where = STARPU_CUDA;
	submit_task(opt, task, DOS_TASK_GATHER, s);
}

/* Tensor t's working weights from the subgroups its pieces lie in. */
static void submit_refresh(struct _dos_optimizer *opt, uint32_t t)
{
	const struct dos_subgroup_map *map = &opt->map;
	uint32_t first = map->tensor_first[t], count = map->tensor_first[t + 1] - first, n = 0;
	/* a scatter job reads each piece from up to one chunk per rank */
	size_t most = (size_t)count * (opt->scatter ? (size_t)_dos_dp_size(&opt->cfg.dp) : 1);
	starpu_data_handle_t *sources = malloc(most * sizeof *sources);
	struct dos_flat_piece *pieces = malloc(most * sizeof *pieces);
	STARPU_ASSERT_MSG(sources && pieces, "out of memory building the weight refresh of tensor %u", t);
	for (uint32_t k = 0; k < count; k++) {
		const struct dos_piece *p = &map->pieces[first + k];
		starpu_data_handle_t whole = updated_weights(opt)[p->subgroup];
		if (opt->scatter) {
			n += _dos_scatter_refresh_pieces(opt->scatter, p->subgroup, whole, p->subgroup_offset, p->len,
							 p->tensor_offset, sources, n, pieces + n);
			continue;
		}
		sources[n] = whole;
		pieces[n] = (struct dos_flat_piece){.source = n,
						    .source_offset = p->subgroup_offset,
						    .destination_offset = p->tensor_offset,
						    .len = p->len};
		n++;
	}
	struct starpu_task *task;
	int err = _dos_flat_copy_task_create(&opt->tensor_weight[t], 1, opt->cfg.tensor_dtype, sources,
					     opt->cfg.weight_dtype, n, pieces, n, opt->cfg.sched_ctx, &task);
	STARPU_ASSERT_MSG(err == 0, "out of memory building the weight refresh of tensor %u", t);
	free(sources);
	free(pieces);
	if (opt->copies_on_gpu)
		task->where = STARPU_CUDA;
	submit_task(opt, task, DOS_TASK_REFRESH, DOS_NO_SUBGROUP);
}

/* Every subgroup's gradient where its state is: one process gathers them all; in a
 * data-parallel job the last rank of the gradient chain holds the summed tensor gradients,
 * gathers every subgroup and sends each to its owner (or the ranks reduce the chunks of
 * every subgroup: scatter.h). */
static void submit_gradients(struct _dos_optimizer *opt)
{
	const struct dos_data_parallel *dp = &opt->cfg.dp;
	uint32_t N = opt->map.nsubgroups;
	int last = _dos_dp_size(dp) - 1;
	if (opt->scatter) {
		_dos_scatter_submit_gradients(opt->scatter, opt->grad_h);
		return;
	}
	for (uint32_t s = 0; s < N; s++) {
		int owner = _dos_dp_owner(dp, N, s);
		if (borrows_gradient(opt, s))
			continue; /* the update reads the tensor's gradient */
		if (dp->rank == last) {
			submit_gather(opt, s);
			if (owner != last)
				_dos_dp_send(opt->grad_h[s], owner, DOS_DP_SUBGROUP_GRAD, s);
		} else if (owner == dp->rank)
			_dos_dp_recv(opt->grad_h[s], last, DOS_DP_SUBGROUP_GRAD, s);
	}
}

/* The owner's updated weights of every subgroup, on every rank. */
static void exchange_weights(struct _dos_optimizer *opt)
{
	const struct dos_data_parallel *dp = &opt->cfg.dp;
	uint32_t N = opt->map.nsubgroups;
	if (opt->scatter) {
		_dos_scatter_submit_weights(opt->scatter, updated_weights(opt));
		return;
	}
	for (uint32_t s = 0; s < N; s++) {
		int owner = _dos_dp_owner(dp, N, s);
		if (owner != dp->rank)
			_dos_dp_recv(updated_weights(opt)[s], owner, DOS_DP_WEIGHTS, s);
		else
			for (int r = 0; r < _dos_dp_size(dp); r++)
				if (r != owner)
					_dos_dp_send(updated_weights(opt)[s], r, DOS_DP_WEIGHTS, s);
	}
}

/* Once the step's last reader of them is submitted, the subgroup gradients (each step
 * gathers them anew) and, on an applied step, the 16-bit weights its updates wrote (the
 * refresh has copied them into the tensors; the next update writes them anew) are dead.
 * Dropped (no copy stays valid), their GPU memory is free to reuse; otherwise they are
 * dirty data there, which StarPU writes back to the host over the link whenever it needs
 * room: 4 B per parameter in 16-bit training, on the link the optimizer's own transfers
 * want. Each rank drops the gradients it wrote: all of them on the rank that gathers, its
 * own subgroups' on the others. */
static void drop_consumed(struct _dos_optimizer *opt, int applied)
{
	const struct dos_data_parallel *dp = &opt->cfg.dp;
	uint32_t N = opt->map.nsubgroups;
	int gathers = dp->rank == _dos_dp_size(dp) - 1 && !opt->scatter;
	if (opt->scatter)
		_dos_scatter_drop(opt->scatter);
	for (uint32_t s = 0; s < N; s++) {
		/* a borrowed gradient is the application's: never ours to drop */
		if ((gathers || _dos_dp_owner(dp, N, s) == dp->rank) && !borrows_gradient(opt, s))
			starpu_data_invalidate_submit(opt->grad_h[s]);
		if (applied && opt->cfg.weight_dtype != DOS_FP32)
			starpu_data_invalidate_submit(opt->weight16_h[s]);
	}
}

/* The global statistics (sum of squares, overflow) in subgroup order: the same bits
 * wherever each subgroup's statistics were computed, and on every rank. */
static int global_stats(struct _dos_optimizer *opt, double *sum_sq, uint32_t *overflow_subgroup)
{
	const struct dos_data_parallel *dp = &opt->cfg.dp;
	uint32_t N = opt->map.nsubgroups;
	for (uint32_t s = 0; s < N; s++) {
		int owner = _dos_dp_owner(dp, N, s);
		if (owner != dp->rank) {
			_dos_dp_recv(opt->stats_h[s], owner, DOS_DP_STATS, s);
			continue;
		}
		struct starpu_task *task;
		int err = dos_grad_stats_task_create(opt->grad_h[s], opt->cfg.grad_dtype, opt->stats_h[s], &task);
		if (err)
			return err;
		submit_task(opt, task, DOS_TASK_STATISTICS, s);
		for (int r = 0; r < _dos_dp_size(dp); r++)
			if (r != owner)
				_dos_dp_send(opt->stats_h[s], r, DOS_DP_STATS, s);
	}
	*sum_sq = 0;
	*overflow_subgroup = UINT32_MAX;
	for (uint32_t s = 0; s < N; s++) {
		int err = starpu_data_acquire(opt->stats_h[s], STARPU_R);
		if (err)
			return DOS_FAIL(err, "reading the gradient statistics of subgroup %u failed (%d)", s, err);
		const struct dos_grad_stats *st = (const void *)starpu_variable_get_local_ptr(opt->stats_h[s]);
		if (st->nonfinite && *overflow_subgroup == UINT32_MAX)
			*overflow_subgroup = s;
		*sum_sq += st->sum_sq;
		starpu_data_release(opt->stats_h[s]);
	}
	return 0;
}

int _dos_optimizer_submit_step(struct _dos_optimizer *opt, struct _dos_step_report *report)
{
	if (!opt || !report)
		return DOS_FAIL(-EINVAL, "NULL argument (opt %p, report %p)", (void *)opt, (void *)report);
	const struct _dos_optimizer_config *c = &opt->cfg;
	uint32_t N = opt->map.nsubgroups;
	*report = (struct _dos_step_report){
		.applied = 1, .grad_norm = -1, .loss_scale_used = opt->loss_scale, .overflow_subgroup = UINT32_MAX};
	submit_gradients(opt);

	/* the loss scale moves only once the step's tasks exist: a failing call changes nothing */
	double multiplier = 1.0 / opt->loss_scale, next_scale = opt->loss_scale;
	uint32_t next_good_steps = opt->good_steps;
	if (c->clip_norm > 0 || c->dynamic_loss_scale) {
		double sum_sq;
		int err = global_stats(opt, &sum_sq, &report->overflow_subgroup);
		if (err)
			return err;
		if (report->overflow_subgroup != UINT32_MAX) {
			/* inf/nan somewhere: the step is dropped and the state stays bit-for-bit */
			drop_consumed(opt, 0);
			report->applied = 0;
			opt->skipped_steps++;
			if (c->dynamic_loss_scale) {
				opt->loss_scale = opt->loss_scale / 2 >= 1 ? opt->loss_scale / 2 : 1;
				opt->good_steps = 0;
			}
			return 0;
		}
		report->grad_norm = sqrt(sum_sq) / opt->loss_scale;
		/* torch.nn.utils.clip_grad_norm_: coefficient max_norm / (norm + 1e-6), capped at 1 */
		if (c->clip_norm > 0 && report->grad_norm > c->clip_norm)
			multiplier *= c->clip_norm / (report->grad_norm + 1e-6);
		if (c->dynamic_loss_scale && ++next_good_steps >= c->loss_scale_window) {
			/* no further than a float holds (DOS_LOSS_SCALE_MAX) */
			next_scale = next_scale * 2 <= DOS_LOSS_SCALE_MAX ? next_scale * 2 : next_scale;
			next_good_steps = 0;
		}
	}

	/* the schedule scales lr by a factor <= 1, which _dos_optimizer_config_check's step-1
	 * probe has covered */
	struct dos_adam_hparams hp = c->hp;
	hp.lr = c->hp.lr * dos_lr_schedule_factor(&c->lr_schedule, opt->step + 1);
	struct dos_adam_step step;
	int err = dos_adam_step_init(&step, &hp, opt->step + 1, multiplier);
	if (err)
		return err;
	struct starpu_task **updates = malloc(N * sizeof *updates);
	if (!updates)
		return DOS_FAIL(-ENOMEM, "no memory for the %u update tasks of step %llu", N,
				(unsigned long long)opt->step + 1);
	uint64_t update = opt->step + 1;
	starpu_data_handle_t *flags = opt->nonfinite_h + (update % 2) * N;
	for (uint32_t s = opt->own_first; s < opt->own_end; s++) { /* this rank's subgroups */
		err = dos_adam_task_create(&step, opt->master_h[s], opt->m_h[s], opt->v_h[s], opt->grad_h[s],
					   c->grad_dtype, c->weight_dtype != DOS_FP32 ? opt->weight16_h[s] : NULL,
					   c->weight_dtype, &updates[s]);
		if (!err && (err = dos_adam_task_report_nonfinite(updates[s], flags[s]))) {
			updates[s]->destroy = 0;
			starpu_task_destroy(updates[s]);
		}
		if (err) {
			for (uint32_t k = opt->own_first; k < s; k++) {
				updates[k]->destroy = 0; /* never submitted */
				starpu_task_destroy(updates[k]);
			}
			free(updates);
			return err;
		}
	}
	opt->loss_scale = next_scale;
	opt->good_steps = next_good_steps;
	for (uint32_t s = opt->own_first; s < opt->own_end; s++)
		submit_task(opt, updates[s], DOS_TASK_UPDATE, s);
	announce_step(opt);
	free(updates);
	opt->nonfinite_update[update % 2] = update;
	report->update = update;
	report->lr = hp.lr;
	opt->step++;
	if (_dos_dp_size(&c->dp) > 1)
		exchange_weights(opt);
	for (uint32_t t = 0; t < opt->map.ntensors; t++)
		submit_refresh(opt, t);
	drop_consumed(opt, 1);
	return 0;
}

int _dos_optimizer_set_lr(struct _dos_optimizer *opt, double lr)
{
	if (!opt)
		return DOS_FAIL(-EINVAL, "opt is NULL");
	struct dos_adam_hparams hp = opt->cfg.hp;
	hp.lr = lr;
	struct dos_adam_step probe;
	int err = dos_adam_step_init(&probe, &hp, 1, 1.0);
	if (err)
		return err;
	opt->cfg.hp.lr = lr;
	return 0;
}

/* Brings every subgroup's master, m and v home and holds them there in `mode` (STARPU_R to
 * read opt->master, m, v; STARPU_RW to also write them), waiting for the updates
 * submitted so far; release_state lets them go again. Between the two the arrays are
 * the state. */
static void hold_state(const struct _dos_optimizer *opt, enum starpu_data_access_mode mode)
{
	starpu_data_handle_t *state[] = {opt->master_h, opt->m_h, opt->v_h};
	for (int i = 0; i < 3; i++)
		for (uint32_t s = opt->own_first; s < opt->own_end; s++)
			starpu_data_acquire(state[i][s], mode);
}

static void release_state(const struct _dos_optimizer *opt)
{
	starpu_data_handle_t *state[] = {opt->master_h, opt->m_h, opt->v_h};
	for (int i = 0; i < 3; i++)
		for (uint32_t s = opt->own_first; s < opt->own_end; s++)
			starpu_data_release(state[i][s]);
}

/* With the state held: -ERANGE naming the first non-finite value of master, m or v
 * (array, parameter, subgroup, after step `steps_done`); else 0. */
static int check_finite(const struct _dos_optimizer *opt, uint64_t steps_done)
{
	const float *arrays[] = {opt->master, opt->m, opt->v};
	const char *names[] = {"master weight", "Adam m", "Adam v"};
	for (int a = 0; a < 3; a++)
		for (uint64_t i = 0; i < opt->state_len; i++)
			if (!isfinite(arrays[a][i])) {
				uint64_t param = opt->state_begin + i;
				return DOS_FAIL(-ERANGE,
						"after step %llu the optimizer state is not finite: %s of parameter "
						"%llu (subgroup %llu) is %g",
						(unsigned long long)steps_done, names[a], (unsigned long long)param,
						(unsigned long long)_dos_subgroup_of(&opt->map, param),
						(double)arrays[a][i]);
			}
	return 0;
}

void _dos_optimizer_rebuild_weights(struct _dos_optimizer *opt)
{
	if (opt->cfg.weight_dtype != DOS_FP32)
		/* the 16-bit weights the update would have written from these master weights */
		for (uint32_t s = opt->own_first; s < opt->own_end; s++) {
			struct starpu_task *task;
			int err = dos_cast_task_create(opt->master_h[s], opt->weight16_h[s], opt->cfg.weight_dtype,
						       &task);
			STARPU_ASSERT_MSG(err == 0, "casting subgroup %u's master weights: %d", s, err);
			submit_task(opt, task, DOS_TASK_REFRESH, s);
		}
	if (_dos_dp_size(&opt->cfg.dp) > 1) /* each rank's, to the others */
		exchange_weights(opt);
	for (uint32_t t = 0; t < opt->map.ntensors; t++)
		submit_refresh(opt, t);
}

int _dos_optimizer_update_nonfinite(struct _dos_optimizer *opt, uint64_t update, uint32_t *count, uint32_t *subgroup,
				    uint32_t *bits)
{
	if (!opt || !count || !subgroup || !bits)
		return DOS_FAIL(-EINVAL, "NULL argument (opt %p, count %p, subgroup %p, bits %p)", (void *)opt,
				(void *)count, (void *)subgroup, (void *)bits);
	if (update == 0 || opt->nonfinite_update[update % 2] != update)
		return DOS_FAIL(-EINVAL, "update = %llu: its flags are not there (the latest update is %llu)",
				(unsigned long long)update, (unsigned long long)opt->step);
	uint32_t N = opt->map.nsubgroups, n = 0, first = UINT32_MAX, first_bits = 0;
	starpu_data_handle_t *flags = opt->nonfinite_h + (update % 2) * N;
	const uint32_t *values = opt->nonfinite + (update % 2) * N;
	for (uint32_t s = opt->own_first; s < opt->own_end; s++) { /* the updates of this rank */
		int err = starpu_data_acquire(flags[s], STARPU_R);
		if (err)
			return DOS_FAIL(err, "reading the non-finite flag of subgroup %u failed (%d)", s, err);
		if (values[s]) {
			if (!n++) {
				first = s;
				first_bits = values[s];
			}
		}
		starpu_data_release(flags[s]);
	}
	*count = n;
	*subgroup = first;
	*bits = first_bits;
	return 0;
}

void _dos_optimizer_get_info(const struct _dos_optimizer *opt, struct _dos_optimizer_info *info)
{
	*info = (struct _dos_optimizer_info){.nparams = opt->map.nparams,
					     .subgroup_size = opt->map.subgroup_size,
					     .ntensors = opt->map.ntensors,
					     .nsubgroups = opt->map.nsubgroups,
					     .updates = opt->step,
					     .skipped_steps = opt->skipped_steps,
					     .loss_scale = opt->loss_scale,
					     .state_begin = opt->state_begin,
					     .state_len = opt->state_len};
}

int _dos_optimizer_check_update(struct _dos_optimizer *opt, uint64_t update, uint64_t steps_done)
{
	if (!DOS_VALUES_ARE_REAL || !update)
		return 0;
	uint32_t count, s, bits;
	int err = _dos_optimizer_update_nonfinite(opt, update, &count, &s, &bits);
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
	uint64_t first = opt->map.subgroup_start[s];
	return DOS_FAIL(-ERANGE,
			"after step %llu the optimizer state is not finite: %s of subgroup %u (parameters %llu to "
			"%llu)%s; not saved, training stopped",
			(unsigned long long)steps_done, arrays, s, (unsigned long long)first,
			(unsigned long long)(first + _dos_subgroup_len(&opt->map, s) - 1), others);
}

void _dos_optimizer_read_state(struct _dos_optimizer *opt, float *master, float *m, float *v)
{
	if (!DOS_VALUES_ARE_REAL)
		return;
	hold_state(opt, STARPU_R);
	float *to[] = {master, m, v};
	const float *from[] = {opt->master, opt->m, opt->v};
	for (int i = 0; i < 3; i++)
		if (to[i])
			memcpy(to[i], from[i], opt->state_len * sizeof(float));
	release_state(opt);
}

int _dos_optimizer_write_state(struct _dos_optimizer *opt, const float *master, const float *m, const float *v,
			       uint64_t updates)
{
	const float *from[] = {master, m, v};
	static const char *const names[] = {"master", "m", "v"};
	/* the next update is t = updates + 1: at 2^64 - 1 it would wrap to 0, which the step
	 * scalars refuse at every later step ("step = 0") */
	if (updates == UINT64_MAX)
		return DOS_FAIL(-EINVAL, "updates = %llu: the next update's number t = updates + 1 would overflow",
				(unsigned long long)updates);
	for (int a = 0; a < 3; a++)
		for (uint64_t i = 0; from[a] && i < opt->state_len; i++)
			if (!isfinite(from[a][i]) || (a == 2 && from[a][i] < 0))
				return DOS_FAIL(-EINVAL, "%s[%llu] = %g: the state must be finite%s", names[a],
						(unsigned long long)i, (double)from[a][i],
						a == 2 ? ", and v >= 0 (Adam's second moment, not its square root)"
						       : "");
	hold_state(opt, STARPU_RW);
	float *to[] = {opt->master, opt->m, opt->v};
	for (int a = 0; a < 3 && DOS_VALUES_ARE_REAL; a++)
		if (from[a])
			memcpy(to[a], from[a], opt->state_len * sizeof(float));
	opt->step = updates;
	/* the flags describe the state the last update wrote, which is gone */
	opt->nonfinite_update[0] = opt->nonfinite_update[1] = 0;
	release_state(opt);
	if (master)
		_dos_optimizer_rebuild_weights(opt);
	return 0;
}

/* ---- checkpoints ---------------------------------------------------------------------- */

/* A checkpoint's description of the optimizer now, at `at`: the one place that says what
 * a checkpoint records, for saving and (its layout) for checking a load. */
static struct dos_checkpoint_meta checkpoint_meta(const struct _dos_optimizer *opt, const struct _dos_run_position *at)
{
	return (struct dos_checkpoint_meta){.nparams = opt->map.nparams,
					    .subgroup_size = opt->map.subgroup_size,
					    .ntensors = opt->map.ntensors,
					    .numel = opt->numel,
					    .weight_dtype = opt->cfg.weight_dtype,
					    .grad_dtype = opt->cfg.grad_dtype,
					    .step = opt->step,
					    .skipped_steps = opt->skipped_steps,
					    .steps_done = at->steps_done,
					    .loss_scale = opt->loss_scale,
					    .good_steps = opt->good_steps,
					    .seed = at->seed,
					    .data_rng = at->data_rng,
					    .hp = opt->cfg.hp,
					    .run = at->run};
}

/* The ranks that keep state each save a shard (with fewer subgroups than ranks, some keep
 * none): their number, and this rank's shard. */
static uint32_t count_shards(const struct _dos_optimizer *opt, uint32_t *my_shard)
{
	const struct dos_data_parallel *dp = &opt->cfg.dp;
	uint32_t shards = 0;
	*my_shard = 0;
	for (int r = 0; r < _dos_dp_size(dp); r++) {
		uint32_t first, end;
		_dos_dp_owned_subgroups(dp, r, opt->map.nsubgroups, &first, &end);
		*my_shard += r < dp->rank && end > first;
		shards += end > first;
	}
	return shards;
}

int _dos_optimizer_save(struct _dos_optimizer *opt, const char *dir, unsigned keep, const struct _dos_run_position *at,
			enum _dos_save_check check, char *path_out, size_t path_size)
{
	uint32_t my_shard, shards = count_shards(opt, &my_shard);
	struct dos_checkpoint_meta meta = checkpoint_meta(opt, at);
	/* the flags of the latest update, while they are there: after a load, the state is
	 * what a save wrote, which was finite */
	uint64_t latest = opt->nonfinite_update[opt->step % 2] == opt->step ? opt->step : 0;
	int err = check == DOS_SAVE_CHECK_FLAGS ? _dos_optimizer_check_update(opt, latest, at->steps_done) : 0;
	hold_state(opt, STARPU_R);
	if (!err && check == DOS_SAVE_CHECK_VALUES)
		err = check_finite(opt, at->steps_done);
	if (!err && shards == 1 && opt->state_len > 0)
		err = _dos_checkpoint_save(dir, &meta, opt->master, opt->m, opt->v, keep, path_out, path_size);
	else if (!err && opt->state_len > 0) {
		meta.state_begin = opt->state_begin;
		meta.state_len = opt->state_len;
		err = _dos_checkpoint_save_shard(dir, &meta, my_shard, shards, opt->master, opt->m, opt->v);
	}
	release_state(opt);
	const struct dos_data_parallel *dp = &opt->cfg.dp;
	if (_dos_dp_size(dp) == 1)
		return err;
	/* once every shard is saved (or one failed: then every rank fails), rank 0 writes
	 * the manifest */
	if (_dos_dp_sum(err != 0) > 0)
		return err ? err
			   : DOS_FAIL(-EIO, "checkpoint after step %llu: another rank could not save its shard",
				      (unsigned long long)at->steps_done);
	if (dp->rank == 0 && shards > 1) {
		meta.state_begin = meta.state_len = 0;
		err = _dos_checkpoint_save_manifest(dir, &meta, shards, keep, path_out, path_size);
	}
	if (_dos_dp_sum(err != 0) > 0)
		return err ? err
			   : DOS_FAIL(-EIO, "checkpoint after step %llu: rank 0 could not write the manifest",
				      (unsigned long long)at->steps_done);
	return 0;
}

int _dos_optimizer_load(struct _dos_optimizer *opt, const char *path, struct _dos_run_position *at)
{
	/* read-write and home: the loaded values replace every copy, wherever it is */
	hold_state(opt, STARPU_RW);
	struct _dos_run_position none = {0};
	struct dos_checkpoint_meta expect = checkpoint_meta(opt, &none), got;
	int err;
	if (opt->state_len)
		err = _dos_checkpoint_load_range(path, &expect, opt->state_begin, opt->state_len, &got, opt->master,
						 opt->m, opt->v);
	else /* a rank that keeps no state: the counters only */
		err = _dos_checkpoint_load_range(path, &expect, 0, 1, &got, NULL, NULL, NULL);
	if (!err) {
		opt->step = got.step;
		opt->skipped_steps = got.skipped_steps;
		opt->loss_scale = got.loss_scale;
		opt->good_steps = got.good_steps;
		*at = (struct _dos_run_position){
			.steps_done = got.steps_done, .seed = got.seed, .data_rng = got.data_rng, .run = got.run};
	}
	release_state(opt);
	return err;
}
