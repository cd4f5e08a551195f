/* starpu-dos: Deep Optimizer States on StarPU. The one installed header.
 *
 * Conventions: functions that can fail return 0 on success or a negative errno-style code
 * (-EINVAL bad argument, -ENOTSUP not supported here, -ENOMEM); the message of the last
 * failure in the calling thread, naming the argument and its value, is returned by
 * dos_last_error() and also printed on stderr. A failing call changes nothing. */
#ifndef DOS_H
#define DOS_H

#include <stddef.h>
#include <stdint.h>

#include <starpu.h>

#include <dos_version.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Version and errors ------------------------------------------------------------ */

/* Version of the library actually loaded (the macros in dos_version.h give the one a
 * program was compiled against), e.g. "0.1.0". Never fails. */
const char *dos_version_string(void);
/* DOS_VERSION_NUMBER of the loaded library. Never fails. */
unsigned dos_version_number(void);

/* Message of the last failed call in this thread, or "" when none failed. Never fails. */
const char *dos_last_error(void);

/* ---- Element types ----------------------------------------------------------------- */

enum dos_dtype {
	DOS_FP32 = 0,
	DOS_FP16 = 1, /* IEEE binary16 */
	DOS_BF16 = 2, /* bfloat16 */
};

/* Bytes per element, or 0 for a value outside enum dos_dtype. */
size_t dos_dtype_size(enum dos_dtype dtype);
/* "fp32", "fp16", "bf16", or "invalid". */
const char *dos_dtype_name(enum dos_dtype dtype);

/* ---- Adam step scalars -------------------------------------------------------------- */

enum dos_adam_mode {
	DOS_ADAM_L2 = 0, /* torch.optim.Adam: weight decay added to the gradient */
	DOS_ADAMW = 1,   /* torch.optim.AdamW: decoupled weight decay */
};

struct dos_adam_hparams {
	enum dos_adam_mode mode;
	double lr;           /* >= 0 */
	double beta1, beta2; /* each in [0, 1) */
	double eps;          /* > 0 */
	double weight_decay; /* >= 0 */
};

/* Weight decay as the update kernels apply it. */
enum dos_decay_kind {
	DOS_DECAY_NONE = 0,      /* weight_decay == 0 */
	DOS_DECAY_DECOUPLED = 1, /* AdamW: p *= decay */
	DOS_DECAY_L2 = 2,        /* Adam: g += weight_decay * p */
};

/* Everything a subgroup update needs for one step, computed once per step on the host
 * (in double, each value rounded once to float) and passed by value to every subgroup
 * task on every device, so that no device recomputes beta^t. Fill it with
 * dos_adam_step_init(); the fields are read by the kernels. */
struct dos_adam_step {
	float grad_multiplier; /* loss-scale inverse times clipping factor */
	/* m = lerp(m, g, 1 - beta1) as torch computes it: fmaf(lerp_coeff, g - m, m) with
	 * lerp_coeff = 1 - beta1 when that is < 0.5, else fmaf(lerp_coeff, g - m, g) with
	 * lerp_coeff = (1 - beta1) - 1 (lerp_from_grad = 1). */
	float lerp_coeff;
	uint32_t lerp_from_grad;
	float beta2; /* v = fmaf((1 - beta2) * g, g, v * beta2) */
	float one_minus_beta2;
	float bc2_sqrt;      /* sqrt(1 - beta2^t) */
	float eps;           /* added after dividing by bc2_sqrt, as torch does */
	float neg_step_size; /* -lr / (1 - beta1^t) */
	float decay;         /* 1 - lr * weight_decay (DOS_DECAY_DECOUPLED) */
	float weight_decay;  /* DOS_DECAY_L2 */
	uint32_t decay_kind; /* enum dos_decay_kind */
	uint64_t step;       /* 1-based step number these scalars are for */
};

/* Computes the scalars of 1-based step `step` for hyper-parameters `hp`, with the
 * gradient multiplier `grad_multiplier` (finite, > 0; 1 when there is neither loss
 * scaling nor clipping). Errors: -EINVAL for NULL pointers, step 0, lr < 0, betas outside
 * [0, 1), eps <= 0, weight_decay < 0, non-finite values, an unknown mode, and values that
 * are fine in double but not once rounded to float (a step size or decay that overflows,
 * an eps or multiplier that becomes 0). */
int dos_adam_step_init(struct dos_adam_step *out, const struct dos_adam_hparams *hp, uint64_t step,
		       double grad_multiplier);

/* A learning-rate schedule over the optimizer's updates, the warmup and cosine decay of
 * LLM training (without a warmup, Adam's first steps at the full rate can throw a model
 * off: its second moments know nothing yet). Update k (1-based: Adam's t; a step skipped
 * for overflow does not count) runs at hp.lr times
 *   k / warmup_steps                                  while k < warmup_steps,
 *   r + (1 - r) (1 + cos(pi (k - w) / (d - w))) / 2  from w = warmup_steps to d = decay_steps,
 *   r = min_ratio                                     after decay_steps;
 * decay_steps 0: 1 after the warmup. All zero (the default): hp.lr throughout. */
struct dos_lr_schedule {
	uint64_t warmup_steps;
	uint64_t decay_steps; /* 0, or > warmup_steps */
	double min_ratio;     /* in [0, 1] */
};

/* Errors: -EINVAL for a NULL schedule, decay_steps in [1, warmup_steps], min_ratio outside
 * [0, 1], naming the field and its value. */
int dos_lr_schedule_check(const struct dos_lr_schedule *schedule);
/* The factor of hp.lr for 1-based update `update` (in [0, 1]; 1 for update 0), for a
 * schedule dos_lr_schedule_check accepts. */
double dos_lr_schedule_factor(const struct dos_lr_schedule *schedule, uint64_t update);

/* ---- CPU kernel variant ------------------------------------------------------------- */

/* Every variant computes bit-for-bit the same results; they differ in speed only. */
enum dos_cpu_isa {
	DOS_CPU_ISA_AUTO = 0, /* best the CPU supports (default) */
	DOS_CPU_ISA_SCALAR = 1,
	DOS_CPU_ISA_AVX2 = 2,   /* AVX2 + FMA + F16C */
	DOS_CPU_ISA_AVX512 = 3, /* AVX-512 F + BW + VL */
};

/* Selects the CPU kernels for the whole process (tests, benchmarks). The environment
 * variable DOS_CPU_ISA=auto|scalar|avx2|avx512 does the same at the first kernel call.
 * Errors: -EINVAL for a value outside enum dos_cpu_isa, -ENOTSUP when this CPU lacks it. */
int dos_cpu_isa_select(enum dos_cpu_isa isa);
/* The variant in use (never DOS_CPU_ISA_AUTO). */
enum dos_cpu_isa dos_cpu_isa_selected(void);
/* Whether this CPU can run `isa`. */
int dos_cpu_isa_supported(enum dos_cpu_isa isa);
/* "auto", "scalar", "avx2", "avx512", or "invalid". */
const char *dos_cpu_isa_name(enum dos_cpu_isa isa);

/* ---- Subgroup codelets ---------------------------------------------------------------
 * Every task creator below checks its handles and returns an unsubmitted task in
 * *task_out, so callers
 * can set a scheduling context, priority or worker before starpu_task_submit(). Each
 * codelet has a CPU and, when built with CUDA, a CUDA implementation with identical
 * results, and a regression perfmodel named after the codelet ("dos_adam", ...).
 *
 * Data handles (here and in struct dos_opt_tensor): any StarPU handle whose elements lie
 * in one contiguous block: a vector, a variable (of a whole number of elements), or a
 * matrix, block or tensor registered without padding (leading dimensions equal to the
 * sizes), including handles StarPU allocates itself (registered with home node -1,
 * as tile-based codes do: every copy StarPU allocates is packed). Refused with -EINVAL
 * and a message naming the handle: padded (non-contiguous) layouts, other interfaces
 * (CSR, COO, multiformat, ndim...), element sizes other than the dtype's, and so fp64
 * data: elements are fp32, fp16 or bf16 (enum dos_dtype), never fp64; and a handle
 * partitioned with starpu_data_partition (its pieces are accepted). Handles of one task
 * must hold the same number of elements. */

/* One Adam/AdamW update of a subgroup: master (fp32, RW), m (fp32, RW), v (fp32, RW),
 * grad (grad_dtype, R), and weight16 (weight_dtype fp16 or bf16, W; NULL when training in
 * fp32). The step scalars are copied into the task; each field must lie where
 * dos_adam_step_init() puts it (-EINVAL naming the field otherwise). A task whose master
 * weights are the application's own fp32 tile (weight16 NULL) updates it in place: the
 * task-level route of a tile-based code (docs/nntile.md). */
int dos_adam_task_create(const struct dos_adam_step *step, starpu_data_handle_t master, starpu_data_handle_t m,
			 starpu_data_handle_t v, starpu_data_handle_t grad, enum dos_dtype grad_dtype,
			 starpu_data_handle_t weight16, enum dos_dtype weight_dtype, struct starpu_task **task_out);

/* Which outputs of an update got an inf or a NaN somewhere: the bits of the flag below. */
enum dos_nonfinite_bits {
	DOS_NONFINITE_MASTER = 1,
	DOS_NONFINITE_M = 2,
	DOS_NONFINITE_V = 4,
};

/* Makes the unsubmitted dos_adam task `task` also write, into `flag` (a variable handle
 * of one uint32_t, W), the enum dos_nonfinite_bits of the master weights, m and v it
 * wrote (0: all finite), so that a NaN appearing in the state is seen at the step where it
 * appears, without reading the state back. Costs one multiply per output vector on the
 * CPU and a compare per element on the GPU; the state itself is computed exactly as
 * without the flag. Errors: -EINVAL for NULL arguments, a task that is not an
 * unsubmitted dos_adam task or already has a flag, a flag that is not a 4-byte variable
 * handle. */
int dos_adam_task_report_nonfinite(struct starpu_task *task, starpu_data_handle_t flag);

/* weight16 (fp16 or bf16, W) = master (fp32, R) rounded to nearest even. */
int dos_cast_task_create(starpu_data_handle_t master, starpu_data_handle_t weight16, enum dos_dtype weight_dtype,
			 struct starpu_task **task_out);

/* Sum of squares of a gradient, for global-norm clipping and overflow detection. */
struct dos_grad_stats {
	double sum_sq;      /* sum of g*g, each square exact in double, in the fixed order of
			       dos_grad_stats_order below, so every device gives the same bits */
	uint32_t nonfinite; /* 1 when some element is inf or nan */
	uint32_t reserved;
};
/* Reads grad (grad_dtype, R) and writes stats, a variable handle holding one
 * struct dos_grad_stats (W). */
int dos_grad_stats_task_create(starpu_data_handle_t grad, enum dos_dtype grad_dtype, starpu_data_handle_t stats,
			       struct starpu_task **task_out);

/* grad *= factor in its own dtype (rounded to nearest even); factor == 0 writes +0 to
 * every element whatever it held (use it to clear accumulated gradients). Errors also
 * for a non-finite factor. */
int dos_grad_scale_task_create(starpu_data_handle_t grad, enum dos_dtype grad_dtype, float factor,
			       struct starpu_task **task_out);

/* ---- Scheduling policies --------------------------------------------------------------
 * "dos" plans each step's subgroup updates between CPU and GPU with a cost model (see
 * sched/dos_policy.c and README); "all-cpu", "stride" (DOS_STRIDE_K, default 2) and
 * "resident" (DOS_RESIDENT_RATIO, default 0.5) are the static baselines of ZeRO-Offload,
 * the DOS prototype and Twin-Flow. Any StarPU 1.4 program can use them with
 * STARPU_SCHED_LIB=<path to libstarpu-dos.so> STARPU_SCHED=dos; a program that owns
 * starpu_init can pass dos_sched_policy("dos") as starpu_conf.sched_policy, or create a
 * scheduling context with it (STARPU_SCHED_CTX_POLICY_STRUCT). */

/* The policy named `name`, or NULL for NULL or a name that is not one of ours: a lookup
 * (programs ask it before falling back to StarPU's own policies), so NULL is an answer,
 * not a failure, and no error is recorded. */
struct starpu_sched_policy *dos_sched_policy(const char *name);

struct dos_sched_stats {
	unsigned long decisions;                /* tasks placed */
	double decision_seconds;                /* wall time spent placing them, planning included */
	unsigned long plans;                    /* steps planned */
	double plan_seconds;                    /* wall time spent planning */
	unsigned long cpu_updates, gpu_updates; /* update tasks placed on each side */
	uint64_t last_step;                     /* step number of the last plan */
	unsigned last_subgroups, last_gpu_subgroups;
	double last_predicted_seconds; /* the plan's own prediction of its update phase */
	double last_bound_seconds;     /* the best achievable update phase (bound.c) */
	double gpu_budget_bytes;       /* GPU memory the last plan allowed itself */
	int calibrated;                /* the last plan had measured update times */
	/* the last plan's forecast of the application's own GPU memory over the iteration,
	 * and whether the measure of the previous iteration set it (1: it exceeded the
	 * declaration) or the declaration (0) */
	double app_forecast_bytes;
	int app_forecast_learned;
	double evicted_state_bytes; /* state planned resident that StarPU evicted, over the run */
	unsigned long early_plans;  /* steps planned early: more than DOS_STEPS_IN_FLIGHT in flight */
};

/* The best achievable update-phase time, in seconds, of one optimizer step over
 * `params` parameters cut into subgroups of `subgroup_params`, on the machine StarPU runs
 * on now (its calibrated perfmodels, bus model and GPU memory, the workers of
 * `sched_ctx`), with gradients of `grad_dtype` and 16-bit weights of `weight_dtype`
 * (DOS_FP32: none) living on the GPU when `grads_on_gpu` / `weights_on_gpu`: the bound
 * of sched/bound.c, to print measured times as a ratio to it. It counts every GPU of the
 * context, GPUs behind one PCIe switch sharing its bandwidth. Call it between
 * starpu_init and starpu_shutdown. Errors: -EINVAL for bad arguments, -ENODATA when StarPU's
 * dos_adam perfmodel has no measurements yet for that subgroup size on some worker kind
 * (calibrate first: dos-bench calibrate, or STARPU_CALIBRATE=1). -EINVAL covers NULL
 * `seconds`, params or subgroup_params out of range, unknown dtypes, StarPU not running
 * and a context that does not exist. */
int dos_bound_update_seconds(unsigned sched_ctx, double params, double subgroup_params, enum dos_dtype grad_dtype,
			     enum dos_dtype weight_dtype, int grads_on_gpu, int weights_on_gpu, double *seconds);

/* The same bound counting whole subgroups: each subgroup's update is one task, which runs
 * whole on one worker and moves whole, where the bound above splits the parameters
 * continuously. Never below it; above it where a fraction of a subgroup decides (50
 * subgroups: one is 2 % of the work). Subgroups of unequal sizes (`params` not a multiple
 * of `subgroup_params`): the bound above. Same arguments and errors. */
int dos_bound_update_whole_subgroups_seconds(unsigned sched_ctx, double params, double subgroup_params,
					     enum dos_dtype grad_dtype, enum dos_dtype weight_dtype, int grads_on_gpu,
					     int weights_on_gpu, double *seconds);

/* Host measurements the dos policy plans with, recorded for this host (beside StarPU's
 * bus model, same host name) and written atomically; `dos-bench host` measures and
 * records both. Call them between starpu_init and starpu_shutdown. Errors: -EINVAL for a
 * value out of range, -ENOENT when StarPU names no bus model file, or a negative errno
 * from the file system.
 * dos_host_contention_record: how much slower CPU Adam runs while DMA streams through
 * host memory (`factor` = time with DMA / time without, in [1, 100); DOS_HOST_CONTENTION
 * overrides it).
 * dos_host_cpu_rate_record: the Adam rate of all CPU cores together (params/s, >= 1),
 * which caps what the cost model expects of its CPU workers running at once. */
int dos_host_contention_record(double factor);
int dos_host_cpu_rate_record(double params_per_second);

/* ---- Steps: what the dos policy plans, and the contract with whoever submits them ----
 * The dos policy places a step's updates with one plan, made once the whole step is
 * known: when the submitter says so (dos_sched_step_submitted), when the first update of
 * the next step is submitted, when a step reaches the number of updates the previous
 * step had, or when the application waits on StarPU (starpu_task_wait_for_all and the
 * other waits call the policy's do_schedule). Until then a ready update waits for its
 * plan, but only while one of those is sure to come: before the submitter has made its
 * first dos_sched_step_submitted call and before a first step is complete (its size
 * unknown), a ready update is planned at once with the updates collected so far (as a
 * policy that sees no step can do no better). The embedding API (dos_opt_*) and dos-train
 * follow the contract themselves.
 * At most DOS_STEPS_IN_FLIGHT steps may be submitted and not yet planned at once: a step
 * beyond that window makes the policy plan the oldest one early, before its updates are
 * ready (with a warning on stderr, once), which places it on stale information. */
#define DOS_STEPS_IN_FLIGHT 4

/* Says that every update of the step being submitted to `sched_ctx` (run by a starpu-dos
 * policy) has been submitted: the policy plans it now if an update of it is already
 * ready, else when the first becomes ready. Also tells the policy that this submitter
 * will say so for every step: call it once before the first step too, so that the first
 * step is planned once as well. Errors: -EINVAL for StarPU not running, or a context
 * that does not exist or is not run by a starpu-dos policy. */
int dos_sched_step_submitted(unsigned sched_ctx);

/* Makes the dos policy treat the tasks of the codelets whose name matches `name_pattern`
 * (a codelet name, or an fnmatch(3) pattern such as "nntile_adam_step*") as subgroup
 * updates of another framework's optimizer: it plans them per step like its own (CPU or
 * GPU, state prefetched, kept resident or written back), with buffer `grad` the
 * gradient (read), and buffers `m`, `v` and `weight` the optimizer state (read and
 * written: the moments and the weights the update changes in place), in whatever
 * element type they hold. Steps are what the policy sees: a task on a weight handle
 * already updated in the current step starts the next step. Its cost model: the
 * codelet's own StarPU perfmodel where it has measurements for the task, else the rates
 * of our own Adam kernel; its state counts as (bytes of weight + m + v) / 12 fp32
 * parameters. The same from the environment, read when a dos policy starts (the
 * zero-code route: STARPU_SCHED_LIB=.../libstarpu-dos.so STARPU_SCHED=dos):
 *   DOS_UPDATE_CODELETS="NAME:grad=G,m=M,v=V,weight=W[;NAME2:...]"
 * e.g. DOS_UPDATE_CODELETS="nntile_adam_step*:grad=0,m=1,v=2,weight=3" for NNTile's Adam
 * (docs/nntile.md). Register before the codelet's first task is submitted. Errors:
 * -EINVAL for a NULL, empty or too long pattern, a negative or too large buffer index, two
 * roles on one buffer; -ENOMEM beyond 16 registrations. */
int dos_sched_register_update_codelet(const char *name_pattern, int grad, int m, int v, int weight);

/* Statistics of the starpu-dos policy running in `sched_ctx` (0 for the global one).
 * Errors: -EINVAL for a NULL `out`, StarPU not running, a context that does not exist or
 * is not run by one of our policies (the message names the context and its policy). */
int dos_sched_get_stats(unsigned sched_ctx, struct dos_sched_stats *out);

/* Declares the GPU memory the application's own tasks in `sched_ctx` keep during an
 * iteration on each GPU of the context (weights, gradients and the peak of activations:
 * what forward and backward will need there), which the dos plan then leaves free for
 * them; it replaces the previous declaration, and DOS_GPU_RESERVE_MIB adds to it. The
 * training graph (graph/train.c) declares its own from the model's shape. The
 * declaration is a floor: the policy also measures what the application's GPU tasks in
 * `sched_ctx` keep live over each iteration and plans with the larger of the two
 * (DOS_GPU_FORECAST=declared: the declaration alone; DOS_GPU_DECLARED_MIB replaces the
 * declaration; docs/policy.md). Errors: -EINVAL for a negative or non-finite `bytes`,
 * StarPU not running, or a context that does not exist or is not run by one of our
 * policies. */
int dos_sched_reserve_gpu_bytes(unsigned sched_ctx, double bytes);

/* ---- Embedding the optimizer in a StarPU application ----------------------------------
 * An optimizer (dos_opt_t) keeps the fp32 master weights and Adam moments of an
 * application's parameters in host memory, cut into subgroups of `subgroup_size`
 * parameters (a subgroup may straddle tensors), and submits each step as StarPU tasks:
 * per subgroup a gather of its gradient from the tensors' gradients and an Adam update
 * (placed on a CPU or GPU worker by the dos policy), per tensor a refresh of its working
 * weights. The tasks reach the application's data through its handles, so they follow
 * its tasks in submission order (sequential consistency): submit forward and backward,
 * then dos_opt_submit_step, then the next forward; nothing blocks.
 *
 * StarPU: when the application has not called starpu_init, dos_opt_create initialises
 * StarPU with the dos policy (cfg.starpu_conf, else defaults) and the last optimizer
 * destroyed shuts it down. When it has, the optimizer's tasks run in a scheduling context
 * of their own run by the dos policy, sharing the application's workers; the
 * application's own context and policy are left as they are, and its tasks are never
 * scheduled by us. The sched_ctx field of dos_opt_get_info names the context.
 *
 * One thread at a time per optimizer. Functions that return int return 0 or a negative
 * errno, with the message in dos_last_error(), and change nothing when they fail. Every
 * function taking a dos_opt_t also refuses (-EINVAL) one that dos_opt_destroy has freed,
 * and, where it reaches StarPU, one whose StarPU was shut down: destroy the optimizers
 * before starpu_shutdown, and keep the handles given to one registered until then. */

/* An optimizer made by dos_opt_create. */
typedef struct dos_opt *dos_opt_t;

/* Where the buffers of a struct dos_opt_tensor live. */
enum dos_memory {
	DOS_MEMORY_HOST = 0, /* host memory */
	DOS_MEMORY_CUDA = 1, /* memory of CUDA device cuda_device (a StarPU CUDA worker must use it) */
};

/* One tensor of the application: its working weights (which each step's refresh
 * overwrites) and its gradient (which the application's backward writes), each given
 * either as a StarPU handle the application registered (contiguous data of numel elements
 * of cfg.tensor_dtype, see "Data handles" above; the application's tasks use it) or as a
 * buffer that dos_opt_create
 * registers and dos_opt_destroy unregisters. Buffers do not take part in the
 * application's task graph: write the gradient before dos_opt_submit_step, and read the
 * weights after dos_opt_wait. Set exactly one of weight and weight_ptr, and of grad and
 * grad_ptr. */
struct dos_opt_tensor {
	uint64_t numel;              /* elements, 1 to 2^32 - 1 (a StarPU vector's count) */
	starpu_data_handle_t weight; /* the application's handle, or NULL ... */
	void *weight_ptr;            /* ... and a buffer of numel elements */
	starpu_data_handle_t grad;
	void *grad_ptr;
	enum dos_memory location; /* of weight_ptr and grad_ptr */
	int cuda_device;          /* DOS_MEMORY_CUDA: the CUDA device number */
};

struct dos_opt_config {
	struct dos_adam_hparams hp;
	/* hp.lr over the updates (warmup, cosine decay); zero: constant. An application with a
	 * schedule of its own calls dos_opt_set_lr before each step instead */
	struct dos_lr_schedule lr_schedule;
	/* parameters per subgroup, the unit the dos policy places on a CPU or GPU worker
	 * (1 to 2^32 - 1, or more than the model has: then one subgroup) */
	uint64_t subgroup_size;
	/* 0 (the default): subgroups are slices of the flat space (all tensors in order) and
	 * may straddle tensors; 1: each tensor is cut on its own (no subgroup straddles two),
	 * so a tensor of at most subgroup_size elements is one subgroup, and when grad_dtype
	 * is tensor_dtype its update reads the tensor's gradient handle itself, with no
	 * gather copy (tile-based codes: one tile, one update, as their own optimizer does) */
	int subgroups_follow_tensors;
	enum dos_dtype tensor_dtype; /* of every tensor's weight and gradient */
	/* DOS_FP32: the refresh writes the master weights (narrowed to tensor_dtype);
	 * DOS_FP16/DOS_BF16: the update also writes 16-bit weights, which the refresh copies
	 * (or widens to fp32 tensors). With 16-bit tensors it must be fp32 or tensor_dtype. */
	enum dos_dtype weight_dtype;
	/* the gathered subgroup gradient: fp32, or weight_dtype (half the bytes to move);
	 * with 16-bit tensors, fp32 or tensor_dtype */
	enum dos_dtype grad_dtype;
	double clip_norm; /* global gradient-norm clipping as torch.nn.utils.clip_grad_norm_; 0: off */
	/* dynamic loss scaling: the application multiplies its loss gradient by
	 * dos_opt_info.loss_scale; a step whose gradients hold inf or nan is skipped (the
	 * state stays bit for bit) and halves the scale, loss_scale_window good steps in a
	 * row double it, up to DOS_LOSS_SCALE_MAX. Clipping and loss scaling make
	 * dos_opt_submit_step wait for the step's gradients (the global norm is a barrier). */
	int dynamic_loss_scale;
	double loss_scale_init;     /* in [1, DOS_LOSS_SCALE_MAX] */
	uint32_t loss_scale_window; /* > 0 */
	/* the policy of the optimizer's context: NULL for "dos", or "all-cpu", "stride",
	 * "resident" (the baselines, for comparisons) */
	const char *policy;
	/* used only when dos_opt_create initialises StarPU (its sched_policy is replaced by
	 * ours); NULL: StarPU's defaults and environment */
	const struct starpu_conf *starpu_conf;
	/* GPU memory the application's own tasks keep during an iteration (weights,
	 * gradients, the peak of activations), which the dos policy leaves them; >= 0 */
	double app_gpu_bytes;
	/* Where the optimizer's tasks run when the application runs StarPU. 0 (the default):
	 * a scheduling context of the optimizer's own, run by cfg.policy, over ctx_workers
	 * (ctx_nworkers StarPU worker ids; NULL: every worker, shared with the application).
	 * 1: the application's context app_sched_ctx, which it created run by the dos policy
	 * (STARPU_SCHED_CTX_POLICY_STRUCT with dos_sched_policy("dos"), or STARPU_SCHED=dos for
	 * context 0): one dos instance then schedules the application's forward and backward
	 * as well as the updates, so its whole-iteration rules and its learned forecast of
	 * the application's GPU memory work from the application's own tasks; cfg.policy is
	 * not used then (the context's policy rules) */
	int use_app_sched_ctx;
	unsigned app_sched_ctx;
	const int *ctx_workers;
	unsigned ctx_nworkers;
};

/* The largest dynamic loss scale, 2^127: the largest power of two a float holds, so that
 * a loss gradient scaled in float stays finite (unbounded, the doubling of a run whose
 * gradients never overflow, in bf16, made it infinite after 112 windows). Written in
 * decimal (the shortest that reads back as 2^127 exactly): C++ before C++17 has no
 * hexadecimal floating constants. */
#define DOS_LOSS_SCALE_MAX 1.7014118346046923e+38

/* Fills `cfg` with the defaults: Adam (torch.optim.Adam: lr 1e-3, betas 0.9 and 0.999,
 * eps 1e-8, no weight decay), subgroups of 2^24 parameters, fp32 everywhere, no clipping,
 * no loss scaling (loss_scale_init 65536 and loss_scale_window 2000 once it is turned on),
 * policy "dos". Errors: -EINVAL for a NULL cfg. */
int dos_opt_config_init(struct dos_opt_config *cfg);

/* Creates an optimizer over `ntensors` tensors, in flat order (tensor 0 first); master
 * weights start from the tensors' weights (widened to fp32), which must hold their
 * initial values or be written by tasks already submitted (this call waits for them), and
 * m and v from zero. Initialises StarPU when the application has not (see above). On
 * success *out is the optimizer; on failure it is NULL and nothing was changed (StarPU
 * initialised here is shut down again, buffers registered here are unregistered).
 * Errors: -EINVAL for a NULL out, cfg or tensors, ntensors 0, a bad configuration field
 * (named with its value), a tensor with numel 0 or above 2^32 - 1, without or with both a
 * handle and a buffer for its weight or gradient, a handle that is not contiguous data of
 * numel elements of tensor_dtype, a handle used twice, buffers (given, or a handle's home
 * copy) that overlap, handles while StarPU is not initialised, a location outside enum
 * dos_memory, a CUDA device no StarPU CUDA worker uses, an unknown policy,
 * use_app_sched_ctx with StarPU not running or with a context that does not exist or is
 * not run by a starpu-dos policy, ctx_workers naming a worker that does not exist or one twice;
 * -EBUSY for a handle or buffer that a live optimizer already has (the message names
 * both); -ENODEV when StarPU finds no worker (the message names the settings that decide
 * the workers); -ENOMEM. */
int dos_opt_create(dos_opt_t *out, const struct dos_opt_config *cfg, uint32_t ntensors,
		   const struct dos_opt_tensor *tensors);

/* What dos_opt_submit_step did. */
struct dos_opt_step_report {
	int applied;                /* 0: skipped because some gradient held inf or nan */
	double grad_norm;           /* global norm of the unscaled gradients, when clipping or loss
				       scaling is on; else -1 */
	double loss_scale_used;     /* 1 without dynamic loss scaling */
	uint32_t overflow_subgroup; /* first subgroup with inf or nan gradients, when skipped */
	double lr;                  /* the learning rate the update applied (0 when skipped) */
};

/* Submits one optimizer step over the gradients that the application's tasks submitted
 * so far write (the step's tasks wait for them through the handles) and returns at once,
 * except when DOS_STEPS_IN_FLIGHT earlier steps still run (it waits for the oldest: the
 * step window of the dos policy), or with clipping or loss scaling on, where it waits
 * for the gradients and their global norm. Gradients given as buffers must be written
 * before this call. `report` may be NULL. Errors: -EINVAL for a NULL opt. */
int dos_opt_submit_step(dos_opt_t opt, struct dos_opt_step_report *report);

/* Sets hp.lr (the rate cfg.lr_schedule scales) for the steps submitted from now on; those
 * already submitted keep theirs. Call it from the thread that submits the steps. A
 * checkpoint records it; dos_opt_load does not change it. Errors: -EINVAL for a NULL opt,
 * or an lr that is negative, not finite, or whose first step size overflows float with
 * the other hyper-parameters (named with its value); the rate is unchanged then. */
int dos_opt_set_lr(dos_opt_t opt, double lr);

/* Waits until every task the optimizer submitted has ended, and brings weights given as
 * buffers up to date in their buffers. Errors: -EINVAL for a NULL opt. */
int dos_opt_wait(dos_opt_t opt);

struct dos_opt_info {
	uint64_t nparams;       /* sum of the tensors' numel */
	uint64_t subgroup_size; /* as used: cfg.subgroup_size, at most nparams */
	uint32_t ntensors, nsubgroups;
	uint64_t steps_submitted; /* steps submitted (or loaded from a checkpoint), skipped ones included */
	uint64_t updates_applied; /* Adam's step count t */
	uint64_t skipped_steps;   /* steps skipped for inf or nan gradients */
	double loss_scale;        /* multiply the loss gradient by it; 1 without dynamic loss scaling */
	unsigned sched_ctx;       /* the scheduling context the optimizer's tasks run in */
	int owns_starpu;          /* 1: StarPU was initialised by dos_opt_create */
};

/* Errors: -EINVAL for a NULL opt or out. */
int dos_opt_get_info(dos_opt_t opt, struct dos_opt_info *out);

enum dos_device {
	DOS_DEVICE_NONE = 0, /* no update of this subgroup has ended yet */
	DOS_DEVICE_CPU = 1,
	DOS_DEVICE_GPU = 2,
};

/* Where the last update of each subgroup that has ended ran: where[s] for every
 * subgroup s. Errors: -EINVAL for a NULL opt or where, or count other than the number of
 * subgroups. */
int dos_opt_get_placements(dos_opt_t opt, enum dos_device *where, uint32_t count);

/* The phases of one optimizer step, in task order. */
enum dos_opt_phase {
	DOS_PHASE_GATHER = 0,  /* subgroup gradients from the tensors' gradients */
	DOS_PHASE_STATS = 1,   /* gradient statistics (clipping, loss scaling only) */
	DOS_PHASE_UPDATE = 2,  /* Adam */
	DOS_PHASE_REFRESH = 3, /* tensors' working weights from the subgroups */
	DOS_PHASE_COUNT = 4,
};

/* Times of the latest step all of whose tasks have ended. A task's time runs from the
 * moment a worker took it (its input transfers included) to its end, on StarPU's clock
 * (simulated time under SimGrid). */
struct dos_opt_step_times {
	uint64_t step;                        /* 1-based, as steps_submitted counts; 0: none ended yet */
	uint32_t tasks[DOS_PHASE_COUNT];      /* tasks of each phase */
	double busy_seconds[DOS_PHASE_COUNT]; /* their times summed (workers run side by side) */
	double span_seconds[DOS_PHASE_COUNT]; /* first taken to last ended; 0 for no task */
	double step_seconds;                  /* first task taken to last task ended */
	uint32_t cpu_updates, gpu_updates;    /* where the step's updates ran */
};

/* Errors: -EINVAL for a NULL opt or out. */
int dos_opt_get_step_times(dos_opt_t opt, struct dos_opt_step_times *out);

/* Copies the state, after the updates submitted so far, into the arrays given (each
 * `count` floats, or NULL to skip it). Waits for those updates. Errors: -EINVAL for a
 * NULL opt, all three arrays NULL, or count other than the parameter count. */
int dos_opt_read_state(dos_opt_t opt, float *master, float *m, float *v, uint64_t count);

/* The mirror of dos_opt_read_state: replaces the state with master, m and v (each `count`
 * floats in the optimizer's flat order, tensor 0 first, or NULL to keep that array), once
 * the steps submitted so far have ended, and sets Adam's step count t (the bias
 * corrections) to `updates`, the number of updates that state has had; the next step is
 * update updates + 1, and steps_submitted becomes `updates`. When master is given, the
 * tensors' working weights are rewritten from it (weights given as buffers: after
 * dos_opt_wait). So a run started under another framework's Adam continues under ours:
 *   torch.optim.Adam/AdamW: state_dict()["state"][i] holds "exp_avg" (m), "exp_avg_sq"
 *     (v) and "step" (t) of parameter i, in the order of the parameter groups; the master
 *     weights are the fp32 parameters (or the fp32 master copy of a mixed-precision run);
 *   NNTile's Adam (adam_step): first moments are m, second moments hold sqrt(v): square
 *     them (v = s * s, rounded once in fp32); its num_iter of the last step taken is t;
 *     its parameter tiles are the master weights.
 * Errors: -EINVAL for a NULL opt, all three arrays NULL, count other than the parameter
 * count, a value that is not finite or a negative v (the message names the array and the
 * index), updates = 2^64 - 1 (the next update's number overflows); nothing changes then. */
int dos_opt_write_state(dos_opt_t opt, const float *master, const float *m, const float *v, uint64_t count,
			uint64_t updates);

/* Saves the state after the steps submitted so far (it waits for their updates) as
 * "checkpoint-<steps_submitted>.dos" in the folder `dir` (created with its parents when
 * missing), written atomically (a crash leaves the previous checkpoint intact), and
 * deletes this run's older checkpoint-*.dos files there beyond the `keep` most recent.
 * The path written goes to path_out (of path_size bytes) unless it is NULL. The file holds
 * master weights, m, v, the step counters and loss scale, the tensors' sizes, the subgroup
 * size and the run's identity (drawn when the optimizer is created, or the one of the
 * checkpoint it loaded), each section with a CRC32C.
 * A folder belongs to one run and one optimizer at a time: the optimizer keeps it locked
 * (an advisory lock the kernel drops when the process ends) until it is destroyed or
 * saves into another folder, and refuses a folder that holds another run's checkpoints
 * (or, before it has loaded one, checkpoint files it cannot read); temporary files of
 * killed saves are removed when it takes the folder. The first save after dos_opt_load
 * renames the run's checkpoints newer than the one loaded that do not verify (those
 * dos_opt_latest_checkpoint skipped) "<name>.damaged", with a warning on stderr, so that
 * the `keep` kept are ones that load; nothing is ever deleted but this run's older
 * checkpoint files. Errors: -EINVAL for a NULL opt or
 * dir, keep 0; -EBUSY when another process or optimizer holds the folder (the message
 * names the holder's pid); -EEXIST when it holds another run's checkpoints (nothing
 * written; the message lists them); -ERANGE when the state holds inf or nan (nothing
 * written; the message names the value); -ENAMETOOLONG when path_out is too small; a
 * negative errno naming the file and the operation from the file system. */
int dos_opt_save(dos_opt_t opt, const char *dir, unsigned keep, char *path_out, size_t path_size);

/* Replaces the state with that of the checkpoint at `path` (made by dos_opt_save or
 * dos-train for the same tensor sizes, subgroup size and dtypes) once the optimizer's
 * tasks so far have ended, and submits the tasks that make the tensors' weights what the
 * interrupted training had (weights given as buffers: after dos_opt_wait); the optimizer
 * then continues that checkpoint's run (its later saves carry its identity). N steps,
 * save, load, M steps end bit-identical to N + M steps. The whole file is verified
 * before anything changes. Errors: -EINVAL for a NULL opt or path, a file that is not a
 * checkpoint or is of another version or another layout (the message names the field,
 * its value and the expected one); -EIO for a truncated or corrupted file (the message
 * names the section); a negative errno from opening it. Nothing changes on an error,
 * except after -EIO saying the file "changed while being read" (between the verifying
 * and the reading pass), which may leave the state partly overwritten. */
int dos_opt_load(dos_opt_t opt, const char *path);

/* The path of the most recent checkpoint-<N>.dos in `dir` that verifies (every CRC of
 * every file it involves: it reads them whole), into path (of path_size bytes), for
 * resuming; newer ones that do not verify (damaged, truncated) are skipped with a warning
 * on stderr naming each and why (unless DOS_QUIET=1). Errors: -EINVAL for a NULL dir or
 * path; -ENOENT when there is none, or none verifies (the message gives the reasons);
 * -ENAMETOOLONG when path is too small; a negative errno from reading the directory. */
int dos_opt_latest_checkpoint(const char *dir, char *path, size_t path_size);

/* Waits for the optimizer's tasks, writes weights given as buffers back to them,
 * unregisters what dos_opt_create registered, deletes the optimizer's scheduling
 * context, frees the state, and shuts StarPU down when dos_opt_create initialised it and
 * no other optimizer needs it. NULL does nothing; an optimizer already destroyed, or
 * whose StarPU was shut down, is refused with the message on stderr and not touched. */
void dos_opt_destroy(dos_opt_t opt);

#ifdef __cplusplus
}
#endif

#endif /* DOS_H */
