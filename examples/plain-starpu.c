/* A StarPU program that knows nothing of starpu-dos (built with `pkg-config starpu-1.4`
 * only): make installcheck runs it with STARPU_SCHED_LIB=<installed libstarpu-dos.so>
 * STARPU_SCHED=dos, the way any StarPU application can use our policy unmodified. Its
 * tasks increment a counter, so a task lost or run twice shows in the final value. */
#include <stdint.h>
#include <stdio.h>

#include <starpu.h>

#define NTASKS 100

static void increment_cpu(void *buffers[], void *cl_arg)
{
	(void)cl_arg;
	uint64_t *counter = (uint64_t *)STARPU_VARIABLE_GET_PTR(buffers[0]);
	(*counter)++;
}

static struct starpu_codelet increment_cl = {
	.cpu_funcs = {increment_cpu},
	.nbuffers = 1,
	.modes = {STARPU_RW},
	.name = "plain_increment",
};

int main(void)
{
	if (starpu_init(NULL) != 0) {
		fprintf(stderr, "plain-starpu: starpu_init failed\n");
		return 1;
	}
	uint64_t counter = 0;
	starpu_data_handle_t handle;
	starpu_variable_data_register(&handle, STARPU_MAIN_RAM, (uintptr_t)&counter, sizeof counter);
	for (int i = 0; i < NTASKS; i++)
		if (starpu_task_insert(&increment_cl, STARPU_RW, handle, 0) != 0) {
			fprintf(stderr, "plain-starpu: starpu_task_insert failed\n");
			return 1;
		}
	starpu_task_wait_for_all();
	starpu_data_unregister(handle);
	starpu_shutdown();
	if (counter != NTASKS) {
		fprintf(stderr, "plain-starpu: counter %llu after %d tasks\n", (unsigned long long)counter, NTASKS);
		return 1;
	}
	printf("plain-starpu: %d tasks ran\n", NTASKS);
	return 0;
}
