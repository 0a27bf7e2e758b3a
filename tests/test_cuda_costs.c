/* test_cuda_costs.c — what a training step on a GPU costs the host and
 * how its work is queued, counted by the emulated GPUs of `make cuda-emu`
 * (tests/cuda_emu): host synchronizations, launches and copies per
 * micro-step and per step, the bf16 products' fused epilogues, and
 * ZeRO-3's gathers queued a block ahead of their use. Outside the emulator
 * the counting tests say skipped. */
#include <math.h>

#include <jansson.h>

#include "gpu_fixture.h"

TestSuite(cuda_costs, .init = fixture_setup, .fini = fixture_teardown);

/* ---- what a training step costs the host, on the emulator ------------------------ */
#ifdef BB_CUDA_EMU
typedef struct step_counts {
    double host_syncs, stream_syncs, event_syncs, blocking_calls, polls, launches, blas_calls, cub_calls;
    double h2d_bytes, h2d_copies, d2h_bytes, d2h_copies;
} step_counts;

/* The emulator's counters over one training run. */
static step_counts counts_of(const bb_train_options *o)
{
    bbemu_counters a, b;
    bbemu_counters_get(&a);
    bb_train_result r = train(o);
    bbemu_counters_get(&b);
    bb_train_result_free(&r);
    return (step_counts){(double)(b.host_syncs - a.host_syncs),     (double)(b.stream_syncs - a.stream_syncs),
                         (double)(b.event_syncs - a.event_syncs),   (double)(b.blocking_calls - a.blocking_calls),
                         (double)(b.polls - a.polls),               (double)(b.launches - a.launches),
                         (double)(b.blas_calls - a.blas_calls),     (double)(b.cub_calls - a.cub_calls),
                         (double)(b.h2d_bytes - a.h2d_bytes),       (double)(b.h2d_copies - a.h2d_copies),
                         (double)(b.d2h_bytes - a.d2h_bytes),       (double)(b.d2h_copies - a.d2h_copies)};
}

/* (x - k·y) / n, field by field. */
static step_counts counts_less(step_counts x, double k, step_counts y, double n)
{
    double *a = (double *)&x, *b = (double *)&y;
    for (size_t i = 0; i < sizeof x / sizeof(double); i++) a[i] = (a[i] - k * b[i]) / n;
    return x;
}

static void log_counts(const char *what, step_counts c)
{
    cr_log_info("%-34s host syncs %5.1f (stream %.1f, event %.1f, blocking %.1f, polls %.1f); launches %5.1f, "
                "cuBLAS %.1f, CUB %.1f; H2D %.0f bytes in %.1f copies, D2H %.0f bytes in %.1f copies",
                what, c.host_syncs, c.stream_syncs, c.event_syncs, c.blocking_calls, c.polls, c.launches, c.blas_calls,
                c.cub_calls, c.h2d_bytes, c.h2d_copies, c.d2h_bytes, c.d2h_copies);
}
#endif

/* The gpt's training step on one GPU, counted by the emulator: per
 * micro-step (the difference between 2 and 4 micro-steps a step) and per
 * step besides its micro-steps (between 3 and 4 steps), with the LM head
 * and loss in one chunk and in four, and with 2 layers and 4. Every
 * micro-step uploads exactly its raw records (one copy) and the figures
 * are whole numbers (every micro-step alike). The sync budget: at most 2
 * host synchronizations a micro-step and 4 a step besides, whatever the
 * layers and the chunks (before the loss was read once per micro-step:
 * one more per extra chunk). */
Test(cuda_costs, a_gpt_step_on_a_gpu_syncs_launches_and_copies_as_designed)
{
    need_gpus(1);
    need_emulator("counting the host's waits");
#ifdef BB_CUDA_EMU
    char *tokens = make_tokens("tokens", 400);
    enum { SHAPES = 3 };
    static const struct { int layers, chunk; const char *what; } shape[SHAPES] = {
        {2, 0, "per micro-step (B 4, T 16, 2 layers):"}, /* a micro-batch of 4 x 16 tokens: 1 chunk */
        {2, TOKENS_T, "per micro-step, 4 loss chunks:"},
        {4, TOKENS_T, "per micro-step, 4 layers, 4 chunks:"},
    };
    step_counts micro[SHAPES], own[SHAPES];
    for (int k = 0; k < SHAPES; k++) {
        bb_train_options o = gpt_options(tokens, 1, 4, 8); /* 2 micro-steps a step */
        on_gpus(&o, 1);
        o.model.gpt.layers = shape[k].layers;
        o.model.loss_chunk = shape[k].chunk;
        o.steps = 3;
        step_counts s3 = counts_of(&o);
        o.steps = 4;
        step_counts s4 = counts_of(&o);
        o.steps = 3, o.global_batch = 16; /* 4 micro-steps a step: 6 more in the run */
        step_counts m4 = counts_of(&o);
        micro[k] = counts_less(m4, 1, s3, 6);
        own[k] = counts_less(counts_less(s4, 1, s3, 1), 2, micro[k], 1); /* less its 2 micro-steps */
        log_counts(shape[k].what, micro[k]);
        log_counts("per step, besides its micro-steps:", own[k]);
        double *f = (double *)&micro[k];
        for (size_t i = 0; i < sizeof micro[0] / sizeof(double); i++)
            cr_assert_eq(f[i], floor(f[i]), "field %zu: micro-steps differ from one another (%.3f a micro-step)", i,
                         f[i]);
        cr_assert_eq(micro[k].h2d_bytes, 4.0 * 2 * (TOKENS_T + 1),
                     "a micro-step uploads its 4 records of %d bytes, no more", 2 * (TOKENS_T + 1));
        cr_assert_eq(micro[k].h2d_copies, 1, "in one copy");
        cr_assert_eq(own[k].h2d_bytes, 0, "a step uploads nothing but its micro-batches");
        cr_assert_leq(micro[k].host_syncs, 2, "%s %.0f host synchronizations", shape[k].what, micro[k].host_syncs);
        cr_assert_leq(own[k].host_syncs, 4, "host synchronizations a step, besides its micro-steps: %.0f",
                      own[k].host_syncs);
        cr_assert_eq(micro[k].host_syncs, micro[0].host_syncs, "%s host syncs depend on the shape", shape[k].what);
        cr_assert_eq(own[k].host_syncs, own[0].host_syncs, "a step's host syncs depend on the shape");
        cr_assert_eq(micro[k].d2h_copies, 1, "a micro-step reads back its loss alone");
    }
    /* 70 before the attention backward computed D = dout·out once per layer, in a kernel of its own */
    cr_assert_leq(micro[0].launches, 72, "kernel launches a micro-step: %.0f", micro[0].launches);
    free(tokens);
#endif
}

/* Under bf16 the products carry their biases, the MLP's GELU and its
 * gradient, and the bias gradients in cuBLASLt's epilogues: a step
 * launches no bias, GELU or column-sum kernel (checkpoint none: nothing
 * recomputed). With cuBLASLt finding no algorithm (BB_CUDA_EMU_LT=off)
 * the same training runs on plain products and kernels, after one
 * warning per epilogue, to the same losses within bf16's tolerance. */
Test(cuda_costs, a_bf16_step_runs_bias_gelu_and_bias_gradients_in_the_products_epilogues)
{
    need_gpus(1);
    need_emulator("counting kernels by name");
#ifdef BB_CUDA_EMU
    char *tokens = make_tokens("tokens", 200);
    bb_train_options o = gpt_options(tokens, 1, 4, 8);
    on_gpus(&o, 1);
    o.precision = BB_PRECISION_BF16, o.steps = 2;
    static const char *const separate[] = {"activation_forward_k", "activation_backward_k", "broadcast_rows_k",
                                           "column_partials_k"};
    uint64_t before[4], epilogues;
    for (int i = 0; i < 4; i++) before[i] = bbemu_kernel_launches(separate[i]);
    bbemu_counters a, b;
    bbemu_counters_get(&a);
    bb_train_result r = train(&o);
    bbemu_counters_get(&b);
    epilogues = b.lt_epilogues - a.lt_epilogues;
    int L = o.model.gpt.layers;
    cr_log_info("2 steps of 2 micro-steps, %d layers: %llu products with an epilogue", L,
                (unsigned long long)epilogues);
    /* a micro-step: 4 biased products forward and 4 bias gradients a layer, GELU's gradient once */
    cr_assert_geq(epilogues, 4 * 9ull * L, "%llu products with an epilogue", (unsigned long long)epilogues);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(bbemu_kernel_launches(separate[i]), before[i], "%s ran %llu times", separate[i],
                     (unsigned long long)(bbemu_kernel_launches(separate[i]) - before[i]));
    bb_train_result_free(&r);
    /* the fallback, in a process of its own (the emulator reads BB_CUDA_EMU_LT once) */
    char *metrics[2] = {tu_path(tmp, "lt-on.jsonl"), tu_path(tmp, "lt-off.jsonl")};
    tu_run run[2];
    for (int k = 0; k < 2; k++) {
        if (k) setenv("BB_CUDA_EMU_LT", "off", 1);
        run[k] = tu_bigbatch("train", "--data", tokens, "--devices", "cuda:0", "--layers", "2", "--heads", "2",
                             "--d-model", "16", "--global-batch", "8", "--micro-batch", "4", "--steps", "3",
                             "--precision", "bf16", "--metrics", metrics[k]);
        unsetenv("BB_CUDA_EMU_LT");
        cr_assert_eq(run[k].exit_code, 0, "%s", run[k].err);
    }
    cr_assert_null(strstr(run[0].err, "cuBLASLt has no"), "%s", run[0].err);
    cr_assert_not_null(strstr(run[1].err, "GELU epilogue"), "%s", run[1].err);
    cr_assert_not_null(strstr(run[1].err, "cuBLASLt has no bf16 product with the bias gradient epilogue"), "%s",
                       run[1].err);
    cr_assert_not_null(strstr(run[1].err, "products: cuBLASLt bf16"), "%s", run[1].err);
    double loss[2][3];
    for (int k = 0; k < 2; k++) {
        size_t size = 0;
        char *text = (char *)tu_read_file(metrics[k], &size), *line = text;
        int n = 0;
        for (char *end; n < 3 && (end = strchr(line, '\n')); line = end + 1) {
            *end = 0;
            json_t *row = json_loads(line, 0, NULL);
            json_t *l = row ? json_object_get(row, "loss") : NULL;
            if (l && json_object_get(row, "step")) loss[k][n++] = json_number_value(l);
            json_decref(row);
        }
        cr_assert_eq(n, 3, "%s: %d step rows", metrics[k], n);
        free(text);
    }
    for (int i = 0; i < 3; i++) {
        cr_log_info("step %d: loss %.6f with epilogues, %.6f without", i + 1, loss[0][i], loss[1][i]);
        cr_assert(fabs(loss[0][i] - loss[1][i]) <= 2e-2 * fabs(loss[0][i]), "step %d: %.6f with epilogues, %.6f without",
                  i + 1, loss[0][i], loss[1][i]);
    }
    tu_run_free(&run[0]), tu_run_free(&run[1]);
    free(metrics[0]), free(metrics[1]);
    free(tokens);
#endif
}

#ifdef BB_CUDA_EMU
/* --zero 3 on two GPUs: every layer's all-gather is queued at least a
 * block's work ahead of its use. The emulator logs each wait of the compute
 * stream for a collective with where the collective and the wait stand in
 * the device's program order (operations queued on its streams); the lead
 * of a gather is the work queued between. A block's work is measured in
 * the first forward, where the buckets (a block's size) are waited for a
 * block apart. Every gather leads by at least that, but the two of a step's
 * first pass gathered at its start (its first layer and the token table:
 * nothing runs before them to hide under); a bucket still in its slot from
 * the pass before is not gathered again. */
static int by_value(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static bool is_gather(const bbemu_collective_wait *w)
{
    return !strcmp(w->kind, "AllGather") || !strcmp(w->kind, "Broadcast");
}

Test(cuda_costs, zero3_gathers_are_queued_a_block_ahead_of_their_use)
{
    need_gpus(2);
    enum { LAYERS = 6 };
    char *tokens = make_tokens("tokens", 200);
    bb_train_options o = gpt_options(tokens, 2, 4, 16); /* 2 micro-steps a step on each GPU */
    o.model.gpt.layers = LAYERS;
    o.steps = 3, o.zero = 3;
    o.bucket_mib = 12.0 * 16 * 16 * 4 / (1 << 20); /* about a block of d_model 16 */
    on_gpus(&o, 2);
    bbemu_collective_waits_clear();
    bb_train_result g = train(&o);
    size_t n = bbemu_collective_waits(NULL, 0);
    bbemu_collective_wait *w = calloc(n ? n : 1, sizeof *w);
    cr_assert_not_null(w);
    bbemu_collective_waits(w, n);
    for (int d = 0; d < 2; d++) {
        /* a block's work: the median distance between the first forward's waits for its layers */
        uint64_t apart[LAYERS], at = 0;
        int k = 0, seen = 0;
        for (size_t i = 0; i < n && seen < LAYERS + 1; i++) {
            if (w[i].device != d || !is_gather(&w[i])) continue;
            if (++seen > 2) apart[k++] = w[i].waited_at - at; /* after the token table's and the first layer's */
            at = w[i].waited_at;
        }
        cr_assert_eq(k, LAYERS - 1, "cuda:%d: the first forward waited for %d gathers", d, seen);
        qsort(apart, (size_t)k, sizeof *apart, by_value);
        uint64_t block = apart[k / 2], least = UINT64_MAX;
        int gathers = 0, short_lead = 0;
        for (size_t i = 0; i < n; i++) {
            if (w[i].device != d || !is_gather(&w[i])) continue;
            uint64_t lead = w[i].waited_at - w[i].issued_at;
            gathers++;
            if (lead < block) short_lead++;
            else least = lead < least ? lead : least;
        }
        cr_log_info("cuda:%d: %d gathers waited for in %llu steps; a block's work %llu operations; all but %d led by "
                    "at least %llu", d, gathers, (unsigned long long)o.steps, (unsigned long long)block, short_lead,
                    (unsigned long long)least);
        cr_assert_gt(gathers, (int)o.steps * LAYERS, "cuda:%d: %d gathers", d, gathers);
        cr_assert_leq(short_lead, 2 * (int)o.steps, "cuda:%d: %d gathers queued less than a block's work (%llu "
                      "operations) before their use", d, short_lead, (unsigned long long)block);
    }
    free(w);
    bb_train_result_free(&g);
    free(tokens);
}
#endif
