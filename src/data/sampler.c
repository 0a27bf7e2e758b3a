/* sampler.c — the epoch order: a frame permutation, then records shuffled
 * within windows of frames (definition in loader.h). */
#include <stdlib.h>
#include <string.h>

#include "sampler.h"

struct bb_sampler {
    uint64_t seed;
    uint32_t order;         /* BB_ORDER_FIXED_WINDOWS or BB_ORDER_BALANCED */
    uint32_t windows;       /* windows an epoch */
    uint32_t window_frames; /* the largest window's frames */
    uint32_t frame_count;
    uint64_t record_count;
    bb_sampler_frame *frames;
};

/* ---- streams (bb_splitmix64) and unbiased bounded draws --------------- */
/* The stream for (seed, epoch, window): each input is mixed in turn. */
static uint64_t stream_seed(uint64_t seed, uint64_t epoch, uint64_t window)
{
    uint64_t s = seed;
    uint64_t a = bb_splitmix64(&s) ^ epoch;
    uint64_t b = bb_splitmix64(&a) ^ window;
    return bb_splitmix64(&b);
}

/* Uniform in [0, n), n >= 1 (Lemire's multiply-and-reject). */
static uint64_t draw_below(uint64_t *state, uint64_t n)
{
    unsigned __int128 m = (unsigned __int128)bb_splitmix64(state) * n;
    uint64_t low = (uint64_t)m;
    if (low < n) {
        uint64_t threshold = -n % n;
        while (low < threshold) {
            m = (unsigned __int128)bb_splitmix64(state) * n;
            low = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}

/* ---- sampler ----------------------------------------------------------- */
uint32_t bb_sampler_frame_count_of(const bb_dataset_t *ds)
{
    uint32_t frames = 0;
    for (uint32_t i = 0; i < bb_dataset_shard_count(ds); i++) frames += bb_shard_frame_count(bb_dataset_shard(ds, i));
    return frames;
}

bb_status bb_sampler_create(const bb_dataset_t *ds, uint64_t seed, uint32_t shuffle_frames, uint32_t order,
                            bb_sampler_t **out)
{
    *out = NULL;
    if (shuffle_frames == 0) return bb_fail(BB_ERR_ARG, "--shuffle-frames must be at least 1");
    if (order != BB_ORDER_FIXED_WINDOWS && order != BB_ORDER_BALANCED)
        return bb_fail(BB_ERR_ARG, "data order version %u: this bigbatch knows versions %d and %d", order,
                       BB_ORDER_FIXED_WINDOWS, BB_ORDER_BALANCED);
    bb_sampler_t *s = calloc(1, sizeof *s);
    if (!s) return bb_fail(BB_ERR_NOMEM, "out of memory");
    s->seed = seed;
    s->order = order;
    s->frame_count = bb_sampler_frame_count_of(ds);
    /* A window wider than the dataset is the whole dataset: same order. */
    uint32_t w = shuffle_frames < s->frame_count ? shuffle_frames : s->frame_count;
    s->windows = s->frame_count ? (s->frame_count + w - 1) / w : 0;
    /* balanced: the windows' sizes differ by one frame at most */
    s->window_frames = order == BB_ORDER_BALANCED && s->windows ? (s->frame_count + s->windows - 1) / s->windows : w;
    s->frames = malloc((size_t)s->frame_count * sizeof *s->frames);
    if (!s->frames) {
        uint32_t n = s->frame_count;
        bb_sampler_destroy(s);
        return bb_fail(BB_ERR_NOMEM, "out of memory for %u frame descriptors", n);
    }
    uint32_t g = 0;
    for (uint32_t i = 0; i < bb_dataset_shard_count(ds); i++) {
        const bb_shard_t *sh = bb_dataset_shard(ds, i);
        const bb_shard_meta *m = bb_shard_get_meta(sh);
        for (uint32_t f = 0; f < bb_shard_frame_count(sh); f++, g++) {
            const bb_shard_frame *fr = bb_shard_frame_at(sh, f);
            s->frames[g] = (bb_sampler_frame){.shard = i, .frame = f,
                                              .records = (uint32_t)(fr->raw_size / m->record_size),
                                              .first_id = m->first_record + fr->first_record};
            s->record_count += s->frames[g].records;
        }
    }
    *out = s;
    return BB_OK;
}

void bb_sampler_destroy(bb_sampler_t *s)
{
    if (!s) return;
    free(s->frames);
    free(s);
}

uint64_t bb_sampler_record_count(const bb_sampler_t *s) { return s->record_count; }
uint32_t bb_sampler_frame_count(const bb_sampler_t *s) { return s->frame_count; }
uint32_t bb_sampler_window_frames(const bb_sampler_t *s) { return s->window_frames; }
uint32_t bb_sampler_window_count(const bb_sampler_t *s) { return s->windows; }

uint32_t bb_sampler_window_first(const bb_sampler_t *s, uint64_t w)
{
    if (w >= s->windows) return s->frame_count;
    if (s->order == BB_ORDER_FIXED_WINDOWS) return (uint32_t)(w * s->window_frames);
    uint32_t base = s->frame_count / s->windows, extra = s->frame_count % s->windows; /* the first `extra` one more */
    return (uint32_t)(w * base + (w < extra ? w : extra));
}
const bb_sampler_frame *bb_sampler_frame_at(const bb_sampler_t *s, uint32_t frame) { return &s->frames[frame]; }

/* ---- epoch order ------------------------------------------------------- */
bb_status bb_epoch_order_create(const bb_sampler_t *s, uint64_t epoch, bb_epoch_order_t **out)
{
    *out = NULL;
    bb_epoch_order_t *o = calloc(1, sizeof *o);
    uint32_t n = s->frame_count;
    if (o) {
        o->frames = malloc((size_t)n * sizeof *o->frames);
        o->first_pos = malloc(((size_t)n + 1) * sizeof *o->first_pos);
    }
    if (!o || !o->frames || !o->first_pos) {
        bb_epoch_order_destroy(o);
        return bb_fail(BB_ERR_NOMEM, "out of memory for the order of %u frames", n);
    }
    o->sampler = s;
    o->epoch = epoch;
    uint64_t rng = stream_seed(s->seed, epoch, UINT64_MAX);
    for (uint32_t i = 0; i < n; i++) o->frames[i] = i;
    for (uint32_t i = n; i > 1; i--) {
        uint32_t j = (uint32_t)draw_below(&rng, i);
        uint32_t t = o->frames[i - 1];
        o->frames[i - 1] = o->frames[j];
        o->frames[j] = t;
    }
    o->first_pos[0] = 0;
    for (uint32_t i = 0; i < n; i++) o->first_pos[i + 1] = o->first_pos[i] + s->frames[o->frames[i]].records;
    *out = o;
    return BB_OK;
}

void bb_epoch_order_destroy(bb_epoch_order_t *o)
{
    if (!o) return;
    free(o->frames);
    free(o->first_pos);
    free(o);
}

uint64_t bb_order_record_id(const bb_epoch_order_t *o, bb_record_ref ref)
{
    return o->sampler->frames[o->frames[ref.order_frame]].first_id + ref.index;
}

void bb_order_cursor_init(bb_order_cursor *c, const bb_epoch_order_t *order)
{
    *c = (bb_order_cursor){.order = order, .window = UINT64_MAX};
}

void bb_order_cursor_fini(bb_order_cursor *c)
{
    free(c->records);
    *c = (bb_order_cursor){.window = UINT64_MAX};
}

/* Builds the shuffled record list of window w into the cursor. */
static bb_status load_window(bb_order_cursor *c, uint64_t w)
{
    const bb_epoch_order_t *o = c->order;
    const bb_sampler_t *s = o->sampler;
    uint64_t first = bb_sampler_window_first(s, w), end = bb_sampler_window_first(s, w + 1);
    uint64_t count = o->first_pos[end] - o->first_pos[first];
    if (count > c->capacity) {
        bb_record_ref *r = realloc(c->records, count * sizeof *r);
        if (!r) return bb_fail(BB_ERR_NOMEM, "out of memory for a window of %llu records", (unsigned long long)count);
        c->records = r;
        c->capacity = count;
    }
    uint64_t k = 0;
    for (uint64_t j = first; j < end; j++)
        for (uint32_t i = 0; i < s->frames[o->frames[j]].records; i++)
            c->records[k++] = (bb_record_ref){.order_frame = (uint32_t)j, .index = i};
    uint64_t rng = stream_seed(s->seed, o->epoch, w);
    for (uint64_t i = count; i > 1; i--) {
        uint64_t j = draw_below(&rng, i);
        bb_record_ref t = c->records[i - 1];
        c->records[i - 1] = c->records[j];
        c->records[j] = t;
    }
    c->window = w;
    c->window_start = o->first_pos[first];
    c->window_count = count;
    return BB_OK;
}

/* The window holding epoch position p: the last window whose first record
 * is at or before p (binary search over window starts). */
uint64_t bb_epoch_order_window_of(const bb_epoch_order_t *o, uint64_t p)
{
    const bb_sampler_t *s = o->sampler;
    uint64_t lo = 0, hi = s->windows - 1;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo + 1) / 2;
        if (o->first_pos[bb_sampler_window_first(s, mid)] <= p)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

bb_status bb_order_cursor_get(bb_order_cursor *c, uint64_t first, uint32_t count, bb_record_ref *out)
{
    for (uint32_t i = 0; i < count;) {
        uint64_t p = first + i;
        if (c->window == UINT64_MAX || p < c->window_start || p >= c->window_start + c->window_count)
            BB_TRY(load_window(c, bb_epoch_order_window_of(c->order, p)));
        uint64_t offset = p - c->window_start;
        uint64_t take = c->window_count - offset;
        if (take > count - i) take = count - i;
        memcpy(out + i, c->records + offset, take * sizeof *out);
        i += (uint32_t)take;
    }
    return BB_OK;
}

bb_status bb_sampler_epoch_ids(const bb_sampler_t *s, uint64_t epoch, uint64_t first, uint64_t count, uint64_t *ids)
{
    if (first > s->record_count || count > s->record_count - first)
        return bb_fail(BB_ERR_ARG, "positions %llu..%llu are past the epoch's %llu records",
                       (unsigned long long)first, (unsigned long long)(first + count),
                       (unsigned long long)s->record_count);
    bb_epoch_order_t *o;
    BB_TRY(bb_epoch_order_create(s, epoch, &o));
    bb_order_cursor c;
    bb_order_cursor_init(&c, o);
    bb_status rc = BB_OK;
    bb_record_ref refs[256];
    for (uint64_t done = 0; done < count && rc == BB_OK;) {
        uint32_t n = count - done < 256 ? (uint32_t)(count - done) : 256;
        rc = bb_order_cursor_get(&c, first + done, n, refs);
        for (uint32_t i = 0; rc == BB_OK && i < n; i++) ids[done + i] = bb_order_record_id(o, refs[i]);
        done += n;
    }
    bb_order_cursor_fini(&c);
    bb_epoch_order_destroy(o);
    return rc;
}

static int by_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

static int by_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

bb_status bb_sampler_order_stats(const bb_sampler_t *s, uint64_t epoch, uint64_t G, bb_order_stats *out)
{
    *out = (bb_order_stats){.frames = s->frame_count};
    if (G == 0 || G > s->record_count)
        return bb_fail(BB_ERR_ARG, "a global batch of %llu from %llu records", (unsigned long long)G,
                       (unsigned long long)s->record_count);
    uint64_t batches = s->record_count / G;
    bb_epoch_order_t *o;
    BB_TRY(bb_epoch_order_create(s, epoch, &o));
    uint64_t *stamp = calloc(s->frame_count, sizeof *stamp); /* the batch (+1) that last saw the frame */
    uint32_t *distinct = malloc(batches * sizeof *distinct);
    double *spread = malloc(batches * sizeof *spread);
    bb_record_ref refs[256];
    bb_order_cursor c;
    bb_order_cursor_init(&c, o);
    bb_status rc = stamp && distinct && spread ? BB_OK : bb_fail(BB_ERR_NOMEM, "out of memory for the order's statistics");
    for (uint64_t b = 0; rc == BB_OK && b < batches; b++) {
        uint32_t n = 0;
        uint64_t lo = UINT64_MAX, hi = 0;
        for (uint64_t done = 0; rc == BB_OK && done < G;) {
            uint32_t k = G - done < 256 ? (uint32_t)(G - done) : 256;
            rc = bb_order_cursor_get(&c, b * G + done, k, refs);
            for (uint32_t i = 0; rc == BB_OK && i < k; i++) {
                uint64_t id = bb_order_record_id(o, refs[i]);
                lo = id < lo ? id : lo, hi = id > hi ? id : hi;
                if (stamp[refs[i].order_frame] != b + 1) stamp[refs[i].order_frame] = b + 1, n++;
            }
            done += k;
        }
        distinct[b] = n, spread[b] = (double)(hi - lo) / (double)s->record_count;
    }
    if (rc == BB_OK) {
        qsort(distinct, batches, sizeof *distinct, by_u32);
        qsort(spread, batches, sizeof *spread, by_double);
        *out = (bb_order_stats){.batches = batches, .frames = s->frame_count, .frames_per_batch_min = distinct[0],
                                .frames_per_batch_median = distinct[batches / 2],
                                .frames_per_batch_max = distinct[batches - 1], .spread_min = spread[0],
                                .spread_median = spread[batches / 2]};
    }
    bb_order_cursor_fini(&c);
    bb_epoch_order_destroy(o);
    free(stamp), free(distinct), free(spread);
    return rc;
}
