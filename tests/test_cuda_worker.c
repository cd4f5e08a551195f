/* The subgroup codelets run by StarPU's CUDA driver, placed by the dos policy, give the
 * bits the CPU workers give. A few optimizer steps over subgroups of odd sizes (per step
 * and subgroup: gradient statistics, Adam update, cast to 16 bits, gradient scale) run
 * twice: every task restricted to the CPU workers (under the all-cpu policy), then as the
 * dos policy places them (its step plan for the updates, earliest finish for the rest;
 * the statistics, cast and scale of every other subgroup are restricted to CUDA workers,
 * so that each codelet runs there whatever the estimates say). Both runs must equal the
 * scalar kernels bit for bit, and every update must have run where the plan put it. The
 * test prints how many tasks of each codelet ran on the CUDA workers, and how many
 * updates on each. With several CUDA workers the same bits are asked of updates spread
 * over several GPUs: placement invariance across GPU counts.
 * DOS_TEST_GPU_UPDATES=N fails it when fewer than N updates ran on any CUDA worker (the
 * GPU simulator's lane asks for one, with one simulated GPU and with two:
 * tests/gpusim_lane.sh). Exits 77 (skipped) without a CUDA worker. */
#include <errno.h>

#include "kernels.h"
#include "parity_util.h"

#define NSUB 6
#define NSTEPS 3
#define MAX_SIZE 12289
static const size_t sub_sizes[NSUB] = {1, 17, 1003, 4099, 8195, MAX_SIZE};
static const enum dos_dtype grad_dtypes[NSUB] = {DOS_FP16, DOS_BF16, DOS_FP32, DOS_FP16, DOS_BF16, DOS_FP32};

enum codelet { STATS, ADAM, CAST, SCALE, NCODELETS };
static const char *const codelet_names[NCODELETS] = {"dos_grad_stats", "dos_adam", "dos_cast", "dos_grad_scale"};

struct subgroup {
	size_t n;
	enum dos_dtype gt, wt;
	float p[MAX_SIZE], m[MAX_SIZE], v[MAX_SIZE];
	uint16_t g[2 * MAX_SIZE], w[MAX_SIZE], w_cast[MAX_SIZE]; /* g: up to fp32 */
	struct dos_grad_stats stats;
	uint32_t nonfinite;
	starpu_data_handle_t hp, hm, hv, hg, hw, hw_cast, hstats, hflag;
};

static struct subgroup ref[NSUB], run[NSUB];

static void fill(struct subgroup *s, size_t k)
{
	s->n = sub_sizes[k];
	s->gt = grad_dtypes[k];
	s->wt = k % 2 ? DOS_BF16 : DOS_FP16;
	uint64_t rng = 0xc0da + k;
	for (size_t i = 0; i < s->n; i++) {
		s->p[i] = (float)test_normal(&rng);
		s->m[i] = (float)(0.01 * test_normal(&rng));
		s->v[i] = (float)(1e-4 * test_uniform(&rng));
		dos_store_elem(s->g, i, s->gt, value_mix(&rng, 0));
	}
	memset(s->w, 0, sizeof s->w);
	memset(s->w_cast, 0, sizeof s->w_cast);
	memset(&s->stats, 0, sizeof s->stats);
	s->nonfinite = 0xdeadbeef;
}

static void step_scalars(int t, struct dos_adam_step *st)
{
	struct dos_adam_hparams hp = {t % 2 ? DOS_ADAMW : DOS_ADAM_L2, 1e-3, 0.9, 0.999, 1e-8, 0.01};
	CHECK(dos_adam_step_init(st, &hp, (uint64_t)t, 0.5) == 0, "%s", dos_last_error());
}

/* What the tasks must produce: the scalar kernels in task order. */
static void reference(void)
{
	for (size_t k = 0; k < NSUB; k++) {
		struct subgroup *s = &ref[k];
		fill(s, k);
		for (int t = 1; t <= NSTEPS; t++) {
			struct dos_adam_step st;
			step_scalars(t, &st);
			_dos_cpu_kernels_scalar.grad_stats(s->g, s->gt, s->n, &s->stats);
			s->nonfinite =
				_dos_cpu_kernels_scalar.adam(&st, s->p, s->m, s->v, s->g, s->gt, s->w, s->wt, s->n);
			_dos_cpu_kernels_scalar.cast(s->p, s->w_cast, s->wt, s->n);
			_dos_cpu_kernels_scalar.grad_scale(s->g, s->gt, s->n, 0.75f);
		}
	}
}

/* Every task of a run, kept until it has run (destroy = 0) to read where it ran. */
static struct starpu_task *tasks[NSUB * NSTEPS * NCODELETS];
static size_t ntasks;

static void submit(struct starpu_task *task, enum codelet c, uint32_t where, struct starpu_task *after)
{
	task->where = (int32_t)where;
	task->destroy = 0;
	task->name = codelet_names[c];
	if (after)
		starpu_task_declare_deps(task, 1, after);
	CHECK(starpu_task_submit(task) == 0, "starpu_task_submit %s", codelet_names[c]);
	tasks[ntasks++] = task;
}

/* Updates run by each CUDA worker (by its rank among the CUDA workers) in the last run */
#define MAX_CUDA_WORKERS STARPU_NMAXWORKERS
static unsigned long updates_on_gpu[MAX_CUDA_WORKERS];

/* One run; `cpu_only` restricts every task to the CPU workers. Counts, per codelet, the
 * tasks that ran on a CUDA worker. */
static void run_steps(int cpu_only, unsigned long on_cuda[NCODELETS])
{
	ntasks = 0;
	for (size_t k = 0; k < NSUB; k++) {
		struct subgroup *s = &run[k];
		fill(s, k);
		starpu_vector_data_register(&s->hp, STARPU_MAIN_RAM, (uintptr_t)s->p, (uint32_t)s->n, 4);
		starpu_vector_data_register(&s->hm, STARPU_MAIN_RAM, (uintptr_t)s->m, (uint32_t)s->n, 4);
		starpu_vector_data_register(&s->hv, STARPU_MAIN_RAM, (uintptr_t)s->v, (uint32_t)s->n, 4);
		starpu_vector_data_register(&s->hg, STARPU_MAIN_RAM, (uintptr_t)s->g, (uint32_t)s->n,
					    dos_dtype_size(s->gt));
		starpu_vector_data_register(&s->hw, STARPU_MAIN_RAM, (uintptr_t)s->w, (uint32_t)s->n, 2);
		starpu_vector_data_register(&s->hw_cast, STARPU_MAIN_RAM, (uintptr_t)s->w_cast, (uint32_t)s->n, 2);
		starpu_variable_data_register(&s->hstats, STARPU_MAIN_RAM, (uintptr_t)&s->stats, sizeof s->stats);
		starpu_variable_data_register(&s->hflag, STARPU_MAIN_RAM, (uintptr_t)&s->nonfinite,
					      sizeof s->nonfinite);
	}
	for (int t = 1; t <= NSTEPS; t++) {
		struct dos_adam_step st;
		step_scalars(t, &st);
		/* the step's updates wait for this empty task, submitted last: the policy sees
		 * the whole step before planning it, as in training */
		struct starpu_task *ready = starpu_task_create();
		ready->cl = NULL;
		for (size_t k = 0; k < NSUB; k++) {
			struct subgroup *s = &run[k];
			const uint32_t where = cpu_only ? STARPU_CPU : k % 2 ? STARPU_CUDA : STARPU_CPU | STARPU_CUDA;
			const uint32_t any = cpu_only ? STARPU_CPU : STARPU_CPU | STARPU_CUDA;
			struct starpu_task *task;
			CHECK(dos_grad_stats_task_create(s->hg, s->gt, s->hstats, &task) == 0, "%s", dos_last_error());
			submit(task, STATS, where, NULL);
			CHECK(dos_adam_task_create(&st, s->hp, s->hm, s->hv, s->hg, s->gt, s->hw, s->wt, &task) == 0 &&
				      dos_adam_task_report_nonfinite(task, s->hflag) == 0,
			      "%s", dos_last_error());
			submit(task, ADAM, any, ready);
			CHECK(dos_cast_task_create(s->hp, s->hw_cast, s->wt, &task) == 0, "%s", dos_last_error());
			submit(task, CAST, where, NULL);
			CHECK(dos_grad_scale_task_create(s->hg, s->gt, 0.75f, &task) == 0, "%s", dos_last_error());
			submit(task, SCALE, where, NULL);
		}
		CHECK(starpu_task_submit(ready) == 0, "submit gradients-ready");
	}
	CHECK(starpu_task_wait_for_all() == 0, "starpu_task_wait_for_all");
	memset(on_cuda, 0, NCODELETS * sizeof on_cuda[0]);
	memset(updates_on_gpu, 0, sizeof updates_on_gpu);
	int cuda_ids[MAX_CUDA_WORKERS];
	const unsigned ncuda = starpu_worker_get_ids_by_type(STARPU_CUDA_WORKER, cuda_ids, MAX_CUDA_WORKERS);
	for (size_t i = 0; i < ntasks; i++) {
		struct starpu_profiling_task_info *info = tasks[i]->profiling_info;
		CHECK(info && info->workerid >= 0, "%s: no profiling information", tasks[i]->name);
		if (starpu_worker_get_type(info->workerid) == STARPU_CUDA_WORKER)
			for (int c = 0; c < NCODELETS; c++)
				on_cuda[c] += strcmp(tasks[i]->name, codelet_names[c]) == 0;
		for (unsigned g = 0; g < ncuda; g++)
			updates_on_gpu[g] += cuda_ids[g] == info->workerid && strcmp(tasks[i]->name, "dos_adam") == 0;
		starpu_task_destroy(tasks[i]);
	}
	for (size_t k = 0; k < NSUB; k++) {
		struct subgroup *s = &run[k];
		starpu_data_handle_t hs[] = {s->hp, s->hm, s->hv, s->hg, s->hw, s->hw_cast, s->hstats, s->hflag};
		for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++)
			starpu_data_unregister(hs[i]);
	}
}

static void compare_with_reference(const char *label)
{
	for (size_t k = 0; k < NSUB; k++) {
		const struct subgroup *a = &ref[k], *b = &run[k];
		char ctx[96];
		snprintf(ctx, sizeof ctx, "%s, subgroup %zu (n=%zu)", label, k, a->n);
		compare_f32("master", a->p, b->p, a->n, ctx);
		compare_f32("m", a->m, b->m, a->n, ctx);
		compare_f32("v", a->v, b->v, a->n, ctx);
		compare_elems("grad", a->g, b->g, a->gt, a->n, ctx);
		compare_elems("weight16 (update)", a->w, b->w, a->wt, a->n, ctx);
		compare_elems("weight16 (cast)", a->w_cast, b->w_cast, a->wt, a->n, ctx);
		CHECK(memcmp(&a->stats, &b->stats, sizeof a->stats) == 0, "%s: grad stats %a/%u vs %a/%u", ctx,
		      a->stats.sum_sq, a->stats.nonfinite, b->stats.sum_sq, b->stats.nonfinite);
		CHECK(a->nonfinite == b->nonfinite, "%s: non-finite bits %#x, reference %#x", ctx, b->nonfinite,
		      a->nonfinite);
	}
}

/* StarPU with `policy`; 0 when there is no CUDA worker (StarPU not running then). */
static int start(const char *policy)
{
	struct starpu_conf conf;
	starpu_conf_init(&conf);
	conf.sched_policy = dos_sched_policy(policy);
	conf.sched_policy_name = NULL;
	int ret = starpu_init(&conf);
	if (ret == -ENODEV)
		return 0;
	CHECK(ret == 0, "starpu_init: %d", ret);
	if (starpu_cuda_worker_get_count() == 0) {
		starpu_shutdown();
		return 0;
	}
	starpu_profiling_status_set(STARPU_PROFILING_ENABLE);
	return 1;
}

int main(void)
{
	if (!start("all-cpu")) {
		printf("no CUDA worker: skipped\n");
		return TEST_SKIP;
	}
	reference();
	unsigned long on_cuda[NCODELETS];
	run_steps(1, on_cuda);
	compare_with_reference("CPU workers only");
	for (int c = 0; c < NCODELETS; c++)
		CHECK(on_cuda[c] == 0, "%lu %s tasks ran on a CUDA worker, all were restricted to CPUs", on_cuda[c],
		      codelet_names[c]);
	starpu_shutdown();

	CHECK(start("dos"), "the CUDA worker is gone");
	run_steps(0, on_cuda);
	compare_with_reference("placed by dos");
	struct dos_sched_stats st;
	CHECK(dos_sched_get_stats(0, &st) == 0, "%s", dos_last_error());
	CHECK(st.cpu_updates + st.gpu_updates == NSUB * NSTEPS, "%lu + %lu updates planned", st.cpu_updates,
	      st.gpu_updates);
	CHECK(on_cuda[ADAM] == st.gpu_updates, "%lu updates ran on the CUDA worker, the plans put %lu there",
	      on_cuda[ADAM], st.gpu_updates);
	/* restricted to CUDA workers for every other subgroup */
	for (int c = 0; c < NCODELETS; c++)
		CHECK(c == ADAM || on_cuda[c] >= NSUB / 2 * NSTEPS, "only %lu %s tasks ran on the CUDA worker",
		      on_cuda[c], codelet_names[c]);
	const char *wanted = getenv("DOS_TEST_GPU_UPDATES");
	const unsigned ncuda = starpu_cuda_worker_get_count();
	char per_gpu[256] = "";
	size_t len = 0;
	for (unsigned g = 0; g < ncuda; g++) {
		if (wanted && *wanted)
			CHECK(updates_on_gpu[g] >= strtoul(wanted, NULL, 10),
			      "%lu updates ran on CUDA worker %u of %u, DOS_TEST_GPU_UPDATES = %s", updates_on_gpu[g],
			      g, ncuda, wanted);
		if (len < sizeof per_gpu)
			len += (size_t)snprintf(per_gpu + len, sizeof per_gpu - len, "%s%lu", g ? " + " : "",
						updates_on_gpu[g]);
	}
	char name[128];
	starpu_worker_get_name(starpu_worker_get_by_type(STARPU_CUDA_WORKER, 0), name, sizeof name);
	printf("on %u x %s: %lu (%s) of %d updates (as planned by dos), %lu statistics, %lu casts, %lu scales; %d "
	       "subgroups x %d steps == the CPU workers' results == the scalar kernels\n",
	       ncuda, name, on_cuda[ADAM], per_gpu, NSUB * NSTEPS, on_cuda[STATS], on_cuda[CAST], on_cuda[SCALE], NSUB,
	       NSTEPS);
	starpu_shutdown();
	return 0;
}
