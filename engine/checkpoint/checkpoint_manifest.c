/* manifest.json: the run state, the config, the files with their SHA-256, and for every
 * global tensor and kind (param, exp_avg, exp_avg_sq, master) the runs that hold it.
 * Also the reader that assembles any rank's slice from those runs. */
#include <cjson/cJSON.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "engine/checkpoint/checkpoint_internal.h"
#include "engine/optim/lr.h"

static const char *const g_kind_names[TPD_CKPT_KIND_COUNT] = {
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

/* ---- writing ---- */

static cJSON *shape_json(const tpd_model_layout *g, tpd_param p) {
    const tpd_param_slice *s = &g->p[p];
    cJSON *a = cJSON_CreateArray();
    if (tpd_param_get_info(p)->per_layer) cJSON_AddItemToArray(a, cJSON_CreateNumber(s->g_layers));
    cJSON_AddItemToArray(a, cJSON_CreateNumber(s->g_rows));
    if (s->g_cols > 1) cJSON_AddItemToArray(a, cJSON_CreateNumber(s->g_cols));
    return a;
}

/* Runs of one rank's segments: equal-sized blocks, back to back in the file, at a constant
 * global stride, become one run. */
static void add_runs(cJSON *arr, const tpd_ckpt_segs *s, const char *file, int tp, int pp, int dp,
                     int64_t byte_base) {
    for (size_t i = 0; i < s->n;) {
        const tpd_ckpt_seg *a = &s->v[i];
        size_t j = i + 1;
        int64_t stride = 0;
        while (j < s->n && s->v[j].n == a->n && s->v[j].file == s->v[j - 1].file + a->n &&
               (j == i + 1 || s->v[j].g - s->v[j - 1].g == stride)) {
            if (j == i + 1) stride = s->v[j].g - a->g;
            j++;
        }
        cJSON *r = cJSON_CreateObject();
        cJSON_AddStringToObject(r, "file", file);
        int coords[3] = {tp, pp, dp};
        cJSON_AddItemToObject(r, "rank", cJSON_CreateIntArray(coords, 3));
        cJSON_AddNumberToObject(r, "global_offset", (double)a->g);
        cJSON_AddNumberToObject(r, "count", (double)a->n);
        cJSON_AddNumberToObject(r, "repeat", (double)(j - i));
        cJSON_AddNumberToObject(r, "global_stride", (double)stride);
        cJSON_AddNumberToObject(r, "file_offset", (double)(byte_base + a->file * 4));
        cJSON_AddItemToArray(arr, r);
        i = j;
    }
}

static char *config_yaml(const tpd_config *cfg) {
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f) return NULL;
    tpd_config_print(cfg, f);
    fclose(f);
    return buf;
}

/* A model value as a decimal that reads back as the same double: cJSON's 15 significant
 * digits where they do (the text cJSON writes), else 17. cJSON alone accepts 15 digits
 * within a relative 2^-52 and so can store a neighbour of the value, which a config holding
 * the value itself (as `tripod import` prints it) would then not match at load. */
void tpd_ckpt_format_value(double x, char *buf, size_t n) {
    snprintf(buf, n, "%.15g", x);
    if (strtod(buf, NULL) != x) snprintf(buf, n, "%.17g", x);
}

static void add_exact(cJSON *o, const char *key, double x) {
    char buf[32];
    tpd_ckpt_format_value(x, buf, sizeof buf);
    if (!isfinite(x) || !cJSON_AddRawToObject(o, key, buf)) cJSON_AddNumberToObject(o, key, x);
}

static void add_model(cJSON *o, const tpd_config *cfg) {
    const tpd_config_model *m = &cfg->model;
    cJSON *j = cJSON_AddObjectToObject(o, "model");
    cJSON_AddNumberToObject(j, "num_layers", m->num_layers);
    cJSON_AddNumberToObject(j, "hidden_size", m->hidden_size);
    cJSON_AddNumberToObject(j, "num_attention_heads", m->num_attention_heads);
    cJSON_AddNumberToObject(j, "ffn_hidden_size", m->ffn_hidden_size);
    cJSON_AddNumberToObject(j, "vocab_size", m->vocab_size);
    cJSON_AddNumberToObject(j, "seq_length", m->seq_length);
    cJSON_AddNumberToObject(j, "max_position_embeddings", m->max_position_embeddings);
    cJSON_AddNumberToObject(j, "make_vocab_size_divisible_by", m->make_vocab_size_divisible_by);
    add_exact(j, "init_method_std", m->init_method_std);
    /* the block's shape: which tensors exist and how they are laid out */
    cJSON_AddStringToObject(j, "normalization",
                            tpd_config_choice("model.normalization", m->normalization));
    add_exact(j, "norm_epsilon", m->norm_epsilon);
    cJSON_AddStringToObject(
        j, "position_embedding_type",
        tpd_config_choice("model.position_embedding_type", m->position_embedding_type));
    add_exact(j, "rotary_base", m->rotary_base);
    cJSON_AddBoolToObject(j, "swiglu", m->swiglu);
    cJSON_AddNumberToObject(j, "num_query_groups", tpd_config_kv_heads(cfg));
    cJSON_AddBoolToObject(j, "untie_embeddings_and_output_weights",
                          m->untie_embeddings_and_output_weights);
    cJSON_AddBoolToObject(j, "add_bias_linear", m->add_bias_linear);
    cJSON_AddBoolToObject(j, "add_qkv_bias", m->add_qkv_bias);
    if (m->rope_scaling) {
        cJSON *r = cJSON_AddObjectToObject(j, "rope_scaling");
        add_exact(r, "factor", m->rope_scaling_factor);
        add_exact(r, "low_freq_factor", m->rope_scaling_low_freq_factor);
        add_exact(r, "high_freq_factor", m->rope_scaling_high_freq_factor);
        cJSON_AddNumberToObject(r, "original_max_position_embeddings",
                                m->rope_scaling_original_max_position_embeddings);
    }
}

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
                 {"add_qkv_bias", &m->add_qkv_bias}};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if ((v = cJSON_GetObjectItemCaseSensitive(mo, flags[i].key))) {
            if (!cJSON_IsBool(v)) return 0;
            *flags[i].dst = cJSON_IsTrue(v);
        }
    return 1;
}

static void add_state(cJSON *o, const tpd_config *cfg, const tpd_ckpt_state *state) {
    cJSON_AddNumberToObject(o, "iteration", state->iteration);
    cJSON_AddNumberToObject(o, "consumed_samples", (double)state->consumed_samples);
    cJSON_AddNumberToObject(o, "skipped_iterations", state->skipped_iterations);
    cJSON_AddBoolToObject(o, "weights_only", state->weights_only);
    /* The data order is a pure function of (seed, sample index): the seed and the
     * consumed samples restore it, and the init RNG is counter-based on the seed too. */
    cJSON *rng = cJSON_AddObjectToObject(o, "rng");
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)cfg->training.seed);
    cJSON_AddStringToObject(rng, "seed", seed);
    cJSON_AddNumberToObject(rng, "consumed_samples", (double)state->consumed_samples);
    cJSON_AddBoolToObject(rng, "shuffle", cfg->data.shuffle);
    const tpd_config_optimizer *op = &cfg->optimizer;
    cJSON *lr = cJSON_AddObjectToObject(o, "lr_schedule");
    cJSON_AddNumberToObject(lr, "iteration", state->iteration);
    cJSON_AddNumberToObject(lr, "next_lr", tpd_lr_at(cfg, state->iteration));
    cJSON_AddNumberToObject(lr, "lr", op->lr);
    cJSON_AddNumberToObject(lr, "min_lr", op->min_lr);
    cJSON_AddStringToObject(lr, "lr_decay_style",
                            tpd_config_choice("optimizer.lr_decay_style", op->lr_decay_style));
    cJSON_AddNumberToObject(lr, "lr_warmup_iters", op->lr_warmup_iters);
    cJSON_AddNumberToObject(lr, "lr_decay_iters", op->lr_decay_iters);
    cJSON_AddNumberToObject(lr, "train_iters", cfg->training.train_iters);
}

/* The tensor table of replica rr: per tensor, its runs of every kind in `kinds`. */
static tpd_status add_tensors(cJSON *ta, const tpd_config *cfg, const tpd_ckpt_rank *ranks,
                              const tpd_ckpt_rank_plan *plans, int world, int rr, int kinds) {
    tpd_model_layout g;
    TPD_CHECK(tpd_model_layout_init(cfg, 1, 0, 1, 0, &g));
    for (int p = 0; p < TPD_P_COUNT; p++) {
        cJSON *t = cJSON_CreateObject();
        char hf[128];
        tpd_ckpt_hf_name((tpd_param)p, 0, 1, hf, sizeof hf, NULL);
        cJSON_AddStringToObject(t, "name", tpd_param_get_info((tpd_param)p)->name);
        cJSON_AddStringToObject(t, "hf_name", hf);
        cJSON_AddItemToObject(t, "shape", shape_json(&g, (tpd_param)p));
        cJSON_AddStringToObject(t, "dtype", "F32");
        for (int k = 0; k < TPD_CKPT_KIND_COUNT; k++) {
            if (k != TPD_CKPT_PARAM && !(kinds & TPD_CKPT_KIND_BIT(k))) continue;
            cJSON *arr = cJSON_AddArrayToObject(t, g_kind_names[k]);
            for (int w = 0; w < world; w++) {
                const tpd_ckpt_rank *r = &ranks[w];
                char name[64];
                if (k == TPD_CKPT_PARAM) {
                    tpd_ckpt_model_file_r(r->tp, r->pp, rr, name, sizeof name);
                    add_runs(arr, &plans[w].param[p], name, r->tp, r->pp, r->dp, 0);
                } else {
                    tpd_ckpt_optim_file_r(r->tp, r->pp, r->dp, rr, name, sizeof name);
                    add_runs(arr, &plans[w].state[p], name, r->tp, r->pp, r->dp,
                             (int64_t)tpd_ckpt_kind_slot(kinds, k) * plans[w].state_numel * 4);
                }
            }
        }
        cJSON_AddItemToArray(ta, t);
    }
    return TPD_OK;
}

tpd_status tpd_ckpt_manifest_build(const tpd_config *cfg, int tp, int pp, int dp, int replicas,
                                   int kinds, const tpd_ckpt_state *state, int nfiles,
                                   const tpd_ckpt_file *files, char **json_p) {
    if (state->weights_only) kinds = 0;
    int has_master = !!(kinds & TPD_CKPT_KIND_BIT(TPD_CKPT_MASTER));
    tpd_status st = TPD_OK;
    int world = tp * pp * dp;
    tpd_ckpt_rank *ranks = calloc((size_t)world, sizeof *ranks);
    tpd_ckpt_rank_plan *plans = calloc((size_t)world, sizeof *plans);
    cJSON *o = cJSON_CreateObject();
    char *yaml = config_yaml(cfg);
    int nready = 0;
    if (!ranks || !plans || !o || !yaml)
        TPD_FAIL_GOTO(TPD_ERR_NOMEM, st, out, "checkpoint: out of memory");
    for (; nready < world; nready++) {
        int w = nready, t = w % tp, d = (w / tp) % dp, s = w / (tp * dp);
        TPD_CHECK_GOTO(tpd_ckpt_rank_init(cfg, tp, pp, dp, t, s, d, &ranks[w]), st, out);
        st = tpd_ckpt_rank_plan_init(&ranks[w], &plans[w]);
        if (st != TPD_OK) {
            tpd_ckpt_rank_free(&ranks[w]);
            goto out;
        }
    }
    cJSON_AddStringToObject(o, "format", TPD_CKPT_FORMAT);
    cJSON_AddNumberToObject(o, "version", TPD_CKPT_VERSION);
    add_state(o, cfg, state);
    cJSON *lay = cJSON_AddObjectToObject(o, "layout");
    cJSON_AddNumberToObject(lay, "tensor_model_parallel_size", tp);
    cJSON_AddNumberToObject(lay, "pipeline_model_parallel_size", pp);
    cJSON_AddNumberToObject(lay, "data_parallel_size", dp);
    cJSON_AddBoolToObject(lay, "use_distributed_optimizer", ranks[0].zero);
    cJSON_AddNumberToObject(lay, "ddp_bucket_size", (double)cfg->parallel.ddp_bucket_size);
    cJSON_AddStringToObject(o, "precision",
                            tpd_config_choice("training.precision", cfg->training.precision));
    cJSON_AddBoolToObject(o, "has_master", has_master);
    cJSON *ds = cJSON_AddObjectToObject(o, "dp_sync");
    int diloco = cfg->parallel.dp_sync == TPD_DP_SYNC_DILOCO;
    cJSON_AddStringToObject(ds, "mode", diloco ? "diloco" : "every_step");
    cJSON_AddNumberToObject(ds, "replicas", replicas);
    cJSON_AddNumberToObject(ds, "fragments", diloco ? cfg->diloco.fragments : 1);
    cJSON_AddNumberToObject(ds, "overlap_steps", diloco ? cfg->diloco.overlap_steps : 0);
    cJSON_AddNumberToObject(ds, "sync_interval", diloco ? cfg->diloco.sync_interval : 0);
    add_model(o, cfg);
    cJSON_AddStringToObject(o, "config_yaml", yaml);

    cJSON *fa = cJSON_AddArrayToObject(o, "files");
    for (int i = 0; i < nfiles; i++) {
        if (!files[i].name[0]) continue;
        cJSON *f = cJSON_CreateObject();
        cJSON_AddStringToObject(f, "name", files[i].name);
        int c[3] = {files[i].tp, files[i].pp, files[i].dp};
        cJSON_AddItemToObject(f, "rank", cJSON_CreateIntArray(c, 3));
        if (files[i].replica) cJSON_AddNumberToObject(f, "replica", files[i].replica);
        cJSON_AddNumberToObject(f, "bytes", (double)files[i].bytes);
        cJSON_AddStringToObject(f, "sha256", files[i].sha256);
        cJSON_AddItemToArray(fa, f);
    }
    cJSON *ta = cJSON_AddArrayToObject(o, "tensors");
    TPD_CHECK_GOTO(add_tensors(ta, cfg, ranks, plans, world, 0, kinds), st, out);
    /* replicas r > 0: their own parameters and inner state, not the outer state */
    int inner_kinds =
        kinds & ~(TPD_CKPT_KIND_BIT(TPD_CKPT_OUTER_SYNC) | TPD_CKPT_KIND_BIT(TPD_CKPT_OUTER_MOM));
    cJSON *ra = cJSON_AddArrayToObject(o, "replicas");
    for (int rr = 1; rr < replicas; rr++) {
        cJSON *rt = cJSON_CreateObject();
        cJSON_AddNumberToObject(rt, "replica", rr);
        cJSON_AddItemToArray(ra, rt);
        TPD_CHECK_GOTO(add_tensors(cJSON_AddArrayToObject(rt, "tensors"), cfg, ranks, plans, world,
                                   rr, inner_kinds),
                       st, out);
    }
    *json_p = cJSON_Print(o);
    if (!*json_p) st = tpd_fail(TPD_ERR_NOMEM, "checkpoint: out of memory");
out:
    for (int w = 0; w < nready; w++) {
        tpd_ckpt_rank_plan_free(&plans[w]);
        tpd_ckpt_rank_free(&ranks[w]);
    }
    free(plans);
    free(ranks);
    free(yaml);
    cJSON_Delete(o);
    return st;
}

/* ---- reading ---- */

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
                      "swiglu, untie_embeddings_and_output_weights or add_bias_linear)",
                      path);
    c->training.seed = info->seed;
    if (c->model.num_layers < 1 || c->model.hidden_size < 1 || c->model.num_attention_heads < 1 ||
        c->model.hidden_size % c->model.num_attention_heads || c->model.vocab_size < 1 ||
        c->model.max_position_embeddings < 1 || c->model.ffn_hidden_size < 1 ||
        c->model.seq_length < 1 || c->model.make_vocab_size_divisible_by < 1)
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
                      g_kind_names[b[at].key % TPD_CKPT_KIND_COUNT], (long long)b[at].a);
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
            const cJSON *arr = cJSON_GetObjectItemCaseSensitive(t, g_kind_names[k]);
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
                              path, name->valuestring, g_kind_names[k], (long long)total,
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
        {"untie_embeddings_and_output_weights", a->untie_embeddings_and_output_weights,
         b->untie_embeddings_and_output_weights},
        {"add_bias_linear", a->add_bias_linear, b->add_bias_linear},
        {"add_qkv_bias", tpd_config_qkv_bias(&info->cfg), tpd_config_qkv_bias(cfg)},
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
                        g_kind_names[k]);
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
                          info->dir, tname, g_kind_names[k]);
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
                      info->dir, tname, g_kind_names[k], (long long)(wanted - covered),
                      (long long)wanted);
out:
    free(b);
    return st;
}
