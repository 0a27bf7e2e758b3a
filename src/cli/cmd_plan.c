/* cmd_plan.c — `bigbatch plan`: the memory planner's table. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bigbatch/json.h"
#include "bigbatch/plan.h"
#include "commands.h"
#include "data_flags.h"
#include "model_flags.h"

static const char usage[] =
    "bigbatch plan [--model gpt|llama|mlp ...] [--preset NAME] [--data DIR | --seq-len T [--vocab V]]\n"
    "              [--devices cpu:N|cuda:all|cuda:0,1] --device-mem BYTES\n"
    "              --global-batch G [--micro-batch B] [--checkpoint POLICY] [--optimizer NAME]\n"
    "              [--precision fp32|bf16] [--zero 0|1|2|3|auto] [--offload none|optimizer|auto]\n"
    "              [--host-mem BYTES] [--largest] [--calibrate] [--json]";
static const char summary[] =
    "Answers \"my device has M bytes and I want global batch G: what do I run?\". Lists every\n"
    "(micro-batch, accumulation, checkpoint policy) with its predicted peak memory per device\n"
    "and relative step time (recomputation counted) — the uniform policies, and for each\n"
    "micro-batch the fastest per-block plan that fits (a dynamic program over the blocks,\n"
    "e.g. plan:n*2,s*4,f*6) — and marks the one `train --micro-batch auto --checkpoint auto`\n"
    "would pick: the fastest that fits with a 5% margin. Fixing\n"
    "--micro-batch or --checkpoint restricts the table. The model's input and output sizes\n"
    "come from --data, or for a gpt or a llama from --seq-len (and --vocab: default the\n"
    "preset's, else GPT-2's 50257), no data needed:\n"
    "  bigbatch plan --model llama --preset llama-3.1-8b --seq-len 4096 --devices cuda:0,1,2,3,4,5,6,7 \\\n"
    "                --device-mem 80GiB --global-batch 256 --precision bf16 --zero 1\n\n"
    "--largest answers \"what is the largest model of this shape that trains here?\": the\n"
    "widest member of the model's shape family (its head size and blocks per width kept; a\n"
    "llama's grouping and SwiGLU share too) for which a plan exists, with that plan and why\n"
    "the next size does not fit; with --zero auto each size takes the lowest ZeRO stage\n"
    "that fits it (and with --offload auto the optimizer goes to host memory only when no\n"
    "stage fits without):\n"
    "  bigbatch plan --largest --model llama --preset llama-3.2-1b --seq-len 4096 --precision bf16 \\\n"
    "                --devices cuda:0,1,2,3,4,5,6,7 --device-mem 80GiB --global-batch 256 --zero auto\n\n"
    "The relative time weighs each candidate's work per op (counted, recomputation included)\n"
    "with what each op costs on this kind of device: --calibrate measures that (a few\n"
    "micro-steps of this model, about a second on a CPU) and caches it in\n"
    "~/.cache/bigbatch/calibration-KIND.json ($BB_CACHE_DIR or $XDG_CACHE_HOME/bigbatch\n"
    "first), which plan and train --micro-batch auto then use; without one, a FLOP rule.\n\n"
    "On a GPU a per-block plan may also offload blocks (o: their activations copied to pinned\n"
    "host memory during the forward and back during the backward, under the compute). The\n"
    "planner offers o only with a calibration, which also measures the GPU's link to the host\n"
    "(or with --link-gbps), and weighs each offloaded block by the copy time its compute does\n"
    "not hide against recomputing it; it offloads only to fit.";

static void print_table(const bb_plan *p, const bb_plan_request *q, const char *model)
{
    char mem[24], usable[24], peak[24];
    if (q->device_mem)
        printf("plan: %s on %d device%s, global batch %d, %s per device (%s usable)\n", model, q->devices,
               q->devices > 1 ? "s" : "", q->global_batch, bb_format_bytes(q->device_mem, mem, sizeof mem),
               bb_format_bytes(p->budget, usable, sizeof usable));
    else
        printf("plan: %s on %d device%s, global batch %d, no memory limit\n", model, q->devices,
               q->devices > 1 ? "s" : "", q->global_batch);
    if (q->calibration)
        printf("time: op costs measured on %s (%s, %s)\n", q->calibration->device, q->calibration->model,
               q->calibration->precision);
    else
        printf("time: a FLOP rule (plan --calibrate measures this device's op costs)\n");
    if (p->link_gbps > 0)
        printf("offloaded blocks (o): their copies priced at %.1f GB/s (%s) against the blocks' compute\n",
               p->link_gbps, q->link_gbps > 0 ? "--link-gbps" : "measured by plan --calibrate");
    else if (q->device != BB_DEVICE_CPU && !q->fixed_recompute)
        printf("offloaded blocks (o): not offered (%s)\n", q->calibration ? "plan --calibrate measured no link; "
               "--link-gbps states one" : "they are priced with a calibration: plan --calibrate");
    printf("\n     micro-batch  accumulation  checkpoint     peak per device  relative time%s\n",
           q->calibration ? "  step (predicted)" : "");
    for (int i = 0; i < p->count; i++) {
        const bb_plan_row *r = &p->rows[i];
        char step[32] = "";
        if (q->calibration) snprintf(step, sizeof step, "  %14.1f ms", r->step_ms);
        printf("  %s %11d  %12d  %-12s  %15s  %12.2fx%s%s\n", r->chosen ? "*" : " ", r->micro_batch, r->accumulation,
               r->recompute, bb_format_bytes(r->memory.total, peak, sizeof peak), r->relative_time, step,
               r->fits ? "" : "  does not fit");
    }
    if (p->chosen < 0) {
        printf("\n%s\n", p->why_nothing_fits);
        return;
    }
    const bb_plan_row *r = &p->rows[p->chosen];
    char a[24], b[24], c[24], d[24], e[24];
    printf("\n* chosen: --micro-batch %d --checkpoint %s (accumulation %d)\n", r->micro_batch, r->recompute,
           r->accumulation);
    if (q->zero == BB_ZERO_AUTO || q->offload == BB_OFFLOAD_AUTO) {
        printf("  --zero %d%s: the lowest stage that fits", p->zero, p->offload ? " --offload optimizer" : "");
        if (p->why_zero[0]) printf(" (%s)", p->why_zero);
        printf("\n");
    }
    char shard[48] = "", window[80] = "", pwindow[80] = "";
    if (p->zero && q->devices > 1) snprintf(shard, sizeof shard, " (its shard of %d, --zero %d)", q->devices, p->zero);
    if (p->zero >= 2 && q->devices > 1) snprintf(window, sizeof window, " (its shard's and %d buckets' window)",
                                                 BB_GRAD_WINDOW_RING + 1);
    if (p->zero == 3 && q->devices > 1) snprintf(pwindow, sizeof pwindow, " (its shard's fp32 and a window of buckets)");
    printf("  its peak: parameters %s%s, gradients %s%s, %s state %s%s, batches %s, activations %s",
           bb_format_bytes(r->memory.parameters, a, sizeof a), pwindow, bb_format_bytes(r->memory.gradients, b, sizeof b),
           window, bb_optimizer_desc_of(q->optimizer)->title, bb_format_bytes(r->memory.optimizer, c, sizeof c),
           shard, bb_format_bytes(r->memory.batches, d, sizeof d), bb_format_bytes(r->memory.activations, e, sizeof e));
    if (r->memory.workspace) printf(", workspace %s", bb_format_bytes(r->memory.workspace, a, sizeof a));
    uint64_t chunk_bytes = (uint64_t)r->loss_chunk * bb_model_outputs(&q->model) * sizeof(float);
    if (r->loss_chunk == r->micro_batch * bb_model_targets_per_example(&q->model))
        printf("\n  LM head + loss in one chunk: the micro-batch's %d tokens (%s of logits)", r->loss_chunk,
               bb_format_bytes(chunk_bytes, a, sizeof a));
    else if (r->loss_chunk)
        printf("\n  LM head + loss in chunks of %d tokens (%s of logits at a time: %s)", r->loss_chunk,
               bb_format_bytes(chunk_bytes, a, sizeof a),
               q->model.loss_chunk              ? "--loss-chunk"
               : q->device != BB_DEVICE_CPU     ? "a 16th of --device-mem"
               : q->device_mem                  ? "32 MiB at most, a 64th of --device-mem"
                                                : "32 MiB at most");
    printf("\n  host memory: about %s of loader slots per device%s", bb_format_bytes(r->memory.loader_slots, a, sizeof a),
           q->device != BB_DEVICE_CPU ? " (pinned)" : "");
    uint64_t activations = r->memory.offloaded_activations, state = r->memory.offloaded - activations;
    if (state)
        printf(", %s of offloaded optimizer state, master weights and gradients (--offload optimizer)",
               bb_format_bytes(state, a, sizeof a));
    if (activations)
        printf(", %s of offloaded blocks' activations (--checkpoint's o)", bb_format_bytes(activations, a, sizeof a));
    printf("\n");
}

/* --largest's answer, then its plan's table. */
static void print_largest(const bb_largest *l, const bb_plan_request *q)
{
    char model[160], next[160], mem[24];
    bb_model_describe(&l->model, model, sizeof model);
    bb_model_describe(&l->next, next, sizeof next);
    printf("largest: %s, %.1fM parameters, trains on %d device%s of %s at global batch %d\n", model,
           (double)l->parameters / 1e6, q->devices, q->devices > 1 ? "s" : "",
           bb_format_bytes(q->device_mem, mem, sizeof mem), q->global_batch);
    printf("the next size, %s (%.1fM parameters), does not: %s\n\n", next, (double)l->next_parameters / 1e6,
           l->why_next);
    if (q->model.precision == BB_PRECISION_BF16) snprintf(model + strlen(model), sizeof model - strlen(model), " in bf16");
    print_table(&l->plan, q, model);
}

/* A JSON array, one row per line. */
static bb_status print_json(const bb_plan *p)
{
    bb_status rc = fputs("[", stdout) >= 0 ? BB_OK : BB_ERR_IO;
    for (int i = 0; rc == BB_OK && i < p->count; i++) {
        const bb_plan_row *r = &p->rows[i];
        const bb_memory_breakdown *m = &r->memory;
        json_t *row = json_pack("{s:i, s:i, s:s, s:I, s:o, s:o, s:i, s:b, s:b, s:I, s:I, s:I, s:I, s:I, s:I, s:i, s:I}",
                                "micro_batch", r->micro_batch, "accumulation", r->accumulation, "checkpoint",
                                r->recompute, "peak_bytes", (json_int_t)m->total, "relative_time",
                                bb_json_fixed(r->relative_time, 4), "step_ms",
                                r->step_ms > 0 ? bb_json_fixed(r->step_ms, 3) : json_null(),
                                "loss_chunk", r->loss_chunk, "fits", r->fits, "chosen", r->chosen, "parameters_bytes",
                                (json_int_t)m->parameters, "gradients_bytes", (json_int_t)m->gradients,
                                "optimizer_bytes", (json_int_t)m->optimizer, "batches_bytes", (json_int_t)m->batches,
                                "activations_bytes", (json_int_t)m->activations, "workspace_bytes",
                                (json_int_t)m->workspace, "zero", p->zero, "offloaded_bytes",
                                (json_int_t)m->offloaded);
        printf("%s\n  ", i ? "," : "");
        rc = bb_json_write(stdout, row);
        json_decref(row);
    }
    if (rc == BB_OK && fputs("\n]\n", stdout) < 0) rc = BB_ERR_IO;
    return rc == BB_ERR_IO ? bb_fail_errno(BB_ERR_IO, "plan --json: write failed") : rc;
}

/* --calibrate: measures and caches the op costs; else the cached ones, if any. */
static bb_status plan_calibration(bb_plan_request *q, bool calibrate, int device_id, bb_calibration *cal)
{
    if (calibrate) {
        char path[4200];
        bb_calibration_path(q->device, path, sizeof path);
        long cpus = sysconf(_SC_NPROCESSORS_ONLN); /* a CPU device's share of the cores, as train gives it */
        int threads = q->device == BB_DEVICE_CPU && cpus > q->devices ? (int)cpus / q->devices : 1;
        bb_backend_options bo = {.device = device_id, .precision = q->model.precision, .threads = threads};
        BB_TRY(bb_calibrate(&q->model, q->device, &bo, cal));
        BB_TRY(bb_calibration_save(cal, path));
        fprintf(stderr, "plan: op costs of %s on %s measured and saved in %s\n", cal->model, cal->device, path);
    } else if (!bb_calibration_cached(q->device, cal)) {
        return BB_OK; /* none cached (or unreadable): the FLOP rule */
    }
    q->calibration = cal;
    return BB_OK;
}

int bb_cmd_plan(int argc, char **argv)
{
    model_flags mf = MODEL_FLAGS_DEFAULT;
    mf.checkpoint = "auto";
    const char *data = "data/kjv", *devices = "cpu:1";
    bb_precision precision = BB_PRECISION_FP32;
    bool json = false, data_given = false, calibrate = false, seq_given = false, vocab_given = false, largest = false;
    int64_t seq_len = 0, vocab = 0;
    data_flags df = DATA_FLAGS_DEFAULT;
    bb_plan_request q = {.global_batch = 64, .optimizer = BB_OPTIMIZER_ADAMW,
                         .bucket_mib = BB_BUCKET_MIB_DEFAULT};
    const bb_opt opts[] = {
        MODEL_FLAG_OPTS(mf),
        {"--data", BB_OPT_STRING, &data, "DIR|URL", "the training data (gives the model's input and output sizes; "
         "a URL is mirrored first, as train does)", .given = &data_given},
        DATA_FLAGS_OPTS(df),
        {"--seq-len", BB_OPT_INT, &seq_len, "T", "gpt, llama: plan for this context length, no data read",
         .min = 1, .max = 1 << 24, .given = &seq_given},
        {"--vocab", BB_OPT_INT, &vocab, "V", "with --seq-len: the vocabulary (default: the preset's, else 50257)",
         .min = 2, .max = 1 << 30, .given = &vocab_given},
        DEVICES_FLAG_OPT(devices, NULL),
        GLOBAL_BATCH_FLAG_OPT(q.global_batch, NULL),
        {"--micro-batch", BB_OPT_I32, &q.fixed_micro_batch, "B", "only this micro-batch (default: any)", .min = 0,
         .max = 1 << 24},
        OPTIMIZER_FLAG_OPT(q.optimizer, NULL),
        PRECISION_FLAG_OPT(precision, NULL),
        MEMORY_FLAG_OPTS(q.device_mem, q.zero, q.zero_shards, q.bucket_mib, q.offload, q.host_mem, q.link_gbps, NULL, NULL,
                         NULL),
        {"--calibrate", BB_OPT_FLAG, &calibrate, NULL,
         "measure what each op costs on this device kind (this model, a few micro-steps), cache it, then plan"},
        {"--json", BB_OPT_FLAG, &json, NULL, "print the table as a JSON array"},
        {"--largest", BB_OPT_FLAG, &largest, NULL, "the largest model of this shape family that fits (needs "
         "--device-mem), with its plan"},
        {0}};
    bb_plan p = {0};
    bb_status rc = bb_cli_parse("plan", opts, argc, argv, NULL);
    bool any_checkpoint = rc == BB_OK && !strcmp(mf.checkpoint, "auto");
    if (any_checkpoint) mf.checkpoint = "none";
    if (rc == BB_OK) rc = model_flags_config(&mf, &q.model);
    q.fixed_recompute = !any_checkpoint;
    q.model.precision = precision;
    if (rc == BB_OK && seq_given && data_given) rc = bb_fail(BB_ERR_ARG, "--seq-len plans without data: not with --data");
    if (rc == BB_OK && vocab_given && !seq_given) rc = bb_fail(BB_ERR_ARG, "--vocab goes with --seq-len (--data gives "
                                                               "its own vocabulary)");
    if (rc == BB_OK && seq_given) { /* the records such data would have */
        uint32_t V = (uint32_t)(vocab_given ? vocab : bb_model_outputs(&q.model) ? bb_model_outputs(&q.model) : 50257);
        bb_record_format f = token_records((int)seq_len, V);
        q.record_size = f.record_size;
        rc = bb_model_config_from_data(&q.model, &f, "--seq-len");
    } else if (rc == BB_OK) {
        rc = data_flags_resolve(&df, &data, false);
        if (rc == BB_OK) rc = default_data_present(data, data_given);
        const char *train = rc == BB_OK ? resolve_split(data, "train") : NULL;
        if (rc == BB_OK) rc = model_config_from_data(train ? train : data, &q.model, &q.record_size);
    }
    int ids[BB_DEVICES_MAX];
    if (rc == BB_OK) rc = devices_flag_parse(devices, false, &q.devices, &q.device, ids);
    bb_calibration cal;
    if (rc == BB_OK) rc = plan_calibration(&q, calibrate, ids[0], &cal);
    if (rc == BB_OK && largest && json) rc = bb_fail(BB_ERR_ARG, "--largest prints its answer as text: not with --json");
    if (rc == BB_OK && largest) {
        bb_largest l;
        rc = bb_plan_largest(&q, &l);
        if (rc == BB_OK) {
            print_largest(&l, &q);
            p = l.plan; /* printed; freed below */
            q.model = l.model;
        }
    } else if (rc == BB_OK) {
        rc = bb_plan_make(&q, &p);
    }
    if (rc == BB_OK && json) {
        rc = print_json(&p);
    } else if (rc == BB_OK && !largest) {
        char model[160];
        bb_model_describe(&q.model, model, sizeof model);
        if (q.model.precision == BB_PRECISION_BF16) snprintf(model + strlen(model), sizeof model - strlen(model), " in bf16");
        print_table(&p, &q, model);
    }
    /* Nothing fits: the table (stdout) shows why, and it is an error (stderr, exit 1). */
    if (rc == BB_OK && p.chosen < 0) rc = bb_fail(BB_ERR_OOM, "plan: %s", p.why_nothing_fits);
    bb_plan_free(&p);
    int code = bb_cli_report(rc, usage, summary, opts);
    bb_cli_free(opts, NULL);
    return code;
}
