/* Private to engine/config/: the state of one load (where each key's value came from) and
 * the message helpers that the relations between keys use, shared by the loader
 * (config.c) and the files that hold groups of relations (config_llama.c, config_dp.c). */
#ifndef TPD_ENGINE_CONFIG_LOADER_H
#define TPD_ENGINE_CONFIG_LOADER_H

#include "engine/config/config.h"
#include "engine/config/config_internal.h"

typedef enum cfg_origin { CFG_DEFAULT, CFG_FILE, CFG_OVERRIDE } cfg_origin;

typedef struct cfg_loc {
    cfg_origin origin;
    int line, col; /* 1-based; CFG_FILE only */
} cfg_loc;

typedef struct cfg_loader {
    const char *path; /* NULL: defaults only */
    tpd_config *cfg;
    cfg_loc set[TPD_CFG_MAX_KEYS]; /* where each key's current value came from */
} cfg_loader;

/* Logs "WHERE: KEY: message" once (tpd_fail). WHERE is file:line:col, <override>, or the
 * file alone for a value that nobody stated. */
tpd_status tpd_cfg_fail(const cfg_loader *ld, const cfg_loc *at, const char *key, const char *fmt,
                        ...) __attribute__((format(printf, 4, 5)));
/* Where the value of a key came from (the key must exist). */
const cfg_loc *tpd_cfg_where(const cfg_loader *ld, const char *name);
/* Where to point for a relation between two keys: the first one if someone stated it,
 * else the second (b may be NULL), else the file as a whole. */
const cfg_loc *tpd_cfg_at(const cfg_loader *ld, const char *a, const char *b);

/* The relations of the Llama block's keys (config_llama.c) and of the data-parallel keys:
 * DiLoCo's section and the sharding keys (config_dp.c). */
tpd_status tpd_cfg_check_llama(cfg_loader *ld);
tpd_status tpd_cfg_check_dp(cfg_loader *ld);
/* The sharding keys of a load, before tpd_cfg_sharding_rule applies: use_distributed_optimizer
 * and data_parallel_sharding_strategy both stated (in the file or an override) and
 * disagreeing (false with a strategy that shards, or true with no_shard) is an error. */
tpd_status tpd_cfg_check_sharding_stated(cfg_loader *ld);

#endif
