/* Where a rank of a data-parallel job runs (rank_binding.h): its GPU and the cores nearest
 * it, from hwloc. Launchers bind ranks badly for offloading (Open MPI binds each rank to
 * one core by default, which starves the CPU update; no launcher knows which cores the
 * update wants): so the node's cores (those the job may use, e.g. its cgroup) are shared
 * out here, each rank getting a block of the cores local to its GPUs. */
#include <errno.h>
#include <hwloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "errors.h"
#include "rank_binding.h"

#ifdef STARPU_USE_CUDA
#include <cuda_runtime.h>
#include <hwloc/cudart.h>
#endif

/* The cores of `near` (the whole cores whose PUs are all in it), as a list of cpusets. */
static int cores_within(hwloc_topology_t topo, hwloc_const_cpuset_t near, hwloc_bitmap_t **cores, int *count)
{
	int n = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
	*cores = calloc(n > 0 ? (size_t)n : 1, sizeof **cores);
	if (!*cores)
		return -ENOMEM;
	*count = 0;
	for (int i = 0; i < n; i++) {
		hwloc_obj_t core = hwloc_get_obj_by_type(topo, HWLOC_OBJ_CORE, (unsigned)i);
		if (core && hwloc_bitmap_isincluded(core->cpuset, near))
			(*cores)[(*count)++] = core->cpuset;
	}
	return 0;
}

/* The cpuset local to GPUs first .. first + count - 1 (the union of their localities)
 * within `allowed`: all of allowed without GPUs, or when a GPU's locality is unknown or
 * outside it. */
static hwloc_bitmap_t gpus_locality(hwloc_topology_t topo, hwloc_const_cpuset_t allowed, int first, int count)
{
	hwloc_bitmap_t set = hwloc_bitmap_dup(allowed);
#ifdef STARPU_USE_CUDA
	hwloc_bitmap_t local = hwloc_bitmap_alloc(), near = hwloc_bitmap_alloc();
	int known = count > 0 && local && near;
	for (int g = first; known && g < first + count; g++) {
		known = hwloc_cudart_get_device_cpuset(topo, g, local) == 0 && hwloc_bitmap_intersects(local, allowed);
		hwloc_bitmap_or(near, near, local);
	}
	if (known)
		hwloc_bitmap_and(set, set, near);
	hwloc_bitmap_free(local);
	hwloc_bitmap_free(near);
#else
	(void)topo, (void)first, (void)count;
#endif
	return set;
}

int _dos_rank_gpus(int local_rank, int local_size, int ngpus, int *first)
{
	*first = -1;
	if (ngpus <= 0 || local_size <= 0 || local_rank < 0)
		return 0;
	if (local_size >= ngpus) {
		*first = local_rank % ngpus;
		return 1;
	}
	*first = local_rank * ngpus / local_size;
	return (local_rank + 1) * ngpus / local_size - *first;
}

static int visible_gpus(void)
{
#ifdef STARPU_USE_CUDA
	int n = 0;
	if (cudaGetDeviceCount(&n) != cudaSuccess)
		return 0;
	return n;
#else
	return 0;
#endif
}

int _dos_bind_rank(int local_rank, int local_size, struct starpu_conf *conf, struct dos_rank_binding *out)
{
	*out = (struct dos_rank_binding){.gpu = -1, .local_rank = local_rank, .local_size = local_size};
	if (local_rank < 0 || local_size < 1 || local_rank >= local_size)
		return DOS_FAIL(-EINVAL, "local rank %d of %d", local_rank, local_size);
	const char *mode = getenv("DOS_BIND");
	if (mode && !strcmp(mode, "none")) {
		snprintf(out->text, sizeof out->text, "binding left to the launcher (DOS_BIND=none)");
		return 0;
	}
	hwloc_topology_t topo;
	if (hwloc_topology_init(&topo) != 0)
		return DOS_FAIL(-ENOMEM, "hwloc_topology_init failed");
	int err = 0;
	if (hwloc_topology_load(topo) != 0) {
		hwloc_topology_destroy(topo);
		return DOS_FAIL(-EIO, "hwloc cannot read this machine's topology");
	}
	/* the cores the job may use on this node (a cgroup or cpuset), not the launcher's
	 * per-process binding, which this replaces */
	hwloc_const_cpuset_t allowed = hwloc_topology_get_allowed_cpuset(topo);

	/* every local rank's GPU and locality, the same computation on each rank, so that
	 * ranks near the same GPUs share those cores out between them */
	int ngpus = visible_gpus();
	hwloc_bitmap_t *near = calloc((size_t)local_size, sizeof *near);
	if (!near) {
		hwloc_topology_destroy(topo);
		return DOS_FAIL(-ENOMEM, "no memory for %d ranks' bindings", local_size);
	}
	for (int r = 0; r < local_size; r++) {
		int first, count = _dos_rank_gpus(r, local_size, ngpus, &first);
		near[r] = gpus_locality(topo, allowed, first, count);
	}
	int group = 0, index = 0;
	for (int r = 0; r < local_size; r++)
		if (hwloc_bitmap_isequal(near[r], near[local_rank])) {
			index += r < local_rank;
			group++;
		}
	hwloc_bitmap_t *cores = NULL;
	int ncores = 0;
	hwloc_bitmap_t mine = hwloc_bitmap_alloc();
	if (!mine || cores_within(topo, near[local_rank], &cores, &ncores) != 0)
		err = DOS_FAIL(-ENOMEM, "no memory for the binding");
	else if (ncores == 0) /* no whole core there: the locality's PUs, shared */
		hwloc_bitmap_copy(mine, near[local_rank]);
	else if (ncores >= group) /* a block of ncores / group cores (the first blocks one more) */
		for (int c = index * ncores / group; c < (index + 1) * ncores / group; c++)
			hwloc_bitmap_or(mine, mine, cores[c]);
	else /* fewer cores than ranks: one core each, shared */
		hwloc_bitmap_copy(mine, cores[index % ncores]);

	if (!err && hwloc_set_cpubind(topo, mine, HWLOC_CPUBIND_PROCESS) != 0)
		err = DOS_FAIL(-errno, "binding rank %d to its cores failed: %s", local_rank, strerror(errno));
	if (!err) {
		out->ngpus = _dos_rank_gpus(local_rank, local_size, ngpus, &out->gpu);
		out->ncores = hwloc_get_nbobjs_inside_cpuset_by_type(topo, mine, HWLOC_OBJ_CORE);
		/* StarPU takes its CPU workers from this binding (STARPU_WORKERS_GETBIND); one
		 * CUDA worker drives each of the rank's GPUs, unless the user chose otherwise */
		if (out->ngpus > 0 && !getenv("STARPU_WORKERS_CUDAID") && !getenv("STARPU_NCUDA")) {
			conf->ncuda = out->ngpus;
			conf->use_explicit_workers_cuda_gpuid = 1;
			for (int g = 0; g < out->ngpus; g++)
				conf->workers_cuda_gpuid[g] = (unsigned)(out->gpu + g);
		}
		/* StarPU keeps a core for the MPI thread and one per CUDA worker: on a small
		 * block that would leave no CPU worker; then one shares the cores */
		if (out->ncores - 1 - out->ngpus < 1 && conf->ncpus < 0 && !getenv("STARPU_NCPU"))
			conf->ncpus = 1;
		char cpus[128], nodes[64];
		hwloc_bitmap_t nodeset = hwloc_bitmap_alloc();
		hwloc_cpuset_to_nodeset(topo, mine, nodeset);
		hwloc_bitmap_list_snprintf(cpus, sizeof cpus, mine);
		hwloc_bitmap_list_snprintf(nodes, sizeof nodes, nodeset);
		hwloc_bitmap_free(nodeset);
		char gpu[32] = "no GPU";
		if (out->ngpus == 1)
			snprintf(gpu, sizeof gpu, "GPU %d", out->gpu);
		else if (out->ngpus > 1)
			snprintf(gpu, sizeof gpu, "GPUs %d-%d", out->gpu, out->gpu + out->ngpus - 1);
		snprintf(out->text, sizeof out->text,
			 "local rank %d of %d: %s, %d core(s) on CPUs %s (NUMA node %s; its memory first-touched "
			 "there)%s",
			 local_rank, local_size, gpu, out->ncores, cpus, nodes,
			 group > ncores && ncores > 0 ? ", cores shared: more ranks than cores" : "");
	}
	for (int r = 0; r < local_size; r++)
		hwloc_bitmap_free(near[r]);
	free(near);
	free(cores);
	hwloc_bitmap_free(mine);
	hwloc_topology_destroy(topo);
	return err;
}
