#!/bin/sh
# dos-train as a data-parallel job over StarPU-MPI (graph/data_parallel.h), with Debian's
# Open MPI on this machine's cores (--oversubscribe, one CPU worker per rank):
#  1. N ranks with a global batch of B micro-batches end bit-identical to one process
#     accumulating the same B (master weights, m, v, working weights), for N = 2 and 4,
#     in fp32, bf16 and fp16 (loss scaling and clipping: statistics reduced across
#     ranks), under several policies, with a step skipped for overflow, and with fewer
#     subgroups than ranks; their held-out losses (the ranks sharing the evaluation) are
#     the one process's, to the printed digit;
#  2. each rank keeps about 1/N of the optimizer state, and says so; ranks of a node are
#     bound to distinct blocks of cores, and say which; a NaN in the state stops every rank;
#  3. sharded checkpoints: a 2-rank job saves shards + manifest; resuming on 1, 2 and 4
#     ranks ends bit-identical to the uninterrupted run, and on 2 past a newer save with a
#     damaged shard (its files set aside, the save that loaded kept); SIGKILL of the job while it saves
#     every step leaves a latest checkpoint that resumes exactly; the shards of a save
#     killed before its manifest are no checkpoint, and a fresh run says to remove them;
#     SIGTERM to one rank stops both after the same step, saved there;
#  4. ranks given other options or data stop before the run, rank 0 naming what differs;
#     a rank stopped (SIGSTOP) ends the job on the watchdog, which names that cause, and
#     so does a rank that never answers a sum or a barrier (tests/dp_silent_rank).
# And the scatter exchange (--dp-exchange scatter): the same bits under several policies,
# close to one process in fp32 (1b above).
# DOS_QUICK_CHECK=1 (sanitizer and distcheck builds): 2 ranks only in part 1, one SIGKILL.
# Skipped (77) when dos-train was built without StarPU-MPI or mpirun is missing.
set -u
train=./dos-train
# shellcheck source=tests/test_lib.sh
. "$(dirname "$0")/test_lib.sh"
command -v mpirun >/dev/null 2>&1 || {
	echo "mpirun not found: skipped"
	exit 77
}
grep -q 'define DOS_HAVE_MPI 1' config.h 2>/dev/null || {
	echo "built without StarPU-MPI: skipped"
	exit 77
}
export STARPU_NCPU=1
# Open MPI refuses root unless told; the job may use more ranks than cores here
mpi_flags="--oversubscribe --bind-to none"
[ "$(id -u)" = 0 ] && mpi_flags="$mpi_flags --allow-run-as-root"
ranks() { # N, dos-train arguments...
	n=$1
	shift
	# Open MPI's own allocations outlive MPI_Finalize: no leak check of them in the
	# sanitizer build (the single-process runs keep it)
	# shellcheck disable=SC2086
	ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0" timeout 300 mpirun $mpi_flags -np "$n" $train "$@"
}

job_sizes="2 4"
[ "${DOS_QUICK_CHECK:-0}" = 1 ] && job_sizes=2

# ---- 1. bit-identical to one process with the same global batch --------------------------
same_as_one_process() { # label, dos-train arguments (without --accumulate)...
	label=$1
	shift
	# held-out losses every 3 steps: the ranks share the evaluation's micro-batches
	$train --preset tiny --steps 8 --quiet --accumulate 4 --eval-every 3 --dump "$work/one.bin" "$@" \
		>"$work/one.log" 2>&1 || fail "$label: one process failed: $(cat "$work/one.log")"
	for n in $job_sizes; do
		ranks "$n" --preset tiny --steps 8 --quiet --accumulate $((4 / n)) --eval-every 3 --dump "$work/dp.bin" "$@" \
			>"$work/log" 2>&1 || fail "$label: $n ranks failed: $(cat "$work/log")"
		cmp -s "$work/one.bin" "$work/dp.bin" ||
			fail "$label: $n ranks end with another state than one process accumulating the global batch"
		held_out=$(grep 'summary: held-out loss' "$work/one.log")
		[ -n "$held_out" ] && grep -qF "$held_out" "$work/log" ||
			fail "$label: $n ranks report another held-out loss than one process ('$held_out'):" \
				"$(grep 'held-out' "$work/log")"
	done
}
same_as_one_process "fp32, dos" --policy dos
same_as_one_process "fp32, dmda, 777-parameter subgroups" --policy dmda --subgroup-size 777
same_as_one_process "bf16, stride" --precision bf16 --policy stride
same_as_one_process "fp16, loss scaling and clipping" --precision fp16 --clip 0.5
same_as_one_process "fp16, every step overflows" --precision fp16 --loss-scale 1e30
grep -q "(8 skipped)" "$work/log" || fail "--loss-scale 1e30 skipped no step: $(cat "$work/log")"
same_as_one_process "3 subgroups, fewer than 4 ranks" --subgroup-size 12000
# one process follows the tensors by default, a job of several ranks cuts across them:
# every case above compares the two layouts; here both follow the tensors
same_as_one_process "bf16, subgroups following the tensors in every rank" --precision bf16 --subgroup-layout tensors
echo "data parallel: $(echo $job_sizes | sed "s/ / and /") ranks bit-identical to one process accumulating the global batch (fp32, bf16, fp16" \
	"with loss scaling and clipping, overflow skips, several policies, subgroup sizes and layouts), and the same held-out losses"

# ---- 1b. the scatter exchange (graph/scatter.h): each rank sums a chunk of every subgroup ---
# Not one process's bits (each rank's partial gradient is rounded once more), but the same
# bits whatever the placement (dos and all-cpu); in fp32 within 1e-5 (relative, at least
# absolute) of one process after 8 steps; clipping and loss scaling take their statistics
# from the summed gradients.
max_difference() { # two dumps: the largest difference of their master weights, relative to max(1, |x|)
	python3 - "$1" "$2" <<'PY'
import struct, sys
def floats(path):
    data = open(path, 'rb').read()
    return struct.unpack('%df' % (len(data) // 4), data)
a, b = floats(sys.argv[1]), floats(sys.argv[2])
n = len(a) // 4  # master, m, v, weights: the first quarter
print('%.3g' % max(abs(x - y) / max(1.0, abs(x)) for x, y in zip(a[:n], b[:n])))
PY
}
scatter_case() { # label, dos-train arguments (without --accumulate)...
	label=$1
	shift
	$train --preset tiny --steps 8 --quiet --accumulate 4 --dump "$work/one.bin" "$@" >"$work/one.log" 2>&1 ||
		fail "scatter, $label: one process failed: $(cat "$work/one.log")"
	for n in $job_sizes; do
		for policy in dos all-cpu; do
			ranks "$n" --preset tiny --steps 8 --quiet --accumulate $((4 / n)) --dp-exchange scatter \
				--policy $policy --dump "$work/scatter-$policy.bin" "$@" >"$work/log" 2>&1 ||
				fail "scatter, $label: $n ranks under $policy failed: $(cat "$work/log")"
		done
		cmp -s "$work/scatter-dos.bin" "$work/scatter-all-cpu.bin" ||
			fail "scatter, $label: $n ranks end with other bits under all-cpu than under dos"
		difference=$(max_difference "$work/one.bin" "$work/scatter-dos.bin")
		[ "${1:-}" = --precision ] ||
			awk -v d="$difference" 'BEGIN { exit !(d <= 1e-5) }' ||
			fail "scatter, $label: $n ranks differ from one process by $difference"
		echo "data parallel: scatter, $label, $n ranks: the same bits under dos and all-cpu;" \
			"$difference from one process"
	done
}
scatter_case "fp32, 777-parameter subgroups" --subgroup-size 777
scatter_case "fp32, 3 subgroups, fewer than 4 ranks" --subgroup-size 12000
scatter_case "fp16, loss scaling and clipping" --precision fp16 --clip 0.5

# ---- 2. each rank keeps its share of the state ------------------------------------------------
ranks 4 --preset tiny --steps 1 --subgroup-size 1000 >"$work/log" 2>&1 || fail "4 ranks: $(cat "$work/log")"
shares=$(sed -n 's/.*optimizer state .* MiB of .* MiB (\([0-9.]*\) of it).*/\1/p' "$work/log")
[ "$(echo "$shares" | wc -l)" = 4 ] || fail "expected 4 ranks to print their share: $(cat "$work/log")"
echo "$shares" | awk '{ if ($1 < 0.22 || $1 > 0.28) bad = 1; sum += $1 } END { exit bad || sum < 0.999 || sum > 1.001 }' ||
	fail "the 4 shares of the optimizer state are not about 1/4 each: $shares"
echo "data parallel: each of 4 ranks keeps $(echo "$shares" | sort | tr '\n' ' ')of the optimizer state"

# each rank of a node on its own block of cores (here one core each), said by every rank
ranks 2 --preset tiny --steps 1 >"$work/log" 2>&1 || fail "2 ranks: $(cat "$work/log")"
cpus=$(sed -n 's/.*binding: local rank [01] of 2: .* on CPUs \([0-9,-]*\) .*/\1/p' "$work/log" | sort | tr '\n' ' ')
if [ "$(nproc)" -ge 2 ]; then
	[ "$(echo "$cpus" | wc -w)" = 2 ] && [ "$(echo "$cpus" | tr ' ' '\n' | sort -u | grep -c .)" = 2 ] ||
		fail "2 ranks should be bound to distinct cores: '$cpus' from $(grep binding "$work/log")"
fi
DOS_BIND=none ranks 2 --preset tiny --steps 1 >"$work/log" 2>&1 || fail "DOS_BIND=none: $(cat "$work/log")"
[ "$(grep -c 'binding left to the launcher' "$work/log")" = 2 ] || fail "DOS_BIND=none ignored: $(cat "$work/log")"
echo "data parallel: 2 ranks bound to CPUs $cpus(one block of cores each); DOS_BIND=none leaves the launcher's"

# a NaN in one rank's state stops every rank at that step (no rank left waiting)
if ranks 2 --preset tiny --steps 6 --quiet --lr 1e37 --weight-decay 1 >"$work/log" 2>&1; then
	fail "a job whose state overflows finished: $(cat "$work/log")"
fi
[ "$(grep -c '^dos-train: after step 2 the optimizer state is not finite: .*training stopped$' "$work/log")" = 2 ] ||
	fail "both ranks should stop at step 2 naming their subgroups: $(cat "$work/log")"
echo "data parallel: a state that stops being finite stops both ranks at that step, each naming its subgroups"

# ---- 3. sharded checkpoints, resharded on resume --------------------------------------------
# The runs of 6 steps stand for 10-step runs interrupted at step 6: they are given the
# 10-step run's learning-rate schedule (dos-train's default follows --steps), which the
# resumed runs then continue across the interruption.
schedule="--warmup 3 --decay-steps 10"
$train $schedule --preset tiny --steps 10 --quiet --accumulate 4 --dump "$work/straight.bin" >/dev/null 2>&1 ||
	fail "the uninterrupted run failed"
ck=$work/ck
mkdir "$ck"
ranks 2 $schedule --preset tiny --steps 6 --quiet --accumulate 2 --checkpoint-dir "$ck" >"$work/log" 2>&1 ||
	fail "saving shards failed: $(cat "$work/log")"
[ -f "$ck/checkpoint-6.dos" ] && [ -f "$ck/checkpoint-6.shard-0-of-2.dos" ] && [ -f "$ck/checkpoint-6.shard-1-of-2.dos" ] ||
	fail "expected a manifest and 2 shards: $(ls "$ck")"
for n in 1 2 4; do
	rm -rf "$work/ck$n"
	cp -r "$ck" "$work/ck$n"
	if [ "$n" = 1 ]; then
		$train $schedule --preset tiny --steps 10 --quiet --accumulate 4 --checkpoint-dir "$work/ck$n" --resume \
			--dump "$work/resumed.bin" >"$work/log" 2>&1
	else
		ranks "$n" $schedule --preset tiny --steps 10 --quiet --accumulate $((4 / n)) --checkpoint-dir "$work/ck$n" \
			--resume --dump "$work/resumed.bin" >"$work/log" 2>&1
	fi || fail "resuming on $n rank(s) failed: $(cat "$work/log")"
	grep -q "resumed after step 6" "$work/log" || fail "$n rank(s) did not resume: $(cat "$work/log")"
	cmp -s "$work/straight.bin" "$work/resumed.bin" ||
		fail "2-rank shards resumed on $n rank(s) differ from the uninterrupted run"
done
# bf16: the resumed ranks rebuild their 16-bit weights from the owners' master weights
$train $schedule --preset tiny --steps 10 --quiet --accumulate 4 --precision bf16 --dump "$work/straight16.bin" >/dev/null 2>&1 ||
	fail "the uninterrupted bf16 run failed"
mkdir "$work/ck16"
ranks 2 $schedule --preset tiny --steps 6 --quiet --accumulate 2 --precision bf16 --checkpoint-dir "$work/ck16" \
	>"$work/log" 2>&1 || fail "saving bf16 shards failed: $(cat "$work/log")"
ranks 4 $schedule --preset tiny --steps 10 --quiet --accumulate 1 --precision bf16 --checkpoint-dir "$work/ck16" --resume \
	--dump "$work/resumed.bin" >"$work/log" 2>&1 || fail "resuming bf16 on 4 ranks failed: $(cat "$work/log")"
cmp -s "$work/straight16.bin" "$work/resumed.bin" || fail "bf16: 2-rank shards resumed on 4 ranks differ"
echo "data parallel: a 2-rank sharded checkpoint resumed on 1, 2 and 4 ranks (and bf16 on 4): bit-identical to 10" \
	"straight steps"
# a damaged shard in the newest save: the job resumes from the one before, sets the
# damaged save's files aside (manifest and shards, renamed "<name>.damaged") and ends
# bit-identical; retention then keeps the save that loaded, not the damaged one
ck=$work/ck-damaged
ranks 2 $schedule --preset tiny --steps 6 --quiet --accumulate 2 --checkpoint-dir "$ck" --checkpoint-every 3 \
	>"$work/log" 2>&1 || fail "saving shards every 3 steps failed: $(cat "$work/log")"
python3 -c 'import sys; p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[len(b) // 2] ^= 1; open(p, "wb").write(b)' \
	"$ck/checkpoint-6.shard-1-of-2.dos"
ranks 2 $schedule --preset tiny --steps 10 --quiet --accumulate 2 --checkpoint-dir "$ck" --resume \
	--dump "$work/resumed.bin" >"$work/log" 2>&1 || fail "resuming past a damaged shard failed: $(cat "$work/log")"
grep -q "resumed after step 3" "$work/log" &&
	grep -q "set aside $ck/checkpoint-6.dos: .*shard-1-of-2.dos: .*corrupted.*renamed checkpoint-6.dos.damaged (and its 2 shards" \
		"$work/log" || fail "resuming past a damaged shard: $(cat "$work/log")"
cmp -s "$work/straight.bin" "$work/resumed.bin" || fail "resumed past a damaged shard: the result differs"
[ -f "$ck/checkpoint-3.dos" ] && [ -f "$ck/checkpoint-10.dos" ] && [ -f "$ck/checkpoint-6.shard-1-of-2.dos.damaged" ] &&
	[ ! -e "$ck/checkpoint-6.dos" ] || fail "after resuming past a damaged shard: $(ls "$ck")"
echo "data parallel: resumed past a save with a damaged shard, its files set aside, the save before kept"

# SIGKILL of one rank while the job saves every step (mpirun then ends the job)
steps=120
$train --preset tiny --steps $steps --quiet --accumulate 2 --dump "$work/straight.bin" >/dev/null 2>&1 ||
	fail "the uninterrupted run failed"
rounds=${DOS_KILL_ROUNDS:-3}
[ "${DOS_QUICK_CHECK:-0}" = 1 ] && rounds=2
resumed=""
for round in $(seq 1 "$rounds"); do
	ck=$work/kill-$round
	mkdir "$ck"
	ranks 2 --preset tiny --steps $steps --quiet --accumulate 1 --checkpoint-dir "$ck" --checkpoint-every 1 \
		>/dev/null 2>&1 &
	# from its first whole checkpoint (a manifest: however long the job took to start),
	# a different moment of the saves each round
	for _ in $(seq 1 600); do
		ls "$ck" | grep -qE '^checkpoint-[0-9]+\.dos$' && break
		sleep 0.1
	done
	sleep "$(awk -v r="$round" 'BEGIN {printf "%.3f", 0.15 * r}')"
	pkill -9 -f "dos-train.*$ck" 2>/dev/null
	wait
	# killed before the first save had its manifest (shards alone are no checkpoint)
	ls "$ck" | grep -qE '^checkpoint-[0-9]+\.dos$' || continue
	ranks 2 --preset tiny --steps $steps --quiet --accumulate 1 --checkpoint-dir "$ck" --resume \
		--dump "$work/killed.bin" >"$work/log" 2>&1 || fail "round $round: resuming failed: $(cat "$work/log")"
	cmp -s "$work/straight.bin" "$work/killed.bin" || fail "round $round: resumed state differs after SIGKILL"
	at=$(sed -n 's/.*resumed after step \([0-9]*\).*/\1/p' "$work/log")
	[ -n "$at" ] && [ "$at" -lt $steps ] && resumed="$resumed $at"
done
# shellcheck disable=SC2086
set -- $resumed
[ $# -ge 1 ] || fail "none of $rounds rounds was killed in the middle of the run"
echo "data parallel: SIGKILL of a 2-rank job saving every step, $rounds times: resumed bit-identical from steps$resumed"

# SIGTERM to one rank only (a batch system signals every rank, not at the same step): both
# stop after the same step with a whole checkpoint there, which resumes bit-identical
ck=$work/term
ranks 2 --preset tiny --steps $steps --quiet --accumulate 1 --checkpoint-dir "$ck" --checkpoint-every 20 \
	>"$work/term.log" 2>&1 &
job=$!
for _ in $(seq 1 600); do
	[ -f "$ck/checkpoint-20.dos" ] && break
	sleep 0.1
done
# A rank itself, not what launched it: this took the first process whose command line
# names the run, `timeout`, which passed the signal to mpirun, which signals every rank
# and kills them 1 s later (Open MPI's odls_base_sigkill_timeout): a race with the
# ranks' checkpoint, lost once under the sanitizer build in CI.
rank=$(pgrep -f "dos-train --preset tiny .*$ck" | while read -r p; do
	case $(ps -o comm= -p "$p") in *dos-train) echo "$p" ;; esac
done | head -n 1)
[ -n "$rank" ] && kill -TERM "$rank" || fail "SIGTERM: no rank to signal: $(cat "$work/term.log")"
wait $job && fail "SIGTERM: the job ended with status 0: $(cat "$work/term.log")"
at=$(sed -n 's/.*stopped on request after step \([0-9]*\) of.*/\1/p' "$work/term.log" | sort -u)
[ "$(echo "$at" | wc -w)" = 1 ] && [ "$at" -lt $steps ] ||
	fail "SIGTERM: the ranks did not stop after one same step: $(cat "$work/term.log")"
[ -f "$ck/checkpoint-$at.dos" ] || fail "SIGTERM: stopped after step $at without its checkpoint: $(ls "$ck")"
ranks 2 --preset tiny --steps $steps --quiet --accumulate 1 --checkpoint-dir "$ck" --resume \
	--dump "$work/term.bin" >"$work/log" 2>&1 || fail "resuming after SIGTERM failed: $(cat "$work/log")"
cmp -s "$work/straight.bin" "$work/term.bin" || fail "the job stopped by SIGTERM after step $at ends differently"
echo "data parallel: SIGTERM to one rank of 2: both stopped after step $at, saved there, resumed bit-identical"

# A job killed in its first save, after the shards and before the manifest, leaves a
# folder that holds no checkpoint: --resume says so, and a fresh run, which must not take
# another run's files, says what they are and what to do (it used to call them checkpoint
# files of another run to continue with --resume: each refusal sent to the other).
ck=$work/unfinished
ranks 2 --preset tiny --steps 2 --quiet --accumulate 1 --checkpoint-dir "$ck" >"$work/log" 2>&1 ||
	fail "the 2-rank run to save failed: $(cat "$work/log")"
rm "$ck/checkpoint-2.dos"
$train --preset tiny --steps 2 --quiet --checkpoint-dir "$ck" --resume >"$work/log" 2>&1 &&
	fail "--resume took a folder with shards alone"
grep -qF "no checkpoint in $ck" "$work/log" || fail "--resume on shards alone: $(cat "$work/log")"
$train --preset tiny --steps 2 --quiet --checkpoint-dir "$ck" >"$work/log" 2>&1 && fail "a fresh run took another run's shards"
for want in "holds only the shards of an unfinished save of another run" checkpoint-2.shard-0-of-2.dos \
	checkpoint-2.shard-1-of-2.dos "nothing to resume from" "remove them"; do
	grep -qF -- "$want" "$work/log" || fail "the refusal of shards alone lacks '$want': $(cat "$work/log")"
done
rm "$ck"/checkpoint-2.shard-*.dos
$train --preset tiny --steps 2 --quiet --checkpoint-dir "$ck" >"$work/log" 2>&1 ||
	fail "a fresh run in the folder emptied of the shards failed: $(cat "$work/log")"
echo "shards of an unfinished save alone: --resume finds no checkpoint, a fresh run says to remove them"

# Ranks given other options hung (--accumulate, --steps: a rank waits for messages the
# other never sends), aborted in StarPU-MPI (--layers, --precision) or trained on without
# a word (--lr, --data): the job now stops before it runs, exit 2, rank 0 naming each
# setting that differs. Rank 1 gets the extra options of $RANK1_OPTIONS.
cat >"$work/rank1.sh" <<WRAPPER
#!/bin/sh
[ "\${OMPI_COMM_WORLD_RANK:-\${PMI_RANK:-0}}" = 1 ] && exec "$(pwd)/dos-train" "\$@" \$RANK1_OPTIONS
exec "$(pwd)/dos-train" "\$@"
WRAPPER
chmod +x "$work/rank1.sh"
corpus=$(dirname "$0")/../data/corpus.txt
tac "$corpus" >"$work/reversed.txt" || fail "cannot read $corpus"
with_rank1() { # rank 1's extra options, dos-train arguments...
	RANK1_OPTIONS=$1
	export RANK1_OPTIONS
	shift
	all=$train
	train=$work/rank1.sh
	ranks 2 "$@"
	status=$?
	train=$all
	return $status
}
differing() { # rank 1's extra options, what rank 0 must say
	with_rank1 "$1" --preset tiny --steps 4 --quiet --data "$corpus" >"$work/log" 2>&1
	status=$?
	[ $status = 2 ] || fail "ranks with '$1' apart: exit $status, expected 2: $(cat "$work/log")"
	grep -qF -- "$2" "$work/log" || fail "ranks with '$1' apart: no '$2' in: $(cat "$work/log")"
	grep -qF "every rank of a data-parallel job needs the same options" "$work/log" ||
		fail "ranks with '$1' apart: $(cat "$work/log")"
}
differing "--accumulate 2" "--accumulate differs between the ranks of this job: rank 0 has 1, another 2"
differing "--lr 0.01" "--lr differs between the ranks of this job: rank 0 has 0.003, another 0.01"
differing "--layers 3" "--layers differs between the ranks of this job: rank 0 has 2, another 3"
differing "--precision bf16" "--precision differs between the ranks of this job: rank 0 has fp32"
differing "--data $work/reversed.txt" "--data (its content) differs between the ranks of this job"
differing "--subgroup-layout tensors" "--subgroup-layout differs between the ranks of this job: rank 0 has flat"
# the same corpus under another path is the same data; --policy does not change the result
cp "$corpus" "$work/copy.txt"
with_rank1 "--data $work/copy.txt --policy all-cpu" --preset tiny --steps 4 --quiet --data "$corpus" \
	>"$work/log" 2>&1 || fail "ranks with the same corpus in two paths: $(cat "$work/log")"
echo "ranks given other options or data: refused before the run, naming what differs"

# A rank that stops answering (SIGSTOP, as a hung node): the others' watchdog stops the
# job, and names the likely cause (it blamed a GPU too small only, on a machine with none)
export STARPU_WATCHDOG_TIMEOUT=5000000
# (a step count of its own: pgrep must not find another test's run, test_host_memory.sh's)
ranks 2 --preset tiny --steps 999983 --quiet >"$work/log" 2>&1 &
job=$!
wait_for_line "model computes" "$work/log" 600
sleep 1
victim=
for pid in $(pgrep -f -- "--steps 999983"); do
	case $(ps -o comm= -p "$pid") in *dos-train) victim=$pid ;; esac
done
[ -n "$victim" ] || fail "no rank to stop: $(cat "$work/log")"
kill -STOP "$victim"
wait $job
status=$?
kill -CONT "$victim" 2>/dev/null
kill -9 "$victim" 2>/dev/null
unset STARPU_WATCHDOG_TIMEOUT
[ $status != 0 ] && [ $status != 124 ] || fail "a job with a stopped rank: exit $status: $(cat "$work/log")"
grep -q "or another rank of this job of 2 that stopped sending" "$work/log" ||
	fail "a job with a stopped rank: the watchdog did not name the other rank: $(cat "$work/log")"
echo "a rank stopped: the job ends on the watchdog, which names the other rank as the likely cause"

# The same where the rank waits with no task submitted, which StarPU's watchdog did not
# watch (the job above hung for good when rank 1 stopped just before a per-step sum): a
# rank that never answers ends rank 0's wait in a sum and in a barrier.
all=$train
train=./tests/dp_silent_rank
for wait in sum barrier; do
	ranks 2 $wait >"$work/log" 2>&1
	status=$?
	[ $status != 0 ] && [ $status != 124 ] && grep -q "rank 0: the watchdog ended the wait for rank 1 in the $wait" "$work/log" ||
		fail "a rank that never answers a $wait: exit $status: $(cat "$work/log")"
done
train=$all
echo "a rank that never answers: the watchdog ends the others' wait in a sum and in a barrier"
