/* The alignment of every region the buffer plan and the kernels' scratch plan lay out. */
#ifndef TPD_BASE_ALIGN_H
#define TPD_BASE_ALIGN_H

#include <stddef.h>

/* Bytes: what cudaMalloc returns and what cuBLASLt's and cuDNN's heuristics assume of a
 * matrix they are not told about, so every region carved from one allocation starts where
 * a fresh allocation would. The cpu engine lays out its buffers the same way, so that the
 * bytes `tripod plan` predicts are the bytes either backend allocates. */
#define TPD_ALIGN_BYTES 256

/* `bytes` rounded up to a multiple of TPD_ALIGN_BYTES. */
static inline size_t tpd_align_up(size_t bytes) {
    return (bytes + TPD_ALIGN_BYTES - 1) / TPD_ALIGN_BYTES * TPD_ALIGN_BYTES;
}

#endif
