/*-------------------------------------------------------------------------
 *
 * stats.c
 *	  Shared-memory statistics: counters per (database, operation), the
 *	  idem_stats() function behind the idem_stats view, idem_stats_reset(),
 *	  and the settings idempotency.track_stats and
 *	  idempotency.stats_max_operations.
 *
 * Storage
 * -------
 * With shared_preload_libraries = 'idempotency', a shared hash table keyed by
 * (database oid, operation) holds one entry per counted operation: the
 * counters of IdemCounter and the time the entry started counting.  Space is
 * requested from shmem_request_hook and the table is attached in
 * shmem_startup_hook; both hooks chain
 * to the previous ones.  Counters live in memory only and start from zero
 * when the server starts.
 *
 * A call is counted when it returns, whether or not its transaction commits
 * later: the counters describe what clients asked and were answered, like
 * pg_stat_statements' calls.  reserves is not stored but computed when read,
 * as the sum of the five outcome counters (see IdemStatsCount).
 *
 * Size limit
 * ----------
 * idempotency.stats_max_operations bounds the entries of named operations,
 * over all databases.  Once they are all in use, an operation without an
 * entry is counted in its database's overflow entry, which idem_stats shows
 * as the row whose operation is NULL; a database's totals stay exact.  There
 * is room for as many overflow entries as named ones, so only when more
 * databases than that overflow at the same time are calls not counted; each
 * backend then says so once in the server log.  Counting never raises an
 * error.  idem_stats_reset() removes the entries of the current database,
 * which frees their room.
 *
 * Dropped databases
 * -----------------
 * The entries of a dropped database are removed by the background worker's
 * launcher, which lists pg_database at each round anyway (worker.c): it
 * takes the list of databases that have entries here first, then reads
 * pg_database with a newer snapshot, so a database it does not find there
 * had entries before the snapshot and is gone.  A standby has no launcher
 * and keeps such entries until it is promoted or restarted.
 *
 * Locking
 * -------
 * - IdemStatsShared->lock, one LWLock, protects the hash table and the
 *   entry counts in IdemStatsShared.  Counting and reading take it in shared
 *   mode; only creating an entry (the first call of an operation, or of the
 *   overflow entry) and idem_stats_reset() take it exclusively.
 * - The counters are 64-bit atomics, added to while holding the lock in
 *   shared mode, so backends counting the same operation never wait for one
 *   another.  Each counter is exact; a reader sees each one at a slightly
 *   different instant (a completion may show before its reservation's
 *   outcome, never a lost count).
 * - Entries are removed only under the exclusive lock, so an entry found
 *   under the shared lock stays valid until the lock is released.
 *
 * Without preloading there is no shared memory: IdemStatsCount returns at
 * once, and idem_stats() and idem_stats_reset() raise an error that names
 * shared_preload_libraries.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "common/hashfn.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "idempotency.h"

PG_FUNCTION_INFO_V1(idem_stats);
PG_FUNCTION_INFO_V1(idem_stats_reset);

/* Name of the LWLock tranche and of the shared memory structures */
#define IDEM_STATS_NAME			"idempotency stats"

/* Columns of idem_stats(): operation, the counters, stats_reset */
#define IDEM_STATS_COLS			(IDEM_NUM_COUNTERS + 2)

/* Hash key: the overflow entry of a database has an empty operation */
typedef struct IdemStatsKey
{
	Oid			dbid;
	char		operation[IDEM_MAX_OPERATION_LEN + 1];	/* zero-padded */
} IdemStatsKey;

/* One operation's counters */
typedef struct IdemStatsEntry
{
	IdemStatsKey key;			/* hash key; must be first */
	TimestampTz since;			/* when this entry started counting */
	pg_atomic_uint64 counters[IDEM_NUM_COUNTERS];
} IdemStatsEntry;

/* Shared state next to the hash table */
typedef struct IdemStatsShared
{
	LWLock	   *lock;			/* see the file header */
	int			named;			/* entries of named operations */
	int			overflow;		/* overflow entries */
} IdemStatsShared;

/* idempotency.track_stats */
static bool idem_track_stats = true;

/* idempotency.stats_max_operations */
static int	idem_stats_max_operations = 1000;

/* Set in every backend when the server was started with us preloaded */
static IdemStatsShared *idem_stats_shared = NULL;
static HTAB *idem_stats_hash = NULL;

/* Whether this backend has already logged that a call was not counted */
static bool idem_stats_drop_logged = false;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/* Entries the hash table has room for: named plus overflow */
static long
StatsCapacity(void)
{
	return 2L * idem_stats_max_operations;
}

/* Hash of a key from its parts: only the operation's bytes, not the padding */
static inline uint32
StatsHashParts(Oid dbid, const char *operation, int len)
{
	return hash_bytes((const unsigned char *) operation, len) ^ murmurhash32(dbid);
}

/* The table's hash function, equal to what StatsMakeKey computes */
static uint32
StatsHash(const void *key, Size keysize)
{
	const IdemStatsKey *k = (const IdemStatsKey *) key;

	return StatsHashParts(k->dbid, k->operation,
						  strnlen(k->operation, IDEM_MAX_OPERATION_LEN));
}

/*
 * Build the hash key of an operation (the overflow key when len is 0) and
 * return its hash.
 */
static uint32
StatsMakeKey(IdemStatsKey *key, Oid dbid, const char *operation, int len)
{
	memset(key, 0, sizeof(*key));
	key->dbid = dbid;
	if (len > IDEM_MAX_OPERATION_LEN)
		len = IDEM_MAX_OPERATION_LEN;
	if (len > 0)
		memcpy(key->operation, operation, len);
	return StatsHashParts(dbid, key->operation, len > 0 ? len : 0);
}

/* Is this the key of an overflow entry? */
static inline bool
StatsIsOverflowKey(const IdemStatsKey *key)
{
	return key->operation[0] == '\0';
}

/* Ask the postmaster for our shared memory and our lock */
static void
StatsRequestShmem(void)
{
	RequestAddinShmemSpace(add_size(MAXALIGN(sizeof(IdemStatsShared)),
									hash_estimate_size(StatsCapacity(),
													   sizeof(IdemStatsEntry))));
	RequestNamedLWLockTranche(IDEM_STATS_NAME, 1);
}

/* shmem_request_hook: request our share after the previous hook's */
static void
StatsShmemRequest(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	StatsRequestShmem();
}

/* shmem_startup_hook: create or attach the shared state and hash table */
static void
StatsShmemStartup(void)
{
	HASHCTL		info;
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);

	idem_stats_shared = ShmemInitStruct(IDEM_STATS_NAME,
										sizeof(IdemStatsShared), &found);
	if (!found)
	{
		idem_stats_shared->lock = &(GetNamedLWLockTranche(IDEM_STATS_NAME))->lock;
		idem_stats_shared->named = 0;
		idem_stats_shared->overflow = 0;
	}

	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(IdemStatsKey);
	info.entrysize = sizeof(IdemStatsEntry);
	info.hash = StatsHash;
	idem_stats_hash = IdemShmemInitHash(IDEM_STATS_NAME " hash", StatsCapacity(),
										&info, HASH_ELEM | HASH_FUNCTION);

	LWLockRelease(AddinShmemInitLock);
}

/* Define the settings and, when preloaded, register the shared memory */
void
IdemStatsInit(void)
{
	DefineCustomBoolVariable("idempotency.track_stats",
							 "Counts reservations and their outcomes in idem_stats.",
							 "Needs shared_preload_libraries; without it nothing is counted.",
							 &idem_track_stats,
							 true,
							 PGC_SUSET,
							 0,
							 NULL, NULL, NULL);

	/*
	 * The rest only makes sense at server start; a PGC_POSTMASTER setting
	 * cannot even be defined later.
	 */
	if (!process_shared_preload_libraries_in_progress)
		return;

	DefineCustomIntVariable("idempotency.stats_max_operations",
							"Number of (database, operation) entries idem_stats keeps.",
							"Calls of operations beyond it are counted in a row with operation NULL.",
							&idem_stats_max_operations,
							1000,
							10,
							INT_MAX / 4,
							PGC_POSTMASTER,
							0,
							NULL, NULL, NULL);

	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = StatsShmemRequest;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = StatsShmemStartup;
}

/* Insert a zeroed entry; the caller holds the lock exclusively and checked room */
static IdemStatsEntry *
StatsInsert(const IdemStatsKey *key, uint32 hash)
{
	IdemStatsEntry *entry;
	bool		found;
	int			i;

	entry = hash_search_with_hash_value(idem_stats_hash, key, hash,
										HASH_ENTER_NULL, &found);
	if (entry == NULL || found)
		return entry;

	entry->since = GetCurrentTimestamp();
	for (i = 0; i < IDEM_NUM_COUNTERS; i++)
		pg_atomic_init_u64(&entry->counters[i], 0);
	if (StatsIsOverflowKey(key))
		idem_stats_shared->overflow++;
	else
		idem_stats_shared->named++;
	return entry;
}

/*
 * Find the entry to count an operation in, creating it if needed.  Called
 * without the lock, returns with it held exclusively; NULL when there is no
 * room even for the database's overflow entry.
 */
static IdemStatsEntry *
StatsCreateEntry(IdemStatsKey *key, uint32 hash)
{
	IdemStatsEntry *entry;

	LWLockAcquire(idem_stats_shared->lock, LW_EXCLUSIVE);

	/* Someone may have created it since we looked */
	entry = hash_search_with_hash_value(idem_stats_hash, key, hash,
										HASH_FIND, NULL);
	if (entry != NULL)
		return entry;

	if (!StatsIsOverflowKey(key) &&
		idem_stats_shared->named < idem_stats_max_operations)
		return StatsInsert(key, hash);

	/* No room for another operation: count it in the database's overflow */
	hash = StatsMakeKey(key, key->dbid, NULL, 0);
	entry = hash_search_with_hash_value(idem_stats_hash, key, hash,
										HASH_FIND, NULL);
	if (entry == NULL && idem_stats_shared->overflow < idem_stats_max_operations)
		entry = StatsInsert(key, hash);
	return entry;
}

/*
 * Add n to one counter of an operation in the current database.  The hot
 * path: a shared lock, a hash probe and an atomic add.
 *
 * IDEM_STAT_RESERVES is not stored: every reservation also counts exactly
 * one outcome, so reserves is their sum, computed when read.  That saves a
 * second probe per reservation and keeps reserves equal to the sum of its
 * outcomes in every reading.
 */
void
IdemStatsCount(const char *operation, int operation_len,
			   IdemCounter counter, int64 n)
{
	IdemStatsKey key;
	IdemStatsEntry *entry;
	uint32		hash;

	if (idem_stats_hash == NULL || !idem_track_stats || n == 0 ||
		counter == IDEM_STAT_RESERVES)
		return;
	Assert(counter >= 0 && counter < IDEM_NUM_COUNTERS);

	hash = StatsMakeKey(&key, MyDatabaseId, operation, operation_len);

	LWLockAcquire(idem_stats_shared->lock, LW_SHARED);
	entry = hash_search_with_hash_value(idem_stats_hash, &key, hash,
										HASH_FIND, NULL);
	if (entry == NULL && idem_stats_shared->named >= idem_stats_max_operations)
	{
		/* Table full: the overflow entry, if it exists, takes the count */
		hash = StatsMakeKey(&key, MyDatabaseId, NULL, 0);
		entry = hash_search_with_hash_value(idem_stats_hash, &key, hash,
											HASH_FIND, NULL);
	}
	if (entry == NULL)
	{
		LWLockRelease(idem_stats_shared->lock);
		entry = StatsCreateEntry(&key, hash);
	}
	if (entry != NULL)
		pg_atomic_fetch_add_u64(&entry->counters[counter], n);
	LWLockRelease(idem_stats_shared->lock);

	if (entry == NULL && !idem_stats_drop_logged)
	{
		idem_stats_drop_logged = true;
		ereport(LOG,
				(errmsg("idempotency statistics are full: calls of operation \"%.*s\" are not counted",
						Min(operation_len, IDEM_MAX_OPERATION_LEN), operation),
				 errdetail("All %d overflow entries are in use by other databases.",
						   idem_stats_max_operations),
				 errhint("Increase \"idempotency.stats_max_operations\", or call idem_stats_reset() in databases that no longer need their counters.")));
	}
}

/* Raise the error of a server started without preloading us */
static void
StatsCheckAvailable(void)
{
	if (idem_stats_hash == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idempotency statistics are not enabled"),
				 errdetail("The statistics live in shared memory, which the \"idempotency\" library sets up only when it is loaded at server start."),
				 errhint("Add \"idempotency\" to \"shared_preload_libraries\" in postgresql.conf and restart the server.")));
}

/*
 * idem_stats() → SETOF (operation, reserves, new, replays, in_progress,
 * mismatches, stuck, completes, releases, consumed, duplicates, expired,
 * flagged_stuck, stats_reset): the entries of the current database, the
 * overflow entry with operation NULL.  Who may call it is decided by GRANTs
 * in the install script.
 */
Datum
idem_stats(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	HASH_SEQ_STATUS status;
	IdemStatsEntry *entry;

	StatsCheckAvailable();

	InitMaterializedSRF(fcinfo, 0);
	if (rsinfo->setDesc->natts != IDEM_STATS_COLS)
		elog(ERROR, "idem_stats() returns %d columns, expected %d",
			 rsinfo->setDesc->natts, IDEM_STATS_COLS);

	LWLockAcquire(idem_stats_shared->lock, LW_SHARED);
	hash_seq_init(&status, idem_stats_hash);
	while ((entry = hash_seq_search(&status)) != NULL)
	{
		Datum		values[IDEM_STATS_COLS];
		bool		nulls[IDEM_STATS_COLS];
		int64		counts[IDEM_NUM_COUNTERS];
		int			i;

		if (entry->key.dbid != MyDatabaseId)
			continue;

		memset(nulls, false, sizeof(nulls));
		if (StatsIsOverflowKey(&entry->key))
			nulls[0] = true;
		else
			values[0] = CStringGetTextDatum(entry->key.operation);
		for (i = 0; i < IDEM_NUM_COUNTERS; i++)
			counts[i] = (int64) pg_atomic_read_u64(&entry->counters[i]);
		counts[IDEM_STAT_RESERVES] = counts[IDEM_STAT_NEW] +
			counts[IDEM_STAT_REPLAYS] + counts[IDEM_STAT_IN_PROGRESS] +
			counts[IDEM_STAT_MISMATCHES] + counts[IDEM_STAT_STUCK];
		for (i = 0; i < IDEM_NUM_COUNTERS; i++)
			values[i + 1] = Int64GetDatum(counts[i]);
		values[IDEM_NUM_COUNTERS + 1] = TimestampTzGetDatum(entry->since);

		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	LWLockRelease(idem_stats_shared->lock);

	return (Datum) 0;
}

/* Remove a database's entries, freeing their room */
static void
StatsRemoveDatabase(Oid dbid)
{
	HASH_SEQ_STATUS status;
	IdemStatsEntry *entry;

	LWLockAcquire(idem_stats_shared->lock, LW_EXCLUSIVE);
	hash_seq_init(&status, idem_stats_hash);
	while ((entry = hash_seq_search(&status)) != NULL)
	{
		if (entry->key.dbid != dbid)
			continue;
		if (StatsIsOverflowKey(&entry->key))
			idem_stats_shared->overflow--;
		else
			idem_stats_shared->named--;
		hash_search(idem_stats_hash, &entry->key, HASH_REMOVE, NULL);
	}
	LWLockRelease(idem_stats_shared->lock);
}

/* idem_stats_reset(): remove the current database's entries, freeing their room */
Datum
idem_stats_reset(PG_FUNCTION_ARGS)
{
	StatsCheckAvailable();
	StatsRemoveDatabase(MyDatabaseId);
	PG_RETURN_VOID();
}

/*
 * The databases that have entries, palloc'd; their number.  The launcher
 * lists them before it reads pg_database, and hands those it did not find
 * there to IdemStatsForgetDatabase (see ScanDatabases in
 * worker.c).
 */
int
IdemStatsDatabases(Oid **dbids)
{
	HASH_SEQ_STATUS status;
	IdemStatsEntry *entry;
	int			n = 0;
	int			cap = 16;

	*dbids = NULL;
	if (idem_stats_hash == NULL)
		return 0;
	*dbids = palloc(cap * sizeof(Oid));
	LWLockAcquire(idem_stats_shared->lock, LW_SHARED);
	hash_seq_init(&status, idem_stats_hash);
	while ((entry = hash_seq_search(&status)) != NULL)
	{
		int			i;

		for (i = 0; i < n; i++)
			if ((*dbids)[i] == entry->key.dbid)
				break;
		if (i < n)
			continue;
		if (n == cap)
		{
			cap *= 2;
			*dbids = repalloc(*dbids, cap * sizeof(Oid));
		}
		(*dbids)[n++] = entry->key.dbid;
	}
	LWLockRelease(idem_stats_shared->lock);
	return n;
}

/* Remove the entries of a dropped database */
void
IdemStatsForgetDatabase(Oid dbid)
{
	if (idem_stats_hash != NULL)
		StatsRemoveDatabase(dbid);
}
