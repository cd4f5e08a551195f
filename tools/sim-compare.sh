#!/usr/bin/env bash
# The policy comparison on the simulated machines, as recorded in results/: every row of
# the table in one command. Needs build-simgrid/ (make check-sim builds it).
#
# Two kinds of cases, each run with StarPU's background write-back at its defaults
# (STARPU_MINIMUM_CLEAN_BUFFERS=5, STARPU_TARGET_CLEAN_BUFFERS=10) and off (both 0):
# - update phase ("20b"): dos-bench optimizer on the 20B setup of docs/background.md (5e9
#   params per rank in 1e8 subgroups, fp16 gradients, bf16 weights) on h100-pcie5,
#   a100-pcie4 and h200, gradients and 16-bit weights in host memory (--homes host: the
#   whole GPU, and 8 GiB for the optimizer) or on the GPU as in training (--homes gpu: the
#   whole GPU, and 32 GiB in all); the median of the timed steps after one warm-up, against
#   the bound (sched/bound.c), split continuously and in whole subgroups;
# - training iterations ("train"): dos-train --simulate on h100-pcie5, the bf16 1b model
#   with the whole GPU and with 16000, 12000 and 9000 MiB (STARPU_LIMIT_CUDA_MEM), and the
#   bf16 7b model with activation checkpointing; the steady iteration (median interval
#   between consecutive steps' losses) and the first one.
# Policies: dos, dmda and the static splits stride (k = 2) and resident (ratio 0.5).
# Simulated times are deterministic: one run per configuration is a measurement.
#
# Usage: tools/sim-compare.sh [--only REGEX] [--keep DIR]
#   --only REGEX  run the cases whose label matches (labels: "20b h100-pcie5 host whole
#                 wb-default", "train 7b-bf16-ckpt h100-pcie5 whole wb-off", ...)
#   --keep DIR    keep every run's output in DIR (default: a temporary folder)
# Prints each run's summary as it goes, then one Markdown table per kind of case.
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bench=$top/build-simgrid/dos-bench
train=$top/build-simgrid/dos-train
only=. keep=
while (($#)); do
	case $1 in
	--only) only=${2:?--only needs a regular expression}; shift 2 ;;
	--keep) keep=${2:?--keep needs a folder}; shift 2 ;;
	*) echo "usage: $0 [--only REGEX] [--keep DIR]" >&2; exit 2 ;;
	esac
done
[[ -x $bench && -x $train ]] || {
	echo "no $bench or $train: run 'make check-sim' (or configure build-simgrid) first" >&2
	exit 2
}
if [[ -n $keep ]]; then
	mkdir -p "$keep"
	out=$(cd "$keep" && pwd)
else
	out=$(mktemp -d)
	trap 'rm -rf "$out"' EXIT
fi
BENCH_STEPS=4 # timed steps after the warm-up (the row is their median)
TRAIN_STEPS=12 # the steady iteration is the median of 11 intervals
POLICIES=(dos dmda stride resident)
bench_rows=() train_rows=()

writeback_env() { # wb-default | wb-off
	if [[ $1 == wb-off ]]; then
		echo STARPU_MINIMUM_CLEAN_BUFFERS=0 STARPU_TARGET_CLEAN_BUFFERS=0
	else
		echo STARPU_MINIMUM_CLEAN_BUFFERS=5 STARPU_TARGET_CLEAN_BUFFERS=10
	fi
}

# bench MACHINE HOMES MEM_LABEL MIB WB
bench_case() {
	local machine=$1 homes=$2 memlabel=$3 mib=$4 wb=$5
	local label="20b $machine $homes $memlabel $wb" file
	[[ $label =~ $only ]] || return 0
	file=$out/${label// /_}.txt
	echo "=== $label: dos-bench optimizer --params 5e9 --subgroup 1e8 --gpu-mem-mib $mib --homes $homes"
	(
		eval "$("$top"/tools/sim-env.sh "$machine" "$out/home-$machine")"
		# shellcheck disable=SC2046 # word splitting of NAME=VALUE pairs is intended
		env $(writeback_env "$wb") DOS_SCHED_VERBOSE=1 "$bench" optimizer --params 5e9 --subgroup 1e8 \
			--steps "$BENCH_STEPS" --gpu-mem-mib "$mib" --homes "$homes" \
			--policies "$(IFS=,; echo "${POLICIES[*]}")" >"$file" 2>&1
	) || echo "    (dos-bench failed: see $file)"
	grep -E '^# [a-z-]+: warm-up|^# bound' "$file" | sed 's/^/    /' || true
	local row
	row=$(awk -v label="$label" '
		$1 ~ /^(dos|dmda|stride|resident)$/ && NF >= 11 { t[$1] = $2 }
		/^# bound:/ { bound = $3 }
		/^# bound in whole subgroups:/ { whole = $6 }
		END {
			best = t["stride"] < t["resident"] ? t["stride"] : t["resident"]
			printf "| %s | %.1f | %.1f | %.3f | %.1f | %.3f | %.1f | %.1f | %.1f | %.3f | %.3f |", label, t["dos"],
				bound, t["dos"] / bound, whole, t["dos"] / whole, t["dmda"], t["stride"], t["resident"],
				t["dos"] / t["dmda"], t["dos"] / best
		}' "$file")
	bench_rows+=("$row")
}

# train PRESET_LABEL MACHINE MEM_LABEL MIB WB -- dos-train options
train_case() {
	local preset=$1 machine=$2 memlabel=$3 mib=$4 wb=$5
	shift 6
	local label="train $preset $machine $memlabel $wb" p file
	[[ $label =~ $only ]] || return 0
	echo "=== $label: dos-train --simulate $machine $* (STARPU_LIMIT_CUDA_MEM ${mib:-unset})"
	local -A steady first
	for p in "${POLICIES[@]}"; do
		file=$out/${label// /_}-$p.txt
		(
			[[ -n $mib ]] && export STARPU_LIMIT_CUDA_MEM=$mib
			# shellcheck disable=SC2046
			env $(writeback_env "$wb") DOS_SCHED_VERBOSE=1 "$train" --simulate "$machine" "$@" \
				--steps "$TRAIN_STEPS" --policy "$p" --quiet >"$file" 2>&1
		) || echo "    (dos-train --policy $p failed: see $file)"
		steady[$p]=$(sed -n 's/^summary: steady iteration \([0-9.]*\) .*/\1/p' "$file")
		first[$p]=$(sed -n 's/^summary: steady iteration .*the first \([0-9.]*\) s).*/\1/p' "$file")
		echo "    $p: steady ${steady[$p]:-?} s, first ${first[$p]:-?} s"
	done
	train_rows+=("$(awk -v label="$label" -v d="${steady[dos]:-nan}" -v f="${first[dos]:-nan}" \
		-v m="${steady[dmda]:-nan}" -v mf="${first[dmda]:-nan}" -v s="${steady[stride]:-nan}" \
		-v r="${steady[resident]:-nan}" 'BEGIN {
			best = s < r ? s : r
			printf "| %s | %.3f | %.3f | %.2f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f |", label, d, f, f / d,
				m, mf, s, r, d / m, d / best }')")
}

for wb in wb-default wb-off; do
	for machine in h100-pcie5 a100-pcie4 h200; do
		bench_case "$machine" host whole 0 "$wb"
		bench_case "$machine" host 8GiB 8192 "$wb"
		bench_case "$machine" gpu whole 0 "$wb"
		bench_case "$machine" gpu 32GiB 32768 "$wb"
	done
done
for wb in wb-default wb-off; do
	train_case 1b-bf16 h100-pcie5 whole "" "$wb" -- --preset 1b --precision bf16
	for mib in 16000 12000 9000; do
		train_case 1b-bf16 h100-pcie5 "${mib}MiB" "$mib" "$wb" -- --preset 1b --precision bf16
	done
	train_case 7b-bf16-ckpt h100-pcie5 whole "" "$wb" -- --preset 7b --precision bf16 --checkpoint-activations
done

if ((${#bench_rows[@]})); then
	echo
	echo "Update phase, 20B per rank, median of $BENCH_STEPS steps after a warm-up (ms; bound: parameters split continuously;"
	echo "whole: the same in whole subgroups, each update one task; /best static: against the faster of stride and resident)"
	echo
	echo "| case | dos | bound | dos/bound | whole | dos/whole | dmda | stride | resident | dos/dmda | dos/best static |"
	echo "|---|---|---|---|---|---|---|---|---|---|---|"
	printf '%s\n' "${bench_rows[@]}"
fi
if ((${#train_rows[@]})); then
	echo
	echo "Training iterations, $TRAIN_STEPS steps (simulated s; steady: median interval between consecutive losses; first: the first interval)"
	echo
	echo "| case | dos steady | dos first | first/steady | dmda steady | dmda first | stride | resident | dos/dmda | dos/best static |"
	echo "|---|---|---|---|---|---|---|---|---|---|"
	printf '%s\n' "${train_rows[@]}"
fi
