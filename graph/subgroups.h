/* The subgroup map: the one place that decides how the flat parameter space (all tensors
 * concatenated in order) is cut into optimizer subgroups, and how each subgroup and each
 * tensor are pieced together from the other. A subgroup is a contiguous slice of
 * `subgroup_size` parameters (the last one may be shorter); it may begin and end inside a
 * tensor and may span many small tensors. */
#ifndef DOS_SUBGROUPS_H
#define DOS_SUBGROUPS_H

#include <stddef.h>
#include <stdint.h>

/* The intersection of one tensor and one subgroup. Pieces are stored in flat order, which
 * sorts them by tensor and by subgroup at once. */
struct dos_piece {
	uint32_t tensor, subgroup;
	uint64_t tensor_offset;   /* where the piece starts inside its tensor */
	uint64_t subgroup_offset; /* ... and inside its subgroup */
	uint64_t len;
};

struct dos_subgroup_map {
	uint64_t nparams, subgroup_size;
	uint32_t ntensors, nsubgroups;
	uint64_t *tensor_start;   /* [ntensors + 1]: flat offset of each tensor */
	uint32_t *subgroup_first; /* [nsubgroups + 1]: first piece of each subgroup */
	uint32_t *tensor_first;   /* [ntensors + 1]: first piece of each tensor */
	struct dos_piece *pieces; /* [npieces] */
	uint32_t npieces;
};

/* Builds the map of `ntensors` tensors of `numel[t]` elements cut into subgroups of
 * `subgroup_size`. Errors (message in dos_last_error()): -EINVAL for NULL, no tensors, an
 * empty tensor, subgroup_size 0 or larger than the whole model, or more than 2^32
 * subgroups or pieces; -ENOMEM. */
int _dos_subgroup_map_build(struct dos_subgroup_map *map, const uint64_t *numel, uint32_t ntensors,
			    uint64_t subgroup_size);
void _dos_subgroup_map_free(struct dos_subgroup_map *map);

/* Parameters in subgroup s. */
static inline uint64_t _dos_subgroup_len(const struct dos_subgroup_map *map, uint32_t s)
{
	uint64_t begin = (uint64_t)s * map->subgroup_size, end = begin + map->subgroup_size;
	return (end < map->nparams ? end : map->nparams) - begin;
}

#endif /* DOS_SUBGROUPS_H */
