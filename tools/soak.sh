#!/usr/bin/env bash
# Soak test: dos-train's default model for many steps (10,000 by default: about 27 minutes
# on two cores), checking that resident memory stays flat and the loss stays finite.
# Resident memory is sampled every 2 s; after the first fifth of the run (StarPU's
# allocation cache and OpenBLAS buffers have settled by then) it may not grow by more than
# SOAK_RSS_GROWTH_PERCENT (default 5). Not part of make check (make soak).
#
# Usage: tools/soak.sh BUILD_DIR [STEPS]
set -uo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$(cd "${1:?usage: soak.sh BUILD_DIR [STEPS]}" && pwd)
steps=${2:-10000}
growth=${SOAK_RSS_GROWTH_PERCENT:-5}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
export STARPU_SILENT=1 DOS_SOURCE_DIR=$top LD_LIBRARY_PATH=$build/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
"$build/.libs/dos-train" --steps "$steps" --quiet >"$log" 2>&1 &
pid=$!
start=$SECONDS
samples=()
while kill -0 "$pid" 2>/dev/null; do
	rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null)
	[[ -n $rss ]] && samples+=("$((SECONDS - start)) $rss")
	sleep 2
done
wait "$pid"
rc=$?
cat "$log"
((rc == 0)) || { echo "soak: dos-train failed ($rc)"; exit 1; }
grep -qiE 'nan|inf' <(grep '^summary: loss' "$log") && { echo "soak: the loss is not finite"; exit 1; }
n=${#samples[@]}
((n >= 5)) || { echo "soak: run too short to judge memory ($n samples)"; exit 1; }
settled=${samples[$((n / 5))]#* }
peak=0
for s in "${samples[@]:$((n / 5))}"; do
	v=${s#* }
	((v > peak)) && peak=$v
done
last=${samples[$((n - 1))]#* }
echo "soak: $steps steps in $((SECONDS - start)) s; resident memory after the first fifth $((settled / 1024)) MiB," \
	"peak after it $((peak / 1024)) MiB, last $((last / 1024)) MiB ($n samples)"
awk -v s="$settled" -v p="$peak" -v g="$growth" 'BEGIN {exit !(p <= s * (1 + g / 100))}' ||
	{ echo "soak: resident memory grew by more than $growth %"; exit 1; }
echo "soak: memory flat (within $growth %), loss finite"
