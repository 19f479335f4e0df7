/* Single-position decoding with a key/value cache (model_decode.h). Shapes: C hidden, the
 * local sizes of tpd_model_dims at TP 1 (NHl = NH, KVl = NKV, Vl = Vp), KV = KVl*HS. */
#include "engine/model/model_decode.h"

#include <stdlib.h>

#include "base/align.h"
#include "engine/model/model_internal.h"

struct tpd_model_decode {
    tpd_model *m;
    int len;            /* positions held */
    void *block;        /* one backend allocation holding everything below */
    char *k, *v;        /* (Ls, T, KV) each: the cached K and V heads, after RoPE */
    void *x[2];         /* (C) residual stream: a layer reads one and writes the other */
    tpd_model_acts a;   /* one position's layer activations (att unused) */
    void *lnf;          /* (C) */
    float *mean, *rstd; /* (1) fp32 norm statistics, shared by every norm */
    void *logits;       /* (Vl) */
    float *logits_f32;  /* (Vl) fp32, when the activations are not */
    int32_t *token;     /* (1) */
};

/* The next region of `bytes` in the block, aligned as the buffer plan's regions. */
static size_t take(size_t *cur, size_t bytes) {
    size_t at = *cur;
    *cur += tpd_align_up(bytes);
    return at;
}

tpd_status tpd_model_decode_create(tpd_model *m, tpd_model_decode **dec_p) {
    const tpd_model_dims *d = &m->d;
    if (d->tp_size != 1 || d->pp_size != 1 || d->v != 1 || d->sp) {
        tpd_log_error("decode: needs the whole model on one rank (TP 1, PP 1, no virtual "
                      "stages); this one is TP %d, PP %d, %d chunks",
                      d->tp_size, d->pp_size, d->v);
        return TPD_ERR_UNSUPPORTED;
    }
    tpd_dtype dt = tpd_kern_act_dtype(m->kb);
    size_t a = m->plan.act_size, C = (size_t)d->C, KV = (size_t)d->KVl * d->HS;
    size_t cache = (size_t)d->Ls * d->T * KV * a;
    /* offsets first, then one allocation */
    size_t cur = 0, o_k = take(&cur, cache), o_v = take(&cur, cache);
    size_t o_xa = take(&cur, C * a), o_xb = take(&cur, C * a);
    size_t o_ln1 = take(&cur, C * a), o_qkv = take(&cur, (size_t)d->QKVl * a);
    size_t qk_heads = d->qkn ? (size_t)(d->NHl + d->KVl) : 0; /* Qwen3's QK norm */
    size_t o_qkn = take(&cur, qk_heads * d->HS * a), o_qkn_rstd = take(&cur, qk_heads * 4);
    size_t o_atty = take(&cur, (size_t)d->Cl * a), o_x1 = take(&cur, C * a);
    size_t o_ln2 = take(&cur, C * a), o_fch = take(&cur, (size_t)d->FCml * a);
    size_t o_fchg = take(&cur, (size_t)d->Fml * a), o_lnf = take(&cur, C * a);
    size_t o_mean = take(&cur, 4), o_rstd = take(&cur, 4);
    size_t o_logits = take(&cur, (size_t)d->Vl * a);
    size_t o_lf32 = take(&cur, dt == TPD_DTYPE_F32 ? 0 : (size_t)d->Vl * 4);
    size_t o_token = take(&cur, 4);
    tpd_model_decode *dec = calloc(1, sizeof *dec);
    if (!dec) {
        tpd_log_error("decode: out of memory");
        return TPD_ERR_NOMEM;
    }
    tpd_status st = tpd_kern_alloc(m->kb, cur, &dec->block);
    if (st != TPD_OK) {
        tpd_log_error("decode: cannot allocate the key/value cache (%zu bytes)", cur);
        free(dec);
        return st;
    }
    char *b = dec->block;
    dec->m = m;
    dec->k = b + o_k;
    dec->v = b + o_v;
    dec->x[0] = b + o_xa;
    dec->x[1] = b + o_xb;
    dec->a.ln1 = b + o_ln1;
    dec->a.qkv = b + o_qkv;
    dec->a.qkn_raw = d->qkn ? b + o_qkn : NULL;
    dec->a.qkn_rstd = d->qkn ? (float *)(b + o_qkn_rstd) : NULL;
    dec->a.atty = b + o_atty;
    dec->a.x1 = b + o_x1;
    dec->a.ln2 = b + o_ln2;
    dec->a.fch = b + o_fch;
    dec->a.fch_gelu = b + o_fchg;
    /* a mixture of experts routes in a layer block of the model's (one row of it) */
    dec->a.block = m->acts + m->plan.s_layers;
    dec->lnf = b + o_lnf;
    dec->mean = (float *)(b + o_mean);
    dec->rstd = (float *)(b + o_rstd);
    dec->a.ln1_mean = dec->a.ln2_mean = dec->mean;
    dec->a.ln1_rstd = dec->a.ln2_rstd = dec->rstd;
    dec->logits = b + o_logits;
    dec->logits_f32 = dt == TPD_DTYPE_F32 ? NULL : (float *)(b + o_lf32);
    dec->token = (int32_t *)(b + o_token);
    *dec_p = dec;
    return TPD_OK;
}

void tpd_model_decode_destroy(tpd_model_decode *dec) {
    if (!dec) return;
    tpd_kern_free(dec->m->kb, dec->block);
    free(dec);
}

void tpd_model_decode_reset(tpd_model_decode *dec) {
    dec->len = 0;
}

int tpd_model_decode_len(const tpd_model_decode *dec) {
    return dec->len;
}

tpd_status tpd_model_decode_step(tpd_model_decode *dec, int pos, int32_t token, float *logits) {
    tpd_model *m = dec->m;
    const tpd_model_dims *d = &m->d;
    if (pos < 0 || pos > dec->len || pos >= d->T) {
        tpd_log_error("decode: position %d with %d cached (needs 0 to %d, below seq_length %d)",
                      pos, dec->len, dec->len, d->T);
        return TPD_ERR_INVALID;
    }
    dec->len = pos; /* until this position is complete */
    const tpd_model_rows r = {1, 1, 1, pos, 0};
    size_t a = m->plan.act_size, KV = (size_t)d->KVl * d->HS * a;
    /* x = wte[token] (+ wpe[pos]) */
    TPD_CHECK(tpd_kern_copy_to_device(m->kb, dec->token, &token, sizeof token));
    const void *x = dec->x[0];
    TPD_CHECK(tpd_model_embed_fwd(m, &r, dec->x[0], dec->token));
    for (int l = 0; l < d->Ls; l++) {
        tpd_model_views w;
        tpd_model_acts act = dec->a;
        act.out = dec->x[(l + 1) % 2];
        act.moe = tpd_model_dims_layer_moe(d, l);
        tpd_model_layer_views(m, 0, l, &w);
        /* qkv = [Q | K | V] of this position, RoPE at pos; its K and V heads join the
         * layer's cache at row pos */
        TPD_CHECK(tpd_model_layer_qkv_fwd(m, &r, &w, &act, x));
        char *kc = dec->k + (size_t)l * d->T * KV, *vc = dec->v + (size_t)l * d->T * KV;
        const char *qkv_k = (const char *)act.qkv + (size_t)d->NHl * d->HS * a;
        TPD_CHECK(tpd_kern_copy(m->kb, kc + (size_t)pos * KV, qkv_k, KV));
        TPD_CHECK(tpd_kern_copy(m->kb, vc + (size_t)pos * KV, qkv_k + KV, KV));
        /* atty = softmax(q K^T / sqrt(HS)) V over the cached positions 0 .. pos */
        TPD_CHECK(tpd_kern_attention_decode(m->kb, act.atty, act.qkv, kc, vc, pos + 1, d->NHl,
                                            d->KVl, d->HS));
        TPD_CHECK(tpd_model_layer_mlp_fwd(m, &r, &w, &act, x));
        x = act.out;
    }
    dec->len = pos + 1;
    if (!logits) return TPD_OK;
    TPD_CHECK(tpd_model_head_fwd(m, &r, dec->lnf, dec->mean, dec->rstd, dec->logits, x));
    return tpd_model_to_host_f32(m->kb, logits, dec->logits, tpd_kern_act_dtype(m->kb),
                                 (size_t)d->Vl, dec->logits_f32);
}
