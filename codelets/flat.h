/* Codelets that move data between the tensor and subgroup views of the parameters, and
 * the data loader's batch codelet (kernels in flat_kernels.h). */
#ifndef DOS_FLAT_H
#define DOS_FLAT_H

#include <starpu.h>

#include "flat_kernels.h"

/* buffers: destination (W), then the sources (R) in the order pieces refer to them. */
extern struct starpu_codelet _dos_flat_copy_codelet;
/* buffers: corpus (uint8, R), ids (int32, W), targets (int32, W); cl_arg: uint64 starts. */
extern struct starpu_codelet _dos_batch_codelet;

/* A flat-copy task (not submitted) into `destination` from `sources`, described by
 * `pieces`, in context `sched_ctx`. Returns 0 or -ENOMEM. */
int _dos_flat_copy_task_create(starpu_data_handle_t destination, enum dos_dtype destination_dtype,
			       const starpu_data_handle_t *sources, enum dos_dtype source_dtype, uint32_t nsources,
			       const struct dos_flat_piece *pieces, uint32_t npieces, unsigned sched_ctx,
			       struct starpu_task **task_out);

#endif /* DOS_FLAT_H */
