/* gpt_internal.h — private to the gpt: its tensors, what a block keeps,
 * and where each block's activations live (gpt_layout.c makes that, gpt.c
 * computes with it, gpt_kind.c is the kind's descriptor). */
#ifndef BIGBATCH_GPT_INTERNAL_H
#define BIGBATCH_GPT_INTERNAL_H

#include "model_internal.h"

enum { LN1_W, LN1_B, ATTN_W, ATTN_B, PROJ_W, PROJ_B, LN2_W, LN2_B, FC_W, FC_B, FCPROJ_W, FCPROJ_B, PER_BLOCK };
enum { WTE = 0, WPE = 1, FIRST_BLOCK = 2 };
#define BLOCK_TENSOR(l, k) (FIRST_BLOCK + (l) * PER_BLOCK + (k))

typedef struct block_acts {
    float *ln1, *ln1_mean, *ln1_rstd; /* (BT,C), (BT), (BT) */
    float *qkv;                       /* (BT,3C) */
    float *lse;                       /* (B,NH,T) attention's log-sum-exp per row; fp32 always */
    float *atty;                      /* (BT,C) */
    float *res2;                      /* (BT,C) after attention */
    float *ln2, *ln2_mean, *ln2_rstd;
    float *fch, *fch_gelu;            /* (BT,4C) */
    float *res3;                      /* (BT,C) block output */
} block_acts;

/* The tensors of a block that its backward (or the next block) reads, in
 * block_acts order: what bf16 packs. A selective block keeps all but LN1,
 * LN2 and GELU (recomputed). */
enum { KEPT_LN1, KEPT_QKV, KEPT_ATTY, KEPT_RES2, KEPT_LN2, KEPT_FCH, KEPT_GELU, KEPT_RES3, KEPT };

/* Blocks [first, end): one kept block, or a recomputed run of blocks. */
typedef struct segment {
    int first, end;
    bool recompute; /* keeps only its input; re-run before its backward */
} segment;

typedef struct gpt_state {
    int L, S;                /* blocks, segments */
    segment *segs;           /* (S) */
    int *seg_of;             /* (L) each block's segment */
    char *keep;              /* (L) each block's BB_KEEP_* */
    block_acts **act;        /* (L) each block's activations: its own, or a recompute slot */
    block_acts *slots;       /* (slot_count) kept blocks' own, then the recompute slots */
    int slot_count;
    float **seg_in;          /* (S) fp32: [0] the embedding, then the saved input of each segment after a
                              * recomputed one; NULL where the previous block's output is kept anyway */
    bool bf16;
    uint16_t **stash;        /* bf16: (L x KEPT) where block l's tensor k is packed; NULL: not packed
                              * (recomputed, or still in the work buffers at its backward) */
    uint16_t **seg_packed;   /* bf16: (S) packed segment inputs, NULL as seg_in */
    float *x;                /* bf16: (BT,C) the input of the block being computed */
    float *lnf, *lnf_mean, *lnf_rstd;
    float *logits;           /* (chunk, V): one chunk's logits, then their gradient */
    double *row_loss;        /* (BT): each token's loss, chunk by chunk; summed once per forward */
    int chunk, chunks;       /* tokens per chunk of the head + loss, and their number */
    float normalizer;        /* the last forward's, for the backward's recomputed chunks */
    float *dres, *dln;       /* backward scratch; a block's other gradients reuse its own slot */
    int computed_segment;    /* the recomputed segment the recompute slots hold; -1: none */
    int last_block;          /* the block whose forward ran last and whose buffers are intact; -1: none */
    bool forward_done;       /* a forward with loss ran: a backward may follow */
    struct gpt_decode *decode; /* incremental decoding's cache (gpt_decode.c); NULL until used */
    void **owned;            /* every activation buffer, freed by the destroy */
    int owned_count, owned_cap;
} gpt_state;

static inline float **gpt_kept_tensor(block_acts *a, int k)
{
    float **t[KEPT] = {&a->ln1, &a->qkv, &a->atty, &a->res2, &a->ln2, &a->fch, &a->fch_gelu, &a->res3};
    return t[k];
}

/* Floats of kept tensor k at the model's micro-batch. */
size_t bb_gpt_kept_count(const bb_model_t *m, int k);

/* gpt_layout.c: tensors, activation storage, initialisation. gpt.c: the
 * passes. Hooks of bb_model_kind_gpt (gpt_kind.c). */
bb_status bb_gpt_create(bb_model_t *m);
void bb_gpt_destroy(bb_model_t *m);
bb_status bb_gpt_init(bb_model_t *m, uint64_t seed, float *host);
bb_status bb_gpt_forward(bb_model_t *m, float normalizer, double *loss, int *correct);
bb_status bb_gpt_backward(bb_model_t *m, bool acc);
bb_status bb_gpt_logits(bb_model_t *m, int position, float *host);
/* gpt_decode.c: bb_model_decode's hook, and its cache's destroy. */
typedef struct gpt_decode gpt_decode;
bb_status bb_gpt_decode(bb_model_t *m, int32_t token, int position, float *host_logits);
void bb_gpt_decode_destroy(bb_model_t *m, gpt_decode *d);
void bb_gpt_block_costs(const bb_model_config *c, int micro_batch, bb_block_costs *out);

#endif /* BIGBATCH_GPT_INTERNAL_H */
