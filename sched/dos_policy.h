/* What the rest of the library asks of the scheduling policies (dos_policy.c) without
 * going through the public API, whose refusals print errors. */
#ifndef DOS_POLICY_H
#define DOS_POLICY_H

/* Whether an existing scheduling context `sched_ctx` is run by one of our policies (the
 * training graph declares its GPU memory only to them). Never fails; no message. */
int _dos_sched_ctx_is_ours(unsigned sched_ctx);

#endif /* DOS_POLICY_H */
