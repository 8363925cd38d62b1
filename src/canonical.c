/*-------------------------------------------------------------------------
 *
 * canonical.c
 *	  Request fingerprint (interim: SHA-256 of the jsonb text output; the
 *	  RFC 8785 canonical form replaces it behind the same entry point).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/cryptohash.h"
#include "common/sha2.h"
#include "utils/jsonb.h"

#include "idempotency.h"

/* SHA-256 fingerprint of a jsonb value, as a palloc'd bytea */
bytea *
IdemHashJsonb(Jsonb *jb)
{
	char	   *s = JsonbToCString(NULL, &jb->root, VARSIZE(jb));
	bytea	   *result = palloc(VARHDRSZ + PG_SHA256_DIGEST_LENGTH);
	pg_cryptohash_ctx *ctx = pg_cryptohash_create(PG_SHA256);

	if (pg_cryptohash_init(ctx) < 0 ||
		pg_cryptohash_update(ctx, (uint8 *) s, strlen(s)) < 0 ||
		pg_cryptohash_final(ctx, (uint8 *) VARDATA(result), PG_SHA256_DIGEST_LENGTH) < 0)
		elog(ERROR, "could not compute SHA-256: %s", pg_cryptohash_error(ctx));
	pg_cryptohash_free(ctx);
	SET_VARSIZE(result, VARHDRSZ + PG_SHA256_DIGEST_LENGTH);
	return result;
}
