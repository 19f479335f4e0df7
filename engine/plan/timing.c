/* The planner's time model.
 *
 * Per micro-batch and stage: every GEMM under a roofline (FLOPs at peak times an
 * efficiency that depends on the GEMM's size, or its bytes at HBM bandwidth, whichever
 * is slower); memory-bound kernels (LayerNorm, GELU, softmax, dropout, residual adds)
 * from the bytes they move at HBM bandwidth; TP collectives as ring algorithms on the
 * link the TP group sits on. The pipeline is the simulation of the schedule's action
 * lists with those per-chunk times; DP gradient reduction is ring over the DP group's
 * link, and only the part that backward cannot hide is counted; the optimizer step is
 * memory bound. */
#include "engine/plan/plan.h"
#include "engine/model/model_flops.h"
#include "engine/plan/plan_internal.h"

#include <math.h>
#include <stdlib.h>

#include "parallel/pipeline/schedule.h"

typedef struct op_time {
    double compute; /* s */
    double comm;    /* s, TP collectives */
} op_time;

static double gemm_time(const tpd_plan_cluster *cl, double m, double n, double k, double batch,
                        double elem) {
    double flops = 2.0 * m * n * k * batch;
    double bytes = elem * (m * k + k * n + m * n) * batch;
    double t_flops = flops / (cl->peak_flops * tpd_plan_gemm_efficiency(cl, flops));
    double t_bytes = bytes / (cl->hbm_bw * cl->mem_efficiency);
    return (t_flops > t_bytes ? t_flops : t_bytes) + cl->kernel_overhead_s;
}

static double mem_time(const tpd_plan_cluster *cl, double bytes) {
    return bytes / (cl->hbm_bw * cl->mem_efficiency) + cl->kernel_overhead_s;
}

/* Ring all-reduce of `bytes` over n ranks: 2(n-1)/n of the data crosses each link. */
static double allreduce_time(double bytes, int n, double bw, double lat) {
    if (n <= 1) return 0.0;
    return 2.0 * (n - 1) / n * bytes / bw + 2.0 * (n - 1) * lat;
}

/* Reduce-scatter or all-gather: (n-1)/n of the data. */
static double half_ring_time(double bytes, int n, double bw, double lat) {
    if (n <= 1) return 0.0;
    return (double)(n - 1) / n * bytes / bw + (n - 1) * lat;
}

/* Link of a group of n ranks whose world ranks are `stride` apart (TP 1, DP TP, PP
 * TP*DP): intra-node when the whole group sits in one node. A group spread over nodes
 * with k members per node runs k rings side by side, one per NIC. */
static void group_link(const tpd_plan_cluster *cl, int n, int stride, double *bw_p, double *lat_p) {
    int gpn = cl->gpus_per_node;
    if ((long)n * stride <= gpn) {
        *bw_p = cl->intra_bw * cl->coll_efficiency;
        *lat_p = cl->intra_latency;
        return;
    }
    int per_node = stride >= gpn ? 1 : gpn / stride;
    double bw = per_node * cl->inter_bw;
    if (bw > cl->intra_bw) bw = cl->intra_bw;
    *bw_p = bw * cl->coll_efficiency;
    *lat_p = cl->inter_latency;
}

/* One transformer layer, one micro-batch, forward. `attn_only` returns just the
 * attention core (what selective recomputation repeats). */
static op_time layer_forward(const tpd_config *cfg, const tpd_plan_cluster *cl,
                             const tpd_plan_layout *lay, int attn_only) {
    const tpd_config_model *m = &cfg->model;
    double s = m->seq_length, b = lay->micro_batch_size, h = m->hidden_size;
    double a = m->num_attention_heads, t = lay->tp;
    double f = m->ffn_hidden_size > 0 ? m->ffn_hidden_size : 4.0 * h;
    double e =
        (cfg->training.precision == TPD_PRECISION_BF16) ? 2.0 : 4.0; /* activation element, bytes */
    double tok = s * b, sbh = s * b * h, d = h / a;
    double rep = lay->sequence_parallel ? 1.0 / t : 1.0; /* LN/dropout share per rank */
    op_time o = {0.0, 0.0};

    /* Attention core. */
    if (tpd_plan_uses_flash(cfg)) {
        /* Fused kernel: QK^T and AV with the causal half skipped, no s x s tensor. */
        double flops = 0.5 * 4.0 * b * s * s * h / t;
        o.compute += flops / (cl->peak_flops * cl->flash_efficiency) + cl->kernel_overhead_s;
    } else {
        double heads = b * a / t;
        o.compute += gemm_time(cl, s, s, d, heads, e); /* scores = Q K^T */
        o.compute += gemm_time(cl, s, d, s, heads, e); /* context = probs V */
        /* Fused scale-mask-softmax (read + write) and dropout on the probabilities
         * (read, write, 1-byte mask) over b*a/t*s*s elements; head transposes of Q, K,
         * V and the context (read + write of 4*s*b*h/t). */
        o.compute += mem_time(cl, e * 2.0 * heads * s * s);
        o.compute += mem_time(cl, (2.0 * e + 1.0) * heads * s * s);
        o.compute += mem_time(cl, e * 8.0 * sbh / t);
    }
    if (attn_only) return o;

    o.compute += gemm_time(cl, tok, 3.0 * h / t, h, 1, e); /* QKV */
    o.compute += gemm_time(cl, tok, h, h / t, 1, e);       /* attention projection */
    o.compute += gemm_time(cl, tok, f / t, h, 1, e);       /* FC1 */
    o.compute += gemm_time(cl, tok, h, f / t, 1, e);       /* FC2 */
    /* Two LayerNorms (read + write), two bias-dropout-residual adds (read input and
     * residual, write output, 1-byte mask), bias-GELU on the f-wide hidden (read + write). */
    o.compute += 2.0 * mem_time(cl, 2.0 * e * sbh * rep);
    o.compute += 2.0 * mem_time(cl, (3.0 * e + 1.0) * sbh * rep);
    o.compute += mem_time(cl, 2.0 * e * s * b * f / t);

    /* Two all-reduces (or reduce-scatter + all-gather pairs with SP: same volume) of the
     * s*b*h activations. */
    double bw, lat;
    group_link(cl, lay->tp, 1, &bw, &lat);
    o.comm += 2.0 * allreduce_time(e * sbh, lay->tp, bw, lat);
    return o;
}

/* Backward of one layer from its forward: GEMMs and attention twice (data and weight
 * gradients), memory-bound kernels read about twice what forward did, same collectives. */
static op_time layer_backward(op_time fwd) {
    op_time o = {2.0 * fwd.compute, fwd.comm};
    return o;
}

/* Token + position embedding (stage 0) and LM head + loss (last stage). */
static void ends_time(const tpd_config *cfg, const tpd_plan_cluster *cl, const tpd_plan_layout *lay,
                      int stage, op_time *fwd, op_time *bwd) {
    const tpd_config_model *m = &cfg->model;
    double s = m->seq_length, b = lay->micro_batch_size, h = m->hidden_size, t = lay->tp;
    double e = (cfg->training.precision == TPD_PRECISION_BF16) ? 2.0 : 4.0;
    double sbh = s * b * h, vp = tpd_config_padded_vocab(cfg, lay->tp);
    double bw, lat;
    group_link(cl, lay->tp, 1, &bw, &lat);
    if (stage == 0) {
        /* Gather rows, add positions, dropout; vocab-parallel embedding all-reduce. */
        fwd->compute += mem_time(cl, (5.0 * e + 1.0) * sbh);
        fwd->comm += allreduce_time(e * sbh, lay->tp, bw, lat);
        bwd->compute += mem_time(cl, 4.0 * e * sbh);
    }
    if (stage == lay->pp - 1) {
        /* Final LayerNorm, logits GEMM (s*b, V/t, h), vocab-parallel cross-entropy in fp32
         * (about four passes over the s*b*V/t logits forward, three backward). */
        double rep = lay->sequence_parallel ? 1.0 / t : 1.0;
        double lg = gemm_time(cl, s * b, vp / t, h, 1, e);
        fwd->compute +=
            mem_time(cl, 2.0 * e * sbh * rep) + lg + mem_time(cl, 4.0 * 4.0 * s * b * vp / t);
        bwd->compute +=
            mem_time(cl, 4.0 * e * sbh * rep) + 2.0 * lg + mem_time(cl, 3.0 * 4.0 * s * b * vp / t);
        if (lay->sequence_parallel) fwd->comm += half_ring_time(e * sbh, lay->tp, bw, lat);
        bwd->comm += allreduce_time(e * sbh, lay->tp, bw, lat) * (lay->tp > 1);
    }
}

void tpd_plan_stage_time(const tpd_config *cfg, const tpd_plan_cluster *cl,
                         const tpd_plan_layout *lay, int stage, double *fwd_p, double *bwd_p,
                         double *tp_comm_p) {
    if (cl->backend == TPD_PLAN_BACKEND_CPU) {
        tpd_plan_cpu_stage_time(cfg, cl, lay, stage, fwd_p, bwd_p, tp_comm_p);
        return;
    }
    op_time lf = layer_forward(cfg, cl, lay, 0);
    op_time lb = layer_backward(lf);
    op_time rc = {0.0, 0.0};
    if (lay->recompute == TPD_RECOMPUTE_FULL) rc = lf;
    if (lay->recompute == TPD_RECOMPUTE_SELECTIVE) rc = layer_forward(cfg, cl, lay, 1);
    double layers = tpd_config_split_layers(cfg, lay->pp, stage, NULL);
    /* full recompute runs on the block method's layers only */
    double rl =
        lay->recompute == TPD_RECOMPUTE_FULL ? tpd_plan_recomputed_layers(cfg, lay, stage) : layers;
    op_time f = {layers * lf.compute, layers * lf.comm};
    op_time b = {layers * lb.compute + rl * rc.compute, layers * lb.comm + rl * rc.comm};
    ends_time(cfg, cl, lay, stage, &f, &b);
    *fwd_p = f.compute + f.comm;
    *bwd_p = b.compute + b.comm;
    *tp_comm_p = f.comm + b.comm;
}

/* DP gradient reduction of the slowest stage (fp32 main grads; ZeRO-1 reduce-scatters
 * them and all-gathers the updated bf16 parameters), plus the tied-embedding gradient
 * all-reduce between the first and last stage. */
static double dp_time(const tpd_config *cfg, const tpd_plan_cluster *cl, const tpd_plan_layout *lay,
                      double *params_max_p) {
    double bw, lat, worst = 0.0, nmax = 0.0;
    group_link(cl, lay->dp, lay->tp, &bw, &lat);
    double pe = (cfg->training.precision == TPD_PRECISION_BF16) ? 2.0 : 4.0;
    for (int s = 0; s < lay->pp; s++) {
        double n = tpd_plan_stage_params(cfg, lay, s);
        double t = lay->distributed_optimizer ? half_ring_time(4.0 * n, lay->dp, bw, lat) +
                                                    half_ring_time(pe * n, lay->dp, bw, lat)
                                              : allreduce_time(4.0 * n, lay->dp, bw, lat);
        if (t > worst) worst = t;
        if (n > nmax) nmax = n;
    }
    if (lay->pp > 1) {
        double ebw, elat;
        group_link(cl, 2, lay->tp * lay->dp * (lay->pp - 1), &ebw, &elat);
        double emb = 4.0 * tpd_config_padded_vocab(cfg, lay->tp) * cfg->model.hidden_size / lay->tp;
        worst += allreduce_time(emb, 2, ebw, elat);
    }
    *params_max_p = nmax;
    return worst;
}

/* AdamW over this rank's shard: read the fp32 grad, read/write master, m and v, write the
 * bf16 weight (30 bytes per parameter; fp32 28), plus one read of the grads for the norm. */
static double optimizer_time(const tpd_config *cfg, const tpd_plan_cluster *cl,
                             const tpd_plan_layout *lay, double params) {
    double shard = lay->distributed_optimizer ? params / lay->dp : params;
    double per = (cfg->training.precision == TPD_PRECISION_BF16) ? 30.0 : 28.0;
    return mem_time(cl, shard * per + params * 4.0);
}

static double dp_exposed(const tpd_config *cfg, const tpd_plan_options *opt, double dp,
                         double params, double last_bwd) {
    if (!opt->dp_overlap) return dp;
    /* Buckets reduce while the last micro-batch's backward runs; the last bucket is
     * always exposed. */
    double bucket =
        cfg->parallel.ddp_bucket_size > 0 ? (double)cfg->parallel.ddp_bucket_size : 40e6;
    double last_share = params > 0 ? (bucket < params ? bucket / params : 1.0) : 1.0;
    double hidden = dp - last_bwd;
    double tail = dp * last_share;
    return hidden > tail ? hidden : tail;
}

double tpd_plan_time_lower_bound(const tpd_config *cfg, const tpd_plan_cluster *cl,
                                 const tpd_plan_result *res, const tpd_plan_options *opt) {
    const tpd_plan_layout *lay = &res->layout;
    double fmax = 0.0, bmax = 0.0;
    for (int s = 0; s < lay->pp; s++) {
        double f, b, c;
        tpd_plan_stage_time(cfg, cl, lay, s, &f, &b, &c);
        if (f > fmax) fmax = f;
        if (b > bmax) bmax = b;
    }
    double nmax;
    double dp = dp_time(cfg, cl, lay, &nmax);
    return res->num_micro_batches * (fmax + bmax) + dp_exposed(cfg, opt, dp, nmax, bmax) +
           optimizer_time(cfg, cl, lay, nmax);
}

static tpd_status simulate(const tpd_plan_layout *lay, int m, double tf, double tb, double tp2p,
                           double *makespan_p) {
    tpd_status st = TPD_OK;
    int p = lay->pp, v = lay->virtual_stages > 0 ? lay->virtual_stages : 1;
    tpd_pp_schedule *sch = calloc((size_t)p, sizeof *sch);
    tpd_pp_sim_times *times = calloc((size_t)p, sizeof *times);
    int built = 0;
    if (!sch || !times) TPD_FAIL_GOTO(TPD_ERR_NOMEM, st, free_scheds, "plan: out of memory");
    for (; built < p; built++) {
        times[built] = (tpd_pp_sim_times){tf, tb, 0.0, tp2p};
        TPD_CHECK_GOTO(tpd_pp_schedule_make(v > 1 ? TPD_PP_KIND_INTERLEAVED : TPD_PP_KIND_1F1B, p,
                                            built, m, v, &sch[built]),
                       st, free_scheds);
    }
    tpd_pp_sim_result r;
    TPD_CHECK_GOTO(tpd_pp_simulate(sch, p, times, NULL, NULL, &r), st, free_scheds);
    *makespan_p = r.makespan;
free_scheds:
    for (int i = 0; i < built; i++)
        tpd_pp_schedule_free(&sch[i]);
    free(times);
    free(sch);
    return st;
}

tpd_status tpd_plan_time_evaluate(const tpd_config *cfg, const tpd_plan_cluster *cl,
                                  const tpd_plan_options *opt, int split_bubble,
                                  tpd_plan_result *res) {
    if (cl->backend == TPD_PLAN_BACKEND_CPU)
        return tpd_plan_cpu_time_evaluate(cfg, cl, opt, split_bubble, res);
    const tpd_plan_layout *lay = &res->layout;
    const tpd_config_model *mdl = &cfg->model;
    int v = lay->virtual_stages > 0 ? lay->virtual_stages : 1;
    int m = res->num_micro_batches;
    double fmax = 0.0, bmax = 0.0, comm = 0.0;
    for (int s = 0; s < lay->pp; s++) {
        double f, b, c;
        tpd_plan_stage_time(cfg, cl, lay, s, &f, &b, &c);
        /* The slowest stage paces the steady state. */
        if (f + b > fmax + bmax) {
            fmax = f;
            bmax = b;
            comm = c;
        }
    }
    /* p2p of s*b*h/t elements (Megatron's scatter-gather, or the SP shard) between
     * neighbouring stages, TP*DP ranks apart. */
    double e = (cfg->training.precision == TPD_PRECISION_BF16) ? 2.0 : 4.0;
    double p2p = 0.0;
    if (lay->pp > 1) {
        double bw, lat;
        group_link(cl, 2, lay->tp * lay->dp, &bw, &lat);
        /* Each TP rank sends its own shard over its own link: no sharing. */
        if ((long)2 * lay->tp * lay->dp > cl->gpus_per_node)
            bw = cl->inter_bw * cl->coll_efficiency;
        p2p =
            e * mdl->seq_length * (double)lay->micro_batch_size * mdl->hidden_size / lay->tp / bw +
            lat;
    }
    res->t_fwd_chunk = fmax / v;
    res->t_bwd_chunk = bmax / v;
    res->t_p2p = p2p;
    double ideal = m * (fmax + bmax), makespan = ideal, makespan0 = ideal;
    if (lay->pp > 1) {
        TPD_CHECK(simulate(lay, m, fmax / v, bmax / v, p2p, &makespan));
        makespan0 = makespan;
        if (split_bubble) TPD_CHECK(simulate(lay, m, fmax / v, bmax / v, 0.0, &makespan0));
    }
    double nmax;
    double dp = dp_time(cfg, cl, lay, &nmax);
    res->time.compute = ideal;
    res->time.tp_comm = m * comm;
    res->time.pp_bubble = makespan0 - ideal;
    res->time.pp_p2p = makespan - makespan0;
    res->time.dp_comm_exposed = dp_exposed(cfg, opt, dp, nmax, bmax);
    res->time.optimizer = optimizer_time(cfg, cl, lay, nmax);
    res->step_time_s = makespan + res->time.dp_comm_exposed + res->time.optimizer;

    double gbs = cfg->training.global_batch_size;
    double vocab = tpd_config_padded_vocab(cfg, lay->tp);
    int gpus = lay->tp * lay->pp * lay->dp;
    res->model_flops = tpd_model_flops(cfg, gbs, vocab);
    res->hw_flops = tpd_plan_layout_hw_flops(cfg, lay, gbs, vocab);
    res->tflops_per_gpu = res->model_flops / (res->step_time_s * gpus) / 1e12;
    res->hw_tflops_per_gpu = res->hw_flops / (res->step_time_s * gpus) / 1e12;
    res->mfu = res->model_flops / (res->step_time_s * cl->peak_flops * gpus);
    res->tokens_per_s = gbs * mdl->seq_length / res->step_time_s;
    return TPD_OK;
}
