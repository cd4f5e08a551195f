/* The init-state codelet: creates one subgroup's optimizer state where it runs (init_state.h),
 * writing it only, so that state a GPU will keep is born there and never crosses the link. */
#include <errno.h>
#include <string.h>

#include "codelet_util.h"
#include "codelets.h"
#include "errors.h"
#include "init_state.h"

struct init_state_args {
	struct dos_init_layout layout;
	uint64_t begin; /* the subgroup's first parameter */
};

void _dos_init_state_cpu(const struct dos_init_layout *l, uint64_t begin, float *master, float *m, float *v, uint64_t n)
{
	/* run by run: locating a parameter divides, drawing the next one only mixes */
	for (uint64_t j = 0; j < n;) {
		uint64_t k, run_end;
		int norm = dos_init_locate(l, begin + j, &k, &run_end);
		uint64_t stop = run_end - begin < n ? run_end - begin : n;
		for (; j < stop; j++)
			master[j] = norm ? 1.0f : dos_init_draw(l, k++);
	}
	memset(m, 0, n * sizeof *m);
	memset(v, 0, n * sizeof *v);
}

static void init_state_cpu(void *buffers[], void *cl_arg)
{
	const struct init_state_args *a = cl_arg;
	_dos_init_state_cpu(&a->layout, a->begin, _dos_buffer_ptr(buffers[0]), _dos_buffer_ptr(buffers[1]),
			    _dos_buffer_ptr(buffers[2]), _dos_buffer_count(buffers[0], sizeof(float)));
}

#ifdef DOS_USE_CUDA
static void init_state_cuda(void *buffers[], void *cl_arg)
{
	const struct init_state_args *a = cl_arg;
	DOS_CUDA_CHECK(_dos_init_state_cuda(&a->layout, a->begin, _dos_buffer_ptr(buffers[0]),
					    _dos_buffer_ptr(buffers[1]), _dos_buffer_ptr(buffers[2]),
					    _dos_buffer_count(buffers[0], sizeof(float)),
					    starpu_cuda_get_local_stream()));
}
#endif

DOS_DEFINE_CODELET(init_state, init_state_cpu, init_state_cuda, 3, STARPU_W, STARPU_W, STARPU_W);

int _dos_init_state_task_create(starpu_data_handle_t master, starpu_data_handle_t m, starpu_data_handle_t v,
				const struct dos_init_layout *layout, uint64_t begin, struct starpu_task **task_out)
{
	uint32_t n[3];
	starpu_data_handle_t handles[3] = {master, m, v};
	static const char *const names[3] = {"master", "m", "v"};
	int err;
	if (!layout || !task_out)
		return DOS_FAIL(-EINVAL, "NULL argument (layout %p, task_out %p)", (const void *)layout,
				(void *)task_out);
	for (int i = 0; i < 3; i++)
		if ((err = _dos_check_contiguous(__func__, names[i], handles[i], sizeof(float), &n[i])))
			return err;
	if ((err = _dos_check_distinct(__func__, handles, names, 3)))
		return err;
	if (n[1] != n[0] || n[2] != n[0])
		return DOS_FAIL(-EINVAL, "master has %u elements but m has %u and v %u", n[0], n[1], n[2]);
	struct init_state_args args = {.layout = *layout, .begin = begin};
	struct starpu_task *task = _dos_task_with_args(__func__, &_dos_init_state_codelet, &args, sizeof args);
	if (!task)
		return -ENOMEM;
	for (int i = 0; i < 3; i++)
		task->handles[i] = handles[i];
	*task_out = task;
	return 0;
}
