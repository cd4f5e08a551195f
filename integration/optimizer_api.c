/* The embedding API of include/dos.h (dos_opt_*): a thin facade over the optimizer of
 * graph/optimizer.c, which owns the state, the step's tasks and the checkpoints. Here:
 * the application's tensors (its handles, or buffers registered here), StarPU joined or
 * started, per-task records of where each update ran and how long each phase took, and
 * the throttle that keeps an application within the steps the dos policy plans ahead. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <starpu.h>

#include "checkpoint.h"
#include "codelet_util.h"
#include "dos.h"
#include "errors.h"
#include "numerics.h"
#include "optimizer.h"
#include "dos_policy.h"
#include "planner.h"

/* Optimizers alive in a StarPU that dos_opt_create started: the last one destroyed shuts
 * it down. The lock also makes "is StarPU up? start it" one step for concurrent creates. */
static pthread_mutex_t owned_starpu_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned owned_starpu_users;

/* A buffer an optimizer reads or writes as a tensor's weight or gradient: bytes at start
 * in an address space (0: the host's; 1 + d: CUDA device d's). */
struct tensor_buffer {
	int space;
	uintptr_t start;
	size_t bytes;
	uint32_t tensor;
	int is_grad;
};

/* Every live optimizer, so that a second one over the same tensors is refused: each
 * keeps its own state, and the last to write the weights would win. */
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static struct dos_opt *live_opts;

/* What one step's tasks have done so far; freed when the last of them ends. */
struct step_account {
	uint64_t step;
	unsigned pending; /* tasks not ended, plus one while the step is being submitted */
	struct dos_opt_step_times times;
	double first_start[DOS_PHASE_COUNT], last_end[DOS_PHASE_COUNT]; /* us */
	unsigned ended;
	double step_start, step_end;
};

/* One submitted task: recorded when a worker takes it and when it ends. */
struct task_record {
	struct dos_opt *opt;
	struct step_account *account; /* NULL for the weight rebuild after a load */
	enum dos_opt_phase phase;
	uint32_t subgroup; /* DOS_PHASE_UPDATE */
	double start_us;
	void (*pop_callback)(void *), *pop_arg; /* the task's own, called too */
	void (*end_callback)(void *), *end_arg;
};

struct dos_opt {
	struct _dos_optimizer *inner;
	uint32_t ntensors, nsubgroups;
	uint64_t *numel;
	starpu_data_handle_t *weight, *grad; /* [ntensors], handed to inner */
	int *weight_node, *grad_node;        /* home node of the handles registered here, else -1 */
	unsigned sched_ctx;
	int own_ctx;     /* created here, deleted by destroy */
	int owns_starpu; /* counted in owned_starpu_users */
	uint64_t steps_submitted;
	/* the step being submitted, for the hook (submitting thread only) */
	struct step_account *submitting;
	/* guards what the task records update from the workers */
	starpu_pthread_mutex_t lock;
	starpu_pthread_cond_t progress; /* a task or a step ended */
	unsigned long in_flight;        /* tasks */
	unsigned steps_in_flight;       /* steps with tasks not ended */
	enum dos_device *placement;     /* [nsubgroups] */
	struct dos_opt_step_times last_times;
	/* its tensors' buffers, and its place among the live optimizers */
	struct tensor_buffer *buffers;
	size_t nbuffers;
	struct dos_opt *next_live;
	int live;
	/* checkpoints: the run this optimizer is (drawn at creation, or the one of the
	 * checkpoint it loaded) and the folder it saves into */
	struct _dos_run_id run;
	int loaded;
	struct _dos_checkpoint_folder folder;
	/* after a load, the step it was saved at, until the next save has set aside the newer
	 * checkpoints of the run that do not verify (graph/checkpoint.h) */
	uint64_t loaded_steps;
	int set_aside_pending;
};

int dos_opt_config_init(struct dos_opt_config *cfg)
{
	if (!cfg)
		return DOS_FAIL(-EINVAL, "cfg is NULL");
	*cfg = (struct dos_opt_config){
		.hp = {.mode = DOS_ADAM_L2, .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0},
		.subgroup_size = (uint64_t)1 << 24,
		.tensor_dtype = DOS_FP32,
		.weight_dtype = DOS_FP32,
		.grad_dtype = DOS_FP32,
		.loss_scale_init = 65536,
		.loss_scale_window = 2000,
	};
	return 0;
}

/* ---- task records ---------------------------------------------------------------------- */

static void publish_if_done(struct dos_opt *opt, struct step_account *a)
{
	if (--a->pending)
		return;
	opt->steps_in_flight--;
	STARPU_PTHREAD_COND_BROADCAST(&opt->progress);
	for (int p = 0; p < DOS_PHASE_COUNT; p++)
		if (a->times.tasks[p])
			a->times.span_seconds[p] = 1e-6 * (a->last_end[p] - a->first_start[p]);
	if (a->ended)
		a->times.step_seconds = 1e-6 * (a->step_end - a->step_start);
	/* steps end in order in practice; a late one must not replace a newer one */
	if (a->step > opt->last_times.step)
		opt->last_times = a->times;
	free(a);
}

static void task_taken(void *arg)
{
	struct task_record *r = arg;
	r->start_us = starpu_timing_now();
	if (r->pop_callback)
		r->pop_callback(r->pop_arg);
}

/* The epilogue callback: it runs before the task releases its data, so whoever waits on
 * that data (dos_opt_wait, a later task) finds the record done. */
static void task_ended(void *arg)
{
	struct task_record *r = arg;
	double end = starpu_timing_now();
	double start = isnan(r->start_us) ? end : r->start_us;
	int worker = starpu_worker_get_id();
	enum dos_device device =
		worker >= 0 && starpu_worker_get_type(worker) == STARPU_CUDA_WORKER ? DOS_DEVICE_GPU : DOS_DEVICE_CPU;
	if (r->end_callback)
		r->end_callback(r->end_arg);
	struct dos_opt *opt = r->opt;
	STARPU_PTHREAD_MUTEX_LOCK(&opt->lock);
	if (r->phase == DOS_PHASE_UPDATE)
		opt->placement[r->subgroup] = device;
	struct step_account *a = r->account;
	if (a) {
		struct dos_opt_step_times *t = &a->times;
		int p = r->phase;
		if (t->tasks[p]++ == 0 || start < a->first_start[p])
			a->first_start[p] = start;
		if (t->tasks[p] == 1 || end > a->last_end[p])
			a->last_end[p] = end;
		t->busy_seconds[p] += 1e-6 * (end - start);
		if (r->phase == DOS_PHASE_UPDATE && device == DOS_DEVICE_GPU)
			t->gpu_updates++;
		else if (r->phase == DOS_PHASE_UPDATE)
			t->cpu_updates++;
		if (a->ended++ == 0 || start < a->step_start)
			a->step_start = start;
		if (a->ended == 1 || end > a->step_end)
			a->step_end = end;
		publish_if_done(opt, a);
	}
	if (--opt->in_flight == 0)
		STARPU_PTHREAD_COND_BROADCAST(&opt->progress);
	STARPU_PTHREAD_MUTEX_UNLOCK(&opt->lock);
	free(r);
}

/* The public phase of one of the optimizer's tasks: the one place that maps the phases
 * its submitters name (graph/phase.h) onto enum dos_opt_phase, whose values are ABI. A
 * weight rebuild's casts are part of the refresh. */
static enum dos_opt_phase public_phase(enum _dos_task_phase phase)
{
	switch (phase) {
	case DOS_TASK_GATHER:
		return DOS_PHASE_GATHER;
	case DOS_TASK_STATISTICS:
		return DOS_PHASE_STATS;
	case DOS_TASK_UPDATE:
		return DOS_PHASE_UPDATE;
	case DOS_TASK_REFRESH:
		return DOS_PHASE_REFRESH;
	default:
		STARPU_ASSERT_MSG(0, "the optimizer submitted a task of the %s phase", _dos_task_phase_name(phase));
		return DOS_PHASE_REFRESH;
	}
}

/* The optimizer's task hook (called on the submitting thread for every task, before its
 * submission, with the phase and subgroup its submitter names): the callbacks that
 * record the task. */
static void record_task(void *arg, struct starpu_task *task, enum _dos_task_phase phase, uint32_t subgroup)
{
	struct dos_opt *opt = arg;
	struct task_record *r = malloc(sizeof *r);
	STARPU_ASSERT_MSG(r, "out of memory recording an optimizer task");
	*r = (struct task_record){.opt = opt,
				  .account = opt->submitting,
				  .phase = public_phase(phase),
				  .subgroup = subgroup,
				  .start_us = NAN};
	STARPU_ASSERT(r->phase != DOS_PHASE_UPDATE || subgroup < opt->nsubgroups);
	r->pop_callback = task->prologue_callback_pop_func;
	r->pop_arg = task->prologue_callback_pop_arg;
	r->end_callback = task->epilogue_callback_func;
	r->end_arg = task->epilogue_callback_arg;
	task->prologue_callback_pop_func = task_taken;
	task->prologue_callback_pop_arg = r;
	task->epilogue_callback_func = task_ended;
	task->epilogue_callback_arg = r;
	STARPU_PTHREAD_MUTEX_LOCK(&opt->lock);
	opt->in_flight++;
	if (r->account)
		r->account->pending++;
	STARPU_PTHREAD_MUTEX_UNLOCK(&opt->lock);
}

static void wait_idle(struct dos_opt *opt)
{
	STARPU_PTHREAD_MUTEX_LOCK(&opt->lock);
	while (opt->in_flight)
		STARPU_PTHREAD_COND_WAIT(&opt->progress, &opt->lock);
	STARPU_PTHREAD_MUTEX_UNLOCK(&opt->lock);
}

/* ---- creation ------------------------------------------------------------------------- */

/* The checks that need no StarPU: sizes, one source per array, locations. */
static int check_tensors(uint32_t ntensors, const struct dos_opt_tensor *tensors, int *uses_handles)
{
	*uses_handles = 0;
	for (uint32_t t = 0; t < ntensors; t++) {
		const struct dos_opt_tensor *x = &tensors[t];
		if (x->numel == 0 || x->numel > UINT32_MAX)
			return DOS_FAIL(-EINVAL,
					"tensors[%u].numel = %llu must be in [1, %u] (a StarPU vector's count)", t,
					(unsigned long long)x->numel, UINT32_MAX);
		if (!x->weight == !x->weight_ptr)
			return DOS_FAIL(-EINVAL, "tensors[%u]: give exactly one of weight (%p) and weight_ptr (%p)", t,
					(void *)x->weight, x->weight_ptr);
		if (!x->grad == !x->grad_ptr)
			return DOS_FAIL(-EINVAL, "tensors[%u]: give exactly one of grad (%p) and grad_ptr (%p)", t,
					(void *)x->grad, x->grad_ptr);
		if (x->weight_ptr && x->weight_ptr == x->grad_ptr)
			return DOS_FAIL(-EINVAL, "tensors[%u]: weight_ptr and grad_ptr are the same buffer %p", t,
					x->weight_ptr);
		if ((x->weight_ptr || x->grad_ptr) && x->location != DOS_MEMORY_HOST && x->location != DOS_MEMORY_CUDA)
			return DOS_FAIL(-EINVAL, "tensors[%u].location = %d is not DOS_MEMORY_HOST or DOS_MEMORY_CUDA",
					t, (int)x->location);
		if ((x->weight_ptr || x->grad_ptr) && x->location == DOS_MEMORY_CUDA && x->cuda_device < 0)
			return DOS_FAIL(-EINVAL, "tensors[%u].cuda_device = %d is not a CUDA device number", t,
					x->cuda_device);
		*uses_handles |= x->weight || x->grad;
	}
	return 0;
}

static int by_address(const void *a, const void *b)
{
	uintptr_t x = (uintptr_t) * (const starpu_data_handle_t *)a, y = (uintptr_t) * (const starpu_data_handle_t *)b;
	return (x > y) - (x < y);
}

/* The application's handles: contiguous data of numel elements of tensor_dtype (any of
 * the interfaces _dos_check_contiguous accepts), none twice (a
 * gradient that is also a weight, or shared by two tensors, would be overwritten). */
static int check_handles(uint32_t ntensors, const struct dos_opt_tensor *tensors, enum dos_dtype dtype)
{
	size_t n = 0;
	starpu_data_handle_t *all = malloc(2 * (size_t)ntensors * sizeof *all);
	if (!all)
		return DOS_FAIL(-ENOMEM, "no memory to check %u tensors", ntensors);
	for (uint32_t t = 0; t < ntensors; t++)
		for (int g = 0; g < 2; g++) {
			starpu_data_handle_t h = g ? tensors[t].grad : tensors[t].weight;
			if (!h)
				continue;
			char name[48];
			snprintf(name, sizeof name, "tensors[%u].%s", t, g ? "grad" : "weight");
			uint32_t nx;
			int err = _dos_check_contiguous("dos_opt_create", name, h, dos_dtype_size(dtype), &nx);
			if (!err && nx != tensors[t].numel)
				err = _dos_fail(-EINVAL, "dos_opt_create", "%s has %u elements but numel = %llu", name,
						nx, (unsigned long long)tensors[t].numel);
			if (err) {
				free(all);
				return err;
			}
			all[n++] = h;
		}
	qsort(all, n, sizeof *all, by_address);
	for (size_t i = 1; i < n; i++)
		if (all[i] == all[i - 1]) {
			void *h = (void *)all[i];
			free(all);
			return DOS_FAIL(-EINVAL, "handle %p is given twice (each weight and gradient needs its own)",
					h);
		}
	free(all);
	return 0;
}

static const char *buffer_name(const struct tensor_buffer *b, char *name, size_t size)
{
	snprintf(name, size, "tensors[%u].%s", b->tensor, b->is_grad ? "grad" : "weight");
	return name;
}

static int by_start(const void *a, const void *b)
{
	const struct tensor_buffer *x = a, *y = b;
	if (x->space != y->space)
		return x->space < y->space ? -1 : 1;
	return (x->start > y->start) - (x->start < y->start);
}

/* The buffers of the tensors (handles: their home copy, when they have one), refused when
 * two overlap: the optimizer would write a weight or read a gradient that another tensor
 * also is. On success *out (sorted) and *count are the optimizer's. */
static int collect_buffers(uint32_t ntensors, const struct dos_opt_tensor *tensors, size_t elemsize,
			   struct tensor_buffer **out, size_t *count)
{
	struct tensor_buffer *b = malloc(2 * (size_t)ntensors * sizeof *b);
	if (!b)
		return DOS_FAIL(-ENOMEM, "no memory to check %u tensors", ntensors);
	size_t n = 0;
	for (uint32_t t = 0; t < ntensors; t++)
		for (int g = 0; g < 2; g++) {
			const struct dos_opt_tensor *x = &tensors[t];
			starpu_data_handle_t h = g ? x->grad : x->weight;
			void *ptr = g ? x->grad_ptr : x->weight_ptr;
			struct tensor_buffer e = {.bytes = x->numel * elemsize, .tensor = t, .is_grad = g};
			if (ptr) {
				e.space = x->location == DOS_MEMORY_CUDA ? 1 + x->cuda_device : 0;
				e.start = (uintptr_t)ptr;
			} else {
				int home = starpu_data_get_home_node(h);
				if (home < 0 || !(ptr = starpu_data_handle_to_pointer(h, (unsigned)home)))
					continue; /* StarPU allocates it: no buffer of the application's */
				e.space = starpu_node_get_kind((unsigned)home) == STARPU_CUDA_RAM
						  ? 1 + starpu_memory_node_get_devid((unsigned)home)
						  : 0;
				e.start = (uintptr_t)ptr;
			}
			b[n++] = e;
		}
	qsort(b, n, sizeof *b, by_start);
	for (size_t i = 1; i < n; i++)
		if (b[i].space == b[i - 1].space && b[i].start < b[i - 1].start + b[i - 1].bytes) {
			char first[48], second[48];
			int err = DOS_FAIL(-EINVAL,
					   "%s (%zu bytes at %p) and %s (%zu bytes at %p) overlap: each weight and "
					   "gradient needs memory of its own",
					   buffer_name(&b[i - 1], first, sizeof first), b[i - 1].bytes,
					   (void *)b[i - 1].start, buffer_name(&b[i], second, sizeof second),
					   b[i].bytes, (void *)b[i].start);
			free(b);
			return err;
		}
	*out = b;
	*count = n;
	return 0;
}

/* Refuses tensors that a live optimizer already has (the same handle, or overlapping
 * memory), then counts `opt` among the live ones. */
static int join_live(struct dos_opt *opt, uint32_t ntensors, const struct dos_opt_tensor *tensors)
{
	pthread_mutex_lock(&live_lock);
	for (struct dos_opt *o = live_opts; o; o = o->next_live) {
		for (uint32_t t = 0; t < ntensors; t++)
			for (uint32_t u = 0; u < o->ntensors; u++)
				for (int g = 0; g < 2; g++) {
					starpu_data_handle_t h = g ? tensors[t].grad : tensors[t].weight;
					if (h && (h == o->weight[u] || h == o->grad[u])) {
						pthread_mutex_unlock(&live_lock);
						return DOS_FAIL(
							-EBUSY,
							"tensors[%u].%s: handle %p is tensors[%u].%s of another "
							"live optimizer (%p): destroy that one first",
							t, g ? "grad" : "weight", (void *)h, u,
							h == o->grad[u] ? "grad" : "weight", (void *)o);
					}
				}
		for (size_t i = 0; i < opt->nbuffers; i++)
			for (size_t k = 0; k < o->nbuffers; k++) {
				const struct tensor_buffer *a = &opt->buffers[i], *b = &o->buffers[k];
				if (a->space == b->space && a->start < b->start + b->bytes &&
				    b->start < a->start + a->bytes) {
					char mine[48], theirs[48];
					pthread_mutex_unlock(&live_lock);
					return DOS_FAIL(-EBUSY,
							"%s (%zu bytes at %p) overlaps %s (%zu bytes at %p) of another "
							"live optimizer (%p): destroy that one first",
							buffer_name(a, mine, sizeof mine), a->bytes, (void *)a->start,
							buffer_name(b, theirs, sizeof theirs), b->bytes,
							(void *)b->start, (void *)o);
				}
			}
	}
	opt->next_live = live_opts;
	live_opts = opt;
	opt->live = 1;
	pthread_mutex_unlock(&live_lock);
	return 0;
}

static void leave_live(struct dos_opt *opt)
{
	pthread_mutex_lock(&live_lock);
	for (struct dos_opt **o = &live_opts; *o; o = &(*o)->next_live)
		if (*o == opt) {
			*o = opt->next_live;
			break;
		}
	opt->live = 0;
	pthread_mutex_unlock(&live_lock);
}

/* An optimizer the application hands back must be one dos_opt_create returned and
 * dos_opt_destroy has not freed: a stale one (destroyed twice, used after its destroy)
 * would crash in its freed locks. An address reused by a newer optimizer passes, as it
 * names a live one. Calls that reach StarPU (`needs_starpu`) also need it running: after
 * the application's starpu_shutdown, StarPU asserts on the optimizer's tasks and data. */
static int check_live(const struct dos_opt *opt, const char *function, int needs_starpu)
{
	pthread_mutex_lock(&live_lock);
	const struct dos_opt *o = live_opts;
	while (o && o != opt)
		o = o->next_live;
	pthread_mutex_unlock(&live_lock);
	if (!o)
		return _dos_fail(-EINVAL, function,
				 "opt = %p is not a live optimizer: dos_opt_destroy freed it already, or "
				 "dos_opt_create did not return it",
				 (const void *)opt);
	if (needs_starpu && !starpu_is_initialized())
		return _dos_fail(-EINVAL, function,
				 "StarPU is not running: starpu_shutdown was called while optimizer %p was alive "
				 "(its tasks and data live in StarPU: call dos_opt_destroy before "
				 "starpu_shutdown)",
				 (const void *)opt);
	return 0;
}

/* The memory node of CUDA device `device`, or -1 when no CUDA worker uses it. */
static int cuda_node(int device)
{
	for (unsigned w = 0; w < starpu_worker_get_count(); w++)
		if (starpu_worker_get_type((int)w) == STARPU_CUDA_WORKER && starpu_worker_get_devid((int)w) == device)
			return (int)starpu_worker_get_memory_node(w);
	return -1;
}

/* Registers the buffers of tensor t (after the handles were checked). */
static int register_buffers(struct dos_opt *opt, const struct dos_opt_tensor *x, uint32_t t, size_t elemsize)
{
	int node = STARPU_MAIN_RAM;
	if ((x->weight_ptr || x->grad_ptr) && x->location == DOS_MEMORY_CUDA && (node = cuda_node(x->cuda_device)) < 0)
		return DOS_FAIL(
			-EINVAL,
			"tensors[%u].cuda_device = %d: no StarPU CUDA worker uses that device (%u CUDA workers)", t,
			x->cuda_device, starpu_cuda_worker_get_count());
	if (x->weight_ptr) {
		starpu_vector_data_register(&opt->weight[t], node, (uintptr_t)x->weight_ptr, (uint32_t)x->numel,
					    elemsize);
		opt->weight_node[t] = node;
	}
	if (x->grad_ptr) {
		starpu_vector_data_register(&opt->grad[t], node, (uintptr_t)x->grad_ptr, (uint32_t)x->numel, elemsize);
		opt->grad_node[t] = node;
	}
	return 0;
}

/* The master weights' starting values: the tensors' weights, widened to fp32. */
static void read_initial_weights(const struct dos_opt *opt, enum dos_dtype dtype, float *flat)
{
	uint64_t at = 0;
	for (uint32_t t = 0; t < opt->ntensors; t++) {
		starpu_data_acquire(opt->weight[t], STARPU_R);
		const void *w = starpu_data_get_local_ptr(opt->weight[t]);
		for (uint64_t i = 0; i < opt->numel[t]; i++)
			flat[at + i] = dos_load_elem(w, i, dtype);
		starpu_data_release(opt->weight[t]);
		at += opt->numel[t];
	}
}

/* Undoes whatever create did so far (each step checks what exists). */
static void teardown(struct dos_opt *opt, int inner_made, int lock_made)
{
	if (opt->live)
		leave_live(opt);
	_dos_checkpoint_folder_release(&opt->folder);
	free(opt->buffers);
	if (inner_made)
		_dos_optimizer_destroy(opt->inner);
	for (uint32_t t = 0; t < opt->ntensors; t++) {
		if (opt->weight_node && opt->weight_node[t] >= 0)
			starpu_data_unregister(opt->weight[t]);
		if (opt->grad_node && opt->grad_node[t] >= 0)
			starpu_data_unregister(opt->grad[t]);
	}
	if (opt->own_ctx)
		starpu_sched_ctx_delete(opt->sched_ctx);
	if (lock_made) {
		STARPU_PTHREAD_MUTEX_DESTROY(&opt->lock);
		STARPU_PTHREAD_COND_DESTROY(&opt->progress);
	}
	if (opt->owns_starpu) {
		pthread_mutex_lock(&owned_starpu_lock);
		if (--owned_starpu_users == 0)
			starpu_shutdown();
		pthread_mutex_unlock(&owned_starpu_lock);
	}
	free(opt->numel);
	free(opt->weight);
	free(opt->grad);
	free(opt->weight_node);
	free(opt->grad_node);
	free(opt->placement);
	free(opt);
}

/* Joins StarPU: starts it with `policy` when nobody has, else makes a context of our own
 * beside the application's (whose context and policy stay as they are). */
static int join_starpu(struct dos_opt *opt, const struct dos_opt_config *cfg, struct starpu_sched_policy *policy,
		       uint32_t ntensors, const struct dos_opt_tensor *tensors, int uses_handles)
{
	int err = 0;
	pthread_mutex_lock(&owned_starpu_lock);
	if (!starpu_is_initialized()) {
		if (cfg->use_app_sched_ctx) {
			pthread_mutex_unlock(&owned_starpu_lock);
			return DOS_FAIL(-EINVAL,
					"use_app_sched_ctx = 1 (app_sched_ctx = %u) but StarPU is not "
					"initialised: the application's context needs the application's StarPU",
					cfg->app_sched_ctx);
		}
		if (uses_handles) {
			pthread_mutex_unlock(&owned_starpu_lock);
			return DOS_FAIL(-EINVAL, "tensors hold StarPU handles but StarPU is not initialised (handles "
						 "exist only between starpu_init and starpu_shutdown)");
		}
		struct starpu_conf conf;
		if (cfg->starpu_conf)
			conf = *cfg->starpu_conf;
		else
			starpu_conf_init(&conf);
		conf.sched_policy = policy;
		conf.sched_policy_name = NULL;
		if ((err = starpu_init(&conf))) {
			pthread_mutex_unlock(&owned_starpu_lock);
			return DOS_STARPU_INIT_FAILED(err, "starpu_init");
		}
		owned_starpu_users = 1;
		opt->owns_starpu = 1;
		opt->sched_ctx = 0;
		pthread_mutex_unlock(&owned_starpu_lock);
		return 0;
	}
	if (owned_starpu_users > 0) { /* ours: this optimizer keeps it up too */
		owned_starpu_users++;
		opt->owns_starpu = 1;
	}
	pthread_mutex_unlock(&owned_starpu_lock);
	if ((err = check_handles(ntensors, tensors, cfg->tensor_dtype)))
		return err;
	if (cfg->use_app_sched_ctx) { /* the application's, run by one of our policies */
		if (!_dos_sched_ctx_is_ours(cfg->app_sched_ctx)) {
			if ((err = _dos_check_sched_ctx("dos_opt_create", "app_sched_ctx", cfg->app_sched_ctx)))
				return err;
			struct starpu_sched_policy *pol = starpu_sched_ctx_get_sched_policy(cfg->app_sched_ctx);
			return DOS_FAIL(-EINVAL,
					"app_sched_ctx = %u is run by %s, not by a starpu-dos policy (create it with "
					"dos_sched_policy(\"dos\"))",
					cfg->app_sched_ctx, pol && pol->policy_name ? pol->policy_name : "no policy");
		}
		opt->sched_ctx = cfg->app_sched_ctx;
		return 0;
	}
	int nworkers = -1; /* every worker */
	if (cfg->ctx_workers) {
		if (cfg->ctx_nworkers == 0)
			return DOS_FAIL(-EINVAL, "ctx_nworkers = 0: the optimizer's context needs a worker");
		for (unsigned i = 0; i < cfg->ctx_nworkers; i++)
			if (cfg->ctx_workers[i] < 0 || (unsigned)cfg->ctx_workers[i] >= starpu_worker_get_count())
				return DOS_FAIL(-EINVAL, "ctx_workers[%u] = %d is not a StarPU worker (there are %u)",
						i, cfg->ctx_workers[i], starpu_worker_get_count());
		/* StarPU asserts on a context given one worker twice */
		for (unsigned i = 0; i < cfg->ctx_nworkers; i++)
			for (unsigned j = 0; j < i; j++)
				if (cfg->ctx_workers[i] == cfg->ctx_workers[j])
					return DOS_FAIL(-EINVAL, "ctx_workers[%u] = %d is ctx_workers[%u] too", i,
							cfg->ctx_workers[i], j);
		nworkers = (int)cfg->ctx_nworkers;
	}
	opt->sched_ctx = starpu_sched_ctx_create((int *)cfg->ctx_workers, nworkers, "starpu-dos",
						 STARPU_SCHED_CTX_POLICY_STRUCT, policy, 0);
	opt->own_ctx = 1;
	return 0;
}

int dos_opt_create(dos_opt_t *out, const struct dos_opt_config *cfg, uint32_t ntensors,
		   const struct dos_opt_tensor *tensors)
{
	int err, uses_handles;
	if (!out)
		return DOS_FAIL(-EINVAL, "out is NULL");
	*out = NULL;
	if (!cfg)
		return DOS_FAIL(-EINVAL, "cfg is NULL");
	if (!tensors || ntensors == 0)
		return DOS_FAIL(-EINVAL, "tensors = %p, ntensors = %u: need at least one tensor", (const void *)tensors,
				ntensors);
	const char *policy_name = cfg->policy ? cfg->policy : "dos";
	struct starpu_sched_policy *policy = dos_sched_policy(policy_name);
	if (!policy)
		return DOS_FAIL(-EINVAL, "policy = '%s' is not one of dos, all-cpu, stride, resident", policy_name);
	if (!(cfg->app_gpu_bytes >= 0) || !isfinite(cfg->app_gpu_bytes))
		return DOS_FAIL(-EINVAL, "app_gpu_bytes = %g must be finite and >= 0", cfg->app_gpu_bytes);
	if ((err = check_tensors(ntensors, tensors, &uses_handles)))
		return err;
	uint64_t nparams = 0;
	for (uint32_t t = 0; t < ntensors; t++)
		nparams += tensors[t].numel;
	struct _dos_optimizer_config oc = {
		.subgroup_size = cfg->subgroup_size < nparams ? cfg->subgroup_size : nparams,
		.subgroups_follow_tensors = cfg->subgroups_follow_tensors,
		.weight_dtype = cfg->weight_dtype,
		.grad_dtype = cfg->grad_dtype,
		.tensor_dtype = cfg->tensor_dtype,
		.tensor_grad_dtype = cfg->tensor_dtype, /* an application's tensors: one dtype each */
		.hp = cfg->hp,
		.lr_schedule = cfg->lr_schedule,
		.clip_norm = cfg->clip_norm,
		.dynamic_loss_scale = cfg->dynamic_loss_scale,
		.loss_scale_init = cfg->loss_scale_init,
		.loss_scale_window = cfg->loss_scale_window,
	};
	if ((err = _dos_optimizer_config_check(&oc, nparams)))
		return err;

	struct dos_opt *opt = calloc(1, sizeof *opt);
	if (!opt)
		return DOS_FAIL(-ENOMEM, "no memory for an optimizer");
	opt->folder = (struct _dos_checkpoint_folder)DOS_CHECKPOINT_FOLDER_INIT;
	opt->ntensors = ntensors;
	opt->numel = malloc(ntensors * sizeof *opt->numel);
	opt->weight = calloc(ntensors, sizeof *opt->weight);
	opt->grad = calloc(ntensors, sizeof *opt->grad);
	opt->weight_node = malloc(ntensors * sizeof *opt->weight_node);
	opt->grad_node = malloc(ntensors * sizeof *opt->grad_node);
	if (!opt->numel || !opt->weight || !opt->grad || !opt->weight_node || !opt->grad_node) {
		teardown(opt, 0, 0);
		return DOS_FAIL(-ENOMEM, "no memory for %u tensors", ntensors);
	}
	for (uint32_t t = 0; t < ntensors; t++) {
		opt->numel[t] = tensors[t].numel;
		opt->weight[t] = tensors[t].weight;
		opt->grad[t] = tensors[t].grad;
		opt->weight_node[t] = opt->grad_node[t] = -1;
	}
	if ((err = _dos_run_id_new(&opt->run))) {
		teardown(opt, 0, 0);
		return err;
	}
	if ((err = join_starpu(opt, cfg, policy, ntensors, tensors, uses_handles)) ||
	    (err = collect_buffers(ntensors, tensors, dos_dtype_size(cfg->tensor_dtype), &opt->buffers,
				   &opt->nbuffers)) ||
	    (err = join_live(opt, ntensors, tensors))) {
		teardown(opt, 0, 0);
		return err;
	}
	for (uint32_t t = 0; t < ntensors; t++)
		if ((err = register_buffers(opt, &tensors[t], t, dos_dtype_size(cfg->tensor_dtype)))) {
			teardown(opt, 0, 0);
			return err;
		}
	STARPU_PTHREAD_MUTEX_INIT(&opt->lock, NULL);
	STARPU_PTHREAD_COND_INIT(&opt->progress, NULL);

	float *initial = malloc(nparams * sizeof(float));
	if (!initial) {
		teardown(opt, 0, 1);
		return DOS_FAIL(-ENOMEM, "no memory for the initial weights of %llu parameters",
				(unsigned long long)nparams);
	}
	read_initial_weights(opt, cfg->tensor_dtype, initial);
	oc.sched_ctx = opt->sched_ctx;
	oc.hook = record_task;
	oc.hook_arg = opt;
	err = _dos_optimizer_create(&opt->inner, &oc, ntensors, opt->numel, opt->weight, opt->grad, initial);
	free(initial);
	if (err) {
		teardown(opt, 0, 1);
		return err;
	}
	struct _dos_optimizer_info info;
	_dos_optimizer_get_info(opt->inner, &info);
	opt->nsubgroups = info.nsubgroups;
	opt->placement = calloc(opt->nsubgroups, sizeof *opt->placement);
	if (!opt->placement) {
		teardown(opt, 1, 1);
		return DOS_FAIL(-ENOMEM, "no memory for %u subgroups", opt->nsubgroups);
	}
	/* what the application keeps on the GPU, so that the dos plan leaves it room (the
	 * optimizer's gradient and 16-bit weight copies live from their producer to their
	 * consumer only, and the policy measures that span) */
	struct dos_sched_stats probe;
	if (starpu_cuda_worker_get_count() > 0 && dos_sched_get_stats(opt->sched_ctx, &probe) == 0)
		dos_sched_reserve_gpu_bytes(opt->sched_ctx, cfg->app_gpu_bytes);
	*out = opt;
	return 0;
}

/* ---- steps ---------------------------------------------------------------------------- */

int dos_opt_submit_step(dos_opt_t opt, struct dos_opt_step_report *report)
{
	int err;
	if (!opt)
		return DOS_FAIL(-EINVAL, "opt is NULL");
	if ((err = check_live(opt, __func__, 1)))
		return err;
	/* gradients in buffers were written by the application behind StarPU's back: their
	 * home copy is now the only valid one (a GPU copy from the last gather is stale) */
	for (uint32_t t = 0; t < opt->ntensors; t++)
		if (opt->grad_node[t] >= 0) {
			starpu_data_acquire_on_node(opt->grad[t], opt->grad_node[t], STARPU_W);
			starpu_data_release_on_node(opt->grad[t], opt->grad_node[t]);
		}
	struct step_account *a = calloc(1, sizeof *a);
	if (!a)
		return DOS_FAIL(-ENOMEM, "no memory for a step's records");
	a->step = opt->steps_submitted + 1;
	a->times.step = a->step;
	a->pending = 1; /* until the whole step is submitted */
	/* the dos policy collects DOS_STEPS_IN_FLIGHT unplanned steps at most: an application
	 * that submits further ahead waits here */
	STARPU_PTHREAD_MUTEX_LOCK(&opt->lock);
	while (opt->steps_in_flight >= DOS_STEPS_IN_FLIGHT)
		STARPU_PTHREAD_COND_WAIT(&opt->progress, &opt->lock);
	opt->steps_in_flight++;
	STARPU_PTHREAD_MUTEX_UNLOCK(&opt->lock);
	opt->submitting = a;
	struct _dos_step_report r;
	err = _dos_optimizer_submit_step(opt->inner, &r);
	opt->submitting = NULL;
	STARPU_PTHREAD_MUTEX_LOCK(&opt->lock);
	publish_if_done(opt, a);
	STARPU_PTHREAD_MUTEX_UNLOCK(&opt->lock);
	if (err)
		return err;
	opt->steps_submitted++;
	if (report)
		*report = (struct dos_opt_step_report){.applied = r.applied,
						       .grad_norm = r.grad_norm,
						       .loss_scale_used = r.loss_scale_used,
						       .overflow_subgroup = r.overflow_subgroup,
						       .lr = r.lr};
	return 0;
}

int dos_opt_set_lr(dos_opt_t opt, double lr)
{
	int err;
	if (!opt)
		return DOS_FAIL(-EINVAL, "opt is NULL");
	if ((err = check_live(opt, __func__, 0)))
		return err;
	return _dos_optimizer_set_lr(opt->inner, lr);
}

int dos_opt_wait(dos_opt_t opt)
{
	int err;
	if (!opt)
		return DOS_FAIL(-EINVAL, "opt is NULL");
	if ((err = check_live(opt, __func__, 1)))
		return err;
	wait_idle(opt);
	/* the refresh may have written them on a GPU */
	for (uint32_t t = 0; t < opt->ntensors; t++)
		if (opt->weight_node[t] >= 0) {
			starpu_data_acquire_on_node(opt->weight[t], opt->weight_node[t], STARPU_R);
			starpu_data_release_on_node(opt->weight[t], opt->weight_node[t]);
		}
	return 0;
}

/* ---- queries -------------------------------------------------------------------------- */

int dos_opt_get_info(dos_opt_t opt, struct dos_opt_info *out)
{
	int err;
	if (!opt || !out)
		return DOS_FAIL(-EINVAL, "NULL argument (opt %p, out %p)", (void *)opt, (void *)out);
	if ((err = check_live(opt, __func__, 0)))
		return err;
	struct _dos_optimizer_info in;
	_dos_optimizer_get_info(opt->inner, &in);
	*out = (struct dos_opt_info){.nparams = in.nparams,
				     .subgroup_size = in.subgroup_size,
				     .ntensors = in.ntensors,
				     .nsubgroups = in.nsubgroups,
				     .steps_submitted = opt->steps_submitted,
				     .updates_applied = in.updates,
				     .skipped_steps = in.skipped_steps,
				     .loss_scale = in.loss_scale,
				     .sched_ctx = opt->sched_ctx,
				     .owns_starpu = opt->owns_starpu};
	return 0;
}

int dos_opt_get_placements(dos_opt_t opt, enum dos_device *where, uint32_t count)
{
	int err;
	if (!opt || !where)
		return DOS_FAIL(-EINVAL, "NULL argument (opt %p, where %p)", (void *)opt, (void *)where);
	if ((err = check_live(opt, __func__, 0)))
		return err;
	if (count != opt->nsubgroups)
		return DOS_FAIL(-EINVAL, "count = %u but the optimizer has %u subgroups", count, opt->nsubgroups);
	STARPU_PTHREAD_MUTEX_LOCK(&opt->lock);
	memcpy(where, opt->placement, count * sizeof *where);
	STARPU_PTHREAD_MUTEX_UNLOCK(&opt->lock);
	return 0;
}

int dos_opt_get_step_times(dos_opt_t opt, struct dos_opt_step_times *out)
{
	int err;
	if (!opt || !out)
		return DOS_FAIL(-EINVAL, "NULL argument (opt %p, out %p)", (void *)opt, (void *)out);
	if ((err = check_live(opt, __func__, 0)))
		return err;
	STARPU_PTHREAD_MUTEX_LOCK(&opt->lock);
	*out = opt->last_times;
	STARPU_PTHREAD_MUTEX_UNLOCK(&opt->lock);
	return 0;
}

int dos_opt_read_state(dos_opt_t opt, float *master, float *m, float *v, uint64_t count)
{
	int err;
	if (!opt)
		return DOS_FAIL(-EINVAL, "opt is NULL");
	if ((err = check_live(opt, __func__, 1)))
		return err;
	if (!master && !m && !v)
		return DOS_FAIL(-EINVAL, "master, m and v are all NULL: nothing to read");
	struct _dos_optimizer_info info;
	_dos_optimizer_get_info(opt->inner, &info);
	if (count != info.nparams)
		return DOS_FAIL(-EINVAL, "count = %llu but the optimizer has %llu parameters",
				(unsigned long long)count, (unsigned long long)info.nparams);
	_dos_optimizer_read_state(opt->inner, master, m, v);
	return 0;
}

int dos_opt_write_state(dos_opt_t opt, const float *master, const float *m, const float *v, uint64_t count,
			uint64_t updates)
{
	int err;
	if (!opt)
		return DOS_FAIL(-EINVAL, "opt is NULL");
	if ((err = check_live(opt, __func__, 1)))
		return err;
	if (!master && !m && !v)
		return DOS_FAIL(-EINVAL, "master, m and v are all NULL: nothing to write");
	struct _dos_optimizer_info info;
	_dos_optimizer_get_info(opt->inner, &info);
	if (count != info.nparams)
		return DOS_FAIL(-EINVAL, "count = %llu but the optimizer has %llu parameters",
				(unsigned long long)count, (unsigned long long)info.nparams);
	/* the last refreshes still read the state: they must see the old one */
	wait_idle(opt);
	err = _dos_optimizer_write_state(opt->inner, master, m, v, updates);
	if (!err)
		opt->steps_submitted = updates;
	return err;
}

/* ---- checkpoints ---------------------------------------------------------------------- */

/* What an optimizer told to save into a folder of another run can do. */
#define FOLDER_ADVICE                                                                                             \
	"to continue that run, load its latest checkpoint first (dos_opt_latest_checkpoint, dos_opt_load); else " \
	"save into another folder"

/* Whether a and b name the same folder (however they are spelled). */
static int same_folder(const char *a, const char *b)
{
	struct stat x, y;
	return stat(a, &x) == 0 && stat(b, &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

static void warn_set_aside(void *arg, const char *path, const char *why)
{
	(void)arg;
	_dos_warn("dos_opt_save: set aside %s, a newer checkpoint of the run loaded that does not verify: %s", path,
		  why);
}

/* The folder `dir` taken for opt's saves (graph/checkpoint.h): created when missing, locked
 * for this optimizer until it is destroyed or saves elsewhere, and holding no checkpoint
 * of another run (nor, before the optimizer has loaded one, any it cannot read). */
static int take_folder(struct dos_opt *opt, const char *dir)
{
	int err;
	if (opt->folder.dir && same_folder(opt->folder.dir, dir))
		return _dos_checkpoint_folder_check(&opt->folder);
	_dos_checkpoint_folder_release(&opt->folder);
	if ((err = _dos_checkpoint_folder_take(&opt->folder, dir, 1)))
		return err;
	if ((err = _dos_checkpoint_folder_claim(&opt->folder, &opt->run, !opt->loaded, FOLDER_ADVICE)))
		_dos_checkpoint_folder_release(&opt->folder);
	return err;
}

int dos_opt_save(dos_opt_t opt, const char *dir, unsigned keep, char *path_out, size_t path_size)
{
	int err;
	if (!opt || !dir)
		return DOS_FAIL(-EINVAL, "NULL argument (opt %p, dir %p)", (void *)opt, (const void *)dir);
	if ((err = check_live(opt, __func__, 1)))
		return err;
	if (keep == 0)
		return DOS_FAIL(-EINVAL, "keep = 0: keep at least the checkpoint being written");
	if ((err = take_folder(opt, dir)))
		return err;
	if (opt->set_aside_pending &&
	    !(err = _dos_checkpoint_folder_set_aside_damaged(&opt->folder, opt->loaded_steps, warn_set_aside, NULL)))
		opt->set_aside_pending = 0;
	if (err)
		return err;
	/* no data loader here: the position is the steps submitted; the state may have been
	 * loaded or be older than the updates' flags, so its values are checked */
	struct _dos_run_position at = {.steps_done = opt->steps_submitted, .run = opt->run};
	return _dos_optimizer_save(opt->inner, opt->folder.dir, keep, &at, DOS_SAVE_CHECK_VALUES, path_out,
				   path_out ? path_size : 0);
}

int dos_opt_load(dos_opt_t opt, const char *path)
{
	int err;
	if (!opt || !path)
		return DOS_FAIL(-EINVAL, "NULL argument (opt %p, path %p)", (void *)opt, (const void *)path);
	if ((err = check_live(opt, __func__, 1)))
		return err;
	/* the last refreshes still read the state: they must see the old one */
	wait_idle(opt);
	struct _dos_run_position at;
	if ((err = _dos_optimizer_load(opt->inner, path, &at)))
		return err;
	opt->steps_submitted = at.steps_done;
	/* the optimizer continues the run that saved it: the folder is claimed again for that
	 * run at the next save */
	if (!_dos_run_id_equal(&opt->run, &at.run))
		_dos_checkpoint_folder_release(&opt->folder);
	opt->run = at.run;
	opt->loaded = 1;
	opt->loaded_steps = at.steps_done;
	opt->set_aside_pending = 1;
	_dos_optimizer_rebuild_weights(opt->inner);
	return 0;
}

static void warn_skipped(void *arg, const char *path, const char *why)
{
	(void)arg;
	_dos_warn("dos_opt_latest_checkpoint: skipping %s, which does not verify: %s", path, why);
}

int dos_opt_latest_checkpoint(const char *dir, char *path, size_t path_size)
{
	const struct _dos_checkpoint_search search = {.skipped = warn_skipped};
	return _dos_checkpoint_newest_valid(dir, &search, path, path_size);
}

void dos_opt_destroy(dos_opt_t opt)
{
	if (!opt || check_live(opt, __func__, 1))
		return; /* freeing a stale optimizer, or one StarPU no longer knows, would crash */
	/* the records' callbacks use opt: all must have run */
	wait_idle(opt);
	teardown(opt, 1, 1);
}
