/* The compute kernels behind the codelets, on plain pointers and sizes so that tests and
 * benchmarks can call them without StarPU. One table per CPU instruction set; every table
 * gives bit-for-bit the results of numerics.h. */
#ifndef DOS_KERNELS_H
#define DOS_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "dos.h"

#ifdef __cplusplus
extern "C" {
#endif

/* weight16 may be NULL (fp32 training); weight_dtype is then ignored. Returns the enum
 * dos_nonfinite_bits of the p, m and v it wrote (0 when all are finite). */
typedef uint32_t (*_dos_adam_fn)(const struct dos_adam_step *step, float *master, float *m, float *v, const void *grad,
				 enum dos_dtype grad_dtype, void *weight16, enum dos_dtype weight_dtype, size_t n);
typedef void (*_dos_cast_fn)(const float *master, void *weight16, enum dos_dtype weight_dtype, size_t n);
typedef void (*_dos_grad_stats_fn)(const void *grad, enum dos_dtype grad_dtype, size_t n, struct dos_grad_stats *out);
typedef void (*_dos_grad_scale_fn)(void *grad, enum dos_dtype grad_dtype, size_t n, float factor);

struct _dos_cpu_kernels {
	enum dos_cpu_isa isa;
	_dos_adam_fn adam;
	_dos_cast_fn cast;
	_dos_grad_stats_fn grad_stats;
	_dos_grad_scale_fn grad_scale;
};

extern const struct _dos_cpu_kernels _dos_cpu_kernels_scalar;
extern const struct _dos_cpu_kernels _dos_cpu_kernels_avx2;
extern const struct _dos_cpu_kernels _dos_cpu_kernels_avx512;

/* The variant DOS_CPU_ISA asks for into *isa (DOS_CPU_ISA_AUTO when unset or empty): 0,
 * or -EINVAL (not a variant's name) or -ENOTSUP (not on this CPU) with why[] naming the
 * value and *isa DOS_CPU_ISA_AUTO. The kernels warn and use auto; dos-train refuses. */
int _dos_cpu_isa_from_env(enum dos_cpu_isa *isa, char *why, size_t size);

/* The table selected by dos_cpu_isa_select() or DOS_CPU_ISA, else the best supported. */
const struct _dos_cpu_kernels *_dos_cpu_kernels_selected(void);

/* Scalar pieces the SIMD variants reuse for their tails and reductions. */
uint32_t _dos_adam_scalar_range(const struct dos_adam_step *step, float *master, float *m, float *v, const void *grad,
				enum dos_dtype grad_dtype, void *weight16, enum dos_dtype weight_dtype, size_t begin,
				size_t end);
/* Whether x[0 .. n) holds an inf or NaN (the SIMD update's cold path). */
int _dos_nonfinite_scan(const float *x, size_t n);
void _dos_cast_scalar_range(const float *master, void *weight16, enum dos_dtype weight_dtype, size_t begin, size_t end);
void _dos_grad_scale_scalar_range(void *grad, enum dos_dtype grad_dtype, size_t begin, size_t end, float factor);
/* Adds the squares of grad[begin, end) (within one segment, begin a multiple of
 * DOS_STATS_LANES from the segment start) to lane[(i - begin) % DOS_STATS_LANES]. */
void _dos_grad_stats_scalar_lanes(const void *grad, enum dos_dtype grad_dtype, size_t begin, size_t end, double *lane);
/* Fills *out from the sum of squares (nonfinite is exactly "the sum is not finite": no
 * finite float gradient can overflow a double sum of squares). */
void _dos_grad_stats_finish(double sum_sq, struct dos_grad_stats *out);

#ifdef DOS_USE_CUDA
#include <cuda_runtime.h>
/* Launch on `stream`; return the launch status (kernels run asynchronously).
 * _dos_adam_cuda writes the enum dos_nonfinite_bits of what it wrote to the device word
 * *nonfinite_dev when that is not NULL (cleared, then OR-ed by the threads that saw one). */
cudaError_t _dos_adam_cuda(const struct dos_adam_step *step, float *master, float *m, float *v, const void *grad,
			   enum dos_dtype grad_dtype, void *weight16, enum dos_dtype weight_dtype, size_t n,
			   uint32_t *nonfinite_dev, cudaStream_t stream);
cudaError_t _dos_cast_cuda(const float *master, void *weight16, enum dos_dtype weight_dtype, size_t n,
			   cudaStream_t stream);
cudaError_t _dos_grad_stats_cuda(const void *grad, enum dos_dtype grad_dtype, size_t n, struct dos_grad_stats *out_dev,
				 cudaStream_t stream);
cudaError_t _dos_grad_scale_cuda(void *grad, enum dos_dtype grad_dtype, size_t n, float factor, cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif

#endif /* DOS_KERNELS_H */
