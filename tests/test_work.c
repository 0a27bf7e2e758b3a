/* test_work.c — never losing a user's work, part 2: outputs that replace
 * only regular files, one run per save directory and pruning that spares
 * what is not a checkpoint, a failed metrics write that saves first, a
 * resumed run that goes on saving, and inputs that are not what they claim
 * (overlapping or non-finite weights, foreign shards, changed data), and
 * defaults that depend on the directory. Helpers: train_fixture.h. */
#include <sys/resource.h>

#include "train_fixture.h"

TestSuite(work, .init = fixture_setup, .fini = fixture_teardown);

/* ---- outputs never destroy what they replace (issue 29, item 2) ------------ */
Test(work, outputs_replace_only_regular_files_never_a_device_fifo_or_an_input)
{
    char *data = make_tokens("tokens", 200), *ckpt = tu_path(tmp, "ckpt"), *metrics = tu_path(tmp, "m.jsonl");
    char *fifo = tu_path(tmp, "fifo"), *real = tu_path(tmp, "real.html"), *link = tu_path(tmp, "link.html");
    cr_assert_eq(mkfifo(fifo, 0644), 0);
    tu_run r = tu_bigbatch("train", "--data", data, "--layers", "1", "--d-model", "16", "--heads", "2", "--global-batch",
                           "8", "--micro-batch", "8", "--steps", "1", "--save", ckpt, "--metrics", metrics, "--quiet");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    struct stat st;
    /* a FIFO (as a device would be) is refused by every command that writes a file, and stays */
    r = tu_bigbatch("report", "--metrics", metrics, "--out", fifo);
    tu_assert_error(&r, "--out", fifo, "not a regular file (a FIFO)", "nothing written");
    tu_run_free(&r);
    r = tu_bigbatch("train", "--data", data, "--layers", "1", "--d-model", "16", "--heads", "2", "--steps", "1",
                    "--global-batch", "8", "--trace", fifo, "--quiet");
    tu_assert_error(&r, "--trace", fifo, "not a regular file");
    tu_run_free(&r);
    r = tu_bigbatch("export", "--ckpt", ckpt, "--out", fifo);
    tu_assert_error(&r, "--out", fifo, "not a regular file");
    tu_run_free(&r);
    cr_assert(stat(fifo, &st) == 0 && S_ISFIFO(st.st_mode), "the FIFO was replaced");
    /* an output that is one of the inputs: refused, the input unchanged */
    size_t before, after;
    uint8_t *a = tu_read_file(metrics, &before);
    r = tu_bigbatch("report", "--metrics", metrics, "--out", metrics);
    tu_assert_error(&r, "is one of the command's inputs");
    tu_run_free(&r);
    char *weights = tu_path(ckpt, "latest/model.safetensors");
    r = tu_bigbatch("export", "--ckpt", ckpt, "--out", weights);
    tu_assert_error(&r, "is one of the command's inputs");
    tu_run_free(&r);
    uint8_t *b = tu_read_file(metrics, &after);
    cr_assert(before == after && !memcmp(a, b, before), "the input was changed");
    /* a symbolic link to a regular file is followed: the link stays a link */
    tu_write_file(real, "old", 3);
    cr_assert_eq(symlink(real, link), 0);
    r = tu_bigbatch("report", "--metrics", metrics, "--out", link);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    cr_assert(lstat(link, &st) == 0 && S_ISLNK(st.st_mode), "the link was replaced by a file");
    char *page = (char *)tu_read_file(real, NULL);
    cr_assert_not_null(strstr(page, "<!DOCTYPE html>"), "the page was not written through the link");
    free(page), free(a), free(b), free(weights), free(link), free(real), free(fifo), free(metrics), free(ckpt), free(data);
}

/* ---- a resumed run goes on saving (issue 29, item 5) ----------------------- */
Test(work, resume_without_save_goes_on_saving_into_the_directory_with_its_keep_and_save_every)
{
    char *data = make_tokens("tokens", 400), *ckpt = tu_path(tmp, "ckpt");
    tu_run r = tu_bigbatch("train", "--data", data, "--layers", "1", "--d-model", "16", "--heads", "2", "--global-batch",
                           "32", "--micro-batch", "8", "--steps", "8", "--stop-after", "2", "--save", ckpt,
                           "--save-every", "1", "--keep", "3", "--quiet");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    /* a requeued job: nothing but --resume */
    r = tu_bigbatch("train", "--resume", ckpt, "--stop-after", "5", "--quiet");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    char *steps = step_dirs(ckpt);
    cr_assert_str_eq(steps, "step-00000003 step-00000004 step-00000005",
                     "every step saved (--save-every 1), the newest 3 kept (--keep 3): %s", steps);
    bb_checkpoint_info info;
    cr_assert_eq(bb_checkpoint_read_info(ckpt, &info), BB_OK, "%s", bb_error_message());
    cr_assert_eq(info.step, 5);
    /* told otherwise: --save elsewhere leaves DIR as it was */
    char *other = tu_path(tmp, "other");
    r = tu_bigbatch("train", "--resume", ckpt, "--stop-after", "6", "--save", other, "--quiet");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    char *again = step_dirs(ckpt);
    cr_assert_str_eq(again, steps);
    free(again), free(other), free(steps), free(ckpt), free(data);
}

/* ---- a save directory is one run's (issue 29, item 3) ---------------------- */
Test(work, a_save_directory_is_one_runs_and_pruning_spares_what_is_not_a_checkpoint)
{
    char *data = make_tokens("tokens", 400), *ckpt = tu_path(tmp, "ckpt"), *lock = tu_path(ckpt, ".lock");
    char *out = tu_path(tmp, "out"), *err = tu_path(tmp, "err");
    char *const first[] = {(char *)tu_bigbatch_bin(), "train", "--data", data, "--layers", "1", "--d-model", "16",
                           "--heads", "2", "--global-batch", "8", "--micro-batch", "8", "--steps", "100000", "--save",
                           ckpt, "--quiet", NULL};
    pid_t pid = start_logged(first, out, err);
    char want[32];
    snprintf(want, sizeof want, "%d ", (int)pid);
    bool locked = false;
    for (double end = now_s() + 30; !locked && now_s() < end && running(pid); usleep(20000)) {
        FILE *f = fopen(lock, "r");
        char line[300] = "";
        if (f && fgets(line, sizeof line, f)) locked = !strncmp(line, want, strlen(want));
        if (f) fclose(f);
    }
    cr_assert(locked, "the first run did not lock %s", ckpt);
    /* a second run into the same directory, even with --force: refused at once, naming the holder */
    tu_run r = tu_bigbatch("train", "--data", data, "--layers", "1", "--d-model", "16", "--heads", "2", "--global-batch",
                           "8", "--micro-batch", "8", "--steps", "2", "--save", ckpt, "--force", "--quiet");
    tu_assert_error(&r, "--save", "is in use by another run", want);
    tu_run_free(&r);
    cr_assert(running(pid), "the first run was disturbed");
    kill(pid, SIGKILL);
    exit_within(pid, 10);
    /* its lock file stays, stale: no obstacle */
    cr_assert_eq(access(lock, F_OK), 0);
    char *user = tu_path(ckpt, "step-99999999"), *notes = tu_path(user, "notes.txt");
    cr_assert_eq(mkdir(user, 0755), 0);
    tu_write_file(notes, "mine", 4);
    r = tu_bigbatch("train", "--data", data, "--layers", "1", "--d-model", "16", "--heads", "2", "--global-batch", "8",
                    "--micro-batch", "8", "--steps", "3", "--save", ckpt, "--save-every", "1", "--keep", "1", "--force",
                    "--quiet");
    cr_assert_eq(r.exit_code, 0, "a stale lock stopped the run: %s", r.err);
    tu_run_free(&r);
    /* --keep 1 removed the run's older checkpoints, and nothing that is not one */
    cr_assert_eq(access(notes, F_OK), 0, "pruning removed the user's step-99999999/");
    char *steps = step_dirs(ckpt);
    cr_assert_str_eq(steps, "step-00000003 step-99999999");
    free(steps), free(notes), free(user), free(err), free(out), free(lock), free(ckpt), free(data);
}

/* ---- a failed metrics write costs no work (issue 29, item 4) --------------- */
Test(work, a_metrics_write_that_fails_saves_the_step_first_and_removes_nothing)
{
    char *data = make_tokens("tokens", 400), *ckpt = tu_path(tmp, "ckpt"), *metrics = tu_path(tmp, "m.jsonl");
    /* files may grow to 120 KiB: the metrics file (a few hundred bytes a step) fails after about 350 steps,
     * while the checkpoint's files (64 and 92 KiB for this model) still fit: a disk that fills up */
    struct rlimit old, small = {120 << 10, 120 << 10};
    cr_assert_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, SIG_IGN); /* inherited: the write fails with EFBIG instead of killing */
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &small), 0);
    tu_run r = tu_bigbatch("train", "--data", data, "--layers", "1", "--d-model", "16", "--heads", "2", "--global-batch",
                           "8", "--micro-batch", "8", "--steps", "5000", "--save", ckpt, "--metrics", metrics,
                           "--quiet");
    setrlimit(RLIMIT_FSIZE, &old);
    tu_assert_error(&r, "--metrics", metrics, "write failed");
    tu_run_free(&r);
    /* no --save-every: only the save before stopping can have written it */
    bb_checkpoint_info info;
    cr_assert_eq(bb_checkpoint_read_info(ckpt, &info), BB_OK, "the work was lost: %s", bb_error_message());
    cr_assert_gt(info.step, 100, "saved at step %llu", (unsigned long long)info.step);
    free(metrics), free(ckpt), free(data);
}

/* ---- data that is not what it claims (issue 29, item 6) -------------------- */
/* Rewrites the safetensors file `path` with python3: `code` edits `h` (the
 * header, a dict) and `data` (a bytearray), and the checksum is dropped (a
 * file from elsewhere has none). */
static void edit_safetensors(const char *path, const char *code)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 - '%s' <<'EOF'\n"
             "import json, struct, sys\n"
             "b = open(sys.argv[1], 'rb').read(); n = struct.unpack('<Q', b[:8])[0]\n"
             "h = json.loads(b[8:8 + n]); data = bytearray(b[8 + n:])\n"
             "h['__metadata__'].pop('xxh64', None)\n"
             "%s\n"
             "t = json.dumps(h).encode(); t += b' ' * (-len(t) %% 8)\n"
             "open(sys.argv[1], 'wb').write(struct.pack('<Q', len(t)) + t + bytes(data))\n"
             "EOF",
             path, code);
    cr_assert_eq(system(cmd), 0, "python3 could not edit %s", path);
}

Test(work, weights_that_overlap_or_are_not_finite_and_foreign_shards_are_refused)
{
    char *data = make_tokens("tokens", 400), *ckpt = tu_path(tmp, "ckpt"), *w = tu_path(tmp, "w.safetensors");
    tu_run r = tu_bigbatch("train", "--data", data, "--layers", "1", "--d-model", "16", "--heads", "2", "--global-batch",
                           "8", "--micro-batch", "8", "--steps", "1", "--save", ckpt, "--quiet");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
#define EVAL_W "eval", "--init-from", w, "--data", data, "--layers", "1", "--d-model", "16", "--heads", "2"
    /* one tensor's bytes inside another's: the checksum cannot tell (there is none), the offsets can */
    r = tu_bigbatch("export", "--ckpt", ckpt, "--out", w);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    edit_safetensors(w, "h['transformer.h.0.ln_2.weight']['data_offsets'] = h['transformer.h.0.ln_1.weight']['data_offsets']");
    r = tu_bigbatch(EVAL_W);
    tu_assert_error(&r, w, "transformer.h.0.ln_1.weight", "overlap");
    tu_run_free(&r);
    /* a NaN among the weights: an error, not {"loss": null} */
    unlink(w);
    r = tu_bigbatch("export", "--ckpt", ckpt, "--out", w);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    edit_safetensors(w, "o = h['transformer.h.0.ln_1.weight']['data_offsets'][0]; data[o:o + 4] = struct.pack('<f', float('nan'))");
    r = tu_bigbatch(EVAL_W, "--json");
    tu_assert_error(&r, "transformer.h.0.ln_1.weight", "non-finite weights");
    cr_assert_eq(r.out[0], 0, "something was printed: %s", r.out);
    tu_run_free(&r);
#undef EVAL_W
    /* a shard of another dataset with the same layout, put in place of one */
    bb_shard_meta meta = {.kind = BB_RECORD_TOKENS_U16, .rank = 1, .shape = {TOKENS_T + 1},
                          .record_size = 2 * (TOKENS_T + 1), .classes_or_vocab = TOKENS_VOCAB};
    uint8_t *records = calloc(400, meta.record_size);
    tu_fill_random(records, 400 * meta.record_size, 5);
    for (size_t i = 0; i < 400 * meta.record_size; i += 2) records[i + 1] = 0, records[i] %= TOKENS_VOCAB;
    char *dirs[3] = {tu_path(tmp, "a"), tu_path(tmp, "b"), tu_path(tmp, "c")};
    for (int k = 0; k < 3; k++) {
        snprintf(meta.source, sizeof meta.source, "%s.txt", k == 1 ? "b" : "a");
        if (k == 2) records[0] ^= 1; /* c: another record than a's, the same source name */
        cr_assert_eq(mkdir(dirs[k], 0755), 0);
        bb_writer_options o = {.level = 1, .frame_bytes = 16 * meta.record_size, .shard_bytes = 4096, .threads = 1};
        bb_dataset_writer_t *wr;
        cr_assert_eq(bb_dataset_writer_create(dirs[k], &meta, &o, &wr), BB_OK, "%s", bb_error_message());
        cr_assert_eq(bb_dataset_writer_add(wr, records, 400), BB_OK);
        cr_assert_eq(bb_dataset_writer_finish(wr, NULL), BB_OK);
        bb_dataset_writer_destroy(wr);
    }
    char cmd[8400];
    snprintf(cmd, sizeof cmd, "cp '%s/shard-00001.bbs' '%s/shard-00001.bbs'", dirs[1], dirs[0]);
    cr_assert_eq(system(cmd), 0, "the datasets should have two shards at least");
    r = tu_bigbatch("inspect", dirs[0]);
    tu_assert_error(&r, "shard-00001.bbs", "packed from different sources", "a.txt", "b.txt");
    tu_run_free(&r);
    /* the same source name and layout, other records: the identity differs */
    snprintf(cmd, sizeof cmd, "cp '%s/shard-00001.bbs' '%s/shard-00001.bbs'", dirs[2], dirs[0]);
    cr_assert_eq(system(cmd), 0);
    r = tu_bigbatch("inspect", dirs[0]);
    tu_assert_error(&r, "shard-00001.bbs", "belong to different datasets", "identity");
    tu_run_free(&r);
    free(dirs[0]), free(dirs[1]), free(dirs[2]), free(records), free(w), free(ckpt), free(data);
}

/* ---- milder cases (issue 29, item 8) ---------------------------------------- */
Test(work, defaults_that_depend_on_the_directory_say_so_and_eval_takes_the_checkpoints_data)
{
    char *data = make_tokens("tokens", 200), *val = make_tokens("val", 40), *ckpt = tu_path(tmp, "ckpt");
    char cmd[8192];
    char *bin = realpath(tu_bigbatch_bin(), NULL);
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' plan --global-batch 8", tmp, bin);
    free(bin);
    tu_run r = tu_run_argv((char *const[]){"/bin/sh", "-c", cmd, NULL});
    tu_assert_error(&r, "no --data given", "data/kjv", "relative to the current directory", "pass --data DIR");
    tu_run_free(&r);
    r = tu_bigbatch("train", "--data", data, "--val-data", val, "--layers", "1", "--d-model", "16", "--heads", "2",
                    "--global-batch", "8", "--micro-batch", "8", "--steps", "1", "--save", ckpt, "--quiet");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    /* the checkpoint recorded its data: eval needs no --data */
    r = tu_bigbatch("eval", "--ckpt", ckpt, "--json");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert_not_null(strstr(r.out, "\"records\": 40"), "not the run's validation data: %s", r.out);
    tu_run_free(&r);
    free(ckpt), free(val), free(data);
}

/* The checkpoint records what its data was: replaced data under the same
 * path is said, not trained on silently (issue 29, item 6). */
Test(work, resume_says_when_the_data_under_the_same_path_changed)
{
    char *data = make_tokens("tokens", 400), *ckpt = tu_path(tmp, "ckpt");
    tu_run r = tu_bigbatch("train", "--data", data, "--layers", "1", "--d-model", "16", "--heads", "2", "--global-batch",
                           "32", "--micro-batch", "8", "--steps", "4", "--stop-after", "2", "--save", ckpt, "--quiet");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    char *same = tu_path(tmp, "same"), *other = tu_path(tmp, "other");
    r = tu_bigbatch("train", "--resume", ckpt, "--stop-after", "3", "--save", same, "--quiet");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert_null(strstr(r.err, "other records"), "the same data was taken for other data: %s", r.err);
    tu_run_free(&r);
    tu_rm_tree(data);
    free(make_tokens("tokens", 420)); /* other records where the run's data was */
    r = tu_bigbatch("train", "--resume", ckpt, "--stop-after", "3", "--save", other, "--quiet");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert_not_null(strstr(r.err, "holds other records than when the checkpoint was saved"), "%s", r.err);
    tu_run_free(&r);
    free(other), free(same), free(ckpt), free(data);
}
