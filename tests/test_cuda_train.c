/* test_cuda_train.c — training on GPUs against the CPU: two GPUs train as
 * cpu:2 (gpt and mlp, accumulation, overlap, checkpointing, ZeRO-1, bf16),
 * resume across GPUs and the CPU, a device fault and an NCCL failure end
 * the run with one line, bench and plan run, and what a training step
 * costs the host. On the emulated GPUs of `make cuda-emu` (tests/cuda_emu)
 * these run on every commit; in a CUDA build they run on the machine's
 * GPUs and say *skipped* without the ones they need (or, for what only the
 * emulator can do — inject a fault, count the host's waits — always). */
#include <math.h>

#include <jansson.h>

#include "gpu_fixture.h"

TestSuite(cuda_train, .init = fixture_setup, .fini = fixture_teardown);

/* The losses of two runs, step by step, within `tol` (relative). */
static void expect_same_losses(const char *what, const bb_train_result *a, const bb_train_result *b, double tol)
{
    uint64_t n = a->steps_done - a->first_step;
    cr_assert_eq(n, b->steps_done - b->first_step, "%s: the runs did different numbers of steps", what);
    for (uint64_t s = 0; s < n; s++) {
        double rel = fabs(a->losses[s] - b->losses[s]) / fabs(a->losses[s]);
        cr_log_info("%-28s step %llu: %.7f vs %.7f (rel %.1e)", what, (unsigned long long)(a->first_step + s + 1),
                    a->losses[s], b->losses[s], rel);
        cr_assert(rel <= tol, "%s, step %llu: %.9g vs %.9g", what, (unsigned long long)(a->first_step + s + 1),
                  a->losses[s], b->losses[s]);
    }
}

/* `train --devices cuda:0,1` against `--devices cpu:2`, the same data and
 * options: gpt with accumulation and the reducer's overlap (small buckets,
 * so that several are reduced while the backward runs), without overlap,
 * with --checkpoint blocks, selective and a mixed plan, and with --zero 1
 * (equal slices: NCCL's reduce-scatter and all-gather, in place and through
 * the staging buffer, for buckets the slices fill and those they do not;
 * whole tensors: all-reduce and a broadcast from each owner) and --zero 2
 * (the gradient window's slots reused across buckets and micro-steps,
 * each micro-step's slices kept in the shards: copied, then added) and
 * --zero 3 (each bucket of weights all-gathered, or broadcast from its
 * owners, into the parameter window's slots ahead of its use), each
 * also with the optimizer offloaded (its gradients copied down and weights
 * up in chunks around the host's step); the mlp;
 * bf16, also with a plan (within 2e-2: the GPU's products are bf16, the
 * CPU's fp32); a grouped-query llama, with a plan and ZeRO-1, and in bf16. */
Test(cuda_train, two_gpus_train_as_cpu_2)
{
    need_gpus(2);
    char *tokens = make_tokens("tokens", 200), *images = make_images("images", 200, 3);
    struct {
        const char *name;
        int kind; /* 0 gpt, 1 mlp, 2 llama */
        bool no_overlap;
        const char *checkpoint;
        bool bf16;
        int zero;
        bb_param_shard_rule shards;
    } cases[] = {{"gpt", 0, false, NULL, false, 0},
                 {"gpt --no-overlap", 0, true, NULL, false, 0},
                 {"gpt --checkpoint blocks", 0, false, "blocks", false, 0},
                 {"gpt --checkpoint selective", 0, false, "selective", false, 0},
                 {"gpt --checkpoint plan:s,f", 0, false, "plan:s,f", false, 0},
                 {"gpt --zero 1", 0, false, NULL, false, 1},
                 {"gpt --zero 1 --zero-shards tensors", 0, false, NULL, false, 1, BB_PARAM_SHARD_TENSORS},
                 {"mlp --zero 1 --optimizer sgd", 1, false, NULL, false, 1},
                 {"gpt --zero 1 --optimizer lamb", 0, false, NULL, false, 1},
                 {"mlp --zero 3 --optimizer lars", 1, false, NULL, false, 3},
                 {"gpt --zero 1 --optimizer muon", 0, false, NULL, false, 1},
                 {"llama --zero 3 --offload optimizer --optimizer muon", 2, false, NULL, false, 3},
                 {"gpt --global-batch ramp:8..16:2", 0, false, NULL, false, 0},
                 {"mlp --zero 1 --global-batch auto:8..16", 1, false, NULL, false, 1},
                 {"gpt --zero 2", 0, false, NULL, false, 2},
                 {"gpt --zero 2 --zero-shards tensors --checkpoint selective", 0, false, "selective", false, 2,
                  BB_PARAM_SHARD_TENSORS},
                 {"mlp --zero 2", 1, false, NULL, false, 2},
                 {"llama --precision bf16 --zero 2", 2, false, NULL, true, 2},
                 {"gpt --zero 3", 0, false, NULL, false, 3},
                 {"gpt --zero 3 --zero-shards tensors --checkpoint plan:s,f", 0, false, "plan:s,f", false, 3,
                  BB_PARAM_SHARD_TENSORS},
                 {"mlp --zero 3", 1, false, NULL, false, 3},
                 {"llama --precision bf16 --zero 3", 2, false, NULL, true, 3},
                 {"gpt --offload optimizer", 0, false, NULL, false, 0},
                 {"gpt --checkpoint offload", 0, false, "offload", false, 0},
                 {"gpt --precision bf16 --checkpoint plan:o,s", 0, false, "plan:o,s", true, 0},
                 {"gpt --zero 2 --offload optimizer", 0, false, NULL, false, 2},
                 {"gpt --zero 3 --zero-shards tensors --offload optimizer", 0, false, NULL, false, 3,
                  BB_PARAM_SHARD_TENSORS},
                 {"mlp", 1, false, NULL, false, 0},
                 {"gpt --precision bf16", 0, false, NULL, true, 0},
                 {"gpt --precision bf16 --checkpoint plan:f,s", 0, false, "plan:f,s", true, 0},
                 {"llama --checkpoint plan:s,f --zero 1", 2, false, "plan:s,f", false, 1},
                 {"llama --precision bf16", 2, false, NULL, true, 0}};
    bb_train_options (*const make[])(const char *, int, int, int) = {gpt_options, mlp_options, llama_options};
    int noise_measured = 0;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        bb_train_options o = make[cases[i].kind](cases[i].kind == 1 ? images : tokens, 2, 4, 16);
        o.steps = 4, o.bucket_mib = 0.001; /* accumulation 2; buckets of ~1 KiB */
        o.no_overlap = cases[i].no_overlap, o.zero = cases[i].zero, o.zero_shards = cases[i].shards;
        const char *opt = strstr(cases[i].name, "--optimizer ");
        if (opt) { /* the last flag of the name */
            cr_assert_eq(bb_optimizer_kind_parse(opt + strlen("--optimizer "), &o.opt.kind), BB_OK);
            o.opt.eps = bb_optimizer_defaults_for(o.opt.kind).eps;
            o.opt.momentum = bb_optimizer_defaults_for(o.opt.kind).momentum;
        }
        if (strstr(cases[i].name, "--offload")) o.offload = BB_OFFLOAD_OPTIMIZER;
        if (strstr(cases[i].name, "--global-batch ramp")) o.ramp_from = 8, o.ramp_steps = 2; /* 8, 8, then 16 */
        if (strstr(cases[i].name, "--global-batch auto")) o.ramp_from = 8, o.auto_batch = true;
        if (cases[i].checkpoint)
            cr_assert_eq(bb_model_parse_recompute(cases[i].checkpoint, &o.model), BB_OK, "%s", bb_error_message());
        if (cases[i].bf16) o.precision = BB_PRECISION_BF16;
        bb_train_result c = train(&o);
        on_gpus(&o, 2);
        bb_train_result g = train(&o);
        expect_same_losses(cases[i].name, &c, &g, cases[i].bf16 ? 2e-2 : 1e-5);
        /* the noise scale: each GPU's own gradients' squares, taken on its communication stream */
        double noise_tol = (cases[i].bf16 ? 2e-2 : 1e-4) * fabs(c.noise_scale);
        cr_assert(isnan(c.noise_scale) ? isnan(g.noise_scale) : fabs(g.noise_scale - c.noise_scale) <= noise_tol,
                  "%s: noise scale %.9g on the GPUs, %.9g on cpu:2", cases[i].name, g.noise_scale, c.noise_scale);
        noise_measured += isfinite(g.noise_scale);
        if (!cases[i].bf16)
            cr_assert(relative_distance(c.params, g.params, c.param_count) <= 1e-5, "%s: the weights differ by %.2e",
                      cases[i].name, relative_distance(c.params, g.params, c.param_count));
        bb_train_result_free(&c), bb_train_result_free(&g);
    }
    cr_assert_gt(noise_measured, (int)(sizeof cases / sizeof *cases) / 2, "the noise scale measured in %d cases only",
                 noise_measured);
    cr_log_info("the noise scale as cpu:2's in %d cases", noise_measured);
    free(tokens), free(images);
}

/* One GPU with micro-steps: the noise scale's small batch is the first
 * micro-step's gradients, whose squares the GPU writes into pinned host
 * memory without a wait: as cpu:1's. */
Test(cuda_train, one_gpu_measures_the_noise_scale_as_the_cpu)
{
    need_gpus(1);
    char *tokens = make_tokens("tokens", 200);
    bb_train_options o = gpt_options(tokens, 1, 4, 16);
    o.steps = 6;
    bb_train_result c = train(&o);
    on_gpus(&o, 1);
    bb_train_result g = train(&o);
    cr_assert(isfinite(c.noise_scale), "cpu:1 with 4 micro-steps measures it");
    cr_assert(fabs(g.noise_scale - c.noise_scale) <= 1e-4 * fabs(c.noise_scale), "noise scale %.9g on the GPU, %.9g "
              "on cpu:1", g.noise_scale, c.noise_scale);
    bb_train_result_free(&c), bb_train_result_free(&g);
    free(tokens);
}

/* The same with each stream of the emulator waiting up to 200 µs before
 * each operation (another seed, too): a missing wait between streams
 * would change the losses. */
Test(cuda_train, two_gpus_train_as_cpu_2_with_the_timing_shaken)
{
    need_gpus(2);
    need_emulator("shaking the streams' timing");
    setenv("BB_CUDA_EMU_DELAY_US", "200", 1); /* before this process's first CUDA call */
    setenv("BB_CUDA_EMU_SEED", "7", 1);
    char *tokens = make_tokens("tokens", 200);
    bb_train_options o = gpt_options(tokens, 2, 4, 16);
    o.steps = 3, o.bucket_mib = 0.001;
    bb_train_result c = train(&o);
    on_gpus(&o, 2);
    bb_train_result g = train(&o);
    expect_same_losses("gpt, timing shaken", &c, &g, 1e-5);
    bb_train_result_free(&c), bb_train_result_free(&g);
    free(tokens);
}

/* --zero 2 with the communication stream lagging the whole step (only it
 * waits before each operation): the backward would overwrite a window slot
 * before its reduce-scatter read it, were it not for the wait on the slot's
 * event (n_window_write). */
Test(cuda_train, zero2_on_two_gpus_waits_for_each_window_slot)
{
    need_gpus(2);
    need_emulator("delaying the communication stream alone");
    setenv("BB_CUDA_EMU_DELAY_US", "20000", 1); /* 0-20 ms: slower than the emulated backward's kernels */
    setenv("BB_CUDA_EMU_DELAY_ONLY", "2", 1); /* the backend's streams: compute, copy, communication */
    char *tokens = make_tokens("tokens", 200);
    bb_train_options o = gpt_options(tokens, 2, 4, 16);
    o.steps = 3, o.bucket_mib = 0.001, o.zero = 2;
    bb_train_result c = train(&o);
    on_gpus(&o, 2);
    bb_train_result g = train(&o);
    expect_same_losses("gpt --zero 2, communication lagging", &c, &g, 1e-5);
    cr_assert(relative_distance(c.params, g.params, c.param_count) <= 1e-5, "--zero 2, communication lagging: the "
              "weights differ by %.2e", relative_distance(c.params, g.params, c.param_count));
    bb_train_result_free(&c), bb_train_result_free(&g);
    free(tokens);
}

/* --zero 3 with one stream lagging (the emulator reads its settings once
 * a process, so one test each): the compute stream (a gather would
 * overwrite a slot the compute stream still reads, were it not issued after
 * the compute stream's work so far) or the communication stream (a layer
 * would read its slot before its gather filled it, were it not for the wait
 * on the bucket's event). */
static void lagging(const char *stream, const char *what, int zero, bb_offload offload, const char *checkpoint)
{
    /* before this process's first CUDA call, which reads them: each
     * operation of the lagging stream waits 0-2 ms (compute: hundreds of
     * kernels a step) or 0-5 ms (copies, collectives) */
    setenv("BB_CUDA_EMU_DELAY_US", strcmp(stream, "0") ? "5000" : "2000", 1);
    setenv("BB_CUDA_EMU_DELAY_ONLY", stream, 1); /* the backend's streams: compute 0, copy 1, communication 2 */
    need_gpus(2);
    need_emulator("delaying one stream alone");
    char *tokens = make_tokens("tokens", 200);
    bb_train_options o = gpt_options(tokens, 2, 4, 16);
    o.model.gpt.layers = 6; /* the window's ring wraps several times a pass */
    o.steps = 2, o.bucket_mib = 0.001, o.zero = zero, o.offload = offload;
    if (checkpoint) cr_assert_eq(bb_model_parse_recompute(checkpoint, &o.model), BB_OK);
    o.val_data = tokens; /* evaluated at the end, from the weights gathered on the host */
    bb_train_result c = train(&o);
    on_gpus(&o, 2);
    bb_train_result g = train(&o);
    expect_same_losses(what, &c, &g, 1e-5);
    cr_assert(fabs(c.val_loss - g.val_loss) <= 1e-5 * c.val_loss, "%s: val loss %.9g on the CPU, %.9g on GPUs", what,
              c.val_loss, g.val_loss);
    cr_assert(relative_distance(c.params, g.params, c.param_count) <= 1e-5, "%s: the weights differ by %.2e", what,
              relative_distance(c.params, g.params, c.param_count));
    bb_train_result_free(&c), bb_train_result_free(&g);
    free(tokens);
}

Test(cuda_train, zero3_gathers_wait_for_a_lagging_compute_stream)
{
    lagging("0", "gpt --zero 3, compute lagging", 3, BB_OFFLOAD_NONE, NULL);
}

Test(cuda_train, zero3_passes_wait_for_a_lagging_gather)
{
    lagging("2", "gpt --zero 3, communication lagging", 3, BB_OFFLOAD_NONE, NULL);
}

/* --offload optimizer with the compute stream lagging: the host steps a
 * chunk only once its gradients are down (its event), and the next forward
 * reads the weights only once they are up (the compute stream's order). */
Test(cuda_train, offloaded_steps_wait_for_their_gradients)
{
    lagging("0", "gpt --offload optimizer, compute lagging", 0, BB_OFFLOAD_OPTIMIZER, NULL);
}

/* Offloaded blocks (--checkpoint offload) with one stream lagging: the
 * copy stream (a backward would read a slot before its block came back,
 * were it not for the wait on the slot's event) or the compute stream (a
 * block's copy to the host would read its slot before the forward wrote
 * it, or a fetch overwrite a slot a backward still reads, were the copy
 * stream not ordered after the compute stream's work so far). */
Test(cuda_train, offloaded_blocks_wait_for_a_lagging_copy_stream)
{
    lagging("1", "gpt --checkpoint offload, copies lagging", 0, BB_OFFLOAD_NONE, "offload");
}

Test(cuda_train, offloaded_blocks_wait_for_a_lagging_compute_stream)
{
    lagging("0", "gpt --checkpoint offload, compute lagging", 0, BB_OFFLOAD_NONE, "offload");
}

/* Saved on two GPUs: resumed there, the losses and weights of the whole
 * run to the bit; resumed on cpu:2, within 1e-5. */
Test(cuda_train, a_gpu_save_resumes_bitwise_on_gpus_and_on_cpu_2)
{
    need_gpus(2);
    char *tokens = make_tokens("tokens", 200), *ckpt = tu_path(tmp, "ckpt");
    bb_train_options o = gpt_options(tokens, 2, 4, 16);
    on_gpus(&o, 2);
    o.steps = 6, o.bucket_mib = 0.001;
    bb_train_result whole = train(&o);
    o.save_dir = ckpt, o.stop_after = 3;
    bb_train_result first = train(&o);
    o.save_dir = NULL, o.stop_after = 0, o.resume_dir = ckpt, o.set = BB_TRAIN_SET(BB_TRAIN_SAVE);
    bb_train_result gpu = train(&o);
    cr_assert_eq(gpu.first_step, 3);
    cr_assert_eq(memcmp(whole.losses + 3, gpu.losses, 3 * sizeof *gpu.losses), 0, "losses after a resume on the GPUs");
    cr_assert_eq(memcmp(whole.params, gpu.params, whole.param_count * sizeof *whole.params), 0,
                 "weights after a resume on the GPUs");
    o.device = BB_DEVICE_CPU;
    bb_train_result cpu2 = train(&o);
    bb_train_result tail = whole;
    tail.first_step = 3, tail.losses = whole.losses + 3;
    expect_same_losses("resumed on cpu:2", &tail, &cpu2, 1e-5);
    bb_train_result_free(&whole), bb_train_result_free(&first), bb_train_result_free(&gpu), bb_train_result_free(&cpu2);
    free(tokens), free(ckpt);
}

/* stderr without the emulator's own lines ("cuda-emu: ..."), which say
 * what it caught; what is left is bigbatch's. */
static char *bigbatch_lines(const char *err)
{
    char *out = calloc(1, strlen(err) + 1), *copy = strdup(err);
    for (char *line = strtok(copy, "\n"); line; line = strtok(NULL, "\n"))
        if (strncmp(line, "cuda-emu: ", 10)) strcat(strcat(out, line), "\n");
    free(copy);
    return out;
}

/* A device fault in the optimizer of the last step on cuda:1 (an illegal
 * address, as a bad pointer would give): the run fails with one line
 * naming the device and the kernel, and the latest checkpoint is the step
 * before. */
Test(cuda_train, a_device_fault_in_the_last_step_fails_the_run_with_one_line)
{
    need_gpus(2);
    need_emulator("injecting a device fault");
    char *tokens = make_tokens("tokens", 200), *ckpt = tu_path(tmp, "ckpt");
    bb_backend_t *be;
    cr_assert_eq(bb_backend_create_cpu(&(bb_backend_options){0}, &be), BB_OK);
    bb_model_config c = gpt_options(tokens, 1, 4, 16).model;
    c.gpt.vocab = TOKENS_VOCAB, c.gpt.seq_len = TOKENS_T;
    bb_model_t *m;
    cr_assert_eq(bb_model_create(be, &c, 1, &m), BB_OK, "%s", bb_error_message());
    char fault[64];
    snprintf(fault, sizeof fault, "adamw_k:%d@1", 2 * bb_model_tensor_count(m) + 1); /* step 3's first update */
    bb_model_destroy(m);
    bb_backend_destroy(be);
    setenv("BB_CUDA_EMU_FAULT", fault, 1);
    tu_run r = tu_bigbatch("train", "--data", tokens, "--devices", "cuda:0,1", "--layers", "2", "--heads", "2",
                           "--d-model", "16", "--global-batch", "16", "--micro-batch", "4", "--steps", "3", "--save",
                           ckpt, "--save-every", "1", "--quiet");
    unsetenv("BB_CUDA_EMU_FAULT");
    char *own = bigbatch_lines(r.err);
    tu_run shown = {.exit_code = r.exit_code, .err = own};
    cr_log_info("%s", r.err);
    tu_assert_error(&shown, "cuda:1", "an illegal memory access", "adamw_k");
    cr_assert_eq(r.exit_code, 1);
    bb_checkpoint_info info;
    cr_assert_eq(bb_checkpoint_read_info(ckpt, &info), BB_OK, "%s", bb_error_message());
    cr_assert_eq(info.step, 2, "the latest checkpoint is the last good step, not %llu", (unsigned long long)info.step);
    free(own), tu_run_free(&r);
    free(tokens), free(ckpt);
}

/* cuda:1's 4th all-reduce (step 2's loss) never arrives, as with a lost
 * peer: its reducer sees the communicator's error and aborts every
 * communicator, which frees cuda:0's stream and worker waiting for it; the
 * run ends at once with one line naming NCCL. The streams are slowed so
 * that the host has queued the next collectives before the failure shows
 * (the order in which a reducer that only watched its streams hung). */
static void nccl_fault_ends_the_run(const char *tokens, const char *fault, const char *zero)
{
    char *out = tu_path(tmp, "out"), *err = tu_path(tmp, "err");
    setenv("BB_CUDA_EMU_NCCL_FAULT", fault, 1);
    setenv("BB_CUDA_EMU_DELAY_US", "300", 1);
    char *argv[] = {(char *)tu_bigbatch_bin(), "train", "--data", (char *)tokens, "--devices", "cuda:0,1", "--layers",
                    "2", "--heads", "2", "--d-model", "16", "--global-batch", "16", "--micro-batch", "4", "--steps", "6",
                    "--bucket-mib", "0.001", "--zero", (char *)zero, "--quiet", NULL};
    double t0 = now_s();
    pid_t pid = start_logged(argv, out, err);
    int code = exit_within(pid, 60);
    unsetenv("BB_CUDA_EMU_NCCL_FAULT");
    unsetenv("BB_CUDA_EMU_DELAY_US");
    char *e = (char *)tu_read_file(err, NULL), *own = bigbatch_lines(e);
    cr_log_info("%s, --zero %s: exit %d after %.1f s: %s", fault, zero, code, now_s() - t0, e);
    cr_assert_neq(code, -1, "%s, --zero %s: the run hung: a worker waited for ever (stderr: %s)", fault, zero, e);
    tu_run shown = {.exit_code = code, .err = own};
    tu_assert_error(&shown, "NCCL");
    free(e), free(own), free(out), free(err);
}

/* The same under --zero 2, the 3rd reduce-scatter of cuda:1 (a micro-step's
 * bucket) lost: the backward's stream waits on its window slot's event
 * behind it, and the abort frees it too. */
Test(cuda_train, an_nccl_failure_ends_every_gpu_thread)
{
    need_gpus(2);
    need_emulator("injecting an NCCL fault");
    char *tokens = make_tokens("tokens", 200);
    nccl_fault_ends_the_run(tokens, "AllReduce:4@1", "0");
    nccl_fault_ends_the_run(tokens, "ReduceScatter:3@1", "2");
    nccl_fault_ends_the_run(tokens, "AllGather:5@1", "3");
    free(tokens);
}

/* cuda:1's stream stops for good inside a kernel (as a GPU spinning on a
 * dead peer would): nothing returns an error, every thread waits. The
 * watchdog sees no progress for --timeout 4 s and ends the run, exit 1,
 * with one line naming cuda:1, the step and where it is. (4 s, not 2: under
 * ASan on a loaded machine a first emulated step can take 2 s itself.) */
Test(cuda_train, a_stalled_gpu_ends_the_run_within_the_timeout)
{
    need_gpus(2);
    need_emulator("stalling a GPU");
    char *tokens = make_tokens("tokens", 200);
    char *out = tu_path(tmp, "out"), *err = tu_path(tmp, "err");
    setenv("BB_CUDA_EMU_HANG", "layernorm_forward_k:12@1", 1); /* step 2 (10 a step: 5 a micro-step) */
    char *argv[] = {(char *)tu_bigbatch_bin(), "train", "--data", tokens, "--devices", "cuda:0,1", "--layers", "2",
                    "--heads", "2", "--d-model", "16", "--global-batch", "16", "--micro-batch", "4", "--steps", "6",
                    "--timeout", "4", "--quiet", NULL};
    double t0 = now_s();
    pid_t pid = start_logged(argv, out, err);
    int code = exit_within(pid, 16);
    unsetenv("BB_CUDA_EMU_HANG");
    double took = now_s() - t0;
    char *e = (char *)tu_read_file(err, NULL), *own = bigbatch_lines(e);
    cr_log_info("exit %d after %.1f s: %s", code, took, e);
    if (code == -1) kill(pid, SIGKILL), waitpid(pid, NULL, 0);
    cr_assert_neq(code, -1, "the run hung past --timeout 4 + 12 s (stderr: %s)", e);
    cr_assert_eq(code, 1);
    tu_run shown = {.exit_code = code, .err = own};
    tu_assert_error(&shown, "no progress for", "--timeout 4", "cuda:1", "step 2");
    free(e), free(own), free(out), free(err), free(tokens);
}

/* bf16 attention takes cuDNN's fused SDPA where it loads; where it does
 * not (absent, not cuDNN, or the emulated GPU, which cannot run it) the run
 * goes on on bigbatch's own kernels after one warning for the process
 * (not one per GPU) that says why. */
Test(cuda_train, without_cudnn_bf16_attention_runs_on_our_kernels_after_one_warning)
{
    need_gpus(2);
    need_emulator("a cuDNN that cannot run");
    char *tokens = make_tokens("tokens", 200);
    static const struct { const char *library, *why; } cases[] = {
        {"/nonexistent/libcudnn.so.9", "cannot open shared object file"},
        {"libm.so.6", "lacks cuDNN 9's functions"},
        {"", "the emulated GPU cannot run it"}, /* the toolkit's libcudnn.so.9, where it is installed */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        setenv("BB_CUDNN_LIBRARY", cases[i].library, 1);
        tu_run r = tu_bigbatch("train", "--data", tokens, "--devices", "cuda:0,1", "--layers", "2", "--heads", "2",
                               "--d-model", "16", "--global-batch", "16", "--micro-batch", "4", "--steps", "2",
                               "--precision", "bf16", "--quiet");
        unsetenv("BB_CUDNN_LIBRARY");
        char *own = bigbatch_lines(r.err);
        cr_log_info("BB_CUDNN_LIBRARY=%s: %s", cases[i].library, own);
        cr_assert_eq(r.exit_code, 0, "%s", r.err);
        int warnings = 0;
        for (const char *at = own; (at = strstr(at, "bigbatch: warn: ")); at++) warnings++;
        cr_assert_eq(warnings, 1, "one warning for the process, not %d: %s", warnings, own);
        cr_assert(strstr(own, "attention runs on bigbatch's own kernels") && strstr(own, "cuDNN"), "%s", own);
        if (*cases[i].library || strstr(own, "loaded"))
            cr_assert_not_null(strstr(own, cases[i].why), "the reason (%s): %s", cases[i].why, own);
        free(own), tu_run_free(&r);
    }
    /* the banner names the engine that runs; asked for by name, cuDNN's absence fails the run at once */
    tu_run r = tu_bigbatch("train", "--data", tokens, "--devices", "cuda:0", "--layers", "2", "--heads", "2",
                           "--d-model", "16", "--global-batch", "4", "--micro-batch", "4", "--steps", "1", "--precision", "bf16");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert_not_null(strstr(r.err, "attention: bigbatch's kernels"), "%s", r.err);
    cr_assert_not_null(strstr(r.err, "products: cuBLASLt bf16 (bias, GELU and bias-gradient epilogues)"), "%s", r.err);
    tu_run_free(&r);
    r = tu_bigbatch("train", "--data", tokens, "--devices", "cuda:0", "--layers", "2", "--heads", "2", "--d-model",
                    "16", "--global-batch", "4", "--micro-batch", "4", "--steps", "1", "--precision", "bf16", "--attention", "cudnn");
    tu_assert_error(&r, "--attention cudnn", "cuDNN");
    tu_run_free(&r);
    free(tokens);
}

/* A driver older than the runtime (as CUDA 13 on an R570 driver) is one
 * line naming both versions and the driver needed, not "no GPU". */
Test(cuda_train, a_driver_older_than_the_runtime_names_both_versions)
{
    need_emulator("a driver too old");
    char *tokens = make_tokens("tokens", 200);
    setenv("BB_CUDA_EMU_DRIVER", "12080", 1);
    tu_run r = tu_bigbatch("train", "--data", tokens, "--devices", "cuda:0", "--layers", "2", "--heads", "2",
                           "--d-model", "16", "--global-batch", "4", "--steps", "1");
    unsetenv("BB_CUDA_EMU_DRIVER");
    tu_assert_error(&r, "the NVIDIA driver supports CUDA 12.8, older than this program's CUDA runtime 13.0",
                    "R580 or later");
    tu_run_free(&r);
    free(tokens);
}

Test(cuda_train, bench_model_and_plan_run_on_gpus)
{
    need_gpus(2);
    char *tokens = make_tokens("tokens", 200);
    tu_run b = tu_bigbatch("bench", "model", "--devices", "cuda:0", "--layers", "2", "--heads", "2", "--d-model", "32",
                           "--seq-len", "32", "--vocab", "64", "--micro-batch", "4", "--steps", "2", "--json");
    cr_assert_eq(b.exit_code, 0, "%s", b.err);
    cr_assert(strstr(b.out, "\"tokens_per_s\"") && strstr(b.out, "\"first_loss\""), "%s", b.out);
    tu_run p = tu_bigbatch("plan", "--data", tokens, "--devices", "cuda:0,1", "--layers", "2", "--heads", "2",
                           "--d-model", "16", "--global-batch", "16", "--device-mem", "1GiB");
    cr_assert_eq(p.exit_code, 0, "%s", p.err);
    cr_assert(strlen(p.out) > 0);
    cr_log_info("%s%s", b.out, p.out);
    tu_run_free(&b), tu_run_free(&p);
    /* --calibrate on a GPU also measures its link to pinned host memory, which then prices offloaded blocks */
    char *cache = tu_path(tmp, "gpu-cache"), *made = tu_path(cache, "calibration-cuda.json");
    setenv("BB_CACHE_DIR", cache, 1);
    p = tu_bigbatch("plan", "--data", tokens, "--devices", "cuda:0", "--layers", "2", "--heads", "2", "--d-model", "16",
                    "--global-batch", "8", "--device-mem", "1GiB", "--calibrate");
    unsetenv("BB_CACHE_DIR");
    cr_assert_eq(p.exit_code, 0, "%s", p.err);
    json_t *cal = json_load_file(made, 0, NULL);
    cr_assert_not_null(cal, "%s: no calibration", made);
    double link = json_number_value(json_object_get(cal, "link_gb_per_s"));
    cr_assert_gt(link, 0, "the link was not measured");
    cr_assert(strstr(p.out, "offloaded blocks (o): their copies priced at") && strstr(p.out, "measured by plan"),
              "%s", p.out);
    cr_log_info("the emulated GPU's link: %.2f GB/s", link);
    json_decref(cal), tu_run_free(&p);
    free(cache), free(made), free(tokens);
}

/* `sample --devices cuda:0`: decoding with the key/value cache on a GPU
 * gives the CPU's greedy tokens (a model trained a few steps, so that the
 * path moves). */
/* The gpt, and a llama whose 4 heads share 2 key/value heads (RoPE at each
 * position, the cache kv-heads wide). */
Test(cuda_train, greedy_sample_on_a_gpu_is_the_cpu_s)
{
    need_gpus(1);
    char *data = make_tokens("tokens", 200), *ck = tu_path(tmp, "ck");
    for (int llama = 0; llama < 2; llama++) {
        tu_run r = tu_bigbatch("train", "--data", data, "--model", llama ? "llama" : "gpt", "--layers", "2",
                               "--d-model", "32", "--heads", llama ? "4" : "2", "--global-batch", "16", "--micro-batch", "8",
                               "--steps", "20", "--lr", "1e-2", "--save", ck, "--quiet", "--force",
                               llama ? "--kv-heads=2" : "--loss-chunk=0");
        cr_assert_eq(r.exit_code, 0, "%s", r.err);
        tu_run_free(&r);
        tu_run c = tu_bigbatch("sample", "--ckpt", ck, "--temperature", "0", "--tokens", "40", "--ids"),
               g = tu_bigbatch("sample", "--ckpt", ck, "--temperature", "0", "--tokens", "40", "--ids", "--devices",
                               "cuda:0");
        cr_assert_eq(c.exit_code, 0, "%s", c.err);
        cr_assert_eq(g.exit_code, 0, "%s", g.err);
        cr_assert_str_eq(g.out, c.out, "%s: cuda:0 %s, cpu %s", llama ? "llama" : "gpt", g.out, c.out);
        cr_log_info("%s: 40 greedy tokens, the same on cuda:0 and the CPU: %.60s", llama ? "llama" : "gpt", g.out);
        tu_run_free(&c), tu_run_free(&g);
    }
    free(data), free(ck);
}

/* Decoding on a GPU waits for it once a token (its logits' read-back) and,
 * from the second token on, launches one graph a token for all its kernels
 * (none one by one), with the same ids as BB_CUDA_GRAPHS=off: the
 * emulator's counters at exit, for 4 and 12 sampled tokens (within the
 * context of 16: no position decoded twice). */
Test(cuda_train, decoding_waits_for_the_gpu_once_a_token_and_launches_one_graph)
{
    need_gpus(1);
    need_emulator("counting the host's waits and the graphs");
    char *data = make_tokens("tokens", 200), *ck = tu_path(tmp, "ck-decode");
    tu_run r = tu_bigbatch("train", "--data", data, "--layers", "2", "--d-model", "32", "--heads", "2", "--global-batch",
                           "8", "--steps", "2", "--save", ck, "--quiet");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    enum { SYNCS, LAUNCHES, CAPTURED, GRAPHS, GRAPH_KERNELS, COUNTERS };
    static const char *const names[COUNTERS] = {"host_syncs", "launches", "captured_launches", "graph_launches",
                                                "graph_kernels"};
    double n[3][COUNTERS];
    char *ids[3];
    char *tokens[3] = {"4", "12", "12"};
    for (int k = 0; k < 3; k++) { /* 4 tokens, 12, 12 without graphs */
        char *stats = tu_path(tmp, k == 0 ? "decode-4.json" : k == 1 ? "decode-12.json" : "decode-plain.json");
        setenv("BB_CUDA_EMU_STATS", stats, 1);
        if (k == 2) setenv("BB_CUDA_GRAPHS", "off", 1);
        r = tu_bigbatch("sample", "--ckpt", ck, "--temperature", "0", "--tokens", tokens[k], "--ids", "--devices",
                        "cuda:0");
        unsetenv("BB_CUDA_EMU_STATS"), unsetenv("BB_CUDA_GRAPHS");
        cr_assert_eq(r.exit_code, 0, "%s", r.err);
        cr_assert_null(strstr(r.err, "graphs off"), "%s", r.err);
        json_t *o = json_load_file(stats, 0, NULL);
        cr_assert_not_null(o, "%s: no counters", stats);
        for (int c = 0; c < COUNTERS; c++) n[k][c] = json_number_value(json_object_get(o, names[c]));
        ids[k] = strdup(r.out);
        cr_assert_not_null(ids[k]);
        json_decref(o), tu_run_free(&r), free(stats);
    }
    double per[COUNTERS];
    for (int c = 0; c < COUNTERS; c++) per[c] = (n[1][c] - n[0][c]) / 8;
    cr_log_info("a token: %.2f host waits, %.2f graph launches of %.1f kernels, %.2f kernels launched one by one "
                "(2 layers; without graphs %.1f)", per[SYNCS], per[GRAPHS], per[GRAPH_KERNELS],
                per[LAUNCHES] - per[CAPTURED], (n[2][LAUNCHES] - n[2][CAPTURED]) / 12);
    cr_assert_leq(per[SYNCS], 1.0, "%.2f host waits a token", per[SYNCS]);
    cr_assert_eq(per[GRAPHS], 1.0, "%.2f graph launches a token", per[GRAPHS]);
    cr_assert_eq(per[LAUNCHES] - per[CAPTURED], 0.0, "%.2f kernels a token launched one by one",
                 per[LAUNCHES] - per[CAPTURED]);
    cr_assert_eq(per[GRAPH_KERNELS], per[CAPTURED], "a graph runs the kernels it captured");
    cr_assert_gt(per[GRAPH_KERNELS], 10.0, "%.1f kernels in a token's graph", per[GRAPH_KERNELS]);
    cr_assert_eq(n[2][GRAPHS], 0, "BB_CUDA_GRAPHS=off still launched %.0f graphs", n[2][GRAPHS]);
    cr_assert_str_eq(ids[1], ids[2], "the ids with graphs and without differ");
    for (int k = 0; k < 3; k++) free(ids[k]);
    free(data), free(ck);
}
