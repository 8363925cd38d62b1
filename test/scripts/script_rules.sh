#!/usr/bin/env bash
# The extension's install source and upgrade scripts follow the rules
# CVE-2023-39417 taught: a script runs as a superuser (the extension is not
# trusted), so nothing in it may run code that another role chose, or
# resolve a name to an object that another role could have created.
#   1. No DML (INSERT, UPDATE, DELETE, MERGE, TRUNCATE, COPY): the owner of
#      idem_keys or idem_reconcilers, or a role granted TRIGGER on them, may
#      have given them triggers, rules or policies, which would fire as the
#      superuser (test/t/051_upgrade_runs_no_role_code.pl runs the attack).
#   2. No CREATE OR REPLACE and no CREATE ... IF NOT EXISTS: another role
#      could have created the object first, and the script would adopt it.
#   3. @extschema@ only as a schema qualifier ("@extschema@."), where
#      PostgreSQL substitutes the quoted identifier.
#   4. Every SQL or PL/pgSQL routine pins search_path (SET search_path).
#   5. Inside code (DO blocks and routine bodies), operators are written
#      OPERATOR(pg_catalog.x): an operator another role created in a schema
#      on search_path could be a better match than pg_catalog's.
# The scripts checked: idempotency.sql (the install source) and every
# upgrade script.  Released install scripts (idempotency--0.1.0.sql) are
# kept as released and are not checked.
set -euo pipefail
cd "$(dirname "$0")/../.."

python3 - idempotency.sql idempotency--*--*.sql <<'PY'
import re, sys

bad = 0

def fail(path, rule, text):
    global bad
    bad = 1
    print("FAIL: %s: %s: %s" % (path, rule, " ".join(text.split())[:120]))

def strip_comments(sql):
    # -- comments to the end of the line, outside string literals
    out = []
    for line in sql.split("\n"):
        q = False
        for i, c in enumerate(line):
            if c == "'":
                q = not q
            elif not q and line.startswith("--", i):
                line = line[:i]
                break
        out.append(line)
    return "\n".join(out)

def strip_literals(code):
    return re.sub(r"'(?:[^']|'')*'", "''", code)

for path in sys.argv[1:]:
    sql = strip_comments(open(path).read())
    # psql meta-commands (\echo ... \quit) are not run by CREATE EXTENSION
    sql = "\n".join(l for l in sql.split("\n") if not l.startswith("\\"))
    flat = strip_literals(sql)

    # 1. DML
    for m in re.finditer(r"\b(INSERT\s+INTO|UPDATE\s+[\w@.\"]+\s+(?:AS\s+\w+\s+)?SET|"
                         r"DELETE\s+FROM|TRUNCATE|MERGE\s+INTO|COPY\s+[\w@.\"]+)\b",
                         flat, re.I):
        fail(path, "DML", flat[m.start():m.start() + 80])

    # 2. objects adopted from another role
    for m in re.finditer(r"\bOR\s+REPLACE\b|\bCREATE\s+(?:\w+\s+){0,3}IF\s+NOT\s+EXISTS\b",
                         flat, re.I):
        fail(path, "CREATE OR REPLACE / IF NOT EXISTS", flat[m.start():m.start() + 80])

    # 3. @extschema@ as a qualifier only
    for m in re.finditer(r"@extschema@(?!\.)", sql):
        fail(path, "@extschema@ not followed by '.'", sql[max(0, m.start() - 40):m.end() + 20])

    # 4. routines in SQL or PL/pgSQL pin search_path
    for m in re.finditer(r"\bCREATE\s+(?:OR\s+REPLACE\s+)?(?:FUNCTION|PROCEDURE)\b.*?(?=\n(?:CREATE|COMMENT|REVOKE|GRANT|ALTER|SELECT|DO)\b|\Z)",
                         sql, re.S | re.I):
        stmt = m.group(0)
        if re.search(r"\bLANGUAGE\s+(?:sql|plpgsql)\b", stmt, re.I) and \
           not re.search(r"\bSET\s+search_path\s*(?:=|TO)", stmt, re.I):
            fail(path, "routine without SET search_path", stmt[:80])

    # 5. operators in code: the text inside dollar quotes
    for m in re.finditer(r"(\$\w*\$)(.*?)\1", sql, re.S):
        code = strip_literals(m.group(2))
        # RAISE ... USING option = value is not an operator
        code = re.sub(r"\b(?:ERRCODE|DETAIL|HINT|MESSAGE|COLUMN|CONSTRAINT|DATATYPE|TABLE|SCHEMA)\s*=", "", code)
        for o in re.finditer(r"(?<![:=<>!~])(<>|<=|>=|!=|=(?!>)|<|>|~)", code):
            before = code[max(0, o.start() - 20):o.start()]
            if before.endswith("OPERATOR(pg_catalog."):
                continue
            fail(path, "operator not written OPERATOR(pg_catalog.x)",
                 code[max(0, o.start() - 40):o.end() + 20])

    if not bad:
        print("ok: %s" % path)

sys.exit(bad)
PY
