/* The comparisons of `tripod verify`: per-step series and global parameters, each failure
 * named by step, or by parameter, layer, stage, chunk and ranks; and for --device cuda the
 * same against the bf16 budget (per step, and per layer against how far it moved). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "engine/verify/verify_internal.h"

tpd_verify_check *tpd_verify_add(tpd_verify_report *rep, const char *name, double tolerance) {
    if (rep->n_checks >= TPD_VERIFY_MAX_CHECKS) return NULL;
    tpd_verify_check *c = &rep->checks[rep->n_checks++];
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", name);
    c->verdict = TPD_VERIFY_PASS;
    c->tolerance = tolerance;
    return c;
}

void tpd_verify_fail(tpd_verify_check *c, const char *fmt, ...) {
    if (!c) return;
    if (c->verdict != TPD_VERIFY_FAIL) { /* the first failure names the place */
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->detail, sizeof c->detail, fmt, ap);
        va_end(ap);
    }
    c->verdict = TPD_VERIFY_FAIL;
}

/* |a - b| / |b|, and 0 for equal values (zeros included); bit-level for exact checks */
static double rel(double a, double b) {
    if (a == b) return 0;
    double d = fabs(b) > 0 ? fabs(a - b) / fabs(b) : fabs(a - b);
    return isnan(d) ? INFINITY : d;
}

void tpd_verify_cmp_series(tpd_verify_check *c, const char *what, const double *got,
                           const double *ref, int n, int first_iter, const char *ref_name) {
    if (!c) return;
    for (int i = 0; i < n; i++) {
        double e = rel(got[i], ref[i]);
        int bad = c->tolerance > 0 ? !(e <= c->tolerance) : memcmp(&got[i], &ref[i], 8) != 0;
        if (bad)
            tpd_verify_fail(c, "%s %.9g at step %d, %s %.9g (relative %.1e)", what, got[i],
                            first_iter + i, ref_name, ref[i], e);
        if (e > c->worst || isnan(e)) c->worst = e;
    }
}

/* sum of (a - b)^2 over n elements; adds sum of (b - z)^2 to *den (z NULL: of b^2) */
static double sq_diff(const float *a, const float *b, const float *z, size_t n, double *den) {
    double num = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i], e = z ? (double)b[i] - z[i] : b[i];
        num += d * d;
        *den += e * e;
    }
    return num;
}

double tpd_verify_rel_diff(const float *a, const float *b, size_t n) {
    double den = 0, num = sq_diff(a, b, NULL, n, &den);
    double e = sqrt(num / (den > 0 ? den : 1));
    return isnan(e) ? INFINITY : e;
}

/* num / den as a relative measure against how far the reference moved: 0 for 0 / 0, +inf
 * for a difference where the reference did not move, and for NaN */
static double moved_ratio(double num, double den) {
    if (num == 0 && den == 0) return 0;
    double e = den > 0 ? sqrt(num / den) : INFINITY;
    return isnan(e) ? INFINITY : e;
}

double tpd_verify_moved_diff(const float *got, const float *ref, const float *init, size_t n) {
    double den = 0, num = sq_diff(got, ref, init, n, &den);
    return moved_ratio(num, den);
}

/* Where global layer l lives in cfg's layout: its stage and chunk; -1 when nowhere. */
static int stage_of_layer(const tpd_config *cfg, int l, int *chunk_p) {
    int pp = cfg->parallel.pipeline_model_parallel_size;
    int v = cfg->parallel.virtual_pipeline_model_parallel_size;
    for (int s = 0; s < pp; s++)
        for (int c = 0; c < v; c++) {
            int first = 0, n = tpd_config_stage_layers(cfg, pp, v, s, c, &first);
            if (l >= first && l < first + n) {
                *chunk_p = c;
                return s;
            }
        }
    return -1;
}

/* The TP rank holding element (row, col) of one layer's piece of p: -1 when every TP rank
 * holds it (replicated). */
static int tp_of(const tpd_model_layout *g, const tpd_config *cfg, tpd_param p, int row, int col) {
    int tp = cfg->parallel.tensor_model_parallel_size;
    const tpd_param_slice *s = &g->p[p];
    if (tp <= 1) return 0;
    switch (s->split) {
    case TPD_SPLIT_ROWS:
        return row / (s->g_rows / tp);
    case TPD_SPLIT_GLU:
        return (row % (s->g_rows / 2)) / (s->g_rows / 2 / tp);
    case TPD_SPLIT_EXPERT: {
        int per = s->g_rows / g->d.E, r = row % per, half = g->d.glu ? per / 2 : per;
        return (r % half) / (half / tp);
    }
    case TPD_SPLIT_COLS:
        return col / (s->g_cols / tp);
    case TPD_SPLIT_VOCAB:
        return row / (tpd_config_padded_vocab(cfg, tp) / tp);
    case TPD_SPLIT_QKV: {
        int q = g->d.NH * g->d.HS, kv = g->d.NKV * g->d.HS;
        if (row < q) return row / (q / tp);
        row = (row - q) % kv;
        return row / (kv / tp);
    }
    default:
        return -1;
    }
}

/* "stage 3 of 8, chunk 1, rank 7 (TP 1)" for element e of layer l of p under cfg's layout */
static void place(const tpd_model_layout *g, const tpd_config *cfg, tpd_param p, int l, size_t e,
                  char *buf, size_t n) {
    int tp = cfg->parallel.tensor_model_parallel_size,
        pp = cfg->parallel.pipeline_model_parallel_size;
    int dp = cfg->parallel.data_parallel_size > 0 ? cfg->parallel.data_parallel_size : 1;
    const tpd_param_slice *s = &g->p[p];
    int chunk = 0, stage;
    if (tpd_param_get_info(p)->per_layer)
        stage = stage_of_layer(cfg, l, &chunk);
    else
        stage = p == TPD_P_WTE || p == TPD_P_WPE ? 0 : pp - 1;
    int t = tp_of(g, cfg, p, (int)(e / (size_t)s->g_cols), (int)(e % (size_t)s->g_cols));
    int r0 = tp * dp * (stage < 0 ? 0 : stage);
    if (stage < 0)
        snprintf(buf, n, "no stage holds it");
    else if (t >= 0)
        snprintf(buf, n, "stage %d of %d, chunk %d, rank %d (TP %d, DP 0)", stage, pp, chunk,
                 r0 + t, t);
    else
        snprintf(buf, n, "stage %d of %d, chunk %d, ranks %d..%d (replicated over TP)", stage, pp,
                 chunk, r0, r0 + tp - 1);
}

/* tpd_verify_cmp_params, and with init tpd_verify_cmp_moved */
static void cmp_tensors(tpd_verify_check *c, const tpd_config *cfg, float *const got[],
                        float *const ref[], float *const init[], const char *when) {
    if (!c) return;
    tpd_model_layout g;
    if (tpd_model_layout_init(cfg, 1, 0, 1, 0, &g) != TPD_OK) {
        tpd_verify_fail(c, "the model's layout could not be built");
        return;
    }
    for (int p = 0; p < TPD_P_COUNT; p++) {
        const tpd_param_slice *s = &g.p[p];
        if (!tpd_model_has_param(cfg, (tpd_param)p) || !got[p] || !ref[p] || (init && !init[p]))
            continue;
        /* per tensor, as the equivalence tests measure it; the layer that differs most and
         * its largest element name the place. Against init, per layer: each layer's piece
         * against how far it moved (a layer the device left alone is not averaged away) */
        size_t piece = (size_t)s->g_rows * s->g_cols, at = 0;
        double num = 0, den = 0, worst_layer = -1, big = -1, moved_worst = 0;
        int layer = 0;
        for (int l = 0; l < s->g_layers; l++) {
            size_t at_l = (size_t)l * piece;
            double lden = 0;
            double lnum =
                sq_diff(got[p] + at_l, ref[p] + at_l, init ? init[p] + at_l : NULL, piece, &lden);
            num += lnum;
            den += lden;
            double score = init ? moved_ratio(lnum, lden) : lnum;
            if (score > worst_layer || isnan(score)) {
                worst_layer = isnan(score) ? INFINITY : score;
                layer = l;
            }
            if (init && !(moved_ratio(lnum, lden) <= moved_worst))
                moved_worst = moved_ratio(lnum, lden);
        }
        const float *a = got[p] + (size_t)layer * piece, *b = ref[p] + (size_t)layer * piece;
        for (size_t i = 0; i < piece; i++) {
            double d = fabs((double)a[i] - b[i]);
            if (d > big || isnan(d)) {
                big = isnan(d) ? INFINITY : d;
                at = i;
            }
        }
        double e = init ? moved_worst : sqrt(num / (den > 0 ? den : 1));
        if (isnan(e)) e = INFINITY;
        int bad = c->tolerance > 0 ? !(e <= c->tolerance)
                                   : memcmp(got[p], ref[p], piece * (size_t)s->g_layers * 4) != 0;
        if (e > c->worst) c->worst = e;
        if (!bad) continue;
        char name[64], where[128];
        const char *pn = tpd_param_get_info((tpd_param)p)->name;
        if (tpd_param_get_info((tpd_param)p)->per_layer)
            snprintf(name, sizeof name, "layers.%d.%s", layer, pn);
        else
            snprintf(name, sizeof name, "%s", pn);
        place(&g, cfg, (tpd_param)p, layer, at, where, sizeof where);
        char how[96];
        if (init)
            snprintf(how, sizeof how, "relative to how far the reference moved it");
        else
            snprintf(how, sizeof how, "relative, over the %s tensor", pn);
        tpd_verify_fail(c,
                        "param %s differs by %.1e (%s) %s; element %zu: %.9g vs %.9g; held by %s",
                        name, e, how, when, at, a[at], b[at], where);
    }
}

void tpd_verify_cmp_params(tpd_verify_check *c, const tpd_config *cfg, float *const got[],
                           float *const ref[], const char *when) {
    cmp_tensors(c, cfg, got, ref, NULL, when);
}

void tpd_verify_cmp_moved(tpd_verify_check *c, const tpd_config *cfg, float *const got[],
                          float *const ref[], float *const init[], const char *when) {
    cmp_tensors(c, cfg, got, ref, init, when);
}

void tpd_verify_cmp_budget(tpd_verify_check *c, const char *what, const double *got,
                           const double *ref, int n, const tpd_verify_budget *b,
                           tpd_verify_bound_fn bound) {
    if (!c) return;
    char steps[256] = "";
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        double d = got[i] - ref[i], e = ref[i] != 0 ? d / ref[i] : d, lim = bound(b, i + 1);
        if (e < 0) e = -e;
        if (isnan(e)) e = INFINITY;
        if (!(e <= lim))
            tpd_verify_fail(c,
                            "%s %.9g at step %d, the cpu's %.9g (relative %.1e, budget %.1e at "
                            "step %d)",
                            what, got[i], i + 1, ref[i], e, lim, i + 1);
        if (e > c->worst) c->worst = e;
        if (k < sizeof steps)
            k += (size_t)snprintf(steps + k, sizeof steps - k, "%s%.1e of %.1e", i ? ", " : "", e,
                                  lim);
    }
    if (c->verdict == TPD_VERIFY_PASS)
        snprintf(c->detail, sizeof c->detail, "per step, relative against its budget: %s", steps);
}
