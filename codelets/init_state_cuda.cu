/* CUDA side of init_state.h: one thread per parameter, the arithmetic of the CPU's. */
#include "cuda_grid.h"
#include "init_state.h"

static __global__ void init_state_kernel(struct dos_init_layout l, uint64_t begin, float *master, float *m, float *v,
					 uint64_t n)
{
	for (uint64_t j = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; j < n;
	     j += (uint64_t)gridDim.x * blockDim.x) {
		master[j] = dos_init_weight(&l, begin + j);
		m[j] = 0.0f;
		v[j] = 0.0f;
	}
}

extern "C" cudaError_t _dos_init_state_cuda(const struct dos_init_layout *l, uint64_t begin, float *master, float *m,
					    float *v, uint64_t n, cudaStream_t stream)
{
	if (n == 0)
		return cudaSuccess;
	init_state_kernel<<<_dos_cuda_blocks_for(n, 256), 256, 0, stream>>>(*l, begin, master, m, v, n);
	return cudaGetLastError();
}
