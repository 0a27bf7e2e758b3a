/* roofline.c — the roofline account (roofline.h): the counting backend's
 * work of a step, weighed against a GPU's datasheet peaks. */
#include <stdlib.h>
#include <string.h>

#include "bigbatch/roofline.h"

/* Datasheet figures, dense (no sparsity): the SXM parts. */
static const bb_gpu_peaks gpus[] = {
    {"a100", "NVIDIA A100 SXM 80 GB", 312e12, 19.5e12, 2.039e12},
    {"h100", "NVIDIA H100 SXM 80 GB", 989.4e12, 66.9e12, 3.35e12},
    {"h200", "NVIDIA H200 SXM 141 GB", 989.4e12, 66.9e12, 4.8e12},
};

const bb_gpu_peaks *bb_gpu_peaks_find(const char *name)
{
    for (size_t i = 0; name && i < sizeof gpus / sizeof *gpus; i++)
        if (!strcmp(gpus[i].name, name)) return &gpus[i];
    return NULL;
}

const char *bb_gpu_peaks_names(void) { return "a100, h100, h200"; }

/* One op's predicted milliseconds at the account's efficiencies. */
static double op_ms(const bb_op_time *t, const bb_gpu_peaks *g, bb_precision p)
{
    double memory = t->bytes / (g->memory_bytes_per_s * BB_ROOFLINE_MEMORY_EFFICIENCY);
    if (!(t->flops > 0)) return memory * 1e3;
    double peak = p == BB_PRECISION_BF16 ? g->bf16_flops : g->fp32_flops;
    double compute = t->flops / (peak * BB_ROOFLINE_PRODUCT_EFFICIENCY);
    return (compute > memory ? compute : memory) * 1e3;
}

static void add_rows(bb_roofline *r, const bb_op_time *t, int n, bool optimizer)
{
    for (int i = 0; i < n; i++) {
        bb_roofline_row *row = &r->rows[r->count++];
        *row = (bb_roofline_row){.op = t[i].op, .calls = (double)t[i].calls, .gflop = t[i].flops / 1e9,
                                 .gb = t[i].bytes / 1e9, .ms = op_ms(&t[i], r->gpu, r->precision),
                                 .product = t[i].flops > 0, .optimizer = optimizer};
        if (optimizer) r->optimizer_ms += row->ms, r->optimizer_gb += row->gb;
        else if (row->product) r->product_ms += row->ms, r->product_gflop += row->gflop;
        else r->other_ms += row->ms, r->other_gb += row->gb;
    }
}

static int by_ms(const void *a, const void *b)
{
    double x = ((const bb_roofline_row *)a)->ms, y = ((const bb_roofline_row *)b)->ms;
    return x < y ? 1 : x > y ? -1 : 0;
}

bb_status bb_roofline_account(const bb_model_config *cfg, int micro_batch, const bb_gpu_peaks *gpu, bb_roofline *out)
{
    memset(out, 0, sizeof *out);
    bb_step_work *w = malloc(sizeof *w);
    if (!w) return bb_fail(BB_ERR_NOMEM, "out of memory");
    bb_status rc = bb_plan_step_work(cfg, micro_batch, BB_OPTIMIZER_ADAMW, BB_DEVICE_CUDA, w);
    if (rc != BB_OK) {
        free(w);
        return rc;
    }
    out->gpu = gpu;
    out->precision = cfg->precision;
    out->params = (double)w->params;
    out->tokens = (double)micro_batch * bb_model_targets_per_example(cfg);
    add_rows(out, w->micro, w->nmicro, false);
    qsort(out->rows, (size_t)out->count, sizeof *out->rows, by_ms);
    int micro_rows = out->count;
    add_rows(out, w->opt, w->nopt, true);
    qsort(out->rows + micro_rows, (size_t)(out->count - micro_rows), sizeof *out->rows, by_ms);
    out->step_ms = out->product_ms + out->other_ms + out->optimizer_ms;
    out->tokens_per_s = out->step_ms > 0 ? out->tokens / (out->step_ms / 1e3) : 0;
    /* llm.c's model FLOPs: 6 per parameter and token, and causal attention
     * forward and backward, 3 times its forward, once per layer */
    double attention = 0;
    for (int i = 0; i < w->nmicro; i++)
        if (!strcmp(w->micro[i].op, "attention_forward") && w->micro[i].calls)
            attention = 3 * w->micro[i].flops / (double)w->micro[i].calls * bb_model_layers(cfg);
    double peak = cfg->precision == BB_PRECISION_BF16 ? gpu->bf16_flops : gpu->fp32_flops;
    out->mfu = out->step_ms > 0 ? (6 * out->params * out->tokens + attention) / (out->step_ms / 1e3) / peak : 0;
    free(w);
    return BB_OK;
}
