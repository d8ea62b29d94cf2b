// A WebSocket echo server (RFC 6455) on node's http 'upgrade' event, as the app behind tern's
// proxy route: it answers the handshake with 101 and echoes every data frame as it came (same
// FIN bit and opcode, so a fragmented message comes back fragmented), unmasked as a server
// sends; a Close is answered with the same payload and ends the connection. No extension is
// accepted (Chromium's permessage-deflate offer goes unanswered), so frames stay as sent.
// It records each handshake's request line and fields, and counts connections, messages and
// bytes, for the test to check what reached the app.
import http from 'node:http';
import crypto from 'node:crypto';

const GUID = '258EAFA5-E914-47DA-95CA-C5AB0DC85B11';

export function acceptFor(key) {
  return crypto.createHash('sha1').update(key + GUID).digest('base64');
}

function frame(first, payload) {
  const n = payload.length;
  let head;
  if (n < 126) {
    head = Buffer.from([first, n]);
  } else if (n < 65536) {
    head = Buffer.alloc(4);
    head[0] = first; head[1] = 126; head.writeUInt16BE(n, 2);
  } else {
    head = Buffer.alloc(10);
    head[0] = first; head[1] = 127; head.writeBigUInt64BE(BigInt(n), 2);
  }
  return Buffer.concat([head, payload]);
}

// One frame from the front of `buf`: { first, payload, used }, or null while incomplete.
function parse(buf) {
  if (buf.length < 2) return null;
  let len = buf[1] & 0x7f;
  let at = 2;
  if (len === 126) {
    if (buf.length < 4) return null;
    len = buf.readUInt16BE(2); at = 4;
  } else if (len === 127) {
    if (buf.length < 10) return null;
    len = Number(buf.readBigUInt64BE(2)); at = 10;
  }
  const masked = (buf[1] & 0x80) !== 0;
  const mask = masked ? buf.subarray(at, at + 4) : null;
  if (masked) at += 4;
  if (buf.length < at + len) return null;
  const payload = Buffer.from(buf.subarray(at, at + len));
  if (mask) for (let i = 0; i < payload.length; i++) payload[i] ^= mask[i % 4];
  return { first: buf[0], payload, used: at + len };
}

// Starts the server on a loopback port; resolves to { port, seen, close() }.
export async function startEcho() {
  const seen = { handshakes: [], connections: 0, frames: 0, bytes: 0, closes: 0 };
  const sockets = new Set();
  const server = http.createServer((req, res) => {
    res.writeHead(426, { 'Content-Type': 'text/plain' });
    res.end('a WebSocket echo: upgrade, please\n');
  });
  server.on('upgrade', (req, socket) => {
    seen.connections++;
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
    seen.handshakes.push({ line: `${req.method} ${req.url} HTTP/${req.httpVersion}`, headers: req.headers });
    const key = req.headers['sec-websocket-key'];
    const upgrade = (req.headers.upgrade || '').toLowerCase();
    if (req.method !== 'GET' || upgrade !== 'websocket' || !key) {
      socket.end('HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n');
      return;
    }
    socket.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n' +
      `Sec-WebSocket-Accept: ${acceptFor(key)}\r\n\r\n`);
    let buf = Buffer.alloc(0);
    socket.on('data', (chunk) => {
      buf = Buffer.concat([buf, chunk]);
      for (let f = parse(buf); f; f = parse(buf)) {
        buf = buf.subarray(f.used);
        const opcode = f.first & 0x0f;
        if (opcode === 0x8) {
          seen.closes++;
          socket.end(frame(f.first, f.payload));
          return;
        }
        if (opcode === 0x9) { // a ping gets its pong
          socket.write(frame(0x8a, f.payload));
          continue;
        }
        if (opcode === 0xa) continue;
        seen.frames++;
        seen.bytes += f.payload.length;
        socket.write(frame(f.first, f.payload));
      }
    });
    socket.on('error', () => {});
  });
  await new Promise((resolve, reject) => { server.on('error', reject); server.listen(0, '127.0.0.1', resolve); });
  return {
    port: server.address().port,
    seen,
    close: () => new Promise((r) => {
      for (const s of sockets) s.destroy();
      server.closeAllConnections();
      server.close(r);
    }),
  };
}
