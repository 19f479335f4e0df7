#include "engine/model/model_flops.h"

double tpd_model_layer_fwd_flops_per_token(const tpd_config *cfg) {
    return tpd_model_layer_kind_fwd_flops_per_token(cfg, tpd_config_moe(cfg));
}

double tpd_model_layers_fwd_flops_per_token(const tpd_config *cfg) {
    int L = cfg->model.num_layers, moe = tpd_config_moe_layers_before(cfg, L);
    return moe * tpd_model_layer_kind_fwd_flops_per_token(cfg, 1) +
           (L - moe) * tpd_model_layer_kind_fwd_flops_per_token(cfg, 0);
}

double tpd_model_layer_kind_fwd_flops_per_token(const tpd_config *cfg, int moe) {
    const tpd_config_model *m = &cfg->model;
    double h = m->hidden_size, s = m->seq_length;
    double f = m->ffn_hidden_size;
    double kv = (double)tpd_config_kv_heads(cfg) * tpd_config_head_dim(cfg); /* g*(h/a) */
    double q = tpd_config_q_width(cfg); /* h, unless model.kv_channels sets the head size */
    double mlp = m->swiglu ? 3.0 : 2.0;
    double router = 0.0;
    if (moe && m->num_moe_experts > 0) { /* the active experts, the shared ones, the router */
        f = m->moe_router_topk * (double)tpd_config_moe_ffn(cfg) +
            m->moe_shared_expert_intermediate_size;
        router = h * m->num_moe_experts;
    }
    return 2.0 * (2.0 * h * q + 2.0 * h * kv + mlp * h * f + router) + 4.0 * s * q;
}

double tpd_model_flops(const tpd_config *cfg, double batch, double vocab) {
    double tokens = batch * cfg->model.seq_length, h = cfg->model.hidden_size;
    return 3.0 * tokens * (tpd_model_layers_fwd_flops_per_token(cfg) + 2.0 * h * vocab);
}
