-- Key storage and the key lifecycle: reserve, complete, release, checkpoint,
-- lookup.  The functions are C and run inside the caller's transaction.

-- The key columns compare bytewise (COLLATE "C"): keys are identifiers, and
-- every reservation descends the primary key, which with a linguistic
-- collation would call strcoll() at each step.
CREATE TABLE @extschema@.idem_keys (
	scope			text		COLLATE "C" NOT NULL,
	operation		text		COLLATE "C" NOT NULL,
	key				text		COLLATE "C" NOT NULL,
	request_hash	bytea,
	-- Every write evaluates this CHECK, and prepares it first: an array
	-- constant is stored ready, where an IN list would be folded again at
	-- each write.
	status			text		NOT NULL
		CONSTRAINT idem_keys_status_check
		CHECK (status OPERATOR(pg_catalog.=) ANY ('{processing,completed,stuck}'::pg_catalog.text[])),
	response_status	integer,
	response		jsonb,
	resource_id		text,
	recovery_point	text,
	created_at		timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	updated_at		timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	expires_at		timestamptz	NOT NULL,
	-- the ttl given at reservation: completion sets expires_at to its time
	-- plus ttl (NULL, in a row written by hand: idempotency.default_ttl)
	ttl				interval,
	CONSTRAINT idem_keys_pkey PRIMARY KEY (scope, operation, key)
) WITH (fillfactor = 90);

COMMENT ON TABLE @extschema@.idem_keys IS
	'idempotency records: one row per (scope, operation, key)';

-- Keep the records in pg_dump output: they are user data, not extension code.
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_keys', '');

-- The row idem_reserve returns.  A named type rather than OUT parameters:
-- the caller's executor finds its descriptor in the type cache instead of
-- building it on every call.
CREATE TYPE @extschema@.idem_reservation AS (
	outcome			text,
	http_status		integer,
	response_status	integer,
	response		jsonb,
	resource_id		text,
	recovery_point	text,
	expires_at		timestamptz
);

CREATE FUNCTION @extschema@.idem_reserve(
	operation text,
	key text,
	request jsonb DEFAULT NULL,
	scope text DEFAULT '',
	ttl interval DEFAULT NULL)
RETURNS @extschema@.idem_reservation
AS 'MODULE_PATHNAME', 'idem_reserve'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_complete(
	operation text,
	key text,
	response jsonb DEFAULT NULL,
	response_status integer DEFAULT 200,
	resource_id text DEFAULT NULL,
	scope text DEFAULT '')
RETURNS void
AS 'MODULE_PATHNAME', 'idem_complete'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_release(
	operation text,
	key text,
	scope text DEFAULT '')
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_release'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_checkpoint(
	operation text,
	key text,
	recovery_point text,
	scope text DEFAULT '')
RETURNS void
AS 'MODULE_PATHNAME', 'idem_checkpoint'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_lookup(
	operation text,
	key text,
	scope text DEFAULT '')
RETURNS SETOF @extschema@.idem_keys
AS 'MODULE_PATHNAME', 'idem_lookup'
LANGUAGE C STABLE PARALLEL SAFE ROWS 1;
