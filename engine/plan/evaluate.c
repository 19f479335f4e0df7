/* One layout: validity checks (with Megatron's wording where it has one), memory, time. */
#include "engine/plan/plan.h"
#include "engine/plan/plan_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int tpd_plan_cp(const tpd_plan_layout *lay) {
    return lay->cp > 1 ? lay->cp : 1;
}

int tpd_plan_ep(const tpd_plan_layout *lay) {
    return lay->ep > 1 ? lay->ep : 1;
}

double tpd_plan_moe_imbalance(const tpd_config *cfg, const tpd_plan_layout *lay) {
    double k = cfg->model.moe_imbalance;
    return tpd_plan_ep(lay) > 1 && k > 1.0 ? k : 1.0;
}

long tpd_plan_world(const tpd_plan_layout *lay) {
    return (long)lay->tp * tpd_plan_cp(lay) * lay->dp * lay->pp;
}

int tpd_plan_local_seq(const tpd_config *cfg, const tpd_plan_layout *lay) {
    return cfg->model.seq_length / tpd_plan_cp(lay);
}

int tpd_plan_dp_inner(const tpd_config *cfg, const tpd_plan_layout *lay) {
    int r = tpd_config_dp_replicas(cfg, lay->dp);
    return (r > 0 && lay->dp % r == 0 ? lay->dp / r : lay->dp) * tpd_plan_cp(lay);
}

tpd_schedule tpd_plan_layout_schedule(const tpd_plan_layout *lay) {
    return lay->virtual_stages > 1 ? TPD_SCHEDULE_INTERLEAVED : lay->schedule;
}

tpd_pp_kind tpd_plan_layout_pp_kind(const tpd_plan_layout *lay) {
    switch (tpd_plan_layout_schedule(lay)) {
    case TPD_SCHEDULE_INTERLEAVED:
        return TPD_PP_KIND_INTERLEAVED;
    case TPD_SCHEDULE_ZB_H1:
        return TPD_PP_KIND_ZB_H1;
    case TPD_SCHEDULE_1F1B:
        break;
    }
    return TPD_PP_KIND_1F1B;
}

void tpd_plan_layout_from_config(const tpd_config *cfg, int gpus, tpd_plan_layout *lay_p) {
    const tpd_config_parallel *p = &cfg->parallel;
    tpd_plan_layout l;
    memset(&l, 0, sizeof l);
    l.tp = p->tensor_model_parallel_size > 0 ? p->tensor_model_parallel_size : 1;
    l.pp = p->pipeline_model_parallel_size > 0 ? p->pipeline_model_parallel_size : 1;
    l.cp = tpd_config_cp(cfg);
    l.cp_comm = p->cp_comm_type;
    l.ep = tpd_config_moe(cfg) && p->expert_model_parallel_size > 1 ? p->expert_model_parallel_size
                                                                    : 1;
    l.dp = gpus > 0 ? gpus / (l.tp * l.pp * l.cp)
                    : (p->data_parallel_size > 0 ? p->data_parallel_size : 1);
    if (l.dp < 1) l.dp = 1;
    l.micro_batch_size = cfg->training.micro_batch_size;
    l.virtual_stages =
        p->virtual_pipeline_model_parallel_size > 1 ? p->virtual_pipeline_model_parallel_size : 1;
    l.schedule = tpd_config_schedule(cfg);
    l.recompute = cfg->training.recompute;
    l.sequence_parallel = p->sequence_parallel && l.tp > 1;
    l.distributed_optimizer = p->use_distributed_optimizer;
    l.sharding = p->data_parallel_sharding_strategy;
    l.shard_size = p->data_parallel_shard_size;
    l.overlap_grad_reduce = p->overlap_grad_reduce;
    l.overlap_param_gather = p->overlap_param_gather;
    l.tp_comm_overlap = p->tp_comm_overlap && l.sequence_parallel;
    *lay_p = l;
}

void tpd_plan_layout_str(const tpd_plan_layout *l, char *buf, size_t len) {
    const char *ovl = l->overlap_grad_reduce ? (l->overlap_param_gather ? "grad+param" : "grad")
                                             : (l->overlap_param_gather ? "param" : "off");
    /* ZeRO=on is optim (ZeRO-1), 2 optim_grads, 3 optim_grads_params; shard=N is HSDP */
    static const char *const zero[] = {"off", "on", "2", "3"};
    char shard[32] = "", cp[32] = "", ep[16] = "";
    if (l->shard_size > 0 && l->shard_size < l->dp)
        snprintf(shard, sizeof shard, " shard=%d", l->shard_size);
    if (tpd_plan_cp(l) > 1)
        snprintf(cp, sizeof cp, " CP=%d(%s)", l->cp,
                 tpd_config_choice("parallel.cp_comm_type", l->cp_comm));
    if (tpd_plan_ep(l) > 1) snprintf(ep, sizeof ep, " EP=%d", l->ep);
    snprintf(
        buf, len, "TP=%d%s PP=%d DP=%d%s mbs=%d v=%d %s recompute=%s SP=%s ZeRO=%s%s overlap=%s%s",
        l->tp, cp, l->pp, l->dp, ep, l->micro_batch_size, l->virtual_stages,
        tpd_config_choice("parallel.pipeline_schedule", tpd_plan_layout_schedule(l)),
        tpd_config_choice("training.recompute", l->recompute), l->sequence_parallel ? "on" : "off",
        zero[tpd_plan_sharding(l)], shard, ovl, l->tp_comm_overlap ? " tp-comm-overlap" : "");
}

/* Appends "key=value " to buf at *at; 0 when it does not fit. */
static int put(char *buf, size_t len, size_t *at, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int put(char *buf, size_t len, size_t *at, const char *fmt, ...) {
    if (*at >= len) return 0;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *at, len - *at, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= len - *at) return 0;
    *at += (size_t)n;
    return 1;
}

int tpd_plan_overrides(const tpd_config *cfg, const tpd_plan_result *res, char *buf, size_t len) {
    const tpd_plan_layout *l = &res->layout;
    int v = l->virtual_stages > 0 ? l->virtual_stages : 1, n = 0, ok = 1;
    size_t at = 0;
    if (len > 0) buf[0] = '\0';
#define PUT(...) (ok = ok && put(buf, len, &at, __VA_ARGS__), n++)
    PUT("parallel.tensor_model_parallel_size=%d", l->tp);
    PUT(" parallel.pipeline_model_parallel_size=%d", l->pp);
    PUT(" parallel.data_parallel_size=%d", l->dp);
    PUT(" parallel.context_parallel_size=%d", tpd_plan_cp(l));
    PUT(" parallel.cp_comm_type=%s", tpd_config_choice("parallel.cp_comm_type", l->cp_comm));
    /* a mixture's EP, 1 included (it clears the config's); a dense model has none to set */
    if (tpd_config_moe(cfg)) PUT(" parallel.expert_model_parallel_size=%d", tpd_plan_ep(l));
    PUT(" parallel.virtual_pipeline_model_parallel_size=%d", v);
    PUT(" parallel.pipeline_schedule=%s",
        tpd_config_choice("parallel.pipeline_schedule", tpd_plan_layout_schedule(l)));
    /* the split: a list whenever the even split is not what the layout runs (balanced or
     * uneven stages), else an empty list, which clears one the config may hold */
    int nvs = l->pp * v, even = cfg->model.num_layers % nvs == 0;
    for (int i = 0; even && i < nvs && i < TPD_CONFIG_MAX_STAGES; i++)
        even = res->chunk_layers[i] == cfg->model.num_layers / nvs;
    if (even) {
        PUT(" parallel.pipeline_layers=[]");
    } else {
        PUT(" parallel.pipeline_layers=[");
        for (int i = 0; i < nvs && i < TPD_CONFIG_MAX_STAGES; i++)
            ok = ok && put(buf, len, &at, "%s%d", i ? "," : "", res->chunk_layers[i]);
        ok = ok && put(buf, len, &at, "]");
    }
    PUT(" parallel.sequence_parallel=%s", l->sequence_parallel ? "true" : "false");
    tpd_dp_sharding sh = tpd_plan_sharding(l);
    PUT(" parallel.use_distributed_optimizer=%s",
        sh != TPD_DP_SHARDING_NO_SHARD ? "true" : "false");
    PUT(" parallel.data_parallel_sharding_strategy=%s",
        tpd_config_choice("parallel.data_parallel_sharding_strategy", sh));
    PUT(" parallel.data_parallel_shard_size=%d",
        l->shard_size > 0 && l->shard_size < tpd_plan_dp_inner(cfg, l) ? l->shard_size : 0);
    PUT(" parallel.overlap_grad_reduce=%s", l->overlap_grad_reduce ? "true" : "false");
    PUT(" parallel.overlap_param_gather=%s", l->overlap_param_gather ? "true" : "false");
    /* only when on: the search never turns it on, and `tripod train` refuses it */
    if (l->tp_comm_overlap) PUT(" parallel.tp_comm_overlap=true");
    PUT(" training.micro_batch_size=%d", l->micro_batch_size);
    PUT(" training.recompute=%s", tpd_config_choice("training.recompute", l->recompute));
    int rl = l->recompute != TPD_RECOMPUTE_FULL ? 0
             : res->recompute_layers            ? res->recompute_layers
                                                : cfg->training.recompute_num_layers;
    PUT(" training.recompute_num_layers=%d", rl);
#undef PUT
    return ok ? n : -1;
}

int tpd_plan_layout_valid(const tpd_config *cfg, const tpd_plan_cluster *cl,
                          const tpd_plan_layout *l, int gpus, char *why, size_t whylen) {
    const tpd_config_model *m = &cfg->model;
    int v = l->virtual_stages, cp = tpd_plan_cp(l);
    long total = tpd_plan_world(l);
    if (l->tp < 1 || l->pp < 1 || l->dp < 1 || l->micro_batch_size < 1 || v < 1 || l->cp < 0) {
        snprintf(why, whylen, "sizes must be >= 1 (TP %d, CP %d, PP %d, DP %d, mbs %d, v %d)",
                 l->tp, l->cp, l->pp, l->dp, l->micro_batch_size, v);
        return 0;
    }
    if (gpus > 0 && total != gpus && cp == 1) {
        snprintf(why, whylen, "TP*PP*DP = %d*%d*%d = %ld is not the world size %d", l->tp, l->pp,
                 l->dp, total, gpus);
        return 0;
    }
    if (gpus > 0 && total != gpus) {
        snprintf(why, whylen, "TP*CP*PP*DP = %d*%d*%d*%d = %ld is not the world size %d", l->tp, cp,
                 l->pp, l->dp, total, gpus);
        return 0;
    }
    if (cp > 1 && m->seq_length % (2 * cp)) {
        snprintf(why, whylen,
                 "seq_length %d not divisible by 2*CP %d (each sequence is cut in 2 x CP "
                 "chunks)",
                 m->seq_length, 2 * cp);
        return 0;
    }
    if (cp > 1 && cfg->parallel.dp_sync == TPD_DP_SYNC_DILOCO) {
        snprintf(why, whylen,
                 "CP %d with DiLoCo (its replicas split data-parallel ranks, not a sequence's CP "
                 "ranks)",
                 cp);
        return 0;
    }
    if (cp > 1 && l->cp_comm == TPD_CP_COMM_A2A &&
        (m->num_attention_heads % (l->tp * cp) || tpd_config_kv_heads(cfg) % (l->tp * cp))) {
        snprintf(why, whylen,
                 "a2a: heads %d and K/V heads %d not both divisible by TP*CP %d (the all-to-all "
                 "gives each CP rank whole heads)",
                 m->num_attention_heads, tpd_config_kv_heads(cfg), l->tp * cp);
        return 0;
    }
    if (m->num_attention_heads % l->tp != 0) {
        snprintf(why, whylen, "heads %d not divisible by TP %d", m->num_attention_heads, l->tp);
        return 0;
    }
    if (m->group_query_attention && m->num_query_groups % l->tp != 0) {
        snprintf(why, whylen,
                 "query groups %d not divisible by TP %d (K/V heads split whole, never "
                 "replicated)",
                 m->num_query_groups, l->tp);
        return 0;
    }
    if (m->ffn_hidden_size % l->tp != 0) {
        snprintf(why, whylen, "ffn_hidden_size %d not divisible by TP %d", m->ffn_hidden_size,
                 l->tp);
        return 0;
    }
    if (v > 1 && l->pp < 2) {
        snprintf(why, whylen, "interleaving (v=%d) needs PP > 1", v);
        return 0;
    }
    if ((long)l->pp * v > TPD_CONFIG_MAX_STAGES) {
        snprintf(why, whylen, "PP*v %d*%d is more than %d virtual stages", l->pp, v,
                 TPD_CONFIG_MAX_STAGES);
        return 0;
    }
    if (v > 1 && l->schedule == TPD_SCHEDULE_ZB_H1) {
        snprintf(why, whylen, "zb-h1 with v=%d (zb-h1 runs one model chunk per stage)", v);
        return 0;
    }
    if (v == 1 && l->schedule == TPD_SCHEDULE_INTERLEAVED) {
        snprintf(why, whylen, "interleaved with v=1 (it needs virtual stages)");
        return 0;
    }
    if (tpd_plan_layout_schedule(l) == TPD_SCHEDULE_ZB_H1 && l->recompute == TPD_RECOMPUTE_FULL) {
        snprintf(why, whylen,
                 "zb-h1 with recompute full (W needs the activations full "
                 "recompute drops)");
        return 0;
    }
    if (tpd_config_stage_layers(cfg, l->pp, 1, 0, 0, NULL) < 0) {
        snprintf(why, whylen, "layers %d fewer than PP %d", m->num_layers, l->pp);
        return 0;
    }
    /* interleaving: equal chunks, unless the config lists every virtual stage */
    if (v > 1 && m->num_layers % (l->pp * v) != 0 &&
        cfg->parallel.num_pipeline_layers != l->pp * v) {
        snprintf(why, whylen, "layers %d not divisible by PP*v %d*%d", m->num_layers, l->pp, v);
        return 0;
    }
    long gbs = cfg->training.global_batch_size;
    if (gbs % ((long)l->micro_batch_size * l->dp) != 0) {
        snprintf(why, whylen, "global batch %ld not divisible by mbs*dp %d*%d", gbs,
                 l->micro_batch_size, l->dp);
        return 0;
    }
    int mb = (int)(gbs / ((long)l->micro_batch_size * l->dp));
    if (v > 1 && mb % l->pp != 0) {
        snprintf(why, whylen, "micro-batches %d not divisible by PP %d (interleaved schedule)", mb,
                 l->pp);
        return 0;
    }
    if (l->sequence_parallel && l->tp < 2) {
        snprintf(why, whylen, "sequence parallel needs TP > 1");
        return 0;
    }
    if (l->tp_comm_overlap && !l->sequence_parallel) {
        snprintf(why, whylen, "tp_comm_overlap needs sequence parallel and TP > 1");
        return 0;
    }
    if (l->tp_comm_overlap && cl && !cl->tp_overlap_available) {
        snprintf(why, whylen,
                 "tp_comm_overlap: the cluster profile's framework has no TP communication "
                 "overlap (tp_overlap_available: 0)");
        return 0;
    }
    if (l->sequence_parallel && cfg->model.seq_length % l->tp) {
        snprintf(why, whylen, "seq_length %d not divisible by TP %d (sequence parallel)",
                 cfg->model.seq_length, l->tp);
        return 0;
    }
    if (l->sequence_parallel && cp > 1 && (cfg->model.seq_length / cp) % l->tp) {
        snprintf(why, whylen,
                 "the %d tokens of a CP rank not divisible by TP %d (sequence parallel)",
                 cfg->model.seq_length / cp, l->tp);
        return 0;
    }
    tpd_dp_sharding sh = tpd_plan_sharding(l);
    int inner = tpd_plan_dp_inner(cfg, l);
    if (l->shard_size < 0 || (l->shard_size > 0 && inner % l->shard_size)) {
        snprintf(why, whylen, "shard size %d does not divide DP %d", l->shard_size, inner);
        return 0;
    }
    int hybrid = l->shard_size > 0 && l->shard_size < inner;
    /* the engine trains every strategy, hybrid sharding under optim_grads and
     * optim_grads_params; ZeRO-1 over a shard group is the GPU model's alone */
    if (cl && cl->backend == TPD_PLAN_BACKEND_CPU && hybrid && sh < TPD_DP_SHARDING_OPTIM_GRADS) {
        snprintf(why, whylen,
                 "cpu: tripod train shards optimizer state alone (%s) over all of DP only, not "
                 "in shard groups of %d",
                 tpd_config_choice("parallel.data_parallel_sharding_strategy", sh), l->shard_size);
        return 0;
    }
    int ep = tpd_plan_ep(l), E = m->num_moe_experts;
    if (l->ep < 0 || (ep > 1 && E < 1)) {
        snprintf(why, whylen, "EP %d on a model without experts (num_moe_experts %d)", l->ep, E);
        return 0;
    }
    if (ep > 1 && E % ep) {
        snprintf(why, whylen, "experts %d not divisible by EP %d (each EP rank holds E / EP)", E,
                 ep);
        return 0;
    }
    if (ep > 1 && l->dp % ep) {
        snprintf(why, whylen,
                 "DP %d not divisible by EP %d (an EP group is EP consecutive DP ranks)", l->dp,
                 ep);
        return 0;
    }
    /* the trainer's EP shards the experts over expert DP and the rest over DP (every
     * strategy), under HSDP over shard groups that hold whole EP runs, and has no DiLoCo
     * replicas (the search does not try them) */
    if (ep > 1 && hybrid && sh < TPD_DP_SHARDING_OPTIM_GRADS) {
        /* ZeRO-1 over a shard group is the GPU model's alone, and it prices no expert units */
        snprintf(why, whylen,
                 "EP %d with hybrid sharding %s (EP's experts shard over hybrid groups under "
                 "optim_grads and optim_grads_params only)",
                 ep, tpd_config_choice("parallel.data_parallel_sharding_strategy", sh));
        return 0;
    }
    if (ep > 1 && hybrid && tpd_plan_shard_group(cfg, l) % ep) {
        snprintf(why, whylen,
                 "EP %d with hybrid sharding %s over shard groups of %d (a shard group holds "
                 "whole EP runs: a multiple of EP)",
                 ep, tpd_config_choice("parallel.data_parallel_sharding_strategy", sh),
                 tpd_plan_shard_group(cfg, l));
        return 0;
    }
    if (ep > 1 && cfg->parallel.dp_sync == TPD_DP_SYNC_DILOCO) {
        snprintf(why, whylen, "EP %d with DiLoCo (expert parallelism syncs every step)", ep);
        return 0;
    }
    if (cfg->parallel.dp_sync == TPD_DP_SYNC_DILOCO && (sh > TPD_DP_SHARDING_OPTIM || hybrid)) {
        snprintf(why, whylen, "DiLoCo shards optim at most over a replica (sharding %s%s)",
                 tpd_config_choice("parallel.data_parallel_sharding_strategy", sh),
                 hybrid ? ", hybrid" : "");
        return 0;
    }
    if (why && whylen) why[0] = '\0';
    return 1;
}

tpd_status tpd_plan_evaluate(const tpd_config *cfg, const tpd_plan_cluster *cl,
                             const tpd_plan_layout *lay, const tpd_plan_options *opt,
                             tpd_plan_result *res_p) {
    memset(res_p, 0, sizeof *res_p);
    res_p->layout = *lay;
    if (opt->dp_overlap >= 0) res_p->layout.overlap_grad_reduce = opt->dp_overlap;
    if (opt->param_gather_overlap >= 0)
        res_p->layout.overlap_param_gather = opt->param_gather_overlap;
    lay = &res_p->layout;
    if (lay->pp > TPD_CONFIG_MAX_STAGES) {
        snprintf(res_p->reject_reason, sizeof res_p->reject_reason, "PP %d is more than %d stages",
                 lay->pp, TPD_CONFIG_MAX_STAGES);
        return TPD_OK;
    }
    if (!tpd_plan_layout_valid(cfg, cl, lay, opt->gpus, res_p->reject_reason,
                               sizeof res_p->reject_reason))
        return TPD_OK;
    tpd_config scratch;
    const tpd_config *c;
    TPD_CHECK(tpd_plan_memory_split(cfg, cl, opt, res_p, &scratch, &c));
    /* Time is predicted even when memory does not fit, so a rejected layout still
     * shows what it would have run at. */
    if (opt->evaluate_time) TPD_CHECK(tpd_plan_time_split(cfg, cl, opt, 1, res_p, &scratch));
    return TPD_OK;
}
