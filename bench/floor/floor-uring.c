/*
 * floor-uring — floor.c's canned answer on io_uring: the limit for an HTTP/1.1
 * server on this machine when its sockets go through one ring.
 *
 * Same answers as floor.c (counts "\r\n\r\n", writes that many copies of one
 * pre-built response, parses nothing), through one ring with the tricks a
 * server at the limit would use: a multishot accept on the listener, a
 * multishot receive per connection from a provided-buffer ring, sends straight
 * from the canned bytes (no copy), close through the ring, and one
 * io_uring_enter per loop turn for everything (SINGLE_ISSUER, DEFER_TASKRUN).
 *
 *   floor-uring PORT BODY_FILE [--close]
 *
 * Built by bench/run with `gcc -O2 ... -luring` when liburing is installed.
 * Listens on 127.0.0.1 only.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "canned.h"

#define BUFS 1024
#define BUF_SIZE 4096
#define GROUP 0

enum { OP_ACCEPT = 1, OP_RECV, OP_SEND, OP_CLOSE };

struct conn {
    uint32_t owed;  /* responses not yet written */
    uint32_t off;   /* bytes of the first owed response already written */
    uint32_t inflight; /* bytes of the send on the ring */
    uint8_t match;  /* how much of "\r\n\r\n" the last read ended in */
    uint8_t sending;
    uint8_t closing;
    uint32_t gen; /* bumped per accept: a late completion of an earlier socket is told apart */
};

static char *canned;
static size_t resp_len;
static int close_mode;
static struct conn *conns;
static rlim_t max_fd;
static struct io_uring ring;
static struct io_uring_buf_ring *br;
static char *bufs;

static void die(const char *what, int err) {
    fprintf(stderr, "%s: %s\n", what, strerror(err));
    exit(1);
}

static struct io_uring_sqe *sqe(void) {
    struct io_uring_sqe *s = io_uring_get_sqe(&ring);
    if (!s) {
        io_uring_submit(&ring);
        s = io_uring_get_sqe(&ring);
    }
    return s;
}

static uint64_t tag(int op, int fd) {
    uint32_t gen = fd >= 0 && (rlim_t)fd < max_fd ? conns[fd].gen & 0xffffff : 0;
    return ((uint64_t)op << 56) | ((uint64_t)gen << 32) | (uint32_t)fd;
}

static void arm_recv(int fd) {
    struct io_uring_sqe *s = sqe();
    io_uring_prep_recv_multishot(s, fd, NULL, 0, 0);
    s->flags |= IOSQE_BUFFER_SELECT;
    s->buf_group = GROUP;
    io_uring_sqe_set_data64(s, tag(OP_RECV, fd));
}

static void drop(int fd) {
    struct conn *c = &conns[fd];
    if (c->closing)
        return;
    c->closing = 1;
    /* A multishot receive holds the socket open: cancel it, then close (hard-linked: the
     * close runs even when the receive had ended already and the cancel finds nothing). */
    struct io_uring_sqe *s = sqe();
    io_uring_prep_cancel_fd(s, fd, 0);
    s->flags |= IOSQE_IO_HARDLINK;
    io_uring_sqe_set_data64(s, tag(OP_CLOSE, fd));
    s = sqe();
    io_uring_prep_close(s, fd);
    io_uring_sqe_set_data64(s, tag(OP_CLOSE, fd));
}

/* Queue a send of what is owed, straight from the canned bytes. */
static void flush(int fd) {
    struct conn *c = &conns[fd];
    if (c->sending || !c->owed || c->closing)
        return;
    size_t total = (size_t)c->owed * resp_len - c->off;
    size_t room = COPIES * resp_len - c->off;
    size_t len = total < room ? total : room;
    struct io_uring_sqe *s = sqe();
    io_uring_prep_send(s, fd, canned + c->off, len, MSG_NOSIGNAL);
    io_uring_sqe_set_data64(s, tag(OP_SEND, fd));
    c->sending = 1;
    c->inflight = (uint32_t)len;
}

static void on_cqe(struct io_uring_cqe *cqe) {
    int op = (int)(cqe->user_data >> 56);
    uint32_t gen = (uint32_t)(cqe->user_data >> 32) & 0xffffff;
    int fd = (int)(uint32_t)cqe->user_data;
    int res = cqe->res;
    if (op == OP_RECV && res > 0) {
        unsigned bid = cqe->flags >> IORING_CQE_BUFFER_SHIFT;
        if (gen != (conns[fd].gen & 0xffffff) || conns[fd].closing) {
            io_uring_buf_ring_add(br, bufs + (size_t)bid * BUF_SIZE, BUF_SIZE, (unsigned short)bid,
                                  io_uring_buf_ring_mask(BUFS), 0);
            io_uring_buf_ring_advance(br, 1);
            return;
        }
    }
    if ((op == OP_RECV || op == OP_SEND) && gen != (conns[fd].gen & 0xffffff))
        return; /* an earlier socket's */
    switch (op) {
    case OP_ACCEPT:
        if (!(cqe->flags & IORING_CQE_F_MORE)) { /* re-arm (fd exhaustion ends it) */
            struct io_uring_sqe *s = sqe();
            io_uring_prep_multishot_accept(s, fd, NULL, NULL, SOCK_CLOEXEC);
            io_uring_sqe_set_data64(s, tag(OP_ACCEPT, fd));
        }
        if (res < 0)
            return;
        if ((rlim_t)res >= max_fd) {
            close(res);
            return;
        }
        uint32_t next = conns[res].gen + 1;
        memset(&conns[res], 0, sizeof conns[res]);
        conns[res].gen = next;
        arm_recv(res);
        return;
    case OP_RECV: {
        struct conn *c = &conns[fd];
        if (res > 0) {
            unsigned bid = cqe->flags >> IORING_CQE_BUFFER_SHIFT;
            uint32_t ends = count_ends(&c->match, bufs + (size_t)bid * BUF_SIZE, (size_t)res);
            io_uring_buf_ring_add(br, bufs + (size_t)bid * BUF_SIZE, BUF_SIZE, (unsigned short)bid,
                                  io_uring_buf_ring_mask(BUFS), 0);
            io_uring_buf_ring_advance(br, 1);
            if (!(cqe->flags & IORING_CQE_F_MORE) && !c->closing)
                arm_recv(fd);
            c->owed += ends;
            flush(fd);
            return;
        }
        if (res == -ENOBUFS) {
            arm_recv(fd);
            return;
        }
        if (!(cqe->flags & IORING_CQE_F_MORE))
            drop(fd); /* the end, or an error */
        return;
    }
    case OP_SEND: {
        struct conn *c = &conns[fd];
        c->sending = 0;
        if (res < 0) {
            drop(fd);
            return;
        }
        size_t done = c->off + (size_t)res;
        c->owed -= (uint32_t)(done / resp_len);
        c->off = (uint32_t)(done % resp_len);
        if (c->owed) {
            flush(fd);
            return;
        }
        if (close_mode)
            drop(fd);
        return;
    }
    case OP_CLOSE:
        /* A multishot receive still on the ring ends with the socket. */
        return;
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

    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (lfd < 0)
        die("socket", errno);
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    /* Inherited by accepted sockets: one setsockopt, not one per connection. */
    setsockopt(lfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(lfd, (struct sockaddr *)&sa, sizeof sa) < 0)
        die("bind", errno);
    int defer = 1;
    setsockopt(lfd, IPPROTO_TCP, TCP_DEFER_ACCEPT, &defer, sizeof defer);
    if (listen(lfd, 65535) < 0)
        die("listen", errno);

    struct io_uring_params p = {0};
    p.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_CQSIZE;
    p.cq_entries = 16384;
    int err = io_uring_queue_init_params(4096, &ring, &p);
    if (err < 0)
        die("io_uring_queue_init_params", -err);
    if (posix_memalign((void **)&br, 4096, BUFS * sizeof(struct io_uring_buf)) != 0)
        die("posix_memalign", ENOMEM);
    io_uring_buf_ring_init(br);
    struct io_uring_buf_reg reg = {.ring_addr = (unsigned long)br, .ring_entries = BUFS, .bgid = GROUP};
    err = io_uring_register_buf_ring(&ring, &reg, 0);
    if (err < 0)
        die("io_uring_register_buf_ring", -err);
    bufs = malloc((size_t)BUFS * BUF_SIZE);
    for (int i = 0; i < BUFS; i++)
        io_uring_buf_ring_add(br, bufs + (size_t)i * BUF_SIZE, BUF_SIZE, (unsigned short)i,
                              io_uring_buf_ring_mask(BUFS), i);
    io_uring_buf_ring_advance(br, BUFS);

    struct io_uring_sqe *s = sqe();
    io_uring_prep_multishot_accept(s, lfd, NULL, NULL, SOCK_CLOEXEC);
    io_uring_sqe_set_data64(s, tag(OP_ACCEPT, lfd));

    printf("floor-uring listening on 127.0.0.1:%d (%zu-byte response%s)\n", port, resp_len,
           close_mode ? ", Connection: close" : "");
    fflush(stdout);

    for (;;) {
        err = io_uring_submit_and_wait(&ring, 1);
        if (err < 0 && err != -EINTR && err != -ETIME && err != -EBUSY)
            die("io_uring_submit_and_wait", -err);
        struct io_uring_cqe *cqe;
        unsigned head_idx, seen = 0;
        io_uring_for_each_cqe(&ring, head_idx, cqe) {
            on_cqe(cqe);
            seen++;
        }
        io_uring_cq_advance(&ring, seen);
    }
}
