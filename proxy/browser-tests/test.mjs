// WebSocket over HTTP/2 (RFC 8441) in real headless Chromium, through `${TERN_BIN} run`.
//
// tern serves, over HTTPS (a throwaway test PKI from scripts/tls-test-certs; Chromium accepts
// exactly its leaf key through --ignore-certificate-errors-spki-list), a static page and a
// proxy route /ws to an RFC 6455 echo app (ws-echo.mjs, on node's http 'upgrade' event). The
// page opens `new WebSocket('wss://<same host>/ws')`, sends text and binary messages (one of
// 300 KiB: more than HTTP/2's stream windows) one by one and in a burst, gets each echo back
// and closes with 1000. Which protocol carried the WebSocket is shown three ways: tern's
// counter websocket_tunnels_opened{protocol=...} on its /metrics page, Chromium's own view
// through CDP (the handshake answer: 200 on an HTTP/2 stream, 101 for an HTTP/1.1 upgrade),
// and the number of TLS connections tern accepted.
//
// Chromium sends a WebSocket as an extended CONNECT only on an HTTP/2 connection it already
// has to that origin whose SETTINGS carried ENABLE_CONNECT_PROTOCOL; the page's load makes
// that connection. The control runs the same page against a tern with
// `http2_websocket = false`: Chromium then opens an HTTP/1.1 connection for the WebSocket,
// which works the same, and the HTTP/2 tunnel counter stays 0. A WebSocket to another host
// than the page's (wss://127.0.0.1 from a page on localhost) takes HTTP/1.1 too, RFC 8441 on
// or not: Chromium has no HTTP/2 connection to that origin to put it on.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import { createRequire } from 'node:module';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startEcho } from './ws-echo.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, '..', '..');
// playwright-core is installed once, for the IPv4 Games' browser tests.
const require = createRequire(path.join(repo, 'apps/ipv4-games/browser-tests/package.json'));
const { chromium } = require('playwright-core');
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const TERN = process.env.TERN_BIN || path.join(repo, 'target/release/tern');

// What the page sends (and wants back): text (ASCII and not), binary of several sizes.
const PLAN = [
  { text: 'hello' },
  { text: 'héllo, wörld ✓ — 日本語' },
  { text: 'x'.repeat(70000) },
  { binary: 16 },
  { binary: 300 * 1024 },
  { text: 'last' },
];
const BINARY_BYTES = PLAN.reduce((n, m) => n + (m.binary ?? 0), 0);

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tern-ws-browser-'));
let pki;
let echo;
let browser;

function get(url) {
  return new Promise((resolve, reject) => {
    const req = http.get(url, { agent: false }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode, body: Buffer.concat(chunks).toString() }));
    });
    req.on('error', reject);
    req.setTimeout(5000, () => req.destroy(new Error(`GET ${url}: no answer in 5 s`)));
  });
}

// Waits for `f()` to hold, asking again every 50 ms, up to `ms`.
async function until(what, f, ms = 10000) {
  const end = Date.now() + ms;
  let last = '';
  for (;;) {
    try { if (await f()) return; } catch (e) { last = String(e); }
    if (Date.now() > end) throw new Error(`${what}: not within ${ms / 1000} s ${last}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

// A sample of tern's Prometheus page, e.g. 'tern_websocket_tunnels_opened_total{protocol="http2"}'.
function sample(page, series) {
  const line = page.split('\n').find((l) => l.startsWith(series + ' '));
  if (!line) throw new Error(`no ${series} on /metrics:\n${page}`);
  return Number(line.slice(series.length + 1));
}

// Starts `tern run` with the page, /ws and /metrics routes (and `top` keys); resolves to
// { base, log(), metrics(), stop() } once it printed its addresses. The test reads /metrics
// on the plain listener, so tern's TLS handshakes are Chromium's connections.
async function startTern(top) {
  const conf = path.join(dir, `tern-${Date.now()}.toml`);
  fs.writeFileSync(conf, `${top}
[tls]
listen = "127.0.0.1:0"
[[tls.certificates]]
cert = ${JSON.stringify(pki.fullchain)}
key = ${JSON.stringify(pki.key)}

[[site]]
name = "app"
default = true

[[site.route]]
path = "/"
static = ${JSON.stringify(path.join(here, 'site'))}

[[site.route]]
path = "/ws"
proxy = "127.0.0.1:${echo.port}"

[[site.route]]
path = "/metrics"
counters = "metrics"
`);
  const child = spawn(TERN, ['run', '--config', conf, '--listen', '127.0.0.1:0', '--workers', '2', '--sandbox', 'on'],
    { stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  child.stdout.on('data', (d) => { log += d; });
  child.stderr.on('data', (d) => { log += d; });
  const [base, plain] = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`tern run printed no addresses in 30 s:\n${log}`)), 30000);
    const look = () => {
      const m = log.match(/running .* on http:\/\/(127\.0\.0\.1:\d+) and https:\/\/(127\.0\.0\.1:\d+)/);
      if (m) { clearTimeout(timer); resolve([`https://${m[2]}`, `http://${m[1]}`]); }
    };
    child.stdout.on('data', look);
    child.stderr.on('data', look);
    child.on('exit', (code) => reject(new Error(`tern run exited (${code}):\n${log}`)));
  });
  return {
    base,
    log: () => log,
    metrics: async () => (await get(`${plain}/metrics`)).body,
    stop: () => new Promise((r) => { child.on('exit', r); child.kill('SIGTERM'); }),
  };
}

before(async () => {
  const pkiDir = path.join(dir, 'pki');
  execFileSync(path.join(repo, 'scripts', 'tls-test-certs'), [pkiDir], { stdio: ['ignore', 'ignore', 'inherit'] });
  const f = (n) => path.join(pkiDir, n);
  pki = { fullchain: f('leaf-fullchain.pem'), key: f('leaf.key'),
    spki: fs.readFileSync(f('leaf.spki-sha256'), 'utf8').trim() };
  echo = await startEcho();
  browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--headless=new', '--no-sandbox',
    '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync', `--ignore-certificate-errors-spki-list=${pki.spki}`] });
  console.log(`# browser: Chromium ${browser.version()}`);
});

after(async () => {
  if (browser) await browser.close();
  if (echo) await echo.close();
  fs.rmSync(dir, { recursive: true, force: true });
});

// Loads the page in a fresh browser context (no connection shared with another test), runs
// the plan, and returns what the page, CDP and tern's counters saw.
async function runPage(tern, { host, wsUrl } = {}) {
  const context = await browser.newContext();
  try {
    const page = await context.newPage();
    const cdp = await context.newCDPSession(page);
    await cdp.send('Network.enable');
    const responses = [];
    const sockets = [];
    cdp.on('Network.responseReceived', (e) =>
      responses.push({ url: e.response.url, protocol: e.response.protocol }));
    cdp.on('Network.webSocketCreated', (e) => sockets.push({ id: e.requestId, url: e.url }));
    cdp.on('Network.webSocketHandshakeResponseReceived', (e) => {
      const s = sockets.find((x) => x.id === e.requestId);
      if (s) s.handshake = { status: e.response.status, headers: e.response.headers };
    });
    const before = { connections: echo.seen.connections, frames: echo.seen.frames };
    const url = `${host ? tern.base.replace('127.0.0.1', host) : tern.base}/`;
    const res = await page.goto(url);
    assert.equal(res.status(), 200);
    const doc = responses.find((r) => r.url === url);
    assert.equal(doc?.protocol, 'h2', `the page came over HTTP/2: ${JSON.stringify(responses)}`);
    const result = await page.evaluate(([plan, u]) => window.echo(plan, u), [PLAN, wsUrl]);
    return { result, sockets, before };
  } finally {
    await context.close();
  }
}

function checkEchoes(result, tern) {
  const want = [...PLAN.map((m) => `one by one: ${describe(m)} echoed`), ...PLAN.map((m) => `burst: ${describe(m)} echoed`)];
  assert.deepEqual(result.log.filter((l) => !l.startsWith('open ')), want,
    `every message came back: ${JSON.stringify(result.log)}\n${tern.log()}`);
  assert.deepEqual(result.close, { code: 1000, reason: 'done', wasClean: true }, 'a clean close');
}

function describe(m) {
  return m.text !== undefined ? `text of ${m.text.length} characters` : `binary of ${m.binary} bytes`;
}

async function tunnels(tern) {
  const page = await tern.metrics();
  return {
    http1: sample(page, 'tern_websocket_tunnels_opened_total{protocol="http1"}'),
    http2: sample(page, 'tern_websocket_tunnels_opened_total{protocol="http2"}'),
    closed: sample(page, 'tern_websocket_tunnels_closed_total'),
    tls: sample(page, 'tern_tls_handshakes_total'),
    h2: sample(page, 'tern_http2_connections_total'),
  };
}

test('Chromium opens the WebSocket as an extended CONNECT on the page\'s HTTP/2 connection', async () => {
  const tern = await startTern('');
  try {
    const { result, sockets, before } = await runPage(tern);
    checkEchoes(result, tern);
    // Chromium's view: one WebSocket, whose handshake answer was HTTP/2's 200 (an HTTP/1.1
    // upgrade is answered 101).
    assert.equal(sockets.length, 1, JSON.stringify(sockets));
    assert.equal(sockets[0].handshake?.status, 200, `the handshake answer: ${JSON.stringify(sockets)}`);
    // tern's: the tunnel came on an HTTP/2 stream, none by upgrade, and it ended.
    await until('the tunnel counted closed', async () => (await tunnels(tern)).closed === 1);
    const t = await tunnels(tern);
    assert.equal(t.http2, 1, JSON.stringify(t));
    assert.equal(t.http1, 0, JSON.stringify(t));
    // One connection carried the page and the WebSocket.
    assert.equal(t.tls, 1, `Chromium's TLS connections: ${JSON.stringify(t)}`);
    assert.equal(t.h2, 1, JSON.stringify(t));
    // The app's: one HTTP/1.1 handshake (with a key of tern's), every message.
    assert.equal(echo.seen.connections - before.connections, 1);
    const hs = echo.seen.handshakes.at(-1);
    assert.equal(hs.line, 'GET /ws HTTP/1.1');
    assert.equal(hs.headers.upgrade, 'websocket');
    // What an app checks: the page's origin, the scheme the browser used.
    assert.equal(hs.headers.origin, tern.base, JSON.stringify(hs));
    assert.equal(hs.headers['x-forwarded-proto'], 'https', JSON.stringify(hs));
    assert.equal(hs.headers['sec-websocket-version'], '13', JSON.stringify(hs));
    assert.ok(echo.seen.frames - before.frames >= 2 * PLAN.length, `the app echoed ${echo.seen.frames - before.frames} frames`);
    console.log(`# ${result.log[0]}; tunnels ${JSON.stringify(t)}; ${2 * BINARY_BYTES} binary bytes each way`);
  } finally {
    await tern.stop();
  }
});

test('control: with http2_websocket = false Chromium upgrades over HTTP/1.1, through the same tern', async () => {
  const tern = await startTern('http2_websocket = false\n');
  try {
    const { result, sockets, before } = await runPage(tern);
    checkEchoes(result, tern);
    assert.equal(sockets.length, 1, JSON.stringify(sockets));
    assert.equal(sockets[0].handshake?.status, 101, `the handshake answer: ${JSON.stringify(sockets)}`);
    await until('the tunnel counted closed', async () => (await tunnels(tern)).closed === 1);
    const t = await tunnels(tern);
    assert.equal(t.http1, 1, JSON.stringify(t));
    assert.equal(t.http2, 0, JSON.stringify(t));
    // The page's HTTP/2 connection, and one of HTTP/1.1 for the WebSocket.
    assert.equal(t.tls, 2, `Chromium's TLS connections: ${JSON.stringify(t)}`);
    assert.equal(t.h2, 1, JSON.stringify(t));
    assert.equal(echo.seen.connections - before.connections, 1);
    const hs = echo.seen.handshakes.at(-1);
    assert.equal(hs.line, 'GET /ws HTTP/1.1');
    assert.equal(hs.headers.origin, tern.base, JSON.stringify(hs));
    console.log(`# ${result.log[0]}; tunnels ${JSON.stringify(t)}`);
  } finally {
    await tern.stop();
  }
});

test('a WebSocket to another host than the page\'s (no HTTP/2 connection to it yet) takes HTTP/1.1', async () => {
  const tern = await startTern('');
  try {
    // The page from https://localhost:PORT, the WebSocket to wss://127.0.0.1:PORT.
    const { result, sockets } = await runPage(tern, { host: 'localhost', wsUrl: `${tern.base.replace('https:', 'wss:')}/ws` });
    checkEchoes(result, tern);
    await until('the tunnel counted closed', async () => (await tunnels(tern)).closed === 1);
    const t = await tunnels(tern);
    // Chromium's rule (156): RFC 8441 only on an HTTP/2 connection it already has to the
    // WebSocket's origin; else a connection of its own, HTTP/1.1. If a later Chromium opens an
    // HTTP/2 connection for it instead, this fails: update the README's WebSocket notes.
    assert.equal(sockets.length, 1, JSON.stringify(sockets));
    assert.equal(sockets[0].handshake?.status, 101, `the handshake answer: ${JSON.stringify(sockets)}`);
    assert.equal(t.http1, 1, JSON.stringify(t));
    assert.equal(t.http2, 0, JSON.stringify(t));
    assert.equal(t.tls, 2, `Chromium's TLS connections: ${JSON.stringify(t)}`);
    console.log(`# other host: ${result.log[0]}; tunnels ${JSON.stringify(t)}`);
  } finally {
    await tern.stop();
  }
});
