# shellcheck shell=bash
# The counting the multi-check scripts share (tests/sim_policies.sh, tests/sim_cluster.sh):
# each runs many checks, keeps going after a failure so that one run shows them all, and
# leaves a test-suite-style summary for make check. Each sources it after `set -u`:
#   . "$(dirname "${BASH_SOURCE[0]}")/check_lib.sh"
# Not a test itself.
#
# check DESCRIPTION STATUS: counts a PASS when STATUS (an exit status) is 0, else a FAIL.
# end_checks NAME SUMMARY_FILE: writes "# PASS: n" / "# FAIL: n" to SUMMARY_FILE, says
# "NAME: n passed, m failed", and returns non-zero when a check failed.
pass=0 fail=0

check() {
	if [[ $2 == 0 ]]; then
		echo "PASS: $1"
		pass=$((pass + 1))
	else
		echo "FAIL: $1"
		fail=$((fail + 1))
	fi
}

end_checks() {
	printf '# PASS: %d\n# FAIL: %d\n' "$pass" "$fail" >"$2"
	echo "$1: $pass passed, $fail failed"
	[[ $fail == 0 ]]
}
