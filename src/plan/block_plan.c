/* block_plan.c — the fastest per-block plan that fits: a dynamic program
 * over the blocks (see plan.h, bb_plan_best_blocks).
 *
 * The blocks are taken from the last to the first; a state is which
 * policies the blocks already placed use (whether some block is selective,
 * whether some is full, and whether none, one or more are offloaded: what
 * decides the once-paid costs and whether a full block is the one the
 * backward spares), and each state keeps the Pareto frontier of (extra
 * bytes, extra time) over the plans of the blocks placed so far. A block
 * adds its own bytes, the saved input after a full or offloaded block, the
 * once-paid bytes of a policy not used yet (an offloaded block: a device
 * slot while fewer than two have one), and its recomputation's or its
 * copies' time. The frontiers stay small (at most one entry per count of
 * each policy), so the cost is O(L^4) at worst, well under a millisecond
 * for tens of blocks. */
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

bool bb_plan_best_blocks(int L, const bb_block_costs *k, int64_t room, const bb_block_times *bt, char *plan,
                         int64_t *bytes, double *time)
{
    /* state: bit 0 a selective block placed, bit 1 a full one, then OFF x the offloaded blocks placed: 0, 1,
     * 2 or more (what the slots cost), or under a cap each count up to it (what the cap allows next) */
    enum { SEL = 1, FULL = 2, OFF = 4 };
    if (L < 1 || L > BB_RECOMPUTE_MAX_BLOCKS) return false;
    int policies = bt->offload >= 0 ? 4 : 3;
    int capped = bt->max_offloaded > 0 && bt->max_offloaded < L, counts = capped ? bt->max_offloaded + 1 : 3;
    int STATES = OFF * counts;
    /* plans as linked policies: arena[i] = {letter, next}, so that entries share their tails */
    size_t cap = 1024, used = 0;
    struct link { char letter; int next; } *arena = malloc(cap * sizeof *arena);
    frontier *cur = calloc((size_t)STATES, sizeof *cur), *next = calloc((size_t)STATES, sizeof *next);
    bool ok = arena && cur && next && push(&cur[0], (entry){0, 0, -1});
    for (int l = L - 1; ok && l >= 0; l--) {
        bool last = l == L - 1;
        for (int s = 0; ok && s < STATES; s++) {
            for (int i = 0; ok && i < cur[s].n; i++) {
                const entry *e = &cur[s].e[i];
                for (int x = 0; ok && x < policies; x++) {
                    const uint64_t *own = last ? k->own_last : k->own;
                    int64_t b = e->bytes + (int64_t)own[x] - (int64_t)own[0];
                    double t = e->time;
                    int to = s;
                    if (x == 1) {
                        if (!(s & SEL)) b += (int64_t)k->once[1];
                        if (!last) t += bt->selective;
                        to |= SEL;
                    } else if (x == 2) {
                        if (!(s & FULL)) b += (int64_t)k->once[2];
                        if (!last) b += (int64_t)k->after_full;
                        bool spared = k->last_full_spared ? !(s & FULL) : last;
                        if (!spared) t += bt->full;
                        to |= FULL;
                    } else if (x == 3) {
                        int placed = s / OFF;
                        if (capped && placed == counts - 1) continue; /* the cap reached */
                        if (placed < 2) b += (int64_t)k->once[3];
                        if (capped || placed < 2) to += OFF;
                        if (!last) b += (int64_t)k->after_full;
                        t += bt->offload;
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
    for (int s = 0; cur && next && s < STATES; s++) free(cur[s].e), free(next[s].e);
    free(cur), free(next), free(arena);
    return ok && found;
}
