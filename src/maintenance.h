/*-------------------------------------------------------------------------
 *
 * maintenance.h
 *	  Private to the maintenance files: what maintenance.c, reconcile.c and
 *	  backoff.c share about reconciler calls that failed or were skipped.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_MAINTENANCE_H
#define IDEM_MAINTENANCE_H

/* backoff.c: failed records' next attempts, skipped operations' causes */
extern void IdemBackoffInit(void);
extern bool IdemBackoffWaiting(const text *scope, const text *operation,
							   const text *key);
extern void IdemBackoffBegin(const text *scope, const text *operation,
							 const text *key);
extern void IdemBackoffEnd(const text *scope, const text *operation,
						   const text *key, const char *reason);
extern bool IdemSkipNoted(const text *operation, const char *cause,
						  const char *reason);
extern void IdemSkipForget(const text *operation);

#endif							/* IDEM_MAINTENANCE_H */
