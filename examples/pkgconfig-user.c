/* A user's program built from an installed starpu-dos with nothing but
 * `pkg-config --cflags --libs starpu-dos` (make installcheck builds and runs it): one AdamW
 * update of a small vector through the public API of <dos.h>, checked against the update
 * computed here independently, in double, from the AdamW formula. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <dos.h>
#include <starpu.h>

#define N 1000

static int fail(const char *what)
{
	fprintf(stderr, "pkgconfig-user: %s: %s\n", what, dos_last_error());
	return 1;
}

int main(void)
{
	if (dos_version_number() != DOS_VERSION_NUMBER) {
		fprintf(stderr, "pkgconfig-user: compiled against starpu-dos %s but loaded %s\n", DOS_VERSION_STRING,
			dos_version_string());
		return 1;
	}
	if (starpu_init(NULL) != 0) {
		fprintf(stderr, "pkgconfig-user: starpu_init failed\n");
		return 1;
	}

	static float p[N], m[N], v[N], g[N], p0[N];
	for (int i = 0; i < N; i++) {
		p0[i] = p[i] = 1.0f + 0.001f * (float)i;
		g[i] = 0.25f * (float)(i % 7 - 3) + 0.1f; /* never zero */
		m[i] = v[i] = 0.0f;
	}
	const struct dos_adam_hparams hp = {
		.mode = DOS_ADAMW, .lr = 1e-2, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1};
	struct dos_adam_step step;
	if (dos_adam_step_init(&step, &hp, 1, 1.0) != 0)
		return fail("dos_adam_step_init");

	starpu_data_handle_t hpar, hm, hv, hg;
	starpu_vector_data_register(&hpar, STARPU_MAIN_RAM, (uintptr_t)p, N, sizeof(float));
	starpu_vector_data_register(&hm, STARPU_MAIN_RAM, (uintptr_t)m, N, sizeof(float));
	starpu_vector_data_register(&hv, STARPU_MAIN_RAM, (uintptr_t)v, N, sizeof(float));
	starpu_vector_data_register(&hg, STARPU_MAIN_RAM, (uintptr_t)g, N, sizeof(float));
	struct starpu_task *task;
	if (dos_adam_task_create(&step, hpar, hm, hv, hg, DOS_FP32, NULL, DOS_FP32, &task) != 0)
		return fail("dos_adam_task_create");
	if (starpu_task_submit(task) != 0) {
		fprintf(stderr, "pkgconfig-user: starpu_task_submit failed\n");
		return 1;
	}
	starpu_task_wait_for_all();
	starpu_data_unregister(hpar);
	starpu_data_unregister(hm);
	starpu_data_unregister(hv);
	starpu_data_unregister(hg);
	starpu_shutdown();

	/* step 1 from m = v = 0: m = (1 - b1) g, v = (1 - b2) g^2, and
	 * p = p (1 - lr wd) - lr (m / (1 - b1)) / (sqrt(v / (1 - b2)) + eps) */
	int bad = 0;
	for (int i = 0; i < N && bad < 5; i++) {
		double gi = g[i];
		double want_m = (1 - hp.beta1) * gi, want_v = (1 - hp.beta2) * gi * gi;
		double want_p = p0[i] * (1 - hp.lr * hp.weight_decay) -
				hp.lr * (want_m / (1 - hp.beta1)) / (sqrt(want_v / (1 - hp.beta2)) + hp.eps);
		if (fabs(m[i] - want_m) > 1e-6 * fabs(want_m) || fabs(v[i] - want_v) > 1e-6 * want_v ||
		    fabs(p[i] - want_p) > 1e-6) {
			fprintf(stderr, "pkgconfig-user: element %d: p %.9g m %.9g v %.9g, expected %.9g %.9g %.9g\n",
				i, p[i], m[i], v[i], want_p, want_m, want_v);
			bad++;
		}
	}
	if (bad)
		return 1;
	printf("pkgconfig-user: one AdamW update of %d parameters as expected (starpu-dos %s)\n", N,
	       dos_version_string());
	return 0;
}
