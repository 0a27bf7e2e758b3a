/* op_profile.c — per-op times of a backend (BB_PROFILE_OPS=1; backend.h's
 * bb_backend_op_profile). Every op marks its start: on a device with events
 * an event recorded on the compute stream, so an op lasts from its mark to
 * the next one (the next op's, or a synchronization's); elsewhere the host
 * clock, since the ops are done when they return. The marks are read back
 * 256 at a time (one host wait) and when the table is asked for. A
 * counting backend (the planner's) keeps the table always, with no time:
 * each op's calls, FLOPs, elements and bytes, the work the planner's time
 * model weighs and the roofline account's traffic. */
#include <stdlib.h>
#include <string.h>

#include "backend_impl.h"

enum { RING = 256, OPS = 64 };

struct bb_op_profile {
    bb_event_t *ev[RING];
    const char *name[RING]; /* NULL: a synchronization's mark, which only ends an op */
    bb_op_work work[RING];
    int marks;
    uint64_t host_ns;       /* host clock: the pending op's start */
    bb_op_time table[OPS];
    int ops;
};

void bb_op_profile_init(bb_backend_t *b)
{
    const char *v = getenv("BB_PROFILE_OPS");
    if ((v && *v && strcmp(v, "0")) || b->vt->counts_only || b->opt.profile_ops)
        b->profile = calloc(1, sizeof *b->profile);
}

static void account(bb_op_profile *p, const char *op, double ms, bb_op_work w)
{
    if (!op) return;
    int i = 0;
    while (i < p->ops && strcmp(p->table[i].op, op)) i++;
    if (i == p->ops) {
        if (p->ops == OPS) return;
        p->table[p->ops++] = (bb_op_time){.op = op};
    }
    p->table[i].calls++;
    p->table[i].ms += ms;
    p->table[i].flops += w.flops;
    p->table[i].elements += w.elements;
    p->table[i].bytes += w.bytes;
}

/* Reads back every mark but the last, which starts the next interval. */
static void flush(bb_backend_t *b, bb_op_profile *p)
{
    if (p->marks < 2 || b->vt->event_synchronize(b, p->ev[p->marks - 1]) != BB_OK) return;
    for (int i = 1; i < p->marks; i++) {
        double ms = 0;
        if (b->vt->event_elapsed(b, p->ev[i - 1], p->ev[i], &ms) == BB_OK)
            account(p, p->name[i - 1], ms, p->work[i - 1]);
    }
    bb_event_t *last = p->ev[p->marks - 1];
    p->ev[p->marks - 1] = p->ev[0];
    p->ev[0] = last;
    p->name[0] = p->name[p->marks - 1];
    p->work[0] = p->work[p->marks - 1];
    p->marks = 1;
}

void bb_op_profile_mark(bb_backend_t *b, const char *op, bb_op_work w)
{
    bb_op_profile *p = b->profile;
    if (b->vt->counts_only) { /* the work only */
        account(p, op, 0, w);
        return;
    }
    if (!b->vt->event_record) { /* the host's clock */
        uint64_t now = bb_clock_ns();
        if (p->marks) account(p, p->name[0], (double)(now - p->host_ns) / 1e6, p->work[0]);
        p->name[0] = op, p->work[0] = w, p->marks = 1, p->host_ns = now;
        return;
    }
    if (p->marks == RING) flush(b, p);
    if (!p->ev[p->marks] && b->vt->event_create(b, &p->ev[p->marks]) != BB_OK) return;
    if (b->vt->event_record(b, p->ev[p->marks], BB_STREAM_COMPUTE) != BB_OK) return;
    p->name[p->marks] = op;
    p->work[p->marks] = w;
    p->marks++;
}

/* Ends the last op and reads every mark back. */
static void settle(bb_backend_t *b, bb_op_profile *p)
{
    if (b->vt->counts_only) return;
    bb_op_profile_mark(b, NULL, (bb_op_work){0});
    if (b->vt->event_record) flush(b, p);
}

static int by_time(const void *a, const void *b)
{
    double x = ((const bb_op_time *)a)->ms, y = ((const bb_op_time *)b)->ms;
    return x < y ? 1 : x > y ? -1 : 0;
}

int bb_backend_op_profile(bb_backend_t *b, bb_op_time *out, int cap)
{
    bb_op_profile *p = b->profile;
    if (!p) return 0;
    settle(b, p);
    int n = p->ops < cap ? p->ops : cap;
    memcpy(out, p->table, (size_t)n * sizeof *out);
    qsort(out, (size_t)n, sizeof *out, by_time);
    return n;
}

void bb_backend_op_profile_reset(bb_backend_t *b)
{
    bb_op_profile *p = b->profile;
    if (!p) return;
    settle(b, p);
    p->ops = 0;
}

void bb_op_profile_free(bb_backend_t *b)
{
    bb_op_profile *p = b->profile;
    if (!p) return;
    for (int i = 0; i < RING; i++)
        if (p->ev[i] && b->vt->event_destroy) b->vt->event_destroy(b, p->ev[i]);
    free(p);
    b->profile = NULL;
}
