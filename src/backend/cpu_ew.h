/* cpu_ew.h — private: the CPU backend's element-wise and row-wise ops run
 * over its thread pool (bb_cpu_ew_run in cpu_ops.c; the ranges in
 * cpu_ops.c, cpu_optim.c and cpu_norm.c).
 *
 *   static void scale_range(const ew_args *a, size_t lo, size_t hi, int slice)
 *   {
 *       for (size_t i = lo; i < hi; i++) a->x[i] = a->a[i] * a->f[0];
 *   }
 *   bb_cpu_ew_run(b, &(ew_args){.range = scale_range, .x = out, .a = in, .f = {2.0f}, .n = n});
 *
 * Nothing here fails: a range that cannot get memory notes the error on
 * the backend (bb_backend_note_error), which the next synchronizing call
 * returns. */
#ifndef BIGBATCH_CPU_EW_H
#define BIGBATCH_CPU_EW_H

#include "backend_impl.h"

/* An op's loop runs over fixed slices (EW_GRAIN elements, or whole rows
 * near that), so a sum made of per-slice parts is the same for any thread
 * count; an op smaller than one slice runs in the caller's thread. */
enum { EW_GRAIN = 1 << 15 };

typedef struct ew_args {
    void (*range)(const struct ew_args *a, size_t lo, size_t hi, int slice);
    float *x, *y, *z;      /* outputs (or in-place operands) */
    const float *a, *c;    /* inputs */
    uint16_t *h;           /* bf16 out */
    const uint16_t *hc;    /* bf16 in */
    float f[7];            /* scalars */
    double *parts;         /* a sum's part per slice */
    size_t n, grain;
    int C;                 /* row-wise ops: the row width; n counts rows */
    int rows;              /* column-wise ops (the bias gradient): n counts columns of `rows` rows */
} ew_args;

/* The number of slices an op of `a` runs in (its grain set). */
static inline int bb_cpu_ew_slices(const ew_args *a) { return (int)((a->n + a->grain - 1) / a->grain); }
/* Runs a->range over every slice of a->n on the backend's pool (the grain
 * EW_GRAIN elements, or rows near it when a->C is set, unless given). */
void bb_cpu_ew_run(bb_backend_t *b, ew_args *a);

#endif
