/* cuda_sizes.c — what the CUDA backend holds besides its counted
 * allocations, in plain C so that every build (and the planner's counting
 * backend) can count it; cuda_backend.cu reports its real sizes through
 * the same vtable entry and warns when they exceed these. */
#include "backend/backend_impl.h"

/* kernels/cuda_kernels.h's BBK_COLUMN_CHUNKS (cuda_backend.cu checks). */
enum { COLUMN_CHUNKS = 256, PARTIAL_BYTES = 2 * 1024 * 8 };

uint64_t bb_cuda_workspace_bytes(size_t rows, size_t width)
{
    uint64_t R = rows, W = width;
    return 8 * R                       /* per-row loss (doubles) */
           + 2 * COLUMN_CHUNKS * 4 * W /* column-sum partials */
           + 6 * (4 * R + 255) + 256   /* the embedding backward's sort: its index arrays, 256-aligned */
           + 16 * R + (2u << 20) + 255 /* and CUB's temporary storage, bounded: its radix sort's double
                                          buffers (8 bytes a row), histograms and look-back (under 2 MiB
                                          at a million rows); the emulated CUB takes 12 bytes a row */
           + PARTIAL_BYTES             /* reduction partials and ranges' sums */
           + ((uint64_t)32 << 20);     /* cuBLAS's workspace, which cuBLASLt shares (one stream) */
}

uint64_t bb_cuda_attention_bytes(int B, int T, int NH, int KVH, int HS)
{
    uint64_t n = (uint64_t)B * T * NH * HS, nqkv = (uint64_t)B * T * (NH + 2 * KVH) * HS;
    uint64_t t64 = ((uint64_t)T + 63) / 64 * 64;
    return 4 * (nqkv + n)                      /* bf16 copies of qkv, out, dout and dqkv */
           + 2 * (uint64_t)B * NH * t64 * t64 /* the deterministic backward's dP: bf16, T² a head */
           + 4 * n + ((uint64_t)16 << 20);    /* dQ's fp32 accumulator, and the rest, bounded */
}
