/* op_harness.h — test_ops.c's harness: a case's buffers (inputs made once,
 * outputs named with a tolerance, activations that a bf16 pass makes bf16),
 * the sides it runs on (the reference, the backend under test twice) and
 * the comparisons between them. Included by test_ops.c alone; its header
 * comment says how the passes use it.
 *
 * How a case uses it:
 *   buf x = tc_act(t, tc_floats(t, "x", n, 1));     // an input, bf16 in bf16 passes
 *   buf y = tc_act(t, tc_out(t, tc_floats(t, "y", n, 0), 1e-5)); // an output and its tolerance
 *   TC_RUN(t, bb_op_add(side_be(t), tc_t(t, y), tc_t(t, x), tc_t(t, x), n));
 */
#ifndef BIGBATCH_TESTS_OP_HARNESS_H
#define BIGBATCH_TESTS_OP_HARNESS_H

#include <math.h>

#include "bigbatch/backend.h"
#include "test_util.h"

/* ---- the harness ------------------------------------------------------- */
enum { MAX_BUFS = 16, MAX_VALUES = 4, SIDES = 3 }; /* reference, under test, under test again */
/* bf16 keeps 8 bits of mantissa: one rounding is 2^-9 relative, and a
 * result's largest element sets the scale errors are held to. */
#define BF16_TOL 1e-2

typedef enum { KIND_FLOATS, KIND_BYTES } buf_kind;

typedef struct buf_state {
    buf_kind kind;
    size_t n, bytes;       /* elements; bytes on the device */
    void *init;            /* host: floats (n) or raw bytes */
    void *dev[2];          /* on the reference, on the backend under test */
    void *result[SIDES];   /* host copies after each run (outputs) */
    double tol;            /* output: max relative difference; 0: the same bits; < 0: an input */
    bool act;              /* an activation: bf16 on a side that runs bf16 */
    const char *name;
} buf_state;

typedef struct tc {
    bb_backend_t *be[2];   /* reference, under test */
    bool counting;         /* the backend under test only counts */
    int side;              /* the run in progress: 0, 1, 2 */
    int nbufs;
    buf_state bufs[MAX_BUFS];
    struct {
        const char *name;
        double v[SIDES], tol;
    } values[MAX_VALUES];
    int nvalues;
    const int *dims;       /* this shape */
    double tol_floor;      /* a bf16 pass or backend: no output closer than this */
    bool bf16[2];          /* the reference's, the backend under test's activations are bf16 */
    bool skipped;          /* a bf16 pass, and the op has no activation */
    uint64_t seed;
    char what[160];        /* op, shape, backend: for messages */
} tc;

typedef int buf;

/* Runs 1 and 2 are the backend under test's: its buffers. */
static int dev_of(int side) { return side > 0; }
static bb_backend_t *side_be(const tc *t) { return t->be[dev_of(t->side)]; }

static float uniform(uint64_t *s, float scale)
{
    return (float)(((bb_splitmix64(s) >> 11) / 9007199254740992.0) * 2 - 1) * scale;
}

static buf new_buf(tc *t, buf_kind kind, size_t n, size_t bytes, const char *name)
{
    cr_assert_lt(t->nbufs, MAX_BUFS, "%s: too many buffers", t->what);
    buf_state *b = &t->bufs[t->nbufs];
    *b = (buf_state){.kind = kind, .n = n, .bytes = bytes, .tol = -1, .name = name};
    b->init = calloc(1, kind == KIND_FLOATS ? n * sizeof(float) + 1 : bytes + 1);
    for (int s = 0; s < 2; s++)
        cr_assert_eq(bb_backend_alloc(t->be[s], bytes ? bytes : 1, name, &b->dev[s]), BB_OK, "%s: %s", t->what,
                     bb_error_message());
    return t->nbufs++;
}

/* n f32 floats uniform in [-scale, scale). */
static buf tc_floats(tc *t, const char *name, size_t n, float scale)
{
    buf b = new_buf(t, KIND_FLOATS, n, n * sizeof(float), name);
    float *x = t->bufs[b].init;
    uint64_t s = t->seed++ * 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < n; i++) x[i] = uniform(&s, scale);
    return b;
}
/* Given floats (or raw bytes), held as they are. */
static buf tc_given(tc *t, const char *name, const float *x, size_t n)
{
    buf b = new_buf(t, KIND_FLOATS, n, n * sizeof(float), name);
    memcpy(t->bufs[b].init, x, n * sizeof *x);
    return b;
}
static buf tc_bytes(tc *t, const char *name, const void *x, size_t bytes)
{
    buf b = new_buf(t, KIND_BYTES, 0, bytes, name);
    if (x) memcpy(t->bufs[b].init, x, bytes);
    return b;
}
/* The buffer is an output: compared within `tol` (0: bitwise). */
static buf tc_out(tc *t, buf b, double tol)
{
    t->bufs[b].tol = tol;
    return b;
}
/* The buffer is an activation tensor (bf16 on a side that runs bf16). */
static buf tc_act(tc *t, buf b)
{
    t->bufs[b].act = true;
    return b;
}
static bool bf16_pass(const tc *t) { return t->bf16[0] || t->bf16[1]; }
static bool is_bf16(const tc *t, const buf_state *b, int dev) { return b->act && t->bf16[dev]; }
/* The current run's view of a buffer. */
static void *tc_p(tc *t, buf b) { return t->bufs[b].dev[dev_of(t->side)]; }
static bb_tensor tc_t(tc *t, buf b)
{
    return is_bf16(t, &t->bufs[b], dev_of(t->side)) ? bb_bf16(tc_p(t, b)) : bb_f32(tc_p(t, b));
}
/* A value the op returned to the host, compared within `tol` (0: equal). */
static void tc_value(tc *t, const char *name, double v, double tol)
{
    int k = 0;
    while (k < t->nvalues && strcmp(t->values[k].name, name)) k++;
    if (k == t->nvalues) {
        cr_assert_lt(t->nvalues, MAX_VALUES);
        t->nvalues++;
        t->values[k].name = name, t->values[k].tol = tol;
    }
    t->values[k].v[t->side] = v;
}

static void upload(tc *t, int s)
{
    for (int i = 0; i < t->nbufs; i++) {
        buf_state *b = &t->bufs[i];
        const void *from = b->init;
        size_t bytes = b->bytes;
        uint16_t *h = NULL;
        if (is_bf16(t, b, s)) {
            h = malloc(b->n * sizeof *h + 1);
            for (size_t k = 0; k < b->n; k++) h[k] = bb_bf16_from_float(((const float *)b->init)[k]);
            from = h, bytes = b->n * sizeof *h;
        }
        cr_assert_eq(bb_backend_copy(t->be[s], b->dev[s], from, bytes, BB_COPY_H2D), BB_OK, "%s: %s", t->what,
                     bb_error_message());
        free(h);
    }
}

/* A bf16 pass's inputs are bf16 values on both sides: every activation
 * rounded once, before the first run. */
static void round_activations(tc *t)
{
    for (int i = 0; i < t->nbufs; i++)
        if (t->bufs[i].act)
            for (size_t k = 0; k < t->bufs[i].n; k++) {
                float *x = &((float *)t->bufs[i].init)[k];
                *x = bb_bf16_to_float(bb_bf16_from_float(*x));
            }
}

/* Downloads the outputs of run `side`, as floats (KIND_FLOATS) or bytes. */
static void download(tc *t, int side)
{
    bb_backend_t *be = t->be[dev_of(side)];
    cr_assert_eq(bb_backend_synchronize(be), BB_OK, "%s: %s", t->what, bb_error_message());
    if (t->counting) return; /* the profiles are compared, not the outputs */
    for (int i = 0; i < t->nbufs; i++) {
        buf_state *b = &t->bufs[i];
        if (b->tol < 0) continue;
        bool half = is_bf16(t, b, dev_of(side));
        void *raw = malloc(b->bytes + 1);
        cr_assert_eq(bb_backend_copy(be, raw, b->dev[dev_of(side)], half ? b->n * sizeof(uint16_t) : b->bytes,
                                     BB_COPY_D2H),
                     BB_OK, "%s: %s", t->what, bb_error_message());
        if (half) /* widened in place, from the end */
            for (size_t k = b->n; k-- > 0;) ((float *)raw)[k] = bb_bf16_to_float(((const uint16_t *)raw)[k]);
        b->result[side] = raw;
    }
}

/* max |a - b| / max |a| over the floats, or the first differing byte. */
static void compare(tc *t, const buf_state *b, int x, int y, double tol, const char *against)
{
    const char *dut = bb_backend_name(t->be[1]);
    if (b->kind == KIND_BYTES || tol == 0) {
        size_t bytes = b->kind == KIND_BYTES ? b->bytes : b->n * sizeof(float);
        const uint8_t *p = b->result[x], *q = b->result[y];
        size_t first = 0;
        while (first < bytes && p[first] == q[first]) first++;
        cr_assert_eq(first, bytes, "%s: %s: %s differs from %s from byte %zu on", t->what, b->name, dut, against,
                     first);
        return;
    }
    const float *p = b->result[x], *q = b->result[y];
    double diff = 0, norm = 0;
    for (size_t i = 0; i < b->n; i++) {
        if (isnan(p[i]) || isnan(q[i])) {
            cr_assert(isnan(p[i]) && isnan(q[i]), "%s: %s[%zu]: %g on %s, %g on %s", t->what, b->name, i, q[i], dut,
                      p[i], against);
            continue;
        }
        diff = fmax(diff, fabs((double)p[i] - q[i]));
        norm = fmax(norm, fabs((double)p[i]));
    }
    double rel = diff / (norm > 0 ? norm : 1);
    cr_assert(rel <= tol, "%s: %s: %s differs from %s by %.3e relative (max %.3e; tolerance %.0e)", t->what, b->name,
              dut, against, rel, norm, tol);
}

/* The op profile's table, sorted by name, for comparing two backends' counts. */
static int by_op(const void *a, const void *b) { return strcmp(((const bb_op_time *)a)->op, ((const bb_op_time *)b)->op); }

static void compare_counts(tc *t)
{
    bb_op_time want[64], got[64];
    int nw = bb_backend_op_profile(t->be[0], want, 64), ng = bb_backend_op_profile(t->be[1], got, 64);
    qsort(want, (size_t)nw, sizeof *want, by_op), qsort(got, (size_t)ng, sizeof *got, by_op);
    cr_assert_gt(nw, 0, "%s: the reference profiled nothing", t->what);
    cr_assert_eq(ng, nw, "%s: the counting backend counted %d ops, the CPU ran %d", t->what, ng, nw);
    for (int i = 0; i < nw; i++) {
        cr_assert_str_eq(got[i].op, want[i].op, "%s", t->what);
        cr_assert(got[i].calls == want[i].calls && got[i].flops == want[i].flops &&
                      got[i].elements == want[i].elements,
                  "%s: %s counted %llu calls, %g FLOPs, %g elements; the CPU ran %llu, %g, %g", t->what, got[i].op,
                  (unsigned long long)got[i].calls, got[i].flops, got[i].elements,
                  (unsigned long long)want[i].calls, want[i].flops, want[i].elements);
    }
}

/* Before each run: every buffer as the case made it. After the last: the
 * comparisons. */
static bool tc_next(tc *t)
{
    if (t->side < 0 && bf16_pass(t)) {
        bool any = false;
        for (int i = 0; i < t->nbufs; i++) any |= t->bufs[i].act;
        if (!any) return !(t->skipped = true);
        round_activations(t);
    }
    if (t->side >= 0) download(t, t->side);
    if (t->side + 1 == SIDES) {
        if (t->counting) compare_counts(t);
        for (int i = 0; i < t->nbufs && !t->counting; i++) {
            const buf_state *b = &t->bufs[i];
            if (b->tol < 0) continue;
            bool floored = b->tol > 0 || (b->act && bf16_pass(t)); /* a bf16 result is rounded */
            compare(t, b, 0, 1, floored && b->tol < t->tol_floor ? t->tol_floor : b->tol, "the CPU");
            compare(t, b, 1, 2, 0, "its own first run");
        }
        for (int k = 0; k < t->nvalues && !t->counting; k++) {
            const double *v = t->values[k].v, tol = t->values[k].tol;
            double rel = fabs(v[1] - v[0]) / fmax(fabs(v[0]), 1e-30);
            cr_assert(tol == 0 ? v[1] == v[0] : rel <= tol, "%s: %s is %.12g, on the CPU %.12g", t->what,
                      t->values[k].name, v[1], v[0]);
            cr_assert(v[2] == v[1], "%s: %s is %.12g, then %.12g", t->what, t->values[k].name, v[1], v[2]);
        }
        return false;
    }
    t->side++;
    upload(t, dev_of(t->side));
    bb_backend_op_profile_reset(side_be(t)); /* the reference's run, and the last of the backend under test */
    return true;
}

/* Runs `call` on the reference, then twice on the backend under test. */
#define TC_RUN(t, call) for ((t)->side = -1; tc_next(t);) call

typedef struct op_case {
    const char *op;
    void (*run)(tc *t);
    int shapes, dims[8][6];
    unsigned large; /* bit s: shape s is full size (GPT-2's), slow on the emulated GPU */
} op_case;

#endif
