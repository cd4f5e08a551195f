/* The host-memory contention factor of the cost model: how much slower CPU Adam runs
 * while DMA streams through host memory (both share its bandwidth). Measured by
 * `dos-bench contention` on a machine with a GPU and kept beside StarPU's perfmodels
 * for the host, so that the policy plans with it on every later run. */
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
#include "rates.h"

/* <sampling dir>/dos/host_contention.<host>, beside the bus model StarPU uses for this
 * host (STARPU_HOSTNAME and STARPU_HOME included): StarPU prints its bus file names, the
 * only public place that names the directory and the host together. */
static int contention_path(char *path, size_t size, char *dir, size_t dir_size)
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
	return snprintf(path, size, "%s/host_contention.%s", dir, file + 1) >= (int)size ? -1 : 0;
}

double _dos_host_contention(void)
{
	const char *env = getenv("DOS_HOST_CONTENTION");
	char *end;
	if (env && *env) {
		double x = strtod(env, &end);
		if (!*end && x >= 1.0 && x < 100.0)
			return x;
		fprintf(stderr, "starpu-dos: DOS_HOST_CONTENTION = '%s' is not a number in [1, 100); ignored\n", env);
	}
	char path[1200], dir[1100], line[64];
	if (contention_path(path, sizeof path, dir, sizeof dir))
		return 1.0;
	FILE *f = fopen(path, "r");
	if (!f)
		return 1.0; /* never measured on this host */
	double x = 1.0;
	if (fgets(line, sizeof line, f)) {
		double y = strtod(line, &end);
		if (end != line && y >= 1.0 && y < 100.0)
			x = y;
	}
	fclose(f);
	return x;
}

int dos_host_contention_record(double factor)
{
	if (!(factor >= 1.0 && factor < 100.0))
		return DOS_FAIL(-EINVAL, "factor = %g must be in [1, 100)", factor);
	char path[1200], dir[1100], tmp[1300];
	if (contention_path(path, sizeof path, dir, sizeof dir))
		return DOS_FAIL(-ENOENT, "StarPU names no bus model file for this host (is StarPU initialised?)");
	if (mkdir(dir, 0755) && errno != EEXIST)
		return DOS_FAIL(-errno, "cannot create %s: %s", dir, strerror(errno));
	snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
	FILE *f = fopen(tmp, "w");
	if (!f)
		return DOS_FAIL(-errno, "cannot write %s: %s", tmp, strerror(errno));
	int ok = fprintf(f, "%.6f\n# CPU Adam time with DMA running / without, measured by dos-bench contention\n",
			 factor) > 0;
	ok &= fflush(f) == 0 && fsync(fileno(f)) == 0;
	ok &= fclose(f) == 0;
	/* written then renamed: a reader never sees half a file */
	if (!ok || rename(tmp, path)) {
		int err = errno;
		unlink(tmp);
		return DOS_FAIL(-err, "cannot write %s: %s", path, strerror(err));
	}
	return 0;
}
