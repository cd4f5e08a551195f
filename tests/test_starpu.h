/* Starting StarPU in a test program, the same way everywhere: a machine where StarPU finds
 * no worker skips the test (exit 77) rather than failing it; any other error fails it. */
#ifndef DOS_TEST_STARPU_H
#define DOS_TEST_STARPU_H

#include <errno.h>
#include <starpu.h>

#include "dos.h"
#include "test_util.h"

/* StarPU with CONF as the caller filled it after starpu_conf_init (NULL: the defaults). */
static inline void test_starpu_init(struct starpu_conf *conf)
{
	int ret = starpu_init(conf);
	if (ret == -ENODEV) {
		printf("StarPU found no worker: skipped\n");
		exit(TEST_SKIP);
	}
	CHECK(ret == 0, "starpu_init: %d", ret);
}

/* The same under one of our policies, named as STARPU_SCHED would name it (dos, all-cpu...). */
static inline void test_starpu_init_policy(struct starpu_conf *conf, const char *policy)
{
	conf->sched_policy = dos_sched_policy(policy);
	CHECK(conf->sched_policy != NULL, "no policy named %s", policy);
	conf->sched_policy_name = NULL;
	test_starpu_init(conf);
}

#endif
