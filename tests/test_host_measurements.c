/* The host measurements (contention factor, aggregate CPU rate) go where StarPU keeps
 * this host's bus model and come back to the cost model: recorded atomically, read back,
 * the factor overridden by DOS_HOST_CONTENTION, values out of range refused with the
 * stored value unchanged. */
#include <errno.h>

#include "dos.h"
#include "rates.h"
#include "test_starpu.h"
#include "test_util.h"

int main(void)
{
	setenv("STARPU_HOSTNAME", "dos-host-measurements-test", 1);
	unsetenv("DOS_HOST_CONTENTION");
	test_starpu_init(NULL);
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

	CHECK(dos_host_cpu_rate_record(3.5e9) == 0, "%s", dos_last_error());
	CHECK(_dos_host_cpu_rate() == 3.5e9, "recorded 3.5e9 params/s, read %g", _dos_host_cpu_rate());
	CHECK(dos_host_cpu_rate_record(-1) == -EINVAL && strstr(dos_last_error(), "params_per_second = -1"),
	      "a negative rate must be refused");
	CHECK(_dos_host_cpu_rate() == 3.5e9, "a refused record changed the rate");
	starpu_shutdown();
	printf("host measurements: recorded, read back, overridden, bad values refused\n");
	return 0;
}
