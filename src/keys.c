/*-------------------------------------------------------------------------
 *
 * keys.c
 *	  The key lifecycle: idem_reserve, idem_complete, idem_release,
 *	  idem_checkpoint and idem_lookup, all inside the caller's transaction.
 *
 * Concurrency design
 * ------------------
 * Every writer of a record first takes the record's *key lock*: a
 * transaction-scoped heavyweight lock in the advisory lock space of the
 * current database, whose tag is a 64-bit hash of (scope, operation, key) and
 * whose fourth field is IDEM_LOCKTAG_SPACE, so it can never collide with the
 * two-int4 or int8 advisory locks the application takes.  pg_locks shows it
 * as locktype "advisory" with objsubid 26980.
 *
 *	- idem_reserve tries the key lock without waiting.  When another open
 *	  transaction holds it, that transaction is reserving, completing,
 *	  releasing or checkpointing the same key right now, and the answer is
 *	  in_progress at once (or mismatch, when its row already carries another
 *	  fingerprint).  No unique-violation can arise: an INSERT only happens
 *	  while we hold the lock and see no row.
 *	- idem_complete, idem_release and idem_checkpoint wait for the key lock
 *	  (ordinary lock wait, with deadlock detection).
 *
 * Holding the key lock, we read the record with a fresh snapshot taken after
 * the lock was granted (GetLatestSnapshot), as PostgreSQL's foreign-key checks
 * do.  The previous holder had committed or aborted before releasing the
 * lock, so that snapshot shows the true state of the key at any isolation
 * level: a REPEATABLE READ or SERIALIZABLE transaction whose snapshot is older
 * than the other transaction's commit still gets replay, never a duplicate.
 * Writes run through SPI with the same snapshot.
 *
 * Reads go straight through the primary-key index; writes are prepared SPI
 * statements with schema-qualified names and OPERATOR(pg_catalog.=), so
 * nothing on the caller's search_path can change what they do.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/relation.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/rls.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "idempotency.h"

PG_FUNCTION_INFO_V1(idem_reserve);
PG_FUNCTION_INFO_V1(idem_complete);
PG_FUNCTION_INFO_V1(idem_release);
PG_FUNCTION_INFO_V1(idem_checkpoint);
PG_FUNCTION_INFO_V1(idem_lookup);

/* Fourth field of our advisory lock tags: "id" */
#define IDEM_LOCKTAG_SPACE	0x6964

/* Attribute numbers of idem_keys, fixed by the install script */
#define Anum_scope				1
#define Anum_operation			2
#define Anum_key				3
#define Anum_request_hash		4
#define Anum_status				5
#define Anum_response_status	6
#define Anum_response			7
#define Anum_resource_id		8
#define Anum_recovery_point		9
#define Anum_created_at			10
#define Anum_updated_at			11
#define Anum_expires_at			12
#define Natts_idem_keys			12

typedef enum IdemStatus
{
	STATUS_PROCESSING,
	STATUS_COMPLETED,
	STATUS_STUCK
} IdemStatus;

/* A record as read from idem_keys, copied into the caller's memory context */
typedef struct IdemRecord
{
	IdemStatus	status;
	bytea	   *request_hash;	/* NULL when SQL NULL */
	bool		has_response_status;
	int32		response_status;
	Jsonb	   *response;
	text	   *resource_id;
	text	   *recovery_point;
	TimestampTz updated_at;
	TimestampTz expires_at;
	bool		mine;			/* written by the current transaction */
} IdemRecord;

/* The prepared statements, valid for one idem_keys relation */
typedef enum IdemPlan
{
	PLAN_INSERT,
	PLAN_RENEW,
	PLAN_COMPLETE,
	PLAN_CHECKPOINT,
	PLAN_DELETE,
	NUM_PLANS
} IdemPlan;

typedef struct IdemCatalog
{
	Oid			nspid;
	Oid			relid;
	Oid			indexid;
	SPIPlanPtr	plans[NUM_PLANS];
} IdemCatalog;

static IdemCatalog idem_catalog;

/* Name of an outcome as the SQL API spells it */
const char *
IdemOutcomeName(IdemOutcome outcome)
{
	switch (outcome)
	{
		case IDEM_NEW:
			return "new";
		case IDEM_REPLAY:
			return "replay";
		case IDEM_IN_PROGRESS:
			return "in_progress";
		case IDEM_MISMATCH:
			return "mismatch";
		case IDEM_STUCK:
			return "stuck";
	}
	elog(ERROR, "unrecognized idempotency outcome: %d", (int) outcome);
	return NULL;				/* keep compiler quiet */
}

/* HTTP status of an outcome (IETF Idempotency-Key draft); 0 means NULL */
int
IdemOutcomeHttpStatus(const IdemReservation *r)
{
	switch (r->outcome)
	{
		case IDEM_NEW:
			return 0;
		case IDEM_REPLAY:
			return r->has_response_status ? r->response_status : 0;
		case IDEM_IN_PROGRESS:
		case IDEM_STUCK:
			return 409;
		case IDEM_MISMATCH:
			return 422;
	}
	return 0;
}

/* Counter that counts an outcome */
static IdemCounter
OutcomeCounter(IdemOutcome outcome)
{
	switch (outcome)
	{
		case IDEM_NEW:
			return IDEM_STAT_NEW;
		case IDEM_REPLAY:
			return IDEM_STAT_REPLAYS;
		case IDEM_IN_PROGRESS:
			return IDEM_STAT_IN_PROGRESS;
		case IDEM_MISMATCH:
			return IDEM_STAT_MISMATCHES;
		case IDEM_STUCK:
			return IDEM_STAT_STUCK;
	}
	return IDEM_STAT_RESERVES;	/* keep compiler quiet */
}

/* Raise 22023 for a NULL argument */
static void
CheckNotNull(const void *arg, const char *name)
{
	if (arg == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("argument \"%s\" must not be null", name)));
}

/* Raise 22023 for an empty or overlong identifier */
static void
CheckLength(text *arg, const char *name, int maxlen, bool allow_empty)
{
	int			len;

	CheckNotNull(arg, name);
	len = VARSIZE_ANY_EXHDR(arg);
	if (len == 0 && !allow_empty)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("argument \"%s\" must not be empty", name)));
	if (len > maxlen)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("argument \"%s\" is too long", name),
				 errdetail("It is %d bytes long; the maximum is %d bytes.",
						   len, maxlen)));
}

/* Check the operation argument: not NULL, not empty, at most 63 bytes */
void
IdemCheckOperation(text *operation)
{
	CheckLength(operation, "operation", IDEM_MAX_OPERATION_LEN, false);
}

/* Check the key argument: 1 to 255 bytes of printable ASCII */
void
IdemCheckKey(text *key)
{
	const unsigned char *p;
	int			len;
	int			i;

	CheckLength(key, "key", IDEM_MAX_KEY_LEN, false);
	p = (const unsigned char *) VARDATA_ANY(key);
	len = VARSIZE_ANY_EXHDR(key);
	for (i = 0; i < len; i++)
	{
		if (p[i] < 0x20 || p[i] > 0x7E)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("argument \"key\" contains a character outside printable ASCII"),
					 errdetail("Byte 0x%02x at position %d is not between 0x20 and 0x7e.",
							   p[i], i + 1),
					 errhint("Use printable ASCII keys, such as a UUID; encode other identifiers, for example as hex.")));
	}
}

/* Check the scope argument: not NULL, at most 255 bytes, may be empty */
void
IdemCheckScope(text *scope)
{
	CheckLength(scope, "scope", IDEM_MAX_SCOPE_LEN, true);
}

/* Namespace of the extension, found from the called function itself */
Oid
IdemFunctionNamespace(FunctionCallInfo fcinfo)
{
	FmgrInfo   *flinfo = fcinfo->flinfo;

	if (flinfo->fn_extra == NULL)
	{
		Oid		   *nsp = MemoryContextAlloc(flinfo->fn_mcxt, sizeof(Oid));

		*nsp = get_func_namespace(flinfo->fn_oid);
		flinfo->fn_extra = nsp;
	}
	return *(Oid *) flinfo->fn_extra;
}

/*
 * Find idem_keys in the extension's schema and make sure the cached plans
 * belong to it; after DROP/CREATE EXTENSION they are prepared again.
 */
static IdemCatalog *
GetCatalog(Oid nspid)
{
	Oid			relid = get_relname_relid("idem_keys", nspid);
	int			i;

	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("table \"idem_keys\" of extension \"idempotency\" does not exist"),
				 errhint("Reinstall the extension with DROP EXTENSION idempotency; CREATE EXTENSION idempotency;")));

	if (idem_catalog.relid != relid || idem_catalog.nspid != nspid)
	{
		for (i = 0; i < NUM_PLANS; i++)
		{
			if (idem_catalog.plans[i])
				SPI_freeplan(idem_catalog.plans[i]);
			idem_catalog.plans[i] = NULL;
		}
		idem_catalog.nspid = nspid;
		idem_catalog.relid = relid;
		idem_catalog.indexid = get_relname_relid("idem_keys_pkey", nspid);
		if (!OidIsValid(idem_catalog.indexid))
			elog(ERROR, "index \"idem_keys_pkey\" of extension \"idempotency\" does not exist");
	}
	return &idem_catalog;
}

/* Refuse to read past privileges or row-level security */
static void
CheckReadable(Oid relid)
{
	AclResult	aclresult;

	aclresult = pg_class_aclcheck(relid, GetUserId(), ACL_SELECT);
	if (aclresult != ACLCHECK_OK)
		aclcheck_error(aclresult, OBJECT_TABLE, get_rel_name(relid));
	if (check_enable_rls(relid, InvalidOid, false) == RLS_ENABLED)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("row-level security on \"idem_keys\" is not supported"),
				 errhint("Separate tenants with the \"scope\" argument instead.")));
}

/* Take the key lock of (scope, operation, key); false if busy and !wait */
static bool
LockKey(text *scope, text *operation, text *key, bool wait)
{
	LOCKTAG		tag;
	uint64		h;

	/* Separate the parts by their lengths so that ("a","bc") != ("ab","c") */
	h = hash_bytes_extended((const unsigned char *) VARDATA_ANY(key),
							VARSIZE_ANY_EXHDR(key),
							VARSIZE_ANY_EXHDR(operation));
	h = hash_bytes_extended((const unsigned char *) VARDATA_ANY(operation),
							VARSIZE_ANY_EXHDR(operation), h);
	h = hash_bytes_extended((const unsigned char *) VARDATA_ANY(scope),
							VARSIZE_ANY_EXHDR(scope),
							h ^ ((uint64) VARSIZE_ANY_EXHDR(scope) << 32));

	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, (uint32) (h >> 32), (uint32) h,
						 IDEM_LOCKTAG_SPACE);
	return LockAcquire(&tag, ExclusiveLock, false, !wait) != LOCKACQUIRE_NOT_AVAIL;
}

/* Map the status column to its enum */
static IdemStatus
ParseStatus(text *t)
{
	char	   *s = VARDATA_ANY(t);
	int			len = VARSIZE_ANY_EXHDR(t);

	if (len == 10 && memcmp(s, "processing", 10) == 0)
		return STATUS_PROCESSING;
	if (len == 9 && memcmp(s, "completed", 9) == 0)
		return STATUS_COMPLETED;
	if (len == 5 && memcmp(s, "stuck", 5) == 0)
		return STATUS_STUCK;
	elog(ERROR, "invalid status \"%.*s\" in idem_keys", len, s);
	return STATUS_PROCESSING;	/* keep compiler quiet */
}

/*
 * Read the record of (scope, operation, key) through the primary key with
 * the given snapshot.  With a dirty snapshot this also sees rows of
 * transactions still in progress.  When tuple_out is given, the whole row is
 * returned there as a composite datum too.
 */
static bool
FetchRecord(IdemCatalog *cat, Snapshot snapshot, text *scope, text *operation,
			text *key, IdemRecord *rec, Datum *tuple_out)
{
	Relation	heap;
	Relation	index;
	IndexScanDesc scan;
	TupleTableSlot *slot;
	ScanKeyData skey[3];
	text	   *args[3] = {scope, operation, key};
	bool		found;
	int			i;

	heap = table_open(cat->relid, AccessShareLock);
	index = index_open(cat->indexid, AccessShareLock);

	for (i = 0; i < 3; i++)
		ScanKeyEntryInitialize(&skey[i], 0, i + 1, BTEqualStrategyNumber,
							   InvalidOid, index->rd_indcollation[i],
							   F_TEXTEQ, PointerGetDatum(args[i]));

	slot = table_slot_create(heap, NULL);
#if PG_VERSION_NUM >= 180000
	scan = index_beginscan(heap, index, snapshot, NULL, 3, 0);
#else
	scan = index_beginscan(heap, index, snapshot, 3, 0);
#endif
	index_rescan(scan, skey, 3, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, slot);

	if (found)
	{
		Datum		d;
		bool		isnull;

		slot_getallattrs(slot);
		memset(rec, 0, sizeof(*rec));
		rec->status = ParseStatus(DatumGetTextPP(slot->tts_values[Anum_status - 1]));
		if (!slot->tts_isnull[Anum_request_hash - 1])
			rec->request_hash = DatumGetByteaPCopy(slot->tts_values[Anum_request_hash - 1]);
		if (!slot->tts_isnull[Anum_response_status - 1])
		{
			rec->has_response_status = true;
			rec->response_status = DatumGetInt32(slot->tts_values[Anum_response_status - 1]);
		}
		if (!slot->tts_isnull[Anum_response - 1])
			rec->response = DatumGetJsonbPCopy(slot->tts_values[Anum_response - 1]);
		if (!slot->tts_isnull[Anum_resource_id - 1])
			rec->resource_id = DatumGetTextPCopy(slot->tts_values[Anum_resource_id - 1]);
		if (!slot->tts_isnull[Anum_recovery_point - 1])
			rec->recovery_point = DatumGetTextPCopy(slot->tts_values[Anum_recovery_point - 1]);
		rec->updated_at = DatumGetTimestampTz(slot->tts_values[Anum_updated_at - 1]);
		rec->expires_at = DatumGetTimestampTz(slot->tts_values[Anum_expires_at - 1]);

		d = slot_getsysattr(slot, MinTransactionIdAttributeNumber, &isnull);
		rec->mine = !isnull && TransactionIdIsCurrentTransactionId(DatumGetTransactionId(d));

		if (tuple_out)
		{
			bool		should_free;
			HeapTuple	tuple = ExecFetchSlotHeapTuple(slot, false, &should_free);

			*tuple_out = heap_copy_tuple_as_datum(tuple, RelationGetDescr(heap));
			if (should_free)
				heap_freetuple(tuple);
		}
	}

	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	index_close(index, AccessShareLock);
	table_close(heap, AccessShareLock);
	return found;
}

/* Is a completed record past its expires_at, and so gone? */
static bool
IsExpired(const IdemRecord *rec, TimestampTz now)
{
	return rec->status == STATUS_COMPLETED && rec->expires_at <= now;
}

/* Do two fingerprints differ (IS DISTINCT FROM)? */
static bool
HashDiffers(bytea *a, bytea *b)
{
	if (a == NULL || b == NULL)
		return a != b;
	return VARSIZE_ANY_EXHDR(a) != VARSIZE_ANY_EXHDR(b) ||
		memcmp(VARDATA_ANY(a), VARDATA_ANY(b), VARSIZE_ANY_EXHDR(a)) != 0;
}

/* SQL text and parameter types of each prepared statement */
static const char *const plan_sql[NUM_PLANS] = {
	[PLAN_INSERT] =
	"INSERT INTO %s.idem_keys (scope, operation, key, request_hash, status,"
	" created_at, updated_at, expires_at)"
	" VALUES ($1, $2, $3, $4, 'processing', $5, $5, $6)",
	[PLAN_RENEW] =
	"UPDATE %s.idem_keys SET request_hash = $4, status = 'processing',"
	" response_status = NULL, response = NULL, resource_id = NULL,"
	" recovery_point = NULL, created_at = $5, updated_at = $5, expires_at = $6"
	" WHERE scope OPERATOR(pg_catalog.=) $1 AND operation OPERATOR(pg_catalog.=) $2"
	" AND key OPERATOR(pg_catalog.=) $3",
	[PLAN_COMPLETE] =
	"UPDATE %s.idem_keys SET status = 'completed', response = $4,"
	" response_status = $5, resource_id = $6, updated_at = $7"
	" WHERE scope OPERATOR(pg_catalog.=) $1 AND operation OPERATOR(pg_catalog.=) $2"
	" AND key OPERATOR(pg_catalog.=) $3",
	[PLAN_CHECKPOINT] =
	"UPDATE %s.idem_keys SET status = 'processing', recovery_point = $4,"
	" updated_at = $5"
	" WHERE scope OPERATOR(pg_catalog.=) $1 AND operation OPERATOR(pg_catalog.=) $2"
	" AND key OPERATOR(pg_catalog.=) $3",
	[PLAN_DELETE] =
	"DELETE FROM %s.idem_keys"
	" WHERE scope OPERATOR(pg_catalog.=) $1 AND operation OPERATOR(pg_catalog.=) $2"
	" AND key OPERATOR(pg_catalog.=) $3",
};

static const Oid plan_types[NUM_PLANS][7] = {
	[PLAN_INSERT] = {TEXTOID, TEXTOID, TEXTOID, BYTEAOID, TIMESTAMPTZOID, TIMESTAMPTZOID},
	[PLAN_RENEW] = {TEXTOID, TEXTOID, TEXTOID, BYTEAOID, TIMESTAMPTZOID, TIMESTAMPTZOID},
	[PLAN_COMPLETE] = {TEXTOID, TEXTOID, TEXTOID, JSONBOID, INT4OID, TEXTOID, TIMESTAMPTZOID},
	[PLAN_CHECKPOINT] = {TEXTOID, TEXTOID, TEXTOID, TEXTOID, TIMESTAMPTZOID},
	[PLAN_DELETE] = {TEXTOID, TEXTOID, TEXTOID},
};

static const int plan_nargs[NUM_PLANS] = {
	[PLAN_INSERT] = 6,
	[PLAN_RENEW] = 6,
	[PLAN_COMPLETE] = 7,
	[PLAN_CHECKPOINT] = 5,
	[PLAN_DELETE] = 3,
};

/*
 * Run one prepared write with the given snapshot and return the number of
 * rows it touched.  values[0..2] are always scope, operation and key.
 */
static uint64
RunPlan(IdemCatalog *cat, IdemPlan which, Snapshot snapshot,
		Datum *values, const char *nulls)
{
	int			rc;
	uint64		processed;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");

	if (cat->plans[which] == NULL)
	{
		char	   *nspname = get_namespace_name(cat->nspid);
		char	   *sql = psprintf(plan_sql[which], quote_identifier(nspname));
		SPIPlanPtr	plan;

		plan = SPI_prepare(sql, plan_nargs[which], (Oid *) plan_types[which]);
		if (plan == NULL)
			elog(ERROR, "SPI_prepare failed for \"%s\": %s",
				 sql, SPI_result_code_string(SPI_result));
		if (SPI_keepplan(plan) != 0)
			elog(ERROR, "SPI_keepplan failed");
		cat->plans[which] = plan;
	}

	rc = SPI_execute_snapshot(cat->plans[which], values, nulls,
							  snapshot, InvalidSnapshot, false, true, 0);
	if (rc < 0)
		elog(ERROR, "SPI_execute_snapshot failed: %s", SPI_result_code_string(rc));
	processed = SPI_processed;

	SPI_finish();
	return processed;
}

/* Fill the key columns of a parameter array */
static void
KeyParams(Datum *values, char *nulls, text *scope, text *operation, text *key)
{
	values[0] = PointerGetDatum(scope);
	values[1] = PointerGetDatum(operation);
	values[2] = PointerGetDatum(key);
	nulls[0] = nulls[1] = nulls[2] = ' ';
}

/* expires_at of a record reserved now with the given ttl (NULL: default) */
static TimestampTz
ExpiryTime(TimestampTz now, Interval *ttl)
{
	TimestampTz expires_at;

	if (ttl == NULL)
		return TimestampTzPlusMilliseconds(now, (int64) idem_default_ttl_s * 1000);

	expires_at = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
														 TimestampTzGetDatum(now),
														 IntervalPGetDatum(ttl)));
	if (expires_at <= now)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("argument \"ttl\" must be positive"),
				 errdetail("The ttl was \"%s\".",
						   DatumGetCString(DirectFunctionCall1(interval_out,
															   IntervalPGetDatum(ttl))))));
	return expires_at;
}

/*
 * Reserve (scope, operation, key) for the current transaction, or say why
 * not.  The outcomes and their order are the contract's table.
 */
void
IdemReserve(Oid nspid, text *scope, text *operation, text *key,
			Jsonb *request, Interval *ttl, bool wait, bool count_stats,
			IdemReservation *result)
{
	IdemCatalog *cat = GetCatalog(nspid);
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	TimestampTz expires_at = ExpiryTime(now, ttl);
	bytea	   *hash = request ? IdemHashJsonb(request) : NULL;
	IdemRecord	rec;
	bool		found;
	Snapshot	snapshot;

	memset(result, 0, sizeof(*result));
	CheckReadable(cat->relid);

	if (!LockKey(scope, operation, key, wait))
	{
		SnapshotData dirty;

		/*
		 * Another open transaction holds the key.  Its row may already carry
		 * a fingerprint; a different one is a mismatch whatever becomes of
		 * that transaction, so say so now rather than depend on timing.
		 */
		InitDirtySnapshot(dirty);
		found = FetchRecord(cat, &dirty, scope, operation, key, &rec, NULL);
		if (found && !IsExpired(&rec, now) && HashDiffers(rec.request_hash, hash))
			result->outcome = IDEM_MISMATCH;
		else
			result->outcome = IDEM_IN_PROGRESS;
		goto done;
	}

	snapshot = RegisterSnapshot(GetLatestSnapshot());
	found = FetchRecord(cat, snapshot, scope, operation, key, &rec, NULL);

	if (found && !IsExpired(&rec, now))
	{
		if (HashDiffers(rec.request_hash, hash))
			result->outcome = IDEM_MISMATCH;
		else if (rec.status == STATUS_COMPLETED)
		{
			result->outcome = IDEM_REPLAY;
			result->has_response_status = rec.has_response_status;
			result->response_status = rec.response_status;
			result->response = rec.response;
			result->resource_id = rec.resource_id;
			result->recovery_point = rec.recovery_point;
			result->has_expires_at = true;
			result->expires_at = rec.expires_at;
		}
		else if (rec.status == STATUS_STUCK ||
				 (!rec.mine &&
				  TimestampDifferenceExceeds(rec.updated_at, now,
											 idem_processing_timeout_ms)))
		{
			result->outcome = IDEM_STUCK;
			result->resource_id = rec.resource_id;
			result->recovery_point = rec.recovery_point;
		}
		else
			result->outcome = IDEM_IN_PROGRESS;
	}
	else
	{
		Datum		values[6];
		char		nulls[6];

		KeyParams(values, nulls, scope, operation, key);
		values[3] = PointerGetDatum(hash);
		nulls[3] = hash ? ' ' : 'n';
		values[4] = TimestampTzGetDatum(now);
		values[5] = TimestampTzGetDatum(expires_at);
		nulls[4] = nulls[5] = ' ';

		/*
		 * An expired record is renewed in place.  If the sweeper deleted it
		 * meanwhile (READ COMMITTED re-check finds nothing), insert afresh.
		 */
		if (!found || RunPlan(cat, PLAN_RENEW, snapshot, values, nulls) == 0)
			RunPlan(cat, PLAN_INSERT, snapshot, values, nulls);

		result->outcome = IDEM_NEW;
		result->has_expires_at = true;
		result->expires_at = expires_at;
	}
	UnregisterSnapshot(snapshot);

done:
	if (count_stats)
	{
		IdemStatsCount(VARDATA_ANY(operation), VARSIZE_ANY_EXHDR(operation),
					   IDEM_STAT_RESERVES, 1);
		IdemStatsCount(VARDATA_ANY(operation), VARSIZE_ANY_EXHDR(operation),
					   OutcomeCounter(result->outcome), 1);
	}
}

/*
 * Take the key lock, waiting for it, and read the live record with a fresh
 * snapshot.  Returns the registered snapshot (the caller unregisters it), or
 * NULL when there is no live record.  A completed record raises ID002: the
 * action would let a retry run the effect twice.
 */
static Snapshot
LockLiveRecord(IdemCatalog *cat, text *scope, text *operation, text *key,
			   IdemRecord *rec, const char *action)
{
	Snapshot	snapshot;

	CheckReadable(cat->relid);
	LockKey(scope, operation, key, true);
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	if (!FetchRecord(cat, snapshot, scope, operation, key, rec, NULL) ||
		IsExpired(rec, GetCurrentTransactionStartTimestamp()))
	{
		UnregisterSnapshot(snapshot);
		return NULL;
	}
	if (rec->status == STATUS_COMPLETED)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_KEY_COMPLETED),
				 errmsg("cannot %s idempotency key \"%s\": it is already completed",
						action, text_to_cstring(key)),
				 errdetail("Operation \"%s\", scope \"%s\".",
						   text_to_cstring(operation), text_to_cstring(scope)),
				 errhint("A completed key keeps its result until it expires; a retry with it replays that result.")));
	return snapshot;
}

/* Raise ID001 for a key with no live record */
static void
ReportNotFound(text *scope, text *operation, text *key, const char *action)
{
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_KEY_NOT_FOUND),
			 errmsg("cannot %s idempotency key \"%s\": it is not reserved",
					action, text_to_cstring(key)),
			 errdetail("Operation \"%s\", scope \"%s\" has no processing or stuck record with this key.",
					   text_to_cstring(operation), text_to_cstring(scope)),
			 errhint("Call idem_reserve first; a record may also have been released or expired.")));
}

/* Move a processing or stuck record to completed with its result */
void
IdemComplete(Oid nspid, text *scope, text *operation, text *key,
			 Jsonb *response, int32 response_status, text *resource_id,
			 bool count_stats)
{
	IdemCatalog *cat = GetCatalog(nspid);
	IdemRecord	rec;
	Snapshot	snapshot;
	Datum		values[7];
	char		nulls[7];

	snapshot = LockLiveRecord(cat, scope, operation, key, &rec, "complete");
	if (snapshot == NULL)
		ReportNotFound(scope, operation, key, "complete");

	KeyParams(values, nulls, scope, operation, key);
	values[3] = PointerGetDatum(response);
	nulls[3] = response ? ' ' : 'n';
	values[4] = Int32GetDatum(response_status);
	nulls[4] = ' ';
	values[5] = PointerGetDatum(resource_id);
	nulls[5] = resource_id ? ' ' : 'n';
	values[6] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	nulls[6] = ' ';
	RunPlan(cat, PLAN_COMPLETE, snapshot, values, nulls);
	UnregisterSnapshot(snapshot);

	if (count_stats)
		IdemStatsCount(VARDATA_ANY(operation), VARSIZE_ANY_EXHDR(operation),
				   IDEM_STAT_COMPLETES, 1);
}

/* Delete a processing or stuck record; false when there is none */
bool
IdemRelease(Oid nspid, text *scope, text *operation, text *key)
{
	IdemCatalog *cat = GetCatalog(nspid);
	IdemRecord	rec;
	Snapshot	snapshot;
	Datum		values[3];
	char		nulls[3];

	snapshot = LockLiveRecord(cat, scope, operation, key, &rec, "release");
	if (snapshot == NULL)
		return false;

	KeyParams(values, nulls, scope, operation, key);
	RunPlan(cat, PLAN_DELETE, snapshot, values, nulls);
	UnregisterSnapshot(snapshot);

	IdemStatsCount(VARDATA_ANY(operation), VARSIZE_ANY_EXHDR(operation),
				   IDEM_STAT_RELEASES, 1);
	return true;
}

/* Record a recovery point; also a heartbeat that un-sticks the record */
static void
IdemCheckpoint(Oid nspid, text *scope, text *operation, text *key,
			   text *recovery_point)
{
	IdemCatalog *cat = GetCatalog(nspid);
	IdemRecord	rec;
	Snapshot	snapshot;
	Datum		values[5];
	char		nulls[5];

	snapshot = LockLiveRecord(cat, scope, operation, key, &rec, "checkpoint");
	if (snapshot == NULL)
		ReportNotFound(scope, operation, key, "checkpoint");

	KeyParams(values, nulls, scope, operation, key);
	values[3] = PointerGetDatum(recovery_point);
	nulls[3] = recovery_point ? ' ' : 'n';
	values[4] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	nulls[4] = ' ';
	RunPlan(cat, PLAN_CHECKPOINT, snapshot, values, nulls);
	UnregisterSnapshot(snapshot);
}

/* Argument n as text, or NULL */
#define ARG_TEXT(n)		(PG_ARGISNULL(n) ? NULL : PG_GETARG_TEXT_PP(n))

/* Check and fetch the (operation, key, scope) arguments at the given positions */
static void
GetKeyArgs(FunctionCallInfo fcinfo, int op_arg, int key_arg, int scope_arg,
		   text **operation, text **key, text **scope)
{
	*operation = ARG_TEXT(op_arg);
	*key = ARG_TEXT(key_arg);
	*scope = ARG_TEXT(scope_arg);
	IdemCheckOperation(*operation);
	IdemCheckKey(*key);
	IdemCheckScope(*scope);
}

/*
 * idem_reserve(operation, key, request, scope, ttl)
 *	 → (outcome, http_status, response_status, response, resource_id,
 *		recovery_point, expires_at)
 */
Datum
idem_reserve(PG_FUNCTION_ARGS)
{
	text	   *operation;
	text	   *key;
	text	   *scope;
	Jsonb	   *request = PG_ARGISNULL(2) ? NULL : PG_GETARG_JSONB_P(2);
	Interval   *ttl = PG_ARGISNULL(4) ? NULL : PG_GETARG_INTERVAL_P(4);
	IdemReservation r;
	TupleDesc	tupdesc;
	Datum		values[7];
	bool		nulls[7];
	int			http;

	GetKeyArgs(fcinfo, 0, 1, 3, &operation, &key, &scope);

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");

	IdemReserve(IdemFunctionNamespace(fcinfo), scope, operation, key,
				request, ttl, false, true, &r);

	memset(nulls, true, sizeof(nulls));
	values[0] = CStringGetTextDatum(IdemOutcomeName(r.outcome));
	nulls[0] = false;
	http = IdemOutcomeHttpStatus(&r);
	values[1] = Int32GetDatum(http);
	nulls[1] = (http == 0);
	values[2] = Int32GetDatum(r.response_status);
	nulls[2] = !r.has_response_status;
	values[3] = PointerGetDatum(r.response);
	nulls[3] = (r.response == NULL);
	values[4] = PointerGetDatum(r.resource_id);
	nulls[4] = (r.resource_id == NULL);
	values[5] = PointerGetDatum(r.recovery_point);
	nulls[5] = (r.recovery_point == NULL);
	values[6] = TimestampTzGetDatum(r.expires_at);
	nulls[6] = !r.has_expires_at;

	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(tupdesc),
													  values, nulls)));
}

/* idem_complete(operation, key, response, response_status, resource_id, scope) */
Datum
idem_complete(PG_FUNCTION_ARGS)
{
	text	   *operation;
	text	   *key;
	text	   *scope;
	int32		response_status;

	GetKeyArgs(fcinfo, 0, 1, 5, &operation, &key, &scope);
	if (PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("argument \"response_status\" must not be null")));
	response_status = PG_GETARG_INT32(3);
	if (response_status < 100 || response_status > 599)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("argument \"response_status\" must be an HTTP status code between 100 and 599"),
				 errdetail("The value was %d.", response_status)));

	IdemComplete(IdemFunctionNamespace(fcinfo), scope, operation, key,
				 PG_ARGISNULL(2) ? NULL : PG_GETARG_JSONB_P(2),
				 response_status, ARG_TEXT(4), true);
	PG_RETURN_VOID();
}

/* idem_release(operation, key, scope) */
Datum
idem_release(PG_FUNCTION_ARGS)
{
	text	   *operation;
	text	   *key;
	text	   *scope;

	GetKeyArgs(fcinfo, 0, 1, 2, &operation, &key, &scope);
	PG_RETURN_BOOL(IdemRelease(IdemFunctionNamespace(fcinfo), scope, operation, key));
}

/* idem_checkpoint(operation, key, recovery_point, scope) */
Datum
idem_checkpoint(PG_FUNCTION_ARGS)
{
	text	   *operation;
	text	   *key;
	text	   *scope;

	GetKeyArgs(fcinfo, 0, 1, 3, &operation, &key, &scope);
	IdemCheckpoint(IdemFunctionNamespace(fcinfo), scope, operation, key,
				   ARG_TEXT(2));
	PG_RETURN_VOID();
}

/* idem_lookup(operation, key, scope) → SETOF idem_keys: the live record */
Datum
idem_lookup(PG_FUNCTION_ARGS)
{
	FuncCallContext *funcctx;

	if (SRF_IS_FIRSTCALL())
	{
		text	   *operation;
		text	   *key;
		text	   *scope;
		IdemCatalog *cat;
		IdemRecord	rec;
		Datum	   *row;
		MemoryContext oldcxt;

		GetKeyArgs(fcinfo, 0, 1, 2, &operation, &key, &scope);
		cat = GetCatalog(get_func_namespace(fcinfo->flinfo->fn_oid));
		CheckReadable(cat->relid);

		funcctx = SRF_FIRSTCALL_INIT();
		oldcxt = MemoryContextSwitchTo(funcctx->multi_call_memory_ctx);
		row = palloc(sizeof(Datum));
		if (FetchRecord(cat, GetActiveSnapshot(), scope, operation, key, &rec, row) &&
			!IsExpired(&rec, GetCurrentTransactionStartTimestamp()))
		{
			funcctx->user_fctx = row;
			funcctx->max_calls = 1;
		}
		MemoryContextSwitchTo(oldcxt);
	}

	funcctx = SRF_PERCALL_SETUP();
	if (funcctx->call_cntr < funcctx->max_calls)
		SRF_RETURN_NEXT(funcctx, *(Datum *) funcctx->user_fctx);
	SRF_RETURN_DONE(funcctx);
}
