/* Hugging Face safetensors and llm.c model files <-> global fp32 tensors. */
#include "engine/checkpoint/interchange.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/checkpoint/checkpoint_internal.h"

#define PATH_CAP (TPD_CONFIG_STR + 64)

void tpd_ckpt_free_weights(float *global[TPD_P_COUNT]) {
    for (int p = 0; p < TPD_P_COUNT; p++) {
        free(global[p]);
        global[p] = NULL;
    }
}

static tpd_status alloc_weights(const tpd_config *cfg, float *global[TPD_P_COUNT],
                                tpd_model_layout *g) {
    memset(global, 0, sizeof(float *) * TPD_P_COUNT);
    TPD_CHECK(tpd_model_layout_init(cfg, 1, 0, 1, 0, g));
    for (int p = 0; p < TPD_P_COUNT; p++) {
        size_t n = tpd_model_layout_global_numel(g, (tpd_param)p);
        global[p] = calloc(n ? n : 1, 4); /* a tensor the model lacks: an empty one */
        if (!global[p]) {
            tpd_ckpt_free_weights(global);
            return tpd_ckpt_fail(TPD_ERR_NOMEM, "interchange: out of memory");
        }
    }
    return TPD_OK;
}

tpd_status tpd_ckpt_read_weights(const tpd_ckpt_info *info, float *global[TPD_P_COUNT]) {
    tpd_model_layout g;
    TPD_CHECK(alloc_weights(&info->cfg, global, &g));
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

/* ---- Hugging Face ---- */

/* (rows, cols) -> (cols, rows) */
static void transpose(float *dst, const float *src, int rows, int cols) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            dst[(size_t)c * rows + r] = src[(size_t)r * cols + c];
}

/* One HF tensor: where it lives in our global tensors. */
typedef struct hf_tensor {
    char name[128];
    tpd_param p;
    int layer, conv1d;
    int64_t shape[2];
    int ndim;
} hf_tensor;

static int hf_tensors(const tpd_model_layout *g, hf_tensor *out) {
    int n = 0;
    for (int p = 0; p < TPD_P_COUNT; p++) {
        const tpd_param_slice *s = &g->p[p];
        if (tpd_model_layout_global_numel(g, (tpd_param)p) == 0) continue; /* not in the model */
        int layers = tpd_param_get_info((tpd_param)p)->per_layer ? s->g_layers : 1;
        for (int l = 0; l < layers; l++) {
            hf_tensor *t = &out[n++];
            t->p = (tpd_param)p;
            t->layer = l;
            tpd_ckpt_hf_name((tpd_param)p, l, 0, t->name, sizeof t->name, &t->conv1d);
            t->ndim = s->g_cols > 1 ? 2 : 1;
            t->shape[0] = t->conv1d ? s->g_cols : s->g_rows;
            t->shape[1] = t->conv1d ? s->g_rows : s->g_cols;
        }
    }
    return n;
}

/* HF file order: embeddings, then layer by layer, then ln_f. */
static int hf_order_cmp(const void *a, const void *b) {
    const hf_tensor *x = a, *y = b;
    int gx = tpd_param_get_info(x->p)->per_layer ? 1 : (x->p <= TPD_P_WPE ? 0 : 2);
    int gy = tpd_param_get_info(y->p)->per_layer ? 1 : (y->p <= TPD_P_WPE ? 0 : 2);
    if (gx != gy) return gx - gy;
    if (x->layer != y->layer) return x->layer - y->layer;
    return (int)x->p - (int)y->p;
}

/* The GPT-2 layouts of Hugging Face and llm.c: anything else is refused, naming what. */
static tpd_status gpt2_only(const tpd_config *cfg, const char *path) {
    const tpd_config_model *m = &cfg->model;
    const char *what = m->normalization != TPD_NORM_LAYERNORM          ? "RMSNorm"
                       : m->position_embedding_type != TPD_POS_LEARNED ? "rotary positions"
                       : m->swiglu                                     ? "SwiGLU"
                       : m->group_query_attention                      ? "grouped-query attention"
                       : m->untie_embeddings_and_output_weights        ? "an untied output layer"
                       : !m->add_bias_linear                           ? "no linear biases"
                                                                       : NULL;
    if (!what) return TPD_OK;
    return tpd_ckpt_fail(TPD_ERR_UNSUPPORTED,
                         "interchange %s: the Hugging Face and llm.c layouts here are GPT-2's; "
                         "this model has %s",
                         path, what);
}

static float *hf_src(const tpd_model_layout *g, float *const global[TPD_P_COUNT],
                     const hf_tensor *t) {
    const tpd_param_slice *s = &g->p[t->p];
    return global[t->p] + (size_t)t->layer * s->g_rows * s->g_cols;
}

static tpd_status write_config_json(const tpd_config *cfg, const char *dir) {
    const tpd_config_model *m = &cfg->model;
    int maxT = m->max_position_embeddings ? m->max_position_embeddings : m->seq_length;
    cJSON *o = cJSON_CreateObject();
    const char *arch[] = {"GPT2LMHeadModel"};
    cJSON_AddItemToObject(o, "architectures", cJSON_CreateStringArray(arch, 1));
    cJSON_AddStringToObject(o, "model_type", "gpt2");
    cJSON_AddNumberToObject(o, "vocab_size", m->vocab_size);
    cJSON_AddNumberToObject(o, "n_positions", maxT);
    cJSON_AddNumberToObject(o, "n_ctx", maxT);
    cJSON_AddNumberToObject(o, "n_embd", m->hidden_size);
    cJSON_AddNumberToObject(o, "n_layer", m->num_layers);
    cJSON_AddNumberToObject(o, "n_head", m->num_attention_heads);
    cJSON_AddNumberToObject(o, "n_inner",
                            m->ffn_hidden_size ? m->ffn_hidden_size : 4 * m->hidden_size);
    cJSON_AddStringToObject(o, "activation_function", "gelu_new");
    cJSON_AddNumberToObject(o, "layer_norm_epsilon", 1e-5);
    cJSON_AddNumberToObject(o, "initializer_range", m->init_method_std);
    cJSON_AddNumberToObject(o, "resid_pdrop", 0.0);
    cJSON_AddNumberToObject(o, "embd_pdrop", 0.0);
    cJSON_AddNumberToObject(o, "attn_pdrop", 0.0);
    /* the last token is the end-of-document token of the byte-level vocabulary */
    cJSON_AddNumberToObject(o, "bos_token_id", m->vocab_size - 1);
    cJSON_AddNumberToObject(o, "eos_token_id", m->vocab_size - 1);
    cJSON_AddBoolToObject(o, "tie_word_embeddings", 1);
    cJSON_AddStringToObject(o, "torch_dtype", "float32");
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    if (!text) return tpd_ckpt_fail(TPD_ERR_NOMEM, "interchange: out of memory");
    char path[PATH_CAP + 16];
    tpd_ckpt_join(path, sizeof path, dir, "config.json");
    tpd_status st = tpd_ckpt_write_file(path, text, strlen(text));
    free(text);
    return st;
}

tpd_status tpd_ckpt_export_hf(const tpd_config *cfg, float *const global[TPD_P_COUNT],
                              const char *out_dir) {
    tpd_model_layout g;
    TPD_CHECK(gpt2_only(cfg, out_dir));
    TPD_CHECK(tpd_model_layout_init(cfg, 1, 0, 1, 0, &g));
    TPD_CHECK(tpd_ckpt_mkdirs(out_dir));
    int cap = 4 + TPD_P_COUNT * (g.d.L + 1);
    hf_tensor *ts = calloc((size_t)cap, sizeof *ts);
    if (!ts) return tpd_ckpt_fail(TPD_ERR_NOMEM, "interchange: out of memory");
    int n = hf_tensors(&g, ts);
    qsort(ts, (size_t)n, sizeof *ts, hf_order_cmp);
    cJSON *hdr = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(hdr, "__metadata__");
    cJSON_AddStringToObject(meta, "format", "pt");
    uint64_t off = 0, maxn = 0;
    for (int i = 0; i < n; i++) {
        uint64_t bytes = (uint64_t)ts[i].shape[0] * (ts[i].ndim == 2 ? ts[i].shape[1] : 1) * 4;
        cJSON *t = cJSON_AddObjectToObject(hdr, ts[i].name);
        cJSON_AddStringToObject(t, "dtype", "F32");
        cJSON *shape = cJSON_AddArrayToObject(t, "shape");
        for (int d = 0; d < ts[i].ndim; d++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)ts[i].shape[d]));
        cJSON *offs = cJSON_AddArrayToObject(t, "data_offsets");
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(off + bytes)));
        off += bytes;
        if (bytes > maxn) maxn = bytes;
    }
    char *json = cJSON_PrintUnformatted(hdr);
    cJSON_Delete(hdr);
    tpd_status st = TPD_OK;
    char path[PATH_CAP + 32];
    tpd_ckpt_writer *w = NULL;
    char hex[65];
    float *tmp = malloc(maxn ? maxn : 4);
    if (!json || !tmp) TPD_CKPT_FAIL_GOTO(TPD_ERR_NOMEM, st, out, "interchange: out of memory");
    /* the header is padded with spaces so that the data starts 8-byte aligned */
    size_t hlen = strlen(json), padded = (hlen + 7) / 8 * 8;
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    tpd_ckpt_join(path, sizeof path, out_dir, "model.safetensors");
    TPD_CHECK_GOTO(tpd_ckpt_writer_open(path, &w), st, out);
    TPD_CHECK_GOTO(tpd_ckpt_writer_put(w, len8, 8), st, out);
    TPD_CHECK_GOTO(tpd_ckpt_writer_put(w, json, hlen), st, out);
    TPD_CHECK_GOTO(tpd_ckpt_writer_put(w, "        ", padded - hlen), st, out);
    for (int i = 0; i < n; i++) {
        const tpd_param_slice *s = &g.p[ts[i].p];
        const float *src = hf_src(&g, global, &ts[i]);
        size_t count = (size_t)s->g_rows * s->g_cols;
        if (ts[i].conv1d) {
            transpose(tmp, src, s->g_rows, s->g_cols);
            src = tmp;
        }
        TPD_CHECK_GOTO(tpd_ckpt_writer_put(w, src, count * 4), st, out);
    }
    st = tpd_ckpt_writer_finish(w, hex, NULL);
    w = NULL;
    if (st == TPD_OK) st = write_config_json(cfg, out_dir);
out:
    tpd_ckpt_writer_abort(w);
    free(tmp);
    free(json);
    free(ts);
    return st;
}

static int json_int(const cJSON *o, const char *key, int *v) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(j)) return 0;
    *v = j->valueint;
    return 1;
}

/* A JSON number that is a whole number in [0, 2^53], else -1. */
static int64_t json_index(const cJSON *j) {
    int64_t v;
    return tpd_ckpt_json_whole(j, &v) && v >= 0 ? v : -1;
}

/* The tensor name without "transformer."; NULL for entries that are skipped. */
static const char *hf_key(const char *name) {
    if (!strncmp(name, "transformer.", 12)) name += 12;
    if (!strcmp(name, "__metadata__") || !strncmp(name, "lm_head.", 8)) return NULL;
    const char *dot = strstr(name, ".attn.");
    if (dot && (!strcmp(dot, ".attn.bias") || !strcmp(dot, ".attn.masked_bias"))) return NULL;
    return name;
}

tpd_status tpd_ckpt_import_hf(const char *path, tpd_config *cfg, float *global[TPD_P_COUNT]) {
    char file[PATH_CAP + 32], cfgpath[PATH_CAP + 32];
    const char *ext = strrchr(path, '.');
    if (ext && !strcmp(ext, ".safetensors")) {
        snprintf(file, sizeof file, "%s", path);
        snprintf(cfgpath, sizeof cfgpath, "%s", path);
        char *slash = strrchr(cfgpath, '/');
        if (slash)
            snprintf(slash + 1, sizeof cfgpath - (size_t)(slash + 1 - cfgpath), "config.json");
        else
            snprintf(cfgpath, sizeof cfgpath, "config.json");
    } else {
        tpd_ckpt_join(file, sizeof file, path, "model.safetensors");
        tpd_ckpt_join(cfgpath, sizeof cfgpath, path, "config.json");
    }
    char *data = NULL, *ctext = NULL;
    size_t size = 0;
    cJSON *hdr = NULL, *hc = NULL;
    tpd_status st = TPD_OK;
    memset(global, 0, sizeof(float *) * TPD_P_COUNT);
    TPD_CHECK_GOTO(tpd_ckpt_read_file(cfgpath, &ctext, NULL), st, out);
    hc = cJSON_Parse(ctext);
    tpd_config_defaults(cfg);
    tpd_config_model *m = &cfg->model;
    if (!hc || !json_int(hc, "n_head", &m->num_attention_heads) ||
        !json_int(hc, "n_layer", &m->num_layers) || !json_int(hc, "n_embd", &m->hidden_size) ||
        !json_int(hc, "vocab_size", &m->vocab_size) ||
        !json_int(hc, "n_positions", &m->max_position_embeddings))
        TPD_CKPT_FAIL_GOTO(TPD_ERR_FORMAT, st, out,
                           "interchange %s: needs n_head, n_layer, n_embd, vocab_size, n_positions",
                           cfgpath);
    if (!json_int(hc, "n_inner", &m->ffn_hidden_size) || m->ffn_hidden_size <= 0)
        m->ffn_hidden_size = 4 * m->hidden_size; /* HF writes null for 4*n_embd */
    m->seq_length = m->max_position_embeddings;
    if (m->num_attention_heads < 1 || m->hidden_size % m->num_attention_heads)
        TPD_CKPT_FAIL_GOTO(TPD_ERR_FORMAT, st, out,
                           "interchange %s: n_embd %d is not a multiple of n_head %d", cfgpath,
                           m->hidden_size, m->num_attention_heads);

    TPD_CHECK_GOTO(tpd_ckpt_read_file(file, &data, &size), st, out);
    uint64_t hlen = 0;
    for (int i = 0; i < 8 && size >= 8; i++)
        hlen |= (uint64_t)(uint8_t)data[i] << (8 * i);
    if (size < 8 || hlen > size - 8)
        TPD_CKPT_FAIL_GOTO(TPD_ERR_FORMAT, st, out,
                           "interchange %s: header length %llu exceeds the file", file,
                           (unsigned long long)hlen);
    hdr = cJSON_ParseWithLength(data + 8, (size_t)hlen);
    if (!cJSON_IsObject(hdr))
        TPD_CKPT_FAIL_GOTO(TPD_ERR_FORMAT, st, out, "interchange %s: header is not a JSON object",
                           file);
    uint64_t dsize = size - 8 - hlen;
    const char *base = data + 8 + hlen;
    tpd_model_layout g;
    TPD_CHECK_GOTO(alloc_weights(cfg, global, &g), st, out);
    int cap = 4 + TPD_P_COUNT * (g.d.L + 1), found = 0;
    hf_tensor *ts = calloc((size_t)cap, sizeof *ts);
    char *seen = calloc((size_t)cap, 1);
    if (!ts || !seen) {
        free(ts);
        free(seen);
        TPD_CKPT_FAIL_GOTO(TPD_ERR_NOMEM, st, out, "interchange: out of memory");
    }
    int n = hf_tensors(&g, ts);
    for (const cJSON *e = hdr->child; e && st == TPD_OK; e = e->next) {
        const char *key = hf_key(e->string);
        if (!key) continue;
        int i = 0;
        for (; i < n && strcmp(ts[i].name + 12, key) != 0; i++) {
        }
        if (i == n) {
            st = tpd_ckpt_fail(TPD_ERR_FORMAT,
                               "interchange %s: unexpected tensor '%s' for a %d-layer GPT-2", file,
                               e->string, m->num_layers);
            break;
        }
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
        const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
        const cJSON *of = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        int ok = cJSON_IsString(dt) && !strcmp(dt->valuestring, "F32") &&
                 cJSON_GetArraySize(sh) == ts[i].ndim && cJSON_GetArraySize(of) == 2;
        for (int d = 0; ok && d < ts[i].ndim; d++)
            ok = json_index(cJSON_GetArrayItem(sh, d)) == ts[i].shape[d];
        int64_t b = ok ? json_index(cJSON_GetArrayItem(of, 0)) : -1;
        int64_t en = ok ? json_index(cJSON_GetArrayItem(of, 1)) : -1;
        ok = ok && b >= 0 && en >= 0;
        const tpd_param_slice *s = &g.p[ts[i].p];
        size_t count = (size_t)s->g_rows * s->g_cols;
        if (!ok || en < b || (uint64_t)en > dsize || (uint64_t)(en - b) != count * 4) {
            st = tpd_ckpt_fail(TPD_ERR_FORMAT,
                               "interchange %s: tensor '%s' is not F32 of shape [%lld%s%lld] "
                               "within the file",
                               file, e->string, (long long)ts[i].shape[0],
                               ts[i].ndim == 2 ? ", " : "",
                               ts[i].ndim == 2 ? (long long)ts[i].shape[1] : 0LL);
            break;
        }
        float *dst = hf_src(&g, global, &ts[i]);
        if (ts[i].conv1d) {
            float *tmp = malloc(count * 4);
            if (!tmp) {
                st = tpd_ckpt_fail(TPD_ERR_NOMEM, "interchange: out of memory");
                break;
            }
            memcpy(tmp, base + b, count * 4);
            transpose(dst, tmp, s->g_cols, s->g_rows); /* (in, out) -> (out, in) */
            free(tmp);
        } else {
            memcpy(dst, base + b, count * 4);
        }
        found += !seen[i];
        seen[i] = 1;
    }
    for (int i = 0; i < n && st == TPD_OK; i++)
        if (!seen[i])
            st = tpd_ckpt_fail(TPD_ERR_FORMAT, "interchange %s: tensor '%s' is missing", file,
                               ts[i].name);
    free(ts);
    free(seen);
    (void)found;
out:
    if (st != TPD_OK) tpd_ckpt_free_weights(global);
    cJSON_Delete(hdr);
    cJSON_Delete(hc);
    free(data);
    free(ctext);
    return st;
}

/* ---- llm.c ---- */

tpd_status tpd_ckpt_export_llmc(const tpd_config *cfg, float *const global[TPD_P_COUNT],
                                const char *out_path) {
    tpd_model_layout g;
    TPD_CHECK(gpt2_only(cfg, out_path));
    TPD_CHECK(tpd_model_layout_init(cfg, 1, 0, 1, 0, &g));
    const tpd_model_dims *d = &g.d;
    if (d->F != 4 * d->C)
        return tpd_ckpt_fail(TPD_ERR_UNSUPPORTED,
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
                      : tpd_ckpt_fail(TPD_ERR_NOMEM, "interchange: out of memory");
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
        TPD_CKPT_FAIL_GOTO(TPD_ERR_FORMAT, st, out,
                           "interchange %s: shorter than the 1024-byte header", path);
    memcpy(h, data, sizeof h);
    if (h[0] != TPD_LLMC_MODEL_MAGIC)
        TPD_CKPT_FAIL_GOTO(TPD_ERR_FORMAT, st, out,
                           "interchange %s: magic %d, an llm.c model file has %d", path, h[0],
                           TPD_LLMC_MODEL_MAGIC);
    if (h[1] != 3)
        TPD_CKPT_FAIL_GOTO(TPD_ERR_FORMAT, st, out,
                           "interchange %s: version %d; only 3 (fp32) is read", path, h[1]);
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
        TPD_CKPT_FAIL_GOTO(TPD_ERR_FORMAT, st, out, "interchange %s: impossible header shape",
                           path);
    /* the largest power-of-two padding that reproduces Vp, so an export writes it back */
    m->make_vocab_size_divisible_by = Vp;
    for (int d = 1; d <= Vp; d *= 2)
        if (Vp % d == 0 && (h[3] + d - 1) / d * d == Vp) m->make_vocab_size_divisible_by = d;
    tpd_model_layout g;
    TPD_CHECK_GOTO(alloc_weights(cfg, global, &g), st, out);
    size_t need = sizeof h + (size_t)(Vp - h[3]) * h[6] * 4;
    for (int p = 0; p < TPD_P_COUNT; p++)
        need += tpd_model_layout_global_numel(&g, (tpd_param)p) * 4;
    if (size != need)
        TPD_CKPT_FAIL_GOTO(TPD_ERR_FORMAT, st, out,
                           "interchange %s: %zu bytes, the header implies %zu", path, size, need);
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
