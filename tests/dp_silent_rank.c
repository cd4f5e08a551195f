/* A 2-rank job (tests/test_data_parallel.sh runs it under mpirun) in which rank 1 never
 * takes part: rank 0 waits in _dos_dp_sum with nothing else submitted, then in
 * _dos_dp_barrier. StarPU's watchdog must see each wait and end it (the hook below says
 * so and exits 3). It used to see neither: a wait in MPI with no task submitted is not one
 * StarPU watches, and a job with a stopped rank hung for good (graph/data_parallel.c).
 * Argument: barrier, to wait in the barrier instead of the sum. Exits 77 without
 * StarPU-MPI or outside a job. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data_parallel.h"

static void watchdog_fired(void *arg)
{
	printf("rank 0: the watchdog ended the wait for rank 1 in the %s\n", (const char *)arg);
	fflush(stdout);
	_exit(3);
}

int main(int argc, char **argv)
{
	if (!_dos_dp_available() || !_dos_dp_launched()) {
		fprintf(stderr, "dp_silent_rank: a rank of a job over StarPU-MPI (mpirun -np 2): skipped\n");
		return 77;
	}
	const char *wait = argc > 1 && strcmp(argv[1], "barrier") == 0 ? "barrier" : "sum";
	setenv("STARPU_WATCHDOG_TIMEOUT", "1000000", 1); /* 1 s */
	starpu_task_watchdog_set_hook(watchdog_fired, (void *)wait);
	struct starpu_conf conf;
	starpu_conf_init(&conf);
	struct dos_data_parallel dp = {0};
	struct dos_rank_binding binding;
	if (_dos_dp_init(&argc, &argv, &conf, &dp, &binding) != 0) {
		fprintf(stderr, "dp_silent_rank: StarPU-MPI did not start\n");
		return 1;
	}
	if (dp.nranks != 2) {
		fprintf(stderr, "dp_silent_rank: %d ranks, expected 2\n", dp.nranks);
		return 1;
	}
	if (dp.rank == 1) { /* silent until the job ends it (or a minute passes) */
		sleep(60);
		_exit(1);
	}
	if (strcmp(wait, "barrier") == 0)
		_dos_dp_barrier();
	else
		(void)_dos_dp_sum(1.0);
	printf("rank 0: the %s returned without rank 1\n", wait);
	fflush(stdout);
	_exit(1);
}
