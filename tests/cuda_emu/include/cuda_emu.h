/* cuda_emu.h — the CUDA emulator's own calls (tests/cuda_emu): the
 * counters tests assert on, and the hooks its stand-ins for CUB and NCCL
 * are built on. C, so that the C test suites read the counters.
 *
 *   bbemu_counters before, after;
 *   bbemu_counters_get(&before);  ... train a step ...  bbemu_counters_get(&after);
 *   host synchronizations of the step: after.host_syncs - before.host_syncs
 *
 * Environment (read at the first CUDA call of the process; the NCCL fault at
 * the first collective):
 *   BB_CUDA_EMU_DEVICES=N     emulated GPUs (default 2; 0: none)
 *   BB_CUDA_EMU_MEM=BYTES     memory of each (default 8 GiB; K, M, G suffixes)
 *   BB_CUDA_EMU_SEED=S        the order of lanes and blocks, the delays (default 1)
 *   BB_CUDA_EMU_DELAY_US=U    each stream waits up to U µs (seeded) before each
 *                             operation: shakes the timing between streams
 *   BB_CUDA_EMU_FAULT=KERNEL:N[@D]  the N-th launch of KERNEL (on cuda:D) faults
 *                             with an illegal address, as a bad pointer would
 *   BB_CUDA_EMU_NCCL_FAULT=CALL:N[@R]  the N-th ncclCALL (AllReduce, Broadcast, ...)
 *                             of rank R fails on its stream (a lost peer)
 *   BB_CUDA_EMU_STATS=FILE    at exit, the counters as one JSON object
 *   CUDA_LAUNCH_BLOCKING=1    every launch waits for its kernel, as CUDA's does
 * A bad value is one line on stderr and exit status 1. */
#ifndef BBEMU_CUDA_EMU_H
#define BBEMU_CUDA_EMU_H

#include <stddef.h>
#include <stdint.h>

#include "cuda_runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Totals over the process since its first CUDA call (cannot fail). */
typedef struct bbemu_counters {
    uint64_t host_syncs;     /* every wait of the host for device work: the five below */
    uint64_t stream_syncs, device_syncs, event_syncs; /* cuda{Stream,Device,Event}Synchronize */
    uint64_t blocking_calls; /* cudaMemcpy, cudaMemset, cudaMemcpyAsync into pageable memory, cudaFree(Host) */
    uint64_t polls;          /* cudaStreamQuery/cudaEventQuery that found the work done (a polling loop's end) */
    uint64_t launches;       /* kernel launches (into a capture too) */
    uint64_t captured_launches; /* the kernel launches a stream capture recorded */
    uint64_t graph_launches, graph_kernels; /* cudaGraphLaunch calls, and the kernels they ran */
    uint64_t blas_calls, cub_calls, nccl_calls;
    uint64_t h2d_bytes, d2h_bytes, d2d_bytes;
    uint64_t h2d_copies, d2h_copies;
    uint64_t lt_epilogues;   /* cublasLtMatmul calls with an epilogue (bias, GELU, bias gradient) */
} bbemu_counters;
void bbemu_counters_get(bbemu_counters *out);
/* Launches so far of the kernels whose name starts with `prefix` (as the
 * launch names them: "activation_forward_k", "broadcast_rows_k<", ...). */
uint64_t bbemu_kernel_launches(const char *prefix);
/* Each wait of a stream for an event recorded on another stream after a
 * collective was queued there (a compute stream waiting for an all-gather),
 * in the order the waits were asked: the collective's kind ("AllGather",
 * "Broadcast", ...) and where it and the wait stand in the device's program
 * order (the operations queued on its streams so far). Copies the first
 * `cap` into out (may be NULL) and returns how many there are; _clear
 * forgets them (cannot fail). */
typedef struct bbemu_collective_wait {
    int device;
    char kind[16];
    uint64_t issued_at, waited_at;
} bbemu_collective_wait;
size_t bbemu_collective_waits(bbemu_collective_wait *out, size_t cap);
void bbemu_collective_waits_clear(void);

/* ---- hooks of the stand-ins ---------------------------------------------- */
/* Queues fn(ctx) on `stream` (0: the legacy stream of the current device),
 * run on its thread in stream order; drop(ctx) (may be NULL) afterwards or
 * when it cannot be queued. device_work: skipped once the device has a
 * sticky error (as a kernel would be). Fails, queuing nothing, with the
 * device's sticky error or cudaErrorInvalidDevice (no current device). */
cudaError_t bbemu_enqueue_host(cudaStream_t stream, const char *what, void (*fn)(void *ctx), void (*drop)(void *ctx),
                               void *ctx, int device_work);
/* The device of a stream (0: the current device's legacy stream); -1 when
 * it is not a stream. */
int bbemu_stream_device(cudaStream_t stream);
/* 1 when [p, p + bytes) lies in one allocation of device memory of
 * `device`; otherwise 0, and *why (may be NULL) says what p is. */
int bbemu_device_range(const void *p, size_t bytes, int device, const char **why);
/* Inside an operation run by a stream: fails it as a kernel fault would
 * (a sticky `code` on the stream's device), with a line on stderr; called
 * elsewhere, only the line. */
void bbemu_fail_operation(cudaError_t code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Adds n to a counter of bbemu_counters ("blas_calls", "cub_calls",
 * "nccl_calls", "lt_epilogues"; another name is ignored). */
void bbemu_count(const char *counter, uint64_t n);
/* BB_CUDA_EMU_SEED (default 1). */
uint64_t bbemu_seed(void);

#ifdef __cplusplus
}
#endif

#endif
