// emu_api.cpp — the emulator's own calls (include/cuda_emu.h) for the
// libraries built on it (the emulated NCCL, cuBLAS and the tests): host
// work queued on a stream, which device a stream or a range is on, a failed
// operation's sticky error, named counts, the collective waits and kernel
// launches seen, the seed; and, when the library loads, where the emulated
// NCCL is. Built with runtime.cpp into libbbcudaemu.so.
#include <dlfcn.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "emu.h"

using namespace bbemu_rt;

EXPORT cudaError_t bbemu_enqueue_host(cudaStream_t stream, const char *what, void (*fn)(void *), void (*drop)(void *),
                                      void *ctx, int device_work)
{
    R();
    std::shared_ptr<void> guard(ctx, [drop](void *p) {
        if (drop) drop(p);
    });
    stream_state *s;
    cudaError_t e = check_stream(stream, &s);
    if (e != cudaSuccess) return e;
    enqueue_work(s, what, [fn, guard] { fn(guard.get()); }, device_work != 0);
    return cudaSuccess;
}

EXPORT int bbemu_stream_device(cudaStream_t stream)
{
    R();
    stream_state *s;
    if (resolve(stream, &s) != cudaSuccess) return -1;
    return s->dev->index;
}

EXPORT int bbemu_device_range(const void *p, size_t bytes, int device, const char **why)
{
    R();
    int dev = -1;
    mem_class c = classify(p, bytes, &dev);
    if (c == ON_DEVICE && dev == device) return 1;
    if (why) {
        thread_local std::string text;
        text = c == BAD_RANGE ? format("%zu bytes at %p run past %s", bytes, p, describe(p).c_str()) : describe(p);
        *why = text.c_str();
    }
    return 0;
}

EXPORT void bbemu_fail_operation(cudaError_t code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    std::string what = format(fmt, ap);
    va_end(ap);
    if (!running_stream) {
        fprintf(stderr, "cuda-emu: %s\n", what.c_str());
        return;
    }
    set_sticky(running_stream->dev, code, what);
}

EXPORT void bbemu_count(const char *counter, uint64_t n)
{
    counters &c = R().c;
    if (!strcmp(counter, "blas_calls")) c.blas_calls += n;
    else if (!strcmp(counter, "cub_calls")) c.cub_calls += n;
    else if (!strcmp(counter, "nccl_calls")) c.nccl_calls += n;
    else if (!strcmp(counter, "lt_epilogues")) c.lt_epilogues += n;
}

EXPORT size_t bbemu_collective_waits(bbemu_collective_wait *out, size_t cap)
{
    runtime &r = R();
    std::lock_guard<std::mutex> l(r.waits_m);
    for (size_t i = 0; out && i < cap && i < r.waits.size(); i++) out[i] = r.waits[i];
    return r.waits.size();
}

EXPORT void bbemu_collective_waits_clear(void)
{
    runtime &r = R();
    std::lock_guard<std::mutex> l(r.waits_m);
    r.waits.clear();
}

EXPORT uint64_t bbemu_kernel_launches(const char *prefix)
{
    counters &c = R().c;
    std::lock_guard<std::mutex> l(c.by_kernel_m);
    uint64_t n = 0;
    size_t len = strlen(prefix);
    for (const auto &k : c.by_kernel)
        if (!k.first.compare(0, len, prefix)) n += k.second;
    return n;
}

EXPORT uint64_t bbemu_seed(void) { return R().cfg.seed; }

// The reducer loads NCCL from BB_NCCL_LIBRARY (or libnccl.so.2): unless set,
// point it at the emulated NCCL beside this library.
__attribute__((constructor)) static void bbemu_point_at_nccl()
{
    Dl_info info;
    if (getenv("BB_NCCL_LIBRARY") || !dladdr((void *)&bbemu_point_at_nccl, &info) || !info.dli_fname) return;
    std::string path = info.dli_fname;
    size_t slash = path.rfind('/');
    path = (slash == std::string::npos ? std::string(".") : path.substr(0, slash)) + "/libnccl.so.2";
    if (access(path.c_str(), R_OK) == 0) setenv("BB_NCCL_LIBRARY", path.c_str(), 0);
}
