/* test_hf.c — GPT-2 from and to `transformers`: a GPT2LMHeadModel built
 * offline (random weights, save_pretrained) is evaluated by bigbatch to
 * transformers' loss, exported back to the same loss, trained a few steps
 * and exported to the loss bigbatch's last evaluation gave; greedy sample
 * is generate(); configurations bigbatch cannot represent are one line.
 * Helpers: hf_fixture.h. */
#include "hf_fixture.h"

TestSuite(hf, .init = fixture_setup, .fini = fixture_teardown);

typedef struct setup {
    char *text, *tok, *data, *model;
} setup;

/* A tokenizer of 512 ids on 300 KB of KJV, the first 60 KB packed with it
 * (T 32), and (with transformers) a GPT2LMHeadModel of 2 layers, d 32,
 * 64 positions. */
static setup make_setup(bool model)
{
    setup s = {.text = kjv_head(60000, "text.txt"), .data = tu_path(tmp, "data"), .model = tu_path(tmp, "gpt2")};
    char *big = kjv_head(300000, "big.txt");
    s.tok = train_ours(big, 512, "tok.json");
    free(sh_ok("'%s' pack --format text --in '%s' --seq-len 32 --tokenizer '%s' --out '%s'", tu_bigbatch_bin(), s.text,
               s.tok, s.data));
    if (model)
        free(sh_ok("%s tests/hf_models.py make --out '%s' --layers 2 --heads 2 --d 32 --positions 64 --vocab 512 "
                   "2>/dev/null && cp '%s' '%s/tokenizer.json'", HF_PYTHON, s.model, s.tok, s.model));
    free(big);
    return s;
}

static void free_setup(setup *s) { free(s->text), free(s->tok), free(s->data), free(s->model); }

static double bigbatch_loss(const char *weights_flag, const char *weights, const char *data)
{
    char *out = sh_ok("'%s' eval %s '%s' --data '%s' --json 2>/dev/null", tu_bigbatch_bin(), weights_flag, weights, data);
    double loss;
    cr_assert(sscanf(out, "{\"loss\": %lf", &loss) == 1, "%s", out);
    free(out);
    return loss;
}

static double torch_loss(const setup *s, const char *model)
{
    char *out = sh_ok("%s tests/hf_models.py loss --model '%s' --tokenizer '%s' --text '%s' --seq-len 32 2>/dev/null",
                      HF_PYTHON, model, s->tok, s->text);
    double loss;
    cr_assert(sscanf(out, "loss %lf", &loss) == 1, "%s", out);
    free(out);
    return loss;
}

Test(hf, a_transformers_gpt2_evaluates_exports_and_trains_to_its_loss)
{
    hf_require("tokenizers, transformers");
    setup s = make_setup(true);
    double theirs = torch_loss(&s, s.model), ours = bigbatch_loss("--init-from", s.model, s.data);
    cr_assert(fabs(ours - theirs) < 1e-4, "--init-from: bigbatch's loss %.7f, transformers' %.7f", ours, theirs);
    char *ck = tu_path(tmp, "ck"), *out = tu_path(tmp, "exported"), *out2 = tu_path(tmp, "trained");
    /* 0 steps of change: a run of one step at learning rate 0, exported */
    free(sh_ok("'%s' train --data '%s' --init-from '%s' --devices cpu:1 --global-batch 8 --micro-batch 8 --steps 1 "
               "--lr 0 --warmup 0 --save '%s' --quiet && '%s' export --ckpt '%s' --format hf --out '%s'",
               tu_bigbatch_bin(), s.data, s.model, ck, tu_bigbatch_bin(), ck, out));
    double back = torch_loss(&s, out);
    cr_assert(fabs(back - theirs) < 1e-4, "exported untrained: transformers' loss %.7f, before %.7f", back, theirs);
    tu_rm_tree(ck);
    free(sh_ok("'%s' train --data '%s' --init-from '%s' --devices cpu:2 --global-batch 16 --micro-batch 4 --steps 5 "
               "--lr 3e-3 --warmup 0 --save '%s' --quiet && '%s' export --ckpt '%s' --format hf --out '%s'",
               tu_bigbatch_bin(), s.data, s.model, ck, tu_bigbatch_bin(), ck, out2));
    double trained = bigbatch_loss("--ckpt", ck, s.data), exported = torch_loss(&s, out2);
    cr_assert(trained < theirs - 0.05, "5 steps changed the loss from %.5f to %.5f only", theirs, trained);
    cr_assert(fabs(trained - exported) < 1e-4, "trained: bigbatch's loss %.7f, transformers' on the export %.7f",
              trained, exported);
    char tokjson[8400];
    snprintf(tokjson, sizeof tokjson, "%s/tokenizer.json", out2);
    cr_assert(tu_exists(tokjson), "export --format hf wrote no tokenizer.json");
    /* generate() stops at <|endoftext|>: config.json names its id, the tokenizer's */
    char *ids = sh_ok("%s -c \"import json, tokenizers; c = json.load(open('%s/config.json')); "
                      "t = tokenizers.Tokenizer.from_file('%s'); print(c.get('bos_token_id'), c.get('eos_token_id'), "
                      "t.token_to_id('<|endoftext|>'))\"", HF_PYTHON, out2, tokjson);
    int bos = -2, eos = -2, eot = -3;
    cr_assert_eq(sscanf(ids, "%d %d %d", &bos, &eos, &eot), 3, "config.json's bos/eos ids: %s", ids);
    cr_assert(bos == eot && eos == eot, "config.json: bos %d, eos %d; the tokenizer's <|endoftext|> is %d", bos, eos,
              eot);
    free(ids);
    cr_log_info("transformers %.7f, bigbatch --init-from %.7f; exported back %.7f; after 5 steps bigbatch %.7f, "
                "transformers on the export %.7f", theirs, ours, back, trained, exported);
    free(ck), free(out), free(out2);
    free_setup(&s);
}

Test(hf, greedy_sample_is_transformers_generate)
{
    hf_require("tokenizers, transformers");
    setup s = make_setup(true);
    char *prompt = tu_path(tmp, "prompt.txt");
    tu_write_file(prompt, "And God said", 12);
    char *ids = sh_ok("'%s' tokenizer encode --tokenizer '%s' --in '%s'", tu_bigbatch_bin(), s.tok, prompt);
    ids[strcspn(ids, "\n")] = 0;
    char *ours = sh_ok("'%s' sample --init-from '%s' --prompt 'And God said' --temperature 0 --tokens 40 --ids",
                       tu_bigbatch_bin(), s.model);
    char *theirs = sh_ok("%s tests/hf_models.py generate --model '%s' --prompt-ids '%s' --tokens 40 2>/dev/null",
                         HF_PYTHON, s.model, ids);
    cr_assert_str_eq(ours, theirs, "greedy: bigbatch %s, transformers' generate %s", ours, theirs);
    int distinct = 0; /* a path that moves, not one token repeated */
    for (char *p = ours, *q; *p && *p != '\n'; p = q) {
        long id = strtol(p, &q, 10);
        distinct += !strstr(ours, " ") || strtol(ours, NULL, 10) != id;
    }
    cr_assert_gt(distinct, 5, "the greedy path hardly moves: %s", ours);
    cr_log_info("prompt %s; 40 greedy tokens equal to generate(): %.80s", ids, ours);
    free(prompt), free(ids), free(ours), free(theirs);
    free_setup(&s);
}

/* What a config.json may say that bigbatch cannot represent: the edit (Python on `c`) and the refusal's words. */
typedef struct config_case {
    const char *edit, *needle;
} config_case;

/* Trains one step of `model_flags` on s's data, saves into tmp/ck, exports to
 * tmp/exported (whose loss must be the checkpoint's); then each case's edit
 * of a copy's config.json (tmp/bad) is refused by train with one line
 * naming it. Returns the export's directory; *ck the checkpoint's. */
static char *refuse_edited_configs(const setup *s, const char *model_flags, const config_case *cases, size_t n,
                                   char **ck)
{
    char *dir = tu_path(tmp, "exported"), *bad = tu_path(tmp, "bad");
    *ck = tu_path(tmp, "ck");
    free(sh_ok("'%s' train --data '%s' %s --global-batch 8 --micro-batch 8 --steps 1 --save '%s' --quiet && "
               "'%s' export --ckpt '%s' --format hf --out '%s' >/dev/null", tu_bigbatch_bin(), s->data, model_flags,
               *ck, tu_bigbatch_bin(), *ck, dir));
    double direct = bigbatch_loss("--ckpt", *ck, s->data), again = bigbatch_loss("--init-from", dir, s->data);
    cr_assert(fabs(direct - again) < 1e-6, "the checkpoint's loss %.7f, its export's %.7f", direct, again);
    for (size_t i = 0; i < n; i++) {
        free(sh_ok("rm -rf '%s' && cp -r '%s' '%s' && python3 -c \"import json; p = '%s/config.json'; "
                   "c = json.load(open(p)); %s; json.dump(c, open(p, 'w'))\"", bad, dir, bad, bad, cases[i].edit));
        tu_run r = tu_bigbatch("train", "--data", s->data, "--init-from", bad, "--steps", "1", "--global-batch", "8",
                               "--micro-batch", "8", "--quiet");
        tu_assert_error(&r, cases[i].needle);
        tu_run_free(&r);
    }
    free(bad);
    return dir;
}

/* A directory bigbatch exported (no Python needed), then its config.json
 * edited: each key bigbatch cannot represent is one line naming it. */
Test(hf, configurations_it_cannot_represent_are_one_line)
{
    setup s = make_setup(false);
    static const config_case cases[] = {
        {"c['activation_function'] = 'relu'", "activation_function relu"},
        {"c['n_inner'] = 20", "n_inner is 20"},
        {"c['tie_word_embeddings'] = False", "tie_word_embeddings"},
        {"c['model_type'] = 'gpt_neo'", "model_type gpt_neo"},
        {"c['layer_norm_epsilon'] = 1e-6", "layer_norm_epsilon"},
        {"c['scale_attn_by_inverse_layer_idx'] = True", "scale_attn_by_inverse_layer_idx"},
        {"c['n_positions'] = 16", "n_positions 16 is fewer than the data's T"},
        {"c['n_positions'] = 48", "n_positions is 48"},
        {"c['n_layer'] = 2", "no tensor transformer.h.1"},
        {"c['n_head'] = 3", "n_head 3 does not divide n_embd 16"},
        {"c['vocab_size'] = 600", "transformer.wte.weight has 512 rows, config.json's vocab_size is 600"},
    };
    char *ck, *dir = refuse_edited_configs(&s, "--layers 1 --heads 2 --d-model 16", cases,
                                           sizeof cases / sizeof *cases, &ck);
    /* data of another vocabulary, and shape flags beside a config.json */
    char *bytes = tu_path(tmp, "bytes");
    free(sh_ok("'%s' pack --format text --in '%s' --seq-len 32 --out '%s'", tu_bigbatch_bin(), s.text, bytes));
    tu_run r = tu_bigbatch("eval", "--init-from", dir, "--data", bytes);
    tu_assert_error(&r, "512 tokens", "vocabulary is 256", "another tokenizer");
    tu_run_free(&r);
    r = tu_bigbatch("train", "--data", s.data, "--init-from", dir, "--layers", "3", "--steps", "1");
    tu_assert_error(&r, "config.json gives the shape");
    tu_run_free(&r);
    free(ck), free(dir), free(bytes);
    free_setup(&s);
}

/* ---- Llama ----------------------------------------------------------------- */
/* A LlamaForCausalLM (2 layers, 4 heads over 2 key/value heads, an untied
 * head, RoPE base 500000, 64 positions) saved by save_pretrained, in one
 * file or (shards of 20 KB) in five with their index. */
static char *make_llama(const setup *s, const char *name, const char *extra)
{
    char *dir = tu_path(tmp, name);
    free(sh_ok("%s tests/hf_models.py make-llama --out '%s' --layers 2 --heads 4 --kv-heads 2 --d 32 --ffn 48 "
               "--positions 64 --vocab 512 --rope-theta 500000 %s 2>/dev/null && cp '%s' '%s/tokenizer.json'",
               HF_PYTHON, dir, extra, s->tok, dir));
    return dir;
}

Test(hf, a_transformers_llama_evaluates_trains_exports_and_samples_as_transformers)
{
    hf_require("tokenizers, transformers");
    setup s = make_setup(false);
    char *one = make_llama(&s, "llama", ""), *sharded = make_llama(&s, "sharded", "--shard-bytes 20000");
    char index[8400];
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", sharded);
    cr_assert(tu_exists(index), "save_pretrained wrote no shards");
    double theirs = torch_loss(&s, one), ours = bigbatch_loss("--init-from", one, s.data);
    double ours_sharded = bigbatch_loss("--init-from", sharded, s.data);
    cr_assert(fabs(ours - theirs) < 1e-5, "--init-from: bigbatch's loss %.7f, transformers' %.7f", ours, theirs);
    cr_assert(fabs(ours_sharded - ours) < 1e-6, "sharded: %.7f, one file: %.7f", ours_sharded, ours);
    /* weights saved in bf16 and in f16: read as transformers reads them (widened to fp32) */
    static const char *const dtypes[] = {"bfloat16", "float16"};
    for (int d = 0; d < 2; d++) {
        char extra[32];
        snprintf(extra, sizeof extra, "--dtype %s", dtypes[d]);
        char *half = make_llama(&s, dtypes[d], extra);
        double t = torch_loss(&s, half), b = bigbatch_loss("--init-from", half, s.data);
        cr_assert(fabs(b - t) < 1e-5, "%s weights: bigbatch's loss %.7f, transformers' %.7f", dtypes[d], b, t);
        free(half);
    }
    /* 5 steps, then an export (sharded past 30 KB) that transformers evaluates to bigbatch's loss */
    char *ck = tu_path(tmp, "ck"), *out = tu_path(tmp, "exported");
    free(sh_ok("'%s' train --data '%s' --init-from '%s' --devices cpu:2 --global-batch 16 --micro-batch 4 --steps 5 "
               "--lr 3e-3 --warmup 0 --save '%s' --quiet && '%s' export --ckpt '%s' --format hf --shard-size 30000 "
               "--out '%s' >/dev/null", tu_bigbatch_bin(), s.data, sharded, ck, tu_bigbatch_bin(), ck, out));
    double trained = bigbatch_loss("--ckpt", ck, s.data), exported = torch_loss(&s, out);
    double reloaded = bigbatch_loss("--init-from", out, s.data);
    cr_assert(trained < theirs - 0.05, "5 steps changed the loss from %.5f to %.5f only", theirs, trained);
    cr_assert(fabs(trained - exported) < 1e-5, "trained: bigbatch %.7f, transformers on the export %.7f", trained,
              exported);
    cr_assert(fabs(trained - reloaded) < 1e-6, "trained %.7f, its export read back %.7f", trained, reloaded);
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", out);
    cr_assert(tu_exists(index), "an export past --shard-size wrote no index");
    /* greedy sampling with the key/value cache (RoPE at each position) is generate()'s */
    char *prompt = tu_path(tmp, "prompt.txt");
    tu_write_file(prompt, "And God said", 12);
    char *ids = sh_ok("'%s' tokenizer encode --tokenizer '%s' --in '%s'", tu_bigbatch_bin(), s.tok, prompt);
    ids[strcspn(ids, "\n")] = 0;
    char *mine = sh_ok("'%s' sample --init-from '%s' --prompt 'And God said' --temperature 0 --tokens 40 --ids",
                       tu_bigbatch_bin(), one);
    char *gen = sh_ok("%s tests/hf_models.py generate --model '%s' --prompt-ids '%s' --tokens 40 2>/dev/null",
                      HF_PYTHON, one, ids);
    cr_assert_str_eq(mine, gen, "greedy: bigbatch %s, transformers' generate %s", mine, gen);
    /* 5 steps of AdamW on one whole batch (constant lr, the norm clipped at 1, decay on matrices) against
     * PyTorch's on transformers' model */
    char *small = kjv_head(5000, "small.txt"), *data2 = tu_path(tmp, "data2"), *metrics = tu_path(tmp, "m.jsonl");
    char *reference = tu_path(tmp, "reference");
    free(sh_ok("'%s' pack --format text --in '%s' --seq-len 32 --tokenizer '%s' --out '%s'", tu_bigbatch_bin(), small,
               s.tok, data2));
    char *steps = sh_ok("%s tests/hf_models.py train --model '%s' --tokenizer '%s' --text '%s' --seq-len 32 --batch 0 "
                        "--steps 5 --lr 3e-3 --out '%s' 2>/dev/null", HF_PYTHON, one, s.tok, small, reference);
    int windows = 0;
    cr_assert(sscanf(steps, "windows %d", &windows) == 1 && windows > 4, "%s", steps);
    free(sh_ok("'%s' train --data '%s' --init-from '%s' --devices cpu:1 --global-batch %d --micro-batch %d --steps 5 "
               "--lr 3e-3 --warmup 0 --lr-schedule constant --weight-decay 0.1 --beta2 0.95 --metrics '%s' --quiet",
               tu_bigbatch_bin(), data2, one, windows, windows, metrics));
    double got[8], worst = 0;
    cr_assert_eq(metric_values(metrics, "loss", 1, got, 8), 5);
    const char *line = steps;
    for (int k = 0; k < 5; k++) {
        double want;
        line = strstr(line, "\nstep ");
        cr_assert(line && sscanf(line, "\nstep %*d loss %lf", &want) == 1, "%s", steps);
        line++;
        worst = fmax(worst, fabs(got[k] - want) / want);
        cr_assert(fabs(got[k] - want) <= 1e-4 * want, "step %d: bigbatch %.7f, PyTorch %.7f", k + 1, got[k], want);
    }
    cr_log_info("llama: transformers %.7f, bigbatch %.7f (sharded %.7f); after 5 steps %.7f, transformers on the "
                "export %.7f; 40 greedy tokens as generate(); 5 AdamW steps on %d windows as PyTorch's within %.1e",
                theirs, ours, ours_sharded, trained, exported, windows, worst);
    free(small), free(data2), free(metrics), free(reference), free(steps);
    free(prompt), free(ids), free(mine), free(gen);
    free(ck), free(out), free(one), free(sharded);
    free_setup(&s);
}

/* A llama bigbatch exported (no Python needed), its config.json edited:
 * each key bigbatch cannot represent is one line naming it. */
Test(hf, llama_configurations_it_cannot_represent_are_one_line)
{
    setup s = make_setup(false);
    static const config_case cases[] = {
        {"c['hidden_act'] = 'gelu'", "hidden_act gelu"},
        {"c['rope_scaling'] = {'type': 'linear', 'factor': 2.0}", "rope_scaling of type linear"},
        {"c['attention_bias'] = True", "attention_bias is true"},
        {"c['mlp_bias'] = True", "mlp_bias is true"},
        {"c['head_dim'] = 8", "head_dim is 8"},
        {"c['num_key_value_heads'] = 3", "num_key_value_heads 3 does not divide"},
        {"c['max_position_embeddings'] = 16", "max_position_embeddings 16 is fewer than the data's T"},
        {"c['tie_word_embeddings'] = True", "lm_head.weight differs from model.embed_tokens.weight"},
        {"c['num_hidden_layers'] = 2", "no tensor model.layers.1."},
        {"c['model_type'] = 'mistral'", "model_type mistral is not supported"},
    };
    char *ck, *dir = refuse_edited_configs(&s, "--model llama --layers 1 --heads 4 --kv-heads 2 --d-model 16", cases,
                                           sizeof cases / sizeof *cases, &ck), *bad = tu_path(tmp, "bad");
    /* a shard the index names is missing */
    free(sh_ok("rm -rf '%s' && '%s' export --ckpt '%s' --format hf --shard-size 4000 --out '%s' >/dev/null && "
               "rm '%s'/model-00002-of-*.safetensors", bad, tu_bigbatch_bin(), ck, bad, bad));
    tu_run r = tu_bigbatch("eval", "--init-from", bad, "--data", s.data);
    tu_assert_error(&r, "model-00002-of-");
    tu_run_free(&r);
    free(ck), free(dir), free(bad);
    free_setup(&s);
}
