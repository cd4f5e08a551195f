/* dos-bench calibrate: runs every codelet over a geometric range of subgroup sizes on each
 * kind of worker present, with StarPU's calibration on, so the regression perfmodels
 * (dos_adam, dos_cast, dos_grad_stats, dos_grad_scale) land in $STARPU_HOME for the
 * schedulers and for simulated machines; then prints the mean time per task they hold. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "codelets.h"
#include "dos.h"
#include "errors.h"
#include "parse.h"

#define MIN_SIZE 10000.0

struct sized_handles {
	size_t n;
	void *buf[5];
	struct dos_grad_stats stats;
	starpu_data_handle_t p, m, v, g, w, s;
};

static int parse_max_size(const char *text, size_t *out)
{
	double x;
	if (_dos_parse_double(text, &x) != 0 || !(x >= MIN_SIZE && x <= 4294967295.0)) {
		fprintf(stderr, "dos-bench calibrate: --max-size %s is not a number in [1e4, 4294967295]\n", text);
		return -EINVAL;
	}
	*out = (size_t)x;
	return 0;
}

static int register_size(struct sized_handles *h, size_t n)
{
	static const size_t elem[5] = {4, 4, 4, 2, 2}; /* p, m, v, fp16 grad, bf16 weight */
	memset(h, 0, sizeof *h);
	h->n = n;
	for (int i = 0; i < 5; i++) {
		if (starpu_malloc(&h->buf[i], n * elem[i]) != 0) {
			fprintf(stderr, "dos-bench calibrate: cannot allocate %zu bytes\n", n * elem[i]);
			return -ENOMEM;
		}
		memset(h->buf[i], 0, n * elem[i]);
	}
	float *v = h->buf[2];
	for (size_t i = 0; i < n; i++)
		v[i] = 1e-6f; /* realistic: no zero-division shortcuts, no subnormals */
	starpu_vector_data_register(&h->p, STARPU_MAIN_RAM, (uintptr_t)h->buf[0], (uint32_t)n, 4);
	starpu_vector_data_register(&h->m, STARPU_MAIN_RAM, (uintptr_t)h->buf[1], (uint32_t)n, 4);
	starpu_vector_data_register(&h->v, STARPU_MAIN_RAM, (uintptr_t)h->buf[2], (uint32_t)n, 4);
	starpu_vector_data_register(&h->g, STARPU_MAIN_RAM, (uintptr_t)h->buf[3], (uint32_t)n, 2);
	starpu_vector_data_register(&h->w, STARPU_MAIN_RAM, (uintptr_t)h->buf[4], (uint32_t)n, 2);
	starpu_variable_data_register(&h->s, STARPU_MAIN_RAM, (uintptr_t)&h->stats, sizeof h->stats);
	return 0;
}

static void unregister_size(struct sized_handles *h)
{
	static const size_t elem[5] = {4, 4, 4, 2, 2};
	starpu_data_handle_t all[] = {h->p, h->m, h->v, h->g, h->w, h->s};
	for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
		if (all[i])
			starpu_data_unregister(all[i]);
	for (int i = 0; i < 5; i++)
		if (h->buf[i])
			starpu_free_noflag(h->buf[i], h->n * elem[i]);
}

/* Frees a task that was created but never submitted. */
static void discard_task(struct starpu_task *task)
{
	if (task) {
		task->destroy = 0; /* destroy + detach is for submitted tasks only */
		starpu_task_destroy(task);
	}
}

/* The four codelets' tasks on one subgroup, unsubmitted, in tasks[0..3]. */
static int make_tasks(struct sized_handles *h, uint64_t step, struct starpu_task *tasks[4])
{
	struct dos_adam_hparams hp = {DOS_ADAMW, 1e-4, 0.9, 0.999, 1e-8, 0.01};
	struct dos_adam_step st;
	int err = dos_adam_step_init(&st, &hp, step, 1.0);
	if (!err)
		err = dos_adam_task_create(&st, h->p, h->m, h->v, h->g, DOS_FP16, h->w, DOS_BF16, &tasks[0]);
	if (!err)
		err = dos_cast_task_create(h->p, h->w, DOS_BF16, &tasks[1]);
	if (!err)
		err = dos_grad_stats_task_create(h->g, DOS_FP16, h->s, &tasks[2]);
	if (!err)
		err = dos_grad_scale_task_create(h->g, DOS_FP16, 1.0f, &tasks[3]);
	return err;
}

int bench_calibrate(int argc, char **argv)
{
	size_t max_size = 100000000;
	/* StarPU ignores a history entry until it has STARPU_CALIBRATE_MINIMUM (10) samples */
	int reps = 10;
	for (int i = 2; i < argc; i++) {
		if (!strcmp(argv[i], "--max-size") && i + 1 < argc) {
			if (parse_max_size(argv[++i], &max_size))
				return 2;
		} else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
			uint64_t n;
			if (_dos_parse_u64(argv[++i], 1, 1000, &n) != 0) {
				fprintf(stderr, "dos-bench calibrate: --reps %s is not a whole number in [1, 1000]\n",
					argv[i]);
				return 2;
			}
			reps = (int)n;
		} else {
			fprintf(stderr,
				"dos-bench calibrate: unknown option '%s'\n"
				"usage: dos-bench calibrate [--max-size N] [--reps R]\n",
				argv[i]);
			return 2;
		}
	}

	struct starpu_conf conf;
	starpu_conf_init(&conf);
	conf.sched_policy_name = "dmda"; /* a model-using policy, as StarPU's calibration expects */
	conf.calibrate = 1;
	int ret = starpu_init(&conf);
	if (ret != 0) {
		char why[900];
		fprintf(stderr, "dos-bench calibrate: %s\n",
			_dos_starpu_init_explained(ret, "starpu_init", why, sizeof why));
		return 1;
	}
	uint32_t kinds[2] = {STARPU_CPU, STARPU_CUDA};
	int nkinds = starpu_cuda_worker_get_count() > 0 ? 2 : 1;
	int workers[2] = {starpu_worker_get_by_type(STARPU_CPU_WORKER, 0),
			  nkinds > 1 ? starpu_worker_get_by_type(STARPU_CUDA_WORKER, 0) : -1};
	static const char *const names[4] = {"dos_adam", "dos_cast", "dos_grad_stats", "dos_grad_scale"};

	printf("# codelet calibration: %d runs per size per worker kind; StarPU perfmodels in $STARPU_HOME\n", reps);
	printf("%12s %-16s %14s %14s\n", "params", "codelet", "cpu_us", nkinds > 1 ? "cuda_us" : "cuda_us(none)");
	int status = 0;
	uint64_t step = 1;
	for (double x = MIN_SIZE; x <= (double)max_size * 1.0001 && !status; x *= 3.1622776601683795) {
		struct sized_handles h;
		if ((status = register_size(&h, (size_t)x)) == 0) {
			for (int k = 0; k < nkinds && !status; k++)
				for (int r = 0; r < reps && !status; r++) {
					struct starpu_task *tasks[4] = {0};
					status = make_tasks(&h, step++, tasks);
					for (int t = 0; t < 4; t++) {
						if (!status) {
							tasks[t]->where = (int32_t)kinds[k];
							status = starpu_task_submit(tasks[t]);
						} else {
							discard_task(tasks[t]);
						}
					}
				}
			starpu_task_wait_for_all();
			/* what the models measured for this size */
			struct starpu_task *probe[4] = {0};
			if (!status && (status = make_tasks(&h, 1, probe)) == 0)
				for (int t = 0; t < 4; t++) {
					double us[2] = {NAN, NAN};
					/* the history mean: the regression is only fitted when StarPU
					 * saves the model at shutdown */
					for (int k = 0; k < nkinds; k++)
						us[k] = starpu_perfmodel_history_based_expected_perf(
							probe[t]->cl->model,
							starpu_worker_get_perf_archtype(workers[k], 0),
							starpu_task_data_footprint(probe[t]));
					printf("%12zu %-16s %14.1f %14.1f\n", h.n, names[t], us[0], us[1]);
				}
			for (int t = 0; t < 4; t++)
				discard_task(probe[t]);
		}
		unregister_size(&h);
	}
	starpu_shutdown();
	return status ? 1 : 0;
}
