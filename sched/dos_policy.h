/* What the rest of the library asks of the scheduling policies (dos_policy.c) without
 * going through the public API, whose refusals print errors. */
#ifndef DOS_POLICY_H
#define DOS_POLICY_H

#include <stddef.h>

/* Whether an existing scheduling context `sched_ctx` is run by one of our policies (the
 * training graph declares its GPU memory only to them). Never fails; no message. */
int _dos_sched_ctx_is_ours(unsigned sched_ctx);

/* A fresh run is about to create `bytes` of optimizer state by init tasks, in the order of
 * its updates: on several GPUs, each GPU of the context makes an even, contiguous share of
 * it (place_state_init). Ignored when `sched_ctx` is not run by one of our policies. */
void _dos_sched_state_coming(unsigned sched_ctx, double bytes);

/* Whether the policies' settings in the environment (DOS_STRIDE_K, DOS_RESIDENT_RATIO,
 * DOS_GPU_RESERVE_MIB, DOS_SCHED_VERBOSE, DOS_GPU_DECLARED_MIB, DOS_GPU_FORECAST) are
 * usable: 0, or -EINVAL with why[] naming the first bad one and its value. The policies
 * themselves warn and keep the default; a program can refuse before StarPU starts. */
int _dos_policy_settings_check(char *why, size_t size);

#endif /* DOS_POLICY_H */
