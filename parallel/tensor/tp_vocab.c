#include "parallel/tensor/tp.h"

tpd_status tpd_tp_vocab_embed_fwd(const tpd_tp_ctx *t, void *out, const int32_t *tokens,
                                  const void *wte, int N, int C, int v0, int Vl) {
    TPD_CHECK(t->kb->ops->embed_fwd(t->kb->ctx, out, tokens, wte, N, C, v0, Vl));
    /* Each token's row lives on exactly one rank; the others contributed zeros. */
    return tpd_tp_allreduce(t, out, (size_t)N * C, t->kb->act_dtype, TPD_COMM_OP_SUM);
}

tpd_status tpd_tp_vocab_embed_bwd(const tpd_tp_ctx *t, void *dwte, const void *dout,
                                  const int32_t *tokens, int N, int C, int v0, int Vl) {
    /* forward: out = allreduce(lookup_l) => each rank's rows get dout directly */
    return t->kb->ops->embed_bwd(t->kb->ctx, dwte, dout, tokens, N, C, v0, Vl);
}

tpd_status tpd_tp_vocab_xent_fwd(const tpd_tp_ctx *t, float *loss, float *stats,
                                 const void *logits, const int32_t *targets, int N, int Vl,
                                 int Vvalid, int v0) {
    const tpd_kern_ops *k = t->kb->ops;
    float *maxv = stats, *sumexp = stats + N, *tgt = stats + 2 * (size_t)N;
    TPD_CHECK(k->xent_max(t->kb->ctx, maxv, logits, N, Vl, Vvalid));
    TPD_CHECK(tpd_tp_allreduce(t, maxv, (size_t)N, TPD_DTYPE_F32, TPD_COMM_OP_MAX));
    TPD_CHECK(k->xent_sumexp(t->kb->ctx, sumexp, tgt, logits, maxv, targets, N, Vl, Vvalid, v0));
    /* sumexp and tgt are adjacent: one all-reduce for both. The target logit is non-zero
     * on the one rank that owns the target's column. */
    TPD_CHECK(tpd_tp_allreduce(t, sumexp, 2 * (size_t)N, TPD_DTYPE_F32, TPD_COMM_OP_SUM));
    return k->xent_loss(t->kb->ctx, loss, maxv, sumexp, tgt, N);
}

tpd_status tpd_tp_vocab_xent_bwd(const tpd_tp_ctx *t, void *logits, const float *stats,
                                 const int32_t *targets, float dloss, int N, int Vl,
                                 int Vvalid, int v0) {
    return t->kb->ops->xent_bwd(t->kb->ctx, logits, stats, stats + N, targets, dloss, N, Vl,
                                Vvalid, v0);
}
