/* The scatter exchange of a data-parallel job (DOS_DP_SCATTER, docs/data-parallel.md).
 * Each subgroup is cut into one chunk per rank (fewer when it has fewer elements); rank c
 * reduces chunk c of every subgroup:
 *
 *   gradients  every rank gathers its own partial gradient of a subgroup (its
 *              micro-batches, accumulated as one process would) straight into the chunks
 *              and sends chunk c to rank c, which sums the ranks' chunks in rank order
 *              (dos_grad_sum, fp32, one rounding) and sends the sum to the subgroup's
 *              owner, which puts the chunks together;
 *   weights    the owner cuts the updated weights into the same chunks and sends chunk c
 *              to rank c, which passes it on to every other rank (the owner's own chunk
 *              it sends to all); every rank's weight refresh reads the chunks where they
 *              arrived (no copy puts them together: on each rank that would be one pass
 *              over the model's updated weights per step, in series on its CPU worker).
 *
 * Each link then carries about one subgroup per subgroup each way, whatever the number of
 * ranks, and the last subgroup's gradient reaches its owner two messages after the end of
 * backward: the tail does not grow with the job, where the chain's grows by one hop per
 * rank. The price: each rank's partial gradient is rounded to the gradient dtype before
 * the sum, so the bits depend on the number of ranks (for a given number, they are the
 * same on every run and every placement). */
#ifndef DOS_SCATTER_H
#define DOS_SCATTER_H

#include <starpu.h>

#include "flat.h"
#include "optimizer.h"
#include "subgroups.h"

/* What the exchange needs of the optimizer that owns it (optimizer.c), which outlives it. */
struct _dos_scatter_context {
	const struct dos_subgroup_map *map;
	const struct _dos_optimizer_config *cfg;
	starpu_data_handle_t *tensor_grad; /* backward's, per tensor: what the gathers read */
	int copies_on_gpu;                 /* gathers run on CUDA workers */
	/* submits one of the exchange's tasks as the optimizer submits its own */
	void (*submit)(void *opt, struct starpu_task *task, enum _dos_task_phase phase, uint32_t subgroup);
	void *opt;
};

struct _dos_scatter;

/* Registers the chunk handles of the subgroups on this rank into *out. Returns 0 or
 * -ENOMEM naming what could not be allocated. */
int _dos_scatter_create(struct _dos_scatter **out, const struct _dos_scatter_context *ctx);
/* Unregisters and frees them (NULL: nothing). */
void _dos_scatter_destroy(struct _dos_scatter *x);

/* Submits one step's gradient exchange: afterwards grad[s] of every subgroup s this rank
 * owns holds the job's summed gradient. */
void _dos_scatter_submit_gradients(struct _dos_scatter *x, starpu_data_handle_t *grad);
/* Submits one step's weight exchange: afterwards every rank has the owner's updated
 * weights of every subgroup s, in weights[s] on the owner and in the received chunks
 * elsewhere (where _dos_scatter_refresh_pieces points the refresh). */
void _dos_scatter_submit_weights(struct _dos_scatter *x, starpu_data_handle_t *weights);
/* The sources of a weight refresh that copies [at, at + len) of subgroup s's updated
 * weights to `destination_offset` of its tensor: `whole` (the subgroup's updated weights)
 * where this rank owns s, else the chunks received from the others, read in place (one
 * source per chunk the range crosses). Writes the sources at sources[nsources...] and
 * their pieces at pieces[0...]; returns how many (at most the rank count). */
uint32_t _dos_scatter_refresh_pieces(const struct _dos_scatter *x, uint32_t s, starpu_data_handle_t whole, uint64_t at,
				     uint64_t len, uint64_t destination_offset, starpu_data_handle_t *sources,
				     uint32_t nsources, struct dos_flat_piece *pieces);
/* Drops the chunks of the step just submitted once their last reader has run, so that no
 * dead copy of them is ever written back over a link. */
void _dos_scatter_drop(struct _dos_scatter *x);

#endif /* DOS_SCATTER_H */
