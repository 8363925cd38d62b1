/*-------------------------------------------------------------------------
 *
 * keys.c
 *	  The key lifecycle: idem_reserve, idem_complete, idem_release,
 *	  idem_checkpoint and idem_lookup, all inside the caller's transaction,
 *	  and the C API that idem_call and idem_consume share (patterns.c).
 *	  The table itself belongs to records.c: every read here is its
 *	  primary-key lookup, every write goes through its executor writer.
 *
 * The key lock is a heavyweight lock in the advisory lock space of the
 * database, tagged with a 64-bit hash of (scope, operation, key) and a
 * fourth field IDEM_LOCKTAG_SPACE (objsubid 26980 in pg_locks), so it never
 * collides with the application's advisory locks; held only during one
 * call (or to the end of the transaction for at most IDEM_MAX_HELD held
 * reservations), it lets a transaction reserve any number of keys.
 *
 * A reservation of an absent key does not write: it is held (held.c),
 * its key lock kept to the end of the transaction, and its record written
 * once, later, as the write the reservation would have made.  Meanwhile
 * another session sees no row and the key lock taken: idem_reserve answers
 * in_progress at once (a different request too: its mismatch shows once
 * the record is written), and idem_complete, idem_checkpoint and
 * idem_release wait for the holder as for the writer of an uncommitted
 * row.  The rules of the locks and waits are above ReserveRecord.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/parallel.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/regproc.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "idempotency.h"
#include "held.h"
#include "records.h"

PG_FUNCTION_INFO_V1(idem_reserve);
PG_FUNCTION_INFO_V1(idem_complete);
PG_FUNCTION_INFO_V1(idem_release);
PG_FUNCTION_INFO_V1(idem_checkpoint);
PG_FUNCTION_INFO_V1(idem_lookup);

/* What a SQL-callable function caches across calls in fn_extra */
typedef struct IdemFnCache
{
	Oid			nspid;
	TupleDesc	tupdesc;		/* result row of idem_reserve */
} IdemFnCache;

/* What the dirty read of a key's record saw */
typedef enum KeySight
{
	SIGHT_ABSENT,				/* no record */
	SIGHT_EXPIRED,				/* a completed record past expires_at: gone */
	SIGHT_LIVE,					/* a live record nobody else is writing */
	SIGHT_BUSY					/* a record another open transaction writes */
} KeySight;

/* How an attempt to create or renew a record ended */
typedef enum ClaimResult
{
	CLAIM_DONE,					/* the record is ours */
	CLAIM_CHANGED,				/* the expired row changed: look again */
	CLAIM_BUSY					/* another transaction locks the expired row */
} ClaimResult;

/* What a reservation asks for, with the times it computed */
typedef struct KeyRequest
{
	text	   *scope;
	text	   *operation;
	text	   *key;
	bytea	   *hash;			/* fingerprint, NULL without a request */
	Interval   *ttl;			/* never NULL: the default filled in */
	TimestampTz now;			/* the clock time of the call */
	TimestampTz expires_at;
	int			flags;			/* IDEM_RESERVE_* */
} KeyRequest;

/* The changes of a live record, named in their errors */
typedef enum KeyAction
{
	ACTION_COMPLETE,
	ACTION_CHECKPOINT,
	ACTION_RELEASE
} KeyAction;

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
	IdemCheckOperationArg(operation, "operation");
}

/* Check an argument used as an operation; errors name it argname */
void
IdemCheckOperationArg(text *operation, const char *argname)
{
	CheckLength(operation, argname, IDEM_MAX_OPERATION_LEN, false);
}

/* Check the key argument: 1 to 255 bytes of printable ASCII */
void
IdemCheckKey(text *key)
{
	IdemCheckKeyArg(key, "key");
}

/* Check an argument used as a key; errors name it argname */
void
IdemCheckKeyArg(text *key, const char *argname)
{
	const unsigned char *p;
	int			len;
	int			i;

	CheckLength(key, argname, IDEM_MAX_KEY_LEN, false);
	p = (const unsigned char *) VARDATA_ANY(key);
	len = VARSIZE_ANY_EXHDR(key);
	for (i = 0; i < len; i++)
	{
		if (p[i] < 0x20 || p[i] > 0x7E)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("argument \"%s\" contains a character outside printable ASCII",
							argname),
					 errdetail("Byte 0x%02x at position %d is not between 0x20 and 0x7e.",
							   p[i], i + 1),
					 errhint("Use printable ASCII keys, such as a UUID; encode other identifiers, for example as hex.")));
	}
}

/*
 * Check the scope argument: not NULL, at most 255 bytes, may be empty, and
 * not in the prefix reserved for the extension's own records (idem_consume's)
 */
void
IdemCheckScope(text *scope)
{
	int			plen = strlen(IDEM_RESERVED_SCOPE_PREFIX);

	CheckLength(scope, "scope", IDEM_MAX_SCOPE_LEN, true);
	if (VARSIZE_ANY_EXHDR(scope) >= plen &&
		memcmp(VARDATA_ANY(scope), IDEM_RESERVED_SCOPE_PREFIX, plen) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("argument \"scope\" must not begin with \"%s\"",
						IDEM_RESERVED_SCOPE_PREFIX),
				 errdetail("Scopes beginning with \"%s\" are reserved for the extension's own records, such as idem_consume's.",
						   IDEM_RESERVED_SCOPE_PREFIX),
				 errhint("Choose another scope.")));
}

/* The per-call-site cache of a SQL-callable function */
static IdemFnCache *
GetFnCache(FunctionCallInfo fcinfo)
{
	FmgrInfo   *flinfo = fcinfo->flinfo;

	if (flinfo->fn_extra == NULL)
	{
		IdemFnCache *cache = MemoryContextAllocZero(flinfo->fn_mcxt,
													sizeof(IdemFnCache));

		cache->nspid = get_func_namespace(flinfo->fn_oid);
		flinfo->fn_extra = cache;
	}
	return (IdemFnCache *) flinfo->fn_extra;
}

/* Namespace of the extension, found from the called function itself */
Oid
IdemFunctionNamespace(FunctionCallInfo fcinfo)
{
	return GetFnCache(fcinfo)->nspid;
}

/*
 * The time a call counts from: the clock, not the statement's start.
 * Times are clock times of the call (GetCurrentTimestamp(), as
 * clock_timestamp()), never the start of the statement, the client's message
 * or the transaction: a record is created when idem_reserve runs, updated_at
 * (the heartbeat) is the time of the last write, and a completion sets
 * expires_at to the time idem_complete runs plus the ttl (idem_consume's
 * to the time of its transaction's commit plus the ttl).  A procedure, a
 * PL/pgSQL block, an idem_call handler or a message of many statements that
 * runs longer than the ttl before completing so still commits a live record.
 */
static TimestampTz
CallTime(void)
{
	return GetCurrentTimestamp();
}

/* A ttl argument checked, or idempotency.default_ttl when NULL */
static Interval *
EffectiveTtl(Interval *ttl, TimestampTz now)
{
	Interval   *result;

	if (ttl == NULL)
	{
		result = palloc0(sizeof(Interval));
		result->time = (int64) idem_default_ttl_s * USECS_PER_SEC;
		return result;
	}
	if (IdemAddTtl(now, ttl) <= now)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("argument \"ttl\" must be positive"),
				 errdetail("The ttl was \"%s\".",
						   DatumGetCString(DirectFunctionCall1(interval_out,
															   IntervalPGetDatum(ttl))))));
	return ttl;
}

/*
 * The ttl a completion of rec counts from: the one given at reservation.
 * A record without one (reserved by release 0.1.0, whose update leaves its
 * rows alone, or written by hand) was reserved until expires_at, so its
 * ttl is expires_at - created_at, as 0.1.0 computed it; only where that
 * is not positive, idempotency.default_ttl.
 */
static Interval *
RecordTtl(const IdemRecord *rec, TimestampTz now)
{
	if (rec->ttl != NULL)
		return rec->ttl;
	if (rec->expires_at > rec->created_at)
		return DatumGetIntervalP(DirectFunctionCall2(timestamp_mi,
													 TimestampTzGetDatum(rec->expires_at),
													 TimestampTzGetDatum(rec->created_at)));
	return EffectiveTtl(NULL, now);
}

/* Is a completed record past its expires_at, and so gone? */
static bool
IsExpired(const IdemRecord *rec, TimestampTz now)
{
	return rec->status == STATUS_COMPLETED && rec->expires_at <= now;
}

/*
 * Is a processing record's heartbeat older than processing_timeout?
 * -infinity (set by hand) is older than any timeout: now minus it
 * overflows, which TimestampDifferenceExceeds would read as not yet.
 */
static bool
HeartbeatExpired(TimestampTz updated_at, TimestampTz now)
{
	return TIMESTAMP_IS_NOBEGIN(updated_at) ||
		TimestampDifferenceExceeds(updated_at, now, idem_processing_timeout_ms);
}

/*
 * The one lookup of a key: read its record through the primary key with a
 * dirty snapshot into rec, and say what was seen.
 */
static KeySight
LookAtKey(IdemTable *table, text *scope, text *operation, text *key,
		  TimestampTz now, IdemRecord *rec)
{
	SnapshotData dirty;

	InitDirtySnapshot(dirty);
	if (!IdemRecordsFetch(table, &dirty, scope, operation, key, rec, NULL))
		return SIGHT_ABSENT;
	if (rec->flags & RECORD_BUSY)
		return SIGHT_BUSY;
	if (IsExpired(rec, now))
		return SIGHT_EXPIRED;
	return SIGHT_LIVE;
}

/* Fill a reservation from a live record that nobody else is writing */
static void
ClassifyRecord(const IdemRecord *rec, bytea *hash, TimestampTz now,
			   IdemReservation *result)
{
	if (IdemHashesDiffer(rec->request_hash, hash))
		result->outcome = IDEM_MISMATCH;
	else if (rec->status == STATUS_COMPLETED)
	{
		result->outcome = IDEM_REPLAY;
		result->has_response_status = rec->has_response_status;
		result->response_status = rec->response_status;
		result->response = rec->response;
		result->resource_id = rec->resource_id;
		result->recovery_point = rec->recovery_point;
		result->has_expires_at = true;
		result->expires_at = rec->expires_at;
	}
	else if (rec->status == STATUS_STUCK ||
			 ((rec->flags & RECORD_MINE) == 0 &&
			  HeartbeatExpired(rec->updated_at, now)))
	{
		result->outcome = IDEM_STUCK;
		result->resource_id = rec->resource_id;
		result->recovery_point = rec->recovery_point;
	}
	else
		result->outcome = IDEM_IN_PROGRESS;
}

/*
 * Create the record of a request, or renew the expired one seen (sight):
 * processing, or completed at once (with no response) for idem_consume.
 * The caller holds the key lock and has just looked again.
 */
static ClaimResult
ClaimKey(IdemTable *table, KeySight sight, IdemRecord *rec, KeyRequest *req)
{
	bool		completed = (req->flags & IDEM_RESERVE_COMPLETED) != 0;
	IdemWriter	w;
	IdemRow		row;
	ClaimResult result = CLAIM_DONE;

	/* Every column, so that the same row inserts or renews */
	IdemRowNewRecord(&row, req->scope, req->operation, req->key, req->hash,
				 completed, req->now, req->now, req->expires_at, req->ttl);

	IdemRecordsWriterBegin(table,
						   sight == SIGHT_EXPIRED ? ACL_INSERT | ACL_UPDATE : ACL_INSERT,
						   completed ? "idem_consume()" : "idem_reserve()", &w);
	if (sight == SIGHT_ABSENT)
		IdemRecordsInsert(&w, &row);
	else
	{
		LockWaitPolicy policy =
			(req->flags & IDEM_RESERVE_WAIT) ? LockWaitBlock : LockWaitSkip;

		switch (IdemRecordsLock(&w, &rec->tid, LockTupleNoKeyExclusive, policy))
		{
			case TM_Ok:
				(void) IdemRecordsUpdate(&w, &row, true);
				break;
			case TM_WouldBlock:
				result = CLAIM_BUSY;
				break;
			default:
				/* renewed or deleted (the sweeper) meanwhile */
				result = CLAIM_CHANGED;
				break;
		}
	}
	IdemRecordsWriterEnd(&w);
	return result;
}

/* Count a reservation and its outcome in idem_stats, when asked to */
static void
CountReservation(KeyRequest *req, IdemReservation *result)
{
	if (req->flags & IDEM_RESERVE_COUNT)
	{
		IdemStatsCount(VARDATA_ANY(req->operation), VARSIZE_ANY_EXHDR(req->operation),
					   IDEM_STAT_RESERVES, 1);
		IdemStatsCount(VARDATA_ANY(req->operation), VARSIZE_ANY_EXHDR(req->operation),
					   OutcomeCounter(result->outcome), 1);
	}
}

/*
 * Locking rules
 * -------------
 *	- Every call reads the record with a dirty snapshot (as unique
 *	  checks do): it sees committed rows whatever the caller's snapshot, and
 *	  rows other open transactions are inserting, updating or deleting.
 *	- idem_reserve never waits.  A row another transaction is writing or
 *	  row-locking is in_progress (mismatch if its fingerprint differs); a
 *	  committed live row decides by itself (replay, stuck, mismatch,
 *	  in_progress).
 *	- Each reservation takes the key lock (an advisory lock of the key's
 *	  hash) without waiting, reads, writes if it must, and releases the lock
 *	  at once: from then on its uncommitted row speaks for the key.  One
 *	  that finds the lock taken reads all the same and answers from what it
 *	  sees, in_progress unless a live record decides.
 *	- Except a held reservation (held.c): a new key keeps its key lock to the
 *	  end of the transaction, and the lock speaks for the key until the
 *	  record is written.
 *	- idem_complete, idem_checkpoint and idem_release that find no record
 *	  wait for another transaction holding the key lock, then look again.
 *	- Renewing an expired row first locks that row version without waiting:
 *	  a row another transaction locks or deletes answers in_progress.
 *	- Every update of a record (complete, checkpoint, flag, renew) takes the
 *	  key lock for the write itself (records.c), so a reservation, which
 *	  reads under it, sees the old version or the new one, never neither.
 *	- idem_complete, idem_checkpoint, idem_release and idem_consume(wait)
 *	  do wait: for the writer of the row, then for its row lock.
 *
 * Reserve a key for the current transaction, or say why not.  The outcomes
 * and their order are the contract's table.
 */
static void
ReserveRecord(Oid nspid, KeyRequest *req, IdemReservation *result)
{
	IdemTable	table;
	LOCKTAG		tag;
	bool		locked = false;

	memset(result, 0, sizeof(*result));
	if (IdemHeldAnswer(nspid, req->scope, req->operation, req->key, req->hash,
					   result))
	{
		CountReservation(req, result);
		return;
	}
	IdemRecordsOpen(nspid, req->scope, AccessShareLock, &table);
	IdemRecordsCheckReadable(&table);
	IdemRecordsKeyLockTag(&tag, req->scope, req->operation, req->key);

	for (;;)
	{
		IdemRecord	rec;
		KeySight	sight;

		/*
		 * The key lock, without waiting (unless asked to): a reservation that
		 * does not get it still looks, and answers from what it sees.
		 */
		if (!locked)
			locked = LockAcquire(&tag, ExclusiveLock, false,
								 (req->flags & IDEM_RESERVE_WAIT) == 0) != LOCKACQUIRE_NOT_AVAIL;

		sight = LookAtKey(&table, req->scope, req->operation, req->key,
						  req->now, &rec);
		if (sight == SIGHT_BUSY)
		{
			/*
			 * Another open transaction is writing this key.  A different
			 * fingerprint is a mismatch whatever becomes of it, so say so now
			 * rather than depend on timing.
			 */
			if (!IsExpired(&rec, req->now) && IdemHashesDiffer(rec.request_hash, req->hash))
				result->outcome = IDEM_MISMATCH;
			else if (req->flags & IDEM_RESERVE_WAIT)
			{
				/* Not holding the key lock while waiting: it guards writes only */
				LockRelease(&tag, ExclusiveLock, false);
				locked = false;
				XactLockTableWait(rec.writer_xid, table.rel, &rec.tid, XLTW_None);
				continue;
			}
			else
				result->outcome = IDEM_IN_PROGRESS;
			break;
		}
		if (sight == SIGHT_LIVE)
		{
			ClassifyRecord(&rec, req->hash, req->now, result);

			/*
			 * Another open transaction locking the record owns the key for
			 * now (the contract): only a different fingerprint says more.
			 * A caller that waits reads what is committed.
			 */
			if ((rec.flags & RECORD_LOCKED) && result->outcome != IDEM_MISMATCH &&
				(req->flags & IDEM_RESERVE_WAIT) == 0)
			{
				memset(result, 0, sizeof(*result));
				result->outcome = IDEM_IN_PROGRESS;
			}
			break;
		}

		/*
		 * Absent or expired.  Without the key lock, another reservation holds
		 * it and is creating the record right now.
		 */
		if (!locked)
		{
			result->outcome = IDEM_IN_PROGRESS;
			break;
		}
		if (sight == SIGHT_ABSENT &&
			IdemHeldHold(&table, nspid, req->scope, req->operation, req->key,
						 req->hash, req->ttl, req->now, req->expires_at,
						 (req->flags & IDEM_RESERVE_COMPLETED) != 0))
		{
			/* Written later, once (held.c); the lock stays */
			locked = false;
			result->outcome = IDEM_NEW;
			result->has_expires_at = true;
			result->expires_at = req->expires_at;
			break;
		}
		switch (ClaimKey(&table, sight, &rec, req))
		{
			case CLAIM_CHANGED:
				continue;
			case CLAIM_BUSY:
				result->outcome = IDEM_IN_PROGRESS;
				break;
			case CLAIM_DONE:
				/* idem_consume's expiry counts from commit (held.c) */
				if (req->flags & IDEM_RESERVE_COMPLETED)
					IdemHeldConsumedAtOnce(&table, nspid, req->scope,
										   req->operation, req->key, req->ttl);
				result->outcome = IDEM_NEW;
				result->has_expires_at = true;
				result->expires_at = req->expires_at;
				break;
		}
		break;
	}

	/* Our uncommitted row, if any, now speaks for the key */
	if (locked)
		LockRelease(&tag, ExclusiveLock, false);
	IdemRecordsClose(&table);
	CountReservation(req, result);
}

/* Fill a request's times and fingerprint, then reserve */
static void
Reserve(Oid nspid, text *scope, text *operation, text *key, Jsonb *request,
		Interval *ttl, int flags, IdemReservation *result)
{
	KeyRequest	req;

	req.scope = scope;
	req.operation = operation;
	req.key = key;
	req.hash = request ? IdemHashJsonb(request) : NULL;
	req.now = CallTime();
	req.ttl = EffectiveTtl(ttl, req.now);
	req.expires_at = IdemAddTtl(req.now, req.ttl);
	req.flags = flags;
	ReserveRecord(nspid, &req, result);
}

/*
 * Reserve for the caller, who runs the effect and then completes or
 * releases.  Flags: IDEM_RESERVE_WAIT waits for a key another open
 * transaction holds instead of answering in_progress; IDEM_RESERVE_COUNT
 * counts the reservation and its outcome in idem_stats.
 */
void
IdemReserve(Oid nspid, text *scope, text *operation, text *key,
			Jsonb *request, Interval *ttl, int flags, IdemReservation *result)
{
	Reserve(nspid, scope, operation, key, request, ttl,
			flags & ~IDEM_RESERVE_COMPLETED, result);
}

/*
 * Reserve and complete in one write, with no request and no response, for
 * idem_consume: its effect runs later in the same transaction, and a record
 * that is never committed unfinished needs no processing state.  Flags as
 * for IdemReserve; idem_consume counts consumed or duplicates itself.
 */
void
IdemReserveCompleted(Oid nspid, text *scope, text *operation, text *key,
					 Interval *ttl, int flags, IdemReservation *result)
{
	Reserve(nspid, scope, operation, key, NULL, ttl,
			flags | IDEM_RESERVE_COMPLETED, result);
}

/* The detail of the errors of a key: which operation and scope */
static int
KeyDetail(text *scope, text *operation)
{
	return errdetail("Operation \"%s\", scope \"%s\".",
					 text_to_cstring(operation), text_to_cstring(scope));
}

/* The detail of ID001: no record to change */
static int
NotReservedDetail(text *scope, text *operation)
{
	return errdetail("Operation \"%s\", scope \"%s\" has no processing or stuck record with this key.",
					 text_to_cstring(operation), text_to_cstring(scope));
}

/* Raise ID001 for a key with no live record to complete or checkpoint */
pg_noreturn static void
ReportNotReserved(KeyAction action, text *scope, text *operation, text *key)
{
	char	   *k = text_to_cstring(key);

	if (action == ACTION_COMPLETE)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_KEY_NOT_FOUND),
				 errmsg("cannot complete idempotency key \"%s\": it is not reserved", k),
				 NotReservedDetail(scope, operation),
				 errhint("Call idem_reserve first; a record may also have been released or expired.")));
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_KEY_NOT_FOUND),
			 errmsg("cannot checkpoint idempotency key \"%s\": it is not reserved", k),
			 NotReservedDetail(scope, operation),
			 errhint("Call idem_reserve first; a record may also have been released or expired.")));
}

/* Raise ID002: the change would let a retry run the effect twice */
pg_noreturn static void
ReportCompleted(KeyAction action, text *scope, text *operation, text *key)
{
	char	   *k = text_to_cstring(key);

	switch (action)
	{
		case ACTION_COMPLETE:
			ereport(ERROR,
					(errcode(ERRCODE_IDEM_KEY_COMPLETED),
					 errmsg("cannot complete idempotency key \"%s\": it is already completed", k),
					 KeyDetail(scope, operation),
					 errhint("A completed key keeps its result until it expires; a retry with it replays that result.")));
			break;
		case ACTION_CHECKPOINT:
			ereport(ERROR,
					(errcode(ERRCODE_IDEM_KEY_COMPLETED),
					 errmsg("cannot checkpoint idempotency key \"%s\": it is already completed", k),
					 KeyDetail(scope, operation),
					 errhint("A completed key keeps its result until it expires; a retry with it replays that result.")));
			break;
		case ACTION_RELEASE:
			ereport(ERROR,
					(errcode(ERRCODE_IDEM_KEY_COMPLETED),
					 errmsg("cannot release idempotency key \"%s\": it is already completed", k),
					 KeyDetail(scope, operation),
					 errhint("A completed key keeps its result until it expires; a retry with it replays that result.")));
			break;
	}
	pg_unreachable();
}

/*
 * Wait for another transaction that holds the key lock of a key with no
 * record, as for the writer of a row: one that holds the reservation
 * without having written it yet (see the file header).  true when it
 * waited, and the caller should look again.
 */
static bool
WaitForHolder(text *scope, text *operation, text *key)
{
	LOCKTAG		tag;

	IdemRecordsKeyLockTag(&tag, scope, operation, key);
	if (LockAcquire(&tag, ExclusiveLock, false, true) != LOCKACQUIRE_NOT_AVAIL)
	{
		LockRelease(&tag, ExclusiveLock, false);
		return false;
	}
	(void) LockAcquire(&tag, ExclusiveLock, false, false);
	LockRelease(&tag, ExclusiveLock, false);
	return true;
}

/*
 * Find the live processing or stuck record of a key and lock it for the
 * writer w (mode: for an update or a delete), waiting for any other
 * transaction writing or locking it.  false when there is no live record;
 * a completed one raises ID002.
 */
static bool
LockLiveRecord(IdemWriter *w, LockTupleMode mode, KeyAction action,
			   text *scope, text *operation, text *key, IdemRecord *rec)
{
	for (;;)
	{
		switch (LookAtKey(w->table, scope, operation, key, CallTime(), rec))
		{
			case SIGHT_ABSENT:
				if (WaitForHolder(scope, operation, key))
					continue;
				return false;
			case SIGHT_EXPIRED:
				return false;
			case SIGHT_BUSY:
				XactLockTableWait(rec->writer_xid, w->table->rel, &rec->tid, XLTW_None);
				continue;
			case SIGHT_LIVE:
				break;
		}
		if (rec->status == STATUS_COMPLETED)
			ReportCompleted(action, scope, operation, key);
		if (IdemRecordsLock(w, &rec->tid, mode, LockWaitBlock) == TM_Ok)
			return true;
		/* changed while we waited for its lock: look again */
	}
}

/*
 * Complete (with the result in row) or checkpoint the live record of a
 * key; the heartbeat is set here, and a completion's expires_at counts its
 * ttl from now.
 */
static void
ChangeLiveRecord(Oid nspid, KeyAction action, text *scope, text *operation,
				 text *key, IdemRow *row)
{
	IdemTable	table;
	IdemWriter	w;
	IdemRecord	rec;
	TimestampTz now;
	const char *function = action == ACTION_COMPLETE ? "idem_complete()" : "idem_checkpoint()";

	/* The one write of a held reservation, with this change */
	if (IdemHeldChange(nspid, scope, operation, key, row,
					   action == ACTION_COMPLETE, function))
		return;

	IdemRecordsOpen(nspid, scope, RowExclusiveLock, &table);
	IdemRecordsCheckReadable(&table);
	IdemRecordsWriterBegin(&table, ACL_UPDATE, function, &w);
	if (!LockLiveRecord(&w, LockTupleNoKeyExclusive, action, scope, operation,
						key, &rec))
		ReportNotReserved(action, scope, operation, key);

	/* Read after the wait for the row: a completion counts from its write */
	now = CallTime();
	IdemRowSet(row, COL_UPDATED_AT, TimestampTzGetDatum(now), false);
	if (action == ACTION_COMPLETE)
	{
		IdemRowSet(row, COL_EXPIRES_AT,
				   TimestampTzGetDatum(IdemAddTtl(now, RecordTtl(&rec, now))),
				   false);
	}
	(void) IdemRecordsUpdate(&w, row, true);
	IdemRecordsWriterEnd(&w);
	IdemRecordsClose(&table);
}

/* Move a processing or stuck record to completed with its result */
void
IdemComplete(Oid nspid, text *scope, text *operation, text *key,
			 Jsonb *response, int32 response_status, text *resource_id,
			 bool count_stats)
{
	IdemRow		row;

	IdemRowInit(&row);
	IdemRowSet(&row, COL_STATUS, CStringGetTextDatum("completed"), false);
	IdemRowSet(&row, COL_RESPONSE, PointerGetDatum(response), response == NULL);
	IdemRowSet(&row, COL_RESPONSE_STATUS, Int32GetDatum(response_status), false);
	IdemRowSet(&row, COL_RESOURCE_ID, PointerGetDatum(resource_id), resource_id == NULL);
	ChangeLiveRecord(nspid, ACTION_COMPLETE, scope, operation, key, &row);

	if (count_stats)
		IdemStatsCount(VARDATA_ANY(operation), VARSIZE_ANY_EXHDR(operation),
					   IDEM_STAT_COMPLETES, 1);
}

/* Record a recovery point; also a heartbeat that un-sticks the record */
static void
IdemCheckpoint(Oid nspid, text *scope, text *operation, text *key,
			   text *recovery_point)
{
	IdemRow		row;

	IdemRowInit(&row);
	IdemRowSet(&row, COL_STATUS, CStringGetTextDatum("processing"), false);
	IdemRowSet(&row, COL_RECOVERY_POINT, PointerGetDatum(recovery_point),
			   recovery_point == NULL);
	ChangeLiveRecord(nspid, ACTION_CHECKPOINT, scope, operation, key, &row);
}

/* Delete a processing or stuck record; false when there is none */
bool
IdemRelease(Oid nspid, text *scope, text *operation, text *key)
{
	IdemTable	table;
	IdemWriter	w;
	IdemRecord	rec;
	bool		found;

	/* A held reservation is written first, and then deleted as any other */
	IdemHeldWriteNow(nspid, scope, operation, key, "idem_release()");

	IdemRecordsOpen(nspid, scope, RowExclusiveLock, &table);
	IdemRecordsCheckReadable(&table);
	IdemRecordsWriterBegin(&table, ACL_DELETE, "idem_release()", &w);
	found = LockLiveRecord(&w, LockTupleExclusive, ACTION_RELEASE, scope,
						   operation, key, &rec);
	if (found)
		(void) IdemRecordsDelete(&w, true);
	IdemRecordsWriterEnd(&w);
	IdemRecordsClose(&table);

	if (found)
		IdemStatsCount(VARDATA_ANY(operation), VARSIZE_ANY_EXHDR(operation),
					   IDEM_STAT_RELEASES, 1);
	return found;
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

/* The columns of idem_reserve's row, in order (both catalogs) */
static const Oid reserve_result_types[] = {
	TEXTOID,					/* outcome */
	INT4OID,					/* http_status */
	INT4OID,					/* response_status */
	JSONBOID,					/* response */
	TEXTOID,					/* resource_id */
	TEXTOID,					/* recovery_point */
	TIMESTAMPTZOID				/* expires_at */
};

static bool
IsReserveResultDesc(TupleDesc desc)
{
	if (desc == NULL || desc->natts != lengthof(reserve_result_types))
		return false;
	for (int i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

		if (att->attisdropped || att->atttypid != reserve_result_types[i])
			return false;
	}
	return true;
}

/*
 * The row descriptor of idem_reserve's result, blessed, in fn_mcxt.  Called
 * in FROM, as callers do, the executor has already built it (from the OUT
 * parameters, or the idem_reservation type of the 0.1.0 catalog) and passes
 * it as expectedDesc: building it again from pg_proc cost a replay 10,000
 * of its 120,000 instructions.  A call elsewhere takes it from the
 * catalog.  Either way its columns are checked, since the values below are
 * formed by position.
 */
static TupleDesc
ReserveResultDesc(FunctionCallInfo fcinfo)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	TupleDesc	desc = NULL;
	MemoryContext oldcxt;

	if (rsinfo != NULL && IsA(rsinfo, ReturnSetInfo))
		desc = rsinfo->expectedDesc;
	if (!IsReserveResultDesc(desc))
	{
		if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
			elog(ERROR, "return type must be a row type");
		if (!IsReserveResultDesc(desc))
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("result type of function %s has been changed",
							format_procedure(fcinfo->flinfo->fn_oid)),
					 errdetail("The function must return the columns outcome, http_status, response_status, response, resource_id, recovery_point and expires_at, in that order.")));
	}
	oldcxt = MemoryContextSwitchTo(fcinfo->flinfo->fn_mcxt);
	desc = BlessTupleDesc(CreateTupleDescCopy(desc));
	MemoryContextSwitchTo(oldcxt);
	return desc;
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
	IdemFnCache *cache = GetFnCache(fcinfo);
	Datum		values[7];
	bool		nulls[7];
	int			http;

	GetKeyArgs(fcinfo, 0, 1, 3, &operation, &key, &scope);

	if (cache->tupdesc == NULL)
		cache->tupdesc = ReserveResultDesc(fcinfo);

	IdemReserve(cache->nspid, scope, operation, key, request, ttl,
				IDEM_RESERVE_COUNT, &r);

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

	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(cache->tupdesc, values, nulls)));
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

/*
 * The snapshot idem_lookup reads with: the latest committed state and this
 * transaction's own writes, at every isolation level, so that it answers
 * about the record idem_reserve and idem_complete just saw and wrote, not
 * a version that the transaction's snapshot still sees after another
 * transaction deleted it.  A parallel query cannot take a new snapshot: it
 * reads with its own, where IdemRecordsFetch still prefers the
 * transaction's own version of the record.
 */
static Snapshot
LookupSnapshot(void)
{
	if (IsInParallelMode())
		return GetActiveSnapshot();
	return GetLatestSnapshot();
}

/*
 * The record row, a tuple of the table read, as a row of idem_lookup's
 * result type, column by column by name: the columns the function declares
 * (0.2.0: a TABLE of idem_keys's columns, so that no relation is opened for
 * the result), or idem_keys itself (0.1.0: SETOF idem_keys).  The table is
 * open and locked, so its descriptor cannot go away meanwhile.
 */
static Datum
LookupResultRow(FunctionCallInfo fcinfo, IdemTable *table, Datum row)
{
	TupleDesc	result;
	TupleDesc	tabledesc = RelationGetDescr(table->rel);
	HeapTupleData tuple;
	Datum	   *tvalues;
	bool	   *tnulls;
	Datum	   *values;
	bool	   *nulls;
	int			i;

	if (get_call_result_type(fcinfo, NULL, &result) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	result = BlessTupleDesc(CreateTupleDescCopy(result));

	tuple.t_len = HeapTupleHeaderGetDatumLength(DatumGetHeapTupleHeader(row));
	ItemPointerSetInvalid(&tuple.t_self);
	tuple.t_tableOid = InvalidOid;
	tuple.t_data = DatumGetHeapTupleHeader(row);
	tvalues = palloc(tabledesc->natts * sizeof(Datum));
	tnulls = palloc(tabledesc->natts * sizeof(bool));
	heap_deform_tuple(&tuple, tabledesc, tvalues, tnulls);

	values = palloc(result->natts * sizeof(Datum));
	nulls = palloc(result->natts * sizeof(bool));
	for (i = 0; i < result->natts; i++)
	{
		Form_pg_attribute out = TupleDescAttr(result, i);
		int			j;

		values[i] = (Datum) 0;
		nulls[i] = true;
		if (out->attisdropped)
			continue;
		for (j = 0; j < tabledesc->natts; j++)
		{
			Form_pg_attribute in = TupleDescAttr(tabledesc, j);

			if (in->attisdropped || strcmp(NameStr(in->attname), NameStr(out->attname)) != 0)
				continue;
			if (in->atttypid != out->atttypid)
				ereport(ERROR,
						(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
						 errmsg("column \"%s\" of table \"%s\" must be of type %s",
								NameStr(in->attname), RelationGetRelationName(table->rel),
								format_type_be(out->atttypid)),
						 errhint("Change the column back with ALTER TABLE ... ALTER COLUMN ... TYPE.")));
			values[i] = tvalues[j];
			nulls[i] = tnulls[j];
			break;
		}
	}
	return HeapTupleGetDatum(heap_form_tuple(result, values, nulls));
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
		IdemTable	table;
		IdemRecord	rec;
		Datum	   *row;
		Snapshot	snapshot;
		MemoryContext oldcxt;
		Oid			nspid;
		IdemRow		r;

		GetKeyArgs(fcinfo, 0, 1, 2, &operation, &key, &scope);

		/*
		 * The reservations this transaction holds are in the leader's memory
		 * only: 0.3.0 declares the function PARALLEL RESTRICTED, and the 0.2.0
		 * catalog, which declared it PARALLEL SAFE, gets an ERROR rather than
		 * the answer that a held key has no record
		 */
		if (IsParallelWorker())
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_TRANSACTION_STATE),
					 errmsg("idem_lookup cannot run in a parallel worker"),
					 errdetail("The reservations a transaction holds are known to its own backend only."),
					 errhint("Run ALTER EXTENSION idempotency UPDATE: it declares idem_lookup PARALLEL RESTRICTED.")));
		funcctx = SRF_FIRSTCALL_INIT();
		oldcxt = MemoryContextSwitchTo(funcctx->multi_call_memory_ctx);
		/* Not IdemFunctionNamespace: the SRF machinery owns fn_extra */
		nspid = get_func_namespace(fcinfo->flinfo->fn_oid);
		IdemRecordsOpen(nspid, scope, AccessShareLock, &table);
		IdemRecordsCheckReadable(&table);
		row = palloc(sizeof(Datum));
		snapshot = RegisterSnapshot(LookupSnapshot());
		if (IdemHeldRecord(nspid, scope, operation, key, &r))
		{
			/* Not written yet: the record as it will be (held.c) */
			*row = LookupResultRow(fcinfo, &table, IdemRecordsFormRow(&table, &r));
			funcctx->user_fctx = row;
			funcctx->max_calls = 1;
		}
		else if (IdemRecordsFetch(&table, snapshot, scope, operation, key, &rec, row) &&
				 !IsExpired(&rec, CallTime()))
		{
			*row = LookupResultRow(fcinfo, &table, *row);
			funcctx->user_fctx = row;
			funcctx->max_calls = 1;
		}
		UnregisterSnapshot(snapshot);
		IdemRecordsClose(&table);
		MemoryContextSwitchTo(oldcxt);
	}

	funcctx = SRF_PERCALL_SETUP();
	if (funcctx->call_cntr < funcctx->max_calls)
		SRF_RETURN_NEXT(funcctx, *(Datum *) funcctx->user_fctx);
	SRF_RETURN_DONE(funcctx);
}
