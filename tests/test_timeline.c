/* The timeline recorder on CPU workers: every watched task gets one bar with a tooltip, a
 * callback the task already had still runs (after recording) and is given back, each worker
 * has a labelled row, a bar takes the colour of the phase its task was watched with (a
 * task that is not ours, that of its name), names are escaped, a reset forgets
 * everything, bad arguments are refused, and the phase rows show updates running while
 * backward runs. Set TEST_TIMELINE_KEEP=FILE.svg to keep the picture. */
#include <errno.h>
#include <stdatomic.h>
#include <unistd.h>

#include <starpu.h>

#include "test_starpu.h"
#include "test_util.h"
#include "timeline.h"

#define NTASKS 20
#define CODELET_NAME "test_timeline_spin"

static struct dos_timeline *timeline;
static atomic_int own_callback_calls;
static atomic_size_t events_seen_by_callback;

/* What a task of the phase check does beside spinning (cl_arg): a backward task runs
 * until the updates beside it have ended, and those start once it runs, so that they
 * overlap however the workers are scheduled (each wait gives up after 10 s). */
struct spin {
	double us;
	enum { ALONE, BACKWARD, BESIDE_BACKWARD } role;
};
static atomic_int backward_running, updates_beside_done;

static void wait_for(atomic_int *flag, int value)
{
	double give_up = starpu_timing_now() + 1e7;
	while (atomic_load(flag) < value && starpu_timing_now() < give_up)
		;
}

/* Spins ~200 us (or cl_arg's microseconds) so that bars have a visible width. */
static void spin_cpu(void *buffers[], void *cl_arg)
{
	(void)buffers;
	const struct spin *s = cl_arg;
	if (s && s->role == BACKWARD)
		atomic_store(&backward_running, 1);
	if (s && s->role == BESIDE_BACKWARD)
		wait_for(&backward_running, 1);
	double until = starpu_timing_now() + (s ? s->us : 200.0);
	while (starpu_timing_now() < until)
		;
	if (s && s->role == BESIDE_BACKWARD)
		atomic_fetch_add(&updates_beside_done, 1);
	if (s && s->role == BACKWARD)
		wait_for(&updates_beside_done, 2);
}

/* A fixed cost rather than a calibrated model, so that a SimGrid build of StarPU (which
 * never runs the kernel) can simulate the task too. */
static double spin_cost(struct starpu_task *task, unsigned nimpl)
{
	(void)task;
	(void)nimpl;
	return 200.0;
}

static struct starpu_perfmodel spin_model = {
	.type = STARPU_COMMON,
	.cost_function = spin_cost,
	.symbol = CODELET_NAME,
};

static struct starpu_codelet spin_codelet = {
	.name = CODELET_NAME,
	.cpu_funcs = {spin_cpu},
	.nbuffers = 0,
	.model = &spin_model,
};

static void own_callback(void *arg)
{
	CHECK(arg == &own_callback_calls, "callback_arg %p, expected %p", arg, (void *)&own_callback_calls);
	events_seen_by_callback = dos_timeline_event_count(timeline);
	own_callback_calls++;
}

static void freeing_callback(void *arg)
{
	CHECK(strcmp(arg, "owned by the task") == 0, "callback_arg of the freeing task is \"%s\"", (char *)arg);
	own_callback_calls++;
}

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "rb");
	CHECK(f != NULL, "cannot open %s", path);
	fseek(f, 0, SEEK_END);
	long size = ftell(f);
	CHECK(size > 0, "%s is empty", path);
	rewind(f);
	char *buf = test_malloc((size_t)size + 1);
	CHECK(fread(buf, 1, (size_t)size, f) == (size_t)size, "short read of %s", path);
	buf[size] = 0;
	fclose(f);
	return buf;
}

static size_t count(const char *haystack, const char *needle)
{
	size_t n = 0;
	for (const char *p = haystack; (p = strstr(p, needle)) != NULL; p += strlen(needle))
		n++;
	return n;
}

/* Baseline y of the row label of worker `name` ("<text x=.. y=..><title>NAME</title>"). */
static double label_y(const char *svg, const char *name)
{
	char key[160];
	snprintf(key, sizeof key, "><title>%s</title>", name);
	const char *p = strstr(svg, key);
	CHECK(p != NULL, "no row label for %s", name);
	while (p > svg && strncmp(p, "<text ", 6) != 0)
		p--;
	double x, y;
	CHECK(sscanf(p, "<text x=\"%lf\" y=\"%lf\"", &x, &y) == 2, "unparsable label of %s", name);
	return y;
}

/* Every bar of the codelet lies in the row of the worker its tooltip names. */
static void check_bars_in_their_rows(const char *svg)
{
	const char *key = "<title>" CODELET_NAME " ";
	for (const char *t = strstr(svg, key); t; t = strstr(t + 1, key)) {
		const char *r = t;
		while (r > svg && strncmp(r, "<rect ", 6) != 0)
			r--;
		double x, y;
		CHECK(sscanf(r, "<rect x=\"%lf\" y=\"%lf\"", &x, &y) == 2, "unparsable bar %.60s", r);
		const char *on = strstr(t, " on "), *from = strstr(t, ", from ");
		CHECK(on && from && from > on, "tooltip without worker: %.80s", t);
		char worker[128];
		snprintf(worker, sizeof worker, "%.*s", (int)(from - on - 4), on + 4);
		double ly = label_y(svg, worker);
		CHECK(y < ly && y > ly - 20, "bar at y=%g is not in the row of %s (label at y=%g)", y, worker, ly);
	}
}

static struct starpu_task *spin_task(void)
{
	struct starpu_task *task = starpu_task_create();
	task->cl = &spin_codelet;
	return task;
}

static void submit_watched(struct starpu_task *task)
{
	CHECK(dos_timeline_watch(timeline, task, DOS_TIMELINE_BY_NAME) == 0, "dos_timeline_watch");
	int err = starpu_task_submit(task);
	CHECK(err == 0, "starpu_task_submit: %d", err);
}

/* xmllint is optional: validate when it is there. */
static void check_well_formed(const char *path)
{
	if (system("command -v xmllint >/dev/null 2>&1") != 0)
		return;
	char cmd[4200];
	snprintf(cmd, sizeof cmd, "xmllint --noout '%s'", path);
	CHECK(system(cmd) == 0, "xmllint rejects %s", path);
}

int main(void)
{
	setenv("STARPU_NCUDA", "0", 1);
	setenv("STARPU_NOPENCL", "0", 1);
	setenv("STARPU_NCPU", "4", 0);

	struct dos_timeline *none = NULL;
	CHECK(dos_timeline_create(NULL) == -EINVAL, "NULL out accepted");
	CHECK(dos_timeline_create(&none) == -ENODEV && none == NULL, "create before starpu_init");

	test_starpu_init(NULL);
	CHECK(dos_timeline_create(&timeline) == 0, "dos_timeline_create");
	CHECK(starpu_profiling_status_get() == STARPU_PROFILING_ENABLE, "profiling not enabled");

	char path[] = "/tmp/test_timeline_XXXXXX.svg";
	int fd = mkstemps(path, 4);
	CHECK(fd >= 0, "mkstemps: %s", strerror(errno));
	close(fd);

	/* Bad arguments. */
	struct starpu_task *kept = spin_task();
	CHECK(dos_timeline_watch(NULL, kept, DOS_TIMELINE_BY_NAME) == -EINVAL, "watch with NULL timeline");
	CHECK(dos_timeline_watch(timeline, NULL, DOS_TIMELINE_BY_NAME) == -EINVAL, "watch of NULL task");
	CHECK(dos_timeline_watch(timeline, kept, DOS_TASK_PHASES) == -EINVAL, "watch with no phase");
	CHECK(dos_timeline_write_svg(timeline, NULL, "t") == -EINVAL, "NULL path");
	CHECK(dos_timeline_write_svg(timeline, "", "t") == -EINVAL, "empty path");
	CHECK(dos_timeline_write_svg(NULL, path, "t") == -EINVAL, "NULL timeline");
	CHECK(dos_timeline_write_svg(timeline, "/nonexistent-dir/x.svg", "t") == -ENOENT, "unwritable path");

	/* NTASKS tasks: one kept (not destroyed) with its own callback, one whose callback_arg
	 * StarPU frees, the others plain. */
	kept->callback_func = own_callback;
	kept->callback_arg = &own_callback_calls;
	kept->destroy = 0;
	kept->detach = 0;
	submit_watched(kept);
	struct starpu_task *freeing = spin_task();
	freeing->callback_func = freeing_callback;
	freeing->callback_arg = strdup("owned by the task");
	freeing->callback_arg_free = 1;
	CHECK(dos_timeline_watch(timeline, freeing, DOS_TIMELINE_BY_NAME) == 0, "dos_timeline_watch");
	CHECK(dos_timeline_watch(timeline, freeing, DOS_TIMELINE_BY_NAME) == -EALREADY, "a task watched twice");
	CHECK(starpu_task_submit(freeing) == 0, "starpu_task_submit");
	for (int i = 2; i < NTASKS; i++)
		submit_watched(spin_task());
	/* A task without codelet runs nowhere: recorded as nothing, and no warning. */
	struct starpu_task *sync = starpu_task_create();
	submit_watched(sync);
	CHECK(starpu_task_wait(kept) == 0, "starpu_task_wait");
	starpu_task_wait_for_all();

	CHECK(own_callback_calls == 2, "own callbacks called %d times, expected 2", (int)own_callback_calls);
	CHECK(events_seen_by_callback >= 1, "the own callback ran before the task was recorded");
	CHECK(kept->callback_func == own_callback && kept->callback_arg == &own_callback_calls &&
		      kept->callback_arg_free == 0,
	      "the kept task's callback fields were not given back");
	starpu_task_destroy(kept);
	CHECK(dos_timeline_event_count(timeline) == NTASKS, "%zu events recorded, expected %d",
	      dos_timeline_event_count(timeline), NTASKS);

	CHECK(dos_timeline_write_svg(timeline, path, "test <timeline> & \"friends\"") == 0, "write_svg");
	char *svg = slurp(path);
	CHECK(strncmp(svg, "<?xml", 5) == 0 || strncmp(svg, "<svg", 4) == 0, "does not start as SVG: %.40s", svg);
	CHECK(strstr(svg, "</svg>") != NULL, "no closing </svg>");
	CHECK(strstr(svg, "without profiling") == NULL && strstr(svg, "Event cap") == NULL &&
		      strstr(svg, "Sample cap") == NULL,
	      "unexpected warning");
	CHECK(count(svg, "<title>" CODELET_NAME " ") == NTASKS, "%zu task tooltips, expected %d",
	      count(svg, "<title>" CODELET_NAME " "), NTASKS);
	CHECK(strstr(svg, "test &lt;timeline&gt; &amp; &quot;friends&quot;") != NULL, "title not escaped");
	/* CPU workers only: no link rows, no memory curve, and the picture says so. */
	CHECK(strstr(svg, "host-&gt;GPU") == NULL && strstr(svg, "<polyline") == NULL, "GPU rows without a GPU");
	CHECK(strstr(svg, "no link rows and no memory curve") != NULL, "no note on the missing GPU");
	unsigned nworkers = starpu_worker_get_count();
	for (unsigned w = 0; w < nworkers; w++) {
		char name[128], label[160];
		starpu_worker_get_name((int)w, name, sizeof name);
		snprintf(label, sizeof label, ">%s</text>", name);
		CHECK(strstr(svg, label) != NULL, "no row label for worker %u (%s)", w, name);
	}
	check_bars_in_their_rows(svg);
	check_well_formed(path);
	const char *keep = getenv("TEST_TIMELINE_KEEP");
	if (keep) {
		FILE *f = fopen(keep, "w");
		CHECK(f && fputs(svg, f) >= 0 && fclose(f) == 0, "cannot keep a copy in %s", keep);
	}
	free(svg);

	/* A reset forgets every task; recording goes on afterwards, with names escaped. */
	dos_timeline_reset(timeline);
	CHECK(dos_timeline_event_count(timeline) == 0, "events survive a reset");
	CHECK(dos_timeline_write_svg(timeline, path, "after reset") == 0, "write_svg after reset");
	svg = slurp(path);
	CHECK(count(svg, CODELET_NAME) == 0, "%zu mentions of the codelet after reset", count(svg, CODELET_NAME));
	CHECK(count(svg, "<title>") == nworkers, "%zu tooltips after reset, expected only the %u row labels",
	      count(svg, "<title>"), nworkers);
	check_well_formed(path);
	free(svg);

	/* Phases: a backward task running while two updates of 2 ms run beside it, and one
	 * update after it: part of the updates' time overlaps backward, drawn on its own row
	 * (with two workers at least: four are asked for above). The summary gives the union
	 * of the updates' times: at least 4 ms (the two beside backward may run at once, on
	 * two workers, or one after the other), half or two thirds of it during backward */
	dos_timeline_reset(timeline);
	static struct spin backward = {1000, BACKWARD}, beside = {2000, BESIDE_BACKWARD}, after = {2000, ALONE};
	struct starpu_task *bwd = spin_task();
	bwd->name = "dos_linear_bwd_data";
	bwd->cl_arg = &backward;
	submit_watched(bwd);
	for (int i = 0; i < 2; i++) {
		struct starpu_task *adam = spin_task();
		adam->name = "dos_adam";
		adam->cl_arg = &beside;
		submit_watched(adam);
	}
	starpu_task_wait_for_all();
	struct starpu_task *late = spin_task();
	late->name = "dos_adam";
	late->cl_arg = &after;
	submit_watched(late);
	starpu_task_wait_for_all();
	CHECK(dos_timeline_write_svg(timeline, path, "phases") == 0, "write_svg of the phases");
	svg = slurp(path);
	const char *ran = strstr(svg, "optimizer updates: 3 tasks over ");
	double busy_ms = 0, during = -1;
	CHECK(ran && sscanf(ran, "optimizer updates: 3 tasks over %lf ms, %lf%% of that while backward still ran",
			    &busy_ms, &during) == 2,
	      "no phase summary: %.200s", ran ? ran : "(none)");
	CHECK(during > 0 && during < 100 && busy_ms >= 4,
	      "updates over %g ms, %g%% during backward: expected at least 4 ms, part of it (not the last update) "
	      "during backward",
	      busy_ms, during);
	CHECK(strstr(svg, ">updates</text>") && strstr(svg, ">backward</text>"), "no phase rows");
	check_well_formed(path);
	free(svg);
	dos_timeline_reset(timeline);

	struct starpu_task *odd = spin_task();
	odd->name = "odd <name> & 'quotes' \x01";
	submit_watched(odd);
	submit_watched(spin_task());
	starpu_task_wait_for_all();
	CHECK(dos_timeline_event_count(timeline) == 2, "%zu events after reset, expected 2",
	      dos_timeline_event_count(timeline));
	CHECK(dos_timeline_write_svg(timeline, path, NULL) == 0, "write_svg with NULL title");
	svg = slurp(path);
	CHECK(count(svg, "<title>" CODELET_NAME " ") == 1, "expected one plain task after reset");
	CHECK(strstr(svg, "<title>odd &lt;name&gt; &amp; &apos;quotes&apos; ? ") != NULL, "task name not escaped");
	check_well_formed(path);
	free(svg);

	/* The phase a task is watched with colours its bar, whatever its name says; a task
	 * that is not ours is coloured by its name. The legend counts each family drawn. */
	dos_timeline_reset(timeline);
	struct starpu_task *update = spin_task();
	update->name = "named like a backward_pass";
	CHECK(dos_timeline_watch(timeline, update, DOS_TASK_UPDATE) == 0, "dos_timeline_watch with a phase");
	CHECK(starpu_task_submit(update) == 0, "starpu_task_submit");
	struct starpu_task *foreign = spin_task();
	foreign->name = "a foreign backward_pass";
	submit_watched(foreign);
	submit_watched(spin_task());
	starpu_task_wait_for_all();
	CHECK(dos_timeline_write_svg(timeline, path, "phases") == 0, "write_svg with phases");
	svg = slurp(path);
	CHECK(strstr(svg, ">update: 1</text>") && strstr(svg, ">backward: 1</text>") && strstr(svg, ">other: 1</text>"),
	      "the legend does not count one update, one backward and one other task");
	CHECK(!strstr(svg, ">forward: "), "the legend lists a family no bar has");
	const char *bar = strstr(svg, "<title>named like a backward_pass ");
	const char *update_swatch = strstr(svg, ">update: 1</text>");
	CHECK(bar && update_swatch, "no bar or legend item for the update");
	const char *fill = bar;
	while (fill > svg && strncmp(fill, "fill=\"", 6) != 0)
		fill--;
	const char *swatch = update_swatch;
	while (swatch > svg && strncmp(swatch, "fill=\"", 6) != 0)
		swatch--;
	CHECK(strncmp(fill, swatch, 14) == 0, "the update's bar (%.14s) is not the colour of its legend item (%.14s)",
	      fill, swatch);
	check_well_formed(path);
	free(svg);

	dos_timeline_destroy(timeline);
	dos_timeline_destroy(NULL);
	starpu_shutdown();
	unlink(path);
	printf("test_timeline: %d tasks drawn on %u workers, reset and escaping checked\n", NTASKS, nworkers);
	return 0;
}
