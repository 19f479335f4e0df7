#include "parallel/tensor/tp.h"

#include "base/clock.h"

/* Runs a timed TP collective; the call itself is the expression `call`. */
#define TP_TIMED(t, call)                                                                          \
    do {                                                                                           \
        double t0_ = (t)->comm_s ? tpd_clock_s() : 0;                                              \
        tpd_status st_ = (call);                                                                   \
        if ((t)->comm_s) *(t)->comm_s += tpd_clock_s() - t0_;                                      \
        TPD_CHECK(st_);                                                                            \
    } while (0)

tpd_status tpd_tp_allreduce(const tpd_tp_ctx *t, void *buf, size_t count, tpd_dtype dt,
                            tpd_comm_op op) {
    if (!t->tp || tpd_comm_size(t->tp) == 1) return TPD_OK;
    TP_TIMED(t, tpd_comm_allreduce(t->tp, buf, buf, count, dt, op, tpd_kern_stream(t->kb)));
    return TPD_OK;
}

static tpd_status tp_allreduce(const tpd_tp_ctx *t, void *buf, size_t count) {
    return tpd_tp_allreduce(t, buf, count, tpd_kern_act_dtype(t->kb), TPD_COMM_OP_SUM);
}

tpd_status tpd_tp_column_fwd(const tpd_tp_ctx *t, void *out, const void *inp, const void *w,
                             const void *b, int N, int C, int OCl) {
    return tpd_kern_matmul_fwd(t->kb, out, inp, w, b, N, C, OCl);
}

tpd_status tpd_tp_column_gelu_fwd(const tpd_tp_ctx *t, void *out, void *pre, const void *inp,
                                  const void *w, const void *b, int N, int C, int OCl) {
    return tpd_kern_matmul_gelu_fwd(t->kb, out, pre, inp, w, b, N, C, OCl);
}

tpd_status tpd_tp_column_bwd(const tpd_tp_ctx *t, void *dinp, void *dw, void *db, const void *dout,
                             const void *inp, const void *w, int N, int C, int OCl) {
    /* forward: out_l = inp @ w_l^T  =>  dinp = sum over TP ranks of dout_l @ w_l */
    TPD_CHECK(tpd_kern_matmul_bwd(t->kb, dinp, dw, db, dout, inp, w, N, C, OCl));
    return tp_allreduce(t, dinp, (size_t)N * C);
}

tpd_status tpd_tp_row_fwd(const tpd_tp_ctx *t, void *out, const void *inp, const void *w,
                          const void *b, int N, int Cl, int OC) {
    /* The bias is added once, after the partial products are summed. */
    TPD_CHECK(tpd_kern_matmul_fwd(t->kb, out, inp, w, NULL, N, Cl, OC));
    TPD_CHECK(tp_allreduce(t, out, (size_t)N * OC));
    return b ? tpd_kern_bias_add(t->kb, out, b, N, OC) : TPD_OK;
}

tpd_status tpd_tp_row_bwd(const tpd_tp_ctx *t, void *dinp, void *dw, void *db, const void *dout,
                          const void *inp, const void *w, int N, int Cl, int OC) {
    /* forward: out = allreduce(inp_l @ w_l^T) + b, an identity in the backward */
    return tpd_kern_matmul_bwd(t->kb, dinp, dw, db, dout, inp, w, N, Cl, OC);
}

tpd_status tpd_tp_reduce_rows(const tpd_tp_ctx *t, void *out, void *partial, int N, int C, int sp) {
    size_t a = tpd_dtype_size(tpd_kern_act_dtype(t->kb));
    if (!sp) {
        if (out != partial) TPD_CHECK(tpd_kern_copy(t->kb, out, partial, (size_t)N * C * a));
        return tp_allreduce(t, out, (size_t)N * C);
    }
    TP_TIMED(t, tpd_comm_reduce_scatter(t->tp, partial, out, (size_t)(N / tpd_comm_size(t->tp)) * C,
                                        tpd_kern_act_dtype(t->kb), TPD_COMM_OP_SUM,
                                        tpd_kern_stream(t->kb)));
    return TPD_OK;
}

tpd_status tpd_tp_sp_gather(const tpd_tp_ctx *t, void *full, const void *local, int N, int C) {
    size_t block = (size_t)N / (size_t)tpd_comm_size(t->tp) * (size_t)C;
    TP_TIMED(t, tpd_comm_allgather(t->tp, local, full, block, tpd_kern_act_dtype(t->kb),
                                   tpd_kern_stream(t->kb)));
    return TPD_OK;
}

tpd_status tpd_tp_row_fwd_sp(const tpd_tp_ctx *t, void *out, void *scratch, const void *inp,
                             const void *w, const void *b, int N, int Cl, int OC) {
    int Nl = N / tpd_comm_size(t->tp);
    /* forward: out = rows of reduce_scatter(inp_l @ w_l^T), then the bias once */
    TPD_CHECK(tpd_kern_matmul_fwd(t->kb, scratch, inp, w, NULL, N, Cl, OC));
    TP_TIMED(t, tpd_comm_reduce_scatter(t->tp, scratch, out, (size_t)Nl * OC,
                                        tpd_kern_act_dtype(t->kb), TPD_COMM_OP_SUM,
                                        tpd_kern_stream(t->kb)));
    return b ? tpd_kern_bias_add(t->kb, out, b, Nl, OC) : TPD_OK;
}

tpd_status tpd_tp_column_bwd_sp(const tpd_tp_ctx *t, void *dinp, void *scratch, void *dw, void *db,
                                const void *dout, const void *inp_full, const void *w, int N, int C,
                                int OCl) {
    /* forward: out_l = allgather(inp) @ w_l^T  =>  dinp = my rows of the sum over TP
     * ranks of dout_l @ w_l */
    TPD_CHECK(tpd_kern_matmul_bwd(t->kb, scratch, dw, db, dout, inp_full, w, N, C, OCl));
    TP_TIMED(t, tpd_comm_reduce_scatter(
                    t->tp, scratch, dinp, (size_t)(N / tpd_comm_size(t->tp)) * C,
                    tpd_kern_act_dtype(t->kb), TPD_COMM_OP_SUM, tpd_kern_stream(t->kb)));
    return TPD_OK;
}
