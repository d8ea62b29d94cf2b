// The proof-of-work search, run in Web Workers by challenge.js (and by test-solver.mjs in
// Node). Worker i of n tries counters i, i+n, i+2n, ... and reports the first whose
// SHA-256(challenge + counter) starts with `difficulty` zero bits. Digests are asked for in
// batches, so WebCrypto's promises keep the core busy. It never touches cookies or storage.
'use strict';

function zeroBits(bytes) {
  let bits = 0;
  for (let i = 0; i < bytes.length; i++) {
    const b = bytes[i];
    if (b === 0) { bits += 8; continue; }
    return bits + Math.clz32(b) - 24;
  }
  return bits;
}

// SHA-256 in plain JavaScript, for pages served over plain HTTP to another machine, where
// browsers hide crypto.subtle (it exists only in secure contexts).
const K = new Uint32Array([
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
  0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
]);

function sha256(message) {
  const bitLength = message.length * 8;
  const padded = new Uint8Array(((message.length + 9 + 63) >> 6) << 6);
  padded.set(message);
  padded[message.length] = 0x80;
  const view = new DataView(padded.buffer);
  view.setUint32(padded.length - 4, bitLength >>> 0);
  view.setUint32(padded.length - 8, Math.floor(bitLength / 0x100000000));
  const h = new Uint32Array([
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
  ]);
  const w = new Uint32Array(64);
  for (let off = 0; off < padded.length; off += 64) {
    for (let t = 0; t < 16; t++) w[t] = view.getUint32(off + 4 * t);
    for (let t = 16; t < 64; t++) {
      const a = w[t - 15], b = w[t - 2];
      const s0 = ((a >>> 7) | (a << 25)) ^ ((a >>> 18) | (a << 14)) ^ (a >>> 3);
      const s1 = ((b >>> 17) | (b << 15)) ^ ((b >>> 19) | (b << 13)) ^ (b >>> 10);
      w[t] = (w[t - 16] + s0 + w[t - 7] + s1) | 0;
    }
    let [a, b, c, d, e, f, g, k] = h;
    for (let t = 0; t < 64; t++) {
      const S1 = ((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7));
      const ch = (e & f) ^ (~e & g);
      const t1 = (k + S1 + ch + K[t] + w[t]) | 0;
      const S0 = ((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10));
      const maj = (a & b) ^ (a & c) ^ (b & c);
      const t2 = (S0 + maj) | 0;
      k = g; g = f; f = e; e = (d + t1) | 0; d = c; c = b; b = a; a = (t1 + t2) | 0;
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += k;
  }
  const out = new Uint8Array(32);
  const outView = new DataView(out.buffer);
  for (let i = 0; i < 8; i++) outView.setUint32(4 * i, h[i]);
  return out;
}

function digester(subtle) {
  if (subtle) return (bytes) => subtle.digest('SHA-256', bytes).then((d) => new Uint8Array(d));
  return (bytes) => Promise.resolve(sha256(bytes));
}

// Searches counters start, start + step, ...; `report(n)` after each batch of n tries.
async function search(challenge, difficulty, start, step, digest, report) {
  const prefix = new TextEncoder().encode(challenge);
  const batch = 128;
  for (let counter = start; counter < 2 ** 53; ) {
    const counters = [];
    const pending = [];
    for (let i = 0; i < batch; i++, counter += step) {
      const digits = String(counter);
      const input = new Uint8Array(prefix.length + digits.length);
      input.set(prefix);
      for (let j = 0; j < digits.length; j++) input[prefix.length + j] = digits.charCodeAt(j);
      counters.push(counter);
      pending.push(digest(input));
    }
    const digests = await Promise.all(pending);
    for (let i = 0; i < batch; i++) {
      if (zeroBits(digests[i]) >= difficulty) return counters[i];
    }
    report(batch);
  }
  return -1;
}

if (typeof WorkerGlobalScope !== 'undefined' && self instanceof WorkerGlobalScope) {
  self.onmessage = async (event) => {
    const { challenge, difficulty, start, step } = event.data;
    const subtle = self.crypto && self.crypto.subtle;
    let tried = 0;
    let last = Date.now();
    const found = await search(challenge, difficulty, start, step, digester(subtle), (n) => {
      tried += n;
      const now = Date.now();
      if (now - last >= 250) {
        self.postMessage({ progress: tried });
        tried = 0;
        last = now;
      }
    });
    self.postMessage({ found });
  };
}
