// Runs worker.js's search in Node, for gate/src/pages.rs's test:
//   node test-solver.mjs CHALLENGE DIFFICULTY subtle|fallback
// prints the smallest counter found (one worker, step 1), checked against Node's own SHA-256.
import fs from 'node:fs';
import vm from 'node:vm';
import crypto from 'node:crypto';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const [challenge, difficulty, mode] = process.argv.slice(2);
const here = path.dirname(fileURLToPath(import.meta.url));
const context = vm.createContext({ TextEncoder, Uint8Array, Uint32Array, DataView, Math, Promise, String, Date });
vm.runInContext(fs.readFileSync(path.join(here, 'worker.js'), 'utf8'), context);
const subtle = mode === 'subtle' ? crypto.webcrypto.subtle : null;
const digest = vm.runInContext('digester', context)(subtle);
const found = await vm.runInContext('search', context)(challenge, Number(difficulty), 0, 1, digest, () => {});
const check = crypto.createHash('sha256').update(challenge + String(found)).digest();
let bits = 0;
for (const b of check) { if (b === 0) { bits += 8; continue; } bits += Math.clz32(b) - 24; break; }
if (bits < Number(difficulty)) { console.error(`counter ${found} has ${bits} zero bits`); process.exit(1); }
// The pure-JS SHA-256 must equal Node's on inputs of every padding length.
const sha = vm.runInContext('sha256', context);
for (let n = 0; n < 130; n++) {
  const input = crypto.randomBytes(n);
  const ours = Buffer.from(sha(new Uint8Array(input))).toString('hex');
  if (ours !== crypto.createHash('sha256').update(input).digest('hex')) { console.error(`sha256 differs at length ${n}`); process.exit(1); }
}
console.log(String(found));
