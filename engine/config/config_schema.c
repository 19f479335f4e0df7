/* The key table of the run configuration, and what is per type rather than per key:
 * parsing a scalar, the rule a message quotes, suggestions for unknown names, and the
 * YAML printer of `tripod config show`. */
#include "engine/config/config_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

const tpd_cfg_section tpd_cfg_sections[] = {
    {"model", "the network"},
    {"parallel", "TP, PP and DP layout"},
    {"diloco", "DiLoCo: infrequent synchronization of DP replicas (parallel.dp_sync: diloco)"},
    {"training", "batch, length of the run, numerics"},
    {"optimizer", "AdamW and the learning-rate schedule"},
    {"data", "token data set"},
    {"logging", "log lines, metrics, evaluation, traces"},
    {"checkpoint", "saving and resuming"},
    {"comm", "collectives"},
};

#define TPD_CFG_FIELD(f) offsetof(tpd_config, f), sizeof(((tpd_config *)0)->f)
#define TPD_CFG_NOBOUND TPD_CFG_ANY, 0, 0
#define TPD_CFG_MIN(v) TPD_CFG_GE, (v), 0
/* Every integer key has an upper bound: far above any real run, low enough that the
 * products the trainer and the planner form from them (padded vocab = V rounded up to
 * make_vocab_size_divisible_by * TP, tokens per micro-batch, samples per run) stay
 * well inside their types. */
#define TPD_CFG_UPTO(lo, hi) TPD_CFG_CLOSED, (lo), (hi)
#define TPD_CFG_MAX_LAYERS 1024
#define TPD_CFG_MAX_ITERS 1000000000

/* The choices of the enum keys, in the order of their enums in config.h. */
static const char *const k_schedule[] = {"1f1b", "interleaved", "zb-h1", NULL};
static const char *const k_precision[] = {"fp32", "bf16", NULL};
static const char *const k_device[] = {"cpu", "cuda", NULL};
static const char *const k_recompute[] = {"none", "selective", "full", NULL};
static const char *const k_attention[] = {"fused", "unfused", NULL};
static const char *const k_lr_decay[] = {"cosine", "linear", "constant", "inverse-square-root",
                                         "WSD",    NULL};
static const char *const k_wsd_decay[] = {"exponential", "linear", "cosine", "minus_sqrt", NULL};
static const char *const k_fallback[] = {"none", "previous", NULL};
static const char *const k_norm[] = {"LayerNorm", "RMSNorm", NULL};
static const char *const k_pos_emb[] = {"learned_absolute", "rope", NULL};
static const char *const k_dp_sync[] = {"every_step", "diloco", NULL};
static const char *const k_reduce_dtype[] = {"fp32", "bf16", NULL};
static const char *const k_optimizer[] = {"adamw", "sgd", NULL};
static const char *const k_sharding[] = {"no_shard", "optim", "optim_grads", "optim_grads_params",
                                         NULL};
static const char *const k_cp_comm[] = {"p2p", "a2a", NULL};
/* The parser stores an enum key as an int. */
_Static_assert(sizeof(tpd_schedule) == sizeof(int) && sizeof(tpd_precision) == sizeof(int) &&
                   sizeof(tpd_device) == sizeof(int) && sizeof(tpd_recompute) == sizeof(int) &&
                   sizeof(tpd_attention) == sizeof(int) && sizeof(tpd_lr_decay) == sizeof(int) &&
                   sizeof(tpd_wsd_decay) == sizeof(int) && sizeof(tpd_fallback) == sizeof(int) &&
                   sizeof(tpd_norm) == sizeof(int) && sizeof(tpd_pos_emb) == sizeof(int) &&
                   sizeof(tpd_dp_sync) == sizeof(int) && sizeof(tpd_reduce_dtype) == sizeof(int) &&
                   sizeof(tpd_optimizer_type) == sizeof(int) &&
                   sizeof(tpd_dp_sharding) == sizeof(int) && sizeof(tpd_cp_comm) == sizeof(int),
               "enum keys are stored as int");

/* The required keys default to a tiny model so that a defaults-only load (tests, or
 * code that builds a config by hand) passes every check. */
const tpd_cfg_key tpd_cfg_keys[] = {
    /* model */
    {"model.num_layers", TPD_CFG_INT, TPD_CFG_FIELD(model.num_layers), "2",
     TPD_CFG_UPTO(1, TPD_CFG_MAX_LAYERS), NULL, 1, "transformer layers"},
    {"model.hidden_size", TPD_CFG_INT, TPD_CFG_FIELD(model.hidden_size), "64",
     TPD_CFG_UPTO(1, 262144), NULL, 1, "model width h"},
    {"model.num_attention_heads", TPD_CFG_INT, TPD_CFG_FIELD(model.num_attention_heads), "4",
     TPD_CFG_UPTO(1, 4096), NULL, 1, "attention heads a; h must be a multiple of a"},
    {"model.ffn_hidden_size", TPD_CFG_INT, TPD_CFG_FIELD(model.ffn_hidden_size), "0",
     TPD_CFG_UPTO(0, 1048576), NULL, 0,
     "MLP width (SwiGLU: of gate and up); 0 means 4*hidden_size, not with swiglu"},
    {"model.vocab_size", TPD_CFG_INT, TPD_CFG_FIELD(model.vocab_size), "256",
     TPD_CFG_UPTO(1, 16777216), NULL, 1, "tokens in the vocabulary, before padding"},
    {"model.seq_length", TPD_CFG_INT, TPD_CFG_FIELD(model.seq_length), "64",
     TPD_CFG_UPTO(1, 1048576), NULL, 1, "tokens per sample"},
    {"model.max_position_embeddings", TPD_CFG_INT, TPD_CFG_FIELD(model.max_position_embeddings),
     "0", TPD_CFG_UPTO(0, 1048576), NULL, 0,
     "longest sequence (learned: rows of wpe); 0 means seq_length"},
    {"model.init_method_std", TPD_CFG_DOUBLE, TPD_CFG_FIELD(model.init_method_std), "0.02",
     TPD_CFG_MIN(0), NULL, 0, "std of the normal weight init"},
    {"model.make_vocab_size_divisible_by", TPD_CFG_INT,
     TPD_CFG_FIELD(model.make_vocab_size_divisible_by), "128", TPD_CFG_UPTO(1, 65536), NULL, 0,
     "vocab is padded to a multiple of this times TP"},
    {"model.normalization", TPD_CFG_ENUM, TPD_CFG_FIELD(model.normalization), "LayerNorm",
     TPD_CFG_NOBOUND, k_norm, 0, "LayerNorm (GPT-2) or RMSNorm (Llama)"},
    {"model.norm_epsilon", TPD_CFG_DOUBLE, TPD_CFG_FIELD(model.norm_epsilon), "1e-5", TPD_CFG_GT, 0,
     0, NULL, 0, "added to the variance (LayerNorm) or mean square (RMSNorm)"},
    {"model.position_embedding_type", TPD_CFG_ENUM, TPD_CFG_FIELD(model.position_embedding_type),
     "learned_absolute", TPD_CFG_NOBOUND, k_pos_emb, 0,
     "learned_absolute (GPT-2's wpe) or rope (rotary, Llama)"},
    {"model.rotary_base", TPD_CFG_DOUBLE, TPD_CFG_FIELD(model.rotary_base), "10000", TPD_CFG_GT, 0,
     0, NULL, 0, "RoPE base theta (Llama 2: 10000, Llama 3: 500000)"},
    {"model.rope_scaling", TPD_CFG_BOOL, TPD_CFG_FIELD(model.rope_scaling), "false",
     TPD_CFG_NOBOUND, NULL, 0,
     "Llama 3.1's RoPE frequency scaling (Megatron's --use-rope-scaling)"},
    {"model.rope_scaling_factor", TPD_CFG_DOUBLE, TPD_CFG_FIELD(model.rope_scaling_factor), "8.0",
     TPD_CFG_UPTO(1, 1024), NULL, 0, "long wavelengths are divided by it (Llama 3.1: 8)"},
    {"model.rope_scaling_low_freq_factor", TPD_CFG_DOUBLE,
     TPD_CFG_FIELD(model.rope_scaling_low_freq_factor), "1.0", TPD_CFG_GT, 0, 0, NULL, 0,
     "wavelengths above original/low are scaled whole (Llama 3.1: 1)"},
    {"model.rope_scaling_high_freq_factor", TPD_CFG_DOUBLE,
     TPD_CFG_FIELD(model.rope_scaling_high_freq_factor), "4.0", TPD_CFG_GT, 0, 0, NULL, 0,
     "wavelengths below original/high are kept (Llama 3.1: 4)"},
    {"model.rope_scaling_original_max_position_embeddings", TPD_CFG_INT,
     TPD_CFG_FIELD(model.rope_scaling_original_max_position_embeddings), "8192",
     TPD_CFG_UPTO(1, 1048576), NULL, 0,
     "the context the model was trained at before scaling (Llama 3.1: 8192)"},
    {"model.rotary_percent", TPD_CFG_DOUBLE, TPD_CFG_FIELD(model.rotary_percent), "1.0", TPD_CFG_GT,
     0, 0, NULL, 0, "share of each head RoPE rotates; only 1.0 (whole heads)"},
    {"model.swiglu", TPD_CFG_BOOL, TPD_CFG_FIELD(model.swiglu), "false", TPD_CFG_NOBOUND, NULL, 0,
     "gated MLP down(silu(gate(x)) * up(x)); ffn_hidden_size is the gate and up width"},
    {"model.group_query_attention", TPD_CFG_BOOL, TPD_CFG_FIELD(model.group_query_attention),
     "false", TPD_CFG_NOBOUND, NULL, 0,
     "num_query_groups K/V heads; false: one per query head (MHA)"},
    {"model.num_query_groups", TPD_CFG_INT, TPD_CFG_FIELD(model.num_query_groups), "1",
     TPD_CFG_UPTO(1, 4096), NULL, 0,
     "K/V heads with group_query_attention; divides the heads, a multiple of TP"},
    {"model.kv_channels", TPD_CFG_INT, TPD_CFG_FIELD(model.kv_channels), "0",
     TPD_CFG_UPTO(0, 65536), NULL, 0,
     "a head's size; 0 means hidden_size / num_attention_heads (Qwen3's head_dim)"},
    {"model.untie_embeddings_and_output_weights", TPD_CFG_BOOL,
     TPD_CFG_FIELD(model.untie_embeddings_and_output_weights), "false", TPD_CFG_NOBOUND, NULL, 0,
     "a separate output layer instead of the tied embedding"},
    {"model.add_bias_linear", TPD_CFG_BOOL, TPD_CFG_FIELD(model.add_bias_linear), "true",
     TPD_CFG_NOBOUND, NULL, 0, "biases in the QKV, projection and MLP layers (Llama: false)"},
    {"model.add_qkv_bias", TPD_CFG_BOOL, TPD_CFG_FIELD(model.add_qkv_bias), "false",
     TPD_CFG_NOBOUND, NULL, 0, "a bias in the QKV layer even without add_bias_linear (Qwen2)"},
    {"model.qk_layernorm", TPD_CFG_BOOL, TPD_CFG_FIELD(model.qk_layernorm), "false",
     TPD_CFG_NOBOUND, NULL, 0,
     "RMSNorm on every Q and K head before RoPE, one weight per head size (Qwen3)"},
    {"model.num_moe_experts", TPD_CFG_INT, TPD_CFG_FIELD(model.num_moe_experts), "0",
     TPD_CFG_UPTO(0, 4096), NULL, 0, "routed experts per MoE layer; 0: a dense model"},
    {"model.moe_router_topk", TPD_CFG_INT, TPD_CFG_FIELD(model.moe_router_topk), "2",
     TPD_CFG_UPTO(1, 64), NULL, 0, "experts each token is routed to"},
    {"model.moe_ffn_hidden_size", TPD_CFG_INT, TPD_CFG_FIELD(model.moe_ffn_hidden_size), "0",
     TPD_CFG_UPTO(0, 1048576), NULL, 0, "an expert's MLP width; 0 means ffn_hidden_size"},
    {"model.moe_shared_expert_intermediate_size", TPD_CFG_INT,
     TPD_CFG_FIELD(model.moe_shared_expert_intermediate_size), "0", TPD_CFG_UPTO(0, 1048576), NULL,
     0, "width of the shared experts every token passes through (0: none)"},
    {"model.moe_shared_expert_gate", TPD_CFG_BOOL, TPD_CFG_FIELD(model.moe_shared_expert_gate),
     "false", TPD_CFG_NOBOUND, NULL, 0,
     "Qwen2-MoE: the shared experts' output scaled by sigmoid(x . gate)"},
    {"model.moe_layer_freq", TPD_CFG_INT, TPD_CFG_FIELD(model.moe_layer_freq), "1",
     TPD_CFG_UPTO(1, 1024), NULL, 0,
     "every Nth layer is a MoE layer (Megatron-Core's: layer i when i % N == 0), the others "
     "dense MLPs of ffn_hidden_size"},
    {"model.moe_router_pre_softmax", TPD_CFG_BOOL, TPD_CFG_FIELD(model.moe_router_pre_softmax),
     "false", TPD_CFG_NOBOUND, NULL, 0,
     "softmax over all experts before the top-k (HF's order); false: softmax over the top-k "
     "logits (Mixtral's weights)"},
    {"model.moe_norm_topk_prob", TPD_CFG_BOOL, TPD_CFG_FIELD(model.moe_norm_topk_prob), "false",
     TPD_CFG_NOBOUND, NULL, 0, "with pre_softmax: the top-k probabilities renormalized (HF)"},
    {"model.moe_aux_loss_coeff", TPD_CFG_DOUBLE, TPD_CFG_FIELD(model.moe_aux_loss_coeff), "0.0",
     TPD_CFG_MIN(0), NULL, 0, "weight of the Switch load-balancing loss"},
    {"model.moe_z_loss_coeff", TPD_CFG_DOUBLE, TPD_CFG_FIELD(model.moe_z_loss_coeff), "0.0",
     TPD_CFG_MIN(0), NULL, 0, "weight of the ST-MoE router z-loss"},
    {"model.moe_expert_capacity_factor", TPD_CFG_DOUBLE,
     TPD_CFG_FIELD(model.moe_expert_capacity_factor), "0.0", TPD_CFG_MIN(0), NULL, 0,
     "> 0: each expert takes at most ceil(factor x tokens x k / E), dropping the rest; 0: "
     "dropless"},
    {"model.moe_imbalance", TPD_CFG_DOUBLE, TPD_CFG_FIELD(model.moe_imbalance), "1.0",
     TPD_CFG_MIN(1), NULL, 0,
     "plan only: under expert parallelism the busiest EP rank's tokens over the mean (the "
     "expert GEMMs and the all-to-alls' receiving side wait for it); 1 = even loads"},

    /* parallel */
    {"parallel.tensor_model_parallel_size", TPD_CFG_INT,
     TPD_CFG_FIELD(parallel.tensor_model_parallel_size), "1", TPD_CFG_UPTO(1, 4096), NULL, 0,
     "TP degree: ranks that split each layer"},
    {"parallel.pipeline_model_parallel_size", TPD_CFG_INT,
     TPD_CFG_FIELD(parallel.pipeline_model_parallel_size), "1",
     TPD_CFG_UPTO(1, TPD_CONFIG_MAX_STAGES), NULL, 0,
     "PP degree: stages that split the layer stack"},
    {"parallel.data_parallel_size", TPD_CFG_INT, TPD_CFG_FIELD(parallel.data_parallel_size), "0",
     TPD_CFG_UPTO(0, 1048576), NULL, 0, "DP degree; 0 means world / (TP*PP)"},
    {"parallel.pipeline_layers", TPD_CFG_INTLIST, TPD_CFG_FIELD(parallel.pipeline_layers), "[]",
     TPD_CFG_UPTO(1, TPD_CFG_MAX_LAYERS), NULL, 0,
     "layers per stage (per virtual stage, chunk-major, when v > 1); [] = even split"},
    {"parallel.use_distributed_optimizer", TPD_CFG_BOOL,
     TPD_CFG_FIELD(parallel.use_distributed_optimizer), "false", TPD_CFG_NOBOUND, NULL, 0,
     "shard the optimizer state over DP (ZeRO-1): data_parallel_sharding_strategy optim"},
    {"parallel.data_parallel_sharding_strategy", TPD_CFG_ENUM,
     TPD_CFG_FIELD(parallel.data_parallel_sharding_strategy), "no_shard", TPD_CFG_NOBOUND,
     k_sharding, 0,
     "no_shard, optim (ZeRO-1), optim_grads (ZeRO-2), optim_grads_params (ZeRO-3/FSDP); "
     "stating it and use_distributed_optimizer both, they must agree (false with no_shard, "
     "true with the others); train runs optim, plan models all"},
    {"parallel.data_parallel_shard_size", TPD_CFG_INT,
     TPD_CFG_FIELD(parallel.data_parallel_shard_size), "0", TPD_CFG_UPTO(0, 1048576), NULL, 0,
     "HSDP: shard inside groups of this many consecutive DP ranks, replicate across them; "
     "0 = all of DP x CP (must divide it; train: under optim_grads and optim_grads_params)"},
    {"parallel.expert_model_parallel_size", TPD_CFG_INT,
     TPD_CFG_FIELD(parallel.expert_model_parallel_size), "1", TPD_CFG_UPTO(1, 4096), NULL, 0,
     "EP degree: data-parallel ranks that split each MoE layer's experts"},
    {"parallel.expert_tensor_parallel_size", TPD_CFG_INT,
     TPD_CFG_FIELD(parallel.expert_tensor_parallel_size), "0", TPD_CFG_UPTO(0, 4096), NULL, 0,
     "experts' TP degree; 0 means tensor_model_parallel_size (the only one built)"},
    {"parallel.context_parallel_size", TPD_CFG_INT, TPD_CFG_FIELD(parallel.context_parallel_size),
     "1", TPD_CFG_UPTO(1, 4096), NULL, 0,
     "CP degree: ranks that split each sequence (2 x CP chunks, causally balanced)"},
    {"parallel.cp_comm_type", TPD_CFG_ENUM, TPD_CFG_FIELD(parallel.cp_comm_type), "p2p",
     TPD_CFG_NOBOUND, k_cp_comm, 0,
     "p2p: ring attention, K/V passed round the CP ring; a2a: DeepSpeed-Ulysses' all-to-all"},
    {"parallel.fsdp_units_in_flight", TPD_CFG_INT, TPD_CFG_FIELD(parallel.fsdp_units_in_flight),
     "2", TPD_CFG_UPTO(1, 1024), NULL, 0,
     "optim_grads_params: layers whose full parameters are gathered at once (the prefetch "
     "included)"},
    {"parallel.ddp_bucket_size", TPD_CFG_INT64, TPD_CFG_FIELD(parallel.ddp_bucket_size), "40000000",
     TPD_CFG_UPTO(1, 1099511627776.0), NULL, 0, "gradient elements per DP bucket"},
    {"parallel.overlap_grad_reduce", TPD_CFG_BOOL, TPD_CFG_FIELD(parallel.overlap_grad_reduce),
     "true", TPD_CFG_NOBOUND, NULL, 0,
     "start each bucket's DP reduction during the last backward, once its gradients are final"},
    {"parallel.overlap_param_gather", TPD_CFG_BOOL, TPD_CFG_FIELD(parallel.overlap_param_gather),
     "true", TPD_CFG_NOBOUND, NULL, 0,
     "ZeRO-1: wait for each bucket's parameter all-gather only before its first forward use"},
    {"parallel.sequence_parallel", TPD_CFG_BOOL, TPD_CFG_FIELD(parallel.sequence_parallel), "false",
     TPD_CFG_NOBOUND, NULL, 0,
     "Megatron sequence parallelism: LayerNorm and residual rows split over TP"},
    {"parallel.tp_comm_overlap", TPD_CFG_BOOL, TPD_CFG_FIELD(parallel.tp_comm_overlap), "false",
     TPD_CFG_NOBOUND, NULL, 0,
     "overlap TP communication with the GEMMs (Megatron-Core's --tp-comm-overlap; needs "
     "sequence_parallel): planned, not trained"},
    {"parallel.virtual_pipeline_model_parallel_size", TPD_CFG_INT,
     TPD_CFG_FIELD(parallel.virtual_pipeline_model_parallel_size), "1",
     TPD_CFG_UPTO(1, TPD_CONFIG_MAX_STAGES), NULL, 0,
     "model chunks per stage; > 1 runs Megatron's interleaved schedule"},
    {"parallel.pipeline_schedule", TPD_CFG_ENUM, TPD_CFG_FIELD(parallel.pipeline_schedule), "1f1b",
     TPD_CFG_NOBOUND, k_schedule, 0,
     "1f1b, interleaved (virtual stages > 1) or zb-h1 (backward split in B and W)"},
    {"parallel.dp_sync", TPD_CFG_ENUM, TPD_CFG_FIELD(parallel.dp_sync), "every_step",
     TPD_CFG_NOBOUND, k_dp_sync, 0,
     "every_step: sum gradients over DP each step; diloco: DiLoCo replicas (diloco.*)"},
    {"parallel.grad_reduce_dtype", TPD_CFG_ENUM, TPD_CFG_FIELD(parallel.grad_reduce_dtype), "fp32",
     TPD_CFG_NOBOUND, k_reduce_dtype, 0,
     "DP gradient reductions on the wire: fp32, or bf16 with fp32 accumulation at the receiver"},

    /* diloco */
    {"diloco.sync_interval", TPD_CFG_INT, TPD_CFG_FIELD(diloco.sync_interval), "20",
     TPD_CFG_UPTO(1, TPD_CFG_MAX_ITERS), NULL, 0, "H: inner steps between outer steps"},
    {"diloco.outer_lr", TPD_CFG_DOUBLE, TPD_CFG_FIELD(diloco.outer_lr), "0.7", TPD_CFG_GT, 0, 0,
     NULL, 0, "outer Nesterov learning rate"},
    {"diloco.outer_momentum", TPD_CFG_DOUBLE, TPD_CFG_FIELD(diloco.outer_momentum), "0.9",
     TPD_CFG_CLOSED, 0, 0.999999, NULL, 0, "outer Nesterov momentum, in [0, 1)"},
    {"diloco.replicas", TPD_CFG_INT, TPD_CFG_FIELD(diloco.replicas), "0", TPD_CFG_UPTO(0, 1048576),
     NULL, 0, "replicas (divides DP; each DP/replicas ranks with per-step sync inside); 0 = DP"},
    {"diloco.fragments", TPD_CFG_INT, TPD_CFG_FIELD(diloco.fragments), "1", TPD_CFG_UPTO(1, 1024),
     NULL, 0, "Streaming DiLoCo: fragments synced H/fragments steps apart (divides sync_interval)"},
    {"diloco.overlap_steps", TPD_CFG_INT, TPD_CFG_FIELD(diloco.overlap_steps), "0",
     TPD_CFG_UPTO(0, TPD_CFG_MAX_ITERS), NULL, 0,
     "inner steps a fragment's outer all-reduce overlaps before it is applied "
     "(< sync_interval / fragments)"},
    {"diloco.reduce_dtype", TPD_CFG_ENUM, TPD_CFG_FIELD(diloco.reduce_dtype), "fp32",
     TPD_CFG_NOBOUND, k_reduce_dtype, 0,
     "outer all-reduce on the wire: fp32, or bf16 with fp32 accumulation"},

    /* training */
    {"training.micro_batch_size", TPD_CFG_INT, TPD_CFG_FIELD(training.micro_batch_size), "1",
     TPD_CFG_UPTO(1, 65536), NULL, 1, "samples per micro-batch per DP rank"},
    {"training.global_batch_size", TPD_CFG_INT, TPD_CFG_FIELD(training.global_batch_size), "1",
     TPD_CFG_UPTO(1, 1048576), NULL, 1, "samples per iteration over all DP ranks"},
    {"training.train_iters", TPD_CFG_INT, TPD_CFG_FIELD(training.train_iters), "1",
     TPD_CFG_UPTO(1, TPD_CFG_MAX_ITERS), NULL, 1, "iterations of the whole run"},
    {"training.seed", TPD_CFG_UINT64, TPD_CFG_FIELD(training.seed), "1234", TPD_CFG_NOBOUND, NULL,
     0, "fixes the init and the samples of every iteration"},
    {"training.precision", TPD_CFG_ENUM, TPD_CFG_FIELD(training.precision), "fp32", TPD_CFG_NOBOUND,
     k_precision, 0, "compute precision; bf16 keeps fp32 master weights"},
    {"training.device", TPD_CFG_ENUM, TPD_CFG_FIELD(training.device), "cpu", TPD_CFG_NOBOUND,
     k_device, 0, "kernel backend"},
    {"training.recompute", TPD_CFG_ENUM, TPD_CFG_FIELD(training.recompute), "none", TPD_CFG_NOBOUND,
     k_recompute, 0, "activation recomputation: selective = attention only, full = whole layers"},
    {"training.exit_interval", TPD_CFG_INT, TPD_CFG_FIELD(training.exit_interval), "0",
     TPD_CFG_UPTO(0, TPD_CFG_MAX_ITERS), NULL, 0,
     "save and stop when the iteration is a multiple of this (0: never)"},
    {"training.exit_duration_in_mins", TPD_CFG_DOUBLE,
     TPD_CFG_FIELD(training.exit_duration_in_mins), "0", TPD_CFG_MIN(0), NULL, 0,
     "save and stop after this many minutes of training (0: never)"},
    {"training.recompute_num_layers", TPD_CFG_INT, TPD_CFG_FIELD(training.recompute_num_layers),
     "0", TPD_CFG_UPTO(0, TPD_CFG_MAX_LAYERS), NULL, 0,
     "recompute full: only the first N layers of each stage (0 = all)"},
    {"training.attention", TPD_CFG_ENUM, TPD_CFG_FIELD(training.attention), "fused",
     TPD_CFG_NOBOUND, k_attention, 0, "cuda attention: cuDNN fused or cuBLASLt+softmax"},
    {"training.num_threads", TPD_CFG_INT, TPD_CFG_FIELD(training.num_threads), "0",
     TPD_CFG_UPTO(0, 4096), NULL, 0,
     "cpu threads per rank; 0 = OMP_NUM_THREADS if set, else the node's cores / its ranks"},
    {"training.max_skipped_iterations", TPD_CFG_INT, TPD_CFG_FIELD(training.max_skipped_iterations),
     "10", TPD_CFG_UPTO(0, TPD_CFG_MAX_ITERS), NULL, 0,
     "stop (exit code 5, nothing saved) after this many steps in a row with a non-finite loss "
     "or gradient; 0 = never"},
    {"training.accumulate_allreduce_grads_in_fp32", TPD_CFG_BOOL,
     TPD_CFG_FIELD(training.accumulate_allreduce_grads_in_fp32), "true", TPD_CFG_NOBOUND, NULL, 0,
     "bf16: fp32 main gradients (fp32 accumulation and DP reduction); false keeps bf16 "
     "gradients, half the bytes; no effect under fp32"},

    /* optimizer */
    {"optimizer.lr", TPD_CFG_DOUBLE, TPD_CFG_FIELD(optimizer.lr), "3e-4", TPD_CFG_MIN(0), NULL, 0,
     "peak learning rate"},
    {"optimizer.min_lr", TPD_CFG_DOUBLE, TPD_CFG_FIELD(optimizer.min_lr), "0", TPD_CFG_MIN(0), NULL,
     0, "learning rate at the end of the decay"},
    {"optimizer.lr_decay_style", TPD_CFG_ENUM, TPD_CFG_FIELD(optimizer.lr_decay_style), "cosine",
     TPD_CFG_NOBOUND, k_lr_decay, 0,
     "decay from lr to min_lr (WSD: warmup, stable, then lr_wsd_decay_iters of anneal)"},
    {"optimizer.lr_wsd_decay_iters", TPD_CFG_INT, TPD_CFG_FIELD(optimizer.lr_wsd_decay_iters), "0",
     TPD_CFG_UPTO(0, TPD_CFG_MAX_ITERS), NULL, 0,
     "WSD: iterations of the final anneal, ending at lr_decay_iters"},
    {"optimizer.lr_wsd_decay_style", TPD_CFG_ENUM, TPD_CFG_FIELD(optimizer.lr_wsd_decay_style),
     "exponential", TPD_CFG_NOBOUND, k_wsd_decay, 0, "WSD: shape of the anneal"},
    {"optimizer.lr_warmup_iters", TPD_CFG_INT, TPD_CFG_FIELD(optimizer.lr_warmup_iters), "0",
     TPD_CFG_UPTO(0, TPD_CFG_MAX_ITERS), NULL, 0, "linear warmup from 0 to lr"},
    {"optimizer.lr_decay_iters", TPD_CFG_INT, TPD_CFG_FIELD(optimizer.lr_decay_iters), "0",
     TPD_CFG_UPTO(0, TPD_CFG_MAX_ITERS), NULL, 0,
     "iteration where decay ends; 0 means train_iters"},
    {"optimizer.weight_decay", TPD_CFG_DOUBLE, TPD_CFG_FIELD(optimizer.weight_decay), "0.1",
     TPD_CFG_MIN(0), NULL, 0, "decoupled weight decay of 2-D weights"},
    {"optimizer.adam_beta1", TPD_CFG_DOUBLE, TPD_CFG_FIELD(optimizer.adam_beta1), "0.9",
     TPD_CFG_HALF, 0, 1, NULL, 0, "Adam first-moment decay"},
    {"optimizer.adam_beta2", TPD_CFG_DOUBLE, TPD_CFG_FIELD(optimizer.adam_beta2), "0.95",
     TPD_CFG_HALF, 0, 1, NULL, 0, "Adam second-moment decay"},
    {"optimizer.adam_eps", TPD_CFG_DOUBLE, TPD_CFG_FIELD(optimizer.adam_eps), "1e-8", TPD_CFG_GT, 0,
     0, NULL, 0, "Adam denominator epsilon"},
    {"optimizer.clip_grad", TPD_CFG_DOUBLE, TPD_CFG_FIELD(optimizer.clip_grad), "1.0",
     TPD_CFG_MIN(0), NULL, 0, "global gradient-norm clip; 0 disables"},
    {"optimizer.type", TPD_CFG_ENUM, TPD_CFG_FIELD(optimizer.type), "adamw", TPD_CFG_NOBOUND,
     k_optimizer, 0, "adamw, or sgd (plain SGD with decoupled weight decay; no state)"},

    /* data */
    {"data.data_path", TPD_CFG_STRING, TPD_CFG_FIELD(data.data_path), "", TPD_CFG_NOBOUND, NULL, 0,
     "Megatron PREFIX (PREFIX.bin/.idx) or an llm.c token shard"},
    {"data.shuffle", TPD_CFG_BOOL, TPD_CFG_FIELD(data.shuffle), "true", TPD_CFG_NOBOUND, NULL, 0,
     "shuffle samples (by seed and iteration)"},
    {"data.split", TPD_CFG_SPLIT, TPD_CFG_FIELD(data.split), "949,50,1", TPD_CFG_NOBOUND, NULL, 0,
     "train,valid,test weights"},

    /* logging */
    {"logging.log_interval", TPD_CFG_INT, TPD_CFG_FIELD(logging.log_interval), "1",
     TPD_CFG_UPTO(1, TPD_CFG_MAX_ITERS), NULL, 0, "iterations between log lines"},
    {"logging.metrics_file", TPD_CFG_STRING, TPD_CFG_FIELD(logging.metrics_file), "",
     TPD_CFG_NOBOUND, NULL, 0, "JSONL, one object per iteration; empty = none"},
    {"logging.tensorboard_dir", TPD_CFG_STRING, TPD_CFG_FIELD(logging.tensorboard_dir), "",
     TPD_CFG_NOBOUND, NULL, 0, "TensorBoard event files of the logged scalars; empty = none"},
    {"logging.eval_interval", TPD_CFG_INT, TPD_CFG_FIELD(logging.eval_interval), "0",
     TPD_CFG_UPTO(0, TPD_CFG_MAX_ITERS), NULL, 0, "iterations between validation runs; 0 = never"},
    {"logging.eval_iters", TPD_CFG_INT, TPD_CFG_FIELD(logging.eval_iters), "10",
     TPD_CFG_UPTO(0, 1000000), NULL, 0, "global batches per validation run"},
    {"logging.trace_file", TPD_CFG_STRING, TPD_CFG_FIELD(logging.trace_file), "", TPD_CFG_NOBOUND,
     NULL, 0, "Chrome trace JSON of real steps; empty = none"},
    {"logging.log_params_norm", TPD_CFG_BOOL, TPD_CFG_FIELD(logging.log_params_norm), "false",
     TPD_CFG_NOBOUND, NULL, 0, "log the global norm of the weights after each update"},
    {"logging.log_timers", TPD_CFG_BOOL, TPD_CFG_FIELD(logging.log_timers), "false",
     TPD_CFG_NOBOUND, NULL, 0, "log where each logged step's time went (this rank)"},
    {"logging.overwrite", TPD_CFG_BOOL, TPD_CFG_FIELD(logging.overwrite), "false", TPD_CFG_NOBOUND,
     NULL, 0,
     "a run that starts at iteration 0 may replace the metrics_file of another run (a "
     "resumed run appends to its own)"},

    /* checkpoint */
    {"checkpoint.save", TPD_CFG_STRING, TPD_CFG_FIELD(checkpoint.save), "", TPD_CFG_NOBOUND, NULL,
     0, "checkpoint directory; empty = never save"},
    {"checkpoint.load", TPD_CFG_STRING, TPD_CFG_FIELD(checkpoint.load), "", TPD_CFG_NOBOUND, NULL,
     0, "\"\", \"auto\" (latest in save) or a checkpoint path"},
    {"checkpoint.save_interval", TPD_CFG_INT, TPD_CFG_FIELD(checkpoint.save_interval), "0",
     TPD_CFG_UPTO(0, TPD_CFG_MAX_ITERS), NULL, 0,
     "iterations between saves; 0 = at the end or on a signal"},
    {"checkpoint.keep_last", TPD_CFG_INT, TPD_CFG_FIELD(checkpoint.keep_last), "0",
     TPD_CFG_UPTO(0, 1000000), NULL, 0, "checkpoints kept; 0 = all"},
    {"checkpoint.fallback", TPD_CFG_ENUM, TPD_CFG_FIELD(checkpoint.fallback), "none",
     TPD_CFG_NOBOUND, k_fallback, 0, "on a corrupt checkpoint: fail or load the one before"},
    {"checkpoint.finetune", TPD_CFG_BOOL, TPD_CFG_FIELD(checkpoint.finetune), "false",
     TPD_CFG_NOBOUND, NULL, 0, "load weights only; restart iteration and optimizer"},
    {"checkpoint.overwrite", TPD_CFG_BOOL, TPD_CFG_FIELD(checkpoint.overwrite), "false",
     TPD_CFG_NOBOUND, NULL, 0,
     "let this run replace checkpoints in save that it did not load from (another run's)"},
    {"checkpoint.async_save", TPD_CFG_BOOL, TPD_CFG_FIELD(checkpoint.async_save), "false",
     TPD_CFG_NOBOUND, NULL, 0,
     "write shards in the background from a host snapshot; commit at a later boundary"},

    /* comm */
    {"comm.timeout_s", TPD_CFG_DOUBLE, TPD_CFG_FIELD(comm.timeout_s), "300", TPD_CFG_GT, 0, 0, NULL,
     0, "collective watchdog deadline (s)"},
};

const int tpd_cfg_nsections = (int)(sizeof tpd_cfg_sections / sizeof tpd_cfg_sections[0]);
const int tpd_cfg_nkeys = (int)(sizeof tpd_cfg_keys / sizeof tpd_cfg_keys[0]);
_Static_assert(sizeof tpd_cfg_keys / sizeof tpd_cfg_keys[0] <= TPD_CFG_MAX_KEYS,
               "raise TPD_CFG_MAX_KEYS");
_Static_assert(sizeof tpd_cfg_sections / sizeof tpd_cfg_sections[0] <= TPD_CFG_MAX_SECTIONS,
               "raise TPD_CFG_MAX_SECTIONS");

/* ---- lookup and suggestions ---- */

int tpd_cfg_find_key(const char *name) {
    for (int i = 0; i < tpd_cfg_nkeys; i++)
        if (strcmp(tpd_cfg_keys[i].name, name) == 0) return i;
    return -1;
}

int tpd_cfg_find_section(const char *name) {
    for (int i = 0; i < tpd_cfg_nsections; i++)
        if (strcmp(tpd_cfg_sections[i].name, name) == 0) return i;
    return -1;
}

const char *tpd_cfg_bare(const char *name) {
    const char *dot = strchr(name, '.');
    return dot ? dot + 1 : name;
}

/* Edit distance; names longer than 63 bytes are compared on their first 63. */
static int cfg_distance(const char *a, const char *b) {
    int la = (int)strnlen(a, 63), lb = (int)strnlen(b, 63);
    int prev[64], cur[64];
    for (int j = 0; j <= lb; j++)
        prev[j] = j;
    for (int i = 1; i <= la; i++) {
        cur[0] = i;
        for (int j = 1; j <= lb; j++) {
            int sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
            int del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, sizeof(int) * (size_t)(lb + 1));
    }
    return prev[lb];
}

/* Three edits or fewer is a typo worth a suggestion; further than that, a guess would
 * more often mislead than help. */
#define CFG_SUGGEST_MAX 3

static const char *cfg_key_by_bare(const char *bare) {
    for (int i = 0; i < tpd_cfg_nkeys; i++)
        if (strcmp(tpd_cfg_bare(tpd_cfg_keys[i].name), bare) == 0) return tpd_cfg_keys[i].name;
    return NULL;
}

const char *tpd_cfg_suggest_key(const char *name) {
    /* A key put in the wrong section (training.lr) is found by its bare name. */
    const char *same = cfg_key_by_bare(tpd_cfg_bare(name));
    if (same) return same;
    int best = -1, best_d = CFG_SUGGEST_MAX + 1;
    for (int i = 0; i < tpd_cfg_nkeys; i++) {
        int d = cfg_distance(name, tpd_cfg_keys[i].name);
        if (d < best_d) best = i, best_d = d;
    }
    return best >= 0 ? tpd_cfg_keys[best].name : NULL;
}

const char *tpd_cfg_suggest_section(const char *name) {
    /* A key written at the top level ("num_layers: 12"). */
    const char *key = cfg_key_by_bare(name);
    if (key) return key;
    int best = -1, best_d = CFG_SUGGEST_MAX + 1;
    for (int i = 0; i < tpd_cfg_nsections; i++) {
        int d = cfg_distance(name, tpd_cfg_sections[i].name);
        if (d < best_d) best = i, best_d = d;
    }
    return best >= 0 ? tpd_cfg_sections[best].name : NULL;
}

/* ---- rules ---- */

void tpd_cfg_fmt_double(double x, char *buf, size_t n) {
    /* Whole numbers as "300.0", which %g would shorten to "3e+02". */
    if (x == floor(x) && fabs(x) < 1e15) {
        snprintf(buf, n, "%.1f", x);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, x);
        if (strtod(buf, NULL) == x) return;
    }
}

void tpd_cfg_rule(const tpd_cfg_key *k, char *buf, size_t n) {
    static const char *const bounds[] = {
        [TPD_CFG_ANY] = "%s%.0s%.0s%s",      [TPD_CFG_GE] = "%s >= %s%.0s%s",
        [TPD_CFG_GT] = "%s > %s%.0s%s",      [TPD_CFG_CLOSED] = "%s in [%s, %s]%s",
        [TPD_CFG_HALF] = "%s in [%s, %s)%s",
    };
    const char *what = "a number";
    if (k->type == TPD_CFG_INT || k->type == TPD_CFG_INT64 || k->type == TPD_CFG_UINT64)
        what = "an integer";
    else if (k->type == TPD_CFG_INTLIST)
        what = "a list of integers";
    else if (k->type == TPD_CFG_BOOL)
        what = "true or false";
    else if (k->type == TPD_CFG_STRING)
        what = "a string";
    else if (k->type == TPD_CFG_SPLIT)
        what = "three non-negative integers 'train,valid,test' with train > 0";

    if (k->type == TPD_CFG_ENUM) {
        size_t used = (size_t)snprintf(buf, n, "one of ");
        for (int i = 0; k->choices[i] && used < n; i++)
            used += (size_t)snprintf(buf + used, n - used, "%s%s", i ? ", " : "", k->choices[i]);
        return;
    }
    char lo[32], hi[32];
    /* integer bounds in full ("16777216", not "1.67772e+07") */
    const char *fmt = k->type == TPD_CFG_DOUBLE ? "%g" : "%.0f";
    snprintf(lo, sizeof lo, fmt, k->lo);
    snprintf(hi, sizeof hi, fmt, k->hi);
    const char *tail = k->type == TPD_CFG_INTLIST ? ", e.g. [3, 5]" : "";
    snprintf(buf, n, bounds[k->range], what, lo, hi, tail);
}

int tpd_cfg_in_range(const tpd_cfg_key *k, double x) {
    switch (k->range) {
    case TPD_CFG_ANY:
        return 1;
    case TPD_CFG_GE:
        return x >= k->lo;
    case TPD_CFG_GT:
        return x > k->lo;
    case TPD_CFG_CLOSED:
        return x >= k->lo && x <= k->hi;
    case TPD_CFG_HALF:
        return x >= k->lo && x < k->hi;
    }
    return 0;
}

/* ---- scalars ---- */

int tpd_cfg_is_null(const char *s, int plain) {
    return plain && (s[0] == '\0' || strcmp(s, "~") == 0 || strcmp(s, "null") == 0 ||
                     strcmp(s, "Null") == 0 || strcmp(s, "NULL") == 0);
}

/* Decimal digits only: YAML's 0x, 0o and 1_000 forms are not worth their surprises. */
static int cfg_all_digits(const char *p) {
    if (*p < '0' || *p > '9') return 0;
    for (; *p; p++)
        if (*p < '0' || *p > '9') return 0;
    return 1;
}

int tpd_cfg_parse_int64(const char *s, int64_t *v_p) {
    if (!cfg_all_digits(s + (*s == '+' || *s == '-'))) return 1;
    errno = 0;
    long long v = strtoll(s, NULL, 10);
    if (errno == ERANGE) return 2;
    *v_p = (int64_t)v;
    return 0;
}

int tpd_cfg_parse_uint64(const char *s, uint64_t *v_p) {
    if (!cfg_all_digits(s + (*s == '+'))) return 1;
    errno = 0;
    unsigned long long v = strtoull(s, NULL, 10);
    if (errno == ERANGE) return 2;
    *v_p = (uint64_t)v;
    return 0;
}

/* A finite decimal number; strtod's hex, inf and nan are refused. */
int tpd_cfg_parse_double(const char *s, double *v_p) {
    if (!*s || strpbrk(s, "xXnNiI")) return 1;
    char *end;
    double v = strtod(s, &end);
    if (*end || end == s || !isfinite(v)) return 1;
    *v_p = v;
    return 0;
}

int tpd_cfg_enum_index(const char *const *choices, const char *s) {
    for (int i = 0; choices[i]; i++)
        if (strcmp(choices[i], s) == 0) return i;
    return -1;
}

/* Choice `index` of a key's list; NULL when there is none. */
static const char *enum_name(const char *const *choices, int index) {
    for (int i = 0; choices[i]; i++)
        if (i == index) return choices[i];
    return NULL;
}

int tpd_config_choice_value(const char *key, const char *name) {
    int row = tpd_cfg_find_key(key);
    if (row < 0 || tpd_cfg_keys[row].type != TPD_CFG_ENUM) return -1;
    return tpd_cfg_enum_index(tpd_cfg_keys[row].choices, name);
}

const char *tpd_config_choice(const char *key, int value) {
    int row = tpd_cfg_find_key(key);
    const char *name = row >= 0 && tpd_cfg_keys[row].type == TPD_CFG_ENUM
                           ? enum_name(tpd_cfg_keys[row].choices, value)
                           : NULL;
    return name ? name : "?";
}

/* "949, 50, 1" into the canonical "949,50,1", so the data module splits it trivially. */
int tpd_cfg_parse_split(const char *s, char *out, size_t n) {
    long v[3];
    const char *p = s;
    for (int i = 0; i < 3; i++) {
        while (*p == ' ')
            p++;
        if (*p < '0' || *p > '9') return 1;
        char *end;
        errno = 0;
        v[i] = strtol(p, &end, 10);
        if (errno == ERANGE || v[i] > INT_MAX) return 1;
        p = end;
        while (*p == ' ')
            p++;
        if (i < 2 && *p++ != ',') return 1;
    }
    if (*p || v[0] <= 0) return 1;
    snprintf(out, n, "%ld,%ld,%ld", v[0], v[1], v[2]);
    return 0;
}

/* ---- printing ---- */

/* A string is written plain only when YAML would read it back as that same string. */
static void cfg_fmt_string(const char *s, char *buf, size_t n) {
    static const char *const words[] = {"true", "false", "null", "yes", "no", "on", "off"};
    int plain = (s[0] >= 'A' && s[0] <= 'Z') || (s[0] >= 'a' && s[0] <= 'z') || s[0] == '_' ||
                s[0] == '/' || s[0] == '.';
    for (const char *c = s; plain && *c; c++)
        plain = strchr("_./-+", *c) || (*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'z') ||
                (*c >= 'A' && *c <= 'Z');
    for (size_t i = 0; plain && i < sizeof words / sizeof words[0]; i++)
        plain = strcasecmp(s, words[i]) != 0;
    if (plain) {
        snprintf(buf, n, "%s", s);
        return;
    }
    size_t used = 0;
    buf[used++] = '"';
    for (const unsigned char *c = (const unsigned char *)s; *c && used + 6 < n; c++) {
        if (*c == '"' || *c == '\\') {
            buf[used++] = '\\';
            buf[used++] = (char)*c;
        } else if (*c < 0x20 || *c == 0x7f) {
            used += (size_t)snprintf(buf + used, n - used, "\\x%02x", *c);
        } else {
            buf[used++] = (char)*c;
        }
    }
    buf[used++] = '"';
    buf[used] = '\0';
}

static void cfg_fmt_value(const tpd_config *cfg, const tpd_cfg_key *k, char *buf, size_t n) {
    const void *field = (const char *)cfg + k->offset;
    if (k->type == TPD_CFG_INT)
        snprintf(buf, n, "%d", *(const int *)field);
    else if (k->type == TPD_CFG_INT64)
        snprintf(buf, n, "%" PRId64, *(const int64_t *)field);
    else if (k->type == TPD_CFG_UINT64)
        snprintf(buf, n, "%" PRIu64, *(const uint64_t *)field);
    else if (k->type == TPD_CFG_DOUBLE)
        tpd_cfg_fmt_double(*(const double *)field, buf, n);
    else if (k->type == TPD_CFG_BOOL)
        snprintf(buf, n, "%s", *(const int *)field ? "true" : "false");
    else if (k->type == TPD_CFG_ENUM) {
        const char *name = enum_name(k->choices, *(const int *)field);
        snprintf(buf, n, "%s", name ? name : "?");
    } else if (k->type == TPD_CFG_STRING || k->type == TPD_CFG_SPLIT)
        cfg_fmt_string(field, buf, n);
    else { /* the one list, parallel.pipeline_layers */
        size_t used = (size_t)snprintf(buf, n, "[");
        for (int i = 0; i < cfg->parallel.num_pipeline_layers && used < n; i++)
            used += (size_t)snprintf(buf + used, n - used, "%s%d", i ? ", " : "",
                                     cfg->parallel.pipeline_layers[i]);
        if (used < n) snprintf(buf + used, n - used, "]");
    }
}

void tpd_config_print(const tpd_config *cfg, FILE *f) {
    /* Wide enough for the longest string (4 bytes per escaped char) or list. */
    char value[4 * TPD_CONFIG_STR + 16], line[4 * TPD_CONFIG_STR + 128];
    if (cfg->source_path[0]) fprintf(f, "# resolved from %s\n", cfg->source_path);
    for (int s = 0; s < tpd_cfg_nsections; s++) {
        const tpd_cfg_section *sec = &tpd_cfg_sections[s];
        size_t len = strlen(sec->name);
        snprintf(line, sizeof line, "%s:", sec->name);
        fprintf(f, "%s%-46s # %s\n", s ? "\n" : "", line, sec->desc);
        for (int i = 0; i < tpd_cfg_nkeys; i++) {
            const tpd_cfg_key *k = &tpd_cfg_keys[i];
            if (strncmp(k->name, sec->name, len) != 0 || k->name[len] != '.') continue;
            cfg_fmt_value(cfg, k, value, sizeof value);
            snprintf(line, sizeof line, "  %s: %s", tpd_cfg_bare(k->name), value);
            fprintf(f, "%-46s # %s\n", line, k->desc);
        }
    }
}
