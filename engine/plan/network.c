/* The cluster's network as the time model sees it, and the terms that grow with scale.
 *
 * Links. Ranks follow Megatron's order (parallel/mesh.h: rank = tp + TP*(cp + CP*(dp +
 * DP*pp))), so a TP group is TP consecutive ranks, a CP group CP ranks TP apart, the group
 * that sums the gradients (DP x CP) DP*CP ranks TP apart, and the two ranks of a pipeline
 * boundary TP*CP*DP apart. An EP group is EP consecutive DP ranks, TP*CP apart (Megatron's
 * tp-cp-ep-dp-pp), and its expert-DP group spans the whole DP x CP group with EP times fewer
 * members per NVLink domain. A group of n ranks `stride` apart spans n*stride
 * consecutive ranks, and a collective runs at the slowest hop it crosses:
 *   - span <= nvlink_domain_gpus: one NVLink domain, intra_bw at intra_latency;
 *   - else the network: each GPU's share of its node's NICs, inter_bw * nics_per_node /
 *     gpus_per_node, times k = the group's members per NVLink domain (k rings side by side,
 *     one per NIC), at most intra_bw; at inter_latency;
 *   - span > leaf_switch_nodes * gpus_per_node: the group crosses leaf switches, and the
 *     network share is divided by the fabric's oversubscription.
 *   - span > island_nodes * gpus_per_node: the group crosses islands, and runs at the
 *     inter-island link: inter_island_gbs per GPU times k (as the NICs), at most the network
 *     share, at inter_island_latency_us (the slowest hop, whatever the leaves give).
 * Every link's bandwidth is scaled by the share NCCL reaches on it: collective_efficiency
 * on NVLink, network_collective_efficiency off it (the same when the profile gives none).
 * With the defaults (domain = node, a NIC per GPU, one leaf, one island) this is the model
 * the profiles were fitted with.
 *
 * Scale. Per-rank compute times of a step are modelled as independent normal draws with
 * mean mu and standard deviation straggler_cv * mu; every rank waits for the slowest at the
 * step's global synchronization (the gradient norm all-reduce), so the step pays
 * mu * cv * E[max of N standard normals], N the world size. E[max] is Blom's (1958)
 * approximation of the expected largest order statistic, Phi^-1((N - 0.375)/(N + 0.25))
 * (0.59 against the exact 0.56 for N = 2, 3.23 against 3.24 for N = 1000; sqrt(2 ln N),
 * the large-N form, overstates small N: 1.18 for N = 2). The global syncs themselves are small
 * all-reduces whose latency grows with the world: 2 ceil(log2 N) link latencies as a tree
 * (NCCL's choice for small messages), 2 (N - 1) as a ring. */
#include "engine/plan/plan.h"
#include "engine/plan/plan_internal.h"

#include <math.h>

/* The share of a link's bandwidth a collective reaches: NVLink's, or the network's
 * (network_collective_efficiency, when the profile gives one). */
static double link_efficiency(const tpd_plan_cluster *cl, int network) {
    return network && cl->net_coll_efficiency > 0.0 ? cl->net_coll_efficiency : cl->coll_efficiency;
}

int tpd_plan_nvlink_domain(const tpd_plan_cluster *cl) {
    return cl->nvlink_domain_gpus > 0 ? cl->nvlink_domain_gpus : cl->gpus_per_node;
}

double tpd_plan_net_bw(const tpd_plan_cluster *cl, long span) {
    int gpn = cl->gpus_per_node > 0 ? cl->gpus_per_node : 1;
    double nics = cl->nics_per_node > 0 ? cl->nics_per_node : gpn;
    double bw = cl->inter_bw * nics / gpn;
    double over = cl->oversubscription >= 1.0 ? cl->oversubscription : 1.0;
    if (cl->leaf_switch_nodes > 0 && span > (long)cl->leaf_switch_nodes * gpn) bw /= over;
    return bw;
}

int tpd_plan_crosses_islands(const tpd_plan_cluster *cl, long span) {
    return cl->island_nodes > 0 && cl->inter_island_bw > 0.0 &&
           span > (long)cl->island_nodes * cl->gpus_per_node;
}

tpd_plan_hop tpd_plan_group_hop(const tpd_plan_cluster *cl, int n, long stride) {
    long span = (long)n * stride;
    if (n <= 1) return TPD_PLAN_HOP_NONE;
    if (span <= tpd_plan_nvlink_domain(cl)) return TPD_PLAN_HOP_NVLINK;
    if (tpd_plan_crosses_islands(cl, span)) return TPD_PLAN_HOP_ISLAND;
    if (cl->leaf_switch_nodes > 0 && cl->oversubscription > 1.0 &&
        span > (long)cl->leaf_switch_nodes * cl->gpus_per_node)
        return TPD_PLAN_HOP_CROSS_LEAF;
    return TPD_PLAN_HOP_NETWORK;
}

const char *tpd_plan_hop_name(tpd_plan_hop h) {
    switch (h) {
    case TPD_PLAN_HOP_NVLINK:
        return "nvlink";
    case TPD_PLAN_HOP_NETWORK:
        return "network";
    case TPD_PLAN_HOP_CROSS_LEAF:
        return "cross-leaf";
    case TPD_PLAN_HOP_ISLAND:
        return "inter-island";
    case TPD_PLAN_HOP_NONE:
        break;
    }
    return "none";
}

void tpd_plan_group_link(const tpd_plan_cluster *cl, int n, long stride, double *bw_p,
                         double *lat_p) {
    long dom = tpd_plan_nvlink_domain(cl), span = (long)n * stride;
    if (span <= dom) {
        *bw_p = cl->intra_bw * cl->coll_efficiency;
        *lat_p = cl->intra_latency;
        return;
    }
    long per_domain = stride >= dom ? 1 : dom / stride;
    double net = tpd_plan_net_bw(cl, span);
    double lat = cl->inter_latency;
    if (tpd_plan_crosses_islands(cl, span)) {
        if (cl->inter_island_bw < net) net = cl->inter_island_bw;
        if (cl->inter_island_latency >= 0.0) lat = cl->inter_island_latency;
    }
    double bw = per_domain * net;
    if (bw > cl->intra_bw) bw = cl->intra_bw;
    *bw_p = bw * link_efficiency(cl, 1);
    *lat_p = lat;
}

double tpd_plan_expected_max_normal(int n) {
    if (n <= 1) return 0.0;
    /* Solve Q(x) = q for the upper tail Q = 1 - Phi (erfc keeps q = 0.625/(n + 0.25) exact
     * for large n) by Newton from x = 0: Q - q is convex and decreasing above 0, so the
     * steps rise monotonically onto the root. */
    double q = 0.625 / (n + 0.25), x = 0.0;
    for (int i = 0; i < 200; i++) {
        double d = (0.5 * erfc(x / sqrt(2.0)) - q) / (exp(-0.5 * x * x) / 2.5066282746310002);
        x += d; /* Q' = -phi: x - (Q - q) / Q' */
        if (fabs(d) < 1e-12 * (1.0 + x)) break;
    }
    return x;
}

double tpd_plan_straggler_time(const tpd_plan_cluster *cl, double compute, int world) {
    return cl->straggler_cv > 0.0 ? compute * cl->straggler_cv * tpd_plan_expected_max_normal(world)
                                  : 0.0;
}

double tpd_plan_global_sync_time(const tpd_plan_cluster *cl, int world) {
    if (world <= 1 || cl->global_syncs <= 0) return 0.0;
    double lat = world <= tpd_plan_nvlink_domain(cl) ? cl->intra_latency : cl->inter_latency;
    double steps = cl->sync_ring ? 2.0 * (world - 1) : 2.0 * ceil(log2((double)world));
    return cl->global_syncs * steps * lat;
}

void tpd_plan_tp_overlap(const tpd_plan_cluster *cl, double gemm, double comm, int tp,
                         double *exposed_p, double *hidden_p) {
    double room = gemm - tp * cl->tp_overlap_chunk_s;
    double hidden = cl->tp_overlap_share * comm;
    if (hidden > room) hidden = room;
    if (hidden < 0.0) hidden = 0.0;
    *hidden_p = hidden;
    *exposed_p = comm - hidden;
}

void tpd_plan_pipe_link(const tpd_plan_cluster *cl, int pp, long stride, double *bw_p,
                        double *lat_p, tpd_plan_hop *hop_p) {
    double bw, lat;
    tpd_plan_group_link(cl, 2, stride, &bw, &lat);
    /* each TP rank sends its own shard over its own share of the NICs */
    long span = 2 * stride;
    if (span > tpd_plan_nvlink_domain(cl)) bw = tpd_plan_net_bw(cl, span) * link_efficiency(cl, 1);
    tpd_plan_hop hop = tpd_plan_group_hop(cl, 2, stride);
    if (tpd_plan_crosses_islands(cl, (long)pp * stride)) {
        if (cl->inter_island_bw * link_efficiency(cl, 1) < bw)
            bw = cl->inter_island_bw * link_efficiency(cl, 1);
        if (cl->inter_island_latency >= 0.0 && cl->inter_island_latency > lat)
            lat = cl->inter_island_latency;
        hop = TPD_PLAN_HOP_ISLAND;
    }
    *bw_p = bw;
    *lat_p = lat;
    *hop_p = pp > 1 ? hop : TPD_PLAN_HOP_NONE;
}

void tpd_plan_cp_link(const tpd_plan_cluster *cl, int cp, long tp, double *bw_p, double *lat_p,
                      tpd_plan_hop *hop_p) {
    long span = (long)cp * tp;
    double bw = cl->intra_bw, lat = cl->intra_latency;
    if (span > tpd_plan_nvlink_domain(cl)) {
        bw = tpd_plan_net_bw(cl, span);
        lat = cl->inter_latency;
        if (tpd_plan_crosses_islands(cl, span)) {
            if (cl->inter_island_bw < bw) bw = cl->inter_island_bw;
            if (cl->inter_island_latency >= 0.0) lat = cl->inter_island_latency;
        }
    }
    *bw_p = bw * link_efficiency(cl, span > tpd_plan_nvlink_domain(cl));
    *lat_p = lat;
    *hop_p = tpd_plan_group_hop(cl, cp, tp);
}

void tpd_plan_ep_link(const tpd_plan_cluster *cl, int ep, long stride, double *bw_p, double *lat_p,
                      tpd_plan_hop *hop_p) {
    /* the same placement as the CP group's: n ranks `stride` apart, all sending at once */
    tpd_plan_cp_link(cl, ep, stride, bw_p, lat_p, hop_p);
}
