/*
 * tlsload — a TLS handshake load generator: every request on a new connection.
 *
 * wrk over https cannot measure handshakes: when a response says
 * "Connection: close" it reconnects with SSL_clear(), which keeps the session,
 * so every connection after a slot's first one is a resumed handshake. tlsload
 * makes each request on a fresh TCP connection and a fresh SSL object, and
 * checks on every connection that the handshake was the kind it asked for:
 *
 *   -m full    no session is offered: a full handshake every time
 *              (SSL_session_reused() must be 0)
 *   -m resume  a first, unmeasured connection obtains a session ticket; every
 *              connection then offers that session (SSL_set_session) and must
 *              resume it (SSL_session_reused() must be 1; each one that does not
 *              is counted in "not_resumed")
 *   -m info    one full handshake, then one offering its session; prints
 *              TLSINFO {json}: protocol, cipher, group, signature, ALPN,
 *              tickets received, status, and whether the second one resumed
 *
 *   tlsload [-m full|resume|info] [-c CONNS] [-d SECONDS] [-t TIMEOUT_S]
 *           [-H "Name: value"]... [-n SNI] [-V 1.2|1.3] PORT PATH
 *
 * The client uses OpenSSL's default cipher suites and groups (those wrk offers
 * too), offers ALPN http/1.1 and SNI (default "localhost"), and does not verify
 * the certificate chain (the bench's answer check does, against its CA); TLS 1.3
 * still makes it verify the server's CertificateVerify signature. Single
 * threaded, nonblocking, epoll, CONNS connections in flight: a connection
 * connects, handshakes, writes one request, reads the whole response
 * (Content-Length), then is closed without close_notify and replaced.
 *
 * At the end it prints one line that bench/run parses, with the fields of
 * bench/lua/report.lua (requests, duration_us, bytes, errors, p50/p99 latency
 * of connect + handshake + request + response) plus the handshake counts.
 *
 * Built by bench/run with `gcc -O2 ... -lssl -lcrypto`. Connects to 127.0.0.1.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/objects.h>
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

enum mode { FULL, RESUME, INFO };
enum state { HANDSHAKE, WRITING, READING };

struct conn {
    int fd;
    SSL *ssl;
    enum state state;
    uint32_t events; /* what epoll waits for now */
    uint64_t started_ns;
    size_t head_len; /* bytes of the response head gathered so far */
    long body_left;  /* -1 until the head is complete */
    int status;
    char head[HEAD_MAX];
};

static enum mode mode = FULL;
static int conns_n = 50;
static double duration_s = 1;
static double timeout_s = 5;
static const char *sni = "localhost";
static int port;
static char request[4096];
static size_t request_len;
static SSL_CTX *ctx;
static SSL_SESSION *session;   /* resume: the session every connection offers */
static int ep = -1; /* none in info mode and while priming: those poll() one connection */
static struct conn *conns;
static char readbuf[READ_BUF];

static uint64_t requests, bytes_read, handshakes, resumed, not_resumed, tickets;
static uint64_t err_connect, err_handshake, err_read, err_write, err_timeout, err_status;
static uint32_t *lat_us;
static size_t lat_n, lat_cap;

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

/* -m info: every ticket the server sends arrives here (client cache mode with
 * no internal store); count it. */
static int on_new_session(SSL *ssl, SSL_SESSION *sess) {
    (void)ssl;
    (void)sess;
    tickets++;
    return 0;
}

static int accept_chain(X509_STORE_CTX *store, void *arg) {
    (void)store;
    (void)arg;
    return 1;
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

static void conn_open(struct conn *c) {
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0)
        die("socket");
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    c->started_ns = now_ns();
    if (connect(c->fd, (struct sockaddr *)&sa, sizeof sa) < 0 && errno != EINPROGRESS) {
        err_connect++;
        close(c->fd);
        c->fd = -1;
        return;
    }
    c->ssl = SSL_new(ctx);
    if (!c->ssl)
        die("SSL_new");
    SSL_set_fd(c->ssl, c->fd);
    SSL_set_connect_state(c->ssl);
    SSL_set_tlsext_host_name(c->ssl, sni);
    if (mode == RESUME && session)
        SSL_set_session(c->ssl, session);
    c->state = HANDSHAKE;
    c->events = 0;
    c->head_len = 0;
    c->body_left = -1;
    c->status = 0;
    set_events(c, EPOLLOUT); /* the connect completes, then the ClientHello leaves */
}

/* A failed SSL call: an error before the handshake finished is a connect error
 * if the TCP connect itself failed, else a handshake error. */
static void conn_fail(struct conn *c, uint64_t *counter) {
    if (c->state == HANDSHAKE) {
        int soerr = 0;
        socklen_t len = sizeof soerr;
        getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &soerr, &len);
        counter = soerr ? &err_connect : &err_handshake;
    }
    (*counter)++;
    ERR_clear_error();
    conn_close(c);
}

/* Parse the response head once "\r\n\r\n" is in c->head: status and
 * Content-Length; leftover bytes count against the body. */
static int parse_head(struct conn *c, size_t end) {
    if (c->head_len < 12 || memcmp(c->head, "HTTP/1.", 7) != 0)
        return -1;
    c->status = atoi(c->head + 9);
    long length = -1;
    char *p = c->head;
    char *stop = c->head + end;
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
static int on_bytes(struct conn *c, const char *buf, size_t n) {
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
    SSL_set_shutdown(c->ssl, SSL_SENT_SHUTDOWN | SSL_RECEIVED_SHUTDOWN);
    requests++;
    if (c->status > 399)
        err_status++;
    record_latency(now_ns() - c->started_ns);
    conn_close(c);
}

/* Advance one connection as far as it goes without blocking. Returns 1 when it
 * finished (answered or failed) and its slot is free. */
static int conn_drive(struct conn *c) {
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
            if (e == SSL_ERROR_WANT_READ) {
                set_events(c, EPOLLIN);
                return 0;
            }
            if (e == SSL_ERROR_WANT_WRITE) {
                set_events(c, EPOLLOUT);
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
        case READING:
            r = SSL_read(c->ssl, readbuf, sizeof readbuf);
            if (r > 0) {
                int done = on_bytes(c, readbuf, (size_t)r);
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

/* One request on one connection, driven to the end with poll() (info mode and
 * priming). Returns its SSL object, still referenced, or NULL if it failed. */
static SSL *one_connection(struct conn *c) {
    uint64_t errs = err_connect + err_handshake + err_read + err_write + err_timeout;
    conn_open(c);
    if (c->fd < 0)
        return NULL;
    SSL *ssl = c->ssl;
    SSL_up_ref(ssl); /* conn_done frees the connection's reference */
    uint64_t deadline = c->started_ns + (uint64_t)(timeout_s * 1e9);
    while (!conn_drive(c)) {
        struct pollfd p = {.fd = c->fd, .events = (short)(c->events & EPOLLOUT ? POLLOUT : POLLIN)};
        uint64_t now = now_ns();
        if (now >= deadline || poll(&p, 1, (int)((deadline - now) / 1000000) + 1) < 0) {
            conn_fail(c, &err_timeout);
            break;
        }
    }
    if (err_connect + err_handshake + err_read + err_write + err_timeout > errs) {
        SSL_free(ssl);
        return NULL;
    }
    return ssl;
}

static void print_errors(const char *what) {
    fprintf(stderr, "tlsload: %s (errors: connect %lu, handshake %lu, read %lu, write %lu, timeout %lu)\n", what,
            (unsigned long)err_connect, (unsigned long)err_handshake, (unsigned long)err_read,
            (unsigned long)err_write, (unsigned long)err_timeout);
}

/* -m info: what a full handshake negotiates, and whether its session resumes. */
static int info(void) {
    struct conn c = {.fd = -1}, d = {.fd = -1};
    SSL *first = one_connection(&c);
    if (!first) {
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
    int sig = 0;
    SSL_get_peer_signature_type_nid(first, &sig);
    printf("TLSINFO {\"protocol\":\"%s\",\"cipher\":\"%s\",\"group\":\"%s\",\"signature_hash\":\"%s\","
           "\"alpn\":\"%.*s\",\"status\":%d,\"tickets\":%lu,",
           SSL_get_version(first), SSL_CIPHER_standard_name(SSL_get_current_cipher(first)),
           gname ? gname : "?", sig ? OBJ_nid2sn(sig) : "?", (int)alpn_len, alpn ? (const char *)alpn : "",
           c.status, (unsigned long)tickets_full);
    SSL_free(first);
    mode = RESUME;
    int resumable = session && SSL_SESSION_is_resumable(session);
    uint64_t resumed0 = resumed;
    SSL *second = resumable ? one_connection(&d) : NULL;
    printf("\"resumable\":%s,\"resumed\":%s,\"tickets_on_resumption\":%lu}\n", resumable ? "true" : "false",
           second && resumed > resumed0 ? "true" : "false", (unsigned long)(tickets - tickets_full));
    if (second)
        SSL_free(second);
    return 0;
}

static void usage(void) {
    fprintf(stderr, "usage: tlsload [-m full|resume|info] [-c CONNS] [-d SECONDS] [-t TIMEOUT_S] "
                    "[-H 'Name: value']... [-n SNI] [-V 1.2|1.3] PORT PATH\n");
    exit(2);
}

int main(int argc, char **argv) {
    const char *headers[MAX_HEADERS];
    int nheaders = 0, opt, version = 0;
    while ((opt = getopt(argc, argv, "m:c:d:t:H:n:V:")) != -1) {
        switch (opt) {
        case 'm':
            mode = strcmp(optarg, "full") == 0     ? FULL
                   : strcmp(optarg, "resume") == 0 ? RESUME
                   : strcmp(optarg, "info") == 0   ? INFO
                                                   : (usage(), FULL);
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
        case 'V': version = strcmp(optarg, "1.2") == 0 ? TLS1_2_VERSION : TLS1_3_VERSION; break;
        default: usage();
        }
    }
    if (argc - optind != 2 || conns_n < 1 || duration_s <= 0)
        usage();
    port = atoi(argv[optind]);
    int n = snprintf(request, sizeof request, "GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n", argv[optind + 1], port);
    for (int i = 0; i < nheaders; i++)
        n += snprintf(request + n, sizeof request - (size_t)n, "%s\r\n", headers[i]);
    n += snprintf(request + n, sizeof request - (size_t)n, "\r\n");
    if (n >= (int)sizeof request)
        usage();
    request_len = (size_t)n;
    signal(SIGPIPE, SIG_IGN);

    ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx)
        die("SSL_CTX_new");
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    if (version) {
        SSL_CTX_set_min_proto_version(ctx, version);
        SSL_CTX_set_max_proto_version(ctx, version);
    }
    /* No chain verification at all: with SSL_VERIFY_NONE alone OpenSSL still
     * runs X509_verify_cert on every handshake (and ignores the result). */
    SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
    SSL_CTX_set_cert_verify_callback(ctx, accept_chain, NULL);
    SSL_CTX_set_alpn_protos(ctx, (const unsigned char *)"\x08http/1.1", 9);
    if (mode == INFO) {
        /* Count tickets. In a load run the client cache stays off: with it on,
         * each ticket received marks the session it replaces not resumable
         * (SSL_CTX_remove_session), the session every connection offers too. */
        SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
        SSL_CTX_sess_set_new_cb(ctx, on_new_session);
        return info();
    }
    if (mode == RESUME) {
        /* Prime: one unmeasured full handshake; its session (with the last
         * ticket it received) is offered by every measured connection. */
        struct conn c = {.fd = -1};
        mode = FULL;
        SSL *first = one_connection(&c);
        mode = RESUME;
        session = first ? SSL_get1_session(first) : NULL;
        if (!session || !SSL_SESSION_is_resumable(session)) {
            print_errors("the priming connection got no resumable session (no ticket?)");
            return 1;
        }
        SSL_free(first);
        requests = bytes_read = handshakes = resumed = not_resumed = 0;
        lat_n = 0;
    }

    ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0)
        die("epoll_create1");
    conns = calloc((size_t)conns_n, sizeof *conns);
    if (!conns)
        die("out of memory");
    struct epoll_event *evs = calloc((size_t)conns_n, sizeof *evs);
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
           "\"handshakes\":%lu,\"resumed\":%lu,\"not_resumed\":%lu}\n",
           (unsigned long)requests, (unsigned long)(elapsed / 1000), (unsigned long)bytes_read,
           (unsigned long)err_connect, (unsigned long)err_handshake, (unsigned long)err_read,
           (unsigned long)err_write, (unsigned long)err_status, (unsigned long)err_timeout,
           percentile(50), percentile(99), lat_n ? lat_us[lat_n - 1] : 0, (unsigned long)handshakes,
           (unsigned long)resumed, (unsigned long)not_resumed);
    return 0;
}
