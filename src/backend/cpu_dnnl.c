/* cpu_dnnl.c — bf16 matrix products through oneDNN's matmul (cpu_dnnl.h).
 *
 * One engine for the process; per thread (pthread key, freed when the
 * thread ends) a oneDNN stream and a cache of primitives keyed by the
 * product's shape, strides, output type, bias and accumulation, each with
 * its memory objects (their data handles set per call) and a scratchpad
 * of its own (user scratchpad mode: no scratchpad is shared between
 * threads). oneDNN's OpenMP parallelism is set to one thread in each
 * thread that calls it: the backend's pool is the parallelism. */
#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_dnnl.h"
#include "cpu_math.h"

enum { CACHE = 96 };

typedef struct gemm_key {
    int M, N, K, lda, ldb, ldc;
    bool ta, tb, bias, accumulate;
    bb_dtype c_dtype;
} gemm_key;

typedef struct entry {
    gemm_key key;
    bool used;
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c, bias, scratch;
    void *scratch_data;
} entry;

typedef struct thread_cache {
    dnnl_stream_t stream;
    entry e[CACHE];
    int next; /* the slot the next new shape replaces once all are used */
} thread_cache;

static dnnl_engine_t engine;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_key_t cache_key;
static const char *products = "OpenBLAS fp32 (no bf16 matmul on this CPU)";
static bool use_dnnl;

static void entry_free(entry *e)
{
    if (!e->used) return;
    dnnl_primitive_destroy(e->prim);
    dnnl_memory_t *mems[] = {&e->a, &e->b, &e->c, &e->bias, &e->scratch};
    for (size_t i = 0; i < sizeof mems / sizeof *mems; i++)
        if (*mems[i]) dnnl_memory_destroy(*mems[i]);
    free(e->scratch_data);
    memset(e, 0, sizeof *e);
}

static void cache_free(void *p)
{
    thread_cache *c = p;
    for (int i = 0; i < CACHE; i++) entry_free(&c->e[i]);
    if (c->stream) dnnl_stream_destroy(c->stream);
    free(c);
}

/* A 2-d bf16 matmul of a small shape: whether oneDNN has one here. */
static bool probe(void)
{
    dnnl_memory_desc_t a, b, c;
    dnnl_dims_t d = {16, 16};
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd = NULL;
    if (dnnl_memory_desc_init_by_tag(&a, 2, d, dnnl_bf16, dnnl_ab) || dnnl_memory_desc_init_by_tag(&b, 2, d, dnnl_bf16, dnnl_ab) ||
        dnnl_memory_desc_init_by_tag(&c, 2, d, dnnl_f32, dnnl_ab) || dnnl_matmul_desc_init(&md, &a, &b, NULL, &c) ||
        dnnl_primitive_desc_create(&pd, &md, NULL, engine, NULL))
        return false;
    dnnl_primitive_desc_destroy(pd);
    return true;
}

/* oneDNN with AMX, else OpenBLAS's fp32 sgemm on the widened operands:
 * without AMX oneDNN 2.x's bf16 matmul (AVX512-BF16 or emulated) runs
 * below OpenBLAS's fp32 rate on the model's shapes (perf/RESULTS.md), and
 * both take the same bf16 values and sum in fp32. BB_BF16_PRODUCTS=onednn
 * or openblas chooses (a benchmark's knob; read once, before any product;
 * empty: the rule). */
static void setup(void)
{
    pthread_key_create(&cache_key, cache_free);
    if (dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success || !probe()) return;
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    bool amx = (isa & dnnl_cpu_isa_avx512_core_amx) == dnnl_cpu_isa_avx512_core_amx;
    bool vnni = (isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16;
    const char *force = getenv("BB_BF16_PRODUCTS");
    bool on = force && !strcmp(force, "onednn"), off = force && !strcmp(force, "openblas");
    if (force && *force && !on && !off)
        BB_WARN("BB_BF16_PRODUCTS=%s is not onednn or openblas; ignored", force);
    use_dnnl = on || (!off && amx);
    products = use_dnnl ? (amx ? "oneDNN bf16 (AMX)" : vnni ? "oneDNN bf16 (AVX512-BF16)" : "oneDNN bf16 (emulated)")
               : vnni   ? "OpenBLAS fp32 on bf16 operands (faster here than oneDNN's AVX512-BF16 without AMX)"
                        : "OpenBLAS fp32 on bf16 operands (oneDNN's bf16 is emulated on this CPU)";
}

const char *bb_cpu_bf16_products(void)
{
    pthread_once(&once, setup);
    return products;
}

bool bb_cpu_bf16_onednn(void)
{
    pthread_once(&once, setup);
    return use_dnnl;
}

static thread_cache *this_thread(void)
{
    thread_cache *c = pthread_getspecific(cache_key);
    if (c) return c;
    if (!(c = calloc(1, sizeof *c))) return NULL;
    if (dnnl_stream_create(&c->stream, engine, dnnl_stream_default_flags) != dnnl_success) {
        free(c);
        return NULL;
    }
    omp_set_num_threads(1); /* oneDNN runs in this thread only */
    pthread_setspecific(cache_key, c);
    return c;
}

static void strided(dnnl_memory_desc_t *md, int rows, int cols, int ld, bool trans, dnnl_data_type_t t)
{
    dnnl_dims_t dims = {rows, cols}, strides = {trans ? 1 : ld, trans ? ld : 1};
    dnnl_memory_desc_init_by_strides(md, 2, dims, t, strides);
}

/* A primitive and its memory objects for k; false when oneDNN refuses it
 * (or memory runs out). */
static bool entry_make(entry *e, const gemm_key *k)
{
    dnnl_memory_desc_t a, b, c, bias;
    strided(&a, k->M, k->K, k->lda, k->ta, dnnl_bf16);
    strided(&b, k->K, k->N, k->ldb, k->tb, dnnl_bf16);
    strided(&c, k->M, k->N, k->ldc, false, k->c_dtype == BB_DTYPE_BF16 ? dnnl_bf16 : dnnl_f32);
    strided(&bias, 1, k->N, k->N, false, dnnl_f32);
    dnnl_matmul_desc_t md;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    bool ok = dnnl_matmul_desc_init(&md, &a, &b, k->bias ? &bias : NULL, &c) == dnnl_success &&
              dnnl_primitive_attr_create(&attr) == dnnl_success &&
              dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) == dnnl_success;
    if (ok && k->accumulate)
        ok = dnnl_post_ops_create(&po) == dnnl_success && dnnl_post_ops_append_sum(po, 1.0f) == dnnl_success &&
             dnnl_primitive_attr_set_post_ops(attr, po) == dnnl_success;
    ok = ok && dnnl_primitive_desc_create(&pd, &md, attr, engine, NULL) == dnnl_success;
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (!ok) return false;
    e->key = *k, e->used = true;
    const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    size_t sbytes = smd ? dnnl_memory_desc_get_size(smd) : 0;
    ok = dnnl_primitive_create(&e->prim, pd) == dnnl_success &&
         dnnl_memory_create(&e->a, &a, engine, DNNL_MEMORY_NONE) == dnnl_success &&
         dnnl_memory_create(&e->b, &b, engine, DNNL_MEMORY_NONE) == dnnl_success &&
         dnnl_memory_create(&e->c, &c, engine, DNNL_MEMORY_NONE) == dnnl_success &&
         (!k->bias || dnnl_memory_create(&e->bias, &bias, engine, DNNL_MEMORY_NONE) == dnnl_success) &&
         (!sbytes || ((e->scratch_data = aligned_alloc(64, (sbytes + 63) / 64 * 64)) &&
                      dnnl_memory_create(&e->scratch, smd, engine, e->scratch_data) == dnnl_success));
    dnnl_primitive_desc_destroy(pd);
    if (!ok) entry_free(e);
    return ok;
}

static entry *lookup(thread_cache *tc, const gemm_key *k)
{
    for (int i = 0; i < CACHE; i++)
        if (tc->e[i].used && !memcmp(&tc->e[i].key, k, sizeof *k)) return &tc->e[i];
    entry *e = NULL;
    for (int i = 0; i < CACHE && !e; i++)
        if (!tc->e[i].used) e = &tc->e[i];
    if (!e) { /* every slot used: replace them in turn */
        e = &tc->e[tc->next];
        tc->next = (tc->next + 1) % CACHE;
        entry_free(e);
    }
    return entry_make(e, k) ? e : NULL;
}

/* Without oneDNN: each thread's fp32 buffers (a slice's A, B and C), grown
 * as needed and kept until the thread ends. */
typedef struct fp32_buffers {
    float *f[3];
    size_t cap[3];
} fp32_buffers;
static pthread_key_t buffers_key;
static pthread_once_t buffers_once = PTHREAD_ONCE_INIT;

static void buffers_free(void *p)
{
    fp32_buffers *fb = p;
    for (int i = 0; i < 3; i++) free(fb->f[i]);
    free(fb);
}
static void buffers_setup(void) { pthread_key_create(&buffers_key, buffers_free); }

static float *thread_buffer(int which, size_t n)
{
    pthread_once(&buffers_once, buffers_setup);
    fp32_buffers *fb = pthread_getspecific(buffers_key);
    if (!fb && (!(fb = calloc(1, sizeof *fb)) || pthread_setspecific(buffers_key, fb) != 0)) {
        free(fb);
        return NULL;
    }
    if (fb->cap[which] < n) {
        free(fb->f[which]);
        fb->cap[which] = 0;
        if (!(fb->f[which] = malloc(n * sizeof(float)))) return NULL;
        fb->cap[which] = n;
    }
    return fb->f[which];
}

/* `rows` rows of `cols` bf16 at stride ld as fp32: `given` (already
 * widened, stride ld), else widened into the thread's buffer `which`
 * (stride cols). NULL when out of memory. */
static const float *operand(const uint16_t *x, const float *given, int rows, int cols, int *ld, int which)
{
    if (given) return given;
    float *f = thread_buffer(which, (size_t)rows * cols);
    if (!f) return NULL;
    for (int r = 0; r < rows; r++) bb_bf16_widen(f + (size_t)r * cols, x + (size_t)r * *ld, (size_t)cols);
    *ld = cols;
    return f;
}

/* OpenBLAS's sgemm on the operands in fp32 (the same values). */
static bool fp32_gemm(const bb_cpu_bf16_gemm *g)
{
    int lda = g->lda, ldb = g->ldb, ldc = g->ldc;
    const float *a = operand(g->A, g->A32, g->ta ? g->K : g->M, g->ta ? g->M : g->K, &lda, 0);
    const float *b = operand(g->B, g->B32, g->tb ? g->N : g->K, g->tb ? g->K : g->N, &ldb, 1);
    bool f32 = g->c_dtype == BB_DTYPE_F32;
    float *c = f32 ? g->C : thread_buffer(2, (size_t)g->M * g->N);
    if (!a || !b || !c) return false;
    if (!f32) ldc = g->N;
    if (g->bias && !g->accumulate)
        for (int r = 0; r < g->M; r++) memcpy(c + (size_t)r * ldc, g->bias, (size_t)g->N * sizeof *c);
    cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans, g->M, g->N, g->K,
                1.0f, a, lda, b, ldb, g->bias || g->accumulate ? 1.0f : 0.0f, c, ldc);
    for (int r = 0; !f32 && r < g->M; r++)
        bb_bf16_narrow((uint16_t *)g->C + (size_t)r * g->ldc, c + (size_t)r * ldc, (size_t)g->N);
    return true;
}

bool bb_cpu_bf16_gemm_run(const bb_cpu_bf16_gemm *g)
{
    if (g->M <= 0 || g->N <= 0) return true;
    pthread_once(&once, setup);
    if (!use_dnnl) return fp32_gemm(g);
    thread_cache *tc = this_thread();
    if (!tc) return false;
    gemm_key k = {g->M, g->N, g->K, g->lda, g->ldb, g->ldc, g->ta, g->tb, g->bias != NULL, g->accumulate, g->c_dtype};
    entry *e = lookup(tc, &k);
    if (!e) return fp32_gemm(g); /* a shape oneDNN refuses */
    dnnl_memory_set_data_handle(e->a, (void *)g->A);
    dnnl_memory_set_data_handle(e->b, (void *)g->B);
    dnnl_memory_set_data_handle(e->c, g->C);
    dnnl_exec_arg_t args[5] = {{DNNL_ARG_SRC, e->a}, {DNNL_ARG_WEIGHTS, e->b}, {DNNL_ARG_DST, e->c}};
    int n = 3;
    if (e->bias) {
        dnnl_memory_set_data_handle(e->bias, (void *)g->bias);
        args[n++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, e->bias};
    }
    if (e->scratch) args[n++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, e->scratch};
    if (dnnl_primitive_execute(e->prim, tc->stream, n, args) != dnnl_success) return fp32_gemm(g);
    dnnl_stream_wait(tc->stream);
    return true;
}
