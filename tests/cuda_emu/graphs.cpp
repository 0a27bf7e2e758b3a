// graphs.cpp — stream capture and CUDA graphs, as far as bigbatch uses
// them (include/cuda_runtime.h says what): a capture makes the stream
// record its work items (push(), streams.cpp) instead of queuing them; an
// instantiated graph is a copy of that list, which a launch queues again,
// each kernel with the arguments it was captured with. What CUDA refuses
// during a capture is refused here too: the capturing thread's waits for
// the device, allocations and frees (Global and ThreadLocal modes), waits
// on other streams' work inside the capture, a second capture of a stream,
// the end of a capture on another thread.
#include <thread>

#include "emu.h"

struct bbemu_graph {
    std::vector<bbemu_rt::item> items;
};
struct bbemu_graph_exec {
    std::vector<bbemu_rt::item> items;
};

namespace bbemu_rt {

namespace {

struct capture_info {
    stream_state *stream = nullptr; // the stream this thread captures (not Relaxed)
};
thread_local capture_info here;

// Who began each capture, and in which mode (under the lock).
std::mutex owners_m;
struct owner {
    std::thread::id thread;
    cudaStreamCaptureMode mode;
};
std::map<stream_state *, owner> owners;

bool same_operations(const std::vector<item> &a, const std::vector<item> &b)
{
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); i++)
        if (a[i].kernel != b[i].kernel || a[i].what != b[i].what) return false;
    return true;
}

} // namespace

bool capturing(stream_state *s)
{
    std::lock_guard<std::mutex> l(s->m);
    return s->capture != nullptr;
}

cudaError_t refuse_in_capture(const char *call)
{
    stream_state *s = here.stream;
    if (!s) return cudaSuccess;
    {
        std::lock_guard<std::mutex> l(s->m);
        s->capture_invalid = true;
    }
    return fail_with(cudaErrorStreamCaptureUnsupported, true,
                     "%s while this thread captures a stream: not permitted (the capture is invalidated)", call);
}

} // namespace bbemu_rt

using namespace bbemu_rt;

#define EXPORT extern "C" __attribute__((visibility("default")))

EXPORT cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode)
{
    stream_state *s;
    cudaError_t e = check_stream(stream, &s);
    if (e != cudaSuccess) return e;
    if (s->legacy)
        return fail_with(cudaErrorStreamCaptureUnsupported, true, "cudaStreamBeginCapture: the legacy stream cannot "
                         "be captured");
    if (mode < cudaStreamCaptureModeGlobal || mode > cudaStreamCaptureModeRelaxed)
        return fail_with(cudaErrorInvalidValue, true, "cudaStreamBeginCapture: mode %d", (int)mode);
    {
        std::lock_guard<std::mutex> l(s->m);
        if (s->capture) return fail_with(cudaErrorIllegalState, true, "cudaStreamBeginCapture: already capturing");
        s->capture = std::make_shared<std::vector<item>>();
        s->capture_invalid = false;
    }
    std::lock_guard<std::mutex> l(owners_m);
    owners[s] = owner{std::this_thread::get_id(), mode};
    if (mode != cudaStreamCaptureModeRelaxed) here.stream = s;
    return cudaSuccess;
}

EXPORT cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph)
{
    stream_state *s;
    cudaError_t e = check_stream(stream, &s);
    if (e != cudaSuccess) return e;
    if (!graph) return fail(cudaErrorInvalidValue);
    *graph = nullptr;
    {
        std::lock_guard<std::mutex> l(owners_m);
        auto o = owners.find(s);
        if (o == owners.end())
            return fail_with(cudaErrorIllegalState, true, "cudaStreamEndCapture: the stream is not capturing");
        if (o->second.mode != cudaStreamCaptureModeRelaxed && o->second.thread != std::this_thread::get_id())
            return fail_with(cudaErrorStreamCaptureWrongThread, true,
                             "cudaStreamEndCapture: the capture was begun on another thread");
        owners.erase(o);
    }
    if (here.stream == s) here.stream = nullptr;
    std::shared_ptr<std::vector<item>> items;
    bool invalid;
    {
        std::lock_guard<std::mutex> l(s->m);
        items.swap(s->capture);
        invalid = s->capture_invalid;
    }
    if (invalid)
        return fail_with(cudaErrorStreamCaptureInvalidated, true,
                         "cudaStreamEndCapture: the capture was invalidated (a refused call or a wait inside it)");
    *graph = new bbemu_graph{std::move(*items)};
    return cudaSuccess;
}

EXPORT cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *status)
{
    stream_state *s;
    cudaError_t e = check_stream(stream, &s);
    if (e != cudaSuccess) return e;
    std::lock_guard<std::mutex> l(s->m);
    *status = !s->capture ? cudaStreamCaptureStatusNone
              : s->capture_invalid ? cudaStreamCaptureStatusInvalidated
                                   : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}

EXPORT cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags)
{
    if (!exec || !graph) return fail(cudaErrorInvalidValue);
    if (flags) return fail_with(cudaErrorInvalidValue, true, "cudaGraphInstantiate: flags 0x%llx", flags);
    *exec = new bbemu_graph_exec{graph->items};
    return cudaSuccess;
}

EXPORT cudaError_t cudaGraphExecUpdate(cudaGraphExec_t exec, cudaGraph_t graph, cudaGraphExecUpdateResultInfo *info)
{
    if (!exec || !graph || !info) return fail(cudaErrorInvalidValue);
    info->errorNode = info->errorFromNode = nullptr;
    if (!same_operations(exec->items, graph->items)) {
        info->result = cudaGraphExecUpdateErrorTopologyChanged;
        return fail(cudaErrorGraphExecUpdateFailure);
    }
    exec->items = graph->items;
    info->result = cudaGraphExecUpdateSuccess;
    return cudaSuccess;
}

EXPORT cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream)
{
    stream_state *s;
    cudaError_t e = check_stream(stream, &s);
    if (e != cudaSuccess) return e;
    if (!exec) return fail(cudaErrorInvalidValue);
    R().c.graph_launches++;
    for (const item &it : exec->items) {
        if (it.kernel) R().c.graph_kernels++;
        item copy = it;
        enqueue(s, std::move(copy));
    }
    return cudaSuccess;
}

EXPORT cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
    delete graph;
    return cudaSuccess;
}

EXPORT cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec)
{
    delete exec;
    return cudaSuccess;
}
