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

#ifdef __cplusplus
}
#endif
#endif
