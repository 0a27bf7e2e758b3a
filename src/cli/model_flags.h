/* model_flags.h — private: the model and data flags that train, eval and
 * sample share. */
#ifndef BIGBATCH_CLI_MODEL_FLAGS_H
#define BIGBATCH_CLI_MODEL_FLAGS_H

#include "bigbatch/model.h"

typedef struct model_flags {
    const char *kind, *checkpoint;
    bb_model_flags shape;               /* --layers, --heads, --d-model and the llama flags */
    bb_str_list hidden;
    int64_t loss_chunk;
    bool shape_given, checkpoint_given; /* --model or --hidden, --checkpoint appeared */
    bool loss_chunk_given;
} model_flags;

#define MODEL_SHAPE_DEFAULT                                                                                    \
    {.layers = BB_GPT_DEFAULT_LAYERS, .heads = BB_GPT_DEFAULT_HEADS, .d_model = BB_GPT_DEFAULT_D_MODEL, .tie = "no"}
#define MODEL_FLAGS_DEFAULT {.kind = "gpt", .checkpoint = "none", .shape = MODEL_SHAPE_DEFAULT}

/* --init-from DIR, a transformers directory: its config.json's shape into
 * c (the recompute policy and the loss chunk stay the flags'); fails with
 * BB_ERR_ARG when a shape flag was given too, as bb_model_hf_config. */
bb_status model_flags_hf_shape(const model_flags *f, const char *dir, bb_model_config *c);

/* The shape rows of a decoder (a bb_model_flags s): --layers, --heads, --d-model and the llama's. */
#define MODEL_SHAPE_OPTS(s)                                                                                    \
    {"--layers", BB_OPT_INT, &(s).layers, "L", "gpt, llama: transformer blocks", .min = 1, .max = 1024,        \
     .given = &(s).layers_given},                                                                              \
    {"--heads", BB_OPT_INT, &(s).heads, "H", "gpt, llama: attention heads (divide --d-model)", .min = 1,       \
     .max = 1024, .given = &(s).heads_given},                                                                  \
    {"--d-model", BB_OPT_INT, &(s).d_model, "D", "gpt, llama: width", .min = 1, .max = 1 << 16,                \
     .given = &(s).d_model_given},                                                                             \
    {"--preset", BB_OPT_CHOICE, &(s).preset, "NAME", "llama: a published shape (the flags above change it; T " \
     "comes from the data, or plan's and bench model's --seq-len)", .choices = bb_llama_preset_choices(),      \
     .given = &(s).preset_given},                                                                              \
    {"--kv-heads", BB_OPT_INT, &(s).kv_heads, "H", "llama: key/value heads, dividing --heads (1: multi-query; " \
     "default: --heads)", .min = 1, .max = 1024, .given = &(s).kv_heads_given},                                \
    {"--ffn", BB_OPT_INT, &(s).ffn, "N", "llama: SwiGLU width (default: 2/3 of 4 x --d-model, rounded up to " \
     "256)", .min = 1, .max = 1 << 20, .given = &(s).ffn_given},                                               \
    {"--rope-theta", BB_OPT_DOUBLE, &(s).rope_theta, "THETA", "llama: RoPE base (default 10000)", .min = 1.0001, \
     .max = 1e12, .given = &(s).rope_theta_given},                                                             \
    {"--norm-eps", BB_OPT_DOUBLE, &(s).norm_eps, "EPS", "llama: RMSNorm epsilon (default 1e-6)", .min = 1e-12, \
     .max = 1, .given = &(s).norm_eps_given},                                                                  \
    {"--tie-embeddings", BB_OPT_CHOICE, &(s).tie, "yes|no", "llama: the LM head is the token table (default no)", \
     .choices = "yes|no", .given = &(s).tie_given}
/* The option-table rows for model_flags: --model, the shape flags, --checkpoint and its alias --recompute,
 * --loss-chunk. */
#define MODEL_FLAG_OPTS(f)                                                                                     \
    {"--model", BB_OPT_CHOICE, &(f).kind, "KIND", bb_model_kind_help(), .choices = bb_model_kind_choices(),   \
     .given = &(f).shape_given},                                                                               \
    MODEL_SHAPE_OPTS((f).shape),                                                                               \
    {"--hidden", BB_OPT_LIST, &(f).hidden, "N,N...", "mlp: hidden layer sizes (default: 1024,1024)",           \
     .given = &(f).shape_given},                                                                               \
    {"--checkpoint", BB_OPT_STRING, &(f).checkpoint, "POLICY",                                                \
     "activation checkpointing (recompute): none, selective (recompute each block's LayerNorm and GELU "       \
     "outputs), blocks (save one block's input per block), offload (every block's saved tensors in pinned "    \
     "host memory, copied out after its forward and back one block ahead of its backward), every:K, plan:P "  \
     "(per block n|s|f|o, e.g. plan:s*6,f*6 or plan:o*4,n*8; one entry: every block; train: also auto)",       \
     .given = &(f).checkpoint_given},                                                                          \
    {"--recompute", BB_OPT_STRING, &(f).checkpoint, "POLICY", "the same as --checkpoint",                     \
     .given = &(f).checkpoint_given},                                                                          \
    {"--loss-chunk", BB_OPT_INT, &(f).loss_chunk, "TOKENS", LOSS_CHUNK_HELP, .min = 0, .max = 1 << 30,         \
     .given = &(f).loss_chunk_given}
#define LOSS_CHUNK_HELP                                                                                        \
    "gpt: tokens per chunk of the fused LM head + loss (at most one chunk's logits exist); 0: as many as 32 MiB " \
    "of logits hold, less under --device-mem"

/* Rows that train, plan and bench share, with the same help everywhere:
 * the run's devices (a const char * for devices_flag_parse), precision
 * (a bb_precision), attention (a bb_attention), global batch (an int),
 * optimizer (a bb_optimizer_kind); `given` may be NULL. */
#define DEVICES_FLAG_OPT(dest, given_)                                                                         \
    {"--devices", BB_OPT_STRING, &(dest), "LIST", "cpu:N (N worker threads, the cores divided among them), "    \
     "cuda:all or cuda:0,1; under mpirun/srun, each process's own (cuda:local: one GPU a process); plan counts " \
     "a list of GPUs that need not be on this machine (cuda:0,1,2,3 plans for four)", .given = (given_)}
#define PRECISION_FLAG_OPT(dest, given_)                                                                       \
    {"--precision", BB_OPT_ENUM, &(dest), "P", "fp32, or bf16: a gpt's activations and their gradients are bf16 " \
     "tensors (about half the activation memory), products on bf16 operands with fp32 sums (GPUs: tensor " \
     "cores; CPUs: oneDNN with AMX, else OpenBLAS; the banner says which); LayerNorm statistics, the loss, " \
     "weight gradients, master weights and optimizer state stay fp32", .choices = "fp32|bf16", .given = (given_)}
#define ATTENTION_FLAG_OPT(dest)                                                                               \
    {"--attention", BB_OPT_ENUM, &(dest), "WHO", "GPUs, bf16: auto (cuDNN's fused attention where it loads "    \
     "and runs, else bigbatch's kernels after one warning), cudnn (or fail), kernels (bigbatch's always)",       \
     .choices = "auto|cudnn|kernels"}
#define GLOBAL_BATCH_FLAG_OPT(dest, given_)                                                                    \
    {"--global-batch", BB_OPT_I32, &(dest), "G", "examples per optimizer step", .min = 1, .max = 1 << 30,       \
     .given = (given_)}
#define OPTIMIZER_FLAG_OPT(dest, given_)                                                                       \
    {"--optimizer", BB_OPT_ENUM, &(dest), "NAME", bb_optimizer_help(), .choices = bb_optimizer_choices(),       \
     .given = (given_)}
/* The memory rows of train and plan: --device-mem (a uint64_t), --zero (an
 * int), --zero-shards (a bb_param_shard_rule), --bucket-mib (a double),
 * --offload (a bb_offload), --host-mem (a uint64_t); the given flags may be
 * NULL. */
#define MEMORY_FLAG_OPTS(device_mem, zero, zero_shards, bucket_mib, offload, host_mem, link_gbps, zero_given,    \
                         shards_given, bucket_given)                                                            \
    {"--device-mem", BB_OPT_BYTES, &(device_mem), "BYTES", "each device's memory, a cap (e.g. 512MiB, 16GiB); " \
     "0: none"},                                                                                                \
    {"--zero", BB_OPT_ENUM, &(zero), "STAGE", "1: ZeRO-1, each device keeps the optimizer state of its shard "  \
     "only (saves (N-1)/N of it on N devices) and the updated weights are gathered; 2: ZeRO-2, the gradients " \
     "too: each micro-step's are reduced bucket by bucket into the shards during the backward, and a device " \
     "keeps a few buckets of them instead of all; 3: ZeRO-3, the weights too: each device keeps its shard's "   \
     "fp32 weights and gathers a layer's buckets of them ahead of a pass's use; auto: the lowest stage at "   \
     "which the planner fits the batch in --device-mem",                                                       \
     .choices = "0|1|2|3|auto", .given = (zero_given)},                                                          \
    {"--zero-shards", BB_OPT_ENUM, &(zero_shards), "RULE", "how --zero cuts each gradient bucket among the "  \
     "devices: auto (the optimizer's rule), elements (equal slices: NCCL reduce-scatters and all-gathers them) " \
     "or tensors (whole tensors, as an update of whole matrices needs)", .choices = "auto|elements|tensors",   \
     .given = (shards_given)},                                                                                  \
    {"--bucket-mib", BB_OPT_DOUBLE, &(bucket_mib), "MIB", "gradient bucket size for the reducer, which ZeRO-1's " \
     "shards follow (the first bucket is 1 MiB, as in PyTorch DDP)", .min = 0.001, .max = 65536,               \
     .given = (bucket_given)},                                                                                  \
    {"--offload", BB_OPT_ENUM, &(offload), "WHAT", "optimizer: each device's optimizer state and fp32 master "  \
     "weights in pinned host memory and its step on the host CPUs (the gradients copied down, the updated "    \
     "weights up, chunk by chunk while the host steps); auto: only when the planner cannot fit the batch "      \
     "without it", .choices = "none|optimizer|auto"},                                                         \
    {"--host-mem", BB_OPT_BYTES, &(host_mem), "BYTES", "per device, the host memory --offload may pin (e.g. "    \
     "64GiB); 0: no cap"},                                                                                      \
    {"--link-gbps", BB_OPT_DOUBLE, &(link_gbps), "GB/S", "the bandwidth between a GPU and pinned host memory "     \
     "with which --checkpoint auto prices offloading a block's activations (policy o) against recomputing "   \
     "them; 0: the one plan --calibrate measured (without either, o is not offered)", .min = 0, .max = 1e6}

/* The loader's rows, the same in train and bench loader: --loader-threads
 * (an int), --io (a bb_io_mode), --direct, --shuffle-frames (a uint32_t);
 * threads_given and frames_given may be NULL. */
#define LOADER_FLAG_OPTS(threads, io, direct, frames, threads_given, frames_given)                              \
    {"--loader-threads", BB_OPT_I32, &(threads), "N", "threads reading and decompressing shards", .min = 1,    \
     .max = 256, .given = (threads_given)},                                                                     \
    {"--io", BB_OPT_ENUM, &(io), "MODE", "how the loader reads frames: auto (io_uring, else pread), uring or "  \
     "pread", .choices = "auto|uring|pread"},                                                                   \
    {"--direct", BB_OPT_FLAG, &(direct), NULL, "read shards with O_DIRECT (bypasses the page cache)"},          \
    {"--shuffle-frames", BB_OPT_U32, &(frames), "W", "frames per shuffle window (the data order depends on "  \
     "it)", .min = 1, .max = 1 << 20, .given = (frames_given)}

/* Any shape flag appeared (--model, a gpt's or an mlp's). */
static inline bool model_flags_shape_given(const model_flags *f)
{
    const bb_model_flags *s = &f->shape;
    return f->shape_given || s->layers_given || s->heads_given || s->d_model_given || s->preset_given ||
           s->kv_heads_given || s->ffn_given || s->rope_theta_given || s->norm_eps_given || s->tie_given;
}
/* The model configuration the flags describe; the data fills seq_len and
 * vocab (gpt) or inputs and classes (mlp). Fails with BB_ERR_ARG (also for
 * --loss-chunk on a kind whose loss does not run in chunks). */
bb_status model_flags_config(const model_flags *f, bb_model_config *out);
/* The records a dataset of sequences of T tokens (T+1 a record) and a
 * vocabulary of V would have: what plan --seq-len and bench model give a
 * model in place of data. */
bb_record_format token_records(int T, uint32_t V);
/* Sets c->loss_chunk from --loss-chunk; fails with BB_ERR_ARG when it was
 * given for a kind that does not chunk its loss. */
bb_status loss_chunk_flag(const model_flags *f, bb_model_config *c);
/* Fills the data-given fields of `c` from the dataset at `path`;
 * *record_size (may be NULL) gets its bytes per record. */
bb_status model_config_from_data(const char *path, bb_model_config *c, uint32_t *record_size);
/* --devices, the same in train, plan and bench: bb_devices_parse (train.h)
 * naming the flag. */
bb_status devices_flag_parse(const char *s, bool must_exist, int *count, bb_device_kind *kind, int *ids);
/* The same for commands that run on one device (bench): *id is the GPU's. */
bb_status device_flag_parse_one(const char *s, bb_device_kind *kind, int *id);
/* The default --data (data/kjv, relative to the current directory) is
 * there, or was not needed (`given`). Fails with BB_ERR_ARG saying what
 * the default meant and how to pass another. */
bb_status default_data_present(const char *data, bool given);
/* `dir`/<sub> when that directory exists (data/kjv -> data/kjv/train),
 * else NULL. The string lasts as long as the command (up to 8 per command). */
const char *resolve_split(const char *dir, const char *sub);

#endif
