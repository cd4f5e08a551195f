#!/usr/bin/env bash
# Takes a fresh Debian machine to a built StarPU 1.4: Debian build dependencies from apt,
# StarPU's Debian source package, our patches (tools/patches: CUDA 13, the suballocator's
# empty chunks), and installed variants (native: CUDA when nvcc is there + MPI + FxT;
# simgrid: simulated machines; smpi: simulated machines
# and StarPU-MPI over SimGrid's SMPI, for simulated clusters) in a cache outside the
# source tree, keyed by StarPU version and build flags. native and simgrid are always
# built; smpi only when asked for (--print-prefix smpi, --smpi): only the simulated
# cluster needs it, and it costs another ~3 minutes on 2 cores the first time.
# Idempotent: a second run with nothing changed only checks and prints.
#
# Usage: tools/deps.sh [--smpi]              install everything, print the prefixes
#                                            (--smpi: the smpi variant's too)
#        tools/deps.sh --print-prefix VARIANT  same, then print only that prefix
#                                            (native|simgrid|smpi)
#        tools/deps.sh --packages-only         install the apt packages, build nothing
#        tools/deps.sh --print-source          same as the first, then print StarPU's source folder
# Environment: STARPU_DOS_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/starpu-dos),
#              STARPU_DOS_JOBS (parallel make jobs, default nproc), CUDA_HOME (default
#              /usr/local/cuda when nvcc is not on PATH).
set -euo pipefail

log() { printf 'deps: %s\n' "$*" >&2; }
die() {
	printf 'deps: error: %s\n' "$*" >&2
	exit 1
}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${STARPU_DOS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/starpu-dos}
jobs=${STARPU_DOS_JOBS:-$(nproc)}
patch_file=$here/patches/starpu-1.4-cuda13-compute-mode.patch
smpi_patch_file=$here/patches/starpu-1.4-smpi-byte-messages.patch
release_chunks_patch_file=$here/patches/starpu-1.4-release-free-chunks.patch

print_variant=""
packages_only=0
want_smpi=0
case "${1:-}" in
"") ;;
--smpi) want_smpi=1 ;;
--print-prefix)
	print_variant=${2:-}
	[[ $print_variant == native || $print_variant == simgrid || $print_variant == smpi ]] ||
		die "--print-prefix takes 'native', 'simgrid' or 'smpi', got '${print_variant}'"
	[[ $print_variant == smpi ]] && want_smpi=1
	;;
--packages-only) packages_only=1 ;;
--print-source) print_variant=source ;;
*) die "unknown argument '$1' (see the usage at the top of $0)" ;;
esac

# Everything StarPU's variants need to build, plus what our own build and tests use
# (libsimgrid-dev brings SMPI's smpicc and smpirun; starpu_smpirun needs xsltproc).
apt_packages=(
	build-essential autoconf automake libtool pkg-config dpkg-dev patch
	libhwloc-dev hwloc libopenmpi-dev openmpi-bin libfxt-dev libsimgrid-dev xsltproc
	libopenblas-dev python3 clang-format valgrind
)

as_root() {
	if [[ $(id -u) == 0 ]]; then
		"$@"
	elif command -v sudo >/dev/null; then
		sudo "$@"
	else
		die "need root to run: $* (run as root, install sudo, or bring your own StarPU 1.4: see README)"
	fi
}

apt_updated=0
apt_update_once() {
	if [[ $apt_updated == 0 ]]; then
		log "apt-get update"
		as_root apt-get update -qq >&2
		apt_updated=1
	fi
}

install_packages() {
	local missing=() p
	for p in "${apt_packages[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
	done
	[[ ${#missing[@]} == 0 ]] && return 0
	apt_update_once
	log "apt-get install ${missing[*]}"
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
}

# Highest StarPU 1.4.x source version the configured deb-src entries offer, or nothing.
starpu_source_version() {
	local best="" v
	for v in $(apt-cache showsrc starpu 2>/dev/null | sed -n 's/^Version: //p'); do
		[[ $v == 1.4.* ]] || continue
		if [[ -z $best ]] || dpkg --compare-versions "$v" gt "$best"; then best=$v; fi
	done
	printf '%s' "$best"
}

# Adds a deb-src entry for one suite (source only: nothing from it is ever installed).
add_deb_src() {
	local suite=$1
	log "adding a deb-src entry for Debian $suite (StarPU 1.4 source)"
	as_root tee /etc/apt/sources.list.d/starpu-dos-src-"$suite".sources >/dev/null <<EOF
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: $suite
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
	apt_updated=0
	apt_update_once
}

find_starpu_source_version() {
	local v suite
	v=$(starpu_source_version)
	for suite in sid trixie; do
		[[ -n $v ]] && break
		add_deb_src "$suite"
		v=$(starpu_source_version)
	done
	[[ -n $v ]] || die "no StarPU 1.4.x source package found in sid or trixie (apt-cache showsrc starpu)"
	printf '%s' "$v"
}

# Applies our CUDA 13 patch where the source still reads cudaDeviceProp.computeMode, and
# the suballocator's release of empty chunks under memory pressure (the patch's header).
patch_source() {
	local src=$1
	patch -d "$src" -p1 --silent <"$release_chunks_patch_file" ||
		die "$release_chunks_patch_file does not apply to StarPU in $src: update the patch"
	log "applied $(basename "$release_chunks_patch_file")"
	if ! grep -q 'props\[devid\]\.computeMode' "$src"/src/drivers/cuda/driver_cuda.c; then
		log "CUDA 13 compute-mode patch not needed (source does not read cudaDeviceProp.computeMode)"
		return 0
	fi
	patch -d "$src" -p1 --dry-run --silent <"$patch_file" >/dev/null ||
		die "$patch_file no longer applies to StarPU in $src, and the source still reads cudaDeviceProp.computeMode (removed in CUDA 13): update the patch"
	patch -d "$src" -p1 --silent <"$patch_file"
	log "applied $(basename "$patch_file")"
}

# The source, extracted and patched once per set of patches (a changed patch, a fresh copy).
fetch_source() {
	local version=$1 dir
	dir=$cache/src/$version-$(cat "$release_chunks_patch_file" "$patch_file" | sha256sum | cut -c1-12)
	if [[ ! -f $dir/.extracted ]]; then
		rm -rf "$dir"
		mkdir -p "$dir"
		log "apt-get source starpu=$version"
		# _apt cannot write into root-owned cache folders; the warning about that is harmless.
		(cd "$dir" && apt-get source -qq "starpu=$version" >&2 2>/dev/null) ||
			die "apt-get source starpu=$version failed"
		local src
		src=$(find "$dir" -mindepth 1 -maxdepth 1 -type d -name 'starpu-*' | head -n 1)
		[[ -n $src ]] || die "apt-get source left no starpu-* folder in $dir"
		patch_source "$src"
		touch "$dir/.extracted"
	fi
	find "$dir" -mindepth 1 -maxdepth 1 -type d -name 'starpu-*' | head -n 1
}

# The smpi variant's source: a copy of the patched source with the SMPI patch on top, in a
# folder named after that patch (the other variants keep building from the shared one).
smpi_source() {
	local src=$1 version=$2 dir
	dir=$(dirname "$src")-smpi-$(sha256sum <"$smpi_patch_file" | cut -c1-12)
	if [[ ! -f $dir/.patched ]]; then
		rm -rf "$dir"
		mkdir -p "$dir"
		cp -a "$src" "$dir/"
		patch -d "$dir/$(basename "$src")" -p1 --silent <"$smpi_patch_file" ||
			die "$smpi_patch_file does not apply to StarPU $version: update the patch"
		log "applied $(basename "$smpi_patch_file") (smpi variant)"
		touch "$dir/.patched"
	fi
	printf '%s' "$dir/$(basename "$src")"
}

nvcc_path() {
	if command -v nvcc >/dev/null; then
		command -v nvcc
	elif [[ -x ${CUDA_HOME:-/usr/local/cuda}/bin/nvcc ]]; then
		printf '%s' "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc"
	fi
}

# Switches we never use: they cost build time or pull in dependencies. StarPU's default of
# 4 CUDA devices per process would hide half of an 8-GPU node (and of its simulated ones).
common_flags=(
	--enable-maxcpus=256 --enable-maxcudadev=8 --with-fxt --disable-opencl --disable-hip --disable-fortran
	--disable-socl --disable-starpufft --disable-starpupy --disable-build-doc
	--disable-build-examples --disable-build-tests --disable-openmp --enable-blas-lib=none
)

variant_flags() {
	local variant=$1 nvcc
	case $variant in
	native)
		nvcc=$(nvcc_path)
		if [[ -n $nvcc ]]; then
			printf '%s\n' "${common_flags[@]}" --enable-mpi --enable-cuda --with-cuda-dir="$(dirname "$(dirname "$nvcc")")"
		else
			printf '%s\n' "${common_flags[@]}" --enable-mpi --disable-cuda
		fi
		;;
	# The simulated machines only need StarPU itself: MPI stays off here.
	simgrid) printf '%s\n' "${common_flags[@]}" --enable-simgrid --disable-cuda --disable-mpi ;;
	# StarPU-MPI over SMPI (StarPU's doc, "MPI Applications" under SimGrid): SMPI runs
	# every rank in one process and privatises each rank's copy of the program's globals,
	# which works only for a static library; configure takes smpicc and smpirun itself
	# (CC stays the plain compiler). FxT would need a static -fPIC libfxt: off; so is
	# the MLR perfmodel code, which we do not use.
	smpi)
		printf '%s\n' "${common_flags[@]/#--with-fxt/--without-fxt}" --enable-simgrid --enable-mpi --disable-cuda \
			--disable-shared --enable-static --disable-mlr
		;;
	esac
}

# Builds and installs one variant unless a finished build with the same key is cached.
build_variant() {
	local variant=$1 version=$2 src=$3 flags key prefix builddir logfile
	mapfile -t flags < <(variant_flags "$variant")
	key=$( {
		printf '%s\n' "$version" "${flags[@]}"
		cat "$patch_file" "$release_chunks_patch_file"
		if [[ $variant == smpi ]]; then cat "$smpi_patch_file"; fi
		if [[ $variant == native && -n $(nvcc_path) ]]; then "$(nvcc_path)" --version; fi
	} | sha256sum | cut -c1-12)
	prefix=$cache/starpu-$version-$variant-$key
	if [[ -f $prefix/share/starpu-dos-build.txt ]]; then
		printf '%s' "$prefix"
		return 0
	fi
	builddir=$cache/build/$variant-$key
	logfile=$cache/logs/starpu-$version-$variant-$key.log
	rm -rf "$builddir" "$prefix"
	mkdir -p "$builddir" "$(dirname "$logfile")"
	log "building StarPU $version ($variant) into $prefix; log: $logfile"
	if ! (cd "$builddir" && "$src"/configure --prefix="$prefix" "${flags[@]}" &&
		make -j"$jobs" && make install) >"$logfile" 2>&1; then
		tail -n 40 "$logfile" >&2
		die "StarPU $variant build failed; full log: $logfile"
	fi
	{
		echo "StarPU Debian source version: $version"
		echo "variant: $variant"
		echo "configure flags: ${flags[*]}"
		echo "patch: $(basename "$patch_file")"
		echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m)"
	} >"$prefix/share/starpu-dos-build.txt"
	rm -rf "$builddir"
	log "built StarPU $version ($variant) in $SECONDS s"
	printf '%s' "$prefix"
}

# One process at a time past this point: two builds sharing the cache (two checkouts
# running `make check` at once) would each rm -rf the other's half-built prefix. The lock
# is released when this script exits.
mkdir -p "$cache"
exec 9>"$cache/starpu.lock"
if ! flock -n 9; then
	log "waiting for another tools/deps.sh using $cache to finish"
	flock 9
fi
install_packages
[[ $packages_only == 1 ]] && exit 0
version=$(find_starpu_source_version)
src=$(fetch_source "$version")
native=$(build_variant native "$version" "$src")
simgrid=$(build_variant simgrid "$version" "$src")
smpi=
if [[ $want_smpi == 1 ]]; then
	smpi_src=$(smpi_source "$src" "$version")
	smpi=$(build_variant smpi "$version" "$smpi_src")
fi
case $print_variant in
native) echo "$native" ;;
simgrid) echo "$simgrid" ;;
smpi) echo "$smpi" ;;
source) echo "$src" ;;
*)
	echo "StarPU $version"
	echo "native prefix:  $native"
	echo "simgrid prefix: $simgrid"
	[[ -z $smpi ]] || echo "smpi prefix:    $smpi"
	;;
esac
