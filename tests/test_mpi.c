/* test_mpi.c — training over processes (`mpirun -np P bigbatch train`):
 * partition invariance across processes with bitwise-equal parameters on
 * every rank, resume under another split, and faults that end the job
 * instead of hanging it. Runs mpirun on loopback (--oversubscribe: 4 ranks
 * on 2 cores); skipped, saying so, where MPI is not built or mpirun is
 * missing. A build without MPI is checked to refuse a launch of several
 * processes. Helpers: train_fixture.h. */
#include "bigbatch/world.h"
#include "train_fixture.h"

TestSuite(mpi, .init = fixture_setup, .fini = fixture_teardown);

static const char *mpirun(void)
{
    static const char *const paths[] = {"/usr/bin/mpirun", "/usr/local/bin/mpirun"};
    for (size_t i = 0; i < sizeof paths / sizeof *paths; i++)
        if (access(paths[i], X_OK) == 0) return paths[i];
    return NULL;
}

static void need_mpi(void)
{
    if (!strcmp(bb_world_library(), "none")) fixture_skip("skipped: this build has no MPI (make deps; make MPI=1)");
    if (!mpirun()) fixture_skip("skipped: no mpirun on this machine");
    /* Open MPI refuses root (CI) unless told; the harness says so, not the program. */
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
}

/* `bigbatch train ARGS` under `mpirun -np P` (P 0: no mpirun), devices cpu:N,
 * metrics to `metrics`; returns the run. */
static tu_run train_job(int P, int N, const char *data, const char *metrics, const char *extra)
{
    char cmd[8192], devices[16];
    snprintf(devices, sizeof devices, "cpu:%d", N);
    int n = P ? snprintf(cmd, sizeof cmd, "%s --oversubscribe -np %d ", mpirun(), P) : 0;
    snprintf(cmd + n, sizeof cmd - (size_t)n,
             "%s train --data %s --devices %s --global-batch 16 --micro-batch 2 --steps 4 --lr 3e-3 --log-every 0 "
             "--metrics %s %s", tu_bigbatch_bin(), data, devices, metrics, extra);
    return tu_run_argv((char *const[]){"/bin/sh", "-c", cmd, NULL});
}

/* P processes x N devices give one process's losses with P·N devices, and
 * every rank the same parameters (the job compares their hashes). */
static void check_splits(const char *data, const char *model)
{
    static const int splits[][2] = {{2, 2}, {4, 1}, {2, 1}};
    char *ref4 = tu_path(tmp, "ref4.jsonl"), *ref2 = tu_path(tmp, "ref2.jsonl"), *got = tu_path(tmp, "got.jsonl");
    tu_run r = train_job(0, 4, data, ref4, model);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    r = train_job(0, 2, data, ref2, model);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    for (size_t i = 0; i < sizeof splits / sizeof *splits; i++) {
        int P = splits[i][0], N = splits[i][1];
        r = train_job(P, N, data, got, model);
        char what[160], agree[64];
        snprintf(what, sizeof what, "%s, %d processes x cpu:%d", model, P, N);
        cr_assert_eq(r.exit_code, 0, "%s: %s", what, r.err);
        snprintf(agree, sizeof agree, "the %d processes' parameters are identical", P);
        cr_assert_not_null(strstr(r.err, agree), "%s: no '%s' in: %s", what, agree, r.err);
        expect_metrics_losses(P * N == 4 ? ref4 : ref2, got, 1, what);
        cr_log_info("%s: losses within 1e-5 of one process, parameters bitwise equal on every rank", what);
        tu_run_free(&r);
    }
    free(ref4), free(ref2), free(got);
}

Test(mpi, gpt_losses_match_one_process_and_ranks_agree_bitwise)
{
    need_mpi();
    char *data = make_tokens("tokens", 400);
    check_splits(data, "--model gpt --layers 2 --heads 2 --d-model 32");
    free(data);
}

Test(mpi, llama_losses_match_one_process_and_ranks_agree_bitwise)
{
    need_mpi();
    char *data = make_tokens("tokens", 400);
    check_splits(data, "--model llama --layers 2 --heads 4 --kv-heads 2 --d-model 32 --ffn 48 --zero 1");
    free(data);
}

Test(mpi, mlp_losses_match_one_process_and_ranks_agree_bitwise)
{
    need_mpi();
    char *data = make_images("images", 400, 1);
    check_splits(data, "--model mlp --hidden 32");
    free(data);
}

/* Saved at step 2 by 2 processes x cpu:2, resumed by 1 x cpu:4 and by
 * 4 x cpu:1: the remaining steps' losses are the uninterrupted run's. */
/* A ramp and an auto batch over processes: 2 processes x cpu:1 train
 * what one process with cpu:2 trains (the same chunks, the same batches:
 * every rank computes the same noise scale and moves the batch alike). */
Test(mpi, ramp_and_auto_batch_over_processes_train_as_one_process)
{
    need_mpi();
    char *data = make_tokens("tokens", 400), *ref = tu_path(tmp, "ref.jsonl"), *got = tu_path(tmp, "got.jsonl");
    const char *flags[] = {"--global-batch ramp:4..16:3 --steps 6", "--global-batch auto:4..16 --steps 6"};
    for (int i = 0; i < 2; i++) {
        tu_run r = train_job(0, 2, data, ref, flags[i]);
        cr_assert_eq(r.exit_code, 0, "%s", r.err);
        tu_run_free(&r);
        r = train_job(2, 1, data, got, flags[i]);
        cr_assert_eq(r.exit_code, 0, "%s: %s", flags[i], r.err);
        cr_assert_not_null(strstr(r.err, "the 2 processes' parameters are identical"), "%s: %s", flags[i], r.err);
        expect_metrics_losses(ref, got, 1, flags[i]);
        double a[8], b[8];
        int n = metric_values(ref, "global_batch", 1, a, 8);
        cr_assert_eq(n, 6, "%s: a batch per step", flags[i]);
        cr_assert_eq(metric_values(got, "global_batch", 1, b, 8), n);
        cr_assert_eq(memcmp(a, b, sizeof a[0] * (size_t)n), 0, "%s: the processes' batches differ", flags[i]);
        tu_run_free(&r);
    }
    free(data), free(ref), free(got);
}

Test(mpi, resume_under_another_split)
{
    need_mpi();
    char *data = make_tokens("tokens", 400);
    const char *model = "--model gpt --layers 2 --heads 2 --d-model 32";
    char *whole = tu_path(tmp, "whole.jsonl"), *part = tu_path(tmp, "part.jsonl"), *ckpt = tu_path(tmp, "ckpt");
    tu_run r = train_job(0, 4, data, whole, model);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    char extra[4400];
    snprintf(extra, sizeof extra, "%s --stop-after 2 --save %s", model, ckpt);
    r = train_job(2, 2, data, part, extra);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    static const int splits[][2] = {{0, 4}, {4, 1}};
    for (int i = 0; i < 2; i++) {
        char copy[4200], cmd[8600], *resumed = tu_path(tmp, i ? "r41.jsonl" : "r14.jsonl");
        snprintf(copy, sizeof copy, "%s-%d", ckpt, i);
        snprintf(cmd, sizeof cmd, "cp -r %s %s", ckpt, copy);
        cr_assert_eq(system(cmd), 0);
        snprintf(extra, sizeof extra, "--resume %s", copy);
        r = train_job(splits[i][0], splits[i][1], data, resumed, extra);
        cr_assert_eq(r.exit_code, 0, "resume under %d x cpu:%d: %s", splits[i][0], splits[i][1], r.err);
        expect_metrics_losses(whole, resumed, 3, i ? "resumed by 4 x cpu:1" : "resumed by 1 x cpu:4");
        tu_run_free(&r);
        free(resumed);
    }
    free(data), free(whole), free(part), free(ckpt);
}

/* Data that only rank 0 has: rank 1's one-line error, and the whole job
 * ends (not a hang), non-zero. */
Test(mpi, bad_data_on_one_rank_ends_the_job_with_its_error)
{
    need_mpi();
    char *data = make_tokens("tokens", 400), cmd[8192];
    snprintf(cmd, sizeof cmd,
             "%s --oversubscribe -np 2 sh -c 'if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then d=%s/nowhere; else d=%s; fi; "
             "exec %s train --data $d --global-batch 16 --micro-batch 2 --steps 400 --quiet'",
             mpirun(), tmp, data, tu_bigbatch_bin());
    char *out = tu_path(tmp, "out"), *err = tu_path(tmp, "err");
    double t0 = now_s();
    pid_t pid = start_logged((char *const[]){"/bin/sh", "-c", cmd, NULL}, out, err);
    int code = exit_within(pid, 30);
    cr_assert(code > 0, "the job should end non-zero within 30 s (exit %d after %.0f s)", code, now_s() - t0);
    char *text = (char *)tu_read_file(err, NULL);
    cr_assert_not_null(strstr(text, "bigbatch: rank 1: error: "), "rank 1's error: %s", text);
    cr_assert_not_null(strstr(text, "nowhere"), "the path: %s", text);
    cr_log_info("a bad --data on rank 1 ended the job in %.1f s, exit %d", now_s() - t0, code);
    free(text), free(out), free(err), free(data);
}

/* Ranks started with different --devices (2 devices on rank 1, 1 on rank
 * 0) would give NCCL duplicate or missing ranks: every rank refuses before
 * any device work, with one line naming its rank, and the job ends. */
Test(mpi, ranks_with_different_device_counts_are_refused)
{
    need_mpi();
    char *data = make_tokens("tokens", 400), cmd[8192];
    snprintf(cmd, sizeof cmd,
             "%s --oversubscribe -np 2 sh -c 'if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then n=2; else n=1; fi; "
             "exec %s train --data %s --devices cpu:$n --global-batch 16 --micro-batch 2 --steps 4 --quiet'",
             mpirun(), tu_bigbatch_bin(), data);
    char *out = tu_path(tmp, "out"), *err = tu_path(tmp, "err");
    pid_t pid = start_logged((char *const[]){"/bin/sh", "-c", cmd, NULL}, out, err);
    int code = exit_within(pid, 30);
    char *text = (char *)tu_read_file(err, NULL);
    cr_assert(code > 0, "the job should end non-zero (exit %d): %s", code, text);
    cr_assert_not_null(strstr(text, "every process must train on as many"), "the reason: %s", text);
    cr_assert(strstr(text, "bigbatch: rank 0: error: --devices gives this process 1 device") ||
                  strstr(text, "bigbatch: rank 1: error: --devices gives this process 2 devices"),
              "a line naming its rank: %s", text);
    free(text), free(out), free(err), free(data);
}

/* A 2-rank training job, with `extra` among its flags, whose rank 1 gets
 * `sig` once it trains; returns mpirun's pid, *victim rank 1's, and *err
 * the path of the job's stderr. */
static pid_t signal_rank_1(const char *extra, int sig, pid_t *victim, char **err)
{
    char *data = make_tokens("tokens", 400), cmd[8192];
    char *pids = tu_path(tmp, "pids"), *out = tu_path(tmp, "out");
    *err = tu_path(tmp, "err");
    snprintf(cmd, sizeof cmd,
             "%s --oversubscribe -np 2 sh -c 'echo $$ > %s.$OMPI_COMM_WORLD_RANK; exec %s train --data %s "
             "--global-batch 16 --micro-batch 2 --steps 100000 --quiet %s'",
             mpirun(), pids, tu_bigbatch_bin(), data, extra);
    pid_t pid = start_logged((char *const[]){"/bin/sh", "-c", cmd, NULL}, out, *err);
    char path[4200];
    snprintf(path, sizeof path, "%s.1", pids);
    for (double t0 = now_s(); !tu_exists(path) && now_s() - t0 < 20;) usleep(20000);
    usleep(1500000); /* training */
    cr_assert(running(pid), "the job ended before the signal");
    char *text = (char *)tu_read_file(path, NULL);
    *victim = (pid_t)atoi(text);
    free(text);
    cr_assert_eq(kill(*victim, sig), 0, "kill -%d %d", sig, (int)*victim);
    free(pids), free(out), free(data);
    return pid;
}

/* A preemption signal that reaches rank 1 only (SIGUSR1: Slurm's
 * --signal, or a node's own): every rank stops after the same step, rank 0
 * writes one checkpoint and says how to continue, the job exits 75; resumed
 * by 2 processes it gives the losses of a run never interrupted. `flags`:
 * the run's devices and ZeRO stage (ZeRO-1 over processes: every rank
 * joins the save with its shards). */
static void preempt_rank_1(const char *flags)
{
    char *ckpt = tu_path(tmp, "ckpt"), *data = tu_path(tmp, "tokens"), *err, extra[4400], clean[8600];
    snprintf(clean, sizeof clean, "rm -rf %s %s %s/pids.*", ckpt, data, tmp); /* a run before this one's */
    cr_assert_eq(system(clean), 0);
    snprintf(extra, sizeof extra, "%s --save %s --save-every 100000", flags, ckpt);
    pid_t victim, pid = signal_rank_1(extra, SIGUSR1, &victim, &err);
    int code = exit_within(pid, 30);
    char *e = (char *)tu_read_file(err, NULL);
    cr_assert_eq(code, 75, "%s: the job should exit 75 (exit %d): %s", flags, code, e);
    unsigned long long n = preempted_step(e, ckpt); /* one line, from rank 0 */
    cr_assert_gt(n, 0, "%s: rank 0's line: %s", flags, e);
    char *dirs = step_dirs(ckpt), want_dir[64];
    snprintf(want_dir, sizeof want_dir, "step-%08llu", n);
    cr_assert_str_eq(dirs, want_dir, "%s: one checkpoint, of step %llu", flags, n);
    /* resumed for 2 steps by 2 processes, against those steps never interrupted */
    char *mr = tu_path(tmp, "resumed.jsonl"), *mw = tu_path(tmp, "whole.jsonl");
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s --oversubscribe -np 2 %s train --resume %s --stop-after %llu --metrics %s --quiet",
             mpirun(), tu_bigbatch_bin(), ckpt, n + 2, mr);
    tu_run r = tu_run_argv((char *const[]){"/bin/sh", "-c", cmd, NULL});
    cr_assert_eq(r.exit_code, 0, "%s: resume: %s", flags, r.err);
    tu_run_free(&r);
    snprintf(cmd, sizeof cmd, "%s --oversubscribe -np 2 %s train --data %s --global-batch 16 --micro-batch 2 %s "
             "--steps 100000 --stop-after %llu --metrics %s --quiet", mpirun(), tu_bigbatch_bin(), data, flags, n + 2,
             mw);
    r = tu_run_argv((char *const[]){"/bin/sh", "-c", cmd, NULL});
    cr_assert_eq(r.exit_code, 0, "%s: the uninterrupted run: %s", flags, r.err);
    tu_run_free(&r);
    expect_metrics_losses(mw, mr, (int)n + 1, flags);
    cr_log_info("%s: SIGUSR1 to rank 1 only: both ranks stopped after step %llu, one checkpoint, exit 75; resumed "
                "steps %llu-%llu match the uninterrupted run", flags, n, n + 1, n + 2);
    free(dirs), free(data), free(mr), free(mw), free(e), free(err), free(ckpt);
}

Test(mpi, a_preemption_of_one_rank_stops_every_rank_with_one_checkpoint)
{
    need_mpi();
    preempt_rank_1("--devices cpu:1 --zero 0");
    preempt_rank_1("--devices cpu:2 --zero 1");
}

/* kill -9 of one rank mid-training: mpirun ends the job non-zero. */
Test(mpi, a_killed_rank_ends_the_job)
{
    need_mpi();
    pid_t victim;
    char *err;
    pid_t pid = signal_rank_1("", SIGKILL, &victim, &err);
    double t0 = now_s();
    int code = exit_within(pid, 30);
    cr_assert(code > 0, "the job should end non-zero within 30 s of the kill (exit %d)", code);
    cr_log_info("kill -9 of rank 1 ended the job in %.1f s, exit %d", now_s() - t0, code);
    free(err);
}

/* kill -STOP of one rank mid-training (a stalled or lost peer, which no
 * error reports): rank 0's watchdog sees no progress for --timeout 20 s
 * and ends the job, non-zero, within the timeout + 10 s, with one line
 * naming its rank and the collective it waits in. */
Test(mpi, a_stopped_rank_ends_the_job_within_the_timeout)
{
    need_mpi();
    pid_t victim;
    char *err;
    pid_t pid = signal_rank_1("--timeout 20", SIGSTOP, &victim, &err);
    double t0 = now_s();
    int code = exit_within(pid, 30);
    double took = now_s() - t0;
    if (code == -1) kill(victim, SIGKILL), kill(pid, SIGKILL), waitpid(pid, NULL, 0);
    char *e = (char *)tu_read_file(err, NULL);
    cr_log_info("kill -STOP of rank 1 ended the job in %.1f s, exit %d: %s", took, code, e);
    cr_assert(code > 0, "the job should end non-zero within --timeout 20 + 10 s of the stop (exit %d)", code);
    cr_assert_geq(took, 19, "it ended before the timeout (%.1f s)", took);
    int lines = 0;
    for (const char *at = e; (at = strstr(at, "bigbatch: ")); at++) lines++;
    cr_assert_eq(lines, 1, "one line of bigbatch's, not %d: %s", lines, e);
    cr_assert_not_null(strstr(e, "bigbatch: rank 0: error: no progress for"), "rank 0's line: %s", e);
    cr_assert_not_null(strstr(e, "--timeout 20"), "%s", e);
    cr_assert(strstr(e, "all-reduce") || strstr(e, "broadcast"), "the collective it waits in: %s", e);
    kill(victim, SIGKILL); /* already gone with the job; never left stopped */
    free(e), free(err);
}

/* A build without MPI refuses a launch of several processes rather than
 * training alone in each. */
Test(mpi, a_build_without_mpi_refuses_several_processes)
{
    if (strcmp(bb_world_library(), "none")) fixture_skip("skipped: this build has MPI (the MPI tests run instead)");
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    tu_run r = tu_bigbatch("train", "--steps", "1");
    unsetenv("OMPI_COMM_WORLD_SIZE");
    tu_assert_error(&r, "launched as 2 processes", "without MPI");
    tu_run_free(&r);
}

/* Every rank traces into its own file, and every track names its rank. */
Test(mpi, each_rank_writes_its_own_trace)
{
    need_mpi();
    char *data = make_tokens("tokens", 400), *metrics = tu_path(tmp, "m.jsonl"), *trace = tu_path(tmp, "t.json");
    char extra[4400], *rank1 = tu_path(tmp, "t.rank1.json");
    snprintf(extra, sizeof extra, "--model gpt --layers 1 --heads 2 --d-model 32 --trace %s", trace);
    tu_run r = train_job(2, 1, data, metrics, extra);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    char *t0 = (char *)tu_read_file(trace, NULL), *t1 = (char *)tu_read_file(rank1, NULL);
    cr_assert(strstr(t0, "rank 0 worker 0") && strstr(t0, "rank 0 reducer"), "rank 0's tracks");
    cr_assert(strstr(t1, "rank 1 worker 0") && strstr(t1, "rank 1 reducer"), "rank 1's tracks");
    free(t0), free(t1), free(rank1), free(trace), free(metrics), free(data);
    tu_run_free(&r);
}

/* 2 processes x cpu:2, buckets of 4 KiB, `flags`, saving into `save`. */
static void zero_job(const char *data, const char *metrics, const char *flags, const char *save)
{
    char extra[4400];
    snprintf(extra, sizeof extra, "--bucket-mib 0.004 %s --save %s", flags, save);
    tu_run r = train_job(2, 2, data, metrics, extra);
    cr_assert_eq(r.exit_code, 0, "%s: %s", flags, r.err);
    tu_run_free(&r);
}

/* File `name` of checkpoints a and b, byte for byte. */
static void same_file(const char *a, const char *b, const char *name, const char *what)
{
    char *fa = tu_path(a, name), *fb = tu_path(b, name);
    size_t na, nb;
    uint8_t *ba = tu_read_file(fa, &na), *bb = tu_read_file(fb, &nb);
    cr_assert(na == nb && !memcmp(ba, bb, na), "%s differs: %s", name, what);
    free(ba), free(bb), free(fa), free(fb);
}

/* The sharded checkpoint in `save`, resumed in one process on 4 devices
 * without --zero: one more step, finite. */
static void resume_unsharded(const char *data, const char *save, const char *metrics)
{
    char extra[4200];
    snprintf(extra, sizeof extra, "--bucket-mib 0.004 --resume %s --steps 5", save);
    tu_run r = train_job(0, 4, data, metrics, extra);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    double last[16];
    cr_assert_eq(metric_values(metrics, "loss", 5, last, 16), 1, "the resumed run's step 5");
    cr_assert(isfinite(last[0]));
}

/* --zero 1 over 2 processes x cpu:2 (4 shards, equal slices and whole
 * tensors): the losses of --zero 0, the same optimizer.bin (gathered from
 * every process), and that checkpoint resumes in one process without
 * sharding. */
Test(mpi, zero1_over_processes_trains_the_same_and_saves_one_state)
{
    need_mpi();
    char *data = make_tokens("tokens", 400);
    char *m0 = tu_path(tmp, "m0.jsonl"), *m1 = tu_path(tmp, "m1.jsonl"), *mr = tu_path(tmp, "mr.jsonl");
    char *c0 = tu_path(tmp, "c0"), *c1 = tu_path(tmp, "c1");
    zero_job(data, m0, "--zero 0", c0);
    zero_job(data, m1, "--zero 1", c1);
    expect_metrics_losses(m0, m1, 1, "--zero 1 over 2 processes");
    same_file(c0, c1, "latest/optimizer.bin", "--zero 0 and --zero 1 (gathered)");
    /* whole tensors: parts of unequal sizes in the all-gather, the same training and state */
    char *mt = tu_path(tmp, "mt.jsonl"), *ct = tu_path(tmp, "ct");
    zero_job(data, mt, "--zero 1 --zero-shards tensors", ct);
    expect_metrics_losses(m0, mt, 1, "--zero 1 --zero-shards tensors over 2 processes");
    same_file(c0, ct, "latest/optimizer.bin", "--zero 0 and --zero-shards tensors");
    free(ct), free(mt);
    resume_unsharded(data, c1, mr);
    cr_log_info("--zero 1 over 2 processes x cpu:2 (equal slices, whole tensors): --zero 0's losses, optimizer.bin "
                "byte for byte; resumed on cpu:4");
    free(m0), free(m1), free(mr), free(c0), free(c1), free(data);
}

/* --zero 2 over 2 processes x cpu:2: with one micro-step a step the
 * checkpoint's weights and optimizer.bin are --zero 0's byte for byte (the
 * same sums in the same order: each bucket summed over the processes, then
 * each process's owners' slices kept); over accumulated micro-steps the
 * losses of --zero 0; and its checkpoint resumes in one process. */
Test(mpi, zero2_over_processes_trains_the_same_and_saves_one_state)
{
    need_mpi();
    char *data = make_tokens("tokens", 400);
    char *m0 = tu_path(tmp, "m0.jsonl"), *m2 = tu_path(tmp, "m2.jsonl"), *ma = tu_path(tmp, "ma.jsonl"),
         *mr = tu_path(tmp, "mr.jsonl"), *c0 = tu_path(tmp, "c0"), *c2 = tu_path(tmp, "c2");
    zero_job(data, m0, "--micro-batch 4 --zero 0", c0);
    zero_job(data, m2, "--micro-batch 4 --zero 2", c2);
    expect_metrics_losses(m0, m2, 1, "--zero 2 over 2 processes");
    same_file(c0, c2, "latest/optimizer.bin", "--zero 0 and --zero 2, one micro-step a step");
    same_file(c0, c2, "latest/model.safetensors", "--zero 0 and --zero 2, one micro-step a step");
    /* two micro-steps a step: each reduced over the processes into the shards */
    tu_run r = train_job(2, 2, data, ma, "--bucket-mib 0.004 --zero 2");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    cr_assert_not_null(strstr(r.err, "the 2 processes' parameters are identical"), "%s", r.err);
    tu_run_free(&r);
    r = train_job(0, 4, data, mr, "--bucket-mib 0.004 --zero 0");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    expect_metrics_losses(mr, ma, 1, "--zero 2 over 2 processes, 2 micro-steps a step");
    resume_unsharded(data, c2, mr);
    cr_log_info("--zero 2 over 2 processes x cpu:2: --zero 0's weights and optimizer.bin byte for byte (one micro-step "
                "a step), its losses over two; resumed on cpu:4");
    free(m0), free(m2), free(ma), free(mr), free(c0), free(c2), free(data);
}

/* --zero 3 over 2 processes x cpu:2: each device gathers its weights on a
 * channel of its own (one MPI communicator a local device, the process's
 * own owners' slices copied). With one micro-step a step the checkpoint's
 * weights, optimizer.bin and the evaluation are --zero 0's byte for byte
 * (the evaluation reads the weights gathered from every process); over
 * accumulated micro-steps the losses of --zero 2 (which reduces the same);
 * its checkpoint resumes in one process. */
Test(mpi, zero3_over_processes_trains_the_same_and_saves_one_state)
{
    need_mpi();
    char *data = make_tokens("tokens", 400);
    char *m0 = tu_path(tmp, "m0.jsonl"), *m3 = tu_path(tmp, "m3.jsonl"), *ma = tu_path(tmp, "ma.jsonl"),
         *mb = tu_path(tmp, "mb.jsonl"), *mr = tu_path(tmp, "mr.jsonl"), *c0 = tu_path(tmp, "c0"),
         *c3 = tu_path(tmp, "c3");
    char flags[4400];
    for (int z = 0; z <= 3; z += 3) {
        snprintf(flags, sizeof flags, "--micro-batch 4 --zero %d --val-data %s --eval-every 2", z, data);
        zero_job(data, z ? m3 : m0, flags, z ? c3 : c0);
    }
    expect_metrics_losses(m0, m3, 1, "--zero 3 over 2 processes");
    same_file(c0, c3, "latest/optimizer.bin", "--zero 0 and --zero 3, one micro-step a step");
    same_file(c0, c3, "latest/model.safetensors", "--zero 0 and --zero 3, one micro-step a step");
    double v0[4], v3[4];
    int n0 = metric_values(m0, "val_loss", 1, v0, 4), n3 = metric_values(m3, "val_loss", 1, v3, 4);
    cr_assert(n0 == 2 && n3 == 2 && v0[0] == v3[0] && v0[1] == v3[1], "--zero 3's evaluations (%d) are not --zero "
              "0's (%d)", n3, n0);
    /* two micro-steps a step */
    const char *stage[] = {"--bucket-mib 0.004 --zero 2", "--bucket-mib 0.004 --zero 3"};
    for (int i = 0; i < 2; i++) {
        tu_run r = train_job(2, 2, data, i ? mb : ma, stage[i]);
        cr_assert_eq(r.exit_code, 0, "%s", r.err);
        cr_assert_not_null(strstr(r.err, "the 2 processes' parameters are identical"), "%s", r.err);
        tu_run_free(&r);
    }
    expect_metrics_losses(ma, mb, 1, "--zero 3 against --zero 2 over 2 processes, 2 micro-steps a step");
    resume_unsharded(data, c3, mr);
    cr_log_info("--zero 3 over 2 processes x cpu:2: --zero 0's weights, optimizer.bin and evaluations byte for byte "
                "(one micro-step a step), --zero 2's losses over two; resumed on cpu:4");
    free(m0), free(m3), free(ma), free(mb), free(mr), free(c0), free(c3), free(data);
}

/* Ranks started with other options than rank 0's (a job script that gives
 * rank 1 other flags) end the job at once, the differing rank naming what
 * differs, before anything depends on the options (issue 29, item 1). */
Test(mpi, ranks_started_with_other_options_or_data_are_refused_naming_what_differs)
{
    need_mpi();
    char *data = make_tokens("tokens", 400), *other = make_tokens("other", 400), cmd[8192];
    char rank1_data[4200];
    snprintf(rank1_data, sizeof rank1_data, "--data %s", other);
    const char *cases[][2] = {{"--layers 2", "--model is {"}, {"--zero 1", "--zero is 1 here, 0 on rank 0"},
                              {"--lr 0.01", "--lr is 0.01 here, 0.001 on rank 0"},
                              {"--global-batch 32", "--global-batch is 32 here, 16 on rank 0"},
                              {rank1_data, "holds other records than rank 0's data"}};
    char *out = tu_path(tmp, "out"), *err = tu_path(tmp, "err");
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        snprintf(cmd, sizeof cmd,
                 "%s --oversubscribe -np 2 sh -c 'if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then x=\"%s\"; fi; "
                 "exec %s train --data %s --layers 1 --d-model 16 --heads 2 --global-batch 16 --micro-batch 2 "
                 "--steps 4 --quiet $x'",
                 mpirun(), cases[i][0], tu_bigbatch_bin(), data);
        pid_t pid = start_logged((char *const[]){"/bin/sh", "-c", cmd, NULL}, out, err);
        int code = exit_within(pid, 30);
        char *text = (char *)tu_read_file(err, NULL);
        cr_assert(code > 0 && code != 128 + SIGKILL, "rank 1 with %s: the job should end non-zero at once (exit %d): %s",
                  cases[i][0], code, text);
        cr_assert_not_null(strstr(text, "bigbatch: rank 1: error: "), "rank 1 with %s: %s", cases[i][0], text);
        cr_assert_not_null(strstr(text, cases[i][1]), "rank 1 with %s: the message should say %s: %s", cases[i][0],
                           cases[i][1], text);
        free(text);
    }
    free(out), free(err), free(other), free(data);
}
