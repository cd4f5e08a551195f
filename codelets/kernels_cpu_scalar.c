/* Portable scalar CPU kernels: the reference every other variant is tested against, and
 * the tails of the SIMD variants. Compiled for the baseline ISA only. */
#include "kernels.h"
#include "numerics.h"

/* Specialised per decay kind by the always-inline expansion below; the dtype branches
 * stay (this variant is the reference, not the fast path). */
static inline __attribute__((always_inline)) uint32_t adam_range(const struct dos_adam_step *s, float *p, float *m,
								 float *v, const void *g, enum dos_dtype gt, void *w,
								 enum dos_dtype wt, size_t begin, size_t end,
								 uint32_t decay_kind)
{
	/* as the SIMD variants do (kernels_cpu_simd.h): a multiply per p and v, m looked at
	 * only when one of them is not finite */
	float seen_p = 0.0f, seen_v = 0.0f;
	for (size_t i = begin; i < end; i++) {
		dos_adam_element(s, decay_kind, &p[i], &m[i], &v[i], dos_load_elem(g, i, gt));
		seen_p *= p[i];
		seen_v *= v[i];
		if (w)
			dos_store_elem(w, i, wt, p[i]);
	}
	uint32_t nonfinite = (isnan(seen_p) ? (uint32_t)DOS_NONFINITE_MASTER : 0u) |
			     (isnan(seen_v) ? (uint32_t)DOS_NONFINITE_V : 0u);
	if (nonfinite && _dos_nonfinite_scan(m + begin, end - begin))
		nonfinite |= DOS_NONFINITE_M;
	return nonfinite;
}

uint32_t _dos_adam_scalar_range(const struct dos_adam_step *s, float *p, float *m, float *v, const void *g,
				enum dos_dtype gt, void *w, enum dos_dtype wt, size_t begin, size_t end)
{
	switch (s->decay_kind) {
	case DOS_DECAY_DECOUPLED:
		return adam_range(s, p, m, v, g, gt, w, wt, begin, end, DOS_DECAY_DECOUPLED);
	case DOS_DECAY_L2:
		return adam_range(s, p, m, v, g, gt, w, wt, begin, end, DOS_DECAY_L2);
	default:
		return adam_range(s, p, m, v, g, gt, w, wt, begin, end, DOS_DECAY_NONE);
	}
}

static uint32_t adam_scalar(const struct dos_adam_step *s, float *p, float *m, float *v, const void *g,
			    enum dos_dtype gt, void *w, enum dos_dtype wt, size_t n)
{
	return _dos_adam_scalar_range(s, p, m, v, g, gt, w, wt, 0, n);
}

int _dos_nonfinite_scan(const float *x, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (!isfinite(x[i]))
			return 1;
	return 0;
}

void _dos_cast_scalar_range(const float *src, void *dst, enum dos_dtype dt, size_t begin, size_t end)
{
	for (size_t i = begin; i < end; i++)
		dos_store_elem(dst, i, dt, src[i]);
}

static void cast_scalar(const float *src, void *dst, enum dos_dtype dt, size_t n)
{
	_dos_cast_scalar_range(src, dst, dt, 0, n);
}

void _dos_grad_scale_scalar_range(void *g, enum dos_dtype gt, size_t begin, size_t end, float factor)
{
	for (size_t i = begin; i < end; i++)
		dos_store_elem(g, i, gt, factor == 0.0f ? 0.0f : dos_load_elem(g, i, gt) * factor);
}

static void grad_scale_scalar(void *g, enum dos_dtype gt, size_t n, float factor)
{
	_dos_grad_scale_scalar_range(g, gt, 0, n, factor);
}

void _dos_grad_stats_scalar_lanes(const void *g, enum dos_dtype gt, size_t begin, size_t end, double *lane)
{
	for (size_t i = begin; i < end; i++) {
		double x = dos_load_elem(g, i, gt);
		lane[(i - begin) % DOS_STATS_LANES] += x * x;
	}
}

void _dos_grad_stats_finish(double sum_sq, struct dos_grad_stats *out)
{
	out->sum_sq = sum_sq;
	out->nonfinite = !isfinite(sum_sq);
	out->reserved = 0;
}

static void grad_stats_scalar(const void *g, enum dos_dtype gt, size_t n, struct dos_grad_stats *out)
{
	double total = 0.0;
	for (size_t seg = 0; seg < n; seg += DOS_STATS_SEGMENT) {
		double lane[DOS_STATS_LANES] = {0};
		size_t end = n - seg < DOS_STATS_SEGMENT ? n : seg + DOS_STATS_SEGMENT;
		_dos_grad_stats_scalar_lanes(g, gt, seg, end, lane);
		total += dos_fold_lanes(lane);
	}
	_dos_grad_stats_finish(total, out);
}

const struct _dos_cpu_kernels _dos_cpu_kernels_scalar = {
	.isa = DOS_CPU_ISA_SCALAR,
	.adam = adam_scalar,
	.cast = cast_scalar,
	.grad_stats = grad_stats_scalar,
	.grad_scale = grad_scale_scalar,
};
