/* test_json.c — the JSON layer (json.h on jansson): typed reads that name
 * the file and the key, rounding on write, streaming one large array in
 * bounded memory; the files of the previous format (tests/fixtures/v0.1,
 * written by bigbatch 0.1.0 before jansson) still read; a damaged
 * state.json is one line naming the file and the key. */
#include <math.h>

#include "bigbatch/json.h"
#include "train_fixture.h"

TestSuite(json, .init = fixture_setup, .fini = fixture_teardown);

#define FIXTURES "tests/fixtures/v0.1"

static json_t *parse(const char *text)
{
    json_t *j;
    cr_assert_eq(bb_json_load_line(text, strlen(text), "test", &j), BB_OK, "%s", bb_error_message());
    return j;
}

Test(json, typed_reads_name_the_file_and_the_key)
{
    json_t *j = parse("{\"step\": 12, \"lr\": 0.5, \"data\": \"a\\\"b\", \"neg\": -1, \"s\": \"x\", \"null\": null}");
    uint64_t step;
    double lr;
    char data[8];
    int n = 7;
    cr_assert_eq(bb_json_req_u64(j, "f.json", "step", &step), BB_OK);
    cr_assert_eq(step, 12);
    cr_assert_eq(bb_json_req_double(j, "f.json", "lr", &lr), BB_OK);
    cr_assert_float_eq(lr, 0.5, 0);
    cr_assert_eq(bb_json_req_string(j, "f.json", "data", data, sizeof data), BB_OK);
    cr_assert_str_eq(data, "a\"b", "escapes come back unescaped");
    cr_assert_eq(bb_json_req_u64(j, "f.json", "missing", &step), BB_ERR_FORMAT);
    cr_assert_str_eq(bb_error_message(), "f.json: \"missing\" is missing");
    cr_assert_eq(bb_json_req_int(j, "f.json", "s", &n), BB_ERR_FORMAT);
    cr_assert_str_eq(bb_error_message(), "f.json: \"s\" is a string, not a non-negative integer");
    cr_assert_eq(bb_json_req_int(j, "f.json", "neg", &n), BB_ERR_FORMAT);
    cr_assert_eq(bb_json_req_double(j, "f.json", "data", &lr), BB_ERR_FORMAT);
    cr_assert_eq(bb_json_req_string(j, "f.json", "data", data, 3), BB_ERR_FORMAT, "too long for the buffer");
    /* optional keys: absent or null leave the value, a wrong type is still an error */
    cr_assert_eq(bb_json_opt_int(j, "f.json", "missing", &n), BB_OK);
    cr_assert_eq(bb_json_opt_int(j, "f.json", "null", &n), BB_OK);
    cr_assert_eq(n, 7);
    cr_assert_eq(bb_json_opt_int(j, "f.json", "s", &n), BB_ERR_FORMAT);
    cr_assert(isnan(bb_json_number_or_nan(j, "null")));
    json_decref(j);
    /* strict: no NaN, no trailing comma, no key given twice */
    const char *bad[] = {"{\"a\": NaN}", "{\"a\": 1,}", "{\"a\": 1, \"a\": 2}", "[1]", "{\"a\": 1} x"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_assert_eq(bb_json_load_line(bad[i], strlen(bad[i]), "line 3", &j), BB_ERR_FORMAT, "%s was accepted", bad[i]);
}

Test(json, reals_are_written_as_rounded_and_non_finite_ones_as_null)
{
    json_t *row = json_pack("{s:o, s:o, s:o, s:o, s:s}", "loss", bb_json_real(5.5569429397583008, 7), "ms",
                            bb_json_fixed(5.30900001, 3), "nan", bb_json_real(NAN, 7), "inf", bb_json_fixed(INFINITY, 3),
                            "path", "a \"b\" \\c\n\xc3\xa9");
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cr_assert_eq(bb_json_write_line(f, row), BB_OK);
    fclose(f);
    cr_assert_str_eq(text, "{\"loss\": 5.556943, \"ms\": 5.309, \"nan\": null, \"inf\": null, "
                           "\"path\": \"a \\\"b\\\" \\\\c\\n\xc3\xa9\"}\n");
    json_t *back = parse(text);
    cr_assert_str_eq(json_string_value(json_object_get(back, "path")), "a \"b\" \\c\n\xc3\xa9");
    json_decref(back), json_decref(row);
    free(text);
}

/* Writes `{"other": [1, {"x": "]"}], "events": [...]}` with `n` events, the
 * one at `big` `big_bytes` long, one per line. */
static char *write_events(const char *name, int n, int big, size_t big_bytes)
{
    char *path = tu_path(tmp, name);
    FILE *f = fopen(path, "w");
    fprintf(f, "{\"other\": [1, {\"x\": \"]\"}], \"events\": [\n");
    for (int i = 0; i < n; i++) {
        fprintf(f, "%s{\"i\": %d, \"pad\": \"", i ? ",\n" : "", i);
        for (size_t k = 0; i == big && k < big_bytes; k++) fputc('a' + (int)(k % 26), f);
        fprintf(f, "\"}");
    }
    fprintf(f, "\n], \"after\": 1}\n");
    fclose(f);
    return path;
}

static int stream_count(const char *path, const char *member, bb_status *rc, bool *found)
{
    bb_json_stream *s;
    cr_assert_eq(bb_json_stream_open(path, member, &s), BB_OK);
    int n = 0;
    json_t *e;
    while ((*rc = bb_json_stream_next(s, &e)) == BB_OK && e) {
        cr_assert_eq(json_integer_value(json_object_get(e, "i")), n, "element %d out of order", n);
        n++;
        json_decref(e);
    }
    *found = bb_json_stream_found(s);
    bb_json_stream_close(s);
    return n;
}

Test(json, a_large_array_streams_element_by_element)
{
    /* 100000 events (3 MiB, three buffers' worth) and one of 3 MiB: the buffer grows for it */
    char *path = write_events("events.json", 100000, 5000, 3u << 20);
    bb_status rc;
    bool found;
    cr_assert_eq(stream_count(path, "events", &rc, &found), 100000);
    cr_assert_eq(rc, BB_OK, "%s", bb_error_message());
    cr_assert(found);
    /* another member, or an empty file: found false, no error */
    cr_assert_eq(stream_count(path, "traceEvents", &rc, &found), 0);
    cr_assert(rc == BB_OK && !found);
    char *empty = tu_path(tmp, "empty.json");
    tu_write_file(empty, "", 0);
    cr_assert_eq(stream_count(empty, "events", &rc, &found), 0);
    cr_assert(rc == BB_OK && !found);
    /* a bare array is the array itself */
    char *bare = tu_path(tmp, "bare.json");
    tu_write_file(bare, "[{\"i\": 0}, {\"i\": 1}]", 20);
    cr_assert_eq(stream_count(bare, "events", &rc, &found), 2);
    cr_assert(rc == BB_OK && found);
    /* cut short, or damaged: an error naming the file and the byte */
    size_t size;
    uint8_t *all = tu_read_file(path, &size);
    char *cut = tu_path(tmp, "cut.json");
    tu_write_file(cut, all, size / 2);
    stream_count(cut, "events", &rc, &found);
    cr_assert_eq(rc, BB_ERR_FORMAT);
    cr_assert(strstr(bb_error_message(), cut) && strstr(bb_error_message(), "byte "), "%s", bb_error_message());
    all[size - 40] = '#';
    tu_write_file(cut, all, size);
    stream_count(cut, "events", &rc, &found);
    cr_assert_eq(rc, BB_ERR_FORMAT, "a damaged element was accepted");
    free(all), free(cut), free(bare), free(empty), free(path);
}

/* ---- the previous format's files ----------------------------------------- */
Test(json, checkpoints_of_the_previous_format_still_read)
{
    bb_checkpoint_info info;
    cr_assert_eq(bb_checkpoint_read_info(FIXTURES "/checkpoint", &info), BB_OK, "%s", bb_error_message());
    cr_assert_eq(info.step, 2);
    cr_assert_eq(info.seed, 1);
    cr_assert_eq(info.global_batch, 4);
    cr_assert_eq(info.micro_batch, 2);
    cr_assert_eq(info.shuffle_frames, 8);
    cr_assert_str_eq(info.data, "data/kjv/train");
    cr_assert_str_eq(info.devices, "cpu:1");
    cr_assert_str_eq(bb_model_kind_name(info.model.kind), "gpt");
    cr_assert_eq(info.model.gpt.layers, 1);
    cr_assert_eq(info.model.gpt.d_model, 16);
    cr_assert_eq(info.opt.kind, BB_OPTIMIZER_ADAMW);
    cr_assert_float_eq(info.opt.beta1, 0.9, 0);
    cr_assert_float_eq(info.opt.eps, 1e-8, 0);
    cr_assert_eq(info.opt.lr_scale, BB_LR_SCALE_NONE, "before --lr-scale: none");
    cr_assert_eq(info.opt.base_batch, 0);
    cr_assert_float_eq(info.opt.trust_coefficient, 1e-3, 0, "before LARS: its default");
    /* and one from before --precision and resume's remembered settings */
    char *dir = tu_path(tmp, "early");
    cr_assert_eq(mkdir(dir, 0755), 0);
    char *state = tu_path(dir, "state.json");
    uint8_t *early = tu_read_file(FIXTURES "/state-early.json", NULL);
    tu_write_file(state, early, strlen((char *)early));
    cr_assert_eq(bb_checkpoint_read_info(dir, &info), BB_OK, "%s", bb_error_message());
    cr_assert_eq(info.model.precision, BB_PRECISION_FP32);
    cr_assert_eq(info.micro_batch, 0);
    cr_assert_str_eq(info.devices, "");
    free(early), free(state), free(dir);
    /* the whole checkpoint resumes: weights and optimizer state included */
    char *ckpt = tu_path(tmp, "ckpt");
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "cp -r " FIXTURES "/checkpoint '%s'", ckpt);
    cr_assert_eq(system(cmd), 0);
    tu_run r = tu_bigbatch("train", "--resume", ckpt, "--steps", "3", "--quiet");
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    free(ckpt);
}

Test(json, metrics_trace_and_plan_of_the_previous_format_still_report)
{
    char *out = tu_path(tmp, "report.html");
    tu_run r = tu_bigbatch("report", "--metrics", FIXTURES "/metrics.jsonl", "--trace", FIXTURES "/trace.json", "--plan",
                           FIXTURES "/plan.json", "--out", out);
    cr_assert_eq(r.exit_code, 0, "%s", r.err);
    tu_run_free(&r);
    char *html = (char *)tu_read_file(out, NULL);
    cr_assert_not_null(strstr(html, "gpt (1 layer, 2 heads, d 16"), "the configuration line was not read");
    cr_assert_not_null(strstr(html, "(the median step), one lane per thread"), "no timeline from the trace");
    cr_assert_null(strstr(html, "no timeline"), "the trace was not read");
    cr_assert_not_null(strstr(html, "worker 0 (cpu:0)"), "the lane names were not read");
    free(html), free(out);
}

/* ---- a damaged state.json --------------------------------------------------- */
static void assert_refused(const char *dir, const char *text, const char *what)
{
    char *state = tu_path(dir, "state.json");
    tu_write_file(state, text, strlen(text));
    bb_checkpoint_info info;
    cr_assert_eq(bb_checkpoint_read_info(dir, &info), BB_ERR_FORMAT, "%s was accepted", text);
    const char *msg = bb_error_message();
    cr_assert_not_null(strstr(msg, state), "the message does not name the file: %s", msg);
    cr_assert_not_null(strstr(msg, what), "the message does not say %s: %s", what, msg);
    cr_assert_null(strchr(msg, '\n'), "not one line: %s", msg);
    tu_run r = tu_bigbatch("train", "--resume", (char *)dir);
    tu_assert_error(&r, state, what);
    tu_run_free(&r);
    free(state);
}

Test(json, a_truncated_non_json_or_wrong_typed_state_is_one_line_naming_the_file_and_the_key)
{
    char *dir = tu_path(tmp, "step-00000002");
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "cp -r " FIXTURES "/checkpoint '%s'", dir);
    cr_assert_eq(system(cmd), 0);
    size_t size;
    char *good = (char *)tu_read_file(FIXTURES "/checkpoint/state.json", &size);
    good[size / 2] = 0;
    assert_refused(dir, good, "line ");                  /* truncated: where it ends */
    assert_refused(dir, "step: 2\n", "not JSON");      /* not JSON at all */
    char *typed = (char *)tu_read_file(FIXTURES "/checkpoint/state.json", NULL), fixed[8192];
    const char *at = strstr(typed, "\"step\": 2,");
    cr_assert_not_null(at);
    snprintf(fixed, sizeof fixed, "%.*s\"step\": \"2\",%s", (int)(at - typed), typed, at + strlen("\"step\": 2,"));
    assert_refused(dir, fixed, "\"step\" is a string");
    /* values of the wrong sign or type are errors, never a silent default (issue 29, item 6) */
    const char *bad[][2] = {{"\"micro_batch\": 2,", "\"micro_batch\": -4,"}, {"\"micro_batch\": 2,", "\"micro_batch\": \"4\","}};
    for (int i = 0; i < 2; i++) {
        const char *from = strstr(typed, bad[i][0]);
        cr_assert_not_null(from);
        snprintf(fixed, sizeof fixed, "%.*s%s%s", (int)(from - typed), typed, bad[i][1], from + strlen(bad[i][0]));
        assert_refused(dir, fixed, "\"micro_batch\" is");
    }
    free(typed), free(good), free(dir);
}
