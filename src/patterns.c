/*-------------------------------------------------------------------------
 *
 * patterns.c
 *	  Patterns on top of the key lifecycle: idem_call, the one-call wrapper
 *	  for stored procedures, and idem_consume, inbox de-duplication for
 *	  message consumers.  Both run inside the caller's transaction and go
 *	  through the C API of keys.c (IdemReserve, IdemComplete,
 *	  IdemReserveCompleted), so they follow its concurrency rules and share
 *	  storage, expiry and statistics with idem_reserve.  This file takes no
 *	  lock of its own.
 *
 * idem_consume records live in idem_keys with scope IDEM_CONSUME_SCOPE
 * ("idem:consume"), operation = consumer and key = message_id.  Scopes that
 * begin with "idem:" are refused by idem_reserve and friends, so a consumer
 * record can never collide with, or be taken for, an application's key; and
 * idem_stats shows each consumer as an operation with its consumed and
 * duplicates counters.  The record is written "completed" (no request, no
 * response) by the reservation itself (IdemReserveCompleted), one write per
 * message, so a committed one is never unfinished: the worker never sees it
 * stuck, and the sweeper deletes it once expires_at has passed.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/objectaccess.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/regproc.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "idempotency.h"

PG_FUNCTION_INFO_V1(idem_call);
PG_FUNCTION_INFO_V1(idem_consume);

/*
 * What idem_call keeps in fn_extra between calls from the same expression:
 * the extension's schema and the FmgrInfo of the last handler called, in a
 * context of its own that is reset when another handler comes along.  The
 * handler itself is checked again at every call (handlers.c).
 */
typedef struct IdemCallCache
{
	Oid			nspid;
	Oid			handler;		/* whose flinfo is set up; InvalidOid: none */
	MemoryContext handler_cxt;
	FmgrInfo	flinfo;
} IdemCallCache;

/* Argument n as text, or NULL */
#define ARG_TEXT(n)		(PG_ARGISNULL(n) ? NULL : PG_GETARG_TEXT_PP(n))

/* Raise 22023 for a NULL argument */
static void
CheckArgNotNull(FunctionCallInfo fcinfo, int argno, const char *name)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("argument \"%s\" must not be null", name)));
}

/*
 * Refuse, before anything is reserved, a handler that is not a plain
 * function handler(jsonb) RETURNS jsonb the current user may execute;
 * returns whether it is strict.  Checked at every call: the OID comes from
 * the caller and may be 0 or name a function dropped since the last call.
 */
static bool
CheckHandler(Oid handler)
{
	bool		strict = false;
	IdemHandlerFault fault;

	fault = IdemCheckHandler(handler, JSONBOID, JSONBOID, GetUserId(), &strict);
	if (fault == IDEM_HANDLER_MISSING)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_FUNCTION),
				 errmsg("handler function with OID %u does not exist", handler)));
	if (fault == IDEM_HANDLER_NOT_EXECUTABLE)
		aclcheck_error(ACLCHECK_NO_PRIV, OBJECT_FUNCTION, get_func_name(handler));
	if (fault != IDEM_HANDLER_OK)
		ereport(ERROR,
				(errcode(IdemHandlerFaultCode(fault)),
				 errmsg("function %s cannot be an idem_call handler",
						format_procedure(handler)),
				 IdemErrdetailHandler(fault, handler, JSONBOID, JSONBOID,
											GetUserId()),
				 errhint("Declare it as CREATE FUNCTION name(request jsonb) RETURNS jsonb.")));
	InvokeFunctionExecuteHook(handler);
	return strict;
}

/* The cache in fn_extra, with the FmgrInfo of handler, checked, ready to call */
static IdemCallCache *
GetCallCache(FunctionCallInfo fcinfo, Oid handler, bool *strict)
{
	FmgrInfo   *flinfo = fcinfo->flinfo;
	IdemCallCache *cache = (IdemCallCache *) flinfo->fn_extra;

	*strict = CheckHandler(handler);

	if (cache == NULL)
	{
		cache = MemoryContextAllocZero(flinfo->fn_mcxt, sizeof(IdemCallCache));
		cache->nspid = get_func_namespace(flinfo->fn_oid);
		cache->handler_cxt = AllocSetContextCreate(flinfo->fn_mcxt,
												   "idem_call handler",
												   ALLOCSET_SMALL_SIZES);
		flinfo->fn_extra = cache;
	}

	if (cache->handler != handler)
	{
		cache->handler = InvalidOid;
		MemoryContextReset(cache->handler_cxt);
		fmgr_info_cxt(handler, &cache->flinfo, cache->handler_cxt);
		cache->handler = handler;
	}
	return cache;
}

/* Raise the error of an outcome that idem_call cannot turn into a response */
pg_noreturn static void
ReportCallOutcome(const IdemReservation *r, text *operation, text *key,
				  text *scope)
{
	char	   *k = text_to_cstring(key);
	char	   *op = text_to_cstring(operation);
	char	   *sc = text_to_cstring(scope);

	switch (r->outcome)
	{
		case IDEM_IN_PROGRESS:
			ereport(ERROR,
					(errcode(ERRCODE_IDEM_IN_PROGRESS),
					 errmsg("idempotency key \"%s\" is in progress", k),
					 errdetail("The key of operation \"%s\" in scope \"%s\" is held by an open transaction, possibly this one, "
							   "or was reserved less than idempotency.processing_timeout ago and is not completed yet.",
							   op, sc),
					 errhint("Retry later with the same key; an HTTP API answers 409 Conflict.")));
			break;
		case IDEM_MISMATCH:
			ereport(ERROR,
					(errcode(ERRCODE_IDEM_MISMATCH),
					 errmsg("idempotency key \"%s\" was already used with a different request", k),
					 errdetail("The key of operation \"%s\" in scope \"%s\" is stored with another request fingerprint.",
							   op, sc),
					 errhint("Use a new key for a new request; an HTTP API answers 422 Unprocessable Content.")));
			break;
		case IDEM_STUCK:
			ereport(ERROR,
					(errcode(ERRCODE_IDEM_STUCK),
					 errmsg("idempotency key \"%s\" is stuck: the outcome of its first attempt is unknown", k),
					 r->recovery_point ?
					 errdetail("The first attempt of operation \"%s\" in scope \"%s\" did not finish within idempotency.processing_timeout or was flagged stuck; its last recovery point is \"%s\".",
							   op, sc, text_to_cstring(r->recovery_point)) :
					 errdetail("The first attempt of operation \"%s\" in scope \"%s\" did not finish within idempotency.processing_timeout or was flagged stuck; it recorded no recovery point.",
							   op, sc),
					 errhint("Reconcile it with idem_complete or idem_release instead of running it again; an HTTP API answers 409 Conflict.")));
			break;
		case IDEM_NEW:
		case IDEM_REPLAY:
			break;
	}
	elog(ERROR, "unexpected outcome \"%s\" in idem_call",
		 IdemOutcomeName(r->outcome));
}

/*
 * idem_call(operation, key, request, handler, scope, ttl) → jsonb
 *
 * Reserve; on new, run handler(request) in this transaction with the
 * caller's privileges, complete with its result (response_status 200) and
 * return it; on replay, return the stored response; otherwise raise the
 * outcome's SQLSTATE.  An error in the handler aborts the transaction (or
 * the caller's subtransaction) together with the reservation.
 */
Datum
idem_call(PG_FUNCTION_ARGS)
{
	text	   *operation = ARG_TEXT(0);
	text	   *key = ARG_TEXT(1);
	Jsonb	   *request = PG_ARGISNULL(2) ? NULL : PG_GETARG_JSONB_P(2);
	text	   *scope = ARG_TEXT(4);
	Interval   *ttl = PG_ARGISNULL(5) ? NULL : PG_GETARG_INTERVAL_P(5);
	IdemCallCache *cache;
	bool		strict;
	IdemReservation r;
	Jsonb	   *response = NULL;

	IdemCheckOperation(operation);
	IdemCheckKey(key);
	IdemCheckScope(scope);
	CheckArgNotNull(fcinfo, 3, "handler");
	cache = GetCallCache(fcinfo, PG_GETARG_OID(3), &strict);

	IdemReserve(cache->nspid, scope, operation, key, request, ttl,
				IDEM_RESERVE_COUNT, &r);

	if (r.outcome == IDEM_REPLAY)
	{
		if (r.response == NULL)
			PG_RETURN_NULL();
		PG_RETURN_JSONB_P(r.response);
	}
	if (r.outcome != IDEM_NEW)
		ReportCallOutcome(&r, operation, key, scope);

	/* A strict handler given a NULL request is not called: its result is NULL */
	if (request != NULL || !strict)
	{
		LOCAL_FCINFO(hfcinfo, 1);
		Datum		result;

		InitFunctionCallInfoData(*hfcinfo, &cache->flinfo, 1, InvalidOid,
								 NULL, NULL);
		hfcinfo->args[0].value = PointerGetDatum(request);
		hfcinfo->args[0].isnull = (request == NULL);
		result = FunctionCallInvoke(hfcinfo);
		if (!hfcinfo->isnull)
			response = DatumGetJsonbP(result);
	}

	IdemComplete(cache->nspid, scope, operation, key, response, 200, NULL, true);

	if (response == NULL)
		PG_RETURN_NULL();
	PG_RETURN_JSONB_P(response);
}

/*
 * idem_consume(consumer, message_id, ttl, wait) → boolean
 *
 * true: first delivery, do the work in this transaction; false: a committed
 * transaction (or this one) already processed the message; NULL: another
 * open transaction holds it and wait is false.  With wait, keys.c waits for
 * the transaction that holds the message to end and then reads the record
 * again, whatever this transaction's snapshot, so the answer is right at any
 * isolation level.
 */
Datum
idem_consume(PG_FUNCTION_ARGS)
{
	text	   *consumer = ARG_TEXT(0);
	text	   *message_id = ARG_TEXT(1);
	Interval   *ttl = PG_ARGISNULL(2) ? NULL : PG_GETARG_INTERVAL_P(2);
	text	   *scope;
	bool		wait;
	IdemReservation r;
	Oid			nspid;

	IdemCheckOperationArg(consumer, "consumer");
	IdemCheckKeyArg(message_id, "message_id");
	CheckArgNotNull(fcinfo, 3, "wait");
	wait = PG_GETARG_BOOL(3);

	nspid = IdemFunctionNamespace(fcinfo);
	scope = cstring_to_text(IDEM_CONSUME_SCOPE);

	IdemReserveCompleted(nspid, scope, consumer, message_id, ttl,
						 wait ? IDEM_RESERVE_WAIT : 0, &r);

	switch (r.outcome)
	{
		case IDEM_NEW:
			IdemStatsCount(VARDATA_ANY(consumer), VARSIZE_ANY_EXHDR(consumer),
						   IDEM_STAT_CONSUMED, 1);
			PG_RETURN_BOOL(true);

		case IDEM_REPLAY:
			IdemStatsCount(VARDATA_ANY(consumer), VARSIZE_ANY_EXHDR(consumer),
						   IDEM_STAT_DUPLICATES, 1);
			PG_RETURN_BOOL(false);

		case IDEM_IN_PROGRESS:
			/* Without wait: another open transaction holds the message */
			if (!wait)
				PG_RETURN_NULL();
			break;

		case IDEM_MISMATCH:
		case IDEM_STUCK:
			break;
	}

	/*
	 * idem_consume never commits an unfinished record, and all of its
	 * records have the same (NULL) fingerprint; this one was changed by hand.
	 */
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("message \"%s\" of consumer \"%s\" has an unfinished record",
					text_to_cstring(message_id), text_to_cstring(consumer)),
			 errdetail("Its record in idem_keys (scope \"%s\") was changed outside idem_consume.",
					   IDEM_CONSUME_SCOPE),
			 errhint("Delete that record to let the message be processed again.")));
	PG_RETURN_NULL();			/* keep compiler quiet */
}
