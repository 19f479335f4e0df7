/* Run configuration: YAML (libyaml) with Megatron/NeMo key names, Hydra-style
 * command-line overrides (section.key=value), defaults, and checks whose messages name
 * the file, line and column, the key, the bad value and the rule. The loader and the
 * checks log each such message once themselves (tpd_fail, base/status.h), identically on
 * every rank and before any collective; callers only pass the status on.
 *
 * Sections: model, parallel, training, optimizer, data, logging, checkpoint, comm.
 * `tripod config show FILE [overrides]` prints the resolved config (tpd_config_print). */
#ifndef TPD_ENGINE_CONFIG_H
#define TPD_ENGINE_CONFIG_H

#include <stdint.h>
#include <stdio.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TPD_CONFIG_STR 512
#define TPD_CONFIG_MAX_STAGES 256

/* The values of the enum keys, parsed once by the schema (each key's choices, in order). */
typedef enum tpd_precision { TPD_PRECISION_FP32 = 0, TPD_PRECISION_BF16 = 1 } tpd_precision;
typedef enum tpd_device { TPD_DEVICE_CPU = 0, TPD_DEVICE_CUDA = 1 } tpd_device;
typedef enum tpd_recompute {
    TPD_RECOMPUTE_NONE = 0,
    TPD_RECOMPUTE_SELECTIVE = 1, /* the attention state only (Korthikanti et al.) */
    TPD_RECOMPUTE_FULL = 2,      /* whole layers, keeping each layer's input */
} tpd_recompute;
typedef enum tpd_attention {
    TPD_ATTENTION_FUSED = 0,   /* cuDNN flash attention */
    TPD_ATTENTION_UNFUSED = 1, /* cuBLASLt + softmax */
} tpd_attention;
typedef enum tpd_lr_decay {
    TPD_LR_DECAY_COSINE = 0,
    TPD_LR_DECAY_LINEAR = 1,
    TPD_LR_DECAY_CONSTANT = 2,
    TPD_LR_DECAY_INVERSE_SQRT = 3, /* "inverse-square-root" */
    TPD_LR_DECAY_WSD = 4,
} tpd_lr_decay;
typedef enum tpd_wsd_decay {
    TPD_WSD_DECAY_EXPONENTIAL = 0,
    TPD_WSD_DECAY_LINEAR = 1,
    TPD_WSD_DECAY_COSINE = 2,
    TPD_WSD_DECAY_MINUS_SQRT = 3,
} tpd_wsd_decay;
typedef enum tpd_schedule {
    TPD_SCHEDULE_1F1B = 0,
    TPD_SCHEDULE_INTERLEAVED = 1, /* Megatron's virtual pipeline */
    TPD_SCHEDULE_ZB_H1 = 2,       /* Qi et al.'s zero-bubble H1: backward split into B and W */
} tpd_schedule;
typedef enum tpd_fallback { TPD_FALLBACK_NONE = 0, TPD_FALLBACK_PREVIOUS = 1 } tpd_fallback;
typedef enum tpd_norm { TPD_NORM_LAYERNORM = 0, TPD_NORM_RMSNORM = 1 } tpd_norm;
typedef enum tpd_pos_emb { TPD_POS_LEARNED = 0, TPD_POS_ROPE = 1 } tpd_pos_emb;
/* parallel.dp_sync: how DP replicas synchronize */
typedef enum tpd_dp_sync {
    TPD_DP_SYNC_EVERY_STEP = 0, /* every step's gradients are summed over DP */
    TPD_DP_SYNC_DILOCO = 1,     /* DiLoCo: inner steps inside a replica, an outer step over
                                   the replicas every diloco.sync_interval steps */
} tpd_dp_sync;
/* What a reduction moves on the wire; the receiver accumulates in fp32 either way. */
typedef enum tpd_reduce_dtype { TPD_REDUCE_FP32 = 0, TPD_REDUCE_BF16 = 1 } tpd_reduce_dtype;
typedef enum tpd_optimizer_type { TPD_OPTIM_ADAMW = 0, TPD_OPTIM_SGD = 1 } tpd_optimizer_type;
/* parallel.data_parallel_sharding_strategy (Megatron-Core's names): what each DP rank keeps
 * only its 1/shard-group share of. Ordered: each shards what the one before does, and more. */
/* parallel.cp_comm_type: how attention sees the whole sequence under context parallelism */
typedef enum tpd_cp_comm { TPD_CP_COMM_P2P = 0, TPD_CP_COMM_A2A = 1 } tpd_cp_comm;
typedef enum tpd_dp_sharding {
    TPD_DP_SHARDING_NO_SHARD = 0,           /* everything replicated */
    TPD_DP_SHARDING_OPTIM = 1,              /* optimizer state (ZeRO-1) */
    TPD_DP_SHARDING_OPTIM_GRADS = 2,        /* and the main gradients (ZeRO-2) */
    TPD_DP_SHARDING_OPTIM_GRADS_PARAMS = 3, /* and the parameters (ZeRO-3, FSDP) */
} tpd_dp_sharding;

typedef struct tpd_config_model {
    int num_layers;
    int hidden_size;
    int num_attention_heads;
    int ffn_hidden_size; /* 0 means 4*hidden_size (tpd_config_resolve; refused under
                            swiglu, whose width must be stated) */
    int vocab_size;
    int seq_length;
    int max_position_embeddings; /* 0 means seq_length (tpd_config_resolve) */
    double init_method_std;
    int make_vocab_size_divisible_by;
    /* Llama's block (Megatron's names); the defaults are GPT-2's */
    tpd_norm normalization;              /* LayerNorm or RMSNorm */
    double norm_epsilon;                 /* both norms */
    tpd_pos_emb position_embedding_type; /* learned_absolute (wpe) or rope */
    double rotary_base;                  /* RoPE theta base */
    double rotary_percent;               /* share of each head rotated (1.0 only) */
    int rope_scaling;                    /* Llama 3.1's "llama3" frequency scaling */
    double rope_scaling_factor, rope_scaling_low_freq_factor, rope_scaling_high_freq_factor;
    int rope_scaling_original_max_position_embeddings;
    int swiglu;                /* gated MLP: down(silu(gate(x)) * up(x)) */
    int group_query_attention; /* K/V heads shared by groups of query heads */
    int num_query_groups;      /* K/V heads: tpd_config_kv_heads */
    int kv_channels;           /* a head's size; 0 means hidden_size / num_attention_heads
                                  (tpd_config_head_dim; Qwen3's head_dim) */
    int untie_embeddings_and_output_weights; /* a separate output layer */
    int add_bias_linear;                     /* biases in the linear layers */
    int add_qkv_bias;                        /* a bias on QKV alone (Qwen2): tpd_config_qkv_bias */
    int qk_layernorm;                        /* Qwen3: RMSNorm on each Q and K head, weights
                                                (head size) shared by the heads, before RoPE */
    /* mixture of experts (Megatron-Core's names; num_moe_experts 0: dense) */
    int num_moe_experts;                     /* E routed experts per MoE layer */
    int moe_router_topk;                     /* k experts per token */
    int moe_ffn_hidden_size;                 /* expert width; 0 means ffn_hidden_size */
    int moe_shared_expert_intermediate_size; /* shared experts' width (0: none) */
    int moe_shared_expert_gate;              /* Qwen2-MoE: sigmoid(x g) scales the shared output */
    int moe_layer_freq;                      /* layer i is MoE when i % N == 0 (Megatron-Core's
                                                int form); the others are dense MLPs of
                                                ffn_hidden_size */
    int moe_router_pre_softmax;              /* softmax over all E, then top-k (HF's order);
                                                false: top-k of the logits, softmax over those
                                                k (Mixtral's weights) */
    int moe_norm_topk_prob;                  /* pre_softmax: the k probabilities renormalized
                                                to sum 1 (HF's norm_topk_prob) */
    double moe_aux_loss_coeff;               /* Switch load-balancing loss weight */
    double moe_z_loss_coeff;                 /* ST-MoE router z-loss weight */
    double moe_expert_capacity_factor;       /* > 0: an expert takes at most
                                                ceil(factor * N * k / E) tokens, the rest are
                                                dropped; 0: dropless */
    double moe_imbalance;                    /* the planner's input under expert parallelism:
                                                the busiest EP rank's tokens over the mean
                                                (>= 1; 1: even); `tripod train` ignores it */
} tpd_config_model;

typedef struct tpd_config_parallel {
    int tensor_model_parallel_size;
    int pipeline_model_parallel_size;
    int data_parallel_size;          /* 0 = derived from the world size */
    int expert_model_parallel_size;  /* EP: ranks of DP that split a layer's experts */
    int expert_tensor_parallel_size; /* experts' TP; 0 = tensor_model_parallel_size */
    int num_pipeline_layers;         /* entries in pipeline_layers; 0 = even split */
    int pipeline_layers[TPD_CONFIG_MAX_STAGES];
    int use_distributed_optimizer; /* ZeRO-1; true whenever the strategy shards anything
                                      (tpd_config_resolve) */
    tpd_dp_sharding data_parallel_sharding_strategy; /* optim is use_distributed_optimizer */
    int data_parallel_shard_size; /* HSDP: shard inside groups of this many consecutive DP
                                     ranks, replicate across them; 0 = all of DP */
    int context_parallel_size;    /* CP: ranks that split each sequence into 2 x CP chunks (rank r
                                     holds chunks r and 2 CP - 1 - r); rank order TP, CP, DP, PP;
                                     gradients are summed over DP x CP */
    tpd_cp_comm cp_comm_type;
    int fsdp_units_in_flight; /* optim_grads_params: units (one layer each) whose full
                                 parameters are gathered at once, prefetch included */
    int64_t ddp_bucket_size;  /* gradient elements per DP bucket */
    int overlap_grad_reduce;  /* DP reduction during the last backward */
    int overlap_param_gather; /* ZeRO-1 all-gather during the next forward */
    int sequence_parallel;    /* Megatron SP: needs seq_length % TP == 0 */
    int tp_comm_overlap;      /* Megatron-Core's TP communication overlap with the GEMMs: the
                                 planner models it (needs SP and TP > 1); `tripod train` refuses */
    int virtual_pipeline_model_parallel_size; /* model chunks per stage (interleaved) */
    tpd_schedule pipeline_schedule;
    tpd_dp_sync dp_sync;                /* every_step, or diloco (the diloco section) */
    tpd_reduce_dtype grad_reduce_dtype; /* every-step DP gradient reductions on the wire */
} tpd_config_parallel;

/* DiLoCo (Douillard et al. 2023) and Streaming DiLoCo (Douillard et al. 2025), read
 * under parallel.dp_sync: diloco. DP is split into `replicas` replicas of DP/replicas
 * ranks each; inside a replica every step is an ordinary DP step, across replicas only
 * the outer step communicates. */
typedef struct tpd_config_diloco {
    int sync_interval;     /* H: inner steps between two outer steps of a fragment */
    double outer_lr;       /* Nesterov outer optimizer's learning rate */
    double outer_momentum; /* and momentum */
    int replicas;          /* 0 = DP (one replica per DP rank) */
    int fragments;         /* Streaming DiLoCo: parameter fragments synced at staggered steps
                              (H/fragments apart); 1 = the whole model at once */
    int overlap_steps;     /* a fragment's outer all-reduce overlaps this many inner steps
                              before it is applied; 0 = applied at once */
    tpd_reduce_dtype reduce_dtype; /* the outer all-reduce on the wire */
} tpd_config_diloco;

typedef struct tpd_config_training {
    int micro_batch_size;
    int global_batch_size;
    int train_iters;
    uint64_t seed;
    tpd_precision precision;
    tpd_device device; /* the kernel backend */
    tpd_recompute recompute;
    int recompute_num_layers;     /* full: recompute the first N layers of each stage (Megatron's
                                     block method), 0 = all of them */
    int exit_interval;            /* stop (saving) when the iteration is a multiple; 0 = never */
    double exit_duration_in_mins; /* stop (saving) once a run has lasted this long; 0 = never */
    tpd_attention attention;      /* cuda */
    int num_threads;              /* cpu OpenMP threads per rank, 0 = runtime default */
    int max_skipped_iterations;   /* stop after this many non-finite steps in a row; 0 never */
    /* Megatron's --accumulate-allreduce-grads-in-fp32: under bf16, fp32 main gradients (the
     * weight-gradient GEMMs accumulate into fp32, the DP and embedding reductions move
     * fp32). Default true; false keeps bf16 gradients (half the gradient bytes and wire
     * bytes). A no-op under fp32, whose gradients are fp32 either way: tpd_config_grad_bytes */
    int accumulate_allreduce_grads_in_fp32;
} tpd_config_training;

typedef struct tpd_config_optimizer {
    double lr;
    double min_lr;
    tpd_lr_decay lr_decay_style; /* Megatron's names: cosine, linear, constant,
                                    inverse-square-root, WSD */
    int lr_warmup_iters;
    int lr_decay_iters;     /* 0 = train_iters (tpd_config_lr_decay_iters) */
    int lr_wsd_decay_iters; /* WSD: the final anneal's length; before it lr stays at peak */
    tpd_wsd_decay lr_wsd_decay_style; /* the WSD anneal */
    double weight_decay;
    double adam_beta1;
    double adam_beta2;
    double adam_eps;
    double clip_grad;        /* 0 disables clipping */
    tpd_optimizer_type type; /* adamw, or sgd (plain SGD: p -= lr * g, decoupled weight
                                decay on 2-D weights; no state) */
} tpd_config_optimizer;

typedef struct tpd_config_data {
    char data_path[TPD_CONFIG_STR]; /* Megatron PREFIX (PREFIX.bin + PREFIX.idx) or an
                                       llm.c token shard file */
    int shuffle;
    char split[64]; /* "949,50,1": train, valid, test weights */
} tpd_config_data;

typedef struct tpd_config_logging {
    int log_interval;
    char metrics_file[TPD_CONFIG_STR];    /* JSONL; empty = none */
    char tensorboard_dir[TPD_CONFIG_STR]; /* TensorBoard event files; empty = none */
    int eval_interval;                    /* 0 = never */
    int eval_iters;
    char trace_file[TPD_CONFIG_STR]; /* Chrome trace JSON of real steps; empty = none */
    int log_params_norm;             /* log the weights' global norm (one more collective) */
    int log_timers;                  /* a second log line: where the step's time went */
    int overwrite; /* a fresh run may replace a metrics_file that another run wrote */
} tpd_config_logging;

typedef struct tpd_config_checkpoint {
    char save[TPD_CONFIG_STR]; /* directory; empty = never save */
    char load[TPD_CONFIG_STR]; /* "", "auto" or a checkpoint path */
    int save_interval;         /* 0 = only at the end / on signal */
    int keep_last;             /* 0 = keep all */
    tpd_fallback fallback;
    int finetune;
    int overwrite;  /* a run may replace checkpoints in save that it did not load from */
    int async_save; /* write shards in a background thread from a host snapshot */
} tpd_config_checkpoint;

typedef struct tpd_config_comm {
    double timeout_s; /* collective watchdog deadline */
} tpd_config_comm;

typedef struct tpd_config {
    tpd_config_model model;
    tpd_config_parallel parallel;
    tpd_config_diloco diloco;
    tpd_config_training training;
    tpd_config_optimizer optimizer;
    tpd_config_data data;
    tpd_config_logging logging;
    tpd_config_checkpoint checkpoint;
    tpd_config_comm comm;
    char source_path[TPD_CONFIG_STR]; /* file it was loaded from ("" for defaults) */
} tpd_config;

/* Every field at its default (the defaults printed by `tripod config show`), the derived
 * ones still 0: a config built in code sets its fields, then calls tpd_config_resolve. */
void tpd_config_defaults(tpd_config *cfg);

/* Fills the fields whose 0 means "derived from others", where they are still 0 (a stated
 * value is kept): model.ffn_hidden_size (4*hidden_size) and model.max_position_embeddings
 * (seq_length); and makes the two names of ZeRO-1 agree: use_distributed_optimizer true
 * under no_shard makes the strategy optim, and any strategy but no_shard makes
 * use_distributed_optimizer true (which the ZeRO-1 code reads). The one home of those
 * rules: tpd_config_load calls it after the file and the overrides, and everything past
 * engine/config reads the fields as resolved. On failure (ffn_hidden_size left 0 under
 * swiglu, hidden_size too large for 4x, or, in a load, use_distributed_optimizer and
 * data_parallel_sharding_strategy both stated and disagreeing) returns TPD_ERR_INVALID,
 * logs one line as tpd_config_load does and leaves cfg as it was. */
tpd_status tpd_config_resolve(tpd_config *cfg);

/* Parse `path` (may be NULL: defaults only), apply overrides "section.key=value" in
 * order, resolve 0-means-derived fields (tpd_config_resolve), and check types, ranges,
 * enums, unknown keys ("did you mean ..."), and the relations that do not depend on the
 * world size (heads divisible by TP, layers by PP or pipeline_layers summing to num_layers,
 * hidden by heads, seq_length <= max_position_embeddings; for the Llama block: heads by
 * num_query_groups and num_query_groups by TP under group_query_attention, an even head size
 * under rope, rotary_percent 1.0, ffn_hidden_size stated under swiglu, ...).
 * On failure returns TPD_ERR_INVALID (TPD_ERR_IO when the file can't be read) and logs
 * one line (tpd_fail; it is then the thread's tpd_last_error), e.g.
 *   "configs/x.yaml:3:16: model.num_attention_heads: 12 must be a multiple of
 *    parallel.tensor_model_parallel_size (8)"
 * Overrides are reported as "<override>" instead of file:line:col. The load needs no
 * communication and depends on its arguments alone, so every rank of a job logs the same
 * line before any collective. A caller that only asks whether a config loads (a planner
 * probe, a sweep's trial) loads inside tpd_log_quiet_begin/end and reads the line back. */
tpd_status tpd_config_load(const char *path, int n_overrides, const char *const *overrides,
                           tpd_config *cfg);

/* The YAML at f (path, for the message) nests at most this many lists or mappings; a
 * config or a cluster profile needs a few. Deeper is TPD_ERR_INVALID, logged as
 * "PATH:LINE:COL: YAML nested deeper than 16 ...", at once: libyaml's cost per token
 * grows with the depth. f is rewound either way; a syntax error is left to the load. */
#define TPD_CONFIG_YAML_MAX_DEPTH 16
tpd_status tpd_config_yaml_depth_check(const char *path, FILE *f);

/* Checks against a world size (before any collective; deterministic, so every rank
 * reports the same line): world divisible by TP*PP, data_parallel_size agreeing with
 * the world, global batch divisible by micro_batch*DP. Megatron's wording where it has
 * one. Logged as tpd_config_load's errors are. */
tpd_status tpd_config_check_world(const tpd_config *cfg, int world_size);

/* Rejects what `tripod train` cannot run although the planner models it (bf16 on the
 * cpu backend, parallel.tp_comm_overlap, a data_parallel_shard_size other than 0 or the
 * stated data_parallel_size, the sharding strategies optim_grads and optim_grads_params
 * under DiLoCo), naming the key; logged as above. */
tpd_status tpd_config_check_trainable(const tpd_config *cfg);

/* Derived quantities. */
int tpd_config_dp(const tpd_config *cfg, int world_size);
/* DP split into replicas (parallel.dp_sync: diloco): how many (diloco.replicas, 0 meaning
 * one per DP rank; 1 under every_step), and the ranks of one replica, DP / replicas times
 * CP: the DP group a step's gradients are summed over and the ZeRO-1 state is sharded
 * over. The
 * one home of the split: mesh, buffer plan, memory model and planner read it here. */
int tpd_config_dp_replicas(const tpd_config *cfg, int dp);
int tpd_config_dp_inner(const tpd_config *cfg, int dp);
/* parallel.context_parallel_size, at least 1. The ranks that sum a step's gradients are the
 * DP group times CP (the same weights see the sequence's other chunks):
 * tpd_config_dp_inner counts them; `dp` everywhere else is the data-parallel size that
 * splits the batch. */
int tpd_config_cp(const tpd_config *cfg);
/* parallel.expert_model_parallel_size of a MoE model, at least 1 (1 for a dense model):
 * the EP consecutive DP ranks that split each layer's E experts, E / EP each; the experts
 * are replicated over the DP / EP ranks of equal EP index (the expert-data-parallel group).
 * The one home of the split: mesh, layout, buffer plan, planner read it here. */
int tpd_config_ep(const tpd_config *cfg);
/* Hybrid sharding (parallel.data_parallel_shard_size): the ranks a shard is spread over,
 * H consecutive ranks of the DP group when 0 < H < the group and H divides it, else the
 * whole group (tpd_config_dp_inner). The planner models it for every strategy; the
 * trainer shards over it under optim_grads and optim_grads_params
 * (tpd_config_dp_shard_engine: the DP group otherwise). */
int tpd_config_dp_shard(const tpd_config *cfg, int dp);
int tpd_config_dp_shard_engine(const tpd_config *cfg, int dp);
/* DiLoCo's schedule (the one home of it). Fragment f (0 .. diloco.fragments-1) starts its
 * outer step after every completed inner step t with t % H == ((f+1) * H/fragments) % H
 * (the whole model at multiples of H for one fragment): its pseudo-gradient is taken
 * then, all-reduced over the replicas, and applied after step t + diloco.overlap_steps.
 * tpd_diloco_sync_fragment: the fragment that starts after `iteration` completed steps,
 * or -1 (always -1 under every_step). tpd_diloco_pending_fragment: the fragment whose
 * all-reduce is in flight after `iteration` completed steps (started at an earlier step,
 * applied at a later one), or -1; overlap_steps < H/fragments makes it at most one; none
 * after training.train_iters steps (the run's last step applies it at once). At
 * the boundary after step t the trainer first applies the fragment due then, then starts
 * the one that syncs at t (applied at once without overlap), then saves. */
int tpd_diloco_sync_fragment(const tpd_config *cfg, int iteration);
int tpd_diloco_pending_fragment(const tpd_config *cfg, int iteration);
int tpd_config_num_micro_batches(const tpd_config *cfg, int dp);
/* Iterations the learning rate decays over: optimizer.lr_decay_iters, or
 * training.train_iters where it is 0. */
int tpd_config_lr_decay_iters(const tpd_config *cfg);
/* Key/value heads of the attention: num_query_groups under group_query_attention, else one
 * per query head (num_attention_heads). */
int tpd_config_kv_heads(const tpd_config *cfg);
/* A head's size: model.kv_channels, or hidden_size / num_attention_heads when it is 0. The
 * query heads span num_attention_heads of them (tpd_config_q_width), which need not be the
 * hidden size. */
int tpd_config_head_dim(const tpd_config *cfg);
int tpd_config_q_width(const tpd_config *cfg);
/* model.moe_ffn_hidden_size, or ffn_hidden_size when it is 0: an expert's MLP width. */
int tpd_config_moe_ffn(const tpd_config *cfg);
/* The mixture of experts: 1 when model.num_moe_experts > 0. */
int tpd_config_moe(const tpd_config *cfg);
/* 1 when global layer g is a MoE layer: a MoE model's layers g with g % moe_layer_freq == 0
 * (every layer at 1). The other layers, and every layer of a dense model, are dense. */
int tpd_config_layer_moe(const tpd_config *cfg, int g);
/* MoE layers among the global layers [0, g): tpd_config_layer_moe's count, closed form; and
 * the same for a stack whose every freq-th layer from 0 is MoE (freq 0: none). */
int tpd_config_moe_layers_before(const tpd_config *cfg, int g);
static inline int tpd_config_freq_layers_before(int freq, int g) {
    return freq > 0 && g > 0 ? (g + freq - 1) / freq : 0;
}
/* 1 when the QKV layer has a bias: add_bias_linear or add_qkv_bias. */
int tpd_config_qkv_bias(const tpd_config *cfg);
/* Bytes of one gradient element, in the gradient buffer and on the wire of the DP and
 * embedding reductions: 2 under bf16 with training.accumulate_allreduce_grads_in_fp32
 * false, else 4 (fp32 main gradients; fp32 precision has nothing else). */
int tpd_config_grad_bytes(const tpd_config *cfg);
/* Vocab padded to a multiple of make_vocab_size_divisible_by * tp. */
int tpd_config_padded_vocab(const tpd_config *cfg, int tp);
/* Layers of stage `stage` of a pipeline of pp stages with v model chunks each (v virtual
 * stages per stage), and the first global layer of them (first_layer_p may be NULL). Chunk
 * c of stage s is virtual stage c*pp + s of the pp*v (Megatron's assignment). The split over
 * the pp*v virtual stages is the config's parallel.pipeline_layers when it lists that many
 * (in that order), else an even one, else (layers not divisible) a balanced uneven one
 * that `tripod plan` prints as parallel.pipeline_layers. `chunk` is one chunk (0..v-1), or
 * TPD_CONFIG_ALL_CHUNKS for all v chunks of the stage (the first layer then is chunk 0's).
 * -1 when there is no such stage or chunk, or pp*v exceeds the layers. */
#define TPD_CONFIG_ALL_CHUNKS (-1)
int tpd_config_stage_layers(const tpd_config *cfg, int pp, int v, int stage, int chunk,
                            int *first_layer_p);
/* The schedule a run uses: interleaved whenever there are virtual stages (as in Megatron),
 * else parallel.pipeline_schedule. */
tpd_schedule tpd_config_schedule(const tpd_config *cfg);

/* The parallel layout and batch of a run: the fields that change when the same model runs
 * on other ranks. TPD_CONFIG_LAYOUT_INIT is one rank (no model or data parallelism, no
 * sharding, no recompute) at the config's own batch. */
typedef struct tpd_config_layout {
    int tp, pp, dp;            /* parallel sizes; dp 0 = derived from the world size */
    int vpp;                   /* model chunks per stage (virtual stages) */
    int distributed_optimizer; /* ZeRO-1; 0 turns every sharding off */
    int sequence_parallel;
    tpd_recompute recompute;
    int recompute_num_layers;
    int micro_batch_size, global_batch_size; /* 0 = the config's */
    tpd_dp_sharding sharding;                /* at least optim under distributed_optimizer */
    int shard_size;                          /* HSDP's shard group; 0 = all of DP */
    int cp;                                  /* context parallel size */
    int ep; /* expert parallel size (MoE); 0 or 1 = none, and 1 wherever it does not divide DP */
} tpd_config_layout;

/* Positional, so that C++ (the tests) reads it too: tp, pp, dp, vpp, ZeRO-1, SP, recompute,
 * its layers, the batch, the sharding strategy and shard size, CP, EP. */
#define TPD_CONFIG_LAYOUT_INIT                                                                     \
    { 1, 1, 1, 1, 0, 0, TPD_RECOMPUTE_NONE, 0, 0, 0, TPD_DP_SHARDING_NO_SHARD, 0, 1, 1 }

/* The layout `cfg` runs at. */
void tpd_config_layout_get(const tpd_config *cfg, tpd_config_layout *lay_p);

/* `src` at layout `to`: every field of `to` set, and the fields that depend on the layout
 * made to agree with it: parallel.pipeline_layers kept only while PP and the virtual stages
 * stay (else the even split), virtual stages only with PP > 1, pipeline_schedule 1f1b where
 * the pipeline or the interleaving is gone, sequence_parallel (and tp_comm_overlap with it)
 * only with TP > 1, recompute_num_layers only under full recompute, the sharding strategy
 * no_shard without distributed_optimizer (else at least optim) and the shard size only
 * where it divides DP. The model and every other field are src's; out_p may be src. */
void tpd_config_relayout(const tpd_config *src, const tpd_config_layout *to, tpd_config *out_p);

/* data.data_path: one prefix (a Megatron PREFIX or an llm.c shard file, spaces allowed;
 * engine/data expands * ? [ to every match), or Megatron's weighted blend
 * "W1 PREFIX1 W2 PREFIX2 ...". */
#define TPD_DATA_PATH_MAX 256
typedef struct tpd_data_path {
    int n;
    double weight[TPD_DATA_PATH_MAX]; /* normalized: they sum to 1 */
    char *prefix[TPD_DATA_PATH_MAX];  /* malloc'd */
} tpd_data_path;

/* Parses the spec (no file is opened): 1 with *out_p filled (may be NULL), or 0 with the
 * rule it breaks in why. */
int tpd_config_data_path_parse(const char *spec, tpd_data_path *out_p, char *why, size_t len);
void tpd_config_data_path_free(tpd_data_path *p);

/* The name of an enum key's value as the config file writes it, e.g.
 * tpd_config_choice("training.precision", TPD_PRECISION_BF16) is "bf16"; "?" when the key
 * or the value is unknown. */
const char *tpd_config_choice(const char *key, int value);
/* The inverse: the value of choice `name` of an enum key; -1 when there is none. */
int tpd_config_choice_value(const char *key, const char *name);

/* Resolved config as YAML. */
void tpd_config_print(const tpd_config *cfg, FILE *f);

#ifdef __cplusplus
}
#endif
#endif
