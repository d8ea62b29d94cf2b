/*
 * tlsload — a TLS handshake load generator: every request on a new connection.
 *
 * wrk over https cannot measure handshakes: when a response says
 * "Connection: close" it reconnects with SSL_clear(), which keeps the session,
 * so every connection after a slot's first one is a resumed handshake. tlsload
 * makes each request on a fresh TCP connection and checks on every connection
 * that the handshake was the kind it asked for:
 *
 *   -m full    no session offered: a full handshake every time (one that
 *              resumes anyway is counted in "resumed", which must stay 0)
 *   -m resume  a first, unmeasured connection obtains a TLS 1.3 session ticket;
 *              every measured connection offers it (psk_dhe_ke) and must
 *              resume (the server's ServerHello selects the PSK); each one that
 *              does not is counted in "not_resumed"
 *   -m info    (OpenSSL engine) one full handshake with OpenSSL's default client
 *              settings, those wrk has, then one offering its session; prints
 *              TLSINFO {json}: protocol, cipher, group, signature, ALPN,
 *              tickets received, status, and whether the second one resumed
 *
 *   tlsload [-m full|resume|info] [-e lean|openssl] [-c CONNS] [-d SECONDS]
 *           [-t TIMEOUT_S] [-H "Name: value"]... [-n SNI] PORT PATH
 *
 * Two engines drive the connections:
 *
 *   lean (default)  a minimal TLS 1.3 client on libcrypto primitives, because an
 *          OpenSSL 3.0 client costs more CPU per full handshake (≈ 400 µs here,
 *          a third of it decoding the server's certificate) than the servers
 *          do, so one client core could not saturate one server core. It
 *          offers exactly TLS 1.3, TLS_AES_128_GCM_SHA256 (the suite every
 *          TLS 1.3 server must implement), x25519 (one key share, generated
 *          once per process and reused: the server still generates its own per
 *          handshake), SNI, ALPN http/1.1, psk_dhe_ke, and signature algorithms
 *          ecdsa_secp256r1_sha256, rsa_pss_rsae_sha256, rsa_pkcs1_sha256,
 *          ed25519. It does not parse the certificate or check the
 *          CertificateVerify signature (a load generator trusts anyone; the
 *          bench's answer check verifies the chain against its CA); it does
 *          check the server's Finished MAC, so the key schedule is right. The
 *          server does all of its usual work.
 *   openssl  libssl with its defaults (as wrk), certificate chain not verified.
 *          For cross-checks: servers spend about the same CPU per handshake
 *          with either engine (a little more with this one, which sends its
 *          Finished and the request apart and cannot keep a server busy).
 *
 * Single threaded, nonblocking, epoll, CONNS connections in flight: a
 * connection connects, handshakes, writes one request (with the client
 * Finished, in one write for the lean engine), reads the whole response
 * (Content-Length), then is closed without close_notify and replaced.
 *
 * At the end it prints one line that bench/run parses, with the fields of
 * bench/lua/report.lua (requests, duration_us, bytes, errors, p50/p99 latency
 * of connect + handshake + request + response) plus the handshake counts.
 *
 * Built by bench/run with `gcc -O2 ... -lssl -lcrypto`. Connects to 127.0.0.1.
 */
#define _GNU_SOURCE
#define OPENSSL_API_COMPAT 0x10100000L /* SHA256_Init & co: no provider lookups per hash */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/objects.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_HEADERS 16
#define HEAD_MAX 8192
#define READ_BUF (64 * 1024)
#define REC_MAX (5 + 16384 + 256)     /* a TLS 1.3 record with its header */
#define HS_MAX 32768                  /* handshake bytes gathered across records */
#define OUT_MAX 8192                  /* ClientHello, or Finished + request */
#define MAX_TICKET 2048

enum mode { FULL, RESUME, INFO };
enum engine { LEAN, OPENSSL };
/* OpenSSL engine: HANDSHAKE, WRITING, READING. Lean engine: the next handshake
 * message expected, then READING. */
enum state { HANDSHAKE, WRITING, READING, WAIT_SH, WAIT_EE, WAIT_CERT, WAIT_CV, WAIT_FIN };

struct aead {
    EVP_CIPHER_CTX *ctx;
    uint8_t iv[12];
    uint64_t seq;
};

struct conn {
    int fd;
    enum state state;
    uint32_t events; /* what epoll waits for now */
    uint64_t started_ns;
    size_t head_len; /* bytes of the response head gathered so far */
    long body_left;  /* -1 until the head is complete */
    int status;
    char head[HEAD_MAX];
    SSL *ssl; /* openssl engine */
    /* lean engine */
    int encrypted, resumed, want_ticket;
    SHA256_CTX transcript;
    uint8_t c_hs[32], s_hs[32], master[32], res_master[32];
    struct aead rd, wr;
    uint8_t *rbuf, *hbuf, *out;
    size_t rlen, hlen, out_len, out_off;
};

static enum mode mode = FULL;
static enum engine engine = LEAN;
static int conns_n = 50;
static double duration_s = 1;
static double timeout_s = 5;
static const char *sni = "localhost";
static int port;
static char request[4096];
static size_t request_len;
static int ep = -1; /* none in info mode and while priming: those poll() one connection */
static struct conn *conns;
static char readbuf[READ_BUF];

static uint64_t requests, bytes_read, handshakes, resumed, not_resumed, tickets;
static uint64_t err_connect, err_handshake, err_read, err_write, err_timeout, err_status;
static uint32_t *lat_us;
static size_t lat_n, lat_cap;

/* openssl engine */
static SSL_CTX *ctx;
static SSL_SESSION *session; /* resume: the session every connection offers */

/* lean engine */
static const EVP_CIPHER *aes128gcm;
static EVP_PKEY *share;          /* our x25519 key share, one per process */
static EVP_PKEY_CTX *share_ctx;  /* derives with it */
static uint8_t share_pub[32];
static uint8_t empty_hash[32];   /* SHA-256("") */
static uint8_t derived_nopsk[32]; /* Derive-Secret(Early Secret without PSK, "derived", "") */
static struct {
    int have;
    uint8_t ticket[MAX_TICKET];
    size_t ticket_len;
    uint32_t age_add;
    uint64_t received_ms;
    uint8_t derived[32];     /* Derive-Secret(Early Secret(PSK), "derived", "") */
    uint8_t binder_key[32];  /* finished key of the "res binder" secret */
} psk;
static uint64_t rng_state;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void die(const char *what) {
    fprintf(stderr, "tlsload: %s", what);
    if (errno)
        fprintf(stderr, ": %s", strerror(errno));
    fputc('\n', stderr);
    ERR_print_errors_fp(stderr);
    exit(2);
}

static void record_latency(uint64_t ns) {
    if (lat_n == lat_cap) {
        lat_cap = lat_cap ? lat_cap * 2 : 65536;
        lat_us = realloc(lat_us, lat_cap * sizeof *lat_us);
        if (!lat_us)
            die("out of memory");
    }
    uint64_t us = ns / 1000;
    lat_us[lat_n++] = us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
}

static void set_events(struct conn *c, uint32_t events) {
    if (c->events == events)
        return;
    if (ep < 0) {
        c->events = events;
        return;
    }
    struct epoll_event ev = {.events = events, .data.ptr = c};
    if (epoll_ctl(ep, c->events ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, c->fd, &ev) < 0)
        die("epoll_ctl");
    c->events = events;
}

static void conn_close(struct conn *c) {
    if (c->ssl)
        SSL_free(c->ssl);
    if (c->fd >= 0)
        close(c->fd); /* no close_notify: the server has answered and closes */
    c->ssl = NULL;
    c->fd = -1;
    c->events = 0;
}

/* A failure: before the handshake finished it is a connect error if the TCP
 * connect itself failed, else a handshake error. */
static void conn_fail(struct conn *c, uint64_t *counter) {
    if (c->state != WRITING && c->state != READING) {
        int soerr = 0;
        socklen_t len = sizeof soerr;
        getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &soerr, &len);
        counter = soerr ? &err_connect : &err_handshake;
    }
    (*counter)++;
    ERR_clear_error();
    conn_close(c);
}

/* ---- the HTTP response ---- */

/* Parse the response head once "\r\n\r\n" is in c->head: status and
 * Content-Length; leftover bytes count against the body. */
static int parse_head(struct conn *c, size_t end) {
    if (c->head_len < 12 || memcmp(c->head, "HTTP/1.", 7) != 0)
        return -1;
    c->status = atoi(c->head + 9);
    long length = -1;
    char *p = c->head;
    char *stop = c->head + end + 2; /* the last line's CRLF included */
    while (p < stop) {
        char *eol = memmem(p, (size_t)(stop - p), "\r\n", 2);
        if (!eol)
            break;
        if (eol - p > 15 && strncasecmp(p, "content-length:", 15) == 0)
            length = strtol(p + 15, NULL, 10);
        p = eol + 2;
    }
    if (length < 0)
        return -1;
    c->body_left = length - (long)(c->head_len - (end + 4));
    return 0;
}

/* Returns 1 when the response is complete, 0 to wait, -1 on error. */
static int on_bytes(struct conn *c, const uint8_t *buf, size_t n) {
    bytes_read += n;
    if (c->body_left >= 0) {
        c->body_left -= (long)n;
        return c->body_left <= 0 ? 1 : 0;
    }
    size_t room = HEAD_MAX - c->head_len;
    size_t take = n < room ? n : room;
    memcpy(c->head + c->head_len, buf, take);
    size_t from = c->head_len > 3 ? c->head_len - 3 : 0;
    c->head_len += take;
    char *end = memmem(c->head + from, c->head_len - from, "\r\n\r\n", 4);
    if (!end)
        return c->head_len == HEAD_MAX ? -1 : 0;
    if (parse_head(c, (size_t)(end - c->head)) < 0)
        return -1;
    c->body_left -= (long)(n - take); /* bytes beyond the head buffer are body */
    return c->body_left <= 0 ? 1 : 0;
}

static void conn_done(struct conn *c) {
    /* Mark it shut down (nothing is sent): SSL_free of a connection that was
     * not shut down removes its session as bad (ssl_clear_bad_session), which
     * marks it not resumable, and in resume mode that is the shared one. */
    if (c->ssl)
        SSL_set_shutdown(c->ssl, SSL_SENT_SHUTDOWN | SSL_RECEIVED_SHUTDOWN);
    requests++;
    if (c->status > 399)
        err_status++;
    record_latency(now_ns() - c->started_ns);
    conn_close(c);
}

/* ---- the lean engine: TLS 1.3 key schedule (RFC 8446 section 7) ---- */

static void hmac(const uint8_t *key, size_t key_len, const uint8_t *a, size_t a_len, const uint8_t *b,
                 size_t b_len, uint8_t out[32]) {
    uint8_t pad[64], inner[32];
    SHA256_CTX h;
    for (int pass = 0; pass < 2; pass++) {
        memset(pad, pass ? 0x5c : 0x36, sizeof pad);
        for (size_t i = 0; i < key_len; i++) /* keys here are ≤ 32 bytes */
            pad[i] ^= key[i];
        SHA256_Init(&h);
        SHA256_Update(&h, pad, sizeof pad);
        if (pass) {
            SHA256_Update(&h, inner, sizeof inner);
            SHA256_Final(out, &h);
        } else {
            SHA256_Update(&h, a, a_len);
            if (b_len)
                SHA256_Update(&h, b, b_len);
            SHA256_Final(inner, &h);
        }
    }
}

static void hkdf_extract(const uint8_t salt[32], const uint8_t *ikm, size_t ikm_len, uint8_t out[32]) {
    hmac(salt, 32, ikm, ikm_len, NULL, 0, out);
}

/* HKDF-Expand-Label(secret, label, context, len), len ≤ 32: one HMAC block. */
static void expand_label(const uint8_t secret[32], const char *label, const uint8_t *context, size_t context_len,
                         uint8_t *out, size_t len) {
    uint8_t info[2 + 1 + 6 + 32 + 1 + 64 + 1], block[32];
    size_t label_len = strlen(label), n = 0;
    info[n++] = 0;
    info[n++] = (uint8_t)len;
    info[n++] = (uint8_t)(6 + label_len);
    memcpy(info + n, "tls13 ", 6);
    n += 6;
    memcpy(info + n, label, label_len);
    n += label_len;
    info[n++] = (uint8_t)context_len;
    memcpy(info + n, context, context_len);
    n += context_len;
    info[n++] = 1;
    hmac(secret, 32, info, n, NULL, 0, block);
    memcpy(out, block, len);
}

static void transcript_hash(const struct conn *c, uint8_t out[32]) {
    SHA256_CTX copy = c->transcript;
    SHA256_Final(out, &copy);
}

static void set_key(struct aead *a, const uint8_t secret[32], int encrypt) {
    uint8_t key[16];
    expand_label(secret, "key", NULL, 0, key, sizeof key);
    expand_label(secret, "iv", NULL, 0, a->iv, sizeof a->iv);
    a->seq = 0;
    if (!EVP_CipherInit_ex2(a->ctx, aes128gcm, key, NULL, encrypt, NULL))
        die("EVP_CipherInit_ex2");
}

static void nonce(struct aead *a, uint8_t out[12]) {
    memcpy(out, a->iv, 12);
    for (int i = 0; i < 8; i++)
        out[11 - i] ^= (uint8_t)(a->seq >> (8 * i));
    a->seq++;
}

/* Append one protected record (inner content type `type`) to c->out. */
static int seal(struct conn *c, uint8_t type, const uint8_t *data, size_t len) {
    size_t total = len + 1 + 16;
    if (c->out_len + 5 + total > OUT_MAX)
        return -1;
    uint8_t *rec = c->out + c->out_len, iv[12];
    rec[0] = 23;
    rec[1] = 3;
    rec[2] = 3;
    rec[3] = (uint8_t)(total >> 8);
    rec[4] = (uint8_t)total;
    memcpy(rec + 5, data, len);
    rec[5 + len] = type;
    nonce(&c->wr, iv);
    int n;
    if (!EVP_CipherInit_ex2(c->wr.ctx, NULL, NULL, iv, 1, NULL) || !EVP_CipherUpdate(c->wr.ctx, NULL, &n, rec, 5) ||
        !EVP_CipherUpdate(c->wr.ctx, rec + 5, &n, rec + 5, (int)len + 1) ||
        !EVP_CipherFinal_ex(c->wr.ctx, rec + 5 + len + 1, &n) ||
        !EVP_CIPHER_CTX_ctrl(c->wr.ctx, EVP_CTRL_AEAD_GET_TAG, 16, rec + 5 + len + 1))
        return -1;
    c->out_len += 5 + total;
    return 0;
}

/* Decrypt a protected record in place; returns the inner content type and sets
 * *len to the plaintext length, or -1. */
static int open_record(struct conn *c, uint8_t *rec, size_t *len) {
    size_t clen = ((size_t)rec[3] << 8 | rec[4]);
    if (clen < 17)
        return -1;
    uint8_t iv[12];
    nonce(&c->rd, iv);
    int n;
    if (!EVP_CipherInit_ex2(c->rd.ctx, NULL, NULL, iv, 0, NULL) || !EVP_CipherUpdate(c->rd.ctx, NULL, &n, rec, 5) ||
        !EVP_CipherUpdate(c->rd.ctx, rec + 5, &n, rec + 5, (int)clen - 16) ||
        !EVP_CIPHER_CTX_ctrl(c->rd.ctx, EVP_CTRL_AEAD_SET_TAG, 16, rec + 5 + clen - 16) ||
        EVP_CipherFinal_ex(c->rd.ctx, rec + 5 + clen - 16, &n) <= 0)
        return -1;
    size_t plen = clen - 16;
    while (plen > 0 && rec[5 + plen - 1] == 0) /* padding */
        plen--;
    if (plen == 0)
        return -1;
    *len = plen - 1;
    return rec[5 + plen - 1];
}

static uint64_t next_random(void) {
    uint64_t x = rng_state; /* xorshift64*: ClientHello randoms need not be secret here */
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    rng_state = x;
    return x * 0x2545F4914F6CDD1DULL;
}

static uint8_t *put16(uint8_t *p, size_t v) {
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
    return p + 2;
}

/* The ClientHello (record and handshake headers included) into c->out; with
 * a PSK, pre_shared_key comes last and its binder covers the rest. */
static void build_client_hello(struct conn *c) {
    uint8_t *rec = c->out, *p = rec + 9; /* record header 5, handshake header 4 */
    size_t sni_len = strlen(sni);
    *p++ = 3;
    *p++ = 3;
    for (int i = 0; i < 4; i++) {
        uint64_t r = next_random();
        memcpy(p, &r, 8);
        p += 8;
    }
    *p++ = 0;                                            /* legacy_session_id: none */
    p = put16(p, 2), *p++ = 0x13, *p++ = 0x01;           /* TLS_AES_128_GCM_SHA256 */
    *p++ = 1, *p++ = 0;                                  /* compression: null */
    uint8_t *ext_len = p;
    p += 2;
    p = put16(p, 0), p = put16(p, sni_len + 5), p = put16(p, sni_len + 3), *p++ = 0; /* server_name */
    p = put16(p, sni_len), memcpy(p, sni, sni_len), p += sni_len;
    p = put16(p, 10), p = put16(p, 4), p = put16(p, 2), p = put16(p, 0x001d); /* supported_groups: x25519 */
    p = put16(p, 13), p = put16(p, 10), p = put16(p, 8);                      /* signature_algorithms */
    p = put16(p, 0x0403), p = put16(p, 0x0804), p = put16(p, 0x0401), p = put16(p, 0x0807);
    p = put16(p, 43), p = put16(p, 3), *p++ = 2, p = put16(p, 0x0304); /* supported_versions: TLS 1.3 */
    p = put16(p, 45), p = put16(p, 2), *p++ = 1, *p++ = 1;             /* psk_key_exchange_modes: psk_dhe_ke */
    p = put16(p, 51), p = put16(p, 38), p = put16(p, 36), p = put16(p, 0x001d), p = put16(p, 32); /* key_share */
    memcpy(p, share_pub, 32), p += 32;
    p = put16(p, 16), p = put16(p, 11), p = put16(p, 9), *p++ = 8, memcpy(p, "http/1.1", 8), p += 8; /* ALPN */
    uint8_t *binder = NULL;
    if (mode == RESUME && psk.have) {
        uint32_t age = (uint32_t)(now_ns() / 1000000 - psk.received_ms) + psk.age_add;
        p = put16(p, 41), p = put16(p, 2 + 2 + psk.ticket_len + 4 + 2 + 33);
        p = put16(p, 2 + psk.ticket_len + 4), p = put16(p, psk.ticket_len);
        memcpy(p, psk.ticket, psk.ticket_len), p += psk.ticket_len;
        *p++ = (uint8_t)(age >> 24), *p++ = (uint8_t)(age >> 16), *p++ = (uint8_t)(age >> 8), *p++ = (uint8_t)age;
        binder = p; /* binders<33>: one 32-byte binder */
        p = put16(p, 33), *p++ = 32, p += 32;
    }
    put16(ext_len, (size_t)(p - ext_len - 2));
    size_t body = (size_t)(p - rec - 9);
    rec[0] = 22, rec[1] = 3, rec[2] = 1;
    put16(rec + 3, body + 4);
    rec[5] = 1, rec[6] = (uint8_t)(body >> 16), rec[7] = (uint8_t)(body >> 8), rec[8] = (uint8_t)body;
    SHA256_Init(&c->transcript);
    if (binder) {
        uint8_t h[32];
        SHA256_Update(&c->transcript, rec + 5, (size_t)(binder - rec - 5)); /* the ClientHello up to the binders */
        transcript_hash(c, h);
        hmac(psk.binder_key, 32, h, 32, NULL, 0, binder + 3);
        SHA256_Update(&c->transcript, binder, 35);
    } else {
        SHA256_Update(&c->transcript, rec + 5, body + 4);
    }
    c->out_len = 5 + 4 + body;
    c->out_off = 0;
}

static int x25519(const uint8_t peer[32], uint8_t out[32]) {
    EVP_PKEY *p = EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, NULL, peer, 32);
    size_t len = 32;
    int ok = p && EVP_PKEY_derive_init(share_ctx) > 0 && EVP_PKEY_derive_set_peer(share_ctx, p) > 0 &&
             EVP_PKEY_derive(share_ctx, out, &len) > 0 && len == 32;
    EVP_PKEY_free(p);
    return ok ? 0 : -1;
}

static const uint8_t hrr_random[32] = {
    0xCF, 0x21, 0xAD, 0x74, 0xE5, 0x9A, 0x61, 0x11, 0xBE, 0x1D, 0x8C, 0x02, 0x1E, 0x65, 0xB8, 0x91,
    0xC2, 0xA2, 0x11, 0x16, 0x7A, 0xBB, 0x8C, 0x5E, 0x07, 0x9E, 0x09, 0xE2, 0xC8, 0xA8, 0x33, 0x9C};

/* ServerHello: x25519 share (and the PSK, if it resumed) -> handshake keys. */
static int on_server_hello(struct conn *c, const uint8_t *m, size_t len) {
    if (len < 38 || memcmp(m + 2, hrr_random, 32) == 0) /* a HelloRetryRequest: not for us */
        return -1;
    size_t i = 34 + 1 + m[34];
    if (i + 5 > len || m[i] != 0x13 || m[i + 1] != 0x01)
        return -1;
    i += 3;
    size_t end = i + 2 + ((size_t)m[i] << 8 | m[i + 1]);
    if (end > len)
        return -1;
    const uint8_t *peer = NULL;
    int version = 0;
    c->resumed = 0;
    for (i += 2; i + 4 <= end;) {
        unsigned type = (unsigned)m[i] << 8 | m[i + 1];
        size_t elen = (size_t)m[i + 2] << 8 | m[i + 3];
        const uint8_t *e = m + i + 4;
        if (i + 4 + elen > end)
            return -1;
        if (type == 43 && elen == 2)
            version = e[0] << 8 | e[1];
        else if (type == 51 && elen == 36 && e[0] == 0 && e[1] == 0x1d && e[3] == 32)
            peer = e + 4;
        else if (type == 41 && elen == 2 && e[0] == 0 && e[1] == 0 && mode == RESUME && psk.have)
            c->resumed = 1;
        i += 4 + elen;
    }
    uint8_t shared[32], secret[32], h[32];
    if (version != 0x0304 || !peer || x25519(peer, shared) < 0)
        return -1;
    hkdf_extract(c->resumed ? psk.derived : derived_nopsk, shared, 32, secret);
    transcript_hash(c, h);
    expand_label(secret, "c hs traffic", h, 32, c->c_hs, 32);
    expand_label(secret, "s hs traffic", h, 32, c->s_hs, 32);
    set_key(&c->rd, c->s_hs, 0);
    set_key(&c->wr, c->c_hs, 1);
    /* the master secret follows from the handshake secret alone */
    uint8_t derived[32], zeros[32] = {0};
    expand_label(secret, "derived", empty_hash, 32, derived, 32);
    hkdf_extract(derived, zeros, 32, c->master);
    c->encrypted = 1;
    return 0;
}

/* The server's Finished: check it, then send ours and the request. */
static int on_server_finished(struct conn *c, const uint8_t *m, size_t len, const uint8_t *msg, size_t msg_len) {
    uint8_t key[32], h[32], mac[32], c_ap[32], s_ap[32];
    expand_label(c->s_hs, "finished", NULL, 0, key, 32);
    transcript_hash(c, h);
    hmac(key, 32, h, 32, NULL, 0, mac);
    if (len != 32 || memcmp(mac, m, 32) != 0)
        return -1;
    SHA256_Update(&c->transcript, msg, msg_len);
    transcript_hash(c, h);
    expand_label(c->master, "c ap traffic", h, 32, c_ap, 32);
    expand_label(c->master, "s ap traffic", h, 32, s_ap, 32);
    uint8_t fin[4 + 32] = {20, 0, 0, 32};
    expand_label(c->c_hs, "finished", NULL, 0, key, 32);
    hmac(key, 32, h, 32, NULL, 0, fin + 4);
    if (c->want_ticket) {
        SHA256_Update(&c->transcript, fin, sizeof fin);
        transcript_hash(c, h);
        expand_label(c->master, "res master", h, 32, c->res_master, 32);
    }
    c->out_len = c->out_off = 0;
    if (seal(c, 22, fin, sizeof fin) < 0)
        return -1;
    set_key(&c->wr, c_ap, 1);
    if (seal(c, 23, (const uint8_t *)request, request_len) < 0)
        return -1;
    set_key(&c->rd, s_ap, 0);
    handshakes++;
    if (c->resumed)
        resumed++;
    else if (mode == RESUME)
        not_resumed++;
    return 0;
}

/* A NewSessionTicket: the priming connection keeps the first one. */
static int on_ticket(struct conn *c, const uint8_t *m, size_t len) {
    tickets++;
    if (!c->want_ticket || psk.have)
        return 0;
    if (len < 9)
        return -1;
    size_t nonce_len = m[8], i = 9 + nonce_len;
    if (i + 2 > len)
        return -1;
    size_t tlen = (size_t)m[i] << 8 | m[i + 1];
    if (i + 2 + tlen > len || tlen > MAX_TICKET || tlen == 0)
        return -1;
    uint8_t secret[32], zeros[32] = {0}, early[32], binder[32];
    expand_label(c->res_master, "resumption", m + 9, nonce_len, secret, 32);
    hkdf_extract(zeros, secret, 32, early);
    expand_label(early, "derived", empty_hash, 32, psk.derived, 32);
    expand_label(early, "res binder", empty_hash, 32, binder, 32);
    expand_label(binder, "finished", NULL, 0, psk.binder_key, 32);
    memcpy(psk.ticket, m + i + 2, tlen);
    psk.ticket_len = tlen;
    psk.age_add = (uint32_t)m[4] << 24 | (uint32_t)m[5] << 16 | (uint32_t)m[6] << 8 | m[7];
    psk.received_ms = now_ns() / 1000000;
    psk.have = 1;
    return 0;
}

/* Whole handshake messages gathered in c->hbuf. Returns -1 on error. */
static int on_handshake(struct conn *c) {
    size_t off = 0;
    int r = 0;
    while (r == 0 && c->hlen - off >= 4) {
        uint8_t *msg = c->hbuf + off;
        size_t len = (size_t)msg[1] << 16 | (size_t)msg[2] << 8 | msg[3];
        if (c->hlen - off < 4 + len)
            break;
        off += 4 + len;
        int type = msg[0];
        switch (c->state) {
        case WAIT_SH:
            if (type != 2)
                return -1;
            SHA256_Update(&c->transcript, msg, 4 + len);
            r = on_server_hello(c, msg + 4, len);
            c->state = WAIT_EE;
            break;
        case WAIT_EE:
            if (type != 8)
                return -1;
            SHA256_Update(&c->transcript, msg, 4 + len);
            c->state = c->resumed ? WAIT_FIN : WAIT_CERT;
            break;
        case WAIT_CERT: /* not parsed: a load generator trusts anyone */
            if (type != 11)
                return -1;
            SHA256_Update(&c->transcript, msg, 4 + len);
            c->state = WAIT_CV;
            break;
        case WAIT_CV: /* not verified, likewise */
            if (type != 15)
                return -1;
            SHA256_Update(&c->transcript, msg, 4 + len);
            c->state = WAIT_FIN;
            break;
        case WAIT_FIN:
            if (type != 20)
                return -1;
            r = on_server_finished(c, msg + 4, len, msg, 4 + len);
            c->state = READING;
            break;
        default:
            if (type != 4) /* only tickets after the handshake */
                return -1;
            r = on_ticket(c, msg + 4, len);
        }
    }
    memmove(c->hbuf, c->hbuf + off, c->hlen - off);
    c->hlen -= off;
    return r;
}

/* Complete records in c->rbuf. Returns 1 when the response is complete, 0 to
 * wait for more, -1 on a TLS error, -2 on a read error (after the handshake). */
static int on_records(struct conn *c) {
    size_t off = 0;
    int r = 0;
    while (r == 0 && c->rlen - off >= 5) {
        uint8_t *rec = c->rbuf + off;
        size_t len = (size_t)rec[3] << 8 | rec[4];
        if (len > REC_MAX - 5)
            return -1;
        if (c->rlen - off < 5 + len)
            break;
        off += 5 + len;
        int type = rec[0];
        const uint8_t *data = rec + 5;
        if (type == 20 && c->state != READING) /* middlebox-compatibility ChangeCipherSpec */
            continue;
        if (c->encrypted) {
            if (type != 23 || (type = open_record(c, rec, &len)) < 0)
                return -1;
        }
        if (type == 22) {
            if (c->hlen + len > HS_MAX)
                return -1;
            memcpy(c->hbuf + c->hlen, data, len);
            c->hlen += len;
            if (on_handshake(c) < 0)
                return -1;
        } else if (type == 23 && c->state == READING) {
            r = on_bytes(c, data, len);
            if (r < 0)
                return -2;
        } else {
            return c->state == READING ? -2 : -1; /* an alert (close_notify too, if early), or junk */
        }
    }
    memmove(c->rbuf, c->rbuf + off, c->rlen - off);
    c->rlen -= off;
    return r;
}

static int lean_drive(struct conn *c);

static void lean_open(struct conn *c) {
    if (!c->rbuf) {
        c->rbuf = malloc(2 * REC_MAX);
        c->hbuf = malloc(HS_MAX);
        c->out = malloc(OUT_MAX);
        c->rd.ctx = EVP_CIPHER_CTX_new();
        c->wr.ctx = EVP_CIPHER_CTX_new();
        if (!c->rbuf || !c->hbuf || !c->out || !c->rd.ctx || !c->wr.ctx)
            die("out of memory");
    }
    c->rlen = c->hlen = 0;
    c->encrypted = c->resumed = 0;
    c->want_ticket = mode != FULL && !psk.have;
    c->state = WAIT_SH;
    build_client_hello(c);
    lean_drive(c); /* on loopback the connect is usually done: the ClientHello leaves now */
}

/* Syscalls are most of the client's cost (its TCP work is the server's too, on
 * loopback), so a connection makes few: the ClientHello is written right after
 * connect, epoll waits for EPOLLIN only unless a write would block, and nothing
 * is read right after a write (the server's answer takes a round trip). */
static int lean_drive(struct conn *c) {
    for (;;) {
        if (c->out_off < c->out_len) {
            ssize_t n = write(c->fd, c->out + c->out_off, c->out_len - c->out_off);
            if (n < 0 && (errno == EAGAIN || errno == ENOTCONN)) {
                set_events(c, EPOLLOUT);
                return 0;
            }
            if (n <= 0) {
                conn_fail(c, &err_write);
                return 1;
            }
            c->out_off += (size_t)n;
            if (c->out_off == c->out_len) {
                set_events(c, EPOLLIN);
                return 0;
            }
            continue;
        }
        ssize_t n = read(c->fd, c->rbuf + c->rlen, 2 * REC_MAX - c->rlen);
        if (n < 0 && errno == EAGAIN) {
            set_events(c, EPOLLIN);
            return 0;
        }
        if (n <= 0) {
            conn_fail(c, &err_read); /* closed before the whole response */
            return 1;
        }
        c->rlen += (size_t)n;
        int r = on_records(c);
        if (r == 1) {
            conn_done(c);
            return 1;
        }
        if (r < 0) {
            conn_fail(c, r == -1 ? &err_handshake : &err_read);
            return 1;
        }
    }
}

static void lean_init(void) {
    aes128gcm = EVP_CIPHER_fetch(NULL, "AES-128-GCM", NULL);
    EVP_PKEY_CTX *kctx = EVP_PKEY_CTX_new_id(EVP_PKEY_X25519, NULL);
    size_t len = 32;
    if (!aes128gcm || !kctx || EVP_PKEY_keygen_init(kctx) <= 0 || EVP_PKEY_keygen(kctx, &share) <= 0 ||
        !EVP_PKEY_get_raw_public_key(share, share_pub, &len) || !(share_ctx = EVP_PKEY_CTX_new(share, NULL)))
        die("libcrypto setup");
    EVP_PKEY_CTX_free(kctx);
    uint8_t zeros[32] = {0}, early[32];
    SHA256((const uint8_t *)"", 0, empty_hash);
    hkdf_extract(zeros, zeros, 32, early);
    expand_label(early, "derived", empty_hash, 32, derived_nopsk, 32);
    if (RAND_bytes((uint8_t *)&rng_state, sizeof rng_state) <= 0 || rng_state == 0)
        rng_state = now_ns() | 1;
}

/* ---- the openssl engine ---- */

/* -m info: every ticket the server sends arrives here (client cache mode with
 * no internal store); count it. */
static int on_new_session(SSL *ssl, SSL_SESSION *sess) {
    (void)ssl;
    (void)sess;
    tickets++;
    return 0;
}

/* No chain verification at all: with SSL_VERIFY_NONE alone OpenSSL still runs
 * X509_verify_cert on every handshake (and ignores the result). */
static int accept_chain(X509_STORE_CTX *store, void *arg) {
    (void)store;
    (void)arg;
    return 1;
}

static void ossl_open(struct conn *c) {
    c->ssl = SSL_new(ctx);
    if (!c->ssl)
        die("SSL_new");
    SSL_set_fd(c->ssl, c->fd);
    SSL_set_connect_state(c->ssl);
    SSL_set_tlsext_host_name(c->ssl, sni);
    if (mode == RESUME && session)
        SSL_set_session(c->ssl, session);
    c->state = HANDSHAKE;
    set_events(c, EPOLLOUT);
}

static int ossl_drive(struct conn *c) {
    for (;;) {
        int r, e;
        switch (c->state) {
        case HANDSHAKE:
            r = SSL_do_handshake(c->ssl);
            if (r == 1) {
                handshakes++;
                if (SSL_session_reused(c->ssl))
                    resumed++;
                else if (mode == RESUME)
                    not_resumed++;
                c->state = WRITING;
                continue;
            }
            e = SSL_get_error(c->ssl, r);
            if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
                set_events(c, e == SSL_ERROR_WANT_WRITE ? EPOLLOUT : EPOLLIN);
                return 0;
            }
            conn_fail(c, &err_handshake);
            return 1;
        case WRITING:
            r = SSL_write(c->ssl, request, (int)request_len);
            if (r > 0) {
                c->state = READING;
                continue;
            }
            e = SSL_get_error(c->ssl, r);
            if (e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ) {
                set_events(c, e == SSL_ERROR_WANT_WRITE ? EPOLLOUT : EPOLLIN);
                return 0;
            }
            conn_fail(c, &err_write);
            return 1;
        default:
            r = SSL_read(c->ssl, readbuf, sizeof readbuf);
            if (r > 0) {
                int done = on_bytes(c, (const uint8_t *)readbuf, (size_t)r);
                if (done < 0) {
                    conn_fail(c, &err_read);
                    return 1;
                }
                if (done) {
                    conn_done(c);
                    return 1;
                }
                continue;
            }
            e = SSL_get_error(c->ssl, r);
            if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
                set_events(c, e == SSL_ERROR_WANT_WRITE ? EPOLLOUT : EPOLLIN);
                return 0;
            }
            conn_fail(c, &err_read); /* closed before the whole response */
            return 1;
        }
    }
}

static void ossl_init(void) {
    ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx)
        die("SSL_CTX_new");
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
    SSL_CTX_set_cert_verify_callback(ctx, accept_chain, NULL);
    SSL_CTX_set_alpn_protos(ctx, (const unsigned char *)"\x08http/1.1", 9);
    if (mode == INFO) {
        /* Count tickets. In a load run the client cache stays off: with it on,
         * each ticket received marks the session it replaces not resumable. */
        SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
        SSL_CTX_sess_set_new_cb(ctx, on_new_session);
    }
}

/* ---- connections, whichever the engine ---- */

static void conn_open(struct conn *c) {
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0)
        die("socket");
    if (engine == OPENSSL) { /* it writes Finished and the request apart: no Nagle wait */
        int one = 1;
        setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    c->started_ns = now_ns();
    if (connect(c->fd, (struct sockaddr *)&sa, sizeof sa) < 0 && errno != EINPROGRESS) {
        err_connect++;
        close(c->fd);
        c->fd = -1;
        return;
    }
    c->events = 0;
    c->head_len = 0;
    c->body_left = -1;
    c->status = 0;
    if (engine == LEAN)
        lean_open(c);
    else
        ossl_open(c);
}

/* Advance one connection as far as it goes without blocking. Returns 1 when it
 * finished (answered or failed) and its slot is free. */
static int conn_drive(struct conn *c) {
    return engine == LEAN ? lean_drive(c) : ossl_drive(c);
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

static uint32_t percentile(double p) {
    if (!lat_n)
        return 0;
    size_t i = (size_t)(p / 100.0 * (double)lat_n);
    return lat_us[i >= lat_n ? lat_n - 1 : i];
}

static uint64_t errors(void) {
    return err_connect + err_handshake + err_read + err_write + err_timeout;
}

/* One request on one connection, driven to the end with poll() (info mode and
 * priming). Returns 0, or -1 if it failed. With the openssl engine *keep gets
 * its SSL object, still referenced. */
static int one_connection(struct conn *c, SSL **keep) {
    uint64_t errs = errors();
    conn_open(c);
    if (c->fd < 0)
        return -1;
    if (keep) {
        *keep = c->ssl;
        SSL_up_ref(c->ssl); /* conn_done frees the connection's reference */
    }
    uint64_t deadline = c->started_ns + (uint64_t)(timeout_s * 1e9);
    while (!conn_drive(c)) {
        struct pollfd p = {.fd = c->fd, .events = (short)(c->events & EPOLLOUT ? POLLOUT : POLLIN)};
        uint64_t now = now_ns();
        if (now >= deadline || poll(&p, 1, (int)((deadline - now) / 1000000) + 1) < 0) {
            conn_fail(c, &err_timeout);
            break;
        }
    }
    if (errors() > errs) {
        if (keep) {
            SSL_free(*keep);
            *keep = NULL;
        }
        return -1;
    }
    return 0;
}

static void print_errors(const char *what) {
    fprintf(stderr, "tlsload: %s (errors: connect %lu, handshake %lu, read %lu, write %lu, timeout %lu)\n", what,
            (unsigned long)err_connect, (unsigned long)err_handshake, (unsigned long)err_read,
            (unsigned long)err_write, (unsigned long)err_timeout);
}

/* -m info: what a full handshake with OpenSSL's defaults negotiates, and
 * whether its session resumes. */
static int info(void) {
    struct conn c = {.fd = -1}, d = {.fd = -1};
    SSL *first = NULL, *second = NULL;
    if (one_connection(&c, &first) < 0) {
        print_errors("the first connection failed");
        return 1;
    }
    uint64_t tickets_full = tickets;
    session = SSL_get1_session(first); /* holds the last ticket received */
    const unsigned char *alpn = NULL;
    unsigned alpn_len = 0;
    SSL_get0_alpn_selected(first, &alpn, &alpn_len);
    int group = SSL_get_negotiated_group(first);
    const char *gname = group ? SSL_group_to_name(first, group) : NULL;
    int sig_type = 0, sig_hash = 0;
    SSL_get_peer_signature_type_nid(first, &sig_type);
    SSL_get_peer_signature_nid(first, &sig_hash);
    EVP_PKEY *key = X509_get0_pubkey(SSL_get0_peer_certificate(first));
    char key_group[64] = "";
    size_t kg_len = 0;
    if (key && !EVP_PKEY_get_group_name(key, key_group, sizeof key_group, &kg_len))
        key_group[0] = 0;
    printf("TLSINFO {\"protocol\":\"%s\",\"cipher\":\"%s\",\"group\":\"%s\",\"signature\":\"%s+%s\","
           "\"key\":\"%s %d %s\",\"alpn\":\"%.*s\",\"status\":%d,\"tickets\":%lu,",
           SSL_get_version(first), SSL_CIPHER_standard_name(SSL_get_current_cipher(first)), gname ? gname : "?",
           sig_type == EVP_PKEY_EC ? "ECDSA" : sig_type ? OBJ_nid2sn(sig_type) : "?",
           sig_hash ? OBJ_nid2sn(sig_hash) : "?", key ? EVP_PKEY_get0_type_name(key) : "?",
           key ? EVP_PKEY_get_bits(key) : 0, key_group, (int)alpn_len, alpn ? (const char *)alpn : "", c.status,
           (unsigned long)tickets_full);
    SSL_free(first);
    mode = RESUME;
    int resumable = session && SSL_SESSION_is_resumable(session);
    uint64_t resumed0 = resumed;
    int ok = resumable && one_connection(&d, &second) == 0;
    printf("\"resumable\":%s,\"resumed\":%s,\"tickets_on_resumption\":%lu}\n", resumable ? "true" : "false",
           ok && resumed > resumed0 ? "true" : "false", (unsigned long)(tickets - tickets_full));
    if (second)
        SSL_free(second);
    return 0;
}

static void usage(void) {
    fprintf(stderr, "usage: tlsload [-m full|resume|info] [-e lean|openssl] [-c CONNS] [-d SECONDS] "
                    "[-t TIMEOUT_S] [-H 'Name: value']... [-n SNI] PORT PATH\n");
    exit(2);
}

int main(int argc, char **argv) {
    const char *headers[MAX_HEADERS];
    int nheaders = 0, opt;
    while ((opt = getopt(argc, argv, "m:e:c:d:t:H:n:")) != -1) {
        switch (opt) {
        case 'm':
            mode = strcmp(optarg, "full") == 0     ? FULL
                   : strcmp(optarg, "resume") == 0 ? RESUME
                   : strcmp(optarg, "info") == 0   ? INFO
                                                   : (usage(), FULL);
            break;
        case 'e':
            engine = strcmp(optarg, "lean") == 0 ? LEAN : strcmp(optarg, "openssl") == 0 ? OPENSSL : (usage(), LEAN);
            break;
        case 'c': conns_n = atoi(optarg); break;
        case 'd': duration_s = atof(optarg); break;
        case 't': timeout_s = atof(optarg); break;
        case 'H':
            if (nheaders == MAX_HEADERS)
                usage();
            headers[nheaders++] = optarg;
            break;
        case 'n': sni = optarg; break;
        default: usage();
        }
    }
    if (argc - optind != 2 || conns_n < 1 || duration_s <= 0 || strlen(sni) > 255)
        usage();
    port = atoi(argv[optind]);
    int n = snprintf(request, sizeof request, "GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n", argv[optind + 1], port);
    for (int i = 0; i < nheaders; i++)
        n += snprintf(request + n, sizeof request - (size_t)n, "%s\r\n", headers[i]);
    n += snprintf(request + n, sizeof request - (size_t)n, "\r\n");
    if (n >= (int)sizeof request - 64)
        usage();
    request_len = (size_t)n;
    signal(SIGPIPE, SIG_IGN);

    if (mode == INFO)
        engine = OPENSSL;
    if (engine == LEAN)
        lean_init();
    else
        ossl_init();
    if (mode == INFO)
        return info();
    if (mode == RESUME) {
        /* Prime: one unmeasured full handshake; its ticket is offered by every
         * measured connection. */
        struct conn c = {.fd = -1};
        SSL *first = NULL;
        int ok = one_connection(&c, engine == OPENSSL ? &first : NULL) == 0;
        if (engine == OPENSSL && first) {
            session = SSL_get1_session(first); /* holds the last ticket received */
            SSL_free(first);
        }
        if (!ok || (engine == LEAN ? !psk.have : !session || !SSL_SESSION_is_resumable(session))) {
            print_errors("the priming connection got no session ticket");
            return 1;
        }
        requests = bytes_read = handshakes = resumed = not_resumed = tickets = 0;
        lat_n = 0;
    }

    ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0)
        die("epoll_create1");
    conns = calloc((size_t)conns_n, sizeof *conns);
    struct epoll_event *evs = calloc((size_t)conns_n, sizeof *evs);
    if (!conns || !evs)
        die("out of memory");
    uint64_t t0 = now_ns();
    uint64_t timeout_ns = (uint64_t)(timeout_s * 1e9);
    uint64_t next_sweep = t0 + 100000000u;
    uint64_t end = t0 + (uint64_t)(duration_s * 1e9);
    for (int i = 0; i < conns_n; i++) {
        conns[i].fd = -1;
        conn_open(&conns[i]);
    }
    for (;;) {
        uint64_t now = now_ns();
        if (now >= end)
            break;
        int wait_ms = (int)((end - now) / 1000000);
        int ready = epoll_wait(ep, evs, conns_n, wait_ms < 100 ? wait_ms + 1 : 100);
        if (ready < 0 && errno != EINTR)
            die("epoll_wait");
        for (int i = 0; i < ready; i++) {
            struct conn *c = evs[i].data.ptr;
            if (c->fd >= 0 && conn_drive(c) && now_ns() < end)
                conn_open(c);
        }
        now = now_ns();
        if (now >= next_sweep) {
            next_sweep = now + 100000000u;
            for (int i = 0; i < conns_n; i++) {
                struct conn *c = &conns[i];
                if (c->fd >= 0 && now - c->started_ns > timeout_ns) {
                    err_timeout++;
                    conn_close(c);
                }
                if (c->fd < 0 && now < end)
                    conn_open(c); /* a slot whose connect failed, or that timed out */
            }
        }
    }
    uint64_t elapsed = now_ns() - t0;
    qsort(lat_us, lat_n, sizeof *lat_us, cmp_u32);
    printf("BENCHJSON {\"requests\":%lu,\"duration_us\":%lu,\"bytes\":%lu,"
           "\"connect\":%lu,\"handshake\":%lu,\"read\":%lu,\"write\":%lu,\"status\":%lu,\"timeout\":%lu,"
           "\"p50_us\":%u,\"p99_us\":%u,\"max_us\":%u,\"wrk_corrected\":0,"
           "\"handshakes\":%lu,\"resumed\":%lu,\"not_resumed\":%lu,\"tickets\":%lu,\"engine\":\"%s\"}\n",
           (unsigned long)requests, (unsigned long)(elapsed / 1000), (unsigned long)bytes_read,
           (unsigned long)err_connect, (unsigned long)err_handshake, (unsigned long)err_read,
           (unsigned long)err_write, (unsigned long)err_status, (unsigned long)err_timeout, percentile(50),
           percentile(99), lat_n ? lat_us[lat_n - 1] : 0, (unsigned long)handshakes, (unsigned long)resumed,
           (unsigned long)not_resumed, (unsigned long)tickets, engine == LEAN ? "lean" : "openssl");
    return 0;
}
