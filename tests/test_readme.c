/* test_readme.c — every "$ " line of README.md runs as written and exits 0.
 * The examples train for a while, so `make check` leaves this suite to
 * `make test`. */
#include <libgen.h>

#include "bigbatch/backend.h"
#include "bigbatch/world.h"
#include "test_util.h"

TestSuite(readme);

/* Whether what a "# needs X" comment names is here. */
static bool have(const char *what)
{
    if (!strcmp(what, "a GPU")) {
        bb_cuda_info info;
        bb_cuda_probe(&info);
        return info.device_count > 0;
    }
    if (!strcmp(what, "MPI")) { /* a build with MPI, and mpirun; CI runs as root, which Open MPI refuses unless told */
        setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
        setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
        return strcmp(bb_world_library(), "none") && system("command -v mpirun > /dev/null") == 0;
    }
    return access(what, R_OK) == 0; /* a path: data/fmnist, /usr/share/datasets/... */
}

/* Every line of README.md that starts with "$ " (indented or not) is an
 * example; a trailing backslash continues it. They run in order, from the
 * repository's root with the binary's directory first on PATH, and must
 * exit 0; "# needs X" at the end skips one where X is missing (saying so). */
Test(readme, examples_run_as_written)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    cr_skip_test("skipped: the examples train for a minute; `make test` runs them without a sanitizer");
#endif
    char *readme = (char *)tu_read_file("README.md", NULL);
    char *bin = strdup(tu_bigbatch_bin()), *bindir = dirname(bin), *tmp = tu_temp_dir(), *log = tu_path(tmp, "log");
    cr_assert_eq(system("rm -rf build/readme && mkdir -p build/readme"), 0);
    int ran = 0, skipped = 0;
    for (char *line = strtok(readme, "\n"); line; line = strtok(NULL, "\n")) {
        char *p = line + strspn(line, " ");
        if (strncmp(p, "$ ", 2)) continue;
        char cmd[8192] = "";
        size_t len = 0;
        for (p += 2;;) { /* join continuation lines */
            size_t n = strlen(p);
            bool more = n && p[n - 1] == '\\';
            if (more) n--;
            cr_assert_lt(len + n, sizeof cmd, "a README example is too long");
            memcpy(cmd + len, p, n);
            cmd[len += n] = 0;
            if (!more || !(p = strtok(NULL, "\n"))) break;
            p += strspn(p, " ");
        }
        char *needs = strstr(cmd, "# needs ");
        if (needs && !have(needs + 8)) {
            cr_log_info("skipped (needs %s): %s", needs + 8, cmd);
            skipped++;
            continue;
        }
        char run[16384];
        /* on lines of their own: the example may redirect, and end in a comment */
        snprintf(run, sizeof run, "PATH='%s':\"$PATH\"; export PATH; {\n%s\n} > '%s' 2>&1", bindir, cmd, log);
        int status = system(run);
        char *out = (char *)tu_read_file(log, NULL);
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "README example failed (status %d):\n$ %s\n%s",
                  WIFEXITED(status) ? WEXITSTATUS(status) : -1, cmd, out);
        free(out);
        ran++;
    }
    cr_log_info("%d README examples ran, %d skipped for what this machine lacks", ran, skipped);
    cr_assert_gt(ran, 15, "only %d examples found in README.md", ran);
    tu_rm_tree(tmp);
    free(readme), free(bin), free(log), free(tmp);
}
