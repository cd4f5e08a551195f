/* Copies between the two partitions of the flat parameter space: per-tensor buffers (what
 * forward and backward use) and per-subgroup slices (what the optimizer updates). A
 * subgroup slice is a contiguous range of the flat space that may start and end inside
 * tensors, so one copy task reads several sources, each through a list of pieces. The
 * same codelet gathers a subgroup's gradient from the tensor gradients (narrowing fp32 to
 * the gradient dtype) and refreshes a tensor's working weights from the subgroups'
 * updated weights (widening to fp32). Conversions round to nearest even, identically on
 * every device (numerics.h). */
#ifndef DOS_FLAT_KERNELS_H
#define DOS_FLAT_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "dos.h"

/* One contiguous run: `len` elements from source buffer `source` (index among the task's
 * source buffers) at `source_offset` to the destination at `destination_offset`. */
struct dos_flat_piece {
	uint32_t source;
	uint32_t pad_;
	uint64_t source_offset, destination_offset, len;
};

/* The codelet's argument: dtypes, then `npieces` pieces (a variable-size block). */
struct dos_flat_copy_args {
	enum dos_dtype source_dtype, destination_dtype;
	uint32_t npieces;
	uint32_t pad_;
	struct dos_flat_piece pieces[];
};

void _dos_flat_copy_cpu(void *destination, const void *const *sources, const struct dos_flat_copy_args *args);

/* The token batch of one micro-batch: for each of the `nseq` sequences, `len` bytes of the
 * corpus from starts[s] become ids (and the next `len` bytes, shifted by one, targets).
 * CPU only, like a real data loader: the batch then travels to wherever forward runs. */
void _dos_batch_cpu(const uint8_t *corpus, const uint64_t *starts, uint32_t nseq, uint32_t len, int32_t *ids,
		    int32_t *targets);

#ifdef DOS_USE_CUDA
#include <cuda_runtime.h>
#ifdef __cplusplus
extern "C" {
#endif
cudaError_t _dos_flat_copy_cuda(void *destination, const void *const *sources, const struct dos_flat_copy_args *args,
				cudaStream_t stream);
#ifdef __cplusplus
}
#endif
#endif

#endif /* DOS_FLAT_KERNELS_H */
