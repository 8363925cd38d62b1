/*-------------------------------------------------------------------------
 *
 * maintenance.c
 *	  Expiry, stuck detection and reconciliation of idempotency records:
 *	  the pass the background worker runs in each database, and the SQL
 *	  functions idem_sweep, idem_flag_stuck, idem_reconcile, idem_maintain
 *	  and idem_set_reconciler.  The worker and the SQL functions run the same
 *	  routines below; only who owns the transactions differs (IdemTxnMode).
 *
 * A pass has three phases, each made of short units of work:
 *	- sweep: delete completed records whose expires_at has passed,
 *	  sweep_batch_size at a time;
 *	- flag: mark processing records whose updated_at is older than
 *	  processing_timeout as stuck, with one NOTIFY idem_stuck each;
 *	- reconcile: call the reconciler registered for the operation of each
 *	  stuck record, as the role that registered it.
 * In worker and procedure mode every unit (a batch, one reconciler call) is
 * its own transaction.  Called from SQL, the units run in the caller's
 * transaction.  Either way a reconciler runs in a subtransaction, so that
 * its error is reported as a WARNING naming the key and the pass goes on.
 * Between units the worker may pause to yield to busy sessions, or end the
 * pass (worker.c).
 *
 * Locking
 * -------
 * No unit waits for a row an application transaction holds, so none can
 * join a deadlock with one over records:
 *	- A sweep batch reads the expires_at index with the latest snapshot; a
 *	  flag batch reads the table with it.  Each locks a candidate row version
 *	  without waiting (IdemRecordsLock, LockWaitSkip) and deletes or flags it
 *	  through records.c's executor writer, as keys.c writes, so the table's
 *	  constraints and triggers hold for both.  A record that another
 *	  transaction is changing or locking, or has changed since the snapshot
 *	  (idem_reserve renewing it), is skipped until the next pass.  The other
 *	  way round, idem_reserve answers in_progress for a record a batch is
 *	  deleting or flagging, and idem_complete, idem_checkpoint and
 *	  idem_release wait for the batch and look again (keys.c).
 * Two waits remain: a unit waits for idem_keys' table lock like any
 * statement (an application's LOCK TABLE or DDL holds it off), and a flag
 * write takes the key lock for the instant of its write (IdemRecordsUpdate),
 * which a reservation holds only while it reads and claims the key.
 * Each unit first opens idem_keys through records.c, which locks it by OID
 * and then checks that it still exists, so a concurrent DROP EXTENSION ends
 * a worker pass quietly instead of failing a query.  A reconciler is called with the
 * record locked FOR UPDATE (skipped when another transaction is writing it)
 * and settles it through idem_complete or idem_release.
 *
 * Rights
 * ------
 * The SQL entry points run as their caller.  The worker connects as the
 * bootstrap superuser but does each unit as the owner of idem_keys, in a
 * security-restricted operation (BecomeTableOwner), so that the table's
 * triggers and constraints get that owner's rights only.  A reconciler
 * runs as its run_as role, with search_path pinned, after the checks of
 * ReconcilerRunnable, which trust nothing written in idem_reconcilers.
 *
 * Durability
 * ----------
 * Sweep batches of the worker and of idem_maintain commit with
 * synchronous_commit off: a crash may forget the last of them, and the next
 * pass deletes those records again.  Flags and reconciler calls commit as
 * configured.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/indexing.h"
#include "catalog/namespace.h"
#include "catalog/pg_am.h"
#include "catalog/pg_class.h"
#include "catalog/pg_index.h"
#include "catalog/pg_operator.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "commands/async.h"
#include "commands/defrem.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "parser/parse_type.h"
#include "pgstat.h"
#include "storage/lmgr.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/json.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/regproc.h"
#include "utils/rel.h"
#include "utils/relcache.h"
#include "utils/rls.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "idempotency.h"
#include "records.h"

PG_FUNCTION_INFO_V1(idem_sweep);
PG_FUNCTION_INFO_V1(idem_flag_stuck);
PG_FUNCTION_INFO_V1(idem_reconcile);
PG_FUNCTION_INFO_V1(idem_maintain);
PG_FUNCTION_INFO_V1(idem_set_reconciler);

#define IDEM_STUCK_CHANNEL		"idem_stuck"

/*
 * NOTIFY payloads must be shorter than 8000 bytes.  Keys, scopes and
 * operations that the API accepts give at most about 1200; a longer payload
 * can only come from rows written around the API, and is not sent.
 */
#define IDEM_NOTIFY_MAX			7000

/* Phases of a pass */
#define PHASE_SWEEP				0x01
#define PHASE_FLAG				0x02
#define PHASE_RECONCILE			0x04
#define PHASE_ALL				(PHASE_SWEEP | PHASE_FLAG | PHASE_RECONCILE)

/* The prepared statements, valid for one installation of the extension */
typedef enum MaintPlan
{
	MPLAN_ANY_RECONCILER,
	MPLAN_STUCK_LIST,
	MPLAN_STUCK_ROW,
	MPLAN_SET_RECONCILER,
	MPLAN_DROP_RECONCILER,
	NUM_MPLANS
} MaintPlan;

typedef struct MaintCatalog
{
	Oid			nspid;
	Oid			keys_relid;
	Oid			expires_indexid;	/* idem_keys_expires_at_idx */
	Oid			reconcilers_relid;
	bool		registered_by;	/* idem_reconcilers has the column */
	SPIPlanPtr	plans[NUM_MPLANS];
} MaintCatalog;

static MaintCatalog maint_catalog;

/* A stuck record with a reconciler, as listed at the start of the phase */
typedef struct StuckRecord
{
	text	   *scope;
	text	   *key;
	IdemReconciler rc;			/* rc.operation is the record's operation */
	bool		skip;			/* its reconciler was skipped in this pass */
} StuckRecord;

/* How one pass is run */
typedef struct PassState
{
	IdemTxnMode mode;
	Oid			nspid;			/* InvalidOid: find the extension (worker) */
	Oid			relid;			/* the shard maintained, or InvalidOid (PassRelations) */
	int			batch_size;		/* 0: idempotency.sweep_batch_size */
	IdemStopCallback stop;
	IdemPassCounts *counts;
	MemoryContext passcxt;		/* lives for the whole pass */
	MemoryContext unitcxt;		/* reset after each unit */
	bool		as_owner;		/* the unit runs as idem_keys' owner */
	Oid			save_userid;	/* ... and this was the user before */
	int			save_sec_context;
} PassState;

/*
 * SQL texts; %1$s is the quoted schema of the extension, %2$s the relation
 * maintained: idem_keys, or with Citus one of its shards on this node, %3$s
 * the registrar of a reconciler: r.registered_by, or in the previous
 * release's catalog, which lacks that column, 0 (taken as run_as, as the
 * update leaves it: reconcile.c)
 */
static const char *const mplan_sql[NUM_MPLANS] = {
	[MPLAN_ANY_RECONCILER] =
	"SELECT 1 FROM %1$s.idem_reconcilers LIMIT 1",
	[MPLAN_STUCK_LIST] =
	"SELECT k.scope::pg_catalog.text, k.operation::pg_catalog.text,"
	" k.key::pg_catalog.text, r.handler::pg_catalog.text,"
	" r.run_as::pg_catalog.oid, %3$s"
	" FROM %2$s k JOIN %1$s.idem_reconcilers r"
	" ON r.operation OPERATOR(pg_catalog.=) k.operation"
	" WHERE k.status OPERATOR(pg_catalog.=) 'stuck'::pg_catalog.text"
	" AND k.scope IS NOT NULL AND k.key IS NOT NULL AND r.handler IS NOT NULL"
	" AND r.run_as IS NOT NULL AND %3$s IS NOT NULL"
	" ORDER BY k.updated_at, k.scope, k.operation, k.key LIMIT $1",
	[MPLAN_STUCK_ROW] =
	"SELECT ROW(k.*)::%1$s.idem_keys FROM %2$s k"
	" WHERE k.scope OPERATOR(pg_catalog.=) $1"
	" AND k.operation OPERATOR(pg_catalog.=) $2"
	" AND k.key OPERATOR(pg_catalog.=) $3"
	" AND k.status OPERATOR(pg_catalog.=) 'stuck'::pg_catalog.text"
	" FOR UPDATE SKIP LOCKED",
	[MPLAN_SET_RECONCILER] =
	"INSERT INTO %1$s.idem_reconcilers AS r (operation, handler, run_as)"
	" VALUES ($1, $2, $3)"
	" ON CONFLICT (operation) DO UPDATE SET handler = excluded.handler,"
	" run_as = excluded.run_as, created_at = pg_catalog.now()",
	[MPLAN_DROP_RECONCILER] =
	"DELETE FROM %1$s.idem_reconcilers"
	" WHERE operation OPERATOR(pg_catalog.=) $1",
};

static const Oid mplan_types[NUM_MPLANS][3] = {
	[MPLAN_STUCK_LIST] = {INT4OID},
	[MPLAN_STUCK_ROW] = {TEXTOID, TEXTOID, TEXTOID},
	[MPLAN_SET_RECONCILER] = {TEXTOID, TEXTOID, REGROLEOID},
	[MPLAN_DROP_RECONCILER] = {TEXTOID},
};

static const int mplan_nargs[NUM_MPLANS] = {
	[MPLAN_ANY_RECONCILER] = 0,
	[MPLAN_STUCK_LIST] = 1,
	[MPLAN_STUCK_ROW] = 3,
	[MPLAN_SET_RECONCILER] = 3,
	[MPLAN_DROP_RECONCILER] = 1,
};

/* Schema of the installed extension, or InvalidOid when it is not installed */
static Oid
ExtensionSchema(void)
{
	Oid			nspid;

	(void) IdemExtensionVersion(IDEM_EXTENSION_NAME, &nspid);
	return nspid;
}

/* Raise the error for a missing idem_keys_expires_at_idx */
pg_noreturn static void
ReportMissingExpiryIndex(Oid nspid)
{
	ereport(ERROR,
			(errcode(ERRCODE_UNDEFINED_OBJECT),
			 errmsg("index \"idem_keys_expires_at_idx\" of extension \"idempotency\" does not exist"),
			 errdetail("The sweep finds expired records through it."),
			 errhint("Create it again with CREATE INDEX idem_keys_expires_at_idx ON %s (expires_at).",
					 quote_qualified_identifier(get_namespace_name(nspid), "idem_keys"))));
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
 * idem_keys_processing_idx): a valid B-tree whose first column is
 * created_at, in the default order, with the predicate status =
 * 'processing'.  Every processing record has an entry there and no other
 * record does, so flagging reads only processing records.  InvalidOid
 * when there is none: then the table is read whole, as before the index
 * existed (whoever drops it trades that for cheaper reservations).
 */
static Oid
ProcessingIndex(IdemTable *table)
{
	static Oid	timestamptz_family = InvalidOid;
	List	   *indexes = RelationGetIndexList(table->rel);
	ListCell   *lc;
	Oid			found = InvalidOid;

	if (!OidIsValid(timestamptz_family))
		timestamptz_family =
			get_opclass_family(GetDefaultOpClass(TIMESTAMPTZOID, BTREE_AM_OID));

	foreach(lc, indexes)
	{
		Relation	index = index_open(lfirst_oid(lc), AccessShareLock);
		bool		serves;

		serves = index->rd_rel->relam == BTREE_AM_OID &&
			index->rd_index->indisvalid &&
			index->rd_index->indkey.values[0] == table->attnum[COL_CREATED_AT] &&
			index->rd_opfamily[0] == timestamptz_family &&
			PredicateIsProcessing(RelationGetIndexPredicate(index),
								  table->attnum[COL_STATUS]);
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
 * or, on a shard, Citus's copy of it, which has another name
 */
static Oid
ExpiryIndex(Relation rel, AttrNumber expires_at)
{
	List	   *indexes = RelationGetIndexList(rel);
	ListCell   *lc;
	Oid			result = InvalidOid;

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
			result = index->indexrelid;
		ReleaseSysCache(tuple);
		if (OidIsValid(result))
			break;
	}
	list_free(indexes);
	return result;
}

/*
 * Does idem_reconcilers have its column registered_by?  The previous
 * release's catalog has none (served as it is until ALTER EXTENSION
 * UPDATE); any other catalog without it is an error.
 */
static bool
RegisteredByColumn(Oid reconcilers)
{
	if (get_attnum(reconcilers, "registered_by") != InvalidAttrNumber)
		return true;
	if (IdemCatalogIsPrevious())
		return false;
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("table \"idem_reconcilers\" has no column \"registered_by\""),
			 errdetail("The extension needs column \"registered_by\" of type regrole, the role that registered each reconciler."),
			 errhint("Run ALTER EXTENSION idempotency UPDATE if the catalog is older than the library; otherwise register the reconcilers again after adding the column back.")));
	return false;				/* keep compiler quiet */
}

/*
 * Find the extension's tables and lock the relation maintained for this
 * unit of work (records.c checks its layout): relid, one of
 * IdemRecordsLocalShards, or idem_keys itself when InvalidOid.  With nspid
 * InvalidOid (the worker) the extension is looked up, and a missing
 * extension or table, or one dropped while we waited for the lock, is
 * reported by returning false.  With a schema (SQL functions) those are
 * errors, except a shard that moved away: it is skipped.
 */
static bool
OpenCatalog(Oid nspid, Oid relid)
{
	MaintCatalog *cat = &maint_catalog;
	bool		quiet = !OidIsValid(nspid);
	IdemTable	table;
	Oid			keys;
	Oid			expires;
	Oid			reconcilers;
	bool		registered_by;
	int			i;

	if (quiet)
	{
		nspid = ExtensionSchema();
		if (!OidIsValid(nspid))
			return false;
	}

	if (OidIsValid(relid))
	{
		if (!IdemRecordsTryOpenRelation(relid, RowExclusiveLock, &table))
			return false;
	}
	else if (!IdemRecordsTryOpen(nspid, NULL, RowExclusiveLock, &table))
	{
		if (quiet)
			return false;
		IdemReportMissingTable("idem_keys");
	}
	keys = RelationGetRelid(table.rel);
	expires = ExpiryIndex(table.rel, table.attnum[COL_EXPIRES_AT]);
	IdemRecordsClose(&table);

	reconcilers = get_relname_relid("idem_reconcilers", nspid);
	if (!OidIsValid(reconcilers))
	{
		if (quiet)
			return false;
		IdemReportMissingTable("idem_reconcilers");
	}
	if (!OidIsValid(expires))
		ReportMissingExpiryIndex(nspid);
	registered_by = RegisteredByColumn(reconcilers);

	if (cat->nspid != nspid || cat->keys_relid != keys ||
		cat->expires_indexid != expires || cat->reconcilers_relid != reconcilers ||
		cat->registered_by != registered_by)
	{
		for (i = 0; i < NUM_MPLANS; i++)
		{
			if (cat->plans[i])
				SPI_freeplan(cat->plans[i]);
			cat->plans[i] = NULL;
		}
		cat->nspid = nspid;
		cat->keys_relid = keys;
		cat->expires_indexid = expires;
		cat->reconcilers_relid = reconcilers;
		cat->registered_by = registered_by;
	}
	return true;
}

/*
 * The prepared statement for the current installation; SPI must be
 * connected.  Generic plans: the sweep must stay an index range scan
 * whatever the first parameters look like.
 */
static SPIPlanPtr
GetPlan(MaintPlan which)
{
	MaintCatalog *cat = &maint_catalog;

	if (cat->plans[which] == NULL)
	{
		char	   *nspname = get_namespace_name(cat->nspid);
		char	   *sql = psprintf(mplan_sql[which], quote_identifier(nspname),
									   quote_qualified_identifier(get_namespace_name(get_rel_namespace(cat->keys_relid)),
																  get_rel_name(cat->keys_relid)),
									   cat->registered_by ? "r.registered_by::pg_catalog.oid" : "0::pg_catalog.oid");
		SPIPlanPtr	plan;

		plan = SPI_prepare_cursor(sql, mplan_nargs[which],
								  (Oid *) mplan_types[which],
								  CURSOR_OPT_GENERIC_PLAN);
		if (plan == NULL)
			elog(ERROR, "SPI_prepare failed for \"%s\": %s",
				 sql, SPI_result_code_string(SPI_result));
		if (SPI_keepplan(plan) != 0)
			elog(ERROR, "SPI_keepplan failed");
		cat->plans[which] = plan;
	}
	return cat->plans[which];
}

/* Run a prepared statement that returns rows; SPI must be connected */
static void
RunPlan(MaintPlan which, Datum *values, const char *nulls)
{
	int			rc;

	rc = SPI_execute_plan(GetPlan(which), values, nulls, false, 0);
	if (rc < 0)
		elog(ERROR, "SPI_execute_plan failed: %s", SPI_result_code_string(rc));
}

/* Column of the current SPI result as text, or NULL */
static text *
ResultText(uint64 row, int col)
{
	bool		isnull;
	Datum		d = SPI_getbinval(SPI_tuptable->vals[row], SPI_tuptable->tupdesc,
								  col, &isnull);

	return isnull ? NULL : DatumGetTextPP(d);
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
	int			len = VARSIZE_ANY_EXHDR(operation);
	int			i;

	for (i = oc->n - 1; i >= 0; i--)
	{
		if (VARSIZE_ANY_EXHDR(oc->operation[i]) == len &&
			memcmp(VARDATA_ANY(oc->operation[i]), VARDATA_ANY(operation), len) == 0)
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
 * Delete up to batch_size expired completed records, those with expires_at
 * in [*lower, now], found through the expires_at index with the latest
 * snapshot and deleted through records.c's executor writer.  Each is first
 * locked without waiting: one that another transaction is changing or
 * locking, or has changed since the snapshot (a renewal by idem_reserve),
 * is skipped, as FOR UPDATE SKIP LOCKED would.  *lower moves to the last
 * expires_at seen, so the next batch resumes there instead of walking again
 * over the index entries of deleted rows.  Returns the number deleted and
 * counts them per operation in idem_stats.
 */
static int64
SweepBatch(int batch_size, TimestampTz now, TimestampTz *lower)
{
	MaintCatalog *cat = &maint_catalog;
	IdemTable	table;
	IdemWriter	w;
	Relation	index;
	IndexScanDesc scan;
	TupleTableSlot *slot;
	ScanKeyData skey[2];
	int			nkeys = 0;
	Snapshot	snapshot;
	OpCounts	oc;
	int64		deleted = 0;

	if (!IdemRecordsTryOpenRelation(cat->keys_relid, RowExclusiveLock, &table))
		return 0;
	IdemRecordsCheckReadable(&table);
	IdemRecordsWriterBegin(&table, ACL_DELETE, "idem_sweep()", &w);
	index = index_open(cat->expires_indexid, AccessShareLock);

	ScanKeyInit(&skey[nkeys++], 1, BTLessEqualStrategyNumber,
				F_TIMESTAMPTZ_LE, TimestampTzGetDatum(now));
	if (*lower != DT_NOBEGIN)
		ScanKeyInit(&skey[nkeys++], 1, BTGreaterEqualStrategyNumber,
					F_TIMESTAMPTZ_GE, TimestampTzGetDatum(*lower));

	snapshot = RegisterSnapshot(GetLatestSnapshot());
	slot = table_slot_create(table.rel, NULL);
	scan = IdemIndexBeginScan(table.rel, index, snapshot, nkeys, 0);
	index_rescan(scan, skey, nkeys, NULL, 0);
	oc.n = 0;

	while (deleted < batch_size &&
		   index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		TimestampTz expires_at;

		CHECK_FOR_INTERRUPTS();
		slot_getallattrs(slot);
		expires_at = DatumGetTimestampTz(IdemRecordsRequired(&table, slot, COL_EXPIRES_AT));
		if (expires_at > *lower)
			*lower = expires_at;

		/* processing and stuck records never expire */
		if (IdemRecordsStatus(DatumGetTextPP(IdemRecordsRequired(&table, slot, COL_STATUS))) != STATUS_COMPLETED)
			continue;

		/* being changed or locked, or changed: not ours now */
		if (IdemRecordsLock(&w, &slot->tts_tid, LockTupleExclusive, LockWaitSkip) != TM_Ok)
			continue;
		/* a BEFORE DELETE trigger may keep it */
		if (!IdemRecordsDelete(&w, false))
			continue;

		OpCountsAdd(&oc, DatumGetTextPP(SlotColumn(&table, slot, COL_OPERATION)),
					IDEM_STAT_EXPIRED);
		deleted++;
	}

	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	UnregisterSnapshot(snapshot);
	index_close(index, AccessShareLock);
	IdemRecordsWriterEnd(&w);
	IdemRecordsClose(&table);

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
 * through records.c's executor writer: one that another transaction is
 * writing or locking (idem_complete, idem_checkpoint or idem_release under
 * way) is left for the next pass.  *lower moves to the last created_at
 * seen, so the next batch resumes there.  Returns the number flagged and
 * counts them per operation in idem_stats.
 */
static int64
FlagBatch(int batch_size, TimestampTz cutoff, TimestampTz *lower)
{
	IdemTable	table;
	IdemWriter	w;
	Oid			indexid;
	Relation	index = NULL;
	IndexScanDesc iscan = NULL;
	TableScanDesc tscan = NULL;
	TupleTableSlot *slot;
	ScanKeyData skey[1];
	int			nkeys = 0;
	Snapshot	snapshot;
	StringInfoData buf;
	OpCounts	oc;
	int64		flagged = 0;

	if (!IdemRecordsTryOpenRelation(maint_catalog.keys_relid, RowExclusiveLock, &table))
		return 0;
	IdemRecordsCheckReadable(&table);
	IdemRecordsWriterBegin(&table, ACL_UPDATE, "idem_flag_stuck()", &w);

	snapshot = RegisterSnapshot(GetLatestSnapshot());
	slot = table_slot_create(table.rel, NULL);
	indexid = ProcessingIndex(&table);
	if (OidIsValid(indexid))
	{
		if (*lower != DT_NOBEGIN)
			ScanKeyInit(&skey[nkeys++], 1, BTGreaterEqualStrategyNumber,
						F_TIMESTAMPTZ_GE, TimestampTzGetDatum(*lower));
		index = index_open(indexid, AccessShareLock);
		iscan = IdemIndexBeginScan(table.rel, index, snapshot, nkeys, 0);
		index_rescan(iscan, skey, nkeys, NULL, 0);
	}
	else
		tscan = IdemTableBeginScan(table.rel, snapshot, 0, NULL);
	initStringInfo(&buf);
	oc.n = 0;

	while (flagged < batch_size &&
		   (iscan != NULL ?
			index_getnext_slot(iscan, ForwardScanDirection, slot) :
			table_scan_getnextslot(tscan, ForwardScanDirection, slot)))
	{
		IdemRow		row;
		TupleTableSlot *locked = w.locked;
		TimestampTz created_at;

		CHECK_FOR_INTERRUPTS();
		slot_getallattrs(slot);
		created_at = DatumGetTimestampTz(IdemRecordsRequired(&table, slot, COL_CREATED_AT));
		if (iscan != NULL && created_at > *lower)
			*lower = created_at;
		if (IdemRecordsStatus(DatumGetTextPP(IdemRecordsRequired(&table, slot, COL_STATUS))) != STATUS_PROCESSING ||
			DatumGetTimestampTz(IdemRecordsRequired(&table, slot, COL_UPDATED_AT)) > cutoff)
			continue;

		/* being written or locked, or changed: left for the next pass */
		if (IdemRecordsLock(&w, &slot->tts_tid, LockTupleNoKeyExclusive, LockWaitSkip) != TM_Ok)
			continue;
		IdemRowInit(&row);
		IdemRowSet(&row, COL_STATUS, CStringGetTextDatum("stuck"), false);
		/* a BEFORE UPDATE trigger may keep it processing */
		if (!IdemRecordsUpdate(&w, &row, false))
			continue;

		NotifyStuck(&buf, DatumGetTextPP(SlotColumn(&table, locked, COL_SCOPE)),
					DatumGetTextPP(SlotColumn(&table, locked, COL_OPERATION)),
					DatumGetTextPP(SlotColumn(&table, locked, COL_KEY)));
		OpCountsAdd(&oc, DatumGetTextPP(SlotColumn(&table, locked, COL_OPERATION)),
					IDEM_STAT_FLAGGED_STUCK);
		flagged++;
	}

	if (iscan != NULL)
	{
		index_endscan(iscan);
		index_close(index, AccessShareLock);
	}
	else
		table_endscan(tscan);
	ExecDropSingleTupleTableSlot(slot);
	UnregisterSnapshot(snapshot);
	IdemRecordsWriterEnd(&w);
	IdemRecordsClose(&table);

	OpCountsFlush(&oc, IDEM_STAT_FLAGGED_STUCK);
	return flagged;
}

/*
 * The stuck records whose operation has a reconciler, oldest heartbeat
 * first, at most limit of them, copied into cxt.
 */
static List *
ListStuck(int limit, MemoryContext cxt)
{
	Datum		values[1];
	char		nulls[1] = {' '};
	List	   *result = NIL;
	uint64		i;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");

	/* Without reconcilers, do not read idem_keys at all */
	RunPlan(MPLAN_ANY_RECONCILER, NULL, NULL);
	if (SPI_processed == 0)
	{
		SPI_finish();
		return NIL;
	}

	values[0] = Int32GetDatum(limit);
	RunPlan(MPLAN_STUCK_LIST, values, nulls);
	for (i = 0; i < SPI_processed; i++)
	{
		MemoryContext oldcxt = MemoryContextSwitchTo(cxt);
		StuckRecord *rec = palloc(sizeof(StuckRecord));
		bool		isnull;

		rec->scope = DatumGetTextPCopy(PointerGetDatum(ResultText(i, 1)));
		rec->rc.operation = DatumGetTextPCopy(PointerGetDatum(ResultText(i, 2)));
		rec->key = DatumGetTextPCopy(PointerGetDatum(ResultText(i, 3)));
		rec->rc.handler = text_to_cstring(ResultText(i, 4));
		rec->rc.run_as = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[i],
													 SPI_tuptable->tupdesc,
													 5, &isnull));
		rec->rc.registered_by = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[i],
															SPI_tuptable->tupdesc,
															6, &isnull));
		rec->skip = false;
		result = lappend(result, rec);
		MemoryContextSwitchTo(oldcxt);
	}

	SPI_finish();
	return result;
}

/*
 * The record as a composite datum of type idem_keys, in the current memory
 * context, if it is still stuck, locked FOR UPDATE until the transaction
 * ends; otherwise, or when another transaction is writing it, (Datum) 0.
 * Read with the latest snapshot, so that the lock never meets a row version
 * newer than the snapshot (no serialization failure in REPEATABLE READ).
 * Not inlined: its locals would then live across ReconcileOne's PG_TRY,
 * which -Wclobbered rightly warns about at some optimization levels.
 */
static pg_noinline Datum
FetchStuckRow(StuckRecord *rec)
{
	Datum		values[3];
	char		nulls[3] = {' ', ' ', ' '};
	Datum		row = (Datum) 0;
	Snapshot	snapshot;
	int			rc;

	values[0] = PointerGetDatum(rec->scope);
	values[1] = PointerGetDatum(rec->rc.operation);
	values[2] = PointerGetDatum(rec->key);

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	rc = SPI_execute_snapshot(GetPlan(MPLAN_STUCK_ROW), values, nulls,
							  snapshot, InvalidSnapshot, false, false, 0);
	UnregisterSnapshot(snapshot);
	if (rc < 0)
		elog(ERROR, "SPI_execute_snapshot failed: %s", SPI_result_code_string(rc));
	if (SPI_processed > 0)
	{
		bool		isnull;
		Datum		d = SPI_getbinval(SPI_tuptable->vals[0],
									  SPI_tuptable->tupdesc, 1, &isnull);

		if (!isnull)
			row = SPI_datumTransfer(d, false, -1);
	}
	SPI_finish();
	return row;
}

/* What became of one stuck record (ReconcileOne) */
typedef enum ReconcileResult
{
	RECONCILE_DONE,				/* the reconciler returned */
	RECONCILE_FAILED,			/* it raised: a WARNING naming the key */
	RECONCILE_SKIPPED,			/* it may not be called: a WARNING */
	RECONCILE_GONE				/* no longer stuck, or being written */
} ReconcileResult;

/*
 * Reconcile one stuck record in a subtransaction, with the record locked
 * (FetchStuckRow): while the reconciler runs, the application cannot settle
 * it behind its back (its idem_complete waits, then finds it settled).
 */
static ReconcileResult
ReconcileOne(StuckRecord *rec)
{
	MemoryContext cxt = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	Datum		row;
	volatile ReconcileResult result = RECONCILE_DONE;

	row = FetchStuckRow(rec);
	if (row == (Datum) 0)
		return RECONCILE_GONE;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(cxt);
	PG_TRY();
	{
		if (!IdemReconcilerCall(maint_catalog.nspid, &rec->rc, row))
			result = RECONCILE_SKIPPED;
		ReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(cxt);
		CurrentResourceOwner = owner;
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(cxt);
		CurrentResourceOwner = owner;

		ereport(WARNING,
				(errcode(edata->sqlerrcode),
				 errmsg("reconciler %s failed for idempotency key \"%s\"",
						rec->rc.handler, text_to_cstring(rec->key)),
				 errdetail("Operation \"%s\", scope \"%s\". The reconciler raised: %s",
						   text_to_cstring(rec->rc.operation),
						   text_to_cstring(rec->scope), edata->message),
				 errhint("The record stays stuck; the reconciler is called again at the next maintenance pass."),
				 edata->context ? errcontext_msg("%s", edata->context) : 0));
		FreeErrorData(edata);
		result = RECONCILE_FAILED;
	}
	PG_END_TRY();
	return result;
}

/*
 * After the reconciler of rec was skipped, skip the rest of this pass's
 * records of its operation without a WARNING each: the next pass looks
 * again.
 */
static void
SkipOperation(List *stuck, StuckRecord *rec)
{
	ListCell   *lc;

	foreach(lc, stuck)
	{
		StuckRecord *other = (StuckRecord *) lfirst(lc);

		if (VARSIZE_ANY_EXHDR(other->rc.operation) == VARSIZE_ANY_EXHDR(rec->rc.operation) &&
			memcmp(VARDATA_ANY(other->rc.operation), VARDATA_ANY(rec->rc.operation),
				   VARSIZE_ANY_EXHDR(rec->rc.operation)) == 0)
			other->skip = true;
	}
}

/* Start a unit of work: its own transaction in worker and procedure mode */
static void
UnitBegin(PassState *ps, const char *activity)
{
	if (ps->mode == IDEM_TXN_WORKER)
	{
		SetCurrentStatementStartTimestamp();
		StartTransactionCommand();
		pgstat_report_activity(STATE_RUNNING, activity);
	}
	if (ps->mode != IDEM_TXN_CALLER)
		PushActiveSnapshot(GetTransactionSnapshot());
	MemoryContextSwitchTo(ps->unitcxt);
}

/* End a unit of work: commit it in worker and procedure mode */
static void
UnitEnd(PassState *ps)
{
	MemoryContextSwitchTo(ps->passcxt);
	if (ps->mode != IDEM_TXN_CALLER)
		PopActiveSnapshot();
	if (ps->mode == IDEM_TXN_WORKER)
	{
		/* Deferred triggers fire in the commit: still as the owner */
		CommitTransactionCommand();
		if (ps->as_owner)
		{
			SetUserIdAndSecContext(ps->save_userid, ps->save_sec_context);
			ps->as_owner = false;
		}
		pgstat_report_stat(false);
		pgstat_report_activity(STATE_IDLE, NULL);
	}
	else if (ps->mode == IDEM_TXN_PROCEDURE)
	{
		SPI_commit();
	}
	MemoryContextSwitchTo(ps->passcxt);
	MemoryContextReset(ps->unitcxt);
}

/* Account for a finished batch that started at start; its duration */
static int64
NoteBatch(PassState *ps, TimestampTz start)
{
	int64		us = GetCurrentTimestamp() - start;

	ps->counts->batches++;
	if (us > ps->counts->longest_batch_us)
		ps->counts->longest_batch_us = us;
	return us;
}

/* Between units: should the pass end here?  batch_us: the batch just done */
static bool
StopRequested(PassState *ps, int64 batch_us)
{
	CHECK_FOR_INTERRUPTS();
	if (ps->stop != NULL && ps->stop(batch_us))
	{
		ps->counts->stopped = true;
		return true;
	}
	return false;
}

/*
 * The worker is the bootstrap superuser, but the triggers, CHECK
 * constraints and index expressions of idem_keys run inside its writes:
 * like autovacuum for a table's index expressions, it runs each unit as
 * the table's owner, in a security-restricted operation (no SET ROLE, no
 * temporary objects), so that whoever may add them to idem_keys (its owner,
 * or a role granted TRIGGER) gets no more than the owner's rights.  The
 * unit's end switches back.  The SQL entry points run as their caller.
 */
static void
BecomeTableOwner(PassState *ps)
{
	HeapTuple	tuple;
	Oid			owner;

	tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(maint_catalog.keys_relid));
	if (!HeapTupleIsValid(tuple))
		elog(ERROR, "cache lookup failed for relation %u", maint_catalog.keys_relid);
	owner = ((Form_pg_class) GETSTRUCT(tuple))->relowner;
	ReleaseSysCache(tuple);

	GetUserIdAndSecContext(&ps->save_userid, &ps->save_sec_context);
	SetUserIdAndSecContext(owner, ps->save_sec_context |
						   SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
	ps->as_owner = true;
}

/* Open the catalog for a unit; false (pass ends) when the extension is gone */
static bool
UnitOpen(PassState *ps)
{
	if (OpenCatalog(ps->nspid, ps->relid))
	{
		if (ps->mode == IDEM_TXN_WORKER)
			BecomeTableOwner(ps);
		return true;
	}
	UnitEnd(ps);
	ps->counts->missing = true;
	return false;
}

/* Batch size of this pass */
static int
BatchSize(PassState *ps)
{
	return ps->batch_size > 0 ? ps->batch_size : idem_sweep_batch_size;
}

/* Phase 1: delete expired completed records, a batch per unit */
static bool
SweepPhase(PassState *ps)
{
	TimestampTz lower = DT_NOBEGIN;

	for (;;)
	{
		TimestampTz start = GetCurrentTimestamp();
		int			batch = BatchSize(ps);
		int64		n;
		int64		batch_us;

		UnitBegin(ps, "idempotency: deleting expired records");
		if (!UnitOpen(ps))
			return false;

		/*
		 * A batch of our own need not wait for its WAL flush: if a crash
		 * forgets it, the next pass deletes those records again.
		 */
		if (ps->mode != IDEM_TXN_CALLER)
			(void) set_config_option("synchronous_commit", "off", PGC_SUSET,
									 PGC_S_SESSION, GUC_ACTION_LOCAL, true, 0,
									 false);
		n = SweepBatch(batch, GetCurrentTransactionStartTimestamp(), &lower);
		UnitEnd(ps);
		batch_us = NoteBatch(ps, start);
		ps->counts->deleted += n;
		if (n < batch)
			return true;
		if (StopRequested(ps, batch_us))
			return false;
	}
}

/* Phase 2: flag processing records past processing_timeout, a batch per unit */
static bool
FlagPhase(PassState *ps)
{
	TimestampTz lower = DT_NOBEGIN;

	for (;;)
	{
		TimestampTz start = GetCurrentTimestamp();
		int			batch = BatchSize(ps);
		TimestampTz cutoff;
		int64		n;
		int64		batch_us;

		UnitBegin(ps, "idempotency: flagging stuck records");
		if (!UnitOpen(ps))
			return false;
		cutoff = TimestampTzPlusMilliseconds(GetCurrentTransactionStartTimestamp(),
											 -(int64) idem_processing_timeout_ms);
		n = FlagBatch(batch, cutoff, &lower);
		UnitEnd(ps);
		batch_us = NoteBatch(ps, start);
		ps->counts->flagged += n;
		if (n < batch)
			return true;
		if (StopRequested(ps, batch_us))
			return false;
	}
}

/* Phase 3: call the reconciler of each stuck record, one unit per call */
static bool
ReconcilePhase(PassState *ps)
{
	List	   *stuck;
	ListCell   *lc;

	UnitBegin(ps, "idempotency: listing stuck records");
	if (!UnitOpen(ps))
		return false;
	stuck = ListStuck(BatchSize(ps), ps->passcxt);
	UnitEnd(ps);

	foreach(lc, stuck)
	{
		StuckRecord *rec = (StuckRecord *) lfirst(lc);
		ReconcileResult r;

		if (rec->skip)
			continue;
		if (StopRequested(ps, 0))
			return false;
		UnitBegin(ps, "idempotency: calling a reconciler");
		if (!UnitOpen(ps))
			return false;
		r = ReconcileOne(rec);
		UnitEnd(ps);
		if (r == RECONCILE_DONE)
			ps->counts->reconciled++;
		else if (r == RECONCILE_FAILED)
			ps->counts->failed++;
		else if (r == RECONCILE_SKIPPED)
			SkipOperation(stuck, rec);
	}
	return true;
}

/*
 * The relations a pass maintains, in the pass's memory: the shards of
 * idem_keys that this node holds when Citus distributes it (records.c),
 * none on a coordinator without shards; otherwise InvalidOid alone, for
 * idem_keys itself, found (or found missing) by each unit as always.
 */
static List *
PassRelations(PassState *ps)
{
	List	   *relids = NIL;
	Oid			nspid;
	bool		shards;

	UnitBegin(ps, "idempotency: listing the shards of idem_keys");
	nspid = OidIsValid(ps->nspid) ? ps->nspid : ExtensionSchema();
	shards = OidIsValid(nspid) && IdemRecordsLocalShards(nspid, &relids);
	MemoryContextSwitchTo(ps->passcxt);
	relids = shards ? list_copy(relids) : list_make1_oid(InvalidOid);
	UnitEnd(ps);
	return relids;
}

/*
 * Run the given phases of a pass over each relation of records on this
 * node (PassRelations).  The pass's memory must outlive the
 * transactions of worker and procedure mode, so it hangs below the
 * current context, which the caller keeps across them.
 */
static void
RunPass(IdemTxnMode mode, Oid nspid, int phases, int batch_size,
		IdemStopCallback stop, IdemPassCounts *counts)
{
	PassState	ps;
	MemoryContext oldcxt = CurrentMemoryContext;
	ListCell   *lc;

	memset(counts, 0, sizeof(*counts));
	ps.mode = mode;
	ps.as_owner = false;
	ps.nspid = nspid;
	ps.relid = InvalidOid;
	ps.batch_size = batch_size;
	ps.stop = stop;
	ps.counts = counts;
	ps.passcxt = AllocSetContextCreate(CurrentMemoryContext,
									   "idempotency maintenance pass",
									   ALLOCSET_DEFAULT_SIZES);
	ps.unitcxt = AllocSetContextCreate(ps.passcxt,
									   "idempotency maintenance unit",
									   ALLOCSET_DEFAULT_SIZES);
	MemoryContextSwitchTo(ps.passcxt);

	foreach(lc, PassRelations(&ps))
	{
		ps.relid = lfirst_oid(lc);
		if (!((phases & PHASE_SWEEP) == 0 || SweepPhase(&ps)) ||
			!((phases & PHASE_FLAG) == 0 || FlagPhase(&ps)) ||
			!((phases & PHASE_RECONCILE) == 0 || ReconcilePhase(&ps)))
			break;
	}

	MemoryContextSwitchTo(oldcxt);
	MemoryContextDelete(ps.passcxt);
}

/*
 * One maintenance pass over the current database: sweep, flag, reconcile.
 * nspid InvalidOid finds the extension and does nothing where it is not
 * installed.  In worker mode, call it outside a transaction.
 */
void
IdemMaintainDatabase(IdemTxnMode mode, Oid nspid, IdemStopCallback stop,
					 IdemPassCounts *counts)
{
	RunPass(mode, nspid, PHASE_ALL, 0, stop, counts);
}

/* idem_sweep(batch_size) → bigint: expired records deleted */
Datum
idem_sweep(PG_FUNCTION_ARGS)
{
	int			batch_size = 0;
	IdemPassCounts counts;

	PreventCommandIfReadOnly("idem_sweep()");

	if (!PG_ARGISNULL(0))
	{
		batch_size = PG_GETARG_INT32(0);
		if (batch_size <= 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("argument \"batch_size\" must be positive"),
					 errdetail("The value was %d.", batch_size)));
	}
	RunPass(IDEM_TXN_CALLER, IdemFunctionNamespace(fcinfo), PHASE_SWEEP,
			batch_size, NULL, &counts);
	PG_RETURN_INT64(counts.deleted);
}

/* idem_flag_stuck() → bigint: processing records flagged stuck */
Datum
idem_flag_stuck(PG_FUNCTION_ARGS)
{
	IdemPassCounts counts;

	PreventCommandIfReadOnly("idem_flag_stuck()");

	RunPass(IDEM_TXN_CALLER, IdemFunctionNamespace(fcinfo), PHASE_FLAG, 0,
			NULL, &counts);
	PG_RETURN_INT64(counts.flagged);
}

/* idem_reconcile() → bigint: reconciler calls that returned normally */
Datum
idem_reconcile(PG_FUNCTION_ARGS)
{
	IdemPassCounts counts;

	PreventCommandIfReadOnly("idem_reconcile()");

	RunPass(IDEM_TXN_CALLER, IdemFunctionNamespace(fcinfo), PHASE_RECONCILE,
			0, NULL, &counts);
	PG_RETURN_INT64(counts.reconciled);
}

/*
 * CALL idem_maintain(): the worker's pass, with a commit after every batch
 * and every reconciler call.  Inside a transaction block (or called from a
 * function) it cannot commit and runs everything in that transaction.
 */
Datum
idem_maintain(PG_FUNCTION_ARGS)
{
	Oid			nspid = IdemFunctionNamespace(fcinfo);
	bool		nonatomic;
	IdemPassCounts counts;

	PreventCommandIfReadOnly("idem_maintain()");

	nonatomic = fcinfo->context != NULL &&
		IsA(fcinfo->context, CallContext) &&
		!castNode(CallContext, fcinfo->context)->atomic;

	if (!nonatomic)
	{
		RunPass(IDEM_TXN_CALLER, nspid, PHASE_ALL, 0, NULL, &counts);
		PG_RETURN_VOID();
	}

	if (SPI_connect_ext(SPI_OPT_NONATOMIC) != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect_ext failed");
	RunPass(IDEM_TXN_PROCEDURE, nspid, PHASE_ALL, 0, NULL, &counts);
	SPI_finish();
	PG_RETURN_VOID();
}

/*
 * idem_set_reconciler(operation, handler) → void: register the reconciler
 * of an operation (it runs as the current role), or remove it with NULL.
 * The row goes through idem_reconcilers' trigger like any other write.
 */
Datum
idem_set_reconciler(PG_FUNCTION_ARGS)
{
	text	   *operation = PG_ARGISNULL(0) ? NULL : PG_GETARG_TEXT_PP(0);
	Oid			nspid = IdemFunctionNamespace(fcinfo);
	Datum		values[3];
	char		nulls[3] = {' ', ' ', ' '};

	PreventCommandIfReadOnly("idem_set_reconciler()");

	IdemCheckOperation(operation);
	values[0] = PointerGetDatum(operation);
	(void) OpenCatalog(nspid, InvalidOid);

	if (!PG_ARGISNULL(1))
	{
		Oid			handler = PG_GETARG_OID(1);

		IdemReconcilerCheck(handler, get_rel_type_id(maint_catalog.keys_relid),
						GetUserId());
		values[1] = CStringGetTextDatum(format_procedure_qualified(handler));
		values[2] = ObjectIdGetDatum(GetUserId());
	}

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	RunPlan(PG_ARGISNULL(1) ? MPLAN_DROP_RECONCILER : MPLAN_SET_RECONCILER,
			values, nulls);
	SPI_finish();
	PG_RETURN_VOID();
}
