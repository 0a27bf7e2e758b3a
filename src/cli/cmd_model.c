/* cmd_model.c — commands on trained weights: `eval`, `export`, `sample`. */
#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bigbatch/json.h"
#include "bigbatch/tokenizer.h"
#include "bigbatch/train.h"
#include "commands.h"
#include "data_flags.h"
#include "model_flags.h"

/* A one-device model (on `device`, "cpu" or "cuda:N"; NULL: the CPU) from
 * a checkpoint (--ckpt), or (--init-from; the data gives the rest) from a
 * safetensors file and the model flags or a transformers directory and
 * its config.json. */
static bb_status load_model(const char *ckpt, const char *init_from, const model_flags *mf, const char *data,
                            const char *device, int micro_batch, bb_backend_t **be, bb_model_t **m)
{
    bb_model_config c;
    bb_checkpoint_info info;
    if (!ckpt == !init_from) return bb_fail(BB_ERR_ARG, "give either --ckpt DIR or --init-from FILE");
    if (ckpt) {
        BB_TRY(bb_checkpoint_read_info(ckpt, &info));
        c = info.model;
    } else {
        struct stat st;
        bool hf = bb_model_is_hf_dir(init_from);
        if (!hf && stat(init_from, &st) == 0 && S_ISDIR(st.st_mode))
            return bb_fail(BB_ERR_IO, "--init-from %s is a directory, not a .safetensors file, and holds no "
                           "config.json of a transformers model (a checkpoint directory is read with --ckpt)", init_from);
        static const model_flags defaults = MODEL_FLAGS_DEFAULT;
        BB_TRY(model_flags_config(mf ? mf : &defaults, &c));
        if (hf) BB_TRY(model_flags_hf_shape(mf ? mf : &defaults, init_from, &c));
        if (!hf || data) { /* else sample: the model as config.json says, all its positions */
            if (!data)
                return bb_fail(BB_ERR_ARG, "--init-from needs --data (it gives the model's input and output sizes)");
            BB_TRY(model_config_from_data(data, &c, NULL));
        }
    }
    if (mf && mf->checkpoint_given) { /* checked against the model, as train checks it, though it changes nothing */
        bb_model_config policy = c;
        BB_TRY(bb_model_parse_recompute(mf->checkpoint, &policy));
        BB_TRY(bb_model_check_recompute(&policy));
        BB_WARN("--checkpoint %s: evaluation runs forward passes, which keep nothing for a backward: no policy "
                "changes what it computes or holds", mf->checkpoint);
    }
    c.recompute_every = 0;
    c.precision = BB_PRECISION_FP32; /* a forward only: nothing is kept for a backward */
    if (mf) BB_TRY(loss_chunk_flag(mf, &c));
    bb_backend_options bo = {0};
    bb_device_kind kind = BB_DEVICE_CPU;
    if (device) BB_TRY(device_flag_parse_one(device, &kind, &bo.device));
    BB_TRY(bb_backend_create(kind, &bo, be));
    BB_TRY(bb_model_create(*be, &c, micro_batch, m));
    BB_TRY(ckpt ? bb_checkpoint_load_weights(&info, *m) : bb_model_load_weights(*m, init_from));
    /* NaN or infinite weights give no answer worth printing */
    size_t n = bb_model_param_count(*m);
    float *p = malloc(n * sizeof *p);
    bb_status rc = p ? bb_backend_copy(*be, p, bb_model_params(*m), n * sizeof *p, BB_COPY_D2H)
                     : bb_fail(BB_ERR_NOMEM, "out of memory");
    for (int i = 0; rc == BB_OK && i < bb_model_tensor_count(*m); i++) {
        const bb_tensor_info *t = bb_model_tensor(*m, i);
        size_t bad = 0;
        for (size_t k = 0; k < t->count; k++) bad += !isfinite(p[t->offset + k]);
        if (bad)
            rc = bb_fail(BB_ERR_FORMAT, "%s: tensor %s holds %zu non-finite weights (NaN or infinite): nothing to "
                         "evaluate, sample or export", ckpt ? info.dir : init_from, t->name, bad);
    }
    free(p);
    return rc;
}

/* A model of tokens reads data of its own vocabulary only (token ids of
 * another tokenizer would evaluate without an error, and mean nothing). */
static bb_status same_vocabulary(const bb_model_t *m, const bb_dataset_t *ds, const char *weights)
{
    const bb_model_config *c = bb_model_get_config(m);
    const bb_shard_meta *meta = bb_dataset_meta(ds);
    uint32_t v = meta->classes_or_vocab;
    bool tokens = meta->kind == BB_RECORD_TOKENS_U16 || meta->kind == BB_RECORD_TOKENS_U32; /* else: the kind's error */
    if (!bb_model_targets_are_tokens(c) || !tokens || v == (uint32_t)bb_model_outputs(c)) return BB_OK;
    return bb_fail(BB_ERR_ARG, "%s has a vocabulary of %u tokens, the model %s one of %d: the data was packed with "
                   "another tokenizer", bb_dataset_path(ds), v, weights, bb_model_outputs(c));
}

static const char *eval_split(const char *data)
{
    const char *s = resolve_split(data, "val");
    if (!s) s = resolve_split(data, "test");
    return s ? s : data;
}

int bb_cmd_eval(int argc, char **argv)
{
    static const char usage[] = "bigbatch eval (--ckpt DIR [--data DIR] | --init-from PATH [model flags] --data DIR) "
                                "[--json]";
    static const char summary[] =
        "Runs every record of a dataset through the model and prints the mean loss (per\n"
        "example for mlp, per token for gpt) and, for mlp, the accuracy. --data DIR may be a\n"
        "dataset or a directory with val/ (or test/) inside; with --ckpt it defaults to the\n"
        "run's validation data (else its training data), as the checkpoint recorded them.";
    model_flags mf = MODEL_FLAGS_DEFAULT;
    data_flags df = DATA_FLAGS_DEFAULT;
    const char *ckpt = NULL, *init_from = NULL, *data = NULL;
    int64_t micro_batch = 32;
    bool json = false;
    const bb_opt opts[] = {
        {"--ckpt", BB_OPT_STRING, &ckpt, "DIR", "a checkpoint directory written by train --save"},
        {"--init-from", BB_OPT_STRING, &init_from, "PATH", "a .safetensors file (with the model flags), or a "
         "transformers GPT2LMHeadModel or LlamaForCausalLM directory"},
        {"--data", BB_OPT_STRING, &data, "DIR|URL", "the dataset to evaluate on, local or s3:// or https:// "
         "(--ckpt: default the run's validation data, else its training data)"},
        DATA_FLAGS_OPTS(df),
        {"--micro-batch", BB_OPT_INT, &micro_batch, "B", "examples per forward pass", .min = 1, .max = 1 << 20},
        {"--json", BB_OPT_FLAG, &json, NULL, "print one JSON object: loss, accuracy, records"},
        MODEL_FLAG_OPTS(mf),
        {0}};
    bb_backend_t *be = NULL;
    bb_model_t *m = NULL;
    bb_dataset_t *ds = NULL;
    bb_eval_result r;
    bb_status rc = bb_cli_parse("eval", opts, argc, argv, NULL);
    bb_checkpoint_info info;
    if (rc == BB_OK && !data && ckpt && (rc = bb_checkpoint_read_info(ckpt, &info)) == BB_OK)
        data = info.val_data_url[0] ? info.val_data_url /* what the run recorded, validation first; */
               : info.val_data[0]   ? info.val_data     /* remote data fetched again */
               : info.data_url[0]   ? info.data_url
                                    : info.data;
    if (rc == BB_OK) rc = data_flags_resolve(&df, &data, false);
    if (rc == BB_OK && data) data = eval_split(data); /* none: load_model says --init-from needs it */
    if (rc == BB_OK) rc = load_model(ckpt, init_from, &mf, data, NULL, (int)micro_batch, &be, &m);
    if (rc == BB_OK) rc = bb_dataset_open(data, &ds);
    bb_tokenizer_t *tok = NULL;
    if (rc == BB_OK) rc = same_vocabulary(m, ds, ckpt ? ckpt : init_from);
    if (rc == BB_OK) rc = bb_tokenizer_of_dataset(data, &tok);
    uint32_t *token_bytes = tok ? bb_tokenizer_byte_lengths(tok) : NULL;
    bb_tokenizer_destroy(tok);
    bb_eval_options eo = {.progress = stderr, .label = "eval", .interrupted = &bb_cli_interrupted,
                          .token_bytes = token_bytes};
    if (rc == BB_OK) rc = bb_evaluate(m, ds, &eo, &r);
    free(token_bytes);
    if (rc == BB_OK && json) {
        json_t *o = json_pack("{s:o, s:o, s:o, s:I}", "loss", bb_json_real(r.loss, 7), "accuracy",
                              bb_json_fixed(r.accuracy, 6), "bits_per_byte", bb_json_real(r.bits_per_byte, 7),
                              "records", (json_int_t)r.records);
        rc = bb_json_write_line(stdout, o);
        json_decref(o);
    } else if (rc == BB_OK) {
        printf("%s: %llu records, loss %.4f", data, (unsigned long long)r.records, r.loss);
        if (!isnan(r.accuracy)) printf(", accuracy %.2f%%", 100 * r.accuracy);
        if (!isnan(r.bits_per_byte)) printf(", %.4f bits per byte", r.bits_per_byte);
        printf("\n");
    }
    bb_dataset_close(ds);
    bb_model_destroy(m);
    bb_backend_destroy(be);
    int code = bb_cli_report(rc, usage, summary, opts);
    bb_cli_free(opts, NULL);
    return code;
}

/* The end-of-text token's id for config.json: "<|endoftext|>" in the
 * checkpoint's tokenizer (which `tokenizer train` and GPT-2's have), else
 * GPT-2's 50256 for its vocabulary of 50257; -1: none. */
static int end_of_text_id(const char *tokenizer, int vocab)
{
    bb_tokenizer_t *t = NULL;
    if (access(tokenizer, F_OK) != 0 || bb_tokenizer_load(tokenizer, &t) != BB_OK) {
        bb_tokenizer_destroy(t);
        return vocab == 50257 ? 50256 : -1;
    }
    static const char eot[] = "<|endoftext|>";
    bb_tokens ids = {0};
    size_t len = 0;
    int id = -1;
    if (bb_tokenizer_encode(t, (const uint8_t *)eot, sizeof eot - 1, &ids) == BB_OK && ids.n == 1) {
        const uint8_t *bytes = bb_tokenizer_token_bytes(t, ids.v[0], &len);
        if (bytes && len == sizeof eot - 1 && !memcmp(bytes, eot, len)) id = (int)ids.v[0];
    }
    bb_tokens_free(&ids);
    bb_tokenizer_destroy(t);
    return id;
}

/* export --format hf: DIR (made if missing; only what an export writes may
 * be in it) gets model.safetensors, config.json and the checkpoint's
 * tokenizer.json, each through a temporary file renamed into place. */
static bb_status export_hf(bb_model_t *m, const bb_checkpoint_info *info, const char *dir, uint64_t shard_bytes)
{
    struct stat st;
    if (stat(dir, &st) == 0 && !S_ISDIR(st.st_mode))
        return bb_fail(BB_ERR_IO, "--out %s exists and is not a directory (--format hf writes a directory)", dir);
    if (stat(dir, &st) != 0 && (bb_make_parents(dir, NULL) != BB_OK || mkdir(dir, 0755) != 0))
        return bb_fail_errno(BB_ERR_IO, "--out %s: cannot create the directory", dir);
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        bool known = e->d_name[0] == '.' || bb_model_hf_file(e->d_name) || !strcmp(e->d_name, BB_TOKENIZER_FILE);
        if (!known) {
            closedir(d);
            return bb_fail(BB_ERR_IO, "--out %s holds %s, which an export does not write: give an empty or new "
                           "directory", dir, e->d_name);
        }
    }
    if (d) closedir(d);
    char from[4200], to[4200], tmp[4300];
    snprintf(from, sizeof from, "%s/%s", info->dir, BB_TOKENIZER_FILE);
    BB_TRY(bb_model_save_hf(m, dir, end_of_text_id(from, bb_model_outputs(bb_model_get_config(m))), shard_bytes));
    snprintf(to, sizeof to, "%s/%s", dir, BB_TOKENIZER_FILE);
    if (access(from, F_OK)) return BB_OK;
    snprintf(tmp, sizeof tmp, "%s.tmp-%d", to, (int)getpid());
    BB_TRY(bb_copy_file(from, tmp));
    if (rename(tmp, to) != 0) {
        unlink(tmp);
        return bb_fail_errno(BB_ERR_IO, "%s: cannot rename into place", to);
    }
    return BB_OK;
}

int bb_cmd_export(int argc, char **argv)
{
    static const char usage[] = "bigbatch export --ckpt DIR --out FILE.safetensors | --format hf --out DIR";
    static const char summary[] =
        "Writes the weights of DIR's latest checkpoint: as one safetensors file under PyTorch\n"
        "names (--format safetensors), or as a transformers directory (--format hf: a gpt as\n"
        "GPT2LMHeadModel, with GPT-2's Conv1D layout; a llama as LlamaForCausalLM): config.json,\n"
        "model.safetensors (or shards and their index past --shard-size) and the checkpoint's\n"
        "tokenizer.json, which the class's from_pretrained(DIR) loads.";
    const char *ckpt = NULL, *out = NULL, *format = "safetensors";
    uint64_t shard_bytes = 5ull << 30;
    const bb_opt opts[] = {
        {"--ckpt", BB_OPT_STRING, &ckpt, "DIR", "a checkpoint directory written by train --save", .required = true},
        {"--out", BB_OPT_STRING, &out, "PATH", "the .safetensors file, or (hf) the directory, to write",
         .required = true},
        {"--format", BB_OPT_CHOICE, &format, "F", "safetensors (one file) or hf (a transformers directory: gpt, "
         "llama)", .choices = "safetensors|hf"},
        {"--shard-size", BB_OPT_BYTES, &shard_bytes, "BYTES", "hf: weights past this size go in shards of at most "
         "it, with model.safetensors.index.json (default 5GiB, as save_pretrained; 0: one file)"},
        {0}};
    bb_backend_t *be = NULL;
    bb_model_t *m = NULL;
    bb_status rc = bb_cli_parse("export", opts, argc, argv, NULL);
    bb_checkpoint_info info;
    bool hf = rc == BB_OK && !strcmp(format, "hf");
    char weights[4200] = "", target[4096];
    if (rc == BB_OK) rc = bb_checkpoint_read_info(ckpt, &info);
    if (rc == BB_OK) snprintf(weights, sizeof weights, "%s/model.safetensors", info.dir); /* the input it must not replace */
    const char *inputs[] = {weights, info.dir}; /* the weights, and the checkpoint's step directory: no file in it */
    if (rc == BB_OK && !hf) rc = bb_check_output("--out", out, inputs, 2, target, sizeof target);
    if (rc == BB_OK && hf && realpath(out, target) && realpath(info.dir, weights) && !strcmp(target, weights))
        rc = bb_fail(BB_ERR_IO, "--out %s is the checkpoint itself", out);
    if (rc == BB_OK) rc = load_model(ckpt, NULL, NULL, NULL, NULL, 1, &be, &m);
    if (rc == BB_OK) rc = hf ? export_hf(m, &info, out, shard_bytes) : bb_model_save_safetensors(m, target);
    if (rc == BB_OK)
        printf("%s: %zu parameters%s%s%s\n", out, bb_model_param_count(m), hf ? " (transformers " : "",
               hf ? bb_model_kind_name(bb_model_get_config(m)->kind) : "", hf ? ")" : "");
    bb_model_destroy(m);
    bb_backend_destroy(be);
    int code = bb_cli_report(rc, usage, summary, opts);
    bb_cli_free(opts, NULL);
    return code;
}

/* Draws a token from softmax(logits / temperature); argmax at 0. */
static int draw(const float *logits, int V, double temperature, uint64_t *rng)
{
    int best = 0;
    for (int i = 1; i < V; i++) best = logits[i] > logits[best] ? i : best;
    if (temperature <= 0) return best;
    double total = 0, *p = malloc((size_t)V * sizeof *p);
    if (!p) return best;
    for (int i = 0; i < V; i++) total += p[i] = exp((logits[i] - logits[best]) / temperature);
    double u = (double)(bb_splitmix64(rng) >> 11) / 9007199254740992.0 * total;
    int pick = V - 1;
    for (int i = 0; i < V; i++)
        if ((u -= p[i]) < 0) {
            pick = i;
            break;
        }
    free(p);
    return pick;
}

/* The tokenizer sample decodes with: --tokenizer, else the checkpoint's
 * copy of its training data's; NULL (bytes) when there is none. A
 * vocabulary other than the model's is one line. */
static bb_status sample_tokenizer(const char *flag, const char *ckpt, const char *init_from, const bb_model_config *c,
                                  bool ids, bb_tokenizer_t **out)
{
    *out = NULL;
    bb_checkpoint_info info;
    char path[4200];
    if (flag) snprintf(path, sizeof path, "%s", flag);
    else {
        if (ckpt) BB_TRY(bb_checkpoint_read_info(ckpt, &info));
        snprintf(path, sizeof path, "%s/%s", ckpt ? info.dir : init_from, BB_TOKENIZER_FILE);
        if (access(path, F_OK)) path[0] = '\0';
    }
    const char *weights = ckpt ? ckpt : init_from;
    if (!path[0]) {
        if (bb_model_outputs(c) != 256 && !ids)
            return bb_fail(BB_ERR_ARG, "%s: the model's vocabulary is %d and there is no %s beside it: give "
                           "--tokenizer FILE (the one its data was packed with)", weights, bb_model_outputs(c),
                           BB_TOKENIZER_FILE);
        return BB_OK;
    }
    BB_TRY(bb_tokenizer_load(path, out));
    if (bb_tokenizer_vocab(*out) != (uint32_t)bb_model_outputs(c)) {
        uint32_t v = bb_tokenizer_vocab(*out);
        bb_tokenizer_destroy(*out), *out = NULL;
        return bb_fail(BB_ERR_ARG, "%s has %u ids, the model %s a vocabulary of %d: not the tokenizer it was trained "
                       "with", path, v, weights, bb_model_outputs(c));
    }
    return BB_OK;
}

/* The logits after context[0..len): with the cache, the positions from
 * *cached on (each costs one position); with `recompute`, a forward over
 * the whole context. */
static bb_status next_logits(bb_model_t *m, const int32_t *context, int len, int *cached, bool recompute,
                             const int32_t *ignored, float *logits)
{
    if (recompute) {
        BB_TRY(bb_model_set_batch(m, context, ignored));
        return bb_model_logits(m, len - 1, logits);
    }
    for (; *cached < len; ++*cached) BB_TRY(bb_model_decode(m, context[*cached], *cached, logits));
    return BB_OK;
}

static void put_token(const bb_tokenizer_t *tok, int id, bool ids, bool first)
{
    size_t n = 1;
    if (ids) {
        printf(first ? "%d" : " %d", id);
        return;
    }
    const uint8_t *b = tok ? bb_tokenizer_token_bytes(tok, (uint32_t)id, &n) : NULL;
    if (tok && !b) return; /* an id no token holds: nothing to print */
    if (b) fwrite(b, 1, n, stdout);
    else putchar(id);
    fflush(stdout);
}

int bb_cmd_sample(int argc, char **argv)
{
    static const char usage[] = "bigbatch sample (--ckpt DIR | --init-from HF_DIR) [--prompt TEXT] [--tokens N] "
                                "[--temperature T] [--seed S] [--tokenizer FILE] [--ids] [--devices D]";
    static const char summary[] =
        "Generates text with a gpt or llama checkpoint or a transformers GPT-2 or Llama\n"
        "directory: the prompt, then N sampled tokens, written to stdout. Tokens are decoded\n"
        "with the tokenizer.json beside the weights (a checkpoint keeps its training data's) or\n"
        "--tokenizer; without one the model's tokens are bytes (vocabulary 256). Each token\n"
        "costs one position: every layer's keys and values are cached (a llama's kv-heads);\n"
        "when the context of T tokens is full, its last T/2 start the cache again.\n"
        "BB_LOG=info prints tokens/s.";
    const char *ckpt = NULL, *init_from = NULL, *prompt = "\n", *tokenizer = NULL;
    int64_t tokens = 200, seed = 1;
    double temperature = 0.8;
    bool ids = false, recompute = false;
    const char *device = "cpu";
    const bb_opt opts[] = {
        {"--ckpt", BB_OPT_STRING, &ckpt, "DIR", "a gpt or llama checkpoint directory"},
        {"--init-from", BB_OPT_STRING, &init_from, "DIR", "a transformers GPT2LMHeadModel or LlamaForCausalLM "
         "directory"},
        {"--prompt", BB_OPT_STRING, &prompt, "TEXT", "text to continue"},
        {"--tokens", BB_OPT_INT, &tokens, "N", "tokens to generate", .min = 1, .max = 1 << 20},
        {"--temperature", BB_OPT_DOUBLE, &temperature, "T", "softmax temperature; 0: always the likeliest",
         .min = 0, .max = 100},
        {"--seed", BB_OPT_INT, &seed, "S", "random seed for sampling", .min = 0, .max = 9.2e18},
        {"--tokenizer", BB_OPT_STRING, &tokenizer, "FILE", "decode with this tokenizer.json (default: the one "
         "beside the weights)"},
        {"--ids", BB_OPT_FLAG, &ids, NULL, "print the new tokens' ids (separated by spaces), not the text (without "
         "a tokenizer the prompt's bytes are its ids)"},
        {"--devices", BB_OPT_STRING, &device, "D", "where the model runs: cpu or cuda:N"},
        {"--recompute", BB_OPT_FLAG, &recompute, NULL, "run the whole context through the model for every token "
         "(no key/value cache; a full window then slides by one token, not by half), for comparison"},
        {0}};
    bb_backend_t *be = NULL;
    bb_model_t *m = NULL;
    bb_tokenizer_t *tok = NULL;
    bb_tokens ptoks = {0};
    int32_t *context = NULL;
    float *logits = NULL;
    bb_status rc = bb_cli_parse("sample", opts, argc, argv, NULL);
    if (rc == BB_OK && init_from && !bb_model_is_hf_dir(init_from))
        rc = bb_fail(BB_ERR_ARG, "--init-from %s: sample reads a transformers directory (config.json + "
                     "model.safetensors); a checkpoint is --ckpt", init_from);
    if (rc == BB_OK) rc = load_model(ckpt, init_from, NULL, NULL, device, 1, &be, &m);
    const bb_model_config *c = m ? bb_model_get_config(m) : NULL;
    if (rc == BB_OK && !bb_model_targets_are_tokens(c))
        rc = bb_fail(BB_ERR_ARG, "%s: sample needs a model of tokens (a gpt or a llama)", ckpt ? ckpt : init_from);
    if (rc == BB_OK) rc = sample_tokenizer(tokenizer, ckpt, init_from, c, ids, &tok);
    int T = c ? bb_model_targets_per_example(c) : 0, V = c ? bb_model_outputs(c) : 0, len = 0;
    if (rc == BB_OK) {
        context = calloc((size_t)T, sizeof *context);
        logits = malloc((size_t)V * sizeof *logits);
        if (!context || !logits) rc = bb_fail(BB_ERR_NOMEM, "out of memory");
    }
    size_t plen = strlen(prompt);
    if (rc == BB_OK && tok) rc = bb_tokenizer_encode(tok, (const uint8_t *)prompt, plen, &ptoks);
    else
        for (size_t i = 0; rc == BB_OK && i < plen; i++)
            if (!bb_tokens_push(&ptoks, (uint8_t)prompt[i])) rc = bb_fail(BB_ERR_NOMEM, "out of memory");
    for (size_t i = ptoks.n > (size_t)T ? ptoks.n - (size_t)T : 0; rc == BB_OK && i < ptoks.n; i++)
        context[len++] = (int32_t)ptoks.v[i];
    if (rc == BB_OK && !ids) fputs(prompt, stdout);
    uint64_t rng = (uint64_t)seed;
    int32_t *ignored = NULL;
    if (rc == BB_OK && !(ignored = malloc((size_t)T * sizeof *ignored))) rc = bb_fail(BB_ERR_NOMEM, "out of memory");
    for (int i = 0; ignored && i < T; i++) ignored[i] = -1;
    int32_t newline = tok ? -1 : '\n';
    if (rc == BB_OK && tok) {
        bb_tokens nl = {0};
        rc = bb_tokenizer_encode(tok, (const uint8_t *)"\n", 1, &nl);
        if (rc == BB_OK) newline = nl.n ? (int32_t)nl.v[nl.n - 1] : 0; /* SentencePiece: "\n" is "▁" <0x0A> */
        bb_tokens_free(&nl);
    }
    int cached = 0; /* positions of the context in the model's cache */
    double t0 = bb_clock_seconds();
    int64_t n = 0;
    for (; rc == BB_OK && n < tokens && !bb_cli_interrupted; n++) {
        if (len == 0) context[len++] = newline; /* an empty prompt starts a line */
        rc = next_logits(m, context, len, &cached, recompute, ignored, logits);
        if (rc != BB_OK) break;
        int next = draw(logits, V, temperature, &rng);
        put_token(tok, next, ids, n == 0);
        if (ferror(stdout)) { /* a full disk or a closed pipe: no point in sampling on */
            rc = bb_fail_errno(BB_ERR_IO, "writing the standard output after %lld tokens", (long long)n);
            break;
        }
        if (len == T && recompute) { /* a full window slides by one */
            memmove(context, context + 1, (size_t)(T - 1) * sizeof *context), len--;
        } else if (len == T) { /* the cache is full: its second half starts it again */
            int keep = T / 2;
            memmove(context, context + T - keep, (size_t)keep * sizeof *context), len = keep, cached = 0;
        }
        context[len++] = next;
    }
    double dt = bb_clock_seconds() - t0;
    BB_INFO("sampled %lld tokens in %.3f s: %.1f tokens/s (%s)", (long long)n, dt, (double)n / dt,
            recompute ? "the whole context recomputed for each" : "one position each, keys and values cached");
    if (rc == BB_OK) putchar('\n');
    if (rc == BB_OK && bb_cli_interrupted) rc = bb_fail(BB_ERR_INTERRUPTED, "interrupted");
    free(ignored), free(context), free(logits);
    bb_tokens_free(&ptoks);
    bb_tokenizer_destroy(tok);
    bb_model_destroy(m);
    bb_backend_destroy(be);
    int code = bb_cli_report(rc, usage, summary, opts);
    bb_cli_free(opts, NULL);
    return code;
}
