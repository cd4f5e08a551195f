/* Error reporting of the public API: the last error per thread, printed once. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "dos.h"
#include "errors.h"

static _Thread_local char last_error[512];

int _dos_fail(int code, const char *function, const char *fmt, ...)
{
	int len = snprintf(last_error, sizeof last_error, "%s: ", function);
	va_list ap;
	va_start(ap, fmt);
	if (len >= 0 && (size_t)len < sizeof last_error)
		vsnprintf(last_error + len, sizeof last_error - (size_t)len, fmt, ap);
	va_end(ap);
	/* DOS_QUIET=1 keeps stderr clean for tests that provoke errors on purpose. */
	const char *quiet = getenv("DOS_QUIET");
	if (!quiet || quiet[0] != '1')
		fprintf(stderr, "starpu-dos: error: %s\n", last_error);
	return code;
}

const char *dos_last_error(void)
{
	return last_error;
}
