/* bf16 matrix products on the host: bf16 inputs, fp32 accumulation, fp32 or bf16 output.
 *
 * Built on oneDNN's matmul primitive when the build found it (TPD_HAVE_DNNL): on a CPU
 * with AVX512-BF16 it multiplies bf16 directly. Without oneDNN the same calls widen A and
 * B to fp32 and use cblas_sgemm, which agrees with the oneDNN path up to the order of the
 * fp32 summation (Debian's OpenBLAS has no sbgemm).
 *
 * A handle holds the library's engine and stream and a cache of primitives (creating one
 * costs far more than running a small product). Calls may come from several threads at
 * once, including from inside an OpenMP parallel region (the product then runs on the
 * calling thread alone). */
#ifndef TPD_KERNELS_CPU_CPU_GEMM_H
#define TPD_KERNELS_CPU_CPU_GEMM_H

#include <stdint.h>

#include "base/status.h"
#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tpd_cpu_gemm tpd_cpu_gemm;

tpd_status tpd_cpu_gemm_create(tpd_cpu_gemm **g_p);
/* NULL is a no-op. */
void tpd_cpu_gemm_destroy(tpd_cpu_gemm *g);
/* What computes the products, e.g. "oneDNN 2.6.3" or "OpenBLAS sgemm (fp32 staging)". */
const char *tpd_cpu_gemm_library(void);

/* Row-major, like cblas_sgemm:
 *   C(M,N) = alpha * op(A)(M,K) @ op(B)(K,N) [+ bias(N) on every row] + beta * C
 * op(A): A stored (M,K) with row stride lda when transa == 0, stored (K,M) when 1.
 * op(B): B stored (K,N) with row stride ldb when transb == 0, stored (N,K) when 1.
 * A, B and bias are bf16 bit patterns; C is c_dt (TPD_DTYPE_F32 or TPD_DTYPE_BF16) with
 * row stride ldc (elements). Products accumulate in fp32; a bf16 C is rounded once, to
 * nearest even, after alpha, bias and beta are applied. beta is 0 (C is only written) or
 * 1 (C is read in c_dt and accumulated into). bias may be NULL. M, N or K may be 0
 * (K == 0: C = beta * C [+ bias]). */
tpd_status tpd_cpu_gemm_bf16(tpd_cpu_gemm *g, int transa, int transb, int M, int N, int K,
                             float alpha, const uint16_t *A, int lda, const uint16_t *B, int ldb,
                             float beta, void *C, tpd_dtype c_dt, int ldc, const uint16_t *bias);

#ifdef __cplusplus
}
#endif

#endif
