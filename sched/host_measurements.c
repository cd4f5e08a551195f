/* Measurements of the host that StarPU's models do not hold, kept beside StarPU's bus
 * model for the same host so that the dos policy plans with them on every later run:
 *  - the aggregate CPU Adam rate with every core busy: StarPU times one task at a time per
 *    worker, and the cores share memory bandwidth, so the rate of n workers is not n times
 *    the rate of one;
 *  - the contention factor: how much slower CPU Adam runs while DMA streams through host
 *    memory in both directions.
 * `dos-bench host` measures both (the second needs a GPU) and records them here. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <starpu.h>

#include "dos.h"
#include "errors.h"
#include "parse.h"
#include "rates.h"

/* <sampling dir>/dos/<name>.<host>, beside the bus model StarPU uses for this host
 * (STARPU_HOSTNAME and STARPU_HOME included): StarPU prints its bus file names, the only
 * public place that names the directory and the host together. */
static int measurement_path(const char *name, char *path, size_t size, char *dir, size_t dir_size)
{
	char *text = NULL;
	size_t len = 0;
	FILE *mem = open_memstream(&text, &len);
	if (!mem)
		return -1;
	starpu_bus_print_filenames(mem);
	fclose(mem);
	char bandwidth[1024] = "";
	const char *start = text ? strstr(text, "bandwidth: <") : NULL;
	if (start)
		sscanf(start, "bandwidth: <%1023[^>]>", bandwidth);
	free(text);
	char *file = strrchr(bandwidth, '/'), *dot = strrchr(bandwidth, '.');
	if (!file || !dot || dot < file || file == bandwidth)
		return -1;
	*dot = '\0';  /* <sampling>/bus/<host> */
	*file = '\0'; /* <sampling>/bus */
	char *bus = strrchr(bandwidth, '/');
	if (!bus)
		return -1;
	*bus = '\0'; /* <sampling> */
	if (snprintf(dir, dir_size, "%s/dos", bandwidth) >= (int)dir_size)
		return -1;
	return snprintf(path, size, "%s/%s.%s", dir, name, file + 1) >= (int)size ? -1 : 0;
}

/* The number recorded under `name` for this host if it lies in [lo, hi), else `fallback`. */
static double read_measurement(const char *name, double lo, double hi, double fallback)
{
	char path[1200], dir[1100], line[64], *end;
	if (measurement_path(name, path, sizeof path, dir, sizeof dir))
		return fallback;
	FILE *f = fopen(path, "r");
	if (!f)
		return fallback; /* never measured on this host */
	double x = fallback;
	if (fgets(line, sizeof line, f)) {
		double y = strtod(line, &end);
		if (end != line && y >= lo && y < hi)
			x = y;
	}
	fclose(f);
	return x;
}

/* Writes `value` and a comment line under `name`: to a temporary file, synced, renamed,
 * so that a reader never sees half a file. */
static int record_measurement(const char *name, double value, const char *comment)
{
	char path[1200], dir[1100], tmp[1300];
	if (measurement_path(name, path, sizeof path, dir, sizeof dir))
		return DOS_FAIL(-ENOENT, "StarPU names no bus model file for this host (is StarPU initialised?)");
	if (mkdir(dir, 0755) && errno != EEXIST)
		return DOS_FAIL(-errno, "cannot create %s: %s", dir, strerror(errno));
	snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
	FILE *f = fopen(tmp, "w");
	if (!f)
		return DOS_FAIL(-errno, "cannot write %s: %s", tmp, strerror(errno));
	int ok = fprintf(f, "%.9g\n# %s\n", value, comment) > 0;
	ok &= fflush(f) == 0 && fsync(fileno(f)) == 0;
	ok &= fclose(f) == 0;
	if (!ok || rename(tmp, path)) {
		int err = errno;
		unlink(tmp);
		return DOS_FAIL(-err, "cannot write %s: %s", path, strerror(err));
	}
	return 0;
}

double _dos_host_contention(void)
{
	const char *env = getenv("DOS_HOST_CONTENTION");
	double x;
	if (env && *env) {
		if (_dos_parse_double(env, &x) == 0 && x >= 1.0 && x < 100.0)
			return x;
		fprintf(stderr, "starpu-dos: DOS_HOST_CONTENTION = '%s' is not a decimal number in [1, 100); ignored\n",
			env);
	}
	return read_measurement("host_contention", 1.0, 100.0, 1.0);
}

int dos_host_contention_record(double factor)
{
	if (!(factor >= 1.0 && factor < 100.0))
		return DOS_FAIL(-EINVAL, "factor = %g must be in [1, 100)", factor);
	return record_measurement("host_contention", factor,
				  "CPU Adam time with DMA running / without, measured by dos-bench host");
}

double _dos_host_cpu_rate(void)
{
	return read_measurement("host_cpu_rate", 1.0, 1e15, 0.0);
}

int dos_host_cpu_rate_record(double params_per_second)
{
	if (!(params_per_second >= 1.0 && params_per_second < 1e15))
		return DOS_FAIL(-EINVAL, "params_per_second = %g must be in [1, 1e15)", params_per_second);
	return record_measurement("host_cpu_rate", params_per_second,
				  "Adam params/s of all CPU cores together, measured by dos-bench host");
}
