/* test_order.c — the data order a run trains in (loader.h): a new run
 * shuffles every record together when the decompressed data fits
 * --shuffle-memory and no window was asked for, else balanced windows,
 * and says which in state.json (with the order's version); a checkpoint
 * of before the versions (no "order") resumes in its own order (version
 * 1), bitwise the run that never stopped. Helpers: train_fixture.h. */
#include "train_fixture.h"

TestSuite(order, .init = fixture_setup, .fini = fixture_teardown);

/* state.json's "shuffle_frames" and "order" of the checkpoint in `dir`. */
static void saved_order(const char *dir, uint32_t *frames, uint32_t *order)
{
    bb_checkpoint_info info;
    cr_assert_eq(bb_checkpoint_read_info(dir, &info), BB_OK, "%s", bb_error_message());
    *frames = info.shuffle_frames, *order = info.order;
}

Test(order, a_new_run_shuffles_globally_when_the_data_fits_else_in_balanced_windows)
{
    char *tokens = make_tokens("tokens", 1300), *a = tu_path(tmp, "a"), *b = tu_path(tmp, "b"), *c = tu_path(tmp, "c");
    bb_dataset_t *ds;
    cr_assert_eq(bb_dataset_open(tokens, &ds), BB_OK);
    uint32_t frames = bb_sampler_frame_count_of(ds);
    bb_dataset_close(ds);
    cr_assert_gt(frames, 8, "the fixture needs more frames than a window");
    bb_train_options o = gpt_options(tokens, 2, 4, 16);
    o.steps = 2, o.save_dir = a;
    bb_train_result r = train(&o);
    uint32_t got, order;
    saved_order(a, &got, &order);
    cr_assert_eq(got, frames, "the data fits 1 GiB: one window of all %u frames, not %u", frames, got);
    cr_assert_eq(order, BB_ORDER_BALANCED);
    bb_train_result_free(&r);
    o.save_dir = b, o.shuffle_memory = 1024; /* too little: the default window */
    r = train(&o);
    saved_order(b, &got, &order);
    cr_assert_eq(got, BB_SHUFFLE_FRAMES_DEFAULT);
    bb_train_result_free(&r);
    o.save_dir = c, o.shuffle_memory = BB_SHUFFLE_MEMORY_DEFAULT, o.shuffle_frames = 3;
    o.set |= BB_TRAIN_SET(BB_TRAIN_SHUFFLE_FRAMES); /* asked for: kept */
    r = train(&o);
    saved_order(c, &got, &order);
    cr_assert_eq(got, 3);
    bb_train_result_free(&r);
    free(tokens), free(a), free(b), free(c);
}

/* Removes "order" from a checkpoint's state.json: as bigbatch wrote it
 * before the order had versions. */
static void forget_order(const char *ckpt)
{
    char *path = tu_path(ckpt, "latest/state.json");
    char *text = (char *)tu_read_file(path, NULL), *at = strstr(text, "\"order\": ");
    cr_assert_not_null(at, "state.json names the order");
    char *end = strchr(at, ',');
    memmove(at, end + 1, strlen(end + 1) + 1);
    tu_write_file(path, text, strlen(text));
    free(text), free(path);
}

Test(order, a_checkpoint_of_before_the_versions_resumes_in_its_own_order)
{
    char *tokens = make_tokens("tokens", 1300), *ckpt = tu_path(tmp, "ckpt");
    bb_train_options o = gpt_options(tokens, 2, 4, 64); /* 16 steps: 1024 records, into the fourth window */
    o.steps = 16, o.order = BB_ORDER_FIXED_WINDOWS, o.shuffle_frames = 4; /* 21 frames: 5 x 4 + 1 */
    o.set |= BB_TRAIN_SET(BB_TRAIN_SHUFFLE_FRAMES);
    bb_train_result straight = train(&o);
    bb_train_options first = o;
    first.save_dir = ckpt, first.stop_after = 5;
    bb_train_result part = train(&first);
    forget_order(ckpt);
    uint32_t frames, order;
    saved_order(ckpt, &frames, &order);
    cr_assert_eq(order, 0, "no \"order\": read as not recorded");
    bb_train_options rest;
    bb_train_defaults(&rest);
    rest.resume_dir = ckpt, rest.progress = NULL, rest.loader_threads = 1;
    bb_train_result second = train(&rest);
    cr_assert_eq(second.first_step, 5);
    cr_assert_eq(memcmp(second.params, straight.params, straight.param_count * sizeof(float)), 0,
                 "a version-1 checkpoint resumed in another order than its run's");
    bb_train_options v2 = o;
    v2.order = BB_ORDER_BALANCED;
    bb_train_result other = train(&v2);
    cr_assert_neq(memcmp(other.params, straight.params, straight.param_count * sizeof(float)), 0,
                  "versions 1 and 2 trained the same: the test cannot tell them apart");
    bb_train_result_free(&straight), bb_train_result_free(&part), bb_train_result_free(&second),
        bb_train_result_free(&other);
    free(tokens), free(ckpt);
}
