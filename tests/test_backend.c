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
