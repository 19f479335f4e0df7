/* Which way the cuda backend runs causal attention for one shape, decided once at plan time
 * (when the model asks tpd_kern_attention_saved_bytes), and so what the forward saves for
 * the backward. Plain C without CUDA, so that the rule is tested on any machine
 * (tests/kernels/test_attention_choice.cc); kernels/cuda/cuda_attention_cudnn.cu fills the
 * inputs (device, cuDNN version, which cuDNN graphs finalized into execution plans).
 *
 * Paths:
 *   FUSED      cuDNN flash attention, backward graph in the pattern of current cuDNN 9
 *              (softmax_sum and the fp32 dQ accumulator as packed workspace tensors, the
 *              statistics subtracted before the causal mask); saves stats (B,NH,T) fp32.
 *   FUSED_OLD  the same forward, backward graph in the older pattern (virtual softmax_sum,
 *              mask before the statistics, F16x16-reordered dQ accumulator); saves stats.
 *   UNFUSED    cuBLASLt GEMMs + softmax kernels; saves P (B,NH,T,T) in the activation
 *              dtype. */
#ifndef TPD_KERNELS_ATTENTION_CHOICE_H
#define TPD_KERNELS_ATTENTION_CHOICE_H

#include <stddef.h>

#include "base/status.h"
#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tpd_attn_path {
    TPD_ATTN_PATH_UNFUSED = 0,
    TPD_ATTN_PATH_FUSED = 1,
    TPD_ATTN_PATH_FUSED_OLD = 2,
} tpd_attn_path;

/* What was tried of one cuDNN graph. */
typedef enum tpd_attn_build {
    TPD_ATTN_BUILD_NOT_TRIED = 0,
    TPD_ATTN_BUILD_OK = 1,     /* finalized into an execution plan */
    TPD_ATTN_BUILD_FAILED = 2, /* the graph, the heuristics or every plan refused */
} tpd_attn_build;

/* A forced choice, from TRIPOD_CUDNN_ATTN (read when the backend is created). */
typedef enum tpd_attn_force {
    TPD_ATTN_FORCE_NONE = 0,    /* unset or "auto": the rule below */
    TPD_ATTN_FORCE_OLD = 1,     /* "old": skip the current backward pattern */
    TPD_ATTN_FORCE_UNFUSED = 2, /* "unfused": never cuDNN */
} tpd_attn_force;

typedef struct tpd_attn_choice_in {
    int B, T, NH, HS;
    tpd_dtype dtype;     /* the backend's compute dtype: cuDNN takes BF16 only */
    int fused_requested; /* training.attention: fused */
    tpd_attn_force force;
    int sm;                 /* compute capability as 10*major + minor: 90 for an H100/H200 */
    int cudnn_version;      /* cudnnGetVersion(): 91900 for 9.19.0 */
    tpd_attn_build fwd;     /* the forward graph */
    tpd_attn_build bwd_new; /* the backward graph, current pattern */
    tpd_attn_build bwd_old; /* the backward graph, older pattern */
} tpd_attn_choice_in;

typedef struct tpd_attn_choice {
    tpd_attn_path path;
    int warn;           /* fused attention was asked for and is not taken: say so */
    char reason[384];   /* why this path, in words (names the head size when it decides) */
    size_t saved_bytes; /* what the forward saves for the backward on this path */
} tpd_attn_choice;

/* Parses TRIPOD_CUDNN_ATTN: NULL, "", "auto" -> NONE; "old"; "unfused". Anything else is
 * TPD_ERR_INVALID, logged with the variable and the allowed values; *force_p is written
 * only on success. */
tpd_status tpd_attn_force_parse(const char *value, tpd_attn_force *force_p);

/* The largest head size the cuDNN flash attention backward takes on compute capability sm
 * (it also needs a multiple of 8): 256 on sm_90, 128 elsewhere. From cudnn-frontend's SDPA
 * backward support check (include/cudnn_frontend/node/sdpa_support_surface.h: "Num
 * hidden_dim should be less than or equal to 256 and hidden_dim should be multiple of 8" for
 * prop_major 9, and "...less than or equal to 128..." for the other architectures). */
int tpd_attn_fused_max_head_size(int sm);

/* 1 when the cuDNN graphs are worth building for these inputs (the graph results are not
 * read); 0 with the reason in why (n bytes) otherwise. */
int tpd_attn_fused_eligible(const tpd_attn_choice_in *in, char *why, size_t n);

/* The decision from everything in `in`, the graph results included: FUSED when eligible and
 * the forward and the current backward built; FUSED_OLD when the forward and only the older
 * backward built; else UNFUSED, with warn set when fused attention was asked for in bf16. */
void tpd_attn_choose(const tpd_attn_choice_in *in, tpd_attn_choice *out);

/* Bytes the forward saves on a path: stats B*NH*T fp32 (fused), P B*NH*T*T (unfused). */
size_t tpd_attn_saved_bytes(tpd_attn_path path, tpd_dtype dtype, int B, int T, int NH);

/* Logs the decision once: tpd_log_warn("<reason>") when out->warn, else tpd_log_info. */
void tpd_attn_choice_log(const tpd_attn_choice *c);

#ifdef __cplusplus
}
#endif
#endif
