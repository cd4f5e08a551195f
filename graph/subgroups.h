/* The subgroup map: the one place that decides how the flat parameter space (all tensors
 * concatenated in order) is cut into optimizer subgroups, and how each subgroup and each
 * tensor are pieced together from the other. A subgroup is a contiguous slice of the
 * flat space, cut one of two ways:
 *  - across tensors (the default): slices of `subgroup_size` parameters (the last one may
 *    be shorter), which may begin and end inside a tensor and span many small tensors;
 *  - following the tensors: each tensor is cut on its own into slices of `subgroup_size`
 *    (its last one may be shorter), so no subgroup straddles two tensors and a tensor of
 *    at most `subgroup_size` elements is exactly one subgroup, whose gradient can be the
 *    tensor's own (tile-based codes: one tile, one subgroup). */
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
	int follows_tensors;      /* cut following the tensors (see above) */
	uint64_t *tensor_start;   /* [ntensors + 1]: flat offset of each tensor */
	uint64_t *subgroup_start; /* [nsubgroups + 1]: flat offset of each subgroup */
	uint32_t *subgroup_first; /* [nsubgroups + 1]: first piece of each subgroup */
	uint32_t *tensor_first;   /* [ntensors + 1]: first piece of each tensor */
	struct dos_piece *pieces; /* [npieces] */
	uint32_t npieces;
};

/* Builds the map of `ntensors` tensors of `numel[t]` elements cut into subgroups of
 * `subgroup_size`, across tensors or, when `follow_tensors`, following them. Errors
 * (message in dos_last_error()): -EINVAL for NULL, no tensors, an empty tensor,
 * subgroup_size 0 or larger than the whole model, or more than 2^32 subgroups or pieces;
 * -ENOMEM. */
int _dos_subgroup_map_build(struct dos_subgroup_map *map, const uint64_t *numel, uint32_t ntensors,
			    uint64_t subgroup_size, int follow_tensors);
void _dos_subgroup_map_free(struct dos_subgroup_map *map);

/* Parameters in subgroup s. */
static inline uint64_t _dos_subgroup_len(const struct dos_subgroup_map *map, uint32_t s)
{
	return map->subgroup_start[s + 1] - map->subgroup_start[s];
}

/* The subgroup holding flat parameter `param` (< nparams). */
uint32_t _dos_subgroup_of(const struct dos_subgroup_map *map, uint64_t param);

/* The tensor that subgroup s is exactly (one piece covering the whole tensor), or -1. */
static inline int64_t _dos_subgroup_whole_tensor(const struct dos_subgroup_map *map, uint32_t s)
{
	const struct dos_piece *p = &map->pieces[map->subgroup_first[s]];
	int whole = map->subgroup_first[s + 1] - map->subgroup_first[s] == 1 && p->tensor_offset == 0 &&
		    p->len == map->tensor_start[p->tensor + 1] - map->tensor_start[p->tensor];
	return whole ? (int64_t)p->tensor : -1;
}

#endif /* DOS_SUBGROUPS_H */
