/* model_internal.h — private: the state every model shares and the hooks
 * each model kind (gpt.c, mlp.c) provides. */
#ifndef BIGBATCH_MODEL_INTERNAL_H
#define BIGBATCH_MODEL_INTERNAL_H

#include "bigbatch/model.h"

/* A family of kinds: what the model does, for every kind of the family —
 * the decoders (decoder.c: gpt, and any decoder-only kind that plugs its
 * block into the stack) or the mlp (mlp.c). */
typedef struct bb_model_family {
    /* ---- counts (no model needed) ---- */
    int (*layers)(const bb_model_config *c);              /* recompute units */
    int (*targets_per_example)(const bb_model_config *c); /* 1, or T tokens */
    int (*outputs)(const bb_model_config *c);             /* logits per target */
    bool targets_are_tokens, counts_correct;
    bool chunks_loss;      /* its head and loss run in chunks of tokens (bb_model_loss_chunk) */
    bool recompute_plans;  /* takes a policy per layer (recompute_plan), not only every:K */
    /* with recompute_plans: what each policy costs a block (bb_model_block_costs) */
    void (*block_costs)(const bb_model_config *c, int micro_batch, bb_block_costs *out);
    /* ---- batches (batch.c) ---- */
    int (*inputs_per_example)(const bb_model_config *c); /* elements of input_size bytes */
    size_t input_size;                                    /* float features, int32 tokens */
    const char *input_name;                               /* "features", "tokens" */
    size_t (*record_bytes)(const bb_model_config *c);     /* the widest record it takes */
    /* checks records on the host (the device indexes tables with them);
     * *width: a detail the conversion needs (bytes per token) */
    bb_status (*check_records)(const bb_model_config *c, const bb_record_format *f, const uint8_t *records,
                               int count, int *width);
    /* optional: checks host inputs of bb_model_set_batch (n elements) */
    bb_status (*check_inputs)(const bb_model_config *c, const void *inputs, size_t n);
    /* turns `count` staged records into inputs and targets on the device */
    void (*convert)(bb_model_t *m, void *inputs, int32_t *targets, const uint8_t *records, int count, int width);
    /* ---- the model ---- */
    bb_status (*create)(bb_model_t *m);      /* tensors, then activations */
    bb_status (*init)(bb_model_t *m, uint64_t seed, float *host_params);
    /* loss NULL: stop before the loss (no backward may follow) */
    bb_status (*forward)(bb_model_t *m, float normalizer, double *loss, int *correct);
    /* after a forward without loss: every example's logits at `position`, to the host */
    bb_status (*logits)(bb_model_t *m, int position, float *host);
    /* optional: incremental decoding (bb_model_decode); position and token checked */
    bb_status (*decode)(bb_model_t *m, int32_t token, int position, float *host_logits);
    bb_status (*backward)(bb_model_t *m, bool accumulate);
    void (*destroy)(bb_model_t *m);
    /* the first tensor of layer l (0 <= l <= layers: layers gives the first
     * after the last layer's), once created: which tensors a pass uses
     * together (ZeRO-3's window keeps a layer's buckets in slots of their own) */
    int (*layer_tensor)(const bb_model_t *m, int l);
} bb_model_family;

/* A model kind: one per file (gpt.c, mlp.c), listed in model.c's table —
 * its name and configuration, and its family. A decoder kind adds what the
 * decoder stack runs (decoder.h). */
struct bb_model_kind {
    const char *name;      /* --model NAME, state.json's "model" */
    const char *takes;     /* the records it trains on, for --help: "tokens" */
    bb_status (*from_flags)(const bb_model_flags *f, bb_model_config *out);
    bb_status (*from_data)(bb_model_config *c, const bb_record_format *f, const char *path);
    void (*describe)(const bb_model_config *c, char *buf, size_t cap);
    bool (*same_shape)(const bb_model_config *a, const bb_model_config *b);
    int (*to_json)(json_t *obj, const bb_model_config *c); /* 0, or -1 out of memory */
    bb_status (*from_json)(const json_t *obj, const char *file, bb_model_config *c);
    /* optional: member k >= 1 of c's shape family (bb_model_scaled) */
    void (*scaled)(const bb_model_config *c, int k, bb_model_config *out);
    const bb_model_family *family;
    const struct bb_decoder_kind *decoder; /* decoder kinds (decoder.h); NULL otherwise */
    const struct bb_hf_layout *hf; /* its transformers layout (hf.c); NULL: none */
};

/* A kind's transformers layout: hf.c reads and writes the directories
 * (config.json, one model.safetensors or shards with their index), the
 * kind says what its config.json holds and how its tensors are named. */
typedef struct bb_hf_layout {
    const char *model_type, *architecture; /* "llama", "LlamaForCausalLM" */
    const char *positions_key;             /* config.json's key of the positions it supports */
    /* config.json into a configuration (T: its positions); BB_ERR_FORMAT naming the key it cannot represent */
    bb_status (*read_config)(const json_t *cfg, const char *path, bb_model_config *c, int *positions);
    /* the configuration as config.json (eos: bos and eos ids, -1: none); NULL out of memory */
    json_t *(*write_config)(const bb_model_config *c, int eos);
    /* optional: a file's other name for model tensor `name` (gpt: without "transformer."); NULL: none */
    const char *(*alias)(const char *name);
    /* optional: a tensor stored [in, out] (GPT-2's Conv1D), where bigbatch keeps [out, in] */
    bool (*transposed)(const char *name);
    /* optional: a file tensor that is no parameter and is skipped (mask buffers, rotary tables) */
    bool (*skipped)(const char *name);
    /* optional: the model tensor of positions, of which the file may hold more rows than T */
    const char *positions_tensor;
} bb_hf_layout;
extern const bb_hf_layout bb_hf_gpt2, bb_hf_llama;
/* config.json's `key` in *out: an integer in 1 .. 2^24, or `dflt` when
 * absent or null (dflt -1: required). Fails with BB_ERR_FORMAT naming path
 * and key. */
bb_status bb_hf_config_int(const json_t *cfg, const char *path, const char *key, int dflt, int *out);
/* config.json's boolean `key`, which must be `want` when present. Fails
 * with BB_ERR_FORMAT naming path, key and what bigbatch's `kind` needs. */
bb_status bb_hf_config_bool(const json_t *cfg, const char *path, const char *key, bool want, const char *kind);
/* The kind whose layout has this model_type; NULL: none. */
const bb_model_kind *bb_model_kind_of_hf(const char *model_type);
/* "gpt2 (GPT2LMHeadModel), llama (LlamaForCausalLM)" for messages. */
const char *bb_model_hf_types(void);

struct bb_model {
    bb_backend_t *be;
    bb_model_config cfg;
    int B;                   /* micro-batch */
    float *params, *grads;   /* device, param_count floats each; params NULL under a parameter window */
    uint16_t *params16;      /* bf16 precision: the parameters' bf16 copy, the products' weights; else NULL */
    bool weights_stale;      /* params changed since params16 was made: the next forward remakes it */
    size_t param_count;
    bb_tensor_info *tensors;
    int tensor_count, tensor_capacity;
    /* the batch the next forward reads, on the device: batch_sets[current] */
    void *inputs;            /* mlp: float features (B, inputs); gpt: int32 tokens (B, T) */
    int32_t *targets;        /* mlp: (B); gpt: (B, T) */
    int targets_valid;
    struct batch_set *batch_sets; /* (2): the current one and the one being staged (batch.c) */
    int current;
    uint64_t activation_bytes;
    uint64_t host_activation_bytes; /* offloaded blocks' copies in pinned host memory */
    int recomputed_layers;    /* layers (blocks) the last backward re-ran, and */
    int selective_recomputes; /* selective blocks whose dropped tensors it recomputed */
    bb_grad_ready_fn grad_ready;
    void *grad_ready_ctx;
    struct grad_window *window; /* ZeRO-2 (cfg.grad_window_bytes): the gradients' slots; NULL: grads is whole */
    struct param_window *pwindow; /* ZeRO-3 (cfg.param_window_bytes): the weights' slots; NULL: params is whole */
    float *host_weights;     /* under a parameter window: the whole weights lent for init, load and save; else NULL */
    void *impl;
};

/* The kinds (model.c's table lists them). */
extern const bb_model_kind bb_model_kind_gpt, bb_model_kind_llama, bb_model_kind_mlp;

/* ---- safetensors files (safetensors.c), for the model's own and other
 * tools' layouts (gpt_hf.c) ---- */
typedef struct bb_st_entry {
    char name[128], dtype[16];
    uint64_t shape[4], begin, end; /* begin, end: byte offsets into the data */
    int rank;
} bb_st_entry;
typedef struct bb_st_file {
    const uint8_t *map, *data;
    size_t size, data_size;
    bb_st_entry *entries;
    int count;
} bb_st_file;
/* Maps `path` and reads its header; a file with bigbatch's "xxh64" must
 * match it, and no tensor's bytes may overlap another's or leave the
 * file. Fails with BB_ERR_IO, BB_ERR_CORRUPT naming the file (and the
 * tensor), BB_ERR_NOMEM. */
bb_status bb_st_map(const char *path, bb_st_file *f);
void bb_st_unmap(bb_st_file *f);
/* The tensor called `name`; NULL when there is none. */
const bb_st_entry *bb_st_find(const bb_st_file *f, const char *name);
/* "[16]", "[3, 4, 5]": a shape of `rank` dimensions (up to 4) in buf
 * (cap bytes, truncated there); returns buf. Never fails. */
const char *bb_st_shape_text(const uint64_t *shape, int rank, char *buf, size_t cap);
/* One F32 tensor to write. */
typedef struct bb_st_tensor {
    const char *name;
    int rank, shape[2];
    const float *data;
    size_t count;
} bb_st_tensor;
/* Writes `n` tensors in order, with {"format": "pt", "producer", "xxh64"}
 * metadata, through a temporary file renamed into place. Fails with
 * BB_ERR_IO, BB_ERR_NOMEM. */
bb_status bb_st_write(const char *path, const bb_st_tensor *ts, int n);

/* model.c helpers for the kinds */
/* The name a tied LM head is saved under too, as tensor 0 (decoders);
 * NULL: none. */
const char *bb_model_tied_head(const bb_model_config *c);
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
/* param_window.c: the window's slots (at bb_model_alloc_parameters), their
 * release, every slot emptied (the weights changed), a pass's start (its
 * first buckets gathered ahead) and its check (BB_OK, or the first failure of the hook since the start), and a
 * tensor's weights in its bucket's slot, gathered first when the slot holds
 * another bucket (fp32, or for a product the bf16 copy under bf16). A
 * pointer stays valid while the pass uses only its layer's tensors. */
bb_status bb_param_window_alloc(bb_model_t *m);
void bb_param_window_free(bb_model_t *m);
void bb_param_window_invalidate(bb_model_t *m);
void bb_param_window_start(bb_model_t *m, int direction); /* -1: a forward (buckets descend), 1: a backward */
bb_status bb_param_window_check(const bb_model_t *m);
float *bb_param_window_tensor(bb_model_t *m, int tensor);
bb_tensor bb_param_window_weight(bb_model_t *m, int tensor);
uint64_t bb_param_window_bytes(const bb_model_t *m); /* the slots' device bytes */
static inline float *model_param(bb_model_t *m, int tensor)
{
    return m->pwindow ? bb_param_window_tensor(m, tensor) : m->params + m->tensors[tensor].offset;
}
/* A product's weight: the bf16 copy under bf16 precision, else the fp32 parameter. */
static inline bb_tensor model_weight(bb_model_t *m, int tensor)
{
    if (m->pwindow) return bb_param_window_weight(m, tensor);
    return m->params16 ? bb_bf16(m->params16 + m->tensors[tensor].offset) : bb_f32(model_param(m, tensor));
}
/* The whole weights' copies in and out (init, load, save): the device
 * buffer, or under a parameter window the lent host buffer
 * (bb_model_lend_host_weights). Fail like bb_backend_copy, with
 * BB_ERR_UNSUPPORTED under a window with nothing lent. */
bb_status bb_model_weights_in(bb_model_t *m, size_t offset, const void *host, size_t n);
bb_status bb_model_weights_out(bb_model_t *m, float *host, size_t offset, size_t n);
/* The activations' dtype: bf16 under bf16 precision. */
static inline bb_dtype model_act_dtype(const bb_model_t *m)
{
    return m->cfg.precision == BB_PRECISION_BF16 ? BB_DTYPE_BF16 : BB_DTYPE_F32;
}
/* Tells the trainer that gradients from `tensor` to the end are final. */
static inline void model_grads_ready(bb_model_t *m, int tensor)
{
    if (m->grad_ready) m->grad_ready(m->grad_ready_ctx, m->tensors[tensor].offset);
}
/* grad_window.c: a window's layout over buckets `b` — each tensor's bucket
 * (bucket_of: tensor_count ints) and where its slots start (at: ring + 2
 * offsets in floats: slot j < ring as wide as the widest bucket k = j mod
 * ring below the last, slot `ring` the last bucket's; at[ring + 1] their
 * total; at NULL: the buckets only). Never fails. */
void bb_window_layout(const bb_model_t *m, const bb_buckets *b, int ring, int *bucket_of, size_t *at);
/* grad_window.c: the window's slots (at bb_model_alloc_parameters), their
 * release, a backward's start (every bucket unwritten again) and check, and a
 * tensor's gradients in its bucket's slot (the hook first, for a bucket
 * not yet written this backward). Alloc fails like bb_backend_alloc. */
bb_status bb_grad_window_alloc(bb_model_t *m);
void bb_grad_window_free(bb_model_t *m);
void bb_grad_window_start(bb_model_t *m);
/* After a backward: BB_ERR_INTERNAL when a bucket was first written after
 * the window had posted it (a model whose writes break the order). */
bb_status bb_grad_window_check(const bb_model_t *m);
float *bb_grad_window_tensor(bb_model_t *m, int tensor);
static inline float *model_grad(bb_model_t *m, int tensor)
{
    return m->window ? bb_grad_window_tensor(m, tensor) : m->grads + m->tensors[tensor].offset;
}

/* Deterministic streams for initialisation. */
typedef struct init_rng {
    uint64_t state;
} init_rng;
float bb_init_normal(init_rng *r, float std);
float bb_init_uniform(init_rng *r, float bound);

#endif
