/* The best achievable update-phase time for a step, against which every measured time
 * is printed. It extends the f* / T* model (docs/background.md) with GPU memory: in steady state
 * a resident share p_r of the parameters (at most what the budget holds) costs GPU time
 * but no state transfer, a transient share p_x costs GPU time and its state both ways,
 * the rest p_c costs CPU time; the four resources (CPU workers together, GPU, each link
 * direction) work in parallel, so
 *     T(p_r, p_x) = max(CPU(p_c), GPU(p_r + p_x), H2D(...), D2H(...))
 * and the bound is its minimum over the feasible (p_r, p_x), split continuously (no
 * subgroup granularity, no pipeline fill, no latency): a lower bound, not a plan. T is
 * convex, so the minimum over p_x for each p_r is found at a vertex of the max of lines,
 * and over p_r by ternary search.
 *
 * G GPUs: the same with the GPUs pooled into one of G times the speed, memory and
 * staging slots, whose links carry what all of theirs carry together (shared switches
 * and bridges counted once). Any schedule on the G GPUs is one on the pool, so this stays
 * a lower bound; it is reached when the work splits evenly, as it can on a symmetric
 * node. With G = 1 nothing is pooled: the one-GPU bound, unchanged. */
#include <math.h>

#include "planner.h"

struct linear {
	double at0, slope; /* resource time = at0 + slope * p_x */
};

/* The four resource times for resident params pr, as lines in the transient params. */
static void resource_lines(const struct dos_machine_costs *m, double total, double pr, struct linear l[4])
{
	double cpu_rate = m->cpu_seconds_per_param * m->host_contention / (m->ncpu_workers > 0 ? m->ncpu_workers : 1);
	double pc0 = total - pr; /* CPU params when p_x = 0; each p_x moves one param off the CPU */
	l[0] = (struct linear){pc0 * cpu_rate, -cpu_rate};
	l[1] = (struct linear){pr * m->gpu_seconds_per_param, m->gpu_seconds_per_param};
	double h_res = dos_gpu_path_h2d_bytes(m, 1.0, 1), h_tr = dos_gpu_path_h2d_bytes(m, 1.0, 0);
	double h_cpu = dos_cpu_path_h2d_bytes(m, 1.0);
	l[2] = (struct linear){(pr * h_res + pc0 * h_cpu) / m->h2d_bytes_per_second,
			       (h_tr - h_cpu) / m->h2d_bytes_per_second};
	double d_res = dos_gpu_path_d2h_bytes(m, 1.0, 1), d_tr = dos_gpu_path_d2h_bytes(m, 1.0, 0);
	double d_cpu = dos_cpu_path_d2h_bytes(m, 1.0);
	l[3] = (struct linear){(pr * d_res + pc0 * d_cpu) / m->d2h_bytes_per_second,
			       (d_tr - d_cpu) / m->d2h_bytes_per_second};
}

static double max_at(const struct linear l[4], double x)
{
	double t = 0;
	for (int i = 0; i < 4; i++)
		t = fmax(t, l[i].at0 + l[i].slope * x);
	return t;
}

/* min over x in [0, hi] of the max of the lines: at an end or where two lines cross. */
static double best_transient(const struct linear l[4], double hi)
{
	double best = fmin(max_at(l, 0), max_at(l, hi));
	for (int i = 0; i < 4; i++)
		for (int j = i + 1; j < 4; j++) {
			double ds = l[i].slope - l[j].slope;
			if (ds == 0)
				continue;
			double x = (l[j].at0 - l[i].at0) / ds;
			if (x > 0 && x < hi)
				best = fmin(best, max_at(l, x));
		}
	return best;
}

static double best_for_resident(const struct dos_machine_costs *m, double total, double pr, int transient_allowed)
{
	struct linear l[4];
	resource_lines(m, total, pr, l);
	return transient_allowed ? best_transient(l, total - pr) : max_at(l, 0);
}

/* min over resident params in [0, resident_room / 12 B] (ternary search: convex); the
 * minimising resident params in *pr. */
static double best_resident_split(const struct dos_machine_costs *m, double total, double resident_room,
				  int transient_allowed, double *pr)
{
	double lo = 0, hi = fmin(total, resident_room / DOS_STATE_BYTES_PER_PARAM);
	for (int it = 0; it < 200 && hi - lo > 1e-9 * total; it++) {
		double a = lo + (hi - lo) / 3, b = hi - (hi - lo) / 3;
		if (best_for_resident(m, total, a, transient_allowed) <=
		    best_for_resident(m, total, b, transient_allowed))
			hi = b;
		else
			lo = a;
	}
	*pr = 0.5 * (lo + hi);
	return best_for_resident(m, total, *pr, transient_allowed);
}

/* The bound on one GPU, or on a pool of GPUs described as one, keeping `slots` staging
 * slots per GPU of the pool. */
static double bound_on(const struct dos_machine_costs *m, const struct dos_plan_subgroup *sg, int n, int slots,
		       double *resident_params)
{
	double unused;
	if (!resident_params)
		resident_params = &unused;
	*resident_params = 0;
	double total = 0, biggest = 0;
	for (int i = 0; i < n; i++) {
		total += sg[i].params;
		biggest = fmax(biggest, sg[i].params);
	}
	if (total <= 0)
		return 0.0;
	if (!isfinite(m->gpu_seconds_per_param) || fmax(m->gpu_budget_bytes, dos_staging_room_bytes(m, 0.0)) <= 0)
		return best_for_resident(m, total, 0.0, 0);
	/* Either the whole budget holds resident state, or two staging slots of the biggest
	 * subgroup stay free for state in transit (as the planner keeps them; during the
	 * update window they may also use the room the application leaves then): the
	 * better. */
	double only_resident = best_resident_split(m, total, fmax(0.0, m->gpu_budget_bytes), 0, resident_params);
	double slot_bytes = slots * biggest * dos_staging_bytes_per_param(m);
	if (dos_staging_room_bytes(m, 0.0) < slot_bytes)
		return only_resident;
	double pr;
	double with_staging = best_resident_split(
		m, total, fmax(0.0, fmin(m->gpu_budget_bytes, dos_staging_room_bytes(m, slot_bytes))), 1, &pr);
	if (with_staging < only_resident) {
		*resident_params = pr;
		return with_staging;
	}
	return only_resident;
}

/* The node's GPUs as the one GPU the bound plans on (the header comment), with the
 * staging slots that pool keeps. */
static const struct dos_machine_costs *node_as_one_gpu(const struct dos_machine_costs *m,
						       struct dos_machine_costs *pool, int *slots)
{
	*slots = 2;
	if (m->ngpus <= 1)
		return m;
	double g = m->ngpus;
	*pool = *m;
	pool->gpu_seconds_per_param = m->gpu_seconds_per_param / g;
	pool->h2d_bytes_per_second = m->node_h2d_bytes_per_second;
	pool->d2h_bytes_per_second = m->node_d2h_bytes_per_second;
	pool->gpu_budget_bytes = m->gpu_budget_bytes * g;
	pool->gpu_update_extra_bytes = m->gpu_update_extra_bytes * g;
	pool->staging_margin_bytes = m->staging_margin_bytes * g;
	*slots = 2 * m->ngpus;
	return pool;
}

double _dos_bound_seconds(const struct dos_machine_costs *m, const struct dos_plan_subgroup *sg, int n,
			  double *resident_params)
{
	struct dos_machine_costs pool;
	int slots;
	const struct dos_machine_costs *one = node_as_one_gpu(m, &pool, &slots);
	return bound_on(one, sg, n, slots, resident_params);
}

/* The time of `resident`, `staged` and `cpu` whole subgroups of `size` params each on one
 * GPU (or the pool), their CPU updates shared by the workers: the four resources' loads,
 * as in the continuous bound, each with the fill that whole tasks cannot avoid. A
 * gradient made on the GPU crosses the link before the CPU can update with it; a staged
 * subgroup's state arrives before its update and leaves after it, so the first staged
 * update waits for one transfer in, the last ends one update and one write-back after
 * the last transfer in, and the write-backs follow the first update. */
static double whole_split_seconds(const struct dos_machine_costs *m, double size, int resident, int staged, int cpu)
{
	struct linear l[4]; /* the loads as in the continuous bound; the CPU's is counted whole below */
	resource_lines(m, size * (resident + staged + cpu), size * resident, l);
	double t = 0;
	for (int k = 1; k < 4; k++)
		t = fmax(t, l[k].at0 + l[k].slope * size * staged);
	int ncpu = m->ncpu_workers > 0 ? m->ncpu_workers : 1;
	double cpu_update = size * m->cpu_seconds_per_param * m->host_contention;
	double gpu_update = size * m->gpu_seconds_per_param;
	if (cpu > 0) {
		double grad_down = dos_cpu_path_d2h_bytes(m, size) / m->d2h_bytes_per_second;
		t = fmax(t, grad_down + ceil((double)cpu / ncpu) * cpu_update);
	}
	if (staged > 0) {
		double in = dos_gpu_path_h2d_bytes(m, size, 0) / m->h2d_bytes_per_second;
		double back = dos_gpu_path_d2h_bytes(m, size, 0) / m->d2h_bytes_per_second;
		t = fmax(t, in + staged * gpu_update + back);
		t = fmax(t, staged * in + gpu_update + back);
		t = fmax(t, in + gpu_update + staged * back);
	}
	return t;
}

/* The same bound counting whole subgroups, where every subgroup has the same size: the
 * update of a subgroup is one task, which runs whole on one worker and moves whole. The
 * least, over the numbers of subgroups kept resident, staged and updated on the CPU that
 * the same memory rules allow, of whole_split_seconds. Still a lower bound (no latency,
 * each resource's fill counted alone), never below the continuous one, and above it where
 * the continuous split sits a fraction of a subgroup away from every schedule: 50
 * subgroups of 1e8 on an h100-pcie5 whose CPU worker updates one in 45 ms and whose GPU
 * holds 47.25 subgroups' state: the continuous split gives the CPU 2.75 subgroups, every
 * schedule 3, and their first gradient must come down first (136 + 8 ms against the
 * continuous 125). Subgroups of different sizes: the continuous bound. */
double _dos_bound_whole_subgroups_seconds(const struct dos_machine_costs *m, const struct dos_plan_subgroup *sg, int n)
{
	struct dos_machine_costs pool;
	int slots;
	const struct dos_machine_costs *one = node_as_one_gpu(m, &pool, &slots);
	double continuous = bound_on(one, sg, n, slots, NULL);
	if (n <= 0 || !isfinite(continuous) || !isfinite(one->gpu_seconds_per_param) ||
	    fmax(one->gpu_budget_bytes, dos_staging_room_bytes(one, 0.0)) <= 0)
		return continuous;
	double size = sg[0].params;
	for (int i = 1; i < n; i++)
		if (sg[i].params != size)
			return continuous;
	double state = size * DOS_STATE_BYTES_PER_PARAM;
	double slot_bytes = slots * size * dos_staging_bytes_per_param(one);
	int staging = dos_staging_room_bytes(one, 0.0) >= slot_bytes;
	double room_alone = fmax(0.0, one->gpu_budget_bytes);
	double room_beside_slots =
		staging ? fmax(0.0, fmin(one->gpu_budget_bytes, dos_staging_room_bytes(one, slot_bytes))) : 0.0;
	double best = INFINITY;
	for (int resident = 0; resident <= n; resident++) {
		int may_stage = staging && resident * state <= room_beside_slots;
		if (!may_stage && resident * state > room_alone)
			break;
		for (int staged = 0; staged <= (may_stage ? n - resident : 0); staged++)
			best = fmin(best, whole_split_seconds(one, size, resident, staged, n - resident - staged));
	}
	return fmax(best, continuous);
}
