/*
 * floor — the physical limit for an HTTP/1.1 server on this machine.
 *
 * A single-threaded epoll server that answers every request with the same
 * canned bytes without parsing anything: it only counts "\r\n\r\n" in what it
 * reads (so pipelined requests each get an answer) and writes that many copies
 * of one pre-built response. No request line, no headers, no file system, no
 * Date formatting. Whatever a real server spends above this is the price of
 * actually being a server.
 *
 *   floor PORT BODY_FILE [--close]
 *
 * BODY_FILE is the bench's index.html, so status and length match what the real
 * servers send. With --close every response says "Connection: close" and the
 * connection is closed once it is written (the `close` scenario measures the
 * accept path, and wrk only reconnects when the response asks it to).
 *
 * The listener uses TCP_DEFER_ACCEPT and a fresh connection is read at once,
 * so a connection costs accept4 + epoll_ctl + read + write (+ close).
 *
 * Built by bench/run with `gcc -O2`. Listens on 127.0.0.1 only.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "canned.h"

#define READ_BUF (64 * 1024)
#define MAX_EVENTS 512

struct conn {
    uint32_t owed;  /* responses not yet fully written */
    uint32_t off;   /* bytes of the first owed response already written */
    uint8_t match;  /* how much of "\r\n\r\n" the last read ended in */
    uint8_t want_out;
};

static char *canned;      /* COPIES responses back to back */
static size_t resp_len;   /* one response */
static int close_mode;
static int ep;
static struct conn *conns;
static rlim_t max_fd;

static void die(const char *what) {
    perror(what);
    exit(1);
}

static void drop(int fd) {
    memset(&conns[fd], 0, sizeof conns[fd]);
    close(fd); /* also removes it from the epoll set */
}

/* Write what is owed; returns 0 if the connection was closed. */
static int flush(int fd, struct conn *c) {
    while (c->owed) {
        size_t total = (size_t)c->owed * resp_len - c->off;
        size_t room = COPIES * resp_len - c->off;
        size_t len = total < room ? total : room;
        ssize_t w = write(fd, canned + c->off, len);
        if (w < 0) {
            if (errno == EAGAIN) {
                if (!c->want_out) {
                    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.fd = fd};
                    epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
                    c->want_out = 1;
                }
                return 1;
            }
            if (errno == EINTR)
                continue;
            drop(fd);
            return 0;
        }
        size_t done = c->off + (size_t)w;
        c->owed -= (uint32_t)(done / resp_len);
        c->off = (uint32_t)(done % resp_len);
    }
    if (c->want_out) {
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
        epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
        c->want_out = 0;
    }
    if (close_mode) {
        drop(fd);
        return 0;
    }
    return 1;
}

static void on_readable(int fd, char *buf) {
    struct conn *c = &conns[fd];
    ssize_t n = read(fd, buf, READ_BUF);
    if (n <= 0) {
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return;
        drop(fd);
        return;
    }
    uint32_t ends = count_ends(&c->match, buf, (size_t)n);
    if (ends == 0)
        return;
    c->owed += ends;
    if (!c->want_out) /* otherwise EPOLLOUT will flush it */
        flush(fd, c);
}

static void on_accept(int lfd, char *buf) {
    for (;;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            return; /* EAGAIN, or EMFILE: the backlog keeps it for later */
        }
        if ((rlim_t)fd >= max_fd) {
            close(fd);
            continue;
        }
        if (!close_mode) { /* one write per connection needs no NODELAY */
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        }
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
        if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0) {
            close(fd);
            continue;
        }
        /* TCP_DEFER_ACCEPT: the request is usually here already */
        on_readable(fd, buf);
    }
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s PORT BODY_FILE [--close]\n", argv[0]);
        return 2;
    }
    int port = atoi(argv[1]);
    close_mode = argc > 3 && strcmp(argv[3], "--close") == 0;
    signal(SIGPIPE, SIG_IGN);

    conns = conns_for_every_fd(sizeof *conns, &max_fd);

    canned = build_canned(argv[2], close_mode, &resp_len);

    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (lfd < 0)
        die("socket");
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(lfd, (struct sockaddr *)&sa, sizeof sa) < 0)
        die("bind");
    int defer = 1; /* wake us only when the request has arrived (h2o does this by default) */
    setsockopt(lfd, IPPROTO_TCP, TCP_DEFER_ACCEPT, &defer, sizeof defer);
    if (listen(lfd, 65535) < 0)
        die("listen");

    ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0)
        die("epoll_create1");
    struct epoll_event lev = {.events = EPOLLIN, .data.fd = lfd};
    epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &lev);

    printf("floor listening on 127.0.0.1:%d (%zu-byte response%s)\n", port, resp_len,
           close_mode ? ", Connection: close" : "");
    fflush(stdout);

    char *buf = malloc(READ_BUF);
    struct epoll_event evs[MAX_EVENTS];
    for (;;) {
        int n = epoll_wait(ep, evs, MAX_EVENTS, -1);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            die("epoll_wait");
        }
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            uint32_t e = evs[i].events;
            if (fd == lfd) {
                on_accept(lfd, buf);
                continue;
            }
            if (e & (EPOLLERR | EPOLLHUP)) {
                drop(fd);
                continue;
            }
            if (e & EPOLLOUT) {
                if (!flush(fd, &conns[fd]))
                    continue;
            }
            if (e & EPOLLIN)
                on_readable(fd, buf);
        }
    }
}
