/* Writing a checkpoint's manifest (checkpoint_internal.h): the model block, the state,
 * the layout, the tensors' runs per file and the config it was trained with, as JSON.
 * Reading and checking it is checkpoint_manifest.c. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/checkpoint/checkpoint_internal.h"
#include "engine/optim/lr.h"

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
    if (m->kv_channels) cJSON_AddNumberToObject(j, "kv_channels", m->kv_channels);
    cJSON_AddBoolToObject(j, "untie_embeddings_and_output_weights",
                          m->untie_embeddings_and_output_weights);
    cJSON_AddBoolToObject(j, "add_bias_linear", m->add_bias_linear);
    cJSON_AddBoolToObject(j, "add_qkv_bias", m->add_qkv_bias);
    if (m->qk_layernorm) cJSON_AddBoolToObject(j, "qk_layernorm", 1);
    if (m->num_moe_experts > 0) { /* the mixture of experts: its tensors and routing */
        cJSON *e = cJSON_AddObjectToObject(j, "moe");
        cJSON_AddNumberToObject(e, "num_moe_experts", m->num_moe_experts);
        cJSON_AddNumberToObject(e, "moe_router_topk", m->moe_router_topk);
        cJSON_AddNumberToObject(e, "moe_layer_freq", m->moe_layer_freq);
        cJSON_AddNumberToObject(e, "moe_ffn_hidden_size", tpd_config_moe_ffn(cfg));
        cJSON_AddNumberToObject(e, "moe_shared_expert_intermediate_size",
                                m->moe_shared_expert_intermediate_size);
        cJSON_AddBoolToObject(e, "moe_shared_expert_gate", m->moe_shared_expert_gate);
        cJSON_AddBoolToObject(e, "moe_router_pre_softmax", m->moe_router_pre_softmax);
        cJSON_AddBoolToObject(e, "moe_norm_topk_prob", m->moe_norm_topk_prob);
        add_exact(e, "moe_aux_loss_coeff", m->moe_aux_loss_coeff);
        add_exact(e, "moe_z_loss_coeff", m->moe_z_loss_coeff);
        add_exact(e, "moe_expert_capacity_factor", m->moe_expert_capacity_factor);
    }
    if (m->rope_scaling) {
        cJSON *r = cJSON_AddObjectToObject(j, "rope_scaling");
        add_exact(r, "factor", m->rope_scaling_factor);
        add_exact(r, "low_freq_factor", m->rope_scaling_low_freq_factor);
        add_exact(r, "high_freq_factor", m->rope_scaling_high_freq_factor);
        cJSON_AddNumberToObject(r, "original_max_position_embeddings",
                                m->rope_scaling_original_max_position_embeddings);
    }
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
            cJSON *arr = cJSON_AddArrayToObject(t, tpd_ckpt_kind_names[k]);
            for (int w = 0; w < world; w++) {
                const tpd_ckpt_rank *r = &ranks[w];
                char name[64];
                if (k == TPD_CKPT_PARAM) {
                    tpd_ckpt_model_file_dp(r->tp, r->pp, r->dp, rr, name, sizeof name);
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
    /* informative: any strategy loads into any other (the files hold global segments) */
    cJSON_AddStringToObject(lay, "data_parallel_sharding_strategy",
                            tpd_config_choice("parallel.data_parallel_sharding_strategy",
                                              ranks[0].zero
                                                  ? cfg->parallel.data_parallel_sharding_strategy
                                                  : TPD_DP_SHARDING_NO_SHARD));
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
