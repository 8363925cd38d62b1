/**
 * The start-up check of the extension's version (doc/clients.md, "Settings
 * every library has").
 *
 * @module
 */

import type { Pool, PoolClient } from 'pg';

/** The first release with the `scope` and `ttl` arguments these calls use. */
export const MINIMUM_EXTENSION_VERSION = '0.2.0';

/** The extension missing from the database, or older than {@link MINIMUM_EXTENSION_VERSION}. */
export class ExtensionVersionError extends Error {
  /** The version found, or null when the extension is not installed. */
  readonly found: string | null;

  constructor(found: string | null) {
    super(
      found === null
        ? `the idempotency extension is not installed in this database (pg-idempotency needs version ${MINIMUM_EXTENSION_VERSION} or later: CREATE EXTENSION idempotency)`
        : `the idempotency extension is version ${found}; pg-idempotency needs version ${MINIMUM_EXTENSION_VERSION} or later (ALTER EXTENSION idempotency UPDATE)`,
    );
    this.name = 'ExtensionVersionError';
    this.found = found;
  }
}

/** What the check found. */
export interface ExtensionInfo {
  /** `extversion`, such as `0.2.0`. */
  version: string;
  /** The schema the extension's objects are in. */
  schema: string;
}

/** Compares two dotted versions (`0.10.0` > `0.9.1`); other text compares as 0. */
export function compareVersions(a: string, b: string): number {
  const pa = a.split(/[.-]/).map((part) => Number.parseInt(part, 10) || 0);
  const pb = b.split(/[.-]/).map((part) => Number.parseInt(part, 10) || 0);
  for (let i = 0; i < Math.max(pa.length, pb.length); i++) {
    const d = (pa[i] ?? 0) - (pb[i] ?? 0);
    if (d !== 0) return d < 0 ? -1 : 1;
  }
  return 0;
}

/**
 * Checks that the extension is installed, at {@link MINIMUM_EXTENSION_VERSION}
 * or later, in the database of `db`.
 *
 * @throws ExtensionVersionError naming the version found.
 */
export async function checkExtensionVersion(db: Pool | PoolClient): Promise<ExtensionInfo> {
  const result = await db.query<{ extversion: string; nspname: string }>(
    `SELECT e.extversion, n.nspname
       FROM pg_catalog.pg_extension e
       JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace
      WHERE e.extname = 'idempotency'`,
  );
  const row = result.rows[0];
  if (row === undefined) throw new ExtensionVersionError(null);
  if (compareVersions(row.extversion, MINIMUM_EXTENSION_VERSION) < 0) {
    throw new ExtensionVersionError(row.extversion);
  }
  return { version: row.extversion, schema: row.nspname };
}
