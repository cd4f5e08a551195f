/* Numbers from text, base 10 only (parse.h). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "parse.h"

int _dos_parse_u64(const char *text, uint64_t min, uint64_t max, uint64_t *out)
{
	if (!text || *text < '0' || *text > '9')
		return -EINVAL;
	uint64_t x = 0;
	int too_large = 0;
	for (const char *p = text; *p; p++) {
		if (*p < '0' || *p > '9')
			return -EINVAL;
		unsigned d = (unsigned)(*p - '0');
		if (x > (UINT64_MAX - d) / 10)
			too_large = 1; /* keep reading: "12x" beyond 2^64 is not a number either */
		else
			x = 10 * x + d;
	}
	if (too_large || x < min || x > max)
		return -ERANGE;
	*out = x;
	return 0;
}

int _dos_parse_double(const char *text, double *out)
{
	if (!text)
		return -EINVAL;
	/* strtod's own syntax, less what is not a decimal number: it skips white space and
	 * reads "0x..." as hexadecimal, "inf" and "nan" */
	const char *p = text + (*text == '+' || *text == '-');
	if (!((*p >= '0' && *p <= '9') || (*p == '.' && p[1] >= '0' && p[1] <= '9')))
		return -EINVAL;
	if (p[0] == '0' && (p[1] == 'x' || p[1] == 'X'))
		return -EINVAL;
	char *end;
	errno = 0;
	double x = strtod(text, &end);
	if (end == text || *end || errno == ERANGE || !isfinite(x))
		return -EINVAL;
	*out = x;
	return 0;
}
