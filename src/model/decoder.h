/* decoder.h — private: the decoder stack, written once for every
 * decoder-only model kind (gpt; a Llama-style kind plugs in the same way).
 *
 * The stack owns what does not depend on the block: the token embedding's
 * place at the bottom and the fused, chunked LM head at the top, blocks
 * grouped into segments by the recompute plan, where each block's saved
 * activations live under its policy (own storage, a shared recompute slot,
 * the selective scratch), in the activation dtype, the forward and backward passes
 * over segments with their recomputation, the planner's block costs, and
 * incremental decoding with a cache of each block's rows. A kind supplies
 * its block and the pieces around it:
 *
 *   static const bb_decoder_kind my_decoder = {.dims = ..., .block = &my_block, ...};
 *   const bb_model_kind bb_model_kind_mine = {.name = "mine", ..., .family = &bb_decoder_family,
 *                                             .decoder = &my_decoder};
 *
 * A block's forward computes its saved tensors in order into the pass's
 * activations; its backward takes d(output) in pass->dres and leaves
 * d(input) there, spending its own saved tensors as scratch, and
 * recomputes what a selective block dropped (pass->selective) unless its
 * forward ran last and left it in place (pass->fresh). Every recompute
 * policy gives bitwise the same gradients because the recomputed tensors
 * are the same bits as the first time.
 *
 * Tensors: activations and their gradients in the model's activation
 * dtype (model_act_dtype: bf16 under --precision bf16); a product's weight
 * is model_weight() (the bf16 copy under bf16); norms' weights, biases,
 * statistics and every parameter gradient fp32. Decoding runs in fp32 on
 * the master weights whatever the precision. */
#ifndef BIGBATCH_DECODER_H
#define BIGBATCH_DECODER_H

#include "model_internal.h"

enum { BB_BLOCK_MAX_SAVED = 12, BB_BLOCK_MAX_STATS = 8 };

/* What one block saves for its backward, per token, for a configuration:
 * its saved tensors in the order the forward makes them (the last is the
 * block's output, the next block's input, d_model wide), the statistics
 * it keeps in fp32 whatever the precision (LayerNorm's mean and 1/std,
 * attention's log-sum-exp per head), and what a selective block drops. */
typedef struct bb_block_layout {
    int saved;
    int width[BB_BLOCK_MAX_SAVED];     /* elements per token */
    unsigned dropped;                  /* bits: tensors a selective block recomputes instead of saving */
    int reuse[BB_BLOCK_MAX_SAVED];     /* dropped: an earlier dropped tensor whose scratch it reuses
                                        * (the earlier one is dead before this one is recomputed); -1: none */
    int stats;
    int stat_width[BB_BLOCK_MAX_STATS]; /* floats per token */
} bb_block_layout;

/* A block's activations: its saved tensors and statistics. */
typedef struct bb_block_acts {
    bb_tensor t[BB_BLOCK_MAX_SAVED];
    float *stat[BB_BLOCK_MAX_STATS];
} bb_block_acts;

/* One block's pass, as the stack hands it to the kind. */
typedef struct bb_block_pass {
    bb_model_t *m;
    bb_backend_t *be;
    int l, B, T, BT;            /* the block, the micro-batch's shape */
    int tensor;                 /* the block's first parameter tensor (its add_tensors order follows) */
    bb_block_acts *a;           /* where its activations are (its own, or a shared slot) */
    bb_tensor x;                /* its input (BT, C) */
    bb_tensor dres, dln;        /* backward: d(output) in, d(input) out; scratch (BT, C) */
    bool selective;             /* backward: a selective block, which recomputes what it dropped */
    bool fresh;                 /* backward: its forward ran last, so the dropped tensors still hold their values */
    bool accumulate;            /* backward: add to the gradients (later micro-steps) */
    const float *positions;     /* the kind's position table (device; rows 0..T-1), or NULL */
} bb_block_pass;

/* One position of incremental decoding through a block: x (C) in and out,
 * `rows` the block's cache (T rows of its positions' keys then values,
 * 2 × kv_width floats: bb_op_attention_decode's layout, which writes this
 * position's row), `scratch` decode_scratch floats of the device's. */
typedef struct bb_block_decode {
    bb_model_t *m;
    bb_backend_t *be;
    int l, pos;
    int tensor;                 /* the block's first parameter tensor */
    float *x, *rows, *scratch;
    const float *positions;     /* the kind's position table, or NULL */
} bb_block_decode;

typedef struct bb_decoder_block {
    void (*layout)(const bb_model_config *c, bb_block_layout *out);
    /* block l's parameters, through bb_model_add_tensor */
    bb_status (*add_tensors)(bb_model_t *m, int l);
    void (*forward)(bb_block_pass *p);
    void (*backward)(bb_block_pass *p);
    /* decoding: floats of scratch, one position */
    size_t (*decode_scratch)(const bb_model_config *c);
    void (*decode)(bb_block_decode *d);
} bb_decoder_block;

typedef struct bb_decoder_dims {
    int layers, seq_len, d_model, vocab;
    int kv_width; /* a position's keys (as many floats as its values): key/value heads × head size */
} bb_decoder_dims;

/* A decoder kind: its block, and the embedding, final norm and head around it. */
typedef struct bb_decoder_kind {
    void (*dims)(const bb_model_config *c, bb_decoder_dims *out);
    /* the shape makes sense (BB_ERR_ARG naming the flag otherwise) */
    bb_status (*check)(const bb_model_config *c);
    const bb_decoder_block *block;
    /* the tensors before the blocks (the token table first: the tied head's) and after them */
    bb_status (*add_stem_tensors)(bb_model_t *m);
    bb_status (*add_final_tensors)(bb_model_t *m);
    /* out (n, C) = the embedding of tokens at positions pos0 .. (rows of T; decoding: one row at pos0) */
    void (*embed)(bb_model_t *m, bb_tensor out, const int32_t *tokens, int B, int T, int pos0);
    /* the stem's gradients from dout (B·T, C); `token_table_started`: the tied head already wrote its part */
    void (*embed_backward)(bb_model_t *m, bb_tensor dout, const int32_t *tokens, bool accumulate,
                           bool token_table_started);
    /* the final norm over n rows, its statistics in stats[0..norm_stats) (n floats each); the backward
     * writes d(input) into din */
    int norm_stats;
    void (*norm_forward)(bb_model_t *m, bb_tensor out, float *const *stats, bb_tensor in, int n);
    bb_status (*norm_backward)(bb_model_t *m, bb_tensor din, bb_tensor dout, bb_tensor in, float *const *stats,
                               int n, bool accumulate);
    /* the LM head's weight (V, C): tied to the token table (tensor 0), saved a second time under the
     * name this returns; NULL: the head is a tensor of its own, the last one */
    const char *(*tied_head)(const bb_model_config *c);
    /* optional: floats per position of a table the blocks read (RoPE's cosines and sines), written for
     * positions 0..seq_len-1 into host when host is not NULL; the stack keeps it on the device */
    size_t (*position_table)(const bb_model_config *c, float *host);
    bb_status (*init)(bb_model_t *m, uint64_t seed, float *host);
} bb_decoder_kind;

/* The decoder family: model ops, batches and counts for every decoder kind. */
extern const bb_model_family bb_decoder_family;

/* The first tensor after the blocks (the final norm's). */
int bb_decoder_final_tensor(const bb_model_t *m);

/* A decoder's token shape from the data's records (from_data): T and the
 * vocabulary; BB_ERR_ARG naming `path` for records that are not tokens. */
bb_status bb_decoder_token_shape(const bb_record_format *f, const char *path, const char *kind, int *seq_len,
                                 int *vocab);

#endif /* BIGBATCH_DECODER_H */
