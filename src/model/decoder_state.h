/* decoder_state.h — private to the decoder stack (decoder.c, decoder_layout.c,
 * decoder_decode.c): its state. Kinds see decoder.h only. */
#ifndef BIGBATCH_DECODER_STATE_H
#define BIGBATCH_DECODER_STATE_H

#include "decoder.h"

/* Blocks [first, end): one block that saves what its backward reads, or a
 * recomputed run of blocks. */
typedef struct segment {
    int first, end;
    bool recompute; /* saves only its input; re-run before its backward */
} segment;

typedef struct decoder_state {
    const bb_decoder_kind *k;
    bb_decoder_dims d;
    bb_block_layout lay;      /* what a block saves */
    int L, S;                 /* blocks, segments */
    segment *segs;            /* (S) */
    int *seg_of;              /* (L) each block's segment */
    char *policy;             /* (L) each block's BB_RECOMPUTE_* */
    int *block_tensor;        /* (L + 1) each block's first tensor; [L]: the first after the blocks */
    int head;                 /* the LM head's weight: tensor 0 (tied) or the last */
    bb_block_acts **act;      /* (L) each block's activations: its own, or a recompute slot */
    bb_block_acts *slots;     /* (slot_count) saving blocks' own, then the recompute slots */
    int slot_count;
    bb_tensor *seg_in;        /* (S): [0] the embedding, then the saved input of each segment after a
                               * recomputed one; none where the previous block's output is saved anyway */
    bb_dtype dtype;           /* the activations' (and their gradients'): bf16 under bf16 precision */
    float *positions;         /* (T, the kind's width) its position table; NULL: none */
    bb_tensor normed;         /* (BT,C) the final norm's output */
    float *norm_stat[BB_BLOCK_MAX_STATS]; /* (BT) each */
    bb_tensor logits;         /* (chunk, bb_model_logits_stride(V)), the activation dtype: one chunk's logits, then in place
                               * their gradient (the head product's backward operand) */
    double *row_loss;         /* (BT): each token's loss, chunk by chunk; summed once per forward */
    int chunk, chunks;        /* tokens per chunk of the head + loss, and their number */
    float normalizer;         /* the last forward's, for the backward's recomputed chunks */
    bb_tensor dres, dln;      /* backward scratch; a block's other gradients reuse its own slot */
    int computed_segment;     /* the recomputed segment the recompute slots hold; -1: none */
    int last_block;           /* the block whose forward ran last and whose buffers are intact; -1: none */
    bool forward_done;        /* a forward with loss ran: a backward may follow */
    struct decoder_cache *cache; /* incremental decoding's (decoder_decode.c); NULL until used */
    /* offloaded blocks ('o'): each one's copy in pinned host memory, the
     * two device slots they take in turn, which block each slot holds and
     * whether it came back on the copy stream, and the slots' events */
    bb_block_acts *host_acts; /* (L): an offloaded block's tensors and statistics on the host */
    int *oslot;               /* (L): an offloaded block's slot, 0 or 1; -1 for the others */
    int otenant[2];
    bool ofetched[2];
    bb_event_t *oev_compute[2], *oev_out[2], *oev_in[2];
    void **host_owned;        /* the host copies, freed by the destroy */
    size_t *host_owned_bytes;
    int host_count;
    uint64_t host_bytes;
    void **owned;             /* every activation buffer, freed by the destroy */
    int owned_count, owned_cap;
} decoder_state;

/* decoder_layout.c: an offloaded block's bytes of tensors and statistics,
 * and the copies of block l's between its slot and the host (on the copy
 * stream; fail like bb_backend_copy_async). */
bb_status bb_decoder_offload_copy(bb_model_t *m, int l, bool to_host);
/* decoder_layout.c: the state and every activation buffer, once, when the
 * model is made (fails with BB_ERR_ARG: the kind's check, BB_ERR_NOMEM,
 * BB_ERR_OOM; what it made is freed by the destroy, which takes a
 * half-made state); their release; a block's costs for the planner (never
 * fails). */
bb_status bb_decoder_create(bb_model_t *m);
void bb_decoder_destroy(bb_model_t *m);
void bb_decoder_block_costs(const bb_model_config *c, int micro_batch, bb_block_costs *out);
/* Floats of saved tensor k of a block at the model's micro-batch. */
size_t bb_decoder_saved_count(const bb_model_t *m, int k);

/* decoder_decode.c: bb_model_decode for decoders (fails as it does). */
bb_status bb_decoder_decode(bb_model_t *m, int32_t token, int position, float *host_logits);
void bb_decoder_cache_destroy(bb_model_t *m);

#endif /* BIGBATCH_DECODER_STATE_H */
