/* The CUDA flat copy (codelets/flat_cuda.cu: gathers a subgroup's gradient from the
 * tensors, refreshes a tensor's weights from the subgroups) against the CPU one, bit for
 * bit (any NaN equals any NaN), for every pair of source and destination dtypes (a
 * conversion kernel, or a device copy when they are equal): several sources at unaligned
 * starts, pieces of odd lengths and offsets in no particular order, one piece that runs
 * the grid-stride loop several times over the grid in force (DOS_CUDA_MAX_BLOCKS), and
 * destination elements no piece covers, which must keep their content. Exits 77
 * (skipped) without a GPU. */
#include "config.h"
#include "test_util.h"

#ifndef DOS_USE_CUDA
int main(void)
{
	printf("built without CUDA: skipped\n");
	return TEST_SKIP;
}
#else
#include <cuda_runtime.h>

#include "cuda_grid.h"
#include "flat_kernels.h"
#include "parity_util.h"

#define NSOURCES 3
#define NPIECES 6

static void check_pair(enum dos_dtype st, enum dos_dtype dt, size_t long_len, uint64_t seed)
{
	const size_t ss = dos_dtype_size(st), ds = dos_dtype_size(dt);
	/* source k starts `start[k]` elements past an allocation's start */
	const size_t source_len[NSOURCES] = {40, long_len + 9, 7};
	const size_t start[NSOURCES] = {1, 0, 3};
	/* {source, source_offset, destination_offset, len}: out of source order, one piece
	 * reading a source twice, gaps in the destination */
	const struct dos_flat_piece shape[NPIECES] = {
		{.source = 2, .source_offset = 1, .destination_offset = 0, .len = 5},
		{.source = 0, .source_offset = 3, .destination_offset = 5, .len = 33},
		{.source = 1, .source_offset = 9, .destination_offset = 38, .len = long_len},
		{.source = 0, .source_offset = 0, .destination_offset = 41 + long_len, .len = 1},
		{.source = 1, .source_offset = 0, .destination_offset = 42 + long_len, .len = 9},
		{.source = 0, .source_offset = 37, .destination_offset = 60 + long_len, .len = 3},
	};
	const size_t dst_len = 64 + long_len; /* [38 + long_len, 41 + long_len) and more: no piece */

	struct dos_flat_copy_args *args = test_malloc(sizeof *args + sizeof shape);
	args->source_dtype = st;
	args->destination_dtype = dt;
	args->npieces = NPIECES;
	memcpy(args->pieces, shape, sizeof shape);

	uint64_t rng = seed;
	void *src[NSOURCES], *dsrc[NSOURCES], *dsrc_base[NSOURCES];
	for (int k = 0; k < NSOURCES; k++) {
		src[k] = test_malloc(source_len[k] * ss);
		for (size_t i = 0; i < source_len[k]; i++)
			dos_store_elem(src[k], i, st, value_mix(&rng, 1));
		CUDA_OK(cudaMalloc(&dsrc_base[k], (start[k] + source_len[k]) * ss));
		dsrc[k] = (char *)dsrc_base[k] + start[k] * ss;
		CUDA_OK(cudaMemcpy(dsrc[k], src[k], source_len[k] * ss, cudaMemcpyHostToDevice));
	}
	/* the destination starts as a pattern (finite in every dtype) that only pieces replace */
	unsigned char *dst = test_malloc(dst_len * ds), *got = test_malloc(dst_len * ds);
	memset(dst, 0x3c, dst_len * ds);
	void *ddst_base, *ddst;
	CUDA_OK(cudaMalloc(&ddst_base, (dst_len + 1) * ds));
	ddst = (char *)ddst_base + ds; /* unaligned for vector accesses */
	CUDA_OK(cudaMemcpy(ddst, dst, dst_len * ds, cudaMemcpyHostToDevice));

	void *const host_destination[] = {dst}, *const device_destination[] = {ddst}; /* one: piece.destination 0 */
	_dos_flat_copy_cpu(host_destination, (const void *const *)src, args);
	CUDA_OK(_dos_flat_copy_cuda(device_destination, (const void *const *)dsrc, args, 0));
	CUDA_OK(cudaDeviceSynchronize());
	CUDA_OK(cudaMemcpy(got, ddst, dst_len * ds, cudaMemcpyDeviceToHost));
	char ctx[128];
	snprintf(ctx, sizeof ctx, "cuda flat copy %s -> %s, %zu elements", dos_dtype_name(st), dos_dtype_name(dt),
		 dst_len);
	compare_elems("destination", dst, got, dt, dst_len, ctx);

	for (int k = 0; k < NSOURCES; k++) {
		CUDA_OK(cudaFree(dsrc_base[k]));
		free(src[k]);
	}
	CUDA_OK(cudaFree(ddst_base));
	free(dst), free(got), free(args);
}

int main(void)
{
	int devices = 0;
	if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
		printf("no CUDA device: skipped\n");
		return TEST_SKIP;
	}
	/* one element a thread: past two passes of the grid in force */
	const size_t max_blocks = _dos_cuda_max_blocks();
	const size_t long_len = 2 * max_blocks * 256 + 3;
	for (int st = DOS_FP32; st <= DOS_BF16; st++)
		for (int dt = DOS_FP32; dt <= DOS_BF16; dt++)
			check_pair((enum dos_dtype)st, (enum dos_dtype)dt, long_len,
				   0xf1a7ULL + (uint64_t)(3 * st + dt));
	printf("CUDA flat copy == CPU for 3 x 3 dtype pairs, %d pieces from %d sources, the longest %zu elements "
	       "(grid of %zu blocks)\n",
	       NPIECES, NSOURCES, long_len, max_blocks);
	return 0;
}
#endif
