// kernels.cpp — kernels on the CPU (emu.h): a launch is checked as CUDA
// checks it and queued on its stream. When the stream gets there, its
// blocks run one at a time on the stream's thread, in a seeded order; each
// CUDA thread is a fiber (its own 256 KiB stack, aligned, its view at the
// top) that runs until it waits at a barrier or a warp operation or
// returns, then hands the thread straight to the next runnable fiber,
// picked at random (seeded): lanes do not run in lockstep, so a missing
// __syncwarp shows. Barriers and warp operations are strict like the
// hardware (a barrier some thread does not reach, a mask naming a lane
// that is not there or returned, a shuffle from outside its mask): the
// block ends with the error, a sticky cudaErrorLaunchFailure naming the
// kernel, the block and the line.
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <new>

#include "emu.h"

#ifdef BBEMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

// The fibers' context switch (x86-64 assembly below): saves the callee-saved
// registers on the current stack, stores its pointer in *save_sp and
// resumes the stack at new_sp. A new fiber starts in the trampoline, which
// calls bbemu_fiber_main with the fiber (carried in rbx).
extern "C" void bbemu_swap(void **save_sp, void *new_sp) __attribute__((visibility("hidden")));
extern "C" void bbemu_fiber_trampoline() __attribute__((visibility("hidden")));
extern "C" void bbemu_fiber_main(void *fiber) __attribute__((visibility("hidden"), noreturn, used));

namespace bbemu_rt {

struct launch_rec {
    std::string name;
    dim3 grid, block;
    size_t shared;
    void (*invoke)(void *);
    void (*drop)(void *);
    void *ctx;
    std::vector<const void *> pointers;
    std::vector<int> pointer_index;
    bool inject_fault = false;
    bool hang = false; // BB_CUDA_EMU_HANG: never ends, as a kernel spinning on a dead peer
    std::string fault_text;
    uint64_t number;
    ~launch_rec()
    {
        if (drop) drop(ctx);
    }
};

namespace {

constexpr size_t kSharedCanary = 64; // bytes of canary on each side of a block's dynamic shared memory

enum fiber_state { F_RUN, F_BARRIER, F_WARP, F_DONE };

struct block_run;

struct fiber {
    bbemu_fiber_view *view; // at the top of its stack, where self() finds it
    uint8_t *top;           // where its stack starts (below the view, staggered)
    void *sp;
    int linear, state;
    bool dirty;            // its stack holds frames of an abandoned run
    const char *file;      // where it waits
    int line;
    bbemu_warp_op op;
    unsigned mask;
    int src;
    uint64_t value, result;
#ifdef BBEMU_ASAN
    void *fake_stack;
#endif
};

// The stack region of a fiber: [guard page][stack ......][view] — the view
// in the top BBEMU_VIEW_BYTES, where self() finds it. The fibers' records
// are an array of their own, and each stack starts a different number of
// cache lines below its view: with stacks aligned to 256 KiB, the hot top
// of every stack would otherwise fall in the same cache sets.
static_assert(sizeof(bbemu_fiber_view) <= BBEMU_VIEW_BYTES, "the view does not fit its slot at the top of its stack");

struct warp_state {
    unsigned waiting; // lanes at a warp operation
    unsigned wanted;  // lanes those operations' masks name (a superset once some completed)
    unsigned barrier; // lanes at __syncthreads
    unsigned done;    // lanes that returned
};

struct block_run {
    launch_rec *L;
    dim3 bid;
    int n;
    fiber **f;
    void *sched_sp, *dead_sp;
    std::vector<int> runq;
    int bar_arrived, done;
    const char *bar_file;
    int bar_line;
    const char *other_file; // a second barrier site: divergence
    int other_line;
    warp_state w[32];
    std::string error;
    rng order;
    const void *sched_bottom;
    size_t sched_size;
#ifdef BBEMU_ASAN
    void *sched_fake;
#endif
};

struct fiber_pool {
    uint8_t *region = nullptr;
    size_t count = 0;
    std::vector<fiber> records;
    std::vector<fiber *> f;
    std::vector<uint8_t> shared; // dynamic shared memory, canaries around it
    block_run b;
    void *thread_stack = nullptr; // the stream thread's own stack (for ASan's fiber switches)
    size_t thread_stack_size = 0;
};

thread_local fiber_pool *pool_of_thread;
thread_local fiber *cur_fiber;
thread_local block_run *cur_block;

#if defined(__x86_64__)
__asm__(".text\n"
        ".globl bbemu_swap\n.hidden bbemu_swap\n.type bbemu_swap,@function\n"
        "bbemu_swap:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size bbemu_swap, .-bbemu_swap\n"
        ".globl bbemu_fiber_trampoline\n.hidden bbemu_fiber_trampoline\n.type bbemu_fiber_trampoline,@function\n"
        "bbemu_fiber_trampoline:\n"
        "  movq %rbx, %rdi\n  call bbemu_fiber_main\n  ud2\n"
        ".size bbemu_fiber_trampoline, .-bbemu_fiber_trampoline\n");

// The floating-point control state (MXCSR, x87) is not switched: kernels
// do not change it, and every fiber runs with the stream thread's.
void *initial_frame(fiber *f, uint8_t *top)
{
    uint64_t *frame = (uint64_t *)top - 9; // the trampoline starts at top - 16: its call is ABI-aligned
    frame[0] = frame[1] = frame[2] = frame[3] = 0; // r15 .. r12
    frame[4] = (uint64_t)f;                         // rbx: the trampoline's argument
    frame[5] = 0;                                   // rbp
    frame[6] = (uint64_t)&bbemu_fiber_trampoline;   // ret
    frame[7] = frame[8] = 0;
    return frame;
}
#else
#error "the CUDA emulator's fibers are written for x86-64"
#endif

uint8_t *stack_base(fiber_pool *p, size_t i) { return p->region + i * BBEMU_STACK_BYTES; }

// Grows the pool to n fibers (the region is aligned to the stack size).
void ensure_fibers(fiber_pool *p, size_t n)
{
    if (p->count >= n) return;
    size_t want = n < 32 ? 32 : n;
    if (p->region) {
        // Nothing runs on the old stacks between blocks: start over.
        munmap(p->region, p->count * BBEMU_STACK_BYTES);
        p->f.clear();
        p->records.clear();
    }
    size_t bytes = want * BBEMU_STACK_BYTES;
    uint8_t *raw = (uint8_t *)mmap(nullptr, bytes + BBEMU_STACK_BYTES, PROT_READ | PROT_WRITE,
                                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) {
        fprintf(stderr, "cuda-emu: cannot map %zu fiber stacks\n", want);
        abort();
    }
    uintptr_t aligned = round_up((uintptr_t)raw, BBEMU_STACK_BYTES);
    if (aligned > (uintptr_t)raw) munmap(raw, aligned - (uintptr_t)raw);
    uintptr_t end = (uintptr_t)raw + bytes + BBEMU_STACK_BYTES;
    if (end > aligned + bytes) munmap((void *)(aligned + bytes), end - (aligned + bytes));
    p->region = (uint8_t *)aligned;
    p->count = want;
    p->records.resize(want);
    for (size_t i = 0; i < want; i++) {
        uint8_t *base = stack_base(p, i);
        mprotect(base, kPage, PROT_NONE); // the guard below the stack
        fiber *f = &p->records[i];
        f->view = new (base + BBEMU_STACK_BYTES - BBEMU_VIEW_BYTES) bbemu_fiber_view();
        f->top = (uint8_t *)f->view - 64 * ((i * 37) % 61) - 64;
        p->f.push_back(f);
    }
}

bool in_stack_guard(const void *addr)
{
    fiber_pool *p = pool_of_thread;
    if (!p || !p->region) return false;
    uintptr_t a = (uintptr_t)addr, lo = (uintptr_t)p->region;
    if (a < lo || a >= lo + p->count * BBEMU_STACK_BYTES) return false;
    return (a - lo) % BBEMU_STACK_BYTES < kPage;
}

#ifdef BBEMU_ASAN
#define ASAN_START(save, bottom, size) __sanitizer_start_switch_fiber((save), (bottom), (size))
#define ASAN_FINISH(save, bottom, size) __sanitizer_finish_switch_fiber((save), (bottom), (size))
#else
#define ASAN_START(save, bottom, size) ((void)0)
#define ASAN_FINISH(save, bottom, size) ((void)0)
#endif

[[maybe_unused]] const void *stack_lo(fiber *f) { return (const uint8_t *)f->view - BBEMU_STACK_BYTES + kPage; }

[[maybe_unused]] size_t stack_size(fiber *f) { return (size_t)(f->top - (const uint8_t *)stack_lo(f)); }

// A runnable fiber picked at random (seeded); NULL when none is left or
// the block failed.
fiber *pick(block_run *b)
{
    if (b->runq.empty() || !b->error.empty()) return nullptr;
    uint32_t k = b->order.below((uint32_t)b->runq.size());
    fiber *g = b->f[b->runq[k]];
    b->runq[k] = b->runq.back();
    b->runq.pop_back();
    return g;
}

// The running fiber stops (it waits, or for good: it returned or failed):
// the thread goes straight to the next runnable fiber (which may be this
// one again), or back to the block's scheduler when none is left.
void yield(fiber *f, bool forever)
{
    block_run *b = cur_block;
    fiber *g = pick(b);
    if (g == f) return;
    cur_fiber = g;
    ASAN_START(forever ? nullptr : &f->fake_stack, g ? stack_lo(g) : b->sched_bottom,
               g ? stack_size(g) : b->sched_size);
    bbemu_swap(forever ? &b->dead_sp : &f->sp, g ? g->sp : b->sched_sp);
    ASAN_FINISH(f->fake_stack, nullptr, nullptr);
}

[[noreturn]] void leave_for_good(fiber *f)
{
    yield(f, true);
    __builtin_unreachable();
}

std::string thread_list(block_run *b, bool (*pick)(const fiber *, const void *), const void *arg)
{
    std::string s;
    int count = 0;
    for (int i = 0; i < b->n;) {
        if (!pick(b->f[i], arg)) {
            i++;
            continue;
        }
        int j = i;
        while (j + 1 < b->n && pick(b->f[j + 1], arg)) j++;
        if (count++ < 6) s += (s.empty() ? "" : ", ") + (i == j ? format("%d", i) : format("%d-%d", i, j));
        i = j + 1;
    }
    if (count > 6) s += ", ...";
    return s;
}

const char *op_name(bbemu_warp_op op)
{
    switch (op) {
    case BBEMU_SYNCWARP: return "__syncwarp";
    case BBEMU_SHFL_XOR: return "__shfl_xor_sync";
    case BBEMU_SHFL_DOWN: return "__shfl_down_sync";
    case BBEMU_SHFL_UP: return "__shfl_up_sync";
    case BBEMU_SHFL_IDX: return "__shfl_sync";
    }
    return "?";
}

const char *base_name(const char *file)
{
    const char *s = strrchr(file, '/');
    return s ? s + 1 : file;
}

std::string site(const char *file, int line) { return format("%s:%d", base_name(file), line); }
std::string at(bbemu_warp_op op, const char *file, int line)
{
    return format("%s at %s", op_name(op), site(file, line).c_str());
}

// Ends the block with an error (the scheduler abandons it); never returns.
// The message is made in a statement of its own: nothing it allocates is
// left behind on the abandoned fiber's stack.
void set_block_error(std::string what)
{
    if (cur_block->error.empty()) cur_block->error = std::move(what);
}
#define BLOCK_ERROR(f, ...)                    \
    do {                                       \
        set_block_error(format(__VA_ARGS__));  \
        (f)->dirty = true;                     \
        leave_for_good(f);                     \
    } while (0)

void release(block_run *b, fiber *f)
{
    f->state = F_RUN;
    b->runq.push_back(f->linear);
}

// Threads at the barrier where the first arrived, and at another one.
bool at_first_barrier(const fiber *x, const void *block)
{
    const block_run *b = static_cast<const block_run *>(block);
    return x->state == F_BARRIER && x->line == b->bar_line && x->file == b->bar_file;
}

bool at_other_barrier(const fiber *x, const void *block)
{
    return x->state == F_BARRIER && !at_first_barrier(x, block);
}

// Completes the barrier when every thread that has not returned waits at it.
void check_barrier(block_run *b, fiber *self)
{
    if (b->bar_arrived == 0 || b->bar_arrived + b->done < b->n) return;
    if (b->done > 0)
        BLOCK_ERROR(self, "__syncthreads at %s:%d is not reached by threads %s, which returned (a barrier every "
                    "thread of the block must reach)", base_name(b->bar_file), b->bar_line,
                    thread_list(b, [](const fiber *x, const void *) { return x->state == F_DONE; }, nullptr).c_str());
    if (b->other_file)
        BLOCK_ERROR(self, "divergent __syncthreads: threads %s wait at %s:%d, threads %s at %s:%d",
                    thread_list(b, at_first_barrier, b).c_str(), base_name(b->bar_file), b->bar_line,
                    thread_list(b, at_other_barrier, b).c_str(), base_name(b->other_file), b->other_line);
    for (int i = 0; i < b->n; i++)
        if (b->f[i]->state == F_BARRIER) release(b, b->f[i]);
    for (int w = 0; w < (b->n + 31) / 32; w++) b->w[w].barrier = 0;
    b->bar_arrived = 0;
    b->bar_file = b->other_file = nullptr;
}

int lanes_of_warp(const block_run *b, int warp) { return std::min(32, b->n - warp * 32); }

// The lanes of this fiber's warp that wait at a warp operation naming it.
unsigned waiting_for(block_run *b, fiber *f)
{
    int warp = f->linear / 32, lane = f->linear % 32;
    unsigned who = 0;
    if (!(b->w[warp].wanted & (1u << lane))) return 0;
    for (unsigned m = b->w[warp].waiting; m; m &= m - 1) {
        int l = __builtin_ctz(m);
        if (b->f[warp * 32 + l]->mask & (1u << lane)) who |= 1u << l;
    }
    return who;
}

std::string lane_list(unsigned m)
{
    std::string s;
    for (int i = 0; i < 32;) {
        if (!(m & (1u << i))) {
            i++;
            continue;
        }
        int j = i;
        while (j + 1 < 32 && (m & (1u << (j + 1)))) j++;
        s += (s.empty() ? "" : ",") + (i == j ? format("%d", i) : format("%d-%d", i, j));
        i = j + 1;
    }
    return s;
}

// A thread that leaves for __syncthreads (file:line) or returns (file
// NULL) while lanes of its warp wait for it at a warp operation: an error.
void complain_waiters(block_run *b, fiber *f, const char *file, int line)
{
    unsigned who = waiting_for(b, f);
    if (!who) return;
    int warp = f->linear / 32;
    fiber *w = b->f[warp * 32 + __builtin_ctz(who)];
    BLOCK_ERROR(f, "thread %d %s while lanes %s of its warp wait for it at %s (%s:%d, mask 0x%08x)", f->linear,
                file ? format("went to __syncthreads (%s)", site(file, line).c_str()).c_str() : "returned",
                lane_list(who).c_str(), op_name(w->op), base_name(w->file), w->line, w->mask);
}

void thread_finished(fiber *f)
{
    block_run *b = cur_block;
    f->state = F_DONE;
    b->done++;
    b->w[f->linear / 32].done |= 1u << (f->linear % 32);
    complain_waiters(b, f, nullptr, 0);
    check_barrier(b, f);
}

// Completes warp `warp`'s operation over `mask` when every lane of it waits there.
void try_complete_warp(block_run *b, fiber *self, int warp, unsigned mask)
{
    warp_state &ws = b->w[warp];
    if ((ws.waiting & mask) != mask) return;
    fiber *first = b->f[warp * 32 + __builtin_ctz(mask)];
    for (unsigned m = mask; m; m &= m - 1) {
        fiber *x = b->f[warp * 32 + __builtin_ctz(m)];
        if (x->mask != mask) return; // another group is still forming
        bool sync_a = x->op == BBEMU_SYNCWARP, sync_b = first->op == BBEMU_SYNCWARP;
        if (sync_a != sync_b || (!sync_a && x->op != first->op))
            BLOCK_ERROR(self, "lanes of warp %d meet at different warp operations: %s (%s:%d) and %s (%s:%d)", warp,
                        op_name(first->op), base_name(first->file), first->line, op_name(x->op), base_name(x->file),
                        x->line);
    }
    for (unsigned m = mask; m; m &= m - 1) {
        fiber *x = b->f[warp * 32 + __builtin_ctz(m)];
        x->result = b->f[warp * 32 + x->src]->value;
    }
    for (unsigned m = mask; m; m &= m - 1) release(b, b->f[warp * 32 + __builtin_ctz(m)]);
    ws.waiting &= ~mask;
    ws.wanted = 0;
    for (unsigned m = ws.waiting; m; m &= m - 1) ws.wanted |= b->f[warp * 32 + __builtin_ctz(m)]->mask;
}

} // namespace
} // namespace bbemu_rt

using namespace bbemu_rt;

extern "C" void bbemu_fiber_main(void *self)
{
    fiber *f = static_cast<fiber *>(self);
    block_run *b = cur_block;
    ASAN_FINISH(nullptr, nullptr, nullptr);
    b->L->invoke(b->L->ctx);
    thread_finished(f);
    leave_for_good(f);
}

// ---- device-side entry points --------------------------------------------------------------
EXPORT void bbemu_syncthreads(const char *file, int line)
{
    fiber *f = cur_fiber;
    block_run *b = cur_block;
    if (!f) {
        fprintf(stderr, "cuda-emu: __syncthreads called outside a kernel (%s:%d)\n", file, line);
        abort();
    }
    complain_waiters(b, f, file, line);
    f->state = F_BARRIER, f->file = file, f->line = line;
    b->w[f->linear / 32].barrier |= 1u << (f->linear % 32);
    if (b->bar_arrived == 0) b->bar_file = file, b->bar_line = line;
    else if ((b->bar_line != line || b->bar_file != file) && !b->other_file) b->other_file = file, b->other_line = line;
    b->bar_arrived++;
    check_barrier(b, f);
    yield(f, false);
}

EXPORT uint64_t bbemu_warp(const char *file, int line, bbemu_warp_op op, unsigned mask, uint64_t bits, int arg,
                           int width)
{
    fiber *f = cur_fiber;
    block_run *b = cur_block;
    if (!f) {
        fprintf(stderr, "cuda-emu: %s called outside a kernel (%s:%d)\n", op_name(op), file, line);
        abort();
    }
    int warp = f->linear / 32, lane = f->linear % 32, lanes = lanes_of_warp(b, warp);
    unsigned present = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
// A warp operation's error, naming it and where it is.
#define WARP_ERROR(fmt, ...) BLOCK_ERROR(f, "%s: " fmt, at(op, file, line).c_str(), __VA_ARGS__)
    if (!(mask & (1u << lane)))
        WARP_ERROR("lane %d of warp %d calls it with mask 0x%08x, which leaves the lane out", lane, warp, mask);
    if (mask & ~present)
        WARP_ERROR("mask 0x%08x names lanes %s of warp %d, which are not there (the block has %d threads: warp %d "
                   "has %d lanes)", mask, lane_list(mask & ~present).c_str(), warp, b->n, warp, lanes);
    if (mask & b->w[warp].done)
        WARP_ERROR("mask 0x%08x names lanes %s of warp %d, which returned", mask,
                   lane_list(mask & b->w[warp].done).c_str(), warp);
    if (width <= 0 || width > 32 || (width & (width - 1)))
        WARP_ERROR("width %d is not a power of two up to 32", width);
    int seg = lane & ~(width - 1), src = lane;
    switch (op) {
    case BBEMU_SYNCWARP: break;
    case BBEMU_SHFL_XOR: src = lane ^ arg; if (src < 0 || src >= seg + width) src = lane; break;
    case BBEMU_SHFL_DOWN: src = lane + arg; if (src >= seg + width) src = lane; break;
    case BBEMU_SHFL_UP: src = lane - arg; if (src < seg) src = lane; break;
    case BBEMU_SHFL_IDX: src = seg + (arg & (width - 1)); break;
    }
    if (op != BBEMU_SYNCWARP && !(mask & (1u << src)))
        WARP_ERROR("lane %d of warp %d reads lane %d, which is not in its mask 0x%08x", lane, warp, src, mask);
    // A lane named in the mask that waits at __syncthreads never comes: a deadlock.
    if (unsigned stuck = mask & b->w[warp].barrier) {
        fiber *x = b->f[warp * 32 + __builtin_ctz(stuck)];
        WARP_ERROR("lane %d of warp %d waits for lane %d, which waits at __syncthreads (%s)", lane, warp,
                   __builtin_ctz(stuck), site(x->file, x->line).c_str());
    }
#undef WARP_ERROR
    f->state = F_WARP, f->file = file, f->line = line, f->op = op, f->mask = mask, f->src = src, f->value = bits;
    b->w[warp].waiting |= 1u << lane;
    b->w[warp].wanted |= mask;
    try_complete_warp(b, f, warp, mask);
    yield(f, false);
    return f->result;
}

namespace bbemu_rt {
namespace {

// Runs one block to its end; false (b->error set) when it failed.
bool run_block(fiber_pool *p, launch_rec &L, dim3 bid)
{
    block_run &b = p->b;
    int n = (int)(L.block.x * L.block.y * L.block.z);
    ensure_fibers(p, (size_t)n);
    b.L = &L, b.bid = bid, b.n = n, b.f = p->f.data();
    b.sched_bottom = p->thread_stack, b.sched_size = p->thread_stack_size;
    b.bar_arrived = b.done = 0;
    b.bar_file = b.other_file = nullptr;
    b.error.clear();
    memset(b.w, 0, sizeof b.w);
    b.runq.clear();
    uint8_t *shared = p->shared.data() + kSharedCanary;
    if (L.shared) memset(shared, kPoison, L.shared);
    for (int i = 0; i < n; i++) {
        fiber *f = p->f[i];
#ifdef BBEMU_ASAN
        if (f->dirty) __asan_unpoison_memory_region(stack_lo(f), f->top - (const uint8_t *)stack_lo(f));
        f->fake_stack = nullptr;
#endif
        f->dirty = false;
        bbemu_fiber_view *v = f->view;
        v->thread_idx = uint3{(unsigned)i % L.block.x, ((unsigned)i / L.block.x) % L.block.y,
                              (unsigned)i / (L.block.x * L.block.y)};
        v->block_idx = uint3{bid.x, bid.y, bid.z};
        v->block_dim = L.block, v->grid_dim = L.grid;
        v->dynamic_shared = L.shared ? shared : nullptr;
        f->linear = i, f->state = F_RUN, f->mask = 0, f->file = nullptr;
        f->sp = initial_frame(f, f->top);
        b.runq.push_back(i);
    }
    cur_block = &b;
    // The fibers pass the thread among themselves; it comes back here when
    // none is runnable (all returned, or a deadlock) or the block failed.
    if (fiber *f = pick(&b)) {
        cur_fiber = f;
        ASAN_START(&b.sched_fake, stack_lo(f), stack_size(f));
        bbemu_swap(&b.sched_sp, f->sp);
        ASAN_FINISH(b.sched_fake, nullptr, nullptr);
        cur_fiber = nullptr;
    }
    if (b.error.empty() && b.done < n) {
        int at_bar = 0, at_warp = 0;
        for (int i = 0; i < n; i++) at_bar += p->f[i]->state == F_BARRIER, at_warp += p->f[i]->state == F_WARP;
        b.error = format("deadlock: %d threads wait at __syncthreads, %d at warp operations, %d returned", at_bar,
                         at_warp, b.done);
    }
    if (!b.error.empty())
        for (int i = 0; i < n; i++)
            if (p->f[i]->state != F_DONE) p->f[i]->dirty = true;
    cur_block = nullptr;
    if (b.error.empty() && L.shared) {
        const uint8_t *lead = p->shared.data(), *tail = shared + L.shared;
        size_t before = 0, after = 0;
        for (size_t i = 0; i < kSharedCanary && !before; i++)
            if (lead[i] != kCanary) before = kSharedCanary - i;
        for (size_t i = kSharedCanary; i > 0 && !after; i--)
            if (tail[i - 1] != kCanary) after = i;
        if (after)
            b.error = format("wrote past the end of its %zu bytes of dynamic shared memory (up to %zu bytes past it)",
                             L.shared, after);
        else if (before)
            b.error = format("wrote before the start of its %zu bytes of dynamic shared memory (up to %zu bytes "
                             "before it)", L.shared, before);
    }
    return b.error.empty();
}

// The kernel and its launch configuration, for messages.

} // namespace

std::string launch_head(const launch_rec &L)
{
    return format("%s<<<(%u,%u,%u), (%u,%u,%u), %zu>>>", L.name.c_str(), L.grid.x, L.grid.y, L.grid.z, L.block.x,
                  L.block.y, L.block.z, L.shared);
}

// Runs a launch on the stream's thread. Nothing here holds memory across
// the blocks: a fault jumps out of it (to execute()).
void run_kernel_item(launch_rec &L)
{
    runtime &r = *rt;
    stream_state *s = running_stream;
    device_state *d = s->dev;
    for (size_t i = 0; i < L.pointers.size(); i++) {
        const void *ptr = L.pointers[i];
        if (!ptr) continue;
        int dev = -1;
        mem_class c = classify(ptr, 0, &dev);
        if (c == PINNED || (c == ON_DEVICE && dev == d->index)) continue;
        set_sticky(d, cudaErrorIllegalAddress,
                   format("%s: argument %d (%p) is %s, not memory of cuda:%d", launch_head(L).c_str(),
                          L.pointer_index[i] + 1,
                          ptr, describe(ptr).c_str(), d->index));
        return;
    }
    if (L.inject_fault) {
        set_sticky(d, cudaErrorIllegalAddress, format("%s: %s", launch_head(L).c_str(), L.fault_text.c_str()));
        return;
    }
    if (L.hang) {
        fprintf(stderr, "cuda-emu: %s: hangs (BB_CUDA_EMU_HANG): cuda:%d's stream stops here\n", launch_head(L).c_str(),
                d->index);
        for (;;) pause();
    }
    if (!pool_of_thread) {
        pool_of_thread = new fiber_pool();
        pthread_attr_t attr;
        if (pthread_getattr_np(pthread_self(), &attr) == 0) {
            pthread_attr_getstack(&attr, &pool_of_thread->thread_stack, &pool_of_thread->thread_stack_size);
            pthread_attr_destroy(&attr);
        }
    }
    fiber_pool *p = pool_of_thread;
    p->shared.assign(L.shared + 2 * kSharedCanary, kCanary);
    p->b.order.s = mix(r.cfg.seed ^ (L.number * 0x2545f4914f6cdd1dull));
    uint64_t gx = L.grid.x, gy = L.grid.y, total = gx * gy * L.grid.z;
    // Blocks in a seeded order: start anywhere, step by a stride prime to the count.
    uint64_t start = p->b.order.next() % total, stride = 1;
    if (total > 2)
        for (int tries = 0; tries < 16; tries++) {
            uint64_t c = 1 + p->b.order.next() % (total - 1), a = c, m = total;
            while (m) a %= m, std::swap(a, m);
            if (a == 1) {
                stride = c;
                break;
            }
        }
    for (uint64_t k = 0; k < total; k++) {
        uint64_t i = (start + k * stride) % total;
        dim3 bid((unsigned)(i % gx), (unsigned)(i / gx % gy), (unsigned)(i / (gx * gy)));
        if (!run_block(p, L, bid)) {
            set_sticky(d, cudaErrorLaunchFailure,
                       format("%s, block (%u,%u,%u): %s", launch_head(L).c_str(), bid.x, bid.y, bid.z,
                              p->b.error.c_str()));
            return;
        }
    }
}

void note_fiber_fault(void *addr, int *thread, uint3 *block, bool *overflow)
{
    *overflow = in_stack_guard(addr);
    *thread = -1;
    if (!cur_fiber) return;
    *thread = cur_fiber->linear;
    *block = cur_fiber->view->block_idx;
#ifdef BBEMU_ASAN
    // Back on the stream thread's own stack, as far as ASan knows.
    __sanitizer_start_switch_fiber(nullptr, cur_block->sched_bottom, cur_block->sched_size);
#endif
}

// After a fault ended an operation: a kernel's fibers are abandoned (their
// stacks are cleaned before reuse), and ASan forgets the frames that the
// jump skipped on this thread's stack.
void clean_after_fault()
{
    fiber_pool *p = pool_of_thread;
    if (cur_fiber) {
#ifdef BBEMU_ASAN
        __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
        cur_fiber = nullptr;
    }
    cur_block = nullptr;
    if (p)
        for (fiber *f : p->f) f->dirty = true;
#ifdef BBEMU_ASAN
    pthread_attr_t attr;
    void *lo;
    size_t size;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
        if (pthread_attr_getstack(&attr, &lo, &size) == 0) {
            uintptr_t here = (uintptr_t)__builtin_frame_address(0);
            if (here > (uintptr_t)lo && here < (uintptr_t)lo + size)
                __asan_unpoison_memory_region(lo, here - (uintptr_t)lo);
        }
        pthread_attr_destroy(&attr);
    }
#endif
}

void free_fiber_pool()
{
    fiber_pool *p = pool_of_thread;
    if (!p) return;
    if (p->region) munmap(p->region, p->count * BBEMU_STACK_BYTES);
    delete p;
    pool_of_thread = nullptr;
}

} // namespace bbemu_rt

EXPORT cudaError_t bbemu_func_set_attribute(const void *func, enum cudaFuncAttribute attr, int value)
{
    runtime &r = R();
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize)
        return fail_with(cudaErrorInvalidValue, true, "cudaFuncSetAttribute: attribute %d is not emulated", (int)attr);
    if (value < 0 || (size_t)value > kSharedMax)
        return fail_with(cudaErrorInvalidValue, true,
                         "cudaFuncSetAttribute(MaxDynamicSharedMemorySize, %d): above the %zu bytes a block can have",
                         value, kSharedMax);
    std::lock_guard<std::mutex> l(r.attr_m);
    r.max_dynamic_shared[func] = value;
    return cudaSuccess;
}

EXPORT cudaError_t bbemu_launch(const bbemu_launch_desc *d)
{
    runtime &r = R();
    auto rec = std::make_shared<launch_rec>();
    rec->name = d->name, rec->grid = d->grid, rec->block = d->block, rec->shared = d->shared_bytes;
    rec->invoke = d->invoke, rec->drop = d->drop, rec->ctx = d->ctx; // dropped with rec, whatever happens
    stream_state *s;
    cudaError_t e = check_stream(d->stream, &s);
    if (e != cudaSuccess) return e;
    if (s->dev->index != current_device)
        return fail_with(cudaErrorInvalidResourceHandle, true, "%s: launched on a stream of cuda:%d while cuda:%d is "
                         "current", d->name, s->dev->index, current_device);
    dim3 g = d->grid, b = d->block;
    uint64_t threads = (uint64_t)b.x * b.y * b.z;
    if (!g.x || !g.y || !g.z || g.x > 0x7fffffffu || g.y > 65535 || g.z > 65535)
        return fail_with(cudaErrorInvalidConfiguration, true, "%s: grid (%u,%u,%u) is outside CUDA's limits "
                         "(1..2^31-1, 1..65535, 1..65535)", d->name, g.x, g.y, g.z);
    if (!b.x || !b.y || !b.z || b.x > 1024 || b.y > 1024 || b.z > 64 || threads > 1024)
        return fail_with(cudaErrorInvalidConfiguration, true, "%s: block (%u,%u,%u) is outside CUDA's limits (at "
                         "most 1024 threads; x, y up to 1024, z up to 64)", d->name, b.x, b.y, b.z);
    if (d->shared_bytes > kSharedDefault) {
        int allowed = 0;
        {
            std::lock_guard<std::mutex> l(r.attr_m);
            auto it = r.max_dynamic_shared.find(d->func);
            if (it != r.max_dynamic_shared.end()) allowed = it->second;
        }
        if (d->shared_bytes > (size_t)allowed)
            return fail_with(cudaErrorInvalidValue, true, "%s: %zu bytes of dynamic shared memory, above 48 KiB, "
                             "without cudaFuncSetAttribute(MaxDynamicSharedMemorySize) for that many (set: %d)",
                             d->name, d->shared_bytes, allowed);
    }
    rec->pointers.assign(d->pointers, d->pointers + d->pointer_count);
    rec->pointer_index.assign(d->pointer_index, d->pointer_index + d->pointer_count);
    rec->number = r.c.launches++;
    {
        std::lock_guard<std::mutex> l(r.c.by_kernel_m);
        r.c.by_kernel[d->name]++;
    }
    const config &c = r.cfg;
    if (c.fault.fires(d->name, s->dev->index, s->dev->fault_launches)) {
        rec->inject_fault = true;
        rec->fault_text = format("an injected fault (%s)", c.fault.text().c_str());
    }
    rec->hang = c.hang.fires(d->name, s->dev->index, s->dev->hang_launches);
    if (capturing(s)) r.c.captured_launches++;
    item it;
    it.work = [rec] { run_kernel_item(*rec); }, it.what = d->name, it.kernel = true;
    enqueue(s, std::move(it));
    if (c.launch_blocking) {
        wait_idle(s);
        return fail(sticky_of(s->dev));
    }
    return cudaSuccess;
}
