#include "engine/generate/generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/data/data.h"
#include "engine/model/model_decode.h"

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

/* Restarts the cache from ctx[n0..n): every position again, and row = the logits after the
 * last. */
static tpd_status kv_fill(tpd_model_decode *dec, const int32_t *ctx, size_t n0, size_t n,
                          float *row) {
    tpd_model_decode_reset(dec);
    for (size_t i = n0; i < n; i++)
        TPD_CHECK(tpd_model_decode_step(dec, (int)(i - n0), ctx[i], i + 1 == n ? row : NULL));
    return TPD_OK;
}

/* A checkpoint loaded into one rank, ready to produce next-token logits. */
typedef struct generator {
    tpd_ckpt_info info;
    tpd_kern_backend *kb;
    tpd_model *m;
    tpd_dp_plan dpp;
    int have_kb, have_dpp;
    int V, T, Vl;
    int32_t *batch; /* (T+1) one full-forward sample */
    float *row;     /* (Vl) the next-token logits */
} generator;

static void gen_close(generator *g) {
    free(g->row);
    free(g->batch);
    if (g->have_dpp) tpd_dp_plan_free(&g->dpp);
    tpd_model_destroy(g->m);
    if (g->have_kb) tpd_kern_backend_destroy(g->kb);
    tpd_ckpt_close(&g->info);
}

/* The backend of `device`: cpu computes in fp32; cuda in the checkpoint's
 * training.precision, with its attention path and gradient dtype (the model's buffer plan
 * follows them). */
static tpd_status gen_backend(tpd_config *cfg, tpd_device device, int num_threads,
                              tpd_kern_backend **kb_p) {
    tpd_kern_config kc = TPD_KERN_CONFIG_INIT;
    cfg->training.device = device;
    if (device == TPD_DEVICE_CPU) {
        cfg->training.precision = TPD_PRECISION_FP32;
        kc.num_threads = num_threads;
        return tpd_kern_cpu_create(&kc, kb_p);
    }
    kc.dtype = cfg->training.precision == TPD_PRECISION_BF16 ? TPD_DTYPE_BF16 : TPD_DTYPE_F32;
    kc.fused_attention = cfg->training.attention == TPD_ATTENTION_FUSED;
    kc.fp32_grads = tpd_config_grad_bytes(cfg) == 4;
    return tpd_kern_cuda_create(&kc, kb_p);
}

static tpd_status gen_open(generator *g, const char *checkpoint, tpd_device device, int num_threads,
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
    if (cfg.model.seq_length > cfg.model.max_position_embeddings)
        cfg.model.seq_length = cfg.model.max_position_embeddings;
    /* whatever the run trained on: the model's buffer plan (and the kernels' scratch in it)
     * is that of the backend sampling runs on */
    TPD_CHECK_GOTO(gen_backend(&cfg, device, num_threads, &g->kb), st, fail);
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
    return tpd_model_logits_f32(g->m, &at, (int)len - 1, g->row);
}

tpd_status tpd_generate_logits(const char *checkpoint, const int32_t *tokens, size_t n,
                               int kv_cache, float *logits) {
    generator g;
    TPD_CHECK(gen_open(&g, checkpoint, TPD_DEVICE_CPU, 0, NULL));
    tpd_status st = TPD_OK;
    tpd_model_decode *dec = NULL;
    if (n == 0 || n > (size_t)g.T)
        TPD_FAIL_GOTO(TPD_ERR_INVALID, st, done, "generate: %zu tokens (needs 1 to seq_length %d)",
                      n, g.T);
    if (kv_cache) {
        TPD_CHECK_GOTO(tpd_model_decode_create(g.m, &dec), st, done);
        TPD_CHECK_GOTO(kv_fill(dec, tokens, 0, n, g.row), st, done);
    } else {
        TPD_CHECK_GOTO(gen_full_logits(&g, tokens, n), st, done);
    }
    memcpy(logits, g.row, (size_t)g.V * sizeof(float));
done:
    tpd_model_decode_destroy(dec);
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
    TPD_CHECK(gen_open(&g, checkpoint, o->device, o->num_threads, o->bpe));
    tpd_status st = TPD_OK;
    int V = g.V, T = g.T;
    int32_t *out = NULL, *ctx = NULL;
    tpd_model_decode *dec = NULL;
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
    /* The cache holds up to T positions. When it is full, it restarts from the last T/2
     * tokens (positions 0..T/2-1 again), so the context is T/2..T tokens. */
    size_t keep = (size_t)T / 2 > 0 ? (size_t)T / 2 : 1;
    if (o->kv_cache) {
        TPD_CHECK_GOTO(tpd_model_decode_create(g.m, &dec), st, done);
        TPD_CHECK_GOTO(kv_fill(dec, ctx, n > (size_t)T ? n - (size_t)T : 0, n, g.row), st, done);
    }
    for (int step = 0; step < o->max_new_tokens; step++) {
        if (!o->kv_cache) TPD_CHECK_GOTO(gen_full_logits(&g, ctx, n), st, done);
        int tok = next_token(o, g.row, V, step);
        if (o->stop_at_eod && tok == eod) break;
        ctx[n++] = tok;
        out[made++] = tok;
        if (o->on_token && o->on_token(o->on_token_user, tok) != 0) break;
        if (!o->kv_cache || step + 1 == o->max_new_tokens) continue;
        int len = tpd_model_decode_len(dec);
        TPD_CHECK_GOTO(len < T ? tpd_model_decode_step(dec, len, tok, g.row)
                               : kv_fill(dec, ctx, n - keep, n, g.row),
                       st, done);
    }
    *tokens_p = out;
    *n_p = made;
    out = NULL;
done:
    tpd_model_decode_destroy(dec);
    free(ctx);
    free(out);
    gen_close(&g);
    return st;
}
