/*-------------------------------------------------------------------------
 *
 * records.h
 *	  The one owner of table idem_keys (records.c): the primary-key lookup
 *	  and the writes through the executor; its column layout (layout.c).
 *	  keys.c, held.c, patterns.c (through keys.c) and maintenance.c reach
 *	  the table only through these routines.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_RECORDS_H
#define IDEM_RECORDS_H

#include "access/tableam.h"
#include "executor/executor.h"
#include "nodes/lockoptions.h"
#include "storage/lock.h"
#include "utils/rel.h"

#include "idempotency.h"

/* The columns of idem_keys the extension reads and writes, by name and type */
typedef enum IdemColumn
{
	COL_SCOPE,
	COL_OPERATION,
	COL_KEY,
	COL_REQUEST_HASH,
	COL_STATUS,
	COL_RESPONSE_STATUS,
	COL_RESPONSE,
	COL_RESOURCE_ID,
	COL_RECOVERY_POINT,
	COL_CREATED_AT,
	COL_UPDATED_AT,
	COL_EXPIRES_AT,
	COL_TTL,
	IDEM_NUM_COLUMNS
} IdemColumn;

typedef enum IdemStatus
{
	STATUS_PROCESSING,
	STATUS_COMPLETED,
	STATUS_STUCK
} IdemStatus;

/* How a record stands to the transaction that read it */
#define RECORD_MINE			0x01	/* written by the current transaction */
#define RECORD_BUSY			0x02	/* another open transaction is writing it */
#define RECORD_LOCKED		0x04	/* another open transaction holds a row lock on it */

/* A record as read from idem_keys, copied into the caller's memory context */
typedef struct IdemRecord
{
	IdemStatus	status;
	bytea	   *request_hash;	/* NULL when SQL NULL */
	bool		has_response_status;
	int32		response_status;
	Jsonb	   *response;		/* NULL when SQL NULL */
	text	   *resource_id;	/* NULL when SQL NULL */
	text	   *recovery_point; /* NULL when SQL NULL */
	TimestampTz created_at;
	TimestampTz updated_at;
	TimestampTz expires_at;
	Interval   *ttl;			/* NULL: idempotency.default_ttl */
	int			flags;			/* RECORD_* */
	TransactionId writer_xid;	/* with RECORD_BUSY: the writer's xid */
	ItemPointerData tid;		/* where this version of the row is */
} IdemRecord;

/* idem_keys, open and locked for one call, with its resolved layout */
typedef struct IdemTable
{
	Relation	rel;
	LOCKMODE	lockmode;
	AttrNumber	attnum[IDEM_NUM_COLUMNS];	/* attribute number of each
											 * IdemColumn; 0: absent from
											 * the previous release's
											 * catalog */
	Oid			pkey;			/* the primary key (scope, operation, key) */
	bool		own_rules;		/* no rule of the owner's on its writes
								 * (layout.c, OnlyOwnRules) */
	bool		member;			/* idem_keys itself, a member of the
								 * extension */
	bool		shard;			/* a shard of it on this node, by Citus's
								 * metadata (IdemCitusIsLocalShard) */
} IdemTable;

/* The executor state of the writes of one call */
typedef struct IdemWriter
{
	IdemTable  *table;
	EState	   *estate;
	ResultRelInfo *rri;
	EPQState	epqstate;
	TupleTableSlot *locked;		/* the row version this writer locked */
	TupleTableSlot *row;		/* the row to insert, or the new version */
} IdemWriter;

/* A row to write: values by IdemColumn; isnull, and which ones to set */
typedef struct IdemRow
{
	Datum		values[IDEM_NUM_COLUMNS];
	bool		isnull[IDEM_NUM_COLUMNS];
	bool		set[IDEM_NUM_COLUMNS];
} IdemRow;

extern Oid	IdemRecordsResolve(Oid nspid, text *scope, LOCKMODE lockmode);
extern bool IdemRecordsTryOpen(Oid nspid, text *scope, LOCKMODE lockmode,
							   IdemTable *table);
extern void IdemRecordsOpen(Oid nspid, text *scope, LOCKMODE lockmode,
							IdemTable *table);
extern bool IdemRecordsLocalShards(Oid nspid, List **relids);
extern bool IdemRecordsTryOpenRelation(Oid relid, LOCKMODE lockmode,
									   IdemTable *table);
extern void IdemRecordsClose(IdemTable *table);
extern void IdemRecordsCheckReadable(IdemTable *table);
extern bool IdemRecordsFetch(IdemTable *table, Snapshot snapshot, text *scope,
							 text *operation, text *key, IdemRecord *rec,
							 Datum *row_out);
extern void IdemRecordsFromSlot(IdemTable *table, TupleTableSlot *slot,
								Snapshot snapshot, IdemRecord *rec);
extern IdemStatus IdemRecordsStatus(text *status);
extern Datum IdemRecordsRequired(IdemTable *table, TupleTableSlot *slot,
								 IdemColumn col);

extern void IdemRecordsWriterBegin(IdemTable *table, AclMode modes,
								   const char *function, IdemWriter *w);
extern void IdemRecordsWriterEnd(IdemWriter *w);
extern TM_Result IdemRecordsLock(IdemWriter *w, ItemPointer tid,
								 LockTupleMode mode, LockWaitPolicy policy);
extern void IdemRecordsInsert(IdemWriter *w, IdemRow *row);
extern bool IdemRecordsUpdate(IdemWriter *w, IdemRow *row, bool report_skip);
extern bool IdemRecordsTryUpdate(IdemWriter *w, IdemRow *row, bool *busy);
extern void IdemRecordsKeyLockTag(LOCKTAG *tag, text *scope, text *operation,
								  text *key);
extern bool IdemRecordsDelete(IdemWriter *w, bool report_skip);
extern void IdemRecordsFireAfterTriggers(IdemWriter *w);

extern void IdemRecordsCheckWritable(IdemTable *table, AclMode mode,
									 const char *function);
extern Datum IdemRecordsFormRow(IdemTable *table, IdemRow *row);
extern void IdemRowInit(IdemRow *row);
extern void IdemRowNewRecord(IdemRow *row, text *scope, text *operation,
							 text *key, bytea *hash, bool completed,
							 TimestampTz created_at, TimestampTz updated_at,
							 TimestampTz expires_at, Interval *ttl);
extern void IdemRowSet(IdemRow *row, IdemColumn col, Datum value, bool isnull);
extern TimestampTz IdemAddTtl(TimestampTz when, Interval *ttl);

/* layout.c: the checks of the table's layout, for records.c */
extern void IdemLayoutOf(IdemTable *table);
extern void IdemLayoutRuleStates(ResultRelInfo *rri);
extern const char *IdemColumnName(IdemColumn col);
extern char *IdemQualifiedName(Relation rel);

/* Do two fingerprints differ (IS DISTINCT FROM)? */
static inline bool
IdemHashesDiffer(bytea *a, bytea *b)
{
	if (a == NULL || b == NULL)
		return a != b;
	return !IdemVarlenaEqual(a, b);
}

/* The value of column col in slot (which has all attributes deformed) */
#define SlotColumn(table, slot, col) \
	((slot)->tts_values[(table)->attnum[(col)] - 1])
#define SlotColumnIsNull(table, slot, col) \
	((slot)->tts_isnull[(table)->attnum[(col)] - 1])

#endif							/* IDEM_RECORDS_H */
