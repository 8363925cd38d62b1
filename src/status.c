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
 * Space is requested from shmem_request_hook and attached in
 * shmem_startup_hook, both chained
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
 * Notes for the launcher
 * ----------------------
 * Two short lists tell the launcher which databases to visit (worker.c):
 * a worker that found no extension reports its database as absent, and a
 * backend whose transaction created the extension hints its database at
 * commit and sets the launcher's latch.  The launcher takes both lists
 * whole.  They only move visits: a report that does not fit is dropped
 * (the database stays visited every round), a hint that does not fit makes
 * the launcher look at every database again.
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
#include "storage/latch.h"
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
#define IDEM_STATUS_COLS			20

/* Reports of databases without the extension, waiting for the launcher */
#define IDEM_STATUS_MAX_ABSENT		64

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
	int64		total_skipped;
	int64		total_write_errors;
} IdemStatusEntry;

typedef struct IdemStatusShared
{
	LWLock	   *lock;			/* see the file header */
	TimestampTz next_round;		/* 0: the launcher is paused */
	Latch	   *launcher_latch; /* NULL while no launcher runs */
	int			nhints;
	bool		hints_lost;		/* some did not fit: look at every database */
	IdemHint	hints[IDEM_STATUS_MAX_HINTS];
	int			nabsent;
	Oid			absent[IDEM_STATUS_MAX_ABSENT];
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

/* The launcher tells where its latch is, or NULL as it exits */
void
IdemStatusSetLauncher(Latch *latch)
{
	if (idem_status == NULL)
		return;
	LWLockAcquire(idem_status->lock, LW_EXCLUSIVE);
	idem_status->launcher_latch = latch;
	LWLockRelease(idem_status->lock);
}

/*
 * The extension may have been created in a database: the launcher visits
 * it at once, and with sticky (a prepared transaction, whose commit we do
 * not see) every round from then on.  Wakes the launcher.
 */
void
IdemStatusHintDatabase(Oid dboid, bool sticky)
{
	Latch	   *latch;
	int			i;

	if (idem_status == NULL)
		return;
	LWLockAcquire(idem_status->lock, LW_EXCLUSIVE);
	for (i = 0; i < idem_status->nhints; i++)
		if (idem_status->hints[i].dboid == dboid)
			break;
	if (i < idem_status->nhints)
		idem_status->hints[i].sticky |= sticky;
	else if (i < IDEM_STATUS_MAX_HINTS)
	{
		idem_status->hints[i].dboid = dboid;
		idem_status->hints[i].sticky = sticky;
		idem_status->nhints++;
	}
	else
		idem_status->hints_lost = true;
	latch = idem_status->launcher_latch;
	LWLockRelease(idem_status->lock);

	if (latch != NULL)
		SetLatch(latch);
}

/*
 * The launcher takes the hints into hints (room for IDEM_STATUS_MAX_HINTS);
 * their number.  *lost: some did not fit, any database may have the
 * extension now.
 */
int
IdemStatusTakeHints(IdemHint *hints, bool *lost)
{
	int			n;

	*lost = false;
	if (idem_status == NULL)
		return 0;
	LWLockAcquire(idem_status->lock, LW_EXCLUSIVE);
	n = idem_status->nhints;
	memcpy(hints, idem_status->hints, n * sizeof(IdemHint));
	*lost = idem_status->hints_lost;
	idem_status->nhints = 0;
	idem_status->hints_lost = false;
	LWLockRelease(idem_status->lock);
	return n;
}

/* A worker found no extension in its database; dropped if it does not fit */
void
IdemStatusReportAbsent(Oid dboid)
{
	if (idem_status == NULL)
		return;
	LWLockAcquire(idem_status->lock, LW_EXCLUSIVE);
	if (idem_status->nabsent < IDEM_STATUS_MAX_ABSENT)
		idem_status->absent[idem_status->nabsent++] = dboid;
	LWLockRelease(idem_status->lock);
}

/* The launcher takes the databases reported absent, palloc'd; their number */
int
IdemStatusTakeAbsent(Oid **dbids)
{
	int			n;

	*dbids = NULL;
	if (idem_status == NULL)
		return 0;
	*dbids = palloc(IDEM_STATUS_MAX_ABSENT * sizeof(Oid));
	LWLockAcquire(idem_status->lock, LW_EXCLUSIVE);
	n = idem_status->nabsent;
	memcpy(*dbids, idem_status->absent, n * sizeof(Oid));
	idem_status->nabsent = 0;
	LWLockRelease(idem_status->lock);
	return n;
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
	e->total_skipped += counts->skipped;
	e->total_write_errors += counts->write_errors;
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
 * last_pass_end, deleted, flagged, reconciled, failed, skipped,
 * write_errors, batches, longest_batch, stopped_early, total_deleted,
 * total_flagged, total_reconciled, total_failed, total_skipped,
 * total_write_errors, next_pass_due): one row per database the
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
		values[c++] = Int64GetDatum(e->last.skipped);
		values[c++] = Int64GetDatum(e->last.write_errors);
		values[c++] = Int64GetDatum(e->last.batches);
		values[c++] = IntervalFromMicroseconds(e->last.longest_batch_us);
		values[c++] = BoolGetDatum(e->last.stopped);
		values[c++] = Int64GetDatum(e->total_deleted);
		values[c++] = Int64GetDatum(e->total_flagged);
		values[c++] = Int64GetDatum(e->total_reconciled);
		values[c++] = Int64GetDatum(e->total_failed);
		values[c++] = Int64GetDatum(e->total_skipped);
		values[c++] = Int64GetDatum(e->total_write_errors);
		nulls[c] = idem_status->next_round == 0;
		values[c++] = TimestampTzGetDatum(idem_status->next_round);
		Assert(c == IDEM_STATUS_COLS);

		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	LWLockRelease(idem_status->lock);

	return (Datum) 0;
}
