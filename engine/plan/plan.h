/* The dry-run planner: for a model config and a cluster profile it predicts memory per
 * rank, step time, TFLOP/s and MFU of TP/PP/DP layouts, ranks them and explains the
 * ones it rejects. No GPU and no MPI are needed.
 *
 * Units: bytes, seconds, FLOPs (not FLOP/s) unless the name says otherwise.
 *
 * The memory model is Korthikanti et al. (2022) per-layer activations plus parameter,
 * gradient and optimizer bytes (REFERENCES.md); on a `backend: cpu` cluster the numbers
 * come from tpd_model_memory, the bytes `tripod train` allocates. The time model is a
 * roofline per GEMM with an efficiency curve by GEMM size, memory-bound kernels at HBM
 * bandwidth, ring collectives, and the pipeline bubble from simulating the schedule's
 * action lists (parallel/pipeline/schedule.h). */
#ifndef TPD_ENGINE_PLAN_PLAN_H
#define TPD_ENGINE_PLAN_PLAN_H

#include <stdint.h>
#include <stdio.h>

#include "base/status.h"
#include "engine/config/config.h"

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
    double peak_flops;          /* dense bf16/fp16 FLOP/s per device (never sparsity) */
    double hbm_bytes;           /* device memory, bytes */
    double hbm_bw;              /* device memory bandwidth, bytes/s */
    double hbm_usable_fraction; /* share of hbm_bytes a layout may plan for */
    double mem_efficiency;      /* achieved share of hbm_bw in memory-bound kernels */
    double intra_bw;            /* per-device, per-direction intra-node link, bytes/s */
    double intra_latency;       /* seconds per ring step */
    double inter_bw;            /* per-device network bandwidth, bytes/s */
    double inter_latency;       /* seconds per ring step */
    double coll_efficiency;     /* achieved share of link bandwidth in collectives */
    double flash_efficiency;    /* flash attention FLOP rate as a share of peak */
    double workspace_bytes;     /* cuBLASLt workspace + communicator buffers per rank */
    double kernel_overhead_s;   /* launch gap per kernel on the critical path, seconds */
    /* GEMM efficiency (share of peak) against GEMM FLOPs, interpolated in log(FLOPs);
     * below the first point the first value holds, above the last the last. */
    int gemm_curve_len;
    double gemm_curve_flops[TPD_PLAN_MAX_CURVE];
    double gemm_curve_eff[TPD_PLAN_MAX_CURVE];

    /* ---- the cpu backend's time model (plan/timing_cpu.c); all optional ----
     * `tripod bench --calibrate` measures them on the machine itself. */
    int calibrated;           /* 1: measured here, so peak_flops is a real peak (MFU) */
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
} tpd_plan_cluster;

/* Loads NAME (configs/clusters/NAME.yaml under the source tree, then under the current
 * directory) or a file path. Unknown keys, missing required keys and bad values fail
 * with a message naming the file, the line and the key. */
tpd_status tpd_plan_cluster_load(const char *name_or_path, tpd_plan_cluster *cluster_p);
/* GEMM efficiency for a GEMM of `flops` FLOPs. */
double tpd_plan_gemm_efficiency(const tpd_plan_cluster *c, double flops);
/* Attention kernel efficiency (cpu model) for a call of `flops` forward FLOPs. */
double tpd_plan_attention_efficiency(const tpd_plan_cluster *c, double flops);
/* Writes a profile in the format tpd_plan_cluster_load reads (every key, units as
 * written by hand: TFLOP/s, GiB, GB/s, us, ns). `header` is a comment block (lines
 * without '#', may be NULL). */
tpd_status tpd_plan_cluster_save(const tpd_plan_cluster *c, const char *path, const char *header);

typedef struct tpd_plan_layout {
    int tp, pp, dp;
    int micro_batch_size;
    int virtual_stages; /* 1 = plain 1F1B */
    tpd_recompute recompute;
    int sequence_parallel;
    int distributed_optimizer; /* ZeRO-1 */
} tpd_plan_layout;

/* Bytes per rank of one pipeline stage. `optimizer` includes the fp32 master weights. */
typedef struct tpd_plan_stage_mem {
    double params, grads, optimizer, activations, workspace, total;
} tpd_plan_stage_mem;

typedef struct tpd_plan_time {
    double compute;         /* M x (fwd + bwd incl. recompute) of the slowest stage, s */
    double tp_comm;         /* the TP collectives inside that, s */
    double pp_bubble;       /* simulated pipeline idle with free p2p, s */
    double pp_p2p;          /* what p2p latency and bandwidth add to the pipeline, s */
    double dp_comm_exposed; /* DP gradient reduction not hidden behind backward, s */
    double optimizer;       /* optimizer step (memory bound), s */
} tpd_plan_time;

typedef struct tpd_plan_result {
    int stage_layers[TPD_CONFIG_MAX_STAGES]; /* transformer layers of each stage */
    int balanced;         /* 1: stage_layers were chosen by predicted stage time (the first stage
                             also embeds, the last also runs the head and loss), not split evenly;
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
    double t_fwd_chunk, t_bwd_chunk, t_p2p; /* the simulator's inputs, s */
    double model_flops, hw_flops;           /* per iteration, all GPUs */
    double tflops_per_gpu, hw_tflops_per_gpu, mfu, tokens_per_s;
} tpd_plan_result;

typedef struct tpd_plan_options {
    int gpus;           /* world size to plan for */
    int top_k;          /* layouts printed by the search */
    int dp_overlap;     /* 1: DP gradient reduction overlaps the last backward */
    int evaluate_time;  /* 0: memory only */
    int balance_stages; /* 1: without parallel.pipeline_layers, split the layers of a 1F1B
                           pipeline by predicted stage time when that is faster and fits */
} tpd_plan_options;

#define TPD_PLAN_OPTIONS_INIT                                                                      \
    { 0, 10, 1, 1, 1 }

/* ---- model arithmetic (plan/model.c) ---- */

/* SC21 Eq. 2: 12*l*h^2*(1 + 13/(12h) + (V+s)/(12*l*h)). */
double tpd_plan_params_eq2(double l, double h, double V, double s);
/* Parameters from the actual tensor shapes (token and position embeddings, per-layer
 * weights, biases and LayerNorms, final LayerNorm; the head is tied), unpadded vocab. */
double tpd_plan_params_count(const tpd_config *cfg);
/* Hardware FLOPs per iteration for `batch` sequences: the model FLOPs
 * (engine/model/model_flops.h) plus what the recompute mode recomputes. */
double tpd_plan_hw_flops(const tpd_config *cfg, double batch, double vocab, tpd_recompute r);
/* Korthikanti et al. Table 2 activation bytes per transformer layer per micro-batch on
 * one rank (16-bit activations, 1-byte dropout masks). `flash` drops the 5as/h term. */
double tpd_plan_activation_bytes_per_layer(double s, double b, double h, double a, int tp, int sp,
                                           tpd_recompute r, int flash);
/* Micro-batches (x chunks) whose activations a stage holds at the schedule's peak:
 * 1F1B min(p - stage, M); interleaved min(2(p-stage-1) + (v-1)p + 1, M*v) chunks. */
int tpd_plan_in_flight(int pp, int stage, int micro_batches, int v);
/* Layers of `stage` whose full recompute runs: all under recompute full, or the first
 * training.recompute_num_layers of each model chunk; 0 otherwise. */
int tpd_plan_recomputed_layers(const tpd_config *cfg, const tpd_plan_layout *lay, int stage);
/* Hardware FLOPs of an iteration with the layout's recompute (the block method recomputes
 * only its share of the layers). */
double tpd_plan_layout_hw_flops(const tpd_config *cfg, const tpd_plan_layout *lay, double batch,
                                double vocab);

/* Memory of every stage into res->mem, res->memory_bytes and res->fits (with the reason
 * when it does not). Sets res->num_micro_batches. */
/* Memory of res->layout under the split the planner would run (see balance_stages):
 * returns the config to time it with, cfg or *scratch holding the balanced
 * parallel.pipeline_layers; NULL on failure. */
const tpd_config *tpd_plan_memory_split(const tpd_config *cfg, const tpd_plan_cluster *cl,
                                        const tpd_plan_options *opt, tpd_plan_result *res,
                                        tpd_config *scratch);
/* tpd_plan_time_evaluate of res under its split; a balanced split is kept only when the
 * full time model, not just its slowest stage, finds it faster than the even one. */
tpd_status tpd_plan_time_split(const tpd_config *cfg, const tpd_plan_cluster *cl,
                               const tpd_plan_options *opt, int split_bubble, tpd_plan_result *res,
                               tpd_config *scratch);
/* Recompute full with training.recompute_num_layers left at 0: the fewest layers per stage
 * whose recompute still fits (Megatron's block method), when fewer than all do; sets
 * res->recompute_layers and res's memory to it. res must fit with all layers. */
tpd_status tpd_plan_fit_recompute_layers(const tpd_config *cfg, const tpd_plan_cluster *cl,
                                         tpd_plan_result *res, tpd_config *scratch);
/* The config of a result whose split was chosen already (cfg, or *scratch when balanced). */
const tpd_config *tpd_plan_result_config(const tpd_config *cfg, const tpd_plan_result *res,
                                         tpd_config *scratch);
tpd_status tpd_plan_memory(const tpd_config *cfg, const tpd_plan_cluster *cl, tpd_plan_result *res);
/* The bytes one rank of `stage` allocates in `tripod train` on the cpu backend, in closed
 * form from the model shape and the layout (the engine's buffer plan is not consulted:
 * a test holds the two equal). optimizer includes fp32 master weights; workspace includes
 * the host staging of one micro-batch's tokens. */
tpd_status tpd_plan_cpu_memory(const tpd_config *cfg, const tpd_plan_layout *lay, int stage,
                               tpd_plan_stage_mem *out);

/* ---- time (plan/timing.c) ---- */

/* Per-micro-batch forward and backward time of stage `stage`, seconds, including TP
 * collectives and recomputation; tp_comm_p gets the collective share of fwd+bwd. */
void tpd_plan_stage_time(const tpd_config *cfg, const tpd_plan_cluster *cl,
                         const tpd_plan_layout *lay, int stage, double *fwd_p, double *bwd_p,
                         double *tp_comm_p);
/* Lower bound of the step time without the pipeline (compute + DP + optimizer), s. */
double tpd_plan_time_lower_bound(const tpd_config *cfg, const tpd_plan_cluster *cl,
                                 const tpd_plan_result *res, const tpd_plan_options *opt);
/* Full time model; `split_bubble` runs a second simulation to separate the bubble from
 * the p2p share (reports), otherwise all pipeline overhead is put under pp_bubble. */
tpd_status tpd_plan_time_evaluate(const tpd_config *cfg, const tpd_plan_cluster *cl,
                                  const tpd_plan_options *opt, int split_bubble,
                                  tpd_plan_result *res);

/* The layout the config itself states (TP, PP, DP for `gpus`, mbs, v, recompute, SP,
 * ZeRO). */
void tpd_plan_layout_from_config(const tpd_config *cfg, int gpus, tpd_plan_layout *lay_p);
/* "TP=8 PP=4 DP=32 mbs=1 v=2 full SP ZeRO" into buf. */
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
/* Checks a layout against the model and world size, writing why it is invalid. */
int tpd_plan_layout_valid(const tpd_config *cfg, const tpd_plan_cluster *cl,
                          const tpd_plan_layout *lay, int gpus, char *why, size_t whylen);

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
} tpd_plan_search;

tpd_status tpd_plan_search_run(const tpd_config *cfg, const tpd_plan_cluster *cl,
                               const tpd_plan_options *opt, tpd_plan_search *search_p);
void tpd_plan_search_free(tpd_plan_search *s);

/* ---- output (plan/report.c) ---- */

void tpd_plan_print_table(FILE *f, const tpd_plan_result *r, int n);
void tpd_plan_print_breakdown(FILE *f, const tpd_plan_result *r);
void tpd_plan_print_rejections(FILE *f, const tpd_plan_search *s);
/* One JSON object per layout; returns a malloc'd string (caller frees) or NULL. */
char *tpd_plan_json(const tpd_plan_result *r, int n);
/* Predicted timeline of one step as Chrome trace JSON (plan/trace.h), one process per
 * pipeline stage. */
tpd_status tpd_plan_write_trace(const tpd_plan_result *r, const char *path);

#ifdef __cplusplus
}
#endif
#endif
