/* checkpoint.c — training checkpoints: a step directory written whole and
 * synced, then published by renaming a new `latest` link over the old one.
 *
 *   DIR/latest -> step-00000100
 *   DIR/step-00000100/{model.safetensors, optimizer.bin, state.json}
 *   (and tokenizer.json, the training data's, when it has one)
 */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"

static bb_status join(char *out, size_t cap, const char *dir, const char *name)
{
    if ((size_t)snprintf(out, cap, "%s/%s", dir, name) >= cap) return bb_fail(BB_ERR_ARG, "path too long: %s", dir);
    return BB_OK;
}

/* A step directory bigbatch wrote: state.json, and nothing but its
 * files (and what a killed write of one left, NAME.tmp-PID). A directory
 * with anything else is the user's, never removed. */
static bool is_checkpoint_dir(const char *path)
{
    DIR *d = opendir(path);
    if (!d) return false;
    static const char *const ours[] = {"model.safetensors", "optimizer.bin", "state.json", "tokenizer.json"};
    bool state = false, only_ours = true;
    for (struct dirent *e; only_ours && (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        bool mine = false;
        for (size_t i = 0; i < sizeof ours / sizeof *ours && !mine; i++) {
            size_t n = strlen(ours[i]);
            mine = !strncmp(e->d_name, ours[i], n) && (!e->d_name[n] || !strncmp(e->d_name + n, ".tmp-", 5));
        }
        state = state || !strcmp(e->d_name, "state.json");
        only_ours = mine;
    }
    closedir(d);
    return state && only_ours;
}

/* Removes a step directory bigbatch wrote (flat: files only). */
static void remove_step_dir(const char *path)
{
    DIR *d = opendir(path);
    if (!d) return;
    struct dirent *e;
    char file[4096];
    while ((e = readdir(d)))
        if (e->d_name[0] != '.' || (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")))
            if (join(file, sizeof file, path, e->d_name) == BB_OK) unlink(file);
    closedir(d);
    rmdir(path);
}

/* BB_TEST_KILL_AT=POINT (tests): the process kills itself (SIGKILL, as a
 * power cut or the OOM killer would) at that point of a save or a prune:
 * save-model (the temporary directory holds the weights only), save-rename
 * (written, not yet renamed), latest (the new link made, not yet renamed
 * over `latest`), prune (an old step renamed hidden, one file of it gone). */
static void test_kill_at(const char *point)
{
    const char *at = getenv("BB_TEST_KILL_AT");
    if (at && !strcmp(at, point)) raise(SIGKILL);
}

/* Removes a published step directory crash-safely: renamed first to a
 * hidden `.step-….prune-PID` (which the next save's prune removes if this
 * process dies before it is gone), so that a kill at any point leaves
 * either the whole checkpoint or nothing the user could take for theirs. */
static void discard_step_dir(const char *path)
{
    char hidden[4096];
    const char *slash = strrchr(path, '/');
    size_t dir_len = slash ? (size_t)(slash - path) + 1 : 0;
    if ((size_t)snprintf(hidden, sizeof hidden, "%.*s.%s.prune-%d", (int)dir_len, path, path + dir_len,
                         (int)getpid()) >= sizeof hidden || rename(path, hidden) != 0) {
        remove_step_dir(path); /* nothing to rename (gone), or a path too long: as before */
        return;
    }
    if (getenv("BB_TEST_KILL_AT")) { /* one file gone, then the kill */
        char file[4200];
        snprintf(file, sizeof file, "%s/state.json", hidden);
        unlink(file);
        test_kill_at("prune");
    }
    remove_step_dir(hidden);
}

static bb_status write_state(const char *path, const checkpoint_state *st, const bb_model_config *c,
                             const bb_optimizer *o)
{
    const bb_optimizer_config *oc = &o->cfg;
    char producer[64];
    snprintf(producer, sizeof producer, "bigbatch %s", BB_VERSION);
    /* The run draws no random numbers besides the seeded data order and
     * initialisation: (seed, step) is the whole RNG state. */
    char identity[24];
    snprintf(identity, sizeof identity, "%016llx", (unsigned long long)st->data_identity);
    json_t *j = json_pack("{s:s, s:i, s:s, s:I, s:I, s:I, s:I, s:I, s:i, s:o, s:s, s:s, s:s, s:s, s:i, s:I, s:i, s:I, "
                          "s:o}",
                          "format",
                          "bigbatch-checkpoint", "version", 1, "producer", producer, "step", (json_int_t)st->step,
                          "epoch", (json_int_t)st->epoch, "step_in_epoch", (json_int_t)st->step_in_epoch,
                          "total_steps", (json_int_t)st->total_steps, "seed", (json_int_t)st->seed, "global_batch",
                          st->global_batch, "loss", bb_json_real(st->loss, 17), "data", st->data ? st->data : "",
                          "data_identity", identity,
                          "val_data", st->val_data ? st->val_data : "", "devices", st->devices ? st->devices : "",
                          "micro_batch", st->micro_batch, "shuffle_frames", (json_int_t)st->shuffle_frames, "keep",
                          st->keep, "save_every", (json_int_t)st->save_every, "noise_scale",
                          json_pack("{s:o, s:o, s:I}", "g2", bb_json_real(st->noise.g2, 17), "trace",
                                    bb_json_real(st->noise.trace, 17), "steps", (json_int_t)st->noise.steps));
    json_t *opt = json_pack("{s:i, s:s, s:s, s:s, s:f, s:s, s:i, s:s, s:I, s:f, s:f, s:f, s:f, s:f, s:f, s:f}",
                            "checkpoint_every",
                            c->recompute_every, "checkpoint_plan", c->recompute_plan, "precision", bb_precision_name(c->precision), "optimizer",
                            bb_optimizer_kind_name(oc->kind), "lr", oc->lr, "lr_scale", bb_lr_scale_name(oc->lr_scale),
                            "base_batch", oc->base_batch, "lr_schedule",
                            bb_lr_schedule_name(oc->schedule),
                            "warmup", (json_int_t)oc->warmup, "beta1", oc->beta1, "beta2", oc->beta2, "eps", oc->eps,
                            "momentum", oc->momentum, "trust_coefficient", oc->trust_coefficient, "weight_decay",
                            oc->weight_decay, "grad_clip", oc->grad_clip);
    if (j) json_object_set_new(j, "order", json_integer(st->order));
    if (j && st->data_url) json_object_set_new(j, "data_url", json_string(st->data_url)); /* remote data */
    if (j && st->val_data_url) json_object_set_new(j, "val_data_url", json_string(st->val_data_url));
    json_t *ramp = j && st->ramp_from ? json_pack("{s:i, s:I}", "from", st->ramp_from, "steps",
                                                  (json_int_t)st->ramp_steps) : NULL;
    if (ramp && st->auto_batch) /* and where it stands: the chunks taken, the next step's micro-steps */
        json_object_update_new(ramp, json_pack("{s:b, s:I, s:i}", "auto", 1, "chunks", (json_int_t)st->auto_chunks,
                                               "accumulation", st->auto_accumulation));
    if (ramp) json_object_set_new(j, "batch_ramp", ramp);
    bb_status rc = j && opt ? bb_model_config_to_json(j, c) : bb_fail(BB_ERR_NOMEM, "%s: out of memory", path);
    if (rc == BB_OK && json_object_update(j, opt)) rc = bb_fail(BB_ERR_NOMEM, "%s: out of memory", path);
    if (rc == BB_OK) rc = bb_json_write_file(j, path);
    json_decref(j);
    json_decref(opt);
    return rc;
}

static bb_status sync_dir(const char *dir)
{
    char probe[4096];
    BB_TRY(join(probe, sizeof probe, dir, "."));
    return bb_fsync_dir_of(probe);
}

/* mkdir -p; *created (may be NULL) tells whether `dir` itself was made.
 * `flag` names the directory in messages (the options' save_dir). */
static bb_status make_dirs(const char *flag, const char *dir, bool *created)
{
    char path[4096];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path) return bb_fail(BB_ERR_ARG, "path too long: %s", dir);
    if (created) *created = false;
    for (char *p = path + 1;; p++) {
        bool end = *p == 0;
        if (*p != '/' && !end) continue;
        *p = 0;
        if (mkdir(path, 0777) == 0) {
            if (end && created) *created = true;
        } else if (errno != EEXIST) {
            return bb_fail_errno(BB_ERR_IO, "%s %s: cannot create %s", flag, dir, path);
        }
        if (end) break;
        *p = '/';
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) return bb_fail(BB_ERR_IO, "%s %s: not a directory", flag, dir);
    if (access(dir, W_OK) != 0) return bb_fail_errno(BB_ERR_IO, "%s %s: not writable", flag, dir);
    return BB_OK;
}

/* "step-00000012" and "step-00000012-4242" (the same step saved again by
 * another process): the step number, or -1 for any other name. */
static long long step_of(const char *name)
{
    if (strncmp(name, "step-", 5) || name[5] < '0' || name[5] > '9') return -1;
    return strtoll(name + 5, NULL, 10);
}

/* Names one checkpoint `dir` holds (its `latest`, else a step directory)
 * into `what`; false when it holds none. */
static bool holds_checkpoints(const char *dir, char *what, size_t cap)
{
    char link[4096], target[256];
    ssize_t n = join(link, sizeof link, dir, "latest") == BB_OK ? readlink(link, target, sizeof target - 1) : -1;
    if (n > 0) {
        target[n] = 0;
        snprintf(what, cap, "latest -> %s", target);
        return true;
    }
    DIR *d = opendir(dir);
    struct dirent *e;
    bool found = false;
    while (d && !found && (e = readdir(d)))
        if ((found = step_of(e->d_name) >= 0)) snprintf(what, cap, "%s", e->d_name);
    if (d) closedir(d);
    return found;
}

static bool same_directory(const char *a, const char *b)
{
    struct stat x, y;
    return stat(a, &x) == 0 && stat(b, &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

/* DIR/.lock, locked (flock) for the run's life: one run per directory. It
 * holds "PID HOST" of its holder, for the message; the kernel releases the
 * lock of a process that dies, so a stale file is no obstacle. */
static bb_status lock_dir(const bb_train_options *o, int *fd_out)
{
    char path[4096];
    const char *save = bb_train_option_name(o, BB_TRAIN_SAVE);
    BB_TRY(join(path, sizeof path, o->save_dir, BB_CHECKPOINT_LOCK));
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return bb_fail_errno(BB_ERR_IO, "%s %s: cannot create %s", save, o->save_dir, path);
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int err = errno;
        char holder[300] = "";
        ssize_t n = pread(fd, holder, sizeof holder - 1, 0);
        holder[n > 0 ? n : 0] = 0;
        holder[strcspn(holder, "\n")] = 0;
        int pid = 0;
        char host[256] = "?";
        sscanf(holder, "%d %255s", &pid, host);
        close(fd);
        if (err != EWOULDBLOCK) return bb_fail(BB_ERR_IO, "%s: cannot lock: %s", path, strerror(err));
        return bb_fail(BB_ERR_IO, "%s %s is in use by another run (PID %d on %s): two runs would remove each "
                       "other's checkpoints; wait for it to end, or save elsewhere", save, o->save_dir, pid, host);
    }
    char host[256] = "?", line[300];
    gethostname(host, sizeof host - 1);
    int len = snprintf(line, sizeof line, "%d %s\n", (int)getpid(), host);
    /* only a second run's message reads it: a failed write costs nothing else */
    bool written = ftruncate(fd, 0) == 0 && pwrite(fd, line, (size_t)len, 0) == len;
    if (!written) BB_WARN("%s: cannot record this run in it: %s", path, strerror(errno));
    *fd_out = fd;
    return BB_OK;
}

bb_status bb_checkpoint_prepare(const bb_train_options *o, const char *resume_root, bool *created, int *lock_fd)
{
    *lock_fd = -1;
    const char *dir = o->save_dir, *save = bb_train_option_name(o, BB_TRAIN_SAVE);
    BB_TRY(make_dirs(save, dir, created));
    BB_TRY(lock_dir(o, lock_fd));
    char what[300];
    if (o->force || !holds_checkpoints(dir, what, sizeof what) || (resume_root && same_directory(dir, resume_root)))
        return BB_OK;
    bb_checkpoint_unlock(*lock_fd, dir, false);
    *lock_fd = -1;
    return bb_fail(BB_ERR_ARG,
                   "%s %s holds another run's checkpoints (%s): continue that run with %s %s, save elsewhere, or "
                   "pass %s to save here anyway (they then count towards %s)", save, dir, what,
                   bb_train_option_name(o, BB_TRAIN_RESUME), dir, bb_train_option_name(o, BB_TRAIN_FORCE),
                   bb_train_option_name(o, BB_TRAIN_KEEP));
}

void bb_checkpoint_unlock(int fd, const char *dir, bool remove)
{
    if (fd < 0) return;
    char path[4096];
    if (remove && join(path, sizeof path, dir, BB_CHECKPOINT_LOCK) == BB_OK) unlink(path); /* before the lock goes */
    close(fd);
}

/* Newest first: by step, then by name (a step saved again sorts after). */
static int newest_first(const void *x, const void *y)
{
    const char *a = x, *b = y;
    long long sa = step_of(a), sb = step_of(b);
    return sa != sb ? (sa < sb) - (sa > sb) : -strcmp(a, b);
}

/* Keeps the newest `keep` step directories (counting `current`, the one
 * just published), and removes what killed or failed saves left. */
static void prune(const char *dir, const char *current, int keep)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char file[4096], (*steps)[256] = NULL;
    size_t count = 0, cap = 0;
    while ((e = readdir(d))) {
        if (!strncmp(e->d_name, ".step-", 6) && join(file, sizeof file, dir, e->d_name) == BB_OK) remove_step_dir(file);
        if (!strncmp(e->d_name, ".latest.tmp-", 12) && join(file, sizeof file, dir, e->d_name) == BB_OK) unlink(file);
        if (step_of(e->d_name) < 0 || !strcmp(e->d_name, current) || strlen(e->d_name) >= sizeof *steps) continue;
        if (join(file, sizeof file, dir, e->d_name) != BB_OK || !is_checkpoint_dir(file)) continue; /* the user's */
        if (count == cap) {
            void *grown = realloc(steps, (cap = cap ? 2 * cap : 16) * sizeof *steps);
            if (!grown) break; /* keeps more than asked rather than failing a saved run */
            steps = grown;
        }
        snprintf(steps[count++], sizeof *steps, "%s", e->d_name);
    }
    closedir(d);
    if (count) qsort(steps, count, sizeof *steps, newest_first);
    for (size_t i = keep > 1 ? (size_t)keep - 1 : 0; i < count; i++)
        if (join(file, sizeof file, dir, steps[i]) == BB_OK) discard_step_dir(file);
    free(steps);
}

/* Writes the step directory under its temporary name. */
static bb_status write_step(const char *tmp, const checkpoint_state *st, bb_model_t *m, bb_backend_t *const *be,
                            const bb_optimizer *const *o, int n)
{
    char file[4096];
    if (mkdir(tmp, 0777) != 0) return bb_fail_errno(BB_ERR_IO, "%s: cannot create", tmp);
    BB_TRY(join(file, sizeof file, tmp, "model.safetensors"));
    BB_TRY(bb_model_save_safetensors(m, file));
    test_kill_at("save-model");
    BB_TRY(join(file, sizeof file, tmp, "optimizer.bin"));
    BB_TRY(bb_optimizer_save(be, o, n, bb_model_param_count(m), st->gather, file));
    BB_TRY(join(file, sizeof file, tmp, "state.json"));
    BB_TRY(write_state(file, st, bb_model_get_config(m), o[0]));
    if (st->tokenizer && *st->tokenizer) { /* sample and export decode with it */
        BB_TRY(join(file, sizeof file, tmp, "tokenizer.json"));
        BB_TRY(bb_copy_file(st->tokenizer, file));
    }
    return sync_dir(tmp);
}

bb_status bb_checkpoint_save(const char *dir, const checkpoint_state *st, bb_model_t *m, bb_backend_t *const *be,
                             const bb_optimizer *const *o, int opts, int keep, char *name_out, size_t name_cap)
{
    BB_TRY(make_dirs(dir, dir, NULL));
    char name[64], tmp[4096], final[4096], link_tmp[4096], link[4096], current[256] = "";
    snprintf(name, sizeof name, "step-%08llu", (unsigned long long)st->step);
    BB_TRY(join(link, sizeof link, dir, "latest"));
    ssize_t n = readlink(link, current, sizeof current - 1);
    if (n > 0) current[n] = 0;
    /* `latest` already names this step (another run saved it): a new name,
     * so that the published directory is never touched. */
    if (!strncmp(current, name, strlen(name)))
        snprintf(name, sizeof name, "step-%08llu-%d", (unsigned long long)st->step, (int)getpid());
    char tmp_name[96];
    snprintf(tmp_name, sizeof tmp_name, ".%s.tmp-%d", name, (int)getpid());
    BB_TRY(join(tmp, sizeof tmp, dir, tmp_name));
    BB_TRY(join(final, sizeof final, dir, name));
    remove_step_dir(tmp);
    int tracked = bb_temp_track(tmp); /* a second signal removes it */
    bb_status rc = write_step(tmp, st, m, be, o, opts);
    struct stat sb;
    if (rc == BB_OK && stat(final, &sb) == 0 && !is_checkpoint_dir(final))
        rc = bb_fail(BB_ERR_IO, "%s exists and is not a bigbatch checkpoint: move it away (nothing of it was "
                     "touched)", final);
    if (rc == BB_OK) discard_step_dir(final); /* a stale one from a run that died before publishing it */
    if (rc == BB_OK) test_kill_at("save-rename");
    if (rc == BB_OK && rename(tmp, final) != 0) rc = bb_fail_errno(BB_ERR_IO, "%s: cannot rename to %s", tmp, final);
    if (rc != BB_OK) remove_step_dir(tmp); /* a failed save leaves nothing behind */
    bb_temp_untrack(tracked);
    BB_TRY(rc);
    BB_TRY(sync_dir(dir));
    /* Publish: a new link renamed over `latest` (rename is atomic). */
    snprintf(tmp_name, sizeof tmp_name, ".latest.tmp-%d", (int)getpid());
    BB_TRY(join(link_tmp, sizeof link_tmp, dir, tmp_name));
    unlink(link_tmp);
    tracked = bb_temp_track(link_tmp);
    if (symlink(name, link_tmp) != 0) rc = bb_fail_errno(BB_ERR_IO, "%s: cannot create a link", link_tmp);
    if (rc == BB_OK) test_kill_at("latest");
    if (rc == BB_OK && rename(link_tmp, link) != 0) rc = bb_fail_errno(BB_ERR_IO, "%s: cannot replace", link);
    if (rc != BB_OK) unlink(link_tmp);
    bb_temp_untrack(tracked);
    BB_TRY(rc);
    BB_TRY(sync_dir(dir));
    /* Only now may older checkpoints go, past the newest `keep`. */
    prune(dir, name, keep);
    snprintf(name_out, name_cap, "%s", name);
    return BB_OK;
}

/* ---- reading ------------------------------------------------------------ */

/* Where the checkpoint `ckpt_dir` names lives: its step directory and the
 * directory of step directories, and its state.json (into `path`). */
static bb_status locate(const char *ckpt_dir, bb_checkpoint_info *info, char *path, size_t cap)
{
    char link[4096], target[256];
    BB_TRY(join(path, cap, ckpt_dir, "state.json"));
    if (access(path, F_OK) == 0) { /* a step directory (or DIR/latest) itself */
        snprintf(info->dir, sizeof info->dir, "%s", ckpt_dir);
        snprintf(info->root, sizeof info->root, "%s", ckpt_dir);
        char *slash = strrchr(info->root, '/');
        if (slash && slash != info->root) *slash = 0;
        else snprintf(info->root, sizeof info->root, slash ? "/" : ".");
        return BB_OK;
    }
    BB_TRY(join(link, sizeof link, ckpt_dir, "latest"));
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n <= 0) return bb_fail_errno(BB_ERR_IO, "%s: no checkpoint here (cannot read %s)", ckpt_dir, link);
    target[n] = 0;
    BB_TRY(join(info->dir, sizeof info->dir, ckpt_dir, target));
    snprintf(info->root, sizeof info->root, "%s", ckpt_dir);
    info->via_latest = true;
    return join(path, cap, info->dir, "state.json");
}

/* The fields of state.json; the optional ones are absent in checkpoints
 * from before --precision bf16 and before resume remembered them. */
static bb_status read_state(const json_t *j, const char *path, bb_checkpoint_info *info)
{
    char format[64], opt[16], schedule[16], precision[16] = "fp32";
    bb_model_config *c = &info->model;
    bb_optimizer_config *oc = &info->opt;
    BB_TRY(bb_json_req_string(j, path, "format", format, sizeof format));
    if (strcmp(format, "bigbatch-checkpoint"))
        return bb_fail(BB_ERR_FORMAT, "%s: \"format\" is \"%s\", not a bigbatch checkpoint", path, format);
    BB_TRY(bb_json_req_u64(j, path, "step", &info->step));
    BB_TRY(bb_json_req_u64(j, path, "seed", &info->seed));
    BB_TRY(bb_json_req_u64(j, path, "total_steps", &info->total_steps));
    BB_TRY(bb_json_req_int(j, path, "global_batch", &info->global_batch));
    BB_TRY(bb_json_req_string(j, path, "data", info->data, sizeof info->data));
    BB_TRY(bb_json_opt_string(j, path, "data_identity", info->data_identity, sizeof info->data_identity));
    BB_TRY(bb_json_opt_string(j, path, "val_data", info->val_data, sizeof info->val_data));
    BB_TRY(bb_json_opt_string(j, path, "data_url", info->data_url, sizeof info->data_url));
    BB_TRY(bb_json_opt_string(j, path, "val_data_url", info->val_data_url, sizeof info->val_data_url));
    BB_TRY(bb_json_opt_string(j, path, "devices", info->devices, sizeof info->devices));
    BB_TRY(bb_json_opt_int(j, path, "micro_batch", &info->micro_batch));
    int frames = 0;
    BB_TRY(bb_json_opt_int(j, path, "shuffle_frames", &frames));
    info->shuffle_frames = (uint32_t)frames;
    int order = 0; /* before versions, the order was version 1 */
    BB_TRY(bb_json_opt_int(j, path, "order", &order));
    if (order < 0 || order > BB_ORDER_CURRENT)
        return bb_fail(BB_ERR_FORMAT, "%s: \"order\" %d: this bigbatch knows data orders 1 to %d", path, order,
                       BB_ORDER_CURRENT);
    info->order = (uint32_t)order;
    BB_TRY(bb_json_opt_int(j, path, "keep", &info->keep));
    BB_TRY(bb_json_opt_u64(j, path, "save_every", &info->save_every));
    const json_t *ramp = json_object_get(j, "batch_ramp"); /* only a run with a batch ramp writes one */
    if (ramp) {
        BB_TRY(bb_json_req_int(ramp, path, "from", &info->ramp_from));
        BB_TRY(bb_json_req_u64(ramp, path, "steps", &info->ramp_steps));
        info->auto_batch = json_is_true(json_object_get(ramp, "auto"));
        if (info->auto_batch) {
            BB_TRY(bb_json_req_u64(ramp, path, "chunks", &info->auto_chunks));
            BB_TRY(bb_json_req_int(ramp, path, "accumulation", &info->auto_accumulation));
            if (info->auto_accumulation < 1)
                return bb_fail(BB_ERR_FORMAT, "%s: \"batch_ramp\": \"accumulation\" %d: must be at least 1", path,
                               info->auto_accumulation);
        }
    }
    const json_t *noise = json_object_get(j, "noise_scale"); /* before the noise scale, none was written */
    if (noise) {
        BB_TRY(bb_json_req_double(noise, path, "g2", &info->noise.g2));
        BB_TRY(bb_json_req_double(noise, path, "trace", &info->noise.trace));
        BB_TRY(bb_json_req_u64(noise, path, "steps", &info->noise.steps));
    }
    BB_TRY(bb_model_config_from_json(j, path, c));
    BB_TRY(bb_json_req_int(j, path, "checkpoint_every", &c->recompute_every));
    BB_TRY(bb_json_opt_string(j, path, "checkpoint_plan", c->recompute_plan, sizeof c->recompute_plan));
    if (bb_model_check_recompute(c) != BB_OK)
        return bb_fail(BB_ERR_FORMAT, "%s: \"checkpoint_plan\" \"%s\" does not fit the model: %s", path,
                       c->recompute_plan, bb_error_message());
    BB_TRY(bb_json_opt_string(j, path, "precision", precision, sizeof precision));
    if (bb_precision_parse(precision, &c->precision) != BB_OK)
        return bb_fail(BB_ERR_FORMAT, "%s: \"precision\" is \"%s\", not fp32 or bf16", path, precision);
    BB_TRY(bb_json_req_string(j, path, "optimizer", opt, sizeof opt));
    if (bb_optimizer_kind_parse(opt, &oc->kind) != BB_OK)
        return bb_fail(BB_ERR_FORMAT, "%s: \"optimizer\" is \"%s\", not one of %s", path, opt, bb_optimizer_choices());
    BB_TRY(bb_json_req_string(j, path, "lr_schedule", schedule, sizeof schedule));
    if (bb_lr_schedule_parse(schedule, &oc->schedule) != BB_OK)
        return bb_fail(BB_ERR_FORMAT, "%s: \"lr_schedule\" is \"%s\", not cosine or constant", path, schedule);
    BB_TRY(bb_json_req_double(j, path, "lr", &oc->lr));
    char scale[16] = "none"; /* before --lr-scale, none was written */
    BB_TRY(bb_json_opt_string(j, path, "lr_scale", scale, sizeof scale));
    if (bb_lr_scale_parse(scale, &oc->lr_scale) != BB_OK)
        return bb_fail(BB_ERR_FORMAT, "%s: \"lr_scale\" is \"%s\", not none, linear or sqrt", path, scale);
    BB_TRY(bb_json_opt_int(j, path, "base_batch", &oc->base_batch));
    BB_TRY(bb_json_req_u64(j, path, "warmup", &oc->warmup));
    BB_TRY(bb_json_req_double(j, path, "beta1", &oc->beta1));
    BB_TRY(bb_json_req_double(j, path, "beta2", &oc->beta2));
    BB_TRY(bb_json_req_double(j, path, "eps", &oc->eps));
    BB_TRY(bb_json_req_double(j, path, "momentum", &oc->momentum));
    oc->trust_coefficient = bb_optimizer_defaults().trust_coefficient; /* before LARS, none was written */
    BB_TRY(bb_json_opt_double(j, path, "trust_coefficient", &oc->trust_coefficient));
    BB_TRY(bb_json_req_double(j, path, "weight_decay", &oc->weight_decay));
    return bb_json_req_double(j, path, "grad_clip", &oc->grad_clip);
}

bool bb_checkpoint_none_yet(const char *dir)
{
    const char *base = strrchr(dir, '/');
    base = base ? base + 1 : dir;
    if (!strcmp(base, "latest") || step_of(base) >= 0) return false; /* a checkpoint named: it must be there */
    struct stat st;
    if (lstat(dir, &st) != 0) return errno == ENOENT;
    char what[300];
    return S_ISDIR(st.st_mode) && !holds_checkpoints(dir, what, sizeof what);
}

/* The step directory's state.json is JSON (what a suggestion can check
 * without loading it). */
static bool state_parses(const char *step_dir)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/state.json", step_dir);
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    json_decref(j);
    return j != NULL;
}

/* A failure to read the checkpoint `latest` names in `root`, with the
 * newest other whole step directory there named as the way on, if any. */
static bb_status suggest_older(bb_status rc, const bb_checkpoint_info *info)
{
    if (rc == BB_OK || !info->via_latest) return rc; /* the user named the step */
    const char *root = info->root, *dir = info->dir;
    DIR *d = opendir(root);
    char best[256] = "", file[4096];
    const char *failed = strrchr(dir, '/') ? strrchr(dir, '/') + 1 : dir;
    for (struct dirent *e; d && (e = readdir(d));)
        if (step_of(e->d_name) >= 0 && strcmp(e->d_name, failed) && strlen(e->d_name) < sizeof best &&
            (!best[0] || newest_first(e->d_name, best) < 0) && join(file, sizeof file, root, e->d_name) == BB_OK &&
            is_checkpoint_dir(file) && state_parses(file))
            snprintf(best, sizeof best, "%s", e->d_name);
    if (d) closedir(d);
    if (!best[0]) return rc;
    char message[1024];
    snprintf(message, sizeof message, "%s", bb_error_message());
    return bb_fail(rc, "%s; the newest other checkpoint there may load: %s/%s", message, root, best);
}

bb_status bb_checkpoint_read_info(const char *ckpt_dir, bb_checkpoint_info *info)
{
    memset(info, 0, sizeof *info);
    char path[4096];
    BB_TRY(locate(ckpt_dir, info, path, sizeof path));
    json_t *j;
    bb_status rc = bb_json_load_file(path, true, &j);
    if (rc == BB_OK) rc = read_state(j, path, info), json_decref(j);
    return suggest_older(rc, info);
}

bb_status bb_checkpoint_load_weights(const bb_checkpoint_info *info, bb_model_t *m)
{
    char path[4096];
    BB_TRY(join(path, sizeof path, info->dir, "model.safetensors"));
    return suggest_older(bb_model_load_safetensors(m, path), info);
}

bb_status bb_checkpoint_load_optimizer(const bb_checkpoint_info *info, bb_backend_t *be, bb_optimizer *o,
                                       size_t param_count)
{
    char path[4096];
    BB_TRY(join(path, sizeof path, info->dir, "optimizer.bin"));
    return bb_optimizer_load(be, o, param_count, path);
}
