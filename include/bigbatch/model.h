/* model.h — the models (`gpt`, `mlp`): parameters in one contiguous device
 * buffer and gradients in another of the same layout, forward with loss,
 * backward, activation recompute, safetensors in and out.
 *
 * How to use (one micro-step):
 *   bb_model_config cfg = bb_model_gpt_config(4, 4, 256, 256, 256);  // layers heads d seq vocab
 *   cfg.recompute_every = 1;                         // --checkpoint blocks
 *   bb_model_t *m;
 *   BB_TRY(bb_model_create(be, &cfg, micro_batch, &m));
 *   BB_TRY(bb_model_init(m, seed));
 *   BB_TRY(bb_model_set_batch(m, inputs, targets));  // host arrays, see below
 *   double loss;
 *   BB_TRY(bb_model_forward(m, normalizer, &loss, NULL)); // loss = sum / normalizer
 *   BB_TRY(bb_model_backward(m, accumulate));        // false on the first micro-step
 *   // bb_model_grads(m) now holds d(sum of losses / normalizer)/d(params)
 *
 * Inputs: `mlp` takes float features (B, inputs) and int32 labels (B);
 * `gpt` takes int32 tokens (B, T) and int32 targets (B, T) (-1: ignored).
 * bb_model_set_batch_from_records() converts loader records (image_u8:
 * label then pixels scaled to [0,1]; tokens: T+1 tokens, inputs and targets
 * shifted by one).
 *
 * Recompute (activation checkpointing; --checkpoint, alias --recompute):
 * the layers (mlp) or blocks (decoders: gpt) form segments of
 * `recompute_every` each; the forward saves only each segment's input and
 * the backward recomputes a segment before its backward. 0 saves
 * everything (one segment). A decoder also takes a policy per block
 * (`recompute_plan`, --checkpoint selective|plan:...): 'n' (none) saves
 * everything the block's backward reads, 's' (selective) all but what is
 * cheap and large to recompute (the gpt: its two LayerNorm outputs and its
 * GELU output, 6 of 16 d-wide floats per token), 'f' (full) only its
 * input, re-running the whole block before its backward. The gradients
 * are bitwise the same whatever the policy.
 *
 * bf16 activations (cfg.precision, decoders): every activation the
 * backward reads is rounded to bf16 when it is computed, so the forward,
 * the backward and any recomputation all see the same value; blocks stash
 * them packed in 16 bits and unpack one block at a time into fp32 work
 * buffers. The ops still compute in fp32; LayerNorm statistics, the logits
 * and the backward scratch stay fp32. Recompute stays bitwise free of
 * effect in bf16 too.
 */
#ifndef BIGBATCH_MODEL_H
#define BIGBATCH_MODEL_H

#include "bigbatch/backend.h"
#include "bigbatch/json.h"

#define BB_MLP_MAX_HIDDEN 16
#define BB_RECOMPUTE_MAX_BLOCKS 256 /* blocks a per-block plan can name */
#define BB_RECOMPUTE_NAME_MAX 1040  /* bb_model_recompute_name's longest, NUL included */

/* A block's recompute policy (bb_model_config.recompute_plan): saves
 * everything its backward reads, all but what selective recompute drops,
 * only its input (a full recompute), or everything in pinned host memory
 * (offload: copied there on the copy stream after its forward, back into
 * one of two device slots the offloaded blocks share one block ahead of
 * its backward). */
enum { BB_RECOMPUTE_NONE = 'n', BB_RECOMPUTE_SELECTIVE = 's', BB_RECOMPUTE_FULL = 'f', BB_RECOMPUTE_OFFLOAD = 'o' };

/* ---- model kinds --------------------------------------------------------
 * A kind (gpt, mlp) is one descriptor, defined in its own file (gpt.c,
 * mlp.c) and listed in the kind table (model.c): its name, its own
 * configuration (flags, data, description, JSON), and its family's passes
 * and batches (decoders share the decoder stack, src/model/decoder.c).
 * Code outside src/model asks through the functions below and never
 * branches on a kind. */
typedef struct bb_model_kind bb_model_kind;

/* The kind called `name` ("gpt", "mlp"); NULL when there is none. */
const bb_model_kind *bb_model_kind_find(const char *name);
const char *bb_model_kind_name(const bb_model_kind *k);
/* "gpt|mlp" (for --model's choices) and "gpt (tokens) or mlp (images)". */
const char *bb_model_kind_choices(void);
const char *bb_model_kind_help(void);


/* The gpt's shape when none is given (train, plan, bench, eval). */
#define BB_GPT_DEFAULT_LAYERS 4
#define BB_GPT_DEFAULT_HEADS 4
#define BB_GPT_DEFAULT_D_MODEL 128

/* Each kind's own shape. */
typedef struct bb_gpt_config {
    int layers, heads, d_model, seq_len, vocab;
} bb_gpt_config;
/* A Llama-family decoder: pre-RMSNorm blocks, RoPE on q and k, grouped-query
 * attention (kv_heads dividing heads; head size d_model / heads), a SwiGLU
 * MLP of ffn, no biases, an LM head of its own or tied to the token table. */
typedef struct bb_llama_config {
    int layers, heads, kv_heads, d_model, ffn, seq_len, vocab;
    bool tied;
    double rope_theta, norm_eps; /* as config.json gives them (the ops take them in fp32, as transformers) */
    /* rope_scaling "llama3" (Llama 3.1 and 3.2): rope_factor 0 is none */
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_positions;
} bb_llama_config;
typedef struct bb_mlp_config {
    int inputs, classes;
    int hidden[BB_MLP_MAX_HIDDEN];
    int hidden_count;
} bb_mlp_config;

typedef struct bb_model_config {
    const bb_model_kind *kind;
    /* the kind's shape: the member named after it */
    union {
        bb_gpt_config gpt;
        bb_llama_config llama;
        bb_mlp_config mlp;
    };
    /* layers (mlp: linear layers; decoders: blocks) per recompute segment; 0: none */
    int recompute_every;
    /* decoders: each block's policy, one BB_RECOMPUTE_* letter per block,
     * or one letter for every block ("s": --checkpoint selective); "": as
     * recompute_every says (which a plan overrides) */
    char recompute_plan[BB_RECOMPUTE_MAX_BLOCKS + 1];
    /* decoders: bf16 stores the activations saved for the backward in bf16
     * (the mlp takes fp32 only; its activations are small) */
    bb_precision precision;
    /* decoders: tokens per chunk of the fused LM head + loss (--loss-chunk);
     * 0: chosen by bb_model_loss_chunk. Not part of the shape (nor of
     * state.json): any value trains the same model. */
    int loss_chunk;
    /* ZeRO-2 (train --zero 2): > 0 keeps the gradients in a window of
     * buckets of these bytes (the reducer's), not a whole buffer; see
     * "the gradient window" below. Not part of the shape either. */
    size_t grad_window_bytes;
    /* ZeRO-3 (train --zero 3): > 0 keeps the weights in a window of buckets
     * of these bytes, not a whole buffer; see "the parameter window" below.
     * Not part of the shape. */
    size_t param_window_bytes;
} bb_model_config;

bb_model_config bb_model_mlp_config(int inputs, const int *hidden, int hidden_count, int classes);
bb_model_config bb_model_gpt_config(int layers, int heads, int d_model, int seq_len, int vocab);
/* A llama of transformers' LlamaConfig defaults but the shape: kv_heads =
 * heads, ffn by Llama's rule (bb_llama_ffn), rope_theta 10000, rms_norm_eps
 * 1e-6, untied, no rope scaling. */
bb_model_config bb_model_llama_config(int layers, int heads, int d_model, int seq_len, int vocab);
/* Llama's FFN width rule: 2/3 of 4·d_model, rounded up to a multiple of 256. */
int bb_llama_ffn(int d_model);
/* Parses --checkpoint into c's recompute_every and recompute_plan: none,
 * blocks (every:1), every:K, selective (every block 's'), offload (every
 * block 'o'), or plan:P, P a comma-separated list of one policy per block
 * — n|none, s|selective, f|full, o|offload — each optionally repeated
 * (`s*6`): plan:n,s,f,f or plan:s*6,f*6.
 * Fails with BB_ERR_ARG naming the bad item. A plan's length is checked
 * against the model's blocks when the model is made (bb_model_check_recompute). */
bb_status bb_model_parse_recompute(const char *s, bb_model_config *c);
/* Whether c's recompute policy fits its kind and shape: a plan names every
 * block once (or gives one policy for all) and only kinds with blocks take
 * one. Fails with BB_ERR_ARG saying what differs. */
bb_status bb_model_check_recompute(const bb_model_config *c);
/* What one block's policy costs in activation bytes, for planners of
 * per-block plans (kinds that take them: decoders), indexed by policy: 0
 * 'n', 1 's', 2 'f', 3 'o'. The device's activations of a plan are those
 * of saving everything plus, for every block, own[p] - own[n] (own_last
 * for the last block), once[p] for each policy some block takes (for 'o'
 * once for each of the first two offloaded blocks: the two device slots
 * they take in turn), and after_full for every 'f' or 'o' block but the
 * model's last (the saved input of the block after it); the host's (pinned),
 * `host` for every 'o' block.
 * Exact: tests/test_recompute.c checks it against the allocator for every
 * plan of 4 blocks. Fails with BB_ERR_UNSUPPORTED for kinds without plans. */
typedef struct bb_block_costs {
    uint64_t own[4], own_last[4];
    uint64_t once[4];
    uint64_t after_full;
    uint64_t host;
    /* The backward re-runs every 'f' block but the last 'f' of the plan
     * (true), or every 'f' block but one that is the model's last block
     * (false: bf16, whose work buffers the later blocks overwrite); a
     * selective last block recomputes nothing or little. */
    bool last_full_spared;
} bb_block_costs;
bb_status bb_model_block_costs(const bb_model_config *c, int micro_batch, bb_block_costs *out);
/* The policy letters in bb_block_costs order: "nsfo" (the planner's per-block plans). */
#define BB_RECOMPUTE_LETTERS "nsfo"
/* Block l's policy (0 .. bb_model_layers - 1): BB_RECOMPUTE_NONE,
 * _SELECTIVE, _FULL or _OFFLOAD (every:K's blocks recompute, in segments of K). */
char bb_model_block_recompute(const bb_model_config *c, int l);

/* The shape flags as the command line gave them; each kind takes its own
 * (gpt: --layers --heads --d-model; mlp: --hidden) and refuses the others'. */
typedef struct bb_model_flags {
    int64_t layers, heads, d_model;
    bool layers_given, heads_given, d_model_given;
    const char *const *hidden; /* --hidden's items: "1024,512" or "1024" "512" */
    int hidden_count;          /* 0: not given (the kind's default) */
    /* llama: --preset, --kv-heads, --ffn, --rope-theta, --norm-eps, --tie-embeddings yes|no */
    const char *preset, *tie;
    int64_t kv_heads, ffn;
    double rope_theta, norm_eps;
    bool preset_given, kv_heads_given, ffn_given, rope_theta_given, norm_eps_given, tie_given;
} bb_model_flags;
/* A llama flag appeared (the other kinds refuse them); its name in *flag. */
bool bb_model_flags_llama_given(const bb_model_flags *f, const char **flag);
/* "smollm2-135m|llama-3.2-1b|..." for --preset, and the shape a preset
 * names (seq_len left 0); false for an unknown name. */
const char *bb_llama_preset_choices(void);
bool bb_llama_preset(const char *name, bb_llama_config *out);
/* The configuration of kind `kind` (a name) the flags describe, the data's
 * fields left 0. Fails with BB_ERR_ARG naming the flag. */
bb_status bb_model_config_from_flags(const char *kind, const bb_model_flags *f, bb_model_config *out);
/* Fills what the data decides (gpt: seq_len, vocab; mlp: inputs, classes)
 * from the records of the dataset at `path` (named in the message). Fails
 * with BB_ERR_ARG when the kind cannot take them. */
bb_status bb_model_config_from_data(bb_model_config *c, const bb_record_format *f, const char *path);
/* c takes `from`'s kind and shape (a transformers config's), keeping its
 * own recompute policy, precision and loss chunk. */
void bb_model_config_take_shape(bb_model_config *c, const bb_model_config *from);
/* Same kind and shape (recompute and precision aside). */
bool bb_model_same_shape(const bb_model_config *a, const bb_model_config *b);
/* Member k (>= 1) of c's shape family (plan --largest): the same kind,
 * head size, blocks per width (c's layers over its d_model) and, for a
 * llama, heads per key/value head and SwiGLU width per d_model (rounded to
 * 64); k counts heads (gpt) or key/value heads (llama), so c's own k gives
 * c again where its layers divide evenly. Sequence length, vocabulary,
 * tying and the rest stay c's. Fails with BB_ERR_UNSUPPORTED for kinds
 * without one (mlp), BB_ERR_ARG for k < 1. */
bb_status bb_model_scaled(const bb_model_config *c, int k, bb_model_config *out);
/* What the trainer and the planner count per kind: recomputable layers
 * (decoder blocks, mlp linear layers); targets per example (the loss's
 * normaliser: T tokens or 1 label); logits per target (vocab or classes). */
int bb_model_layers(const bb_model_config *c);
int bb_model_targets_per_example(const bb_model_config *c);
int bb_model_outputs(const bb_model_config *c);
/* The targets are tokens (tokens/s is reported; sample can continue text). */
bool bb_model_targets_are_tokens(const bb_model_config *c);
/* The forward counts argmax hits (classification: evaluation reports accuracy). */
bool bb_model_counts_correct(const bb_model_config *c);
/* The head and loss run in chunks of tokens (decoders; bb_model_loss_chunk). */
bool bb_model_chunks_loss(const bb_model_config *c);
/* state.json's model keys ("model": "gpt" and the shape) set into `obj`;
 * fails with BB_ERR_NOMEM only. Their reader fails with BB_ERR_FORMAT naming
 * `file` and the key when one is missing or of another type, or the kind
 * is unknown. */
bb_status bb_model_config_to_json(json_t *obj, const bb_model_config *c);
bb_status bb_model_config_from_json(const json_t *obj, const char *file, bb_model_config *c);

typedef struct bb_model bb_model_t;

/* Allocates parameters, gradients and activations for micro-batches of
 * `micro_batch` on `be`. Fails with BB_ERR_ARG on an inconsistent shape
 * (e.g. d_model not divisible by heads), BB_ERR_OOM with the allocator's
 * message. */
bb_status bb_model_create(bb_backend_t *be, const bb_model_config *cfg, int micro_batch, bb_model_t **out);
void bb_model_destroy(bb_model_t *m);
const bb_model_config *bb_model_get_config(const bb_model_t *m);
/* "gpt (4 layers, 4 heads, d 128, T 256, vocab 256)" or "mlp (784-1024-10)". */
void bb_model_describe(const bb_model_config *c, char *buf, size_t cap);
/* The recompute policy as --checkpoint spells it, at most
 * BB_RECOMPUTE_NAME_MAX bytes: "none" (also when one segment holds every
 * layer), "blocks", "every:K", "selective", or "plan:n,s*2,f" (runs of one
 * policy written P*N; a plan of one policy by its name). */
void bb_model_recompute_name(const bb_model_config *c, char *buf, size_t cap);
int bb_model_micro_batch(const bb_model_t *m);

/* GPT-2 initialisation for gpt (normal 0.02, residual projections
 * 0.02/sqrt(2·layers), zero biases, unit LayerNorm); PyTorch's nn.Linear
 * default (uniform ±1/sqrt(fan_in)) for mlp. Deterministic in seed. */
bb_status bb_model_init(bb_model_t *m, uint64_t seed);

/* ---- parameters -------------------------------------------------------- */
typedef struct bb_tensor_info {
    char name[64];   /* PyTorch state_dict name, e.g. "transformer.h.0.attn.c_attn.weight" */
    size_t offset;   /* in floats, into the parameter (and gradient) buffer */
    size_t count;
    int rank;
    int shape[2];
    bool decay;      /* weight decay applies (matrices), not biases and norms */
    bool hidden;     /* a matrix between the input and the output (a block's products; not the embeddings, the
                        head, the MLP's first and last layers): what Muon orthogonalizes */
    bool joined;     /* one product writes it with the tensor before (the llama's q, k, v; gate, up):
                        no gradient bucket is cut between them */
} bb_tensor_info;

size_t bb_model_param_count(const bb_model_t *m);
int bb_model_tensor_count(const bb_model_t *m);
const bb_tensor_info *bb_model_tensor(const bb_model_t *m, int index);
/* Device memory; NULL under a parameter window (ZeRO-3). Taking the
 * parameters marks them changed (the caller may write them): a bf16 model
 * remakes its bf16 copy of them, the products' weights, at its next
 * forward. */
float *bb_model_params(bb_model_t *m);
/* Says the parameters changed through a pointer taken earlier (an
 * optimizer step, an all-gather): the same remaking. Never fails. */
void bb_model_weights_changed(bb_model_t *m);
/* The parameters' device bytes: fp32, plus their bf16 copy under bf16 (a
 * parameter window: its slots). */
uint64_t bb_model_parameter_bytes(const bb_model_t *m);
float *bb_model_grads(bb_model_t *m);  /* device memory; NULL under a gradient window (ZeRO-2) */
/* The gradients' device bytes: the whole buffer, or the window's slots. */
uint64_t bb_model_gradient_bytes(const bb_model_t *m);

/* ---- gradient buckets ------------------------------------------------------
 * The parameter buffer cut into buckets from its end (the gradients the
 * backward finishes first): the first holds about 1 MiB (or bucket_bytes
 * when smaller), the rest about bucket_bytes each, never splitting a tensor
 * (as PyTorch DDP) nor a run of joined ones (bb_tensor_info.joined). Bucket b covers floats [lo[b], hi[b]); lo falls with b. */
#define BB_BUCKET_MIB_DEFAULT 25.0 /* --bucket-mib: PyTorch DDP's */
/* MiB to bytes (--bucket-mib; 0: the default). */
static inline size_t bb_bucket_bytes(double mib)
{
    return (size_t)((mib > 0 ? mib : BB_BUCKET_MIB_DEFAULT) * 1048576.0);
}
typedef struct bb_buckets {
    int count;
    size_t *lo, *hi;
} bb_buckets;

/* Fails with BB_ERR_NOMEM. */
bb_status bb_buckets_make(const bb_model_t *m, size_t bucket_bytes, bb_buckets *out);
void bb_buckets_free(bb_buckets *b);

/* ---- the gradient window (ZeRO-2) ------------------------------------------
 * With cfg.grad_window_bytes > 0 the model keeps no whole gradient buffer:
 * bucket b of bb_buckets_make(m, grad_window_bytes) has a slot of its own
 * only while it is written and reduced. The last bucket (the token
 * table's, which a tied head writes first) keeps a slot; the others cycle
 * through BB_GRAD_WINDOW_RING slots (bucket b in slot b mod the ring).
 * The backward writes each micro-step's gradients afresh (accumulate is
 * ignored) and, before it first writes bucket b (b below the last), calls
 * the window's hook: everything from hi[b - 1] on is then final (one bucket
 * of slack: one op may write two adjacent buckets, in either order), and
 * the hook returns once slot b mod the ring is free again (the trainer's:
 * once the reducer has taken bucket b - ring out of it). The gradients of
 * a micro-step leave the model through the reducer alone: bb_model_grads
 * is NULL. */
#define BB_GRAD_WINDOW_RING 3
typedef void (*bb_grad_window_fn)(void *ctx, int bucket, size_t final_from);
/* Before each backward's first write of a bucket (window only); NULL: none. */
void bb_model_set_grad_window_hook(bb_model_t *m, bb_grad_window_fn fn, void *ctx);
/* Bucket b's slot (its hi - lo floats: the layout's [lo[b], hi[b]) of the
 * buckets of `bucket_bytes`). NULL without a window, or when
 * `bucket_bytes` is not the window's. Never fails. */
float *bb_model_grad_bucket(bb_model_t *m, size_t bucket_bytes, int bucket);

/* ---- the parameter window (ZeRO-3) -----------------------------------------
 * With cfg.param_window_bytes > 0 the model keeps no whole weights: bucket b
 * of bb_buckets_make(m, param_window_bytes) is on the device only while a
 * pass uses it, in a slot (and under bf16 its bf16 copy beside it). The
 * last bucket (the token table's, which the embedding and a tied head both
 * read) keeps a slot; the others cycle through a ring of slots (bucket b in
 * slot b mod the ring): twice the most buckets a layer spans, at least
 * BB_PARAM_WINDOW_RING, so that a layer's buckets are all there while it
 * runs and the next layer's are gathered meanwhile. The window calls its
 * hook to gather: BB_GATHER_ISSUE starts filling the slot with the bucket's
 * `n` floats from float `lo` on (the trainer's: from the owners' shards),
 * BB_GATHER_WAIT orders the pass's next work after that fill. A pass's
 * first use of a bucket its slot does not hold issues and waits; a use next
 * to the bucket used before (the forward descends the buckets, the
 * backward ascends them) also issues the next layer's worth in the same
 * direction ahead of their use. A failure of the hook fails the pass. The
 * slots keep their buckets until the weights change
 * (bb_model_weights_changed) or the hook does. Init, load and save, which
 * take the whole weights, use a host buffer the caller lends: */
#define BB_PARAM_WINDOW_RING 3
typedef enum bb_gather_phase { BB_GATHER_ISSUE, BB_GATHER_WAIT } bb_gather_phase;
typedef bb_status (*bb_param_window_fn)(void *ctx, bb_gather_phase phase, int bucket, size_t lo, size_t n, float *slot);
/* The hook of every pass from now on (window only); NULL: none (a pass then fails). */
void bb_model_set_param_window_hook(bb_model_t *m, bb_param_window_fn fn, void *ctx);
/* The ring's slots; 0 without a window. Never fails. */
int bb_model_param_window_ring(const bb_model_t *m);
/* Gathers issued so far, and those of them issued ahead of their first use
 * (prefetched); 0 without a window. Never fails. */
void bb_model_param_window_gathers(const bb_model_t *m, uint64_t *gathers, uint64_t *prefetched);
/* Under a window: bb_model_init, bb_model_load_weights, bb_model_load_safetensors
 * and the savers read and write `host` (param_count floats, the caller's)
 * until lent NULL. Without a lent buffer they fail with BB_ERR_UNSUPPORTED.
 * Without a window: ignored. Never fails. */
void bb_model_lend_host_weights(bb_model_t *m, float *host);

/* ---- a micro-step ------------------------------------------------------ */
/* Copies a batch of `micro_batch` examples (host arrays) to the device.
 * Fails with BB_ERR_ARG when a target is not -1 or below the class count
 * (vocabulary), or a token is outside the vocabulary. Do not change the
 * batch between a forward and its backward. */
bb_status bb_model_set_batch(bb_model_t *m, const void *inputs, const int32_t *targets);
/* A batch whose work is a real one's (tokens or pixels and targets spread
 * over their ranges, the same every time), for benchmarks and calibration.
 * Fails with BB_ERR_NOMEM. */
bb_status bb_model_set_synthetic_batch(bb_model_t *m);
/* Converts `count` (1..micro_batch) loader records of format `f` and sets
 * them as the batch; when count < micro_batch the rest is padding whose
 * targets are ignored (-1), e.g. an evaluation's last batch. Fails with
 * BB_ERR_ARG when the records do not fit the model (kind, shape, token or
 * label out of range). */
bb_status bb_model_set_batch_from_records(bb_model_t *m, const bb_record_format *f, const uint8_t *records,
                                          int count);
/* The same in two halves, so that on a GPU the upload of micro-batch k+1
 * overlaps the compute of micro-batch k. Stage checks the records on the
 * host and queues their upload, straight from `records` (a loader slot:
 * pinned memory on CUDA), into the batch buffer the model is not using
 * (copy stream); where device memory is host memory (the CPU) nothing is
 * copied. Use makes it the batch of the next forward: the compute stream
 * waits for the upload and an op turns the records into inputs and
 * targets. Stage at most one batch ahead. `records` must stay unchanged
 * until the stage call after the next one returns (which waits for this
 * upload) or the backend is synchronized; the worker keeps two loader
 * slots for that. Fails like bb_model_set_batch_from_records. */
bb_status bb_model_stage_records(bb_model_t *m, const bb_record_format *f, const uint8_t *records, int count);
bb_status bb_model_use_staged(bb_model_t *m);
/* Bytes of one of the two device buffers that receive a micro-batch's raw
 * records (backends whose host is not the device; the planner counts them). */
size_t bb_model_record_buffer_bytes(const bb_model_config *c, int micro_batch);
/* Forward pass and loss: *loss = (sum of per-example (mlp) or per-token
 * (gpt) cross-entropy) / normalizer; keeps what backward needs. *correct
 * (may be NULL) gets the number of argmax hits (mlp), or -1 (gpt). */
bb_status bb_model_forward(bb_model_t *m, float normalizer, double *loss, int *correct);
/* Gradients of the last forward's loss: written into the gradient buffer
 * when accumulate is false, added to it when true. */
bb_status bb_model_backward(bb_model_t *m, bool accumulate);
/* Forward pass without the loss; copies to `host_logits` every example's
 * logits at `position` (gpt: a token position, 0..T-1; mlp: 0): (B, vocab)
 * or (B, classes). A backward may not follow. Fails with BB_ERR_ARG for a
 * position out of range. */
bb_status bb_model_logits(bb_model_t *m, int position, float *host_logits);
/* Incremental decoding (gpt; sample): the logits after `token` at
 * `position` of one sequence, the keys and values of positions 0 ..
 * position-1 taken from a cache that the calls for them filled (a call at
 * position 0 starts a new sequence). Each call costs one position's work;
 * the logits are the forward's at that position (up to rounding: products
 * of one row). The cache (layers × T × 3 × d floats) is allocated at the
 * first call. Fails with BB_ERR_ARG for a position past T-1 or not the
 * next one, a token outside the vocabulary, BB_ERR_OOM for the cache,
 * BB_ERR_UNSUPPORTED for kinds without it (mlp). */
bb_status bb_model_decode(bb_model_t *m, int32_t token, int position, float *host_logits);
/* Called during bb_model_backward as soon as the gradients of the buffer's
 * tail [ready_from, param_count) (in floats) are final, ready_from falling
 * tensor by tensor in reverse layer order to 0: the trainer's reducer
 * starts all-reducing those while the backward goes on. NULL: no calls. */
typedef void (*bb_grad_ready_fn)(void *ctx, size_t ready_from);
void bb_model_set_grad_ready(bb_model_t *m, bb_grad_ready_fn fn, void *ctx);
/* Examples (mlp) or target tokens (gpt) the last batch had. */
int bb_model_batch_targets(const bb_model_t *m);

/* The fused LM head + loss (decoders) runs over chunks of this many tokens,
 * so that at most one chunk's logits exist (tokens × bb_model_logits_stride,
 * in the model's precision: fp32, or bf16 with their gradient written over
 * them):
 * c->loss_chunk when set, else as many as fit in `budget` bytes (the
 * device's transient budget, bb_device_transient_budget: 32 MiB on the
 * CPU, a 16th of a GPU's memory) — and never more than the micro-batch's
 * micro_batch × T tokens, nor fewer than 1. 0 for kinds whose loss does not
 * run in chunks (mlp: its logits are small). */
int bb_model_loss_chunk(const bb_model_config *c, int micro_batch, uint64_t budget);
/* The row stride of a chunk's logits: the vocabulary rounded up to a
 * multiple of 64 (as llm.c's padded Vp: GPT-2's 50257 gives 50304), so that
 * every row starts aligned for the products (cuBLAS's fast kernels want
 * 16 bytes). The weights, checkpoints and exports keep the true
 * vocabulary; the padding columns are never computed, read, in the loss
 * or sampled. Cannot fail. */
int bb_model_logits_stride(int vocab);

/* Bytes of activation memory (block/layer slots, saved segment inputs,
 * one chunk of logits, backward scratch), all allocated when the model is
 * created: what the recompute policy and the micro-batch size change. */
uint64_t bb_model_activation_bytes(const bb_model_t *m);
/* The pinned host bytes of the offloaded blocks' activations (policy 'o');
 * 0 without. Never fails. */
uint64_t bb_model_host_activation_bytes(const bb_model_t *m);
/* What the last forward and backward recomputed: layers (blocks) whose
 * forward the backward re-ran, and selective blocks whose dropped tensors
 * it recomputed (the planner's time model counts them). */
void bb_model_recompute_counts(const bb_model_t *m, int *layers, int *selective);

/* ---- weights for other tools: safetensors, F32 ------------------------- */
/* Writes every parameter under its PyTorch name (gpt also writes
 * lm_head.weight, tied to transformer.wte.weight). Fails with BB_ERR_IO. */
bb_status bb_model_save_safetensors(bb_model_t *m, const char *path);
/* Reads every parameter from `path`; fails with BB_ERR_FORMAT naming the
 * tensor when one is missing, has another shape or is not F32, and with
 * BB_ERR_CORRUPT on a malformed file. */
bb_status bb_model_load_safetensors(bb_model_t *m, const char *path);

/* ---- weights in transformers' layout (gpt: GPT2LMHeadModel; llama:
 * LlamaForCausalLM) ----
 * DIR/config.json and DIR/model.safetensors, or the shards of
 * DIR/model.safetensors.index.json (hf.c; gpt_hf.c and llama_hf.c say what
 * maps to what). The kind and shape of DIR's model (*positions: its
 * n_positions or max_position_embeddings; the model made from it uses the
 * data's T, at most that): fails with BB_ERR_IO, BB_ERR_FORMAT naming the
 * key bigbatch cannot represent (model_type; gpt: activation_function,
 * n_inner, layer_norm_epsilon, tie_word_embeddings, scale_attn_*,
 * add_cross_attention; llama: hidden_act, head_dim, attention_bias,
 * mlp_bias, rope_scaling other than llama3's). */
bb_status bb_model_hf_config(const char *dir, bb_model_config *c, int *positions);
/* `path` is a directory with a config.json. */
bool bb_model_is_hf_dir(const char *path);
/* Reads DIR's weights (F32, F16 or BF16; gpt: names with or without
 * "transformer."); fails with BB_ERR_ARG when its vocabulary is not the
 * model's (the data's tokenizer) or it has fewer positions than T,
 * BB_ERR_FORMAT naming the tensor that is missing, of another shape, not
 * the model's, or an lm_head.weight that differs from the embedding,
 * BB_ERR_UNSUPPORTED for kinds without the layout (mlp). */
bb_status bb_model_load_hf(bb_model_t *m, const char *dir);
/* Writes DIR/config.json and the weights (DIR exists) that the kind's
 * transformers class (GPT2LMHeadModel, LlamaForCausalLM) from_pretrained(DIR)
 * loads: one model.safetensors, or past `shard_bytes` (0: never) shards
 * model-0000K-of-0000N.safetensors of at most that many bytes (a larger
 * tensor alone) and model.safetensors.index.json, written last; an earlier
 * export's other weight files are removed. `eos`, the id of the
 * end-of-text token, is config.json's bos_token_id and eos_token_id (so
 * that generate() stops at it), -1: none (the keys left out). Fails with
 * BB_ERR_IO, BB_ERR_UNSUPPORTED (mlp). */
bb_status bb_model_save_hf(bb_model_t *m, const char *dir, int eos, uint64_t shard_bytes);
/* A file name an export --format hf writes (config.json, model.safetensors,
 * the index, model-0000K-of-0000N.safetensors). */
bool bb_model_hf_file(const char *name);
/* --init-from PATH: a transformers directory, else a safetensors file. */
bb_status bb_model_load_weights(bb_model_t *m, const char *path);

#endif /* BIGBATCH_MODEL_H */
