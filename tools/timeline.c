/* The recorder behind dos-train --plot: task completions caught by a chained callback,
 * link bytes and GPU memory sampled at each completion, and a self-contained SVG writer
 * (Gantt rows per worker and per link direction, memory curve, time axis, legend). */
#include "timeline.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Distinct task names kept; later new names share one entry so that tasks named per
 * instance cannot grow the table without bound. */
#define MAX_NAMES 4096
#define NAME_SLOTS 8192 /* open-addressing table, a power of two above MAX_NAMES */
#define NO_NAME UINT32_MAX

struct event {
	double start_us, end_us; /* StarPU's clock: microseconds since starpu_init */
	int worker;
	uint32_t name;
	int family; /* its bar's colour: below */
};

/* Rows 2g and 2g + 1 of the link section: host->GPU g and GPU g->host. */
struct gpu {
	unsigned node;
	char name[32];
	starpu_ssize_t limit; /* STARPU_LIMIT_CUDA_MEM and alike, or -1 */
};

struct dos_timeline {
	starpu_pthread_mutex_t lock; /* StarPU's, so that SimGrid builds schedule it too */
	int previous_profiling;

	unsigned nworkers;
	int *worker_order; /* CPU workers first, then the others, each by id */
	char (*worker_names)[128];

	unsigned ngpus, nlinks;
	struct gpu *gpus;
	int nbuses;
	int *bus_link; /* link row of each bus, or -1 for buses not between host and one GPU */

	struct event *events;
	size_t nevents, events_cap;
	size_t dropped;    /* completions past the event cap (or when memory ran out) */
	size_t unprofiled; /* completions without profiling information or worker */

	/* Samples: time, bytes moved on each link since the previous sample, GPU memory in
	 * use. Sample 0 is taken at reset; its bytes predate the window and are not drawn. */
	double *sample_t;
	long long *sample_bytes; /* nsamples x nlinks */
	size_t *sample_mem;      /* nsamples x ngpus */
	size_t nsamples, samples_cap;
	size_t merged_samples; /* samples folded into the last one because the cap was hit */
	long long *scratch;    /* nlinks */
	double t_reset;

	char *names[MAX_NAMES + 1];
	uint32_t nnames;
	uint32_t name_slot[NAME_SLOTS]; /* index + 1 into names, 0 when free */
	uint32_t overflow_name;         /* shared entry once MAX_NAMES is reached, or NO_NAME */
};

/* What dos_timeline_watch keeps for one task until it completes. */
struct watch_record {
	struct dos_timeline *tl;
	struct starpu_task *task;
	int phase; /* or DOS_TIMELINE_BY_NAME */
	void (*callback_func)(void *);
	void *callback_arg;
	unsigned callback_arg_free;
};

static int is_gpu_node(unsigned node)
{
	enum starpu_node_kind kind = starpu_node_get_kind(node);
	return kind == STARPU_CUDA_RAM || kind == STARPU_HIP_RAM || kind == STARPU_OPENCL_RAM;
}

static int gpu_index_of_node(const struct dos_timeline *tl, int node)
{
	for (unsigned g = 0; g < tl->ngpus; g++)
		if ((int)tl->gpus[g].node == node)
			return (int)g;
	return -1;
}

/* Room for twice as many events (at most DOS_TIMELINE_MAX_EVENTS). Returns 0 or -ENOMEM. */
static int grow_events(struct dos_timeline *tl)
{
	size_t want = tl->events_cap ? tl->events_cap * 2 : 1024;
	if (want > DOS_TIMELINE_MAX_EVENTS)
		want = DOS_TIMELINE_MAX_EVENTS;
	if (want <= tl->events_cap)
		return -ENOMEM;
	struct event *e = realloc(tl->events, want * sizeof *e);
	if (!e)
		return -ENOMEM;
	tl->events = e;
	tl->events_cap = want;
	return 0;
}

static int grow_samples(struct dos_timeline *tl)
{
	size_t want = tl->samples_cap ? tl->samples_cap * 2 : 1024;
	if (want > DOS_TIMELINE_MAX_EVENTS)
		want = DOS_TIMELINE_MAX_EVENTS;
	if (want <= tl->samples_cap)
		return -ENOMEM;
	double *t = realloc(tl->sample_t, want * sizeof *t);
	if (!t)
		return -ENOMEM;
	tl->sample_t = t;
	if (tl->nlinks) {
		long long *b = realloc(tl->sample_bytes, want * tl->nlinks * sizeof *b);
		if (!b)
			return -ENOMEM;
		tl->sample_bytes = b;
	}
	if (tl->ngpus) {
		size_t *m = realloc(tl->sample_mem, want * tl->ngpus * sizeof *m);
		if (!m)
			return -ENOMEM;
		tl->sample_mem = m;
	}
	tl->samples_cap = want;
	return 0;
}

/* Link activity: StarPU's public API has no per-transfer start/end times, only per-bus byte
 * counters (counted when a transfer is issued, and reset by every read). So the links are
 * sampled at task boundaries: each completion (and each reset) reads and drains the
 * counters, and the picture shows the bytes that moved between consecutive samples. Called
 * with tl->lock held. */
static void take_sample(struct dos_timeline *tl)
{
	double now = starpu_timing_now();
	memset(tl->scratch, 0, tl->nlinks * sizeof *tl->scratch);
	for (int b = 0; b < tl->nbuses; b++) {
		if (tl->bus_link[b] < 0)
			continue;
		struct starpu_profiling_bus_info info;
		if (starpu_bus_get_profiling_info(b, &info) == 0 && info.transferred_bytes > 0)
			tl->scratch[tl->bus_link[b]] += info.transferred_bytes;
	}

	size_t i = tl->nsamples;
	if (i == tl->samples_cap && grow_samples(tl) != 0) {
		/* Full: fold into the last sample so that byte totals stay right. */
		i = tl->nsamples - 1;
		tl->merged_samples++;
	} else {
		tl->nsamples++;
		for (unsigned l = 0; l < tl->nlinks; l++)
			tl->sample_bytes[i * tl->nlinks + l] = 0;
	}
	tl->sample_t[i] = now;
	for (unsigned l = 0; l < tl->nlinks; l++)
		tl->sample_bytes[i * tl->nlinks + l] += tl->scratch[l];
	for (unsigned g = 0; g < tl->ngpus; g++)
		tl->sample_mem[i * tl->ngpus + g] = starpu_memory_get_used(tl->gpus[g].node);
}

static uint32_t hash_name(const char *s)
{
	uint32_t h = 2166136261u;
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 16777619u;
	return h;
}

/* Index of `name` in tl->names, adding it if new; NO_NAME when memory runs out. Called
 * with tl->lock held. */
static uint32_t intern_name(struct dos_timeline *tl, const char *name)
{
	if (!name)
		name = "(unnamed)";
	uint32_t slot = hash_name(name) & (NAME_SLOTS - 1);
	while (tl->name_slot[slot]) {
		uint32_t k = tl->name_slot[slot] - 1;
		if (strcmp(tl->names[k], name) == 0)
			return k;
		slot = (slot + 1) & (NAME_SLOTS - 1);
	}
	if (tl->nnames == MAX_NAMES) {
		if (tl->overflow_name == NO_NAME) {
			tl->names[MAX_NAMES] = strdup("(other names: table full)");
			if (tl->names[MAX_NAMES])
				tl->overflow_name = MAX_NAMES;
		}
		return tl->overflow_name;
	}
	char *copy = strdup(name);
	if (!copy)
		return NO_NAME;
	tl->names[tl->nnames] = copy;
	tl->name_slot[slot] = tl->nnames + 1;
	return tl->nnames++;
}

static const char *name_of(const struct dos_timeline *tl, uint32_t k)
{
	return k == NO_NAME ? "?" : tl->names[k];
}

/* The families of bars in the picture, each with its colour: the phases (graph/phase.h),
 * which our tasks come with, and "other". */
#define FAM_OTHER DOS_TASK_PHASES
#define NFAMILIES (DOS_TASK_PHASES + 1)
static const char *const family_colour[NFAMILIES] = {
	[DOS_TASK_DATA] = "#9c755f",    [DOS_TASK_FORWARD] = "#4e79a7",    [DOS_TASK_BACKWARD] = "#f28e2b",
	[DOS_TASK_GATHER] = "#b07aa1",  [DOS_TASK_STATISTICS] = "#edc948", [DOS_TASK_UPDATE] = "#59a14f",
	[DOS_TASK_REFRESH] = "#76b7b2", [DOS_TASK_EVALUATION] = "#ff9da7", [DOS_TASK_STATE_INIT] = "#bab0ac",
	[FAM_OTHER] = "#9d9d9d",
};

static const char *const link_colour[2] = {"#e15759", "#17becf"}; /* host->GPU, GPU->host */
static const char *const overlap_colour = "#1f6f1f";              /* updates while backward runs */
static const char *const memory_colour[] = {"#d62728", "#9467bd", "#8c564b", "#2ca02c", "#1f77b4", "#ff7f0e"};

static const char *family_label(int family)
{
	return family == FAM_OTHER ? "other" : _dos_task_phase_name((enum _dos_task_phase)family);
}

/* The family of a task that is not ours (a foreign program's), by its name, as StarPU
 * programs commonly name their codelets (op_fwd, op_bwd, adam); a name matching several
 * families takes the first in this table. */
static int family_by_name(const char *name)
{
	static const char *const update[] = {"adam", "optim"};
	static const char *const backward[] = {"bwd", "backward"};
	static const char *const forward[] = {"fwd", "forward", "xent", "loss"};
	static const struct {
		const char *const *words;
		size_t n;
		int family;
	} table[] = {
		{update, sizeof update / sizeof *update, DOS_TASK_UPDATE},
		{backward, sizeof backward / sizeof *backward, DOS_TASK_BACKWARD},
		{forward, sizeof forward / sizeof *forward, DOS_TASK_FORWARD},
	};
	for (size_t t = 0; t < sizeof table / sizeof *table; t++)
		for (size_t i = 0; i < table[t].n; i++)
			if (name && strstr(name, table[t].words[i]))
				return table[t].family;
	return FAM_OTHER;
}

static void record_completion(struct dos_timeline *tl, struct starpu_task *task, int phase)
{
	struct starpu_profiling_task_info *info = task->profiling_info;
	STARPU_PTHREAD_MUTEX_LOCK(&tl->lock);
	if (!task->cl) {
		/* A task without codelet (a synchronisation point) ran nowhere: nothing to draw,
		 * and its profiling_info has no worker or times. */
	} else if (!info || info->workerid < 0 || (unsigned)info->workerid >= tl->nworkers) {
		tl->unprofiled++; /* profiling off, or a combined (parallel) worker */
	} else if (tl->nevents == tl->events_cap && grow_events(tl) != 0) {
		tl->dropped++;
	} else {
		struct event *e = &tl->events[tl->nevents++];
		e->start_us = starpu_timing_timespec_to_us(&info->start_time);
		e->end_us = starpu_timing_timespec_to_us(&info->end_time);
		e->worker = info->workerid;
		e->name = intern_name(tl, starpu_task_get_name(task));
		e->family = phase == DOS_TIMELINE_BY_NAME ? family_by_name(starpu_task_get_name(task)) : phase;
	}
	take_sample(tl);
	STARPU_PTHREAD_MUTEX_UNLOCK(&tl->lock);
}

/* Runs on the worker that completed the task: record, give the task back its own
 * callback fields, then call that callback. */
static void watch_callback(void *arg)
{
	struct watch_record *r = arg;
	struct watch_record saved = *r;
	record_completion(r->tl, r->task, r->phase);
	r->task->callback_func = saved.callback_func;
	r->task->callback_arg = saved.callback_arg;
	r->task->callback_arg_free = saved.callback_arg_free;
	free(r);
	if (saved.callback_func)
		saved.callback_func(saved.callback_arg);
}

int dos_timeline_watch(struct dos_timeline *tl, struct starpu_task *task, int phase)
{
	if (!tl || !task || !(phase == DOS_TIMELINE_BY_NAME || (phase >= 0 && phase < DOS_TASK_PHASES)))
		return -EINVAL;
	if (task->callback_func == watch_callback)
		return -EALREADY; /* it would be recorded twice */
	struct watch_record *r = malloc(sizeof *r);
	if (!r)
		return -ENOMEM;
	*r = (struct watch_record){tl, task, phase, task->callback_func, task->callback_arg, task->callback_arg_free};
	task->callback_func = watch_callback;
	task->callback_arg = r;
	/* StarPU frees the record if the task is destroyed without completing. */
	task->callback_arg_free = 1;
	return 0;
}

void dos_timeline_reset(struct dos_timeline *tl)
{
	if (!tl)
		return;
	STARPU_PTHREAD_MUTEX_LOCK(&tl->lock);
	tl->nevents = 0;
	tl->dropped = 0;
	tl->unprofiled = 0;
	tl->nsamples = 0;
	tl->merged_samples = 0;
	take_sample(tl);
	tl->t_reset = tl->sample_t[0];
	STARPU_PTHREAD_MUTEX_UNLOCK(&tl->lock);
}

size_t dos_timeline_event_count(struct dos_timeline *tl)
{
	if (!tl)
		return 0;
	STARPU_PTHREAD_MUTEX_LOCK(&tl->lock);
	size_t n = tl->nevents;
	STARPU_PTHREAD_MUTEX_UNLOCK(&tl->lock);
	return n;
}

static int worker_rank(int id)
{
	return starpu_worker_get_type(id) == STARPU_CPU_WORKER ? 0 : 1;
}

static int compare_workers(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;
	int rx = worker_rank(x), ry = worker_rank(y);
	if (rx != ry)
		return rx - ry;
	return x - y;
}

void dos_timeline_destroy(struct dos_timeline *tl)
{
	if (!tl)
		return;
	if (tl->previous_profiling != STARPU_PROFILING_ENABLE)
		starpu_profiling_status_set(tl->previous_profiling);
	STARPU_PTHREAD_MUTEX_DESTROY(&tl->lock);
	for (uint32_t k = 0; k <= MAX_NAMES; k++)
		free(tl->names[k]);
	free(tl->worker_order);
	free(tl->worker_names);
	free(tl->gpus);
	free(tl->bus_link);
	free(tl->events);
	free(tl->sample_t);
	free(tl->sample_bytes);
	free(tl->sample_mem);
	free(tl->scratch);
	free(tl);
}

int dos_timeline_create(struct dos_timeline **out)
{
	if (!out)
		return -EINVAL;
	*out = NULL;
	if (!starpu_is_initialized())
		return -ENODEV;
	struct dos_timeline *tl = calloc(1, sizeof *tl);
	if (!tl)
		return -ENOMEM;
	tl->overflow_name = NO_NAME;
	tl->previous_profiling = STARPU_PROFILING_ENABLE; /* nothing to restore yet */
	STARPU_PTHREAD_MUTEX_INIT(&tl->lock, NULL);

	tl->nworkers = starpu_worker_get_count();
	unsigned nnodes = starpu_memory_nodes_get_count();
	tl->nbuses = starpu_bus_get_count();
	tl->worker_order = malloc((tl->nworkers + 1) * sizeof *tl->worker_order);
	tl->worker_names = malloc((tl->nworkers + 1) * sizeof *tl->worker_names);
	tl->gpus = calloc(nnodes + 1, sizeof *tl->gpus);
	tl->bus_link = malloc(((size_t)tl->nbuses + 1) * sizeof *tl->bus_link);
	tl->scratch = malloc((2 * (size_t)nnodes + 1) * sizeof *tl->scratch);
	if (!tl->worker_order || !tl->worker_names || !tl->gpus || !tl->bus_link || !tl->scratch) {
		dos_timeline_destroy(tl);
		return -ENOMEM;
	}

	for (unsigned w = 0; w < tl->nworkers; w++) {
		tl->worker_order[w] = (int)w;
		starpu_worker_get_name((int)w, tl->worker_names[w], sizeof tl->worker_names[w]);
	}
	qsort(tl->worker_order, tl->nworkers, sizeof *tl->worker_order, compare_workers);

	for (unsigned node = 0; node < nnodes; node++) {
		if (!is_gpu_node(node))
			continue;
		struct gpu *g = &tl->gpus[tl->ngpus++];
		g->node = node;
		if (starpu_memory_node_get_name(node, g->name, sizeof g->name) < 0)
			snprintf(g->name, sizeof g->name, "GPU node %u", node);
		g->limit = starpu_memory_get_total(node);
	}
	tl->nlinks = 2 * tl->ngpus;

	/* Host<->GPU buses only; with several NUMA nodes, every host node adds to the same
	 * row. Peer GPU<->GPU buses are left alone. */
	for (int b = 0; b < tl->nbuses; b++) {
		int src = starpu_bus_get_src(b), dst = starpu_bus_get_dst(b);
		int gsrc = gpu_index_of_node(tl, src), gdst = gpu_index_of_node(tl, dst);
		tl->bus_link[b] = -1;
		if (gdst >= 0 && starpu_node_get_kind((unsigned)src) == STARPU_CPU_RAM)
			tl->bus_link[b] = 2 * gdst;
		else if (gsrc >= 0 && starpu_node_get_kind((unsigned)dst) == STARPU_CPU_RAM)
			tl->bus_link[b] = 2 * gsrc + 1;
	}

	if (grow_samples(tl) != 0) {
		dos_timeline_destroy(tl);
		return -ENOMEM;
	}
	int previous = starpu_profiling_status_set(STARPU_PROFILING_ENABLE);
	if (previous < 0) {
		dos_timeline_destroy(tl);
		return previous;
	}
	tl->previous_profiling = previous;
	dos_timeline_reset(tl);
	*out = tl;
	return 0;
}

/* ---- SVG ------------------------------------------------------------------------------ */

/* Writes `s` as XML character data: markup characters escaped, control characters and
 * malformed UTF-8 replaced by '?', at most `max_chars` characters (then an ellipsis). */
static void put_text(FILE *f, const char *s, size_t max_chars)
{
	const unsigned char *p = (const unsigned char *)(s ? s : "");
	size_t chars = 0;
	while (*p) {
		if (chars == max_chars) {
			fputs("\xE2\x80\xA6", f);
			return;
		}
		unsigned char c = *p;
		size_t len = c < 0x80             ? 1
			     : (c & 0xE0) == 0xC0 ? 2
			     : (c & 0xF0) == 0xE0 ? 3
			     : (c & 0xF8) == 0xF0 ? 4
						  : 0;
		int ok = len > 0 && !(len == 2 && c < 0xC2);
		for (size_t k = 1; ok && k < len; k++)
			ok = (p[k] & 0xC0) == 0x80;
		chars++;
		if (!ok) {
			fputc('?', f);
			p++;
			continue;
		}
		if (len > 1) {
			fwrite(p, 1, len, f);
			p += len;
			continue;
		}
		switch (c) {
		case '&':
			fputs("&amp;", f);
			break;
		case '<':
			fputs("&lt;", f);
			break;
		case '>':
			fputs("&gt;", f);
			break;
		case '"':
			fputs("&quot;", f);
			break;
		case '\'':
			fputs("&apos;", f);
			break;
		default:
			fputc(c < 0x20 || c == 0x7F ? '?' : c, f);
		}
		p++;
	}
}

static void format_bytes(char *buf, size_t size, double bytes)
{
	static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	int u = 0;
	while (bytes >= 1024.0 && u < 4) {
		bytes /= 1024.0;
		u++;
	}
	snprintf(buf, size, u ? "%.2f %s" : "%.0f %s", bytes, unit[u]);
}

/* A step of 1, 2 or 5 times a power of ten giving about `target` ticks over `span`. */
static double tick_step(double span, int target)
{
	double raw = span / target;
	double mag = pow(10.0, floor(log10(raw)));
	static const double mult[] = {1, 2, 5, 10};
	for (size_t i = 0; i < 4; i++)
		if (mag * mult[i] >= raw)
			return mag * mult[i];
	return mag * 10;
}

/* Horizontal geometry shared by every section. */
struct frame {
	double t0_us, span_us;
	double left, width;
};

static double x_of(const struct frame *fr, double t_us)
{
	return fr->left + (t_us - fr->t0_us) / fr->span_us * fr->width;
}

static void draw_time_axis(FILE *f, const struct frame *fr, double grid_top, double axis_y)
{
	double span_ms = fr->span_us / 1000.0;
	double step = tick_step(span_ms, 10);
	int decimals = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
	fprintf(f,
		"<g stroke=\"#000\" stroke-width=\"1\"><line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/></g>\n",
		fr->left, axis_y, fr->left + fr->width, axis_y);
	fprintf(f, "<g font-size=\"10\" text-anchor=\"middle\" fill=\"#333\">\n");
	for (int k = 0;; k++) {
		double ms = k * step;
		if (ms > span_ms * (1 + 1e-9))
			break;
		double x = x_of(fr, fr->t0_us + ms * 1000.0);
		fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e3e3e3\"/>", x, grid_top, x,
			axis_y);
		fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#000\"/>", x, axis_y, x,
			axis_y + 4);
		fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">%.*f</text>\n", x, axis_y + 15, decimals, ms);
	}
	fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">ms</text>\n</g>\n", fr->left + fr->width + 25,
		axis_y + 15);
}

/* Legend item at (*x, *y), wrapping at `right`; the swatch is drawn by `swatch` markup. */
static void legend_item(FILE *f, double *x, double *y, double left, double right, const char *swatch, const char *text)
{
	double w = 22 + 6.5 * (double)strlen(text) + 18;
	if (*x + w > right && *x > left) {
		*x = left;
		*y += 18;
	}
	if (f) {
		fprintf(f, "<g transform=\"translate(%.1f,%.1f)\">%s<text x=\"18\" y=\"10\">", *x, *y, swatch);
		put_text(f, text, 200);
		fputs("</text></g>\n", f);
	}
	*x += w;
}

#define SVG_WIDTH 1400.0
#define LABEL_WIDTH 240.0
#define RIGHT_MARGIN 40.0
#define ROW_H 18.0
#define ROW_PITCH 22.0
#define MEM_H 110.0

/* Legend items (wrapped) and notes from `top`; returns the bottom. With f NULL, only
 * measures, so that the picture's height can be known before writing it. */
static double draw_legend(FILE *f, const struct dos_timeline *tl, const size_t *family_count, double top)
{
	double lx = 12, ly = top;
	double right = SVG_WIDTH - 12;
	char text[160], swatch[200];
	for (int fam = 0; fam < NFAMILIES; fam++) {
		if (!family_count[fam])
			continue;
		snprintf(text, sizeof text, "%s: %zu", family_label(fam), family_count[fam]);
		snprintf(swatch, sizeof swatch, "<rect width=\"12\" height=\"12\" fill=\"%s\"/>", family_colour[fam]);
		legend_item(f, &lx, &ly, 12, right, swatch, text);
	}
	snprintf(swatch, sizeof swatch, "<rect width=\"12\" height=\"12\" fill=\"%s\"/>", overlap_colour);
	legend_item(f, &lx, &ly, 12, right, swatch, "optimizer updates while backward runs (band over the rows)");
	if (tl->nlinks) {
		for (int d = 0; d < 2; d++) {
			snprintf(swatch, sizeof swatch, "<rect width=\"12\" height=\"12\" fill=\"%s\"/>",
				 link_colour[d]);
			legend_item(f, &lx, &ly, 12, right, swatch, d ? "GPU->host bytes" : "host->GPU bytes");
		}
		for (unsigned g = 0; g < tl->ngpus && g < 4; g++) {
			snprintf(swatch, sizeof swatch,
				 "<line x1=\"0\" y1=\"6\" x2=\"12\" y2=\"6\" stroke=\"%s\" stroke-width=\"2\"/>",
				 memory_colour[g % (sizeof memory_colour / sizeof *memory_colour)]);
			char limit[48] = "";
			if (tl->gpus[g].limit > 0) {
				char l[24];
				format_bytes(l, sizeof l, (double)tl->gpus[g].limit);
				snprintf(limit, sizeof limit, " (limit %s)", l);
			}
			snprintf(text, sizeof text, "%s memory%s", tl->gpus[g].name, limit);
			legend_item(f, &lx, &ly, 12, right, swatch, text);
		}
	}
	ly += 32;
	double bottom = ly + (tl->nlinks ? 32 : 16) + 12;
	if (!f)
		return bottom;
	fputs("<g font-size=\"11\" fill=\"#444\">\n", f);
	if (tl->nlinks) {
		fprintf(f,
			"<text x=\"12\" y=\"%.1f\">Link rows are sampled at task boundaries: StarPU gives per-bus byte "
			"counts, not per-transfer times, so a bar spans the interval between two task completions in "
			"which</text>\n",
			ly);
		fprintf(f,
			"<text x=\"12\" y=\"%.1f\">bytes were issued on that link; its opacity is the rate over that "
			"interval relative to the highest seen. Row labels give the bytes moved in the "
			"window.</text>\n",
			ly + 16);
	} else {
		fprintf(f,
			"<text x=\"12\" y=\"%.1f\">No GPU memory node: CPU workers only, no link rows and no memory "
			"curve.</text>\n",
			ly);
	}
	fprintf(f,
		"<text x=\"12\" y=\"%.1f\">Task rows: StarPU task profiling (start to end of the kernel on the "
		"worker); hover a bar for its name and duration.</text>\n",
		ly + (tl->nlinks ? 32 : 16));
	fputs("</g>\n", f);
	return bottom;
}

/* ---- phases: when forward, backward and the optimizer ran, and how updates overlapped
 * backward (the point of the picture: a subgroup update can start as soon as its
 * gradients are final, while backward still runs) ---------------------------------------- */

enum { PHASE_ROWS = 3 };
static const int phase_family[PHASE_ROWS] = {DOS_TASK_FORWARD, DOS_TASK_BACKWARD, DOS_TASK_UPDATE};
static const char *const phase_label[PHASE_ROWS] = {"forward", "backward", "updates"};

struct spans {
	double (*at)[2]; /* [start, end) in us, disjoint, in order */
	size_t n;
	double total;
};

static int by_start(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* The union of the times tasks of `fam` ran, on any worker. */
static int family_spans(const struct dos_timeline *tl, int fam, struct spans *out)
{
	*out = (struct spans){0};
	out->at = malloc((tl->nevents + 1) * sizeof *out->at);
	if (!out->at)
		return -ENOMEM;
	size_t n = 0;
	for (size_t i = 0; i < tl->nevents; i++)
		if (tl->events[i].family == fam) {
			out->at[n][0] = tl->events[i].start_us;
			out->at[n][1] = tl->events[i].end_us;
			n++;
		}
	qsort(out->at, n, sizeof *out->at, by_start);
	for (size_t i = 0; i < n; i++) {
		if (out->n && out->at[i][0] <= out->at[out->n - 1][1]) {
			out->at[out->n - 1][1] = fmax(out->at[out->n - 1][1], out->at[i][1]);
			continue;
		}
		out->at[out->n][0] = out->at[i][0];
		out->at[out->n][1] = out->at[i][1];
		out->n++;
	}
	for (size_t i = 0; i < out->n; i++)
		out->total += out->at[i][1] - out->at[i][0];
	return 0;
}

/* The times in both a and b. */
static int intersect_spans(const struct spans *a, const struct spans *b, struct spans *out)
{
	*out = (struct spans){0};
	out->at = malloc((a->n + b->n + 1) * sizeof *out->at);
	if (!out->at)
		return -ENOMEM;
	for (size_t i = 0, k = 0; i < a->n && k < b->n;) {
		double from = fmax(a->at[i][0], b->at[k][0]), to = fmin(a->at[i][1], b->at[k][1]);
		if (from < to) {
			out->at[out->n][0] = from;
			out->at[out->n][1] = to;
			out->total += to - from;
			out->n++;
		}
		if (a->at[i][1] < b->at[k][1])
			i++;
		else
			k++;
	}
	return 0;
}

static void draw_spans(FILE *f, const struct frame *fr, const struct spans *sp, double y, double h, const char *fill,
		       const char *extra)
{
	for (size_t i = 0; i < sp->n; i++) {
		double x0 = x_of(fr, sp->at[i][0]), x1 = x_of(fr, sp->at[i][1]);
		fprintf(f, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\"%s/>\n", x0, y,
			fmax(x1 - x0, 1.5), h, fill, extra);
	}
}

static int write_svg_locked(struct dos_timeline *tl, FILE *f, const char *title)
{
	double *busy = calloc(tl->nworkers + 1, sizeof *busy);
	size_t *tasks_on = calloc(tl->nworkers + 1, sizeof *tasks_on);
	long long *link_total = calloc(tl->nlinks + 1, sizeof *link_total);
	int *row_of_worker = calloc(tl->nworkers + 1, sizeof *row_of_worker);
	if (!busy || !tasks_on || !link_total || !row_of_worker) {
		free(busy);
		free(tasks_on);
		free(link_total);
		free(row_of_worker);
		return -ENOMEM;
	}

	/* The window: from the reset (or the earliest start of a task recorded since) to the
	 * last completion or sample. */
	struct frame fr = {.t0_us = tl->t_reset, .left = LABEL_WIDTH, .width = SVG_WIDTH - LABEL_WIDTH - RIGHT_MARGIN};
	double t_end = tl->sample_t[tl->nsamples - 1];
	size_t family_count[NFAMILIES] = {0};
	for (size_t i = 0; i < tl->nevents; i++) {
		const struct event *e = &tl->events[i];
		fr.t0_us = fmin(fr.t0_us, e->start_us);
		t_end = fmax(t_end, e->end_us);
		busy[e->worker] += e->end_us - e->start_us;
		tasks_on[e->worker]++;
		family_count[e->family]++;
	}
	fr.span_us = t_end - fr.t0_us;
	if (!(fr.span_us >= 1.0))
		fr.span_us = 1000.0; /* nothing recorded: a 1 ms axis rather than a degenerate one */

	/* the phase rows, drawn when forward, backward or optimizer tasks were recorded */
	struct spans phase[PHASE_ROWS], overlap = {0};
	int err = 0;
	for (int k = 0; k < PHASE_ROWS; k++)
		if (family_spans(tl, phase_family[k], &phase[k]))
			err = -ENOMEM;
	if (!err && intersect_spans(&phase[1], &phase[2], &overlap))
		err = -ENOMEM;
	int nphases = 0;
	for (int k = 0; k < PHASE_ROWS; k++)
		nphases += phase[k].n > 0;
	if (err) {
		for (int k = 0; k < PHASE_ROWS; k++)
			free(phase[k].at);
		free(overlap.at);
		free(busy);
		free(tasks_on);
		free(link_total);
		free(row_of_worker);
		return err;
	}

	double max_rate = 0;
	size_t peak_mem = 0;
	for (size_t i = 1; i < tl->nsamples; i++) {
		double dt = fmax(tl->sample_t[i] - tl->sample_t[i - 1], 1.0);
		for (unsigned l = 0; l < tl->nlinks; l++) {
			long long b = tl->sample_bytes[i * tl->nlinks + l];
			link_total[l] += b;
			max_rate = fmax(max_rate, (double)b / dt);
		}
	}
	for (size_t i = 0; i < tl->nsamples; i++)
		for (unsigned g = 0; g < tl->ngpus; g++)
			if (tl->sample_mem[i * tl->ngpus + g] > peak_mem)
				peak_mem = tl->sample_mem[i * tl->ngpus + g];

	/* Vertical layout, top to bottom. */
	double y = 0;
	double title_y = y + 26, subtitle_y = y + 46;
	y = 56;
	int warn = tl->dropped || tl->unprofiled || tl->merged_samples;
	double warn_y = y + 12;
	if (warn)
		y += 18;
	double phases_top = y + 8;
	if (nphases)
		y = phases_top + PHASE_ROWS * ROW_PITCH + 8;
	double rows_top = y + 8;
	double links_top = rows_top + tl->nworkers * ROW_PITCH + (tl->nlinks ? 8 : 0);
	double rows_bottom = links_top + tl->nlinks * ROW_PITCH;
	double axis_y = rows_bottom + 4;
	y = axis_y + 26;
	double mem_top = 0, mem_bottom = 0, mem_axis_y = 0;
	if (tl->ngpus) {
		mem_top = y + 22;
		mem_bottom = mem_top + MEM_H;
		mem_axis_y = mem_bottom;
		y = mem_axis_y + 30;
	}
	double legend_top = y + 6;
	double height = draw_legend(NULL, tl, family_count, legend_top);

	fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
	fprintf(f,
		"<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
		"font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n",
		SVG_WIDTH, height, SVG_WIDTH, height);
	fprintf(f, "<rect x=\"0\" y=\"0\" width=\"100%%\" height=\"100%%\" fill=\"#fff\"/>\n");
	fprintf(f, "<text x=\"12\" y=\"%.1f\" font-size=\"17\" font-weight=\"bold\">", title_y);
	put_text(f, title ? title : "starpu-dos timeline", 160);
	fputs("</text>\n", f);
	fprintf(f, "<text x=\"12\" y=\"%.1f\" fill=\"#444\">%zu tasks on %u workers, %.3f ms window%s", subtitle_y,
		tl->nevents, tl->nworkers, fr.span_us / 1000.0,
		tl->nlinks ? "; link rows sampled at task boundaries" : "");
	if (phase[2].n)
		fprintf(f,
			"; optimizer updates: %zu tasks over %.3f ms, %.0f%% of that while backward still ran (dark "
			"green)",
			family_count[DOS_TASK_UPDATE], phase[2].total / 1000.0, 100.0 * overlap.total / phase[2].total);
	fputs("</text>\n", f);
	if (warn) {
		fprintf(f, "<text x=\"12\" y=\"%.1f\" fill=\"#c00000\">", warn_y);
		if (tl->dropped)
			fprintf(f, "Event cap of %d reached (or out of memory): %zu later tasks not drawn. ",
				DOS_TIMELINE_MAX_EVENTS, tl->dropped);
		if (tl->merged_samples)
			fprintf(f, "Sample cap reached: the last %zu samples merged into one. ", tl->merged_samples);
		if (tl->unprofiled)
			fprintf(f, "%zu tasks completed without profiling information (not drawn).", tl->unprofiled);
		fputs("</text>\n", f);
	}

	/* Row bands and labels. */
	for (unsigned r = 0; r < tl->nworkers; r++) {
		int w = tl->worker_order[r];
		row_of_worker[w] = (int)r;
		double ry = rows_top + r * ROW_PITCH;
		fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"/>\n", fr.left, ry,
			fr.width, ROW_H, r % 2 ? "#f4f4f4" : "#fafafa");
		fprintf(f, "<text x=\"10\" y=\"%.1f\"><title>", ry + 13);
		put_text(f, tl->worker_names[w], 200);
		fputs("</title>", f);
		/* "CUDA 0.0 (NVIDIA H200 ...)": the part before " (" fits; the tooltip has it all. */
		char label[sizeof tl->worker_names[w]];
		snprintf(label, sizeof label, "%s", tl->worker_names[w]);
		char *paren = strstr(label, " (");
		if (paren && paren > label)
			*paren = 0;
		put_text(f, label, 20);
		fputs("</text>", f);
		fprintf(f,
			"<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" fill=\"#666\" text-anchor=\"end\">%zu tasks, "
			"%.0f%% busy</text>",
			fr.left - 6, ry + 13, tasks_on[w], 100.0 * busy[w] / fr.span_us);
		fputc('\n', f);
	}
	for (unsigned l = 0; l < tl->nlinks; l++) {
		double ry = links_top + l * ROW_PITCH;
		char total[32];
		format_bytes(total, sizeof total, (double)link_total[l]);
		fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"/>\n", fr.left, ry,
			fr.width, ROW_H, l % 2 ? "#f4f4f4" : "#fafafa");
		fprintf(f, "<text x=\"10\" y=\"%.1f\">", ry + 13);
		put_text(f, tl->gpus[l / 2].name, 16);
		fprintf(f, " %s</text>", l % 2 ? "GPU-&gt;host" : "host-&gt;GPU");
		fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" fill=\"#666\" text-anchor=\"end\">%s</text>\n",
			fr.left - 6, ry + 13, total);
	}
	if (tl->nlinks)
		fprintf(f, "<line x1=\"10\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#bbb\"/>\n", links_top - 4,
			fr.left + fr.width, links_top - 4);

	draw_time_axis(f, &fr, nphases ? phases_top : rows_top, axis_y);

	if (nphases) {
		/* the phases over all workers, the updates' overlap with backward marked on them
		 * and as a band over the worker rows */
		for (int k = 0; k < PHASE_ROWS; k++) {
			double ry = phases_top + k * ROW_PITCH;
			char label[160];
			snprintf(label, sizeof label, "%.3f ms busy", phase[k].total / 1000.0);
			fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#f0f0f0\"/>\n",
				fr.left, ry, fr.width, ROW_H);
			fprintf(f, "<text x=\"10\" y=\"%.1f\" font-weight=\"bold\">%s</text>", ry + 13, phase_label[k]);
			fprintf(f,
				"<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" fill=\"#666\" "
				"text-anchor=\"end\">%s</text>\n",
				fr.left - 6, ry + 13, phase[k].n ? label : "none");
			draw_spans(f, &fr, &phase[k], ry + 1, ROW_H - 2, family_colour[phase_family[k]], "");
		}
		double ry = phases_top + 2 * ROW_PITCH;
		draw_spans(f, &fr, &overlap, ry + 1, ROW_H - 2, overlap_colour,
			   " stroke=\"#000\" stroke-width=\"0.8\"");
		draw_spans(f, &fr, &overlap, rows_top - 4, links_top - rows_top, overlap_colour,
			   " fill-opacity=\"0.18\"");
		fprintf(f, "<line x1=\"10\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#bbb\"/>\n", rows_top - 6,
			fr.left + fr.width, rows_top - 6);
	}

	/* Tasks: one rect each, tooltip with name, worker and duration. */
	fputs("<g stroke=\"none\">\n", f);
	for (size_t i = 0; i < tl->nevents; i++) {
		const struct event *e = &tl->events[i];
		const char *name = name_of(tl, e->name);
		double x0 = x_of(&fr, e->start_us), x1 = x_of(&fr, e->end_us);
		double ry = rows_top + row_of_worker[e->worker] * ROW_PITCH;
		/* A white edge separates back-to-back tasks, where there is room for one; an update
		 * is never thinner than 2 px and has a dark edge, so that a short one still shows. */
		int fam = e->family, update = fam == DOS_TASK_UPDATE;
		fprintf(f, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\"%s><title>", x0,
			ry + 1, fmax(x1 - x0, update ? 2.0 : 0.4), ROW_H - 2, family_colour[fam],
			update        ? " stroke=\"#1b4d1b\" stroke-width=\"0.8\""
			: x1 - x0 > 3 ? " stroke=\"#fff\" stroke-width=\"0.6\""
				      : "");
		put_text(f, name, 200);
		fprintf(f, " %.3f ms on ", (e->end_us - e->start_us) / 1000.0);
		put_text(f, tl->worker_names[e->worker], 200);
		fprintf(f, ", from %.3f ms</title></rect>\n", (e->start_us - fr.t0_us) / 1000.0);
	}
	fputs("</g>\n", f);

	/* Links: a bar per sampling interval in which bytes moved, opacity by achieved rate. */
	fputs("<g stroke=\"none\">\n", f);
	for (size_t i = 1; i < tl->nsamples; i++) {
		double t0 = tl->sample_t[i - 1], t1 = tl->sample_t[i];
		double dt = fmax(t1 - t0, 1.0);
		for (unsigned l = 0; l < tl->nlinks; l++) {
			long long b = tl->sample_bytes[i * tl->nlinks + l];
			if (b <= 0)
				continue;
			double rate = (double)b / dt; /* bytes per us = MB/s */
			double x0 = x_of(&fr, t0), x1 = x_of(&fr, t1);
			char moved[32];
			format_bytes(moved, sizeof moved, (double)b);
			fprintf(f,
				"<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\" "
				"fill-opacity=\"%.3f\"><title>%s in %.3f ms (%.2f GB/s)</title></rect>\n",
				x0, links_top + l * ROW_PITCH + 1, fmax(x1 - x0, 0.4), ROW_H - 2, link_colour[l % 2],
				max_rate > 0 ? 0.15 + 0.85 * rate / max_rate : 1.0, moved, dt / 1000.0, rate / 1000.0);
		}
	}
	fputs("</g>\n", f);

	/* GPU memory in use: a step curve per GPU on a shared scale. */
	if (tl->ngpus) {
		double scale_max = peak_mem > 0 ? (double)peak_mem * 1.1 : 1.0;
		char peak[32];
		format_bytes(peak, sizeof peak, (double)peak_mem);
		double peak_y = mem_bottom - (double)peak_mem / scale_max * MEM_H;
		fprintf(f,
			"<text x=\"10\" y=\"%.1f\" font-weight=\"bold\">GPU memory in use</text>\n<g font-size=\"10\" "
			"fill=\"#666\"><text x=\"10\" y=\"%.1f\">StarPU's allocations on the GPU,</text><text x=\"10\" "
			"y=\"%.1f\">sampled at task boundaries</text></g>\n",
			mem_top + 12, mem_top + 27, mem_top + 40);
		fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#fafafa\"/>\n", fr.left,
			mem_top, fr.width, MEM_H);
		fprintf(f,
			"<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#999\" stroke-dasharray=\"4 "
			"3\"/>\n",
			fr.left, peak_y, fr.left + fr.width, peak_y);
		fprintf(f,
			"<g font-size=\"10\" fill=\"#333\" text-anchor=\"end\"><text x=\"%.1f\" y=\"%.1f\">peak "
			"%s</text>"
			"<text x=\"%.1f\" y=\"%.1f\">0</text></g>\n",
			fr.left + fr.width - 4, peak_y - 3, peak, fr.left - 6, mem_bottom + 3);
		draw_time_axis(f, &fr, mem_top, mem_axis_y);
		for (unsigned g = 0; g < tl->ngpus; g++) {
			fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"",
				memory_colour[g % (sizeof memory_colour / sizeof *memory_colour)]);
			size_t last = SIZE_MAX;
			for (size_t i = 0; i < tl->nsamples; i++) {
				size_t m = tl->sample_mem[i * tl->ngpus + g];
				int final = i + 1 == tl->nsamples;
				if (last == m && !final)
					continue;
				double x = x_of(&fr, tl->sample_t[i]);
				if (last != SIZE_MAX) /* hold the previous value up to this sample */
					fprintf(f, "%.2f,%.2f ", x, mem_bottom - (double)last / scale_max * MEM_H);
				fprintf(f, "%.2f,%.2f ", x, mem_bottom - (double)m / scale_max * MEM_H);
				last = m;
			}
			fputs("\"/>\n", f);
		}
	}

	draw_legend(f, tl, family_count, legend_top);
	fputs("</svg>\n", f);

	for (int k = 0; k < PHASE_ROWS; k++)
		free(phase[k].at);
	free(overlap.at);
	free(busy);
	free(tasks_on);
	free(link_total);
	free(row_of_worker);
	return 0;
}

int dos_timeline_write_svg(struct dos_timeline *tl, const char *path, const char *title)
{
	if (!tl || !path || !*path)
		return -EINVAL;
	FILE *f = fopen(path, "w");
	if (!f)
		return -errno;
	STARPU_PTHREAD_MUTEX_LOCK(&tl->lock);
	int err = write_svg_locked(tl, f, title);
	STARPU_PTHREAD_MUTEX_UNLOCK(&tl->lock);
	if (err == 0 && ferror(f))
		err = -EIO;
	if (fclose(f) != 0 && err == 0)
		err = -errno;
	return err;
}
