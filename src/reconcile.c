/*-------------------------------------------------------------------------
 *
 * reconcile.c
 *	  Who may run a reconciler, as whom, and with which search_path: the
 *	  checks made when one is registered (the trigger of idem_reconcilers,
 *	  which idem_set_reconciler's writes go through too) and again right
 *	  before every call; the call itself; and its time limit.  maintenance.c
 *	  decides when a stuck record is reconciled; this file, whether and how.
 *
 * A reconciler is a row of idem_reconcilers: an operation, a function
 * signature (text), the role it runs as (run_as) and the role that wrote
 * the row (registered_by, set by the trigger).  Nothing in that row is
 * trusted at call time: anyone who may write the table can write any value,
 * and rights change after a write.  Before every call (ReconcilerRunnable)
 * run_as must be no superuser unless idempotency.enable_superuser_reconcilers
 * is on, the signature must resolve to a plain function(idem_keys) that
 * run_as may execute, and one rule must hold (Trusted): every role that
 * controls code the call will run can already act as run_as; the roles are
 * listed at ReconcilerRunnable.  Otherwise the reconciler is skipped with
 * one WARNING (ReportSkipped; from the worker once per cause, backoff.c).
 * The call runs as run_as, security-restricted, with search_path pinned to
 * pg_catalog, the extension's schema, pg_temp, and every setting it
 * changes undone afterwards.
 *
 * Time limit: idempotency.reconciler_timeout cancels the call; one that
 * catches the cancel is ended with its process a grace later (the timer
 * functions at the end of this file).  A maintenance function called inside
 * a call is refused, so nothing re-arms those clocks.  Locks: none of its
 * own; the caller holds the stuck record FOR UPDATE.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/transam.h"
#include "access/table.h"
#include "catalog/namespace.h"
#include "catalog/dependency.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_class.h"
#include "catalog/pg_depend.h"
#include "catalog/pg_database.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_operator.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/regproc.h"
#include "utils/rel.h"
#include "utils/syscache.h"
#include "utils/timeout.h"
#include "utils/varlena.h"

#include "idempotency.h"
#include "maintenance.h"

PG_FUNCTION_INFO_V1(idem_reconcilers_check);

/*
 * OID of a stored reconciler signature, InvalidOid when no function has it
 * (dropped since it was registered).  Resolved under the pinned search_path.
 */
static Oid
ResolveHandler(const IdemReconciler *rc)
{
	LOCAL_FCINFO(fcinfo, 1);
	Datum		result;

	InitFunctionCallInfoData(*fcinfo, NULL, 1, InvalidOid, NULL, NULL);
	fcinfo->args[0].value = CStringGetTextDatum(rc->handler);
	fcinfo->args[0].isnull = false;
	result = to_regprocedure(fcinfo);
	if (fcinfo->isnull)
		return InvalidOid;
	return DatumGetObjectId(result);
}

/*
 * Pin search_path for code run as another role, the way PostgreSQL 17 runs
 * maintenance commands, with the extension's schema after pg_catalog; the
 * caller has opened a GUC nest level that undoes it.  Nothing the session,
 * a role or the database set can then make a reconciler's unqualified name
 * resolve to an object planted by someone else.
 */
static void
PinSearchPath(Oid nspid)
{
	char	   *path;

	path = psprintf("pg_catalog, %s, pg_temp",
					quote_identifier(get_namespace_name(nspid)));
	(void) set_config_option("search_path", path, PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	pfree(path);
}

/*
 * What a role controls that a reconciler's call runs, or what keeps the
 * call from being made at all (the first four): the one list of reasons
 * for skipping a reconciler, each reported by ReportSkipped.
 */
typedef enum Control
{
	CONTROL_RUN_AS_GONE,		/* the run-as role no longer exists */
	CONTROL_REGISTRAR_GONE,		/* the registrar no longer exists */
	CONTROL_HANDLER_GONE,		/* no function has the stored signature */
	CONTROL_HANDLER_FAULT,		/* the function is not a reconciler */
	CONTROL_SUPERUSER,			/* run_as is a superuser, and not allowed */
	CONTROL_REGISTRAR,			/* wrote the row: chose function and role */
	CONTROL_FUNCTION,			/* owns the function: can change its body */
	CONTROL_SESSION,			/* the calling session, with temporary objects */
	CONTROL_SCHEMA_OWNER,		/* owns a schema on the effective path */
	CONTROL_SCHEMA_CREATE,		/* may create in one (InvalidOid: PUBLIC) */
	CONTROL_SCHEMA_MISSING,		/* may create a schema named on it */
	CONTROL_SCHEMA_FUNCTION,	/* owns a function in one */
	CONTROL_SCHEMA_OPERATOR,	/* owns an operator in one */
	CONTROL_TABLE_OWNER,		/* owns idem_keys: attaches any code to it */
	CONTROL_TABLE_TRIGGER,		/* may create triggers on idem_keys */
	CONTROL_TABLE_CODE,			/* owns a function that code on it calls */
	CONTROL_COLUMN_TYPE			/* owns the type of one of its columns */
} Control;

/* The checks of one call, and the first reason found to skip it */
typedef struct TrustCheck
{
	const IdemReconciler *rc;
	Oid			handler;
	Oid			rowtype;
	Oid			registered_by;
	bool		refused;		/* a reason was found: the rest is skipped */
	Control		what;
	Oid			role;			/* the role that controls it; PUBLIC: InvalidOid */
	Oid			object;			/* the schema, function, operator or type */
	const char *name;			/* the name of a schema that does not exist */
	IdemHandlerFault fault;		/* CONTROL_HANDLER_FAULT */
} TrustCheck;

/* Note the reason to skip the call, unless one was noted already */
static void
Refuse(TrustCheck *tc, Control what, Oid role, Oid object, const char *name)
{
	if (tc->refused)
		return;
	tc->refused = true;
	tc->what = what;
	tc->role = role;
	tc->object = object;
	tc->name = name;
}

/*
 * The rule: a role that controls code the call runs (what, object) must
 * already be able to act as the run-as role, or the reconciler could hand
 * it rights it lacks.  PUBLIC (InvalidOid) never can.  false, with the
 * reason noted, when it cannot.
 */
static bool
Trusted(TrustCheck *tc, Oid role, Control what, Oid object)
{
	if (tc->refused)
		return false;
	if (OidIsValid(role) && IdemCanActAs(role, tc->rc->run_as))
		return true;
	Refuse(tc, what, role, object, NULL);
	return false;
}

/*
 * The role that may create in a schema owned by owner: the database's
 * owner for pg_database_owner (the owner of public since PostgreSQL 15),
 * whose only member it is.
 */
static Oid
EffectiveOwner(Oid owner)
{
	HeapTuple	tuple;

	if (owner != ROLE_PG_DATABASE_OWNER)
		return owner;
	tuple = SearchSysCache1(DATABASEOID, ObjectIdGetDatum(MyDatabaseId));
	if (!HeapTupleIsValid(tuple))
		elog(ERROR, "cache lookup failed for database %u", MyDatabaseId);
	owner = ((Form_pg_database) GETSTRUCT(tuple))->datdba;
	ReleaseSysCache(tuple);
	return owner;
}

/* Which right of which object a role scan asks about */
typedef enum RoleRight
{
	RIGHT_SCHEMA_CREATE,
	RIGHT_DATABASE_CREATE,
	RIGHT_TABLE_TRIGGER
} RoleRight;

/* Has role the right on object, itself or through a role it is member of? */
static bool
HasRight(RoleRight right, Oid object, Oid role)
{
	switch (right)
	{
		case RIGHT_SCHEMA_CREATE:
			return IdemNamespaceAclCheck(object, role, ACL_CREATE) == ACLCHECK_OK;
		case RIGHT_DATABASE_CREATE:
			return IdemDatabaseAclCheck(object, role, ACL_CREATE) == ACLCHECK_OK;
		case RIGHT_TABLE_TRIGGER:
			return pg_class_aclcheck(object, role, ACL_TRIGGER) == ACLCHECK_OK;
	}
	return false;
}

/*
 * Apply the rule to every role that has the right on object: the first,
 * by name, that may not act as run_as is the reason.  Every role is
 * asked, so that a right held through membership in a grantee counts too.
 */
static void
TrustRolesWith(TrustCheck *tc, RoleRight right, Oid object, Control what,
			   Oid reported)
{
	Relation	authid;
	SysScanDesc scan;
	HeapTuple	tuple;
	Oid			found = InvalidOid;
	NameData	found_name;

	if (tc->refused)
		return;
	authid = table_open(AuthIdRelationId, AccessShareLock);
	scan = systable_beginscan(authid, InvalidOid, false, NULL, 0, NULL);
	while (HeapTupleIsValid(tuple = systable_getnext(scan)))
	{
		Form_pg_authid role = (Form_pg_authid) GETSTRUCT(tuple);

		/* pg_database_owner stands for the database's owner, asked apart */
		if (role->oid == ROLE_PG_DATABASE_OWNER)
			continue;
		if (OidIsValid(found) &&
			strcmp(NameStr(role->rolname), NameStr(found_name)) >= 0)
			continue;
		if (HasRight(right, object, role->oid) &&
			!IdemCanActAs(role->oid, tc->rc->run_as))
		{
			found = role->oid;
			found_name = role->rolname;
		}
	}
	systable_endscan(scan);
	table_close(authid, AccessShareLock);
	if (OidIsValid(found))
		(void) Trusted(tc, found, what, reported);
}

/*
 * Apply the rule to the owner of every function or operator of schema
 * nspid (catalog catalogid, with the schema and owner columns given).
 * Planted while its owner could still create there (before CREATE was
 * revoked from PUBLIC, say), it could be a better match for a call in the
 * reconciler than the one meant.  The one of lowest OID is reported.
 */
static void
TrustSchemaObjects(TrustCheck *tc, Oid catalogid, AttrNumber nspatt,
				   AttrNumber owneratt, Oid nspid, Control what)
{
	Relation	rel;
	SysScanDesc scan;
	ScanKeyData key;
	HeapTuple	tuple;
	Oid			found = InvalidOid;
	Oid			found_owner = InvalidOid;

	if (tc->refused)
		return;
	ScanKeyInit(&key, nspatt, BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(nspid));
	rel = table_open(catalogid, AccessShareLock);
	scan = systable_beginscan(rel, InvalidOid, false, NULL, 1, &key);
	while (HeapTupleIsValid(tuple = systable_getnext(scan)))
	{
		bool		isnull;
		Oid			oid = DatumGetObjectId(heap_getattr(tuple, 1, RelationGetDescr(rel), &isnull));
		Oid			owner = DatumGetObjectId(heap_getattr(tuple, owneratt,
														  RelationGetDescr(rel), &isnull));

		if ((!OidIsValid(found) || oid < found) &&
			!IdemCanActAs(owner, tc->rc->run_as))
		{
			found = oid;
			found_owner = owner;
		}
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	if (OidIsValid(found) && !Trusted(tc, found_owner, what, found))
		tc->name = get_namespace_name(nspid);
}

/*
 * A schema on the call's effective search_path: whoever owns it, may
 * create in it, or owns a function or operator in it could plant an
 * overload that is a better match for a call in the reconciler than the
 * one meant, whatever the order of the path.  A schema that does not
 * exist could be created by any role that may create schemas in the
 * database.
 */
static void
TrustSchema(TrustCheck *tc, Oid nspid, const char *name)
{
	HeapTuple	tuple;
	Datum		aclDatum;
	bool		isnull;

	if (tc->refused)
		return;
	if (!OidIsValid(nspid))
	{
		(void) Trusted(tc, EffectiveOwner(ROLE_PG_DATABASE_OWNER),
					   CONTROL_SCHEMA_MISSING, InvalidOid);
		TrustRolesWith(tc, RIGHT_DATABASE_CREATE, MyDatabaseId,
					   CONTROL_SCHEMA_MISSING, InvalidOid);
		if (tc->refused)
			tc->name = name;
		return;
	}

	tuple = SearchSysCache1(NAMESPACEOID, ObjectIdGetDatum(nspid));
	if (!HeapTupleIsValid(tuple))
		elog(ERROR, "cache lookup failed for schema %u", nspid);

	/* Its owner may grant itself CREATE whatever the ACL says */
	(void) Trusted(tc, EffectiveOwner(((Form_pg_namespace) GETSTRUCT(tuple))->nspowner),
				   CONTROL_SCHEMA_OWNER, nspid);
	aclDatum = SysCacheGetAttr(NAMESPACEOID, tuple, Anum_pg_namespace_nspacl, &isnull);
	if (!isnull)
	{
		Acl		   *acl = DatumGetAclP(aclDatum);
		AclItem    *items = ACL_DAT(acl);
		int			i;

		for (i = 0; i < ACL_NUM(acl); i++)
			if (items[i].ai_grantee == ACL_ID_PUBLIC &&
				(ACLITEM_GET_PRIVS(items[i]) & ACL_CREATE) != 0)
				(void) Trusted(tc, InvalidOid, CONTROL_SCHEMA_CREATE, nspid);
	}
	ReleaseSysCache(tuple);

	TrustRolesWith(tc, RIGHT_SCHEMA_CREATE, nspid, CONTROL_SCHEMA_CREATE, nspid);
	TrustSchemaObjects(tc, ProcedureRelationId, Anum_pg_proc_pronamespace,
					   Anum_pg_proc_proowner, nspid, CONTROL_SCHEMA_FUNCTION);
	TrustSchemaObjects(tc, OperatorRelationId, Anum_pg_operator_oprnamespace,
					   Anum_pg_operator_oprowner, nspid, CONTROL_SCHEMA_OPERATOR);
}

/*
 * The schemas of the reconciler function's own SET search_path, which
 * replaces the pinned one while its body runs: each name, with "$user" as
 * the run-as role (whom the body runs as).  pg_catalog takes a superuser
 * to change, and pg_temp is the session's (CONTROL_SESSION).
 */
static void
TrustFunctionPath(TrustCheck *tc)
{
	HeapTuple	tuple;
	Datum		config;
	bool		isnull;
	char	   *path = NULL;
	List	   *names;
	ListCell   *lc;

	tuple = SearchSysCache1(PROCOID, ObjectIdGetDatum(tc->handler));
	if (!HeapTupleIsValid(tuple))
		return;
	config = SysCacheGetAttr(PROCOID, tuple, Anum_pg_proc_proconfig, &isnull);
	if (!isnull)
	{
		Datum	   *items;
		int			n;
		int			i;

		deconstruct_array(DatumGetArrayTypeP(config), TEXTOID, -1, false,
						  TYPALIGN_INT, &items, NULL, &n);
		for (i = 0; i < n; i++)
		{
			char	   *item = TextDatumGetCString(items[i]);

			if (pg_strncasecmp(item, "search_path=", 12) == 0)
				path = item + 12;
		}
	}
	ReleaseSysCache(tuple);
	if (path == NULL)
		return;

	/* A path PostgreSQL would not parse is refused by it at the call */
	if (!SplitIdentifierString(path, ',', &names))
		return;
	foreach(lc, names)
	{
		char	   *name = (char *) lfirst(lc);

		if (strcmp(name, "$user") == 0)
			name = GetUserNameFromId(tc->rc->run_as, false);
		if (strcmp(name, "pg_catalog") == 0 || strncmp(name, "pg_temp", 7) == 0)
			continue;
		TrustSchema(tc, get_namespace_oid(name, true), name);
	}
}

/*
 * The code attached to object (idem_keys, or the type of one of its
 * columns) that PostgreSQL runs inside a write: the triggers, CHECK and
 * other constraints, defaults and generated columns, indexes, rules and
 * policies of the table, the constraints of a domain, all of which depend
 * on it automatically.  The owner of every function they call, directly or
 * through an operator, can change what the write runs.
 */
static void
TrustAttachedCode(TrustCheck *tc, Oid classid, Oid objid)
{
	Relation	depend;
	SysScanDesc scan;
	ScanKeyData key[2];
	HeapTuple	tuple;
	List	   *attached = NIL;
	ListCell   *lc;

	if (tc->refused)
		return;
	depend = table_open(DependRelationId, AccessShareLock);
	ScanKeyInit(&key[0], Anum_pg_depend_refclassid, BTEqualStrategyNumber,
				F_OIDEQ, ObjectIdGetDatum(classid));
	ScanKeyInit(&key[1], Anum_pg_depend_refobjid, BTEqualStrategyNumber,
				F_OIDEQ, ObjectIdGetDatum(objid));
	scan = systable_beginscan(depend, DependReferenceIndexId, true, NULL, 2, key);
	while (HeapTupleIsValid(tuple = systable_getnext(scan)))
	{
		Form_pg_depend dep = (Form_pg_depend) GETSTRUCT(tuple);
		ObjectAddress *addr;

		if (dep->deptype != DEPENDENCY_AUTO)
			continue;
		addr = palloc(sizeof(ObjectAddress));
		addr->classId = dep->classid;
		addr->objectId = dep->objid;
		addr->objectSubId = 0;
		attached = lappend(attached, addr);
	}
	systable_endscan(scan);

	foreach(lc, attached)
	{
		ObjectAddress *addr = (ObjectAddress *) lfirst(lc);

		ScanKeyInit(&key[0], Anum_pg_depend_classid, BTEqualStrategyNumber,
					F_OIDEQ, ObjectIdGetDatum(addr->classId));
		ScanKeyInit(&key[1], Anum_pg_depend_objid, BTEqualStrategyNumber,
					F_OIDEQ, ObjectIdGetDatum(addr->objectId));
		scan = systable_beginscan(depend, DependDependerIndexId, true, NULL, 2, key);
		while (HeapTupleIsValid(tuple = systable_getnext(scan)))
		{
			Form_pg_depend dep = (Form_pg_depend) GETSTRUCT(tuple);
			Oid			func = InvalidOid;

			if (dep->refclassid == ProcedureRelationId)
				func = dep->refobjid;
			else if (dep->refclassid == OperatorRelationId)
				func = get_opcode(dep->refobjid);
			if (OidIsValid(func) &&
				!Trusted(tc, IdemFunctionOwner(func), CONTROL_TABLE_CODE, func))
				break;
		}
		systable_endscan(scan);
		if (tc->refused)
			break;
	}
	table_close(depend, AccessShareLock);
	list_free_deep(attached);
}

/*
 * idem_keys, which the reconciler writes (through idem_complete and
 * idem_release, or directly): a write runs whatever its owner, and every
 * role granted TRIGGER, attached to it, with the writer's rights.  So do
 * the constraints of a column's domain, which the domain's owner may add.
 */
static void
TrustKeysTable(TrustCheck *tc, Oid keys)
{
	HeapTuple	tuple;
	int			natts;
	AttrNumber	attnum;

	/* the caller locked it, so it is there */
	tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(keys));
	if (!HeapTupleIsValid(tuple))
		elog(ERROR, "cache lookup failed for relation %u", keys);
	natts = ((Form_pg_class) GETSTRUCT(tuple))->relnatts;
	(void) Trusted(tc, ((Form_pg_class) GETSTRUCT(tuple))->relowner,
				   CONTROL_TABLE_OWNER, keys);
	ReleaseSysCache(tuple);
	TrustRolesWith(tc, RIGHT_TABLE_TRIGGER, keys, CONTROL_TABLE_TRIGGER, keys);
	TrustAttachedCode(tc, RelationRelationId, keys);

	for (attnum = 1; attnum <= natts && !tc->refused; attnum++)
	{
		Oid			type = get_atttype(keys, attnum);
		HeapTuple	typtuple;
		Oid			owner;

		/* dropped columns have none; built-in types take a superuser */
		if (!OidIsValid(type) || type < FirstNormalObjectId)
			continue;
		typtuple = SearchSysCache1(TYPEOID, ObjectIdGetDatum(type));
		if (!HeapTupleIsValid(typtuple))
			continue;
		owner = ((Form_pg_type) GETSTRUCT(typtuple))->typowner;
		ReleaseSysCache(typtuple);
		if (Trusted(tc, owner, CONTROL_COLUMN_TYPE, type))
			TrustAttachedCode(tc, TypeRelationId, type);
	}
}

/*
 * errhint of ReportSkipped: how to let the reconciler run, for each
 * reason; for use inside ereport().
 */
static int
ErrhintSkipped(const TrustCheck *tc, const char *role, const char *schema,
			   const char *run_as)
{
	switch (tc->what)
	{
		case CONTROL_RUN_AS_GONE:
		case CONTROL_REGISTRAR_GONE:
		case CONTROL_HANDLER_FAULT:
			return errhint("Register the reconciler again with idem_set_reconciler, or remove it by passing NULL.");
		case CONTROL_SUPERUSER:
			return errhint("Register it again to run as a role that is not a superuser.  Turning on idempotency.enable_superuser_reconcilers lets every table, view, type and function a reconciler touches run code as a superuser.");
		case CONTROL_HANDLER_GONE:
			return errhint("Create the function again, register another reconciler with idem_set_reconciler, or remove it by passing NULL.");
		case CONTROL_REGISTRAR:
			return errhint("Register the reconciler again with idem_set_reconciler as a role that may, or remove it by passing NULL.");
		case CONTROL_FUNCTION:
			return errhint("Register a function owned by a role that may act as role \"%s\", or remove the reconciler by passing NULL.",
						   run_as);
		case CONTROL_SESSION:
			return errhint("Run the reconcilers from a session that created no temporary tables, or let the background worker run them.");
		case CONTROL_SCHEMA_OWNER:
			return errhint("Register the reconciler to run as a role that role \"%s\" may act as, or keep the extension in a schema in which only roles that may act as role \"%s\" can create objects.",
						   role, run_as);
		case CONTROL_SCHEMA_CREATE:
			if (!OidIsValid(tc->role))
				return errhint("Revoke CREATE on schema \"%s\" from PUBLIC.", schema);
			return errhint("Revoke CREATE on schema \"%s\" from role \"%s\", or register the reconciler to run as a role that it may act as.",
						   schema, role);
		case CONTROL_SCHEMA_MISSING:
			return errhint("Create schema \"%s\" owned by a role that may act as role \"%s\", or leave it out of the function's search_path.",
						   tc->name, run_as);
		case CONTROL_SCHEMA_FUNCTION:
		case CONTROL_SCHEMA_OPERATOR:
			return errhint("Move it to another schema or give it an owner that may act as role \"%s\".",
						   run_as);
		case CONTROL_TABLE_OWNER:
			return errhint("Register the reconciler to run as a role that role \"%s\" may act as, or give table \"idem_keys\" an owner that may act as role \"%s\".",
						   role, run_as);
		case CONTROL_TABLE_TRIGGER:
			return errhint("Revoke TRIGGER on table \"idem_keys\" from role \"%s\", or register the reconciler to run as a role that it may act as.",
						   role);
		case CONTROL_TABLE_CODE:
		case CONTROL_COLUMN_TYPE:
			return errhint("Give it an owner that may act as role \"%s\", or register the reconciler to run as a role that role \"%s\" may act as.",
						   run_as, role);
	}
	return 0;
}

/*
 * The reason for the view idem_reconciler_status: what keeps the call
 * from being made, or which role controls what (the WARNING says more).
 */
static char *
SkipReason(const TrustCheck *tc, const char *role, const char *schema)
{
	switch (tc->what)
	{
		case CONTROL_RUN_AS_GONE:
			return pstrdup("the role it runs as no longer exists");
		case CONTROL_REGISTRAR_GONE:
			return pstrdup("the role that registered it no longer exists");
		case CONTROL_SUPERUSER:
			return pstrdup("it runs as a superuser, and idempotency.enable_superuser_reconcilers is off");
		case CONTROL_HANDLER_GONE:
			return pstrdup("no function has its signature");
		case CONTROL_HANDLER_FAULT:
			return pstrdup("its function cannot be a reconciler");
		case CONTROL_REGISTRAR:
			return psprintf("role \"%s\", which registered it, may not act as the role it runs as", role);
		case CONTROL_FUNCTION:
			return psprintf("role \"%s\", which owns its function, may not act as the role it runs as", role);
		case CONTROL_SESSION:
			return psprintf("the calling session of role \"%s\" has temporary objects", role);
		case CONTROL_SCHEMA_OWNER:
			return psprintf("role \"%s\" owns schema \"%s\" on its search_path", role, schema);
		case CONTROL_SCHEMA_CREATE:
			if (!OidIsValid(tc->role))
				return psprintf("PUBLIC may create in schema \"%s\" on its search_path", schema);
			return psprintf("role \"%s\" may create in schema \"%s\" on its search_path", role, schema);
		case CONTROL_SCHEMA_MISSING:
			return psprintf("role \"%s\" may create schema \"%s\" of its search_path", role, tc->name);
		case CONTROL_SCHEMA_FUNCTION:
			return psprintf("role \"%s\" owns a function in schema \"%s\" on its search_path", role, schema);
		case CONTROL_SCHEMA_OPERATOR:
			return psprintf("role \"%s\" owns an operator in schema \"%s\" on its search_path", role, schema);
		case CONTROL_TABLE_OWNER:
			return psprintf("role \"%s\" owns table \"idem_keys\"", role);
		case CONTROL_TABLE_TRIGGER:
			return psprintf("role \"%s\" may create triggers on table \"idem_keys\"", role);
		case CONTROL_TABLE_CODE:
			return psprintf("role \"%s\" owns a function that code on table \"idem_keys\" calls", role);
		case CONTROL_COLUMN_TYPE:
			return psprintf("role \"%s\" owns the type of a column of table \"idem_keys\"", role);
	}
	return pstrdup("");
}

/*
 * Report why the reconciler is skipped: one WARNING, whose detail says
 * which role controls what, and whose hint says how to let it run.  The
 * cause is noted for idem_reconciler_status (backoff.c); with quiet (the
 * worker) the WARNING is left out while the same cause was reported less
 * than processing_timeout ago.
 */
static void
ReportSkipped(const TrustCheck *tc, bool quiet)
{
	const IdemReconciler *rc = tc->rc;
	const char *op = text_to_cstring(rc->operation);
	char	   *run_as = GetUserNameFromId(rc->run_as, true);
	char	   *role = NULL;
	char	   *schema = NULL;
	char	   *cause;
	int			code = ERRCODE_INSUFFICIENT_PRIVILEGE;

	if (OidIsValid(tc->role))
		role = GetUserNameFromId(tc->role, true);
	if (role == NULL)
		role = psprintf("with OID %u", tc->role);
	if (tc->what == CONTROL_SCHEMA_OWNER || tc->what == CONTROL_SCHEMA_CREATE)
		schema = get_namespace_name(tc->object);
	else if (tc->what == CONTROL_SCHEMA_FUNCTION ||
			 tc->what == CONTROL_SCHEMA_OPERATOR)
		schema = pstrdup(tc->name);
	cause = psprintf("%d %u %u %s", (int) tc->what, tc->role, tc->object,
					 tc->name != NULL ? tc->name : "");
	if (!IdemSkipNoted(rc->operation, cause, SkipReason(tc, role, schema)) &&
		quiet)
		return;
	if (tc->what == CONTROL_RUN_AS_GONE || tc->what == CONTROL_REGISTRAR_GONE)
		code = ERRCODE_UNDEFINED_OBJECT;
	else if (tc->what == CONTROL_HANDLER_GONE)
		code = ERRCODE_UNDEFINED_FUNCTION;
	else if (tc->what == CONTROL_HANDLER_FAULT)
		code = IdemHandlerFaultCode(tc->fault);

	ereport(WARNING,
			(errcode(code),
			 errmsg("reconciler %s of operation \"%s\" was skipped",
					rc->handler, op),
			 tc->what == CONTROL_RUN_AS_GONE ?
			 errdetail("The role it runs as, with OID %u, no longer exists.",
					   rc->run_as) :
			 tc->what == CONTROL_REGISTRAR_GONE ?
			 errdetail("The role that registered it, with OID %u, no longer exists.",
					   tc->registered_by) :
			 tc->what == CONTROL_SUPERUSER ?
			 errdetail("It runs as role \"%s\", a superuser, and idempotency.enable_superuser_reconcilers is off.",
					   run_as) :
			 tc->what == CONTROL_HANDLER_GONE ?
			 errdetail("No function has that signature: it was dropped or renamed since it was registered.") :
			 tc->what == CONTROL_HANDLER_FAULT ?
			 IdemErrdetailHandler(tc->fault, tc->handler, tc->rowtype, InvalidOid,
								  rc->run_as) :
			 tc->what == CONTROL_REGISTRAR ?
			 errdetail("Role \"%s\", which registered it, may no longer act as role \"%s\", which it runs as.",
					   role, run_as) :
			 tc->what == CONTROL_FUNCTION ?
			 errdetail("Role \"%s\", which owns the function and can change its body, may not act as role \"%s\", which it runs as.",
					   role, run_as) :
			 tc->what == CONTROL_SESSION ?
			 errdetail("This session has temporary objects, and its role \"%s\" may not act as role \"%s\", which the reconciler runs as.",
					   role, run_as) :
			 tc->what == CONTROL_SCHEMA_OWNER ?
			 errdetail("Role \"%s\" owns schema \"%s\", which is on the reconciler's search_path, and may not act as role \"%s\", which it runs as.",
					   role, schema, run_as) :
			 tc->what == CONTROL_SCHEMA_CREATE && !OidIsValid(tc->role) ?
			 errdetail("Every role may create objects in schema \"%s\", which is on the reconciler's search_path: CREATE on it is granted to PUBLIC.",
					   schema) :
			 tc->what == CONTROL_SCHEMA_CREATE ?
			 errdetail("Role \"%s\" may create objects in schema \"%s\", which is on the reconciler's search_path, and may not act as role \"%s\", which it runs as.",
					   role, schema, run_as) :
			 tc->what == CONTROL_SCHEMA_MISSING ?
			 errdetail("Schema \"%s\", which is on the reconciler's search_path, does not exist, and role \"%s\", which may not act as role \"%s\", may create it.",
					   tc->name, role, run_as) :
			 tc->what == CONTROL_SCHEMA_FUNCTION ?
			 errdetail("Function %s in schema \"%s\", which is on the reconciler's search_path, is owned by role \"%s\", and that role may not act as role \"%s\", which the reconciler runs as.",
					   format_procedure(tc->object), schema, role, run_as) :
			 tc->what == CONTROL_SCHEMA_OPERATOR ?
			 errdetail("Operator %s in schema \"%s\", which is on the reconciler's search_path, is owned by role \"%s\", and that role may not act as role \"%s\", which the reconciler runs as.",
					   format_operator(tc->object), schema, role, run_as) :
			 tc->what == CONTROL_TABLE_OWNER ?
			 errdetail("Role \"%s\" owns table \"%s\", whose triggers, rules, policies, constraints, defaults and indexes run inside the reconciler's writes, and may not act as role \"%s\", which it runs as.",
					   role, get_rel_name(tc->object), run_as) :
			 tc->what == CONTROL_TABLE_TRIGGER ?
			 errdetail("Role \"%s\" may create triggers on table \"%s\", which run inside the reconciler's writes, and may not act as role \"%s\", which it runs as.",
					   role, get_rel_name(tc->object), run_as) :
			 tc->what == CONTROL_TABLE_CODE ?
			 errdetail("Role \"%s\" owns function %s, which code attached to table \"idem_keys\" calls inside the reconciler's writes, and may not act as role \"%s\", which it runs as.",
					   role, format_procedure(tc->object), run_as) :
			 errdetail("Role \"%s\" owns type %s of a column of table \"idem_keys\", whose constraints run inside the reconciler's writes, and may not act as role \"%s\", which it runs as.",
					   role, format_type_be(tc->object), run_as),
			 ErrhintSkipped(tc, role, schema, run_as)));
}

/*
 * May the reconciler rc, resolved to handler, be called now?  Checked at
 * every call, not only when the row was written, because the row may have
 * been written by hand and rights change.  It may when its roles still
 * exist, run_as is no superuser (unless enable_superuser_reconcilers), the
 * function is a plain function(idem_keys) that run_as may execute, and
 * every role that controls code the call will run can already act as
 * run_as (Trusted): the registrar, the function's owner, a session with
 * temporary objects (pg_temp is still searched for relations and types),
 * whoever owns, may create in or owns functions and operators in a schema
 * of its effective search_path (the pinned one, and the function's own; a
 * schema named there that does not exist, whoever may create it), and
 * whoever may attach code to idem_keys, which its writes run: its owner,
 * the roles granted TRIGGER on it, the owners of the functions that code
 * calls (found through pg_depend) and of its columns' types.  Otherwise
 * one WARNING says why (ReportSkipped).
 */
static bool
ReconcilerRunnable(Oid nspid, const IdemReconciler *rc, Oid handler, Oid rowtype,
				   bool quiet)
{
	TrustCheck	tc;
	Oid			tempns;
	Oid			temptoastns;

	memset(&tc, 0, sizeof(tc));
	tc.rc = rc;
	tc.handler = handler;
	tc.rowtype = rowtype;

	/*
	 * No role (0): a row registered by release 0.1.0, whose update leaves
	 * the rows alone; 0.1.0 let only members of run_as register it.
	 */
	tc.registered_by = OidIsValid(rc->registered_by) ? rc->registered_by : rc->run_as;

	if (!SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(rc->run_as)))
		Refuse(&tc, CONTROL_RUN_AS_GONE, rc->run_as, InvalidOid, NULL);
	else if (!SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(tc.registered_by)))
		Refuse(&tc, CONTROL_REGISTRAR_GONE, tc.registered_by, InvalidOid, NULL);
	else if (superuser_arg(rc->run_as) && !idem_enable_superuser_reconcilers)
		Refuse(&tc, CONTROL_SUPERUSER, rc->run_as, InvalidOid, NULL);
	(void) Trusted(&tc, tc.registered_by, CONTROL_REGISTRAR, InvalidOid);
	if (!tc.refused && !OidIsValid(handler))
		Refuse(&tc, CONTROL_HANDLER_GONE, InvalidOid, InvalidOid, NULL);
	if (!tc.refused &&
		(tc.fault = IdemCheckHandler(handler, rowtype, InvalidOid, rc->run_as,
									 NULL)) != IDEM_HANDLER_OK)
		Refuse(&tc, CONTROL_HANDLER_FAULT, InvalidOid, handler, NULL);
	if (!tc.refused)
		(void) Trusted(&tc, IdemFunctionOwner(handler), CONTROL_FUNCTION, handler);

	GetTempNamespaceState(&tempns, &temptoastns);
	if (OidIsValid(tempns))
		(void) Trusted(&tc, GetUserId(), CONTROL_SESSION, InvalidOid);

	/*
	 * The effective search_path: the pinned one (the extension's schema
	 * between pg_catalog and pg_temp), then the function's own
	 */
	if (!tc.refused)
		TrustSchema(&tc, nspid, NULL);
	if (!tc.refused)
		TrustFunctionPath(&tc);
	if (!tc.refused)
		TrustKeysTable(&tc, get_relname_relid("idem_keys", nspid));

	if (tc.refused)
		ReportSkipped(&tc, quiet);
	else
		IdemSkipForget(rc->operation);
	return !tc.refused;
}

/*
 * Call the reconciler rc of the extension in schema nspid with row (a
 * record of type idem_keys) as the role that registered it, in a
 * security-restricted context, with search_path pinned and setting changes
 * undone; false, after a WARNING (with quiet, once per cause: the worker),
 * when it may not be called.
 */
bool
IdemReconcilerCall(Oid nspid, const IdemReconciler *rc, Datum row, bool quiet)
{
	/* the type of idem_keys itself, also when the records are a shard's */
	Oid			rowtype = get_rel_type_id(get_relname_relid("idem_keys", nspid));
	Oid			handler;
	Oid			save_userid;
	int			save_sec_context;
	int			save_nestlevel;
	FmgrInfo	flinfo;
	LOCAL_FCINFO(fcinfo, 1);

	GetUserIdAndSecContext(&save_userid, &save_sec_context);
	save_nestlevel = NewGUCNestLevel();
	PinSearchPath(nspid);

	handler = ResolveHandler(rc);
	if (!ReconcilerRunnable(nspid, rc, handler, rowtype, quiet))
	{
		AtEOXact_GUC(false, save_nestlevel);
		return false;
	}

	SetUserIdAndSecContext(rc->run_as,
						   save_sec_context | SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
	fmgr_info(handler, &flinfo);
	InitFunctionCallInfoData(*fcinfo, &flinfo, 1, InvalidOid, NULL, NULL);
	fcinfo->args[0].value = row;
	fcinfo->args[0].isnull = false;
	(void) FunctionCallInvoke(fcinfo);

	SetUserIdAndSecContext(save_userid, save_sec_context);
	AtEOXact_GUC(false, save_nestlevel);
	return true;
}

/*
 * Raise an ERROR unless handler can be a reconciler that runs as run_as:
 * a plain function(idem_keys), not returning a set, that run_as may
 * execute, owned by a role that may act as run_as; and run_as no
 * superuser unless idempotency.enable_superuser_reconcilers says so.
 */
void
IdemReconcilerCheck(Oid handler, Oid rowtype, Oid run_as)
{
	IdemHandlerFault fault;

	if (superuser_arg(run_as) && !idem_enable_superuser_reconcilers)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to register a reconciler that runs as superuser \"%s\"",
						GetUserNameFromId(run_as, false)),
				 errdetail("A reconciler runs unattended with the rights of its role, and idempotency.enable_superuser_reconcilers is off."),
				 errhint("Register it to run as a role that is not a superuser.  Turning on idempotency.enable_superuser_reconcilers lets every table, view, type and function a reconciler touches run code as a superuser.")));

	fault = IdemCheckHandler(handler, rowtype, InvalidOid, run_as, NULL);
	if (fault == IDEM_HANDLER_OK)
	{
		Oid			owner = IdemFunctionOwner(handler);

		if (!IdemCanActAs(owner, run_as))
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("function %s cannot be a reconciler that runs as role \"%s\"",
							format_procedure(handler), GetUserNameFromId(run_as, false)),
					 errdetail("Role \"%s\", which owns the function and can change its body, may not act as role \"%s\".",
							   GetUserNameFromId(owner, false),
							   GetUserNameFromId(run_as, false))));
		return;
	}
	if (fault == IDEM_HANDLER_MISSING)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_FUNCTION),
				 errmsg("function with OID %u does not exist", handler)));
	if (fault == IDEM_HANDLER_NOT_EXECUTABLE && run_as == GetUserId())
		aclcheck_error(ACLCHECK_NO_PRIV, OBJECT_FUNCTION, get_func_name(handler));
	ereport(ERROR,
			(errcode(IdemHandlerFaultCode(fault)),
			 errmsg("function %s cannot be a reconciler", format_procedure(handler)),
			 IdemErrdetailHandler(fault, handler, rowtype, InvalidOid, run_as),
			 errhint("A reconciler is a function of one argument of type %s that settles the stuck record with idem_complete or idem_release.",
					 format_type_be(rowtype))));
}

/* Attribute number of a column of idem_reconcilers, checked to be of type */
static AttrNumber
ReconcilersColumn(Relation rel, const char *name, Oid type)
{
	TupleDesc	tupdesc = RelationGetDescr(rel);
	int			attnum = SPI_fnumber(tupdesc, name);

	if (attnum <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("column \"%s\" of table \"%s\" does not exist",
						name, RelationGetRelationName(rel)),
				 errhint("Add the column back as %s with ALTER TABLE.",
						 format_type_be(type))));
	if (TupleDescAttr(tupdesc, attnum - 1)->atttypid != type)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("column \"%s\" of table \"%s\" must be of type %s",
						name, RelationGetRelationName(rel), format_type_be(type)),
				 errhint("Change the column back with ALTER TABLE ... ALTER COLUMN ... TYPE.")));
	return attnum;
}

/*
 * Trigger BEFORE INSERT OR UPDATE FOR EACH ROW of idem_reconcilers.
 * Whoever writes a row, through idem_set_reconciler or with plain INSERT,
 * UPDATE or COPY, its handler must name a function that can be a
 * reconciler run as run_as, stored as its schema-qualified signature; the
 * writer must be able to act as run_as; and registered_by becomes the
 * writer, whatever the row said.  Each call checks all of it again
 * (ReconcilerRunnable), since rights and functions change after a write.
 */
Datum
idem_reconcilers_check(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	Relation	rel;
	HeapTuple	tuple;
	int			attnums[2];
	Datum		values[2];
	bool		nulls[2] = {false, false};
	Datum		d;
	bool		isnull;
	AttrNumber	handler_att;
	AttrNumber	run_as_att;
	Oid			handler;
	Oid			run_as;
	Oid			keys;

	if (!CALLED_AS_TRIGGER(fcinfo) ||
		!TRIGGER_FIRED_BEFORE(trigdata->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(trigdata->tg_event) ||
		!(TRIGGER_FIRED_BY_INSERT(trigdata->tg_event) ||
		  TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event)))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("function \"idem_reconcilers_check\" must be fired BEFORE INSERT OR UPDATE FOR EACH ROW")));

	rel = trigdata->tg_relation;
	tuple = TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event) ?
		trigdata->tg_newtuple : trigdata->tg_trigtuple;
	handler_att = ReconcilersColumn(rel, "handler", TEXTOID);
	run_as_att = ReconcilersColumn(rel, "run_as", REGROLEOID);
	attnums[0] = handler_att;
	attnums[1] = ReconcilersColumn(rel, "registered_by", REGROLEOID);

	/* NULLs are for the NOT NULL constraints to refuse */
	d = heap_getattr(tuple, run_as_att, RelationGetDescr(rel), &isnull);
	run_as = isnull ? InvalidOid : DatumGetObjectId(d);
	d = heap_getattr(tuple, handler_att, RelationGetDescr(rel), &isnull);
	if (isnull || !OidIsValid(run_as))
		nulls[0] = isnull;
	else
	{
		keys = get_relname_relid("idem_keys", RelationGetNamespace(rel));
		if (!OidIsValid(keys))
			IdemReportMissingTable("idem_keys");
		if (!SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(run_as)))
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_OBJECT),
					 errmsg("role with OID %u does not exist", run_as)));
		if (!IdemCanActAs(GetUserId(), run_as))
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("permission denied to register a reconciler that runs as role \"%s\"",
							GetUserNameFromId(run_as, false)),
					 errdetail("Only roles that can become role \"%s\" with SET ROLE may register reconcilers that run as it.",
							   GetUserNameFromId(run_as, false))));
		handler = DatumGetObjectId(DirectFunctionCall1(regprocedurein,
													   CStringGetDatum(TextDatumGetCString(d))));
		IdemReconcilerCheck(handler, get_rel_type_id(keys), run_as);
		d = CStringGetTextDatum(format_procedure_qualified(handler));
	}
	values[0] = d;
	values[1] = ObjectIdGetDatum(GetUserId());

	return PointerGetDatum(heap_modify_tuple_by_cols(tuple, RelationGetDescr(rel),
													 2, attnums, values, nulls));
}

/*
 * Grace, in milliseconds, between the cancel of a reconciler call past
 * idempotency.reconciler_timeout and the end of the process, for a call
 * that caught the cancel: at most half the timeout, so that the process
 * has ended within one and a half timeouts.
 */
#define IDEM_RECONCILER_GRACE_MS	1000

/* The timeouts of a reconciler call: the cancel, then the end */
static TimeoutId reconciler_timeout_id = MAX_TIMEOUTS;
static TimeoutId reconciler_kill_id = MAX_TIMEOUTS;
static volatile sig_atomic_t reconciler_in_call = false;
static volatile sig_atomic_t reconciler_timed_out = false;
static volatile sig_atomic_t reconciler_abandoned = false;

/* The call running now, for the WARNING of ReportAbandonedCall */
static char *call_handler = NULL;
static char *call_operation = NULL;
static char *call_scope = NULL;
static char *call_key = NULL;
static bool call_exit_registered = false;

/*
 * The reconciler ran out of time: cancel it as StatementCancelHandler
 * does, and remember why, so that the cancel is reported as a timeout and
 * not passed on as the session's own cancel.
 */
static void
ReconcilerTimeoutHandler(void)
{
	reconciler_timed_out = true;
	if (reconciler_in_call && !proc_exit_inprogress)
	{
		InterruptPending = true;
		QueryCancelPending = true;
	}
	SetLatch(MyLatch);
}

/*
 * The reconciler is still running a grace after its cancel: it caught it.
 * End the process as SIGTERM does (a FATAL, which no exception block
 * catches); the transaction, and with it the record's lock, goes with it,
 * and ReportAbandonedCall says so.  The worker's launcher starts another
 * worker; a session calling idem_reconcile() or idem_maintain() ends.
 */
static void
ReconcilerKillHandler(void)
{
	if (reconciler_in_call && !proc_exit_inprogress)
	{
		reconciler_abandoned = true;
		InterruptPending = true;
		ProcDiePending = true;
	}
	SetLatch(MyLatch);
}

/*
 * At the exit of a process that ended a reconciler call which caught its
 * cancel: the WARNING that names the key (after the FATAL that ended it).
 */
static void
ReportAbandonedCall(int code, Datum arg)
{
	if (!reconciler_abandoned || call_key == NULL)
		return;
	reconciler_abandoned = false;
	/* the context of the interrupted function says nothing more here */
	error_context_stack = NULL;

	/*
	 * Logged at every log_min_messages that shows more than the FATAL: at
	 * LOG where a WARNING is not (log, error), as PostgreSQL ranks them
	 */
	ereport(log_min_messages == LOG || log_min_messages > WARNING ? LOG : WARNING,
			(errcode(ERRCODE_QUERY_CANCELED),
			 errmsg("reconciler %s did not end at its time limit for idempotency key \"%s\"",
					call_handler, call_key),
			 errdetail("Operation \"%s\", scope \"%s\". The call went on after it was cancelled at idempotency.reconciler_timeout (%d ms), so its process was ended.",
					   call_operation, call_scope, idem_reconciler_timeout_ms),
			 errhint("The record stays stuck; the worker calls the reconciler again after a delay that grows with each failure (view idem_reconciler_status).  A reconciler must not catch query_canceled.")));
}

/* Replace a string of the current call, kept in TopMemoryContext */
static void
SetCallString(char **field, const char *value)
{
	if (*field != NULL)
		pfree(*field);
	*field = MemoryContextStrdup(TopMemoryContext, value);
}

/*
 * Start the clocks of one call of reconciler rc for the record (scope, key): the cancel at
 * idempotency.reconciler_timeout, and the end of the process a grace
 * later, which no reconciler can catch or put off.
 */
void
IdemReconcilerTimerStart(const IdemReconciler *rc, text *scope, text *key)
{
	EnableTimeoutParams timeouts[2];
	int			grace = Min(IDEM_RECONCILER_GRACE_MS, idem_reconciler_timeout_ms / 2);

	if (reconciler_timeout_id == MAX_TIMEOUTS)
	{
		reconciler_timeout_id = RegisterTimeout(USER_TIMEOUT, ReconcilerTimeoutHandler);
		reconciler_kill_id = RegisterTimeout(USER_TIMEOUT, ReconcilerKillHandler);
	}
	if (!call_exit_registered)
	{
		before_shmem_exit(ReportAbandonedCall, (Datum) 0);
		call_exit_registered = true;
	}
	SetCallString(&call_handler, rc->handler);
	SetCallString(&call_operation, text_to_cstring(rc->operation));
	SetCallString(&call_scope, text_to_cstring(scope));
	SetCallString(&call_key, text_to_cstring(key));

	reconciler_timed_out = false;
	reconciler_in_call = true;
	timeouts[0].id = reconciler_timeout_id;
	timeouts[0].type = TMPARAM_AFTER;
	timeouts[0].delay_ms = idem_reconciler_timeout_ms;
	timeouts[1].id = reconciler_kill_id;
	timeouts[1].type = TMPARAM_AFTER;
	timeouts[1].delay_ms = (int) Min((int64) idem_reconciler_timeout_ms + grace, INT_MAX);
	enable_timeouts(timeouts, 2);
}

/*
 * Stop them; true when the cancel fired.  A cancel it raised after the
 * reconciler returned is dropped: it was meant for the call only.
 */
bool
IdemReconcilerTimerStop(void)
{
	DisableTimeoutParams timeouts[2];

	reconciler_in_call = false;
	timeouts[0].id = reconciler_timeout_id;
	timeouts[0].keep_indicator = false;
	timeouts[1].id = reconciler_kill_id;
	timeouts[1].keep_indicator = false;
	disable_timeouts(timeouts, 2);
	if (!reconciler_timed_out)
		return false;
	QueryCancelPending = false;
	return true;
}

/*
 * Refuse a maintenance function called from inside a reconciler call: its
 * pass would run its own reconciler calls, whose clocks would replace the
 * running call's, and the call could outlive idempotency.reconciler_timeout.
 */
void
IdemPreventInReconciler(const char *function)
{
	if (reconciler_in_call)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("%s cannot be called from a reconciler", function),
				 errdetail("A reconciler runs inside a maintenance pass, under that pass's time limit.")));
}
