/* cuDNN version workarounds of the fused attention graphs, mirrored from cudnn-frontend's
 * SDPA lowerings and keyed on cudnnGetVersion() (major*10000 + minor*100 + patch: 91900 for
 * 9.19.0). Plain C without CUDA, so that the rules are tested on any machine
 * (tests/kernels/test_cudnn_rules.cc); kernels/cuda/cuda_attention_cudnn.cu applies them
 * when it decides a shape's path, and logs which applied.
 *
 * The rules:
 *   backward refused  cuDNN 9.10.0 and 9.10.1: cudnn-frontend refuses the SDPA backward on
 *                     them, so the backward graphs are not built and the shape runs unfused.
 *   padding mask      cuDNN 9.15 and older, s_kv % 128 != 0: cudnn-frontend adds a padding
 *                     mask with seq_len_q = seq_len_kv = T to the backward (its issue #160:
 *                     NaN in dQ/dK/dV without it). The mask keeps every element (the
 *                     sequences are unpadded), but it selects the kernels that handle the
 *                     ragged last tile. */
#ifndef TPD_KERNELS_CUDA_CUDNN_RULES_H
#define TPD_KERNELS_CUDA_CUDNN_RULES_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The first cuDNN version whose backward needs no padding mask for s_kv % 128 != 0. */
#define TPD_CUDNN_PADDING_FIXED_VERSION 91600

typedef struct tpd_cudnn_sdpa_rules {
    int bwd_refused;  /* the backward graphs are not to be built */
    int padding_mask; /* the backward graph carries the padding mask (seq_len = T) */
} tpd_cudnn_sdpa_rules;

/* The rules for cuDNN `version` and a key/value sequence of s_kv positions. */
void tpd_cudnn_sdpa_rules_of(int version, int s_kv, tpd_cudnn_sdpa_rules *rules_p);

/* Which rules applied, in words, into buf (n bytes): "" when none did. Returns the number
 * of rules that applied. */
int tpd_cudnn_sdpa_rules_describe(const tpd_cudnn_sdpa_rules *r, int version, int s_kv, char *buf,
                                  size_t n);

#ifdef __cplusplus
}
#endif
#endif
