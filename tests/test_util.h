/* Small helpers shared by the test programs: checks that report and fail, a seeded
 * generator, bitwise comparison of buffers, and ulp distances. */
#ifndef DOS_TEST_UTIL_H
#define DOS_TEST_UTIL_H

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TEST_SKIP 77

/* DOS_QUICK_CHECK=1: the short variant (sanitizer builds, distcheck, the GPU simulator). */
static inline int test_quick(void)
{
	const char *q = getenv("DOS_QUICK_CHECK");
	return q && strcmp(q, "1") == 0;
}

#define CHECK(cond, ...)                                                                         \
	do {                                                                                     \
		if (!(cond)) {                                                                   \
			fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
			fprintf(stderr, __VA_ARGS__);                                            \
			fputc('\n', stderr);                                                     \
			exit(1);                                                                 \
		}                                                                                \
	} while (0)

#ifdef DOS_USE_CUDA
#include <cuda_runtime.h>
/* A CUDA runtime call that must succeed. */
#define CUDA_OK(call)                                                              \
	do {                                                                       \
		cudaError_t e_ = (call);                                           \
		CHECK(e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_)); \
	} while (0)
#endif

/* xorshift64*: reproducible across platforms, unlike rand(). */
static inline uint64_t test_rand(uint64_t *state)
{
	uint64_t x = *state;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*state = x;
	return x * 0x2545F4914F6CDD1DULL;
}

/* Uniform in [0, 1). */
static inline double test_uniform(uint64_t *state)
{
	return (double)(test_rand(state) >> 11) * 0x1.0p-53;
}

/* Normal(0, 1) by Box-Muller. */
static inline double test_normal(uint64_t *state)
{
	double u = test_uniform(state), w = test_uniform(state);
	return sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * w);
}

/* Index of the first differing byte-pattern element of size `elemsize`, or -1. */
static inline long test_first_difference(const void *a, const void *b, size_t n, size_t elemsize)
{
	const unsigned char *x = a, *y = b;
	for (size_t i = 0; i < n; i++)
		if (memcmp(x + i * elemsize, y + i * elemsize, elemsize) != 0)
			return (long)i;
	return -1;
}

/* Distance in units in the last place between two floats of the same sign (0 when the
 * bits are equal; huge for NaN against a number). */
static inline uint32_t test_ulp_distance(float a, float b)
{
	int32_t ia, ib;
	memcpy(&ia, &a, 4);
	memcpy(&ib, &b, 4);
	if (ia < 0)
		ia = (int32_t)(0x80000000u - (uint32_t)ia);
	if (ib < 0)
		ib = (int32_t)(0x80000000u - (uint32_t)ib);
	int64_t d = (int64_t)ia - (int64_t)ib;
	return (uint32_t)(d < 0 ? -d : d);
}

static inline void *test_malloc(size_t bytes)
{
	void *p = malloc(bytes ? bytes : 1);
	CHECK(p != NULL, "out of memory for %zu bytes", bytes);
	return p;
}

/* An output array of NaNs: an element a kernel forgets to write stays NaN. */
static inline float *test_nan_floats(size_t count)
{
	float *p = test_malloc(count * sizeof(float));
	for (size_t i = 0; i < count; i++)
		p[i] = NAN;
	return p;
}

/* Removes an empty checkpoint folder, and the lock file a run that took it left there
 * (graph/checkpoint.h). */
static inline void test_remove_folder(const char *dir)
{
	char lock[4200];
	snprintf(lock, sizeof lock, "%s/.starpu-dos.lock", dir);
	remove(lock);
	remove(dir);
}

#endif /* DOS_TEST_UTIL_H */
