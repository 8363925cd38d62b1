/*-------------------------------------------------------------------------
 *
 * compat.h
 *	  The one place for differences between the PostgreSQL versions we
 *	  build against: 15, 16, 17, 18 and 19.
 *
 * Each difference is one guard here, named after what it does, and the .c
 * files call the name without a PG_VERSION_NUM test of their own.  Where
 * a newer version only added to an API, the newer spelling is emulated on
 * older versions, so that the code reads like today's PostgreSQL.  The
 * macros name functions and types of headers that the files using them
 * include themselves; this header includes nothing but postgres.h.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_COMPAT_H
#define IDEM_COMPAT_H

#include "postgres.h"

#if PG_VERSION_NUM < 150000
#error "idempotency needs PostgreSQL 15 or later"
#endif

/*
 * PostgreSQL 18 replaced pg_attribute_noreturn(), written after a
 * declaration, by pg_noreturn, written before it.  GCC and Clang accept the
 * attribute in front as well.
 */
#ifndef pg_noreturn
#define pg_noreturn pg_attribute_noreturn()
#endif

/* PostgreSQL 16 checks rights on any object through object_aclcheck */
#if PG_VERSION_NUM >= 160000
#define IdemFunctionAclCheck(funcid, roleid, mode) \
	object_aclcheck(ProcedureRelationId, (funcid), (roleid), (mode))
#else
#define IdemFunctionAclCheck(funcid, roleid, mode) \
	pg_proc_aclcheck((funcid), (roleid), (mode))
#endif

/*
 * PostgreSQL 16 tells which indexes an update must touch (TU_None, TU_All,
 * TU_Summarizing) where 15 answered true or false.
 */
#if PG_VERSION_NUM < 160000
typedef bool TU_UpdateIndexes;
#define TU_None false
#endif

/*
 * Inserting index entries for a new tuple version: PostgreSQL 19 takes
 * flags (EIIT_*) where 16 to 18 took three booleans and 15 two.
 */
#if PG_VERSION_NUM < 190000
#define EIIT_IS_UPDATE			(1 << 0)
#define EIIT_NO_DUPE_ERROR		(1 << 1)
#define EIIT_ONLY_SUMMARIZING	(1 << 2)
#endif
#if PG_VERSION_NUM >= 190000
#define IdemInsertIndexTuples(rri, estate, flags, slot, arbiterIndexes, specConflict) \
	ExecInsertIndexTuples((rri), (estate), (flags), (slot), (arbiterIndexes), (specConflict))
#elif PG_VERSION_NUM >= 160000
#define IdemInsertIndexTuples(rri, estate, flags, slot, arbiterIndexes, specConflict) \
	ExecInsertIndexTuples((rri), (slot), (estate), ((flags) & EIIT_IS_UPDATE) != 0, \
						  ((flags) & EIIT_NO_DUPE_ERROR) != 0, (specConflict), \
						  (arbiterIndexes), ((flags) & EIIT_ONLY_SUMMARIZING) != 0)
#else
#define IdemInsertIndexTuples(rri, estate, flags, slot, arbiterIndexes, specConflict) \
	ExecInsertIndexTuples((rri), (slot), (estate), ((flags) & EIIT_IS_UPDATE) != 0, \
						  ((flags) & EIIT_NO_DUPE_ERROR) != 0, (specConflict), \
						  (arbiterIndexes))
#endif

/*
 * Deleting and updating a tuple: PostgreSQL 19 takes options after the
 * command id, and a delete that moves a row to another partition says so
 * there (TABLE_DELETE_CHANGING_PARTITION) instead of in a last boolean.
 * Older versions know no other option.
 */
#if PG_VERSION_NUM >= 190000
#define IdemTableTupleDelete(rel, tid, cid, options, snapshot, crosscheck, wait, tmfd) \
	table_tuple_delete((rel), (tid), (cid), (options), (snapshot), (crosscheck), (wait), (tmfd))
#define IdemTableTupleUpdate(rel, otid, slot, cid, options, snapshot, crosscheck, wait, tmfd, lockmode, update_indexes) \
	table_tuple_update((rel), (otid), (slot), (cid), (options), (snapshot), (crosscheck), \
					   (wait), (tmfd), (lockmode), (update_indexes))
#else
#define TABLE_DELETE_CHANGING_PARTITION	(1 << 0)
#define IdemTableTupleDelete(rel, tid, cid, options, snapshot, crosscheck, wait, tmfd) \
	table_tuple_delete((rel), (tid), (cid), (snapshot), (crosscheck), (wait), (tmfd), \
					   ((options) & TABLE_DELETE_CHANGING_PARTITION) != 0)
#define IdemTableTupleUpdate(rel, otid, slot, cid, options, snapshot, crosscheck, wait, tmfd, lockmode, update_indexes) \
	table_tuple_update((rel), (otid), (slot), (cid), (snapshot), (crosscheck), \
					   (wait), (tmfd), (lockmode), (update_indexes))
#endif

/*
 * A shared hash table of a fixed number of entries: PostgreSQL 19 takes that
 * number once, where older versions took an initial and a maximum size.
 */
#if PG_VERSION_NUM >= 190000
#define IdemShmemInitHash(name, nelems, infoP, hash_flags) \
	ShmemInitHash((name), (nelems), (infoP), (hash_flags))
#else
#define IdemShmemInitHash(name, nelems, infoP, hash_flags) \
	ShmemInitHash((name), (nelems), (nelems), (infoP), (hash_flags))
#endif

/* PostgreSQL 16 names a relation's storage by RelFileLocator */
#if PG_VERSION_NUM >= 160000
#define RelationFileNumber(rel)	((rel)->rd_locator.relNumber)
#else
#define RelationFileNumber(rel)	((rel)->rd_node.relNode)
#endif

/* PostgreSQL 16.1 renamed the accessor of the local backend status array */
#if PG_VERSION_NUM < 160001
#define pgstat_get_local_beentry_by_index(idx) pgstat_fetch_stat_local_beentry(idx)
#endif

/* PostgreSQL 17 keeps the local transaction id in the PGPROC's vxid */
#if PG_VERSION_NUM >= 170000
#define CurrentLocalXid()	(MyProc->vxid.lxid)
#else
#define CurrentLocalXid()	(MyProc->lxid)
#endif

/*
 * PostgreSQL 17 gives an extension's wait events names of their own in
 * pg_stat_activity; before, every one shows as "Extension".
 */
#if PG_VERSION_NUM >= 170000
#define IdemWaitEventNew(name)	WaitEventExtensionNew(name)
#else
#define IdemWaitEventNew(name)	PG_WAIT_EXTENSION
#endif

/*
 * PostgreSQL 18: RelationGetPrimaryKeyIndex takes whether a deferrable
 * primary key will do (ours is not deferrable).
 */
#if PG_VERSION_NUM >= 180000
#define IdemPrimaryKeyIndex(rel)	RelationGetPrimaryKeyIndex((rel), false)
#else
#define IdemPrimaryKeyIndex(rel)	RelationGetPrimaryKeyIndex(rel)
#endif

/*
 * An index scan without instrumentation: PostgreSQL 18 takes what to count
 * into, 19 also flags for the table fetches (none).
 */
#if PG_VERSION_NUM >= 190000
#define IdemIndexBeginScan(heap, index, snapshot, nkeys, norderbys) \
	index_beginscan((heap), (index), (snapshot), NULL, (nkeys), (norderbys), 0)
#elif PG_VERSION_NUM >= 180000
#define IdemIndexBeginScan(heap, index, snapshot, nkeys, norderbys) \
	index_beginscan((heap), (index), (snapshot), NULL, (nkeys), (norderbys))
#else
#define IdemIndexBeginScan(heap, index, snapshot, nkeys, norderbys) \
	index_beginscan((heap), (index), (snapshot), (nkeys), (norderbys))
#endif

#endif							/* IDEM_COMPAT_H */
