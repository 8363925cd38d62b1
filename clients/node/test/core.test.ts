// The core runner, Idempotency.run, called with a plain function (no web
// framework), against the real extension: the function's effect and the
// record commit together, or neither.

import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import type { PoolClient } from 'pg';
import {
  type Completion, Idempotency, InProgressError, KeyOutcomeError, MismatchError, ResponseTooLargeError, type RunResult, StuckError, TimeLimitError,
} from '../src/index.js';
import { createDatabase, holdReservation, sleep, type TestDatabase } from './helpers.js';

let db: TestDatabase;
let idem: Idempotency;

before(async () => {
  db = await createDatabase('core');
  idem = await Idempotency.create({ pool: db.pool, scope: () => 'unused', onError: () => undefined });
});
after(async () => db.drop());

const params = (key: string, request: unknown = { n: 1 }) => ({ operation: 'core', key, scope: 'tenant', ttl: '1 hour', request: JSON.stringify(request) });
const effects = (key: string) => db.count('SELECT count(*) FROM effects WHERE note = $1', [key]);
const records = (key: string, where = 'true') => db.count(`SELECT count(*) FROM idem_keys WHERE key = $1 AND ${where}`, [key]);
/** A function that inserts one row (noted with the key) and completes with the status. */
const insert = (key: string, status = 200, response: unknown = { ok: key }) => async (client: PoolClient): Promise<Completion> => {
  await client.query('INSERT INTO effects (note) VALUES ($1)', [key]);
  return { status, response: JSON.stringify(response) };
};

describe('Idempotency.run', () => {
  it('new: runs the function once in the transaction and commits its effect with the record', async () => {
    const r = await idem.run(params('new'), insert('new', 201));
    assert.deepEqual(r, { outcome: 'new', status: 201, response: '{"ok":"new"}', committed: true });
    assert.equal(await effects('new'), 1);
    assert.equal(await records('new', "status = 'completed' AND response_status = 201 AND ttl = interval '1 hour'"), 1);
  });
  it('replay: the stored status and response; the function is not called', async () => {
    await idem.run(params('replay'), insert('replay', 201, { id: 7 }));
    const r = await idem.run(params('replay'), async () => assert.fail('the function must not run'));
    assert.equal(r.outcome, 'replay');
    assert.equal(r.status, 201);
    assert.deepEqual(JSON.parse(r.response!), { id: 7 });
    assert.equal(await effects('replay'), 1);
  });
  it('mismatch: another request under the key is a MismatchError', async () => {
    await idem.run(params('mismatch', { n: 1 }), insert('mismatch'));
    await assert.rejects(idem.run(params('mismatch', { n: 2 }), async () => assert.fail('the function must not run')),
      (e: unknown) => e instanceof MismatchError && e instanceof KeyOutcomeError && e.outcome === 'mismatch');
    assert.equal(await effects('mismatch'), 1);
  });
  it('in_progress: a second call while the first holds the key is an InProgressError, and the first commits', async () => {
    let entered!: () => void;
    const inside = new Promise<void>((resolve) => { entered = resolve; });
    let leave!: () => void;
    const gate = new Promise<void>((resolve) => { leave = resolve; });
    const first = idem.run(params('busy'), async (client) => {
      await client.query('INSERT INTO effects (note) VALUES ($1)', ['busy']);
      entered();
      await gate;
      return { status: 200, response: '{}' };
    });
    await inside;
    await assert.rejects(idem.run(params('busy'), async () => assert.fail('the function must not run')), InProgressError);
    leave();
    assert.equal((await first).outcome, 'new');
    assert.equal(await effects('busy'), 1);
    assert.equal((await idem.run(params('busy'), async () => assert.fail('the function must not run'))).outcome, 'replay');
  });
  it('stuck: a record whose outcome is unknown is a StuckError', async () => {
    await holdReservation(db.pool, 'core', 'stuck', 'tenant', '{"n": 1}');
    await db.pool.query("UPDATE idem_keys SET status = 'stuck' WHERE key = 'stuck'");
    await assert.rejects(idem.run(params('stuck'), async () => assert.fail('the function must not run')), StuckError);
  });
  it('a raise rolls back: the error as raised, no effect, no record, and the next call runs again', async () => {
    const raised = new Error('no');
    for (let attempt = 1; attempt <= 2; attempt++) {
      await assert.rejects(idem.run(params('raise'), async (client) => {
        await insert('raise')(client);
        throw raised;
      }), (e: unknown) => e === raised);
      assert.equal(await effects('raise'), 0);
      assert.equal(await records('raise'), 0);
    }
  });
  it('a retryable status rolls back (committed false); the policy can change the list', async () => {
    const r = await idem.run(params('retryable'), insert('retryable', 429));
    assert.deepEqual(r, { outcome: 'new', status: 429, response: '{"ok":"retryable"}', committed: false });
    assert.equal(await effects('retryable') + await records('retryable'), 0);
    const kept = await idem.run(params('retryable'), insert('retryable', 429), { retryable: () => false });
    assert.equal(kept.outcome === 'new' && kept.committed, true);
    assert.equal(await effects('retryable'), 1);
  });
  it('a final error is completed with the completion the policy gives it, and replayed', async () => {
    class Declined extends Error {}
    const final = (error: unknown) => (error instanceof Declined ? { status: 402, response: '{"declined": true}' } : undefined);
    const r = await idem.run(params('final'), async (client) => {
      await insert('final')(client);
      throw new Declined();
    }, { final });
    assert.deepEqual(r, { outcome: 'new', status: 402, response: '{"declined": true}', committed: true });
    const again = await idem.run(params('final'), async () => assert.fail('the function must not run'), { final });
    assert.equal(again.outcome, 'replay');
    assert.equal(again.status, 402);
    assert.equal(await effects('final'), 1);
  });
  it('a response over the responseLimit is rolled back: ResponseTooLargeError', async () => {
    await assert.rejects(idem.run(params('big'), insert('big', 200, { s: 'x'.repeat(100) }), { responseLimit: 50 }), ResponseTooLargeError);
    assert.equal(await effects('big') + await records('big'), 0);
    assert.equal((await idem.run(params('big'), insert('big', 200, { s: 'x'.repeat(10) }), { responseLimit: 50 })).outcome, 'new');
  });
  it('a response the server cannot store is rolled back and raised (22P05)', async () => {
    await assert.rejects(idem.run(params('nul'), insert('nul', 200, { s: 'a\u0000b' })), { code: '22P05' });
    assert.equal(await effects('nul') + await records('nul'), 0);
  });
  it('a function past the time limit: TimeLimitError at the limit, rolled back, the key free again', async () => {
    for (const [label, hang] of [
      ['JavaScript', () => sleep(2000)],
      ['a statement', (client: PoolClient) => client.query('SELECT pg_sleep(5)')],
    ] as [string, (client: PoolClient) => Promise<unknown>][]) {
      const key = `limit-${label}`;
      const start = Date.now();
      await assert.rejects(idem.run(params(key), async (client) => {
        await insert(key)(client);
        await hang(client);
        return { status: 200, response: '{}' };
      }, { timeLimit: 200 }), TimeLimitError);
      assert.ok(Date.now() - start < 1000, `${label}: thrown after ${Date.now() - start} ms`);
      let r: RunResult | undefined;
      while (r === undefined && Date.now() - start < 1500) {
        r = await idem.run(params(key), insert(key)).catch((e: unknown) => {
          if (!(e instanceof InProgressError)) throw e;
          return sleep(50).then(() => undefined);
        });
      }
      assert.equal(r?.outcome, 'new', `${label}: the key is free within twice the limit`);
      assert.equal(await effects(key), 1);
    }
    await sleep(2000); // the JavaScript function ends; what it returns is dropped
  });
  it('returns every client to the pool', () => {
    assert.equal(db.pool.totalCount - db.pool.idleCount, 0);
  });
});
