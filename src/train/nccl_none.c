/* nccl_none.c — the NCCL reducer's entry points in builds without CUDA (CUDA=0). */
#include "reducer.h"

bb_status bb_reducer_load_nccl(int *version)
{
    if (version) *version = 0;
    return bb_fail(BB_ERR_UNSUPPORTED, "the NCCL reducer needs a CUDA build");
}

bb_status bb_reducer_create_nccl(const bb_model_t *m, bb_backend_t *const *be, float *const *grads, int devices,
                              size_t bucket_bytes, reducer_t **out)
{
    (void)m, (void)be, (void)grads, (void)devices, (void)bucket_bytes;
    *out = NULL;
    return bb_fail(BB_ERR_UNSUPPORTED, "the NCCL reducer needs a CUDA build");
}
