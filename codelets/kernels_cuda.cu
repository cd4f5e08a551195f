/* CUDA kernels: the per-element functions of numerics.h, so GPU results are bit-for-bit
 * the CPU's. Compiled with -fmad=false -prec-div=true -prec-sqrt=true -ftz=false.
 * Every launch goes on the caller's stream (StarPU's local stream) and its status is
 * returned; none synchronises. */
#include <cuda_runtime.h>

#include "cuda_grid.h"
#include "kernels.h"
#include "numerics.h"

static const int threads_per_block = 256;

/* Every kernel below loops grid-stride over a grid capped by DOS_CUDA_MAX_BLOCKS. */
static unsigned blocks_for(size_t work_items)
{
	return _dos_cuda_blocks_for(work_items, threads_per_block);
}

static bool aligned(const void *ptr, size_t bytes)
{
	return ((uintptr_t)ptr % bytes) == 0;
}

__device__ __forceinline__ void load4(const void *g, size_t i4, enum dos_dtype t, float out[4])
{
	if (t == DOS_FP32) {
		float4 x = ((const float4 *)g)[i4];
		out[0] = x.x, out[1] = x.y, out[2] = x.z, out[3] = x.w;
		return;
	}
	uint2 raw = ((const uint2 *)g)[i4];
	uint16_t h[4] = {(uint16_t)(raw.x & 0xffffu), (uint16_t)(raw.x >> 16), (uint16_t)(raw.y & 0xffffu),
			 (uint16_t)(raw.y >> 16)};
	for (int k = 0; k < 4; k++)
		out[k] = t == DOS_FP16 ? dos_fp16_to_float(h[k]) : dos_bf16_to_float(h[k]);
}

__device__ __forceinline__ void store4_16(void *w, size_t i4, enum dos_dtype t, const float x[4])
{
	uint16_t h[4];
	for (int k = 0; k < 4; k++)
		h[k] = t == DOS_FP16 ? dos_float_to_fp16(x[k]) : dos_float_to_bf16(x[k]);
	((uint2 *)w)[i4] = make_uint2(h[0] | ((uint32_t)h[1] << 16), h[2] | ((uint32_t)h[3] << 16));
}

/* Four elements per thread per iteration with 16-byte accesses to the fp32 state. Each
 * thread collects the non-finite bits of what it wrote and, only if there are some, ORs
 * them into *nonfinite (when not NULL): one atomic per thread that saw one, none else. */
__global__ void adam_vec4_kernel(struct dos_adam_step s, float4 *p, float4 *m, float4 *v, const void *g,
				 enum dos_dtype gt, void *w, enum dos_dtype wt, size_t n4, uint32_t *nonfinite)
{
	uint32_t seen = 0;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x) {
		float4 pp = p[i], mm = m[i], vv = v[i];
		float gg[4];
		load4(g, i, gt, gg);
		dos_adam_element(&s, s.decay_kind, &pp.x, &mm.x, &vv.x, gg[0]);
		dos_adam_element(&s, s.decay_kind, &pp.y, &mm.y, &vv.y, gg[1]);
		dos_adam_element(&s, s.decay_kind, &pp.z, &mm.z, &vv.z, gg[2]);
		dos_adam_element(&s, s.decay_kind, &pp.w, &mm.w, &vv.w, gg[3]);
		p[i] = pp, m[i] = mm, v[i] = vv;
		seen |= dos_nonfinite_bits(pp.x, mm.x, vv.x) | dos_nonfinite_bits(pp.y, mm.y, vv.y) |
			dos_nonfinite_bits(pp.z, mm.z, vv.z) | dos_nonfinite_bits(pp.w, mm.w, vv.w);
		if (w) {
			float out[4] = {pp.x, pp.y, pp.z, pp.w};
			store4_16(w, i, wt, out);
		}
	}
	if (seen && nonfinite)
		atomicOr(nonfinite, seen);
}

/* Elements [begin, n) one per thread: tails, and buffers not aligned for vec4. */
__global__ void adam_scalar_kernel(struct dos_adam_step s, float *p, float *m, float *v, const void *g,
				   enum dos_dtype gt, void *w, enum dos_dtype wt, size_t begin, size_t n,
				   uint32_t *nonfinite)
{
	uint32_t seen = 0;
	for (size_t i = begin + blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		dos_adam_element(&s, s.decay_kind, &p[i], &m[i], &v[i], dos_load_elem(g, i, gt));
		seen |= dos_nonfinite_bits(p[i], m[i], v[i]);
		if (w)
			dos_store_elem(w, i, wt, p[i]);
	}
	if (seen && nonfinite)
		atomicOr(nonfinite, seen);
}

extern "C" cudaError_t _dos_adam_cuda(const struct dos_adam_step *s, float *p, float *m, float *v, const void *g,
				      enum dos_dtype gt, void *w, enum dos_dtype wt, size_t n, uint32_t *nonfinite,
				      cudaStream_t stream)
{
	if (nonfinite) {
		/* the word is a W buffer: its old content means nothing */
		cudaError_t err = cudaMemsetAsync(nonfinite, 0, sizeof *nonfinite, stream);
		if (err != cudaSuccess)
			return err;
	}
	size_t vec_done = 0;
	if (aligned(p, 16) && aligned(m, 16) && aligned(v, 16) && aligned(g, 4 * dos_dtype_size(gt)) &&
	    (!w || aligned(w, 8))) {
		size_t n4 = n / 4;
		if (n4) {
			adam_vec4_kernel<<<blocks_for(n4), threads_per_block, 0, stream>>>(
				*s, (float4 *)p, (float4 *)m, (float4 *)v, g, gt, w, wt, n4, nonfinite);
			cudaError_t err = cudaGetLastError();
			if (err != cudaSuccess)
				return err;
		}
		vec_done = n4 * 4;
	}
	if (vec_done < n) {
		adam_scalar_kernel<<<blocks_for(n - vec_done), threads_per_block, 0, stream>>>(
			*s, p, m, v, g, gt, w, wt, vec_done, n, nonfinite);
		return cudaGetLastError();
	}
	return cudaSuccess;
}

__global__ void cast_kernel(const float *src, void *dst, enum dos_dtype dt, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		dos_store_elem(dst, i, dt, src[i]);
}

extern "C" cudaError_t _dos_cast_cuda(const float *src, void *dst, enum dos_dtype dt, size_t n, cudaStream_t stream)
{
	if (n == 0)
		return cudaSuccess;
	cast_kernel<<<blocks_for(n), threads_per_block, 0, stream>>>(src, dst, dt, n);
	return cudaGetLastError();
}

__global__ void grad_scale_kernel(void *g, enum dos_dtype gt, size_t n, float factor)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		dos_store_elem(g, i, gt, factor == 0.0f ? 0.0f : dos_load_elem(g, i, gt) * factor);
}

extern "C" cudaError_t _dos_grad_scale_cuda(void *g, enum dos_dtype gt, size_t n, float factor, cudaStream_t stream)
{
	if (n == 0)
		return cudaSuccess;
	grad_scale_kernel<<<blocks_for(n), threads_per_block, 0, stream>>>(g, gt, n, factor);
	return cudaGetLastError();
}

/* One block per segment, one thread per lane: the order of numerics.h exactly. */
__global__ void grad_stats_segment_kernel(const void *g, enum dos_dtype gt, size_t n, double *segment_sums)
{
	__shared__ double lane[DOS_STATS_LANES];
	size_t base = blockIdx.x * (size_t)DOS_STATS_SEGMENT + threadIdx.x;
	double acc = 0.0;
	for (size_t r = 0; r < DOS_STATS_SEGMENT / DOS_STATS_LANES; r++) {
		size_t i = base + r * DOS_STATS_LANES;
		if (i < n) {
			double x = dos_load_elem(g, i, gt);
			acc = acc + x * x;
		}
	}
	lane[threadIdx.x] = acc;
	for (int half = DOS_STATS_LANES / 2; half >= 1; half /= 2) {
		__syncthreads();
		if ((int)threadIdx.x < half)
			lane[threadIdx.x] += lane[threadIdx.x + half];
	}
	if (threadIdx.x == 0)
		segment_sums[blockIdx.x] = lane[0];
}

/* Segment sums added in order by one thread, as the CPU does. */
__global__ void grad_stats_finish_kernel(const double *segment_sums, size_t nseg, struct dos_grad_stats *out)
{
	double total = 0.0;
	for (size_t k = 0; k < nseg; k++)
		total += segment_sums[k];
	out->sum_sq = total;
	out->nonfinite = !isfinite(total);
	out->reserved = 0;
}

extern "C" cudaError_t _dos_grad_stats_cuda(const void *g, enum dos_dtype gt, size_t n, struct dos_grad_stats *out,
					    cudaStream_t stream)
{
	size_t nseg = (n + DOS_STATS_SEGMENT - 1) / DOS_STATS_SEGMENT;
	double *segment_sums = NULL;
	cudaError_t err;
	if (nseg) {
		/* stream-ordered scratch: freed after the finish kernel, no synchronisation */
		err = cudaMallocAsync((void **)&segment_sums, nseg * sizeof(double), stream);
		if (err != cudaSuccess)
			return err;
		grad_stats_segment_kernel<<<(unsigned)nseg, DOS_STATS_LANES, 0, stream>>>(g, gt, n, segment_sums);
		if ((err = cudaGetLastError()) != cudaSuccess)
			return err;
	}
	grad_stats_finish_kernel<<<1, 1, 0, stream>>>(segment_sums, nseg, out);
	if ((err = cudaGetLastError()) != cudaSuccess)
		return err;
	return nseg ? cudaFreeAsync(segment_sums, stream) : cudaSuccess;
}
