-- Every update of a record holds the key lock for the write itself, as a
-- reservation holds it while it reads and claims.  Unless an update is HOT,
-- the new version gets a primary-key entry of its own; a reservation whose
-- index scan read the key's entries before it, and the old version after the
-- update committed, would see neither version, insert a second row and fail
-- with 23505 instead of answering.  A BEFORE UPDATE trigger runs inside the
-- write and shows whether this backend holds the key lock there.
\pset null '(null)'
SET idempotency.processing_timeout = '5min';
DELETE FROM idem_keys;
CREATE FUNCTION key_lock_seen() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	RAISE NOTICE '% of % to %, under the key lock: %', TG_OP, NEW.key, NEW.status,
		EXISTS (SELECT FROM pg_catalog.pg_locks
				WHERE locktype = 'advisory' AND objsubid = 26980
				  AND pid = pg_catalog.pg_backend_pid()
				  AND mode = 'ExclusiveLock' AND granted);
	RETURN NEW;
END
$$;
CREATE TRIGGER key_lock_seen BEFORE UPDATE ON idem_keys
	FOR EACH ROW EXECUTE FUNCTION key_lock_seen();

-- checkpoint and completion
SELECT outcome FROM idem_reserve('locks', 'k1');
SELECT idem_checkpoint('locks', 'k1', 'step 1');
SELECT idem_complete('locks', 'k1', '{}', 201);

-- renewal of an expired record
ALTER TABLE idem_keys DISABLE TRIGGER key_lock_seen;
UPDATE idem_keys SET expires_at = now() - interval '1 second' WHERE key = 'k1';
ALTER TABLE idem_keys ENABLE TRIGGER key_lock_seen;
SELECT outcome FROM idem_reserve('locks', 'k1');

-- flagging a record stuck
ALTER TABLE idem_keys DISABLE TRIGGER key_lock_seen;
UPDATE idem_keys SET updated_at = now() - interval '1 hour' WHERE key = 'k1';
ALTER TABLE idem_keys ENABLE TRIGGER key_lock_seen;
SELECT idem_flag_stuck();

-- and a plain UPDATE, for contrast: the key lock is the extension's own
UPDATE idem_keys SET recovery_point = 'by hand' WHERE key = 'k1';

-- nothing is left held after the calls
SELECT count(*) AS key_locks_held FROM pg_locks
WHERE locktype = 'advisory' AND objsubid = 26980 AND pid = pg_backend_pid();

DROP TRIGGER key_lock_seen ON idem_keys;
DROP FUNCTION key_lock_seen();
DELETE FROM idem_keys;
