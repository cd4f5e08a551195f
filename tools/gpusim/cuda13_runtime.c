/* CUDA 13 runtime entry points on top of GPGPU-Sim's CUDA 11 runtime. tools/gpusim.sh links
 * this file into the simulator's library, which it names libcudart.so.13, so that programs
 * built by CUDA 13's nvcc (StarPU, our library and tests) run on the simulator unchanged.
 * Compiled against CUDA 13's headers. A test harness: it covers what our programs and
 * StarPU's CUDA driver call, and says so on stderr when it answers for a missing feature. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
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

/* Several devices: DOS_GPUSIM_DEVICES=N (default 1) makes the simulator answer as N
 * devices, so that programs run with several CUDA workers (StarPU gives each its memory
 * node, its transfers and its share of the tasks). They are one simulator underneath: the
 * same memory (allocations never overlap, so each device's data stays apart) and the same
 * execution, which is what a test of placement across GPUs wants. The simulator is not
 * thread-safe across devices: drive them from one thread (STARPU_CUDA_THREAD_PER_DEV=0).
 * No direct access between peers is offered, so StarPU stages copies between devices in
 * host memory; a direct copy asked anyway is a copy within the one memory. */
cudaError_t gpgpusim_cudaGetDeviceCount(int *count);

static int simulated_devices(void)
{
	static int n;
	if (n == 0) {
		const char *s = getenv("DOS_GPUSIM_DEVICES");
		long v = 1;
		if (s && *s) {
			char *end;
			v = strtol(s, &end, 10);
			if (*end || v < 1 || v > 16) {
				fprintf(stderr, "gpusim: DOS_GPUSIM_DEVICES=%s: not a count of devices from 1 to 16\n",
					s);
				abort();
			}
		}
		n = (int)v;
	}
	return n;
}

static __thread int current_device;

cudaError_t cudaGetDeviceCount(int *count)
{
	int sim = 0;
	cudaError_t err = gpgpusim_cudaGetDeviceCount(&sim); /* starts the simulator */
	if (err != cudaSuccess)
		return err;
	*count = simulated_devices();
	return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
	if (device < 0 || device >= simulated_devices())
		return cudaErrorInvalidDevice;
	current_device = device;
	return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
	*device = current_device;
	return cudaSuccess;
}

cudaError_t cudaDeviceCanAccessPeer(int *can, int device, int peer)
{
	if (device < 0 || device >= simulated_devices() || peer < 0 || peer >= simulated_devices())
		return cudaErrorInvalidDevice;
	*can = 0;
	return cudaSuccess;
}

static cudaError_t peer_devices_ok(int dst_device, int src_device)
{
	const int n = simulated_devices();
	return dst_device < 0 || dst_device >= n || src_device < 0 || src_device >= n ? cudaErrorInvalidDevice
										      : cudaSuccess;
}

cudaError_t cudaMemcpyPeer(void *dst, int dst_device, const void *src, int src_device, size_t bytes)
{
	cudaError_t err = peer_devices_ok(dst_device, src_device);
	return err != cudaSuccess ? err : cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice);
}

cudaError_t cudaMemcpyPeerAsync(void *dst, int dst_device, const void *src, int src_device, size_t bytes,
				cudaStream_t stream)
{
	cudaError_t err = peer_devices_ok(dst_device, src_device);
	return err != cudaSuccess ? err : cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream);
}

/* StarPU refers to these, and calls them only for 3D data, which we never register. */
cudaError_t cudaMemcpy3DPeer(const struct cudaMemcpy3DPeerParms *p)
{
	(void)p;
	return cudaErrorNotSupported;
}

cudaError_t cudaMemcpy3DPeerAsync(const struct cudaMemcpy3DPeerParms *p, cudaStream_t stream)
{
	(void)p, (void)stream;
	return cudaErrorNotSupported;
}

/* CUDA 13's cudaDeviceProp differs in layout from the CUDA 11.8 one the simulator fills. */
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
	if (device < 0 || device >= simulated_devices())
		return cudaErrorInvalidDevice;
	struct dos_gpusim_props p;
	cudaError_t err = (cudaError_t)dos_gpusim_device_props(0, &p);
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
	prop->pciBusID += device; /* tell the simulated devices apart */
	prop->hostNumaId = -1;
	return cudaSuccess;
}

/* The simulator aborts on attributes it does not know. It lacks the compute mode (which
 * StarPU reads): the simulated device is shared, cudaComputeModeDefault. Any other
 * unknown attribute is reported as not supported. */
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
	if (device < 0 || device >= simulated_devices())
		return cudaErrorInvalidDevice;
	if (attr == cudaDevAttrComputeMode) {
		*value = cudaComputeModeDefault;
		return cudaSuccess;
	}
	if (attr >= 1 && attr <= 89 && attr != 44)
		return gpgpusim_cudaDeviceGetAttribute(value, attr, 0);
	fprintf(stderr, "gpusim: cudaDeviceGetAttribute(%d): not known to the simulator\n", (int)attr);
	return cudaErrorNotSupported;
}
