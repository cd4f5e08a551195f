/* The policies run real StarPU programs correctly: every starpu-dos policy, as the
 * program's own policy, executes optimizer steps (and unrelated tasks) with results
 * identical to the scalar kernels, plans once per step, and counts its decisions; and
 * "dos" runs in a scheduling context of its own beside an application that keeps its
 * own policy (lws), scheduling only the tasks submitted to its context. */
#include "kernels.h"
#include "parity_util.h"
#include "test_starpu.h"

#define NSUB 6
#define NSTEPS 2
#define SIZE 5000

struct model {
	float p[NSUB][SIZE], m[NSUB][SIZE], v[NSUB][SIZE];
	uint16_t g[NSUB][SIZE], w[NSUB][SIZE];
	starpu_data_handle_t hp[NSUB], hm[NSUB], hv[NSUB], hg[NSUB], hw[NSUB];
};

static void fill(struct model *x)
{
	uint64_t rng = 7;
	for (int s = 0; s < NSUB; s++)
		for (int i = 0; i < SIZE; i++) {
			x->p[s][i] = (float)test_normal(&rng);
			x->m[s][i] = 0;
			x->v[s][i] = 0;
			x->g[s][i] = dos_float_to_fp16((float)(0.01 * test_normal(&rng)));
			x->w[s][i] = 0;
		}
}

static void step_scalars(int t, struct dos_adam_step *st)
{
	struct dos_adam_hparams hp = {DOS_ADAMW, 1e-3, 0.9, 0.999, 1e-8, 0.01};
	CHECK(dos_adam_step_init(st, &hp, (uint64_t)t, 1.0) == 0, "%s", dos_last_error());
}

static void reference(struct model *x)
{
	for (int t = 1; t <= NSTEPS; t++) {
		struct dos_adam_step st;
		step_scalars(t, &st);
		for (int s = 0; s < NSUB; s++)
			_dos_cpu_kernels_scalar.adam(&st, x->p[s], x->m[s], x->v[s], x->g[s], DOS_FP16, x->w[s],
						     DOS_BF16, SIZE);
	}
}

/* An unrelated task kind, as an application has many: no perfmodel, CPU only. */
static void count_cpu(void *buffers[], void *arg)
{
	(void)arg;
	(*(int *)STARPU_VARIABLE_GET_PTR(buffers[0]))++;
}
static struct starpu_codelet count_cl = {.cpu_funcs = {count_cpu}, .nbuffers = 1, .modes = {STARPU_RW}};

/* Submits the steps in context `ctx`. With `barrier`, each step's updates wait for one
 * "gradients ready" task submitted last, so the policy sees the whole step before any
 * update is ready; without, each update is ready as soon as it is submitted (the policy
 * then plans what it has seen so far, and must still be correct). */
static void run_steps(struct model *x, unsigned ctx, int barrier)
{
	for (int s = 0; s < NSUB; s++) {
		starpu_vector_data_register(&x->hp[s], STARPU_MAIN_RAM, (uintptr_t)x->p[s], SIZE, 4);
		starpu_vector_data_register(&x->hm[s], STARPU_MAIN_RAM, (uintptr_t)x->m[s], SIZE, 4);
		starpu_vector_data_register(&x->hv[s], STARPU_MAIN_RAM, (uintptr_t)x->v[s], SIZE, 4);
		starpu_vector_data_register(&x->hg[s], STARPU_MAIN_RAM, (uintptr_t)x->g[s], SIZE, 2);
		starpu_vector_data_register(&x->hw[s], STARPU_MAIN_RAM, (uintptr_t)x->w[s], SIZE, 2);
	}
	for (int t = 1; t <= NSTEPS; t++) {
		struct dos_adam_step st;
		step_scalars(t, &st);
		struct starpu_task *ready = starpu_task_create();
		ready->cl = NULL;
		ready->sched_ctx = ctx;
		for (int s = 0; s < NSUB; s++) {
			struct starpu_task *task;
			CHECK(dos_adam_task_create(&st, x->hp[s], x->hm[s], x->hv[s], x->hg[s], DOS_FP16, x->hw[s],
						   DOS_BF16, &task) == 0,
			      "%s", dos_last_error());
			task->sched_ctx = ctx;
			if (barrier)
				starpu_task_declare_deps(task, 1, ready);
			CHECK(starpu_task_submit(task) == 0, "submit update");
		}
		CHECK(starpu_task_submit(ready) == 0, "submit gradients-ready");
	}
}

static void finish_and_compare(struct model *x, const struct model *ref, const char *what)
{
	CHECK(starpu_task_wait_for_all() == 0, "wait");
	for (int s = 0; s < NSUB; s++) {
		starpu_data_unregister(x->hp[s]);
		starpu_data_unregister(x->hm[s]);
		starpu_data_unregister(x->hv[s]);
		starpu_data_unregister(x->hg[s]);
		starpu_data_unregister(x->hw[s]);
		char ctx[64];
		snprintf(ctx, sizeof ctx, "%s subgroup %d", what, s);
		compare_f32("master", ref->p[s], x->p[s], SIZE, ctx);
		compare_f32("m", ref->m[s], x->m[s], SIZE, ctx);
		compare_f32("v", ref->v[s], x->v[s], SIZE, ctx);
		compare_elems("weight16", ref->w[s], x->w[s], DOS_BF16, SIZE, ctx);
	}
}

static struct model ref, run;

int main(void)
{
	fill(&ref);
	reference(&ref);
	static const char *const names[] = {"dos", "all-cpu", "stride", "resident"};
	for (int k = 0; k < 4; k++) {
		struct starpu_conf conf;
		starpu_conf_init(&conf);
		test_starpu_init_policy(&conf, names[k]);
		fill(&run);
		int counter = 0;
		starpu_data_handle_t hc;
		starpu_variable_data_register(&hc, STARPU_MAIN_RAM, (uintptr_t)&counter, sizeof counter);
		run_steps(&run, 0, 1);
		for (int i = 0; i < 10; i++)
			CHECK(starpu_task_insert(&count_cl, STARPU_RW, hc, 0) == 0, "insert");
		finish_and_compare(&run, &ref, names[k]);
		starpu_data_unregister(hc);
		CHECK(counter == 10, "%s: %d of 10 unrelated tasks ran", names[k], counter);
		struct dos_sched_stats st;
		CHECK(dos_sched_get_stats(0, &st) == 0, "stats");
		CHECK(st.plans == NSTEPS, "%s: %lu plans for %d steps", names[k], st.plans, NSTEPS);
		CHECK(st.cpu_updates + st.gpu_updates == NSUB * NSTEPS, "%s: %lu + %lu updates placed", names[k],
		      st.cpu_updates, st.gpu_updates);
		CHECK(st.decisions >= NSUB * NSTEPS + 10, "%s: %lu decisions", names[k], st.decisions);
		if (starpu_cuda_worker_get_count() == 0)
			CHECK(st.gpu_updates == 0, "%s: GPU updates without a GPU", names[k]);
		/* the updates just ran at SIZE params: StarPU measured them (possibly too few
		 * samples yet); any other size has no measurement, and no bound */
		double bound = NAN;
		int berr = dos_bound_update_seconds(0, SIZE * NSUB, SIZE, DOS_FP16, DOS_BF16, 0, 0, &bound);
		CHECK((berr == 0 && isfinite(bound) && bound > 0) || berr == -ENODATA,
		      "%s: bound of this step: %d, %g (%s)", names[k], berr, bound, dos_last_error());
		double whole = NAN;
		int werr = dos_bound_update_whole_subgroups_seconds(0, SIZE * NSUB, SIZE, DOS_FP16, DOS_BF16, 0, 0,
								    &whole);
		CHECK(werr == berr && (berr || whole >= bound), "%s: bound in whole subgroups: %d, %g (continuous %g)",
		      names[k], werr, whole, bound);
		CHECK(dos_bound_update_seconds(0, 1e9, 1e8, DOS_FP16, DOS_BF16, 1, 1, &bound) == -ENODATA,
		      "%s: a bound for a never-measured subgroup size must be refused", names[k]);
		CHECK(dos_bound_update_seconds(0, 1e9, 2e9, DOS_FP16, DOS_BF16, 1, 1, &bound) == -EINVAL &&
			      strstr(dos_last_error(), "subgroup_params = 2e+09"),
		      "a subgroup larger than the model is refused");
		printf("%-8s: %lu tasks placed, %.2f us each; plan predicted %.3g s (bound %.3g s)\n", names[k],
		       st.decisions, 1e6 * st.decision_seconds / (double)st.decisions, st.last_predicted_seconds,
		       st.last_bound_seconds);
		starpu_shutdown();
	}

	/* No barrier: updates become ready one by one as they are submitted. */
	{
		struct starpu_conf conf;
		starpu_conf_init(&conf);
		conf.sched_policy = dos_sched_policy("dos");
		CHECK(starpu_init(&conf) == 0, "starpu_init");
		fill(&run);
		run_steps(&run, 0, 0);
		finish_and_compare(&run, &ref, "dos without a barrier");
		struct dos_sched_stats st;
		CHECK(dos_sched_get_stats(0, &st) == 0 && st.cpu_updates + st.gpu_updates == NSUB * NSTEPS,
		      "every update placed by a plan");
		starpu_shutdown();
		printf("dos without a barrier: %lu plans for %d steps, results identical\n", st.plans, NSTEPS);
	}

	/* Embedded: the application keeps lws; our updates run in a context of their own. */
	struct starpu_conf conf;
	starpu_conf_init(&conf);
	conf.sched_policy_name = "lws";
	CHECK(starpu_init(&conf) == 0, "starpu_init lws");
	unsigned ctx = starpu_sched_ctx_create(NULL, -1, "starpu-dos", STARPU_SCHED_CTX_POLICY_STRUCT,
					       dos_sched_policy("dos"), 0);
	fill(&run);
	int counter = 0;
	starpu_data_handle_t hc;
	starpu_variable_data_register(&hc, STARPU_MAIN_RAM, (uintptr_t)&counter, sizeof counter);
	run_steps(&run, ctx, 1);
	for (int i = 0; i < 10; i++)
		CHECK(starpu_task_insert(&count_cl, STARPU_RW, hc, 0) == 0, "insert");
	finish_and_compare(&run, &ref, "context");
	starpu_data_unregister(hc);
	struct dos_sched_stats st;
	CHECK(dos_sched_get_stats(ctx, &st) == 0, "stats of our context");
	/* the empty gradients-ready tasks never reach a scheduler: only the updates count */
	CHECK(st.decisions == NSUB * NSTEPS, "our context placed %lu tasks, expected %d (ours only)", st.decisions,
	      NSUB * NSTEPS);
	CHECK(dos_sched_get_stats(0, &st) == -EINVAL, "the application's context is not ours");
	CHECK(strcmp(starpu_sched_ctx_get_sched_policy(0)->policy_name, "lws") == 0, "the application lost lws");
	CHECK(counter == 10, "application tasks: %d of 10", counter);
	starpu_sched_ctx_delete(ctx);
	starpu_shutdown();
	printf("context: dos beside lws placed its %d updates and none of the application's tasks\n", NSUB * NSTEPS);
	return 0;
}
