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
	free(map->subgroup_start);
	free(map->subgroup_first);
	free(map->tensor_first);
	free(map->pieces);
	*map = (struct dos_subgroup_map){0};
}

int _dos_subgroup_map_build(struct dos_subgroup_map *map, const uint64_t *numel, uint32_t ntensors,
			    uint64_t subgroup_size, int follow_tensors)
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
	uint64_t nsub = 0;
	if (follow_tensors)
		for (uint32_t t = 0; t < ntensors; t++)
			nsub += (numel[t] + subgroup_size - 1) / subgroup_size;
	else
		nsub = (total + subgroup_size - 1) / subgroup_size;
	/* every boundary of either kind starts a piece */
	uint64_t max_pieces = nsub + ntensors;
	if (nsub > UINT32_MAX || max_pieces > UINT32_MAX)
		return DOS_FAIL(-EINVAL, "subgroup_size = %llu gives %llu subgroups, more than 2^32",
				(unsigned long long)subgroup_size, (unsigned long long)nsub);

	map->nparams = total;
	map->subgroup_size = subgroup_size;
	map->follows_tensors = follow_tensors != 0;
	map->ntensors = ntensors;
	map->nsubgroups = (uint32_t)nsub;
	map->tensor_start = malloc((ntensors + 1) * sizeof *map->tensor_start);
	map->subgroup_start = malloc((nsub + 1) * sizeof *map->subgroup_start);
	map->subgroup_first = malloc((nsub + 1) * sizeof *map->subgroup_first);
	map->tensor_first = malloc((ntensors + 1) * sizeof *map->tensor_first);
	map->pieces = malloc(max_pieces * sizeof *map->pieces);
	if (!map->tensor_start || !map->subgroup_start || !map->subgroup_first || !map->tensor_first || !map->pieces) {
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
	map->subgroup_start[0] = 0;
	while (pos < total) {
		uint64_t tensor_end = map->tensor_start[t + 1];
		/* a subgroup is subgroup_size long from its start, cut at the end of the model
		 * (across tensors) or of its tensor (following them) */
		uint64_t subgroup_end = map->subgroup_start[s] + subgroup_size;
		uint64_t limit = follow_tensors ? tensor_end : total;
		if (subgroup_end > limit)
			subgroup_end = limit;
		uint64_t end = tensor_end < subgroup_end ? tensor_end : subgroup_end;
		map->pieces[n++] = (struct dos_piece){.tensor = t,
						      .subgroup = s,
						      .tensor_offset = pos - map->tensor_start[t],
						      .subgroup_offset = pos - map->subgroup_start[s],
						      .len = end - pos};
		pos = end;
		if (pos == tensor_end)
			map->tensor_first[++t] = n;
		if (pos == subgroup_end) {
			map->subgroup_first[++s] = n;
			map->subgroup_start[s] = pos;
		}
	}
	map->npieces = n;
	return 0;
}

uint32_t _dos_subgroup_of(const struct dos_subgroup_map *map, uint64_t param)
{
	uint32_t lo = 0, hi = map->nsubgroups; /* subgroup_start[lo] <= param < subgroup_start[hi] */
	while (hi - lo > 1) {
		uint32_t mid = lo + (hi - lo) / 2;
		if (map->subgroup_start[mid] <= param)
			lo = mid;
		else
			hi = mid;
	}
	return lo;
}
