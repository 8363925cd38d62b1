/*-------------------------------------------------------------------------
 *
 * held.h
 *	  Held reservations (held.c): a reservation of a new key whose record
 *	  is written once, later in its transaction, as the write the
 *	  reservation would have made.  keys.c holds them and completes them.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_HELD_H
#define IDEM_HELD_H

#include "records.h"

/*
 * A reservation this transaction holds, or an idem_consume record it wrote
 * at once (see held.c)
 */
typedef struct IdemHeld
{
	struct IdemHeld *next;
	Oid			nspid;			/* of the extension whose idem_keys it is */
	Oid			relid;			/* that idem_keys, by OID */
	text	   *scope;
	text	   *operation;
	text	   *key;
	bytea	   *hash;			/* NULL without a request */
	Interval   *ttl;
	TimestampTz created_at;		/* the reservation's time, and its heartbeat */
	TimestampTz expires_at;		/* as reserved */
	bool		completed;		/* idem_consume's: written completed, its
								 * expiry counted from the write */
	Oid			roleid;			/* the role that reserved */
	int			sec_context;	/* and its security context */
	SubTransactionId subid;		/* the subtransaction that holds it */
	SubTransactionId written;	/* the one that wrote it; Invalid: not yet */
} IdemHeld;

extern void IdemHeldInit(void);
extern bool IdemHeldAllowed(IdemTable *table);
extern void IdemHeldAdd(IdemTable *table, Oid nspid, text *scope,
						text *operation, text *key, bytea *hash,
						Interval *ttl, TimestampTz created_at,
						TimestampTz expires_at, bool completed);
extern void IdemHeldConsumedAtOnce(IdemTable *table, Oid nspid, text *scope,
								   text *operation, text *key, Interval *ttl);
extern IdemHeld *IdemHeldFind(Oid nspid, text *scope, text *operation,
							  text *key);
extern void IdemHeldRow(IdemHeld *h, IdemRow *change, IdemRow *row);
extern void IdemHeldWrite(IdemHeld *h, IdemRow *change, const char *function);

#endif							/* IDEM_HELD_H */
