/* bench_model.c — `bigbatch bench model`: forward + backward + AdamW
 * throughput of one model on the CPU backend. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "bigbatch/model.h"
#include "bigbatch/plan.h"
#include "model_flags.h"

static const char usage[] =
    "bigbatch bench model [--model gpt|mlp] [--layers L --heads H --d-model D --seq-len T --vocab V]\n"
    "                     [--hidden 1024,1024 --inputs 784 --classes 10] [--micro-batch B]\n"
    "                     [--checkpoint none|blocks|every:K] [--loss-chunk TOKENS] [--devices cpu|cuda:N]\n"
    "                     [--precision fp32|bf16] [--attention auto|cudnn|kernels] [--threads N] [--steps S]\n"
    "                     [--json]";
static const char summary[] =
    "Times S training steps (forward, loss, backward, AdamW on every parameter) of a\n"
    "model on random data after 2 warm-up steps, on the CPU backend with N\n"
    "threads or on a GPU, and prints the median step time, tokens/s (gpt) or\n"
    "samples/s (mlp), the activation memory, the allocator's peak, and the loss of\n"
    "the first step (a fresh gpt's is about ln V) and of the last. --json adds the\n"
    "planner's prediction of the peak, the host's waits for the device a step, and\n"
    "with BB_PROFILE_OPS=1 in the environment each op's calls, ms and GFLOP a step.\n"
    "perf/model_bench.sh (CPU) and perf/gpu_check.sh (GPU) run it beside PyTorch.";

int bb_bench_model(int argc, char **argv)
{
    const char *kind = "gpt", *checkpoint = "none", *device = "cpu", *precision = "fp32", *attention = "auto";
    int64_t layers = BB_GPT_DEFAULT_LAYERS, heads = BB_GPT_DEFAULT_HEADS, d_model = BB_GPT_DEFAULT_D_MODEL, seq_len = 256, vocab = 256, micro_batch = 8, threads = 2; /* train's */
    int64_t inputs = 784, classes = 10, steps = 10, loss_chunk = 0;
    bb_str_list hidden = {0};
    bool json = false, micro_given = false, loss_chunk_given = false;
    const bb_opt opts[] = {
        {"--model", BB_OPT_CHOICE, &kind, "KIND", bb_model_kind_help(), .choices = bb_model_kind_choices()},
        {"--layers", BB_OPT_INT, &layers, "L", "gpt: transformer blocks", .min = 1, .max = 1024},
        {"--heads", BB_OPT_INT, &heads, "H", "gpt: attention heads", .min = 1, .max = 1024},
        {"--d-model", BB_OPT_INT, &d_model, "D", "gpt: width", .min = 1, .max = 1 << 16},
        {"--seq-len", BB_OPT_INT, &seq_len, "T", "gpt: tokens per sequence", .min = 1, .max = 1 << 16},
        {"--vocab", BB_OPT_INT, &vocab, "V", "gpt: vocabulary", .min = 2, .max = 1 << 24},
        {"--hidden", BB_OPT_LIST, &hidden, "N,N...", "mlp: hidden sizes (default 1024,1024)"},
        {"--inputs", BB_OPT_INT, &inputs, "N", "mlp: inputs", .min = 1, .max = 1 << 24},
        {"--classes", BB_OPT_INT, &classes, "N", "mlp: classes", .min = 2, .max = 1 << 24},
        {"--micro-batch", BB_OPT_INT, &micro_batch, "B", "examples per step (gpt default 8, mlp 256)", .min = 1,
         .max = 1 << 20, .given = &micro_given},
        {"--checkpoint", BB_OPT_STRING, &checkpoint, "POLICY", "none, blocks or every:K"},
        {"--loss-chunk", BB_OPT_INT, &loss_chunk, "TOKENS", LOSS_CHUNK_HELP, .min = 0, .max = 1 << 30,
         .given = &loss_chunk_given},
        {"--threads", BB_OPT_INT, &threads, "N", "CPU threads (matrix products, attention, loss)", .min = 1,
         .max = 1024},
        {"--devices", BB_OPT_STRING, &device, "DEV", "cpu or cuda:N (as train's --devices, one device)"},
        {"--device", BB_OPT_STRING, &device, "DEV", "the same as --devices"},
        {"--precision", BB_OPT_CHOICE, &precision, "P", "fp32, or bf16: gpt activations in bf16, and bf16 "
         "matrix products on GPUs", .choices = "fp32|bf16"},
        {"--attention", BB_OPT_CHOICE, &attention, "WHO", "GPUs, bf16: auto (cuDNN's fused attention where it "
         "loads, else bigbatch's kernels after one warning), cudnn (or fail), kernels (bigbatch's always)",
         .choices = "auto|cudnn|kernels"},
        {"--steps", BB_OPT_INT, &steps, "S", "timed steps", .min = 1, .max = 100000},
        {"--json", BB_OPT_FLAG, &json, NULL, "print one JSON object"},
        {0}};
    bb_backend_t *be = NULL;
    bb_model_t *m = NULL;
    double *times = NULL;
    void *batch = NULL;
    int32_t *targets = NULL;
    float *mom = NULL, *var = NULL;
    bb_status rc = bb_cli_parse("bench model", opts, argc, argv, NULL);
    bb_model_config c = {0};
    /* no data here: the flags give what the data would (each kind reads its own) */
    bb_model_flags shape = {.layers = layers, .heads = heads, .d_model = d_model,
                            .hidden = (const char *const *)hidden.items, .hidden_count = hidden.count};
    if (rc == BB_OK) rc = bb_model_config_from_flags(kind, &shape, &c);
    c.seq_len = (int)seq_len, c.vocab = (int)vocab, c.inputs = (int)inputs, c.classes = (int)classes;
    /* synthetic batches: tokens (a gpt's), or features and labels */
    bool gpt = rc == BB_OK && bb_model_targets_are_tokens(&c);
    if (rc == BB_OK && !micro_given && !gpt) micro_batch = 256;
    if (rc == BB_OK) rc = bb_model_parse_checkpoint(checkpoint, &c.checkpoint_every);
    if (rc == BB_OK) rc = loss_chunk_flag(&(model_flags){.loss_chunk = loss_chunk, .loss_chunk_given = loss_chunk_given}, &c);
    bb_backend_options bo = {.threads = (int)threads};
    bb_device_kind device_kind = BB_DEVICE_CPU;
    if (rc == BB_OK) rc = bb_precision_parse(precision, &bo.precision);
    if (rc == BB_OK) rc = bb_attention_parse(attention, &bo.attention);
    c.precision = bo.precision;
    if (rc == BB_OK) rc = device_flag_parse_one(device, &device_kind, &bo.device);
    if (rc == BB_OK) rc = bb_backend_create(device_kind, &bo, &be);
    if (rc == BB_OK) rc = bb_model_create(be, &c, (int)micro_batch, &m);
    if (rc == BB_OK) rc = bb_model_init(m, 1);
    size_t n_targets = gpt ? (size_t)micro_batch * seq_len : (size_t)micro_batch, params = 0;
    if (rc == BB_OK) {
        params = bb_model_param_count(m);
        times = malloc((size_t)steps * sizeof *times);
        targets = malloc(n_targets * sizeof *targets);
        batch = malloc(gpt ? n_targets * sizeof(int32_t) : (size_t)micro_batch * inputs * sizeof(float));
        if (!times || !targets || !batch) rc = bb_fail(BB_ERR_NOMEM, "out of memory");
        if (rc == BB_OK) rc = bb_backend_alloc(be, params * sizeof *mom, "optimizer state", (void **)&mom);
        if (rc == BB_OK) rc = bb_backend_alloc(be, params * sizeof *var, "optimizer state", (void **)&var);
        if (rc == BB_OK) rc = bb_backend_memset(be, mom, 0, params * sizeof *mom);
        if (rc == BB_OK) rc = bb_backend_memset(be, var, 0, params * sizeof *var);
    }
    if (rc == BB_OK) {
        for (size_t i = 0; i < n_targets; i++) {
            targets[i] = (int32_t)((i * 2654435761u) % (uint64_t)(gpt ? vocab : classes));
            if (gpt) ((int32_t *)batch)[i] = (int32_t)((i * 40503u) % (uint64_t)vocab);
        }
        for (int64_t i = 0; !gpt && i < micro_batch * inputs; i++) ((float *)batch)[i] = (float)(i % 255) / 255.0f;
        rc = bb_model_set_batch(m, batch, targets);
    }
    double first_loss = NAN, last_loss = NAN; /* the first: the fresh model's (ln V for a gpt) */
    uint64_t waits = 0;
    for (int64_t s = -2; rc == BB_OK && s < steps; s++) {
        if (s == 0) waits = bb_backend_host_waits(be), bb_backend_op_profile_reset(be); /* the timed steps' */
        uint64_t t0 = bb_clock_ns();
        double loss;
        rc = bb_model_forward(m, (float)n_targets, &loss, NULL);
        if (s == -2) first_loss = loss;
        last_loss = loss;
        if (rc == BB_OK) rc = bb_model_backward(m, false);
        for (int t = 0; rc == BB_OK && t < bb_model_tensor_count(m); t++) {
            const bb_tensor_info *ti = bb_model_tensor(m, t);
            bb_op_adamw(be, bb_model_params(m) + ti->offset, bb_model_grads(m) + ti->offset, mom + ti->offset,
                        var + ti->offset, ti->count, 1e-4f, 0.9f, 0.95f, 1e-8f, ti->decay ? 0.1f : 0.0f, (int)s + 3,
                        1.0f);
        }
        if (rc == BB_OK) rc = bb_backend_synchronize(be); /* a GPU step ends when its work does */
        if (rc == BB_OK && s >= 0) times[s] = (bb_clock_ns() - t0) / 1e9;
        if (bb_cli_interrupted) rc = bb_fail(BB_ERR_INTERRUPTED, "interrupted");
    }
    double median = rc == BB_OK ? bb_bench_median(times, (int)steps) : 0;
    uint64_t act = m ? bb_model_activation_bytes(m) : 0;
    waits = rc == BB_OK ? bb_backend_host_waits(be) - waits : 0;
    bb_op_time ops[64];
    int n_ops = rc == BB_OK ? bb_backend_op_profile(be, ops, 64) : 0;
    /* the planner's prediction for the same model (its optimizer state is AdamW's, as here) */
    bb_memory_breakdown plan = {0};
    if (rc == BB_OK) rc = bb_plan_memory(&c, (int)micro_batch, BB_OPTIMIZER_ADAMW, device_kind, &plan);
    if (rc == BB_OK) {
        double rate = n_targets / median;
        if (json) {
            json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:o, s:o, s:I, s:I, s:I, s:I, s:o, s:o, s:o}",
                                  "model", kind, "device", device, "precision", precision, "attention", attention,
                                  "checkpoint", checkpoint, "micro_batch", (json_int_t)micro_batch, "threads",
                                  (json_int_t)threads, "params", (json_int_t)params, "step_ms",
                                  bb_json_fixed(median * 1e3, 3), gpt ? "tokens_per_s" : "samples_per_s",
                                  bb_json_fixed(rate, 1), "activation_bytes", (json_int_t)act, "peak_bytes",
                                  (json_int_t)bb_backend_peak_bytes(be), "workspace_bytes",
                                  (json_int_t)bb_backend_workspace_bytes(be), "planned_bytes", (json_int_t)plan.total,
                                  "host_waits_per_step", bb_json_fixed((double)waits / (double)steps, 2), "first_loss",
                                  bb_json_real(first_loss, 9), "last_loss", bb_json_real(last_loss, 9));
            json_t *list = n_ops ? json_array() : NULL; /* BB_PROFILE_OPS=1: per step */
            for (int i = 0; i < n_ops; i++)
                json_array_append_new(list, json_pack("{s:s, s:o, s:o, s:o}", "op", ops[i].op, "calls",
                                                      bb_json_fixed((double)ops[i].calls / steps, 2), "ms",
                                                      bb_json_fixed(ops[i].ms / steps, 4), "gflop",
                                                      bb_json_fixed(ops[i].flops / steps / 1e9, 4)));
            if (list) json_object_set_new(o, "ops", list);
            rc = bb_json_write_line(stdout, o);
            json_decref(o);
        } else
            printf("%s, %zu parameters, micro-batch %lld, checkpoint %s, %lld threads: %.2f ms per step, "
                   "%.0f %s/s, activations %.1f MiB, loss %.4f -> %.4f\n",
                   kind, params, (long long)micro_batch, checkpoint, (long long)threads, median * 1e3, rate,
                   gpt ? "tokens" : "samples", act / 1048576.0, first_loss, last_loss);
    }
    free(times), free(targets), free(batch);
    if (be) bb_backend_free(be, mom), bb_backend_free(be, var);
    bb_model_destroy(m);
    bb_backend_destroy(be);
    int code = rc == BB_OK ? BB_EXIT_OK : bb_cli_report(rc, usage, summary, opts);
    bb_cli_free(opts, NULL);
    return code;
}
