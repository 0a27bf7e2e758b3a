// cuda_probe.cu — asks the CUDA runtime what this machine has.
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

extern "C" {
#include "bigbatch/backend.h"
}

extern "C" void bb_cuda_probe(bb_cuda_info *info)
{
    memset(info, 0, sizeof *info);
    info->compiled = true;
    cudaRuntimeGetVersion(&info->runtime_version);
    cudaDriverGetVersion(&info->driver_version);
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count <= 0) {
        int rt = info->runtime_version, dv = info->driver_version;
        if (err == cudaErrorInsufficientDriver && dv > 0) // a driver older than the runtime, both named
            snprintf(info->reason, sizeof info->reason,
                     "the NVIDIA driver supports CUDA %d.%d, older than this program's CUDA runtime %d.%d "
                     "(CUDA %d needs a driver of R%s or later; nvidia-smi names the driver)",
                     dv / 1000, dv % 1000 / 10, rt / 1000, rt % 1000 / 10, rt / 1000,
                     rt / 1000 >= 13 ? "580" : rt / 1000 == 12 ? "525" : "its release's");
        else
            snprintf(info->reason, sizeof info->reason, "%s",
                     err == cudaSuccess ? "no CUDA device"
                     : dv == 0          ? "no NVIDIA driver (libcuda) on this machine"
                                        : cudaGetErrorString(err));
        cudaGetLastError(); // reset the last-error state so later calls do not report it
        return;
    }
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
        snprintf(info->reason, sizeof info->reason, "cannot read device 0 properties");
        cudaGetLastError();
        return;
    }
    info->device_count = count;
    snprintf(info->device_name, sizeof info->device_name, "%s", prop.name);
    info->device_memory = prop.totalGlobalMem;
    info->compute_major = prop.major;
    info->compute_minor = prop.minor;
}
