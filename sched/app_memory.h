/* The application's GPU memory over an iteration, learned from its GPU tasks: which data
 * each task used and when. Pure bookkeeping (keys are opaque pointers, times in
 * seconds): the policy feeds it from its execution hooks, tests feed it made-up tasks.
 * See app_memory.c for the measure and why it is this one. */
#ifndef DOS_APP_MEMORY_H
#define DOS_APP_MEMORY_H

/* What the last complete iteration showed. */
struct dos_app_forecast {
	int learned;                  /* 0: no iteration measured yet (the values are 0) */
	int whole_iteration;          /* 1: from plan to plan; 0: from the start to the first plan */
	double iteration_peak_bytes;  /* most application data live at once, over the iteration */
	double update_peak_bytes;     /* the same within its update window */
	double iteration_seconds;     /* from one plan to the next */
	double update_window_seconds; /* from the plan to the end of its last update */
	double gpu_busy_seconds;      /* the application's GPU task time over the iteration */
};

struct dos_app_entry {
	const void *key;
	double bytes;
	double first, last;         /* when the iteration's GPU tasks first and last used it */
	unsigned char seen;         /* used in the current iteration */
	unsigned char always_there; /* homed on the GPU: occupies it from start to end */
	unsigned char carried_in;   /* first read in the iteration: its value came from before */
	unsigned char excluded;     /* the optimizer's own (planned for separately) */
	unsigned char update_wrote; /* an update wrote it this iteration, no GPU task used it yet */
	unsigned char unused;       /* not used in the iteration the last plan ended: dropped */
	double update_wrote_at;
};

/* A value of some key that ended in the current iteration: a later task wrote the key anew. */
struct dos_app_value {
	double from, to, bytes;
};

/* The optimizer's own data (its state, planned for separately): never the application's,
 * on any GPU. One set for every GPU's table, so that each table holds only what the
 * application's tasks used, and a plan's pass over it does not sweep the state of every
 * subgroup once per GPU. */
struct dos_app_exclusions {
	const void **keys; /* open addressing, capacity a power of two; NULL: empty */
	unsigned long capacity, count;
};

struct dos_app_memory {
	const struct dos_app_exclusions *exclusions; /* shared; NULL: none */
	struct dos_app_entry *entries;               /* open addressing, capacity a power of two */
	unsigned long capacity, count;
	struct dos_app_value *ended; /* this iteration's values that a new one replaced */
	unsigned long nended, ended_capacity;
	int incomplete; /* out of memory while recording: this iteration teaches nothing */
	int started;    /* an iteration is being recorded */
	int plans;      /* calls of _dos_app_memory_plan */
	double begin, update_end, busy;
	struct dos_app_forecast last;
};

/* Adds `key` to x: the optimizer's own data. Returns 1 when it is new there, 0 when it
 * was there already, -1 when out of memory. */
int _dos_app_exclusions_add(struct dos_app_exclusions *x, const void *key);
/* 1 when x holds `key`; 0 otherwise, or when x is NULL. */
int _dos_app_exclusions_has(const struct dos_app_exclusions *x, const void *key);
void _dos_app_exclusions_free(struct dos_app_exclusions *x);

/* A table whose uses of the keys in `exclusions` (NULL: none) are never recorded. */
void _dos_app_memory_init(struct dos_app_memory *am, const struct dos_app_exclusions *exclusions);
void _dos_app_memory_free(struct dos_app_memory *am);

/* `key` was just added to am's exclusions: what am recorded of it before stops counting. */
void _dos_app_memory_exclude(struct dos_app_memory *am, const void *key);

/* A GPU task of the application ran from `start` to `end` and used `key` (`bytes`; homed
 * on the GPU when `always_there`; `reads` when it read the value, not only wrote it: a
 * task that only writes a key used before in the iteration starts a new value of it).
 * Call once per buffer, in the order the tasks ran; _dos_app_memory_task once per task.
 * Before the first iteration starts nothing is recorded. */
void _dos_app_memory_use(struct dos_app_memory *am, const void *key, double bytes, int always_there, int reads,
			 double start, double end);
void _dos_app_memory_task(struct dos_app_memory *am, double start, double end);

/* An optimizer update used `key`, one of its inputs or outputs that are not its
 * state (a gradient, 16-bit weights: the application's tasks produce or read them on the
 * GPU), when it ended at `when`, on whichever worker. A read extends the live span of a
 * value the application's GPU tasks made (nothing when none did: it was not on the GPU);
 * a write starts one if a GPU task of the application then reads it (the 16-bit weights
 * that the refresh copies into the tensors), and counts for nothing otherwise. */
void _dos_app_memory_update_use(struct dos_app_memory *am, const void *key, int reads, double when);

/* An update of the current iteration's plan ended at `when`: its update window lasts at
 * least until then. */
void _dos_app_memory_update_ended(struct dos_app_memory *am, double when);

/* A plan at `now` ends the iteration being recorded (its forecast becomes `last`) and
 * starts the next one. The first call only starts one (the window up to the first plan:
 * forward and backward, without their update window). */
void _dos_app_memory_plan(struct dos_app_memory *am, double now);

#endif /* DOS_APP_MEMORY_H */
