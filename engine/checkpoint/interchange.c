/* llm.c model files <-> global fp32 tensors, and what both interchange formats share. */
#include "engine/checkpoint/interchange.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/checkpoint/checkpoint_internal.h"

void tpd_ckpt_free_weights(float *global[TPD_P_COUNT]) {
    for (int p = 0; p < TPD_P_COUNT; p++) {
        free(global[p]);
        global[p] = NULL;
    }
}

tpd_status tpd_ckpt_alloc_weights(const tpd_config *cfg, float *global[TPD_P_COUNT],
                                  tpd_model_layout *g) {
    memset(global, 0, sizeof(float *) * TPD_P_COUNT);
    TPD_CHECK(tpd_model_layout_init(cfg, 1, 0, 1, 0, g));
    for (int p = 0; p < TPD_P_COUNT; p++) {
        size_t n = tpd_model_layout_global_numel(g, (tpd_param)p);
        global[p] = calloc(n ? n : 1, 4); /* a tensor the model lacks: an empty one */
        if (!global[p]) {
            tpd_ckpt_free_weights(global);
            return tpd_fail(TPD_ERR_NOMEM, "interchange: out of memory");
        }
    }
    return TPD_OK;
}

tpd_status tpd_ckpt_read_weights(const tpd_ckpt_info *info, float *global[TPD_P_COUNT]) {
    tpd_model_layout g;
    TPD_CHECK(tpd_ckpt_alloc_weights(&info->cfg, global, &g));
    for (int p = 0; p < TPD_P_COUNT; p++) {
        /* fp32 master weights, when saved, are the exact values behind bf16 parameters */
        tpd_ckpt_kind k = info->has_kind[TPD_CKPT_MASTER] ? TPD_CKPT_MASTER : TPD_CKPT_PARAM;
        tpd_status st = tpd_ckpt_read_global(info, (tpd_param)p, k, global[p]);
        if (st != TPD_OK) {
            tpd_ckpt_free_weights(global);
            return st;
        }
    }
    return TPD_OK;
}

tpd_status tpd_ckpt_check_finite(const float *x, size_t n, const char *file, const char *tensor) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return tpd_fail(TPD_ERR_INVALID,
                            "interchange %s: tensor '%s' has a non-finite value (%g) at element "
                            "%zu; imported weights must be finite",
                            file, tensor, (double)x[i], i);
    return TPD_OK;
}

/* The GPT-2 layouts of Hugging Face and llm.c: NULL, or what this model has instead. */
const char *tpd_ckpt_gpt2_only(const tpd_config *cfg) {
    const tpd_config_model *m = &cfg->model;
    return m->normalization != TPD_NORM_LAYERNORM          ? "RMSNorm"
           : m->position_embedding_type != TPD_POS_LEARNED ? "rotary positions"
           : m->swiglu                                     ? "SwiGLU"
           : m->group_query_attention                      ? "grouped-query attention"
           : m->untie_embeddings_and_output_weights        ? "an untied output layer"
           : !m->add_bias_linear                           ? "no linear biases"
           : m->add_qkv_bias                               ? "a QKV-only bias"
           : m->num_moe_experts > 0                        ? "a mixture of experts"
           : m->kv_channels > 0 && m->kv_channels * m->num_attention_heads != m->hidden_size
               ? "a head size other than hidden_size / num_attention_heads (kv_channels)"
               : NULL;
}

/* ---- llm.c ---- */

tpd_status tpd_ckpt_export_llmc(const tpd_config *cfg, float *const global[TPD_P_COUNT],
                                const char *out_path) {
    tpd_model_layout g;
    const char *why = tpd_ckpt_gpt2_only(cfg);
    if (why)
        return tpd_fail(TPD_ERR_UNSUPPORTED,
                        "interchange %s: the llm.c layout is GPT-2's; this model has %s", out_path,
                        why);
    TPD_CHECK(tpd_model_layout_init(cfg, 1, 0, 1, 0, &g));
    const tpd_model_dims *d = &g.d;
    if (d->F != 4 * d->C)
        return tpd_fail(TPD_ERR_UNSUPPORTED,
                        "interchange %s: llm.c models have ffn_hidden_size = 4*hidden_size "
                        "(%d), this one %d",
                        out_path, 4 * d->C, d->F);
    int32_t hdr[256] = {TPD_LLMC_MODEL_MAGIC, 3, d->maxT, d->V, d->L, d->NH, d->C, d->Vp};
    tpd_ckpt_writer *w = NULL;
    char hex[65];
    TPD_CHECK(tpd_ckpt_writer_open(out_path, &w));
    tpd_status st = tpd_ckpt_writer_put(w, hdr, sizeof hdr);
    for (int p = 0; p < TPD_P_COUNT && st == TPD_OK; p++) {
        st = tpd_ckpt_writer_put(w, global[p], tpd_model_layout_global_numel(&g, (tpd_param)p) * 4);
        if (p == TPD_P_WTE && st == TPD_OK) { /* zero rows up to Vp */
            float *zero = calloc((size_t)(d->Vp - d->V) * d->C + 1, 4);
            st = zero ? tpd_ckpt_writer_put(w, zero, (size_t)(d->Vp - d->V) * d->C * 4)
                      : tpd_fail(TPD_ERR_NOMEM, "interchange: out of memory");
            free(zero);
        }
    }
    if (st != TPD_OK) {
        tpd_ckpt_writer_abort(w);
        return st;
    }
    return tpd_ckpt_writer_finish(w, hex, NULL);
}

/* The bounds of the model keys each header field becomes (engine/config/config_schema.c), so
 * that every product formed from them stays inside the integers the layout uses. */
#define LLMC_MAX_PAD 65536
static const struct {
    const char *name, *key;
    int lo, hi;
} k_llmc_fields[8] = {
    [2] = {"max_seq_len", "model.max_position_embeddings", 1, 1048576},
    [3] = {"vocab_size", "model.vocab_size", 1, 16777216},
    [4] = {"num_layers", "model.num_layers", 1, 1024},
    [5] = {"num_heads", "model.num_attention_heads", 1, 4096},
    [6] = {"channels", "model.hidden_size", 1, 262144},
};

/* Every field of an llm.c header within its key's bound, channels a multiple of the heads,
 * the padded vocabulary at least the vocabulary and at most one padding step above it. */
static tpd_status llmc_check_header(const char *path, const int32_t *h) {
    for (int i = 2; i <= 6; i++)
        if (h[i] < k_llmc_fields[i].lo || h[i] > k_llmc_fields[i].hi)
            return tpd_fail(TPD_ERR_INVALID,
                            "interchange %s: header field %s (int %d, %s) is %d; expected an "
                            "integer in [%d, %d]",
                            path, k_llmc_fields[i].name, i, k_llmc_fields[i].key, h[i],
                            k_llmc_fields[i].lo, k_llmc_fields[i].hi);
    if (h[6] % h[5])
        return tpd_fail(TPD_ERR_INVALID,
                        "interchange %s: header field channels (%d) must be a multiple of "
                        "num_heads (%d)",
                        path, h[6], h[5]);
    if (h[7] < h[3] || (int64_t)h[7] - h[3] >= LLMC_MAX_PAD)
        return tpd_fail(TPD_ERR_INVALID,
                        "interchange %s: header field padded_vocab_size (int 7) is %d; expected "
                        "an integer in [vocab_size %d, %lld]",
                        path, h[7], h[3], (long long)h[3] + LLMC_MAX_PAD - 1);
    return TPD_OK;
}

tpd_status tpd_ckpt_import_llmc(const char *path, tpd_config *cfg, float *global[TPD_P_COUNT]) {
    char *data = NULL;
    size_t size = 0;
    memset(global, 0, sizeof(float *) * TPD_P_COUNT);
    TPD_CHECK(tpd_ckpt_read_file(path, &data, &size));
    tpd_status st = TPD_OK;
    int32_t h[256];
    if (size < sizeof h)
        TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, out, "interchange %s: shorter than the 1024-byte header",
                      path);
    memcpy(h, data, sizeof h);
    if (h[0] != TPD_LLMC_MODEL_MAGIC)
        TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, out,
                      "interchange %s: magic %d, an llm.c model file has %d", path, h[0],
                      TPD_LLMC_MODEL_MAGIC);
    if (h[1] != 3)
        TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, out, "interchange %s: version %d; only 3 (fp32) is read",
                      path, h[1]);
    TPD_CHECK_GOTO(llmc_check_header(path, h), st, out);
    tpd_config_defaults(cfg);
    tpd_config_model *m = &cfg->model;
    m->max_position_embeddings = m->seq_length = h[2];
    m->vocab_size = h[3];
    m->num_layers = h[4];
    m->num_attention_heads = h[5];
    m->hidden_size = h[6];
    m->ffn_hidden_size = 4 * h[6];
    int Vp = h[7];
    /* the largest power-of-two padding (within the key's bound) that reproduces Vp, so an
     * export writes it back; Vp itself when none does */
    m->make_vocab_size_divisible_by = Vp;
    for (int d = 1; d <= LLMC_MAX_PAD; d *= 2)
        if ((h[3] + d - 1) / d * d == Vp) m->make_vocab_size_divisible_by = d;
    if (m->make_vocab_size_divisible_by > LLMC_MAX_PAD)
        TPD_FAIL_GOTO(TPD_ERR_INVALID, st, out,
                      "interchange %s: header field padded_vocab_size is %d, vocab_size %d "
                      "rounded up to a multiple of at most %d (model.make_vocab_size_divisible_by)",
                      path, Vp, h[3], LLMC_MAX_PAD);
    tpd_model_layout g;
    /* the size is checked before anything is allocated: a header may claim terabytes */
    TPD_CHECK_GOTO(tpd_model_layout_init(cfg, 1, 0, 1, 0, &g), st, out);
    size_t need = sizeof h + (size_t)(Vp - h[3]) * h[6] * 4;
    for (int p = 0; p < TPD_P_COUNT; p++)
        need += tpd_model_layout_global_numel(&g, (tpd_param)p) * 4;
    if (size != need)
        TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, out, "interchange %s: %zu bytes, the header implies %zu",
                      path, size, need);
    TPD_CHECK_GOTO(tpd_ckpt_alloc_weights(cfg, global, &g), st, out);
    const char *src = data + sizeof h;
    for (int p = 0; p < TPD_P_COUNT; p++) {
        size_t n = tpd_model_layout_global_numel(&g, (tpd_param)p) * 4;
        memcpy(global[p], src, n);
        TPD_CHECK_GOTO(
            tpd_ckpt_check_finite(global[p], n / 4, path, tpd_param_get_info((tpd_param)p)->name),
            st, out);
        src += n;
        if (p == TPD_P_WTE) src += (size_t)(Vp - h[3]) * h[6] * 4; /* padding rows */
    }
out:
    if (st != TPD_OK) tpd_ckpt_free_weights(global);
    free(data);
    return st;
}
