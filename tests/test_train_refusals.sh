#!/bin/sh
# dos-train refuses what cannot work before any work, naming the option (or variable) and
# the value, and reads numbers in base 10 only:
#  1. every output is checked before StarPU starts: --plot (an SVG file name, in a folder
#     that takes files), --dump, --trace (a folder; a file there is refused),
#     --checkpoint-dir (one that cannot take files), all named with their path;
#  2. --data must be a regular file: a FIFO would block, a folder fail late;
#  3. STARPU_SCHED naming no policy is refused as --policy is (StarPU would run its
#     default and say nothing), and the header names the policy that runs;
#  4. STARPU_NCPU=0 says what starpu_init's failure means and which setting caused it;
#  5. numbers are decimal: --steps 010 is ten steps, --seed 010 seed ten, 0x3 refused;
#     Adam's hyperparameters, the schedule, clipping, the subgroup size and the held-out
#     fraction out of range are refused before StarPU starts, naming the option (--beta1,
#     --clip, not hp->beta1, clip_norm); a --warmup longer than --steps is warned of;
#  6. the environment: StarPU's worker counts that StarPU would abort on (STARPU_NCPU=-1,
#     =abc), a STARPU_WATCHDOG_TIMEOUT that is not a number of microseconds (it turned the
#     watchdog off, or stopped the run as stuck after 10 us), an unusable DOS_CPU_ISA (it
#     was reported nowhere), the policies' settings out of range (each policy warned and
#     ran with its default), a STARPU_HOME or STARPU_PERF_MODEL_DIR where StarPU cannot
#     keep its models (it aborted), all refused before StarPU starts; and the library's warnings
#     reach the user of dos-train (a folder that cannot be locked);
#  7. standard output that cannot be written (a full disk) fails the run.
set -u
train=./dos-train
# shellcheck source=tests/test_lib.sh
. "$(dirname "$0")/test_lib.sh"

# refused OPTION-OR-TEXT... -- ARGS: exits 2, prints each text, and never started StarPU
# (the header comes after it) nor trained
refused() {
	texts=
	while [ "$1" != -- ]; do
		texts="$texts
$1"
		shift
	done
	shift
	if timeout 60 $train --preset tiny --steps 2 --quiet "$@" >"$work/log" 2>&1; then
		fail "dos-train $* was accepted"
	fi
	echo "$texts" | while IFS= read -r want; do
		[ -z "$want" ] || grep -qF -- "$want" "$work/log" || fail "dos-train $*: no '$want' in: $(cat "$work/log")"
	done || exit 1
	grep -q 'model (V\|^step\|^summary' "$work/log" && fail "dos-train $*: refused after starting: $(cat "$work/log")"
	return 0
}

# ---- 1. outputs -------------------------------------------------------------------------
# (a folder of the test's own, which nothing else can create meanwhile: we may run as root)
refused "--plot '$work/missing/x.svg'" "the folder $work/missing" -- --plot "$work/missing/x.svg"
refused "--plot '$work'" "ending in .svg" -- --plot "$work"
mkdir "$work/dir.svg"
refused "--plot '$work/dir.svg'" "is a folder" -- --plot "$work/dir.svg"
refused "--plot ''" "empty" -- --plot ""
refused "--plot '$work/x.png'" "the picture is SVG" -- --plot "$work/x.png"
refused "--dump '$work/missing/x'" "the folder $work/missing" -- --dump "$work/missing/x"
refused "--dump '$work'" "is a folder" -- --dump "$work"
: >"$work/file"
if $train --preset tiny --steps 1 --quiet --trace "$work/t" >"$work/log" 2>&1 || ! grep -q 'without FxT' "$work/log"; then
	refused "--trace $work/file" "not a folder" -- --trace "$work/file"
	refused "--trace $work/file/sub" "not a folder" -- --trace "$work/file/sub"
fi
refused "--checkpoint-dir $work/file" "not a folder" -- --checkpoint-dir "$work/file"
if [ "$(id -u)" = 0 ]; then # root writes anywhere a mode allows: a folder of sysfs does not take files
	refused "--checkpoint-dir /sys/kernel" "cannot create files in the folder /sys/kernel" -- --checkpoint-dir /sys/kernel
else
	mkdir "$work/ro" && chmod a-w "$work/ro"
	refused "--checkpoint-dir $work/ro" "cannot create files in the folder $work/ro" -- --checkpoint-dir "$work/ro"
fi
# a file's folder is not made for it, and nothing is made before the refusal
refused "--plot '$work/p/q/last.svg'" "the folder $work/p/q" -- --plot "$work/p/q/last.svg" --checkpoint-dir "$work/c/d"
[ -e "$work/p" ] || [ -e "$work/c" ] && fail "a refused run made folders: $(ls "$work")"
# and what is right is written where it was asked, folders made with their parents
$train --preset tiny --steps 2 --quiet --plot "$work/last.SVG" --dump "$work/out.bin" --checkpoint-dir "$work/c/d" \
	>"$work/log" 2>&1 || fail "good outputs refused: $(cat "$work/log")"
[ -s "$work/last.SVG" ] && [ -s "$work/out.bin" ] && [ -f "$work/c/d/checkpoint-2.dos" ] ||
	fail "outputs missing: $(ls -R "$work")"
echo "outputs: --plot, --dump, --trace and --checkpoint-dir checked before StarPU starts, each named with its path"

# ---- 2. --data --------------------------------------------------------------------------
mkfifo "$work/fifo"
refused "--data $work/fifo" "not a regular file" "FIFO" -- --data "$work/fifo"
refused "--data $work" "not a regular file" "folder" -- --data "$work"
refused "--data $work/none" "No such file" -- --data "$work/none"
# too small for one sequence of the tiny preset (16 tokens and a target), or for its
# held-out part: refused from the file's size, before StarPU starts (they stopped the run
# once the model was built)
head -c 11 "$(dirname "$0")/../data/corpus.txt" >"$work/eleven.txt"
refused "the data file $work/eleven.txt has 11 bytes, fewer than seq_len + 1 = 17" -- --data "$work/eleven.txt"
head -c 2000 "$(dirname "$0")/../data/corpus.txt" >"$work/small.txt"
refused "--eval-fraction = 0.01 of the 2000-byte corpus" "1 held-out sequences of 16 tokens (need a micro-batch of 4)" \
	-- --data "$work/small.txt" --eval-fraction 0.01
$train --preset tiny --steps 2 --quiet --data "$work/small.txt" --eval-fraction 0.1 >"$work/log" 2>&1 ||
	fail "a 2000-byte corpus with a tenth held out refused: $(cat "$work/log")"
echo "--data: a FIFO, a folder, a missing file, a file shorter than a sequence and a held-out part smaller" \
	"than a micro-batch refused at once"

# ---- 3. STARPU_SCHED ----------------------------------------------------------------------
export STARPU_SCHED=nonsense
refused "STARPU_SCHED = 'nonsense': not one of ours nor a StarPU policy" "dmda" --
unset STARPU_SCHED
refused "--policy = 'nonsense'" "StarPU would run" -- --policy nonsense
STARPU_SCHED=eager $train --preset tiny --steps 1 --quiet >"$work/log" 2>&1 || fail "STARPU_SCHED=eager failed"
grep -q 'policy eager,' "$work/log" || fail "STARPU_SCHED=eager: header $(grep steps "$work/log")"
STARPU_SCHED=all-cpu $train --preset tiny --steps 1 --quiet --policy dmda >"$work/log" 2>&1 ||
	fail "STARPU_SCHED=all-cpu (ours) failed: $(cat "$work/log")"
grep -q 'policy all-cpu,' "$work/log" || fail "STARPU_SCHED=all-cpu: header $(grep steps "$work/log")"
echo "STARPU_SCHED: an unknown name refused, ours and StarPU's run and are reported"

# ---- 4. no worker -------------------------------------------------------------------------
if STARPU_NCPU=0 STARPU_NCUDA=0 $train --preset tiny --steps 1 --quiet >"$work/log" 2>&1; then
	fail "STARPU_NCPU=0 ran"
fi
grep -q 'found no worker' "$work/log" && grep -q 'STARPU_NCPU=0' "$work/log" ||
	fail "STARPU_NCPU=0: $(cat "$work/log")"
echo "STARPU_NCPU=0: the failure explained, the setting named"

# ---- 5. base 10 ---------------------------------------------------------------------------
$train --preset tiny --steps 010 --quiet >"$work/log" 2>&1 || fail "--steps 010: $(cat "$work/log")"
grep -q '10 steps of' "$work/log" || fail "--steps 010: $(grep 'steps of' "$work/log")"
$train --preset tiny --steps 09 --quiet >"$work/log" 2>&1 && grep -q '9 steps of' "$work/log" ||
	fail "--steps 09: $(cat "$work/log")"
for opt in "--steps 0x3" "--seed 0x10" "--subgroup-size 1e3" "--steps +3" "--steps ' 3'" "--eval-batches 2k" \
	"--steps 99999999999999999999"; do
	eval "set -- $opt"
	refused "--${1#--} = '$2': expected a whole number in base 10" -- "$@"
done
$train --preset tiny --steps 2 --quiet --seed 010 --dump "$work/a.bin" >/dev/null 2>&1 &&
	$train --preset tiny --steps 2 --quiet --seed 10 --dump "$work/b.bin" >/dev/null 2>&1 &&
	$train --preset tiny --steps 2 --quiet --seed 8 --dump "$work/c.bin" >/dev/null 2>&1 || fail "--seed runs failed"
cmp -s "$work/a.bin" "$work/b.bin" && ! cmp -s "$work/a.bin" "$work/c.bin" || fail "--seed 010 is not seed 10"
export DOS_STRIDE_K=0x3
refused "DOS_STRIDE_K = '0x3' is not a whole number in base 10 in [1, 1000000]" -- --policy stride
unset DOS_STRIDE_K
echo "numbers: decimal only (010 is ten; hexadecimal, signs, spaces, exponents refused), options and variables"
# Adam's hyperparameters out of range: refused before StarPU starts, under the option's
# name (the library's rule; the run stopped after building the model, naming hp->beta1)
refused "--beta1 = 1 must be in [0, 1)" -- --beta1 1
refused "--beta2 = -0.5 must be in [0, 1)" -- --beta2 -0.5
refused "--lr = -1 must be finite and >= 0" -- --lr -1
refused "--eps = 0 must be finite and > 0" -- --eps 0
refused "--weight-decay = -0.1 must be finite and >= 0" -- --weight-decay -0.1
# the other settings the library has a rule for, the same way (they named clip_norm,
# eval_fraction, eval_every, lr_schedule.min_ratio, subgroup_size, after StarPU's start)
refused "--clip = -1 must be finite and >= 0" -- --clip -1
refused "--eval-fraction = 1 must be 0 (nothing held out) or in (0, 0.5]" -- --eval-fraction 1
refused "--eval-every = 5 needs held-out data: --eval-fraction is 0" -- --eval-fraction 0 --eval-every 5
refused "--min-lr-ratio = 2 must be in [0, 1]" -- --min-lr-ratio 2
refused "--decay-steps = 2 must be 0 (no decay) or above --warmup = 5" -- --warmup 5 --decay-steps 2
refused "--subgroup-size = 100000000 must be in [1, 33440]" -- --subgroup-size 100000000
refused "--subgroup-layout = 'packed': neither tensors nor flat" -- --subgroup-layout packed
# a scale no float holds made the first step's gradient scale infinite, after StarPU's start
refused "--loss-scale = 1e+300: dynamic loss scaling needs a scale in [1, 2^127" -- --loss-scale 1e300 --precision fp16
echo "hyperparameters, schedule, clipping, subgroup size, held-out data: out-of-range values refused before StarPU starts, naming the option"
# a warmup longer than the run is a choice, but the rate never reaches --lr: said before
# StarPU starts (it was said nowhere), unless DOS_QUIET=1 silences warnings
env -u DOS_QUIET $train --preset tiny --steps 2 --quiet --warmup 1000000 >"$work/log" 2>&1 ||
	fail "--warmup 1000000 --steps 2 refused: $(cat "$work/log")"
sed -n 1p "$work/log" | grep -qF 'dos-train: warning: --warmup 1000000 is more than --steps 2: the learning rate never reaches --lr 0.003, only 6e-09' ||
	fail "--warmup 1000000 --steps 2: no warning first in: $(cat "$work/log")"
DOS_QUIET=1 $train --preset tiny --steps 2 --quiet --warmup 1000000 >"$work/log" 2>&1 && ! grep -q warning "$work/log" ||
	fail "--warmup 1000000 with DOS_QUIET=1: $(cat "$work/log")"
env -u DOS_QUIET $train --preset tiny --steps 2 --quiet --warmup 2 >"$work/log" 2>&1 && ! grep -q warning "$work/log" ||
	fail "--warmup 2 --steps 2 warned: $(cat "$work/log")"
echo "--warmup longer than --steps: a warning naming both, before StarPU starts"

# ---- 6. the environment -------------------------------------------------------------------
for setting in STARPU_NCPU=-1 STARPU_NCPU=abc STARPU_NCUDA=2x STARPU_WATCHDOG_TIMEOUT=abc \
	STARPU_WATCHDOG_TIMEOUT=-1 STARPU_WATCHDOG_TIMEOUT=10x DOS_CPU_ISA=bogus DOS_STRIDE_K=0 \
	DOS_RESIDENT_RATIO=2 DOS_SCHED_VERBOSE=x DOS_GPU_RESERVE_MIB=-1 DOS_GPU_FORECAST=guess; do
	name=${setting%%=*} value=${setting#*=}
	# shellcheck disable=SC2163 # the setting NAME=VALUE itself
	export "$setting"
	refused "$name = '$value'" -- --checkpoint-dir "$work/env-ck"
	unset "$name"
done
[ -e "$work/env-ck/checkpoint-2.dos" ] && fail "a refused run saved a checkpoint"
# StarPU's model folder: StarPU aborted with a backtrace (exit 134) on a STARPU_HOME or a
# STARPU_PERF_MODEL_DIR it could not make; now refused, naming it; one that is missing but
# can be made is fine (StarPU makes it), and the check leaves nothing behind
# (XDG_CACHE_HOME comes before STARPU_HOME in StarPU's choice of a home, and
# STARPU_PERF_MODEL_DIR before both: a runner's own settings would hide these cases)
unset XDG_CACHE_HOME STARPU_PERF_MODEL_DIR
home_saved=${STARPU_HOME-}
for setting in STARPU_HOME=/proc/nohome "STARPU_HOME=$work/file" "STARPU_HOME=$work/file/sub" \
	STARPU_PERF_MODEL_DIR=/proc/models "STARPU_PERF_MODEL_DIR=$work/file"; do
	name=${setting%%=*} value=${setting#*=}
	# shellcheck disable=SC2163 # the setting NAME=VALUE itself
	export "$setting"
	refused "$name = '$value': StarPU cannot keep its performance models in" -- --checkpoint-dir "$work/env-ck"
	unset "$name"
	[ -z "$home_saved" ] || export STARPU_HOME="$home_saved"
done
STARPU_HOME=$work/fresh/home $train --preset tiny --steps 1 --quiet >"$work/log" 2>&1 ||
	fail "STARPU_HOME=$work/fresh/home (missing, can be made): $(cat "$work/log")"
[ -d "$work/fresh/home/.starpu/sampling" ] || fail "STARPU_HOME=$work/fresh/home: StarPU made no model folder"
for probe in "$work"/.dos-probe-* "$work"/fresh/.dos-probe-*; do
	[ -e "$probe" ] && fail "a probe was left: $probe"
done
STARPU_WATCHDOG_TIMEOUT=0 DOS_CPU_ISA=scalar $train --preset tiny --steps 1 --quiet >"$work/log" 2>&1 ||
	fail "STARPU_WATCHDOG_TIMEOUT=0 DOS_CPU_ISA=scalar: $(cat "$work/log")"
# flock failing as on a file system without locks: the library's warning is printed (dos-train
# printed none: it silenced the library's messages, warnings with its errors)
cat >"$work/noflock.c" <<'EOF'
#include <errno.h>
int flock(int fd, int operation)
{
	(void)fd;
	(void)operation;
	errno = ENOLCK;
	return -1;
}
EOF
if ${CC:-cc} -shared -fPIC -o "$work/noflock.so" "$work/noflock.c" 2>/dev/null; then
	env -u DOS_QUIET LD_PRELOAD="$work/noflock.so" $train --preset tiny --steps 1 --quiet \
		--checkpoint-dir "$work/noflock-ck" >"$work/log" 2>&1
	if grep -q 'ASan runtime does not come first' "$work/log"; then
		echo "(the flock warning not checked: LD_PRELOAD beside ASan)"
	else
		grep -q "warning: checkpoint folder $work/noflock-ck cannot be locked (flock" "$work/log" ||
			fail "no warning for a folder that cannot be locked: $(cat "$work/log")"
	fi
fi
echo "environment: worker counts, the watchdog, DOS_CPU_ISA, the policies' settings and StarPU's model folder refused before StarPU starts; warnings printed"

# ---- 7. a report that cannot be written ------------------------------------------------
# Standard output on a full disk: the run's report was lost and dos-train exited 0, so a
# batch script could not tell; now exit 1 and a line on stderr.
if [ -w /dev/full ]; then
	$train --preset tiny --steps 2 >/dev/full 2>"$work/log"
	status=$?
	[ $status = 1 ] || fail "stdout on /dev/full: exit $status, expected 1: $(cat "$work/log")"
	grep -q "cannot write the report on standard output: No space left on device" "$work/log" ||
		fail "stdout on /dev/full: $(cat "$work/log")"
	echo "a report that cannot be written: exit 1, said on stderr"
fi
