/* gpu_fixture.h — what the GPU training suites share (test_cuda_train.c,
 * test_cuda_costs.c): the trainer's fixture, and skipping a test, with
 * the reason, without the GPUs it needs or outside the emulator. */
#ifndef BIGBATCH_GPU_FIXTURE_H
#define BIGBATCH_GPU_FIXTURE_H

#include "train_fixture.h"
#ifdef BB_CUDA_EMU
#include <cuda_emu.h>
#endif

static inline void need_gpus(int n)
{
    bb_cuda_info info;
    bb_cuda_probe(&info);
    if (info.device_count < n)
        fixture_skip("skipped: needs %d GPU%s, this machine has %d%s%s", n, n > 1 ? "s" : "", info.device_count,
                     info.device_count ? "" : ": ", info.device_count ? "" : info.reason);
}

/* What only the emulator can do (inject a fault, count the host's waits). */
static inline void need_emulator(const char *what)
{
#ifndef BB_CUDA_EMU
    fixture_skip("skipped: %s is the emulator's (make cuda-emu)", what);
#else
    (void)what;
#endif
}

static inline void on_gpus(bb_train_options *o, int n)
{
    o->device = BB_DEVICE_CUDA;
    o->devices = n;
    for (int i = 0; i < n; i++) o->device_ids[i] = i;
}

#endif
