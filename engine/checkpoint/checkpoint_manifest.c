/* manifest.json: the run state, the config, the files with their SHA-256, and for every
 * global tensor and kind (param, exp_avg, exp_avg_sq, master) the runs that hold it.
 * Also the reader that assembles any rank's slice from those runs. Writing it is
 * checkpoint_manifest_write.c. */
#include <cjson/cJSON.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "engine/checkpoint/checkpoint_internal.h"

const char *const tpd_ckpt_kind_names[TPD_CKPT_KIND_COUNT] = {
    "param", "exp_avg", "exp_avg_sq", "master", "outer_sync", "outer_momentum"};

static void free_runs(tpd_ckpt_manifest *m) {
    for (int p = 0; p < TPD_P_COUNT; p++)
        for (int k = 0; k < TPD_CKPT_KIND_COUNT; k++)
            free(m->runs[p][k]);
}

void tpd_ckpt_manifest_free(tpd_ckpt_manifest *m) {
    if (!m) return;
    free_runs(m);
    for (int r = 0; m->rep && r < m->nrep; r++)
        free_runs(&m->rep[r]); /* they share m->files */
    free(m->rep);
    free(m->files);
    free(m);
}

/* ---- reading ---- */

/* The block's keys of the manifest's "model" (absent in checkpoints of GPT-2 written before
 * them: the defaults are GPT-2's). Returns 0 on a malformed value. */
static int read_block(const cJSON *mo, tpd_config_model *m) {
    const cJSON *v;
    if ((v = cJSON_GetObjectItemCaseSensitive(mo, "normalization"))) {
        int e =
            cJSON_IsString(v) ? tpd_config_choice_value("model.normalization", v->valuestring) : -1;
        if (e < 0) return 0;
        m->normalization = (tpd_norm)e;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(mo, "position_embedding_type"))) {
        int e = cJSON_IsString(v)
                    ? tpd_config_choice_value("model.position_embedding_type", v->valuestring)
                    : -1;
        if (e < 0) return 0;
        m->position_embedding_type = (tpd_pos_emb)e;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(mo, "norm_epsilon"))) {
        if (!cJSON_IsNumber(v) || !(v->valuedouble > 0)) return 0;
        m->norm_epsilon = v->valuedouble;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(mo, "rotary_base"))) {
        if (!cJSON_IsNumber(v) || !(v->valuedouble > 0)) return 0;
        m->rotary_base = v->valuedouble;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(mo, "rope_scaling"))) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(v, "factor");
        const cJSON *lo = cJSON_GetObjectItemCaseSensitive(v, "low_freq_factor");
        const cJSON *hi = cJSON_GetObjectItemCaseSensitive(v, "high_freq_factor");
        const cJSON *orig = cJSON_GetObjectItemCaseSensitive(v, "original_max_position_embeddings");
        if (!cJSON_IsNumber(f) || !cJSON_IsNumber(lo) || !cJSON_IsNumber(hi) ||
            !cJSON_IsNumber(orig) || !(f->valuedouble >= 1) || !(lo->valuedouble > 0) ||
            !(hi->valuedouble > lo->valuedouble) || !(orig->valuedouble >= 1) ||
            orig->valuedouble > 1e9)
            return 0;
        m->rope_scaling = 1;
        m->rope_scaling_factor = f->valuedouble;
        m->rope_scaling_low_freq_factor = lo->valuedouble;
        m->rope_scaling_high_freq_factor = hi->valuedouble;
        m->rope_scaling_original_max_position_embeddings = (int)orig->valuedouble;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(mo, "kv_channels"))) {
        if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble > 65536 ||
            v->valuedouble != floor(v->valuedouble))
            return 0;
        m->kv_channels = (int)v->valuedouble;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(mo, "num_query_groups"))) {
        if (!cJSON_IsNumber(v) || v->valuedouble < 1 ||
            m->num_attention_heads % (int)v->valuedouble)
            return 0;
        m->num_query_groups = (int)v->valuedouble;
        m->group_query_attention = m->num_query_groups != m->num_attention_heads;
    }
    const struct {
        const char *key;
        int *dst;
    } flags[] = {{"swiglu", &m->swiglu},
                 {"untie_embeddings_and_output_weights", &m->untie_embeddings_and_output_weights},
                 {"add_bias_linear", &m->add_bias_linear},
                 {"add_qkv_bias", &m->add_qkv_bias},
                 {"qk_layernorm", &m->qk_layernorm}};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if ((v = cJSON_GetObjectItemCaseSensitive(mo, flags[i].key))) {
            if (!cJSON_IsBool(v)) return 0;
            *flags[i].dst = cJSON_IsTrue(v);
        }
    if ((v = cJSON_GetObjectItemCaseSensitive(mo, "moe"))) { /* the mixture of experts */
        if (!cJSON_IsObject(v)) return 0;
        const struct {
            const char *key;
            int *dst;
            int lo, hi;
        } ints[] = {{"num_moe_experts", &m->num_moe_experts, 2, 4096},
                    {"moe_router_topk", &m->moe_router_topk, 1, 64},
                    {"moe_ffn_hidden_size", &m->moe_ffn_hidden_size, 1, 1 << 20},
                    {"moe_shared_expert_intermediate_size", &m->moe_shared_expert_intermediate_size,
                     0, 1 << 20}};
        for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
            const cJSON *x = cJSON_GetObjectItemCaseSensitive(v, ints[i].key);
            if (!cJSON_IsNumber(x) || x->valuedouble < ints[i].lo || x->valuedouble > ints[i].hi)
                return 0;
            *ints[i].dst = (int)x->valuedouble;
        }
        if (m->moe_router_topk > m->num_moe_experts) return 0;
        /* which layers are MoE (every layer where a manifest does not say) */
        const cJSON *fq = cJSON_GetObjectItemCaseSensitive(v, "moe_layer_freq");
        m->moe_layer_freq = 1;
        if (fq) {
            if (!cJSON_IsNumber(fq) || fq->valuedouble < 1 || fq->valuedouble > 1024 ||
                fq->valuedouble != (int)fq->valuedouble)
                return 0;
            m->moe_layer_freq = (int)fq->valuedouble;
        }
        const struct {
            const char *key;
            int *dst;
        } bools[] = {{"moe_shared_expert_gate", &m->moe_shared_expert_gate},
                     {"moe_router_pre_softmax", &m->moe_router_pre_softmax},
                     {"moe_norm_topk_prob", &m->moe_norm_topk_prob}};
        for (size_t i = 0; i < sizeof bools / sizeof bools[0]; i++) {
            const cJSON *x = cJSON_GetObjectItemCaseSensitive(v, bools[i].key);
            if (!cJSON_IsBool(x)) return 0;
            *bools[i].dst = cJSON_IsTrue(x);
        }
        const struct {
            const char *key;
            double *dst;
        } dbls[] = {{"moe_aux_loss_coeff", &m->moe_aux_loss_coeff},
                    {"moe_z_loss_coeff", &m->moe_z_loss_coeff},
                    {"moe_expert_capacity_factor", &m->moe_expert_capacity_factor}};
        for (size_t i = 0; i < sizeof dbls / sizeof dbls[0]; i++) {
            const cJSON *x = cJSON_GetObjectItemCaseSensitive(v, dbls[i].key);
            if (!cJSON_IsNumber(x) || !(x->valuedouble >= 0)) return 0;
            *dbls[i].dst = x->valuedouble;
        }
    }
    return 1;
}

int tpd_ckpt_json_whole(const cJSON *j, int64_t *v) {
    if (!cJSON_IsNumber(j) || !(fabs(j->valuedouble) <= 9007199254740992.0)) return 0;
    int64_t w = (int64_t)j->valuedouble;
    if ((double)w != j->valuedouble) return 0;
    *v = w;
    return 1;
}

static int get_int(const cJSON *o, const char *key, int64_t *v) {
    return tpd_ckpt_json_whole(cJSON_GetObjectItemCaseSensitive(o, key), v);
}

#define NEED_INT(obj, key, dst)                                                                    \
    do {                                                                                           \
        int64_t v_;                                                                                \
        if (!get_int((obj), (key), &v_))                                                           \
            TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, out, "checkpoint %s: '%s' missing or not a number",  \
                          path, (key));                                                            \
        (dst) = v_;                                                                                \
    } while (0)

/* NEED_INT within [lo, hi]: a manifest re-hashed after an edit is still checked. */
#define NEED_IN(obj, key, dst, lo, hi)                                                             \
    do {                                                                                           \
        int64_t w_;                                                                                \
        NEED_INT(obj, key, w_);                                                                    \
        if (w_ < (int64_t)(lo) || w_ > (int64_t)(hi))                                              \
            TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, out,                                                 \
                          "checkpoint %s: '%s' is %lld, outside [%lld, %lld]", path, (key),        \
                          (long long)w_, (long long)(lo), (long long)(hi));                        \
        (dst) = w_;                                                                                \
    } while (0)

/* Bounds of the manifest's numbers: those of the config keys they come from. */
#define MAN_MAX_ITERS 1000000000
#define MAN_MAX_ELEMS (INT64_C(1) << 50)

static tpd_status verify_file(const char *dir, const tpd_ckpt_file *f) {
    char path[TPD_CONFIG_STR + 128], hex[65];
    uint64_t bytes = 0;
    tpd_ckpt_join(path, sizeof path, dir, f->name);
    if (!tpd_ckpt_is_file(path))
        return tpd_fail(TPD_ERR_IO, "checkpoint %s: shard file is missing", path);
    TPD_CHECK(tpd_ckpt_sha256_file(path, hex, &bytes));
    if (bytes != f->bytes)
        return tpd_fail(TPD_ERR_FORMAT,
                        "checkpoint %s: %llu bytes but the manifest says %llu (truncated "
                        "or overwritten)",
                        path, (unsigned long long)bytes, (unsigned long long)f->bytes);
    if (strcmp(hex, f->sha256) != 0)
        return tpd_fail(TPD_ERR_FORMAT,
                        "checkpoint %s: SHA-256 %s does not match the manifest's %s "
                        "(corrupted)",
                        path, hex, f->sha256);
    return TPD_OK;
}

static tpd_status read_runs(const char *path, const cJSON *arr, tpd_ckpt_manifest *m, int p, int k,
                            int64_t numel) {
    int n = cJSON_GetArraySize(arr);
    m->runs[p][k] = calloc((size_t)(n ? n : 1), sizeof(tpd_ckpt_run));
    if (!m->runs[p][k]) return tpd_fail(TPD_ERR_NOMEM, "checkpoint: out of memory");
    m->nruns[p][k] = n;
    tpd_status st = TPD_OK;
    for (int i = 0; i < n; i++) {
        const cJSON *r = cJSON_GetArrayItem(arr, i);
        tpd_ckpt_run *run = &m->runs[p][k][i];
        const cJSON *file = cJSON_GetObjectItemCaseSensitive(r, "file");
        run->file = -1;
        for (int f = 0; cJSON_IsString(file) && f < m->nfiles; f++)
            if (!strcmp(m->files[f].name, file->valuestring)) run->file = f;
        if (run->file < 0)
            TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, out,
                          "checkpoint %s: tensor %s: a run names a file not in 'files'", path,
                          tpd_param_get_info((tpd_param)p)->name);
        /* each bounded by the tensor, so the products below fit in 64 bits */
        NEED_IN(r, "global_offset", run->g, 0, numel);
        NEED_IN(r, "count", run->n, 1, numel);
        NEED_IN(r, "repeat", run->repeat, 1, numel);
        NEED_IN(r, "global_stride", run->gstride, 0, numel);
        NEED_IN(r, "file_offset", run->foff, 0, MAN_MAX_ELEMS * 4);
        const char *tname = tpd_param_get_info((tpd_param)p)->name;
        if (run->foff % 4)
            TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, out,
                          "checkpoint %s: tensor %s: file_offset %lld is not a whole number "
                          "of fp32 elements",
                          path, tname, (long long)run->foff);
        int64_t end, last; /* the byte after the run, its last element: no overflow */
        if (__builtin_mul_overflow(run->n, run->repeat, &end) ||
            __builtin_mul_overflow(end, 4, &end) || __builtin_add_overflow(end, run->foff, &end) ||
            (uint64_t)end > m->files[run->file].bytes)
            TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, out,
                          "checkpoint %s: tensor %s: a run lies outside file %s", path, tname,
                          m->files[run->file].name);
        if ((run->repeat > 1 && run->gstride < run->n) ||
            __builtin_mul_overflow(run->repeat - 1, run->gstride, &last) ||
            __builtin_add_overflow(last, run->g + run->n, &last) || last > numel)
            TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, out,
                          "checkpoint %s: tensor %s: a run (global_offset %lld, count %lld, "
                          "repeat %lld, global_stride %lld) lies outside its %lld elements "
                          "or overlaps itself",
                          path, tname, (long long)run->g, (long long)run->n, (long long)run->repeat,
                          (long long)run->gstride, (long long)numel);
    }
out:
    return st;
}

static tpd_status read_info(const char *path, const cJSON *o, tpd_ckpt_info *info) {
    tpd_status st = TPD_OK;
    int64_t v;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(o, "format");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, TPD_CKPT_FORMAT) != 0)
        TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, out, "checkpoint %s: not a tripod checkpoint manifest",
                      path);
    NEED_INT(o, "version", v);
    if (v != TPD_CKPT_VERSION)
        TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, out, "checkpoint %s: version %lld, this build reads %d",
                      path, (long long)v, TPD_CKPT_VERSION);
    NEED_IN(o, "iteration", info->iteration, 0, MAN_MAX_ITERS);
    NEED_IN(o, "consumed_samples", info->consumed_samples, 0, INT64_MAX);
    NEED_IN(o, "skipped_iterations", info->skipped_iterations, 0, info->iteration);
    info->weights_only = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "weights_only"));
    const cJSON *rng = cJSON_GetObjectItemCaseSensitive(o, "rng");
    const cJSON *seed = cJSON_GetObjectItemCaseSensitive(rng, "seed");
    info->seed = cJSON_IsString(seed) ? strtoull(seed->valuestring, NULL, 10) : 0;
    const cJSON *lay = cJSON_GetObjectItemCaseSensitive(o, "layout");
    NEED_IN(lay, "tensor_model_parallel_size", info->tp, 1, 4096);
    NEED_IN(lay, "pipeline_model_parallel_size", info->pp, 1, TPD_CONFIG_MAX_STAGES);
    NEED_IN(lay, "data_parallel_size", info->dp, 1, 1 << 20);
    info->zero = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(lay, "use_distributed_optimizer"));
    /* checkpoints written before parallel.dp_sync: every_step */
    info->dp_sync = TPD_DP_SYNC_EVERY_STEP;
    info->replicas = info->fragments = 1;
    const cJSON *ds = cJSON_GetObjectItemCaseSensitive(o, "dp_sync");
    if (ds) {
        const cJSON *mode = cJSON_GetObjectItemCaseSensitive(ds, "mode");
        if (!cJSON_IsString(mode) || (strcmp(mode->valuestring, "every_step") != 0 &&
                                      strcmp(mode->valuestring, "diloco") != 0))
            TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, out,
                          "checkpoint %s: dp_sync.mode is not every_step or diloco", path);
        info->dp_sync =
            strcmp(mode->valuestring, "diloco") ? TPD_DP_SYNC_EVERY_STEP : TPD_DP_SYNC_DILOCO;
        NEED_IN(ds, "replicas", info->replicas, 1, 1 << 20);
        NEED_IN(ds, "fragments", info->fragments, 1, 1 << 20);
        NEED_IN(ds, "overlap_steps", info->overlap_steps, 0, MAN_MAX_ITERS);
        NEED_IN(ds, "sync_interval", info->sync_interval, 0, MAN_MAX_ITERS);
        if (info->dp_sync == TPD_DP_SYNC_EVERY_STEP && info->replicas != 1)
            TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, out,
                          "checkpoint %s: dp_sync every_step with %d replicas (only diloco "
                          "has more than one)",
                          path, info->replicas);
    }
    const cJSON *mo = cJSON_GetObjectItemCaseSensitive(o, "model");
    tpd_config *c = &info->cfg;
    tpd_config_defaults(c);
    /* the bounds of the config keys (engine/config/config_schema.c) */
    NEED_IN(mo, "num_layers", c->model.num_layers, 1, 1024);
    NEED_IN(mo, "hidden_size", c->model.hidden_size, 1, 262144);
    NEED_IN(mo, "num_attention_heads", c->model.num_attention_heads, 1, 4096);
    NEED_IN(mo, "ffn_hidden_size", c->model.ffn_hidden_size, 1, 1048576);
    NEED_IN(mo, "vocab_size", c->model.vocab_size, 1, 16777216);
    NEED_IN(mo, "seq_length", c->model.seq_length, 1, 1048576);
    NEED_IN(mo, "max_position_embeddings", c->model.max_position_embeddings, 1, 1048576);
    NEED_IN(mo, "make_vocab_size_divisible_by", c->model.make_vocab_size_divisible_by, 1, 65536);
    if (!read_block(mo, &c->model))
        TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, out,
                      "checkpoint %s: 'model' holds a malformed block key (normalization, "
                      "position_embedding_type, norm_epsilon, rotary_base, num_query_groups, "
                      "kv_channels, "
                      "swiglu, untie_embeddings_and_output_weights or add_bias_linear)",
                      path);
    c->training.seed = info->seed;
    if (c->model.num_layers < 1 || c->model.hidden_size < 1 || c->model.num_attention_heads < 1 ||
        (!c->model.kv_channels && c->model.hidden_size % c->model.num_attention_heads) ||
        c->model.vocab_size < 1 || c->model.max_position_embeddings < 1 ||
        c->model.ffn_hidden_size < 1 || c->model.seq_length < 1 ||
        c->model.make_vocab_size_divisible_by < 1)
        TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, out, "checkpoint %s: 'model' holds an impossible shape",
                      path);
out:
    return st;
}

/* One run's blocks, or one run's bytes in its file, as [a, b) for the overlap checks. */
typedef struct span {
    int64_t key, a, b;
} span;

static int span_cmp(const void *x, const void *y) {
    const span *s = x, *t = y;
    if (s->key != t->key) return s->key < t->key ? -1 : 1;
    return s->a < t->a ? -1 : s->a > t->a;
}

/* Sorts the spans; those of one key must not overlap. Returns the index of the first
 * span that overlaps its predecessor, or -1; *gaps_p gets whether they leave holes in
 * [0, end of the last). */
static long spans_overlap(span *v, size_t n, int *gaps_p) {
    qsort(v, n, sizeof *v, span_cmp);
    *gaps_p = 0;
    for (size_t i = 0; i < n; i++) {
        int first = i == 0 || v[i].key != v[i - 1].key;
        if (!first && v[i].a < v[i - 1].b) return (long)i;
        if ((first && v[i].a != 0) || (!first && v[i].a != v[i - 1].b)) *gaps_p = 1;
    }
    return -1;
}

/* The runs of each (tensor, kind) cover it exactly once (their total was checked against
 * the shape: no overlap means full coverage), and the runs tile each file: the writer
 * puts them back to back, so an overlap or a hole means an edited offset. */
static tpd_status check_coverage(const char *path, const tpd_ckpt_manifest *m) {
    size_t nb = 0, nr = 0;
    for (int p = 0; p < TPD_P_COUNT; p++)
        for (int k = 0; k < TPD_CKPT_KIND_COUNT; k++)
            for (int i = 0; i < m->nruns[p][k]; i++) {
                nb += (size_t)m->runs[p][k][i].repeat;
                nr++;
            }
    span *b = malloc((nb ? nb : 1) * sizeof *b), *f = malloc((nr ? nr : 1) * sizeof *f);
    tpd_status st = TPD_OK;
    if (!b || !f) TPD_FAIL_GOTO(TPD_ERR_NOMEM, st, out, "checkpoint: out of memory");
    nb = nr = 0;
    for (int p = 0; p < TPD_P_COUNT; p++)
        for (int k = 0; k < TPD_CKPT_KIND_COUNT; k++)
            for (int i = 0; i < m->nruns[p][k]; i++) {
                const tpd_ckpt_run *r = &m->runs[p][k][i];
                for (int64_t j = 0; j < r->repeat; j++, nb++)
                    b[nb] = (span){p * TPD_CKPT_KIND_COUNT + k, r->g + j * r->gstride,
                                   r->g + j * r->gstride + r->n};
                f[nr++] = (span){r->file, r->foff, r->foff + r->n * r->repeat * 4};
            }
    int gaps;
    long at = spans_overlap(b, nb, &gaps);
    if (at >= 0)
        TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, out,
                      "checkpoint %s: tensor %s %s: runs overlap at element %lld (part of "
                      "it is not covered)",
                      path, tpd_param_get_info((tpd_param)(b[at].key / TPD_CKPT_KIND_COUNT))->name,
                      tpd_ckpt_kind_names[b[at].key % TPD_CKPT_KIND_COUNT], (long long)b[at].a);
    if (spans_overlap(f, nr, &gaps) >= 0 || gaps)
        TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, out,
                      "checkpoint %s: the runs' file_offset values overlap or leave holes "
                      "in the shard files (each file holds its runs back to back)",
                      path);
    for (size_t i = 0; i < nr; i++)
        if ((i + 1 == nr || f[i + 1].key != f[i].key) &&
            (uint64_t)f[i].b != m->files[f[i].key].bytes)
            TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, out,
                          "checkpoint %s: file %s is %llu bytes but its runs end at %lld", path,
                          m->files[f[i].key].name, (unsigned long long)m->files[f[i].key].bytes,
                          (long long)f[i].b);
out:
    free(b);
    free(f);
    return st;
}

/* One tensor table (replica 0's "tensors", or a replica's) into m's runs; has_kind[k]
 * gets 1 for the kinds it holds. */
static tpd_status read_tensors(const char *path, const cJSON *ta, const tpd_model_layout *g,
                               tpd_ckpt_manifest *m, int *has_kind) {
    tpd_status st = TPD_OK;
    /* a checkpoint written before lmhead joined the table lacks it: fine for a tied model */
    int ntensors = cJSON_GetArraySize(ta);
    if (ntensors != TPD_P_COUNT &&
        !(ntensors == TPD_P_LMHEAD && tpd_model_layout_global_numel(g, TPD_P_LMHEAD) == 0))
        TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, out, "checkpoint %s: expected %d tensors", path,
                      TPD_P_COUNT);
    for (int p = 0; p < ntensors; p++) {
        const cJSON *t = cJSON_GetArrayItem(ta, p);
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(t, "name");
        if (!cJSON_IsString(name) ||
            strcmp(name->valuestring, tpd_param_get_info((tpd_param)p)->name) != 0)
            TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, out, "checkpoint %s: tensors[%d] should be %s", path,
                          p, tpd_param_get_info((tpd_param)p)->name);
        for (int k = 0; k < TPD_CKPT_KIND_COUNT; k++) {
            const cJSON *arr = cJSON_GetObjectItemCaseSensitive(t, tpd_ckpt_kind_names[k]);
            if (!arr) continue;
            TPD_CHECK_GOTO(read_runs(path, arr, m, p, k,
                                     (int64_t)tpd_model_layout_global_numel(g, (tpd_param)p)),
                           st, out);
            /* the runs must cover the global tensor exactly once (overlaps are caught
             * when reading) */
            int64_t total = 0;
            for (int i = 0; i < m->nruns[p][k]; i++)
                total += m->runs[p][k][i].n * m->runs[p][k][i].repeat;
            if (total != (int64_t)tpd_model_layout_global_numel(g, (tpd_param)p))
                TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, out,
                              "checkpoint %s: tensor %s %s: runs hold %lld elements, the shape "
                              "%zu",
                              path, name->valuestring, tpd_ckpt_kind_names[k], (long long)total,
                              tpd_model_layout_global_numel(g, (tpd_param)p));
            if (p == 0) has_kind[k] = 1;
        }
    }
out:
    return st;
}

tpd_status tpd_ckpt_manifest_read(const char *dir, int verify, tpd_ckpt_info *info) {
    char path[TPD_CONFIG_STR + 64], spath[TPD_CONFIG_STR + 64], hex[65];
    tpd_ckpt_join(path, sizeof path, dir, TPD_CKPT_MANIFEST);
    tpd_ckpt_join(spath, sizeof spath, dir, TPD_CKPT_MANIFEST_SHA);
    memset(info, 0, sizeof *info);
    snprintf(info->dir, sizeof info->dir, "%s", dir);
    char *text = NULL, *want = NULL, *need = NULL;
    size_t n = 0;
    cJSON *o = NULL;
    tpd_status st = TPD_OK;
    tpd_ckpt_manifest *m = calloc(1, sizeof *m);
    if (!m) return tpd_fail(TPD_ERR_NOMEM, "checkpoint: out of memory");
    if (!tpd_ckpt_is_file(path))
        TPD_FAIL_GOTO(TPD_ERR_IO, st, out, "checkpoint %s: missing (not a complete checkpoint)",
                      path);
    TPD_CHECK_GOTO(tpd_ckpt_read_file(path, &text, &n), st, out);
    TPD_CHECK_GOTO(tpd_ckpt_read_file(spath, &want, NULL), st, out);
    tpd_ckpt_sha256_hex(text, n, hex);
    if (strncmp(want, hex, 64) != 0)
        TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, out,
                      "checkpoint %s: SHA-256 does not match %s (corrupted)", path, spath);
    o = cJSON_ParseWithLength(text, n);
    if (!o) TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, out, "checkpoint %s: not valid JSON", path);
    TPD_CHECK_GOTO(read_info(path, o, info), st, out);

    const cJSON *fa = cJSON_GetObjectItemCaseSensitive(o, "files");
    m->nfiles = cJSON_GetArraySize(fa);
    m->files = calloc((size_t)(m->nfiles ? m->nfiles : 1), sizeof *m->files);
    if (!m->files) TPD_FAIL_GOTO(TPD_ERR_NOMEM, st, out, "checkpoint: out of memory");
    for (int i = 0; i < m->nfiles; i++) {
        const cJSON *f = cJSON_GetArrayItem(fa, i);
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
        const cJSON *sha = cJSON_GetObjectItemCaseSensitive(f, "sha256");
        const cJSON *rank = cJSON_GetObjectItemCaseSensitive(f, "rank");
        if (!cJSON_IsString(name) || !cJSON_IsString(sha) || strlen(sha->valuestring) != 64 ||
            strchr(name->valuestring, '/') || cJSON_GetArraySize(rank) != 3)
            TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, out, "checkpoint %s: files[%d] is malformed", path,
                          i);
        snprintf(m->files[i].name, sizeof m->files[i].name, "%s", name->valuestring);
        snprintf(m->files[i].sha256, sizeof m->files[i].sha256, "%s", sha->valuestring);
        NEED_IN(f, "bytes", m->files[i].bytes, 0, MAN_MAX_ELEMS * 4);
        int lim[3] = {info->tp, info->pp, info->dp},
            *at[3] = {&m->files[i].tp, &m->files[i].pp, &m->files[i].dp};
        for (int d = 0; d < 3; d++) {
            const cJSON *x = cJSON_GetArrayItem(rank, d);
            if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble >= lim[d] ||
                x->valuedouble != (double)x->valueint)
                TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, out,
                              "checkpoint %s: files[%d] (%s): rank is not a rank of the "
                              "layout TP %d PP %d DP %d",
                              path, i, m->files[i].name, info->tp, info->pp, info->dp);
            *at[d] = x->valueint;
        }
        const cJSON *rep = cJSON_GetObjectItemCaseSensitive(f, "replica");
        if (rep && (!cJSON_IsNumber(rep) || rep->valuedouble < 0 ||
                    rep->valuedouble >= info->replicas || rep->valuedouble != rep->valueint))
            TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, out,
                          "checkpoint %s: files[%d] (%s): replica is not one of the %d replicas",
                          path, i, m->files[i].name, info->replicas);
        m->files[i].replica = rep ? rep->valueint : 0;
    }
    tpd_model_layout g;
    TPD_CHECK_GOTO(tpd_model_layout_init(&info->cfg, 1, 0, 1, 0, &g), st, out);
    const cJSON *ta = cJSON_GetObjectItemCaseSensitive(o, "tensors");
    TPD_CHECK_GOTO(read_tensors(path, ta, &g, m, info->has_kind), st, out);
    TPD_CHECK_GOTO(check_coverage(path, m), st, out);
    const cJSON *ra = cJSON_GetObjectItemCaseSensitive(o, "replicas");
    if (cJSON_GetArraySize(ra) != info->replicas - 1)
        TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, out,
                      "checkpoint %s: dp_sync.replicas is %d but 'replicas' lists %d more", path,
                      info->replicas, cJSON_GetArraySize(ra));
    if (info->replicas > 1) {
        m->nrep = info->replicas - 1;
        m->rep = calloc((size_t)m->nrep, sizeof *m->rep);
        if (!m->rep) TPD_FAIL_GOTO(TPD_ERR_NOMEM, st, out, "checkpoint: out of memory");
        for (int r = 0; r < m->nrep; r++) {
            int has[TPD_CKPT_KIND_COUNT] = {0};
            tpd_ckpt_manifest *rm = &m->rep[r];
            rm->nfiles = m->nfiles;
            rm->files = m->files;
            const cJSON *rt = cJSON_GetArrayItem(ra, r);
            TPD_CHECK_GOTO(
                read_tensors(path, cJSON_GetObjectItemCaseSensitive(rt, "tensors"), &g, rm, has),
                st, out);
            TPD_CHECK_GOTO(check_coverage(path, rm), st, out);
            if (!has[TPD_CKPT_PARAM])
                TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, out,
                              "checkpoint %s: replica %d holds no parameters", path, r + 1);
        }
    }
    if (verify) {
        /* WEIGHTS: only the files some run of the weights' kind points into */
        int kw = info->has_kind[TPD_CKPT_MASTER] ? TPD_CKPT_MASTER : TPD_CKPT_PARAM;
        need = calloc((size_t)(m->nfiles ? m->nfiles : 1), 1);
        if (!need) TPD_FAIL_GOTO(TPD_ERR_NOMEM, st, out, "checkpoint: out of memory");
        for (int p = 0; p < TPD_P_COUNT; p++)
            for (int i = 0; i < m->nruns[p][kw]; i++)
                need[m->runs[p][kw][i].file] = 1;
        for (int i = 0; i < m->nfiles; i++)
            if (verify == TPD_CKPT_VERIFY_ALL || need[i])
                TPD_CHECK_GOTO(verify_file(dir, &m->files[i]), st, out);
    }
    info->man = m;
    info->nfiles = m->nfiles;
    info->file_bytes = 0;
    for (int i = 0; i < m->nfiles; i++)
        info->file_bytes += m->files[i].bytes;
    m = NULL;
out:
    cJSON_Delete(o);
    free(text);
    free(want);
    free(need);
    tpd_ckpt_manifest_free(m);
    return st;
}

/* Equal, or equal to the 15 significant digits that manifests written before add_exact
 * hold (their value is a neighbour of the config's, not another setting). */
static int same_value(double ckpt, double conf) {
    char a[32], b[32];
    snprintf(a, sizeof a, "%.15g", ckpt);
    snprintf(b, sizeof b, "%.15g", conf);
    return ckpt == conf || !strcmp(a, b);
}

tpd_status tpd_ckpt_check_model(const tpd_ckpt_info *info, const tpd_config *cfg) {
    const tpd_config_model *a = &info->cfg.model, *b = &cfg->model;
    struct {
        const char *key;
        int ckpt, conf;
    } keys[] = {
        {"num_layers", a->num_layers, b->num_layers},
        {"hidden_size", a->hidden_size, b->hidden_size},
        {"num_attention_heads", a->num_attention_heads, b->num_attention_heads},
        {"ffn_hidden_size", a->ffn_hidden_size, b->ffn_hidden_size},
        {"vocab_size", a->vocab_size, b->vocab_size},
        {"max_position_embeddings", a->max_position_embeddings, b->max_position_embeddings},
        /* the block's shape (Llama); ranks of the enums */
        {"normalization", (int)a->normalization, (int)b->normalization},
        {"position_embedding_type", (int)a->position_embedding_type,
         (int)b->position_embedding_type},
        {"swiglu", a->swiglu, b->swiglu},
        {"num_query_groups", tpd_config_kv_heads(&info->cfg), tpd_config_kv_heads(cfg)},
        {"kv_channels", tpd_config_head_dim(&info->cfg), tpd_config_head_dim(cfg)}, /* head size */
        {"untie_embeddings_and_output_weights", a->untie_embeddings_and_output_weights,
         b->untie_embeddings_and_output_weights},
        {"add_bias_linear", a->add_bias_linear, b->add_bias_linear},
        {"add_qkv_bias", tpd_config_qkv_bias(&info->cfg), tpd_config_qkv_bias(cfg)},
        {"qk_layernorm", a->qk_layernorm, b->qk_layernorm},
        /* the mixture of experts' shapes and routing */
        {"num_moe_experts", a->num_moe_experts, b->num_moe_experts},
        {"moe_router_topk", a->num_moe_experts ? a->moe_router_topk : 0,
         b->num_moe_experts ? b->moe_router_topk : 0},
        {"moe_layer_freq", a->num_moe_experts ? a->moe_layer_freq : 0,
         b->num_moe_experts ? b->moe_layer_freq : 0},
        {"moe_ffn_hidden_size", a->num_moe_experts ? tpd_config_moe_ffn(&info->cfg) : 0,
         b->num_moe_experts ? tpd_config_moe_ffn(cfg) : 0},
        {"moe_shared_expert_intermediate_size", a->moe_shared_expert_intermediate_size,
         b->moe_shared_expert_intermediate_size},
        {"moe_shared_expert_gate", a->moe_shared_expert_gate, b->moe_shared_expert_gate},
        {"moe_router_pre_softmax", a->moe_router_pre_softmax, b->moe_router_pre_softmax},
        {"moe_norm_topk_prob", a->moe_norm_topk_prob, b->moe_norm_topk_prob},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (keys[i].ckpt != keys[i].conf)
            return tpd_fail(TPD_ERR_INVALID,
                            "checkpoint %s: model.%s is %d in the checkpoint but %d in "
                            "the config",
                            info->dir, keys[i].key, keys[i].ckpt, keys[i].conf);
    /* values that change the function without changing a shape: a mismatch would train a
     * different model silently */
    struct {
        const char *key;
        double ckpt, conf;
    } vals[] = {
        {"norm_epsilon", a->norm_epsilon, b->norm_epsilon},
        {"rotary_base", a->position_embedding_type == TPD_POS_ROPE ? a->rotary_base : 0,
         b->position_embedding_type == TPD_POS_ROPE ? b->rotary_base : 0},
        {"rope_scaling_factor", a->rope_scaling ? a->rope_scaling_factor : 0,
         b->rope_scaling ? b->rope_scaling_factor : 0},
        {"rope_scaling_low_freq_factor", a->rope_scaling ? a->rope_scaling_low_freq_factor : 0,
         b->rope_scaling ? b->rope_scaling_low_freq_factor : 0},
        {"rope_scaling_high_freq_factor", a->rope_scaling ? a->rope_scaling_high_freq_factor : 0,
         b->rope_scaling ? b->rope_scaling_high_freq_factor : 0},
        {"rope_scaling_original_max_position_embeddings",
         a->rope_scaling ? a->rope_scaling_original_max_position_embeddings : 0,
         b->rope_scaling ? b->rope_scaling_original_max_position_embeddings : 0},
        {"moe_expert_capacity_factor", a->moe_expert_capacity_factor,
         b->moe_expert_capacity_factor},
    };
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++)
        if (!same_value(vals[i].ckpt, vals[i].conf))
            return tpd_fail(TPD_ERR_INVALID,
                            "checkpoint %s: model.%s is %.17g in the checkpoint but %.17g "
                            "in the config",
                            info->dir, vals[i].key, vals[i].ckpt, vals[i].conf);
    return TPD_OK;
}

/* A source run expanded to one block. */
typedef struct src_block {
    int64_t g, n, foff;
    int file;
} src_block;

static int block_cmp(const void *a, const void *b) {
    int64_t x = ((const src_block *)a)->g, y = ((const src_block *)b)->g;
    return x < y ? -1 : x > y;
}

tpd_status tpd_ckpt_gather(const tpd_ckpt_info *info, tpd_param p, tpd_ckpt_kind k,
                           const tpd_ckpt_segs *want, float *dst, int *fds) {
    const tpd_ckpt_manifest *m = info->man;
    const char *tname = tpd_param_get_info(p)->name;
    if (want->n == 0) return TPD_OK;
    if (!m->runs[p][k])
        return tpd_fail(TPD_ERR_FORMAT, "checkpoint %s: tensor %s has no %s", info->dir, tname,
                        tpd_ckpt_kind_names[k]);
    size_t nb = 0;
    for (int i = 0; i < m->nruns[p][k]; i++)
        nb += (size_t)m->runs[p][k][i].repeat;
    src_block *b = malloc((nb ? nb : 1) * sizeof *b);
    if (!b) return tpd_fail(TPD_ERR_NOMEM, "checkpoint: out of memory");
    nb = 0;
    for (int i = 0; i < m->nruns[p][k]; i++) {
        const tpd_ckpt_run *r = &m->runs[p][k][i];
        for (int64_t j = 0; j < r->repeat; j++)
            b[nb++] = (src_block){r->g + j * r->gstride, r->n, r->foff + j * r->n * 4, r->file};
    }
    qsort(b, nb, sizeof *b, block_cmp);
    tpd_status st = TPD_OK;
    char path[TPD_CONFIG_STR + 128];
    int64_t covered = 0, wanted = 0;
    size_t s = 0;
    for (size_t i = 1; i < nb; i++)
        if (b[i - 1].g + b[i - 1].n > b[i].g)
            TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, out, "checkpoint %s: tensor %s %s: runs overlap",
                          info->dir, tname, tpd_ckpt_kind_names[k]);
    for (size_t w = 0; w < want->n; w++) {
        const tpd_ckpt_seg *sg = &want->v[w];
        wanted += sg->n;
        while (s < nb && b[s].g + b[s].n <= sg->g)
            s++;
        for (size_t t = s; t < nb && b[t].g < sg->g + sg->n; t++) {
            int64_t lo = b[t].g > sg->g ? b[t].g : sg->g;
            int64_t hi = b[t].g + b[t].n < sg->g + sg->n ? b[t].g + b[t].n : sg->g + sg->n;
            const tpd_ckpt_file *f = &m->files[b[t].file];
            tpd_ckpt_join(path, sizeof path, info->dir, f->name);
            if (fds[b[t].file] < 0) {
                int err;
                fds[b[t].file] = tpd_file_open_read(path, &err);
                if (fds[b[t].file] < 0)
                    TPD_FAIL_GOTO(TPD_ERR_IO, st, out, "checkpoint %s: shard file: %s", path,
                                  tpd_file_strerror(err));
            }
            TPD_CHECK_GOTO(tpd_ckpt_pread(fds[b[t].file], path, dst + sg->local + (lo - sg->g),
                                          (size_t)(hi - lo) * 4,
                                          (uint64_t)(b[t].foff + (lo - b[t].g) * 4)),
                           st, out);
            covered += hi - lo;
        }
    }
    if (covered != wanted)
        TPD_FAIL_GOTO(TPD_ERR_FORMAT, st, out,
                      "checkpoint %s: tensor %s %s: %lld of %lld needed elements are missing",
                      info->dir, tname, tpd_ckpt_kind_names[k], (long long)(wanted - covered),
                      (long long)wanted);
out:
    free(b);
    return st;
}
