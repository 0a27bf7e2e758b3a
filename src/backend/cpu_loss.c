/* cpu_loss.c — the CPU backend's loss ops: softmax + cross-entropy over
 * rows of logits (fp32, or bf16 widened a row at a time into the thread's
 * buffer), their fixed-order sum, and a classifier's hits. Contracts are
 * in ops.def. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_math.h"
#include "cpu_ops.h"
#include "cpu_pool.h"

typedef struct xent_args {
    double *row_loss;
    float *dlogits;
    uint16_t *dlogits16; /* bf16 dlogits (may alias bf16 logits): each row rounded from fp32 */
    const float *logits;
    const uint16_t *logits16; /* bf16 logits: each row widened into its thread's part of `wide` first */
    float *wide;              /* (threads, V) */
    const int32_t *targets;
    int N, V, ld; /* ld: the rows' stride in logits and dlogits */
    float normalizer;
} xent_args;

enum { XENT_ROWS = 8 }; /* rows per task */

static void xent_task(void *ctx, int task, int thread)
{
    const xent_args *a = ctx;
    int V = a->V;
    size_t ld = (size_t)a->ld;
    for (int n = task * XENT_ROWS; n < a->N && n < (task + 1) * XENT_ROWS; n++) {
        const float *x = a->logits16 ? a->wide + (size_t)thread * V : a->logits + (size_t)n * ld;
        if (a->logits16) bb_bf16_widen(a->wide + (size_t)thread * V, a->logits16 + (size_t)n * ld, (size_t)V);
        float *dx = a->dlogits ? a->dlogits + (size_t)n * ld : NULL;
        uint16_t *dx16 = a->dlogits16 ? a->dlogits16 + (size_t)n * ld : NULL;
        int target = a->targets[n];
        a->row_loss[n] = 0.0;
        if (target < 0) {
            if (dx) memset(dx, 0, (size_t)V * sizeof *dx);
            if (dx16) memset(dx16, 0, (size_t)V * sizeof *dx16); /* +0.0 */
            continue;
        }
        float max = x[0];
        for (int i = 1; i < V; i++) max = x[i] > max ? x[i] : max;
        double sum = 0.0;
        for (int i = 0; i < V; i++) sum += bb_expf(x[i] - max);
        a->row_loss[n] = log(sum) - (double)(x[target] - max);
        if (dx) {
            /* The loss above already read x[target]: dx may alias x. */
            float scale = (float)(1.0 / sum) / a->normalizer;
            for (int i = 0; i < V; i++) dx[i] = bb_expf(x[i] - max) * scale;
            dx[target] -= 1.0f / a->normalizer;
        }
        if (dx16) {
            float scale = (float)(1.0 / sum) / a->normalizer;
            for (int i = 0; i < V; i++) dx16[i] = bb_bf16_from_float(bb_expf(x[i] - max) * scale);
            dx16[target] = bb_bf16_from_float(bb_expf(x[target] - max) * scale - 1.0f / a->normalizer);
        }
    }
}

/* Rows spread over the backend's threads. */
void bb_cpu_crossentropy_rows(bb_backend_t *b, double *row_loss, bb_tensor dlogits, bb_tensor logits,
                              const int32_t *targets, int N, int V, int ld, float normalizer)
{
    xent_args a = {.row_loss = row_loss, .dlogits = IS_BF16(dlogits) ? NULL : F32(dlogits),
                   .dlogits16 = IS_BF16(dlogits) ? H16(dlogits) : NULL, .logits = IS_BF16(logits) ? NULL : F32(logits),
                   .logits16 = IS_BF16(logits) ? H16(logits) : NULL, .targets = targets, .N = N, .V = V,
                   .ld = ld, .normalizer = normalizer};
    if (a.logits16 && !(a.wide = malloc((size_t)bb_cpu_threads(b) * V * sizeof(float)))) {
        bb_backend_note_error(b, BB_ERR_NOMEM, "crossentropy: out of host memory for %d threads' rows of %d logits",
                              bb_cpu_threads(b), V);
        return;
    }
    bb_cpu_parallel(b, (N + XENT_ROWS - 1) / XENT_ROWS, xent_task, &a);
    free(a.wide);
}

/* In row order: the same for any thread count or chunking. */
double bb_cpu_sum_rows(bb_backend_t *b, const double *rows, size_t n)
{
    (void)b;
    double total = 0.0;
    for (size_t i = 0; i < n; i++) total += rows[i];
    return total;
}

void bb_cpu_softmax_crossentropy(bb_backend_t *b, double *loss, bb_tensor dlogits, bb_tensor logits,
                                 const int32_t *targets, int N, int V, float normalizer, int *valid)
{
    double *rows = malloc(((size_t)N + 1) * sizeof(double));
    if (loss) *loss = NAN;
    if (valid) *valid = 0;
    if (!rows) {
        bb_backend_note_error(b, BB_ERR_NOMEM, "softmax_crossentropy: out of host memory for %d row losses", N);
        return;
    }
    bb_cpu_crossentropy_rows(b, rows, dlogits, logits, targets, N, V, V, normalizer);
    int counted = 0;
    for (int n = 0; n < N; n++) counted += targets[n] >= 0;
    if (loss) *loss = bb_cpu_sum_rows(b, rows, (size_t)N) / normalizer;
    if (valid) *valid = counted;
    free(rows);
}

int bb_cpu_count_correct(bb_backend_t *b, bb_tensor logits, const int32_t *targets, int N, int V)
{
    (void)b;
    int hits = 0;
    for (int n = 0; n < N; n++) {
        const float *row = F32(logits) + (size_t)n * V;
        int best = 0;
        for (int k = 1; k < V; k++) best = row[k] > row[best] ? k : best;
        hits += best == targets[n];
    }
    return hits;
}
