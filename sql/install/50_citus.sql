-- Scale-out on Citus (README, "Scale-out (Citus)").  The one supported
-- mode: idem_keys distributed by scope, co-located with the tenant's
-- table, so that a reservation, the effect and the completion of one scope
-- run in one shard's transaction on one node.  The C code reads and writes
-- the shard relation that holds the scope (src/records.c, RecordsResolve);
-- with Citus installed and idem_keys not distributed, every call refuses.
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
