#include "engine/model/model_layout.h"

#include <math.h>
#include <limits.h>
#include <string.h>

#include "base/fault.h"
#include "base/rng.h"

/* Table order is the buffer order and llm.c's file order. */
static const tpd_param_info g_info[TPD_P_COUNT] = {
    [TPD_P_WTE] = {"wte", 0, TPD_LAYERS_ALL, 1, TPD_SPLIT_VOCAB, 2},
    [TPD_P_WPE] = {"wpe", 0, TPD_LAYERS_ALL, 1, TPD_SPLIT_NONE, 2},
    [TPD_P_LN1W] = {"ln1w", 1, TPD_LAYERS_ALL, 0, TPD_SPLIT_NONE, 1},
    [TPD_P_LN1B] = {"ln1b", 1, TPD_LAYERS_ALL, 0, TPD_SPLIT_NONE, 0},
    [TPD_P_QKVW] = {"qkvw", 1, TPD_LAYERS_ALL, 1, TPD_SPLIT_QKV, 2},
    [TPD_P_QKVB] = {"qkvb", 1, TPD_LAYERS_ALL, 0, TPD_SPLIT_QKV, 0},
    [TPD_P_ATTPROJW] = {"attprojw", 1, TPD_LAYERS_ALL, 1, TPD_SPLIT_COLS, 3},
    [TPD_P_ATTPROJB] = {"attprojb", 1, TPD_LAYERS_ALL, 0, TPD_SPLIT_NONE, 0},
    [TPD_P_LN2W] = {"ln2w", 1, TPD_LAYERS_ALL, 0, TPD_SPLIT_NONE, 1},
    [TPD_P_LN2B] = {"ln2b", 1, TPD_LAYERS_ALL, 0, TPD_SPLIT_NONE, 0},
    /* TPD_SPLIT_GLU under SwiGLU */
    [TPD_P_FCW] = {"fcw", 1, TPD_LAYERS_DENSE, 1, TPD_SPLIT_ROWS, 2},
    [TPD_P_FCB] = {"fcb", 1, TPD_LAYERS_DENSE, 0, TPD_SPLIT_ROWS, 0},
    [TPD_P_FCPROJW] = {"fcprojw", 1, TPD_LAYERS_DENSE, 1, TPD_SPLIT_COLS, 3},
    [TPD_P_FCPROJB] = {"fcprojb", 1, TPD_LAYERS_DENSE, 0, TPD_SPLIT_NONE, 0},
    [TPD_P_LNFW] = {"lnfw", 0, TPD_LAYERS_ALL, 0, TPD_SPLIT_NONE, 1},
    [TPD_P_LNFB] = {"lnfb", 0, TPD_LAYERS_ALL, 0, TPD_SPLIT_NONE, 0},
    [TPD_P_LMHEAD] = {"lmhead", 0, TPD_LAYERS_ALL, 1, TPD_SPLIT_VOCAB, 2},
    [TPD_P_ROUTERW] = {"routerw", 1, TPD_LAYERS_MOE, 1, TPD_SPLIT_NONE, 2},
    [TPD_P_EXPFCW] = {"expfcw", 1, TPD_LAYERS_MOE, 1, TPD_SPLIT_EXPERT, 2},
    [TPD_P_EXPFCB] = {"expfcb", 1, TPD_LAYERS_MOE, 0, TPD_SPLIT_EXPERT, 0},
    [TPD_P_EXPPROJW] = {"expprojw", 1, TPD_LAYERS_MOE, 1, TPD_SPLIT_COLS, 3},
    [TPD_P_EXPPROJB] = {"expprojb", 1, TPD_LAYERS_MOE, 0, TPD_SPLIT_NONE, 0},
    [TPD_P_SHGATEW] = {"shgatew", 1, TPD_LAYERS_MOE, 1, TPD_SPLIT_NONE, 2},
    [TPD_P_QNORMW] = {"qnormw", 1, TPD_LAYERS_ALL, 0, TPD_SPLIT_NONE, 1},
    [TPD_P_KNORMW] = {"knormw", 1, TPD_LAYERS_ALL, 0, TPD_SPLIT_NONE, 1},
    /* TPD_SPLIT_GLU under SwiGLU, as fcw */
    [TPD_P_SHFCW] = {"shfcw", 1, TPD_LAYERS_MOE, 1, TPD_SPLIT_ROWS, 2},
    [TPD_P_SHFCB] = {"shfcb", 1, TPD_LAYERS_MOE, 0, TPD_SPLIT_ROWS, 0},
    [TPD_P_SHPROJW] = {"shprojw", 1, TPD_LAYERS_MOE, 1, TPD_SPLIT_COLS, 3},
    [TPD_P_SHPROJB] = {"shprojb", 1, TPD_LAYERS_MOE, 0, TPD_SPLIT_NONE, 0},
};

/* Layers of kind k among [0, g), of which moe are MoE layers. */
static int kind_of_count(tpd_layer_kind k, int g, int moe) {
    return k == TPD_LAYERS_ALL ? g : k == TPD_LAYERS_MOE ? moe : g - moe;
}

/* Global layers of kind k among [0, g). */
static int kind_before(const tpd_config *cfg, tpd_layer_kind k, int g) {
    return kind_of_count(k, g, tpd_config_moe_layers_before(cfg, g));
}

int tpd_model_has_param(const tpd_config *cfg, tpd_param p) {
    const tpd_config_model *m = &cfg->model;
    switch (p) {
    case TPD_P_WPE:
        return m->position_embedding_type == TPD_POS_LEARNED;
    case TPD_P_LN1B:
    case TPD_P_LN2B:
    case TPD_P_LNFB:
        return m->normalization == TPD_NORM_LAYERNORM;
    case TPD_P_QKVB:
        return tpd_config_qkv_bias(cfg);
    case TPD_P_ATTPROJB:
        return m->add_bias_linear;
    case TPD_P_FCW:
    case TPD_P_FCPROJW: /* the dense layers' MLP */
        return kind_before(cfg, TPD_LAYERS_DENSE, m->num_layers) > 0;
    case TPD_P_FCB:
    case TPD_P_FCPROJB:
        return m->add_bias_linear && kind_before(cfg, TPD_LAYERS_DENSE, m->num_layers) > 0;
    case TPD_P_SHFCW:
    case TPD_P_SHPROJW:
        return m->num_moe_experts > 0 && m->moe_shared_expert_intermediate_size > 0;
    case TPD_P_SHFCB:
    case TPD_P_SHPROJB:
        return m->num_moe_experts > 0 && m->moe_shared_expert_intermediate_size > 0 &&
               m->add_bias_linear;
    case TPD_P_LMHEAD:
        return m->untie_embeddings_and_output_weights;
    case TPD_P_ROUTERW:
    case TPD_P_EXPFCW:
    case TPD_P_EXPPROJW:
        return m->num_moe_experts > 0;
    case TPD_P_EXPFCB:
    case TPD_P_EXPPROJB:
        return m->num_moe_experts > 0 && m->add_bias_linear;
    case TPD_P_SHGATEW:
        return m->num_moe_experts > 0 && m->moe_shared_expert_gate;
    case TPD_P_QNORMW:
    case TPD_P_KNORMW:
        return m->qk_layernorm;
    default:
        return p >= 0 && p < TPD_P_COUNT;
    }
}

int tpd_model_expert_align(const tpd_config *cfg, int dp) {
    return tpd_config_ep(cfg) > 1 && cfg->parallel.use_distributed_optimizer && dp > 1 &&
                   cfg->parallel.data_parallel_sharding_strategy < TPD_DP_SHARDING_OPTIM_GRADS
               ? dp
               : 1;
}

int tpd_param_is_expert(tpd_param p) {
    return p == TPD_P_EXPFCW || p == TPD_P_EXPFCB || p == TPD_P_EXPPROJW || p == TPD_P_EXPPROJB;
}

const tpd_param_info *tpd_param_get_info(tpd_param p) {
    return (p >= 0 && p < TPD_P_COUNT) ? &g_info[p] : NULL;
}

tpd_status tpd_model_dims_init(const tpd_config *cfg, int tp_size, int tp_rank, int pp_size,
                               int stage, tpd_model_dims *dims_p) {
    const tpd_config_model *m = &cfg->model;
    tpd_model_dims d;
    memset(&d, 0, sizeof d);
    d.L = m->num_layers;
    d.C = m->hidden_size;
    d.NH = m->num_attention_heads;
    d.F = m->ffn_hidden_size;
    if (m->num_moe_experts > 0) {
        d.E = m->num_moe_experts;
        d.topk = m->moe_router_topk;
        d.moe_freq = m->moe_layer_freq > 0 ? m->moe_layer_freq : 1;
        d.Fe = tpd_config_moe_ffn(cfg);
        d.Fs = m->moe_shared_expert_intermediate_size;
        d.shgate = m->moe_shared_expert_gate;
    }
    d.ep_size = 1;
    d.El = d.E;
    d.V = m->vocab_size;
    d.maxT = m->max_position_embeddings;
    /* context parallelism: this rank's two chunks of each sequence (2 x CP chunks, rank r
     * holds chunks r and 2CP-1-r) */
    d.cp_size = tpd_config_cp(cfg);
    d.Tg = m->seq_length;
    if (d.cp_size > 1 && m->seq_length % (2 * d.cp_size)) {
        tpd_log_error("model: seq_length %d does not split into 2 x context_parallel_size (%d) "
                      "chunks",
                      m->seq_length, 2 * d.cp_size);
        return TPD_ERR_INVALID;
    }
    d.T = m->seq_length / d.cp_size;
    d.cp_a2a = d.cp_size > 1 && cfg->parallel.cp_comm_type == TPD_CP_COMM_A2A;
    d.B = cfg->training.micro_batch_size;
    if (d.E && m->moe_expert_capacity_factor > 0) /* as the router counts it */
        d.moe_cap = (int)ceil(m->moe_expert_capacity_factor * (double)d.B * d.T * d.topk / d.E);
    d.tp_size = tp_size;
    d.tp_rank = tp_rank;
    d.pp_size = pp_size;
    d.stage = stage;
    d.NKV = tpd_config_kv_heads(cfg);
    if ((d.F < 1 && !d.E) || d.maxT < 1 || (d.E && (d.Fe < 1 || d.Fe % tp_size))) {
        tpd_log_error("model: ffn_hidden_size %d or max_position_embeddings %d is unresolved "
                      "(tpd_config_resolve fills them)",
                      d.F, d.maxT);
        return TPD_ERR_INVALID;
    }
    if (d.NH < 1 || (!m->kv_channels && d.C % d.NH) || d.NH % tp_size || d.F % tp_size ||
        d.Fs % tp_size || d.NKV < 1 || d.NH % d.NKV || d.NKV % tp_size || stage < 0 ||
        stage >= pp_size || tp_rank < 0 || tp_rank >= tp_size) {
        tpd_log_error("model: hidden %d, heads %d, K/V heads %d, ffn %d do not split over TP %d "
                      "(stage %d of %d)",
                      d.C, d.NH, d.NKV, d.F, tp_size, stage, pp_size);
        return TPD_ERR_INVALID;
    }
    d.HS = tpd_config_head_dim(cfg); /* C / NH unless model.kv_channels says otherwise */
    d.NHl = d.NH / tp_size;
    d.KVl = d.NKV / tp_size;
    d.Cl = d.NHl * d.HS;
    d.Fl = d.F / tp_size;
    d.glu = m->swiglu;
    d.rope = m->position_embedding_type == TPD_POS_ROPE;
    d.rms = m->normalization == TPD_NORM_RMSNORM;
    d.qkn = m->qk_layernorm;
    d.bias = m->add_bias_linear;
    d.tied = !m->untie_embeddings_and_output_weights;
    d.QKVl = (d.NHl + 2 * d.KVl) * d.HS;
    d.FCl = d.glu ? 2 * d.Fl : d.Fl;
    d.Fsl = d.Fs / tp_size;
    d.FCsl = d.glu ? 2 * d.Fsl : d.Fsl;
    if (tpd_model_has_param(cfg, TPD_P_FCW)) {
        d.Fml = d.Fl;
        d.FCml = d.FCl;
    }
    if (d.Fsl > d.Fml) {
        d.Fml = d.Fsl;
        d.FCml = d.FCsl;
    }
    d.Fel = d.Fe / tp_size;
    d.FCel = d.glu ? 2 * d.Fel : d.Fel;
    d.Vp = tpd_config_padded_vocab(cfg, tp_size);
    if (d.Vp < 1 || (int64_t)d.B * d.T > INT_MAX) {
        tpd_log_error("model: vocab %d padded to a multiple of %d * TP %d, or micro-batch %d * "
                      "seq_length %d tokens, does not fit in 32 bits",
                      d.V, m->make_vocab_size_divisible_by, tp_size, d.B, d.T);
        return TPD_ERR_INVALID;
    }
    d.Vl = d.Vp / tp_size;
    d.v0 = tp_rank * d.Vl;
    d.Vvalid = d.V - d.v0 < 0 ? 0 : (d.V - d.v0 > d.Vl ? d.Vl : d.V - d.v0);
    d.first = stage == 0;
    d.last = stage == pp_size - 1;
    /* Megatron's virtual stages: chunk c of this stage is virtual stage c*PP + stage */
    d.v = cfg->parallel.virtual_pipeline_model_parallel_size > 0
              ? cfg->parallel.virtual_pipeline_model_parallel_size
              : 1;
    for (int k = 0; k < d.v; k++) {
        int n = tpd_config_stage_layers(cfg, pp_size, d.v, stage, k, &d.chunk_g0[k]);
        d.chunk_l0[k] = d.Ls;
        d.chunk_layers[k] = n < 0 ? 0 : n; /* no split: a stage without layers */
        d.Ls += d.chunk_layers[k];
    }
    /* test-only (base/fault.h): a stage split that loses a layer, as `tripod verify` must
     * catch */
    int drop_stage;
    if (pp_size > 1 && tpd_fault("drop-layer", 1, &drop_stage) && drop_stage == stage)
        for (int k = d.v - 1; k >= 0; k--)
            if (d.chunk_layers[k] > 0) {
                d.chunk_layers[k]--;
                d.Ls--;
                break;
            }
    d.sp = cfg->parallel.sequence_parallel && tp_size > 1;
    d.Nl = d.B * d.T;
    if (d.sp) {
        if (d.T % tp_size) {
            tpd_log_error("model: seq_length %d does not split over TP %d (sequence parallel)", d.T,
                          tp_size);
            return TPD_ERR_INVALID;
        }
        d.Nl /= tp_size;
    }
    *dims_p = d;
    return TPD_OK;
}

tpd_status tpd_model_layout_init(const tpd_config *cfg, int tp_size, int tp_rank, int pp_size,
                                 int stage, tpd_model_layout *lay_p) {
    return tpd_model_layout_init_ep(cfg, tp_size, tp_rank, pp_size, stage, 1, 0, 1, lay_p);
}

tpd_status tpd_model_layout_init_ep(const tpd_config *cfg, int tp_size, int tp_rank, int pp_size,
                                    int stage, int ep_size, int ep_rank, int align,
                                    tpd_model_layout *lay_p) {
    tpd_model_layout lay;
    memset(&lay, 0, sizeof lay);
    TPD_CHECK(tpd_model_dims_init(cfg, tp_size, tp_rank, pp_size, stage, &lay.d));
    if (ep_size > 1) {
        if (!lay.d.E || lay.d.E % ep_size || ep_rank < 0 || ep_rank >= ep_size) {
            tpd_log_error("model: %d experts do not split over EP %d (rank %d)", lay.d.E, ep_size,
                          ep_rank);
            return TPD_ERR_INVALID;
        }
        lay.d.ep_size = ep_size;
        lay.d.ep_rank = ep_rank;
        lay.d.El = lay.d.E / ep_size;
        lay.d.e0 = ep_rank * lay.d.El;
    }
    const tpd_model_dims *d = &lay.d;
    const int ep = d->ep_size > 1; /* the experts in a region of their own, first */
    /* global rows, cols per layer */
    int qkv = (d->NH + 2 * d->NKV) * d->HS, fc = d->glu ? 2 * d->F : d->F;
    int shfc = d->glu ? 2 * d->Fs : d->Fs;
    int efc = (d->glu ? 2 : 1) * d->Fe; /* one expert's fc rows */
    const int g_shape[TPD_P_COUNT][2] = {
        [TPD_P_WTE] = {d->V, d->C},
        [TPD_P_WPE] = {d->maxT, d->C},
        [TPD_P_LN1W] = {d->C, 1},
        [TPD_P_LN1B] = {d->C, 1},
        [TPD_P_QKVW] = {qkv, d->C},
        [TPD_P_QKVB] = {qkv, 1},
        [TPD_P_ATTPROJW] = {d->C, d->NH * d->HS},
        [TPD_P_ATTPROJB] = {d->C, 1},
        [TPD_P_LN2W] = {d->C, 1},
        [TPD_P_LN2B] = {d->C, 1},
        [TPD_P_FCW] = {fc, d->C},
        [TPD_P_FCB] = {fc, 1},
        [TPD_P_FCPROJW] = {d->C, d->F},
        [TPD_P_FCPROJB] = {d->C, 1},
        [TPD_P_LNFW] = {d->C, 1},
        [TPD_P_LNFB] = {d->C, 1},
        [TPD_P_LMHEAD] = {d->V, d->C},
        [TPD_P_ROUTERW] = {d->E, d->C},
        [TPD_P_EXPFCW] = {d->E * efc, d->C},
        [TPD_P_EXPFCB] = {d->E * efc, 1},
        [TPD_P_EXPPROJW] = {d->E * d->C, d->Fe},
        [TPD_P_EXPPROJB] = {d->E * d->C, 1},
        [TPD_P_SHGATEW] = {1, d->C},
        [TPD_P_QNORMW] = {d->HS, 1},
        [TPD_P_KNORMW] = {d->HS, 1},
        [TPD_P_SHFCW] = {shfc, d->C},
        [TPD_P_SHFCB] = {shfc, 1},
        [TPD_P_SHPROJW] = {d->C, d->Fs},
        [TPD_P_SHPROJB] = {d->C, 1},
    };
    /* local layers of each kind */
    int nmoe = tpd_model_dims_moe_before(d, d->Ls);
    const int kl[3] = {d->Ls, d->Ls - nmoe, nmoe};
    /* the tensors this model has at all (tpd_model_has_param) */
    int has[TPD_P_COUNT];
    for (int p = 0; p < TPD_P_COUNT; p++)
        has[p] = tpd_model_has_param(cfg, (tpd_param)p);
    /* shapes and presence first, then the layer-major offsets */
    for (int p = 0; p < TPD_P_COUNT; p++) {
        const tpd_param_info *in = &g_info[p];
        tpd_param_slice *s = &lay.p[p];
        s->g_rows = g_shape[p][0];
        s->g_cols = g_shape[p][1];
        s->kind = in->kind;
        s->g_layers = !has[p] ? 0 : in->per_layer ? kind_before(cfg, in->kind, d->L) : 1;
        if (!has[p])
            s->present = 0;
        else if (in->per_layer)
            s->present = kl[in->kind] > 0;
        else if (p == TPD_P_WTE)
            s->present = d->first || (d->last && d->tied);
        else if (p == TPD_P_WPE)
            s->present = d->first;
        else
            s->present = d->last;
        if (!s->present) continue;
        s->layers = in->per_layer ? kl[in->kind] : 1;
        s->rows = s->g_rows;
        s->cols = s->g_cols;
        s->split = in->split;
        if (d->glu && (p == TPD_P_FCW || p == TPD_P_FCB || p == TPD_P_SHFCW || p == TPD_P_SHFCB))
            s->split = TPD_SPLIT_GLU;
        switch (s->split) {
        case TPD_SPLIT_ROWS:
        case TPD_SPLIT_GLU:
        case TPD_SPLIT_EXPERT:
            s->rows = s->g_rows / d->tp_size;
            break;
        case TPD_SPLIT_QKV:
            s->rows = d->QKVl;
            break;
        case TPD_SPLIT_COLS:
            s->cols = s->g_cols / d->tp_size;
            break;
        case TPD_SPLIT_VOCAB:
            s->rows = d->Vl;
            break;
        default:
            break;
        }
        if (tpd_param_is_expert((tpd_param)p)) s->rows = s->rows / d->E * d->El; /* EP */
        /* Replicated tensors count once over TP; the tied wte counts on the first stage
         * only (the last stage's copy is identical). */
        s->tp_counted = (in->split == TPD_SPLIT_NONE) ? d->tp_rank == 0 : 1;
        if (p == TPD_P_WTE && !d->first) s->tp_counted = 0;
        s->numel = (size_t)s->layers * (size_t)s->rows * (size_t)s->cols;
    }
    /* wte, wpe; one block per local layer (a dense layer's or a MoE layer's tensors); lnfw,
     * lnfb, lmhead. Under EP the experts' tensors leave the layer blocks for a region before
     * wte, one expert block per local MoE layer: the region is summed over the expert-DP
     * group, the rest over DP, and it is final (in the embedding's hook unit) only when the
     * whole backward is. */
    for (int p = 0; p < TPD_P_COUNT; p++) {
        tpd_param_slice *s = &lay.p[p];
        if (!s->present || !g_info[p].per_layer) continue;
        size_t piece = (size_t)s->rows * (size_t)s->cols;
        if (ep && tpd_param_is_expert((tpd_param)p)) {
            s->koff[TPD_LAYERS_MOE] = lay.eblock;
            lay.eblock += piece;
            continue;
        }
        /* a tensor of every layer has a place in both kinds' blocks */
        for (int k = TPD_LAYERS_DENSE; k <= TPD_LAYERS_MOE; k++)
            if (s->kind == TPD_LAYERS_ALL || (int)s->kind == k) {
                s->koff[k] = lay.block[k];
                lay.block[k] += piece;
            }
    }
    size_t off = lay.eblock * (size_t)nmoe;
    if (ep && align > 1) off = (off + (size_t)align - 1) / (size_t)align * (size_t)align;
    lay.expert_numel = off;
    for (int p = 0; p < TPD_P_COUNT; p++) {
        tpd_param_slice *s = &lay.p[p];
        if (!s->present || g_info[p].per_layer || p >= TPD_P_LNFW) continue;
        s->offset = off;
        off += s->numel;
    }
    lay.layers0 = off;
    off += lay.block[TPD_LAYERS_DENSE] * (size_t)(d->Ls - nmoe) +
           lay.block[TPD_LAYERS_MOE] * (size_t)nmoe;
    for (int p = TPD_P_LNFW; p <= TPD_P_LMHEAD; p++) {
        tpd_param_slice *s = &lay.p[p];
        if (!s->present) continue;
        s->offset = off;
        off += s->numel;
    }
    lay.numel = off;
    for (int p = 0; p < TPD_P_COUNT; p++)
        if (lay.p[p].present && g_info[p].per_layer)
            lay.p[p].offset = tpd_model_layout_piece(&lay, (tpd_param)p, 0);
    *lay_p = lay;
    return TPD_OK;
}

int tpd_model_dims_layer_moe(const tpd_model_dims *d, int l) {
    return d->moe_freq > 0 && tpd_model_dims_global_layer(d, l) % d->moe_freq == 0;
}

int tpd_model_dims_moe_before(const tpd_model_dims *d, int l) {
    if (d->moe_freq <= 0) return 0;
    int n = 0, f = d->moe_freq;
    for (int k = 0; k < d->v; k++) {
        int m = l - d->chunk_l0[k];
        if (m <= 0) continue;
        if (m > d->chunk_layers[k]) m = d->chunk_layers[k];
        int g0 = d->chunk_g0[k]; /* MoE layers among [g0, g0 + m) */
        n += tpd_config_freq_layers_before(f, g0 + m) - tpd_config_freq_layers_before(f, g0);
    }
    return n;
}

int tpd_model_layout_layer_has(const tpd_model_layout *lay, tpd_param p, int l) {
    const tpd_param_slice *s = &lay->p[p];
    if (!s->present) return 0;
    if (s->kind == TPD_LAYERS_ALL) return 1;
    return tpd_model_dims_layer_moe(&lay->d, l) == (s->kind == TPD_LAYERS_MOE);
}

/* Local layer l's block in the flat buffer. */
static size_t layer_base(const tpd_model_layout *lay, int l) {
    size_t nm = (size_t)tpd_model_dims_moe_before(&lay->d, l);
    return lay->layers0 + nm * lay->block[TPD_LAYERS_MOE] +
           ((size_t)l - nm) * lay->block[TPD_LAYERS_DENSE];
}

size_t tpd_model_layout_layer_piece(const tpd_model_layout *lay, tpd_param p, int l) {
    const tpd_param_slice *s = &lay->p[p];
    if (!g_info[p].per_layer) return s->offset;
    int moe = tpd_model_dims_layer_moe(&lay->d, l);
    size_t koff = s->koff[moe ? TPD_LAYERS_MOE : TPD_LAYERS_DENSE];
    if (lay->expert_numel > 0 && tpd_param_is_expert(p))
        return (size_t)tpd_model_dims_moe_before(&lay->d, l) * lay->eblock + koff;
    return layer_base(lay, l) + koff;
}

/* The local layer of p's j-th piece: j itself where every local layer has p. */
static int kind_layer(const tpd_model_layout *lay, tpd_param p, int j) {
    const tpd_param_slice *s = &lay->p[p];
    if (s->kind == TPD_LAYERS_ALL || s->layers == lay->d.Ls) return j;
    for (int l = 0, n = 0; l < lay->d.Ls; l++)
        if (tpd_model_dims_layer_moe(&lay->d, l) == (s->kind == TPD_LAYERS_MOE) && n++ == j)
            return l;
    return j;
}

size_t tpd_model_layout_piece(const tpd_model_layout *lay, tpd_param p, int j) {
    if (!g_info[p].per_layer) return lay->p[p].offset;
    return tpd_model_layout_layer_piece(lay, p, kind_layer(lay, p, j));
}

int64_t tpd_model_layout_row_global(const tpd_model_layout *lay, tpd_param p, int64_t r) {
    const tpd_param_slice *s = &lay->p[p];
    const tpd_model_dims *d = &lay->d;
    int64_t l = r / s->rows, row = r % s->rows, col0 = 0, grow = row;
    int64_t gl = 0; /* the global layer's place in p's stack (its kind's layers) */
    if (g_info[p].per_layer)
        gl = tpd_model_layout_stack_index(
            lay, p, tpd_model_dims_global_layer(d, kind_layer(lay, p, (int)l)));
    switch (s->split) {
    case TPD_SPLIT_ROWS:
        grow = (int64_t)d->tp_rank * s->rows + row;
        break;
    case TPD_SPLIT_QKV: {
        /* local [Q (NHl heads); K (KVl heads); V (KVl heads)] of global [Q; K; V] */
        int64_t q = (int64_t)d->NHl * d->HS, kv = (int64_t)d->KVl * d->HS;
        int64_t gq = (int64_t)d->NH * d->HS, gkv = (int64_t)d->NKV * d->HS;
        if (row < q)
            grow = (int64_t)d->tp_rank * q + row;
        else if (row < q + kv)
            grow = gq + (int64_t)d->tp_rank * kv + (row - q);
        else
            grow = gq + gkv + (int64_t)d->tp_rank * kv + (row - q - kv);
        break;
    }
    case TPD_SPLIT_GLU: {
        int64_t half = s->rows / 2; /* F/tp rows of each of gate and up */
        grow = (row / half) * (s->g_rows / 2) + (int64_t)d->tp_rank * half + row % half;
        break;
    }
    case TPD_SPLIT_EXPERT: {
        /* expert e's local rows [FCel) of its global [FCe) (each half split under SwiGLU);
         * under EP local expert e is global expert e0 + e */
        int64_t per = s->rows / d->El, e = row / per, r = row % per, gper = s->g_rows / d->E;
        e += d->e0;
        int64_t half = d->glu ? per / 2 : per;
        grow =
            e * gper + (r / half) * (d->glu ? gper / 2 : 0) + (int64_t)d->tp_rank * half + r % half;
        break;
    }
    case TPD_SPLIT_COLS:
        col0 = (int64_t)d->tp_rank * s->cols;
        if (p == TPD_P_EXPPROJW) grow += (int64_t)d->e0 * d->C; /* EP: rows of C per expert */
        break;
    case TPD_SPLIT_VOCAB:
        grow = (int64_t)d->v0 + row;
        if (grow >= d->V) return -1;
        break;
    default:
        if (p == TPD_P_EXPPROJB) grow += (int64_t)d->e0 * d->C;
        break;
    }
    return (gl * s->g_rows + grow) * s->g_cols + col0;
}

int tpd_model_layout_stack_index(const tpd_model_layout *lay, tpd_param p, int g) {
    if (!g_info[p].per_layer) return 0;
    return kind_of_count(g_info[p].kind, g, tpd_config_freq_layers_before(lay->d.moe_freq, g));
}

int tpd_model_dims_global_layer(const tpd_model_dims *d, int l) {
    for (int k = d->v - 1; k >= 0; k--)
        if (l >= d->chunk_l0[k]) return d->chunk_g0[k] + (l - d->chunk_l0[k]);
    return l;
}

size_t tpd_model_layout_global_numel(const tpd_model_layout *lay, tpd_param p) {
    const tpd_param_slice *s = &lay->p[p];
    return (size_t)s->g_layers * (size_t)s->g_rows * (size_t)s->g_cols;
}

float tpd_model_init_value(const tpd_config *cfg, tpd_param p, int64_t gi) {
    double std = cfg->model.init_method_std;
    switch (g_info[p].init) {
    case 0:
        return 0.0f;
    case 1:
        return 1.0f;
    case 3:
        std /= sqrt(2.0 * cfg->model.num_layers); /* fall through */
    case 2:
        return (float)(std * tpd_rng_normal(cfg->training.seed, 1000 + (uint64_t)p, (uint64_t)gi));
    }
    return 0.0f;
}

void tpd_model_layout_unit_bounds(const tpd_model_layout *lay, size_t *bounds) {
    int Ls = lay->d.Ls;
    bounds[0] = lay->expert_numel;
    for (int l = 0; l < Ls; l++)
        bounds[l + 1] = layer_base(lay, l);
    const tpd_param_slice *lnf = &lay->p[TPD_P_LNFW];
    bounds[Ls + 1] = lnf->present ? lnf->offset : lay->numel;
    bounds[Ls + 2] = lay->numel;
}

void tpd_model_layout_expert_bounds(const tpd_model_layout *lay, size_t *bounds) {
    int Ls = lay->d.Ls;
    for (int l = 0; l < Ls; l++)
        bounds[l] = (size_t)tpd_model_dims_moe_before(&lay->d, l) * lay->eblock;
    bounds[Ls] = lay->expert_numel; /* the region's padding with the last layer */
}
