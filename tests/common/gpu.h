// The skip of the `gpu` tests. Without a usable CUDA device a gpu test skips, and says why
// (the loader's message when libtripod_cuda.so did not open); with TRIPOD_REQUIRE_GPU=1
// (tools/gpu_check.sh sets it) the same condition fails the test instead, so that a run
// meant to exercise the GPU cannot pass by skipping everything.
#ifndef TPD_TESTS_COMMON_GPU_H
#define TPD_TESTS_COMMON_GPU_H

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

extern "C" {
#include "kernels/kernels.h"
}

namespace tiny {

inline bool gpu_required() {
    const char *e = std::getenv("TRIPOD_REQUIRE_GPU");
    return e != nullptr && std::strcmp(e, "1") == 0;
}

} // namespace tiny

// Skips the test (or fails it under TRIPOD_REQUIRE_GPU=1) with the message WHY (a stream
// expression).
#define TPD_GPU_SKIP(WHY)                                                                          \
    do {                                                                                           \
        if (tiny::gpu_required()) FAIL() << WHY << " (TRIPOD_REQUIRE_GPU=1: a skip is a failure)"; \
        GTEST_SKIP() << WHY;                                                                       \
    } while (0)

// The usual guard of a gpu test: no usable CUDA device, no test.
#define TPD_SKIP_WITHOUT_GPU()                                                                     \
    do {                                                                                           \
        if (!tpd_kern_cuda_available())                                                            \
            TPD_GPU_SKIP("no usable CUDA device: " << tpd_kern_cuda_unavailable_reason());         \
    } while (0)

#endif
