// The framework-free transaction runner, Idempotency.run, against the real
// extension: the handler's effect and the record commit together.

import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { Idempotency, requestDocument, type CapturedResponse } from '../src/index.js';
import { createDatabase, type TestDatabase } from './helpers.js';

let db: TestDatabase;
let idem: Idempotency;

before(async () => {
  db = await createDatabase('core');
  idem = await Idempotency.create({ pool: db.pool, scope: () => 'unused', onError: () => undefined });
});
after(async () => db.drop());

const params = (key: string, body: string) => ({
  operation: 'core', key, scope: 'tenant', ttl: '1 hour',
  request: requestDocument({ method: 'POST', path: '/core', contentType: 'application/json', rawBody: Buffer.from(body) }),
});
const effects = (note: string) => db.count('SELECT count(*) FROM effects WHERE note = $1', [note]);

describe('Idempotency.run', () => {
  it('runs the handler once in the transaction, then replays', async () => {
    let calls = 0;
    const handler = async (client: import('pg').PoolClient): Promise<CapturedResponse> => {
      calls++;
      await client.query("INSERT INTO effects (note) VALUES ('run')");
      return { status: 201, headers: { 'content-type': 'application/json', location: '/core/1' }, body: Buffer.from('{"ok": true}') };
    };
    const first = await idem.run(params('r-1', '{"a": 1}'), handler);
    assert.equal(first.status, 201);
    const again = await idem.run(params('r-1', '{"a": 1}'), handler);
    assert.equal(again.headers['idempotent-replayed'], 'true');
    assert.equal(again.headers.location, '/core/1');
    assert.deepEqual(JSON.parse(again.body.toString()), { ok: true });
    assert.equal(calls, 1);
    assert.equal(await effects('run'), 1);
    assert.equal(await db.count("SELECT count(*) FROM idem_keys WHERE key = 'r-1' AND ttl = interval '1 hour'"), 1);
  });
  it('rolls back a handler that throws, and one that returns a retryable status', async () => {
    const thrown = await idem.run(params('r-2', '{}'), async (client) => {
      await client.query("INSERT INTO effects (note) VALUES ('thrown')");
      throw new Error('no');
    });
    assert.equal(thrown.status, 500);
    assert.equal(JSON.parse(thrown.body.toString()).code, 'internal-error');
    const retryable = await idem.run(params('r-3', '{}'), async (client) => {
      await client.query("INSERT INTO effects (note) VALUES ('retryable')");
      return { status: 429, headers: {}, body: Buffer.alloc(0) };
    });
    assert.equal(retryable.status, 429);
    assert.equal(await effects('thrown') + await effects('retryable'), 0);
    assert.equal(await db.count("SELECT count(*) FROM idem_keys WHERE key IN ('r-2', 'r-3')"), 0);
  });
  it('answers the mapping for another request under the same key', async () => {
    const other = await idem.run(params('r-1', '{"a": 2}'), async () => assert.fail('the handler must not run'));
    assert.equal(other.status, 422);
    assert.equal(other.headers['content-type'], 'application/problem+json');
  });
});
