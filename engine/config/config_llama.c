/* The relations between the Llama block's keys (grouped-query attention, rotary positions,
 * RoPE scaling), checked after a load. */
#include "engine/config/config_loader.h"

/* The Llama block's keys (grouped-query attention, rotary positions). Megatron's wording
 * where it has one. */
tpd_status tpd_cfg_check_llama(cfg_loader *ld) {
    const tpd_config_model *m = &ld->cfg->model;
    const int tp = ld->cfg->parallel.tensor_model_parallel_size;
    const int heads = m->num_attention_heads, groups = m->num_query_groups;
    const char *k = "model.num_query_groups";
    if (m->group_query_attention) {
        if (heads % groups)
            return tpd_cfg_fail(
                ld, tpd_cfg_at(ld, k, "model.group_query_attention"), k,
                "num_attention_heads (%d) must be a multiple of num_query_groups (%d) "
                "(each K/V head serves an equal group of query heads)",
                heads, groups);
        if (groups % tp) {
            int fit = tp; /* the largest TP that would split the groups */
            while (groups % fit)
                fit--;
            return tpd_cfg_fail(ld, tpd_cfg_at(ld, k, "parallel.tensor_model_parallel_size"), k,
                                "num_query_groups (%d) must be a multiple of "
                                "tensor_model_parallel_size (%d): the K/V heads are split over the "
                                "TP ranks by whole groups and never replicated (use "
                                "tensor_model_parallel_size %d, or more query groups)",
                                groups, tp, fit);
        }
    } else if (groups != 1 && groups != heads) {
        /* Megatron ignores num_query_groups without --group-query-attention; a stated group
         * count that silently became one K/V head per query head would change the model's
         * size and its checkpoints' shapes, so it is an error here. */
        return tpd_cfg_fail(ld, tpd_cfg_at(ld, k, "model.group_query_attention"), k,
                            "%d needs group_query_attention true; without it every query head has "
                            "its own K/V head (%d of them) (set model.group_query_attention: true, "
                            "or leave num_query_groups out)",
                            groups, heads);
    }
    k = "model.position_embedding_type";
    int head_size = m->hidden_size / heads;
    if (m->position_embedding_type == TPD_POS_ROPE && head_size % 2)
        return tpd_cfg_fail(ld, tpd_cfg_at(ld, k, "model.hidden_size"), k,
                            "rope needs an even head size, but hidden_size / num_attention_heads = "
                            "%d / %d = %d (RoPE rotates pairs of a head's dimensions)",
                            m->hidden_size, heads, head_size);
    k = "model.rotary_percent";
    if (m->rotary_percent != 1.0) {
        char v[32];
        tpd_cfg_fmt_double(m->rotary_percent, v, sizeof v);
        return tpd_cfg_fail(
            ld, tpd_cfg_at(ld, k, NULL), k,
            "%s is not supported: RoPE rotates whole heads here (1.0, as in Llama); "
            "partial rotary (GPT-NeoX's, Megatron's --rotary-percent below 1) is "
            "refused",
            v);
    }
    k = "model.rope_scaling_high_freq_factor";
    if (m->rope_scaling && !(m->rope_scaling_high_freq_factor > m->rope_scaling_low_freq_factor))
        return tpd_cfg_fail(ld, tpd_cfg_at(ld, k, "model.rope_scaling"), k,
                            "must exceed model.rope_scaling_low_freq_factor (%g), or no wavelength "
                            "lies between the kept and the scaled ones",
                            m->rope_scaling_low_freq_factor);
    k = "model.rope_scaling";
    if (m->rope_scaling && m->position_embedding_type != TPD_POS_ROPE)
        return tpd_cfg_fail(ld, tpd_cfg_at(ld, k, NULL), k,
                            "scales rotary frequencies; it needs position_embedding_type: rope");
    k = "model.qk_layernorm";
    if (m->qk_layernorm && m->normalization != TPD_NORM_RMSNORM)
        return tpd_cfg_fail(ld, tpd_cfg_at(ld, k, "model.normalization"), k,
                            "true normalizes each Q and K head with RMSNorm (Qwen3's q_norm and "
                            "k_norm); it needs normalization: RMSNorm");
    return TPD_OK;
}
