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
 * since the first stage (embedding) and the last (logits, loss) differ, by the simulator
 * the planner shares with the GPU model (step.c), which also places the DP reduction
 * against the last backward (overlap_grad_reduce) and the ZeRO gathers against the next
 * forward (overlap_param_gather), as the engine's grad_sync does. */
#include "engine/plan/plan.h"
#include "engine/model/model_flops.h"
#include "engine/plan/plan_internal.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

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
    double gpus = (double)tpd_plan_world(lay);
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

static void cpu_stage_cost(const tpd_config *cfg, const tpd_plan_cluster *cl,
                           const tpd_plan_layout *lay, int stage, tpd_plan_stage_cost *out);

void tpd_plan_cpu_stage_cost(const tpd_config *cfg, const tpd_plan_cluster *cl,
                             const tpd_plan_layout *lay, int stage, tpd_plan_stage_cost *out) {
    tpd_plan_stage_cost_kinds(cfg, cl, lay, stage, cpu_stage_cost, out);
}

static void cpu_stage_cost(const tpd_config *cfg, const tpd_plan_cluster *cl,
                           const tpd_plan_layout *lay, int stage, tpd_plan_stage_cost *out) {
    const tpd_config_model *md = &cfg->model;
    cpu_model m = model_of(cl, lay);
    const tpd_plan_cluster *c = cl;
    int t = lay->tp, cp = tpd_plan_cp(lay), ring = cp > 1 && lay->cp_comm == TPD_CP_COMM_P2P;
    /* T: a CP rank's tokens of each sequence */
    double B = lay->micro_batch_size, T = tpd_plan_local_seq(cfg, lay), C = md->hidden_size;
    double F = md->ffn_hidden_size;
    /* Cl: the local query heads' width (C/t unless model.kv_channels sets the head size) */
    double NHl = (double)md->num_attention_heads / t, HS = tpd_config_head_dim(cfg);
    double N = B * T, Cl = NHl * HS, Fl = F / t, Vl = tpd_config_padded_vocab(cfg, t) / (double)t;
    /* the block's shapes: QKVl local QKV columns (K and V of the K/V heads), FCl the first
     * MLP GEMM's (SwiGLU: [gate; up]); GPT-2's are 3*Cl and Fl. The Llama block's
     * elementwise kernels are priced at their GPT-2 counterparts' measured rates until
     * calibration measures them: RMSNorm as LayerNorm, SwiGLU as GELU, RoPE as an add. */
    double KVl = (double)tpd_config_kv_heads(cfg) / t * HS, QKVl = Cl + 2 * KVl;
    double FCl = md->swiglu ? 2 * Fl : Fl;
    double bias = md->add_bias_linear ? 1.0 : 0.0;
    double rope = md->position_embedding_type == TPD_POS_ROPE ? 1.0 : 0.0;
    double qkn = md->qk_layernorm ? 1.0 : 0.0; /* Qwen3's QK norm, priced as a norm */
    double act = 4.0 * N * C;                  /* bytes of one (N,C) fp32 activation */
    double ar = allreduce(c, act, t, 1);
    /* Sequence parallel: LayerNorms, residual adds and the stage input hold N/t rows;
     * each all-reduce becomes a reduce-scatter, each column-parallel input an all-gather
     * (half a ring each), and the backward gathers d(out) for the row-parallel layers and
     * the LayerNorm outputs again. Per layer, forward 4 and backward 6 half rings. */
    int sp = lay->sequence_parallel && t > 1;
    double hr = half_ring(c, act, t, 1);
    double NC = N * C / (sp ? t : 1); /* elements of the row-split (N,C) regions */
    double layer_comm_f = sp ? 4 * hr : 2 * ar, layer_comm_b = sp ? 6 * hr : 2 * ar;
    /* Attention under CP: 1/CP of the whole sequence's on each rank; the ring's CP block
     * calls of 1/CP of that each, with CP - 1 K/V sends (twice the bytes in the backward:
     * K/V and dK/dV) that the cpu engine waits for (MPI advances inside its calls); a2a's
     * one call on NHl/CP heads of the whole sequence between two all-to-alls each way. */
    double att = attention_fwd(&m, B, T, NHl, HS), cp_f = 0.0, cp_b = 0.0;
    if (cp > 1) {
        double S = md->seq_length;
        double bw, lat;
        link_of(c, cp, t, &bw, &lat);
        if (ring) {
            double call = tpd_plan_cpu_attention_flops(B, S, NHl, HS) / ((double)cp * cp);
            att = cp * m.slow *
                  (call / (c->peak_flops * tpd_plan_attention_efficiency(c, call)) +
                   c->kernel_overhead_s);
            double send = 4.0 * N * 2 * KVl / bw + lat + sync_wait(c, 2);
            cp_f = (cp - 1) * send;
            cp_b = 2 * cp_f;
        } else {
            att = attention_fwd(&m, B, S, NHl / cp, HS);
            double a2a_qkv = half_ring(c, 4.0 * N * QKVl, cp, t),
                   a2a_out = half_ring(c, 4.0 * N * Cl, cp, t);
            cp_f = cp_b = a2a_qkv + a2a_out;
        }
        layer_comm_f += cp_f;
        layer_comm_b += cp_b;
    }
    /* EP: the MoE layer's dispatch and combine all-to-alls of the rank's N k assignments (the
     * busiest rank receiving moe_imbalance times the mean), each way, on the EP group's link
     * (EP ranks TP x CP apart), the counts first in the forward */
    double ep_f = 0.0, ep_b = 0.0;
    int ep = tpd_plan_ep(lay);
    if (ep > 1 && md->num_moe_experts > 0) {
        double rows = N * md->moe_router_topk * tpd_plan_moe_imbalance(cfg, lay);
        double one = half_ring(c, 4.0 * rows * C, ep, t * cp);
        ep_f = 2 * one + half_ring(c, 4.0 * md->num_moe_experts, ep, t * cp);
        ep_b = 2 * one;
        layer_comm_f += ep_f;
        layer_comm_b += ep_b;
    }

    /* One layer forward (model_step.c): norm, QKV (bias seeded), RoPE, attention,
     * projection + all-reduce + bias, residual; norm, FC1 + bias + GELU (or [gate; up] and
     * SwiGLU), FC2 + all-reduce + bias, residual. */
    double lf = 2 * ew(&m, c->ew_layernorm_fwd, 8, NC) + gemm_fwd(&m, N, C, QKVl) +
                bias * ew(&m, c->ew_add, 8, N * QKVl) +
                rope * ew(&m, c->ew_add, 8, N * (Cl + KVl)) +
                qkn * ew(&m, c->ew_layernorm_fwd, 12, N * (Cl + KVl)) + att +
                gemm_fwd(&m, N, Cl, C) + 2 * ew(&m, c->ew_add, 12, NC) + gemm_fwd(&m, N, C, FCl) +
                bias * ew(&m, c->ew_add, 8, N * FCl) + ew(&m, c->ew_gelu_fwd, 8, N * Fl) +
                gemm_fwd(&m, N, Fl, C) + 2 * ew(&m, c->ew_add, 12, NC);
    /* Backward: the four linear backwards (each with its bias column sums), GELU or
     * SwiGLU, RoPE's transposed rotation, two norm backwards and two residual adds;
     * all-reduces of the column-parallel input gradients. */
    double lb = gemm_bwd(&m, N, Fl, C) + bias * ew(&m, c->ew_add, 4, N * C) +
                ew(&m, c->ew_gelu_bwd, 12, N * Fl) + gemm_bwd(&m, N, C, FCl) +
                bias * ew(&m, c->ew_add, 4, N * FCl) + 2 * ew(&m, c->ew_layernorm_bwd, 16, NC) +
                2 * ew(&m, c->ew_add, 12, NC) + gemm_bwd(&m, N, Cl, C) +
                bias * ew(&m, c->ew_add, 4, N * C) + c->attn_bwd_ratio * att +
                rope * ew(&m, c->ew_add, 8, N * (Cl + KVl)) +
                qkn * ew(&m, c->ew_layernorm_bwd, 16, N * (Cl + KVl)) + gemm_bwd(&m, N, C, QKVl) +
                bias * ew(&m, c->ew_add, 4, N * QKVl);
    /* W's share of it (tpd_model_weight_grad): the weight half of each linear backward (dW
     * has the FLOPs of dX) and the bias sums; under SP it gathers ln1, ln2, d(out), d(x1).
     * A split backward (zb-h1) also copies W's output gradients in B (two (Nl,C) rows,
     * dqkv), and gathers twice more under SP than the unsplit one. */
    double lw = 0.5 * (gemm_bwd(&m, N, Fl, C) + gemm_bwd(&m, N, C, FCl) + gemm_bwd(&m, N, Cl, C) +
                       gemm_bwd(&m, N, C, QKVl)) +
                bias * 2 * ew(&m, c->ew_add, 4, N * C) + bias * ew(&m, c->ew_add, 4, N * FCl) +
                bias * ew(&m, c->ew_add, 4, N * QKVl) + (sp ? 4 * hr : 0);
    int split = tpd_plan_layout_schedule(lay) == TPD_SCHEDULE_ZB_H1;
    double split_extra =
        split ? 2 * ew(&m, c->ew_add, 8, NC) + ew(&m, c->ew_add, 8, N * QKVl) + (sp ? 2 * hr : 0)
              : 0.0;
    double layers = tpd_plan_stage_layers(cfg, lay, stage);
    /* full recompute: each layer's forward runs again, with its two all-reduces, right
     * before its backward */
    int rc = lay->recompute == TPD_RECOMPUTE_FULL;
    /* selective recompute: the attention forward runs again before its backward */
    double rs = lay->recompute == TPD_RECOMPUTE_SELECTIVE && !ring ? att : 0.0;
    /* the block method recomputes only the first recompute_num_layers of each chunk */
    double rl = rc ? tpd_plan_recomputed_layers(cfg, lay, stage) : 0;
    double f = layers * (lf + layer_comm_f);
    double b = layers * (lb + rs + layer_comm_b + split_extra) + rl * (lf + layer_comm_f);
    double comm =
        layers * (layer_comm_f + layer_comm_b + (split && sp ? 2 * hr : 0)) + rl * layer_comm_f;
    double cp_comm = layers * (cp_f + cp_b) + rl * cp_f;
    memset(out, 0, sizeof *out);
    out->cp_comm = cp_comm;
    comm -= cp_comm;
    out->ep_comm = layers * (ep_f + ep_b) + rl * ep_f;
    comm -= out->ep_comm;
    if (stage == 0) {
        /* Vocab-parallel lookup + all-reduce + positions (whole rows; SP keeps its share);
         * backward scatters both (SP: after gathering d(x0)). */
        double wpe = md->position_embedding_type == TPD_POS_LEARNED ? 1.0 : 0.0;
        out->embed_fwd = (1 + wpe) * ew(&m, c->ew_add, 8, N * C) + ar;
        out->embed_bwd = (1 + wpe) * ew(&m, c->ew_add, 8, N * C) + (sp ? hr : 0);
        comm += ar + (sp ? hr : 0);
    }
    if (stage == lay->pp - 1) {
        /* LN_f, logits (N, Vl), vocab-parallel cross-entropy with two small all-reduces;
         * backward: dlogits in place, the logits GEMM backward + all-reduce, LN_f. */
        double cf = allreduce(c, 4 * N, t, 1) + allreduce(c, 8 * N, t, 1) + (sp ? hr : 0);
        double cb = sp ? 2 * hr : ar;
        out->head_fwd = ew(&m, c->ew_layernorm_fwd, 8, NC) + gemm_fwd(&m, N, C, Vl) +
                        ew(&m, c->ew_xent_fwd, 8, N * Vl) + cf;
        out->head_bwd = ew(&m, c->ew_xent_bwd, 8, N * Vl) + gemm_bwd(&m, N, C, Vl) +
                        ew(&m, c->ew_layernorm_bwd, 16, NC) + cb;
        comm += cf + cb;
    }
    out->fwd = f + out->embed_fwd + out->head_fwd;
    out->bwd = b + out->embed_bwd + out->head_bwd;
    out->wgrad = layers * lw;
    out->tp_comm = comm;
}

/* DP communication of the cpu engine: all-reduce of fp32 gradient buckets (ZeRO:
 * reduce-scatter, then the all-gather of fp32 parameters), each collective paying the sync
 * wait of ranks that share cores; the tied embedding's all-reduce between the ends (none
 * when untied). */
void tpd_plan_cpu_dp_cost(const tpd_config *cfg, const tpd_plan_cluster *cl,
                          const tpd_plan_layout *lay, tpd_plan_dp_cost *out) {
    memset(out, 0, sizeof *out);
    int n = tpd_plan_dp_inner(cfg, lay), zero = lay->distributed_optimizer && n > 1;
    int ep = tpd_plan_ep(lay), ne = ep > 1 ? n / ep : 0;
    out->grad_bytes = out->param_bytes = 4.0;
    if (ne > 1) { /* EP: the experts' gradients over expert-DP, all-reduced */
        double bw, lat;
        link_of(cl, ne, lay->tp * ep, &bw, &lat);
        out->reduce_ep.per_byte = 2.0 * (ne - 1) / ne / bw;
        out->reduce_ep.fixed = log2_steps(ne) * lat + sync_wait(cl, ne);
    }
    if (n > 1) {
        double bw, lat;
        link_of(cl, n, lay->tp, &bw, &lat);
        double k = zero ? 1.0 : 2.0;
        out->reduce.per_byte = k * (n - 1) / n / bw;
        out->reduce.fixed = log2_steps(n) * lat + sync_wait(cl, n);
        if (zero) {
            out->gather.per_byte = (double)(n - 1) / n / bw;
            out->gather.fixed = out->reduce.fixed;
        }
    }
    if (tpd_plan_embedding_group(cfg, lay))
        out->emb_allreduce = allreduce(
            cl, 4.0 * tpd_config_padded_vocab(cfg, lay->tp) / lay->tp * cfg->model.hidden_size, 2,
            (int)(tpd_plan_pp_stride(cfg, lay) * (lay->pp - 1)));
}

/* optim_grads and optim_grads_params on the cpu engine, beyond the bucket model's one
 * reduction (and, under optim_grads, one gather) a step: every micro-batch reduce-scatters
 * each unit's gradients, and under optim_grads_params gathers each unit before its forward
 * and again before its backward. Exposed whole: MPI advances only inside the calls the
 * hooks make, and the ranks share the cores. HSDP all-reduces the gradient shard across
 * the groups once a step. Summed over the busiest stage's units (its shard). */
static void cpu_shard_time(const tpd_config *cfg, const tpd_plan_cluster *cl,
                           const tpd_plan_layout *lay, tpd_plan_result *res) {
    tpd_dp_sharding sh = tpd_plan_sharding(lay);
    int H = tpd_plan_shard_group(cfg, lay), inner = tpd_plan_dp_inner(cfg, lay);
    int M = res->num_micro_batches;
    if (sh < TPD_DP_SHARDING_OPTIM_GRADS || H < 2 || M < 1) return;
    double bw, lat, worst = 0.0, rep = 0.0;
    link_of(cl, H, lay->tp, &bw, &lat);
    double ring = (H - 1.0) / H / bw, fixed = log2_steps(H) * lat + sync_wait(cl, H);
    for (int s = 0; s < lay->pp; s++) {
        const tpd_plan_stage_mem *mm = &res->mem[s];
        double shard = mm->grads / 4.0, full = shard * H; /* fp32 gradients on cpu */
        int units = tpd_plan_stage_layers(cfg, lay, s) + 2;
        double rs = ring * full * 4.0 + units * fixed, ag = ring * full * 4.0 + units * fixed;
        double t = (M - 1) * rs + (sh == TPD_DP_SHARDING_OPTIM_GRADS_PARAMS ? 2.0 * M * ag : 0.0);
        if (t > worst) worst = t;
        if (H < inner) {
            double r = allreduce(cl, 4.0 * shard, inner / H, lay->tp * H);
            if (r > rep) rep = r;
        }
    }
    res->time.dp_shard_exposed = worst;
    res->time.dp_replica_allreduce = rep;
    res->step_time_s += worst + rep;
}

/* Every time of the simulated pipeline times k (the whole pipeline runs k times as fast). */
static void scale_pipe(tpd_plan_pipe *p, double k) {
    p->makespan *= k;
    for (int s = 0; s < p->stages; s++) {
        p->end[s] *= k;
        p->busy[s] *= k;
        for (int i = 0; i < p->sched[s].count; i++) {
            p->t0[s][i] *= k;
            p->t1[s][i] *= k;
        }
    }
}

tpd_status tpd_plan_cpu_time_evaluate(const tpd_config *cfg, const tpd_plan_cluster *cl,
                                      const tpd_plan_options *opt, int split_bubble,
                                      tpd_plan_result *res) {
    (void)opt;
    tpd_status st = TPD_OK;
    const tpd_plan_layout *lay = &res->layout;
    const tpd_config_model *md = &cfg->model;
    int bf16 = cfg->training.precision == TPD_PRECISION_BF16;
    static atomic_int warned;
    if (cl->calibrated && bf16 != cl->calibrated_bf16 && !atomic_exchange(&warned, 1))
        tpd_log_warn("cluster %s was calibrated with training.precision %s, and this config "
                     "trains in %s: its kernel times are the other precision's (calibrate with "
                     "the config's precision: tripod bench --calibrate CONFIG "
                     "training.precision=%s)",
                     cl->name, cl->calibrated_bf16 ? "bf16" : "fp32", bf16 ? "bf16" : "fp32",
                     bf16 ? "bf16" : "fp32");
    cpu_model mm = model_of(cl, lay);
    int p = lay->pp, m = res->num_micro_batches, gpus = (int)tpd_plan_world(lay);
    int slowest = 0;
    tpd_plan_stage_cost cost[TPD_CONFIG_MAX_STAGES];
    memset(cost, 0, sizeof cost);
    for (int s = 0; s < p; s++) {
        tpd_plan_cpu_stage_cost(cfg, cl, lay, s, &cost[s]);
        if (cost[s].fwd + cost[s].bwd > cost[slowest].fwd + cost[slowest].bwd) slowest = s;
    }
    /* The cpu engine sends the whole (B*T, C) activation (fp32 or bf16) on every TP rank, or
     * its 1/TP share of the rows under sequence parallel. */
    double p2p = p > 1 ? p2p_time(cl, (bf16 ? 2.0 : 4.0) * lay->micro_batch_size *
                                          tpd_plan_local_seq(cfg, lay) * md->hidden_size /
                                          (lay->sequence_parallel ? lay->tp : 1))
                       : 0.0;
    const tpd_plan_stage_cost *sc = &cost[slowest];
    tpd_plan_set_times(lay, cost, slowest, p2p, res);
    double ideal = m * (sc->fwd + sc->bwd);
    tpd_plan_pipe pipe, probe;
    memset(&pipe, 0, sizeof pipe);
    memset(&probe, 0, sizeof probe);
    TPD_CHECK_GOTO(tpd_plan_pipe_simulate(lay, m, res->stage_times, &pipe), st, out);
    double makespan = pipe.makespan, makespan0 = makespan;
    if (p > 1) {
        tpd_pp_sim_times t1[TPD_CONFIG_MAX_STAGES];
        if (split_bubble) {
            tpd_plan_sim_times(lay, cost, 0.0, t1);
            TPD_CHECK_GOTO(tpd_plan_pipe_simulate(lay, m, t1, &probe), st, out);
            makespan0 = probe.makespan;
            tpd_plan_pipe_free(&probe);
        }
        /* Ranks that share cores: the stage times above assume every rank computes at
         * once, but a stage waiting in the bubble gives its core to the rank it shares it
         * with. The pipeline then takes the longer of its critical path at full-core speed
         * and the machine's work (every rank's compute over the cores). */
        double per_node = gpus < cl->gpus_per_node ? gpus : cl->gpus_per_node;
        double share = core_share(cl, per_node);
        if (share > 1.0) {
            double work = 0;
            for (int s = 0; s < p; s++) {
                t1[s] = res->stage_times[s];
                t1[s].fwd /= share;
                t1[s].bwd /= share;
                t1[s].wgrad /= share;
                work += (double)lay->tp * tpd_plan_cp(lay) * lay->dp * m *
                        (cost[s].fwd + cost[s].bwd) / share;
            }
            TPD_CHECK_GOTO(tpd_plan_pipe_simulate(lay, m, t1, &probe), st, out);
            double crit = probe.makespan;
            work /= cl->cpu_cores;
            double shared = crit > work ? crit : work;
            if (shared < makespan) {
                double k = shared / makespan;
                scale_pipe(&pipe, k);
                makespan0 *= k;
                ideal *= k;
            }
        }
    }
    /* After the pipeline: zeroing the gradients (start of the step), the norm over owned
     * elements and its scalar all-reduce (model-parallel group, or the world under ZeRO),
     * AdamW on the shard, and the loss all-reduce + broadcast, on the stage with the most
     * parameters; the reductions and gathers are tpd_plan_step_finish's. */
    int zero = lay->distributed_optimizer && tpd_plan_dp_inner(cfg, lay) > 1;
    double optim = 0;
    for (int s = 0; s < p; s++) {
        double padded = res->mem[s].grads / 4.0;    /* fp32 gradient elements, padded */
        double shard = res->mem[s].optimizer / 8.0; /* AdamW m and v, fp32 */
        double o = ew(&mm, cl->ew_zero, 4, padded) + ew(&mm, cl->ew_sumsq, 4, shard) +
                   allreduce(cl, 4, zero ? gpus : lay->tp * p, 1) +
                   ew(&mm, cl->ew_adamw, 28, shard) + allreduce(cl, 4, lay->dp, lay->tp) +
                   half_ring(cl, 4, p, lay->tp * lay->dp);
        if (o > optim) optim = o;
    }
    res->time.compute = ideal;
    res->time.tp_comm = m * sc->tp_comm;
    res->time.cp_comm = m * sc->cp_comm;
    res->time.ep_comm = m * sc->ep_comm;
    /* >= 0 but for rounding: a single stage's makespan is the sum of its actions */
    res->time.pp_bubble = makespan0 > ideal ? makespan0 - ideal : 0.0;
    res->time.pp_p2p = pipe.makespan - makespan0;
    res->time.optimizer = optim;
    tpd_plan_dp_cost dpc;
    tpd_plan_cpu_dp_cost(cfg, cl, lay, &dpc);
    tpd_plan_diloco_outer(cfg, cl, ideal, res);
    TPD_CHECK_GOTO(tpd_plan_step_finish(cfg, lay, &pipe, cost, &dpc, res), st, out);
    cpu_shard_time(cfg, cl, lay, res);
    tpd_plan_rates(cfg, cl, res);
out:
    tpd_plan_pipe_free(&probe);
    tpd_plan_pipe_free(&pipe);
    return st;
}
