// cudnn_attention.cu — cudnn_attention.h: causal SDPA through the cuDNN
// frontend's graph API (header-only, 1.32; the backend API would mean
// composing the ~20 operations of the forward and ~40 of the backward by
// hand, which the frontend's SDPA nodes do and NVIDIA keeps up to date).
//
// Loading. The frontend is built with dynamic loading: every cuDNN call it
// makes goes through dlsym(cudnn_frontend::cudnn_dlhandle, name), so
// nothing links libcudnn. This file opens the library itself (once per
// process, never closed: the frontend caches the symbols), checks it and
// only then hands the frontend the handle. The frontend makes its own CUDA
// runtime calls through a libcudart it opens: CUDNN_FRONTEND_CUDART_LIB_NAME,
// set here (unless set) to the runtime of our CUDA major. The loading part
// builds everywhere (the emulated GPU too); the graphs only where the
// frontend's headers were found (BB_CUDNN_FRONTEND).
//
// Graphs. One forward (with the statistics) and one backward per shape,
// cached (4 shapes each, least recently used out); the scale is passed by
// value at execution, so it is not part of the graph.
#ifdef BB_CUDNN_FRONTEND
#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING 1
#define CUDNN_FRONTEND_SKIP_JSON_LIB 1
#endif

#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudnn_attention.h"

#ifdef BB_CUDNN_FRONTEND
#include <cuda_runtime.h>

#include <cstring>
#include <memory>
#include <unordered_map>
#include <vector>
// The frontend's graph_interface.h trips nvcc's "loop is not reachable" (#128) in one of its macros.
#pragma nv_diag_suppress 128
#include <cudnn_frontend.h>
#pragma nv_diag_default 128
namespace cudnn_frontend {
void *cudnn_dlhandle = nullptr; // the frontend's (extern in cudnn_frontend_shim.h); set by load()
}
namespace fe = cudnn_frontend;
#endif

namespace {

// ---- the library, once per process -------------------------------------------
// Status and handle types as the ABI has them (an enum and pointers), so
// that this part needs no cuDNN header.
struct library {
    bb_status status = BB_OK;
    char why[320] = "";
    char version_text[32] = "";
    char engine_text[40] = ""; // "cuDNN 9.x.y SDPA": the banner's
    void *handle = nullptr;
    size_t version = 0, cudart_version = 0;
    int (*create)(void **handle) = nullptr;
    int (*destroy)(void *handle) = nullptr;
    int (*set_stream)(void *handle, void *stream) = nullptr;
    const char *(*error_string)(int status) = nullptr;
} lib;
pthread_once_t lib_once = PTHREAD_ONCE_INIT;

__attribute__((format(printf, 1, 2))) bool unusable(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(lib.why, sizeof lib.why, fmt, ap);
    va_end(ap);
    lib.status = BB_ERR_UNSUPPORTED;
    return false;
}

bool load_library()
{
    const char *env = getenv("BB_CUDNN_LIBRARY");
    const char *path = env && *env ? env : "libcudnn.so.9";
    const char *named = env && *env ? " (BB_CUDNN_LIBRARY)" : "";
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) return unusable("cuDNN: %s%s", dlerror(), named);
    auto sym = [h](const char *name) { return dlsym(h, name); };
    auto get_version = reinterpret_cast<size_t (*)(void)>(sym("cudnnGetVersion"));
    auto get_cudart = reinterpret_cast<size_t (*)(void)>(sym("cudnnGetCudartVersion"));
    lib.create = reinterpret_cast<int (*)(void **)>(sym("cudnnCreate"));
    lib.destroy = reinterpret_cast<int (*)(void *)>(sym("cudnnDestroy"));
    lib.set_stream = reinterpret_cast<int (*)(void *, void *)>(sym("cudnnSetStream"));
    lib.error_string = reinterpret_cast<const char *(*)(int)>(sym("cudnnGetErrorString"));
    if (!get_version || !get_cudart || !lib.create || !lib.destroy || !lib.set_stream || !lib.error_string ||
        !sym("cudnnBackendCreateDescriptor")) {
        dlclose(h);
        return unusable("cuDNN: %s%s lacks cuDNN 9's functions", path, named);
    }
    lib.version = get_version();
    lib.cudart_version = get_cudart();
    snprintf(lib.version_text, sizeof lib.version_text, "cuDNN %zu.%zu.%zu", lib.version / 10000,
             lib.version / 100 % 100, lib.version % 100);
    snprintf(lib.engine_text, sizeof lib.engine_text, "%s SDPA", lib.version_text);
    // 9.10.0 and 9.10.1 have SDPA bugs the frontend itself refuses.
    if (lib.version < 90000 || lib.version == 91000 || lib.version == 91001) {
        dlclose(h);
        return unusable("cuDNN: %s is %s: SDPA needs 9.0 or later, not 9.10.0 or 9.10.1", path, lib.version_text);
    }
    lib.handle = h;
    return true;
}

#ifdef BB_CUDNN_FRONTEND
// The frontend opens its own libcudart by the name in
// CUDNN_FRONTEND_CUDART_LIB_NAME: ours when it is shared, else the shared
// one of our major (the binary links the static runtime). The name is set
// here, before main and so before any thread exists (setenv while another
// thread reads the environment is a race), unless the user set one.
__attribute__((constructor)) void name_cudart()
{
    const char *set = getenv("CUDNN_FRONTEND_CUDART_LIB_NAME");
    if (set && *set) return;
    char name[64];
    snprintf(name, sizeof name, "libcudart.so.%d", CUDART_VERSION / 1000);
    Dl_info info = {};
    if (dladdr(reinterpret_cast<void *>(&cudaRuntimeGetVersion), &info) && info.dli_fname &&
        strstr(info.dli_fname, "libcudart.so"))
        snprintf(name, sizeof name, "%s", info.dli_fname);
    setenv("CUDNN_FRONTEND_CUDART_LIB_NAME", name, 0);
}

bool prepare_cudart()
{
    const char *use = getenv("CUDNN_FRONTEND_CUDART_LIB_NAME");
    if (!use || !*use) return unusable("cuDNN: CUDNN_FRONTEND_CUDART_LIB_NAME is empty");
    if (!dlopen(use, RTLD_NOW | RTLD_LOCAL)) // kept open: the frontend opens the same name
        return unusable("cuDNN: the frontend needs the CUDA runtime %s: %s", use, dlerror());
    int rt = 0;
    if (cudaRuntimeGetVersion(&rt) == cudaSuccess && lib.cudart_version / 1000 != (size_t)rt / 1000)
        return unusable("cuDNN: %s was built for CUDA %zu, this program for CUDA %d", lib.version_text,
                        lib.cudart_version / 1000, rt / 1000);
    return true;
}
#endif

void load()
{
    if (!load_library()) return;
#ifdef BB_CUDNN_FRONTEND
    if (!prepare_cudart()) return;
    fe::cudnn_dlhandle = lib.handle; // only now may the frontend be used
#else
#ifdef BB_CUDA_EMU
    unusable("%s loaded, but the emulated GPU cannot run it", lib.version_text);
#else
    unusable("%s loaded, but this build has no graph code (make deps fetches the cuDNN frontend's headers)",
             lib.version_text);
#endif
#endif
}

} // namespace

#ifdef BB_CUDNN_FRONTEND
namespace {

enum : int64_t { UID_Q = 1, UID_K, UID_V, UID_SCALE, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV };

struct cached_graph {
    int B = 0, T = 0, NH = 0, KVH = 0, hs = 0;
    std::shared_ptr<fe::graph::Graph> graph;
    int64_t workspace = 0;
    uint64_t used = 0; // least recently used goes first
};

struct graph_cache {
    cached_graph slot[4];
    uint64_t clock = 0;
    cached_graph *find(int B, int T, int NH, int KVH, int hs)
    {
        for (auto &g : slot)
            if (g.graph && g.B == B && g.T == T && g.NH == NH && g.KVH == KVH && g.hs == hs)
                return g.used = ++clock, &g;
        return nullptr;
    }
    cached_graph *victim()
    {
        cached_graph *v = &slot[0];
        for (auto &g : slot) {
            if (!g.graph) return &g;
            if (g.used < v->used) v = &g;
        }
        return v;
    }
};

bb_status frontend_fail(const fe::error_t &e, const char *stage)
{
    std::string m = e.err_msg;
    for (char &ch : m)
        if (ch == '\n' || ch == '\r') ch = ' ';
    return bb_fail(BB_ERR_UNSUPPORTED, "cuDNN SDPA: %s: %s", stage, m.c_str());
}

} // namespace

struct bb_cudnn {
    void *handle = nullptr; // cudnnHandle_t, on `stream`
    void *stream = nullptr;
    int sm = 0;
    bool deterministic = true;
    graph_cache fwd, bwd;
};

namespace {

// What cuDNN's SDPA takes (checked here so that the reason is ours and plain).
bb_status check_shape(const bb_cudnn *c, int B, int T, int NH, int KVH, int hs, bool backward)
{
    if (B <= 0 || T <= 0 || NH <= 0 || KVH <= 0 || NH % KVH || hs <= 0)
        return bb_fail(BB_ERR_ARG, "cuDNN SDPA: shape B %d T %d NH %d KVH %d hs %d", B, T, NH, KVH, hs);
    if (hs % 8) return bb_fail(BB_ERR_UNSUPPORTED, "cuDNN SDPA: a head size of %d is not a multiple of 8", hs);
    int widest = !backward || c->sm / 10 == 9 ? 256 : 128;
    if (hs > widest)
        return bb_fail(BB_ERR_UNSUPPORTED, "cuDNN SDPA: the %s on sm_%d takes heads up to %d wide, not %d",
                       backward ? "backward" : "forward", c->sm, widest, hs);
    if (backward && T < 2) return bb_fail(BB_ERR_UNSUPPORTED, "cuDNN SDPA: no backward at T 1 (a known cuDNN gap)");
    return BB_OK;
}

// A (B, heads, T, hs) view of rows `W` wide (qkv's (NH+2·KVH)·hs, out's NH·hs).
std::vector<int64_t> row_strides(int64_t T, int64_t W, int64_t hs) { return {T * W, hs, W, 1}; }

std::shared_ptr<fe::graph::Tensor_attributes> tensor(fe::graph::Graph &g, const char *name, int64_t uid,
                                                     std::vector<int64_t> dim, std::vector<int64_t> stride)
{
    return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dim).set_stride(stride));
}

// The graph's shared part: bf16 in and out, fp32 inside; Q (NH heads), K
// and V (KVH heads each: grouped-query when fewer) in qkv's layout; the
// scale by value.
struct sdpa_inputs {
    std::shared_ptr<fe::graph::Graph> g;
    std::shared_ptr<fe::graph::Tensor_attributes> q, k, v, scale;
};

sdpa_inputs begin_graph(const bb_cudnn *c, int64_t B, int64_t T, int64_t NH, int64_t KVH, int64_t hs)
{
    sdpa_inputs in;
    in.g = std::make_shared<fe::graph::Graph>();
    in.g->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    in.g->set_sm_version(c->sm);
    int64_t W = (NH + 2 * KVH) * hs;
    in.q = tensor(*in.g, "Q", UID_Q, {B, NH, T, hs}, row_strides(T, W, hs));
    in.k = tensor(*in.g, "K", UID_K, {B, KVH, T, hs}, row_strides(T, W, hs));
    in.v = tensor(*in.g, "V", UID_V, {B, KVH, T, hs}, row_strides(T, W, hs));
    in.scale = in.g->tensor(fe::graph::Tensor_attributes()
                                .set_name("attn_scale")
                                .set_uid(UID_SCALE)
                                .set_dim({1, 1, 1, 1})
                                .set_stride({1, 1, 1, 1})
                                .set_is_pass_by_value(true)
                                .set_data_type(fe::DataType_t::FLOAT));
    return in;
}

// The statistics (log-sum-exp per row): fp32 (B, NH, T), the backend's lse.
void as_stats(fe::graph::Tensor_attributes &t, int64_t B, int64_t T, int64_t NH)
{
    t.set_uid(UID_STATS).set_data_type(fe::DataType_t::FLOAT).set_dim({B, NH, T, 1}).set_stride({NH * T, T, 1, 1});
}

bb_status build(bb_cudnn *c, fe::graph::Graph &g, int64_t *workspace)
{
#define BB_FE_STEP(call, stage)                                        \
    do {                                                               \
        fe::error_t e_ = (call);                                       \
        if (e_.is_bad()) return frontend_fail(e_, stage);              \
    } while (0)
    auto *handle = static_cast<cudnnHandle_t>(c->handle);
    BB_FE_STEP(g.validate(), "validate");
    BB_FE_STEP(g.build_operation_graph(handle), "build_operation_graph");
    BB_FE_STEP(g.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}), "create_execution_plans");
    BB_FE_STEP(g.check_support(), "check_support");
    BB_FE_STEP(g.build_plans(), "build_plans");
    BB_FE_STEP(g.get_workspace_size(*workspace), "get_workspace_size");
#undef BB_FE_STEP
    if (*workspace < 0) *workspace = 0;
    return BB_OK;
}

// Builds g and caches it for this shape in place of the least recently used.
bb_status build_into(bb_cudnn *c, graph_cache *cache, std::shared_ptr<fe::graph::Graph> g, int B, int T, int NH,
                     int KVH, int hs, cached_graph **out)
{
    int64_t workspace = 0;
    BB_TRY(build(c, *g, &workspace));
    cached_graph *slot = cache->victim();
    *slot = cached_graph{B, T, NH, KVH, hs, g, workspace, ++cache->clock};
    *out = slot;
    return BB_OK;
}

bb_status forward_graph(bb_cudnn *c, int B, int T, int NH, int KVH, int hs, cached_graph **out)
{
    if ((*out = c->fwd.find(B, T, NH, KVH, hs))) return BB_OK;
    BB_TRY(check_shape(c, B, T, NH, KVH, hs, false));
    sdpa_inputs in = begin_graph(c, B, T, NH, KVH, hs);
    auto opts = fe::graph::SDPA_attributes()
                    .set_name("bigbatch_sdpa")
                    .set_generate_stats(true)
                    .set_attn_scale(in.scale)
                    .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                    .set_diagonal_band_right_bound(0); // causal: key j <= query i
    auto outs = in.g->sdpa(in.q, in.k, in.v, opts);
    int64_t C = (int64_t)NH * hs;
    outs[0]->set_output(true).set_uid(UID_O).set_dim({B, NH, T, hs}).set_stride(row_strides(T, C, hs));
    as_stats(outs[1]->set_output(true), B, T, NH);
    return build_into(c, &c->fwd, in.g, B, T, NH, KVH, hs, out);
}

bb_status backward_graph(bb_cudnn *c, int B, int T, int NH, int KVH, int hs, cached_graph **out)
{
    if ((*out = c->bwd.find(B, T, NH, KVH, hs))) return BB_OK;
    BB_TRY(check_shape(c, B, T, NH, KVH, hs, true));
    sdpa_inputs in = begin_graph(c, B, T, NH, KVH, hs);
    int64_t C = (int64_t)NH * hs;
    auto o = tensor(*in.g, "O", UID_O, {B, NH, T, hs}, row_strides(T, C, hs));
    auto dout = tensor(*in.g, "dO", UID_DO, {B, NH, T, hs}, row_strides(T, C, hs));
    fe::graph::Tensor_attributes stats_attr;
    as_stats(stats_attr.set_name("Stats"), B, T, NH);
    auto stats = in.g->tensor(stats_attr);
    auto opts = fe::graph::SDPA_backward_attributes()
                    .set_name("bigbatch_sdpa_backward")
                    .set_attn_scale(in.scale)
                    .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                    .set_diagonal_band_right_bound(0)
                    .set_deterministic_algorithm(c->deterministic);
    auto grads = in.g->sdpa_backward(in.q, in.k, in.v, o, dout, stats, opts);
    int64_t W = (NH + 2 * KVH) * hs; /* dQ, dK, dV in dqkv's layout, as Q, K and V */
    for (int i = 0; i < 3; i++)
        grads[i]->set_output(true).set_uid(UID_DQ + i).set_dim({B, i ? KVH : NH, T, hs}).set_stride(
            row_strides(T, W, hs));
    return build_into(c, &c->bwd, in.g, B, T, NH, KVH, hs, out);
}

bb_status execute(bb_cudnn *c, cached_graph *g, std::unordered_map<int64_t, void *> &pack, void *workspace,
                  size_t workspace_bytes, const char *what)
{
    if (workspace_bytes < (size_t)g->workspace)
        return bb_fail(BB_ERR_INTERNAL, "cuDNN SDPA %s: a workspace of %zu bytes, %lld needed", what, workspace_bytes,
                       (long long)g->workspace);
    fe::error_t e = g->graph->execute(static_cast<cudnnHandle_t>(c->handle), pack, workspace);
    if (e.is_bad()) return bb_fail(BB_ERR_DEVICE, "cuDNN SDPA %s: %s", what, e.err_msg.c_str());
    return BB_OK;
}

// Exceptions never cross into C: each becomes a failure.
template <class F> bb_status guarded(F f)
{
    try {
        return f();
    } catch (const std::exception &e) {
        return bb_fail(BB_ERR_INTERNAL, "cuDNN frontend: %s", e.what());
    } catch (...) {
        return bb_fail(BB_ERR_INTERNAL, "cuDNN frontend: an unknown exception");
    }
}

} // namespace

extern "C" bb_status bb_cudnn_open(void *stream, bb_cudnn **out)
{
    *out = nullptr;
    pthread_once(&lib_once, load);
    if (lib.status != BB_OK) return bb_fail(lib.status, "%s", lib.why);
    int device = 0, major = 0, minor = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
        cudaGetLastError();
        return bb_fail(BB_ERR_DEVICE, "cuDNN: cannot read the compute capability of cuda:%d", device);
    }
    if (major < 8)
        return bb_fail(BB_ERR_UNSUPPORTED, "cuDNN SDPA needs sm_80 or later; cuda:%d is sm_%d%d", device, major, minor);
    return guarded([&]() -> bb_status {
        std::unique_ptr<bb_cudnn> c(new bb_cudnn);
        c->sm = major * 10 + minor;
        const char *det = getenv("BB_CUDNN_DETERMINISTIC");
        c->deterministic = !(det && !strcmp(det, "0"));
        int rc = lib.create(&c->handle);
        if (rc) return bb_fail(BB_ERR_DEVICE, "cudnnCreate on cuda:%d: %s", device, lib.error_string(rc));
        if ((rc = lib.set_stream(c->handle, stream))) {
            lib.destroy(c->handle);
            return bb_fail(BB_ERR_DEVICE, "cudnnSetStream on cuda:%d: %s", device, lib.error_string(rc));
        }
        c->stream = stream;
        *out = c.release();
        return BB_OK;
    });
}

extern "C" bb_status bb_cudnn_attention_workspace(bb_cudnn *c, int B, int T, int NH, int KVH, int hs,
                                                  size_t *fwd_bytes, size_t *bwd_bytes)
{
    return guarded([&]() -> bb_status {
        cached_graph *f, *b;
        BB_TRY(forward_graph(c, B, T, NH, KVH, hs, &f));
        BB_TRY(backward_graph(c, B, T, NH, KVH, hs, &b));
        if (fwd_bytes) *fwd_bytes = (size_t)f->workspace;
        if (bwd_bytes) *bwd_bytes = (size_t)b->workspace;
        return BB_OK;
    });
}

extern "C" bb_status bb_cudnn_attention_forward(bb_cudnn *c, const uint16_t *qkv, uint16_t *out, float *lse, int B,
                                                int T, int NH, int KVH, int hs, void *workspace, size_t workspace_bytes)
{
    return guarded([&]() -> bb_status {
        cached_graph *g;
        BB_TRY(forward_graph(c, B, T, NH, KVH, hs, &g));
        uint16_t *in = const_cast<uint16_t *>(qkv);
        size_t C = (size_t)NH * hs, KV = (size_t)KVH * hs;
        float scale = 1.0f / sqrtf((float)hs);
        std::unordered_map<int64_t, void *> pack = {{UID_Q, in}, {UID_K, in + C}, {UID_V, in + C + KV},
                                                    {UID_SCALE, &scale}, {UID_O, out}, {UID_STATS, lse}};
        return execute(c, g, pack, workspace, workspace_bytes, "forward");
    });
}

extern "C" bb_status bb_cudnn_attention_backward(bb_cudnn *c, const uint16_t *qkv, const uint16_t *out,
                                                 const uint16_t *dout, const float *lse, uint16_t *dqkv, int B, int T,
                                                 int NH, int KVH, int hs, void *workspace, size_t workspace_bytes)
{
    return guarded([&]() -> bb_status {
        cached_graph *g;
        BB_TRY(backward_graph(c, B, T, NH, KVH, hs, &g));
        uint16_t *in = const_cast<uint16_t *>(qkv);
        size_t C = (size_t)NH * hs, KV = (size_t)KVH * hs;
        float scale = 1.0f / sqrtf((float)hs);
        std::unordered_map<int64_t, void *> pack = {
            {UID_Q, in},         {UID_K, in + C},      {UID_V, in + C + KV},
            {UID_O, const_cast<uint16_t *>(out)},      {UID_DO, const_cast<uint16_t *>(dout)},
            {UID_STATS, const_cast<float *>(lse)},     {UID_SCALE, &scale},
            {UID_DQ, dqkv},      {UID_DK, dqkv + C},   {UID_DV, dqkv + C + KV}};
        return execute(c, g, pack, workspace, workspace_bytes, "backward");
    });
}

extern "C" void bb_cudnn_close(bb_cudnn *c)
{
    if (!c) return;
    try {
        c->fwd = graph_cache(), c->bwd = graph_cache(); // the plans go before the handle
    } catch (...) {
    }
    if (c->handle) lib.destroy(c->handle);
    delete c;
}

#else // no graph code: the library is still loaded, to say why not

struct bb_cudnn {
    int unused;
};

extern "C" bb_status bb_cudnn_open(void *stream, bb_cudnn **out)
{
    (void)stream;
    *out = nullptr;
    pthread_once(&lib_once, load);
    return bb_fail(lib.status, "%s", lib.why);
}

extern "C" bb_status bb_cudnn_attention_workspace(bb_cudnn *, int, int, int, int, int, size_t *, size_t *)
{
    return bb_fail(BB_ERR_UNSUPPORTED, "cuDNN: no graph code in this build");
}

extern "C" bb_status bb_cudnn_attention_forward(bb_cudnn *, const uint16_t *, uint16_t *, float *, int, int, int,
                                                int, int, void *, size_t)
{
    return bb_fail(BB_ERR_UNSUPPORTED, "cuDNN: no graph code in this build");
}

extern "C" bb_status bb_cudnn_attention_backward(bb_cudnn *, const uint16_t *, const uint16_t *, const uint16_t *,
                                                 const float *, uint16_t *, int, int, int, int, int, void *, size_t)
{
    return bb_fail(BB_ERR_UNSUPPORTED, "cuDNN: no graph code in this build");
}

extern "C" void bb_cudnn_close(bb_cudnn *c) { (void)c; }

#endif

extern "C" const char *bb_cudnn_version(void) { return lib.version_text[0] ? lib.version_text : nullptr; }
extern "C" const char *bb_cudnn_engine(void)
{
    return lib.engine_text[0] ? lib.engine_text : nullptr;
}
