/* The planner's time model.
 *
 * Per micro-batch and stage: every GEMM under a roofline (FLOPs at peak times an
 * efficiency that depends on the GEMM's size, or its bytes at HBM bandwidth, whichever
 * is slower), with the block's shapes (K/V projections of the K/V heads, SwiGLU's gate
 * and up as one GEMM); memory-bound kernels (LayerNorm or RMSNorm, GELU or SwiGLU, RoPE,
 * softmax, dropout, residual adds) from the bytes they move at HBM bandwidth; TP
 * collectives as ring algorithms on the link the TP group sits on. The pipeline is the
 * simulation of the schedule's action lists with each stage's per-chunk times (step.c);
 * DP gradient reduction is ring over the DP group's link (DP x CP under context
 * parallelism), bucket by bucket, each started when the simulated last backward has made it
 * final (step.c); the optimizer step is memory bound. Under CP every per-token term runs at a
 * rank's seq/CP tokens, and the attention's CP communication is priced on the CP group's link
 * (attention_core). Under EP each MoE layer adds its dispatch and combine all-to-alls on the
 * EP group's link (ep_a2a), the experts' grouped GEMM runs the busiest EP rank's rows
 * (mlp_gemms), and the experts' gradients are summed over expert-DP. */
#include "engine/plan/plan.h"
#include "engine/model/model_flops.h"
#include "engine/plan/plan_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/pipeline/schedule.h"

typedef struct op_time {
    double compute;   /* s */
    double comm;      /* s, TP collectives (exposed) */
    double hidden;    /* s, TP collectives the overlap hid (not in compute or comm) */
    double cp;        /* s, CP communication (exposed; not in compute or comm) */
    double cp_hidden; /* s, CP transfers the ring's blocks hid (in neither) */
    double ep;        /* s, EP all-to-alls (exposed; not in compute or comm) */
    double ep_counts; /* s, of ep: the exchange of the expert counts (forward only) */
    double flash_bwd; /* s, what the flash kernel's backward adds to twice its forward */
} op_time;

/* A kernel of `t` s on the device: its launch gap, and never less than the host takes to
 * launch it (host_launch_us, when the host cannot run ahead). */
static double kernel_time(const tpd_plan_cluster *cl, double t) {
    t += cl->kernel_overhead_s;
    return t > cl->host_launch_s ? t : cl->host_launch_s;
}

static double gemm_time(const tpd_plan_cluster *cl, double m, double n, double k, double batch,
                        double elem) {
    double flops = 2.0 * m * n * k * batch;
    double bytes = elem * (m * k + k * n + m * n) * batch;
    double t_flops = flops / (cl->peak_flops * tpd_plan_gemm_efficiency(cl, flops));
    double t_bytes = bytes / (cl->hbm_bw * cl->mem_efficiency);
    return kernel_time(cl, t_flops > t_bytes ? t_flops : t_bytes);
}

/* `groups` equal GEMMs (m, n, k) in one launch (a grouped GEMM): each at the efficiency of its
 * own size, the launch paid once. */
static double grouped_gemm_time(const tpd_plan_cluster *cl, double m, double n, double k,
                                double groups, double elem) {
    double flops = 2.0 * m * n * k;
    double bytes = elem * (m * k + k * n + m * n) * groups;
    double t_flops = groups * flops / (cl->peak_flops * tpd_plan_gemm_efficiency(cl, flops));
    double t_bytes = bytes / (cl->hbm_bw * cl->mem_efficiency);
    return kernel_time(cl, t_flops > t_bytes ? t_flops : t_bytes);
}

static double mem_time(const tpd_plan_cluster *cl, double bytes) {
    return kernel_time(cl, bytes / (cl->hbm_bw * cl->mem_efficiency));
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

static void group_link(const tpd_plan_cluster *cl, int n, long stride, double *bw_p,
                       double *lat_p) {
    tpd_plan_group_link(cl, n, stride, bw_p, lat_p);
}

/* The shapes of a layer's block that the time model needs. */
typedef struct block_shape {
    double qkv;     /* output columns of the QKV GEMM, all ranks: q + 2*h_kv */
    double q;       /* the query heads' width: h, unless model.kv_channels sets the head size */
    double d;       /* the head size: h/a, or model.kv_channels */
    double kv;      /* h_kv = g*d, the width of the K (or V) heads */
    double fc1;     /* output columns of the first MLP GEMM: f, or 2f for [gate; up] */
    double dropout; /* 1: GPT-2's block, with Megatron's dropout; 0: Llama's, without */
    int bias;       /* the linear layers have biases */
} block_shape;

/* The width a token's MLP GEMMs run at on one rank (tpd_plan_mlp_width): under EP the k
 * experts' part times moe_imbalance, since the busiest EP rank runs that many times the mean
 * rows through its experts and every rank waits for it (the grouped expert GEMMs priced as
 * one GEMM, as at EP 1); the shared experts see the rank's own tokens. */
static double mlp_width(const tpd_config *cfg, const tpd_plan_layout *lay) {
    const tpd_config_model *m = &cfg->model;
    if (m->num_moe_experts <= 0) return tpd_plan_mlp_width(cfg);
    return m->moe_router_topk * (double)tpd_config_moe_ffn(cfg) * tpd_plan_moe_imbalance(cfg, lay) +
           m->moe_shared_expert_intermediate_size;
}

/* The MLP's two GEMMs of one layer on one rank over `tok` tokens: the forward's (wgrad 0: the
 * first and the second, rows x out over in) or their weight gradients' (wgrad 1: out x in over
 * the rows), into *fc1_p and *fc2_p. Dense: one GEMM each. A mixture: the shared experts' over
 * the tokens, and the experts' grouped GEMM, El = E / EP local experts each over an even share
 * of the rows its rank runs (tok k at EP 1, times moe_imbalance on the busiest EP rank), each
 * expert's block priced at its own size: at EP 1 a rank's tok k rows are cut in E blocks, under
 * EP its El experts take EP times the rows each. The FLOPs are the active parameters' (times
 * the imbalance) either way. */
static void mlp_gemms(const tpd_config *cfg, const tpd_plan_cluster *cl, const tpd_plan_layout *lay,
                      double tok, int wgrad, double *fc1_p, double *fc2_p) {
    const tpd_config_model *m = &cfg->model;
    double h = m->hidden_size, t = lay->tp, glu = m->swiglu ? 2.0 : 1.0;
    double e = (cfg->training.precision == TPD_PRECISION_BF16) ? 2.0 : 4.0;
    int E = m->num_moe_experts;
    double f = E > 0 ? m->moe_shared_expert_intermediate_size : m->ffn_hidden_size;
    double fc1 = 0.0, fc2 = 0.0;
    if (f > 0) {
        fc1 = wgrad ? gemm_time(cl, glu * f / t, h, tok, 1, e)
                    : gemm_time(cl, tok, glu * f / t, h, 1, e);
        fc2 = wgrad ? gemm_time(cl, h, f / t, tok, 1, e) : gemm_time(cl, tok, h, f / t, 1, e);
    }
    if (E > 0) {
        double El = (double)E / tpd_plan_ep(lay), fe = tpd_config_moe_ffn(cfg);
        double rows = tok * m->moe_router_topk * tpd_plan_moe_imbalance(cfg, lay) / El;
        if (wgrad) {
            fc1 += grouped_gemm_time(cl, glu * fe / t, h, rows, El, e);
            fc2 += grouped_gemm_time(cl, h, fe / t, rows, El, e);
        } else {
            fc1 += grouped_gemm_time(cl, rows, glu * fe / t, h, El, e);
            fc2 += grouped_gemm_time(cl, rows, h, fe / t, El, e);
        }
    }
    *fc1_p = fc1;
    *fc2_p = fc2;
}

static block_shape block_of(const tpd_config *cfg, const tpd_plan_layout *lay) {
    const tpd_config_model *m = &cfg->model;
    double f = mlp_width(cfg, lay);
    block_shape b;
    b.d = tpd_config_head_dim(cfg);
    b.q = tpd_config_q_width(cfg);
    b.kv = (double)tpd_config_kv_heads(cfg) * b.d;
    b.qkv = b.q + 2.0 * b.kv;
    b.fc1 = m->swiglu ? 2.0 * f : f;
    b.dropout = tpd_plan_gpt_block(cfg) ? 1.0 : 0.0;
    b.bias = m->add_bias_linear;
    return b;
}

/* All-to-all of a rank's `bytes` over n ranks: (n-1)/n of it leaves, in n-1 steps. */
static double all_to_all_time(double bytes, int n, double bw, double lat) {
    if (n <= 1) return 0.0;
    return (double)(n - 1) / n * bytes / bw + (n - 1) * lat;
}

/* The attention core of one layer, one micro-batch, forward, on one rank, and what CP adds
 * to it. Without CP every query head attends over the s keys of its group's K/V head.
 *
 * CP splits the sequence: the rank's s/CP queries (two of 2 CP chunks, rank r holding r and
 * 2 CP - 1 - r, which balances the causal mask) attend over all s keys, 1/CP of the
 * attention's FLOPs on every rank.
 * - p2p (ring attention): CP blocks of the rank's queries against one rank's K/V each,
 *   1/CP of its attention apiece; while block i computes, the K/V block for i + 1 (b*s/CP
 *   rows of 2*h_kv/t, activation dtype) travels to the next rank of the ring: CP - 1 steps,
 *   each exposed for max(0, transfer - block). The backward sends K/V and dK/dV (twice the
 *   bytes) against twice the compute: twice the forward's exposed time.
 * - a2a (Ulysses): the sequence-split Q, K, V go head-split (NHl/CP heads over all s
 *   tokens) by an all-to-all, attention runs whole, and its output comes back by another;
 *   the backward's gradients take the same two. Each moves (CP-1)/CP of the rank's tensor
 *   and none is hidden.
 * step_comm_p and step_attn_p get the report's figures (plan.h: cp_step_comm_s). */
static op_time attention_core(const tpd_config *cfg, const tpd_plan_cluster *cl,
                              const tpd_plan_layout *lay, double *step_comm_p,
                              double *step_attn_p) {
    const tpd_config_model *m = &cfg->model;
    int cp = tpd_plan_cp(lay), ring = cp > 1 && lay->cp_comm == TPD_CP_COMM_P2P;
    double S = m->seq_length, s = S / cp, b = lay->micro_batch_size;
    double a = m->num_attention_heads, t = lay->tp;
    double e = (cfg->training.precision == TPD_PRECISION_BF16) ? 2.0 : 4.0;
    double tok = s * b;
    block_shape k = block_of(cfg, lay);
    double d = k.d, hq = k.q; /* the head size; the query heads' width (h at the usual size) */
    op_time o = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
    /* the blocks of queries x keys the attention runs as: one s x s without CP, CP of
     * s/CP x s/CP under the ring, one S x S of NHl/CP heads under a2a */
    int blocks = ring ? cp : 1;
    double q = ring ? s : S, heads = b * a / t / (ring ? 1 : cp);
    double step = 0.0;
    if (tpd_plan_uses_flash(cfg)) {
        /* Fused kernel: QK^T and AV with the causal half skipped, no s x s tensor; on a CP
         * rank 1/CP of the sequence's FLOPs (balanced), in `blocks` kernels. */
        double flops = 0.5 * 4.0 * b * S * S * hq / t / cp;
        step = kernel_time(cl, flops / blocks / (cl->peak_flops * cl->flash_efficiency));
        /* Its backward (flash_attention_backward_efficiency): 2.5x the forward's FLOPs (five
         * products against two: dV, dP, dS to dQ and dK, and P again) at its own rate, in
         * two kernels as the doubled forward; unset, the layer's 2x holds. */
        if (cl->flash_bwd_efficiency > 0.0) {
            double bwd = 2.5 * flops / blocks / (cl->peak_flops * cl->flash_bwd_efficiency);
            o.flash_bwd = blocks * (2.0 * kernel_time(cl, 0.5 * bwd) - 2.0 * step);
        }
    } else {
        step += gemm_time(cl, q, q, d, heads, e); /* scores = Q K^T */
        step += gemm_time(cl, q, d, q, heads, e); /* context = probs V */
        /* Fused scale-mask-softmax (read + write) and, in GPT-2's block, dropout on the
         * probabilities (read, write, 1-byte mask) over heads*q*q elements */
        step += mem_time(cl, e * 2.0 * heads * q * q);
        if (k.dropout) step += mem_time(cl, (2.0 * e + 1.0) * heads * q * q);
    }
    o.compute = blocks * step;
    /* head transposes of Q, K, V and the context (read + write of (2q + 2h_kv)*s*b/t) */
    if (!tpd_plan_uses_flash(cfg))
        o.compute += mem_time(cl, e * 2.0 * tok * (2.0 * hq + 2.0 * k.kv) / t);
    *step_comm_p = *step_attn_p = 0.0;
    if (cp < 2) return o;
    double bw, lat;
    tpd_plan_hop hop;
    tpd_plan_cp_link(cl, cp, lay->tp, &bw, &lat, &hop);
    if (ring) {
        double xfer = e * tok * 2.0 * k.kv / t / bw + lat; /* one K/V block */
        o.cp = (cp - 1) * (xfer > step ? xfer - step : 0.0);
        o.cp_hidden = (cp - 1) * (xfer > step ? step : xfer);
        *step_comm_p = xfer;
        *step_attn_p = step;
    } else {
        double in = all_to_all_time(e * tok * k.qkv / t, cp, bw, lat);
        o.cp = in + all_to_all_time(e * tok * hq / t, cp, bw, lat);
        *step_comm_p = in;
        *step_attn_p = o.compute;
    }
    return o;
}

/* Expert parallelism's all-to-alls of one MoE layer, one micro-batch, on one rank. The
 * dispatch sends each of the rank's N = s*b tokens' k assignments (full rows: under SP the
 * MLP input is gathered first) to the rank of its expert, (EP-1)/EP of them leaving, C
 * elements each in the activation dtype; the combine sends the experts' outputs back; the
 * busiest rank receives moe_imbalance times the mean and the group waits for it. Every rank of
 * the group (each TP rank in its own group) sends at once, on the EP group's link. The counts
 * (EP x E/EP int32) go first, an all-to-all of a few bytes: latency. Into *a2a_p one
 * all-to-all's time, *counts_p the counts', *bytes_p the bytes one all-to-all sends from a
 * rank; zeros at EP 1. */
static void ep_a2a(const tpd_config *cfg, const tpd_plan_cluster *cl, const tpd_plan_layout *lay,
                   double *a2a_p, double *counts_p, double *bytes_p) {
    const tpd_config_model *m = &cfg->model;
    int ep = tpd_plan_ep(lay);
    *a2a_p = *counts_p = *bytes_p = 0.0;
    if (ep < 2 || m->num_moe_experts < 1) return;
    double e = (cfg->training.precision == TPD_PRECISION_BF16) ? 2.0 : 4.0;
    double tok = (double)tpd_plan_local_seq(cfg, lay) * lay->micro_batch_size;
    double rows = tok * m->moe_router_topk * tpd_plan_moe_imbalance(cfg, lay);
    double bw, lat;
    tpd_plan_hop hop;
    tpd_plan_ep_link(cl, ep, (long)lay->tp * tpd_plan_cp(lay), &bw, &lat, &hop);
    *a2a_p = all_to_all_time(rows * m->hidden_size * e, ep, bw, lat);
    *counts_p = all_to_all_time(4.0 * m->num_moe_experts, ep, bw, lat);
    *bytes_p = (ep - 1.0) / ep * rows * m->hidden_size * e;
}

/* One transformer layer, one micro-batch, forward, on one rank (under CP its s/CP tokens of
 * each sequence). `attn_only` returns just the attention core (what selective recomputation
 * repeats; under a2a with the all-to-all of Q, K and V that rebuilds its input). */
static op_time layer_forward(const tpd_config *cfg, const tpd_plan_cluster *cl,
                             const tpd_plan_layout *lay, int attn_only) {
    const tpd_config_model *m = &cfg->model;
    double s = tpd_plan_local_seq(cfg, lay), b = lay->micro_batch_size, h = m->hidden_size;
    double t = lay->tp;
    double f = mlp_width(cfg, lay);
    double e =
        (cfg->training.precision == TPD_PRECISION_BF16) ? 2.0 : 4.0; /* activation element, bytes */
    double tok = s * b, sbh = s * b * h;
    double rep = lay->sequence_parallel ? 1.0 / t : 1.0; /* norm/residual share per rank */
    block_shape k = block_of(cfg, lay);
    double xfer, blk;
    op_time o = attention_core(cfg, cl, lay, &xfer, &blk);
    if (attn_only) {
        if (o.cp > 0.0) o.cp = xfer; /* a2a: Q, K, V again; the ring keeps its state */
        o.cp_hidden = 0.0;
        return o;
    }

    /* the four TP GEMMs, each beside the collective SP puts next to it: all-gather before
     * QKV and FC1, reduce-scatter after the projection and FC2 */
    double g[4] = {
        gemm_time(cl, tok, k.qkv / t, h, 1, e), /* QKV (K and V of h_kv each) */
        gemm_time(cl, tok, h, k.q / t, 1, e),   /* attention projection */
        0.0,                                    /* FC1, or [gate; up] (a mixture: its experts') */
        0.0,                                    /* FC2, or down */
    };
    mlp_gemms(cfg, cl, lay, tok, 0, &g[2], &g[3]);
    for (int i = 0; i < 4; i++)
        o.compute += g[i];
    /* a mixture of experts: the router's logits (replicated over TP); under EP the dispatch
     * and combine all-to-alls and the counts before them */
    if (m->num_moe_experts > 0) o.compute += gemm_time(cl, tok, m->num_moe_experts, h, 1, e);
    double a2a, counts, a2a_bytes;
    ep_a2a(cfg, cl, lay, &a2a, &counts, &a2a_bytes);
    o.ep = 2.0 * a2a + counts;
    o.ep_counts = counts;
    /* Two norms, LayerNorm or RMSNorm (read + write); two residual adds (read input and
     * residual, write output; GPT-2's fuse bias and dropout, with a 1-byte mask). GPT-2:
     * bias-GELU on the f-wide hidden (read + write). Llama: RoPE on Q and K (read + write of
     * (q + h_kv)*s*b/t) and SwiGLU (read gate and up, write their product). */
    o.compute += 2.0 * mem_time(cl, 2.0 * e * sbh * rep);
    o.compute += 2.0 * mem_time(cl, (3.0 * e + k.dropout) * sbh * rep);
    if (m->swiglu)
        o.compute += mem_time(cl, 3.0 * e * s * b * f / t);
    else
        o.compute += mem_time(cl, 2.0 * e * s * b * f / t);
    if (m->position_embedding_type == TPD_POS_ROPE)
        o.compute += mem_time(cl, 2.0 * e * tok * (k.q + k.kv) / t);
    /* Qwen3's QK norm on the same heads: read them, write the normalized heads and the kept
     * input (the backward reads both and writes the gradients) */
    if (m->qk_layernorm) o.compute += mem_time(cl, 3.0 * e * tok * (k.q + k.kv) / t);

    /* Two all-reduces (or reduce-scatter + all-gather pairs with SP: same volume) of the
     * s*b*h activations. */
    double bw, lat;
    group_link(cl, lay->tp, 1, &bw, &lat);
    if (!lay->tp_comm_overlap || !lay->sequence_parallel || lay->tp < 2) {
        o.comm += 2.0 * allreduce_time(e * sbh, lay->tp, bw, lat);
        return o;
    }
    /* Megatron-Core's userbuffer overlap (parallel.tp_comm_overlap): each gather or scatter
     * runs chunk by chunk behind its GEMM (tpd_plan_tp_overlap), and the GEMMs slow down by
     * tp_overlap_slowdown while the communication kernels share the SMs. */
    double hr = half_ring_time(e * sbh, lay->tp, bw, lat);
    for (int i = 0; i < 4; i++) {
        double exposed, hidden;
        tpd_plan_tp_overlap(cl, g[i], hr, lay->tp, &exposed, &hidden);
        o.comm += exposed;
        o.hidden += hidden;
        o.compute += cl->tp_overlap_slowdown * g[i];
    }
    return o;
}

/* Backward of one layer from its forward: GEMMs and attention twice (data and weight
 * gradients; the flash kernel at its backward rate where the profile gives one),
 * memory-bound kernels read about twice what forward did, same collectives (EP:
 * the two all-to-alls without the counts);
 * under tp_comm_overlap each collective hides behind the data-gradient GEMM of its forward
 * GEMM's size (the same share), and both backward GEMMs pay the slowdown (the weight
 * gradient's runs beside the bulk overlap of the input's all-gather). */
static op_time layer_backward(const tpd_plan_layout *lay, op_time fwd) {
    /* CP: the ring moves twice the bytes against twice the compute; a2a the gradients of its
     * two tensors */
    double k = lay->cp_comm == TPD_CP_COMM_P2P ? 2.0 : 1.0;
    /* EP: the gradients of the combine and of the dispatch go back the same way; the counts
     * are the forward's */
    op_time o = {2.0 * fwd.compute + fwd.flash_bwd,
                 fwd.comm,
                 fwd.hidden,
                 k * fwd.cp,
                 k * fwd.cp_hidden,
                 fwd.ep - fwd.ep_counts,
                 0.0,
                 0.0};
    return o;
}

/* W of one layer under a split backward (what tpd_model_weight_grad runs): the weight
 * gradient GEMM of each linear layer, dW (out, in) = dY^T (out, tok) X (tok, in), and its
 * bias gradient when it has one (a column sum over the tokens); under SP the gathers of
 * their inputs and output gradients (ln1, ln2, d(out), d(x1)). `extra_b` gets what the
 * split adds to B: the copies of the output gradients W needs (d(out), d(x1), dqkv), and
 * under SP two more gathers in W than the unsplit backward does. */
static op_time layer_wgrad(const tpd_config *cfg, const tpd_plan_cluster *cl,
                           const tpd_plan_layout *lay, op_time *extra_b) {
    const tpd_config_model *m = &cfg->model;
    double s = tpd_plan_local_seq(cfg, lay), b = lay->micro_batch_size, h = m->hidden_size;
    double t = lay->tp, f = mlp_width(cfg, lay);
    double e = (cfg->training.precision == TPD_PRECISION_BF16) ? 2.0 : 4.0;
    double tok = s * b, sbh = s * b * h, rep = lay->sequence_parallel ? 1.0 / t : 1.0;
    block_shape k = block_of(cfg, lay);
    op_time w = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
    const double out_in[4][2] = {{k.qkv / t, h}, {h, k.q / t}, {k.fc1 / t, h}, {h, f / t}};
    double fc1, fc2;
    mlp_gemms(cfg, cl, lay, tok, 1, &fc1, &fc2);
    for (int i = 0; i < 4; i++) {
        w.compute += i < 2 ? gemm_time(cl, out_in[i][0], out_in[i][1], tok, 1, e) : 0.0;
        if (k.bias) w.compute += mem_time(cl, e * tok * out_in[i][0]);
    }
    w.compute += fc1 + fc2;
    extra_b->compute = mem_time(cl, 2.0 * e * (2.0 * sbh * rep + tok * k.qkv / t));
    extra_b->comm = 0.0;
    if (lay->sequence_parallel && lay->tp > 1) {
        double bw, lat;
        group_link(cl, lay->tp, 1, &bw, &lat);
        double hr = half_ring_time(e * sbh, lay->tp, bw, lat);
        w.comm = 4.0 * hr;
        extra_b->comm = 2.0 * hr;
    }
    return w;
}

/* Token + position embedding (stage 0) and LM head + loss (last stage). */
static void ends_time(const tpd_config *cfg, const tpd_plan_cluster *cl, const tpd_plan_layout *lay,
                      int embed, int head, op_time *fwd, op_time *bwd) {
    const tpd_config_model *m = &cfg->model;
    double s = tpd_plan_local_seq(cfg, lay), b = lay->micro_batch_size, h = m->hidden_size;
    double t = lay->tp, e = (cfg->training.precision == TPD_PRECISION_BF16) ? 2.0 : 4.0;
    double sbh = s * b * h, vp = tpd_config_padded_vocab(cfg, lay->tp);
    double bw, lat;
    group_link(cl, lay->tp, 1, &bw, &lat);
    if (embed) {
        /* Gather rows (read + write), add learned positions (read both, write), GPT-2's
         * dropout (1-byte mask); vocab-parallel embedding all-reduce. */
        double learned = m->position_embedding_type == TPD_POS_LEARNED ? 3.0 * e : 0.0;
        fwd->compute += mem_time(cl, (2.0 * e + learned + block_of(cfg, lay).dropout) * sbh);
        fwd->comm += allreduce_time(e * sbh, lay->tp, bw, lat);
        bwd->compute += mem_time(cl, 4.0 * e * sbh);
    }
    if (head) {
        /* Final norm, logits GEMM (s*b, V/t, h) of the tied embedding or the untied output
         * layer (the same shapes), vocab-parallel cross-entropy in fp32 (about four passes
         * over the s*b*V/t logits forward, three backward). */
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

static void gpu_stage_cost(const tpd_config *cfg, const tpd_plan_cluster *cl,
                           const tpd_plan_layout *lay, int stage, tpd_plan_stage_cost *out) {
    op_time lf = layer_forward(cfg, cl, lay, 0);
    op_time lb = layer_backward(lay, lf);
    op_time rc = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
    /* selective recompute rebuilds the attention state; the CP ring keeps all of its own */
    int ring = tpd_plan_cp(lay) > 1 && lay->cp_comm == TPD_CP_COMM_P2P;
    if (lay->recompute == TPD_RECOMPUTE_FULL) rc = lf;
    if (lay->recompute == TPD_RECOMPUTE_SELECTIVE && !ring) rc = layer_forward(cfg, cl, lay, 1);
    double layers = tpd_plan_stage_layers(cfg, lay, stage);
    /* full recompute runs on the block method's layers only */
    double rl =
        lay->recompute == TPD_RECOMPUTE_FULL ? tpd_plan_recomputed_layers(cfg, lay, stage) : layers;
    op_time f = {layers * lf.compute,
                 layers * lf.comm,
                 layers * lf.hidden,
                 layers * lf.cp,
                 layers * lf.cp_hidden,
                 layers * lf.ep,
                 0.0,
                 0.0};
    op_time b = {layers * lb.compute + rl * rc.compute,
                 layers * lb.comm + rl * rc.comm,
                 layers * lb.hidden + rl * rc.hidden,
                 layers * lb.cp + rl * rc.cp,
                 layers * lb.cp_hidden + rl * rc.cp_hidden,
                 layers * lb.ep + rl * rc.ep,
                 0.0,
                 0.0};
    /* W's share: inside the backward, or split from it (zb-h1), which costs B a little */
    op_time extra;
    op_time lw = layer_wgrad(cfg, cl, lay, &extra);
    op_time w = {layers * lw.compute, layers * lw.comm, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
    if (tpd_plan_layout_schedule(lay) == TPD_SCHEDULE_ZB_H1) {
        b.compute += layers * extra.compute;
        b.comm += layers * extra.comm;
    }
    op_time ef = {0}, eb = {0}, hf = {0}, hb = {0};
    if (stage == 0) ends_time(cfg, cl, lay, 1, 0, &ef, &eb);
    if (stage == lay->pp - 1) ends_time(cfg, cl, lay, 0, 1, &hf, &hb);
    out->embed_fwd = ef.compute + ef.comm;
    out->embed_bwd = eb.compute + eb.comm;
    out->head_fwd = hf.compute + hf.comm;
    out->head_bwd = hb.compute + hb.comm;
    /* the host's per-micro-batch work, before the forward's kernels */
    out->fwd =
        f.compute + f.comm + f.cp + f.ep + out->embed_fwd + out->head_fwd + cl->micro_batch_host_s;
    out->bwd = b.compute + b.comm + b.cp + b.ep + out->embed_bwd + out->head_bwd;
    out->wgrad = w.compute + w.comm;
    out->tp_comm = f.comm + b.comm + ef.comm + eb.comm + hf.comm + hb.comm;
    out->tp_comm_hidden = f.hidden + b.hidden;
    out->cp_comm = f.cp + b.cp;
    out->cp_comm_hidden = f.cp_hidden + b.cp_hidden;
    out->ep_comm = f.ep + b.ep;
}

void tpd_plan_gpu_stage_cost(const tpd_config *cfg, const tpd_plan_cluster *cl,
                             const tpd_plan_layout *lay, int stage, tpd_plan_stage_cost *out) {
    tpd_plan_stage_cost_kinds(cfg, cl, lay, stage, gpu_stage_cost, out);
}

/* Ring collectives as affine functions of the bytes they move. */
static tpd_plan_affine ring_cost(int n, double bw, double lat, int full) {
    tpd_plan_affine a = {0.0, 0.0};
    if (n <= 1) return a;
    double k = full ? 2.0 : 1.0;
    a.per_byte = k * (n - 1) / n / bw;
    a.fixed = k * (n - 1) * lat;
    return a;
}

/* DP gradient reduction per bucket (in the gradients' dtype, tpd_plan_grad_wire_bytes:
 * fp32 main grads, Megatron's, unless bf16 ones are kept; ZeRO-1 reduce-scatters them and
 * all-gathers the updated parameters), and the tied-embedding gradient all-reduce between
 * the first and last stage (none when untied). */
void tpd_plan_gpu_dp_cost(const tpd_config *cfg, const tpd_plan_cluster *cl,
                          const tpd_plan_layout *lay, tpd_plan_dp_cost *out) {
    /* the every-step group: all of DP, or one DiLoCo replica's dp_inner ranks; sharded, the
     * shard group (HSDP's replicas all-reduce apart: tpd_plan_shard_time) */
    int S = tpd_plan_shard_group(cfg, lay);
    double bw, lat;
    group_link(cl, S, lay->tp, &bw, &lat);
    tpd_dp_sharding sh = tpd_plan_sharding(lay);
    int zero = sh != TPD_DP_SHARDING_NO_SHARD && S > 1;
    out->reduce = ring_cost(S, bw, lat, !zero);
    out->gather = zero ? ring_cost(S, bw, lat, 0) : (tpd_plan_affine){0.0, 0.0};
    /* optim_grads_params reduces and gathers per unit inside the passes (shard.c) */
    if (sh == TPD_DP_SHARDING_OPTIM_GRADS_PARAMS)
        out->reduce = out->gather = (tpd_plan_affine){0.0, 0.0};
    /* EP: the experts' gradients are summed over the S / EP ranks that hold the same experts,
     * a group that spans all of DP x CP with EP times fewer members in each NVLink domain */
    int ep = tpd_plan_ep(lay);
    out->reduce_ep = (tpd_plan_affine){0.0, 0.0};
    if (ep > 1 && S % ep == 0) {
        double ebw, elat;
        group_link(cl, S / ep, (long)lay->tp * ep, &ebw, &elat);
        out->reduce_ep = ring_cost(S / ep, ebw, elat, !zero);
    }
    out->grad_bytes = tpd_plan_dp_wire_bytes(cfg);
    out->param_bytes = (cfg->training.precision == TPD_PRECISION_BF16) ? 2.0 : 4.0;
    out->emb_allreduce = 0.0;
    if (tpd_plan_embedding_group(cfg, lay)) {
        double ebw, elat;
        group_link(cl, 2, tpd_plan_pp_stride(cfg, lay) * (lay->pp - 1), &ebw, &elat);
        double emb = out->grad_bytes * tpd_config_padded_vocab(cfg, lay->tp) *
                     cfg->model.hidden_size / lay->tp;
        out->emb_allreduce = allreduce_time(emb, 2, ebw, elat);
    }
}

/* AdamW over this rank's shard: read the grad (g = 4 bytes, fp32 main grads; 2 for bf16
 * ones), read/write master, m and v, write the bf16 weight (26 + g bytes per parameter;
 * fp32 24 + g), plus one read of the grads for the norm; and the framework's fixed cost
 * per step (optimizer_fixed_ms). */
static double optimizer_time(const tpd_config *cfg, const tpd_plan_cluster *cl,
                             const tpd_plan_layout *lay, double params) {
    double shard = tpd_plan_sharding(lay) != TPD_DP_SHARDING_NO_SHARD
                       ? params / tpd_plan_shard_group(cfg, lay)
                       : params;
    double g = tpd_plan_grad_wire_bytes(cfg);
    double per = (cfg->training.precision == TPD_PRECISION_BF16 ? 26.0 : 24.0) + g;
    return mem_time(cl, shard * per + params * g) + cl->optimizer_fixed_s;
}

static double max_stage_params(const tpd_config *cfg, const tpd_plan_layout *lay) {
    double nmax = 0.0;
    for (int s = 0; s < lay->pp; s++) {
        double n = tpd_plan_stage_params(cfg, lay, s);
        if (n > nmax) nmax = n;
    }
    return nmax;
}

/* DP wire bytes one rank of the busiest stage sends per step: the every-step reduction
 * over its S = dp_inner ranks ((S-1)/S of the gradients twice, or under ZeRO-1 once and the
 * parameters once; under EP the local experts' over S / EP), and under DiLoCo 1/H of the outer
 * all-reduce of its shard over the R replicas (2(R-1)/R of it). */
static double dp_step_bytes(const tpd_config *cfg, const tpd_plan_layout *lay) {
    double n = max_stage_params(cfg, lay);
    int S = tpd_plan_dp_inner(cfg, lay), R = tpd_config_dp_replicas(cfg, lay->dp);
    tpd_dp_sharding sh = tpd_plan_sharding(lay);
    int H = tpd_plan_shard_group(cfg, lay), Rh = H > 0 ? S / H : 1;
    int zero = sh != TPD_DP_SHARDING_NO_SHARD && H > 1;
    double g = tpd_plan_dp_wire_bytes(cfg);
    double p = cfg->training.precision == TPD_PRECISION_BF16 ? 2.0 : 4.0;
    long mbdp = (long)lay->micro_batch_size * lay->dp;
    double M = mbdp > 0 ? (double)(cfg->training.global_batch_size / mbdp) : 1.0;
    double bytes = S > 1 ? (S - 1.0) / S * n * 2.0 * g : 0.0;
    int ep = tpd_plan_ep(lay);
    if (ep > 1 && S % ep == 0) {
        /* the local experts' gradients over expert-DP (S / EP ranks), the rest over S; the
         * busiest stage's expert share (its layers' experts; the ends hold none) */
        double x = 0.0, most = 0.0;
        for (int s = 0; s < lay->pp; s++) {
            double k = tpd_plan_stage_params(cfg, lay, s);
            if (k > most) {
                most = k;
                x = tpd_plan_stage_moe_layers(cfg, lay, s) *
                    tpd_plan_layer_expert_params(cfg, lay->tp, ep);
            }
        }
        int Se = S / ep;
        bytes = (S - 1.0) / S * (n - x) * 2.0 * g + (Se > 1 ? (Se - 1.0) / Se * x * 2.0 * g : 0.0);
    }
    if (zero) {
        /* over the shard group: reduce-scatters of the gradients (every micro-batch's from
         * optim_grads on) and all-gathers of the parameters (two per micro-batch under
         * optim_grads_params); HSDP: the shard all-reduced over the replicas */
        double rs = (H - 1.0) / H * n * g, ag = (H - 1.0) / H * n * p;
        if (sh == TPD_DP_SHARDING_OPTIM_GRADS_PARAMS)
            bytes = M * (2.0 * ag + rs);
        else
            bytes = (sh == TPD_DP_SHARDING_OPTIM_GRADS ? M : 1.0) * rs + ag;
        if (Rh > 1) bytes += 2.0 * (Rh - 1.0) / Rh * n / H * g;
    }
    if (cfg->parallel.dp_sync == TPD_DP_SYNC_DILOCO && R > 1) {
        double shard = zero ? n / S : n;
        bytes += 2.0 * (R - 1.0) / R * shard * tpd_plan_outer_wire_bytes(cfg) /
                 cfg->diloco.sync_interval;
    }
    return bytes;
}

long tpd_plan_pp_stride(const tpd_config *cfg, const tpd_plan_layout *lay) {
    return (long)lay->tp * tpd_plan_dp_inner(cfg, lay);
}

void tpd_plan_diloco_outer(const tpd_config *cfg, const tpd_plan_cluster *cl, double compute,
                           tpd_plan_result *res) {
    const tpd_plan_layout *lay = &res->layout;
    res->time.dp_outer = res->time.outer_update = 0.0;
    res->diloco = cfg->parallel.dp_sync == TPD_DP_SYNC_DILOCO;
    res->dp_replicas = tpd_config_dp_replicas(cfg, lay->dp);
    res->dp_inner = tpd_plan_dp_inner(cfg, lay);
    res->hop_outer = TPD_PLAN_HOP_NONE;
    res->outer_comm_s = res->outer_frag_bytes = 0.0;
    res->diloco_h = res->diloco_fragments = res->diloco_overlap_steps = 0;
    if (!res->diloco) return;
    int S = res->dp_inner, R = res->dp_replicas;
    int H = cfg->diloco.sync_interval > 0 ? cfg->diloco.sync_interval : 1;
    int F = cfg->diloco.fragments > 0 ? cfg->diloco.fragments : 1;
    res->diloco_h = H;
    res->diloco_fragments = F;
    res->diloco_overlap_steps = cfg->diloco.overlap_steps;
    int zero = lay->distributed_optimizer && S > 1;
    double n = max_stage_params(cfg, lay);
    double shard = zero ? ceil(n / S) : n;
    double frag = ceil(shard / F); /* tpd_diloco_fragment_numel */
    res->outer_frag_bytes = frag * tpd_plan_outer_wire_bytes(cfg);
    if (R > 1) {
        double bw, lat;
        long stride = (long)S * lay->tp * lay->pp; /* a replica's ranks: world / R */
        group_link(cl, R, stride, &bw, &lat);
        res->hop_outer = tpd_plan_group_hop(cl, R, stride);
        tpd_plan_affine a = ring_cost(R, bw, lat, 1);
        double t_frag = a.per_byte * res->outer_frag_bytes + a.fixed;
        res->outer_comm_s = F * t_frag;
        /* each fragment's all-reduce runs beside overlap_steps inner steps of compute */
        double exposed = t_frag - cfg->diloco.overlap_steps * compute;
        res->time.dp_outer = exposed > 0.0 ? F * exposed / H : 0.0;
    }
    /* the outer step over the shard: the pseudo-gradient (read master and the last sync,
     * write the delta), Nesterov momentum (read delta and momentum, write momentum), the
     * new parameters (read the last sync, momentum and delta, write the sync copy and the
     * master), fp32, and the working weights written once */
    double w = cfg->training.precision == TPD_PRECISION_BF16 ? 2.0 : 0.0;
    res->time.outer_update = mem_time(cl, shard * (10.0 * 4.0 + w)) / H;
}

double tpd_plan_time_lower_bound(const tpd_config *cfg, const tpd_plan_cluster *cl,
                                 const tpd_plan_result *res, const tpd_plan_options *opt) {
    (void)opt; /* res->layout carries the overlap flags */
    const tpd_plan_layout *lay = &res->layout;
    if (cl->backend == TPD_PLAN_BACKEND_CPU) return 0.0;
    int p = lay->pp, v = lay->virtual_stages > 0 ? lay->virtual_stages : 1;
    int split = tpd_plan_layout_schedule(lay) == TPD_SCHEDULE_ZB_H1;
    double M = res->num_micro_batches, worst = 0.0, pipe = 0.0, head = 0.0, tail = 0.0;
    int slowest = 0;
    tpd_plan_stage_cost c[TPD_CONFIG_MAX_STAGES];
    for (int s = 0; s < p; s++) {
        tpd_plan_stage_cost_of(cfg, cl, lay, s, &c[s]);
        if (c[s].fwd + c[s].bwd > worst) {
            worst = c[s].fwd + c[s].bwd;
            slowest = s;
        }
    }
    /* The pipeline of free sends: stage s starts no sooner than micro-batch 0's first chunk
     * has come forward through the stages before it (head), runs all its forwards and
     * backwards (B alone up to its last B under zb-h1, whose W may follow), and after its
     * last B that micro-batch's gradient still goes back through those stages (tail): on the
     * last stage of equal ones M (f + b) + (p - 1)(f + b)/v, under 1F1B the simulated
     * makespan itself. p2p (>= 0) is left out. */
    for (int s = 0; s < p; s++) {
        double b = c[s].bwd - (split ? c[s].wgrad : 0.0);
        double busy = M * (c[s].fwd + b);
        if (head + busy + tail > pipe) pipe = head + busy + tail;
        if (head + M * (c[s].fwd + c[s].bwd) > pipe) pipe = head + M * (c[s].fwd + c[s].bwd);
        head += c[s].fwd / v;
        tail += b / v;
    }
    /* the slowest stage's pipeline ends no sooner than its own compute, and what cannot
     * overlap follows it */
    tpd_plan_dp_cost dpc;
    tpd_plan_gpu_dp_cost(cfg, cl, lay, &dpc);
    double own = M * worst + tpd_plan_dp_unhidden(cfg, lay, slowest, &dpc);
    return (own > pipe ? own : pipe) + optimizer_time(cfg, cl, lay, max_stage_params(cfg, lay));
}

void tpd_plan_rates(const tpd_config *cfg, const tpd_plan_cluster *cl, tpd_plan_result *res) {
    const tpd_plan_layout *lay = &res->layout;
    double gbs = cfg->training.global_batch_size;
    double vocab = tpd_config_padded_vocab(cfg, lay->tp);
    double gpus = (double)tpd_plan_world(lay);
    res->model_flops = tpd_model_flops(cfg, gbs, vocab);
    res->hw_flops = tpd_plan_layout_hw_flops(cfg, lay, gbs, vocab);
    res->tflops_per_gpu = res->model_flops / (res->step_time_s * gpus) / 1e12;
    res->hw_tflops_per_gpu = res->hw_flops / (res->step_time_s * gpus) / 1e12;
    res->mfu = res->model_flops / (res->step_time_s * cl->peak_flops * gpus);
    res->tokens_per_s = gbs * cfg->model.seq_length / res->step_time_s;
}

void tpd_plan_ep_detail(const tpd_config *cfg, const tpd_plan_cluster *cl,
                        const tpd_plan_layout *lay, tpd_plan_result *res) {
    int ep = tpd_plan_ep(lay), E = cfg->model.num_moe_experts;
    res->ep_local_experts = res->ep_expert_dp = 0;
    res->moe_imbalance = res->ep_a2a_bytes = res->ep_a2a_s = res->ep_counts_s = 0.0;
    res->hop_ep = res->hop_edp = TPD_PLAN_HOP_NONE;
    if (ep < 2 || E < 1) return;
    int S = tpd_plan_dp_inner(cfg, lay);
    res->ep_local_experts = E / ep;
    res->ep_expert_dp = S / ep;
    res->moe_imbalance = tpd_plan_moe_imbalance(cfg, lay);
    double a2a, counts, bytes;
    ep_a2a(cfg, cl, lay, &a2a, &counts, &bytes);
    res->ep_a2a_bytes = bytes;
    if (cl->backend == TPD_PLAN_BACKEND_CPU) return;
    res->ep_a2a_s = a2a;
    res->ep_counts_s = counts;
    res->hop_ep = tpd_plan_group_hop(cl, ep, (long)lay->tp * tpd_plan_cp(lay));
    res->hop_edp = tpd_plan_group_hop(cl, S / ep, (long)lay->tp * ep);
}

void tpd_plan_cp_detail(const tpd_config *cfg, const tpd_plan_cluster *cl,
                        const tpd_plan_layout *lay, tpd_plan_result *res) {
    res->cp_bytes_layer = res->cp_step_comm_s = res->cp_step_attn_s = 0.0;
    res->cp_tokens = 0;
    int cp = tpd_plan_cp(lay);
    if (cp < 2) return;
    res->cp_tokens = tpd_plan_local_seq(cfg, lay);
    const tpd_config_model *m = &cfg->model;
    double e = (cfg->training.precision == TPD_PRECISION_BF16) ? 2.0 : 4.0;
    double tok = (double)tpd_plan_local_seq(cfg, lay) * lay->micro_batch_size, t = lay->tp;
    block_shape k = block_of(cfg, lay);
    if (lay->cp_comm == TPD_CP_COMM_P2P) /* CP-1 K/V blocks forward, K/V and dK/dV backward */
        res->cp_bytes_layer = 3.0 * (cp - 1) * e * tok * 2.0 * k.kv / t;
    else /* Q, K, V and the output, each way, (CP-1)/CP of them leaving */
        res->cp_bytes_layer = 2.0 * (cp - 1.0) / cp * e * tok * (k.qkv + m->hidden_size) / t;
    if (cl->backend == TPD_PLAN_BACKEND_CPU) return;
    (void)attention_core(cfg, cl, lay, &res->cp_step_comm_s, &res->cp_step_attn_s);
}

/* The host's share of a stage's fwd + bwd per micro-batch: the same stage priced with a
 * host that runs ahead and does no per-micro-batch work, subtracted. */
static double host_share(const tpd_config *cfg, const tpd_plan_cluster *cl,
                         const tpd_plan_layout *lay, int stage, const tpd_plan_stage_cost *c) {
    if (cl->host_launch_s <= 0.0 && cl->micro_batch_host_s <= 0.0) return 0.0;
    tpd_plan_cluster *bare = malloc(sizeof *bare);
    if (!bare) return 0.0; /* a report's detail; the step itself does not depend on it */
    *bare = *cl;
    bare->host_launch_s = 0.0;
    bare->micro_batch_host_s = 0.0;
    tpd_plan_stage_cost b;
    tpd_plan_gpu_stage_cost(cfg, bare, lay, stage, &b);
    free(bare);
    return (c->fwd + c->bwd) - (b.fwd + b.bwd);
}

tpd_status tpd_plan_time_evaluate(const tpd_config *cfg, const tpd_plan_cluster *cl,
                                  const tpd_plan_options *opt, int split_bubble,
                                  tpd_plan_result *res) {
    /* terms only the GPU model prices (the cpu model's are inside its optimizer step) */
    res->time.tp_comm_hidden = res->time.host_overhead = 0.0;
    res->time.cp_comm = res->time.cp_comm_hidden = 0.0;
    res->hop_cp = TPD_PLAN_HOP_NONE;
    tpd_plan_cp_detail(cfg, cl, &res->layout, res);
    res->time.ep_comm = 0.0;
    tpd_plan_ep_detail(cfg, cl, &res->layout, res);
    res->time.straggler = res->time.global_sync = res->time.step_host = 0.0;
    res->time.dp_outer = res->time.outer_update = 0.0;
    res->time.dp_shard_exposed = res->time.dp_replica_allreduce = 0.0;
    res->hop_tp = res->hop_dp = res->hop_pp = res->hop_replica = TPD_PLAN_HOP_NONE;
    res->shard_group = tpd_plan_shard_group(cfg, &res->layout);
    if (cl->backend == TPD_PLAN_BACKEND_CPU)
        return tpd_plan_cpu_time_evaluate(cfg, cl, opt, split_bubble, res);
    tpd_status st = TPD_OK;
    const tpd_plan_layout *lay = &res->layout;
    const tpd_config_model *mdl = &cfg->model;
    int p = lay->pp;
    int m = res->num_micro_batches, slowest = 0;
    tpd_plan_stage_cost *cost = calloc((size_t)p, sizeof *cost);
    double *shard_f = calloc((size_t)p * 2, sizeof *shard_f), *shard_b = shard_f + p;
    if (!cost || !shard_f) {
        free(cost);
        free(shard_f);
        tpd_log_error("plan: out of memory");
        return TPD_ERR_NOMEM;
    }
    for (int s = 0; s < p; s++) {
        tpd_plan_stage_cost_of(cfg, cl, lay, s, &cost[s]);
        /* The slowest stage paces the steady state. */
        if (cost[s].fwd + cost[s].bwd > cost[slowest].fwd + cost[slowest].bwd) slowest = s;
    }
    /* p2p of s*b*h/t elements (Megatron's scatter-gather, or the SP shard) between
     * neighbouring stages, TP*DP ranks apart. */
    double e = (cfg->training.precision == TPD_PRECISION_BF16) ? 2.0 : 4.0;
    double p2p = 0.0;
    tpd_plan_hop hop_pp = TPD_PLAN_HOP_NONE;
    if (p > 1) {
        double bw, lat;
        tpd_plan_pipe_link(cl, p, tpd_plan_pp_stride(cfg, lay), &bw, &lat, &hop_pp);
        p2p = e * tpd_plan_local_seq(cfg, lay) * (double)lay->micro_batch_size * mdl->hidden_size /
                  lay->tp / bw +
              lat;
    }
    const tpd_plan_stage_cost *sc = &cost[slowest];
    /* what the stage computes, before optim_grads_params' exposed gathers join its passes */
    double ideal = m * (sc->fwd + sc->bwd);
    res->time.host_overhead = m * host_share(cfg, cl, lay, slowest, sc);
    TPD_CHECK_GOTO(tpd_plan_shard_time(cfg, cl, lay, cost, shard_f, shard_b, res), st, out);
    for (int s = 0; s < p; s++) {
        cost[s].fwd += shard_f[s];
        cost[s].bwd += shard_b[s];
    }
    double shard_mb = m * (shard_f[slowest] + shard_b[slowest]);
    res->time.dp_shard_exposed += shard_mb;
    tpd_plan_set_times(lay, cost, slowest, p2p, res);
    tpd_plan_pipe pipe, free_p2p;
    memset(&pipe, 0, sizeof pipe);
    memset(&free_p2p, 0, sizeof free_p2p);
    TPD_CHECK_GOTO(tpd_plan_pipe_simulate(lay, m, res->stage_times, &pipe), st, out);
    double makespan0 = pipe.makespan;
    if (split_bubble && p > 1) {
        tpd_pp_sim_times t0[TPD_CONFIG_MAX_STAGES];
        tpd_plan_sim_times(lay, cost, 0.0, t0);
        TPD_CHECK_GOTO(tpd_plan_pipe_simulate(lay, m, t0, &free_p2p), st, out);
        makespan0 = free_p2p.makespan;
    }
    res->time.compute = ideal;
    res->time.tp_comm = m * sc->tp_comm;
    res->time.tp_comm_hidden = m * sc->tp_comm_hidden;
    res->time.cp_comm = m * sc->cp_comm;
    res->time.cp_comm_hidden = m * sc->cp_comm_hidden;
    res->time.ep_comm = m * sc->ep_comm;
    /* >= 0 but for rounding: a single stage's makespan is the sum of its actions (and of
     * the sharded passes' exposed gathers, dp_shard_exposed) */
    res->time.pp_bubble = makespan0 > ideal + shard_mb ? makespan0 - ideal - shard_mb : 0.0;
    res->time.pp_p2p = pipe.makespan - makespan0;
    res->time.optimizer = optimizer_time(cfg, cl, lay, max_stage_params(cfg, lay));
    /* the ranks that wait for one another every step: the world, or under DiLoCo one
     * replica (the outer step is what joins the replicas) */
    int S = tpd_plan_dp_inner(cfg, lay);
    int world = lay->tp * lay->pp * S;
    res->hop_tp = tpd_plan_group_hop(cl, lay->tp, 1);
    res->hop_cp = tpd_plan_group_hop(cl, tpd_plan_cp(lay), lay->tp);
    res->hop_dp = tpd_plan_group_hop(cl, tpd_plan_shard_group(cfg, lay), lay->tp);
    res->hop_pp = hop_pp;
    res->time.straggler = tpd_plan_straggler_time(cl, ideal, world);
    res->time.global_sync = tpd_plan_global_sync_time(cl, world);
    res->time.step_host = cl->step_host_s;
    tpd_plan_dp_cost dpc;
    tpd_plan_gpu_dp_cost(cfg, cl, lay, &dpc);
    tpd_plan_diloco_outer(cfg, cl, ideal, res);
    TPD_CHECK_GOTO(tpd_plan_step_finish(cfg, lay, &pipe, cost, &dpc, res), st, out);
    tpd_plan_rates(cfg, cl, res);
    res->dp_bytes_step = dp_step_bytes(cfg, lay);
    res->every_step_time_s = res->every_step_tokens_per_s = 0.0;
    res->every_step_mfu = res->every_step_dp_bytes = 0.0;
    res->every_step_hop_dp = TPD_PLAN_HOP_NONE;
    if (res->diloco && split_bubble) {
        /* the same layout with every step's gradients summed over all of DP */
        tpd_config *every = malloc(sizeof *every);
        tpd_plan_result *r = malloc(sizeof *r);
        if (every && r) {
            *every = *cfg;
            every->parallel.dp_sync = TPD_DP_SYNC_EVERY_STEP;
            *r = *res;
            st = tpd_plan_time_evaluate(every, cl, opt, 1, r);
            if (st == TPD_OK) {
                res->every_step_time_s = r->step_time_s;
                res->every_step_tokens_per_s = r->tokens_per_s;
                res->every_step_mfu = r->mfu;
                res->every_step_dp_bytes = r->dp_bytes_step;
                res->every_step_hop_dp = r->hop_dp;
            }
        } else {
            tpd_log_error("plan: out of memory");
            st = TPD_ERR_NOMEM;
        }
        free(every);
        free(r);
    }
out:
    tpd_plan_pipe_free(&free_p2p);
    tpd_plan_pipe_free(&pipe);
    free(shard_f);
    free(cost);
    return st;
}
