/* test_zero.c — ZeRO-2 and ZeRO-3 (--zero 2, 3) on CPU devices: ZeRO-2
 * trains what --zero 0 and --zero 1 train (bitwise with one micro-step a step, within 1e-6 over
 * accumulated micro-steps, whose sums it adds in another order), ZeRO-3
 * what ZeRO-2 trains (bitwise: it gathers the very weights), each
 * device's peak is the planner's to the byte and holds the shard's
 * gradients and a few buckets instead of all, checkpoints resume across
 * stages and device counts, and the stages that cannot run say so.
 * Helpers: train_fixture.h. */
#include "bigbatch/plan.h"
#include "train_fixture.h"

TestSuite(zero, .init = fixture_setup, .fini = fixture_teardown);

#define BUCKET_MIB 0.004 /* several buckets, so that every device owns a slice of each and the window cycles */

static bb_train_options staged(bb_train_options o, int zero)
{
    o.steps = 8;
    o.val_data = o.data; /* an evaluation at the end */
    o.opt.grad_clip = 0.5; /* the norm matters: clipping on */
    o.bucket_mib = BUCKET_MIB;
    o.zero = zero;
    return o;
}

static bool same_bits(const bb_train_result *a, const bb_train_result *b)
{
    return a->steps_done == b->steps_done && a->param_count == b->param_count &&
           !memcmp(a->losses, b->losses, (a->steps_done - a->first_step) * sizeof *a->losses) &&
           !memcmp(a->params, b->params, a->param_count * sizeof *a->params);
}

/* The model's shape as the run had it (from the data), for the planner. */
static bb_model_config shaped(const bb_train_options *o)
{
    bb_dataset_t *ds;
    cr_assert_eq(bb_dataset_open(o->data, &ds), BB_OK, "%s", bb_error_message());
    bb_model_config c = o->model;
    cr_assert_eq(bb_model_config_from_data(&c, bb_dataset_format(ds), o->data), BB_OK);
    bb_dataset_close(ds);
    return c;
}

static uint64_t planned_peak(const bb_train_options *o, int stage)
{
    bb_model_config c = shaped(o);
    c.precision = o->precision;
    bb_plan_zero z = {stage, o->devices, bb_bucket_bytes(o->bucket_mib), o->zero_shards};
    bb_memory_breakdown m;
    cr_assert_eq(bb_plan_memory_sharded(&c, o->micro_batch, o->opt.kind, BB_DEVICE_CPU, &z, &m), BB_OK, "%s",
                 bb_error_message());
    return m.total;
}

static uint64_t largest_peak(const bb_train_result *r)
{
    uint64_t most = 0;
    for (int d = 0; d < r->devices; d++) most = r->peak_bytes[d] > most ? r->peak_bytes[d] : most;
    return most;
}

/* One case: --zero 0, 1, 2 and 3 on the same options. One micro-step a
 * step: all four bitwise the same. Accumulated: ZeRO-2 and -3 add the
 * devices' sums of each micro-step, the others each device's micro-steps
 * first, so within 1e-6; ZeRO-3 is ZeRO-2 bitwise either way (it gathers
 * the very weights), the evaluation at the end included. ZeRO-2's and
 * ZeRO-3's largest peaks: the planner's to the byte (these models are too
 * small for the windows to save much; the formula test weighs GPT-2 and a
 * 1B shape). */
static void stages_case(const char *what, bb_train_options o)
{
    bb_train_result r[4];
    for (int z = 0; z < 4; z++) {
        bb_train_options oz = staged(o, z);
        r[z] = train(&oz);
    }
    bool one_micro = o.global_batch == o.devices * o.micro_batch;
    cr_assert(same_bits(&r[0], &r[1]), "%s: --zero 1 differs from --zero 0", what);
    if (one_micro && !same_bits(&r[0], &r[2])) {
        for (uint64_t k = 0; k < r[0].steps_done; k++) cr_log_info("step %llu: %.17g %.17g", (unsigned long long)k, r[0].losses[k], r[2].losses[k]);
        for (size_t i = 0, n = 0; i < r[0].param_count && n < 10; i++) if (r[0].params[i] != r[2].params[i]) { n++; cr_log_info("param %zu: %.9g %.9g", i, r[0].params[i], r[2].params[i]); }
    }
    if (one_micro) {
        cr_assert(same_bits(&r[0], &r[2]), "%s: --zero 2 differs from --zero 0 (one micro-step a step)", what);
    } else {
        for (uint64_t s = 0; s < r[0].steps_done; s++) {
            double rel = fabs(r[2].losses[s] - r[0].losses[s]) / fabs(r[0].losses[s]);
            cr_assert(rel <= 1e-6, "%s: step %llu loss %.9g vs %.9g", what, (unsigned long long)s + 1, r[2].losses[s],
                      r[0].losses[s]);
        }
        double d = relative_distance(r[0].params, r[2].params, r[0].param_count);
        cr_assert(d <= 1e-6, "%s: --zero 2's parameters differ by %.2e", what, d);
    }
    /* ZeRO-3 reduces as ZeRO-2 does and gathers the very weights: its bits,
     * also in the evaluation at the end (from the weights gathered on the host) */
    cr_assert(same_bits(&r[2], &r[3]), "%s: --zero 3 differs from --zero 2", what);
    cr_assert(r[2].val_loss == r[3].val_loss, "%s: --zero 3 evaluates to %.9g, --zero 2 to %.9g", what,
              r[3].val_loss, r[2].val_loss);
    for (int z = 2; z < 4; z++) {
        bb_train_options oz = staged(o, z);
        uint64_t planned = planned_peak(&oz, z), peak = largest_peak(&r[z]);
        cr_assert_eq(peak, planned, "%s: --zero %d's largest peak %llu, planned %llu", what, z,
                     (unsigned long long)peak, (unsigned long long)planned);
    }
    uint64_t whole = r[1].param_count * sizeof(float);
    cr_log_info("%s: %s, --zero 3 bitwise --zero 2; peaks %llu and %llu bytes (--zero 1: %llu; weights %llu), the "
                "planner's", what, one_micro ? "stages 0-2 bitwise" : "--zero 2 within 1e-6",
                (unsigned long long)largest_peak(&r[2]), (unsigned long long)largest_peak(&r[3]),
                (unsigned long long)largest_peak(&r[1]), (unsigned long long)whole);
    for (int z = 0; z < 4; z++) bb_train_result_free(&r[z]);
}

Test(zero, zero2_and_3_train_what_zero0_and_zero1_train_with_the_planned_peak)
{
    char *tokens = make_tokens("tokens", 170), *images = make_images("images", 1300, 1);
    stages_case("gpt, 2 devices", gpt_options(tokens, 2, 16, 32));
    stages_case("gpt, 4 devices", gpt_options(tokens, 4, 8, 32));
    stages_case("gpt, 2 devices x 4 micro-steps", gpt_options(tokens, 2, 4, 32));
    stages_case("gpt, 4 devices x 2 micro-steps", gpt_options(tokens, 4, 4, 32));
    stages_case("llama, 2 devices", llama_options(tokens, 2, 16, 32));
    stages_case("llama, 2 devices x 2 micro-steps", llama_options(tokens, 2, 8, 32));
    stages_case("mlp, 4 devices", mlp_options(images, 4, 16, 64));
    stages_case("mlp, 2 devices x 2 micro-steps", mlp_options(images, 2, 16, 64));
    bb_train_options o = gpt_options(tokens, 2, 16, 32);
    o.precision = BB_PRECISION_BF16;
    stages_case("gpt bf16, 2 devices", o);
    o = gpt_options(tokens, 2, 8, 32);
    o.opt.kind = BB_OPTIMIZER_SGD;
    stages_case("gpt sgd, 2 devices x 2 micro-steps", o);
    o = gpt_options(tokens, 4, 8, 32);
    o.zero_shards = BB_PARAM_SHARD_TENSORS;
    stages_case("gpt, 4 devices, whole tensors", o);
    free(tokens), free(images);
}

/* Ten steps of `o`, and the same saved under --zero 1 at step 5 and
 * resumed under --zero 0 and 3: bitwise the run that never stopped. */
static void resumes_across_stages(bb_train_options o, const char *what)
{
    o.steps = 10;
    bb_train_result straight = train(&o);
    for (int resumed = 0; resumed <= 3; resumed += 3) {
        char name[32];
        snprintf(name, sizeof name, "%s%d", what, resumed);
        char *ckpt = tu_path(tmp, name);
        bb_train_options s = o;
        s.zero = 1, s.save_dir = ckpt, s.stop_after = 5;
        bb_train_result first = train(&s);
        bb_train_options r = o;
        r.zero = resumed, r.resume_dir = ckpt;
        bb_train_result second = train(&r);
        cr_assert_eq(second.first_step, 5);
        cr_assert_eq(memcmp(straight.params, second.params, straight.param_count * sizeof(float)), 0,
                     "%s saved under --zero 1, resumed under --zero %d: not bitwise the run that never stopped", what,
                     resumed);
        bb_train_result_free(&first), bb_train_result_free(&second);
        free(ckpt);
    }
    bb_train_result_free(&straight);
}

/* The layer-wise optimizers (whole-tensor shards: their trust ratios need
 * whole tensors) at every stage, and a run saved under --zero 1 resumes
 * under --zero 0 and --zero 3 as the run that never stopped, bitwise; a
 * cut of tensors is refused. */
Test(zero, lamb_and_lars_train_the_same_bits_at_every_stage_and_resume_bitwise)
{
    char *tokens = make_tokens("tokens", 170), *images = make_images("images", 1300, 1);
    bb_train_options o = gpt_options(tokens, 2, 16, 32);
    o.opt = bb_optimizer_defaults_for(BB_OPTIMIZER_LAMB), o.opt.weight_decay = 0.01;
    stages_case("gpt lamb, 2 devices", o);
    bb_train_options lars = mlp_options(images, 2, 16, 64);
    lars.opt = bb_optimizer_defaults_for(BB_OPTIMIZER_LARS), lars.opt.lr = 0.5, lars.opt.weight_decay = 1e-4;
    stages_case("mlp lars, 2 devices x 2 micro-steps", lars);
    o = staged(o, 0);
    resumes_across_stages(o, "lamb");
    o.zero = 1, o.zero_shards = BB_PARAM_SHARD_ELEMENTS;
    bb_train_result refused;
    cr_assert_eq(bb_train_run(&o, &refused), BB_ERR_ARG);
    cr_assert(strstr(bb_error_message(), "and LAMB's step needs each whole"), "%s", bb_error_message());
    free(tokens), free(images);
}

/* Muon (whole hidden matrices, AdamW elsewhere) at every stage — the gpt,
 * the llama with accumulation, the mlp, and offloaded (its iteration on
 * the host) — and a run saved under --zero 1 resumes under --zero 3 and
 * --zero 0 as the run that never stopped, bitwise. */
Test(zero, muon_trains_the_same_bits_at_every_stage_offloaded_too_and_resumes_bitwise)
{
    char *tokens = make_tokens("tokens", 170), *images = make_images("images", 1300, 1);
    bb_train_options o = gpt_options(tokens, 2, 16, 32);
    o.opt = bb_optimizer_defaults_for(BB_OPTIMIZER_MUON), o.opt.lr = 3e-3, o.opt.weight_decay = 0.01;
    stages_case("gpt muon, 2 devices", o);
    bb_train_options llama = llama_options(tokens, 2, 8, 32);
    llama.opt = o.opt;
    stages_case("llama muon, 2 devices x 2 micro-steps", llama);
    bb_train_options mlp = mlp_options(images, 2, 16, 64);
    mlp.opt = o.opt;
    stages_case("mlp muon, 2 devices x 2 micro-steps", mlp);
    for (int z = 1; z <= 3; z += 2) {
        bb_train_options on_device = staged(llama, z), offloaded = on_device;
        offloaded.offload = BB_OFFLOAD_OPTIMIZER;
        bb_train_result a = train(&on_device), b = train(&offloaded);
        cr_assert(same_bits(&a, &b), "muon --zero %d --offload optimizer differs from --zero %d", z, z);
        bb_train_result_free(&a), bb_train_result_free(&b);
    }
    resumes_across_stages(staged(o, 0), "muon");
    free(tokens), free(images);
}

/* Every recompute plan writes the gradients in the order the window
 * follows: bitwise the same as --zero 0. */
Test(zero, zero2_and_3_under_every_checkpoint_policy)
{
    char *tokens = make_tokens("tokens", 170);
    const char *policies[] = {"blocks", "selective", "plan:f,s"};
    for (int i = 0; i < 3; i++) {
        bb_train_options o = gpt_options(tokens, 2, 16, 32);
        cr_assert_eq(bb_model_parse_recompute(policies[i], &o.model), BB_OK);
        char what[64];
        snprintf(what, sizeof what, "gpt --checkpoint %s", policies[i]);
        stages_case(what, o);
    }
    free(tokens);
}

/* optimizer.bin and model.safetensors are one format: saved under --zero 2
 * or 3 they resume under --zero 0 on another device count, and the other
 * way round, as a run that never stopped; --init-from works under --zero 3
 * as under --zero 0. */
Test(zero, checkpoints_resume_across_stages_and_device_counts)
{
    char *data = make_tokens("tokens", 100);
    bb_train_options o = staged(gpt_options(data, 2, 16, 32), 0);
    o.steps = 10;
    bb_train_result whole = train(&o);
    /* saved: zero, devices; resumed: zero, devices */
    const int cases[][4] = {{2, 2, 0, 4}, {0, 4, 2, 2}, {2, 4, 2, 2}, {2, 2, 1, 2}, {3, 2, 0, 4}, {0, 4, 3, 2}, {3, 2, 2, 2}};
    for (int i = 0; i < (int)(sizeof cases / sizeof *cases); i++) {
        char name[32];
        snprintf(name, sizeof name, "ckpt%d", i);
        char *ckpt = tu_path(tmp, name);
        bb_train_options s = staged(gpt_options(data, cases[i][1], 32 / cases[i][1], 32), cases[i][0]);
        s.steps = 10, s.save_dir = ckpt, s.stop_after = 5;
        bb_train_result first = train(&s);
        bb_train_options r = staged(gpt_options(data, cases[i][3], 32 / cases[i][3], 32), cases[i][2]);
        r.steps = 10, r.resume_dir = ckpt;
        r.set = BB_TRAIN_SET(BB_TRAIN_DEVICES) | BB_TRAIN_SET(BB_TRAIN_MICRO_BATCH);
        bb_train_result second = train(&r);
        cr_assert_eq(second.first_step, 5);
        for (int k = 5; k < 10; k++) {
            double rel = fabs(second.losses[k - 5] - whole.losses[k]) / whole.losses[k];
            cr_assert(rel <= 1e-5, "saved zero %d on %d, resumed zero %d on %d: step %d loss %.9g vs %.9g",
                      cases[i][0], cases[i][1], cases[i][2], cases[i][3], k + 1, second.losses[k - 5], whole.losses[k]);
        }
        double d = relative_distance(whole.params, second.params, whole.param_count);
        cr_assert(d <= 1e-5, "saved zero %d on %d, resumed zero %d on %d: parameters differ by %.2e", cases[i][0],
                  cases[i][1], cases[i][2], cases[i][3], d);
        /* on the same devices a resume is bitwise (the same sums in the same order) */
        if (cases[i][1] == cases[i][3]) {
            bb_train_options again = staged(gpt_options(data, cases[i][3], 32 / cases[i][3], 32), cases[i][2]);
            again.steps = 10;
            bb_train_result straight = train(&again);
            cr_assert_eq(memcmp(straight.params, second.params, whole.param_count * sizeof(float)), 0,
                         "saved zero %d, resumed zero %d on %d devices: not bitwise the run that never stopped",
                         cases[i][0], cases[i][2], cases[i][3]);
            bb_train_result_free(&straight);
        }
        bb_train_result_free(&first), bb_train_result_free(&second);
        free(ckpt);
    }
    /* --init-from under ZeRO-3 (read into the host buffer the optimizers take their shards from) */
    char *weights = tu_path(tmp, "ckpt0/latest/model.safetensors");
    bb_train_options a = staged(gpt_options(data, 2, 16, 32), 0), b = staged(gpt_options(data, 2, 16, 32), 3);
    a.init_from = b.init_from = weights;
    a.steps = b.steps = 3;
    bb_train_result ra = train(&a), rb = train(&b);
    cr_assert(same_bits(&ra, &rb), "--init-from: --zero 3 differs from --zero 0");
    bb_train_result_free(&ra), bb_train_result_free(&rb);
    free(weights);
    bb_train_result_free(&whole);
    free(data);
}

/* What cannot help or cannot run says so, before anything trains. */
Test(zero, stages_that_cannot_help_or_run_say_so)
{
    char *data = make_tokens("tokens", 100);
    struct {
        int devices;
        bool no_overlap;
        int zero;
        const char *says;
    } cases[] = {{1, false, 2, "nothing to shard"}, {2, true, 2, "cannot run with"}, {1, false, 3, "nothing to shard"},
                 {2, true, 3, "cannot run with"}, {2, false, 5, "0 (none), 1"}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        bb_train_options o = staged(gpt_options(data, cases[i].devices, 8, 32), cases[i].zero);
        o.no_overlap = cases[i].no_overlap;
        bb_train_result r;
        cr_assert_eq(bb_train_run(&o, &r), BB_ERR_ARG, "case %zu ran", i);
        cr_assert(strstr(bb_error_message(), cases[i].says), "case %zu: %s", i, bb_error_message());
    }
    bb_plan_request q = {.model = gpt_options(data, 1, 8, 32).model, .devices = 1, .global_batch = 32, .zero = 2};
    q.model = shaped(&(bb_train_options){.model = q.model, .data = data});
    bb_plan p;
    for (q.zero = 2; q.zero <= 3; q.zero++) {
        cr_assert_eq(bb_plan_make(&q, &p), BB_ERR_ARG);
        cr_assert(strstr(bb_error_message(), "saves nothing"), "%s", bb_error_message());
    }
    free(data);
}

/* ---- the formulas ---------------------------------------------------------
 * Per device, weights w (4 bytes a parameter; bf16: and their 2-byte copy),
 * gradients 4 and AdamW's state 8 bytes a parameter: --zero 0 keeps
 * w + 12Ψ, --zero 1 w + 4Ψ + 8Ψ/N, --zero 2 w + 12Ψ/N + its window (the
 * last bucket's slot, the token table's, and three of the others'; counted
 * here from the buckets themselves), --zero 3 16Ψ/N (fp32 master weights,
 * gradients and state of the shard) + the gradient window + the weight
 * window (its ring's slots, fp32 and bf16's copy). The planner's parameters, gradients
 * and state on the counting backend equal these to the padding of the
 * largest shard (under a float per bucket per device). The ZeRO paper's
 * (mixed precision: 2-byte weights and gradients, 12 bytes of fp32 master
 * weights and moments) are logged beside them. */
/* The floats of a window of `ring` slots (slot j as wide as the widest
 * bucket b = j mod ring) and the last bucket's slot. */
static uint64_t window_floats(const bb_model_t *m, size_t bucket_bytes, int ring)
{
    bb_buckets b;
    cr_assert_eq(bb_buckets_make(m, bucket_bytes, &b), BB_OK);
    size_t width[64] = {0}, floats = b.hi[b.count - 1] - b.lo[b.count - 1];
    cr_assert(ring <= 64);
    for (int k = 0; k < b.count - 1; k++)
        if (b.hi[k] - b.lo[k] > width[k % ring]) width[k % ring] = b.hi[k] - b.lo[k];
    for (int j = 0; j < ring; j++) floats += width[j];
    bb_buckets_free(&b);
    return floats;
}

/* ZeRO-2's gradient window in bytes, and ZeRO-3's weight window (its ring
 * as the model says; fp32, and bf16's copy beside it). */
static void window_bytes(const bb_model_config *c, size_t bucket_bytes, uint64_t *grads, uint64_t *weights)
{
    bb_backend_t *be;
    bb_model_t *m;
    bb_model_config z3 = *c;
    z3.param_window_bytes = bucket_bytes;
    cr_assert_eq(bb_backend_create_counting(BB_DEVICE_CPU, NULL, &be), BB_OK);
    cr_assert_eq(bb_model_create(be, &z3, 1, &m), BB_OK, "%s", bb_error_message());
    *grads = window_floats(m, bucket_bytes, BB_GRAD_WINDOW_RING) * sizeof(float);
    *weights = window_floats(m, bucket_bytes, bb_model_param_window_ring(m)) *
               (sizeof(float) + (c->precision == BB_PRECISION_BF16 ? 2 : 0));
    bb_buckets b;
    char what[160];
    bb_model_describe(c, what, sizeof what);
    cr_assert_eq(bb_buckets_make(m, bucket_bytes, &b), BB_OK);
    cr_log_info("%s: %d buckets; ZeRO-3's ring of %d slots and the token table's, %.0f MiB", what, b.count,
                bb_model_param_window_ring(m), (double)*weights / 1048576.0);
    bb_buckets_free(&b);
    bb_model_destroy(m);
    bb_backend_destroy(be);
}

Test(zero, the_planner_s_peaks_follow_the_zero_formulas_for_gpt2_and_a_1b_llama)
{
    bb_model_config gpt2 = bb_model_gpt_config(12, 12, 768, 1024, 50257), gpt2_bf16 = gpt2, llama = {0};
    gpt2_bf16.precision = BB_PRECISION_BF16;
    llama = bb_model_llama_config(1, 1, 1, 1024, 128256);
    cr_assert(bb_llama_preset("llama-3.2-1b", &llama.llama));
    llama.llama.seq_len = 1024, llama.precision = BB_PRECISION_BF16;
    const struct {
        const char *name;
        bb_model_config *c;
    } models[] = {{"GPT-2 124M", &gpt2}, {"GPT-2 124M bf16", &gpt2_bf16}, {"Llama-3.2-1B bf16", &llama}};
    const int N = 8;
    size_t bucket = bb_bucket_bytes(0);
    for (size_t i = 0; i < sizeof models / sizeof *models; i++) {
        bb_model_config c = *models[i].c;
        cr_assert_eq(bb_model_parse_recompute("blocks", &c), BB_OK);
        uint64_t window, pwindow;
        window_bytes(&c, bucket, &window, &pwindow);
        double psi = 0, w = 0;
        for (int stage = 0; stage <= 3; stage++) {
            bb_plan_zero z = {stage, N, bucket, BB_PARAM_SHARD_AUTO};
            bb_memory_breakdown m;
            cr_assert_eq(bb_plan_memory_sharded(&c, 1, BB_OPTIMIZER_ADAMW, BB_DEVICE_CPU, &z, &m), BB_OK, "%s",
                         bb_error_message());
            if (stage == 0) psi = m.gradients / 4.0, w = (double)m.parameters;
            double states = (double)(m.parameters + m.gradients + m.optimizer);
            double want = stage == 0   ? w + 12 * psi
                          : stage == 1 ? w + 4 * psi + 8 * psi / N
                          : stage == 2 ? w + 12 * psi / N + window
                                       : 16 * psi / N + window + pwindow;
            double zero_paper = stage == 0   ? 16 * psi
                                : stage == 1 ? 4 * psi + 12 * psi / N
                                : stage == 2 ? 2 * psi + 14 * psi / N
                                             : 16 * psi / N;
            cr_assert(states >= want && states - want <= 64.0 * 16 * 4 * N, "%s, --zero %d: %.0f bytes, the formula "
                      "%.0f", models[i].name, stage, states, want);
            cr_log_info("%s on %d devices, --zero %d: weights, gradients and state %.2f GiB per device = %.2f "
                        "bytes a parameter (the formula's%s; the ZeRO paper's mixed precision: %.2f GiB); peak with "
                        "micro-batch 1 and --checkpoint blocks %.2f GiB", models[i].name, N, stage, states / 1073741824.0,
                        states / psi, stage == 2 ? ", window included" : stage == 3 ? ", both windows included" : "", zero_paper / 1073741824.0,
                        m.total / 1073741824.0);
        }
    }
}

/* --zero auto: the planner's lowest stage at which a candidate fits, and
 * why each stage below did not; train runs at that stage. */
Test(zero, zero_auto_picks_the_lowest_stage_that_fits_and_says_why)
{
    char *data = make_tokens("tokens", 100);
    bb_train_options base = gpt_options(data, 4, 8, 64);
    base.model = bb_model_gpt_config(4, 4, 128, 0, 0);
    bb_model_config c = shaped(&base);
    c.gpt.seq_len = 256, c.gpt.vocab = 256; /* the default gpt's shape, too large for ZeRO-2's window to cost more than it saves */
    const struct {
        uint64_t mib;
        int devices, stage;
    } cases[] = {{64, 4, 0}, {12, 4, 1}, {11, 4, 2}, {11, 1, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        bb_plan_request q = {.model = c, .devices = cases[i].devices, .global_batch = 64,
                             .device_mem = cases[i].mib << 20, .zero = BB_ZERO_AUTO, .bucket_mib = 0.1};
        bb_plan p;
        cr_assert_eq(bb_plan_make(&q, &p), BB_OK, "%s", bb_error_message());
        bool fits = cases[i].devices > 1;
        cr_assert_eq(p.chosen >= 0, fits, "%llu MiB on %d devices", (unsigned long long)cases[i].mib, cases[i].devices);
        cr_assert_eq(p.zero, cases[i].stage, "%llu MiB on %d devices: --zero %d, not %d", (unsigned long long)cases[i].mib,
                     cases[i].devices, p.zero, cases[i].stage);
        for (int below = 0; fits && below < cases[i].stage; below++) {
            char said[32];
            snprintf(said, sizeof said, "--zero %d: ", below);
            cr_assert(strstr(p.why_zero, said), "%llu MiB: no word on %s in '%s'", (unsigned long long)cases[i].mib,
                      said, p.why_zero);
        }
        if (!fits) /* one device: no stage to suggest */
            cr_assert(!strstr(p.why_nothing_fits, "--zero"), "one device: %s", p.why_nothing_fits);
        cr_log_info("%llu MiB on %d device(s): --zero %d%s%s", (unsigned long long)cases[i].mib, cases[i].devices, p.zero,
                    p.why_zero[0] ? ": " : "", p.why_zero);
        bb_plan_free(&p);
    }
    /* train: the tiny gpt, 20 MiB less what --zero 1 saves: the planner's stage 1, and its peak */
    bb_train_options o = staged(gpt_options(data, 2, 16, 32), BB_ZERO_AUTO);
    o.model.loss_chunk = 64; /* else the chunk follows --device-mem */
    bb_model_config tiny = shaped(&o);
    bb_plan_zero z0 = {0, 2, bb_bucket_bytes(o.bucket_mib), o.zero_shards}, z1 = z0;
    z1.stage = 1;
    bb_memory_breakdown m0, m1;
    cr_assert_eq(bb_plan_memory_sharded(&tiny, 16, o.opt.kind, BB_DEVICE_CPU, &z0, &m0), BB_OK);
    cr_assert_eq(bb_plan_memory_sharded(&tiny, 16, o.opt.kind, BB_DEVICE_CPU, &z1, &m1), BB_OK);
    o.device_mem = (uint64_t)((double)(m0.total + m1.total) / 2 / 0.95); /* stage 0 does not fit, stage 1 does */
    char *said = NULL;
    size_t len = 0;
    o.progress = open_memstream(&said, &len);
    bb_train_result r = train(&o);
    fclose(o.progress);
    cr_assert(strstr(said, "--zero 1 (the lowest stage that fits: --zero 0: nothing fits"), "%s", said);
    cr_assert_eq(largest_peak(&r), m1.total, "--zero auto's peak %llu, --zero 1's planned %llu",
                 (unsigned long long)largest_peak(&r), (unsigned long long)m1.total);
    bb_train_result_free(&r);
    free(said), free(data);
}

/* plan --largest: a model's shape family gives the model itself at its own
 * member; the largest member that fits has a plan and the next does not. */
Test(zero, largest_finds_the_widest_member_that_fits)
{
    bb_model_config gpt2 = bb_model_gpt_config(12, 12, 768, 1024, 50257), llama = bb_model_llama_config(1, 1, 1, 1024, 0),
                    m;
    cr_assert(bb_llama_preset("llama-3.2-1b", &llama.llama));
    llama.llama.seq_len = 1024;
    cr_assert_eq(bb_model_scaled(&gpt2, 12, &m), BB_OK);
    cr_assert(bb_model_same_shape(&m, &gpt2), "GPT-2's member 12 is GPT-2");
    cr_assert_eq(bb_model_scaled(&llama, 8, &m), BB_OK);
    cr_assert(bb_model_same_shape(&m, &llama), "Llama-3.2-1B's member 8 (key/value heads) is Llama-3.2-1B");
    cr_assert_eq(bb_model_scaled(&gpt2, 16, &m), BB_OK);
    cr_assert(m.gpt.d_model == 1024 && m.gpt.heads == 16 && m.gpt.layers == 16, "member 16: %d layers, d %d",
              m.gpt.layers, m.gpt.d_model);
    int hidden[] = {32};
    bb_model_config mlp = bb_model_mlp_config(8, hidden, 1, 4);
    cr_assert_eq(bb_model_scaled(&mlp, 2, &m), BB_ERR_UNSUPPORTED);
    for (int zero = 0; zero <= BB_ZERO_AUTO; zero += BB_ZERO_AUTO) {
        bb_plan_request q = {.model = bb_model_gpt_config(4, 4, 128, 256, 256), .devices = 4, .global_batch = 64,
                             .device_mem = 64 << 20, .zero = zero};
        bb_largest l;
        cr_assert_eq(bb_plan_largest(&q, &l), BB_OK, "%s", bb_error_message());
        cr_assert(l.plan.chosen >= 0 && l.member >= 1 && l.next_parameters > l.parameters);
        bb_plan_request next = q;
        cr_assert_eq(bb_model_scaled(&q.model, l.member + 1, &next.model), BB_OK);
        bb_plan p;
        cr_assert_eq(bb_plan_make(&next, &p), BB_OK);
        cr_assert(p.chosen < 0, "member %d fits too", l.member + 1);
        bb_plan_free(&p);
        char model[160];
        bb_model_describe(&l.model, model, sizeof model);
        cr_log_info("--zero %s, 4 devices of 64 MiB: %s (%.2fM parameters; --zero %d), the next does not: %s",
                    zero ? "auto" : "0", model, l.parameters / 1e6, l.plan.zero, l.why_next);
        bb_largest_free(&l);
    }
    bb_plan_request none = {.model = gpt2, .devices = 1, .global_batch = 8};
    bb_largest l;
    cr_assert_eq(bb_plan_largest(&none, &l), BB_ERR_ARG, "without --device-mem everything fits");
}

/* --offload optimizer at every stage: the same bits as on the device (the
 * same element-wise step, on the host's backend), a peak without the state
 * that the planner predicts to the byte, its host bytes the state, master
 * weights and gradients' staging; a checkpoint resumes with or without it;
 * too little --host-mem is one line naming what was needed. */
Test(zero, offload_trains_the_same_bits_without_the_state_on_the_device)
{
    char *tokens = make_tokens("tokens", 170);
    for (int z = 0; z <= 3; z++) {
        bb_train_options o = staged(gpt_options(tokens, 2, 8, 32), z); /* 2 micro-steps a step */
        bb_train_result on_device = train(&o);
        o.offload = BB_OFFLOAD_OPTIMIZER;
        bb_train_result offloaded = train(&o);
        cr_assert(same_bits(&on_device, &offloaded), "--zero %d --offload optimizer differs from --zero %d", z, z);
        uint64_t planned, peak = largest_peak(&offloaded);
        bb_model_config c = shaped(&o);
        bb_plan_zero pz = {z, o.devices, bb_bucket_bytes(o.bucket_mib), o.zero_shards, true};
        bb_memory_breakdown m;
        cr_assert_eq(bb_plan_memory_sharded(&c, o.micro_batch, o.opt.kind, BB_DEVICE_CPU, &pz, &m), BB_OK, "%s",
                     bb_error_message());
        planned = m.total;
        cr_assert_eq(peak, planned, "--zero %d --offload optimizer: peak %llu, planned %llu", z,
                     (unsigned long long)peak, (unsigned long long)planned);
        cr_assert(peak < largest_peak(&on_device), "--zero %d: offloading saved nothing", z);
        cr_assert_eq(m.optimizer, 0, "--zero %d: state left on the device", z);
        cr_log_info("--zero %d --offload optimizer: bitwise; peak %llu bytes (on the device: %llu), the planner's; "
                    "%llu bytes of host memory", z, (unsigned long long)peak,
                    (unsigned long long)largest_peak(&on_device), (unsigned long long)m.offloaded);
        bb_train_result_free(&on_device), bb_train_result_free(&offloaded);
    }
    /* saved offloaded, resumed on the device (and back): the run that never stopped */
    char *ckpt = tu_path(tmp, "ckpt");
    bb_train_options o = staged(gpt_options(tokens, 2, 16, 32), 1);
    bb_train_result whole = train(&o);
    for (int k = 0; k < 2; k++) {
        bb_train_options s = o;
        s.save_dir = ckpt, s.stop_after = 4, s.offload = k ? BB_OFFLOAD_NONE : BB_OFFLOAD_OPTIMIZER, s.force = true;
        bb_train_result first = train(&s);
        bb_train_options r = o;
        r.resume_dir = ckpt, r.offload = k ? BB_OFFLOAD_OPTIMIZER : BB_OFFLOAD_NONE;
        bb_train_result second = train(&r);
        cr_assert_eq(memcmp(second.params, whole.params, whole.param_count * sizeof(float)), 0,
                     "saved %s, resumed %s: not the run that never stopped", k ? "on the device" : "offloaded",
                     k ? "offloaded" : "on the device");
        bb_train_result_free(&first), bb_train_result_free(&second);
        tu_rm_tree(ckpt);
    }
    bb_train_result_free(&whole);
    /* too little host memory */
    o = staged(gpt_options(tokens, 2, 16, 32), 0);
    o.offload = BB_OFFLOAD_OPTIMIZER, o.host_mem = 4096;
    bb_train_result r;
    cr_assert_eq(bb_train_run(&o, &r), BB_ERR_OOM);
    cr_assert(strstr(bb_error_message(), "--offload optimizer needs") && strstr(bb_error_message(), "--host-mem allows"),
              "%s", bb_error_message());
    cr_assert(!strchr(bb_error_message(), '\n'), "one line: %s", bb_error_message());
    free(ckpt), free(tokens);
}

/* --offload auto: the planner offloads only when no stage fits without. */
Test(zero, offload_auto_offloads_only_when_nothing_fits_without)
{
    char *data = make_tokens("tokens", 100);
    bb_train_options base = gpt_options(data, 1, 8, 64);
    base.model = bb_model_gpt_config(4, 4, 128, 0, 0);
    bb_model_config c = shaped(&base);
    c.gpt.seq_len = 256, c.gpt.vocab = 256;
    const struct {
        uint64_t mib;
        bool offload;
    } cases[] = {{64, false}, {12, true}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        bb_plan_request q = {.model = c, .devices = 1, .global_batch = 64, .device_mem = cases[i].mib << 20,
                             .offload = BB_OFFLOAD_AUTO, .bucket_mib = 0.1};
        bb_plan p;
        cr_assert_eq(bb_plan_make(&q, &p), BB_OK, "%s", bb_error_message());
        cr_assert(p.chosen >= 0, "%llu MiB: nothing fits (%s)", (unsigned long long)cases[i].mib, p.why_nothing_fits);
        cr_assert_eq(p.offload, cases[i].offload, "%llu MiB: offload %d", (unsigned long long)cases[i].mib, p.offload);
        if (p.offload) cr_assert(strstr(p.why_zero, "--zero 0: "), "no word on the device's table: %s", p.why_zero);
        cr_log_info("%llu MiB on 1 device: %s%s%s", (unsigned long long)cases[i].mib,
                    p.offload ? "--offload optimizer" : "on the device", p.why_zero[0] ? ": " : "", p.why_zero);
        bb_plan_free(&p);
    }
    free(data);
}

/* ---- the parameter window, on its own --------------------------------------
 * A model under a window (ZeRO-3's) whose hook copies from the whole
 * weights on the host computes the loss and gradients of the same model
 * with whole weights, bitwise, under every checkpoint policy, and gathers
 * ahead: a bucket's gather is issued before the pass waits for the bucket
 * it uses before (its first use in a pass direction aside). */
typedef struct window_log {
    const float *host;
    int buckets;
    uint64_t clock, *issued, *waited;
    int previous;          /* the bucket waited for before; -1: none */
    int direction;         /* of the run of neighbouring buckets it ends: -1, 1; 0: none */
    int late;              /* waits whose gather was issued after the previous wait */
    int runs;              /* runs of waits for neighbouring buckets in one direction */
} window_log;

static bb_status from_host(void *ctx, bb_gather_phase phase, int bucket, size_t lo, size_t n, float *slot)
{
    window_log *l = ctx;
    cr_assert(bucket >= 0 && bucket < l->buckets);
    if (phase == BB_GATHER_ISSUE) {
        memcpy(slot, l->host + lo, n * sizeof *slot);
        l->issued[bucket] = ++l->clock;
        return BB_OK;
    }
    if (l->previous >= 0 && l->issued[bucket] > l->waited[l->previous]) l->late++;
    int step = l->previous >= 0 && abs(bucket - l->previous) == 1 ? bucket - l->previous : 0;
    if (!step || step != l->direction) l->runs += !(step && !l->direction);
    l->direction = step;
    l->waited[bucket] = ++l->clock;
    l->previous = bucket;
    return BB_OK;
}

static void window_case(const char *what, bb_model_config c, int B)
{
    bb_backend_options bo = {.threads = 1};
    bb_backend_t *be;
    cr_assert_eq(bb_backend_create_cpu(&bo, &be), BB_OK);
    bb_model_t *whole, *windowed;
    cr_assert_eq(bb_model_create(be, &c, B, &whole), BB_OK, "%s", bb_error_message());
    cr_assert_eq(bb_model_init(whole, 7), BB_OK);
    size_t n = bb_model_param_count(whole);
    float *host = malloc(n * sizeof *host), *g = malloc(n * sizeof *g);
    memcpy(host, bb_model_params(whole), n * sizeof *host);
    bb_model_config w = c;
    w.param_window_bytes = 4096; /* buckets smaller than a block: a layer spans several */
    cr_assert_eq(bb_model_create(be, &w, B, &windowed), BB_OK, "%s", bb_error_message());
    cr_assert_eq(bb_model_init(windowed, 7), BB_ERR_UNSUPPORTED, "%s: init with nothing lent", what);
    bb_buckets buckets;
    cr_assert_eq(bb_buckets_make(windowed, w.param_window_bytes, &buckets), BB_OK);
    window_log log = {.host = host, .buckets = buckets.count, .previous = -1,
                      .issued = calloc((size_t)buckets.count, sizeof(uint64_t)),
                      .waited = calloc((size_t)buckets.count, sizeof(uint64_t))};
    double loss[2];
    cr_assert_eq(bb_model_forward(windowed, 1.0f, &loss[1], NULL), BB_ERR_INTERNAL, "%s: a pass without a hook", what);
    bb_model_set_param_window_hook(windowed, from_host, &log);
    for (int k = 0; k < 2; k++) {
        bb_model_t *m = k ? windowed : whole;
        cr_assert_eq(bb_model_set_synthetic_batch(m), BB_OK);
        log.previous = -1, log.direction = 0;
        cr_assert_eq(bb_model_forward(m, 1.0f, &loss[k], NULL), BB_OK, "%s", bb_error_message());
        log.previous = -1, log.direction = 0;
        cr_assert_eq(bb_model_backward(m, false), BB_OK, "%s", bb_error_message());
    }
    memcpy(g, bb_model_grads(whole), n * sizeof *g);
    cr_assert_eq(memcmp(&loss[0], &loss[1], sizeof loss[0]), 0, "%s: loss %.9g, windowed %.9g", what, loss[0], loss[1]);
    cr_assert_eq(memcmp(g, bb_model_grads(windowed), n * sizeof *g), 0, "%s: the gradients differ", what);
    uint64_t gathers, ahead;
    bb_model_param_window_gathers(windowed, &gathers, &ahead);
    /* A pass starts gathering ahead in its direction: with no recompute
     * every gather is issued ahead (the token table's, in a slot of its
     * own, aside). A recomputed segment turns the direction within the
     * backward: the first two buckets of such a run may be gathered at
     * their use. */
    int turns = log.runs > 2 ? log.runs - 2 : 0;
    cr_assert(log.late <= 2 * turns, "%s: %d of %llu gathers were not issued a bucket ahead (%d runs)", what,
              log.late, (unsigned long long)gathers, log.runs);
    cr_assert(gathers - ahead <= 1 + 2 * (uint64_t)turns, "%s: %llu of %llu gathers at their use", what,
              (unsigned long long)(gathers - ahead), (unsigned long long)gathers);
    cr_log_info("%s: %d buckets, a ring of %d slots; %llu gathers in a forward and backward, %llu issued ahead; %d "
                "waits in %d runs not a bucket ahead", what, buckets.count, bb_model_param_window_ring(windowed),
                (unsigned long long)gathers, (unsigned long long)ahead, log.late, log.runs);
    bb_buckets_free(&buckets);
    free(log.issued), free(log.waited), free(host), free(g);
    bb_model_destroy(whole), bb_model_destroy(windowed);
    bb_backend_destroy(be);
}

Test(zero, the_parameter_window_computes_what_whole_weights_do_and_gathers_ahead)
{
    const char *policies[] = {"none", "blocks", "every:2", "selective", "plan:f,s,n"};
    for (int i = 0; i < 5; i++) {
        bb_model_config c = bb_model_gpt_config(3, 2, 32, 16, 64);
        cr_assert_eq(bb_model_parse_recompute(policies[i], &c), BB_OK);
        char what[64];
        snprintf(what, sizeof what, "gpt --checkpoint %s", policies[i]);
        window_case(what, c, 2);
        c.precision = BB_PRECISION_BF16;
        snprintf(what, sizeof what, "gpt bf16 --checkpoint %s", policies[i]);
        window_case(what, c, 2);
    }
    bb_model_config llama = bb_model_llama_config(2, 2, 32, 16, 64);
    window_case("llama", llama, 2);
    int hidden[] = {64, 48};
    window_case("mlp", bb_model_mlp_config(40, hidden, 2, 10), 4);
}
