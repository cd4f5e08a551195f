#!/usr/bin/env bash
# dos against dmda on StarPU's own cholesky, lu and sgemm examples, run unmodified under
# STARPU_SCHED_LIB=<our library>: each program's own timing (its "ms" column), the
# median of REPEATS runs per policy, and the ratio dos / dmda, twice: with empty
# performance models (every run starts from a home holding only the bus calibration:
# a first run) and with calibrated ones (every run starts from the same copy of models
# that earlier runs calibrated, three under each policy: dos also uses combined workers,
# which cholesky's parallel tasks of its last quarter may run on, and dmda never
# calibrates those). The dos and dmda runs alternate, so that a change in the machine's
# load hits both.
#
# Usage: tools/bench-starpu-examples.sh [BUILD_DIR]   (default: build)
# Environment: REPEATS (default 5), PROGRAMS (default "cholesky_implicit lu_implicit
# sgemm"), CHOLESKY_ARGS, LU_ARGS, SGEMM_ARGS (the programs' arguments), MODELS (default
# "empty calibrated"), STARPU_PREFIX and STARPU_SOURCE (default: what tools/deps.sh prints).
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$(cd "${1:-$top/build}" && pwd)
lib=$build/.libs/libstarpu-dos.so
[[ -f $lib ]] || {
	echo "no $lib: build the library first (make -C $build)" >&2
	exit 2
}
prefix=${STARPU_PREFIX:-$("$top"/tools/deps.sh --print-prefix native)}
src=${STARPU_SOURCE:-$("$top"/tools/deps.sh --print-source)}/examples
repeats=${REPEATS:-5}
declare -A args=(
	[cholesky_implicit]=${CHOLESKY_ARGS:--size 3840 -nblocks 12}
	[lu_implicit]=${LU_ARGS:--size 3840 -nblocks 12}
	[sgemm]=${SGEMM_ARGS:--size 1920 -nblocks 6 -iter 5}
)
read -r -a programs <<<"${PROGRAMS:-cholesky_implicit lu_implicit sgemm}"
read -r -a models_list <<<"${MODELS:-empty calibrated}"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The examples, built as StarPU's examples/Makefile.am builds them, against the
# system's CBLAS (OpenBLAS on Debian: libopenblas-dev) and, when StarPU has CUDA, the
# CUDA libraries their GPU kernels call.
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
cflags="$(pkg-config --cflags starpu-1.4) -O2 -w -DSTARPU_OPENBLAS=1 -DSTARPU_HAVE_BLAS=1 -I$src -I$src/common"
cflags+=" $(pkg-config --cflags-only-I openblas 2>/dev/null || true)"
libs="$(pkg-config --libs starpu-1.4) -Wl,-rpath,$prefix/lib -lopenblas -lm"
if grep -q 'define STARPU_USE_CUDA 1' "$prefix/include/starpu/1.4/starpu_config.h"; then
	cuda=${CUDA_HOME:-/usr/local/cuda}
	libs+=" -L$cuda/lib64 -Wl,-rpath,$cuda/lib64 -lcublas -lcusolver -lcudart"
fi
# shellcheck disable=SC2086 # word lists on purpose
{
	cc $cflags -o "$work/cholesky_implicit" "$src/cholesky/cholesky_implicit.c" "$src/cholesky/cholesky_models.c" \
		"$src/cholesky/cholesky_kernels.c" "$src/sched_ctx_utils/sched_ctx_utils.c" "$src/common/blas.c" $libs
	cc $cflags -o "$work/lu_implicit" "$src/lu/lu_example_float.c" "$src/lu/slu_implicit.c" \
		"$src/lu/slu_implicit_pivot.c" "$src/lu/slu_kernels.c" "$src/common/blas.c" $libs
	cc $cflags -o "$work/sgemm" "$src/mult/sgemm.c" "$src/common/blas.c" $libs
}

# One BLAS thread per StarPU worker; our library for STARPU_SCHED=dos (dmda ignores it).
export OPENBLAS_NUM_THREADS=1 STARPU_SILENT=1 STARPU_SCHED_LIB=$lib

# run PROGRAM POLICY HOME: the program's time in ms, from a private copy of HOME.
run() {
	local prog=$1 policy=$2 home=$work/run ms
	rm -rf "$home"
	cp -r "$3" "$home"
	# shellcheck disable=SC2086
	ms=$(STARPU_HOME=$home STARPU_SCHED=$policy "$work/$prog" ${args[$prog]} 2>/dev/null |
		awk '!/^#/ && NF >= 2 { print $(NF - 1); exit }')
	[[ -n $ms ]] || {
		echo "$prog under $policy printed no timing" >&2
		exit 1
	}
	echo "$ms"
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }

# Homes: the bus calibration alone, and the same with calibrated codelet models.
mkdir -p "$work/empty" "$work/calibrated"
STARPU_HOME=$work/empty STARPU_SCHED=dmda "$work/sgemm" -size 64 -nblocks 1 -iter 1 >/dev/null 2>&1
rm -rf "$work/empty/.starpu/sampling/codelets"
cp -r "$work/empty/." "$work/calibrated"
for prog in "${programs[@]}"; do
	for policy in dmda dos dmda dos dmda dos; do
		# shellcheck disable=SC2086
		STARPU_HOME=$work/calibrated STARPU_CALIBRATE=1 STARPU_SCHED=$policy "$work/$prog" ${args[$prog]} \
			>/dev/null 2>&1
	done
done

echo "StarPU examples, dos against dmda: median of $repeats runs each, alternating ($(nproc) cores;" \
	"$(uname -n); $(date -u +%Y-%m-%d))"
printf '%-18s %-10s %10s %10s %8s   %s\n' program models "dos ms" "dmda ms" ratio "runs (dos | dmda)"
for models in "${models_list[@]}"; do
	for prog in "${programs[@]}"; do
		dos=() dmda=()
		for ((r = 0; r < repeats; r++)); do
			for policy in $( ((r % 2 == 0)) && echo dos dmda || echo dmda dos); do
				ms=$(run "$prog" "$policy" "$work/$models")
				if [[ $policy == dos ]]; then dos+=("$ms"); else dmda+=("$ms"); fi
			done
		done
		mdos=$(printf '%s\n' "${dos[@]}" | median)
		mdmda=$(printf '%s\n' "${dmda[@]}" | median)
		printf '%-18s %-10s %10s %10s %8.3f   %s | %s\n' "$prog" "$models" "$mdos" "$mdmda" \
			"$(awk -v a="$mdos" -v b="$mdmda" 'BEGIN { print a / b }')" "${dos[*]}" "${dmda[*]}"
	done
done
