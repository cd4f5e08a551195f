#!/bin/sh
# A tile-based training code (examples/tile_app.c, NNTile's pattern: StarPU-allocated
# variable handles for every tile, one task per tile, its own starpu_init with dmdasd)
# trains bit-identically whichever route its Adam takes to starpu-dos, and under the dos
# policy every route plans each step exactly once (tile_app checks the plan counts):
#   api      the API over its variable handles, subgroups following the tiles;
#   api-ctx  the same in the application's own dos context, with its tasks;
#   task     dos_adam tasks on its own tiles in its dos context;
#   zero     its own Adam codelet, unchanged, planned by the dos policy loaded with
#            STARPU_SCHED_LIB and registered by DOS_UPDATE_CODELETS;
#   import   3 steps of its own Adam under dmdasd, then dos_opt_write_state and the API;
# against the reference, the API over vector handles with subgroups across tiles.
set -u
app=./examples/tile_app
lib=$(pwd)/.libs/libstarpu-dos.so
# shellcheck source=tests/test_lib.sh
. "$(dirname "$0")/test_lib.sh"

run() { # name, then environment assignments and the command
	name=$1
	shift
	env "$@" >"$work/$name.log" 2>&1
	status=$?
	[ $status = 77 ] && exit 77
	[ $status = 0 ] || fail "$name: $* failed ($status): $(cat "$work/$name.log")"
	grep "^tile_app:" "$work/$name.log"
}
same() { # a, b
	cmp -s "$work/$1.bin" "$work/$2.bin" || fail "$1 and $2 differ"
}

run vector $app --route vector --dump "$work/vector.bin"
for route in api api-ctx task import; do
	run $route DOS_SCHED_VERBOSE=1 $app --route $route --dump "$work/$route.bin"
	same vector $route
done
# tile_app under dmdasd alone: its own Adam, the same bits
run own $app --route zero --dump "$work/own.bin"
same vector own
if [ -f "$lib" ]; then
	run zero STARPU_SCHED_LIB="$lib" STARPU_SCHED=dos DOS_SCHED_VERBOSE=2 \
		DOS_UPDATE_CODELETS="tile_adam_step:grad=0,m=1,v=2,weight=3" $app --route zero --dump "$work/zero.bin"
	same vector zero
	# one plan for each step but the first, which an unchanged code does not announce
	# (tile_app checks the totals)
	for step in 2 3 4 5 6 7 8; do
		plans=$(grep -c "plan of step $step at" "$work/zero.log")
		[ "$plans" = 1 ] || fail "zero: step $step planned $plans times: $(cat "$work/zero.log")"
	done
	# waits after every step and within the first (codes that wait after each operation or
	# iteration): the first step is planned in two parts, the next ones once each, their
	# size counted over the whole step
	run zero-waits STARPU_SCHED_LIB="$lib" STARPU_SCHED=dos DOS_SCHED_VERBOSE=2 \
		DOS_UPDATE_CODELETS="tile_adam_step:grad=0,m=1,v=2,weight=3" $app --route zero --waits \
		--dump "$work/zero-waits.bin"
	same vector zero-waits
	for step in 1 2 3 4 5 6 7 8; do
		plans=$(grep -c "plan of step $step at" "$work/zero-waits.log")
		most=1
		[ $step = 1 ] && most=2
		[ "$plans" -ge 1 ] && [ "$plans" -le $most ] ||
			fail "zero-waits: step $step planned $plans times: $(cat "$work/zero-waits.log")"
	done
	# without the registration the same program is not planned at all: the count is not vacuous
	run unregistered STARPU_SCHED_LIB="$lib" STARPU_SCHED=dos DOS_SCHED_VERBOSE=1 $app --route zero
	grep -q " 0 steps planned" "$work/unregistered.log" ||
		fail "unregistered: expected no plan: $(cat "$work/unregistered.log")"
	# a malformed registration is named, not silently ignored
	env STARPU_SCHED_LIB="$lib" STARPU_SCHED=dos DOS_UPDATE_CODELETS="tile_adam_step:grad=0,m=1" \
		$app --route zero >"$work/malformed.log" 2>&1
	grep -q "DOS_UPDATE_CODELETS entry 'tile_adam_step:grad=0,m=1' ignored" "$work/malformed.log" ||
		fail "malformed: no message: $(cat "$work/malformed.log")"
else
	echo "no $lib (built with --disable-shared?): the zero-code route is not checked"
fi
echo "tile_app: api, api-ctx, task, zero-code, import and vector routes bit-identical after 8 steps"

# the comparisons are not vacuous: one step fewer ends elsewhere
run short $app --route api --steps 7 --dump "$work/short.bin"
cmp -s "$work/vector.bin" "$work/short.bin" && fail "7 and 8 steps ended identical"
exit 0
