/* Step planning for the dos policy.
 *
 * The update phase has four resources that work in parallel: the CPU workers, the GPU,
 * and the two directions of the PCIe link (full duplex). A subgroup updated on the CPU
 * costs CPU time (slowed by DMA contention) plus, when gradients and 16-bit weights live
 * on the GPU, a gradient copy down and a weight copy up. A subgroup updated on the GPU
 * costs GPU time plus its 12 B/param of state up and back down, unless the state is
 * already resident, or stays resident afterwards when GPU memory allows (then nothing
 * crosses the link for it in later steps: the Twin-Flow gain, chosen by the model rather
 * than by a fixed ratio).
 *
 * _dos_plan_step is list scheduling with look-ahead over the whole step: subgroups whose
 * state is already on the GPU go first (they cost no transfer; in the GPU's timeline
 * those with nothing to wait for fill its idle time rather than delay the staged ones),
 * then every other subgroup
 * in submission order goes to the path that finishes it earliest given the queues
 * already planned on each resource, where a transfer starts when its link is free (not
 * "now", as dmda assumes) and a GPU-transient subgroup needs one of a few staging slots
 * that memory allows. The CPU share that comes out is the f* = t_c / (t_c + t_x) split
 * of docs/background.md when memory is plentiful, shifts towards resident GPU work as memory
 * allows, and falls back to the CPU when the GPU has no room. O(n * cpu workers).
 *
 * The rest of the iteration enters in two ways (docs/policy.md, whole-iteration rules):
 * the GPU lane starts when the application's work queued on the GPU ends, so a GPU
 * update costs what it delays; and state the plan takes on as resident for later steps
 * may, when that finishes it earlier, be updated on the CPU this step and moved to the
 * GPU while the link idles in the next forward and backward (DOS_PLACE_CPU_THEN_RESIDENT,
 * up to promote_bytes), instead of paying its transfer in this update phase. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "planner.h"

struct timeline {
	int ncpu;
	double *cpu_free;
	/* gpu_free: when the GPU ends the updates that wait for a transfer in, in plan order;
	 * gpu_start + gpu_work: when it ends all of them, those with nothing to wait for
	 * (state resident, inputs on the GPU) filling its idle time in between */
	double gpu_free, gpu_start, gpu_work, h2d_free, d2h_free;
	double resident_bytes;
	int nslots;
	double slot_free[DOS_MAX_STAGING_SLOTS];
	double makespan;
};

/* What one subgroup on one path would do to the timeline. */
struct outcome {
	int feasible;
	double finish;
	int cpu;    /* the CPU worker used, or -1 */
	int slot;   /* the transient slot used, or -1 */
	double end; /* when the update itself ends (its copies aside) */
	double cpu_free, gpu_free, gpu_work, h2d_free, d2h_free, slot_free, resident_bytes;
};

static double transfer_seconds(double bytes, double bytes_per_second, double latency)
{
	return bytes > 0 ? latency + bytes / bytes_per_second : 0.0;
}

static int earliest(const double *free_at, int n)
{
	int best = 0;
	for (int i = 1; i < n; i++)
		if (free_at[i] < free_at[best])
			best = i;
	return best;
}

static struct outcome simulate(const struct timeline *t, const struct dos_machine_costs *m, double params,
			       int resident_now, enum dos_placement place)
{
	struct outcome o = {.feasible = 1,
			    .cpu = -1,
			    .slot = -1,
			    .cpu_free = 0,
			    .gpu_free = t->gpu_free,
			    .gpu_work = t->gpu_work,
			    .h2d_free = t->h2d_free,
			    .d2h_free = t->d2h_free,
			    .resident_bytes = t->resident_bytes};
	double state = params * DOS_STATE_BYTES_PER_PARAM;
	if (place == DOS_PLACE_CPU) {
		/* The CPU path's small copies (gradient down, 16-bit weights up) fill gaps on the
		 * link rather than queueing behind the GPU path's state: they occupy the link
		 * for their duration (its total load stays right) without delaying the CPU
		 * beyond their own length. */
		double down = transfer_seconds(dos_cpu_path_d2h_bytes(m, params), m->d2h_bytes_per_second,
					       m->link_latency_seconds);
		double up = transfer_seconds(dos_cpu_path_h2d_bytes(m, params), m->h2d_bytes_per_second,
					     m->link_latency_seconds);
		o.d2h_free = t->d2h_free + down;
		o.h2d_free = t->h2d_free + up;
		o.cpu = earliest(t->cpu_free, t->ncpu);
		o.cpu_free = fmax(t->cpu_free[o.cpu], down) + m->cpu_task_seconds +
			     params * m->cpu_seconds_per_param * m->host_contention;
		o.end = o.cpu_free;
		o.finish = fmax(o.cpu_free + up, fmax(o.d2h_free, o.h2d_free));
		return o;
	}
	if (place == DOS_PLACE_CPU_THEN_RESIDENT) {
		/* this step it is a CPU update; its state then takes GPU memory for good */
		o = simulate(t, m, params, resident_now, DOS_PLACE_CPU);
		o.resident_bytes += state;
		o.feasible = o.resident_bytes <= m->gpu_budget_bytes;
		return o;
	}
	int keep = place == DOS_PLACE_GPU_RESIDENT;
	double ready = 0.0;
	if (keep) {
		if (!resident_now) {
			o.resident_bytes += state;
			o.feasible = o.resident_bytes <= m->gpu_budget_bytes;
		}
	} else {
		o.feasible = t->nslots > 0;
		if (t->nslots > 0) {
			o.slot = earliest(t->slot_free, t->nslots);
			ready = t->slot_free[o.slot];
		}
	}
	double up = transfer_seconds(dos_gpu_path_h2d_bytes(m, params, resident_now), m->h2d_bytes_per_second,
				     m->link_latency_seconds);
	double in_end = up > 0 ? fmax(t->h2d_free, ready) + up : ready;
	o.h2d_free = up > 0 ? in_end : t->h2d_free;
	double work = m->gpu_task_seconds + params * m->gpu_seconds_per_param;
	o.gpu_work = t->gpu_work + work;
	if (up > 0) {
		o.gpu_free = fmax(t->gpu_free, in_end) + work;
		o.end = o.gpu_free;
	} else {
		/* Nothing to wait for: it counts in the GPU's work, not ahead of the staged
		 * updates in the timeline, and ends at the latest once the GPU has done all the
		 * work placed so far. Queued ahead of them (pass 1 places these first), 47 ms of
		 * resident updates made every staged update end after them, and staging never
		 * paid on a GPU that holds nearly all the state (h100-pcie5, 20B in subgroups of
		 * 2.5e7: 184 resident, 6 staged, 10 on the CPU now, 118 ms; 189 resident and 11
		 * on the CPU before, 127 ms). Optimistic where the GPU's queue runs a
		 * staged update after resident ones (next_gpu_task keeps the plan's order among
		 * updates); measured, the plans it makes are faster or the same everywhere
		 * (results/whole-subgroups-sim-2026-12-05.md). */
		o.end = t->gpu_start + o.gpu_work;
	}
	double down = transfer_seconds(dos_gpu_path_d2h_bytes(m, params, keep), m->d2h_bytes_per_second,
				       m->link_latency_seconds);
	o.d2h_free = down > 0 ? fmax(t->d2h_free, o.end) + down : t->d2h_free;
	o.finish = down > 0 ? o.d2h_free : o.end;
	o.slot_free = o.finish;
	/* whatever its own end, the GPU now has that much more work to do */
	o.finish = fmax(o.finish, t->gpu_start + o.gpu_work);
	return o;
}

static void commit(struct timeline *t, const struct outcome *o)
{
	if (o->cpu >= 0) {
		t->cpu_free[o->cpu] = o->cpu_free;
	} else {
		t->gpu_free = o->gpu_free;
		t->gpu_work = o->gpu_work;
		t->makespan = fmax(t->makespan, t->gpu_start + t->gpu_work);
	}
	if (o->slot >= 0)
		t->slot_free[o->slot] = o->slot_free;
	t->h2d_free = o->h2d_free;
	t->d2h_free = o->d2h_free;
	t->resident_bytes = o->resident_bytes;
	t->makespan = fmax(t->makespan, o->finish);
}

static int timeline_init(struct timeline *t, const struct dos_machine_costs *m)
{
	memset(t, 0, sizeof *t);
	t->ncpu = m->ncpu_workers > 0 ? m->ncpu_workers : 1;
	t->cpu_free = calloc((size_t)t->ncpu, sizeof(double));
	/* the GPU finishes the application's queued work first: an update placed there waits
	 * for it, which is what a GPU update costs a GPU-bound iteration */
	t->gpu_free = t->gpu_start = m->gpu_busy_ahead_seconds > 0 ? m->gpu_busy_ahead_seconds : 0.0;
	return t->cpu_free ? 0 : -1;
}

/* An update that costs the GPU more in its fixed cost per task than in work: a norm's or a
 * bias's few thousand parameters. Residency saves such a subgroup next to nothing, and
 * the residency goal (the bound's continuous split, which knows no fixed cost) does not
 * apply to it: it goes wherever it finishes first, which is usually a CPU worker left idle
 * by backward, taking its fixed cost off the GPU (as dmda does; 33 norms of the 1b model:
 * 0.17 ms of GPU time per step). */
static int launch_bound(const struct dos_machine_costs *m, double params)
{
	return params * m->gpu_seconds_per_param < m->gpu_task_seconds;
}

static double max_params(const struct dos_plan_subgroup *sg, int n)
{
	double x = 0;
	for (int i = 0; i < n; i++)
		x = fmax(x, sg[i].params);
	return x;
}

double _dos_plan_predict(const struct dos_machine_costs *m, const struct dos_plan_subgroup *sg, int n,
			 const enum dos_placement *placement)
{
	struct timeline t;
	if (timeline_init(&t, m))
		return NAN;
	/* the resident state this placement keeps decides the staging room */
	double keep = 0;
	for (int i = 0; i < n; i++)
		if (placement[i] == DOS_PLACE_GPU_RESIDENT || placement[i] == DOS_PLACE_CPU_THEN_RESIDENT)
			keep += sg[i].params * DOS_STATE_BYTES_PER_PARAM;
	t.nslots = dos_staging_slots(m, keep, max_params(sg, n));
	if (t.nslots == 0)
		t.nslots = 1; /* predict what was asked, even if it does not fit */
	for (int pass = 0; pass < 2; pass++)
		for (int i = 0; i < n; i++) {
			int first = placement[i] == DOS_PLACE_GPU_RESIDENT && sg[i].resident_now;
			if (first != (pass == 0))
				continue;
			struct outcome o = simulate(&t, m, sg[i].params, sg[i].resident_now, placement[i]);
			commit(&t, &o);
		}
	free(t.cpu_free);
	return t.makespan;
}

/* One plan in which resident state may occupy at most `resident_cap` bytes, and new
 * resident state is taken on, whatever it costs in this step, until `resident_goal`
 * params are resident: residency pays in every later step, which an earliest-finish rule
 * looking at this step alone would never see. New resident state leaves room for two
 * staging slots; with `spend_slot_reserve`, nothing is staged and one subgroup per plan
 * may take that room. */
static double plan_with_resident_cap(const struct dos_machine_costs *m, const struct dos_plan_subgroup *sg, int n,
				     double resident_cap, double resident_goal, int spend_slot_reserve,
				     enum dos_placement *out)
{
	struct timeline t;
	if (timeline_init(&t, m))
		return NAN;
	double biggest = max_params(sg, n), promoted = 0;
	int spent = 0;
	/* Pass 1: state already on the GPU stays there while the cap holds it (launch-bound
	 * updates wait for pass 2). */
	for (int i = 0; i < n; i++) {
		out[i] = DOS_PLACE_CPU;
		if (!sg[i].resident_now || launch_bound(m, sg[i].params))
			continue;
		double state = sg[i].params * DOS_STATE_BYTES_PER_PARAM;
		if (t.resident_bytes + state <= resident_cap) {
			t.resident_bytes += state;
			out[i] = DOS_PLACE_GPU_RESIDENT;
		}
	}
	t.nslots = dos_staging_slots(m, t.resident_bytes, biggest);
	for (int i = 0; i < n; i++)
		if (out[i] == DOS_PLACE_GPU_RESIDENT) {
			struct outcome o = simulate(&t, m, sg[i].params, 1, DOS_PLACE_GPU_RESIDENT);
			commit(&t, &o);
		}
	/* Pass 2: everything else, earliest finish first; new residents only within the cap
	 * and while enough room stays for the staging slots, so that residency never blocks
	 * the link path. */
	for (int i = 0; i < n; i++) {
		if (out[i] == DOS_PLACE_GPU_RESIDENT)
			continue;
		struct outcome best = simulate(&t, m, sg[i].params, sg[i].resident_now, DOS_PLACE_CPU);
		enum dos_placement choice = DOS_PLACE_CPU;
		double state = sg[i].params * DOS_STATE_BYTES_PER_PARAM;
		if (launch_bound(m, sg[i].params)) {
			/* A CPU worker or the GPU (state kept there), whichever ends the update
			 * first; its copies are a few kilobytes that fill gaps on the link, so
			 * the link's queue does not decide. State resident now was not counted
			 * in pass 1. */
			double added = sg[i].resident_now ? state : 0.0;
			if (t.resident_bytes + state <= resident_cap) {
				struct outcome o =
					simulate(&t, m, sg[i].params, sg[i].resident_now, DOS_PLACE_GPU_RESIDENT);
				o.resident_bytes += added;
				if (o.feasible && o.end < best.end)
					best = o, choice = DOS_PLACE_GPU_RESIDENT;
			}
			commit(&t, &best);
			out[i] = choice;
			if (choice == DOS_PLACE_GPU_RESIDENT)
				t.nslots = dos_staging_slots(m, t.resident_bytes, biggest);
			continue;
		}
		int slots_after = dos_staging_slots(m, t.resident_bytes + state, biggest);
		int keeps_slots = slots_after >= (t.nslots < 2 ? t.nslots : 2);
		int spends = !keeps_slots && spend_slot_reserve && !spent;
		if (t.resident_bytes + state <= resident_cap && (keeps_slots || spends)) {
			struct outcome o = simulate(&t, m, sg[i].params, sg[i].resident_now, DOS_PLACE_GPU_RESIDENT);
			int short_of_goal =
				t.resident_bytes / DOS_STATE_BYTES_PER_PARAM + sg[i].params <= resident_goal;
			if (o.feasible && (short_of_goal || o.finish < best.finish)) {
				best = o, choice = DOS_PLACE_GPU_RESIDENT;
				/* Residency taken on for later steps: its transfer costs this update
				 * phase, unless the state moves after a CPU update instead, while the
				 * link idles in the next forward and backward (as much as that time
				 * carries); then the earlier finish of the two. */
				if (short_of_goal && !sg[i].resident_now && promoted + state <= m->promote_bytes) {
					struct outcome later =
						simulate(&t, m, sg[i].params, 0, DOS_PLACE_CPU_THEN_RESIDENT);
					if (later.feasible && later.finish < o.finish)
						best = later, choice = DOS_PLACE_CPU_THEN_RESIDENT;
				}
			}
		}
		if (t.nslots > 0 && !spend_slot_reserve) {
			struct outcome o = simulate(&t, m, sg[i].params, sg[i].resident_now, DOS_PLACE_GPU_TRANSIENT);
			if (o.feasible && o.finish < best.finish)
				best = o, choice = DOS_PLACE_GPU_TRANSIENT;
		}
		commit(&t, &best);
		out[i] = choice;
		if (choice == DOS_PLACE_CPU_THEN_RESIDENT)
			promoted += state;
		if (choice == DOS_PLACE_GPU_RESIDENT || choice == DOS_PLACE_CPU_THEN_RESIDENT) {
			t.nslots = dos_staging_slots(m, t.resident_bytes, biggest);
			spent |= spends && !sg[i].resident_now;
		}
	}
	free(t.cpu_free);
	return t.makespan;
}

/* The time of `place` once its resident state is already on the GPU: what every step
 * after this one costs, the quantity worth minimising. */
static double steady_state_seconds(const struct dos_machine_costs *m, const struct dos_plan_subgroup *sg, int n,
				   const enum dos_placement *place, struct dos_plan_subgroup *scratch,
				   enum dos_placement *steady)
{
	for (int i = 0; i < n; i++) {
		scratch[i] = sg[i];
		steady[i] = place[i] == DOS_PLACE_CPU_THEN_RESIDENT ? DOS_PLACE_GPU_RESIDENT : place[i];
		scratch[i].resident_now = steady[i] == DOS_PLACE_GPU_RESIDENT;
	}
	return _dos_plan_predict(m, scratch, n, steady);
}

double _dos_plan_step(const struct dos_machine_costs *m, const struct dos_plan_subgroup *sg, int n,
		      enum dos_placement *out)
{
	/* Candidates: the resident share of the bound's optimum rounded down or up to whole
	 * subgroups, each with the whole budget open to residency (less the copies one GPU
	 * update needs beside it: dos_resident_room_bytes) or with two staging slots kept
	 * free (keeping every resident subgroup can leave no room to stage others). The
	 * candidate with the best steady state wins; this step's time is what it returns.
	 * Residency never takes the last two slots' room, except in a third kind of candidate
	 * that stages nothing: where the updates left over are better on the CPU than staged
	 * (a GPU that holds nearly all the state), that room is worth resident subgroups. It
	 * spends it on one more subgroup per step, so that the first steps do not pay all
	 * the transfers at once, and only while the step stays faster than with the GPU left
	 * out (on a slow link it does not). Not on pooled GPUs, where each GPU keeps a slot
	 * of its own beside its resident state (dos_policy.c, step_costs), which the pool's
	 * budget cannot show. */
	double goal, biggest = max_params(sg, n);
	struct dos_machine_costs one_gpu = *m; /* this plan places on one GPU */
	one_gpu.ngpus = 1;
	_dos_bound_seconds(&one_gpu, sg, n, &goal);
	double slots = 2 * biggest * dos_staging_bytes_per_param(m);
	double goals[2] = {goal, goal + biggest};
	double room = dos_resident_room_bytes(m, m->gpu_budget_bytes, biggest);
	double caps[3] = {room, fmin(room, dos_staging_room_bytes(m, slots)), room};
	enum dos_placement *cand = malloc((size_t)n * sizeof *cand), *steady_place = malloc((size_t)n * sizeof *cand);
	struct dos_plan_subgroup *scratch = malloc((size_t)n * sizeof *scratch);
	double best_now = plan_with_resident_cap(m, sg, n, caps[0], goals[0], 0, out);
	if (!cand || !steady_place || !scratch || !isfinite(best_now)) {
		free(cand);
		free(steady_place);
		free(scratch);
		return best_now;
	}
	double best_steady = steady_state_seconds(m, sg, n, out, scratch, steady_place);
	double all_cpu = NAN; /* predicted only for the candidates that need it: a pass over n */
	for (int g = 0; g < 2; g++)
		for (int c = 0; c < 3; c++) {
			int spend_reserve = c == 2;
			if ((g == 0 && c == 0) || caps[c] <= 0 || (spend_reserve && m->pooled_gpus > 1))
				continue;
			if (spend_reserve && isnan(all_cpu)) {
				_dos_plan_all_cpu(n, cand);
				all_cpu = _dos_plan_predict(m, sg, n, cand);
			}
			double now = plan_with_resident_cap(m, sg, n, caps[c], goals[g], spend_reserve, cand);
			if (spend_reserve && !(now <= all_cpu))
				continue;
			double steady = steady_state_seconds(m, sg, n, cand, scratch, steady_place);
			if (steady < best_steady || (steady == best_steady && now < best_now)) {
				memcpy(out, cand, (size_t)n * sizeof *cand);
				best_now = now;
				best_steady = steady;
			}
		}
	free(cand);
	free(steady_place);
	free(scratch);
	return best_now;
}

void _dos_plan_all_cpu(int n, enum dos_placement *out)
{
	for (int i = 0; i < n; i++)
		out[i] = DOS_PLACE_CPU;
}

void _dos_plan_stride(int n, int k, enum dos_placement *out)
{
	for (int i = 0; i < n; i++)
		out[i] = (k > 0 && i % k == k - 1) ? DOS_PLACE_GPU_TRANSIENT : DOS_PLACE_CPU;
}

void _dos_plan_resident(int n, double ratio, enum dos_placement *out)
{
	int keep = (int)floor(ratio * n + 0.5);
	for (int i = 0; i < n; i++)
		out[i] = i < keep ? DOS_PLACE_GPU_RESIDENT : DOS_PLACE_CPU;
}
