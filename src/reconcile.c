/*-------------------------------------------------------------------------
 *
 * reconcile.c
 *	  Who may run a reconciler, as whom, and with which search_path: the
 *	  checks made when one is registered (the trigger of idem_reconcilers,
 *	  which idem_set_reconciler's writes go through too) and again right
 *	  before every call, and the call itself.  maintenance.c decides when
 *	  a stuck record is reconciled; this file decides whether and how.
 *
 * A reconciler is a row of idem_reconcilers: an operation, a function
 * signature (text), the role it runs as (run_as) and the role that wrote
 * the row (registered_by, set by the trigger).  Nothing in that row is
 * trusted at call time, since anyone who may write the table can write any
 * value and rights change after a write:
 *	- the signature is resolved again under the pinned search_path, and the
 *	  function checked to be a plain function(idem_keys) that run_as may
 *	  execute (handlers.c);
 *	- run_as and registered_by must still exist, and the registrar, the
 *	  function's owner (who can replace its body) and, in a session with
 *	  temporary objects, the session's role must still be able to act as
 *	  run_as;
 *	- no role that cannot act as run_as may own or create objects in the
 *	  extension's schema, which is on the pinned path, or own a function
 *	  or operator there: an overload that is a better match for a call
 *	  in the reconciler wins whatever the order of the path;
 *	- the call runs as run_as, in a security-restricted operation, with
 *	  search_path pinned to pg_catalog, the extension's schema, pg_temp, and
 *	  every setting it changes undone afterwards.
 * A check that fails skips the reconciler with a WARNING that names it and
 * says why; maintenance.c then skips the rest of its operation's records
 * for the pass.
 *
 * Locks: none of its own.  The caller holds the stuck record FOR UPDATE.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/namespace.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_database.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_operator.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/regproc.h"
#include "utils/rel.h"
#include "utils/syscache.h"

#include "idempotency.h"

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

/*
 * Does a role that may not act as run_as have CREATE on schema nspid, or
 * own it?  Such a role could plant there a function or an operator that
 * is a better match for a call in the reconciler than the one meant (an
 * overload of idem_complete taking text, of jsonb_build_object taking
 * bigint), whatever the order of the pinned search_path, and so run its
 * code as run_as.  The first one found, by name, is reported in *who, or
 * NULL for PUBLIC; *owns says whether it owns the schema.  Every role is
 * asked, so that CREATE through membership in a grantee counts too; the
 * members of a role that may act as run_as may act as it themselves.
 */
static bool
SchemaWritableByOther(Oid nspid, Oid run_as, char **who, bool *owns)
{
	HeapTuple	tuple;
	Form_pg_namespace nsp;
	Oid			owner;
	Datum		aclDatum;
	bool		isnull;
	Relation	authid;
	SysScanDesc scan;

	*who = NULL;
	*owns = false;
	tuple = SearchSysCache1(NAMESPACEOID, ObjectIdGetDatum(nspid));
	if (!HeapTupleIsValid(tuple))
		elog(ERROR, "cache lookup failed for schema %u", nspid);
	nsp = (Form_pg_namespace) GETSTRUCT(tuple);

	/* Its owner may grant itself CREATE whatever the ACL says */
	owner = EffectiveOwner(nsp->nspowner);
	if (!IdemCanActAs(owner, run_as))
	{
		*who = GetUserNameFromId(owner, false);
		*owns = true;
		ReleaseSysCache(tuple);
		return true;
	}

	aclDatum = SysCacheGetAttr(NAMESPACEOID, tuple, Anum_pg_namespace_nspacl, &isnull);
	if (!isnull)
	{
		Acl		   *acl = DatumGetAclP(aclDatum);
		AclItem    *items = ACL_DAT(acl);
		int			i;

		for (i = 0; i < ACL_NUM(acl); i++)
			if (items[i].ai_grantee == ACL_ID_PUBLIC &&
				(ACLITEM_GET_PRIVS(items[i]) & ACL_CREATE) != 0)
			{
				ReleaseSysCache(tuple);
				return true;
			}
	}
	ReleaseSysCache(tuple);

	authid = table_open(AuthIdRelationId, AccessShareLock);
	scan = systable_beginscan(authid, InvalidOid, false, NULL, 0, NULL);
	while (HeapTupleIsValid(tuple = systable_getnext(scan)))
	{
		Form_pg_authid role = (Form_pg_authid) GETSTRUCT(tuple);

		/* pg_database_owner stands for the database's owner, asked above */
		if (role->oid == ROLE_PG_DATABASE_OWNER)
			continue;
		if (*who != NULL && strcmp(NameStr(role->rolname), *who) >= 0)
			continue;
		if (IdemNamespaceAclCheck(nspid, role->oid, ACL_CREATE) == ACLCHECK_OK &&
			!IdemCanActAs(role->oid, run_as))
			*who = pstrdup(NameStr(role->rolname));
	}
	systable_endscan(scan);
	table_close(authid, AccessShareLock);
	return *who != NULL;
}

/*
 * The function or operator of schema nspid (catalog catalogid, with the
 * schema and owner columns given) of lowest OID owned by a role that may
 * not act as run_as, or InvalidOid.  Planted while its owner still could
 * create there (before CREATE was revoked from PUBLIC, say), it could be
 * a better match for a call in the reconciler than the one meant.
 */
static Oid
ForeignObjectInSchema(Oid catalogid, AttrNumber nspatt, AttrNumber owneratt,
					  Oid nspid, Oid run_as, Oid *owner)
{
	Relation	rel;
	SysScanDesc scan;
	ScanKeyData key;
	HeapTuple	tuple;
	Oid			found = InvalidOid;

	ScanKeyInit(&key, nspatt, BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(nspid));
	rel = table_open(catalogid, AccessShareLock);
	scan = systable_beginscan(rel, InvalidOid, false, NULL, 1, &key);
	while (HeapTupleIsValid(tuple = systable_getnext(scan)))
	{
		bool		isnull;
		Oid			oid = DatumGetObjectId(heap_getattr(tuple, 1, RelationGetDescr(rel), &isnull));
		Oid			objowner = DatumGetObjectId(heap_getattr(tuple, owneratt,
															 RelationGetDescr(rel), &isnull));

		if ((!OidIsValid(found) || oid < found) && !IdemCanActAs(objowner, run_as))
		{
			found = oid;
			*owner = objowner;
		}
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return found;
}

/*
 * May the reconciler rc, resolved to handler, be called now?  Checked
 * at every call, not only when the row was written, because the row may
 * have been written by hand and rights change: the function must be a
 * plain function(idem_keys) that run_as may execute; the role that wrote
 * the row, and the function's owner (who can replace its body), must still
 * be able to act as run_as; and so must a session with temporary objects
 * (pg_temp is still searched for relations and types), or its objects
 * could run with run_as's rights.  When not, a WARNING names the operation
 * and the handler.
 */
static bool
ReconcilerRunnable(Oid nspid, const IdemReconciler *rc, Oid handler, Oid rowtype)
{
	const char *op = text_to_cstring(rc->operation);
	IdemHandlerFault fault;
	char	   *run_as;
	char	   *registrar;
	char	   *creator;
	bool		owns;
	Oid			owner;
	Oid			tempns;
	Oid			temptoastns;
	Oid			registered_by = rc->registered_by;

	/*
	 * No role (0): a row registered by release 0.1.0, whose update leaves
	 * the rows alone; 0.1.0 let only members of run_as register it.
	 */
	if (!OidIsValid(registered_by))
		registered_by = rc->run_as;

	run_as = GetUserNameFromId(rc->run_as, true);
	if (run_as == NULL)
	{
		ereport(WARNING,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("reconciler %s of operation \"%s\" was skipped",
						rc->handler, op),
				 errdetail("The role it runs as, with OID %u, no longer exists.",
						   rc->run_as),
				 errhint("Register the reconciler again with idem_set_reconciler, or remove it by passing NULL.")));
		return false;
	}
	registrar = GetUserNameFromId(registered_by, true);
	if (registrar == NULL)
	{
		ereport(WARNING,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("reconciler %s of operation \"%s\" was skipped",
						rc->handler, op),
				 errdetail("The role that registered it, with OID %u, no longer exists.",
						   registered_by),
				 errhint("Register the reconciler again with idem_set_reconciler, or remove it by passing NULL.")));
		return false;
	}
	if (!IdemCanActAs(registered_by, rc->run_as))
	{
		ereport(WARNING,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("reconciler %s of operation \"%s\" was skipped",
						rc->handler, op),
				 errdetail("Role \"%s\", which registered it, may no longer act as role \"%s\", which it runs as.",
						   registrar, run_as),
				 errhint("Register the reconciler again with idem_set_reconciler as a role that may, or remove it by passing NULL.")));
		return false;
	}

	if (!OidIsValid(handler))
	{
		ereport(WARNING,
				(errcode(ERRCODE_UNDEFINED_FUNCTION),
				 errmsg("reconciler %s of operation \"%s\" was skipped",
						rc->handler, op),
				 errdetail("No function has that signature: it was dropped or renamed since it was registered."),
				 errhint("Create the function again, register another reconciler with idem_set_reconciler, or remove it by passing NULL.")));
		return false;
	}
	fault = IdemCheckHandler(handler, rowtype, InvalidOid, rc->run_as, NULL);
	if (fault != IDEM_HANDLER_OK)
	{
		ereport(WARNING,
				(errcode(IdemHandlerFaultCode(fault)),
				 errmsg("reconciler %s of operation \"%s\" was skipped",
						rc->handler, op),
				 IdemErrdetailHandler(fault, handler, rowtype, InvalidOid,
											rc->run_as),
				 errhint("Register the reconciler again with idem_set_reconciler, or remove it by passing NULL.")));
		return false;
	}

	/* Whoever owns the function can change what it does */
	owner = IdemFunctionOwner(handler);
	if (!IdemCanActAs(owner, rc->run_as))
	{
		ereport(WARNING,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("reconciler %s of operation \"%s\" was skipped",
						rc->handler, op),
				 errdetail("Role \"%s\", which owns the function and can change its body, may not act as role \"%s\", which it runs as.",
						   GetUserNameFromId(owner, false), run_as),
				 errhint("Register a function owned by a role that may act as role \"%s\", or remove the reconciler by passing NULL.",
						 run_as)));
		return false;
	}

	GetTempNamespaceState(&tempns, &temptoastns);
	if (OidIsValid(tempns) && !IdemCanActAs(GetUserId(), rc->run_as))
	{
		ereport(WARNING,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("reconciler %s of operation \"%s\" was skipped",
						rc->handler, op),
				 errdetail("This session has temporary objects, and its role \"%s\" may not act as role \"%s\", which the reconciler runs as.",
						   GetUserNameFromId(GetUserId(), false), run_as),
				 errhint("Run the reconcilers from a session that created no temporary tables, or let the background worker run them.")));
		return false;
	}

	/*
	 * The extension's schema is on the pinned path; pg_catalog takes a
	 * superuser to change, and pg_temp is this session's (above).
	 */
	if (SchemaWritableByOther(nspid, rc->run_as, &creator, &owns))
	{
		const char *nspname = get_namespace_name(nspid);

		if (creator == NULL)
			ereport(WARNING,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("reconciler %s of operation \"%s\" was skipped",
							rc->handler, op),
					 errdetail("Every role may create objects in schema \"%s\", which is on the reconciler's search_path: CREATE on it is granted to PUBLIC.",
							   nspname),
					 errhint("Revoke CREATE on schema \"%s\" from PUBLIC.", nspname)));
		else if (owns)
			ereport(WARNING,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("reconciler %s of operation \"%s\" was skipped",
							rc->handler, op),
					 errdetail("Role \"%s\" owns schema \"%s\", which is on the reconciler's search_path, and may not act as role \"%s\", which it runs as.",
							   creator, nspname, run_as),
					 errhint("Register the reconciler to run as a role that role \"%s\" may act as, or keep the extension in a schema in which only roles that may act as role \"%s\" can create objects.",
							 creator, run_as)));
		else
			ereport(WARNING,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("reconciler %s of operation \"%s\" was skipped",
							rc->handler, op),
					 errdetail("Role \"%s\" may create objects in schema \"%s\", which is on the reconciler's search_path, and may not act as role \"%s\", which it runs as.",
							   creator, nspname, run_as),
					 errhint("Revoke CREATE on schema \"%s\" from role \"%s\", or register the reconciler to run as a role that it may act as.",
							 nspname, creator)));
		return false;
	}

	/* ... and so may the owner of every function and operator in it */
	{
		Oid			objowner;
		Oid			obj;
		const char *what = NULL;

		obj = ForeignObjectInSchema(ProcedureRelationId, Anum_pg_proc_pronamespace,
									Anum_pg_proc_proowner, nspid, rc->run_as, &objowner);
		if (OidIsValid(obj))
			what = psprintf("Function %s", format_procedure(obj));
		else
		{
			obj = ForeignObjectInSchema(OperatorRelationId, Anum_pg_operator_oprnamespace,
										Anum_pg_operator_oprowner, nspid, rc->run_as,
										&objowner);
			if (OidIsValid(obj))
				what = psprintf("Operator %s", format_operator(obj));
		}
		if (what != NULL)
		{
			ereport(WARNING,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("reconciler %s of operation \"%s\" was skipped",
							rc->handler, op),
					 errdetail("%s in schema \"%s\", which is on the reconciler's search_path, is owned by role \"%s\", and that role may not act as role \"%s\", which the reconciler runs as.",
							   what, get_namespace_name(nspid),
							   GetUserNameFromId(objowner, false), run_as),
					 errhint("Move it to another schema or give it an owner that may act as role \"%s\".",
							 run_as)));
			return false;
		}
	}
	return true;
}

/*
 * Call the reconciler rc of the extension in schema nspid with row (a
 * record of type idem_keys) as the role that registered it, in a
 * security-restricted context, with search_path pinned and setting changes
 * undone; false, after a WARNING, when it may not be called.
 */
bool
IdemReconcilerCall(Oid nspid, const IdemReconciler *rc, Datum row)
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
	if (!ReconcilerRunnable(nspid, rc, handler, rowtype))
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
 * execute, owned by a role that may act as run_as.
 */
void
IdemReconcilerCheck(Oid handler, Oid rowtype, Oid run_as)
{
	IdemHandlerFault fault;

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
