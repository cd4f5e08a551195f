/* The one place that computes Adam's per-step scalars: in double, rounded once to float,
 * then passed by value to every subgroup task (DeepSpeed recomputed beta^t per subgroup
 * and drifted). Mirrors torch.optim.Adam(W): bias corrections from Python-float pow. */
#include <errno.h>
#include <math.h>

#include "dos.h"
#include "errors.h"

static int check_unit_interval(const char *name, double value)
{
	if (!(value >= 0.0 && value < 1.0))
		return DOS_FAIL(-EINVAL, "%s = %g must be in [0, 1)", name, value);
	return 0;
}

int dos_adam_step_init(struct dos_adam_step *out, const struct dos_adam_hparams *hp, uint64_t step,
		       double grad_multiplier)
{
	if (!out)
		return DOS_FAIL(-EINVAL, "out is NULL");
	if (!hp)
		return DOS_FAIL(-EINVAL, "hp is NULL");
	if (hp->mode != DOS_ADAM_L2 && hp->mode != DOS_ADAMW)
		return DOS_FAIL(-EINVAL, "hp->mode = %d is neither DOS_ADAM_L2 nor DOS_ADAMW", (int)hp->mode);
	if (step == 0)
		return DOS_FAIL(-EINVAL, "step = 0: steps are numbered from 1");
	if (!(hp->lr >= 0.0 && isfinite(hp->lr)))
		return DOS_FAIL(-EINVAL, "hp->lr = %g must be finite and >= 0", hp->lr);
	int err = check_unit_interval("hp->beta1", hp->beta1);
	if (err)
		return err;
	err = check_unit_interval("hp->beta2", hp->beta2);
	if (err)
		return err;
	if (!(hp->eps > 0.0 && isfinite(hp->eps)))
		return DOS_FAIL(-EINVAL, "hp->eps = %g must be finite and > 0", hp->eps);
	if (!(hp->weight_decay >= 0.0 && isfinite(hp->weight_decay)))
		return DOS_FAIL(-EINVAL, "hp->weight_decay = %g must be finite and >= 0", hp->weight_decay);
	if (!(grad_multiplier > 0.0 && isfinite(grad_multiplier) && (float)grad_multiplier > 0.0f &&
	      isfinite((float)grad_multiplier)))
		return DOS_FAIL(-EINVAL, "grad_multiplier = %g must be finite and > 0 in float", grad_multiplier);

	double t = (double)step;
	double bc1 = 1.0 - pow(hp->beta1, t);
	double bc2 = 1.0 - pow(hp->beta2, t);
	struct dos_adam_step s = {
		.grad_multiplier = (float)grad_multiplier,
		.beta2 = (float)hp->beta2,
		.one_minus_beta2 = (float)(1.0 - hp->beta2),
		.bc2_sqrt = (float)pow(bc2, 0.5), /* torch: bias_correction2 ** 0.5 */
		.eps = (float)hp->eps,
		.neg_step_size = (float)(-(hp->lr / bc1)),
		.decay = 1.0f,
		.weight_decay = 0.0f,
		.decay_kind = DOS_DECAY_NONE,
		.step = step,
	};
	/* torch's lerp switches formula at weight 0.5, with the coefficient computed in float */
	float lerp_weight = (float)(1.0 - hp->beta1);
	s.lerp_from_grad = lerp_weight >= 0.5f;
	s.lerp_coeff = s.lerp_from_grad ? lerp_weight - 1.0f : lerp_weight;
	/* torch skips the decay entirely when weight_decay == 0; so do we. */
	if (hp->weight_decay != 0.0) {
		if (hp->mode == DOS_ADAMW) {
			s.decay_kind = DOS_DECAY_DECOUPLED;
			s.decay = (float)(1.0 - hp->lr * hp->weight_decay);
		} else {
			s.decay_kind = DOS_DECAY_L2;
			s.weight_decay = (float)hp->weight_decay;
		}
	}
	/* each value was valid in double; the kernels get floats, where a huge lr or weight
	 * decay overflows and a tiny eps vanishes (then 0/0 on every zero moment) */
	if (!isfinite(s.neg_step_size))
		return DOS_FAIL(-EINVAL, "hp->lr = %g: the step size lr / (1 - beta1^%llu) = %g overflows float",
				hp->lr, (unsigned long long)step, hp->lr / bc1);
	if (!isfinite(s.decay) || !isfinite(s.weight_decay))
		return DOS_FAIL(-EINVAL, "hp->weight_decay = %g (with hp->lr = %g) overflows float", hp->weight_decay,
				hp->lr);
	if (!(s.eps > 0.0f && isfinite(s.eps)))
		return DOS_FAIL(-EINVAL, "hp->eps = %g is %g in float: must be finite and > 0 there", hp->eps,
				(double)s.eps);
	*out = s;
	return 0;
}

int dos_lr_schedule_check(const struct dos_lr_schedule *s)
{
	if (!s)
		return DOS_FAIL(-EINVAL, "lr schedule is NULL");
	if (s->decay_steps != 0 && s->decay_steps <= s->warmup_steps)
		return DOS_FAIL(-EINVAL,
				"lr_schedule.decay_steps = %llu must be 0 (no decay) or above warmup_steps = %llu",
				(unsigned long long)s->decay_steps, (unsigned long long)s->warmup_steps);
	if (!(s->min_ratio >= 0.0 && s->min_ratio <= 1.0))
		return DOS_FAIL(-EINVAL, "lr_schedule.min_ratio = %g must be in [0, 1]", s->min_ratio);
	return 0;
}

double dos_lr_schedule_factor(const struct dos_lr_schedule *s, uint64_t update)
{
	if (update == 0)
		return 1.0;
	if (update < s->warmup_steps)
		return (double)update / (double)s->warmup_steps;
	if (s->decay_steps == 0)
		return 1.0;
	if (update >= s->decay_steps)
		return s->min_ratio;
	const double pi = 3.14159265358979323846;
	double progress = (double)(update - s->warmup_steps) / (double)(s->decay_steps - s->warmup_steps);
	return s->min_ratio + (1.0 - s->min_ratio) * 0.5 * (1.0 + cos(pi * progress));
}
