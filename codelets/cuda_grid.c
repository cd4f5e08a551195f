/* The cap on the CUDA kernels' grids (cuda_grid.h): DOS_CUDA_MAX_BLOCKS, read once. */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "cuda_grid.h"
#include "errors.h"

#define MAX_CAP 2147483647L /* gridDim.x's limit */

static size_t cap_from_environment(void)
{
	const char *s = getenv("DOS_CUDA_MAX_BLOCKS");
	if (!s || !*s)
		return DOS_CUDA_DEFAULT_MAX_BLOCKS;
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || *end || v < 1 || v > MAX_CAP) {
		_dos_warn("DOS_CUDA_MAX_BLOCKS = '%s' is not an integer in [1, %ld]; using %d", s, MAX_CAP,
			  DOS_CUDA_DEFAULT_MAX_BLOCKS);
		return DOS_CUDA_DEFAULT_MAX_BLOCKS;
	}
	return (size_t)v;
}

size_t _dos_cuda_max_blocks(void)
{
	static atomic_size_t cap; /* 0 until read */
	size_t c = atomic_load(&cap);
	if (!c) {
		c = cap_from_environment();
		atomic_store(&cap, c); /* racing first callers read the same value */
	}
	return c;
}

unsigned _dos_cuda_blocks_for(size_t work_items, unsigned threads_per_block)
{
	size_t blocks = (work_items + threads_per_block - 1) / threads_per_block;
	size_t cap = _dos_cuda_max_blocks();
	return (unsigned)(blocks == 0 ? 1 : blocks < cap ? blocks : cap);
}
