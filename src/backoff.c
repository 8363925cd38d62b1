/*-------------------------------------------------------------------------
 *
 * backoff.c
 *	  What went wrong with reconcilers, in shared memory: the stuck records
 *	  whose reconciler failed, timed out or had its process ended, each
 *	  tried again after a growing delay, and the operations whose
 *	  reconciler was skipped, with the cause last reported; the
 *	  idem_reconciler_status() function behind the view of that name.
 *
 * A record's entry is written before each call of its reconciler
 * (IdemBackoffBegin: one more attempt, its next one not before a delay,
 * and "its process ended during the call" as the reason), so that a call
 * whose process is ended still leaves it behind; after the call it is
 * removed (the reconciler returned) or given the reason (it raised or
 * timed out).  The worker passes over a record whose next attempt is not
 * due (IdemBackoffWaiting), so that one stubborn reconciler costs only its
 * own record; idem_reconcile() and idem_maintain() call every record, as a
 * retry by hand.  An operation's entry records why its reconciler was
 * skipped; the worker reports a skip once per change of that cause, or
 * once per processing_timeout (IdemSkipNoted), and the entry goes when the
 * reconciler is next called.
 *
 * Storage and locking: a fixed array of IDEM_BACKOFF_ENTRIES entries,
 * requested and attached through chained hooks as status.c does, and one
 * LWLock.  When the array is full, the entry seen longest ago gives way.
 * Records written around the API (fields longer than it accepts) are not
 * tracked.  Nothing survives a restart, and nothing here changes an
 * answer to a client: only when the worker calls a reconciler.  Without
 * preloading there is no array, and every function here does nothing.
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
#include "utils/builtins.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "idempotency.h"
#include "maintenance.h"

PG_FUNCTION_INFO_V1(idem_reconciler_status);

#define IDEM_BACKOFF_NAME			"idempotency reconciler backoff"
#define IDEM_BACKOFF_ENTRIES		256
#define IDEM_BACKOFF_REASON_LEN		256
#define IDEM_BACKOFF_CAUSE_LEN		64

/* The delay after a record's first failed call, doubled after each, and its cap */
#define IDEM_BACKOFF_FIRST_MS		(10 * 1000)
#define IDEM_BACKOFF_MAX_MS			(60 * 60 * 1000)

/* Columns of idem_reconciler_status() */
#define IDEM_BACKOFF_COLS			10

typedef struct BackoffEntry
{
	Oid			dboid;			/* InvalidOid: unused */
	bool		skipped;		/* an operation skipped, not a record */
	char		operation[IDEM_MAX_OPERATION_LEN + 1];
	char		scope[IDEM_MAX_SCOPE_LEN + 1];
	char		key[IDEM_MAX_KEY_LEN + 1];
	char		cause[IDEM_BACKOFF_CAUSE_LEN];	/* skipped: what and who */
	char		reason[IDEM_BACKOFF_REASON_LEN];
	int32		attempts;		/* failed calls, or passes that skipped */
	TimestampTz since;			/* first of them (with this cause) */
	TimestampTz last;			/* latest of them */
	TimestampTz next_attempt;	/* a record: not called before */
	TimestampTz reported;		/* skipped: last WARNING */
} BackoffEntry;

typedef struct BackoffShared
{
	LWLock	   *lock;
	BackoffEntry entries[IDEM_BACKOFF_ENTRIES];
} BackoffShared;

static BackoffShared *backoff = NULL;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/* shmem_request_hook: our share after the previous hook's */
static void
BackoffShmemRequest(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(MAXALIGN(sizeof(BackoffShared)));
	RequestNamedLWLockTranche(IDEM_BACKOFF_NAME, 1);
}

/* shmem_startup_hook: create or attach the array */
static void
BackoffShmemStartup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	backoff = ShmemInitStruct(IDEM_BACKOFF_NAME, sizeof(BackoffShared), &found);
	if (!found)
	{
		memset(backoff, 0, sizeof(BackoffShared));
		backoff->lock = &(GetNamedLWLockTranche(IDEM_BACKOFF_NAME))->lock;
	}
	LWLockRelease(AddinShmemInitLock);
}

/* When preloaded, register the shared memory */
void
IdemBackoffInit(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = BackoffShmemRequest;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = BackoffShmemStartup;
}

/* Copy t into a field of size len; false when it does not fit */
static bool
CopyField(char *field, int len, const text *t)
{
	int			n;

	if (t == NULL)
	{
		field[0] = '\0';
		return true;
	}
	n = VARSIZE_ANY_EXHDR(t);
	if (n >= len)
		return false;
	memcpy(field, VARDATA_ANY(t), n);
	field[n] = '\0';
	return true;
}

/* The identity of an entry: database, kind, operation, scope and key */
typedef struct BackoffKey
{
	bool		skipped;
	char		operation[IDEM_MAX_OPERATION_LEN + 1];
	char		scope[IDEM_MAX_SCOPE_LEN + 1];
	char		key[IDEM_MAX_KEY_LEN + 1];
} BackoffKey;

/* Fill k; false when a field is longer than the API accepts */
static bool
MakeKey(BackoffKey *k, bool skipped, const text *operation, const text *scope,
		const text *key)
{
	k->skipped = skipped;
	return CopyField(k->operation, sizeof(k->operation), operation) &&
		CopyField(k->scope, sizeof(k->scope), skipped ? NULL : scope) &&
		CopyField(k->key, sizeof(k->key), skipped ? NULL : key);
}

/*
 * The entry of k in this database, or NULL; with create, a new one (a
 * free one, else the one seen longest ago).  The caller holds the lock,
 * exclusively to create.
 */
static BackoffEntry *
FindEntry(const BackoffKey *k, bool create)
{
	BackoffEntry *unused = NULL;
	BackoffEntry *oldest = NULL;
	BackoffEntry *e;
	int			i;

	for (i = 0; i < IDEM_BACKOFF_ENTRIES; i++)
	{
		e = &backoff->entries[i];
		if (e->dboid == InvalidOid)
		{
			if (unused == NULL)
				unused = e;
			continue;
		}
		if (e->dboid == MyDatabaseId && e->skipped == k->skipped &&
			strcmp(e->operation, k->operation) == 0 &&
			strcmp(e->scope, k->scope) == 0 && strcmp(e->key, k->key) == 0)
			return e;
		if (oldest == NULL || e->last < oldest->last)
			oldest = e;
	}
	if (!create)
		return NULL;
	e = unused != NULL ? unused : oldest;
	memset(e, 0, sizeof(*e));
	e->dboid = MyDatabaseId;
	e->skipped = k->skipped;
	strlcpy(e->operation, k->operation, sizeof(e->operation));
	strlcpy(e->scope, k->scope, sizeof(e->scope));
	strlcpy(e->key, k->key, sizeof(e->key));
	return e;
}

/* Is the record's next attempt not due yet? */
bool
IdemBackoffWaiting(const text *scope, const text *operation, const text *key)
{
	BackoffKey	k;
	BackoffEntry *e;
	bool		waiting = false;

	if (backoff == NULL || !MakeKey(&k, false, operation, scope, key))
		return false;
	LWLockAcquire(backoff->lock, LW_SHARED);
	e = FindEntry(&k, false);
	if (e != NULL && e->next_attempt > GetCurrentTimestamp())
		waiting = true;
	LWLockRelease(backoff->lock);
	return waiting;
}

/*
 * Before a call of the record's reconciler: one more attempt, the next
 * not before a delay that doubles with each, and the reason that stays if
 * the process ends during the call.
 */
void
IdemBackoffBegin(const text *scope, const text *operation, const text *key)
{
	BackoffKey	k;
	BackoffEntry *e;
	TimestampTz now = GetCurrentTimestamp();
	int64		delay = IDEM_BACKOFF_FIRST_MS;
	int			i;

	if (backoff == NULL || !MakeKey(&k, false, operation, scope, key))
		return;
	LWLockAcquire(backoff->lock, LW_EXCLUSIVE);
	e = FindEntry(&k, true);
	if (e->attempts == 0)
		e->since = now;
	e->attempts++;
	for (i = 1; i < e->attempts && delay < IDEM_BACKOFF_MAX_MS; i++)
		delay *= 2;
	e->last = now;
	e->next_attempt = TimestampTzPlusMilliseconds(now, Min(delay, IDEM_BACKOFF_MAX_MS));
	strlcpy(e->reason, "its process was ended during the call", sizeof(e->reason));
	LWLockRelease(backoff->lock);
}

/*
 * After the call: reason NULL, the reconciler returned (or was skipped):
 * the record is called at every pass again; otherwise why it failed.
 */
void
IdemBackoffEnd(const text *scope, const text *operation, const text *key,
			   const char *reason)
{
	BackoffKey	k;
	BackoffEntry *e;

	if (backoff == NULL || !MakeKey(&k, false, operation, scope, key))
		return;
	LWLockAcquire(backoff->lock, LW_EXCLUSIVE);
	e = FindEntry(&k, false);
	if (e != NULL && reason == NULL)
		memset(e, 0, sizeof(*e));
	else if (e != NULL)
		strlcpy(e->reason, reason, sizeof(e->reason));
	LWLockRelease(backoff->lock);
}

/*
 * The reconciler of operation is skipped for cause (what and who, as a
 * short string) and reason (for the view).  true when it should be
 * reported: the cause changed, or it was last reported processing_timeout
 * ago or more.  Without shared memory, always.
 */
bool
IdemSkipNoted(const text *operation, const char *cause, const char *reason)
{
	BackoffKey	k;
	BackoffEntry *e;
	TimestampTz now = GetCurrentTimestamp();
	bool		report;

	if (backoff == NULL || !MakeKey(&k, true, operation, NULL, NULL))
		return true;
	LWLockAcquire(backoff->lock, LW_EXCLUSIVE);
	e = FindEntry(&k, true);
	report = e->attempts == 0 ||
		strncmp(e->cause, cause, sizeof(e->cause) - 1) != 0 ||
		TimestampDifferenceExceeds(e->reported, now, idem_processing_timeout_ms);
	if (e->attempts == 0 || strncmp(e->cause, cause, sizeof(e->cause) - 1) != 0)
	{
		e->attempts = 0;
		e->since = now;
	}
	e->attempts++;
	e->last = now;
	strlcpy(e->cause, cause, sizeof(e->cause));
	strlcpy(e->reason, reason, sizeof(e->reason));
	if (report)
		e->reported = now;
	LWLockRelease(backoff->lock);
	return report;
}

/* The reconciler of operation is called again: forget its skip */
void
IdemSkipForget(const text *operation)
{
	BackoffKey	k;
	BackoffEntry *e;

	if (backoff == NULL || !MakeKey(&k, true, operation, NULL, NULL))
		return;
	LWLockAcquire(backoff->lock, LW_SHARED);
	e = FindEntry(&k, false);
	LWLockRelease(backoff->lock);
	if (e == NULL)
		return;
	LWLockAcquire(backoff->lock, LW_EXCLUSIVE);
	e = FindEntry(&k, false);
	if (e != NULL)
		memset(e, 0, sizeof(*e));
	LWLockRelease(backoff->lock);
}

/*
 * idem_reconciler_status() → SETOF (datid, state, operation, scope, key,
 * reason, attempts, since, last, next_attempt): the skipped reconcilers
 * and backed-off records of every database.  Who may call it is decided
 * by GRANTs in the install script.
 */
Datum
idem_reconciler_status(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	int			i;

	if (backoff == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idempotency reconciler status is not available"),
				 errdetail("The status of reconcilers is kept in shared memory only when the \"idempotency\" library is loaded at server start."),
				 errhint("Add \"idempotency\" to \"shared_preload_libraries\" in postgresql.conf and restart the server.")));

	InitMaterializedSRF(fcinfo, 0);
	if (rsinfo->setDesc->natts != IDEM_BACKOFF_COLS)
		elog(ERROR, "idem_reconciler_status() returns %d columns, expected %d",
			 rsinfo->setDesc->natts, IDEM_BACKOFF_COLS);

	LWLockAcquire(backoff->lock, LW_SHARED);
	for (i = 0; i < IDEM_BACKOFF_ENTRIES; i++)
	{
		BackoffEntry *e = &backoff->entries[i];
		Datum		values[IDEM_BACKOFF_COLS];
		bool		nulls[IDEM_BACKOFF_COLS];
		int			c = 0;

		if (e->dboid == InvalidOid)
			continue;
		memset(nulls, false, sizeof(nulls));
		values[c++] = ObjectIdGetDatum(e->dboid);
		values[c++] = CStringGetTextDatum(e->skipped ? "skipped" : "backed off");
		values[c++] = CStringGetTextDatum(e->operation);
		nulls[c] = e->skipped;
		values[c++] = CStringGetTextDatum(e->scope);
		nulls[c] = e->skipped;
		values[c++] = CStringGetTextDatum(e->key);
		values[c++] = CStringGetTextDatum(e->reason);
		values[c++] = Int32GetDatum(e->attempts);
		values[c++] = TimestampTzGetDatum(e->since);
		values[c++] = TimestampTzGetDatum(e->last);
		nulls[c] = e->skipped;
		values[c++] = TimestampTzGetDatum(e->next_attempt);
		Assert(c == IDEM_BACKOFF_COLS);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	LWLockRelease(backoff->lock);
	return (Datum) 0;
}
