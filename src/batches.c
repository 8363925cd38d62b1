/*-------------------------------------------------------------------------
 *
 * batches.c
 *	  The sweep and flag batches of a maintenance pass (maintenance.c runs
 *	  them, each in a unit of its own): a sweep batch deletes completed
 *	  records past expires_at, read through the expires_at index; a flag
 *	  batch marks processing records past processing_timeout as stuck,
 *	  read through the processing index, with one NOTIFY idem_stuck each.
 *
 * Each batch reads with the latest snapshot, locks a candidate row
 * version without waiting (IdemRecordsLock, LockWaitSkip) and deletes or
 * flags it through records.c's executor writer, as keys.c writes, so the
 * table's constraints and triggers hold for both; a record that another
 * transaction is writing, locking or reserving is left for the next pass.
 * Only valid, ready indexes are read; without one, the table is read
 * whole, with a WARNING once per pass.  What runs inside a write may wait
 * for locks of its own: a batch runs with lock_timeout at most
 * IDEM_BATCH_LOCK_TIMEOUT_MS.
 *
 * One record whose write fails never stops the rest (IdemRunBatch): the
 * batch runs in a subtransaction; when a record's write raises, the batch
 * is rolled back, the record reported with a WARNING naming its key and
 * left alone for the rest of the pass, and the batch runs again without
 * it.  One subtransaction per batch, not per record, so that no snapshot's
 * subxid cache overflows.  A cancel is never swallowed.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_am.h"
#include "catalog/pg_class.h"
#include "catalog/pg_index.h"
#include "catalog/pg_operator.h"
#include "catalog/pg_type.h"
#include "commands/async.h"
#include "commands/defrem.h"
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "storage/lmgr.h"
#include "storage/proc.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/json.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/rls.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "idempotency.h"
#include "maintenance.h"
#include "records.h"

#define IDEM_STUCK_CHANNEL		"idem_stuck"

/*
 * NOTIFY payloads must be shorter than 8000 bytes.  Keys, scopes and
 * operations that the API accepts give at most about 1200; a longer payload
 * can only come from rows written around the API, and is not sent.
 */
#define IDEM_NOTIFY_MAX			7000

/*
 * lock_timeout of a sweep or flag batch, in milliseconds, unless the
 * session's is shorter.  The batch takes its own locks without waiting;
 * this bounds the waits of what runs inside its writes (the owner's
 * triggers and constraints): the record is then skipped with a WARNING.
 */
#define IDEM_BATCH_LOCK_TIMEOUT_MS	1000

/*
 * Say, once per pass, that the sweep reads the whole table: no valid index
 * on (expires_at) exists; unusable is one that is not valid (a failed
 * CREATE INDEX CONCURRENTLY), or InvalidOid.
 */
static void
WarnSlowSweep(PassState *ps, Oid unusable)
{
	char	   *keys = quote_qualified_identifier(get_namespace_name(get_rel_namespace(maint_catalog.keys_relid)),
												  get_rel_name(maint_catalog.keys_relid));

	if (ps->warned_sweep)
		return;
	ps->warned_sweep = true;
	if (OidIsValid(unusable))
		ereport(WARNING,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("index \"%s\" is not valid", get_rel_name(unusable)),
				 errdetail("Until it is rebuilt, the sweep of %s reads the whole table.", keys),
				 errhint("Rebuild it with REINDEX INDEX CONCURRENTLY %s.",
						 quote_qualified_identifier(get_namespace_name(get_rel_namespace(unusable)),
													get_rel_name(unusable)))));
	else
		ereport(WARNING,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("index \"idem_keys_expires_at_idx\" of extension \"idempotency\" does not exist"),
				 errdetail("Until it does, the sweep of %s reads the whole table.", keys),
				 errhint("Create it again with CREATE INDEX CONCURRENTLY idem_keys_expires_at_idx ON %s (expires_at).",
						 keys)));
}

/* Can the index be scanned: built, valid, and not being dropped? */
static bool
IndexUsable(Form_pg_index index)
{
	return index->indisvalid && index->indisready && index->indislive;
}

/* Is the index predicate exactly status = 'processing'? */
static bool
PredicateIsProcessing(List *pred, AttrNumber status_attnum)
{
	OpExpr	   *op;
	Var		   *var;
	Const	   *con;

	if (list_length(pred) != 1 || !IsA(linitial(pred), OpExpr))
		return false;
	op = linitial_node(OpExpr, pred);
	if (op->opno != TextEqualOperator || list_length(op->args) != 2 ||
		!IsA(linitial(op->args), Var) || !IsA(lsecond(op->args), Const))
		return false;
	var = linitial_node(Var, op->args);
	con = lsecond_node(Const, op->args);
	return var->varno == 1 && var->varattno == status_attnum &&
		con->consttype == TEXTOID && !con->constisnull &&
		strcmp(TextDatumGetCString(con->constvalue), "processing") == 0;
}

/*
 * The index of idem_keys that serves stuck detection, found by its
 * definition whatever its name (the extension creates it as
 * idem_keys_processing_idx): a valid, ready B-tree whose first column is
 * created_at, in the default order, with the predicate status =
 * 'processing'.  Every processing record has an entry there and no other
 * record does, so flagging reads only processing records.  InvalidOid
 * when there is none: then the table is read whole, as before the index
 * existed (whoever drops it trades that for cheaper reservations).  An
 * index of that definition that is not valid (a failed CREATE INDEX
 * CONCURRENTLY) lacks entries: it is never used, and named in *unusable.
 */
static Oid
ProcessingIndex(IdemTable *table, Oid *unusable)
{
	static Oid	timestamptz_family = InvalidOid;
	List	   *indexes = RelationGetIndexList(table->rel);
	ListCell   *lc;
	Oid			found = InvalidOid;

	*unusable = InvalidOid;
	if (!OidIsValid(timestamptz_family))
		timestamptz_family =
			get_opclass_family(GetDefaultOpClass(TIMESTAMPTZOID, BTREE_AM_OID));

	foreach(lc, indexes)
	{
		Relation	index = index_open(lfirst_oid(lc), AccessShareLock);
		bool		serves;

		serves = index->rd_rel->relam == BTREE_AM_OID &&
			index->rd_index->indkey.values[0] == table->attnum[COL_CREATED_AT] &&
			index->rd_opfamily[0] == timestamptz_family &&
			PredicateIsProcessing(RelationGetIndexPredicate(index),
								  table->attnum[COL_STATUS]);
		if (serves && !IndexUsable(index->rd_index))
		{
			*unusable = lfirst_oid(lc);
			serves = false;
		}
		index_close(index, AccessShareLock);
		if (serves)
		{
			found = lfirst_oid(lc);
			break;
		}
	}
	list_free(indexes);
	return found;
}

/* Is the index indexid a btree, whose strategies the sweep's scan keys use? */
static bool
IndexIsBtree(Oid indexid)
{
	HeapTuple	tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(indexid));
	bool		btree;

	if (!HeapTupleIsValid(tuple))
		return false;
	btree = ((Form_pg_class) GETSTRUCT(tuple))->relam == BTREE_AM_OID;
	ReleaseSysCache(tuple);
	return btree;
}

/*
 * The index on (expires_at) of the relation maintained: idem_keys_expires_at_idx
 * or, on a shard, Citus's copy of it, which has another name.  Only a valid,
 * ready one: a failed CREATE INDEX CONCURRENTLY leaves one that lacks
 * entries, named in *unusable.  InvalidOid when none is: the sweep then
 * reads the whole table.
 */
Oid
IdemExpiryIndex(Relation rel, AttrNumber expires_at, Oid *unusable)
{
	List	   *indexes = RelationGetIndexList(rel);
	ListCell   *lc;
	Oid			result = InvalidOid;

	*unusable = InvalidOid;
	foreach(lc, indexes)
	{
		HeapTuple	tuple = SearchSysCache1(INDEXRELID, ObjectIdGetDatum(lfirst_oid(lc)));
		Form_pg_index index;

		if (!HeapTupleIsValid(tuple))
			continue;
		index = (Form_pg_index) GETSTRUCT(tuple);
		if (index->indnatts == 1 && index->indkey.values[0] == expires_at &&
			heap_attisnull(tuple, Anum_pg_index_indpred, NULL) &&
			heap_attisnull(tuple, Anum_pg_index_indexprs, NULL) &&
			IndexIsBtree(index->indexrelid))
		{
			if (IndexUsable(index))
				result = index->indexrelid;
			else
				*unusable = index->indexrelid;
		}
		ReleaseSysCache(tuple);
		if (OidIsValid(result))
			break;
	}
	list_free(indexes);
	return result;
}

/*
 * Per-operation counts of a batch, handed to idem_stats in one call per
 * operation.  Batches hold few operations; when more than fit, the counts
 * so far are handed over and the table starts again.
 */
#define OP_COUNTS_MAX	16

typedef struct OpCounts
{
	int			n;
	text	   *operation[OP_COUNTS_MAX];	/* copies */
	int64		count[OP_COUNTS_MAX];
} OpCounts;

/* Hand the counts to idem_stats and empty the table */
static void
OpCountsFlush(OpCounts *oc, IdemCounter counter)
{
	int			i;

	for (i = 0; i < oc->n; i++)
	{
		IdemStatsCount(VARDATA_ANY(oc->operation[i]),
					   VARSIZE_ANY_EXHDR(oc->operation[i]), counter,
					   oc->count[i]);
		pfree(oc->operation[i]);
	}
	oc->n = 0;
}

/* Count one record of an operation */
static void
OpCountsAdd(OpCounts *oc, text *operation, IdemCounter counter)
{
	int			i;

	for (i = oc->n - 1; i >= 0; i--)
	{
		if (IdemVarlenaEqual(oc->operation[i], operation))
		{
			oc->count[i]++;
			return;
		}
	}
	if (oc->n == OP_COUNTS_MAX)
		OpCountsFlush(oc, counter);
	oc->operation[oc->n] = DatumGetTextPCopy(PointerGetDatum(operation));
	oc->count[oc->n] = 1;
	oc->n++;
}

/*
 * Note the record a batch is about to write, so that an error its write
 * raises can name it (RunBatch).  The key is copied: after the rollback,
 * the row it was read from is gone with the batch's buffers.
 */
static void
BeginRecord(PassState *ps, IdemTable *table, TupleTableSlot *slot)
{
	MemoryContext oldcxt;

	MemoryContextReset(ps->reccxt);
	oldcxt = MemoryContextSwitchTo(ps->reccxt);
	ps->rec_tid = slot->tts_tid;
	ps->rec_scope = DatumGetTextPCopy(SlotColumn(table, slot, COL_SCOPE));
	ps->rec_operation = DatumGetTextPCopy(SlotColumn(table, slot, COL_OPERATION));
	ps->rec_key = DatumGetTextPCopy(SlotColumn(table, slot, COL_KEY));
	MemoryContextSwitchTo(oldcxt);
	ps->rec_set = true;
}

/* Did this record's write fail earlier in the pass?  Then leave it be */
static bool
RecordFailed(PassState *ps, ItemPointer tid)
{
	ListCell   *lc;

	foreach(lc, ps->bad)
		if (ItemPointerEquals((ItemPointer) lfirst(lc), tid))
			return true;
	return false;
}

/*
 * What a batch reads and writes: the relation maintained, its writer, and
 * a scan of its candidates, through an index or, without a usable one,
 * the whole table, with the latest snapshot
 */
typedef struct BatchScan
{
	IdemTable	table;
	IdemWriter	w;
	Snapshot	snapshot;
	TupleTableSlot *slot;		/* the candidate just read */
	Relation	index;
	IndexScanDesc iscan;		/* NULL: tscan reads the table */
	TableScanDesc tscan;
} BatchScan;

/*
 * Open the relation maintained for writes of the kind mode; false when it
 * is gone (a shard moved away).  Then BatchScanStart.
 */
static bool
BatchScanOpen(BatchScan *bs, AclMode mode, const char *function)
{
	if (!IdemRecordsTryOpenRelation(maint_catalog.keys_relid, RowExclusiveLock,
									&bs->table))
		return false;
	IdemRecordsCheckReadable(&bs->table);
	IdemRecordsWriterBegin(&bs->table, mode, function, &bs->w);
	bs->snapshot = RegisterSnapshot(GetLatestSnapshot());
	bs->slot = table_slot_create(bs->table.rel, NULL);
	bs->index = NULL;
	bs->iscan = NULL;
	bs->tscan = NULL;
	return true;
}

/* Scan indexid with the given keys, or the table when InvalidOid */
static void
BatchScanStart(BatchScan *bs, Oid indexid, ScanKey skey, int nkeys)
{
	if (OidIsValid(indexid))
	{
		bs->index = index_open(indexid, AccessShareLock);
		bs->iscan = IdemIndexBeginScan(bs->table.rel, bs->index, bs->snapshot,
									   nkeys, 0);
		index_rescan(bs->iscan, skey, nkeys, NULL, 0);
	}
	else
		bs->tscan = IdemTableBeginScan(bs->table.rel, bs->snapshot, 0, NULL);
}

/* The next candidate into bs->slot, all its attributes deformed; false at the end */
static bool
BatchScanNext(BatchScan *bs)
{
	if (!(bs->iscan != NULL ?
		  index_getnext_slot(bs->iscan, ForwardScanDirection, bs->slot) :
		  table_scan_getnextslot(bs->tscan, ForwardScanDirection, bs->slot)))
		return false;
	slot_getallattrs(bs->slot);
	return true;
}

/* End the scan and the writes (firing the AFTER triggers left) */
static void
BatchScanEnd(BatchScan *bs)
{
	if (bs->iscan != NULL)
	{
		index_endscan(bs->iscan);
		index_close(bs->index, AccessShareLock);
	}
	else
		table_endscan(bs->tscan);
	ExecDropSingleTupleTableSlot(bs->slot);
	UnregisterSnapshot(bs->snapshot);
	IdemRecordsWriterEnd(&bs->w);
	IdemRecordsClose(&bs->table);
}

/*
 * Delete up to batch_size expired completed records, those with expires_at
 * in [*lower, now], found through the expires_at index with the latest
 * snapshot and deleted through records.c's executor writer.  Each is first
 * locked without waiting: one that another transaction is changing or
 * locking, or has changed since the snapshot (a renewal by idem_reserve),
 * is skipped, as FOR UPDATE SKIP LOCKED would.  *lower moves to the last
 * expires_at seen, so the next batch resumes there instead of walking again
 * over the index entries of deleted rows.  Without a valid index on
 * expires_at, the table is read whole (WarnSlowSweep).  Returns the number
 * deleted and counts them per operation in idem_stats.
 */
int64
IdemSweepBatch(PassState *ps, int batch_size, TimestampTz now, TimestampTz *lower)
{
	MaintCatalog *cat = &maint_catalog;
	BatchScan	bs;
	IdemTable  *table = &bs.table;
	ScanKeyData skey[2];
	int			nkeys = 0;
	OpCounts	oc;
	int64		deleted = 0;

	if (!BatchScanOpen(&bs, ACL_DELETE, "idem_sweep()"))
		return 0;
	ScanKeyInit(&skey[nkeys++], 1, BTLessEqualStrategyNumber,
				F_TIMESTAMPTZ_LE, TimestampTzGetDatum(now));
	if (*lower != DT_NOBEGIN)
		ScanKeyInit(&skey[nkeys++], 1, BTGreaterEqualStrategyNumber,
					F_TIMESTAMPTZ_GE, TimestampTzGetDatum(*lower));
	if (!OidIsValid(cat->expires_indexid))
		WarnSlowSweep(ps, cat->expires_unusable);
	BatchScanStart(&bs, cat->expires_indexid, skey, nkeys);
	oc.n = 0;

	while (deleted < batch_size && BatchScanNext(&bs))
	{
		TupleTableSlot *slot = bs.slot;
		TimestampTz expires_at;

		ps->rec_set = false;
		CHECK_FOR_INTERRUPTS();
		expires_at = DatumGetTimestampTz(IdemRecordsRequired(table, slot, COL_EXPIRES_AT));
		if (bs.iscan != NULL && expires_at > *lower)
			*lower = expires_at;

		/* processing and stuck records never expire */
		if (expires_at > now ||
			IdemRecordsStatus(DatumGetTextPP(IdemRecordsRequired(table, slot, COL_STATUS))) != STATUS_COMPLETED ||
			RecordFailed(ps, &slot->tts_tid))
			continue;

		/* being changed or locked, or changed: not ours now */
		BeginRecord(ps, table, slot);
		if (IdemRecordsLock(&bs.w, &slot->tts_tid, LockTupleExclusive, LockWaitSkip) != TM_Ok)
			continue;
		/* a BEFORE DELETE trigger may keep it */
		if (!IdemRecordsDelete(&bs.w, false))
			continue;
		IdemRecordsFireAfterTriggers(&bs.w);
		ps->rec_set = false;

		OpCountsAdd(&oc, DatumGetTextPP(SlotColumn(table, slot, COL_OPERATION)),
					IDEM_STAT_EXPIRED);
		deleted++;
	}
	ps->rec_set = false;
	BatchScanEnd(&bs);

	OpCountsFlush(&oc, IDEM_STAT_EXPIRED);
	return deleted;
}

/* Queue NOTIFY idem_stuck for one flagged record */
static void
NotifyStuck(StringInfo buf, text *scope, text *operation, text *key)
{
	resetStringInfo(buf);
	appendStringInfoString(buf, "{\"scope\":");
	escape_json(buf, text_to_cstring(scope));
	appendStringInfoString(buf, ",\"operation\":");
	escape_json(buf, text_to_cstring(operation));
	appendStringInfoString(buf, ",\"key\":");
	escape_json(buf, text_to_cstring(key));
	appendStringInfoChar(buf, '}');

	if (buf->len < IDEM_NOTIFY_MAX)
		Async_Notify(IDEM_STUCK_CHANNEL, buf->data);
	else
		elog(DEBUG1, "idempotency: NOTIFY payload for a stuck record is too long and was not sent");
}

/*
 * Flag one batch of processing records last updated at or before cutoff
 * as stuck, with a NOTIFY each (sent when the transaction commits).  The
 * processing records are read through ProcessingIndex, in created_at order
 * from *lower on, with the latest snapshot: the completed and stuck
 * records, however many, are never read (without that index, the whole
 * table is).  Each candidate is locked without waiting, then updated
 * through records.c's executor writer without waiting for its key lock:
 * one that another transaction is writing, locking or reserving
 * (idem_complete, idem_checkpoint, idem_release or idem_reserve under way)
 * is left for the next pass.  *lower moves to the last created_at seen, so
 * the next batch resumes there.  Returns the number flagged and counts
 * them per operation in idem_stats.
 */
int64
IdemFlagBatch(PassState *ps, int batch_size, TimestampTz cutoff, TimestampTz *lower)
{
	BatchScan	bs;
	IdemTable  *table = &bs.table;
	Oid			indexid;
	Oid			unusable;
	ScanKeyData skey[1];
	int			nkeys = 0;
	StringInfoData buf;
	OpCounts	oc;
	int64		flagged = 0;

	if (!BatchScanOpen(&bs, ACL_UPDATE, "idem_flag_stuck()"))
		return 0;
	indexid = ProcessingIndex(table, &unusable);
	if (OidIsValid(indexid) && *lower != DT_NOBEGIN)
		ScanKeyInit(&skey[nkeys++], 1, BTGreaterEqualStrategyNumber,
					F_TIMESTAMPTZ_GE, TimestampTzGetDatum(*lower));
	if (!OidIsValid(indexid) && OidIsValid(unusable) && !ps->warned_flag)
	{
		ps->warned_flag = true;
		ereport(WARNING,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("index \"%s\" is not valid", get_rel_name(unusable)),
				 errdetail("Until it is rebuilt, stuck detection reads the whole table."),
				 errhint("Rebuild it with REINDEX INDEX CONCURRENTLY %s.",
						 quote_qualified_identifier(get_namespace_name(get_rel_namespace(unusable)),
													get_rel_name(unusable)))));
	}
	BatchScanStart(&bs, indexid, skey, nkeys);
	initStringInfo(&buf);
	oc.n = 0;

	while (flagged < batch_size && BatchScanNext(&bs))
	{
		TupleTableSlot *slot = bs.slot;
		TupleTableSlot *locked = bs.w.locked;
		IdemRow		row;
		TimestampTz created_at;
		bool		busy;

		ps->rec_set = false;
		CHECK_FOR_INTERRUPTS();
		created_at = DatumGetTimestampTz(IdemRecordsRequired(table, slot, COL_CREATED_AT));
		if (bs.iscan != NULL && created_at > *lower)
			*lower = created_at;
		/* a heartbeat of -infinity is before any cutoff */
		if (IdemRecordsStatus(DatumGetTextPP(IdemRecordsRequired(table, slot, COL_STATUS))) != STATUS_PROCESSING ||
			DatumGetTimestampTz(IdemRecordsRequired(table, slot, COL_UPDATED_AT)) > cutoff ||
			RecordFailed(ps, &slot->tts_tid))
			continue;

		/* being written, locked or reserved, or changed: for the next pass */
		BeginRecord(ps, table, slot);
		if (IdemRecordsLock(&bs.w, &slot->tts_tid, LockTupleNoKeyExclusive, LockWaitSkip) != TM_Ok)
			continue;
		IdemRowInit(&row);
		IdemRowSet(&row, COL_STATUS, CStringGetTextDatum("stuck"), false);
		/* a BEFORE UPDATE trigger may keep it processing */
		if (!IdemRecordsTryUpdate(&bs.w, &row, &busy))
			continue;
		IdemRecordsFireAfterTriggers(&bs.w);
		ps->rec_set = false;

		NotifyStuck(&buf, DatumGetTextPP(SlotColumn(table, locked, COL_SCOPE)),
					DatumGetTextPP(SlotColumn(table, locked, COL_OPERATION)),
					DatumGetTextPP(SlotColumn(table, locked, COL_KEY)));
		OpCountsAdd(&oc, DatumGetTextPP(SlotColumn(table, locked, COL_OPERATION)),
					IDEM_STAT_FLAGGED_STUCK);
		flagged++;
	}
	ps->rec_set = false;
	BatchScanEnd(&bs);

	OpCountsFlush(&oc, IDEM_STAT_FLAGGED_STUCK);
	return flagged;
}

/*
 * Call fn(arg) in a subtransaction: NULL when it returned, else the error
 * it raised, copied into the current memory context once the
 * subtransaction is rolled back.  Not inlined, so that no local of a
 * caller lives across the PG_TRY (-Wclobbered).
 */
pg_noinline ErrorData *
IdemCallInSubtransaction(void (*fn) (void *arg), void *arg)
{
	MemoryContext cxt = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	ErrorData  *volatile edata = NULL;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(cxt);
	PG_TRY();
	{
		fn(arg);
		ReleaseCurrentSubTransaction();
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
	}
	PG_END_TRY();
	MemoryContextSwitchTo(cxt);
	CurrentResourceOwner = owner;
	return edata;
}

/* One call of a batch function, for CallInSubtransaction */
typedef struct BatchCall
{
	PassState  *ps;
	BatchFunction batch;
	int			batch_size;
	TimestampTz t;
	TimestampTz *lower;
	int64		n;				/* what it returned */
} BatchCall;

/* Run a batch with lock_timeout at most IDEM_BATCH_LOCK_TIMEOUT_MS */
static void
BatchCallRun(void *arg)
{
	BatchCall  *c = (BatchCall *) arg;
	int			nestlevel = NewGUCNestLevel();

	if (LockTimeout == 0 || LockTimeout > IDEM_BATCH_LOCK_TIMEOUT_MS)
		(void) set_config_option("lock_timeout",
								 CppAsString2(IDEM_BATCH_LOCK_TIMEOUT_MS),
								 PGC_USERSET, PGC_S_SESSION,
								 GUC_ACTION_SAVE, true, 0, false);
	c->n = c->batch(c->ps, c->batch_size, c->t, c->lower);
	AtEOXact_GUC(false, nestlevel);
}

/*
 * Run a batch so that one record whose write fails (a trigger or CHECK
 * constraint of the owner refuses it, anything its write raises) never
 * stops the rest: the batch runs in a subtransaction, and when a record's
 * write raises, the batch is rolled back, the record reported with a
 * WARNING naming its key, counted, and left alone for the rest of the
 * pass, and the batch runs again without it.  An error outside a record's
 * write, and a cancel, end the unit as before.
 */
int64
IdemRunBatch(PassState *ps, BatchFunction batch, int batch_size,
		 TimestampTz t, TimestampTz *lower)
{
	for (;;)
	{
		BatchCall	call = {ps, batch, batch_size, t, lower, 0};
		TimestampTz from = *lower;
		ErrorData  *edata;
		MemoryContext oldcxt;
		ItemPointer tid;

		ps->rec_set = false;
		edata = IdemCallInSubtransaction(BatchCallRun, &call);
		if (edata == NULL)
			return call.n;
		if (!ps->rec_set || edata->sqlerrcode == ERRCODE_QUERY_CANCELED)
			ReThrowError(edata);

		ereport(WARNING,
				(errcode(edata->sqlerrcode),
				 batch == IdemFlagBatch ?
				 errmsg("could not flag idempotency key \"%s\" as stuck",
						text_to_cstring(ps->rec_key)) :
				 errmsg("could not delete expired idempotency key \"%s\"",
						text_to_cstring(ps->rec_key)),
				 errdetail("Operation \"%s\", scope \"%s\". The write raised: %s",
						   text_to_cstring(ps->rec_operation),
						   text_to_cstring(ps->rec_scope), edata->message),
				 errhint("The record is left as it is; the next maintenance pass tries again."),
				 edata->context ? errcontext_msg("%s", edata->context) : 0));
		FreeErrorData(edata);
		ps->counts->write_errors++;

		oldcxt = MemoryContextSwitchTo(ps->passcxt);
		tid = palloc(sizeof(ItemPointerData));
		ItemPointerCopy(&ps->rec_tid, tid);
		ps->bad = lappend(ps->bad, tid);
		MemoryContextSwitchTo(oldcxt);
		ps->rec_set = false;
		*lower = from;
	}
}
