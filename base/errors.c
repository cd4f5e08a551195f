/* Error reporting of the public API: the last error per thread, printed once. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dos.h"
#include "errors.h"

static _Thread_local char last_error[1024];
static _Thread_local size_t message_at; /* where the message follows "function: " */
static _Thread_local int held;
static int caller_prints_errors; /* set once, before any thread starts */

static int quiet(void)
{
	/* DOS_QUIET=1 keeps stderr clean for tests that provoke errors on purpose. */
	const char *q = getenv("DOS_QUIET");
	return held || (q && q[0] == '1');
}

void _dos_errors_printed_by_caller(void)
{
	caller_prints_errors = 1;
}

/* A message starts with the public function the user called ("dos_opt_step: ..."); the
 * name of an internal function would tell the user nothing, so it is left out. */
static int is_public(const char *function)
{
	return function && strncmp(function, "dos_", 4) == 0;
}

int _dos_fail(int code, const char *function, const char *fmt, ...)
{
	int len = is_public(function) ? snprintf(last_error, sizeof last_error, "%s: ", function) : 0;
	message_at = len > 0 && (size_t)len < sizeof last_error ? (size_t)len : 0;
	va_list ap;
	va_start(ap, fmt);
	if (len >= 0 && (size_t)len < sizeof last_error)
		vsnprintf(last_error + len, sizeof last_error - (size_t)len, fmt, ap);
	va_end(ap);
	if (!quiet() && !caller_prints_errors)
		fprintf(stderr, "starpu-dos: error: %s\n", last_error);
	return code;
}

int _dos_warnings_silenced(void)
{
	return quiet();
}

void _dos_warn(const char *fmt, ...)
{
	if (quiet())
		return;
	char text[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(text, sizeof text, fmt, ap);
	va_end(ap);
	fprintf(stderr, "starpu-dos: warning: %s\n", text);
}

void _dos_hold_errors(struct dos_error_hold *hold)
{
	snprintf(hold->saved, sizeof hold->saved, "%s", last_error);
	hold->saved_message_at = message_at;
	hold->outer = held;
	held = 1;
}

void _dos_release_errors(struct dos_error_hold *hold)
{
	snprintf(last_error, sizeof last_error, "%s", hold->saved);
	message_at = hold->saved_message_at;
	held = hold->outer;
}

const char *dos_last_error(void)
{
	return last_error;
}

const char *_dos_last_error_message(void)
{
	return last_error + message_at;
}

const char *_dos_starpu_init_explained(int code, const char *call, char *buf, size_t size)
{
	/* the settings that decide which workers StarPU starts */
	static const char *const settings[] = {"STARPU_NCPU",           "STARPU_NCPUS",        "STARPU_NCUDA",
					       "STARPU_NOPENCL",        "STARPU_NHIP",         "STARPU_WORKERS_CPUID",
					       "STARPU_WORKERS_CUDAID", "STARPU_RESERVE_NCPU", "STARPU_SCHED"};
	char set[400] = "";
	for (size_t i = 0; i < sizeof settings / sizeof *settings; i++) {
		const char *value = getenv(settings[i]);
		size_t len = strlen(set);
		if (value)
			snprintf(set + len, sizeof set - len, "%s%s=%.40s", len ? ", " : "", settings[i], value);
	}
	char env[480];
	snprintf(env, sizeof env, *set ? "the environment sets %s" : "no STARPU_NCPU, STARPU_NCUDA or similar is set",
		 set);
	if (code == -ENODEV)
		snprintf(buf, size,
			 "%s failed (%d, %s): StarPU found no worker to run tasks on (no CPU worker, no GPU); %s: give "
			 "it at least one CPU worker (STARPU_NCPU >= 1, or unset it)",
			 call, code, strerror(-code), env);
	else
		snprintf(buf, size, "%s failed (%d, %s); StarPU's own message, if any, is above; %s", call, code,
			 code < 0 ? strerror(-code) : "?", env);
	return buf;
}

int _dos_starpu_init_failed(int code, const char *function, const char *call)
{
	char text[900];
	return _dos_fail(code, function, "%s", _dos_starpu_init_explained(code, call, text, sizeof text));
}
