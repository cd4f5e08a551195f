/* Every function of include/dos.h refuses bad input with the documented error code and a
 * message that names the argument and its value, and changes nothing: no task is made,
 * outputs keep their bytes, the CPU variant, the recorded host measurements and the
 * policy statistics stay as they were. Functions that cannot fail answer out-of-range
 * input with their documented sentinel. The graph's own entry points are covered by
 * test_bad_arguments_graph. */
#include <errno.h>

#include "dos.h"
#include "rates.h"
#include "test_starpu.h"
#include "test_util.h"

static int refusals;

static void expect(int err, int code, const char *needle, struct starpu_task *const *task)
{
	CHECK(err == code, "expected %d for '%s', got %d (%s)", code, needle, err, dos_last_error());
	CHECK(strstr(dos_last_error(), needle) != NULL, "message '%s' does not mention '%s'", dos_last_error(), needle);
	CHECK(!task || *task == NULL, "a refused call created a task ('%s')", needle);
	refusals++;
}

/* A refused call must leave `size` bytes at `out` as they were (`before`). */
static void expect_untouched(const void *out, const void *before, size_t size, const char *needle)
{
	CHECK(memcmp(out, before, size) == 0, "a refused call changed its output ('%s')", needle);
}

int main(void)
{
	/* nothing has failed yet in this thread */
	CHECK(strcmp(dos_last_error(), "") == 0, "dos_last_error before any failure: '%s'", dos_last_error());
	CHECK(strcmp(dos_version_string(), DOS_VERSION_STRING) == 0 && dos_version_number() == DOS_VERSION_NUMBER,
	      "loaded version %s (%u), compiled against %s", dos_version_string(), dos_version_number(),
	      DOS_VERSION_STRING);

	/* never-failing queries: their sentinels for values outside the enums */
	CHECK(dos_dtype_size((enum dos_dtype)9) == 0 && dos_dtype_size((enum dos_dtype) - 1) == 0, "dtype size");
	CHECK(strcmp(dos_dtype_name((enum dos_dtype)9), "invalid") == 0, "dtype name");
	CHECK(!dos_cpu_isa_supported((enum dos_cpu_isa)42) && !dos_cpu_isa_supported((enum dos_cpu_isa) - 1),
	      "an unknown isa is not supported");
	CHECK(strcmp(dos_cpu_isa_name((enum dos_cpu_isa)42), "invalid") == 0, "isa name");
	CHECK(dos_sched_policy(NULL) == NULL && dos_sched_policy("nosuch") == NULL && dos_sched_policy("dos"),
	      "policy lookup");

	/* the CPU variant: a refused selection keeps the one in use */
	enum dos_cpu_isa isa = dos_cpu_isa_selected();
	CHECK(isa != DOS_CPU_ISA_AUTO && strcmp(dos_cpu_isa_name(isa), "invalid") != 0, "selected %d", (int)isa);
	expect(dos_cpu_isa_select((enum dos_cpu_isa)42), -EINVAL, "isa = 42", NULL);
	if (!dos_cpu_isa_supported(DOS_CPU_ISA_AVX512))
		expect(dos_cpu_isa_select(DOS_CPU_ISA_AVX512), -ENOTSUP, "avx512 is not supported", NULL);
	CHECK(dos_cpu_isa_selected() == isa, "a refused selection changed the variant");

	/* step scalars (test_step_scalars checks every field; here the float-only limits) */
	struct dos_adam_hparams hp_ok = {DOS_ADAMW, 1e-3, 0.9, 0.999, 1e-8, 0.01}, hp_bad;
	struct dos_adam_step st, blank, out, before;
	memset(&out, 0x5a, sizeof out);
	before = out;
	expect(dos_adam_step_init(NULL, &hp_ok, 1, 1.0), -EINVAL, "out is NULL", NULL);
	hp_bad = hp_ok, hp_bad.lr = 1e38;
	expect(dos_adam_step_init(&out, &hp_bad, 1, 1.0), -EINVAL, "hp->lr = 1e+38: the step size", NULL);
	hp_bad = hp_ok, hp_bad.eps = 1e-50;
	expect(dos_adam_step_init(&out, &hp_bad, 1, 1.0), -EINVAL, "hp->eps = 1e-50 is 0 in float", NULL);
	hp_bad = hp_ok, hp_bad.mode = DOS_ADAM_L2, hp_bad.weight_decay = 1e39;
	expect(dos_adam_step_init(&out, &hp_bad, 1, 1.0), -EINVAL, "hp->weight_decay = 1e+39", NULL);
	expect_untouched(&out, &before, sizeof out, "step scalars");

	test_starpu_init(NULL);

	enum { N = 64 };
	static float p[N], m[N], v[N], f32[N], other[N + 1];
	static uint16_t g16[N], w16[N];
	static struct dos_grad_stats stats;
	static uint32_t flag;
	starpu_data_handle_t hp, hm, hv, hg16, hg32, hw, hshort, hstats, hbad_stats, hflag, hpadded, hfp64, hcoo;
	static float padded[2 * N];
	static double fp64[N];
	static uint32_t coo_columns[1], coo_rows[1];
	starpu_matrix_data_register(&hpadded, STARPU_MAIN_RAM, (uintptr_t)padded, 2 * N / 4, N / 4, 4, 4);
	starpu_vector_data_register(&hfp64, STARPU_MAIN_RAM, (uintptr_t)fp64, N, sizeof(double));
	starpu_coo_data_register(&hcoo, STARPU_MAIN_RAM, N, 1, 1, coo_columns, coo_rows, (uintptr_t)fp64,
				 sizeof(float));
	starpu_vector_data_register(&hp, STARPU_MAIN_RAM, (uintptr_t)p, N, 4);
	starpu_vector_data_register(&hm, STARPU_MAIN_RAM, (uintptr_t)m, N, 4);
	starpu_vector_data_register(&hv, STARPU_MAIN_RAM, (uintptr_t)v, N, 4);
	starpu_vector_data_register(&hg16, STARPU_MAIN_RAM, (uintptr_t)g16, N, 2);
	starpu_vector_data_register(&hg32, STARPU_MAIN_RAM, (uintptr_t)f32, N, 4);
	starpu_vector_data_register(&hw, STARPU_MAIN_RAM, (uintptr_t)w16, N, 2);
	starpu_vector_data_register(&hshort, STARPU_MAIN_RAM, (uintptr_t)other, N + 1, 4);
	starpu_variable_data_register(&hstats, STARPU_MAIN_RAM, (uintptr_t)&stats, sizeof stats);
	starpu_variable_data_register(&hbad_stats, STARPU_MAIN_RAM, (uintptr_t)&stats, sizeof(double));
	starpu_variable_data_register(&hflag, STARPU_MAIN_RAM, (uintptr_t)&flag, sizeof flag);

	memset(&blank, 0, sizeof blank);
	CHECK(dos_adam_step_init(&st, &hp_ok, 1, 1.0) == 0, "%s", dos_last_error());
	struct dos_adam_step nan_multiplier = st;
	nan_multiplier.grad_multiplier = NAN;
	struct starpu_task *task;

	/* each call starts from task == NULL and must leave it so */
#define EXPECT(code, needle, call)                       \
	do {                                             \
		task = NULL;                             \
		expect((call), (code), (needle), &task); \
	} while (0)
	EXPECT(-EINVAL, "step is NULL", dos_adam_task_create(NULL, hp, hm, hv, hg16, DOS_FP16, hw, DOS_BF16, &task));
	EXPECT(-EINVAL, "dos_adam_step_init",
	       dos_adam_task_create(&blank, hp, hm, hv, hg16, DOS_FP16, hw, DOS_BF16, &task));
	EXPECT(-EINVAL, "step->grad_multiplier = nan",
	       dos_adam_task_create(&nan_multiplier, hp, hm, hv, hg16, DOS_FP16, hw, DOS_BF16, &task));
	EXPECT(-EINVAL, "master is NULL", dos_adam_task_create(&st, NULL, hm, hv, hg16, DOS_FP16, hw, DOS_BF16, &task));
	/* any contiguous handle of the right element count is accepted (variable, matrix...),
	 * a padded matrix, fp64 data and interfaces of other layouts are not */
	EXPECT(-EINVAL, "v has 2 elements but master has 64",
	       dos_adam_task_create(&st, hp, hm, hbad_stats, hg16, DOS_FP16, hw, DOS_BF16, &task));
	EXPECT(-EINVAL, "v is a matrix handle with padding",
	       dos_adam_task_create(&st, hp, hm, hpadded, hg16, DOS_FP16, hw, DOS_BF16, &task));
	EXPECT(-EINVAL, "m is a vector of 8-byte elements, expected 4 (fp64 is not supported",
	       dos_adam_task_create(&st, hp, hfp64, hv, hg16, DOS_FP16, hw, DOS_BF16, &task));
	EXPECT(-EINVAL, "m has interface id",
	       dos_adam_task_create(&st, hp, hcoo, hv, hg16, DOS_FP16, hw, DOS_BF16, &task));
	{ /* the same data as a packed matrix (ld = nx) and as a variable: accepted */
		starpu_data_handle_t hmatrix, hvariable;
		starpu_matrix_data_register(&hmatrix, STARPU_MAIN_RAM, (uintptr_t)padded, N / 4, N / 4, 4, 4);
		starpu_variable_data_register(&hvariable, STARPU_MAIN_RAM, (uintptr_t)fp64, N * sizeof(float));
		CHECK(dos_adam_task_create(&st, hp, hmatrix, hvariable, hg16, DOS_FP16, hw, DOS_BF16, &task) == 0,
		      "a packed matrix and a variable refused: %s", dos_last_error());
		task->destroy = 0;
		starpu_task_destroy(task);
		starpu_data_unregister(hmatrix);
		starpu_data_unregister(hvariable);
	}
	EXPECT(-EINVAL, "grad is a vector of 2-byte elements, expected 4",
	       dos_adam_task_create(&st, hp, hm, hv, hg16, DOS_FP32, hw, DOS_BF16, &task));
	EXPECT(-EINVAL, "grad_dtype = 9",
	       dos_adam_task_create(&st, hp, hm, hv, hg16, (enum dos_dtype)9, hw, DOS_BF16, &task));
	EXPECT(-EINVAL, "weight_dtype = fp32",
	       dos_adam_task_create(&st, hp, hm, hv, hg16, DOS_FP16, hw, DOS_FP32, &task));
	EXPECT(-EINVAL, "v has 65 elements but master has 64",
	       dos_adam_task_create(&st, hp, hm, hshort, hg16, DOS_FP16, hw, DOS_BF16, &task));
	EXPECT(-EINVAL, "m and v are the same handle",
	       dos_adam_task_create(&st, hp, hm, hm, hg16, DOS_FP16, hw, DOS_BF16, &task));
	expect(dos_adam_task_create(&st, hp, hm, hv, hg16, DOS_FP16, hw, DOS_BF16, NULL), -EINVAL, "task_out is NULL",
	       NULL);
	EXPECT(-EINVAL, "weight_dtype = fp32", dos_cast_task_create(hp, hw, DOS_FP32, &task));
	EXPECT(-EINVAL, "master is NULL", dos_cast_task_create(NULL, hw, DOS_FP16, &task));
	EXPECT(-EINVAL, "weight16 is a vector of 4-byte elements, expected 2",
	       dos_cast_task_create(hp, hg32, DOS_FP16, &task));
	EXPECT(-EINVAL, "weight16 has 64 elements but master has 65",
	       dos_cast_task_create(hshort, hw, DOS_BF16, &task));
	expect(dos_cast_task_create(hp, hw, DOS_FP16, NULL), -EINVAL, "task_out is NULL", NULL);
	EXPECT(-EINVAL, "stats must be a variable handle of sizeof(struct dos_grad_stats) = 16 bytes, not 8",
	       dos_grad_stats_task_create(hg16, DOS_FP16, hbad_stats, &task));
	EXPECT(-EINVAL, "stats must be a variable handle, not interface id",
	       dos_grad_stats_task_create(hg16, DOS_FP16, hp, &task));
	EXPECT(-EINVAL, "stats is NULL", dos_grad_stats_task_create(hg16, DOS_BF16, NULL, &task));
	EXPECT(-EINVAL, "grad is a vector of 4-byte elements",
	       dos_grad_stats_task_create(hg32, DOS_FP16, hstats, &task));
	EXPECT(-EINVAL, "grad_dtype = 5", dos_grad_stats_task_create(hg16, (enum dos_dtype)5, hstats, &task));
	EXPECT(-EINVAL, "factor = nan", dos_grad_scale_task_create(hg16, DOS_FP16, NAN, &task));
	EXPECT(-EINVAL, "factor = inf", dos_grad_scale_task_create(hg16, DOS_FP16, INFINITY, &task));
	EXPECT(-EINVAL, "grad is NULL", dos_grad_scale_task_create(NULL, DOS_FP16, 1.0f, &task));
	EXPECT(-EINVAL, "grad_dtype = -1", dos_grad_scale_task_create(hg16, (enum dos_dtype) - 1, 1.0f, &task));

	/* the non-finite flag of an update task */
	struct starpu_task *update = NULL;
	CHECK(dos_adam_task_create(&st, hp, hm, hv, hg16, DOS_FP16, NULL, DOS_FP16, &update) == 0, "%s",
	      dos_last_error());
	unsigned nbuffers = STARPU_TASK_GET_NBUFFERS(update);
	expect(dos_adam_task_report_nonfinite(NULL, hflag), -EINVAL, "task is NULL", NULL);
	expect(dos_adam_task_report_nonfinite(update, NULL), -EINVAL, "flag is NULL", NULL);
	expect(dos_adam_task_report_nonfinite(update, hstats), -EINVAL,
	       "flag must be a variable handle of 4 bytes (uint32_t), not 16", NULL);
	expect(dos_adam_task_report_nonfinite(update, hp), -EINVAL, "flag must be a variable handle, not interface id",
	       NULL);
	struct starpu_task *cast = NULL;
	CHECK(dos_cast_task_create(hp, hw, DOS_BF16, &cast) == 0, "%s", dos_last_error());
	expect(dos_adam_task_report_nonfinite(cast, hflag), -EINVAL, "is a dos_cast task, not a dos_adam task", NULL);
	CHECK(STARPU_TASK_GET_NBUFFERS(update) == nbuffers, "a refused flag changed the update task");
	CHECK(dos_adam_task_report_nonfinite(update, hflag) == 0, "%s", dos_last_error());
	expect(dos_adam_task_report_nonfinite(update, hflag), -EINVAL, "already reports into a flag", NULL);
	CHECK(STARPU_TASK_GET_NBUFFERS(update) == nbuffers + 1, "the flag is one more buffer");
	cast->destroy = 0; /* never submitted */
	starpu_task_destroy(cast);
	/* once submitted, a task's buffers are StarPU's */
	struct starpu_task *submitted = NULL;
	CHECK(dos_adam_task_create(&st, hp, hm, hv, hg16, DOS_FP16, NULL, DOS_FP16, &submitted) == 0, "%s",
	      dos_last_error());
	submitted->destroy = 0;
	submitted->detach = 0;
	CHECK(starpu_task_submit(submitted) == 0 && starpu_task_wait(submitted) == 0, "run an update");
	expect(dos_adam_task_report_nonfinite(submitted, hflag), -EINVAL, "task was already submitted", NULL);
	starpu_task_destroy(submitted);
	/* the task with its flag runs and writes it: finite state, no bits */
	flag = 0xdeadbeef;
	CHECK(starpu_task_submit(update) == 0 && starpu_task_wait_for_all() == 0, "run the flagged update");
	starpu_data_acquire(hflag, STARPU_R);
	CHECK(flag == 0, "a finite update reported %#x", flag);
	starpu_data_release(hflag);

	/* the policies' functions, in a context that is not ours (the default policy) */
	struct dos_sched_stats sched_stats, sched_before;
	memset(&sched_stats, 0x5a, sizeof sched_stats);
	sched_before = sched_stats;
	expect(dos_sched_get_stats(0, NULL), -EINVAL, "out is NULL", NULL);
	expect(dos_sched_get_stats(0, &sched_stats), -EINVAL, "sched_ctx = 0 is run by", NULL);
	expect(dos_sched_get_stats(99, &sched_stats), -EINVAL, "sched_ctx = 99 is not a scheduling context", NULL);
	expect(dos_sched_get_stats(3, &sched_stats), -EINVAL, "sched_ctx = 3 is not a scheduling context", NULL);
	expect_untouched(&sched_stats, &sched_before, sizeof sched_stats, "dos_sched_get_stats");
	expect(dos_sched_reserve_gpu_bytes(0, -1.0), -EINVAL, "bytes = -1", NULL);
	expect(dos_sched_reserve_gpu_bytes(0, NAN), -EINVAL, "bytes = nan", NULL);
	expect(dos_sched_reserve_gpu_bytes(0, 1e9), -EINVAL, "not by a starpu-dos policy", NULL);
	expect(dos_sched_reserve_gpu_bytes(42, 1e9), -EINVAL, "sched_ctx = 42 is not a scheduling context", NULL);
	/* ... and in one that is: a refused call leaves its statistics alone */
	unsigned ours = starpu_sched_ctx_create(NULL, -1, "starpu-dos", STARPU_SCHED_CTX_POLICY_STRUCT,
						dos_sched_policy("dos"), 0);
	CHECK(dos_sched_get_stats(ours, &sched_before) == 0, "%s", dos_last_error());
	expect(dos_sched_reserve_gpu_bytes(ours, INFINITY), -EINVAL, "bytes = inf", NULL);
	CHECK(dos_sched_get_stats(ours, &sched_stats) == 0 &&
		      memcmp(&sched_stats, &sched_before, sizeof sched_stats) == 0,
	      "a refused reservation changed the policy's statistics");
	starpu_sched_ctx_delete(ours);
	expect(dos_sched_get_stats(ours, &sched_stats), -EINVAL, "is not a scheduling context", NULL);

	double seconds = 12.5;
	expect(dos_bound_update_seconds(0, 1e6, 1e5, DOS_FP16, DOS_BF16, 0, 0, NULL), -EINVAL, "seconds is NULL", NULL);
	expect(dos_bound_update_seconds(0, NAN, 1e5, DOS_FP16, DOS_BF16, 0, 0, &seconds), -EINVAL, "params = nan",
	       NULL);
	expect(dos_bound_update_seconds(0, 1e6, 0, DOS_FP16, DOS_BF16, 0, 0, &seconds), -EINVAL, "subgroup_params = 0",
	       NULL);
	expect(dos_bound_update_seconds(0, 1e6, 1e5, (enum dos_dtype)7, DOS_BF16, 0, 0, &seconds), -EINVAL,
	       "grad_dtype = 7", NULL);
	expect(dos_bound_update_seconds(0, 1e6, 1e5, DOS_FP16, (enum dos_dtype)8, 0, 0, &seconds), -EINVAL,
	       "weight_dtype = 8", NULL);
	expect(dos_bound_update_seconds(99, 1e6, 1e5, DOS_FP16, DOS_BF16, 0, 0, &seconds), -EINVAL,
	       "sched_ctx = 99 is not a scheduling context", NULL);
	expect(dos_bound_update_whole_subgroups_seconds(0, 1e6, 2e6, DOS_FP16, DOS_BF16, 0, 0, &seconds), -EINVAL,
	       "dos_bound_update_whole_subgroups_seconds: subgroup_params = 2e+06", NULL);
	expect(dos_bound_update_whole_subgroups_seconds(0, 1e6, 1e5, DOS_FP16, (enum dos_dtype)8, 0, 0, &seconds),
	       -EINVAL, "weight_dtype = 8", NULL);
	CHECK(seconds == 12.5, "a refused bound wrote %g", seconds);

	/* host measurements: refused values leave what this host has recorded */
	unsetenv("DOS_HOST_CONTENTION");
	double contention = _dos_host_contention(), rate = _dos_host_cpu_rate();
	expect(dos_host_contention_record(NAN), -EINVAL, "factor = nan", NULL);
	expect(dos_host_contention_record(100.0), -EINVAL, "factor = 100", NULL);
	expect(dos_host_cpu_rate_record(0.0), -EINVAL, "params_per_second = 0", NULL);
	expect(dos_host_cpu_rate_record(INFINITY), -EINVAL, "params_per_second = inf", NULL);
	CHECK(_dos_host_contention() == contention && _dos_host_cpu_rate() == rate,
	      "a refused record changed the host measurements");

	/* and a correct call still works after all the refusals */
	CHECK(dos_adam_task_create(&st, hp, hm, hv, hg16, DOS_FP16, hw, DOS_BF16, &task) == 0 && task, "%s",
	      dos_last_error());
	CHECK(starpu_task_submit(task) == 0, "submit");
	CHECK(starpu_task_wait_for_all() == 0, "wait");

	starpu_data_handle_t all[] = {hp,     hm,         hv,    hg16,    hg32,  hw,  hshort,
				      hstats, hbad_stats, hflag, hpadded, hfp64, hcoo};
	for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
		starpu_data_unregister(all[i]);
	starpu_shutdown();

	/* StarPU gone: what needs it says so instead of crashing */
	expect(dos_sched_get_stats(0, &sched_stats), -EINVAL, "StarPU is not initialised", NULL);
	expect(dos_bound_update_seconds(0, 1e6, 1e5, DOS_FP16, DOS_BF16, 0, 0, &seconds), -EINVAL,
	       "StarPU is not initialised", NULL);
	printf("bad arguments: %d refusals, each naming the argument and its value, nothing changed\n", refusals);
	return 0;
}
