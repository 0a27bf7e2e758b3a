/* block_plan.c — the fastest per-block recompute plan that fits: a
 * dynamic program over the blocks (see plan.h, bb_plan_best_blocks).
 *
 * The blocks are taken from the last to the first; a state is which
 * policies the blocks already placed use (whether some block is selective,
 * whether some is full: what decides the once-paid costs and whether a
 * full block is the one the backward spares), and each state keeps the
 * Pareto frontier of (extra bytes, extra time) over the plans of the
 * blocks placed so far. A block adds its own bytes, the saved input after
 * a full block, the once-paid bytes of a policy not used yet, and its
 * recomputation's time. The frontiers stay small (at most one entry per
 * count of each policy), so the cost is O(L³) at worst, well under a
 * millisecond for tens of blocks. */
#include <stdlib.h>
#include <string.h>

#include "bigbatch/plan.h"

typedef struct entry {
    int64_t bytes;  /* over keeping everything */
    double time;    /* recomputation, in the caller's unit */
    int first;      /* index of this entry's plan in the arena: the policies of blocks l.. */
} entry;

typedef struct frontier {
    entry *e;
    int n, cap;
} frontier;

static bool push(frontier *f, entry x)
{
    if (f->n == f->cap) {
        int cap = f->cap ? 2 * f->cap : 16;
        entry *grown = realloc(f->e, (size_t)cap * sizeof *grown);
        if (!grown) return false;
        f->e = grown, f->cap = cap;
    }
    f->e[f->n++] = x;
    return true;
}

static int by_bytes(const void *a, const void *b)
{
    const entry *x = a, *y = b;
    return x->bytes < y->bytes ? -1 : x->bytes > y->bytes ? 1 : x->time < y->time ? -1 : x->time > y->time;
}

/* Keeps the entries no other beats in both bytes and time. */
static void prune(frontier *f)
{
    if (f->n < 2) return; /* nothing to compare (and qsort takes no NULL) */
    qsort(f->e, (size_t)f->n, sizeof *f->e, by_bytes);
    int kept = 0;
    for (int i = 0; i < f->n; i++)
        if (kept == 0 || f->e[i].time < f->e[kept - 1].time - 1e-12) f->e[kept++] = f->e[i];
    f->n = kept;
}

bool bb_plan_best_blocks(int L, const bb_block_costs *k, int64_t room, double t_selective, double t_full, char *plan,
                         int64_t *bytes, double *time)
{
    enum { STATES = 4 }; /* bit 0: a selective block placed; bit 1: a full one */
    if (L < 1 || L > BB_RECOMPUTE_MAX_BLOCKS) return false;
    /* plans as linked policies: arena[i] = {letter, next}, so that entries share their tails */
    size_t cap = 1024, used = 0;
    struct link { char letter; int next; } *arena = malloc(cap * sizeof *arena);
    frontier cur[STATES] = {{0}}, next[STATES] = {{0}};
    bool ok = arena && push(&cur[0], (entry){0, 0, -1});
    for (int l = L - 1; ok && l >= 0; l--) {
        bool last = l == L - 1;
        for (int s = 0; ok && s < STATES; s++) {
            for (int i = 0; ok && i < cur[s].n; i++) {
                const entry *e = &cur[s].e[i];
                for (int x = 0; ok && x < 3; x++) {
                    const uint64_t *own = last ? k->own_last : k->own;
                    int64_t b = e->bytes + (int64_t)own[x] - (int64_t)own[0];
                    double t = e->time;
                    int to = s;
                    if (x == 1) {
                        if (!(s & 1)) b += (int64_t)k->once[1];
                        if (!last) t += t_selective;
                        to |= 1;
                    } else if (x == 2) {
                        if (!(s & 2)) b += (int64_t)k->once[2];
                        if (!last) b += (int64_t)k->after_full;
                        bool spared = k->last_full_spared ? !(s & 2) : last;
                        if (!spared) t += t_full;
                        to |= 2;
                    }
                    if (used == cap) {
                        cap *= 2;
                        void *grown = realloc(arena, cap * sizeof *arena);
                        if (!grown) {
                            ok = false;
                            break;
                        }
                        arena = grown;
                    }
                    arena[used] = (struct link){BB_RECOMPUTE_LETTERS[x], e->first};
                    ok = push(&next[to], (entry){b, t, (int)used++});
                }
            }
        }
        for (int s = 0; s < STATES; s++) {
            prune(&next[s]);
            frontier swap = cur[s];
            cur[s] = next[s], next[s] = swap;
            next[s].n = 0;
        }
    }
    const entry *best = NULL;
    for (int s = 0; ok && s < STATES; s++)
        for (int i = 0; i < cur[s].n; i++) {
            const entry *e = &cur[s].e[i];
            if (e->bytes > room) continue;
            if (!best || e->time < best->time - 1e-12 || (e->time <= best->time + 1e-12 && e->bytes < best->bytes))
                best = e;
        }
    if (best) {
        int n = 0;
        for (int i = best->first; i >= 0; i = arena[i].next) plan[n++] = arena[i].letter;
        plan[n] = 0;
        *bytes = best->bytes, *time = best->time;
    }
    bool found = best != NULL;
    for (int s = 0; s < STATES; s++) free(cur[s].e), free(next[s].e);
    free(arena);
    return ok && found;
}
