// cuda_optim.cu — the CUDA kernels of the optimizers' steps (fp32 master
// weights and state: AdamW, SGD, LAMB, LARS, Muon's element-wise passes),
// then their launchers. LAMB's, LARS's and Muon's norms are summed on the
// device in a fixed order and read there by the next kernel: no wait for
// the host.
#include <math.h>

#include "bigbatch/backend.h"
#include "cuda_device.cuh"
#include "cuda_grid.cuh"
#include "cuda_kernels.h"

namespace {

// ---- optimizers --------------------------------------------------------------
// torch.optim.AdamW (foreach=False): decay, then lr/bias1 · m / (sqrt(v)/bias2_sqrt + eps),
// on the gradient times `scale` (a clip's factor).
__global__ void adamw_k(float *p, const float *g, float *m, float *v, size_t n, float lr, float b1, float b2, float eps,
                        float wd, float bias1, float bias2_sqrt, float scale)
{
    float step = lr / bias1, decay = 1.0f - lr * wd;
    GRID_STRIDE(i, n)
    {
        float gi = g[i] * scale;
        float mi = m[i] = b1 * m[i] + (1.0f - b1) * gi;
        float vi = v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
        p[i] = p[i] * decay - step * mi / (sqrtf(vi) / bias2_sqrt + eps);
    }
}

__global__ void sgd_k(float *p, const float *g, float *buf, size_t n, float lr, float momentum, float wd, float scale)
{
    GRID_STRIDE(i, n)
    {
        float d = g[i] * scale + wd * p[i];
        if (momentum != 0.0f) d = buf[i] = momentum * buf[i] + d;
        p[i] -= lr * d;
    }
}

// The layer-wise optimizers (LAMB, LARS): pass one leaves each block's two
// sums of squares in partial[block] and partial[half + block], which
// bbk_sum_rows adds in order into sums[0], sums[1]; pass two reads them
// there and takes the trust ratio, with no wait for the host.
__device__ void block_sums2(double *partial, int half, double a, double b)
{
    a = block_sum_double(a);
    b = block_sum_double(b);
    if (threadIdx.x == 0) partial[blockIdx.x] = a, partial[half + blockIdx.x] = b;
}

// LAMB's direction r = m^/(sqrt(v^) + eps) + wd·p, as the CPU's.
struct LambArgs {
    float eps, inv_bias1, inv_bias2, wd, beta1, beta2, scale;
    __device__ float direction(float m, float v, float p) const { return m * inv_bias1 / (sqrtf(v * inv_bias2) + eps) + wd * p; }
};

__global__ void lamb_moments_k(float *p, const float *g, float *m, float *v, size_t n, LambArgs a, double *partial,
                               int half)
{
    double wn = 0.0, rn = 0.0;
    GRID_STRIDE(i, n)
    {
        float gi = g[i] * a.scale;
        float mi = m[i] = a.beta1 * m[i] + (1.0f - a.beta1) * gi;
        float vi = v[i] = a.beta2 * v[i] + (1.0f - a.beta2) * gi * gi;
        float r = a.direction(mi, vi, p[i]);
        wn += (double)p[i] * p[i], rn += (double)r * r;
    }
    block_sums2(partial, half, wn, rn);
}

__global__ void lamb_apply_k(float *p, const float *m, const float *v, size_t n, LambArgs a, float lr,
                             const double *sums)
{
    float step = lr * bb_lamb_trust(sqrt(sums[0]), sqrt(sums[1]));
    GRID_STRIDE(i, n) p[i] -= step * a.direction(m[i], v[i], p[i]);
}

__global__ void lars_norms_k(const float *p, const float *g, size_t n, float scale, double *partial, int half)
{
    double wn = 0.0, gn = 0.0;
    GRID_STRIDE(i, n)
    {
        float gi = g[i] * scale;
        wn += (double)p[i] * p[i], gn += (double)gi * gi;
    }
    block_sums2(partial, half, wn, gn);
}

// sums NULL: trust 1 (a tensor LARS does not adapt).
__global__ void lars_apply_k(float *p, const float *g, float *buf, size_t n, float lr, float momentum, float wd,
                             float coefficient, float scale, const double *sums)
{
    float trust = sums ? bb_lars_trust(sqrt(sums[0]), sqrt(sums[1]), coefficient, wd) : 1.0f;
    GRID_STRIDE(i, n)
    {
        float d = (g[i] * scale + wd * p[i]) * trust;
        if (momentum != 0.0f) d = buf[i] = momentum * buf[i] + d;
        p[i] -= lr * d;
    }
}

// Muon: the momentum and the Nesterov direction into x, each block's sum
// of x's squares in partial[block]; then x scaled to norm 1 (the total in
// sums[0]); then the update from the orthogonalized x.
__global__ void muon_momentum_k(float *x, float *buf, const float *g, size_t n, float momentum, float scale,
                                double *partial)
{
    double squares = 0.0;
    GRID_STRIDE(i, n)
    {
        float gi = g[i] * scale, m = buf[i] = momentum * buf[i] + (1.0f - momentum) * gi;
        float u = x[i] = (1.0f - momentum) * gi + momentum * m;
        squares += (double)u * u;
    }
    squares = block_sum_double(squares);
    if (threadIdx.x == 0) partial[blockIdx.x] = squares;
}

__global__ void muon_normalize_k(float *x, size_t n, const double *sums)
{
    float inv = 1.0f / ((float)sqrt(sums[0]) + BB_MUON_EPS);
    GRID_STRIDE(i, n) x[i] *= inv;
}

__global__ void muon_apply_k(float *p, const float *x, size_t n, float keep, float step)
{
    GRID_STRIDE(i, n) p[i] = p[i] * keep - step * x[i];
}

} // namespace

extern "C" {

cudaError_t bbk_adamw(cudaStream_t s, float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                      float beta2, float eps, float weight_decay, float bias1, float bias2_sqrt, float grad_scale)
{
    BB_LAUNCH(adamw_k, grid_for(n), kThreads, 0, s)(p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, bias1,
                                                    bias2_sqrt, grad_scale);
    return cudaGetLastError();
}

cudaError_t bbk_sgd(cudaStream_t s, float *p, const float *g, float *buf, size_t n, float lr, float momentum,
                    float weight_decay, float grad_scale)
{
    BB_LAUNCH(sgd_k, grid_for(n), kThreads, 0, s)(p, g, buf, n, lr, momentum, weight_decay, grad_scale);
    return cudaGetLastError();
}

// The blocks of a layer-wise pass one: at most half of the partials.
static unsigned norm_blocks(size_t n, int partials)
{
    unsigned g = grid_for(n), half = (unsigned)(partials / 2);
    return g < half ? g : half;
}

static cudaError_t sum_halves(cudaStream_t s, double *partial, int half, unsigned blocks, double *sums)
{
    cudaError_t e = bbk_sum_rows(s, sums, partial, (int)blocks);
    return e != cudaSuccess ? e : bbk_sum_rows(s, sums + 1, partial + half, (int)blocks);
}

cudaError_t bbk_lamb(cudaStream_t s, float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                     float beta2, float eps, float weight_decay, float bias1, float bias2, float grad_scale,
                     double *partial, int partials, double *sums)
{
    LambArgs a = {eps, 1.0f / bias1, 1.0f / bias2, weight_decay, beta1, beta2, grad_scale};
    unsigned blocks = norm_blocks(n, partials);
    int half = partials / 2;
    BB_LAUNCH(lamb_moments_k, blocks, kThreads, 0, s)(p, g, m, v, n, a, partial, half);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = sum_halves(s, partial, half, blocks, sums);
    if (e != cudaSuccess) return e;
    BB_LAUNCH(lamb_apply_k, grid_for(n), kThreads, 0, s)(p, m, v, n, a, lr, sums);
    return cudaGetLastError();
}

cudaError_t bbk_lars(cudaStream_t s, float *p, const float *g, float *buf, size_t n, float lr, float momentum,
                     float weight_decay, float trust_coefficient, float grad_scale, double *partial, int partials,
                     double *sums)
{
    if (trust_coefficient != 0.0f) {
        unsigned blocks = norm_blocks(n, partials);
        int half = partials / 2;
        BB_LAUNCH(lars_norms_k, blocks, kThreads, 0, s)(p, g, n, grad_scale, partial, half);
        cudaError_t e = cudaGetLastError();
        if (e == cudaSuccess) e = sum_halves(s, partial, half, blocks, sums);
        if (e != cudaSuccess) return e;
    }
    BB_LAUNCH(lars_apply_k, grid_for(n), kThreads, 0, s)(p, g, buf, n, lr, momentum, weight_decay, trust_coefficient,
                                                        grad_scale, trust_coefficient != 0.0f ? sums : nullptr);
    return cudaGetLastError();
}

cudaError_t bbk_muon_direction(cudaStream_t s, float *x, float *buf, const float *g, size_t n, float momentum,
                               float grad_scale, double *partial, int partials, double *sums)
{
    unsigned blocks = norm_blocks(n, 2 * partials); // all the partials: one sum
    BB_LAUNCH(muon_momentum_k, blocks, kThreads, 0, s)(x, buf, g, n, momentum, grad_scale, partial);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = bbk_sum_rows(s, sums, partial, (int)blocks);
    if (e != cudaSuccess) return e;
    BB_LAUNCH(muon_normalize_k, grid_for(n), kThreads, 0, s)(x, n, sums);
    return cudaGetLastError();
}

cudaError_t bbk_muon_apply(cudaStream_t s, float *p, const float *x, size_t n, float keep, float step)
{
    BB_LAUNCH(muon_apply_k, grid_for(n), kThreads, 0, s)(p, x, n, keep, step);
    return cudaGetLastError();
}

} // extern "C"
