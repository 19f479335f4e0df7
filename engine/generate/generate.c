#include "engine/generate/generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/data/data.h"

/* rng stream of the sampling draws (the init and data streams use others) */
#define GEN_RNG_STREAM 777

static int cmp_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

int tpd_generate_sample(const float *logits, int n, double temperature, int top_k, double top_p,
                        double u) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    if (temperature <= 0 || n < 2) return best;
    /* keep the logits >= cut: the k-th largest, raised to the nucleus edge with top_p */
    float cut = -INFINITY;
    int use_k = top_k > 0 && top_k<n, use_p = top_p> 0 && top_p < 1;
    if (use_k || use_p) {
        float *s = malloc((size_t)n * sizeof *s);
        if (!s) return best;
        memcpy(s, logits, (size_t)n * sizeof *s);
        qsort(s, (size_t)n, sizeof *s, cmp_desc);
        int k = use_k ? top_k : n;
        cut = s[k - 1];
        if (use_p) {
            double z = 0, acc = 0;
            for (int i = 0; i < k; i++)
                z += exp((s[i] - s[0]) / temperature);
            for (int i = 0; i < k; i++) {
                acc += exp((s[i] - s[0]) / temperature);
                if (acc >= top_p * z) {
                    cut = s[i];
                    break;
                }
            }
        }
        free(s);
    }
    double max = logits[best], total = 0;
    for (int i = 0; i < n; i++)
        if (logits[i] >= cut) total += exp((logits[i] - max) / temperature);
    double target = u * total, acc = 0;
    int last = best;
    for (int i = 0; i < n; i++) {
        if (logits[i] < cut) continue;
        acc += exp((logits[i] - max) / temperature);
        last = i;
        if (acc > target) return i;
    }
    return last;
}

/* ---- incremental decoding with a key/value cache ----
 *
 * One new position at a time: its q, k, v come from one row of each layer; k and v are
 * kept per layer, and the position attends to the cached keys 0..pos. The layer is
 * model_step.c's, row by row, through the same kernel ops; only the one-query attention
 * is written here (the cpu backend's memory is host memory). */
typedef struct kv_state {
    tpd_model *m;
    int L, C, NH, NKV, HS, F, FC, Vl, T;
    int len;       /* positions held in the cache */
    float *k, *v;  /* (L, T, NKV*HS) each: grouped-query attention caches K/V heads only */
    float *x;      /* (C) residual stream of the new position */
    float *ln;     /* (C) norm output */
    float *qkv;    /* ((NH+2*NKV)*HS) */
    float *y;      /* (C) attention output */
    float *tmp;    /* (C) projection output */
    float *fch;    /* (FC) before GELU, or SwiGLU's [gate | up] (2F) */
    float *fchg;   /* (F) after GELU or SwiGLU */
    float *p;      /* (T) attention weights */
    float *logits; /* (Vl) */
} kv_state;

/* Layer l's piece of p; NULL for a tensor the model lacks (biases, LayerNorm's b). */
static const float *kv_param(const kv_state *s, tpd_param p, int l) {
    if (!s->m->plan.lay.p[p].present) return NULL;
    return (const float *)s->m->params + tpd_model_layout_piece(&s->m->plan.lay, p, l);
}

/* The block's norm of one row. */
static tpd_status kv_norm(const kv_state *s, float *out, const float *x, tpd_param w, tpd_param b,
                          int l) {
    float mean, rstd;
    double eps = s->m->cfg.model.norm_epsilon;
    if (s->m->d.rms)
        return tpd_kern_rmsnorm_fwd(s->m->kb, out, &rstd, x, kv_param(s, w, l), 1, s->C, eps);
    return tpd_kern_layernorm_fwd(s->m->kb, out, &mean, &rstd, x, kv_param(s, w, l),
                                  kv_param(s, b, l), 1, s->C, eps);
}

static void kv_free(kv_state *s) {
    float **bufs[] = {&s->k,   &s->v,   &s->x,    &s->ln, &s->qkv,   &s->y,
                      &s->tmp, &s->fch, &s->fchg, &s->p,  &s->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        free(*bufs[i]);
        *bufs[i] = NULL;
    }
}

static tpd_status kv_init(kv_state *s, tpd_model *m) {
    const tpd_model_dims *d = &m->d;
    memset(s, 0, sizeof *s);
    s->m = m;
    s->L = d->Ls;
    s->C = d->C;
    s->NH = d->NH;
    s->NKV = d->NKV;
    s->HS = d->HS;
    s->F = d->F;
    s->FC = d->FCl;
    s->Vl = d->Vl;
    s->T = d->T;
    size_t cache = (size_t)s->L * s->T * s->NKV * s->HS;
    s->k = malloc(cache * sizeof(float));
    s->v = malloc(cache * sizeof(float));
    s->x = malloc((size_t)s->C * sizeof(float));
    s->ln = malloc((size_t)s->C * sizeof(float));
    s->qkv = malloc((size_t)(s->NH + 2 * s->NKV) * s->HS * sizeof(float));
    s->y = malloc((size_t)s->C * sizeof(float));
    s->tmp = malloc((size_t)s->C * sizeof(float));
    s->fch = malloc((size_t)s->FC * sizeof(float));
    s->fchg = malloc((size_t)s->F * sizeof(float));
    s->p = malloc((size_t)s->T * sizeof(float));
    s->logits = malloc((size_t)s->Vl * sizeof(float));
    if (!s->k || !s->v || !s->x || !s->ln || !s->qkv || !s->y || !s->tmp || !s->fch || !s->fchg ||
        !s->p || !s->logits) {
        kv_free(s);
        tpd_log_error("generate: out of memory for the key/value cache (%zu bytes)",
                      2 * cache * sizeof(float));
        return TPD_ERR_NOMEM;
    }
    return TPD_OK;
}

/* Position s->len takes `token`; with logits, s->logits gets its next-token logits. */
static tpd_status kv_step(kv_state *s, int token, int logits) {
    const tpd_model_dims *d = &s->m->d;
    int C = s->C, HS = s->HS, pos = s->len, KV = s->NKV * HS, group = s->NH / s->NKV;
    int QKV = (s->NH + 2 * s->NKV) * HS;
    /* x = wte[token] (+ wpe[pos] with learned positions) */
    const float *wte = kv_param(s, TPD_P_WTE, 0), *wpe = kv_param(s, TPD_P_WPE, 0);
    for (int c = 0; c < C; c++)
        s->x[c] = wte[(size_t)token * C + c] + (wpe ? wpe[(size_t)pos * C + c] : 0.0f);
    for (int l = 0; l < s->L; l++) {
        /* ln1 = norm(x); qkv = ln1 @ qkvw^T + qkvb, its Q and K heads rotated at position
         * pos under RoPE; this position's K/V heads join the cache */
        TPD_CHECK(kv_norm(s, s->ln, s->x, TPD_P_LN1W, TPD_P_LN1B, l));
        TPD_CHECK(tpd_kern_matmul_fwd(s->m->kb, s->qkv, s->ln, kv_param(s, TPD_P_QKVW, l),
                                      kv_param(s, TPD_P_QKVB, l), 1, C, QKV));
        if (d->rope)
            TPD_CHECK(tpd_kern_rope_scaled_fwd(s->m->kb, s->qkv, 1, 1, s->NH, s->NKV, HS,
                                               &s->m->rope, pos));
        float *kc = s->k + (size_t)l * s->T * KV, *vc = s->v + (size_t)l * s->T * KV;
        memcpy(kc + (size_t)pos * KV, s->qkv + C, (size_t)KV * sizeof(float));
        memcpy(vc + (size_t)pos * KV, s->qkv + C + KV, (size_t)KV * sizeof(float));
        /* y = softmax(q K^T / sqrt(HS)) V per query head, with its group's K/V head, over
         * the cached positions 0..pos */
        float scale = (float)(1.0 / sqrt((double)HS));
        for (int h = 0; h < s->NH; h++) {
            const float *q = s->qkv + (size_t)h * HS;
            size_t kvh = (size_t)(h / group) * HS;
            float max = -INFINITY, sum = 0.0f;
            for (int t = 0; t <= pos; t++) {
                const float *kt = kc + (size_t)t * KV + kvh;
                float dot = 0.0f;
                for (int i = 0; i < HS; i++)
                    dot += q[i] * kt[i];
                s->p[t] = dot * scale;
                if (s->p[t] > max) max = s->p[t];
            }
            for (int t = 0; t <= pos; t++) {
                s->p[t] = expf(s->p[t] - max);
                sum += s->p[t];
            }
            float *y = s->y + (size_t)h * HS;
            memset(y, 0, (size_t)HS * sizeof(float));
            for (int t = 0; t <= pos; t++) {
                const float *vt = vc + (size_t)t * KV + kvh;
                float w = s->p[t] / sum;
                for (int i = 0; i < HS; i++)
                    y[i] += w * vt[i];
            }
        }
        /* x = x + y @ attprojw^T + attprojb */
        TPD_CHECK(tpd_kern_matmul_fwd(s->m->kb, s->tmp, s->y, kv_param(s, TPD_P_ATTPROJW, l),
                                      kv_param(s, TPD_P_ATTPROJB, l), 1, C, C));
        TPD_CHECK(tpd_kern_add(s->m->kb, s->x, s->x, s->tmp, (size_t)C));
        /* x = x + mlp(norm(x)): gelu(ln @ fcw^T + fcb), or silu(gate) * up of [gate | up] */
        TPD_CHECK(kv_norm(s, s->ln, s->x, TPD_P_LN2W, TPD_P_LN2B, l));
        if (d->glu) {
            TPD_CHECK(tpd_kern_matmul_fwd(s->m->kb, s->fch, s->ln, kv_param(s, TPD_P_FCW, l),
                                          kv_param(s, TPD_P_FCB, l), 1, C, s->FC));
            TPD_CHECK(tpd_kern_swiglu_fwd(s->m->kb, s->fchg, s->fch, 1, s->F));
        } else {
            TPD_CHECK(tpd_kern_matmul_gelu_fwd(s->m->kb, s->fchg, s->fch, s->ln,
                                               kv_param(s, TPD_P_FCW, l), kv_param(s, TPD_P_FCB, l),
                                               1, C, s->F));
        }
        TPD_CHECK(tpd_kern_matmul_fwd(s->m->kb, s->tmp, s->fchg, kv_param(s, TPD_P_FCPROJW, l),
                                      kv_param(s, TPD_P_FCPROJB, l), 1, s->F, C));
        TPD_CHECK(tpd_kern_add(s->m->kb, s->x, s->x, s->tmp, (size_t)C));
    }
    s->len++;
    if (!logits) return TPD_OK;
    /* logits = norm_f(x) @ head^T (the tied wte, or lmhead) */
    TPD_CHECK(kv_norm(s, s->ln, s->x, TPD_P_LNFW, TPD_P_LNFB, 0));
    const float *head = d->tied ? wte : kv_param(s, TPD_P_LMHEAD, 0);
    return tpd_kern_matmul_fwd(s->m->kb, s->logits, s->ln, head, NULL, 1, C, s->Vl);
}

/* Restarts the cache from ctx[n0..n): every position again, logits for the last. */
static tpd_status kv_fill(kv_state *s, const int32_t *ctx, size_t n0, size_t n) {
    s->len = 0;
    for (size_t i = n0; i < n; i++)
        TPD_CHECK(kv_step(s, ctx[i], i + 1 == n));
    return TPD_OK;
}

/* A checkpoint loaded into one cpu rank, ready to produce next-token logits. */
typedef struct generator {
    tpd_ckpt_info info;
    tpd_kern_backend *kb;
    tpd_model *m;
    tpd_dp_plan dpp;
    int have_kb, have_dpp;
    int V, T, Vl;
    int32_t *batch; /* (T+1) one full-forward sample */
    float *row;     /* (Vl) logits of the full forward's last position */
} generator;

static void gen_close(generator *g) {
    free(g->row);
    free(g->batch);
    if (g->have_dpp) tpd_dp_plan_free(&g->dpp);
    tpd_model_destroy(g->m);
    if (g->have_kb) tpd_kern_backend_destroy(g->kb);
    tpd_ckpt_close(&g->info);
}

static tpd_status gen_open(generator *g, const char *checkpoint, int num_threads,
                           const tpd_bpe *bpe) {
    memset(g, 0, sizeof *g);
    TPD_CHECK(tpd_ckpt_open_weights(checkpoint, &g->info));
    tpd_config cfg = g->info.cfg;
    tpd_status st = TPD_OK;
    g->V = cfg.model.vocab_size;
    if (!bpe && g->V < 256)
        TPD_FAIL_GOTO(TPD_ERR_UNSUPPORTED, st, fail,
                      "generate %s: vocab_size %d is not byte-level (needs 256 bytes; "
                      "give the model's BPE files otherwise)",
                      g->info.dir, g->V);
    if (bpe && tpd_bpe_vocab_size(bpe) > g->V)
        TPD_FAIL_GOTO(TPD_ERR_INVALID, st, fail,
                      "generate %s: the BPE vocabulary has %d tokens but the model's "
                      "vocab_size is %d",
                      g->info.dir, tpd_bpe_vocab_size(bpe), g->V);
    tpd_config_layout one = TPD_CONFIG_LAYOUT_INIT; /* one rank, one sample */
    one.micro_batch_size = one.global_batch_size = 1;
    tpd_config_relayout(&g->info.cfg, &one, &cfg);
    /* sampling runs on the cpu backend whatever the run trained on: its buffer plan (and
     * the kernels' scratch in it) is the cpu one */
    cfg.training.device = TPD_DEVICE_CPU;
    if (cfg.model.seq_length > cfg.model.max_position_embeddings)
        cfg.model.seq_length = cfg.model.max_position_embeddings;
    tpd_kern_config kc = TPD_KERN_CONFIG_INIT;
    kc.num_threads = num_threads;
    TPD_CHECK_GOTO(tpd_kern_cpu_create(&kc, &g->kb), st, fail);
    g->have_kb = 1;
    TPD_CHECK_GOTO(tpd_model_create(&cfg, g->kb, NULL, 1, 0, 1, 1, 0, &g->m), st, fail);
    TPD_CHECK_GOTO(tpd_dp_plan_init(g->m->plan.lay.numel, (size_t)cfg.parallel.ddp_bucket_size, 1,
                                    0, 0, &g->dpp),
                   st, fail);
    g->have_dpp = 1;
    TPD_CHECK_GOTO(tpd_ckpt_load_model(&g->info, g->m, &g->dpp), st, fail);
    g->T = g->m->d.T;
    g->Vl = g->m->d.Vl;
    g->batch = calloc((size_t)g->T + 1, sizeof *g->batch);
    g->row = malloc((size_t)g->Vl * sizeof *g->row);
    if (!g->batch || !g->row) TPD_FAIL_GOTO(TPD_ERR_NOMEM, st, fail, "generate: out of memory");
    return TPD_OK;
fail:
    gen_close(g);
    return st;
}

/* g->row = next-token logits after ctx[0..n), from one full forward over the last T. */
static tpd_status gen_full_logits(generator *g, const int32_t *ctx, size_t n) {
    /* the window: the last T tokens; causal attention ignores what follows them */
    size_t w0 = n > (size_t)g->T ? n - (size_t)g->T : 0, len = n - w0;
    memset(g->batch, 0, ((size_t)g->T + 1) * sizeof *g->batch);
    memcpy(g->batch, ctx + w0, len * sizeof *g->batch);
    const tpd_model_mb at = {0, 0, 0};
    TPD_CHECK(tpd_model_set_batch(g->m, &at, g->batch));
    TPD_CHECK(tpd_model_forward(g->m, &at));
    const tpd_model *m = g->m;
    const char *logits =
        (const char *)tpd_model_logits(m, &at) + (len - 1) * (size_t)g->Vl * m->plan.act_size;
    return tpd_kern_copy_to_host(g->kb, g->row, logits, (size_t)g->Vl * sizeof(float));
}

tpd_status tpd_generate_logits(const char *checkpoint, const int32_t *tokens, size_t n,
                               int kv_cache, float *logits) {
    generator g;
    TPD_CHECK(gen_open(&g, checkpoint, 0, NULL));
    tpd_status st = TPD_OK;
    if (n == 0 || n > (size_t)g.T)
        TPD_FAIL_GOTO(TPD_ERR_INVALID, st, done, "generate: %zu tokens (needs 1 to seq_length %d)",
                      n, g.T);
    if (kv_cache) {
        kv_state kv;
        TPD_CHECK_GOTO(kv_init(&kv, g.m), st, done);
        st = kv_fill(&kv, tokens, 0, n);
        if (st == TPD_OK) memcpy(logits, kv.logits, (size_t)g.V * sizeof(float));
        kv_free(&kv);
    } else {
        TPD_CHECK_GOTO(gen_full_logits(&g, tokens, n), st, done);
        memcpy(logits, g.row, (size_t)g.V * sizeof(float));
    }
done:
    gen_close(&g);
    return st;
}

/* The draw of new token `step` from logits. */
static int next_token(const tpd_gen_opts *o, const float *logits, int V, int step) {
    return tpd_generate_sample(logits, V, o->temperature, o->top_k, o->top_p,
                               tpd_rng_uniform(o->seed, GEN_RNG_STREAM, (uint64_t)step));
}

tpd_status tpd_generate(const char *checkpoint, const tpd_gen_opts *o, int32_t **tokens_p,
                        size_t *n_p) {
    generator g;
    TPD_CHECK(gen_open(&g, checkpoint, o->num_threads, o->bpe));
    tpd_status st = TPD_OK;
    int V = g.V, T = g.T;
    int32_t *out = NULL, *ctx = NULL;
    size_t plen = strlen(o->prompt), n = 0, made = 0, cap = 0;
    /* with the tokenizer's special tokens: a Llama 3 prompt starts with its BOS */
    if (o->bpe)
        TPD_CHECK_GOTO(tpd_bpe_encode_ex(o->bpe, o->prompt, plen, 1, &ctx, &n, &cap), st, done);
    int32_t *grown = realloc(ctx, (n + plen + (size_t)o->max_new_tokens + 1) * sizeof *ctx);
    out = malloc(((size_t)o->max_new_tokens + 1) * sizeof *out);
    if (!grown || !out) TPD_FAIL_GOTO(TPD_ERR_NOMEM, st, done, "generate: out of memory");
    ctx = grown;
    if (!o->bpe)
        for (size_t i = 0; i < plen; i++)
            ctx[n++] = (unsigned char)o->prompt[i];
    int32_t eod = o->bpe ? tpd_bpe_eod(o->bpe) : V > TPD_BYTE_EOD ? TPD_BYTE_EOD : -1;
    if (n == 0) ctx[n++] = eod >= 0 ? eod : 0;
    if (o->kv_cache) {
        /* The cache holds up to T positions. When it is full, it restarts from the last
         * T/2 tokens (positions 0..T/2-1 again), so the context is T/2..T tokens. */
        kv_state kv;
        TPD_CHECK_GOTO(kv_init(&kv, g.m), st, done);
        size_t keep = (size_t)T / 2 > 0 ? (size_t)T / 2 : 1;
        st = kv_fill(&kv, ctx, n > (size_t)T ? n - (size_t)T : 0, n);
        for (int step = 0; st == TPD_OK && step < o->max_new_tokens; step++) {
            int tok = next_token(o, kv.logits, V, step);
            if (o->stop_at_eod && tok == eod) break;
            ctx[n++] = tok;
            out[made++] = tok;
            if (o->on_token && o->on_token(o->on_token_user, tok) != 0) break;
            if (step + 1 == o->max_new_tokens) break;
            st = kv.len < T ? kv_step(&kv, tok, 1) : kv_fill(&kv, ctx, n - keep, n);
        }
        kv_free(&kv);
        if (st != TPD_OK) goto done;
    }
    for (int step = 0; !o->kv_cache && step < o->max_new_tokens; step++) {
        TPD_CHECK_GOTO(gen_full_logits(&g, ctx, n), st, done);
        int tok = next_token(o, g.row, V, step);
        if (o->stop_at_eod && tok == eod) break;
        ctx[n++] = tok;
        out[made++] = tok;
        if (o->on_token && o->on_token(o->on_token_user, tok) != 0) break;
    }
    *tokens_p = out;
    *n_p = made;
    out = NULL;
done:
    free(ctx);
    free(out);
    gen_close(&g);
    return st;
}
