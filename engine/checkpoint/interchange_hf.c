/* Hugging Face folders <-> global fp32 tensors: GPT2LMHeadModel, and the Llama block as
 * LlamaForCausalLM, MistralForCausalLM (without a sliding window), Qwen2ForCausalLM and
 * Qwen3ForCausalLM (Qwen3's QK norm: self_attn.q_norm and k_norm are our qnormw and knormw);
 * with a mixture of experts in every layer as MixtralForCausalLM, Qwen2MoeForCausalLM and
 * Qwen3MoeForCausalLM (Qwen2-MoE's router and experts without a shared expert, Qwen3's
 * attention).
 *
 * A Mixtral layer's router is block_sparse_moe.gate (E, h) and expert e's w1 (gate), w3
 * (up) and w2 (down) are rows of our stacked expfcw ([gate; up] per expert) and expprojw;
 * Mixtral's softmax over all experts, top-k and renormalized, is our softmax over the k
 * chosen logits. Qwen2-MoE's router is mlp.gate, its experts gate/up/down_proj, its shared
 * expert the dense MLP's tensors and shared_expert_gate our shgatew; its softmax over all
 * experts then top-k (renormalized under norm_topk_prob) is moe_router_pre_softmax.
 *
 * Every HF tensor is a row range of one of our per-layer tensors: q/k/v_proj are the
 * [Q; K; V] blocks of qkvw (and qkvb), gate/up_proj the [gate; up] blocks of fcw. HF's
 * Llama applies rotary embeddings in the rotate-half layout (its q/k weights are permuted
 * from Meta's interleaved pairs at conversion time), which is our kernels' layout, so the
 * rows are copied unpermuted. GPT-2's Conv1D weights are (in, out) and are transposed. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/progress.h"
#include "engine/checkpoint/checkpoint_internal.h"
#include "engine/checkpoint/interchange.h"
#include "engine/checkpoint/safetensors.h"

#define PATH_CAP (TPD_CONFIG_STR + 64)

typedef enum hf_family {
    HF_GPT2 = 0,
    HF_LLAMA,
    HF_MISTRAL,
    HF_QWEN2,
    HF_MIXTRAL,
    HF_QWEN2MOE,
    HF_QWEN3,
    HF_QWEN3MOE
} hf_family;

static const struct {
    const char *arch, *model_type;
} g_arch[] = {
    [HF_GPT2] = {"GPT2LMHeadModel", "gpt2"},
    [HF_LLAMA] = {"LlamaForCausalLM", "llama"},
    [HF_MISTRAL] = {"MistralForCausalLM", "mistral"},
    [HF_QWEN2] = {"Qwen2ForCausalLM", "qwen2"},
    [HF_MIXTRAL] = {"MixtralForCausalLM", "mixtral"},
    [HF_QWEN2MOE] = {"Qwen2MoeForCausalLM", "qwen2_moe"},
    [HF_QWEN3] = {"Qwen3ForCausalLM", "qwen3"},
    [HF_QWEN3MOE] = {"Qwen3MoeForCausalLM", "qwen3_moe"},
};

/* Qwen2's attention (q, k and v with biases, o_proj without): Qwen2 and Qwen2-MoE */
static int qwen_attention(hf_family f) {
    return f == HF_QWEN2 || f == HF_QWEN2MOE;
}

/* Qwen3's attention (no biases, q_norm and k_norm): Qwen3 and Qwen3-MoE */
static int qwen3_attention(hf_family f) {
    return f == HF_QWEN3 || f == HF_QWEN3MOE;
}

/* A mixture of experts in every layer */
static int moe_family(hf_family f) {
    return f == HF_MIXTRAL || f == HF_QWEN2MOE || f == HF_QWEN3MOE;
}

/* One HF tensor: rows [row0, row0 + rows) of layer `layer` of our tensor p. */
typedef struct hf_tensor {
    char name[128];
    tpd_param p;
    int layer, row0, rows, cols;
    int conv1d; /* stored (in, out): transposed both ways */
    int64_t shape[2];
    int ndim;
} hf_tensor;

/* (rows, cols) -> (cols, rows) */
static void transpose(float *dst, const float *src, int rows, int cols) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            dst[(size_t)c * rows + r] = src[(size_t)r * cols + c];
}

/* The family a model is written as; NULL when it is one, else what stops it. */
static const char *family_of(const tpd_config *cfg, hf_family *fam) {
    const tpd_config_model *m = &cfg->model;
    int gpt2_block = m->normalization == TPD_NORM_LAYERNORM &&
                     m->position_embedding_type == TPD_POS_LEARNED && !m->swiglu;
    int llama_block = m->normalization == TPD_NORM_RMSNORM &&
                      m->position_embedding_type == TPD_POS_ROPE && m->swiglu &&
                      m->rotary_percent == 1.0;
    if (gpt2_block) {
        *fam = HF_GPT2;
        return tpd_ckpt_gpt2_only(cfg);
    }
    if (!llama_block)
        return "a block that is neither GPT-2's (LayerNorm, learned positions, GELU) nor Llama's "
               "(RMSNorm, rotary positions, SwiGLU)";
    if (m->qk_layernorm) { /* Qwen3's attention: no biases */
        if (m->add_bias_linear || m->add_qkv_bias)
            return "the QK norm with linear biases, where Qwen3's attention has none";
        if (m->num_moe_experts == 0) {
            *fam = HF_QWEN3;
            return NULL;
        }
        if (m->moe_expert_capacity_factor > 0)
            return "an expert capacity (moe_expert_capacity_factor > 0: dropped tokens), where "
                   "Qwen3-MoE is dropless";
        if (!m->moe_shared_expert_intermediate_size && m->moe_router_pre_softmax) {
            *fam = HF_QWEN3MOE;
            return NULL;
        }
        return "the QK norm with a mixture of experts that is not Qwen3-MoE's (no shared "
               "experts, a softmax over all experts before the top-k)";
    }
    if (m->num_moe_experts > 0) {
        if (m->moe_expert_capacity_factor > 0)
            return "an expert capacity (moe_expert_capacity_factor > 0: dropped tokens), where "
                   "Mixtral and Qwen2-MoE are dropless";
        if (!m->add_bias_linear && !m->add_qkv_bias && !m->moe_shared_expert_intermediate_size &&
            !m->moe_router_pre_softmax) {
            *fam = HF_MIXTRAL;
            return m->moe_layer_freq > 1 ? "dense layers between the MoE layers (moe_layer_freq "
                                           "> 1), where Mixtral has experts in every layer"
                                         : NULL;
        }
        if (!m->add_bias_linear && m->add_qkv_bias && m->moe_shared_expert_intermediate_size > 0 &&
            m->moe_shared_expert_gate && m->moe_router_pre_softmax) {
            *fam = HF_QWEN2MOE;
            return NULL;
        }
        return "a mixture of experts that is neither Mixtral's (no biases, no shared experts, "
               "a softmax over the top-k logits) nor Qwen2-MoE's (QKV biases, gated shared "
               "experts, a softmax over all experts before the top-k)";
    }
    if (m->add_bias_linear) {
        *fam = HF_LLAMA; /* attention_bias and mlp_bias */
        return NULL;
    }
    *fam = m->add_qkv_bias ? HF_QWEN2 : HF_LLAMA;
    return NULL;
}

static void add(hf_tensor *out, int *n, const tpd_model_layout *g, tpd_param p, int layer, int row0,
                int rows, const char *fmt, ...) __attribute__((format(printf, 8, 9)));

static void add(hf_tensor *out, int *n, const tpd_model_layout *g, tpd_param p, int layer, int row0,
                int rows, const char *fmt, ...) {
    hf_tensor *t = &out[(*n)++];
    memset(t, 0, sizeof *t);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->p = p;
    t->layer = tpd_model_layout_stack_index(g, p, layer); /* its place in p's stack */
    t->row0 = row0;
    t->rows = rows;
    t->cols = g->p[p].g_cols;
    t->ndim = t->cols > 1 ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = t->cols;
}

/* GPT-2's file order: embeddings, then layer by layer, then ln_f. */
static int gpt2_order_cmp(const void *a, const void *b) {
    const hf_tensor *x = a, *y = b;
    int gx = tpd_param_get_info(x->p)->per_layer ? 1 : (x->p <= TPD_P_WPE ? 0 : 2);
    int gy = tpd_param_get_info(y->p)->per_layer ? 1 : (y->p <= TPD_P_WPE ? 0 : 2);
    if (gx != gy) return gx - gy;
    if (x->layer != y->layer) return x->layer - y->layer;
    return (int)x->p - (int)y->p;
}

/* A MoE layer's HF tensors: the router, each expert's gate, up and down, and Qwen2-MoE's
 * shared expert and its gate (Qwen3-MoE has none). Returns how many were added. */
static int moe_tensors(const tpd_model_layout *g, hf_family fam, int l, hf_tensor *out) {
    const tpd_model_dims *d = &g->d;
    int n = 0, E = d->E, Fe = d->Fe, Fs = d->Fs;
    const char *pre = fam == HF_MIXTRAL ? "block_sparse_moe" : "mlp";
    add(out, &n, g, TPD_P_ROUTERW, l, 0, E, "model.layers.%d.%s.gate.weight", l, pre);
    for (int e = 0; e < E; e++) {
        const char *gn = fam == HF_MIXTRAL ? "w1" : "gate_proj";
        const char *un = fam == HF_MIXTRAL ? "w3" : "up_proj";
        const char *dn = fam == HF_MIXTRAL ? "w2" : "down_proj";
        add(out, &n, g, TPD_P_EXPFCW, l, e * 2 * Fe, Fe, "model.layers.%d.%s.experts.%d.%s.weight",
            l, pre, e, gn);
        add(out, &n, g, TPD_P_EXPPROJW, l, e * d->C, d->C,
            "model.layers.%d.%s.experts.%d.%s.weight", l, pre, e, dn);
        add(out, &n, g, TPD_P_EXPFCW, l, e * 2 * Fe + Fe, Fe,
            "model.layers.%d.%s.experts.%d.%s.weight", l, pre, e, un);
    }
    if (fam == HF_QWEN2MOE) {
        add(out, &n, g, TPD_P_SHFCW, l, 0, Fs, "model.layers.%d.mlp.shared_expert.gate_proj.weight",
            l);
        add(out, &n, g, TPD_P_SHFCW, l, Fs, Fs, "model.layers.%d.mlp.shared_expert.up_proj.weight",
            l);
        add(out, &n, g, TPD_P_SHPROJW, l, 0, d->C,
            "model.layers.%d.mlp.shared_expert.down_proj.weight", l);
        add(out, &n, g, TPD_P_SHGATEW, l, 0, 1, "model.layers.%d.mlp.shared_expert_gate.weight", l);
    }
    return n;
}

/* The HF tensors of a model, in HF's file order: embeddings, layer by layer, final norm,
 * output layer. out holds hf_capacity() entries. */
static int hf_tensors(const tpd_model_layout *g, hf_family fam, hf_tensor *out) {
    int n = 0;
    const tpd_model_dims *d = &g->d;
    if (fam == HF_GPT2) {
        for (int p = 0; p < TPD_P_COUNT; p++) {
            const tpd_param_slice *s = &g->p[p];
            if (tpd_model_layout_global_numel(g, (tpd_param)p) == 0) continue;
            int layers = tpd_param_get_info((tpd_param)p)->per_layer ? s->g_layers : 1;
            for (int l = 0; l < layers; l++) {
                add(out, &n, g, (tpd_param)p, l, 0, s->g_rows, "%s", "");
                hf_tensor *t = &out[n - 1];
                tpd_ckpt_hf_name((tpd_param)p, l, 0, t->name, sizeof t->name, &t->conv1d);
                if (t->conv1d) {
                    t->shape[0] = s->g_cols;
                    t->shape[1] = s->g_rows;
                }
            }
        }
        /* embeddings, then layer by layer, then ln_f (each (tensor, layer) is unique) */
        qsort(out, (size_t)n, sizeof *out, gpt2_order_cmp);
        return n;
    }
    int q = d->NH * d->HS, kv = d->NKV * d->HS, F = d->F;
    add(out, &n, g, TPD_P_WTE, 0, 0, d->V, "model.embed_tokens.weight");
    for (int l = 0; l < d->L; l++) {
        const char *proj[3] = {"q_proj", "k_proj", "v_proj"};
        int r0[3] = {0, q, q + kv}, rn[3] = {q, kv, kv};
        add(out, &n, g, TPD_P_LN1W, l, 0, d->C, "model.layers.%d.input_layernorm.weight", l);
        for (int i = 0; i < 3; i++)
            add(out, &n, g, TPD_P_QKVW, l, r0[i], rn[i], "model.layers.%d.self_attn.%s.weight", l,
                proj[i]);
        if (g->p[TPD_P_QKVB].g_layers)
            for (int i = 0; i < 3; i++)
                add(out, &n, g, TPD_P_QKVB, l, r0[i], rn[i], "model.layers.%d.self_attn.%s.bias", l,
                    proj[i]);
        add(out, &n, g, TPD_P_ATTPROJW, l, 0, d->C, "model.layers.%d.self_attn.o_proj.weight", l);
        if (g->p[TPD_P_ATTPROJB].g_layers)
            add(out, &n, g, TPD_P_ATTPROJB, l, 0, d->C, "model.layers.%d.self_attn.o_proj.bias", l);
        if (g->p[TPD_P_QNORMW].g_layers) {
            add(out, &n, g, TPD_P_QNORMW, l, 0, d->HS, "model.layers.%d.self_attn.q_norm.weight",
                l);
            add(out, &n, g, TPD_P_KNORMW, l, 0, d->HS, "model.layers.%d.self_attn.k_norm.weight",
                l);
        }
        add(out, &n, g, TPD_P_LN2W, l, 0, d->C, "model.layers.%d.post_attention_layernorm.weight",
            l);
        if (moe_family(fam) && tpd_model_dims_layer_moe(d, l)) { /* the others are dense */
            n += moe_tensors(g, fam, l, out + n);
            continue;
        }
        add(out, &n, g, TPD_P_FCW, l, 0, F, "model.layers.%d.mlp.gate_proj.weight", l);
        add(out, &n, g, TPD_P_FCW, l, F, F, "model.layers.%d.mlp.up_proj.weight", l);
        if (g->p[TPD_P_FCB].g_layers) {
            add(out, &n, g, TPD_P_FCB, l, 0, F, "model.layers.%d.mlp.gate_proj.bias", l);
            add(out, &n, g, TPD_P_FCB, l, F, F, "model.layers.%d.mlp.up_proj.bias", l);
        }
        add(out, &n, g, TPD_P_FCPROJW, l, 0, d->C, "model.layers.%d.mlp.down_proj.weight", l);
        if (g->p[TPD_P_FCPROJB].g_layers)
            add(out, &n, g, TPD_P_FCPROJB, l, 0, d->C, "model.layers.%d.mlp.down_proj.bias", l);
    }
    add(out, &n, g, TPD_P_LNFW, 0, 0, d->C, "model.norm.weight");
    if (g->p[TPD_P_LMHEAD].g_layers) add(out, &n, g, TPD_P_LMHEAD, 0, 0, d->V, "lm_head.weight");
    return n;
}

static float *hf_data(const tpd_model_layout *g, float *const global[TPD_P_COUNT],
                      const hf_tensor *t) {
    const tpd_param_slice *s = &g->p[t->p];
    return global[t->p] + ((size_t)t->layer * s->g_rows + (size_t)t->row0) * s->g_cols;
}

static int hf_capacity(const tpd_model_layout *g) {
    return 16 + (16 + 3 * g->d.E) * g->d.L;
}

/* ---- config.json ---- */

/* Qwen2-MoE's and Qwen3-MoE's mlp_only_layers: the dense layers (moe_layer_freq > 1), whose
 * MLP is intermediate_size wide. */
static cJSON *dense_layers_json(const tpd_config *cfg) {
    cJSON *a = cJSON_CreateArray();
    for (int g = 0; g < cfg->model.num_layers; g++)
        if (!tpd_config_layer_moe(cfg, g)) cJSON_AddItemToArray(a, cJSON_CreateNumber(g));
    return a;
}

static cJSON *config_json(const tpd_config *cfg, hf_family fam, const char *dtype) {
    const tpd_config_model *m = &cfg->model;
    int maxT = m->max_position_embeddings, F = m->ffn_hidden_size;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "architectures", cJSON_CreateStringArray(&g_arch[fam].arch, 1));
    cJSON_AddStringToObject(o, "model_type", g_arch[fam].model_type);
    cJSON_AddNumberToObject(o, "vocab_size", m->vocab_size);
    cJSON_AddNumberToObject(o, "initializer_range", m->init_method_std);
    cJSON_AddStringToObject(o, "torch_dtype", dtype); /* transformers 4's key */
    cJSON_AddStringToObject(o, "dtype", dtype);       /* and 5's */
    if (fam == HF_GPT2) {
        cJSON_AddNumberToObject(o, "n_positions", maxT);
        cJSON_AddNumberToObject(o, "n_ctx", maxT);
        cJSON_AddNumberToObject(o, "n_embd", m->hidden_size);
        cJSON_AddNumberToObject(o, "n_layer", m->num_layers);
        cJSON_AddNumberToObject(o, "n_head", m->num_attention_heads);
        cJSON_AddNumberToObject(o, "n_inner", F);
        cJSON_AddStringToObject(o, "activation_function", "gelu_new");
        cJSON_AddNumberToObject(o, "layer_norm_epsilon", m->norm_epsilon);
        cJSON_AddNumberToObject(o, "resid_pdrop", 0.0);
        cJSON_AddNumberToObject(o, "embd_pdrop", 0.0);
        cJSON_AddNumberToObject(o, "attn_pdrop", 0.0);
        /* the last token is the end-of-document token of the byte-level vocabulary */
        cJSON_AddNumberToObject(o, "bos_token_id", m->vocab_size - 1);
        cJSON_AddNumberToObject(o, "eos_token_id", m->vocab_size - 1);
        cJSON_AddBoolToObject(o, "tie_word_embeddings", 1);
        return o;
    }
    cJSON_AddNumberToObject(o, "hidden_size", m->hidden_size);
    /* Mixtral's intermediate_size is its experts' width */
    cJSON_AddNumberToObject(o, "intermediate_size",
                            fam == HF_MIXTRAL ? tpd_config_moe_ffn(cfg) : F);
    cJSON_AddNumberToObject(o, "num_hidden_layers", m->num_layers);
    cJSON_AddNumberToObject(o, "num_attention_heads", m->num_attention_heads);
    cJSON_AddNumberToObject(o, "num_key_value_heads", tpd_config_kv_heads(cfg));
    cJSON_AddNumberToObject(o, "head_dim", tpd_config_head_dim(cfg));
    cJSON_AddNumberToObject(o, "max_position_embeddings", maxT);
    cJSON_AddStringToObject(o, "hidden_act", "silu");
    cJSON_AddNumberToObject(o, "rms_norm_eps", m->norm_epsilon);
    /* both spellings: transformers 4 reads rope_theta and rope_scaling, 5 rope_parameters */
    cJSON_AddNumberToObject(o, "rope_theta", m->rotary_base);
    cJSON *rp = cJSON_AddObjectToObject(o, "rope_parameters");
    cJSON_AddNumberToObject(rp, "rope_theta", m->rotary_base);
    if (!m->rope_scaling) {
        cJSON_AddNullToObject(o, "rope_scaling");
        cJSON_AddStringToObject(rp, "rope_type", "default");
    } else {
        cJSON *rs = cJSON_AddObjectToObject(o, "rope_scaling");
        for (cJSON *t = rs; t; t = t == rs ? rp : NULL) {
            cJSON_AddStringToObject(t, "rope_type", "llama3");
            cJSON_AddNumberToObject(t, "factor", m->rope_scaling_factor);
            cJSON_AddNumberToObject(t, "low_freq_factor", m->rope_scaling_low_freq_factor);
            cJSON_AddNumberToObject(t, "high_freq_factor", m->rope_scaling_high_freq_factor);
            cJSON_AddNumberToObject(t, "original_max_position_embeddings",
                                    m->rope_scaling_original_max_position_embeddings);
        }
    }
    cJSON_AddBoolToObject(o, "tie_word_embeddings", !m->untie_embeddings_and_output_weights);
    cJSON_AddNumberToObject(o, "attention_dropout", 0.0);
    if (fam == HF_MIXTRAL) {
        cJSON_AddNumberToObject(o, "num_local_experts", m->num_moe_experts);
        cJSON_AddNumberToObject(o, "num_experts_per_tok", m->moe_router_topk);
        cJSON_AddNumberToObject(o, "router_aux_loss_coef", m->moe_aux_loss_coeff);
        cJSON_AddBoolToObject(o, "output_router_logits", 0);
        cJSON_AddNullToObject(o, "sliding_window");
    } else if (fam == HF_QWEN2MOE) {
        cJSON_AddBoolToObject(o, "use_sliding_window", 0);
        cJSON_AddNumberToObject(o, "num_experts", m->num_moe_experts);
        cJSON_AddNumberToObject(o, "num_experts_per_tok", m->moe_router_topk);
        cJSON_AddNumberToObject(o, "moe_intermediate_size", tpd_config_moe_ffn(cfg));
        cJSON_AddNumberToObject(o, "shared_expert_intermediate_size",
                                m->moe_shared_expert_intermediate_size);
        cJSON_AddBoolToObject(o, "norm_topk_prob", m->moe_norm_topk_prob);
        cJSON_AddBoolToObject(o, "qkv_bias", 1);
        cJSON_AddNumberToObject(o, "decoder_sparse_step", 1);
        cJSON_AddItemToObject(o, "mlp_only_layers", dense_layers_json(cfg));
        cJSON_AddNumberToObject(o, "router_aux_loss_coef", m->moe_aux_loss_coeff);
        cJSON_AddBoolToObject(o, "output_router_logits", 0);
    } else if (fam == HF_QWEN3MOE) {
        cJSON_AddBoolToObject(o, "use_sliding_window", 0);
        cJSON_AddBoolToObject(o, "attention_bias", 0);
        cJSON_AddNumberToObject(o, "num_experts", m->num_moe_experts);       /* transformers 4 */
        cJSON_AddNumberToObject(o, "num_local_experts", m->num_moe_experts); /* and 5 */
        cJSON_AddNumberToObject(o, "num_experts_per_tok", m->moe_router_topk);
        cJSON_AddNumberToObject(o, "moe_intermediate_size", tpd_config_moe_ffn(cfg));
        cJSON_AddBoolToObject(o, "norm_topk_prob", m->moe_norm_topk_prob);
        cJSON_AddNumberToObject(o, "decoder_sparse_step", 1);
        cJSON_AddItemToObject(o, "mlp_only_layers", dense_layers_json(cfg));
        cJSON_AddNumberToObject(o, "router_aux_loss_coef", m->moe_aux_loss_coeff);
        cJSON_AddBoolToObject(o, "output_router_logits", 0);
    } else if (fam == HF_QWEN2) {
        cJSON_AddBoolToObject(o, "use_sliding_window", 0);
    } else if (fam == HF_QWEN3) {
        cJSON_AddBoolToObject(o, "use_sliding_window", 0);
        cJSON_AddBoolToObject(o, "attention_bias", 0);
    } else {
        cJSON_AddBoolToObject(o, "attention_bias", m->add_bias_linear);
        cJSON_AddBoolToObject(o, "mlp_bias", m->add_bias_linear);
    }
    return o;
}

/* A positive integer key within [1, max]; 0 when absent (the caller decides), -1 when
 * present but wrong. */
static int json_count(const cJSON *o, const char *key, int max, int *v) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!j || cJSON_IsNull(j)) return 0;
    if (!cJSON_IsNumber(j) || j->valuedouble < 1 || j->valuedouble > max ||
        j->valuedouble != floor(j->valuedouble))
        return -1;
    *v = (int)j->valuedouble;
    return 1;
}

static int json_bool(const cJSON *o, const char *key, int dflt) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsBool(j) ? cJSON_IsTrue(j) : dflt;
}

#define HF_MAX_WIDTH (1 << 20)
#define HF_MAX_LAYERS 4096
#define HF_MAX_VOCAB (1 << 24)
#define HF_MAX_POSITIONS (1 << 24)

static tpd_status read_family(const cJSON *hc, const char *path, hf_family *fam) {
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(hc, "architectures");
    const cJSON *arch = cJSON_IsArray(archs) ? cJSON_GetArrayItem(archs, 0) : NULL;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(hc, "model_type");
    const char *a = cJSON_IsString(arch) ? arch->valuestring : NULL;
    const char *t = cJSON_IsString(mt) ? mt->valuestring : NULL;
    for (int f = 0; f < (int)(sizeof g_arch / sizeof g_arch[0]); f++)
        if ((a && !strcmp(a, g_arch[f].arch)) || (!a && t && !strcmp(t, g_arch[f].model_type))) {
            *fam = (hf_family)f;
            return TPD_OK;
        }
    return tpd_fail(TPD_ERR_UNSUPPORTED,
                    "interchange %s: architecture '%s' is not supported; tripod reads "
                    "GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM (no sliding "
                    "window), Qwen2ForCausalLM, Qwen3ForCausalLM, MixtralForCausalLM, "
                    "Qwen2MoeForCausalLM and Qwen3MoeForCausalLM",
                    path,
                    a   ? a
                    : t ? t
                        : "(none: no \"architectures\" or \"model_type\")");
}

/* An optional number key in (0, 1): *v keeps its default when the key is absent or null. */
static tpd_status json_fraction(const cJSON *o, const char *path, const char *key, double *v) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!j || cJSON_IsNull(j)) return TPD_OK;
    if (!cJSON_IsNumber(j) || !(j->valuedouble > 0 && j->valuedouble < 1))
        return tpd_fail(TPD_ERR_FORMAT, "interchange %s: key '%s' must be a number in (0, 1)%s",
                        path, key, cJSON_IsNumber(j) ? "" : " (it is not a number)");
    *v = j->valuedouble;
    return TPD_OK;
}

static tpd_status read_gpt2(const cJSON *hc, const char *path, tpd_config_model *m) {
    const char *need[] = {"n_head", "n_layer", "n_embd", "vocab_size", "n_positions"};
    int *dst[] = {&m->num_attention_heads, &m->num_layers, &m->hidden_size, &m->vocab_size,
                  &m->max_position_embeddings};
    int max[] = {HF_MAX_WIDTH, HF_MAX_LAYERS, HF_MAX_WIDTH, HF_MAX_VOCAB, HF_MAX_POSITIONS};
    for (int i = 0; i < 5; i++)
        if (json_count(hc, need[i], max[i], dst[i]) != 1)
            return tpd_fail(TPD_ERR_FORMAT,
                            "interchange %s: key '%s' must be an integer in [1, %d]", path, need[i],
                            max[i]);
    int inner = json_count(hc, "n_inner", 4 * HF_MAX_WIDTH, &m->ffn_hidden_size);
    if (inner < 0)
        return tpd_fail(TPD_ERR_FORMAT,
                        "interchange %s: key 'n_inner' must be null (4 * n_embd) or an integer "
                        "in [1, %d]",
                        path, 4 * HF_MAX_WIDTH);
    if (inner == 0) m->ffn_hidden_size = 4 * m->hidden_size; /* HF writes null for 4*n_embd */
    m->norm_epsilon = 1e-5;                                  /* transformers' default */
    TPD_CHECK(json_fraction(hc, path, "layer_norm_epsilon", &m->norm_epsilon));
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(hc, "activation_function");
    if (cJSON_IsString(act) && strcmp(act->valuestring, "gelu_new") &&
        strcmp(act->valuestring, "gelu_pytorch_tanh"))
        return tpd_fail(TPD_ERR_UNSUPPORTED,
                        "interchange %s: activation_function '%s'; tripod's GPT-2 uses the "
                        "tanh GELU (gelu_new)",
                        path, act->valuestring);
    return TPD_OK;
}

/* Llama 3.1's "llama3" rope scaling is read into the model; any other type (YaRN, linear,
 * dynamic, longrope) is refused by key. */
static tpd_status read_rope_scaling(const cJSON *s, const char *kind, const char *path,
                                    const char *key, tpd_config_model *m) {
    if (!strcmp(kind, "default")) return TPD_OK;
    if (strcmp(kind, "llama3") != 0)
        return tpd_fail(TPD_ERR_UNSUPPORTED,
                        "interchange %s: %s has rope_type \"%s\"; tripod reads \"default\" "
                        "and Llama 3.1's \"llama3\" (YaRN, linear and dynamic scaling would "
                        "compute something else)",
                        path, key, kind);
    const char *names[] = {"factor", "low_freq_factor", "high_freq_factor",
                           "original_max_position_embeddings"};
    double v[4];
    for (int i = 0; i < 4; i++) {
        const cJSON *j = cJSON_GetObjectItemCaseSensitive(s, names[i]);
        if (!cJSON_IsNumber(j) || !(j->valuedouble > 0) || j->valuedouble > 1e9)
            return tpd_fail(TPD_ERR_FORMAT,
                            "interchange %s: %s.%s must be a positive number (llama3 "
                            "scaling)",
                            path, key, names[i]);
        v[i] = j->valuedouble;
    }
    if (!(v[0] >= 1) || !(v[2] > v[1]) || v[3] != floor(v[3]))
        return tpd_fail(TPD_ERR_FORMAT,
                        "interchange %s: %s needs factor >= 1, high_freq_factor > "
                        "low_freq_factor and an integer original_max_position_embeddings",
                        path, key);
    m->rope_scaling = 1;
    m->rope_scaling_factor = v[0];
    m->rope_scaling_low_freq_factor = v[1];
    m->rope_scaling_high_freq_factor = v[2];
    m->rope_scaling_original_max_position_embeddings = (int)v[3];
    return TPD_OK;
}

/* A required integer key within [1, max]. */
static tpd_status need_count(const cJSON *hc, const char *path, const char *key, int max, int *v) {
    if (json_count(hc, key, max, v) != 1)
        return tpd_fail(TPD_ERR_FORMAT, "interchange %s: key '%s' must be an integer in [1, %d]",
                        path, key, max);
    return TPD_OK;
}

/* Mixtral's, Qwen2-MoE's and Qwen3-MoE's experts, dropless: every layer a MoE layer
 * (Mixtral), or every Nth (the Qwen MoE's decoder_sparse_step and mlp_only_layers, where they
 * make that pattern; the dense layers' MLP is intermediate_size wide). */
static tpd_status read_moe(const cJSON *hc, const char *path, hf_family fam, tpd_config_model *m) {
    int E = 0, k = 0;
    /* Qwen3-MoE: the Hub's configs say num_experts, transformers 5 writes num_local_experts */
    const char *ek = fam == HF_MIXTRAL ? "num_local_experts" : "num_experts";
    if (fam == HF_QWEN3MOE && !cJSON_GetObjectItemCaseSensitive(hc, ek)) ek = "num_local_experts";
    TPD_CHECK(need_count(hc, path, ek, 4096, &E));
    TPD_CHECK(need_count(hc, path, "num_experts_per_tok", 64, &k));
    if (E < 2 || k > E)
        return tpd_fail(TPD_ERR_FORMAT,
                        "interchange %s: %d experts with num_experts_per_tok %d: a mixture "
                        "needs at least 2 experts and no more than them per token",
                        path, E, k);
    m->num_moe_experts = E;
    m->moe_router_topk = k;
    const cJSON *coef = cJSON_GetObjectItemCaseSensitive(hc, "router_aux_loss_coef");
    if (cJSON_IsNumber(coef) && coef->valuedouble >= 0) m->moe_aux_loss_coeff = coef->valuedouble;
    if (fam == HF_MIXTRAL) { /* softmax, top-k, renormalized: a softmax over the k logits */
        m->moe_ffn_hidden_size = m->ffn_hidden_size;
        m->moe_router_pre_softmax = 0;
        return TPD_OK;
    }
    int fe = 0, fs = 0, step = 1;
    TPD_CHECK(need_count(hc, path, "moe_intermediate_size", 4 * HF_MAX_WIDTH, &fe));
    if (fam == HF_QWEN2MOE)
        TPD_CHECK(need_count(hc, path, "shared_expert_intermediate_size", 4 * HF_MAX_WIDTH, &fs));
    if (json_count(hc, "decoder_sparse_step", HF_MAX_LAYERS, &step) < 0)
        return tpd_fail(TPD_ERR_FORMAT,
                        "interchange %s: key 'decoder_sparse_step' must be an integer in [1, %d]",
                        path, HF_MAX_LAYERS);
    const cJSON *only = cJSON_GetObjectItemCaseSensitive(hc, "mlp_only_layers");
    if (only && !cJSON_IsNull(only) && !cJSON_IsArray(only))
        return tpd_fail(TPD_ERR_FORMAT, "interchange %s: key 'mlp_only_layers' must be a list",
                        path);
    /* HF's MoE layers: i not in mlp_only_layers with (i + 1) % decoder_sparse_step == 0.
     * tripod's are i % moe_layer_freq == 0: the pattern must be one of those. */
    int L = m->num_layers, freq = L, seen = 0;
    char *moe = calloc((size_t)L, 1);
    if (!moe) return tpd_fail_nomem("the MoE layers", (size_t)L);
    for (int i = 0; i < L; i++)
        moe[i] = (i + 1) % step == 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, only) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble >= L) {
            free(moe);
            return tpd_fail(TPD_ERR_FORMAT,
                            "interchange %s: key 'mlp_only_layers' holds a value that is not a "
                            "layer index in [0, %d)",
                            path, L);
        }
        moe[(int)it->valuedouble] = 0;
    }
    for (int i = 1; i < L && freq == L; i++)
        if (moe[i]) freq = i;
    for (int i = 0; i < L; i++)
        seen += moe[i] != (i % freq == 0);
    free(moe);
    if (seen)
        return tpd_fail(TPD_ERR_UNSUPPORTED,
                        "interchange %s: decoder_sparse_step %d and mlp_only_layers make MoE "
                        "layers that are not every Nth from layer 0 (tripod's "
                        "model.moe_layer_freq: layer i when i %% N == 0)",
                        path, step);
    m->moe_layer_freq = freq;
    if (fam == HF_QWEN2MOE && !json_bool(hc, "qkv_bias", 1))
        return tpd_fail(TPD_ERR_UNSUPPORTED,
                        "interchange %s: qkv_bias false; tripod's Qwen2-MoE attention has the "
                        "q, k and v biases of Qwen2",
                        path);
    m->moe_ffn_hidden_size = fe;
    m->moe_shared_expert_intermediate_size = fs;
    m->moe_shared_expert_gate = fam == HF_QWEN2MOE;
    m->moe_router_pre_softmax = 1;
    m->moe_norm_topk_prob = json_bool(hc, "norm_topk_prob", 0);
    return TPD_OK;
}

/* The Llama block's keys; anything that changes the function and is not modelled is
 * refused by name rather than dropped. */
static tpd_status read_llama(const cJSON *hc, const char *path, hf_family fam,
                             tpd_config_model *m) {
    const char *need[] = {"hidden_size",         "intermediate_size", "num_hidden_layers",
                          "num_attention_heads", "vocab_size",        "max_position_embeddings"};
    int *dst[] = {&m->hidden_size,         &m->ffn_hidden_size, &m->num_layers,
                  &m->num_attention_heads, &m->vocab_size,      &m->max_position_embeddings};
    int max[] = {HF_MAX_WIDTH, 4 * HF_MAX_WIDTH, HF_MAX_LAYERS,
                 HF_MAX_WIDTH, HF_MAX_VOCAB,     HF_MAX_POSITIONS};
    for (int i = 0; i < 6; i++)
        if (json_count(hc, need[i], max[i], dst[i]) != 1)
            return tpd_fail(TPD_ERR_FORMAT,
                            "interchange %s: key '%s' must be an integer in [1, %d]", path, need[i],
                            max[i]);
    int NH = m->num_attention_heads, NKV = NH, hd = 0;
    if (json_count(hc, "num_key_value_heads", HF_MAX_WIDTH, &NKV) < 0 || NH % NKV)
        return tpd_fail(TPD_ERR_FORMAT,
                        "interchange %s: num_key_value_heads must divide "
                        "num_attention_heads (%d)",
                        path, NH);
    if (json_count(hc, "head_dim", 65536, &hd) < 0)
        return tpd_fail(TPD_ERR_FORMAT,
                        "interchange %s: key 'head_dim' must be null or an "
                        "integer in [1, 65536]",
                        path);
    if (!hd && m->hidden_size % NH)
        return tpd_fail(TPD_ERR_FORMAT,
                        "interchange %s: hidden_size %d is not a multiple of "
                        "num_attention_heads %d (and no head_dim is given)",
                        path, m->hidden_size, NH);
    /* a head size other than hidden_size / heads (Qwen3's 128) is kv_channels */
    m->kv_channels = hd && hd * NH != m->hidden_size ? hd : 0;
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(hc, "hidden_act");
    if (act && (!cJSON_IsString(act) || strcmp(act->valuestring, "silu")))
        return tpd_fail(TPD_ERR_UNSUPPORTED, "interchange %s: hidden_act must be \"silu\" (SwiGLU)",
                        path);
    /* transformers 4 writes rope_theta and rope_scaling; 5 writes rope_parameters
     * {"rope_theta", "rope_type"} */
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(hc, "rope_scaling");
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(hc, "rope_parameters");
    const cJSON *theta = cJSON_GetObjectItemCaseSensitive(hc, "rope_theta");
    if (!theta) theta = cJSON_GetObjectItemCaseSensitive(rp, "rope_theta");
    /* the scaling's parameters: rope_scaling (4), or rope_parameters itself (5) */
    const cJSON *scal = rs && !cJSON_IsNull(rs) ? rs : rp;
    const cJSON *stype = cJSON_GetObjectItemCaseSensitive(scal, "rope_type");
    if (!stype) stype = cJSON_GetObjectItemCaseSensitive(scal, "type");
    const char *kind = cJSON_IsString(stype) ? stype->valuestring : scal == rs ? "?" : "default";
    TPD_CHECK(
        read_rope_scaling(scal, kind, path, scal == rs ? "rope_scaling" : "rope_parameters", m));
    const cJSON *prf = cJSON_GetObjectItemCaseSensitive(hc, "partial_rotary_factor");
    if (prf && !(cJSON_IsNumber(prf) && prf->valuedouble == 1.0))
        return tpd_fail(TPD_ERR_UNSUPPORTED, "interchange %s: partial_rotary_factor must be 1.0",
                        path);
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(hc, "sliding_window");
    int qwen = qwen_attention(fam) || qwen3_attention(fam); /* use_sliding_window */
    int windowed = qwen
                       ? json_bool(hc, "use_sliding_window", 0)
                       : sw && !cJSON_IsNull(sw) &&
                             !(cJSON_IsNumber(sw) && sw->valuedouble >= m->max_position_embeddings);
    const cJSON *types = cJSON_GetObjectItemCaseSensitive(hc, "layer_types");
    for (const cJSON *t = cJSON_IsArray(types) ? types->child : NULL; t; t = t->next)
        windowed |= !cJSON_IsString(t) || strcmp(t->valuestring, "full_attention") != 0;
    if (windowed)
        return tpd_fail(
            TPD_ERR_UNSUPPORTED,
            "interchange %s: sliding-window attention (%s) is not supported; "
            "tripod's attention is full causal",
            path, qwen ? "use_sliding_window or layer_types" : "sliding_window or layer_types");
    m->norm_epsilon = 1e-6; /* transformers' default */
    TPD_CHECK(json_fraction(hc, path, "rms_norm_eps", &m->norm_epsilon));
    if (theta && !(cJSON_IsNumber(theta) && theta->valuedouble > 1 && theta->valuedouble < 1e30))
        return tpd_fail(TPD_ERR_FORMAT, "interchange %s: key 'rope_theta' must be a number > 1",
                        path);
    int attn_bias = json_bool(hc, "attention_bias", 0), mlp_bias = json_bool(hc, "mlp_bias", 0);
    if (qwen3_attention(fam) && attn_bias)
        return tpd_fail(TPD_ERR_UNSUPPORTED,
                        "interchange %s: attention_bias true; tripod's Qwen3 attention has no "
                        "biases (biases on q, k, v and o without the MLP's are not modelled)",
                        path);
    if (!qwen_attention(fam) && attn_bias != mlp_bias)
        return tpd_fail(TPD_ERR_UNSUPPORTED,
                        "interchange %s: attention_bias %s with mlp_bias %s; tripod has "
                        "biases on all four linears (add_bias_linear) or on QKV alone "
                        "(add_qkv_bias)",
                        path, attn_bias ? "true" : "false", mlp_bias ? "true" : "false");
    m->normalization = TPD_NORM_RMSNORM;
    m->position_embedding_type = TPD_POS_ROPE;
    m->rotary_base = theta ? theta->valuedouble : 10000.0;
    m->rotary_percent = 1.0;
    m->swiglu = 1;
    m->group_query_attention = NKV != NH;
    m->num_query_groups = NKV;
    m->untie_embeddings_and_output_weights = !json_bool(hc, "tie_word_embeddings", 0);
    m->add_bias_linear = !qwen_attention(fam) && attn_bias;
    m->add_qkv_bias = qwen_attention(fam);  /* Qwen2: q, k and v have biases, o_proj none */
    m->qk_layernorm = qwen3_attention(fam); /* Qwen3: q_norm and k_norm on every head */
    if (moe_family(fam)) return read_moe(hc, path, fam, m);
    return TPD_OK;
}

/* ---- export ---- */

/* A folder is written beside its destination and renamed into place, so a failed export
 * never leaves a folder that looks complete. */
tpd_status tpd_ckpt_export_hf(const tpd_config *cfg, float *const global[TPD_P_COUNT],
                              const char *out_dir, const tpd_hf_export *opts) {
    tpd_hf_export o = opts ? *opts : (tpd_hf_export)TPD_HF_EXPORT_INIT;
    hf_family fam = HF_GPT2;
    const char *why = family_of(cfg, &fam);
    if (why)
        return tpd_fail(TPD_ERR_UNSUPPORTED,
                        "interchange %s: this model has %s, which no Hugging Face "
                        "architecture that tripod writes expresses",
                        out_dir, why);
    tpd_model_layout g;
    TPD_CHECK(tpd_model_layout_init(cfg, 1, 0, 1, 0, &g));
    char tmp[PATH_CAP + 32], path[PATH_CAP + 64];
    snprintf(tmp, sizeof tmp, "%s.tmp-%d", out_dir, (int)getpid());
    TPD_CHECK(tpd_ckpt_mkdirs(tmp));
    hf_tensor *ts = calloc((size_t)hf_capacity(&g), sizeof *ts);
    tpd_st_out *outs = calloc((size_t)hf_capacity(&g), sizeof *outs);
    float *conv = NULL;
    char *text = NULL;
    tpd_status st = TPD_OK;
    int n = ts && outs ? hf_tensors(&g, fam, ts) : -1, shards = 0;
    if (n < 0) TPD_FAIL_GOTO(TPD_ERR_NOMEM, st, out, "interchange: out of memory");
    /* GPT-2's Conv1D weights are written transposed: one copy of all of them */
    size_t conv_numel = 0;
    for (int i = 0; i < n; i++)
        if (ts[i].conv1d) conv_numel += (size_t)ts[i].rows * ts[i].cols;
    conv = malloc((conv_numel ? conv_numel : 1) * 4);
    if (!conv) TPD_FAIL_GOTO(TPD_ERR_NOMEM, st, out, "interchange: out of memory");
    for (int i = 0, off = 0; i < n; i++) {
        outs[i].name = ts[i].name;
        outs[i].ndim = ts[i].ndim;
        outs[i].shape[0] = ts[i].shape[0];
        outs[i].shape[1] = ts[i].shape[1];
        outs[i].data = hf_data(&g, global, &ts[i]);
        if (ts[i].conv1d) {
            transpose(conv + off, outs[i].data, ts[i].rows, ts[i].cols);
            outs[i].data = conv + off;
            off += ts[i].rows * ts[i].cols;
        }
    }
    TPD_CHECK_GOTO(
        tpd_st_write(tmp, outs, n, o.bf16 ? TPD_ST_BF16 : TPD_ST_F32, o.max_shard_bytes, &shards),
        st, out);
    cJSON *cj = config_json(cfg, fam, o.bf16 ? "bfloat16" : "float32");
    text = cJSON_Print(cj);
    cJSON_Delete(cj);
    if (!text) TPD_FAIL_GOTO(TPD_ERR_NOMEM, st, out, "interchange: out of memory");
    tpd_ckpt_join(path, sizeof path, tmp, "config.json");
    TPD_CHECK_GOTO(tpd_ckpt_write_file(path, text, strlen(text)), st, out);
    if (rename(tmp, out_dir) != 0)
        TPD_FAIL_GOTO(TPD_ERR_IO, st, out,
                      "interchange %s: cannot move the finished export into place: %s "
                      "(it must not exist, or be an empty folder)",
                      out_dir, strerror(errno));
out:
    if (st != TPD_OK) tpd_ckpt_remove_dir(tmp);
    free(text);
    free(conv);
    free(outs);
    free(ts);
    return st;
}

/* ---- import ---- */

/* The tensors a Hub folder may hold that carry nothing of ours: GPT-2's causal-mask
 * buffers, old Llama files' rotary inv_freq, and a tied model's copy of the head. */
static int skipped(const char *name, const tpd_model_layout *g) {
    const char *dot = strrchr(name, '.');
    if (!strcmp(name, "lm_head.weight")) return g->p[TPD_P_LMHEAD].g_layers == 0;
    if (dot && (!strcmp(dot, ".masked_bias") || !strcmp(dot, ".inv_freq"))) return 1;
    return dot && !strcmp(dot, ".bias") && strstr(name, ".attn.bias") == dot - 5;
}

/* Where a JSON text stops parsing: line, column and the text there, with the usual cause
 * named (Python's json writes NaN and Infinity, which JSON does not have). */
static tpd_status json_syntax_error(const char *path, const char *text, const char *at) {
    if (!at || at < text || at > text + strlen(text)) at = text;
    int line = 1, col = 1;
    for (const char *p = text; p < at; p++, col++)
        if (*p == '\n') line++, col = 0;
    const char *q = at + strspn(at, " \t\r\n:,");
    int nonfinite = !strncmp(q, "NaN", 3) || !strncmp(q, "Infinity", 8) ||
                    !strncmp(q, "-Infinity", 9) || !strncmp(q, "nan", 3) || !strncmp(q, "inf", 3);
    int n = (int)strcspn(q, "\r\n");
    return tpd_fail(
        TPD_ERR_FORMAT, "interchange %s: not valid JSON at line %d, column %d (near '%.*s')%s",
        path, line, col, n > 40 ? 40 : n, q,
        nonfinite ? ": NaN and Infinity are not JSON numbers; every value must be finite"
        : *q      ? ""
                  : ": the text ends early");
}

static tpd_status read_config(const char *dir, tpd_config *cfg, hf_family *fam) {
    char cfgpath[PATH_CAP + 32], *ctext = NULL;
    tpd_ckpt_join(cfgpath, sizeof cfgpath, dir, "config.json");
    TPD_CHECK(tpd_ckpt_read_file(cfgpath, &ctext, NULL));
    const char *end = NULL;
    cJSON *hc = cJSON_ParseWithOpts(ctext, &end, 1);
    tpd_status st = TPD_OK;
    tpd_config_defaults(cfg);
    if (!hc)
        st = json_syntax_error(cfgpath, ctext, end ? end : cJSON_GetErrorPtr());
    else if (!cJSON_IsObject(hc))
        st = tpd_fail(TPD_ERR_FORMAT, "interchange %s: valid JSON, but not an object", cfgpath);
    free(ctext);
    if (st == TPD_OK) st = read_family(hc, cfgpath, fam);
    if (st == TPD_OK)
        st = *fam == HF_GPT2 ? read_gpt2(hc, cfgpath, &cfg->model)
                             : read_llama(hc, cfgpath, *fam, &cfg->model);
    cJSON_Delete(hc);
    if (st != TPD_OK) return st;
    tpd_config_model *m = &cfg->model;
    m->seq_length = m->max_position_embeddings;
    if (!m->kv_channels && m->hidden_size % m->num_attention_heads)
        return tpd_fail(TPD_ERR_FORMAT,
                        "interchange %s: the hidden size %d is not a multiple of the %d "
                        "heads",
                        cfgpath, m->hidden_size, m->num_attention_heads);
    return TPD_OK;
}

/* Where a tensor's name is found: a GPT-2 name may lack its "transformer." prefix. */
static int find_hf(const hf_tensor *ts, int n, const char *name, hf_family fam) {
    for (int i = 0; i < n; i++) {
        const char *ours = ts[i].name;
        if (!strcmp(ours, name)) return i;
        if (fam == HF_GPT2 && !strncmp(ours, "transformer.", 12) && !strcmp(ours + 12, name))
            return i;
    }
    return -1;
}

static tpd_status import_tensor(const tpd_st_set *set, const tpd_st_tensor *e, const hf_tensor *t,
                                float *dst) {
    const char *file = tpd_st_file_path(set, e->file);
    int ok = e->ndim == t->ndim;
    for (int d = 0; ok && d < t->ndim; d++)
        ok = e->shape[d] == t->shape[d];
    if (!ok) {
        char have[48], want[48]; /* [rows] or [rows, cols] */
        snprintf(have, sizeof have, e->ndim > 1 ? "[%lld, %lld]" : "[%lld]", (long long)e->shape[0],
                 e->ndim > 1 ? (long long)e->shape[1] : 0LL);
        snprintf(want, sizeof want, t->ndim == 2 ? "[%lld, %lld]" : "[%lld]",
                 (long long)t->shape[0], t->ndim == 2 ? (long long)t->shape[1] : 0LL);
        return tpd_fail(TPD_ERR_FORMAT,
                        "interchange %s: tensor '%s' has shape %s, config.json implies %s", file,
                        e->name, have, want);
    }
    size_t count = (size_t)t->rows * t->cols;
    if (!t->conv1d) {
        TPD_CHECK(tpd_st_read_f32(set, e, dst, count));
        return tpd_ckpt_check_finite(dst, count, file, e->name);
    }
    float *tmp = malloc(count * 4);
    if (!tmp) return tpd_fail(TPD_ERR_NOMEM, "interchange: out of memory");
    tpd_status st = tpd_st_read_f32(set, e, tmp, count);
    if (st == TPD_OK) st = tpd_ckpt_check_finite(tmp, count, file, e->name);
    if (st == TPD_OK) transpose(dst, tmp, t->cols, t->rows); /* (in, out) -> (out, in) */
    free(tmp);
    return st;
}

tpd_status tpd_ckpt_import_hf(const char *path, tpd_config *cfg, float *global[TPD_P_COUNT]) {
    char dir[PATH_CAP];
    struct stat sb;
    memset(global, 0, sizeof(float *) * TPD_P_COUNT);
    if (stat(path, &sb) != 0)
        return tpd_fail(TPD_ERR_IO,
                        "interchange %s: %s; give a Hugging Face model folder, or its "
                        "model.safetensors or index .json",
                        path, strerror(errno));
    if (S_ISDIR(sb.st_mode)) {
        snprintf(dir, sizeof dir, "%s", path);
    } else { /* a file in the folder (model.safetensors or the index): config.json beside */
        const char *slash = strrchr(path, '/');
        snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
    }
    hf_family fam = HF_GPT2;
    TPD_CHECK(read_config(dir, cfg, &fam));
    tpd_st_set *set = NULL;
    TPD_CHECK(tpd_st_open(path, &set));
    tpd_model_layout g;
    hf_tensor *ts = NULL;
    char *seen = NULL;
    tpd_status st = tpd_ckpt_alloc_weights(cfg, global, &g);
    int n = 0;
    if (st == TPD_OK) {
        ts = calloc((size_t)hf_capacity(&g), sizeof *ts);
        seen = calloc((size_t)hf_capacity(&g), 1);
        n = ts && seen ? hf_tensors(&g, fam, ts) : -1;
        if (n < 0) st = tpd_fail(TPD_ERR_NOMEM, "interchange: out of memory");
    }
    tpd_progress prog;
    double total = 0, done = 0;
    for (int k = 0; k < tpd_st_count(set); k++)
        total += (double)(tpd_st_get(set, k)->end - tpd_st_get(set, k)->begin);
    tpd_progress_begin(&prog, "import", total, "MB", 1e6);
    for (int k = 0; st == TPD_OK && k < tpd_st_count(set); k++) {
        const tpd_st_tensor *e = tpd_st_get(set, k);
        done += (double)(e->end - e->begin);
        tpd_progress_update(&prog, done);
        int i = find_hf(ts, n, e->name, fam);
        if (i < 0 && skipped(e->name, &g)) continue;
        if (i < 0) {
            st = tpd_fail(TPD_ERR_FORMAT,
                          "interchange %s: unexpected tensor '%s' for the %d-layer %s that "
                          "config.json describes",
                          tpd_st_file_path(set, e->file), e->name, cfg->model.num_layers,
                          g_arch[fam].arch);
            break;
        }
        st = import_tensor(set, e, &ts[i], hf_data(&g, global, &ts[i]));
        seen[i] = 1;
    }
    tpd_progress_end(&prog, done);
    for (int i = 0; i < n && st == TPD_OK; i++)
        if (!seen[i])
            st = tpd_fail(TPD_ERR_FORMAT, "interchange %s: tensor '%s' is missing",
                          tpd_st_source(set), ts[i].name);
    free(ts);
    free(seen);
    tpd_st_close(set);
    if (st != TPD_OK) tpd_ckpt_free_weights(global);
    return st;
}
