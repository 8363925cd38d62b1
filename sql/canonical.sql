-- RFC 8785 canonical JSON (idem_canonical) and the request fingerprint
-- (idem_hash): the RFC's own examples, a vector for every rule, the errors,
-- the hash against pgcrypto, deep nesting, a large document, databases not
-- in UTF8, and the fingerprint idem_reserve stores.
CREATE EXTENSION pgcrypto;
SELECT current_database() AS regress_db \gset

-- Both are IMMUTABLE, STRICT, PARALLEL SAFE
SELECT proname, provolatile, proisstrict, proparallel, prorettype::regtype
FROM pg_proc WHERE proname IN ('idem_canonical', 'idem_hash') ORDER BY proname;
SELECT idem_canonical(NULL) IS NULL AS canonical_null, idem_hash(NULL) IS NULL AS hash_null;

-- RFC 8785 section 3.2.2: the sample object, and its canonical form as the
-- RFC prints it (3.2.3) and as UTF-8 bytes (3.2.4)
SELECT idem_canonical('{
  "numbers": [333333333.33333329, 1E30, 4.50,
              2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA''\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
}') AS rfc_sample \gset
SELECT :'rfc_sample';
SELECT :'rfc_sample' = '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA''B\"\\\\\"/"}' AS matches_rfc;
SELECT regexp_replace(encode(convert_to(:'rfc_sample', 'UTF8'), 'hex'), '(..)(?!$)', '\1 ', 'g') AS rfc_sample_utf8;
-- its fingerprint, a fixed vector for clients
SELECT encode(idem_hash(:'rfc_sample'::jsonb), 'hex') AS rfc_sample_sha256;

-- RFC 8785 section 3.2.3: sorting by UTF-16 code units.  The emoji
-- (U+1F600, surrogates D83D DE00) sorts before U+FB33, unlike UTF-8 order.
SELECT idem_canonical('{
  "\u20ac": "Euro Sign",
  "\r": "Carriage Return",
  "\ufb33": "Hebrew Letter Dalet With Dagesh",
  "1": "One",
  "\ud83d\ude00": "Emoji: Grinning Face",
  "\u0080": "Control",
  "\u00f6": "Latin Small Letter O With Diaeresis"
}') AS rfc_sorting \gset
SELECT :'rfc_sorting';
SELECT :'rfc_sorting' = format('{"\r":"Carriage Return","1":"One","%s":"Control","%s":"Latin Small Letter O With Diaeresis","%s":"Euro Sign","%s":"Emoji: Grinning Face","%s":"Hebrew Letter Dalet With Dagesh"}',
                                chr(128), chr(246), chr(8364), chr(128512), chr(64307)) AS matches_rfc;
-- the keys in order, as code points
SELECT string_agg('U+' || upper(to_hex(ascii(c.key))), ' ' ORDER BY m.n) AS key_order
FROM regexp_matches(:'rfc_sorting', '(?:^\{|,)"(\\r|[^"\\])":', 'g') WITH ORDINALITY AS m(match, n),
     LATERAL (SELECT CASE WHEN m.match[1] = '\r' THEN E'\r' ELSE m.match[1] END) AS c(key);

-- jsonb's own text is not canonical: keys by length, spaces, number spelling
SELECT '{"aa": 1.0, "b": 4.50}'::jsonb::text AS jsonb_text,
       idem_canonical('{"aa": 1.0, "b": 4.50}') AS canonical;

-- Sorting: recursive in objects, array order kept, by code units not bytes
SELECT idem_canonical('{"b": [{"z": 1, "a": 2}, {"y": 3, "b": 4}], "a": {"d": {"c": 1, "b": 2}, "a": []}}');
SELECT idem_canonical('{"ab": 1, "a": 2, "": 3, "b": 4, "B": 5, "A": 6, "_": 7, "1": 8, "10": 9, "9": 10}');
-- supplementary characters (surrogate pairs) against U+E000..U+FFFF and below
SELECT idem_canonical('{"\uffff": 1, "\ud800\udc00": 2}') AS u10000_before_uffff,
       idem_canonical('{"\ue000": 1, "\udbff\udfff": 2}') AS u10ffff_before_ue000,
       idem_canonical('{"\ud800\udc00": 1, "\ud7ff": 2}') AS ud7ff_before_u10000;
SELECT idem_canonical('{"a\ufb33": 1, "a\ud83d\ude00": 2, "a": 3, "a\u00f6x": 4, "a\u00f6": 5}');
-- UTF-8 byte order (COLLATE "C") would put U+FB33 first
SELECT string_agg(k, ' ' ORDER BY k COLLATE "C") AS utf8_byte_order
FROM jsonb_object_keys('{"\ufb33": 1, "\ud83d\ude00": 2}') AS k;
-- A wide object (sorted by qsort, not insertion): against an independent
-- expectation built in SQL, ASCII keys where byte order is code unit order
SELECT idem_canonical(jsonb_object_agg(k, i)) =
       '{' || string_agg(format('"%s":%s', k, i), ',' ORDER BY k COLLATE "C") || '}' AS wide_object_sorted,
       count(*) AS members
FROM (SELECT i, md5(i::text) || repeat('x', i % 5) AS k FROM generate_series(1, 500) i) s;

-- Strings: only '"', '\' and U+0000..U+001F are escaped; \b \t \n \f \r,
-- lowercase \u00XX for the rest
SELECT idem_canonical(to_jsonb(string_agg(chr(i), '' ORDER BY i))) AS controls
FROM generate_series(1, 31) i;
SELECT idem_canonical('"quote \" backslash \\ slash \/ / del \u007f"') AS escapes,
       encode(convert_to(idem_canonical('"\u007f"'), 'UTF8'), 'hex') AS del_raw;
-- U+2028, U+2029, non-ASCII and astral characters are written as is
SELECT encode(convert_to(idem_canonical('"\u2028\u2029\u00e9\ud83d\ude00"'), 'UTF8'), 'hex') AS raw_utf8;
-- no Unicode normalization: precomposed and decomposed e-acute differ
SELECT idem_canonical('"\u00e9"') AS precomposed, idem_canonical('"e\u0301"') AS decomposed,
       idem_hash('"\u00e9"') = idem_hash('"e\u0301"') AS same_hash;
-- jsonb cannot hold U+0000, so its escape never appears in practice
\set VERBOSITY terse
\set ON_ERROR_STOP 0
SELECT idem_canonical('"\u0000"');
\echo :LAST_ERROR_SQLSTATE
\set VERBOSITY default

-- Literals, scalars at the top, empty containers, whitespace
SELECT idem_canonical('null') AS n, idem_canonical('true') AS t, idem_canonical('false') AS f,
       idem_canonical(' "s" ') AS s, idem_canonical('42') AS num,
       idem_canonical('{}') AS o, idem_canonical('[]') AS a,
       idem_canonical(E'[ [ ] , { } ,\n[{ "a" : [ ] }] ]') AS nested;

-- Numbers: ECMAScript Number::toString of the nearest double.
-- RFC 8785 appendix B: each double given by its exact decimal value and by
-- the RFC's own output, both must print as the RFC says
SELECT hex, idem_canonical(exact::jsonb) AS from_exact,
       idem_canonical(exact::jsonb) = expected AND idem_canonical(expected::jsonb) = expected AS ok
FROM (VALUES
('0000000000000000', '0', '0'),
('8000000000000000', '-0', '0'),
('0000000000000001', '4.940656458412465441765687928682213723650598026143247644255856825006755072702087518652998363616359923797965646954457177309266567103559397963987747960107818781263007131903114045278458171678489821036887186360569987307230500063874091535649843873124733972731696151400317153853980741262385655911710266585566867681870395603106249319452715914924553293054565444011274801297099995419319894090804165633245247571478690147267801593552386115501348035264934720193790268107107491703332226844753335720832431936092382893458368060106011506169809753078342277318329247904982524730776375927247874656084778203734469699533647017972677717585125660551199131504891101451037862738167250955837389733598993664809941164205702637090279242767544565229087538682506419718265533447265625e-324', '5e-324'),
('8000000000000001', '-4.940656458412465441765687928682213723650598026143247644255856825006755072702087518652998363616359923797965646954457177309266567103559397963987747960107818781263007131903114045278458171678489821036887186360569987307230500063874091535649843873124733972731696151400317153853980741262385655911710266585566867681870395603106249319452715914924553293054565444011274801297099995419319894090804165633245247571478690147267801593552386115501348035264934720193790268107107491703332226844753335720832431936092382893458368060106011506169809753078342277318329247904982524730776375927247874656084778203734469699533647017972677717585125660551199131504891101451037862738167250955837389733598993664809941164205702637090279242767544565229087538682506419718265533447265625e-324', '-5e-324'),
('7fefffffffffffff', '1.79769313486231570814527423731704356798070567525844996598917476803157260780028538760589558632766878171540458953514382464234321326889464182768467546703537516986049910576551282076245490090389328944075868508455133942304583236903222948165808559332123348274797826204144723168738177180919299881250404026184124858368e+308', '1.7976931348623157e+308'),
('ffefffffffffffff', '-1.79769313486231570814527423731704356798070567525844996598917476803157260780028538760589558632766878171540458953514382464234321326889464182768467546703537516986049910576551282076245490090389328944075868508455133942304583236903222948165808559332123348274797826204144723168738177180919299881250404026184124858368e+308', '-1.7976931348623157e+308'),
('4340000000000000', '9007199254740992', '9007199254740992'),
('c340000000000000', '-9007199254740992', '-9007199254740992'),
('4430000000000000', '295147905179352825856', '295147905179352830000'),
('44b52d02c7e14af5', '99999999999999974834176', '9.999999999999997e+22'),
('44b52d02c7e14af6', '99999999999999991611392', '1e+23'),
('44b52d02c7e14af7', '100000000000000008388608', '1.0000000000000001e+23'),
('444b1ae4d6e2ef4e', '999999999999999737856', '999999999999999700000'),
('444b1ae4d6e2ef4f', '999999999999999868928', '999999999999999900000'),
('444b1ae4d6e2ef50', '1000000000000000000000', '1e+21'),
('3eb0c6f7a0b5ed8c', '0.0000009999999999999997429898750123111739185333135537803173065185546875', '9.999999999999997e-7'),
('3eb0c6f7a0b5ed8d', '0.000000999999999999999954748111825886258685613938723690807819366455078125', '0.000001'),
('41b3de4355555553', '333333333.333333194255828857421875', '333333333.3333332'),
('41b3de4355555554', '333333333.3333332538604736328125', '333333333.33333325'),
('41b3de4355555555', '333333333.333333313465118408203125', '333333333.3333333'),
('41b3de4355555556', '333333333.33333337306976318359375', '333333333.3333334'),
('41b3de4355555557', '333333333.333333432674407958984375', '333333333.33333343'),
('becbf647612f3696', '-0.0000033333333333333333236658639620042521301002125255763530731201171875', '-0.0000033333333333333333'),
('43143ff3c1cb0959', '1424953923781206.25', '1424953923781206.2')
) AS v(hex, exact, expected);
-- more vectors: spelling, plain/exponent boundaries, rounding, underflow
SELECT input, idem_canonical(input::jsonb) AS canonical
FROM unnest(ARRAY[
  '0', '-0', '0.0', '-0.000e5', '1', '-1', '1.0', '1.000000', '4.50', '100', '1e2', '1E+2', '0.5e1',
  '123.456', '-123.456e-3', '0.1', '0.2', '0.30000000000000004', '10000', '10001', '1234567890.0625',
  '1e20', '1e21', '99999999999999999999', '999999999999999999999', '123456789012345678901',
  '12345678901234567890', '0.000001', '0.0000001', '1e-6', '1e-7', '1.5e-7', '0.00001234', '-1e-7',
  '9007199254740991', '9007199254740992', '9007199254740993', '9007199254740995', '-9007199254740993',
  '18446744073709551615', '1e23', '1e308', '1.7976931348623158e308', '2.2250738585072014e-308',
  '4.9406564584124654e-324', '2.4703282292062328e-324', '2.4703282292062327e-324', '1e-324',
  '1e-400', '-1e-400', '1e-1000',
  '3.14159265358979323846264338327950288419716939937510',
  '0.1000000000000000055511151231257827021181583404541015625',
  '123456789012345.6', '12345678901234.56', '1234567890123456.7'
]) WITH ORDINALITY AS t(input, n)
ORDER BY n;

-- Numbers beyond the double range: ERROR 22003, wherever they are
SELECT idem_canonical('1e309');
\set VERBOSITY terse
SELECT idem_canonical('-1e309');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_canonical('1.7976931348623159e308');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_canonical(('[' || repeat('9', 400) || ']')::jsonb);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_hash('{"a": [1, {"b": 1e999}]}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idem_reserve('canon-pay', 'canon-overflow', '{"amount": 1e400}');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS nothing_kept FROM idem_keys WHERE key = 'canon-overflow';
\set VERBOSITY default

-- idem_hash is SHA-256 of the UTF-8 bytes of idem_canonical (pgcrypto agrees)
-- (checked right after hashes that an error left unfinished: the backend
-- reuses one SHA-256 context, and each hash starts it afresh)
SELECT count(*) AS docs,
       count(*) FILTER (WHERE idem_hash(d) = digest(idem_canonical(d), 'sha256')) AS hash_matches,
       count(*) FILTER (WHERE idem_hash(d) = sha256(convert_to(idem_canonical(d), 'UTF8'))) AS builtin_matches
FROM unnest(ARRAY[
  :'rfc_sample'::jsonb, :'rfc_sorting'::jsonb, 'null', '1.5e300', '"\u0001\u2028\ud83d\ude00"',
  '{"amount": 4.50, "currency": "EUR", "items": [{"sku": "A-1", "qty": 2}]}', '[]', '{}'
]) AS d;
SELECT encode(idem_hash('{"amount": 100, "currency": "BRL"}'), 'hex') AS fingerprint;

-- Deep nesting: 10000 levels work; past max_stack_depth it is a clean error
CREATE TEMP TABLE canon_deep AS
SELECT (repeat('[', 10000) || repeat(']', 10000))::jsonb AS arrays,
       (repeat('{"a":', 10000) || '1' || repeat('}', 10000))::jsonb AS objects;
SELECT length(idem_canonical(arrays)) AS arrays_len, length(idem_canonical(objects)) AS objects_len,
       idem_hash(objects) = digest(idem_canonical(objects), 'sha256') AS hash_ok
FROM canon_deep;
SET max_stack_depth = '100kB';
\set VERBOSITY terse
SELECT length(idem_canonical(arrays)) FROM canon_deep;
\echo :LAST_ERROR_SQLSTATE
SELECT length(idem_hash(objects)) FROM canon_deep;
\echo :LAST_ERROR_SQLSTATE
\set VERBOSITY default
RESET max_stack_depth;

-- A large document (tens of MB): against its canonical text built in SQL;
-- idem_hash streams it through SHA-256 and must agree
CREATE TEMP TABLE canon_big AS
SELECT jsonb_agg(jsonb_build_object('id', i, 'amount', i * 1.10, 'currency', 'BRL',
                                    'memo', repeat('x', 100) || i,
                                    'tags', jsonb_build_array('a', i % 7, true, null))
                 ORDER BY i) AS doc,
       '[' || string_agg(format('{"amount":%s,"currency":"BRL","id":%s,"memo":"%s","tags":["a",%s,true,null]}',
                                (i * 1.10)::float8, i, repeat('x', 100) || i, i % 7), ',' ORDER BY i) || ']' AS want
FROM generate_series(1, 150000) i;
SELECT octet_length(doc::text) > 25000000 AS tens_of_mb,
       idem_canonical(doc) = want AS canonical_ok,
       idem_hash(doc) = digest(want, 'sha256') AS hash_ok
FROM canon_big;
DROP TABLE canon_big;

-- idem_reserve's fingerprint is idem_hash: number spelling and key order
-- no longer matter, the value does
SELECT outcome FROM idem_reserve('canon-pay', 'canon-1', '{"amount": 1.0, "fee": 4.50, "meta": {"b": 1, "a": 2}}');
SELECT idem_complete('canon-pay', 'canon-1', '{"id": "pay_1"}', 201);
SELECT outcome, http_status, response FROM idem_reserve('canon-pay', 'canon-1', '{"meta": {"a": 2.0, "b": 1e0}, "fee": 4.5, "amount": 1}');
SELECT outcome, http_status FROM idem_reserve('canon-pay', 'canon-1', '{"amount": 1.01, "fee": 4.5, "meta": {"a": 2, "b": 1}}');
SELECT outcome, http_status FROM idem_reserve('canon-pay', 'canon-1', '{"amount": 1, "fee": 4.5, "meta": {"a": 2, "b": 1}, "x": null}');
SELECT request_hash = idem_hash('{"amount":1,"fee":4.5,"meta":{"a":2,"b":1}}') AS is_idem_hash,
       request_hash = digest('{"amount":1,"fee":4.5,"meta":{"a":2,"b":1}}', 'sha256') AS is_sha256_of_canonical
FROM idem_keys WHERE operation = 'canon-pay' AND key = 'canon-1';
DELETE FROM idem_keys WHERE operation = 'canon-pay';

-- A database in WIN1252: keys are sorted by their Unicode code units (é
-- U+00E9 before € U+20AC, though € is byte 0x80 there), idem_canonical is
-- text in the database encoding, idem_hash hashes UTF-8 and equals the hash
-- computed in a UTF8 database
SELECT encode(idem_hash('{"€": "euro", "é": "café", "z": "ÿ\n"}'), 'hex') AS utf8_hash,
       encode(idem_hash('{"ключ": "значение", "😀": 1}'), 'hex') AS utf8_hash_2 \gset
CREATE DATABASE idem_canonical_win1252 ENCODING 'WIN1252' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0;
\c idem_canonical_win1252
SET client_encoding = 'UTF8';
CREATE EXTENSION idempotency;
SELECT idem_canonical('{"€": "euro", "é": "café", "z": "ÿ\n"}') AS canonical,
       encode(idem_hash('{"€": "euro", "é": "café", "z": "ÿ\n"}'), 'hex') = :'utf8_hash' AS same_hash_as_utf8,
       idem_hash('{"€": "euro", "é": "café", "z": "ÿ\n"}') =
         sha256(convert_to(idem_canonical('{"€": "euro", "é": "café", "z": "ÿ\n"}'), 'UTF8')) AS hash_of_utf8;
-- A database in SQL_ASCII: bytes are taken as UTF-8, and refused when they are not
CREATE DATABASE idem_canonical_sql_ascii ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0;
\c idem_canonical_sql_ascii
SET client_encoding = 'UTF8';
CREATE EXTENSION idempotency;
SELECT idem_canonical('{"😀": 1, "ключ": "значение"}') AS canonical,
       encode(idem_hash('{"ключ": "значение", "😀": 1}'), 'hex') = :'utf8_hash_2' AS same_hash_as_utf8;
SELECT idem_canonical(('["' || convert_from('\xff'::bytea, 'SQL_ASCII') || '"]')::jsonb);
\set VERBOSITY terse
SELECT idem_hash(('{"' || convert_from('\xc3'::bytea, 'SQL_ASCII') || '": 1, "b": 2}')::jsonb);
\echo :LAST_ERROR_SQLSTATE
\set VERBOSITY default
\c :regress_db
DROP DATABASE idem_canonical_win1252;
DROP DATABASE idem_canonical_sql_ascii;
