/* The application's GPU memory over an iteration, learned from the previous one.
 *
 * An iteration runs from one step's plan to the next (the end of backward, the updates,
 * the next forward, most of the next backward). A value of the application's data is
 * live, and needs the GPU, from the task that writes it to the last task that reads it
 * (an activation from the forward task that writes it to the backward task that reads
 * it; a gradient from backward to the gather that reads it); a value the iteration's
 * first use reads came from before, so it is live from the start of the iteration
 * (weights read by forward); data homed on the GPU occupies it throughout. Data that
 * stays registered while its value is dead (a buffer reused each step) is not counted
 * then: StarPU may evict it, and its next writer allocates it again. A key is a handle's
 * address, which a handle registered after another's unregistration may take (the
 * activations of the next micro-batch): a task that only writes a key therefore starts a
 * new value, and the key's previous value ended at its last use. Otherwise, with gradient
 * accumulation, every such key would count as live from the first micro-batch to the
 * last, and the sum of them exceed the GPU many times over. The
 * forecast is the peak over time of the sum of those intervals, over the whole
 * iteration (what resident optimizer state must fit beside) and within the update
 * window (what state staged only for the updates must fit beside).
 *
 * Why this measure and not StarPU's memory counters: starpu_memory_get_used counts
 * StarPU's cache of freed buffers and every clean copy it has not needed to evict, so on
 * a busy GPU it reads "full" whatever the application needs
 * (results/whole-iteration-sim-2026-11-29.md); and
 * querying each handle's allocation later would touch handles the application may have
 * unregistered since. Here a handle is only looked at by the hook of a task that uses
 * it, and the same in the real and the SimGrid builds (times are StarPU's clock). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "app_memory.h"

#define INITIAL_CAPACITY 1024ul

static unsigned long key_hash(const void *key, unsigned long capacity)
{
	uint64_t h = (uint64_t)(uintptr_t)key * 0x9e3779b97f4a7c15ull;
	return (unsigned long)(h >> 20) & (capacity - 1);
}

/* The slot of `key` in x, or the empty slot where it goes. */
static unsigned long exclusion_slot(const struct dos_app_exclusions *x, const void *key)
{
	unsigned long i = key_hash(key, x->capacity);
	while (x->keys[i] && x->keys[i] != key)
		i = (i + 1) & (x->capacity - 1);
	return i;
}

int _dos_app_exclusions_add(struct dos_app_exclusions *x, const void *key)
{
	if (x->capacity && x->keys[exclusion_slot(x, key)] == key)
		return 0;
	if (2 * (x->count + 1) > x->capacity) {
		struct dos_app_exclusions grown = {.capacity = x->capacity ? 2 * x->capacity : INITIAL_CAPACITY};
		grown.keys = calloc(grown.capacity, sizeof *grown.keys);
		if (!grown.keys)
			return -1;
		for (unsigned long i = 0; i < x->capacity; i++)
			if (x->keys[i])
				grown.keys[exclusion_slot(&grown, x->keys[i])] = x->keys[i];
		grown.count = x->count;
		free(x->keys);
		*x = grown;
	}
	x->keys[exclusion_slot(x, key)] = key;
	x->count++;
	return 1;
}

int _dos_app_exclusions_has(const struct dos_app_exclusions *x, const void *key)
{
	return x && x->capacity && x->keys[exclusion_slot(x, key)] == key;
}

void _dos_app_exclusions_free(struct dos_app_exclusions *x)
{
	free(x->keys);
	memset(x, 0, sizeof *x);
}

void _dos_app_memory_init(struct dos_app_memory *am, const struct dos_app_exclusions *exclusions)
{
	memset(am, 0, sizeof *am);
	am->exclusions = exclusions;
}

void _dos_app_memory_free(struct dos_app_memory *am)
{
	free(am->entries);
	free(am->ended);
	memset(am, 0, sizeof *am);
}

static unsigned long slot_of(const struct dos_app_memory *am, const void *key)
{
	unsigned long i = key_hash(key, am->capacity);
	while (am->entries[i].key && am->entries[i].key != key)
		i = (i + 1) & (am->capacity - 1);
	return i;
}

/* Rebuilds the table at `capacity`; with `only_recent`, without the entries marked
 * unused by the last plan. */
static int rebuild(struct dos_app_memory *am, unsigned long capacity, int only_recent)
{
	struct dos_app_entry *old = am->entries;
	unsigned long old_capacity = am->capacity;
	struct dos_app_entry *fresh = calloc(capacity, sizeof *fresh);
	if (!fresh)
		return -1;
	am->entries = fresh;
	am->capacity = capacity;
	am->count = 0;
	for (unsigned long i = 0; i < old_capacity; i++) {
		const struct dos_app_entry *e = &old[i];
		if (!e->key || (only_recent && e->unused))
			continue;
		am->entries[slot_of(am, e->key)] = *e;
		am->count++;
	}
	free(old);
	return 0;
}

/* The entry of `key`, created when missing; NULL when out of memory. */
static struct dos_app_entry *entry(struct dos_app_memory *am, const void *key)
{
	if (2 * (am->count + 1) > am->capacity && rebuild(am, am->capacity ? 2 * am->capacity : INITIAL_CAPACITY, 0))
		return NULL;
	struct dos_app_entry *e = &am->entries[slot_of(am, key)];
	if (!e->key) {
		memset(e, 0, sizeof *e);
		e->key = key;
		am->count++;
	}
	return e;
}

void _dos_app_memory_exclude(struct dos_app_memory *am, const void *key)
{
	if (!am->capacity)
		return;
	struct dos_app_entry *e = &am->entries[slot_of(am, key)];
	if (e->key == key)
		e->excluded = 1;
}

/* The value e held ended at its last use: kept for the peaks of this iteration. Returns
 * -1 when out of memory. */
static int end_value(struct dos_app_memory *am, const struct dos_app_entry *e)
{
	if (am->nended == am->ended_capacity) {
		unsigned long capacity = am->ended_capacity ? 2 * am->ended_capacity : INITIAL_CAPACITY;
		struct dos_app_value *grown = realloc(am->ended, capacity * sizeof *grown);
		if (!grown)
			return -1;
		am->ended = grown;
		am->ended_capacity = capacity;
	}
	am->ended[am->nended++] = (struct dos_app_value){e->carried_in ? am->begin : e->first, e->last, e->bytes};
	return 0;
}

void _dos_app_memory_use(struct dos_app_memory *am, const void *key, double bytes, int always_there, int reads,
			 double start, double end)
{
	if (!am->started || _dos_app_exclusions_has(am->exclusions, key))
		return;
	struct dos_app_entry *e = entry(am, key);
	if (!e) {
		am->incomplete = 1;
		return;
	}
	if (e->excluded)
		return;
	if (!e->seen) {
		/* a value an update wrote in this iteration did not come from before */
		e->seen = 1;
		e->carried_in = reads != 0 && !e->update_wrote;
		e->first = e->update_wrote ? fmin(start, e->update_wrote_at) : start;
		e->last = end;
		e->update_wrote = 0;
	} else if (!reads && !e->always_there) { /* a new value: the previous one is dead */
		if (end_value(am, e)) {
			am->incomplete = 1;
			return;
		}
		e->carried_in = 0;
		e->first = start;
		e->last = end;
	} else {
		e->first = fmin(e->first, start);
		e->last = fmax(e->last, end);
	}
	e->bytes = bytes;
	e->always_there = always_there != 0;
}

void _dos_app_memory_update_use(struct dos_app_memory *am, const void *key, int reads, double when)
{
	if (!am->started || !am->capacity || _dos_app_exclusions_has(am->exclusions, key))
		return;
	if (!reads) {
		struct dos_app_entry *e = entry(am, key);
		if (!e)
			am->incomplete = 1;
		else if (e->seen)
			e->last = fmax(e->last, when);
		else if (!e->update_wrote) { /* live from here if an application task reads it */
			e->update_wrote = 1;
			e->update_wrote_at = when;
		}
		return;
	}
	struct dos_app_entry *e = &am->entries[slot_of(am, key)];
	if (e->key == key && e->seen && !e->excluded)
		e->last = fmax(e->last, when);
}

void _dos_app_memory_task(struct dos_app_memory *am, double start, double end)
{
	if (am->started && end > start)
		am->busy += end - start;
}

void _dos_app_memory_update_ended(struct dos_app_memory *am, double when)
{
	if (am->started)
		am->update_end = fmax(am->update_end, when);
}

struct event {
	double t, delta;
};

static int by_time_starts_first(const void *a, const void *b)
{
	const struct event *x = a, *y = b;
	if (x->t != y->t)
		return x->t < y->t ? -1 : 1;
	return (x->delta < y->delta) - (x->delta > y->delta); /* additions before removals */
}

/* Peaks of the live bytes of events ev[0..n) (sorted here) over the whole span and up
 * to window_end. */
static void peaks(struct event *ev, size_t n, double window_end, double *whole, double *window)
{
	qsort(ev, n, sizeof *ev, by_time_starts_first);
	double live = 0;
	*whole = *window = 0;
	for (size_t i = 0; i < n; i++) {
		live += ev[i].delta;
		/* live bytes only grow at an addition; the window also counts what is live as
		 * it opens (additions at or before its start) */
		if (ev[i].delta > 0) {
			*whole = fmax(*whole, live);
			if (ev[i].t <= window_end)
				*window = fmax(*window, live);
		}
	}
}

void _dos_app_memory_plan(struct dos_app_memory *am, double now)
{
	am->plans++;
	int forecast = am->started && !am->incomplete && now > am->begin;
	double begin = am->begin, window_end = fmax(am->update_end, am->begin);
	struct event *ev = forecast ? malloc(2 * (am->count + am->nended + 1) * sizeof *ev) : NULL;
	size_t n = 0;
	for (unsigned long i = 0; ev && i < am->nended; i++) {
		ev[n++] = (struct event){am->ended[i].from, am->ended[i].bytes};
		ev[n++] = (struct event){am->ended[i].to, -am->ended[i].bytes};
	}
	/* One pass over the table: the iteration's values become events, and the entries
	 * start the next iteration afresh. Data unused in this one is dropped (it may have
	 * been unregistered, and its address reused); a table with nothing to drop is kept
	 * as it is, since a rebuild costs a pass and an allocation as large as the table. */
	unsigned long unused = 0;
	for (unsigned long i = 0; i < am->capacity; i++) {
		struct dos_app_entry *e = &am->entries[i];
		if (!e->key)
			continue;
		if (ev && e->seen && !e->excluded) {
			double from = e->always_there || e->carried_in ? begin : e->first,
			       to = e->always_there ? now : e->last;
			ev[n++] = (struct event){from, e->bytes};
			ev[n++] = (struct event){to, -e->bytes};
		}
		e->unused = !e->seen && !e->excluded;
		unused += e->unused;
		e->seen = e->update_wrote = 0;
	}
	if (ev) {
		double whole, window;
		peaks(ev, n, window_end, &whole, &window);
		free(ev);
		am->last = (struct dos_app_forecast){.learned = 1,
						     .whole_iteration = am->plans > 2,
						     .iteration_peak_bytes = whole,
						     .update_peak_bytes = fmin(window, whole),
						     .iteration_seconds = now - begin,
						     .update_window_seconds = window_end - begin,
						     .gpu_busy_seconds = am->busy};
	}
	if (unused)
		(void)rebuild(am, am->capacity, 1); /* when out of memory, the old table serves */
	am->nended = 0;
	am->incomplete = 0;
	am->started = 1;
	am->begin = now;
	am->update_end = now;
	am->busy = 0;
}
