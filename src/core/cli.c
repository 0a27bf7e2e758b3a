/* cli.c — option-table parsing and --help generation for subcommands. */
#include "bigbatch/core.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static _Thread_local bool help_requested;

bool bb_cli_help_requested(void) { return help_requested; }

bb_status bb_parse_int(const char *what, const char *s, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno == ERANGE) return bb_fail(BB_ERR_ARG, "%s: '%s' is too large", what, s);
    if (errno || end == s || *end != '\0')
        return bb_fail(BB_ERR_ARG, "%s: '%s' is not an integer", what, s);
    *out = v;
    return BB_OK;
}

bb_status bb_parse_double(const char *what, const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end != '\0' || !isfinite(v))
        return bb_fail(BB_ERR_ARG, "%s: '%s' is not a number", what, s);
    *out = v;
    return BB_OK;
}

bb_status bb_parse_bytes(const char *what, const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0 || !isfinite(v))
        return bb_fail(BB_ERR_ARG, "%s: '%s' is not a size (examples: 4096, 64K, 256MiB, 1.5GiB, 512MB)",
                       what, s);
    /* K/M/G/T alone or with "iB" are binary multiples (64K, 256MiB); with
     * "B" they are decimal, as the SI writes them (512MB = 512·10^6). */
    static const char units[] = "KMGT";
    double mult = 1;
    if (*end) {
        const char *u = strchr(units, *end >= 'a' ? *end - 32 : *end);
        if (!u || !*end) goto bad;
        int power = (int)(u - units + 1);
        end++;
        if (!*end || !strcasecmp(end, "ib")) mult = pow(1024.0, power);
        else if (!strcasecmp(end, "b")) mult = pow(1000.0, power);
        else goto bad;
    }
    v *= mult;
    if (v >= 18446744073709551615.0) goto bad;
    *out = (uint64_t)v;
    return BB_OK;
bad:
    return bb_fail(BB_ERR_ARG, "%s: '%s' is not a size (examples: 4096, 64K, 256MiB, 1.5GiB, 512MB)", what,
                   s);
}

/* The index of `v` in `choices` ("a|b|c"), or -1. */
static int choice_index(const char *choices, const char *v)
{
    size_t n = strlen(v);
    int i = 0;
    for (const char *c = choices; *c; i++) {
        const char *bar = strchr(c, '|');
        size_t len = bar ? (size_t)(bar - c) : strlen(c);
        if (len == n && strncmp(c, v, n) == 0) return i;
        if (!bar) break;
        c = bar + 1;
    }
    return -1;
}

static bool is_integer_kind(bb_opt_kind k)
{
    return k == BB_OPT_INT || k == BB_OPT_I32 || k == BB_OPT_U32 || k == BB_OPT_U64;
}

/* An integer destination's value, whatever its type. */
static int64_t load_integer(const bb_opt *o)
{
    switch (o->kind) {
    case BB_OPT_I32: return *(int *)o->dest;
    case BB_OPT_U32: return *(uint32_t *)o->dest;
    case BB_OPT_U64: return (int64_t)*(uint64_t *)o->dest;
    default: return *(int64_t *)o->dest;
    }
}

static void store_integer(const bb_opt *o, int64_t x)
{
    switch (o->kind) {
    case BB_OPT_I32: *(int *)o->dest = (int)x; break;
    case BB_OPT_U32: *(uint32_t *)o->dest = (uint32_t)x; break;
    case BB_OPT_U64: *(uint64_t *)o->dest = (uint64_t)x; break;
    default: *(int64_t *)o->dest = x; break;
    }
}

static bb_status list_push(bb_str_list *list, const char *item)
{
    const char **grown = realloc(list->items, sizeof *grown * (size_t)(list->count + 1));
    if (!grown) return bb_fail(BB_ERR_NOMEM, "out of memory parsing arguments");
    grown[list->count++] = item;
    list->items = grown;
    return BB_OK;
}

/* "out of range [1, 1048576]", integers printed as integers. */
static bb_status check_range(const bb_opt *o, double v)
{
    if (!(o->min < o->max) || (v >= o->min && v <= o->max)) return BB_OK;
    if (is_integer_kind(o->kind))
        return bb_fail(BB_ERR_ARG, "%s: %lld is out of range [%lld, %lld]", o->name, (long long)v, (long long)o->min,
                       (long long)o->max);
    return bb_fail(BB_ERR_ARG, "%s: %g is out of range [%g, %g]", o->name, v, o->min, o->max);
}

static bb_status store_value(const bb_opt *o, const char *v)
{
    switch (o->kind) {
    case BB_OPT_INT:
    case BB_OPT_I32:
    case BB_OPT_U32:
    case BB_OPT_U64: {
        int64_t x = 0;
        BB_TRY(bb_parse_int(o->name, v, &x));
        BB_TRY(check_range(o, (double)x));
        store_integer(o, x);
        return BB_OK;
    }
    case BB_OPT_ENUM: {
        int i = choice_index(o->choices, v);
        if (i < 0) return bb_fail(BB_ERR_ARG, "%s: '%s' is not one of %s", o->name, v, o->choices);
        *(int *)o->dest = i;
        return BB_OK;
    }
    case BB_OPT_DOUBLE: {
        double x = 0;
        BB_TRY(bb_parse_double(o->name, v, &x));
        BB_TRY(check_range(o, x));
        *(double *)o->dest = x;
        return BB_OK;
    }
    case BB_OPT_BYTES:
        return bb_parse_bytes(o->name, v, (uint64_t *)o->dest);
    case BB_OPT_CHOICE:
        if (choice_index(o->choices, v) < 0)
            return bb_fail(BB_ERR_ARG, "%s: '%s' is not one of %s", o->name, v, o->choices);
        /* fallthrough */
    case BB_OPT_STRING:
        *(const char **)o->dest = v;
        return BB_OK;
    case BB_OPT_LIST:
        return list_push((bb_str_list *)o->dest, v);
    case BB_OPT_FLAG:
        break;
    }
    return bb_fail(BB_ERR_INTERNAL, "%s: bad option kind", o->name);
}

static const bb_opt *find_opt(const bb_opt *opts, const char *name, size_t len)
{
    for (const bb_opt *o = opts; o->name; o++)
        if (strlen(o->name) == len && strncmp(o->name, name, len) == 0) return o;
    return NULL;
}

/* Levenshtein distance, for "did you mean" on a mistyped option. */
static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return 64;
    size_t row[64];
    for (size_t j = 0; j <= lb; j++) row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (row[j] + 1 < best) best = row[j] + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

static bb_status unknown_option(const char *command, const bb_opt *opts, const char *arg)
{
    const bb_opt *best = NULL;
    size_t best_d = 3; /* suggest only close matches */
    for (const bb_opt *o = opts; o->name; o++) {
        size_t d = edit_distance(arg, o->name);
        if (d < best_d) best = o, best_d = d;
    }
    if (best)
        return bb_fail(BB_ERR_ARG, "unknown option %s (did you mean %s?); see 'bigbatch %s --help'",
                       arg, best->name, command);
    return bb_fail(BB_ERR_ARG, "unknown option %s; see 'bigbatch %s --help'", arg, command);
}

bb_status bb_cli_parse(const char *command, const bb_opt *opts, int argc, char **argv,
                       bb_str_list *positional)
{
    help_requested = false;
    size_t nopts = 0;
    while (opts[nopts].name) nopts++;
    bool seen[nopts ? nopts : 1];
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < argc && strcmp(argv[i], "--") != 0; i++)
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            help_requested = true;
            return bb_fail(BB_ERR_ARG, "help requested");
        }

    bool options_ended = false;
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (!options_ended && strcmp(arg, "--") == 0) {
            options_ended = true;
            continue;
        }
        if (options_ended || strncmp(arg, "--", 2) != 0) {
            if (!positional)
                return bb_fail(BB_ERR_ARG, "unexpected argument '%s'; see 'bigbatch %s --help'", arg,
                               command);
            BB_TRY(list_push(positional, arg));
            continue;
        }
        const char *eq = strchr(arg, '=');
        size_t name_len = eq ? (size_t)(eq - arg) : strlen(arg);
        const bb_opt *o = find_opt(opts, arg, name_len);
        if (!o) {
            char name[128];
            snprintf(name, sizeof name, "%.*s", (int)(name_len < 120 ? name_len : 120), arg);
            return unknown_option(command, opts, name);
        }
        seen[o - opts] = true;
        if (o->given) *o->given = true;
        if (o->kind == BB_OPT_FLAG) {
            if (eq) return bb_fail(BB_ERR_ARG, "%s takes no value", o->name);
            *(bool *)o->dest = true;
            continue;
        }
        if (eq) {
            BB_TRY(store_value(o, eq + 1));
        } else {
            if (i + 1 >= argc || (strncmp(argv[i + 1], "--", 2) == 0 && argv[i + 1][2]))
                return bb_fail(BB_ERR_ARG, "%s needs a value (%s)", o->name, o->metavar);
            BB_TRY(store_value(o, argv[++i]));
        }
        /* A list takes every following value up to the next option ("-" alone is a value). */
        while (o->kind == BB_OPT_LIST && i + 1 < argc && (argv[i + 1][0] != '-' || argv[i + 1][1] == '\0'))
            BB_TRY(store_value(o, argv[++i]));
    }
    for (size_t k = 0; k < nopts; k++)
        if (opts[k].required && !seen[k])
            return bb_fail(BB_ERR_ARG, "%s %s is required; see 'bigbatch %s --help'", opts[k].name,
                           opts[k].metavar, command);
    return BB_OK;
}

static void format_default(const bb_opt *o, char *buf, size_t cap)
{
    buf[0] = '\0';
    switch (o->kind) {
    /* A numeric default outside the option's range means "no default". */
    case BB_OPT_INT:
    case BB_OPT_I32:
    case BB_OPT_U32:
    case BB_OPT_U64: {
        int64_t v = load_integer(o);
        if (!(o->min < o->max) || ((double)v >= o->min && (double)v <= o->max))
            snprintf(buf, cap, "%lld", (long long)v);
        break;
    }
    case BB_OPT_ENUM: { /* the choice the destination holds */
        int want = *(int *)o->dest, i = 0;
        for (const char *c = o->choices; *c && i <= want; i++) {
            const char *bar = strchr(c, '|');
            size_t len = bar ? (size_t)(bar - c) : strlen(c);
            if (i == want) snprintf(buf, cap, "%.*s", (int)len, c);
            c = bar ? bar + 1 : c + len;
        }
        break;
    }
    case BB_OPT_DOUBLE: {
        double v = *(double *)o->dest;
        if (!(o->min < o->max) || (v >= o->min && v <= o->max)) snprintf(buf, cap, "%g", v);
        break;
    }
    case BB_OPT_BYTES: {
        uint64_t v = *(uint64_t *)o->dest;
        if (v) bb_format_bytes(v, buf, cap);
        break;
    }
    case BB_OPT_STRING:
    case BB_OPT_CHOICE: { /* as the user would type it: a line break as \n */
        const char *s = *(const char **)o->dest;
        size_t n = 0;
        for (; s && *s && n + 3 < cap; s++) {
            if (*s == '\n') buf[n++] = '\\', buf[n++] = 'n';
            else if (*s == '\t') buf[n++] = '\\', buf[n++] = 't';
            else buf[n++] = *s;
        }
        buf[n] = '\0';
        break;
    }
    case BB_OPT_FLAG:
    case BB_OPT_LIST: break;
    }
}

void bb_cli_help(FILE *out, const char *usage, const char *summary, const bb_opt *opts)
{
    fprintf(out, "usage: %s\n\n%s\n", usage, summary);
    if (!opts || !opts->name) return;
    fprintf(out, "\noptions:\n");
    for (const bb_opt *o = opts; o->name; o++) {
        char left[64], def[64];
        bool choices = o->kind == BB_OPT_CHOICE || o->kind == BB_OPT_ENUM;
        bool long_choices = choices && strlen(o->name) + 1 + strlen(o->choices) > 26; /* said after the help */
        if (o->kind == BB_OPT_FLAG)
            snprintf(left, sizeof left, "%s", o->name);
        else if (choices && !long_choices)
            snprintf(left, sizeof left, "%s %s", o->name, o->choices);
        else
            snprintf(left, sizeof left, "%s %s", o->name, o->metavar ? o->metavar : "VALUE");
        format_default(o, def, sizeof def);
        fprintf(out, "  %-26s %s", left, o->help);
        if (long_choices) fprintf(out, " (one of %s)", o->choices);
        if (o->required)
            fprintf(out, " (required)");
        else if (def[0] && !strstr(o->help, "(default")) /* the help may say it in words */
            fprintf(out, " (default: %s)", def);
        fputc('\n', out);
    }
    fprintf(out, "  %-26s %s\n", "-h, --help", "show this help");
}

void bb_cli_free(const bb_opt *opts, bb_str_list *positional)
{
    for (const bb_opt *o = opts; o && o->name; o++)
        if (o->kind == BB_OPT_LIST) {
            bb_str_list *l = o->dest;
            free(l->items);
            l->items = NULL;
            l->count = 0;
        }
    if (positional) {
        free(positional->items);
        positional->items = NULL;
        positional->count = 0;
    }
}
