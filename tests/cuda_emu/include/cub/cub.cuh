// cub/cub.cuh — the CUDA emulator's stand-in for the CUB algorithms the
// kernels use: DeviceRadixSort::SortPairs, DeviceRunLengthEncode::Encode,
// DeviceScan::ExclusiveSum, with CUB's signatures and its two-phase use.
//
//   size_t bytes = 0;
//   cub::DeviceScan::ExclusiveSum(NULL, bytes, in, out, n);        // the temporary storage it needs
//   cub::DeviceScan::ExclusiveSum(temp, bytes, in, out, n, stream); // queued on the stream
//
// Each runs on the stream's thread in stream order, on host code with
// CUB's results: the sort is stable over bits [begin_bit, end_bit) of the
// keys (signed keys ordered as CUB orders them). As CUB, it fails with
// cudaErrorInvalidValue when the temporary storage is smaller than it
// asked for, and it really uses that storage (so that a buffer that
// overlaps it shows). Inputs and outputs must be device memory of the
// stream's device: otherwise the operation faults (a sticky
// cudaErrorIllegalAddress), as CUB's kernels would.
#ifndef BBEMU_CUB_CUH
#define BBEMU_CUB_CUH

#include <string.h>

#include <algorithm>
#include <type_traits>

#include "../cuda_emu.h"
#include "../cuda_runtime.h"

namespace cub {
namespace emu {

// Checks that [p, p + bytes) is device memory of the running stream's device.
inline bool device_ok(const char *algo, const char *which, const void *p, size_t bytes, int device)
{
    const char *why = "";
    if (!bytes || bbemu_device_range(p, bytes, device, &why)) return true;
    bbemu_fail_operation(cudaErrorIllegalAddress, "cub::%s: %s (%p, %zu bytes) is not memory of cuda:%d: %s", algo,
                         which, p, bytes, device, why);
    return false;
}

// Queues f (a copyable callable) on stream: it runs with the stream's device.
template <class F> cudaError_t enqueue(cudaStream_t stream, const char *what, F f)
{
    int device = bbemu_stream_device(stream);
    if (device < 0) return cudaErrorInvalidResourceHandle;
    struct job {
        F f;
        int device;
    };
    bbemu_count("cub_calls", 1);
    return bbemu_enqueue_host(
        stream, what, [](void *ctx) { static_cast<job *>(ctx)->f(static_cast<job *>(ctx)->device); },
        [](void *ctx) { delete static_cast<job *>(ctx); }, new job{f, device}, 1);
}

// The first phase (temp NULL: the bytes needed), or the check of the second.
inline bool sized(void *temp, size_t &temp_bytes, size_t need, cudaError_t *e)
{
    if (!temp) {
        temp_bytes = need;
        *e = cudaSuccess;
        return false;
    }
    *e = temp_bytes < need ? cudaErrorInvalidValue : cudaSuccess;
    return *e == cudaSuccess;
}

template <class K> uint64_t radix_of(K k)
{
    using U = std::make_unsigned_t<K>;
    U u = (U)k;
    if (std::is_signed<K>::value) u ^= (U)((U)1 << (sizeof(K) * 8 - 1)); // negatives before positives, as CUB
    return (uint64_t)u;
}

} // namespace emu

struct DeviceRadixSort {
    // Stable sort of (key, value) pairs by bits [begin_bit, end_bit) of the keys.
    template <class K, class V, class N>
    static cudaError_t SortPairs(void *temp, size_t &temp_bytes, const K *keys_in, K *keys_out, const V *values_in,
                                 V *values_out, N num_items, int begin_bit = 0, int end_bit = sizeof(K) * 8,
                                 cudaStream_t stream = 0)
    {
        size_t n = (size_t)num_items, need = n * (sizeof(uint32_t) + sizeof(K) + sizeof(V)) + 256;
        cudaError_t e;
        if (!emu::sized(temp, temp_bytes, need, &e)) return e;
        if (begin_bit < 0 || end_bit > (int)sizeof(K) * 8 || begin_bit >= end_bit) return cudaErrorInvalidValue;
        return emu::enqueue(stream, "cub::DeviceRadixSort::SortPairs", [=](int device) {
            const char *a = "DeviceRadixSort::SortPairs";
            if (!emu::device_ok(a, "d_temp_storage", temp, need, device) ||
                !emu::device_ok(a, "d_keys_in", keys_in, n * sizeof(K), device) ||
                !emu::device_ok(a, "d_keys_out", keys_out, n * sizeof(K), device) ||
                !emu::device_ok(a, "d_values_in", values_in, n * sizeof(V), device) ||
                !emu::device_ok(a, "d_values_out", values_out, n * sizeof(V), device))
                return;
            // The order and a copy of the pairs live in the temporary storage, as CUB's double buffers do.
            uint32_t *order = static_cast<uint32_t *>(temp);
            K *keys = reinterpret_cast<K *>(order + n);
            V *values = reinterpret_cast<V *>(keys + n);
            memcpy(keys, keys_in, n * sizeof(K));
            memcpy(values, values_in, n * sizeof(V));
            uint64_t mask = (end_bit - begin_bit >= 64 ? ~0ull : ((1ull << (end_bit - begin_bit)) - 1)) << begin_bit;
            for (size_t i = 0; i < n; i++) order[i] = (uint32_t)i;
            std::stable_sort(order, order + n, [&](uint32_t x, uint32_t y) {
                return (emu::radix_of(keys[x]) & mask) < (emu::radix_of(keys[y]) & mask);
            });
            for (size_t i = 0; i < n; i++) keys_out[i] = keys[order[i]], values_out[i] = values[order[i]];
        });
    }
};

struct DeviceRunLengthEncode {
    // The runs of equal items: each run's item, its length, and the run count.
    template <class In, class Unique, class Lengths, class Runs, class N>
    static cudaError_t Encode(void *temp, size_t &temp_bytes, In in, Unique unique_out, Lengths lengths_out,
                              Runs runs_out, N num_items, cudaStream_t stream = 0)
    {
        size_t n = (size_t)num_items, need = 256;
        cudaError_t e;
        if (!emu::sized(temp, temp_bytes, need, &e)) return e;
        return emu::enqueue(stream, "cub::DeviceRunLengthEncode::Encode", [=](int device) {
            const char *a = "DeviceRunLengthEncode::Encode";
            if (!emu::device_ok(a, "d_temp_storage", temp, need, device) ||
                !emu::device_ok(a, "d_in", in, n * sizeof(*in), device) ||
                !emu::device_ok(a, "d_unique_out", unique_out, n * sizeof(*unique_out), device) ||
                !emu::device_ok(a, "d_counts_out", lengths_out, n * sizeof(*lengths_out), device) ||
                !emu::device_ok(a, "d_num_runs_out", runs_out, sizeof(*runs_out), device))
                return;
            size_t runs = 0;
            for (size_t i = 0; i < n; runs++) {
                size_t j = i + 1;
                while (j < n && in[j] == in[i]) j++;
                unique_out[runs] = in[i];
                lengths_out[runs] = (std::remove_reference_t<decltype(*lengths_out)>)(j - i);
                i = j;
            }
            *runs_out = (std::remove_reference_t<decltype(*runs_out)>)runs;
        });
    }
};

struct DeviceScan {
    // out[i] = in[0] + ... + in[i - 1] (out[0] = 0).
    template <class In, class Out, class N>
    static cudaError_t ExclusiveSum(void *temp, size_t &temp_bytes, In in, Out out, N num_items,
                                    cudaStream_t stream = 0)
    {
        size_t n = (size_t)num_items, need = 256;
        cudaError_t e;
        if (!emu::sized(temp, temp_bytes, need, &e)) return e;
        return emu::enqueue(stream, "cub::DeviceScan::ExclusiveSum", [=](int device) {
            const char *a = "DeviceScan::ExclusiveSum";
            if (!emu::device_ok(a, "d_temp_storage", temp, need, device) ||
                !emu::device_ok(a, "d_in", in, n * sizeof(*in), device) ||
                !emu::device_ok(a, "d_out", out, n * sizeof(*out), device))
                return;
            std::remove_reference_t<decltype(*out)> sum = 0;
            for (size_t i = 0; i < n; i++) {
                auto x = in[i]; // in may alias out
                out[i] = sum;
                sum += x;
            }
        });
    }
};

} // namespace cub

#endif
