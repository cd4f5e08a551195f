/* The CPU kernels of the example model (codelets/model_kernels.h) against double-precision
 * references written here as naive loops:
 *  - every forward kernel matches its reference (relative error ~1e-5 of the largest value);
 *  - every backward kernel matches central finite differences, in double, of the reference
 *    forward under the objective L = sum(R .* output) for a fixed random R (for the
 *    cross-entropy, L = grad_scale * sum(loss)); with accumulate = 0 the prior content
 *    (NaN here) is ignored, with accumulate = 1 the gradient is added to it;
 *  - the attention probabilities are 0 above the diagonal and their rows sum to 1;
 *  - each codelet of codelets/model_codelets.h, run by StarPU on a CPU worker, gives the
 *    bits of a direct call of its kernel, with its arguments given as STARPU_CL_ARGS (the
 *    graph builder's way, model_codelets.h).
 * Sizes are small and odd (T = 5, d = 6, H = 2, hd = 3, V = 11) plus a larger attention. */
#include <errno.h>
#include <starpu.h>

#include "model_codelets.h"
#include "model_kernels.h"
#include "test_starpu.h"
#include "test_util.h"

/* The shapes of most checks: n = NB * NT tokens of width DM = NH * HD, linear DM -> NF. */
enum { NB = 2, NT = 5, NH = 2, HD = 3, DM = NH * HD, NTOK = NB * NT, NV = 11, NF = 7 };

#define FWD_TOL 1e-5  /* forward: max error / max |reference| */
#define GRAD_TOL 3e-4 /* backward: max error / max |finite-difference gradient| */
#define ACC_TOL 1e-6  /* accumulate = 1 against prior + the accumulate = 0 result */

static uint64_t rng = 0x5eed0f7e57ULL;

/* ---- helpers --------------------------------------------------------------------------- */

static float *random_floats(size_t count, double mean, double std)
{
	float *p = test_malloc(count * sizeof(float));
	for (size_t i = 0; i < count; i++)
		p[i] = (float)(mean + std * test_normal(&rng));
	return p;
}

static int32_t *random_ids(size_t count, size_t bound)
{
	int32_t *p = test_malloc(count * sizeof(int32_t));
	for (size_t i = 0; i < count; i++)
		p[i] = (int32_t)(test_rand(&rng) % bound);
	return p;
}

static double *to_double(const float *f, size_t count)
{
	double *p = test_malloc(count * sizeof(double));
	for (size_t i = 0; i < count; i++)
		p[i] = f[i];
	return p;
}

static float *copy_floats(const float *f, size_t count)
{
	float *p = test_malloc(count * sizeof(float));
	memcpy(p, f, count * sizeof(float));
	return p;
}

/* Fails unless max |got - ref| <= tol * max |ref| and every value is finite. */
static void check_close(const char *what, const float *got, const double *ref, size_t count, double tol)
{
	double max_ref = 0.0, max_err = 0.0;
	size_t worst = 0;
	for (size_t i = 0; i < count; i++) {
		CHECK(isfinite(got[i]), "%s[%zu] = %g is not finite", what, i, (double)got[i]);
		double e = fabs((double)got[i] - ref[i]);
		if (fabs(ref[i]) > max_ref)
			max_ref = fabs(ref[i]);
		if (e > max_err) {
			max_err = e;
			worst = i;
		}
	}
	double scale = max_ref > 1e-30 ? max_ref : 1e-30;
	CHECK(max_err <= tol * scale,
	      "%s: error %.3g at [%zu] (got %.9g, expected %.9g) is %.3g of max |expected| %.3g", what, max_err, worst,
	      (double)got[worst], ref[worst], max_err / scale, max_ref);
}

static void check_bitwise(const char *what, const float *got, const float *want, size_t count)
{
	long i = test_first_difference(got, want, count, sizeof(float));
	CHECK(i < 0, "%s: differs at [%ld]: %.9g, expected %.9g", what, i, (double)got[i < 0 ? 0 : i],
	      (double)want[i < 0 ? 0 : i]);
}

/* accumulate = 1 must give prior + fresh (fresh: the accumulate = 0 result); products may
 * round their partial sums into the output, hence a tolerance instead of bits. */
static void check_accumulated(const char *what, const float *got, const float *prior, const float *fresh, size_t count)
{
	double *want = test_malloc(count * sizeof(double));
	for (size_t i = 0; i < count; i++)
		want[i] = (double)prior[i] + (double)fresh[i];
	check_close(what, got, want, count, ACC_TOL);
	free(want);
}

static double dot(const double *a, const double *b, size_t count)
{
	double s = 0.0;
	for (size_t i = 0; i < count; i++)
		s += a[i] * b[i];
	return s;
}

/* ---- double-precision references --------------------------------------------------------- */

static void ref_embed(const int32_t *ids, const double *tok, const double *pos, double *x, size_t n, size_t T, size_t d)
{
	for (size_t i = 0; i < n; i++)
		for (size_t j = 0; j < d; j++)
			x[i * d + j] = tok[(size_t)ids[i] * d + j] + pos[(i % T) * d + j];
}

static void ref_rmsnorm(const double *x, const double *w, double *y, double *rstd, size_t n, size_t d)
{
	for (size_t i = 0; i < n; i++) {
		double ss = 0.0;
		for (size_t j = 0; j < d; j++)
			ss += x[i * d + j] * x[i * d + j];
		double r = 1.0 / sqrt(ss / (double)d + (double)DOS_RMSNORM_EPS);
		if (rstd)
			rstd[i] = r;
		for (size_t j = 0; j < d; j++)
			y[i * d + j] = x[i * d + j] * r * w[j];
	}
}

static void ref_linear(const double *x, const double *w, const double *residual, double *y, size_t n, size_t in,
		       size_t out)
{
	for (size_t i = 0; i < n; i++)
		for (size_t o = 0; o < out; o++) {
			double s = residual ? residual[i * out + o] : 0.0;
			for (size_t k = 0; k < in; k++)
				s += x[i * in + k] * w[o * in + k];
			y[i * out + o] = s;
		}
}

static void ref_attention(const double *qkv, double *out, double *probs, size_t B, size_t T, size_t H, size_t hd)
{
	size_t d = H * hd, ld = 3 * d;
	double *s = test_malloc(T * sizeof(double));
	for (size_t b = 0; b < B; b++)
		for (size_t h = 0; h < H; h++)
			for (size_t i = 0; i < T; i++) {
				const double *q = qkv + (b * T + i) * ld + h * hd;
				double m = -INFINITY, sum = 0.0;
				for (size_t j = 0; j <= i; j++) {
					const double *k = qkv + (b * T + j) * ld + d + h * hd;
					double acc = 0.0;
					for (size_t c = 0; c < hd; c++)
						acc += q[c] * k[c];
					s[j] = acc / sqrt((double)hd);
					if (s[j] > m)
						m = s[j];
				}
				for (size_t j = 0; j <= i; j++) {
					s[j] = exp(s[j] - m);
					sum += s[j];
				}
				double *o = out + (b * T + i) * d + h * hd;
				for (size_t c = 0; c < hd; c++)
					o[c] = 0.0;
				for (size_t j = 0; j < T; j++) {
					double p = j <= i ? s[j] / sum : 0.0;
					if (probs)
						probs[((b * H + h) * T + i) * T + j] = p;
					if (j <= i)
						for (size_t c = 0; c < hd; c++)
							o[c] += p * qkv[(b * T + j) * ld + 2 * d + h * hd + c];
				}
			}
	free(s);
}

static void ref_gelu(const double *x, double *y, size_t count)
{
	for (size_t i = 0; i < count; i++)
		y[i] = 0.5 * x[i] * (1.0 + erf(x[i] / sqrt(2.0)));
}

static void ref_xent(const double *logits, const int32_t *targets, double *loss, size_t n, size_t V)
{
	for (size_t i = 0; i < n; i++) {
		const double *l = logits + i * V;
		double m = -INFINITY, sum = 0.0;
		for (size_t j = 0; j < V; j++)
			m = l[j] > m ? l[j] : m;
		for (size_t j = 0; j < V; j++)
			sum += exp(l[j] - m);
		loss[i] = m + log(sum) - l[targets[i]];
	}
}

/* ---- finite differences ------------------------------------------------------------------ */

/* Everything an objective needs: its inputs (one of which is perturbed), the integer
 * inputs, the weights R of the outputs and a scratch output. Sizes are in the fields the
 * objective uses. */
struct problem {
	double *in0, *in1;
	const int32_t *ids;
	const double *R;
	double *out, *aux;
	size_t n, T, d, out_features, B, H, hd, V, count;
	double scale;
};

typedef double (*objective)(struct problem *p);

static double obj_embed(struct problem *p)
{
	ref_embed(p->ids, p->in0, p->in1, p->out, p->n, p->T, p->d);
	return dot(p->R, p->out, p->n * p->d);
}

static double obj_rmsnorm(struct problem *p)
{
	ref_rmsnorm(p->in0, p->in1, p->out, NULL, p->n, p->d);
	return dot(p->R, p->out, p->n * p->d);
}

static double obj_linear(struct problem *p)
{
	ref_linear(p->in0, p->in1, NULL, p->out, p->n, p->d, p->out_features);
	return dot(p->R, p->out, p->n * p->out_features);
}

static double obj_attention(struct problem *p)
{
	ref_attention(p->in0, p->out, NULL, p->B, p->T, p->H, p->hd);
	return dot(p->R, p->out, p->B * p->T * p->H * p->hd);
}

static double obj_gelu(struct problem *p)
{
	ref_gelu(p->in0, p->out, p->count);
	return dot(p->R, p->out, p->count);
}

static double obj_xent(struct problem *p)
{
	ref_xent(p->in0, p->ids, p->out, p->n, p->V);
	double s = 0.0;
	for (size_t i = 0; i < p->n; i++)
		s += p->out[i];
	return p->scale * s;
}

/* grad[k] = dL/dparam[k] by central differences (param is one of p's inputs). */
static double *fd_gradient(objective f, struct problem *p, double *param, size_t count)
{
	double *grad = test_malloc(count * sizeof(double));
	for (size_t k = 0; k < count; k++) {
		double saved = param[k], h = 1e-6 * (fabs(saved) > 1.0 ? fabs(saved) : 1.0);
		param[k] = saved + h;
		double up = f(p), x_up = param[k];
		param[k] = saved - h;
		double down = f(p), x_down = param[k];
		param[k] = saved;
		grad[k] = (up - down) / (x_up - x_down);
	}
	return grad;
}

/* ---- per-kernel checks -------------------------------------------------------------------- */

static void test_embedding(void)
{
	const size_t n = NTOK, T = NT, d = DM, V = NV;
	int32_t *ids = random_ids(n, V);
	ids[3] = ids[1]; /* a repeated token: its dtok row sums two tokens */
	float *tok = random_floats(V * d, 0, 1), *pos = random_floats(T * d, 0, 1), *x = test_nan_floats(n * d);
	double *tok_d = to_double(tok, V * d), *pos_d = to_double(pos, T * d), *x_d = test_malloc(n * d * 8);

	_dos_embed_fwd_cpu(ids, tok, pos, x, n, T, d, DOS_FP32);
	ref_embed(ids, tok_d, pos_d, x_d, n, T, d);
	check_close("embed_fwd x", x, x_d, n * d, FWD_TOL);

	float *R = random_floats(n * d, 0, 1);
	double *R_d = to_double(R, n * d), *out = test_malloc(n * d * 8);
	struct problem p = {.in0 = tok_d, .in1 = pos_d, .ids = ids, .R = R_d, .out = out, .n = n, .T = T, .d = d};
	double *gtok = fd_gradient(obj_embed, &p, tok_d, V * d), *gpos = fd_gradient(obj_embed, &p, pos_d, T * d);

	float *dtok = test_nan_floats(V * d), *dpos = test_nan_floats(T * d);
	_dos_embed_bwd_cpu(ids, R, dtok, dpos, n, T, d, V, 0, DOS_FP32);
	check_close("embed_bwd dtok", dtok, gtok, V * d, GRAD_TOL);
	check_close("embed_bwd dpos", dpos, gpos, T * d, GRAD_TOL);

	/* accumulate = 1: each token's row added in turn, in token order, to the prior content */
	float *ptok = random_floats(V * d, 0, 1), *ppos = random_floats(T * d, 0, 1);
	float *atok = copy_floats(ptok, V * d), *apos = copy_floats(ppos, T * d);
	_dos_embed_bwd_cpu(ids, R, atok, apos, n, T, d, V, 1, DOS_FP32);
	for (size_t i = 0; i < n; i++)
		for (size_t j = 0; j < d; j++) {
			ptok[(size_t)ids[i] * d + j] += R[i * d + j];
			ppos[(i % T) * d + j] += R[i * d + j];
		}
	check_bitwise("embed_bwd accumulated dtok", atok, ptok, V * d);
	check_bitwise("embed_bwd accumulated dpos", apos, ppos, T * d);
	printf("embedding: forward, gradients, accumulation ok\n");

	free(ids), free(tok), free(pos), free(x), free(tok_d), free(pos_d), free(x_d), free(R), free(R_d), free(out);
	free(gtok), free(gpos), free(dtok), free(dpos), free(ptok), free(ppos), free(atok), free(apos);
}

static void test_rmsnorm(void)
{
	const size_t n = NTOK, d = DM;
	float *x = random_floats(n * d, 0.3, 1), *w = random_floats(d, 1, 0.2);
	float *y = test_nan_floats(n * d), *rstd = test_nan_floats(n);
	double *x_d = to_double(x, n * d), *w_d = to_double(w, d), *y_d = test_malloc(n * d * 8),
	       *rstd_d = test_malloc(n * 8);

	_dos_rmsnorm_fwd_cpu(x, w, y, rstd, n, d, DOS_FP32);
	ref_rmsnorm(x_d, w_d, y_d, rstd_d, n, d);
	check_close("rmsnorm_fwd y", y, y_d, n * d, FWD_TOL);
	check_close("rmsnorm_fwd rstd", rstd, rstd_d, n, FWD_TOL);

	float *R = random_floats(n * d, 0, 1);
	double *R_d = to_double(R, n * d), *out = test_malloc(n * d * 8);
	struct problem p = {.in0 = x_d, .in1 = w_d, .R = R_d, .out = out, .n = n, .d = d};
	double *gx = fd_gradient(obj_rmsnorm, &p, x_d, n * d), *gw = fd_gradient(obj_rmsnorm, &p, w_d, d);

	float *dx = test_nan_floats(n * d), *dw = test_nan_floats(d);
	_dos_rmsnorm_bwd_cpu(x, w, rstd, R, dx, dw, n, d, 0, 0, DOS_FP32);
	check_close("rmsnorm_bwd dx", dx, gx, n * d, GRAD_TOL);
	check_close("rmsnorm_bwd dw", dw, gw, d, GRAD_TOL);

	/* the two flags independently: dx is elementwise (exactly prior + fresh), dw a sum over
	 * tokens added in token order into the prior content */
	float *pdx = random_floats(n * d, 0, 1), *pdw = random_floats(d, 0, 1);
	for (int acc_dx = 0; acc_dx <= 1; acc_dx++)
		for (int acc_dw = 0; acc_dw <= 1; acc_dw++) {
			float *adx = acc_dx ? copy_floats(pdx, n * d) : test_nan_floats(n * d);
			float *adw = acc_dw ? copy_floats(pdw, d) : test_nan_floats(d);
			_dos_rmsnorm_bwd_cpu(x, w, rstd, R, adx, adw, n, d, acc_dx, acc_dw, DOS_FP32);
			if (acc_dx) {
				float *want = test_malloc(n * d * sizeof(float));
				for (size_t i = 0; i < n * d; i++)
					want[i] = pdx[i] + dx[i];
				check_bitwise("rmsnorm_bwd accumulated dx", adx, want, n * d);
				free(want);
			} else {
				check_bitwise("rmsnorm_bwd dx (accumulate_dx = 0)", adx, dx, n * d);
			}
			if (acc_dw)
				check_accumulated("rmsnorm_bwd accumulated dw", adw, pdw, dw, d);
			else
				check_bitwise("rmsnorm_bwd dw (accumulate_dw = 0)", adw, dw, d);
			free(adx), free(adw);
		}
	printf("rmsnorm: forward, gradients, accumulation ok\n");

	free(x), free(w), free(y), free(rstd), free(x_d), free(w_d), free(y_d), free(rstd_d), free(R), free(R_d);
	free(out), free(gx), free(gw), free(dx), free(dw), free(pdx), free(pdw);
}

static void test_linear(void)
{
	const size_t n = NTOK, in = DM, out_f = NF;
	float *x = random_floats(n * in, 0, 1), *w = random_floats(out_f * in, 0, 0.5),
	      *res = random_floats(n * out_f, 0, 1);
	double *x_d = to_double(x, n * in), *w_d = to_double(w, out_f * in), *res_d = to_double(res, n * out_f),
	       *y_d = test_malloc(n * out_f * 8);
	float *y = test_nan_floats(n * out_f);

	_dos_linear_fwd_cpu(x, w, NULL, y, n, in, out_f, DOS_FP32);
	ref_linear(x_d, w_d, NULL, y_d, n, in, out_f);
	check_close("linear_fwd y", y, y_d, n * out_f, FWD_TOL);
	_dos_linear_fwd_cpu(x, w, res, y, n, in, out_f, DOS_FP32);
	ref_linear(x_d, w_d, res_d, y_d, n, in, out_f);
	check_close("linear_fwd y with residual", y, y_d, n * out_f, FWD_TOL);

	float *R = random_floats(n * out_f, 0, 1);
	double *R_d = to_double(R, n * out_f), *out = test_malloc(n * out_f * 8);
	struct problem p = {.in0 = x_d, .in1 = w_d, .R = R_d, .out = out, .n = n, .d = in, .out_features = out_f};
	double *gx = fd_gradient(obj_linear, &p, x_d, n * in), *gw = fd_gradient(obj_linear, &p, w_d, out_f * in);

	float *dx = test_nan_floats(n * in), *dw = test_nan_floats(out_f * in);
	_dos_linear_bwd_data_cpu(R, w, dx, n, in, out_f, 0, DOS_FP32);
	_dos_linear_bwd_weight_cpu(R, x, dw, n, in, out_f, 0, DOS_FP32);
	check_close("linear_bwd_data dx", dx, gx, n * in, GRAD_TOL);
	check_close("linear_bwd_weight dw", dw, gw, out_f * in, GRAD_TOL);

	float *pdx = random_floats(n * in, 0, 1), *pdw = random_floats(out_f * in, 0, 1);
	float *adx = copy_floats(pdx, n * in), *adw = copy_floats(pdw, out_f * in);
	_dos_linear_bwd_data_cpu(R, w, adx, n, in, out_f, 1, DOS_FP32);
	_dos_linear_bwd_weight_cpu(R, x, adw, n, in, out_f, 1, DOS_FP32);
	check_accumulated("linear_bwd_data accumulated dx", adx, pdx, dx, n * in);
	check_accumulated("linear_bwd_weight accumulated dw", adw, pdw, dw, out_f * in);
	printf("linear: forward (with and without residual), gradients, accumulation ok\n");

	free(x), free(w), free(res), free(x_d), free(w_d), free(res_d), free(y_d), free(y), free(R), free(R_d);
	free(out), free(gx), free(gw), free(dx), free(dw), free(pdx), free(pdw), free(adx), free(adw);
}

static void test_attention(size_t B, size_t T, size_t H, size_t hd)
{
	const size_t d = H * hd, n = B * T, np = B * H * T * T;
	float *qkv = random_floats(n * 3 * d, 0, 1), *out = test_nan_floats(n * d), *probs = test_nan_floats(np);
	double *qkv_d = to_double(qkv, n * 3 * d), *out_d = test_malloc(n * d * 8), *probs_d = test_malloc(np * 8);

	_dos_attention_fwd_cpu(qkv, out, probs, B, T, H, hd, DOS_FP32);
	ref_attention(qkv_d, out_d, probs_d, B, T, H, hd);
	check_close("attention_fwd out", out, out_d, n * d, FWD_TOL);
	check_close("attention_fwd probs", probs, probs_d, np, FWD_TOL);
	for (size_t r = 0; r < B * H * T; r++) {
		size_t i = r % T;
		double sum = 0.0;
		for (size_t j = 0; j < T; j++) {
			float pr = probs[r * T + j];
			CHECK(j <= i || (pr == 0.0f && !signbit(pr)),
			      "attention probs row %zu (position %zu), column %zu = %g above the diagonal", r, i, j,
			      (double)pr);
			sum += pr;
		}
		CHECK(fabs(sum - 1.0) <= 1e-6, "attention probs row %zu sums to %.9g", r, sum);
	}

	float *R = random_floats(n * d, 0, 1);
	double *R_d = to_double(R, n * d), *scratch = test_malloc(n * d * 8);
	struct problem p = {.in0 = qkv_d, .R = R_d, .out = scratch, .B = B, .T = T, .H = H, .hd = hd};
	double *g = fd_gradient(obj_attention, &p, qkv_d, n * 3 * d);
	float *dqkv = test_nan_floats(n * 3 * d);
	_dos_attention_bwd_cpu(qkv, probs, R, dqkv, B, T, H, hd, DOS_FP32);
	check_close("attention_bwd dqkv", dqkv, g, n * 3 * d, GRAD_TOL);
	printf("attention B=%zu T=%zu H=%zu hd=%zu: forward, probs, gradient ok\n", B, T, H, hd);

	free(qkv), free(out), free(probs), free(qkv_d), free(out_d), free(probs_d), free(R), free(R_d), free(scratch);
	free(g), free(dqkv);
}

static void test_gelu(void)
{
	const size_t count = 37;
	float *x = random_floats(count, 0, 2), *y = test_nan_floats(count);
	x[0] = 0.0f, x[1] = -6.0f, x[2] = 6.0f, x[3] = -0.5f;
	double *x_d = to_double(x, count), *y_d = test_malloc(count * 8);
	_dos_gelu_fwd_cpu(x, y, count, DOS_FP32);
	ref_gelu(x_d, y_d, count);
	check_close("gelu_fwd y", y, y_d, count, FWD_TOL);

	float *R = random_floats(count, 0, 1);
	double *R_d = to_double(R, count), *out = test_malloc(count * 8);
	struct problem p = {.in0 = x_d, .R = R_d, .out = out, .count = count};
	double *g = fd_gradient(obj_gelu, &p, x_d, count);
	float *dx = test_nan_floats(count);
	_dos_gelu_bwd_cpu(x, R, dx, count, DOS_FP32);
	check_close("gelu_bwd dx", dx, g, count, GRAD_TOL);
	printf("gelu: forward, gradient ok\n");

	free(x), free(y), free(x_d), free(y_d), free(R), free(R_d), free(out), free(g), free(dx);
}

static void test_xent(void)
{
	const size_t n = NTOK, V = NV;
	const float grad_scale = 0.37f;
	float *logits = random_floats(n * V, 0, 2), *loss = test_nan_floats(n), *dl = test_nan_floats(n * V);
	logits[5] = 60.0f; /* a large logit: the log-sum-exp must not overflow */
	int32_t *targets = random_ids(n, V);
	double *logits_d = to_double(logits, n * V), *loss_d = test_malloc(n * 8);

	_dos_xent_cpu(logits, targets, loss, dl, n, V, grad_scale, DOS_FP32);
	ref_xent(logits_d, targets, loss_d, n, V);
	check_close("xent loss", loss, loss_d, n, FWD_TOL);

	double *out = test_malloc(n * 8);
	struct problem p = {.in0 = logits_d, .ids = targets, .out = out, .n = n, .V = V, .scale = grad_scale};
	double *g = fd_gradient(obj_xent, &p, logits_d, n * V);
	check_close("xent dlogits", dl, g, n * V, GRAD_TOL);
	printf("cross-entropy: loss, gradient ok\n");

	free(logits), free(loss), free(dl), free(targets), free(logits_d), free(loss_d), free(out), free(g);
}

/* ---- StarPU: each codelet gives the bits of its kernel -------------------------------- */

static starpu_data_handle_t vec(void *ptr, size_t count)
{
	starpu_data_handle_t h;
	starpu_vector_data_register(&h, STARPU_MAIN_RAM, (uintptr_t)ptr, (uint32_t)count, 4);
	return h;
}

static void *args_copy(const struct _dos_model_args *a)
{
	void *p = test_malloc(sizeof *a);
	memcpy(p, a, sizeof *a);
	return p;
}

static void insert_ok(int ret, const char *what)
{
	CHECK(ret == 0, "starpu_task_insert(%s): %d", what, ret);
}

static void test_codelets(void)
{
	const size_t n = NTOK, T = NT, d = DM, V = NV, F = NF, np = NB * NH * NT * NT;
	setenv("STARPU_NCUDA", "0", 1);
	test_starpu_init(NULL);

	/* inputs, shared read-only by every task */
	int32_t *ids = random_ids(n, V), *targets = random_ids(n, V);
	float *tok = random_floats(V * d, 0, 1), *pos = random_floats(T * d, 0, 1);
	float *x = random_floats(n * d, 0, 1), *w = random_floats(d, 1, 0.2), *dy = random_floats(n * d, 0, 1);
	float *wl = random_floats(F * d, 0, 0.5), *res = random_floats(n * F, 0, 1), *dyl = random_floats(n * F, 0, 1);
	float *qkv = random_floats(n * 3 * d, 0, 1), *logits = random_floats(n * V, 0, 2);

	/* expected outputs, from direct calls (accumulating ones start from a prior) */
	float *e_x = test_nan_floats(n * d), *e_dtok = random_floats(V * d, 0, 1), *e_dpos = random_floats(T * d, 0, 1);
	float *e_y = test_nan_floats(n * d), *e_rstd = test_nan_floats(n), *e_dx = random_floats(n * d, 0, 1),
	      *e_dw = test_nan_floats(d);
	float *e_yl = test_nan_floats(n * F), *e_ylr = test_nan_floats(n * F), *e_dxl = test_nan_floats(n * d),
	      *e_dwl = random_floats(F * d, 0, 1);
	float *e_att = test_nan_floats(n * d), *e_probs = test_nan_floats(np), *e_dqkv = test_nan_floats(n * 3 * d);
	float *e_g = test_nan_floats(n * F), *e_dg = test_nan_floats(n * F), *e_loss = test_nan_floats(n),
	      *e_dl = test_nan_floats(n * V);
	/* the same outputs, computed by tasks */
	float *t_x = test_nan_floats(n * d), *t_dtok = copy_floats(e_dtok, V * d), *t_dpos = copy_floats(e_dpos, T * d);
	float *t_y = test_nan_floats(n * d), *t_rstd = test_nan_floats(n), *t_dx = copy_floats(e_dx, n * d),
	      *t_dw = test_nan_floats(d);
	float *t_yl = test_nan_floats(n * F), *t_ylr = test_nan_floats(n * F), *t_dxl = test_nan_floats(n * d),
	      *t_dwl = copy_floats(e_dwl, F * d);
	float *t_att = test_nan_floats(n * d), *t_probs = test_nan_floats(np), *t_dqkv = test_nan_floats(n * 3 * d);
	float *t_g = test_nan_floats(n * F), *t_dg = test_nan_floats(n * F), *t_loss = test_nan_floats(n),
	      *t_dl = test_nan_floats(n * V);

	_dos_embed_fwd_cpu(ids, tok, pos, e_x, n, T, d, DOS_FP32);
	_dos_embed_bwd_cpu(ids, dy, e_dtok, e_dpos, n, T, d, V, 1, DOS_FP32);
	_dos_rmsnorm_fwd_cpu(x, w, e_y, e_rstd, n, d, DOS_FP32);
	_dos_rmsnorm_bwd_cpu(x, w, e_rstd, dy, e_dx, e_dw, n, d, 1, 0, DOS_FP32);
	_dos_linear_fwd_cpu(x, wl, NULL, e_yl, n, d, F, DOS_FP32);
	_dos_linear_fwd_cpu(x, wl, res, e_ylr, n, d, F, DOS_FP32);
	_dos_linear_bwd_data_cpu(dyl, wl, e_dxl, n, d, F, 0, DOS_FP32);
	_dos_linear_bwd_weight_cpu(dyl, x, e_dwl, n, d, F, 1, DOS_FP32);
	_dos_attention_fwd_cpu(qkv, e_att, e_probs, NB, T, NH, HD, DOS_FP32);
	_dos_attention_bwd_cpu(qkv, e_probs, dy, e_dqkv, NB, T, NH, HD, DOS_FP32);
	_dos_gelu_fwd_cpu(res, e_g, n * F, DOS_FP32);
	_dos_gelu_bwd_cpu(res, dyl, e_dg, n * F, DOS_FP32);
	_dos_xent_cpu(logits, targets, e_loss, e_dl, n, V, 0.25f, DOS_FP32);

	struct _dos_model_args a = {.n = NTOK, .B = NB, .T = NT, .H = NH, .hd = HD, .d = DM, .out = NF, .V = NV};
	struct _dos_model_args acc = a, acc_dx = a, xent = a;
	acc.accumulate = 1;
	acc_dx.accumulate = 1; /* rmsnorm: dx accumulates, dw is overwritten */
	xent.grad_scale = 0.25f;

	starpu_data_handle_t h_ids = vec(ids, n), h_targets = vec(targets, n), h_tok = vec(tok, V * d),
			     h_pos = vec(pos, T * d), h_x = vec(x, n * d), h_w = vec(w, d), h_dy = vec(dy, n * d),
			     h_wl = vec(wl, F * d), h_res = vec(res, n * F), h_dyl = vec(dyl, n * F),
			     h_qkv = vec(qkv, n * 3 * d), h_logits = vec(logits, n * V);
	starpu_data_handle_t outs[] = {
		vec(t_x, n * d),   vec(t_dtok, V * d), vec(t_dpos, T * d), vec(t_y, n * d),        vec(t_rstd, n),
		vec(t_dx, n * d),  vec(t_dw, d),       vec(t_yl, n * F),   vec(t_ylr, n * F),      vec(t_dxl, n * d),
		vec(t_dwl, F * d), vec(t_att, n * d),  vec(t_probs, np),   vec(t_dqkv, n * 3 * d), vec(t_g, n * F),
		vec(t_dg, n * F),  vec(t_loss, n),     vec(t_dl, n * V),
	};
	enum {
		O_X,
		O_DTOK,
		O_DPOS,
		O_Y,
		O_RSTD,
		O_DX,
		O_DW,
		O_YL,
		O_YLR,
		O_DXL,
		O_DWL,
		O_ATT,
		O_PROBS,
		O_DQKV,
		O_G,
		O_DG,
		O_LOSS,
		O_DL,
		O_COUNT
	};
	_Static_assert(O_COUNT == sizeof outs / sizeof outs[0], "one handle per output");

	/* cl_arg: a malloc'd struct (STARPU_CL_ARGS, the convention of model_codelets.h and of
	 * graph/model.c) */
#define ARGS(s) STARPU_CL_ARGS, args_copy(&(s)), sizeof(s)
	insert_ok(starpu_task_insert(&_dos_embed_fwd_codelet, STARPU_R, h_ids, STARPU_R, h_tok, STARPU_R, h_pos,
				     STARPU_W, outs[O_X], ARGS(a), 0),
		  "embed_fwd");
	insert_ok(starpu_task_insert(&_dos_embed_bwd_codelet, STARPU_R, h_ids, STARPU_R, h_dy, STARPU_RW, outs[O_DTOK],
				     STARPU_RW, outs[O_DPOS], ARGS(acc), 0),
		  "embed_bwd");
	insert_ok(starpu_task_insert(&_dos_rmsnorm_fwd_codelet, STARPU_R, h_x, STARPU_R, h_w, STARPU_W, outs[O_Y],
				     STARPU_W, outs[O_RSTD], ARGS(a), 0),
		  "rmsnorm_fwd");
	/* reads the rstd the previous task wrote: StarPU orders them */
	insert_ok(starpu_task_insert(&_dos_rmsnorm_bwd_codelet, STARPU_R, h_x, STARPU_R, h_w, STARPU_R, outs[O_RSTD],
				     STARPU_R, h_dy, STARPU_RW, outs[O_DX], STARPU_W, outs[O_DW], ARGS(acc_dx), 0),
		  "rmsnorm_bwd");
	insert_ok(starpu_task_insert(&_dos_linear_fwd_codelet, STARPU_R, h_x, STARPU_R, h_wl, STARPU_W, outs[O_YL],
				     ARGS(a), 0),
		  "linear_fwd");
	insert_ok(starpu_task_insert(&_dos_linear_fwd_codelet, STARPU_R, h_x, STARPU_R, h_wl, STARPU_W, outs[O_YLR],
				     STARPU_R, h_res, ARGS(a), 0),
		  "linear_fwd with residual");
	insert_ok(starpu_task_insert(&_dos_linear_bwd_data_codelet, STARPU_R, h_dyl, STARPU_R, h_wl, STARPU_W,
				     outs[O_DXL], ARGS(a), 0),
		  "linear_bwd_data");
	insert_ok(starpu_task_insert(&_dos_linear_bwd_weight_codelet, STARPU_R, h_dyl, STARPU_R, h_x, STARPU_RW,
				     outs[O_DWL], ARGS(acc), 0),
		  "linear_bwd_weight");
	insert_ok(starpu_task_insert(&_dos_attention_fwd_codelet, STARPU_R, h_qkv, STARPU_W, outs[O_ATT], STARPU_W,
				     outs[O_PROBS], ARGS(a), 0),
		  "attention_fwd");
	insert_ok(starpu_task_insert(&_dos_attention_bwd_codelet, STARPU_R, h_qkv, STARPU_R, outs[O_PROBS], STARPU_R,
				     h_dy, STARPU_W, outs[O_DQKV], ARGS(a), 0),
		  "attention_bwd");
	insert_ok(starpu_task_insert(&_dos_gelu_fwd_codelet, STARPU_R, h_res, STARPU_W, outs[O_G], ARGS(a), 0),
		  "gelu_fwd");
	insert_ok(starpu_task_insert(&_dos_gelu_bwd_codelet, STARPU_R, h_res, STARPU_R, h_dyl, STARPU_W, outs[O_DG],
				     ARGS(a), 0),
		  "gelu_bwd");
	insert_ok(starpu_task_insert(&_dos_xent_codelet, STARPU_R, h_logits, STARPU_R, h_targets, STARPU_W,
				     outs[O_LOSS], STARPU_W, outs[O_DL], ARGS(xent), 0),
		  "xent");
#undef ARGS
#undef PACKED
	CHECK(starpu_task_wait_for_all() == 0, "starpu_task_wait_for_all");

	starpu_data_handle_t ins[] = {h_ids, h_targets, h_tok, h_pos, h_x,   h_w,
				      h_dy,  h_wl,      h_res, h_dyl, h_qkv, h_logits};
	for (size_t i = 0; i < sizeof ins / sizeof ins[0]; i++)
		starpu_data_unregister(ins[i]);
	for (size_t i = 0; i < O_COUNT; i++)
		starpu_data_unregister(outs[i]);
	starpu_shutdown();

	check_bitwise("codelet embed_fwd x", t_x, e_x, n * d);
	check_bitwise("codelet embed_bwd dtok", t_dtok, e_dtok, V * d);
	check_bitwise("codelet embed_bwd dpos", t_dpos, e_dpos, T * d);
	check_bitwise("codelet rmsnorm_fwd y", t_y, e_y, n * d);
	check_bitwise("codelet rmsnorm_fwd rstd", t_rstd, e_rstd, n);
	check_bitwise("codelet rmsnorm_bwd dx", t_dx, e_dx, n * d);
	check_bitwise("codelet rmsnorm_bwd dw", t_dw, e_dw, d);
	check_bitwise("codelet linear_fwd y", t_yl, e_yl, n * F);
	check_bitwise("codelet linear_fwd y with residual", t_ylr, e_ylr, n * F);
	check_bitwise("codelet linear_bwd_data dx", t_dxl, e_dxl, n * d);
	check_bitwise("codelet linear_bwd_weight dw", t_dwl, e_dwl, F * d);
	check_bitwise("codelet attention_fwd out", t_att, e_att, n * d);
	check_bitwise("codelet attention_fwd probs", t_probs, e_probs, np);
	check_bitwise("codelet attention_bwd dqkv", t_dqkv, e_dqkv, n * 3 * d);
	check_bitwise("codelet gelu_fwd y", t_g, e_g, n * F);
	check_bitwise("codelet gelu_bwd dx", t_dg, e_dg, n * F);
	check_bitwise("codelet xent loss", t_loss, e_loss, n);
	check_bitwise("codelet xent dlogits", t_dl, e_dl, n * V);
	printf("StarPU: the 12 codelets (linear_fwd with 3 and 4 buffers) give the kernels' bits\n");

	void *all[] = {ids,     targets, tok,    pos,   x,      w,     dy,      wl,     res,    dyl,   qkv,    logits,
		       e_x,     e_dtok,  e_dpos, e_y,   e_rstd, e_dx,  e_dw,    e_yl,   e_ylr,  e_dxl, e_dwl,  e_att,
		       e_probs, e_dqkv,  e_g,    e_dg,  e_loss, e_dl,  t_x,     t_dtok, t_dpos, t_y,   t_rstd, t_dx,
		       t_dw,    t_yl,    t_ylr,  t_dxl, t_dwl,  t_att, t_probs, t_dqkv, t_g,    t_dg,  t_loss, t_dl};
	for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
		free(all[i]);
}

int main(void)
{
	test_embedding();
	test_rmsnorm();
	test_linear();
	test_attention(NB, NT, NH, HD);
	test_attention(1, 1, 1, 4);  /* one token: probs [[1]] */
	test_attention(2, 37, 2, 8); /* longer rows, sizes no BLAS kernel is tuned for */
	test_gelu();
	test_xent();
	test_codelets();
	printf("model kernels: all checks passed\n");
	return 0;
}
