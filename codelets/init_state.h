/* The initial values of the example model's parameters (docs/model.md), one parameter at
 * a time: what _dos_model_init_weights writes sequentially, computed from the parameter's
 * index alone, so that a task can create a subgroup's optimizer state (fp32 master weights
 * from these values, Adam m = v = 0) wherever it runs, the CPU or the GPU, bit for bit
 * the same.
 *
 * The weights are uniform draws of splitmix64 in flat order, except RMSNorm weights, which
 * are 1 and draw nothing. splitmix64's state advances by a constant at every draw, so draw
 * k (from 0) mixes seed + (k + 1) * gamma, and the draw of parameter i is i minus the norm
 * weights before it. */
#ifndef DOS_INIT_STATE_H
#define DOS_INIT_STATE_H

#include <stdint.h>

#include "numerics.h"

/* splitmix64's constants: the increment of its state, and its two multipliers. */
#define DOS_SPLITMIX64_GAMMA 0x9E3779B97F4A7C15ull
#define DOS_SPLITMIX64_MUL1 0xBF58476D1CE4E5B9ull
#define DOS_SPLITMIX64_MUL2 0x94D049BB133111EBull

/* On the GPU the 64-bit constants come from constant memory, through a volatile read the
 * compiler cannot fold into an instruction's immediate: GPGPU-Sim's PTX parser (the CUDA
 * lane, tests/gpusim_lane.sh) reads integer immediates into 32 bits, which would
 * simulate other numbers than a GPU computes. On a GPU the read is one cached load. */
#ifdef __CUDACC__
static __constant__ uint64_t dos_splitmix64_constants[3] = {DOS_SPLITMIX64_GAMMA, DOS_SPLITMIX64_MUL1,
							    DOS_SPLITMIX64_MUL2};
#endif
#ifdef __CUDA_ARCH__
#define DOS_SPLITMIX64_K(i, literal) (*(const volatile uint64_t *)&dos_splitmix64_constants[i])
#else
#define DOS_SPLITMIX64_K(i, literal) (literal)
#endif

/* splitmix64's output for the state value z it has just advanced to. */
DOS_HD uint64_t dos_splitmix64_mix(uint64_t z)
{
	z = (z ^ (z >> 30)) * DOS_SPLITMIX64_K(1, DOS_SPLITMIX64_MUL1);
	z = (z ^ (z >> 27)) * DOS_SPLITMIX64_K(2, DOS_SPLITMIX64_MUL2);
	return z ^ (z >> 31);
}

/* What the initial value of a parameter depends on: the seed, the model's sizes (the flat
 * order of docs/model.md: token and position embeddings, then per layer ln1, qkv, o, ln2,
 * fc1, fc2, then the final norm and the head) and the amplitude of the uniform draws,
 * computed once on the host (dos_init_amplitude) so that no device evaluates a square
 * root. */
struct dos_init_layout {
	uint64_t seed;
	uint64_t vocab, seq_len, hidden, ffn, layers;
	float amplitude;
};

/* The amplitude of a uniform distribution of standard deviation 0.02. */
static inline float dos_init_amplitude(void)
{
	return (float)(0.02 * sqrt(3.0));
}

/* Whether parameter i is an RMSNorm weight; *draws_before: the draws of the parameters
 * before it; *run_end: the end of the run of parameters from i on that are norm weights
 * or not as it is (the next tensor where that changes; the CPU kernel draws a run in
 * sequence, a GPU thread locates each of its parameters). */
DOS_HD int dos_init_locate(const struct dos_init_layout *l, uint64_t i, uint64_t *draws_before, uint64_t *run_end)
{
	uint64_t d = l->hidden;
	uint64_t embeddings = (l->vocab + l->seq_len) * d;
	uint64_t layer = 2 * d + 4 * d * d + 2 * l->ffn * d;
	uint64_t norms = 0; /* norm weights before i */
	int norm = 0;
	if (i < embeddings) {
		*run_end = embeddings; /* layer 0's ln1 follows */
	} else {
		uint64_t j = i - embeddings;
		uint64_t full = j / layer;
		uint64_t start = embeddings + full * layer;
		if (full >= l->layers) { /* the final norm, then the head */
			start = embeddings + l->layers * layer;
			uint64_t k = i - start;
			norm = k < d;
			norms = 2 * d * l->layers + (norm ? k : d);
			*run_end = norm ? start + d : start + d + l->vocab * d;
		} else {
			/* within the layer: ln1 [0, d), qkv and o, ln2 [ln2, ln2 + d), fc1 and fc2 */
			uint64_t o = j - full * layer, ln2 = d + 4 * d * d;
			norms = 2 * d * full;
			if (o < d) {
				norm = 1, norms += o, *run_end = start + d;
			} else if (o < ln2) {
				norms += d, *run_end = start + ln2;
			} else if (o < ln2 + d) {
				norm = 1, norms += d + (o - ln2), *run_end = start + ln2 + d;
			} else {
				norms += 2 * d, *run_end = start + layer; /* the next ln1 or the final norm */
			}
		}
	}
	*draws_before = i - norms;
	return norm;
}

/* The value of the draw k (from 0) of a generator seeded with `seed`. */
DOS_HD float dos_init_draw(const struct dos_init_layout *l, uint64_t k)
{
	uint64_t bits = dos_splitmix64_mix(l->seed + (k + 1) * DOS_SPLITMIX64_K(0, DOS_SPLITMIX64_GAMMA));
	/* exact: a 24-bit integer scaled by a power of two, and 2u - 1 with u of 24 bits; the
	 * product is the one rounding */
	float u = (float)(bits >> 40) * 0x1.0p-24f;
	return (2.0f * u - 1.0f) * l->amplitude;
}

/* The initial value of parameter i. */
DOS_HD float dos_init_weight(const struct dos_init_layout *l, uint64_t i)
{
	uint64_t k, run_end;
	return dos_init_locate(l, i, &k, &run_end) ? 1.0f : dos_init_draw(l, k);
}

#ifdef __cplusplus
extern "C" {
#endif
/* A subgroup's initial state: master[j] = the value of parameter begin + j, m[j] = v[j] = 0,
 * j < n. */
void _dos_init_state_cpu(const struct dos_init_layout *l, uint64_t begin, float *master, float *m, float *v,
			 uint64_t n);
#ifdef DOS_USE_CUDA
#include <cuda_runtime.h>
/* The same, launched on `stream`. */
cudaError_t _dos_init_state_cuda(const struct dos_init_layout *l, uint64_t begin, float *master, float *m, float *v,
				 uint64_t n, cudaStream_t stream);
#endif
#ifdef __cplusplus
}
#endif

#endif /* DOS_INIT_STATE_H */
