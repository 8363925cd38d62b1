-- For 85_storm and 90_faults: the payment INSERT (the effect of every
-- variant) takes bench.effect_ms milliseconds, and tells the client that
-- this attempt ran it (a notice the load generator counts).
CREATE FUNCTION bench_effect_delay() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_sleep(current_setting('bench.effect_ms')::float8 / 1000);
	RAISE NOTICE 'bench effect';
	RETURN NEW;
END
$$;

CREATE TRIGGER bench_effect_delay BEFORE INSERT ON bench_payments
	FOR EACH ROW EXECUTE FUNCTION bench_effect_delay();
