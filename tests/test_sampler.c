/* test_sampler.c — the epoch order (loader.h): a permutation that is a
 * function of (seed, epoch); windows of frames, fixed (version 1) or
 * balanced (version 2), records mixing only within their window; the
 * order's statistic. */
#include "loader_fixture.h"

TestSuite(sampler, .init = dataset_up, .fini = dataset_down);

static uint64_t *epoch_ids(uint64_t seed, uint32_t window, uint64_t epoch)
{
    bb_sampler_t *s;
    cr_assert_eq(bb_sampler_create(ds, seed, window, BB_ORDER_FIXED_WINDOWS, &s), BB_OK);
    uint64_t *ids = malloc(RECORDS * sizeof *ids);
    cr_assert_eq(bb_sampler_epoch_ids(s, epoch, 0, RECORDS, ids), BB_OK, "%s", bb_error_message());
    bb_sampler_destroy(s);
    return ids;
}

Test(sampler, order_is_a_permutation_and_a_function_of_seed_and_epoch)
{
    uint64_t *a = epoch_ids(7, 8, 0), *again = epoch_ids(7, 8, 0);
    uint64_t *seed2 = epoch_ids(8, 8, 0), *epoch1 = epoch_ids(7, 8, 1);
    cr_assert_eq(memcmp(a, again, RECORDS * sizeof *a), 0, "same (seed, epoch), different order");
    cr_assert_neq(memcmp(a, seed2, RECORDS * sizeof *a), 0, "another seed gave the same order");
    cr_assert_neq(memcmp(a, epoch1, RECORDS * sizeof *a), 0, "another epoch gave the same order");
    bool seen[RECORDS] = {0};
    size_t in_place = 0;
    for (int i = 0; i < RECORDS; i++) {
        cr_assert_lt(a[i], RECORDS);
        cr_assert_not(seen[a[i]], "record %llu appears twice", (unsigned long long)a[i]);
        seen[a[i]] = true;
        in_place += a[i] == (uint64_t)i;
    }
    cr_assert_lt(in_place, 50, "%zu of %d records kept their place: not shuffled", in_place, RECORDS);
    free(a), free(again), free(seed2), free(epoch1);
}

/* A window wider than the dataset is the whole dataset. */
Test(sampler, huge_windows_are_the_whole_dataset)
{
    bb_sampler_t *s;
    cr_assert_eq(bb_sampler_create(ds, 1, 1, BB_ORDER_CURRENT, &s), BB_OK);
    uint32_t frames = bb_sampler_frame_count(s);
    bb_sampler_destroy(s);
    uint64_t *all = epoch_ids(9, frames, 4), *huge = epoch_ids(9, UINT32_MAX, 4);
    cr_assert_eq(memcmp(all, huge, RECORDS * sizeof *all), 0);
    free(all), free(huge);
    cr_assert_eq(bb_sampler_create(ds, 1, 0, BB_ORDER_CURRENT, &s), BB_ERR_ARG);
}

/* Window w's positions hold exactly the records of the window's frames: the
 * shuffle stays local, so a loader decompresses a few frames at a time.
 * Version 1 cuts runs of `window` frames (the remainder last), version 2
 * balanced windows (sizes within one frame). (Checked through the private
 * order, src/data/sampler.h.) */
static void records_mix_within_windows(uint32_t order, uint32_t window)
{
    bb_sampler_t *s;
    cr_assert_eq(bb_sampler_create(ds, 3, window, order, &s), BB_OK);
    uint64_t *ids = malloc(RECORDS * sizeof *ids);
    cr_assert_eq(bb_sampler_epoch_ids(s, 2, 0, RECORDS, ids), BB_OK);
    bb_epoch_order_t *o;
    cr_assert_eq(bb_epoch_order_create(s, 2, &o), BB_OK);
    uint32_t frames = bb_sampler_frame_count(s), windows = bb_sampler_window_count(s), smallest = frames, largest = 0;
    cr_assert_eq(windows, (frames + window - 1) / window, "ceil(frames / window) windows");
    cr_assert_eq(bb_sampler_window_first(s, 0), 0);
    for (uint32_t w = 0; w < windows; w++) {
        uint32_t first = bb_sampler_window_first(s, w), end = bb_sampler_window_first(s, w + 1);
        if (order == BB_ORDER_FIXED_WINDOWS)
            cr_assert_eq(first, w * window, "version 1: window %u starts at frame %u", w, w * window);
        smallest = end - first < smallest ? end - first : smallest, largest = end - first > largest ? end - first : largest;
        for (uint64_t p = o->first_pos[first]; p < o->first_pos[end]; p++) {
            bool inside = false;
            for (uint32_t j = first; j < end; j++) {
                const bb_sampler_frame *f = bb_sampler_frame_at(s, o->frames[j]);
                inside |= ids[p] >= f->first_id && ids[p] < f->first_id + f->records;
            }
            cr_assert(inside, "position %llu (record %llu) is outside window %u's frames", (unsigned long long)p,
                      (unsigned long long)ids[p], w);
        }
    }
    cr_assert_eq(bb_sampler_window_first(s, windows), frames, "the windows cover every frame");
    if (order == BB_ORDER_BALANCED)
        cr_assert_leq(largest - smallest, 1, "balanced windows of %u..%u frames", smallest, largest);
    else if (frames % window)
        cr_assert_eq(smallest, frames % window, "version 1 keeps its remainder window");
    cr_assert_eq(o->first_pos[frames], RECORDS);
    bb_epoch_order_destroy(o);
    bb_sampler_destroy(s);
    free(ids);
}

Test(sampler, records_mix_only_within_a_window_of_frames)
{
    bb_sampler_t *s;
    cr_assert_eq(bb_sampler_create(ds, 1, 1, BB_ORDER_CURRENT, &s), BB_OK);
    uint32_t frames = bb_sampler_frame_count(s);
    bb_sampler_destroy(s);
    cr_assert_gt(frames % 4, 0, "the fixture's %u frames leave a remainder window of 4", frames);
    for (uint32_t order = BB_ORDER_FIXED_WINDOWS; order <= BB_ORDER_BALANCED; order++) {
        records_mix_within_windows(order, 4);
        records_mix_within_windows(order, 3);
    }
    cr_assert_eq(bb_sampler_create(ds, 1, 4, 3, &s), BB_ERR_ARG, "an unknown version is refused");
}

/* The order's statistic: a global shuffle's batches come from nearly every
 * frame; windows of one frame keep a batch in one or two frames. */
Test(sampler, the_order_statistic_counts_the_frames_a_batch_draws_from)
{
    bb_sampler_t *s;
    bb_order_stats all, one;
    cr_assert_eq(bb_sampler_create(ds, 5, UINT32_MAX, BB_ORDER_CURRENT, &s), BB_OK);
    cr_assert_eq(bb_sampler_order_stats(s, 0, 64, &all), BB_OK);
    uint32_t frames = all.frames;
    bb_sampler_destroy(s);
    cr_assert_eq(bb_sampler_create(ds, 5, 1, BB_ORDER_CURRENT, &s), BB_OK);
    cr_assert_eq(bb_sampler_order_stats(s, 0, 64, &one), BB_OK);
    cr_assert_eq(bb_sampler_order_stats(s, 0, 0, &one), BB_ERR_ARG);
    cr_assert_eq(bb_sampler_order_stats(s, 0, 64, &one), BB_OK);
    bb_sampler_destroy(s);
    cr_assert_eq(all.batches, RECORDS / 64);
    uint32_t could = frames < 64 ? frames : 64; /* the frames a batch of 64 could draw from */
    cr_assert_geq(all.frames_per_batch_min, could / 2, "a global shuffle: %u of the %u frames it could",
                  all.frames_per_batch_min, could);
    cr_assert_leq(one.frames_per_batch_max, 2 + 64 / (RECORDS / frames), "windows of one frame: %u frames",
                  one.frames_per_batch_max);
    cr_assert_gt(all.spread_median, 0.5, "a global shuffle spans the source (%.2f)", all.spread_median);
    cr_assert_lt(one.spread_median, all.spread_median);
}
