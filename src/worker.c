/*-------------------------------------------------------------------------
 *
 * worker.c
 *	  The background worker and its settings: one launcher for the cluster
 *	  and short-lived workers, each running one maintenance pass
 *	  (maintenance.c) in one database.
 *
 * Design
 * ------
 * The launcher is a static background worker registered from _PG_init
 * under shared_preload_libraries.  Like autovacuum's launcher it connects
 * to no database and reads only the shared catalog pg_database.  Every
 * idempotency.sweep_interval it queues each database that accepts
 * connections, is not a template and may have the extension, and starts a
 * dynamic worker for each, at most idempotency.max_workers at a time; the
 * postmaster tells it when one exits (bgw_notify_pid).  A worker connects
 * to its database, leaves at once unless the extension is installed there,
 * runs one pass and exits.  Slots: the launcher plus at most max_workers
 * workers, out of max_worker_processes.
 *
 * Which databases have the extension
 * ----------------------------------
 * The launcher remembers, in its own memory, each database whose last
 * visit found no extension (the worker reports it through status.c), and
 * visits it again only when something says the extension may have come:
 *	- its pg_database row is new or changed (CREATE DATABASE, which may copy
 *	  a template that has the extension; ALTER DATABASE);
 *	- the launcher restarted, knowing nothing (a server restart, such as
 *	  the one after pg_upgrade, whose dump creates extensions without
 *	  CREATE EXTENSION's script);
 *	- a hint: in every backend of a preloading server an object_access_hook
 *	  notes CREATE EXTENSION, and once a transaction that created ours has
 *	  committed (so a worker started from then on sees it) its database is
 *	  hinted in shared memory and the launcher's latch set.  The launcher
 *	  then visits it at once, not at the next round.
 * A hint only brings a visit forward; the visit finds out.  A CREATE
 * EXTENSION rolled back hints nothing.  A prepared transaction hints at
 * PREPARE, for good: its commit runs no callback of ours, so that database
 * is visited every round until the launcher restarts, even one the
 * launcher has not listed yet (Citus adds a node, or propagates CREATE
 * EXTENSION, with two-phase commit, often right after CREATE DATABASE).
 * DROP EXTENSION is found by the next visit, and ALTER EXTENSION changes
 * nothing here.  A database that has the extension is visited every round.
 * So every database that has it is served with no configuration, including
 * one created or installed after start-up, and the others cost nothing.
 *
 * Databases that go away
 * ----------------------
 * Connecting to a database dropped after the launcher listed it would fail
 * with FATAL.  So before connecting, a worker takes, for its whole life and
 * without waiting, the lock a connecting backend takes (RowExclusiveLock on
 * the database object), then checks that the database's directory exists.
 * DROP DATABASE needs AccessExclusiveLock on that object and removes the
 * directory before it commits: once the lock is held and the directory is
 * there, the database cannot vanish under the worker.  If the lock is busy
 * (DROP DATABASE, ALTER DATABASE RENAME or SET TABLESPACE, CREATE DATABASE
 * copying it) the worker leaves quietly and the database waits for the next
 * round.  Between units of work the worker ends its pass when someone waits
 * for that lock; inside a unit (a batch, a reconciler call) a timeout looks
 * at the lock's wait mask every IDEM_WANTED_POLL_MS and ends the process as
 * SIGTERM does, as DROP DATABASE ends an autovacuum worker.  So such a
 * command waits on the worker a few seconds at most, whatever a reconciler
 * does.  The lock goes only when the worker exits, after it has left the
 * ProcArray, so DROP DATABASE never finds it still connected.  A dropped extension ends a
 * pass quietly too (maintenance.c).
 *
 * Yielding
 * --------
 * While client sessions are running queries or sit inside a transaction,
 * a worker sleeps after each batch so that its batches take at most
 * idempotency.sweep_duty_cycle percent of its time; on an otherwise idle
 * server it runs its batches back to back.  A backlog is then cleared at
 * full speed when nobody waits for the CPU, and slowly when the
 * application needs it.
 *
 * What a pass did
 * ---------------
 * A worker records its pass in shared memory (status.c, the
 * idem_worker_status view) and logs a summary: at LOG when the pass did
 * something and took at least idempotency.log_pass_min_duration, or
 * skipped a unit (idem_keys locked) or had a record's write fail, else at
 * DEBUG1.  The launcher records when its next round is due, and at each
 * round (once a minute while paused) forgets the shared-memory entries,
 * statistics and status, of databases that were dropped.
 *
 * Signals and standby
 * -------------------
 * SIGTERM: die(), so a running batch or reconciler call ends at once (a
 * FATAL, which no exception block catches); between units the processes
 * exit without a FATAL message.  SIGHUP reloads the settings
 * (launcher: interval, enabled, max_workers; a running worker: enabled,
 * batch size and duty cycle).  Both are registered with
 * BgWorkerStart_RecoveryFinished: nothing runs on a standby, and the
 * launcher starts when one is promoted.
 * The launcher is restarted IDEM_LAUNCHER_RESTART_S after a crash; after a
 * crash of any server process, at once with the rest of the server.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>
#include <sys/stat.h>

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/relscan.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/objectaccess.h"
#include "catalog/pg_database.h"
#include "catalog/pg_extension.h"
#include "commands/extension.h"
#include "common/relpath.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lock.h"
#include "storage/pmsignal.h"
#include "tcop/tcopprot.h"
#include "utils/backend_status.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timeout.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

#include "idempotency.h"

PGDLLEXPORT void idem_launcher_main(Datum main_arg);
PGDLLEXPORT void idem_worker_main(Datum main_arg);

/* idempotency.sweep_interval, in milliseconds */
int			idem_sweep_interval_ms = 10000;

/* idempotency.sweep_batch_size */
int			idem_sweep_batch_size = 10000;

/* idempotency.enabled */
bool		idem_worker_enabled = true;

/* idempotency.max_workers */
int			idem_max_workers = 2;

/* idempotency.sweep_duty_cycle, in percent */
int			idem_sweep_duty_cycle = 10;

/* idempotency.log_pass_min_duration, in milliseconds; -1 disables */
static int	idem_log_pass_min_duration = 0;

/* Longest pause between two batches, in milliseconds */
#define IDEM_MAX_YIELD_MS			1000

/* Seconds before the postmaster restarts a launcher that exited with error */
#define IDEM_LAUNCHER_RESTART_S		5

/* Upper bound of idempotency.max_workers */
#define IDEM_MAX_WORKERS_LIMIT		64

/* datconnlimit of a database left invalid by an interrupted DROP DATABASE */
#define IDEM_DATCONNLIMIT_INVALID	(-2)

/* A database waiting for a worker */
typedef struct QueuedDatabase
{
	Oid			dboid;
	Oid			spcoid;			/* its default tablespace */
	NameData	name;
} QueuedDatabase;

/* A worker the launcher started and has not seen exit yet */
typedef struct RunningWorker
{
	Oid			dboid;
	BackgroundWorkerHandle *handle;
} RunningWorker;

/*
 * What the launcher knows of a database it listed, whether it may visit it
 * or not: where its last visit found no extension, it is visited again
 * only when something says the extension may have come (see the file
 * header).
 */
typedef struct KnownDatabase
{
	Oid			dboid;			/* hash key */
	TransactionId xmin;			/* of its pg_database row, as last read */
	uint64		scan;			/* the last ScanDatabases that listed it */
	bool		absent;			/* its last visit found no extension */
	bool		hinted;			/* the extension may have been created since */
	bool		sticky;			/* ... by a prepared transaction: never absent */
} KnownDatabase;

/* What ScanDatabases queues */
typedef enum ScanMode
{
	SCAN_FORGET,				/* nothing: only forget dropped databases */
	SCAN_HINTED,				/* databases new or hinted since the round */
	SCAN_ROUND					/* every one that may have the extension */
} ScanMode;

/* Launcher state, in launcher_cxt */
static MemoryContext launcher_cxt;
static HTAB *known_databases;
static uint64 scan_count;
static bool hints_waiting;		/* a hinted database was busy: look again */
static QueuedDatabase *queue;
static int	queue_len;
static int	queue_cap;
static RunningWorker running[IDEM_MAX_WORKERS_LIMIT];
static int	nrunning;
static bool slots_warned;

/* Worker state: the lock on its database held for the whole visit */
static LOCKTAG visit_locktag;

/*
 * ... its entry in the shared lock table, and the lock modes that conflict
 * with it, for DatabaseWantedHandler; visit_lock is NULL once released
 */
static LOCK *volatile visit_lock = NULL;
static LOCKMASK visit_conflicts;
static volatile sig_atomic_t database_wanted = false;

/* How often a worker looks for commands waiting for its database, in ms */
#define IDEM_WANTED_POLL_MS			100

/* Any backend: this transaction created an extension (HintLauncher) */
static object_access_hook_type prev_object_access_hook = NULL;
static bool extension_created = false;
static bool hint_at_commit = false;
static bool hint_callback_registered = false;

/* Wait events of the launcher's sleep and of a worker's pause */
static uint32 launcher_wait_event = PG_WAIT_EXTENSION;
static uint32 worker_wait_event = PG_WAIT_EXTENSION;

/*
 * Transaction callback of a backend whose transaction created an
 * extension: once the transaction has committed, and so is visible to any
 * snapshot taken from then on, hint its database to the launcher if the
 * extension is ours.  Whether it is is asked before the commit, while
 * catalogs can still be read; a CREATE EXTENSION rolled back, to a
 * savepoint or with the whole transaction, leaves no extension to find.
 * Whoever commits a prepared transaction gets no callback of ours, so
 * PREPARE hints at once, for good (sticky).
 */
static void
HintLauncher(XactEvent event, void *arg)
{
	if (!extension_created)
		return;
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
			hint_at_commit = OidIsValid(get_extension_oid("idempotency", true));
			break;
		case XACT_EVENT_PRE_PREPARE:
			if (OidIsValid(get_extension_oid("idempotency", true)))
				IdemStatusHintDatabase(MyDatabaseId, true);
			break;
		case XACT_EVENT_COMMIT:
			if (hint_at_commit)
				IdemStatusHintDatabase(MyDatabaseId, false);
			extension_created = false;
			hint_at_commit = false;
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PREPARE:
			extension_created = false;
			hint_at_commit = false;
			break;
		default:
			break;
	}
}

/*
 * object_access_hook: note that this transaction created an extension, for
 * HintLauncher, which is registered the first time.
 */
static void
NoteExtensionCreated(ObjectAccessType access, Oid classId, Oid objectId,
					 int subId, void *arg)
{
	if (prev_object_access_hook)
		prev_object_access_hook(access, classId, objectId, subId, arg);

	if (access != OAT_POST_CREATE || classId != ExtensionRelationId)
		return;
	if (!hint_callback_registered)
	{
		RegisterXactCallback(HintLauncher, NULL);
		hint_callback_registered = true;
	}
	extension_created = true;
}

/* Define the worker's settings; register the launcher when preloaded */
void
IdemWorkerInit(void)
{
	BackgroundWorker worker;

	DefineCustomIntVariable("idempotency.sweep_interval",
							"Time between two maintenance passes of the background worker.",
							"Each pass visits every database that has the extension: it deletes expired records, flags stuck ones and calls reconcilers.",
							&idem_sweep_interval_ms,
							10000,
							10,
							INT_MAX,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.sweep_batch_size",
							"Records deleted or flagged per transaction by the maintenance pass.",
							"Also the default batch size of idem_sweep and the most reconciler calls per pass.",
							&idem_sweep_batch_size,
							10000,
							1,
							1000000,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);

	DefineCustomBoolVariable("idempotency.enabled",
							 "Runs the background worker's maintenance passes.",
							 "Off pauses the worker; the SQL maintenance functions still work.",
							 &idem_worker_enabled,
							 true,
							 PGC_SIGHUP,
							 0,
							 NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.max_workers",
							"Maximum number of databases the background worker maintains at the same time.",
							"Each takes a background worker slot (max_worker_processes) while it runs, besides the launcher's.",
							&idem_max_workers,
							2,
							1,
							IDEM_MAX_WORKERS_LIMIT,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.sweep_duty_cycle",
							"Share of time the worker spends in batches while other sessions are busy, in percent.",
							"While client sessions are running queries, the worker sleeps after each batch so that its batches take at most this share of its time; on an otherwise idle server it does not pause.  100 never pauses.",
							&idem_sweep_duty_cycle,
							10,
							1,
							100,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.log_pass_min_duration",
							"Logs each maintenance pass that did something and took at least this long.",
							"A pass that deleted, flagged or reconciled records is logged at LOG with what it did; 0 logs every such pass, -1 none.  Other passes are logged at DEBUG1.",
							&idem_log_pass_min_duration,
							0,
							-1,
							INT_MAX,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	if (!process_shared_preload_libraries_in_progress)
		return;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = IDEM_LAUNCHER_RESTART_S;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "idempotency");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "idem_launcher_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "idempotency launcher");
	snprintf(worker.bgw_type, BGW_MAXLEN, "idempotency launcher");
	RegisterBackgroundWorker(&worker);

	prev_object_access_hook = object_access_hook;
	object_access_hook = NoteExtensionCreated;
}

/* Is the database queued or being visited already? */
static bool
DatabaseKnown(Oid dboid)
{
	int			i;

	for (i = 0; i < queue_len; i++)
		if (queue[i].dboid == dboid)
			return true;
	for (i = 0; i < nrunning; i++)
		if (running[i].dboid == dboid)
			return true;
	return false;
}

/* Is dboid one of the n in list? */
static bool
OidInList(Oid dboid, const Oid *list, int n)
{
	int			i;

	for (i = 0; i < n; i++)
		if (list[i] == dboid)
			return true;
	return false;
}

/* Queue a database for a worker */
static void
QueueDatabase(Form_pg_database db)
{
	if (queue_len == queue_cap)
	{
		queue_cap = Max(16, queue_cap * 2);
		queue = queue == NULL ?
			MemoryContextAlloc(launcher_cxt, queue_cap * sizeof(QueuedDatabase)) :
			repalloc(queue, queue_cap * sizeof(QueuedDatabase));
	}
	queue[queue_len].dboid = db->oid;
	queue[queue_len].spcoid = db->dattablespace;
	queue[queue_len].name = db->datname;
	queue_len++;
}

/* Forget the entries of the known databases that are not among the live ones */
static void
ForgetDroppedDatabases(const Oid *known, int nknown, const Oid *live, int nlive,
					   void (*forget) (Oid dboid))
{
	int			i;

	for (i = 0; i < nknown; i++)
		if (!OidInList(known[i], live, nlive))
			forget(known[i]);
}

/*
 * The launcher's entry of a database listed in pg_database with row
 * version xmin; *changed when it is new, or its row changed since the last
 * listing (CREATE DATABASE reusing an OID, ALTER DATABASE): nothing known
 * of it holds any more.
 */
static KnownDatabase *
NoteDatabase(Oid dboid, TransactionId xmin, bool *changed)
{
	KnownDatabase *k;
	bool		found;

	k = hash_search(known_databases, &dboid, HASH_ENTER, &found);
	*changed = !found || k->xmin != xmin;
	if (!found)
		k->sticky = false;
	if (*changed)
	{
		k->xmin = xmin;
		k->absent = false;
		k->hinted = false;
	}
	k->scan = scan_count;
	return k;
}

/* Should a scan in this mode queue the database? */
static bool
VisitDue(const KnownDatabase *k, bool changed, ScanMode mode)
{
	switch (mode)
	{
		case SCAN_ROUND:
			return !k->absent || k->hinted;
		case SCAN_HINTED:
			return changed || k->hinted;
		case SCAN_FORGET:
			break;
	}
	return false;
}

/* Forget the launcher's entries of the databases the last scan did not list */
static void
ForgetUnlistedDatabases(void)
{
	HASH_SEQ_STATUS seq;
	KnownDatabase *k;

	hash_seq_init(&seq, known_databases);
	while ((k = hash_seq_search(&seq)) != NULL)
		if (k->scan != scan_count)
			(void) hash_search(known_databases, &k->dboid, HASH_REMOVE, NULL);
}

/*
 * Take the hints of CREATE EXTENSION from shared memory into the launcher's
 * entries; true when there was any.  A database not listed yet needs no
 * plain hint: it is new, and visited anyway.  But a prepared transaction's
 * hint is kept in a new entry: that first visit may come before COMMIT
 * PREPARED and find no extension, and nothing would hint again (Citus
 * creates the extension on a node it adds, or propagates CREATE EXTENSION
 * to, with two-phase commit, often right after CREATE DATABASE).
 */
static bool
TakeHints(void)
{
	IdemHint	hints[IDEM_STATUS_MAX_HINTS];
	bool		lost;
	int			n = IdemStatusTakeHints(hints, &lost);
	int			i;

	for (i = 0; i < n; i++)
	{
		KnownDatabase *k = hash_search(known_databases, &hints[i].dboid,
									   HASH_FIND, NULL);

		if (k == NULL)
		{
			if (!hints[i].sticky)
				continue;
			/* NoteDatabase finds its xmin changed, and keeps sticky */
			k = hash_search(known_databases, &hints[i].dboid, HASH_ENTER, NULL);
			k->xmin = InvalidTransactionId;
			k->scan = scan_count;
			k->absent = false;
			k->sticky = false;
		}
		k->hinted = true;
		k->sticky |= hints[i].sticky;
	}
	if (lost)
	{
		HASH_SEQ_STATUS seq;
		KnownDatabase *k;

		hash_seq_init(&seq, known_databases);
		while ((k = hash_seq_search(&seq)) != NULL)
			k->hinted = true;
	}
	return n > 0 || lost;
}

/*
 * Take the reports of workers that found no extension: their databases are
 * not visited again until a hint, a change of their row or a restart of the
 * launcher.  Called right after the workers that exited are forgotten, so
 * the report of a worker is in before its database can be queued again.
 */
static void
TakeAbsentReports(void)
{
	Oid		   *dbids;
	int			n = IdemStatusTakeAbsent(&dbids);
	int			i;

	for (i = 0; i < n; i++)
	{
		KnownDatabase *k = hash_search(known_databases, &dbids[i], HASH_FIND, NULL);

		if (k != NULL && !k->sticky)
			k->absent = true;
	}
	if (dbids != NULL)
		pfree(dbids);
}

/*
 * Read pg_database, note each database in the launcher's entries, and
 * queue those the mode says, unless queued or visited now (a hinted one
 * then waits for the next scan: hints_waiting).  Always forget the
 * launcher's entries and the shared-memory entries (statistics, worker
 * status) of databases that are gone: the databases having shared entries
 * are listed before the catalog snapshot is taken, so one that pg_database
 * does not show was dropped; a database created meanwhile can only have
 * entries made after the listing.
 */
static void
ScanDatabases(ScanMode mode)
{
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tuple;
	Oid		   *stats_dbs;
	Oid		   *status_dbs;
	int			nstats;
	int			nstatus;
	Oid		   *live;
	int			nlive = 0;
	int			live_cap = 16;

	nstats = IdemStatsDatabases(&stats_dbs);
	nstatus = IdemStatusDatabases(&status_dbs);
	scan_count++;
	hints_waiting = false;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	(void) GetTransactionSnapshot();

	live = palloc(live_cap * sizeof(Oid));
	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while ((tuple = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		Form_pg_database db = (Form_pg_database) GETSTRUCT(tuple);
		KnownDatabase *k;
		bool		changed;

		if (nlive == live_cap)
		{
			live_cap *= 2;
			live = repalloc(live, live_cap * sizeof(Oid));
		}
		live[nlive++] = db->oid;
		k = NoteDatabase(db->oid, HeapTupleHeaderGetRawXmin(tuple->t_data),
						 &changed);

		/* Templates are skipped: a connection would block CREATE DATABASE */
		if (!db->datallowconn || db->datistemplate ||
			db->datconnlimit == IDEM_DATCONNLIMIT_INVALID ||
			!VisitDue(k, changed, mode))
			continue;
		if (DatabaseKnown(db->oid))
		{
			hints_waiting |= k->hinted;
			continue;
		}
		/* Until this visit reports otherwise, the extension is there */
		QueueDatabase(db);
		k->absent = false;
		k->hinted = false;
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);

	ForgetUnlistedDatabases();
	ForgetDroppedDatabases(stats_dbs, nstats, live, nlive, IdemStatsForgetDatabase);
	ForgetDroppedDatabases(status_dbs, nstatus, live, nlive, IdemStatusForgetDatabase);

	CommitTransactionCommand();
	MemoryContextSwitchTo(launcher_cxt);
	if (stats_dbs != NULL)
		pfree(stats_dbs);
	if (status_dbs != NULL)
		pfree(status_dbs);
}

/* Forget the workers that have exited */
static void
ReapWorkers(void)
{
	int			i = 0;

	while (i < nrunning)
	{
		pid_t		pid;

		switch (GetBackgroundWorkerPid(running[i].handle, &pid))
		{
			case BGWH_STOPPED:
				pfree(running[i].handle);
				running[i] = running[--nrunning];
				continue;
			case BGWH_POSTMASTER_DIED:
				proc_exit(1);
				break;
			default:
				break;
		}
		i++;
	}
	TakeAbsentReports();
}

/* Start workers for queued databases while slots are free */
static void
StartWorkers(void)
{
	while (queue_len > 0 && nrunning < idem_max_workers)
	{
		QueuedDatabase *db = &queue[0];
		BackgroundWorker worker;
		BackgroundWorkerHandle *handle;

		memset(&worker, 0, sizeof(worker));
		worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
		worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
		worker.bgw_restart_time = BGW_NEVER_RESTART;
		snprintf(worker.bgw_library_name, BGW_MAXLEN, "idempotency");
		snprintf(worker.bgw_function_name, BGW_MAXLEN, "idem_worker_main");
		snprintf(worker.bgw_name, BGW_MAXLEN, "idempotency worker for database %s",
				 NameStr(db->name));
		snprintf(worker.bgw_type, BGW_MAXLEN, "idempotency worker");
		worker.bgw_main_arg = ObjectIdGetDatum(db->dboid);
		memcpy(worker.bgw_extra, &db->spcoid, sizeof(Oid));
		worker.bgw_notify_pid = MyProcPid;

		if (!RegisterDynamicBackgroundWorker(&worker, &handle))
		{
			/* Try again when one of ours exits or at the next round */
			if (!slots_warned)
				ereport(LOG,
						(errmsg("idempotency launcher could not start a worker: no background worker slot is free"),
						 errhint("Raise max_worker_processes; the extension needs one slot for its launcher and up to idempotency.max_workers (%d) more.",
								 idem_max_workers)));
			slots_warned = true;
			return;
		}
		slots_warned = false;
		ereport(DEBUG1,
				(errmsg_internal("idempotency launcher started a worker for database \"%s\"",
								 NameStr(db->name))));

		running[nrunning].dboid = db->dboid;
		running[nrunning].handle = handle;
		nrunning++;
		queue_len--;
		memmove(&queue[0], &queue[1], queue_len * sizeof(QueuedDatabase));
	}
}

/* Milliseconds from now until then, at least 1 */
static long
MillisecondsUntil(TimestampTz now, TimestampTz then)
{
	long		secs;
	int			usecs;

	if (then <= now)
		return 1;
	TimestampDifference(now, then, &secs, &usecs);
	if (secs >= LONG_MAX / 1000 - 1)
		return LONG_MAX / 1000 - 1;
	return Max(1, secs * 1000 + usecs / 1000);
}

/* At the launcher's exit: hints have no latch to set any more */
static void
ForgetLauncherLatch(int code, Datum arg)
{
	IdemStatusSetLauncher(NULL);
}

/* Entry point of the launcher */
void
idem_launcher_main(Datum main_arg)
{
	bool		have_round = false;
	TimestampTz last_round = 0;
	HASHCTL		ctl;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	/* No database: like autovacuum's launcher, only shared catalogs */
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);

	launcher_wait_event = IdemWaitEventNew("IdempotencyLauncherMain");

	launcher_cxt = AllocSetContextCreate(TopMemoryContext,
										 "idempotency launcher",
										 ALLOCSET_DEFAULT_SIZES);
	MemoryContextSwitchTo(launcher_cxt);

	/*
	 * Nothing is known of any database yet, so every one is visited once:
	 * a restart covers what no hint tells, such as pg_upgrade, whose dump
	 * creates extensions without running CREATE EXTENSION's script.  Notes
	 * left for an earlier launcher are dropped.
	 */
	ctl.keysize = sizeof(Oid);
	ctl.entrysize = sizeof(KnownDatabase);
	ctl.hcxt = launcher_cxt;
	known_databases = hash_create("idempotency launcher databases", 64, &ctl,
								  HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	before_shmem_exit(ForgetLauncherLatch, (Datum) 0);
	IdemStatusSetLauncher(MyLatch);
	(void) TakeHints();
	TakeAbsentReports();

	ereport(DEBUG1, (errmsg_internal("idempotency launcher started")));

	for (;;)
	{
		TimestampTz now;
		long		timeout_ms;

		/* Shutdown or pg_terminate_backend while idle: leave without FATAL */
		if (ProcDiePending)
			proc_exit(1);
		CHECK_FOR_INTERRUPTS();

		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}

		ReapWorkers();
		now = GetCurrentTimestamp();

		if (!idem_worker_enabled || RecoveryInProgress())
		{
			/*
			 * Paused: forget the queue; enabling starts a round at once.
			 * Dropped databases are still forgotten, once a minute.
			 */
			queue_len = 0;
			have_round = false;
			timeout_ms = 60 * 1000L;
			IdemStatusReportRound(0);
			if (!RecoveryInProgress())
				ScanDatabases(SCAN_FORGET);
		}
		else
		{
			TimestampTz next_round;
			bool		hinted = TakeHints();

			if (!have_round ||
				now >= TimestampTzPlusMilliseconds(last_round, idem_sweep_interval_ms))
			{
				ScanDatabases(SCAN_ROUND);
				last_round = now;
				have_round = true;
			}
			else if (hinted || hints_waiting)
				ScanDatabases(SCAN_HINTED);
			StartWorkers();
			next_round = TimestampTzPlusMilliseconds(last_round, idem_sweep_interval_ms);
			IdemStatusReportRound(next_round);
			timeout_ms = MillisecondsUntil(now, next_round);
		}

		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 timeout_ms, launcher_wait_event);
		ResetLatch(MyLatch);
	}
}

/*
 * At exit, after we left the ProcArray, release the lock on the database.
 * Nothing else would on a normal exit: session locks are released only by
 * transaction abort, and a leftover would stay attached to the PGPROC the
 * next process gets.  A worker that exits on an ERROR has aborted its
 * transaction, which released the lock already.
 */
static void
ReleaseVisitLock(int code, Datum arg)
{
	visit_lock = NULL;
	if (IdemLockHeldByMe(&visit_locktag, RowExclusiveLock))
		LockRelease(&visit_locktag, RowExclusiveLock, true);
}

/*
 * Take the lock a connecting backend takes on the database, for the whole
 * visit and without waiting, and check that the database still exists
 * (see the file header).  false: leave without connecting.
 */
static bool
LockDatabaseForVisit(Oid dboid, Oid spcoid)
{
	struct stat st;
	LOCALLOCK  *locallock;

	SET_LOCKTAG_OBJECT(visit_locktag, InvalidOid, DatabaseRelationId, dboid, 0);
	if (IdemLockAcquireExtended(&visit_locktag, RowExclusiveLock, true, true,
								&locallock) == LOCKACQUIRE_NOT_AVAIL)
	{
		elog(DEBUG1, "idempotency worker: database %u is busy, skipped", dboid);
		return false;
	}
	visit_conflicts = GetLocksMethodTable(locallock->lock)->conflictTab[RowExclusiveLock];
	visit_lock = locallock->lock;

	/*
	 * Registered before InitPostgres registers its own exit callbacks, so it
	 * runs after them (in reverse order), once we are out of the ProcArray.
	 */
	on_shmem_exit(ReleaseVisitLock, (Datum) 0);
	if (stat(GetDatabasePath(dboid, spcoid), &st) != 0 || !S_ISDIR(st.st_mode))
	{
		elog(DEBUG1, "idempotency worker: database %u no longer exists", dboid);
		return false;
	}
	return true;
}

/*
 * Every IDEM_WANTED_POLL_MS of a visit: is a command (DROP DATABASE, with
 * or without FORCE, ALTER DATABASE RENAME or SET TABLESPACE, CREATE
 * DATABASE copying it) waiting for the lock the worker holds on its
 * database?  Then end the worker as SIGTERM does, wherever it is, inside
 * a reconciler too, as the command would end an autovacuum worker: it
 * waits for the poll and the exit only.  The lock's wait mask is read
 * without its partition lock: a waiter seen one poll late costs 100 ms.
 */
static void
DatabaseWantedHandler(void)
{
	LOCK	   *lock = visit_lock;

	if (lock == NULL || (lock->waitMask & visit_conflicts) == 0)
		return;
	database_wanted = true;
	if (!proc_exit_inprogress)
	{
		InterruptPending = true;
		ProcDiePending = true;
	}
	SetLatch(MyLatch);
}

/* At the exit of a worker ended by DatabaseWantedHandler: say why */
static void
ReportDatabaseWanted(int code, Datum arg)
{
	if (!database_wanted)
		return;
	database_wanted = false;
	error_context_stack = NULL;
	ereport(LOG,
			(errmsg("%s ended its pass: a command is waiting for the database",
					MyBgworkerEntry->bgw_name)));
}

/* Is any client session running a query or inside a transaction now? */
static bool
ClientsBusy(void)
{
	int			n = pgstat_fetch_stat_numbackends();
	bool		busy = false;
	int			i;

	for (i = 1; i <= n && !busy; i++)
	{
		LocalPgBackendStatus *local = pgstat_get_local_beentry_by_index(i);
		PgBackendStatus *be;

		if (local == NULL)
			continue;
		be = &local->backendStatus;
		if (be->st_backendType != B_BACKEND || be->st_procpid == MyProcPid)
			continue;
		busy = (be->st_state == STATE_RUNNING ||
				be->st_state == STATE_FASTPATH ||
				be->st_state == STATE_IDLEINTRANSACTION);
	}
	pgstat_clear_snapshot();
	return busy;
}

/*
 * Yield to busy client sessions after a batch that took batch_us: sleep so
 * that batches take at most idempotency.sweep_duty_cycle percent of the
 * time.  On an otherwise idle server, no pause.
 */
static void
YieldAfterBatch(int64 batch_us)
{
	int64		sleep_ms;

	if (batch_us <= 0 || idem_sweep_duty_cycle >= 100 || !ClientsBusy())
		return;
	sleep_ms = batch_us * (100 - idem_sweep_duty_cycle) / idem_sweep_duty_cycle / 1000;
	sleep_ms = Min(Max(sleep_ms, 1), IDEM_MAX_YIELD_MS);
	(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
					 sleep_ms, worker_wait_event);
	ResetLatch(MyLatch);
}

/* Between units of a worker's pass: pause, exit, or end the pass? */
static bool
WorkerShouldStop(int64 batch_us)
{
	YieldAfterBatch(batch_us);

	/* Shutdown or pg_terminate_backend: no transaction is open, leave */
	if (ProcDiePending)
		proc_exit(0);
	CHECK_FOR_INTERRUPTS();
	if (!PostmasterIsAlive())
		proc_exit(1);

	if (ConfigReloadPending)
	{
		ConfigReloadPending = false;
		ProcessConfigFile(PGC_SIGHUP);
	}
	if (!idem_worker_enabled)
		return true;

	/* DROP DATABASE or the like waits for us: let it go */
	return LockHasWaiters(&visit_locktag, RowExclusiveLock, true);
}

/*
 * Log what a pass did: at LOG when it did something and took at least
 * idempotency.log_pass_min_duration, else at DEBUG1.
 */
static void
ReportPass(const IdemPassCounts *counts, TimestampTz start, TimestampTz end)
{
	long		ms = (long) ((end - start) / 1000);
	bool		worked = counts->deleted > 0 || counts->flagged > 0 ||
		counts->reconciled > 0 || counts->failed > 0;
	bool		troubled = counts->skipped > 0 || counts->write_errors > 0;
	int			elevel = DEBUG1;

	/* A skip or a failed write is logged whatever the duration */
	if (troubled ||
		(worked && idem_log_pass_min_duration >= 0 &&
		 ms >= idem_log_pass_min_duration))
		elevel = LOG;

	ereport(elevel,
			(errmsg("%s: deleted %lld expired records, flagged %lld stuck, reconciled %lld (%lld failed) in %ld ms; %lld batches, longest %.3f ms; %lld skipped, %lld write errors",
					MyBgworkerEntry->bgw_name,
					(long long) counts->deleted,
					(long long) counts->flagged,
					(long long) counts->reconciled,
					(long long) counts->failed,
					ms,
					(long long) counts->batches,
					counts->longest_batch_us / 1000.0,
					(long long) counts->skipped,
					(long long) counts->write_errors),
			 counts->stopped ?
			 errdetail("The pass ended before its work was done: idempotency.enabled was turned off, or a command was waiting for the database.") :
			 counts->skipped > 0 ?
			 errdetail("Some work was skipped because another transaction held a lock on table \"idem_keys\"; the next pass tries again.") : 0));
}

/* Entry point of a worker: one maintenance pass in one database */
void
idem_worker_main(Datum main_arg)
{
	Oid			dboid = DatumGetObjectId(main_arg);
	Oid			spcoid;
	TimestampTz start;
	TimestampTz end;
	IdemPassCounts counts;

	memcpy(&spcoid, MyBgworkerEntry->bgw_extra, sizeof(Oid));
	worker_wait_event = IdemWaitEventNew("IdempotencyWorkerYield");

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	if (!LockDatabaseForVisit(dboid, spcoid))
		proc_exit(0);

	/* The launcher checked datallowconn; a change since must not fail us */
	BackgroundWorkerInitializeConnectionByOid(dboid, InvalidOid,
											  BGWORKER_BYPASS_ALLOWCONN);

	if (RecoveryInProgress() || !idem_worker_enabled)
		proc_exit(0);

	/* From now on, a command that waits for the database ends the visit */
	before_shmem_exit(ReportDatabaseWanted, (Datum) 0);
	enable_timeout_every(RegisterTimeout(USER_TIMEOUT, DatabaseWantedHandler),
						 TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
													 IDEM_WANTED_POLL_MS),
						 IDEM_WANTED_POLL_MS);

	/*
	 * Per-database settings must not cancel our batches, make them read
	 * only or change their isolation; reconcilers may still SET their own.
	 */
	SetConfigOption("statement_timeout", "0", PGC_SUSET, PGC_S_SESSION);
	SetConfigOption("lock_timeout", "0", PGC_SUSET, PGC_S_SESSION);
	SetConfigOption("idle_in_transaction_session_timeout", "0", PGC_SUSET, PGC_S_SESSION);
	SetConfigOption("default_transaction_isolation", "read committed", PGC_SUSET, PGC_S_SESSION);
	SetConfigOption("default_transaction_read_only", "off", PGC_SUSET, PGC_S_SESSION);

	/*
	 * The worker is a superuser, and the triggers, CHECK constraints and
	 * index expressions of idem_keys run inside its writes: a search_path
	 * from ALTER DATABASE or ALTER ROLE must not choose what they call.
	 * Reconcilers get their own pinned path (maintenance.c).
	 */
	SetConfigOption("search_path", "pg_catalog, pg_temp", PGC_SUSET, PGC_S_SESSION);

	start = GetCurrentTimestamp();
	IdemMaintainDatabase(IDEM_TXN_WORKER, InvalidOid, WorkerShouldStop, &counts);
	end = GetCurrentTimestamp();

	if (counts.missing)
	{
		/*
		 * Not installed here, or dropped during the pass: no status, and no
		 * visit until the launcher hears that it may be back
		 */
		IdemStatusForgetDatabase(MyDatabaseId);
		IdemStatusReportAbsent(MyDatabaseId);
		if (counts.batches == 0)
			proc_exit(0);
	}
	else
		IdemStatusReportPass(MyDatabaseId, start, end, &counts);
	ReportPass(&counts, start, end);
	proc_exit(0);
}
