#!/usr/bin/env bash
# The Python client's tests and packaging checks (doc/clients.md, issue 32).
#
# Run as any user with libpq's environment (PGHOST, PGPORT, PGUSER a
# superuser, PGDATABASE an existing database) pointing at a server that has
# the idempotency extension installed. The tests create (and drop) their
# own databases: ${PG_IDEMPOTENCY_TEST_DB:-pg_idempotency_test}, _noext, _old.
#
# 1. a virtual environment with requirements.txt (cached under
#    ${IDEM_CLIENT_CACHE:-/var/tmp/idempotency-cache}/python);
# 2. pytest: every integration through its framework's test client;
# 3. mypy --strict on the package (and the demo app);
# 4. python -m build: a wheel and an sdist, the wheel installed into a fresh
#    virtual environment and imported.
# Exits non-zero on any failure, and when no test ran.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
source "$here/scripts/venv.sh"

export PYTHONDONTWRITEBYTECODE=1
tmp="$(mktemp -d "${TMPDIR:-/tmp}/pg-idempotency-test.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

: "${PGHOST:?PGHOST must be set (libpq environment)}"
: "${PGDATABASE:?PGDATABASE must be set (an existing database)}"

venv="$(idem_py_venv)"
py="$venv/bin/python"
echo "== python client: $("$py" --version), $("$py" -c 'import psycopg; print("psycopg", psycopg.__version__, "libpq", psycopg.pq.version())')"

echo "== pytest"
set +e
PYTHONPATH="$here/src:$here/tests" nice -n 10 "$py" -m pytest -p no:cacheprovider -q \
	-o junit_family=xunit2 --junitxml="$tmp/junit.xml" tests 2>&1 | tee "$tmp/pytest.log"
rc=${PIPESTATUS[0]}
set -e
summary="$(grep -E '^(=+ )?[0-9]+ (passed|failed)' "$tmp/pytest.log" | tail -1 || true)"
passed="$(sed -n 's/.* tests="\([0-9]*\)".*/\1/p' "$tmp/junit.xml" | head -1)"
failures="$(sed -n 's/.*<testsuite[^>]* failures="\([0-9]*\)".*/\1/p' "$tmp/junit.xml" | head -1)"
errors="$(sed -n 's/.*<testsuite[^>]* errors="\([0-9]*\)".*/\1/p' "$tmp/junit.xml" | head -1)"
skipped="$(sed -n 's/.*<testsuite[^>]* skipped="\([0-9]*\)".*/\1/p' "$tmp/junit.xml" | head -1)"
if [ "$rc" -ne 0 ]; then
	echo "python client: pytest failed (exit $rc): $summary" >&2
	exit 1
fi
if [ -z "$passed" ] || [ "$passed" -eq 0 ]; then
	echo "python client: no test ran" >&2
	exit 1
fi
failed=$(( ${failures:-0} + ${errors:-0} ))
ran=$(( passed - ${skipped:-0} - failed ))

echo "== mypy --strict"
(cd "$here" && nice -n 10 "$py" -m mypy --strict --cache-dir "$tmp/mypy" src/pg_idempotency)
(cd "$here" && MYPYPATH="$here/src" nice -n 10 "$py" -m mypy --strict --cache-dir "$tmp/mypy" demo/app.py)

echo "== python -m build"
# the tree is read-only for the suite's user: build from a copy
mkdir "$tmp/src"
cp -r "$here/pyproject.toml" "$here/README.md" "$here/CHANGELOG.md" "$here/LICENSE" "$here/src" "$here/tests" "$tmp/src/"
nice -n 10 "$py" -m build --no-isolation --outdir "$tmp/dist" "$tmp/src" > "$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; exit 1; }
wheel="$(ls "$tmp"/dist/pg_idempotency-0.1.0-py3-none-any.whl)"
sdist="$(ls "$tmp"/dist/pg_idempotency-0.1.0.tar.gz)"
"$py" -c 'import sys, zipfile; sys.exit("pg_idempotency/py.typed" not in zipfile.ZipFile(sys.argv[1]).namelist())' "$wheel" \
	|| { echo "python client: the wheel lacks py.typed" >&2; exit 1; }
"$py" -c 'import sys, tarfile; names = tarfile.open(sys.argv[1]).getnames(); sys.exit(not {"pg_idempotency-0.1.0/LICENSE", "pg_idempotency-0.1.0/src/pg_idempotency/py.typed"} <= set(names))' "$sdist" \
	|| { echo "python client: the sdist lacks LICENSE or py.typed" >&2; exit 1; }
echo "built $(basename "$wheel") and $(basename "$sdist")"

echo "== the wheel in a fresh environment"
"$(idem_py_python)" -m venv "$tmp/clean"
PIP_CACHE_DIR="$(idem_py_cache)/pip" nice -n 10 "$tmp/clean/bin/python" -m pip install --disable-pip-version-check \
	--no-input -q -c "$here/requirements.txt" "$wheel"
(cd "$tmp" && "$tmp/clean/bin/python" - <<'PY'
import importlib.resources
import pg_idempotency
from pg_idempotency import AsyncIdempotency, Idempotency, IdempotencySettings, parse_key
assert pg_idempotency.__version__ == "0.1.0", pg_idempotency.__version__
assert parse_key(['"abc"']) == "abc"
assert importlib.resources.files("pg_idempotency").joinpath("py.typed").is_file()
assert "site-packages" in pg_idempotency.__file__, pg_idempotency.__file__
print("imported pg_idempotency", pg_idempotency.__version__, "from", pg_idempotency.__file__)
PY
)

echo "python client: $ran passed, $failed failed, ${skipped:-0} skipped"
