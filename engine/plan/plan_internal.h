/* Helpers shared by the planner's files; not part of its public API. */
#ifndef TPD_ENGINE_PLAN_PLAN_INTERNAL_H
#define TPD_ENGINE_PLAN_PLAN_INTERNAL_H

#include "engine/plan/plan.h"

/* Per-layer parameters on one TP rank of the config's block (GPT-2's or Llama's: K/V
 * projections of the K/V heads, two or three MLP matrices, biases or none, LayerNorm or
 * RMSNorm). */
double tpd_plan_layer_params(const tpd_config *cfg, int tp);
/* Parameters of one norm (LayerNorm: weight and bias; RMSNorm: weight). */
double tpd_plan_norm_params(const tpd_config *cfg);
/* Parameters of one rank of `stage`. */
double tpd_plan_stage_params(const tpd_config *cfg, const tpd_plan_layout *lay, int stage);
int tpd_plan_uses_flash(const tpd_config *cfg);
/* 1 when the first and the last stage each hold the tied token embedding and all-reduce its
 * gradient (Megatron's embedding group): tied and pp > 1. An untied model has no such
 * group: the input embedding lives on the first stage, the output layer on the last. */
int tpd_plan_embedding_group(const tpd_config *cfg, const tpd_plan_layout *lay);
/* 1 for GPT-2's block: every Llama key at its GPT default (LayerNorm, learned positions, no
 * SwiGLU, one K/V head per query head, tied, biases). */
int tpd_plan_gpt_block(const tpd_config *cfg);

/* One stage's compute per micro-batch (all its chunks together), s, as each backend's time
 * model predicts it. bwd is the whole backward (recompute included); under zb-h1 it holds
 * the extra work of the split and wgrad is W's share of it. The ends (embedding on the first
 * stage; final LayerNorm, logits and loss on the last) are given apart, so that a time inside
 * an action can be placed at a layer. */
typedef struct tpd_plan_stage_cost {
    double fwd, bwd, wgrad;
    double tp_comm;              /* TP collectives inside fwd + bwd (exposed) */
    double tp_comm_hidden;       /* TP collectives the overlap hid behind GEMMs */
    double embed_fwd, embed_bwd; /* first stage */
    double head_fwd, head_bwd;   /* last stage */
} tpd_plan_stage_cost;

/* tpd_plan_stage_cost of each backend (timing.c: cuda roofline, timing_cpu.c: calibrated). */
void tpd_plan_gpu_stage_cost(const tpd_config *cfg, const tpd_plan_cluster *cl,
                             const tpd_plan_layout *lay, int stage, tpd_plan_stage_cost *out);
void tpd_plan_cpu_stage_cost(const tpd_config *cfg, const tpd_plan_cluster *cl,
                             const tpd_plan_layout *lay, int stage, tpd_plan_stage_cost *out);
void tpd_plan_stage_cost_of(const tpd_config *cfg, const tpd_plan_cluster *cl,
                            const tpd_plan_layout *lay, int stage, tpd_plan_stage_cost *out);

/* A collective's time, affine in the bytes it moves: per_byte * bytes + fixed, s. */
typedef struct tpd_plan_affine {
    double per_byte, fixed;
} tpd_plan_affine;

/* The DP communication of a step, as a backend's model prices it. */
typedef struct tpd_plan_dp_cost {
    tpd_plan_affine reduce; /* one bucket's DP sum: all-reduce, or ZeRO reduce-scatter */
    tpd_plan_affine gather; /* one bucket's ZeRO all-gather of the parameters (0 without) */
    double grad_bytes;      /* bytes per gradient element the reduction moves */
    double param_bytes;     /* bytes per parameter element the gather moves */
    double emb_allreduce;   /* tied-embedding all-reduce between first and last stage, s
                               (0 without an embedding group: untied, or pp == 1) */
} tpd_plan_dp_cost;

/* Elements of every hook unit of a stage's flat buffer (engine/model/model_layout.h), in
 * buffer order: the embedding (wte, wpe on the first stage; the last stage's tied wte),
 * each local layer (chunk 0's first), the final norm and an untied output layer (which the
 * engine lays out after it, as Megatron's output_layer comes last); padded to a multiple of
 * DP, the padding with the last unit. n = Ls + 2 units; unit index u + 1 for hook unit u. */
typedef struct tpd_plan_units {
    int n, Ls;
    double *elems; /* [n] */
    double padded; /* total, a multiple of DP */
    double bucket; /* elements per DP bucket (parallel.ddp_bucket_size, as tpd_dp_plan_init) */
    int nbuckets;
} tpd_plan_units;
tpd_status tpd_plan_units_init(const tpd_config *cfg, const tpd_plan_layout *lay, int stage,
                               tpd_plan_units *u);
void tpd_plan_units_free(tpd_plan_units *u);
/* Element range of bucket b. */
void tpd_plan_units_bucket(const tpd_plan_units *u, int b, double *begin_p, double *len_p);

/* Everything after the simulated pipeline: per stage, the DP buckets start when the last
 * backward (or W) has made their layers final (overlap_grad_reduce) or after the pipeline,
 * and run one after another; the ZeRO all-gathers of the next step's parameters, bucket by
 * bucket after the optimizer, against the first forward that needs each. Fills the dp_*
 * fields of res->time, res->dp_exposed, pp_idle_fraction, and res->step_time_s from
 * pipe (with p2p) and res->time.{compute, pp_bubble, pp_p2p, optimizer, straggler,
 * global_sync, step_host}. */
tpd_status tpd_plan_step_finish(const tpd_config *cfg, const tpd_plan_layout *lay,
                                const tpd_plan_pipe *pipe, const tpd_plan_stage_cost *cost,
                                const tpd_plan_dp_cost *dpc, tpd_plan_result *res);
/* The serial DP time of a stage that no overlap hides: every bucket under no
 * overlap_grad_reduce, else those holding the embedding (they wait for the pipeline); the
 * same for the gathers. For the search's lower bound. */
double tpd_plan_dp_unhidden(const tpd_config *cfg, const tpd_plan_layout *lay, int stage,
                            const tpd_plan_dp_cost *dpc);

/* ---- the network and the terms that grow with scale (plan/network.c) ---- */

/* Link of a group of n ranks `stride` apart in Megatron's rank order (TP 1, DP TP, a
 * pipeline boundary TP*DP): the slowest hop it crosses, bandwidth (collective efficiency
 * applied) and latency per ring step. */
void tpd_plan_group_link(const tpd_plan_cluster *cl, int n, long stride, double *bw_p,
                         double *lat_p);
/* GPUs of one NVLink domain: nvlink_domain_gpus, or the node. */
int tpd_plan_nvlink_domain(const tpd_plan_cluster *cl);
/* One GPU's network bandwidth for traffic within `span` consecutive ranks: its share of
 * the node's NICs, divided by the oversubscription when the span crosses leaf switches. */
double tpd_plan_net_bw(const tpd_plan_cluster *cl, long span);
/* compute x straggler_cv x E[max of `world` standard normals], s. */
double tpd_plan_straggler_time(const tpd_plan_cluster *cl, double compute, int world);
/* global_syncs small all-reduces over `world` ranks (tree or ring latency), s. */
double tpd_plan_global_sync_time(const tpd_plan_cluster *cl, int world);

/* The GPU model's and the cpu model's DP prices for a layout. */
void tpd_plan_gpu_dp_cost(const tpd_config *cfg, const tpd_plan_cluster *cl,
                          const tpd_plan_layout *lay, tpd_plan_dp_cost *out);
void tpd_plan_cpu_dp_cost(const tpd_config *cfg, const tpd_plan_cluster *cl,
                          const tpd_plan_layout *lay, tpd_plan_dp_cost *out);

/* The cpu backend's whole-step model (pipeline simulated as on cuda). */
tpd_status tpd_plan_cpu_time_evaluate(const tpd_config *cfg, const tpd_plan_cluster *cl,
                                      const tpd_plan_options *opt, int split_bubble,
                                      tpd_plan_result *res);
/* The simulator's inputs of each stage: per (micro-batch, chunk), the stage's times over v
 * (the simulator has one time per stage; the chunks of a stage share it). */
void tpd_plan_sim_times(const tpd_plan_layout *lay, const tpd_plan_stage_cost *cost, double p2p,
                        tpd_pp_sim_times *times);
/* The simulator's inputs into res: the slowest stage's per-chunk times (t_*_chunk), the
 * p2p time, and every stage's times (stage_times). */
void tpd_plan_set_times(const tpd_plan_layout *lay, const tpd_plan_stage_cost *cost, int slowest,
                        double p2p, tpd_plan_result *res);
/* Throughput fields of res from its step time. */
void tpd_plan_rates(const tpd_config *cfg, const tpd_plan_cluster *cl, tpd_plan_result *res);

#endif
