/* Error reporting behind dos_last_error(): one place formats, keeps and prints the message
 * of a failed call. */
#ifndef DOS_ERRORS_H
#define DOS_ERRORS_H

#include <stddef.h>

/* Records "function: message" as this thread's last error ("message" alone when function
 * is internal, not a public dos_* one), prints it on stderr, and returns `code` (a
 * negative errno value), so callers write `return _dos_fail(...)`. */
int _dos_fail(int code, const char *function, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#define DOS_FAIL(code, ...) _dos_fail((code), __func__, __VA_ARGS__)

/* The last error's message without the function's name: to be told again in other words,
 * or given as the reason of a finding (below). */
const char *_dos_last_error_message(void);

/* Failures that are findings of the caller rather than errors (a damaged file skipped in
 * favour of an older one): between _dos_hold_errors and _dos_release_errors, failures
 * are recorded but not printed (_dos_last_error_message reads them), and the release
 * restores the last error from before the hold. Holds nest (per thread). */
struct dos_error_hold {
	char saved[1024];
	size_t saved_message_at; /* where its message follows the function's name */
	int outer;               /* a hold was already on */
};
void _dos_hold_errors(struct dos_error_hold *hold);
void _dos_release_errors(struct dos_error_hold *hold);

/* Records why StarPU's initialisation (starpu_init, starpu_mpi_init_conf: `call`) failed
 * with `code`, in words a user can act on: what the code means and which of the
 * environment's StarPU settings decide the workers (-ENODEV: no worker at all, as with
 * STARPU_NCPU=0 on a machine without GPU). Returns code. */
int _dos_starpu_init_failed(int code, const char *function, const char *call);
/* The same words into buf (size bytes), returned, for a program that reports them itself. */
const char *_dos_starpu_init_explained(int code, const char *call, char *buf, size_t size);
#define DOS_STARPU_INIT_FAILED(code, call) _dos_starpu_init_failed((code), __func__, (call))

/* For a program that prints dos_last_error() itself where a call fails (dos-train): the
 * failures are no longer printed here, so that each is told once; warnings still are,
 * as nothing returns them to the program. Call it before StarPU starts. */
void _dos_errors_printed_by_caller(void);

/* A warning on stderr ("starpu-dos: warning: ..."), unless DOS_QUIET=1 or errors are held:
 * for what the library does on its own that its caller should know of. */
void _dos_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Whether _dos_warn prints nothing now: for a program that prints warnings of its own
 * (dos-train's about its options) under the same rule. */
int _dos_warnings_silenced(void);

#endif /* DOS_ERRORS_H */
