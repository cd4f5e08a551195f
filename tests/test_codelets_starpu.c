/* The codelets run through StarPU give exactly what the scalar kernels give on the same
 * data (the update's non-finite flag included), on every kind of worker present (CPU
 * always; CUDA when there is a GPU), and a
 * subgroup whose steps alternate between CPU and GPU ends bit-identical to one that
 * stayed on the CPU: placement never changes the result. */
#include "parity_util.h"
#include "test_starpu.h"
#include "kernels.h"

#define NSUB 5
#define NSTEPS 3
static const size_t sub_sizes[NSUB] = {1, 17, 4099, 70001, 200003};
static const enum dos_dtype grad_dtypes[NSUB] = {DOS_FP16, DOS_BF16, DOS_FP32, DOS_FP16, DOS_BF16};
/* subgroups 1 and 3 train in fp32 (no 16-bit output from the update; cast instead) */
static const int with_weight[NSUB] = {1, 0, 1, 0, 1};

struct subgroup {
	size_t n;
	enum dos_dtype gt, wt;
	float *p, *m, *v;
	void *g, *w, *w_cast;
	struct dos_grad_stats stats;
	uint32_t nonfinite; /* the last update's non-finite bits */
	starpu_data_handle_t hp, hm, hv, hg, hw, hw_cast, hstats, hflag;
};

static void fill(struct subgroup *s, size_t k, uint64_t seed)
{
	s->n = sub_sizes[k];
	s->gt = grad_dtypes[k];
	s->wt = k % 2 ? DOS_BF16 : DOS_FP16;
	size_t gs = dos_dtype_size(s->gt);
	CHECK(starpu_malloc((void **)&s->p, s->n * 4) == 0 && starpu_malloc((void **)&s->m, s->n * 4) == 0 &&
		      starpu_malloc((void **)&s->v, s->n * 4) == 0 && starpu_malloc(&s->g, s->n * gs) == 0 &&
		      starpu_malloc(&s->w, s->n * 2) == 0 && starpu_malloc(&s->w_cast, s->n * 2) == 0,
	      "starpu_malloc");
	uint64_t rng = seed + k;
	for (size_t i = 0; i < s->n; i++) {
		s->p[i] = (float)test_normal(&rng);
		s->m[i] = (float)(0.01 * test_normal(&rng));
		s->v[i] = (float)(1e-4 * test_uniform(&rng));
		dos_store_elem(s->g, i, s->gt, value_mix(&rng, 0));
	}
	memset(s->w, 0, s->n * 2);
	memset(s->w_cast, 0, s->n * 2);
	memset(&s->stats, 0, sizeof s->stats);
	s->nonfinite = 0xdeadbeef; /* the first update must overwrite it */
}

static void release(struct subgroup *s)
{
	starpu_free_noflag(s->p, s->n * 4);
	starpu_free_noflag(s->m, s->n * 4);
	starpu_free_noflag(s->v, s->n * 4);
	starpu_free_noflag(s->g, s->n * dos_dtype_size(s->gt));
	starpu_free_noflag(s->w, s->n * 2);
	starpu_free_noflag(s->w_cast, s->n * 2);
}

static void step_hparams(int step, struct dos_adam_step *st)
{
	struct dos_adam_hparams hp = {step % 2 ? DOS_ADAM_L2 : DOS_ADAMW, 1e-3, 0.9, 0.999, 1e-8, 0.01};
	CHECK(dos_adam_step_init(st, &hp, (uint64_t)step, 0.5) == 0, "%s", dos_last_error());
}

static void submit(struct starpu_task *task, uint32_t where)
{
	task->where = (int32_t)where;
	int err = starpu_task_submit(task);
	CHECK(err == 0, "starpu_task_submit: %d", err);
}

/* Same sequence as run_reference, as tasks restricted to where_for_step[t - 1]. */
static void run_tasks(struct subgroup *s, const uint32_t *where_for_step, int has_weight)
{
	starpu_vector_data_register(&s->hp, STARPU_MAIN_RAM, (uintptr_t)s->p, (uint32_t)s->n, 4);
	starpu_vector_data_register(&s->hm, STARPU_MAIN_RAM, (uintptr_t)s->m, (uint32_t)s->n, 4);
	starpu_vector_data_register(&s->hv, STARPU_MAIN_RAM, (uintptr_t)s->v, (uint32_t)s->n, 4);
	starpu_vector_data_register(&s->hg, STARPU_MAIN_RAM, (uintptr_t)s->g, (uint32_t)s->n, dos_dtype_size(s->gt));
	starpu_vector_data_register(&s->hw, STARPU_MAIN_RAM, (uintptr_t)s->w, (uint32_t)s->n, 2);
	starpu_vector_data_register(&s->hw_cast, STARPU_MAIN_RAM, (uintptr_t)s->w_cast, (uint32_t)s->n, 2);
	starpu_variable_data_register(&s->hstats, STARPU_MAIN_RAM, (uintptr_t)&s->stats, sizeof s->stats);
	starpu_variable_data_register(&s->hflag, STARPU_MAIN_RAM, (uintptr_t)&s->nonfinite, sizeof s->nonfinite);
	for (int t = 1; t <= NSTEPS; t++) {
		struct dos_adam_step st;
		struct starpu_task *task;
		step_hparams(t, &st);
		uint32_t where = where_for_step[t - 1];
		CHECK(dos_grad_stats_task_create(s->hg, s->gt, s->hstats, &task) == 0, "%s", dos_last_error());
		submit(task, where);
		CHECK(dos_adam_task_create(&st, s->hp, s->hm, s->hv, s->hg, s->gt, has_weight ? s->hw : NULL, s->wt,
					   &task) == 0 &&
			      dos_adam_task_report_nonfinite(task, s->hflag) == 0,
		      "%s", dos_last_error());
		submit(task, where);
		CHECK(dos_cast_task_create(s->hp, s->hw_cast, s->wt, &task) == 0, "%s", dos_last_error());
		submit(task, where);
		CHECK(dos_grad_scale_task_create(s->hg, s->gt, 0.75f, &task) == 0, "%s", dos_last_error());
		submit(task, where);
	}
}

static void unregister(struct subgroup *s)
{
	starpu_data_handle_t hs[] = {s->hp, s->hm, s->hv, s->hg, s->hw, s->hw_cast, s->hstats, s->hflag};
	for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++)
		starpu_data_unregister(hs[i]);
}

static void compare(const struct subgroup *ref, const struct subgroup *got, const char *ctx, int has_weight)
{
	compare_f32("master", ref->p, got->p, ref->n, ctx);
	compare_f32("m", ref->m, got->m, ref->n, ctx);
	compare_f32("v", ref->v, got->v, ref->n, ctx);
	compare_elems("grad", ref->g, got->g, ref->gt, ref->n, ctx);
	compare_elems("weight16 (cast)", ref->w_cast, got->w_cast, ref->wt, ref->n, ctx);
	if (has_weight)
		compare_elems("weight16 (update)", ref->w, got->w, ref->wt, ref->n, ctx);
	CHECK(memcmp(&ref->stats, &got->stats, sizeof ref->stats) == 0, "%s: grad stats %a/%u vs %a/%u", ctx,
	      ref->stats.sum_sq, ref->stats.nonfinite, got->stats.sum_sq, got->stats.nonfinite);
	CHECK(ref->nonfinite == got->nonfinite, "%s: the update flagged %#x, the kernel returned %#x", ctx,
	      got->nonfinite, ref->nonfinite);
}

static void run_placement(const char *label, const uint32_t *where_for_step)
{
	struct subgroup ref[NSUB], got[NSUB];
	for (size_t k = 0; k < NSUB; k++) {
		fill(&ref[k], k, 42);
		fill(&got[k], k, 42);
	}
	/* what the tasks must produce: the scalar kernels in the same order on a twin copy */
	for (size_t k = 0; k < NSUB; k++) {
		const struct _dos_cpu_kernels *kern = &_dos_cpu_kernels_scalar;
		for (int t = 1; t <= NSTEPS; t++) {
			struct dos_adam_step st;
			step_hparams(t, &st);
			struct subgroup *s = &ref[k];
			kern->grad_stats(s->g, s->gt, s->n, &s->stats);
			s->nonfinite = kern->adam(&st, s->p, s->m, s->v, s->g, s->gt, with_weight[k] ? s->w : NULL,
						  s->wt, s->n);
			kern->cast(s->p, s->w_cast, s->wt, s->n);
			kern->grad_scale(s->g, s->gt, s->n, 0.75f);
		}
		run_tasks(&got[k], where_for_step, with_weight[k]);
	}
	CHECK(starpu_task_wait_for_all() == 0, "starpu_task_wait_for_all");
	int flagged = 0;
	for (size_t k = 0; k < NSUB; k++)
		flagged += ref[k].nonfinite != 0;
	/* the gradients' 1e30s overflow v in some subgroups only: both answers are checked */
	CHECK(flagged > 0 && flagged < NSUB, "%d of %d subgroups have non-finite state", flagged, NSUB);
	for (size_t k = 0; k < NSUB; k++) {
		unregister(&got[k]);
		char ctx[96];
		snprintf(ctx, sizeof ctx, "%s subgroup %zu (n=%zu)", label, k, got[k].n);
		compare(&ref[k], &got[k], ctx, with_weight[k]);
		release(&ref[k]);
		release(&got[k]);
	}
	printf("%s: %d subgroups x %d steps of stats, adam, cast, scale == scalar reference\n", label, NSUB, NSTEPS);
}

int main(void)
{
	test_starpu_init(NULL);
	const uint32_t cpu_only[NSTEPS] = {STARPU_CPU, STARPU_CPU, STARPU_CPU};
	run_placement("cpu", cpu_only);
	if (starpu_cuda_worker_get_count() > 0) {
		const uint32_t cuda_only[NSTEPS] = {STARPU_CUDA, STARPU_CUDA, STARPU_CUDA};
		const uint32_t alternating[NSTEPS] = {STARPU_CUDA, STARPU_CPU, STARPU_CUDA};
		run_placement("cuda", cuda_only);
		run_placement("cuda/cpu alternating", alternating);
	} else {
		printf("no CUDA worker: the GPU placements were not run\n");
	}
	starpu_shutdown();
	return 0;
}
