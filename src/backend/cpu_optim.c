/* cpu_optim.c — the CPU backend's optimizer steps (fp32 master weights and
 * state): AdamW and SGD element by element, LAMB and LARS with a tensor's
 * norms first (per-slice parts summed in slice order: the same bits for
 * any thread count), Muon's Newton-Schulz iteration on the pool's
 * products. Contracts are in ops.def. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_ew.h"
#include "cpu_ops.h"

static void adamw_range(const ew_args *a, size_t lo, size_t hi, int slice)
{
    (void)slice;
    float *params = a->x, *m = a->y, *v = a->z;
    const float *grads = a->a;
    float beta1 = a->f[0], beta2 = a->f[1], eps = a->f[2], step = a->f[3], decay = a->f[4], bc2_sqrt = a->f[5],
          scale = a->f[6];
    for (size_t i = lo; i < hi; i++) {
        float g = grads[i] * scale;
        m[i] = beta1 * m[i] + (1.0f - beta1) * g;
        v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
        float p = params[i] * decay;
        params[i] = p - step * m[i] / (sqrtf(v[i]) / bc2_sqrt + eps);
    }
}

void bb_cpu_adamw(bb_backend_t *b, float *params, const float *grads, float *m, float *v, size_t n, float lr,
               float beta1, float beta2, float eps, float weight_decay, int t, float grad_scale)
{
    /* torch.optim.AdamW's formula (foreach=False), in float: decay, then
     * step lr/bc1 along m / (sqrt(v)/sqrt(bc2) + eps). */
    float bc1 = 1.0f - powf(beta1, (float)t), bc2_sqrt = sqrtf(1.0f - powf(beta2, (float)t));
    float step = lr / bc1, decay = 1.0f - lr * weight_decay;
    bb_cpu_ew_run(b, &(ew_args){.range = adamw_range, .x = params, .y = m, .z = v, .a = grads, .n = n,
                         .f = {beta1, beta2, eps, step, decay, bc2_sqrt, grad_scale}});
}

static void sgd_range(const ew_args *a, size_t lo, size_t hi, int slice)
{
    (void)slice;
    float *params = a->x, *momentum_buf = a->y, lr = a->f[0], momentum = a->f[1], weight_decay = a->f[2],
          scale = a->f[3];
    const float *grads = a->a;
    for (size_t i = lo; i < hi; i++) {
        float d = grads[i] * scale + weight_decay * params[i];
        if (momentum != 0.0f) d = momentum_buf[i] = momentum * momentum_buf[i] + d;
        params[i] -= lr * d;
    }
}

void bb_cpu_sgd(bb_backend_t *b, float *params, const float *grads, float *momentum_buf, size_t n, float lr,
             float momentum, float weight_decay, float grad_scale)
{
    bb_cpu_ew_run(b, &(ew_args){.range = sgd_range, .x = params, .y = momentum_buf, .a = grads, .n = n,
                         .f = {lr, momentum, weight_decay, grad_scale}});
}

/* ---- the layer-wise optimizers: a tensor's norms, then its update ----------
 * Pass one leaves two sums per slice in parts (2·slice, 2·slice + 1),
 * summed in slice order: the same bits for any thread count. */
typedef struct two_norms {
    double a, b;
    bool ok; /* false: no memory for the parts (noted on the backend) */
} two_norms;

static two_norms run_norms(bb_backend_t *b, ew_args *a)
{
    a->grain = EW_GRAIN;
    int slices = bb_cpu_ew_slices(a);
    double few[16], *parts = slices <= 8 ? few : malloc((size_t)slices * 2 * sizeof *parts);
    if (!parts) {
        bb_backend_note_error(b, BB_ERR_NOMEM, "a layer-wise step's norms: out of host memory");
        return (two_norms){0.0, 0.0, false};
    }
    a->parts = parts;
    bb_cpu_ew_run(b, a);
    two_norms s = {0.0, 0.0};
    for (int k = 0; k < slices; k++) s.a += parts[2 * k], s.b += parts[2 * k + 1];
    if (parts != few) free(parts);
    return (two_norms){sqrt(s.a), sqrt(s.b), true};
}

/* LAMB's direction r = m^/(sqrt(v^) + eps) + wd·p (f: eps, 1/bc1, 1/bc2, wd). */
static inline float lamb_direction(const float *f, float m, float v, float p)
{
    return m * f[1] / (sqrtf(v * f[2]) + f[0]) + f[3] * p;
}

static void lamb_moments_range(const ew_args *a, size_t lo, size_t hi, int slice)
{
    float *params = a->x, *m = a->y, *v = a->z, beta1 = a->f[4], beta2 = a->f[5], scale = a->f[6];
    const float *grads = a->a;
    double wn = 0.0, rn = 0.0;
    for (size_t i = lo; i < hi; i++) {
        float g = grads[i] * scale;
        m[i] = beta1 * m[i] + (1.0f - beta1) * g;
        v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
        float r = lamb_direction(a->f, m[i], v[i], params[i]);
        wn += (double)params[i] * params[i], rn += (double)r * r;
    }
    a->parts[2 * slice] = wn, a->parts[2 * slice + 1] = rn;
}

static void lamb_apply_range(const ew_args *a, size_t lo, size_t hi, int slice)
{
    (void)slice;
    float *params = a->x, step = a->f[4];
    const float *m = a->y, *v = a->z;
    for (size_t i = lo; i < hi; i++) params[i] -= step * lamb_direction(a->f, m[i], v[i], params[i]);
}

void bb_cpu_lamb(bb_backend_t *b, float *params, const float *grads, float *m, float *v, size_t n, float lr,
                 float beta1, float beta2, float eps, float weight_decay, int t, float grad_scale)
{
    float f[7] = {eps, 1.0f / (1.0f - powf(beta1, (float)t)), 1.0f / (1.0f - powf(beta2, (float)t)), weight_decay,
                  beta1, beta2, grad_scale};
    ew_args a = {.range = lamb_moments_range, .x = params, .y = m, .z = v, .a = grads, .n = n};
    memcpy(a.f, f, sizeof f);
    two_norms norms = run_norms(b, &a);
    if (!norms.ok) return;
    f[4] = lr * bb_lamb_trust(norms.a, norms.b);
    a = (ew_args){.range = lamb_apply_range, .x = params, .y = m, .z = v, .n = n};
    memcpy(a.f, f, sizeof f);
    bb_cpu_ew_run(b, &a);
}

static void lars_norms_range(const ew_args *a, size_t lo, size_t hi, int slice)
{
    double wn = 0.0, gn = 0.0;
    for (size_t i = lo; i < hi; i++) {
        float g = a->a[i] * a->f[0];
        wn += (double)a->c[i] * a->c[i], gn += (double)g * g;
    }
    a->parts[2 * slice] = wn, a->parts[2 * slice + 1] = gn;
}

static void lars_apply_range(const ew_args *a, size_t lo, size_t hi, int slice)
{
    (void)slice;
    float *params = a->x, *buf = a->y, lr = a->f[0], momentum = a->f[1], weight_decay = a->f[2], trust = a->f[3],
          scale = a->f[4];
    const float *grads = a->a;
    for (size_t i = lo; i < hi; i++) {
        float d = (grads[i] * scale + weight_decay * params[i]) * trust;
        if (momentum != 0.0f) d = buf[i] = momentum * buf[i] + d;
        params[i] -= lr * d;
    }
}

void bb_cpu_lars(bb_backend_t *b, float *params, const float *grads, float *momentum_buf, size_t n, float lr,
                 float momentum, float weight_decay, float trust_coefficient, float grad_scale)
{
    float trust = 1.0f;
    if (trust_coefficient != 0.0f) {
        two_norms norms = run_norms(b, &(ew_args){.range = lars_norms_range, .a = grads, .c = params, .n = n,
                                                  .f = {grad_scale}});
        if (!norms.ok) return;
        trust = bb_lars_trust(norms.a, norms.b, trust_coefficient, weight_decay);
    }
    bb_cpu_ew_run(b, &(ew_args){.range = lars_apply_range, .x = params, .y = momentum_buf, .a = grads, .n = n,
                                .f = {lr, momentum, weight_decay, trust, grad_scale}});
}


/* ---- Muon --------------------------------------------------------------------
 * The momentum and the Nesterov direction into X with its squares per
 * slice (run_norms' first sum; f: momentum, grad_scale), then X scaled to
 * norm 1, the Newton-Schulz products on the pool, and the update. */
static void muon_momentum_range(const ew_args *a, size_t lo, size_t hi, int slice)
{
    float *x = a->x, *buf = a->y, momentum = a->f[0], scale = a->f[1];
    double squares = 0.0;
    for (size_t i = lo; i < hi; i++) {
        float g = a->a[i] * scale, m = buf[i] = momentum * buf[i] + (1.0f - momentum) * g;
        float u = x[i] = (1.0f - momentum) * g + momentum * m;
        squares += (double)u * u;
    }
    a->parts[2 * slice] = squares, a->parts[2 * slice + 1] = 0.0;
}

static void scale_range(const ew_args *a, size_t lo, size_t hi, int slice)
{
    (void)slice;
    for (size_t i = lo; i < hi; i++) a->x[i] *= a->f[0];
}

/* p = p·(1 - lr·wd) - step·X (f: 1 - lr·wd, step). */
static void muon_apply_range(const ew_args *a, size_t lo, size_t hi, int slice)
{
    (void)slice;
    float keep = a->f[0], step = a->f[1];
    for (size_t i = lo; i < hi; i++) a->x[i] = a->x[i] * keep - step * a->a[i];
}

void bb_cpu_muon(bb_backend_t *b, float *params, const float *grads, float *momentum_buf, float *work, int rows,
                 int cols, float lr, float momentum, float weight_decay, float update_scale, float grad_scale)
{
    size_t n = (size_t)rows * (size_t)cols;
    int s = rows < cols ? rows : cols;
    float *x = work, *y = work + n, *A = work + 2 * n, *B = A + (size_t)s * s;
    two_norms norm = run_norms(b, &(ew_args){.range = muon_momentum_range, .x = x, .y = momentum_buf, .a = grads,
                                             .n = n, .f = {momentum, grad_scale}});
    if (!norm.ok) return;
    bb_cpu_ew_run(b, &(ew_args){.range = scale_range, .x = x, .n = n, .f = {1.0f / ((float)norm.a + BB_MUON_EPS)}});
    bool wide = rows <= cols; /* X Xᵀ; else on Xᵀ: A = Xᵀ X, X = a X + X B */
    for (int k = 0; k < BB_MUON_NS_STEPS; k++) {
        if (wide) bb_cpu_sgemm(b, false, true, s, s, cols, 1.0f, x, cols, x, cols, 0.0f, A, s);
        else bb_cpu_sgemm(b, true, false, s, s, rows, 1.0f, x, cols, x, cols, 0.0f, A, s);
        memcpy(B, A, (size_t)s * s * sizeof *B);
        bb_cpu_sgemm(b, false, false, s, s, s, BB_MUON_C, A, s, A, s, BB_MUON_B, B, s);
        memcpy(y, x, n * sizeof *y);
        if (wide) bb_cpu_sgemm(b, false, false, rows, cols, rows, 1.0f, B, s, x, cols, BB_MUON_A, y, cols);
        else bb_cpu_sgemm(b, false, false, rows, cols, cols, 1.0f, x, cols, B, s, BB_MUON_A, y, cols);
        float *t = x;
        x = y, y = t;
    }
    bb_cpu_ew_run(b, &(ew_args){.range = muon_apply_range, .x = params, .a = x, .n = n,
                                .f = {1.0f - lr * weight_decay, lr * update_scale}});
}
