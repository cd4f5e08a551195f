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
 * source buffers) at `source_offset` to destination buffer `destination` (index among its
 * destination buffers: 0 when there is one) at `destination_offset`. */
struct dos_flat_piece {
	uint32_t source, destination;
	uint64_t source_offset, destination_offset, len;
};

/* The codelet's argument: dtypes, then `npieces` pieces (a variable-size block). */
struct dos_flat_copy_args {
	enum dos_dtype source_dtype, destination_dtype;
	uint32_t npieces;
	uint32_t ndestinations;
	struct dos_flat_piece pieces[];
};

void _dos_flat_copy_cpu(void *const *destinations, const void *const *sources, const struct dos_flat_copy_args *args);

/* One chunk of a subgroup's gradient in a data-parallel job (DOS_DP_SCATTER): the
 * `npartials` ranks' partial gradients of its `len` elements, in rank order, summed in
 * fp32 one after the other (the same additions in the same order whatever the number of
 * elements), the sum rounded once into `out` (round to nearest even). */
void _dos_grad_sum_cpu(void *out, enum dos_dtype out_dtype, const void *const *partials, uint32_t npartials,
		       enum dos_dtype partial_dtype, uint64_t len);

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
cudaError_t _dos_flat_copy_cuda(void *const *destinations, const void *const *sources,
				const struct dos_flat_copy_args *args, cudaStream_t stream);
#ifdef __cplusplus
}
#endif
#endif

#endif /* DOS_FLAT_KERNELS_H */
