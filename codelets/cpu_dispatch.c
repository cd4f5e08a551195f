/* Chooses the CPU kernel table at run time from what the CPU supports, so one binary
 * runs everywhere (DeepSpeed's -march=native builds break on other CPUs), with an API and
 * DOS_CPU_ISA to force a variant for tests and benchmarks. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "dos.h"
#include "errors.h"
#include "kernels.h"

static _Atomic(const struct _dos_cpu_kernels *) selected;

int dos_cpu_isa_supported(enum dos_cpu_isa isa)
{
#ifdef DOS_CPU_X86_64
	__builtin_cpu_init();
#endif
	switch (isa) {
	case DOS_CPU_ISA_AUTO:
	case DOS_CPU_ISA_SCALAR:
		return 1;
#ifndef DOS_CPU_X86_64
	default:
		return 0; /* the SIMD tables are built for x86-64 only */
	}
#else
	case DOS_CPU_ISA_AVX2:
		return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
		       __builtin_cpu_supports("f16c");
	case DOS_CPU_ISA_AVX512:
		return dos_cpu_isa_supported(DOS_CPU_ISA_AVX2) && __builtin_cpu_supports("avx512f") &&
		       __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
	}
	return 0;
#endif
}

const char *dos_cpu_isa_name(enum dos_cpu_isa isa)
{
	switch (isa) {
	case DOS_CPU_ISA_AUTO:
		return "auto";
	case DOS_CPU_ISA_SCALAR:
		return "scalar";
	case DOS_CPU_ISA_AVX2:
		return "avx2";
	case DOS_CPU_ISA_AVX512:
		return "avx512";
	}
	return "invalid";
}

static const struct _dos_cpu_kernels *table_for(enum dos_cpu_isa isa)
{
#ifndef DOS_CPU_X86_64
	(void)isa;
	return &_dos_cpu_kernels_scalar;
#else
	switch (isa) {
	case DOS_CPU_ISA_AVX512:
		return &_dos_cpu_kernels_avx512;
	case DOS_CPU_ISA_AVX2:
		return &_dos_cpu_kernels_avx2;
	case DOS_CPU_ISA_SCALAR:
		return &_dos_cpu_kernels_scalar;
	case DOS_CPU_ISA_AUTO:
		break;
	}
	if (dos_cpu_isa_supported(DOS_CPU_ISA_AVX512))
		return &_dos_cpu_kernels_avx512;
	if (dos_cpu_isa_supported(DOS_CPU_ISA_AVX2))
		return &_dos_cpu_kernels_avx2;
	return &_dos_cpu_kernels_scalar;
#endif
}

int dos_cpu_isa_select(enum dos_cpu_isa isa)
{
	if (strcmp(dos_cpu_isa_name(isa), "invalid") == 0)
		return DOS_FAIL(-EINVAL, "isa = %d is not an enum dos_cpu_isa value", (int)isa);
	if (!dos_cpu_isa_supported(isa))
		return DOS_FAIL(-ENOTSUP, "isa = %s is not supported by this CPU", dos_cpu_isa_name(isa));
	atomic_store(&selected, table_for(isa));
	return 0;
}

int _dos_cpu_isa_from_env(enum dos_cpu_isa *isa, char *why, size_t size)
{
	const char *name = getenv("DOS_CPU_ISA");
	*isa = DOS_CPU_ISA_AUTO;
	if (!name || !*name)
		return 0;
	for (int i = DOS_CPU_ISA_AUTO; i <= DOS_CPU_ISA_AVX512; i++)
		if (strcmp(name, dos_cpu_isa_name((enum dos_cpu_isa)i)) == 0) {
			if (!dos_cpu_isa_supported((enum dos_cpu_isa)i)) {
				snprintf(why, size, "DOS_CPU_ISA = '%s' is not supported by this CPU", name);
				return -ENOTSUP;
			}
			*isa = (enum dos_cpu_isa)i;
			return 0;
		}
	snprintf(why, size, "DOS_CPU_ISA = '%s' is not one of auto, scalar, avx2, avx512", name);
	return -EINVAL;
}

/* DOS_CPU_ISA, read at the first kernel call; a bad or unsupported value is reported and
 * the best supported variant used instead, so a typo never stops a training run. A
 * warning, not an error: it happens in a worker, and no call returns it to the program. */
static const struct _dos_cpu_kernels *table_from_environment(void)
{
	enum dos_cpu_isa isa;
	char why[160];
	if (_dos_cpu_isa_from_env(&isa, why, sizeof why) != 0)
		_dos_warn("%s; using auto", why);
	return table_for(isa);
}

const struct _dos_cpu_kernels *_dos_cpu_kernels_selected(void)
{
	const struct _dos_cpu_kernels *k = atomic_load(&selected);
	if (!k) {
		const struct _dos_cpu_kernels *fresh = table_from_environment();
		/* first caller wins; a racing dos_cpu_isa_select() keeps its choice */
		if (!atomic_compare_exchange_strong(&selected, &k, fresh))
			return k;
		k = fresh;
	}
	return k;
}

enum dos_cpu_isa dos_cpu_isa_selected(void)
{
	return _dos_cpu_kernels_selected()->isa;
}
