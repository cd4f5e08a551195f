/* CUDA side of flat_kernels.h: one grid-stride launch per piece (a copy task has a handful
 * of pieces: one per tensor or subgroup it straddles). */
#include "cuda_grid.h"
#include "flat_kernels.h"
#include "numerics.h"

static __global__ void flat_copy_piece(void *destination, enum dos_dtype dst_dtype, const void *source,
				       enum dos_dtype src_dtype, uint64_t len)
{
	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < len;
	     i += (uint64_t)gridDim.x * blockDim.x)
		dos_store_elem(destination, i, dst_dtype, dos_load_elem(source, i, src_dtype));
}

extern "C" cudaError_t _dos_flat_copy_cuda(void *const *destinations, const void *const *sources,
					   const struct dos_flat_copy_args *args, cudaStream_t stream)
{
	size_t dst_size = dos_dtype_size(args->destination_dtype), src_size = dos_dtype_size(args->source_dtype);
	for (uint32_t k = 0; k < args->npieces; k++) {
		const struct dos_flat_piece *p = &args->pieces[k];
		char *dst = (char *)destinations[p->destination] + p->destination_offset * dst_size;
		const char *src = (const char *)sources[p->source] + p->source_offset * src_size;
		if (args->source_dtype == args->destination_dtype) {
			cudaError_t err =
				cudaMemcpyAsync(dst, src, p->len * dst_size, cudaMemcpyDeviceToDevice, stream);
			if (err != cudaSuccess)
				return err;
			continue;
		}
		flat_copy_piece<<<_dos_cuda_blocks_for(p->len, 256), 256, 0, stream>>>(dst, args->destination_dtype,
										       src, args->source_dtype, p->len);
		cudaError_t err = cudaGetLastError();
		if (err != cudaSuccess)
			return err;
	}
	return cudaSuccess;
}
