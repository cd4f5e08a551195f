/* Error reporting behind dos_last_error(): one place formats, keeps and prints the message
 * of a failed call. */
#ifndef DOS_ERRORS_H
#define DOS_ERRORS_H

/* Records "function: message" as this thread's last error, prints it on stderr, and
 * returns `code` (a negative errno value), so callers write `return _dos_fail(...)`. */
int _dos_fail(int code, const char *function, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#define DOS_FAIL(code, ...) _dos_fail((code), __func__, __VA_ARGS__)

#endif /* DOS_ERRORS_H */
