/* The reference for examples/host_app: the same model (examples/mlp.c), data and recipe,
 * trained through the optimizer's internal path (graph/optimizer.c's dos_optimizer_*, as
 * dos-train's loop uses it) in a StarPU that runs only the dos policy. tests/test_host_app.sh
 * compares what this writes with --dump to host_app's runs, bit for bit. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "optimizer.h"
#include "mlp.h"
#include "test_starpu.h"
#include "test_util.h"

int main(int argc, char **argv)
{
	const char *dump = NULL;
	for (int i = 1; i < argc; i++)
		if (!strcmp(argv[i], "--dump") && i + 1 < argc)
			dump = argv[++i];
		else
			CHECK(0, "usage: %s [--dump FILE]", argv[0]);

	struct starpu_conf conf;
	starpu_conf_init(&conf);
	test_starpu_init_policy(&conf, "dos");

	struct mlp model;
	CHECK(mlp_create(&model, MLP_STEPS) == 0, "out of memory");
	uint64_t numel[MLP_NTENSORS], n = mlp_nparams();
	float *flat = test_malloc(4 * n * sizeof(float)); /* initial weights, then master, m, v */
	for (int t = 0, at = 0; t < MLP_NTENSORS; at += (int)mlp_numel(t), t++) {
		numel[t] = mlp_numel(t);
		memcpy(flat + at, model.weights[t], numel[t] * sizeof(float));
	}
	struct _dos_optimizer_config cfg = {
		.subgroup_size = MLP_SUBGROUP,
		.hp = {DOS_ADAMW, MLP_LR, 0.9, 0.999, 1e-8, MLP_WEIGHT_DECAY},
	};
	struct _dos_optimizer *opt;
	CHECK(_dos_optimizer_create(&opt, &cfg, MLP_NTENSORS, numel, model.weight, model.grad, flat) == 0, "%s",
	      dos_last_error());
	for (uint64_t k = 0; k < MLP_STEPS; k++) {
		struct _dos_step_report report;
		mlp_submit_step(&model, k);
		CHECK(_dos_optimizer_submit_step(opt, &report) == 0 && report.applied, "step %llu: %s",
		      (unsigned long long)k, dos_last_error());
	}
	CHECK(starpu_task_wait_for_all() == 0, "wait");
	struct _dos_optimizer_info info;
	_dos_optimizer_get_info(opt, &info);
	printf("reference: loss %.5f -> %.5f over %d steps, %u subgroups\n", model.losses[0],
	       model.losses[MLP_STEPS - 1], MLP_STEPS, info.nsubgroups);

	_dos_optimizer_read_state(opt, flat, flat + n, flat + 2 * n);
	for (int t = 0, at = 3 * (int)n; t < MLP_NTENSORS; at += (int)numel[t], t++) {
		starpu_data_acquire(model.weight[t], STARPU_R);
		memcpy(flat + at, model.weights[t], numel[t] * sizeof(float));
		starpu_data_release(model.weight[t]);
	}
	if (dump) {
		FILE *f = fopen(dump, "wb");
		CHECK(f && fwrite(flat, sizeof(float), 4 * n, f) == 4 * n && fclose(f) == 0, "writing %s", dump);
	}
	/* the working weights are what the refresh made of the master weights (fp32: copies) */
	CHECK(test_first_difference(flat, flat + 3 * n, n, sizeof(float)) < 0,
	      "the model's weights differ from the master weights");
	/* dos placed the tasks (whether by its plan or by earliest finish: this loop submits
	 * every step at once, beyond what the policy plans ahead, and the bits must not care) */
	struct dos_sched_stats st;
	CHECK(dos_sched_get_stats(0, &st) == 0 && st.decisions >= MLP_STEPS * (2 * info.nsubgroups + MLP_NTENSORS),
	      "the dos policy placed %lu tasks", st.decisions);
	_dos_optimizer_destroy(opt);
	mlp_destroy(&model);
	free(flat);
	starpu_shutdown();
	return 0;
}
