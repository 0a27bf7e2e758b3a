// memory.cpp — the emulated devices' memory (emu.h). Each device reserves
// an arena of address space (PROT_NONE). An allocation gets its own pages,
// ends at a page end (256-byte aligned) and is followed by a guard page, so
// that an access past its end faults at once; its slack is filled with
// canaries, checked when it is freed, and its bytes are poisoned (0xff:
// NaN, -1). A free makes the pages inaccessible and keeps them out of reuse
// until 1 GiB of others has been freed: a use after free faults. Pinned
// host memory is registered, so that copies and kernels tell it from
// pageable memory. Copies and memsets are checked as CUDA checks them.
#include <inttypes.h>
#include <string.h>
#include <sys/mman.h>

#include "emu.h"

namespace bbemu_rt {

namespace {

// The allocation holding p (one past its end counts: a pointer to the end
// of an array is a valid argument); under alloc_m.
const allocation *find_allocation(uintptr_t p)
{
    auto it = rt->allocs.upper_bound(p);
    if (it == rt->allocs.begin()) return nullptr;
    --it;
    const allocation &a = it->second;
    return p <= a.base + (a.kind == DEVICE_MEMORY ? a.data_bytes : a.map_bytes) ? &a : nullptr;
}

// How far before the start (*before) and past the end (*after) of its
// bytes the allocation's canaries were overwritten; false when they were.
bool canaries_intact(const allocation &a, size_t *before, size_t *after)
{
    const uint8_t *lead = (const uint8_t *)a.map, *tail = (const uint8_t *)(a.base + a.bytes);
    size_t lead_n = a.base - a.map, tail_n = a.data_bytes - a.bytes;
    *before = *after = 0;
    for (size_t i = 0; i < lead_n && !*before; i++)
        if (lead[i] != kCanary) *before = lead_n - i;
    for (size_t i = tail_n; i > 0 && !*after; i--)
        if (tail[i - 1] != kCanary) *after = i;
    return !*before && !*after;
}

// The copy's direction from what the pointers are (and CUDA's kind, checked against it).
cudaError_t copy_direction(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, mem_class *dc,
                           mem_class *sc, const char *call)
{
    int ddev = -1, sdev = -1;
    *dc = classify(dst, bytes, &ddev), *sc = classify(src, bytes, &sdev);
    if (*dc == BAD_RANGE || *sc == BAD_RANGE)
        return fail_with(cudaErrorInvalidValue, true, "%s of %zu bytes: the %s (%s) is shorter than that", call, bytes,
                         *dc == BAD_RANGE ? "destination" : "source", describe(*dc == BAD_RANGE ? dst : src).c_str());
    bool dd = *dc == ON_DEVICE, sd = *sc == ON_DEVICE;
    bool ok = kind == cudaMemcpyDefault || (kind == cudaMemcpyHostToDevice && dd && !sd) ||
              (kind == cudaMemcpyDeviceToHost && !dd && sd) || (kind == cudaMemcpyDeviceToDevice && dd && sd) ||
              (kind == cudaMemcpyHostToHost && !dd && !sd);
    if (!ok)
        return fail_with(cudaErrorInvalidValue, true, "%s(%s): the destination is %s and the source %s", call,
                         kind == cudaMemcpyHostToDevice   ? "cudaMemcpyHostToDevice"
                         : kind == cudaMemcpyDeviceToHost ? "cudaMemcpyDeviceToHost"
                         : kind == cudaMemcpyDeviceToDevice ? "cudaMemcpyDeviceToDevice"
                                                           : "cudaMemcpyHostToHost",
                         describe(dst).c_str(), describe(src).c_str());
    return cudaSuccess;
}

void count_copy(mem_class dc, mem_class sc, size_t bytes)
{
    counters &c = rt->c;
    if (dc == ON_DEVICE && sc != ON_DEVICE) c.h2d_bytes += bytes, c.h2d_copies++;
    else if (dc != ON_DEVICE && sc == ON_DEVICE) c.d2h_bytes += bytes, c.d2h_copies++;
    else if (dc == ON_DEVICE) c.d2d_bytes += bytes;
}

} // namespace

// What p is, in words ("host memory", "memory of cuda:1", ...).
std::string describe(const void *p)
{
    {
        std::lock_guard<std::mutex> l(rt->alloc_m);
        if (const allocation *a = find_allocation((uintptr_t)p)) {
            if (a->kind == PINNED_MEMORY) return "pinned host memory";
            return format("byte %zu of a %zu-byte allocation of cuda:%d", (size_t)((uintptr_t)p - a->base), a->bytes,
                          a->device);
        }
    }
    for (device_state *d : rt->dev) { // freed, and not yet reused
        std::lock_guard<std::mutex> l(d->arena_m);
        for (const auto &q : d->quarantine)
            if ((uintptr_t)p >= q.first && (uintptr_t)p < q.first + q.second)
                return format("memory of cuda:%d that was freed (a use after free)", d->index);
    }
    return "host memory (not from cudaMalloc)";
}

mem_class classify(const void *p, size_t n, int *dev)
{
    std::lock_guard<std::mutex> l(rt->alloc_m);
    const allocation *a = find_allocation((uintptr_t)p);
    if (!a) return PAGEABLE;
    size_t end = a->kind == DEVICE_MEMORY ? a->bytes : a->map_bytes;
    if ((uintptr_t)p + n > a->base + end) return BAD_RANGE;
    *dev = a->device;
    return a->kind == DEVICE_MEMORY ? ON_DEVICE : PINNED;
}

cudaError_t device_alloc(device_state *d, size_t bytes, void **out)
{
    runtime &r = *rt;
    size_t data = round_up(bytes ? bytes : 1, kAlign), pages = round_up(data, kPage), take = pages + kPage;
    if (d->used.load() + data > r.cfg.mem) {
        *out = nullptr;
        return fail_with(cudaErrorMemoryAllocation, false, "cuda:%d has %" PRIu64 " of %" PRIu64 " bytes free",
                         d->index, r.cfg.mem - d->used.load(), r.cfg.mem);
    }
    uintptr_t start = 0;
    {
        std::lock_guard<std::mutex> l(d->arena_m);
        for (auto it = d->free_ranges.begin(); it != d->free_ranges.end(); ++it)
            if (it->second >= take) {
                start = it->first;
                size_t rest = it->second - take;
                d->free_ranges.erase(it);
                if (rest) d->free_ranges[start + take] = rest;
                break;
            }
        if (!start && d->bump + take <= d->arena_end) start = d->bump, d->bump += take;
    }
    if (!start || mprotect((void *)start, pages, PROT_READ | PROT_WRITE) != 0) {
        *out = nullptr;
        return fail_with(cudaErrorMemoryAllocation, true, "cuda:%d: the emulator's address space is used up", d->index);
    }
    uintptr_t base = start + pages - data;
    memset((void *)start, kCanary, base - start);
    memset((void *)base, kPoison, bytes);
    memset((void *)(base + bytes), kCanary, data - bytes);
    d->used += data;
    {
        std::lock_guard<std::mutex> l(r.alloc_m);
        r.allocs[base] = allocation{base, bytes, data, d->index, DEVICE_MEMORY, start, pages};
    }
    *out = (void *)base;
    return cudaSuccess;
}

// Frees device memory now (its canaries checked): the pages become
// inaccessible and stay out of reuse until 1 GiB of others has been freed.
cudaError_t device_free(void *p)
{
    runtime &r = *rt;
    allocation a;
    {
        std::lock_guard<std::mutex> l(r.alloc_m);
        auto it = r.allocs.find((uintptr_t)p);
        if (it == r.allocs.end() || it->second.kind != DEVICE_MEMORY) return cudaErrorInvalidValue;
        a = it->second;
        r.allocs.erase(it);
    }
    device_state *d = r.dev[a.device];
    size_t before, after;
    if (!canaries_intact(a, &before, &after))
        set_sticky(d, cudaErrorIllegalAddress,
                   before ? format("the %zu-byte allocation at %p was written up to %zu bytes before its start (found "
                                   "when it was freed): something overran it", a.bytes, p, before)
                          : format("the %zu-byte allocation at %p was written up to %zu bytes past its end (found when "
                                   "it was freed): something overran it", a.bytes, p, after));
    madvise((void *)a.map, a.map_bytes, MADV_DONTNEED);
    mprotect((void *)a.map, a.map_bytes, PROT_NONE);
    d->used -= a.data_bytes;
    std::lock_guard<std::mutex> l(d->arena_m);
    d->quarantine.emplace_back(a.map, a.map_bytes + kPage);
    d->quarantined += a.map_bytes + kPage;
    while (d->quarantined > ((size_t)1 << 30) || d->quarantine.size() > 512) {
        auto q = d->quarantine.front();
        d->quarantine.pop_front();
        d->quarantined -= q.second;
        d->free_ranges[q.first] = q.second;
    }
    return cudaSuccess;
}

cudaError_t pinned_alloc(size_t bytes, void **out)
{
    runtime &r = R();
    size_t map = round_up(bytes ? bytes : 1, kPage);
    void *p = mmap(nullptr, map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return fail(cudaErrorMemoryAllocation);
    std::lock_guard<std::mutex> l(r.alloc_m);
    r.allocs[(uintptr_t)p] = allocation{(uintptr_t)p, bytes, map, -1, PINNED_MEMORY, (uintptr_t)p, map};
    *out = p;
    return cudaSuccess;
}

bool pinned_free(void *p)
{
    runtime &r = R();
    allocation a;
    {
        std::lock_guard<std::mutex> l(r.alloc_m);
        auto it = r.allocs.find((uintptr_t)p);
        if (it == r.allocs.end() || it->second.kind != PINNED_MEMORY) return false;
        a = it->second;
        r.allocs.erase(it);
    }
    munmap((void *)a.map, a.map_bytes);
    return true;
}

cudaError_t copy_on(stream_state *s, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, bool wait,
                    const char *call)
{
    if (!bytes) return cudaSuccess;
    mem_class dc, sc;
    cudaError_t e = copy_direction(dst, src, bytes, kind, &dc, &sc, call);
    if (e != cudaSuccess) return e;
    if (sc == PAGEABLE || dc == PAGEABLE) // staged or waited for: not a copy a graph can hold
        if (cudaError_t c = refuse_in_capture(format("%s with pageable memory", call).c_str())) return c;
    count_copy(dc, sc, bytes);
    std::string what = format("%s of %zu bytes", call, bytes);
    if (sc == PAGEABLE && dc == ON_DEVICE) { // staged at once, as CUDA stages pageable memory
        auto staged = std::make_shared<std::vector<uint8_t>>((const uint8_t *)src, (const uint8_t *)src + bytes);
        enqueue_work(s, what, [=] { memcpy(dst, staged->data(), bytes); });
    } else {
        enqueue_work(s, what, [=] { memcpy(dst, src, bytes); });
    }
    if (wait || (dc == PAGEABLE && sc == ON_DEVICE)) { // into pageable memory: returns when done
        wait_idle(s);
        rt->c.blocking_calls++;
    }
    return fail(sticky_of(s->dev));
}

cudaError_t memset_on(stream_state *s, void *dst, int value, size_t bytes, bool wait, const char *call)
{
    if (!bytes) return cudaSuccess;
    int dev = -1;
    mem_class c = classify(dst, bytes, &dev);
    if (c != ON_DEVICE)
        return fail_with(cudaErrorInvalidValue, true, "%s of %zu bytes at %p: that is %s", call, bytes, dst,
                         describe(dst).c_str());
    enqueue_work(s, format("%s of %zu bytes", call, bytes), [=] { memset(dst, value, bytes); });
    if (wait) {
        wait_idle(s);
        rt->c.blocking_calls++;
    }
    return fail(sticky_of(s->dev));
}

} // namespace bbemu_rt
