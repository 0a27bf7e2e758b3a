/* roofline.h — the roofline account of a training step on a GPU that is
 * not here: every op's FLOPs and bytes, as the counting backend counts them
 * at the model's dtypes (ops.def's flops and bytes), weighed against a
 * GPU's published peaks.
 *
 * How to use:
 *   const bb_gpu_peaks *g = bb_gpu_peaks_find("h200");   // NULL: unknown
 *   bb_roofline r;
 *   BB_TRY(bb_roofline_account(&cfg, 8, g, &r));          // cfg: shape and precision
 *   printf("%.0f tokens/s, MFU %.1f%%\n", r.tokens_per_s, 100 * r.mfu);
 *
 * The model: an op with FLOPs (the matrix products and attention: a
 * "product") takes the longer of its FLOPs at BB_ROOFLINE_PRODUCT_EFFICIENCY
 * of the peak of the step's precision (bf16 dense tensor cores under bf16,
 * plain fp32 under fp32) and its bytes at BB_ROOFLINE_MEMORY_EFFICIENCY of
 * the memory bandwidth; every other op its bytes at that bandwidth. An
 * op's bytes are the traffic it cannot avoid (each input read once, each
 * output written once): a backend's extra passes, launch gaps and
 * overlaps are not counted, so the account is a design's ceiling, not a
 * measurement. A step is one micro-step (forward, loss, backward) and the
 * optimizer's step (AdamW, as `bench model` times). MFU counts llm.c's
 * model FLOPs: 6·P per token plus 6·L·C·T for causal attention (L layers
 * of width C·, from the attention's counted FLOPs), over the peak.
 */
#ifndef BIGBATCH_ROOFLINE_H
#define BIGBATCH_ROOFLINE_H

#include "bigbatch/plan.h"

#define BB_ROOFLINE_PRODUCT_EFFICIENCY 0.70
#define BB_ROOFLINE_MEMORY_EFFICIENCY 0.80

/* A GPU's datasheet figures (dense, no sparsity). */
typedef struct bb_gpu_peaks {
    const char *name;          /* "h200": what --roofline takes */
    const char *part;          /* "NVIDIA H200 SXM 141 GB" */
    double bf16_flops, fp32_flops, memory_bytes_per_s;
} bb_gpu_peaks;

/* The GPU named `name` (case-sensitive: a100, h100, h200), or NULL. */
const bb_gpu_peaks *bb_gpu_peaks_find(const char *name);
/* "a100, h100, h200": for errors and --help. */
const char *bb_gpu_peaks_names(void);

/* One op of the account: its work in one step and its predicted time. */
typedef struct bb_roofline_row {
    const char *op;
    double calls, gflop, gb, ms;
    bool product;              /* FLOPs counted: a matrix product or attention */
    bool optimizer;            /* the optimizer's step, not the micro-step */
} bb_roofline_row;

typedef struct bb_roofline {
    const bb_gpu_peaks *gpu;
    bb_precision precision;
    bb_roofline_row rows[2 * BB_STEP_WORK_CAP]; /* the micro-step's ops, then the optimizer's; longest first in each */
    int count;
    double tokens;             /* targets a step: micro-batch × T (gpt), micro-batch (mlp) */
    double params;
    double product_ms, product_gflop;     /* the micro-step's products */
    double other_ms, other_gb;            /* the micro-step's other ops: its non-product traffic */
    double optimizer_ms, optimizer_gb;
    double step_ms, tokens_per_s, mfu;
} bb_roofline;

/* The account of cfg's step at micro-batch B on `gpu` (the model built on
 * a counting backend of the CUDA device kind: nothing allocated, nothing
 * run). Fails with BB_ERR_ARG when the model cannot be built (its
 * message), BB_ERR_NOMEM. */
bb_status bb_roofline_account(const bb_model_config *cfg, int micro_batch, const bb_gpu_peaks *gpu, bb_roofline *out);

#endif /* BIGBATCH_ROOFLINE_H */
