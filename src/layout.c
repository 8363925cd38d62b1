/*-------------------------------------------------------------------------
 *
 * layout.c
 *	  The checks of idem_keys's layout, for records.c: its columns by name
 *	  and type, its primary key, whether its writes run only the install
 *	  script's rules, and the planned trees of its CHECK constraints and
 *	  partial-index predicates.
 *
 * The columns are found by name and checked by type (and NOT NULL, for
 * those read without a null check) once per relcache entry of idem_keys (a
 * relcache callback forgets the layout when the table changes), and so is
 * the primary key on (scope, operation, key).  A dropped, retyped,
 * nullable or unexpected column, or a missing primary key, is an ERROR
 * 55000 that names the column and what is expected, from every function,
 * before anything is read or written.  The previous release's catalog
 * (IDEM_PREVIOUS_VERSION, before ALTER EXTENSION UPDATE) is served as it
 * is: the columns new in this release are left out of every read and
 * write.  Against an older catalog the hint says to update it.
 *
 * Resolved with the layout: whether the table's writes run only the install
 * script's rules, all of them built-in code (OnlyOwnRules, which says how
 * they are recognised), and whether it is idem_keys itself, a member of the
 * extension, or a Citus shard of it on this node (citus.c); held.c holds a
 * reservation only there.  Takes AccessShareLock on the table's indexes
 * while it looks at them.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "catalog/dependency.h"
#include "catalog/pg_am.h"
#include "catalog/pg_index.h"
#include "catalog/pg_operator.h"
#include "catalog/pg_type.h"
#include "commands/defrem.h"
#include "commands/extension.h"
#include "nodes/makefuncs.h"
#include "optimizer/optimizer.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/syscache.h"

#include "compat.h"
#include "records.h"

#ifndef IDEM_VERSION
#error "IDEM_VERSION must be defined (the Makefile passes the control file's version)"
#endif

/*
 * Name and type of each column the extension reads and writes, and whether
 * it must be NOT NULL: the code reads those without looking for a null (the
 * key columns are NOT NULL as the primary key's); and whether it is new in
 * this release: the previous release's catalog lacks it, and is served
 * without it (IDEM_PREVIOUS_VERSION).
 */
typedef struct IdemColumnDef
{
	const char *name;
	Oid			type;
	bool		notnull;
	bool		new_here;
} IdemColumnDef;

static const IdemColumnDef idem_columns[IDEM_NUM_COLUMNS] = {
	[COL_SCOPE] = {"scope", TEXTOID, false, false},
	[COL_OPERATION] = {"operation", TEXTOID, false, false},
	[COL_KEY] = {"key", TEXTOID, false, false},
	[COL_REQUEST_HASH] = {"request_hash", BYTEAOID, false, false},
	[COL_STATUS] = {"status", TEXTOID, true, false},
	[COL_RESPONSE_STATUS] = {"response_status", INT4OID, false, false},
	[COL_RESPONSE] = {"response", JSONBOID, false, false},
	[COL_RESOURCE_ID] = {"resource_id", TEXTOID, false, false},
	[COL_RECOVERY_POINT] = {"recovery_point", TEXTOID, false, false},
	[COL_CREATED_AT] = {"created_at", TIMESTAMPTZOID, true, false},
	[COL_UPDATED_AT] = {"updated_at", TIMESTAMPTZOID, true, false},
	[COL_EXPIRES_AT] = {"expires_at", TIMESTAMPTZOID, true, false},
	/* NULL: the ttl is expires_at - created_at (keys.c) */
	[COL_TTL] = {"ttl", INTERVALOID, false, false},
};

/*
 * The layout of the current relcache entry of idem_keys.  One table per
 * database (the extension is installed once), so one entry is enough;
 * another relid simply resolves again.  Only column numbers and an OID:
 * the CHECK constraints and the partial-index predicates are prepared by
 * the executor in each writer's EState (see IdemRecordsWriterBegin).
 */
typedef struct IdemLayout
{
	bool		valid;
	Oid			relid;
	AttrNumber	attnum[IDEM_NUM_COLUMNS];
	Oid			pkey;
	bool		own_rules;		/* see OnlyOwnRules */
	bool		member;			/* a member of the extension */
	bool		shard;			/* a shard of it on this node (Citus) */
} IdemLayout;

static IdemLayout idem_layout;
static bool idem_layout_callback = false;

/* Relcache callback: forget the layout when idem_keys (or everything) changes */
static void
LayoutInvalidate(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == idem_layout.relid)
		idem_layout.valid = false;
}

/* Register LayoutInvalidate, once per backend */
static void
RegisterRelcacheCallback(void)
{
	if (!idem_layout_callback)
	{
		CacheRegisterRelcacheCallback(LayoutInvalidate, (Datum) 0);
		idem_layout_callback = true;
	}
}

/*
 * The planned trees of idem_keys's CHECK constraints and partial-index
 * predicates, kept across writes as the type cache keeps a domain's CHECK
 * constraints (prep_domain_constraints): the part of preparing them that
 * costs (stringToNode, expression_planner) done once, in a context under
 * CacheMemoryContext.  Only trees: each writer builds its ExprStates from
 * them in its own EState (UseRuleTrees), as ExecRelCheck and
 * ExecInsertIndexTuples build theirs, so nothing of one write's execution
 * (a SQL function's executor state, say) outlives it.  Dropped when the
 * relcache entry of the table or of one of those indexes changes (a
 * constraint or an index added, dropped or validated) or any function does
 * (a tree may call, or have inlined, a function since replaced).  A set is
 * published only once complete; the set it replaces may still be in use by
 * a writer's ExprStates (which point into the trees), so it goes with the
 * transaction rather than at once.
 */
typedef struct IdemRuleTrees
{
	Oid			relid;
	MemoryContext cxt;
	int			ncheck;
	Expr	  **checks;			/* one per ConstrCheck; NULL: not enforced */
	int			npredicates;
	Oid		   *predicate_index;	/* each partial index of the table */
	List	  **predicates;		/* and its planned predicate */
} IdemRuleTrees;

static IdemRuleTrees *idem_rules;	/* NULL: none published */
static bool idem_rules_valid = false;	/* false: plan them again */

/* Relcache callback: idem_keys or one of its indexes may have changed */
static void
RulesInvalidate(Datum arg, Oid relid)
{
	int			i;

	/* While a set is being planned (none published), any change counts */
	if (idem_rules == NULL || relid == InvalidOid || relid == idem_rules->relid)
		idem_rules_valid = false;
	else
		for (i = 0; i < idem_rules->npredicates; i++)
			if (relid == idem_rules->predicate_index[i])
				idem_rules_valid = false;
}

/* pg_proc callback: a function of a planned tree may have changed */
static void
RulesInvalidateProc(Datum arg, int cacheid, uint32 hashvalue)
{
	idem_rules_valid = false;
}

/*
 * Plan the CHECK constraints and partial-index predicates of the writer
 * rri (its relation idem_keys, locked, its indexes open) and publish them
 * in place of the set before.
 */
static void
PlanRules(ResultRelInfo *rri)
{
	static bool callbacks = false;
	TupleConstr *constr = RelationGetDescr(rri->ri_RelationDesc)->constr;
	MemoryContext cxt;
	MemoryContext oldcxt;
	IdemRuleTrees *rules;
	int			i;

	if (!callbacks)
	{
		CacheRegisterRelcacheCallback(RulesInvalidate, (Datum) 0);
		CacheRegisterSyscacheCallback(PROCOID, RulesInvalidateProc, (Datum) 0);
		callbacks = true;
	}

	/* Unpublish the old set; it goes with this transaction (see above) */
	if (idem_rules != NULL)
		MemoryContextSetParent(idem_rules->cxt, TopTransactionContext);
	idem_rules = NULL;
	/* An invalidation while planning clears it, and the next write plans again */
	idem_rules_valid = true;

	/* Built under the current context: an ERROR meanwhile frees it all */
	cxt = AllocSetContextCreate(CurrentMemoryContext, "idem_keys rule trees",
								ALLOCSET_SMALL_SIZES);
	oldcxt = MemoryContextSwitchTo(cxt);
	rules = palloc0(sizeof(IdemRuleTrees));
	rules->relid = RelationGetRelid(rri->ri_RelationDesc);
	rules->cxt = cxt;
	if (constr != NULL && constr->num_check > 0)
	{
		rules->ncheck = constr->num_check;
		rules->checks = palloc0(constr->num_check * sizeof(Expr *));
		for (i = 0; i < constr->num_check; i++)
			if (IdemCheckIsEnforced(&constr->check[i]))
				rules->checks[i] = expression_planner(stringToNode(constr->check[i].ccbin));
	}
	rules->predicate_index = palloc(Max(rri->ri_NumIndices, 1) * sizeof(Oid));
	rules->predicates = palloc(Max(rri->ri_NumIndices, 1) * sizeof(List *));
	for (i = 0; i < rri->ri_NumIndices; i++)
	{
		Relation	index = rri->ri_IndexRelationDescs[i];

		if (rri->ri_IndexRelationInfo[i]->ii_Predicate == NIL)
			continue;
		rules->predicate_index[rules->npredicates] = RelationGetRelid(index);
		rules->predicates[rules->npredicates] = (List *)
			expression_planner((Expr *) RelationGetIndexPredicate(index));
		rules->npredicates++;
	}
	MemoryContextSwitchTo(oldcxt);

	/* Complete: publish it */
	MemoryContextSetParent(cxt, CacheMemoryContext);
	idem_rules = rules;
}

/*
 * Give the writer rri (its indexes open) the ExprStates of its CHECK
 * constraints and partial-index predicates, built in the current memory
 * context (the EState's) from the planned trees, planning them first when
 * they are not current.  Whatever is left unset the executor prepares
 * itself (an index created since, say).
 */
void
IdemLayoutRuleStates(ResultRelInfo *rri)
{
	TupleConstr *constr = RelationGetDescr(rri->ri_RelationDesc)->constr;
	int			ncheck = constr != NULL ? constr->num_check : 0;
	int			i;
	int			j;

	if (idem_rules == NULL || !idem_rules_valid ||
		idem_rules->relid != RelationGetRelid(rri->ri_RelationDesc) ||
		idem_rules->ncheck != ncheck)
		PlanRules(rri);
	if (ncheck > 0)
	{
		ExprState **checks = palloc0(ncheck * sizeof(ExprState *));

		for (i = 0; i < ncheck; i++)
			if (idem_rules->checks[i] != NULL)
				checks[i] = ExecInitExpr(idem_rules->checks[i], NULL);
		IdemResultRelChecks(rri) = checks;
	}
	for (i = 0; i < rri->ri_NumIndices; i++)
	{
		IndexInfo  *ii = rri->ri_IndexRelationInfo[i];

		if (ii->ii_Predicate == NIL)
			continue;
		for (j = 0; j < idem_rules->npredicates; j++)
			if (idem_rules->predicate_index[j] == RelationGetRelid(rri->ri_IndexRelationDescs[i]))
				ii->ii_PredicateState = ExecInitQual(idem_rules->predicates[j], NULL);
	}
}

/* The schema-qualified name of idem_keys, for hints */
char *
IdemQualifiedName(Relation rel)
{
	return quote_qualified_identifier(get_namespace_name(RelationGetNamespace(rel)),
									  RelationGetRelationName(rel));
}

/*
 * Raise the error for a column of the install script that idem_keys lacks.
 * When the catalog is older than the previous release (which this library
 * serves as it is), updating it is the remedy.
 */
pg_noreturn static void
ReportMissingColumn(Relation rel, IdemColumn col)
{
	const char *name = idem_columns[col].name;
	char	   *type = format_type_be(idem_columns[col].type);
	char	   *installed = IdemExtensionVersion(IDEM_EXTENSION_NAME, NULL);

	if (installed != NULL && strcmp(installed, IDEM_VERSION) != 0 &&
		strcmp(installed, IDEM_PREVIOUS_VERSION) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table \"idem_keys\" has no column \"%s\"", name),
				 errdetail("The library of extension \"idempotency\" is version %s and needs column \"%s\" of type %s; the installed catalog is version %s.",
						   IDEM_VERSION, name, type, installed),
				 errhint("Run ALTER EXTENSION idempotency UPDATE to bring the catalog to the library's version.")));
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("table \"idem_keys\" has no column \"%s\"", name),
			 errdetail("The extension needs column \"%s\" of type %s.", name, type),
			 errhint("Add the column back with ALTER TABLE %s ADD COLUMN %s %s.",
					 IdemQualifiedName(rel), quote_identifier(name), type)));
}

/* Raise the error for a column of idem_keys whose type was changed */
pg_noreturn static void
ReportRetypedColumn(Relation rel, IdemColumn col, Oid actual)
{
	const char *name = idem_columns[col].name;
	char	   *type = format_type_be(idem_columns[col].type);

	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("column \"%s\" of table \"idem_keys\" has type %s", name,
					format_type_be(actual)),
			 errdetail("The extension needs type %s.", type),
			 errhint("Change it back with ALTER TABLE %s ALTER COLUMN %s TYPE %s USING %s::%s.",
					 IdemQualifiedName(rel), quote_identifier(name), type,
					 quote_identifier(name), type)));
}

/* Raise the error for a column of idem_keys that lost its NOT NULL */
pg_noreturn static void
ReportNullableColumn(Relation rel, IdemColumn col)
{
	const char *name = idem_columns[col].name;

	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("column \"%s\" of table \"idem_keys\" is not marked NOT NULL", name),
			 errdetail("The extension needs a value in column \"%s\" of every record.", name),
			 errhint("Set it back with ALTER TABLE %s ALTER COLUMN %s SET NOT NULL, after giving any record where it is null the value it should have.",
					 IdemQualifiedName(rel), quote_identifier(name))));
}

/* Raise the error for a column of idem_keys that the extension does not know */
pg_noreturn static void
ReportUnexpectedColumn(Relation rel, const char *name)
{
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("table \"idem_keys\" has an unexpected column \"%s\"", name),
			 errdetail("The extension writes whole records and knows only the columns it created."),
			 errhint("Keep the data of column \"%s\" in a table of your own and drop the column from %s.",
					 name, IdemQualifiedName(rel))));
}

/* Raise the error for an idem_keys without its primary key */
pg_noreturn static void
ReportMissingPrimaryKey(Relation rel)
{
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("table \"idem_keys\" has no primary key on (scope, operation, key)"),
			 errdetail("Every reservation finds its record through that primary key."),
			 errhint("Add it back with ALTER TABLE %s ADD CONSTRAINT idem_keys_pkey PRIMARY KEY (scope, operation, key).",
					 IdemQualifiedName(rel))));
}

/* Is the primary key oid an index on exactly (scope, operation, key)? */
static bool
PrimaryKeyMatches(Oid pkey, const AttrNumber *attnum)
{
	HeapTuple	tuple;
	Form_pg_index index;
	bool		matches;

	tuple = SearchSysCache1(INDEXRELID, ObjectIdGetDatum(pkey));
	if (!HeapTupleIsValid(tuple))
		return false;
	index = (Form_pg_index) GETSTRUCT(tuple);
	matches = index->indnkeyatts == 3 &&
		index->indkey.values[0] == attnum[COL_SCOPE] &&
		index->indkey.values[1] == attnum[COL_OPERATION] &&
		index->indkey.values[2] == attnum[COL_KEY];
	ReleaseSysCache(tuple);
	return matches;
}

/*
 * Is the index indexid one of the install script's, by its definition
 * (whatever its name): a non-unique btree on one column, in the default
 * operator class and order, without expressions and without a predicate
 * (idem_keys_expires_at_idx on expires_at) or with exactly status =
 * 'processing' (idem_keys_processing_idx on created_at); or the primary
 * key, on (scope, operation, key) in the default operator classes?  Such
 * an index runs only built-in code when a record is written.
 */
static bool
IsOwnIndex(Relation rel, Oid indexid, Oid pkey, const AttrNumber *attnum)
{
	Relation	index = index_open(indexid, AccessShareLock);
	Form_pg_index form = index->rd_index;
	bool		own = index->rd_rel->relam == BTREE_AM_OID &&
		form->indnatts == form->indnkeyatts &&
		heap_attisnull(index->rd_indextuple, Anum_pg_index_indexprs, NULL);
	int			i;

	for (i = 0; own && i < form->indnkeyatts; i++)
	{
		AttrNumber	col = form->indkey.values[i];
		Oid			type = col > 0 ? TupleDescAttr(RelationGetDescr(rel), col - 1)->atttypid : InvalidOid;

		/* (the family's support functions are what a write calls) */
		if (col <= 0 || index->rd_indoption[i] != 0 ||
			index->rd_opcintype[i] != type ||
			index->rd_opfamily[i] != get_opclass_family(GetDefaultOpClass(type, BTREE_AM_OID)) ||
			index->rd_indcollation[i] != TupleDescAttr(RelationGetDescr(rel), col - 1)->attcollation)
			own = false;
	}
	if (own && indexid == pkey)
		own = form->indnatts == 3 && heap_attisnull(index->rd_indextuple, Anum_pg_index_indpred, NULL);
	else if (own)
	{
		own = !form->indisunique && form->indnatts == 1;
		if (own && form->indkey.values[0] == attnum[COL_EXPIRES_AT])
			own = heap_attisnull(index->rd_indextuple, Anum_pg_index_indpred, NULL);
		else if (own && form->indkey.values[0] == attnum[COL_CREATED_AT])
		{
			List	   *pred = RelationGetIndexPredicate(index);
			OpExpr	   *op = list_length(pred) == 1 && IsA(linitial(pred), OpExpr) ?
				linitial_node(OpExpr, pred) : NULL;

			own = op != NULL && op->opno == TextEqualOperator &&
				list_length(op->args) == 2 && IsA(linitial(op->args), Var) &&
				IsA(lsecond(op->args), Const) &&
				linitial_node(Var, op->args)->varattno == attnum[COL_STATUS] &&
				!lsecond_node(Const, op->args)->constisnull &&
				lsecond_node(Const, op->args)->consttype == TEXTOID &&
				strcmp(TextDatumGetCString(lsecond_node(Const, op->args)->constvalue),
					   "processing") == 0;
		}
		else
			own = false;
	}
	index_close(index, AccessShareLock);
	return own;
}

/*
 * Is the CHECK constraint check the install script's idem_keys_status_check,
 * by its definition (whatever its name): status = ANY (ARRAY['processing',
 * 'completed', 'stuck']) with the built-in text equality?
 */
static bool
IsStatusCheck(ConstrCheck *check, const AttrNumber *attnum)
{
	Node	   *expr = stringToNode(check->ccbin);
	ScalarArrayOpExpr *saop;
	Const	   *array;
	Datum	   *elems;
	bool	   *nulls;
	int			n;
	static const char *const statuses[] = {"processing", "completed", "stuck"};

	if (!IsA(expr, ScalarArrayOpExpr))
		return false;
	saop = (ScalarArrayOpExpr *) expr;
	if (saop->opno != TextEqualOperator || !saop->useOr ||
		list_length(saop->args) != 2 || !IsA(linitial(saop->args), Var) ||
		linitial_node(Var, saop->args)->varattno != attnum[COL_STATUS])
		return false;
	if (IsA(lsecond(saop->args), ArrayExpr))
	{
		/* As the parser leaves IN (...): an array of constants */
		ArrayExpr  *arr = lsecond_node(ArrayExpr, saop->args);
		ListCell   *lc;
		int			i = 0;

		if (arr->element_typeid != TEXTOID || list_length(arr->elements) != lengthof(statuses))
			return false;
		foreach(lc, arr->elements)
		{
			Const	   *c = (Const *) lfirst(lc);

			if (!IsA(c, Const) || c->consttype != TEXTOID || c->constisnull ||
				strcmp(TextDatumGetCString(c->constvalue), statuses[i++]) != 0)
				return false;
		}
		return true;
	}
	if (!IsA(lsecond(saop->args), Const))
		return false;
	array = lsecond_node(Const, saop->args);
	if (array->constisnull || array->consttype != TEXTARRAYOID)
		return false;
	deconstruct_array(DatumGetArrayTypeP(array->constvalue), TEXTOID, -1, false,
					  TYPALIGN_INT, &elems, &nulls, &n);
	if (n != lengthof(statuses))
		return false;
	for (int i = 0; i < n; i++)
		if (nulls[i] || strcmp(TextDatumGetCString(elems[i]), statuses[i]) != 0)
			return false;
	return true;
}

/*
 * Do the writes of rel run only the rules of the install script, all of
 * them built-in code?  No trigger, no stored generated column, no CHECK
 * constraint but idem_keys_status_check, and no index but the primary key,
 * idem_keys_expires_at_idx and idem_keys_processing_idx, each recognised
 * by its definition, never by its name.  Then a record's writes fail or
 * succeed the same whenever they are made, and run no code of any role:
 * keys.c may hold a reservation and write it at commit (held.c).  A rule
 * of the table's owner makes every write happen when it always did.
 */
static bool
OnlyOwnRules(Relation rel, Oid pkey, const AttrNumber *attnum)
{
	TupleConstr *constr = RelationGetDescr(rel)->constr;
	List	   *indexes;
	ListCell   *lc;
	bool		own = true;

	if (rel->trigdesc != NULL || rel->rd_rules != NULL)
		return false;
	if (constr != NULL && constr->has_generated_stored)
		return false;
	if (constr != NULL && constr->num_check > 0 &&
		(constr->num_check > 1 || !IsStatusCheck(&constr->check[0], attnum)))
		return false;
	indexes = RelationGetIndexList(rel);
	foreach(lc, indexes)
	{
		if (!IsOwnIndex(rel, lfirst_oid(lc), pkey, attnum))
		{
			own = false;
			break;
		}
	}
	list_free(indexes);
	return own;
}

/*
 * Resolve the layout of idem_keys from its relcache entry: each column by
 * name, checked by type, and the primary key.  Anything else in the table
 * is an error (see the file header).
 */
static void
ResolveLayout(Relation rel)
{
	TupleDesc	desc = RelationGetDescr(rel);
	AttrNumber	attnum[IDEM_NUM_COLUMNS] = {0};
	Oid			pkey;
	bool		member;
	bool		shard;
	int			i;
	int			c;

	RegisterRelcacheCallback();

	/*
	 * idem_keys itself, or a Citus shard of it (a member of no extension):
	 * first, as the look-up in Citus's metadata runs queries, which may
	 * accept invalidations of this very relation
	 */
	member = getExtensionOfObject(RelationRelationId, RelationGetRelid(rel)) ==
		get_extension_oid(IDEM_EXTENSION_NAME, true);
	shard = !member && IdemCitusIsLocalShard(RelationGetRelid(rel));

	for (i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

		if (att->attisdropped)
			continue;
		for (c = 0; c < IDEM_NUM_COLUMNS; c++)
			if (strcmp(NameStr(att->attname), idem_columns[c].name) == 0)
				break;
		if (c == IDEM_NUM_COLUMNS)
			ReportUnexpectedColumn(rel, NameStr(att->attname));
		if (att->atttypid != idem_columns[c].type)
			ReportRetypedColumn(rel, (IdemColumn) c, att->atttypid);
		if (idem_columns[c].notnull && !att->attnotnull)
			ReportNullableColumn(rel, (IdemColumn) c);
		attnum[c] = att->attnum;
	}
	for (c = 0; c < IDEM_NUM_COLUMNS; c++)
	{
		if (attnum[c] != 0)
			continue;
		/* Left absent (attnum 0): not read, not written */
		if (idem_columns[c].new_here && IdemCatalogIsPrevious())
			continue;
		ReportMissingColumn(rel, (IdemColumn) c);
	}

	pkey = IdemPrimaryKeyIndex(rel);
	if (!OidIsValid(pkey) || !PrimaryKeyMatches(pkey, attnum))
		ReportMissingPrimaryKey(rel);

	memcpy(idem_layout.attnum, attnum, sizeof(attnum));
	idem_layout.pkey = pkey;
	idem_layout.own_rules = OnlyOwnRules(rel, pkey, attnum);
	idem_layout.member = member;
	idem_layout.shard = shard;
	idem_layout.relid = RelationGetRelid(rel);
	idem_layout.valid = true;
}

/* Give table (its relation open and locked) the layout of its relation */
void
IdemLayoutOf(IdemTable *table)
{
	if (!idem_layout.valid || idem_layout.relid != RelationGetRelid(table->rel))
		ResolveLayout(table->rel);
	memcpy(table->attnum, idem_layout.attnum, sizeof(table->attnum));
	table->pkey = idem_layout.pkey;
	table->own_rules = idem_layout.own_rules;
	table->member = idem_layout.member;
	table->shard = idem_layout.shard;
}

/* The name of a column, for messages */
const char *
IdemColumnName(IdemColumn col)
{
	return idem_columns[col].name;
}
