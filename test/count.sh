# Counting for test/run.sh: reads the output of pg_regress,
# pg_isolation_regress and prove, of every PostgreSQL version, and keeps the
# totals.  Sourced by test/run.sh and by test/scripts/runner_counts.sh (which
# feeds it the output of each version, so that a format it cannot read fails
# there rather than being counted as nothing).
#
# Each count_* function takes the target's exit status too: the status says
# whether the group failed, the lines only say how many tests there were.

PASSED=0
FAILED=0
SKIPPED=0
FAILED_NAMES=()
SKIPPED_NAMES=()

# Record one result: 0 passed, skip skipped (with a reason), anything else failed
result() {
	local name=$1 ok=$2 why=${3:-}
	case "$ok" in
		0) PASSED=$((PASSED + 1)) ;;
		skip)
			SKIPPED=$((SKIPPED + 1))
			SKIPPED_NAMES+=("$name: $why")
			;;
		*)
			FAILED=$((FAILED + 1))
			FAILED_NAMES+=("$name")
			;;
	esac
}

# One pg_regress or pg_isolation_regress run: GROUP LOG STATUS FILES.
# Up to PostgreSQL 15 a test prints "test x ... ok" (or "     x ... FAILED"
# in a parallel group); from 16 on "ok 1 - x  12 ms" / "not ok 2 + x".
# "skipped x: why" (test/run.sh adds it for a test that skipped itself)
# makes test x count as skipped, not passed; a failed test still fails.
# FILES is how many tests the group has: fewer reported means the driver
# stopped early.
count_regress() {
	local group=$1 log=$2 rc=$3 files=$4 line name n=0 n_failed=0
	local re_old='^(test[[:space:]]+)?([^[:space:]]+)[[:space:]]+\.\.\.[[:space:]]+(ok|FAILED|failed)'
	local re_new='^(not[[:space:]]+)?ok[[:space:]]+[0-9]+[[:space:]]+[-+][[:space:]]+([^[:space:]]+)'
	local re_skip='^skipped ([^:]+): (.*)$'
	local -A why=() seen=()
	while IFS= read -r line; do
		[[ $line =~ $re_skip ]] && why[${BASH_REMATCH[1]}]=${BASH_REMATCH[2]}
	done <"$log"
	while IFS= read -r line; do
		line=${line#"${line%%[![:space:]]*}"}
		local ok=
		if [[ $line =~ $re_old ]]; then
			name=${BASH_REMATCH[2]}
			[ "${BASH_REMATCH[3]}" = ok ] && ok=1 || ok=0
		elif [[ $line =~ $re_new ]]; then
			name=${BASH_REMATCH[2]}
			[ -z "${BASH_REMATCH[1]}" ] && ok=1 || ok=0
		else
			continue
		fi
		n=$((n + 1))
		seen[$name]=1
		if [ "$ok" = 0 ]; then
			result "$group/$name" 1
			n_failed=$((n_failed + 1))
		elif [ -n "${why[$name]+x}" ]; then
			result "$group/$name" skip "${why[$name]}"
		else
			result "$group/$name" 0
		fi
	done <"$log"
	# a test named as skipped that the driver did not report at all
	for name in "${!why[@]}"; do
		if [ -z "${seen[$name]+x}" ]; then
			n=$((n + 1))
			result "$group/$name" skip "${why[$name]}"
		fi
	done
	group_verdict "$group" "$n" "$n" "$files" tests "$rc" "$n_failed"
}

# One prove -v run: GROUP LOG STATUS FILES.  Every assertion counts ("ok N",
# "not ok N", "ok N # skip why"); a file that skips as a whole ("x.pl ..
# skipped: why") counts once as skipped; a file that prove's summary lists
# without a failed assertion (it died, bailed out, or ran fewer tests than it
# planned) counts once as failed.  FILES is how many test files there are:
# after a bail-out prove runs no further file.
count_tap() {
	local group=$1 log=$2 rc=$3 files=$4 line file= n=0 n_files=0 n_failed=0 in_summary=0
	local re_file='^([^ ]+)\.pl \.\.+ ?(.*)$'
	local re_summary='^([^ ]+)\.pl +\(Wstat: ([0-9]+).* Failed: ([0-9]+)\)'
	local re_skip='^ok [0-9]+[^#]*# (SKIP|skip) ?(.*)$'
	while IFS= read -r line; do
		if [[ $line == "Test Summary Report"* ]]; then
			in_summary=1
		elif [ "$in_summary" = 1 ]; then
			if [[ $line =~ $re_summary ]] && [ "${BASH_REMATCH[3]}" = 0 ]; then
				result "$group/$(basename "${BASH_REMATCH[1]}") (exit status ${BASH_REMATCH[2]})" 1
				n_failed=$((n_failed + 1))
			fi
		elif [[ $line =~ $re_file ]]; then
			file=$(basename "${BASH_REMATCH[1]}")
			n_files=$((n_files + 1))
			if [[ ${BASH_REMATCH[2]} == "skipped: "* ]]; then
				n=$((n + 1))
				result "$group/$file" skip "${BASH_REMATCH[2]#skipped: }"
			fi
		elif [[ $line =~ $re_skip ]]; then
			n=$((n + 1))
			result "$group/$file ${line%% #*}" skip "${BASH_REMATCH[2]}"
		elif [[ $line =~ ^ok\ [0-9]+ ]]; then
			n=$((n + 1))
			result "$group/$file" 0
		elif [[ $line =~ ^not\ ok\ [0-9]+ ]]; then
			n=$((n + 1))
			result "$group/$file: ${line#not }" 1
			n_failed=$((n_failed + 1))
		fi
	done <"$log"
	group_verdict "$group" "$n" "$n_files" "$files" files "$rc" "$n_failed"
}

# What the group as a whole adds: GROUP TESTS REPORTED EXPECTED WHAT STATUS
# FAILED.  A group that ran no test, reported fewer WHAT than it has, or
# whose target failed without a failed test, counts once more as failed.
group_verdict() {
	local group=$1 n=$2 reported=$3 expected=$4 what=$5 rc=$6 n_failed=$7
	if [ "$n" = 0 ]; then
		result "$group (ran no test)" 1
	elif [ "$reported" -lt "$expected" ]; then
		result "$group ($reported of $expected $what reported)" 1
	elif [ "$rc" != 0 ] && [ "$n_failed" = 0 ]; then
		result "$group (exit $rc)" 1
	fi
}

# The skipped and failed tests, then the totals; false on any failure and
# when nothing passed
print_counts() {
	if [ ${#SKIPPED_NAMES[@]} -gt 0 ]; then
		echo "skipped:"
		printf '  %s\n' "${SKIPPED_NAMES[@]}"
	fi
	if [ ${#FAILED_NAMES[@]} -gt 0 ]; then
		echo "failed:"
		printf '  %s\n' "${FAILED_NAMES[@]}"
	fi
	echo "$PASSED passed, $FAILED failed, $SKIPPED skipped"
	[ "$FAILED" = 0 ] && [ "$PASSED" -gt 0 ]
}
