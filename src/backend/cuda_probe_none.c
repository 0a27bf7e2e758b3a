/* cuda_probe_none.c — bb_cuda_probe for builds without CUDA (CUDA=0). */
#include <string.h>

#include "bigbatch/backend.h"

void bb_cuda_probe(bb_cuda_info *info)
{
    memset(info, 0, sizeof *info);
    snprintf(info->reason, sizeof info->reason, "built without CUDA (CUDA=0, or no nvcc at build time)");
}
