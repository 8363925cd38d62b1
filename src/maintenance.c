/*-------------------------------------------------------------------------
 *
 * maintenance.c
 *	  The maintenance pass the background worker runs in each database, and
 *	  the SQL functions idem_sweep, idem_flag_stuck, idem_reconcile,
 *	  idem_maintain and idem_set_reconciler, which run the same routines;
 *	  only who owns the transactions differs (IdemTxnMode).
 *
 * A pass has three phases, each made of short units of work: sweep and flag
 * (a batch per unit, batches.c), then reconcile (one reconciler call per
 * unit, with the record locked FOR UPDATE SKIP LOCKED; reconcile.c makes
 * the call, under a time limit no reconciler can disarm).  In worker and
 * procedure mode every unit is its own transaction; called from SQL, the
 * units run in the caller's.  Between units the worker may pause or end
 * the pass (worker.c).  A reconciler that fails costs only its record: a
 * WARNING names the key, and the worker leaves the record for a growing
 * delay (backoff.c).
 *
 * Locks: each unit locks idem_keys (or its Citus shard) by OID without
 * joining its lock queue (OpenCatalog, LockTableBriefly: about 100 ms of
 * conditional tries); when an application holds a conflicting lock the
 * unit is skipped and counted (UnitSkipped) and the next pass tries again;
 * idem_reconcilers likewise for the reconcile phase.  A concurrent DROP
 * EXTENSION ends a worker pass quietly.
 *
 * Rights: the SQL functions run as their caller; the worker does each unit
 * as the owner of idem_keys, security-restricted (BecomeTableOwner), as
 * VACUUM runs as a table's owner.  Sweep batches of the worker and of
 * idem_maintain commit with synchronous_commit off: a crash may forget
 * the last of them, and the next pass deletes those records again.
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

/* The installation served, and its plans (OpenCatalog) */
MaintCatalog maint_catalog;

/* A stuck record with a reconciler, as listed at the start of the phase */
typedef struct StuckRecord
{
	text	   *scope;
	text	   *key;
	IdemReconciler rc;			/* rc.operation is the record's operation */
	bool		skip;			/* its reconciler was skipped in this pass */
} StuckRecord;

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
	expires = IdemExpiryIndex(table.rel, table.attnum[COL_EXPIRES_AT], &unusable);
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

	IdemReconcilerTimerStart(&c->rec->rc, c->rec->scope, c->rec->key);
	c->called = IdemReconcilerCall(maint_catalog.nspid, &c->rec->rc, c->row,
								   c->quiet);
	(void) IdemReconcilerTimerStop();
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
	edata = IdemCallInSubtransaction(ReconcilerCallRun, &call);
	if (edata == NULL)
	{
		IdemBackoffEnd(rec->scope, rec->rc.operation, rec->key, NULL);
		return call.called ? RECONCILE_DONE : RECONCILE_SKIPPED;
	}

	/* the clock still runs when the reconciler raised */
	timed_out = IdemReconcilerTimerStop();
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
		n = IdemRunBatch(ps, IdemSweepBatch, batch,
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
		n = IdemRunBatch(ps, IdemFlagBatch, batch, cutoff, &lower);
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
	IdemPreventInReconciler("idem_sweep()");

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
	IdemPreventInReconciler("idem_flag_stuck()");

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
	IdemPreventInReconciler("idem_reconcile()");

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
	IdemPreventInReconciler("idem_maintain()");

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
