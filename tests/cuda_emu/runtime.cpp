// runtime.cpp — the emulated CUDA runtime's calls (include/cuda_runtime.h)
// and the emulator's own (include/cuda_emu.h): the configuration from the
// environment, errors as CUDA reports them (the call's, the thread's last,
// a device's sticky one, and what the emulator knows of each), devices,
// memory, streams and events, and the counters. The work is done by
// memory.cpp, streams.cpp and kernels.cpp (emu.h); cublas.cpp is the
// emulated cuBLAS; the rest of cuda_emu.h's calls (host work on a stream,
// checks, counts, the NCCL library's path) are emu_api.cpp's. Built with
// them into libbbcudaemu.so.
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "emu.h"

namespace bbemu_rt {

runtime *rt;
thread_local int current_device = 0;

std::string format(const char *fmt, va_list ap)
{
    char buf[2048];
    vsnprintf(buf, sizeof buf, fmt, ap);
    return buf;
}

std::string format(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    std::string s = format(fmt, ap);
    va_end(ap);
    return s;
}

namespace {

std::once_flag rt_once;
thread_local cudaError_t last_error = cudaSuccess;
thread_local std::string last_detail; // what the emulator knows of the last error (once)
thread_local cudaError_t last_detail_code = cudaSuccess;

[[noreturn]] void config_error(const char *var, const char *value, const char *what)
{
    fprintf(stderr, "cuda-emu: %s=%s: %s\n", var, value, what);
    exit(1);
}

uint64_t parse_bytes(const char *var, const char *s)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || v < 0) config_error(var, s, "not a number of bytes");
    switch (*end) {
    case 'K': case 'k': v *= 1024, end++; break;
    case 'M': case 'm': v *= 1024.0 * 1024, end++; break;
    case 'G': case 'g': v *= 1024.0 * 1024 * 1024, end++; break;
    default: break;
    }
    if (*end == 'i' || *end == 'B') end++;
    if (*end == 'B') end++;
    if (*end) config_error(var, s, "not a number of bytes (a suffix K, M or G may follow)");
    return (uint64_t)v;
}

long parse_int(const char *var, const char *s, long lo, long hi)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi)
        config_error(var, s, format("not a whole number from %ld to %ld", lo, hi).c_str());
    return v;
}

// VAR=KERNEL:N[@D] into *t (unset: t->at stays 0).
void read_trigger(const char *var, kernel_trigger *t)
{
    const char *v = getenv(var);
    if (!v || !*v) return;
    const char *colon = strchr(v, ':');
    if (!colon || colon == v) config_error(var, v, "not KERNEL:N or KERNEL:N@DEVICE");
    t->var = var;
    t->kernel.assign(v, colon);
    std::string rest = colon + 1;
    size_t at = rest.find('@');
    if (at != std::string::npos) {
        t->device = (int)parse_int(var, rest.substr(at + 1).c_str(), 0, 15);
        rest.resize(at);
    }
    t->at = (uint64_t)parse_int(var, rest.c_str(), 1, LONG_MAX);
}

void write_stats();

void init_runtime()
{
    rt = new runtime();
    config &c = rt->cfg;
    const char *v;
    if ((v = getenv("BB_CUDA_EMU_DEVICES")) && *v) c.devices = (int)parse_int("BB_CUDA_EMU_DEVICES", v, 0, 16);
    if ((v = getenv("BB_CUDA_EMU_MEM")) && *v) c.mem = parse_bytes("BB_CUDA_EMU_MEM", v);
    if ((v = getenv("BB_CUDA_EMU_DRIVER")) && *v) c.driver = (int)parse_int("BB_CUDA_EMU_DRIVER", v, 1000, 99999);
    if ((v = getenv("BB_CUDA_EMU_SEED")) && *v) c.seed = (uint64_t)parse_int("BB_CUDA_EMU_SEED", v, 0, LONG_MAX);
    if ((v = getenv("BB_CUDA_EMU_DELAY_US")) && *v)
        c.delay_us = (unsigned)parse_int("BB_CUDA_EMU_DELAY_US", v, 0, 1000000);
    if ((v = getenv("BB_CUDA_EMU_DELAY_ONLY")) && *v)
        c.delay_only = (int)parse_int("BB_CUDA_EMU_DELAY_ONLY", v, 0, 1000);
    if ((v = getenv("BB_CUDA_EMU_STATS")) && *v) c.stats_file = v;
    if ((v = getenv("CUDA_LAUNCH_BLOCKING")) && !strcmp(v, "1")) c.launch_blocking = true;
    read_trigger("BB_CUDA_EMU_FAULT", &c.fault);
    read_trigger("BB_CUDA_EMU_HANG", &c.hang);
    size_t arena = std::max<uint64_t>((uint64_t)4 * c.mem, (uint64_t)32 << 30);
    for (int i = 0; i < c.devices; i++) {
        device_state *d = new device_state();
        d->index = i;
        void *a = mmap(nullptr, arena, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (a == MAP_FAILED) {
            fprintf(stderr, "cuda-emu: cannot reserve %zu bytes of address space for cuda:%d\n", arena, i);
            exit(1);
        }
        d->arena = (uintptr_t)a, d->arena_end = d->arena + arena, d->bump = d->arena + kPage;
        rt->dev.push_back(d);
    }
    install_fault_handler();
    if (!c.stats_file.empty()) atexit(write_stats);
}

void fill_counters(bbemu_counters *o)
{
    counters &c = rt->c;
    o->stream_syncs = c.stream_syncs, o->device_syncs = c.device_syncs, o->event_syncs = c.event_syncs;
    o->blocking_calls = c.blocking_calls, o->polls = c.polls;
    o->host_syncs = o->stream_syncs + o->device_syncs + o->event_syncs + o->blocking_calls + o->polls;
    o->launches = c.launches, o->blas_calls = c.blas_calls, o->cub_calls = c.cub_calls, o->nccl_calls = c.nccl_calls;
    o->h2d_bytes = c.h2d_bytes, o->d2h_bytes = c.d2h_bytes, o->d2d_bytes = c.d2d_bytes;
    o->h2d_copies = c.h2d_copies, o->d2h_copies = c.d2h_copies;
    o->lt_epilogues = c.lt_epilogues;
    o->captured_launches = c.captured_launches, o->graph_launches = c.graph_launches;
    o->graph_kernels = c.graph_kernels;
}

// The counters as one JSON object, written whole (a temporary file renamed).
void write_stats()
{
    bbemu_counters o;
    fill_counters(&o);
    std::string tmp = rt->cfg.stats_file + ".tmp";
    FILE *f = fopen(tmp.c_str(), "w");
    if (!f) {
        fprintf(stderr, "cuda-emu: BB_CUDA_EMU_STATS: cannot write %s: %s\n", tmp.c_str(), strerror(errno));
        return;
    }
    fprintf(f,
            "{\"host_syncs\": %" PRIu64 ", \"stream_syncs\": %" PRIu64 ", \"device_syncs\": %" PRIu64
            ", \"event_syncs\": %" PRIu64 ", \"blocking_calls\": %" PRIu64 ", \"polls\": %" PRIu64
            ", \"launches\": %" PRIu64 ", \"blas_calls\": %" PRIu64 ", \"cub_calls\": %" PRIu64
            ", \"nccl_calls\": %" PRIu64 ", \"h2d_bytes\": %" PRIu64 ", \"d2h_bytes\": %" PRIu64
            ", \"d2d_bytes\": %" PRIu64 ", \"h2d_copies\": %" PRIu64 ", \"d2h_copies\": %" PRIu64
            ", \"lt_epilogues\": %" PRIu64 ", \"captured_launches\": %" PRIu64 ", \"graph_launches\": %" PRIu64
            ", \"graph_kernels\": %" PRIu64 "}\n",
            o.host_syncs, o.stream_syncs, o.device_syncs, o.event_syncs, o.blocking_calls, o.polls, o.launches,
            o.blas_calls, o.cub_calls, o.nccl_calls, o.h2d_bytes, o.d2h_bytes, o.d2d_bytes, o.h2d_copies,
            o.d2h_copies, o.lt_epilogues, o.captured_launches, o.graph_launches, o.graph_kernels);
    if (fclose(f) != 0 || rename(tmp.c_str(), rt->cfg.stats_file.c_str()) != 0) {
        fprintf(stderr, "cuda-emu: BB_CUDA_EMU_STATS: cannot write %s: %s\n", rt->cfg.stats_file.c_str(),
                strerror(errno));
        unlink(tmp.c_str());
    }
}

// CUDA's name and text of each error the emulator gives.
const struct {
    cudaError_t code;
    const char *name, *text;
} kErrors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
    {cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction", "invalid device function"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorIllegalState, "cudaErrorIllegalState", "the operation cannot be performed in the present state"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources", "too many resources requested for launch"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
    {cudaErrorStreamCaptureWrongThread, "cudaErrorStreamCaptureWrongThread",
     "attempt to terminate a thread-local capture sequence from another thread"},
    {cudaErrorGraphExecUpdateFailure, "cudaErrorGraphExecUpdateFailure",
     "the graph update was not performed because it included changes which violated constraints specific to "
     "instantiated graph update"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

const char *error_name(cudaError_t e)
{
    for (const auto &x : kErrors)
        if (x.code == e) return x.name;
    return "cudaErrorUnknown";
}

const char *error_string(cudaError_t e)
{
    for (const auto &x : kErrors)
        if (x.code == e) return x.text;
    return "unknown error";
}

// Every call on a device begins here: the device, and its sticky error.
cudaError_t enter(device_state **out)
{
    device_state *d = current();
    *out = d;
    if (!d) return fail(R().dev.empty() ? cudaErrorNoDevice : cudaErrorInvalidDevice);
    return fail(sticky_of(d));
}

struct bbemu_event_handle {
    std::shared_ptr<event_state> s;
};

event_state *ev(cudaEvent_t e) { return reinterpret_cast<bbemu_event_handle *>(e)->s.get(); }

// The current device, without making the runtime (NULL before its first call).
device_state *current_if_made()
{
    return rt && current_device >= 0 && current_device < (int)rt->dev.size() ? rt->dev[current_device] : nullptr;
}

} // namespace

bool kernel_trigger::fires(const char *name, int device_index, std::atomic<uint64_t> &count) const
{
    if (!at || (device >= 0 && device != device_index)) return false;
    size_t n = strcspn(name, "<");
    return kernel.size() == n && !strncmp(name, kernel.c_str(), n) && ++count == at;
}

std::string kernel_trigger::text() const
{
    return format("%s=%s:%" PRIu64 "%s", var, kernel.c_str(), at, device >= 0 ? format("@%d", device).c_str() : "");
}

runtime &R()
{
    std::call_once(rt_once, init_runtime);
    return *rt;
}

cudaError_t fail(cudaError_t e)
{
    if (e != cudaSuccess) last_error = e;
    return e;
}

cudaError_t fail_with(cudaError_t e, bool loud, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    last_detail = format(fmt, ap);
    va_end(ap);
    last_detail_code = e;
    if (loud) fprintf(stderr, "cuda-emu: %s\n", last_detail.c_str());
    return fail(e);
}

void set_sticky(device_state *d, cudaError_t e, const std::string &detail)
{
    {
        std::lock_guard<std::mutex> l(d->sticky_m);
        int ok = cudaSuccess;
        if (d->sticky.compare_exchange_strong(ok, e)) d->sticky_detail = detail;
    }
    fprintf(stderr, "cuda-emu: cuda:%d: %s\n", d->index, detail.c_str());
}

device_state *current()
{
    runtime &r = R();
    if (current_device < 0 || current_device >= (int)r.dev.size()) return nullptr;
    return r.dev[current_device];
}

cudaError_t check_stream(cudaStream_t h, stream_state **s)
{
    cudaError_t e = resolve(h, s);
    return fail(e != cudaSuccess ? e : sticky_of((*s)->dev));
}

} // namespace bbemu_rt

using namespace bbemu_rt;

// ---- the CUDA runtime's calls ------------------------------------------------------------------
EXPORT cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    device_state *d = current_if_made();
    if (e == cudaSuccess && d) e = sticky_of(d);
    return e;
}

EXPORT cudaError_t cudaPeekAtLastError(void)
{
    device_state *d = current_if_made();
    return last_error != cudaSuccess ? last_error : d ? sticky_of(d) : cudaSuccess;
}

// CUDA's text, and what the emulator knows of the error (once for a call's
// error, always for the current device's sticky one).
EXPORT const char *cudaGetErrorString(cudaError_t e)
{
    thread_local std::string text;
    std::string detail;
    if (e == last_detail_code && !last_detail.empty()) {
        detail = last_detail;
        last_detail.clear();
        last_detail_code = cudaSuccess;
    } else if (rt && current_device >= 0 && current_device < (int)rt->dev.size() &&
               sticky_of(rt->dev[current_device]) == e) {
        std::lock_guard<std::mutex> l(rt->dev[current_device]->sticky_m);
        detail = rt->dev[current_device]->sticky_detail;
    }
    if (detail.empty()) return error_string(e);
    text = format("%s (cuda-emu: %s)", error_string(e), detail.c_str());
    return text.c_str();
}

EXPORT const char *cudaGetErrorName(cudaError_t e) { return error_name(e); }

EXPORT cudaError_t cudaRuntimeGetVersion(int *v)
{
    *v = CUDART_VERSION;
    return cudaSuccess;
}

EXPORT cudaError_t cudaDriverGetVersion(int *v)
{
    *v = R().cfg.driver;
    return cudaSuccess;
}

EXPORT cudaError_t cudaGetDeviceCount(int *count)
{
    runtime &r = R();
    *count = 0;
    if (r.cfg.driver < CUDART_VERSION) return fail(cudaErrorInsufficientDriver); // as a real runtime on an old driver
    *count = (int)r.dev.size();
    return *count ? cudaSuccess : fail(cudaErrorNoDevice);
}

EXPORT cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int device)
{
    runtime &r = R();
    if (device < 0 || device >= (int)r.dev.size()) return fail(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "bigbatch emulated GPU (on the CPU)");
    p->totalGlobalMem = r.cfg.mem;
    p->sharedMemPerBlock = kSharedDefault, p->sharedMemPerBlockOptin = kSharedMax;
    p->warpSize = 32, p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024, p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 0x7fffffff, p->maxGridSize[1] = p->maxGridSize[2] = 65535;
    p->major = 9, p->minor = 0, p->multiProcessorCount = 132;
    return cudaSuccess;
}

EXPORT cudaError_t cudaSetDevice(int device)
{
    runtime &r = R();
    if (device < 0 || device >= (int)r.dev.size())
        return fail(r.dev.empty() ? cudaErrorNoDevice : cudaErrorInvalidDevice);
    current_device = device;
    return cudaSuccess;
}

EXPORT cudaError_t cudaGetDevice(int *device)
{
    R();
    *device = current_device;
    return cudaSuccess;
}

EXPORT cudaError_t cudaDeviceSynchronize(void)
{
    if (cudaError_t c = refuse_in_capture("cudaDeviceSynchronize")) return c;
    device_state *d;
    cudaError_t e = enter(&d);
    if (e != cudaSuccess) return e;
    wait_device(d);
    rt->c.device_syncs++;
    return fail(sticky_of(d));
}

EXPORT cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    device_state *d;
    cudaError_t e = enter(&d);
    if (e != cudaSuccess) return e;
    *total_bytes = rt->cfg.mem;
    *free_bytes = rt->cfg.mem - d->used.load();
    return cudaSuccess;
}

EXPORT cudaError_t cudaMalloc(void **ptr, size_t bytes)
{
    if (cudaError_t c = refuse_in_capture("cudaMalloc")) return c;
    device_state *d;
    *ptr = nullptr;
    cudaError_t e = enter(&d);
    return e != cudaSuccess ? e : device_alloc(d, bytes, ptr);
}

// cudaFree synchronizes the device, as CUDA's does.
EXPORT cudaError_t cudaFree(void *ptr)
{
    if (cudaError_t c = refuse_in_capture("cudaFree")) return c;
    runtime &r = R();
    if (!ptr) return cudaSuccess;
    int dev = -1;
    if (classify(ptr, 0, &dev) != ON_DEVICE)
        return fail_with(cudaErrorInvalidValue, true, "cudaFree(%p): that is %s", ptr, describe(ptr).c_str());
    wait_device(r.dev[dev]);
    r.c.blocking_calls++;
    if (device_free(ptr) != cudaSuccess)
        return fail_with(cudaErrorInvalidValue, true, "cudaFree(%p): not the start of an allocation (%s)", ptr,
                         describe(ptr).c_str());
    return fail(sticky_of(r.dev[dev]));
}

EXPORT cudaError_t cudaMallocAsync(void **ptr, size_t bytes, cudaStream_t stream)
{
    if (cudaError_t c = refuse_in_capture("cudaMallocAsync")) return c;
    stream_state *s;
    *ptr = nullptr;
    cudaError_t e = check_stream(stream, &s);
    return e != cudaSuccess ? e : device_alloc(s->dev, bytes, ptr);
}

// Freed when the stream gets there.
EXPORT cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream)
{
    if (cudaError_t c = refuse_in_capture("cudaFreeAsync")) return c;
    stream_state *s;
    cudaError_t e = check_stream(stream, &s);
    if (e != cudaSuccess || !ptr) return e;
    int dev = -1;
    if (classify(ptr, 0, &dev) != ON_DEVICE || dev != s->dev->index)
        return fail_with(cudaErrorInvalidValue, true, "cudaFreeAsync(%p) on a stream of cuda:%d: that is %s", ptr,
                         s->dev->index, describe(ptr).c_str());
    enqueue_work(s, "cudaFreeAsync", [ptr] { device_free(ptr); }, false);
    return cudaSuccess;
}

EXPORT cudaError_t cudaHostAlloc(void **ptr, size_t bytes, unsigned int flags)
{
    if (cudaError_t c = refuse_in_capture("cudaHostAlloc")) return c;
    R();
    *ptr = nullptr;
    if (flags & ~(unsigned)(cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined))
        return fail_with(cudaErrorInvalidValue, true, "cudaHostAlloc: flags 0x%x", flags);
    return pinned_alloc(bytes, ptr);
}

EXPORT cudaError_t cudaMallocHost(void **ptr, size_t bytes) { return cudaHostAlloc(ptr, bytes, 0); }

// Synchronizes every device (pinned memory may be in use by any of them).
EXPORT cudaError_t cudaFreeHost(void *ptr)
{
    if (cudaError_t c = refuse_in_capture("cudaFreeHost")) return c;
    runtime &r = R();
    if (!ptr) return cudaSuccess;
    int dev;
    if (classify(ptr, 0, &dev) != PINNED)
        return fail_with(cudaErrorInvalidValue, true, "cudaFreeHost(%p): that is %s", ptr, describe(ptr).c_str());
    for (device_state *d : r.dev) wait_device(d);
    r.c.blocking_calls++;
    return pinned_free(ptr) ? cudaSuccess : fail(cudaErrorInvalidValue);
}

EXPORT cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind)
{
    if (cudaError_t c = refuse_in_capture("cudaMemcpy")) return c;
    device_state *d;
    cudaError_t e = enter(&d);
    return e != cudaSuccess ? e : copy_on(legacy_stream(d), dst, src, bytes, kind, true, "cudaMemcpy");
}

EXPORT cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream)
{
    stream_state *s;
    cudaError_t e = check_stream(stream, &s);
    return e != cudaSuccess ? e : copy_on(s, dst, src, bytes, kind, false, "cudaMemcpyAsync");
}

EXPORT cudaError_t cudaMemset(void *dst, int value, size_t bytes)
{
    if (cudaError_t c = refuse_in_capture("cudaMemset")) return c;
    device_state *d;
    cudaError_t e = enter(&d);
    return e != cudaSuccess ? e : memset_on(legacy_stream(d), dst, value, bytes, true, "cudaMemset");
}

EXPORT cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t stream)
{
    stream_state *s;
    cudaError_t e = check_stream(stream, &s);
    return e != cudaSuccess ? e : memset_on(s, dst, value, bytes, false, "cudaMemsetAsync");
}

EXPORT cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags)
{
    device_state *d;
    cudaError_t e = enter(&d);
    if (e != cudaSuccess) return e;
    if (flags & ~(unsigned)cudaStreamNonBlocking)
        return fail_with(cudaErrorInvalidValue, true, "cudaStreamCreateWithFlags: flags 0x%x", flags);
    *stream = reinterpret_cast<cudaStream_t>(new_stream(d, !(flags & cudaStreamNonBlocking), false));
    return cudaSuccess;
}

EXPORT cudaError_t cudaStreamCreate(cudaStream_t *stream) { return cudaStreamCreateWithFlags(stream, 0); }

// As CUDA: returns at once; the stream's work still runs, then it goes.
EXPORT cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    if (!stream) return fail(cudaErrorInvalidResourceHandle);
    stream_state *s = reinterpret_cast<stream_state *>(stream);
    std::lock_guard<std::mutex> l(s->m);
    s->destroyed = true;
    s->cv.notify_all();
    return cudaSuccess;
}

EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    if (cudaError_t c = refuse_in_capture("cudaStreamSynchronize")) return c;
    stream_state *s;
    cudaError_t e = resolve(stream, &s);
    if (e != cudaSuccess) return fail(e);
    wait_idle(s);
    rt->c.stream_syncs++;
    return fail(sticky_of(s->dev));
}

EXPORT cudaError_t cudaStreamQuery(cudaStream_t stream)
{
    if (cudaError_t c = refuse_in_capture("cudaStreamQuery")) return c;
    stream_state *s;
    cudaError_t e = check_stream(stream, &s);
    if (e != cudaSuccess) return e;
    std::lock_guard<std::mutex> l(s->m);
    if (s->completed < s->submitted) return cudaErrorNotReady;
    rt->c.polls++;
    return cudaSuccess;
}

EXPORT cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    stream_state *s;
    cudaError_t e = check_stream(stream, &s);
    if (e != cudaSuccess) return e;
    if (!event || flags) return fail(cudaErrorInvalidValue);
    item it;
    it.kind = item::WAIT_EVENT;
    it.event = reinterpret_cast<bbemu_event_handle *>(event)->s;
    bbemu_collective_wait logged = {};
    {
        std::lock_guard<std::mutex> l(rt->ev_m);
        it.gen = it.event->recorded;
        if (it.gen && !it.event->collective.empty() && it.event->recorded_on != s) {
            logged.device = s->dev->index;
            snprintf(logged.kind, sizeof logged.kind, "%s", it.event->collective.c_str());
            logged.issued_at = it.event->collective_at, logged.waited_at = s->dev->enqueued;
        }
    }
    if (!it.gen) return cudaSuccess; // never recorded: nothing to wait for
    if (logged.kind[0]) {
        std::lock_guard<std::mutex> l(rt->waits_m);
        rt->waits.push_back(logged);
    }
    it.what = "cudaStreamWaitEvent";
    enqueue(s, std::move(it));
    return cudaSuccess;
}

EXPORT cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    device_state *d;
    cudaError_t e = enter(&d);
    if (e != cudaSuccess) return e;
    if (flags & ~(unsigned)(cudaEventBlockingSync | cudaEventDisableTiming))
        return fail_with(cudaErrorInvalidValue, true, "cudaEventCreateWithFlags: flags 0x%x", flags);
    bbemu_event_handle *h = new bbemu_event_handle();
    h->s = std::make_shared<event_state>();
    h->s->device = d->index, h->s->timing = !(flags & cudaEventDisableTiming);
    *event = reinterpret_cast<cudaEvent_t>(h);
    return cudaSuccess;
}

EXPORT cudaError_t cudaEventCreate(cudaEvent_t *event) { return cudaEventCreateWithFlags(event, 0); }

EXPORT cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    if (!event) return fail(cudaErrorInvalidResourceHandle);
    delete reinterpret_cast<bbemu_event_handle *>(event); // queued records and waits keep their state
    return cudaSuccess;
}

EXPORT cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    stream_state *s;
    cudaError_t e = check_stream(stream, &s);
    if (e != cudaSuccess) return e;
    if (!event) return fail(cudaErrorInvalidResourceHandle);
    item it;
    it.kind = item::RECORD;
    it.event = reinterpret_cast<bbemu_event_handle *>(event)->s;
    if (it.event->device != s->dev->index)
        return fail_with(cudaErrorInvalidResourceHandle, true,
                         "cudaEventRecord: an event of cuda:%d recorded on a stream of cuda:%d", it.event->device,
                         s->dev->index);
    std::string collective;
    uint64_t collective_at = 0;
    {
        std::lock_guard<std::mutex> l(s->m);
        collective.swap(s->collective), collective_at = s->collective_at;
    }
    {
        std::lock_guard<std::mutex> l(rt->ev_m);
        it.gen = ++it.event->recorded;
        it.event->recorded_on = s, it.event->collective = collective, it.event->collective_at = collective_at;
    }
    it.what = "cudaEventRecord";
    enqueue(s, std::move(it));
    return cudaSuccess;
}

EXPORT cudaError_t cudaEventQuery(cudaEvent_t event)
{
    if (cudaError_t c = refuse_in_capture("cudaEventQuery")) return c;
    if (!event) return fail(cudaErrorInvalidResourceHandle);
    event_state *x = ev(event);
    {
        std::lock_guard<std::mutex> l(rt->ev_m);
        if (x->completed < x->recorded) return cudaErrorNotReady;
    }
    rt->c.polls++;
    return fail(sticky_of(rt->dev[x->device]));
}

EXPORT cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    if (cudaError_t c = refuse_in_capture("cudaEventSynchronize")) return c;
    if (!event) return fail(cudaErrorInvalidResourceHandle);
    event_state *x = ev(event);
    {
        std::unique_lock<std::mutex> l(rt->ev_m);
        uint64_t target = x->recorded;
        rt->ev_cv.wait(l, [&] { return x->completed >= target; });
    }
    rt->c.event_syncs++;
    return fail(sticky_of(rt->dev[x->device]));
}

EXPORT cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    if (!start || !end) return fail(cudaErrorInvalidResourceHandle);
    event_state *a = ev(start), *b = ev(end);
    if (!a->timing || !b->timing)
        return fail_with(cudaErrorInvalidResourceHandle, false, "cudaEventElapsedTime: an event made with "
                         "cudaEventDisableTiming");
    std::lock_guard<std::mutex> l(rt->ev_m);
    if (!a->recorded || !b->recorded)
        return fail_with(cudaErrorInvalidResourceHandle, false, "cudaEventElapsedTime: an event never recorded");
    if (a->completed < a->recorded || b->completed < b->recorded) return fail(cudaErrorNotReady);
    *ms = (float)((double)(b->time_ns - a->time_ns) / 1e6);
    return cudaSuccess;
}

// ---- cuda_emu.h ----------------------------------------------------------------------------------
EXPORT void bbemu_counters_get(bbemu_counters *out)
{
    R();
    fill_counters(out);
}
