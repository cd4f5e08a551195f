/* The host-contention factor goes where StarPU keeps this host's perfmodels and comes
 * back to the cost model: recorded atomically, read back, overridden by
 * DOS_HOST_CONTENTION, refused when out of range (the stored value unchanged). */
#include <errno.h>

#include "dos.h"
#include "rates.h"
#include "test_util.h"

int main(void)
{
	setenv("STARPU_HOSTNAME", "dos-contention-test", 1);
	unsetenv("DOS_HOST_CONTENTION");
	int ret = starpu_init(NULL);
	if (ret == -ENODEV)
		return TEST_SKIP;
	CHECK(ret == 0, "starpu_init: %d", ret);
	CHECK(dos_host_contention_record(1.0) == 0, "%s", dos_last_error());
	CHECK(_dos_host_contention() == 1.0, "recorded 1.0, read %g", _dos_host_contention());
	CHECK(dos_host_contention_record(1.37) == 0, "%s", dos_last_error());
	CHECK(fabs(_dos_host_contention() - 1.37) < 1e-9, "recorded 1.37, read %g", _dos_host_contention());
	CHECK(dos_host_contention_record(0.5) == -EINVAL && strstr(dos_last_error(), "factor = 0.5"),
	      "a factor below 1 must be refused");
	CHECK(fabs(_dos_host_contention() - 1.37) < 1e-9, "a refused record changed the value");
	setenv("DOS_HOST_CONTENTION", "1.2", 1);
	CHECK(_dos_host_contention() == 1.2, "the environment must win: %g", _dos_host_contention());
	setenv("DOS_HOST_CONTENTION", "fast", 1);
	CHECK(fabs(_dos_host_contention() - 1.37) < 1e-9, "a bad DOS_HOST_CONTENTION must be ignored");
	unsetenv("DOS_HOST_CONTENTION");
	starpu_shutdown();
	printf("host contention: recorded, read back, overridden, bad values refused\n");
	return 0;
}
