/*-------------------------------------------------------------------------
 *
 * held.c
 *	  Held reservations: one write per request.  A reservation of a new key
 *	  is held (its key lock kept, nothing written) and its record is written
 *	  once, later in the transaction, as the write the reservation would
 *	  have made at once.  keys.c asks this file once per operation (held.h).
 *
 * A request reserved and completed in one transaction needs its record
 * only once it is completed: nobody else can see the processing state of
 * an uncommitted row except as "in_progress", which the key lock says as
 * well.  So a reservation of an absent key does not write: keys.c keeps the
 * key lock (transaction-level, owned by the current subtransaction) and
 * this file remembers the request.  The record is then written once:
 * completed by idem_complete, or processing when idem_checkpoint or
 * idem_release needs the row, before any DDL of the transaction
 * (HeldProcessUtility), or just before the transaction commits or prepares
 * (HeldXactCallback).  idem_consume's record is held too, and written
 * completed at commit, its expiry counted from then (CountFromCommit for
 * one written earlier).  Where a reservation is held and where it is
 * written at once: HoldAllowed; what its write is: WriteHeld.
 *
 * A held reservation is forgotten, and its lock released, with the
 * subtransaction that made it; a write is undone with the subtransaction
 * that made it, and the reservation is held again.  The lists live in
 * TopTransactionContext and go with the transaction; they are never shared
 * (idem_lookup, which reads them, never runs in a parallel worker).
 * Locks: RowExclusiveLock on the table from the hold on, and the key lock.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "held.h"

/*
 * A reservation this transaction holds, or an idem_consume record it wrote
 * at once (see the file header)
 */
typedef struct IdemHeld
{
	struct IdemHeld *next;
	Oid			nspid;			/* of the extension whose idem_keys it is */
	Oid			relid;			/* that idem_keys, by OID */
	text	   *scope;
	text	   *operation;
	text	   *key;
	bytea	   *hash;			/* NULL without a request */
	Interval   *ttl;
	TimestampTz created_at;		/* the reservation's time, and its heartbeat */
	TimestampTz expires_at;		/* as reserved */
	bool		completed;		/* idem_consume's: written completed, its
								 * expiry counted from the write */
	Oid			roleid;			/* the role that reserved */
	int			sec_context;	/* and its security context */
	SubTransactionId subid;		/* the subtransaction that holds it */
	SubTransactionId written;	/* the one that wrote it; Invalid: not yet */
} IdemHeld;

/* Held reservations per transaction at most (see the file header) */
#define IDEM_MAX_HELD	16

static IdemHeld *held_keys = NULL;
static int	held_count = 0;
/* idem_consume's records written at once, to count their expiry from commit */
static IdemHeld *consumed_keys = NULL;
static bool held_callbacks = false;
static ProcessUtility_hook_type prev_ProcessUtility = NULL;

/* The reservation of a key this transaction holds and has not written, or NULL */
static IdemHeld *
FindHeld(Oid nspid, text *scope, text *operation, text *key)
{
	IdemHeld   *h;

	for (h = held_keys; h != NULL; h = h->next)
		if (h->written == InvalidSubTransactionId && h->nspid == nspid &&
			IdemVarlenaEqual(h->key, key) && IdemVarlenaEqual(h->operation, operation) &&
			IdemVarlenaEqual(h->scope, scope))
			return h;
	return NULL;
}

/*
 * May the commit callback write into table?  Only where a write runs no
 * code of any role: idem_keys itself, or a Citus shard of it on this node,
 * with the install script's rules alone.
 */
static bool
WritableAtCommit(IdemTable *table)
{
	return table->own_rules && (table->member || table->shard);
}

/* The record of a held reservation as it stands, with change applied over it */
static void
HeldRow(IdemHeld *h, IdemRow *change, IdemRow *row)
{
	int			c;

	IdemRowNewRecord(row, h->scope, h->operation, h->key, h->hash, h->completed,
					 h->created_at, h->created_at, h->expires_at, h->ttl);
	if (change != NULL)
		for (c = 0; c < IDEM_NUM_COLUMNS; c++)
			if (change->set[c])
				IdemRowSet(row, (IdemColumn) c, change->values[c], change->isnull[c]);
}

/* Raise the error for a held record whose table is gone or gained rules */
pg_noreturn static void
ReportUnwritable(IdemHeld *h, const char *why)
{
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("cannot write the record of idempotency key \"%s\"",
					text_to_cstring(h->key)),
			 errdetail("Operation \"%s\", scope \"%s\": %s",
					   text_to_cstring(h->operation), text_to_cstring(h->scope), why),
			 errhint("Change table idem_keys in a transaction that reserves no key.")));
}

/*
 * Write the record of the held reservation h: as reserved (processing, or
 * completed for idem_consume, its expiry counted from now), or with the
 * columns set in change (a completion or a checkpoint, which set its
 * heartbeat and expiry themselves).  The key lock makes the insert safe:
 * nobody else writes a record of this key meanwhile.  at_commit: from the
 * commit callback, where no code of any role may run.
 *
 * The write is the one the reservation would have made:
 *	- as the role that reserved, in its security context, saved when it is
 *	  held and restored for the write, as core runs a deferred trigger as
 *	  the role that queued it (PostgreSQL 18's trigger.c): a SECURITY
 *	  DEFINER procedure reserving for its caller, or a SET ROLE after the
 *	  reservation, writes with the rights the reservation was checked with.
 *	  The same checks are made again (read-only transaction, INSERT
 *	  privilege; a completion's UPDATE privilege as the role completing).
 *	- under the lock an immediate write takes: RowExclusiveLock on the
 *	  table, taken when the reservation is held, so that another session's
 *	  DDL (CREATE INDEX, CREATE TRIGGER, ALTER TABLE) waits for the holder
 *	  as it waits for a writer.
 *	- into the table by OID, never by name.
 *	- running no code of any role: only a table whose writes run nothing but
 *	  the install script's rules, recognised by their definitions
 *	  (layout.c, OnlyOwnRules), and only idem_keys itself (a member of the
 *	  extension) or a Citus shard of it here, is held.  There a write fails or
 *	  succeeds the same whenever it is made.  The commit callback fires no
 *	  trigger; a table that gained a rule in between (which only DDL of the
 *	  transaction itself could add, and that DDL finds the records written)
 *	  fails the commit rather than run it.
 *	- before any DDL of the transaction (a utility statement that
 *	  GetCommandLogLevel calls DDL, and TRUNCATE: RENAME, SET SCHEMA, ALTER
 *	  TABLE of any kind, DROP, DROP EXTENSION, CREATE TRIGGER ...): the
 *	  ProcessUtility hook writes what is held first, so the DDL finds the
 *	  records as it would have found immediate writes.  A table that is
 *	  gone at commit all the same fails the commit: never an effect
 *	  without its record.
 */
static void
WriteHeld(IdemHeld *h, IdemRow *change, const char *function, bool at_commit)
{
	IdemTable	table;
	IdemWriter	w;
	IdemRow		row;
	bool		pushed = false;
	Oid			save_userid;
	int			save_sec_context;

	/* At commit there is no statement, and so no snapshot, of our own */
	if (!ActiveSnapshotSet())
	{
		PushActiveSnapshot(GetTransactionSnapshot());
		pushed = true;
	}
	HeldRow(h, change, &row);
	if (change == NULL && h->completed)
	{
		TimestampTz now = GetCurrentTimestamp();

		IdemRowSet(&row, COL_UPDATED_AT, TimestampTzGetDatum(now), false);
		IdemRowSet(&row, COL_EXPIRES_AT, TimestampTzGetDatum(IdemAddTtl(now, h->ttl)), false);
	}

	/* The table by OID, locked since the reservation */
	if (!IdemRecordsTryOpenRelation(h->relid, RowExclusiveLock, &table))
		ReportUnwritable(h, "Table idem_keys was dropped in this transaction after the key was reserved.");
	if (at_commit && !WritableAtCommit(&table))
		ReportUnwritable(h, "Table idem_keys was changed in this transaction after the key was reserved, so that writing the record at commit would run code of its owner's.");

	/* A completion or a checkpoint is the current role's update */
	if (change != NULL)
		IdemRecordsCheckWritable(&table, ACL_UPDATE, function);

	/* The reservation's insert, as the role that reserved */
	GetUserIdAndSecContext(&save_userid, &save_sec_context);
	SetUserIdAndSecContext(h->roleid,
						   save_sec_context | h->sec_context | SECURITY_LOCAL_USERID_CHANGE);
	IdemRecordsWriterBegin(&table, ACL_INSERT, function, &w);
	IdemRecordsInsert(&w, &row);
	IdemRecordsWriterEnd(&w);
	SetUserIdAndSecContext(save_userid, save_sec_context);

	IdemRecordsClose(&table);
	h->written = GetCurrentSubTransactionId();
	if (pushed)
		PopActiveSnapshot();
}


/* Write every reservation still held, as reserved */
static void
WriteAllHeld(bool at_commit)
{
	IdemHeld   *h;

	for (h = held_keys; h != NULL; h = h->next)
		if (h->written == InvalidSubTransactionId)
			WriteHeld(h, NULL, h->completed ? "idem_consume()" : "idem_reserve()",
					  at_commit);
}

/*
 * At commit, count the expiry of an idem_consume record written earlier in
 * the transaction (h) from now: update the transaction's own row
 * (RECORD_MINE), as the role that consumed, in its security context.  Such
 * a record was written at once (where a reservation cannot be held, or a
 * redelivery renewed its expired record) or held and written before DDL;
 * those written at once are remembered in a second list.  On a table whose
 * writes would run code of its owner's, which the commit callback never
 * runs, its expiry stays counted from the call, and a record that would be
 * expired at commit fails the commit instead: never a message record born
 * expired.
 */
static void
CountFromCommit(IdemHeld *h)
{
	IdemTable	table;
	IdemRecord	rec;
	TimestampTz now;
	bool		pushed = false;

	if (!ActiveSnapshotSet())
	{
		PushActiveSnapshot(GetTransactionSnapshot());
		pushed = true;
	}
	/*
	 * Dropped, or the record deleted or changed, by the transaction itself,
	 * as it would drop any record it wrote: nothing of ours to renew
	 */
	if (!IdemRecordsTryOpenRelation(h->relid, RowExclusiveLock, &table))
	{
		if (pushed)
			PopActiveSnapshot();
		return;
	}
	if (IdemRecordsFetch(&table, GetActiveSnapshot(), h->scope, h->operation,
						 h->key, &rec, NULL) &&
		(rec.flags & RECORD_MINE) && rec.status == STATUS_COMPLETED)
	{
		now = GetCurrentTimestamp();
		if (WritableAtCommit(&table))
		{
			IdemWriter	w;
			IdemRow		row;
			Oid			save_userid;
			int			save_sec_context;

			GetUserIdAndSecContext(&save_userid, &save_sec_context);
			SetUserIdAndSecContext(h->roleid,
								   save_sec_context | h->sec_context | SECURITY_LOCAL_USERID_CHANGE);
			/* The consume's own insert again: no privilege beyond it */
			IdemRecordsWriterBegin(&table, 0, "idem_consume()", &w);
			if (IdemRecordsLock(&w, &rec.tid, LockTupleNoKeyExclusive,
								LockWaitBlock) == TM_Ok)
			{
				IdemRowInit(&row);
				IdemRowSet(&row, COL_UPDATED_AT, TimestampTzGetDatum(now), false);
				IdemRowSet(&row, COL_EXPIRES_AT,
						   TimestampTzGetDatum(IdemAddTtl(now, h->ttl)), false);
				(void) IdemRecordsUpdate(&w, &row, true);
			}
			IdemRecordsWriterEnd(&w);
			SetUserIdAndSecContext(save_userid, save_sec_context);
		}
		else if (rec.expires_at <= now)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("message \"%s\" of consumer \"%s\" would be forgotten at commit",
							text_to_cstring(h->key), text_to_cstring(h->operation)),
					 errdetail("Its record expired before the transaction committed, and table idem_keys has rules of its owner's, so that the record cannot be written again at commit."),
					 errhint("Give idem_consume a ttl longer than the transaction.")));
	}
	IdemRecordsClose(&table);
	if (pushed)
		PopActiveSnapshot();
}

/* Count from now the expiry of every idem_consume record written earlier */
static void
CountAllFromCommit(void)
{
	IdemHeld   *h;

	for (h = held_keys; h != NULL; h = h->next)
		if (h->completed && h->written != InvalidSubTransactionId)
			CountFromCommit(h);
	for (h = consumed_keys; h != NULL; h = h->next)
		CountFromCommit(h);
}

/*
 * At commit or prepare, write what is still held; at the end of the
 * transaction, forget the list (its memory goes with TopTransactionContext).
 */
static void
HeldXactCallback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
		case XACT_EVENT_PRE_PREPARE:
			/* First those written earlier: the others count from their write */
			CountAllFromCommit();
			WriteAllHeld(true);
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PREPARE:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PARALLEL_ABORT:
			held_keys = NULL;
			held_count = 0;
			consumed_keys = NULL;
			break;
		default:
			break;
	}
}

/*
 * A subtransaction that rolls back takes its held reservations with it
 * (its resource owner releases their key locks) and undoes its writes of
 * others, which are held again; one that commits hands both to its parent.
 * The same for the list of idem_consume's records written at once, whose
 * entries are written by the subtransaction that made them (count NULL).
 */
static void
SubXactList(IdemHeld **list, int *count, SubXactEvent event,
			SubTransactionId mySubid, SubTransactionId parentSubid)
{
	IdemHeld  **link;

	for (link = list; *link != NULL;)
	{
		IdemHeld   *h = *link;

		if (event == SUBXACT_EVENT_ABORT_SUB)
		{
			if (h->subid == mySubid)
			{
				*link = h->next;
				if (count != NULL)
					(*count)--;
				continue;
			}
			if (h->written == mySubid)
				h->written = InvalidSubTransactionId;
		}
		else
		{
			if (h->subid == mySubid)
				h->subid = parentSubid;
			if (h->written == mySubid)
				h->written = parentSubid;
		}
		link = &h->next;
	}
}

static void
HeldSubXactCallback(SubXactEvent event, SubTransactionId mySubid,
					SubTransactionId parentSubid, void *arg)
{
	if (event != SUBXACT_EVENT_ABORT_SUB && event != SUBXACT_EVENT_COMMIT_SUB)
		return;
	SubXactList(&held_keys, &held_count, event, mySubid, parentSubid);
	SubXactList(&consumed_keys, NULL, event, mySubid, parentSubid);
}

/*
 * Does a utility statement change a table's definition or contents as DDL
 * does?  Every DDL statement (GetCommandLogLevel), and TRUNCATE.
 */
static bool
IsDDL(Node *stmt)
{
	return IsA(stmt, TruncateStmt) || GetCommandLogLevel(stmt) == LOGSTMT_DDL;
}

/* Before any DDL of a transaction that holds reservations, write them */
static void
HeldProcessUtility(PlannedStmt *pstmt, const char *queryString,
				   bool readOnlyTree, ProcessUtilityContext context,
				   ParamListInfo params, QueryEnvironment *queryEnv,
				   DestReceiver *dest, QueryCompletion *qc)
{
	if (held_keys != NULL && IsTransactionState() && IsDDL(pstmt->utilityStmt))
		WriteAllHeld(false);
	if (prev_ProcessUtility)
		prev_ProcessUtility(pstmt, queryString, readOnlyTree, context, params,
							queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context,
								params, queryEnv, dest, qc);
}

/* Install the ProcessUtility hook (_PG_init) */
void
IdemHeldInit(void)
{
	prev_ProcessUtility = ProcessUtility_hook;
	ProcessUtility_hook = HeldProcessUtility;
}

/*
 * May a reservation of table be held rather than written?  The caller holds
 * the key lock and found no record.  A reservation is written at once
 * where WriteHeld's guarantees cannot be given: inside a
 * security-restricted operation, on a table with rules of its owner (its
 * triggers then see the processing insert, and its CHECKs and index
 * predicates refuse the reservation itself), and beyond IDEM_MAX_HELD
 * reservations per transaction, so that a transaction of many keys does
 * not fill the lock table.
 */
static bool
HoldAllowed(IdemTable *table)
{
	return held_count < IDEM_MAX_HELD && WritableAtCommit(table) &&
		!InSecurityRestrictedOperation();
}

/* A new entry of the transaction's lists, as the current role and subtransaction */
static IdemHeld *
NewEntry(IdemTable *table, Oid nspid, text *scope, text *operation,
		 text *key, bytea *hash, Interval *ttl, bool completed)
{
	MemoryContext oldcxt;
	IdemHeld   *h;

	oldcxt = MemoryContextSwitchTo(TopTransactionContext);
	if (!held_callbacks)
	{
		RegisterXactCallback(HeldXactCallback, NULL);
		RegisterSubXactCallback(HeldSubXactCallback, NULL);
		held_callbacks = true;
	}
	h = palloc0(sizeof(IdemHeld));
	h->nspid = nspid;
	h->relid = RelationGetRelid(table->rel);
	h->scope = DatumGetTextPCopy(PointerGetDatum(scope));
	h->operation = DatumGetTextPCopy(PointerGetDatum(operation));
	h->key = DatumGetTextPCopy(PointerGetDatum(key));
	h->hash = hash ? DatumGetByteaPCopy(PointerGetDatum(hash)) : NULL;
	h->ttl = palloc(sizeof(Interval));
	memcpy(h->ttl, ttl, sizeof(Interval));
	h->completed = completed;
	GetUserIdAndSecContext(&h->roleid, &h->sec_context);
	h->subid = GetCurrentSubTransactionId();
	h->written = InvalidSubTransactionId;
	MemoryContextSwitchTo(oldcxt);
	return h;
}

/*
 * Reserve an absent key of table by holding it, when it may be held (see
 * the file header): check what its write will check, take the lock its
 * write takes, and remember it with the role and security context that
 * reserved; the caller then keeps the key lock.  false: write it at once.
 * The caller holds the key lock and found no record.
 */
bool
IdemHeldHold(IdemTable *table, Oid nspid, text *scope, text *operation,
			 text *key, bytea *hash, Interval *ttl, TimestampTz created_at,
			 TimestampTz expires_at, bool completed)
{
	IdemHeld   *h;

	if (!HoldAllowed(table))
		return false;
	IdemRecordsCheckWritable(table, ACL_INSERT,
							 completed ? "idem_consume()" : "idem_reserve()");
	if (table->lockmode < RowExclusiveLock)
	{
		/* Locked already: the table cannot have gone meanwhile */
		LockRelationOid(RelationGetRelid(table->rel), RowExclusiveLock);
		table->lockmode = RowExclusiveLock;
	}

	h = NewEntry(table, nspid, scope, operation, key, hash, ttl, completed);
	h->created_at = created_at;
	h->expires_at = expires_at;
	h->next = held_keys;
	held_keys = h;
	held_count++;
	return true;
}

/*
 * Remember an idem_consume record the current subtransaction has just
 * written into table at once, so that its expiry counts from commit.
 */
void
IdemHeldConsumedAtOnce(IdemTable *table, Oid nspid, text *scope,
					   text *operation, text *key, Interval *ttl)
{
	IdemHeld   *h;

	h = NewEntry(table, nspid, scope, operation, key, NULL, ttl, true);
	h->written = h->subid;
	h->next = consumed_keys;
	consumed_keys = h;
}

/*
 * A reservation of a key this transaction holds, answered as for a record
 * of its own (processing, or completed for idem_consume): in_progress,
 * replay, or mismatch for another request.  false: the key is not held.
 */
bool
IdemHeldAnswer(Oid nspid, text *scope, text *operation, text *key,
			   bytea *hash, IdemReservation *result)
{
	IdemHeld   *h = FindHeld(nspid, scope, operation, key);

	if (h == NULL)
		return false;
	result->outcome = IdemHashesDiffer(h->hash, hash) ? IDEM_MISMATCH :
		h->completed ? IDEM_REPLAY : IDEM_IN_PROGRESS;
	if (result->outcome == IDEM_REPLAY)
	{
		result->has_expires_at = true;
		result->expires_at = h->expires_at;
	}
	return true;
}

/*
 * Complete (completes) or checkpoint a key this transaction holds: its one
 * write, with the columns set in change, its heartbeat now and a
 * completion's expiry counted from now.  false: the key is not held.
 */
bool
IdemHeldChange(Oid nspid, text *scope, text *operation, text *key,
			   IdemRow *change, bool completes, const char *function)
{
	IdemHeld   *h = FindHeld(nspid, scope, operation, key);
	TimestampTz now;

	if (h == NULL)
		return false;
	now = GetCurrentTimestamp();
	IdemRowSet(change, COL_UPDATED_AT, TimestampTzGetDatum(now), false);
	if (completes)
		IdemRowSet(change, COL_EXPIRES_AT,
				   TimestampTzGetDatum(IdemAddTtl(now, h->ttl)), false);
	WriteHeld(h, change, function, false);
	return true;
}

/* Write the record of a key this transaction holds now, as reserved, if it holds it */
void
IdemHeldWriteNow(Oid nspid, text *scope, text *operation, text *key,
				 const char *function)
{
	IdemHeld   *h = FindHeld(nspid, scope, operation, key);

	if (h != NULL)
		WriteHeld(h, NULL, function, false);
}

/*
 * The record of a key this transaction holds, as it will be written, into
 * row.  false: the key is not held.
 */
bool
IdemHeldRecord(Oid nspid, text *scope, text *operation, text *key, IdemRow *row)
{
	IdemHeld   *h = FindHeld(nspid, scope, operation, key);

	if (h == NULL)
		return false;
	HeldRow(h, NULL, row);
	return true;
}
