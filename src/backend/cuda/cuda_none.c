/* cuda_none.c — bb_cuda_probe and bb_backend_create_cuda for builds
 * without CUDA (CUDA=0). */
#include <string.h>

#include "bigbatch/backend.h"

void bb_cuda_probe(bb_cuda_info *info)
{
    memset(info, 0, sizeof *info);
    snprintf(info->reason, sizeof info->reason, "built without CUDA (CUDA=0, or no nvcc at build time)");
}

bb_status bb_backend_create_cuda(const bb_backend_options *o, bb_backend_t **out)
{
    (void)o;
    *out = NULL;
    return bb_fail(BB_ERR_UNSUPPORTED, "this bigbatch was built without CUDA (CUDA=0, or no nvcc at build time)");
}
