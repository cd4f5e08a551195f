#!/usr/bin/env bash
# Packs what tools/device-check.sh needs on the lent GPU machine, which has CUDA and
# Python but no StarPU, no Debian packages and no network: our built tests and
# benchmark (the real binaries, not libtool wrappers), our library, StarPU's library and
# tools, every shared library they load that such a machine may lack, and the golden
# vectors. The run tool carries the folder with the checkout (64 MiB in all); this script
# checks that size.
#
# Usage: tools/make-device-bundle.sh BUNDLE_DIR STARPU_PREFIX BUILD_DIR
set -euo pipefail
bundle=${1:?usage: make-device-bundle.sh BUNDLE_DIR STARPU_PREFIX BUILD_DIR}
starpu=${2:?STARPU_PREFIX missing}
build=${3:?BUILD_DIR missing}
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
limit_mib=60

rm -rf "$bundle"
mkdir -p "$bundle"/{bin,lib,tests,share/golden,share/data,share/tests/reference}

# The real ELF file behind a libtool-built program.
real_binary() {
	local dir base
	dir=$(dirname "$1")
	base=$(basename "$1")
	if [[ -x $dir/.libs/$base ]]; then echo "$dir/.libs/$base"; else echo "$1"; fi
}

for t in "$build"/tests/test_*; do
	[[ -x $t && ! $t == *.* ]] || continue
	cp "$(real_binary "$t")" "$bundle/tests/$(basename "$t")"
done
cp "$(real_binary "$build/dos-bench")" "$bundle/bin/dos-bench"
cp "$(real_binary "$build/dos-train")" "$bundle/bin/dos-train"
# test_train.sh sources test_lib.sh from its own folder
cp "$top"/tests/test_train.sh "$top"/tests/test_lib.sh "$bundle/tests/"
for tool in starpu_machine_display starpu_calibrate_bus starpu_perfmodel_display; do
	cp "$starpu/bin/$tool" "$bundle/bin/"
done
cp -P "$build"/.libs/libstarpu-dos.so* "$bundle/lib/"
cp -P "$starpu"/lib/libstarpu-1.4.so* "$bundle/lib/"
cp "$top"/tests/golden/adam_torch.bin "$bundle/share/golden/"
# what dos-train and the model tests read, laid out as in the source tree (DOS_SOURCE_DIR)
cp "$top"/data/corpus.txt "$bundle/share/data/"
cp "$top"/tests/reference/model_torch_tiny.bin "$bundle/share/tests/reference/"

# Shared libraries the binaries load, except the C runtime, the GPU driver and the CUDA
# toolkit libraries (StarPU links cuBLAS, cuSPARSE, cuSOLVER: about 900 MB), which the
# device machine provides; tools/device-check.sh finds them there.
is_system_lib() {
	case $1 in
	libc.so* | libm.so* | libdl.so* | librt.so* | libpthread.so* | ld-linux* | libgcc_s.so* | libstdc++.so* | \
		libcu*.so* | libnv*.so*) return 0 ;;
	esac
	return 1
}
for f in "$bundle"/bin/* "$bundle"/tests/test_* "$bundle"/lib/*.so*; do
	[[ $f == *.sh ]] && continue # ldd fails on scripts, and set -e ends the loop
	LD_LIBRARY_PATH="$bundle/lib:$starpu/lib" ldd "$f" 2>/dev/null | awk '/=> \// {print $1, $3}'
done | sort -u | while read -r name path; do
	is_system_lib "$name" || [[ -e $bundle/lib/$name ]] || cp -L "$path" "$bundle/lib/$name"
done

# Debug information is most of StarPU's size (12 of its 14 MB) and of ours, and serves
# nothing there: without stripping it the bundle outgrew the limit once StarPU-MPI came
# in. The symbol tables stay (backtraces still name functions).
find "$bundle/bin" "$bundle/tests" "$bundle/lib" -type f ! -name '*.sh' -exec strip --strip-debug {} +

# The limit is on everything that travels: the bundle plus the checkout's own files.
size_kib=$(du -sk --apparent-size "$bundle" | cut -f1)
tree_kib=$(cd "$top" && git ls-files -co --exclude-standard -z 2>/dev/null |
	du -ck --apparent-size --files0-from=- 2>/dev/null | tail -n 1 | cut -f1)
tree_kib=${tree_kib:-0}
echo "device bundle: $bundle, $((size_kib / 1024)) MiB, $(ls "$bundle/lib" | wc -l) libraries;" \
	"with the checkout's $((tree_kib / 1024)) MiB: $(((size_kib + tree_kib) / 1024)) MiB travel"
if ((size_kib + tree_kib > limit_mib * 1024)); then
	echo "device bundle and checkout are over ${limit_mib} MiB together: the run tool carries at most 64 MiB" >&2
	exit 1
fi
