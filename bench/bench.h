/* Subcommands of dos-bench, one file each. */
#ifndef DOS_BENCH_H
#define DOS_BENCH_H

#include <stdarg.h>

/* Prints "WHO: message" and then `usage` for a bad command line (status 2), or
 * "WHO: error: message" for a failure (any other status), on stderr. */
void bench_vreport(const char *who, int status, const char *usage, const char *fmt, va_list ap);

/* A whole number in [min, max] written as an integer or in floating-point notation
 * (5e9): 0 and *out set, or -1 (the caller names the option and the value). */
int bench_parse_count(const char *text, double min, double max, double *out);

/* CLOCK_MONOTONIC in seconds. */
double bench_now_seconds(void);
/* Median of x[0 .. n), n >= 1; sorts x in place. */
double bench_median(double *x, int n);

/* dos-bench calibrate [--max-size N] [--reps R]; returns the exit status. */
int bench_calibrate(int argc, char **argv);

/* dos-bench host: the host's aggregate CPU Adam rate and DMA contention, recorded for
 * the dos policy. */
int bench_host(int argc, char **argv);
/* dos-bench optimizer [--params P] [--subgroup S] [--grad D] [--weight D] [--steps K]
 * [--policies LIST] [--gpu-mem-mib M]; returns the exit status. */
int bench_optimizer(int argc, char **argv);
/* dos-bench gemm [--cpu-size N] [--gpu-size N] [--reps R]: the matrix-product rates the
 * model's kernels can reach (CPU sgemm; cuBLAS fp32, bf16, fp16). */
int bench_gemm(int argc, char **argv);

#endif /* DOS_BENCH_H */
