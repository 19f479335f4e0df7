/* Writes a cluster profile in the units tpd_plan_cluster_load reads back (the calibration
 * step's output). */
#include "engine/plan/plan.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static void put_curve(FILE *f, const char *key, int n, const double *xs, const double *ys) {
    if (n <= 0) return;
    fprintf(f, "%s:                    # [GFLOP per call, share of peak_tflops]\n", key);
    for (int i = 0; i < n; i++)
        fprintf(f, "  - [%.6g, %.4f]\n", xs[i] / 1e9, ys[i]);
}

tpd_status tpd_plan_cluster_save(const tpd_plan_cluster *c, const char *path, const char *header) {
    FILE *f = fopen(path, "w");
    if (!f) {
        tpd_log_error("cluster profile %s: cannot create: %s", path, strerror(errno));
        return TPD_ERR_IO;
    }
    if (header) {
        const char *p = header;
        while (*p) {
            const char *e = strchr(p, '\n');
            int n = e ? (int)(e - p) : (int)strlen(p);
            fprintf(f, "# %.*s\n", n, p);
            p = e ? e + 1 : p + n;
        }
    }
    fprintf(f, "name: %s\n", c->name);
    fprintf(f, "backend: %s\n", c->backend == TPD_PLAN_BACKEND_CPU ? "cpu" : "cuda");
    fprintf(f, "calibrated: %d\n", c->calibrated);
    fprintf(f,
            "calibrated_bf16: %d            # 1: kernels measured in bf16 (training.precision)\n",
            c->calibrated_bf16);
    fprintf(f, "gpus_per_node: %d             # ranks per node\n", c->gpus_per_node);
    fprintf(f, "cpu_cores: %g                 # cores those ranks share\n", c->cpu_cores);
    fprintf(f, "calibration_ranks: %g         # ranks per node running while measured\n",
            c->calibration_ranks);
    fprintf(f, "peak_tflops: %.6g           # best measured GEMM rate per rank\n",
            c->peak_flops / 1e12);
    fprintf(f, "hbm_gib: %.6g                # memory per rank\n", c->hbm_bytes / 1073741824.0);
    fprintf(f, "hbm_bw_gbs: %.6g             # streaming bandwidth per rank (add kernel)\n",
            c->hbm_bw / 1e9);
    fprintf(f, "usable_memory_fraction: %.3g\n", c->hbm_usable_fraction);
    fprintf(f, "memory_efficiency: %.3g\n", c->mem_efficiency);
    fprintf(f, "intra_node_bw_gbs: %.6g      # collectives (alpha-beta fit)\n", c->intra_bw / 1e9);
    fprintf(f, "intra_node_latency_us: %.6g\n", c->intra_latency * 1e6);
    fprintf(f, "inter_node_bw_gbs: %.6g\n", c->inter_bw / 1e9);
    fprintf(f, "inter_node_latency_us: %.6g\n", c->inter_latency * 1e6);
    fprintf(f, "collective_efficiency: %.3g\n", c->coll_efficiency);
    fprintf(f, "network_collective_efficiency: %.3g  # 0: collective_efficiency\n",
            c->net_coll_efficiency);
    if (c->p2p_bw > 0)
        fprintf(f, "p2p_bw_gbs: %.6g             # pipeline sends\n", c->p2p_bw / 1e9);
    if (c->p2p_latency >= 0) fprintf(f, "p2p_latency_us: %.6g\n", c->p2p_latency * 1e6);
    fprintf(f, "sync_latency_us: %.6g         # extra wait of a sync after compute, 2 ranks\n",
            c->sync_latency * 1e6);
    fprintf(f, "sync_latency_all_us: %.6g     # the same, all calibration_ranks\n",
            c->sync_latency_all * 1e6);
    fprintf(f, "flash_attention_efficiency: %.3g\n", c->flash_efficiency);
    fprintf(f, "flash_attention_backward_efficiency: %.3g  # 0: twice the forward's time\n",
            c->flash_bwd_efficiency);
    fprintf(f, "workspace_mib: %.6g\n", c->workspace_bytes / 1048576.0);
    fprintf(f, "kernel_overhead_us: %.6g\n", c->kernel_overhead_s * 1e6);
    fprintf(f, "gemm_backward_ratio: %.4g       # linear backward / forward time\n",
            c->gemm_bwd_ratio);
    fprintf(f, "attention_backward_ratio: %.4g\n", c->attn_bwd_ratio);
    /* topology and the framework's costs (docs/planner-profiles.md) */
    fprintf(f, "nvlink_domain_gpus: %d       # GPUs on one NVLink fabric\n",
            c->nvlink_domain_gpus > 0 ? c->nvlink_domain_gpus : c->gpus_per_node);
    fprintf(f, "nics_per_node: %d\n", c->nics_per_node > 0 ? c->nics_per_node : c->gpus_per_node);
    fprintf(f, "leaf_switch_nodes: %d        # 0: one leaf switch\n", c->leaf_switch_nodes);
    fprintf(f, "fabric_oversubscription: %.6g\n",
            c->oversubscription >= 1.0 ? c->oversubscription : 1.0);
    fprintf(f, "island_nodes: %d             # 0: one island\n", c->island_nodes);
    if (c->island_nodes > 0) {
        fprintf(f, "inter_island_gbs: %.6g       # per GPU\n", c->inter_island_bw / 1e9);
        fprintf(f, "inter_island_latency_us: %.6g\n",
                (c->inter_island_latency >= 0.0 ? c->inter_island_latency : c->inter_latency) *
                    1e6);
    }
    fprintf(f, "tp_overlap_available: %d\n", c->tp_overlap_available);
    fprintf(f, "tp_overlap_share: %.6g\n", c->tp_overlap_share);
    fprintf(f, "tp_overlap_chunk_us: %.6g\n", c->tp_overlap_chunk_s * 1e6);
    fprintf(f, "tp_overlap_gemm_slowdown: %.6g\n", c->tp_overlap_slowdown);
    fprintf(f, "host_launch_us: %.6g\n", c->host_launch_s * 1e6);
    fprintf(f, "micro_batch_host_us: %.6g\n", c->micro_batch_host_s * 1e6);
    fprintf(f, "step_host_ms: %.6g\n", c->step_host_s * 1e3);
    fprintf(f, "optimizer_fixed_ms: %.6g\n", c->optimizer_fixed_s * 1e3);
    fprintf(f, "straggler_cv: %.6g\n", c->straggler_cv);
    fprintf(f, "global_syncs: %d\n", c->global_syncs);
    fprintf(f, "global_sync_algorithm: %s\n", c->sync_ring ? "ring" : "tree");
    put_curve(f, "gemm_efficiency", c->gemm_curve_len, c->gemm_curve_flops, c->gemm_curve_eff);
    put_curve(f, "attention_efficiency", c->attn_curve_len, c->attn_curve_flops, c->attn_curve_eff);
    fprintf(f, "elementwise_ns:                  # nanoseconds per element\n");
    const struct {
        const char *k;
        double v;
    } ew[] = {{"add", c->ew_add},
              {"layernorm_fwd", c->ew_layernorm_fwd},
              {"layernorm_bwd", c->ew_layernorm_bwd},
              {"gelu_fwd", c->ew_gelu_fwd},
              {"gelu_bwd", c->ew_gelu_bwd},
              {"xent_fwd", c->ew_xent_fwd},
              {"xent_bwd", c->ew_xent_bwd},
              {"adamw", c->ew_adamw},
              {"sumsq", c->ew_sumsq},
              {"zero", c->ew_zero}};
    for (size_t i = 0; i < sizeof ew / sizeof ew[0]; i++)
        fprintf(f, "  %s: %.4g\n", ew[i].k, ew[i].v * 1e9);
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        tpd_log_error("cluster profile %s: write failed", path);
        return TPD_ERR_IO;
    }
    return TPD_OK;
}
