/* Helpers shared by the codelet files (and the argument checks by the task graph and
 * the policies): argument checks on handles and contexts, task construction, and the
 * CUDA error path. */
#ifndef DOS_CODELET_UTIL_H
#define DOS_CODELET_UTIL_H

/* config.h defines DOS_USE_CUDA: every codelet file includes this header first, and
 * without it the codelets silently lose their CUDA implementations. */
#include "config.h"

#include <stddef.h>
#include <stdint.h>

#include "dos.h"

/* Checks that `h` (named `name` in messages) is registered data whose elements of
 * `elemsize` bytes lie in one contiguous block: a vector, a variable (of a whole number of
 * elements), or a matrix, block or tensor without padding between rows, planes or cubes
 * (every copy StarPU allocates itself is packed; the home copy must be too). Stores the
 * element count in *count. Returns 0 or -EINVAL naming the handle, its interface, and
 * what is wrong (fp64 data shows as 8-byte elements where 4 or 2 were expected). */
int _dos_check_contiguous(const char *function, const char *name, starpu_data_handle_t h, size_t elemsize,
			  uint32_t *count);
/* The elements of a handle that _dos_check_contiguous accepted, of `elemsize` bytes. */
uint32_t _dos_handle_count(starpu_data_handle_t h, size_t elemsize);
/* Inside a codelet: the first element and the element count of buffer `iface`, a data
 * interface of the kinds _dos_check_contiguous accepts (checked at task creation; a
 * padded copy here would be a StarPU bug, which aborts). */
void *_dos_buffer_ptr(void *iface);
uint32_t _dos_buffer_count(void *iface, size_t elemsize);
/* Checks that `dtype` is a valid enum dos_dtype and, when `sixteen_bit_only`, fp16 or bf16. */
int _dos_check_dtype(const char *function, const char *name, enum dos_dtype dtype, int sixteen_bit_only);
/* Checks that the n handles are pairwise distinct (an in-place alias would race). */
int _dos_check_distinct(const char *function, starpu_data_handle_t *handles, const char *const *names, int n);
/* Checks that StarPU runs and that `sched_ctx` (named `name`) is one of its scheduling
 * contexts: StarPU indexes its context table without checking, so a bad id would read
 * past it or submit tasks nowhere. */
int _dos_check_sched_ctx(const char *function, const char *name, unsigned sched_ctx);

/* A new task of `cl` whose cl_arg is a private copy of args[0 .. size) freed with it.
 * Returns NULL (after recording -ENOMEM) when memory runs out. */
struct starpu_task *_dos_task_with_args(const char *function, struct starpu_codelet *cl, const void *args, size_t size);

/* Defines the perfmodel "dos_NAME" (non-linear regression on the data size, per
 * implementation) and the codelet _dos_NAME_codelet with CPU_FN and, when built with
 * CUDA, CUDA_FN (asynchronous on StarPU's stream); the remaining arguments are the
 * access modes (none for a variable number of buffers). */
#define DOS_DEFINE_CODELET(NAME, CPU_FN, CUDA_FN, NBUFFERS, ...) \
	DOS_DEFINE_CODELET_SIZED(NAME, CPU_FN, CUDA_FN, NULL, NBUFFERS, __VA_ARGS__)

/* The same, with the regression on SIZE_FN(task, nimpl) instead of the data size
 * (the model's products regress on their floating-point operations). */
#define DOS_DEFINE_CODELET_SIZED(NAME, CPU_FN, CUDA_FN, SIZE_FN, NBUFFERS, ...) \
	DOS_DEFINE_CODELET_MODELLED(NAME, "dos_" #NAME, CPU_FN, CUDA_FN, SIZE_FN, NBUFFERS, __VA_ARGS__)

/* The same, for a codelet named CL_NAME (what traces and task names show) whose perfmodel
 * is "dos_NAME": two codelets of the same kernels can then keep separate models (the
 * model's products in fp32 and in 16-bit compute run at very different rates). */
#define DOS_DEFINE_CODELET_MODELLED(NAME, CL_NAME, CPU_FN, CUDA_FN, SIZE_FN, NBUFFERS, ...) \
	static struct starpu_perfmodel NAME##_model = {                                     \
		.type = STARPU_NL_REGRESSION_BASED,                                         \
		.symbol = "dos_" #NAME,                                                     \
		.size_base = SIZE_FN,                                                       \
	};                                                                                  \
	struct starpu_codelet _dos_##NAME##_codelet = {                                     \
		.name = CL_NAME,                                                            \
		.cpu_funcs = {CPU_FN},                                                      \
		.cpu_funcs_name = {#CPU_FN},                                                \
		DOS_CUDA_IMPLEMENTATION(CUDA_FN).nbuffers = (NBUFFERS),                     \
		.modes = {__VA_ARGS__},                                                     \
		.model = &NAME##_model,                                                     \
	}

#if defined(DOS_USE_CUDA)
#define DOS_CUDA_IMPLEMENTATION(CUDA_FN) .cuda_funcs = {CUDA_FN}, .cuda_flags = {STARPU_CUDA_ASYNC},
#elif defined(STARPU_SIMGRID)
/* Simulated machines: StarPU places a task on a simulated GPU only if its codelet has a
 * CUDA implementation, and takes its duration from the perfmodel without running it. */
void _dos_simulated_cuda(void *buffers[], void *cl_arg);
#define DOS_CUDA_IMPLEMENTATION(CUDA_FN) .cuda_funcs = {_dos_simulated_cuda},
#else
#define DOS_CUDA_IMPLEMENTATION(CUDA_FN)
#endif

#ifdef DOS_USE_CUDA
#include <cuda_runtime.h>
/* Aborts through StarPU when a kernel launch failed: inside a codelet there is no caller
 * to return to, and continuing would hand stale data to the next task. */
#define DOS_CUDA_CHECK(call)                                   \
	do {                                                   \
		cudaError_t dos_status_ = (call);              \
		if (dos_status_ != cudaSuccess)                \
			STARPU_CUDA_REPORT_ERROR(dos_status_); \
	} while (0)
/* The same for cuBLAS calls (the model's products). */
#define DOS_CUBLAS_CHECK(call)                                        \
	do {                                                          \
		cublasStatus_t dos_blas_status_ = (call);             \
		if (dos_blas_status_ != CUBLAS_STATUS_SUCCESS)        \
			STARPU_CUBLAS_REPORT_ERROR(dos_blas_status_); \
	} while (0)
#endif

#endif /* DOS_CODELET_UTIL_H */
