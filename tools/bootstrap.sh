#!/usr/bin/env bash
# Prepares a build folder from a fresh checkout: dependencies (tools/deps.sh), autoreconf
# when configure is missing or older than its inputs, and configure when the folder has
# no Makefile or was configured against another StarPU. Used by the top-level GNUmakefile.
#
# Usage: tools/bootstrap.sh BUILD_DIR [--simgrid] [configure arguments...]
#        --simgrid: build against the SimGrid variant of StarPU (simulated machines)
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
	echo "bootstrap: configure $wanted in $build" >&2
	# shellcheck disable=SC2086 # the arguments are words on purpose
	"$top"/configure $wanted >&2
	echo "$wanted" >.configured-with
fi
