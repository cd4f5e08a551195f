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
 *              it sends to all); every rank puts them together for the weight refresh.
 *
 * Each link then carries about one subgroup per subgroup each way, whatever the number of
 * ranks, and the last subgroup's gradient reaches its owner two messages after the end of
 * backward: the tail does not grow with the job, where the chain's grows by one hop per
 * rank. The price: each rank's partial gradient is rounded to the gradient dtype before
 * the sum, so the bits depend on the number of ranks (for a given number, they are the
 * same on every run and every placement). */
#ifndef DOS_SCATTER_H
#define DOS_SCATTER_H

struct dos_optimizer;
struct dos_scatter;

/* Registers the chunk handles of `opt`'s subgroups on this rank into *out. Returns 0 or
 * -ENOMEM naming what could not be allocated. */
int dos_scatter_create(struct dos_scatter **out, const struct dos_optimizer *opt);
/* Unregisters and frees them (NULL: nothing). */
void dos_scatter_destroy(struct dos_scatter *x);

/* Submits one step's gradient exchange: afterwards every owned subgroup's grad_h holds
 * the job's summed gradient. */
void dos_scatter_submit_gradients(struct dos_optimizer *opt);
/* Submits one step's weight exchange: afterwards every subgroup's updated weights
 * (dos_optimizer_updated_weights) hold the owner's on every rank. */
void dos_scatter_submit_weights(struct dos_optimizer *opt);
/* Drops the chunks of the step just submitted once their last reader has run, so that no
 * dead copy of them is ever written back over a link. */
void dos_scatter_drop(struct dos_optimizer *opt);

#endif /* DOS_SCATTER_H */
