/* Run configuration: YAML (libyaml) with Megatron/NeMo key names, Hydra-style
 * command-line overrides (section.key=value), defaults, and checks whose messages name
 * the file, line and column, the key, the bad value and the rule.
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

typedef struct tpd_config_model {
    int num_layers;
    int hidden_size;
    int num_attention_heads;
    int ffn_hidden_size;          /* 0 in the file means 4*hidden_size (resolved at load) */
    int vocab_size;
    int seq_length;
    int max_position_embeddings;  /* 0 means seq_length (resolved at load) */
    double init_method_std;
    int make_vocab_size_divisible_by;
} tpd_config_model;

typedef struct tpd_config_parallel {
    int tensor_model_parallel_size;
    int pipeline_model_parallel_size;
    int data_parallel_size;       /* 0 = derived from the world size */
    int num_pipeline_layers;      /* entries in pipeline_layers; 0 = even split */
    int pipeline_layers[TPD_CONFIG_MAX_STAGES];
    int use_distributed_optimizer;      /* ZeRO-1 */
    int64_t ddp_bucket_size;            /* gradient elements per DP bucket */
    int sequence_parallel;              /* Megatron SP: needs seq_length % TP == 0 */
    int virtual_pipeline_model_parallel_size; /* planner knob; engine needs 1 */
    char pipeline_schedule[32];         /* "1f1b" | "interleaved" */
} tpd_config_parallel;

typedef struct tpd_config_training {
    int micro_batch_size;
    int global_batch_size;
    int train_iters;
    uint64_t seed;
    char precision[16]; /* "fp32" | "bf16" */
    char device[16];    /* "cpu" | "cuda" */
    char recompute[16]; /* "none" | "selective" | "full" */
    int recompute_num_layers; /* full: recompute the first N layers of each stage (Megatron's
                                 block method), 0 = all of them */
    int exit_interval;          /* stop (saving) when the iteration is a multiple; 0 = never */
    double exit_duration_in_mins; /* stop (saving) once a run has lasted this long; 0 = never */
    char attention[16]; /* "fused" (cuDNN flash) | "unfused" (cuBLASLt + softmax) */
    int num_threads;    /* cpu OpenMP threads per rank, 0 = runtime default */
} tpd_config_training;

typedef struct tpd_config_optimizer {
    double lr;
    double min_lr;
    char lr_decay_style[24]; /* "cosine" | "linear" | "constant" | "inverse-square-root" |
                                "WSD" (Megatron's names) */
    int lr_warmup_iters;
    int lr_decay_iters;      /* 0 = train_iters */
    int lr_wsd_decay_iters;  /* WSD: the final anneal's length; before it lr stays at peak */
    char lr_wsd_decay_style[16]; /* WSD anneal: "exponential" | "linear" | "cosine" |
                                    "minus_sqrt" */
    double weight_decay;
    double adam_beta1;
    double adam_beta2;
    double adam_eps;
    double clip_grad;        /* 0 disables clipping */
} tpd_config_optimizer;

typedef struct tpd_config_data {
    char data_path[TPD_CONFIG_STR]; /* Megatron PREFIX (PREFIX.bin + PREFIX.idx) or an
                                       llm.c token shard file */
    int shuffle;
    char split[64];                 /* "949,50,1": train, valid, test weights */
} tpd_config_data;

typedef struct tpd_config_logging {
    int log_interval;
    char metrics_file[TPD_CONFIG_STR]; /* JSONL; empty = none */
    int eval_interval;                 /* 0 = never */
    int eval_iters;
    char trace_file[TPD_CONFIG_STR];   /* Chrome trace JSON of real steps; empty = none */
    int log_params_norm;               /* log the weights' global norm (one more collective) */
    int log_timers;                    /* a second log line: where the step's time went */
} tpd_config_logging;

typedef struct tpd_config_checkpoint {
    char save[TPD_CONFIG_STR];   /* directory; empty = never save */
    char load[TPD_CONFIG_STR];   /* "", "auto" or a checkpoint path */
    int save_interval;           /* 0 = only at the end / on signal */
    int keep_last;               /* 0 = keep all */
    char fallback[16];           /* "none" | "previous" */
    int finetune;
    int async_save;              /* write shards in a background thread from a host snapshot */
} tpd_config_checkpoint;

typedef struct tpd_config_comm {
    double timeout_s; /* collective watchdog deadline */
} tpd_config_comm;

typedef struct tpd_config {
    tpd_config_model model;
    tpd_config_parallel parallel;
    tpd_config_training training;
    tpd_config_optimizer optimizer;
    tpd_config_data data;
    tpd_config_logging logging;
    tpd_config_checkpoint checkpoint;
    tpd_config_comm comm;
    char source_path[TPD_CONFIG_STR]; /* file it was loaded from ("" for defaults) */
} tpd_config;

/* Every field at its default (the defaults printed by `tripod config show`). */
void tpd_config_defaults(tpd_config *cfg);

/* Parse `path` (may be NULL: defaults only), apply overrides "section.key=value" in
 * order, resolve 0-means-derived fields, and check types, ranges, enums, unknown keys
 * ("did you mean ..."), and the relations that do not depend on the world size (heads
 * divisible by TP, layers by PP or pipeline_layers summing to num_layers, hidden by heads,
 * seq_length <= max_position_embeddings, ...).
 * On failure returns TPD_ERR_INVALID (TPD_ERR_IO when the file can't be read) and writes
 * one line to err, e.g.
 *   "configs/x.yaml:3:16: model.num_attention_heads: 12 must be a multiple of
 *    parallel.tensor_model_parallel_size (8)"
 * Overrides are reported as "<override>" instead of file:line:col. Nothing is logged. */
tpd_status tpd_config_load(const char *path, int n_overrides, const char *const *overrides,
                           tpd_config *cfg, char *err, size_t errlen);

/* Checks against a world size (before any collective; deterministic, so every rank
 * reports the same line): world divisible by TP*PP, data_parallel_size agreeing with
 * the world, global batch divisible by micro_batch*DP. Megatron's wording where it has
 * one. */
tpd_status tpd_config_check_world(const tpd_config *cfg, int world_size, char *err,
                                  size_t errlen);

/* Rejects what `tripod train` cannot run although the planner models it (virtual
 * stages, the interleaved schedule, bf16 on cpu), naming the key. */
tpd_status tpd_config_check_trainable(const tpd_config *cfg, char *err, size_t errlen);

/* Derived quantities. */
int tpd_config_dp(const tpd_config *cfg, int world_size);
int tpd_config_num_micro_batches(const tpd_config *cfg, int dp);
/* Vocab padded to a multiple of make_vocab_size_divisible_by * tp. */
int tpd_config_padded_vocab(const tpd_config *cfg, int tp);
/* Layers of pipeline stage `stage` and the first global layer index of it. */
int tpd_config_stage_layers(const tpd_config *cfg, int stage, int *first_layer_p);

/* Resolved config as YAML. */
void tpd_config_print(const tpd_config *cfg, FILE *f);

#ifdef __cplusplus
}
#endif
#endif
