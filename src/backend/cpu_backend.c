/* cpu_backend.c — the CPU backend: device memory is host memory (64-byte
 * aligned), copies are memcpy, the ops of cpu_ops.c and cpu_attention.c,
 * and a pool of worker threads (cpu_pool.c) made when an op first splits. */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_dnnl.h"
#include "cpu_ops.h"
#include "cpu_pool.h"

static bb_status cpu_alloc(bb_backend_t *b, size_t bytes, void **out)
{
    (void)b;
    *out = aligned_alloc(64, (bytes + 63) / 64 * 64);
    return *out ? BB_OK : BB_ERR_OOM;
}

static void cpu_free(bb_backend_t *b, void *ptr)
{
    (void)b;
    free(ptr);
}

static bb_status cpu_copy(bb_backend_t *b, void *dst, const void *src, size_t bytes, bb_copy_kind kind)
{
    (void)b, (void)kind;
    memmove(dst, src, bytes);
    return BB_OK;
}

static bb_status cpu_memset(bb_backend_t *b, void *dst, int value, size_t bytes)
{
    (void)b;
    memset(dst, value, bytes);
    return BB_OK;
}

static void cpu_destroy(bb_backend_t *b) { bb_cpu_pool_destroy(b); }

static const char *cpu_bf16_products(bb_backend_t *b)
{
    (void)b;
    return bb_cpu_bf16_products();
}

const bb_backend_vtable bb_cpu_vtable = {
    .host_is_device = true,
    .bf16_products = cpu_bf16_products,
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy = cpu_copy,
    .memset = cpu_memset,
#define BB_OP(name, ...) .name = bb_cpu_##name,
#define BB_OP_VALUE(type, name, ...) .name = bb_cpu_##name,
#include "bigbatch/ops.def"
};

bb_status bb_backend_create_cpu(const bb_backend_options *o, bb_backend_t **out)
{
    *out = NULL;
    bb_backend_t *b = calloc(1, sizeof *b);
    if (!b) return bb_fail(BB_ERR_NOMEM, "out of memory");
    b->vt = &bb_cpu_vtable;
    bb_backend_init_common(b, BB_DEVICE_CPU, "cpu", o);
    /* OpenBLAS runs in the caller's thread; each backend's pool (threads:
     * the trainer divides the cores among its CPU devices) splits the
     * products and the other ops. */
    openblas_set_num_threads(1);
    *out = b;
    return BB_OK;
}

/* Debian's OpenBLAS 0.3.21 may pick a generic kernel ("Prescott") on CPUs it
 * does not know, and then runs sgemm ~6x slower (ARCHITECTURE.md's measured
 * facts). The choice is made when the library loads, so the fix is to set
 * OPENBLAS_CORETYPE and start the program again. */
const char *bb_cpu_blas_core(void)
{
    const char *core = openblas_get_corename();
    return core ? core : "unknown";
}

void bb_cpu_fix_blas_core(char **argv)
{
    const char *core = openblas_get_corename();
    if (getenv("OPENBLAS_CORETYPE") || !core) return;
    static const char *const generic[] = {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom", "Katmai",
                                          "Coppermine", "Northwood", "Banias", "Unknown"};
    bool is_generic = false;
    for (size_t i = 0; i < sizeof generic / sizeof *generic; i++) is_generic |= strcasecmp(core, generic[i]) == 0;
    if (!is_generic) return;
    __builtin_cpu_init();
    const char *better = __builtin_cpu_supports("avx512f") ? "SkylakeX" : __builtin_cpu_supports("avx2") ? "Haswell"
                                                                                                        : NULL;
    if (!better) return;
    BB_INFO("OpenBLAS chose the %s kernels on this %s-capable CPU; restarting with OPENBLAS_CORETYPE=%s", core,
            strcmp(better, "SkylakeX") ? "AVX2" : "AVX-512", better);
    setenv("OPENBLAS_CORETYPE", better, 1);
    execv("/proc/self/exe", argv);
    BB_WARN("could not restart with OPENBLAS_CORETYPE=%s; matrix products will be slow", better);
}
