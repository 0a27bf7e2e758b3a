// emu.h — private to the emulated CUDA runtime (libbbcudaemu.so): the
// state its files share, and what each offers the others.
//
//   runtime.cpp   configuration, errors, the counters, the CUDA calls
//   memory.cpp    device and pinned memory: the arena, canaries, what a pointer is, copies
//   streams.cpp   streams (a thread each), their operations, the fault handler
//   kernels.cpp   launches, fibers, barriers and warp operations
//
// Everything here is internal (the library is built with hidden
// visibility; EXPORT marks the C entry points of cuda_runtime.h and
// cuda_emu.h). Locks: a stream's own mutex guards its queue; the runtime's
// alloc_m the allocation map, ev_m every event (and ev_cv wakes their
// waiters); none is held while an operation runs.
#ifndef BBEMU_EMU_H
#define BBEMU_EMU_H

#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <time.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_emu.h"
#include "cuda_runtime.h"

#if defined(__SANITIZE_ADDRESS__)
#define BBEMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BBEMU_ASAN 1
#endif
#endif

#define EXPORT extern "C" __attribute__((visibility("default")))

namespace bbemu_rt {

constexpr size_t kPage = 4096;
constexpr size_t kAlign = 256;                                       // cudaMalloc's alignment
constexpr size_t kSharedDefault = 48 * 1024, kSharedMax = 227 * 1024; // dynamic shared memory (sm_90)
constexpr uint8_t kPoison = 0xff, kCanary = 0xbe;

inline size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

inline int64_t now_ns()
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

inline uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

struct rng {
    uint64_t s;
    uint64_t next() { return s = mix(s); }
    uint32_t below(uint32_t n) { return (uint32_t)(((next() >> 32) * n) >> 32); }
};

std::string format(const char *fmt, va_list ap);
std::string format(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// ---- state ------------------------------------------------------------------------
// KERNEL:N[@D]: the N-th launch of KERNEL (on cuda:D; any device: -1).
struct kernel_trigger {
    std::string kernel;
    uint64_t at = 0;
    int device = -1;
    const char *var = "";
    // Counts this launch (of `name` on `device`, with the device's counter); true at the N-th.
    bool fires(const char *name, int device_index, std::atomic<uint64_t> &count) const;
    std::string text() const; // "BB_CUDA_EMU_FAULT=KERNEL:N@D"
};

struct config {
    int devices = 2;
    uint64_t mem = (uint64_t)8 << 30;
    uint64_t seed = 1;
    int driver = CUDART_VERSION; // BB_CUDA_EMU_DRIVER: the driver's CUDA version (older than the runtime: no device)
    unsigned delay_us = 0;
    int delay_only = -1;    // BB_CUDA_EMU_DELAY_ONLY: only each device's stream of this creation index waits; -1: all
    bool launch_blocking = false;
    std::string stats_file;
    kernel_trigger fault; // BB_CUDA_EMU_FAULT: that launch faults
    kernel_trigger hang;  // BB_CUDA_EMU_HANG: that launch never ends (a stalled GPU)
};

enum alloc_kind { DEVICE_MEMORY, PINNED_MEMORY };

struct allocation {
    uintptr_t base;
    size_t bytes, data_bytes; // asked for, rounded to 256
    int device;               // DEVICE_MEMORY
    alloc_kind kind;
    uintptr_t map;            // the pages (device: [map, map + map_bytes) holds base .. base + data_bytes)
    size_t map_bytes;
};

struct stream_state;

struct device_state {
    int index;
    std::atomic<int> sticky{cudaSuccess};
    std::mutex sticky_m;
    std::string sticky_detail;
    std::atomic<uint64_t> used{0};
    std::mutex arena_m;
    uintptr_t arena = 0, arena_end = 0, bump = 0;
    std::map<uintptr_t, size_t> free_ranges;          // reusable address space
    std::deque<std::pair<uintptr_t, size_t>> quarantine; // freed, kept inaccessible
    size_t quarantined = 0;
    std::mutex streams_m;
    std::vector<stream_state *> streams;
    std::vector<stream_state *> destroyed; // kept: a late wait on one returns at once
    int created = 0;                       // streams made on it (not the legacy one), under streams_m
    stream_state *legacy = nullptr;
    std::atomic<uint64_t> fault_launches{0}, hang_launches{0};
    std::atomic<uint64_t> enqueued{0}; // operations queued on its streams so far: the host's program order
};

struct event_state {
    int device;
    bool timing;
    uint64_t recorded = 0, completed = 0; // generations, under the runtime's event lock
    int64_t time_ns = 0;
    // Under the runtime's event lock: the stream of its last record and, when
    // a collective was queued there since the stream's record before, its
    // kind and the device's enqueued count when it was queued (the wait log).
    const stream_state *recorded_on = nullptr;
    std::string collective;
    uint64_t collective_at = 0;
};

struct item {
    enum kind_t { WORK, RECORD, WAIT_EVENT, WAIT_STREAM } kind = WORK;
    std::function<void()> work;
    std::string what;
    bool device_work = true;
    bool kernel = false; // a kernel launch (the graph counters)
    std::shared_ptr<event_state> event;
    uint64_t gen = 0;
    stream_state *other = nullptr;
    uint64_t position = 0;
};

struct stream_state {
    device_state *dev;
    bool blocking, legacy;
    int id, index; // index: the device's count of streams before it (-1: the legacy stream)
    std::mutex m;
    std::condition_variable cv;
    std::deque<item> q;
    uint64_t submitted = 0, completed = 0;
    bool destroyed = false;
    rng delay_rng;
    void *signal_stack = nullptr; // its thread's, for the fault handler
    // A stream capture (graphs.cpp), under m: the work recorded instead of
    // queued; invalid once something that cannot be recorded was asked.
    std::shared_ptr<std::vector<item>> capture;
    bool capture_invalid = false;
    // Under m: the last collective queued since the last event record (the
    // NCCL stand-in's work is named "nccl<Kind>"), for the wait log.
    std::string collective;
    uint64_t collective_at = 0;
};

struct counters {
    std::atomic<uint64_t> stream_syncs{0}, device_syncs{0}, event_syncs{0}, blocking_calls{0}, polls{0};
    std::atomic<uint64_t> launches{0}, blas_calls{0}, cub_calls{0}, nccl_calls{0};
    std::atomic<uint64_t> h2d_bytes{0}, d2h_bytes{0}, d2d_bytes{0}, h2d_copies{0}, d2h_copies{0};
    std::atomic<uint64_t> lt_epilogues{0};
    std::atomic<uint64_t> captured_launches{0}, graph_launches{0}, graph_kernels{0};
    std::mutex by_kernel_m;
    std::map<std::string, uint64_t> by_kernel; // launches of each kernel name
};

struct runtime {
    config cfg;
    std::mutex waits_m;
    std::vector<bbemu_collective_wait> waits; // bbemu_collective_waits
    std::vector<device_state *> dev;
    std::mutex alloc_m;
    std::map<uintptr_t, allocation> allocs; // by base
    std::mutex ev_m;
    std::condition_variable ev_cv;
    std::mutex attr_m;
    std::map<const void *, int> max_dynamic_shared;
    std::atomic<int> next_stream_id{0};
    counters c;
    struct sigaction old_segv, old_bus;
};

extern runtime *rt; // made at the first call, never freed: stream threads may outlive main
runtime &R();       // the runtime, made at the first call
extern thread_local int current_device;

// ---- runtime.cpp: errors ------------------------------------------------------------
// The call's error (also the thread's last error); fail_with keeps what the
// emulator knows of it for cudaGetErrorString (once), `loud` prints it too.
cudaError_t fail(cudaError_t e);
cudaError_t fail_with(cudaError_t e, bool loud, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
// A fault of work on device d: sticky, as on a GPU (the first one stays), printed.
void set_sticky(device_state *d, cudaError_t e, const std::string &detail);
inline cudaError_t sticky_of(device_state *d) { return (cudaError_t)d->sticky.load(); }
device_state *current();
// The call's stream (0: the current device's legacy one) and its device's sticky error.
cudaError_t check_stream(cudaStream_t h, stream_state **s);

// ---- memory.cpp -----------------------------------------------------------------------
enum mem_class { PAGEABLE, PINNED, ON_DEVICE, BAD_RANGE };
// What [p, p + n) is; *dev gets the device of ON_DEVICE (one past an
// allocation's end counts as in it, as a pointer to an array's end).
mem_class classify(const void *p, size_t n, int *dev);
std::string describe(const void *p); // in words: "byte 4 of a 64-byte allocation of cuda:1", ...
cudaError_t device_alloc(device_state *d, size_t bytes, void **out);
cudaError_t device_free(void *p);    // checks its canaries; cudaErrorInvalidValue: not an allocation
cudaError_t pinned_alloc(size_t bytes, void **out);
bool pinned_free(void *p);           // false: not pinned memory
// Copies and memsets, checked as CUDA checks them; `wait`: the host waits.
cudaError_t copy_on(stream_state *s, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, bool wait,
                    const char *call);
cudaError_t memset_on(stream_state *s, void *dst, int value, size_t bytes, bool wait, const char *call);

// ---- streams.cpp ------------------------------------------------------------------------
stream_state *new_stream(device_state *d, bool blocking, bool legacy);
stream_state *legacy_stream(device_state *d);
cudaError_t resolve(cudaStream_t h, stream_state **out);
uint64_t enqueue(stream_state *s, item &&it); // its position; with the legacy stream's implicit order
uint64_t enqueue_work(stream_state *s, const std::string &what, std::function<void()> fn, bool device_work = true);
uint64_t position_of(stream_state *s);
void wait_position(stream_state *s, uint64_t pos);
void wait_idle(stream_state *s);
void wait_device(device_state *d);
void install_fault_handler(); // SIGSEGV/SIGBUS in an operation: a sticky cudaErrorIllegalAddress
extern thread_local stream_state *running_stream; // the stream whose operation this thread runs

// ---- graphs.cpp -----------------------------------------------------------------------------
// Whether s records instead of queuing (under no lock: the capturing thread asks).
bool capturing(stream_state *s);
// cudaSuccess, or, when the calling thread captures a stream (not in
// Relaxed mode), the refusal of `call` (which would wait for the device or
// allocate): cudaErrorStreamCaptureUnsupported, the capture invalidated.
cudaError_t refuse_in_capture(const char *call);

// ---- kernels.cpp ----------------------------------------------------------------------------
struct launch_rec;
void run_kernel_item(launch_rec &L);
// A fault inside a kernel's fiber: noted in the signal handler (*thread:
// the CUDA thread, -1 outside a kernel), cleaned up after the jump back.
void note_fiber_fault(void *addr, int *thread, uint3 *block, bool *overflow);
void clean_after_fault();
void free_fiber_pool(); // the calling stream thread's, as it ends

} // namespace bbemu_rt

#endif
