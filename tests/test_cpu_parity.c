/* Every SIMD variant (AVX2, AVX-512, whichever this CPU has) against the scalar reference,
 * bit for bit, on every output of every kernel and every dtype combination: sizes that
 * are not multiples of any vector width, unaligned starts, subnormals, values near the
 * fp16 overflow threshold, inf and nan gradients, and the update's non-finite bits. NaN
 * results compare equal to any NaN: their payloads are not part of the contract (a GPU
 * returns canonical NaNs). */
#include "kernels.h"
#include "parity_util.h"

static const size_t sizes[] = {1, 7, 8, 15, 16, 17, 31, 33, 100, 1000003};
static const size_t offsets[] = {0, 1, 3}; /* elements past a 64-byte boundary */

/* Two copies of one problem, 64-byte aligned plus `offset` elements. */
struct buffers {
	unsigned char *raw[2][5];
	float *p[2], *m[2], *v[2];
	void *g[2], *w[2];
};

static void *aligned_at(unsigned char **raw, size_t bytes, size_t offset_bytes)
{
	*raw = test_malloc(bytes + offset_bytes + 64);
	return (void *)(((uintptr_t)*raw + 63) / 64 * 64 + offset_bytes);
}

static void make_buffers(struct buffers *b, size_t n, size_t off, enum dos_dtype gt, enum dos_dtype wt, uint64_t seed)
{
	uint64_t rng = seed;
	for (int c = 0; c < 2; c++) {
		b->p[c] = aligned_at(&b->raw[c][0], n * 4, off * 4);
		b->m[c] = aligned_at(&b->raw[c][1], n * 4, off * 4);
		b->v[c] = aligned_at(&b->raw[c][2], n * 4, off * 4);
		b->g[c] = aligned_at(&b->raw[c][3], n * dos_dtype_size(gt), off * dos_dtype_size(gt));
		b->w[c] = aligned_at(&b->raw[c][4], n * dos_dtype_size(wt), off * dos_dtype_size(wt));
	}
	for (size_t i = 0; i < n; i++) {
		b->p[0][i] = b->p[1][i] = value_mix(&rng, 0);
		b->m[0][i] = b->m[1][i] = value_mix(&rng, 0);
		b->v[0][i] = b->v[1][i] = fabsf(value_mix(&rng, 0));
		float g = value_mix(&rng, 1);
		dos_store_elem(b->g[0], i, gt, g);
		dos_store_elem(b->g[1], i, gt, g);
	}
	memset(b->w[0], 0, n * dos_dtype_size(wt));
	memset(b->w[1], 0, n * dos_dtype_size(wt));
}

static void free_buffers(struct buffers *b)
{
	for (int c = 0; c < 2; c++)
		for (int k = 0; k < 5; k++)
			free(b->raw[c][k]);
}

static const struct dos_adam_hparams hparam_sets[] = {
	{DOS_ADAMW, 1e-3, 0.9, 0.999, 1e-8, 0.01},
	{DOS_ADAM_L2, 1e-2, 0.9, 0.95, 1e-6, 0.1},
	{DOS_ADAMW, 0.1, 0.8, 0.99, 1e-8, 0.0},
	{DOS_ADAMW, 3e-4, 0.3, 0.5, 1e-8, 0.1}, /* beta1 < 0.5: torch's other lerp form */
};

static void check_adam(const struct _dos_cpu_kernels *k, size_t n, size_t off, enum dos_dtype gt, enum dos_dtype wt,
		       int with_weight)
{
	struct buffers b;
	make_buffers(&b, n, off, gt, wt, 0x9e3779b97f4a7c15ULL ^ (n * 131 + off * 7 + (size_t)gt * 3 + (size_t)wt));
	for (size_t h = 0; h < sizeof hparam_sets / sizeof hparam_sets[0]; h++)
		for (uint64_t t = 1; t <= 2; t++) {
			struct dos_adam_step s;
			CHECK(dos_adam_step_init(&s, &hparam_sets[h], t + 10 * h, h == 1 ? 1.0 / 1024 : 1.0) == 0, "%s",
			      dos_last_error());
			uint32_t nonfinite0 = _dos_cpu_kernels_scalar.adam(&s, b.p[0], b.m[0], b.v[0], b.g[0], gt,
									   with_weight ? b.w[0] : NULL, wt, n);
			uint32_t nonfinite1 =
				k->adam(&s, b.p[1], b.m[1], b.v[1], b.g[1], gt, with_weight ? b.w[1] : NULL, wt, n);
			char ctx[160];
			snprintf(ctx, sizeof ctx, "adam %s n=%zu offset=%zu grad=%s weight=%s hparams=%zu step=%llu",
				 dos_cpu_isa_name(k->isa), n, off, dos_dtype_name(gt),
				 with_weight ? dos_dtype_name(wt) : "none", h, (unsigned long long)t);
			compare_f32("master", b.p[0], b.p[1], n, ctx);
			compare_f32("m", b.m[0], b.m[1], n, ctx);
			compare_f32("v", b.v[0], b.v[1], n, ctx);
			if (with_weight)
				compare_elems("weight16", b.w[0], b.w[1], wt, n, ctx);
			CHECK(nonfinite0 == nonfinite1, "%s: non-finite bits %#x, scalar %#x", ctx, nonfinite1,
			      nonfinite0);
		}
	free_buffers(&b);
}

/* The update's non-finite bits name exactly the arrays that hold an inf or NaN after it:
 * none for finite input, then one bad value planted in the vector body or in the tail. */
static void check_adam_nonfinite(const struct _dos_cpu_kernels *k)
{
	enum { N = 1000 + 13 }; /* a tail for every vector width */
	struct dos_adam_hparams hp = {DOS_ADAMW, 1e-3, 0.9, 0.999, 1e-8, 0.01};
	struct dos_adam_step s;
	CHECK(dos_adam_step_init(&s, &hp, 3, 1.0) == 0, "%s", dos_last_error());
	float *p = test_malloc(N * 4), *m = test_malloc(N * 4), *v = test_malloc(N * 4), *g = test_malloc(N * 4);
	/* what one planted value leaves non-finite: inf in p stays inf in p alone; inf in v
	 * makes the denominator inf and p's step 0, so v alone; NaN in m reaches p too */
	const struct {
		int array; /* 0 p, 1 m, 2 v, 3 g */
		float value;
		uint32_t expected;
	} cases[] = {
		{0, INFINITY, DOS_NONFINITE_MASTER},
		{2, INFINITY, DOS_NONFINITE_V},
		{1, NAN, DOS_NONFINITE_MASTER | DOS_NONFINITE_M},
		{3, NAN, DOS_NONFINITE_MASTER | DOS_NONFINITE_M | DOS_NONFINITE_V},
	};
	const size_t at[] = {0, 517, N - 1};
	for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
		for (size_t a = 0; a < sizeof at / sizeof at[0]; a++) {
			uint64_t rng = 42;
			for (size_t i = 0; i < N; i++) {
				p[i] = (float)test_normal(&rng);
				m[i] = (float)test_normal(&rng) * 1e-2f;
				v[i] = (float)test_uniform(&rng) * 1e-4f;
				g[i] = (float)test_normal(&rng);
			}
			float *arrays[] = {p, m, v, g};
			uint32_t clean = k->adam(&s, p, m, v, g, DOS_FP32, NULL, DOS_FP16, N);
			CHECK(clean == 0, "%s: finite state and gradients flagged %#x", dos_cpu_isa_name(k->isa),
			      clean);
			arrays[cases[c].array][at[a]] = cases[c].value;
			uint32_t got = k->adam(&s, p, m, v, g, DOS_FP32, NULL, DOS_FP16, N);
			CHECK(got == cases[c].expected, "%s: %g planted in array %d at %zu: bits %#x, expected %#x",
			      dos_cpu_isa_name(k->isa), (double)cases[c].value, cases[c].array, at[a], got,
			      cases[c].expected);
		}
	free(p), free(m), free(v), free(g);
}

static void check_companions(const struct _dos_cpu_kernels *k, size_t n, size_t off, enum dos_dtype t)
{
	struct buffers b;
	make_buffers(&b, n, off, t, t == DOS_FP32 ? DOS_FP16 : t, 0x1234567ULL + n * 17 + off + (size_t)t);
	char ctx[128];
	snprintf(ctx, sizeof ctx, "%s n=%zu offset=%zu dtype=%s", dos_cpu_isa_name(k->isa), n, off, dos_dtype_name(t));

	if (t != DOS_FP32) {
		_dos_cpu_kernels_scalar.cast(b.p[0], b.w[0], t, n);
		k->cast(b.p[1], b.w[1], t, n);
		compare_elems("cast", b.w[0], b.w[1], t, n, ctx);
	}

	struct dos_grad_stats s0, s1;
	_dos_cpu_kernels_scalar.grad_stats(b.g[0], t, n, &s0);
	k->grad_stats(b.g[1], t, n, &s1);
	CHECK(memcmp(&s0.sum_sq, &s1.sum_sq, sizeof(double)) == 0 || (isnan(s0.sum_sq) && isnan(s1.sum_sq)),
	      "%s: grad_stats sum %a vs %a", ctx, s0.sum_sq, s1.sum_sq);
	CHECK(s0.nonfinite == s1.nonfinite, "%s: grad_stats nonfinite %u vs %u", ctx, s0.nonfinite, s1.nonfinite);

	static const float factors[] = {0.37f, 1.0f / 1024, 3e4f, 0.0f};
	for (int f = 0; f < 4; f++) {
		_dos_cpu_kernels_scalar.grad_scale(b.g[0], t, n, factors[f]);
		k->grad_scale(b.g[1], t, n, factors[f]);
		compare_elems("grad_scale", b.g[0], b.g[1], t, n, ctx);
	}
	/* factor 0 clears, whatever the gradient held (nan included) */
	for (size_t i = 0; i < n; i++)
		CHECK(dos_float_bits(dos_load_elem(b.g[1], i, t)) == 0, "%s: grad_scale(0) left %a at %zu", ctx,
		      (double)dos_load_elem(b.g[1], i, t), i);
	free_buffers(&b);
}

/* Finite gradients: the sum of squares is finite and nonfinite is 0; one inf flips it. */
static void check_stats_flag(const struct _dos_cpu_kernels *k)
{
	size_t n = 70001;
	uint16_t *g = test_malloc(n * 2);
	for (size_t i = 0; i < n; i++)
		g[i] = dos_float_to_fp16((float)((double)(i % 97) - 48.0));
	struct dos_grad_stats s;
	k->grad_stats(g, DOS_FP16, n, &s);
	CHECK(!s.nonfinite && isfinite(s.sum_sq) && s.sum_sq > 0, "%s: finite gradient flagged",
	      dos_cpu_isa_name(k->isa));
	g[n - 1] = 0x7c00; /* +inf in the partial last row */
	k->grad_stats(g, DOS_FP16, n, &s);
	CHECK(s.nonfinite, "%s: inf in the last element not flagged", dos_cpu_isa_name(k->isa));
	free(g);
}

int main(void)
{
	const struct _dos_cpu_kernels *variants[] = {&_dos_cpu_kernels_scalar, NULL, NULL};
	int nvariants = 1;
	if (dos_cpu_isa_supported(DOS_CPU_ISA_AVX2))
		variants[nvariants++] = &_dos_cpu_kernels_avx2;
	if (dos_cpu_isa_supported(DOS_CPU_ISA_AVX512))
		variants[nvariants++] = &_dos_cpu_kernels_avx512;
	if (nvariants == 1)
		printf("this CPU has no SIMD variant: checking the scalar reference against itself only\n");

	for (int k = 0; k < nvariants; k++) {
		check_stats_flag(variants[k]);
		check_adam_nonfinite(variants[k]);
		if (variants[k] == &_dos_cpu_kernels_scalar)
			continue;
		for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
			for (size_t oi = 0; oi < sizeof offsets / sizeof offsets[0]; oi++) {
				size_t n = sizes[si], off = offsets[oi];
				if (n > 100000 && off != 1)
					continue; /* the large size once, unaligned: it costs most of the time */
				for (int gt = DOS_FP32; gt <= DOS_BF16; gt++) {
					check_companions(variants[k], n, off, (enum dos_dtype)gt);
					check_adam(variants[k], n, off, (enum dos_dtype)gt, DOS_FP16, 0);
					for (int wt = DOS_FP16; wt <= DOS_BF16; wt++)
						check_adam(variants[k], n, off, (enum dos_dtype)gt, (enum dos_dtype)wt,
							   1);
				}
			}
		printf("%s == scalar on every output: %zu sizes x %zu offsets x 3 grad dtypes x 3 weight kinds\n",
		       dos_cpu_isa_name(variants[k]->isa), sizeof sizes / sizeof sizes[0],
		       sizeof offsets / sizeof offsets[0]);
	}
	return 0;
}
