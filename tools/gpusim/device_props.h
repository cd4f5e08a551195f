/* The device properties that pass from GPGPU-Sim's cudaDeviceProp (CUDA 11.8's layout) to
 * CUDA 13's: the fields StarPU and our programs read, named as in both. */
#ifndef DOS_GPUSIM_DEVICE_PROPS_H
#define DOS_GPUSIM_DEVICE_PROPS_H

#include <stddef.h>

/* X(type, field) for each scalar field copied */
#define DOS_GPUSIM_PROP_FIELDS(X)             \
	X(size_t, totalGlobalMem)             \
	X(size_t, sharedMemPerBlock)          \
	X(int, regsPerBlock)                  \
	X(int, warpSize)                      \
	X(size_t, memPitch)                   \
	X(int, maxThreadsPerBlock)            \
	X(size_t, totalConstMem)              \
	X(int, major)                         \
	X(int, minor)                         \
	X(size_t, textureAlignment)           \
	X(int, multiProcessorCount)           \
	X(int, canMapHostMemory)              \
	X(int, concurrentKernels)             \
	X(int, pciBusID)                      \
	X(int, pciDeviceID)                   \
	X(int, pciDomainID)                   \
	X(int, asyncEngineCount)              \
	X(int, unifiedAddressing)             \
	X(int, memoryBusWidth)                \
	X(int, l2CacheSize)                   \
	X(int, maxThreadsPerMultiProcessor)   \
	X(size_t, sharedMemPerMultiprocessor) \
	X(int, regsPerMultiprocessor)

struct dos_gpusim_props {
	char name[256];
	int maxThreadsDim[3], maxGridSize[3];
#define DOS_GPUSIM_DECLARE(type, field) type field;
	DOS_GPUSIM_PROP_FIELDS(DOS_GPUSIM_DECLARE)
#undef DOS_GPUSIM_DECLARE
};

/* The simulator's properties of `device` (device_props_118.c); returns a cudaError_t. */
int dos_gpusim_device_props(int device, struct dos_gpusim_props *out);

#endif /* DOS_GPUSIM_DEVICE_PROPS_H */
