/* model_fixture.h — what the model suites (test_model.c, test_parity.c)
 * share: a one-thread CPU backend, models made and initialised on it, and
 * deterministic host batches. */
#ifndef BIGBATCH_MODEL_FIXTURE_H
#define BIGBATCH_MODEL_FIXTURE_H

#include "bigbatch/model.h"
#include "test_util.h"

static bb_backend_t *be;

static inline void backend_up(void)
{
    bb_backend_options o = {.threads = 1};
    cr_assert_eq(bb_backend_create_cpu(&o, &be), BB_OK);
}

static inline void backend_down(void) { bb_backend_destroy(be); }

static inline bb_model_t *make_model(const bb_model_config *c, int B, uint64_t seed)
{
    bb_model_t *m;
    cr_assert_eq(bb_model_create(be, c, B, &m), BB_OK, "%s", bb_error_message());
    cr_assert_eq(bb_model_init(m, seed), BB_OK);
    return m;
}

/* A deterministic batch for either kind (gpt: one target ignored), in host
 * arrays: inputs are int32 tokens (gpt) or float features (mlp). */
typedef struct host_batch {
    void *inputs;
    int32_t *targets;
    size_t input_bytes, target_count;
} host_batch;

static inline host_batch make_batch(const bb_model_config *c, int B, uint64_t seed)
{
    bool tokens = bb_model_targets_are_tokens(c); /* a decoder (gpt, llama), else the mlp */
    int V = bb_model_outputs(c);
    host_batch h = {.target_count = (size_t)B * bb_model_targets_per_example(c)};
    h.input_bytes = tokens ? h.target_count * sizeof(int32_t) : (size_t)B * c->mlp.inputs * sizeof(float);
    h.inputs = malloc(h.input_bytes);
    h.targets = malloc(h.target_count * sizeof *h.targets);
    uint64_t s = seed;
    for (size_t i = 0; i < h.target_count; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        h.targets[i] = (int32_t)((s >> 45) % (uint64_t)V);
        if (tokens) ((int32_t *)h.inputs)[i] = (int32_t)((s >> 20) % (uint64_t)V);
    }
    if (tokens) h.targets[1] = -1;
    for (int i = 0; !tokens && i < B * c->mlp.inputs; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        ((float *)h.inputs)[i] = (float)((s >> 40) % 1000) / 1000.0f;
    }
    return h;
}

#endif
