/* test_preempt.c — preemption, the way schedulers do it: SIGTERM (or
 * Slurm's --signal=USR1@N) saves at the next step boundary and exits 75, a
 * status a requeue script tells from a failure; the resumed run is the
 * uninterrupted one, bitwise; a second signal stops at once without a
 * partial checkpoint; a signal during a save or an evaluation still leaves
 * a checkpoint that loads; and --resume of a directory with no checkpoint
 * yet starts the run there (so a job script can always pass it). Over
 * processes: test_mpi.c. Helpers: train_fixture.h. */
#include <dirent.h>

#include "train_fixture.h"

TestSuite(preempt, .init = fixture_setup, .fini = fixture_teardown);

/* `bigbatch train` of a small gpt with `extra` (space-separated words). */
static tu_run train_cmd(const char *data, const char *extra)
{
    char cmd[16384];
    snprintf(cmd, sizeof cmd, "'%s' train --data '%s' --layers 2 --d-model 16 --heads 2 --global-batch 16 "
             "--micro-batch 4 --lr 3e-3 --log-every 0 %s", tu_bigbatch_bin(), data, extra);
    return tu_run_argv((char *const[]){"/bin/sh", "-c", cmd, NULL});
}

/* SIGTERM, SIGUSR1 and SIGHUP (a closed terminal or ssh session), each in
 * the middle of a long run: the step ends, is saved, the line says how to
 * continue, exit 75; the run resumed from there gives the losses of a run
 * never interrupted, bitwise. */
Test(preempt, sigterm_sigusr1_and_sighup_save_at_the_step_boundary_exit_75_and_resume_bitwise)
{
    char *data = make_tokens("tokens", 400);
    static const int sigs[] = {SIGTERM, SIGUSR1, SIGHUP};
    static const char *const dirs[] = {"ck-term", "ck-usr1", "ck-hup"};
    for (int i = 0; i < 3; i++) {
        char *ckpt = tu_path(tmp, dirs[i]), *err = tu_path(tmp, "err");
        char *argv[] = {(char *)tu_bigbatch_bin(), "train", "--data", data, "--layers", "2", "--d-model", "16",
                        "--heads", "2", "--global-batch", "16", "--micro-batch", "4", "--lr", "3e-3", "--steps",
                        "100000", "--save", ckpt, "--save-every", "100000", "--log-every", "0", NULL};
        pid_t pid = start_logged(argv, "/dev/null", err);
        cr_assert(catches(pid, sigs[i], 30), "the run never installed its %s handler", strsignal(sigs[i]));
        cr_assert(running(pid), "the run ended before the signal");
        cr_assert_eq(kill(pid, sigs[i]), 0);
        int code = exit_within(pid, 10);
        char *e = (char *)tu_read_file(err, NULL);
        cr_assert_eq(code, 75, "%s: exit %d, 75 expected: %s", strsignal(sigs[i]), code, e);
        unsigned long long n = preempted_step(e, ckpt);
        cr_assert_gt(n, 0, "%s: no preemption line: %s", strsignal(sigs[i]), e);
        bb_checkpoint_info info;
        cr_assert_eq(bb_checkpoint_read_info(ckpt, &info), BB_OK, "%s", bb_error_message());
        cr_assert_eq(info.step, n, "the checkpoint is at step %llu, the line says %llu",
                     (unsigned long long)info.step, n);
        /* resumed for 3 steps against the same 3 steps never interrupted */
        char extra[8600], *mr = tu_path(tmp, "resumed.jsonl"), *mw = tu_path(tmp, "whole.jsonl");
        snprintf(extra, sizeof extra, "--resume '%s' --stop-after %llu --metrics '%s' --quiet", ckpt, n + 3, mr);
        tu_run r = train_cmd(data, extra);
        cr_assert_eq(r.exit_code, 0, "%s", r.err);
        tu_run_free(&r);
        snprintf(extra, sizeof extra, "--steps 100000 --stop-after %llu --metrics '%s' --quiet", n + 3, mw);
        r = train_cmd(data, extra);
        cr_assert_eq(r.exit_code, 0, "%s", r.err);
        tu_run_free(&r);
        char *got = metric_losses(mr, n + 1), *want = metric_losses(mw, n + 1);
        cr_assert(*want && !strcmp(got, want), "%s at step %llu: resumed %s, uninterrupted %s", strsignal(sigs[i]), n,
                  got, want);
        cr_log_info("%s: saved step %llu, exit 75; resumed steps %llu-%llu bitwise the uninterrupted run's",
                    strsignal(sigs[i]), n, n + 1, n + 3);
        free(got), free(want), free(mr), free(mw), free(e), free(ckpt), free(err);
    }
    free(data);
}

/* A 4.5M-parameter mlp on micro-batches of 1: a step takes far less time
 * than writing its 54 MB checkpoint, so a save is nearly always under way.
 * Starts it saving every step; returns its pid once it wrote one. */
static pid_t start_saving_every_step(const char *data, const char *ckpt, const char *err)
{
    char *latest = tu_path(ckpt, "latest");
    tu_rm_tree(ckpt);
    char *argv[] = {(char *)tu_bigbatch_bin(), "train", "--model", "mlp", "--hidden", "1500,1500,1000", "--data",
                    (char *)data, "--global-batch", "1", "--micro-batch", "1", "--steps", "100000", "--save",
                    (char *)ckpt, "--save-every", "1", "--log-every", "0", NULL};
    pid_t pid = start_logged(argv, "/dev/null", err);
    for (double t0 = now_s(); !tu_exists(latest) && now_s() - t0 < 30;) usleep(2000);
    cr_assert(tu_exists(latest), "no first checkpoint within 30 s");
    free(latest);
    return pid;
}

/* Waits (up to 5 s) until a save is being written: its temporary step
 * directory is there. */
static bool wait_for_a_save(const char *ckpt)
{
    for (double t0 = now_s(); now_s() - t0 < 5;)
        if (has_temp_step_dir(ckpt)) return true;
    return false;
}

/* SIGTERM while a checkpoint is being written: that save completes, and
 * the run stops at the next step boundary, saved (exit 75). A second SIGTERM during the next
 * save (the preemption's own) stops at once, exit 130: its partial
 * directory is never published, it is removed before the exit (the line
 * names it), and the previous checkpoint loads. */
Test(preempt, a_signal_during_a_save_and_a_second_signal_leave_a_checkpoint_that_loads)
{
    char *data = make_images("images", 600, 2), *ckpt = tu_path(tmp, "ckpt"), *err = tu_path(tmp, "err");
    /* one signal mid-save */
    pid_t pid = start_saving_every_step(data, ckpt, err);
    cr_assert(wait_for_a_save(ckpt), "no save under way");
    kill(pid, SIGTERM);
    int code = exit_within(pid, 20);
    char *e = (char *)tu_read_file(err, NULL);
    cr_assert_eq(code, 75, "exit %d after SIGTERM during a save: %s", code, e);
    unsigned long long n = preempted_step(e, ckpt);
    bb_checkpoint_info info;
    cr_assert_eq(bb_checkpoint_read_info(ckpt, &info), BB_OK, "%s", bb_error_message());
    cr_assert_eq(info.step, n, "the run stopped at step %llu, latest is step %llu", n, (unsigned long long)info.step);
    cr_assert(!has_temp_step_dir(ckpt), "a temporary step directory stayed after a clean stop");
    free(e);
    /* a second signal mid-save: at once, nothing half-written published */
    int mid_save = 0;
    for (int attempt = 0; attempt < 8 && !mid_save; attempt++) {
        pid = start_saving_every_step(data, ckpt, err);
        cr_assert(wait_for_a_save(ckpt), "no save under way");
        cr_assert(kill_delivered(pid, SIGTERM), "the first SIGTERM was never delivered"); /* two pending are one */
        double t0 = now_s();
        kill(pid, SIGTERM);
        code = exit_within(pid, 10);
        double took = now_s() - t0;
        e = (char *)tu_read_file(err, NULL);
        if (code == 75) { /* the first one's save was done before the second signal: try again */
            free(e);
            continue;
        }
        cr_assert_eq(code, 130, "exit %d after a second SIGTERM: %s", code, e);
        cr_assert_not_null(strstr(e, "interrupted again: stopping now"), "%s", e);
        cr_assert_null(strstr(e, "preempted: saved"), "a second signal must not report a save: %s", e);
        mid_save = strstr(e, "(removed the unfinished ") != NULL; /* the save being written, unpublished */
        cr_assert(!has_temp_step_dir(ckpt), "the second signal left the unfinished save behind: %s", e);
        tu_run r = tu_bigbatch("eval", "--ckpt", ckpt, "--data", data, "--json");
        cr_assert_eq(r.exit_code, 0, "after a second SIGTERM the checkpoint does not load: %s", r.err);
        tu_run_free(&r);
        cr_log_info("second SIGTERM: exit 130 in %.3f s%s; the previous checkpoint loads", took,
                    mid_save ? ", a save half-written, not published and removed" : "");
        free(e);
    }
    cr_assert(mid_save, "no second signal landed during a save in 8 attempts; the test proved nothing");
    free(ckpt), free(err), free(data);
}

/* A preemption while the evaluation after a saved step runs: the
 * evaluation stops (said so), the run stops with that step's checkpoint,
 * exit 75, and it resumes. */
Test(preempt, a_preemption_during_evaluation_stops_it_and_keeps_the_saved_step)
{
    char *data = make_tokens("tokens", 400), *val = make_tokens("val", 60000);
    char *ckpt = tu_path(tmp, "ckpt"), *latest = tu_path(ckpt, "latest"), *err = tu_path(tmp, "err");
    char *argv[] = {(char *)tu_bigbatch_bin(), "train", "--data", data, "--val-data", val, "--layers", "2",
                    "--d-model", "64", "--heads", "2", "--global-batch", "8", "--micro-batch", "8", "--steps",
                    "100000", "--save", ckpt, "--save-every", "4", "--eval-every", "4", "--log-every", "0", NULL};
    pid_t pid = start_logged(argv, "/dev/null", err);
    for (double t0 = now_s(); !tu_exists(latest) && now_s() - t0 < 30;) usleep(2000);
    cr_assert(tu_exists(latest), "no checkpoint within 30 s");
    kill(pid, SIGUSR1); /* step 4 is saved: its evaluation of 60000 records is under way, or next */
    int code = exit_within(pid, 20);
    char *e = (char *)tu_read_file(err, NULL);
    cr_assert_eq(code, 75, "exit %d: %s", code, e);
    cr_assert_not_null(strstr(e, "eval step 4: stopped (interrupted after "), "the evaluation was not stopped: %s", e);
    cr_assert_eq(preempted_step(e, ckpt), 4, "%s", e);
    tu_run r = tu_bigbatch("train", "--resume", ckpt, "--stop-after", "6", "--val-data", data, "--quiet");
    cr_assert_eq(r.exit_code, 0, "the run does not resume: %s", r.err);
    tu_run_free(&r);
    bb_checkpoint_info info;
    cr_assert_eq(bb_checkpoint_read_info(ckpt, &info), BB_OK, "%s", bb_error_message());
    cr_assert_eq(info.step, 6);
    free(e), free(err), free(latest), free(ckpt), free(val), free(data);
}

/* A job script passes --resume DIR on its first run too: a directory that
 * does not exist, or holds no checkpoint yet, starts the run and saves
 * there; the next run continues it. A named step that is not there, or a
 * damaged `latest`, stays an error: no run starts over by mistake. */
Test(preempt, resume_of_a_directory_without_a_checkpoint_starts_the_run_there)
{
    char *data = make_tokens("tokens", 400), *ckpt = tu_path(tmp, "new/ckpt"), extra[4400];
    snprintf(extra, sizeof extra, "--resume '%s' --steps 6 --stop-after 3", ckpt);
    tu_run r = train_cmd(data, extra);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    char expect[4400];
    snprintf(expect, sizeof expect, "train: --resume %s holds no checkpoint yet: starting the run, saving into %s",
             ckpt, ckpt);
    cr_assert_not_null(strstr(r.err, expect), "%s", r.err);
    tu_run_free(&r);
    snprintf(extra, sizeof extra, "--resume '%s'", ckpt); /* the same line again: continues to step 6 */
    r = train_cmd(data, extra);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert_null(strstr(r.err, "no checkpoint yet"), "%s", r.err);
    tu_run_free(&r);
    bb_checkpoint_info info;
    cr_assert_eq(bb_checkpoint_read_info(ckpt, &info), BB_OK, "%s", bb_error_message());
    cr_assert_eq(info.step, 6);
    /* an empty directory: the same */
    char *empty = tu_path(tmp, "empty");
    cr_assert_eq(mkdir(empty, 0777), 0);
    snprintf(extra, sizeof extra, "--resume '%s' --steps 2 --quiet", empty);
    r = train_cmd(data, extra);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    cr_assert_eq(bb_checkpoint_read_info(empty, &info), BB_OK, "%s", bb_error_message());
    /* a step directory that is not there, a dangling latest: errors */
    snprintf(extra, sizeof extra, "--resume '%s/step-00000099' --quiet", ckpt);
    r = train_cmd(data, extra);
    cr_assert_eq(r.exit_code, 1, "a missing step directory: %s", r.err);
    tu_run_free(&r);
    char *link = tu_path(empty, "latest"), cmd[8400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'/step-* && ln -sfn step-00000002 '%s'", empty, link);
    cr_assert_eq(system(cmd), 0);
    snprintf(extra, sizeof extra, "--resume '%s' --quiet", empty);
    r = train_cmd(data, extra);
    cr_assert_eq(r.exit_code, 1, "a damaged checkpoint must not start a new run: %s", r.err);
    cr_assert_null(strstr(r.err, "no checkpoint yet"), "%s", r.err);
    tu_run_free(&r);
    free(link), free(empty), free(ckpt), free(data);
}

/* What `dir` holds after a kill: every step-N directory a whole checkpoint
 * (state.json, model.safetensors, optimizer.bin, nothing else), `latest`
 * naming one of them, the user's notes.txt untouched; hidden names
 * (".step-…", ".latest.tmp-…") are the only leftovers. Returns how many
 * hidden leftovers there are. */
static int check_checkpoints(const char *dir, const char *when)
{
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "%s: %s is gone", when, dir);
    int hidden = 0, steps = 0;
    for (struct dirent *e; (e = readdir(d));) {
        const char *n = e->d_name;
        if (!strcmp(n, ".") || !strcmp(n, "..") || !strcmp(n, "latest") || !strcmp(n, "notes.txt") ||
            !strcmp(n, ".lock")) /* the run's lock file */
            continue;
        if (n[0] == '.') {
            hidden++;
            continue;
        }
        cr_assert(!strncmp(n, "step-", 5), "%s: %s/%s is neither a checkpoint nor the user's", when, dir, n);
        steps++;
        static const char *const whole[] = {"state.json", "model.safetensors", "optimizer.bin"};
        char path[4400];
        int files = 0;
        snprintf(path, sizeof path, "%s/%s", dir, n);
        DIR *s = opendir(path);
        cr_assert_not_null(s);
        for (struct dirent *f; (f = readdir(s));)
            if (f->d_name[0] != '.') files++;
        closedir(s);
        for (int i = 0; i < 3; i++) {
            snprintf(path, sizeof path, "%s/%s/%s", dir, n, whole[i]);
            cr_assert(tu_exists(path), "%s: %s/%s has no %s: a half-removed or half-written step", when, dir, n,
                      whole[i]);
        }
        cr_assert_eq(files, 3, "%s: %s/%s holds %d files, not a checkpoint's 3", when, dir, n, files);
    }
    closedir(d);
    cr_assert_gt(steps, 0, "%s: no checkpoint left in %s", when, dir);
    bb_checkpoint_info info;
    cr_assert_eq(bb_checkpoint_read_info(dir, &info), BB_OK, "%s: latest: %s", when, bb_error_message());
    char notes[4400];
    snprintf(notes, sizeof notes, "%s/notes.txt", dir);
    cr_assert(tu_exists(notes), "%s: the user's notes.txt was removed", when);
    return hidden;
}

/* kill -9 at each point of a save and of a prune (BB_TEST_KILL_AT), and at
 * random moments of a run saving every step with --keep 1: only whole
 * checkpoints and the user's own file are left, the newest loads, and the
 * next run (resumed) removes the hidden leftovers. */
Test(preempt, kill_9_at_any_point_of_a_save_or_a_prune_leaves_only_whole_checkpoints)
{
    char *data = make_images("images", 600, 2), *ckpt = tu_path(tmp, "ck-kill"), *err = tu_path(tmp, "err");
    static const char *const points[] = {"save-model", "save-rename", "latest", "prune"};
    cr_assert_eq(mkdir(ckpt, 0777), 0);
    char *notes = tu_path(ckpt, "notes.txt");
    tu_write_file(notes, "mine\n", 5);
    free(notes);
    char *argv[] = {(char *)tu_bigbatch_bin(), "train", "--model", "mlp", "--hidden", "64", "--data", data,
                    "--global-batch", "8", "--micro-batch", "8", "--steps", "100000", "--save-every", "1", "--keep",
                    "1", "--resume", ckpt, "--log-every", "0", NULL};
    /* a first checkpoint, so that every kill below has one to keep */
    tu_run r = tu_bigbatch("train", "--model", "mlp", "--hidden", "64", "--data", data, "--global-batch", "8",
                           "--micro-batch", "8", "--steps", "2", "--resume", ckpt, "--quiet");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    for (size_t i = 0; i < sizeof points / sizeof *points; i++) {
        setenv("BB_TEST_KILL_AT", points[i], 1);
        int code = exit_within(start_logged(argv, "/dev/null", err), 30);
        unsetenv("BB_TEST_KILL_AT");
        char *e = (char *)tu_read_file(err, NULL);
        size_t len = strlen(e);
        cr_assert_eq(code, 128 + SIGKILL, "BB_TEST_KILL_AT=%s: exit %d, not killed: ...%s", points[i], code,
                     e + (len > 300 ? len - 300 : 0));
        free(e);
        int hidden = check_checkpoints(ckpt, points[i]);
        cr_log_info("killed at %s: whole checkpoints only, %d hidden leftover(s)", points[i], hidden);
    }
    srand(7);
    for (int k = 0; k < 5; k++) { /* at random moments: mostly inside a save or a prune */
        pid_t pid = start_logged(argv, "/dev/null", err);
        usleep(200000 + (useconds_t)(rand() % 800000));
        kill(pid, SIGKILL);
        exit_within(pid, 10);
        char when[32];
        snprintf(when, sizeof when, "random kill %d", k);
        check_checkpoints(ckpt, when);
    }
    /* the next run continues and removes the leftovers */
    bb_checkpoint_info info;
    cr_assert_eq(bb_checkpoint_read_info(ckpt, &info), BB_OK, "%s", bb_error_message());
    char stop[32];
    snprintf(stop, sizeof stop, "%llu", (unsigned long long)info.step + 1);
    r = tu_bigbatch("train", "--model", "mlp", "--hidden", "64", "--data", data, "--global-batch", "8",
                    "--micro-batch", "8", "--steps", "100000", "--stop-after", stop, "--keep", "1", "--resume", ckpt,
                    "--quiet");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    cr_assert_eq(check_checkpoints(ckpt, "the next run"), 0, "the next run left hidden leftovers");
    r = tu_bigbatch("eval", "--ckpt", ckpt, "--data", data, "--json");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    free(data), free(ckpt), free(err);
}
