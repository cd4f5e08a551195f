#!/usr/bin/env bash
# Prepares a build folder from a fresh checkout: dependencies (tools/deps.sh), autoreconf
# when configure is missing or older than its inputs, and configure when the folder has
# no Makefile or was configured against another StarPU. Used by the top-level GNUmakefile.
#
# Usage: tools/bootstrap.sh BUILD_DIR [--simgrid|--smpi] [configure arguments...]
#        --simgrid: build against the SimGrid variant of StarPU (simulated machines)
#        --smpi: build against the SMPI variant (simulated clusters, tools/sim-cluster.sh):
#                compiled by SimGrid's smpicc, our library static like StarPU there, so
#                that SMPI gives each simulated rank its own copy of every global
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:?usage: tools/bootstrap.sh BUILD_DIR [configure arguments...]}
shift

prefix=$("$top"/tools/deps.sh --print-prefix native)
simgrid_prefix=$("$top"/tools/deps.sh --print-prefix simgrid)
starpu_source=$("$top"/tools/deps.sh --print-source)
extra="--with-starpu-simgrid=$simgrid_prefix --with-starpu-source=$starpu_source"
if [[ ${1:-} == --simgrid ]]; then
	shift
	prefix=$simgrid_prefix
	extra=--disable-cuda
elif [[ ${1:-} == --smpi ]]; then
	shift
	prefix=$("$top"/tools/deps.sh --print-prefix smpi)
	# smpicc links shared objects for smpirun to load, but configure's test programs must
	# run: SMPI_PRETEND_CC=1 (kept by configure for its reruns) makes them ordinary ones;
	# it also prints a notice where libtool looks for the linker, hence LD
	extra="--disable-cuda --disable-shared --with-mpi CC=smpicc LD=ld SMPI_PRETEND_CC=1"
fi

cd "$top"
if [[ ! -x configure || configure.ac -nt configure || Makefile.am -nt Makefile.in ]]; then
	echo "bootstrap: autoreconf" >&2
	autoreconf -fi >&2
fi

mkdir -p "$build"
cd "$build"
wanted="--with-starpu=$prefix $extra $*"
if [[ ! -f Makefile || ! -f .configured-with || $(cat .configured-with) != "$wanted" ]]; then
	built_before=0
	[[ -f Makefile ]] && built_before=1
	echo "bootstrap: configure $wanted in $build" >&2
	# shellcheck disable=SC2086 # the arguments are words on purpose
	"$top"/configure $wanted >&2
	# Objects built against another StarPU must go: their dependencies name that StarPU's
	# headers, which still exist, so make would keep them, and a StarPU built with other
	# limits (STARPU_NMAXWORKERS follows --enable-maxcudadev) has another ABI.
	if [[ $built_before == 1 ]]; then
		echo "bootstrap: make clean (configured against another StarPU before)" >&2
		make clean >/dev/null
	fi
	echo "$wanted" >.configured-with
fi
