// The cuda backend's cuBLASLt epilogue rule (kernels/cuda/gemm_epilogue.h) on the cpu: which
// bias and aux views skip the epilogue up front, and that a refusal (a mocked
// CUBLAS_STATUS_NOT_SUPPORTED, or no heuristic result) sends a fused op to its plain-GEMM
// fallback without an error, while any other status stays an error.
#include <gtest/gtest.h>

#include <cstdint>

extern "C" {
#include "kernels/cuda/gemm_epilogue.h"
}

namespace {

const void *at(uintptr_t address) {
    return reinterpret_cast<const void *>(address);
}

// What matmul_fwd with a bias does, built from the rule as cuda_gemm.cu applies it: the
// epilogue when it is askable and cuBLASLt answers (heuristic status, results found), else
// the plain GEMM and the bias kernel; an error ends the op.
enum class Path { Epilogue, Fallback, Error };
Path matmul_bias_path(const void *bias, int heuristic_status, int found) {
    if (!tpd_gemm_epilogue_askable(bias, nullptr)) return Path::Fallback;
    switch (tpd_gemm_lt_outcome(heuristic_status, found, /*quiet=*/1)) {
    case TPD_GEMM_OUTCOME_OK:
        return Path::Epilogue;
    case TPD_GEMM_OUTCOME_UNSUPPORTED:
        return Path::Fallback;
    default:
        return Path::Error;
    }
}

TEST(GemmEpilogue, AlignedViewsAreAsked) {
    EXPECT_EQ(tpd_gemm_epilogue_askable(at(0x7f0000001000), at(0x7f0000002000)), 1);
    EXPECT_EQ(tpd_gemm_epilogue_askable(at(0x7f0000001010), nullptr), 1);
    EXPECT_EQ(tpd_gemm_epilogue_askable(nullptr, at(0x7f0000001030)), 1);
    EXPECT_EQ(tpd_gemm_epilogue_askable(nullptr, nullptr), 1);
}

TEST(GemmEpilogue, ViewsOffSixteenBytesSkipTheEpilogue) {
    // a bf16 bias one element into an aligned buffer, as MatmulMisalignedParameterViews makes
    EXPECT_EQ(tpd_gemm_epilogue_askable(at(0x7f0000001002), nullptr), 0);
    // 8 bytes (four bf16, two fp32) is still short of 16
    EXPECT_EQ(tpd_gemm_epilogue_askable(at(0x7f0000001008), nullptr), 0);
    // the aux alone misaligned is enough
    EXPECT_EQ(tpd_gemm_epilogue_askable(at(0x7f0000001000), at(0x7f0000002004)), 0);
    for (uintptr_t off = 1; off < TPD_GEMM_EPILOGUE_ALIGN; off++)
        EXPECT_EQ(tpd_gemm_epilogue_askable(at(0x7f0000001000 + off), nullptr), 0) << off;
}

TEST(GemmEpilogue, NotSupportedIsTheQuietFallback) {
    EXPECT_EQ(tpd_gemm_lt_outcome(TPD_GEMM_LT_NOT_SUPPORTED, 0, 1), TPD_GEMM_OUTCOME_UNSUPPORTED);
    EXPECT_EQ(tpd_gemm_lt_outcome(TPD_GEMM_LT_SUCCESS, 0, 1), TPD_GEMM_OUTCOME_UNSUPPORTED);
    // cublasLtMatmul refusing the heuristic's algorithm (found passed as 1)
    EXPECT_EQ(tpd_gemm_lt_outcome(TPD_GEMM_LT_NOT_SUPPORTED, 1, 1), TPD_GEMM_OUTCOME_UNSUPPORTED);
    EXPECT_EQ(tpd_gemm_lt_outcome(TPD_GEMM_LT_SUCCESS, 1, 1), TPD_GEMM_OUTCOME_OK);
}

TEST(GemmEpilogue, WithoutAFallbackARefusalIsAnError) {
    EXPECT_EQ(tpd_gemm_lt_outcome(TPD_GEMM_LT_NOT_SUPPORTED, 0, 0), TPD_GEMM_OUTCOME_ERROR);
    EXPECT_EQ(tpd_gemm_lt_outcome(TPD_GEMM_LT_SUCCESS, 0, 0), TPD_GEMM_OUTCOME_ERROR);
    EXPECT_EQ(tpd_gemm_lt_outcome(TPD_GEMM_LT_SUCCESS, 1, 0), TPD_GEMM_OUTCOME_OK);
}

TEST(GemmEpilogue, OtherStatusesAreErrorsEvenWithAFallback) {
    // cublas_api.h: NOT_INITIALIZED 1, ALLOC_FAILED 3, INVALID_VALUE 7, EXECUTION_FAILED 13,
    // INTERNAL_ERROR 14
    for (int status : {1, 3, 7, 13, 14}) {
        EXPECT_EQ(tpd_gemm_lt_outcome(status, 0, 1), TPD_GEMM_OUTCOME_ERROR) << status;
        EXPECT_EQ(tpd_gemm_lt_outcome(status, 1, 1), TPD_GEMM_OUTCOME_ERROR) << status;
    }
}

TEST(GemmEpilogue, MatmulWithBiasTakesItsFallback) {
    const void *aligned = at(0x7f0000001000), *odd = at(0x7f0000001002);
    EXPECT_EQ(matmul_bias_path(aligned, TPD_GEMM_LT_SUCCESS, 1), Path::Epilogue);
    // misaligned: skipped before cuBLASLt is asked, whatever it would answer
    EXPECT_EQ(matmul_bias_path(odd, TPD_GEMM_LT_SUCCESS, 1), Path::Fallback);
    EXPECT_EQ(matmul_bias_path(odd, 13, 0), Path::Fallback);
    // aligned but refused (mocked NOT_SUPPORTED): the fallback, not the error path
    EXPECT_EQ(matmul_bias_path(aligned, TPD_GEMM_LT_NOT_SUPPORTED, 0), Path::Fallback);
    EXPECT_EQ(matmul_bias_path(aligned, 13, 0), Path::Error);
}

} // namespace
