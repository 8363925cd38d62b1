#!/usr/bin/env python3
"""Check a postgres_exporter queries file against a live database.

    exporter_queries.py FILE DSN [--rows NAME ...]

Parses FILE (the queries.yaml format of prometheus-community/postgres_exporter),
checks its structure (a query, a list of metrics each with a known usage and
a description), runs every query through DSN and checks that its columns are
exactly the declared metrics, that labels are text and never NULL, and that
counters and gauges are numbers (gauges may be NULL).  Each query named after
--rows must return at least one row.  Prints one line per query; exits 1 on
the first failure.
"""
import decimal
import sys

import psycopg
import yaml

USAGES = {"LABEL", "COUNTER", "GAUGE", "MAPPEDMETRIC", "DURATION", "DISCARD"}
NUMBERS = (int, float, decimal.Decimal)


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def declared_metrics(name, spec):
    """The metrics of one query, as a list of (column, usage)."""
    if not isinstance(spec, dict) or not isinstance(spec.get("query"), str):
        fail(f"{name}: needs a query string")
    unknown = set(spec) - {"query", "metrics", "master", "cache_seconds"}
    if unknown:
        fail(f"{name}: unknown keys {sorted(unknown)}")
    if "master" in spec and not isinstance(spec["master"], bool):
        fail(f"{name}: master must be true or false")
    metrics = spec.get("metrics")
    if not isinstance(metrics, list) or not metrics:
        fail(f"{name}: needs a list of metrics")
    out = []
    for m in metrics:
        if not isinstance(m, dict) or len(m) != 1:
            fail(f"{name}: each metric is a mapping of one column name")
        (column, attrs), = m.items()
        if not isinstance(attrs, dict) or attrs.get("usage") not in USAGES:
            fail(f"{name}.{column}: usage must be one of {sorted(USAGES)}")
        if not isinstance(attrs.get("description"), str) or not attrs["description"]:
            fail(f"{name}.{column}: needs a description")
        out.append((str(column), attrs["usage"]))
    columns = [c for c, _ in out]
    if len(set(columns)) != len(columns):
        fail(f"{name}: a metric is declared twice")
    if not any(u not in ("LABEL", "DISCARD") for _, u in out):
        fail(f"{name}: declares no value")
    return out


def check_query(cur, name, spec, need_rows):
    metrics = declared_metrics(name, spec)
    try:
        cur.execute(spec["query"])
    except psycopg.Error as e:
        fail(f"{name}: the query failed: {e}")
    columns = [d.name for d in cur.description]
    if sorted(columns) != sorted(c for c, _ in metrics):
        fail(f"{name}: the query returns {columns}, the file declares "
             f"{[c for c, _ in metrics]}")
    rows = cur.fetchall()
    usage = dict(metrics)
    for row in rows:
        for column, value in zip(columns, row):
            u = usage[column]
            if u == "LABEL" and not isinstance(value, str):
                fail(f"{name}.{column}: a label must be text, got {value!r}")
            if u == "COUNTER" and not isinstance(value, NUMBERS):
                fail(f"{name}.{column}: a counter must be a number, got {value!r}")
            if u == "GAUGE" and value is not None and not isinstance(value, NUMBERS):
                fail(f"{name}.{column}: a gauge must be a number, got {value!r}")
            if isinstance(value, bool):
                fail(f"{name}.{column}: a boolean is not a metric")
    if need_rows and not rows:
        fail(f"{name}: returned no row")
    print(f"ok {name}: {len(metrics)} metrics, {len(rows)} rows")


def main(argv):
    if len(argv) < 3:
        fail(__doc__)
    path, dsn = argv[1], argv[2]
    need = set(argv[4:]) if len(argv) > 3 and argv[3] == "--rows" else set()
    with open(path) as f:
        doc = yaml.safe_load(f)
    if not isinstance(doc, dict) or not doc:
        fail(f"{path}: not a mapping of queries")
    missing = need - set(doc)
    if missing:
        fail(f"{path}: no query named {sorted(missing)}")
    with psycopg.connect(dsn, autocommit=True) as conn, conn.cursor() as cur:
        for name, spec in doc.items():
            check_query(cur, str(name), spec, name in need)


if __name__ == "__main__":
    main(sys.argv)
