/* CUDA 13 runtime entry points on top of GPGPU-Sim's CUDA 11 runtime. tools/gpusim.sh links
 * this file into the simulator's library, which it names libcudart.so.13, so that programs
 * built by CUDA 13's nvcc (StarPU, our library and tests) run on the simulator unchanged.
 * Compiled against CUDA 13's headers. A test harness: it covers what our programs and
 * StarPU's CUDA driver call, and says so on stderr when it answers for a missing feature. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <string.h>

#include "device_props.h"

/* GPGPU-Sim's own versions of the entry points wrapped here, renamed by tools/gpusim.sh */
cudaError_t gpgpusim_cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device);

/* nvcc 13's launch stubs ask for a kernel handle once (__cudaGetKernel), then launch by
 * handle. The simulator registers each kernel under its host stub's address, which is what
 * cudaLaunchKernel takes: that address serves as the handle. */
cudaError_t __cudaGetKernel(cudaKernel_t *kernel, const void *func)
{
	*kernel = (cudaKernel_t)func;
	return cudaSuccess;
}

cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void **args, size_t shared_bytes,
			       cudaStream_t stream)
{
	return cudaLaunchKernel((const void *)kernel, grid, block, args, shared_bytes, stream);
}

cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 grid, dim3 block, void **args, size_t shared_bytes,
				    cudaStream_t stream)
{
	return cudaLaunchKernel((const void *)kernel, grid, block, args, shared_bytes, stream);
}

/* Stream-ordered allocation: allocating at once is always safe; freeing must wait for the
 * work queued before it, which may still use the buffer. */
cudaError_t cudaMallocAsync(void **ptr, size_t bytes, cudaStream_t stream)
{
	(void)stream;
	return cudaMalloc(ptr, bytes);
}

cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream)
{
	cudaError_t err = cudaStreamSynchronize(stream);
	return err != cudaSuccess ? err : cudaFree(ptr);
}

/* The simulated device reads host memory directly: pinning has nothing to do. (The
 * simulator's own cudaHostRegister is a C++ name, which no C caller finds.) */
cudaError_t cudaHostRegister(void *ptr, size_t bytes, unsigned int flags)
{
	(void)ptr, (void)bytes, (void)flags;
	return cudaSuccess;
}

cudaError_t cudaHostUnregister(void *ptr)
{
	(void)ptr;
	return cudaSuccess;
}

/* One simulated device: no peer to copy to (StarPU refers to these, calls them only
 * between two GPUs). */
cudaError_t cudaMemcpyPeer(void *dst, int dst_device, const void *src, int src_device, size_t bytes)
{
	(void)dst, (void)dst_device, (void)src, (void)src_device, (void)bytes;
	return cudaErrorInvalidDevice;
}

cudaError_t cudaMemcpyPeerAsync(void *dst, int dst_device, const void *src, int src_device, size_t bytes,
				cudaStream_t stream)
{
	(void)dst, (void)dst_device, (void)src, (void)src_device, (void)bytes, (void)stream;
	return cudaErrorInvalidDevice;
}

cudaError_t cudaMemcpy3DPeer(const struct cudaMemcpy3DPeerParms *p)
{
	(void)p;
	return cudaErrorInvalidDevice;
}

cudaError_t cudaMemcpy3DPeerAsync(const struct cudaMemcpy3DPeerParms *p, cudaStream_t stream)
{
	(void)p, (void)stream;
	return cudaErrorInvalidDevice;
}

/* CUDA 13's cudaDeviceProp differs in layout from the CUDA 11.8 one the simulator fills. */
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
	struct dos_gpusim_props p;
	cudaError_t err = (cudaError_t)dos_gpusim_device_props(device, &p);
	if (err != cudaSuccess)
		return err;
	memset(prop, 0, sizeof *prop);
	memcpy(prop->name, p.name, sizeof prop->name);
	prop->name[sizeof prop->name - 1] = 0;
	memcpy(prop->maxThreadsDim, p.maxThreadsDim, sizeof prop->maxThreadsDim);
	memcpy(prop->maxGridSize, p.maxGridSize, sizeof prop->maxGridSize);
#define DOS_GPUSIM_COPY(type, field) prop->field = p.field;
	DOS_GPUSIM_PROP_FIELDS(DOS_GPUSIM_COPY)
#undef DOS_GPUSIM_COPY
	prop->hostNumaId = -1;
	return cudaSuccess;
}

/* The simulator aborts on attributes it does not know. It lacks the compute mode (which
 * StarPU reads): the simulated device is shared, cudaComputeModeDefault. Any other
 * unknown attribute is reported as not supported. */
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
	if (attr == cudaDevAttrComputeMode) {
		*value = cudaComputeModeDefault;
		return cudaSuccess;
	}
	if (attr >= 1 && attr <= 89 && attr != 44)
		return gpgpusim_cudaDeviceGetAttribute(value, attr, device);
	fprintf(stderr, "gpusim: cudaDeviceGetAttribute(%d): not known to the simulator\n", (int)attr);
	return cudaErrorNotSupported;
}
