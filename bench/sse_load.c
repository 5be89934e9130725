/* A native SSE upstream and client for bench/proxies.py's --rate check: streams at rates Python cannot produce.
 *
 *   sse_load serve PORT
 *       answers every POST with a chunked text/event-stream: "events" events (a JSON field of the
 *       request body), one HTTP chunk each, one every "pace_us" microseconds per stream, then
 *       "data: [DONE]"; GET /health and /metrics answer 200. One thread, epoll, a 100 µs tick.
 *   sse_load drive HOST PORT STREAMS EVENTS PACE_US
 *       opens STREAMS connections at once, asks each for EVENTS events paced PACE_US apart, parses
 *       the chunked framing, and prints one line of JSON: events received, HTTP chunks that carried
 *       more than one event (merged), streams broken (an event missing, no [DONE], not 200), wall
 *       seconds, and the client's own CPU seconds.
 *
 * Why C: a Python upstream and client top out near 10k events/s on this machine, below the
 * 40k events/s an 8-GPU host streams (issue 17); these two cost a few percent of a core there.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAXC 4096
#define BUF 65536

static const char EVENT[] =
    "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1,\"model\":\"m\","
    "\"choices\":[{\"index\":0,\"text\":\" hello\"}]}\n\n";
static const char DONE[] = "data: [DONE]\n\n";

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void die(const char *what) {
    perror(what);
    exit(2);
}

static void nodelay(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static long field(const char *body, const char *name, long fallback) {
    const char *at = strstr(body, name);
    if (!at) return fallback;
    at = strchr(at, ':');
    return at ? strtol(at + 1, NULL, 10) : fallback;
}

/* -- serve ---------------------------------------------------------------------------------- */

struct up {
    int fd;
    char in[BUF];
    size_t have;
    long left;       /* events still to send; -1: no request yet */
    double next;     /* when the next one is due */
    double pace;
};

static int write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN) {  /* a slow reader: wait for room (the proxy's back-pressure, seen from here) */
                struct timespec ts = {0, 100000};
                nanosleep(&ts, NULL);
                continue;
            }
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int chunk(int fd, const char *data, size_t n) {
    char head[32];
    int h = snprintf(head, sizeof head, "%zx\r\n", n);
    char out[512];
    memcpy(out, head, (size_t)h);
    memcpy(out + h, data, n);
    memcpy(out + h + n, "\r\n", 2);
    return write_all(fd, out, (size_t)h + n + 2);
}

static void close_up(int ep, struct up **c, int fd) {
    epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
    close(fd);
    free(c[fd]);
    c[fd] = NULL;
}

static void answer(int ep, struct up **c, struct up *u) {
    char *end = memmem(u->in, u->have, "\r\n\r\n", 4);
    if (!end) return;
    size_t head = (size_t)(end - u->in) + 4;
    u->in[u->have < BUF ? u->have : BUF - 1] = 0;
    long length = field(u->in, "Content-Length", 0);
    if (length < 0) length = 0;
    if (u->have < head + (size_t)length) return;  /* the body is not all here yet */
    if (strncmp(u->in, "GET", 3) == 0) {
        static const char ok[] = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 0\r\n\r\n";
        if (write_all(u->fd, ok, sizeof ok - 1) < 0) close_up(ep, c, u->fd);
        else u->have = 0;
        return;
    }
    static const char hdr[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                              "Transfer-Encoding: chunked\r\n\r\n";
    if (write_all(u->fd, hdr, sizeof hdr - 1) < 0) {
        close_up(ep, c, u->fd);
        return;
    }
    u->left = field(u->in + head, "\"events\"", 100);
    u->pace = field(u->in + head, "\"pace_us\"", 0) / 1e6;
    u->next = now();
    u->have = 0;
}

static int serve(int port) {
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(ls, (struct sockaddr *)&a, sizeof a) < 0 || listen(ls, 1024) < 0) die("listen");
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = ls};
    epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
    static struct up *c[MAXC];
    static int active[MAXC];  /* the fds with a stream under way: the tick walks these, not every slot */
    int nactive = 0;
    struct epoll_event got[256];
    for (;;) {
        int n = epoll_wait(ep, got, 256, 0 /* busy enough: the tick below paces */);
        for (int i = 0; i < n; i++) {
            int fd = got[i].data.fd;
            if (fd == ls) {
                int s;
                while ((s = accept4(ls, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    if (s >= MAXC) { close(s); continue; }
                    nodelay(s);
                    c[s] = calloc(1, sizeof(struct up));
                    c[s]->fd = s;
                    c[s]->left = -1;
                    struct epoll_event e = {.events = EPOLLIN, .data.fd = s};
                    epoll_ctl(ep, EPOLL_CTL_ADD, s, &e);
                }
                continue;
            }
            struct up *u = c[fd];
            if (!u) continue;
            ssize_t r = read(fd, u->in + u->have, BUF - 1 - u->have);
            if (r <= 0) {
                if (r < 0 && errno == EAGAIN) continue;
                close_up(ep, c, fd);
                continue;
            }
            u->have += (size_t)r;
            if (u->left < 0) {
                answer(ep, c, u);
                if (c[fd] && u->left >= 0) active[nactive++] = fd;
            }
        }
        double t = now();
        for (int k = 0; k < nactive; k++) {
            int fd = active[k];
            struct up *u = c[fd];
            if (!u || u->left < 0) {  /* gone: its slot goes to the last one */
                active[k--] = active[--nactive];
                continue;
            }
            while (u->left > 0 && u->next <= t) {
                if (chunk(fd, EVENT, sizeof EVENT - 1) < 0) { u->left = -2; break; }
                u->left--;
                u->next += u->pace;
            }
            if (u->left == 0) {
                chunk(fd, DONE, sizeof DONE - 1);
                write_all(fd, "0\r\n\r\n", 5);
            }
            if (u->left == 0 || u->left == -2) {  /* Connection: close, as guardian asks of a stream */
                close_up(ep, c, fd);
                active[k--] = active[--nactive];
            }
        }
        struct timespec tick = {0, 100000};
        nanosleep(&tick, NULL);
    }
    return 0;  /* not reached */
}

/* -- drive ---------------------------------------------------------------------------------- */

struct down {
    int fd;
    char buf[BUF];
    size_t have;
    int in_body, status, done, finished;
    long events;
    size_t want;     /* bytes of the current chunk still to read; 0: a size line is next */
    long in_chunk;   /* events seen in the current chunk */
    int after;       /* CRLF after a chunk's data still to skip */
    char prev;       /* the last body byte seen, for a "\n\n" split between reads */
};

static long merged_total;

/* Consume what can be parsed; returns 1 when the stream has ended. */
static int parse(struct down *d) {
    size_t at = 0;
    if (!d->in_body) {
        char *end = memmem(d->buf, d->have, "\r\n\r\n", 4);
        if (!end) return 0;
        d->status = atoi(d->buf + 9);
        at = (size_t)(end - d->buf) + 4;
        d->in_body = 1;
    }
    for (;;) {
        if (d->after) {
            if (d->have - at < 2) break;
            at += 2;
            d->after = 0;
            merged_total += d->in_chunk > 1 ? d->in_chunk - 1 : 0;
            d->in_chunk = 0;
        }
        if (d->want == 0) {
            char *nl = memmem(d->buf + at, d->have - at, "\r\n", 2);
            if (!nl) break;
            size_t size = strtoul(d->buf + at, NULL, 16);
            at = (size_t)(nl - d->buf) + 2;
            if (size == 0) {
                d->finished = 1;
                break;
            }
            d->want = size;
        }
        size_t take = d->have - at < d->want ? d->have - at : d->want;
        for (size_t i = 0; i < take; i++) {  /* an event ends with a blank line: "\n\n", maybe across two reads */
            char b = d->buf[at + i];
            if (b == '\n' && d->prev == '\n') {
                d->in_chunk++;
                d->events++;
                b = 0;
            }
            d->prev = b;
        }
        if (take && memmem(d->buf + at, take, "[DONE]", 6)) d->done = 1;
        at += take;
        d->want -= take;
        if (d->want) break;
        d->after = 1;
    }
    memmove(d->buf, d->buf + at, d->have - at);
    d->have -= at;
    return d->finished;
}

static int drive(const char *host, int port, int streams, long events, long pace_us) {
    int ep = epoll_create1(0);
    struct down *d = calloc((size_t)streams, sizeof *d);
    char body[256], req[1024];
    int bl = snprintf(body, sizeof body, "{\"model\":\"m\",\"prompt\":\"hi\",\"stream\":true,\"max_tokens\":%ld,"
                      "\"events\":%ld,\"pace_us\":%ld}", events, events, pace_us);
    int rl = snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
                      "Content-Length: %d\r\nConnection: close\r\n\r\n%s", host, port, bl, body);
    double t0 = now();
    for (int i = 0; i < streams; i++) {
        int s = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        inet_pton(AF_INET, host, &a.sin_addr);
        if (connect(s, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
        nodelay(s);
        if (write_all(s, req, (size_t)rl) < 0) die("write");
        fcntl(s, F_SETFL, O_NONBLOCK);
        d[i].fd = s;
        struct epoll_event e = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
        epoll_ctl(ep, EPOLL_CTL_ADD, s, &e);
    }
    int open = streams;
    struct epoll_event got[256];
    while (open > 0) {
        int n = epoll_wait(ep, got, 256, 30000);
        if (n == 0) break;  /* 30 s without a byte: what is left is broken */
        for (int k = 0; k < n; k++) {
            struct down *x = &d[got[k].data.u32];
            ssize_t r = read(x->fd, x->buf + x->have, BUF - x->have);
            if (r < 0 && errno == EAGAIN) continue;
            if (r > 0) {
                x->have += (size_t)r;
                if (!parse(x)) continue;
            }
            epoll_ctl(ep, EPOLL_CTL_DEL, x->fd, NULL);
            close(x->fd);
            x->fd = -1;
            open--;
        }
    }
    double wall = now() - t0;
    long received = 0, broken = 0;
    for (int i = 0; i < streams; i++) {
        received += d[i].events;
        if (d[i].status != 200 || !d[i].done || d[i].events != events + 1 || !d[i].finished) {
            if (!broken) fprintf(stderr, "sse_load: a stream broken: status %d, %ld events of %ld, [DONE] %s, ended %s\n",
                                 d[i].status, d[i].events, events + 1, d[i].done ? "seen" : "not seen", d[i].finished ? "yes" : "no");
            broken++;
        }
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double cpu = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
    printf("{\"events\": %ld, \"merged\": %ld, \"broken\": %ld, \"wall\": %.3f, \"cpu\": %.3f}\n", received, merged_total,
           broken, wall, cpu);
    return 0;
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);  /* a peer that left is an EPIPE from write, not the end of the server */
    if (argc == 3 && strcmp(argv[1], "serve") == 0) return serve(atoi(argv[2]));
    if (argc == 7 && strcmp(argv[1], "drive") == 0)
        return drive(argv[2], atoi(argv[3]), atoi(argv[4]), atol(argv[5]), atol(argv[6]));
    fprintf(stderr, "usage: sse_load serve PORT | sse_load drive HOST PORT STREAMS EVENTS PACE_US\n");
    return 2;
}
