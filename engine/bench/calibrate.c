/* Calibration of the cpu backend's kernels at the model's shapes, the profile it
 * yields, and the `tripod bench --calibrate` command. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "engine/bench/calibrate.h"
#include "base/bf16.h"
#include "base/clock.h"
#include "base/cpu.h"
#include "engine/bench/calib_timer.h"
#include "engine/bench/calibrate_internal.h"

#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/plan/plan.h"
#include "engine/train/train.h"
#include "kernels/kernels.h"

#define MAX_POINTS 512
#define MAX_SIZES 64

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* ---- kernel arguments ---- */

typedef struct bufs {
    tpd_kern_backend *kb;
    float *a, *b, *c, *d, *e; /* scratch, each `elems` floats (bf16 runs use their front) */
    int bf16;                 /* the backend computes in bf16 (training.precision) */
    float *mean, *rstd;       /* (N) */
    int32_t *tgt;             /* (N) */
    size_t elems;
    int N, C, OC; /* shapes of the call being timed */
    int B, T, NH, HS;
    size_t n;
} bufs;

static tpd_status k_mm_fwd(void *p) {
    bufs *x = p;
    return tpd_kern_matmul_fwd(x->kb, x->c, x->a, x->b, NULL, x->N, x->C, x->OC);
}
static tpd_status k_mm_bwd(void *p) {
    bufs *x = p;
    return tpd_kern_matmul_bwd(x->kb, x->d, x->e, NULL, x->c, x->a, x->b, x->N, x->C, x->OC);
}
static tpd_status k_att_fwd(void *p) {
    bufs *x = p;
    return tpd_kern_attention_fwd(x->kb, x->c, x->d, x->a, x->B, x->T, x->NH, x->NH, x->HS);
}
static tpd_status k_att_bwd(void *p) {
    bufs *x = p;
    return tpd_kern_attention_bwd(x->kb, x->e, x->c, x->a, x->c, x->d, x->B, x->T, x->NH, x->NH,
                                  x->HS);
}
static tpd_status k_add(void *p) {
    bufs *x = p;
    return tpd_kern_add(x->kb, x->c, x->a, x->b, x->n);
}
static tpd_status k_ln_fwd(void *p) {
    bufs *x = p;
    return tpd_kern_layernorm_fwd(x->kb, x->c, x->mean, x->rstd, x->a, x->b, x->e, x->N, x->C,
                                  1e-5f);
}
static tpd_status k_ln_bwd(void *p) {
    bufs *x = p;
    return tpd_kern_layernorm_bwd(x->kb, x->d, x->e, x->e + x->C, x->c, x->a, x->b, x->mean,
                                  x->rstd, x->N, x->C);
}
static tpd_status k_gelu_fwd(void *p) {
    bufs *x = p;
    return tpd_kern_gelu_fwd(x->kb, x->c, x->a, x->n);
}
static tpd_status k_gelu_bwd(void *p) {
    bufs *x = p;
    return tpd_kern_gelu_bwd(x->kb, x->d, x->a, x->c, x->n);
}
static tpd_status k_xent_fwd(void *p) {
    bufs *x = p;
    float *mx = x->e, *se = x->e + x->N, *tg = x->e + 2 * (size_t)x->N,
          *loss = x->e + 3 * (size_t)x->N;
    TPD_CHECK(tpd_kern_xent_max(x->kb, mx, x->a, x->N, x->OC, x->OC));
    TPD_CHECK(tpd_kern_xent_sumexp(x->kb, se, tg, x->a, mx, x->tgt, x->N, x->OC, x->OC, 0));
    return tpd_kern_xent_loss(x->kb, loss, mx, se, tg, x->N);
}
static tpd_status k_xent_bwd(void *p) {
    bufs *x = p;
    /* In place on a copy-free scratch: the values stay finite over repetitions. */
    return tpd_kern_xent_bwd(x->kb, x->c, x->e, x->e + x->N, x->tgt, 1e-3f, x->N, x->OC, x->OC, 0);
}
static tpd_status k_adamw(void *p) {
    bufs *x = p;
    /* bf16: the fp32 master is updated and the bf16 parameters receive its cast */
    return tpd_kern_adamw(x->kb, x->a, x->bf16 ? x->e : NULL, x->b, x->c, x->d, x->n, 1e-4f, 0.9f,
                          0.95f, 1e-8f, 0.1f, 1, 1.0f);
}
static tpd_status k_sumsq(void *p) {
    bufs *x = p;
    double s;
    return tpd_kern_sumsq(x->kb, x->a, tpd_kern_grad_dtype(x->kb), x->n, &s);
}
static tpd_status k_zero(void *p) {
    bufs *x = p;
    return tpd_kern_zero(x->kb, x->c, x->n * tpd_dtype_size(tpd_kern_grad_dtype(x->kb)));
}

/* ---- shapes ---- */

typedef struct shapes {
    int tp[8], ntp;
    int mbs[8], nmbs;
} shapes;

static void add_unique(int *v, int *n, int cap, int x) {
    for (int i = 0; i < *n; i++)
        if (v[i] == x) return;
    if (*n < cap) v[(*n)++] = x;
}

static void shapes_of(const tpd_config *cfg, int world, shapes *s) {
    memset(s, 0, sizeof *s);
    for (int t = 1; t <= world && t <= cfg->model.num_attention_heads; t *= 2)
        if (world % t == 0 && cfg->model.num_attention_heads % t == 0)
            add_unique(s->tp, &s->ntp, 8, t);
    int gbs = cfg->training.global_batch_size;
    for (int b = 1; b <= 4; b *= 2)
        if (gbs % b == 0) add_unique(s->mbs, &s->nmbs, 8, b);
    add_unique(s->mbs, &s->nmbs, 8, cfg->training.micro_batch_size);
}

/* Sorted (flops, rate) points to an efficiency curve: points within 3% of FLOPs merge,
 * at most TPD_PLAN_MAX_CURVE stay (neighbours merge, closest in log FLOPs first). */
static void build_curve(double *fl, double *rate, int n, double peak, int *len_p, double *xs,
                        double *ys) {
    int m = 0;
    double w[MAX_POINTS];
    /* insertion sort by flops (n is small) */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && fl[j] < fl[j - 1]; j--) {
            double t = fl[j];
            fl[j] = fl[j - 1];
            fl[j - 1] = t;
            t = rate[j];
            rate[j] = rate[j - 1];
            rate[j - 1] = t;
        }
    for (int i = 0; i < n; i++) {
        if (m > 0 && fl[i] <= xs[m - 1] * 1.03) {
            ys[m - 1] = (ys[m - 1] * w[m - 1] + rate[i]) / (w[m - 1] + 1);
            xs[m - 1] = (xs[m - 1] * w[m - 1] + fl[i]) / (w[m - 1] + 1);
            w[m - 1] += 1;
            continue;
        }
        if (m == MAX_POINTS) break;
        xs[m] = fl[i];
        ys[m] = rate[i];
        w[m++] = 1;
    }
    while (m > TPD_PLAN_MAX_CURVE) {
        int best = 0;
        for (int i = 1; i + 1 < m; i++)
            if (log(xs[i + 1] / xs[i]) < log(xs[best + 1] / xs[best])) best = i;
        xs[best] = (xs[best] * w[best] + xs[best + 1] * w[best + 1]) / (w[best] + w[best + 1]);
        ys[best] = (ys[best] * w[best] + ys[best + 1] * w[best + 1]) / (w[best] + w[best + 1]);
        w[best] += w[best + 1];
        memmove(xs + best + 1, xs + best + 2, (size_t)(m - best - 2) * sizeof *xs);
        memmove(ys + best + 1, ys + best + 2, (size_t)(m - best - 2) * sizeof *ys);
        memmove(w + best + 1, w + best + 2, (size_t)(m - best - 2) * sizeof *w);
        m--;
    }
    for (int i = 0; i < m; i++) {
        double e = ys[i] / peak;
        ys[i] = e > 1.0 ? 1.0 : (e < 1e-4 ? 1e-4 : e);
    }
    *len_p = m;
}

static double median_of(double *v, int n) {
    if (n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Seconds per element of a kernel: total time over total elements of the sizes. */
static tpd_status per_element(tpd_comm *w, const tpd_calib_options *o, bufs *x, tpd_calib_fn fn,
                              const size_t *sizes, int ns, double *ns_p) {
    double tt = 0, nn = 0;
    for (int i = 0; i < ns; i++) {
        double t;
        x->n = sizes[i];
        TPD_CHECK(tpd_calib_time(w, o, fn, x, &t));
        tt += t;
        nn += (double)sizes[i];
    }
    *ns_p = nn > 0 ? tt / nn : 0;
    return TPD_OK;
}

static void add_size(size_t *v, int *n, size_t x) {
    for (int i = 0; i < *n; i++)
        if (v[i] == x) return;
    if (*n < MAX_SIZES && x > 0) v[(*n)++] = x;
}

static tpd_status measure_kernels(const tpd_config *cfg, tpd_comm *w, const tpd_calib_options *o,
                                  tpd_kern_backend *kb, tpd_plan_cluster *c, char *notes,
                                  size_t nlen) {
    tpd_status st = TPD_OK;
    const tpd_config_model *md = &cfg->model;
    shapes sh;
    shapes_of(cfg, tpd_comm_size(w), &sh);
    int T = md->seq_length, C = md->hidden_size, NH = md->num_attention_heads;
    int F = md->ffn_hidden_size, HS = tpd_config_head_dim(cfg);
    int maxmbs = 1;
    for (int i = 0; i < sh.nmbs; i++)
        maxmbs = sh.mbs[i] > maxmbs ? sh.mbs[i] : maxmbs;
    int Vp = tpd_config_padded_vocab(cfg, 1), Nmax = maxmbs * T;
    double params = tpd_plan_params_count(cfg);
    int QW = NH * HS > C ? NH * HS : C; /* the query heads' width (kv_channels) */
    size_t wide = (size_t)(3 * QW > F ? 3 * QW : F);
    if ((size_t)Vp > wide) wide = (size_t)Vp;
    size_t elems = (size_t)Nmax * wide;
    size_t att = (size_t)maxmbs * NH * T * T;
    if (att > elems) elems = att;
    if (wide * (size_t)(C > F ? C : F) > elems) elems = wide * (size_t)(C > F ? C : F);
    if ((size_t)(params * 1.1) > elems) elems = (size_t)(params * 1.1);
    bufs x = {.kb = kb, .elems = elems, .bf16 = tpd_kern_act_dtype(kb) == TPD_DTYPE_BF16};
    float **all[5] = {&x.a, &x.b, &x.c, &x.d, &x.e};
    int got = 0;
    for (; got < 5; got++)
        TPD_CHECK_GOTO(tpd_kern_alloc(kb, elems * sizeof(float), (void **)all[got]), st, free_bufs);
    x.mean = malloc((size_t)Nmax * sizeof(float));
    x.rstd = malloc((size_t)Nmax * sizeof(float));
    x.tgt = malloc((size_t)Nmax * sizeof(int32_t));
    if (!x.mean || !x.rstd || !x.tgt)
        TPD_FAIL_GOTO(TPD_ERR_NOMEM, st, free_bufs, "calibrate: out of memory");
    for (size_t i = 0; i < elems; i++) {
        float v = 0.01f * (float)((i * 2654435761u) % 1000) / 1000.0f;
        x.a[i] = v;
        x.b[i] = 0.5f * v + 0.001f;
        x.c[i] = v;
        x.d[i] = 0.0f;
        x.e[i] = 1.0f;
    }
    if (x.bf16) /* the same values as bf16, two to a float: read as fp32 they stay small */
        for (size_t i = 0; i < 2 * elems; i++) {
            float v = 0.01f * (float)((i * 2654435761u) % 1000) / 1000.0f;
            ((uint16_t *)x.a)[i] = tpd_bf16_from_f32(v);
            ((uint16_t *)x.b)[i] = tpd_bf16_from_f32(0.5f * v + 0.001f);
            ((uint16_t *)x.c)[i] = tpd_bf16_from_f32(v);
        }
    for (int i = 0; i < Nmax; i++)
        x.tgt[i] = (i * 7) % (Vp > 257 ? 257 : Vp);

    /* Linear layers and attention. */
    double fl[MAX_POINTS], rate[MAX_POINTS], ratio[MAX_POINTS];
    double afl[MAX_POINTS], arate[MAX_POINTS], aratio[MAX_POINTS];
    int np = 0, na = 0;
    double peak = 0;
    size_t off = strlen(notes);
    off += (size_t)snprintf(notes + off, nlen - off, "kernels (per call, every rank at once):\n");
    for (int it = 0; it < sh.ntp; it++) {
        int t = sh.tp[it], Vl = tpd_config_padded_vocab(cfg, t) / t;
        for (int ib = 0; ib < sh.nmbs; ib++) {
            int N = sh.mbs[ib] * T;
            int mm[5][2] = {{C, 3 * C / t}, {C / t, C}, {C, F / t}, {F / t, C}, {C, Vl}};
            for (int g = 0; g < 5 && np < MAX_POINTS; g++) {
                double tf, tb;
                x.N = N;
                x.C = mm[g][0];
                x.OC = mm[g][1];
                TPD_CHECK_GOTO(tpd_calib_time(w, o, k_mm_fwd, &x, &tf), st, free_bufs);
                TPD_CHECK_GOTO(tpd_calib_time(w, o, k_mm_bwd, &x, &tb), st, free_bufs);
                fl[np] = 2.0 * N * x.C * x.OC;
                rate[np] = fl[np] / tf;
                ratio[np] = tb / tf;
                if (rate[np] > peak) peak = rate[np];
                if (off < nlen)
                    off += (size_t)snprintf(notes + off, nlen - off,
                                            "  matmul N=%d C=%d OC=%d: fwd %.1f us (%.2f GFLOP/s), "
                                            "bwd %.1f us\n",
                                            N, x.C, x.OC, 1e6 * tf, rate[np] / 1e9, 1e6 * tb);
                np++;
            }
            double tf, tb;
            x.B = sh.mbs[ib];
            x.T = T;
            x.NH = NH / t;
            x.HS = HS;
            TPD_CHECK_GOTO(tpd_calib_time(w, o, k_att_fwd, &x, &tf), st, free_bufs);
            TPD_CHECK_GOTO(tpd_calib_time(w, o, k_att_bwd, &x, &tb), st, free_bufs);
            afl[na] = tpd_plan_cpu_attention_flops(x.B, T, x.NH, HS);
            arate[na] = afl[na] / tf;
            aratio[na] = tb / tf;
            if (off < nlen)
                off +=
                    (size_t)snprintf(notes + off, nlen - off,
                                     "  attention B=%d T=%d heads=%d: fwd %.1f us, bwd %.1f us\n",
                                     x.B, T, x.NH, 1e6 * tf, 1e6 * tb);
            na++;
        }
    }
    c->peak_flops = peak;
    build_curve(fl, rate, np, peak, &c->gemm_curve_len, c->gemm_curve_flops, c->gemm_curve_eff);
    build_curve(afl, arate, na, peak, &c->attn_curve_len, c->attn_curve_flops, c->attn_curve_eff);
    c->gemm_bwd_ratio = median_of(ratio, np);
    c->attn_bwd_ratio = median_of(aratio, na);

    /* Memory-bound kernels at the model's sizes. */
    size_t s_nc[MAX_SIZES], s_nf[MAX_SIZES], s_par[MAX_SIZES];
    int n_nc = 0, n_nf = 0, n_par = 0;
    for (int it = 0; it < sh.ntp; it++)
        for (int ib = 0; ib < sh.nmbs; ib++) {
            size_t N = (size_t)sh.mbs[ib] * T;
            add_size(s_nc, &n_nc, N);
            add_size(s_nf, &n_nf, N * (size_t)(F / sh.tp[it]));
        }
    for (double d = 1; d <= 16 && params / d >= 1024; d *= 2)
        add_size(s_par, &n_par, (size_t)(params / d));
    size_t s_add[MAX_SIZES];
    int n_add = 0;
    for (int i = 0; i < n_nc; i++)
        add_size(s_add, &n_add, s_nc[i] * (size_t)C);
    for (int i = 0; i < n_nf; i++)
        add_size(s_add, &n_add, s_nf[i]);
    TPD_CHECK_GOTO(per_element(w, o, &x, k_add, s_add, n_add, &c->ew_add), st, free_bufs);
    TPD_CHECK_GOTO(per_element(w, o, &x, k_gelu_fwd, s_nf, n_nf, &c->ew_gelu_fwd), st, free_bufs);
    TPD_CHECK_GOTO(per_element(w, o, &x, k_gelu_bwd, s_nf, n_nf, &c->ew_gelu_bwd), st, free_bufs);
    TPD_CHECK_GOTO(per_element(w, o, &x, k_adamw, s_par, n_par, &c->ew_adamw), st, free_bufs);
    TPD_CHECK_GOTO(per_element(w, o, &x, k_sumsq, s_par, n_par, &c->ew_sumsq), st, free_bufs);
    TPD_CHECK_GOTO(per_element(w, o, &x, k_zero, s_par, n_par, &c->ew_zero), st, free_bufs);
    /* Row kernels: (N, C) LayerNorm and (N, Vl) cross-entropy, per element. */
    double ln_f = 0, ln_b = 0, xe_f = 0, xe_b = 0, n_ln = 0, n_xe = 0;
    for (int i = 0; i < n_nc; i++) {
        double tf, tb;
        x.N = (int)s_nc[i];
        x.C = C;
        TPD_CHECK_GOTO(tpd_calib_time(w, o, k_ln_fwd, &x, &tf), st, free_bufs);
        TPD_CHECK_GOTO(tpd_calib_time(w, o, k_ln_bwd, &x, &tb), st, free_bufs);
        ln_f += tf;
        ln_b += tb;
        n_ln += (double)x.N * C;
        for (int it = 0; it < sh.ntp; it++) {
            x.OC = tpd_config_padded_vocab(cfg, sh.tp[it]) / sh.tp[it];
            TPD_CHECK_GOTO(tpd_calib_time(w, o, k_xent_fwd, &x, &tf), st, free_bufs);
            TPD_CHECK_GOTO(tpd_calib_time(w, o, k_xent_bwd, &x, &tb), st, free_bufs);
            xe_f += tf;
            xe_b += tb;
            n_xe += (double)x.N * x.OC;
        }
    }
    c->ew_layernorm_fwd = n_ln > 0 ? ln_f / n_ln : 0;
    c->ew_layernorm_bwd = n_ln > 0 ? ln_b / n_ln : 0;
    c->ew_xent_fwd = n_xe > 0 ? xe_f / n_xe : 0;
    c->ew_xent_bwd = n_xe > 0 ? xe_b / n_xe : 0;
    /* The add kernel reads two elements and writes one (4 bytes each, 2 under bf16). */
    c->hbm_bw = c->ew_add > 0 ? 3.0 * tpd_dtype_size(tpd_kern_act_dtype(kb)) / c->ew_add : 1e9;
    if (off < nlen)
        snprintf(notes + off, nlen - off,
                 "  per element (ns): add %.3g, layernorm %.3g/%.3g, gelu %.3g/%.3g, "
                 "xent %.3g/%.3g, adamw %.3g, sumsq %.3g, zero %.3g\n",
                 1e9 * c->ew_add, 1e9 * c->ew_layernorm_fwd, 1e9 * c->ew_layernorm_bwd,
                 1e9 * c->ew_gelu_fwd, 1e9 * c->ew_gelu_bwd, 1e9 * c->ew_xent_fwd,
                 1e9 * c->ew_xent_bwd, 1e9 * c->ew_adamw, 1e9 * c->ew_sumsq, 1e9 * c->ew_zero);
free_bufs:
    free(x.tgt);
    free(x.rstd);
    free(x.mean);
    for (int i = 0; i < got; i++)
        tpd_kern_free(kb, *all[i]);
    return st;
}

/* The extra wait of a sync that follows compute: every rank runs a linear layer of the
 * model and then all-reduces one activation in its group (as TP does), against the two
 * alone. Ranks that share cores reach the all-reduce a scheduler time slice apart; ranks
 * with a core each do not, and the difference is then about 0. */
typedef struct sync_arg {
    tpd_kern_backend *kb;
    tpd_comm *g;
    float *a, *w, *o, *act;
    int N, C, OC, mode; /* 1: compute, 2: all-reduce, 3: both */
} sync_arg;

static tpd_status k_sync(void *p) {
    sync_arg *s = p;
    if (s->mode & 1)
        TPD_CHECK(tpd_kern_matmul_fwd(s->kb, s->o, s->a, s->w, NULL, s->N, s->C, s->OC));
    if ((s->mode & 2) && s->g)
        TPD_CHECK(tpd_comm_allreduce(s->g, s->act, s->act, (size_t)s->N * s->C,
                                     tpd_kern_act_dtype(s->kb), TPD_COMM_OP_SUM, NULL));
    return TPD_OK;
}

static tpd_status measure_sync(const tpd_config *cfg, tpd_comm *w, const tpd_calib_options *o,
                               tpd_kern_backend *kb, tpd_plan_cluster *c, char *notes,
                               size_t nlen) {
    tpd_status st = TPD_OK;
    c->sync_latency = c->sync_latency_all = 0;
    if (tpd_comm_size(w) < 2) return TPD_OK;
    const tpd_config_model *md = &cfg->model;
    sync_arg s = {.kb = kb};
    s.N = cfg->training.micro_batch_size * md->seq_length;
    s.C = md->hidden_size;
    s.OC = md->ffn_hidden_size;
    size_t big = (size_t)s.N * (s.OC > s.C ? s.OC : s.C);
    if ((size_t)s.OC * s.C > big) big = (size_t)s.OC * s.C;
    s.a = calloc(big, sizeof(float));
    s.w = calloc(big, sizeof(float));
    s.o = calloc(big, sizeof(float));
    s.act = calloc(big, sizeof(float));
    if (!s.a || !s.w || !s.o || !s.act)
        TPD_FAIL_GOTO(TPD_ERR_NOMEM, st, free_bufs, "calibrate: out of memory");
    /* Groups of 2 (TP, p2p pairs) and the whole world (DP, loss). */
    int groups[2] = {2, tpd_comm_size(w)};
    for (int gi = 0; gi < (tpd_comm_size(w) > 2 ? 2 : 1); gi++) {
        int g = groups[gi];
        if (tpd_comm_size(w) % g != 0) continue;
        TPD_CHECK_GOTO(tpd_comm_split(w, tpd_comm_rank(w) / g, tpd_comm_rank(w), "calib", &s.g), st,
                       free_bufs);
        /* A time slice is milliseconds: average over many of them (10x the budget). */
        tpd_calib_options lo = *o;
        lo.budget_s = 10 * o->budget_s;
        double t[4] = {0};
        for (s.mode = 1; s.mode <= 3 && st == TPD_OK; s.mode++)
            st = tpd_calib_time(w, &lo, k_sync, &s, &t[s.mode]);
        tpd_comm_destroy(s.g);
        s.g = NULL;
        if (st != TPD_OK) goto free_bufs;
        double pen = t[3] - t[1] - t[2];
        if (pen < 0) pen = 0;
        if (g == 2) c->sync_latency = pen;
        if (g == tpd_comm_size(w)) c->sync_latency_all = pen;
        size_t off = strlen(notes);
        if (off < nlen)
            snprintf(notes + off, nlen - off,
                     "  sync after compute, group %d: compute %.1f us + all-reduce %.1f us, "
                     "together %.1f us\n",
                     g, 1e6 * t[1], 1e6 * t[2], 1e6 * t[3]);
    }
free_bufs:
    free(s.act);
    free(s.o);
    free(s.w);
    free(s.a);
    return st;
}

/* Ranks on this node and the cores they may run on: the union of their affinity masks
 * (each may be bound to its own core; containers narrow them). Collective. */
static tpd_status node_share(tpd_comm *world, int *ranks_p, int *cores_p) {
    tpd_comm *node = NULL;
    TPD_CHECK(tpd_comm_mpi_split_node(world, &node));
    int n = tpd_comm_size(node);
    cpu_set_t mine, *all = calloc((size_t)n, sizeof *all);
    tpd_status st = all ? TPD_OK : TPD_ERR_NOMEM;
    CPU_ZERO(&mine);
    if (sched_getaffinity(0, sizeof mine, &mine) != 0)
        for (int i = 0; i < tpd_cpu_online_cores() && i < CPU_SETSIZE; i++)
            CPU_SET(i, &mine);
    /* every rank allocates the same, so all take the same branch */
    if (st == TPD_OK) st = tpd_comm_allgather(node, &mine, all, sizeof mine, TPD_DTYPE_U8, NULL);
    if (st == TPD_OK) {
        for (int r = 1; r < n; r++)
            CPU_OR(&all[0], &all[0], &all[r]);
        *ranks_p = n;
        *cores_p = CPU_COUNT(&all[0]);
    } else if (st == TPD_ERR_NOMEM) {
        tpd_log_error("calibrate: out of memory");
    }
    free(all);
    tpd_comm_destroy(node);
    return st;
}

tpd_status tpd_calib_run(const tpd_config *cfg, tpd_comm *world, const tpd_calib_options *opt,
                         tpd_plan_cluster *cluster_p, char **notes_p) {
    tpd_status st = TPD_OK;
    if (!tpd_comm_is_host(world)) {
        tpd_log_error("calibrate: needs a host (MPI) world communicator");
        return TPD_ERR_UNSUPPORTED;
    }
    int per_node = 0, node_cores = 0;
    TPD_CHECK(node_share(world, &per_node, &node_cores));

    size_t nlen = 1 << 16;
    char *notes = calloc(nlen, 1);
    if (!notes) {
        tpd_log_error("calibrate: out of memory");
        return TPD_ERR_NOMEM;
    }
    tpd_plan_cluster c;
    memset(&c, 0, sizeof c);
    snprintf(c.name, sizeof c.name, "%s", opt->name[0] ? opt->name : "calibrated-cpu");
    c.backend = TPD_PLAN_BACKEND_CPU;
    c.calibrated = 1;
    c.gpus_per_node = per_node;
    c.cpu_cores = node_cores > 0 ? node_cores : tpd_cpu_usable_cores();
    c.calibration_ranks = per_node;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    c.hbm_bytes = pages > 0 && page > 0 ? (double)pages * page / per_node : 8.0 * 1073741824.0;
    c.hbm_usable_fraction = 0.9;
    c.mem_efficiency = 1.0;
    c.coll_efficiency = 1.0;
    c.flash_efficiency = 0.3;
    c.p2p_latency = -1;
    snprintf(notes, nlen, "%d ranks per node on %g cores; model shapes of %s\n", per_node,
             c.cpu_cores, cfg->source_path[0] ? cfg->source_path : "the defaults");

    tpd_kern_backend *kb = NULL;
    tpd_kern_config kc = TPD_KERN_CONFIG_INIT;
    kc.num_threads = tpd_trainer_cpu_threads(cfg, per_node); /* as training runs */
    /* in the config's precision: bf16's kernels (oneDNN matmuls, conversions) are others */
    c.calibrated_bf16 = cfg->training.precision == TPD_PRECISION_BF16;
    kc.dtype = c.calibrated_bf16 ? TPD_DTYPE_BF16 : TPD_DTYPE_F32;
    kc.fp32_grads = tpd_config_grad_bytes(cfg) == 4;
    TPD_CHECK_GOTO(tpd_kern_cpu_create(&kc, &kb), st, free_notes);
    if (opt->verbose) printf("calibrate: kernels at the model's shapes ...\n");
    TPD_CHECK_GOTO(measure_kernels(cfg, world, opt, kb, &c, notes, nlen), st, free_backend);
    if (opt->verbose) printf("calibrate: collectives and p2p ...\n");
    TPD_CHECK_GOTO(tpd_calib_comm(world, cfg, opt, &c, notes, nlen), st, free_backend);
    TPD_CHECK_GOTO(measure_sync(cfg, world, opt, kb, &c, notes, nlen), st, free_backend);
    *cluster_p = c;
    if (notes_p) {
        *notes_p = notes;
        notes = NULL;
    }
free_backend:
    tpd_kern_backend_destroy(kb);
free_notes:
    free(notes);
    return st;
}
