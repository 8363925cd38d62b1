-- Patterns on top of the key lifecycle: idem_call for stored procedures and
-- idem_consume for message consumers.  Both are C, run inside the caller's
-- transaction and share idem_keys, expiry and statistics with idem_reserve.

CREATE FUNCTION @extschema@.idem_call(
	operation text,
	key text,
	request jsonb,
	handler regprocedure,
	scope text DEFAULT '',
	ttl interval DEFAULT NULL)
RETURNS jsonb
AS 'MODULE_PATHNAME', 'idem_call'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.idem_call(text, text, jsonb, regprocedure, text, interval) IS
	'reserve a key, run handler(request) once and complete with its result; replay it on retries';

CREATE FUNCTION @extschema@.idem_consume(
	consumer text,
	message_id text,
	ttl interval DEFAULT NULL,
	wait boolean DEFAULT true)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_consume'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.idem_consume(text, text, interval, boolean) IS
	'inbox de-duplication: true the first time a message is processed, false for a duplicate, NULL while another transaction holds it (wait => false)';
