#include "engine/model/model_flops.h"

double tpd_model_layer_fwd_flops_per_token(const tpd_config *cfg) {
    double h = cfg->model.hidden_size, s = cfg->model.seq_length;
    double f = cfg->model.ffn_hidden_size > 0 ? cfg->model.ffn_hidden_size : 4.0 * h;
    return 2.0 * (4.0 * h * h + 2.0 * h * f) + 4.0 * s * h;
}

double tpd_model_flops(const tpd_config *cfg, double batch, double vocab) {
    double tokens = batch * cfg->model.seq_length, h = cfg->model.hidden_size;
    return 3.0 * tokens *
           (cfg->model.num_layers * tpd_model_layer_fwd_flops_per_token(cfg) + 2.0 * h * vocab);
}
