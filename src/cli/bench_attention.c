/* bench_attention.c — `bigbatch bench attention`: the attention op alone,
 * forward and backward, on the CPU or a GPU (cuDNN's or bigbatch's
 * kernels), with its inputs and outputs as files for a peer to compare
 * (perf/torch_attention_bench.py: PyTorch's SDPA on the same numbers). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench.h"
#include "model_flags.h"

static const char usage[] =
    "bigbatch bench attention [--devices cpu|cuda:N] [--batch B] [--seq-len T] [--heads H] [--d-model D]\n"
    "                         [--precision fp32|bf16] [--attention auto|cudnn|kernels] [--steps S]\n"
    "                         [--in DIR] [--out DIR] [--json]";
static const char summary[] =
    "Times the causal attention op (bb_op_attention_forward and _backward) at one\n"
    "shape: the median of S runs of each after 2 warm-ups, the device synchronized\n"
    "around each. Inputs are seeded random numbers in [-1, 1] (rounded to bf16 with\n"
    "--precision bf16), or DIR/qkv.f32 (B,T,3C) and DIR/dout.f32 (B,T,C) with --in;\n"
    "--out writes out.f32, lse.f32 and dqkv.f32 of the last run (raw little-endian\n"
    "float32). Says which engine ran: cuDNN's fused SDPA or bigbatch's kernels.";

/* `name` in dir as n floats. */
static bb_status read_floats(const char *dir, const char *name, float *x, size_t n)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) return bb_fail_errno(BB_ERR_IO, "--in %s: cannot open", path);
    size_t got = fread(x, sizeof *x, n, f);
    int extra = fgetc(f);
    fclose(f);
    if (got != n || extra != EOF)
        return bb_fail(BB_ERR_ARG, "--in %s: %s %zu floats for this shape", path, got != n ? "fewer than" : "more than", n);
    return BB_OK;
}

/* `name` in dir, whole or not at all (a temporary file renamed). */
static bb_status write_floats(const char *dir, const char *name, const float *x, size_t n)
{
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return bb_fail_errno(BB_ERR_IO, "--out %s: cannot create", tmp);
    bool ok = fwrite(x, sizeof *x, n, f) == n;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return bb_fail_errno(BB_ERR_IO, "--out %s: cannot write", path);
    }
    return BB_OK;
}

static void fill(float *x, size_t n, uint64_t seed, bool bf16)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        float v = (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
        x[i] = bf16 ? bb_bf16_to_float(bb_bf16_from_float(v)) : v;
    }
}

int bb_bench_attention(int argc, char **argv)
{
    const char *device = "cpu", *in = NULL, *out = NULL;
    int64_t B = 8, T = 1024, heads = 12, d_model = 768, steps = 10;
    bool json = false;
    bb_backend_options bo = {.threads = bb_cpu_count()};
    const bb_opt opts[] = {
        {"--devices", BB_OPT_STRING, &device, "DEV", "cpu or cuda:N (one device)"},
        {"--batch", BB_OPT_INT, &B, "B", "sequences", .min = 1, .max = 1 << 20},
        {"--seq-len", BB_OPT_INT, &T, "T", "tokens per sequence", .min = 1, .max = 1 << 20},
        {"--heads", BB_OPT_INT, &heads, "H", "attention heads", .min = 1, .max = 1024},
        {"--d-model", BB_OPT_INT, &d_model, "D", "width: H heads of D/H", .min = 1, .max = 1 << 16},
        PRECISION_FLAG_OPT(bo.precision, NULL),
        ATTENTION_FLAG_OPT(bo.attention),
        {"--steps", BB_OPT_INT, &steps, "S", "timed runs of each", .min = 1, .max = 100000},
        {"--in", BB_OPT_STRING, &in, "DIR", "read qkv.f32 and dout.f32 from DIR"},
        {"--out", BB_OPT_STRING, &out, "DIR", "write out.f32, lse.f32 and dqkv.f32 into DIR (created)"},
        {"--json", BB_OPT_FLAG, &json, NULL, "print one JSON object"},
        {0}};
    bb_backend_t *be = NULL;
    float *h_qkv = NULL, *h_dout = NULL, *h_out = NULL;
    float *qkv = NULL, *dout = NULL, *o = NULL, *lse = NULL, *dqkv = NULL;
    double *fwd = NULL, *bwd = NULL;
    bb_status rc = bb_cli_parse("bench attention", opts, argc, argv, NULL);
    if (rc == BB_OK && d_model % heads) rc = bb_fail(BB_ERR_ARG, "--d-model %lld is not a multiple of --heads %lld",
                                                     (long long)d_model, (long long)heads);
    bb_device_kind kind = BB_DEVICE_CPU;
    if (rc == BB_OK) rc = device_flag_parse_one(device, &kind, &bo.device);
    if (rc == BB_OK && out && mkdir(out, 0755) != 0 && errno != EEXIST)
        rc = bb_fail_errno(BB_ERR_IO, "--out %s: cannot create", out);
    if (rc == BB_OK) rc = bb_backend_create(kind, &bo, &be);
    size_t C = (size_t)d_model, rows = (size_t)B * T, n3 = rows * 3 * C, n1 = rows * C, nl = (size_t)B * heads * T;
    bool bf16 = bo.precision == BB_PRECISION_BF16;
    if (rc == BB_OK) {
        h_qkv = malloc(n3 * sizeof *h_qkv), h_dout = malloc(n1 * sizeof *h_dout), h_out = malloc(n3 * sizeof *h_out);
        fwd = malloc((size_t)steps * sizeof *fwd), bwd = malloc((size_t)steps * sizeof *bwd);
        if (!h_qkv || !h_dout || !h_out || !fwd || !bwd) rc = bb_fail(BB_ERR_NOMEM, "out of memory");
    }
    if (rc == BB_OK && in) rc = read_floats(in, "qkv.f32", h_qkv, n3);
    if (rc == BB_OK && in) rc = read_floats(in, "dout.f32", h_dout, n1);
    if (rc == BB_OK && !in) fill(h_qkv, n3, 1, bf16), fill(h_dout, n1, 2, bf16);
    if (rc == BB_OK) rc = bb_backend_alloc(be, n3 * sizeof(float), "qkv", (void **)&qkv);
    if (rc == BB_OK) rc = bb_backend_alloc(be, n1 * sizeof(float), "dout", (void **)&dout);
    if (rc == BB_OK) rc = bb_backend_alloc(be, n1 * sizeof(float), "out", (void **)&o);
    if (rc == BB_OK) rc = bb_backend_alloc(be, nl * sizeof(float), "lse", (void **)&lse);
    if (rc == BB_OK) rc = bb_backend_alloc(be, n3 * sizeof(float), "dqkv", (void **)&dqkv);
    if (rc == BB_OK) rc = bb_backend_copy(be, qkv, h_qkv, n3 * sizeof(float), BB_COPY_H2D);
    if (rc == BB_OK) rc = bb_backend_copy(be, dout, h_dout, n1 * sizeof(float), BB_COPY_H2D);
    for (int64_t s = -2; rc == BB_OK && s < steps; s++) {
        uint64_t t0 = bb_clock_ns();
        bb_op_attention_forward(be, bb_f32(o), lse, bb_f32(qkv), (int)B, (int)T, (int)heads, (int)heads, (int)(C / heads));
        rc = bb_backend_synchronize(be);
        uint64_t t1 = bb_clock_ns();
        if (rc == BB_OK)
            bb_op_attention_backward(be, bb_f32(dqkv), bb_f32(dout), bb_f32(qkv), bb_f32(o), lse, (int)B, (int)T,
                                     (int)heads, (int)heads, (int)(C / heads));
        if (rc == BB_OK) rc = bb_backend_synchronize(be);
        if (s >= 0) fwd[s] = (t1 - t0) / 1e6, bwd[s] = (bb_clock_ns() - t1) / 1e6;
        if (bb_cli_interrupted) rc = bb_fail(BB_ERR_INTERRUPTED, "interrupted");
    }
    if (rc == BB_OK && out) {
        rc = bb_backend_copy(be, h_out, o, n1 * sizeof(float), BB_COPY_D2H);
        if (rc == BB_OK) rc = write_floats(out, "out.f32", h_out, n1);
        if (rc == BB_OK) rc = bb_backend_copy(be, h_out, lse, nl * sizeof(float), BB_COPY_D2H);
        if (rc == BB_OK) rc = write_floats(out, "lse.f32", h_out, nl);
        if (rc == BB_OK) rc = bb_backend_copy(be, h_out, dqkv, n3 * sizeof(float), BB_COPY_D2H);
        if (rc == BB_OK) rc = write_floats(out, "dqkv.f32", h_out, n3);
    }
    if (rc == BB_OK) {
        double f = bb_bench_median(fwd, (int)steps), b = bb_bench_median(bwd, (int)steps);
        const char *engine = bb_backend_attention_engine(be);
        const char *precision = bb_precision_name(bo.precision);
        if (json) {
            json_t *j = json_pack("{s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:o, s:o}", "device", device, "precision",
                                  precision, "attention", bb_attention_name(bo.attention), "engine", engine, "batch",
                                  (json_int_t)B, "seq_len", (json_int_t)T, "heads", (json_int_t)heads, "d_model",
                                  (json_int_t)d_model, "forward_ms", bb_json_fixed(f, 4), "backward_ms",
                                  bb_json_fixed(b, 4));
            rc = bb_json_write_line(stdout, j);
            json_decref(j);
        } else
            printf("attention on %s (%s, %s), B %lld T %lld, %lld heads of %lld: forward %.3f ms, backward %.3f ms\n",
                   device, precision, engine, (long long)B, (long long)T, (long long)heads,
                   (long long)(d_model / heads), f, b);
    }
    if (be) {
        float *all[] = {qkv, dout, o, lse, dqkv};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) bb_backend_free(be, all[i]);
    }
    bb_backend_destroy(be);
    free(h_qkv), free(h_dout), free(h_out), free(fwd), free(bwd);
    int code = rc == BB_OK ? BB_EXIT_OK : bb_cli_report(rc, usage, summary, opts);
    bb_cli_free(opts, NULL);
    return code;
}
