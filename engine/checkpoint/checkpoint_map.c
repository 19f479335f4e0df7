/* Shard maps: which global elements of each tensor a rank holds, where in its arrays, and
 * which of them it writes. Pure arithmetic on the model layout and the DP plan, so rank 0
 * can describe every rank's files without asking them, and a loader under another
 * layout can find its elements. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/checkpoint/checkpoint_internal.h"

void tpd_ckpt_segs_free(tpd_ckpt_segs *s) {
    free(s->v);
    memset(s, 0, sizeof *s);
}

static tpd_status segs_push(tpd_ckpt_segs *s, int64_t g, int64_t n, int64_t local) {
    if (n <= 0) return TPD_OK;
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        tpd_ckpt_seg *v = realloc(s->v, cap * sizeof *v);
        if (!v) return tpd_fail(TPD_ERR_NOMEM, "checkpoint: out of memory");
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = (tpd_ckpt_seg){g, n, local, 0};
    return TPD_OK;
}

static int seg_cmp(const void *a, const void *b) {
    int64_t x = ((const tpd_ckpt_seg *)a)->g, y = ((const tpd_ckpt_seg *)b)->g;
    return x < y ? -1 : x > y;
}

/* Sort by global offset and merge segments contiguous in both global and local order. */
static void segs_finish(tpd_ckpt_segs *s) {
    if (s->n < 2) return;
    qsort(s->v, s->n, sizeof *s->v, seg_cmp);
    size_t w = 0;
    for (size_t i = 1; i < s->n; i++) {
        tpd_ckpt_seg *a = &s->v[w], *b = &s->v[i];
        if (a->g + a->n == b->g && a->local + a->n == b->local)
            a->n += b->n;
        else
            s->v[++w] = *b;
    }
    s->n = w + 1;
}

tpd_status tpd_ckpt_rank_init(const tpd_config *cfg, int tp_size, int pp_size, int dp_size, int tp,
                              int pp, int dp, tpd_ckpt_rank *r_p) {
    tpd_ckpt_rank r;
    memset(&r, 0, sizeof r);
    tpd_config_layout lay;
    tpd_config_layout_get(cfg, &lay);
    lay.tp = tp_size;
    lay.pp = pp_size;
    lay.dp = dp_size;
    tpd_config c;
    tpd_config_relayout(cfg, &lay, &c);
    r.tp = tp;
    r.pp = pp;
    r.dp = dp;
    r.tp_size = tp_size;
    r.pp_size = pp_size;
    r.dp_size = dp_size;
    /* EP: DP rank dp holds the experts of EP rank dp % EP */
    const int ep = tpd_config_ep(&c);
    r.edp = dp / ep;
    TPD_CHECK(tpd_model_layout_init_ep(&c, tp_size, tp, pp_size, pp, ep, dp % ep,
                                       tpd_model_expert_align(&c, dp_size), &r.lay));
    TPD_CHECK(tpd_model_dp_plan(&c, &r.lay, dp_size, dp, &r.dpp));
    r.zero = r.dpp.zero;
    *r_p = r;
    return TPD_OK;
}

void tpd_ckpt_rank_free(tpd_ckpt_rank *r) {
    tpd_dp_plan_free(&r->dpp);
}

/* One copy of every global element over the whole job: TP rank 0 for replicated tensors,
 * the first stage for the tied wte. The DP condition differs between parameters and
 * optimizer state and is checked by the callers. */
static int writes_tensor(const tpd_ckpt_rank *r, tpd_param p) {
    if (tpd_param_get_info(p)->split == TPD_SPLIT_NONE && r->tp != 0) return 0;
    if (p == TPD_P_WTE && !r->lay.d.first) return 0;
    return 1;
}

tpd_status tpd_ckpt_segs_param(const tpd_ckpt_rank *r, tpd_param p, int writer,
                               tpd_ckpt_segs *out) {
    const tpd_param_slice *s = &r->lay.p[p];
    memset(out, 0, sizeof *out);
    if (!s->present) return TPD_OK;
    if (writer && ((tpd_param_is_expert(p) ? r->edp : r->dp) != 0 || !writes_tensor(r, p)))
        return TPD_OK;
    int64_t rows = (int64_t)s->layers * s->rows;
    for (int64_t row = 0; row < rows; row++) {
        int64_t g = tpd_model_layout_row_global(&r->lay, p, row);
        if (g < 0) continue; /* vocab padding */
        TPD_CHECK(segs_push(out, g, s->cols, (int64_t)tpd_model_layout_row_local(&r->lay, p, row)));
    }
    segs_finish(out);
    return TPD_OK;
}

tpd_status tpd_ckpt_segs_state(const tpd_ckpt_rank *r, tpd_param p, int writer,
                               tpd_ckpt_segs *out) {
    const tpd_param_slice *s = &r->lay.p[p];
    memset(out, 0, sizeof *out);
    if (!s->present) return TPD_OK;
    /* Without ZeRO every DP replica holds the same state: dp 0 writes it. With ZeRO each
     * DP rank writes its own shard. */
    int first = (tpd_param_is_expert(p) ? r->edp : r->dp) == 0; /* EP: of its expert-DP group */
    if (writer && ((!r->zero && !first) || !writes_tensor(r, p))) return TPD_OK;
    int64_t cols = s->cols, piece = (int64_t)s->rows * cols;
    for (int l = 0; l < s->layers; l++) {
        /* the layer's piece of the tensor: rows of this layer, contiguous */
        int64_t s0 = (int64_t)tpd_model_layout_piece(&r->lay, p, l), s1 = s0 + piece;
        for (int i = 0; i < r->dpp.nranges; i++) {
            const tpd_dp_range *rg = &r->dpp.ranges[i];
            int64_t b = (int64_t)rg->begin > s0 ? (int64_t)rg->begin : s0;
            int64_t e = (int64_t)rg->end < s1 ? (int64_t)rg->end : s1;
            /* a ZeRO range may start or end inside a row: cut the row */
            for (int64_t x = b; x < e;) {
                int64_t row = (x - s0) / cols, rs = s0 + row * cols;
                int64_t re = rs + cols < e ? rs + cols : e;
                int64_t g = tpd_model_layout_row_global(&r->lay, p, (int64_t)l * s->rows + row);
                if (g >= 0)
                    TPD_CHECK(segs_push(out, g + (x - rs), re - x,
                                        (int64_t)rg->state + (x - (int64_t)rg->begin)));
                x = re;
            }
        }
    }
    segs_finish(out);
    return TPD_OK;
}

void tpd_ckpt_model_file(int tp, int pp, char *buf, size_t n) {
    snprintf(buf, n, "model_tp%02d_pp%02d.bin", tp, pp);
}

void tpd_ckpt_optim_file(int tp, int pp, int dp, char *buf, size_t n) {
    snprintf(buf, n, "optim_tp%02d_pp%02d_dp%02d.bin", tp, pp, dp);
}

void tpd_ckpt_model_file_r(int tp, int pp, int replica, char *buf, size_t n) {
    if (replica == 0)
        tpd_ckpt_model_file(tp, pp, buf, n);
    else
        snprintf(buf, n, "model_tp%02d_pp%02d_r%02d.bin", tp, pp, replica);
}

void tpd_ckpt_model_file_dp(int tp, int pp, int dp, int replica, char *buf, size_t n) {
    if (dp == 0)
        tpd_ckpt_model_file_r(tp, pp, replica, buf, n);
    else if (replica == 0)
        snprintf(buf, n, "model_tp%02d_pp%02d_dp%02d.bin", tp, pp, dp);
    else
        snprintf(buf, n, "model_tp%02d_pp%02d_dp%02d_r%02d.bin", tp, pp, dp, replica);
}

void tpd_ckpt_optim_file_r(int tp, int pp, int dp, int replica, char *buf, size_t n) {
    if (replica == 0)
        tpd_ckpt_optim_file(tp, pp, dp, buf, n);
    else
        snprintf(buf, n, "optim_tp%02d_pp%02d_dp%02d_r%02d.bin", tp, pp, dp, replica);
}

int tpd_ckpt_kind_slot(int kinds, int k) {
    int slot = 0;
    for (int j = TPD_CKPT_EXP_AVG; j < k; j++)
        slot += (kinds >> j) & 1;
    return slot;
}

tpd_status tpd_ckpt_rank_plan_init(const tpd_ckpt_rank *r, tpd_ckpt_rank_plan *plan_p) {
    tpd_ckpt_rank_plan pl;
    memset(&pl, 0, sizeof pl);
    tpd_status st = TPD_OK;
    for (int p = 0; p < TPD_P_COUNT; p++) {
        TPD_CHECK_GOTO(tpd_ckpt_segs_param(r, (tpd_param)p, 1, &pl.param[p]), st, undo);
        TPD_CHECK_GOTO(tpd_ckpt_segs_state(r, (tpd_param)p, 1, &pl.state[p]), st, undo);
        for (size_t i = 0; i < pl.param[p].n; i++) {
            pl.param[p].v[i].file = pl.param_numel;
            pl.param_numel += pl.param[p].v[i].n;
        }
        for (size_t i = 0; i < pl.state[p].n; i++) {
            pl.state[p].v[i].file = pl.state_numel;
            pl.state_numel += pl.state[p].v[i].n;
        }
    }
    *plan_p = pl;
    return TPD_OK;
undo:
    tpd_ckpt_rank_plan_free(&pl);
    return st;
}

void tpd_ckpt_rank_plan_free(tpd_ckpt_rank_plan *plan) {
    for (int p = 0; p < TPD_P_COUNT; p++) {
        tpd_ckpt_segs_free(&plan->param[p]);
        tpd_ckpt_segs_free(&plan->state[p]);
    }
}

void tpd_ckpt_hf_name(tpd_param p, int l, int pattern, char *buf, size_t n, int *conv1d_p) {
    static const char *const names[TPD_P_COUNT] = {
        [TPD_P_WTE] = "wte.weight",
        [TPD_P_WPE] = "wpe.weight",
        [TPD_P_LN1W] = "ln_1.weight",
        [TPD_P_LN1B] = "ln_1.bias",
        [TPD_P_QKVW] = "attn.c_attn.weight",
        [TPD_P_QKVB] = "attn.c_attn.bias",
        [TPD_P_ATTPROJW] = "attn.c_proj.weight",
        [TPD_P_ATTPROJB] = "attn.c_proj.bias",
        [TPD_P_LN2W] = "ln_2.weight",
        [TPD_P_LN2B] = "ln_2.bias",
        [TPD_P_FCW] = "mlp.c_fc.weight",
        [TPD_P_FCB] = "mlp.c_fc.bias",
        [TPD_P_FCPROJW] = "mlp.c_proj.weight",
        [TPD_P_FCPROJB] = "mlp.c_proj.bias",
        [TPD_P_LNFW] = "ln_f.weight",
        [TPD_P_LNFB] = "ln_f.bias",
        [TPD_P_LMHEAD] = "lm_head.weight",
        [TPD_P_ROUTERW] = "mlp.router.weight",
        [TPD_P_EXPFCW] = "mlp.experts.c_fc.weight",
        [TPD_P_EXPFCB] = "mlp.experts.c_fc.bias",
        [TPD_P_EXPPROJW] = "mlp.experts.c_proj.weight",
        [TPD_P_EXPPROJB] = "mlp.experts.c_proj.bias",
        [TPD_P_SHGATEW] = "mlp.shared_expert_gate.weight",
        [TPD_P_QNORMW] = "attn.q_norm.weight",
        [TPD_P_KNORMW] = "attn.k_norm.weight",
    };
    if (conv1d_p)
        *conv1d_p = p == TPD_P_QKVW || p == TPD_P_ATTPROJW || p == TPD_P_FCW || p == TPD_P_FCPROJW;
    if (!tpd_param_get_info(p)->per_layer)
        snprintf(buf, n, "transformer.%s", names[p]);
    else if (pattern)
        snprintf(buf, n, "transformer.h.{i}.%s", names[p]);
    else
        snprintf(buf, n, "transformer.h.%d.%s", l, names[p]);
}
