/* test_outputs.c — what a command writes: never over or inside one of its
 * own inputs (every output flag of every command over every input kind),
 * never a silent write failure (standard output on a full disk), a second
 * signal leaving no partial output (pack), and missing parent directories
 * made by every command alike. The checkpoint side (saves, pruning, kills)
 * is test_safety.c and test_preempt.c. Helpers: train_fixture.h. */
#include "train_fixture.h"

TestSuite(outputs, .init = fixture_setup, .fini = fixture_teardown);

/* Every command that prints, its standard output a full disk (/dev/full):
 * exit 1 with one line saying so, never a silent success over a truncated
 * output; sample stops sampling at the first failed write. */
Test(outputs, printing_into_a_full_disk_fails_with_one_line)
{
    char *data = make_tokens("tokens", 170), *ck = tu_path(tmp, "ck-full"), *text = tu_path(tmp, "text.txt");
    char *tok = tu_path(tmp, "tok.json"), *err = tu_path(tmp, "full.err");
    tu_run r = tu_bigbatch("train", "--data", data, "--layers", "1", "--d-model", "16", "--heads", "2", "--global-batch",
                           "8", "--steps", "1", "--save", ck, "--quiet");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    char words[64 * 1024];
    for (size_t i = 0; i < sizeof words; i++) words[i] = i % 7 == 6 ? ' ' : (char)('a' + i % 5);
    tu_write_file(text, words, sizeof words);
    r = tu_bigbatch("tokenizer", "train", "--in", text, "--vocab", "300", "--out", tok);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    char *bin = (char *)tu_bigbatch_bin();
    char *const cases[][12] = {
        {bin, "version"},
        {bin, "train", "--help"},
        {bin, "sample", "--ckpt", ck, "--tokens", "5000", "--ids"},
        {bin, "eval", "--ckpt", ck, "--data", data, "--json"},
        {bin, "inspect", data, "--json"},
        {bin, "tokenizer", "encode", "--tokenizer", tok, "--in", text},
        {bin, "plan", "--global-batch", "64", "--device-mem", "1G", "--layers", "2"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        int code = exit_within(start_logged(cases[c], "/dev/full", err), 60);
        tu_run got = {.exit_code = code, .out = strdup(""), .err = (char *)tu_read_file(err, NULL)};
        cr_log_info("%s: exit %d: %s", cases[c][1], code, got.err);
        cr_assert_eq(code, 1, "bigbatch %s into /dev/full: exit %d: %s", cases[c][1], code, got.err);
        tu_assert_error(&got, "writing the standard output", "No space left on device");
        tu_run_free(&got);
    }
    free(data), free(ck), free(text), free(tok), free(err);
}

/* The first file of directory `dir` whose name starts with `prefix`, as a path. */
static char *first_file(const char *dir, const char *prefix)
{
    char cmd[4400];
    snprintf(cmd, sizeof cmd, "ls '%s' | grep '^%s' | head -1", dir, prefix);
    FILE *p = popen(cmd, "r");
    char name[256] = "";
    cr_assert(p && fgets(name, sizeof name, p), "no %s* in %s", prefix, dir);
    pclose(p);
    name[strcspn(name, "\n")] = 0;
    return tu_path(dir, name);
}

/* bigbatch `argv`, whose output `flag` is over or inside `input`: exit 1,
 * one line naming the flag and `said`, nothing written, the input's bytes
 * as they were. */
static void expect_refused(char *const argv[], const char *flag, const char *input, const char *said)
{
    size_t before_size, after_size;
    uint8_t *before = tu_read_file(input, &before_size);
    tu_run got = tu_run_argv(argv);
    uint8_t *after = tu_read_file(input, &after_size);
    cr_assert_eq(got.exit_code, 1, "%s %s %s: exit %d: %s", argv[1], flag, input, got.exit_code, got.err);
    tu_assert_error(&got, flag, said, "nothing written");
    cr_assert(before_size == after_size && !memcmp(before, after, before_size), "%s %s %s changed it", argv[1], flag,
              input);
    free(before), free(after), tu_run_free(&got);
}

/* Every output flag of every command, over every kind of input the command
 * reads: a shard of --data and of --val-data, each file of the --resume
 * checkpoint (through `latest`), the --init-from weights, the dataset's
 * tokenizer, the text `tokenizer train` learns from, report's own inputs.
 * Each is refused before any work, one line, exit 1, and the input's bytes
 * stay as they were. A new output flag or input kind goes in this table. */
Test(outputs, no_output_replaces_or_lies_inside_an_input_of_its_command)
{
    char *data = make_tokens("tokens", 170), *val = make_tokens("val", 40), *ck = tu_path(tmp, "ck-io");
    char *init = tu_path(tmp, "init.safetensors"), *metrics = tu_path(tmp, "m.jsonl"), *trace = tu_path(tmp, "t.json");
    char *text = tu_path(tmp, "words.txt"), *tok = tu_path(data, "tokenizer.json");
    tu_run r = tu_bigbatch("train", "--data", data, "--layers", "1", "--d-model", "16", "--heads", "2",
                           "--global-batch", "8", "--steps", "4", "--stop-after", "1", "--save", ck, "--metrics",
                           metrics, "--trace", trace, "--quiet");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    r = tu_bigbatch("export", "--ckpt", ck, "--out", init);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    tu_write_file(text, "the cat sat on the mat\n", 23);
    r = tu_bigbatch("tokenizer", "train", "--in", text, "--vocab", "260", "--out", tok); /* the dataset's tokenizer */
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    char *shard = first_file(data, "shard"), *vshard = first_file(val, "shard"), *latest = tu_path(ck, "latest");
    char *ck_model = tu_path(latest, "model.safetensors"), *ck_opt = tu_path(latest, "optimizer.bin");
    char *ck_state = tu_path(latest, "state.json");
    char *bin = (char *)tu_bigbatch_bin();
    enum { MAXV = 24 };
    typedef struct {
        const char *name;
        char *argv[MAXV]; /* the command; OUT stands for the output's place */
    } command;
    const command commands[] = {
        {"train --resume", {bin, "train", "--resume", ck, "--val-data", val, "--quiet"}},
        {"train --init-from", {bin, "train", "--data", data, "--val-data", val, "--init-from", init, "--layers", "1",
                               "--d-model", "16", "--heads", "2", "--global-batch", "8", "--steps", "1", "--quiet"}},
    };
    static const char *const train_outputs[] = {"--trace", "--metrics", "--report"};
    char *const train_inputs[] = {shard, vshard, ck_model, ck_opt, ck_state, init, tok};
    int cases = 0;
    for (size_t c = 0; c < sizeof commands / sizeof *commands; c++)
        for (size_t f = 0; f < sizeof train_outputs / sizeof *train_outputs; f++)
            for (size_t i = 0; i < sizeof train_inputs / sizeof *train_inputs; i++) {
                bool resumes = c == 0, from_init = c == 1;
                char *in = train_inputs[i];
                if ((!resumes && (in == ck_model || in == ck_opt || in == ck_state)) || (!from_init && in == init))
                    continue; /* not an input of that command */
                char *argv[MAXV + 2];
                int n = 0;
                for (; commands[c].argv[n]; n++) argv[n] = commands[c].argv[n];
                argv[n++] = (char *)train_outputs[f], argv[n++] = in, argv[n] = NULL;
                expect_refused(argv, train_outputs[f], in, "one of the command's inputs");
                cases++;
            }
    /* export --out into the checkpoint; report --out over its inputs; tokenizer train --out over its text */
    struct {
        char *argv[MAXV];
        char *input;
    } more[] = {
        {{bin, "export", "--ckpt", ck, "--out", ck_opt}, ck_opt},
        {{bin, "export", "--ckpt", ck, "--out", ck_state}, ck_state},
        {{bin, "export", "--ckpt", ck, "--out", ck_model}, ck_model},
        {{bin, "report", "--metrics", metrics, "--trace", trace, "--out", trace}, trace},
        {{bin, "report", "--metrics", metrics, "--out", metrics}, metrics},
        {{bin, "tokenizer", "train", "--in", text, "--vocab", "260", "--out", text}, text},
    };
    for (size_t k = 0; k < sizeof more / sizeof *more; k++, cases++)
        expect_refused(more[k].argv, "--out", more[k].input, "nothing written");
    /* --save, a directory: not inside the data, the validation data or the model it starts from */
    char *const saves[] = {data, val, tu_path(data, "ck")};
    for (size_t k = 0; k < sizeof saves / sizeof *saves; k++) {
        tu_run got = tu_bigbatch("train", "--data", data, "--val-data", val, "--layers", "1", "--d-model", "16",
                                 "--heads", "2", "--global-batch", "8", "--steps", "1", "--save", saves[k], "--quiet");
        cr_assert_eq(got.exit_code, 1, "--save %s: exit %d: %s", saves[k], got.exit_code, got.err);
        tu_assert_error(&got, "--save", "which the run reads", "nothing written");
        tu_run_free(&got);
        cases++;
    }
    cr_assert(!tu_exists(saves[2]), "--save inside the data was made");
    free(saves[2]);
    cr_log_info("%d outputs over inputs: each refused before any work, every input unchanged", cases);
    free(shard), free(vshard), free(latest), free(ck_model), free(ck_opt), free(ck_state);
    free(data), free(val), free(ck), free(init), free(metrics), free(trace), free(text), free(tok);
}

/* A second Ctrl-C while pack writes its shards: it stops at once and the
 * partial output directory (its splits and their shards) is removed before
 * the exit, named on the line; --out never appears. */
Test(outputs, a_second_signal_during_pack_removes_its_partial_output)
{
    char *big = tu_path(tmp, "big.txt"), *out = tu_path(tmp, "packed"), *err = tu_path(tmp, "pack.err");
    char cmd[8400];
    snprintf(cmd, sizeof cmd, "python3 -c \"import random; r = random.Random(3); "
             "open('%s', 'w').write(' '.join(r.choice(['in', 'the', 'beginning', 'God', 'created']) "
             "for _ in range(6000000)))\"", big);
    cr_assert_eq(system(cmd), 0);
    char *argv[] = {(char *)tu_bigbatch_bin(), "pack", "--format", "text", "--in", big, "--seq-len", "64",
                    "--val-fraction", "0.1", "--out", out, NULL};
    bool second = false;
    for (int attempt = 0; attempt < 5 && !second; attempt++) {
        pid_t pid = start_logged(argv, "/dev/null", err);
        cr_assert(catches(pid, SIGINT, 30), "pack never installed its Ctrl-C handler");
        snprintf(cmd, sizeof cmd, "ls -a '%s' | grep -q '^\\.packed\\.partial-'", tmp);
        for (double t0 = now_s(); system(cmd) != 0 && now_s() - t0 < 20;) usleep(1000);
        cr_assert(kill_delivered(pid, SIGINT), "the first Ctrl-C was never delivered");
        kill(pid, SIGINT);
        int code = exit_within(pid, 20);
        char *e = (char *)tu_read_file(err, NULL);
        cr_assert_eq(code, 130, "exit %d: %s", code, e);
        second = strstr(e, "(removed the unfinished ") != NULL;
        cr_assert(system(cmd) != 0, "a partial output stayed after the Ctrl-C: %s", e);
        cr_assert(!tu_exists(out), "--out appeared: %s", e);
        free(e);
    }
    cr_assert(second, "no second Ctrl-C met pack while it wrote, in 5 attempts: the test proved nothing");
    free(big), free(out), free(err);
}

/* Every output of every command makes the directories its path names that
 * do not exist yet, as --save and pack do: one rule, no command refusing a
 * path another takes. */
Test(outputs, every_output_makes_its_missing_parent_directories)
{
    char *data = make_tokens("tokens", 170), *root = tu_path(tmp, "new"), *text = tu_path(tmp, "words.txt");
    tu_write_file(text, "the cat sat on the mat\n", 23);
    char *bin = (char *)tu_bigbatch_bin();
    char p[8][4200];
    static const char *const rel[] = {"a/ck", "b/t.json", "c/m.jsonl", "d/r.html", "e/w.safetensors", "f/hf",
                                      "g/tok.json", "h/page.html"};
    for (int i = 0; i < 8; i++) snprintf(p[i], sizeof p[i], "%s/%s", root, rel[i]);
    char *const cmds[][24] = {
        {bin, "train", "--data", data, "--layers", "1", "--d-model", "16", "--heads", "2", "--global-batch", "8",
         "--steps", "1", "--save", p[0], "--trace", p[1], "--metrics", p[2], "--report", p[3], "--quiet"},
        {bin, "export", "--ckpt", p[0], "--out", p[4]},
        {bin, "export", "--ckpt", p[0], "--format", "hf", "--out", p[5]},
        {bin, "tokenizer", "train", "--in", text, "--vocab", "260", "--out", p[6]},
        {bin, "report", "--metrics", p[2], "--out", p[7]},
    };
    for (size_t c = 0; c < sizeof cmds / sizeof *cmds; c++) {
        tu_run r = tu_run_argv(cmds[c]);
        cr_assert_eq(r.exit_code, 0, "bigbatch %s: %s", cmds[c][1], r.err);
        tu_run_free(&r);
    }
    for (int i = 0; i < 8; i++) cr_assert(tu_exists(p[i]), "%s was not written", p[i]);
    free(data), free(root), free(text);
}
