/* test_recompute.c — selective recompute and per-block recompute plans:
 * every plan gives the gradients of keeping everything, bit for bit (fp32
 * and bf16, one micro-step and accumulated ones; the gpt and the llama),
 * the memory each policy keeps follows its formula, and a bad plan is one
 * line. */
#include <math.h>

#include "bigbatch/plan.h"
#include "model_fixture.h"

TestSuite(recompute, .init = backend_up, .fini = backend_down);

enum { B = 2, T = 5, V = 11, C = 8, NH = 2 };

enum { KINDS = 2 }; /* the decoders: 0 the gpt, 1 a llama (2 heads over 1 key/value head) */
static const char *const kind_names[KINDS] = {"gpt", "llama"};

static bb_model_config decoder(int kind, int layers, const char *policy, bb_precision precision)
{
    bb_model_config c = bb_model_gpt_config(layers, NH, C, T, V);
    if (kind) {
        c = bb_model_llama_config(layers, NH, C, T, V);
        c.llama.kv_heads = 1, c.llama.ffn = 12;
    }
    cr_assert_eq(bb_model_parse_recompute(policy, &c), BB_OK, "%s: %s", policy, bb_error_message());
    c.precision = precision;
    return c;
}

static bb_model_config gpt(int layers, const char *policy, bb_precision precision)
{
    return decoder(0, layers, policy, precision);
}

/* Loss and gradients of `steps` micro-steps (the later ones accumulate). */
static float *gradients(const bb_model_config *c, int steps, double *loss, uint64_t *bytes)
{
    bb_model_t *m = make_model(c, B, 5);
    for (int s = 0; s < steps; s++) {
        host_batch h = make_batch(c, B, 6 + (uint64_t)s);
        cr_assert_eq(bb_model_set_batch(m, h.inputs, h.targets), BB_OK);
        free(h.inputs), free(h.targets);
        cr_assert_eq(bb_model_forward(m, 3.0f, &loss[s], NULL), BB_OK);
        cr_assert_eq(bb_model_backward(m, s > 0), BB_OK);
    }
    size_t n = bb_model_param_count(m);
    float *g = malloc(n * sizeof *g);
    memcpy(g, bb_model_grads(m), n * sizeof *g);
    *bytes = bb_model_activation_bytes(m);
    bb_model_destroy(m);
    return g;
}

static size_t params_of(const bb_model_config *c)
{
    bb_model_t *m = make_model(c, B, 1);
    size_t n = bb_model_param_count(m);
    bb_model_destroy(m);
    return n;
}

/* Every one of the 4^4 plans of a 4-block gpt and llama (offloaded
 * blocks included), in fp32 and bf16, with one micro-step and with three
 * accumulated, gives the losses and gradients of `none` bit for bit. */
Test(recompute, every_plan_of_four_blocks_gives_the_gradients_of_none_bitwise)
{
    static const char letters[] = "nsfo";
    for (int kind = 0; kind < KINDS; kind++)
    for (int p = 0; p < 2; p++) {
        bb_precision precision = p ? BB_PRECISION_BF16 : BB_PRECISION_FP32;
        bb_model_config none = decoder(kind, 4, "none", precision);
        size_t n = params_of(&none);
        for (int steps = 1; steps <= 3; steps += 2) {
            double want_loss[3], loss[3];
            uint64_t none_bytes, bytes;
            float *want = gradients(&none, steps, want_loss, &none_bytes);
            int smaller = 0;
            for (int code = 0; code < 256; code++) {
                char plan[32];
                int k = code;
                snprintf(plan, sizeof plan, "plan:%c,%c,%c,%c", letters[k % 4], letters[k / 4 % 4],
                         letters[k / 16 % 4], letters[k / 64 % 4]);
                bb_model_config c = decoder(kind, 4, plan, precision);
                float *got = gradients(&c, steps, loss, &bytes);
                for (int s = 0; s < steps; s++)
                    cr_assert_eq(loss[s], want_loss[s], "%s %s: the loss of micro-step %d changed", plan,
                                 bb_precision_name(precision), s);
                cr_assert_eq(memcmp(got, want, n * sizeof *got), 0, "%s %s, %d micro-steps: gradients differ", plan,
                             bb_precision_name(precision), steps);
                /* a lone f needs a recompute slot as big as the slot it saves, a lone s the
                 * shared scratch, a lone o a shared slot: at worst that and one saved input more
                 * than none (the gpt's scratch: 5 d-wide rows a token; the llama's exact costs:
                 * block_costs_...) */
                if (!kind)
                    cr_assert_leq(bytes, none_bytes + (uint64_t)B * T * (1 + 5) * C * 4, "%s: activations", plan);
                smaller += bytes < none_bytes;
                free(got);
            }
            printf("%s %s, %d micro-step%s: 256 plans bitwise equal to none, %d of them keeping less\n",
                   kind_names[kind], bb_precision_name(precision), steps, steps > 1 ? "s" : "", smaller);
            cr_assert_gt(smaller, 128); /* more than half: a lone o keeps what n keeps, in a shared slot */
            free(want);
        }
    }
}

/* The shorthands are plans: selective = s for every block, offload = o,
 * blocks = f. */
Test(recompute, shorthands_are_plans_and_names_are_what_parses)
{
    const struct {
        const char *given, *name;
    } cases[] = {
        {"none", "none"},           {"selective", "selective"},   {"blocks", "blocks"},
        {"every:2", "every:2"},     {"plan:s,s,s,s", "selective"}, {"plan:f*4", "blocks"},
        {"plan:n,s,f,f", "plan:n,s,f*2"}, {"plan:selective*2,full,none", "plan:s*2,f,n"},
        {"offload", "offload"},     {"plan:o*4", "offload"},      {"plan:offload,n,o*2", "plan:o,n,o*2"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        bb_model_config c = gpt(4, cases[i].given, BB_PRECISION_FP32);
        char name[BB_RECOMPUTE_NAME_MAX];
        bb_model_recompute_name(&c, name, sizeof name);
        cr_assert_str_eq(name, cases[i].name, "%s", cases[i].given);
        bb_model_config again = bb_model_gpt_config(4, NH, C, T, V);
        cr_assert_eq(bb_model_parse_recompute(name, &again), BB_OK, "%s", name);
        for (int l = 0; l < 4; l++)
            cr_assert_eq(bb_model_block_recompute(&again, l), bb_model_block_recompute(&c, l), "%s", name);
    }
    bb_model_config s = gpt(4, "selective", BB_PRECISION_FP32), b = gpt(4, "plan:f,f,f,f", BB_PRECISION_FP32);
    for (int l = 0; l < 4; l++) {
        cr_assert_eq(bb_model_block_recompute(&s, l), BB_RECOMPUTE_SELECTIVE);
        cr_assert_eq(bb_model_block_recompute(&b, l), BB_RECOMPUTE_FULL);
    }
}

/* A selective block keeps 10 of the 16 d-wide tensors per token (and its
 * statistics); the LayerNorm and GELU outputs of all of them share one
 * scratch of 5: in 4 bytes an element under fp32, in 2 under bf16. */
Test(recompute, selective_memory_follows_the_formula)
{
    const int L = 6;
    size_t BT = B * T;
    bb_model_config none = gpt(L, "none", BB_PRECISION_FP32), sel = gpt(L, "selective", BB_PRECISION_FP32);
    bb_model_t *a = make_model(&none, B, 1), *b = make_model(&sel, B, 1);
    uint64_t saved = L * BT * 6 * C * 4, scratch = BT * 5 * C * 4;
    cr_assert_eq(bb_model_activation_bytes(b), bb_model_activation_bytes(a) - saved + scratch);
    bb_model_destroy(a), bb_model_destroy(b);
    none.precision = sel.precision = BB_PRECISION_BF16;
    a = make_model(&none, B, 1), b = make_model(&sel, B, 1);
    cr_assert_eq(bb_model_activation_bytes(b), bb_model_activation_bytes(a) - saved / 2 + scratch / 2);
    bb_model_destroy(a), bb_model_destroy(b);
    /* a full block after a kept one needs no copy of its input: plan:n,f
     * keeps one slot, one recompute slot and only the embedding as input */
    bb_model_config nf = gpt(2, "plan:n,f", BB_PRECISION_FP32), nn = gpt(2, "none", BB_PRECISION_FP32);
    a = make_model(&nn, B, 1), b = make_model(&nf, B, 1);
    cr_assert_eq(bb_model_activation_bytes(b), bb_model_activation_bytes(a), "n,f and n,n both hold two slots");
    bb_model_destroy(a), bb_model_destroy(b);
}

/* A plan of the wrong length, an unknown policy, a plan for the mlp: one
 * line each, through the library and the command line. */
Test(recompute, bad_plans_are_one_line_errors)
{
    bb_model_config c = bb_model_gpt_config(4, NH, C, T, V);
    const char *bad[] = {"plan:", "plan:x", "plan:s*0", "plan:s*", "plan:n,,f", "plan:s*300", "selectiv", "every:0"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_assert_eq(bb_model_parse_recompute(bad[i], &c), BB_ERR_ARG, "%s was taken", bad[i]);
        cr_assert(!strchr(bb_error_message(), '\n'), "%s", bb_error_message());
    }
    cr_assert_eq(bb_model_parse_recompute("plan:n,s,f", &c), BB_OK);
    bb_model_t *m;
    cr_assert_eq(bb_model_create(be, &c, B, &m), BB_ERR_ARG);
    cr_assert(strstr(bb_error_message(), "gives 3 blocks; this gpt has 4"), "%s", bb_error_message());
    const int hidden[] = {7};
    bb_model_config mlp = bb_model_mlp_config(6, hidden, 1, 3);
    cr_assert_eq(bb_model_parse_recompute("selective", &mlp), BB_OK);
    cr_assert_eq(bb_model_create(be, &mlp, B, &m), BB_ERR_ARG);
    cr_assert(strstr(bb_error_message(), "a mlp takes none, blocks or every:K"), "%s", bb_error_message());
    tu_run r = tu_bigbatch("train", "--layers", "2", "--d-model", "16", "--heads", "2", "--global-batch", "8",
                           "--micro-batch", "8", "--steps", "1", "--checkpoint", "plan:n,s,f");
    tu_assert_error(&r, "--checkpoint plan:n,s,f", "gives 3 blocks", "has 2");
    cr_assert_eq(r.exit_code, 2);
    tu_run_free(&r);
    r = tu_bigbatch("train", "--checkpoint", "plan:n,q", "--steps", "1", "--global-batch", "8");
    tu_assert_error(&r, "'q' is not a block policy");
    tu_run_free(&r);
}

/* bb_model_block_costs, the planner's view of a plan's memory, is the
 * allocator's count, on the device and on the host, for every plan of 4
 * blocks (n, s, f, o), in fp32 and bf16, at two micro-batches, for the gpt
 * and the llama. */
Test(recompute, block_costs_predict_every_plans_activations_exactly)
{
    static const char letters[] = BB_RECOMPUTE_LETTERS;
    for (int kind = 0; kind < KINDS; kind++)
    for (int p = 0; p < 2; p++)
        for (int mb = 1; mb <= 3; mb += 2) {
            bb_precision precision = p ? BB_PRECISION_BF16 : BB_PRECISION_FP32;
            bb_model_config none = decoder(kind, 4, "none", precision);
            bb_block_costs k;
            cr_assert_eq(bb_model_block_costs(&none, mb, &k), BB_OK);
            bb_model_t *m = make_model(&none, mb, 1);
            uint64_t base = bb_model_activation_bytes(m);
            bb_model_destroy(m);
            for (int code = 0; code < 256; code++) {
                char plan[32] = "plan:";
                int policy[4], offloaded = 0;
                for (int l = 0; l < 4; l++) policy[l] = code >> 2 * l & 3;
                for (int l = 0; l < 4; l++) snprintf(plan + strlen(plan), 3, "%s%c", l ? "," : "", letters[policy[l]]);
                uint64_t want = base;
                bool used[4] = {false};
                for (int l = 0; l < 4; l++) {
                    const uint64_t *own = l == 3 ? k.own_last : k.own;
                    want += own[policy[l]] - own[0];
                    used[policy[l]] = true;
                    if (policy[l] >= 2 && l < 3) want += k.after_full;
                    if (policy[l] == 3 && offloaded++ < 2) want += k.once[3]; /* two slots at most */
                }
                for (int x = 0; x < 3; x++) want += used[x] ? k.once[x] : 0;
                bb_model_config c = decoder(kind, 4, plan, precision);
                m = make_model(&c, mb, 1);
                cr_assert_eq(bb_model_activation_bytes(m), want, "%s %s %s micro-batch %d: %llu allocated, %llu "
                             "predicted", kind_names[kind], plan, bb_precision_name(precision), mb,
                             (unsigned long long)bb_model_activation_bytes(m), (unsigned long long)want);
                cr_assert_eq(bb_model_host_activation_bytes(m), offloaded * k.host, "%s %s: %llu host bytes",
                             kind_names[kind], plan, (unsigned long long)bb_model_host_activation_bytes(m));
                bb_model_destroy(m);
            }
        }
    const int hidden[] = {7};
    bb_model_config mlp = bb_model_mlp_config(6, hidden, 1, 3);
    bb_block_costs k;
    cr_assert_eq(bb_model_block_costs(&mlp, 2, &k), BB_ERR_UNSUPPORTED);
}

/* The planner's dynamic program over blocks picks, for every budget, a
 * plan that fits and costs least, as an exhaustive search over all 256
 * plans of 4 blocks does with the allocator's bytes and the recomputations
 * the model counts itself (fp32 and bf16; weightings of selective against
 * full recomputation against an offloaded block's copies, offload not
 * offered, cheap, dearer than recomputing, capped at three or two blocks). */
Test(recompute, the_planners_program_over_blocks_equals_exhaustive_search)
{
    static const char letters[] = BB_RECOMPUTE_LETTERS;
    const bb_block_times weights[] = {{0.1, 1.0, -1, 0},  {0.45, 0.5, -1, 0},   {0.1, 1.0, 0.3, 0},
                                      {0.45, 0.5, 1e-6, 0}, {0.2, 1.0, 1.5, 0}, {0.45, 0.5, 1e-6, 3},
                                      {0.1, 1.0, 0.3, 2}};
    enum { WEIGHTS = sizeof weights / sizeof *weights };
    for (int p = 0; p < 2; p++) {
        bb_precision precision = p ? BB_PRECISION_BF16 : BB_PRECISION_FP32;
        bb_model_config none = gpt(4, "none", precision);
        bb_block_costs k;
        cr_assert_eq(bb_model_block_costs(&none, B, &k), BB_OK);
        bb_model_t *m = make_model(&none, B, 1);
        int64_t base = (int64_t)bb_model_activation_bytes(m);
        bb_model_destroy(m);
        int64_t bytes[256];
        int recomputed[256], selective[256], offloaded[256];
        for (int code = 0; code < 256; code++) {
            char plan[32] = "plan:";
            offloaded[code] = 0;
            for (int l = 0; l < 4; l++) {
                snprintf(plan + strlen(plan), 3, "%s%c", l ? "," : "", letters[code >> 2 * l & 3]);
                offloaded[code] += (code >> 2 * l & 3) == 3;
            }
            bb_model_config c = gpt(4, plan, precision);
            m = make_model(&c, B, 1);
            host_batch h = make_batch(&c, B, 3);
            cr_assert_eq(bb_model_set_batch(m, h.inputs, h.targets), BB_OK);
            free(h.inputs), free(h.targets);
            double loss;
            cr_assert_eq(bb_model_forward(m, 1.0f, &loss, NULL), BB_OK);
            cr_assert_eq(bb_model_backward(m, false), BB_OK);
            bytes[code] = (int64_t)bb_model_activation_bytes(m) - base;
            bb_model_recompute_counts(m, &recomputed[code], &selective[code]);
            bb_model_destroy(m);
        }
        int64_t least = 0;
        for (int code = 0; code < 256; code++) least = bytes[code] < least ? bytes[code] : least;
        for (int w = 0; w < WEIGHTS; w++) {
            const bb_block_times *t = &weights[w];
            int picked_o = 0; /* rooms at which the program offloads some block */
            for (int step = 0; step <= 20; step++) {
                int64_t room = least * step / 20;
                double best = -1;
                for (int code = 0; code < 256; code++) {
                    if (offloaded[code] && (t->offload < 0 || (t->max_offloaded && offloaded[code] > t->max_offloaded)))
                        continue;
                    double cost = t->selective * selective[code] + t->full * recomputed[code] +
                                  t->offload * offloaded[code];
                    if (bytes[code] <= room && (best < 0 || cost < best)) best = cost;
                }
                char plan[8];
                int64_t got_bytes;
                double got_time;
                bool found = bb_plan_best_blocks(4, &k, room, t, plan, &got_bytes, &got_time);
                cr_assert_eq(found, best >= 0, "room %lld, weights %d: found %d, the search %g", (long long)room, w,
                             found, best);
                if (!found) continue; /* without 'o' the least bytes are out of reach */
                int code = 0;
                for (int l = 3; l >= 0; l--) code = code * 4 + (int)(strchr(letters, plan[l]) - letters);
                cr_assert(t->offload >= 0 || !offloaded[code], "%s: 'o' was not offered", plan);
                cr_assert(!t->max_offloaded || offloaded[code] <= t->max_offloaded, "%s: over the cap", plan);
                picked_o += offloaded[code] > 0;
                double cost = t->selective * selective[code] + t->full * recomputed[code] + t->offload * offloaded[code];
                cr_assert_eq(got_bytes, bytes[code], "%s: the program's bytes are the allocator's", plan);
                cr_assert(bytes[code] <= room, "%s does not fit %lld", plan, (long long)room);
                cr_assert(fabs(cost - best) < 1e-9 && fabs(got_time - cost) < 1e-9,
                          "%s weights %d room %lld: the program's %s costs %g (it says %g), the best %g",
                          bb_precision_name(precision), w, (long long)room, plan, cost, got_time, best);
            }
            /* offloaded blocks save what full ones do but a second device slot (so fewer than three
             * save nothing): cheaper than recomputing, the tighter rooms take them; dearer, never */
            if (t->offload >= 0 && t->offload < t->full && (!t->max_offloaded || t->max_offloaded >= 3))
                cr_assert(picked_o > 0, "weights %d: no room made the program offload", w);
            else
                cr_assert_eq(picked_o, 0, "weights %d: offloading costs more and saves less than recomputing", w);
            cr_log_info("%s, weights %d: %d of 21 rooms offload some block", bb_precision_name(precision), w, picked_o);
        }
    }
}

/* Offloaded blocks keep on the device two slots they share and, for the
 * block after each, its input; their tensors and statistics go to pinned
 * host memory, a whole block's (the costs' own[n]) each. */
Test(recompute, offloaded_blocks_keep_two_slots_on_the_device_and_the_rest_on_the_host)
{
    enum { L = 8 };
    for (int kind = 0; kind < KINDS; kind++)
    for (int p = 0; p < 2; p++) {
        bb_precision precision = p ? BB_PRECISION_BF16 : BB_PRECISION_FP32;
        bb_model_config none = decoder(kind, L, "none", precision), off = decoder(kind, L, "offload", precision);
        bb_block_costs k;
        cr_assert_eq(bb_model_block_costs(&none, B, &k), BB_OK);
        bb_model_t *a = make_model(&none, B, 1), *b = make_model(&off, B, 1);
        uint64_t want = bb_model_activation_bytes(a) - (L - 2) * k.own[0] + (L - 1) * k.after_full;
        cr_assert_eq(bb_model_activation_bytes(b), want, "%s %s: %llu device bytes, the layout's %llu",
                     kind_names[kind], bb_precision_name(precision),
                     (unsigned long long)bb_model_activation_bytes(b), (unsigned long long)want);
        cr_assert_eq(bb_model_host_activation_bytes(b), L * k.own[0]);
        cr_assert_eq(bb_model_host_activation_bytes(a), 0);
        printf("%s %s, %d blocks offloaded: %llu bytes of activations on the device (none: %llu), %llu on the host\n",
               kind_names[kind], bb_precision_name(precision), L, (unsigned long long)bb_model_activation_bytes(b),
               (unsigned long long)bb_model_activation_bytes(a), (unsigned long long)bb_model_host_activation_bytes(b));
        bb_model_destroy(a), bb_model_destroy(b);
    }
}
