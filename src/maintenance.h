/*-------------------------------------------------------------------------
 *
 * maintenance.h
 *	  Private to the maintenance files: the pass that maintenance.c runs,
 *	  the sweep and flag batches of batches.c, the reconciler calls of
 *	  reconcile.c and what backoff.c keeps about their failures and skips.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_MAINTENANCE_H
#define IDEM_MAINTENANCE_H

#include "executor/spi.h"
#include "storage/itemptr.h"
#include "utils/relcache.h"

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

/* A sweep or flag batch: SweepBatch or FlagBatch */
typedef int64 (*BatchFunction) (PassState *ps, int batch_size, TimestampTz t,
								TimestampTz *lower);

extern MaintCatalog maint_catalog;

/* batches.c: the sweep and flag batches, and how a batch is run */
extern Oid	IdemExpiryIndex(Relation rel, AttrNumber expires_at, Oid *unusable);
extern int64 IdemSweepBatch(PassState *ps, int batch_size, TimestampTz now,
							TimestampTz *lower);
extern int64 IdemFlagBatch(PassState *ps, int batch_size, TimestampTz cutoff,
						   TimestampTz *lower);
extern int64 IdemRunBatch(PassState *ps, BatchFunction batch, int batch_size,
						  TimestampTz t, TimestampTz *lower);
extern ErrorData *IdemCallInSubtransaction(void (*fn) (void *arg), void *arg);

/* backoff.c: failed records' next attempts, skipped operations' causes */
extern void IdemBackoffInit(void);
extern bool IdemBackoffWaiting(const text *scope, const text *operation,
							   const text *key);
extern void IdemBackoffBegin(const text *scope, const text *operation,
							 const text *key);
extern void IdemBackoffEnd(const text *scope, const text *operation,
						   const text *key, const char *reason);
extern bool IdemSkipNoted(const text *operation, const char *cause,
						  const char *reason);
extern void IdemSkipForget(const text *operation);

/* reconcile.c: the clocks of a reconciler call, which no reconciler disarms */
extern void IdemReconcilerTimerStart(const IdemReconciler *rc, text *scope,
									 text *key);
extern bool IdemReconcilerTimerStop(void);
extern void IdemPreventInReconciler(const char *function);

#endif							/* IDEM_MAINTENANCE_H */
