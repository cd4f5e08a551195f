/* Subcommands of dos-bench, one file each. */
#ifndef DOS_BENCH_H
#define DOS_BENCH_H

/* dos-bench calibrate [--max-size N] [--reps R]; returns the exit status. */
int bench_calibrate(int argc, char **argv);
/* dos-bench optimizer [--params P] [--subgroup S] [--grad D] [--weight D] [--steps K]
 * [--policies LIST] [--gpu-mem-mib M]; returns the exit status. */
int bench_optimizer(int argc, char **argv);

#endif /* DOS_BENCH_H */
