// The gateway in real headless Chromium: a guarded page, its proof of work solved by the
// page's Web Workers, and the page itself after; two tabs solving at once; a browser without
// JavaScript following the time-lock; the page's accessibility hooks. Against
// `${TERN_BIN} serve <site> --gate <config>` with the shipped default policy.
// Screenshots go to ./artifacts/ (git-ignored).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, '..', '..');
// playwright-core is installed once, for the IPv4 Games' browser tests.
const require = createRequire(path.join(repo, 'apps/ipv4-games/browser-tests/package.json'));
const { chromium } = require('playwright-core');
const artifacts = path.join(here, 'artifacts');
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const TERN = process.env.TERN_BIN || path.join(repo, 'target/release/tern');

let server;
let base;
let browser;
let log = '';
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tern-gate-browser-'));

before(async () => {
  fs.mkdirSync(artifacts, { recursive: true });
  const site = path.join(dir, 'site');
  fs.mkdirSync(site);
  for (const name of ['index', 'a', 'b']) {
    fs.writeFileSync(path.join(site, `${name}.html`), `<!doctype html><title>${name}</title><p id="page">page ${name}</p>\n`);
  }
  fs.writeFileSync(path.join(dir, 'gate.toml'), 'keyring = "gate.keys"\n');
  server = spawn(TERN, ['serve', site, '--gate', path.join(dir, 'gate.toml'), '--listen', '127.0.0.1:0', '--workers', '2', '--sandbox', 'on'],
    { stdio: ['ignore', 'pipe', 'pipe'] });
  server.stderr.on('data', (d) => { log += d; });
  base = await new Promise((resolve, reject) => {
    let out = '';
    server.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/http:\/\/(127\.0\.0\.1:\d+)/);
      if (m) resolve(`http://${m[1]}`);
    });
    server.on('exit', (code) => reject(new Error(`tern exited ${code}: ${log}`)));
  });
  browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--headless=new', '--no-sandbox', '--disable-gpu', '--no-first-run'] });
});

after(async () => {
  if (browser) await browser.close();
  if (server) server.kill('SIGKILL');
  fs.rmSync(dir, { recursive: true, force: true });
});

async function shot(page, name) {
  const file = path.join(artifacts, `${name}.png`);
  await page.screenshot({ path: file, fullPage: true });
  console.log(`# screenshot ${file}`);
}

test('a browser solves the proof of work and lands on the page it asked for', async () => {
  const context = await browser.newContext();
  // The work takes well under a second here: hold the worker script back a moment, so the
  // screenshot shows the challenge page, not the page after it.
  await context.route('**/worker.js', async (route) => {
    await new Promise((r) => setTimeout(r, 1500));
    await route.continue();
  });
  const page = await context.newPage();
  const started = Date.now();
  const response = await page.goto(`${base}/index.html?from=test`, { waitUntil: 'domcontentloaded' });
  assert.equal(response.status(), 403, 'the challenge stands in for the page');
  const status = page.locator('#status');
  assert.equal(await status.getAttribute('role'), 'status');
  assert.equal(await status.getAttribute('aria-live'), 'polite');
  await page.waitForTimeout(300);
  await shot(page, 'gate-challenge');
  await page.waitForURL(`${base}/index.html?from=test`, { timeout: 60_000, waitUntil: 'load' });
  await page.locator('#page').waitFor({ timeout: 60_000 });
  assert.equal(await page.locator('#page').textContent(), 'page index');
  console.log(`# solved and landed in ${Date.now() - started} ms (1500 ms of it the held-back worker script)`);
  await shot(page, 'gate-passed');
  const cookies = await context.cookies();
  const gate = cookies.find((c) => c.name === 'tern_gate');
  assert.ok(gate, 'a session cookie');
  assert.equal(gate.httpOnly, true);
  assert.equal(gate.sameSite, 'Lax');
  // The session holds: the next page comes at once, no challenge.
  const next = await page.goto(`${base}/a.html`);
  assert.equal(next.status(), 200);
  await context.close();
});

test('two tabs solving at once both succeed', async () => {
  const context = await browser.newContext();
  const [one, two] = await Promise.all([context.newPage(), context.newPage()]);
  await Promise.all([
    one.goto(`${base}/a.html`, { waitUntil: 'domcontentloaded' }),
    two.goto(`${base}/b.html`, { waitUntil: 'domcontentloaded' }),
  ]);
  await Promise.all([
    one.locator('#page').waitFor({ timeout: 60_000 }),
    two.locator('#page').waitFor({ timeout: 60_000 }),
  ]);
  assert.equal(await one.locator('#page').textContent(), 'page a');
  assert.equal(await two.locator('#page').textContent(), 'page b');
  await context.close();
});

test('without JavaScript, a non-browser client follows the time-lock', async () => {
  // The default policy gives HTTP libraries a short wait rather than a proof of work.
  const context = await browser.newContext({ javaScriptEnabled: false, userAgent: 'python-requests/2.31' });
  const page = await context.newPage();
  const started = Date.now();
  const first = await page.goto(`${base}/b.html`, { waitUntil: 'domcontentloaded' });
  assert.equal(first.status(), 403);
  await shot(page, 'gate-timelock');
  await page.locator('#page').waitFor({ timeout: 30_000 });
  assert.equal(await page.locator('#page').textContent(), 'page b');
  assert.ok(Date.now() - started >= 2500, 'it waited');
  await context.close();
});

test('a browser without JavaScript is told what to do', async () => {
  const context = await browser.newContext({ javaScriptEnabled: false });
  const page = await context.newPage();
  await page.goto(`${base}/a.html`);
  const text = await page.locator('noscript, .error').first().textContent();
  assert.match(text, /JavaScript/);
  await context.close();
});
