#!/usr/bin/env bash
# Builds GPGPU-Sim, a functional simulator that executes the PTX nvcc emits on the CPU, so
# that our CUDA kernels run on machines without a GPU (tests/gpusim_lane.sh). A test tool
# only: GPGPU-Sim's licence allows non-commercial use, so it is never shipped and never
# copied into this repository; it is built from a source folder holding the upstream
# archive and its patches, into the cache beside StarPU's builds, keyed by everything that
# goes into it. A second run with nothing changed only checks and prints.
#
# Usage: tools/gpusim.sh             build (or reuse) it, print its prefix
#        tools/gpusim.sh --source    print the source folder used, or say on stderr why
#                                    there is none and exit 3 (1 for a GPGPUSIM_SOURCE
#                                    that holds no archive)
#        tools/gpusim.sh --env PROG_LIB   print the environment (shell exports) that runs a
#                                    program on the simulator; PROG_LIB is the file holding
#                                    the program's kernels (the simulator reads PTX there)
# Environment: GPGPUSIM_SOURCE (the source folder; else <top>/../shared/tools/gpgpu-sim,
#   else /work/shared/tools/gpgpu-sim), STARPU_DOS_CACHE, STARPU_DOS_JOBS (see deps.sh).
#
# The prefix holds:
#   lib/libcudart.so.13  the simulator linked with tools/gpusim/cuda13_runtime.c under
#                        CUDA 13's soname and symbol versions, so that StarPU and our
#                        library, built by CUDA 13's nvcc, load it in place of NVIDIA's
#   cuda/bin             the CUDA_INSTALL_PATH the simulator runs tools from: CUDA 13's
#                        ptxas (register counts), cuobjdump 13 (PTX extraction, followed by
#                        tools/gpusim/ptx_fixup.py), and a version-only nvcc
#   bin/ldd              ldd as the simulator's CUDA version check must see it (below)
#   config/              the simulated GPU (an RTX 3070 in functional mode)
set -euo pipefail

log() { printf 'gpusim: %s\n' "$*" >&2; }
die() {
	printf 'gpusim: error: %s\n' "$*" >&2
	exit 1
}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
top=$(cd "$here/.." && pwd)
cache=${STARPU_DOS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/starpu-dos}
jobs=${STARPU_DOS_JOBS:-$(nproc)}
cuda_home=${CUDA_HOME:-/usr/local/cuda}

# Pinned: the simulator is built against CUDA 11.8's runtime headers (it refuses newer
# ones); cuobjdump 13 reads the fatbins of CUDA 13's nvcc (the toolkit here has none).
wheel_runtime=nvidia-cuda-runtime-cu11==11.8.89
wheel_nvcc=nvidia-cuda-nvcc-cu11==11.8.89
wheel_cuobjdump=nvidia-cuda-cuobjdump==13.2.51
apt_packages=(bison flex zlib1g-dev xutils-dev libgl-dev python3 python3-pip)

find_source() {
	local d
	for d in "${GPGPUSIM_SOURCE:-}" "$top/../shared/tools/gpgpu-sim" /work/shared/tools/gpgpu-sim; do
		[[ -n $d ]] || continue
		if compgen -G "$d/gpgpu-sim_distribution-*.tar.gz" >/dev/null; then
			(cd "$d" && pwd)
			return 0
		fi
		[[ $d == "${GPGPUSIM_SOURCE:-}" ]] && die "GPGPUSIM_SOURCE=$d holds no gpgpu-sim_distribution-*.tar.gz"
	done
	return 1
}

as_root() {
	if [[ $(id -u) == 0 ]]; then
		"$@"
	elif command -v sudo >/dev/null; then
		sudo "$@"
	else
		die "need root to run: $*"
	fi
}

install_packages() {
	local missing=() p
	for p in "${apt_packages[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
	done
	# python3-pip is only wanted when no pip came with python3 (e.g. pyenv's)
	if python3 -m pip --version >/dev/null 2>&1; then
		missing=("${missing[@]/python3-pip/}")
	fi
	mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sed '/^$/d')
	[[ ${#missing[@]} == 0 ]] && return 0
	log "apt-get install ${missing[*]}"
	as_root apt-get update -qq >&2
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=600 "${missing[@]}" >&2
}

fetch_wheels() {
	local dir=$cache/gpgpu-sim-wheels
	if [[ ! -f $dir/.complete-$1 ]]; then
		mkdir -p "$dir"
		log "pip download ${*:2}"
		python3 -m pip download -q --no-deps -d "$dir" "${@:2}" >&2 ||
			die "pip download ${*:2} failed (the simulator's CUDA headers and cuobjdump come from PyPI)"
		touch "$dir/.complete-$1"
	fi
	printf '%s' "$dir"
}

# One wheel's files (a zip) under dest.
unpack_wheel() {
	local pattern=$1 dest=$2 w
	w=$(compgen -G "$pattern" | head -n 1) || die "no wheel matching $pattern"
	python3 -m zipfile -e "$w" "$dest"
}

# The simulator's build tree, keyed by the archive, the patches, the compiler and the
# CUDA 11.8 headers.
build_simulator() {
	local src=$1 archive key dir wheels
	archive=$(compgen -G "$src/gpgpu-sim_distribution-*.tar.gz" | head -n 1)
	key=$( {
		sha256sum "$archive" | cut -d' ' -f1
		cat "$src"/patches/*.patch
		gcc --version | head -n 1
		echo "$wheel_runtime $wheel_nvcc"
	} | sha256sum | cut -c1-12)
	dir=$cache/gpgpu-sim-$key
	if [[ -f $dir/.built ]]; then
		printf '%s' "$dir"
		return 0
	fi
	wheels=$(fetch_wheels cuda118 "$wheel_runtime" "$wheel_nvcc")
	rm -rf "$dir"
	mkdir -p "$dir/cuda118/bin" "$dir/wheel" "$dir/src"
	unpack_wheel "$wheels/nvidia_cuda_runtime_cu11-*.whl" "$dir/wheel"
	unpack_wheel "$wheels/nvidia_cuda_nvcc_cu11-*.whl" "$dir/wheel"
	cp -r "$dir/wheel/nvidia/cuda_runtime/include" "$dir/cuda118/include"
	cp -rn "$dir/wheel/nvidia/cuda_nvcc/include/." "$dir/cuda118/include/"
	rm -rf "$dir/wheel"
	# the build reads the CUDA version from `nvcc --version` and refuses anything past 11.1
	# unless it says 11.x; the headers are 11.8's
	cat >"$dir/cuda118/bin/nvcc" <<'EOF'
#!/bin/sh
# Answers --version only: GPGPU-Sim's build reads the CUDA release from it.
[ "$1" = --version ] || { echo "nvcc stand-in: only --version" >&2; exit 1; }
echo "Cuda compilation tools, release 11.8, V11.8.89"
EOF
	chmod +x "$dir/cuda118/bin/nvcc"
	tar xzf "$archive" -C "$dir/src" --strip-components=1
	local p
	for p in "$src"/patches/*.patch; do
		patch -d "$dir/src" -p1 --silent <"$p" || die "$p does not apply to $(basename "$archive")"
	done
	local logfile=$cache/logs/gpgpu-sim-$key.log
	mkdir -p "$(dirname "$logfile")"
	local patches=("$src"/patches/*.patch)
	log "building GPGPU-Sim ($(basename "$archive"), ${#patches[@]} patches) in $dir; log: $logfile"
	local t0=$SECONDS
	# setup_environment is not `set -u` clean, and calls git on a tree that has none
	if ! (
		set +eu
		export CUDA_INSTALL_PATH=$dir/cuda118
		# shellcheck disable=SC1091 # GPGPU-Sim's own script
		cd "$dir/src" && source setup_environment release && make -j"$jobs"
	) >"$logfile" 2>&1; then
		tail -n 30 "$logfile" >&2
		die "GPGPU-Sim build failed; full log: $logfile"
	fi
	touch "$dir/.built"
	log "built GPGPU-Sim in $((SECONDS - t0)) s"
	printf '%s' "$dir"
}

# What programs run against: keyed by the simulator build, our adapter and fix-ups, and
# the nvcc whose output they read.
build_runtime() {
	local sim=$1 key prefix wheels objdir
	key=$( {
		echo "$sim"
		cat "$here"/gpusim/* "${BASH_SOURCE[0]}"
		"$cuda_home/bin/nvcc" --version
		echo "$wheel_cuobjdump"
	} | sha256sum | cut -c1-12)
	prefix=$sim/runtime-$key
	if [[ -f $prefix/.built ]]; then
		printf '%s' "$prefix"
		return 0
	fi
	wheels=$(fetch_wheels cuobjdump13 "$wheel_cuobjdump")
	# earlier versions of what follows (60 MB each) are not worth keeping
	rm -rf "$sim"/runtime-*
	mkdir -p "$prefix"/{lib,bin,cuda/bin,config,libexec,obj}
	unpack_wheel "$wheels/nvidia_cuda_cuobjdump-*.whl" "$prefix/obj/wheel"
	mv "$prefix/obj/wheel/nvidia/cu13/bin/cuobjdump" "$prefix/libexec/cuobjdump"
	chmod +x "$prefix/libexec/cuobjdump"
	cp "$here/gpusim/ptx_fixup.py" "$prefix/libexec/"
	cp "$sim/cuda118/bin/nvcc" "$prefix/cuda/bin/"
	cat >"$prefix/cuda/bin/cuobjdump" <<EOF
#!/bin/sh
# cuobjdump 13 (PyPI); each PTX file it extracts (-xptx NAME FILE) is then rewritten where
# the simulator cannot parse it (ptx_fixup.py).
'$prefix/libexec/cuobjdump' "\$@" || exit \$?
if [ "\$1" = -xptx ] && [ -f "\$2" ]; then exec python3 '$prefix/libexec/ptx_fixup.py' "\$2"; fi
EOF
	cat >"$prefix/cuda/bin/ptxas" <<EOF
#!/bin/sh
# CUDA 13's ptxas, which the simulator asks for register counts; its -v report loses the
# lines the simulator's parser does not know (", used N barriers", "Compile time"), and
# is complete when this exits (the simulator reads it then).
report=\$(mktemp)
'$cuda_home/bin/ptxas' "\$@" 2>"\$report"
rc=\$?
sed -E 's/, used [0-9]+ barriers//; /Compile time/d' "\$report" >&2
rm -f "\$report"
exit \$rc
EOF
	cat >"$prefix/bin/ldd" <<'EOF'
#!/bin/sh
# The simulator runs `ldd` on the program to check that it was built for the CUDA major
# release of the simulator's headers (11), and stops otherwise. Our programs are CUDA 13
# programs on purpose, run through the CUDA 13 adapter linked into the simulator, so
# libcudart.so.13 is reported to that check as 11.0.
/usr/bin/ldd "$@" | sed 's/libcudart\.so\.13 =>/libcudart.so.11.0 (CUDA 13 on GPGPU-Sim) =>/'
EOF
	chmod +x "$prefix"/bin/* "$prefix"/cuda/bin/* "$prefix"/libexec/*

	# The simulator's objects, with the entry points our adapter replaces or wraps renamed.
	objdir=$(compgen -G "$sim/src/build/gcc-*/cuda-*/release" | head -n 1)
	[[ -n $objdir ]] || die "no object folder under $sim/src/build"
	local objs=() o
	for o in "$objdir"/libcuda/*.o "$objdir"/cuda-sim/*.o "$objdir"/cuda-sim/decuda_pred_table/*.o \
		"$objdir"/gpgpu-sim/*.o "$objdir"/intersim2/*.o "$objdir"/*.o "$objdir"/accelwattch/*.o; do
		[[ -e $o ]] && objs+=("$o")
	done
	objcopy --redefine-sym cudaGetDeviceProperties=gpgpusim_cudaGetDeviceProperties \
		--redefine-sym cudaDeviceGetAttribute=gpgpusim_cudaDeviceGetAttribute \
		--redefine-sym cudaGetDeviceCount=gpgpusim_cudaGetDeviceCount \
		--redefine-sym cudaSetDevice=gpgpusim_cudaSetDevice \
		--redefine-sym cudaGetDevice=gpgpusim_cudaGetDevice \
		--redefine-sym cudaDeviceCanAccessPeer=gpgpusim_cudaDeviceCanAccessPeer \
		"$objdir/libcuda/cuda_runtime_api.o" "$prefix/obj/cuda_runtime_api.o"
	objs=("${objs[@]/$objdir\/libcuda\/cuda_runtime_api.o/$prefix/obj/cuda_runtime_api.o}")
	gcc -c -O2 -fPIC -Wall -Wextra -I"$sim/cuda118/include" "$here/gpusim/device_props_118.c" \
		-o "$prefix/obj/device_props_118.o"
	gcc -c -O2 -fPIC -Wall -Wextra -I"$cuda_home/include" "$here/gpusim/cuda13_runtime.c" \
		-o "$prefix/obj/cuda13_runtime.o"
	# CUDA 13 programs ask for symbols of version libcudart.so.13 (libcublas: .12 too)
	{
		cat "$sim/src/linux-so-version.txt"
		printf 'libcudart.so.12 {\n};\nlibcudart.so.13 {\n};\n'
	} >"$prefix/obj/so-version.txt"
	g++ -shared -Wl,-soname,libcudart.so.13 -Wl,--version-script="$prefix/obj/so-version.txt" \
		"${objs[@]}" "$prefix/obj/device_props_118.o" "$prefix/obj/cuda13_runtime.o" \
		-lm -lz -lGL -pthread -o "$prefix/lib/libcudart.so.13" ||
		die "linking the simulator as libcudart.so.13 failed"
	local cfg=$sim/src/configs/tested-cfgs/SM86_RTX3070
	cp "$cfg"/* "$prefix/config/"
	# functional simulation (no timing model: about 1 M instructions per second)
	sed -i 's/^-gpgpu_ptx_sim_mode 0/-gpgpu_ptx_sim_mode 1/' "$prefix/config/gpgpusim.config"
	grep -q '^-gpgpu_ptx_sim_mode 1' "$prefix/config/gpgpusim.config" ||
		die "$cfg/gpgpusim.config: no -gpgpu_ptx_sim_mode line to switch to functional mode"
	rm -rf "$prefix/obj"
	touch "$prefix/.built"
	printf '%s' "$prefix"
}

# PYTORCH_BIN names the file whose PTX the simulator runs (it reads the program's own file
# otherwise: our kernels are in a library). CUOBJDUMP_SIM_FILE, set to anything, skips a
# pass over pre-CUDA 6 fatbin sections that would find none and stop.
print_env() {
	local prefix=$1 kernels=$2
	[[ -f $kernels ]] || die "--env: no file $kernels (the file holding the program's kernels)"
	kernels=$(cd "$(dirname "$kernels")" && pwd)/$(basename "$kernels")
	cat <<EOF
export CUDA_INSTALL_PATH='$prefix/cuda' PTXAS_CUDA_INSTALL_PATH='$prefix/cuda'
export PATH='$prefix/bin':"\$PATH"
export LD_LIBRARY_PATH='$prefix/lib'\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
export PYTORCH_BIN='$kernels'
export CUOBJDUMP_SIM_FILE=unused
export DOS_GPUSIM_CONFIG='$prefix/config'
EOF
}

mode=${1:-}
case $mode in
"" | --env) ;;
--source)
	find_source || {
		echo "gpusim: no GPGPU-Sim source: GPGPUSIM_SOURCE is unset and neither $(cd "$top/.." && pwd)/shared/tools/gpgpu-sim nor /work/shared/tools/gpgpu-sim holds gpgpu-sim_distribution-*.tar.gz" >&2
		exit 3
	}
	exit 0
	;;
*) die "unknown argument '$mode' (see the usage at the top of $0)" ;;
esac
if [[ $mode == --env && -z ${2:-} ]]; then die "--env needs the file holding the program's kernels"; fi

src=$(find_source) || die "no GPGPU-Sim source: set GPGPUSIM_SOURCE (see $0 --source)"
[[ -x $cuda_home/bin/nvcc ]] || die "no nvcc at $cuda_home/bin (CUDA_HOME): the lane runs what it compiles"
install_packages
# one build at a time (two checkouts' make check may share the cache)
mkdir -p "$cache"
exec 9>"$cache/gpgpu-sim.lock"
flock 9
sim=$(build_simulator "$src")
prefix=$(build_runtime "$sim")
exec 9>&-
if [[ $mode == --env ]]; then
	print_env "$prefix" "$2"
else
	echo "$prefix"
fi
