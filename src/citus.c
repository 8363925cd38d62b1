/*-------------------------------------------------------------------------
 *
 * citus.c
 *	  Every call into Citus, behind one small interface (idempotency.h,
 *	  "Citus"), so that a Citus release that changes what we rely on
 *	  breaks this file with a clean ERROR, never a crash elsewhere.
 *
 * What we rely on: public SQL of Citus (the catalogs pg_dist_partition,
 * pg_dist_shard, pg_dist_placement and pg_dist_local_group; the functions
 * get_shard_id_for_distribution_column, shard_name(regclass, bigint,
 * boolean) and lock_shard_metadata), and three C functions of Citus's
 * transaction manager, the ones its own local COPY into a shard calls
 * (IdemCitusLocalWrite, below).  The Citus version is checked once per
 * change of pg_extension: releases before IDEM_CITUS_MIN_MAJOR lack some of
 * the above, and releases after IDEM_CITUS_MAX_MAJOR are untested, so both
 * are an ERROR 0A000 when a call would use Citus.
 *
 * The one supported mode: idem_keys distributed by hash of scope
 * (idem_distribute).  A scope's records live in its shard, a plain table
 * on the node that holds it, read and written in the caller's transaction
 * under the shard's metadata lock that Citus's own writers take
 * (ShareLock; a shard move or split holds it exclusively while it copies,
 * so no record is written behind the copy).
 *
 * A write into a local shard is a write Citus's executor did not make, so
 * Citus's transaction manager would not count it: a transaction that also
 * wrote one other node would commit that node's part with one-phase commit,
 * before the local commit, and a crash between the two would keep one and
 * lose the other.  So before each such write (and before a reservation is
 * held to be written later, held.c) IdemCitusLocalWrite tells Citus what
 * its own local execution and its local COPY into a shard tell it
 * (executor/local_executor.c, commands/local_multi_copy.c and
 * multi_copy.c): the transaction must keep to local execution on this node
 * (SetLocalExecutionStatus(LOCAL_EXECUTION_REQUIRED), so that a later
 * statement reads the record here rather than over a connection that would
 * not see it), and it commits with two-phase commit whenever it wrote
 * another node (Use2PCForCoordinatedTransaction): Citus then prepares
 * every other node's part, records the commit here, commits here, and its
 * recovery finishes or rolls back what a crash left prepared.  Citus has
 * no SQL function for either.  A transaction that already reached this
 * node's shards through a connection of Citus's (LOCAL_EXECUTION_DISABLED)
 * could not see our write there, and is refused, as Citus refuses a local
 * execution after it.
 *
 * Which relations are shards of the extension's idem_keys on this node
 * (IdemCitusIsLocalShard, for records.c): Citus's metadata says so, read
 * with the latest snapshot, never the relation's name.
 *
 * Caches: whether Citus is installed (until pg_extension changes),
 * whether idem_keys is distributed, and which relations are its shards on
 * this node (until the relcache entry of idem_keys, or of one of those
 * shards, is invalidated: Citus invalidates that of the distributed table
 * whenever it changes its metadata), and the addresses of Citus's C
 * functions (for the session: the library is preloaded).  Each is marked
 * before its query runs, so that an invalidation that arrives while the
 * query runs leaves nothing cached.
 *
 * Locks taken here: the shard's metadata lock (ShareLock, through
 * lock_shard_metadata, run as the owner of the distributed table as Citus
 * requires) and the shard relation's lock in the caller's mode, both until
 * the end of the transaction.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/table.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "catalog/dependency.h"
#include "catalog/pg_class.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "idempotency.h"

/* The Citus releases whose SQL interface this file was written against */
#define IDEM_CITUS_MIN_MAJOR	12
#define IDEM_CITUS_MAX_MAJOR	13

/* Is Citus installed, and of a supported version?  (IdemCitusInstalled) */
static bool citus_known = false;
static bool citus_installed = false;
static char *citus_unsupported = NULL;	/* its version, when not supported */
static uint64 extension_generation = 0;

/* Is one relid distributed by hash?  (IdemCitusIsDistributed) */
static Oid	distribution_relid = InvalidOid;
static bool distribution_valid = false;
static bool distribution_distributed = false;
static uint64 distribution_generation = 0;

/* The shards of the extension's idem_keys on this node (IdemCitusIsLocalShard) */
static Oid	shards_of = InvalidOid;	/* that idem_keys */
static List *shards_local = NIL;	/* their relations, in TopMemoryContext */
static bool shards_valid = false;
static uint64 shards_generation = 0;

static bool callbacks_registered = false;

/* The prepared statements of this file, kept for the session */
static SPIPlanPtr shard_plan = NULL;
static SPIPlanPtr lock_plan = NULL;
static SPIPlanPtr shards_plan = NULL;

/*
 * Citus's LocalExecutionStatus (distributed/local_executor.h, the same from
 * Citus 12.0 to 13.2), and its functions that IdemCitusLocalWrite calls
 */
typedef enum CitusLocalExecutionStatus
{
	CITUS_LOCAL_EXECUTION_REQUIRED,
	CITUS_LOCAL_EXECUTION_OPTIONAL,
	CITUS_LOCAL_EXECUTION_DISABLED
} CitusLocalExecutionStatus;

typedef CitusLocalExecutionStatus (*GetLocalExecutionStatusFn) (void);
typedef void (*SetLocalExecutionStatusFn) (CitusLocalExecutionStatus status);
typedef void (*Use2PCFn) (void);

static GetLocalExecutionStatusFn citus_get_local_execution_status = NULL;
static SetLocalExecutionStatusFn citus_set_local_execution_status = NULL;
static Use2PCFn citus_use_2pc = NULL;

/* Syscache callback: pg_extension changed, Citus may have come or gone */
static void
ExtensionInvalidate(Datum arg, int cacheid, uint32 hashvalue)
{
	extension_generation++;
	citus_known = false;
	shards_generation++;
	shards_valid = false;
}

/* Relcache callback: the distributed state of idem_keys may have changed */
static void
DistributionInvalidate(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == distribution_relid)
	{
		distribution_generation++;
		distribution_valid = false;
	}
	if (relid == InvalidOid || relid == shards_of || list_member_oid(shards_local, relid))
	{
		shards_generation++;
		shards_valid = false;
	}
}

static void
RegisterCallbacks(void)
{
	if (callbacks_registered)
		return;
	CacheRegisterSyscacheCallback(IDEM_EXTENSION_SYSCACHE, ExtensionInvalidate, (Datum) 0);
	CacheRegisterRelcacheCallback(DistributionInvalidate, (Datum) 0);
	callbacks_registered = true;
}

/*
 * Is Citus installed in this database?  An ERROR when it is, in a version
 * this file was not written for.
 */
bool
IdemCitusInstalled(void)
{
	uint64		generation;
	char	   *version;
	bool		installed;
	char	   *unsupported = NULL;

	RegisterCallbacks();
	if (!citus_known)
	{
		generation = extension_generation;
		version = IdemExtensionVersion("citus", NULL);
		installed = version != NULL;
		if (installed)
		{
			int			major = atoi(version);

			if (major < IDEM_CITUS_MIN_MAJOR || major > IDEM_CITUS_MAX_MAJOR)
				unsupported = MemoryContextStrdup(TopMemoryContext, version);
		}
		if (citus_unsupported)
			pfree(citus_unsupported);
		citus_unsupported = unsupported;
		citus_installed = installed;
		/* an invalidation during the lookup leaves nothing cached */
		citus_known = generation == extension_generation;
	}
	if (citus_installed && citus_unsupported != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("Citus version %s is not supported by extension \"%s\"",
						citus_unsupported, IDEM_EXTENSION_NAME),
				 errdetail("This release of the extension works with Citus %d.0 to %d.x.",
						   IDEM_CITUS_MIN_MAJOR, IDEM_CITUS_MAX_MAJOR),
				 errhint("Install a release of the extension that supports this Citus version.")));
	return citus_installed;
}

/* Connect SPI, or fail */
static void
Connect(void)
{
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
}

/* A prepared statement kept for the session, in *plan */
static SPIPlanPtr
KeepPlan(SPIPlanPtr *plan, const char *sql, int nargs, Oid *types)
{
	if (*plan == NULL)
	{
		SPIPlanPtr	p = SPI_prepare(sql, nargs, types);

		if (p == NULL || SPI_keepplan(p) != 0)
			elog(ERROR, "SPI_prepare failed for \"%s\": %s",
				 sql, SPI_result_code_string(SPI_result));
		*plan = p;
	}
	return *plan;
}

/*
 * Is the relation distributed by hash, as idem_distribute makes it?
 * Cached until its relcache entry is invalidated.
 */
bool
IdemCitusIsDistributed(Relation rel)
{
	Oid			relid = RelationGetRelid(rel);
	Datum		values[1] = {ObjectIdGetDatum(relid)};
	Oid			types[1] = {OIDOID};
	uint64		generation;
	bool		distributed;
	int			rc;

	RegisterCallbacks();
	if (distribution_valid && distribution_relid == relid)
		return distribution_distributed;

	/* record the relation first, so that the callback sees it meanwhile */
	distribution_relid = relid;
	distribution_valid = false;
	generation = distribution_generation;

	Connect();
	rc = SPI_execute_with_args("SELECT FROM pg_catalog.pg_dist_partition"
							   " WHERE logicalrelid OPERATOR(pg_catalog.=) $1"
							   " AND partmethod OPERATOR(pg_catalog.=) 'h'",
							   1, types, values, NULL, true, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "SPI_execute_with_args failed: %s", SPI_result_code_string(rc));
	distributed = SPI_processed > 0;
	SPI_finish();

	distribution_distributed = distributed;
	distribution_valid = generation == distribution_generation;
	return distributed;
}

/*
 * Raise the error for idem_keys next to Citus but not distributed by scope:
 * its writes would commit apart from the effects on the workers.
 */
void
IdemCitusReportUndistributed(Relation rel)
{
	ereport(ERROR,
			(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
			 errmsg("table \"idem_keys\" must be distributed by scope when Citus is installed"),
			 errdetail("Citus cannot see the writes of the extension to a table that is not distributed, so a record could commit apart from its effect."),
			 errhint("Distribute it next to the tenant's table with SELECT %s.idem_distribute('your_table').",
					 quote_identifier(get_namespace_name(RelationGetNamespace(rel))))));
}

/*
 * The shard of the distributed relid that holds scope, and its relation
 * when this node holds it (InvalidOid otherwise), read with the latest
 * snapshot so that a shard move committed meanwhile is seen.  *left: this
 * node has no placement of the shard but still has its relation, the old
 * placement of a move that Citus drops later (deferred cleanup).
 */
static int64
ShardOfScope(Oid relid, text *scope, Oid *shard_relid, bool *left)
{
	Datum		values[2] = {ObjectIdGetDatum(relid), PointerGetDatum(scope)};
	Oid			types[2] = {REGCLASSOID, TEXTOID};
	bool		isnull;
	bool		local;
	int64		shardid;
	int			rc;

	Connect();
	rc = SPI_execute_snapshot(KeepPlan(&shard_plan,
									   "SELECT s.id, EXISTS (SELECT FROM pg_catalog.pg_dist_placement p"
									   " WHERE p.shardid OPERATOR(pg_catalog.=) s.id"
									   " AND p.groupid OPERATOR(pg_catalog.=) (SELECT g.groupid FROM pg_catalog.pg_dist_local_group g)),"
									   " pg_catalog.to_regclass(pg_catalog.shard_name($1, s.id, false))::pg_catalog.oid"
									   " FROM (SELECT pg_catalog.get_shard_id_for_distribution_column($1, $2) AS id) s",
									   2, types),
							  values, NULL, GetLatestSnapshot(),
							  InvalidSnapshot, true, false, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not find the shard of scope \"%s\"", text_to_cstring(scope));
	shardid = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	if (isnull)
		elog(ERROR, "could not find the shard of scope \"%s\"", text_to_cstring(scope));
	local = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull));
	*shard_relid = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[0],
												  SPI_tuptable->tupdesc, 3, &isnull));
	if (isnull)
		*shard_relid = InvalidOid;
	*left = !local && OidIsValid(*shard_relid);
	if (!local)
		*shard_relid = InvalidOid;
	SPI_finish();
	return shardid;
}

/*
 * Take the lock on a shard's placement metadata that Citus's own writers
 * take and a shard move or split takes exclusively on every node, through
 * Citus's SQL function lock_shard_metadata.  Citus lets only the owner of
 * the distributed table take it, so it runs as that owner, in a
 * security-restricted operation; the function is named with its schema,
 * and its arguments are constants of ours.
 */
static void
LockShardMetadata(Relation rel, int64 shardid)
{
	Datum		values[1] = {Int64GetDatum(shardid)};
	Oid			types[1] = {INT8OID};
	Oid			save_userid;
	int			save_sec_context;
	int			rc;

	Connect();
	GetUserIdAndSecContext(&save_userid, &save_sec_context);
	SetUserIdAndSecContext(rel->rd_rel->relowner,
						   save_sec_context | SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
	rc = SPI_execute_plan(KeepPlan(&lock_plan,
								   "SELECT pg_catalog.lock_shard_metadata(" CppAsString2(ShareLock)
								   ", ARRAY[$1]::pg_catalog.int8[])",
								   1, types),
						  values, NULL, false, 1);
	SetUserIdAndSecContext(save_userid, save_sec_context);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "SPI_execute_plan failed: %s", SPI_result_code_string(rc));
	SPI_finish();
}

/*
 * The local shard relation of the distributed rel that holds scope, locked
 * with lockmode, under the shard's metadata lock (see the file header).  An
 * ERROR 55000 when this node does not hold it (the call was not
 * delegated), and 40001 when the shard moved away while we waited for its
 * lock, or before the call came (its old placement is still here): the
 * caller's transaction was routed before the move, and a retry goes to the
 * shard's new node.
 */
Oid
IdemCitusLocalShard(Relation rel, text *scope, LOCKMODE lockmode)
{
	Oid			relid = RelationGetRelid(rel);
	Oid			shard_relid;
	bool		left;
	int64		shardid = ShardOfScope(relid, scope, &shard_relid, &left);

	if (left)
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not serialize access due to a concurrent move of the shard of scope \"%s\"",
						text_to_cstring(scope)),
				 errdetail("Shard " INT64_FORMAT " of the distributed table \"idem_keys\" left this node before the call came.",
						   shardid),
				 errhint("Retry the transaction.")));
	if (!OidIsValid(shard_relid))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the records of scope \"%s\" are not on this node",
						text_to_cstring(scope)),
				 errdetail("Shard " INT64_FORMAT " of the distributed table \"idem_keys\" holds them, and this node has no placement of it.",
						   shardid),
				 errhint("Call the function with the scope as a constant so that Citus delegates it to the node of the shard, or connect to that node.")));
	for (;;)
	{
		int64		again;

		LockShardMetadata(rel, shardid);
		/* a move or a split may have committed while we waited */
		again = ShardOfScope(relid, scope, &shard_relid, &left);
		if (again == shardid)
			break;
		shardid = again;
	}
	if (OidIsValid(shard_relid))
	{
		LockRelationOid(shard_relid, lockmode);
		if (SearchSysCacheExists1(RELOID, ObjectIdGetDatum(shard_relid)))
			return shard_relid;
	}
	ereport(ERROR,
			(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
			 errmsg("could not serialize access due to a concurrent move of the shard of scope \"%s\"",
					text_to_cstring(scope)),
			 errdetail("Shard " INT64_FORMAT " of the distributed table \"idem_keys\" left this node while the call waited for it.",
					   shardid),
			 errhint("Retry the transaction.")));
	pg_unreachable();
}

/*
 * The shards of the distributed relid that this node holds, in shard
 * order, in the caller's memory context, as snapshot sees the metadata
 * (InvalidSnapshot: the transaction's)
 */
static List *
LocalShardsOf(Oid relid, Snapshot snapshot)
{
	Datum		values[1] = {ObjectIdGetDatum(relid)};
	Oid			types[1] = {REGCLASSOID};
	List	   *result = NIL;
	MemoryContext caller = CurrentMemoryContext;
	uint64		i;
	int			rc;

	Connect();
	rc = SPI_execute_snapshot(KeepPlan(&shards_plan,
									   "SELECT pg_catalog.to_regclass(pg_catalog.shard_name($1, s.shardid, false))::pg_catalog.oid"
									   " FROM pg_catalog.pg_dist_shard s JOIN pg_catalog.pg_dist_placement p"
									   " ON p.shardid OPERATOR(pg_catalog.=) s.shardid"
									   " WHERE s.logicalrelid OPERATOR(pg_catalog.=) $1"
									   " AND p.groupid OPERATOR(pg_catalog.=) (SELECT g.groupid FROM pg_catalog.pg_dist_local_group g)"
									   " ORDER BY s.shardid",
									   1, types),
							  values, NULL, snapshot, InvalidSnapshot, true, false, 0);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "SPI_execute_snapshot failed: %s", SPI_result_code_string(rc));
	for (i = 0; i < SPI_processed; i++)
	{
		bool		isnull;
		Datum		d = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc,
									  1, &isnull);

		if (!isnull)
		{
			MemoryContext oldcxt = MemoryContextSwitchTo(caller);

			result = lappend_oid(result, DatumGetObjectId(d));
			MemoryContextSwitchTo(oldcxt);
		}
	}
	SPI_finish();
	return result;
}

/*
 * The shards of the distributed relid that this node holds, in shard
 * order, allocated in the caller's memory context (NIL on a coordinator
 * without shards).  Each is opened later with IdemRecordsTryOpenRelation,
 * which sees one dropped since.
 */
List *
IdemCitusLocalShards(Oid relid)
{
	return LocalShardsOf(relid, InvalidSnapshot);
}

/*
 * Is relid a shard, on this node, of the extension's own idem_keys (the
 * member of the extension, distributed by Citus)?  Citus's metadata says,
 * read with the latest snapshot: the placements of that idem_keys on this
 * node, cached until an invalidation (see the file header).
 */
bool
IdemCitusIsLocalShard(Oid relid)
{
	if (!IdemCitusInstalled())
		return false;
	RegisterCallbacks();
	if (!shards_valid)
	{
		Oid			ext = get_extension_oid(IDEM_EXTENSION_NAME, true);
		Oid			nspid;
		Oid			keys = InvalidOid;
		uint64		generation;
		List	   *found = NIL;
		List	   *old = shards_local;

		if (IdemExtensionVersion(IDEM_EXTENSION_NAME, &nspid) != NULL)
			keys = get_relname_relid("idem_keys", nspid);
		if (OidIsValid(keys) && getExtensionOfObject(RelationRelationId, keys) != ext)
			keys = InvalidOid;

		/* record the table first, so that the callback sees it meanwhile */
		shards_of = keys;
		shards_local = NIL;
		list_free(old);
		generation = shards_generation;
		if (OidIsValid(keys))
		{
			MemoryContext oldcxt = MemoryContextSwitchTo(TopMemoryContext);

			PushActiveSnapshot(GetLatestSnapshot());
			found = LocalShardsOf(keys, GetActiveSnapshot());
			PopActiveSnapshot();
			MemoryContextSwitchTo(oldcxt);
		}
		shards_local = found;
		shards_valid = generation == shards_generation;
	}
	return list_member_oid(shards_local, relid);
}

/* A C function of Citus, by name, or an ERROR when this Citus lacks it */
static void *
CitusFunction(const char *name)
{
	void	   *f = load_external_function("citus", name, false, NULL);

	if (f == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("Citus has no function \"%s\"", name),
				 errdetail("Extension \"%s\" calls it to have Citus commit a transaction that writes a shard on this node with its other nodes.",
						   IDEM_EXTENSION_NAME),
				 errhint("Install a release of the extension that supports this Citus version.")));
	return f;
}

/*
 * Before a write into shard, a local shard of idem_keys: tell Citus's
 * transaction manager that this transaction writes on this node, so that
 * it keeps to local execution here and commits with two-phase commit
 * whenever it wrote another node too (see the file header).  Cheap: two
 * assignments in Citus, after the first call's look-up.
 */
void
IdemCitusLocalWrite(Relation shard)
{
	if (citus_use_2pc == NULL)
	{
		citus_get_local_execution_status = (GetLocalExecutionStatusFn)
			CitusFunction("GetCurrentLocalExecutionStatus");
		citus_set_local_execution_status = (SetLocalExecutionStatusFn)
			CitusFunction("SetLocalExecutionStatus");
		citus_use_2pc = (Use2PCFn) CitusFunction("Use2PCForCoordinatedTransaction");
	}
	if (citus_get_local_execution_status() == CITUS_LOCAL_EXECUTION_DISABLED)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("cannot write shard \"%s\" after Citus reached this node over a connection",
						RelationGetRelationName(shard)),
				 errdetail("An earlier statement of this transaction ran on this node's shards over a connection of Citus's, which would not see the record, and Citus would commit that connection's part apart from it."),
				 errhint("Reserve the key before that statement, or run that statement with citus.enable_local_execution on.")));
	citus_set_local_execution_status(CITUS_LOCAL_EXECUTION_REQUIRED);
	citus_use_2pc();
}
