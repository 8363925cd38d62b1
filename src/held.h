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
 * keys.c asks held.c once per operation, and never looks inside a held
 * reservation: whether a key is held, and what that means for the
 * operation, is said here.
 */
extern void IdemHeldInit(void);
extern bool IdemHeldAnswer(Oid nspid, text *scope, text *operation, text *key,
						   bytea *hash, IdemReservation *result);
extern bool IdemHeldHold(IdemTable *table, Oid nspid, text *scope,
						 text *operation, text *key, bytea *hash,
						 Interval *ttl, TimestampTz created_at,
						 TimestampTz expires_at, bool completed);
extern void IdemHeldConsumedAtOnce(IdemTable *table, Oid nspid, text *scope,
								   text *operation, text *key, Interval *ttl);
extern bool IdemHeldChange(Oid nspid, text *scope, text *operation, text *key,
						   IdemRow *change, bool completes,
						   const char *function);
extern void IdemHeldWriteNow(Oid nspid, text *scope, text *operation,
							 text *key, const char *function);
extern bool IdemHeldRecord(Oid nspid, text *scope, text *operation, text *key,
						   IdemRow *row);

#endif							/* IDEM_HELD_H */
