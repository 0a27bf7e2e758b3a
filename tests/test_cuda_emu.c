/* test_cuda_emu.c — the CUDA emulator (tests/cuda_emu) holds CUDA code to
 * CUDA's rules: each test breaks one on purpose (kernels of
 * tests/cuda_emu/selftest.cu) and asserts the emulator catches it, naming
 * the kernel, or that what the hardware would do shows (a race gives a
 * wrong result, a fault is sticky). Runs in the emulated build (make
 * cuda-emu, part of make test); in other builds it says skipped. */
#include "test_util.h"

#ifndef BB_CUDA_EMU
Test(cuda_emu, runs_in_the_emulated_build)
{
    cr_skip_test("skipped: the emulator's own tests run in the emulated build (make cuda-emu)");
}
#else
#include <cuda_emu.h>
#include <nccl.h>

#include "cuda_emu/selftest.h"

static cudaStream_t stream_on(int device)
{
    cr_assert_eq(cudaSetDevice(device), cudaSuccess);
    cudaStream_t s;
    cr_assert_eq(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    return s;
}

static int *device_ints(size_t n)
{
    int *p = NULL;
    cr_assert_eq(cudaMalloc((void **)&p, n * sizeof *p), cudaSuccess);
    return p;
}

static int *to_host(const int *d, size_t n)
{
    int *h = malloc(n * sizeof *h);
    cr_assert_eq(cudaMemcpy(h, d, n * sizeof *h, cudaMemcpyDeviceToHost), cudaSuccess, "%s",
                 cudaGetErrorString(cudaGetLastError()));
    return h;
}

/* The stream's work failed with `code`, sticky on the device, and the
 * error's text names every string of the NULL-terminated list. */
static void expect_fault(cudaStream_t s, cudaError_t code, const char *const *needles)
{
    cudaError_t e = cudaStreamSynchronize(s);
    const char *msg = cudaGetErrorString(e);
    cr_log_info("%s", msg);
    cr_assert_eq(e, code, "expected %s, got %s: %s", cudaGetErrorName(code), cudaGetErrorName(e), msg);
    for (const char *const *n = needles; *n; n++) cr_assert(strstr(msg, *n), "'%s' should name '%s'", msg, *n);
    cr_assert_eq(cudaDeviceSynchronize(), code, "the fault should be sticky");
    cr_assert_eq(cudaGetLastError(), code, "cudaGetLastError cannot clear a sticky error");
    cr_assert_eq(cudaGetLastError(), code, "cudaGetLastError cannot clear a sticky error");
}
#define expect_fault_naming(s, code, ...) expect_fault((s), (code), (const char *const[]){__VA_ARGS__, NULL})

/* A launch that is to fault returns success, or already the fault when
 * the kernel ran before cudaGetLastError (its stream is a thread of its
 * own): as on a GPU, either is right. */
static void launched(cudaError_t e, cudaError_t fault)
{
    cr_assert(e == cudaSuccess || e == fault, "the launch returned %s", cudaGetErrorName(e));
}

/* ---- barriers and warps ----------------------------------------------------- */
Test(cuda_emu, a_barrier_some_threads_skip_fails_the_kernel)
{
    cudaStream_t s = stream_on(0);
    launched(bbemu_test_barrier_some_skip(s, device_ints(64), 64, 16), cudaErrorLaunchFailure);
    expect_fault_naming(s, cudaErrorLaunchFailure, "barrier_some_skip_k", "__syncthreads", "selftest.cu",
                        "not reached by threads 16-63, which returned");
}

Test(cuda_emu, a_barrier_at_two_places_fails_the_kernel)
{
    cudaStream_t s = stream_on(0);
    launched(bbemu_test_barrier_two_sites(s, device_ints(64), 64), cudaErrorLaunchFailure);
    expect_fault_naming(s, cudaErrorLaunchFailure, "barrier_two_sites_k", "divergent __syncthreads");
}

Test(cuda_emu, a_barrier_after_one_thread_returned_fails_the_kernel)
{
    cudaStream_t s = stream_on(0);
    launched(bbemu_test_barrier_after_return(s, device_ints(64), 64), cudaErrorLaunchFailure);
    expect_fault_naming(s, cudaErrorLaunchFailure, "barrier_after_return_k", "threads 5, which returned");
}

Test(cuda_emu, a_full_mask_shuffle_in_a_partial_warp_fails)
{
    cudaStream_t s = stream_on(0);
    int *out = device_ints(64);
    cr_assert_eq(bbemu_test_warp_sum(s, out, 64), cudaSuccess);
    cr_assert_eq(cudaStreamSynchronize(s), cudaSuccess);
    int *h = to_host(out, 64);
    for (int i = 0; i < 64; i++) cr_assert_eq(h[i], 32, "lane %d: the warp's sum of ones is %d", i, h[i]);
    free(h);
    launched(bbemu_test_warp_sum(s, out, 48), cudaErrorLaunchFailure);
    expect_fault_naming(s, cudaErrorLaunchFailure, "warp_sum_k", "__shfl_xor_sync", "mask 0xffffffff",
                        "names lanes 16-31 of warp 1, which are not there");
}

Test(cuda_emu, a_shuffle_from_a_lane_outside_its_mask_fails)
{
    cudaStream_t s = stream_on(0);
    launched(bbemu_test_shuffle_outside_mask(s, device_ints(32)), cudaErrorLaunchFailure);
    expect_fault_naming(s, cudaErrorLaunchFailure, "shuffle_outside_mask_k", "reads lane 20",
                        "not in its mask 0x0000ffff");
}

/* Lanes do not run in lockstep: without the __syncwarp, some lane reads its
 * neighbour's slot before the neighbour wrote it (in a ring of 32 reads,
 * one always comes first), with it every lane sees the new values. */
Test(cuda_emu, a_missing_syncwarp_gives_a_wrong_result)
{
    cudaStream_t s = stream_on(0);
    int *out = device_ints(32);
    for (int base = 100; base <= 300; base += 100) {
        bool sync = base != 200;
        cr_assert_eq(bbemu_test_neighbour(s, out, base, sync), cudaSuccess);
        cr_assert_eq(cudaStreamSynchronize(s), cudaSuccess);
        int *h = to_host(out, 32), wrong = 0;
        for (int lane = 0; lane < 32; lane++) wrong += h[lane] != base + (lane + 1) % 32;
        cr_log_info("%s __syncwarp: %d of 32 lanes read a stale slot", sync ? "with" : "without", wrong);
        if (sync) cr_assert_eq(wrong, 0, "with __syncwarp every lane reads its neighbour's new value");
        else cr_assert_gt(wrong, 0, "without __syncwarp some lane must read a stale value");
        free(h);
    }
}

/* ---- shared memory and launch limits ----------------------------------------------- */
Test(cuda_emu, a_dynamic_shared_memory_overrun_by_one_element_fails)
{
    cudaStream_t s = stream_on(0);
    int *out = device_ints(32);
    cr_assert_eq(bbemu_test_dynamic_shared(s, out, 32, 31), cudaSuccess); /* the last element: fine */
    cr_assert_eq(cudaStreamSynchronize(s), cudaSuccess);
    launched(bbemu_test_dynamic_shared(s, out, 32, 32), cudaErrorLaunchFailure); /* one past it */
    expect_fault_naming(s, cudaErrorLaunchFailure, "dynamic_shared_k", "past the end of its 128 bytes of dynamic "
                        "shared memory");
}

Test(cuda_emu, more_than_48_kib_of_shared_memory_needs_the_attribute)
{
    cudaStream_t s = stream_on(0);
    int *out = device_ints(32);
    cr_assert_eq(bbemu_test_shared_bytes(s, out, 48 * 1024), cudaSuccess);
    cr_assert_eq(bbemu_test_shared_bytes(s, out, 48 * 1024 + 4), cudaErrorInvalidValue);
    const char *msg = cudaGetErrorString(cudaErrorInvalidValue);
    cr_assert(strstr(msg, "shared_bytes_k") && strstr(msg, "cudaFuncSetAttribute"), "%s", msg);
    cr_assert_eq(cudaGetLastError(), cudaSuccess, "a launch refused is not sticky");
    cr_assert_eq(bbemu_test_allow_shared(64 * 1024), cudaSuccess);
    cr_assert_eq(bbemu_test_shared_bytes(s, out, 64 * 1024), cudaSuccess);
    cr_assert_eq(bbemu_test_allow_shared(227 * 1024 + 1), cudaErrorInvalidValue, "above 227 KiB");
    cr_assert_eq(cudaStreamSynchronize(s), cudaSuccess);
    int *h = to_host(out, 32);
    for (int i = 0; i < 32; i++) cr_assert_eq(h[i], 31 - i);
    free(h);
}

Test(cuda_emu, launch_configurations_beyond_cuda_s_limits_are_refused)
{
    cudaStream_t s = stream_on(0);
    int *out = device_ints(1);
    const struct {
        dim3 grid, block;
    } bad[] = {{{1, 1, 1}, {1025, 1, 1}}, {{1, 1, 1}, {32, 32, 2}}, {{1, 1, 1}, {1, 1, 65}},
               {{1, 65536, 1}, {32, 1, 1}}, {{0, 1, 1}, {32, 1, 1}}, {{1, 1, 1}, {0, 1, 1}}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_assert_eq(bbemu_test_configuration(s, out, bad[i].grid, bad[i].block), cudaErrorInvalidConfiguration,
                     "case %zu", i);
        cr_assert(strstr(cudaGetErrorString(cudaErrorInvalidConfiguration), "trivial_k"));
    }
    cr_assert_eq(bbemu_test_configuration(s, out, (dim3){2, 65535, 1}, (dim3){1, 1, 1}), cudaSuccess);
    cr_assert_eq(bbemu_test_configuration(s, out, (dim3){1, 1, 1}, (dim3){32, 32, 1}), cudaSuccess);
    cr_assert_eq(cudaStreamSynchronize(s), cudaSuccess, "refused launches are not sticky");
}

/* ---- memory ------------------------------------------------------------------- */
Test(cuda_emu, a_host_pointer_given_to_a_kernel_faults)
{
    cudaStream_t s = stream_on(0);
    int *host = calloc(64, sizeof *host);
    launched(bbemu_test_iota(s, host, 64, 1, 64), cudaErrorIllegalAddress);
    expect_fault_naming(s, cudaErrorIllegalAddress, "iota_k", "argument 1", "host memory", "not memory of cuda:0");
    free(host);
}

Test(cuda_emu, memory_of_another_device_given_to_a_kernel_faults)
{
    cr_assert_eq(cudaSetDevice(1), cudaSuccess);
    int *other = device_ints(64);
    cudaStream_t s = stream_on(0);
    launched(bbemu_test_iota(s, other, 64, 1, 64), cudaErrorIllegalAddress);
    expect_fault_naming(s, cudaErrorIllegalAddress, "iota_k", "allocation of cuda:1", "not memory of cuda:0");
    cr_assert_eq(cudaSetDevice(1), cudaSuccess);
    cr_assert_eq(cudaDeviceSynchronize(), cudaSuccess, "cuda:1 did not fail");
}

Test(cuda_emu, a_write_past_an_allocation_faults_at_once)
{
    cudaStream_t s = stream_on(0);
    int *p = device_ints(64); /* 256 bytes: they end where a guard page begins */
    launched(bbemu_test_iota(s, p, 65, 1, 128), cudaErrorIllegalAddress);
    expect_fault_naming(s, cudaErrorIllegalAddress, "iota_k", "illegal memory access",
                        "byte 256 of a 256-byte allocation of cuda:0");
}

Test(cuda_emu, a_write_into_an_allocation_s_slack_is_found_when_it_is_freed)
{
    cudaStream_t s = stream_on(0);
    int *p = device_ints(25); /* 100 bytes of a 256-byte slot */
    cr_assert_eq(bbemu_test_iota(s, p, 26, 1, 32), cudaSuccess);
    cr_assert_eq(cudaStreamSynchronize(s), cudaSuccess);
    cr_assert_eq(cudaFree(p), cudaErrorIllegalAddress);
    const char *msg = cudaGetErrorString(cudaErrorIllegalAddress);
    cr_assert(strstr(msg, "100-byte allocation") && strstr(msg, "up to 4 bytes past its end"), "%s", msg);
}

Test(cuda_emu, fresh_device_memory_is_poisoned_and_freed_memory_is_gone)
{
    int *p = device_ints(16), *h = to_host(p, 16);
    for (int i = 0; i < 16; i++) cr_assert_eq(h[i], -1, "cudaMalloc's memory is not zeroed: code must not rely on it");
    cr_assert_eq(cudaFree(p), cudaSuccess);
    cr_assert_eq(cudaMemcpy(h, p, 16 * sizeof *h, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
    const char *msg = cudaGetErrorString(cudaErrorInvalidValue);
    cr_assert(strstr(msg, "memory of cuda:0 that was freed"), "%s", msg);
    cr_assert_eq(cudaGetLastError(), cudaErrorInvalidValue, "the call's error, until it is read");
    cudaStream_t s = stream_on(0);
    launched(bbemu_test_iota(s, p, 16, 1, 16), cudaErrorIllegalAddress);
    expect_fault_naming(s, cudaErrorIllegalAddress, "iota_k", "argument 1", "a use after free");
    free(h);
}

Test(cuda_emu, a_copy_with_the_wrong_kind_is_refused)
{
    int *d = device_ints(4), h[4] = {0};
    cr_assert_eq(cudaMemcpy(d, h, sizeof h, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
    cr_assert(strstr(cudaGetErrorString(cudaErrorInvalidValue), "cudaMemcpyDeviceToHost"));
    cr_assert_eq(cudaMemcpy(h, d, 2 * sizeof h, cudaMemcpyDeviceToHost), cudaErrorInvalidValue, "past the end");
    cr_assert_eq(cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice), cudaSuccess);
}

Test(cuda_emu, memory_and_device_count_are_set_by_the_environment)
{
    setenv("BB_CUDA_EMU_DEVICES", "3", 1); /* before the process's first CUDA call */
    setenv("BB_CUDA_EMU_MEM", "64M", 1);
    int count = 0;
    cr_assert_eq(cudaGetDeviceCount(&count), cudaSuccess);
    cr_assert_eq(count, 3);
    size_t free_bytes, total;
    cr_assert_eq(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
    cr_assert_eq(total, (size_t)64 << 20);
    void *p, *q;
    cr_assert_eq(cudaMalloc(&p, (size_t)65 << 20), cudaErrorMemoryAllocation);
    cr_assert_eq(cudaGetLastError(), cudaErrorMemoryAllocation);
    cr_assert_eq(cudaGetLastError(), cudaSuccess, "out of memory is not sticky");
    cr_assert_eq(cudaMalloc(&q, (size_t)1 << 20), cudaSuccess);
    cr_assert_eq(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
    cr_assert_eq(free_bytes, ((size_t)63) << 20);
    cr_assert_eq(cudaFree(q), cudaSuccess);
    cr_assert_eq(cudaSetDevice(3), cudaErrorInvalidDevice);
}

/* ---- streams, events, stream-ordered memory --------------------------------------- */
static void nap(void *ctx) { usleep((useconds_t)(uintptr_t)ctx); }

Test(cuda_emu, streams_run_apart_and_events_order_them)
{
    enum { N = 1000 };
    cudaStream_t a = stream_on(0), b = stream_on(0);
    int *d = device_ints(N), *pinned;
    cr_assert_eq(cudaHostAlloc((void **)&pinned, N * sizeof *pinned, cudaHostAllocDefault), cudaSuccess);
    for (int round = 0; round < 2; round++) {
        bool ordered = round == 1;
        cr_assert_eq(cudaMemset(d, 0xff, N * sizeof *d), cudaSuccess);
        /* a is busy for 100 ms before it writes d; b copies d out */
        cr_assert_eq(bbemu_enqueue_host(a, "a nap", nap, NULL, (void *)(uintptr_t)100000, 1), cudaSuccess);
        cr_assert_eq(bbemu_test_iota(a, d, N, 4, 128), cudaSuccess);
        cudaEvent_t written;
        cr_assert_eq(cudaEventCreateWithFlags(&written, cudaEventDisableTiming), cudaSuccess);
        cr_assert_eq(cudaEventRecord(written, a), cudaSuccess);
        if (ordered) cr_assert_eq(cudaStreamWaitEvent(b, written, 0), cudaSuccess);
        cr_assert_eq(cudaMemcpyAsync(pinned, d, N * sizeof *d, cudaMemcpyDeviceToHost, b), cudaSuccess);
        cr_assert_eq(cudaStreamSynchronize(b), cudaSuccess);
        int right = 0;
        for (int i = 0; i < N; i++) right += pinned[i] == i;
        if (ordered) cr_assert_eq(right, N, "after cudaStreamWaitEvent the copy sees the kernel's writes");
        else cr_assert_eq(right, 0, "without the wait the copy ran first (b does not wait for a)");
        cr_assert_eq(cudaStreamSynchronize(a), cudaSuccess);
        cr_assert_eq(cudaEventDestroy(written), cudaSuccess);
    }
    cr_assert_eq(cudaFreeHost(pinned), cudaSuccess);
}

/* A capture records instead of running; a graph launch runs what was
 * captured, each time, with its captured arguments; an update keeps the
 * exec when the operations are the same, refuses another topology; the
 * capturing thread's waits and allocations are refused and spoil it. */
Test(cuda_emu, a_stream_capture_records_and_a_graph_replays_it)
{
    enum { N = 256 };
    cudaStream_t s = stream_on(0);
    int *d = device_ints(N), *pinned;
    cr_assert_eq(cudaHostAlloc((void **)&pinned, N * sizeof *pinned, cudaHostAllocDefault), cudaSuccess);
    cr_assert_eq(cudaMemset(d, 0, N * sizeof *d), cudaSuccess);
    cr_assert_eq(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    enum cudaStreamCaptureStatus st;
    cr_assert_eq(cudaStreamIsCapturing(s, &st), cudaSuccess);
    cr_assert_eq(st, cudaStreamCaptureStatusActive);
    cr_assert_eq(bbemu_test_iota(s, d, N, 2, 128), cudaSuccess);
    cr_assert_eq(cudaMemcpyAsync(pinned, d, N * sizeof *d, cudaMemcpyDeviceToHost, s), cudaSuccess);
    cudaGraph_t g, other;
    cr_assert_eq(cudaStreamEndCapture(s, &g), cudaSuccess);
    cr_assert_eq(cudaStreamSynchronize(s), cudaSuccess);
    int *h = to_host(d, N);
    cr_assert_eq(h[N - 1], 0, "a captured kernel ran before its graph was launched");
    free(h);
    cudaGraphExec_t x;
    cr_assert_eq(cudaGraphInstantiate(&x, g, 0), cudaSuccess);
    for (int round = 0; round < 2; round++) {
        memset(pinned, 0xff, N * sizeof *pinned);
        cr_assert_eq(cudaGraphLaunch(x, s), cudaSuccess);
        cr_assert_eq(cudaStreamSynchronize(s), cudaSuccess);
        int right = 0;
        for (int i = 0; i < N; i++) right += pinned[i] == i;
        cr_assert_eq(right, N, "launch %d: %d of %d", round, right, N);
    }
    /* the same operations update the exec; one kernel fewer is another topology */
    cudaGraphExecUpdateResultInfo info;
    cr_assert_eq(cudaGraphExecUpdate(x, g, &info), cudaSuccess);
    cr_assert_eq(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    cr_assert_eq(bbemu_test_iota(s, d, N, 2, 128), cudaSuccess);
    cr_assert_eq(cudaStreamEndCapture(s, &other), cudaSuccess);
    cr_assert_eq(cudaGraphExecUpdate(x, other, &info), cudaErrorGraphExecUpdateFailure);
    cr_assert_eq(info.result, cudaGraphExecUpdateErrorTopologyChanged);
    cudaGetLastError();
    /* a wait for the device while capturing: refused, and the capture is spoilt */
    cr_assert_eq(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    cr_assert_eq(cudaStreamSynchronize(s), cudaErrorStreamCaptureUnsupported);
    const char *why = cudaGetErrorString(cudaGetLastError());
    cr_assert(strstr(why, "cudaStreamSynchronize") && strstr(why, "captures"), "%s", why);
    void *p = NULL;
    cr_assert_eq(cudaMalloc(&p, 64), cudaErrorStreamCaptureUnsupported);
    cr_assert_eq(cudaStreamIsCapturing(s, &st), cudaSuccess);
    cr_assert_eq(st, cudaStreamCaptureStatusInvalidated);
    cudaGraph_t spoilt = (cudaGraph_t)1;
    cr_assert_eq(cudaStreamEndCapture(s, &spoilt), cudaErrorStreamCaptureInvalidated);
    cr_assert_null(spoilt);
    cudaGetLastError();
    cr_assert_eq(cudaStreamSynchronize(s), cudaSuccess, "after the capture the thread may wait again");
    cr_assert_eq(cudaGraphExecDestroy(x), cudaSuccess);
    cr_assert_eq(cudaGraphDestroy(g), cudaSuccess);
    cr_assert_eq(cudaGraphDestroy(other), cudaSuccess);
    cr_assert_eq(cudaFreeHost(pinned), cudaSuccess);
    cr_assert_eq(cudaFree(d), cudaSuccess);
}

Test(cuda_emu, stream_ordered_memory_is_freed_in_stream_order)
{
    cudaStream_t s = stream_on(0);
    int *p = NULL;
    cr_assert_eq(cudaMallocAsync((void **)&p, 64 * sizeof *p, s), cudaSuccess);
    cr_assert_eq(bbemu_test_iota(s, p, 64, 1, 64), cudaSuccess);
    cr_assert_eq(cudaFreeAsync(p, s), cudaSuccess);
    cr_assert_eq(cudaStreamSynchronize(s), cudaSuccess, "used before it was freed: fine");
    launched(bbemu_test_iota(s, p, 64, 1, 64), cudaErrorIllegalAddress);
    expect_fault_naming(s, cudaErrorIllegalAddress, "iota_k", "argument 1", "a use after free");
}

Test(cuda_emu, a_fault_on_one_device_leaves_the_others_running)
{
    cudaStream_t s = stream_on(0);
    launched(bbemu_test_iota(s, (int *)8, 64, 1, 64), cudaErrorIllegalAddress);
    expect_fault_naming(s, cudaErrorIllegalAddress, "iota_k");
    void *p;
    cr_assert_eq(cudaMalloc(&p, 16), cudaErrorIllegalAddress, "every call on the failed device returns its error");
    cudaStream_t t = stream_on(1);
    cr_assert_eq(cudaGetLastError(), cudaErrorIllegalAddress, "the thread's last error, from cuda:0's calls");
    int *q = device_ints(64);
    cr_assert_eq(bbemu_test_iota(t, q, 64, 1, 64), cudaSuccess);
    cr_assert_eq(cudaStreamSynchronize(t), cudaSuccess);
}

Test(cuda_emu, with_cuda_launch_blocking_the_launch_returns_its_fault)
{
    setenv("CUDA_LAUNCH_BLOCKING", "1", 1);
    cudaStream_t s = stream_on(0);
    cr_assert_eq(bbemu_test_iota(s, (int *)8, 64, 1, 64), cudaErrorIllegalAddress);
}

/* ---- the counters ------------------------------------------------------------------- */
Test(cuda_emu, the_counters_count_what_the_host_waits_for_and_what_moves)
{
    cudaStream_t s = stream_on(0);
    int *d = device_ints(100), *pinned, pageable[10];
    cr_assert_eq(cudaHostAlloc((void **)&pinned, 100 * sizeof *pinned, 0), cudaSuccess);
    cudaEvent_t e;
    cr_assert_eq(cudaEventCreate(&e), cudaSuccess);
    bbemu_counters a, b;
    bbemu_counters_get(&a);
    cr_assert_eq(cudaMemcpyAsync(d, pinned, 100 * sizeof *d, cudaMemcpyHostToDevice, s), cudaSuccess);
    cr_assert_eq(bbemu_test_iota(s, d, 100, 1, 128), cudaSuccess);
    cr_assert_eq(cudaMemcpyAsync(pageable, d, sizeof pageable, cudaMemcpyDeviceToHost, s), cudaSuccess); /* waits */
    cr_assert_eq(cudaEventRecord(e, s), cudaSuccess);
    cr_assert_eq(cudaEventSynchronize(e), cudaSuccess);
    cr_assert_eq(cudaStreamSynchronize(s), cudaSuccess);
    while (cudaStreamQuery(s) == cudaErrorNotReady) {
    }
    bbemu_counters_get(&b);
    cr_assert_eq(b.launches - a.launches, 1);
    cr_assert_eq(b.h2d_bytes - a.h2d_bytes, 400);
    cr_assert_eq(b.d2h_bytes - a.d2h_bytes, 40);
    cr_assert_eq(b.h2d_copies - a.h2d_copies, 1);
    cr_assert_eq(b.blocking_calls - a.blocking_calls, 1, "a copy into pageable memory waits for the stream");
    cr_assert_eq(b.event_syncs - a.event_syncs, 1);
    cr_assert_eq(b.stream_syncs - a.stream_syncs, 1);
    cr_assert_eq(b.polls - a.polls, 1, "the one query that found the stream done");
    cr_assert_eq(b.host_syncs - a.host_syncs, 4);
    for (int i = 0; i < 10; i++) cr_assert_eq(pageable[i], i);
    cr_assert_eq(cudaEventDestroy(e), cudaSuccess);
    cr_assert_eq(cudaFreeHost(pinned), cudaSuccess);
}

Test(cuda_emu, the_counters_are_written_at_exit)
{
    char *dir = tu_temp_dir(), *stats = tu_path(dir, "stats.json");
    setenv("BB_CUDA_EMU_STATS", stats, 1);
    tu_run r = tu_bigbatch("bench", "model", "--devices", "cuda:0", "--layers", "1", "--heads", "2", "--d-model", "16",
                           "--seq-len", "16", "--vocab", "32", "--micro-batch", "2", "--steps", "1");
    unsetenv("BB_CUDA_EMU_STATS");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    char *json = (char *)tu_read_file(stats, NULL);
    cr_log_info("%s", json);
    unsigned long long syncs = 0, launches = 0, h2d = 0, d2h = 0;
    cr_assert(sscanf(strstr(json, "\"host_syncs\":") ? strstr(json, "\"host_syncs\":") : "", "\"host_syncs\": %llu",
                     &syncs) == 1, "%s", json);
    cr_assert(sscanf(strstr(json, "\"launches\":") ? strstr(json, "\"launches\":") : "", "\"launches\": %llu",
                     &launches) == 1, "%s", json);
    cr_assert(sscanf(strstr(json, "\"h2d_bytes\":") ? strstr(json, "\"h2d_bytes\":") : "", "\"h2d_bytes\": %llu",
                     &h2d) == 1, "%s", json);
    cr_assert(sscanf(strstr(json, "\"d2h_bytes\":") ? strstr(json, "\"d2h_bytes\":") : "", "\"d2h_bytes\": %llu",
                     &d2h) == 1, "%s", json);
    cr_assert(syncs > 0 && launches > 0 && h2d > 0 && d2h > 0, "%s", json);
    free(json), tu_run_free(&r);
    tu_rm_tree(dir);
    free(stats), free(dir);
}

/* ---- NCCL in process ------------------------------------------------------------------ */
typedef struct clique {
    ncclComm_t comm[2];
    cudaStream_t stream[2];
    float *buf[2];
} clique;

static ncclResult_t settle(ncclComm_t c)
{
    ncclResult_t state = ncclInProgress;
    for (int i = 0; i < 100000 && state == ncclInProgress; i++) {
        cr_assert_eq(ncclCommGetAsyncError(c, &state), ncclSuccess);
        if (state == ncclInProgress) usleep(100);
    }
    return state;
}

/* Two non-blocking communicators, one per emulated GPU, made in one group. */
static clique two_gpus(void)
{
    clique q;
    ncclUniqueId id;
    cr_assert_eq(ncclGetUniqueId(&id), ncclSuccess);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    cr_assert_eq(ncclGroupStart(), ncclSuccess);
    for (int d = 0; d < 2; d++) {
        q.stream[d] = stream_on(d);
        cr_assert_eq(cudaMalloc((void **)&q.buf[d], 8 * sizeof(float)), cudaSuccess);
        ncclResult_t rc = ncclCommInitRankConfig(&q.comm[d], 2, id, d, &config);
        cr_assert(rc == ncclSuccess || rc == ncclInProgress, "%s", ncclGetErrorString(rc));
    }
    ncclResult_t rc = ncclGroupEnd();
    cr_assert(rc == ncclSuccess || rc == ncclInProgress, "%s", ncclGetErrorString(rc));
    for (int d = 0; d < 2; d++) cr_assert_eq(settle(q.comm[d]), ncclSuccess);
    return q;
}

Test(cuda_emu, nccl_all_reduces_across_two_gpus_in_order_on_their_streams)
{
    clique q = two_gpus();
    for (int d = 0; d < 2; d++) {
        float h[8];
        for (int i = 0; i < 8; i++) h[i] = (float)(10 * d + i);
        cr_assert_eq(cudaSetDevice(d), cudaSuccess);
        cr_assert_eq(cudaMemcpy(q.buf[d], h, sizeof h, cudaMemcpyHostToDevice), cudaSuccess);
        ncclResult_t rc = ncclAllReduce(q.buf[d], q.buf[d], 8, ncclFloat, ncclAvg, q.comm[d], q.stream[d]);
        cr_assert(rc == ncclSuccess || rc == ncclInProgress);
        cr_assert_eq(settle(q.comm[d]), ncclSuccess);
    }
    for (int d = 0; d < 2; d++) {
        float h[8];
        cr_assert_eq(cudaSetDevice(d), cudaSuccess);
        cr_assert_eq(cudaStreamSynchronize(q.stream[d]), cudaSuccess);
        cr_assert_eq(cudaMemcpy(h, q.buf[d], sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
        for (int i = 0; i < 8; i++) cr_assert_float_eq(h[i], 5.0f + i, 1e-6, "cuda:%d element %d", d, i);
    }
    /* ranks that ask for different things: both fail, naming both */
    for (int d = 0; d < 2; d++) {
        cr_assert_eq(cudaSetDevice(d), cudaSuccess);
        ncclAllReduce(q.buf[d], q.buf[d], 4 + (size_t)d, ncclFloat, ncclSum, q.comm[d], q.stream[d]);
    }
    for (int d = 0; d < 2; d++) {
        cr_assert_eq(cudaSetDevice(d), cudaSuccess);
        cr_assert_eq(cudaStreamSynchronize(q.stream[d]), cudaSuccess);
        cr_assert_eq(settle(q.comm[d]), ncclInvalidUsage, "cuda:%d", d);
        const char *why = ncclGetLastError(q.comm[d]);
        cr_assert(strstr(why, "4 elements") && strstr(why, "5 elements"), "%s", why);
        cr_assert_eq(ncclCommAbort(q.comm[d]), ncclSuccess);
    }
}

/* Each rank's 8 floats, 10·rank + i, on its buffer; the collective `call`
 * queued on every rank; then the first n floats of each rank's buffer. */
static void run_on_two(clique *q, ncclResult_t (*call)(clique *, int), float out[2][8], size_t n)
{
    for (int d = 0; d < 2; d++) {
        float h[8];
        for (int i = 0; i < 8; i++) h[i] = (float)(10 * d + i);
        cr_assert_eq(cudaSetDevice(d), cudaSuccess);
        cr_assert_eq(cudaMemcpy(q->buf[d], h, sizeof h, cudaMemcpyHostToDevice), cudaSuccess);
    }
    for (int d = 0; d < 2; d++) {
        cr_assert_eq(cudaSetDevice(d), cudaSuccess);
        ncclResult_t rc = call(q, d);
        cr_assert(rc == ncclSuccess || rc == ncclInProgress, "%s", ncclGetErrorString(rc));
        cr_assert_eq(settle(q->comm[d]), ncclSuccess);
    }
    for (int d = 0; d < 2; d++) {
        cr_assert_eq(cudaSetDevice(d), cudaSuccess);
        cr_assert_eq(cudaStreamSynchronize(q->stream[d]), cudaSuccess);
        cr_assert_eq(cudaMemcpy(out[d], q->buf[d], n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    }
}

static ncclResult_t broadcast_from_1(clique *q, int d)
{
    return ncclBroadcast(q->buf[d], q->buf[d], 8, ncclFloat, 1, q->comm[d], q->stream[d]);
}

/* In place, as NCCL has it: rank d's block of the sum lands in block d of its buffer. */
static ncclResult_t reduce_scatter(clique *q, int d)
{
    return ncclReduceScatter(q->buf[d], q->buf[d] + 4 * d, 4, ncclFloat, ncclSum, q->comm[d], q->stream[d]);
}

/* In place: every rank's block d gathered into every buffer. */
static ncclResult_t all_gather(clique *q, int d)
{
    return ncclAllGather(q->buf[d] + 4 * d, q->buf[d], 4, ncclFloat, q->comm[d], q->stream[d]);
}

Test(cuda_emu, nccl_broadcast_reduce_scatter_and_all_gather_give_nccl_s_results)
{
    clique q = two_gpus();
    float out[2][8];
    run_on_two(&q, broadcast_from_1, out, 8);
    for (int d = 0; d < 2; d++)
        for (int i = 0; i < 8; i++) cr_assert_float_eq(out[d][i], 10.0f + i, 0, "broadcast: cuda:%d element %d", d, i);
    run_on_two(&q, reduce_scatter, out, 8);
    for (int d = 0; d < 2; d++)
        for (int i = 0; i < 4; i++)
            cr_assert_float_eq(out[d][4 * d + i], 10.0f + 2 * (4 * d + i), 0, "reduce-scatter: cuda:%d element %d", d,
                               i);
    run_on_two(&q, all_gather, out, 8);
    for (int d = 0; d < 2; d++)
        for (int i = 0; i < 8; i++)
            cr_assert_float_eq(out[d][i], (float)(14 * (i / 4) + i % 4), 0, "all-gather: cuda:%d element %d", d, i);
    for (int d = 0; d < 2; d++) {
        cr_assert_eq(cudaSetDevice(d), cudaSuccess);
        ncclResult_t rc = ncclCommFinalize(q.comm[d]);
        cr_assert(rc == ncclSuccess || rc == ncclInProgress);
        cr_assert_eq(settle(q.comm[d]), ncclSuccess);
        cr_assert_eq(ncclCommDestroy(q.comm[d]), ncclSuccess);
    }
}

/* A rank whose peer never comes waits on its stream, as NCCL's kernel would
 * spin on the GPU, until its communicator is aborted. */
Test(cuda_emu, a_rank_whose_peer_never_comes_waits_until_aborted)
{
    clique q = two_gpus();
    cr_assert_eq(cudaSetDevice(0), cudaSuccess);
    ncclAllReduce(q.buf[0], q.buf[0], 8, ncclFloat, ncclSum, q.comm[0], q.stream[0]);
    usleep(200000);
    cr_assert_eq(cudaStreamQuery(q.stream[0]), cudaErrorNotReady, "rank 0 should still wait for rank 1");
    cr_assert_eq(ncclCommAbort(q.comm[0]), ncclSuccess);
    cr_assert_eq(cudaStreamSynchronize(q.stream[0]), cudaSuccess, "the abort frees the stream");
    cr_assert_eq(cudaSetDevice(1), cudaSuccess);
    cr_assert_eq(ncclCommAbort(q.comm[1]), ncclSuccess);
}

Test(cuda_emu, nccl_refuses_a_host_buffer)
{
    clique q = two_gpus();
    float host[8];
    cr_assert_eq(cudaSetDevice(0), cudaSuccess);
    cr_assert_eq(ncclAllReduce(host, host, 8, ncclFloat, ncclSum, q.comm[0], q.stream[0]), ncclInvalidArgument);
    cr_assert(strstr(ncclGetLastError(q.comm[0]), "not memory of cuda:0"), "%s", ncclGetLastError(q.comm[0]));
    for (int d = 0; d < 2; d++) ncclCommAbort(q.comm[d]);
}
#endif
