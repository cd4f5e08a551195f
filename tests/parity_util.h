/* Inputs and comparisons shared by the parity tests (SIMD and CUDA against the scalar
 * reference): a mix of ordinary and awkward values, and bitwise comparisons in which any
 * NaN equals any NaN (payloads are not part of the contract: GPUs return canonical NaNs). */
#ifndef DOS_PARITY_UTIL_H
#define DOS_PARITY_UTIL_H

#include "numerics.h"
#include "test_util.h"

/* Ordinary values plus zeros of both signs, fp32 and fp16 subnormals, values around the
 * fp16 overflow threshold, huge and tiny values, and (when `nonfinite`) inf and nan. */
static inline float value_mix(uint64_t *rng, int nonfinite)
{
	static const float near_fp16_max[] = {65504.0f, 65519.99f, 65520.0f, 65536.0f, 1e5f, 6.1e-5f, 5.96e-8f};
	float sign = (test_rand(rng) & 1) ? -1.0f : 1.0f;
	switch (test_rand(rng) % 16) {
	case 0:
		return 0.0f * sign;
	case 1:
		return sign * dos_bits_float((uint32_t)(test_rand(rng) % 0x7fffffu) + 1u); /* fp32 subnormal */
	case 2:
		return sign * near_fp16_max[test_rand(rng) % 7];
	case 3:
		return sign * (float)ldexp(test_uniform(rng), -14 - (int)(test_rand(rng) % 11)); /* fp16 subnormal */
	case 4:
		if (nonfinite)
			return (test_rand(rng) & 1) ? sign * INFINITY : (sign > 0 ? NAN : -NAN);
		return sign;
	case 5:
		return sign * 1e30f;
	case 6:
		return sign * 1e-30f;
	default:
		return (float)(test_normal(rng) * pow(10.0, test_uniform(rng) * 4.0 - 3.0));
	}
}

static inline int same_f32(float a, float b)
{
	return dos_float_bits(a) == dos_float_bits(b) || (isnan(a) && isnan(b));
}

static inline void compare_f32(const char *what, const float *a, const float *b, size_t n, const char *ctx)
{
	for (size_t i = 0; i < n; i++)
		CHECK(same_f32(a[i], b[i]), "%s: %s[%zu]: reference %#010x, candidate %#010x", ctx, what, i,
		      dos_float_bits(a[i]), dos_float_bits(b[i]));
}

static inline void compare_elems(const char *what, const void *a, const void *b, enum dos_dtype t, size_t n,
				 const char *ctx)
{
	for (size_t i = 0; i < n; i++) {
		float x = dos_load_elem(a, i, t), y = dos_load_elem(b, i, t);
		int same = t == DOS_FP32
				   ? same_f32(x, y)
				   : ((const uint16_t *)a)[i] == ((const uint16_t *)b)[i] || (isnan(x) && isnan(y));
		CHECK(same, "%s: %s[%zu] (%s): reference %a, candidate %a", ctx, what, i, dos_dtype_name(t), (double)x,
		      (double)y);
	}
}

#endif /* DOS_PARITY_UTIL_H */
