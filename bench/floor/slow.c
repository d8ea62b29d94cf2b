/*
 * slow — a slow app: every answer comes DELAY_MS after its request arrived, however many
 * requests are waiting (bench/proxy's `spike`: a cache in front of an app that takes 50 ms
 * a page).
 *
 *   slow PORT DELAY_MS LOG_FILE
 *
 * One thread, epoll, keep-alive. Each connection has at most one request waiting; since
 * every request waits the same DELAY_MS, the waiting ones form a FIFO in order of their due
 * time, and the loop sleeps in epoll_wait until the oldest is due. So any number of
 * concurrent connections wait in parallel: the app is slow, not a bottleneck.
 *
 * The answer is a small HTML page with the current Date (a cache counts an answer's age
 * from it), no Cache-Control, no validators. Each request is logged when it arrives to
 * LOG_FILE as "SECONDS PATH\n", SECONDS from CLOCK_MONOTONIC (Python's time.monotonic()),
 * so the bench can count what reached the app per key and when.
 *
 * Requests are GETs without bodies (what a proxy sends for a page): a request ends at its
 * "\r\n\r\n". Built by bench/proxy with `gcc -O2`. Listens on 127.0.0.1 only.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define IN_BUF 8192
#define MAX_EVENTS 512

struct conn {
    uint32_t gen;      /* bumped when the descriptor is closed: a queued entry of an earlier
                          connection on the same number is told apart */
    uint8_t waiting;   /* a request of this connection is in the queue */
    uint32_t in_len;   /* bytes read and not yet taken as a request */
    char *in;          /* IN_BUF bytes, allocated at the first read */
    uint8_t out_armed; /* EPOLLOUT asked for: a short write left some of the answer */
    char *out;         /* the answer being sent */
    size_t out_len, out_off;
};

struct due {
    double at; /* CLOCK_MONOTONIC seconds */
    int fd;
    uint32_t gen;
};

static struct conn *conns;
static rlim_t max_fd;
static struct due *queue; /* ring of q_cap entries: one per waiting connection, and those of
                             connections closed while waiting, until they fall due */
static size_t q_cap, q_head, q_len;
static int ep, log_fd;
static double delay;

static void die(const char *what) {
    perror(what);
    exit(1);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void drop(int fd) {
    struct conn *c = &conns[fd];
    free(c->in);
    free(c->out);
    uint32_t gen = c->gen + 1;
    memset(c, 0, sizeof *c);
    c->gen = gen;
    close(fd);
}

/* If a whole request is in the buffer and none is waiting: log it and queue its answer. */
static void take_request(int fd) {
    struct conn *c = &conns[fd];
    if (c->waiting || c->in_len == 0)
        return;
    if (q_len == q_cap) { /* only a storm of connections closed while waiting fills it */
        drop(fd);
        return;
    }
    char *end = memmem(c->in, c->in_len, "\r\n\r\n", 4);
    if (!end)
        return;
    /* "GET /path HTTP/1.1": the path is between the first two spaces */
    char *sp1 = memchr(c->in, ' ', (size_t)(end - c->in));
    char *sp2 = sp1 ? memchr(sp1 + 1, ' ', (size_t)(end - sp1 - 1)) : NULL;
    double t = now();
    char line[600];
    int path_len = sp2 ? (int)(sp2 - sp1 - 1) : 1;
    if (path_len > 500)
        path_len = 500;
    int n = snprintf(line, sizeof line, "%.6f %.*s\n", t, path_len, sp2 ? sp1 + 1 : "?");
    if (write(log_fd, line, (size_t)n) != n)
        die("write log");
    size_t used = (size_t)(end + 4 - c->in);
    memmove(c->in, c->in + used, c->in_len - used);
    c->in_len -= (uint32_t)used;
    c->waiting = 1;
    queue[(q_head + q_len) % q_cap] = (struct due){.at = t + delay, .fd = fd, .gen = c->gen};
    q_len++;
}

static void want_out(int fd, int on) {
    if (conns[fd].out_armed == on)
        return;
    conns[fd].out_armed = (uint8_t)on;
    struct epoll_event ev = {.events = EPOLLIN | (on ? EPOLLOUT : 0), .data.fd = fd};
    epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
}

/* Send what is left of the answer; returns 0 if the connection was closed. */
static int flush(int fd) {
    struct conn *c = &conns[fd];
    while (c->out_off < c->out_len) {
        ssize_t w = write(fd, c->out + c->out_off, c->out_len - c->out_off);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN) {
                want_out(fd, 1);
                return 1;
            }
            drop(fd);
            return 0;
        }
        c->out_off += (size_t)w;
    }
    free(c->out);
    c->out = NULL;
    c->out_len = c->out_off = 0;
    c->waiting = 0;
    want_out(fd, 0);
    take_request(fd); /* a request that came while this one waited */
    return 1;
}

static void answer(int fd) {
    static const char body[] =
        "<!doctype html>\n<html><head><title>slow</title></head><body>\n"
        "<p>This page took the app a while to make.</p>\n</body></html>\n";
    char date[64];
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(date, sizeof date, "%a, %d %b %Y %H:%M:%S GMT", &tm);
    struct conn *c = &conns[fd];
    c->out = malloc(512 + sizeof body);
    if (!c->out)
        die("malloc");
    c->out_len = (size_t)snprintf(c->out, 512 + sizeof body,
                                  "HTTP/1.1 200 OK\r\n"
                                  "Server: slow\r\n"
                                  "Date: %s\r\n"
                                  "Content-Type: text/html; charset=utf-8\r\n"
                                  "Content-Length: %zu\r\n"
                                  "Connection: keep-alive\r\n"
                                  "\r\n%s",
                                  date, sizeof body - 1, body);
    c->out_off = 0;
    flush(fd);
}

static void on_readable(int fd) {
    struct conn *c = &conns[fd];
    if (!c->in && !(c->in = malloc(IN_BUF)))
        die("malloc");
    for (;;) {
        if (c->in_len == IN_BUF) { /* a request head this long is not one we expect */
            drop(fd);
            return;
        }
        ssize_t n = read(fd, c->in + c->in_len, IN_BUF - c->in_len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            break;
        if (n <= 0) {
            drop(fd);
            return;
        }
        c->in_len += (uint32_t)n;
    }
    take_request(fd);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s PORT DELAY_MS LOG_FILE\n", argv[0]);
        return 2;
    }
    int port = atoi(argv[1]);
    delay = atof(argv[2]) / 1000.0;
    log_fd = open(argv[3], O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0)
        die(argv[3]);
    signal(SIGPIPE, SIG_IGN);

    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    max_fd = rl.rlim_cur;
    conns = calloc((size_t)max_fd, sizeof *conns);
    q_cap = 2 * (size_t)max_fd;
    queue = calloc(q_cap, sizeof *queue);
    if (!conns || !queue)
        die("calloc");

    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (lfd < 0)
        die("socket");
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(lfd, (struct sockaddr *)&sa, sizeof sa) < 0)
        die("bind");
    if (listen(lfd, 4096) < 0)
        die("listen");
    ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0)
        die("epoll_create1");
    struct epoll_event lev = {.events = EPOLLIN, .data.fd = lfd};
    epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &lev);

    struct epoll_event evs[MAX_EVENTS];
    for (;;) {
        int timeout = -1;
        if (q_len) {
            double wait = queue[q_head].at - now();
            timeout = wait <= 0 ? 0 : (int)(wait * 1000.0) + 1; /* round up: never early */
        }
        int n = epoll_wait(ep, evs, MAX_EVENTS, timeout);
        if (n < 0 && errno != EINTR)
            die("epoll_wait");
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == lfd) {
                for (;;) {
                    int cfd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                    if (cfd < 0)
                        break;
                    if ((rlim_t)cfd >= max_fd) {
                        close(cfd);
                        continue;
                    }
                    setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    struct epoll_event ev = {.events = EPOLLIN, .data.fd = cfd};
                    if (epoll_ctl(ep, EPOLL_CTL_ADD, cfd, &ev) < 0)
                        close(cfd);
                }
                continue;
            }
            if (evs[i].events & (EPOLLERR | EPOLLHUP)) {
                drop(fd);
                continue;
            }
            if ((evs[i].events & EPOLLOUT) && conns[fd].out && !flush(fd))
                continue;
            if (evs[i].events & EPOLLIN)
                on_readable(fd);
        }
        /* answer every request now due; a closed connection's entry is skipped */
        double t = now();
        while (q_len && queue[q_head].at <= t) {
            struct due d = queue[q_head];
            q_head = (q_head + 1) % q_cap;
            q_len--;
            if (conns[d.fd].gen == d.gen && conns[d.fd].waiting)
                answer(d.fd);
        }
    }
}
