// Real headless-Chromium tests of the IPv4 Games pages against a real server.
//
//   node test.mjs                    plain HTTP pass
//   TERN_TEST_TLS=1 node test.mjs    HTTPS pass (`run` does both)
//
// Server under test, first match wins:
//   TERN_TEST_URL=http://127.0.0.1:PORT   use a server that is already running (nothing is started);
//                                         in the HTTPS pass also TERN_TEST_TLS_DIR=the directory
//                                         scripts/tls-test-certs made for that server's certificate
//   TERN_TEST_MOCK=1                      start ./mock.mjs (the in-memory stand-in)
//   otherwise                             start `${TERN_BIN:-<repo>/target/release/tern} demo
//                                         --listen 127.0.0.1:0 --data <fresh temp dir>`, or in the
//                                         HTTPS pass `... demo --listen-tls 127.0.0.1:0
//                                         --tls-cert leaf-fullchain.pem --tls-key leaf.key ...`
// HTTPS pass: a fresh test CA and ECDSA P-256 leaf for localhost/127.0.0.1 (scripts/tls-test-certs).
// Chromium accepts exactly that leaf key (--ignore-certificate-errors-spki-list=<its SPKI
// SHA-256>), not every certificate; node-side requests trust the test CA. One test checks that
// without the pin Chromium refuses the certificate, and one that the pages really are on https,
// over HTTP/2 (ALPN h2: performance entries' nextHopProtocol, the document's and every resource's).
// Browser: CHROMIUM (default /usr/bin/chromium); no browser is downloaded.
// Screenshots go to ./artifacts/ (git-ignored; https-*.png in the HTTPS pass); their paths are printed.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, '..', '..', '..');
const artifacts = path.join(here, 'artifacts');
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const CHROMIUM_ARGS = ['--headless=new', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync'];

// A name no earlier run used; '+' and '@' check that the pages encode names in URLs.
const NAME = 'pw-' + Date.now().toString(36) + Math.floor(Math.random() * 1e4).toString(36) + '+t@x';
const enc = encodeURIComponent;

const TLS = !!process.env.TERN_TEST_TLS;
const scheme = TLS ? 'https' : 'http';
let pki; // HTTPS pass: { dir, made, ca, fullchain, key, spki }

let base; // http[s]://127.0.0.1:PORT
let server; // child process, when we started one
let serverLog = '';
let dataDir;
let browser;

// ---- the certificate (HTTPS pass) ---------------------------------------------------------------

function loadPki() {
  let dir = process.env.TERN_TEST_TLS_DIR;
  let made = false;
  if (!dir) {
    if (process.env.TERN_TEST_URL) throw new Error('TERN_TEST_URL with TERN_TEST_TLS needs TERN_TEST_TLS_DIR (made by scripts/tls-test-certs) for the server\'s certificate');
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ipv4-games-tls-'));
    made = true;
    execFileSync(path.join(repo, 'scripts', 'tls-test-certs'), [dir], { stdio: ['ignore', 'inherit', 'inherit'] });
  }
  const f = (n) => path.join(dir, n);
  return { dir, made, ca: fs.readFileSync(f('ca.pem')), fullchain: f('leaf-fullchain.pem'), key: f('leaf.key'),
    spki: fs.readFileSync(f('leaf.spki-sha256'), 'utf8').trim() };
}

// GET from node (not the browser): trusts the test CA in the HTTPS pass, nothing else.
function get(url) {
  return new Promise((resolve, reject) => {
    const opts = { agent: false, ...(url.startsWith('https:') ? { ca: pki.ca } : {}) };
    const req = (url.startsWith('https:') ? https : http).get(url, opts, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks), socket: res.socket }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.setTimeout(10000, () => req.destroy(new Error(`GET ${url}: no answer within 10 s`)));
  });
}

// ---- the server ---------------------------------------------------------------------------------

function startServer() {
  let cmd, args;
  const listen = TLS ? ['--listen-tls', '127.0.0.1:0', '--tls-cert', pki.fullchain, '--tls-key', pki.key]
    : ['--listen', '127.0.0.1:0'];
  if (process.env.TERN_TEST_MOCK) {
    cmd = process.execPath;
    args = [path.join(here, 'mock.mjs'), ...listen];
  } else {
    cmd = process.env.TERN_BIN || path.join(repo, 'target', 'release', 'tern');
    dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'ipv4-games-test-'));
    // Sandboxed, as in production (refuses to start without Landlock and seccomp).
    args = ['demo', ...listen, '--data', dataDir, '--sandbox', 'on'];
    if (!fs.existsSync(cmd)) throw new Error(`no tern binary at ${cmd}: build it (cargo build --release -p tern) or set TERN_BIN`);
  }
  const startup = new RegExp(`${scheme}://127\\.0\\.0\\.1:(\\d+)`);
  console.log(`# starting: ${cmd} ${args.join(' ')}`);
  server = spawn(cmd, args, { cwd: repo, stdio: ['ignore', 'pipe', 'pipe'] });
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no start-up line with ${scheme}://127.0.0.1:PORT within 30 s; output:\n${serverLog}`)), 30000);
    const onData = (chunk) => {
      serverLog += chunk;
      if (serverLog.length > 200000) serverLog = serverLog.slice(-100000);
      const m = serverLog.match(startup);
      if (m && !base) {
        clearTimeout(timer);
        resolve(`${scheme}://127.0.0.1:${m[1]}`);
      }
    };
    server.stdout.setEncoding('utf8').on('data', onData);
    server.stderr.setEncoding('utf8').on('data', onData);
    server.on('error', (e) => { clearTimeout(timer); reject(e); });
    server.on('exit', (code, sig) => {
      if (!base) { clearTimeout(timer); reject(new Error(`server exited (${code ?? sig}) before it listened; output:\n${serverLog}`)); }
    });
  });
}

function stopServer() {
  if (server && server.exitCode === null && server.signalCode === null) {
    server.kill('SIGTERM');
    const t = setTimeout(() => server.kill('SIGKILL'), 5000);
    return new Promise((r) => server.once('exit', () => { clearTimeout(t); r(); }));
  }
}

// Whatever happens, never leave the server behind.
process.on('exit', () => {
  if (server && server.exitCode === null && server.signalCode === null) server.kill('SIGKILL');
  if (dataDir) fs.rmSync(dataDir, { recursive: true, force: true });
  if (pki?.made) fs.rmSync(pki.dir, { recursive: true, force: true });
});
for (const s of ['SIGINT', 'SIGTERM']) process.on(s, () => process.exit(130));
// A hung browser or server must not hang the suite: give up after 4 minutes.
setTimeout(() => { console.error('# browser tests: gave up after 240 s'); process.exit(1); }, 240000).unref();

// The HTTPS pass pins the leaf's public key: Chromium accepts that key and still refuses others.
const browserArgs = () => (TLS ? [...CHROMIUM_ARGS, `--ignore-certificate-errors-spki-list=${pki.spki}`] : CHROMIUM_ARGS);

before(async () => {
  fs.mkdirSync(artifacts, { recursive: true });
  if (TLS) pki = loadPki();
  base = process.env.TERN_TEST_URL ? process.env.TERN_TEST_URL.replace(/\/+$/, '') : await startServer();
  console.log(`# server: ${base}`);
  assert.ok(base.startsWith(`${scheme}://`), `the ${TLS ? 'HTTPS' : 'plain'} pass needs a ${scheme}:// server, got ${base}`);
  browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: browserArgs() });
  console.log(`# browser: Chromium ${browser.version()}${TLS ? `, accepting the leaf with SPKI SHA-256 ${pki.spki}` : ''}`);
});

after(async () => {
  if (browser) await browser.close().catch(() => {});
  await stopServer();
  if (dataDir) fs.rmSync(dataDir, { recursive: true, force: true });
});

// ---- pages with error tracking ------------------------------------------------------------------

// Opens a page that records console errors, page errors, failed requests and 4xx/5xx answers.
// `allow(url, status)` may excuse deliberate ones. `problems()` stops recording and returns them.
async function openPage(opts = {}) {
  const context = await browser.newContext({ viewport: opts.viewport || { width: 1280, height: 900 },
    deviceScaleFactor: opts.deviceScaleFactor || 1, isMobile: !!opts.isMobile, hasTouch: !!opts.isMobile });
  const page = await context.newPage();
  const seen = [];
  const requests = [];
  let recording = true;
  const allow = opts.allow || (() => false);
  const note = (s) => { if (recording) seen.push(s); };
  page.on('console', (m) => {
    if (m.type() !== 'error') return;
    // Chromium logs every 4xx/5xx answer as a console error; those are judged by status below.
    if (/Failed to load resource: the server responded with a status of/.test(m.text())) return;
    note(`console error: ${m.text()} (${m.location().url})`);
  });
  page.on('pageerror', (e) => note(`page error: ${e.message}`));
  // A poll still in flight when the page navigates away (a click on a map cell) is cancelled
  // by the browser itself (net::ERR_ABORTED): not a failure of the server's. Those are told
  // apart by the document that sent it being gone: a main-frame document committed after the
  // request started. That is judged when the test ends, not when the request fails: the abort
  // can be reported before the new document's commit is (a poll sent between the navigation's
  // start and its commit raced the old rule).
  let commits = 0;
  const started = new Map();
  const failed = [];
  page.on('framenavigated', (f) => { if (f === page.mainFrame()) commits += 1; });
  page.on('request', (r) => {
    requests.push(r.url());
    started.set(r, commits);
  });
  page.on('requestfailed', (r) => {
    if (recording) failed.push({ r, why: r.failure()?.errorText, at: started.get(r) });
  });
  const judgeFailures = () => {
    for (const { r, why, at } of failed) {
      const leftBehind = why === 'net::ERR_ABORTED' && !r.isNavigationRequest() && at !== undefined && at < commits;
      if (!leftBehind) seen.push(`request failed: ${r.method()} ${r.url()}: ${why}`);
    }
    failed.length = 0;
  };
  page.on('response', (r) => {
    if (r.status() >= 400 && !allow(r.url(), r.status())) note(`HTTP ${r.status()}: ${r.request().method()} ${r.url()}`);
  });
  return {
    page,
    requests,
    problems() { recording = false; judgeFailures(); return seen.slice(); },
    async close() { recording = false; await context.close(); },
  };
}

async function assertClean(p) {
  const problems = p.problems();
  await p.close();
  assert.deepEqual(problems, [], 'console errors or failed requests');
}

async function shot(page, name, fullPage = true) {
  const file = path.join(artifacts, (TLS ? 'https-' : '') + name);
  await page.screenshot({ path: file, fullPage });
  console.log(`# screenshot: ${file}`);
}

const cell = (page, b) => page.locator(`#map .cell[data-block="${b}"]`);

// ---- scenarios ----------------------------------------------------------------------------------

test('static files: pages, scripts, styles and a real /favicon.ico', async () => {
  for (const [p, type] of [['/', 'text/html'], ['/index.html', 'text/html'], ['/user.html', 'text/html'],
    ['/about.html', 'text/html'], ['/style.css', 'text/css'], ['/app.js', 'javascript'],
    ['/index.js', 'javascript'], ['/user.js', 'javascript'], ['/favicon.ico', 'image/'], ['/favicon.svg', 'image/svg']]) {
    const r = await get(base + p);
    assert.equal(r.status, 200, `${p} status`);
    assert.match(r.headers['content-type'] || '', new RegExp(type.replace('/', '\\/')), `${p} content type`);
    assert.ok(r.body.length > 0, `${p} is not empty`);
    if (TLS) assert.equal(r.socket.authorized, true, `${p}: the certificate verified against the test CA`);
  }
});

if (TLS) {
  test('HTTPS: the pages are really served over TLS, every request too', async () => {
    const p = await openPage();
    const { page } = p;
    const resp = await page.goto(base + '/');
    await page.waitForFunction(() => document.getElementById('ip').textContent === '127.0.0.1', null, { timeout: 5000 });
    await page.waitForFunction(() => !/Loading/.test(document.getElementById('score-status').textContent), null, { timeout: 10000 });
    await page.waitForFunction(() => !/Loading/.test(document.getElementById('feed-status').textContent), null, { timeout: 10000 });
    const w = await page.evaluate(() => ({ protocol: location.protocol, secure: window.isSecureContext,
      alpn: performance.getEntriesByType('navigation')[0]?.nextHopProtocol,
      resources: performance.getEntriesByType('resource').map((e) => [e.name, e.initiatorType, e.nextHopProtocol]) }));
    assert.equal(w.protocol, 'https:', 'location.protocol');
    // (127.0.0.1 counts as a secure context over plain HTTP too; protocol and securityDetails are the proof.)
    assert.equal(w.secure, true, 'window.isSecureContext');
    const sd = await resp.securityDetails();
    assert.ok(sd, 'the document came with TLS security details');
    console.log(`# tls: ${sd.protocol}, ALPN ${w.alpn}, certificate ${sd.subjectName} issued by ${sd.issuer}`);
    assert.equal(sd.protocol, 'TLS 1.3', 'Chromium negotiated TLS 1.3');
    assert.equal(sd.subjectName, 'localhost', 'the test leaf was served');
    assert.equal(sd.issuer, 'tern test intermediate CA', 'with its intermediate');
    // HTTP/2 by ALPN: the document and every resource and fetch the page made (scripts, styles,
    // the icon, the API calls) came over h2. (Node's https client above offers no ALPN, so the
    // static-file test keeps HTTP/1.1 over TLS covered.)
    assert.equal(w.alpn, 'h2', 'the document\'s nextHopProtocol (ALPN h2)');
    console.log(`# h2: ${w.resources.length} resources: ${[...new Set(w.resources.map(([, type, proto]) => `${type} ${proto}`))].join(', ')}`);
    assert.ok(w.resources.length >= 4, `the page loaded its resources (${w.resources.length})`);
    assert.deepEqual(w.resources.filter(([, , proto]) => proto !== 'h2'), [], 'resources not fetched over h2');
    assert.ok(p.requests.length >= 5, `the page made its requests (${p.requests.length})`);
    assert.deepEqual(p.requests.filter((u) => !u.startsWith(base + '/')), [], 'every request went to the https origin');
    await assertClean(p);
  });

  if (!process.env.TERN_TEST_MOCK && !process.env.TERN_TEST_URL) {
    test('HTTPS: `tern serve` gives a browser the sample site over HTTP/2', async () => {
      const cmd = process.env.TERN_BIN || path.join(repo, 'target', 'release', 'tern');
      const child = spawn(cmd, ['serve', path.join(repo, 'site'), '--listen-tls', '127.0.0.1:0',
        '--tls-cert', pki.fullchain, '--tls-key', pki.key, '--sandbox', 'on'], { cwd: repo, stdio: ['ignore', 'pipe', 'pipe'] });
      let log = '';
      try {
        const url = await new Promise((resolve, reject) => {
          const timer = setTimeout(() => reject(new Error(`tern serve printed no https:// line in 30 s:\n${log}`)), 30000);
          const onData = (chunk) => {
            log += chunk;
            const m = log.match(/https:\/\/127\.0\.0\.1:(\d+)/);
            if (m) { clearTimeout(timer); resolve(`https://127.0.0.1:${m[1]}`); }
          };
          child.stdout.setEncoding('utf8').on('data', onData);
          child.stderr.setEncoding('utf8').on('data', onData);
          child.on('exit', (code) => { clearTimeout(timer); reject(new Error(`tern serve exited (${code}):\n${log}`)); });
        });
        const p = await openPage();
        const resp = await p.page.goto(url + '/');
        assert.equal(resp.status(), 200, 'the sample site\'s index');
        await p.page.waitForLoadState('load');
        const w = await p.page.evaluate(() => ({
          alpn: performance.getEntriesByType('navigation')[0]?.nextHopProtocol,
          resources: performance.getEntriesByType('resource').map((e) => [e.name, e.nextHopProtocol]) }));
        console.log(`# tern serve: ALPN ${w.alpn}, ${w.resources.length} resources`);
        assert.equal(w.alpn, 'h2', 'the document came over h2');
        assert.ok(w.resources.length >= 1, 'the page loaded its stylesheet and image');
        assert.deepEqual(w.resources.filter(([, proto]) => proto !== 'h2'), [], 'resources not fetched over h2');
        await assertClean(p);
      } finally {
        child.removeAllListeners('exit');
        child.kill('SIGTERM');
      }
    });
  }

  test('HTTPS: without the key pin Chromium refuses the certificate (nothing else is trusted)', async () => {
    const strict = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: CHROMIUM_ARGS });
    try {
      const page = await (await strict.newContext()).newPage();
      await assert.rejects(page.goto(base + '/'), /net::ERR_CERT_AUTHORITY_INVALID/);
    } finally {
      await strict.close();
    }
  });
}

test('index shows your address, a 16×16 map and the claim form', async () => {
  const p = await openPage();
  const { page } = p;
  await page.goto(base + '/');
  await assert.doesNotReject(page.waitForFunction(() => document.getElementById('ip').textContent === '127.0.0.1', null, { timeout: 5000 }),
    'own address 127.0.0.1 shown');
  assert.equal(await page.locator('#map .cell').count(), 256);
  assert.equal(await page.locator('#name').getAttribute('maxlength'), '40');
  assert.ok(await page.locator('#name').getAttribute('pattern'));
  assert.equal(await page.locator('label[for="name"]').count(), 1, 'the name input has a label');
  await page.waitForFunction(() => !/Loading/.test(document.getElementById('score-status').textContent), null, { timeout: 10000 });
  await page.waitForFunction(() => !/Loading/.test(document.getElementById('feed-status').textContent), null, { timeout: 10000 });
  await assertClean(p);
});

test('an invalid name shows the validation message and sends no request', async () => {
  const p = await openPage();
  const { page } = p;
  await page.goto(base + '/');
  for (const [bad, expect] of [['', /enter a name/i], ['bad name', /not allowed: space/i], ['héllo<b>', /not allowed: “é”, “<”, “>”/i]]) {
    await page.fill('#name', bad);
    await page.click('#claim-btn');
    await assert.doesNotReject(page.waitForFunction((re) => new RegExp(re, 'i').test(document.getElementById('claim-msg').textContent),
      expect.source, { timeout: 2000 }), `message for ${JSON.stringify(bad)}`);
    assert.equal(await page.getAttribute('#name', 'aria-invalid'), 'true');
    assert.match(await page.getAttribute('#claim-msg', 'class'), /err/);
  }
  // Typing a valid name clears the error.
  await page.fill('#name', 'fine');
  assert.equal(await page.getAttribute('#name', 'aria-invalid'), null);
  await page.waitForTimeout(300);
  assert.deepEqual(p.requests.filter((u) => new URL(u).pathname.startsWith('/claim')), [], 'no /claim request was made');
  await assertClean(p);
});

test('a claim through the form shows in the feed, on the map and on the leaderboard', async () => {
  const p = await openPage();
  const { page } = p;
  await page.goto(base + '/');
  await page.waitForFunction(() => !/Loading/.test(document.getElementById('feed-status').textContent), null, { timeout: 10000 });
  const t0 = Date.now();
  await page.fill('#name', NAME);
  await page.click('#claim-btn');
  await assert.doesNotReject(page.waitForFunction((n) => document.getElementById('claim-msg').textContent.includes('127.0.0.1 is now claimed by ' + n),
    NAME, { timeout: 10000 }), 'the server\'s answer is shown');
  assert.match(await page.getAttribute('#claim-msg', 'class'), /ok/);
  assert.ok(p.requests.some((u) => u === `${base}/claim?name=${enc(NAME)}`), 'claim request with the encoded name');

  // Live feed, within 5 s, highlighted as new.
  const feedClass = await page.waitForFunction((n) => {
    const li = [...document.querySelectorAll('#feed li')].find((l) => l.querySelector('.who')?.textContent === n);
    return li && li.querySelector('.addr').textContent === '127.0.0.1' && (li.className || 'none');
  }, NAME, { timeout: 5000 }).then((h) => h.jsonValue());
  console.log(`# feed: claim shown after ${Date.now() - t0} ms`);
  assert.equal(feedClass, 'new', 'a new feed item is highlighted');
  assert.equal(await page.locator('#feed li .who', { hasText: NAME }).first().getAttribute('href'), `user.html?name=${enc(NAME)}`);

  // The feed is updated in place: the same <li> survives the next polls (no re-render flicker).
  await page.evaluate(() => { document.querySelector('#feed li').dataset.probe = 'kept'; });
  const before = await page.locator('#feed li').count();
  await page.waitForTimeout(4500);
  assert.equal(await page.evaluate(() => document.querySelector('#feed li').dataset.probe), 'kept', 'feed items are not re-created');
  assert.ok(await page.locator('#feed li').count() >= before);

  // Map: block 127 coloured and titled with the name, within the score rebuild time.
  await assert.doesNotReject(page.waitForFunction((n) => {
    const c = document.querySelector('#map .cell[data-block="127"]');
    return c.title.startsWith('127.0.0.0/8 — ' + n + ' (') && c.style.background !== '';
  }, NAME, { timeout: 15000 }), 'block 127 shows the claim');
  console.log(`# map: block 127 shows the claim after ${Date.now() - t0} ms`);
  assert.equal(await cell(page, 127).getAttribute('href'), `user.html?name=${enc(NAME)}`);
  assert.match(await cell(page, 127).getAttribute('class'), /\bmine\b/, 'own /8 is outlined');

  // Leaderboard.
  const row = page.locator('#lb-body tr', { has: page.locator('a', { hasText: NAME }) });
  await assert.doesNotReject(row.first().waitFor({ timeout: 5000 }), 'leaderboard lists the name');
  assert.equal(await row.first().locator('a').getAttribute('href'), `user.html?name=${enc(NAME)}`);
  const cols = await row.first().locator('td').allTextContents();
  assert.equal(Number(cols[2]), 1, 'count');
  assert.ok(Number(cols[3]) >= 1, 'leads at least block 127');

  // The window selector switches the /score URL; the claim is within the hour.
  await page.check('input[name="window"][value="hour"]');
  await page.waitForURL(/\?window=hour$/);
  await assert.doesNotReject(page.waitForFunction((n) => document.querySelector('#map .cell[data-block="127"]').title.includes('— ' + n + ' ('),
    NAME, { timeout: 15000 }), 'hour window shows the claim');
  assert.ok(p.requests.some((u) => new URL(u).pathname === '/score/hour'), '/score/hour was requested');
  assert.match(await page.textContent('#score-status'), /last hour/);
  await shot(page, 'index.png');

  // Clicking the cell opens the leader's page.
  await cell(page, 127).click();
  await page.waitForURL((u) => u.pathname.endsWith('/user.html') && u.searchParams.get('name') === NAME);
  await page.locator('#player-status', { hasText: 'holds 1 address' }).waitFor({ timeout: 10000 });
  await assertClean(p);
});

test('user.html shows the player\'s /8s and recent claims', async () => {
  const p = await openPage();
  const { page } = p;
  await page.goto(`${base}/user.html?name=${enc(NAME)}`);
  await page.locator('#player-status', { hasText: `${NAME} holds 1 address in 1 /8` }).waitFor({ timeout: 10000 });
  assert.equal(await page.textContent('#player-name'), NAME);
  assert.equal(await page.title(), `${NAME} — IPv4 Games`);
  const c = cell(page, 127);
  assert.match(await c.getAttribute('class'), /\bheld\b/);
  assert.match(await c.getAttribute('title'), new RegExp(`^127\\.0\\.0\\.0/8 — ${NAME.replace(/[+.]/g, '\\$&')} \\(1\\)`));
  assert.match(await c.textContent(), /1$/);
  assert.equal(await page.locator('#map .cell.held').count(), 1, 'only block 127 is highlighted');
  assert.equal(await page.locator('#recent li .addr').first().textContent(), '127.0.0.1');
  assert.equal(await page.locator('a.back').getAttribute('href'), './');
  await shot(page, 'user.png');
  await assertClean(p);
});

test('user.html with an unknown, an invalid or no name', async () => {
  let p = await openPage();
  await p.page.goto(`${base}/user.html?name=nobody-${Date.now().toString(36)}`);
  await p.page.locator('#player-status', { hasText: 'holds no addresses yet' }).waitFor({ timeout: 10000 });
  assert.equal(await p.page.locator('#map .cell.held').count(), 0);
  await assertClean(p);

  p = await openPage();
  await p.page.goto(`${base}/user.html?name=${enc('no spaces<allowed>')}`);
  await p.page.locator('#player-status', { hasText: 'not a valid name' }).waitFor({ timeout: 5000 });
  assert.equal(await p.page.isVisible('#lookup'), true);
  assert.deepEqual(p.requests.filter((u) => new URL(u).pathname.startsWith('/player')), [], 'no /player request');
  await assertClean(p);

  p = await openPage();
  await p.page.goto(`${base}/user.html`);
  await p.page.locator('#player-status', { hasText: 'Enter a name' }).waitFor({ timeout: 5000 });
  await p.page.fill('#lookup-name', NAME);
  await p.page.click('#lookup button');
  await p.page.locator('#player-status', { hasText: 'holds 1 address' }).waitFor({ timeout: 10000 });
  await assertClean(p);
});

test('about.html loads with the rules and the API', async () => {
  const p = await openPage();
  const { page } = p;
  await page.goto(`${base}/about.html`);
  assert.equal(await page.title(), 'About — IPv4 Games');
  const text = await page.textContent('main');
  for (const s of ['Rules', '1–40 characters', 'GET /claim', 'GET /score', 'GET /player/NAME', 'SQLite', 'group commit', 'on disk']) {
    assert.ok(text.includes(s), `about mentions ${s}`);
  }
  await page.click('a.back');
  await page.waitForURL(`${base}/`);
  await page.waitForFunction(() => document.getElementById('ip').textContent === '127.0.0.1', null, { timeout: 5000 });
  await assertClean(p);
});

test('on a phone-sized screen the board fits without sideways scrolling', async () => {
  const p = await openPage({ viewport: { width: 360, height: 740 }, deviceScaleFactor: 2, isMobile: true });
  const { page } = p;
  await page.goto(base + '/');
  await page.waitForFunction((n) => document.querySelector('#map .cell[data-block="127"]').title.includes('— ' + n + ' ('), NAME, { timeout: 15000 });
  const { sw, cw, cellW } = await page.evaluate(() => ({
    sw: document.documentElement.scrollWidth, cw: document.documentElement.clientWidth,
    cellW: document.querySelector('#map .cell').getBoundingClientRect().width,
  }));
  assert.ok(sw <= cw, `page is ${sw}px wide in a ${cw}px viewport`);
  assert.ok(cellW >= 16, `map cells are ${cellW}px wide`);
  await shot(page, 'index-mobile.png');
  await assertClean(p);
});
