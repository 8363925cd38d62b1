/*-------------------------------------------------------------------------
 *
 * keys.c
 *	  The key lifecycle: idem_reserve, idem_complete, idem_release,
 *	  idem_checkpoint and idem_lookup, all inside the caller's transaction.
 *
 * Concurrency design
 * ------------------
 * Every reservation starts with a *dirty* read of the record through the
 * primary key (SnapshotDirty, as unique checks do): it shows committed rows
 * whatever the caller's snapshot, and also rows that other transactions have
 * inserted, updated or deleted but not yet committed, with the id of that
 * transaction.
 *
 *	- A row another open transaction is writing means another request owns
 *	  the key right now: idem_reserve answers in_progress at once (mismatch
 *	  when that row carries another fingerprint); it never waits on the other
 *	  transaction.  idem_consume(wait => true), idem_complete, idem_release
 *	  and idem_checkpoint wait for it instead (XactLockTableWait) and look
 *	  again.
 *	- Otherwise the committed row, if any, decides: replay, stuck, mismatch or
 *	  in_progress.  So a REPEATABLE READ or SERIALIZABLE transaction whose
 *	  snapshot is older than another's commit still gets replay, never a
 *	  duplicate, never a unique violation.
 *	- To create (or renew an expired) record, the reserver briefly takes the
 *	  *key lock* without waiting, reads again, writes, and releases the lock
 *	  at once: from then on its uncommitted row is what the others see.  The
 *	  key lock is a heavyweight lock in the advisory lock space of the
 *	  database, tagged with a 64-bit hash of (scope, operation, key) and a
 *	  fourth field IDEM_LOCKTAG_SPACE (objsubid 26980 in pg_locks), so it never
 *	  collides with the application's own advisory locks.  Because it is held
 *	  only around the write, a transaction may reserve any number of keys
 *	  without filling the lock table.
 *	- A reservation that found no record need not read it again under the
 *	  key lock when nobody wrote it in between.  Writers bump a per-slot
 *	  write generation in shared memory before releasing the key lock, and
 *	  the reserver compares the generation it read before its first read
 *	  with the one it sees once it holds the lock (IdemKeysShared).  So a
 *	  new key costs one primary-key read and the insert.
 *	- A key seen before need not descend the primary key at all.  Shared
 *	  memory also notes, for the keys last written or found in each set of
 *	  key hashes, the place (TID) of their record; a reservation reads the
 *	  row there first and uses it only if it is a version of that key that
 *	  the dirty snapshot sees and nobody is writing, which is the row the
 *	  index would return (FetchAtPlace).  So a replay costs one heap read.
 *	- Completing, releasing and checkpointing update the row in place with
 *	  the table AM; a concurrent writer makes the update wait and then report
 *	  the row changed, and the loop reads it again.  When the current
 *	  transaction wrote the record, they find it at the place it was last
 *	  written (IdemLastWrite) instead of through the index.
 *
 * Reads go straight through the primary-key index, and writes straight to
 * the heap and its indexes (table_tuple_insert/update/delete and
 * ExecInsertIndexTuples): no SQL is planned or parsed, so nothing on the
 * caller's search_path can change what they do, and the hot path costs no
 * executor start-up.  Privileges are checked as the statement would
 * (SELECT to read, INSERT/UPDATE/DELETE to write); row-level security on
 * idem_keys is refused, and triggers on it do not fire.
 *
 * The only other writer is the sweeper, which deletes expired completed
 * records.  If it deletes a record that idem_reserve is renewing, the update
 * finds it gone (after waiting for the sweeper's short batch) and inserts.
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
#include "executor/executor.h"
#include "nodes/makefuncs.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/bufmgr.h"
#include "storage/ipc.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "storage/proc.h"
#include "storage/shmem.h"
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
	TimestampTz created_at;
	TimestampTz updated_at;
	TimestampTz expires_at;
	bool		mine;			/* written by the current transaction */
	HeapTuple	tuple;			/* the whole row, for updates */
	ItemPointerData tid;
	/* with a dirty snapshot: another open transaction writing this row */
	TransactionId other;
	bool		other_deletes;	/* ... deleting it (not updating it) */
} IdemRecord;

/* Where idem_keys and its primary key are, for one extension schema */
typedef struct IdemCatalog
{
	Oid			nspid;
	Oid			relid;
} IdemCatalog;

/* What a SQL-callable function caches across calls in fn_extra */
typedef struct IdemFnCache
{
	Oid			nspid;
	TupleDesc	tupdesc;		/* result row of idem_reserve */
} IdemFnCache;

/*
 * An open idem_keys with what direct writes need.  The indexes are opened
 * only when an entry must be added: a completion is a HOT update and needs
 * none.
 */
typedef struct IdemWriter
{
	Relation	rel;
	uint64		keyhash;		/* KeyHash of the one key it writes */
	EState	   *estate;			/* NULL until the indexes are opened */
	ResultRelInfo *rri;
	TupleTableSlot *slot;
} IdemWriter;

/*
 * Where this backend last wrote a record, so that completing, checkpointing
 * or releasing the key in the same transaction finds its row without
 * reading the primary key again.  Only a hint: the row at tid is used only
 * if it is still the current transaction's live version of the same key.
 */
typedef struct IdemLastWrite
{
	LocalTransactionId lxid;	/* transaction that wrote it, or invalid */
	SubTransactionId subid;		/* subtransaction that wrote it */
	Oid			relid;
	Oid			relfilenode;	/* TRUNCATE in between gives a new one */
	ItemPointerData tid;
} IdemLastWrite;

/*
 * Write generations in shared memory, one counter per slot of key hashes.
 * A reservation that finds no record reads its slot's counter before that
 * read and again once it holds the key lock; every writer bumps the counter
 * before it releases the key lock.  An unchanged counter proves that nobody
 * created the record in between, so the second read of the primary key is
 * skipped.  Without shared_preload_libraries there are no counters and the
 * record is always read again.
 */
#define IDEM_GENERATION_SLOTS	4096

/*
 * Where each key's record was last seen, also in shared memory: a two-way
 * set-associative table indexed by key hash.  Each entry is one 64-bit word
 * with 16 more bits of the hash (bits 48-63), the block (16-47) and the line
 * pointer (0-15) of the row version last written or read there; way 0 of a
 * set holds its most recently stored entry, way 1 the one before, so two
 * keys whose hashes share a set do not take turns evicting each other.  Only
 * a hint, which spares a replay its primary-key descent: the row found at
 * that place is used only if it is the key's one version that a dirty
 * snapshot sees and nobody is writing it (see FetchAtPlace).  An entry of
 * 0 is empty, as no row has line pointer 0.
 */
#define IDEM_PLACE_SETS			32768
#define IDEM_PLACE_WAYS			2
#define PlaceTag(keyhash)		((keyhash) & UINT64CONST(0xFFFF000000000000))
#define PlaceIsOf(word, keyhash) \
	(PlaceTag(word) == PlaceTag(keyhash) && ((word) & 0xFFFF) != 0)

typedef struct IdemKeysShared
{
	pg_atomic_uint64 generation[IDEM_GENERATION_SLOTS];
	pg_atomic_uint64 place[IDEM_PLACE_SETS][IDEM_PLACE_WAYS];
} IdemKeysShared;

static IdemCatalog idem_catalog;
static IdemLastWrite idem_last_write;
static IdemKeysShared *idem_keys_shared = NULL;

#if PG_VERSION_NUM >= 150000
static shmem_request_hook_type prev_shmem_request_hook = NULL;
#endif
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

#if PG_VERSION_NUM >= 150000
/* shmem_request_hook: request the write generations */
static void
KeysShmemRequest(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(MAXALIGN(sizeof(IdemKeysShared)));
}
#endif

/* shmem_startup_hook: create or attach the write generations */
static void
KeysShmemStartup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	idem_keys_shared = ShmemInitStruct("idempotency keys",
									   sizeof(IdemKeysShared), &found);
	if (!found)
	{
		int			i;

		for (i = 0; i < IDEM_GENERATION_SLOTS; i++)
			pg_atomic_init_u64(&idem_keys_shared->generation[i], 0);
		for (i = 0; i < IDEM_PLACE_SETS; i++)
		{
			pg_atomic_init_u64(&idem_keys_shared->place[i][0], 0);
			pg_atomic_init_u64(&idem_keys_shared->place[i][1], 0);
		}
	}
	LWLockRelease(AddinShmemInitLock);
}

/* When preloaded, register the write generations' shared memory */
void
IdemKeysInit(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;
#if PG_VERSION_NUM >= 150000
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = KeysShmemRequest;
#else
	RequestAddinShmemSpace(MAXALIGN(sizeof(IdemKeysShared)));
#endif
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = KeysShmemStartup;
}

/* The write generation of a key's slot (0 without shared memory) */
static inline uint64
ReadGeneration(uint64 keyhash)
{
	uint64		gen;

	if (idem_keys_shared == NULL)
		return 0;
	gen = pg_atomic_read_u64(&idem_keys_shared->generation[keyhash % IDEM_GENERATION_SLOTS]);
	pg_read_barrier();
	return gen;
}

/* After writing a record, before releasing its key lock */
static inline void
BumpGeneration(uint64 keyhash)
{
	if (idem_keys_shared != NULL)
		pg_atomic_fetch_add_u64(&idem_keys_shared->generation[keyhash % IDEM_GENERATION_SLOTS], 1);
}

/*
 * Note that the record of a key hash was seen or written at tid: the entry
 * goes to way 0 of its set, and whatever way 0 held for another key moves to
 * way 1, dropping the older entry there.  Concurrent stores to one set may
 * lose an entry; a place is only a hint.
 */
static inline void
StorePlace(uint64 keyhash, ItemPointer tid)
{
	pg_atomic_uint64 *set;
	uint64		first;

	if (idem_keys_shared == NULL)
		return;
	set = idem_keys_shared->place[keyhash % IDEM_PLACE_SETS];
	first = pg_atomic_read_u64(&set[0]);
	if (first != 0 && !PlaceIsOf(first, keyhash))
		pg_atomic_write_u64(&set[1], first);
	pg_atomic_write_u64(&set[0], PlaceTag(keyhash) |
						((uint64) ItemPointerGetBlockNumberNoCheck(tid) << 16) |
						ItemPointerGetOffsetNumberNoCheck(tid));
}

/* Where the record of a key hash was last seen; false when not known */
static inline bool
ReadPlace(uint64 keyhash, ItemPointer tid)
{
	pg_atomic_uint64 *set;
	uint64		word;

	if (idem_keys_shared == NULL)
		return false;
	set = idem_keys_shared->place[keyhash % IDEM_PLACE_SETS];
	word = pg_atomic_read_u64(&set[0]);
	if (!PlaceIsOf(word, keyhash))
	{
		word = pg_atomic_read_u64(&set[1]);
		if (!PlaceIsOf(word, keyhash))
			return false;
	}
	ItemPointerSet(tid, (BlockNumber) ((word >> 16) & 0xFFFFFFFF), (OffsetNumber) (word & 0xFFFF));
	return true;
}

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

/* Column names of idem_keys, in attribute number order */
static const char *const idem_columns[Natts_idem_keys] = {
	"scope", "operation", "key", "request_hash", "status", "response_status",
	"response", "resource_id", "recovery_point", "created_at", "updated_at",
	"expires_at"
};

/* Refuse to read or write an idem_keys whose columns were altered */
static void
CheckColumns(Relation rel)
{
	TupleDesc	desc = RelationGetDescr(rel);
	int			i;

	for (i = 0; i < Max(desc->natts, Natts_idem_keys); i++)
	{
		Form_pg_attribute att = i < desc->natts ? TupleDescAttr(desc, i) : NULL;

		if (att == NULL || i >= Natts_idem_keys || att->attisdropped ||
			strcmp(NameStr(att->attname), idem_columns[i]) != 0)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("table \"idem_keys\" has been altered"),
					 errdetail("It should have exactly the columns %s, ..., %s of the install script.",
							   idem_columns[0], idem_columns[Natts_idem_keys - 1]),
					 errhint("Reinstall the extension with DROP EXTENSION idempotency; CREATE EXTENSION idempotency;")));
	}
}

/*
 * Find idem_keys in the extension's schema; after DROP/CREATE EXTENSION the
 * cache follows the new relation.
 */
static IdemCatalog *
GetCatalog(Oid nspid)
{
	Oid			relid = get_relname_relid("idem_keys", nspid);

	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("table \"idem_keys\" of extension \"idempotency\" does not exist"),
				 errhint("Reinstall the extension with DROP EXTENSION idempotency; CREATE EXTENSION idempotency;")));

	idem_catalog.nspid = nspid;
	idem_catalog.relid = relid;
	return &idem_catalog;
}

/* Check a privilege on idem_keys as the equivalent statement would */
static void
CheckPrivilege(Oid relid, AclMode mode)
{
	AclResult	aclresult;

	aclresult = pg_class_aclcheck(relid, GetUserId(), mode);
	if (aclresult != ACLCHECK_OK)
		aclcheck_error(aclresult, OBJECT_TABLE, get_rel_name(relid));
}

/* Refuse to read past privileges or row-level security */
static void
CheckReadable(Oid relid)
{
	CheckPrivilege(relid, ACL_SELECT);
	if (check_enable_rls(relid, InvalidOid, false) == RLS_ENABLED)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("row-level security on \"idem_keys\" is not supported"),
				 errhint("Separate tenants with the \"scope\" argument instead.")));
}

/* 64-bit hash of (scope, operation, key): the key lock's tag and generation slot */
static uint64
KeyHash(text *scope, text *operation, text *key)
{
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
	return h;
}

/* The key lock's tag for a key hash */
static void
KeyLockTag(LOCKTAG *tag, uint64 h)
{
	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, (uint32) (h >> 32), (uint32) h,
						 IDEM_LOCKTAG_SPACE);
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
 * Copy the row in slot, read with snapshot, into rec (and, when tuple_out
 * is given, into a composite datum there too)
 */
static void
FillRecord(TupleTableSlot *slot, Snapshot snapshot, IdemRecord *rec,
		   Datum *tuple_out)
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
	rec->created_at = DatumGetTimestampTz(slot->tts_values[Anum_created_at - 1]);
	rec->updated_at = DatumGetTimestampTz(slot->tts_values[Anum_updated_at - 1]);
	rec->expires_at = DatumGetTimestampTz(slot->tts_values[Anum_expires_at - 1]);

	d = slot_getsysattr(slot, MinTransactionIdAttributeNumber, &isnull);
	rec->mine = !isnull && TransactionIdIsCurrentTransactionId(DatumGetTransactionId(d));
	rec->tuple = ExecCopySlotHeapTuple(slot);
	rec->tid = slot->tts_tid;

	if (snapshot->snapshot_type == SNAPSHOT_DIRTY)
	{
		/* A new row version carries xmin, an old one being replaced xmax */
		rec->other = TransactionIdIsValid(snapshot->xmin) ?
			snapshot->xmin : snapshot->xmax;
		rec->other_deletes = !TransactionIdIsValid(snapshot->xmin) &&
			TransactionIdIsValid(snapshot->xmax) &&
			ItemPointerEquals(&rec->tuple->t_self, &rec->tuple->t_data->t_ctid);
	}

	if (tuple_out)
		*tuple_out = heap_copy_tuple_as_datum(rec->tuple, slot->tts_tupleDescriptor);
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
	Oid			indexid;
	IndexScanDesc scan;
	TupleTableSlot *slot;
	ScanKeyData skey[3];
	text	   *args[3] = {scope, operation, key};
	bool		found;
	int			i;

	heap = table_open(cat->relid, AccessShareLock);
	CheckColumns(heap);
	/* From the relcache each time: REINDEX CONCURRENTLY gives it a new OID */
	indexid = IdemPrimaryKeyIndex(heap);
	if (!OidIsValid(indexid))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table \"idem_keys\" has no primary key"),
				 errhint("Reinstall the extension with DROP EXTENSION idempotency; CREATE EXTENSION idempotency;")));
	index = index_open(indexid, AccessShareLock);

	for (i = 0; i < 3; i++)
		ScanKeyEntryInitialize(&skey[i], 0, i + 1, BTEqualStrategyNumber,
							   InvalidOid, index->rd_indcollation[i],
							   F_TEXTEQ, PointerGetDatum(args[i]));

	slot = table_slot_create(heap, NULL);
	scan = IdemIndexBeginScan(heap, index, snapshot, 3, 0);
	index_rescan(scan, skey, 3, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, slot);
	if (found)
		FillRecord(slot, snapshot, rec, tuple_out);

	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	index_close(index, AccessShareLock);
	table_close(heap, AccessShareLock);
	return found;
}

/* Does a text datum hold exactly the bytes of t? */
static bool
TextDatumEquals(Datum d, text *t)
{
	text	   *v = DatumGetTextPP(d);

	return VARSIZE_ANY_EXHDR(v) == VARSIZE_ANY_EXHDR(t) &&
		memcmp(VARDATA_ANY(v), VARDATA_ANY(t), VARSIZE_ANY_EXHDR(t)) == 0;
}

/*
 * Read the row at tid into rec if it is a version of (scope, operation, key)
 * that a dirty snapshot sees and that no other open transaction is
 * inserting, updating or deleting.  Such a row is the one the primary key
 * would return: the unique key lets no other transaction write another
 * version of the key while this one is live, earlier versions are dead to a
 * dirty snapshot, and our own transaction's rows are seen only in their
 * latest version.  The caller makes sure that tid's block exists.
 */
static bool
FetchVersionAt(Relation heap, ItemPointer tid, text *scope, text *operation,
			   text *key, IdemRecord *rec)
{
	SnapshotData dirty;
	TupleTableSlot *slot;
	bool		found = false;

	InitDirtySnapshot(dirty);
	slot = table_slot_create(heap, NULL);
	if (table_tuple_fetch_row_version(heap, tid, &dirty, slot) &&
		!TransactionIdIsValid(dirty.xmin) && !TransactionIdIsValid(dirty.xmax))
	{
		slot_getsomeattrs(slot, Anum_key);
		if (TextDatumEquals(slot->tts_values[Anum_key - 1], key) &&
			TextDatumEquals(slot->tts_values[Anum_operation - 1], operation) &&
			TextDatumEquals(slot->tts_values[Anum_scope - 1], scope))
		{
			FillRecord(slot, &dirty, rec, NULL);
			found = true;
		}
	}
	ExecDropSingleTupleTableSlot(slot);
	return found;
}

/*
 * Read the record of (scope, operation, key) at the place this backend last
 * wrote one, if that row is still this transaction's live version of the
 * same key; false sends the caller to the primary key.  The row's page
 * exists: our uncommitted row's lock keeps VACUUM from truncating it, and
 * the place is forgotten when that lock goes (ForgetWriteOnAbort).
 */
static bool
FetchLastWrite(Relation heap, text *scope, text *operation, text *key,
			   IdemRecord *rec)
{
	if (idem_last_write.lxid != CurrentLocalXid() ||
		idem_last_write.relid != RelationGetRelid(heap) ||
		idem_last_write.relfilenode != RelationFileNumber(heap))
		return false;
	return FetchVersionAt(heap, &idem_last_write.tid, scope, operation, key, rec) &&
		rec->mine;
}

/*
 * Read the record of (scope, operation, key) at tid, a place where a record
 * of its key hash was last seen or written (ReadPlace), if the row there is
 * such a version of that key (FetchVersionAt); false sends the caller to the
 * primary key.  Any other place (stale, another key's, another database's,
 * past the end of a truncated table) fails the checks, so a place is never
 * wrong, only useless.  The caller holds heap open: its lock keeps VACUUM
 * from truncating the table until it is done.
 */
static bool
FetchAtPlace(Relation heap, ItemPointer tid, text *scope, text *operation,
			 text *key, IdemRecord *rec)
{
	return ItemPointerGetBlockNumber(tid) < RelationGetNumberOfBlocks(heap) &&
		FetchVersionAt(heap, tid, scope, operation, key, rec);
}

/*
 * FetchAtPlace for a reservation, which opens idem_keys only when a place
 * of the key hash is known.
 */
static bool
FetchKnownPlace(IdemCatalog *cat, uint64 keyhash, text *scope, text *operation,
				text *key, IdemRecord *rec)
{
	ItemPointerData tid;
	Relation	heap;
	bool		found;

	if (!ReadPlace(keyhash, &tid))
		return false;

	heap = table_open(cat->relid, AccessShareLock);
	CheckColumns(heap);
	found = FetchAtPlace(heap, &tid, scope, operation, key, rec);
	table_close(heap, AccessShareLock);
	return found;
}

/*
 * Forget the last write when the subtransaction that made it (or one it
 * was nested in) rolls back: the row is dead, and the lock that kept VACUUM
 * from truncating its page away went with the subtransaction.
 */
static void
ForgetWriteOnAbort(SubXactEvent event, SubTransactionId mySubid,
				   SubTransactionId parentSubid, void *arg)
{
	if (event == SUBXACT_EVENT_ABORT_SUB && idem_last_write.subid >= mySubid)
		idem_last_write.lxid = InvalidLocalTransactionId;
}

/* Remember where the writer's slot now holds this transaction's record */
static void
RememberWrite(IdemWriter *w)
{
	static bool callback_registered = false;

	if (!callback_registered)
	{
		RegisterSubXactCallback(ForgetWriteOnAbort, NULL);
		callback_registered = true;
	}
	idem_last_write.lxid = CurrentLocalXid();
	idem_last_write.subid = GetCurrentSubTransactionId();
	idem_last_write.relid = RelationGetRelid(w->rel);
	idem_last_write.relfilenode = RelationFileNumber(w->rel);
	idem_last_write.tid = w->slot->tts_tid;
	StorePlace(w->keyhash, &w->slot->tts_tid);
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

/*
 * Open idem_keys for direct writes after checking what the equivalent
 * statement would: not in a read-only transaction (nor on a standby), and
 * each privilege in modes.  keyhash is that of the key it will write, to
 * note where its row goes (StorePlace).
 */
static void
WriterOpen(IdemCatalog *cat, AclMode modes, const char *function,
		   uint64 keyhash, IdemWriter *w)
{
	PreventCommandIfReadOnly(function);
	if (modes & ACL_INSERT)
		CheckPrivilege(cat->relid, ACL_INSERT);
	if (modes & ACL_UPDATE)
		CheckPrivilege(cat->relid, ACL_UPDATE);
	if (modes & ACL_DELETE)
		CheckPrivilege(cat->relid, ACL_DELETE);
	w->rel = table_open(cat->relid, RowExclusiveLock);
	CheckColumns(w->rel);
	w->keyhash = keyhash;
	w->estate = NULL;
	w->rri = NULL;
	w->slot = MakeSingleTupleTableSlot(RelationGetDescr(w->rel), &TTSOpsHeapTuple);
}

/* Close the writer and make its changes visible to what follows */
static void
WriterClose(IdemWriter *w)
{
	ExecDropSingleTupleTableSlot(w->slot);
	if (w->estate)
	{
		ExecCloseIndices(w->rri);
		FreeExecutorState(w->estate);
	}
	table_close(w->rel, NoLock);
	CommandCounterIncrement();
}

/*
 * Add index entries for the tuple in the writer's slot.  "update" is passed
 * as false even after a non-HOT update: it only asks the executor whether
 * the indexed columns changed, which needs a range table we do not build,
 * and it only serves as a hint for bottom-up index deletion.
 */
static void
InsertIndexEntries(IdemWriter *w)
{
	if (w->estate == NULL)
	{
		w->estate = CreateExecutorState();
		w->rri = makeNode(ResultRelInfo);
		InitResultRelInfo(w->rri, w->rel, 1, NULL, 0);
		ExecOpenIndices(w->rri, false);
	}
	IdemInsertIndexTuples(w->rri, w->estate, 0, w->slot, NIL, NULL);
}

/* Raise 40001 for a record changed twice by one command (a trigger, say) */
static void
ReportConcurrentChange(void)
{
	ereport(ERROR,
			(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
			 errmsg("could not serialize access due to concurrent update of an idempotency record"),
			 errhint("Retry the transaction; change idem_keys only through the idem_ functions.")));
}

/* Insert a new row into idem_keys */
static void
InsertRow(IdemWriter *w, Datum *values, bool *nulls)
{
	HeapTuple	tuple = heap_form_tuple(RelationGetDescr(w->rel), values, nulls);

	ExecStoreHeapTuple(tuple, w->slot, true);
	table_tuple_insert(w->rel, w->slot, GetCurrentCommandId(true), 0, NULL);
	InsertIndexEntries(w);
	RememberWrite(w);
}

/*
 * Replace the columns marked in replace[] of a fetched row, waiting for a
 * concurrent writer of the row.  Anything but TM_Ok means the row changed
 * meanwhile and must be read again.
 */
static TM_Result
UpdateRow(IdemWriter *w, IdemRecord *rec, Datum *values, bool *nulls, bool *replace)
{
	HeapTuple	tuple;
	TM_Result	result;
	TM_FailureData tmfd;
	LockTupleMode lockmode;
	TU_UpdateIndexes update_indexes;

	tuple = heap_modify_tuple(rec->tuple, RelationGetDescr(w->rel), values, nulls, replace);
	ExecStoreHeapTuple(tuple, w->slot, true);
	result = IdemTableTupleUpdate(w->rel, &rec->tid, w->slot, GetCurrentCommandId(true), 0,
								  InvalidSnapshot, InvalidSnapshot, true, &tmfd, &lockmode,
								  &update_indexes);
	if (result == TM_SelfModified)
		ReportConcurrentChange();
	if (result == TM_Ok && update_indexes != TU_None)
		InsertIndexEntries(w);
	if (result == TM_Ok)
		RememberWrite(w);
	return result;
}

/* Delete a fetched row, waiting for a concurrent writer of it */
static TM_Result
DeleteRow(IdemWriter *w, IdemRecord *rec)
{
	TM_FailureData tmfd;
	TM_Result	result;

	result = IdemTableTupleDelete(w->rel, &rec->tid, GetCurrentCommandId(true), 0,
								  InvalidSnapshot, InvalidSnapshot, true, &tmfd);
	if (result == TM_SelfModified)
		ReportConcurrentChange();
	return result;
}

/* Start column arrays for a row: all NULL, nothing replaced */
static void
InitRow(Datum *values, bool *nulls, bool *replace)
{
	int			i;

	for (i = 0; i < Natts_idem_keys; i++)
	{
		values[i] = (Datum) 0;
		nulls[i] = true;
		if (replace)
			replace[i] = false;
	}
}

/* Set column attnum of a row (ptr NULL means SQL NULL) */
static inline void
SetColumn(Datum *values, bool *nulls, bool *replace, int attnum, Datum value, bool isnull)
{
	values[attnum - 1] = value;
	nulls[attnum - 1] = isnull;
	if (replace)
		replace[attnum - 1] = true;
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

/* Fill a reservation from a live record that nobody else is writing */
static void
ClassifyRecord(const IdemRecord *rec, bytea *hash, TimestampTz now,
			   IdemReservation *result)
{
	if (HashDiffers(rec->request_hash, hash))
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
			 (!rec->mine &&
			  TimestampDifferenceExceeds(rec->updated_at, now,
										 idem_processing_timeout_ms)))
	{
		result->outcome = IDEM_STUCK;
		result->resource_id = rec->resource_id;
		result->recovery_point = rec->recovery_point;
	}
	else
		result->outcome = IDEM_IN_PROGRESS;
}

/*
 * Create the record, or renew the expired one in place: processing, or
 * completed at once (with no response) for idem_consume.  false when the
 * expired row changed meanwhile and must be read again.
 */
static bool
WriteReservation(IdemCatalog *cat, IdemRecord *rec, bool found,
				 text *scope, text *operation, text *key, uint64 keyhash,
				 bytea *hash, TimestampTz now, TimestampTz expires_at,
				 bool completed)
{
	IdemWriter	w;
	TM_Result	result = TM_Ok;
	Datum		values[Natts_idem_keys];
	bool		nulls[Natts_idem_keys];
	bool		replace[Natts_idem_keys];

	/* Every column, so that the same arrays insert or renew */
	InitRow(values, nulls, replace);
	SetColumn(values, nulls, replace, Anum_scope, PointerGetDatum(scope), false);
	SetColumn(values, nulls, replace, Anum_operation, PointerGetDatum(operation), false);
	SetColumn(values, nulls, replace, Anum_key, PointerGetDatum(key), false);
	SetColumn(values, nulls, replace, Anum_request_hash, PointerGetDatum(hash), hash == NULL);
	SetColumn(values, nulls, replace, Anum_status,
			  CStringGetTextDatum(completed ? "completed" : "processing"), false);
	SetColumn(values, nulls, replace, Anum_response_status, (Datum) 0, true);
	SetColumn(values, nulls, replace, Anum_response, (Datum) 0, true);
	SetColumn(values, nulls, replace, Anum_resource_id, (Datum) 0, true);
	SetColumn(values, nulls, replace, Anum_recovery_point, (Datum) 0, true);
	SetColumn(values, nulls, replace, Anum_created_at, TimestampTzGetDatum(now), false);
	SetColumn(values, nulls, replace, Anum_updated_at, TimestampTzGetDatum(GetCurrentTimestamp()), false);
	SetColumn(values, nulls, replace, Anum_expires_at, TimestampTzGetDatum(expires_at), false);

	/*
	 * If the sweeper deletes a row we renew, the update waits for it and
	 * reports it gone: insert afresh.  Any other change means look again.
	 */
	WriterOpen(cat, found ? ACL_UPDATE | ACL_INSERT : ACL_INSERT,
			   completed ? "idem_consume()" : "idem_reserve()", keyhash, &w);
	if (found)
		result = UpdateRow(&w, rec, values, nulls, replace);
	if (!found || result == TM_Deleted)
	{
		InsertRow(&w, values, nulls);
		result = TM_Ok;
	}
	WriterClose(&w);
	return result == TM_Ok;
}

/*
 * Reserve (scope, operation, key) for the current transaction, or say why
 * not.  The outcomes and their order are the contract's table; the
 * concurrency rules are in the file header.  With completed, the new record
 * is written completed at once.
 */
static void
ReserveRecord(Oid nspid, text *scope, text *operation, text *key,
			  Jsonb *request, Interval *ttl, bool wait, bool count_stats,
			  bool completed, IdemReservation *result)
{
	IdemCatalog *cat = GetCatalog(nspid);
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	TimestampTz expires_at = ExpiryTime(now, ttl);
	bytea	   *hash = request ? IdemHashJsonb(request) : NULL;
	uint64		keyhash = KeyHash(scope, operation, key);
	LOCKTAG		tag;
	bool		locked = false;

	memset(result, 0, sizeof(*result));
	CheckReadable(cat->relid);
	KeyLockTag(&tag, keyhash);

	for (;;)
	{
		SnapshotData dirty;
		IdemRecord	rec;
		bool		found;
		bool		live;
		uint64		generation = ReadGeneration(keyhash);

		InitDirtySnapshot(dirty);
		found = FetchKnownPlace(cat, keyhash, scope, operation, key, &rec);
		if (!found)
		{
			found = FetchRecord(cat, &dirty, scope, operation, key, &rec, NULL);
			if (found && !TransactionIdIsValid(rec.other))
				StorePlace(keyhash, &rec.tid);
		}
		live = found && !IsExpired(&rec, now);

		if (found && TransactionIdIsValid(rec.other) && !live && rec.other_deletes)
		{
			/*
			 * A sweep batch (or a DELETE) is removing this expired record:
			 * wait for its short transaction rather than race it, then look
			 * again.
			 */
			XactLockTableWait(rec.other, NULL, NULL, XLTW_None);
			continue;
		}
		if (found && TransactionIdIsValid(rec.other))
		{
			/*
			 * Another open transaction is writing this key.  A different
			 * fingerprint is a mismatch whatever becomes of it, so say so now
			 * rather than depend on timing.
			 */
			if (live && HashDiffers(rec.request_hash, hash))
				result->outcome = IDEM_MISMATCH;
			else if (wait)
			{
				/* Not holding the key lock while waiting: it guards writes only */
				if (locked)
				{
					LockRelease(&tag, ExclusiveLock, false);
					locked = false;
				}
				XactLockTableWait(rec.other, NULL, NULL, XLTW_None);
				continue;
			}
			else
				result->outcome = IDEM_IN_PROGRESS;
			break;
		}
		if (live)
		{
			ClassifyRecord(&rec, hash, now, result);
			break;
		}

		/*
		 * Absent or expired: take the key lock, then look once more, unless
		 * the record was absent and its write generation shows that nobody
		 * has written it since (see IdemKeysShared).  An expired row is read
		 * again in any case: renewing it needs its current version.
		 */
		if (!locked)
		{
			if (LockAcquire(&tag, ExclusiveLock, false, !wait) == LOCKACQUIRE_NOT_AVAIL)
			{
				result->outcome = IDEM_IN_PROGRESS;
				break;
			}
			locked = true;
			if (found || idem_keys_shared == NULL ||
				ReadGeneration(keyhash) != generation)
				continue;
		}

		if (!WriteReservation(cat, &rec, found, scope, operation, key, keyhash,
							  hash, now, expires_at, completed))
			continue;
		BumpGeneration(keyhash);
		result->outcome = IDEM_NEW;
		result->has_expires_at = true;
		result->expires_at = expires_at;
		break;
	}

	/* Our uncommitted row, if any, now speaks for the key */
	if (locked)
		LockRelease(&tag, ExclusiveLock, false);

	if (count_stats)
	{
		IdemStatsCount(VARDATA_ANY(operation), VARSIZE_ANY_EXHDR(operation),
					   IDEM_STAT_RESERVES, 1);
		IdemStatsCount(VARDATA_ANY(operation), VARSIZE_ANY_EXHDR(operation),
					   OutcomeCounter(result->outcome), 1);
	}
}

/* Reserve for the caller, who runs the effect and then completes or releases */
void
IdemReserve(Oid nspid, text *scope, text *operation, text *key,
			Jsonb *request, Interval *ttl, bool wait, bool count_stats,
			IdemReservation *result)
{
	ReserveRecord(nspid, scope, operation, key, request, ttl, wait,
				  count_stats, false, result);
}

/*
 * Reserve and complete in one write, with no request and no response, for
 * idem_consume: its effect runs later in the same transaction, and a record
 * that is never committed unfinished needs no processing state.  Not
 * counted in idem_stats; the caller counts consumed or duplicates.
 */
void
IdemReserveCompleted(Oid nspid, text *scope, text *operation, text *key,
					 Interval *ttl, bool wait, IdemReservation *result)
{
	ReserveRecord(nspid, scope, operation, key, NULL, ttl, wait, false, true,
				  result);
}

/*
 * Read the live record to complete, release or checkpoint through the
 * writer w, waiting for any other open transaction writing it.  Returns
 * false when there is no live record; a completed record raises ID002: the
 * action would let a retry run the effect twice.
 */
static bool
FetchForChange(IdemCatalog *cat, IdemWriter *w, text *scope, text *operation,
			   text *key, IdemRecord *rec, const char *action)
{
	for (;;)
	{
		SnapshotData dirty;
		ItemPointerData place;

		InitDirtySnapshot(dirty);
		if (!FetchLastWrite(w->rel, scope, operation, key, rec) &&
			!(ReadPlace(w->keyhash, &place) &&
			  FetchAtPlace(w->rel, &place, scope, operation, key, rec)) &&
			!FetchRecord(cat, &dirty, scope, operation, key, rec, NULL))
			return false;
		if (IsExpired(rec, GetCurrentTransactionStartTimestamp()))
			return false;
		if (TransactionIdIsValid(rec->other))
		{
			XactLockTableWait(rec->other, NULL, NULL, XLTW_None);
			continue;
		}
		if (rec->status == STATUS_COMPLETED)
			ereport(ERROR,
					(errcode(ERRCODE_IDEM_KEY_COMPLETED),
					 errmsg("cannot %s idempotency key \"%s\": it is already completed",
							action, text_to_cstring(key)),
					 errdetail("Operation \"%s\", scope \"%s\".",
							   text_to_cstring(operation), text_to_cstring(scope)),
					 errhint("A completed key keeps its result until it expires; a retry with it replays that result.")));
		return true;
	}
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

/*
 * Update the live processing or stuck record of (scope, operation, key) with
 * the columns marked in replace[] and the heartbeat, reading it again while
 * a concurrent writer changes it.  "action" names the caller in errors;
 * "completing" asks for the late-completion expiry rule.
 */
static void
UpdateLiveRecord(Oid nspid, text *scope, text *operation, text *key,
				 const char *action, const char *function, bool completing,
				 Datum *values, bool *nulls, bool *replace)
{
	IdemCatalog *cat = GetCatalog(nspid);
	IdemRecord	rec;
	IdemWriter	w;
	TM_Result	result;

	CheckReadable(cat->relid);
	SetColumn(values, nulls, replace, Anum_updated_at,
			  TimestampTzGetDatum(GetCurrentTimestamp()), false);
	WriterOpen(cat, ACL_UPDATE, function, KeyHash(scope, operation, key), &w);
	do
	{
		TimestampTz now = GetCurrentTransactionStartTimestamp();

		if (!FetchForChange(cat, &w, scope, operation, key, &rec, action))
			ReportNotFound(scope, operation, key, action);

		/*
		 * A record completed after its expires_at (a stuck one reconciled
		 * late) would vanish at once and let the next retry run the effect
		 * again: give it its ttl again, counted from now.
		 */
		if (completing && rec.expires_at <= now)
			SetColumn(values, nulls, replace, Anum_expires_at,
					  TimestampTzGetDatum(now + (rec.expires_at - rec.created_at)), false);
		result = UpdateRow(&w, &rec, values, nulls, replace);
	} while (result != TM_Ok);
	WriterClose(&w);
}

/* Move a processing or stuck record to completed with its result */
void
IdemComplete(Oid nspid, text *scope, text *operation, text *key,
			 Jsonb *response, int32 response_status, text *resource_id,
			 bool count_stats)
{
	Datum		values[Natts_idem_keys];
	bool		nulls[Natts_idem_keys];
	bool		replace[Natts_idem_keys];

	InitRow(values, nulls, replace);
	SetColumn(values, nulls, replace, Anum_status, CStringGetTextDatum("completed"), false);
	SetColumn(values, nulls, replace, Anum_response, PointerGetDatum(response), response == NULL);
	SetColumn(values, nulls, replace, Anum_response_status, Int32GetDatum(response_status), false);
	SetColumn(values, nulls, replace, Anum_resource_id, PointerGetDatum(resource_id), resource_id == NULL);
	UpdateLiveRecord(nspid, scope, operation, key, "complete", "idem_complete()",
					 true, values, nulls, replace);

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
	IdemWriter	w;
	TM_Result	result;

	CheckReadable(cat->relid);
	WriterOpen(cat, ACL_DELETE, "idem_release()", KeyHash(scope, operation, key), &w);
	do
	{
		if (!FetchForChange(cat, &w, scope, operation, key, &rec, "release"))
		{
			WriterClose(&w);
			return false;
		}
		result = DeleteRow(&w, &rec);
	} while (result != TM_Ok);
	WriterClose(&w);

	IdemStatsCount(VARDATA_ANY(operation), VARSIZE_ANY_EXHDR(operation),
				   IDEM_STAT_RELEASES, 1);
	return true;
}

/* Record a recovery point; also a heartbeat that un-sticks the record */
static void
IdemCheckpoint(Oid nspid, text *scope, text *operation, text *key,
			   text *recovery_point)
{
	Datum		values[Natts_idem_keys];
	bool		nulls[Natts_idem_keys];
	bool		replace[Natts_idem_keys];

	InitRow(values, nulls, replace);
	SetColumn(values, nulls, replace, Anum_status, CStringGetTextDatum("processing"), false);
	SetColumn(values, nulls, replace, Anum_recovery_point, PointerGetDatum(recovery_point),
			  recovery_point == NULL);
	UpdateLiveRecord(nspid, scope, operation, key, "checkpoint", "idem_checkpoint()",
					 false, values, nulls, replace);
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
	IdemFnCache *cache = GetFnCache(fcinfo);
	Datum		values[7];
	bool		nulls[7];
	int			http;

	GetKeyArgs(fcinfo, 0, 1, 3, &operation, &key, &scope);

	if (cache->tupdesc == NULL)
	{
		TupleDesc	tupdesc;
		MemoryContext oldcxt;

		if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
			elog(ERROR, "return type must be a row type");
		oldcxt = MemoryContextSwitchTo(fcinfo->flinfo->fn_mcxt);
		cache->tupdesc = BlessTupleDesc(CreateTupleDescCopy(tupdesc));
		MemoryContextSwitchTo(oldcxt);
	}

	IdemReserve(cache->nspid, scope, operation, key,
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
