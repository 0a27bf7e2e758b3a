/* test_tokenizer.c — BPE: our encoder gives the `tokenizers` package's
 * tokens, token for token, for a tokenizer that package trained and for one
 * ours trained (GPT-2's pre-tokenizer and a GPT-4-style Split), and for the
 * Llama family's (Llama 3's, and the SentencePiece style of Llama 2);
 * our trainer's vocabulary is as good as its trainer's; every byte comes
 * back from the tokens; pack keeps the tokenizer with the data, sample
 * decodes through it and evaluation speaks bits per byte; what cannot be
 * represented is one line. Helpers: hf_fixture.h. */
#include "bigbatch/tokenizer.h"
#include "hf_fixture.h"

TestSuite(tokenizer, .init = fixture_setup, .fini = fixture_teardown);

/* Text with accents, CJK, emoji (with joiners and modifiers), every kind
 * of whitespace the pre-tokenizer treats apart (tabs, CRLF, NBSP, U+3000,
 * U+2028/9, VT, FF, NEL), contractions and digits. */
static const char utf8_sample[] =
    "Café naïve résumé — déjà vu! 北京欢迎你。日本語のテキスト 한국어 😀👍🏽 family: 👨‍👩‍👧 \t\ttabs  and   spaces\u00a0nbsp"
    "\u3000ideographic\r\nCRLF\n\n\n  trailing   \n''s it's we'll I'd 'RE 123 4567 ½ ٣ Ⅻ x²\u2028ls\u2029ps\x0b\x0cvt ff "
    "\xc2\x85nel end\n";

/* Writes the UTF-8 sample (20 times) and 200 000 random bytes read as UTF-8
 * with U+FFFD for what is not (the package takes only valid UTF-8). */
static void write_samples(char **utf8, char **random_text)
{
    *utf8 = tu_path(tmp, "utf8.txt"), *random_text = tu_path(tmp, "random.txt");
    FILE *f = fopen(*utf8, "w");
    for (int i = 0; i < 20; i++) fputs(utf8_sample, f);
    fclose(f);
    free(sh_ok("python3 -c \"import random; r = random.Random(7); b = bytes(r.randrange(256) for _ in range(200000)); "
               "open('%s', 'w', encoding='utf-8', newline='').write(b.decode('utf-8', errors='replace'))\"",
               *random_text));
}

/* Our ids and the package's for `text` with `tok` must be the same; returns how many. */
static size_t expect_same_ids(const char *tok, const char *text, const char *what)
{
    char *ours = tu_path(tmp, "ours.ids"), *theirs = tu_path(tmp, "theirs.ids");
    free(sh_ok("'%s' tokenizer encode --tokenizer '%s' --in '%s' --threads 2 > '%s'", tu_bigbatch_bin(), tok, text,
               ours));
    free(sh_ok("%s tests/hf_tokenizer.py encode --tokenizer '%s' --in '%s' > '%s'", HF_PYTHON, tok, text, theirs));
    size_t na, nb;
    char *a = (char *)tu_read_file(ours, &na), *b = (char *)tu_read_file(theirs, &nb);
    size_t i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    size_t tokens = 0;
    for (size_t k = 0; k < na; k++) tokens += a[k] == ' ';
    cr_assert(na == nb && i == na, "%s: our ids differ from tokenizers' at byte %zu of the id lists: ours '%.60s', "
              "theirs '%.60s'", what, i, a + (i > 20 ? i - 20 : 0), b + (i > 20 ? i - 20 : 0));
    free(a), free(b), free(ours), free(theirs);
    return tokens + 1;
}

Test(tokenizer, encodes_token_for_token_like_the_tokenizers_package)
{
    hf_require("tokenizers");
    char *kjv = kjv_text(), *head = kjv_head(1 << 20, "head.txt"), *utf8, *rnd;
    write_samples(&utf8, &rnd);
    char *ours = train_ours(kjv, 1024, "ours.json"), *theirs = tu_path(tmp, "theirs.json"),
         *split = tu_path(tmp, "split.json");
    free(sh_ok("%s tests/hf_tokenizer.py train --in '%s' --vocab 1024 --out '%s'", HF_PYTHON, kjv, theirs));
    free(sh_ok("%s tests/hf_tokenizer.py train --in '%s' --vocab 1024 --split gpt4 --out '%s'", HF_PYTHON, head, split));
    const char *toks[] = {ours, theirs, split}, *tok_names[] = {"ours", "tokenizers'", "tokenizers' GPT-4-style split"};
    char counts[512] = "";
    for (int t = 0; t < 3; t++) {
        const char *texts[] = {t == 2 ? head : kjv, utf8, rnd}, *text_names[] = {"KJV", "UTF-8 sample", "random bytes"};
        for (int x = 0; x < 3; x++) {
            char what[128];
            snprintf(what, sizeof what, "%s tokenizer, %s", tok_names[t], text_names[x]);
            size_t n = expect_same_ids(toks[t], texts[x], what);
            snprintf(counts + strlen(counts), sizeof counts - strlen(counts), "%s%zu", t || x ? ", " : "", n);
        }
    }
    cr_log_info("the same tokens as tokenizers' for (ours, tokenizers', split) x (KJV, UTF-8, random): %s", counts);
    free(kjv), free(head), free(utf8), free(rnd), free(ours), free(theirs), free(split);
}

/* The last evaluation a train run printed: its validation loss (nats per
 * token) into *loss; returns it in bits per byte, which a token of more
 * than one byte of KJV makes fewer than nats per token / ln 2. */
static double bits_per_byte(const tu_run *r, double *loss)
{
    cr_assert_eq(r->exit_code, 0, "%s", r->err);
    double bpb;
    const char *ev = strstr(r->err, "val loss");
    cr_assert(ev && sscanf(ev, "val loss %lf, %lf bits per byte", loss, &bpb) == 2, "%s", r->err);
    cr_assert(bpb > 0 && bpb < *loss / log(2.0) * 0.6, "val loss %g nats per token, %g bits per byte", *loss, bpb);
    return bpb;
}

/* A llama on SentencePiece-style tokens: pack, train (with a report),
 * evaluate in bits per byte, sample text through the tokenizer. */
static void llama_on_sentencepiece_tokens(const char *text, const char *tok)
{
    char *data = tu_path(tmp, "sp-data"), *ck = tu_path(tmp, "sp-ck"), *report = tu_path(tmp, "sp-report.html");
    free(sh_ok("'%s' pack --format text --in '%s' --seq-len 32 --val-fraction 0.1 --tokenizer '%s' --out '%s'",
               tu_bigbatch_bin(), text, tok, data));
    tu_run r = sh("'%s' train --data '%s' --model llama --layers 2 --heads 4 --kv-heads 2 --d-model 32 --global-batch 16 "
                  "--micro-batch 8 --steps 6 --lr 3e-3 --save '%s' --report '%s' --log-every 0", tu_bigbatch_bin(), data,
                  ck, report);
    double loss, bpb = bits_per_byte(&r, &loss);
    tu_run_free(&r);
    size_t n;
    char *page = (char *)tu_read_file(report, &n);
    cr_assert(n > 1000 && strstr(page, "llama"), "the report does not name the llama");
    char *sample = sh_ok("'%s' sample --ckpt '%s' --prompt 'And God said' --tokens 30 --seed 2", tu_bigbatch_bin(), ck);
    cr_assert(!strncmp(sample, "And God said", 12) && strlen(sample) > 30 && !strstr(sample, "\xe2\x96\x81"),
              "sample, with U+2581 as a space: %s", sample);
    cr_log_info("llama on SentencePiece tokens: val loss %.4f nats per token = %.4f bits per byte; sampled: %.60s",
                loss, bpb, sample);
    free(page), free(sample), free(data), free(ck), free(report);
}

/* The tokenizers of the Llama family, built offline by `tokenizers` with
 * their structure (tests/hf_tokenizer.py --style): Llama 3's byte-level BPE
 * (a Split on its pattern, ignore_merges, 256 special tokens from 128000)
 * and the SentencePiece style of Llama 2, Mistral and TinyLlama (a Prepend
 * and Replace normalizer or a Metaspace pre-tokenizer, byte fallback to
 * <0xNN>, <unk> fused). Ours gives the package's tokens, token for token,
 * on text with special tokens, characters out of the vocabulary and bytes
 * that are not UTF-8; the tokens' bytes are the text (with the space the
 * normalizer prepends); pack stores Llama 3's ids as u32. */
Test(tokenizer, llama_family_tokenizers_encode_token_for_token_like_the_tokenizers_package)
{
    hf_require("tokenizers");
    char *head = kjv_head(400000, "head.txt"), *utf8, *rnd, *special = tu_path(tmp, "special.txt");
    write_samples(&utf8, &rnd);
    FILE *f = fopen(special, "w");
    for (int i = 0; i < 3; i++)
        fprintf(f, "<|begin_of_text|><s>In the beginning</s> <unk>x%s<|eot_id|>  <s> </s>\n<|start_header_id|>user"
                "<|end_header_id|>\n\n%s", utf8_sample, i ? "" : "<s>");
    fclose(f);
    static const char *const styles[] = {"llama3", "llama2", "metaspace-first", "metaspace-split", "unk"};
    const char *texts[] = {head, utf8, rnd, special}, *text_names[] = {"KJV", "UTF-8 sample", "random", "specials"};
    char counts[512] = "";
    for (size_t k = 0; k < sizeof styles / sizeof *styles; k++) {
        char name[64], *tok;
        snprintf(name, sizeof name, "%s.json", styles[k]);
        tok = tu_path(tmp, name);
        free(sh_ok("%s tests/hf_tokenizer.py train --in '%s' --vocab 700 --style %s --out '%s'", HF_PYTHON, head,
                   styles[k], tok));
        for (int x = 0; x < 4; x++) {
            char what[128];
            snprintf(what, sizeof what, "%s tokenizer, %s", styles[k], text_names[x]);
            size_t n = expect_same_ids(tok, texts[x], what);
            snprintf(counts + strlen(counts), sizeof counts - strlen(counts), "%s%zu", k || x ? ", " : "", n);
        }
        /* the rules had work to do: special ids past 65535 (llama3), byte tokens (ids 3..258), <unk> (id 0) */
        bb_tokenizer_t *t;
        cr_assert_eq(bb_tokenizer_load(tok, &t), BB_OK, "%s", bb_error_message());
        size_t n;
        uint8_t *text = tu_read_file(special, &n);
        bb_tokens ids = {0};
        cr_assert_eq(bb_tokenizer_encode(t, text, n, &ids), BB_OK, "%s", bb_error_message());
        size_t high = 0, bytes = 0, unk = 0;
        for (size_t i = 0; i < ids.n; i++) high += ids.v[i] >= 128000, bytes += ids.v[i] >= 3 && ids.v[i] < 259,
                                           unk += ids.v[i] == 0;
        if (k == 0) cr_assert(high >= 6 && bb_tokenizer_vocab(t) == 128256, "llama3: %zu special ids", high);
        else if (!strcmp(styles[k], "unk")) cr_assert(unk > 10, "%s: %zu <unk>", styles[k], unk);
        else cr_assert(bytes > 50, "%s: %zu byte tokens", styles[k], bytes);
        bb_tokens_free(&ids);
        free(text);
        /* SentencePiece with byte fallback: the tokens' bytes are the text, after the prepended space */
        if (!strcmp(styles[k], "llama2")) {
            text = tu_read_file(rnd, &n);
            cr_assert_eq(bb_tokenizer_encode(t, text, n, &ids), BB_OK, "%s", bb_error_message());
            uint8_t *back = malloc(n + 2);
            size_t at = 0;
            for (size_t i = 0; i < ids.n; i++) {
                size_t len;
                const uint8_t *b = bb_tokenizer_token_bytes(t, ids.v[i], &len);
                cr_assert(b && at + len <= n + 1, "token %zu (id %u) has no bytes or runs past the text", i, ids.v[i]);
                memcpy(back + at, b, len), at += len;
            }
            cr_assert(at == n + 1 && back[0] == ' ' && !memcmp(back + 1, text, n), "the tokens' bytes are not ' ' + "
                      "the text");
            free(back), free(text), bb_tokens_free(&ids);
            llama_on_sentencepiece_tokens(head, tok);
        }
        bb_tokenizer_destroy(t);
        if (k == 0) { /* Llama 3's 128256 ids: u32 records */
            char *out = tu_path(tmp, "data3"), *info;
            free(sh_ok("'%s' pack --format text --in '%s' --seq-len 32 --tokenizer '%s' --out '%s'", tu_bigbatch_bin(),
                       special, tok, out));
            info = sh_ok("'%s' inspect '%s'", tu_bigbatch_bin(), out);
            cr_assert(strstr(info, "tokens_u32 [33]") && strstr(info, "vocabulary 128256"), "%s", info);
            free(info), free(out);
        }
        free(tok);
    }
    cr_log_info("the same tokens as tokenizers' for (llama3, llama2, metaspace first, metaspace split, unk) x (KJV, "
                "UTF-8, random, special tokens): %s", counts);
    free(head), free(utf8), free(rnd), free(special);
}

/* Whatever `tokenizer train` writes, our encoder and the tokenizers
 * package read, token for token, on adversarial texts: runs of one
 * character up to 50 000 long (merges whose halves are kilobytes), every
 * byte value (as UTF-8 with U+FFFD, which the package needs), a line of a
 * megabyte without a space. */
Test(tokenizer, what_our_trainer_writes_every_reader_reads_on_adversarial_text)
{
    hf_require("tokenizers");
    char *text = tu_path(tmp, "adversarial.txt");
    free(sh_ok("python3 -c \"import random; r = random.Random(11); parts = []\n"
               "for n in [1, 7, 300, 1023, 1024, 1025, 4000, 50000]: parts += [('a' * n + ' ') * 6, 'xy' * (n // 2), '\\n']\n"
               "parts.append(bytes(range(256)).decode('latin-1'))\n"
               "parts.append(bytes(r.randrange(256) for _ in range(20000)).decode('utf-8', errors='replace'))\n"
               "parts.append(''.join(r.choice('abc') for _ in range(1 << 18)))\n"
               "open('%s', 'w', encoding='utf-8', newline='').write(''.join(parts))\"", text));
    char *ours = train_ours(text, 600, "adversarial.json");
    char *longest = sh_ok("python3 -c \"import json; m = json.load(open('%s'))['model']['merges']; "
                          "print(max(len(h) for x in m for h in (x.split(' ') if isinstance(x, str) else x)))\"", ours);
    cr_assert_gt(atoi(longest), 4096, "the longest merge half is %s bytes: the test proves nothing", longest);
    size_t n = expect_same_ids(ours, text, "our tokenizer of adversarial text");
    /* and every byte comes back from the tokens, kilobyte-long ones too */
    bb_tokenizer_t *t;
    cr_assert_eq(bb_tokenizer_load(ours, &t), BB_OK, "%s", bb_error_message());
    size_t len;
    uint8_t *raw = tu_read_file(text, &len), *back = malloc(len + 1);
    bb_tokens ids = {0};
    cr_assert_eq(bb_tokenizer_encode(t, raw, len, &ids), BB_OK, "%s", bb_error_message());
    size_t at = 0, longest_token = 0;
    for (size_t i = 0; i < ids.n; i++) {
        size_t k;
        const uint8_t *b = bb_tokenizer_token_bytes(t, ids.v[i], &k);
        cr_assert(b && at + k <= len, "token %zu (id %u) has no bytes or runs past the text", i, ids.v[i]);
        memcpy(back + at, b, k), at += k;
        longest_token = k > longest_token ? k : longest_token;
    }
    cr_assert(at == len && !memcmp(back, raw, len), "the tokens' bytes are not the text (%zu of %zu bytes)", at, len);
    cr_assert_gt(longest_token, 4096, "the longest token is %zu bytes", longest_token);
    bb_tokens_free(&ids), bb_tokenizer_destroy(t), free(raw), free(back);
    char *packed = tu_path(tmp, "adv-packed");
    free(sh_ok("'%s' pack --format text --in '%s' --tokenizer '%s' --seq-len 64 --out '%s' > /dev/null 2>&1",
               tu_bigbatch_bin(), text, ours, packed));
    cr_log_info("adversarial text: %zu tokens, the same as tokenizers' (merge halves up to %d bytes); pack reads "
                "the tokenizer", n, atoi(longest));
    free(longest), free(packed), free(ours), free(text);
}

/* Tokens per byte of KJV at a vocabulary of 2048: ours within 2% of the
 * package's trainer (perf/tokenizer_bench.sh times both). */
Test(tokenizer, our_trainer_matches_the_tokenizers_trainer_in_tokens_per_byte)
{
    hf_require("tokenizers");
    char *kjv = kjv_text(), *ours = train_ours(kjv, 2048, "ours.json"), *theirs = tu_path(tmp, "theirs.json");
    free(sh_ok("%s tests/hf_tokenizer.py train --in '%s' --vocab 2048 --out '%s'", HF_PYTHON, kjv, theirs));
    unsigned long long bytes[2], tokens[2];
    const char *toks[] = {ours, theirs};
    for (int i = 0; i < 2; i++) {
        char *out = sh_ok("'%s' tokenizer encode --tokenizer '%s' --in '%s' --stats", tu_bigbatch_bin(), toks[i], kjv);
        char *p = strchr(out, ' ');
        cr_assert(p && sscanf(p, " %llu bytes, %llu tokens", &bytes[i], &tokens[i]) == 2, "%s", out);
        free(out);
    }
    double ratio = (double)tokens[0] / (double)tokens[1];
    cr_assert(fabs(ratio - 1) < 0.02, "ours %llu tokens, tokenizers' trainer %llu for %llu bytes (%.4f)", tokens[0],
              tokens[1], bytes[0], ratio);
    cr_log_info("KJV at vocabulary 2048: ours %.4f tokens per byte, tokenizers' trainer %.4f (%.4fx)",
                (double)tokens[0] / bytes[0], (double)tokens[1] / bytes[1], ratio);
    free(kjv), free(ours), free(theirs);
}

/* Whatever the bytes (UTF-8 or not), the tokens' bytes are the text; on
 * two threads the tokens are those of one; the trainer's output does not
 * depend on its threads. */
Test(tokenizer, every_byte_comes_back_and_threads_change_nothing)
{
    char *kjv = kjv_text(), *utf8, *rnd;
    write_samples(&utf8, &rnd);
    char *a = train_ours(kjv, 600, "one.json");
    char *b = tu_path(tmp, "two.json");
    free(sh_ok("'%s' tokenizer train --in '%s' --vocab 600 --threads 1 --out '%s' 2>/dev/null", tu_bigbatch_bin(), kjv,
               b));
    size_t na, nb;
    uint8_t *ja = tu_read_file(a, &na), *jb = tu_read_file(b, &nb);
    cr_assert(na == nb && !memcmp(ja, jb, na), "the trainer wrote another tokenizer on one thread than on two");
    free(ja), free(jb);
    bb_tokenizer_t *t;
    cr_assert_eq(bb_tokenizer_load(a, &t), BB_OK, "%s", bb_error_message());
    cr_assert_eq(bb_tokenizer_vocab(t), 600);
    uint8_t raw[4096];
    tu_fill_random(raw, sizeof raw, 3); /* not UTF-8 */
    size_t kn;
    uint8_t *text = tu_read_file(kjv, &kn);
    const struct { const uint8_t *p; size_t n; const char *what; } inputs[] = {
        {raw, sizeof raw, "random bytes"}, {(const uint8_t *)utf8_sample, sizeof utf8_sample - 1, "UTF-8"},
        {text, kn, "KJV"}};
    for (int k = 0; k < 3; k++) {
        bb_tokens ids = {0}, par = {0};
        cr_assert_eq(bb_tokenizer_encode(t, inputs[k].p, inputs[k].n, &ids), BB_OK, "%s", bb_error_message());
        cr_assert_eq(bb_tokenizer_encode_parallel(t, inputs[k].p, inputs[k].n, 2, &par), BB_OK);
        cr_assert(ids.n == par.n && !memcmp(ids.v, par.v, ids.n * sizeof *ids.v), "%s: 2 threads gave other tokens",
                  inputs[k].what);
        uint8_t *back = malloc(inputs[k].n + 1);
        size_t at = 0;
        for (size_t i = 0; i < ids.n; i++) {
            size_t len;
            const uint8_t *b2 = bb_tokenizer_token_bytes(t, ids.v[i], &len);
            cr_assert(b2 && at + len <= inputs[k].n, "%s: token %zu (id %u) has no bytes or runs past the text",
                      inputs[k].what, i, ids.v[i]);
            memcpy(back + at, b2, len), at += len;
        }
        cr_assert(at == inputs[k].n && !memcmp(back, inputs[k].p, at), "%s: the tokens' bytes are not the text",
                  inputs[k].what);
        free(back), bb_tokens_free(&ids), bb_tokens_free(&par);
    }
    bb_tokenizer_destroy(t);
    free(text), free(kjv), free(utf8), free(rnd), free(a), free(b);
}

/* Edits tokenizer.json `in` into `out` with a line of Python over `j`. */
static char *edited(const char *in, const char *name, const char *python)
{
    char *out = tu_path(tmp, name);
    free(sh_ok("python3 -c \"import json; j = json.load(open('%s')); %s; json.dump(j, open('%s', 'w'))\"", in, python,
               out));
    return out;
}

/* pack --tokenizer: the dataset (and each split) keeps the tokenizer, its
 * vocabulary and token width are the tokenizer's (u32 past 65536 ids), and
 * --force may replace it. */
Test(tokenizer, pack_keeps_the_tokenizer_with_the_data_in_u16_or_u32)
{
    char *head = kjv_head(200000, "head.txt"), *tok = train_ours(head, 400, "tok.json"), *out = tu_path(tmp, "data");
    for (int again = 0; again < 2; again++)
        free(sh_ok("'%s' pack --format text --in '%s' --seq-len 32 --val-fraction 0.1 --tokenizer '%s' --out '%s'%s",
                   tu_bigbatch_bin(), head, tok, out, again ? " --force" : ""));
    const char *where[] = {"", "/train", "/val"};
    for (int i = 0; i < 3; i++) {
        char p[8400];
        snprintf(p, sizeof p, "%s%s/tokenizer.json", out, where[i]);
        cr_assert(tu_exists(p), "%s is missing", p);
    }
    char *info = sh_ok("'%s' inspect '%s/train'", tu_bigbatch_bin(), out);
    cr_assert(strstr(info, "tokens_u16 [33]") && strstr(info, "vocabulary 400"), "%s", info);
    free(info);
    char *big = edited(tok, "big.json", "j['added_tokens'].append(dict(id=70000, content='<|big|>', single_word=False, "
                                        "lstrip=False, rstrip=False, normalized=False, special=True))");
    char *out32 = tu_path(tmp, "data32");
    free(sh_ok("'%s' pack --format text --in '%s' --seq-len 32 --tokenizer '%s' --out '%s'", tu_bigbatch_bin(), head,
               big, out32));
    info = sh_ok("'%s' inspect '%s'", tu_bigbatch_bin(), out32);
    cr_assert(strstr(info, "tokens_u32 [33]") && strstr(info, "vocabulary 70001"), "%s", info);
    free(info), free(head), free(tok), free(out), free(big), free(out32);
}

/* What bigbatch cannot represent is one line naming it, exit 1, and pack
 * leaves nothing. */
Test(tokenizer, tokenizers_it_cannot_represent_are_one_line)
{
    char *head = kjv_head(50000, "head.txt"), *tok = train_ours(head, 300, "tok.json"), *bad = tu_path(tmp, "bad.json");
    struct { const char *edit, *needle; } cases[] = {
        {"j['model']['type'] = 'WordPiece'", "model type WordPiece"},
        {"j['normalizer'] = dict(type='NFC')", "normalizer NFC"},
        {"j['pre_tokenizer']['add_prefix_space'] = True", "add_prefix_space"},
        {"j['pre_tokenizer'] = dict(type='Whitespace')", "pre_tokenizer type Whitespace"},
        {"j['model']['dropout'] = 0.1", "model.dropout"},
        {"j['model']['merges'][0] = 'zzz qqq'", "model.merges[0]"},
        {"del j['model']['vocab']['a']", "byte 0x61"},
        {"j['model']['byte_fallback'] = True", "pre_tokenizer ByteLevel is not supported with a normalizer or "
         "byte_fallback"},
        {"j['pre_tokenizer'] = None; j['normalizer'] = dict(type='Replace', pattern=dict(Regex=' '), content='_')",
         "normalizer Replace: only a pattern"},
        {"j['pre_tokenizer'] = dict(type='Metaspace', replacement='_', prepend_scheme='sometimes')",
         "prepend_scheme sometimes"},
        {"j['pre_tokenizer'] = None; j['decoder'] = dict(type='WordPiece')", "decoder WordPiece"},
        {"j['pre_tokenizer'] = j['decoder'] = None; j['model']['unk_token'] = '<nope>'", "model.unk_token \"<nope>\" is not a token"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *e = edited(tok, "bad.json", cases[i].edit), *out = tu_path(tmp, "never");
        tu_run r = tu_bigbatch("pack", "--format", "text", "--in", head, "--seq-len", "16", "--tokenizer", e, "--out", out);
        tu_assert_error(&r, e, cases[i].needle);
        cr_assert_eq(r.exit_code, 1, "%s", r.err);
        cr_assert(!tu_exists(out), "pack left %s", out);
        tu_run_free(&r);
        free(e), free(out);
    }
    tu_write_file(bad, "{\"model\": ", 10);
    tu_run r = tu_bigbatch("tokenizer", "encode", "--tokenizer", bad, "--in", head);
    tu_assert_error(&r, bad, "not JSON");
    tu_run_free(&r);
    free(head), free(tok), free(bad);
}

/* A gpt trained on BPE tokens: evaluation gives bits per byte, the
 * checkpoint keeps the tokenizer, sample decodes through it (and --ids
 * gives ids of the vocabulary), and data of another vocabulary is one line. */
Test(tokenizer, a_bpe_model_samples_text_and_reports_bits_per_byte)
{
    char *head = kjv_head(300000, "head.txt"), *tok = train_ours(head, 512, "tok.json"), *data = tu_path(tmp, "data"),
         *bytes = tu_path(tmp, "bytes"), *ck = tu_path(tmp, "ck");
    free(sh_ok("'%s' pack --format text --in '%s' --seq-len 32 --val-fraction 0.1 --tokenizer '%s' --out '%s'",
               tu_bigbatch_bin(), head, tok, data));
    free(sh_ok("'%s' pack --format text --in '%s' --seq-len 32 --val-fraction 0.1 --out '%s'", tu_bigbatch_bin(), head,
               bytes));
    tu_run r = sh("'%s' train --data '%s' --layers 2 --heads 2 --d-model 32 --global-batch 16 --micro-batch 8 --steps 6 "
                  "--lr 3e-3 --save '%s' --log-every 0", tu_bigbatch_bin(), data, ck);
    double loss, bpb = bits_per_byte(&r, &loss);
    tu_run_free(&r);
    char latest[8400];
    snprintf(latest, sizeof latest, "%s/latest/tokenizer.json", ck);
    cr_assert(tu_exists(latest), "the checkpoint keeps no tokenizer.json");
    char *text = sh_ok("'%s' sample --ckpt '%s' --prompt 'And God said' --tokens 30 --seed 2", tu_bigbatch_bin(), ck);
    cr_assert(!strncmp(text, "And God said", 12) && strlen(text) > 30, "%s", text);
    char *ids = sh_ok("'%s' sample --ckpt '%s' --prompt 'And God said' --tokens 30 --seed 2 --ids", tu_bigbatch_bin(), ck);
    int n = 0;
    for (char *p = ids, *end; *p && *p != '\n'; p = end, n++) {
        long id = strtol(p, &end, 10);
        cr_assert(end != p && id >= 0 && id < 512, "sample --ids: '%s'", ids);
    }
    cr_assert_eq(n, 30, "sample --ids printed %d ids: '%s'", n, ids);
    cr_log_info("val loss %.4f nats per token = %.4f bits per byte; sampled: %.60s", loss, bpb, text);
    free(text), free(ids);
    char val[8400];
    snprintf(val, sizeof val, "%s/val", bytes);
    r = tu_bigbatch("eval", "--ckpt", ck, "--data", val);
    tu_assert_error(&r, "vocabulary of 256", "512", "another tokenizer");
    tu_run_free(&r);
    free(head), free(tok), free(data), free(bytes), free(ck);
}
