// The guard of the `gpu` tests (tests/common/gpu.h), on a machine without a device: it
// names the reason, and under TRIPOD_REQUIRE_GPU=1 it fails the test instead of skipping.
#include <gtest/gtest.h>
#include <gtest/gtest-spi.h>

#include <cstdlib>
#include <string>

#include "common/gpu.h"

namespace {

void guarded_body() {
    TPD_SKIP_WITHOUT_GPU();
}

TEST(GpuSkip, ReasonIsGivenWithoutDevice) {
    if (tpd_kern_cuda_available()) GTEST_SKIP() << "a device is present";
    EXPECT_STRNE(tpd_kern_cuda_unavailable_reason(), "");
}

TEST(GpuSkip, RequireGpuTurnsTheSkipIntoAFailure) {
    if (tpd_kern_cuda_available()) GTEST_SKIP() << "a device is present";
    const char *old = std::getenv("TRIPOD_REQUIRE_GPU");
    std::string saved = old ? old : "";
    setenv("TRIPOD_REQUIRE_GPU", "1", 1);
    EXPECT_FATAL_FAILURE(guarded_body(), "TRIPOD_REQUIRE_GPU=1");
    EXPECT_FATAL_FAILURE(guarded_body(), "no usable CUDA device");
    if (old)
        setenv("TRIPOD_REQUIRE_GPU", saved.c_str(), 1);
    else
        unsetenv("TRIPOD_REQUIRE_GPU");
}

TEST(GpuSkip, OnlyTheValueOneRequiresAGpu) {
    setenv("TRIPOD_REQUIRE_GPU", "0", 1);
    EXPECT_FALSE(tiny::gpu_required());
    setenv("TRIPOD_REQUIRE_GPU", "1", 1);
    EXPECT_TRUE(tiny::gpu_required());
    unsetenv("TRIPOD_REQUIRE_GPU");
    EXPECT_FALSE(tiny::gpu_required());
}

} // namespace
