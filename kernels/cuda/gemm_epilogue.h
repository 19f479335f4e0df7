/* When the cuda backend asks cuBLASLt for a GEMM with an epilogue (BIAS, GELU_AUX_BIAS), and
 * what a refusal means. Plain C without CUDA, so that the rule is tested on any machine
 * (tests/kernels/test_gemm_epilogue.cc); kernels/cuda/cuda_gemm.cu applies it.
 *
 * The fused ops (matmul_fwd with a bias, matmul_gelu_fwd) have a fallback: a plain GEMM and
 * then the bias (and GELU) kernel. They take it quietly when cuBLASLt has no algorithm for
 * the epilogue: the heuristic then answers CUBLAS_STATUS_NOT_SUPPORTED (or no result), and
 * cublasLtMatmul can refuse an algorithm the heuristic returned. Bias and aux views into the
 * flat parameter and activation buffers start at any element; cuBLASLt's epilogue kernels
 * read them in 16-byte vectors, so a view not 16-byte aligned skips the epilogue up front
 * instead of asking. */
#ifndef TPD_KERNELS_CUDA_GEMM_EPILOGUE_H
#define TPD_KERNELS_CUDA_GEMM_EPILOGUE_H

#ifdef __cplusplus
extern "C" {
#endif

/* cuBLAS's status values that the rule reads (cublas_api.h: CUBLAS_STATUS_SUCCESS = 0,
 * CUBLAS_STATUS_NOT_SUPPORTED = 15); cuda_gemm.cu asserts at compile time that they match. */
#define TPD_GEMM_LT_SUCCESS 0
#define TPD_GEMM_LT_NOT_SUPPORTED 15

/* The bytes an epilogue's bias and aux pointers must be aligned to. */
#define TPD_GEMM_EPILOGUE_ALIGN 16

typedef enum tpd_gemm_outcome {
    TPD_GEMM_OUTCOME_OK = 0,          /* an algorithm, or a launched GEMM */
    TPD_GEMM_OUTCOME_UNSUPPORTED = 1, /* no algorithm takes it: the caller's fallback, unlogged */
    TPD_GEMM_OUTCOME_ERROR = 2,       /* anything else: logged, the op fails */
} tpd_gemm_outcome;

/* 1 when an epilogue reading bias and aux (either may be NULL) is worth asking cuBLASLt for:
 * both 16-byte aligned. */
int tpd_gemm_epilogue_askable(const void *bias, const void *aux);

/* The outcome of one cuBLASLt call: lt_status is its cublasStatus_t, found the heuristic's
 * result count (pass 1 for cublasLtMatmul). quiet: the caller has a fallback. With one,
 * NOT_SUPPORTED and "no result" are UNSUPPORTED; without one they are errors; any other
 * failing status is an error either way. */
tpd_gemm_outcome tpd_gemm_lt_outcome(int lt_status, int found, int quiet);

#ifdef __cplusplus
}
#endif
#endif
