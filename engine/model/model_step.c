/* Forward and backward of one micro-batch on one stage. Each backward block quotes the
 * forward line it differentiates. Shapes: N = B*T rows, C hidden, Cl = C/tp, Fl = F/tp,
 * Vl = Vp/tp; Nl = N, or N/tp under sequence parallel: the rows of the LayerNorm and
 * residual regions that this rank keeps. Under SP, "gather" is the all-gather of those
 * rows into the (N,C) block w_gath, and the row-parallel all-reduce becomes a
 * reduce-scatter (parallel/tensor/tp.h).
 *
 * Under the interleaved schedule a call runs one model chunk: its layers are the local
 * layers [chunk_l0[c], chunk_l0[c] + chunk_layers[c]); the embedding belongs to chunk 0 of
 * the first stage and the head to the last chunk of the last stage. Under ZB-H1 the
 * backward is split: B computes the input gradients (and the LayerNorm, head and embedding
 * gradients) and leaves in the slot what W needs for the four linear layers' weight and
 * bias gradients: their inputs (ln1, atty, ln2, fch_gelu, kept from the forward) and
 * their output gradients, each written over an activation that B no longer reads (dqkv
 * over qkv, d(fch) over fch, d(x1) over x1, d(out) over out). */
#include "engine/model/model_internal.h"

#include "base/align.h"

/* Layer l's piece of p, where layer l's unit lives now; NULL for a tensor the model lacks
 * (biases, LayerNorm's b under RMSNorm) or the layer's kind lacks (a dense layer's router,
 * a MoE layer's dense MLP). */
static void *pview(const tpd_model *m, int grads, tpd_param p, int l) {
    if (!tpd_model_layout_layer_has(&m->plan.lay, p, l)) return NULL;
    size_t e = tpd_model_layout_layer_piece(&m->plan.lay, p, l), u0 = m->ubound[l + 1];
    char *base = grads ? m->ubase_g[l + 1] : m->ubase_p[l + 1];
    if (m->neunits && tpd_param_is_expert(p)) { /* EP: the layer's expert unit */
        u0 = m->ebound[l];
        base = grads ? m->ebase_g[l] : m->ebase_p[l];
    }
    if (!base) return NULL; /* a sharded unit not staged now: nothing may read it */
    return base + (e - u0) * (grads ? m->plan.grad_size : m->plan.param_size);
}

void tpd_model_layer_views(const tpd_model *m, int grads, int l, tpd_model_views *v) {
    v->ln1w = pview(m, grads, TPD_P_LN1W, l);
    v->ln1b = pview(m, grads, TPD_P_LN1B, l);
    v->qkvw = pview(m, grads, TPD_P_QKVW, l);
    v->qkvb = pview(m, grads, TPD_P_QKVB, l);
    v->attprojw = pview(m, grads, TPD_P_ATTPROJW, l);
    v->attprojb = pview(m, grads, TPD_P_ATTPROJB, l);
    v->ln2w = pview(m, grads, TPD_P_LN2W, l);
    v->ln2b = pview(m, grads, TPD_P_LN2B, l);
    v->fcw = pview(m, grads, TPD_P_FCW, l);
    v->fcb = pview(m, grads, TPD_P_FCB, l);
    v->fcprojw = pview(m, grads, TPD_P_FCPROJW, l);
    v->fcprojb = pview(m, grads, TPD_P_FCPROJB, l);
    v->routerw = pview(m, grads, TPD_P_ROUTERW, l);
    v->expfcw = pview(m, grads, TPD_P_EXPFCW, l);
    v->expfcb = pview(m, grads, TPD_P_EXPFCB, l);
    v->expprojw = pview(m, grads, TPD_P_EXPPROJW, l);
    v->expprojb = pview(m, grads, TPD_P_EXPPROJB, l);
    v->shgatew = pview(m, grads, TPD_P_SHGATEW, l);
    v->shfcw = pview(m, grads, TPD_P_SHFCW, l);
    v->shfcb = pview(m, grads, TPD_P_SHFCB, l);
    v->shprojw = pview(m, grads, TPD_P_SHPROJW, l);
    v->shprojb = pview(m, grads, TPD_P_SHPROJB, l);
    v->qnormw = pview(m, grads, TPD_P_QNORMW, l);
    v->knormw = pview(m, grads, TPD_P_KNORMW, l);
}

static char *slot_base(const tpd_model *m, int slot) {
    return m->acts + (size_t)slot * m->plan.slot_bytes;
}

static char *head_base(const tpd_model *m, int head) {
    return m->acts + (size_t)m->plan.nslots * m->plan.slot_bytes +
           (size_t)head * m->plan.head_bytes;
}

static int is_first(const tpd_model *m, const tpd_model_mb *at) {
    return m->d.first && at->chunk == 0;
}

static int is_last(const tpd_model *m, const tpd_model_mb *at) {
    return m->d.last && at->chunk == m->d.v - 1;
}

static tpd_status hook(tpd_model *m, int unit, int event) {
    return m->hook ? m->hook(m->hook_user, unit, event) : TPD_OK;
}

tpd_status tpd_model_norm_fwd(const tpd_model *m, int rows, void *out, float *mean, float *rstd,
                              const void *inp, const void *w, const void *b) {
    double eps = m->cfg.model.norm_epsilon;
    if (m->d.rms) return tpd_kern_rmsnorm_fwd(m->kb, out, rstd, inp, w, rows, m->d.C, eps);
    return tpd_kern_layernorm_fwd(m->kb, out, mean, rstd, inp, w, b, rows, m->d.C, eps);
}

static tpd_status norm_bwd(const tpd_model *m, void *dinp, void *dw, void *db, const void *dout,
                           const void *inp, const void *w, const float *mean, const float *rstd) {
    if (m->d.rms) return tpd_kern_rmsnorm_bwd(m->kb, dinp, dw, dout, inp, w, rstd, m->d.Nl, m->d.C);
    return tpd_kern_layernorm_bwd(m->kb, dinp, dw, db, dout, inp, w, mean, rstd, m->d.Nl, m->d.C);
}

tpd_param tpd_model_head_param(const tpd_model *m) {
    return m->d.tied ? TPD_P_WTE : TPD_P_LMHEAD;
}

/* Activations of the chunk's i-th layer in `at`'s slot. For a recomputed layer
 * (i < plan.recompute[chunk]) they live in the one shared layer block, and only the layer
 * output is the slot's own. */
static void layer_acts(const tpd_model *m, const tpd_model_mb *at, int i, tpd_model_acts *a) {
    const tpd_act_layer *o = &m->plan.layer;
    int R = m->plan.recompute[at->chunk], rc = i < R;
    char *b = rc ? m->ws + m->plan.w_layer
                 : slot_base(m, at->slot) + m->plan.s_layers +
                       tpd_act_layers_bytes(&m->plan, at->chunk, R, i);
    a->moe = tpd_model_dims_layer_moe(&m->d, m->d.chunk_l0[at->chunk] + i);
    a->ln1 = b + o->ln1;
    a->ln1_mean = (float *)(b + o->ln1_mean);
    a->ln1_rstd = (float *)(b + o->ln1_rstd);
    a->qkv = b + o->qkv;
    a->qkn_raw = m->d.qkn ? b + o->qkn_raw : NULL;
    a->qkn_rstd = m->d.qkn ? (float *)(b + o->qkn_rstd) : NULL;
    a->atty = b + o->atty;
    a->att = m->plan.selective ? m->ws + m->plan.w_att : b + o->att;
    a->x1 = b + o->x1;
    a->ln2 = b + o->ln2;
    a->ln2_mean = (float *)(b + o->ln2_mean);
    a->ln2_rstd = (float *)(b + o->ln2_rstd);
    a->fch = b + o->fch;
    a->fch_gelu = b + o->fch_gelu;
    a->out = b + o->out;
    a->block = b;
    if (rc) {
        size_t nc = (size_t)m->d.Nl * m->d.C * m->plan.act_size;
        size_t stride = tpd_align_up(nc); /* the buffer plan's alignment */
        a->out = slot_base(m, at->slot) + m->plan.s_outs + (size_t)i * stride;
    }
}

/* Weights, gradients and activations of the chunk's i-th layer, for a backward. */
static void backward_views(const tpd_model *m, const tpd_model_mb *at, int i, tpd_model_views *w,
                           tpd_model_views *g, tpd_model_acts *a) {
    int l = m->d.chunk_l0[at->chunk] + i;
    tpd_model_layer_views(m, 0, l, w);
    tpd_model_layer_views(m, 1, l, g);
    layer_acts(m, at, i, a);
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
                          int N, int Kl) {
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
    const void *full = NULL;
    if (dw) TPD_CHECK(sp_full(m, &full, ln)); /* B of a split backward reads no input */
    *dinp_p = m->ws + m->plan.w_dlnl;
    return tpd_tp_column_bwd_sp(&m->tp, *dinp_p, dln, dw, db, dout, full, w, N, C, OCl);
}

/* The runs of consecutive positions in a call's rows: one run of B sequences x T from
 * pos0, or under context parallelism 2B runs of one sequence's chunk (T/2 rows each, at
 * the chunk's global position). Run i: *nseq sequences of *len rows from row *row0, at
 * position *p0. */
static int pos_runs(const tpd_model_rows *r) {
    return r->cp ? 2 * r->B : 1;
}

static void pos_run(const tpd_model *m, const tpd_model_rows *r, int i, int *row0, int *p0,
                    int *nseq, int *len) {
    if (!r->cp) {
        *row0 = 0, *p0 = r->pos0, *nseq = r->B, *len = r->T;
        return;
    }
    int c = r->T / 2, b = i / 2, h = i % 2;
    *row0 = b * r->T + h * c;
    *p0 = tpd_model_cp_pos(&m->d, m->cp_rank, h * c);
    *nseq = 1;
    *len = c;
}

/* RoPE on the Q and K heads of qkv (B*T rows of QKVl), or its backward on dqkv. */
static tpd_status rope_rows(tpd_model *m, const tpd_model_rows *r, void *qkv, int bwd) {
    const tpd_model_dims *d = &m->d;
    for (int i = 0; i < pos_runs(r); i++) {
        int row0, p0, nseq, len;
        pos_run(m, r, i, &row0, &p0, &nseq, &len);
        char *x = (char *)qkv + (size_t)row0 * d->QKVl * m->plan.act_size;
        TPD_CHECK(
            bwd ? tpd_kern_rope_scaled_bwd(m->kb, x, nseq, len, d->NHl, d->KVl, d->HS, &m->rope, p0)
                : tpd_kern_rope_scaled_fwd(m->kb, x, nseq, len, d->NHl, d->KVl, d->HS, &m->rope,
                                           p0));
    }
    return TPD_OK;
}

tpd_status tpd_model_layer_qkv_fwd(tpd_model *m, const tpd_model_rows *r, const tpd_model_views *w,
                                   const tpd_model_acts *a, const void *inp) {
    const tpd_model_dims *d = &m->d;
    int N = r->B * r->T, C = d->C;
    const void *full;
    /* ln1 = norm(inp); qkv = gather(ln1) @ qkvw^T + qkvb (column-parallel, whole heads and
     * K/V groups); Qwen3's QK norm normalizes each Q and K head; RoPE rotates them in place */
    TPD_CHECK(
        tpd_model_norm_fwd(m, r->Nl, a->ln1, a->ln1_mean, a->ln1_rstd, inp, w->ln1w, w->ln1b));
    TPD_CHECK(sp_full(m, &full, a->ln1));
    TPD_CHECK(tpd_tp_column_fwd(&m->tp, a->qkv, full, w->qkvw, w->qkvb, N, C, d->QKVl));
    if (d->qkn)
        TPD_CHECK(tpd_kern_qk_norm_fwd(m->kb, a->qkv, a->qkn_raw, a->qkn_rstd, w->qnormw, w->knormw,
                                       N, d->NHl, d->KVl, d->HS, m->cfg.model.norm_epsilon));
    if (d->rope) TPD_CHECK(rope_rows(m, r, a->qkv, 0));
    return TPD_OK;
}

tpd_status tpd_model_layer_mlp_fwd(tpd_model *m, const tpd_model_rows *r, const tpd_model_views *w,
                                   const tpd_model_acts *a, const void *inp) {
    const tpd_model_dims *d = &m->d;
    const tpd_tp_ctx *tp = &m->tp;
    int N = r->B * r->T, Nl = r->Nl, C = d->C;
    const void *full;
    /* x1 = inp + reduce(atty @ attprojw^T) + attprojb (row-parallel) */
    TPD_CHECK(row_fwd(m, a->x1, a->atty, w->attprojw, w->attprojb, N, d->Cl));
    TPD_CHECK(tpd_kern_add(m->kb, a->x1, a->x1, inp, (size_t)Nl * C));
    /* ln2 = norm(x1); fch_gelu = gelu(gather(ln2) @ fcw^T + fcb), or under SwiGLU
     * silu(gate) * up of fch = [gate | up] (column-parallel, matching shards) */
    TPD_CHECK(tpd_model_norm_fwd(m, Nl, a->ln2, a->ln2_mean, a->ln2_rstd, a->x1, w->ln2w, w->ln2b));
    TPD_CHECK(sp_full(m, &full, a->ln2));
    /* out = x1 + the mixture of experts of ln2 (engine/model/model_moe.c) */
    if (a->moe) return tpd_model_moe_fwd(m, r, w, a, full);
    if (d->glu) {
        TPD_CHECK(tpd_tp_column_fwd(tp, a->fch, full, w->fcw, w->fcb, N, C, d->FCl));
        TPD_CHECK(tpd_kern_swiglu_fwd(m->kb, a->fch_gelu, a->fch, N, d->Fl));
    } else {
        TPD_CHECK(
            tpd_tp_column_gelu_fwd(tp, a->fch_gelu, a->fch, full, w->fcw, w->fcb, N, C, d->Fl));
    }
    /* out = x1 + reduce(fch_gelu @ fcprojw^T) + fcprojb (row-parallel) */
    TPD_CHECK(row_fwd(m, a->out, a->fch_gelu, w->fcprojw, w->fcprojb, N, d->Fl));
    return tpd_kern_add(m->kb, a->out, a->out, a->x1, (size_t)Nl * C);
}

/* The micro-batch's rows. */
static tpd_model_rows batch_rows(const tpd_model *m) {
    return (tpd_model_rows){m->d.B, m->d.T, m->d.Nl, 0, m->d.cp_size > 1};
}

/* atty = causal attention of the local heads of qkv, over the whole sequence (across the
 * CP ranks under context parallelism) */
static tpd_status attention_fwd(tpd_model *m, const tpd_model_acts *a) {
    const tpd_model_dims *d = &m->d;
    if (d->cp_size > 1) return tpd_model_cp_attention_fwd(m, a);
    return tpd_kern_attention_fwd(m->kb, a->atty, a->att, a->qkv, d->B, d->T, d->NHl, d->KVl,
                                  d->HS);
}

/* One transformer layer forward on the micro-batch: inp (Nl,C) -> a->out (Nl,C), keeping in
 * `a` what the backward needs. */
static tpd_status layer_fwd(tpd_model *m, const tpd_model_views *w, const tpd_model_acts *a,
                            const void *inp) {
    tpd_model_rows r = batch_rows(m);
    TPD_CHECK(tpd_model_layer_qkv_fwd(m, &r, w, a, inp));
    /* atty = causal_attention(qkv) on the local heads */
    TPD_CHECK(attention_fwd(m, a));
    return tpd_model_layer_mlp_fwd(m, &r, w, a, inp);
}

tpd_status tpd_model_embed_fwd(tpd_model *m, const tpd_model_rows *r, void *out,
                               const int32_t *tokens) {
    const tpd_model_dims *d = &m->d;
    TPD_CHECK(tpd_tp_vocab_embed_fwd(&m->tp, out, tokens, tpd_model_param(m, TPD_P_WTE),
                                     r->B * r->T, d->C, d->v0, d->Vl));
    if (d->rope) return TPD_OK;
    const char *wpe = tpd_model_param(m, TPD_P_WPE);
    for (int i = 0; i < pos_runs(r); i++) {
        int row0, p0, nseq, len;
        pos_run(m, r, i, &row0, &p0, &nseq, &len);
        TPD_CHECK(tpd_kern_pos_fwd(m->kb, (char *)out + (size_t)row0 * d->C * m->plan.act_size,
                                   wpe + (size_t)p0 * d->C * m->plan.param_size, nseq, len, d->C));
    }
    return TPD_OK;
}

tpd_status tpd_model_head_fwd(tpd_model *m, const tpd_model_rows *r, void *lnf, float *mean,
                              float *rstd, void *logits, const void *inp) {
    const tpd_model_dims *d = &m->d;
    /* lnf = norm_f(inp); logits = gather(lnf) @ head^T (the tied wte or lmhead,
     * vocab-parallel columns) */
    TPD_CHECK(tpd_model_norm_fwd(m, r->Nl, lnf, mean, rstd, inp, tpd_model_param(m, TPD_P_LNFW),
                                 tpd_model_param(m, TPD_P_LNFB)));
    const void *full;
    TPD_CHECK(sp_full(m, &full, lnf));
    return tpd_tp_column_fwd(&m->tp, logits, full, tpd_model_param(m, tpd_model_head_param(m)),
                             NULL, r->B * r->T, d->C, d->Vl);
}

void *tpd_model_stage_input(const tpd_model *m, const tpd_model_mb *at) {
    return slot_base(m, at->slot) + m->plan.s_x0;
}

void *tpd_model_stage_output(const tpd_model *m, const tpd_model_mb *at) {
    tpd_model_acts a;
    layer_acts(m, at, m->d.chunk_layers[at->chunk] - 1, &a);
    return a.out;
}

void *tpd_model_grad_in(const tpd_model *m) {
    return m->ws + m->plan.w_dres;
}

void *tpd_model_grad_out(const tpd_model *m) {
    return m->d.first && m->d.v == 1 ? NULL : m->ws + m->plan.w_dsend;
}

const void *tpd_model_logits(const tpd_model *m, const tpd_model_mb *at) {
    return head_base(m, at->head) + m->plan.h_logits;
}

void tpd_model_unit_range(const tpd_model *m, int unit, size_t *begin_p, size_t *end_p) {
    *begin_p = m->ubound[unit + 1];
    *end_p = m->ubound[unit + 2];
}

tpd_status tpd_model_forward(tpd_model *m, const tpd_model_mb *at) {
    const tpd_model_dims *d = &m->d;
    const tpd_tp_ctx *tp = &m->tp;
    char *s = slot_base(m, at->slot);
    int N = d->B * d->T, C = d->C;
    const int32_t *tokens = (const int32_t *)(s + m->plan.s_tokens);
    void *x0 = s + m->plan.s_x0;
    int l0 = d->chunk_l0[at->chunk], Lc = d->chunk_layers[at->chunk];
    tpd_model_rows r = batch_rows(m);

    if (is_first(m, at)) {
        TPD_CHECK(hook(m, TPD_MODEL_UNIT_EMBED, TPD_HOOK_FWD));
        /* x0 = wte[tokens] (+ wpe[t] with learned positions); under SP built whole in
         * w_gath, and this rank keeps its rows */
        void *emb = d->sp ? m->ws + m->plan.w_gath : x0;
        TPD_CHECK(tpd_model_embed_fwd(m, &r, emb, tokens));
        TPD_CHECK(hook(m, TPD_MODEL_UNIT_EMBED, TPD_HOOK_FWD_DONE));
        if (d->sp) {
            size_t rows = (size_t)d->Nl * C * m->plan.act_size;
            TPD_CHECK(tpd_kern_copy(m->kb, x0, (char *)emb + (size_t)d->tp_rank * rows, rows));
        }
    }
    const void *inp = x0;
    for (int i = 0; i < Lc; i++) {
        tpd_model_views w;
        tpd_model_acts a;
        TPD_CHECK(hook(m, l0 + i, TPD_HOOK_FWD));
        tpd_model_layer_views(m, 0, l0 + i, &w);
        layer_acts(m, at, i, &a);
        TPD_CHECK(layer_fwd(m, &w, &a, inp));
        TPD_CHECK(hook(m, l0 + i, TPD_HOOK_FWD_DONE));
        inp = a.out;
    }
    if (is_last(m, at)) {
        TPD_CHECK(hook(m, d->Ls, TPD_HOOK_FWD));
        if (d->tied) /* the tied head reads wte */
            TPD_CHECK(hook(m, TPD_MODEL_UNIT_EMBED, TPD_HOOK_FWD));
        char *h = head_base(m, at->head);
        void *lnf = h + m->plan.h_lnf, *logits = h + m->plan.h_logits;
        float *mean = (float *)(h + m->plan.h_lnf_mean), *rstd = (float *)(h + m->plan.h_lnf_rstd);
        const int32_t *targets = (const int32_t *)(s + m->plan.s_targets);
        TPD_CHECK(tpd_model_head_fwd(m, &r, lnf, mean, rstd, logits, inp));
        /* loss = -log softmax(logits)[target], padded columns excluded */
        TPD_CHECK(tpd_tp_vocab_xent_fwd(tp, (float *)(h + m->plan.h_loss),
                                        (float *)(h + m->plan.h_xstats), logits, targets, N, d->Vl,
                                        d->Vvalid, d->v0));
        TPD_CHECK(hook(m, d->Ls, TPD_HOOK_FWD_DONE));
        if (d->tied) TPD_CHECK(hook(m, TPD_MODEL_UNIT_EMBED, TPD_HOOK_FWD_DONE));
    }
    return TPD_OK;
}

tpd_status tpd_model_loss_sum(tpd_model *m, const tpd_model_mb *at, double *sum_p) {
    if (!is_last(m, at)) {
        *sum_p = 0;
        return TPD_OK;
    }
    const float *loss = (const float *)(head_base(m, at->head) + m->plan.h_loss);
    return tpd_kern_sum_f32(m->kb, loss, (size_t)m->d.B * m->d.T, sum_p);
}

tpd_status tpd_model_loss_acc(tpd_model *m, const tpd_model_mb *at, double div) {
    if (!is_last(m, at)) return TPD_OK;
    const float *loss = (const float *)(head_base(m, at->head) + m->plan.h_loss);
    return tpd_kern_sum_f32_acc(m->kb, (double *)(m->ws + m->plan.w_loss), loss,
                                (size_t)m->d.B * m->d.T, div);
}

tpd_status tpd_model_loss_take(tpd_model *m, double *acc_p) {
    *acc_p = 0;
    if (!m->d.last) return TPD_OK;
    double *acc = (double *)(m->ws + m->plan.w_loss);
    TPD_CHECK(tpd_kern_copy_to_host(m->kb, acc_p, acc, sizeof *acc));
    return tpd_kern_zero(m->kb, acc, sizeof *acc);
}

/* Copies an (Nl,C) activation-dtype region: W's saved output gradients. */
static tpd_status keep_rows(tpd_model *m, void *dst, const void *src) {
    return tpd_kern_copy(m->kb, dst, src, (size_t)m->d.Nl * m->d.C * m->plan.act_size);
}

tpd_status tpd_model_backward(tpd_model *m, const tpd_model_mb *at, float dloss) {
    const tpd_model_dims *d = &m->d;
    const tpd_tp_ctx *tp = &m->tp;
    char *s = slot_base(m, at->slot);
    int N = d->B * d->T, Nl = d->Nl, C = d->C;
    size_t NC = (size_t)Nl * C;
    void *dres = m->ws + m->plan.w_dres, *dtmp = m->ws + m->plan.w_dtmp;
    void *dln, *dqkv = m->ws + m->plan.w_dqkv;
    void *datty = m->ws + m->plan.w_datty, *dfch = m->ws + m->plan.w_dfch;
    void *x0 = s + m->plan.s_x0;
    int l0 = d->chunk_l0[at->chunk], Lc = d->chunk_layers[at->chunk];
    int R = m->plan.recompute[at->chunk], split = m->plan.split;

    if (is_last(m, at)) {
        char *h = head_base(m, at->head);
        void *lnf = h + m->plan.h_lnf, *logits = h + m->plan.h_logits;
        const float *mean = (const float *)(h + m->plan.h_lnf_mean);
        const float *rstd = (const float *)(h + m->plan.h_lnf_rstd);
        const int32_t *targets = (const int32_t *)(s + m->plan.s_targets);
        tpd_model_acts last;
        layer_acts(m, at, Lc - 1, &last);
        TPD_CHECK(hook(m, d->Ls, TPD_HOOK_BWD));
        if (d->tied) TPD_CHECK(hook(m, TPD_MODEL_UNIT_EMBED, TPD_HOOK_BWD));
        /* loss = xent(logits): dlogits = (softmax - onehot) * dloss, in place */
        TPD_CHECK(tpd_tp_vocab_xent_bwd(tp, logits, (const float *)(h + m->plan.h_xstats), targets,
                                        dloss, N, d->Vl, d->Vvalid, d->v0));
        /* logits = gather(lnf) @ head^T: dlnf = reduce(dlogits @ head);
         * dhead += dlogits^T gather(lnf) */
        TPD_CHECK(column_bwd(m, &dln, tpd_model_grad(m, tpd_model_head_param(m)), NULL, logits, lnf,
                             tpd_model_param(m, tpd_model_head_param(m)), d->Vl));
        /* lnf = norm_f(out_last) */
        TPD_CHECK(norm_bwd(m, dres, tpd_model_grad(m, TPD_P_LNFW), tpd_model_grad(m, TPD_P_LNFB),
                           dln, last.out, tpd_model_param(m, TPD_P_LNFW), mean, rstd));
        TPD_CHECK(hook(m, d->Ls, TPD_HOOK_GRAD_DONE));
        if (d->tied) TPD_CHECK(hook(m, TPD_MODEL_UNIT_EMBED, TPD_HOOK_GRAD_DONE));
    }
    /* dres now holds d(chunk output) (received, or from the head above) */
    for (int i = Lc - 1; i >= 0; i--) {
        int l = l0 + i;
        tpd_model_views w, g;
        tpd_model_acts a;
        TPD_CHECK(hook(m, l, TPD_HOOK_BWD));
        backward_views(m, at, i, &w, &g, &a);
        const void *inp = x0; /* the layer's input */
        if (i > 0) {
            tpd_model_acts prev;
            layer_acts(m, at, i - 1, &prev);
            inp = prev.out;
        }
        if (i < R) {
            /* full recompute: rebuild the layer's activations from its stored input; the
             * recomputed output goes to the block, the stored one stays as it was */
            a.out = m->ws + m->plan.w_layer + m->plan.layer.out;
            m->moe_quiet = 1; /* its routing was counted in the forward */
            tpd_status rst = layer_fwd(m, &w, &a, inp);
            m->moe_quiet = 0;
            TPD_CHECK(rst);
        }
        const void *dfull;
        if (a.moe) {
            /* out = x1 + moe(ln2): d(out) of every row in, this rank's share of d(ln2) out,
             * summed over TP (reduce-scattered to its rows under SP) */
            const void *xfull = a.ln2;
            if (d->sp) {
                TPD_CHECK(tpd_tp_sp_gather(tp, m->ws + m->plan.w_moe_x, a.ln2, N, C));
                xfull = m->ws + m->plan.w_moe_x;
            }
            TPD_CHECK(sp_full(m, &dfull, dres));
            void *dpart = m->ws + m->plan.w_dln;
            TPD_CHECK(tpd_model_moe_bwd(m, &w, &g, &a, xfull, dfull, dpart, dloss));
            dln = d->sp ? m->ws + m->plan.w_dlnl : dpart;
            TPD_CHECK(tpd_tp_reduce_rows(tp, dln, dpart, N, C, d->sp));
        } else {
            /* out = x1 + reduce(fch_gelu @ fcprojw^T) + fcprojb: the row-parallel backward
             * takes d(out) of every row, gathered under SP (so dfcprojb is whole) */
            TPD_CHECK(sp_full(m, &dfull, dres));
            if (split) TPD_CHECK(keep_rows(m, a.out, dres)); /* W: d(out) over out */
            TPD_CHECK(tpd_tp_row_bwd(tp, dfch, split ? NULL : g.fcprojw, split ? NULL : g.fcprojb,
                                     dfull, a.fch_gelu, w.fcprojw, N, d->Fl, C));
            /* fch_gelu = gelu(fch), or silu(gate) * up; W keeps d(fch) over fch */
            void *dfc = split ? a.fch : d->glu ? m->ws + m->plan.w_dglu : dfch;
            if (d->glu) {
                TPD_CHECK(
                    tpd_kern_swiglu_bwd(m->kb, m->ws + m->plan.w_dglu, a.fch, dfch, N, d->Fl));
                if (split)
                    TPD_CHECK(tpd_kern_copy(m->kb, a.fch, m->ws + m->plan.w_dglu,
                                            (size_t)N * d->FCl * m->plan.act_size));
            } else {
                TPD_CHECK(tpd_kern_gelu_bwd(m->kb, dfc, a.fch, dfch, (size_t)N * d->Fl));
            }
            /* fch = gather(ln2) @ fcw^T + fcb: dln2 = reduce(dfch @ fcw) */
            TPD_CHECK(column_bwd(m, &dln, split ? NULL : g.fcw, split ? NULL : g.fcb, dfc, a.ln2,
                                 w.fcw, d->FCl));
        }
        /* ln2 = norm(x1); and x1 feeds out through the residual: dx1 = dres + dnorm */
        TPD_CHECK(norm_bwd(m, dtmp, g.ln2w, g.ln2b, dln, a.x1, w.ln2w, a.ln2_mean, a.ln2_rstd));
        TPD_CHECK(tpd_kern_add(m->kb, dres, dres, dtmp, NC));
        /* x1 = inp + reduce(atty @ attprojw^T) + attprojb */
        TPD_CHECK(sp_full(m, &dfull, dres));
        if (split) TPD_CHECK(keep_rows(m, a.x1, dres)); /* W: d(x1) over x1 */
        TPD_CHECK(tpd_tp_row_bwd(tp, datty, split ? NULL : g.attprojw, split ? NULL : g.attprojb,
                                 dfull, a.atty, w.attprojw, N, d->Cl, C));
        /* atty = attention(qkv); selective recompute rebuilds the saved state first (and
         * atty, bit for bit the same) */
        if (d->cp_size > 1) {
            /* across the CP ranks: the ring re-streams K/V, a2a re-runs its attention */
            if (m->plan.selective) TPD_CHECK(tpd_model_cp_attention_recompute(m, &a));
            TPD_CHECK(tpd_model_cp_attention_bwd(m, dqkv, datty, &a));
        } else {
            if (m->plan.selective) TPD_CHECK(attention_fwd(m, &a));
            TPD_CHECK(tpd_kern_attention_bwd(m->kb, dqkv, datty, a.qkv, a.atty, a.att, d->B, d->T,
                                             d->NHl, d->KVl, d->HS));
        }
        /* RoPE rotated the Q and K heads after the projection: rotate their gradients back */
        tpd_model_rows r = batch_rows(m);
        if (d->rope) TPD_CHECK(rope_rows(m, &r, dqkv, 1));
        /* the QK norm: d(each Q and K head) before it; its weights' gradients (this rank's
         * heads: summed over TP with the rest, tpd_model_tp_reduce_grads) */
        if (d->qkn)
            TPD_CHECK(tpd_kern_qk_norm_bwd(m->kb, dqkv, g.qnormw, g.knormw, a.qkn_raw, w.qnormw,
                                           w.knormw, a.qkn_rstd, N, d->NHl, d->KVl, d->HS));
        /* W: dqkv over qkv, which the attention backward has read for the last time */
        if (split)
            TPD_CHECK(tpd_kern_copy(m->kb, a.qkv, dqkv, (size_t)N * d->QKVl * m->plan.act_size));
        /* qkv = gather(ln1) @ qkvw^T + qkvb: dln1 = reduce(dqkv @ qkvw) */
        TPD_CHECK(column_bwd(m, &dln, split ? NULL : g.qkvw, split ? NULL : g.qkvb, dqkv, a.ln1,
                             w.qkvw, d->QKVl));
        /* ln1 = norm(inp); inp also feeds x1 through the residual: dinp = dx1 + dnorm */
        TPD_CHECK(norm_bwd(m, dtmp, g.ln1w, g.ln1b, dln, inp, w.ln1w, a.ln1_mean, a.ln1_rstd));
        /* the chunk input's gradient goes to the send buffer, except on the very first
         * virtual stage */
        void *dst = (i == 0 && !is_first(m, at)) ? m->ws + m->plan.w_dsend : dres;
        TPD_CHECK(tpd_kern_add(m->kb, dst, dres, dtmp, NC));
        TPD_CHECK(hook(m, l, split ? TPD_HOOK_B_DONE : TPD_HOOK_GRAD_DONE));
    }
    if (is_first(m, at)) {
        const int32_t *tokens = (const int32_t *)(s + m->plan.s_tokens);
        /* x0 = my rows of (wte[tokens] + wpe[t]): the lookups take d(x0) of every row */
        const void *dfull;
        TPD_CHECK(sp_full(m, &dfull, dres));
        TPD_CHECK(hook(m, TPD_MODEL_UNIT_EMBED, TPD_HOOK_BWD));
        TPD_CHECK(tpd_tp_vocab_embed_bwd(tp, tpd_model_grad(m, TPD_P_WTE), dfull, tokens, N, C,
                                         d->v0, d->Vl));
        tpd_model_rows r = batch_rows(m);
        for (int i = 0; !d->rope && i < pos_runs(&r); i++) {
            int row0, p0, nseq, len;
            pos_run(m, &r, i, &row0, &p0, &nseq, &len);
            TPD_CHECK(tpd_kern_pos_bwd(
                m->kb, (char *)tpd_model_grad(m, TPD_P_WPE) + (size_t)p0 * C * m->plan.grad_size,
                (const char *)dfull + (size_t)row0 * C * m->plan.act_size, nseq, len, C));
        }
        TPD_CHECK(hook(m, TPD_MODEL_UNIT_EMBED, TPD_HOOK_GRAD_DONE));
    }
    return TPD_OK;
}

tpd_status tpd_model_weight_grad(tpd_model *m, const tpd_model_mb *at) {
    const tpd_model_dims *d = &m->d;
    int N = d->B * d->T, C = d->C;
    int l0 = d->chunk_l0[at->chunk], Lc = d->chunk_layers[at->chunk];
    if (!m->plan.split) {
        tpd_log_error("model: weight_grad without a split backward (pipeline_schedule zb-h1)");
        return TPD_ERR_INTERNAL;
    }
    /* the weight and bias halves of the four row/column-parallel backwards of B, from the
     * inputs the forward kept and the output gradients B kept (whole rows under SP) */
    for (int i = Lc - 1; i >= 0; i--) {
        tpd_model_views w, g;
        tpd_model_acts a;
        backward_views(m, at, i, &w, &g, &a); /* w unread: W computes no input gradient */
        const void *dfull, *full;
        if (!a.moe) { /* a MoE layer's MLP gradients were all computed in B */
            /* out = x1 + reduce(fch_gelu @ fcprojw^T) + fcprojb */
            TPD_CHECK(sp_full(m, &dfull, a.out));
            TPD_CHECK(tpd_kern_matmul_bwd(m->kb, NULL, g.fcprojw, g.fcprojb, dfull, a.fch_gelu,
                                          w.fcprojw, N, d->Fl, C));
            /* fch = gather(ln2) @ fcw^T + fcb */
            TPD_CHECK(sp_full(m, &full, a.ln2));
            TPD_CHECK(
                tpd_kern_matmul_bwd(m->kb, NULL, g.fcw, g.fcb, a.fch, full, w.fcw, N, C, d->FCl));
        }
        /* x1 = inp + reduce(atty @ attprojw^T) + attprojb */
        TPD_CHECK(sp_full(m, &dfull, a.x1));
        TPD_CHECK(tpd_kern_matmul_bwd(m->kb, NULL, g.attprojw, g.attprojb, dfull, a.atty,
                                      w.attprojw, N, d->Cl, C));
        /* qkv = gather(ln1) @ qkvw^T + qkvb */
        TPD_CHECK(sp_full(m, &full, a.ln1));
        TPD_CHECK(
            tpd_kern_matmul_bwd(m->kb, NULL, g.qkvw, g.qkvb, a.qkv, full, w.qkvw, N, C, d->QKVl));
        TPD_CHECK(hook(m, l0 + i, TPD_HOOK_GRAD_DONE));
    }
    return TPD_OK;
}

tpd_status tpd_model_tp_reduce_grads(tpd_model *m, size_t begin, size_t end) {
    if (m->d.tp_size < 2) return TPD_OK;
    /* the tensors replicated over TP whose gradient each rank computes from a part: under SP
     * the norms' weights and biases (this rank's rows), with the QK norm its weights (this
     * rank's heads) */
    tpd_param ps[8];
    int np = 0;
    if (m->d.sp) {
        static const tpd_param ln[] = {TPD_P_LN1W, TPD_P_LN1B, TPD_P_LN2W,
                                       TPD_P_LN2B, TPD_P_LNFW, TPD_P_LNFB};
        for (size_t i = 0; i < sizeof ln / sizeof ln[0]; i++)
            ps[np++] = ln[i];
    }
    if (m->d.qkn) {
        ps[np++] = TPD_P_QNORMW;
        ps[np++] = TPD_P_KNORMW;
    }
    const tpd_model_layout *lay = &m->plan.lay;
    /* piece by piece in buffer order, clipped to [begin, end); adjacent pieces (a
     * LayerNorm's weight and bias) in one all-reduce */
    size_t run0 = 0, run_n = 0;
    for (int l = -1; l <= m->d.Ls; l++) {
        /* ps is in table order, which is a layer block's order; lnf after the last layer */
        for (int i = 0; i < np; i++) {
            const tpd_param_slice *p = &lay->p[ps[i]];
            int per_layer = tpd_param_get_info(ps[i])->per_layer;
            if (!p->present || !p->numel || (per_layer ? l < 0 || l >= m->d.Ls : l != m->d.Ls))
                continue;
            size_t at = tpd_model_layout_layer_piece(lay, ps[i], per_layer ? l : 0);
            size_t n = (size_t)p->rows * p->cols;
            size_t lo = at > begin ? at : begin, hi = at + n < end ? at + n : end;
            if (lo >= hi) continue;
            /* one unit's pieces only: units may live apart (sharded strategies) */
            if (run_n && lo == run0 + run_n &&
                tpd_model_unit_of(m, lo) == tpd_model_unit_of(m, run0)) {
                run_n += hi - lo;
                continue;
            }
            if (run_n)
                TPD_CHECK(tpd_tp_allreduce(&m->tp, tpd_model_elem(m, 1, run0), run_n,
                                           tpd_kern_grad_dtype(m->kb), TPD_COMM_OP_SUM));
            run0 = lo;
            run_n = hi - lo;
        }
    }
    if (run_n)
        TPD_CHECK(tpd_tp_allreduce(&m->tp, tpd_model_elem(m, 1, run0), run_n,
                                   tpd_kern_grad_dtype(m->kb), TPD_COMM_OP_SUM));
    return TPD_OK;
}
