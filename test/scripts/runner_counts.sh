#!/usr/bin/env bash
# The runner cannot hide a failure: test/count.sh is fed what pg_regress,
# pg_isolation_regress and prove print on every PostgreSQL version, and must
# count each test, fail a group that ran nothing, stopped early or exited
# non-zero without a failed test, and count skips as skipped.
set -euo pipefail
cd "$(dirname "$0")/../.."
source test/count.sh

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bad=0

# expect NAME PASSED FAILED SKIPPED: compare and reset the totals
expect() {
	local got="$PASSED $FAILED $SKIPPED" want="$2 $3 $4"
	if [ "$got" = "$want" ]; then
		echo "ok: $1 ($want)"
	else
		echo "FAIL: $1: passed failed skipped = $got, want $want"
		printf '  %s\n' "${FAILED_NAMES[@]}"
		bad=1
	fi
	PASSED=0 FAILED=0 SKIPPED=0 FAILED_NAMES=() SKIPPED_NAMES=()
}

# pg_regress of PostgreSQL 15 and earlier, a sequential and a parallel group
cat >"$tmp/15.log" <<'EOF'
============== running regression test queries        ==============
test bad_input                    ... ok           21 ms
test keys                         ... FAILED      926 ms
parallel group (2 tests):  stats patterns
     patterns                     ... ok           90 ms
     stats                        ... failed (ignored)      36 ms
 2 of 4 tests failed.
EOF
count_regress regress "$tmp/15.log" 2 4
expect "pg_regress 15: ok, FAILED, parallel ok, failed (ignored)" 2 2 0

# PostgreSQL 16 and later print TAP
cat >"$tmp/17.log" <<'EOF'
# using postmaster on /tmp/x, port 5432
ok 1         - bad_input                                  21 ms
not ok 2     - keys                                      926 ms
# parallel group (2 tests):  stats patterns
ok 3         + patterns                                   90 ms
ok 4         + stats                                      36 ms
1..4
# 1 of 4 tests failed.
EOF
count_regress regress "$tmp/17.log" 2 4
expect "pg_regress 17: ok, not ok, parallel" 3 1 0

# the same, all passing, with a test named as skipped by make
sed -e '/^not ok/d' -e 's/^1\.\.4/1..3/' "$tmp/17.log" >"$tmp/17ok.log"
echo "skipped keys: the server does not preload idempotency" >>"$tmp/17ok.log"
count_regress regress "$tmp/17ok.log" 0 4
expect "pg_regress 17 green, one skipped" 3 0 1

# a test that ran and skipped itself (its output says "skipped: why",
# test/run.sh names it) counts as skipped, not as passed
cat >"$tmp/self.log" <<'EOF'
ok 1         - bad_input                                  21 ms
ok 2         - stats                                       5 ms
1..2
skipped stats: the server does not preload idempotency
EOF
count_regress regress "$tmp/self.log" 0 2
expect "pg_regress: a test that skipped itself" 1 0 1

# a group that printed nothing a version's parser knows
printf '%s\n' '+++ regress install-check in  +++' 'some new format: bad_input passed' >"$tmp/none.log"
count_regress regress "$tmp/none.log" 0 4
expect "a group that ran no test fails" 0 1 0

# the driver stopped after two of four tests, with exit status 0
head -3 "$tmp/17.log" | sed '/^not ok/d' >"$tmp/short.log"
count_regress regress "$tmp/short.log" 0 4
expect "a group that reported fewer tests than it has fails" 1 1 0

# every test ok, but the target failed (pg_regress could not write its diffs)
count_regress regress "$tmp/17ok.log" 2 4
expect "a failed target without a failed test fails" 3 1 1

# prove -v over three files: one green, one with a failure and a skip, one
# skipped as a whole, one that died after its first assertion
cat >"$tmp/tap.log" <<'EOF'
test/t/001_crash.pl ..............
ok 1 - reserved inside an open transaction
ok 2 - another session sees in_progress
1..2
ok
test/t/020_worker.pl .............
not ok 1 - the worker is sweeping
#   Failed test 'the worker is sweeping'
ok 2 # skip no standby on this version
ok 3 - it stops
1..3
# Looks like you failed 1 test of 3.
Dubious, test returned 1 (wstat 256, 0x100)
Failed 1/3 subtests
test/t/024_pg_cron.pl ............ skipped: pg_cron is not installed (postgresql-19-cron)
test/t/050_upgrade.pl ............
ok 1 - created at 0.1.0
# died: something went wrong
Dubious, test returned 255 (wstat 65280, 0xff00)
All 1 subtests passed

Test Summary Report
-------------------
test/t/020_worker.pl (Wstat: 256 Tests: 3 Failed: 1)
  Failed test:  1
  Non-zero exit status: 1
test/t/050_upgrade.pl (Wstat: 65280 (exited 255) Tests: 1 Failed: 0)
  Non-zero exit status: 255
  Parse errors: No plan found in TAP output
Files=4, Tests=6,  9 wallclock secs
Result: FAIL
EOF
count_tap tap "$tmp/tap.log" 2 4
expect "prove: ok, not ok, # skip, skip_all, a file that died" 4 2 2

# prove with every file green, but make failed
sed -n '1,5p' "$tmp/tap.log" >"$tmp/tapok.log"
count_tap tap "$tmp/tapok.log" 0 1
expect "prove green" 2 0 0
count_tap tap "$tmp/tapok.log" 2 1
expect "prove green but the target failed" 2 1 0

# a bail-out in the first of two files: prove runs no further file
cat >"$tmp/bail.log" <<'EOF'
test/t/001_crash.pl ..............
ok 1 - reserved inside an open transaction
Bailout called.  Further testing stopped:  command "initdb" exited with value 1
EOF
count_tap tap "$tmp/bail.log" 0 2
expect "prove that stopped after a bail-out fails" 1 1 0

# a PostgreSQL built without TAP support: make prints this and succeeds
echo 'TAP tests not enabled. Try configuring with --enable-tap-tests' >"$tmp/notap.log"
count_tap tap "$tmp/notap.log" 0 8
expect "prove that ran no test fails" 0 1 0

# the last line and the exit status
PASSED=3 SKIPPED=1
if out=$(print_counts) && [ "${out##*$'\n'}" = "3 passed, 0 failed, 1 skipped" ]; then
	echo "ok: print_counts of a green run"
else
	echo "FAIL: print_counts of a green run: $out"
	bad=1
fi
PASSED=0 SKIPPED=2
if print_counts >/dev/null; then
	echo "FAIL: a run where nothing passed exits 0"
	bad=1
else
	echo "ok: a run where nothing passed exits non-zero"
fi
exit $bad
