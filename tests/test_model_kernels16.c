/* The 16-bit (bf16 and fp16) CPU kernels of the example model against the fp32 kernels run
 * on the same inputs: random values rounded to the 16-bit dtype first, handed to the 16-bit
 * kernel as 16-bit arrays and to the fp32 kernel widened (exactly), so both see the same
 * numbers. With u the unit roundoff of the dtype (2^-8 for bf16, 2^-11 for fp16):
 *  - kernels that compute every output element in float and round it once (embedding,
 *    RMSNorm, GELU, cross-entropy) must give exactly the fp32 kernel's result rounded to
 *    nearest even, and their fp32 outputs (rstd, losses, the norm and embedding weight
 *    gradients) exactly the fp32 kernel's bits: the same float operations in the same order;
 *  - products (linear layers) widen their operands and accumulate in fp32, so they differ
 *    from the fp32 kernel by the summation order and the final rounding only: per element
 *    |got - ref| <= u |ref| + 2 gamma_K sum_k |a_k b_k| (gamma_K = K 2^-24 bounds the error
 *    of one fp32 sum of K products in any order; two sums differ by at most twice that),
 *    without the u term for the fp32 weight gradients;
 *  - attention rounds the probabilities (forward) and dS (backward) to 16 bits, as a GPU's
 *    16-bit products need, then the products' outputs: per element |got - ref| <= 2u (|ref|
 *    + sum over the rounded operand of |rounded| |other operand|), one rounding of the
 *    output and one of each rounded operand element, the factor 2 covering the fp32
 *    reordering (2 T 2^-24 < 1e-5, far below u) and second-order terms. dS's magnitudes
 *    come from a double-precision reference.
 * fp16 subnormals round with an absolute error of at most 2^-25: every fp16 bound also
 * allows 2^-24 times (1 + the sum it uses). Unknown dtypes are refused by the graph builder
 * and the codelets (test_bad_arguments_graph). */
#include "model_kernels.h"
#include "numerics.h"
#include "test_util.h"

static uint64_t rng = 0x16b175eedULL;

/* Values of `dtype`, in 16 bits and widened. */
struct rounded {
	uint16_t *h;
	float *f;
	size_t n;
};

static struct rounded rounded_random(size_t n, double mean, double std, enum dos_dtype dtype)
{
	struct rounded r = {test_malloc(n * 2), test_malloc(n * sizeof(float)), n};
	for (size_t i = 0; i < n; i++) {
		dos_store_elem(r.h, i, dtype, (float)(mean + std * test_normal(&rng)));
		r.f[i] = dos_load_elem(r.h, i, dtype);
	}
	return r;
}

static void rounded_free(struct rounded *r)
{
	free(r->h);
	free(r->f);
}

static int32_t *random_ids(size_t count, size_t bound)
{
	int32_t *p = test_malloc(count * sizeof(int32_t));
	for (size_t i = 0; i < count; i++)
		p[i] = (int32_t)(test_rand(&rng) % bound);
	return p;
}

/* An output array of 16-bit NaNs (an element the kernel forgets stays NaN). */
static uint16_t *nan16(size_t n, enum dos_dtype dtype)
{
	uint16_t *p = test_malloc(n * 2);
	for (size_t i = 0; i < n; i++)
		dos_store_elem(p, i, dtype, NAN);
	return p;
}

static double unit_roundoff(enum dos_dtype dtype)
{
	return dtype == DOS_BF16 ? 0x1p-8 : 0x1p-11;
}

/* Slack for fp16 subnormals, for a bound built on sums of magnitude `sum`. */
static double subnormal_slack(enum dos_dtype dtype, double sum)
{
	return dtype == DOS_FP16 ? 0x1p-24 * (1.0 + sum) : 0.0;
}

/* got (16-bit) must be ref (fp32) rounded once to nearest even, bit for bit. */
static void check_rounded(const char *what, enum dos_dtype dtype, const uint16_t *got, const float *ref, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		uint16_t want = dtype == DOS_BF16 ? dos_float_to_bf16(ref[i]) : dos_float_to_fp16(ref[i]);
		CHECK(got[i] == want, "%s %s[%zu]: 0x%04x (%.9g), expected 0x%04x, fp32 %.9g rounded",
		      dos_dtype_name(dtype), what, i, got[i], (double)dos_load_elem(got, i, dtype), want,
		      (double)ref[i]);
	}
}

static void check_same_floats(const char *what, enum dos_dtype dtype, const float *got, const float *ref, size_t n)
{
	long i = test_first_difference(got, ref, n, sizeof(float));
	CHECK(i < 0, "%s %s[%ld]: %.9g, the fp32 kernel gives %.9g", dos_dtype_name(dtype), what, i,
	      (double)got[i < 0 ? 0 : i], (double)ref[i < 0 ? 0 : i]);
}

/* |got[i] - ref[i]| <= bound[i] for every i; got is 16-bit (dtype) or, for DOS_FP32, float. */
static void check_bounded(const char *what, enum dos_dtype dtype, const void *got, enum dos_dtype got_dtype,
			  const float *ref, const double *bound, size_t n)
{
	double worst = 0;
	for (size_t i = 0; i < n; i++) {
		double g = dos_load_elem(got, i, got_dtype), e = fabs(g - (double)ref[i]);
		CHECK(isfinite(g) && e <= bound[i],
		      "%s %s[%zu]: %.9g, fp32 kernel %.9g: error %.3g above its bound %.3g", dos_dtype_name(dtype),
		      what, i, g, (double)ref[i], e, bound[i]);
		if (bound[i] > 0 && e / bound[i] > worst)
			worst = e / bound[i];
	}
	printf("  %s %s: worst error %.2f of its bound\n", dos_dtype_name(dtype), what, worst);
}

/* ---- kernels that round each output once --------------------------------------------- */

static void test_elementwise(enum dos_dtype dt)
{
	enum { B = 2, T = 5, N = B * T, D = 24, V = 19, F = 40 };
	/* embedding */
	int32_t *ids = random_ids(N, V);
	ids[3] = ids[1];
	struct rounded tok = rounded_random(V * D, 0, 1, dt), pos = rounded_random(T * D, 0, 1, dt);
	uint16_t *x16 = nan16(N * D, dt);
	float *x32 = test_nan_floats(N * D);
	_dos_embed_fwd_cpu(ids, tok.h, pos.h, x16, N, T, D, dt);
	_dos_embed_fwd_cpu(ids, tok.f, pos.f, x32, N, T, D, DOS_FP32);
	check_rounded("embed_fwd x", dt, x16, x32, N * D);
	struct rounded g = rounded_random(N * D, 0, 1, dt);
	for (int acc = 0; acc <= 1; acc++) {
		float *dtok16 = test_nan_floats(V * D), *dpos16 = test_nan_floats(T * D),
		      *dtok32 = test_nan_floats(V * D), *dpos32 = test_nan_floats(T * D);
		if (acc)
			for (size_t i = 0; i < V * D; i++)
				dtok16[i] = dtok32[i] = (float)i / 64, dpos16[i % (T * D)] = dpos32[i % (T * D)] = 0.5f;
		_dos_embed_bwd_cpu(ids, g.h, dtok16, dpos16, N, T, D, V, acc, dt);
		_dos_embed_bwd_cpu(ids, g.f, dtok32, dpos32, N, T, D, V, acc, DOS_FP32);
		check_same_floats(acc ? "embed_bwd accumulated dtok" : "embed_bwd dtok", dt, dtok16, dtok32, V * D);
		check_same_floats(acc ? "embed_bwd accumulated dpos" : "embed_bwd dpos", dt, dpos16, dpos32, T * D);
		free(dtok16), free(dpos16), free(dtok32), free(dpos32);
	}

	/* RMSNorm */
	struct rounded x = rounded_random(N * D, 0.3, 2, dt), w = rounded_random(D, 1, 0.2, dt);
	uint16_t *y16 = nan16(N * D, dt);
	float *y32 = test_nan_floats(N * D), *r16 = test_nan_floats(N), *r32 = test_nan_floats(N);
	_dos_rmsnorm_fwd_cpu(x.h, w.h, y16, r16, N, D, dt);
	_dos_rmsnorm_fwd_cpu(x.f, w.f, y32, r32, N, D, DOS_FP32);
	check_rounded("rmsnorm_fwd y", dt, y16, y32, N * D);
	check_same_floats("rmsnorm_fwd rstd", dt, r16, r32, N);
	for (int acc = 0; acc <= 1; acc++) {
		struct rounded prior = rounded_random(N * D, 0, 1, dt);
		float *dx32 = acc ? prior.f : test_nan_floats(N * D), *dw16 = test_nan_floats(D),
		      *dw32 = test_nan_floats(D);
		uint16_t *dx16 = acc ? prior.h : nan16(N * D, dt);
		_dos_rmsnorm_bwd_cpu(x.h, w.h, r16, g.h, dx16, dw16, N, D, acc, 0, dt);
		_dos_rmsnorm_bwd_cpu(x.f, w.f, r32, g.f, dx32, dw32, N, D, acc, 0, DOS_FP32);
		check_rounded(acc ? "rmsnorm_bwd accumulated dx" : "rmsnorm_bwd dx", dt, dx16, dx32, N * D);
		check_same_floats("rmsnorm_bwd dw", dt, dw16, dw32, D);
		if (!acc)
			free(dx16), free(dx32);
		free(dw16), free(dw32);
		rounded_free(&prior);
	}

	/* GELU, over the range where it bends */
	struct rounded u = rounded_random(N * F, 0, 3, dt), du = rounded_random(N * F, 0, 1, dt);
	uint16_t *a16 = nan16(N * F, dt), *da16 = nan16(N * F, dt);
	float *a32 = test_nan_floats(N * F), *da32 = test_nan_floats(N * F);
	_dos_gelu_fwd_cpu(u.h, a16, N * F, dt);
	_dos_gelu_fwd_cpu(u.f, a32, N * F, DOS_FP32);
	check_rounded("gelu_fwd", dt, a16, a32, N * F);
	_dos_gelu_bwd_cpu(u.h, du.h, da16, N * F, dt);
	_dos_gelu_bwd_cpu(u.f, du.f, da32, N * F, DOS_FP32);
	check_rounded("gelu_bwd", dt, da16, da32, N * F);

	/* cross-entropy: the loss in fp32 from the widened logits, dlogits rounded once */
	struct rounded logits = rounded_random(N * V, 0, 3, dt);
	int32_t *targets = random_ids(N, V);
	float *l16 = test_nan_floats(N), *l32 = test_nan_floats(N), *dl32 = test_nan_floats(N * V);
	uint16_t *dl16 = nan16(N * V, dt);
	_dos_xent_cpu(logits.h, targets, l16, dl16, N, V, 0.125f, dt);
	_dos_xent_cpu(logits.f, targets, l32, dl32, N, V, 0.125f, DOS_FP32);
	check_same_floats("xent loss", dt, l16, l32, N);
	check_rounded("xent dlogits", dt, dl16, dl32, N * V);
	printf("%s: embedding, RMSNorm, GELU, cross-entropy: the fp32 kernels' results rounded once, fp32 outputs "
	       "bit for bit\n",
	       dos_dtype_name(dt));

	free(ids), free(x16), free(x32), free(y16), free(y32), free(r16), free(r32), free(a16), free(da16), free(a32);
	free(da32), free(targets), free(l16), free(l32), free(dl32), free(dl16);
	struct rounded *all[] = {&tok, &pos, &g, &x, &w, &u, &du, &logits};
	for (size_t i = 0; i < sizeof all / sizeof *all; i++)
		rounded_free(all[i]);
}

/* ---- products ------------------------------------------------------------------------ */

/* Bound of C[M, N] = A[M, K] B[K, N] (+ prior when accumulating; row-major, element (i, k)
 * of A at A[i * sa_i + k * sa_k], likewise B) computed two ways: u |ref| (when C is 16-bit)
 * + 2 gamma_{K+1} (|prior| + sum_k |a b|). */
static double *product_bound(const float *ref, const float *A, size_t sa_i, size_t sa_k, const float *B, size_t sb_k,
			     size_t sb_j, const float *prior, size_t M, size_t N, size_t K, double u, enum dos_dtype dt)
{
	double *bound = test_malloc(M * N * sizeof(double)), gamma = (double)(K + 1) * 0x1p-24;
	for (size_t i = 0; i < M; i++)
		for (size_t j = 0; j < N; j++) {
			double sum = prior ? fabs(prior[i * N + j]) : 0;
			for (size_t k = 0; k < K; k++)
				sum += fabs((double)A[i * sa_i + k * sa_k] * B[k * sb_k + j * sb_j]);
			bound[i * N + j] = u * fabs(ref[i * N + j]) + 2 * gamma * sum + subnormal_slack(dt, sum);
		}
	return bound;
}

static void test_linear(enum dos_dtype dt)
{
	enum { N = 13, IN = 67, OUT = 9 }; /* odd sizes, a long inner dimension */
	const double u = unit_roundoff(dt);
	struct rounded x = rounded_random(N * IN, 0, 1, dt), w = rounded_random(OUT * IN, 0, 0.3, dt);
	struct rounded res = rounded_random(N * OUT, 0, 1, dt), dy = rounded_random(N * OUT, 0, 1, dt);
	for (int with_res = 0; with_res <= 1; with_res++) {
		uint16_t *y16 = nan16(N * OUT, dt);
		float *y32 = test_nan_floats(N * OUT);
		_dos_linear_fwd_cpu(x.h, w.h, with_res ? res.h : NULL, y16, N, IN, OUT, dt);
		_dos_linear_fwd_cpu(x.f, w.f, with_res ? res.f : NULL, y32, N, IN, OUT, DOS_FP32);
		/* y[i, o] = sum_k x[i, k] w[o, k] */
		double *b = product_bound(y32, x.f, IN, 1, w.f, 1, IN, with_res ? res.f : NULL, N, OUT, IN, u, dt);
		check_bounded(with_res ? "linear_fwd y with residual" : "linear_fwd y", dt, y16, dt, y32, b, N * OUT);
		free(y16), free(y32), free(b);
	}
	for (int acc = 0; acc <= 1; acc++) {
		struct rounded prior_dx = rounded_random(N * IN, 0, 1, dt);
		uint16_t *dx16 = acc ? prior_dx.h : nan16(N * IN, dt);
		float *dx32 = acc ? prior_dx.f : test_nan_floats(N * IN), *prior_copy = NULL;
		if (acc) {
			prior_copy = test_malloc(N * IN * sizeof(float));
			memcpy(prior_copy, prior_dx.f, N * IN * sizeof(float));
		}
		_dos_linear_bwd_data_cpu(dy.h, w.h, dx16, N, IN, OUT, acc, dt);
		_dos_linear_bwd_data_cpu(dy.f, w.f, dx32, N, IN, OUT, acc, DOS_FP32);
		/* dx[i, k] = sum_o dy[i, o] w[o, k] */
		double *b = product_bound(dx32, dy.f, OUT, 1, w.f, IN, 1, prior_copy, N, IN, OUT, u, dt);
		check_bounded(acc ? "linear_bwd_data accumulated dx" : "linear_bwd_data dx", dt, dx16, dt, dx32, b,
			      N * IN);
		free(b), free(prior_copy);
		if (!acc)
			free(dx16), free(dx32);
		rounded_free(&prior_dx);

		/* the weight gradient stays fp32: no rounding term, only the order of the sums */
		float *dw16 = test_nan_floats(OUT * IN), *dw32 = test_nan_floats(OUT * IN), *prior_dw = NULL;
		if (acc) {
			prior_dw = test_malloc(OUT * IN * sizeof(float));
			for (size_t i = 0; i < OUT * IN; i++)
				prior_dw[i] = dw16[i] = dw32[i] = (float)test_normal(&rng);
		}
		_dos_linear_bwd_weight_cpu(dy.h, x.h, dw16, N, IN, OUT, acc, dt);
		_dos_linear_bwd_weight_cpu(dy.f, x.f, dw32, N, IN, OUT, acc, DOS_FP32);
		/* dw[o, k] = sum_i dy[i, o] x[i, k] */
		b = product_bound(dw32, dy.f, 1, OUT, x.f, IN, 1, prior_dw, OUT, IN, N, 0, DOS_FP32);
		check_bounded(acc ? "linear_bwd_weight accumulated dw (fp32)" : "linear_bwd_weight dw (fp32)", dt, dw16,
			      DOS_FP32, dw32, b, OUT * IN);
		free(b), free(dw16), free(dw32), free(prior_dw);
	}
	printf("%s: linear layers within one rounding plus the fp32 reordering bound\n", dos_dtype_name(dt));
	rounded_free(&x), rounded_free(&w), rounded_free(&res), rounded_free(&dy);
}

/* ---- attention ------------------------------------------------------------------------- */

static void test_attention(enum dos_dtype dt, size_t B, size_t T, size_t H, size_t hd)
{
	const size_t d = H * hd, ld = 3 * d, n = B * T, np = B * H * T * T;
	const double u = unit_roundoff(dt), scale = 1.0 / sqrt((double)hd);
	struct rounded qkv = rounded_random(n * ld, 0, 1, dt), dout = rounded_random(n * d, 0, 1, dt);
	uint16_t *out16 = nan16(n * d, dt), *p16 = nan16(np, dt), *dqkv16 = nan16(n * ld, dt);
	float *out32 = test_nan_floats(n * d), *p32 = test_nan_floats(np), *dqkv32 = test_nan_floats(n * ld),
	      *pw = test_nan_floats(np);
	double *bound = test_malloc((n * ld > np ? n * ld : np) * sizeof(double));

	_dos_attention_fwd_cpu(qkv.h, out16, p16, B, T, H, hd, dt);
	_dos_attention_fwd_cpu(qkv.f, out32, p32, B, T, H, hd, DOS_FP32);
	for (size_t i = 0; i < np; i++) {
		pw[i] = dos_load_elem(p16, i, dt);
		bound[i] = 2 * u * p32[i] + subnormal_slack(dt, 0);
	}
	check_bounded("attention_fwd probs", dt, p16, dt, p32, bound, np);
	/* out[b, i, h, c] = sum_j P[b, h, i, j] v[b, j, h, c]: P rounded, then out */
	for (size_t b = 0; b < B; b++)
		for (size_t h = 0; h < H; h++)
			for (size_t i = 0; i < T; i++)
				for (size_t c = 0; c < hd; c++) {
					double sum = 0;
					for (size_t j = 0; j < T; j++)
						sum += pw[((b * H + h) * T + i) * T + j] *
						       fabs(qkv.f[(b * T + j) * ld + 2 * d + h * hd + c]);
					size_t o = (b * T + i) * d + h * hd + c;
					bound[o] = 2 * u * (fabs(out32[o]) + sum) + subnormal_slack(dt, sum);
				}
	check_bounded("attention_fwd out", dt, out16, dt, out32, bound, n * d);

	/* backward from the same (rounded) probabilities */
	_dos_attention_bwd_cpu(qkv.h, p16, dout.h, dqkv16, B, T, H, hd, dt);
	_dos_attention_bwd_cpu(qkv.f, pw, dout.f, dqkv32, B, T, H, hd, DOS_FP32);
	double *ds = test_malloc(T * T * sizeof(double));
	for (size_t b = 0; b < B; b++)
		for (size_t h = 0; h < H; h++) {
			const float *P = pw + (b * H + h) * T * T;
			/* |dS| in double: dP = dO v^T, dS = P (dP - rowsum(P dP)) */
			for (size_t i = 0; i < T; i++) {
				double dot = 0;
				for (size_t j = 0; j < T; j++) {
					double dp = 0;
					for (size_t c = 0; c < hd; c++)
						dp += (double)dout.f[(b * T + i) * d + h * hd + c] *
						      qkv.f[(b * T + j) * ld + 2 * d + h * hd + c];
					ds[i * T + j] = dp;
					dot += j <= i ? P[i * T + j] * dp : 0;
				}
				for (size_t j = 0; j < T; j++)
					ds[i * T + j] = j <= i ? fabs(P[i * T + j] * (ds[i * T + j] - dot)) : 0;
			}
			for (size_t t = 0; t < T; t++)
				for (size_t c = 0; c < hd; c++) {
					const size_t row = (b * T + t) * ld + h * hd + c;
					double sq = 0, sk = 0, sv = 0;
					for (size_t j = 0; j < T; j++) {
						/* dq[t] = scale sum_j dS[t, j] k[j]; dk[t] = scale sum_i dS[i, t] q[i];
						 * dv[t] = sum_i P[i, t] dO[i] */
						sq += ds[t * T + j] * fabs(qkv.f[(b * T + j) * ld + d + h * hd + c]);
						sk += ds[j * T + t] * fabs(qkv.f[(b * T + j) * ld + h * hd + c]);
						sv += P[j * T + t] * fabs(dout.f[(b * T + j) * d + h * hd + c]);
					}
					sq *= scale, sk *= scale;
					bound[row] = 2 * u * (fabs(dqkv32[row]) + sq) + subnormal_slack(dt, sq);
					bound[row + d] = 2 * u * (fabs(dqkv32[row + d]) + sk) + subnormal_slack(dt, sk);
					bound[row + 2 * d] =
						2 * u * (fabs(dqkv32[row + 2 * d]) + sv) + subnormal_slack(dt, sv);
				}
		}
	check_bounded("attention_bwd dqkv", dt, dqkv16, dt, dqkv32, bound, n * ld);
	printf("%s: attention B %zu T %zu H %zu hd %zu within its rounding bounds\n", dos_dtype_name(dt), B, T, H, hd);
	free(out16), free(p16), free(dqkv16), free(out32), free(p32), free(dqkv32), free(pw), free(bound), free(ds);
	rounded_free(&qkv), rounded_free(&dout);
}

int main(void)
{
	const enum dos_dtype dtypes[] = {DOS_BF16, DOS_FP16};
	for (int i = 0; i < 2; i++) {
		test_elementwise(dtypes[i]);
		test_linear(dtypes[i]);
		test_attention(dtypes[i], 2, 5, 2, 3);
		test_attention(dtypes[i], 2, 37, 2, 8);
	}
	printf("16-bit model kernels: all checks passed\n");
	return 0;
}
