/* cmd_model.c — commands on trained weights: `eval`, `export`, `sample`. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bigbatch/json.h"
#include "bigbatch/train.h"
#include "commands.h"
#include "model_flags.h"

/* A one-device CPU model from a checkpoint (--ckpt) or from a safetensors
 * file and the model flags (--init-from; the data gives the rest). */
static bb_status load_model(const char *ckpt, const char *init_from, const model_flags *mf, const char *data,
                            int micro_batch, bb_backend_t **be, bb_model_t **m)
{
    bb_model_config c;
    bb_checkpoint_info info;
    if (!ckpt == !init_from) return bb_fail(BB_ERR_ARG, "give either --ckpt DIR or --init-from FILE");
    if (ckpt) {
        BB_TRY(bb_checkpoint_read_info(ckpt, &info));
        c = info.model;
    } else {
        struct stat st;
        if (stat(init_from, &st) == 0 && S_ISDIR(st.st_mode))
            return bb_fail(BB_ERR_IO, "--init-from %s is a directory, not a .safetensors file (a checkpoint directory "
                           "is read with --ckpt)", init_from);
        BB_TRY(model_flags_config(mf, &c));
        if (!data) return bb_fail(BB_ERR_ARG, "--init-from needs --data (it gives the model's input and output sizes)");
        BB_TRY(model_config_from_data(data, &c, NULL));
    }
    c.checkpoint_every = 0;
    c.precision = BB_PRECISION_FP32; /* a forward only: nothing is kept for a backward */
    if (mf) BB_TRY(loss_chunk_flag(mf, &c));
    bb_backend_options bo = {0};
    BB_TRY(bb_backend_create_cpu(&bo, be));
    BB_TRY(bb_model_create(*be, &c, micro_batch, m));
    BB_TRY(ckpt ? bb_checkpoint_load_weights(&info, *m) : bb_model_load_safetensors(*m, init_from));
    /* NaN or infinite weights give no answer worth printing (the CPU backend's memory is the host's) */
    const float *p = bb_model_params(*m);
    for (int i = 0; i < bb_model_tensor_count(*m); i++) {
        const bb_tensor_info *t = bb_model_tensor(*m, i);
        size_t bad = 0;
        for (size_t k = 0; k < t->count; k++) bad += !isfinite(p[t->offset + k]);
        if (bad)
            return bb_fail(BB_ERR_FORMAT, "%s: tensor %s holds %zu non-finite weights (NaN or infinite): nothing to "
                           "evaluate, sample or export", ckpt ? info.dir : init_from, t->name, bad);
    }
    return BB_OK;
}

static const char *eval_split(const char *data)
{
    const char *s = resolve_split(data, "val");
    if (!s) s = resolve_split(data, "test");
    return s ? s : data;
}

int bb_cmd_eval(int argc, char **argv)
{
    static const char usage[] = "bigbatch eval (--ckpt DIR [--data DIR] | --init-from FILE [model flags] --data DIR) "
                                "[--json]";
    static const char summary[] =
        "Runs every record of a dataset through the model and prints the mean loss (per\n"
        "example for mlp, per token for gpt) and, for mlp, the accuracy. --data DIR may be a\n"
        "dataset or a directory with val/ (or test/) inside; with --ckpt it defaults to the\n"
        "run's validation data (else its training data), as the checkpoint recorded them.";
    model_flags mf = MODEL_FLAGS_DEFAULT;
    const char *ckpt = NULL, *init_from = NULL, *data = NULL;
    int64_t micro_batch = 32;
    bool json = false;
    const bb_opt opts[] = {
        {"--ckpt", BB_OPT_STRING, &ckpt, "DIR", "a checkpoint directory written by train --save"},
        {"--init-from", BB_OPT_STRING, &init_from, "FILE", "a .safetensors file (with the model flags)"},
        {"--data", BB_OPT_STRING, &data, "DIR", "the dataset to evaluate on (--ckpt: default the run's validation "
         "data, else its training data)"},
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
        data = info.val_data[0] ? info.val_data : info.data; /* what the run recorded */
    if (rc == BB_OK && data) data = eval_split(data); /* none: load_model says --init-from needs it */
    if (rc == BB_OK) rc = load_model(ckpt, init_from, &mf, data, (int)micro_batch, &be, &m);
    if (rc == BB_OK) rc = bb_dataset_open(data, &ds);
    bb_eval_options eo = {.progress = stderr, .label = "eval", .interrupted = &bb_cli_interrupted};
    if (rc == BB_OK) rc = bb_evaluate(m, ds, &eo, &r);
    if (rc == BB_OK && json) {
        json_t *o = json_pack("{s:o, s:o, s:I}", "loss", bb_json_real(r.loss, 7), "accuracy",
                              bb_json_fixed(r.accuracy, 6), "records", (json_int_t)r.records);
        rc = bb_json_write_line(stdout, o);
        json_decref(o);
    } else if (rc == BB_OK) {
        printf("%s: %llu records, loss %.4f", data, (unsigned long long)r.records, r.loss);
        if (!isnan(r.accuracy)) printf(", accuracy %.2f%%", 100 * r.accuracy);
        printf("\n");
    }
    bb_dataset_close(ds);
    bb_model_destroy(m);
    bb_backend_destroy(be);
    int code = bb_cli_report(rc, usage, summary, opts);
    bb_cli_free(opts, NULL);
    return code;
}

int bb_cmd_export(int argc, char **argv)
{
    static const char usage[] = "bigbatch export --ckpt DIR --out FILE.safetensors";
    static const char summary[] =
        "Writes the weights of DIR's latest checkpoint as one safetensors file under PyTorch\n"
        "(nanoGPT) names, for safetensors.torch.load_file or transformers-style loaders.";
    const char *ckpt = NULL, *out = NULL;
    const bb_opt opts[] = {
        {"--ckpt", BB_OPT_STRING, &ckpt, "DIR", "a checkpoint directory written by train --save", .required = true},
        {"--out", BB_OPT_STRING, &out, "FILE", "the .safetensors file to write", .required = true},
        {0}};
    bb_backend_t *be = NULL;
    bb_model_t *m = NULL;
    bb_status rc = bb_cli_parse("export", opts, argc, argv, NULL);
    bb_checkpoint_info info;
    char weights[4200] = "", target[4096];
    if (rc == BB_OK && bb_checkpoint_read_info(ckpt, &info) == BB_OK) /* the input it must not replace */
        snprintf(weights, sizeof weights, "%s/model.safetensors", info.dir);
    const char *inputs[] = {weights};
    if (rc == BB_OK) rc = bb_check_output("--out", out, inputs, 1, target, sizeof target);
    if (rc == BB_OK) rc = load_model(ckpt, NULL, NULL, NULL, 1, &be, &m);
    if (rc == BB_OK) rc = bb_model_save_safetensors(m, target);
    if (rc == BB_OK) printf("%s: %zu parameters\n", out, bb_model_param_count(m));
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

int bb_cmd_sample(int argc, char **argv)
{
    static const char usage[] = "bigbatch sample --ckpt DIR [--prompt TEXT] [--tokens N] [--temperature T] [--seed S]";
    static const char summary[] =
        "Generates text with a gpt checkpoint trained on byte-level text (vocabulary 256):\n"
        "the prompt's bytes, then N sampled tokens, written to stdout.";
    const char *ckpt = NULL, *prompt = "\n";
    int64_t tokens = 200, seed = 1;
    double temperature = 0.8;
    const bb_opt opts[] = {
        {"--ckpt", BB_OPT_STRING, &ckpt, "DIR", "a gpt checkpoint directory", .required = true},
        {"--prompt", BB_OPT_STRING, &prompt, "TEXT", "text to continue"},
        {"--tokens", BB_OPT_INT, &tokens, "N", "tokens to generate", .min = 1, .max = 1 << 20},
        {"--temperature", BB_OPT_DOUBLE, &temperature, "T", "softmax temperature; 0: always the likeliest",
         .min = 0, .max = 100},
        {"--seed", BB_OPT_INT, &seed, "S", "random seed for sampling", .min = 0, .max = 9.2e18},
        {0}};
    bb_backend_t *be = NULL;
    bb_model_t *m = NULL;
    int32_t *context = NULL;
    float *logits = NULL;
    bb_status rc = bb_cli_parse("sample", opts, argc, argv, NULL);
    if (rc == BB_OK) rc = load_model(ckpt, NULL, NULL, NULL, 1, &be, &m);
    const bb_model_config *c = m ? bb_model_get_config(m) : NULL;
    if (rc == BB_OK && (!bb_model_targets_are_tokens(c) || bb_model_outputs(c) != 256))
        rc = bb_fail(BB_ERR_ARG, "%s: sample needs a gpt over bytes (vocabulary 256)", ckpt);
    int T = c ? c->seq_len : 0, len = 0;
    if (rc == BB_OK) {
        context = calloc((size_t)T, sizeof *context);
        logits = malloc((size_t)c->vocab * sizeof *logits);
        if (!context || !logits) rc = bb_fail(BB_ERR_NOMEM, "out of memory");
    }
    size_t plen = strlen(prompt);
    for (size_t i = plen > (size_t)T ? plen - (size_t)T : 0; rc == BB_OK && i < plen; i++)
        context[len++] = (uint8_t)prompt[i];
    if (rc == BB_OK) fputs(prompt, stdout);
    uint64_t rng = (uint64_t)seed;
    int32_t *ignored = NULL;
    if (rc == BB_OK && !(ignored = malloc((size_t)T * sizeof *ignored))) rc = bb_fail(BB_ERR_NOMEM, "out of memory");
    for (int i = 0; ignored && i < T; i++) ignored[i] = -1;
    for (int64_t n = 0; rc == BB_OK && n < tokens && !bb_cli_interrupted; n++) {
        if (len == 0) context[len++] = '\n';
        rc = bb_model_set_batch(m, context, ignored);
        if (rc == BB_OK) rc = bb_model_logits(m, len - 1, logits);
        if (rc != BB_OK) break;
        int next = draw(logits, c->vocab, temperature, &rng);
        putchar(next);
        fflush(stdout);
        if (len == T) memmove(context, context + 1, (size_t)(T - 1) * sizeof *context), len--; /* slide the window */
        context[len++] = next;
    }
    if (rc == BB_OK) putchar('\n');
    if (rc == BB_OK && bb_cli_interrupted) rc = bb_fail(BB_ERR_INTERRUPTED, "interrupted");
    free(ignored), free(context), free(logits);
    bb_model_destroy(m);
    bb_backend_destroy(be);
    int code = bb_cli_report(rc, usage, summary, opts);
    bb_cli_free(opts, NULL);
    return code;
}
