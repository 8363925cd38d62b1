/*-------------------------------------------------------------------------
 *
 * catalog.c
 *	  The extension's row of pg_extension: the installed version of an
 *	  extension (ours, or Citus) and its schema.  A leaf: records.c, citus.c
 *	  and maintenance.c ask it, and it asks nothing of them.  Takes
 *	  AccessShareLock on pg_extension for the read.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/pg_extension.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/rel.h"

#include "idempotency.h"

#ifndef IDEM_VERSION
#error "IDEM_VERSION must be defined (the Makefile passes the control file's version)"
#endif

/*
 * extversion of the extension extname installed in this database, and its
 * schema into *nspid when nspid is not NULL; NULL (and InvalidOid) when it
 * is not installed.  The one reader of pg_extension.
 */
char *
IdemExtensionVersion(const char *extname, Oid *nspid)
{
	Relation	rel;
	SysScanDesc scan;
	ScanKeyData key;
	HeapTuple	tuple;
	char	   *version = NULL;

	rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_extension_extname, BTEqualStrategyNumber,
				F_NAMEEQ, CStringGetDatum(extname));
	scan = systable_beginscan(rel, ExtensionNameIndexId, true, NULL, 1, &key);
	tuple = systable_getnext(scan);
	if (nspid)
		*nspid = InvalidOid;
	if (HeapTupleIsValid(tuple))
	{
		bool		isnull;
		Datum		d = heap_getattr(tuple, Anum_pg_extension_extversion,
									 RelationGetDescr(rel), &isnull);

		version = isnull ? pstrdup("") : text_to_cstring(DatumGetTextPP(d));
		if (nspid)
			*nspid = ((Form_pg_extension) GETSTRUCT(tuple))->extnamespace;
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return version;
}

/* Is the installed catalog the previous release's, which this library serves? */
bool
IdemCatalogIsPrevious(void)
{
	char	   *installed = IdemExtensionVersion(IDEM_EXTENSION_NAME, NULL);

	return installed != NULL && strcmp(installed, IDEM_PREVIOUS_VERSION) == 0;
}
