// nccl.cpp — the emulated NCCL (include/nccl.h), built as libnccl.so.2
// beside libbbcudaemu.so, for the reducer's dlopen: communicators over the
// emulated GPUs of one process, joined by their unique id (a clique).
//
// A collective is queued on its stream like a kernel. When the stream gets
// there, the rank arrives at the clique's slot for that collective (the
// n-th of the communicator); the last rank to arrive checks that every
// rank asked for the same thing and does the work for all of them (sums
// in rank order: deterministic), and the others wait — on their stream,
// as NCCL's kernels spin on the GPU — until it is done or their own
// communicator is aborted. A rank that never comes (its device failed, a
// fault injected) leaves its peers waiting until they are aborted too.
//
// Non-blocking communicators (config.blocking = 0) answer ncclInProgress
// and report completion through ncclCommGetAsyncError, as NCCL's do;
// inside ncclGroupStart/End calls are issued at the group's end.
// Multi-process NCCL is not emulated: a communicator whose ranks do not all
// join in this process fails after 10 s, saying so.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_emu.h"
#include "nccl.h"

#define EXPORT extern "C" __attribute__((visibility("default")))

namespace {

constexpr double kJoinTimeout = 10.0;

enum kind_t { ALL_REDUCE, BROADCAST, REDUCE_SCATTER, ALL_GATHER };
const char *kind_name(kind_t k)
{
    static const char *n[] = {"AllReduce", "Broadcast", "ReduceScatter", "AllGather"};
    return n[k];
}

struct op_desc {
    kind_t kind;
    size_t count; // elements: of the reduction / broadcast; ReduceScatter: per rank (recv); AllGather: per rank (send)
    ncclDataType_t type;
    ncclRedOp_t op;
    int root;
    const void *send;
    void *recv;
    uint64_t seq;
    bool fail; // an injected fault (BB_CUDA_EMU_NCCL_FAULT)
};

struct comm_state;

struct clique {
    std::mutex m;
    std::condition_variable cv;
    int nranks;
    std::vector<comm_state *> members; // by rank; weakly held (their handles own them)
    int joined = 0;
    struct slot {
        std::vector<op_desc> d;
        std::vector<char> arrived;
        int arrivals = 0, left = 0;
        bool done = false;
    };
    std::map<uint64_t, slot> slots;
};

struct comm_state {
    std::shared_ptr<clique> cl;
    int rank, nranks, device;
    bool blocking;
    std::atomic<int> async{ncclSuccess}; // the first error; never cleared
    std::atomic<int> pending_polls{0};   // ncclInProgress answers still owed after a call
    std::atomic<bool> joining{false}, finalizing{false}, aborted{false};
    double join_started = 0;
    uint64_t issued = 0;                 // collectives issued (their slot numbers); by the owner's thread
    std::atomic<uint64_t> executed{0};
    std::mutex msg_m;
    std::string last_error;
    std::map<std::string, uint64_t> calls; // per kind, for the fault injection
};

} // namespace

struct ncclComm {
    std::shared_ptr<comm_state> s;
};

namespace {

std::mutex cliques_m;
std::map<std::string, std::weak_ptr<clique>> cliques;

thread_local int group_depth;
thread_local std::vector<std::function<ncclResult_t()>> group_calls; // issued at the group's end, in order
thread_local bool group_nonblocking;

struct fault_spec {
    std::string call;
    uint64_t at = 0;
    int rank = -1;
};
fault_spec fault;
std::once_flag fault_once;

void read_fault()
{
    const char *v = getenv("BB_CUDA_EMU_NCCL_FAULT");
    if (!v || !*v) return;
    const char *colon = strchr(v, ':');
    char *end;
    if (!colon || colon == v) goto bad;
    fault.call.assign(v, colon);
    fault.at = strtoull(colon + 1, &end, 10);
    if (!fault.at) goto bad;
    if (*end == '@') fault.rank = (int)strtol(end + 1, &end, 10);
    if (*end) goto bad;
    return;
bad:
    fprintf(stderr, "cuda-emu: BB_CUDA_EMU_NCCL_FAULT=%s: not CALL:N or CALL:N@RANK (CALL: AllReduce, Broadcast, "
                    "ReduceScatter, AllGather)\n", v);
    exit(1);
}

double seconds()
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec / 1e9;
}

// A failure of the communicator (the first stays), on stderr and in ncclGetLastError.
void comm_fail(comm_state *s, ncclResult_t rc, const std::string &why)
{
    int ok = ncclSuccess;
    s->async.compare_exchange_strong(ok, rc);
    {
        std::lock_guard<std::mutex> l(s->msg_m);
        if (s->last_error.empty()) s->last_error = why;
    }
    fprintf(stderr, "cuda-emu: NCCL rank %d of %d (cuda:%d): %s\n", s->rank, s->nranks, s->device, why.c_str());
}

ncclResult_t usage(comm_state *s, ncclResult_t rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
ncclResult_t usage(comm_state *s, ncclResult_t rc, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (s) {
        std::lock_guard<std::mutex> l(s->msg_m);
        s->last_error = buf;
    }
    fprintf(stderr, "cuda-emu: NCCL: %s\n", buf);
    return rc;
}

size_t type_size(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0; // fp16 and bf16 are not emulated
    }
}

template <class T> void reduce_into(T *acc, const T *x, size_t n, ncclRedOp_t op)
{
    for (size_t i = 0; i < n; i++) switch (op) {
        case ncclSum: case ncclAvg: acc[i] += x[i]; break;
        case ncclProd: acc[i] *= x[i]; break;
        case ncclMax: acc[i] = x[i] > acc[i] ? x[i] : acc[i]; break;
        case ncclMin: acc[i] = x[i] < acc[i] ? x[i] : acc[i]; break;
        }
}

template <class T> void divide(T *acc, size_t n, int by)
{
    for (size_t i = 0; i < n; i++) acc[i] = (T)(acc[i] / (T)by);
}

// acc = the reduction over ranks (in rank order) of block `block` of each rank's send buffer.
void reduce(std::vector<uint8_t> &acc, const clique::slot &sl, size_t block, const op_desc &d)
{
    size_t es = type_size(d.type), bytes = d.count * es;
    acc.assign((const uint8_t *)sl.d[0].send + block * bytes, (const uint8_t *)sl.d[0].send + (block + 1) * bytes);
    for (size_t r = 1; r < sl.d.size(); r++) {
        const void *x = (const uint8_t *)sl.d[r].send + block * bytes;
        switch (d.type) {
        case ncclFloat32: reduce_into((float *)acc.data(), (const float *)x, d.count, d.op); break;
        case ncclFloat64: reduce_into((double *)acc.data(), (const double *)x, d.count, d.op); break;
        case ncclInt32: reduce_into((int32_t *)acc.data(), (const int32_t *)x, d.count, d.op); break;
        case ncclUint32: reduce_into((uint32_t *)acc.data(), (const uint32_t *)x, d.count, d.op); break;
        case ncclInt64: reduce_into((int64_t *)acc.data(), (const int64_t *)x, d.count, d.op); break;
        case ncclUint64: reduce_into((uint64_t *)acc.data(), (const uint64_t *)x, d.count, d.op); break;
        case ncclInt8: reduce_into((int8_t *)acc.data(), (const int8_t *)x, d.count, d.op); break;
        case ncclUint8: reduce_into((uint8_t *)acc.data(), (const uint8_t *)x, d.count, d.op); break;
        default: break;
        }
    }
    if (d.op != ncclAvg) return;
    int n = (int)sl.d.size();
    switch (d.type) {
    case ncclFloat32: divide((float *)acc.data(), d.count, n); break;
    case ncclFloat64: divide((double *)acc.data(), d.count, n); break;
    case ncclInt32: divide((int32_t *)acc.data(), d.count, n); break;
    case ncclUint32: divide((uint32_t *)acc.data(), d.count, n); break;
    case ncclInt64: divide((int64_t *)acc.data(), d.count, n); break;
    case ncclUint64: divide((uint64_t *)acc.data(), d.count, n); break;
    case ncclInt8: divide((int8_t *)acc.data(), d.count, n); break;
    case ncclUint8: divide((uint8_t *)acc.data(), d.count, n); break;
    default: break;
    }
}

// The collective for every rank, once all have arrived (every send buffer
// read before any receive buffer is written: in place is fine).
void perform(clique::slot &sl)
{
    const op_desc &d = sl.d[0];
    size_t es = type_size(d.type), bytes = d.count * es, n = sl.d.size();
    std::vector<uint8_t> acc;
    switch (d.kind) {
    case ALL_REDUCE:
        reduce(acc, sl, 0, d);
        for (auto &x : sl.d) memcpy(x.recv, acc.data(), bytes);
        break;
    case BROADCAST:
        acc.assign((const uint8_t *)sl.d[d.root].send, (const uint8_t *)sl.d[d.root].send + bytes);
        for (auto &x : sl.d) memcpy(x.recv, acc.data(), bytes);
        break;
    case REDUCE_SCATTER: {
        std::vector<std::vector<uint8_t>> parts(n);
        for (size_t r = 0; r < n; r++) reduce(parts[r], sl, r, d);
        for (size_t r = 0; r < n; r++) memcpy(sl.d[r].recv, parts[r].data(), bytes);
        break;
    }
    case ALL_GATHER:
        for (size_t r = 0; r < n; r++)
            acc.insert(acc.end(), (const uint8_t *)sl.d[r].send, (const uint8_t *)sl.d[r].send + bytes);
        for (auto &x : sl.d) memcpy(x.recv, acc.data(), acc.size());
        break;
    }
}

std::string describe(const op_desc &d, int rank)
{
    char buf[256];
    snprintf(buf, sizeof buf, "rank %d: nccl%s of %zu elements of type %d, op %d, root %d", rank, kind_name(d.kind),
             d.count, (int)d.type, (int)d.op, d.root);
    return buf;
}

// On the stream's thread: arrive at the collective's slot, and wait for the peers.
void run_collective(const std::shared_ptr<comm_state> &s, const op_desc &d)
{
    if (s->aborted) return;
    if (d.fail) {
        comm_fail(s.get(), ncclSystemError, "an injected fault (BB_CUDA_EMU_NCCL_FAULT) in nccl" +
                                                std::string(kind_name(d.kind)) + ": this rank never arrives");
        return;
    }
    clique &c = *s->cl;
    std::unique_lock<std::mutex> l(c.m);
    clique::slot &sl = c.slots[d.seq];
    if (sl.d.empty()) sl.d.resize((size_t)c.nranks), sl.arrived.assign((size_t)c.nranks, 0);
    sl.d[(size_t)s->rank] = d;
    sl.arrived[(size_t)s->rank] = 1;
    if (++sl.arrivals == c.nranks) {
        std::string mismatch;
        for (int r = 1; r < c.nranks && mismatch.empty(); r++) {
            const op_desc &a = sl.d[0], &b = sl.d[(size_t)r];
            if (a.kind != b.kind || a.count != b.count || a.type != b.type ||
                (a.kind != BROADCAST && a.kind != ALL_GATHER && a.op != b.op) ||
                (a.kind == BROADCAST && a.root != b.root))
                mismatch = "collective #" + std::to_string(d.seq) + " differs between ranks: " + describe(a, 0) +
                           "; " + describe(b, r);
        }
        if (mismatch.empty()) perform(sl);
        else
            for (comm_state *m : c.members)
                if (m) comm_fail(m, ncclInvalidUsage, mismatch);
        sl.done = true;
        c.cv.notify_all();
    } else {
        c.cv.wait(l, [&] { return sl.done || s->aborted.load(); });
    }
    if (++sl.left == c.nranks) c.slots.erase(d.seq);
    s->executed++;
}

// Not every rank joined in time: the others are not in this process.
void fail_join(comm_state *s)
{
    int joined;
    {
        std::lock_guard<std::mutex> l(s->cl->m);
        joined = s->cl->joined;
    }
    comm_fail(s, ncclSystemError, "only " + std::to_string(joined) + " of " + std::to_string(s->nranks) +
                                      " ranks joined in 10 s (the emulated NCCL joins the GPUs of one process)");
}

// A blocking communicator's wait for every rank to join.
ncclResult_t wait_joined(comm_state *s)
{
    clique &c = *s->cl;
    std::unique_lock<std::mutex> l(c.m);
    if (!c.cv.wait_for(l, std::chrono::duration<double>(kJoinTimeout), [&] { return c.joined == c.nranks; })) {
        l.unlock();
        fail_join(s);
        return ncclSystemError;
    }
    s->joining = false;
    return ncclSuccess;
}

ncclResult_t issue(const std::shared_ptr<comm_state> &s, op_desc d, cudaStream_t stream)
{
    std::call_once(fault_once, read_fault);
    d.seq = s->issued++;
    std::string k = kind_name(d.kind);
    uint64_t nth = ++s->calls[k];
    d.fail = fault.at && fault.call == k && nth == fault.at && (fault.rank < 0 || fault.rank == s->rank);
    bbemu_count("nccl_calls", 1);
    struct job {
        std::shared_ptr<comm_state> s;
        op_desc d;
    };
    cudaError_t e = bbemu_enqueue_host(
        stream, ("nccl" + k).c_str(),
        [](void *ctx) { run_collective(static_cast<job *>(ctx)->s, static_cast<job *>(ctx)->d); },
        [](void *ctx) { delete static_cast<job *>(ctx); }, new job{s, d}, 1);
    if (e != cudaSuccess) {
        // Not queued: it never runs, and this rank's peers wait for it.
        s->executed++;
        return usage(s.get(), ncclUnhandledCudaError, "nccl%s: the stream does not take work: %s", k.c_str(),
                     cudaGetErrorString(e));
    }
    if (s->blocking) return ncclSuccess;
    s->pending_polls = 1;
    return ncclInProgress;
}

ncclResult_t collective(ncclComm_t comm, op_desc d, size_t send_bytes, size_t recv_bytes, cudaStream_t stream)
{
    if (!comm) return usage(nullptr, ncclInvalidArgument, "nccl%s: comm is NULL", kind_name(d.kind));
    std::shared_ptr<comm_state> s = comm->s;
    if (s->aborted) return usage(s.get(), ncclInvalidUsage, "nccl%s on an aborted communicator", kind_name(d.kind));
    if (s->async != ncclSuccess) return (ncclResult_t)s->async.load();
    if (s->joining)
        return usage(s.get(), ncclInvalidUsage, "nccl%s before the communicator is ready", kind_name(d.kind));
    if (!type_size(d.type))
        return usage(s.get(), ncclInvalidArgument, "nccl%s: data type %d is not emulated", kind_name(d.kind),
                     (int)d.type);
    if ((unsigned)d.op > ncclAvg)
        return usage(s.get(), ncclInvalidArgument, "nccl%s: reduction %d", kind_name(d.kind), (int)d.op);
    if (d.kind == BROADCAST && (d.root < 0 || d.root >= s->nranks))
        return usage(s.get(), ncclInvalidArgument, "ncclBroadcast: root %d of %d ranks", d.root, s->nranks);
    int dev = bbemu_stream_device(stream);
    if (dev != s->device)
        return usage(s.get(), ncclInvalidArgument, "nccl%s: a stream of cuda:%d for the communicator of cuda:%d",
                     kind_name(d.kind), dev, s->device);
    const char *why = "";
    bool needs_send = d.kind != BROADCAST || d.root == s->rank;
    if (needs_send && send_bytes && !bbemu_device_range(d.send, send_bytes, s->device, &why))
        return usage(s.get(), ncclInvalidArgument, "nccl%s: sendbuff %p (%zu bytes) is not memory of cuda:%d: %s",
                     kind_name(d.kind), d.send, send_bytes, s->device, why);
    if (recv_bytes && !bbemu_device_range(d.recv, recv_bytes, s->device, &why))
        return usage(s.get(), ncclInvalidArgument, "nccl%s: recvbuff %p (%zu bytes) is not memory of cuda:%d: %s",
                     kind_name(d.kind), d.recv, recv_bytes, s->device, why);
    if (group_depth > 0) {
        group_nonblocking |= !s->blocking;
        group_calls.push_back([s, d, stream] {
            ncclResult_t rc = issue(s, d, stream);
            return rc == ncclInProgress ? ncclSuccess : rc;
        });
        return ncclSuccess;
    }
    return issue(s, d, stream);
}

} // namespace

EXPORT ncclResult_t ncclGetVersion(int *version)
{
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    static std::atomic<uint64_t> counter{0};
    memset(id, 0, sizeof *id);
    uint64_t parts[4] = {(uint64_t)getpid(), counter++, (uint64_t)time(nullptr), bbemu_seed()};
    memcpy(id->internal, "bbemu-nccl", 10);
    memcpy(id->internal + 16, parts, sizeof parts);
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                           ncclConfig_t *config)
{
    *comm = nullptr;
    int device = -1;
    if (cudaGetDevice(&device) != cudaSuccess || bbemu_stream_device(0) < 0)
        return usage(nullptr, ncclUnhandledCudaError, "ncclCommInitRankConfig: no current device");
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return usage(nullptr, ncclInvalidArgument, "ncclCommInitRankConfig: rank %d of %d", rank, nranks);
    if (config && (config->magic != 0xcafebeef || config->size != sizeof(ncclConfig_t)))
        return usage(nullptr, ncclInvalidArgument,
                     "ncclCommInitRankConfig: config not made with NCCL_CONFIG_INITIALIZER");
    std::shared_ptr<clique> c;
    {
        std::lock_guard<std::mutex> l(cliques_m);
        std::string key(id.internal, sizeof id.internal);
        c = cliques[key].lock();
        if (!c) {
            c = std::make_shared<clique>();
            c->nranks = nranks;
            c->members.assign((size_t)nranks, nullptr);
            cliques[key] = c;
        }
    }
    auto s = std::make_shared<comm_state>();
    s->cl = c, s->rank = rank, s->nranks = nranks, s->device = device;
    s->blocking = !config || config->blocking == NCCL_CONFIG_UNDEF_INT || config->blocking != 0;
    {
        std::lock_guard<std::mutex> l(c->m);
        if (c->nranks != nranks)
            return usage(nullptr, ncclInvalidArgument, "ncclCommInitRankConfig: %d ranks, where the id's other ranks "
                         "said %d", nranks, c->nranks);
        if (c->members[(size_t)rank])
            return usage(nullptr, ncclInvalidArgument, "ncclCommInitRankConfig: rank %d joined twice", rank);
        c->members[(size_t)rank] = s.get();
        c->joined++;
        c->cv.notify_all();
    }
    s->joining = true;
    s->join_started = seconds();
    *comm = new ncclComm{s};
    if (group_depth > 0) { // a blocking one waits for the others at the group's end
        group_nonblocking |= !s->blocking;
        comm_state *raw = s.get();
        if (s->blocking) group_calls.push_back([raw] { return wait_joined(raw); });
        return ncclSuccess;
    }
    return s->blocking ? wait_joined(s.get()) : ncclInProgress;
}

EXPORT ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
    return ncclCommInitRankConfig(comm, nranks, id, rank, nullptr);
}

EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async_error)
{
    if (!comm || !async_error) return ncclInvalidArgument;
    comm_state *s = comm->s.get();
    if (s->joining) {
        std::lock_guard<std::mutex> l(s->cl->m);
        if (s->cl->joined == s->nranks) s->joining = false;
    }
    if (s->joining && seconds() - s->join_started > kJoinTimeout) fail_join(s);
    if (s->async != ncclSuccess) *async_error = (ncclResult_t)s->async.load();
    else if (s->joining) *async_error = ncclInProgress;
    else if (s->pending_polls > 0) s->pending_polls--, *async_error = ncclInProgress;
    else if (s->finalizing && s->executed.load() < s->issued) *async_error = ncclInProgress;
    else *async_error = ncclSuccess;
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    if (!comm) return ncclInvalidArgument;
    comm_state *s = comm->s.get();
    s->finalizing = true;
    if (!s->blocking) return ncclInProgress;
    while (s->executed.load() < s->issued && s->async == ncclSuccess && !s->aborted) usleep(100);
    return (ncclResult_t)s->async.load();
}

EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (!comm) return ncclInvalidArgument;
    comm_state *s = comm->s.get();
    {
        std::lock_guard<std::mutex> l(s->cl->m);
        s->cl->members[(size_t)s->rank] = nullptr;
    }
    delete comm;
    return ncclSuccess;
}

// Ends the communicator at once: its waiting collectives return (their
// results never written), the ones still queued do nothing.
EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (!comm) return ncclInvalidArgument;
    comm_state *s = comm->s.get();
    s->aborted = true;
    {
        std::lock_guard<std::mutex> l(s->cl->m);
        s->cl->members[(size_t)s->rank] = nullptr;
        s->cl->cv.notify_all();
    }
    delete comm;
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    if (!comm) return ncclInvalidArgument;
    *count = comm->s->nranks;
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
    if (!comm) return ncclInvalidArgument;
    *device = comm->s->device;
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    if (!comm) return ncclInvalidArgument;
    *rank = comm->s->rank;
    return ncclSuccess;
}

EXPORT const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

EXPORT const char *ncclGetLastError(ncclComm_t comm)
{
    thread_local std::string text;
    if (!comm) return "";
    std::lock_guard<std::mutex> l(comm->s->msg_m);
    text = comm->s->last_error;
    return text.c_str();
}

EXPORT ncclResult_t ncclGroupStart(void)
{
    if (group_depth++ == 0) group_calls.clear(), group_nonblocking = false;
    return ncclSuccess;
}

EXPORT ncclResult_t ncclGroupEnd(void)
{
    if (group_depth == 0) return usage(nullptr, ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--group_depth > 0) return ncclSuccess;
    ncclResult_t rc = ncclSuccess;
    std::vector<std::function<ncclResult_t()>> calls;
    calls.swap(group_calls);
    for (auto &c : calls) {
        ncclResult_t r = c();
        if (r != ncclSuccess && rc == ncclSuccess) rc = r;
    }
    return rc == ncclSuccess && group_nonblocking ? ncclInProgress : rc;
}

EXPORT ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                  ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    size_t b = count * type_size(datatype);
    return collective(comm, op_desc{ALL_REDUCE, count, datatype, op, 0, sendbuff, recvbuff, 0, false}, b, b, stream);
}

EXPORT ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                  int root, ncclComm_t comm, cudaStream_t stream)
{
    size_t b = count * type_size(datatype);
    return collective(comm, op_desc{BROADCAST, count, datatype, ncclSum, root, sendbuff, recvbuff, 0, false}, b, b,
                      stream);
}

EXPORT ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                                      ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    size_t b = recvcount * type_size(datatype), ranks = comm ? (size_t)comm->s->nranks : 1;
    return collective(comm, op_desc{REDUCE_SCATTER, recvcount, datatype, op, 0, sendbuff, recvbuff, 0, false},
                      b * ranks, b, stream);
}

EXPORT ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                                  ncclComm_t comm, cudaStream_t stream)
{
    size_t b = sendcount * type_size(datatype), ranks = comm ? (size_t)comm->s->nranks : 1;
    return collective(comm, op_desc{ALL_GATHER, sendcount, datatype, ncclSum, 0, sendbuff, recvbuff, 0, false}, b,
                      b * ranks, stream);
}
