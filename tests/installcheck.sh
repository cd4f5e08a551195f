#!/usr/bin/env bash
# What a user gets from `make install` (run by `make installcheck`, hence by distcheck):
# a program builds with nothing but `pkg-config --cflags --libs starpu-dos` and runs; an
# unmodified StarPU program runs under STARPU_SCHED_LIB=<installed library>
# STARPU_SCHED=dos; the installed dos-train finds its corpus (and, in the SimGrid build,
# its machines) in the installed data folder, never in the source or build tree.
#
# Usage: tests/installcheck.sh SRCDIR, with the installed folders in the environment:
#   DOS_BINDIR DOS_LIBDIR DOS_PKGCONFIGDIR DOS_PKGDATADIR (where make install put things),
#   STARPU_PKGCONFIGDIR (starpu-1.4.pc, which starpu-dos.pc requires), DOS_TOP_SRCDIR and
#   DOS_TOP_BUILDDIR (absolute: the trees the installed files must not point into),
#   DOS_SIMGRID (yes for the SimGrid build), CC and USER_CFLAGS (e.g. sanitizer flags: a
#   program loading a sanitized library needs the same).
set -euo pipefail
src=${1:?usage: installcheck.sh SRCDIR}
: "${DOS_BINDIR:?} ${DOS_LIBDIR:?} ${DOS_PKGCONFIGDIR:?} ${DOS_PKGDATADIR:?} ${STARPU_PKGCONFIGDIR:?}"
: "${DOS_TOP_SRCDIR:?} ${DOS_TOP_BUILDDIR:?}"
simgrid=${DOS_SIMGRID:-no}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
ok() { echo "ok: $*"; }
fail() {
	echo "FAIL: $*"
	status=1
}

# Only our .pc and StarPU's, as a user with both in private prefixes would set it; the
# system's own folders (hwloc, which starpu-1.4.pc requires) stay on pkg-config's default path.
export PKG_CONFIG_PATH=$DOS_PKGCONFIGDIR:$STARPU_PKGCONFIGDIR
# Runs never touch the user's ~/.starpu.
export STARPU_HOME=$work/starpu-home STARPU_SILENT=1
unset DOS_SOURCE_DIR DOS_MACHINES_DIR STARPU_SCHED STARPU_SCHED_LIB

pkg-config --print-errors --exists starpu-dos || {
	echo "FAIL: pkg-config does not find starpu-dos with PKG_CONFIG_PATH=$PKG_CONFIG_PATH"
	exit 1
}
includedir=$(pkg-config --variable=includedir starpu-dos)
if [[ -f $includedir/dos.h && -f $includedir/dos_version.h ]]; then
	ok "dos.h and dos_version.h installed in $includedir"
else
	fail "dos.h or dos_version.h missing from $includedir"
fi
# starpu-dos.pc gives the run-time search path of both libraries: no LD_LIBRARY_PATH. A
# StarPU program of its own (plain-starpu, built with starpu-1.4.pc alone) finds its StarPU
# as it always does, here by LD_LIBRARY_PATH.
run_env=(env -u LD_LIBRARY_PATH)
starpu_env=(env "LD_LIBRARY_PATH=$(pkg-config --variable=libdir starpu-1.4)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")

# build NAME PACKAGE: examples/NAME.c with the flags pkg-config gives for PACKAGE (the
# compiler's output, full of CUDA deprecation warnings from StarPU's -I, only on failure)
build() {
	# shellcheck disable=SC2046,SC2086 # pkg-config's output and the flags are word lists
	if ${CC:-cc} ${USER_CFLAGS:-} -o "$work/$1" "$src/examples/$1.c" $(pkg-config --cflags --libs "$2") -lm \
		>"$work/cc.log" 2>&1; then
		ok "examples/$1.c builds with pkg-config --cflags --libs $2"
	else
		fail "examples/$1.c does not build with pkg-config --cflags --libs $2:"
		cat "$work/cc.log"
	fi
}
build pkgconfig-user starpu-dos
build plain-starpu starpu-1.4

# A SimGrid StarPU runs programs on a simulated machine only (set up by dos-train's
# --simulate below); the two programs above are then only built.
if [[ $simgrid != yes && $status == 0 ]]; then
	if "${run_env[@]}" "$work/pkgconfig-user" >"$work/out" 2>&1 && grep -q 'as expected' "$work/out"; then
		ok "$(cat "$work/out")"
	else
		fail "pkgconfig-user:"
		cat "$work/out"
	fi
	lib=$DOS_LIBDIR/libstarpu-dos.so
	if [[ ! -f $lib ]]; then
		echo "no $lib (built with --disable-shared?): STARPU_SCHED_LIB not checked"
	elif "${starpu_env[@]}" STARPU_SCHED_LIB="$lib" STARPU_SCHED=dos DOS_SCHED_VERBOSE=1 \
		"$work/plain-starpu" >"$work/out" 2>&1 &&
		grep -q 'starpu-dos: dos: [1-9][0-9]* tasks placed' "$work/out"; then
		ok "plain-starpu under STARPU_SCHED_LIB=$lib STARPU_SCHED=dos: $(grep 'starpu-dos: dos:' "$work/out")"
	else
		fail "plain-starpu under STARPU_SCHED_LIB=$lib STARPU_SCHED=dos:"
		cat "$work/out"
	fi
fi

# dos-train from an empty folder: the data can only come from the installed copy.
mkdir "$work/empty"
corpus=$DOS_PKGDATADIR/corpus.txt
if [[ -f $DOS_PKGDATADIR/machines/h200/sim.env ]]; then
	ok "machine files installed in $DOS_PKGDATADIR/machines"
else
	fail "no machine files in $DOS_PKGDATADIR/machines"
fi
train_args=(--preset tiny --steps 2)
# (the simulated machines have perfmodels for 1b-sized subgroups, not for the tiny model's)
[[ $simgrid == yes ]] && train_args=(--preset 1b --steps 1 --simulate h200)
if (cd "$work/empty" && "$DOS_BINDIR/dos-train" "${train_args[@]}") >"$work/out" 2>&1 &&
	grep -qF "data $corpus" "$work/out" && grep -q '^summary: ' "$work/out"; then
	ok "installed dos-train ${train_args[*]} ran on $corpus"
else
	fail "installed dos-train ${train_args[*]} (expected to read $corpus):"
	cat "$work/out"
fi

# No installed file may lean on the trees it was built from: not in its run-time search
# path, not for its data (the machines' folder was once compiled in as the source tree's).
# Source file names in assertion messages are harmless. The install prefix itself may lie
# inside the source tree (distcheck), hence the exact folder names.
for f in "$DOS_BINDIR/dos-train" "$DOS_BINDIR/dos-bench" "$DOS_LIBDIR/libstarpu-dos.so"; do
	[[ -f $f ]] || continue
	tree_names=(-e "$DOS_TOP_BUILDDIR/" -e "$DOS_TOP_SRCDIR/data/" -e "$DOS_TOP_SRCDIR/sched/machines")
	if readelf -d "$f" | grep -E 'RPATH|RUNPATH' | grep -qF "$DOS_TOP_BUILDDIR"; then
		fail "$f: run-time search path names the build tree: $(readelf -d "$f" | grep -E 'RPATH|RUNPATH')"
	elif readelf -p .rodata "$f" | grep -aqF "${tree_names[@]}"; then
		fail "$f: names the source or build tree: $(readelf -p .rodata "$f" | grep -aF "${tree_names[@]}")"
	else
		ok "$f: no run-time path or data path into the source or build tree"
	fi
done
exit $status
