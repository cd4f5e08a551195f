/* Error reporting, the command line's numbers, the clock and medians, shared by the
 * benchmark programs. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "bench.h"
#include "parse.h"

void bench_vreport(const char *who, int status, const char *usage, const char *fmt, va_list ap)
{
	fprintf(stderr, status == 2 ? "%s: " : "%s: error: ", who);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	if (status == 2 && usage)
		fputs(usage, stderr);
}

int bench_parse_count(const char *text, double min, double max, double *out)
{
	double x;
	if (_dos_parse_double(text, &x) != 0 || !(x >= min && x <= max) || x != floor(x))
		return -1;
	*out = x;
	return 0;
}

double bench_now_seconds(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int compare_doubles(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

double bench_median(double *x, int n)
{
	qsort(x, (size_t)n, sizeof x[0], compare_doubles);
	return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}
