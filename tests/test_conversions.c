/* The 16-bit conversions of numerics.h against two independent references: the x86 F16C
 * instructions (bitwise, NaN included) and the compiler's software _Float16 and a
 * double-precision nearest-even bf16 rounding (every non-NaN value). A wrong rounding
 * mode, a lost subnormal or a misplaced overflow threshold fails here. */
#include <immintrin.h>

#include "numerics.h"
#include "test_util.h"

#define F16C_TARGET __attribute__((target("avx2,f16c")))

F16C_TARGET static float f16c_widen(uint16_t h)
{
	return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

F16C_TARGET static uint16_t f16c_narrow(float x)
{
	return (uint16_t)_mm_cvtsi128_si32(_mm_cvtps_ph(_mm_set_ss(x), _MM_FROUND_TO_NEAREST_INT));
}

static uint16_t soft_narrow(float x)
{
	_Float16 h = (_Float16)x;
	uint16_t u;
	memcpy(&u, &h, 2);
	return u;
}

/* Nearest-even bf16 by comparing distances in double: independent of the integer trick. */
static uint16_t reference_bf16(float x)
{
	uint32_t u = dos_float_bits(x);
	uint16_t lo = (uint16_t)(u >> 16);
	if ((u & 0xffffu) == 0)
		return lo;
	uint16_t hi = (uint16_t)(lo + 1); /* next magnitude away from zero */
	double dlo = fabs((double)x - (double)dos_bf16_to_float(lo));
	double dhi = fabs((double)dos_bf16_to_float(hi) - (double)x);
	if ((hi & 0x7fffu) == 0x7f80u) /* rounding up reaches inf: the distance is to 2^128 */
		dhi = fabs(ldexp(1.0, 128) * (x < 0 ? -1 : 1) - (double)x);
	if (dlo < dhi)
		return lo;
	if (dhi < dlo)
		return hi;
	return (lo & 1u) ? hi : lo;
}

int main(void)
{
	int have_f16c = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx2");
	if (!have_f16c)
		printf("no F16C on this CPU: comparing with the software reference only\n");

	/* fp16 -> fp32, all 65536 values. */
	for (uint32_t h = 0; h <= 0xffffu; h++) {
		float ours = dos_fp16_to_float((uint16_t)h);
		_Float16 ref16;
		uint16_t h16 = (uint16_t)h;
		memcpy(&ref16, &h16, 2);
		float soft = (float)ref16;
		if (!isnan(soft))
			CHECK(dos_float_bits(ours) == dos_float_bits(soft), "fp16 %#06x: ours %a, software %a", h,
			      (double)ours, (double)soft);
		else
			CHECK(isnan(ours), "fp16 %#06x should widen to NaN, got %a", h, (double)ours);
		if (have_f16c)
			CHECK(dos_float_bits(ours) == dos_float_bits(f16c_widen((uint16_t)h)),
			      "fp16 %#06x: ours %#010x, F16C %#010x", h, dos_float_bits(ours),
			      dos_float_bits(f16c_widen((uint16_t)h)));
		/* widening then narrowing is the identity (NaN: same quiet NaN) */
		uint16_t back = dos_float_to_fp16(ours);
		if (!isnan(ours))
			CHECK(back == h, "fp16 %#06x does not round-trip (%#06x)", h, back);
	}

	/* fp32 -> fp16 and bf16: a stride through all 2^32 bit patterns plus the edges. */
	static const uint32_t edges[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x007fffffu, 0x33000000u, 0x33000001u,
					 0x337fffffu, 0x33800000u, 0x38800000u, 0x387fffffu, 0x477fe000u, 0x477fefffu,
					 0x477ff000u, 0x477ff001u, 0x47800000u, 0x7f7fffffu, 0x7f800000u, 0xff800000u,
					 0x7f800001u, 0x7fc00000u, 0xffc00001u, 0x7fbfffffu, 0x3f800000u, 0x3f801000u,
					 0x3f803000u, 0x3f808000u, 0x3f818000u};
	size_t checked = 0;
	for (uint64_t k = 0;; k++) {
		uint32_t u;
		if (k < sizeof edges / sizeof edges[0])
			u = edges[k];
		else {
			uint64_t s = (k - sizeof edges / sizeof edges[0]) * 257u;
			if (s > 0xffffffffu)
				break;
			u = (uint32_t)s;
		}
		float x = dos_bits_float(u);
		uint16_t h = dos_float_to_fp16(x);
		if (have_f16c)
			CHECK(h == f16c_narrow(x), "fp32 %#010x -> fp16: ours %#06x, F16C %#06x", u, h, f16c_narrow(x));
		if (!isnan(x))
			CHECK(h == soft_narrow(x), "fp32 %#010x -> fp16: ours %#06x, software %#06x", u, h,
			      soft_narrow(x));
		else
			CHECK((h & 0x7e00u) == 0x7e00u && (h & 0x8000u) == ((u >> 16) & 0x8000u),
			      "fp32 NaN %#010x -> fp16 %#06x is not a quiet NaN of the same sign", u, h);
		uint16_t b = dos_float_to_bf16(x);
		if (!isnan(x))
			CHECK(b == reference_bf16(x), "fp32 %#010x -> bf16: ours %#06x, reference %#06x", u, b,
			      reference_bf16(x));
		else
			CHECK((b & 0x7fc0u) == 0x7fc0u && (b & 0x8000u) == ((u >> 16) & 0x8000u),
			      "fp32 NaN %#010x -> bf16 %#06x is not a quiet NaN of the same sign", u, b);
		CHECK(dos_float_bits(dos_bf16_to_float(b)) == ((uint32_t)b << 16), "bf16 widening of %#06x", b);
		checked++;
	}
	printf("conversions: 65536 fp16 widenings, %zu fp32 narrowings to fp16 and bf16%s: all match\n", checked,
	       have_f16c ? " (F16C and software references)" : " (software references)");
	return 0;
}
