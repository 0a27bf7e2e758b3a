/* bench_model.c — `bigbatch bench model`: forward + backward + AdamW
 * throughput of one model on the CPU backend. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "bigbatch/model.h"
#include "bigbatch/plan.h"
#include "bigbatch/roofline.h"
#include "model_flags.h"

static const char usage[] =
    "bigbatch bench model [--model gpt|llama|mlp] [--layers L --heads H --d-model D --seq-len T --vocab V]\n"
    "                     [--hidden 1024,1024 --inputs 784 --classes 10] [--micro-batch B]\n"
    "                     [--checkpoint none|blocks|every:K] [--loss-chunk TOKENS] [--devices cpu|cuda:N]\n"
    "                     [--precision fp32|bf16] [--attention auto|cudnn|kernels] [--threads N] [--steps S]\n"
    "                     [--roofline a100|h100|h200] [--json]";
static const char summary[] =
    "Times S training steps (forward, loss, backward, AdamW on every parameter) of a\n"
    "model on random data after 2 warm-up steps, on the CPU backend with N\n"
    "threads or on a GPU, and prints the median step time, tokens/s (gpt) or\n"
    "samples/s (mlp), the activation memory, the allocator's peak, and the loss of\n"
    "the first step (a fresh gpt's is about ln V) and of the last. --json adds the\n"
    "planner's prediction of the peak, the host's waits for the device a step, and\n"
    "with BB_PROFILE_OPS=1 in the environment each op's calls, ms and GFLOP a step.\n"
    "perf/model_bench.sh (CPU) and perf/gpu_check.sh (GPU) run it beside PyTorch.\n"
    "\n"
    "--roofline GPU runs nothing: it counts the step's work per op (FLOPs, and the\n"
    "bytes each op must read and write at the model's dtypes) on the planner's\n"
    "counting backend and weighs it against the GPU's published peaks (dense\n"
    "bf16 or fp32 FLOP/s, memory bandwidth): products at 70% of peak, the other\n"
    "ops at 80% of bandwidth. It prints per op the calls, GFLOP, GB and predicted\n"
    "ms of one step (micro-step and AdamW), the micro-step's non-product traffic,\n"
    "and the predicted tokens/s and MFU (llm.c's 6N + 6LCT FLOPs per token): a\n"
    "design's ceiling, since a backend's extra passes and gaps are not counted.\n"
    "perf/roofline_llmc.py sets it beside the same account of llm.c's step.";

/* The bench's flags. */
typedef struct bench_flags {
    const char *kind, *checkpoint, *device, *roofline;
    bb_model_flags shape; /* --layers, --heads, --d-model, the llama's */
    int seq_len, vocab, micro_batch, threads, inputs, classes, steps, loss_chunk;
    bb_str_list hidden;
    bool json, micro_given, loss_chunk_given, vocab_given;
    bb_backend_options bo; /* precision, attention; threads and device from the flags */
} bench_flags;

/* A model on its backend, the synthetic batch it trains on, AdamW's state. */
typedef struct bench_run {
    bb_model_config c;
    bb_device_kind device;
    bb_backend_t *be;
    bb_model_t *m;
    size_t params, targets;
    float *mom, *var;
} bench_run;

/* What the timed steps measured. */
typedef struct bench_figures {
    double median, first_loss, last_loss; /* the first loss: the fresh model's (ln V for a gpt) */
    uint64_t waits;
    bb_op_time ops[64];
    int n_ops;
} bench_figures;

/* The model the flags describe (no data here: the flags give what the
 * data would). */
static bb_status bench_config(bench_flags *f, bench_run *r)
{
    bb_model_flags shape = f->shape;
    shape.hidden = (const char *const *)f->hidden.items, shape.hidden_count = f->hidden.count;
    BB_TRY(bb_model_config_from_flags(f->kind, &shape, &r->c));
    if (!f->vocab_given && bb_model_outputs(&r->c)) f->vocab = bb_model_outputs(&r->c); /* a preset's */
    /* what a dataset would say: token records of T+1 tokens, or images of `inputs` pixels */
    bool gpt = bb_model_targets_are_tokens(&r->c);
    bb_record_format data = gpt ? token_records(f->seq_len, (uint32_t)f->vocab)
                                : (bb_record_format){.kind = BB_RECORD_IMAGE_U8, .rank = 1,
                                                     .shape = {(uint32_t)f->inputs},
                                                     .record_size = (uint32_t)f->inputs + 1,
                                                     .classes_or_vocab = (uint32_t)f->classes};
    BB_TRY(bb_model_config_from_data(&r->c, &data, "the flags"));
    if (!f->micro_given && !gpt) f->micro_batch = 256;
    BB_TRY(bb_model_parse_recompute(f->checkpoint, &r->c));
    model_flags chunk = {.loss_chunk = f->loss_chunk, .loss_chunk_given = f->loss_chunk_given};
    BB_TRY(loss_chunk_flag(&chunk, &r->c));
    r->c.precision = f->bo.precision;
    return BB_OK;
}

/* That model on its backend, with a synthetic batch set and AdamW's state. */
static bb_status bench_setup(bench_flags *f, bench_run *r)
{
    BB_TRY(bench_config(f, r));
    bool gpt = bb_model_targets_are_tokens(&r->c);
    f->bo.threads = f->threads;
    BB_TRY(device_flag_parse_one(f->device, &r->device, &f->bo.device));
    BB_TRY(bb_backend_create(r->device, &f->bo, &r->be));
    BB_TRY(bb_model_create(r->be, &r->c, f->micro_batch, &r->m));
    BB_TRY(bb_model_init(r->m, 1));
    r->params = bb_model_param_count(r->m);
    r->targets = gpt ? (size_t)f->micro_batch * f->seq_len : (size_t)f->micro_batch;
    bb_status rc = bb_model_set_synthetic_batch(r->m);
    size_t bytes = r->params * sizeof(float);
    if (rc == BB_OK) rc = bb_backend_alloc(r->be, bytes, "optimizer state", (void **)&r->mom);
    if (rc == BB_OK) rc = bb_backend_alloc(r->be, bytes, "optimizer state", (void **)&r->var);
    if (rc == BB_OK) rc = bb_backend_memset(r->be, r->mom, 0, bytes);
    if (rc == BB_OK) rc = bb_backend_memset(r->be, r->var, 0, bytes);
    return rc;
}

static void bench_teardown(bench_run *r)
{
    if (r->be) bb_backend_free(r->be, r->mom), bb_backend_free(r->be, r->var);
    bb_model_destroy(r->m);
    bb_backend_destroy(r->be);
}

/* Two warm-up steps, then `steps` timed ones: forward, backward, AdamW. */
static bb_status bench_steps(const bench_run *r, int steps, bench_figures *out)
{
    double *times = malloc((size_t)steps * sizeof *times);
    if (!times) return bb_fail(BB_ERR_NOMEM, "out of memory");
    bb_status rc = BB_OK;
    bb_backend_t *be = r->be;
    bb_model_t *m = r->m;
    for (int s = -2; rc == BB_OK && s < steps; s++) {
        if (s == 0) out->waits = bb_backend_host_waits(be), bb_backend_op_profile_reset(be); /* the timed steps' */
        uint64_t t0 = bb_clock_ns();
        double loss;
        rc = bb_model_forward(m, (float)r->targets, &loss, NULL);
        if (s == -2) out->first_loss = loss;
        out->last_loss = loss;
        if (rc == BB_OK) rc = bb_model_backward(m, false);
        for (int t = 0; rc == BB_OK && t < bb_model_tensor_count(m); t++) {
            const bb_tensor_info *ti = bb_model_tensor(m, t);
            bb_op_adamw(be, bb_model_params(m) + ti->offset, bb_model_grads(m) + ti->offset, r->mom + ti->offset,
                        r->var + ti->offset, ti->count, 1e-4f, 0.9f, 0.95f, 1e-8f, ti->decay ? 0.1f : 0.0f, s + 3,
                        1.0f);
        }
        if (rc == BB_OK) rc = bb_backend_synchronize(be); /* a GPU step ends when its work does */
        if (rc == BB_OK && s >= 0) times[s] = (bb_clock_ns() - t0) / 1e9;
        if (bb_cli_interrupted) rc = bb_fail(BB_ERR_INTERRUPTED, "interrupted");
    }
    if (rc == BB_OK) {
        out->median = bb_bench_median(times, steps);
        out->waits = bb_backend_host_waits(be) - out->waits;
        out->n_ops = bb_backend_op_profile(be, out->ops, 64);
    }
    free(times);
    return rc;
}

/* One line, or one JSON object with the planner's prediction beside. */
static bb_status bench_print(const bench_flags *f, const bench_run *r, const bench_figures *g)
{
    /* the planner's prediction for the same model (its optimizer state is AdamW's, as here) */
    bb_memory_breakdown plan = {0};
    BB_TRY(bb_plan_memory(&r->c, f->micro_batch, BB_OPTIMIZER_ADAMW, r->device, &plan));
    bool gpt = bb_model_targets_are_tokens(&r->c);
    double rate = r->targets / g->median, steps = f->steps;
    uint64_t act = bb_model_activation_bytes(r->m);
    if (!f->json) {
        printf("%s, %zu parameters, micro-batch %d, checkpoint %s, %d threads: %.2f ms per step, %.0f %s/s, "
               "activations %.1f MiB, loss %.4f -> %.4f\n", f->kind, r->params, f->micro_batch, f->checkpoint,
               f->threads, g->median * 1e3, rate, gpt ? "tokens" : "samples", act / 1048576.0, g->first_loss,
               g->last_loss);
        if (f->bo.precision == BB_PRECISION_BF16) printf("products: %s\n", bb_backend_bf16_products(r->be));
        if (!bb_backend_host_is_device(r->be)) printf("attention: %s\n", bb_backend_attention_engine(r->be));
        return BB_OK;
    }
    json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:s, s:i, s:i, s:I, s:o, s:o, s:I, s:I, s:I, s:I, s:o, s:o, s:o}",
                          "model", f->kind, "device", f->device, "precision", bb_precision_name(f->bo.precision),
                          "attention", bb_attention_name(f->bo.attention), "checkpoint", f->checkpoint, "micro_batch",
                          f->micro_batch, "threads", f->threads, "params", (json_int_t)r->params, "step_ms",
                          bb_json_fixed(g->median * 1e3, 3), gpt ? "tokens_per_s" : "samples_per_s",
                          bb_json_fixed(rate, 1), "activation_bytes", (json_int_t)act, "peak_bytes",
                          (json_int_t)bb_backend_peak_bytes(r->be), "workspace_bytes",
                          (json_int_t)bb_backend_workspace_bytes(r->be), "planned_bytes", (json_int_t)plan.total,
                          "host_waits_per_step", bb_json_fixed((double)g->waits / steps, 2), "first_loss",
                          bb_json_real(g->first_loss, 9), "last_loss", bb_json_real(g->last_loss, 9));
    json_t *list = g->n_ops ? json_array() : NULL; /* BB_PROFILE_OPS=1: per step */
    for (int i = 0; i < g->n_ops; i++)
        json_array_append_new(list, json_pack("{s:s, s:o, s:o, s:o}", "op", g->ops[i].op, "calls",
                                              bb_json_fixed((double)g->ops[i].calls / steps, 2), "ms",
                                              bb_json_fixed(g->ops[i].ms / steps, 4), "gflop",
                                              bb_json_fixed(g->ops[i].flops / steps / 1e9, 4)));
    if (o && list) json_object_set_new(o, "ops", list);
    if (o && f->bo.precision == BB_PRECISION_BF16)
        json_object_set_new(o, "products", json_string(bb_backend_bf16_products(r->be)));
    if (o) json_object_set_new(o, "attention_engine", json_string(bb_backend_attention_engine(r->be)));
    bb_status rc = bb_json_write_line(stdout, o);
    json_decref(o);
    return rc;
}

/* --roofline: the account of the step on the GPU named, as a table or one JSON object. */
static bb_status bench_roofline(bench_flags *f, bench_run *r)
{
    const bb_gpu_peaks *g = bb_gpu_peaks_find(f->roofline);
    if (!g) return bb_fail(BB_ERR_ARG, "--roofline %s: not a GPU this account knows (%s)", f->roofline,
                           bb_gpu_peaks_names());
    BB_TRY(bench_config(f, r));
    bb_roofline *a = malloc(sizeof *a);
    if (!a) return bb_fail(BB_ERR_NOMEM, "out of memory");
    bb_status rc = bb_roofline_account(&r->c, f->micro_batch, g, a);
    bool bf16 = r->c.precision == BB_PRECISION_BF16;
    if (rc == BB_OK && !f->json) {
        char model[160];
        bb_model_describe(&r->c, model, sizeof model);
        printf("roofline of %s, %.0f parameters, micro-batch %d (%.0f targets), %s, checkpoint %s, on %s (%s: "
               "%.0f TFLOP/s %s dense, %.2f TB/s): products at %.0f%% of peak, other ops at %.0f%% of bandwidth\n",
               model, a->params, f->micro_batch, a->tokens, bb_precision_name(r->c.precision), f->checkpoint, g->name,
               g->part, (bf16 ? g->bf16_flops : g->fp32_flops) / 1e12, bf16 ? "bf16" : "fp32",
               g->memory_bytes_per_s / 1e12, 100 * BB_ROOFLINE_PRODUCT_EFFICIENCY,
               100 * BB_ROOFLINE_MEMORY_EFFICIENCY);
        printf("%-26s %-10s %8s %10s %9s %9s\n", "op", "stage", "calls", "GFLOP", "GB", "ms");
        for (int i = 0; i < a->count; i++) {
            const bb_roofline_row *w = &a->rows[i];
            printf("%-26s %-10s %8.0f %10.1f %9.3f %9.3f%s\n", w->op, w->optimizer ? "optimizer" : "micro-step",
                   w->calls, w->gflop, w->gb, w->ms, w->product ? "  product" : "");
        }
        printf("micro-step: products %.2f ms (%.0f GFLOP), other ops %.2f ms (%.2f GB); optimizer %.2f ms (%.2f GB)\n",
               a->product_ms, a->product_gflop, a->other_ms, a->other_gb, a->optimizer_ms, a->optimizer_gb);
        printf("predicted: %.2f ms a step, %.0f %s/s, MFU %.1f%%\n", a->step_ms, a->tokens_per_s,
               bb_model_targets_are_tokens(&r->c) ? "tokens" : "samples", 100 * a->mfu);
    } else if (rc == BB_OK) {
        json_t *ops = json_array();
        for (int i = 0; ops && i < a->count; i++) {
            const bb_roofline_row *w = &a->rows[i];
            json_array_append_new(ops, json_pack("{s:s, s:s, s:I, s:o, s:o, s:o, s:b}", "name", w->op, "stage",
                                                 w->optimizer ? "optimizer" : "micro-step", "calls",
                                                 (json_int_t)w->calls, "gflop", bb_json_real(w->gflop, 9), "gb",
                                                 bb_json_real(w->gb, 9), "ms", bb_json_real(w->ms, 9), "product",
                                                 w->product));
        }
        json_t *o = json_pack(
            "{s:s, s:s, s:s, s:s, s:i, s:I, s:o, s:{s:s, s:o, s:o, s:o}, s:{s:o, s:o}, s:o, s:o, s:o, s:o, s:o, s:o,"
            " s:o, s:o, s:o, s:o}",
            "model", f->kind, "roofline", g->name, "precision", bb_precision_name(r->c.precision), "checkpoint",
            f->checkpoint, "micro_batch", f->micro_batch, "params", (json_int_t)a->params, "tokens",
            bb_json_real(a->tokens, 9), "gpu", "part", g->part, "bf16_flops", bb_json_real(g->bf16_flops, 6),
            "fp32_flops", bb_json_real(g->fp32_flops, 6), "memory_bytes_per_s", bb_json_real(g->memory_bytes_per_s, 6),
            "efficiency", "products", bb_json_real(BB_ROOFLINE_PRODUCT_EFFICIENCY, 6), "memory",
            bb_json_real(BB_ROOFLINE_MEMORY_EFFICIENCY, 6), "product_ms", bb_json_real(a->product_ms, 9),
            "product_gflop", bb_json_real(a->product_gflop, 9), "non_product_ms", bb_json_real(a->other_ms, 9),
            "non_product_gb", bb_json_real(a->other_gb, 9), "optimizer_ms", bb_json_real(a->optimizer_ms, 9),
            "optimizer_gb", bb_json_real(a->optimizer_gb, 9), "step_ms", bb_json_real(a->step_ms, 9),
            "predicted_tokens_per_s", bb_json_real(a->tokens_per_s, 9), "mfu", bb_json_real(a->mfu, 9), "ops",
            ops ? ops : json_null());
        rc = o ? bb_json_write_line(stdout, o) : bb_fail(BB_ERR_NOMEM, "out of memory");
        json_decref(o);
    }
    free(a);
    return rc;
}

int bb_bench_model(int argc, char **argv)
{
    bench_flags f = {.kind = "gpt", .checkpoint = "none", .device = "cpu", .shape = MODEL_SHAPE_DEFAULT,
                     .seq_len = 256, .vocab = 256,
                     .micro_batch = 8, .threads = 2, .inputs = 784, .classes = 10, .steps = 10}; /* train's */
    const bb_opt opts[] = {
        {"--model", BB_OPT_CHOICE, &f.kind, "KIND", bb_model_kind_help(), .choices = bb_model_kind_choices()},
        MODEL_SHAPE_OPTS(f.shape),
        {"--seq-len", BB_OPT_I32, &f.seq_len, "T", "gpt, llama: tokens per sequence", .min = 1, .max = 1 << 16},
        {"--vocab", BB_OPT_I32, &f.vocab, "V", "gpt, llama: vocabulary (default 256; a preset's own)", .min = 2,
         .max = 1 << 24, .given = &f.vocab_given},
        {"--hidden", BB_OPT_LIST, &f.hidden, "N,N...", "mlp: hidden sizes (default 1024,1024)"},
        {"--inputs", BB_OPT_I32, &f.inputs, "N", "mlp: inputs", .min = 1, .max = 1 << 24},
        {"--classes", BB_OPT_I32, &f.classes, "N", "mlp: classes", .min = 2, .max = 1 << 24},
        {"--micro-batch", BB_OPT_I32, &f.micro_batch, "B", "examples per step (gpt default 8, mlp 256)", .min = 1,
         .max = 1 << 20, .given = &f.micro_given},
        {"--checkpoint", BB_OPT_STRING, &f.checkpoint, "POLICY", "none, selective, offload, blocks, every:K or plan:P (as train's)"},
        {"--loss-chunk", BB_OPT_I32, &f.loss_chunk, "TOKENS", LOSS_CHUNK_HELP, .min = 0, .max = 1 << 30,
         .given = &f.loss_chunk_given},
        {"--threads", BB_OPT_I32, &f.threads, "N", "CPU threads (matrix products, attention, loss)", .min = 1,
         .max = 1024},
        {"--devices", BB_OPT_STRING, &f.device, "DEV", "cpu or cuda:N (as train's --devices, one device)"},
        {"--device", BB_OPT_STRING, &f.device, "DEV", "the same as --devices"},
        PRECISION_FLAG_OPT(f.bo.precision, NULL),
        ATTENTION_FLAG_OPT(f.bo.attention),
        {"--steps", BB_OPT_I32, &f.steps, "S", "timed steps", .min = 1, .max = 100000},
        {"--roofline", BB_OPT_STRING, &f.roofline, "GPU",
         "run nothing: the step's roofline account on a100, h100 or h200 (see above)"},
        {"--json", BB_OPT_FLAG, &f.json, NULL, "print one JSON object"},
        {0}};
    bench_run r = {0};
    bench_figures g = {.first_loss = NAN, .last_loss = NAN};
    bb_status rc = bb_cli_parse("bench model", opts, argc, argv, NULL);
    if (rc == BB_OK && f.roofline) {
        rc = bench_roofline(&f, &r);
    } else {
        if (rc == BB_OK) rc = bench_setup(&f, &r);
        if (rc == BB_OK) rc = bench_steps(&r, f.steps, &g);
        if (rc == BB_OK) rc = bench_print(&f, &r, &g);
    }
    bench_teardown(&r);
    int code = rc == BB_OK ? BB_EXIT_OK : bb_cli_report(rc, usage, summary, opts);
    bb_cli_free(opts, NULL);
    return code;
}
