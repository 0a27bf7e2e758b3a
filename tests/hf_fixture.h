/* hf_fixture.h — what the suites that compare with Hugging Face's packages
 * share (test_tokenizer.c, test_hf.c): the pinned `tokenizers` and
 * `transformers` in build/hf (`make hf-deps`; a test says skipped, with
 * the reason, where they could not be installed), the KJV text, and shell
 * commands run with their output captured. */
#ifndef BIGBATCH_HF_FIXTURE_H
#define BIGBATCH_HF_FIXTURE_H

#include <stdarg.h>

#include "train_fixture.h"

#define HF_PYTHON "build/hf/bin/python"

/* Skips the test unless build/hf's python imports `modules` (e.g.
 * "tokenizers" or "tokenizers, transformers"). */
static inline void hf_require(const char *modules)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s -c 'import %s' >/dev/null 2>&1", HF_PYTHON, modules);
    if (access(HF_PYTHON, X_OK) != 0 || system(cmd) != 0)
        fixture_skip("skipped: %s cannot import %s (make hf-deps installs the pinned versions from PyPI; it could "
                     "not here)", HF_PYTHON, modules);
}

/* Runs a printf-formatted shell command; its output captured. */
static inline tu_run sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline tu_run sh(const char *fmt, ...)
{
    char cmd[16384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    return tu_run_argv((char *const[]){"/bin/sh", "-c", cmd, NULL});
}

/* The same, which must exit 0; returns its stdout (the caller frees it). */
static inline char *sh_ok(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline char *sh_ok(const char *fmt, ...)
{
    char cmd[16384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    tu_run r = tu_run_argv((char *const[]){"/bin/sh", "-c", cmd, NULL});
    cr_assert_eq(r.exit_code, 0, "%s: exit %d: %s", cmd, r.exit_code, r.err);
    free(r.err);
    return r.out;
}

/* The whole King James text (Debian's bible-kjv), once per test, under tmp. */
static inline char *kjv_text(void)
{
    char *path = tu_path(tmp, "kjv.txt");
    free(sh_ok("bible -f gen1:1-rev22:21 > '%s'", path));
    return path;
}

/* The first `bytes` bytes of the KJV text, at tmp/NAME. */
static inline char *kjv_head(size_t bytes, const char *name)
{
    char *kjv = kjv_text(), *path = tu_path(tmp, name);
    free(sh_ok("head -c %zu '%s' > '%s'", bytes, kjv, path));
    free(kjv);
    return path;
}

/* A tokenizer trained on `text` by bigbatch, `vocab` ids, at tmp/NAME. */
static inline char *train_ours(const char *text, int vocab, const char *name)
{
    char *out = tu_path(tmp, name);
    free(sh_ok("'%s' tokenizer train --in '%s' --vocab %d --out '%s' 2>/dev/null", tu_bigbatch_bin(), text, vocab,
               out));
    return out;
}

#endif /* BIGBATCH_HF_FIXTURE_H */
