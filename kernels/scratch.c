/* Scratch sizes per op and the plan over a model's ops (kernels.h, tpd_kern_scratch_plan).
 *
 * Plain C, linked into the program (for `tripod plan` and the engine's reservation) and
 * into the cuda module (whose kernels take their scratch by these same functions), so the
 * size planned and the size used are one computation. */
#include "kernels/kernels.h"
#include "kernels/kernels_internal.h"

#include <string.h>

#include "base/align.h"

static size_t blocks_of(int N, int rows) {
    return N > 0 ? ((size_t)N + (size_t)rows - 1) / (size_t)rows : 0;
}

static size_t max2(size_t a, size_t b) {
    return a > b ? a : b;
}

/* one fp32 row of (dw | db), 2C floats, per block of TPD_KERN_LN_BWD_ROWS rows */
size_t tpd_kern_layernorm_bwd_scratch(int N, int C) {
    return blocks_of(N, TPD_KERN_LN_BWD_ROWS) * 2 * (size_t)C * sizeof(float);
}

/* one fp32 row of dw, C floats, per TPD_KERN_RMS_BWD_ROWS rows */
size_t tpd_kern_rmsnorm_bwd_scratch(int N, int C) {
    return blocks_of(N, TPD_KERN_RMS_BWD_ROWS) * (size_t)C * sizeof(float);
}

/* one fp32 row of OC column sums per TPD_KERN_BIAS_GRAD_ROWS rows */
size_t tpd_kern_bias_grad_scratch(int N, int OC) {
    return blocks_of(N, TPD_KERN_BIAS_GRAD_ROWS) * (size_t)OC * sizeof(float);
}

size_t tpd_kern_embed_sort_array(int N) {
    return tpd_align_up((size_t)N * sizeof(int32_t));
}

/* cub::DeviceRadixSort::SortPairs (not the DoubleBuffer form) of N (int32, int32) pairs
 * keeps in its temp: the alternate keys and values (2 arrays of N int32), the onesweep
 * look-back state (passes x tiles x 256 digits x 4 bytes: at most 4 passes of 8 bits, and
 * tiles of at least 1024 items, so under one more array plus one tile per pass) and the
 * digit histograms (4 passes x 256 x 8 bytes) and counters, each region 256-byte aligned:
 * 3 arrays and 64 KiB hold all of it. The cuda kernel checks cub's own figure against it. */
size_t tpd_kern_embed_sort_temp_bound(int N) {
    return 3 * tpd_kern_embed_sort_array(N) + ((size_t)64 << 10);
}

/* scatter_add_rows sorts its (idx, i) pairs as the embedding backward sorts its tokens */
size_t tpd_kern_scatter_rows_scratch(int N) {
    return N > 0 ? 4 * tpd_kern_embed_sort_array(N) + tpd_kern_embed_sort_temp_bound(N) : 0;
}

/* the embedding backward's partial sums: one fp32 row per sorted position (only the runs'
 * first positions in each chunk of TPD_KERN_EMBED_SEG are written) */
size_t tpd_kern_embed_partials_bytes(int N, int C) {
    return tpd_align_up((size_t)N * (size_t)C * sizeof(float));
}

size_t tpd_kern_attention_probs_bytes(int B, int T, int NH, size_t es) {
    return tpd_align_up((size_t)B * (size_t)NH * (size_t)T * (size_t)T * es);
}

size_t tpd_kern_attention_bwd_work_bytes(int B, int T, int NH, int NKV, int HS, size_t es) {
    int G = NKV > 0 ? NH / NKV : 1;
    size_t full = G > 1 ? (size_t)B * (size_t)T * 2 * (size_t)NH * (size_t)HS * es : 0;
    return tpd_kern_attention_probs_bytes(B, T, NH, es) + tpd_align_up(full);
}

/* cuDNN 9's flash attention plans keep in their workspace at most: the softmax row sums of
 * the backward, (B,NH,T) fp32, a dQ accumulator of their own, (B,NH,T,HS) fp32, and with
 * grouped-query heads fp32 dK/dV accumulators, no larger together than one more of those
 * (NKV <= NH). A few hundred KiB of semaphores and tile state sit on top. The real figure
 * is known only when cuDNN has built its plan on a device; the cuda backend compares it
 * with this bound there and says so when it is larger. */
size_t tpd_kern_cudnn_plan_workspace_bound(int B, int T, int NH, int HS) {
    size_t rows = (size_t)B * (size_t)NH * (size_t)T;
    return 2 * tpd_align_up(rows * (size_t)HS * sizeof(float)) +
           2 * tpd_align_up(rows * sizeof(float)) + ((size_t)1 << 20);
}

size_t tpd_kern_cudnn_dq_accum_bytes(int B, int T, int NH, int HS) {
    return tpd_align_up((size_t)B * (size_t)NH * (size_t)T * (size_t)HS * sizeof(float));
}

size_t tpd_kern_cudnn_softmax_sum_bytes(int B, int T, int NH) {
    return tpd_align_up((size_t)B * (size_t)NH * (size_t)T * sizeof(float));
}

size_t tpd_kern_attention_scores_bytes(int T, int NH, size_t es) {
    return es == sizeof(float) ? 0
                               : tpd_align_up((size_t)NH * (size_t)T * (size_t)T * sizeof(float));
}

/* cuda: each op's take of the one scratch buffer, as the kernels ask for it. Attention
 * takes the fused path's workspace (cudnn_fwd/bwd: the plan's, aligned up to TPD_ALIGN_BYTES,
 * plus TPD_ALIGN_BYTES more in the forward, and the dQ accumulator and the current pattern's
 * softmax_sum in the backward) when the fused path is asked for in bf16; grouped-query shapes may
 * fall back from it to the unfused path with softmax statistics, which keeps P and one batch
 * index's fp32 scores in scratch, so those plan for both. The unfused path (f32, or
 * attention: unfused) saves P as activation state; its scratch is the fp32 scores of one
 * batch index in the forward (bf16) and dS in the backward. A fused shape that cuDNN
 * refuses on the device (attention_choice.h) runs unfused: that rare fallback is not
 * planned (it would reserve P-sized scratch for every fused run); the backend warns then,
 * and the scratch grows. */
static void cuda_plan(const tpd_kern_shapes *s, tpd_kern_scratch *o) {
    int N = s->B * s->T;
    size_t es = tpd_dtype_size(s->dtype);
    o->norm_bwd = s->rmsnorm ? tpd_kern_rmsnorm_bwd_scratch(s->Nl, s->C)
                             : tpd_kern_layernorm_bwd_scratch(s->Nl, s->C);
    o->bias_grad = s->bias_oc > 0 ? tpd_kern_bias_grad_scratch(N, s->bias_oc) : 0;
    o->embed_bwd = s->Vl > 0
                       ? 4 * tpd_kern_embed_sort_array(N) + tpd_kern_embed_sort_temp_bound(N) +
                             tpd_kern_embed_partials_bytes(N, s->C)
                       : 0;
    o->moe_scatter = s->moe_rows > 0 ? tpd_kern_scatter_rows_scratch(s->moe_rows) : 0;
    if (s->NH <= 0 || s->B <= 0) return;
    size_t probs = tpd_kern_attention_probs_bytes(s->B, s->T, s->NH, es);
    size_t work = tpd_kern_attention_bwd_work_bytes(s->B, s->T, s->NH, s->NKV, s->HS, es);
    size_t scores = tpd_kern_attention_scores_bytes(s->T, s->NH, es);
    if (s->fused_attention && s->dtype == TPD_DTYPE_BF16) {
        size_t plan = tpd_kern_cudnn_plan_workspace_bound(s->B, s->T, s->NH, s->HS);
        o->attention_fwd = plan + TPD_ALIGN_BYTES;
        o->attention_bwd = plan + tpd_kern_cudnn_dq_accum_bytes(s->B, s->T, s->NH, s->HS) +
                           tpd_kern_cudnn_softmax_sum_bytes(s->B, s->T, s->NH);
        if (s->NKV < s->NH) { /* the statistics fallback of grouped-query shapes */
            o->attention_fwd = max2(o->attention_fwd, probs + scores);
            o->attention_bwd = max2(o->attention_bwd, probs + work + scores);
        }
    } else {
        o->attention_fwd = scores;
        o->attention_bwd = work;
    }
}

tpd_status tpd_kern_scratch_plan(const char *name, const tpd_kern_shapes *s,
                                 tpd_kern_scratch *out) {
    memset(out, 0, sizeof *out);
    if (s->B < 0 || s->T < 0 || s->Nl < 0 || s->C < 0 || s->NH < 0 || s->NKV < 0 || s->HS < 0 ||
        s->bias_oc < 0 || s->Vl < 0 || s->moe_rows < 0 || (s->NKV > 0 && s->NH % s->NKV != 0)) {
        tpd_log_error("scratch plan: bad shapes B=%d T=%d Nl=%d C=%d NH=%d NKV=%d HS=%d "
                      "bias_oc=%d Vl=%d moe_rows=%d",
                      s->B, s->T, s->Nl, s->C, s->NH, s->NKV, s->HS, s->bias_oc, s->Vl,
                      s->moe_rows);
        return TPD_ERR_INVALID;
    }
    if (strcmp(name, "cuda") == 0) {
        cuda_plan(s, out);
    } else if (strcmp(name, "cpu") != 0) {
        tpd_log_error("scratch plan: unknown backend \"%s\" (cpu or cuda)", name);
        return TPD_ERR_INVALID;
    }
    /* cpu: its ops keep their few temporaries in host memory of their own, per call (the
     * attention backward's per-thread rows, the reductions' partial sums): nothing of the
     * backend's memory, so nothing to plan. */
    out->total = max2(max2(max2(out->norm_bwd, out->bias_grad), out->embed_bwd),
                      max2(max2(out->attention_fwd, out->attention_bwd), out->moe_scatter));
    return TPD_OK;
}
