/* What follows a load: the checks against the world size and the trainer's abilities, and
 * the quantities derived from a config (DP degree, micro-batches, K/V heads, padded
 * vocabulary, the stage and chunk splits, the schedule). */
#include "engine/config/config.h"

#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>

/* Messages of the checks after load start with the file they came from. */
static tpd_status cfg_fail_after(const tpd_config *cfg, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static tpd_status cfg_fail_after(const tpd_config *cfg, const char *fmt, ...) {
    char what[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return tpd_fail(TPD_ERR_INVALID, "%s%s%s", cfg->source_path, cfg->source_path[0] ? ": " : "",
                    what);
}

tpd_status tpd_config_check_world(const tpd_config *cfg, int world_size) {
    const int tp = cfg->parallel.tensor_model_parallel_size;
    const int pp = cfg->parallel.pipeline_model_parallel_size;
    const int mbs = cfg->training.micro_batch_size, gbs = cfg->training.global_batch_size;
    if (tp < 1 || pp < 1 || mbs < 1)
        return cfg_fail_after(cfg, "the config was not loaded (TP, PP or micro "
                                   "batch size below 1)");
    if (world_size < 1)
        return cfg_fail_after(cfg, "world size (%d) must be at least 1", world_size);
    const int cp =
        cfg->parallel.context_parallel_size > 0 ? cfg->parallel.context_parallel_size : 1;
    const int64_t mp = (int64_t)tp * pp * cp;
    if (world_size % mp && cp == 1)
        return cfg_fail_after(cfg,
                              "world size (%d) is not divisible by total_model_size (%" PRId64 ")",
                              world_size, mp);
    if (world_size % mp)
        return cfg_fail_after(cfg,
                              "world size (%d) is not divisible by total_model_size (%" PRId64
                              ") x context_parallel_size (%d)",
                              world_size, (int64_t)tp * pp, cp);
    int dp = (int)(world_size / mp);
    if (cfg->parallel.data_parallel_size != 0 && cfg->parallel.data_parallel_size != dp)
        return cfg_fail_after(cfg,
                              "parallel.data_parallel_size (%d) does not match world size (%d) "
                              "/ (tensor_model_parallel_size %d * pipeline_model_parallel_size "
                              "%d) = %d",
                              cfg->parallel.data_parallel_size, world_size, tp, pp, dp);
    const int ep = tpd_config_ep(cfg);
    if (dp % ep)
        return cfg_fail_after(cfg,
                              "parallel.expert_model_parallel_size (%d) must divide the data "
                              "parallel size (%d): the EP ranks of a layer's experts are "
                              "consecutive DP ranks (Megatron's rule), and each expert is "
                              "replicated over DP / EP of them",
                              ep, dp);
    if (gbs % ((int64_t)mbs * dp))
        return cfg_fail_after(cfg,
                              "global batch size (%d) is not divisible by micro batch size "
                              "(%d) times data parallel size (%d)",
                              gbs, mbs, dp);
    if (cfg->parallel.dp_sync == TPD_DP_SYNC_DILOCO && cfg->diloco.replicas > 0 &&
        dp % cfg->diloco.replicas)
        return cfg_fail_after(cfg,
                              "diloco.replicas (%d) must divide the data parallel size (%d): "
                              "every replica is DP / replicas ranks",
                              cfg->diloco.replicas, dp);
    const int shard = cfg->parallel.data_parallel_shard_size, inner = tpd_config_dp_inner(cfg, dp);
    if (shard > 0 && inner % shard)
        return cfg_fail_after(cfg,
                              "parallel.data_parallel_shard_size (%d) must divide the data "
                              "parallel size (%d%s): the shard groups are runs of that many "
                              "consecutive DP ranks, replicated across",
                              shard, inner, inner != dp ? ", a DiLoCo replica's ranks" : "");
    int M = tpd_config_num_micro_batches(cfg, dp);
    if (tpd_config_schedule(cfg) == TPD_SCHEDULE_INTERLEAVED && M % pp)
        return cfg_fail_after(cfg,
                              "training.global_batch_size: the interleaved schedule needs the "
                              "micro-batches of a step (global_batch_size / (micro_batch_size * "
                              "data parallel size) = %d / (%d * %d) = %d) to be a multiple of "
                              "pipeline_model_parallel_size (%d): each group of %d micro-batches "
                              "walks the model chunks together (Megatron's rule)",
                              gbs, mbs, dp, M, pp, pp);
    return TPD_OK;
}

tpd_status tpd_config_check_trainable(const tpd_config *cfg) {
    const tpd_config_training *t = &cfg->training;
    if (cfg->parallel.grad_reduce_dtype == TPD_REDUCE_BF16 && t->device == TPD_DEVICE_CUDA)
        return cfg_fail_after(cfg, "parallel.grad_reduce_dtype bf16: the bf16-wire reductions run "
                                   "on the cpu backend's MPI communicators only, not on NCCL; set "
                                   "it to fp32 under training.device cuda");
    if (cfg->parallel.dp_sync == TPD_DP_SYNC_DILOCO &&
        cfg->diloco.reduce_dtype == TPD_REDUCE_BF16 && t->device == TPD_DEVICE_CUDA)
        return cfg_fail_after(cfg, "diloco.reduce_dtype bf16: the bf16-wire reductions run on the "
                                   "cpu backend's MPI communicators only, not on NCCL; set it to "
                                   "fp32 under training.device cuda");
    if (cfg->parallel.tp_comm_overlap)
        return cfg_fail_after(cfg,
                              "parallel.tp_comm_overlap true: `tripod train` does not overlap "
                              "tensor-parallel communication with the GEMMs (only `tripod plan` "
                              "models it, as Megatron-Core's --tp-comm-overlap); set it to "
                              "false to train");
    const tpd_dp_sharding sh = cfg->parallel.data_parallel_sharding_strategy;
    const char *shk = "parallel.data_parallel_sharding_strategy";
    if (tpd_config_cp(cfg) > 1 && t->device == TPD_DEVICE_CUDA)
        return cfg_fail_after(cfg,
                              "parallel.context_parallel_size %d with training.device cuda: "
                              "context parallelism trains on the cpu backend (its block-wise "
                              "ring attention and the CP exchanges are host-side); `tripod plan` "
                              "models it on GPUs. Set it to 1 or train on the cpu",
                              tpd_config_cp(cfg));
    const int ep = tpd_config_ep(cfg);
    const int hsdp = cfg->parallel.data_parallel_shard_size;
    if (ep > 1 && sh >= TPD_DP_SHARDING_OPTIM_GRADS && hsdp > 0 && hsdp % ep)
        return cfg_fail_after(cfg,
                              "parallel.data_parallel_shard_size %d with "
                              "parallel.expert_model_parallel_size %d: a hybrid shard group must "
                              "hold whole EP runs (the experts shard over the group's ranks of "
                              "one EP index), so the shard size must be a multiple of EP",
                              hsdp, ep);
    if (ep > 1 && cfg->parallel.dp_sync == TPD_DP_SYNC_DILOCO)
        return cfg_fail_after(cfg,
                              "parallel.expert_model_parallel_size %d with parallel.dp_sync "
                              "diloco: the EP ranks are DP ranks, which DiLoCo's replicas split; "
                              "set one of them back",
                              ep);
    if (tpd_config_moe(cfg) && tpd_config_cp(cfg) > 1)
        return cfg_fail_after(cfg,
                              "model.num_moe_experts with parallel.context_parallel_size %d: the "
                              "load-balancing loss is taken over a micro-batch's tokens, which "
                              "CP splits over ranks; set one of them back",
                              tpd_config_cp(cfg));
    if (tpd_config_cp(cfg) > 1 && cfg->parallel.dp_sync == TPD_DP_SYNC_DILOCO)
        return cfg_fail_after(cfg,
                              "parallel.context_parallel_size %d with parallel.dp_sync diloco: "
                              "DiLoCo's replicas split data-parallel ranks, not the CP ranks of a "
                              "sequence; set one of them back (context_parallel_size 1 or "
                              "dp_sync every_step)",
                              tpd_config_cp(cfg));
    if (sh >= TPD_DP_SHARDING_OPTIM_GRADS && cfg->parallel.dp_sync == TPD_DP_SYNC_DILOCO)
        return cfg_fail_after(cfg,
                              "%s %s with parallel.dp_sync diloco: DiLoCo's outer step works on "
                              "optimizer-state shards only (optim or no_shard)",
                              shk, tpd_config_choice(shk, sh));
    const int shard = cfg->parallel.data_parallel_shard_size;
    if (sh < TPD_DP_SHARDING_OPTIM_GRADS && shard != 0 && shard != cfg->parallel.data_parallel_size)
        return cfg_fail_after(cfg,
                              "parallel.data_parallel_shard_size %d with %s %s: `tripod train` "
                              "shards optimizer state (optim) over all of DP only (hybrid "
                              "sharding of it is modelled by `tripod plan`); set it to 0 (all "
                              "of DP)%s, or shard the gradients too (optim_grads or "
                              "optim_grads_params train with hybrid sharding)",
                              shard, shk, tpd_config_choice(shk, sh),
                              cfg->parallel.data_parallel_size > 0
                                  ? ""
                                  : " or state parallel.data_parallel_size equal to it");
    return TPD_OK;
}

int tpd_config_dp(const tpd_config *cfg, int world_size) {
    if (cfg->parallel.data_parallel_size > 0) return cfg->parallel.data_parallel_size;
    int64_t mp = (int64_t)cfg->parallel.tensor_model_parallel_size *
                 cfg->parallel.pipeline_model_parallel_size * tpd_config_cp(cfg);
    return mp > 0 ? (int)(world_size / mp) : 0;
}

int tpd_config_dp_replicas(const tpd_config *cfg, int dp) {
    if (cfg->parallel.dp_sync != TPD_DP_SYNC_DILOCO) return 1;
    return cfg->diloco.replicas > 0 ? cfg->diloco.replicas : dp;
}

int tpd_config_moe_ffn(const tpd_config *cfg) {
    return cfg->model.moe_ffn_hidden_size > 0 ? cfg->model.moe_ffn_hidden_size
                                              : cfg->model.ffn_hidden_size;
}

int tpd_config_moe(const tpd_config *cfg) {
    return cfg->model.num_moe_experts > 0;
}

int tpd_config_layer_moe(const tpd_config *cfg, int g) {
    int n = cfg->model.moe_layer_freq > 0 ? cfg->model.moe_layer_freq : 1;
    return tpd_config_moe(cfg) && g % n == 0;
}

int tpd_config_moe_layers_before(const tpd_config *cfg, int g) {
    int n = cfg->model.moe_layer_freq > 0 ? cfg->model.moe_layer_freq : 1;
    return tpd_config_moe(cfg) ? tpd_config_freq_layers_before(n, g) : 0;
}

int tpd_config_ep(const tpd_config *cfg) {
    return cfg->model.num_moe_experts > 0 && cfg->parallel.expert_model_parallel_size > 1
               ? cfg->parallel.expert_model_parallel_size
               : 1;
}

int tpd_config_cp(const tpd_config *cfg) {
    return cfg->parallel.context_parallel_size > 1 ? cfg->parallel.context_parallel_size : 1;
}

int tpd_config_dp_inner(const tpd_config *cfg, int dp) {
    int r = tpd_config_dp_replicas(cfg, dp);
    return (r > 0 && dp % r == 0 ? dp / r : dp) * tpd_config_cp(cfg);
}

int tpd_config_dp_shard(const tpd_config *cfg, int dp) {
    int inner = tpd_config_dp_inner(cfg, dp), h = cfg->parallel.data_parallel_shard_size;
    return h > 0 && h < inner && inner % h == 0 ? h : inner;
}

int tpd_config_dp_shard_engine(const tpd_config *cfg, int dp) {
    return cfg->parallel.data_parallel_sharding_strategy >= TPD_DP_SHARDING_OPTIM_GRADS
               ? tpd_config_dp_shard(cfg, dp)
               : tpd_config_dp_inner(cfg, dp);
}

int tpd_diloco_sync_fragment(const tpd_config *cfg, int iteration) {
    const tpd_config_diloco *d = &cfg->diloco;
    if (cfg->parallel.dp_sync != TPD_DP_SYNC_DILOCO || iteration < 1 || d->fragments < 1 ||
        d->sync_interval < d->fragments)
        return -1;
    int step = d->sync_interval / d->fragments, r = iteration % d->sync_interval;
    /* fragment f at r == (f + 1) * step (mod H): the last one at multiples of H */
    if (r % step) return -1;
    int f = r / step - 1;
    return f < 0 ? d->fragments - 1 : f;
}

int tpd_diloco_pending_fragment(const tpd_config *cfg, int iteration) {
    /* the run's last step applies what is in flight */
    if (iteration == cfg->training.train_iters) return -1;
    /* started after step s = iteration - k, applied after step s + overlap_steps */
    for (int k = 0; k < cfg->diloco.overlap_steps && iteration - k >= 1; k++) {
        int f = tpd_diloco_sync_fragment(cfg, iteration - k);
        if (f >= 0) return f;
    }
    return -1;
}

int tpd_config_num_micro_batches(const tpd_config *cfg, int dp) {
    int64_t per_step = (int64_t)cfg->training.micro_batch_size * dp;
    return per_step > 0 ? (int)(cfg->training.global_batch_size / per_step) : 0;
}

int tpd_config_lr_decay_iters(const tpd_config *cfg) {
    return cfg->optimizer.lr_decay_iters ? cfg->optimizer.lr_decay_iters
                                         : cfg->training.train_iters;
}

int tpd_config_kv_heads(const tpd_config *cfg) {
    return cfg->model.group_query_attention ? cfg->model.num_query_groups
                                            : cfg->model.num_attention_heads;
}

int tpd_config_head_dim(const tpd_config *cfg) {
    const tpd_config_model *m = &cfg->model;
    if (m->kv_channels > 0) return m->kv_channels;
    return m->num_attention_heads > 0 ? m->hidden_size / m->num_attention_heads : 0;
}

int tpd_config_q_width(const tpd_config *cfg) {
    return cfg->model.num_attention_heads * tpd_config_head_dim(cfg);
}

int tpd_config_qkv_bias(const tpd_config *cfg) {
    return cfg->model.add_bias_linear || cfg->model.add_qkv_bias;
}

int tpd_config_grad_bytes(const tpd_config *cfg) {
    int bf16 = cfg->training.precision == TPD_PRECISION_BF16;
    return bf16 && !cfg->training.accumulate_allreduce_grads_in_fp32 ? 2 : 4;
}

int tpd_config_padded_vocab(const tpd_config *cfg, int tp) {
    /* In 64 bits: the schema's bounds (vocab_size <= 2^24, the multiple <= 2^16, heads and
     * so TP <= 2^12) keep the result below 2^29; a config built by hand past them gets -1,
     * which every caller refuses, rather than a wrapped vocabulary. */
    int64_t mult = (int64_t)cfg->model.make_vocab_size_divisible_by * (tp > 0 ? tp : 1);
    int64_t v = cfg->model.vocab_size;
    if (mult < 1 || v < 1) return -1;
    int64_t vp = (v + mult - 1) / mult * mult;
    return vp > INT_MAX ? -1 : (int)vp;
}

/* The split of L layers over pp (virtual) stages that no list states: floor(L/pp) layers
 * each, and the L%pp extra layers go to the middle stages first, then to the first stage
 * (the embedding is cheap), the last stage (head and loss) last. */
static int split_rule(int L, int pp, int stage) {
    int base = L / pp, extra = L % pp;
    /* rank of this stage in the order that receives the extra layers */
    int order = stage >= 1 && stage <= pp - 2 ? stage - 1 : (stage == 0 ? pp - 2 : pp - 1);
    if (pp == 1) order = 0;
    return base + (order < extra);
}

/* Layers of virtual stage vs of n, and its first layer. */
static int virtual_stage_layers(const tpd_config *cfg, int n, int vs, int *first_layer_p) {
    const tpd_config_parallel *par = &cfg->parallel;
    int L = cfg->model.num_layers;
    int listed = par->num_pipeline_layers == n;
    if (!listed && n > L) return -1;
    int first = 0;
    for (int i = 0; i < vs; i++)
        first += listed ? par->pipeline_layers[i] : split_rule(L, n, i);
    if (first_layer_p) *first_layer_p = first;
    return listed ? par->pipeline_layers[vs] : split_rule(L, n, vs);
}

int tpd_config_stage_layers(const tpd_config *cfg, int pp, int v, int stage, int chunk,
                            int *first_layer_p) {
    if (pp < 1 || v < 1 || (int64_t)pp * v > INT_MAX || stage < 0 || stage >= pp ||
        chunk < TPD_CONFIG_ALL_CHUNKS || chunk >= v)
        return -1;
    if (chunk != TPD_CONFIG_ALL_CHUNKS)
        return virtual_stage_layers(cfg, pp * v, chunk * pp + stage, first_layer_p);
    int n = 0, first = 0;
    for (int c = 0; c < v; c++) {
        int k = virtual_stage_layers(cfg, pp * v, c * pp + stage, c == 0 ? &first : NULL);
        if (k < 0) return -1;
        n += k;
    }
    if (first_layer_p) *first_layer_p = first;
    return n;
}

tpd_schedule tpd_config_schedule(const tpd_config *cfg) {
    if (cfg->parallel.virtual_pipeline_model_parallel_size > 1) return TPD_SCHEDULE_INTERLEAVED;
    return cfg->parallel.pipeline_schedule;
}
