/* The launch grid of every CUDA kernel's grid-stride loop (kernels_cuda.cu, flat_cuda.cu,
 * model_cuda.cu): one thread per work item, up to a cap on the number of blocks.
 *
 * The cap is DOS_CUDA_MAX_BLOCKS (default 8192, enough to fill any current GPU several
 * times over), read once. Results never depend on it: a smaller grid only makes each
 * thread loop more. Tests set a small cap so that small sizes run every grid-stride loop
 * several times, which the GPU simulator can afford where a size past 8192 blocks costs
 * minutes; the same setting works on a real GPU. */
#ifndef DOS_CUDA_GRID_H
#define DOS_CUDA_GRID_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DOS_CUDA_DEFAULT_MAX_BLOCKS 8192

/* The cap in force: DOS_CUDA_MAX_BLOCKS, or the default when it is unset or not an
 * integer in [1, 2^31 - 1] (reported through dos_last_error and on stderr). */
size_t _dos_cuda_max_blocks(void);

/* Blocks of `threads_per_block` threads for `work_items` items: enough for one item per
 * thread, at least one, at most the cap. */
unsigned _dos_cuda_blocks_for(size_t work_items, unsigned threads_per_block);

#ifdef __cplusplus
}
#endif

#endif /* DOS_CUDA_GRID_H */
