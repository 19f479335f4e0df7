/* The dry-run planner: for a model config and a cluster profile it predicts memory per
 * rank, step time, TFLOP/s and MFU of TP/CP/PP/DP layouts, ranks them and explains the
 * ones it rejects. No GPU and no MPI are needed.
 *
 * Units: bytes, seconds, FLOPs (not FLOP/s) unless the name says otherwise.
 *
 * The memory is the bytes `tripod train` allocates on the cluster's backend (the engine's
 * buffer plan in closed form, the backend's planned scratch included; tpd_model_memory is
 * held equal to it), plus the libraries' workspace on a cuda cluster. Korthikanti et al.'s
 * (2022) per-layer activation terms stay as a reference beside it
 * (tpd_plan_activation_bytes_per_layer). The time model is a
 * roofline per GEMM with an efficiency curve by GEMM size, memory-bound kernels at HBM
 * bandwidth, ring collectives, and the pipeline from simulating the schedule's action
 * lists (parallel/pipeline/schedule.h: the lists the executor walks) with each stage's
 * times; the DP communication from its buckets' completion times in that simulation.
 *
 * A layout carries everything `tripod train` needs to run it (the schedule and the overlap
 * flags included), and tpd_plan_overrides prints it as the config overrides that do. */
#ifndef TPD_ENGINE_PLAN_PLAN_H
#define TPD_ENGINE_PLAN_PLAN_H

#include <stdint.h>
#include <stdio.h>

#include "base/status.h"
#include "engine/config/config.h"
#include "kernels/kernels.h"
#include "parallel/pipeline/schedule.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TPD_PLAN_MAX_CURVE 32

typedef enum tpd_plan_backend {
    TPD_PLAN_BACKEND_CUDA = 0,
    TPD_PLAN_BACKEND_CPU = 1,
} tpd_plan_backend;

/* A cluster profile (configs/clusters/NAME.yaml). */
typedef struct tpd_plan_cluster {
    char name[64];
    char path[TPD_CONFIG_STR];
    tpd_plan_backend backend;
    int gpus_per_node;
    double peak_flops;           /* dense bf16/fp16 FLOP/s per device (never sparsity) */
    double hbm_bytes;            /* device memory, bytes */
    double hbm_bw;               /* device memory bandwidth, bytes/s */
    double hbm_usable_fraction;  /* share of hbm_bytes a layout may plan for */
    double mem_efficiency;       /* achieved share of hbm_bw in memory-bound kernels */
    double intra_bw;             /* per-device, per-direction intra-node link, bytes/s */
    double intra_latency;        /* seconds per ring step */
    double inter_bw;             /* per-device network bandwidth, bytes/s */
    double inter_latency;        /* seconds per ring step */
    double coll_efficiency;      /* achieved share of link bandwidth in collectives */
    double net_coll_efficiency;  /* the same on the network's links; 0: coll_efficiency */
    double flash_efficiency;     /* flash attention FLOP rate as a share of peak */
    double flash_bwd_efficiency; /* its backward's, on 2.5x the FLOPs; 0: twice its time */
    double workspace_bytes;      /* cuBLASLt workspace + communicator buffers per rank */
    double kernel_overhead_s;    /* launch gap per kernel on the critical path, seconds */
    /* GEMM efficiency (share of peak) against GEMM FLOPs, interpolated in log(FLOPs);
     * below the first point the first value holds, above the last the last. */
    int gemm_curve_len;
    double gemm_curve_flops[TPD_PLAN_MAX_CURVE];
    double gemm_curve_eff[TPD_PLAN_MAX_CURVE];

    /* ---- the cpu backend's time model (plan/timing_cpu.c); all optional ----
     * `tripod bench --calibrate` measures them on the machine itself. */
    int calibrated;           /* 1: measured here, so peak_flops is a real peak (MFU) */
    int calibrated_bf16;      /* 1: measured with training.precision bf16 (its kernels) */
    double cpu_cores;         /* cores the ranks of a node share; 0 = not shared */
    double calibration_ranks; /* ranks per node that ran at once while calibrating */
    double gemm_bwd_ratio;    /* linear layer backward time / forward time */
    /* Attention kernel (cpu: blocked causal sgemms + softmax) efficiency against its
     * forward FLOPs per call, as gemm_efficiency; backward = ratio x forward. */
    int attn_curve_len;
    double attn_curve_flops[TPD_PLAN_MAX_CURVE];
    double attn_curve_eff[TPD_PLAN_MAX_CURVE];
    double attn_bwd_ratio;
    /* Seconds per element of the memory-bound kernels; 0 = from hbm_bw. */
    double ew_add, ew_layernorm_fwd, ew_layernorm_bwd, ew_gelu_fwd, ew_gelu_bwd;
    double ew_xent_fwd, ew_xent_bwd, ew_adamw, ew_sumsq, ew_zero;
    double p2p_bw;      /* one-way pipeline send, bytes/s; 0 = intra_bw */
    double p2p_latency; /* s; < 0 = intra_latency */
    /* Extra wait of a collective or a blocking receive that follows compute, s: ranks
     * that share cores arrive a scheduler time slice apart (0 when they do not). For a
     * group of 2, and for a group of calibration_ranks; between them, linear in log2 of
     * the group size. */
    double sync_latency, sync_latency_all;

    /* ---- network topology (all optional; the defaults are one NVLink domain per node, a
     * NIC per GPU and a non-blocking fabric, the model before these keys) ---- */
    int nvlink_domain_gpus;  /* GPUs on one NVLink fabric at intra_bw (8 DGX, 72 NVL72);
                                0 = gpus_per_node */
    int nics_per_node;       /* network cards per node, inter_bw each; 0 = gpus_per_node */
    int leaf_switch_nodes;   /* nodes under one leaf switch; 0 = every node (one leaf) */
    double oversubscription; /* leaf uplinks : downlinks (>= 1; 1 = rail-optimized or
                                non-blocking): a group spanning more than leaf_switch_nodes
                                nodes gets inter_bw / oversubscription */
    /* Islands: groups of nodes joined by a slower link (two sites, two clusters, a
     * partitioned fabric). A group whose span of consecutive ranks exceeds an island's
     * GPUs crosses it: each GPU's share of the inter-island link, at its latency. */
    int island_nodes;            /* nodes per island; 0 = one island (no such link) */
    double inter_island_bw;      /* per-GPU, per-direction bandwidth between islands, bytes/s */
    double inter_island_latency; /* seconds per ring step; < 0 = inter_latency */
    /* ---- the framework's costs (all optional; the defaults add nothing) ---- */
    int tp_overlap_available;   /* 1: the framework can overlap TP communication with the
                                   GEMMs (parallel.tp_comm_overlap); 0: refused */
    double tp_overlap_share;    /* most of a TP collective the overlap can hide, 0..1 */
    double tp_overlap_chunk_s;  /* cost of one ring-exchange chunk, s (TP chunks a GEMM) */
    double tp_overlap_slowdown; /* GEMM time added while the overlap's kernels share the
                                   SMs, as a share of the GEMM time */
    double host_launch_s;       /* host time to launch a kernel: no kernel takes less when
                                   the host cannot run ahead of the device; 0 = it can */
    double micro_batch_host_s;  /* host work per micro-batch per stage (batch slicing,
                                   schedule bookkeeping), s */
    double step_host_s;         /* per step: data loading, logging, timers, s */
    double optimizer_fixed_s;   /* per step, beyond the optimizer's bytes (unfused launches,
                                   the grad-norm's host sync), s */
    double straggler_cv;        /* per-rank compute time variation: the coefficient of
                                   variation of a normal distribution (0 = none) */
    int global_syncs;           /* small all-reduces over every rank per step (grad norm,
                                   inf check, ...) */
    int sync_ring;              /* 1: those run as rings (latency 2(N-1) steps); 0: trees
                                   (2 ceil(log2 N) steps, NCCL's choice for small sizes) */
    char framework[64];         /* the framework profile applied ("": none) */
} tpd_plan_cluster;

/* Loads NAME (configs/clusters/NAME.yaml under the source tree, then under the current
 * directory) or a file path. Unknown keys, missing required keys and bad values fail
 * with a message naming the file, the line and the key. */
tpd_status tpd_plan_cluster_load(const char *name_or_path, tpd_plan_cluster *cluster_p);
/* Writes a profile in the format tpd_plan_cluster_load reads (every key, units as
 * written by hand: TFLOP/s, GiB, GB/s, us, ns). `header` is a comment block (lines
 * without '#', may be NULL). */
tpd_status tpd_plan_cluster_save(const tpd_plan_cluster *c, const char *path, const char *header);

/* A framework profile (configs/frameworks/NAME.yaml): what the training software costs on
 * top of the hardware (per-kernel gaps, host time per micro-batch and per step, stragglers,
 * global syncs, TP overlap), in the cluster profile's framework keys and units. Applied to a
 * cluster, it sets the keys it states and leaves the others as the cluster has them. */
#define TPD_PLAN_FRAMEWORK_MAX_KEYS 24
typedef struct tpd_plan_framework {
    char name[64];
    char path[TPD_CONFIG_STR];
    char kind[32];            /* the family it is validated on: megatron, deepspeed, ... */
    char calibrated_from[64]; /* the published source (tests/engine/plan/published) its
                                 constants were set on; "" none */
    char description[256];
    int n_set;                                      /* keys the file states */
    size_t set_offset[TPD_PLAN_FRAMEWORK_MAX_KEYS]; /* their fields in tpd_plan_cluster */
    tpd_plan_cluster values;                        /* the stated values (SI), at those fields */
} tpd_plan_framework;

/* Loads NAME (configs/frameworks/NAME.yaml under the current directory, then under the source
 * tree) or a file path. Only framework keys are accepted; an unknown NAME fails listing the
 * known ones. */
tpd_status tpd_plan_framework_load(const char *name_or_path, tpd_plan_framework *fw_p);
/* Sets the keys fw states on cl and names it in cl->framework. */
void tpd_plan_framework_apply(const tpd_plan_framework *fw, tpd_plan_cluster *cl);
/* The names of the shipped framework profiles, ", "-separated, sorted ("" when none). */
void tpd_plan_framework_names(char *out, size_t outlen);

typedef struct tpd_plan_layout {
    int tp, pp, dp;
    int micro_batch_size;
    int virtual_stages; /* model chunks per stage; > 1 runs the interleaved schedule */
    tpd_recompute recompute;
    int sequence_parallel;
    int distributed_optimizer; /* ZeRO-1 */
    tpd_schedule schedule;     /* parallel.pipeline_schedule (interleaved whenever
                                  virtual_stages > 1, as tpd_config_schedule says) */
    int overlap_grad_reduce;   /* parallel.overlap_grad_reduce */
    int overlap_param_gather;  /* parallel.overlap_param_gather (ZeRO-1 only) */
    int tp_comm_overlap;       /* parallel.tp_comm_overlap (SP and TP > 1 only); the search
                                  turns it on only where the config does */
    tpd_dp_sharding sharding;  /* parallel.data_parallel_sharding_strategy; the layout shards
                                  at least optim under distributed_optimizer (tpd_plan_sharding) */
    int shard_size;            /* parallel.data_parallel_shard_size: HSDP's shard group of
                                  consecutive DP ranks; 0 = all of DP */
    /* Context parallelism (parallel.context_parallel_size; 0 reads as 1): CP ranks split each
     * sequence (2 x CP chunks, rank r holding chunks r and 2 CP - 1 - r), so the world is
     * TP x CP x DP x PP and each rank runs seq / CP tokens of every sequence; weights are
     * whole on every CP rank and their gradients are summed over DP x CP. Last in the struct,
     * so that the positional initializers of the 3D layouts read as CP 1. */
    int cp;
    tpd_cp_comm cp_comm; /* parallel.cp_comm_type: p2p (ring attention) or a2a (Ulysses) */
    /* Expert parallelism (parallel.expert_model_parallel_size; 0 reads as 1): a mixture's E
     * experts split over EP consecutive DP ranks (E / EP each; Megatron's order TP, CP, EP,
     * expert-DP, PP, so an EP group's ranks are TP x CP apart); EP divides DP and E. The
     * tokens go to their experts' ranks and back by all-to-alls, and an expert's gradients
     * are summed over the DP x CP / EP ranks that hold it (expert-DP). */
    int ep;
} tpd_plan_layout;

/* Bytes per rank of one pipeline stage. `optimizer` includes the fp32 master weights;
 * `outer` is DiLoCo's outer state (tpd_mem_breakdown.outer; 0 under every_step). */
typedef struct tpd_plan_stage_mem {
    double params, grads, optimizer, outer, activations, workspace, total;
    /* Sharded DP: `gather` is the working set beside the shards, in total. Over all of DP
     * it is the engine's staging slots (tpd_mem_breakdown.gather): optim_grads_params'
     * max(fsdp_units_in_flight, 2) slots of the largest unit's gathered parameters, and
     * under both optim_grads strategies two slots of a layer's (or the final unit's)
     * gradients, one more per layer whose W is pending under ZB-H1, and the embedding's
     * own. Under hybrid sharding (planned only) the GPU model's: two DP buckets of
     * gradients, or fsdp_units_in_flight gathered units and two units' gradients. The
     * *_full fields are params, grads and optimizer unsharded (no_shard), for the report. */
    double gather;
    double params_full, grads_full, optimizer_full;
} tpd_plan_stage_mem;

/* Where one step's time goes, s. step_time_s = compute + pp_bubble + pp_p2p +
 * dp_comm_exposed + optimizer + dp_gather_exposed + dp_shard_exposed + dp_replica_allreduce +
 * straggler + global_sync + step_host + dp_outer + outer_update. */
typedef struct tpd_plan_time {
    double compute;           /* M x (fwd + bwd incl. recompute) of the slowest stage */
    double tp_comm;           /* the TP collectives inside that (what the overlap left exposed) */
    double tp_comm_hidden;    /* beside it, not inside: what parallel.tp_comm_overlap hid */
    double cp_comm;           /* inside compute: the context-parallel communication the
                                 attention does not hide (p2p: each ring step's K/V, or in the
                                 backward K/V and dK/dV, transfer past its block's compute;
                                 a2a: the four all-to-alls per layer, whole) */
    double cp_comm_hidden;    /* beside it, not inside: the ring's transfers the blocks hid */
    double host_overhead;     /* inside compute: the host's share (host_launch_us floors, the
                                 per-micro-batch host work) */
    double ep_comm;           /* inside compute: expert parallelism's all-to-alls (per MoE layer
                                 and micro-batch the dispatch and the combine, forward and
                                 backward, and the forward's exchange of the expert counts),
                                 whole: none is overlapped with compute */
    double pp_bubble;         /* simulated pipeline idle with free p2p */
    double pp_p2p;            /* the p2p the schedule does not hide: the simulated pipeline with
                                 each send's latency and transfer on its receiver's path, less
                                 the same with free sends (interleaving: v times the sends) */
    double straggler;         /* compute x straggler_cv x E[max of N standard normals], N the
                                 world: the slowest rank sets the step at its global sync */
    double global_sync;       /* the profile's global_syncs small all-reduces over every rank */
    double step_host;         /* per-step host work (data loading, ...), step_host_ms */
    double dp_comm_exposed;   /* the embedding and DP gradient reduction past the pipeline,
                                 on the step's critical path: max over stages of (pipeline end
                                 + exposed) - the pipeline's makespan */
    double optimizer;         /* norm, clipping, AdamW (memory bound) + optimizer_fixed_ms */
    double dp_gather_exposed; /* ZeRO-1 parameter all-gather that the next step's forward
                                 waits for (all of it without overlap_param_gather) */
    double dp_shard_exposed;  /* sharded DP beyond ZeRO-1: optim_grads_params' per-micro-batch
                                 parameter all-gathers (before each unit's forward and
                                 backward) and gradient reduce-scatters that the prefetch does
                                 not hide behind the units' compute, and its last
                                 reduce-scatter's tail; optim_grads' reduce-scatters of the
                                 earlier micro-batches past their backward */
    double dp_replica_allreduce; /* HSDP: the all-reduce of the gradient shard over the
                                    replicas (DP / shard size ranks, on their own link) */
    double dp_outer;             /* DiLoCo: the outer all-reduce of the pseudo-gradients, per
                                    step: F fragments every H steps, each exposed for what its
                                    overlap_steps of compute do not hide (0 under every_step) */
    double outer_update;         /* DiLoCo: the outer Nesterov step's memory-bound passes over
                                    the shard, per step (1/H of one) */
    /* Reported beside the step, not part of the sum: */
    double dp_comm_total;    /* every DP and embedding collective of a stage back to back
                                (the most of any stage): exposed + hidden */
    double dp_exposed_max;   /* max over stages of how far that stage's reduction (the
                                embedding all-reduce included) ends past its own pipeline
                                end: the trainer's t_reduce_s, max over ranks */
    double pp_idle_fraction; /* 1 - sum of busy / sum of pipeline time over the stages (each
                                from the step's start to its own end): the trainer's idle
                                fraction (tpd_trainer_job_timers, bench, sweep) */
} tpd_plan_time;

/* The slowest hop a group's collectives cross (engine/plan/network.c). */
typedef enum tpd_plan_hop {
    TPD_PLAN_HOP_NONE = 0,   /* a group of one rank, or not modelled (cpu backend) */
    TPD_PLAN_HOP_NVLINK,     /* inside one NVLink domain */
    TPD_PLAN_HOP_NETWORK,    /* over the NICs, under one leaf switch */
    TPD_PLAN_HOP_CROSS_LEAF, /* over oversubscribed leaf uplinks */
    TPD_PLAN_HOP_ISLAND,     /* over the link between islands (island_nodes) */
} tpd_plan_hop;

/* The held-out error of a class of profiles (plan/heldout.c): the lowest and highest error
 * (predicted speed / published speed - 1; positive: optimistic) of the published runs on
 * such profiles, each predicted by constants fitted without its source. cls NULL: none. */
typedef struct tpd_plan_band {
    const char *cls; /* "A100 profiles", ... (static) */
    int runs;        /* published runs behind the figures */
    double lo, hi;   /* lowest and highest held-out error */
} tpd_plan_band;

/* The band of cl's class, or none (cls NULL) for a profile no published run holds. */
void tpd_plan_heldout_band(const tpd_plan_cluster *cl, tpd_plan_band *band_p);

typedef struct tpd_plan_result {
    int stage_layers[TPD_CONFIG_MAX_STAGES]; /* transformer layers of each stage (all chunks) */
    int chunk_layers[TPD_CONFIG_MAX_STAGES]; /* layers of each virtual stage, PP*v entries in
                                                Megatron's order (chunk c of stage s is c*PP+s):
                                                parallel.pipeline_layers when v > 1 */
    int balanced;         /* 1: the layers were split by predicted stage time (the first stage
                             also embeds, the last also runs the head and loss), not evenly;
                             `parallel.pipeline_layers` set to them trains the same split */
    int recompute_layers; /* > 0: the search found that recomputing only this many layers
                             per stage (training.recompute_num_layers) fits; 0: as the
                             config says */
    tpd_plan_layout layout;
    int num_micro_batches;
    int fits;                /* memory fits and the layout is valid */
    char reject_reason[192]; /* "" when valid and fitting */
    int stages;
    int max_mem_stage;
    double memory_bytes; /* max over ranks */
    tpd_plan_stage_mem mem[TPD_CONFIG_MAX_STAGES];
    double step_time_s;
    tpd_plan_time time;
    double t_fwd_chunk, t_bwd_chunk, t_p2p; /* the slowest stage's per-chunk times, s */
    double t_wgrad_chunk;                   /* of which W (zb-h1: the weight gradients), s */
    tpd_pp_sim_times stage_times[TPD_CONFIG_MAX_STAGES]; /* the simulator's inputs, per stage
                                                            and (micro-batch, chunk) */
    double dp_exposed[TPD_CONFIG_MAX_STAGES]; /* per stage: reduction past its pipeline end */
    tpd_plan_hop hop_tp, hop_dp, hop_pp;      /* where the TP and DP groups and the pipeline
                                                 sends run (hop_dp: the shard group's) */
    tpd_plan_hop hop_cp;                      /* the CP group: CP ranks TP apart (NONE at CP 1) */
    tpd_plan_hop hop_replica; /* HSDP: the replicas' all-reduce (NONE without replicas) */
    tpd_plan_hop hop_ep;  /* the EP group's all-to-alls: EP ranks TP x CP apart (NONE at EP 1) */
    tpd_plan_hop hop_edp; /* expert-DP: the expert gradients' reduction (NONE at EP 1) */
    int shard_group;      /* ranks each shard is over: the shard size, or all of DP */
    /* ---- context parallelism (0 at CP 1): one layer of one micro-batch on one rank ---- */
    int cp_tokens;         /* of each sequence: seq_length / CP */
    double cp_bytes_layer; /* sent to its CP peers, forward and backward */
    double cp_step_comm_s; /* p2p: one forward ring step's K/V transfer; a2a: the forward's
                              all-to-all of Q, K and V */
    double cp_step_attn_s; /* p2p: one block of attention (the rank's queries against one
                              K/V block); a2a: the whole attention, head-split */
    /* ---- expert parallelism (0 at EP 1): one MoE layer of one micro-batch on one rank ---- */
    int ep_local_experts; /* E / EP */
    int ep_expert_dp;     /* ranks of the expert-DP group: DP x CP / EP */
    double moe_imbalance; /* model.moe_imbalance: the busiest EP rank's tokens over the mean */
    double ep_a2a_bytes;  /* one all-to-all's bytes a rank sends: N k (EP-1)/EP rows of C
                             elements, times moe_imbalance */
    double ep_a2a_s;      /* one such all-to-all, s */
    double ep_counts_s;   /* the forward's exchange of the EP x E/EP expert counts, s */
    double model_flops, hw_flops; /* per iteration, all GPUs */
    double tflops_per_gpu, hw_tflops_per_gpu, mfu, tokens_per_s;
    /* DP wire bytes one rank sends per step (its busiest stage): the every-step reduction
     * over its DP group, plus under DiLoCo the outer all-reduce over 1/H of it */
    double dp_bytes_step;
    /* ---- DiLoCo (parallel.dp_sync: diloco; all 0 otherwise) ---- */
    int diloco;                /* 1: the layout was timed with DiLoCo */
    int dp_replicas, dp_inner; /* R replicas of dp_inner ranks (consecutive DP indices) */
    int diloco_h;              /* diloco.sync_interval: inner steps between a fragment's syncs */
    int diloco_fragments;      /* diloco.fragments (Streaming DiLoCo) */
    int diloco_overlap_steps;  /* diloco.overlap_steps */
    tpd_plan_hop hop_outer;    /* the outer group: R ranks dp_inner*TP apart */
    double outer_comm_s;       /* one whole outer all-reduce (every fragment), s */
    double outer_frag_bytes;   /* bytes per rank of one fragment's all-reduce: the peak */
    /* the same layout with every-step synchronization, for the report beside DiLoCo's
     * (filled on the reports' pass, split_bubble, where 0 means not timed) */
    double every_step_time_s, every_step_tokens_per_s, every_step_mfu, every_step_dp_bytes;
    tpd_plan_hop every_step_hop_dp; /* its DP group: all DP ranks, TP apart */
    tpd_plan_band heldout;          /* how far predictions on this cluster's class were off */
    char framework[64];             /* the cluster's framework profile ("": none applied) */
} tpd_plan_result;

typedef struct tpd_plan_options {
    int gpus;           /* world size to plan for */
    int top_k;          /* layouts printed by the search */
    int dp_overlap;     /* parallel.overlap_grad_reduce of every layout evaluated: 1 on, 0 off,
                           -1 (the default) the layout's own (the search: the config's) */
    int evaluate_time;  /* 0: memory only */
    int balance_stages; /* 1: without parallel.pipeline_layers, split the layers of a
                           pipeline by predicted stage time when that is faster and fits */
    int param_gather_overlap; /* parallel.overlap_param_gather, as dp_overlap */
} tpd_plan_options;

#define TPD_PLAN_OPTIONS_INIT                                                                      \
    { 0, 10, -1, 1, 1, -1 }

/* ---- model arithmetic and memory (plan/memory.c) ---- */

/* Parameters from the actual tensor shapes, unpadded vocab: the token embedding, the
 * position embedding when learned, per layer the Q, K/V (of tpd_config_kv_heads heads),
 * projection and two (SwiGLU: three) MLP matrices with their biases when add_bias_linear,
 * and two norms (LayerNorm: weight and bias; RMSNorm: weight); the final norm; the output
 * layer when untied (tied: the embedding). Llama 3 8B / 70B / 405B: 8.03B / 70.6B / 405.9B. */
double tpd_plan_params_count(const tpd_config *cfg);
/* Transformer layers of `stage` of the layout (all its chunks), and of chunk `chunk` of it
 * (virtual stage chunk*PP + stage): the config's parallel.pipeline_layers when it lists
 * PP*v entries, else an even split (balanced uneven when the layers do not divide). */
int tpd_plan_stage_layers(const tpd_config *cfg, const tpd_plan_layout *lay, int stage);
int tpd_plan_chunk_layers(const tpd_config *cfg, const tpd_plan_layout *lay, int stage, int chunk);

/* Memory of every stage into res->mem, res->memory_bytes and res->fits (with the reason
 * when it does not): on either backend the bytes `tripod train` allocates there
 * (tpd_plan_cpu_memory with the backend's scratch), on a cuda cluster plus the profile's
 * workspace_bytes (cuBLASLt and communicator buffers; the cuBLASLt workspace alone for one
 * rank). Sets res->num_micro_batches. Fails only where that closed form does (below). */
tpd_status tpd_plan_memory(const tpd_config *cfg, const tpd_plan_cluster *cl, tpd_plan_result *res);
/* The bytes one rank of `stage` allocates in `tripod train` on the backend of
 * cfg->training.device (cpu, or cuda: its planned scratch), in closed
 * form from the model shape and the layout (the engine's buffer plan is not consulted:
 * a test holds the two equal). optimizer includes fp32 master weights; workspace includes
 * the host staging of each activation slot's tokens. GPT-2's block and the Llama block (K/V
 * heads, SwiGLU, RMSNorm, no biases, rotary positions, an untied output layer) alike;
 * every DP sharding strategy over all of DP (optim_grads and optim_grads_params: the
 * unit-aligned shards and their staging slots, `gather`); a shard group short of DP as
 * ZeRO-1 over all of DP (hybrid sharding is not trained). `tripod verify` holds it equal to
 * every rank's allocation. */
tpd_status tpd_plan_cpu_memory(const tpd_config *cfg, const tpd_plan_layout *lay, int stage,
                               tpd_plan_stage_mem *out);

/* ---- layouts and their evaluation (plan/evaluate.c; the cpu attention's FLOPs,
 * plan/timing_cpu.c) ---- */

/* The layout the config itself states (TP, CP and its communication, PP, DP for `gpus`: gpus
 * / (TP*CP*PP), EP for a mixture of experts, mbs, v, schedule, recompute, SP, ZeRO, overlap
 * flags). */
void tpd_plan_layout_from_config(const tpd_config *cfg, int gpus, tpd_plan_layout *lay_p);
/* "TP=8 PP=4 DP=32 mbs=1 v=2 interleaved recompute=full SP=on ZeRO=on overlap=grad+param"
 * into buf; under CP "TP=8 CP=16(p2p) PP=16 ...", under EP "... DP=16 EP=8 mbs=1 ...". */
void tpd_plan_layout_str(const tpd_plan_layout *lay, char *buf, size_t len);
/* Forward FLOPs of one call of the cpu attention kernel (blocked causal: a block of
 * query rows sees the keys up to its end), B x NH heads of T x HS; calibration measures
 * the kernel's rate against it. */
double tpd_plan_cpu_attention_flops(double B, double T, double NH, double HS);

/* Memory then time of one layout. Invalid layouts come back with fits = 0 and a reason;
 * the status is for failures of the planner itself. */
tpd_status tpd_plan_evaluate(const tpd_config *cfg, const tpd_plan_cluster *cl,
                             const tpd_plan_layout *lay, const tpd_plan_options *opt,
                             tpd_plan_result *res_p);

/* ---- search (plan/search.c) ---- */

#define TPD_PLAN_MAX_REASONS 16
#define TPD_PLAN_MAX_EXAMPLES 3

typedef struct tpd_plan_reject_class {
    char key[48]; /* e.g. "out of memory" */
    long count;
    char examples[TPD_PLAN_MAX_EXAMPLES][224]; /* layout + reason with numbers */
    int n_examples;
} tpd_plan_reject_class;

typedef struct tpd_plan_search {
    tpd_plan_result *top; /* best first, n_top <= top_k (owned) */
    int n_top;
    long evaluated; /* layouts whose memory was computed */
    long timed;     /* layouts whose time was computed */
    long pruned;    /* skipped by the lower bound */
    long fitting;
    long rejected;
    tpd_plan_reject_class reasons[TPD_PLAN_MAX_REASONS];
    int n_reasons;
    /* A mixture of experts: the fastest layout with EP > 1 that fits (owned; NULL when none
     * fits, or for a dense model), so that the report can show it beside the best when that
     * one runs EP 1. */
    tpd_plan_result *best_ep;
} tpd_plan_search;

tpd_status tpd_plan_search_run(const tpd_config *cfg, const tpd_plan_cluster *cl,
                               const tpd_plan_options *opt, tpd_plan_search *search_p);
void tpd_plan_search_free(tpd_plan_search *s);

/* ---- output (plan/report.c) ---- */

void tpd_plan_print_table(FILE *f, const tpd_plan_result *r, int n);
void tpd_plan_print_breakdown(FILE *f, const tpd_plan_result *r);
void tpd_plan_print_rejections(FILE *f, const tpd_plan_search *s);
/* "to train it: tripod train CONFIG <the overrides>" (every parallel.* key of the layout
 * and the training.* keys it sets), then what was published about the preset's training
 * (its file's "# published:" comment lines), to read beside the prediction. */
void tpd_plan_print_overrides(FILE *f, const tpd_config *cfg, const tpd_plan_result *r);
/* One JSON object per layout; returns a malloc'd string (caller frees) or NULL. With cfg,
 * each has "overrides": those tpd_plan_print_overrides prints, as an array of "key=value". */
char *tpd_plan_json(const tpd_config *cfg, const tpd_plan_result *r, int n);
/* Predicted timeline of one step as Chrome trace JSON (engine/trace/trace.h), one process per
 * pipeline stage. */
tpd_status tpd_plan_write_trace(const tpd_plan_result *r, const char *path);

#ifdef __cplusplus
}
#endif
#endif
