/* Forward and backward of one micro-batch on one stage. Each backward block quotes the
 * forward line it differentiates. Shapes: N = B*T rows, C hidden, Cl = C/tp, Fl = F/tp,
 * Vl = Vp/tp; Nl = N, or N/tp under sequence parallel: the rows of the LayerNorm and
 * residual regions that this rank keeps. Under SP, "gather" is the all-gather of those
 * rows into the (N,C) block w_gath, and the row-parallel all-reduce becomes a
 * reduce-scatter (parallel/tensor/tp.h). */
#include "engine/model/model.h"

typedef struct views {
    /* params and grads of layer l (set by layer_views) */
    void *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw,
        *fcprojb;
} views;

static void *pview(const tpd_model *m, void *base, size_t esize, tpd_param p, int l) {
    const tpd_param_slice *s = &m->plan.lay.p[p];
    return (char *)base + (s->offset + (size_t)l * s->rows * s->cols) * esize;
}

static void layer_views(const tpd_model *m, void *base, size_t es, int l, views *v) {
    v->ln1w = pview(m, base, es, TPD_P_LN1W, l);
    v->ln1b = pview(m, base, es, TPD_P_LN1B, l);
    v->qkvw = pview(m, base, es, TPD_P_QKVW, l);
    v->qkvb = pview(m, base, es, TPD_P_QKVB, l);
    v->attprojw = pview(m, base, es, TPD_P_ATTPROJW, l);
    v->attprojb = pview(m, base, es, TPD_P_ATTPROJB, l);
    v->ln2w = pview(m, base, es, TPD_P_LN2W, l);
    v->ln2b = pview(m, base, es, TPD_P_LN2B, l);
    v->fcw = pview(m, base, es, TPD_P_FCW, l);
    v->fcb = pview(m, base, es, TPD_P_FCB, l);
    v->fcprojw = pview(m, base, es, TPD_P_FCPROJW, l);
    v->fcprojb = pview(m, base, es, TPD_P_FCPROJB, l);
}

static char *slot_base(const tpd_model *m, int slot) {
    return m->acts + (size_t)slot * m->plan.slot_bytes;
}

typedef struct acts {
    void *ln1, *qkv, *atty, *att, *x1, *ln2, *fch, *fch_gelu, *out;
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd;
} acts;

/* Layer l's activations of a slot. For a recomputed layer (l < plan.recompute) they live
 * in the one shared layer block, and only the layer output is the slot's own. */
static void layer_acts(const tpd_model *m, int slot, int l, acts *a) {
    const tpd_act_layer *o = &m->plan.layer;
    int rc = l < m->plan.recompute;
    char *b =
        rc ? m->ws + m->plan.w_layer
           : slot_base(m, slot) + m->plan.s_layers + (size_t)(l - m->plan.recompute) * o->bytes;
    a->ln1 = b + o->ln1;
    a->ln1_mean = (float *)(b + o->ln1_mean);
    a->ln1_rstd = (float *)(b + o->ln1_rstd);
    a->qkv = b + o->qkv;
    a->atty = b + o->atty;
    a->att = m->plan.selective ? m->ws + m->plan.w_att : b + o->att;
    a->x1 = b + o->x1;
    a->ln2 = b + o->ln2;
    a->ln2_mean = (float *)(b + o->ln2_mean);
    a->ln2_rstd = (float *)(b + o->ln2_rstd);
    a->fch = b + o->fch;
    a->fch_gelu = b + o->fch_gelu;
    a->out = b + o->out;
    if (rc) {
        size_t nc = (size_t)m->d.Nl * m->d.C * m->plan.act_size;
        size_t stride = (nc + 255) / 256 * 256; /* the buffer plan's alignment */
        a->out = slot_base(m, slot) + m->plan.s_outs + (size_t)l * stride;
    }
}

/* Under SP: full(N,C) = all-gather of local(Nl,C); else full is local. */
static tpd_status sp_full(tpd_model *m, const void **full, const void *local) {
    if (!m->d.sp) {
        *full = local;
        return TPD_OK;
    }
    void *g = m->ws + m->plan.w_gath;
    TPD_CHECK(tpd_tp_sp_gather(&m->tp, g, local, m->d.B * m->d.T, m->d.C));
    *full = g;
    return TPD_OK;
}

/* Row-parallel linear into the residual region: out(Nl,C) = sum over TP of
 * inp(N,Kl) @ w^T, all-reduced, or reduce-scattered to this rank's rows under SP; + b. */
static tpd_status row_fwd(tpd_model *m, void *out, const void *inp, const void *w, const void *b,
                          int Kl) {
    int N = m->d.B * m->d.T;
    if (m->d.sp)
        return tpd_tp_row_fwd_sp(&m->tp, out, m->ws + m->plan.w_gath, inp, w, b, N, Kl, m->d.C);
    return tpd_tp_row_fwd(&m->tp, out, inp, w, b, N, Kl, m->d.C);
}

/* Column-parallel backward whose input came from the residual region: dinp_p is set to
 * the (Nl,C) gradient of the LayerNorm output `ln` (local rows), re-gathered under SP. */
static tpd_status column_bwd(tpd_model *m, void **dinp_p, void *dw, void *db, const void *dout,
                             const void *ln, const void *w, int OCl) {
    int N = m->d.B * m->d.T, C = m->d.C;
    void *dln = m->ws + m->plan.w_dln;
    if (!m->d.sp) {
        *dinp_p = dln;
        return tpd_tp_column_bwd(&m->tp, dln, dw, db, dout, ln, w, N, C, OCl);
    }
    const void *full;
    TPD_CHECK(sp_full(m, &full, ln));
    *dinp_p = m->ws + m->plan.w_dlnl;
    return tpd_tp_column_bwd_sp(&m->tp, *dinp_p, dln, dw, db, dout, full, w, N, C, OCl);
}

/* One transformer layer forward: inp (Nl,C) -> a->out (Nl,C), keeping in `a` what the
 * backward needs. */
static tpd_status layer_fwd(tpd_model *m, const views *w, const acts *a, const void *inp) {
    const tpd_model_dims *d = &m->d;
    const tpd_tp_ctx *tp = &m->tp;
    int N = d->B * d->T, Nl = d->Nl, C = d->C;
    const void *full;
    /* ln1 = LN(inp); qkv = gather(ln1) @ qkvw^T + qkvb (column-parallel, whole heads) */
    TPD_CHECK(tpd_kern_layernorm_fwd(m->kb, a->ln1, a->ln1_mean, a->ln1_rstd, inp, w->ln1w, w->ln1b,
                                     Nl, C));
    TPD_CHECK(sp_full(m, &full, a->ln1));
    TPD_CHECK(tpd_tp_column_fwd(tp, a->qkv, full, w->qkvw, w->qkvb, N, C, 3 * d->Cl));
    /* atty = causal_attention(qkv) on the local heads */
    TPD_CHECK(tpd_kern_attention_fwd(m->kb, a->atty, a->att, a->qkv, d->B, d->T, d->NHl, d->HS));
    /* x1 = inp + reduce(atty @ attprojw^T) + attprojb (row-parallel) */
    TPD_CHECK(row_fwd(m, a->x1, a->atty, w->attprojw, w->attprojb, d->Cl));
    TPD_CHECK(tpd_kern_add(m->kb, a->x1, a->x1, inp, (size_t)Nl * C));
    /* ln2 = LN(x1); fch_gelu = gelu(gather(ln2) @ fcw^T + fcb) (column-parallel) */
    TPD_CHECK(tpd_kern_layernorm_fwd(m->kb, a->ln2, a->ln2_mean, a->ln2_rstd, a->x1, w->ln2w,
                                     w->ln2b, Nl, C));
    TPD_CHECK(sp_full(m, &full, a->ln2));
    TPD_CHECK(tpd_tp_column_gelu_fwd(tp, a->fch_gelu, a->fch, full, w->fcw, w->fcb, N, C, d->Fl));
    /* out = x1 + reduce(fch_gelu @ fcprojw^T) + fcprojb (row-parallel) */
    TPD_CHECK(row_fwd(m, a->out, a->fch_gelu, w->fcprojw, w->fcprojb, d->Fl));
    return tpd_kern_add(m->kb, a->out, a->out, a->x1, (size_t)Nl * C);
}

void *tpd_model_stage_input(const tpd_model *m, int slot) {
    return slot_base(m, slot) + m->plan.s_x0;
}

void *tpd_model_stage_output(const tpd_model *m, int slot) {
    acts a;
    layer_acts(m, slot, m->d.Ls - 1, &a);
    return a.out;
}

void *tpd_model_grad_in(const tpd_model *m) {
    return m->ws + m->plan.w_dres;
}

void *tpd_model_grad_out(const tpd_model *m) {
    return m->d.first ? NULL : m->ws + m->plan.w_dsend;
}

tpd_status tpd_model_forward(tpd_model *m, int slot) {
    const tpd_model_dims *d = &m->d;
    const tpd_tp_ctx *tp = &m->tp;
    char *s = slot_base(m, slot);
    int N = d->B * d->T, C = d->C;
    const int32_t *tokens = (const int32_t *)(s + m->plan.s_tokens);
    void *x0 = s + m->plan.s_x0;
    size_t es = m->plan.param_size;

    if (d->first) {
        /* x0 = wte[tokens] + wpe[t] (vocab-parallel lookup, summed over TP); under SP
         * built whole in w_gath, and this rank keeps its rows */
        void *emb = d->sp ? m->ws + m->plan.w_gath : x0;
        TPD_CHECK(tpd_tp_vocab_embed_fwd(tp, emb, tokens, tpd_model_param(m, TPD_P_WTE), N, C,
                                         d->v0, d->Vl));
        TPD_CHECK(tpd_kern_pos_fwd(m->kb, emb, tpd_model_param(m, TPD_P_WPE), d->B, d->T, C));
        if (d->sp) {
            size_t rows = (size_t)d->Nl * C * m->plan.act_size;
            TPD_CHECK(tpd_kern_copy(m->kb, x0, (char *)emb + (size_t)d->tp_rank * rows, rows));
        }
    }
    const void *inp = x0;
    for (int l = 0; l < d->Ls; l++) {
        views w;
        acts a;
        layer_views(m, m->params, es, l, &w);
        layer_acts(m, slot, l, &a);
        TPD_CHECK(layer_fwd(m, &w, &a, inp));
        inp = a.out;
    }
    if (d->last) {
        void *lnf = s + m->plan.s_lnf, *logits = s + m->plan.s_logits;
        float *mean = (float *)(s + m->plan.s_lnf_mean), *rstd = (float *)(s + m->plan.s_lnf_rstd);
        const int32_t *targets = (const int32_t *)(s + m->plan.s_targets);
        /* lnf = LN_f(inp); logits = gather(lnf) @ wte^T (tied head, vocab-parallel
         * columns) */
        TPD_CHECK(tpd_kern_layernorm_fwd(m->kb, lnf, mean, rstd, inp,
                                         tpd_model_param(m, TPD_P_LNFW),
                                         tpd_model_param(m, TPD_P_LNFB), d->Nl, C));
        const void *full;
        TPD_CHECK(sp_full(m, &full, lnf));
        TPD_CHECK(
            tpd_tp_column_fwd(tp, logits, full, tpd_model_param(m, TPD_P_WTE), NULL, N, C, d->Vl));
        /* loss = -log softmax(logits)[target], padded columns excluded */
        TPD_CHECK(tpd_tp_vocab_xent_fwd(tp, (float *)(s + m->plan.s_loss),
                                        (float *)(s + m->plan.s_xstats), logits, targets, N, d->Vl,
                                        d->Vvalid, d->v0));
    }
    return TPD_OK;
}

tpd_status tpd_model_loss_sum(tpd_model *m, int slot, double *sum_p) {
    if (!m->d.last) {
        *sum_p = 0;
        return TPD_OK;
    }
    const float *loss = (const float *)(slot_base(m, slot) + m->plan.s_loss);
    return tpd_kern_sum_f32(m->kb, loss, (size_t)m->d.B * m->d.T, sum_p);
}

tpd_status tpd_model_backward(tpd_model *m, int slot, float dloss) {
    const tpd_model_dims *d = &m->d;
    const tpd_tp_ctx *tp = &m->tp;
    char *s = slot_base(m, slot);
    int N = d->B * d->T, Nl = d->Nl, C = d->C;
    size_t NC = (size_t)Nl * C, es = m->plan.param_size, gs = m->plan.grad_size;
    void *dres = m->ws + m->plan.w_dres, *dtmp = m->ws + m->plan.w_dtmp;
    void *dln, *dqkv = m->ws + m->plan.w_dqkv;
    void *datty = m->ws + m->plan.w_datty, *dfch = m->ws + m->plan.w_dfch;
    void *x0 = s + m->plan.s_x0;

    if (d->last) {
        void *lnf = s + m->plan.s_lnf, *logits = s + m->plan.s_logits;
        const float *mean = (const float *)(s + m->plan.s_lnf_mean);
        const float *rstd = (const float *)(s + m->plan.s_lnf_rstd);
        const int32_t *targets = (const int32_t *)(s + m->plan.s_targets);
        acts last;
        layer_acts(m, slot, d->Ls - 1, &last);
        /* loss = xent(logits): dlogits = (softmax - onehot) * dloss, in place */
        TPD_CHECK(tpd_tp_vocab_xent_bwd(tp, logits, (const float *)(s + m->plan.s_xstats), targets,
                                        dloss, N, d->Vl, d->Vvalid, d->v0));
        /* logits = gather(lnf) @ wte^T: dlnf = reduce(dlogits @ wte);
         * dwte += dlogits^T gather(lnf) */
        TPD_CHECK(column_bwd(m, &dln, tpd_model_grad(m, TPD_P_WTE), NULL, logits, lnf,
                             tpd_model_param(m, TPD_P_WTE), d->Vl));
        /* lnf = LN_f(out_last) */
        TPD_CHECK(tpd_kern_layernorm_bwd(m->kb, dres, tpd_model_grad(m, TPD_P_LNFW),
                                         tpd_model_grad(m, TPD_P_LNFB), dln, last.out,
                                         tpd_model_param(m, TPD_P_LNFW), mean, rstd, Nl, C));
    }
    /* dres now holds d(stage output) (received, or from the head above) */
    for (int l = d->Ls - 1; l >= 0; l--) {
        views w, g;
        acts a;
        layer_views(m, m->params, es, l, &w);
        layer_views(m, m->grads, gs, l, &g);
        layer_acts(m, slot, l, &a);
        const void *inp = x0; /* the layer's input */
        if (l > 0) {
            acts prev;
            layer_acts(m, slot, l - 1, &prev);
            inp = prev.out;
        }
        if (l < m->plan.recompute) {
            /* full recompute: rebuild the layer's activations from its stored input; the
             * recomputed output goes to the block, the stored one stays as it was */
            a.out = m->ws + m->plan.w_layer + m->plan.layer.out;
            TPD_CHECK(layer_fwd(m, &w, &a, inp));
        }
        /* out = x1 + reduce(fch_gelu @ fcprojw^T) + fcprojb: the row-parallel backward
         * takes d(out) of every row, gathered under SP (so dfcprojb is whole) */
        const void *dfull;
        TPD_CHECK(sp_full(m, &dfull, dres));
        TPD_CHECK(tpd_tp_row_bwd(tp, dfch, g.fcprojw, g.fcprojb, dfull, a.fch_gelu, w.fcprojw, N,
                                 d->Fl, C));
        /* fch_gelu = gelu(fch) */
        TPD_CHECK(tpd_kern_gelu_bwd(m->kb, dfch, a.fch, dfch, (size_t)N * d->Fl));
        /* fch = gather(ln2) @ fcw^T + fcb: dln2 = reduce(dfch @ fcw) */
        TPD_CHECK(column_bwd(m, &dln, g.fcw, g.fcb, dfch, a.ln2, w.fcw, d->Fl));
        /* ln2 = LN(x1); and x1 feeds out through the residual: dx1 = dres + dLN */
        TPD_CHECK(tpd_kern_layernorm_bwd(m->kb, dtmp, g.ln2w, g.ln2b, dln, a.x1, w.ln2w, a.ln2_mean,
                                         a.ln2_rstd, Nl, C));
        TPD_CHECK(tpd_kern_add(m->kb, dres, dres, dtmp, NC));
        /* x1 = inp + reduce(atty @ attprojw^T) + attprojb */
        TPD_CHECK(sp_full(m, &dfull, dres));
        TPD_CHECK(tpd_tp_row_bwd(tp, datty, g.attprojw, g.attprojb, dfull, a.atty, w.attprojw, N,
                                 d->Cl, C));
        /* atty = attention(qkv); selective recompute rebuilds the saved state first (and
         * atty, bit for bit the same) */
        if (m->plan.selective)
            TPD_CHECK(
                tpd_kern_attention_fwd(m->kb, a.atty, a.att, a.qkv, d->B, d->T, d->NHl, d->HS));
        TPD_CHECK(tpd_kern_attention_bwd(m->kb, dqkv, datty, a.qkv, a.atty, a.att, d->B, d->T,
                                         d->NHl, d->HS));
        /* qkv = gather(ln1) @ qkvw^T + qkvb: dln1 = reduce(dqkv @ qkvw) */
        TPD_CHECK(column_bwd(m, &dln, g.qkvw, g.qkvb, dqkv, a.ln1, w.qkvw, 3 * d->Cl));
        /* ln1 = LN(inp); inp also feeds x1 through the residual: dinp = dx1 + dLN */
        TPD_CHECK(tpd_kern_layernorm_bwd(m->kb, dtmp, g.ln1w, g.ln1b, dln, inp, w.ln1w, a.ln1_mean,
                                         a.ln1_rstd, Nl, C));
        /* the stage input's gradient goes to the send buffer on non-first stages */
        void *dst = (l == 0 && !d->first) ? m->ws + m->plan.w_dsend : dres;
        TPD_CHECK(tpd_kern_add(m->kb, dst, dres, dtmp, NC));
    }
    if (d->first) {
        const int32_t *tokens = (const int32_t *)(s + m->plan.s_tokens);
        /* x0 = my rows of (wte[tokens] + wpe[t]): the lookups take d(x0) of every row */
        const void *dfull;
        TPD_CHECK(sp_full(m, &dfull, dres));
        TPD_CHECK(tpd_tp_vocab_embed_bwd(tp, tpd_model_grad(m, TPD_P_WTE), dfull, tokens, N, C,
                                         d->v0, d->Vl));
        TPD_CHECK(tpd_kern_pos_bwd(m->kb, tpd_model_grad(m, TPD_P_WPE), dfull, d->B, d->T, C));
    }
    return TPD_OK;
}

tpd_status tpd_model_sp_reduce_grads(tpd_model *m) {
    if (!m->d.sp) return TPD_OK;
    /* the LayerNorm weights and biases saw only this rank's rows */
    static const tpd_param ln[] = {TPD_P_LN1W, TPD_P_LN1B, TPD_P_LN2W,
                                   TPD_P_LN2B, TPD_P_LNFW, TPD_P_LNFB};
    for (size_t i = 0; i < sizeof ln / sizeof ln[0]; i++) {
        const tpd_param_slice *p = &m->plan.lay.p[ln[i]];
        if (!p->present || !p->numel) continue;
        TPD_CHECK(tpd_tp_allreduce(&m->tp, tpd_model_grad(m, ln[i]), p->numel,
                                   tpd_kern_grad_dtype(m->kb), TPD_COMM_OP_SUM));
    }
    return TPD_OK;
}
