/* plan.c — the memory model and the candidate table (see plan.h). */
#include <stdlib.h>
#include <string.h>

#include "bigbatch/plan.h"

static uint64_t param_count(const bb_model_config *c)
{
    uint64_t n = 0;
    if (bb_model_targets_are_tokens(c)) {
        uint64_t C = (uint64_t)c->d_model;
        n = (uint64_t)c->vocab * C + (uint64_t)c->seq_len * C + 2 * C;        /* wte, wpe, ln_f */
        n += (uint64_t)c->layers * (12 * C * C + 13 * C);                     /* per block */
        return n;
    }
    int prev = c->inputs;
    for (int i = 0; i <= c->hidden_count; i++) {
        int out = i < c->hidden_count ? c->hidden[i] : c->classes;
        n += (uint64_t)out * prev + (uint64_t)out;
        prev = out;
    }
    return n;
}

/* Blocks (gpt) or linear layers (mlp) per checkpoint segment. */
static int segment_size(const bb_model_config *c)
{
    int layers = bb_model_targets_are_tokens(c) ? c->layers : c->hidden_count + 1;
    return c->checkpoint_every > 0 && c->checkpoint_every < layers ? c->checkpoint_every : layers;
}

static uint64_t activation_bytes(const bb_model_config *c, int micro_batch)
{
    uint64_t B = (uint64_t)micro_batch, K = (uint64_t)segment_size(c);
    if (bb_model_targets_are_tokens(c)) {
        uint64_t T = (uint64_t)c->seq_len, C = (uint64_t)c->d_model, H = (uint64_t)c->heads, V = (uint64_t)c->vocab;
        uint64_t BT = B * T, L = (uint64_t)c->layers, S = (L + K - 1) / K;
        uint64_t kept = BT * 16 * C + B * H * T * T; /* a block's kept tensors, in elements */
        uint64_t stats = 4 * 4 * BT;                   /* its two LayerNorms' mean and 1/std */
        uint64_t fixed = 4 * (BT * (10 * C + 2 + V) + B * H * T * T);
        if (c->precision == BB_PRECISION_BF16) /* fp32 work buffers and input, K-1 packed blocks, packed inputs */
            return 4 * kept + K * stats + 4 * BT * C + (K - 1) * 2 * kept + S * 2 * BT * C + fixed;
        return K * (4 * kept + stats) + S * 4 * BT * C + fixed;
    }
    int n = c->hidden_count + 1, widest = c->inputs;
    int width[BB_MLP_MAX_HIDDEN + 2];
    width[0] = c->inputs;
    for (int i = 1; i <= n; i++) {
        width[i] = i < n ? c->hidden[i - 1] : c->classes;
        widest = width[i] > widest ? width[i] : widest;
    }
    uint64_t row = (uint64_t)widest * B * 4, bytes = 0;
    int S = (n + (int)K - 1) / (int)K;
    for (int i = 1; i < S; i++) bytes += B * (uint64_t)width[i * K] * 4; /* checkpointed layer inputs */
    return bytes + K * 2 * row + 2 * row;                                  /* slots (pre, post), scratch */
}

void bb_plan_memory(const bb_model_config *c, int micro_batch, bb_optimizer_kind opt, bool cuda,
                    bb_memory_breakdown *m)
{
    uint64_t P = param_count(c), B = (uint64_t)micro_batch;
    memset(m, 0, sizeof *m);
    m->parameters = m->gradients = 4 * P;
    m->optimizer = 4 * P * (opt == BB_OPT_SGD ? 1 : 2);
    uint64_t rows = bb_model_targets_are_tokens(c) ? B * (uint64_t)c->seq_len : B;
    uint64_t inputs = bb_model_targets_are_tokens(c) ? rows : B * (uint64_t)c->inputs;
    m->batches = 2 * 4 * (inputs + rows); /* two sets: inputs and targets */
    if (cuda) m->batches += 2 * bb_model_record_buffer_bytes(c, micro_batch); /* and the raw records */
    m->activations = activation_bytes(c, micro_batch);
    if (cuda) { /* loss rows, column-sum partials, the embedding's sort, reduction partials, cuBLAS's workspace */
        uint64_t widest = bb_model_targets_are_tokens(c) ? 4 * (uint64_t)c->d_model : 1024;
        m->workspace = 8 * rows + 2 * 64 * 4 * widest + 6 * 4 * rows + 8192 + ((uint64_t)32 << 20);
    }
    m->total = m->parameters + m->gradients + m->optimizer + m->batches + m->activations + m->workspace;
    /* The loader's defaults (loader.c): 16 batches prefetched (fewer past 64 MiB) plus, per serving
     * thread (2 threads), the trainer's 3 held (one in use, two uploading: worker.c), each record
     * with its 8-byte id. */
    uint64_t record = bb_model_targets_are_tokens(c) ? (uint64_t)(c->seq_len + 1) * (c->vocab > 65536 ? 4 : 2)
                                               : (uint64_t)c->inputs + 1;
    uint64_t batch = B * (record + 8), prefetch = ((uint64_t)64 << 20) / (B * record);
    prefetch = prefetch >= 16 ? 16 : prefetch < 2 ? 2 : prefetch;
    m->loader_slots = (prefetch + 2 * 3) * batch;
}

/* ---- candidates -------------------------------------------------------- */
/* Per micro-step overhead (launches, the loader hand-off, small-matrix
 * inefficiency), in examples' worth of compute: an assumption, checked
 * against measurements in perf/RESULTS.md. */
#define MICRO_STEP_COST 0.25

static double relative_time(const bb_model_config *c, int micro_batch, int accumulation)
{
    int layers = bb_model_targets_are_tokens(c) ? c->layers : c->hidden_count + 1, K = segment_size(c);
    int S = (layers + K - 1) / K;
    double recompute = (double)(S - 1) * K / layers;         /* share of a forward done again */
    double examples = (double)micro_batch * accumulation;
    return (3.0 + recompute) / 3.0 * (examples + MICRO_STEP_COST * accumulation) / (examples + MICRO_STEP_COST);
}

static void checkpoint_name(int every, int layers, char *buf, size_t cap)
{
    if (every == 0 || every >= layers) snprintf(buf, cap, "none");
    else if (every == 1) snprintf(buf, cap, "blocks");
    else snprintf(buf, cap, "every:%d", every);
}

bb_status bb_plan_make(const bb_plan_request *q, bb_plan *out)
{
    memset(out, 0, sizeof *out);
    out->chosen = -1;
    if (q->devices < 1 || q->global_batch < 1 || q->global_batch % q->devices)
        return bb_fail(BB_ERR_ARG, "--global-batch %d does not split over %d devices", q->global_batch, q->devices);
    if (!bb_model_targets_are_tokens(&q->model) && q->model.precision != BB_PRECISION_FP32)
        return bb_fail(BB_ERR_ARG, "--precision bf16 stores gpt activations in bf16; the mlp's stay fp32");
    int per_device = q->global_batch / q->devices;
    int layers = bb_model_targets_are_tokens(&q->model) ? q->model.layers : q->model.hidden_count + 1;
    /* checkpoint policies: none, blocks, and every:K for K dividing into fewer segments */
    int policies[16], np = 0;
    policies[np++] = 0;
    for (int k = 1; k < layers && np < 16; k = k < 4 ? k + 1 : k * 2) policies[np++] = k;
    int cap = 0;
    for (int b = 1; b <= per_device; b++) cap += per_device % b == 0;
    out->rows = calloc((size_t)cap * (size_t)np, sizeof *out->rows);
    if (!out->rows) return bb_fail(BB_ERR_NOMEM, "out of memory");
    double margin = q->margin > 0 ? q->margin : 0.05;
    out->budget = q->device_mem ? (uint64_t)((double)q->device_mem * (1.0 - margin)) : UINT64_MAX;
    for (int b = per_device; b >= 1; b--) {
        if (per_device % b || (q->fixed_micro_batch > 0 && b != q->fixed_micro_batch)) continue;
        for (int i = 0; i < np; i++) {
            if (q->fixed_checkpoint >= 0 && policies[i] != q->fixed_checkpoint) continue;
            bb_plan_row *r = &out->rows[out->count++];
            bb_model_config c = q->model;
            c.checkpoint_every = policies[i];
            r->micro_batch = b;
            r->accumulation = per_device / b;
            r->checkpoint_every = policies[i];
            checkpoint_name(policies[i], layers, r->checkpoint, sizeof r->checkpoint);
            bb_plan_memory(&c, b, q->optimizer, q->cuda, &r->memory);
            r->relative_time = relative_time(&c, b, r->accumulation);
            r->fits = r->memory.total <= out->budget;
            if (r->fits && (out->chosen < 0 || r->relative_time < out->rows[out->chosen].relative_time - 1e-12))
                out->chosen = out->count - 1; /* ties keep the earlier, larger micro-batch */
        }
    }
    if (out->chosen >= 0) {
        out->rows[out->chosen].chosen = true;
        return BB_OK;
    }
    char need[24], have[24], fixed[24];
    bb_format_bytes(out->budget, have, sizeof have);
    if (!out->count) {
        snprintf(out->why_nothing_fits, sizeof out->why_nothing_fits,
                 "no candidate: the fixed --micro-batch %d does not divide the %d examples per device",
                 q->fixed_micro_batch, per_device);
        return BB_OK;
    }
    const bb_memory_breakdown *m = &out->rows[out->count - 1].memory; /* the smallest candidate */
    uint64_t state = m->parameters + m->gradients + m->optimizer;
    bb_format_bytes(state, fixed, sizeof fixed);
    uint64_t least = UINT64_MAX;
    for (int i = 0; i < out->count; i++) least = out->rows[i].memory.total < least ? out->rows[i].memory.total : least;
    bb_format_bytes(least, need, sizeof need);
    if (state > out->budget)
        snprintf(out->why_nothing_fits, sizeof out->why_nothing_fits,
                 "nothing fits: the parameters, gradients and %s state alone take %s, more than the %s usable "
                 "(--device-mem less a %.0f%% margin); a smaller model or more memory is needed",
                 q->optimizer == BB_OPT_SGD ? "SGD" : "AdamW", fixed, have, 100 * margin);
    else
        snprintf(out->why_nothing_fits, sizeof out->why_nothing_fits,
                 "nothing fits: even the smallest candidate (micro-batch 1, the most checkpointing) needs %s, "
                 "more than the %s usable (--device-mem less a %.0f%% margin)",
                 need, have, 100 * margin);
    return BB_OK;
}

void bb_plan_free(bb_plan *p)
{
    free(p->rows);
    p->rows = NULL;
    p->count = 0;
}
