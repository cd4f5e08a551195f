/* Records what one training iteration did on each StarPU worker and link, and draws it as
 * a self-contained SVG Gantt chart (dos-train --plot). Public StarPU API only: task
 * profiling for task rows, bus byte counters and starpu_memory_get_used for the rest. */
#ifndef DOS_TIMELINE_H
#define DOS_TIMELINE_H

#include <starpu.h>

#include "phase.h"

/* Most task events (24 bytes each) and link/memory samples (8 + 24 bytes per GPU each)
 * kept between two resets: later tasks are counted, not drawn, and later samples merge
 * into the last one; the picture says so. */
#define DOS_TIMELINE_MAX_EVENTS 1000000

struct dos_timeline;

/* Creates a recorder; call after starpu_init. Turns StarPU task profiling on (bus byte
 * counters are always kept by StarPU) and takes the first link/memory sample, so the
 * recorder starts as if dos_timeline_reset had just been called. Note that each sample
 * drains StarPU's per-bus counters (starpu_bus_get_profiling_info resets them), so
 * STARPU_BUS_STATS at shutdown only shows traffic after the last sample.
 * Returns 0, -EINVAL when `out` is NULL, -ENODEV when StarPU is not initialised,
 * -ENOMEM, or StarPU's negative code when profiling cannot be enabled. */
int dos_timeline_create(struct dos_timeline **out);

/* The phase of a watched task that is not ours (a foreign program's): its bar is coloured
 * by what its name says (op_fwd, op_bwd, adam), else as "other". */
#define DOS_TIMELINE_BY_NAME (-1)

/* Records `task` when it completes: worker, start and end (task->profiling_info), its name
 * (starpu_task_get_name: task->name, else the codelet's name) and its phase, an enum
 * _dos_task_phase (graph/phase.h) that colours its bar, or DOS_TIMELINE_BY_NAME; the link
 * byte counters and GPU memory in use are sampled at the same moment. Call before
 * submitting. A callback
 * the task already has is kept and called right after recording, on the same thread; its
 * callback_func, callback_arg and callback_arg_free are given back to the task then (so a
 * regenerated task is watched once per call). A task without codelet is sampled but not
 * drawn; one that ran without profiling information is counted in the picture's warning.
 * Returns 0, -EINVAL when `tl` or `task` is NULL or `phase` is neither, -EALREADY when
 * the task is watched and has not completed since, or -ENOMEM (the task then runs
 * unwatched, callback unchanged). A watched task destroyed without completing frees the
 * recorder's per-task record, but not a callback_arg of its own that it asked StarPU to
 * free. */
int dos_timeline_watch(struct dos_timeline *tl, struct starpu_task *task, int phase);

/* Forgets every task and sample recorded so far and takes a fresh sample: call at the
 * start of the iteration to keep. The time axis starts here (or at the earliest start of
 * a task that completes later, if earlier). Does nothing when `tl` is NULL. */
void dos_timeline_reset(struct dos_timeline *tl);

/* Number of task events recorded since the last reset (drawn ones only). 0 when `tl` is
 * NULL. */
size_t dos_timeline_event_count(struct dos_timeline *tl);

/* Writes the SVG picture to `path` (overwritten): `title` (may be NULL) at the top, one
 * row per worker (CPU then GPU), one row per direction of each host<->GPU link with the
 * bytes moved in its label, the GPU memory in use underneath (when there is a GPU), a
 * time axis in ms and a legend. Returns 0, -EINVAL when `tl` or `path` is NULL or `path`
 * is empty, -ENOMEM, or the negative errno of opening or writing the file (-EIO when
 * the stream reports an error). */
int dos_timeline_write_svg(struct dos_timeline *tl, const char *path, const char *title);

/* Frees the recorder and restores the profiling status found by dos_timeline_create.
 * Call after every watched task has completed (starpu_task_wait_for_all). NULL is a
 * no-op. */
void dos_timeline_destroy(struct dos_timeline *tl);

#endif /* DOS_TIMELINE_H */
