/*-------------------------------------------------------------------------
 *
 * idempotency.c
 *	  Module entry point and the user-level settings.
 *
 * _PG_init defines the settings every backend needs and lets each part
 * register what it owns (shared memory, the background worker).  Parts that
 * need shared_preload_libraries check process_shared_preload_libraries_in_progress
 * themselves; everything else works when the library is loaded on demand.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "fmgr.h"
#include "utils/guc.h"

#include "held.h"
#include "idempotency.h"
#include "maintenance.h"

PG_MODULE_MAGIC;

/* idempotency.default_ttl, in seconds */
int			idem_default_ttl_s = 24 * 60 * 60;

/* idempotency.processing_timeout, in milliseconds */
int			idem_processing_timeout_ms = 5 * 60 * 1000;

/* idempotency.reconciler_timeout, in milliseconds */
int			idem_reconciler_timeout_ms = 5 * 60 * 1000;

/* idempotency.enable_superuser_reconcilers */
bool		idem_enable_superuser_reconcilers = false;

void		_PG_init(void);

/* Define settings and register the parts of the module */
void
_PG_init(void)
{
	DefineCustomIntVariable("idempotency.default_ttl",
							"How long a completed key is kept when idem_reserve gets no ttl.",
							"After it, a retry with the same key runs again.",
							&idem_default_ttl_s,
							24 * 60 * 60,
							1,
							INT_MAX,
							PGC_USERSET,
							GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.processing_timeout",
							"Age after which an uncompleted reservation is reported as stuck.",
							"The age counts from the reservation or the last idem_checkpoint.",
							&idem_processing_timeout_ms,
							5 * 60 * 1000,
							1,
							INT_MAX,
							PGC_USERSET,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	/*
	 * Superuser-set: the role that registers a reconciler must not lift
	 * the limit that keeps it from holding a worker; ALTER DATABASE ... SET
	 * gives one database a limit of its own (the worker reads it).
	 */
	DefineCustomIntVariable("idempotency.reconciler_timeout",
							"Longest time one reconciler call may run.",
							"A call still running after it is cancelled like a statement that exceeded statement_timeout: a WARNING names the key, the record stays stuck, and the next maintenance pass calls the reconciler again.  A call that catches the cancel is ended with its process a grace later (half the limit, at most 1 s).",
							&idem_reconciler_timeout_ms,
							5 * 60 * 1000,
							1,
							INT_MAX,
							PGC_SUSET,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	/*
	 * Superuser-set, as pg_cron's cron.enable_superuser_jobs: a reconciler
	 * runs unattended with its run-as role's rights and trusts every object
	 * it touches, so only the operator may let that role be a superuser
	 * (postgresql.conf, or ALTER DATABASE ... SET for one database, which
	 * the worker reads).
	 */
	DefineCustomBoolVariable("idempotency.enable_superuser_reconcilers",
							 "Allows reconcilers that run as a superuser.",
							 "Off: registering a reconciler that runs as a superuser is refused, and one registered before is skipped with a WARNING.  On: every table, view, type and function such a reconciler touches runs with superuser rights.",
							 &idem_enable_superuser_reconcilers,
							 false,
							 PGC_SUSET,
							 0,
							 NULL, NULL, NULL);

	IdemHeldInit();
	IdemStatsInit();
	IdemStatusInit();
	IdemBackoffInit();
	IdemWorkerInit();

	MarkGUCPrefixReserved("idempotency");
}
