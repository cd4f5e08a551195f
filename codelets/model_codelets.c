/* The StarPU codelets of the example model (model_codelets.h): each unpacks its vector
 * buffers and its struct _dos_model_args (see model_args) and calls the kernel of
 * model_kernels.h for its device. Buffer lengths are checked against the sizes in the
 * arguments (a mismatch is a bug of the graph builder, and would read out of bounds). */
#include "config.h"

#include <string.h>

#include "codelet_util.h"
#include "model_codelets.h"
#include "model_kernels.h"

#ifdef DOS_USE_CUDA
#include <starpu_cublas_v2.h>
#endif

#define F32(i) ((float *)STARPU_VECTOR_GET_PTR(buffers[i]))
#define ANY(i) ((void *)STARPU_VECTOR_GET_PTR(buffers[i])) /* of the model dtype */
#define I32(i) ((int32_t *)STARPU_VECTOR_GET_PTR(buffers[i]))

/* The task's struct _dos_model_args, copied into *args: cl_arg points to the struct itself
 * (STARPU_CL_ARGS or task->cl_arg, as graph/model.c does; model_codelets.h). */
static const struct _dos_model_args *model_args(void *cl_arg, struct _dos_model_args *args)
{
	size_t size = starpu_task_get_current()->cl_arg_size;
	STARPU_ASSERT_MSG_ALWAYS(cl_arg != NULL && size == sizeof *args,
				 "model codelet: cl_arg of %zu bytes, expected one struct _dos_model_args (%zu bytes)",
				 size, sizeof *args);
	memcpy(args, cl_arg, sizeof *args);
	STARPU_ASSERT_MSG_ALWAYS(args->dtype == DOS_FP32 || args->dtype == DOS_FP16 || args->dtype == DOS_BF16,
				 "model codelet: dtype = %d is not fp32, fp16 or bf16", (int)args->dtype);
	return args;
}

/* Buffer i of a `codelet` task must hold at least `count` elements of `elemsize` bytes. */
static void need(void *buffers[], int i, size_t count, size_t elemsize, const char *codelet)
{
	size_t nx = STARPU_VECTOR_GET_NX(buffers[i]), got = STARPU_VECTOR_GET_ELEMSIZE(buffers[i]);
	STARPU_ASSERT_MSG_ALWAYS(nx >= count && got == elemsize,
				 "%s: buffer %d has %zu elements of %zu bytes, expected at least %zu of %zu", codelet,
				 i, nx, got, count, elemsize);
}

#define NEED(i, count, elemsize) need(buffers, (i), (count), (elemsize), __func__)

/* The checks and the kernel arguments are the same for both devices: one function per
 * codelet validates, and the two implementations differ only by the call. */

static void embed_fwd_check(void *buffers[], const struct _dos_model_args *a)
{
	const size_t es = dos_dtype_size(a->dtype);
	NEED(0, (size_t)a->n, sizeof(int32_t));
	NEED(1, 0, es);
	NEED(2, (size_t)a->T * a->d, es);
	NEED(3, (size_t)a->n * a->d, es);
}

static void embed_bwd_check(void *buffers[], const struct _dos_model_args *a)
{
	const size_t es = dos_dtype_size(a->dtype);
	NEED(0, (size_t)a->n, sizeof(int32_t));
	NEED(1, (size_t)a->n * a->d, es);
	NEED(2, (size_t)a->V * a->d, sizeof(float));
	NEED(3, (size_t)a->T * a->d, sizeof(float));
}

static void rmsnorm_fwd_check(void *buffers[], const struct _dos_model_args *a)
{
	const size_t es = dos_dtype_size(a->dtype);
	NEED(0, (size_t)a->n * a->d, es);
	NEED(1, (size_t)a->d, es);
	NEED(2, (size_t)a->n * a->d, es);
	NEED(3, (size_t)a->n, sizeof(float));
}

static void rmsnorm_bwd_check(void *buffers[], const struct _dos_model_args *a)
{
	const size_t es = dos_dtype_size(a->dtype);
	NEED(0, (size_t)a->n * a->d, es);
	NEED(1, (size_t)a->d, es);
	NEED(2, (size_t)a->n, sizeof(float));
	NEED(3, (size_t)a->n * a->d, es);
	NEED(4, (size_t)a->n * a->d, es);
	NEED(5, (size_t)a->d, sizeof(float));
}

/* Returns whether the task has the residual (4th) buffer. */
static int linear_fwd_check(void *buffers[], const struct _dos_model_args *a)
{
	const size_t es = dos_dtype_size(a->dtype);
	int nbuffers = STARPU_TASK_GET_NBUFFERS(starpu_task_get_current());
	STARPU_ASSERT_MSG_ALWAYS(nbuffers == 3 || nbuffers == 4, "dos_linear_fwd: %d buffers, expected 3 or 4",
				 nbuffers);
	NEED(0, (size_t)a->n * a->d, es);
	NEED(1, (size_t)a->out * a->d, es);
	NEED(2, (size_t)a->n * a->out, es);
	if (nbuffers == 4)
		NEED(3, (size_t)a->n * a->out, es);
	return nbuffers == 4;
}

static void linear_bwd_data_check(void *buffers[], const struct _dos_model_args *a)
{
	const size_t es = dos_dtype_size(a->dtype);
	NEED(0, (size_t)a->n * a->out, es);
	NEED(1, (size_t)a->out * a->d, es);
	NEED(2, (size_t)a->n * a->d, es);
}

static void linear_bwd_weight_check(void *buffers[], const struct _dos_model_args *a)
{
	const size_t es = dos_dtype_size(a->dtype);
	NEED(0, (size_t)a->n * a->out, es);
	NEED(1, (size_t)a->n * a->d, es);
	NEED(2, (size_t)a->out * a->d, sizeof(float));
}

static void attention_fwd_check(void *buffers[], const struct _dos_model_args *a)
{
	const size_t es = dos_dtype_size(a->dtype);
	size_t n = (size_t)a->B * a->T, d = (size_t)a->H * a->hd;
	NEED(0, n * 3 * d, es);
	NEED(1, n * d, es);
	NEED(2, (size_t)a->B * a->H * a->T * a->T, es);
}

static void attention_bwd_check(void *buffers[], const struct _dos_model_args *a)
{
	const size_t es = dos_dtype_size(a->dtype);
	size_t n = (size_t)a->B * a->T, d = (size_t)a->H * a->hd;
	NEED(0, n * 3 * d, es);
	NEED(1, (size_t)a->B * a->H * a->T * a->T, es);
	NEED(2, n * d, es);
	NEED(3, n * 3 * d, es);
}

/* GELU is elementwise over the whole of its input vector: its length is the count. */
static size_t gelu_fwd_check(void *buffers[], const struct _dos_model_args *a)
{
	size_t count = STARPU_VECTOR_GET_NX(buffers[0]), es = dos_dtype_size(a->dtype);
	NEED(0, count, es);
	NEED(1, count, es);
	return count;
}

static size_t gelu_bwd_check(void *buffers[], const struct _dos_model_args *a)
{
	size_t count = STARPU_VECTOR_GET_NX(buffers[0]), es = dos_dtype_size(a->dtype);
	NEED(0, count, es);
	NEED(1, count, es);
	NEED(2, count, es);
	return count;
}

static void xent_check(void *buffers[], const struct _dos_model_args *a)
{
	const size_t es = dos_dtype_size(a->dtype);
	NEED(0, (size_t)a->n * a->V, es);
	NEED(1, (size_t)a->n, sizeof(int32_t));
	NEED(2, (size_t)a->n, sizeof(float));
	NEED(3, (size_t)a->n * a->V, es);
}

/* ---- CPU ------------------------------------------------------------------------------- */

static void embed_fwd_cpu(void *buffers[], void *cl_arg)
{
	struct _dos_model_args args;
	const struct _dos_model_args *a = model_args(cl_arg, &args);
	embed_fwd_check(buffers, a);
	_dos_embed_fwd_cpu(I32(0), ANY(1), ANY(2), ANY(3), a->n, a->T, a->d, a->dtype);
}

static void embed_bwd_cpu(void *buffers[], void *cl_arg)
{
	struct _dos_model_args args;
	const struct _dos_model_args *a = model_args(cl_arg, &args);
	embed_bwd_check(buffers, a);
	_dos_embed_bwd_cpu(I32(0), ANY(1), F32(2), F32(3), a->n, a->T, a->d, a->V, a->accumulate, a->dtype);
}

static void rmsnorm_fwd_cpu(void *buffers[], void *cl_arg)
{
	struct _dos_model_args args;
	const struct _dos_model_args *a = model_args(cl_arg, &args);
	rmsnorm_fwd_check(buffers, a);
	_dos_rmsnorm_fwd_cpu(ANY(0), ANY(1), ANY(2), F32(3), a->n, a->d, a->dtype);
}

static void rmsnorm_bwd_cpu(void *buffers[], void *cl_arg)
{
	struct _dos_model_args args;
	const struct _dos_model_args *a = model_args(cl_arg, &args);
	rmsnorm_bwd_check(buffers, a);
	_dos_rmsnorm_bwd_cpu(ANY(0), ANY(1), F32(2), ANY(3), ANY(4), F32(5), a->n, a->d, a->accumulate, a->accumulate2,
			     a->dtype);
}

static void linear_fwd_cpu(void *buffers[], void *cl_arg)
{
	struct _dos_model_args args;
	const struct _dos_model_args *a = model_args(cl_arg, &args);
	int residual = linear_fwd_check(buffers, a);
	_dos_linear_fwd_cpu(ANY(0), ANY(1), residual ? ANY(3) : NULL, ANY(2), a->n, a->d, a->out, a->dtype);
}

static void linear_bwd_data_cpu(void *buffers[], void *cl_arg)
{
	struct _dos_model_args args;
	const struct _dos_model_args *a = model_args(cl_arg, &args);
	linear_bwd_data_check(buffers, a);
	_dos_linear_bwd_data_cpu(ANY(0), ANY(1), ANY(2), a->n, a->d, a->out, a->accumulate, a->dtype);
}

static void linear_bwd_weight_cpu(void *buffers[], void *cl_arg)
{
	struct _dos_model_args args;
	const struct _dos_model_args *a = model_args(cl_arg, &args);
	linear_bwd_weight_check(buffers, a);
	_dos_linear_bwd_weight_cpu(ANY(0), ANY(1), F32(2), a->n, a->d, a->out, a->accumulate, a->dtype);
}

static void attention_fwd_cpu(void *buffers[], void *cl_arg)
{
	struct _dos_model_args args;
	const struct _dos_model_args *a = model_args(cl_arg, &args);
	attention_fwd_check(buffers, a);
	_dos_attention_fwd_cpu(ANY(0), ANY(1), ANY(2), a->B, a->T, a->H, a->hd, a->dtype);
}

static void attention_bwd_cpu(void *buffers[], void *cl_arg)
{
	struct _dos_model_args args;
	const struct _dos_model_args *a = model_args(cl_arg, &args);
	attention_bwd_check(buffers, a);
	_dos_attention_bwd_cpu(ANY(0), ANY(1), ANY(2), ANY(3), a->B, a->T, a->H, a->hd, a->dtype);
}

static void gelu_fwd_cpu(void *buffers[], void *cl_arg)
{
	struct _dos_model_args args;
	const struct _dos_model_args *a = model_args(cl_arg, &args);
	size_t count = gelu_fwd_check(buffers, a);
	_dos_gelu_fwd_cpu(ANY(0), ANY(1), count, a->dtype);
}

static void gelu_bwd_cpu(void *buffers[], void *cl_arg)
{
	struct _dos_model_args args;
	const struct _dos_model_args *a = model_args(cl_arg, &args);
	size_t count = gelu_bwd_check(buffers, a);
	_dos_gelu_bwd_cpu(ANY(0), ANY(1), ANY(2), count, a->dtype);
}

static void xent_cpu(void *buffers[], void *cl_arg)
{
	struct _dos_model_args args;
	const struct _dos_model_args *a = model_args(cl_arg, &args);
	xent_check(buffers, a);
	_dos_xent_cpu(ANY(0), I32(1), F32(2), ANY(3), a->n, a->V, a->grad_scale, a->dtype);
}

/* ---- CUDA (asynchronous on StarPU's stream; cuBLAS through StarPU's handle, which
 * starpu_cublas_init() binds to that stream) ------------------------------------------- */
void _dos_model_codelets_prepare(void)
{
#ifdef DOS_USE_CUDA
	/* Outside a worker, starpu_cublas_get_local_handle() is StarPU's main handle: NULL
	 * exactly when starpu_cublas_init() never ran. Calling it a second time would replace
	 * (and leak) the handles of an application that did. */
	if (starpu_cuda_worker_get_count() > 0 && !starpu_cublas_get_local_handle())
		starpu_cublas_init();
#endif
}

#ifdef DOS_USE_CUDA
static void embed_fwd_cuda(void *buffers[], void *cl_arg)
{
	struct _dos_model_args args;
	const struct _dos_model_args *a = model_args(cl_arg, &args);
	embed_fwd_check(buffers, a);
	DOS_CUDA_CHECK(_dos_embed_fwd_cuda(I32(0), ANY(1), ANY(2), ANY(3), a->n, a->T, a->d, a->dtype,
					   starpu_cuda_get_local_stream()));
}

static void embed_bwd_cuda(void *buffers[], void *cl_arg)
{
	struct _dos_model_args args;
	const struct _dos_model_args *a = model_args(cl_arg, &args);
	embed_bwd_check(buffers, a);
	DOS_CUDA_CHECK(_dos_embed_bwd_cuda(I32(0), ANY(1), F32(2), F32(3), a->n, a->T, a->d, a->V, a->accumulate,
					   a->dtype, starpu_cuda_get_local_stream()));
}

static void rmsnorm_fwd_cuda(void *buffers[], void *cl_arg)
{
	struct _dos_model_args args;
	const struct _dos_model_args *a = model_args(cl_arg, &args);
	rmsnorm_fwd_check(buffers, a);
	DOS_CUDA_CHECK(_dos_rmsnorm_fwd_cuda(ANY(0), ANY(1), ANY(2), F32(3), a->n, a->d, a->dtype,
					     starpu_cuda_get_local_stream()));
}

static void rmsnorm_bwd_cuda(void *buffers[], void *cl_arg)
{
	struct _dos_model_args args;
	const struct _dos_model_args *a = model_args(cl_arg, &args);
	rmsnorm_bwd_check(buffers, a);
	DOS_CUDA_CHECK(_dos_rmsnorm_bwd_cuda(ANY(0), ANY(1), F32(2), ANY(3), ANY(4), F32(5), a->n, a->d, a->accumulate,
					     a->accumulate2, a->dtype, starpu_cuda_get_local_stream()));
}

static void linear_fwd_cuda(void *buffers[], void *cl_arg)
{
	struct _dos_model_args args;
	const struct _dos_model_args *a = model_args(cl_arg, &args);
	int residual = linear_fwd_check(buffers, a);
	DOS_CUBLAS_CHECK(_dos_linear_fwd_cuda(starpu_cublas_get_local_handle(), ANY(0), ANY(1),
					      residual ? ANY(3) : NULL, ANY(2), a->n, a->d, a->out, a->dtype,
					      starpu_cuda_get_local_stream()));
}

static void linear_bwd_data_cuda(void *buffers[], void *cl_arg)
{
	struct _dos_model_args args;
	const struct _dos_model_args *a = model_args(cl_arg, &args);
	linear_bwd_data_check(buffers, a);
	DOS_CUBLAS_CHECK(_dos_linear_bwd_data_cuda(starpu_cublas_get_local_handle(), ANY(0), ANY(1), ANY(2), a->n, a->d,
						   a->out, a->accumulate, a->dtype));
}

static void linear_bwd_weight_cuda(void *buffers[], void *cl_arg)
{
	struct _dos_model_args args;
	const struct _dos_model_args *a = model_args(cl_arg, &args);
	linear_bwd_weight_check(buffers, a);
	DOS_CUBLAS_CHECK(_dos_linear_bwd_weight_cuda(starpu_cublas_get_local_handle(), ANY(0), ANY(1), F32(2), a->n,
						     a->d, a->out, a->accumulate, a->dtype));
}

static void attention_fwd_cuda(void *buffers[], void *cl_arg)
{
	struct _dos_model_args args;
	const struct _dos_model_args *a = model_args(cl_arg, &args);
	attention_fwd_check(buffers, a);
	DOS_CUDA_CHECK(_dos_attention_fwd_cuda(starpu_cublas_get_local_handle(), ANY(0), ANY(1), ANY(2), a->B, a->T,
					       a->H, a->hd, a->dtype, starpu_cuda_get_local_stream()));
}

static void attention_bwd_cuda(void *buffers[], void *cl_arg)
{
	struct _dos_model_args args;
	const struct _dos_model_args *a = model_args(cl_arg, &args);
	attention_bwd_check(buffers, a);
	DOS_CUDA_CHECK(_dos_attention_bwd_cuda(starpu_cublas_get_local_handle(), ANY(0), ANY(1), ANY(2), ANY(3), a->B,
					       a->T, a->H, a->hd, a->dtype, starpu_cuda_get_local_stream()));
}

static void gelu_fwd_cuda(void *buffers[], void *cl_arg)
{
	struct _dos_model_args args;
	const struct _dos_model_args *a = model_args(cl_arg, &args);
	size_t count = gelu_fwd_check(buffers, a);
	DOS_CUDA_CHECK(_dos_gelu_fwd_cuda(ANY(0), ANY(1), count, a->dtype, starpu_cuda_get_local_stream()));
}

static void gelu_bwd_cuda(void *buffers[], void *cl_arg)
{
	struct _dos_model_args args;
	const struct _dos_model_args *a = model_args(cl_arg, &args);
	size_t count = gelu_bwd_check(buffers, a);
	DOS_CUDA_CHECK(_dos_gelu_bwd_cuda(ANY(0), ANY(1), ANY(2), count, a->dtype, starpu_cuda_get_local_stream()));
}

static void xent_cuda(void *buffers[], void *cl_arg)
{
	struct _dos_model_args args;
	const struct _dos_model_args *a = model_args(cl_arg, &args);
	xent_check(buffers, a);
	DOS_CUDA_CHECK(_dos_xent_cuda(ANY(0), I32(1), F32(2), ANY(3), a->n, a->V, a->grad_scale, a->dtype,
				      starpu_cuda_get_local_stream()));
}
#endif /* DOS_USE_CUDA */

DOS_DEFINE_CODELET(embed_fwd, embed_fwd_cpu, embed_fwd_cuda, STARPU_VARIABLE_NBUFFERS);
DOS_DEFINE_CODELET(embed_bwd, embed_bwd_cpu, embed_bwd_cuda, STARPU_VARIABLE_NBUFFERS);
DOS_DEFINE_CODELET(rmsnorm_fwd, rmsnorm_fwd_cpu, rmsnorm_fwd_cuda, STARPU_VARIABLE_NBUFFERS);
DOS_DEFINE_CODELET(rmsnorm_bwd, rmsnorm_bwd_cpu, rmsnorm_bwd_cuda, STARPU_VARIABLE_NBUFFERS);
/* The products' perfmodels regress time on floating-point operations, not on the data
 * size (StarPU's default), which says little about a product's cost; the simulated
 * machines' models are written in the same unit (tools/gen-machine.py). */
static const struct _dos_model_args *task_args(const struct starpu_task *task)
{
	STARPU_ASSERT_MSG(task->cl_arg && task->cl_arg_size == sizeof(struct _dos_model_args),
			  "%s: cl_arg must be one struct _dos_model_args", task->cl->name);
	return task->cl_arg;
}

size_t _dos_linear_flops(struct starpu_task *task, unsigned nimpl)
{
	const struct _dos_model_args *a = task_args(task);
	return 2 * (size_t)a->n * a->d * a->out;
}

/* q k^T and p v: 2 products of B*H*T*T*hd multiply-adds; backward has 4 */
size_t _dos_attention_fwd_flops(struct starpu_task *task, unsigned nimpl)
{
	const struct _dos_model_args *a = task_args(task);
	return 4 * (size_t)a->B * a->H * a->T * a->T * a->hd;
}

size_t _dos_attention_bwd_flops(struct starpu_task *task, unsigned nimpl)
{
	return 2 * _dos_attention_fwd_flops(task, nimpl);
}

DOS_DEFINE_CODELET_SIZED(linear_fwd, linear_fwd_cpu, linear_fwd_cuda, _dos_linear_flops, STARPU_VARIABLE_NBUFFERS);
DOS_DEFINE_CODELET_SIZED(linear_bwd_data, linear_bwd_data_cpu, linear_bwd_data_cuda, _dos_linear_flops,
			 STARPU_VARIABLE_NBUFFERS);
DOS_DEFINE_CODELET_SIZED(linear_bwd_weight, linear_bwd_weight_cpu, linear_bwd_weight_cuda, _dos_linear_flops,
			 STARPU_VARIABLE_NBUFFERS);
DOS_DEFINE_CODELET_SIZED(attention_fwd, attention_fwd_cpu, attention_fwd_cuda, _dos_attention_fwd_flops,
			 STARPU_VARIABLE_NBUFFERS);
DOS_DEFINE_CODELET_SIZED(attention_bwd, attention_bwd_cpu, attention_bwd_cuda, _dos_attention_bwd_flops,
			 STARPU_VARIABLE_NBUFFERS);
/* The products in 16-bit compute: the same kernels and names, perfmodels of their own
 * ("dos_linear_fwd16", ...). On a GPU a 16-bit product runs on the tensor cores, many times
 * faster than an fp32 one of the same operation count, and on the CPU somewhat slower
 * (widening); one regression fed both precisions (a perfmodel file outlives a run) would
 * predict neither. */
DOS_DEFINE_CODELET_MODELLED(linear_fwd16, "dos_linear_fwd", linear_fwd_cpu, linear_fwd_cuda, _dos_linear_flops,
			    STARPU_VARIABLE_NBUFFERS);
DOS_DEFINE_CODELET_MODELLED(linear_bwd_data16, "dos_linear_bwd_data", linear_bwd_data_cpu, linear_bwd_data_cuda,
			    _dos_linear_flops, STARPU_VARIABLE_NBUFFERS);
DOS_DEFINE_CODELET_MODELLED(linear_bwd_weight16, "dos_linear_bwd_weight", linear_bwd_weight_cpu, linear_bwd_weight_cuda,
			    _dos_linear_flops, STARPU_VARIABLE_NBUFFERS);
DOS_DEFINE_CODELET_MODELLED(attention_fwd16, "dos_attention_fwd", attention_fwd_cpu, attention_fwd_cuda,
			    _dos_attention_fwd_flops, STARPU_VARIABLE_NBUFFERS);
DOS_DEFINE_CODELET_MODELLED(attention_bwd16, "dos_attention_bwd", attention_bwd_cpu, attention_bwd_cuda,
			    _dos_attention_bwd_flops, STARPU_VARIABLE_NBUFFERS);
DOS_DEFINE_CODELET(gelu_fwd, gelu_fwd_cpu, gelu_fwd_cuda, STARPU_VARIABLE_NBUFFERS);
DOS_DEFINE_CODELET(gelu_bwd, gelu_bwd_cpu, gelu_bwd_cuda, STARPU_VARIABLE_NBUFFERS);
DOS_DEFINE_CODELET(xent, xent_cpu, xent_cuda, STARPU_VARIABLE_NBUFFERS);
