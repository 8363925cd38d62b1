#!/usr/bin/env bash
# The suite on every PostgreSQL that Debian ships: `bash test/matrix.sh` (as root).
#
# For each Debian suite it copies a clean `git archive` of HEAD (committed
# work only) into a fresh minimal root of that suite (test/debroot.sh: made
# with debootstrap once, cached, an overlay thrown away after each run) and
# runs the README's test command there as root, `PGVER=N bash test/run.sh`,
# exactly as on a new machine: it installs its own packages with apt-get.
# Where a root can install two majors side by side, it also runs
# test/pg_upgrade.sh there (pg_upgrade and pg_upgradecluster from the older
# to the newer, with the extension installed and records of every status):
# experimental, 18 -> 19.  Then it prints a table of version x passed /
# failed / skipped / wall time and exits non-zero if any row failed.  Every mount is made in the
# run's own namespaces and unmounted when it ends.
#
#   bash test/matrix.sh                  bookworm (15), trixie (17), sid (18), experimental (19)
#   bash test/matrix.sh sid experimental only those
#
# Environment: IDEM_MATRIX_ONLY=suite|upgrade (run only the suites, or only
# the major-version upgrades), IDEM_ROOTS (cache of the roots, default
# /var/cache/idempotency/roots), IDEM_MIRROR (Debian mirror), IDEM_MATRIX_REV
# (the commit to test, default HEAD), IDEM_MATRIX_LOGS (directory for one
# full log per version, default a new directory under /tmp, kept),
# IDEM_MATRIX_VERBOSE=1 (also print every run's output as it goes).

set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/debroot.sh"

debroot_need_root matrix

# The PostgreSQL each root's suite ships
declare -A PGVER_OF=([bookworm]=15 [trixie]=17 [sid]=18 [experimental]=19)
# The older major each root can install beside its own, for test/pg_upgrade.sh
declare -A UPGRADE_FROM=([experimental]=18)
only=${IDEM_MATRIX_ONLY:-all}
case "$only" in
	all | suite | upgrade) ;;
	*) echo "matrix: IDEM_MATRIX_ONLY must be suite or upgrade" >&2; exit 2 ;;
esac

names=("$@")
[ ${#names[@]} -eq 0 ] && names=(bookworm trixie sid experimental)
for name in "${names[@]}"; do
	[ -n "${PGVER_OF[$name]:-}" ] || {
		echo "matrix: unknown root \"$name\" (bookworm, trixie, sid or experimental)" >&2
		exit 2
	}
done

repo=$(cd "$here/.." && pwd)
rev=$(git -C "$repo" rev-parse --verify "${IDEM_MATRIX_REV:-HEAD}^{commit}")
logs=${IDEM_MATRIX_LOGS:-$(mktemp -d /tmp/idempotency-matrix.XXXXXX)}
mkdir -p "$logs"
src=$(mktemp -d /tmp/idempotency-matrix-src.XXXXXX)
trap 'rm -rf "$src"' EXIT
git -C "$repo" archive "$rev" | tar -x -C "$src"

echo "== matrix of $(git -C "$repo" log -1 --format='%h %s' "$rev")"
if [ -z "${IDEM_MATRIX_REV:-}" ] && [ -n "$(git -C "$repo" status --porcelain --untracked-files=no)" ]; then
	echo "== note: uncommitted changes are not tested (a git archive of HEAD is)"
fi
echo "== logs in $logs"

rows=()
any_failed=0
# One row: run command (a string, in the root's copy of the tree) in root
# name, labelled "label" (a version, or OLD->NEW)
run_row() {
	local name=$1 label=$2 what=$3 command=$4 log rc start secs summary passed failed skipped result
	log=$logs/$name-$label.log
	log=${log//>/}
	echo "== $name ($what): running"
	start=$(date +%s)
	rc=0
	if [ "${IDEM_MATRIX_VERBOSE:-0}" = 1 ]; then
		debroot_run "$name" --copy "$src:/root/idempotency" -- \
			bash -c "cd /root/idempotency && $command" 2>&1 |
			tee "$log" || rc=${PIPESTATUS[0]}
	else
		debroot_run "$name" --copy "$src:/root/idempotency" -- \
			bash -c "cd /root/idempotency && $command" \
			>"$log" 2>&1 || rc=$?
	fi
	secs=$(($(date +%s) - start))
	# The runner's last line: "N passed, N failed" and, where it counts them, ", N skipped"
	summary=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1 || true)
	passed=$(sed -nE 's/^([0-9]+) passed.*/\1/p' <<<"$summary")
	failed=$(sed -nE 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/p' <<<"$summary")
	skipped=$(sed -nE 's/.*, ([0-9]+) skipped.*/\1/p' <<<"$summary")
	if [ "$rc" = 0 ] && [ -n "$summary" ] && [ "$failed" = 0 ] && [ "${passed:-0}" -gt 0 ]; then
		result=ok
	else
		result="FAILED (exit $rc)"
		[ -n "$summary" ] || result="FAILED (exit $rc, no summary line)"
		any_failed=1
		echo "== $name: last lines of $log"
		tail -n 25 "$log" | sed 's/^/   /'
	fi
	rows+=("$(printf '%-7s  %-12s  %6s  %6s  %7s  %6s  %s' "$label" "$name" \
		"${passed:--}" "${failed:--}" "${skipped:-0}" \
		"$((secs / 60))m$(printf '%02d' $((secs % 60)))s" "$result")")
	echo "${rows[-1]}"
}

for name in "${names[@]}"; do
	ver=${PGVER_OF[$name]}
	if [ "$only" != upgrade ]; then
		run_row "$name" "$ver" "PostgreSQL $ver" "PGVER=$ver bash test/run.sh"
	fi
	from=${UPGRADE_FROM[$name]:-}
	if [ "$only" != suite ] && [ -n "$from" ]; then
		run_row "$name" "$from->$ver" "pg_upgrade $from -> $ver" \
			"bash test/pg_upgrade.sh $from $ver"
	fi
done

echo
echo "matrix of $(git -C "$repo" log -1 --format='%h %s' "$rev")"
printf '%-7s  %-12s  %6s  %6s  %7s  %6s  %s\n' version suite passed failed skipped time result
printf '%s\n' "${rows[@]}"
exit $any_failed
