/* Public extras of the cpu backend that are not part of the ops table. */
#ifndef TPD_KERNELS_CPU_CPU_H
#define TPD_KERNELS_CPU_CPU_H

#include <stddef.h>

#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes currently held through ->alloc (requested sizes, not counting alignment
 * padding), so the engine can prove that what it allocates equals what the planner
 * predicts. 0 when b is not a cpu backend. */
size_t tpd_kern_cpu_bytes_allocated(const tpd_kern_backend *b);

/* OpenBLAS picks its kernels from the CPU model when the library loads, and on CPUs it
 * does not recognise (virtual machines reporting a generic "Intel Xeon Processor") it
 * falls back to SSE3 kernels, about 3x slower. Returns the OPENBLAS_CORETYPE that the
 * CPU's instruction sets allow ("SkylakeX", "Haswell") when the loaded choice is weaker
 * (on an AVX-512 CPU, AVX2 kernels count as weaker),
 * else NULL. It only takes effect in a process started with it in the environment. */
const char *tpd_kern_cpu_blas_coretype_upgrade(void);
/* What runs the bf16 matmuls: "oneDNN 2.6.3", or "OpenBLAS sgemm (fp32 staging)" in a build
 * without oneDNN. */
const char *tpd_kern_cpu_gemm_library(void);
/* The kernels OpenBLAS runs on ("SkylakeX", "Haswell", "Prescott", ...). */
const char *tpd_kern_cpu_blas_corename(void);

#ifdef __cplusplus
}
#endif
#endif
