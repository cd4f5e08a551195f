/* dos_adam_step_init: the per-step scalars match torch's double-precision formulas
 * rounded once, and every bad argument is refused with a message naming it and its value,
 * leaving the output untouched. */
#include <errno.h>

#include "dos.h"
#include "test_util.h"

static void expect_refused(const struct dos_adam_hparams *hp, uint64_t step, double multiplier, const char *needle)
{
	struct dos_adam_step s, before;
	memset(&s, 0xa5, sizeof s);
	before = s;
	int err = dos_adam_step_init(&s, hp, step, multiplier);
	CHECK(err == -EINVAL, "expected -EINVAL for '%s', got %d", needle, err);
	CHECK(strstr(dos_last_error(), needle) != NULL, "message '%s' does not mention '%s'", dos_last_error(), needle);
	CHECK(memcmp(&s, &before, sizeof s) == 0, "a refused call changed its output ('%s')", needle);
}

int main(void)
{
	struct dos_adam_hparams hp = {DOS_ADAMW, 1e-3, 0.9, 0.999, 1e-8, 0.01};
	struct dos_adam_step s;
	CHECK(dos_adam_step_init(&s, &hp, 3, 0.5) == 0, "%s", dos_last_error());
	CHECK(s.step == 3 && s.decay_kind == DOS_DECAY_DECOUPLED, "step %llu decay_kind %u", (unsigned long long)s.step,
	      s.decay_kind);
	CHECK(s.neg_step_size == (float)(-(1e-3 / (1.0 - pow(0.9, 3.0)))), "neg_step_size %a", (double)s.neg_step_size);
	CHECK(s.bc2_sqrt == (float)pow(1.0 - pow(0.999, 3.0), 0.5), "bc2_sqrt %a", (double)s.bc2_sqrt);
	CHECK(s.decay == (float)(1.0 - 1e-3 * 0.01), "decay %a", (double)s.decay);
	CHECK(s.lerp_coeff == (float)(1.0 - 0.9) && !s.lerp_from_grad, "lerp %a %u", (double)s.lerp_coeff,
	      s.lerp_from_grad);
	CHECK(s.one_minus_beta2 == (float)(1.0 - 0.999) && s.beta2 == 0.999f && s.eps == 1e-8f, "betas/eps");
	CHECK(s.grad_multiplier == 0.5f, "grad_multiplier %a", (double)s.grad_multiplier);

	/* Adam with L2 decay; beta1 < 0.5 takes torch's other lerp form */
	hp.mode = DOS_ADAM_L2;
	hp.beta1 = 0.25;
	CHECK(dos_adam_step_init(&s, &hp, 1, 1.0) == 0, "%s", dos_last_error());
	CHECK(s.decay_kind == DOS_DECAY_L2 && s.weight_decay == 0.01f && s.decay == 1.0f, "L2 fields");
	CHECK(s.lerp_from_grad && s.lerp_coeff == (float)0.75 - 1.0f, "lerp from grad %a", (double)s.lerp_coeff);
	/* no decay at all when weight_decay == 0, in both modes */
	hp.weight_decay = 0.0;
	CHECK(dos_adam_step_init(&s, &hp, 1, 1.0) == 0 && s.decay_kind == DOS_DECAY_NONE, "no decay (L2)");
	hp.mode = DOS_ADAMW;
	CHECK(dos_adam_step_init(&s, &hp, 1, 1.0) == 0 && s.decay_kind == DOS_DECAY_NONE, "no decay (W)");
	/* far steps: beta^t underflows to 0, bias corrections to 1 */
	CHECK(dos_adam_step_init(&s, &hp, UINT64_C(1) << 40, 1.0) == 0 && s.bc2_sqrt == 1.0f, "step 2^40");

	const struct dos_adam_hparams good = {DOS_ADAMW, 1e-3, 0.9, 0.999, 1e-8, 0.01};
	struct dos_adam_hparams bad;
	CHECK(dos_adam_step_init(NULL, &good, 1, 1.0) == -EINVAL && strstr(dos_last_error(), "out"), "NULL out");
	expect_refused(NULL, 1, 1.0, "hp is NULL");
	expect_refused(&good, 0, 1.0, "step = 0");
	bad = good, bad.lr = -1e-3;
	expect_refused(&bad, 1, 1.0, "hp->lr = -0.001");
	bad = good, bad.lr = NAN;
	expect_refused(&bad, 1, 1.0, "hp->lr = nan");
	bad = good, bad.beta1 = 1.0;
	expect_refused(&bad, 1, 1.0, "hp->beta1 = 1");
	bad = good, bad.beta2 = -0.1;
	expect_refused(&bad, 1, 1.0, "hp->beta2 = -0.1");
	bad = good, bad.eps = 0.0;
	expect_refused(&bad, 1, 1.0, "hp->eps = 0");
	bad = good, bad.weight_decay = -0.5;
	expect_refused(&bad, 1, 1.0, "hp->weight_decay = -0.5");
	bad = good, bad.mode = (enum dos_adam_mode)7;
	expect_refused(&bad, 1, 1.0, "hp->mode = 7");
	expect_refused(&good, 1, 0.0, "grad_multiplier = 0");
	expect_refused(&good, 1, INFINITY, "grad_multiplier = inf");
	expect_refused(&good, 1, 1e-60, "grad_multiplier = 1e-60"); /* zero once rounded to float */
	printf("step scalars: values and %d refusals checked\n", 13);

	/* learning-rate schedules: the factors of the formula in dos.h at its joints */
	struct dos_lr_schedule none = {0}, warm = {.warmup_steps = 4}, cosine = {10, 30, 0.1};
	CHECK(dos_lr_schedule_check(&none) == 0 && dos_lr_schedule_check(&warm) == 0 &&
		      dos_lr_schedule_check(&cosine) == 0,
	      "a valid schedule refused: %s", dos_last_error());
	const struct {
		const struct dos_lr_schedule *s;
		uint64_t update;
		double factor;
	} points[] = {
		{&none, 0, 1},
		{&none, 1, 1},
		{&none, UINT64_MAX, 1},
		{&warm, 1, 0.25},
		{&warm, 3, 0.75},
		{&warm, 4, 1},
		{&warm, 1000, 1},
		{&cosine, 0, 1},
		{&cosine, 5, 0.5},
		{&cosine, 10, 1},
		{&cosine, 20, 0.55},
		{&cosine, 30, 0.1},
		{&cosine, UINT64_MAX, 0.1},
	};
	for (size_t i = 0; i < sizeof points / sizeof *points; i++) {
		double f = dos_lr_schedule_factor(points[i].s, points[i].update);
		CHECK(fabs(f - points[i].factor) < 1e-15,
		      "schedule point %zu: factor %.17g at update %llu, expected %g", i, f,
		      (unsigned long long)points[i].update, points[i].factor);
	}
	/* the cosine never rises */
	for (uint64_t k = 10; k < 30; k++)
		CHECK(dos_lr_schedule_factor(&cosine, k + 1) < dos_lr_schedule_factor(&cosine, k), "rises at %llu",
		      (unsigned long long)k + 1);
	const struct {
		struct dos_lr_schedule s;
		const char *needle;
	} bad_schedules[] = {
		{{3, 3, 0}, "lr_schedule.decay_steps = 3 must be 0 (no decay) or above warmup_steps = 3"},
		{{3, 2, 0}, "lr_schedule.decay_steps = 2"},
		{{0, 0, -0.1}, "lr_schedule.min_ratio = -0.1"},
		{{0, 0, NAN}, "lr_schedule.min_ratio = nan"},
	};
	for (size_t i = 0; i < sizeof bad_schedules / sizeof *bad_schedules; i++) {
		CHECK(dos_lr_schedule_check(&bad_schedules[i].s) == -EINVAL, "schedule %zu accepted", i);
		CHECK(strstr(dos_last_error(), bad_schedules[i].needle), "message '%s' does not mention '%s'",
		      dos_last_error(), bad_schedules[i].needle);
	}
	CHECK(dos_lr_schedule_check(NULL) == -EINVAL, "a NULL schedule accepted");
	printf("learning-rate schedules: %zu points and %zu refusals checked\n", sizeof points / sizeof *points,
	       sizeof bad_schedules / sizeof *bad_schedules + 1);
	return 0;
}
