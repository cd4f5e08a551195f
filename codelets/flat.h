/* Codelets that move data between the tensor and subgroup views of the parameters, the
 * sum of a data-parallel job's partial gradients, and the data loader's batch codelet
 * (kernels in flat_kernels.h). */
#ifndef DOS_FLAT_H
#define DOS_FLAT_H

#include <starpu.h>

#include "flat_kernels.h"

/* buffers: the destinations (W), then the sources (R), in the order pieces refer to them. */
extern struct starpu_codelet _dos_flat_copy_codelet;
/* buffers: the sum (W), then the partials (R) in rank order. CPU only. */
extern struct starpu_codelet _dos_grad_sum_codelet;
/* buffers: corpus (uint8, R), ids (int32, W), targets (int32, W); cl_arg: uint64 starts. */
extern struct starpu_codelet _dos_batch_codelet;

/* A flat-copy task (not submitted) into `destinations` from `sources`, described by
 * `pieces`, in context `sched_ctx`. Returns 0 or -ENOMEM. */
int _dos_flat_copy_task_create(const starpu_data_handle_t *destinations, uint32_t ndestinations,
			       enum dos_dtype destination_dtype, const starpu_data_handle_t *sources,
			       enum dos_dtype source_dtype, uint32_t nsources, const struct dos_flat_piece *pieces,
			       uint32_t npieces, unsigned sched_ctx, struct starpu_task **task_out);
/* A task (not submitted) writing into `sum` the sum of `npartials` partial gradients
 * (vectors of as many elements, in rank order: _dos_grad_sum_cpu), in context
 * `sched_ctx`. Returns 0 or -ENOMEM. */
int _dos_grad_sum_task_create(starpu_data_handle_t sum, enum dos_dtype sum_dtype, const starpu_data_handle_t *partials,
			      uint32_t npartials, enum dos_dtype partial_dtype, unsigned sched_ctx,
			      struct starpu_task **task_out);

#endif /* DOS_FLAT_H */
