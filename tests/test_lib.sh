# shellcheck shell=sh
# The preamble the shell tests (tests/test_*.sh) share; each sources it after `set -u`:
#   . "$(dirname "$0")/test_lib.sh"
# (found next to the test: in the source tree under make check, VPATH builds and distcheck
# included, since the test driver runs a test by its path, and in the device bundle,
# where tools/make-device-bundle.sh copies it next to test_train.sh). Not a test itself.
#
# $work: a scratch folder, removed on exit. fail MESSAGE: "FAIL: MESSAGE" on stderr, exit 1.
# wait_for_line PATTERN FILE TENTHS: waits until FILE has a line matching PATTERN (grep),
# at most TENTHS tenths of a second; returns 1 if it never came (a run in the background).
# STARPU_SILENT=1: StarPU's banners stay out of the logs the tests read (make check sets
# it too, but the tests also run on their own).
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() {
	echo "FAIL: $*" >&2
	exit 1
}
export STARPU_SILENT=1
wait_for_line() {
	for _ in $(seq 1 "$3"); do
		grep -q -- "$1" "$2" 2>/dev/null && return 0
		sleep 0.1
	done
	return 1
}
