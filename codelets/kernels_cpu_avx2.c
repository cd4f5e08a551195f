/* AVX2 + FMA + F16C vector primitives (8 floats); this file alone is compiled with those
 * flags, and cpu_dispatch.c picks it at run time. F16C rounds to nearest even and quiets
 * NaN exactly as numerics.h; bf16 rounding is done with integers as there. */
#include <immintrin.h>
#include <stdint.h>

#include "dos.h"

#define SIMD_ISA DOS_CPU_ISA_AVX2
#define SIMD_TABLE _dos_cpu_kernels_avx2
#define SIMD_WIDTH 8
#define PRIMITIVE static inline __attribute__((always_inline))

typedef __m256 vfloat;
#define v_set1 _mm256_set1_ps
#define v_zero _mm256_setzero_ps
#define v_load _mm256_loadu_ps
#define v_store _mm256_storeu_ps
#define v_add _mm256_add_ps
#define v_sub _mm256_sub_ps
#define v_mul _mm256_mul_ps
#define v_div _mm256_div_ps
#define v_sqrt _mm256_sqrt_ps
#define v_fmadd _mm256_fmadd_ps

PRIMITIVE vfloat v_load_elems(const void *base, size_t i, enum dos_dtype t)
{
	if (t == DOS_FP16)
		return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + i)));
	if (t == DOS_BF16) {
		__m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + i)));
		return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
	}
	return _mm256_loadu_ps((const float *)base + i);
}

PRIMITIVE __m128i float_to_bf16(vfloat x)
{
	__m256i u = _mm256_castps_si256(x);
	__m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
	__m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
	__m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x0040));
	__m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
	__m256i r = _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
	/* every lane is <= 0xffff, so the unsigned saturation of packus never triggers */
	return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0xd8));
}

PRIMITIVE void v_store_elems(void *base, size_t i, enum dos_dtype t, vfloat x)
{
	if (t == DOS_FP16)
		_mm_storeu_si128((__m128i *)((uint16_t *)base + i),
				 _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
	else if (t == DOS_BF16)
		_mm_storeu_si128((__m128i *)((uint16_t *)base + i), float_to_bf16(x));
	else
		_mm256_storeu_ps((float *)base + i, x);
}

PRIMITIVE void v_square_accumulate(double *acc, int i, vfloat x)
{
	__m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
	__m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
	_mm256_storeu_pd(acc + i, _mm256_add_pd(_mm256_loadu_pd(acc + i), _mm256_mul_pd(lo, lo)));
	_mm256_storeu_pd(acc + i + 4, _mm256_add_pd(_mm256_loadu_pd(acc + i + 4), _mm256_mul_pd(hi, hi)));
}

#include "kernels_cpu_simd.h"
