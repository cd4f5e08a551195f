/* The SIMD kernels, written once for every CPU instruction set. An ISA file defines the
 * vector primitives below (lane by lane the operations of numerics.h) and includes this
 * file once; it then defines that ISA's kernel table. Primitives expected:
 *   SIMD_ISA (enum dos_cpu_isa), SIMD_TABLE (table name), SIMD_WIDTH (floats per vector),
 *   vfloat, v_set1, v_zero, v_load, v_store, v_add, v_sub, v_mul, v_div, v_sqrt,
 *   v_fmadd(a, b, c) = a * b + c rounded once, v_load_elems(base, i, dtype) (widened),
 *   v_store_elems(base, i, dtype, x) (rounded to nearest even, NaN as numerics.h),
 *   v_square_accumulate(acc, i, x): adds the exact double squares of the SIMD_WIDTH lanes
 *   of x to acc[i .. i + SIMD_WIDTH) (acc is a plain double array, one entry per lane). */
#include "kernels.h"
#include "numerics.h"

#define SIMD_INLINE static inline __attribute__((always_inline))

/* Whether some lane of x is NaN. */
SIMD_INLINE int any_lane_nan(vfloat x)
{
	float lanes[SIMD_WIDTH];
	v_store(lanes, x);
	for (int k = 0; k < SIMD_WIDTH; k++)
		if (isnan(lanes[k]))
			return 1;
	return 0;
}

SIMD_INLINE uint32_t adam_body(const struct dos_adam_step *s, float *p, float *m, float *v, const void *g,
			       enum dos_dtype gt, void *w, enum dos_dtype wt, size_t n, uint32_t decay_kind)
{
	const vfloat grad_multiplier = v_set1(s->grad_multiplier);
	const vfloat lerp_coeff = v_set1(s->lerp_coeff);
	const vfloat beta2 = v_set1(s->beta2);
	const vfloat one_minus_beta2 = v_set1(s->one_minus_beta2);
	const vfloat bc2_sqrt = v_set1(s->bc2_sqrt);
	const vfloat eps = v_set1(s->eps);
	const vfloat neg_step_size = v_set1(s->neg_step_size);
	const vfloat decay = v_set1(s->decay);
	const vfloat weight_decay = v_set1(s->weight_decay);
	/* Non-finite outputs, one multiply per p and v vector: 0 * x stays a zero while every
	 * x is finite and turns NaN for good at the first inf or NaN. m needs none: an inf or
	 * NaN in m reaches p through the step (or v is inf or NaN itself), so m is looked at
	 * only when p or v already were. One accumulator per array keeps the chain carried
	 * through the loop at one multiply per iteration. */
	vfloat seen_p = v_zero(), seen_v = v_zero();
	size_t i = 0;
	for (; i + SIMD_WIDTH <= n; i += SIMD_WIDTH) {
		vfloat pp = v_load(p + i);
		vfloat gg = v_mul(v_load_elems(g, i, gt), grad_multiplier);
		if (decay_kind == DOS_DECAY_DECOUPLED)
			pp = v_mul(pp, decay);
		else if (decay_kind == DOS_DECAY_L2)
			gg = v_fmadd(pp, weight_decay, gg);
		vfloat mm = v_load(m + i);
		mm = v_fmadd(lerp_coeff, v_sub(gg, mm), s->lerp_from_grad ? gg : mm);
		vfloat vv = v_mul(v_load(v + i), beta2);
		vv = v_fmadd(v_mul(one_minus_beta2, gg), gg, vv);
		vfloat denom = v_add(v_div(v_sqrt(vv), bc2_sqrt), eps);
		pp = v_add(pp, v_div(v_mul(neg_step_size, mm), denom));
		v_store(p + i, pp);
		v_store(m + i, mm);
		v_store(v + i, vv);
		if (w)
			v_store_elems(w, i, wt, pp);
		seen_p = v_mul(seen_p, pp);
		seen_v = v_mul(seen_v, vv);
	}
	uint32_t nonfinite = (any_lane_nan(seen_p) ? (uint32_t)DOS_NONFINITE_MASTER : 0u) |
			     (any_lane_nan(seen_v) ? (uint32_t)DOS_NONFINITE_V : 0u);
	if (nonfinite)
		nonfinite |= _dos_nonfinite_scan(m, i) ? (uint32_t)DOS_NONFINITE_M : 0u;
	return nonfinite | _dos_adam_scalar_range(s, p, m, v, g, gt, w, wt, i, n);
}

/* Expands the body once per (decay kind, grad dtype, weight dtype) so that no inner loop
 * tests a dtype. */
#define ADAM_CASE(dk, g_t, w_t)        \
	case (dk)*9 + (g_t)*3 + (w_t): \
		return adam_body(s, p, m, v, g, g_t, w, w_t, n, dk);
#define ADAM_CASES_W(dk, g_t) ADAM_CASE(dk, g_t, DOS_FP32) ADAM_CASE(dk, g_t, DOS_FP16) ADAM_CASE(dk, g_t, DOS_BF16)
#define ADAM_CASES_G(dk) ADAM_CASES_W(dk, DOS_FP32) ADAM_CASES_W(dk, DOS_FP16) ADAM_CASES_W(dk, DOS_BF16)

static uint32_t adam_simd(const struct dos_adam_step *s, float *p, float *m, float *v, const void *g, enum dos_dtype gt,
			  void *w, enum dos_dtype wt, size_t n)
{
	if (!w)
		wt = DOS_FP32; /* any value: the store is skipped */
	switch (s->decay_kind * 9 + gt * 3 + wt) {
		ADAM_CASES_G(DOS_DECAY_NONE)
		ADAM_CASES_G(DOS_DECAY_DECOUPLED)
		ADAM_CASES_G(DOS_DECAY_L2)
	default:
		return _dos_adam_scalar_range(s, p, m, v, g, gt, w, wt, 0, n);
	}
}

SIMD_INLINE void cast_body(const float *src, void *dst, enum dos_dtype dt, size_t n)
{
	size_t i = 0;
	for (; i + SIMD_WIDTH <= n; i += SIMD_WIDTH)
		v_store_elems(dst, i, dt, v_load(src + i));
	_dos_cast_scalar_range(src, dst, dt, i, n);
}

static void cast_simd(const float *src, void *dst, enum dos_dtype dt, size_t n)
{
	if (dt == DOS_FP16)
		cast_body(src, dst, DOS_FP16, n);
	else if (dt == DOS_BF16)
		cast_body(src, dst, DOS_BF16, n);
	else
		_dos_cast_scalar_range(src, dst, dt, 0, n);
}

SIMD_INLINE void grad_scale_body(void *g, enum dos_dtype gt, size_t n, float factor)
{
	const vfloat f = v_set1(factor);
	size_t i = 0;
	for (; i + SIMD_WIDTH <= n; i += SIMD_WIDTH)
		v_store_elems(g, i, gt, factor == 0.0f ? v_zero() : v_mul(v_load_elems(g, i, gt), f));
	_dos_grad_scale_scalar_range(g, gt, i, n, factor);
}

static void grad_scale_simd(void *g, enum dos_dtype gt, size_t n, float factor)
{
	if (gt == DOS_FP16)
		grad_scale_body(g, DOS_FP16, n, factor);
	else if (gt == DOS_BF16)
		grad_scale_body(g, DOS_BF16, n, factor);
	else
		grad_scale_body(g, DOS_FP32, n, factor);
}

/* One segment in the fixed reduction order of numerics.h. */
SIMD_INLINE double stats_segment(const void *g, enum dos_dtype gt, size_t begin, size_t end)
{
	double lane[DOS_STATS_LANES] = {0};
	size_t i = begin;
	for (; i + DOS_STATS_LANES <= end; i += DOS_STATS_LANES)
		for (int k = 0; k < DOS_STATS_LANES; k += SIMD_WIDTH)
			v_square_accumulate(lane, k, v_load_elems(g, i + (size_t)k, gt));
	/* the partial last row: its elements belong to lanes 0 .. end - i - 1 */
	_dos_grad_stats_scalar_lanes(g, gt, i, end, lane);
	return dos_fold_lanes(lane);
}

SIMD_INLINE void grad_stats_body(const void *g, enum dos_dtype gt, size_t n, struct dos_grad_stats *out)
{
	double total = 0.0;
	for (size_t seg = 0; seg < n; seg += DOS_STATS_SEGMENT)
		total += stats_segment(g, gt, seg, n - seg < DOS_STATS_SEGMENT ? n : seg + DOS_STATS_SEGMENT);
	_dos_grad_stats_finish(total, out);
}

static void grad_stats_simd(const void *g, enum dos_dtype gt, size_t n, struct dos_grad_stats *out)
{
	if (gt == DOS_FP16)
		grad_stats_body(g, DOS_FP16, n, out);
	else if (gt == DOS_BF16)
		grad_stats_body(g, DOS_BF16, n, out);
	else
		grad_stats_body(g, DOS_FP32, n, out);
}

const struct _dos_cpu_kernels SIMD_TABLE = {
	.isa = SIMD_ISA,
	.adam = adam_simd,
	.cast = cast_simd,
	.grad_stats = grad_stats_simd,
	.grad_scale = grad_scale_simd,
};
