/* test_backend.c — device discovery. GPU checks report *skipped* without a GPU. */
#include "bigbatch/backend.h"
#include "test_util.h"

TestSuite(backend);

Test(backend, probe_explains_a_missing_device)
{
    bb_cuda_info info;
    bb_cuda_probe(&info);
    cr_assert_geq(info.device_count, 0);
    if (info.compiled) cr_assert_gt(info.runtime_version, 0, "a CUDA build knows its runtime version");
    else cr_assert_eq(info.runtime_version, 0);
    if (info.device_count == 0) cr_assert_gt(strlen(info.reason), 0, "no device needs a reason");
}

Test(backend, gpu_device_properties)
{
    bb_cuda_info info;
    bb_cuda_probe(&info);
    if (info.device_count == 0) cr_skip_test("skipped: no GPU (%s)", info.reason);
    cr_assert_gt(strlen(info.device_name), 0);
    cr_assert_gt(info.device_memory, (size_t)1 << 30);
    cr_assert_geq(info.compute_major, 8, "bigbatch builds for sm_80 and sm_90");
    cr_assert_gt(info.driver_version, 0);
}

/* ---- errors of asynchronous ops, scratch, host copies (CPU-carried) ---- */
#include <stdlib.h>

/* BB_FAULT makes the N-th call of an op fail as a GPU fault does: the op
 * returns, and the next synchronizing call reports it, naming the op. */
Test(backend, a_faulted_op_fails_the_next_synchronizing_call)
{
    setenv("BB_FAULT", "relu_forward:2", 1);
    bb_backend_options o = {0};
    bb_backend_t *b;
    cr_assert_eq(bb_backend_create_cpu(&o, &b), BB_OK);
    unsetenv("BB_FAULT");
    float *x, host[4] = {1, 2, 3, 4};
    cr_assert_eq(bb_backend_alloc(b, sizeof host, "x", (void **)&x), BB_OK);
    cr_assert_eq(bb_backend_copy(b, x, host, sizeof host, BB_COPY_H2D), BB_OK);
    bb_op_activation_forward(b, BB_ACTIVATION_RELU, bb_f32(x), bb_f32(x), 4);
    cr_assert_eq(bb_backend_synchronize(b), BB_OK, "the first call is fine");
    bb_op_activation_forward(b, BB_ACTIVATION_RELU, bb_f32(x), bb_f32(x), 4);
    cr_assert_eq(bb_backend_synchronize(b), BB_ERR_DEVICE);
    cr_assert(strstr(bb_error_message(), "cpu: relu_forward failed: injected fault"), "%s", bb_error_message());
    /* sticky: every later copy and event call says so too */
    cr_assert_eq(bb_backend_copy(b, host, x, sizeof host, BB_COPY_D2H), BB_ERR_DEVICE);
    cr_assert_eq(bb_backend_memset(b, x, 0, sizeof host), BB_ERR_DEVICE);
    cr_assert_eq(bb_backend_event_record(b, NULL, BB_STREAM_COMPUTE), BB_ERR_DEVICE);
    cr_assert_eq(bb_backend_synchronize(b), BB_ERR_DEVICE);
    bb_backend_destroy(b);
}

/* Ops with scratch (column sums, per-row losses, the embedding's sort) use
 * what was reserved; beyond it they grow, and that is counted. */
#define T(p) bb_f32(p)
Test(backend, scratch_beyond_the_reservation_is_counted)
{
    bb_backend_options o = {0};
    bb_backend_t *b;
    cr_assert_eq(bb_backend_create_cpu(&o, &b), BB_OK);
    cr_assert_eq(bb_backend_reserve_scratch(b, 4, 3), BB_OK);
    float *dout, *in, *w, *dw, *db, *din;
    cr_assert_eq(bb_backend_alloc(b, 64 * sizeof(float), "t", (void **)&dout), BB_OK);
    cr_assert_eq(bb_backend_alloc(b, 64 * sizeof(float), "t", (void **)&in), BB_OK);
    cr_assert_eq(bb_backend_alloc(b, 64 * sizeof(float), "t", (void **)&w), BB_OK);
    cr_assert_eq(bb_backend_alloc(b, 64 * sizeof(float), "t", (void **)&dw), BB_OK);
    cr_assert_eq(bb_backend_alloc(b, 64 * sizeof(float), "t", (void **)&db), BB_OK);
    cr_assert_eq(bb_backend_alloc(b, 64 * sizeof(float), "t", (void **)&din), BB_OK);
    memset(dout, 0, 64 * sizeof(float)), memset(in, 0, 64 * sizeof(float)), memset(w, 0, 64 * sizeof(float));
    bb_op_linear_backward(b, T(din), T(dw), T(db), T(dout), T(in), T(w), 2, 2, 3, 3, false); /* width 3: reserved */
    cr_assert_eq(bb_backend_scratch_grew(b), 0);
    bb_op_linear_backward(b, T(din), T(dw), T(db), T(dout), T(in), T(w), 2, 2, 5, 5, false); /* width 5: grows */
    cr_assert_eq(bb_backend_scratch_grew(b), 1);
    bb_op_linear_backward(b, T(din), T(dw), T(db), T(dout), T(in), T(w), 2, 2, 5, 5, false); /* grown: no more */
    cr_assert_eq(bb_backend_scratch_grew(b), 1);
    bb_backend_destroy(b);
}
