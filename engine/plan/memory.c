/* The planner's memory model: the bytes one rank of a layout allocates in `tripod train`
 * on either backend (tpd_plan_cpu_memory: the engine's buffer plan in closed form, computed
 * without it, which a test holds equal byte for byte), plus the profile's workspace on a
 * cuda cluster; and the model arithmetic it rests on and the time model shares: parameter
 * counts, layers per stage, FLOPs, Korthikanti et al.'s (2022) activation terms (a
 * reference, derived for the Llama block the same way), in-flight micro-batches. */
#include "engine/plan/plan.h"
#include "engine/plan/plan_internal.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "base/align.h"
#include "engine/model/model_flops.h"
#include "engine/model/model_memory.h"

double tpd_plan_params_eq2(double l, double h, double V, double s) {
    return 12.0 * l * h * h * (1.0 + 13.0 / (12.0 * h) + (V + s) / (12.0 * l * h));
}

int tpd_plan_gpt_block(const tpd_config *cfg) {
    const tpd_config_model *m = &cfg->model;
    return m->normalization == TPD_NORM_LAYERNORM &&
           m->position_embedding_type == TPD_POS_LEARNED && !m->swiglu &&
           tpd_config_kv_heads(cfg) == m->num_attention_heads &&
           !m->untie_embeddings_and_output_weights && m->add_bias_linear;
}

int tpd_plan_embedding_group(const tpd_config *cfg, const tpd_plan_layout *lay) {
    return lay->pp > 1 && !cfg->model.untie_embeddings_and_output_weights;
}

double tpd_plan_norm_params(const tpd_config *cfg) {
    return (cfg->model.normalization == TPD_NORM_RMSNORM ? 1.0 : 2.0) * cfg->model.hidden_size;
}

/* Per-layer parameters on one TP rank, h hidden, f ffn, h_kv = g*h/a the width of the K/V
 * heads: column-parallel QKV ((h + 2h_kv)/t rows) and first MLP matrix (f/t rows, 2f/t for
 * SwiGLU's [gate; up]), weights and biases split; row-parallel projection and second MLP
 * matrix, weights split, biases replicated; two norms, replicated. GPT-2 at t = 1:
 * 4h^2 + 2hf + 9h + f (12h^2 + 13h at f = 4h); Llama (no biases, RMSNorm):
 * 2h^2 + 2h*h_kv + 3hf + 2h. */
double tpd_plan_layer_params(const tpd_config *cfg, int tp) {
    return tpd_plan_layer_params_ep(cfg, tp, 1);
}

/* One expert's share of a TP rank: [gate; up] or fc1 (glu*fe/t, h) with its bias, the down or
 * fc2 (h, fe/t) with its (replicated) bias; times the E / EP experts of an EP rank. */
double tpd_plan_layer_expert_params(const tpd_config *cfg, int tp, int ep) {
    const tpd_config_model *m = &cfg->model;
    if (m->num_moe_experts <= 0) return 0.0;
    double t = tp, h = m->hidden_size, fe = tpd_config_moe_ffn(cfg);
    double bias = m->add_bias_linear ? 1.0 : 0.0, glu = m->swiglu ? 2.0 : 1.0;
    double El = (double)m->num_moe_experts / (ep > 1 ? ep : 1);
    return El * (glu * fe * (h + bias) / t + h * fe / t + bias * h);
}

double tpd_plan_layer_params_ep(const tpd_config *cfg, int tp, int ep) {
    return tpd_plan_layer_kind_params(cfg, tp, ep, tpd_config_moe(cfg));
}

double tpd_plan_layer_kind_params(const tpd_config *cfg, int tp, int ep, int moe) {
    const tpd_config_model *m = &cfg->model;
    double t = tp, h = m->hidden_size, f = m->ffn_hidden_size;
    /* q: the query heads' width, h unless model.kv_channels sets the head size */
    double hd = tpd_config_head_dim(cfg), q = tpd_config_q_width(cfg);
    double kv = (double)tpd_config_kv_heads(cfg) * hd;
    double bias = m->add_bias_linear ? 1.0 : 0.0, glu = m->swiglu ? 2.0 : 1.0;
    double qkv_bias = tpd_config_qkv_bias(cfg) ? 1.0 : 0.0;
    double n = (q + 2.0 * kv) * (h + qkv_bias) / t /* qkv ((q + 2h_kv)/t, h) + bias */
               + h * q / t + bias * h              /* attention projection (h, q/t) + bias */
               + 2.0 * tpd_plan_norm_params(cfg) +
               (m->qk_layernorm ? 2.0 * hd : 0.0); /* QK norm (head size) */
    if (moe && m->num_moe_experts > 0) {
        /* a mixture: the router (E, h) replicated, E experts (E / EP on an EP rank) each
         * split like the dense MLP, and the shared experts (width
         * moe_shared_expert_intermediate_size) in the dense MLP's place, with their gate (h) */
        double E = m->num_moe_experts, fs = m->moe_shared_expert_intermediate_size;
        n += E * h + tpd_plan_layer_expert_params(cfg, tp, ep);
        if (fs > 0) n += glu * fs * (h + bias) / t + h * fs / t + bias * h;
        if (m->moe_shared_expert_gate) n += h;
        return n;
    }
    return n + glu * f * (h + bias) / t /* fc1 or [gate; up] (glu*f/t, h) + bias */
           + h * f / t + bias * h;      /* fc2 or down (h, f/t) + bias */
}

double tpd_plan_mlp_width(const tpd_config *cfg) {
    const tpd_config_model *m = &cfg->model;
    if (m->num_moe_experts <= 0) return m->ffn_hidden_size;
    return m->moe_router_topk * (double)tpd_config_moe_ffn(cfg) +
           m->moe_shared_expert_intermediate_size;
}

double tpd_plan_params_count(const tpd_config *cfg) {
    const tpd_config_model *m = &cfg->model;
    double h = m->hidden_size, vh = (double)m->vocab_size * h;
    double pos = m->max_position_embeddings;
    int moe = tpd_config_moe_layers_before(cfg, m->num_layers); /* the rest are dense */
    double n = moe * tpd_plan_layer_kind_params(cfg, 1, 1, 1) +
               (m->num_layers - moe) * tpd_plan_layer_kind_params(cfg, 1, 1, 0) + vh +
               tpd_plan_norm_params(cfg);
    if (m->position_embedding_type == TPD_POS_LEARNED) n += pos * h;
    if (m->untie_embeddings_and_output_weights) n += vh; /* the output layer */
    return n;
}

double tpd_plan_grad_wire_bytes(const tpd_config *cfg) {
    return (double)tpd_config_grad_bytes(cfg);
}

double tpd_plan_dp_wire_bytes(const tpd_config *cfg) {
    double g = tpd_plan_grad_wire_bytes(cfg);
    return cfg->parallel.grad_reduce_dtype == TPD_REDUCE_BF16 && g > 2.0 ? 2.0 : g;
}

double tpd_plan_outer_wire_bytes(const tpd_config *cfg) {
    return cfg->diloco.reduce_dtype == TPD_REDUCE_BF16 ? 2.0 : 4.0;
}

double tpd_plan_hw_flops(const tpd_config *cfg, double batch, double vocab, tpd_recompute r) {
    double tokens = batch * cfg->model.seq_length, h = cfg->model.hidden_size;
    double s = cfg->model.seq_length, l = cfg->model.num_layers;
    double model = tpd_model_flops(cfg, batch, vocab);
    switch (r) {
    case TPD_RECOMPUTE_NONE:
        return model;
    case TPD_RECOMPUTE_SELECTIVE:
        /* The recomputed QK^T and AV of every layer (over the query heads' width). */
        return model + tokens * l * 4.0 * s * tpd_config_q_width(cfg);
    case TPD_RECOMPUTE_FULL:
        /* One more forward of every transformer layer; the logits are not recomputed.
         * At f = 4h: 96Bslh^2(1 + s/(6h) + V/(16lh)), SC21 Eq. 3. */
        return model + tokens * tpd_model_layers_fwd_flops_per_token(cfg);
    }
    (void)h;
    return model;
}

/* The config's split (tpd_config_stage_layers), with the common cases in O(1): the search
 * asks for it of every stage of thousands of layouts. */
int tpd_plan_chunk_layers(const tpd_config *cfg, const tpd_plan_layout *lay, int stage, int chunk) {
    int v = lay->virtual_stages > 0 ? lay->virtual_stages : 1, n = lay->pp * v;
    int vs = chunk * lay->pp + stage, L = cfg->model.num_layers;
    if (stage < 0 || stage >= lay->pp || chunk < 0 || chunk >= v) return -1;
    if (cfg->parallel.num_pipeline_layers == n) return cfg->parallel.pipeline_layers[vs];
    if (n <= L && L % n == 0) return L / n;
    return tpd_config_stage_layers(cfg, lay->pp, v, stage, chunk, NULL);
}

int tpd_plan_stage_layers(const tpd_config *cfg, const tpd_plan_layout *lay, int stage) {
    int v = lay->virtual_stages > 0 ? lay->virtual_stages : 1, sum = 0;
    for (int c = 0; c < v; c++) {
        int k = tpd_plan_chunk_layers(cfg, lay, stage, c);
        if (k < 0) return -1;
        sum += k;
    }
    return sum;
}

int tpd_plan_chunk_moe_layers(const tpd_config *cfg, const tpd_plan_layout *lay, int stage,
                              int chunk, int i0, int i1) {
    int n = tpd_plan_chunk_layers(cfg, lay, stage, chunk);
    if (!tpd_config_moe(cfg) || n <= 0) return 0;
    i0 = i0 < 0 ? 0 : i0 > n ? n : i0;
    i1 = i1 < i0 ? i0 : i1 > n ? n : i1;
    if (cfg->model.moe_layer_freq <= 1) return i1 - i0;
    int v = lay->virtual_stages > 0 ? lay->virtual_stages : 1, g0 = 0; /* its first layer */
    tpd_config_stage_layers(cfg, lay->pp, v, stage, chunk, &g0);
    return tpd_config_moe_layers_before(cfg, g0 + i1) - tpd_config_moe_layers_before(cfg, g0 + i0);
}

int tpd_plan_stage_moe_layers(const tpd_config *cfg, const tpd_plan_layout *lay, int stage) {
    int v = lay->virtual_stages > 0 ? lay->virtual_stages : 1, sum = 0;
    for (int c = 0; c < v; c++)
        sum += tpd_plan_chunk_moe_layers(cfg, lay, stage, c, 0, 1 << 30);
    return sum;
}

int tpd_plan_recomputed_layers(const tpd_config *cfg, const tpd_plan_layout *lay, int stage) {
    if (lay->recompute != TPD_RECOMPUTE_FULL) return 0;
    int v = lay->virtual_stages > 0 ? lay->virtual_stages : 1;
    int n = cfg->training.recompute_num_layers, sum = 0;
    /* Megatron's block method: the first n layers of every model chunk */
    for (int c = 0; c < v; c++) {
        int lc = tpd_plan_chunk_layers(cfg, lay, stage, c);
        if (lc > 0) sum += n > 0 && n < lc ? n : lc;
    }
    return sum;
}

double tpd_plan_layout_hw_flops(const tpd_config *cfg, const tpd_plan_layout *lay, double batch,
                                double vocab) {
    double model = tpd_model_flops(cfg, batch, vocab);
    if (lay->recompute == TPD_RECOMPUTE_SELECTIVE && tpd_plan_cp(lay) > 1 &&
        lay->cp_comm == TPD_CP_COMM_P2P)
        return model;
    double hw = tpd_plan_hw_flops(cfg, batch, vocab, lay->recompute);
    if (lay->recompute != TPD_RECOMPUTE_FULL || cfg->model.num_layers < 1) return hw;
    double recomputed = 0;
    for (int s = 0; s < lay->pp; s++)
        recomputed += tpd_plan_recomputed_layers(cfg, lay, s);
    return model + (hw - model) * recomputed / cfg->model.num_layers;
}

double tpd_plan_activation_bytes_per_layer(double s, double b, double h, double a, int tp, int sp,
                                           tpd_recompute r, int flash) {
    double t = tp, sbh = s * b * h;
    /* The 5as/h term is the s x s attention scores, softmax and its dropout mask; flash
     * attention never stores them. */
    double scores = flash ? 0.0 : 5.0 * a * s / h;
    switch (r) {
    case TPD_RECOMPUTE_NONE:
        return sp ? sbh * (34.0 + scores) / t : sbh * (10.0 + 24.0 / t + scores / t);
    case TPD_RECOMPUTE_SELECTIVE:
        return sp ? 34.0 * sbh / t : sbh * (10.0 + 24.0 / t);
    case TPD_RECOMPUTE_FULL:
        /* Only the layer input is kept (2 bytes per element); with SP it is sharded. */
        return sp ? 2.0 * sbh / t : 2.0 * sbh;
    }
    return 0.0;
}

/* Activation bytes per transformer layer per micro-batch of the config's block, by what
 * each backward reads (Korthikanti et al. 2022, Sec. 4.1: 16-bit activations, 1-byte dropout
 * masks). h_kv = g*h/a is the width of the K and V heads; rep = 1/t under sequence
 * parallelism (the rows the norms and the residual keep), else 1:
 *
 *   norms      the input of each of the two norms                          4sbh * rep
 *   attention  the QKV GEMM's input (the first norm's output)              2sbh * rep
 *              Q, K and V (after RoPE: QK^T's backward reads them;
 *              the rotation's backward reads nothing)                     (2sbh + 4sb*h_kv)/t
 *              the softmax output (unfused attention)                      2as^2b/t
 *              its dropout mask and the dropout output (GPT)               3as^2b/t
 *              the projection's input (the context)                        2sbh/t
 *              the projection's dropout mask (GPT)                         sbh * rep
 *   MLP        the first GEMM's input (the second norm's output)           2sbh * rep
 *              GELU: its input and the second GEMM's input                 4sbf/t
 *              SwiGLU: gate and up, and the down GEMM's input              6sbf/t
 *              the dropout mask (GPT)                                      sbh * rep
 *
 * GPT-2's block (h_kv = h, GELU, f = 4h, dropout) sums to Korthikanti's Table 2,
 * sbh(10 + 24/t) + 5as^2b/t, (34sbh + 5as^2b)/t with SP (tpd_plan_activation_bytes_per_layer).
 * Llama's (RMSNorm, RoPE, GQA, SwiGLU, and no dropout, as Llama and Megatron's Llama recipes
 * train) sums to sbh(8 + (4 + 4g/a)/t) + 6sbf/t + 2as^2b/t, or
 * (sbh(12 + 4g/a) + 6sbf + 2as^2b)/t with SP: Llama 3 70B (g/a = 1/8, f = 3.5h) keeps
 * 33.5sbh/t per layer with SP where GPT keeps 34sbh/t. Flash attention and selective
 * recompute drop the s^2 terms (flash keeps only the softmax statistics; selective recomputes
 * the core attention from Q, K and V); full recompute keeps the layer input, 2sbh * rep. The
 * norms' per-row statistics (4 to 8 bytes a row) are left out, as Korthikanti leaves them. */
double tpd_plan_layer_activation_bytes(const tpd_config *cfg, double b, int tp, int sp,
                                       tpd_recompute r, int flash) {
    return tpd_plan_layer_activation_bytes_cp(cfg, b, tp, sp, r, flash, 1);
}

/* Under CP every term above is a rank's s/CP tokens, and the s x s terms are its s/CP
 * queries against all s keys: the layer's bytes over CP. */
double tpd_plan_layer_activation_bytes_cp(const tpd_config *cfg, double b, int tp, int sp,
                                          tpd_recompute r, int flash, int cp) {
    const tpd_config_model *m = &cfg->model;
    double c = cp > 1 ? cp : 1;
    double S = m->seq_length, s = S / c, h = m->hidden_size, a = m->num_attention_heads, t = tp;
    double f = m->ffn_hidden_size;
    double kv = (double)tpd_config_kv_heads(cfg) * tpd_config_head_dim(cfg);
    double sbq = s * b * tpd_config_q_width(cfg); /* the query heads (sbh at the usual size) */
    double sbh = s * b * h, rep = sp ? 1.0 / t : 1.0;
    double dropout = tpd_plan_gpt_block(cfg) ? 1.0 : 0.0;
    if (r == TPD_RECOMPUTE_FULL) return 2.0 * sbh * rep;
    double norms = 4.0 * sbh * rep;
    double attn =
        2.0 * sbh * rep + (2.0 * sbq + 4.0 * s * b * kv) / t + 2.0 * sbq / t + dropout * sbh * rep;
    double mlp = 2.0 * sbh * rep + (m->swiglu ? 6.0 : 4.0) * s * b * f / t + dropout * sbh * rep;
    double scores =
        r == TPD_RECOMPUTE_NONE && !flash ? (2.0 + 3.0 * dropout) * a * s * S * b / t : 0.0;
    return norms + attn + mlp + scores;
}

int tpd_plan_in_flight(int pp, int stage, int micro_batches, int v, tpd_schedule schedule) {
    if (v > 1) schedule = TPD_SCHEDULE_INTERLEAVED;
    int n = pp - stage; /* 1F1B: warm-up forwards plus the first steady one */
    if (schedule == TPD_SCHEDULE_ZB_H1) {
        /* W of micro-batch k runs `stage` backwards after its B: every stage holds p */
        n = pp;
    } else if (schedule == TPD_SCHEDULE_INTERLEAVED) {
        /* Warm-up forwards plus the first steady one (chunks, not micro-batches). On stage 0
         * this is (p*v + p - 1) chunks = p micro-batches x (1 + (p-1)/(p*v)). */
        n = 2 * (pp - stage - 1) + (v - 1) * pp + 1;
        micro_batches *= v;
    }
    return n < micro_batches ? n : micro_batches;
}

tpd_status tpd_plan_wgrad_pending(const tpd_plan_layout *lay, int stage, int micro_batches,
                                  int *peak_p) {
    if (tpd_plan_layout_schedule(lay) != TPD_SCHEDULE_ZB_H1 || micro_batches < 1) {
        *peak_p = 0;
        return TPD_OK;
    }
    int v = lay->virtual_stages > 0 ? lay->virtual_stages : 1;
    tpd_pp_schedule s;
    TPD_CHECK(
        tpd_pp_schedule_make(tpd_plan_layout_pp_kind(lay), lay->pp, stage, micro_batches, v, &s));
    int pending = 0, peak = 0;
    for (int i = 0; s.split_backward && i < s.count; i++) {
        pending += s.actions[i].kind == TPD_PP_BWD;
        pending -= s.actions[i].kind == TPD_PP_WGRAD;
        if (pending > peak) peak = pending;
    }
    tpd_pp_schedule_free(&s);
    *peak_p = peak;
    return TPD_OK;
}

/* Parameters held by one rank of `stage`. The first stage holds the token embedding (and
 * the position embedding when it is learned), the last the final norm and the output layer:
 * its own copy of the tied token embedding when pp > 1, or the untied output layer (on the
 * first stage too when pp == 1). */
double tpd_plan_stage_params(const tpd_config *cfg, const tpd_plan_layout *lay, int stage) {
    const tpd_config_model *m = &cfg->model;
    double h = m->hidden_size;
    double pos = m->max_position_embeddings;
    double vocab = (double)tpd_config_padded_vocab(cfg, lay->tp) * h / lay->tp;
    int Ls = tpd_plan_stage_layers(cfg, lay, stage),
        Lm = tpd_plan_stage_moe_layers(cfg, lay, stage);
    double n = Lm * tpd_plan_layer_kind_params(cfg, lay->tp, tpd_plan_ep(lay), 1) +
               (Ls - Lm) * tpd_plan_layer_kind_params(cfg, lay->tp, tpd_plan_ep(lay), 0);
    if (stage == 0) {
        n += vocab;
        if (m->position_embedding_type == TPD_POS_LEARNED) n += pos * h;
    }
    if (stage == lay->pp - 1) {
        n += tpd_plan_norm_params(cfg);
        if (m->untie_embeddings_and_output_weights || lay->pp > 1) n += vocab;
    }
    return n;
}

int tpd_plan_uses_flash(const tpd_config *cfg) {
    return cfg->training.attention == TPD_ATTENTION_FUSED;
}

int tpd_plan_mlp_act_width(const tpd_config *cfg) {
    const tpd_config_model *m = &cfg->model;
    int dense = tpd_config_moe_layers_before(cfg, m->num_layers) < m->num_layers;
    int fs = m->num_moe_experts > 0 ? m->moe_shared_expert_intermediate_size : 0;
    int fd = dense ? m->ffn_hidden_size : 0;
    return fd > fs ? fd : fs;
}

void tpd_plan_kern_shapes(const tpd_config *cfg, const tpd_plan_layout *lay, int stage,
                          tpd_kern_shapes *s) {
    const tpd_config_model *m = &cfg->model;
    int t = lay->tp > 0 ? lay->tp : 1;
    int C = m->hidden_size, NH = m->num_attention_heads;
    /* the MLP activations' width: the dense layers' or the shared experts', the larger */
    int F = tpd_plan_mlp_act_width(cfg);
    int HS = NH > 0 ? tpd_config_head_dim(cfg) : 0, NHl = NH / t,
        KVl = tpd_config_kv_heads(cfg) / t;
    int QKVl = (NHl + 2 * KVl) * HS, FCl = (m->swiglu ? 2 : 1) * (F / t);
    memset(s, 0, sizeof *s);
    s->B = lay->micro_batch_size;
    s->T = tpd_plan_local_seq(cfg, lay); /* a CP rank's tokens of each sequence */
    s->Nl = lay->sequence_parallel && t > 1 ? s->B * s->T / t : s->B * s->T;
    s->C = C;
    if (tpd_plan_stage_layers(cfg, lay, stage) > 0) {
        s->NH = NHl;
        s->NKV = KVl;
        s->HS = HS;
        int oc = 0;
        if (m->add_bias_linear) oc = C > FCl ? C : FCl;
        if ((m->add_bias_linear || tpd_config_qkv_bias(cfg)) && QKVl > oc) oc = QKVl;
        if (m->num_moe_experts > 0) { /* the experts' fc bias; their rows' scatter */
            int FCel = (m->swiglu ? 2 : 1) * (tpd_config_moe_ffn(cfg) / t);
            if (m->add_bias_linear && FCel > oc) oc = FCel;
            s->moe_rows = s->B * s->T * m->moe_router_topk;
        }
        s->bias_oc = oc;
    }
    s->Vl = stage == 0 ? tpd_config_padded_vocab(cfg, lay->tp) / t : 0;
    s->rmsnorm = m->normalization == TPD_NORM_RMSNORM;
    s->dtype = cfg->training.precision == TPD_PRECISION_BF16 ? TPD_DTYPE_BF16 : TPD_DTYPE_F32;
    s->fused_attention = cfg->training.attention == TPD_ATTENTION_FUSED;
}

tpd_status tpd_plan_scratch(const tpd_config *cfg, const tpd_plan_layout *lay, int stage,
                            const char *name, tpd_kern_scratch *out) {
    tpd_kern_shapes s;
    tpd_plan_kern_shapes(cfg, lay, stage, &s);
    return tpd_kern_scratch_plan(name, &s, out);
}

/* Bytes rounded up to the alignment of every region of the cpu engine's buffer plan. */
static uint64_t up(uint64_t bytes) {
    return tpd_align_up(bytes);
}

tpd_status tpd_plan_cpu_memory(const tpd_config *cfg, const tpd_plan_layout *lay, int stage,
                               tpd_plan_stage_mem *out) {
    const tpd_config_model *m = &cfg->model;
    /* DP padding and the ZeRO-1 shard are over the ranks that sum each step's gradients:
     * all of DP (or one DiLoCo replica's) times CP (tpd_plan_dp_inner) */
    uint64_t t = (uint64_t)lay->tp, dp = (uint64_t)tpd_plan_dp_inner(cfg, lay);
    /* CP: a rank runs T = seq / CP tokens of each sequence everywhere (slots, heads,
     * workspace, staging); the weights are whole */
    uint64_t cp = (uint64_t)tpd_plan_cp(lay), S = (uint64_t)m->seq_length;
    uint64_t B = (uint64_t)lay->micro_batch_size, T = S / cp;
    int ring = cp > 1 && lay->cp_comm == TPD_CP_COMM_P2P, a2a = cp > 1 && !ring;
    uint64_t C = (uint64_t)m->hidden_size, NH = (uint64_t)m->num_attention_heads;
    /* a mixture of experts: E experts of width Fe each, El = E / EP of them on an EP rank
     * (all of them at EP 1), top-k routing, and shared experts (width Fs, none at 0) in its
     * MoE layers; its dense layers (all of a dense model's) an MLP of width F */
    uint64_t E = (uint64_t)m->num_moe_experts, K = E ? (uint64_t)m->moe_router_topk : 0;
    uint64_t ep = E ? (uint64_t)tpd_plan_ep(lay) : 1, El = E / ep;
    uint64_t F = (uint64_t)m->ffn_hidden_size;
    uint64_t Fs = E ? (uint64_t)m->moe_shared_expert_intermediate_size : 0;
    uint64_t maxT = (uint64_t)m->max_position_embeddings;
    int v = lay->virtual_stages > 0 ? lay->virtual_stages : 1;
    int64_t layers = tpd_plan_stage_layers(cfg, lay, stage);
    if (layers < 0 || t < 1 || dp < 1 || lay->micro_batch_size < 1 || v > TPD_CONFIG_MAX_STAGES ||
        (E && (El < 1 || E % ep))) {
        tpd_log_error("plan: no cpu memory for stage %d of this layout", stage);
        return TPD_ERR_INVALID;
    }
    uint64_t Ls = (uint64_t)layers, Vl = (uint64_t)tpd_config_padded_vocab(cfg, lay->tp) / t;
    /* the stage's MoE layers (every moe_layer_freq-th of the model) and dense ones */
    uint64_t Lm = (uint64_t)tpd_plan_stage_moe_layers(cfg, lay, stage), Ld = Ls - Lm;
    uint64_t Fl = F / t, NHl = NH / t, N = B * T;
    /* the MLP activations' local width (the larger of the dense MLP's and the shared
     * experts', tpd_plan_mlp_act_width), and the shared experts' */
    uint64_t Fml = (uint64_t)tpd_plan_mlp_act_width(cfg) / t, Fsl = Fs / t;
    /* the block: K/V heads (grouped-query attention), SwiGLU's [gate; up], RMSNorm without
     * b or mean, linear biases, learned positions, tied or separate output layer; Cl the
     * local query heads' width (C/t unless model.kv_channels sets the head size) */
    uint64_t HS = (uint64_t)tpd_config_head_dim(cfg), KVl = (uint64_t)tpd_config_kv_heads(cfg) / t;
    uint64_t Cl = NHl * HS;
    uint64_t QKVl = (NHl + 2 * KVl) * HS, FCl = m->swiglu ? 2 * Fl : Fl;
    uint64_t FCml = m->swiglu ? 2 * Fml : Fml, FCsl = m->swiglu ? 2 * Fsl : Fsl;
    int rms = m->normalization == TPD_NORM_RMSNORM, bias = m->add_bias_linear;
    int learned = m->position_embedding_type == TPD_POS_LEARNED;
    int tied = !m->untie_embeddings_and_output_weights;
    uint64_t nb = rms ? 0 : 1; /* LayerNorm's b and mean, per norm */
    int first = stage == 0, last = stage == lay->pp - 1;
    int sp = lay->sequence_parallel && lay->tp > 1;
    uint64_t NL = sp ? N / t : N; /* rows of the LayerNorm, residual and p2p regions */
    uint64_t e = cfg->training.precision == TPD_PRECISION_BF16 ? 2 : 4; /* element bytes */

    /* parameters, in the flat buffer's hook units (tpd_model_layout_unit_bounds): the
     * embedding (wte, learned wpe on the first stage; the tied wte on a last stage that is
     * not the first), each of the stage's layers sliced over TP, then the final norm and an
     * untied output layer on the last stage */
    uint64_t Fel = E ? (uint64_t)tpd_config_moe_ffn(cfg) / t : 0;
    uint64_t FCel = m->swiglu ? 2 * Fel : Fel, NK = N * K; /* token-expert assignments */
    /* the rows an EP rank's experts may receive, dropless: each of the EP ranks' N tokens
     * sends at most min(k, El) of its assignments to one rank (NK at EP 1) */
    uint64_t NR = ep * N * (K < El ? K : El);
    /* under a capacity each source sends at most ceil(f N k / E) rows to each expert */
    if (ep > 1 && E && m->moe_expert_capacity_factor > 0) {
        uint64_t cap = (uint64_t)ceil(m->moe_expert_capacity_factor * (double)N * K / E);
        if (ep * El * cap < NR) NR = ep * El * cap;
    }
    /* every layer's norms, attention and its biases; then a dense layer's MLP, or a MoE
     * layer's router (all E), the El local experts' shares (expfcw, expprojw) and their
     * biases (expfcb, expprojb), the shared experts (shfcw .. shprojb) and their gate */
    uint64_t common = 2 * (1 + nb) * C + QKVl * C + C * Cl + (bias ? C : 0) +
                      (tpd_config_qkv_bias(cfg) ? QKVl : 0) + (m->qk_layernorm ? 2 * HS : 0);
    uint64_t per_dense = common + FCl * C + C * Fl + (bias ? FCl + C : 0);
    uint64_t per_moe = common + FCsl * C + C * Fsl + (bias && Fs ? FCsl + C : 0);
    if (E)
        per_moe += E * C + El * FCel * C + El * C * Fel + (bias ? El * FCel + El * C : 0) +
                   (m->moe_shared_expert_gate ? C : 0);
    uint64_t u0 = 0, uf = 0;
    if (first)
        u0 = Vl * C + (learned ? maxT * C : 0);
    else if (last && tied)
        u0 = Vl * C;
    if (last) uf = (1 + nb) * C + (tied ? 0 : Vl * C);
    uint64_t n = u0 + Ld * per_dense + Lm * per_moe + uf;
    /* EP under ZeRO-1: the experts' region (first in the buffer) ends on a multiple of DP
     * (zero padding) and shards over expert DP, DP / EP ranks (tpd_dp_plan_init_ep) */
    tpd_dp_sharding sh = tpd_plan_sharding(lay);
    uint64_t xl = 0, xe = 0, xpad = 0; /* xl: a layer's expert elements (its expert unit) */
    if (E && ep > 1 && Lm > 0) {
        xl = El * FCel * C + El * C * Fel + (bias ? El * FCel + El * C : 0);
        xe = xpad = Lm * xl;
        if (lay->distributed_optimizer && dp > 1 && dp % ep == 0 &&
            sh < TPD_DP_SHARDING_OPTIM_GRADS)
            xpad = (xe + dp - 1) / dp * dp;
        n += xpad - xe;
    }
    uint64_t padded = (n + dp - 1) / dp * dp;          /* ZeRO-1 shards are equal */
    uint64_t g = (uint64_t)tpd_config_grad_bytes(cfg); /* fp32 main gradients, or bf16 */
    uint64_t sgd = cfg->optimizer.type == TPD_OPTIM_SGD;
    /* optim_grads and optim_grads_params over all of DP: each unit is cut in DP parts of
     * ceil(len / DP), unpadded buffer; a rank keeps its part of every unit (gradients, state,
     * masters; optim_grads_params its parameters too) and stages full units in slots of
     * DP parts: pool_params of the largest unit's parameters (optim_grads_params), two of
     * the largest layer or final unit's gradients (plus, under ZB-H1, one per layer whose W
     * is pending, at most the stage's layers) and the embedding's own, whose reduction
     * waits for the step's end (tpd_buffer_plan_init) */
    /* hybrid sharding: over the shard group, replicated across the groups */
    uint64_t hs = (uint64_t)tpd_plan_shard_group(cfg, lay);
    int units = sh >= TPD_DP_SHARDING_OPTIM_GRADS && hs > 1;
    uint64_t shard, nparams, ngrads, gather = 0;
    if (units) {
        uint64_t dp = hs; /* the unit plan's ranks */
        int gp = sh == TPD_DP_SHARDING_OPTIM_GRADS_PARAMS;
        /* EP: each layer's experts are a unit of their own over expert DP, DP / EP ranks,
         * staged in expert slots (xslot) beside the layer's */
        uint64_t edp = xl && dp >= ep ? dp / ep : 1, px = (xl + edp - 1) / edp, xslot = px * edp;
        uint64_t p0 = (u0 + dp - 1) / dp, pd = (per_dense + dp - 1) / dp,
                 pm = (per_moe - xl + dp - 1) / dp, pf = (uf + dp - 1) / dp;
        shard = p0 + Ld * pd + Lm * (pm + px) + pf;
        nparams = gp ? shard : n;
        ngrads = shard;
        uint64_t eslot = p0 * dp, gslot = Ld ? pd * dp : 0;
        if (Lm && pm * dp > gslot) gslot = pm * dp;
        if (pf * dp > gslot) gslot = pf * dp;
        uint64_t pslot = gp ? (eslot > gslot ? eslot : gslot) : 0;
        int k = cfg->parallel.fsdp_units_in_flight;
        uint64_t pool_params = gp ? (uint64_t)(k > 2 ? k : 2) : 0, pool_grads = 2;
        int64_t mbdp = (int64_t)lay->micro_batch_size * lay->dp;
        int M = mbdp > 0 ? (int)(cfg->training.global_batch_size / mbdp) : 0, peak_w = 0;
        TPD_CHECK(tpd_plan_wgrad_pending(lay, stage, M, &peak_w));
        if (peak_w > 0) {
            uint64_t lc = 0;
            for (int c = 0; c < v; c++) {
                int64_t k_c = tpd_plan_chunk_layers(cfg, lay, stage, c);
                if (k_c > 0 && (uint64_t)k_c > lc) lc = (uint64_t)k_c;
            }
            pool_grads += (uint64_t)peak_w * lc < Ls ? (uint64_t)peak_w * lc : Ls;
        }
        gather = pool_params * (pslot + (gp ? xslot : 0)) * e +
                 (pool_grads * (gslot + xslot) + eslot) * g;
    } else {
        shard = lay->distributed_optimizer && dp > 1 ? padded / dp : padded;
        if (xpad > 0 && lay->distributed_optimizer && dp > 1 && dp % ep == 0)
            shard = xpad / (dp / ep) + (padded - xpad) / dp;
        nparams = ngrads = padded;
    }
    out->params = (double)(nparams * e);
    out->grads = (double)(ngrads * g); /* main gradients */
    out->gather = (double)gather;
    /* AdamW's m and v (plain SGD keeps none) and the fp32 masters */
    out->optimizer = (double)((sgd ? 0 : 2 * shard * 4) + (e == 2 ? shard * 4 : 0));
    /* the report's unsharded figures: no_shard's */
    out->params_full = (double)(padded * e);
    out->grads_full = (double)(padded * g);
    out->optimizer_full = (double)((sgd ? 0 : 2 * padded * 4) + (e == 2 ? padded * 4 : 0));
    /* DiLoCo: the parameters at the last sync, the outer momentum, one fragment's
     * pseudo-gradient (fp32) */
    out->outer =
        cfg->parallel.dp_sync == TPD_DP_SYNC_DILOCO
            ? (double)((2 * shard + tpd_diloco_fragment_numel(shard, cfg->diloco.fragments)) * 4)
            : 0.0;

    /* activations: one slot per (micro-batch, chunk) the schedule holds at its peak, each
     * sized for the largest chunk (the chunks share them); the last stage's head blocks */
    int cuda = cfg->training.device == TPD_DEVICE_CUDA;
    int stats = cuda && cfg->training.attention == TPD_ATTENTION_FUSED && e == 2;
    uint64_t att = NHl * B * T * T * 4; /* cpu: the fp32 softmax probabilities */
    if (cuda) att = stats ? NHl * B * T * 4 : NHl * B * T * T * e;
    if (ring) {
        /* ring attention keeps the log-sum-exp of its rows, on either backend */
        att = B * NHl * T * 4;
    } else if (a2a) {
        /* Ulysses: NHl/CP heads over the whole sequence, as the backend keeps them, and
         * the head-split output before its all-to-all back */
        uint64_t hh = NHl / cp, rows = B * hh * S;
        att = up(cuda ? (stats ? rows * 4 : rows * S * e) : rows * S * 4) + up(N * Cl * e);
    }
    /* selective recompute drops the attention state to rebuild it in the backward; the
     * ring's log-sum-exp is all the state there is, so it stays per layer */
    int selective = lay->recompute == TPD_RECOMPUTE_SELECTIVE && !ring;
    /* a dense layer's block; a MoE layer's adds the regions of the mixture after it */
    uint64_t layer = 4 * up(NL * C * e) + 2 * (1 + nb) * up(NL * 4) + up(N * QKVl * e) +
                     up(N * Cl * e) + (selective ? 0 : up(att)) + up(N * FCml * e) +
                     up(N * Fml * e);
    if (m->qk_layernorm) /* Qwen3's QK norm: the Q and K heads before it, their rstd */
        layer += up(N * (NHl + KVl) * HS * e) + up(N * (NHl + KVl) * 4);
    uint64_t layer_moe = layer;
    if (E) /* the routing (softmax, log-sum-exp, five per-assignment arrays, the counts); the
              rows the local experts run (NR: all of a rank's own NK at EP 1), their fc output
              and activation; the assignments' outputs back in token order (NK); the shared
              output, gate; under EP the int32 counts of every EP rank's tokens per local
              expert (moe_ecounts) */
        layer_moe += up(N * E * 4) + up(N * 4) + 5 * up(NK * 4) + up((E + 1) * 4) + up(NR * C * e) +
                     up(NR * FCel * e) + up(NR * Fel * e) + up(NK * C * e) +
                     (Fs ? up(N * C * e) : 0) + (m->moe_shared_expert_gate ? up(N * 4) : 0) +
                     (ep > 1 ? up(ep * El * 4) : 0);
    /* fully recomputed layers (the first k of each chunk) keep only their output */
    uint64_t R = 0, kept = 0;
    for (int c = 0; c < v; c++) {
        int64_t lc = tpd_plan_chunk_layers(cfg, lay, stage, c);
        uint64_t r = 0;
        if (lay->recompute == TPD_RECOMPUTE_FULL && lc > 0) {
            int k = cfg->training.recompute_num_layers;
            r = k > 0 && k < lc ? (uint64_t)k : (uint64_t)lc;
        }
        if (r > R) R = r;
        /* the chunk's kept layers [r, lc), each its kind's block */
        uint64_t km = (uint64_t)tpd_plan_chunk_moe_layers(cfg, lay, stage, c, (int)r, (int)lc);
        uint64_t kb = lc > 0 ? km * layer_moe + ((uint64_t)lc - r - km) * layer : 0;
        if (kb > kept) kept = kb;
    }
    uint64_t slot = 2 * up(N * 4) + up(NL * C * e) + R * up(NL * C * e) + kept;
    uint64_t head =
        up(NL * C * e) + (1 + nb) * up(NL * 4) + up(N * Vl * e) + up(3 * N * 4) + up(N * 4);
    /* in 64 bits: mbs * dp of a layout searched for 2^30 GPUs does not fit an int */
    int64_t mbdp = (int64_t)lay->micro_batch_size * lay->dp;
    int M = mbdp > 0 ? (int)(cfg->training.global_batch_size / mbdp) : 0;
    uint64_t slots = (uint64_t)tpd_plan_in_flight(lay->pp, stage, M, v, lay->schedule);
    /* the head's last chunk holds a micro-batch from its forward to its backward, which
     * follows it at once under every schedule here: one block */
    uint64_t heads = last && M > 0 ? 1 : 0;
    out->activations = (double)(slots * slot + heads * head);

    /* workspace: activation gradients, the p2p send buffer (every virtual stage but the
     * very first sends its input's gradient), recompute and SP scratch, the last stage's
     * loss accumulator (one f64), the backend's scratch (none on cpu) and the host staging
     * of every slot's inputs and targets */
    uint64_t ws =
        2 * up(NL * C * e) + up(N * C * e) + up(N * QKVl * e) + up(N * Cl * e) + up(N * Fml * e);
    if (m->swiglu) ws += up(N * FCml * e); /* d[gate | up] */
    if (!(first && v == 1)) ws += up(NL * C * e);
    if (R) ws += layer_moe; /* the recomputed layer's block: either kind's */
    if (selective) ws += up(att);
    if (sp) ws += up(N * C * e) + up(NL * C * e);
    if (last) ws += up(8);
    if (ring) /* two K/V ring buffers, two fp32 dK/dV ones, the fp32 running output (dq in
                 the backward), its running max and sum, the int32 positions */
        ws += up(2 * N * 2 * KVl * HS * e) + up(2 * N * 2 * KVl * HS * 4) + up(N * NHl * HS * 4) +
              2 * up(B * NHl * T * 4) + up((S + T) * 4);
    if (E) /* the MoE MLP's output or input gradient, the rows in expert order, the experts'
              fc and activation gradients (of the NR rows they run), the assignments' and the
              logits' gradients, the router's input gradient, and under SP the gathered MLP
              input; under EP two blocks of NR rows for the all-to-alls (w_moe_ea, w_moe_eb) */
        ws += up(N * C * e) + up(NK * C * e) + up(NR * FCel * e) + up(NR * Fel * e) + up(NK * 4) +
              up(N * E * 4) + up(N * C * e) + (sp ? up(N * C * e) : 0) +
              (ep > 1 ? 2 * up(NR * C * e) : 0);
    if (a2a) ws += 2 * up(N * QKVl * e); /* the all-to-all's send and receive blocks */
    tpd_kern_scratch scratch;
    TPD_CHECK(tpd_plan_scratch(cfg, lay, stage,
                               cfg->training.device == TPD_DEVICE_CUDA ? "cuda" : "cpu", &scratch));
    uint64_t host = slots * 2 * N * 4;
    if (E && cfg->training.device == TPD_DEVICE_CUDA) /* the routing's host mirrors: one
        layer's routing regions, the gate, the EP counts, the assignments' and the logits'
        gradients, after the tokens' staging */
        host = up(host) + up(N * E * 4) + up(N * 4) + 5 * up(NK * 4) + up((E + 1) * 4) +
               (m->moe_shared_expert_gate ? up(N * 4) : 0) + (ep > 1 ? up(ep * El * 4) : 0) +
               up(NK * 4) + up(N * E * 4);
    out->workspace = (double)(ws + scratch.total + host);
    out->total = out->params + out->grads + out->gather + out->optimizer + out->outer +
                 out->activations + out->workspace;
    return TPD_OK;
}

/* A rank of the cuda backend: the bytes `tripod train` allocates there (the engine's buffer
 * plan in closed form, with the cuda backend's planned scratch, as on the cpu backend), and
 * beside them the profile's workspace_bytes: the cuBLASLt workspace and the communicators'
 * buffers. A one-rank layout creates no communicator, so only the cuBLASLt workspace. Every
 * strategy over all of DP is the engine's own plan; hybrid sharding (a shard group short of
 * DP), which it does not train, is ZeRO-1 over all of DP with the shard group's shards on
 * top (tpd_plan_shard_memory). */
static tpd_status cuda_stage_mem(const tpd_config *cfg, const tpd_plan_cluster *cl,
                                 const tpd_plan_layout *lay, int stage, tpd_plan_stage_mem *out) {
    tpd_config dev = *cfg;
    dev.training.device = TPD_DEVICE_CUDA;
    tpd_dp_sharding sh = tpd_plan_sharding(lay);
    int S = tpd_plan_shard_group(cfg, lay), inner = tpd_plan_dp_inner(cfg, lay);
    tpd_plan_layout z = *lay;
    z.distributed_optimizer = sh != TPD_DP_SHARDING_NO_SHARD && S > 1;
    TPD_CHECK(tpd_plan_cpu_memory(&dev, &z, stage, out));
    if (z.distributed_optimizer && S < inner && sh < TPD_DP_SHARDING_OPTIM_GRADS) {
        tpd_plan_stage_mem full;
        z.distributed_optimizer = 0;
        z.sharding = TPD_DP_SHARDING_NO_SHARD;
        z.shard_size = 0;
        TPD_CHECK(tpd_plan_cpu_memory(&dev, &z, stage, &full));
        TPD_CHECK(tpd_plan_shard_memory(&dev, lay, stage, &full, out));
    }
    double lib = cl->workspace_bytes;
    if (tpd_plan_world(lay) == 1 && lib > (double)TPD_KERN_GEMM_WORKSPACE_BYTES)
        lib = (double)TPD_KERN_GEMM_WORKSPACE_BYTES;
    out->workspace += lib;
    out->total += lib;
    return TPD_OK;
}

tpd_status tpd_plan_memory(const tpd_config *cfg, const tpd_plan_cluster *cl,
                           tpd_plan_result *res) {
    const tpd_plan_layout *lay = &res->layout;
    int64_t denom = (int64_t)lay->micro_batch_size * lay->dp;
    res->num_micro_batches = denom > 0 ? (int)(cfg->training.global_batch_size / denom) : 0;
    res->stages = lay->pp;
    res->memory_bytes = 0.0;
    int v = lay->virtual_stages > 0 ? lay->virtual_stages : 1;
    for (int c = 0; c < v; c++)
        for (int s = 0; s < lay->pp && c * lay->pp + s < TPD_CONFIG_MAX_STAGES; s++)
            res->chunk_layers[c * lay->pp + s] = tpd_plan_chunk_layers(cfg, lay, s, c);
    res->max_mem_stage = 0;
    for (int s = 0; s < lay->pp; s++) {
        res->stage_layers[s] = tpd_plan_stage_layers(cfg, lay, s);
        if (cl->backend == TPD_PLAN_BACKEND_CPU) {
            TPD_CHECK(tpd_plan_cpu_memory(cfg, lay, s, &res->mem[s]));
        } else {
            TPD_CHECK(cuda_stage_mem(cfg, cl, lay, s, &res->mem[s]));
        }
        if (res->mem[s].total > res->memory_bytes) {
            res->memory_bytes = res->mem[s].total;
            res->max_mem_stage = s;
        }
    }
    double cap = cl->hbm_bytes * cl->hbm_usable_fraction;
    res->fits = res->memory_bytes <= cap;
    res->reject_reason[0] = '\0';
    if (!res->fits) {
        snprintf(res->reject_reason, sizeof res->reject_reason,
                 "OOM by %.1f GiB at stage %d (needs %.1f GiB of %.1f GiB usable)",
                 (res->memory_bytes - cap) / 1073741824.0, res->max_mem_stage,
                 res->memory_bytes / 1073741824.0, cap / 1073741824.0);
    }
    return TPD_OK;
}
