/* host_app: a StarPU application that trains a model of its own (mlp.c: its data, its
 * codelets, its policy lws) and hands the optimizer step to starpu-dos through the public
 * API only (dos.h). Its tasks and the optimizer's follow each other through the
 * parameters' handles; the optimizer runs in a scheduling context of its own under the
 * dos policy, and the application checks that none of its own tasks went there.
 *
 * With --no-starpu-init it is instead an application that does not use StarPU: it
 * computes forward and backward itself and gives the optimizer plain buffers, and
 * dos_opt_create starts (and dos_opt_destroy stops) StarPU with the dos policy.
 *
 * Options: --steps N (default 30), --no-starpu-init, --checkpoint-dir DIR with
 * --save-at K (save after step K) or --resume (continue from DIR's latest checkpoint),
 * --dump FILE (master weights, m, v and the model's weights after the last step, for
 * comparisons). Exit status 0, 1 on a failed check, 77 when StarPU has no worker. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dos.h>
#include <starpu.h>

#include "mlp.h"

#define FAIL(...)                                          \
	do {                                               \
		fprintf(stderr, "host_app: " __VA_ARGS__); \
		fputc('\n', stderr);                       \
		exit(1);                                   \
	} while (0)
#define DOS_OK(call)                                                    \
	do {                                                            \
		if ((call) != 0)                                        \
			FAIL("%s failed: %s", #call, dos_last_error()); \
	} while (0)

struct options {
	uint64_t steps, save_at;
	int no_starpu_init, resume;
	const char *checkpoint_dir, *dump;
};

/* A whole number in base 10, digits only, or a refusal naming the option. */
static uint64_t count(const char *option, const char *text)
{
	char *end;
	errno = 0;
	unsigned long long x = strtoull(text, &end, 10);
	if (!*text || *text < '0' || *text > '9' || *end || errno)
		FAIL("%s = '%s': expected a whole number in base 10", option, text);
	return x;
}

static void parse(int argc, char **argv, struct options *o)
{
	*o = (struct options){.steps = MLP_STEPS};
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *next = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "--no-starpu-init"))
			o->no_starpu_init = 1;
		else if (!strcmp(a, "--resume"))
			o->resume = 1;
		else if (!strcmp(a, "--steps") && next)
			o->steps = count(a, argv[++i]);
		else if (!strcmp(a, "--save-at") && next)
			o->save_at = count(a, argv[++i]);
		else if (!strcmp(a, "--checkpoint-dir") && next)
			o->checkpoint_dir = argv[++i];
		else if (!strcmp(a, "--dump") && next)
			o->dump = argv[++i];
		else
			FAIL("unknown or incomplete option '%s'", a);
	}
	if (o->steps == 0)
		FAIL("--steps must be at least 1");
	if ((o->save_at || o->resume) && !o->checkpoint_dir)
		FAIL("--save-at and --resume need --checkpoint-dir");
}

/* ---- the application's tasks stay the application's ------------------------------------ */

/* StarPU's initial context, which starpu_init gave lws and which the application's tasks
 * are submitted to. */
#define APP_CTX 0

static atomic_ulong app_tasks, app_tasks_elsewhere;

/* The callback of every task of the model: which context ran it, under which policy. */
static void app_task_done(void *arg)
{
	(void)arg;
	struct starpu_task *task = starpu_task_get_current();
	struct starpu_sched_policy *policy = starpu_sched_ctx_get_sched_policy(task->sched_ctx);
	atomic_fetch_add(&app_tasks, 1);
	if (task->sched_ctx != APP_CTX || !policy || strcmp(policy->policy_name, "lws") != 0)
		atomic_fetch_add(&app_tasks_elsewhere, 1);
}

static const char *policy_of_app_ctx(void)
{
	struct starpu_sched_policy *policy = starpu_sched_ctx_get_sched_policy(APP_CTX);
	return policy ? policy->policy_name : "(none)";
}

/* ---- after training ---------------------------------------------------------------------- */

static void dump(dos_opt_t opt, const struct dos_opt_info *info, float *const weights[MLP_NTENSORS], const char *path)
{
	uint64_t n = info->nparams;
	float *state = malloc(3 * n * sizeof(float));
	if (!state)
		FAIL("out of memory");
	DOS_OK(dos_opt_read_state(opt, state, state + n, state + 2 * n, n));
	FILE *f = fopen(path, "wb");
	if (!f)
		FAIL("cannot write %s", path);
	fwrite(state, sizeof(float), 3 * n, f);
	for (int t = 0; t < MLP_NTENSORS; t++)
		fwrite(weights[t], sizeof(float), mlp_numel(t), f);
	if (fclose(f))
		FAIL("writing %s failed", path);
	free(state);
}

/* Where the optimizer ran each subgroup's last update, and its last step's phases. */
static void report(dos_opt_t opt, const struct dos_opt_info *info)
{
	enum dos_device where[info->nsubgroups];
	DOS_OK(dos_opt_get_placements(opt, where, info->nsubgroups));
	printf("last updates:");
	for (uint32_t s = 0; s < info->nsubgroups; s++) {
		if (where[s] == DOS_DEVICE_NONE)
			FAIL("subgroup %u has no update that ended", s);
		printf(" %s", where[s] == DOS_DEVICE_GPU ? "GPU" : "CPU");
	}
	struct dos_opt_step_times times;
	DOS_OK(dos_opt_get_step_times(opt, &times));
	static const char *const names[DOS_PHASE_COUNT] = {"gather", "stats", "update", "refresh"};
	printf("\nstep %llu: %.3f ms;", (unsigned long long)times.step, 1e3 * times.step_seconds);
	for (int p = 0; p < DOS_PHASE_COUNT; p++)
		printf(" %s %u tasks %.3f ms busy%s", names[p], times.tasks[p], 1e3 * times.busy_seconds[p],
		       p + 1 < DOS_PHASE_COUNT ? "," : "\n");
	if (times.step != info->steps_submitted || times.tasks[DOS_PHASE_GATHER] != info->nsubgroups ||
	    times.tasks[DOS_PHASE_UPDATE] != info->nsubgroups || times.tasks[DOS_PHASE_REFRESH] != info->ntensors ||
	    times.tasks[DOS_PHASE_STATS] != 0 || times.cpu_updates + times.gpu_updates != info->nsubgroups)
		FAIL("the last step's times are not those of step %llu's %u gathers, %u updates, %u refreshes",
		     (unsigned long long)info->steps_submitted, info->nsubgroups, info->nsubgroups, info->ntensors);
}

int main(int argc, char **argv)
{
	struct options o;
	parse(argc, argv, &o);
	int app_uses_starpu = !o.no_starpu_init;

	struct mlp model;
	float *buffers[2][MLP_NTENSORS]; /* without StarPU: weights, gradients */
	float *host_losses = NULL;
	if (app_uses_starpu) {
		struct starpu_conf conf;
		starpu_conf_init(&conf);
		conf.sched_policy_name = "lws";
		int ret = starpu_init(&conf);
		if (ret == -ENODEV)
			return 77;
		if (ret != 0)
			FAIL("starpu_init: %d", ret);
		if (mlp_create(&model, o.steps))
			FAIL("out of memory for the model");
		model.task_done = app_task_done;
	} else {
		if (!(host_losses = calloc(o.steps, sizeof *host_losses)))
			FAIL("out of memory");
		for (int t = 0; t < MLP_NTENSORS; t++)
			for (int b = 0; b < 2; b++)
				if (!(buffers[b][t] = calloc(mlp_numel(t), sizeof(float))))
					FAIL("out of memory");
		mlp_init_weights(buffers[0]);
	}

	/* the optimizer over the model's four tensors, through their handles or buffers */
	struct dos_opt_config cfg;
	DOS_OK(dos_opt_config_init(&cfg));
	cfg.hp = (struct dos_adam_hparams){DOS_ADAMW, MLP_LR, 0.9, 0.999, 1e-8, MLP_WEIGHT_DECAY};
	cfg.subgroup_size = MLP_SUBGROUP;
	struct dos_opt_tensor tensors[MLP_NTENSORS];
	for (int t = 0; t < MLP_NTENSORS; t++) {
		tensors[t] = (struct dos_opt_tensor){.numel = mlp_numel(t)};
		if (app_uses_starpu) {
			tensors[t].weight = model.weight[t];
			tensors[t].grad = model.grad[t];
		} else {
			tensors[t].weight_ptr = buffers[0][t];
			tensors[t].grad_ptr = buffers[1][t];
		}
	}
	dos_opt_t opt;
	DOS_OK(dos_opt_create(&opt, &cfg, MLP_NTENSORS, tensors));
	struct dos_opt_info info;
	DOS_OK(dos_opt_get_info(opt, &info));
	if (info.owns_starpu != o.no_starpu_init)
		FAIL("owns_starpu = %d, but the application %s StarPU", info.owns_starpu,
		     app_uses_starpu ? "started" : "did not start");
	printf("host_app: %llu parameters in %u subgroups, optimizer in context %u; application's context: %s\n",
	       (unsigned long long)info.nparams, info.nsubgroups, info.sched_ctx,
	       app_uses_starpu ? policy_of_app_ctx() : "none (no StarPU of its own)");

	uint64_t first = 0;
	char path[4096];
	if (o.resume) {
		DOS_OK(dos_opt_latest_checkpoint(o.checkpoint_dir, path, sizeof path));
		DOS_OK(dos_opt_load(opt, path));
		if (!app_uses_starpu)
			DOS_OK(dos_opt_wait(opt)); /* the loaded weights, in the buffers */
		DOS_OK(dos_opt_get_info(opt, &info));
		first = info.steps_submitted;
		printf("resumed from %s after step %llu\n", path, (unsigned long long)first);
	}
	for (uint64_t k = first; k < o.steps; k++) {
		if (app_uses_starpu) {
			mlp_submit_step(&model, k); /* forward and backward: tasks, nothing waits */
		} else {
			host_losses[k] = mlp_host_step(buffers[0], buffers[1], k);
		}
		DOS_OK(dos_opt_submit_step(opt, NULL));
		if (!app_uses_starpu)
			DOS_OK(dos_opt_wait(opt)); /* the next forward reads the buffers */
		if (o.save_at == k + 1) {
			DOS_OK(dos_opt_save(opt, o.checkpoint_dir, 2, path, sizeof path));
			printf("saved %s\n", path);
		}
	}
	DOS_OK(dos_opt_wait(opt));
	DOS_OK(dos_opt_get_info(opt, &info));
	if (app_uses_starpu)
		starpu_task_wait_for_all(); /* the last losses */
	const float *losses = app_uses_starpu ? model.losses : host_losses;
	printf("loss: step %llu %.5f, step %llu %.5f\n", (unsigned long long)first + 1, losses[first],
	       (unsigned long long)o.steps, losses[o.steps - 1]);
	if (o.steps - first >= 10 && !(losses[o.steps - 1] < 0.5f * losses[first]))
		FAIL("the loss did not halve: %g -> %g", losses[first], losses[o.steps - 1]);
	report(opt, &info);

	uint64_t steps_run = o.steps - first;
	if (app_uses_starpu) {
		/* the application's tasks ran in its own context under lws... */
		if (atomic_load(&app_tasks) != 7 * steps_run || atomic_load(&app_tasks_elsewhere) != 0)
			FAIL("%lu of the application's %lu tasks ran outside its lws context (expected %llu tasks)",
			     atomic_load(&app_tasks_elsewhere), atomic_load(&app_tasks), 7ull * steps_run);
		/* ...and the dos policy placed exactly the optimizer's: per step a gather and an
		 * update per subgroup and a refresh per tensor, plus the refreshes of a load */
		struct dos_sched_stats st;
		DOS_OK(dos_sched_get_stats(info.sched_ctx, &st));
		unsigned long expected = (unsigned long)(steps_run * (2 * info.nsubgroups + info.ntensors) +
							 (o.resume ? info.ntensors : 0));
		if (st.decisions != expected || st.cpu_updates + st.gpu_updates != steps_run * info.nsubgroups)
			FAIL("the dos context placed %lu tasks (%lu updates), expected %lu (%llu): not only ours",
			     st.decisions, st.cpu_updates + st.gpu_updates, expected,
			     (unsigned long long)(steps_run * info.nsubgroups));
		printf("coexistence: %lu application tasks under lws in context %d, %lu optimizer tasks under dos in "
		       "context %u\n",
		       atomic_load(&app_tasks), APP_CTX, st.decisions, info.sched_ctx);
	}

	float *final_weights[MLP_NTENSORS];
	if (app_uses_starpu)
		for (int t = 0; t < MLP_NTENSORS; t++) {
			starpu_data_acquire(model.weight[t], STARPU_R);
			final_weights[t] = model.weights[t];
		}
	else
		memcpy(final_weights, buffers[0], sizeof final_weights);
	if (o.dump)
		dump(opt, &info, final_weights, o.dump);
	if (app_uses_starpu)
		for (int t = 0; t < MLP_NTENSORS; t++)
			starpu_data_release(model.weight[t]);
	dos_opt_destroy(opt);

	if (app_uses_starpu) {
		if (!starpu_is_initialized() || strcmp(policy_of_app_ctx(), "lws") != 0)
			FAIL("after dos_opt_destroy the application's StarPU is %s, its context's policy %s",
			     starpu_is_initialized() ? "up" : "down", policy_of_app_ctx());
		mlp_destroy(&model);
		starpu_shutdown();
	} else {
		if (starpu_is_initialized())
			FAIL("dos_opt_destroy left running the StarPU that dos_opt_create started");
		for (int t = 0; t < MLP_NTENSORS; t++)
			for (int b = 0; b < 2; b++)
				free(buffers[b][t]);
		free(host_losses);
	}
	return 0;
}
