/* nccl_none.c — the NCCL reducer's entry points in builds without CUDA (CUDA=0). */
#include "reducer.h"

bb_status bb_reducer_load_nccl(int *version)
{
    if (version) *version = 0;
    return bb_fail(BB_ERR_UNSUPPORTED, "the NCCL reducer needs a CUDA build");
}

bb_status bb_reducer_create_nccl(const reducer_args *a, reducer_t **out)
{
    (void)a;
    *out = NULL;
    return bb_fail(BB_ERR_UNSUPPORTED, "the NCCL reducer needs a CUDA build");
}
