-- The canonical request fingerprint: RFC 8785 (JSON Canonicalization Scheme)
-- serialization of a jsonb value and the SHA-256 of its UTF-8 bytes.  Both
-- are C; idem_reserve computes request_hash with the same C routine.

CREATE FUNCTION @extschema@.idem_canonical(value jsonb)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_canonical'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

COMMENT ON FUNCTION @extschema@.idem_canonical(jsonb) IS
	'RFC 8785 canonical JSON text of a jsonb value';

CREATE FUNCTION @extschema@.idem_hash(value jsonb)
RETURNS bytea
AS 'MODULE_PATHNAME', 'idem_hash'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

COMMENT ON FUNCTION @extschema@.idem_hash(jsonb) IS
	'SHA-256 of the UTF-8 bytes of idem_canonical(value): the request fingerprint';
