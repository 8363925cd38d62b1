/*-------------------------------------------------------------------------
 *
 * status.c
 *	  The background worker's state in shared memory: per database, what
 *	  its last maintenance pass did and when, and when the launcher's next
 *	  round is due; the idem_worker_status() function behind the
 *	  idem_worker_status view.
 *
 * Storage
 * -------
 * With shared_preload_libraries = 'idempotency', a fixed array of
 * IDEM_STATUS_MAX_DATABASES entries, one per database a worker has
 * maintained since the server started, and the launcher's next round.
 * Space is requested from shmem_request_hook (PostgreSQL 15 and later;
 * from _PG_init before) and attached in shmem_startup_hook, both chained
 * to the previous hooks, as stats.c does.  Nothing is kept across
 * restarts.
 *
 * Writers are rare: a worker writes its database's entry once, at the end
 * of a pass (worker.c); the launcher writes its next round once a round
 * and removes the entries of dropped databases, which it finds when it
 * lists pg_database.  A database whose extension was dropped loses its
 * entry at the worker's next visit.  When every entry is in use, the
 * database maintained longest ago gives its entry up.
 *
 * Locking
 * -------
 * IdemStatusShared->lock, one LWLock, protects everything here: writers
 * take it exclusively, idem_worker_status() in shared mode.
 *
 * Without preloading there is no shared memory and no worker: the
 * reporting functions return at once and idem_worker_status() raises an
 * error that names shared_preload_libraries.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "idempotency.h"

PG_FUNCTION_INFO_V1(idem_worker_status);

/* Name of the LWLock tranche and of the shared memory structure */
#define IDEM_STATUS_NAME			"idempotency worker status"

/* Databases whose last pass is remembered */
#define IDEM_STATUS_MAX_DATABASES	1024

/* Columns of idem_worker_status() */
#define IDEM_STATUS_COLS			16

/* What the worker did in one database */
typedef struct IdemStatusEntry
{
	Oid			dboid;			/* InvalidOid: unused */
	int64		passes;			/* passes since the server started */
	TimestampTz last_start;
	TimestampTz last_end;
	IdemPassCounts last;		/* what the last pass did */
	int64		total_deleted;	/* sums over all passes */
	int64		total_flagged;
	int64		total_reconciled;
	int64		total_failed;
} IdemStatusEntry;

typedef struct IdemStatusShared
{
	LWLock	   *lock;			/* see the file header */
	TimestampTz next_round;		/* 0: the launcher is paused */
	IdemStatusEntry entries[IDEM_STATUS_MAX_DATABASES];
} IdemStatusShared;

/* Set in every backend when the server was started with us preloaded */
static IdemStatusShared *idem_status = NULL;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/* Ask the postmaster for our shared memory and our lock */
static void
StatusRequestShmem(void)
{
	RequestAddinShmemSpace(MAXALIGN(sizeof(IdemStatusShared)));
	RequestNamedLWLockTranche(IDEM_STATUS_NAME, 1);
}

/* shmem_request_hook: request our share after the previous hook's */
static void
StatusShmemRequest(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	StatusRequestShmem();
}

/* shmem_startup_hook: create or attach the shared state */
static void
StatusShmemStartup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	idem_status = ShmemInitStruct(IDEM_STATUS_NAME, sizeof(IdemStatusShared),
								  &found);
	if (!found)
	{
		memset(idem_status, 0, sizeof(IdemStatusShared));
		idem_status->lock = &(GetNamedLWLockTranche(IDEM_STATUS_NAME))->lock;
	}
	LWLockRelease(AddinShmemInitLock);
}

/* When preloaded, register the shared memory */
void
IdemStatusInit(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;

	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = StatusShmemRequest;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = StatusShmemStartup;
}

/* The launcher's next round; 0 while it is paused */
void
IdemStatusReportRound(TimestampTz next_round)
{
	if (idem_status == NULL)
		return;
	LWLockAcquire(idem_status->lock, LW_EXCLUSIVE);
	idem_status->next_round = next_round;
	LWLockRelease(idem_status->lock);
}

/*
 * The entry of a database, or the one to reuse for it: a free one, else
 * the one maintained longest ago.  The caller holds the lock exclusively.
 */
static IdemStatusEntry *
StatusEntryFor(Oid dboid)
{
	IdemStatusEntry *unused = NULL;
	IdemStatusEntry *oldest = NULL;
	IdemStatusEntry *e;
	int			i;

	for (i = 0; i < IDEM_STATUS_MAX_DATABASES; i++)
	{
		e = &idem_status->entries[i];
		if (e->dboid == dboid)
			return e;
		if (e->dboid == InvalidOid)
		{
			if (unused == NULL)
				unused = e;
		}
		else if (oldest == NULL || e->last_end < oldest->last_end)
			oldest = e;
	}
	e = unused != NULL ? unused : oldest;
	memset(e, 0, sizeof(*e));
	e->dboid = dboid;
	return e;
}

/* A worker's pass over a database ended; remember what it did */
void
IdemStatusReportPass(Oid dboid, TimestampTz start, TimestampTz end,
					 const IdemPassCounts *counts)
{
	IdemStatusEntry *e;

	if (idem_status == NULL)
		return;
	LWLockAcquire(idem_status->lock, LW_EXCLUSIVE);
	e = StatusEntryFor(dboid);
	e->passes++;
	e->last_start = start;
	e->last_end = end;
	e->last = *counts;
	e->total_deleted += counts->deleted;
	e->total_flagged += counts->flagged;
	e->total_reconciled += counts->reconciled;
	e->total_failed += counts->failed;
	LWLockRelease(idem_status->lock);
}

/*
 * The databases that have an entry, palloc'd; their number.  The launcher
 * lists them before it reads pg_database (see ScanDatabases in
 * worker.c).
 */
int
IdemStatusDatabases(Oid **dbids)
{
	int			n = 0;
	int			i;

	*dbids = NULL;
	if (idem_status == NULL)
		return 0;
	*dbids = palloc(IDEM_STATUS_MAX_DATABASES * sizeof(Oid));
	LWLockAcquire(idem_status->lock, LW_SHARED);
	for (i = 0; i < IDEM_STATUS_MAX_DATABASES; i++)
		if (idem_status->entries[i].dboid != InvalidOid)
			(*dbids)[n++] = idem_status->entries[i].dboid;
	LWLockRelease(idem_status->lock);
	return n;
}

/* Remove a database's entry: it was dropped, or its extension was */
void
IdemStatusForgetDatabase(Oid dboid)
{
	int			i;

	if (idem_status == NULL)
		return;
	LWLockAcquire(idem_status->lock, LW_EXCLUSIVE);
	for (i = 0; i < IDEM_STATUS_MAX_DATABASES; i++)
		if (idem_status->entries[i].dboid == dboid)
			memset(&idem_status->entries[i], 0, sizeof(IdemStatusEntry));
	LWLockRelease(idem_status->lock);
}

/* An interval of so many microseconds */
static Datum
IntervalFromMicroseconds(int64 us)
{
	Interval   *iv = palloc0(sizeof(Interval));

	iv->time = us;
	return IntervalPGetDatum(iv);
}

/*
 * idem_worker_status() → SETOF (datid, passes, last_pass_start,
 * last_pass_end, deleted, flagged, reconciled, failed, batches,
 * longest_batch, stopped_early, total_deleted, total_flagged,
 * total_reconciled, total_failed, next_pass_due): one row per database the
 * worker has maintained since the server started.  Who may call it is
 * decided by GRANTs in the install script.
 */
Datum
idem_worker_status(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	int			i;

	if (idem_status == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idempotency worker status is not available"),
				 errdetail("The background worker and its status in shared memory exist only when the \"idempotency\" library is loaded at server start."),
				 errhint("Add \"idempotency\" to \"shared_preload_libraries\" in postgresql.conf and restart the server.")));

	InitMaterializedSRF(fcinfo, 0);
	if (rsinfo->setDesc->natts != IDEM_STATUS_COLS)
		elog(ERROR, "idem_worker_status() returns %d columns, expected %d",
			 rsinfo->setDesc->natts, IDEM_STATUS_COLS);

	LWLockAcquire(idem_status->lock, LW_SHARED);
	for (i = 0; i < IDEM_STATUS_MAX_DATABASES; i++)
	{
		IdemStatusEntry *e = &idem_status->entries[i];
		Datum		values[IDEM_STATUS_COLS];
		bool		nulls[IDEM_STATUS_COLS];
		int			c = 0;

		if (e->dboid == InvalidOid)
			continue;
		memset(nulls, false, sizeof(nulls));
		values[c++] = ObjectIdGetDatum(e->dboid);
		values[c++] = Int64GetDatum(e->passes);
		values[c++] = TimestampTzGetDatum(e->last_start);
		values[c++] = TimestampTzGetDatum(e->last_end);
		values[c++] = Int64GetDatum(e->last.deleted);
		values[c++] = Int64GetDatum(e->last.flagged);
		values[c++] = Int64GetDatum(e->last.reconciled);
		values[c++] = Int64GetDatum(e->last.failed);
		values[c++] = Int64GetDatum(e->last.batches);
		values[c++] = IntervalFromMicroseconds(e->last.longest_batch_us);
		values[c++] = BoolGetDatum(e->last.stopped);
		values[c++] = Int64GetDatum(e->total_deleted);
		values[c++] = Int64GetDatum(e->total_flagged);
		values[c++] = Int64GetDatum(e->total_reconciled);
		values[c++] = Int64GetDatum(e->total_failed);
		nulls[c] = idem_status->next_round == 0;
		values[c++] = TimestampTzGetDatum(idem_status->next_round);
		Assert(c == IDEM_STATUS_COLS);

		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	LWLockRelease(idem_status->lock);

	return (Datum) 0;
}
