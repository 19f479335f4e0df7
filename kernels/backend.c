/* The backend-independent parts of kernels.h: dtype facts, the handle's accessors and
 * teardown, and one function per op that calls the backend's table. */
#include "kernels/kernels.h"

#include <stdlib.h>

#include "kernels/kernels_internal.h"

size_t tpd_dtype_size(tpd_dtype dt) {
    switch (dt) {
    case TPD_DTYPE_F32:
        return 4;
    case TPD_DTYPE_BF16:
        return 2;
    case TPD_DTYPE_I32:
        return 4;
    case TPD_DTYPE_U8:
        return 1;
    case TPD_DTYPE_F64:
        return 8;
    }
    return 0; /* unknown dtype: a size of 0 makes any buffer computation fail loudly */
}

const char *tpd_dtype_name(tpd_dtype dt) {
    switch (dt) {
    case TPD_DTYPE_F32:
        return "f32";
    case TPD_DTYPE_BF16:
        return "bf16";
    case TPD_DTYPE_I32:
        return "i32";
    case TPD_DTYPE_U8:
        return "u8";
    case TPD_DTYPE_F64:
        return "f64";
    }
    return "unknown";
}

void tpd_kern_backend_destroy(tpd_kern_backend *backend) {
    if (backend == NULL) return;
    if (backend->ops != NULL && backend->ops->destroy != NULL) backend->ops->destroy(backend->ctx);
    free(backend);
}

const char *tpd_kern_name(const tpd_kern_backend *kb) {
    return kb->name;
}
tpd_dtype tpd_kern_act_dtype(const tpd_kern_backend *kb) {
    return kb->act_dtype;
}
tpd_dtype tpd_kern_param_dtype(const tpd_kern_backend *kb) {
    return kb->param_dtype;
}
tpd_dtype tpd_kern_grad_dtype(const tpd_kern_backend *kb) {
    return kb->grad_dtype;
}
int tpd_kern_has_master(const tpd_kern_backend *kb) {
    return kb->has_master;
}
int tpd_kern_device_memory(const tpd_kern_backend *kb) {
    return kb->device_memory;
}
void *tpd_kern_stream(const tpd_kern_backend *kb) {
    return kb->stream;
}

/* ---- ops ---- */

tpd_status tpd_kern_alloc(const tpd_kern_backend *kb, size_t bytes, void **ptr_p) {
    return kb->ops->alloc(kb->ctx, bytes, ptr_p);
}

void tpd_kern_free(const tpd_kern_backend *kb, void *ptr) {
    kb->ops->free(kb->ctx, ptr);
}

tpd_status tpd_kern_zero(const tpd_kern_backend *kb, void *ptr, size_t bytes) {
    return kb->ops->zero(kb->ctx, ptr, bytes);
}

tpd_status tpd_kern_copy_to_device(const tpd_kern_backend *kb, void *dst, const void *src,
                                   size_t bytes) {
    return kb->ops->copy_to_device(kb->ctx, dst, src, bytes);
}

tpd_status tpd_kern_copy_to_host(const tpd_kern_backend *kb, void *dst, const void *src,
                                 size_t bytes) {
    return kb->ops->copy_to_host(kb->ctx, dst, src, bytes);
}

tpd_status tpd_kern_copy(const tpd_kern_backend *kb, void *dst, const void *src, size_t bytes) {
    return kb->ops->copy(kb->ctx, dst, src, bytes);
}

tpd_status tpd_kern_copy_2d(const tpd_kern_backend *kb, void *dst, size_t dpitch, const void *src,
                            size_t spitch, size_t width, size_t rows) {
    if (rows > 1 && (width > dpitch || width > spitch))
        return tpd_fail(TPD_ERR_INVALID, "copy_2d: width %zu wider than a pitch (%zu, %zu)", width,
                        dpitch, spitch);
    if (rows == 0 || width == 0) return TPD_OK;
    return kb->ops->copy_2d(kb->ctx, dst, dpitch, src, spitch, width, rows);
}

tpd_status tpd_kern_synchronize(const tpd_kern_backend *kb) {
    return kb->ops->synchronize(kb->ctx);
}

tpd_status tpd_kern_embed_fwd(const tpd_kern_backend *kb, void *out, const int32_t *tokens,
                              const void *wte, int N, int C, int v0, int Vl) {
    return kb->ops->embed_fwd(kb->ctx, out, tokens, wte, N, C, v0, Vl);
}

tpd_status tpd_kern_embed_bwd(const tpd_kern_backend *kb, void *dwte, const void *dout,
                              const int32_t *tokens, int N, int C, int v0, int Vl) {
    return kb->ops->embed_bwd(kb->ctx, dwte, dout, tokens, N, C, v0, Vl);
}

tpd_status tpd_kern_pos_fwd(const tpd_kern_backend *kb, void *out, const void *wpe, int B, int T,
                            int C) {
    return kb->ops->pos_fwd(kb->ctx, out, wpe, B, T, C);
}

tpd_status tpd_kern_pos_bwd(const tpd_kern_backend *kb, void *dwpe, const void *dout, int B, int T,
                            int C) {
    return kb->ops->pos_bwd(kb->ctx, dwpe, dout, B, T, C);
}

tpd_status tpd_kern_layernorm_fwd(const tpd_kern_backend *kb, void *out, float *mean, float *rstd,
                                  const void *inp, const void *w, const void *b, int N, int C,
                                  double eps) {
    return kb->ops->layernorm_fwd(kb->ctx, out, mean, rstd, inp, w, b, N, C, eps);
}

tpd_status tpd_kern_layernorm_bwd(const tpd_kern_backend *kb, void *dinp, void *dw, void *db,
                                  const void *dout, const void *inp, const void *w,
                                  const float *mean, const float *rstd, int N, int C) {
    return kb->ops->layernorm_bwd(kb->ctx, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
}

tpd_status tpd_kern_matmul_fwd(const tpd_kern_backend *kb, void *out, const void *inp,
                               const void *w, const void *bias, int N, int C, int OC) {
    return kb->ops->matmul_fwd(kb->ctx, out, inp, w, bias, N, C, OC);
}

tpd_status tpd_kern_matmul_bwd(const tpd_kern_backend *kb, void *dinp, void *dw, void *dbias,
                               const void *dout, const void *inp, const void *w, int N, int C,
                               int OC) {
    return kb->ops->matmul_bwd(kb->ctx, dinp, dw, dbias, dout, inp, w, N, C, OC);
}

tpd_status tpd_kern_bias_add(const tpd_kern_backend *kb, void *out, const void *bias, int N,
                             int OC) {
    return kb->ops->bias_add(kb->ctx, out, bias, N, OC);
}

tpd_status tpd_kern_matmul_gelu_fwd(const tpd_kern_backend *kb, void *out, void *pre,
                                    const void *inp, const void *w, const void *bias, int N, int C,
                                    int OC) {
    return kb->ops->matmul_gelu_fwd(kb->ctx, out, pre, inp, w, bias, N, C, OC);
}

tpd_status tpd_kern_gelu_fwd(const tpd_kern_backend *kb, void *out, const void *inp, size_t n) {
    return kb->ops->gelu_fwd(kb->ctx, out, inp, n);
}

tpd_status tpd_kern_gelu_bwd(const tpd_kern_backend *kb, void *dinp, const void *inp,
                             const void *dout, size_t n) {
    return kb->ops->gelu_bwd(kb->ctx, dinp, inp, dout, n);
}

tpd_status tpd_kern_add(const tpd_kern_backend *kb, void *out, const void *a, const void *b,
                        size_t n) {
    return kb->ops->add(kb->ctx, out, a, b, n);
}

tpd_status tpd_kern_scale(const tpd_kern_backend *kb, void *x, float s, size_t n) {
    return kb->ops->scale(kb->ctx, x, s, n);
}

size_t tpd_kern_attention_saved_bytes(const tpd_kern_backend *kb, int B, int T, int NH, int HS) {
    return kb->ops->attention_saved_bytes(kb->ctx, B, T, NH, HS);
}

tpd_status tpd_kern_attention_fwd(const tpd_kern_backend *kb, void *out, void *saved,
                                  const void *qkv, int B, int T, int NH, int NKV, int HS) {
    return kb->ops->attention_fwd(kb->ctx, out, saved, qkv, B, T, NH, NKV, HS);
}

tpd_status tpd_kern_attention_bwd(const tpd_kern_backend *kb, void *dqkv, const void *dout,
                                  const void *qkv, const void *out, const void *saved, int B, int T,
                                  int NH, int NKV, int HS) {
    return kb->ops->attention_bwd(kb->ctx, dqkv, dout, qkv, out, saved, B, T, NH, NKV, HS);
}

static tpd_status no_block_attention(const tpd_kern_backend *kb) {
    return tpd_fail(TPD_ERR_UNSUPPORTED,
                    "backend %s: no block-wise (ring) attention: context parallelism runs on the "
                    "cpu backend",
                    kb->name);
}

static tpd_status no_moe(const tpd_kern_backend *kb) {
    return tpd_fail(TPD_ERR_UNSUPPORTED,
                    "backend %s: no token dispatch for experts: mixture-of-experts models train "
                    "on the cpu backend",
                    tpd_kern_name(kb));
}

tpd_status tpd_kern_gather_rows(const tpd_kern_backend *kb, void *out, const void *inp,
                                const int32_t *idx, int N, int C) {
    if (!kb->ops->gather_rows) return no_moe(kb);
    return kb->ops->gather_rows(kb->ctx, out, inp, idx, N, C);
}

tpd_status tpd_kern_scatter_add_rows(const tpd_kern_backend *kb, void *out, const void *inp,
                                     const int32_t *idx, int N, int C, int rows_out) {
    if (!kb->ops->scatter_add_rows) return no_moe(kb);
    return kb->ops->scatter_add_rows(kb->ctx, out, inp, idx, N, C, rows_out);
}

tpd_status tpd_kern_scale_rows(const tpd_kern_backend *kb, void *out, const void *inp,
                               const float *s, int N, int C) {
    if (!kb->ops->scale_rows) return no_moe(kb);
    return kb->ops->scale_rows(kb->ctx, out, inp, s, N, C);
}

tpd_status tpd_kern_row_dot(const tpd_kern_backend *kb, float *out, const void *a, const void *b,
                            int N, int C) {
    if (!kb->ops->row_dot) return no_moe(kb);
    return kb->ops->row_dot(kb->ctx, out, a, b, N, C);
}

tpd_status tpd_kern_grouped_matmul_fwd(const tpd_kern_backend *kb, void *out, const void *inp,
                                       const void *w, const void *bias, const int *counts, int G,
                                       int IC, int OC) {
    size_t a = tpd_dtype_size(tpd_kern_act_dtype(kb)), p = tpd_dtype_size(tpd_kern_param_dtype(kb));
    size_t row = 0;
    for (int g = 0; g < G; g++) {
        if (counts[g] > 0)
            TPD_CHECK(kb->ops->matmul_fwd(
                kb->ctx, (char *)out + row * OC * a, (const char *)inp + row * IC * a,
                (const char *)w + (size_t)g * OC * IC * p,
                bias ? (const char *)bias + (size_t)g * OC * p : NULL, counts[g], IC, OC));
        row += (size_t)(counts[g] > 0 ? counts[g] : 0);
    }
    return TPD_OK;
}

tpd_status tpd_kern_grouped_matmul_bwd(const tpd_kern_backend *kb, void *dinp, void *dw,
                                       void *dbias, const void *dout, const void *inp,
                                       const void *w, const int *counts, int G, int IC, int OC) {
    size_t a = tpd_dtype_size(tpd_kern_act_dtype(kb)), p = tpd_dtype_size(tpd_kern_param_dtype(kb));
    size_t gs = tpd_dtype_size(tpd_kern_grad_dtype(kb)), row = 0;
    for (int g = 0; g < G; g++) {
        if (counts[g] > 0)
            TPD_CHECK(kb->ops->matmul_bwd(
                kb->ctx, dinp ? (char *)dinp + row * IC * a : NULL,
                dw ? (char *)dw + (size_t)g * OC * IC * gs : NULL,
                dbias ? (char *)dbias + (size_t)g * OC * gs : NULL,
                (const char *)dout + row * OC * a, inp ? (const char *)inp + row * IC * a : NULL,
                (const char *)w + (size_t)g * OC * IC * p, counts[g], IC, OC));
        row += (size_t)(counts[g] > 0 ? counts[g] : 0);
    }
    return TPD_OK;
}

tpd_status tpd_kern_attention_block_fwd(const tpd_kern_backend *kb, float *o, float *m, float *l,
                                        const void *qkv, const void *kv, const int32_t *qpos,
                                        const int32_t *kpos, int B, int T, int Tk, int NH, int NKV,
                                        int HS) {
    if (!kb->ops->attention_block_fwd) return no_block_attention(kb);
    return kb->ops->attention_block_fwd(kb->ctx, o, m, l, qkv, kv, qpos, kpos, B, T, Tk, NH, NKV,
                                        HS);
}

tpd_status tpd_kern_attention_block_finish(const tpd_kern_backend *kb, void *out, float *lse,
                                           const float *o, const float *m, const float *l, int B,
                                           int T, int NH, int HS) {
    if (!kb->ops->attention_block_finish) return no_block_attention(kb);
    return kb->ops->attention_block_finish(kb->ctx, out, lse, o, m, l, B, T, NH, HS);
}

tpd_status tpd_kern_attention_block_bwd(const tpd_kern_backend *kb, float *dq, float *dkv,
                                        const void *dout, const void *out, const float *lse,
                                        const void *qkv, const void *kv, const int32_t *qpos,
                                        const int32_t *kpos, int B, int T, int Tk, int NH, int NKV,
                                        int HS) {
    if (!kb->ops->attention_block_bwd) return no_block_attention(kb);
    return kb->ops->attention_block_bwd(kb->ctx, dq, dkv, dout, out, lse, qkv, kv, qpos, kpos, B, T,
                                        Tk, NH, NKV, HS);
}

tpd_status tpd_kern_attention_decode(const tpd_kern_backend *kb, void *out, const void *q,
                                     const void *kcache, const void *vcache, int len, int NH,
                                     int NKV, int HS) {
    return kb->ops->attention_decode(kb->ctx, out, q, kcache, vcache, len, NH, NKV, HS);
}

/* The Llama ops are optional in a backend's table: one without them says so. */
static tpd_status missing(const tpd_kern_backend *kb, const char *op) {
    tpd_log_error("backend %s has no %s", tpd_kern_name(kb), op);
    return TPD_ERR_UNSUPPORTED;
}

tpd_status tpd_kern_rmsnorm_fwd(const tpd_kern_backend *kb, void *out, float *rstd, const void *inp,
                                const void *w, int N, int C, double eps) {
    if (!kb->ops->rmsnorm_fwd) return missing(kb, "rmsnorm_fwd");
    return kb->ops->rmsnorm_fwd(kb->ctx, out, rstd, inp, w, N, C, eps);
}

tpd_status tpd_kern_rmsnorm_bwd(const tpd_kern_backend *kb, void *dinp, void *dw, const void *dout,
                                const void *inp, const void *w, const float *rstd, int N, int C) {
    if (!kb->ops->rmsnorm_bwd) return missing(kb, "rmsnorm_bwd");
    return kb->ops->rmsnorm_bwd(kb->ctx, dinp, dw, dout, inp, w, rstd, N, C);
}

tpd_status tpd_kern_qk_norm_fwd(const tpd_kern_backend *kb, void *qkv, void *raw, float *rstd,
                                const void *wq, const void *wk, int N, int NH, int NKV, int HS,
                                double eps) {
    if (!kb->ops->qk_norm_fwd) return missing(kb, "qk_norm_fwd");
    return kb->ops->qk_norm_fwd(kb->ctx, qkv, raw, rstd, wq, wk, N, NH, NKV, HS, eps);
}

tpd_status tpd_kern_qk_norm_bwd(const tpd_kern_backend *kb, void *dqkv, void *dwq, void *dwk,
                                const void *raw, const void *wq, const void *wk, const float *rstd,
                                int N, int NH, int NKV, int HS) {
    if (!kb->ops->qk_norm_bwd) return missing(kb, "qk_norm_bwd");
    return kb->ops->qk_norm_bwd(kb->ctx, dqkv, dwq, dwk, raw, wq, wk, rstd, N, NH, NKV, HS);
}

tpd_status tpd_kern_rope_scaled_fwd(const tpd_kern_backend *kb, void *qkv, int B, int T, int NH,
                                    int NKV, int HS, const tpd_rope *rope, int pos0) {
    if (!kb->ops->rope_fwd) return missing(kb, "rope_fwd");
    return kb->ops->rope_fwd(kb->ctx, qkv, B, T, NH, NKV, HS, rope, pos0);
}

tpd_status tpd_kern_rope_scaled_bwd(const tpd_kern_backend *kb, void *dqkv, int B, int T, int NH,
                                    int NKV, int HS, const tpd_rope *rope, int pos0) {
    if (!kb->ops->rope_bwd) return missing(kb, "rope_bwd");
    return kb->ops->rope_bwd(kb->ctx, dqkv, B, T, NH, NKV, HS, rope, pos0);
}

tpd_status tpd_kern_rope_fwd(const tpd_kern_backend *kb, void *qkv, int B, int T, int NH, int NKV,
                             int HS, float base, int pos0) {
    tpd_rope r = {base, 0, 0, 0, 0};
    return tpd_kern_rope_scaled_fwd(kb, qkv, B, T, NH, NKV, HS, &r, pos0);
}

tpd_status tpd_kern_rope_bwd(const tpd_kern_backend *kb, void *dqkv, int B, int T, int NH, int NKV,
                             int HS, float base, int pos0) {
    tpd_rope r = {base, 0, 0, 0, 0};
    return tpd_kern_rope_scaled_bwd(kb, dqkv, B, T, NH, NKV, HS, &r, pos0);
}

tpd_status tpd_kern_swiglu_fwd(const tpd_kern_backend *kb, void *out, const void *inp, int N,
                               int F) {
    if (!kb->ops->swiglu_fwd) return missing(kb, "swiglu_fwd");
    return kb->ops->swiglu_fwd(kb->ctx, out, inp, N, F);
}

tpd_status tpd_kern_swiglu_bwd(const tpd_kern_backend *kb, void *dinp, const void *inp,
                               const void *dout, int N, int F) {
    if (!kb->ops->swiglu_bwd) return missing(kb, "swiglu_bwd");
    return kb->ops->swiglu_bwd(kb->ctx, dinp, inp, dout, N, F);
}

tpd_status tpd_kern_xent_max(const tpd_kern_backend *kb, float *maxv, const void *logits, int N,
                             int Vl, int Vvalid) {
    return kb->ops->xent_max(kb->ctx, maxv, logits, N, Vl, Vvalid);
}

tpd_status tpd_kern_xent_sumexp(const tpd_kern_backend *kb, float *sumexp, float *tgt,
                                const void *logits, const float *maxv, const int32_t *targets,
                                int N, int Vl, int Vvalid, int v0) {
    return kb->ops->xent_sumexp(kb->ctx, sumexp, tgt, logits, maxv, targets, N, Vl, Vvalid, v0);
}

tpd_status tpd_kern_xent_loss(const tpd_kern_backend *kb, float *loss, const float *maxv,
                              const float *sumexp, const float *tgt, int N) {
    return kb->ops->xent_loss(kb->ctx, loss, maxv, sumexp, tgt, N);
}

tpd_status tpd_kern_xent_bwd(const tpd_kern_backend *kb, void *logits, const float *maxv,
                             const float *sumexp, const int32_t *targets, float dloss, int N,
                             int Vl, int Vvalid, int v0) {
    return kb->ops->xent_bwd(kb->ctx, logits, maxv, sumexp, targets, dloss, N, Vl, Vvalid, v0);
}

tpd_status tpd_kern_sum_f32(const tpd_kern_backend *kb, const float *x, size_t n, double *sum_p) {
    return kb->ops->sum_f32(kb->ctx, x, n, sum_p);
}

tpd_status tpd_kern_adamw(const tpd_kern_backend *kb, void *param, float *master, const void *grad,
                          float *m, float *v, size_t n, float lr, float beta1, float beta2,
                          float eps, float weight_decay, int step, float grad_scale) {
    return kb->ops->adamw(kb->ctx, param, master, grad, m, v, n, lr, beta1, beta2, eps,
                          weight_decay, step, grad_scale);
}

tpd_status tpd_kern_sgd(const tpd_kern_backend *kb, void *param, float *master, const void *grad,
                        size_t n, float lr, float weight_decay, float grad_scale) {
    return kb->ops->sgd(kb->ctx, param, master, grad, n, lr, weight_decay, grad_scale);
}

tpd_status tpd_kern_grad_acc(const tpd_kern_backend *kb, void *dst, const void *src, size_t n) {
    return kb->ops->grad_acc(kb->ctx, dst, src, n);
}

tpd_status tpd_kern_outer_delta(const tpd_kern_backend *kb, float *delta, const float *sync,
                                const float *w, size_t n) {
    return kb->ops->outer_delta(kb->ctx, delta, sync, w, n);
}

tpd_status tpd_kern_outer_nesterov(const tpd_kern_backend *kb, void *param, float *master,
                                   float *sync, float *mom, const float *delta, size_t n, float lr,
                                   float momentum, float scale) {
    return kb->ops->outer_nesterov(kb->ctx, param, master, sync, mom, delta, n, lr, momentum,
                                   scale);
}

tpd_status tpd_kern_sumsq(const tpd_kern_backend *kb, const void *x, tpd_dtype dt, size_t n,
                          double *sumsq_p) {
    return kb->ops->sumsq(kb->ctx, x, dt, n, sumsq_p);
}

tpd_status tpd_kern_sumsq_acc(const tpd_kern_backend *kb, const void *x, tpd_dtype dt, size_t n) {
    return kb->ops->sumsq_acc(kb->ctx, x, dt, n);
}

tpd_status tpd_kern_sumsq_take(const tpd_kern_backend *kb, double *sumsq_p) {
    return kb->ops->sumsq_take(kb->ctx, sumsq_p);
}

tpd_status tpd_kern_cast(const tpd_kern_backend *kb, void *dst, tpd_dtype dst_dt, const void *src,
                         tpd_dtype src_dt, size_t n) {
    return kb->ops->cast(kb->ctx, dst, dst_dt, src, src_dt, n);
}

/* ---- scratch reservation, host staging, events, the loss accumulator ---- */

tpd_status tpd_kern_scratch_reserve(const tpd_kern_backend *kb, const tpd_kern_shapes *s,
                                    size_t *bytes_p) {
    return kb->ops->scratch_reserve(kb->ctx, s, bytes_p);
}

tpd_status tpd_kern_host_alloc(const tpd_kern_backend *kb, size_t bytes, void **ptr_p) {
    return kb->ops->host_alloc(kb->ctx, bytes, ptr_p);
}

void tpd_kern_host_free(const tpd_kern_backend *kb, void *ptr) {
    kb->ops->host_free(kb->ctx, ptr);
}

tpd_status tpd_kern_copy_to_device_async(const tpd_kern_backend *kb, void *dst, const void *src,
                                         size_t bytes) {
    return kb->ops->copy_to_device_async(kb->ctx, dst, src, bytes);
}

tpd_status tpd_kern_event_create(const tpd_kern_backend *kb, void **event_p) {
    return kb->ops->event_create(kb->ctx, event_p);
}

void tpd_kern_event_destroy(const tpd_kern_backend *kb, void *event) {
    kb->ops->event_destroy(kb->ctx, event);
}

tpd_status tpd_kern_event_record(const tpd_kern_backend *kb, void *event) {
    return kb->ops->event_record(kb->ctx, event);
}

tpd_status tpd_kern_event_wait(const tpd_kern_backend *kb, void *event) {
    return kb->ops->event_wait(kb->ctx, event);
}

tpd_status tpd_kern_sum_f32_acc(const tpd_kern_backend *kb, double *acc, const float *x, size_t n,
                                double div) {
    return kb->ops->sum_f32_acc(kb->ctx, acc, x, n, div);
}
