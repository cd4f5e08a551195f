/* Numbers from text (base/parse.h): base 10 only, whole numbers as digits and
 * nothing else, decimal numbers as strtod reads them less hexadecimal, inf, nan and
 * white space; a refused text leaves the output as it was. */
#include <errno.h>
#include <math.h>

#include "parse.h"
#include "test_util.h"

static void whole(const char *text, uint64_t min, uint64_t max, int want_err, uint64_t want)
{
	uint64_t x = 12345;
	int err = _dos_parse_u64(text, min, max, &x);
	CHECK(err == want_err, "'%s' in [%llu, %llu]: error %d, expected %d", text ? text : "(null)",
	      (unsigned long long)min, (unsigned long long)max, err, want_err);
	CHECK(x == (err ? 12345 : want), "'%s': %llu, expected %llu", text ? text : "(null)", (unsigned long long)x,
	      (unsigned long long)(err ? 12345 : want));
}

static void decimal(const char *text, int want_err, double want)
{
	double x = -7.5;
	int err = _dos_parse_double(text, &x);
	CHECK(err == want_err, "'%s': error %d, expected %d", text ? text : "(null)", err, want_err);
	CHECK(x == (err ? -7.5 : want), "'%s': %.17g, expected %.17g", text ? text : "(null)", x, err ? -7.5 : want);
}

int main(void)
{
	whole("0", 0, 10, 0, 0);
	whole("010", 0, 100, 0, 10); /* decimal, not octal */
	whole("09", 0, 100, 0, 9);
	whole("0000000000000000000000000042", 0, 100, 0, 42);
	whole("18446744073709551615", 0, UINT64_MAX, 0, UINT64_MAX);
	whole("18446744073709551616", 0, UINT64_MAX, -ERANGE, 0);
	whole("99999999999999999999x", 0, UINT64_MAX, -EINVAL, 0); /* not a number, however long */
	whole("5", 6, 10, -ERANGE, 0);
	whole("11", 6, 10, -ERANGE, 0);
	static const char *const bad[] = {"",   "0x3", "0X3", "3x",  "+3",    "-3", " 3",
					  "3 ", "1e3", "3.0", "0b1", "three", NULL};
	for (int i = 0; bad[i]; i++)
		whole(bad[i], 0, UINT64_MAX, -EINVAL, 0);
	whole(NULL, 0, 1, -EINVAL, 0);

	decimal("3e-4", 0, 3e-4);
	decimal("-0.5", 0, -0.5);
	decimal("+2", 0, 2);
	decimal(".5", 0, 0.5);
	decimal("010", 0, 10);
	decimal("1e8", 0, 1e8);
	static const char *const bad_decimal[] = {"",   "0x10", "-0x1p3", "0X1",   "inf", "-inf", "nan", "infinity",
						  " 1", "1 ",   "1e",     "1e400", ".",   "-",    "1,5", NULL};
	for (int i = 0; bad_decimal[i]; i++)
		decimal(bad_decimal[i], -EINVAL, 0);
	decimal(NULL, -EINVAL, 0);
	printf("parse: whole numbers in base 10 (leading zeros decimal; signs, spaces, prefixes, exponents refused), "
	       "decimal numbers without hexadecimal, inf, nan or spaces; refusals leave the output\n");
	return 0;
}
