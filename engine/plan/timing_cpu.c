/* The planner's time model of the cpu backend: the kernel calls that engine/model/model_step.c,
 * engine/optim/optimizer.c and parallel/ make for one step, each at a rate the cluster profile
 * gives (measured by `tripod bench --calibrate`):
 *   - linear layers: FLOPs / (peak x gemm_efficiency(FLOPs)); backward = ratio x forward;
 *   - attention (blocked causal sgemms + softmax): the same with its own curve;
 *   - memory-bound kernels: seconds per element, per kernel (elementwise_ns);
 *   - collectives: alpha-beta, bandwidth term of the ring algorithm plus ceil(log2 n)
 *     latency steps (MPI's recursive doubling at small sizes); pipeline sends one-way;
 *     each plus a sync wait (ranks sharing cores reach a sync point a time slice apart);
 *   - ranks that share cores: when the profile was measured with k ranks on c cores and
 *     the plan puts n ranks on them, every kernel slows by max(1, n/c) / max(1, k/c);
 *     a pipeline takes the longer of its full-speed critical path and the total work
 *     over the cores, since waiting stages lend their cores.
 * The pipeline is simulated per stage with each stage's own forward and backward time,
 * since the first stage (embedding) and the last (logits, loss) differ. Nothing
 * overlaps on this backend: the DP reduction and the optimizer follow the pipeline. */
#include "engine/plan/plan.h"
#include "engine/model/model_flops.h"
#include "engine/plan/plan_internal.h"

#include <math.h>
#include <stdlib.h>

#include "parallel/pipeline/schedule.h"

/* Query rows per block of the cpu attention kernel (kernels/cpu/cpu_attention.c). */
#define CPU_ATT_ROW_BLOCK 64

typedef struct cpu_model {
    const tpd_plan_cluster *cl;
    double slow; /* core-sharing factor */
} cpu_model;

double tpd_plan_cpu_attention_flops(double B, double T, double NH, double HS) {
    /* Rows [t0,t1) see keys [0,t1): QK^T and PV each 2*nb*t1*HS per (batch, head). */
    double sum = 0.0;
    for (double t0 = 0; t0 < T; t0 += CPU_ATT_ROW_BLOCK) {
        double t1 = t0 + CPU_ATT_ROW_BLOCK < T ? t0 + CPU_ATT_ROW_BLOCK : T;
        sum += (t1 - t0) * t1;
    }
    return B * NH * 4.0 * HS * sum;
}

static double core_share(const tpd_plan_cluster *cl, double ranks) {
    if (cl->cpu_cores <= 0 || ranks <= 0) return 1.0;
    double r = ranks / cl->cpu_cores;
    return r > 1.0 ? r : 1.0;
}

static cpu_model model_of(const tpd_plan_cluster *cl, const tpd_plan_layout *lay) {
    cpu_model m = {cl, 1.0};
    double gpus = (double)lay->tp * lay->pp * lay->dp;
    double per_node = gpus < cl->gpus_per_node ? gpus : cl->gpus_per_node;
    double then = cl->calibration_ranks > 0 ? cl->calibration_ranks : per_node;
    m.slow = core_share(cl, per_node) / core_share(cl, then);
    return m;
}

static double gemm_fwd(const cpu_model *m, double N, double C, double OC) {
    double flops = 2.0 * N * C * OC;
    const tpd_plan_cluster *cl = m->cl;
    return m->slow *
           (flops / (cl->peak_flops * tpd_plan_gemm_efficiency(cl, flops)) + cl->kernel_overhead_s);
}

static double gemm_bwd(const cpu_model *m, double N, double C, double OC) {
    return m->cl->gemm_bwd_ratio * gemm_fwd(m, N, C, OC);
}

static double attention_fwd(const cpu_model *m, double B, double T, double NH, double HS) {
    double flops = tpd_plan_cpu_attention_flops(B, T, NH, HS);
    const tpd_plan_cluster *cl = m->cl;
    return m->slow * (flops / (cl->peak_flops * tpd_plan_attention_efficiency(cl, flops)) +
                      cl->kernel_overhead_s);
}

/* n elements of a kernel measured at `per` s/element, else `bytes` per element at the
 * profile's bandwidth. */
static double ew(const cpu_model *m, double per, double bytes, double n) {
    const tpd_plan_cluster *cl = m->cl;
    double s = per > 0 ? per : bytes / (cl->hbm_bw * cl->mem_efficiency);
    return m->slow * (n * s + cl->kernel_overhead_s);
}

static double log2_steps(int n) {
    return n > 1 ? ceil(log2((double)n)) : 0.0;
}

/* Bandwidth and latency of a group of n ranks `stride` world ranks apart. */
static void link_of(const tpd_plan_cluster *cl, int n, int stride, double *bw, double *lat) {
    int inside = (long)n * stride <= cl->gpus_per_node;
    *bw = (inside ? cl->intra_bw : cl->inter_bw) * cl->coll_efficiency;
    *lat = inside ? cl->intra_latency : cl->inter_latency;
}

/* The sync wait of a group of n ranks (plan.h: sync_latency). */
static double sync_wait(const tpd_plan_cluster *cl, int n) {
    if (n <= 1) return 0.0;
    double k = cl->calibration_ranks;
    if (n <= 2 || k <= 2) return cl->sync_latency;
    double w = log2((double)n) - 1.0, span = log2(k) - 1.0;
    if (w >= span) return cl->sync_latency_all;
    return cl->sync_latency + w / span * (cl->sync_latency_all - cl->sync_latency);
}

/* Every collective here follows compute, so each pays the group's sync wait once. */
static double allreduce(const tpd_plan_cluster *cl, double bytes, int n, int stride) {
    if (n <= 1) return 0.0;
    double bw, lat;
    link_of(cl, n, stride, &bw, &lat);
    return 2.0 * (n - 1) / n * bytes / bw + log2_steps(n) * lat + sync_wait(cl, n);
}

static double half_ring(const tpd_plan_cluster *cl, double bytes, int n, int stride) {
    if (n <= 1) return 0.0;
    double bw, lat;
    link_of(cl, n, stride, &bw, &lat);
    return (double)(n - 1) / n * bytes / bw + log2_steps(n) * lat + sync_wait(cl, n);
}

static double p2p_time(const tpd_plan_cluster *cl, double bytes) {
    double bw = cl->p2p_bw > 0 ? cl->p2p_bw : cl->intra_bw * cl->coll_efficiency;
    double lat = cl->p2p_latency >= 0 ? cl->p2p_latency : cl->intra_latency;
    return bytes / bw + lat + sync_wait(cl, 2);
}

void tpd_plan_cpu_stage_time(const tpd_config *cfg, const tpd_plan_cluster *cl,
                             const tpd_plan_layout *lay, int stage, double *fwd_p, double *bwd_p,
                             double *tp_comm_p) {
    const tpd_config_model *md = &cfg->model;
    cpu_model m = model_of(cl, lay);
    const tpd_plan_cluster *c = cl;
    int t = lay->tp;
    double B = lay->micro_batch_size, T = md->seq_length, C = md->hidden_size;
    double F = md->ffn_hidden_size > 0 ? md->ffn_hidden_size : 4.0 * C;
    double NHl = (double)md->num_attention_heads / t, HS = C / md->num_attention_heads;
    double N = B * T, Cl = C / t, Fl = F / t, Vl = tpd_config_padded_vocab(cfg, t) / (double)t;
    double act = 4.0 * N * C; /* bytes of one (N,C) fp32 activation */
    double ar = allreduce(c, act, t, 1);
    /* Sequence parallel: LayerNorms, residual adds and the stage input hold N/t rows;
     * each all-reduce becomes a reduce-scatter, each column-parallel input an all-gather
     * (half a ring each), and the backward gathers d(out) for the row-parallel layers and
     * the LayerNorm outputs again. Per layer, forward 4 and backward 6 half rings. */
    int sp = lay->sequence_parallel && t > 1;
    double hr = half_ring(c, act, t, 1);
    double NC = N * C / (sp ? t : 1); /* elements of the row-split (N,C) regions */
    double layer_comm_f = sp ? 4 * hr : 2 * ar, layer_comm_b = sp ? 6 * hr : 2 * ar;
    double f = 0, b = 0, comm = 0;

    /* One layer forward (model_step.c): LN, QKV (bias seeded), attention, projection +
     * all-reduce + bias, residual; LN, FC1 + bias + GELU, FC2 + all-reduce + bias,
     * residual. */
    double lf = 2 * ew(&m, c->ew_layernorm_fwd, 8, NC) + gemm_fwd(&m, N, C, 3 * Cl) +
                ew(&m, c->ew_add, 8, N * 3 * Cl) + attention_fwd(&m, B, T, NHl, HS) +
                gemm_fwd(&m, N, Cl, C) + 2 * ew(&m, c->ew_add, 12, NC) + gemm_fwd(&m, N, C, Fl) +
                ew(&m, c->ew_add, 8, N * Fl) + ew(&m, c->ew_gelu_fwd, 8, N * Fl) +
                gemm_fwd(&m, N, Fl, C) + 2 * ew(&m, c->ew_add, 12, NC);
    /* Backward: the four linear backwards (each with its bias column sums), GELU, two LN
     * backwards and two residual adds; all-reduces of the column-parallel input
     * gradients. */
    double lb = gemm_bwd(&m, N, Fl, C) + ew(&m, c->ew_add, 4, N * C) +
                ew(&m, c->ew_gelu_bwd, 12, N * Fl) + gemm_bwd(&m, N, C, Fl) +
                ew(&m, c->ew_add, 4, N * Fl) + 2 * ew(&m, c->ew_layernorm_bwd, 16, NC) +
                2 * ew(&m, c->ew_add, 12, NC) + gemm_bwd(&m, N, Cl, C) +
                ew(&m, c->ew_add, 4, N * C) + c->attn_bwd_ratio * attention_fwd(&m, B, T, NHl, HS) +
                gemm_bwd(&m, N, C, 3 * Cl) + ew(&m, c->ew_add, 4, N * 3 * Cl);
    double layers = tpd_config_split_layers(cfg, lay->pp, stage, NULL);
    /* full recompute: each layer's forward runs again, with its two all-reduces, right
     * before its backward */
    int rc = lay->recompute == TPD_RECOMPUTE_FULL;
    /* selective recompute: the attention forward runs again before its backward */
    double rs = lay->recompute == TPD_RECOMPUTE_SELECTIVE ? attention_fwd(&m, B, T, NHl, HS) : 0.0;
    /* the block method recomputes only the stage's first recompute_num_layers */
    double rl = rc ? tpd_plan_recomputed_layers(cfg, lay, stage) : 0;
    f += layers * lf;
    b += layers * (lb + rs) + rl * lf;
    comm += layers * (layer_comm_f + layer_comm_b) + rl * layer_comm_f;
    if (stage == 0) {
        /* Vocab-parallel lookup + all-reduce + positions (whole rows; SP keeps its share);
         * backward scatters both (SP: after gathering d(x0)). */
        f += 2 * ew(&m, c->ew_add, 8, N * C);
        comm += ar + (sp ? hr : 0);
        b += 2 * ew(&m, c->ew_add, 8, N * C);
    }
    if (stage == lay->pp - 1) {
        /* LN_f, logits (N, Vl), vocab-parallel cross-entropy with two small all-reduces;
         * backward: dlogits in place, the logits GEMM backward + all-reduce, LN_f. */
        f += ew(&m, c->ew_layernorm_fwd, 8, NC) + gemm_fwd(&m, N, C, Vl) +
             ew(&m, c->ew_xent_fwd, 8, N * Vl);
        comm += allreduce(c, 4 * N, t, 1) + allreduce(c, 8 * N, t, 1) + (sp ? hr : 0);
        b += ew(&m, c->ew_xent_bwd, 8, N * Vl) + gemm_bwd(&m, N, C, Vl) +
             ew(&m, c->ew_layernorm_bwd, 16, NC);
        comm += sp ? 2 * hr : ar;
    }
    /* TP collectives sit inside forward and backward: split them in proportion to where
     * they are issued (forward: 2 per layer + embedding + loss; backward: 2 per layer +
     * head). */
    double comm_f = layers * layer_comm_f + (stage == 0 ? ar : 0) +
                    (stage == lay->pp - 1
                         ? allreduce(c, 4 * N, t, 1) + allreduce(c, 8 * N, t, 1) + (sp ? hr : 0)
                         : 0);
    *fwd_p = f + comm_f;
    *bwd_p = b + (comm - comm_f);
    *tp_comm_p = comm;
}

/* 1F1B with per-stage forward and backward times: each stage walks its list; a receive
 * waits for the matching send plus the p2p time. makespan_p: the last stage's end. */
static tpd_status simulate_stages(int p, int m, const double *tf, const double *tb, double p2p,
                                  double *makespan_p) {
    tpd_status st = TPD_OK;
    tpd_pp_schedule *sch = calloc((size_t)p, sizeof *sch);
    double *clock = calloc((size_t)p, sizeof *clock);
    int *pc = calloc((size_t)p, sizeof *pc);
    /* arrival time of micro-batch j's activation at stage s (act) and gradient (grad) */
    double *act = malloc((size_t)p * m * sizeof *act), *grad = malloc((size_t)p * m * sizeof *grad);
    int built = 0;
    if (!sch || !clock || !pc || !act || !grad)
        TPD_FAIL_GOTO(TPD_ERR_NOMEM, st, out, "plan: out of memory simulating %d stages", p);
    for (int i = 0; i < p * m; i++)
        act[i] = grad[i] = -1.0;
    for (; built < p; built++)
        TPD_CHECK_GOTO(tpd_pp_schedule_1f1b(p, built, m, &sch[built]), st, out);
    int remaining = 0;
    for (int s = 0; s < p; s++)
        remaining += sch[s].count;
    while (remaining > 0) {
        int moved = 0;
        for (int s = 0; s < p; s++) {
            while (pc[s] < sch[s].count) {
                const tpd_pp_action *a = &sch[s].actions[pc[s]];
                int j = a->micro_batch;
                if (a->kind == TPD_PP_RECV_ACT || a->kind == TPD_PP_RECV_GRAD) {
                    double at = a->kind == TPD_PP_RECV_ACT ? act[s * m + j] : grad[s * m + j];
                    if (at < 0) break;
                    if (at > clock[s]) clock[s] = at;
                } else if (a->kind == TPD_PP_SEND_ACT) {
                    act[(s + 1) * m + j] = clock[s] + p2p;
                } else if (a->kind == TPD_PP_SEND_GRAD) {
                    grad[(s - 1) * m + j] = clock[s] + p2p;
                } else {
                    clock[s] += a->kind == TPD_PP_FWD ? tf[s] : tb[s];
                }
                pc[s]++;
                remaining--;
                moved = 1;
            }
        }
        if (!moved) TPD_FAIL_GOTO(TPD_ERR_INTERNAL, st, out, "plan: 1F1B simulation deadlocked");
    }
    double end = 0;
    for (int s = 0; s < p; s++)
        end = clock[s] > end ? clock[s] : end;
    *makespan_p = end;
out:
    for (int s = 0; s < built; s++)
        tpd_pp_schedule_free(&sch[s]);
    free(grad);
    free(act);
    free(pc);
    free(clock);
    free(sch);
    return st;
}

tpd_status tpd_plan_cpu_time_evaluate(const tpd_config *cfg, const tpd_plan_cluster *cl,
                                      const tpd_plan_options *opt, int split_bubble,
                                      tpd_plan_result *res) {
    (void)opt;
    const tpd_plan_layout *lay = &res->layout;
    const tpd_config_model *md = &cfg->model;
    cpu_model mm = model_of(cl, lay);
    int p = lay->pp, m = res->num_micro_batches, gpus = lay->tp * lay->pp * lay->dp;
    double tf[TPD_CONFIG_MAX_STAGES], tb[TPD_CONFIG_MAX_STAGES];
    double fmax = 0, bmax = 0, comm = 0;
    for (int s = 0; s < p; s++) {
        double c;
        tpd_plan_cpu_stage_time(cfg, cl, lay, s, &tf[s], &tb[s], &c);
        if (tf[s] + tb[s] > fmax + bmax) {
            fmax = tf[s];
            bmax = tb[s];
            comm = c;
        }
    }
    /* The cpu engine sends the whole (B*T, C) fp32 activation on every TP rank, or its
     * 1/TP share of the rows under sequence parallel. */
    double p2p = p > 1 ? p2p_time(cl, 4.0 * lay->micro_batch_size * md->seq_length *
                                          md->hidden_size / (lay->sequence_parallel ? lay->tp : 1))
                       : 0.0;
    double ideal = m * (fmax + bmax), makespan = ideal, makespan0 = ideal;
    if (p > 1) {
        TPD_CHECK(simulate_stages(p, m, tf, tb, p2p, &makespan));
        makespan0 = makespan;
        if (split_bubble) TPD_CHECK(simulate_stages(p, m, tf, tb, 0.0, &makespan0));
        /* Ranks that share cores: the stage times above assume every rank computes at
         * once, but a stage waiting in the bubble gives its core to the rank it shares it
         * with. The pipeline then takes the longer of its critical path at full-core speed
         * and the machine's work (every rank's compute over the cores). */
        double per_node = gpus < cl->gpus_per_node ? gpus : cl->gpus_per_node;
        double share = core_share(cl, per_node);
        if (share > 1.0) {
            double tf1[TPD_CONFIG_MAX_STAGES], tb1[TPD_CONFIG_MAX_STAGES], crit, work = 0;
            for (int s = 0; s < p; s++) {
                tf1[s] = tf[s] / share;
                tb1[s] = tb[s] / share;
                work += (double)lay->tp * lay->dp * m * (tf1[s] + tb1[s]);
            }
            TPD_CHECK(simulate_stages(p, m, tf1, tb1, p2p, &crit));
            work /= cl->cpu_cores;
            double shared = crit > work ? crit : work;
            if (shared < makespan) {
                double k = shared / makespan;
                makespan *= k;
                makespan0 *= k;
                ideal *= k;
            }
        }
    }
    /* After the pipeline, on the stage that finishes last (stage 0 under 1F1B, which also
     * holds the most parameters with the embedding): tied-embedding all-reduce with the
     * last stage, then the DP buckets (all-reduce, or reduce-scatter under ZeRO-1). */
    double dp = 0, optim = 0;
    int zero = lay->distributed_optimizer && lay->dp > 1;
    for (int s = 0; s < p; s++) {
        double padded = res->mem[s].grads / 4.0;    /* fp32 gradient elements, padded */
        double shard = res->mem[s].optimizer / 8.0; /* AdamW m and v, fp32 */
        double bucket =
            cfg->parallel.ddp_bucket_size > 0 ? (double)cfg->parallel.ddp_bucket_size : padded;
        bucket = floor(bucket / lay->dp) * lay->dp;
        if (bucket < lay->dp) bucket = lay->dp;
        if (bucket > padded) bucket = padded;
        double nb = bucket > 0 ? ceil(padded / bucket) : 0;
        double d = 0;
        if (p > 1 && (s == 0 || s == p - 1))
            d += allreduce(cl,
                           4.0 * tpd_config_padded_vocab(cfg, lay->tp) / lay->tp * md->hidden_size,
                           2, lay->tp * lay->dp * (p - 1));
        for (double k = 0; k < nb; k++) {
            double len = padded - k * bucket < bucket ? padded - k * bucket : bucket;
            d += zero ? half_ring(cl, 4.0 * len, lay->dp, lay->tp)
                      : allreduce(cl, 4.0 * len, lay->dp, lay->tp);
        }
        /* Zeroing the gradients (start of the step), the norm over owned elements and its
         * scalar all-reduce (model-parallel group, or the world under ZeRO), AdamW on the
         * shard, the ZeRO all-gather, and the loss all-reduce + broadcast. */
        double o = ew(&mm, cl->ew_zero, 4, padded) + ew(&mm, cl->ew_sumsq, 4, shard) +
                   allreduce(cl, 4, zero ? gpus : lay->tp * p, 1) +
                   ew(&mm, cl->ew_adamw, 28, shard) + allreduce(cl, 4, lay->dp, lay->tp) +
                   half_ring(cl, 4, p, lay->tp * lay->dp);
        for (double k = 0; zero && k < nb; k++) {
            double len = padded - k * bucket < bucket ? padded - k * bucket : bucket;
            o += half_ring(cl, 4.0 * len, lay->dp, lay->tp);
        }
        if (s == 0 || d + o > dp + optim) {
            dp = d;
            optim = o;
        }
    }
    res->t_fwd_chunk = fmax;
    res->t_bwd_chunk = bmax;
    res->t_p2p = p2p;
    res->time.compute = ideal;
    res->time.tp_comm = m * comm;
    res->time.pp_bubble = makespan0 - ideal;
    res->time.pp_p2p = makespan - makespan0;
    res->time.dp_comm_exposed = dp;
    res->time.optimizer = optim;
    res->step_time_s = makespan + dp + optim;

    double gbs = cfg->training.global_batch_size;
    double vocab = tpd_config_padded_vocab(cfg, lay->tp);
    res->model_flops = tpd_model_flops(cfg, gbs, vocab);
    res->hw_flops = tpd_plan_layout_hw_flops(cfg, lay, gbs, vocab);
    res->tflops_per_gpu = res->model_flops / (res->step_time_s * gpus) / 1e12;
    res->hw_tflops_per_gpu = res->hw_flops / (res->step_time_s * gpus) / 1e12;
    res->mfu = res->model_flops / (res->step_time_s * cl->peak_flops * gpus);
    res->tokens_per_s = gbs * md->seq_length / res->step_time_s;
    return TPD_OK;
}
