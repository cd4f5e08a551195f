#!/usr/bin/env bash
# Soak test: dos-train's default model for many steps (10,000 by default: about 27 minutes
# on two cores), checking that resident memory stays flat and the loss stays finite.
#
# Resident memory is sampled every 2 s. Within one step it rises and falls by tens of MiB
# (activations are registered per micro-batch and freed after their last use, and glibc
# returns freed blocks to the system only sometimes), so a single sample says little:
# an earlier version compared the peak of the whole run against one sample and failed
# on a run whose memory went 399 -> 424 -> 397 MiB with no trend at all. What a leak
# does is move the whole band up. So, after dropping the first fifth (StarPU's allocation
# cache and OpenBLAS buffers settle there), the rest is cut into quarters and the last
# quarter is compared with the first: its median and its peak may each exceed the first
# quarter's by at most SOAK_RSS_GROWTH_PERCENT (default 5). At 10,000 steps and ~400 MiB
# that catches any leak above about 3.5 KB per step (5 % of 400 MiB over the ~6,000 steps
# between the two quarters); the leak this test found (the overlap statistic keeping
# every interval) grew memory by 6.6 KB per step. Not part of make check (make soak).
#
# Usage: tools/soak.sh BUILD_DIR [STEPS]; the samples ("seconds KiB") are kept in
# BUILD_DIR/soak-rss.txt.
set -uo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$(cd "${1:?usage: soak.sh BUILD_DIR [STEPS]}" && pwd)
steps=${2:-10000}
growth=${SOAK_RSS_GROWTH_PERCENT:-5}
samples_file=$build/soak-rss.txt
log=$(mktemp)
trap 'rm -f "$log"' EXIT
export STARPU_SILENT=1 DOS_SOURCE_DIR=$top LD_LIBRARY_PATH=$build/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
"$build/.libs/dos-train" --steps "$steps" --quiet >"$log" 2>&1 &
pid=$!
start=$SECONDS
: >"$samples_file"
while kill -0 "$pid" 2>/dev/null; do
	rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null)
	[[ -n $rss ]] && echo "$((SECONDS - start)) $rss" >>"$samples_file"
	sleep 2
done
wait "$pid"
rc=$?
cat "$log"
((rc == 0)) || { echo "soak: dos-train failed ($rc)"; exit 1; }
grep -qiE 'nan|inf' <(grep '^summary: loss' "$log") && { echo "soak: the loss is not finite"; exit 1; }
# Median and peak of the first and last quarter after the warm-up fifth, then the verdict.
awk -v g="$growth" -v steps="$steps" -v secs="$((SECONDS - start))" '
	{ rss[NR] = $2 }
	function window(from, to,   n, i, j, t, v) {
		n = 0
		for (i = from; i <= to; i++) v[++n] = rss[i]
		for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j - 1] > v[j]; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
		w_median = v[int((n + 1) / 2)]; w_peak = v[n]
	}
	END {
		if (NR < 20) { printf "soak: run too short to judge memory (%d samples)\n", NR; exit 1 }
		first = int(NR / 5) + 1; quarter = int((NR - first + 1) / 4)
		window(first, first + quarter - 1); m0 = w_median; p0 = w_peak
		window(NR - quarter + 1, NR); m1 = w_median; p1 = w_peak
		printf "soak: %d steps in %d s, %d samples; resident memory (MiB) after the warm-up: " \
			"first quarter median %.0f peak %.0f, last quarter median %.0f peak %.0f " \
			"(%+.1f %%, %+.1f %%)\n", steps, secs, NR, m0 / 1024, p0 / 1024, m1 / 1024, p1 / 1024,
			100 * (m1 / m0 - 1), 100 * (p1 / p0 - 1)
		if (m1 > m0 * (1 + g / 100) || p1 > p0 * (1 + g / 100)) {
			printf "soak: resident memory grew by more than %s %%\n", g; exit 1
		}
		printf "soak: memory flat (within %s %%), loss finite\n", g
	}' "$samples_file"
