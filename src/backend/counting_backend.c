/* counting_backend.c — the planner's backend: allocations are counted by
 * backend.c's accounting as on any backend, but nothing is allocated (each
 * gets a distinct address that is never dereferenced) and every op is a
 * no-op (vtable.counts_only). It mimics one device kind: whether its host
 * is its device (then the models stage no record buffers) and what that
 * kind's backend holds besides allocations for the scratch reserved. */
#include <stdlib.h>

#include "backend_impl.h"

typedef struct counting_state {
    const bb_device_desc *like;
    uintptr_t next;      /* the next address handed out */
} counting_state;

static bb_status counting_alloc(bb_backend_t *b, size_t bytes, void **out)
{
    counting_state *s = b->impl;
    *out = (void *)s->next;
    s->next += (bytes + 63) / 64 * 64 + 64; /* distinct, 64-byte aligned, never adjacent */
    return BB_OK;
}

static void counting_free(bb_backend_t *b, void *ptr) { (void)b, (void)ptr; }

/* Host memory (offloaded activations) too: an address, nothing allocated. */
static bb_status counting_host_alloc(bb_backend_t *b, size_t bytes, void **out) { return counting_alloc(b, bytes, out); }
static void counting_host_free(bb_backend_t *b, void *ptr, size_t bytes) { (void)b, (void)ptr, (void)bytes; }

static bb_status counting_copy(bb_backend_t *b, void *dst, const void *src, size_t bytes, bb_copy_kind kind)
{
    (void)b, (void)dst, (void)src, (void)bytes, (void)kind;
    return BB_OK;
}

static bb_status counting_memset(bb_backend_t *b, void *dst, int value, size_t bytes)
{
    (void)b, (void)dst, (void)value, (void)bytes;
    return BB_OK;
}

static uint64_t counting_workspace(const bb_backend_t *b)
{
    const counting_state *s = b->impl;
    return (s->like->workspace_bytes ? s->like->workspace_bytes(b->scratch_rows, b->scratch_width) : 0) +
           b->scratch_attention;
}

static void counting_destroy(bb_backend_t *b) { free(b->impl); }

/* The ops are never called (backend.c skips them when counts_only). */
#define COUNTING_VTABLE(host)                                                                               \
    {.alloc = counting_alloc, .free = counting_free, .host_alloc = counting_host_alloc,                   \
     .host_free = counting_host_free, .copy = counting_copy, .memset = counting_memset,                   \
     .destroy = counting_destroy, .workspace_bytes = counting_workspace, .host_is_device = (host),         \
     .counts_only = true}
static const bb_backend_vtable counting_host = COUNTING_VTABLE(true), counting_device = COUNTING_VTABLE(false);

bb_status bb_backend_create_counting(bb_device_kind like, const bb_backend_options *o, bb_backend_t **out)
{
    *out = NULL;
    const bb_device_desc *d = bb_device_desc_of(like);
    bb_backend_t *b = calloc(1, sizeof *b);
    counting_state *s = calloc(1, sizeof *s);
    if (!b || !s || !d) {
        free(b), free(s);
        return d ? bb_fail(BB_ERR_NOMEM, "out of memory") : bb_fail(BB_ERR_ARG, "unknown device kind %d", like);
    }
    *s = (counting_state){.like = d, .next = 4096};
    b->vt = d->host_is_device ? &counting_host : &counting_device;
    b->impl = s;
    char name[32];
    snprintf(name, sizeof name, "counting (%s)", d->name);
    bb_backend_init_common(b, like, name, o);
    b->fault_at = 0; /* BB_FAULT is for real ops */
    *out = b;
    return BB_OK;
}
