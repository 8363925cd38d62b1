-- For 95_scale: the keys of the records it loads, as the load generator
-- makes them for new requests (bench/loadgen.c, --key-shape), so that
-- replays can name loaded records and new keys fall among them.
--   uuid4: random (md5 of the record's number, as a uuid)
--   uuid7: time-ordered: 48 bits of milliseconds (record i at base + i ms,
--          base in bench_scale_base, all before the runs' clock), then
--          version 7 and random bits
CREATE TABLE bench_scale_base (ms bigint NOT NULL);

CREATE FUNCTION bench_scale_key(shape text, i bigint) RETURNS text
LANGUAGE sql STABLE AS $$
	SELECT CASE shape
		WHEN 'uuid4' THEN md5(i::text)::uuid::text
		ELSE (SELECT substr(t, 1, 8) || '-' || substr(t, 9, 4) || '-7' || substr(m, 1, 3)
				  || '-8' || substr(m, 4, 3) || '-' || substr(m, 7, 12)
			  FROM (SELECT lpad(to_hex(b.ms + i), 12, '0') AS t, md5(i::text) AS m
					FROM bench_scale_base b) s)
	END
$$;
