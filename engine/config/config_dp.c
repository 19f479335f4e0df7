/* The relations between the data-parallel keys: DiLoCo's section, and the two names of
 * ZeRO-1 (parallel.use_distributed_optimizer and parallel.data_parallel_sharding_strategy)
 * with the one rule that makes them agree. */
#include "engine/config/config_loader.h"

/* The diloco section's relations (read only under parallel.dp_sync: diloco). */
static tpd_status check_diloco(cfg_loader *ld) {
    const tpd_config_diloco *d = &ld->cfg->diloco;
    if (ld->cfg->parallel.dp_sync != TPD_DP_SYNC_DILOCO) return TPD_OK;
    const char *k = "diloco.fragments";
    if (d->sync_interval % d->fragments)
        return tpd_cfg_fail(
            ld, tpd_cfg_at(ld, k, "diloco.sync_interval"), k,
            "%d must divide sync_interval (%d): Streaming DiLoCo syncs the fragments "
            "sync_interval / fragments steps apart",
            d->fragments, d->sync_interval);
    k = "diloco.overlap_steps";
    if (d->overlap_steps >= d->sync_interval / d->fragments)
        return tpd_cfg_fail(ld, tpd_cfg_at(ld, k, "diloco.sync_interval"), k,
                            "%d must be below sync_interval / fragments (%d / %d = %d): a "
                            "fragment's outer all-reduce is applied before the next fragment's "
                            "starts",
                            d->overlap_steps, d->sync_interval, d->fragments,
                            d->sync_interval / d->fragments);
    return TPD_OK;
}

tpd_status tpd_cfg_check_dp(cfg_loader *ld) {
    return check_diloco(ld);
}

void tpd_cfg_sharding_rule(tpd_config_parallel *p) {
    if (p->use_distributed_optimizer &&
        p->data_parallel_sharding_strategy == TPD_DP_SHARDING_NO_SHARD)
        p->data_parallel_sharding_strategy = TPD_DP_SHARDING_OPTIM;
    if (p->data_parallel_sharding_strategy != TPD_DP_SHARDING_NO_SHARD)
        p->use_distributed_optimizer = 1;
}

tpd_status tpd_cfg_check_sharding_stated(cfg_loader *ld) {
    const tpd_config_parallel *p = &ld->cfg->parallel;
    const char *k = "parallel.data_parallel_sharding_strategy",
               *z = "parallel.use_distributed_optimizer";
    if (tpd_cfg_where(ld, k)->origin == CFG_DEFAULT || tpd_cfg_where(ld, z)->origin == CFG_DEFAULT)
        return TPD_OK;
    const int shards = p->data_parallel_sharding_strategy != TPD_DP_SHARDING_NO_SHARD;
    if (shards == !!p->use_distributed_optimizer) return TPD_OK;
    const char *name = tpd_config_choice(k, p->data_parallel_sharding_strategy);
    return tpd_cfg_fail(ld, tpd_cfg_where(ld, k), k,
                        "%s disagrees with %s: %s (both are stated; use_distributed_optimizer "
                        "is strategy optim's older name: set it true with optim, optim_grads or "
                        "optim_grads_params, false with no_shard, or state only one of them)",
                        name, z, p->use_distributed_optimizer ? "true" : "false");
}
