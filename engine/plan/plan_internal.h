/* The planner's functions that only its own files (and their tests) call; not part of its
 * public API (plan.h). */
#ifndef TPD_ENGINE_PLAN_PLAN_INTERNAL_H
#define TPD_ENGINE_PLAN_PLAN_INTERNAL_H

#include "engine/plan/plan.h"

/* ---- cluster profiles (plan/cluster.c) ---- */

/* GEMM efficiency for a GEMM of `flops` FLOPs. */
double tpd_plan_gemm_efficiency(const tpd_plan_cluster *c, double flops);
/* Attention kernel efficiency (cpu model) for a call of `flops` forward FLOPs. */
double tpd_plan_attention_efficiency(const tpd_plan_cluster *c, double flops);

/* ---- layouts (plan/evaluate.c) ---- */

/* CP of a layout (parallel.context_parallel_size): lay->cp, 1 where it is 0. */
int tpd_plan_cp(const tpd_plan_layout *lay);
/* EP of a layout (parallel.expert_model_parallel_size): lay->ep, 1 where it is 0. */
int tpd_plan_ep(const tpd_plan_layout *lay);
/* model.moe_imbalance under EP > 1 (the busiest EP rank's received tokens over the mean:
 * it sets the pace of the expert GEMMs and of the all-to-alls' receiving side); 1 at EP 1,
 * where every rank runs all of its own tokens' experts. */
double tpd_plan_moe_imbalance(const tpd_config *cfg, const tpd_plan_layout *lay);
/* Ranks of the layout: TP x CP x DP x PP. */
long tpd_plan_world(const tpd_plan_layout *lay);
/* Tokens of each sequence one rank runs: seq_length / CP. */
int tpd_plan_local_seq(const tpd_config *cfg, const tpd_plan_layout *lay);
/* The ranks that sum each step's gradients and shard the optimizer state: the layout's DP
 * (a DiLoCo replica's, tpd_config_dp_replicas) times its CP, as tpd_config_dp_inner gives
 * it for a config at this layout; the planner's search varies CP, so it reads it here. */
int tpd_plan_dp_inner(const tpd_config *cfg, const tpd_plan_layout *lay);

/* The schedule the layout runs: interleaved when virtual_stages > 1, else its schedule. */
tpd_schedule tpd_plan_layout_schedule(const tpd_plan_layout *lay);
/* The action-list kind of that schedule (parallel/pipeline/schedule.h). */
tpd_pp_kind tpd_plan_layout_pp_kind(const tpd_plan_layout *lay);
/* Checks a layout against the model and world size, writing why it is invalid: what
 * tpd_config_load and tpd_config_check_world would reject for the layout's config. */
int tpd_plan_layout_valid(const tpd_config *cfg, const tpd_plan_cluster *cl,
                          const tpd_plan_layout *lay, int gpus, char *why, size_t whylen);
/* The command-line overrides that make `tripod train CONFIG` run res: every parallel.* key
 * of the layout (sizes, schedule, virtual stages, pipeline_layers, SP, ZeRO, overlap) and
 * training.micro_batch_size, recompute, recompute_num_layers; space-separated key=value.
 * Returns the number of overrides written, or -1 when buf is too small. */
int tpd_plan_overrides(const tpd_config *cfg, const tpd_plan_result *res, char *buf, size_t len);

/* ---- model arithmetic and memory (plan/memory.c) ---- */

/* SC21 Eq. 2: 12*l*h^2*(1 + 13/(12h) + (V+s)/(12*l*h)). */
double tpd_plan_params_eq2(double l, double h, double V, double s);
/* Bytes per gradient element that the DP gradient reduction and the tied-embedding
 * all-reduce move on a GPU cluster (and AdamW reads): those of the gradient buffer
 * (tpd_config_grad_bytes), 4 with fp32 main gradients, 2 under bf16 with
 * training.accumulate_allreduce_grads_in_fp32 false. */
double tpd_plan_grad_wire_bytes(const tpd_config *cfg);
/* Bytes per gradient element on the wire of the every-step DP reduction: those of the
 * gradient buffer, at most 2 under parallel.grad_reduce_dtype: bf16 (bf16 on the wire, the
 * sum accumulated in fp32). */
double tpd_plan_dp_wire_bytes(const tpd_config *cfg);
/* Bytes per element of DiLoCo's outer all-reduce of the fp32 pseudo-gradient: 4, 2 under
 * diloco.reduce_dtype: bf16. */
double tpd_plan_outer_wire_bytes(const tpd_config *cfg);
/* Hardware FLOPs per iteration for `batch` sequences: the model FLOPs
 * (engine/model/model_flops.h) plus what the recompute mode recomputes. */
double tpd_plan_hw_flops(const tpd_config *cfg, double batch, double vocab, tpd_recompute r);
/* Korthikanti et al. Table 2 activation bytes per transformer layer per micro-batch on
 * one rank (16-bit activations, 1-byte dropout masks). `flash` drops the 5as/h term. */
double tpd_plan_activation_bytes_per_layer(double s, double b, double h, double a, int tp, int sp,
                                           tpd_recompute r, int flash);
/* The same for the config's block, term by term (plan/memory.c derives each term): GPT-2's
 * block gives the Table 2 figure above at f = 4h; the Llama block keeps its K/V heads
 * (4sb*h_kv, h_kv = g*h/a), SwiGLU's gate, up and product (6sbf), and no dropout masks:
 * sbh(8 + (4 + 4g/a)/t) + 6sbf/t + 2as^2b/t, all over t with SP. */
double tpd_plan_layer_activation_bytes(const tpd_config *cfg, double b, int tp, int sp,
                                       tpd_recompute r, int flash);
/* The same on one of `cp` CP ranks: its seq/CP tokens of every term, its seq/CP queries
 * against all seq keys in the s^2 terms: 1/CP of the layer's bytes at CP 1. */
double tpd_plan_layer_activation_bytes_cp(const tpd_config *cfg, double b, int tp, int sp,
                                          tpd_recompute r, int flash, int cp);
/* (Micro-batch, chunk) pairs whose activations a stage holds at the peak of its action list
 * (tpd_pp_schedule_peak_in_flight, in closed form): 1F1B min(p - stage, M); interleaved
 * min(2(p-stage-1) + (v-1)p + 1, M*v) chunks; ZB-H1 min(p, M) on every stage (a micro-batch
 * is held until its W). */
int tpd_plan_in_flight(int pp, int stage, int micro_batches, int v, tpd_schedule schedule);
/* (Micro-batch, chunk) pairs between their B and their W at the peak of `stage`'s action
 * list under the layout's schedule (the list the executor walks, tpd_pp_schedule_make), into
 * *peak_p; 0 for a schedule without the split backward (only ZB-H1 has one). The sharded
 * strategies keep a layer's gradient slot open from B to W, so this sizes their slot pool
 * as tpd_buffer_plan_init does. */
tpd_status tpd_plan_wgrad_pending(const tpd_plan_layout *lay, int stage, int micro_batches,
                                  int *peak_p);
/* Layers of `stage` whose full recompute runs: all under recompute full, or the first
 * training.recompute_num_layers of each model chunk; 0 otherwise. */
int tpd_plan_recomputed_layers(const tpd_config *cfg, const tpd_plan_layout *lay, int stage);
/* Hardware FLOPs of an iteration with the layout's recompute (the block method recomputes
 * only its share of the layers; selective recompute under the CP ring recomputes nothing,
 * its attention state being kept). */
double tpd_plan_layout_hw_flops(const tpd_config *cfg, const tpd_plan_layout *lay, double batch,
                                double vocab);
/* The shapes one rank of `stage` runs its ops at under the layout (what the engine's
 * tpd_model_kern_shapes gives for the same config), and the scratch the kernel backend
 * `name` ("cpu", "cuda") plans for them (tpd_kern_scratch_plan): part of the workspace. */
void tpd_plan_kern_shapes(const tpd_config *cfg, const tpd_plan_layout *lay, int stage,
                          tpd_kern_shapes *s);
tpd_status tpd_plan_scratch(const tpd_config *cfg, const tpd_plan_layout *lay, int stage,
                            const char *name, tpd_kern_scratch *out);

/* ---- the split of the layers (plan/balance.c) ---- */

/* Memory of res->layout under the split the planner would run (see balance_stages): sets
 * *cfg_p to the config to time it with, cfg or *scratch holding the balanced
 * parallel.pipeline_layers. Fails as tpd_plan_memory does. */
tpd_status tpd_plan_memory_split(const tpd_config *cfg, const tpd_plan_cluster *cl,
                                 const tpd_plan_options *opt, tpd_plan_result *res,
                                 tpd_config *scratch, const tpd_config **cfg_p);
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

/* ---- time (plan/timing.c; the simulated pipeline, plan/step.c) ---- */

/* Per-micro-batch forward and backward time of stage `stage`, seconds, including TP
 * collectives and recomputation; tp_comm_p gets the collective share of fwd+bwd. */
void tpd_plan_stage_time(const tpd_config *cfg, const tpd_plan_cluster *cl,
                         const tpd_plan_layout *lay, int stage, double *fwd_p, double *bwd_p,
                         double *tp_comm_p);
/* Per-micro-batch W share of stage `stage`'s backward (the four linear layers' weight and
 * bias gradients that tpd_model_weight_grad computes under zb-h1), seconds; part of bwd. */
double tpd_plan_stage_wgrad_time(const tpd_config *cfg, const tpd_plan_cluster *cl,
                                 const tpd_plan_layout *lay, int stage);
/* The simulated pipeline of one step: every stage's action list under the layout's schedule
 * (the lists the executor walks) run by tpd_pp_simulate with times[s] for stage s. */
typedef struct tpd_plan_pipe {
    int stages;
    double makespan;                    /* s */
    double end[TPD_CONFIG_MAX_STAGES];  /* stage s's last action done and its sends arrived */
    double busy[TPD_CONFIG_MAX_STAGES]; /* FWD + BWD + WGRAD of stage s */
    double idle_fraction;               /* 1 - sum(busy) / sum(end) */
    tpd_pp_schedule *sched;             /* [stages], owned */
    double **t0, **t1;                  /* [stages][sched[s].count] start and end, owned */
} tpd_plan_pipe;
tpd_status tpd_plan_pipe_simulate(const tpd_plan_layout *lay, int micro_batches,
                                  const tpd_pp_sim_times *times, tpd_plan_pipe *pipe_p);
void tpd_plan_pipe_free(tpd_plan_pipe *p);
/* Lower bound of the step time (the slowest stage's compute, optimizer, and the DP
 * communication no overlap can hide), s; 0 on the cpu backend (its ranks share cores, so
 * compute alone is no bound). */
double tpd_plan_time_lower_bound(const tpd_config *cfg, const tpd_plan_cluster *cl,
                                 const tpd_plan_result *res, const tpd_plan_options *opt);
/* Full time model; `split_bubble` runs a second simulation to separate the bubble from
 * the p2p share (reports), otherwise all pipeline overhead is put under pp_bubble. */
tpd_status tpd_plan_time_evaluate(const tpd_config *cfg, const tpd_plan_cluster *cl,
                                  const tpd_plan_options *opt, int split_bubble,
                                  tpd_plan_result *res);

/* ---- output (plan/report.c) ---- */

/* The comment lines of the config's file that start with "# published:" (a preset's
 * published training setups and throughput, with their source), without the "# ". Nothing
 * when there are none or the file cannot be read. */
void tpd_plan_print_published(FILE *f, const tpd_config *cfg);

/* ---- shared by the models ---- */

/* Per-layer parameters on one TP rank of the config's block (GPT-2's or Llama's: K/V
 * projections of the K/V heads, two or three MLP matrices, biases or none, LayerNorm or
 * RMSNorm). */
double tpd_plan_layer_params(const tpd_config *cfg, int tp);
/* The same on one rank of an EP group of `ep`: E / EP experts' tensors (expfcw, expfcb,
 * expprojw, expprojb) instead of E, everything else (the router, attention, norms, shared
 * experts) whole; tpd_plan_layer_params at ep 1. */
/* The MLP activations' width: ffn_hidden_size where the model has dense layers, the shared
 * experts' width where it has them, the larger (the engine's dims Fml). */
int tpd_plan_mlp_act_width(const tpd_config *cfg);
/* MoE layers among the layers [i0, i1) of `stage`'s model chunk `chunk` (its first global
 * layer and model.moe_layer_freq say which), and among all of the stage's layers. */
int tpd_plan_chunk_moe_layers(const tpd_config *cfg, const tpd_plan_layout *lay, int stage,
                              int chunk, int i0, int i1);
int tpd_plan_stage_moe_layers(const tpd_config *cfg, const tpd_plan_layout *lay, int stage);
/* One layer's parameters on a TP rank (EP rank) of a MoE layer (moe 1: router, experts,
 * shared experts) or a dense one (moe 0: the MLP of ffn_hidden_size). */
double tpd_plan_layer_kind_params(const tpd_config *cfg, int tp, int ep, int moe);
double tpd_plan_layer_params_ep(const tpd_config *cfg, int tp, int ep);
/* Of those, the local experts' tensors: the parameters whose gradients are summed over
 * expert-DP rather than all of DP x CP (0 for a dense model). */
double tpd_plan_layer_expert_params(const tpd_config *cfg, int tp, int ep);
/* The width a token's MLP GEMMs run at: ffn_hidden_size, or under a mixture of experts its
 * k experts' and the shared experts' widths together (the grouped expert GEMMs priced as
 * one of that width: each expert's block of k/E of the tokens, evenly loaded). */
double tpd_plan_mlp_width(const tpd_config *cfg);
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
    double cp_comm;              /* CP communication inside fwd + bwd (exposed) */
    double cp_comm_hidden;       /* CP transfers the ring's attention blocks hid */
    double ep_comm;              /* EP all-to-alls inside fwd + bwd (exposed, all of them) */
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
/* A backend's cost of a stage whose layers are all of one kind, and the mix of a stage that
 * holds both (a MoE model's dense layers, model.moe_layer_freq > 1): fn's cost with every
 * layer dense (the model without its experts) and with every layer MoE, weighed by the
 * stage's layers of each kind. Every field is a sum of per-layer terms and of the ends'
 * (the same under both), so the mix is exact but for full recompute of some of a chunk's
 * layers, which it prices at the stage's mix of kinds. */
typedef void (*tpd_plan_stage_cost_fn)(const tpd_config *cfg, const tpd_plan_cluster *cl,
                                       const tpd_plan_layout *lay, int stage,
                                       tpd_plan_stage_cost *out);
void tpd_plan_stage_cost_kinds(const tpd_config *cfg, const tpd_plan_cluster *cl,
                               const tpd_plan_layout *lay, int stage, tpd_plan_stage_cost_fn fn,
                               tpd_plan_stage_cost *out);

/* A collective's time, affine in the bytes it moves: per_byte * bytes + fixed, s. */
typedef struct tpd_plan_affine {
    double per_byte, fixed;
} tpd_plan_affine;

/* The DP communication of a step, as a backend's model prices it. */
typedef struct tpd_plan_dp_cost {
    tpd_plan_affine reduce;    /* one bucket's DP sum: all-reduce, or ZeRO reduce-scatter */
    tpd_plan_affine reduce_ep; /* under EP > 1, the expert gradients' all-reduce over
                                  expert-DP (DP x CP / EP ranks); a bucket's expert elements go
                                  there, the rest over `reduce` (unused at EP 1) */
    tpd_plan_affine gather;    /* one bucket's ZeRO all-gather of the parameters (0 without) */
    double grad_bytes;         /* bytes per gradient element the reduction moves */
    double param_bytes;        /* bytes per parameter element the gather moves */
    double emb_allreduce;      /* tied-embedding all-reduce between first and last stage, s
                                  (0 without an embedding group: untied, or pp == 1) */
} tpd_plan_dp_cost;

/* Elements of every hook unit of a stage's flat buffer (engine/model/model_layout.h), in
 * buffer order: the embedding (wte, wpe on the first stage; the last stage's tied wte),
 * each local layer (chunk 0's first), the final norm and an untied output layer (which the
 * engine lays out after it, as Megatron's output_layer comes last); padded to a multiple of
 * DP, the padding with the last unit. n = Ls + 2 units; unit index u + 1 for hook unit u. */
typedef struct tpd_plan_units {
    int n, Ls;
    double *elems;  /* [n] */
    double *expert; /* [n]: of elems, the local experts' (0 at EP 1: every gradient over DP) */
    double padded;  /* total, a multiple of DP */
    double bucket;  /* elements per DP bucket (parallel.ddp_bucket_size, as tpd_dp_plan_init) */
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

/* Megatron-Core's TP communication overlap of one collective of `comm` s with its GEMM of
 * `gemm` s, both split in `tp` ring-exchange chunks: hidden = min(tp_overlap_share * comm,
 * max(0, gemm - tp * tp_overlap_chunk_us)), exposed = comm - hidden (never below 0). */
void tpd_plan_tp_overlap(const tpd_plan_cluster *c, double gemm, double comm, int tp,
                         double *exposed_p, double *hidden_p);
/* Expected maximum of n independent standard normal draws, Blom's approximation
 * Phi^-1((n - 0.375) / (n + 0.25)): 0 for n = 1, 0.59 for 2, 3.61 for 4096. */
double tpd_plan_expected_max_normal(int n);
/* Of a group of n ranks `stride` apart in Megatron's rank order (TP 1, CP TP, DP x CP TP, a
 * pipeline boundary's pair TP*CP*DP). */
tpd_plan_hop tpd_plan_group_hop(const tpd_plan_cluster *c, int n, long stride);
/* 1 when `span` consecutive ranks cross an island boundary (island_nodes). */
int tpd_plan_crosses_islands(const tpd_plan_cluster *cl, long span);
/* The pipeline's sends between neighbouring stages `stride` ranks apart (TP x the DP a
 * replica holds: tpd_plan_pp_stride): a pair's link, each TP rank on its share of the
 * NICs, except that a pipeline of pp stages spanning islands is as slow as its hop between
 * them, the inter-island link. */
void tpd_plan_pipe_link(const tpd_plan_cluster *cl, int pp, long stride, double *bw_p,
                        double *lat_p, tpd_plan_hop *hop_p);
/* Ranks between neighbouring stages: TP x CP x DP, or under DiLoCo TP x a replica's DP (the
 * replicas are the outermost coordinate of the rank order, parallel/mesh.h). */
long tpd_plan_pp_stride(const tpd_config *cfg, const tpd_plan_layout *lay);
/* The CP group's link: CP ranks TP apart in the rank order (TP fastest, then CP), so the
 * group spans TP x CP consecutive ranks: one NVLink domain when that is at most its GPUs,
 * else each GPU's share of the NICs (a ring step or an all-to-all sends from every rank at
 * once, each over its own share), and the inter-island link where the span crosses one.
 * Bandwidth with the collective efficiency, latency per step, and the hop. */
void tpd_plan_cp_link(const tpd_plan_cluster *cl, int cp, long tp, double *bw_p, double *lat_p,
                      tpd_plan_hop *hop_p);
/* The EP group's link: EP ranks TP x CP apart (rank order TP, CP, EP, expert-DP, PP), so
 * the group spans TP x CP x EP consecutive ranks: NVLink when that fits one domain, else each
 * GPU's share of the NICs (every rank of the group sends at once), as tpd_plan_cp_link. */
void tpd_plan_ep_link(const tpd_plan_cluster *cl, int ep, long stride, double *bw_p, double *lat_p,
                      tpd_plan_hop *hop_p);
/* "nvlink", "network", "cross-leaf", "inter-island", "none". */
const char *tpd_plan_hop_name(tpd_plan_hop h);
/* Link of a group of n ranks `stride` apart in Megatron's rank order (TP 1, DP x CP TP, a
 * pipeline boundary TP*CP*DP): the slowest hop it crosses, bandwidth (collective efficiency
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
/* DiLoCo's outer synchronization of res->layout (parallel.dp_sync: diloco; zeros and
 * res->diloco = 0 otherwise): per fragment (1/F of this rank's fp32 shard, the ZeRO-1 shard
 * over dp_inner or the whole stage) a ring all-reduce over the R replicas, dp_inner*TP
 * ranks apart, in diloco.reduce_dtype; each runs beside overlap_steps steps of `compute`
 * (s per step) and F of them every H steps: time.dp_outer = F max(0, t_frag - tau compute)
 * / H; time.outer_update = the outer step's memory-bound passes over the shard / H. */
void tpd_plan_diloco_outer(const tpd_config *cfg, const tpd_plan_cluster *cl, double compute,
                           tpd_plan_result *res);
/* The CP fields of res (cp_bytes_layer; on a GPU cluster cp_step_comm_s, cp_step_attn_s):
 * zeros at CP 1. */
void tpd_plan_cp_detail(const tpd_config *cfg, const tpd_plan_cluster *cl,
                        const tpd_plan_layout *lay, tpd_plan_result *res);
/* The EP fields of res (ep_local_experts, ep_expert_dp, moe_imbalance, ep_a2a_bytes; on a GPU
 * cluster ep_a2a_s and ep_counts_s), hop_ep and hop_edp: zeros at EP 1. */
void tpd_plan_ep_detail(const tpd_config *cfg, const tpd_plan_cluster *cl,
                        const tpd_plan_layout *lay, tpd_plan_result *res);
/* Throughput fields of res from its step time. */
void tpd_plan_rates(const tpd_config *cfg, const tpd_plan_cluster *cl, tpd_plan_result *res);

/* ---- sharded data parallelism (plan/shard.c) ---- */

/* The strategy a layout runs: its sharding, and at least optim under distributed_optimizer
 * (ZeRO-1 by its older name). */
tpd_dp_sharding tpd_plan_sharding(const tpd_plan_layout *lay);
/* Ranks a shard is over: the layout's shard_size, or every rank that sums each step's
 * gradients (all of DP, a DiLoCo replica's). */
int tpd_plan_shard_group(const tpd_config *cfg, const tpd_plan_layout *lay);
/* The GPU model's bytes of a rank under hybrid sharding, which `tripod train` does not run
 * (a shard group short of DP; `out` holds the engine's bytes of the layout at ZeRO-1 over all
 * of DP as tpd_plan_cpu_memory gives them, `full` the same with nothing sharded): the
 * optimizer state over the shard group from optim on, the main gradients from optim_grads
 * (plus two buckets' staging), the parameters from optim_grads_params (plus
 * fsdp_units_in_flight gathered units and two units' gradients). Any strategy over all of DP
 * leaves `out` as it is: those bytes are the engine's own (tpd_plan_cpu_memory). */
tpd_status tpd_plan_shard_memory(const tpd_config *cfg, const tpd_plan_layout *lay, int stage,
                                 const tpd_plan_stage_mem *full, tpd_plan_stage_mem *out);
/* The time terms of sharding beyond ZeRO-1 and of HSDP: per stage the exposed time that
 * optim_grads_params adds to one micro-batch's forward (`fwd_p`) and backward (`bwd_p`)
 * from its pass simulation (NULL: not wanted), and into res->time dp_shard_exposed's
 * step-level part (optim_grads' earlier micro-batches, the last reduce-scatter's tail) and
 * dp_replica_allreduce, res->hop_replica and res->shard_group. `cost` is clean. */
tpd_status tpd_plan_shard_time(const tpd_config *cfg, const tpd_plan_cluster *cl,
                               const tpd_plan_layout *lay, const tpd_plan_stage_cost *cost,
                               double *fwd_p, double *bwd_p, tpd_plan_result *res);
/* The shard group's collectives, priced as tpd_plan_gpu_dp_cost's (ring, on the group's link
 * TP ranks apart): reduce-scatter and all-gather per byte. */
tpd_plan_affine tpd_plan_shard_ring(const tpd_plan_cluster *cl, int n, long stride);

#endif
