/* Error reporting shared by the benchmark programs. */
#include <stdio.h>

#include "bench.h"

void bench_vreport(const char *who, int status, const char *usage, const char *fmt, va_list ap)
{
	fprintf(stderr, status == 2 ? "%s: " : "%s: error: ", who);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	if (status == 2 && usage)
		fputs(usage, stderr);
}
