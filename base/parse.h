/* Numbers from text (command-line options, environment variables), parsed one way
 * everywhere: base 10 only, so that "010" is ten and "0x10" is refused, not read as octal
 * or hexadecimal the way strtoull(..., 0) and strtod do. */
#ifndef DOS_PARSE_H
#define DOS_PARSE_H

#include <stdint.h>

/* A whole number in base 10: one or more digits and nothing else (no sign, no white space,
 * no base prefix; leading zeros are decimal). Returns 0 with *out set, -EINVAL when `text`
 * is not such a number, -ERANGE when it is outside [min, max]; *out is unchanged on an
 * error. */
int _dos_parse_u64(const char *text, uint64_t min, uint64_t max, uint64_t *out);

/* A finite decimal number as strtod reads it ("3e-4", "-0.5", "1e8"), and nothing else:
 * no white space around it, no hexadecimal ("0x1p3"), no inf or nan. Returns 0 with *out
 * set, or -EINVAL (*out unchanged). */
int _dos_parse_double(const char *text, double *out);

#endif /* DOS_PARSE_H */
