/* tile_app: a training code in the pattern of NNTile and other tile-based StarPU codes,
 * written by us: its own starpu_init (dmdasd unless STARPU_SCHED says otherwise), every
 * tile of the weights, gradients and Adam moments a StarPU variable handle that StarPU
 * allocates itself (no home node), tasks of its own filling and differentiating them, one
 * task per tile, and tensors of different sizes cut into tiles of different sizes. Its
 * Adam update reaches starpu-dos by one of five routes (--route), which must all end
 * with the same bits (tests/test_tile_app.sh) and, under the dos policy, plan every
 * step once:
 *   api      the embedding API over the tiles' handles (subgroups follow the tiles: one
 *            update per tile, reading its gradient tile, no copy), the optimizer in a
 *            context of its own beside the application's dmdasd;
 *   api-ctx  the same in a context the application created with the dos policy, where
 *            it also runs its own tasks;
 *   task     the application submits dos_adam tasks on its own tiles (weights as fp32
 *            master, its m and v) into its dos context;
 *   zero     the application's own Adam codelet ("tile_adam_step": gradient R, m RW,
 *            v RW, weights RW), placed by the dos policy loaded with STARPU_SCHED_LIB,
 *            STARPU_SCHED=dos and DOS_UPDATE_CODELETS=tile_adam_step:grad=0,m=1,v=2,weight=3
 *            (without them it runs under dmdasd like any task: the same bits);
 *   vector   the reference: the API over vector handles on the application's own
 *            arrays, subgroups cut across tiles (the path every other test uses);
 *   import   --import-at K steps of the application's own Adam, then its state (m, v
 *            and the step count) imported with dos_opt_write_state and the rest under
 *            the API.
 * The application's own Adam computes exactly what ours does (the step scalars from
 * dos_adam_step_init, the element formula of torch's Adam as our kernels evaluate it),
 * so the routes can be compared bit for bit; NNTile's own kernel differs, which only
 * changes its numbers, not where the policy runs its tasks.
 *
 * Options: --route R (default api), --steps N (default 8), --import-at K, --dump FILE,
 * --waits (waits for all tasks after every step, and within step 1 after the first
 * tile's update, as codes that wait after each operation or iteration do)
 * (weights, m and v in flat order after the last step). It prints the policy's plan
 * counts and fails when a dos route planned a step more than once or left an update
 * unplanned. Exit status 0, 1 on a failed check, 77 when StarPU has no worker. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dos.h>
#include <starpu.h>

#define FAIL(...)                                          \
	do {                                               \
		fprintf(stderr, "tile_app: " __VA_ARGS__); \
		fputc('\n', stderr);                       \
		exit(1);                                   \
	} while (0)
#define DOS_OK(call)                                                    \
	do {                                                            \
		if ((call) != 0)                                        \
			FAIL("%s failed: %s", #call, dos_last_error()); \
	} while (0)

/* three tensors of different sizes, each cut into tiles of its own size (the last one
 * shorter), as a tile-based code cuts a model's weight matrices */
#define NTENSORS 3
static const uint32_t tensor_numel[NTENSORS] = {1500, 333, 70};
static const uint32_t tensor_tile[NTENSORS] = {256, 100, 70};

struct tile {
	uint64_t flat; /* its first element in the flat order of all tensors */
	uint32_t n;
	starpu_data_handle_t w, g, m, v;
};

static struct tile tiles[64];
static int ntiles;
static uint64_t nparams;

/* ---- the application's codelets ---- */

static float initial_weight(uint64_t i)
{
	return (float)((int)((i * 2654435761u) % 2001u) - 1000) / 1000.0f;
}

static float target(uint64_t i)
{
	return (float)((int)((i * 40503u) % 201u) - 100) / 50.0f;
}

static void init_cpu(void *buffers[], void *arg)
{
	uint64_t flat = *(const uint64_t *)arg;
	float *w = (float *)STARPU_VARIABLE_GET_PTR(buffers[0]);
	size_t n = STARPU_VARIABLE_GET_ELEMSIZE(buffers[0]) / sizeof(float);
	for (size_t i = 0; i < n; i++)
		w[i] = initial_weight(flat + i);
}

static void clear_cpu(void *buffers[], void *arg)
{
	(void)arg;
	for (int b = 0; b < 2; b++)
		memset((void *)STARPU_VARIABLE_GET_PTR(buffers[b]), 0, STARPU_VARIABLE_GET_ELEMSIZE(buffers[b]));
}

/* The tiles may be variables (the application's) or vectors (the reference route). */
static float *tile_ptr(void *buffer)
{
	return *(enum starpu_data_interface_id *)buffer == STARPU_VECTOR_INTERFACE_ID
		       ? (float *)STARPU_VECTOR_GET_PTR(buffer)
		       : (float *)STARPU_VARIABLE_GET_PTR(buffer);
}

static size_t tile_count(void *buffer)
{
	return *(enum starpu_data_interface_id *)buffer == STARPU_VECTOR_INTERFACE_ID
		       ? STARPU_VECTOR_GET_NX(buffer)
		       : STARPU_VARIABLE_GET_ELEMSIZE(buffer) / sizeof(float);
}

/* The gradient of sum_i (d_i^2 / 2 + d_i^4 / 40), d = w - target: a loss with a little
 * curvature of its own, elementwise so that every tile is differentiated on its own. */
static void backward_cpu(void *buffers[], void *arg)
{
	uint64_t flat = *(const uint64_t *)arg;
	const float *w = tile_ptr(buffers[0]);
	float *g = tile_ptr(buffers[1]);
	for (size_t i = 0; i < tile_count(buffers[0]); i++) {
		float d = w[i] - target(flat + i);
		g[i] = d + 0.1f * d * d * d;
	}
}

/* The application's own Adam (torch.optim.AdamW's arithmetic, evaluated as starpu-dos's
 * kernels do it), on one tile: gradient R, m RW, v RW, weights RW. */
static void adam_cpu(void *buffers[], void *arg)
{
	const struct dos_adam_step *s = arg;
	const float *g = (const float *)STARPU_VARIABLE_GET_PTR(buffers[0]);
	float *m = (float *)STARPU_VARIABLE_GET_PTR(buffers[1]);
	float *v = (float *)STARPU_VARIABLE_GET_PTR(buffers[2]);
	float *p = (float *)STARPU_VARIABLE_GET_PTR(buffers[3]);
	size_t n = STARPU_VARIABLE_GET_ELEMSIZE(buffers[3]) / sizeof(float);
	for (size_t i = 0; i < n; i++) {
		float gi = g[i] * s->grad_multiplier, pi = p[i];
		if (s->decay_kind == DOS_DECAY_DECOUPLED)
			pi = pi * s->decay;
		else if (s->decay_kind == DOS_DECAY_L2)
			gi = fmaf(pi, s->weight_decay, gi);
		float mi = fmaf(s->lerp_coeff, gi - m[i], s->lerp_from_grad ? gi : m[i]);
		float vi = fmaf(s->one_minus_beta2 * gi, gi, v[i] * s->beta2);
		float denom = sqrtf(vi) / s->bc2_sqrt + s->eps;
		p[i] = pi + (s->neg_step_size * mi) / denom;
		m[i] = mi;
		v[i] = vi;
	}
}

static struct starpu_perfmodel backward_model = {.type = STARPU_HISTORY_BASED, .symbol = "tile_backward"};
static struct starpu_perfmodel adam_model = {.type = STARPU_HISTORY_BASED, .symbol = "tile_adam_step"};
static struct starpu_codelet init_cl = {
	.name = "tile_init", .cpu_funcs = {init_cpu}, .nbuffers = 1, .modes = {STARPU_W}};
static struct starpu_codelet clear_cl = {
	.name = "tile_clear", .cpu_funcs = {clear_cpu}, .nbuffers = 2, .modes = {STARPU_W, STARPU_W}};
static struct starpu_codelet backward_cl = {.name = "tile_backward",
					    .cpu_funcs = {backward_cpu},
					    .nbuffers = 2,
					    .modes = {STARPU_R, STARPU_W},
					    .model = &backward_model};
static struct starpu_codelet adam_cl = {.name = "tile_adam_step",
					.cpu_funcs = {adam_cpu},
					.nbuffers = 4,
					.modes = {STARPU_R, STARPU_RW, STARPU_RW, STARPU_RW},
					.model = &adam_model};

/* ---- the application ---- */

enum route { ROUTE_API, ROUTE_API_CTX, ROUTE_TASK, ROUTE_ZERO, ROUTE_VECTOR, ROUTE_IMPORT };
static const char *const route_names[] = {"api", "api-ctx", "task", "zero", "vector", "import"};

static void submit(struct starpu_codelet *cl, unsigned ctx, void *arg, size_t arg_size, starpu_data_handle_t a,
		   starpu_data_handle_t b, starpu_data_handle_t c, starpu_data_handle_t d)
{
	struct starpu_task *task = starpu_task_create();
	task->cl = cl;
	task->sched_ctx = ctx;
	task->cl_arg = malloc(arg_size);
	memcpy(task->cl_arg, arg, arg_size);
	task->cl_arg_size = arg_size;
	task->cl_arg_free = 1;
	starpu_data_handle_t h[] = {a, b, c, d};
	for (int i = 0; i < cl->nbuffers; i++)
		task->handles[i] = h[i];
	if (starpu_task_submit(task) != 0)
		FAIL("submitting a %s task failed", cl->name);
}

/* Reads n floats of every tile's handle (which = 0: weights, 1: m, 2: v) into flat. */
static void read_tiles(int which, float *flat)
{
	for (int i = 0; i < ntiles; i++) {
		starpu_data_handle_t h = which == 0 ? tiles[i].w : which == 1 ? tiles[i].m : tiles[i].v;
		starpu_data_acquire(h, STARPU_R);
		memcpy(flat + tiles[i].flat, starpu_data_get_local_ptr(h), tiles[i].n * sizeof(float));
		starpu_data_release(h);
	}
}

static dos_opt_t create_optimizer(enum route route, unsigned app_ctx, const struct dos_adam_hparams *hp)
{
	struct dos_opt_config cfg;
	DOS_OK(dos_opt_config_init(&cfg));
	cfg.hp = *hp;
	/* the reference cuts subgroups across tiles; the tile routes make one per tile */
	cfg.subgroup_size = route == ROUTE_VECTOR ? 100 : 256;
	cfg.subgroups_follow_tensors = route != ROUTE_VECTOR;
	cfg.use_app_sched_ctx = route == ROUTE_API_CTX;
	cfg.app_sched_ctx = app_ctx;
	struct dos_opt_tensor tensors[64];
	for (int i = 0; i < ntiles; i++)
		tensors[i] = (struct dos_opt_tensor){.numel = tiles[i].n, .weight = tiles[i].w, .grad = tiles[i].g};
	dos_opt_t opt;
	DOS_OK(dos_opt_create(&opt, &cfg, (uint32_t)ntiles, tensors));
	return opt;
}

int main(int argc, char **argv)
{
	enum route route = ROUTE_API;
	uint64_t steps = 8, import_at = 3;
	const char *dump = NULL;
	int waits = 0;
	for (int i = 1; i < argc; i++) {
		const char *next = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(argv[i], "--route") && next) {
			int r = 0;
			while (r < 6 && strcmp(route_names[r], next))
				r++;
			if (r == 6)
				FAIL("--route %s: expected api, api-ctx, task, zero, vector or import", next);
			route = (enum route)r;
			i++;
		} else if (!strcmp(argv[i], "--steps") && next)
			steps = strtoull(argv[++i], NULL, 10);
		else if (!strcmp(argv[i], "--import-at") && next)
			import_at = strtoull(argv[++i], NULL, 10);
		else if (!strcmp(argv[i], "--dump") && next)
			dump = argv[++i];
		else if (!strcmp(argv[i], "--waits"))
			waits = 1;
		else
			FAIL("unknown option %s", argv[i]);
	}
	if (route == ROUTE_IMPORT && (import_at == 0 || import_at >= steps))
		FAIL("--import-at %llu must be in [1, --steps)", (unsigned long long)import_at);

	struct starpu_conf conf;
	starpu_conf_init(&conf);
	conf.sched_policy_name = "dmdasd"; /* NNTile's; STARPU_SCHED, when set, wins */
	int ret = starpu_init(&conf);
	if (ret == -ENODEV)
		return 77;
	if (ret)
		FAIL("starpu_init: %d", ret);

	/* the tiles: StarPU-allocated variables, or (reference) vectors on our arrays */
	static float w_home[4096], g_home[4096];
	for (int t = 0; t < NTENSORS; t++)
		for (uint32_t at = 0; at < tensor_numel[t]; at += tensor_tile[t]) {
			struct tile *x = &tiles[ntiles++];
			x->flat = nparams;
			x->n = tensor_numel[t] - at < tensor_tile[t] ? tensor_numel[t] - at : tensor_tile[t];
			nparams += x->n;
			size_t bytes = x->n * sizeof(float);
			if (route == ROUTE_VECTOR) {
				for (uint32_t k = 0; k < x->n; k++)
					w_home[x->flat + k] = initial_weight(x->flat + k);
				starpu_vector_data_register(&x->w, STARPU_MAIN_RAM, (uintptr_t)(w_home + x->flat), x->n,
							    sizeof(float));
				starpu_vector_data_register(&x->g, STARPU_MAIN_RAM, (uintptr_t)(g_home + x->flat), x->n,
							    sizeof(float));
			} else {
				starpu_variable_data_register(&x->w, -1, 0, bytes);
				starpu_variable_data_register(&x->g, -1, 0, bytes);
			}
			starpu_variable_data_register(&x->m, -1, 0, bytes);
			starpu_variable_data_register(&x->v, -1, 0, bytes);
		}

	/* the application's own context running dos, for the routes that put its tasks there */
	unsigned ctx = 0;
	if (route == ROUTE_API_CTX || route == ROUTE_TASK)
		ctx = starpu_sched_ctx_create(NULL, -1, "tile-app", STARPU_SCHED_CTX_POLICY_STRUCT,
					      dos_sched_policy("dos"), 0);
	for (int i = 0; i < ntiles; i++) {
		if (route != ROUTE_VECTOR)
			submit(&init_cl, ctx, &tiles[i].flat, sizeof tiles[i].flat, tiles[i].w, NULL, NULL, NULL);
		submit(&clear_cl, ctx, &tiles[i].flat, sizeof tiles[i].flat, tiles[i].m, tiles[i].v, NULL, NULL);
	}

	struct dos_adam_hparams hp = {
		.mode = DOS_ADAMW, .lr = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01};
	dos_opt_t opt = NULL;
	if (route == ROUTE_API || route == ROUTE_API_CTX || route == ROUTE_VECTOR)
		opt = create_optimizer(route, ctx, &hp);
	/* dos.h's step contract: this submitter says when each step is complete, the first
	 * one included, so that no step is planned before all its updates are known */
	if (route == ROUTE_TASK)
		DOS_OK(dos_sched_step_submitted(ctx));
	for (uint64_t step = 1; step <= steps; step++) {
		for (int i = 0; i < ntiles; i++)
			submit(&backward_cl, ctx, &tiles[i].flat, sizeof tiles[i].flat, tiles[i].w, tiles[i].g, NULL,
			       NULL);
		if (route == ROUTE_IMPORT && step == import_at + 1) {
			/* another framework's Adam took the first steps: its state goes on here */
			float *m = malloc(nparams * sizeof *m), *v = malloc(nparams * sizeof *v);
			read_tiles(1, m);
			read_tiles(2, v);
			opt = create_optimizer(route, ctx, &hp);
			DOS_OK(dos_opt_write_state(opt, NULL, m, v, nparams, import_at));
			free(m);
			free(v);
		}
		if (opt) {
			DOS_OK(dos_opt_submit_step(opt, NULL));
			continue;
		}
		struct dos_adam_step st;
		DOS_OK(dos_adam_step_init(&st, &hp, step, 1.0));
		for (int i = 0; i < ntiles; i++) {
			struct tile *x = &tiles[i];
			if (route == ROUTE_TASK) {
				struct starpu_task *task;
				DOS_OK(dos_adam_task_create(&st, x->w, x->m, x->v, x->g, DOS_FP32, NULL, DOS_FP32,
							    &task));
				task->sched_ctx = ctx;
				if (starpu_task_submit(task))
					FAIL("submitting a dos_adam task failed");
			} else
				submit(&adam_cl, ctx, &st, sizeof st, x->g, x->m, x->v, x->w);
			if (waits && step == 1 && i == 0)
				starpu_task_wait_for_all();
		}
		if (waits)
			starpu_task_wait_for_all();
		if (route == ROUTE_TASK)
			DOS_OK(dos_sched_step_submitted(ctx));
	}
	if (opt)
		DOS_OK(dos_opt_wait(opt));
	starpu_task_wait_for_all();

	/* where the updates ran, as the policy that placed them tells (none under dmdasd) */
	unsigned stats_ctx = ctx;
	if (opt) {
		struct dos_opt_info info;
		DOS_OK(dos_opt_get_info(opt, &info));
		stats_ctx = info.sched_ctx;
		/* one subgroup per tile reads the tile's gradient itself: no gather copy */
		struct dos_opt_step_times times;
		DOS_OK(dos_opt_get_step_times(opt, &times));
		if (route != ROUTE_VECTOR && times.tasks[DOS_PHASE_GATHER] != 0)
			FAIL("route %s: %u gather tasks in the last step, expected none", route_names[route],
			     times.tasks[DOS_PHASE_GATHER]);
		if (route == ROUTE_VECTOR && times.tasks[DOS_PHASE_GATHER] == 0)
			FAIL("route vector: no gather task: the check above would be vacuous");
	}
	struct dos_sched_stats stats;
	uint64_t planned_steps = route == ROUTE_IMPORT ? steps - import_at : steps;
	if (dos_sched_get_stats(stats_ctx, &stats) == 0) {
		unsigned long updates = stats.cpu_updates + stats.gpu_updates;
		printf("tile_app: route %s: %llu steps of %d tiles, %lu steps planned, %lu updates placed by plan "
		       "(%lu on CPU, %lu on GPU)\n",
		       route_names[route], (unsigned long long)steps, ntiles, stats.plans, updates, stats.cpu_updates,
		       stats.gpu_updates);
		unsigned long per_step =
			route == ROUTE_VECTOR ? (unsigned long)((nparams + 99) / 100) : (unsigned long)ntiles;
		/* the zero-code route is planned only when its codelet is registered */
		int expect_plans = route != ROUTE_ZERO || getenv("DOS_UPDATE_CODELETS");
		/* an unchanged code announces no step: its first step, whose size nobody knows
		 * yet, may be planned in parts when its updates become ready while it is still
		 * being submitted (dos.h's step contract); every other step once */
		unsigned long most_plans = route == ROUTE_ZERO ? planned_steps + per_step - 1 : planned_steps;
		if (expect_plans &&
		    (stats.plans < planned_steps || stats.plans > most_plans || updates != planned_steps * per_step))
			FAIL("route %s: %lu plans and %lu planned updates for %llu steps of %lu updates",
			     route_names[route], stats.plans, updates, (unsigned long long)planned_steps, per_step);
	} else
		printf("tile_app: route %s: %llu steps of %d tiles, not scheduled by a starpu-dos policy\n",
		       route_names[route], (unsigned long long)steps, ntiles);

	if (dump) {
		float *flat = malloc(3 * nparams * sizeof *flat);
		read_tiles(0, flat);
		if (opt) /* the optimizer's m and v (its master weights are the tiles' weights) */
			DOS_OK(dos_opt_read_state(opt, NULL, flat + nparams, flat + 2 * nparams, nparams));
		else {
			read_tiles(1, flat + nparams);
			read_tiles(2, flat + 2 * nparams);
		}
		FILE *f = fopen(dump, "wb");
		if (!f || fwrite(flat, sizeof *flat, 3 * nparams, f) != 3 * nparams || fclose(f))
			FAIL("cannot write %s", dump);
		free(flat);
	}
	dos_opt_destroy(opt);
	for (int i = 0; i < ntiles; i++) {
		starpu_data_unregister(tiles[i].w);
		starpu_data_unregister(tiles[i].g);
		starpu_data_unregister(tiles[i].m);
		starpu_data_unregister(tiles[i].v);
	}
	if (ctx)
		starpu_sched_ctx_delete(ctx);
	starpu_shutdown();
	return 0;
}
