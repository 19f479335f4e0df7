/* llm.c model files <-> global fp32 tensors, and what both interchange formats share. */
#include "engine/checkpoint/interchange.h"

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
    tpd_config_defaults(cfg);
    tpd_config_model *m = &cfg->model;
    m->max_position_embeddings = m->seq_length = h[2];
    m->vocab_size = h[3];
    m->num_layers = h[4];
    m->num_attention_heads = h[5];
    m->hidden_size = h[6];
    m->ffn_hidden_size = 4 * h[6];
    int Vp = h[7];
    if (h[2] < 1 || h[3] < 1 || h[4] < 1 || h[5] < 1 || h[6] < 1 || h[6] % h[5] || Vp < h[3])
        TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, out, "interchange %s: impossible header shape", path);
    /* the largest power-of-two padding that reproduces Vp, so an export writes it back */
    m->make_vocab_size_divisible_by = Vp;
    for (int d = 1; d <= Vp; d *= 2)
        if (Vp % d == 0 && (h[3] + d - 1) / d * d == Vp) m->make_vocab_size_divisible_by = d;
    tpd_model_layout g;
    TPD_CHECK_GOTO(tpd_ckpt_alloc_weights(cfg, global, &g), st, out);
    size_t need = sizeof h + (size_t)(Vp - h[3]) * h[6] * 4;
    for (int p = 0; p < TPD_P_COUNT; p++)
        need += tpd_model_layout_global_numel(&g, (tpd_param)p) * 4;
    if (size != need)
        TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, out, "interchange %s: %zu bytes, the header implies %zu",
                      path, size, need);
    const char *src = data + sizeof h;
    for (int p = 0; p < TPD_P_COUNT; p++) {
        size_t n = tpd_model_layout_global_numel(&g, (tpd_param)p) * 4;
        memcpy(global[p], src, n);
        src += n;
        if (p == TPD_P_WTE) src += (size_t)(Vp - h[3]) * h[6] * 4; /* padding rows */
    }
out:
    if (st != TPD_OK) tpd_ckpt_free_weights(global);
    free(data);
    return st;
}
