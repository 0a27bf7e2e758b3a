/* model_internal.h — private: the state every model shares and the hooks
 * each model kind (gpt.c, mlp.c) provides. */
#ifndef BIGBATCH_MODEL_INTERNAL_H
#define BIGBATCH_MODEL_INTERNAL_H

#include "bigbatch/model.h"

typedef struct model_kind_ops {
    bb_status (*create)(bb_model_t *m);      /* tensors, then activations */
    bb_status (*init)(bb_model_t *m, uint64_t seed, float *host_params);
    /* loss NULL: stop at the logits (no loss, no backward may follow) */
    bb_status (*forward)(bb_model_t *m, float normalizer, double *loss, int *correct);
    const float *(*logits)(bb_model_t *m);   /* device logits after a forward without loss */
    bb_status (*backward)(bb_model_t *m, bool accumulate);
    void (*destroy)(bb_model_t *m);
} model_kind_ops;

struct bb_model {
    bb_backend_t *be;
    bb_model_config cfg;
    const model_kind_ops *ops;
    int B;                   /* micro-batch */
    float *params, *grads;   /* device, param_count floats each */
    size_t param_count;
    bb_tensor_info *tensors;
    int tensor_count, tensor_capacity;
    /* the batch the next forward reads, on the device: batch_sets[current] */
    float *features;         /* mlp: (B, inputs) */
    int32_t *tokens;         /* gpt: (B, T) */
    int32_t *targets;        /* mlp: (B); gpt: (B, T) */
    int targets_valid;
    struct batch_set *batch_sets; /* (2): the current one and the one being staged (batch.c) */
    int current;
    uint64_t activation_bytes;
    bb_grad_ready_fn grad_ready;
    void *grad_ready_ctx;
    void *impl;
};

extern const model_kind_ops bb_gpt_ops, bb_mlp_ops;

/* model.c helpers for the kinds */
bb_status bb_model_add_tensor(bb_model_t *m, const char *name, int rows, int cols, bool decay);
/* Parameters, gradients (zeroed) and the batch buffers, once the tensors
 * are added. */
bb_status bb_model_alloc_parameters(bb_model_t *m);
/* batch.c: both batch sets (device buffers, pinned staging, events), and
 * their release; rows with a target: B (mlp) or B·T (gpt). */
bb_status bb_model_alloc_batches(bb_model_t *m);
void bb_model_free_batches(bb_model_t *m);
int bb_model_batch_rows(const bb_model_t *m);
/* Allocates `bytes` of activations (counted in activation_bytes). */
bb_status bb_model_alloc_activation(bb_model_t *m, size_t bytes, const char *what, void **out);
static inline float *model_param(bb_model_t *m, int tensor) { return m->params + m->tensors[tensor].offset; }
/* Tells the trainer that gradients from `tensor` to the end are final. */
static inline void model_grads_ready(bb_model_t *m, int tensor)
{
    if (m->grad_ready) m->grad_ready(m->grad_ready_ctx, m->tensors[tensor].offset);
}
static inline float *model_grad(bb_model_t *m, int tensor) { return m->grads + m->tensors[tensor].offset; }

/* Deterministic streams for initialisation. */
typedef struct init_rng {
    uint64_t state;
} init_rng;
float bb_init_normal(init_rng *r, float std);
float bb_init_uniform(init_rng *r, float bound);

#endif
