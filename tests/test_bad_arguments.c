/* Every task creator refuses bad input with -EINVAL and a message that names the argument
 * and its value, and creates no task; so do the CPU variant selectors. */
#include <errno.h>

#include "dos.h"
#include "test_util.h"

static int refusals;

static void expect(int err, int code, const char *needle, struct starpu_task *const *task)
{
	CHECK(err == code, "expected %d for '%s', got %d (%s)", code, needle, err, dos_last_error());
	CHECK(strstr(dos_last_error(), needle) != NULL, "message '%s' does not mention '%s'", dos_last_error(), needle);
	CHECK(!task || *task == NULL, "a refused call created a task ('%s')", needle);
	refusals++;
}

int main(void)
{
	int ret = starpu_init(NULL);
	if (ret == -ENODEV)
		return TEST_SKIP;
	CHECK(ret == 0, "starpu_init: %d", ret);

	enum { N = 64 };
	static float p[N], m[N], v[N], f32[N], other[N + 1];
	static uint16_t g16[N], w16[N];
	static struct dos_grad_stats stats;
	starpu_data_handle_t hp, hm, hv, hg16, hg32, hw, hshort, hstats, hbad_stats;
	starpu_vector_data_register(&hp, STARPU_MAIN_RAM, (uintptr_t)p, N, 4);
	starpu_vector_data_register(&hm, STARPU_MAIN_RAM, (uintptr_t)m, N, 4);
	starpu_vector_data_register(&hv, STARPU_MAIN_RAM, (uintptr_t)v, N, 4);
	starpu_vector_data_register(&hg16, STARPU_MAIN_RAM, (uintptr_t)g16, N, 2);
	starpu_vector_data_register(&hg32, STARPU_MAIN_RAM, (uintptr_t)f32, N, 4);
	starpu_vector_data_register(&hw, STARPU_MAIN_RAM, (uintptr_t)w16, N, 2);
	starpu_vector_data_register(&hshort, STARPU_MAIN_RAM, (uintptr_t)other, N + 1, 4);
	starpu_variable_data_register(&hstats, STARPU_MAIN_RAM, (uintptr_t)&stats, sizeof stats);
	starpu_variable_data_register(&hbad_stats, STARPU_MAIN_RAM, (uintptr_t)&stats, sizeof(double));

	struct dos_adam_hparams hp_ok = {DOS_ADAMW, 1e-3, 0.9, 0.999, 1e-8, 0.01};
	struct dos_adam_step st, blank;
	memset(&blank, 0, sizeof blank);
	CHECK(dos_adam_step_init(&st, &hp_ok, 1, 1.0) == 0, "%s", dos_last_error());
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
	EXPECT(-EINVAL, "master is NULL", dos_adam_task_create(&st, NULL, hm, hv, hg16, DOS_FP16, hw, DOS_BF16, &task));
	EXPECT(-EINVAL, "v is not a vector",
	       dos_adam_task_create(&st, hp, hm, hbad_stats, hg16, DOS_FP16, hw, DOS_BF16, &task));
	EXPECT(-EINVAL, "grad has 2-byte elements, expected 4",
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
	EXPECT(-EINVAL, "weight16 has 4-byte elements, expected 2", dos_cast_task_create(hp, hg32, DOS_FP16, &task));
	EXPECT(-EINVAL, "weight16 has 64 elements but master has 65",
	       dos_cast_task_create(hshort, hw, DOS_BF16, &task));
	EXPECT(-EINVAL, "stats must be a variable", dos_grad_stats_task_create(hg16, DOS_FP16, hbad_stats, &task));
	EXPECT(-EINVAL, "stats is NULL", dos_grad_stats_task_create(hg16, DOS_BF16, NULL, &task));
	EXPECT(-EINVAL, "grad has 4-byte elements", dos_grad_stats_task_create(hg32, DOS_FP16, hstats, &task));
	EXPECT(-EINVAL, "factor = nan", dos_grad_scale_task_create(hg16, DOS_FP16, NAN, &task));
	EXPECT(-EINVAL, "grad is NULL", dos_grad_scale_task_create(NULL, DOS_FP16, 1.0f, &task));
	expect(dos_cpu_isa_select((enum dos_cpu_isa)42), -EINVAL, "isa = 42", NULL);
	if (!dos_cpu_isa_supported(DOS_CPU_ISA_AVX512))
		expect(dos_cpu_isa_select(DOS_CPU_ISA_AVX512), -ENOTSUP, "avx512 is not supported", NULL);

	/* and a correct call still works after all the refusals */
	CHECK(dos_adam_task_create(&st, hp, hm, hv, hg16, DOS_FP16, hw, DOS_BF16, &task) == 0 && task, "%s",
	      dos_last_error());
	CHECK(starpu_task_submit(task) == 0, "submit");
	CHECK(starpu_task_wait_for_all() == 0, "wait");

	starpu_data_handle_t all[] = {hp, hm, hv, hg16, hg32, hw, hshort, hstats, hbad_stats};
	for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
		starpu_data_unregister(all[i]);
	starpu_shutdown();
	printf("bad arguments: %d refusals, each naming the argument\n", refusals);
	return 0;
}
