#!/bin/sh
# Installing into a prefix of one's own, the way the README says (the top-level
# `make install PREFIX=DIR` runs `make install prefix=DIR` here, in the build folder):
#  1. starpu-dos.pc names DIR (it named the configured prefix, /usr/local, so that
#     programs did not build against it);
#  2. the README's fit.c, taken from README.md, builds with the README's command (nothing
#     but pkg-config, PKG_CONFIG_PATH naming the two .pc folders) and runs from an empty
#     folder without LD_LIBRARY_PATH, printing what the README says it prints;
#  3. the installed dos-train runs from an empty folder, and from one whose data/ and
#     ../data/ hold a corpus of their own, on its installed corpus (it used to read the
#     working folder's);
#  4. the uninstalled dos-train, run from an empty folder, finds its source tree's corpus;
#     a copy outside any tree says what to do (--data, DOS_SOURCE_DIR).
# Needs STARPU_PKGCONFIGDIR (starpu-1.4.pc's folder), CC and USER_CFLAGS (the build's
# sanitizer flags: a program loading a sanitized library needs them too) from make check.
set -u
train=./dos-train
# shellcheck source=tests/test_lib.sh
. "$(dirname "$0")/test_lib.sh"
src=${DOS_SOURCE_DIR:?the source tree}
prefix=$work/prefix
# a make of its own, not a job of the make running the tests
env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL "${MAKE:-make}" install prefix="$prefix" >"$work/install.log" 2>&1 ||
	fail "make install prefix=$prefix failed: $(tail -n 30 "$work/install.log")"

# ---- 1. the .pc ---------------------------------------------------------------------------
pc=$prefix/lib/pkgconfig/starpu-dos.pc
grep -qx "prefix=$prefix" "$pc" && grep -qx "libdir=$prefix/lib" "$pc" || fail "$pc does not name $prefix: $(cat "$pc")"
echo "starpu-dos.pc names the prefix given to make install"

# ---- 2. the README's program, built and run as the README says ---------------------------
mkdir "$work/fit"
awk '/save it as `fit.c`/ {want = 1} want && /^```$/ && body {exit} body {print} want && /^```c$/ {body = 1}' \
	"$src/README.md" >"$work/fit/fit.c"
grep -q 'dos_opt_submit_step' "$work/fit/fit.c" || fail "no fit.c in README.md"
build=$(grep -m1 '^    cc fit.c' "$src/README.md" | sed 's/^    cc /${CC:-cc} ${USER_CFLAGS:-} /')
run=$(grep -m1 '^    ./fit ' "$src/README.md")
[ -n "$build" ] && [ -n "$run" ] || fail "README.md has no 'cc fit.c' or './fit' line"
expected=$(echo "$run" | sed 's/.*# //')
(
	unset LD_LIBRARY_PATH
	export PKG_CONFIG_PATH="$prefix/lib/pkgconfig:$STARPU_PKGCONFIGDIR"
	cd "$work/fit" && eval "$build" >cc.log 2>&1 || { cat cc.log; exit 1; }
	mkdir empty && cd empty && ../fit >../out 2>&1
) || fail "fit.c: $(cat "$work/fit/out" 2>/dev/null)"
grep -qxF "$expected" "$work/fit/out" || fail "fit printed '$(cat "$work/fit/out")', the README says '$expected'"
echo "the README's fit.c builds from the installed starpu-dos.pc alone and prints '$expected'"

# the installed header in a C++ program of before C++17 (its loss-scale cap was a
# hexadecimal floating constant, an error there), when a C++ compiler is at hand
if command -v "${CXX:-c++}" >/dev/null 2>&1; then
	printf '#include <dos.h>\nint main() { return DOS_LOSS_SCALE_MAX > 1e38 ? 0 : 1; }\n' >"$work/fit/cxx11.cpp"
	(
		export PKG_CONFIG_PATH="$prefix/lib/pkgconfig:$STARPU_PKGCONFIGDIR"
		# shellcheck disable=SC2046
		"${CXX:-c++}" -std=c++11 -pedantic-errors -fsyntax-only "$work/fit/cxx11.cpp" \
			$(pkg-config --cflags starpu-dos) >"$work/fit/cxx.log" 2>&1
	) || fail "dos.h in C++11: $(cat "$work/fit/cxx.log")"
	echo "the installed dos.h compiles as C++11 with -pedantic-errors"
fi

# ---- 3. the installed dos-train reads its installed corpus -------------------------------
corpus=$prefix/share/starpu-dos/corpus.txt
mkdir -p "$work/empty" "$work/decoy/here/data" "$work/decoy/data"
head -c 5000 "$src/data/corpus.txt" | tr 'a-z' 'b-za' >"$work/decoy/data/corpus.txt"
cp "$work/decoy/data/corpus.txt" "$work/decoy/here/data/corpus.txt"
for dir in "$work/empty" "$work/decoy/here"; do
	(cd "$dir" && env -u LD_LIBRARY_PATH -u DOS_SOURCE_DIR "$prefix/bin/dos-train" --preset tiny --steps 2 --quiet) \
		>"$work/log" 2>&1 || fail "the installed dos-train in $dir: $(cat "$work/log")"
	grep -qF "data $corpus" "$work/log" || fail "the installed dos-train in $dir did not read $corpus: $(cat "$work/log")"
done
echo "the installed dos-train reads $corpus, also from a folder with a data/corpus.txt of its own"

# ---- 4. the uninstalled dos-train ---------------------------------------------------------
here=$(pwd)
(cd "$work/empty" && env -u DOS_SOURCE_DIR "$here/dos-train" --preset tiny --steps 1 --quiet) >"$work/log" 2>&1 ||
	fail "this build's dos-train from an empty folder: $(cat "$work/log")"
grep -q "data .*/data/corpus.txt" "$work/log" && ! grep -q "data $work" "$work/log" ||
	fail "this build's dos-train did not find the source tree's corpus: $(cat "$work/log")"
# (unless a starpu-dos installed at the configured prefix has a corpus for it)
configured=$(printf 'print-pkgdatadir:\n\t@echo $(pkgdatadir)\n' |
	env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL "${MAKE:-make}" -s -f Makefile -f - print-pkgdatadir)
if [ -x .libs/dos-train ] && [ -n "$configured" ] && [ ! -e "$configured/corpus.txt" ]; then
	mkdir "$work/alone"
	cp .libs/dos-train "$work/alone/"
	(cd "$work/alone" && env -u DOS_SOURCE_DIR LD_LIBRARY_PATH="$here/.libs" ./dos-train --preset tiny --steps 1) \
		>"$work/log" 2>&1 && fail "a dos-train outside any tree found a corpus: $(cat "$work/log")"
	grep -q -- "--data FILE" "$work/log" && grep -q "DOS_SOURCE_DIR" "$work/log" ||
		fail "a dos-train without its corpus did not say what to do: $(cat "$work/log")"
fi
echo "the uninstalled dos-train finds its source tree from an empty folder, or says to use --data or DOS_SOURCE_DIR"
