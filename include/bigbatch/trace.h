/* trace.h — per-thread spans written as a Chrome trace (JSON; opens in
 * Perfetto and chrome://tracing), one track per thread.
 *
 * How to use:
 *   bb_trace_t *t;
 *   BB_TRY(bb_trace_create(3, &t));                 // tracks 0..2
 *   bb_trace_name_track(t, 0, "worker 0");
 *   uint64_t t0 = bb_clock_ns();  forward(...);
 *   bb_trace_add(t, 0, "forward", t0, bb_clock_ns(), step, -1);
 *   BB_TRY(bb_trace_write(t, "trace.json"));
 *   bb_trace_destroy(t);
 *
 * Each track has one writer thread, so adding a span takes no lock; spans
 * are kept in memory (48 bytes each) until written. Calls with a NULL trace
 * do nothing, so code can trace unconditionally.
 */
#ifndef BIGBATCH_TRACE_H
#define BIGBATCH_TRACE_H

#include "bigbatch/core.h"

typedef struct bb_trace bb_trace_t;

/* A trace of `tracks` tracks. Fails with BB_ERR_NOMEM. */
bb_status bb_trace_create(int tracks, bb_trace_t **out);
void bb_trace_destroy(bb_trace_t *t);
/* Names a track ("worker 0", "reducer"); copies the name. */
void bb_trace_name_track(bb_trace_t *t, int track, const char *name);
/* Appends a span to `track` (one thread per track). A span that cannot be
 * stored (out of memory) is counted and reported when the trace is written. */
void bb_trace_add(bb_trace_t *t, int track, const char *name, uint64_t start_ns, uint64_t end_ns, int64_t step,
                  int32_t detail);
/* NVTX ranges for Nsight Systems (CUDA builds; no-ops otherwise): the
 * calling thread's phase starts (push) and ends (pop), under the same
 * names as the spans. */
void bb_trace_range_push(const char *name);
void bb_trace_range_pop(void);
/* Writes every span as a complete event ("ph":"X", microseconds from the
 * first span), one event per line, atomically (temporary file, rename).
 * Spans named "reduce" show as "reduce bucket <detail>". Fails with BB_ERR_IO. */
bb_status bb_trace_write(const bb_trace_t *t, const char *path);

#endif /* BIGBATCH_TRACE_H */
