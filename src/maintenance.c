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
 * No unit waits on an application without a limit, and none can join a
 * deadlock with one over records:
 *	- Each unit first locks idem_keys (or its shard) by OID without waiting
 *	  in its lock queue (OpenCatalog, LockTableBriefly: conditional locks
 *	  retried for at most 100 ms), then opens it through records.c, which
 *	  checks that it still exists, so a concurrent DROP EXTENSION ends a
 *	  worker pass quietly instead of failing a query.  When another
 *	  transaction holds a conflicting lock (an application's LOCK TABLE ...
 *	  IN SHARE MODE, DDL), the unit is skipped and counted (UnitSkipped: a
 *	  WARNING once per call from SQL) and its phase ends; the next pass
 *	  tries again.  The reconcile phase locks idem_reconcilers the same way.
 *	  So a worker never keeps its slot, or DROP DATABASE waiting, on an
 *	  application's table lock.  With Citus, listing the shards of
 *	  idem_keys at the start of a pass takes its lock the same way.
 *	- A sweep batch reads the expires_at index with the latest snapshot; a
 *	  flag batch reads the processing index (or the table) with it.  Only
 *	  valid, ready indexes are read: one that a failed CREATE INDEX
 *	  CONCURRENTLY left lacks entries; without a usable one the table is
 *	  read whole, with a WARNING once per pass.  Each batch locks a
 *	  candidate row version without waiting (IdemRecordsLock, LockWaitSkip)
 *	  and deletes or flags it through records.c's executor writer, as keys.c
 *	  writes, so the table's constraints and triggers hold for both.  A flag
 *	  takes the key lock for the instant of its write without waiting
 *	  either (IdemRecordsTryUpdate).  A record that another transaction is
 *	  changing, locking or reserving, or has changed since the snapshot
 *	  (idem_reserve renewing it), is skipped until the next pass.  The other
 *	  way round, idem_reserve answers in_progress for a record a batch is
 *	  deleting or flagging, and idem_complete, idem_checkpoint and
 *	  idem_release wait for the batch and look again (keys.c).
 *	- What runs inside a write (the owner's triggers and constraints) may
 *	  wait for locks of its own: a batch runs with lock_timeout at most
 *	  IDEM_BATCH_LOCK_TIMEOUT_MS, so such a wait fails that record's write.
 *	- A reconciler is called with the record locked FOR UPDATE SKIP LOCKED
 *	  and settles it through idem_complete or idem_release, which may wait:
 *	  each call has idempotency.reconciler_timeout, after which it is
 *	  cancelled like a statement past statement_timeout; a call that
 *	  catches the cancel is ended a grace later with its process, as
 *	  SIGTERM ends it (ReconcilerKillHandler), so no reconciler keeps a
 *	  worker slot or its database.
 * The worker ends when DROP DATABASE or ALTER DATABASE waits for its
 * database, between units and inside one (worker.c): they never wait on
 * it more than a few seconds.
 *
 * Failures
 * --------
 * One record whose write fails never stops the rest.  A batch runs in a
 * subtransaction (RunBatch); when the delete or flag of a record raises (a
 * trigger or CHECK of the owner refuses it; AFTER ROW triggers fire right
 * after each record's write so that theirs count too), the batch is rolled
 * back, the record reported with a WARNING naming its key, counted
 * (counts->write_errors) and left alone for the rest of the pass, and the
 * batch runs again without it.  One subtransaction per batch, not per
 * record: a batch of thousands of subtransactions would overflow every
 * snapshot's subxid cache.  A reconciler runs in a subtransaction of its
 * own; its error or timeout is a WARNING and the pass goes on.  The worker
 * then leaves the record for a growing delay (backoff.c), also when the
 * call's process was ended, so one stubborn reconciler costs only its
 * record.  A cancel
 * (statement_timeout of a SQL caller, pg_cancel_backend) is never
 * swallowed.

 * Rights
 * ------
 * The SQL entry points run as their caller.  The worker connects as the
 * bootstrap superuser but does each unit as the owner of idem_keys, in a
 * security-restricted operation (BecomeTableOwner), so that the table's
 * triggers and constraints get that owner's rights only.  A reconciler
 * runs as its run_as role, with search_path pinned, after the one rule of
 * ReconcilerRunnable (reconcile.c): every role that controls code the call
 * runs, the code its writes to idem_keys run included, must already be
 * able to act as run_as.
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
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lmgr.h"
#include "storage/proc.h"
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
#include "utils/timeout.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "idempotency.h"
#include "maintenance.h"
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

/*
 * lock_timeout of a sweep or flag batch, in milliseconds, unless the
 * session's is shorter.  The batch takes its own locks without waiting;
 * this bounds the waits of what runs inside its writes (the owner's
 * triggers and constraints): the record is then skipped with a WARNING.
 */
#define IDEM_BATCH_LOCK_TIMEOUT_MS	1000

/*
 * How a unit takes idem_keys' lock: tried without waiting, again every
 * IDEM_TABLE_LOCK_RETRY_MS up to IDEM_TABLE_LOCK_TRIES times (100 ms in
 * all), never queueing behind or ahead of anyone.  Enough for a lock that
 * a committing transaction is releasing (CREATE EXTENSION hints the
 * launcher just before its locks go); an application's LOCK TABLE is held
 * longer, and the unit is skipped.
 */
#define IDEM_TABLE_LOCK_TRIES		10
#define IDEM_TABLE_LOCK_RETRY_MS	10

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
	Oid			expires_indexid;	/* idem_keys_expires_at_idx, if valid */
	Oid			expires_unusable;	/* one on (expires_at) that is not */
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
	bool		warned_sweep;	/* the slow sweep was reported in this pass */
	bool		warned_flag;	/* ... and the slow stuck detection */
	bool		warned_busy;	/* ... and a unit skipped (SQL callers) */
	/* The record a batch is writing, for the WARNING if its write fails */
	MemoryContext reccxt;
	bool		rec_set;
	ItemPointerData rec_tid;
	text	   *rec_scope;
	text	   *rec_operation;
	text	   *rec_key;
	List	   *bad;			/* ItemPointers of records whose write failed */
	bool		gone;			/* relid was dropped since the listing */
} PassState;

/* What opening the catalog for a unit found (OpenCatalog) */
typedef enum CatalogOpen
{
	CATALOG_OPEN,
	CATALOG_MISSING,			/* the extension or its table is gone */
	CATALOG_GONE,				/* the shard was dropped: skip the shard */
	CATALOG_BUSY				/* idem_keys is locked: skip the unit */
} CatalogOpen;

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
static Oid
ExpiryIndex(Relation rel, AttrNumber expires_at, Oid *unusable)
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
 * Lock relid in lockmode within about 100 ms, without joining its lock
 * queue: false when another transaction held a conflicting lock the whole
 * time
 */
static bool
LockTableBriefly(Oid relid, LOCKMODE lockmode)
{
	int			i;

	for (i = 0; i < IDEM_TABLE_LOCK_TRIES; i++)
	{
		if (ConditionalLockRelationOid(relid, lockmode))
			return true;
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 IDEM_TABLE_LOCK_RETRY_MS, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
	return false;
}

/*
 * Find the extension's tables and lock the relation maintained for this
 * unit of work (records.c checks its layout): relid, one of
 * IdemRecordsLocalShards, or idem_keys itself when InvalidOid.  With nspid
 * InvalidOid (the worker) the extension is looked up, and a missing
 * extension or table, or one dropped while we waited for the lock, is
 * reported as CATALOG_MISSING.  With a schema (SQL functions) those are
 * errors.  A shard dropped since PassRelations listed it (moved away, the
 * old placement dropped) is CATALOG_GONE, in either mode: the extension is
 * still there, the pass goes on with the next shard.  With nowait
 * (maintenance), the relation's lock is not waited for beyond
 * LockTableBriefly: when another transaction holds one that conflicts
 * (LOCK TABLE, DDL), CATALOG_BUSY.
 */
static CatalogOpen
OpenCatalog(Oid nspid, Oid relid, bool nowait)
{
	MaintCatalog *cat = &maint_catalog;
	bool		quiet = !OidIsValid(nspid);
	IdemTable	table;
	Oid			keys;
	Oid			expires;
	Oid			unusable;
	Oid			reconcilers;
	bool		registered_by;
	int			i;

	if (quiet)
	{
		nspid = ExtensionSchema();
		if (!OidIsValid(nspid))
			return CATALOG_MISSING;
	}

	/*
	 * Lock the relation without waiting; records.c then finds it locked
	 * already, and checks that it is still the one of that name.
	 */
	if (nowait)
	{
		Oid			target = OidIsValid(relid) ? relid :
			get_relname_relid("idem_keys", nspid);

		if (OidIsValid(target) && !LockTableBriefly(target, RowExclusiveLock))
			return CATALOG_BUSY;
	}

	if (OidIsValid(relid))
	{
		if (!IdemRecordsTryOpenRelation(relid, RowExclusiveLock, &table))
			return CATALOG_GONE;
	}
	else if (!IdemRecordsTryOpen(nspid, NULL, RowExclusiveLock, &table))
	{
		if (quiet)
			return CATALOG_MISSING;
		IdemReportMissingTable("idem_keys");
	}
	keys = RelationGetRelid(table.rel);
	expires = ExpiryIndex(table.rel, table.attnum[COL_EXPIRES_AT], &unusable);
	IdemRecordsClose(&table);

	reconcilers = get_relname_relid("idem_reconcilers", nspid);
	if (!OidIsValid(reconcilers))
	{
		if (quiet)
			return CATALOG_MISSING;
		IdemReportMissingTable("idem_reconcilers");
	}
	registered_by = RegisteredByColumn(reconcilers);
	cat->expires_unusable = unusable;

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
	return CATALOG_OPEN;
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
static int64
SweepBatch(PassState *ps, int batch_size, TimestampTz now, TimestampTz *lower)
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
static int64
FlagBatch(PassState *ps, int batch_size, TimestampTz cutoff, TimestampTz *lower)
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

/* A sweep or flag batch: SweepBatch or FlagBatch */
typedef int64 (*BatchFunction) (PassState *ps, int batch_size, TimestampTz t,
								TimestampTz *lower);

/*
 * Call fn(arg) in a subtransaction: NULL when it returned, else the error
 * it raised, copied into the current memory context once the
 * subtransaction is rolled back.  Not inlined, so that no local of a
 * caller lives across the PG_TRY (-Wclobbered).
 */
static pg_noinline ErrorData *
CallInSubtransaction(void (*fn) (void *arg), void *arg)
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
static int64
RunBatch(PassState *ps, BatchFunction batch, int batch_size,
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
		edata = CallInSubtransaction(BatchCallRun, &call);
		if (edata == NULL)
			return call.n;
		if (!ps->rec_set || edata->sqlerrcode == ERRCODE_QUERY_CANCELED)
			ReThrowError(edata);

		ereport(WARNING,
				(errcode(edata->sqlerrcode),
				 batch == FlagBatch ?
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
 */
static Datum
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
 * Grace, in milliseconds, between the cancel of a reconciler call past
 * idempotency.reconciler_timeout and the end of the process, for a call
 * that caught the cancel: at most half the timeout, so that the process
 * has ended within one and a half timeouts.
 */
#define IDEM_RECONCILER_GRACE_MS	1000

/* The timeouts of a reconciler call: the cancel, then the end */
static TimeoutId reconciler_timeout_id = MAX_TIMEOUTS;
static TimeoutId reconciler_kill_id = MAX_TIMEOUTS;
static volatile sig_atomic_t reconciler_in_call = false;
static volatile sig_atomic_t reconciler_timed_out = false;
static volatile sig_atomic_t reconciler_abandoned = false;

/* The call running now, for the WARNING of ReportAbandonedCall */
static char *call_handler = NULL;
static char *call_operation = NULL;
static char *call_scope = NULL;
static char *call_key = NULL;
static bool call_exit_registered = false;

/*
 * The reconciler ran out of time: cancel it as StatementCancelHandler
 * does, and remember why, so that the cancel is reported as a timeout and
 * not passed on as the session's own cancel.
 */
static void
ReconcilerTimeoutHandler(void)
{
	reconciler_timed_out = true;
	if (reconciler_in_call && !proc_exit_inprogress)
	{
		InterruptPending = true;
		QueryCancelPending = true;
	}
	SetLatch(MyLatch);
}

/*
 * The reconciler is still running a grace after its cancel: it caught it.
 * End the process as SIGTERM does (a FATAL, which no exception block
 * catches); the transaction, and with it the record's lock, goes with it,
 * and ReportAbandonedCall says so.  The worker's launcher starts another
 * worker; a session calling idem_reconcile() or idem_maintain() ends.
 */
static void
ReconcilerKillHandler(void)
{
	if (reconciler_in_call && !proc_exit_inprogress)
	{
		reconciler_abandoned = true;
		InterruptPending = true;
		ProcDiePending = true;
	}
	SetLatch(MyLatch);
}

/*
 * At the exit of a process that ended a reconciler call which caught its
 * cancel: the WARNING that names the key (after the FATAL that ended it).
 */
static void
ReportAbandonedCall(int code, Datum arg)
{
	if (!reconciler_abandoned || call_key == NULL)
		return;
	reconciler_abandoned = false;
	/* the context of the interrupted function says nothing more here */
	error_context_stack = NULL;

	/*
	 * Logged at every log_min_messages that shows more than the FATAL: at
	 * LOG where a WARNING is not (log, error), as PostgreSQL ranks them
	 */
	ereport(log_min_messages == LOG || log_min_messages > WARNING ? LOG : WARNING,
			(errcode(ERRCODE_QUERY_CANCELED),
			 errmsg("reconciler %s did not end at its time limit for idempotency key \"%s\"",
					call_handler, call_key),
			 errdetail("Operation \"%s\", scope \"%s\". The call went on after it was cancelled at idempotency.reconciler_timeout (%d ms), so its process was ended.",
					   call_operation, call_scope, idem_reconciler_timeout_ms),
			 errhint("The record stays stuck; the worker calls the reconciler again after a delay that grows with each failure (view idem_reconciler_status).  A reconciler must not catch query_canceled.")));
}

/* Replace a string of the current call, kept in TopMemoryContext */
static void
SetCallString(char **field, const char *value)
{
	if (*field != NULL)
		pfree(*field);
	*field = MemoryContextStrdup(TopMemoryContext, value);
}

/*
 * Start the clocks of one call of the reconciler of rec: the cancel at
 * idempotency.reconciler_timeout, and the end of the process a grace
 * later, which no reconciler can catch or put off.
 */
static void
ReconcilerTimerStart(StuckRecord *rec)
{
	EnableTimeoutParams timeouts[2];
	int			grace = Min(IDEM_RECONCILER_GRACE_MS, idem_reconciler_timeout_ms / 2);

	if (reconciler_timeout_id == MAX_TIMEOUTS)
	{
		reconciler_timeout_id = RegisterTimeout(USER_TIMEOUT, ReconcilerTimeoutHandler);
		reconciler_kill_id = RegisterTimeout(USER_TIMEOUT, ReconcilerKillHandler);
	}
	if (!call_exit_registered)
	{
		before_shmem_exit(ReportAbandonedCall, (Datum) 0);
		call_exit_registered = true;
	}
	SetCallString(&call_handler, rec->rc.handler);
	SetCallString(&call_operation, text_to_cstring(rec->rc.operation));
	SetCallString(&call_scope, text_to_cstring(rec->scope));
	SetCallString(&call_key, text_to_cstring(rec->key));

	reconciler_timed_out = false;
	reconciler_in_call = true;
	timeouts[0].id = reconciler_timeout_id;
	timeouts[0].type = TMPARAM_AFTER;
	timeouts[0].delay_ms = idem_reconciler_timeout_ms;
	timeouts[1].id = reconciler_kill_id;
	timeouts[1].type = TMPARAM_AFTER;
	timeouts[1].delay_ms = (int) Min((int64) idem_reconciler_timeout_ms + grace, INT_MAX);
	enable_timeouts(timeouts, 2);
}

/*
 * Stop them; true when the cancel fired.  A cancel it raised after the
 * reconciler returned is dropped: it was meant for the call only.
 */
static bool
ReconcilerTimerStop(void)
{
	DisableTimeoutParams timeouts[2];

	reconciler_in_call = false;
	timeouts[0].id = reconciler_timeout_id;
	timeouts[0].keep_indicator = false;
	timeouts[1].id = reconciler_kill_id;
	timeouts[1].keep_indicator = false;
	disable_timeouts(timeouts, 2);
	if (!reconciler_timed_out)
		return false;
	QueryCancelPending = false;
	return true;
}

/*
 * Reconcile one stuck record in a subtransaction, with the record locked
 * (FetchStuckRow): while the reconciler runs, the application cannot settle
 * it behind its back (its idem_complete waits, then finds it settled).
 * Each call gets idempotency.reconciler_timeout: one that runs longer is
 * cancelled and reported like one that raised.  A cancel of the session's
 * own (statement_timeout, pg_cancel_backend) ends the unit.
 */
/* One reconciler call, for CallInSubtransaction */
typedef struct ReconcilerCall
{
	StuckRecord *rec;
	Datum		row;
	bool		called;			/* not skipped by IdemReconcilerCall's checks */
	bool		quiet;			/* a skip is reported once per cause (worker) */
} ReconcilerCall;

/* Call the reconciler with the clock of idempotency.reconciler_timeout */
static void
ReconcilerCallRun(void *arg)
{
	ReconcilerCall *c = (ReconcilerCall *) arg;

	ReconcilerTimerStart(c->rec);
	c->called = IdemReconcilerCall(maint_catalog.nspid, &c->rec->rc, c->row,
								   c->quiet);
	(void) ReconcilerTimerStop();
}

static ReconcileResult
ReconcileOne(StuckRecord *rec, bool quiet)
{
	ReconcilerCall call = {rec, (Datum) 0, false, quiet};
	ErrorData  *edata;
	bool		timed_out;

	call.row = FetchStuckRow(rec);
	if (call.row == (Datum) 0)
		return RECONCILE_GONE;

	/* noted first, so that it stays if the process ends in the call */
	IdemBackoffBegin(rec->scope, rec->rc.operation, rec->key);
	edata = CallInSubtransaction(ReconcilerCallRun, &call);
	if (edata == NULL)
	{
		IdemBackoffEnd(rec->scope, rec->rc.operation, rec->key, NULL);
		return call.called ? RECONCILE_DONE : RECONCILE_SKIPPED;
	}

	/* the clock still runs when the reconciler raised */
	timed_out = ReconcilerTimerStop();
	if (edata->sqlerrcode == ERRCODE_QUERY_CANCELED && !timed_out)
	{
		IdemBackoffEnd(rec->scope, rec->rc.operation, rec->key, NULL);
		ReThrowError(edata);
	}
	IdemBackoffEnd(rec->scope, rec->rc.operation, rec->key,
				   timed_out ? "it was cancelled at idempotency.reconciler_timeout" :
				   psprintf("it raised: %s", edata->message));
	if (timed_out)
		ereport(WARNING,
				(errcode(ERRCODE_QUERY_CANCELED),
				 errmsg("reconciler %s timed out for idempotency key \"%s\"",
						rec->rc.handler, text_to_cstring(rec->key)),
				 errdetail("Operation \"%s\", scope \"%s\". The call was cancelled after idempotency.reconciler_timeout (%d ms).",
						   text_to_cstring(rec->rc.operation),
						   text_to_cstring(rec->scope), idem_reconciler_timeout_ms),
				 errhint("The record stays stuck; the worker calls the reconciler again after a delay that grows with each failure (view idem_reconciler_status)."),
				 edata->context ? errcontext_msg("%s", edata->context) : 0));
	else
		ereport(WARNING,
				(errcode(edata->sqlerrcode),
				 errmsg("reconciler %s failed for idempotency key \"%s\"",
						rec->rc.handler, text_to_cstring(rec->key)),
				 errdetail("Operation \"%s\", scope \"%s\". The reconciler raised: %s",
						   text_to_cstring(rec->rc.operation),
						   text_to_cstring(rec->scope), edata->message),
				 errhint("The record stays stuck; the worker calls the reconciler again after a delay that grows with each failure (view idem_reconciler_status)."),
				 edata->context ? errcontext_msg("%s", edata->context) : 0));
	FreeErrorData(edata);
	return RECONCILE_FAILED;
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

		if (IdemVarlenaEqual(other->rc.operation, rec->rc.operation))
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

/*
 * A unit ended without its work because another transaction holds a lock
 * on table relname: count it, and from SQL say so, once per call
 */
static void
UnitSkipped(PassState *ps, const char *relname)
{
	ps->counts->skipped++;
	if (ps->mode == IDEM_TXN_WORKER || ps->warned_busy)
		return;
	ps->warned_busy = true;
	ereport(WARNING,
			(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
			 errmsg("could not lock table \"%s\" for maintenance", relname),
			 errdetail("Another transaction holds a lock on it that conflicts with maintenance, and maintenance does not wait for it."),
			 errhint("Call it again once that transaction has ended.")));
}

/*
 * Open the catalog for a unit.  When the extension is gone, the unit ends
 * and the pass with it (counts->missing): the worker then reports the
 * database as having no extension, and the launcher stops visiting it.  A
 * shard dropped since the listing ends the unit and that shard's phases
 * (ps->gone), not the pass.  When idem_keys is locked by
 * another transaction, the unit ends too, skipped (counts->skipped), and
 * the phase with it; the next pass tries again.  Called from SQL, the skip
 * is a WARNING, once per call.
 */
static CatalogOpen
UnitOpen(PassState *ps)
{
	CatalogOpen result = OpenCatalog(ps->nspid, ps->relid, true);

	if (result == CATALOG_OPEN)
	{
		if (ps->mode == IDEM_TXN_WORKER)
			BecomeTableOwner(ps);
		return result;
	}
	UnitEnd(ps);
	if (result == CATALOG_MISSING)
		ps->counts->missing = true;
	else if (result == CATALOG_GONE)
		ps->gone = true;
	else
		UnitSkipped(ps, "idem_keys");
	return result;
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
		CatalogOpen opened;

		UnitBegin(ps, "idempotency: deleting expired records");
		if ((opened = UnitOpen(ps)) != CATALOG_OPEN)
			return opened == CATALOG_BUSY;	/* skipped: the next phase */

		/*
		 * A batch of our own need not wait for its WAL flush: if a crash
		 * forgets it, the next pass deletes those records again.
		 */
		if (ps->mode != IDEM_TXN_CALLER)
			(void) set_config_option("synchronous_commit", "off", PGC_SUSET,
									 PGC_S_SESSION, GUC_ACTION_LOCAL, true, 0,
									 false);
		n = RunBatch(ps, SweepBatch, batch,
					 GetCurrentTransactionStartTimestamp(), &lower);
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
		CatalogOpen opened;

		UnitBegin(ps, "idempotency: flagging stuck records");
		if ((opened = UnitOpen(ps)) != CATALOG_OPEN)
			return opened == CATALOG_BUSY;	/* skipped: the next phase */
		cutoff = TimestampTzPlusMilliseconds(GetCurrentTransactionStartTimestamp(),
											 -(int64) idem_processing_timeout_ms);
		n = RunBatch(ps, FlagBatch, batch, cutoff, &lower);
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
	CatalogOpen opened;

	UnitBegin(ps, "idempotency: listing stuck records");
	if ((opened = UnitOpen(ps)) != CATALOG_OPEN)
		return opened == CATALOG_BUSY;
	/* whoever may write idem_reconcilers may LOCK it too */
	if (!LockTableBriefly(maint_catalog.reconcilers_relid, AccessShareLock))
	{
		UnitEnd(ps);
		UnitSkipped(ps, "idem_reconcilers");
		return true;
	}
	stuck = ListStuck(BatchSize(ps), ps->passcxt);
	UnitEnd(ps);

	foreach(lc, stuck)
	{
		StuckRecord *rec = (StuckRecord *) lfirst(lc);
		ReconcileResult r;

		if (rec->skip)
			continue;
		/* the worker leaves a record whose reconciler failed for a while */
		if (ps->mode == IDEM_TXN_WORKER &&
			IdemBackoffWaiting(rec->scope, rec->rc.operation, rec->key))
			continue;
		if (StopRequested(ps, 0))
			return false;
		UnitBegin(ps, "idempotency: calling a reconciler");
		if ((opened = UnitOpen(ps)) != CATALOG_OPEN)
			return opened == CATALOG_BUSY;	/* skipped: the next phase */
		r = ReconcileOne(rec, ps->mode == IDEM_TXN_WORKER);
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

	/*
	 * With Citus, records.c opens idem_keys to ask for its shards: take
	 * that lock as a unit's (an application's LOCK TABLE idem_keys, in
	 * ACCESS EXCLUSIVE mode, holds it)
	 */
	if (OidIsValid(nspid) && IdemCitusInstalled())
	{
		Oid			keys = get_relname_relid("idem_keys", nspid);

		if (OidIsValid(keys) && !LockTableBriefly(keys, AccessShareLock))
		{
			UnitEnd(ps);
			UnitSkipped(ps, "idem_keys");
			return NIL;
		}
	}
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
	ps.reccxt = AllocSetContextCreate(ps.passcxt,
									  "idempotency maintenance record",
									  ALLOCSET_SMALL_SIZES);
	ps.warned_sweep = false;
	ps.warned_flag = false;
	ps.warned_busy = false;
	ps.gone = false;
	ps.rec_set = false;
	MemoryContextSwitchTo(ps.passcxt);

	foreach(lc, PassRelations(&ps))
	{
		ps.relid = lfirst_oid(lc);
		ps.bad = NIL;			/* row locations are per relation */
		ps.gone = false;
		/* A phase that ends the pass, unless only its shard is gone */
		if ((!((phases & PHASE_SWEEP) == 0 || SweepPhase(&ps)) ||
			 !((phases & PHASE_FLAG) == 0 || FlagPhase(&ps)) ||
			 !((phases & PHASE_RECONCILE) == 0 || ReconcilePhase(&ps))) &&
			!ps.gone)
			break;
	}

	MemoryContextSwitchTo(oldcxt);
	MemoryContextDelete(ps.passcxt);
}

/*
 * Refuse a maintenance function called from inside a reconciler call: its
 * pass would run its own reconciler calls, whose clocks would replace the
 * running call's, and the call could outlive idempotency.reconciler_timeout.
 */
static void
PreventInReconciler(const char *function)
{
	if (reconciler_in_call)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("%s cannot be called from a reconciler", function),
				 errdetail("A reconciler runs inside a maintenance pass, under that pass's time limit.")));
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
	PreventInReconciler("idem_sweep()");

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
	PreventInReconciler("idem_flag_stuck()");

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
	PreventInReconciler("idem_reconcile()");

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
	PreventInReconciler("idem_maintain()");

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
	(void) OpenCatalog(nspid, InvalidOid, false);

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
