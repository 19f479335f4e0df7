/* One layout: validity checks (with Megatron's wording where it has one), memory, time. */
#include "engine/plan/plan.h"
#include "engine/plan/plan_internal.h"

#include <stdio.h>
#include <string.h>

void tpd_plan_layout_from_config(const tpd_config *cfg, int gpus, tpd_plan_layout *lay_p) {
    const tpd_config_parallel *p = &cfg->parallel;
    tpd_plan_layout l;
    memset(&l, 0, sizeof l);
    l.tp = p->tensor_model_parallel_size > 0 ? p->tensor_model_parallel_size : 1;
    l.pp = p->pipeline_model_parallel_size > 0 ? p->pipeline_model_parallel_size : 1;
    l.dp =
        gpus > 0 ? gpus / (l.tp * l.pp) : (p->data_parallel_size > 0 ? p->data_parallel_size : 1);
    if (l.dp < 1) l.dp = 1;
    l.micro_batch_size = cfg->training.micro_batch_size;
    l.virtual_stages =
        p->virtual_pipeline_model_parallel_size > 1 && p->pipeline_schedule != TPD_SCHEDULE_1F1B
            ? p->virtual_pipeline_model_parallel_size
            : 1;
    l.recompute = cfg->training.recompute;
    l.sequence_parallel = p->sequence_parallel && l.tp > 1;
    l.distributed_optimizer = p->use_distributed_optimizer;
    *lay_p = l;
}

void tpd_plan_layout_str(const tpd_plan_layout *l, char *buf, size_t len) {
    snprintf(buf, len, "TP=%d PP=%d DP=%d mbs=%d v=%d recompute=%s SP=%s ZeRO=%s", l->tp, l->pp,
             l->dp, l->micro_batch_size, l->virtual_stages,
             tpd_config_choice("training.recompute", l->recompute),
             l->sequence_parallel ? "on" : "off", l->distributed_optimizer ? "on" : "off");
}

int tpd_plan_layout_valid(const tpd_config *cfg, const tpd_plan_cluster *cl,
                          const tpd_plan_layout *l, int gpus, char *why, size_t whylen) {
    const tpd_config_model *m = &cfg->model;
    int v = l->virtual_stages;
    long total = (long)l->tp * l->pp * l->dp;
    if (l->tp < 1 || l->pp < 1 || l->dp < 1 || l->micro_batch_size < 1 || v < 1) {
        snprintf(why, whylen, "sizes must be >= 1 (TP %d, PP %d, DP %d, mbs %d, v %d)", l->tp,
                 l->pp, l->dp, l->micro_batch_size, v);
        return 0;
    }
    if (gpus > 0 && total != gpus) {
        snprintf(why, whylen, "TP*PP*DP = %d*%d*%d = %ld is not the world size %d", l->tp, l->pp,
                 l->dp, total, gpus);
        return 0;
    }
    if (m->num_attention_heads % l->tp != 0) {
        snprintf(why, whylen, "heads %d not divisible by TP %d", m->num_attention_heads, l->tp);
        return 0;
    }
    if (tpd_config_split_layers(cfg, l->pp, 0, NULL) < 0) {
        snprintf(why, whylen, "layers %d fewer than PP %d", m->num_layers, l->pp);
        return 0;
    }
    if (v > 1 && m->num_layers % (l->pp * v) != 0) {
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
    if (v > 1 && l->pp < 2) {
        snprintf(why, whylen, "interleaving (v=%d) needs PP > 1", v);
        return 0;
    }
    if (v > 1 && mb % l->pp != 0) {
        snprintf(why, whylen, "micro-batches %d not divisible by PP %d (interleaved schedule)", mb,
                 l->pp);
        return 0;
    }
    if (l->sequence_parallel && l->tp < 2) {
        snprintf(why, whylen, "sequence parallel needs TP > 1");
        return 0;
    }
    if (l->sequence_parallel && cfg->model.seq_length % l->tp) {
        snprintf(why, whylen, "seq_length %d not divisible by TP %d (sequence parallel)",
                 cfg->model.seq_length, l->tp);
        return 0;
    }
    if (cl && cl->backend == TPD_PLAN_BACKEND_CPU && v > 1) {
        snprintf(why, whylen, "the cpu backend runs v=1 only");
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
    if (lay->pp > TPD_CONFIG_MAX_STAGES) {
        snprintf(res_p->reject_reason, sizeof res_p->reject_reason, "PP %d is more than %d stages",
                 lay->pp, TPD_CONFIG_MAX_STAGES);
        return TPD_OK;
    }
    if (!tpd_plan_layout_valid(cfg, cl, lay, opt->gpus, res_p->reject_reason,
                               sizeof res_p->reject_reason))
        return TPD_OK;
    tpd_config scratch;
    const tpd_config *c = tpd_plan_memory_split(cfg, cl, opt, res_p, &scratch);
    if (!c) return TPD_ERR_NOMEM;
    /* Time is predicted even when memory does not fit, so a rejected layout still
     * shows what it would have run at. */
    if (opt->evaluate_time) TPD_CHECK(tpd_plan_time_split(cfg, cl, opt, 1, res_p, &scratch));
    return TPD_OK;
}
