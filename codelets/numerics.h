/* The per-element arithmetic of every codelet, written once. The scalar CPU kernels and
 * the CUDA kernels call these functions; the SIMD kernels reproduce them lane by lane and
 * use them for their tails. Compiled with -ffp-contract=off (C) and -fmad=false (nvcc):
 * the only fused multiply-adds are the explicit fmaf calls, at the places where
 * torch's CPU kernels fuse, so results match torch and do not depend on the device. */
#ifndef DOS_NUMERICS_H
#define DOS_NUMERICS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "dos.h"

#ifdef __CUDACC__
#define DOS_HD __host__ __device__ __forceinline__
#else
#define DOS_HD static inline __attribute__((always_inline))
#endif

DOS_HD uint32_t dos_float_bits(float x)
{
	uint32_t u;
	memcpy(&u, &x, sizeof u);
	return u;
}

DOS_HD float dos_bits_float(uint32_t u)
{
	float x;
	memcpy(&x, &u, sizeof x);
	return x;
}

/* ---- 16-bit conversions: exact widening, round-to-nearest-even narrowing ------------ */

DOS_HD float dos_bf16_to_float(uint16_t h)
{
	return dos_bits_float((uint32_t)h << 16);
}

/* NaN stays NaN and becomes quiet, keeping the upper payload bits (as F16C does). */
DOS_HD uint16_t dos_float_to_bf16(float x)
{
	uint32_t u = dos_float_bits(x);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x0040u);
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

DOS_HD float dos_fp16_to_float(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t exp = (h >> 10) & 0x1fu;
	uint32_t mant = h & 0x3ffu;
	if (exp == 0x1fu) /* inf, or nan made quiet with its payload kept (as F16C does) */
		return dos_bits_float(sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0u));
	if (exp != 0)
		return dos_bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
	/* zero or subnormal: mant * 2^-24, exact in float */
	float mag = (float)mant * 5.9604644775390625e-8f;
	return sign ? -mag : mag;
}

/* Round to nearest even; overflow gives inf; NaN gives a quiet NaN with the upper payload
 * bits, exactly as x86 F16C (vcvtps2ph) does. */
DOS_HD uint16_t dos_float_to_fp16(float x)
{
	uint32_t u = dos_float_bits(x);
	uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
	uint32_t a = u & 0x7fffffffu;
	if (a > 0x7f800000u) /* nan */
		return (uint16_t)(sign | 0x7e00u | ((a & 0x7fffffu) >> 13));
	if (a >= 0x477ff000u) /* >= 65520 rounds to inf (also inf itself) */
		return (uint16_t)(sign | 0x7c00u);
	if (a >= 0x38800000u) {               /* normal half: exponent >= -14 */
		uint32_t r = a - 0x38000000u; /* rebias 127 -> 15 */
		r = r + 0xfffu + ((r >> 13) & 1u);
		return (uint16_t)(sign | (r >> 13));
	}
	if (a < 0x33000000u) /* below half of the smallest subnormal (2^-25): +-0 */
		return sign;
	/* subnormal half: value = mant * 2^-24, shift the full significand into place */
	uint32_t e = a >> 23; /* 102 .. 112 */
	uint32_t m = (a & 0x7fffffu) | 0x800000u;
	uint32_t shift = 126u - e; /* 14 .. 24: bits dropped below 2^-24 */
	uint32_t q = m >> shift;
	uint32_t rem = m & ((1u << shift) - 1u);
	uint32_t half = 1u << (shift - 1u);
	if (rem > half || (rem == half && (q & 1u)))
		q++;
	return (uint16_t)(sign | q);
}

/* An element widened to float (exact for every dtype). */
DOS_HD float dos_load_elem(const void *base, size_t i, enum dos_dtype t)
{
	if (t == DOS_FP16)
		return dos_fp16_to_float(((const uint16_t *)base)[i]);
	if (t == DOS_BF16)
		return dos_bf16_to_float(((const uint16_t *)base)[i]);
	return ((const float *)base)[i];
}

/* Stores x in element i of a buffer of dtype t (rounded to nearest even for 16 bits). */
DOS_HD void dos_store_elem(void *base, size_t i, enum dos_dtype t, float x)
{
	if (t == DOS_FP16)
		((uint16_t *)base)[i] = dos_float_to_fp16(x);
	else if (t == DOS_BF16)
		((uint16_t *)base)[i] = dos_float_to_bf16(x);
	else
		((float *)base)[i] = x;
}

/* x rounded to the nearest value of dtype t (to nearest even; itself for fp32), kept in a
 * float: what storing x as t and loading it back gives. */
DOS_HD float dos_round_elem(float x, enum dos_dtype t)
{
	if (t == DOS_FP16)
		return dos_fp16_to_float(dos_float_to_fp16(x));
	if (t == DOS_BF16)
		return dos_bf16_to_float(dos_float_to_bf16(x));
	return x;
}

/* ---- Adam ---------------------------------------------------------------------------- */

/* One element of one step, in the order torch.optim.Adam/AdamW (single-tensor CPU path)
 * computes it; `g` is the widened raw gradient. Updates *p, *m, *v. */
DOS_HD void dos_adam_element(const struct dos_adam_step *s, uint32_t decay_kind, float *p, float *m, float *v, float g)
{
	float pp = *p;
	g = g * s->grad_multiplier;
	if (decay_kind == DOS_DECAY_DECOUPLED)
		pp = pp * s->decay;
	else if (decay_kind == DOS_DECAY_L2)
		g = fmaf(pp, s->weight_decay, g); /* torch: grad.add(param, alpha=wd), fused */
	float mm = fmaf(s->lerp_coeff, g - *m, s->lerp_from_grad ? g : *m); /* torch: lerp_, fused */
	float vv = *v * s->beta2;                                           /* torch: mul_ */
	vv = fmaf(s->one_minus_beta2 * g, g, vv);                           /* torch: addcmul_, fused */
	float denom = sqrtf(vv) / s->bc2_sqrt + s->eps;                     /* eps after the division */
	pp = pp + (s->neg_step_size * mm) / denom;                          /* torch: addcdiv_ */
	*p = pp;
	*m = mm;
	*v = vv;
}

/* Which of an updated element's p, m and v are inf or NaN (enum dos_nonfinite_bits). */
DOS_HD uint32_t dos_nonfinite_bits(float p, float m, float v)
{
	return (isfinite(p) ? 0u : (uint32_t)DOS_NONFINITE_MASTER) | (isfinite(m) ? 0u : (uint32_t)DOS_NONFINITE_M) |
	       (isfinite(v) ? 0u : (uint32_t)DOS_NONFINITE_V);
}

/* ---- Gradient statistics ---------------------------------------------------------------
 * The sum of squares must have the same bits on every device, so its association is
 * fixed: the gradient is cut into segments of DOS_STATS_SEGMENT elements; inside a
 * segment, lane l (0 <= l < DOS_STATS_LANES) adds the squares of elements l, l + LANES,
 * l + 2*LANES, ... in that order, in double; the lanes are then folded pairwise (lane l +=
 * lane l + half, half = LANES/2, LANES/4, ..., 1); segment sums are added in order. Each
 * square of a float is exact in double, so an fma or a plain add give the same bits. */
#define DOS_STATS_LANES 256
#define DOS_STATS_SEGMENT (DOS_STATS_LANES * 64)

DOS_HD double dos_fold_lanes(double *lane)
{
	for (int half = DOS_STATS_LANES / 2; half >= 1; half /= 2)
		for (int l = 0; l < half; l++)
			lane[l] += lane[l + half];
	return lane[0];
}

#endif /* DOS_NUMERICS_H */
