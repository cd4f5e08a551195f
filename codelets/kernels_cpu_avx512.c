/* AVX-512 (F, BW, VL) vector primitives (16 floats); this file alone is compiled with
 * those flags, and cpu_dispatch.c picks it at run time. Conversions as in
 * kernels_cpu_avx2.c; not the AVX512-BF16 instructions, which flush subnormal inputs. */
#include <immintrin.h>
#include <stdint.h>

#include "dos.h"

#define SIMD_ISA DOS_CPU_ISA_AVX512
#define SIMD_TABLE _dos_cpu_kernels_avx512
#define SIMD_WIDTH 16
#define PRIMITIVE static inline __attribute__((always_inline))

typedef __m512 vfloat;
#define v_set1 _mm512_set1_ps
#define v_zero _mm512_setzero_ps
#define v_load _mm512_loadu_ps
#define v_store _mm512_storeu_ps
#define v_add _mm512_add_ps
#define v_sub _mm512_sub_ps
#define v_mul _mm512_mul_ps
#define v_div _mm512_div_ps
#define v_sqrt _mm512_sqrt_ps
#define v_fmadd _mm512_fmadd_ps

PRIMITIVE vfloat v_load_elems(const void *base, size_t i, enum dos_dtype t)
{
	if (t == DOS_FP16)
		return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)base + i)));
	if (t == DOS_BF16) {
		__m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)base + i)));
		return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
	}
	return _mm512_loadu_ps((const float *)base + i);
}

PRIMITIVE __m256i float_to_bf16(vfloat x)
{
	__m512i u = _mm512_castps_si512(x);
	__m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
	__m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
	__m512i quiet_nan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x0040));
	__mmask16 is_nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
	return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(is_nan, rounded, quiet_nan));
}

PRIMITIVE void v_store_elems(void *base, size_t i, enum dos_dtype t, vfloat x)
{
	if (t == DOS_FP16)
		_mm256_storeu_si256((__m256i *)((uint16_t *)base + i),
				    _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
	else if (t == DOS_BF16)
		_mm256_storeu_si256((__m256i *)((uint16_t *)base + i), float_to_bf16(x));
	else
		_mm512_storeu_ps((float *)base + i, x);
}

PRIMITIVE void v_square_accumulate(double *acc, int i, vfloat x)
{
	__m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
	__m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
	_mm512_storeu_pd(acc + i, _mm512_add_pd(_mm512_loadu_pd(acc + i), _mm512_mul_pd(lo, lo)));
	_mm512_storeu_pd(acc + i + 8, _mm512_add_pd(_mm512_loadu_pd(acc + i + 8), _mm512_mul_pd(hi, hi)));
}

#include "kernels_cpu_simd.h"
