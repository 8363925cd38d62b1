/*-------------------------------------------------------------------------
 *
 * records.c
 *	  The one owner of table idem_keys: finding and locking it, reading a
 *	  record through the primary key, and writing records through the
 *	  executor.  keys.c, patterns.c (through keys.c), held.c and
 *	  maintenance.c all reach the table through these routines; its layout
 *	  is checked by layout.c, once per relcache entry.
 *
 * Finding the table: idem_keys is looked up by name in the extension's
 * schema, locked by OID, and looked up again: a DROP EXTENSION that
 * committed while we waited for the lock leaves a clean ERROR, never an
 * attempt to open a relation that is gone.  Where a scope's records live
 * is said by IdemRecordsResolve alone: idem_keys, or with Citus the local
 * shard that holds the scope (citus.c), whose writers first tell Citus
 * that the transaction writes on this node (IdemCitusLocalWrite).
 *
 * The writes: ExecSimpleRelationInsert/Update/Delete with a ResultRelInfo
 * and an EState of their own, as the logical apply worker writes, so CHECK
 * and NOT NULL constraints, triggers and every index hold as for a
 * statement (CHECKs and index predicates through ExprStates built in that
 * EState from layout.c's planned trees).  A BEFORE ROW trigger that skips
 * a write or moves the record to another key is an ERROR.  An update or a
 * delete first locks the row version it read (IdemRecordsLock): so no
 * write meets a newer version than the one its caller checked, and none
 * raises a serialization failure at REPEATABLE READ.
 *
 * Locks: the table's (AccessShareLock to read, RowExclusiveLock to write,
 * to the end of the transaction), its indexes' as the executor takes them,
 * and the row lock of IdemRecordsLock.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/multixact.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/dependency.h"
#include "catalog/indexing.h"
#include "catalog/namespace.h"
#include "catalog/pg_am.h"
#include "catalog/pg_index.h"
#include "catalog/pg_operator.h"
#include "catalog/pg_type.h"
#include "commands/defrem.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "common/hashfn.h"
#include "commands/trigger.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "optimizer/optimizer.h"
#include "parser/parse_relation.h"
#include "storage/lmgr.h"
#include "storage/procarray.h"
#include "storage/lock.h"
#include "tcop/utility.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rls.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "records.h"

#ifndef IDEM_VERSION
#error "IDEM_VERSION must be defined (the Makefile passes the control file's version)"
#endif

static void OpenLocked(Oid relid, LOCKMODE lockmode, IdemTable *table);

/* Raise the error for a table of the extension that is not there (any more) */
void
IdemReportMissingTable(const char *relname)
{
	ereport(ERROR,
			(errcode(ERRCODE_UNDEFINED_TABLE),
			 errmsg("table \"%s\" of extension \"%s\" does not exist",
					relname, IDEM_EXTENSION_NAME),
			 errdetail("The extension may have been dropped while this call ran.")));
}

/*
 * The one answer to "which relation holds the records of scope": the OID
 * of idem_keys of the extension in schema nspid, or, with Citus, of the
 * local shard of idem_keys that holds scope (see the file header); locked
 * with lockmode until the end of the transaction.  InvalidOid when there is
 * no idem_keys, or it was dropped while we waited for its lock.  A NULL
 * scope asks for idem_keys itself, for the maintenance of its records.
 */
Oid
IdemRecordsResolve(Oid nspid, text *scope, LOCKMODE lockmode)
{
	Oid			relid = get_relname_relid("idem_keys", nspid);
	Relation	rel;
	Oid			shard;

	if (!OidIsValid(relid))
		return InvalidOid;
	LockRelationOid(relid, lockmode);
	if (get_relname_relid("idem_keys", nspid) != relid)
	{
		UnlockRelationOid(relid, lockmode);
		return InvalidOid;
	}
	if (scope == NULL || !IdemCitusInstalled())
		return relid;

	rel = table_open(relid, NoLock);
	if (!IdemCitusIsDistributed(rel))
		IdemCitusReportUndistributed(rel);
	shard = IdemCitusLocalShard(rel, scope, lockmode);
	table_close(rel, NoLock);
	return shard;
}

/*
 * The shards of idem_keys of schema nspid that this node holds, for its
 * maintenance, into *relids (NIL on a coordinator without shards): true
 * when Citus distributes idem_keys, false when the records are in
 * idem_keys itself (or there is none).
 */
bool
IdemRecordsLocalShards(Oid nspid, List **relids)
{
	Oid			relid = get_relname_relid("idem_keys", nspid);
	Relation	rel;
	bool		distributed;

	*relids = NIL;
	if (!OidIsValid(relid) || !IdemCitusInstalled())
		return false;
	rel = table_open(relid, AccessShareLock);
	distributed = IdemCitusIsDistributed(rel);
	table_close(rel, NoLock);
	if (!distributed)
		return false;
	*relids = IdemCitusLocalShards(relid);
	return true;
}

/*
 * Open the relation that holds the records of scope (IdemRecordsResolve) with
 * lockmode, held until the end of the transaction, and resolve its layout;
 * false when there is no idem_keys, or it was dropped while we waited for
 * its lock (see the file header).  A table whose layout is wrong raises an
 * ERROR.
 */
bool
IdemRecordsTryOpen(Oid nspid, text *scope, LOCKMODE lockmode, IdemTable *table)
{
	Oid			relid = IdemRecordsResolve(nspid, scope, lockmode);

	if (!OidIsValid(relid))
		return false;
	OpenLocked(relid, lockmode, table);
	return true;
}

/*
 * Open relid, one of IdemRecordsLocalShards, as IdemRecordsTryOpen does; false
 * when it was dropped (a shard moved away meanwhile).
 */
bool
IdemRecordsTryOpenRelation(Oid relid, LOCKMODE lockmode, IdemTable *table)
{
	LockRelationOid(relid, lockmode);
	if (!SearchSysCacheExists1(RELOID, ObjectIdGetDatum(relid)))
	{
		UnlockRelationOid(relid, lockmode);
		return false;
	}
	OpenLocked(relid, lockmode, table);
	return true;
}

/* Open relid, locked already with lockmode, and resolve its layout */
static void
OpenLocked(Oid relid, LOCKMODE lockmode, IdemTable *table)
{
	table->rel = table_open(relid, NoLock);
	table->lockmode = lockmode;
	IdemLayoutOf(table);
}

/* IdemRecordsTryOpen, with an ERROR when the table is not there */
void
IdemRecordsOpen(Oid nspid, text *scope, LOCKMODE lockmode, IdemTable *table)
{
	if (!IdemRecordsTryOpen(nspid, scope, lockmode, table))
		IdemReportMissingTable("idem_keys");
}

/* Close idem_keys; its lock stays until the end of the transaction */
void
IdemRecordsClose(IdemTable *table)
{
	table_close(table->rel, NoLock);
	table->rel = NULL;
}

/* Check a privilege on idem_keys as the equivalent statement would */
static void
CheckPrivilege(IdemTable *table, AclMode mode)
{
	AclResult	aclresult;

	aclresult = pg_class_aclcheck(RelationGetRelid(table->rel), GetUserId(), mode);
	if (aclresult != ACLCHECK_OK)
		aclcheck_error(aclresult, OBJECT_TABLE, RelationGetRelationName(table->rel));
}

/*
 * Check what a write would check first (see IdemRecordsWriterBegin) without
 * writing: for a reservation that writes later (held.c)
 */
void
IdemRecordsCheckWritable(IdemTable *table, AclMode mode, const char *function)
{
	PreventCommandIfReadOnly(function);
	CheckPrivilege(table, mode);
	if (table->shard)
		IdemCitusLocalWrite(table->rel);
}

/* A whole row of table, as a composite datum, with the columns set in row */
Datum
IdemRecordsFormRow(IdemTable *table, IdemRow *row)
{
	TupleDesc	desc = RelationGetDescr(table->rel);
	Datum	   *values = palloc0(desc->natts * sizeof(Datum));
	bool	   *isnull = palloc(desc->natts * sizeof(bool));
	int			c;

	memset(isnull, true, desc->natts * sizeof(bool));
	for (c = 0; c < IDEM_NUM_COLUMNS; c++)
	{
		/* (a column the previous release's catalog lacks has none) */
		if (!row->set[c] || table->attnum[c] == 0)
			continue;
		values[table->attnum[c] - 1] = row->values[c];
		isnull[table->attnum[c] - 1] = row->isnull[c];
	}
	return HeapTupleGetDatum(heap_form_tuple(desc, values, isnull));
}

/* Refuse to read past privileges or row-level security */
void
IdemRecordsCheckReadable(IdemTable *table)
{
	CheckPrivilege(table, ACL_SELECT);
	if (check_enable_rls(RelationGetRelid(table->rel), InvalidOid, false) == RLS_ENABLED)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("row-level security on \"idem_keys\" is not supported"),
				 errhint("Separate tenants with the \"scope\" argument instead.")));
}

/* Map the status column to its enum */
IdemStatus
IdemRecordsStatus(text *status)
{
	char	   *s = VARDATA_ANY(status);
	int			len = VARSIZE_ANY_EXHDR(status);

	if (len == 10 && memcmp(s, "processing", 10) == 0)
		return STATUS_PROCESSING;
	if (len == 9 && memcmp(s, "completed", 9) == 0)
		return STATUS_COMPLETED;
	if (len == 5 && memcmp(s, "stuck", 5) == 0)
		return STATUS_STUCK;
	ereport(ERROR,
			(errcode(ERRCODE_CHECK_VIOLATION),
			 errmsg("idempotency record has invalid status \"%.*s\"", len, s),
			 errdetail("A status is \"processing\", \"completed\" or \"stuck\"."),
			 errhint("Restore constraint idem_keys_status_check and correct the record.")));
	return STATUS_PROCESSING;	/* keep compiler quiet */
}

/*
 * The value of column col of the record in slot (all attributes deformed),
 * one the layout requires NOT NULL.  A null there all the same (a NOT NULL
 * constraint not validated, a catalog changed by hand) is an ERROR naming
 * the record, never a null pointer read as a value.
 */
Datum
IdemRecordsRequired(IdemTable *table, TupleTableSlot *slot, IdemColumn col)
{
	if (unlikely(SlotColumnIsNull(table, slot, col)))
		ereport(ERROR,
				(errcode(ERRCODE_NOT_NULL_VIOLATION),
				 errmsg("idempotency record \"%s\" has a null \"%s\"",
						TextDatumGetCString(SlotColumn(table, slot, COL_KEY)),
						IdemColumnName(col)),
				 errdetail("Operation \"%s\", scope \"%s\", table \"%s\".",
						   TextDatumGetCString(SlotColumn(table, slot, COL_OPERATION)),
						   TextDatumGetCString(SlotColumn(table, slot, COL_SCOPE)),
						   RelationGetRelationName(table->rel)),
				 errhint("Give column \"%s\" of that record the value it should have, and keep the column NOT NULL.",
						 IdemColumnName(col))));
	return SlotColumn(table, slot, col);
}

/*
 * Does another open transaction hold a row lock (FOR SHARE, FOR UPDATE, or
 * the lock a writer takes first) on the version in slot?  A dirty snapshot
 * sees through lock-only xmax, so look at the tuple header, as
 * heap_lock_tuple does.  Only a hint: the lock may end right after.
 */
static bool
LockedByOther(TupleTableSlot *slot)
{
	bool		should_free;
	HeapTuple	tuple = ExecFetchSlotHeapTuple(slot, false, &should_free);
	uint16		infomask = tuple->t_data->t_infomask;
	TransactionId xmax = HeapTupleHeaderGetRawXmax(tuple->t_data);
	bool		locked = false;

	if (!(infomask & HEAP_XMAX_INVALID) && HEAP_XMAX_IS_LOCKED_ONLY(infomask))
	{
		if (infomask & HEAP_XMAX_IS_MULTI)
			locked = MultiXactIdIsRunning(xmax, true);
		else
			locked = !TransactionIdIsCurrentTransactionId(xmax) &&
				TransactionIdIsInProgress(xmax);
	}
	if (should_free)
		heap_freetuple(tuple);
	return locked;
}

/*
 * Copy the row in slot, read with snapshot, into rec in the current memory
 * context.  With a dirty snapshot, the row's writer (an open transaction
 * inserting, updating or deleting it) is what the snapshot reported.
 */
void
IdemRecordsFromSlot(IdemTable *table, TupleTableSlot *slot, Snapshot snapshot,
					IdemRecord *rec)
{
	Datum		d;
	bool		isnull;

	slot_getallattrs(slot);
	memset(rec, 0, sizeof(*rec));
	rec->status = IdemRecordsStatus(DatumGetTextPP(IdemRecordsRequired(table, slot, COL_STATUS)));
	if (!SlotColumnIsNull(table, slot, COL_REQUEST_HASH))
		rec->request_hash = DatumGetByteaPCopy(SlotColumn(table, slot, COL_REQUEST_HASH));
	if (!SlotColumnIsNull(table, slot, COL_RESPONSE_STATUS))
	{
		rec->has_response_status = true;
		rec->response_status = DatumGetInt32(SlotColumn(table, slot, COL_RESPONSE_STATUS));
	}
	if (!SlotColumnIsNull(table, slot, COL_RESPONSE))
		rec->response = DatumGetJsonbPCopy(SlotColumn(table, slot, COL_RESPONSE));
	if (!SlotColumnIsNull(table, slot, COL_RESOURCE_ID))
		rec->resource_id = DatumGetTextPCopy(SlotColumn(table, slot, COL_RESOURCE_ID));
	if (!SlotColumnIsNull(table, slot, COL_RECOVERY_POINT))
		rec->recovery_point = DatumGetTextPCopy(SlotColumn(table, slot, COL_RECOVERY_POINT));
	rec->created_at = DatumGetTimestampTz(IdemRecordsRequired(table, slot, COL_CREATED_AT));
	rec->updated_at = DatumGetTimestampTz(IdemRecordsRequired(table, slot, COL_UPDATED_AT));
	rec->expires_at = DatumGetTimestampTz(IdemRecordsRequired(table, slot, COL_EXPIRES_AT));
	if (table->attnum[COL_TTL] != 0 && !SlotColumnIsNull(table, slot, COL_TTL))
	{
		rec->ttl = palloc(sizeof(Interval));
		memcpy(rec->ttl, DatumGetIntervalP(SlotColumn(table, slot, COL_TTL)), sizeof(Interval));
	}

	d = slot_getsysattr(slot, MinTransactionIdAttributeNumber, &isnull);
	if (!isnull && TransactionIdIsCurrentTransactionId(DatumGetTransactionId(d)))
		rec->flags |= RECORD_MINE;
	if (snapshot->snapshot_type == SNAPSHOT_DIRTY)
	{
		/* A new row version carries its inserter, an old one its deleter */
		rec->writer_xid = TransactionIdIsValid(snapshot->xmin) ?
			snapshot->xmin : snapshot->xmax;
		if (TransactionIdIsValid(rec->writer_xid))
			rec->flags |= RECORD_BUSY;
		else if (LockedByOther(slot))
			rec->flags |= RECORD_LOCKED;
	}
	rec->tid = slot->tts_tid;
}

/*
 * Read the record of (scope, operation, key) through the primary key with
 * the given snapshot; false when there is none.  With a dirty snapshot this
 * also sees rows of transactions still in progress, as unique checks do.
 * When row_out is given, the whole row is returned there as a composite
 * datum too.
 *
 * An MVCC snapshot taken before another transaction deleted the key's
 * record (a sweep, a release) still sees that version after the current
 * transaction wrote the key again: then two versions are visible, and the
 * current transaction's own is the record.
 */
bool
IdemRecordsFetch(IdemTable *table, Snapshot snapshot, text *scope,
				 text *operation, text *key, IdemRecord *rec, Datum *row_out)
{
	Relation	index;
	IndexScanDesc scan;
	TupleTableSlot *slot;
	ScanKeyData skey[3];
	text	   *args[3] = {scope, operation, key};
	bool		found;
	int			i;

	index = index_open(table->pkey, AccessShareLock);
	for (i = 0; i < 3; i++)
		ScanKeyEntryInitialize(&skey[i], 0, i + 1, BTEqualStrategyNumber,
							   InvalidOid, index->rd_indcollation[i],
							   F_TEXTEQ, PointerGetDatum(args[i]));

	slot = table_slot_create(table->rel, NULL);
	scan = IdemIndexBeginScan(table->rel, index, snapshot, 3, 0);
	index_rescan(scan, skey, 3, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, slot);
	if (found)
	{
		IdemRecordsFromSlot(table, slot, snapshot, rec);
		if (row_out)
			*row_out = ExecFetchSlotHeapTupleDatum(slot);
	}
	while (found && IsMVCCSnapshot(snapshot) && (rec->flags & RECORD_MINE) == 0 &&
		   index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		bool		isnull;
		Datum		xmin = slot_getsysattr(slot, MinTransactionIdAttributeNumber, &isnull);

		if (isnull || !TransactionIdIsCurrentTransactionId(DatumGetTransactionId(xmin)))
			continue;
		IdemRecordsFromSlot(table, slot, snapshot, rec);
		if (row_out)
			*row_out = ExecFetchSlotHeapTupleDatum(slot);
	}
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	/* Its lock stays until the end of the transaction, as the executor's */
	index_close(index, NoLock);
	return found;
}

/*
 * Prepare to write idem_keys after checking what the equivalent statement
 * would: not in a read-only transaction (nor on a standby), and each
 * privilege in modes.  "function" names the caller in the read-only error.
 * Everything lives in the EState's memory and goes in IdemRecordsWriterEnd.
 */
void
IdemRecordsWriterBegin(IdemTable *table, AclMode modes, const char *function,
					   IdemWriter *w)
{
	Relation	rel = table->rel;
	RangeTblEntry *rte;
	List	   *perminfos = NIL;
	MemoryContext oldcxt;

	PreventCommandIfReadOnly(function);
	if (modes & ACL_INSERT)
		CheckPrivilege(table, ACL_INSERT);
	if (modes & ACL_UPDATE)
		CheckPrivilege(table, ACL_UPDATE);
	if (modes & ACL_DELETE)
		CheckPrivilege(table, ACL_DELETE);
	if (table->shard)
		IdemCitusLocalWrite(rel);
	if (table->lockmode < RowExclusiveLock)
	{
		/* Already locked: the table cannot have gone meanwhile */
		LockRelationOid(RelationGetRelid(rel), RowExclusiveLock);
		table->lockmode = RowExclusiveLock;
	}

	w->table = table;
	w->estate = CreateExecutorState();
	oldcxt = MemoryContextSwitchTo(w->estate->es_query_cxt);

	rte = makeNode(RangeTblEntry);
	rte->rtekind = RTE_RELATION;
	rte->relid = RelationGetRelid(rel);
	rte->relkind = rel->rd_rel->relkind;
	rte->rellockmode = RowExclusiveLock;
	IdemAddPermissionInfo(&perminfos, rte);
	IdemInitRangeTable(w->estate, rte, perminfos);
	(void) perminfos;

	w->rri = makeNode(ResultRelInfo);
	InitResultRelInfo(w->rri, rel, 1, NULL, 0);
	/* So that the AFTER triggers find it, as in the apply worker */
	w->estate->es_opened_result_relations = list_make1(w->rri);
	w->estate->es_output_cid = GetCurrentCommandId(true);
	if (ActiveSnapshotSet())
		w->estate->es_snapshot = GetActiveSnapshot();
	ExecOpenIndices(w->rri, false);
	IdemLayoutRuleStates(w->rri);
	IdemEvalPlanQualInit(&w->epqstate, w->estate);
	w->locked = ExecInitExtraTupleSlot(w->estate, RelationGetDescr(rel),
									   table_slot_callbacks(rel));
	w->row = ExecInitExtraTupleSlot(w->estate, RelationGetDescr(rel),
									&TTSOpsVirtual);
	AfterTriggerBeginQuery();

	MemoryContextSwitchTo(oldcxt);
}

/*
 * Finish the writes: fire the AFTER triggers they queued, release the
 * executor state, and make the changes visible to what follows.
 */
void
IdemRecordsWriterEnd(IdemWriter *w)
{
	EvalPlanQualEnd(&w->epqstate);
	ExecCloseIndices(w->rri);
	AfterTriggerEndQuery(w->estate);
	ExecResetTupleTable(w->estate->es_tupleTable, false);
	FreeExecutorState(w->estate);
	w->estate = NULL;
	CommandCounterIncrement();
}

/*
 * Lock the row version at tid for an update (LockTupleNoKeyExclusive) or a
 * delete (LockTupleExclusive) with the given wait policy, and keep it in
 * w->locked.  TM_Ok: that version is still the current one and now ours to
 * write.  TM_Updated or TM_Deleted: it changed meanwhile, read it again.
 * TM_WouldBlock (LockWaitSkip): another open transaction holds it.  The
 * version is locked itself, never a newer one: so the caller writes only
 * what it checked, and no isolation level turns a change into 40001.
 */
TM_Result
IdemRecordsLock(IdemWriter *w, ItemPointer tid, LockTupleMode mode,
				LockWaitPolicy policy)
{
	TM_FailureData tmfd;
	TM_Result	result;

	result = table_tuple_lock(w->table->rel, tid, w->estate->es_snapshot,
							  w->locked, w->estate->es_output_cid, mode,
							  policy, 0, &tmfd);
	if (result == TM_SelfModified || result == TM_Invisible)
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not serialize access due to concurrent update of an idempotency record"),
				 errhint("Retry the transaction; change idem_keys only through the idem_ functions.")));
	return result;
}

/* Raise the error for a write that a BEFORE trigger on idem_keys skipped */
pg_noreturn static void
ReportSkippedWrite(void)
{
	ereport(ERROR,
			(errcode(ERRCODE_TRIGGERED_ACTION_EXCEPTION),
			 errmsg("a trigger on table \"idem_keys\" skipped a write of an idempotency record"),
			 errdetail("A BEFORE ROW trigger returned NULL, so the record would not say what happened."),
			 errhint("Let BEFORE ROW triggers on idem_keys return the row, or raise an error to refuse it.")));
}

/* The key columns of a record, in the order of the primary key */
static const IdemColumn key_columns[3] = {COL_SCOPE, COL_OPERATION, COL_KEY};

/* Raise the error for a write whose trigger moved the record to another key */
pg_noreturn static void
ReportMovedKey(IdemTable *table, const Datum *key, TupleTableSlot *written)
{
	ereport(ERROR,
			(errcode(ERRCODE_TRIGGERED_DATA_CHANGE_VIOLATION),
			 errmsg("a trigger on table \"%s\" changed the key of an idempotency record",
					RelationGetRelationName(table->rel)),
			 errdetail("The record of key \"%s\" (operation \"%s\", scope \"%s\") would have been written as key \"%s\" (operation \"%s\", scope \"%s\"), where its own key would no longer find it.",
					   TextDatumGetCString(key[2]), TextDatumGetCString(key[1]),
					   TextDatumGetCString(key[0]),
					   TextDatumGetCString(SlotColumn(table, written, COL_KEY)),
					   TextDatumGetCString(SlotColumn(table, written, COL_OPERATION)),
					   TextDatumGetCString(SlotColumn(table, written, COL_SCOPE))),
			 errhint("Let BEFORE ROW triggers on %s leave columns \"scope\", \"operation\" and \"key\" as they are, or raise an error to refuse the write.",
					 IdemQualifiedName(table->rel))));
}

/*
 * A BEFORE ROW trigger may change the row it is given, but a record stays
 * at its key: raise an ERROR, which undoes the write, when the row written
 * into slot has other key columns than key (scope, operation, key).
 */
static void
CheckKeyKept(IdemTable *table, const Datum *key, TupleTableSlot *written)
{
	int			i;

	slot_getallattrs(written);
	for (i = 0; i < lengthof(key_columns); i++)
	{
		/* Never null here: the primary key's NOT NULL was checked */
		Assert(!SlotColumnIsNull(table, written, key_columns[i]));
		if (!datum_image_eq(key[i], SlotColumn(table, written, key_columns[i]),
							false, -1))
			ReportMovedKey(table, key, written);
	}
}

/* Store the given columns of row into slot over what it holds */
static void
StoreRow(IdemTable *table, TupleTableSlot *slot, IdemRow *row)
{
	int			c;

	for (c = 0; c < IDEM_NUM_COLUMNS; c++)
	{
		/* A column the previous release's catalog lacks is not written */
		if (!row->set[c] || table->attnum[c] == 0)
			continue;
		slot->tts_values[table->attnum[c] - 1] = row->values[c];
		slot->tts_isnull[table->attnum[c] - 1] = row->isnull[c];
	}
	ExecStoreVirtualTuple(slot);
	ItemPointerSetInvalid(&slot->tts_tid);
}

/* Fourth field of the key lock's advisory tag: "id" */
#define IDEM_LOCKTAG_SPACE	0x6964

/*
 * The key lock's tag: a 64-bit hash of (scope, operation, key) in the
 * advisory lock space of the database (see keys.c for who takes it).
 */
void
IdemRecordsKeyLockTag(LOCKTAG *tag, text *scope, text *operation, text *key)
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
	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, (uint32) (h >> 32), (uint32) h,
						 IDEM_LOCKTAG_SPACE);
}

/* Insert a record with the columns set in row (the others NULL) */
void
IdemRecordsInsert(IdemWriter *w, IdemRow *row)
{
	TupleTableSlot *slot = w->row;
	int			natts = slot->tts_tupleDescriptor->natts;
	Datum		key[lengthof(key_columns)];
	int			i;

	for (i = 0; i < lengthof(key_columns); i++)
	{
		Assert(row->set[key_columns[i]] && !row->isnull[key_columns[i]]);
		key[i] = row->values[key_columns[i]];
	}
	ExecClearTuple(slot);
	memset(slot->tts_values, 0, natts * sizeof(Datum));
	memset(slot->tts_isnull, true, natts * sizeof(bool));
	StoreRow(w->table, slot, row);
	ExecSimpleRelationInsert(w->rri, w->estate, slot);
	if (!ItemPointerIsValid(&slot->tts_tid))
		ReportSkippedWrite();
	CheckKeyKept(w->table, key, slot);
}

/*
 * Replace the columns set in row in the version IdemRecordsLock locked.  With
 * report_skip false, a BEFORE trigger's skipping the update returns false
 * instead of raising an error.  With wait false, the key lock is not waited
 * for: when a reservation holds it, nothing is written, *busy is set and
 * false returned.
 */
static bool
UpdateLocked(IdemWriter *w, IdemRow *row, bool report_skip, bool wait,
			 bool *busy)
{
	TupleTableSlot *slot = w->row;
	int			natts = slot->tts_tupleDescriptor->natts;
	Datum		key[lengthof(key_columns)];
	LOCKTAG		tag;
	int			i;

	slot_getallattrs(w->locked);
	for (i = 0; i < lengthof(key_columns); i++)
		key[i] = SlotColumn(w->table, w->locked, key_columns[i]);
	ExecClearTuple(slot);
	memcpy(slot->tts_values, w->locked->tts_values, natts * sizeof(Datum));
	memcpy(slot->tts_isnull, w->locked->tts_isnull, natts * sizeof(bool));
	StoreRow(w->table, slot, row);

	/*
	 * Unless the update is HOT, the new version gets a primary-key entry of
	 * its own, and a reservation whose index scan read the key's entries
	 * before it and the old version after this commits would see neither.
	 * Reservations read under the key lock: hold it for the write, so they
	 * see the old version or the new one.  The row is locked already, and
	 * a reservation holds the key lock only while it reads and claims.
	 */
	IdemRecordsKeyLockTag(&tag, DatumGetTextPP(key[0]), DatumGetTextPP(key[1]),
						  DatumGetTextPP(key[2]));
	if (LockAcquire(&tag, ExclusiveLock, false, !wait) == LOCKACQUIRE_NOT_AVAIL)
	{
		*busy = true;
		return false;
	}
	ExecSimpleRelationUpdate(w->rri, w->estate, &w->epqstate, w->locked, slot);
	LockRelease(&tag, ExclusiveLock, false);
	if (!ItemPointerIsValid(&slot->tts_tid))
	{
		if (report_skip)
			ReportSkippedWrite();
		return false;
	}
	CheckKeyKept(w->table, key, slot);
	return true;
}

/* UpdateLocked, waiting for the key lock as long as a reservation holds it */
bool
IdemRecordsUpdate(IdemWriter *w, IdemRow *row, bool report_skip)
{
	bool		busy = false;

	return UpdateLocked(w, row, report_skip, true, &busy);
}

/*
 * UpdateLocked for maintenance, which never waits on an application: false
 * with *busy set when a reservation holds the key lock right now, false
 * with *busy clear when a BEFORE trigger skipped the update.
 */
bool
IdemRecordsTryUpdate(IdemWriter *w, IdemRow *row, bool *busy)
{
	*busy = false;
	return UpdateLocked(w, row, false, false, busy);
}

/*
 * Delete the version IdemRecordsLock locked.  With report_skip false, a BEFORE
 * trigger's skipping the delete returns false instead of raising an error.
 */
bool
IdemRecordsDelete(IdemWriter *w, bool report_skip)
{
	TriggerDesc *trigdesc = w->rri->ri_TrigDesc;

	ExecSimpleRelationDelete(w->rri, w->estate, &w->epqstate, w->locked);

	/* Only a BEFORE trigger can skip it: then the row is still there */
	if (trigdesc != NULL && trigdesc->trig_delete_before_row)
	{
		TupleTableSlot *check = table_slot_create(w->table->rel, NULL);
		bool		kept;

		kept = table_tuple_fetch_row_version(w->table->rel, &w->locked->tts_tid,
											 SnapshotSelf, check);
		ExecDropSingleTupleTableSlot(check);
		if (kept)
		{
			if (report_skip)
				ReportSkippedWrite();
			return false;
		}
	}
	return true;
}

/*
 * Fire now the AFTER ROW triggers that the writes so far queued, rather
 * than in IdemRecordsWriterEnd, so that an error they raise belongs to the
 * record just written (maintenance reports it by key).  Nothing to do for
 * a table without such triggers.
 */
void
IdemRecordsFireAfterTriggers(IdemWriter *w)
{
	TriggerDesc *trigdesc = w->rri->ri_TrigDesc;

	if (trigdesc == NULL ||
		!(trigdesc->trig_update_after_row || trigdesc->trig_delete_after_row))
		return;
	AfterTriggerEndQuery(w->estate);
	AfterTriggerBeginQuery();
}

/* Every column of a new record, with no result yet */
void
IdemRowNewRecord(IdemRow *row, text *scope, text *operation, text *key,
				 bytea *hash, bool completed, TimestampTz created_at,
				 TimestampTz updated_at, TimestampTz expires_at, Interval *ttl)
{
	IdemRowInit(row);
	IdemRowSet(row, COL_SCOPE, PointerGetDatum(scope), false);
	IdemRowSet(row, COL_OPERATION, PointerGetDatum(operation), false);
	IdemRowSet(row, COL_KEY, PointerGetDatum(key), false);
	IdemRowSet(row, COL_REQUEST_HASH, PointerGetDatum(hash), hash == NULL);
	IdemRowSet(row, COL_STATUS,
			   CStringGetTextDatum(completed ? "completed" : "processing"), false);
	IdemRowSet(row, COL_RESPONSE_STATUS, (Datum) 0, true);
	IdemRowSet(row, COL_RESPONSE, (Datum) 0, true);
	IdemRowSet(row, COL_RESOURCE_ID, (Datum) 0, true);
	IdemRowSet(row, COL_RECOVERY_POINT, (Datum) 0, true);
	IdemRowSet(row, COL_CREATED_AT, TimestampTzGetDatum(created_at), false);
	IdemRowSet(row, COL_UPDATED_AT, TimestampTzGetDatum(updated_at), false);
	IdemRowSet(row, COL_EXPIRES_AT, TimestampTzGetDatum(expires_at), false);
	IdemRowSet(row, COL_TTL, IntervalPGetDatum(ttl), false);
}

/* Start a row with no column set */
void
IdemRowInit(IdemRow *row)
{
	memset(row, 0, sizeof(*row));
}

/* Set column col of a row */
void
IdemRowSet(IdemRow *row, IdemColumn col, Datum value, bool isnull)
{
	row->values[col] = value;
	row->isnull[col] = isnull;
	row->set[col] = true;
}

/* when + ttl: the expiry of a record whose ttl counts from when */
TimestampTz
IdemAddTtl(TimestampTz when, Interval *ttl)
{
	return DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
												   TimestampTzGetDatum(when),
												   IntervalPGetDatum(ttl)));
}
