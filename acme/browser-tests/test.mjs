// Automatic HTTPS in real headless Chromium. Pebble (Let's Encrypt's test CA) and
// pebble-challtestsrv run on loopback ports; `${TERN_BIN} serve --acme a.test` gets its
// certificate by TLS-ALPN-01; Chromium, resolving a.test to 127.0.0.1 and trusting only the
// keys of Pebble's root and intermediate (--ignore-certificate-errors-spki-list: Chromium has
// no flag to add a root), opens the site over HTTPS and HTTP/2. Without that trust it refuses.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import { createRequire } from 'node:module';
import crypto from 'node:crypto';
import fs from 'node:fs';
import https from 'node:https';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, '..', '..');
// playwright-core is installed once, for the IPv4 Games' browser tests.
const require = createRequire(path.join(repo, 'apps/ipv4-games/browser-tests/package.json'));
const { chromium } = require('playwright-core');
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const TERN = process.env.TERN_BIN || path.join(repo, 'target/release/tern');
const ARGS = ['--headless=new', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync'];

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tern-acme-browser-'));
const children = [];
let log = '';
let ports;
let browser;

// `n` distinct free ports: all held open until each is known, then let go.
async function freePorts(n) {
  const servers = [];
  for (let i = 0; i < n; i++) {
    const s = net.createServer();
    await new Promise((resolve, reject) => { s.on('error', reject); s.listen(0, '127.0.0.1', resolve); });
    servers.push(s);
  }
  const ports = servers.map((s) => s.address().port);
  await Promise.all(servers.map((s) => new Promise((r) => s.close(r))));
  return ports;
}

function start(cmd, args, opts = {}) {
  const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'], ...opts });
  child.stdout.on('data', (d) => { log += d; });
  child.stderr.on('data', (d) => { log += d; });
  children.push(child);
  return child;
}

// GET trusting only `ca` (a Buffer), or plain HTTP.
function get(url, ca) {
  return new Promise((resolve, reject) => {
    const lib = url.startsWith('https:') ? https : http;
    const req = lib.get(url, { agent: false, headers: { 'User-Agent': 'tern-acme-browser-test' }, ...(ca ? { ca } : {}) }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode, body: Buffer.concat(chunks).toString() }));
    });
    req.on('error', reject);
    req.setTimeout(5000, () => req.destroy(new Error(`GET ${url}: no answer`)));
  });
}

async function until(what, f, ms = 60000) {
  const end = Date.now() + ms;
  let last = '';
  for (;;) {
    try { if (await f()) return; } catch (e) { last = String(e); }
    if (Date.now() > end) throw new Error(`${what} not within ${ms / 1000} s (${last}); log:\n${log}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

// base64 SHA-256 of a certificate's SubjectPublicKeyInfo, as Chromium's flag wants it.
function spki(pem) {
  const der = new crypto.X509Certificate(pem).publicKey.export({ type: 'spki', format: 'der' });
  return crypto.createHash('sha256').update(der).digest('base64');
}

before(async () => {
  // Pebble's own HTTPS certificate, from a throwaway PKI; its root is tern's --acme-ca-root.
  const pki = path.join(dir, 'pki');
  execFileSync(path.join(repo, 'scripts', 'tls-test-certs'), [pki], { stdio: ['ignore', 'ignore', 'inherit'] });
  const site = path.join(dir, 'site');
  fs.mkdirSync(site);
  fs.writeFileSync(path.join(site, 'index.html'), '<!doctype html><title>acme</title><p id="page">served with a certificate from the CA</p>\n');
  const [directory, management, dns, dnsManagement, plain, tls] = await freePorts(6);
  ports = { directory, management, plain, tls };
  fs.writeFileSync(path.join(dir, 'pebble.json'), JSON.stringify({ pebble: {
    listenAddress: `127.0.0.1:${directory}`, managementListenAddress: `127.0.0.1:${management}`,
    certificate: path.join(pki, 'leaf-fullchain.pem'), privateKey: path.join(pki, 'leaf.key'),
    httpPort: plain, tlsPort: tls, ocspResponderURL: '', externalAccountBindingRequired: false,
    retryAfter: { authz: 1, order: 1 }, keyAlgorithm: 'ecdsa',
    profiles: { default: { description: '90 days', validityPeriod: 7776000 } },
  } }));
  start('pebble-challtestsrv', ['-dnsserver', `127.0.0.1:${dns}`, '-management', `127.0.0.1:${dnsManagement}`,
    '-defaultIPv6', '', '-http01', '', '-https01', '', '-tlsalpn01', '', '-doh', '']);
  start('pebble', ['-config', path.join(dir, 'pebble.json'), '-dnsserver', `127.0.0.1:${dns}`],
    { env: { ...process.env, PEBBLE_VA_NOSLEEP: '1' } });
  const ca = fs.readFileSync(path.join(pki, 'ca.pem'));
  await until('Pebble', async () => (await get(`https://127.0.0.1:${directory}/dir`, ca)).status === 200, 15000);
  const started = Date.now();
  start(TERN, ['serve', site, '--listen', `127.0.0.1:${plain}`, '--listen-tls', `127.0.0.1:${tls}`,
    '--acme', 'a.test', '--acme-challenge', 'tls-alpn-01', '--acme-state', path.join(dir, 'state'),
    '--acme-directory', `https://127.0.0.1:${directory}/dir`, '--acme-ca-root', path.join(pki, 'ca.pem'),
    '--workers', '2', '--sandbox', 'on']);
  await until('the certificate', async () =>
    (await get(`http://127.0.0.1:${plain}/statusz`)).body.includes('acme_orders{result="valid"}: 1'));
  console.log(`# start to issued certificate: ${Date.now() - started} ms`);
  const root = await get(`https://127.0.0.1:${management}/roots/0`, ca);
  const intermediate = await get(`https://127.0.0.1:${management}/intermediates/0`, ca);
  ports.pins = [spki(root.body), spki(intermediate.body)].join(',');
  browser = await chromium.launch({ executablePath: CHROMIUM, args: ARGS });
});

after(async () => {
  if (browser) await browser.close();
  for (const c of children) c.kill('SIGKILL');
  fs.rmSync(dir, { recursive: true, force: true });
});

async function open(args) {
  const b = await chromium.launch({ executablePath: CHROMIUM, args: [...ARGS, '--host-resolver-rules=MAP a.test 127.0.0.1', ...args] });
  const page = await b.newPage();
  return { b, page };
}

test('Chromium trusting Pebble opens the site over HTTPS and HTTP/2', async () => {
  const { b, page } = await open([`--ignore-certificate-errors-spki-list=${ports.pins}`]);
  try {
    const cdp = await page.context().newCDPSession(page);
    await cdp.send('Network.enable');
    // Every response (the page, and whatever Chromium fetches beside it, such as
    // /favicon.ico, which may or may not have come by the time the page is checked).
    const responses = [];
    cdp.on('Network.responseReceived', (e) =>
      responses.push({ url: e.response.url, protocol: e.response.protocol }));
    const url = `https://a.test:${ports.tls}/`;
    const res = await page.goto(url);
    assert.equal(res.status(), 200);
    assert.equal(await page.textContent('#page'), 'served with a certificate from the CA');
    const sd = await res.securityDetails();
    assert.match(sd.issuer, /Pebble Intermediate/, `issued by Pebble, got ${sd.issuer}`);
    const doc = responses.find((r) => r.url === url);
    assert.equal(doc && doc.protocol, 'h2', `the page came over HTTP/2: ${JSON.stringify(responses)}`);
    assert.ok(responses.every((r) => r.protocol === 'h2'), `all over HTTP/2: ${JSON.stringify(responses)}`);
    console.log(`# ${sd.protocol}, ${doc.protocol}, issuer ${sd.issuer}`);
  } finally {
    await b.close();
  }
});

test('without trusting Pebble, Chromium refuses the certificate', async () => {
  const { b, page } = await open([]);
  try {
    await assert.rejects(page.goto(`https://a.test:${ports.tls}/`), /ERR_CERT_AUTHORITY_INVALID/);
  } finally {
    await b.close();
  }
});
