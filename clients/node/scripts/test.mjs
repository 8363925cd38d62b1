// Runs the compiled tests (build/test/*.test.js, from npm run build) with
// node's test runner, and fails when a test failed or when none ran.
// Needs libpq's environment (PGHOST, PGPORT, PGUSER a superuser) naming a
// server with the extension installed.  Run: npm test
import { spawnSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const dir = join(root, 'build', 'test');
const files = existsSync(dir) ? readdirSync(dir).filter((f) => f.endsWith('.test.js')).sort().map((f) => join(dir, f)) : [];
if (files.length === 0) {
  console.error('test: no compiled tests in build/test (run npm run build first)');
  process.exit(1);
}
const tap = join(tmpdir(), `pg-idempotency-tests-${process.pid}.tap`);
const result = spawnSync(process.execPath, [
  '--test', '--test-reporter=spec', '--test-reporter-destination=stdout',
  '--test-reporter=tap', `--test-reporter-destination=${tap}`, ...files,
], { stdio: 'inherit', cwd: root });
const counts = { tests: 0, pass: 0, fail: 0, skipped: 0, todo: 0, cancelled: 0 };
if (existsSync(tap)) {
  for (const line of readFileSync(tap, 'utf8').split('\n')) {
    const m = /^# (tests|pass|fail|skipped|todo|cancelled) (\d+)$/.exec(line);
    if (m) counts[m[1]] = Number(m[2]);
  }
  rmSync(tap, { force: true });
}
const failed = counts.fail + counts.cancelled;
console.log(`node: ${counts.pass} passed, ${failed} failed, ${counts.skipped + counts.todo} skipped`);
if (result.status !== 0 || failed > 0 || counts.tests === 0 || counts.pass === 0) {
  if (counts.tests === 0) console.error('test: no test ran');
  process.exit(result.status || 1);
}
