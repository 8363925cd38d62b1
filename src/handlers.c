/*-------------------------------------------------------------------------
 *
 * handlers.c
 *	  Verification of the functions the extension calls for its users:
 *	  idem_call's handler(jsonb) RETURNS jsonb, and the reconcilers,
 *	  handler(idem_keys), that maintenance calls as the role that
 *	  registered them.
 *
 * A handler arrives as an OID, from an argument (idem_call's regprocedure,
 * which may be 0 or a function dropped since) or from a table that roles
 * other than the registrar may write (idem_reconcilers).  Calling a
 * function with an argument of another type than it declares lets it read
 * the datum as whatever it expects, and an internal function given a row
 * crashes the backend.  So a handler is checked against the catalog right
 * before each call, never trusted from an earlier check: it exists, is a
 * plain function (not a procedure, aggregate or window function), takes
 * exactly one argument of the expected type, returns no set (and jsonb,
 * for idem_call), and the role it runs as may execute it.
 *
 * IdemCheckHandler says what is wrong, without raising; each caller reports
 * it in its own words (an ERROR for idem_call and idem_set_reconciler, a
 * WARNING and a skipped call for maintenance), adding the sentence of
 * IdemErrdetailHandler.  This file takes no lock and runs no SQL.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/pg_proc.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/elog.h"
#include "utils/lsyscache.h"
#include "utils/regproc.h"
#include "utils/syscache.h"

#include "idempotency.h"

/*
 * What is wrong with handler as a function(argtype) returning rettype
 * (InvalidOid: any type) that roleid is to run, or IDEM_HANDLER_OK.  On OK,
 * *strict (if not NULL) says whether the function is strict.
 */
IdemHandlerFault
IdemCheckHandler(Oid handler, Oid argtype, Oid rettype, Oid roleid,
				 bool *strict)
{
	HeapTuple	tuple;
	Form_pg_proc proc;
	IdemHandlerFault fault = IDEM_HANDLER_OK;
	AclResult	aclresult;

	if (!OidIsValid(handler))
		return IDEM_HANDLER_MISSING;
	tuple = SearchSysCache1(PROCOID, ObjectIdGetDatum(handler));
	if (!HeapTupleIsValid(tuple))
		return IDEM_HANDLER_MISSING;
	proc = (Form_pg_proc) GETSTRUCT(tuple);

	if (proc->prokind != PROKIND_FUNCTION)
		fault = IDEM_HANDLER_NOT_FUNCTION;
	else if (proc->pronargs != 1 || proc->proargtypes.values[0] != argtype)
		fault = IDEM_HANDLER_ARGUMENTS;
	else if (proc->proretset)
		fault = IDEM_HANDLER_RETURNS_SET;
	else if (OidIsValid(rettype) && proc->prorettype != rettype)
		fault = IDEM_HANDLER_RESULT;
	else if (strict != NULL)
		*strict = proc->proisstrict;
	ReleaseSysCache(tuple);
	if (fault != IDEM_HANDLER_OK)
		return fault;

	aclresult = IdemFunctionAclCheck(handler, roleid, ACL_EXECUTE);
	if (aclresult != ACLCHECK_OK)
		return IDEM_HANDLER_NOT_EXECUTABLE;
	return IDEM_HANDLER_OK;
}

/* The SQLSTATE of a fault, for the callers that raise it as an ERROR */
int
IdemHandlerFaultCode(IdemHandlerFault fault)
{
	switch (fault)
	{
		case IDEM_HANDLER_MISSING:
			return ERRCODE_UNDEFINED_FUNCTION;
		case IDEM_HANDLER_NOT_FUNCTION:
			return ERRCODE_WRONG_OBJECT_TYPE;
		case IDEM_HANDLER_ARGUMENTS:
			return ERRCODE_UNDEFINED_FUNCTION;
		case IDEM_HANDLER_RETURNS_SET:
		case IDEM_HANDLER_RESULT:
			return ERRCODE_DATATYPE_MISMATCH;
		case IDEM_HANDLER_NOT_EXECUTABLE:
			return ERRCODE_INSUFFICIENT_PRIVILEGE;
		case IDEM_HANDLER_OK:
			break;
	}
	return ERRCODE_INTERNAL_ERROR;
}

/*
 * errdetail saying what a fault found by IdemCheckHandler is, in one
 * sentence naming the function; for use inside ereport().
 */
int
IdemErrdetailHandler(IdemHandlerFault fault, Oid handler, Oid argtype,
						   Oid rettype, Oid roleid)
{
	char	   *name;

	if (fault == IDEM_HANDLER_MISSING)
		return errdetail("No function has OID %u.", handler);

	/* The function may have gone since it was checked */
	name = format_procedure_extended(handler, FORMAT_PROC_INVALID_AS_NULL);
	if (name == NULL)
		return errdetail("No function has OID %u.", handler);

	switch (fault)
	{
		case IDEM_HANDLER_NOT_FUNCTION:
			{
				char		kind = get_func_prokind(handler);

				if (kind == PROKIND_PROCEDURE)
					return errdetail("Routine %s is a procedure.", name);
				if (kind == PROKIND_AGGREGATE)
					return errdetail("Routine %s is an aggregate function.", name);
				return errdetail("Routine %s is a window function.", name);
			}
		case IDEM_HANDLER_ARGUMENTS:
			return errdetail("Function %s does not take exactly one argument of type %s.",
							 name, format_type_be(argtype));
		case IDEM_HANDLER_RETURNS_SET:
			return errdetail("Function %s returns a set.", name);
		case IDEM_HANDLER_RESULT:
			return errdetail("Function %s returns %s instead of %s.",
							 name, format_type_be(get_func_rettype(handler)),
							 format_type_be(rettype));
		case IDEM_HANDLER_NOT_EXECUTABLE:
			{
				char	   *role = GetUserNameFromId(roleid, true);

				if (role == NULL)
					return errdetail("Role with OID %u may not execute function %s.",
									 roleid, name);
				return errdetail("Role \"%s\" may not execute function %s.",
								 role, name);
			}
		case IDEM_HANDLER_MISSING:
		case IDEM_HANDLER_OK:
			break;
	}
	return 0;
}

/* Owner of a function, InvalidOid when it does not exist */
Oid
IdemFunctionOwner(Oid handler)
{
	HeapTuple	tuple;
	Oid			owner;

	tuple = SearchSysCache1(PROCOID, ObjectIdGetDatum(handler));
	if (!HeapTupleIsValid(tuple))
		return InvalidOid;
	owner = ((Form_pg_proc) GETSTRUCT(tuple))->proowner;
	ReleaseSysCache(tuple);
	return owner;
}

/*
 * May member act as role: become it with SET ROLE?  That is what
 * registering a reconciler to run as role stands for, and it is checked
 * again at every call, so that a membership revoked since takes effect.
 */
bool
IdemCanActAs(Oid member, Oid role)
{
	if (member == role)
		return true;
	return IdemMemberCanSetRole(member, role);
}
