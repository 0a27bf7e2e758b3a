/* test_cuda.c — the CUDA backend beyond its ops (which tests/test_ops.c
 * holds to the CPU's, op by op): device faults and out-of-memory, decoding
 * with the cache, a one-GPU NCCL reducer, and short training runs on one
 * GPU against the CPU (more GPUs: test_cuda_train.c). In the emulated build (make cuda-emu, part of make
 * test) every test runs on emulated GPUs; in a CUDA build they run on the
 * machine's GPU, and say *skipped* without one. */
#include <math.h>

#include "bigbatch/train.h"
#include "test_util.h"

static bb_backend_t *cpu, *gpu;

static void need_gpu(void)
{
    bb_cuda_info info;
    bb_cuda_probe(&info);
    if (info.device_count == 0) cr_skip_test("skipped: no GPU (%s)", info.reason);
    bb_backend_options o = {0};
    cr_assert_eq(bb_backend_create_cpu(&o, &cpu), BB_OK, "%s", bb_error_message());
    cr_assert_eq(bb_backend_create_cuda(&o, &gpu), BB_OK, "%s", bb_error_message());
}

static void down(void)
{
    bb_backend_destroy(gpu);
    bb_backend_destroy(cpu);
    gpu = cpu = NULL;
}

TestSuite(cuda, .fini = down);

Test(cuda, without_a_gpu_the_backend_says_why)
{
#ifdef BB_CUDA_EMU
    setenv("BB_CUDA_EMU_DEVICES", "0", 1); /* a machine without GPUs, before the first CUDA call */
#endif
    bb_cuda_info info;
    bb_cuda_probe(&info);
    if (info.device_count > 0) cr_skip_test("skipped: this machine has a GPU");
    bb_backend_options o = {0};
    bb_backend_t *b = (bb_backend_t *)1;
    cr_assert_eq(bb_backend_create_cuda(&o, &b), BB_ERR_UNSUPPORTED);
    cr_assert_null(b);
    cr_assert(strlen(bb_error_message()) > 10, "the error should say why: '%s'", bb_error_message());
}

static float *random_host(size_t n, uint64_t seed, float scale)
{
    float *x = malloc(n * sizeof *x);
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) x[i] = (float)(((bb_splitmix64(&s) >> 11) / 9007199254740992.0) * 2 - 1) * scale;
    return x;
}

/* A kernel that faults is reported by the next synchronizing call (and,
 * under CUDA_LAUNCH_BLOCKING=1, as gpu_check.sh runs this, named). */
Test(cuda, a_faulting_kernel_fails_the_next_synchronizing_call)
{
    need_gpu();
    float *x;
    cr_assert_eq(bb_backend_alloc(gpu, 64, "x", (void **)&x), BB_OK);
    /* far past the allocation: an illegal address */
    bb_op_activation_forward(gpu, BB_ACTIVATION_RELU, bb_f32(x), bb_f32(x), (size_t)1 << 32);
    cr_assert_eq(bb_backend_synchronize(gpu), BB_ERR_DEVICE, "the fault was not reported");
    const char *blocking = getenv("CUDA_LAUNCH_BLOCKING");
    if (blocking && !strcmp(blocking, "1"))
        cr_assert(strstr(bb_error_message(), "relu_forward"), "the error should name the op: %s", bb_error_message());
    cr_assert_eq(bb_backend_synchronize(gpu), BB_ERR_DEVICE, "a failed device stays failed");
}

/* A gpt decoding token by token with its key/value cache on the GPU gives
 * the CPU's logits at every position. */
Test(cuda, decoding_with_the_cache_matches_cpu)
{
    need_gpu();
    bb_model_config c = bb_model_gpt_config(2, 2, 32, 24, 50);
    bb_model_t *mc, *mg;
    cr_assert_eq(bb_model_create(cpu, &c, 1, &mc), BB_OK, "%s", bb_error_message());
    cr_assert_eq(bb_model_create(gpu, &c, 1, &mg), BB_OK, "%s", bb_error_message());
    cr_assert_eq(bb_model_init(mc, 5), BB_OK);
    cr_assert_eq(bb_model_init(mg, 5), BB_OK);
    float lc[50], lg[50];
    for (int pos = 0; pos < c.gpt.seq_len; pos++) {
        int32_t token = (pos * 7 + 3) % c.gpt.vocab;
        cr_assert_eq(bb_model_decode(mc, token, pos, lc), BB_OK, "%s", bb_error_message());
        cr_assert_eq(bb_model_decode(mg, token, pos, lg), BB_OK, "%s", bb_error_message());
        double diff = 0, norm = 0;
        for (int v = 0; v < c.gpt.vocab; v++) diff = fmax(diff, fabs(lc[v] - lg[v])), norm = fmax(norm, fabs(lc[v]));
        cr_assert(diff <= 1e-5 * fmax(norm, 1e-3), "position %d: the GPU's logits differ by %.3e", pos, diff);
    }
    bb_model_destroy(mg), bb_model_destroy(mc);
}

Test(cuda, out_of_memory_says_how_much_is_free)
{
    need_gpu();
    void *p;
    cr_assert_eq(bb_backend_alloc(gpu, (size_t)1 << 50, "activations", &p), BB_ERR_OOM);
    const char *msg = bb_error_message();
    cr_assert(strstr(msg, "cuda:0") && strstr(msg, "free on the device") && strstr(msg, "--micro-batch") &&
                  strstr(msg, "--checkpoint"),
              "%s", msg);
    cr_assert_eq(bb_backend_synchronize(gpu), BB_OK, "an out-of-memory must not poison later calls: %s",
                 bb_error_message());
}

/* ---- a training run ----------------------------------------------------- */
static char *token_dataset(const char *root)
{
    enum { T = 32, RECORDS = 400, VOCAB = 64 };
    uint32_t rs = 2 * (T + 1);
    uint8_t *r = malloc((size_t)RECORDS * rs);
    for (size_t i = 0; i < RECORDS; i++)
        for (int t = 0; t <= T; t++) {
            uint16_t v = (uint16_t)((i * 5 + (size_t)t * 7 + (t % 3 == 0 ? i % 13 : 0)) % VOCAB);
            r[i * rs + 2 * t] = (uint8_t)v, r[i * rs + 2 * t + 1] = (uint8_t)(v >> 8);
        }
    bb_shard_meta m = {.kind = BB_RECORD_TOKENS_U16, .rank = 1, .shape = {T + 1}, .record_size = rs,
                       .classes_or_vocab = VOCAB};
    char *dir = tu_path(root, "tokens");
    tu_write_dataset(dir, &m, r, RECORDS);
    free(r);
    return dir;
}

/* Ten steps of a small gpt on `data`, on the CPU (switch o.device to run it on GPU 0). */
static bb_train_options ten_steps(const char *data)
{
    bb_train_options o;
    bb_train_defaults(&o);
    o.model = bb_model_gpt_config(2, 4, 64, 0, 0);
    o.data = data;
    o.devices = 1, o.global_batch = 32, o.micro_batch = 8; /* accumulation 4 */
    o.steps = 10, o.epochs = 0;
    o.opt.lr = 3e-3;
    o.progress = NULL;
    return o;
}

Test(cuda, ten_training_steps_match_the_cpu)
{
    need_gpu();
    char *root = tu_temp_dir(), *data = token_dataset(root);
    bb_train_options o = ten_steps(data);
    bb_train_result c, g;
    cr_assert_eq(bb_train_run(&o, &c), BB_OK, "cpu: %s", bb_error_message());
    o.device = BB_DEVICE_CUDA;
    o.device_ids[0] = 0;
    cr_assert_eq(bb_train_run(&o, &g), BB_OK, "cuda: %s", bb_error_message());
    for (int s = 0; s < 10; s++) {
        double rel = fabs(c.losses[s] - g.losses[s]) / fabs(c.losses[s]);
        cr_log_info("step %d: cpu %.7f cuda %.7f (rel %.1e)", s + 1, c.losses[s], g.losses[s], rel);
        cr_assert(rel <= 1e-4, "step %d: cpu loss %.9g, cuda %.9g", s + 1, c.losses[s], g.losses[s]);
    }
    /* --zero 1 on one GPU (its shard: everything): the same training */
    o.zero = 1;
    bb_train_result z;
    cr_assert_eq(bb_train_run(&o, &z), BB_OK, "cuda --zero 1: %s", bb_error_message());
    for (int s = 0; s < 10; s++)
        cr_assert(fabs(c.losses[s] - z.losses[s]) <= 1e-4 * fabs(c.losses[s]), "--zero 1 step %d: cpu %.9g, cuda %.9g",
                  s + 1, c.losses[s], z.losses[s]);
    bb_train_result_free(&z);
    o.zero = 0;
    /* --precision bf16: bf16 activations on both, bf16 products on the GPU */
    o.precision = BB_PRECISION_BF16;
    bb_train_result g16, c16;
    cr_assert_eq(bb_train_run(&o, &g16), BB_OK, "cuda bf16: %s", bb_error_message());
    o.device = BB_DEVICE_CPU;
    cr_assert_eq(bb_train_run(&o, &c16), BB_OK, "cpu bf16: %s", bb_error_message());
    for (int s = 0; s < 10; s++) {
        double rel = fabs(c16.losses[s] - g16.losses[s]) / fabs(c16.losses[s]);
        cr_log_info("bf16 step %d: cpu %.7f cuda %.7f (rel %.1e)", s + 1, c16.losses[s], g16.losses[s], rel);
        cr_assert(rel <= 2e-2, "bf16 step %d: cpu loss %.9g, cuda %.9g", s + 1, c16.losses[s], g16.losses[s]);
    }
    cr_assert_lt(g16.peak_bytes[0], g.peak_bytes[0], "bf16 activations should need less GPU memory");
    bb_train_result_free(&c), bb_train_result_free(&g), bb_train_result_free(&c16), bb_train_result_free(&g16);
    tu_rm_tree(root);
    free(data), free(root);
}

/* ---- NCCL ------------------------------------------------------------------ */
#include "train/reducer.h"

/* NCCL is loaded when a multi-GPU reducer needs it, not when the binary
 * starts; a missing library is one clear error naming it. */
Test(cuda, nccl_loads_on_demand_and_a_missing_library_is_named)
{
    bb_cuda_info info;
    bb_cuda_probe(&info);
    setenv("BB_NCCL_LIBRARY", "/nonexistent/libnccl.so.2", 1);
    int version = -1;
    cr_assert_eq(bb_reducer_load_nccl(&version), BB_ERR_UNSUPPORTED);
    unsetenv("BB_NCCL_LIBRARY");
    if (!info.compiled) {
        cr_assert(strstr(bb_error_message(), "CUDA build"), "%s", bb_error_message());
        return;
    }
    cr_assert(strstr(bb_error_message(), "/nonexistent/libnccl.so.2"), "%s", bb_error_message());
    cr_assert(strstr(bb_error_message(), "BB_NCCL_LIBRARY"), "the error should say how to point at NCCL: %s",
              bb_error_message());
}

Test(cuda, nccl_from_the_toolkit_loads_without_a_gpu)
{
    bb_cuda_info info;
    bb_cuda_probe(&info);
    if (!info.compiled) cr_skip_test("skipped: not a CUDA build");
    if (access("/usr/local/cuda/lib64/libnccl.so.2", R_OK) != 0 && !getenv("BB_NCCL_LIBRARY"))
        cr_skip_test("skipped: no libnccl.so.2 in the toolkit here");
    int version = 0;
    cr_assert_eq(bb_reducer_load_nccl(&version), BB_OK, "%s", bb_error_message());
    cr_assert_geq(version, 21400, "NCCL %d", version);
    cr_log_info("NCCL %d loaded with dlopen", version);
}

/* One GPU, one rank: NCCL is loaded, its communicator made (non-blocking),
 * and a step's buckets reduced (the average of one is itself); then an
 * abort ends the communicator without waiting. */
Test(cuda, a_one_gpu_nccl_reducer_reduces_and_aborts)
{
    need_gpu();
    bb_model_config c = bb_model_gpt_config(2, 2, 32, 8, 50);
    bb_model_t *m;
    cr_assert_eq(bb_model_create(gpu, &c, 2, &m), BB_OK, "%s", bb_error_message());
    cr_assert_eq(bb_model_init(m, 1), BB_OK);
    size_t n = bb_model_param_count(m);
    float *host = random_host(n, 91, 1), *back = malloc(n * sizeof *back);
    float *grads[1] = {bb_model_grads(m)}, *params[1] = {bb_model_params(m)};
    for (int rule = BB_PARAM_SHARD_ELEMENTS; rule <= BB_PARAM_SHARD_TENSORS; rule++) { /* reduce-scatter, or all-reduce */
        cr_assert_eq(bb_backend_copy(gpu, grads[0], host, n * sizeof *host, BB_COPY_H2D), BB_OK);
        bb_param_shards shards;
        cr_assert_eq(bb_param_shards_make(m, 4096, 1, (bb_param_shard_rule)rule, &shards), BB_OK);
        reducer_t *r;
        bb_device_spec spec = {.kind = BB_DEVICE_CUDA, .count = 1, .world = 1};
        reducer_args ra = {.spec = &spec, .model = m, .be = &gpu, .grads = grads, .params = params,
                           .bucket_bytes = 4096, .shards = &shards};
        cr_assert_eq(bb_reducer_create_nccl(&ra, &r), BB_OK, "%s", bb_error_message());
        cr_assert_gt(bb_reducer_bucket_count(r), 1);
        for (int step = 0; step < 3; step++) {
            bb_reducer_post(r, 0, n / 2);
            bb_reducer_post(r, 0, 0);
            bb_reducer_wait(r, 0);
            cr_assert(!bb_reducer_aborted(r), "%s", r->failure_message);
        }
        cr_assert_eq(bb_backend_copy(gpu, back, grads[0], n * sizeof *back, BB_COPY_D2H), BB_OK, "%s",
                     bb_error_message());
        cr_assert_eq(memcmp(host, back, n * sizeof *back), 0, "the average over one GPU changed the gradients");
        cr_assert_eq(bb_reducer_allreduce_scalar(r, 0, 2.5), 2.5, "the mean over one GPU of 2.5");
        cr_assert(bb_reducer_broadcast_stop(r, 0, true) && !bb_reducer_broadcast_stop(r, 0, false));
        /* ZeRO-1's gather over one GPU: its own slices, the weights unchanged */
        float *before = malloc(n * sizeof *before);
        cr_assert_eq(bb_backend_copy(gpu, before, params[0], n * sizeof *before, BB_COPY_D2H), BB_OK);
        cr_assert(bb_reducer_allgather(r, 0), "%s", r->failure_message);
        cr_assert_eq(bb_backend_copy(gpu, back, params[0], n * sizeof *back, BB_COPY_D2H), BB_OK, "%s",
                     bb_error_message());
        cr_assert_eq(memcmp(before, back, n * sizeof *back), 0, "the gather over one GPU changed the weights");
        free(before);
        bb_reducer_abort(r);
        cr_assert(bb_reducer_aborted(r));
        bb_reducer_post(r, 0, 0); /* after an abort: returns at once */
        bb_reducer_wait(r, 0);
        bb_reducer_destroy(r);
        bb_param_shards_free(&shards);
    }
    bb_model_destroy(m);
    free(host), free(back);
}

/* Resume is bitwise on the GPU too (deterministic ops: item 5 of issue 13). */
Test(cuda, resume_on_the_gpu_is_bitwise)
{
    need_gpu();
    char *root = tu_temp_dir(), *data = token_dataset(root), *ckpt = tu_path(root, "ckpt");
    bb_train_options o;
    bb_train_defaults(&o);
    o.model = bb_model_gpt_config(2, 4, 64, 0, 0);
    o.data = data;
    o.devices = 1, o.global_batch = 32, o.micro_batch = 8;
    o.steps = 6, o.epochs = 0;
    o.progress = NULL;
    o.device = BB_DEVICE_CUDA;
    o.device_ids[0] = 0;
    bb_train_result whole, first, second;
    cr_assert_eq(bb_train_run(&o, &whole), BB_OK, "%s", bb_error_message());
    o.save_dir = ckpt, o.stop_after = 3;
    cr_assert_eq(bb_train_run(&o, &first), BB_OK, "%s", bb_error_message());
    o.save_dir = NULL, o.stop_after = 0, o.resume_dir = ckpt, o.set = BB_TRAIN_SET(BB_TRAIN_SAVE);
    cr_assert_eq(bb_train_run(&o, &second), BB_OK, "%s", bb_error_message());
    cr_assert_eq(memcmp(whole.losses + 3, second.losses, 3 * sizeof *whole.losses), 0, "losses after the resume differ");
    cr_assert_eq(memcmp(whole.params, second.params, whole.param_count * sizeof *whole.params), 0,
                 "weights after the resume differ");
    bb_train_result_free(&whole), bb_train_result_free(&first), bb_train_result_free(&second);
    tu_rm_tree(root);
    free(data), free(ckpt), free(root);
}

/* The binary starts without NCCL: it is not among the libraries it needs. */
Test(cuda, the_binary_does_not_link_nccl)
{
    if (system("command -v readelf > /dev/null 2>&1") != 0) cr_skip_test("skipped: no readelf on this machine");
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "readelf -d '%s' 2>&1", tu_bigbatch_bin());
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    char line[512];
    int needed = 0;
    while (fgets(line, sizeof line, p)) {
        if (strstr(line, "(NEEDED)")) needed++;
        cr_assert_null(strstr(line, "libnccl"), "bin/bigbatch links NCCL: %s", line);
    }
    cr_assert_eq(pclose(p), 0, "readelf failed");
    cr_assert_gt(needed, 0, "readelf listed no libraries: is %s an ELF binary?", tu_bigbatch_bin());
}
