/*-------------------------------------------------------------------------
 *
 * stats.c
 *	  Shared-memory statistics (interim: counters are not kept yet).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "idempotency.h"

/* Register shared memory for the counters */
void
IdemStatsInit(void)
{
}

/* Add n to one counter of an operation */
void
IdemStatsCount(const char *operation, int operation_len,
			   IdemCounter counter, int64 n)
{
}
