/* gemm_bench.c — the machine's fp32 GEMM rate on a gpt step's own matrix
 * products, the ceiling that perf/train_bench.sh sets a training step's
 * achieved rate against.
 *
 *   gemm_bench TOKENS D_MODEL VOCAB LAYERS THREADS
 *
 * For a transformer block's linear layers (qkv C→3C, proj C→C, fc C→4C,
 * fc-proj 4C→C; LAYERS of them) and the LM head (C→V), over TOKENS rows
 * (a micro-batch), it times the three
 * products a training step makes of each (forward out = in·Wᵀ, dW = doutᵀ·in,
 * din = dout·W, row-major, as src/backend/cpu_ops.c calls cblas_sgemm)
 * with OpenBLAS on THREADS threads, median of 7 after 2 warm-ups, and
 * prints one JSON line: the products' FLOPs over their median time, each
 * block shape counted LAYERS times ("ceiling_gflops": the rate a
 * micro-step's GEMMs reach at best on this machine), each shape's rate,
 * and a square 2048 product's rate.
 * Build: gcc -O2 perf/gemm_bench.c $(pkg-config --cflags --libs openblas). */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

void openblas_set_num_threads(int);

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static float *filled(size_t n)
{
    float *p = malloc(n * sizeof *p);
    if (!p) {
        fprintf(stderr, "gemm_bench: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) p[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    return p;
}

/* Median seconds of C (M,N) = op(A)·op(B), K inner, row-major. */
static double time_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K)
{
    float *A = filled((size_t)M * K), *B = filled((size_t)K * N), *C = filled((size_t)M * N);
    int lda = ta == CblasNoTrans ? K : M, ldb = tb == CblasNoTrans ? N : K;
    double t[9];
    for (int r = 0; r < 9; r++) {
        double t0 = now();
        cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, N);
        t[r] = now() - t0;
    }
    free(A), free(B), free(C);
    qsort(t + 2, 7, sizeof *t, cmp);
    return t[2 + 3];
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: gemm_bench TOKENS D_MODEL VOCAB LAYERS THREADS\n");
        return 1;
    }
    int N = atoi(argv[1]), C = atoi(argv[2]), V = atoi(argv[3]), L = atoi(argv[4]), threads = atoi(argv[5]);
    if (N < 1 || C < 1 || V < 1 || L < 1 || threads < 1) {
        fprintf(stderr, "gemm_bench: TOKENS, D_MODEL, VOCAB, LAYERS and THREADS must be positive\n");
        return 1;
    }
    openblas_set_num_threads(threads);
    const struct {
        const char *name;
        int in, out;
    } layers[] = {{"qkv", C, 3 * C}, {"proj", C, C}, {"fc", C, 4 * C}, {"fc_proj", 4 * C, C}, {"head", C, V}};
    double flops = 0, seconds = 0;
    printf("{\"tokens\": %d, \"d_model\": %d, \"vocab\": %d, \"layers\": %d, \"threads\": %d", N, C, V, L, threads);
    for (size_t i = 0; i < sizeof layers / sizeof *layers; i++) {
        int IC = layers[i].in, OC = layers[i].out;
        double t = time_gemm(CblasNoTrans, CblasTrans, N, OC, IC) /* forward */
                   + time_gemm(CblasTrans, CblasNoTrans, OC, IC, N) /* dW */
                   + time_gemm(CblasNoTrans, CblasNoTrans, N, IC, OC); /* din */
        double f = 3 * 2.0 * N * IC * OC;
        printf(", \"%s_gflops\": %.1f", layers[i].name, f / t * 1e-9);
        int times = i + 1 < sizeof layers / sizeof *layers ? L : 1; /* the head (last) once */
        flops += times * f, seconds += times * t;
    }
    double sq = time_gemm(CblasNoTrans, CblasNoTrans, 2048, 2048, 2048);
    printf(", \"ceiling_gflops\": %.1f, \"square2048_gflops\": %.1f}\n", flops / seconds * 1e-9,
           2.0 * 2048 * 2048 * 2048 / sq * 1e-9);
    return 0;
}
