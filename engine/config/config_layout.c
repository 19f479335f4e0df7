/* A config's model and run at another parallel layout: the one place that rewrites the
 * layout fields of a config, so that every copy made for another layout (the one-rank
 * reference of `tripod verify`, sampling, a checkpoint's ranks) carries the same complete
 * and consistent set of them. */
#include "engine/config/config.h"
#include "engine/config/config_internal.h"

#include <string.h>

void tpd_config_layout_get(const tpd_config *cfg, tpd_config_layout *lay_p) {
    const tpd_config_parallel *p = &cfg->parallel;
    const tpd_config_training *t = &cfg->training;
    tpd_config_layout l = {
        .tp = p->tensor_model_parallel_size,
        .pp = p->pipeline_model_parallel_size,
        .dp = p->data_parallel_size,
        .vpp = p->virtual_pipeline_model_parallel_size,
        .distributed_optimizer = p->use_distributed_optimizer,
        .sequence_parallel = p->sequence_parallel,
        .recompute = t->recompute,
        .recompute_num_layers = t->recompute_num_layers,
        .micro_batch_size = t->micro_batch_size,
        .global_batch_size = t->global_batch_size,
        .sharding = p->data_parallel_sharding_strategy,
        .shard_size = p->data_parallel_shard_size,
        .cp = p->context_parallel_size,
        .ep = p->expert_model_parallel_size,
    };
    *lay_p = l;
}

void tpd_config_relayout(const tpd_config *src, const tpd_config_layout *to, tpd_config *out_p) {
    tpd_config c = *src;
    tpd_config_parallel *p = &c.parallel;
    tpd_config_training *t = &c.training;
    /* virtual stages interleave across stages: none without a pipeline */
    const int vpp = to->pp > 1 && to->vpp > 1 ? to->vpp : 1;
    /* a stated split describes one pipeline: at another its entries mean other stages */
    if (to->pp != p->pipeline_model_parallel_size ||
        vpp != p->virtual_pipeline_model_parallel_size) {
        p->num_pipeline_layers = 0;
        memset(p->pipeline_layers, 0, sizeof p->pipeline_layers);
    }
    p->tensor_model_parallel_size = to->tp;
    p->pipeline_model_parallel_size = to->pp;
    p->data_parallel_size = to->dp;
    p->context_parallel_size = to->cp > 0 ? to->cp : 1;
    /* EP splits DP: only where it divides it */
    p->expert_model_parallel_size = to->ep > 1 && to->dp > 0 && to->dp % to->ep == 0 ? to->ep : 1;
    p->virtual_pipeline_model_parallel_size = vpp;
    /* one stage has no pipeline to schedule; interleaving needs the virtual stages */
    if (to->pp == 1 || (vpp == 1 && p->pipeline_schedule == TPD_SCHEDULE_INTERLEAVED))
        p->pipeline_schedule = TPD_SCHEDULE_1F1B;
    /* distributed_optimizer 0 is a copy without sharded state (one rank, weights only) */
    p->use_distributed_optimizer = to->distributed_optimizer;
    p->data_parallel_sharding_strategy =
        to->distributed_optimizer ? to->sharding : TPD_DP_SHARDING_NO_SHARD;
    tpd_cfg_sharding_rule(p);
    /* a shard group of consecutive DP ranks: only where it divides DP */
    p->data_parallel_shard_size = to->distributed_optimizer && to->shard_size > 0 && to->dp > 0 &&
                                          to->dp % to->shard_size == 0
                                      ? to->shard_size
                                      : 0;
    /* SP splits the sequence over the TP ranks, and the TP overlap hides SP's collectives */
    p->sequence_parallel = to->sequence_parallel && to->tp > 1;
    if (!p->sequence_parallel) p->tp_comm_overlap = 0;
    t->recompute = to->recompute;
    t->recompute_num_layers = to->recompute == TPD_RECOMPUTE_FULL ? to->recompute_num_layers : 0;
    if (to->micro_batch_size > 0) t->micro_batch_size = to->micro_batch_size;
    if (to->global_batch_size > 0) t->global_batch_size = to->global_batch_size;
    *out_p = c;
}
