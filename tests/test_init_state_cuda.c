/* The CUDA kernel that creates a subgroup's optimizer state (codelets/init_state_cuda.cu)
 * against the model's sequential initialisation, bit for bit: the tiny preset's every
 * parameter, in ranges that start and end inside tensors, from device buffers full of
 * garbage, one range long enough to run the grid-stride loop several times over the grid
 * in force (DOS_CUDA_MAX_BLOCKS), and the elements around each range untouched. Exits 77
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
#include "init_state.h"
#include "model.h"

int main(void)
{
	int devices = 0;
	if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
		printf("no CUDA device: skipped\n");
		return TEST_SKIP;
	}
	const struct dos_model_shape s = {256, 32, 2, 64, 2, 16}; /* the tiny preset */
	const uint64_t seeds[] = {42, UINT64_MAX};
	uint64_t P = _dos_model_param_count(&s, NULL);
	float *flat = test_malloc(P * sizeof(float)), *host = test_malloc(3 * P * sizeof(float));
	float *dev;
	CUDA_OK(cudaMalloc((void **)&dev, 3 * P * sizeof(float)));
	uint64_t long_len = 2 * _dos_cuda_max_blocks() * 256 + 3;
	if (long_len > P)
		long_len = P;
	for (size_t k = 0; k < sizeof seeds / sizeof *seeds; k++) {
		_dos_model_init_weights(&s, seeds[k], flat);
		struct dos_init_layout l = _dos_model_init_layout(&s, seeds[k]);
		/* [begin, end): the first parameters, runs across the first ln1 ([8704, 8736):
		 * from the positions to qkv) and ln2 ([12832, 12864): from o to fc1), the long one
		 * to the end, and all */
		const uint64_t ranges[][2] = {{0, 5}, {8700, 8741}, {12830, 12866}, {P - long_len, P}, {0, P}};
		for (size_t r = 0; r < sizeof ranges / sizeof *ranges; r++) {
			uint64_t begin = ranges[r][0], end = ranges[r][1];
			CUDA_OK(cudaMemset(dev, 0xff, 3 * P * sizeof(float)));
			CUDA_OK(_dos_init_state_cuda(&l, begin, dev + begin, dev + P + begin, dev + 2 * P + begin,
						     end - begin, 0));
			CUDA_OK(cudaDeviceSynchronize());
			CUDA_OK(cudaMemcpy(host, dev, 3 * P * sizeof(float), cudaMemcpyDeviceToHost));
			for (uint64_t i = 0; i < P; i++) {
				int inside = i >= begin && i < end;
				uint32_t want[3] = {inside ? dos_float_bits(flat[i]) : UINT32_MAX,
						    inside ? 0 : UINT32_MAX, inside ? 0 : UINT32_MAX};
				for (int a = 0; a < 3; a++)
					CHECK(dos_float_bits(host[a * P + i]) == want[a],
					      "seed %#llx range [%llu, %llu): array %d parameter %llu is %#x, expected "
					      "%#x",
					      (unsigned long long)seeds[k], (unsigned long long)begin,
					      (unsigned long long)end, a, (unsigned long long)i,
					      dos_float_bits(host[a * P + i]), want[a]);
			}
		}
	}
	CUDA_OK(cudaFree(dev));
	free(flat), free(host);
	printf("CUDA init-state kernel: %llu parameters, 2 seeds, 5 ranges each, bit for bit\n", (unsigned long long)P);
	return 0;
}
#endif
