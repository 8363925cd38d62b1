-- idempotency 0.1.0 -> 0.2.0: run by ALTER EXTENSION idempotency UPDATE.
--
-- Every catalog change of release 0.2.0 goes here, and the same change goes
-- into idempotency.sql, so that a database updated from 0.1.0 and one
-- created at 0.2.0 hold the same objects (test/t checks both).  Records and
-- reconcilers stay as they are, with their meaning.

\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.2.0'" to load this file. \quit

-- No change below rewrites or reads a table under a lock that blocks its
-- writers: each is a catalog change.  Each ALTER TABLE waits for its
-- table's ACCESS EXCLUSIVE lock, though, and every writer queues behind
-- that wait: without a lock_timeout of the caller's, take the locks within
-- a few seconds, so that a long transaction on idem_keys makes the update
-- fail (run it again) rather than stall the application.  Set here, it
-- lasts as long as this script.
SELECT pg_catalog.set_config('lock_timeout', '5s', true)
WHERE pg_catalog.current_setting('lock_timeout') OPERATOR(pg_catalog.=) '0';

-- Monitoring: the views idem_worker_status and idem_backlog

CREATE FUNCTION @extschema@.idem_worker_status(
	OUT datid oid,
	OUT passes bigint,
	OUT last_pass_start timestamptz,
	OUT last_pass_end timestamptz,
	OUT deleted bigint,
	OUT flagged bigint,
	OUT reconciled bigint,
	OUT failed bigint,
	OUT skipped bigint,
	OUT write_errors bigint,
	OUT batches bigint,
	OUT longest_batch interval,
	OUT stopped_early boolean,
	OUT total_deleted bigint,
	OUT total_flagged bigint,
	OUT total_reconciled bigint,
	OUT total_failed bigint,
	OUT total_skipped bigint,
	OUT total_write_errors bigint,
	OUT next_pass_due timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_worker_status'
LANGUAGE C STRICT VOLATILE PARALLEL SAFE;

CREATE VIEW @extschema@.idem_worker_status AS
SELECT s.datid,
	d.datname,
	s.passes,
	s.last_pass_start,
	s.last_pass_end,
	s.last_pass_end OPERATOR(pg_catalog.-) s.last_pass_start AS last_pass_duration,
	s.deleted,
	s.flagged,
	s.reconciled,
	s.failed,
	s.skipped,
	s.write_errors,
	s.batches,
	s.longest_batch,
	s.stopped_early,
	s.total_deleted,
	s.total_flagged,
	s.total_reconciled,
	s.total_failed,
	s.total_skipped,
	s.total_write_errors,
	s.next_pass_due
FROM @extschema@.idem_worker_status() s
LEFT JOIN pg_catalog.pg_database d ON d.oid OPERATOR(pg_catalog.=) s.datid;

COMMENT ON VIEW @extschema@.idem_worker_status IS
	'the background worker''s last maintenance pass in each database since the server started, and when the next is due';

-- Read like idem_stats: through pg_read_all_stats, nothing to PUBLIC.
REVOKE ALL ON FUNCTION @extschema@.idem_worker_status() FROM PUBLIC;
REVOKE ALL ON @extschema@.idem_worker_status FROM PUBLIC;
GRANT SELECT ON @extschema@.idem_worker_status TO pg_read_all_stats;
GRANT EXECUTE ON FUNCTION @extschema@.idem_worker_status() TO pg_read_all_stats;

-- idem_keys.ttl: the ttl given at reservation, from which idem_complete now
-- computes expires_at (completion time + ttl).  The records of 0.1.0 keep
-- a NULL ttl: this script writes no row of a table whose owner, or a role
-- granted TRIGGER, may have given it triggers, rules or policies, which
-- would run as the superuser updating.  For a record without a ttl, the
-- library counts the one it was reserved with, expires_at - created_at.
ALTER TABLE @extschema@.idem_keys ADD COLUMN ttl interval;

-- idem_reconcilers: the registrar is recorded, and a trigger replaces the
-- CHECK that called pg_has_role() (a CHECK must not depend on who runs
-- it).  A 0.1.0 row was written by a member of run_as, and was run as
-- run_as: its registrar is run_as, so it keeps running as before.  No row
-- is written for that (see ttl above): the column is added with the
-- constant 0 (no role) in the rows there are, without a rewrite, and the
-- library takes a registrar 0 for run_as.  Its handler stays the text
-- signature it was; one that no longer names a function is kept, reported
-- here, and skipped with a WARNING at each maintenance pass until it is
-- registered again or removed.
ALTER TABLE @extschema@.idem_reconcilers
	DROP CONSTRAINT idem_reconcilers_run_as_check;
ALTER TABLE @extschema@.idem_reconcilers
	ADD COLUMN registered_by regrole NOT NULL
		DEFAULT 0::pg_catalog.oid::pg_catalog.regrole;
ALTER TABLE @extschema@.idem_reconcilers ALTER COLUMN registered_by DROP DEFAULT;

COMMENT ON TABLE @extschema@.idem_reconcilers IS
	'reconciler of each operation (see idem_set_reconciler): handler is the function''s signature, run_as the role it runs as, registered_by the role that wrote the row';

DO $$
DECLARE
	r pg_catalog.record;
	found pg_catalog.bool;
BEGIN
	FOR r IN SELECT operation, handler FROM @extschema@.idem_reconcilers ORDER BY operation
	LOOP
		BEGIN
			found := pg_catalog.to_regprocedure(r.handler) IS NOT NULL;
		EXCEPTION WHEN OTHERS THEN
			found := false;
		END;
		IF NOT found THEN
			RAISE WARNING 'reconciler % of operation "%" names no existing function', r.handler, r.operation
				USING DETAIL = 'The registration is kept, and skipped with a WARNING at every maintenance pass while no function has that signature.',
					  HINT = 'Register the reconciler again with idem_set_reconciler, or remove it by passing NULL.';
		END IF;
	END LOOP;
END
$$;

CREATE FUNCTION @extschema@.idem_reconcilers_check()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_reconcilers_check'
LANGUAGE C;
REVOKE ALL ON FUNCTION @extschema@.idem_reconcilers_check() FROM PUBLIC;

COMMENT ON FUNCTION @extschema@.idem_reconcilers_check() IS
	'trigger of idem_reconcilers: checks the handler and that the writer may act as run_as, and records the writer as registered_by';

CREATE TRIGGER idem_reconcilers_check
	BEFORE INSERT OR UPDATE ON @extschema@.idem_reconcilers
	FOR EACH ROW EXECUTE FUNCTION @extschema@.idem_reconcilers_check();

-- idem_stuck is read with its owner's rights: a security_barrier view, so
-- that a reader's function in the WHERE clause sees only the rows it
-- returns, never the rest of idem_keys
ALTER VIEW @extschema@.idem_stuck SET (security_barrier = true);

-- What the maintenance has not done yet, for alerts: completed records past
-- expires_at that are not deleted yet (the sweeper's backlog), and the
-- records of idem_stuck.  Read with the view owner's rights, so a
-- monitoring role needs no access to idem_keys itself; a security_barrier
-- view, as every view over idem_keys.
CREATE VIEW @extschema@.idem_backlog WITH (security_barrier) AS
SELECT e.expired,
	e.oldest_expired,
	s.stuck,
	s.oldest_stuck
FROM (SELECT pg_catalog.count(*) AS expired,
			 pg_catalog.min(k.expires_at) AS oldest_expired
	  FROM @extschema@.idem_keys k
	  WHERE k.status OPERATOR(pg_catalog.=) 'completed'::pg_catalog.text
		AND k.expires_at OPERATOR(pg_catalog.<) pg_catalog.now()) e,
	 (SELECT pg_catalog.count(*) AS stuck,
			 pg_catalog.min(t.updated_at) AS oldest_stuck
	  FROM @extschema@.idem_stuck t) s;

COMMENT ON VIEW @extschema@.idem_backlog IS
	'expired completed records not deleted yet, and records whose outcome is unknown (idem_stuck): how many, and the oldest';

REVOKE ALL ON @extschema@.idem_backlog FROM PUBLIC;
GRANT SELECT ON @extschema@.idem_backlog TO pg_read_all_stats;

-- Maintenance: idem_keys_processing_idx, through which stuck detection
-- reads only processing records instead of the whole table, is not built
-- here: CREATE INDEX would block every writer of idem_keys while it reads
-- the table, and an extension script cannot build an index CONCURRENTLY.
-- Stuck detection works without it, as at 0.1.0; the README's "Upgrading"
-- builds it as a step of its own, with CREATE INDEX CONCURRENTLY, and
-- maintenance finds it by its definition.

-- Scale-out on Citus: the set-up call (idempotency.sql, "Citus")
CREATE FUNCTION @extschema@.idem_distribute(colocate_with regclass)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $body$
DECLARE
	keys pg_catalog.regclass := '@extschema@.idem_keys';
	f pg_catalog.regprocedure;
	arg pg_catalog.text;
BEGIN
	IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'citus') THEN
		RAISE EXCEPTION 'extension "citus" is not installed'
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  DETAIL = 'idem_distribute distributes table "idem_keys" with Citus.',
				  HINT = 'Without Citus, idem_keys needs no set-up.';
	END IF;
	IF colocate_with IS NULL THEN
		RAISE EXCEPTION 'argument "colocate_with" must not be null'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;

	-- The records move into the shards; the shell keeps none of them.
	PERFORM pg_catalog.create_distributed_table(keys, 'scope',
		colocate_with => colocate_with::pg_catalog.text);
	PERFORM pg_catalog.truncate_local_data_after_distributing_table(keys);

	-- Each function that takes a scope runs on the node of that scope's
	-- shard, inside the caller's transaction (force_delegation).
	FOR f, arg IN VALUES
		('@extschema@.idem_reserve(text, text, jsonb, text, interval)'::pg_catalog.regprocedure, '$4'),
		('@extschema@.idem_complete(text, text, jsonb, integer, text, text)'::pg_catalog.regprocedure, '$6'),
		('@extschema@.idem_release(text, text, text)'::pg_catalog.regprocedure, '$3'),
		('@extschema@.idem_checkpoint(text, text, text, text)'::pg_catalog.regprocedure, '$4'),
		('@extschema@.idem_lookup(text, text, text)'::pg_catalog.regprocedure, '$3'),
		('@extschema@.idem_call(text, text, jsonb, regprocedure, text, interval)'::pg_catalog.regprocedure, '$5')
	LOOP
		PERFORM pg_catalog.create_distributed_function(f, arg,
			colocate_with => keys::pg_catalog.text, force_delegation => true);
	END LOOP;
END
$body$;

COMMENT ON FUNCTION @extschema@.idem_distribute(regclass) IS
	'Citus set-up: distributes idem_keys by scope co-located with the given table and delegates the functions that take a scope to the node of its shard';

REVOKE ALL ON FUNCTION @extschema@.idem_distribute(regclass) FROM PUBLIC;

-- idem_reserve and idem_lookup declare their result columns (OUT
-- parameters, RETURNS TABLE) instead of returning the composite types
-- idem_reservation and idem_keys: PostgreSQL opened such a type's relation
-- for each call after parse analysis found the function, without a lock
-- that keeps it, and a call racing DROP EXTENSION failed with XX000 "could
-- not open relation with OID ...".  The columns are the same, so SELECT *
-- and (idem_reserve(...)).outcome keep working, and idem_reservation stays.
-- A return type changes only through DROP FUNCTION: the grants made on
-- the old functions are carried over to the new ones.  A view or a
-- function with a SQL-standard body that uses them would make the DROP
-- fail with a hint to CASCADE: the update refuses first, naming them.
DO $$
DECLARE
	dependent pg_catalog.text;
BEGIN
	-- a view depends through its rule: name the view
	SELECT pg_catalog.string_agg(COALESCE(
			(SELECT pg_catalog.pg_describe_object('pg_catalog.pg_class'::pg_catalog.regclass, r.ev_class, 0)
			 FROM pg_catalog.pg_rewrite r
			 WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_rewrite'::pg_catalog.regclass
				AND r.oid OPERATOR(pg_catalog.=) d.objid),
			pg_catalog.pg_describe_object(d.classid, d.objid, d.objsubid)), ', ')
	INTO dependent
	FROM pg_catalog.pg_depend d
	WHERE d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
		AND d.refobjid OPERATOR(pg_catalog.=) ANY (ARRAY[
			'@extschema@.idem_reserve(text, text, jsonb, text, interval)'::pg_catalog.regprocedure,
			'@extschema@.idem_lookup(text, text, text)'::pg_catalog.regprocedure]::pg_catalog.oid[])
		AND d.deptype OPERATOR(pg_catalog.=) 'n'::pg_catalog."char";
	IF dependent IS NOT NULL THEN
		RAISE EXCEPTION 'cannot update extension "idempotency": % uses idem_reserve or idem_lookup', dependent
			USING ERRCODE = 'dependent_objects_still_exist',
				  DETAIL = 'The update creates idem_reserve and idem_lookup again, with their result columns declared.',
				  HINT = 'Drop those objects, run ALTER EXTENSION idempotency UPDATE, and create them again.';
	END IF;
END
$$;

SELECT pg_catalog.set_config('idem_upgrade.reserve_acl',
	COALESCE((SELECT p.proacl::pg_catalog.text FROM pg_catalog.pg_proc p
		WHERE p.oid OPERATOR(pg_catalog.=)
			'@extschema@.idem_reserve(text, text, jsonb, text, interval)'::pg_catalog.regprocedure), ''),
	true);
SELECT pg_catalog.set_config('idem_upgrade.lookup_acl',
	COALESCE((SELECT p.proacl::pg_catalog.text FROM pg_catalog.pg_proc p
		WHERE p.oid OPERATOR(pg_catalog.=)
			'@extschema@.idem_lookup(text, text, text)'::pg_catalog.regprocedure), ''),
	true);

DROP FUNCTION @extschema@.idem_reserve(text, text, jsonb, text, interval);
CREATE FUNCTION @extschema@.idem_reserve(
	operation text,
	key text,
	request jsonb DEFAULT NULL,
	scope text DEFAULT '',
	ttl interval DEFAULT NULL,
	OUT outcome text,
	OUT http_status integer,
	OUT response_status integer,
	OUT response jsonb,
	OUT resource_id text,
	OUT recovery_point text,
	OUT expires_at timestamptz)
RETURNS record
AS 'MODULE_PATHNAME', 'idem_reserve'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
REVOKE ALL ON FUNCTION @extschema@.idem_reserve(text, text, jsonb, text, interval) FROM PUBLIC;

DROP FUNCTION @extschema@.idem_lookup(text, text, text);
CREATE FUNCTION @extschema@.idem_lookup(
	operation text,
	key text,
	scope text DEFAULT '')
RETURNS TABLE (
	scope			text,
	operation		text,
	key				text,
	request_hash	bytea,
	status			text,
	response_status	integer,
	response		jsonb,
	resource_id		text,
	recovery_point	text,
	created_at		timestamptz,
	updated_at		timestamptz,
	expires_at		timestamptz,
	ttl				interval)
AS 'MODULE_PATHNAME', 'idem_lookup'
LANGUAGE C STABLE PARALLEL SAFE ROWS 1;
REVOKE ALL ON FUNCTION @extschema@.idem_lookup(text, text, text) FROM PUBLIC;

DO $$
DECLARE
	f pg_catalog.regprocedure;
	saved pg_catalog.text;
	a pg_catalog.record;
BEGIN
	FOR f, saved IN VALUES
		('@extschema@.idem_reserve(text, text, jsonb, text, interval)'::pg_catalog.regprocedure,
		 pg_catalog.current_setting('idem_upgrade.reserve_acl')),
		('@extschema@.idem_lookup(text, text, text)'::pg_catalog.regprocedure,
		 pg_catalog.current_setting('idem_upgrade.lookup_acl'))
	LOOP
		CONTINUE WHEN saved OPERATOR(pg_catalog.=) '';
		FOR a IN
			SELECT x.grantee, x.is_grantable
			FROM pg_catalog.aclexplode(saved::pg_catalog.aclitem[]) x
			WHERE x.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
				AND x.grantee OPERATOR(pg_catalog.<>) 0::pg_catalog.oid
				AND x.grantee OPERATOR(pg_catalog.<>)
					(SELECT p.proowner FROM pg_catalog.pg_proc p WHERE p.oid OPERATOR(pg_catalog.=) f)
		LOOP
			EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %I%s', f,
				pg_catalog.pg_get_userbyid(a.grantee),
				CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
		END LOOP;
	END LOOP;
END
$$;
