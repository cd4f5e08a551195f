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
 * Every task creator below checks its handles (vector interface, equal lengths, element
 * sizes that match the dtypes) and returns an unsubmitted task in *task_out, so callers
 * can set a scheduling context, priority or worker before starpu_task_submit(). Each
 * codelet has a CPU and, when built with CUDA, a CUDA implementation with identical
 * results, and a regression perfmodel named after the codelet ("dos_adam", ...). */

/* One Adam/AdamW update of a subgroup: master (fp32, RW), m (fp32, RW), v (fp32, RW),
 * grad (grad_dtype, R), and weight16 (weight_dtype fp16 or bf16, W; NULL when training in
 * fp32). The step scalars are copied into the task; each field must lie where
 * dos_adam_step_init() puts it (-EINVAL naming the field otherwise). */
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
	double decision_seconds;                /* CPU time spent placing them, planning included */
	unsigned long plans;                    /* steps planned */
	double plan_seconds;                    /* CPU time spent planning */
	unsigned long cpu_updates, gpu_updates; /* update tasks placed on each side */
	uint64_t last_step;                     /* step number of the last plan */
	unsigned last_subgroups, last_gpu_subgroups;
	double last_predicted_seconds; /* the plan's own prediction of its update phase */
	double last_bound_seconds;     /* the best achievable update phase (bound.c) */
	double gpu_budget_bytes;       /* GPU memory the last plan allowed itself */
	int calibrated;                /* the last plan had measured update times */
};

/* The best achievable update-phase time, in seconds, of one optimizer step over
 * `params` parameters cut into subgroups of `subgroup_params`, on the machine StarPU runs
 * on now (its calibrated perfmodels, bus model and GPU memory, the workers of
 * `sched_ctx`), with gradients of `grad_dtype` and 16-bit weights of `weight_dtype`
 * (DOS_FP32: none) living on the GPU when `grads_on_gpu` / `weights_on_gpu`: the bound
 * of sched/bound.c, to print measured times as a ratio to it. Call it between
 * starpu_init and starpu_shutdown. Errors: -EINVAL for bad arguments, -ENODATA when StarPU's
 * dos_adam perfmodel has no measurements yet for that subgroup size on some worker kind
 * (calibrate first: dos-bench calibrate, or STARPU_CALIBRATE=1). -EINVAL covers NULL
 * `seconds`, params or subgroup_params out of range, unknown dtypes, StarPU not running
 * and a context that does not exist. */
int dos_bound_update_seconds(unsigned sched_ctx, double params, double subgroup_params, enum dos_dtype grad_dtype,
			     enum dos_dtype weight_dtype, int grads_on_gpu, int weights_on_gpu, double *seconds);

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

/* Statistics of the starpu-dos policy running in `sched_ctx` (0 for the global one).
 * Errors: -EINVAL for a NULL `out`, StarPU not running, a context that does not exist or
 * is not run by one of our policies (the message names the context and its policy). */
int dos_sched_get_stats(unsigned sched_ctx, struct dos_sched_stats *out);

/* Declares the GPU memory the application's own tasks in `sched_ctx` keep during an
 * iteration (weights, gradients and the peak of activations: what forward and backward
 * will need), which the dos plan then leaves free for them; it replaces the previous
 * declaration, and DOS_GPU_RESERVE_MIB adds to it. The training graph (graph/train.c)
 * declares its own from the model's shape. Errors: -EINVAL for a negative or non-finite
 * `bytes`, StarPU not running, or a context that does not exist or is not run by one of
 * our policies. */
int dos_sched_reserve_gpu_bytes(unsigned sched_ctx, double bytes);

#ifdef __cplusplus
}
#endif

#endif /* DOS_H */
