/* backend.h — compute backends. For now: discovering CUDA devices.
 *
 *   bb_cuda_info info;
 *   bb_cuda_probe(&info);
 *   if (info.device_count == 0) printf("no GPU: %s\n", info.reason);
 *
 * A CUDA build links the CUDA runtime statically and no libcuda: it loads and
 * runs on machines without a GPU driver, where the probe reports no device.
 */
#ifndef BIGBATCH_BACKEND_H
#define BIGBATCH_BACKEND_H

#include "bigbatch/core.h"

typedef struct bb_cuda_info {
    bool compiled;          /* this build contains the CUDA backend */
    int runtime_version;    /* e.g. 13000 for CUDA 13.0; 0 when not compiled */
    int driver_version;     /* 0 when no driver is installed */
    int device_count;       /* usable devices; 0 when none */
    char device_name[256];  /* device 0, when there is one */
    size_t device_memory;   /* bytes on device 0 */
    int compute_major, compute_minor;
    char reason[160];       /* why device_count is 0, e.g. "no CUDA driver" */
} bb_cuda_info;

/* Fills `info`; never fails (a missing GPU or driver is reported, not an error). */
void bb_cuda_probe(bb_cuda_info *info);

#endif /* BIGBATCH_BACKEND_H */
