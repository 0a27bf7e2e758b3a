/* device_clock.c — device times for the trace on GPUs, where a phase's
 * host time is only when its work was queued. An anchor event, waited for
 * at the start of each step, ties the device clock to the host clock; the
 * phases are events after it, turned into spans once the step is done. */
#include <stdlib.h>

#include "trainer.h"

bb_status bb_device_clock_init(device_clock *c, bb_backend_t *be, int accumulation)
{
    *c = (device_clock){.be = be, .count = 3 * accumulation + 2};
    /* Only backends with real events (GPUs) need this; the CPU's spans are true already. */
    BB_TRY(bb_backend_event_create(be, &c->anchor));
    if (!c->anchor) return BB_OK;
    if (!(c->marks = calloc((size_t)c->count, sizeof *c->marks))) return bb_fail(BB_ERR_NOMEM, "out of memory");
    for (int i = 0; i < c->count; i++) BB_TRY(bb_backend_event_create(be, &c->marks[i]));
    c->on = true;
    return BB_OK;
}

void bb_device_clock_destroy(device_clock *c)
{
    for (int i = 0; c->marks && i < c->count; i++) bb_backend_event_destroy(c->be, c->marks[i]);
    free(c->marks);
    if (c->anchor) bb_backend_event_destroy(c->be, c->anchor);
    *c = (device_clock){0};
}

bb_status bb_device_clock_start(device_clock *c)
{
    if (!c->on) return BB_OK;
    BB_TRY(bb_backend_event_record(c->be, c->anchor, BB_STREAM_COMPUTE));
    BB_TRY(bb_backend_event_synchronize(c->be, c->anchor));
    c->anchor_ns = bb_clock_ns();
    return BB_OK;
}

bb_status bb_device_clock_mark(device_clock *c, int i)
{
    return c->on ? bb_backend_event_record(c->be, c->marks[i], BB_STREAM_COMPUTE) : BB_OK;
}

bb_status bb_device_clock_time(device_clock *c, int i, uint64_t *ns)
{
    double ms;
    BB_TRY(bb_backend_event_synchronize(c->be, c->marks[i]));
    BB_TRY(bb_backend_event_elapsed(c->be, c->anchor, c->marks[i], &ms));
    *ns = c->anchor_ns + (uint64_t)(ms > 0 ? ms * 1e6 : 0);
    return BB_OK;
}
