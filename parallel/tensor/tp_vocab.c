#include "parallel/tensor/tp.h"

tpd_status tpd_tp_vocab_embed_fwd(const tpd_tp_ctx *t, void *out, const int32_t *tokens,
                                  const void *wte, int N, int C, int v0, int Vl) {
    TPD_CHECK(tpd_kern_embed_fwd(t->kb, out, tokens, wte, N, C, v0, Vl));
    /* Each token's row lives on exactly one rank; the others contributed zeros. */
    return tpd_tp_allreduce(t, out, (size_t)N * C, tpd_kern_act_dtype(t->kb), TPD_COMM_OP_SUM);
}

tpd_status tpd_tp_vocab_embed_bwd(const tpd_tp_ctx *t, void *dwte, const void *dout,
                                  const int32_t *tokens, int N, int C, int v0, int Vl) {
    /* forward: out = allreduce(lookup_l) => each rank's rows get dout directly */
    return tpd_kern_embed_bwd(t->kb, dwte, dout, tokens, N, C, v0, Vl);
}

tpd_status tpd_tp_vocab_xent_fwd(const tpd_tp_ctx *t, float *loss, float *stats, const void *logits,
                                 const int32_t *targets, int N, int Vl, int Vvalid, int v0) {
    float *maxv = stats, *sumexp = stats + N, *tgt = stats + 2 * (size_t)N;
    TPD_CHECK(tpd_kern_xent_max(t->kb, maxv, logits, N, Vl, Vvalid));
    TPD_CHECK(tpd_tp_allreduce(t, maxv, (size_t)N, TPD_DTYPE_F32, TPD_COMM_OP_MAX));
    TPD_CHECK(tpd_kern_xent_sumexp(t->kb, sumexp, tgt, logits, maxv, targets, N, Vl, Vvalid, v0));
    /* sumexp and tgt are adjacent: one all-reduce for both. The target logit is non-zero
     * on the one rank that owns the target's column. */
    TPD_CHECK(tpd_tp_allreduce(t, sumexp, 2 * (size_t)N, TPD_DTYPE_F32, TPD_COMM_OP_SUM));
    return tpd_kern_xent_loss(t->kb, loss, maxv, sumexp, tgt, N);
}

tpd_status tpd_tp_vocab_xent_bwd(const tpd_tp_ctx *t, void *logits, const float *stats,
                                 const int32_t *targets, float dloss, int N, int Vl, int Vvalid,
                                 int v0) {
    return tpd_kern_xent_bwd(t->kb, logits, stats, stats + N, targets, dloss, N, Vl, Vvalid, v0);
}
