/* Tensor-parallel layers (Megatron): each is a kernel call plus the collective that makes
 * the split exact. The conjugate pairs:
 *   column-parallel linear: forward identity, backward all-reduce of dinp;
 *   row-parallel linear:    forward all-reduce of the partial outputs, backward identity;
 *   vocab-parallel embedding: forward all-reduce of the partial lookups;
 *   vocab-parallel cross-entropy: all-reduce of the row max, then of sum-exp and target
 *   logit; the full logits are never gathered.
 * With a TP communicator of size 1 every collective is skipped. Collectives run on the
 * backend's compute stream, in the backend's activation dtype.
 *
 * Sequence parallel (Korthikanti et al.): between the linear layers each TP rank keeps
 * only its Nl = N/tp consecutive rows (rows tp_rank*Nl ...). The forward all-reduce of a
 * row-parallel layer becomes a reduce-scatter to those rows, and the input of a
 * column-parallel layer is all-gathered from them; in the backward the two swap. */
#ifndef TPD_PARALLEL_TENSOR_TP_H
#define TPD_PARALLEL_TENSOR_TP_H

#include "kernels/kernels.h"
#include "parallel/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tpd_tp_ctx {
    const tpd_kern_backend *kb;
    tpd_comm *tp;
    double *comm_s; /* optional: seconds spent in TP collectives are added here */
} tpd_tp_ctx;

/* In-place all-reduce over the TP group (no-op for one rank), timed into comm_s. On
 * backends with streams the time is that of enqueueing unless the comm synchronizes. */
tpd_status tpd_tp_allreduce(const tpd_tp_ctx *t, void *buf, size_t count, tpd_dtype dt,
                            tpd_comm_op op);

/* out(N,OCl) = inp(N,C) @ w(OCl,C)^T + b(OCl). */
tpd_status tpd_tp_column_fwd(const tpd_tp_ctx *t, void *out, const void *inp, const void *w,
                             const void *b, int N, int C, int OCl);
/* pre(N,OCl) = inp @ w^T + b; out = gelu(pre). */
tpd_status tpd_tp_column_gelu_fwd(const tpd_tp_ctx *t, void *out, void *pre, const void *inp,
                                  const void *w, const void *b, int N, int C, int OCl);
/* dinp(N,C) = all-reduce over TP of dout(N,OCl) @ w; dw += dout^T inp; db += colsum. */
tpd_status tpd_tp_column_bwd(const tpd_tp_ctx *t, void *dinp, void *dw, void *db, const void *dout,
                             const void *inp, const void *w, int N, int C, int OCl);
/* out(N,OC) = all-reduce over TP of inp(N,Cl) @ w(OC,Cl)^T, then + b(OC). */
tpd_status tpd_tp_row_fwd(const tpd_tp_ctx *t, void *out, const void *inp, const void *w,
                          const void *b, int N, int Cl, int OC);
/* dinp(N,Cl) = dout(N,OC) @ w; dw += dout^T inp; db += colsum(dout) (dout is replicated,
 * so db is identical on every TP rank). */
tpd_status tpd_tp_row_bwd(const tpd_tp_ctx *t, void *dinp, void *dw, void *db, const void *dout,
                          const void *inp, const void *w, int N, int Cl, int OC);

/* out = the TP sum of partial(N,C): all N rows (out may be partial itself), or under
 * sequence parallel (sp) this rank's N/tp rows (a reduce-scatter; out is not partial). */
tpd_status tpd_tp_reduce_rows(const tpd_tp_ctx *t, void *out, void *partial, int N, int C, int sp);

/* Sequence parallel. full(N,C) = rows of every rank's local(N/tp,C), in rank order. */
tpd_status tpd_tp_sp_gather(const tpd_tp_ctx *t, void *full, const void *local, int N, int C);
/* out(N/tp,C) = this rank's rows of reduce-scatter over TP of inp(N,Cl) @ w(OC,Cl)^T, then
 * + b. scratch (N,OC) holds the partial product. */
tpd_status tpd_tp_row_fwd_sp(const tpd_tp_ctx *t, void *out, void *scratch, const void *inp,
                             const void *w, const void *b, int N, int Cl, int OC);
/* inp_full(N,C) is the all-gathered input of the forward. dinp(N/tp,C) = this rank's rows
 * of reduce-scatter over TP of dout(N,OCl) @ w; scratch (N,C) holds the partial product;
 * dw += dout^T inp_full; db += colsum. */
tpd_status tpd_tp_column_bwd_sp(const tpd_tp_ctx *t, void *dinp, void *scratch, void *dw, void *db,
                                const void *dout, const void *inp_full, const void *w, int N, int C,
                                int OCl);

/* out(N,C) = all-reduce of this rank's lookups of tokens in [v0, v0+Vl). */
tpd_status tpd_tp_vocab_embed_fwd(const tpd_tp_ctx *t, void *out, const int32_t *tokens,
                                  const void *wte, int N, int C, int v0, int Vl);
/* dwte(Vl,C) += rows of dout(N,C) for this rank's tokens (dout is replicated). */
tpd_status tpd_tp_vocab_embed_bwd(const tpd_tp_ctx *t, void *dwte, const void *dout,
                                  const int32_t *tokens, int N, int C, int v0, int Vl);

/* Vocab-parallel cross-entropy forward. logits(N,Vl) hold global columns [v0, v0+Vl), of
 * which Vvalid are real. stats is fp32 scratch of 3N: maxv(N), sumexp(N), tgt(N), kept
 * for the backward. loss(N) fp32 per token. */
tpd_status tpd_tp_vocab_xent_fwd(const tpd_tp_ctx *t, float *loss, float *stats, const void *logits,
                                 const int32_t *targets, int N, int Vl, int Vvalid, int v0);
/* In place: logits become dlogits = (softmax - onehot) * dloss (padded columns 0). */
tpd_status tpd_tp_vocab_xent_bwd(const tpd_tp_ctx *t, void *logits, const float *stats,
                                 const int32_t *targets, float dloss, int N, int Vl, int Vvalid,
                                 int v0);

#ifdef __cplusplus
}
#endif
#endif
