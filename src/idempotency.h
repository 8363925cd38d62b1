/*-------------------------------------------------------------------------
 *
 * idempotency.h
 *	  Declarations shared by the parts of the idempotency extension.
 *
 * Each part owns one .c file (differences between PostgreSQL versions are
 * guarded in compat.h, not in the .c files):
 *	  idempotency.c	module entry (_PG_init) and the user-level settings
 *	  keys.c		the key lifecycle: reserve, complete, release,
 *					checkpoint, lookup, and the per-key lock
 *	  held.c		held reservations: a new key's record written once,
 *					later in its transaction, as the reservation's write
 *					(held.h)
 *	  records.c		table idem_keys: its layout, the primary-key lookup
 *					and the writes through the executor (records.h)
 *	  citus.c		every call into Citus: where a scope's records live
 *					when idem_keys is distributed
 *	  canonical.c	RFC 8785 canonical JSON and the SHA-256 fingerprint
 *	  stats.c		shared-memory statistics
 *	  status.c		the background worker's state in shared memory
 *	  worker.c		background worker: the launcher and the
 *					per-database workers, and their settings
 *	  maintenance.c	the maintenance pass, shared by the worker and the
 *					SQL maintenance functions (batches.c: its sweep and
 *					flag batches; backoff.c: failed and skipped
 *					reconcilers; maintenance.h: their private header)
 *	  reconcile.c	who may run a reconciler, as whom, with which
 *					search_path; registering one; its time limit
 *	  patterns.c	idem_call and idem_consume
 *	  handlers.c	verification of the functions called for users:
 *					idem_call's handlers and the reconcilers
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPOTENCY_H
#define IDEMPOTENCY_H

#include "postgres.h"

#include "compat.h"

#include "datatype/timestamp.h"
#include "nodes/pg_list.h"
#include "storage/lockdefs.h"
#include "utils/jsonb.h"
#include "utils/relcache.h"

/* The extension's name, as in pg_extension */
#define IDEM_EXTENSION_NAME		"idempotency"

/*
 * The release before this library's version.  Its catalog (the objects its
 * install and upgrade scripts leave) is served unchanged until ALTER
 * EXTENSION UPDATE, so that installing the new package is never an outage,
 * as pg_stat_statements serves its older SQL definitions; an older catalog
 * gets a clean ERROR whose hint is the update.  What that catalog lacks is
 * handled where it is used: 0.2.0 declares idem_lookup PARALLEL SAFE, which
 * refuses to run in a parallel worker (keys.c).  It moves on with each
 * release.
 */
#define IDEM_PREVIOUS_VERSION	"0.2.0"

/* Limits on identifiers, checked with SQLSTATE 22023 */
#define IDEM_MAX_KEY_LEN		255
#define IDEM_MAX_OPERATION_LEN	63
#define IDEM_MAX_SCOPE_LEN		255

/*
 * Scopes beginning with this prefix hold the extension's own records and are
 * refused by idem_reserve and friends.  idem_consume keeps its inbox records
 * in scope IDEM_CONSUME_SCOPE, operation = consumer, key = message_id.
 */
#define IDEM_RESERVED_SCOPE_PREFIX	"idem:"
#define IDEM_CONSUME_SCOPE			"idem:consume"

/* SHA-256 digest length of a request fingerprint */
#define IDEM_HASH_LEN			32

/*
 * SQLSTATEs of our own (class "ID").  Documented in the README; the values
 * are part of the public contract and never change meaning.
 */
#define ERRCODE_IDEM_KEY_NOT_FOUND		MAKE_SQLSTATE('I','D','0','0','1')
#define ERRCODE_IDEM_KEY_COMPLETED		MAKE_SQLSTATE('I','D','0','0','2')
#define ERRCODE_IDEM_IN_PROGRESS		MAKE_SQLSTATE('I','D','0','0','3')
#define ERRCODE_IDEM_MISMATCH			MAKE_SQLSTATE('I','D','0','0','4')
#define ERRCODE_IDEM_STUCK				MAKE_SQLSTATE('I','D','0','0','5')

/* Outcomes of a reservation, in the order of the contract's table */
typedef enum IdemOutcome
{
	IDEM_NEW,
	IDEM_REPLAY,
	IDEM_IN_PROGRESS,
	IDEM_MISMATCH,
	IDEM_STUCK
} IdemOutcome;

/* What idem_reserve found or created; pointers are palloc'd in the caller's context */
typedef struct IdemReservation
{
	IdemOutcome outcome;
	bool		has_response_status;
	int32		response_status;
	Jsonb	   *response;		/* NULL when SQL NULL */
	text	   *resource_id;	/* NULL when SQL NULL */
	text	   *recovery_point; /* NULL when SQL NULL */
	bool		has_expires_at;
	TimestampTz expires_at;
} IdemReservation;

/* Are two text or bytea values equal byte for byte? */
static inline bool
IdemVarlenaEqual(const struct varlena *a, const struct varlena *b)
{
	return VARSIZE_ANY_EXHDR(a) == VARSIZE_ANY_EXHDR(b) &&
		memcmp(VARDATA_ANY(a), VARDATA_ANY(b), VARSIZE_ANY_EXHDR(a)) == 0;
}

/* Settings (idempotency.c) */
extern int	idem_default_ttl_s;
extern int	idem_processing_timeout_ms;
extern int	idem_reconciler_timeout_ms;
extern bool idem_enable_superuser_reconcilers;

/* keys.c: the C API the SQL functions, the worker and the patterns share */
extern const char *IdemOutcomeName(IdemOutcome outcome);
extern int	IdemOutcomeHttpStatus(const IdemReservation *r);
extern void IdemCheckOperation(text *operation);
extern void IdemCheckOperationArg(text *operation, const char *argname);
extern void IdemCheckKey(text *key);
extern void IdemCheckKeyArg(text *key, const char *argname);
extern void IdemCheckScope(text *scope);

/* Flags of IdemReserve and IdemReserveCompleted (see keys.c) */
#define IDEM_RESERVE_WAIT		0x01	/* wait for a key another transaction holds */
#define IDEM_RESERVE_COUNT		0x02	/* count in idem_stats as reserves */
#define IDEM_RESERVE_COMPLETED	0x04	/* internal: write the record completed */

extern void IdemReserve(Oid nspid, text *scope, text *operation, text *key,
						Jsonb *request, Interval *ttl, int flags,
						IdemReservation *result);
extern void IdemReserveCompleted(Oid nspid, text *scope, text *operation,
								 text *key, Interval *ttl, int flags,
								 IdemReservation *result);
extern void IdemComplete(Oid nspid, text *scope, text *operation, text *key,
						 Jsonb *response, int32 response_status,
						 text *resource_id, bool count_stats);
extern bool IdemRelease(Oid nspid, text *scope, text *operation, text *key);
extern Oid	IdemFunctionNamespace(FunctionCallInfo fcinfo);

/* worker.c: maintenance settings and the background worker */
extern int	idem_sweep_interval_ms;
extern int	idem_sweep_batch_size;
extern bool idem_worker_enabled;
extern int	idem_max_workers;
extern int	idem_sweep_duty_cycle;
extern void IdemWorkerInit(void);

/*
 * maintenance.c: expiry, stuck detection and reconciliation, run by the
 * worker and by the SQL functions alike.  The mode says who owns the
 * transactions: the caller (SQL functions: everything in its transaction),
 * the worker (each batch and each reconciler call its own transaction), or
 * a CALLed procedure (the same, through SPI_commit).
 */
typedef enum IdemTxnMode
{
	IDEM_TXN_CALLER,
	IDEM_TXN_WORKER,
	IDEM_TXN_PROCEDURE
} IdemTxnMode;

/* What one maintenance pass over a database did */
typedef struct IdemPassCounts
{
	int64		deleted;		/* expired records deleted */
	int64		flagged;		/* processing records flagged stuck */
	int64		reconciled;		/* reconciler calls that returned normally */
	int64		failed;			/* reconciler calls that raised or timed out */
	int64		skipped;		/* units skipped: idem_keys was locked */
	int64		write_errors;	/* records whose delete or flag raised */
	int64		batches;		/* transactions used for batches */
	int64		longest_batch_us;	/* longest of them, in microseconds */
	bool		stopped;		/* the stop callback ended the pass early */
	bool		missing;		/* extension not installed, or dropped meanwhile */
} IdemPassCounts;

/*
 * Called between units of work in worker mode, with the duration of the
 * batch just done (0 after a reconciler call); it may sleep to yield to
 * other sessions.  true ends the pass.
 */
typedef bool (*IdemStopCallback) (int64 batch_us);

extern void IdemMaintainDatabase(IdemTxnMode mode, Oid nspid,
								 IdemStopCallback stop, IdemPassCounts *counts);

/*
 * handlers.c: what is wrong with a function the extension is to call for a
 * user, checked right before every call
 */
typedef enum IdemHandlerFault
{
	IDEM_HANDLER_OK,
	IDEM_HANDLER_MISSING,		/* no function has that OID (0, dropped) */
	IDEM_HANDLER_NOT_FUNCTION,	/* a procedure, aggregate or window function */
	IDEM_HANDLER_ARGUMENTS,		/* not exactly one argument of the type */
	IDEM_HANDLER_RETURNS_SET,
	IDEM_HANDLER_RESULT,		/* returns another type than required */
	IDEM_HANDLER_NOT_EXECUTABLE /* the role it runs as lacks EXECUTE */
} IdemHandlerFault;

extern IdemHandlerFault IdemCheckHandler(Oid handler, Oid argtype,
										 Oid rettype, Oid roleid, bool *strict);
extern int	IdemHandlerFaultCode(IdemHandlerFault fault);
extern int	IdemErrdetailHandler(IdemHandlerFault fault, Oid handler,
									   Oid argtype, Oid rettype, Oid roleid);
extern Oid	IdemFunctionOwner(Oid handler);
extern bool IdemCanActAs(Oid member, Oid role);

/* catalog.c: the installed version of an extension */
extern char *IdemExtensionVersion(const char *extname, Oid *nspid);
extern bool IdemCatalogIsPrevious(void);

/* records.c: helpers of every part (the rest of it is in records.h) */
pg_noreturn extern void IdemReportMissingTable(const char *relname);

/*
 * citus.c: where a scope's records live when Citus distributes idem_keys.
 * IdemCitusInstalled raises an ERROR for a Citus version it does not know.
 */
extern bool IdemCitusInstalled(void);
extern bool IdemCitusIsDistributed(Relation rel);
pg_noreturn extern void IdemCitusReportUndistributed(Relation rel);
extern Oid	IdemCitusLocalShard(Relation rel, text *scope, LOCKMODE lockmode);
extern List *IdemCitusLocalShards(Oid relid);
extern bool IdemCitusIsLocalShard(Oid relid);
extern void IdemCitusLocalWrite(Relation shard);

/*
 * reconcile.c: a reconciler as registered in idem_reconcilers, and the one
 * way to call it (as run_as, with search_path pinned, after every check)
 */
typedef struct IdemReconciler
{
	text	   *operation;
	char	   *handler;		/* signature, schema-qualified */
	Oid			run_as;
	Oid			registered_by;
} IdemReconciler;

extern bool IdemReconcilerCall(Oid nspid, const IdemReconciler *rc, Datum row,
							   bool quiet);
extern void IdemReconcilerCheck(Oid handler, Oid rowtype, Oid run_as);

/* canonical.c */
extern bytea *IdemHashJsonb(Jsonb *jb);
extern text *IdemCanonicalJsonb(Jsonb *jb);

/* stats.c: counters per (database, operation) */
typedef enum IdemCounter
{
	IDEM_STAT_RESERVES,
	IDEM_STAT_NEW,
	IDEM_STAT_REPLAYS,
	IDEM_STAT_IN_PROGRESS,
	IDEM_STAT_MISMATCHES,
	IDEM_STAT_STUCK,
	IDEM_STAT_COMPLETES,
	IDEM_STAT_RELEASES,
	IDEM_STAT_CONSUMED,
	IDEM_STAT_DUPLICATES,
	IDEM_STAT_EXPIRED,
	IDEM_STAT_FLAGGED_STUCK,
	IDEM_NUM_COUNTERS
} IdemCounter;

extern void IdemStatsInit(void);
extern void IdemStatsCount(const char *operation, int operation_len,
						   IdemCounter counter, int64 n);
extern int	IdemStatsDatabases(Oid **dbids);
extern void IdemStatsForgetDatabase(Oid dbid);

/* status.c: the worker's last pass per database, the launcher's next round */

/* The extension may have been created in a database (IdemStatusHintDatabase) */
typedef struct IdemHint
{
	Oid			dboid;
	bool		sticky;			/* by a prepared transaction */
} IdemHint;

/* Hints kept until the launcher takes them */
#define IDEM_STATUS_MAX_HINTS	64

struct Latch;

extern void IdemStatusInit(void);
extern void IdemStatusReportRound(TimestampTz next_round);
extern void IdemStatusReportPass(Oid dboid, TimestampTz start, TimestampTz end,
								 const IdemPassCounts *counts);
extern int	IdemStatusDatabases(Oid **dbids);
extern void IdemStatusForgetDatabase(Oid dboid);
extern void IdemStatusSetLauncher(struct Latch *latch);
extern void IdemStatusHintDatabase(Oid dboid, bool sticky);
extern int	IdemStatusTakeHints(IdemHint *hints, bool *lost);
extern void IdemStatusReportAbsent(Oid dboid);
extern int	IdemStatusTakeAbsent(Oid **dbids);

#endif							/* IDEMPOTENCY_H */
