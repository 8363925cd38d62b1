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

/* ... and on a schema */
#if PG_VERSION_NUM >= 160000
#define IdemNamespaceAclCheck(nspid, roleid, mode) \
	object_aclcheck(NamespaceRelationId, (nspid), (roleid), (mode))
#else
#define IdemNamespaceAclCheck(nspid, roleid, mode) \
	pg_namespace_aclcheck((nspid), (roleid), (mode))
#endif

/* ... and on a database */
#if PG_VERSION_NUM >= 160000
#define IdemDatabaseAclCheck(dbid, roleid, mode) \
	object_aclcheck(DatabaseRelationId, (dbid), (roleid), (mode))
#else
#define IdemDatabaseAclCheck(dbid, roleid, mode) \
	pg_database_aclcheck((dbid), (roleid), (mode))
#endif

/*
 * PostgreSQL 18 added whether to log a failed conditional lock to
 * LockAcquireExtended
 */
#if PG_VERSION_NUM >= 180000
#define IdemLockAcquireExtended(locktag, lockmode, session, dontwait, locallockp) \
	LockAcquireExtended((locktag), (lockmode), (session), (dontwait), true, \
						(locallockp), false)
#else
#define IdemLockAcquireExtended(locktag, lockmode, session, dontwait, locallockp) \
	LockAcquireExtended((locktag), (lockmode), (session), (dontwait), true, \
						(locallockp))
#endif

/*
 * PostgreSQL 16 made SET ROLE a separate option of a membership; before,
 * every member could SET ROLE.
 */
#if PG_VERSION_NUM >= 160000
#define IdemMemberCanSetRole(member, role)	member_can_set_role((member), (role))
#else
#define IdemMemberCanSetRole(member, role)	is_member_of_role((member), (role))
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

/*
 * The syscache of pg_extension by OID, whose invalidations say that an
 * extension came or went: EXTENSIONOID, except in PostgreSQL 17, whose
 * minor release that added it appended it to the list as ZEXTENSIONOID.
 */
#if PG_VERSION_NUM >= 170000 && PG_VERSION_NUM < 180000
#define IDEM_EXTENSION_SYSCACHE	ZEXTENSIONOID
#else
#define IDEM_EXTENSION_SYSCACHE	EXTENSIONOID
#endif

/* PostgreSQL 16.1 renamed the accessor of the local backend status array */
#if PG_VERSION_NUM < 160001
#define pgstat_get_local_beentry_by_index(idx) pgstat_fetch_stat_local_beentry(idx)
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
 * PostgreSQL 17: LockHeldByMe can also answer for a stronger mode; we ask
 * for the very mode.
 */
#if PG_VERSION_NUM >= 170000
#define IdemLockHeldByMe(locktag, lockmode)	LockHeldByMe((locktag), (lockmode), false)
#else
#define IdemLockHeldByMe(locktag, lockmode)	LockHeldByMe((locktag), (lockmode))
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

/* A sequential scan: PostgreSQL 19 takes flags (ScanOptions; none here) */
#if PG_VERSION_NUM >= 190000
#define IdemTableBeginScan(rel, snapshot, nkeys, key) \
	table_beginscan((rel), (snapshot), (nkeys), (key), 0)
#else
#define IdemTableBeginScan(rel, snapshot, nkeys, key) \
	table_beginscan((rel), (snapshot), (nkeys), (key))
#endif

/*
 * The range table of an EState that writes one relation, as the logical
 * apply worker builds it: PostgreSQL 16 moved permissions into
 * RTEPermissionInfo (addRTEPermissionInfo, parser/parse_relation.h), 18
 * added the set of unpruned relations.
 */
#if PG_VERSION_NUM >= 180000
#define IdemInitRangeTable(estate, rte, perminfos) \
	ExecInitRangeTable((estate), list_make1(rte), (perminfos), bms_make_singleton(1))
#elif PG_VERSION_NUM >= 160000
#define IdemInitRangeTable(estate, rte, perminfos) \
	ExecInitRangeTable((estate), list_make1(rte), (perminfos))
#else
#define IdemInitRangeTable(estate, rte, perminfos) \
	ExecInitRangeTable((estate), list_make1(rte))
#endif
#if PG_VERSION_NUM >= 160000
#define IdemAddPermissionInfo(perminfos, rte) \
	((void) addRTEPermissionInfo((perminfos), (rte)))
#else
#define IdemAddPermissionInfo(perminfos, rte)	((void) 0)
#endif

/* An EPQState with no plan: PostgreSQL 16 added the result relations */
#if PG_VERSION_NUM >= 160000
#define IdemEvalPlanQualInit(epqstate, estate) \
	EvalPlanQualInit((epqstate), (estate), NULL, NIL, -1, NIL)
#else
#define IdemEvalPlanQualInit(epqstate, estate) \
	EvalPlanQualInit((epqstate), (estate), NULL, NIL, -1)
#endif

/*
 * The prepared CHECK constraints of a ResultRelInfo: PostgreSQL 18 renamed
 * the field and added NOT ENFORCED constraints, which ExecRelCheck skips.
 */
#if PG_VERSION_NUM >= 180000
#define IdemResultRelChecks(rri)	((rri)->ri_CheckConstraintExprs)
#define IdemCheckIsEnforced(check)	((check)->ccenforced)
#else
#define IdemResultRelChecks(rri)	((rri)->ri_ConstraintExprs)
#define IdemCheckIsEnforced(check)	true
#endif

#endif							/* IDEM_COMPAT_H */
