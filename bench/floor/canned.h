/*
 * What both floors share: the canned response (one per Connection mode, COPIES of it back
 * to back for pipelined writes) and the count of request ends in what was read. Header-only:
 * each floor stays one `gcc` call.
 */
#ifndef FLOOR_CANNED_H
#define FLOOR_CANNED_H

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#define COPIES 32 /* responses pre-built back to back, for pipelined writes */

static void canned_die(const char *what) {
    perror(what);
    exit(1);
}

/* Count request ends ("\r\n\r\n") in buf, carrying a partial match across reads in *match. */
static uint32_t count_ends(uint8_t *match, const char *buf, size_t n) {
    uint32_t ends = 0;
    uint8_t m = *match;
    const char *p = buf, *end = buf + n;
    while (p < end) {
        if (m == 0) {
            p = memchr(p, '\r', (size_t)(end - p));
            if (!p)
                break;
        }
        char ch = *p++;
        if (ch == '\r')
            m = (m == 2) ? 3 : 1;
        else if (ch == '\n' && m == 1)
            m = 2;
        else if (ch == '\n' && m == 3) {
            ends++;
            m = 0;
        } else
            m = 0;
    }
    *match = m;
    return ends;
}

static char *read_file(const char *path, size_t *len) {
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        canned_die(path);
    struct stat st;
    if (fstat(fd, &st) < 0)
        canned_die("fstat");
    char *b = malloc((size_t)st.st_size);
    if (!b)
        canned_die("malloc");
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        ssize_t n = read(fd, b + got, (size_t)st.st_size - got);
        if (n <= 0)
            canned_die("read body");
        got += (size_t)n;
    }
    close(fd);
    *len = got;
    return b;
}

/* COPIES responses with BODY_FILE's bytes, headers shaped like a real static server's;
 * the length of one in *resp_len. */
static char *build_canned(const char *body_file, int close_mode, size_t *resp_len) {
    size_t body_len;
    char *body = read_file(body_file, &body_len);
    char head[512];
    int hl = snprintf(head, sizeof head,
                      "HTTP/1.1 200 OK\r\n"
                      "Server: floor\r\n"
                      "Date: Thu, 01 Jan 2026 00:00:00 GMT\r\n"
                      "Content-Type: text/html; charset=utf-8\r\n"
                      "Content-Length: %zu\r\n"
                      "Last-Modified: Thu, 01 Jan 2026 00:00:00 GMT\r\n"
                      "Connection: %s\r\n"
                      "ETag: \"6955b900-%zx\"\r\n"
                      "Accept-Ranges: bytes\r\n"
                      "\r\n",
                      body_len, close_mode ? "close" : "keep-alive", body_len);
    *resp_len = (size_t)hl + body_len;
    char *canned = malloc(*resp_len * COPIES);
    if (!canned)
        canned_die("malloc");
    for (int i = 0; i < COPIES; i++) {
        memcpy(canned + i * *resp_len, head, (size_t)hl);
        memcpy(canned + i * *resp_len + hl, body, body_len);
    }
    free(body);
    return canned;
}

/* Raises the open-file limit to its hard limit (returned in *max_fd) and allocates one
 * zeroed per-connection state of `each` bytes for every descriptor below it. */
static void *conns_for_every_fd(size_t each, rlim_t *max_fd) {
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    *max_fd = rl.rlim_cur;
    void *conns = calloc((size_t)*max_fd, each);
    if (!conns)
        canned_die("calloc");
    return conns;
}

#endif
