/* bench_copy.c — `bigbatch bench copy`: host-to-device copy bandwidth from
 * pinned and from pageable host memory, through the backend's copy. */
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "model_flags.h"
#include "bigbatch/backend.h"

static const char usage[] = "bigbatch bench copy [--devices cuda:N] [--mib M] [--runs R] [--json]";
static const char summary[] =
    "Copies M MiB to the device R times from pinned host memory (the loader's slots on\n"
    "GPUs) and R times from ordinary (pageable) memory, and prints the median GB/s of\n"
    "each. Needs a GPU; perf/gpu_check.sh runs it.";

static bb_status time_copies(bb_backend_t *be, void *dst, const void *src, size_t bytes, int runs, double *gbps)
{
    double *t = malloc((size_t)runs * sizeof *t);
    if (!t) return bb_fail(BB_ERR_NOMEM, "out of memory");
    bb_status rc = bb_backend_copy(be, dst, src, bytes, BB_COPY_H2D); /* warm-up */
    for (int i = 0; rc == BB_OK && i < runs; i++) {
        uint64_t t0 = bb_clock_ns();
        rc = bb_backend_copy(be, dst, src, bytes, BB_COPY_H2D); /* returns when the data is there */
        t[i] = (double)(bb_clock_ns() - t0) / 1e9;
        if (rc == BB_OK && bb_cli_interrupted) rc = bb_fail(BB_ERR_INTERRUPTED, "interrupted");
    }
    if (rc == BB_OK) *gbps = (double)bytes / bb_bench_median(t, runs) / 1e9;
    free(t);
    return rc;
}

int bb_bench_copy(int argc, char **argv)
{
    const char *device = "cuda:0";
    int64_t mib = 256, runs = 7;
    bool json = false;
    const bb_opt opts[] = {
        {"--devices", BB_OPT_STRING, &device, "DEV", "cuda:N (as train's --devices, one GPU)"},
        {"--device", BB_OPT_STRING, &device, "DEV", "the same as --devices"},
        {"--mib", BB_OPT_INT, &mib, "M", "MiB per copy", .min = 1, .max = 1 << 16},
        {"--runs", BB_OPT_INT, &runs, "R", "timed copies of each kind", .min = 1, .max = 1000},
        {"--json", BB_OPT_FLAG, &json, NULL, "print one JSON object"},
        {0}};
    bb_backend_t *be = NULL;
    void *dst = NULL, *pinned = NULL, *pageable = NULL;
    double pinned_gbps = 0, pageable_gbps = 0;
    size_t bytes = (size_t)mib << 20;
    bb_status rc = bb_cli_parse("bench copy", opts, argc, argv, NULL);
    bb_device_kind kind = BB_DEVICE_CPU;
    bb_backend_options bo = {0};
    if (rc == BB_OK) rc = device_flag_parse_one(device, &kind, &bo.device);
    if (rc == BB_OK && kind != BB_DEVICE_CUDA) rc = bb_fail(BB_ERR_ARG, "--devices %s: bench copy measures copies to a GPU (cuda:N)", device);
    if (rc == BB_OK) rc = bb_backend_create_cuda(&bo, &be);
    if (rc == BB_OK) rc = bb_backend_alloc(be, bytes, "copy target", &dst);
    if (rc == BB_OK) rc = bb_backend_host_alloc(be, bytes, &pinned);
    if (rc == BB_OK && !(pageable = malloc(bytes))) rc = bb_fail(BB_ERR_NOMEM, "out of memory");
    if (rc == BB_OK) {
        memset(pinned, 1, bytes); /* touched: no page faults inside the timing */
        memset(pageable, 1, bytes);
        rc = time_copies(be, dst, pinned, bytes, (int)runs, &pinned_gbps);
    }
    if (rc == BB_OK) rc = time_copies(be, dst, pageable, bytes, (int)runs, &pageable_gbps);
    if (rc == BB_OK && json) {
        json_t *j = json_pack("{s:s, s:I, s:o, s:o}", "device", device, "mib", (json_int_t)mib, "pinned_gb_per_s",
                              bb_json_fixed(pinned_gbps, 2), "pageable_gb_per_s", bb_json_fixed(pageable_gbps, 2));
        rc = bb_json_write_line(stdout, j);
        json_decref(j);
    } else if (rc == BB_OK)
        printf("%s, %lld MiB host to device: pinned %.2f GB/s, pageable %.2f GB/s (%.2fx)\n", device, (long long)mib,
               pinned_gbps, pageable_gbps, pinned_gbps / pageable_gbps);
    free(pageable);
    if (be) bb_backend_host_free(be, pinned, bytes);
    bb_backend_destroy(be);
    int code = bb_cli_report(rc, usage, summary, opts);
    bb_cli_free(opts, NULL);
    return code;
}
