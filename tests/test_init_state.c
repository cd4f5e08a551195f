/* The optimizer state a fresh run creates by tasks (codelets/init_state.h) against the
 * model's sequential initialisation (_dos_model_init_weights), bit for bit:
 *  1. every parameter's value computed from its index alone, for shapes whose norm
 *     weights fall at different places (one layer, several, ffn not 4 x hidden, tiny
 *     vocabularies) and seeds near 0 and near 2^64 (the generator's state wraps);
 *  2. the CPU kernel over ranges that start and end inside tensors, norm weights included;
 *  3. the codelet through StarPU on CPU workers, its buffers full of garbage first (it
 *     writes them only), subgroups of uneven lengths covering the flat space;
 *  4. bad arguments refused with the argument named.
 * The CUDA kernel has the same check in test_init_state_cuda. */
#include "config.h"

#include <errno.h>
#include <starpu.h>

#include "codelets.h"
#include "errors.h"
#include "init_state.h"
#include "model.h"
#include "test_starpu.h"
#include "test_util.h"

static float *reference(const struct dos_model_shape *s, uint64_t seed, uint64_t *nparams)
{
	*nparams = _dos_model_param_count(s, NULL);
	float *flat = test_malloc(*nparams * sizeof(float));
	_dos_model_init_weights(s, seed, flat);
	return flat;
}

static void check_values(const struct dos_model_shape *s, uint64_t seed)
{
	uint64_t P;
	float *flat = reference(s, seed, &P);
	struct dos_init_layout l = _dos_model_init_layout(s, seed);
	uint64_t ones = 0;
	for (uint64_t i = 0; i < P; i++) {
		float x = dos_init_weight(&l, i);
		CHECK(dos_float_bits(x) == dos_float_bits(flat[i]),
		      "shape %ux%u ffn %u layers %u seed %#llx: parameter %llu is %a, sequentially %a", s->vocab,
		      s->hidden, s->ffn, s->layers, (unsigned long long)seed, (unsigned long long)i, (double)x,
		      (double)flat[i]);
		ones += x == 1.0f;
	}
	/* the norm weights and nothing else are 1 (a draw of exactly 1 is impossible) */
	CHECK(ones == (2ull * s->layers + 1) * s->hidden, "%llu ones, expected %llu", (unsigned long long)ones,
	      (2ull * s->layers + 1) * s->hidden);
	/* the kernel over ranges: tensor edges, and from a random start to a random end */
	uint64_t rng = seed ^ 0x5eed;
	float *master = test_malloc(P * sizeof(float)), *m = test_malloc(P * sizeof(float)),
	      *v = test_malloc(P * sizeof(float));
	for (int k = 0; k < 20; k++) {
		uint64_t begin = test_rand(&rng) % P, end = begin + 1 + test_rand(&rng) % (P - begin);
		memset(master, 0xff, P * sizeof(float));
		memset(m, 0xff, P * sizeof(float));
		memset(v, 0xff, P * sizeof(float));
		_dos_init_state_cpu(&l, begin, master + begin, m + begin, v + begin, end - begin);
		for (uint64_t i = begin; i < end; i++)
			CHECK(dos_float_bits(master[i]) == dos_float_bits(flat[i]) && m[i] == 0 && v[i] == 0 &&
				      !signbit(m[i]) && !signbit(v[i]),
			      "range [%llu, %llu): parameter %llu", (unsigned long long)begin, (unsigned long long)end,
			      (unsigned long long)i);
		CHECK((begin == 0 || dos_float_bits(master[begin - 1]) == UINT32_MAX) &&
			      (end == P || dos_float_bits(master[end]) == UINT32_MAX),
		      "range [%llu, %llu) wrote outside itself", (unsigned long long)begin, (unsigned long long)end);
	}
	free(master), free(m), free(v), free(flat);
}

/* The codelet on StarPU's CPU workers: subgroups of `sub` parameters over the flat space. */
static void check_codelet(const struct dos_model_shape *s, uint64_t seed, uint64_t sub)
{
	uint64_t P;
	float *flat = reference(s, seed, &P);
	struct dos_init_layout l = _dos_model_init_layout(s, seed);
	float *state = test_malloc(3 * P * sizeof(float));
	memset(state, 0x7f, 3 * P * sizeof(float)); /* garbage the tasks must not read */
	uint32_t N = (uint32_t)((P + sub - 1) / sub);
	starpu_data_handle_t *h = test_malloc(3 * N * sizeof *h);
	for (uint32_t g = 0; g < N; g++) {
		uint64_t begin = g * sub, len = P - begin < sub ? P - begin : sub;
		for (int a = 0; a < 3; a++)
			starpu_vector_data_register(&h[3 * g + a], STARPU_MAIN_RAM, (uintptr_t)(state + a * P + begin),
						    (uint32_t)len, sizeof(float));
		struct starpu_task *task;
		CHECK(_dos_init_state_task_create(h[3 * g], h[3 * g + 1], h[3 * g + 2], &l, begin, &task) == 0,
		      "task create: %s", dos_last_error());
		CHECK(starpu_task_submit(task) == 0, "submit");
	}
	starpu_task_wait_for_all();
	for (uint32_t k = 0; k < 3 * N; k++)
		starpu_data_unregister(h[k]);
	for (uint64_t i = 0; i < P; i++)
		CHECK(dos_float_bits(state[i]) == dos_float_bits(flat[i]) && dos_float_bits(state[P + i]) == 0 &&
			      dos_float_bits(state[2 * P + i]) == 0,
		      "codelet, subgroups of %llu: parameter %llu: master %a (expected %a), m %a, v %a",
		      (unsigned long long)sub, (unsigned long long)i, (double)state[i], (double)flat[i],
		      (double)state[P + i], (double)state[2 * P + i]);
	free(h), free(state), free(flat);
}

static void check_refusals(void)
{
	float a[8], b[8], c[4];
	starpu_data_handle_t ha, hb, hc;
	starpu_vector_data_register(&ha, STARPU_MAIN_RAM, (uintptr_t)a, 8, sizeof(float));
	starpu_vector_data_register(&hb, STARPU_MAIN_RAM, (uintptr_t)b, 8, sizeof(float));
	starpu_vector_data_register(&hc, STARPU_MAIN_RAM, (uintptr_t)c, 4, sizeof(float));
	struct dos_model_shape s = {256, 32, 2, 64, 2, 16};
	struct dos_init_layout l = _dos_model_init_layout(&s, 1);
	struct starpu_task *task = NULL;
	CHECK(_dos_init_state_task_create(ha, hb, hc, NULL, 0, &task) == -EINVAL && strstr(dos_last_error(), "layout"),
	      "NULL layout: %s", dos_last_error());
	CHECK(_dos_init_state_task_create(ha, hb, hc, &l, 0, &task) == -EINVAL && strstr(dos_last_error(), "4"),
	      "lengths 8, 8, 4: %s", dos_last_error());
	CHECK(_dos_init_state_task_create(ha, hb, ha, &l, 0, &task) == -EINVAL, "v aliasing master: %s",
	      dos_last_error());
	CHECK(task == NULL, "a refused call made a task");
	starpu_data_unregister(ha), starpu_data_unregister(hb), starpu_data_unregister(hc);
}

int main(void)
{
	/* {vocab, hidden, heads, ffn, layers, seq_len} */
	const struct dos_model_shape shapes[] = {
		{256, 32, 2, 64, 2, 16}, /* the tiny preset */
		{3, 4, 1, 5, 1, 2},      /* one layer, norms larger than a third of it */
		{300, 8, 2, 24, 5, 7},   /* ffn = 3 x hidden */
		{17, 12, 3, 48, 3, 1},   /* one position */
	};
	const uint64_t seeds[] = {0, 1, 42, UINT64_MAX, UINT64_MAX - 0x9E3779B97F4A7C15ull};
	for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++)
		for (size_t j = 0; j < sizeof seeds / sizeof *seeds; j++)
			check_values(&shapes[k], seeds[j]);
	printf("values: %zu shapes x %zu seeds, every parameter and 20 ranges each, bit for bit\n",
	       sizeof shapes / sizeof *shapes, sizeof seeds / sizeof *seeds);

	struct starpu_conf conf;
	starpu_conf_init(&conf);
	conf.ncuda = 0; /* the CPU implementation here; test_init_state_cuda has the kernel */
	conf.nopencl = 0;
	test_starpu_init(&conf);
	const uint64_t subs[] = {1000, 777, 33440};
	for (size_t k = 0; k < sizeof subs / sizeof *subs; k++)
		check_codelet(&shapes[0], 42, subs[k]);
	check_codelet(&shapes[2], 7, 100);
	check_refusals();
	starpu_shutdown();
	printf("codelet on CPU workers: 4 subgroupings bit for bit; bad arguments refused\n");
	return 0;
}
