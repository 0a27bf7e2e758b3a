/* test_core.c — status codes, errors, check macros, logging, CLI parsing. */
#include <errno.h>
#include <pthread.h>

#include "bigbatch/core.h"
#include "test_util.h"

TestSuite(core);

static bb_status fails_with_io(const char *path) { return bb_fail(BB_ERR_IO, "%s: cannot open", path); }

static bb_status propagates(const char *path, int *reached_end)
{
    BB_TRY(fails_with_io(path));
    *reached_end = 1;
    return BB_OK;
}

static bb_status propagates_goto(int *cleaned)
{
    bb_status rc;
    BB_TRY_GOTO(bb_fail(BB_ERR_CORRUPT, "frame %d bad", 3), rc, fail);
    return BB_OK;
fail:
    *cleaned = 1;
    return rc;
}

Test(core, status_names_are_distinct_and_total)
{
    for (int i = 0; i < BB_STATUS_COUNT; i++) {
        cr_assert_not_null(bb_status_name((bb_status)i));
        cr_assert_str_neq(bb_status_name((bb_status)i), "unknown status", "status %d has no name", i);
        for (int j = 0; j < i; j++) cr_assert_str_neq(bb_status_name((bb_status)i), bb_status_name((bb_status)j));
    }
    cr_assert_str_eq(bb_status_name((bb_status)999), "unknown status");
}

Test(core, try_propagates_status_and_message)
{
    int reached = 0;
    bb_error_clear();
    cr_assert_str_eq(bb_error_message(), "");
    cr_assert_eq(propagates("data/x.bbs", &reached), BB_ERR_IO);
    cr_assert_eq(reached, 0);
    cr_assert_str_eq(bb_error_message(), "data/x.bbs: cannot open");
    cr_assert_not_null(strstr(bb_error_origin(), "test_core.c:"), "origin: %s", bb_error_origin());
}

Test(core, try_goto_runs_cleanup)
{
    int cleaned = 0;
    cr_assert_eq(propagates_goto(&cleaned), BB_ERR_CORRUPT);
    cr_assert_eq(cleaned, 1);
    cr_assert_str_eq(bb_error_message(), "frame 3 bad");
}

static bb_status returns_bare_status(void) { return BB_ERR_NOMEM; }
static bb_status wraps_bare(void)
{
    BB_TRY(returns_bare_status());
    return BB_OK;
}

Test(core, status_without_message_gets_its_name)
{
    bb_error_clear();
    cr_assert_eq(wraps_bare(), BB_ERR_NOMEM);
    cr_assert_str_eq(bb_error_message(), bb_status_name(BB_ERR_NOMEM));
}

Test(core, errno_message_appends_strerror)
{
    errno = ENOENT;
    cr_assert_eq(bb_fail_errno(BB_ERR_IO, "%s: cannot open", "missing.bbs"), BB_ERR_IO);
    cr_assert_str_eq(bb_error_message(), "missing.bbs: cannot open: No such file or directory");
}

Test(core, message_may_quote_previous_message)
{
    bb_fail(BB_ERR_IO, "inner");
    bb_fail(BB_ERR_IO, "outer: %s", bb_error_message());
    cr_assert_str_eq(bb_error_message(), "outer: inner");
}

static void *fail_in_thread(void *arg)
{
    (void)arg;
    bb_fail(BB_ERR_CORRUPT, "thread error");
    return NULL;
}

Test(core, errors_are_per_thread)
{
    bb_fail(BB_ERR_IO, "main error");
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, fail_in_thread, NULL), 0);
    pthread_join(t, NULL);
    cr_assert_str_eq(bb_error_message(), "main error");
}

Test(core, log_threshold_from_environment)
{
    setenv("BB_LOG", "debug", 1);
    cr_assert_eq(bb_log_threshold(), BB_LOG_DEBUG);
    bb_log_set_threshold(BB_LOG_ERROR);
    cr_assert_eq(bb_log_threshold(), BB_LOG_ERROR);
}

Test(core, log_threshold_defaults_to_warn_on_bad_value)
{
    setenv("BB_LOG", "chatty", 1);
    cr_assert_eq(bb_log_threshold(), BB_LOG_WARN);
}

Test(core, clock_is_monotonic)
{
    uint64_t a = bb_clock_ns();
    usleep(2000);
    uint64_t b = bb_clock_ns();
    cr_assert_gt(b, a + 1000000u);
    cr_assert_gt(bb_clock_seconds(), 0.0);
}

Test(core, format_bytes)
{
    char buf[32];
    cr_assert_str_eq(bb_format_bytes(512, buf, sizeof buf), "512 B");
    cr_assert_str_eq(bb_format_bytes(1536, buf, sizeof buf), "1.5 KiB");
    cr_assert_str_eq(bb_format_bytes(256ull << 20, buf, sizeof buf), "256.0 MiB");
}

Test(core, parse_numbers_and_sizes)
{
    int64_t i;
    double d;
    uint64_t b;
    cr_assert_eq(bb_parse_int("--n", "-42", &i), BB_OK);
    cr_assert_eq(i, -42);
    cr_assert_eq(bb_parse_int("--n", "4x", &i), BB_ERR_ARG);
    cr_assert_not_null(strstr(bb_error_message(), "--n"));
    cr_assert_eq(bb_parse_double("--f", "0.25", &d), BB_OK);
    cr_assert_float_eq(d, 0.25, 1e-12);
    cr_assert_eq(bb_parse_double("--f", "nan", &d), BB_ERR_ARG);
    const struct { const char *s; uint64_t v; } sizes[] = {
        {"4096", 4096}, {"64K", 65536}, {"256MiB", 256ull << 20}, {"1.5G", 3ull << 29}, {"2mib", 2ull << 20},
        {"2mb", 2000000} /* MB is 10^6 bytes, as the SI has it (issue 14) */};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        cr_assert_eq(bb_parse_bytes("--mem", sizes[k].s, &b), BB_OK, "%s", sizes[k].s);
        cr_assert_eq(b, sizes[k].v, "%s", sizes[k].s);
    }
    cr_assert_eq(bb_parse_bytes("--mem", "12Q", &b), BB_ERR_ARG);
    cr_assert_eq(bb_parse_bytes("--mem", "-1", &b), BB_ERR_ARG);
}

typedef struct parsed {
    bool flag;
    int64_t level;
    double frac;
    const char *out, *fmt;
    bb_str_list in;
    uint64_t mem;
} parsed;

#define OPTS(p)                                                                                   \
    {{"--flag", BB_OPT_FLAG, &(p).flag, NULL, "a flag"},                                         \
     {"--level", BB_OPT_INT, &(p).level, "L", "level", .min = 1, .max = 19},                     \
     {"--frac", BB_OPT_DOUBLE, &(p).frac, "F", "fraction", .min = 0, .max = 1},                  \
     {"--out", BB_OPT_STRING, &(p).out, "DIR", "output", .required = true},                      \
     {"--format", BB_OPT_CHOICE, &(p).fmt, "F", "format", .choices = "fmnist|text|llmc"},        \
     {"--in", BB_OPT_LIST, &(p).in, "FILE...", "inputs"},                                        \
     {"--mem", BB_OPT_BYTES, &(p).mem, "BYTES", "memory"},                                       \
     {0}}

static bb_status parse(parsed *p, int argc, char **argv, bb_str_list *pos)
{
    *p = (parsed){.level = 3};
    const bb_opt opts[] = OPTS(*p);
    bb_status rc = bb_cli_parse("test", opts, argc, argv, pos);
    return rc;
}

Test(core, cli_parses_every_kind)
{
    parsed p;
    bb_str_list pos = {0};
    char *argv[] = {"--flag", "--level=7", "--frac", "0.5", "--out", "d", "--format", "text", "--in", "a", "b",
                    "c", "--mem", "64K", "pos1", "--in", "e"};
    cr_assert_eq(parse(&p, 17, argv, &pos), BB_OK, "%s", bb_error_message());
    cr_assert(p.flag);
    cr_assert_eq(p.level, 7);
    cr_assert_float_eq(p.frac, 0.5, 1e-12);
    cr_assert_str_eq(p.out, "d");
    cr_assert_str_eq(p.fmt, "text");
    cr_assert_eq(p.mem, 65536);
    /* A list takes values up to the next option, and may repeat; so "pos1"
     * after --mem's value is positional. */
    cr_assert_eq(p.in.count, 4);
    cr_assert_str_eq(p.in.items[2], "c");
    cr_assert_str_eq(p.in.items[3], "e");
    cr_assert_eq(pos.count, 1);
    cr_assert_str_eq(pos.items[0], "pos1");
    const bb_opt opts[] = OPTS(p);
    bb_cli_free(opts, &pos);
    cr_assert_null(p.in.items);
}

Test(core, cli_rejects_bad_input_with_option_name)
{
    parsed p;
    const struct { int argc; char *argv[4]; const char *needle; } cases[] = {
        {2, {"--level", "25"}, "--level: 25 is out of range [1, 19]"},
        {2, {"--level", "x"}, "--level: 'x' is not an integer"},
        {1, {"--level"}, "--level needs a value"},
        {2, {"--format", "csv"}, "'csv' is not one of fmnist|text|llmc"},
        {1, {"--levle"}, "did you mean --level?"},
        {1, {"--zzzzzzzz"}, "unknown option --zzzzzzzz"},
        {0, {NULL}, "--out DIR is required"},
        {3, {"--out", "d", "stray"}, "unexpected argument 'stray'"},
        {1, {"--flag=1"}, "--flag takes no value"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        bb_status rc = parse(&p, cases[k].argc, (char **)cases[k].argv, NULL);
        cr_assert_eq(rc, BB_ERR_ARG, "case %zu", k);
        cr_assert_not_null(strstr(bb_error_message(), cases[k].needle), "case %zu: '%s' lacks '%s'", k,
                           bb_error_message(), cases[k].needle);
        cr_assert_not(bb_cli_help_requested());
        const bb_opt opts[] = OPTS(p);
        bb_cli_free(opts, NULL);
    }
}

Test(core, cli_help_lists_options_with_defaults)
{
    parsed p;
    char *argv[] = {"--help"};
    cr_assert_eq(parse(&p, 1, argv, NULL), BB_ERR_ARG);
    cr_assert(bb_cli_help_requested());
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    p.frac = 5; /* out of range: shown without a default */
    const bb_opt opts[] = OPTS(p);
    bb_cli_help(f, "test [options]", "Tests.", opts);
    fclose(f);
    cr_assert_not_null(strstr(text, "usage: test [options]"));
    cr_assert_not_null(strstr(text, "--level L"));
    cr_assert_not_null(strstr(text, "(default: 3)"));
    cr_assert_not_null(strstr(text, "--out DIR"));
    cr_assert_not_null(strstr(text, "(required)"));
    cr_assert_not_null(strstr(text, "--format fmnist|text|llmc"));
    cr_assert_null(strstr(text, "(default: 5)"));
    free(text);
}

Test(core, cli_help_wins_and_double_dash_ends_options)
{
    parsed p;
    char *help_in_list[] = {"--out", "d", "--in", "a", "-h"};
    cr_assert_eq(parse(&p, 5, help_in_list, NULL), BB_ERR_ARG);
    cr_assert(bb_cli_help_requested(), "-h after a list is a help request, not a file");
    bb_str_list pos = {0};
    char *dashes[] = {"--out", "d", "--in", "a", "-", "-x", "--", "--flag", "-y"};
    bb_status rc = parse(&p, 9, dashes, &pos);
    /* "-x" ends the list and is positional; after "--" everything is. */
    cr_assert_eq(rc, BB_OK, "%s", bb_error_message());
    cr_assert_eq(p.in.count, 2);
    cr_assert_str_eq(p.in.items[1], "-");
    cr_assert_not(p.flag);
    cr_assert_eq(pos.count, 3);
    cr_assert_str_eq(pos.items[0], "-x");
    cr_assert_str_eq(pos.items[1], "--flag");
    const bb_opt opts[] = OPTS(p);
    bb_cli_free(opts, &pos);
}

Test(core, cli_reports_given_options)
{
    int64_t v = 5;
    bool given = false;
    const bb_opt opts[] = {{"--v", BB_OPT_INT, &v, "N", "v", .given = &given}, {0}};
    char *none[] = {"x"};
    bb_str_list pos = {0};
    cr_assert_eq(bb_cli_parse("t", opts, 1, none, &pos), BB_OK);
    cr_assert_not(given);
    char *same[] = {"--v", "5"};
    cr_assert_eq(bb_cli_parse("t", opts, 2, same, NULL), BB_OK);
    cr_assert(given, "given even when the value equals the default");
    bb_cli_free(opts, &pos);
}

/* Typed destinations: the field itself (int, uint32_t, uint64_t, an enum
 * by the index of its name), ranges checked, defaults printed as held. */
Test(core, cli_writes_typed_destinations)
{
    typedef enum { RED, GREEN, BLUE } colour;
    int i = 3;
    uint32_t u = 8;
    uint64_t big = 0;
    colour c = GREEN;
    const bb_opt opts[] = {{"--i", BB_OPT_I32, &i, "N", "an int", .min = -5, .max = 100},
                           {"--u", BB_OPT_U32, &u, "N", "a uint32", .min = 1, .max = 1 << 20},
                           {"--big", BB_OPT_U64, &big, "N", "a uint64", .min = 0, .max = 9.2e18},
                           {"--colour", BB_OPT_ENUM, &c, "C", "a colour", .choices = "red|green|blue"},
                           {0}};
    char *help = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&help, &len);
    bb_cli_help(f, "t", "s", opts);
    fclose(f);
    cr_assert(strstr(help, "an int (default: 3)") && strstr(help, "a uint32 (default: 8)"), "%s", help);
    cr_assert(strstr(help, "--colour red|green|blue") && strstr(help, "a colour (default: green)"), "%s", help);
    free(help);
    char *ok[] = {"--i", "-4", "--u", "1048576", "--big", "9000000000000000000", "--colour", "blue"};
    cr_assert_eq(bb_cli_parse("t", opts, 8, ok, NULL), BB_OK, "%s", bb_error_message());
    cr_assert_eq(i, -4);
    cr_assert_eq(u, 1u << 20);
    cr_assert_eq(big, 9000000000000000000ull);
    cr_assert_eq(c, BLUE);
    char *range[] = {"--u", "0"};
    cr_assert_eq(bb_cli_parse("t", opts, 2, range, NULL), BB_ERR_ARG);
    cr_assert_str_eq(bb_error_message(), "--u: 0 is out of range [1, 1048576]");
    char *bad[] = {"--colour", "mauve"};
    cr_assert_eq(bb_cli_parse("t", opts, 2, bad, NULL), BB_ERR_ARG);
    cr_assert_str_eq(bb_error_message(), "--colour: 'mauve' is not one of red|green|blue");
    cr_assert_eq(c, BLUE, "a refused value leaves the destination as it was");
}
