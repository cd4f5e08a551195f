#!/bin/sh
# dos-train's checkpoint folder belongs to one run and one process at a time
# (graph/checkpoint.h):
#  1. a fresh run in a folder holding another run's checkpoints refuses before any step,
#     naming the folder and the files and saying what to do, and leaves them as they were
#     (it used to train, delete the other run's files by retention, and let a later
#     --resume continue the other run); with only damaged checkpoints there, it does not
#     advise --resume, which finds none that loads;
#  2. a second process on a folder in use is refused, told the holder's pid; the first
#     ends as it would alone, and after a SIGKILL the folder is free at once;
#  3. temporary files of killed saves are removed when a run takes the folder;
#  4. --resume loads the newest checkpoint that verifies, saying which newer ones it
#     passed over and why (a damaged one, an empty stray "checkpoint-<2^64-1>.dos"), and
#     ends bit-identical to the uninterrupted run; the run's damaged one is renamed
#     "<name>.damaged", so that retention keeps the older one that loaded;
#  5. a folder that does not exist is created with its parents;
#  6. a folder on a full disk (a tmpfs with room for one checkpoint, not two): the save
#     that fails says how big a checkpoint is, what the file system has free and how many
#     the folder needs room for (it said "No space left on device" alone), removes its
#     temporary file and leaves the checkpoint before it whole. Needs root and a mount
#     namespace (unshare -m): skipped, with a line saying so, without them.
set -u
train=./dos-train
# shellcheck source=tests/test_lib.sh
. "$(dirname "$0")/test_lib.sh"
tiny="--preset tiny --quiet"

# ---- 1. a fresh run refuses another run's folder ------------------------------------------
# shellcheck disable=SC2086 # $tiny is a word list
$train $tiny --steps 6 --seed 1 --checkpoint-dir "$work/other" --checkpoint-every 3 >"$work/log" 2>&1 ||
	fail "the first run failed: $(cat "$work/log")"
(cd "$work/other" && ls -l checkpoint-*) >"$work/before"
# shellcheck disable=SC2086
if $train $tiny --steps 4 --seed 7 --checkpoint-dir "$work/other" --checkpoint-every 1 >"$work/log" 2>&1; then
	fail "a fresh run trained in a folder holding another run's checkpoints"
fi
for want in "checkpoint folder $work/other holds 2 checkpoint files of another run" checkpoint-3.dos \
	checkpoint-6.dos "the latest after step 6" "with --resume" "another --checkpoint-dir"; do
	grep -qF -- "$want" "$work/log" || fail "the refusal lacks '$want': $(cat "$work/log")"
done
grep -q '^step' "$work/log" && fail "the refused run trained: $(cat "$work/log")"
(cd "$work/other" && ls -l checkpoint-*) >"$work/after"
cmp -s "$work/before" "$work/after" || fail "the refused run changed the folder: $(cat "$work/after")"
# the same with --checkpoint-every left out (a save only at the end) and with shards' names
: >"$work/other/checkpoint-9.shard-0-of-2.dos"
# shellcheck disable=SC2086
$train $tiny --steps 2 --checkpoint-dir "$work/other" >"$work/log" 2>&1 && fail "a fresh run took a folder with a shard"
grep -q "3 checkpoint files of another run\|checkpoint-9.shard-0-of-2.dos" "$work/log" ||
	fail "the shard is not named: $(cat "$work/log")"
rm "$work/other/checkpoint-9.shard-0-of-2.dos"
# only damaged checkpoints: --resume finds none that loads, so the refusal does not send the
# user there (it did: each refusal pointed to the other)
mkdir "$work/empties" && : >"$work/empties/checkpoint-4.dos" && : >"$work/empties/checkpoint-5.dos"
# shellcheck disable=SC2086
$train $tiny --steps 2 --checkpoint-dir "$work/empties" --resume >"$work/log" 2>&1 &&
	fail "--resume took a folder of empty checkpoints"
grep -q 'none of the 2 checkpoints' "$work/log" || fail "--resume on damaged checkpoints: $(cat "$work/log")"
# shellcheck disable=SC2086
$train $tiny --steps 2 --checkpoint-dir "$work/empties" >"$work/log" 2>&1 &&
	fail "a fresh run took a folder of empty checkpoints"
grep -q 'cannot be read .*nothing that can be resumed; move them away' "$work/log" &&
	! grep -q -- '--resume' "$work/log" || fail "the refusal of damaged checkpoints: $(cat "$work/log")"
echo "a fresh run refuses a folder with another run's checkpoints, naming them, and changes nothing;"
echo "  one of damaged checkpoints alone is not sent to --resume"

# ---- 2. one process at a time -------------------------------------------------------------
# (the holder runs long enough for the second to start StarPU and reach the folder)
# shellcheck disable=SC2086
$train $tiny --steps 800 --checkpoint-dir "$work/busy" --checkpoint-every 1 --dump "$work/alone.bin" \
	>"$work/first.log" 2>&1 &
first=$!
# until it holds the folder and has saved (retention keeps only the two latest: any will do)
until_saved() {
	for _ in $(seq 1 200); do
		ls "$1"/checkpoint-*.dos >/dev/null 2>&1 && return
		sleep 0.05
	done
}
until_saved "$work/busy"
# shellcheck disable=SC2086
if $train $tiny --steps 3 --checkpoint-dir "$work/busy" --resume >"$work/second.log" 2>&1; then
	fail "a second process used a folder in use"
fi
grep -qF "checkpoint folder $work/busy is in use by another process (pid $first on" "$work/second.log" ||
	fail "the second process was not told the holder: $(cat "$work/second.log")"
wait $first || fail "the first process failed: $(cat "$work/first.log")"
# shellcheck disable=SC2086
$train $tiny --steps 800 --dump "$work/straight.bin" >"$work/log" 2>&1 || fail "straight run failed"
cmp -s "$work/alone.bin" "$work/straight.bin" || fail "the first process's result differs from a run alone"
# shellcheck disable=SC2086
$train $tiny --steps 200 --dump "$work/straight.bin" >"$work/log" 2>&1 || fail "straight run failed"
# a holder killed with SIGKILL: the kernel frees the folder, the next run resumes at once
# shellcheck disable=SC2086
$train $tiny --steps 200 --checkpoint-dir "$work/killed" --checkpoint-every 1 >/dev/null 2>&1 &
pid=$!
until_saved "$work/killed"
kill -9 $pid || fail "the run to kill ended before it was killed"
wait $pid 2>/dev/null
# shellcheck disable=SC2086
$train $tiny --steps 200 --checkpoint-dir "$work/killed" --resume --dump "$work/resumed.bin" >"$work/log" 2>&1 ||
	fail "resuming after SIGKILL of the holder failed: $(cat "$work/log")"
cmp -s "$work/resumed.bin" "$work/straight.bin" || fail "resumed after SIGKILL: the result differs"
echo "one process at a time: the second is told the holder's pid; a SIGKILL frees the folder"

# ---- 3. temporaries of killed saves ---------------------------------------------------------
: >"$work/killed/.checkpoint-17.dos.tmp-4242"
: >"$work/killed/.checkpoint-17.shard-1-of-2.dos.tmp-4242"
: >"$work/killed/notes.tmp-1"
# shellcheck disable=SC2086
$train $tiny --steps 201 --checkpoint-dir "$work/killed" --resume >"$work/log" 2>&1 ||
	fail "resume with stale temporaries failed: $(cat "$work/log")"
ls -a "$work/killed" | grep -q '\.tmp-4242' && fail "stale temporaries left: $(ls -a "$work/killed")"
[ -f "$work/killed/notes.tmp-1" ] || fail "a file that is not a save's temporary was removed"
echo "stale temporaries of killed saves removed when the folder is taken, nothing else"

# ---- 4. resume from the newest checkpoint that verifies -------------------------------------
ck=$work/damaged
# shellcheck disable=SC2086
# (150 steps of the 200-step run: its learning-rate schedule, which --steps sets by default)
$train $tiny --steps 150 --warmup 20 --decay-steps 200 --checkpoint-dir "$ck" --checkpoint-every 50 >"$work/log" 2>&1 ||
	fail "run failed: $(cat "$work/log")"
# the newest damaged in its middle (one bit), an empty stray beyond every step
python3 -c 'import sys; p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[len(b) // 2] ^= 1; open(p, "wb").write(b)' \
	"$ck/checkpoint-150.dos"
: >"$ck/checkpoint-18446744073709551615.dos"
# shellcheck disable=SC2086
$train $tiny --steps 200 --checkpoint-dir "$ck" --resume --dump "$work/resumed.bin" >"$work/log" 2>&1 ||
	fail "resume past damaged checkpoints failed: $(cat "$work/log")"
grep -q "resumed after step 100 from $ck/checkpoint-100.dos" "$work/log" || fail "$(cat "$work/log")"
grep -q "skipping $ck/checkpoint-150.dos: .*corrupted" "$work/log" &&
	grep -q "skipping $ck/checkpoint-18446744073709551615.dos: .*truncated: 0 bytes" "$work/log" ||
	fail "the skipped checkpoints are not reported: $(cat "$work/log")"
cmp -s "$work/resumed.bin" "$work/straight.bin" || fail "resumed past damaged checkpoints: the result differs"
# the run's damaged one is set aside, so that retention (two kept) keeps 100, which loads,
# beside 200, and not the damaged 150 (it kept 150 and deleted 100 before)
grep -q "renamed checkpoint-150.dos.damaged" "$work/log" || fail "the damaged checkpoint was not set aside: $(cat "$work/log")"
[ -f "$ck/checkpoint-200.dos" ] && [ -f "$ck/checkpoint-100.dos" ] && [ -f "$ck/checkpoint-150.dos.damaged" ] &&
	[ ! -e "$ck/checkpoint-150.dos" ] || fail "after resuming past a damaged checkpoint: $(ls "$ck")"
# nothing that loads: every reason given
rm "$ck"/checkpoint-[12][05]0.dos
# shellcheck disable=SC2086
$train $tiny --steps 200 --checkpoint-dir "$ck" --resume >"$work/log" 2>&1 && fail "resumed from nothing"
grep -q "none of the 1 checkpoints in $ck loads" "$work/log" || fail "$(cat "$work/log")"
echo "--resume: from the newest checkpoint that verifies, past a damaged one (set aside) and an empty stray, bit-identical"

# ---- 5. created with its parents --------------------------------------------------------
# shellcheck disable=SC2086
$train $tiny --steps 2 --checkpoint-dir "$work/new/deep/folder" >"$work/log" 2>&1 ||
	fail "a folder to create: $(cat "$work/log")"
[ -f "$work/new/deep/folder/checkpoint-2.dos" ] || fail "no checkpoint in the created folder"
echo "a missing checkpoint folder is created with its parents"

# ---- 6. a full disk ---------------------------------------------------------------------
# A tmpfs of 600 KiB holds one tiny checkpoint (392 KiB), not two: the save after step 2
# fails. Mounted in a mount namespace of its own, which ends with the command: nothing
# stays mounted, whatever happens to the test.
full=$work/full
mkdir "$full"
if [ "$(id -u)" = 0 ] && unshare -m sh -c "mount -t tmpfs -o size=600k tmpfs '$full'" 2>/dev/null; then
	# shellcheck disable=SC2016 # expanded by the inner shell, from its arguments
	unshare -m sh -c '
		full=$1 train=$2
		mount -t tmpfs -o size=600k tmpfs "$full" || exit 1
		$train --preset tiny --quiet --steps 3 --checkpoint-dir "$full/ck" --checkpoint-every 1 \
			>"$full.log" 2>&1
		echo "exit $?" >>"$full.log"
		ls -A "$full/ck" >"$full.ls"
		wc -c <"$full/ck/checkpoint-1.dos" >"$full.size"
		$train --preset tiny --quiet --steps 1 --checkpoint-dir "$full/ck" --resume >"$full.resume" 2>&1' \
		sh "$full" "$train" || fail "the full-disk run could not be set up: $(cat "$full.log")"
	size=$(tr -d ' ' <"$full.size")
	grep -q '^exit 1$' "$full.log" || fail "full disk: not exit 1: $(cat "$full.log")"
	for want in "cannot write $full/ck/.checkpoint-2.dos.tmp-" "write: No space left on device" \
		"a checkpoint takes $size bytes (0.4 MiB), the file system of $full/ck has " \
		"the folder keeps the run's 2 latest checkpoints" \
		"it needs room for 3 checkpoints, $((3 * size)) bytes (1.1 MiB)"; do
		grep -qF -- "$want" "$full.log" || fail "full disk: no '$want' in: $(cat "$full.log")"
	done
	[ "$(tr '\n' ' ' <"$full.ls")" = ".starpu-dos.lock checkpoint-1.dos " ] ||
		fail "full disk: the folder holds $(cat "$full.ls")"
	grep -q "resumed after step 1 from $full/ck/checkpoint-1.dos" "$full.resume" ||
		fail "full disk: checkpoint-1.dos does not load: $(cat "$full.resume")"
	echo "a full disk: the failed save gives the sizes, removes its temporary, keeps the checkpoint before it"
else
	echo "(a full disk not checked: a tmpfs cannot be mounted here, as $(id -un))"
fi
