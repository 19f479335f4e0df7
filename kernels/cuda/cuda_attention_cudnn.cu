/* Fused causal flash attention through cuDNN's graph (backend descriptor) API, forward and
 * backward, with one finalized execution plan cached per shape, direction and pattern.
 *
 * cuDNN 9 recognizes flash attention as a pattern of primitive operations and runs it as
 * one fused kernel; we build that pattern (the one cudnn-frontend's composite SDPA nodes
 * lower to) directly from backend descriptors:
 *   forward:  S = Q @ K^T; S *= scale; causal mask (gen_index row >= col, else lowest);
 *             softmax with stats = max + log(sum exp) saved (B,NH,T) fp32; O = P @ V
 *   backward, two patterns, tried in this order at plan time (tpd_cuda_attention_decide):
 *   current   (cudnn-frontend 1.x for cuDNN 9, SDPABackwardNode):
 *             softmax_sum = rowsum(dO * O) * 1 into a packed fp32 workspace tensor (B,NH,T,1);
 *             S = scale * Q K^T - stats, then the causal mask, P = exp(S);
 *             dV = P^T @ dO; dS = P * (dO @ V^T - softmax_sum) * scale; dK = dS^T @ Q;
 *             dQ = dS @ K into a packed fp32 workspace accumulator (B,NH,T,HS), converted
 *   older     (cudnn-frontend's first cuDNN 9 lowering): softmax_sum virtual; the mask
 *             before the statistics; dP * 1 before the subtraction; the dQ accumulator in
 *             the F16x16 reordered layout
 * The unified SDPA_BWD backend operation of cuDNN 9.13+ takes no causal mask in 9.19, so it
 * is not one of the patterns. When neither backward builds (or the forward does not), the
 * shape takes the unfused path with one warning (kernels/attention_choice.h).
 * Q, K and V are views into qkv(B,T,W), W = (NH+2*NKV)*HS, given by strides (no copies):
 * Q[b,h,t,d] = qkv[b*T*W + t*W + h*HS + d], K[b,g,t,d] at + C + g*HS (C = NH*HS) and V at
 * + C + NKV*HS + g*HS.
 *
 * Grouped-query attention (NKV < NH) is the same lowering's: K and V carry NKV heads and the
 * two matmuls that read them broadcast head g over query heads g*G .. g*G+G-1 (G = NH/NKV);
 * in the backward, dK and dV are first formed per query head (virtual (B,NH,T,HS) tensors)
 * and then summed over each group by a reduction into the NKV-head outputs. When cuDNN has
 * no engine for such a graph (or TRIPOD_CUDNN_GQA=0), the shape takes the unfused path in
 * its softmax-statistics form instead (cuda_attention.cu), with one note in the log: it
 * saves and reads the same statistics, so either direction may fall back alone. */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cudnn_rules.h"

#include "base/align.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    UID_Q = 1,
    UID_K = 2, /* K^T view in both graphs */
    UID_V = 3, /* V in forward, V^T view in backward */
    UID_O = 4,
    UID_STATS = 5,
    UID_SCALE = 6,
    UID_NEG_INF = 7,
    UID_DO = 8,
    UID_DQ = 9,
    UID_DK = 10,
    UID_DV = 11,
    UID_DQ_ACCUM = 13,
    UID_ONE = 14,
    UID_SOFTMAX_SUM = 15, /* current backward pattern: rowsum(dO * O), in our workspace */
    UID_SEQ_LEN_Q = 16,   /* padding mask (cudnn_rules.h): (B,1,1,1) int32, every entry T */
    UID_SEQ_LEN_KV = 17,
    UID_VIRTUAL = 100, /* virtual tensors count up from here */
};

#define GRAPH_MAX_DESCS 160
#define MAX_ENGINE_CONFIGS 8 /* heuristic candidates tried, best first */

/* Every descriptor made for one graph, kept alive for as long as its plan is cached. */
typedef struct graph_builder {
    cudnnBackendDescriptor_t descs[GRAPH_MAX_DESCS]; /* all, in creation order */
    int n;
    cudnnBackendDescriptor_t ops[GRAPH_MAX_DESCS]; /* the operations, in graph order */
    int nops;
    cudnnStatus_t st; /* first failure; later calls become no-ops */
    const char *failed_at;
    int64_t next_virtual;
} graph_builder;

static cudnnBackendDescriptor_t gb_make(graph_builder *g, cudnnBackendDescriptorType_t type) {
    cudnnBackendDescriptor_t d = NULL;
    if (g->st != CUDNN_STATUS_SUCCESS) return NULL;
    if (g->n == GRAPH_MAX_DESCS) {
        g->st = CUDNN_STATUS_INTERNAL_ERROR;
        g->failed_at = "too many descriptors";
        return NULL;
    }
    g->st = cudnnBackendCreateDescriptor(type, &d);
    if (g->st != CUDNN_STATUS_SUCCESS) {
        g->failed_at = "cudnnBackendCreateDescriptor";
        return NULL;
    }
    g->descs[g->n++] = d;
    return d;
}

static void gb_set(graph_builder *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                   cudnnBackendAttributeType_t type, int64_t count, const void *value,
                   const char *what) {
    if (g->st != CUDNN_STATUS_SUCCESS) return;
    g->st = cudnnBackendSetAttribute(d, name, type, count, value);
    if (g->st != CUDNN_STATUS_SUCCESS) g->failed_at = what;
}

static void gb_fin(graph_builder *g, cudnnBackendDescriptor_t d, const char *what) {
    if (g->st != CUDNN_STATUS_SUCCESS) return;
    g->st = cudnnBackendFinalize(d);
    if (g->st != CUDNN_STATUS_SUCCESS) g->failed_at = what;
}

/* Finalizes an operation descriptor and appends it to the graph. */
static void gb_op(graph_builder *g, cudnnBackendDescriptor_t op, const char *what) {
    gb_fin(g, op, what);
    if (g->st == CUDNN_STATUS_SUCCESS) g->ops[g->nops++] = op;
}

static cudnnBackendDescriptor_t gb_tensor_r(graph_builder *g, int64_t uid, cudnnDataType_t dt,
                                            const int64_t dims[4], const int64_t strides[4],
                                            bool is_virtual, bool by_value,
                                            cudnnBackendTensorReordering_t reorder) {
    cudnnBackendDescriptor_t t = gb_make(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    int64_t align = 16;
    if (uid == 0) uid = g->next_virtual++;
    if (reorder != CUDNN_TENSOR_REORDERING_NONE)
        gb_set(g, t, CUDNN_ATTR_TENSOR_REORDERING_MODE, CUDNN_TYPE_TENSOR_REORDERING_MODE, 1,
               &reorder, "tensor reordering");
    gb_set(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor uid");
    gb_set(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, "tensor dtype");
    gb_set(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims, "tensor dims");
    gb_set(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides, "tensor strides");
    gb_set(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor align");
    gb_set(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual,
           "tensor virtual");
    gb_set(g, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value,
           "tensor by value");
    gb_fin(g, t, "tensor finalize");
    return t;
}

static cudnnBackendDescriptor_t gb_tensor(graph_builder *g, int64_t uid, cudnnDataType_t dt,
                                          const int64_t dims[4], const int64_t strides[4],
                                          bool is_virtual, bool by_value) {
    return gb_tensor_r(g, uid, dt, dims, strides, is_virtual, by_value,
                       CUDNN_TENSOR_REORDERING_NONE);
}

/* A virtual tensor of packed layout. */
static cudnnBackendDescriptor_t gb_virtual(graph_builder *g, cudnnDataType_t dt, int64_t d0,
                                           int64_t d1, int64_t d2, int64_t d3) {
    int64_t dims[4] = {d0, d1, d2, d3};
    int64_t strides[4] = {d1 * d2 * d3, d2 * d3, d3, 1};
    return gb_tensor(g, 0, dt, dims, strides, true, false);
}

static cudnnBackendDescriptor_t gb_scalar(graph_builder *g, int64_t uid) {
    int64_t one[4] = {1, 1, 1, 1};
    return gb_tensor(g, uid, CUDNN_DATA_FLOAT, one, one, false, true);
}

/* y = mode(x [, b [, t]]) with math precision prec; axis >= 0 for GEN_INDEX. */
static void gb_pointwise(graph_builder *g, cudnnPointwiseMode_t mode, cudnnDataType_t prec,
                         int64_t axis, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                         cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t pw = gb_make(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    gb_set(g, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
    gb_set(g, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, "pointwise prec");
    if (axis >= 0)
        gb_set(g, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pointwise axis");
    gb_fin(g, pw, "pointwise finalize");
    cudnnBackendDescriptor_t op = gb_make(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
           &pw, "pointwise op desc");
    gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x,
           "pointwise x");
    if (b != NULL)
        gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b,
               "pointwise b");
    if (t != NULL)
        gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t,
               "pointwise t");
    gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y,
           "pointwise y");
    gb_op(g, op, "pointwise op finalize");
}

static void gb_reduction(graph_builder *g, cudnnReduceTensorOp_t red, cudnnBackendDescriptor_t x,
                         cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t rd = gb_make(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    gb_set(g, rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &red,
           "reduction operator");
    gb_set(g, rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &prec, "reduction prec");
    gb_fin(g, rd, "reduction finalize");
    cudnnBackendDescriptor_t op = gb_make(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    gb_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd,
           "reduction op desc");
    gb_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x,
           "reduction x");
    gb_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y,
           "reduction y");
    gb_op(g, op, "reduction op finalize");
}

static void gb_matmul(graph_builder *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                      cudnnBackendDescriptor_t c) {
    cudnnBackendDescriptor_t md = gb_make(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    gb_set(g, md, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &prec, "matmul prec");
    gb_fin(g, md, "matmul finalize");
    cudnnBackendDescriptor_t op = gb_make(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    gb_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a,
           "matmul a");
    gb_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b,
           "matmul b");
    gb_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c,
           "matmul c");
    gb_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &md,
           "matmul op desc");
    gb_op(g, op, "matmul op finalize");
}

static void gb_reshape(graph_builder *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t op = gb_make(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    gb_set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x,
           "reshape x");
    gb_set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y,
           "reshape y");
    gb_op(g, op, "reshape op finalize");
}

/* Causal mask over scores s(B,H,T,T): row >= col keeps the score, else the lowest float. */
static cudnnBackendDescriptor_t gb_causal_mask(graph_builder *g, cudnnBackendDescriptor_t s,
                                               cudnnBackendDescriptor_t neg_inf, int64_t B,
                                               int64_t H, int64_t T, cudnnDataType_t index_prec) {
    cudnnBackendDescriptor_t row = gb_virtual(g, CUDNN_DATA_INT32, B, H, T, T);
    cudnnBackendDescriptor_t col = gb_virtual(g, CUDNN_DATA_INT32, B, H, T, T);
    cudnnBackendDescriptor_t keep = gb_virtual(g, CUDNN_DATA_BOOLEAN, B, H, T, T);
    cudnnBackendDescriptor_t out = gb_virtual(g, CUDNN_DATA_FLOAT, B, H, T, T);
    gb_pointwise(g, CUDNN_POINTWISE_GEN_INDEX, index_prec, 2, s, NULL, NULL, row);
    gb_pointwise(g, CUDNN_POINTWISE_GEN_INDEX, index_prec, 3, s, NULL, NULL, col);
    gb_pointwise(g, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, -1, row, col, NULL, keep);
    gb_pointwise(g, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, -1, s, neg_inf, keep, out);
    return out;
}

/* The padding mask of cudnn-frontend's lowering: s where row < seq_len_q[b] and
 * col < seq_len_kv[b], else the lowest value. With every seq_len = T it keeps everything;
 * on cuDNN <= 9.15 its presence picks the backward kernels that handle s_kv % 128 != 0. */
static cudnnBackendDescriptor_t gb_padding_mask(graph_builder *g, cudnnBackendDescriptor_t s,
                                                cudnnBackendDescriptor_t neg_inf, int64_t B,
                                                int64_t H, int64_t T, cudnnDataType_t index_prec) {
    int64_t len_dims[4] = {B, 1, 1, 1}, len_strides[4] = {1, 1, 1, 1};
    cudnnBackendDescriptor_t seq_q =
        gb_tensor(g, UID_SEQ_LEN_Q, CUDNN_DATA_INT32, len_dims, len_strides, false, false);
    cudnnBackendDescriptor_t seq_kv =
        gb_tensor(g, UID_SEQ_LEN_KV, CUDNN_DATA_INT32, len_dims, len_strides, false, false);
    cudnnBackendDescriptor_t row = gb_virtual(g, CUDNN_DATA_INT32, B, H, T, T);
    cudnnBackendDescriptor_t col = gb_virtual(g, CUDNN_DATA_INT32, B, H, T, T);
    cudnnBackendDescriptor_t row_ok = gb_virtual(g, CUDNN_DATA_BOOLEAN, B, H, T, T);
    cudnnBackendDescriptor_t col_ok = gb_virtual(g, CUDNN_DATA_BOOLEAN, B, H, T, T);
    cudnnBackendDescriptor_t keep = gb_virtual(g, CUDNN_DATA_BOOLEAN, B, H, T, T);
    cudnnBackendDescriptor_t out = gb_virtual(g, CUDNN_DATA_FLOAT, B, H, T, T);
    gb_pointwise(g, CUDNN_POINTWISE_GEN_INDEX, index_prec, 2, s, NULL, NULL, row);
    gb_pointwise(g, CUDNN_POINTWISE_GEN_INDEX, index_prec, 3, s, NULL, NULL, col);
    gb_pointwise(g, CUDNN_POINTWISE_CMP_LT, CUDNN_DATA_BOOLEAN, -1, row, seq_q, NULL, row_ok);
    gb_pointwise(g, CUDNN_POINTWISE_CMP_LT, CUDNN_DATA_BOOLEAN, -1, col, seq_kv, NULL, col_ok);
    gb_pointwise(g, CUDNN_POINTWISE_LOGICAL_AND, CUDNN_DATA_BOOLEAN, -1, row_ok, col_ok, NULL,
                 keep);
    gb_pointwise(g, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, -1, s, neg_inf, keep, out);
    return out;
}

/* Builds the forward (bwd = 0) or backward (bwd = 1) operation list for H query heads and
 * HKV key/value heads (HKV divides H); pattern (TPD_ATTN_PATH_FUSED or _FUSED_OLD) picks the
 * backward's form; pad adds the padding mask before the causal one (backward only). */
static void build_graph(graph_builder *g, int bwd, int pattern, int pad, int64_t B, int64_t T,
                        int64_t H, int64_t HKV, int64_t D) {
    const cudnnDataType_t io = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
    const int64_t C = H * D, W = (H + 2 * HKV) * D; /* rows of out and of qkv */
    int64_t qkv_dims[4] = {B, H, T, D}, qkv_strides[4] = {T * W, D, W, 1};
    int64_t kv_dims[4] = {B, HKV, T, D};
    int64_t tr_dims[4] = {B, HKV, D, T}, tr_strides[4] = {T * W, D, 1, W};
    int64_t o_dims[4] = {B, H, T, D}, o_strides[4] = {T * C, D, C, 1};
    int64_t st_dims[4] = {B, H, T, 1}, st_strides[4] = {H * T, T, 1, 1};

    cudnnBackendDescriptor_t q = gb_tensor(g, UID_Q, io, qkv_dims, qkv_strides, false, false);
    cudnnBackendDescriptor_t kt = gb_tensor(g, UID_K, io, tr_dims, tr_strides, false, false);
    cudnnBackendDescriptor_t o = gb_tensor(g, UID_O, io, o_dims, o_strides, false, false);
    cudnnBackendDescriptor_t stats =
        gb_tensor(g, UID_STATS, f32, st_dims, st_strides, false, false);
    cudnnBackendDescriptor_t scale = gb_scalar(g, UID_SCALE);
    cudnnBackendDescriptor_t neg_inf = gb_scalar(g, UID_NEG_INF);

    if (!bwd) {
        cudnnBackendDescriptor_t v = gb_tensor(g, UID_V, io, kv_dims, qkv_strides, false, false);
        cudnnBackendDescriptor_t s = gb_virtual(g, f32, B, H, T, T);
        gb_matmul(g, q, kt, s);
        cudnnBackendDescriptor_t s2 = gb_virtual(g, f32, B, H, T, T);
        gb_pointwise(g, CUDNN_POINTWISE_MUL, f32, -1, s, scale, NULL, s2);
        cudnnBackendDescriptor_t s3 = gb_causal_mask(g, s2, neg_inf, B, H, T, CUDNN_DATA_INT32);
        cudnnBackendDescriptor_t mx = gb_virtual(g, f32, B, H, T, 1);
        gb_reduction(g, CUDNN_REDUCE_TENSOR_MAX, s3, mx);
        cudnnBackendDescriptor_t sub = gb_virtual(g, f32, B, H, T, T);
        gb_pointwise(g, CUDNN_POINTWISE_SUB, f32, -1, s3, mx, NULL, sub);
        cudnnBackendDescriptor_t ex = gb_virtual(g, f32, B, H, T, T);
        gb_pointwise(g, CUDNN_POINTWISE_EXP, f32, -1, sub, NULL, NULL, ex);
        cudnnBackendDescriptor_t sum = gb_virtual(g, f32, B, H, T, 1);
        gb_reduction(g, CUDNN_REDUCE_TENSOR_ADD, ex, sum);
        cudnnBackendDescriptor_t lg = gb_virtual(g, f32, B, H, T, 1);
        gb_pointwise(g, CUDNN_POINTWISE_LOG, f32, -1, sum, NULL, NULL, lg);
        gb_pointwise(g, CUDNN_POINTWISE_ADD, f32, -1, mx, lg, NULL, stats);
        /* bmm2 takes P in the I/O type. */
        cudnnBackendDescriptor_t p = gb_virtual(g, io, B, H, T, T);
        gb_pointwise(g, CUDNN_POINTWISE_DIV, f32, -1, ex, sum, NULL, p);
        gb_matmul(g, p, v, o);
    } else {
        cudnnBackendDescriptor_t vt = gb_tensor(g, UID_V, io, tr_dims, tr_strides, false, false);
        cudnnBackendDescriptor_t dout = gb_tensor(g, UID_DO, io, o_dims, o_strides, false, false);
        cudnnBackendDescriptor_t dq = gb_tensor(g, UID_DQ, io, qkv_dims, qkv_strides, false, false);
        cudnnBackendDescriptor_t dk = gb_tensor(g, UID_DK, io, kv_dims, qkv_strides, false, false);
        cudnnBackendDescriptor_t dv = gb_tensor(g, UID_DV, io, kv_dims, qkv_strides, false, false);
        cudnnBackendDescriptor_t one = gb_scalar(g, UID_ONE);
        const int cur = pattern == TPD_ATTN_PATH_FUSED;
        /* The fp32 dQ accumulator lives in our workspace and is zeroed before every execution
         * (cuDNN before 9.6 adds into it). A non-virtual dQ accumulator is also how the
         * backend is told to use the accumulating (not the dP-workspace) backward. The older
         * pattern declares it in the F16x16 reordered layout, the current one packed. */
        int64_t acc_strides[4] = {H * T * D, T * D, D, 1};
        cudnnBackendDescriptor_t dq_acc =
            gb_tensor_r(g, UID_DQ_ACCUM, f32, qkv_dims, acc_strides, false, false,
                        cur ? CUDNN_TENSOR_REORDERING_NONE : CUDNN_TENSOR_REORDERING_F16x16);

        /* softmax_sum = rowsum(dO * O) * 1: in our workspace (current), or virtual (older) */
        cudnnBackendDescriptor_t doo = gb_virtual(g, f32, B, H, T, D);
        gb_pointwise(g, CUDNN_POINTWISE_MUL, f32, -1, dout, o, NULL, doo);
        cudnnBackendDescriptor_t red = gb_virtual(g, f32, B, H, T, 1);
        gb_reduction(g, CUDNN_REDUCE_TENSOR_ADD, doo, red);
        cudnnBackendDescriptor_t ssum =
            cur ? gb_tensor(g, UID_SOFTMAX_SUM, f32, st_dims, st_strides, false, false)
                : gb_virtual(g, f32, B, H, T, 1);
        gb_pointwise(g, CUDNN_POINTWISE_MUL, f32, -1, red, one, NULL, ssum);

        /* P = exp(mask(scale * Q K^T - stats)) (current) or exp(mask(scale * Q K^T) - stats)
         * (older). The current pattern's index generators take the graph's fp32 math
         * precision, as cudnn-frontend leaves them. */
        cudnnBackendDescriptor_t s = gb_virtual(g, f32, B, H, T, T);
        gb_matmul(g, q, kt, s);
        cudnnBackendDescriptor_t s2 = gb_virtual(g, f32, B, H, T, T);
        gb_pointwise(g, CUDNN_POINTWISE_MUL, f32, -1, s, scale, NULL, s2);
        cudnnBackendDescriptor_t s4;
        if (cur) {
            cudnnBackendDescriptor_t s3 = gb_virtual(g, f32, B, H, T, T);
            gb_pointwise(g, CUDNN_POINTWISE_SUB, f32, -1, s2, stats, NULL, s3);
            if (pad) s3 = gb_padding_mask(g, s3, neg_inf, B, H, T, f32);
            s4 = gb_causal_mask(g, s3, neg_inf, B, H, T, f32);
        } else {
            if (pad) s2 = gb_padding_mask(g, s2, neg_inf, B, H, T, CUDNN_DATA_INT32);
            cudnnBackendDescriptor_t s3 = gb_causal_mask(g, s2, neg_inf, B, H, T, CUDNN_DATA_INT32);
            s4 = gb_virtual(g, f32, B, H, T, T);
            gb_pointwise(g, CUDNN_POINTWISE_SUB, f32, -1, s3, stats, NULL, s4);
        }
        cudnnBackendDescriptor_t p = gb_virtual(g, f32, B, H, T, T);
        gb_pointwise(g, CUDNN_POINTWISE_EXP, f32, -1, s4, NULL, NULL, p);

        /* dV = P^T @ dO */
        int64_t pt_dims[4] = {B, H, T, T}, pt_strides[4] = {H * T * T, T * T, 1, T};
        cudnnBackendDescriptor_t pt = gb_tensor(g, 0, io, pt_dims, pt_strides, true, false);
        gb_reshape(g, p, pt);
        if (HKV == H) {
            gb_matmul(g, pt, dout, dv);
        } else { /* per query head, then summed over each group of G heads */
            cudnnBackendDescriptor_t dv_full = gb_virtual(g, io, B, H, T, D);
            gb_matmul(g, pt, dout, dv_full);
            gb_reduction(g, CUDNN_REDUCE_TENSOR_ADD, dv_full, dv);
        }

        /* dS = P * (dO @ V^T [* 1, older] - softmax_sum) * scale */
        cudnnBackendDescriptor_t dp = gb_virtual(g, f32, B, H, T, T);
        gb_matmul(g, dout, vt, dp);
        cudnnBackendDescriptor_t dp1 = dp;
        if (!cur) {
            dp1 = gb_virtual(g, f32, B, H, T, T);
            gb_pointwise(g, CUDNN_POINTWISE_MUL, f32, -1, dp, one, NULL, dp1);
        }
        cudnnBackendDescriptor_t dp2 = gb_virtual(g, f32, B, H, T, T);
        gb_pointwise(g, CUDNN_POINTWISE_SUB, f32, -1, dp1, ssum, NULL, dp2);
        cudnnBackendDescriptor_t ds = gb_virtual(g, f32, B, H, T, T);
        gb_pointwise(g, CUDNN_POINTWISE_MUL, f32, -1, dp2, p, NULL, ds);
        cudnnBackendDescriptor_t ds2 = gb_virtual(g, f32, B, H, T, T);
        gb_pointwise(g, CUDNN_POINTWISE_MUL, f32, -1, ds, scale, NULL, ds2);

        /* dK = dS^T @ Q */
        cudnnBackendDescriptor_t dst = gb_tensor(g, 0, io, pt_dims, pt_strides, true, false);
        gb_reshape(g, ds2, dst);
        if (HKV == H) {
            gb_matmul(g, dst, q, dk);
        } else {
            cudnnBackendDescriptor_t dk_full = gb_virtual(g, io, B, H, T, D);
            gb_matmul(g, dst, q, dk_full);
            gb_reduction(g, CUDNN_REDUCE_TENSOR_ADD, dk_full, dk);
        }

        /* dQ = dS @ K, accumulated in fp32, then converted */
        cudnnBackendDescriptor_t k = gb_tensor(g, 0, io, kv_dims, qkv_strides, true, false);
        gb_reshape(g, kt, k);
        gb_matmul(g, ds2, k, dq_acc);
        gb_pointwise(g, CUDNN_POINTWISE_IDENTITY, f32, -1, dq_acc, NULL, NULL, dq);
    }
}

/* Why a graph has no plan, in words, into why (n bytes): the step that failed, cuDNN's
 * status and its last error string. */
static void graph_why(graph_builder *g, char *why, size_t n) {
    char detail[256];
    cudnnGetLastErrorString(detail, sizeof detail);
    snprintf(why, n, "%s failed: %s (%s)", g->failed_at ? g->failed_at : "?",
             cudnnGetErrorString(g->st), detail);
}

static void destroy_descs(cudnnBackendDescriptor_t *d, int n) {
    for (int i = n - 1; i >= 0; i--)
        if (d[i] != NULL) cudnnBackendDestroyDescriptor(d[i]);
}

static void graph_free(void *p) {
    graph_builder *g = (graph_builder *)p;
    if (g == NULL) return;
    destroy_descs(g->descs, g->n);
    free(g);
}

/* The version rules (cudnn_rules.h) for a sequence of T positions (s_q = s_kv = T). */
static tpd_cudnn_sdpa_rules sdpa_rules(int T) {
    tpd_cudnn_sdpa_rules r;
    tpd_cudnn_sdpa_rules_of((int)cudnnGetVersion(), T, &r);
    return r;
}

/* Builds the graph, asks the heuristics (mode A) for engine configs and keeps the first
 * one that finalizes into an execution plan. Logs nothing: a graph cuDNN does not take is
 * TPD_ERR_UNSUPPORTED with the reason in why (n bytes), for the caller to report. */
/* Marks a plan-cache slot as the one of this shape, direction and pattern. */
static void slot_key(tpd_cuda_attn_plan *slot, int bwd, int pattern, int B, int T, int NH, int NKV,
                     int HS) {
    slot->used = 1;
    slot->bwd = bwd;
    slot->pattern = bwd ? pattern : TPD_ATTN_PATH_FUSED;
    slot->B = B;
    slot->T = T;
    slot->NH = NH;
    slot->NKV = NKV;
    slot->HS = HS;
}

static tpd_status build_plan(tpd_kern_ctx *ctx, int bwd, int pattern, int B, int T, int NH, int NKV,
                             int HS, tpd_cuda_attn_plan *slot, char *why, size_t n) {
    graph_builder *g = (graph_builder *)calloc(1, sizeof *g);
    if (g == NULL) {
        tpd_log_error("cuDNN fused attention: out of memory building the graph");
        return TPD_ERR_NOMEM;
    }
    g->st = CUDNN_STATUS_SUCCESS;
    g->next_virtual = UID_VIRTUAL;
    build_graph(g, bwd, pattern, bwd && sdpa_rules(T).padding_mask, B, T, NH, NKV, HS);

    cudnnBackendDescriptor_t graph = gb_make(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    gb_set(g, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &ctx->cudnn,
           "graph handle");
    gb_set(g, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->nops, g->ops,
           "graph ops");
    gb_fin(g, graph, "operation graph finalize");

    cudnnBackendDescriptor_t heur = gb_make(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    gb_set(g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph,
           "heuristics graph");
    gb_set(g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics mode");
    gb_fin(g, heur, "heuristics finalize");

    int64_t count = 0;
    cudnnBackendDescriptor_t cfgs[MAX_ENGINE_CONFIGS];
    if (g->st == CUDNN_STATUS_SUCCESS) {
        g->st = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                         CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, NULL);
        if (g->st != CUDNN_STATUS_SUCCESS) g->failed_at = "heuristics result count";
    }
    if (count > MAX_ENGINE_CONFIGS) count = MAX_ENGINE_CONFIGS;
    for (int64_t i = 0; i < count; i++)
        cfgs[i] = gb_make(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    if (g->st == CUDNN_STATUS_SUCCESS && count > 0) {
        g->st = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                         CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &count, cfgs);
        if (g->st != CUDNN_STATUS_SUCCESS) g->failed_at = "heuristics results";
    }

    cudnnBackendDescriptor_t plan = NULL;
    cudnnStatus_t last = CUDNN_STATUS_NOT_SUPPORTED;
    for (int64_t i = 0; g->st == CUDNN_STATUS_SUCCESS && i < count && plan == NULL; i++) {
        cudnnBackendDescriptor_t cand = NULL;
        last = cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &cand);
        if (last != CUDNN_STATUS_SUCCESS) break;
        last = cudnnBackendSetAttribute(cand, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE,
                                        1, &ctx->cudnn);
        if (last == CUDNN_STATUS_SUCCESS)
            last = cudnnBackendSetAttribute(cand, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                            CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i]);
        if (last == CUDNN_STATUS_SUCCESS) last = cudnnBackendFinalize(cand);
        if (last == CUDNN_STATUS_SUCCESS)
            plan = cand;
        else
            cudnnBackendDestroyDescriptor(cand);
    }
    if (g->st == CUDNN_STATUS_SUCCESS && plan == NULL) {
        g->st = count == 0 ? CUDNN_STATUS_NOT_SUPPORTED : last;
        g->failed_at = count == 0 ? "heuristics (no engine supports this graph)"
                                  : "execution plan finalize (every engine config)";
    }
    int64_t ws = 0;
    if (g->st == CUDNN_STATUS_SUCCESS) {
        g->st = cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                         CUDNN_TYPE_INT64, 1, NULL, &ws);
        if (g->st != CUDNN_STATUS_SUCCESS) g->failed_at = "plan workspace size";
    }
    if (g->st != CUDNN_STATUS_SUCCESS) {
        graph_why(g, why, n);
        if (plan != NULL) cudnnBackendDestroyDescriptor(plan);
        graph_free(g);
        return TPD_ERR_UNSUPPORTED;
    }
    slot_key(slot, bwd, pattern, B, T, NH, NKV, HS);
    slot->plan = plan;
    slot->graph = g;
    slot->workspace_bytes = ws;
    /* the scratch was planned with a bound on this (kernels/scratch.c); a larger plan
     * would make the op outgrow the reservation, so say where it comes from */
    if ((size_t)ws > tpd_kern_cudnn_plan_workspace_bound(B, T, NH, HS))
        tpd_log_warn("cuDNN attention %s plan (B=%d T=%d NH=%d HS=%d) wants %lld bytes of "
                     "workspace, more than the planned bound of %zu",
                     bwd ? "backward" : "forward", B, T, NH, HS, (long long)ws,
                     tpd_kern_cudnn_plan_workspace_bound(B, T, NH, HS));
    return TPD_OK;
}

static void plan_release(tpd_cuda_attn_plan *p) {
    if (!p->used) return;
    if (p->plan != NULL) cudnnBackendDestroyDescriptor(p->plan);
    graph_free(p->graph);
    memset(p, 0, sizeof *p);
}

void tpd_cuda_attention_cache_destroy(tpd_kern_ctx *ctx) {
    for (int i = 0; i < TPD_CUDA_ATTN_CACHE_SLOTS; i++)
        plan_release(&ctx->attn_cache[i]);
    if (ctx->attn_seq_len != NULL) cudaFree(ctx->attn_seq_len);
    ctx->attn_seq_len = NULL;
    ctx->attn_seq_len_cap = 0;
    memset(ctx->attn_decisions, 0, sizeof ctx->attn_decisions);
}

/* The cached slot of a shape, direction and pattern (the forward has one pattern), or a
 * free (or evicted) slot to build it in, with *found_p saying which. */
static tpd_cuda_attn_plan *plan_slot(tpd_kern_ctx *ctx, int bwd, int pattern, int B, int T, int NH,
                                     int NKV, int HS, int *found_p) {
    tpd_cuda_attn_plan *free_slot = NULL;
    if (!bwd) pattern = TPD_ATTN_PATH_FUSED;
    for (int i = 0; i < TPD_CUDA_ATTN_CACHE_SLOTS; i++) {
        tpd_cuda_attn_plan *p = &ctx->attn_cache[i];
        if (p->used && p->bwd == bwd && p->pattern == pattern && p->B == B && p->T == T &&
            p->NH == NH && p->NKV == NKV && p->HS == HS) {
            *found_p = 1;
            return p;
        }
        if (!p->used && free_slot == NULL) free_slot = p;
    }
    *found_p = 0;
    if (free_slot == NULL) {
        /* Full: the shapes of a run are few, so evicting any one is fine. The plan may
         * still be referenced by queued work only through its kernels, which do not need
         * the descriptors after launch. */
        free_slot = &ctx->attn_cache[(B + T + NH + NKV + HS + bwd) % TPD_CUDA_ATTN_CACHE_SLOTS];
        plan_release(free_slot);
    }
    return free_slot;
}

/* The cached plan of a shape, direction and pattern, built on first use. A grouped-query
 * shape that cuDNN does not take comes back as a slot marked unsupported (remembered like a
 * plan), noted once per direction. A multi-head shape was built when its path was decided;
 * failing to rebuild it after an eviction is an error. */
static tpd_status get_plan(tpd_kern_ctx *ctx, int bwd, int pattern, int B, int T, int NH, int NKV,
                           int HS, tpd_cuda_attn_plan **plan_p) {
    int found = 0;
    tpd_cuda_attn_plan *slot = plan_slot(ctx, bwd, pattern, B, T, NH, NKV, HS, &found);
    if (found) {
        *plan_p = slot;
        return TPD_OK;
    }
    char why[384];
    tpd_status st = build_plan(ctx, bwd, pattern, B, T, NH, NKV, HS, slot, why, sizeof why);
    if (st == TPD_ERR_UNSUPPORTED && NKV != NH) {
        if (!(ctx->gqa_fallback_logged & (1 << bwd)))
            tpd_log_warn("cuDNN fused attention %s has no engine for grouped-query attention "
                         "(B=%d T=%d NH=%d NKV=%d HS=%d: %s); grouped-query shapes take the "
                         "unfused cuBLASLt path",
                         bwd ? "backward" : "forward", B, T, NH, NKV, HS, why);
        ctx->gqa_fallback_logged |= 1 << bwd;
        slot_key(slot, bwd, pattern, B, T, NH, NKV, HS);
        slot->unsupported = 1;
        *plan_p = slot;
        return TPD_OK;
    }
    if (st == TPD_ERR_UNSUPPORTED)
        tpd_log_error("cuDNN fused attention %s (B=%d T=%d NH=%d HS=%d): %s",
                      bwd ? "backward" : "forward", B, T, NH, HS, why);
    if (st != TPD_OK) return st == TPD_ERR_UNSUPPORTED ? TPD_ERR_BACKEND : st;
    *plan_p = slot;
    return TPD_OK;
}

/* Tries one graph for the decision: its plan stays cached when it builds. */
static tpd_attn_build try_build(tpd_kern_ctx *ctx, int bwd, int pattern, int B, int T, int NH,
                                int HS, char *why, size_t n) {
    int found = 0;
    tpd_cuda_attn_plan *slot = plan_slot(ctx, bwd, pattern, B, T, NH, NH, HS, &found);
    if (found) return slot->unsupported ? TPD_ATTN_BUILD_FAILED : TPD_ATTN_BUILD_OK;
    tpd_status st = build_plan(ctx, bwd, pattern, B, T, NH, NH, HS, slot, why, n);
    return st == TPD_OK ? TPD_ATTN_BUILD_OK : TPD_ATTN_BUILD_FAILED;
}

const tpd_attn_choice *tpd_cuda_attention_decide(tpd_kern_ctx *ctx, int B, int T, int NH, int HS) {
    tpd_cuda_attn_decision *d = NULL;
    for (int i = 0; i < TPD_CUDA_ATTN_CACHE_SLOTS; i++) {
        tpd_cuda_attn_decision *e = &ctx->attn_decisions[i];
        if (e->used && e->B == B && e->T == T && e->NH == NH && e->HS == HS) return &e->choice;
        if (!e->used && d == NULL) d = e;
    }
    if (d == NULL) d = &ctx->attn_decisions[(B + T + NH + HS) % TPD_CUDA_ATTN_CACHE_SLOTS];

    tpd_attn_choice_in in;
    memset(&in, 0, sizeof in);
    in.B = B;
    in.T = T;
    in.NH = NH;
    in.HS = HS;
    in.dtype = ctx->dtype;
    in.fused_requested = ctx->fused_attention;
    in.force = ctx->attn_force;
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ctx->device) !=
            cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, ctx->device) !=
            cudaSuccess)
        major = minor = 0; /* reads as too old: unfused, with the reason */
    in.sm = major * 10 + minor;
    in.cudnn_version = (int)cudnnGetVersion();

    char why[384] = "", why_new[384] = "", why_old[384] = "", rules_why[384] = "";
    const tpd_cudnn_sdpa_rules rules = sdpa_rules(T);
    int eligible = tpd_attn_fused_eligible(&in, why, sizeof why);
    if (eligible)
        tpd_cudnn_sdpa_rules_describe(&rules, in.cudnn_version, T, rules_why, sizeof rules_why);
    if (eligible && rules.bwd_refused) {
        /* neither backward is built: the choice falls to unfused, with the rule's words */
        in.fwd = try_build(ctx, 0, TPD_ATTN_PATH_FUSED, B, T, NH, HS, why, sizeof why);
        in.bwd_new = in.bwd_old = TPD_ATTN_BUILD_FAILED;
        snprintf(why_new, sizeof why_new, "not built: %s", rules_why);
        snprintf(why_old, sizeof why_old, "not built: %s", rules_why);
    } else if (eligible) {
        in.fwd = try_build(ctx, 0, TPD_ATTN_PATH_FUSED, B, T, NH, HS, why, sizeof why);
        if (in.fwd == TPD_ATTN_BUILD_OK && in.force != TPD_ATTN_FORCE_OLD)
            in.bwd_new =
                try_build(ctx, 1, TPD_ATTN_PATH_FUSED, B, T, NH, HS, why_new, sizeof why_new);
        if (in.fwd == TPD_ATTN_BUILD_OK && in.bwd_new != TPD_ATTN_BUILD_OK)
            in.bwd_old =
                try_build(ctx, 1, TPD_ATTN_PATH_FUSED_OLD, B, T, NH, HS, why_old, sizeof why_old);
    }
    memset(d, 0, sizeof *d);
    tpd_attn_choose(&in, &d->choice);
    d->used = 1;
    d->B = B;
    d->T = T;
    d->NH = NH;
    d->HS = HS;
    tpd_attn_choice_log(&d->choice);
    if (rules_why[0] != 0) tpd_log_info("  cuDNN version rule: %s", rules_why);
    /* cuDNN's own words for each graph that failed, beside the decision */
    if (in.fwd == TPD_ATTN_BUILD_FAILED) tpd_log_info("  cuDNN attention forward: %s", why);
    if (in.bwd_new == TPD_ATTN_BUILD_FAILED)
        tpd_log_info("  cuDNN attention backward (current pattern): %s", why_new);
    if (in.bwd_old == TPD_ATTN_BUILD_FAILED)
        tpd_log_info("  cuDNN attention backward (older pattern): %s", why_old);
    return &d->choice;
}

/* 1 when cuDNN is turned off for grouped-query shapes on this context (TRIPOD_CUDNN_GQA=0,
 * noted once per direction) and this is one; the other way to the unfused path is a cached
 * slot marked unsupported (get_plan). */
static int gqa_unfused(tpd_kern_ctx *ctx, int bwd, int NH, int NKV) {
    if (NKV == NH || ctx->cudnn_gqa) return 0;
    if (!(ctx->gqa_fallback_logged & (1 << bwd)))
        tpd_log_info("TRIPOD_CUDNN_GQA=0: grouped-query attention %s takes the unfused cuBLASLt "
                     "path",
                     bwd ? "backward" : "forward");
    ctx->gqa_fallback_logged |= 1 << bwd;
    return 1;
}

static tpd_status execute(tpd_kern_ctx *ctx, tpd_cuda_attn_plan *p, int n, const int64_t *uids,
                          void **ptrs, void *workspace) {
    cudnnBackendDescriptor_t pack = NULL;
    tpd_status st =
        TPD_CUDNN(cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack));
    if (st != TPD_OK) return st;
    TPD_CHECK_GOTO(TPD_CUDNN(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
                                                      CUDNN_TYPE_INT64, n, uids)),
                   st, done);
    TPD_CHECK_GOTO(TPD_CUDNN(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                                      CUDNN_TYPE_VOID_PTR, n, ptrs)),
                   st, done);
    TPD_CHECK_GOTO(TPD_CUDNN(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
                                                      CUDNN_TYPE_VOID_PTR, 1, &workspace)),
                   st, done);
    TPD_CHECK_GOTO(TPD_CUDNN(cudnnBackendFinalize(pack)), st, done);
    TPD_CHECK_GOTO(TPD_CUDNN(cudnnBackendExecute(ctx->cudnn, p->plan, pack)), st, done);
done:
    cudnnBackendDestroyDescriptor(pack);
    return st;
}

/* The backward's workspace: [plan workspace | dQ accumulator (B,NH,T,HS) fp32 | softmax_sum
 * (B,NH,T) fp32, current pattern only]. */
static size_t bwd_acc_bytes(int B, int T, int NH, int HS) {
    return tpd_kern_cudnn_dq_accum_bytes(B, T, NH, HS); /* kernels/scratch.c */
}
static size_t bwd_ssum_bytes(int pattern, int B, int T, int NH) {
    return pattern == TPD_ATTN_PATH_FUSED ? tpd_kern_cudnn_softmax_sum_bytes(B, T, NH) : 0;
}

__global__ void fill_i32_kernel(int32_t *p, int n, int32_t v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = v;
}

/* The padding mask's lengths, (B,1,1,1) int32 all T, in a buffer of the context that grows
 * with B (stream-ordered, so queued backwards keep theirs); written on the stream each call,
 * so shapes with different T can alternate. */
static tpd_status seq_len_of(tpd_kern_ctx *ctx, int B, int T, int32_t **seq_len_p) {
    if (B > ctx->attn_seq_len_cap) {
        int cap = B < 64 ? 64 : B;
        if (ctx->attn_seq_len != NULL)
            TPD_CHECK(TPD_CUDA(cudaFreeAsync(ctx->attn_seq_len, ctx->stream)));
        ctx->attn_seq_len = NULL;
        ctx->attn_seq_len_cap = 0;
        TPD_CHECK(TPD_CUDA(cudaMallocAsync((void **)&ctx->attn_seq_len,
                                           (size_t)cap * sizeof(int32_t), ctx->stream)));
        ctx->attn_seq_len_cap = cap;
    }
    fill_i32_kernel<<<(B + 255) / 256, 256, 0, ctx->stream>>>(ctx->attn_seq_len, B, (int32_t)T);
    TPD_CHECK(TPD_CUDA(cudaGetLastError()));
    *seq_len_p = ctx->attn_seq_len;
    return TPD_OK;
}

/* The graph declares every tensor 16-byte aligned. */
static tpd_status check_aligned(const void *p, const char *name, const char *dir) {
    if (((uintptr_t)p & 15u) != 0) {
        tpd_log_error("cuDNN fused attention %s: %s at %p is not 16-byte aligned (use "
                      "training.attention: unfused)",
                      dir, name, p);
        return TPD_ERR_UNSUPPORTED;
    }
    return TPD_OK;
}

tpd_status tpd_cuda_attention_cudnn_fwd(tpd_kern_ctx *ctx, void *out, float *stats, const void *qkv,
                                        int B, int T, int NH, int NKV, int HS) {
    TPD_CHECK(check_aligned(qkv, "qkv", "forward"));
    TPD_CHECK(check_aligned(out, "out", "forward"));
    TPD_CHECK(check_aligned(stats, "stats", "forward"));
    tpd_cuda_attn_plan *p = NULL;
    if (!gqa_unfused(ctx, 0, NH, NKV))
        TPD_CHECK(get_plan(ctx, 0, TPD_ATTN_PATH_FUSED, B, T, NH, NKV, HS, &p));
    if (p == NULL || p->unsupported)
        return tpd_cuda_attention_gemm_fwd_stats(ctx, out, stats, qkv, B, T, NH, NKV, HS);
    void *ws = NULL;
    TPD_CHECK(
        tpd_cuda_scratch(ctx, tpd_align_up((size_t)p->workspace_bytes) + TPD_ALIGN_BYTES, &ws));
    const size_t C = (size_t)NH * HS, KV = (size_t)NKV * HS; /* Q to K, K to V in a row */
    const tpd_bf16 *q = (const tpd_bf16 *)qkv;
    float scale = 1.0f / sqrtf((float)HS);
    float neg_inf = -FLT_MAX;
    int64_t uids[] = {UID_Q, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_NEG_INF};
    void *ptrs[] = {(void *)q, (void *)(q + C), (void *)(q + C + KV), out, (void *)stats,
                    &scale,    &neg_inf};
    return execute(ctx, p, 7, uids, ptrs, ws);
}

tpd_status tpd_cuda_attention_cudnn_bwd(tpd_kern_ctx *ctx, void *dqkv, const void *dout,
                                        const void *qkv, const void *out, const float *stats, int B,
                                        int T, int NH, int NKV, int HS) {
    TPD_CHECK(check_aligned(qkv, "qkv", "backward"));
    TPD_CHECK(check_aligned(out, "out", "backward"));
    TPD_CHECK(check_aligned(stats, "stats", "backward"));
    TPD_CHECK(check_aligned(dout, "dout", "backward"));
    TPD_CHECK(check_aligned(dqkv, "dqkv", "backward"));
    const int pattern = tpd_cuda_attention_decide(ctx, B, T, NH, HS)->path;
    tpd_cuda_attn_plan *p = NULL;
    if (!gqa_unfused(ctx, 1, NH, NKV)) TPD_CHECK(get_plan(ctx, 1, pattern, B, T, NH, NKV, HS, &p));
    if (p == NULL || p->unsupported)
        return tpd_cuda_attention_gemm_bwd_stats(ctx, dqkv, dout, qkv, stats, B, T, NH, NKV, HS);
    size_t ws_plan = tpd_align_up((size_t)p->workspace_bytes);
    size_t ws_acc = bwd_acc_bytes(B, T, NH, HS);
    size_t ws_ssum = bwd_ssum_bytes(pattern, B, T, NH);
    void *ws = NULL;
    TPD_CHECK(tpd_cuda_scratch(ctx, ws_plan + ws_acc + ws_ssum, &ws));
    char *base = (char *)ws;
    TPD_CHECK(TPD_CUDA(cudaMemsetAsync(base + ws_plan, 0, ws_acc, ctx->stream)));
    const size_t C = (size_t)NH * HS, KV = (size_t)NKV * HS;
    const tpd_bf16 *q = (const tpd_bf16 *)qkv;
    tpd_bf16 *dq = (tpd_bf16 *)dqkv;
    float scale = 1.0f / sqrtf((float)HS);
    float neg_inf = -FLT_MAX;
    float one = 1.0f;
    int32_t *seq_len = NULL;
    const int pad = sdpa_rules(T).padding_mask;
    if (pad) TPD_CHECK(seq_len_of(ctx, B, T, &seq_len));
    int64_t uids[] = {UID_Q,     UID_K,       UID_V,   UID_O,          UID_DO,
                      UID_STATS, UID_DQ,      UID_DK,  UID_DV,         UID_DQ_ACCUM,
                      UID_SCALE, UID_NEG_INF, UID_ONE, UID_SOFTMAX_SUM};
    void *ptrs[] = {(void *)q,
                    (void *)(q + C),
                    (void *)(q + C + KV),
                    (void *)out,
                    (void *)dout,
                    (void *)stats,
                    (void *)dq,
                    (void *)(dq + C),
                    (void *)(dq + C + KV),
                    (void *)(base + ws_plan),
                    &scale,
                    &neg_inf,
                    &one,
                    (void *)(base + ws_plan + ws_acc)};
    /* the older pattern has no softmax_sum tensor: the pack leaves its entry out; the
     * padding mask's two lengths (one buffer) follow */
    int n = pattern == TPD_ATTN_PATH_FUSED ? 14 : 13;
    int64_t uids_all[16];
    void *ptrs_all[16];
    memcpy(uids_all, uids, (size_t)n * sizeof uids[0]);
    memcpy(ptrs_all, ptrs, (size_t)n * sizeof ptrs[0]);
    if (pad) {
        uids_all[n] = UID_SEQ_LEN_Q;
        ptrs_all[n++] = seq_len;
        uids_all[n] = UID_SEQ_LEN_KV;
        ptrs_all[n++] = seq_len;
    }
    return execute(ctx, p, n, uids_all, ptrs_all, base);
}
