/* Update tasks (update_tasks.h): ours, and foreign codelets registered by name. */
#include <errno.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "update_tasks.h"

/* Registrations are few (one per framework's optimizer and dtype pattern); codelets seen
 * are cached by address so that a task costs a short scan, not a pattern match. */
#define MAX_REGISTRATIONS 16
#define MAX_CACHED_CODELETS 128

struct registration {
	char pattern[128];
	int grad, m, v, weight;
};

/* StarPU's mutexes: under SimGrid the workers are simulated and must block through it */
static starpu_pthread_mutex_t registry_lock = STARPU_PTHREAD_MUTEX_INITIALIZER;
static struct registration registered[MAX_REGISTRATIONS];
static int nregistered;
static struct {
	const struct starpu_codelet *cl;
	int registration; /* -1: not an update */
} cached[MAX_CACHED_CODELETS];
static int ncached;

int dos_sched_register_update_codelet(const char *name_pattern, int grad, int m, int v, int weight)
{
	if (!name_pattern || !*name_pattern || strlen(name_pattern) >= sizeof registered[0].pattern)
		return DOS_FAIL(-EINVAL,
				"name_pattern = '%s' must be a codelet name or fnmatch pattern of 1 to %zu "
				"characters",
				name_pattern ? name_pattern : "(null)", sizeof registered[0].pattern - 1);
	int roles[] = {grad, m, v, weight};
	static const char *const names[] = {"grad", "m", "v", "weight"};
	for (int i = 0; i < 4; i++) {
		if (roles[i] < 0 || roles[i] >= STARPU_NMAXBUFS)
			return DOS_FAIL(-EINVAL, "%s = %d must be a buffer index in [0, %d)", names[i], roles[i],
					STARPU_NMAXBUFS);
		for (int j = 0; j < i; j++)
			if (roles[i] == roles[j])
				return DOS_FAIL(-EINVAL, "%s and %s are both buffer %d", names[j], names[i], roles[i]);
	}
	STARPU_PTHREAD_MUTEX_LOCK(&registry_lock);
	int err = 0;
	if (nregistered == MAX_REGISTRATIONS)
		err = DOS_FAIL(-ENOMEM, "already %d update codelets registered", MAX_REGISTRATIONS);
	else {
		struct registration *r = &registered[nregistered++];
		snprintf(r->pattern, sizeof r->pattern, "%s", name_pattern);
		r->grad = grad, r->m = m, r->v = v, r->weight = weight;
		ncached = 0; /* codelets seen before may match the new pattern */
	}
	STARPU_PTHREAD_MUTEX_UNLOCK(&registry_lock);
	return err;
}

/* The registration that `cl` matches, or -1. */
static int registration_of(const struct starpu_codelet *cl)
{
	if (__atomic_load_n(&nregistered, __ATOMIC_ACQUIRE) == 0 || !cl)
		return -1;
	STARPU_PTHREAD_MUTEX_LOCK(&registry_lock);
	int found = -2;
	for (int i = 0; i < ncached && found == -2; i++)
		if (cached[i].cl == cl)
			found = cached[i].registration;
	if (found == -2) {
		found = -1;
		for (int i = 0; i < nregistered && found < 0 && cl->name; i++)
			if (fnmatch(registered[i].pattern, cl->name, 0) == 0)
				found = i;
		if (ncached < MAX_CACHED_CODELETS)
			cached[ncached].cl = cl, cached[ncached++].registration = found;
	}
	STARPU_PTHREAD_MUTEX_UNLOCK(&registry_lock);
	return found;
}

int _dos_is_update(const struct starpu_task *task)
{
	return task->cl == &_dos_adam_codelet || registration_of(task->cl) >= 0;
}

int _dos_update_view(const struct starpu_task *task, struct _dos_update_view *u)
{
	size_t params;
	if (_dos_adam_task_info(task, &u->step, &u->grad_dtype, &u->weight_dtype, &params) == 0) {
		for (int r = 0; r <= DOS_ADAM_BUF_WEIGHT16; r++)
			u->buffer[r] = r;
		u->step_data_end = _dos_adam_step_data_end(task);
		u->flag = _dos_adam_flag_buffer(task);
		u->params = (double)params;
		u->has_step = 1;
		u->foreign = 0;
		return 0;
	}
	int k = task->cl ? registration_of(task->cl) : -1;
	if (k < 0)
		return -1;
	const struct registration *r = &registered[k]; /* never changes once made */
	int most = r->grad > r->m ? r->grad : r->m;
	most = most > r->v ? most : r->v;
	most = most > r->weight ? most : r->weight;
	if (most >= (int)STARPU_TASK_GET_NBUFFERS(task))
		return -1; /* not the codelet the registration describes */
	*u = (struct _dos_update_view){.buffer = {r->weight, r->m, r->v, r->grad, -1},
				       .step_data_end = DOS_ADAM_BUF_GRAD + 1,
				       .flag = -1,
				       .weight_dtype = DOS_FP32,
				       .foreign = 1};
	double state = (double)starpu_data_get_size(STARPU_TASK_GET_HANDLE(task, r->weight)) +
		       (double)starpu_data_get_size(STARPU_TASK_GET_HANDLE(task, r->m)) +
		       (double)starpu_data_get_size(STARPU_TASK_GET_HANDLE(task, r->v));
	u->params = state / 12.0;
	/* a gradient as large as the moment is fp32, a smaller one 16-bit */
	u->grad_dtype = starpu_data_get_size(STARPU_TASK_GET_HANDLE(task, r->grad)) >=
					starpu_data_get_size(STARPU_TASK_GET_HANDLE(task, r->m))
				? DOS_FP32
				: DOS_BF16;
	return 0;
}

/* One entry of DOS_UPDATE_CODELETS: "pattern:grad=G,m=M,v=V,weight=W" (any order). */
static int parse_entry(char *entry)
{
	char *colon = strrchr(entry, ':');
	if (!colon)
		return -1;
	*colon = 0;
	int roles[4] = {-1, -1, -1, -1};
	static const char *const names[] = {"grad", "m", "v", "weight"};
	char *save = NULL;
	for (char *item = strtok_r(colon + 1, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
		char *eq = strchr(item, '='), *end;
		if (!eq)
			return -1;
		*eq = 0;
		long value = strtol(eq + 1, &end, 10);
		int i = 0;
		while (i < 4 && strcmp(item, names[i]))
			i++;
		if (i == 4 || *end || end == eq + 1 || roles[i] >= 0)
			return -1;
		roles[i] = (int)value;
	}
	for (int i = 0; i < 4; i++)
		if (roles[i] < 0)
			return -1;
	return dos_sched_register_update_codelet(entry, roles[0], roles[1], roles[2], roles[3]) ? -1 : 0;
}

static void register_from_env(void)
{
	const char *spec = getenv("DOS_UPDATE_CODELETS");
	if (!spec || !*spec)
		return;
	char *copy = strdup(spec), *save = NULL;
	for (char *entry = copy ? strtok_r(copy, ";", &save) : NULL; entry; entry = strtok_r(NULL, ";", &save)) {
		char shown[256];
		snprintf(shown, sizeof shown, "%s", entry);
		if (parse_entry(entry))
			fprintf(stderr,
				"starpu-dos: DOS_UPDATE_CODELETS entry '%s' ignored: expected "
				"NAME:grad=G,m=M,v=V,weight=W with four distinct buffer indices\n",
				shown);
	}
	free(copy);
}

void _dos_update_codelets_from_env(void)
{
	static int done;
	if (!__atomic_exchange_n(&done, 1, __ATOMIC_ACQ_REL))
		register_from_env();
}
