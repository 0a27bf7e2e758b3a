// streams.cpp — the emulated streams (emu.h): a queue and a thread each,
// which runs its operations in order — kernels, copies, memsets, cuBLAS
// calls, CUB's algorithms, collectives, event records and waits. Nothing
// runs when it is queued, so a missing wait or a buffer reused before its
// copy ran shows. A fault (SIGSEGV or SIGBUS) while a stream runs an
// operation ends that operation with a sticky cudaErrorIllegalAddress on
// its device, naming it and what the address was.
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <thread>

#include "emu.h"

namespace bbemu_rt {

thread_local stream_state *running_stream;

namespace {

thread_local sigjmp_buf *fault_guard; // set while this stream thread runs an operation
thread_local void *fault_address;     // what the last fault hit, and where
thread_local int fault_thread = -1;   // the CUDA thread (-1: not in a kernel)
thread_local uint3 fault_block;
thread_local bool fault_overflow;

uint64_t push(stream_state *s, item &&it)
{
    std::lock_guard<std::mutex> l(s->m);
    if (s->capture) { // recorded, not queued; a wait or an event cannot be part of a graph here
        if (it.kind == item::WORK) s->capture->push_back(std::move(it));
        else s->capture_invalid = true;
        return s->submitted;
    }
    uint64_t at = ++s->dev->enqueued;
    if (it.kind == item::WORK && it.what.compare(0, 4, "nccl") == 0) s->collective = it.what.substr(4), s->collective_at = at;
    s->q.push_back(std::move(it));
    s->cv.notify_all();
    return ++s->submitted;
}

void execute(stream_state *s, item &it)
{
    switch (it.kind) {
    case item::RECORD: {
        std::lock_guard<std::mutex> l(rt->ev_m);
        it.event->completed = it.gen;
        it.event->time_ns = now_ns();
        rt->ev_cv.notify_all();
        return;
    }
    case item::WAIT_EVENT: {
        std::unique_lock<std::mutex> l(rt->ev_m);
        rt->ev_cv.wait(l, [&] { return it.event->completed >= it.gen; });
        return;
    }
    case item::WAIT_STREAM: wait_position(it.other, it.position); return;
    case item::WORK: break;
    }
    if (it.device_work && sticky_of(s->dev) != cudaSuccess) return; // a failed device runs nothing more
    sigjmp_buf jb;
    running_stream = s;
    if (sigsetjmp(jb, 1) == 0) {
        fault_guard = &jb;
        it.work();
        fault_guard = nullptr;
    } else {
        fault_guard = nullptr;
        clean_after_fault();
        set_sticky(s->dev, cudaErrorIllegalAddress,
                   fault_thread >= 0
                       ? format("%s, block (%u,%u,%u), thread %d: %s", it.what.c_str(), fault_block.x, fault_block.y,
                                fault_block.z, fault_thread,
                                fault_overflow ? "overflowed its emulated stack (256 KiB)"
                                               : format("an illegal memory access at %p (%s)", fault_address,
                                                        describe(fault_address).c_str()).c_str())
                       : format("%s: an illegal memory access at %p (%s)", it.what.c_str(), fault_address,
                                describe(fault_address).c_str()));
    }
}

void stream_main(stream_state *s)
{
    // The fault handler runs on its own stack: a fiber that overflows its stack is reported too.
    stack_t alt;
    alt.ss_sp = s->signal_stack = malloc(1 << 16);
    alt.ss_size = 1 << 16;
    alt.ss_flags = 0;
    sigaltstack(&alt, nullptr);
    for (;;) {
        item *it;
        {
            std::unique_lock<std::mutex> l(s->m);
            s->cv.wait(l, [&] { return !s->q.empty() || s->destroyed; });
            if (s->q.empty()) break;
            it = &s->q.front(); // references into a deque stay valid while it grows at the back
        }
        if (rt->cfg.delay_us && (rt->cfg.delay_only < 0 || s->index == rt->cfg.delay_only))
            usleep(s->delay_rng.below(rt->cfg.delay_us + 1));
        execute(s, *it);
        std::lock_guard<std::mutex> l(s->m);
        s->q.pop_front();
        s->completed++;
        s->cv.notify_all();
    }
    {
        std::lock_guard<std::mutex> l(s->dev->streams_m);
        auto &v = s->dev->streams;
        for (size_t i = 0; i < v.size(); i++)
            if (v[i] == s) v.erase(v.begin() + (long)i);
        s->dev->destroyed.push_back(s);
    }
    free_fiber_pool();
    alt.ss_flags = SS_DISABLE;
    sigaltstack(&alt, nullptr);
    free(alt.ss_sp);
    s->signal_stack = nullptr;
}

// SIGSEGV and SIGBUS: in an operation a stream runs, the operation ends
// (back to execute(), which makes it a sticky cudaErrorIllegalAddress);
// anywhere else, the handler that was there before, or the default.
void on_fault(int sig, siginfo_t *si, void *uc)
{
    if (fault_guard) {
        sigjmp_buf *j = fault_guard;
        fault_guard = nullptr;
        fault_address = si->si_addr;
        note_fiber_fault(si->si_addr, &fault_thread, &fault_block, &fault_overflow);
        siglongjmp(*j, 1);
    }
    struct sigaction *old = sig == SIGSEGV ? &rt->old_segv : &rt->old_bus;
    if ((old->sa_flags & SA_SIGINFO) && old->sa_sigaction) {
        old->sa_sigaction(sig, si, uc);
        return;
    }
    if (old->sa_handler != SIG_IGN && old->sa_handler != SIG_DFL) {
        old->sa_handler(sig);
        return;
    }
    signal(sig, SIG_DFL); // the fault happens again, now fatal
}

} // namespace

stream_state *new_stream(device_state *d, bool blocking, bool legacy)
{
    stream_state *s = new stream_state();
    s->dev = d, s->blocking = blocking, s->legacy = legacy;
    s->id = rt->next_stream_id++;
    s->delay_rng.s = mix(rt->cfg.seed * 7919 + (uint64_t)s->id);
    {
        std::lock_guard<std::mutex> l(d->streams_m);
        s->index = legacy ? -1 : d->created++;
    }
    std::thread(stream_main, s).detach();
    std::lock_guard<std::mutex> l(d->streams_m);
    d->streams.push_back(s);
    return s;
}

stream_state *legacy_stream(device_state *d)
{
    {
        std::lock_guard<std::mutex> l(d->streams_m);
        if (d->legacy) return d->legacy;
    }
    stream_state *s = new_stream(d, false, true);
    std::lock_guard<std::mutex> l(d->streams_m);
    if (!d->legacy) d->legacy = s;
    return d->legacy;
}

uint64_t position_of(stream_state *s)
{
    std::lock_guard<std::mutex> l(s->m);
    return s->submitted;
}

// Queues `it` on s with the legacy stream's implicit ordering: work on the
// legacy stream waits for the device's blocking streams, theirs for it.
uint64_t enqueue(stream_state *s, item &&it)
{
    if (s->legacy || s->blocking) {
        std::vector<std::pair<stream_state *, uint64_t>> waits;
        {
            std::lock_guard<std::mutex> l(s->dev->streams_m);
            for (stream_state *o : s->dev->streams)
                if (o != s && (s->legacy ? o->blocking : o->legacy)) waits.emplace_back(o, 0);
        }
        for (auto &w : waits) {
            item wait;
            wait.kind = item::WAIT_STREAM, wait.other = w.first, wait.position = position_of(w.first);
            wait.what = "the legacy stream's ordering";
            if (wait.position) push(s, std::move(wait));
        }
    }
    return push(s, std::move(it));
}

void wait_position(stream_state *s, uint64_t pos)
{
    std::unique_lock<std::mutex> l(s->m);
    s->cv.wait(l, [&] { return s->completed >= pos; });
}

void wait_idle(stream_state *s) { wait_position(s, position_of(s)); }

void wait_device(device_state *d)
{
    std::vector<stream_state *> all;
    {
        std::lock_guard<std::mutex> l(d->streams_m);
        all = d->streams;
    }
    for (stream_state *s : all) wait_idle(s);
}

// Every stream is a stream_state; 0 means the current device's legacy stream.
cudaError_t resolve(cudaStream_t h, stream_state **out)
{
    if (!h) {
        device_state *d = current();
        if (!d) return cudaErrorInvalidDevice;
        *out = legacy_stream(d);
        return cudaSuccess;
    }
    *out = reinterpret_cast<stream_state *>(h);
    return cudaSuccess;
}

uint64_t enqueue_work(stream_state *s, const std::string &what, std::function<void()> fn, bool device_work)
{
    item it;
    it.kind = item::WORK, it.work = std::move(fn), it.what = what, it.device_work = device_work;
    return enqueue(s, std::move(it));
}

void install_fault_handler()
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &rt->old_segv);
    sigaction(SIGBUS, &sa, &rt->old_bus);
}

} // namespace bbemu_rt
