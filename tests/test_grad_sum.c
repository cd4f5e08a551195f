/* The scatter exchange's kernels (graph/scatter.h): the sum of the ranks' partial
 * gradients adds them in rank order in fp32 and rounds once (an order that matters is
 * checked element by element against a plain loop, across the kernel's blocks and for up
 * to 70 partials, in fp32 and bf16), and a flat copy with several destinations cuts a
 * subgroup into chunks and puts it back together. Then both as StarPU tasks with more
 * buffers than StarPU's static ones, whose results must be the kernels' bits. */
#include <starpu.h>

#include "flat.h"
#include "numerics.h"
#include "test_starpu.h"
#include "test_util.h"

/* The reference: the partials of element i in rank order, in fp32, rounded once. */
static float reference_sum(void *const *partials, uint32_t n, enum dos_dtype dtype, size_t i, enum dos_dtype out)
{
	float acc = dos_load_elem(partials[0], i, dtype);
	for (uint32_t r = 1; r < n; r++)
		acc = acc + dos_load_elem(partials[r], i, dtype);
	char one[4];
	dos_store_elem(one, 0, out, acc);
	return dos_load_elem(one, 0, out);
}

/* n partials of len elements: random, plus at every 7th element a large value, a small one
 * and its opposite, whose sum in rank order differs from any other order's. */
static void **make_partials(uint32_t n, size_t len, enum dos_dtype dtype, uint64_t *seed)
{
	void **p = calloc(n, sizeof *p);
	CHECK(p, "no memory");
	for (uint32_t r = 0; r < n; r++) {
		CHECK((p[r] = malloc(len * 4)), "no memory");
		for (size_t i = 0; i < len; i++) {
			float x = (float)test_normal(seed);
			if (i % 7 == 0)
				x = r == 0 ? 1e8f : r == 1 ? 3.0f : r == 2 ? -1e8f : x * 1e-3f;
			dos_store_elem(p[r], i, dtype, x);
		}
	}
	return p;
}

static void check_sums(uint32_t n, size_t len, enum dos_dtype dtype, uint64_t *seed)
{
	void **partials = make_partials(n, len, dtype, seed);
	void *out = malloc(len * 4);
	CHECK(out, "no memory");
	_dos_grad_sum_cpu(out, dtype, (const void *const *)partials, n, dtype, len);
	for (size_t i = 0; i < len; i++) {
		float want = reference_sum(partials, n, dtype, i, dtype), got = dos_load_elem(out, i, dtype);
		CHECK(memcmp(&want, &got, sizeof want) == 0,
		      "%u partials of %zu (%s): element %zu is %a, rank order gives %a", n, len, dos_dtype_name(dtype),
		      i, (double)got, (double)want);
	}
	/* an order that matters: in fp32, (1e8 + 3) - 1e8 is 0 (1e8 + 3 rounds to 1e8), while
	 * (1e8 - 1e8) + 3 is 3 */
	if (n == 3 && dtype == DOS_FP32)
		CHECK(dos_load_elem(out, 0, dtype) == 0.0f, "1e8, 3, -1e8 summed to %g: not in rank order",
		      (double)dos_load_elem(out, 0, dtype));
	for (uint32_t r = 0; r < n; r++)
		free(partials[r]);
	free(partials);
	free(out);
}

/* A subgroup of len elements cut into k chunks and put back: the same bits. */
static void check_chunks(size_t len, uint32_t k, enum dos_dtype dtype, uint64_t *seed)
{
	char *whole = malloc(len * 4), *back = malloc(len * 4);
	void **chunks = calloc(k, sizeof *chunks);
	struct dos_flat_copy_args *cut = malloc(sizeof *cut + k * sizeof *cut->pieces);
	struct dos_flat_copy_args *join = malloc(sizeof *join + k * sizeof *join->pieces);
	CHECK(whole && back && chunks && cut && join, "no memory");
	for (size_t i = 0; i < len; i++)
		dos_store_elem(whole, i, dtype, (float)test_normal(seed));
	*cut = (struct dos_flat_copy_args){
		.source_dtype = dtype, .destination_dtype = dtype, .npieces = k, .ndestinations = k};
	*join = (struct dos_flat_copy_args){
		.source_dtype = dtype, .destination_dtype = dtype, .npieces = k, .ndestinations = 1};
	for (uint32_t c = 0; c < k; c++) {
		uint64_t begin = c * len / k, end = (c + 1) * len / k;
		CHECK((chunks[c] = malloc((end - begin) * 4 + 1)), "no memory");
		cut->pieces[c] = (struct dos_flat_piece){.source = 0,
							 .destination = c,
							 .source_offset = begin,
							 .destination_offset = 0,
							 .len = end - begin};
		join->pieces[c] = (struct dos_flat_piece){.source = c,
							  .destination = 0,
							  .source_offset = 0,
							  .destination_offset = begin,
							  .len = end - begin};
	}
	void *dst[] = {back};
	const void *src[] = {whole};
	_dos_flat_copy_cpu(chunks, src, cut);
	_dos_flat_copy_cpu(dst, (const void *const *)chunks, join);
	CHECK(memcmp(whole, back, len * dos_dtype_size(dtype)) == 0, "%zu elements through %u chunks changed", len, k);
	for (uint32_t c = 0; c < k; c++)
		free(chunks[c]);
	free(chunks);
	free(cut);
	free(join);
	free(whole);
	free(back);
}

/* The codelet: 70 partials (beyond StarPU's static buffers) summed by a task. */
static void check_task(uint64_t *seed)
{
	const uint32_t n = 70;
	const size_t len = 5000;
	void **partials = make_partials(n, len, DOS_BF16, seed);
	uint16_t *out = calloc(len, 2);
	starpu_data_handle_t *h = calloc(n, sizeof *h), sum;
	CHECK(out && h, "no memory");
	for (uint32_t r = 0; r < n; r++)
		starpu_vector_data_register(&h[r], STARPU_MAIN_RAM, (uintptr_t)partials[r], (uint32_t)len, 2);
	starpu_vector_data_register(&sum, STARPU_MAIN_RAM, (uintptr_t)out, (uint32_t)len, 2);
	struct starpu_task *task;
	CHECK(_dos_grad_sum_task_create(sum, DOS_BF16, h, n, DOS_BF16, 0, &task) == 0, "task");
	CHECK(starpu_task_submit(task) == 0, "submit");
	starpu_task_wait_for_all();
	starpu_data_unregister(sum);
	for (uint32_t r = 0; r < n; r++)
		starpu_data_unregister(h[r]);
	for (size_t i = 0; i < len; i++) {
		float want = reference_sum(partials, n, DOS_BF16, i, DOS_BF16), got = dos_bf16_to_float(out[i]);
		CHECK(memcmp(&want, &got, sizeof want) == 0, "task: element %zu is %a, rank order gives %a", i,
		      (double)got, (double)want);
	}
	for (uint32_t r = 0; r < n; r++)
		free(partials[r]);
	free(partials);
	free(h);
	free(out);
}

int main(void)
{
	uint64_t seed = 42;
	const enum dos_dtype dtypes[] = {DOS_FP32, DOS_BF16};
	const uint32_t counts[] = {1, 2, 3, 4, 17, 64};
	const size_t lens[] = {1, 7, 2047, 2048, 2049, 10000};
	for (size_t d = 0; d < 2; d++)
		for (size_t c = 0; c < sizeof counts / sizeof *counts; c++)
			for (size_t l = 0; l < sizeof lens / sizeof *lens; l++)
				check_sums(counts[c], lens[l], dtypes[d], &seed);
	for (size_t d = 0; d < 2; d++)
		for (uint32_t k = 1; k <= 9; k++)
			check_chunks(10007, k, dtypes[d], &seed);
	check_chunks(64, 64, DOS_BF16, &seed);

	struct starpu_conf conf;
	starpu_conf_init(&conf);
	conf.ncuda = 0; /* the sum is CPU only; the copies' CPU kernel is checked above */
	test_starpu_init(&conf);
	check_task(&seed);
	starpu_shutdown();
	printf("grad sum: rank order in fp32, one rounding, up to 70 partials; chunks cut and joined exactly\n");
	return 0;
}
