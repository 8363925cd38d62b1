// Builds dist/esm (ES modules) and dist/cjs (CommonJS), each with its
// declarations, from src/ with tsc; then, for the tests and the demo,
// build/ (src, test and demo/src as ES modules).  Run: npm run build
import { spawnSync } from 'node:child_process';
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const tsc = join(root, 'node_modules', 'typescript', 'bin', 'tsc');

function run(project) {
  const result = spawnSync(process.execPath, [tsc, '-p', join(root, project)], { stdio: 'inherit' });
  if (result.status !== 0) {
    console.error(`build: tsc -p ${project} failed`);
    process.exit(result.status ?? 1);
  }
}

rmSync(join(root, 'dist'), { recursive: true, force: true });
run('tsconfig.build.json');
run('tsconfig.cjs.json');
writeFileSync(join(root, 'dist', 'esm', 'package.json'), '{"type": "module"}\n');
writeFileSync(join(root, 'dist', 'cjs', 'package.json'), '{"type": "commonjs"}\n');
if (!process.argv.includes('--package-only')) {
  rmSync(join(root, 'build'), { recursive: true, force: true });
  mkdirSync(join(root, 'build'), { recursive: true });
  run('tsconfig.dev.json');
}
