/* Building the subgroup map (subgroups.h): one walk over the flat space that emits a
 * piece at every tensor or subgroup boundary. */
#include <errno.h>
#include <stdlib.h>

#include "errors.h"
#include "subgroups.h"

void _dos_subgroup_map_free(struct dos_subgroup_map *map)
{
	if (!map)
		return;
	free(map->tensor_start);
	free(map->subgroup_first);
	free(map->tensor_first);
	free(map->pieces);
	*map = (struct dos_subgroup_map){0};
}

int _dos_subgroup_map_build(struct dos_subgroup_map *map, const uint64_t *numel, uint32_t ntensors,
			    uint64_t subgroup_size)
{
	if (!map)
		return DOS_FAIL(-EINVAL, "map is NULL");
	*map = (struct dos_subgroup_map){0};
	if (!numel || ntensors == 0)
		return DOS_FAIL(-EINVAL, "no tensors (numel = %p, ntensors = %u)", (const void *)numel, ntensors);
	uint64_t total = 0;
	for (uint32_t t = 0; t < ntensors; t++) {
		if (numel[t] == 0)
			return DOS_FAIL(-EINVAL, "tensor %u has no elements", t);
		total += numel[t];
	}
	if (subgroup_size == 0 || subgroup_size > total)
		return DOS_FAIL(-EINVAL, "subgroup_size = %llu must be in [1, %llu] (the model's parameter count)",
				(unsigned long long)subgroup_size, (unsigned long long)total);
	uint64_t nsub = (total + subgroup_size - 1) / subgroup_size;
	/* every boundary of either kind starts a piece */
	uint64_t max_pieces = nsub + ntensors;
	if (nsub > UINT32_MAX || max_pieces > UINT32_MAX)
		return DOS_FAIL(-EINVAL, "subgroup_size = %llu gives %llu subgroups, more than 2^32",
				(unsigned long long)subgroup_size, (unsigned long long)nsub);

	map->nparams = total;
	map->subgroup_size = subgroup_size;
	map->ntensors = ntensors;
	map->nsubgroups = (uint32_t)nsub;
	map->tensor_start = malloc((ntensors + 1) * sizeof *map->tensor_start);
	map->subgroup_first = malloc((nsub + 1) * sizeof *map->subgroup_first);
	map->tensor_first = malloc((ntensors + 1) * sizeof *map->tensor_first);
	map->pieces = malloc(max_pieces * sizeof *map->pieces);
	if (!map->tensor_start || !map->subgroup_first || !map->tensor_first || !map->pieces) {
		_dos_subgroup_map_free(map);
		return DOS_FAIL(-ENOMEM, "no memory for a map of %u tensors and %llu subgroups", ntensors,
				(unsigned long long)nsub);
	}
	map->tensor_start[0] = 0;
	for (uint32_t t = 0; t < ntensors; t++)
		map->tensor_start[t + 1] = map->tensor_start[t] + numel[t];

	uint32_t t = 0, s = 0, n = 0;
	uint64_t pos = 0;
	map->subgroup_first[0] = map->tensor_first[0] = 0;
	while (pos < total) {
		uint64_t tensor_end = map->tensor_start[t + 1];
		uint64_t subgroup_end = (uint64_t)(s + 1) * subgroup_size;
		uint64_t end = tensor_end < subgroup_end ? tensor_end : subgroup_end;
		map->pieces[n++] = (struct dos_piece){.tensor = t,
						      .subgroup = s,
						      .tensor_offset = pos - map->tensor_start[t],
						      .subgroup_offset = pos - (uint64_t)s * subgroup_size,
						      .len = end - pos};
		pos = end;
		if (pos == tensor_end)
			map->tensor_first[++t] = n;
		if (pos == subgroup_end || pos == total)
			map->subgroup_first[++s] = n;
	}
	map->npieces = n;
	return 0;
}
