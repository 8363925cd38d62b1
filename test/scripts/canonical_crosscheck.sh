#!/usr/bin/env bash
# Cross-check idem_canonical and idem_hash against an independent RFC 8785
# implementation: Node.js (JSON.parse, then JSON.stringify with recursively
# sorted keys) over thousands of seeded random documents with numbers at
# every decimal exponent, ties between doubles, integers near 2^53,
# underflow to zero, escapes, control characters, astral characters and
# keys whose UTF-16 order differs from their UTF-8 order.  Every document is
# compared; the first difference is printed and fails the check.
#
# Environment: CANON_COUNT (documents, default 4000), CANON_SEED (default 8785).

set -euo pipefail

count=${CANON_COUNT:-4000}
seed=${CANON_SEED:-8785}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
db=idem_canonical_xcheck
trap 'rm -rf "$tmp"; psql -X -q -d postgres -c "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1 || true' EXIT

node --version >/dev/null || { echo "node is not installed"; exit 1; }
node "$here/canonical_crosscheck.mjs" "$tmp/docs.tsv" "$count" "$seed"
echo "generated $count documents with Node.js $(node --version) (seed $seed)"

psql -X -q -v ON_ERROR_STOP=1 -d postgres -c "SET client_min_messages = warning" \
	-c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"

# Base64 keeps COPY from interpreting anything in the documents
out=$(psql -X -q -At -v ON_ERROR_STOP=1 -d "$db" <<SQL
CREATE EXTENSION idempotency;
CREATE TABLE xcheck (id int PRIMARY KEY, doc_b64 text, canon_b64 text, hash_hex text);
\copy xcheck FROM '$tmp/docs.tsv'
-- an error (from jsonb input or from us) is a difference, shown with its document
CREATE FUNCTION try_canonical(doc text, OUT canon text, OUT hash text) LANGUAGE plpgsql AS \$\$
BEGIN
  canon := idem_canonical(doc::jsonb);
  hash := encode(idem_hash(doc::jsonb), 'hex');
EXCEPTION WHEN OTHERS THEN
  canon := 'ERROR: ' || SQLERRM;
  hash := canon;
END
\$\$;
CREATE TABLE result AS
SELECT id, doc_b64,
       convert_from(decode(canon_b64, 'base64'), 'UTF8') AS want,
       (t).canon AS got,
       hash_hex AS want_hash,
       (t).hash AS got_hash
FROM (SELECT id, doc_b64, canon_b64, hash_hex,
             try_canonical(convert_from(decode(doc_b64, 'base64'), 'UTF8')) AS t
      FROM xcheck OFFSET 0) s;
SELECT count(*) || ' ' ||
       count(*) FILTER (WHERE got = want) || ' ' ||
       count(*) FILTER (WHERE got_hash = want_hash) || ' ' ||
       sum(octet_length(want))
FROM result;
SQL
)
read -r total canon_ok hash_ok bytes <<<"$out"
echo "compared $total documents ($bytes bytes of canonical JSON):" \
	"idem_canonical matched $canon_ok, idem_hash matched $hash_ok"

if [ "$total" != "$count" ] || [ "$canon_ok" != "$count" ] || [ "$hash_ok" != "$count" ]; then
	echo "FIRST DIFFERENCE:"
	psql -X -q -d "$db" <<'SQL'
\pset format unaligned
\x on
SELECT id, pos AS first_differing_char,
       substr(want, greatest(pos - 60, 1), 120) AS node_canonical_near_it,
       substr(got, greatest(pos - 60, 1), 120) AS idem_canonical_near_it,
       want_hash AS node_sha256, got_hash AS idem_hash,
       octet_length(document) AS document_bytes,
       left(document, 4000) AS document_first_4000_chars
FROM (SELECT r.*, convert_from(decode(doc_b64, 'base64'), 'UTF8') AS document,
             (SELECT min(i) FROM generate_series(1, greatest(length(want), length(got)) + 1) i
              WHERE substr(want, i, 1) IS DISTINCT FROM substr(got, i, 1)) AS pos
      FROM result r
      WHERE got IS DISTINCT FROM want OR got_hash IS DISTINCT FROM want_hash
      ORDER BY id
      LIMIT 1) s;
SQL
	exit 1
fi
echo "ok: idem_canonical and idem_hash agree with Node.js on all $count documents"
