/* Compiled against CUDA 11.8's headers, the layout of GPGPU-Sim's cudaDeviceProp: reads
 * the simulator's properties into the neutral struct of device_props.h, for the CUDA 13
 * cudaGetDeviceProperties of cuda13_runtime.c. */
#include <cuda_runtime_api.h>
#include <string.h>

#include "device_props.h"

/* GPGPU-Sim's own cudaGetDeviceProperties, renamed by tools/gpusim.sh */
cudaError_t gpgpusim_cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device);

int dos_gpusim_device_props(int device, struct dos_gpusim_props *out)
{
	struct cudaDeviceProp p;
	memset(&p, 0, sizeof p);
	cudaError_t err = gpgpusim_cudaGetDeviceProperties(&p, device);
	if (err != cudaSuccess)
		return err;
	memset(out, 0, sizeof *out);
	memcpy(out->name, p.name, sizeof out->name);
	memcpy(out->maxThreadsDim, p.maxThreadsDim, sizeof out->maxThreadsDim);
	memcpy(out->maxGridSize, p.maxGridSize, sizeof out->maxGridSize);
#define DOS_GPUSIM_COPY(type, field) out->field = p.field;
	DOS_GPUSIM_PROP_FIELDS(DOS_GPUSIM_COPY)
#undef DOS_GPUSIM_COPY
	return cudaSuccess;
}
