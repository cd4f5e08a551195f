/* The step planner and the bound on made-up machines whose answers are known: the 20B
 * example of docs/background.md (one rank of the 4xH100 node: 50 subgroups of 1e8, all-CPU
 * update 2.27 s, 25 GB/s each way, GPU Adam at 1e11 params/s, gradients and 16-bit
 * weights on the GPU). There the best split without resident state puts ~44% of the
 * subgroups on the GPU for ~1.28 s, and 20 GB / 40 GB of resident state bring the bound
 * to ~0.85 s / ~0.43 s. The plan must come within 15% of the bound, beat the static
 * baselines on the same model, and never plan more resident state than the budget.
 * "Within" allows for what the bound ignores: whole subgroups (50 here, so one subgroup
 * is 2% of the work) and pipeline fill (the first state transfer, the last write-back). */
#include <string.h>

#include "planner.h"
#include "test_util.h"

#define N 50
#define SUBGROUP 1e8

static struct dos_machine_costs h100_rank(double budget_bytes)
{
	return (struct dos_machine_costs){
		.ncpu_workers = 1, /* DeepSpeed-style: one subgroup at a time over all cores */
		.cpu_seconds_per_param = 2.27 / 5e9,
		.gpu_seconds_per_param = 1e-11,
		.h2d_bytes_per_second = 25e9,
		.d2h_bytes_per_second = 25e9,
		.link_latency_seconds = 10e-6,
		.host_contention = 1.0,
		.gpu_budget_bytes = budget_bytes,
		.homes = {.grad_bytes_per_param = 2,
			  .weight_bytes_per_param = 2,
			  .grads_on_gpu = 1,
			  .weights_on_gpu = 1},
	};
}

static void subgroups(struct dos_plan_subgroup *sg, int resident)
{
	for (int i = 0; i < N; i++)
		sg[i] = (struct dos_plan_subgroup){.params = SUBGROUP, .resident_now = i < resident};
}

/* Resident state of a placement never exceeds the budget, and leaves room for the GPU
 * copies of the updates on the GPU that no forecast counts (a gradient and 16-bit weights
 * homed on the host). */
static void check_memory(const struct dos_machine_costs *m, const struct dos_plan_subgroup *sg,
			 const enum dos_placement *place, const char *what)
{
	double resident = 0, copies = 0;
	for (int i = 0; i < N; i++) {
		if (place[i] == DOS_PLACE_GPU_RESIDENT || place[i] == DOS_PLACE_CPU_THEN_RESIDENT)
			resident += sg[i].params * DOS_STATE_BYTES_PER_PARAM;
		if (place[i] == DOS_PLACE_GPU_RESIDENT || place[i] == DOS_PLACE_GPU_TRANSIENT)
			copies = fmax(copies, m->gpu_budget_bytes -
						      dos_resident_room_bytes(m, m->gpu_budget_bytes, sg[i].params));
	}
	CHECK(resident + copies <= m->gpu_budget_bytes,
	      "%s: %g bytes resident and %g of an update's copies over a %g budget", what, resident, copies,
	      m->gpu_budget_bytes);
}

static int gpu_count(const enum dos_placement *place)
{
	int g = 0;
	for (int i = 0; i < N; i++)
		g += place[i] == DOS_PLACE_GPU_RESIDENT || place[i] == DOS_PLACE_GPU_TRANSIENT;
	return g;
}

/* Plans a step; checks it against the bound, the baselines and the budget. */
static double check_plan(const char *what, double budget, int resident_now, double expected_bound)
{
	struct dos_machine_costs m = h100_rank(budget);
	struct dos_plan_subgroup sg[N];
	enum dos_placement place[N], base[N];
	subgroups(sg, resident_now);
	double bound = _dos_bound_seconds(&m, sg, N, NULL);
	double planned = _dos_plan_step(&m, sg, N, place);
	CHECK(fabs(_dos_plan_predict(&m, sg, N, place) - planned) < 1e-9, "%s: plan and prediction disagree", what);
	check_memory(&m, sg, place, what);
	_dos_plan_all_cpu(N, base);
	double all_cpu = _dos_plan_predict(&m, sg, N, base);
	_dos_plan_stride(N, 2, base);
	double stride2 = _dos_plan_predict(&m, sg, N, base);
	double whole = _dos_bound_whole_subgroups_seconds(&m, sg, N);
	printf("%-34s bound %.3f s (%.3f s in whole subgroups)  plan %.3f s (%.3fx bound, %d/%d on GPU)  "
	       "all-cpu %.3f s  stride-2 %.3f s\n",
	       what, bound, whole, planned, planned / bound, gpu_count(place), N, all_cpu, stride2);
	if (expected_bound > 0)
		CHECK(fabs(bound / expected_bound - 1) < 0.03,
		      "%s: bound %.4f s, the model of docs/background.md gives %.4f s", what, bound, expected_bound);
	CHECK(planned >= bound * (1 - 1e-9), "%s: plan %.4f s beats the bound %.4f s", what, planned, bound);
	CHECK(whole >= bound && planned >= whole * (1 - 1e-9),
	      "%s: the bound in whole subgroups %.4f s is below the continuous one %.4f s or above the plan %.4f s",
	      what, whole, bound, planned);
	CHECK(planned <= 1.15 * bound, "%s: plan %.4f s is over 1.15x the bound %.4f s", what, planned, bound);
	CHECK(planned <= all_cpu && planned <= stride2, "%s: plan %.4f s slower than a baseline", what, planned);
	return planned;
}

/* The bound of G GPUs (bound.c). One GPU: exactly the one-GPU bound, whatever the node
 * rates say. Two GPUs with the 20B example per node, no room for residency (two staging
 * slots each): the CPU and the link bind, as in docs/background.md, so at the optimum the
 * CPU's time (5e9 - x) c equals the link's, (2 (5e9 - x) + 12 x) / B per direction (the
 * CPU-updated subgroups' 16-bit weights in, gradients out; 12 B of state each way for the
 * x params updated on the GPUs): x = (5e9 c - 1e10 / B) / (c + 10 / B). Behind one switch
 * the pair shares one link's B = 25 GB/s, which gives the one-GPU 1.276 s; each with its
 * own link, B = 50 GB/s: 0.833 s. */
static void check_node_bound(double slots_only)
{
	struct dos_plan_subgroup sg[N];
	subgroups(sg, 0);
	struct dos_machine_costs m = h100_rank(slots_only);
	double one = _dos_bound_seconds(&m, sg, N, NULL);
	m.ngpus = 1;
	m.node_h2d_bytes_per_second = m.node_d2h_bytes_per_second = 1e9; /* unused for one GPU */
	CHECK(_dos_bound_seconds(&m, sg, N, NULL) == one, "G = 1 changed the bound: %.17g s, not %.17g s",
	      _dos_bound_seconds(&m, sg, N, NULL), one);
	double c = m.cpu_seconds_per_param;
	static const struct {
		const char *what;
		double node_link;
	} cases[] = {{"2 GPUs behind one switch", 25e9}, {"2 GPUs, a link each", 50e9}};
	for (int k = 0; k < 2; k++) {
		double b = cases[k].node_link;
		double x = (5e9 * c - 1e10 / b) / (c + 10 / b);
		double hand = (5e9 - x) * c;
		m.ngpus = 2;
		m.node_h2d_bytes_per_second = m.node_d2h_bytes_per_second = b;
		double bound = _dos_bound_seconds(&m, sg, N, NULL);
		printf("%-34s bound %.4f s, by hand %.4f s (one GPU: %.4f s)\n", cases[k].what, bound, hand, one);
		CHECK(fabs(bound / hand - 1) < 1e-6, "%s: bound %.6f s, by hand %.6f s", cases[k].what, bound, hand);
	}
}

/* Updates whose GPU time is mostly the GPU's fixed cost per task (5 us against 2 us on a
 * CPU worker, the simulated machines' figures): a model's norms, 2048 params each, between
 * its matrices, all resident now on a GPU that holds everything. The norms go to the CPU,
 * idle while the GPU updates the matrices; the matrices stay resident; planning again from
 * that placement changes nothing (no state moving back and forth); without fixed costs
 * the plan keeps everything on the GPU, as before they were measured. 2000 norms alone
 * share the CPU and the GPU, faster than on the CPU alone. (Not faster than on the GPU
 * alone, in this model: it charges every copy's 10 us latency to the link, and each CPU
 * update has two; the choice compares the workers, as these copies overlap in practice.) */
static void check_launch_bound(void)
{
	enum { LAYERS = 20, MIXED = 2 * LAYERS, NORMS = 2000 };
	struct dos_machine_costs m = h100_rank(40e9);
	m.cpu_task_seconds = 2e-6;
	m.gpu_task_seconds = 5e-6;
	struct dos_plan_subgroup sg[NORMS];
	enum dos_placement place[NORMS], again[NORMS], base[NORMS];
	for (int i = 0; i < MIXED; i++)
		sg[i] = (struct dos_plan_subgroup){.params = i % 2 ? 2048 : 1e8, .resident_now = 1};
	_dos_plan_step(&m, sg, MIXED, place);
	int norms_on_cpu = 0, matrices_resident = 0;
	for (int i = 0; i < MIXED; i++) {
		norms_on_cpu += i % 2 && place[i] == DOS_PLACE_CPU;
		matrices_resident += !(i % 2) && place[i] == DOS_PLACE_GPU_RESIDENT;
	}
	printf("launch-bound norms: %d of %d on the CPU, %d of %d matrices resident\n", norms_on_cpu, LAYERS,
	       matrices_resident, LAYERS);
	CHECK(norms_on_cpu == LAYERS && matrices_resident == LAYERS,
	      "launch-bound norms: %d of %d norms on the CPU, %d of %d matrices resident", norms_on_cpu, LAYERS,
	      matrices_resident, LAYERS);
	for (int i = 0; i < MIXED; i++)
		sg[i].resident_now = place[i] == DOS_PLACE_GPU_RESIDENT;
	_dos_plan_step(&m, sg, MIXED, again);
	CHECK(memcmp(place, again, sizeof place[0] * MIXED) == 0, "launch-bound norms: the next plan differs");
	struct dos_machine_costs unmeasured = m;
	unmeasured.cpu_task_seconds = unmeasured.gpu_task_seconds = 0;
	for (int i = 0; i < MIXED; i++)
		sg[i].resident_now = 1;
	_dos_plan_step(&unmeasured, sg, MIXED, place);
	int resident = 0;
	for (int i = 0; i < MIXED; i++)
		resident += place[i] == DOS_PLACE_GPU_RESIDENT;
	CHECK(resident == MIXED, "without fixed costs %d of %d stay resident", resident, MIXED);
	for (int i = 0; i < NORMS; i++)
		sg[i] = (struct dos_plan_subgroup){.params = 2048, .resident_now = 1};
	double planned = _dos_plan_step(&m, sg, NORMS, place);
	int on_cpu = 0;
	for (int i = 0; i < NORMS; i++)
		on_cpu += place[i] == DOS_PLACE_CPU;
	_dos_plan_all_cpu(NORMS, base);
	double all_cpu = _dos_plan_predict(&m, sg, NORMS, base);
	_dos_plan_resident(NORMS, 1.0, base);
	double all_gpu = _dos_plan_predict(&m, sg, NORMS, base);
	printf("%d launch-bound updates: %d on the CPU, %.2f ms (all on the CPU %.2f ms, all on the GPU %.2f ms)\n",
	       NORMS, on_cpu, planned * 1e3, all_cpu * 1e3, all_gpu * 1e3);
	CHECK(on_cpu > 0 && on_cpu < NORMS, "%d launch-bound updates: %d on the CPU", NORMS, on_cpu);
	CHECK(planned < all_cpu, "%d launch-bound updates: %g s, no faster than all on the CPU", NORMS, planned);
}

/* The bound in whole subgroups (bound.c) where the answer is known by hand: the 20B
 * example with room for the state of 47.25 subgroups (56.7 GB). Every schedule leaves the
 * CPU at least 3 subgroups (staging beside 45 resident ones ends no sooner), after the
 * first of their gradients came down (0.2 GB at 25 GB/s: 8 ms): 8 + 3 x 45.4 ms. The
 * continuous bound, which splits subgroups, is below it. Subgroups of different sizes:
 * the continuous bound. */
static void check_whole_subgroups_bound(void)
{
	struct dos_machine_costs m = h100_rank(47.25 * SUBGROUP * DOS_STATE_BYTES_PER_PARAM);
	struct dos_plan_subgroup sg[N];
	subgroups(sg, 0);
	double continuous = _dos_bound_seconds(&m, sg, N, NULL);
	double whole = _dos_bound_whole_subgroups_seconds(&m, sg, N);
	printf("bound, 47.25 subgroups' state on the GPU: continuous %.4f s, in whole subgroups %.4f s\n", continuous,
	       whole);
	CHECK(fabs(whole - (0.008 + 3 * 0.0454)) < 1e-6, "bound in whole subgroups %.6f s, by hand 0.144200 s", whole);
	CHECK(continuous < whole, "continuous bound %.6f s not below the one in whole subgroups", continuous);
	sg[N - 1].params = SUBGROUP / 2;
	CHECK(_dos_bound_whole_subgroups_seconds(&m, sg, N) == _dos_bound_seconds(&m, sg, N, NULL),
	      "unequal subgroups: the bound in whole subgroups is not the continuous one");
}

int main(void)
{
	check_whole_subgroups_bound();
	/* The worked example of docs/background.md: 2 staging slots of state, no room for
	 * residency. */
	double slots_only = 2.0 * SUBGROUP * DOS_STATE_BYTES_PER_PARAM;
	check_plan("20B, no resident state", slots_only, 0, 1.276);
	/* Steady state with 20 GB and 40 GB of resident state (plus the staging slots), as
	 * in docs/background.md: what fits is on the GPU from the previous step. */
	check_plan("20B, 20 GB resident, steady state", 20e9 + slots_only,
		   (int)(20e9 / (SUBGROUP * DOS_STATE_BYTES_PER_PARAM)), 0.85);
	check_plan("20B, 40 GB resident, steady state", 40e9 + slots_only,
		   (int)(40e9 / (SUBGROUP * DOS_STATE_BYTES_PER_PARAM)), 0.425);
	/* 20 GB in all: residency and staging share it. */
	check_plan("20B, 20 GB in all, steady state", 20e9, (int)(20e9 / (SUBGROUP * DOS_STATE_BYTES_PER_PARAM)), 0);
	/* First step with memory to spare: the plan keeps what it moves in. */
	{
		struct dos_machine_costs m = h100_rank(40e9);
		struct dos_plan_subgroup sg[N];
		enum dos_placement place[N];
		subgroups(sg, 0);
		_dos_plan_step(&m, sg, N, place);
		int kept = 0;
		for (int i = 0; i < N; i++)
			kept += place[i] == DOS_PLACE_GPU_RESIDENT;
		CHECK(kept > 0, "first step with 40 GB free kept nothing resident");
		check_memory(&m, sg, place, "first step, 40 GB");
	}
	/* The same first step when the link idles long enough in forward and backward to
	 * carry 20 GB: some state becomes resident through a CPU update and a transfer after
	 * it, so this update phase is shorter, the memory used the same, and no more state
	 * moves that way than the idle link carries. */
	{
		struct dos_machine_costs m = h100_rank(40e9);
		struct dos_plan_subgroup sg[N];
		enum dos_placement now[N], later[N];
		subgroups(sg, 0);
		double t_now = _dos_plan_step(&m, sg, N, now);
		m.promote_bytes = 20e9;
		double t_later = _dos_plan_step(&m, sg, N, later);
		double promoted = 0;
		for (int i = 0; i < N; i++)
			promoted += later[i] == DOS_PLACE_CPU_THEN_RESIDENT ? SUBGROUP * DOS_STATE_BYTES_PER_PARAM : 0;
		printf("first step, 40 GB: %.3f s moving resident state in the update phase, %.3f s moving %.0f GB "
		       "after CPU updates\n",
		       t_now, t_later, promoted * 1e-9);
		CHECK(promoted > 0 && promoted <= m.promote_bytes, "promoted %g bytes with %g allowed", promoted,
		      m.promote_bytes);
		CHECK(t_later < t_now, "moving state after CPU updates did not shorten the first step (%g vs %g s)",
		      t_later, t_now);
		check_memory(&m, sg, later, "first step, 40 GB, promotion");
		CHECK(fabs(_dos_plan_predict(&m, sg, N, later) - t_later) < 1e-9,
		      "promotion: plan and prediction disagree");
	}
	/* The GPU busy with the application's queued work for 0.5 s: the updates placed there
	 * wait for it, so the plan moves work to the CPU and the link path shrinks; still no
	 * worse than all-CPU, and never earlier than the GPU frees. */
	{
		struct dos_machine_costs m = h100_rank(slots_only);
		struct dos_plan_subgroup sg[N];
		enum dos_placement free_gpu[N], busy_gpu[N], base[N];
		subgroups(sg, 0);
		_dos_plan_step(&m, sg, N, free_gpu);
		m.gpu_busy_ahead_seconds = 0.5;
		double busy = _dos_plan_step(&m, sg, N, busy_gpu);
		_dos_plan_all_cpu(N, base);
		printf("20B, GPU busy 0.5 s ahead: %d/%d on GPU (%d with the GPU free), %.3f s\n", gpu_count(busy_gpu),
		       N, gpu_count(free_gpu), busy);
		CHECK(gpu_count(busy_gpu) < gpu_count(free_gpu),
		      "a busy GPU got as many updates (%d) as a free one (%d)", gpu_count(busy_gpu),
		      gpu_count(free_gpu));
		CHECK(busy <= _dos_plan_predict(&m, sg, N, base), "busy GPU: plan slower than all-CPU");
		CHECK(gpu_count(busy_gpu) == 0 || busy > 0.5, "busy GPU: GPU updates end before the GPU frees");
	}
	/* Residency in the room of the last two staging slots, where little is left to stage
	 * (on a 12 GB/s link, 0.1 s a subgroup each way): with 46 subgroups resident and
	 * room for two more, but not beside a two-slot reserve, the plan takes one more a
	 * step while the link has time for its state beside the step's own work (never both
	 * at once), and the steps get no slower. */
	{
		struct dos_machine_costs m = h100_rank(0);
		m.h2d_bytes_per_second = m.d2h_bytes_per_second = 12e9;
		double state = SUBGROUP * DOS_STATE_BYTES_PER_PARAM, slot = SUBGROUP * dos_staging_bytes_per_param(&m);
		m.gpu_budget_bytes = 46 * state + 2 * slot + 0.1e9;
		struct dos_plan_subgroup sg[N];
		enum dos_placement place[N], base[N];
		double before = INFINITY;
		for (int resident = 46; resident <= 48; resident++) {
			subgroups(sg, resident);
			double planned = _dos_plan_step(&m, sg, N, place);
			int kept = 0;
			for (int i = 0; i < N; i++)
				kept += place[i] == DOS_PLACE_GPU_RESIDENT || place[i] == DOS_PLACE_CPU_THEN_RESIDENT;
			printf("slot reserve, %d resident: plan keeps %d, %.3f s\n", resident, kept, planned);
			CHECK(kept == (resident < 48 ? resident + 1 : 48),
			      "slot reserve: %d subgroups resident, the plan keeps %d", resident, kept);
			_dos_plan_resident(N, resident / (double)N, base);
			CHECK(planned <= before && planned <= _dos_plan_predict(&m, sg, N, base) + 1e-9,
			      "slot reserve: %.4f s with %d resident, slower than the step before or than keeping them",
			      planned, resident);
			check_memory(&m, sg, place, "slot reserve");
			before = planned;
		}
	}
	/* Gradients and 16-bit weights homed on the host: a GPU update needs their GPU copies
	 * (0.4 GB a subgroup) beside the resident state, which is pinned. With room for 30
	 * subgroups' state but not for their copies too, none to stage (the link would carry 43 resident
	 * updates' copies in the CPU's time, so residency is worth all the room), the plan
	 * keeps at most 29, whatever is resident now: 30 left StarPU waiting forever (the
	 * 8 GiB h100-pcie5 with 1e9 params in subgroups of 1e8, 7 resident). */
	/* Without a home (dos-train's gradients and 16-bit weights, made by the application's
	 * tasks) their GPU copies are in the application's forecast, outside the budget: all
	 * 30 stay (taking the copies off again cost a resident subgroup on a 12000 MiB GPU). */
	for (int homed_on_host = 1; homed_on_host >= 0; homed_on_host--) {
		struct dos_machine_costs m = h100_rank(0);
		m.homes.grads_on_gpu = m.homes.weights_on_gpu = 0;
		m.homes.grads_homed_on_host = m.homes.weights_homed_on_host = homed_on_host;
		m.gpu_budget_bytes = 30 * SUBGROUP * DOS_STATE_BYTES_PER_PARAM + 0.2e9;
		m.staging_margin_bytes = m.gpu_budget_bytes; /* no room to stage */
		const char *what = homed_on_host ? "host homes, full GPU" : "no homes, full GPU";
		int expected = homed_on_host ? 29 : 30;
		struct dos_plan_subgroup sg[N];
		enum dos_placement place[N];
		for (int resident = 29; resident <= 30; resident++) {
			subgroups(sg, resident);
			_dos_plan_step(&m, sg, N, place);
			int kept = 0;
			for (int i = 0; i < N; i++)
				kept += place[i] == DOS_PLACE_GPU_RESIDENT || place[i] == DOS_PLACE_CPU_THEN_RESIDENT;
			printf("%s, %d resident: plan keeps %d\n", what, resident, kept);
			CHECK(kept == expected, "%s, %d resident: the plan keeps %d, not %d", what, resident, kept,
			      expected);
			check_memory(&m, sg, place, what);
		}
	}
	/* The staging margin (kept free only while state is staged) bounds staging, not
	 * residency: in the worked example (two staging slots, 22 of 50 updates staged), with
	 * all the room in the margin, nothing is staged, and state still becomes resident. */
	{
		struct dos_machine_costs m = h100_rank(slots_only);
		m.staging_margin_bytes = slots_only;
		struct dos_plan_subgroup sg[N];
		enum dos_placement place[N];
		subgroups(sg, 0);
		_dos_plan_step(&m, sg, N, place);
		int staged = 0, kept = 0;
		for (int i = 0; i < N; i++) {
			staged += place[i] == DOS_PLACE_GPU_TRANSIENT;
			kept += place[i] == DOS_PLACE_GPU_RESIDENT || place[i] == DOS_PLACE_CPU_THEN_RESIDENT;
		}
		CHECK(staged == 0 && kept > 0, "staging margin: %d staged, %d resident", staged, kept);
		check_memory(&m, sg, place, "staging margin");
	}
	/* No GPU memory at all, or no GPU: everything on the CPU. */
	{
		struct dos_machine_costs m = h100_rank(0);
		struct dos_plan_subgroup sg[N];
		enum dos_placement place[N];
		subgroups(sg, 0);
		_dos_plan_step(&m, sg, N, place);
		CHECK(gpu_count(place) == 0, "a zero budget still placed %d updates on the GPU", gpu_count(place));
		m = h100_rank(40e9);
		m.gpu_seconds_per_param = INFINITY;
		_dos_plan_step(&m, sg, N, place);
		CHECK(gpu_count(place) == 0, "no GPU, yet %d updates placed there", gpu_count(place));
	}
	/* The stride and resident baselines place what they claim. */
	{
		enum dos_placement place[N];
		_dos_plan_stride(N, 3, place);
		CHECK(place[2] == DOS_PLACE_GPU_TRANSIENT && place[0] == DOS_PLACE_CPU && gpu_count(place) == 16,
		      "stride 3");
		_dos_plan_resident(N, 0.3, place);
		CHECK(place[14] == DOS_PLACE_GPU_RESIDENT && place[15] == DOS_PLACE_CPU && gpu_count(place) == 15,
		      "resident 0.3");
	}
	/* A machine where the GPU side is slow (PCIe Gen3, slow GPU): the plan must not get
	 * worse than all-CPU. */
	{
		struct dos_machine_costs m = h100_rank(slots_only);
		m.h2d_bytes_per_second = m.d2h_bytes_per_second = 2e9;
		struct dos_plan_subgroup sg[N];
		enum dos_placement place[N], base[N];
		subgroups(sg, 0);
		double planned = _dos_plan_step(&m, sg, N, place);
		_dos_plan_all_cpu(N, base);
		CHECK(planned <= _dos_plan_predict(&m, sg, N, base), "slow link: plan slower than all-CPU");
	}
	check_launch_bound();
	check_node_bound(slots_only);
	return 0;
}
