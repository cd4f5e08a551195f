/* Placement of one step's subgroup updates (see planner.c for the algorithm). Pure
 * functions over the cost model: the policy calls them, tests call them with made-up
 * costs. */
#ifndef DOS_PLANNER_H
#define DOS_PLANNER_H

#include "cost_model.h"

enum dos_placement {
	DOS_PLACE_CPU = 0,
	DOS_PLACE_GPU_RESIDENT = 1,  /* updated on the GPU, state kept there afterwards */
	DOS_PLACE_GPU_TRANSIENT = 2, /* state brought in, updated, written back */
	/* updated on the CPU, then its state moves to the GPU while the link idles during the
	 * next forward and backward: resident from the next step on, without a transfer in
	 * any update phase */
	DOS_PLACE_CPU_THEN_RESIDENT = 3,
};

struct dos_plan_subgroup {
	double params;
	int resident_now; /* its state is valid on the GPU already */
};

/* Plans the `n` subgroups of a step (in submission order) for the dos policy; writes
 * out[i] and returns the predicted update-phase time. */
double _dos_plan_step(const struct dos_machine_costs *m, const struct dos_plan_subgroup *sg, int n,
		      enum dos_placement *out);

/* Predicted update-phase time of a given placement (same event model as _dos_plan_step),
 * for the static baselines and for tests. */
double _dos_plan_predict(const struct dos_machine_costs *m, const struct dos_plan_subgroup *sg, int n,
			 const enum dos_placement *placement);

/* The static baselines of the published systems, on the same subgroups. */
void _dos_plan_all_cpu(int n, enum dos_placement *out);
void _dos_plan_stride(int n, int k, enum dos_placement *out);          /* DOS prototype */
void _dos_plan_resident(int n, double ratio, enum dos_placement *out); /* Twin-Flow */

/* Best achievable update-phase time for these subgroups (bound.c), in steady state, on
 * the m->ngpus GPUs of the node; the resident parameters that achieve it in
 * *resident_params (may be NULL), over all GPUs. */
double _dos_bound_seconds(const struct dos_machine_costs *m, const struct dos_plan_subgroup *sg, int n,
			  double *resident_params);

/* The same, counting whole subgroups where they all have the same size (bound.c): the
 * best any schedule of these update tasks can do in the same model. */
double _dos_bound_whole_subgroups_seconds(const struct dos_machine_costs *m, const struct dos_plan_subgroup *sg, int n);

#endif /* DOS_PLANNER_H */
