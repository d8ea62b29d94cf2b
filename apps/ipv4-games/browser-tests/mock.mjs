// A throwaway stand-in for `tern demo`: implements the IPv4 Games API contract with in-memory
// data and serves ../site, so the pages and tests can be developed before the real server exists.
//   node mock.mjs [--listen 127.0.0.1:0] [--seed N]
//   node mock.mjs --listen-tls 127.0.0.1:0 --tls-cert FULLCHAIN.pem --tls-key KEY.pem [--seed N]
// Prints "mock: IPv4 Games on http[s]://127.0.0.1:PORT" once listening (same shape as tern's line).
import http from 'node:http';
import https from 'node:https';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const args = process.argv.slice(2);
const opt = (k, d) => { const i = args.indexOf(k); return i >= 0 ? args[i + 1] : d; };
const tls = args.includes('--listen-tls');
const [host, port] = (tls ? opt('--listen-tls') : opt('--listen', '127.0.0.1:0')).split(':');
const site = path.resolve(opt('--site', path.join(here, '..', 'site')));
const NAME_RE = /^[A-Za-z0-9@\/:.^+!\-_*]{1,40}$/;
const WINDOWS = { all: Infinity, hour: 3600, day: 86400, week: 7 * 86400, month: 30 * 86400 };

const owners = new Map(); // ip -> {name, time}
const history = []; // every claim, oldest first
const now = () => Math.floor(Date.now() / 1000);

function claim(ip, name, time = now()) {
  const cur = owners.get(ip);
  if (cur && cur.name === name && time - cur.time < 3600) return; // same name: refresh after an hour
  owners.set(ip, { name, time });
  history.push({ ip, name, time });
}

// Random seed data, for looking at a full board.
const seed = Number(opt('--seed', '0'));
const names = ['alice', 'bob', 'carol', 'dave', 'eve', 'mallory', 'trent', 'peggy', 'victor', 'walter', 'x^2+y!', 'me@home', 'a/b:c.d'];
for (let i = 0; i < seed; i++) {
  const b = Math.floor(Math.random() ** 1.5 * 224);
  const ip = `${b}.${(Math.random() * 256) | 0}.${(Math.random() * 256) | 0}.${(Math.random() * 256) | 0}`;
  claim(ip, names[Math.floor(Math.random() ** 2 * names.length)], now() - Math.floor(Math.random() * 40 * 86400));
}
history.sort((a, b) => a.time - b.time);

function buildScore(window) {
  const since = now() - WINDOWS[window];
  const perBlock = new Map(); // block -> Map(name -> count)
  const perName = new Map();
  let total = 0;
  for (const [ip, { name, time }] of owners) {
    if (time < since) continue;
    total++;
    const b = Number(ip.split('.')[0]);
    if (!perBlock.has(b)) perBlock.set(b, new Map());
    const m = perBlock.get(b);
    m.set(name, (m.get(name) || 0) + 1);
    perName.set(name, (perName.get(name) || 0) + 1);
  }
  const byCount = (a, b) => b.count - a.count || (a.name < b.name ? -1 : 1);
  const led = new Map();
  const blocks = [...perBlock.keys()].sort((a, b) => a - b).map((block) => {
    const leaders = [...perBlock.get(block)].map(([name, count]) => ({ name, count })).sort(byCount);
    led.set(leaders[0].name, (led.get(leaders[0].name) || 0) + 1);
    return { block, total: leaders.reduce((s, l) => s + l.count, 0), leaders: leaders.slice(0, 5) };
  });
  const leaderboard = [...perName].map(([name, count]) => ({ name, count, blocks: led.get(name) || 0 }))
    .sort(byCount).slice(0, 50);
  return { window, generated: now(), total, blocks, leaderboard };
}

// Scores are rebuilt on a schedule, like the real server's: a claim shows up a little later.
const scores = {};
const rebuild = () => { for (const w of Object.keys(WINDOWS)) scores[w] = JSON.stringify(buildScore(w)); };
rebuild();
setInterval(rebuild, 2000).unref();

const TYPES = { '.html': 'text/html; charset=utf-8', '.css': 'text/css; charset=utf-8', '.js': 'application/javascript; charset=utf-8',
  '.svg': 'image/svg+xml', '.ico': 'image/x-icon', '.png': 'image/png', '.txt': 'text/plain; charset=utf-8' };
const GIF = Buffer.from('R0lGODlhAQABAIAAAAAAAP///yH5BAEAAAAALAAAAAABAAEAAAIBRAA7', 'base64');

function send(res, status, type, body, extra = {}) {
  res.writeHead(status, { 'Content-Type': type, 'Cache-Control': 'no-store', ...extra });
  res.end(body);
}
const json = (res, v) => send(res, 200, 'application/json', typeof v === 'string' ? v : JSON.stringify(v));
const text = (res, status, t) => send(res, status, 'text/plain; charset=utf-8', t + '\n');

const handler = (req, res) => {
  const url = new URL(req.url, 'http://x');
  const p = url.pathname;
  const ip = (req.socket.remoteAddress || '').replace(/^::ffff:/, '');
  if (p === '/ip') {
    return /^\d+\.\d+\.\d+\.\d+$/.test(ip) ? text(res, 200, ip) : text(res, 400, 'IPv4 only');
  }
  if (p === '/claim' || p.startsWith('/claim/')) {
    let name = p === '/claim' ? url.searchParams.get('name') || '' : p.slice(7);
    try { if (p !== '/claim') name = decodeURIComponent(name); } catch { name = ''; }
    if (!NAME_RE.test(name)) return text(res, 400, 'bad name: 1-40 of A-Z a-z 0-9 @/:.^+!-_*');
    claim(ip, name);
    const accept = req.headers.accept || '';
    if (accept.includes('text/plain')) return text(res, 200, `${ip} is now claimed by ${name}`);
    if (/^image\//.test(accept)) return send(res, 200, 'image/gif', GIF);
    return send(res, 200, 'text/html; charset=utf-8', `<!doctype html><title>Claimed</title><p>${ip} is now claimed by ${name.replace(/[<>&]/g, '')}. <a href="/">Back</a>`);
  }
  if (p === '/recent') {
    return json(res, { generated: now(), claims: history.slice(-50).reverse() });
  }
  const sm = p.match(/^\/score(?:\/(hour|day|week|month))?$/);
  if (sm) return json(res, scores[sm[1] || 'all']);
  if (p.startsWith('/player/')) {
    let name;
    try { name = decodeURIComponent(p.slice(8)); } catch { name = ''; }
    if (!NAME_RE.test(name)) return text(res, 400, 'bad name');
    const counts = new Map();
    let total = 0;
    for (const [addr, o] of owners) {
      if (o.name !== name) continue;
      total++;
      const b = Number(addr.split('.')[0]);
      counts.set(b, (counts.get(b) || 0) + 1);
    }
    const recent = history.filter((c) => c.name === name && owners.get(c.ip)?.name === name)
      .slice(-50).reverse().map(({ ip, time }) => ({ ip, time }));
    const blocks = [...counts].sort((a, b) => a[0] - b[0]).map(([block, count]) => ({ block, count }));
    return json(res, { name, total, blocks, recent });
  }
  if (p === '/statusz') return text(res, 200, `claims: ${history.length}\naddresses: ${owners.size}`);
  // static files
  const rel = p === '/' ? 'index.html' : decodeURIComponent(p).replace(/^\/+/, '');
  const file = path.join(site, rel);
  if (!file.startsWith(site + path.sep)) return text(res, 404, 'not found');
  fs.readFile(file, (err, data) => {
    if (err) return text(res, 404, 'not found');
    send(res, 200, TYPES[path.extname(file)] || 'application/octet-stream', data);
  });
};
const server = tls
  ? https.createServer({ cert: fs.readFileSync(opt('--tls-cert')), key: fs.readFileSync(opt('--tls-key')),
    minVersion: 'TLSv1.2', ALPNProtocols: ['http/1.1'] }, handler)
  : http.createServer(handler);

server.listen(Number(port), host, () => {
  console.log(`mock: IPv4 Games on ${tls ? 'https' : 'http'}://${host}:${server.address().port}`);
});
for (const s of ['SIGINT', 'SIGTERM']) process.on(s, () => process.exit(0));
