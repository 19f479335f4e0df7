// Configuration: defaults, the shipped configs, overrides, the printed YAML reading back
// as the same config, one exact message per bad config (from the library and from the
// `tripod config show` command line), and the world-size and trainability checks.
#include <gtest/gtest.h>

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "common/run.h"

extern "C" {
#include "engine/config/config.h"
}

namespace {

const std::string kSource = TPD_SOURCE_DIR;
const std::string kBadDir = kSource + "/tests/engine/config/bad_configs/";

std::string ConfigPath(const std::string &name) {
    return kSource + "/configs/" + name;
}

struct Loaded {
    tpd_status st;
    std::string err;
    tpd_config cfg;
};

// path empty: defaults only.
Loaded Load(const std::string &path, const std::vector<std::string> &overrides = {}) {
    std::vector<const char *> ov;
    for (const std::string &o : overrides)
        ov.push_back(o.c_str());
    Loaded r;
    std::memset(&r.cfg, 0, sizeof r.cfg);
    tpd_last_error_clear(); // what the load logs, and "" when it logs nothing
    r.st =
        tpd_config_load(path.empty() ? nullptr : path.c_str(), (int)ov.size(), ov.data(), &r.cfg);
    r.err = tpd_last_error();
    return r;
}

std::string Print(const tpd_config &cfg) {
    char *buf = nullptr;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    tpd_config_print(&cfg, f);
    fclose(f);
    std::string s(buf, len);
    free(buf);
    return s;
}

std::vector<std::string> YamlFilesIn(const std::string &dir) {
    std::vector<std::string> names;
    DIR *d = opendir(dir.c_str());
    if (!d) return names;
    while (struct dirent *e = readdir(d)) {
        std::string n = e->d_name;
        if (n.size() > 5 && n.compare(n.size() - 5, 5, ".yaml") == 0) names.push_back(n);
    }
    closedir(d);
    std::sort(names.begin(), names.end());
    return names;
}

void ExpectSameConfig(const tpd_config &a, const tpd_config &b) {
#define SAME(f) EXPECT_EQ(a.f, b.f) << #f
#define SAME_STR(f) EXPECT_STREQ(a.f, b.f) << #f
    SAME(model.num_layers);
    SAME(model.hidden_size);
    SAME(model.num_attention_heads);
    SAME(model.ffn_hidden_size);
    SAME(model.vocab_size);
    SAME(model.seq_length);
    SAME(model.max_position_embeddings);
    SAME(model.init_method_std);
    SAME(model.make_vocab_size_divisible_by);
    SAME(model.normalization);
    SAME(model.norm_epsilon);
    SAME(model.position_embedding_type);
    SAME(model.rotary_base);
    SAME(model.rotary_percent);
    SAME(model.swiglu);
    SAME(model.group_query_attention);
    SAME(model.num_query_groups);
    SAME(model.untie_embeddings_and_output_weights);
    SAME(model.add_bias_linear);
    SAME(parallel.tensor_model_parallel_size);
    SAME(parallel.pipeline_model_parallel_size);
    SAME(parallel.data_parallel_size);
    SAME(parallel.num_pipeline_layers);
    for (int i = 0; i < TPD_CONFIG_MAX_STAGES; i++)
        SAME(parallel.pipeline_layers[i]);
    SAME(parallel.use_distributed_optimizer);
    SAME(parallel.ddp_bucket_size);
    SAME(parallel.sequence_parallel);
    SAME(parallel.virtual_pipeline_model_parallel_size);
    SAME(parallel.pipeline_schedule);
    SAME(training.micro_batch_size);
    SAME(training.global_batch_size);
    SAME(training.train_iters);
    SAME(training.seed);
    SAME(training.precision);
    SAME(training.device);
    SAME(training.recompute);
    SAME(training.recompute_num_layers);
    SAME(training.exit_interval);
    SAME(logging.log_params_norm);
    SAME(logging.log_timers);
    SAME(training.exit_duration_in_mins);
    SAME(optimizer.lr_wsd_decay_iters);
    SAME(optimizer.lr_wsd_decay_style);
    SAME(training.attention);
    SAME(training.num_threads);
    SAME(optimizer.lr);
    SAME(optimizer.min_lr);
    SAME(optimizer.lr_decay_style);
    SAME(optimizer.lr_warmup_iters);
    SAME(optimizer.lr_decay_iters);
    SAME(optimizer.weight_decay);
    SAME(optimizer.adam_beta1);
    SAME(optimizer.adam_beta2);
    SAME(optimizer.adam_eps);
    SAME(optimizer.clip_grad);
    SAME_STR(data.data_path);
    SAME(data.shuffle);
    SAME_STR(data.split);
    SAME(logging.log_interval);
    SAME_STR(logging.metrics_file);
    SAME(logging.eval_interval);
    SAME(logging.eval_iters);
    SAME_STR(logging.trace_file);
    SAME(logging.overwrite);
    SAME_STR(checkpoint.save);
    SAME_STR(checkpoint.load);
    SAME(checkpoint.save_interval);
    SAME(checkpoint.keep_last);
    SAME(checkpoint.fallback);
    SAME(checkpoint.finetune);
    SAME(comm.timeout_s);
#undef SAME
#undef SAME_STR
}

// Prints cfg, loads the text back and expects the same config.
void ExpectRoundTrip(const tpd_config &cfg, const std::string &tag) {
    SCOPED_TRACE(tag);
    std::string text = Print(cfg);
    std::string path = ::testing::TempDir() + "tripod_config_roundtrip.yaml";
    {
        std::ofstream out(path);
        out << text;
    }
    Loaded back = Load(path);
    ASSERT_EQ(back.st, TPD_OK) << back.err << "\n" << text;
    ExpectSameConfig(cfg, back.cfg);
    EXPECT_EQ(back.cfg.source_path, path);
    std::remove(path.c_str());
}

// Each bad config and the message it must produce, after its path.
struct BadCase {
    const char *file;
    const char *message;
};

const BadCase kBadCases[] = {
    {"unknown_key.yaml", ":3:3: model.num_layer: unknown key (did you mean 'model.num_layers'?)"},
    {"unknown_key_wrong_section.yaml",
     ":13:3: training.lr: unknown key (did you mean 'optimizer.lr'?)"},
    {"unknown_key_no_suggestion.yaml",
     ":15:3: optimizer.learning_rate_schedule: unknown key ('tripod config show' lists the "
     "keys)"},
    {"unknown_section.yaml", ":2:1: modle: unknown section (did you mean 'model'?)"},
    {"top_level_key.yaml", ":2:1: num_layers: unknown section (did you mean 'model.num_layers'?)"},
    {"section_not_mapping.yaml", ":14:7: data: got a scalar (a section is a mapping of keys)"},
    {"duplicate_section.yaml", ":14:1: model: duplicate section (first on line 2)"},
    {"duplicate_key.yaml", ":8:3: model.num_layers: duplicate key (first set on line 3)"},
    {"yaml_syntax.yaml", ":16:29: YAML syntax error: did not find expected ',' or ']' (while "
                         "parsing a flow sequence at 15:20)"},
    {"type_int.yaml",
     ":3:15: model.num_layers: 'twelve' is not an integer (expected an integer in [1, 1024])"},
    {"type_int_fraction.yaml",
     ":4:16: model.hidden_size: '768.5' is not an integer (expected an integer in [1, 262144])"},
    {"type_int_overflow.yaml", ":6:15: model.vocab_size: '99999999999' does not fit in 32 bits "
                               "(expected an integer in [1, 16777216])"},
    {"type_number.yaml", ":15:7: optimizer.lr: 'fast' is not a number (expected a number >= 0)"},
    {"type_bool.yaml", ":15:12: data.shuffle: 'yes' is not a boolean (expected true or false)"},
    {"type_sequence.yaml",
     ":7:15: model.seq_length: got a sequence (expected an integer in [1, 1048576])"},
    {"type_list_entry.yaml", ":16:24: parallel.pipeline_layers: 'six' is not an integer "
                             "(expected a list of integers in [1, 1024], e.g. [3, 5])"},
    {"no_value.yaml", ":15:6: optimizer.lr: has no value (expected a number >= 0)"},
    {"range_num_layers.yaml",
     ":3:15: model.num_layers: 0 is out of range (expected an integer in [1, 1024])"},
    {"range_beta1.yaml",
     ":15:15: optimizer.adam_beta1: 1.0 is out of range (expected a number in [0, 1))"},
    {"range_lr.yaml", ":15:7: optimizer.lr: -1.0e-3 is out of range (expected a number >= 0)"},
    {"range_pipeline_layers.yaml", ":16:25: parallel.pipeline_layers: 0 is out of range "
                                   "(expected a list of integers in [1, 1024], e.g. [3, 5])"},
    {"enum_decay.yaml", ":15:19: optimizer.lr_decay_style: 'cosin' is not allowed (expected "
                        "one of cosine, linear, constant, inverse-square-root, WSD)"},
    {"enum_precision.yaml",
     ":13:14: training.precision: 'fp16' is not allowed (expected one of fp32, bf16)"},
    {"missing_required.yaml",
     ": model.vocab_size: required key is missing (every config file must set it)"},
    {"hidden_heads.yaml", ":4:16: model.hidden_size: hidden_size (770) must be a multiple of "
                          "num_attention_heads (12) (or set model.kv_channels, the head size)"},
    {"heads_tp.yaml", ":5:24: model.num_attention_heads: num_attention_heads (12) must be a "
                      "multiple of tensor_model_parallel_size (8)"},
    {"blend_pairs.yaml", ":15:14: data.data_path: '0.3 data/a 0.7' must be pairs of WEIGHT "
                         "PREFIX (at most 256 pairs)"},
    {"recompute_layers.yaml", ":14:25: training.recompute_num_layers: 2 needs training.recompute "
                              "full, not selective (it picks the layers whose full recompute "
                              "is done)"},
    {"wsd_iters.yaml", ":15:19: optimizer.lr_wsd_decay_iters: WSD needs 1 <= lr_wsd_decay_iters "
                       "(0) <= the iterations after warmup (100)"},
    {"sp_seq.yaml", ":16:22: parallel.sequence_parallel: seq_length (1022) must be a multiple "
                    "of tensor_model_parallel_size (4) (sequence parallel splits the sequence "
                    "over the TP ranks)"},
    {"ffn_tp.yaml", ":8:20: model.ffn_hidden_size: ffn_hidden_size (3001) must be a multiple of "
                    "tensor_model_parallel_size (2)"},
    {"layers_pp.yaml",
     ":3:15: model.num_layers: num_layers (10) is not divisible by pipeline_model_parallel_size "
     "(4) (Number of layers should be divisible by the pipeline-model-parallel size, or set "
     "parallel.pipeline_layers)"},
    {"pipeline_layers_count.yaml", ":16:20: parallel.pipeline_layers: has 3 entries but "
                                   "pipeline_model_parallel_size is 2 (one entry per stage)"},
    {"pipeline_layers_sum.yaml", ":16:20: parallel.pipeline_layers: entries sum to 10 but "
                                 "num_layers is 12 (they must sum to num_layers)"},
    {"seq_max_pos.yaml", ":7:15: model.seq_length: seq_length (2048) must be <= "
                         "max_position_embeddings (1024)"},
    {"gbs_mbs.yaml", ":11:22: training.global_batch_size: global_batch_size (30) must be a "
                     "multiple of micro_batch_size (4)"},
    {"min_lr.yaml", ":16:11: optimizer.min_lr: min_lr (0.01) must be <= lr (0.001)"},
    {"split_bad.yaml", ":15:10: data.split: '949,50' is not a valid split (expected three "
                       "non-negative integers 'train,valid,test' with train > 0)"},
    {"vpp_schedule.yaml",
     ":16:41: parallel.virtual_pipeline_model_parallel_size: 2 needs pipeline_schedule "
     "interleaved (or 1f1b, which it makes interleaved), not zb-h1 (zb-h1 runs one model chunk "
     "per stage)"},
    {"vpp_layers.yaml",
     ":3:15: model.num_layers: num_layers (12) is not divisible by pipeline_model_parallel_size "
     "* virtual_pipeline_model_parallel_size (2 * 4 = 8) (every model chunk needs the same "
     "number of layers, or set parallel.pipeline_layers per virtual stage)"},
    {"vpp_interleaved_v1.yaml",
     ":16:22: parallel.pipeline_schedule: interleaved needs virtual_pipeline_model_parallel_size "
     "> 1 (the model chunks per stage that it interleaves)"},
    {"vpp_pp1.yaml",
     ":15:41: parallel.virtual_pipeline_model_parallel_size: 2 needs "
     "pipeline_model_parallel_size > 1 (the model chunks interleave across the pipeline's "
     "stages)"},
    {"vpp_pipeline_layers.yaml",
     ":17:20: parallel.pipeline_layers: has 2 entries but pipeline_model_parallel_size * "
     "virtual_pipeline_model_parallel_size is 2 * 2 = 4 (one entry per virtual stage, in "
     "Megatron's order: chunk 0 of every stage, then chunk 1, ...)"},
    {"schedule_enum.yaml", ":16:22: parallel.pipeline_schedule: 'zb-h2' is not allowed "
                           "(expected one of 1f1b, interleaved, zb-h1)"},
    {"zb_h1_recompute.yaml",
     ":17:22: parallel.pipeline_schedule: zb-h1 cannot run with training.recompute full: W needs "
     "the layer activations that full recompute drops after B (use selective or none)"},
    {"overlap_grad_type.yaml",
     ":15:24: parallel.overlap_grad_reduce: '1' is not a boolean (expected true or false)"},
    {"overlap_param_type.yaml", ":16:25: parallel.overlap_param_gather: 'sometimes' is not a "
                                "boolean (expected true or false)"},
    // the Llama block: relations
    {"gqa_heads_groups.yaml",
     ":9:21: model.num_query_groups: num_attention_heads (8) must be a multiple of "
     "num_query_groups (3) (each K/V head serves an equal group of query heads)"},
    {"gqa_groups_tp.yaml",
     ":9:21: model.num_query_groups: num_query_groups (2) must be a multiple of "
     "tensor_model_parallel_size (4): the K/V heads are split over the TP ranks by whole groups "
     "and never replicated (use tensor_model_parallel_size 2, or more query groups)"},
    {"gqa_groups_without_gqa.yaml",
     ":8:21: model.num_query_groups: 2 needs group_query_attention true; without it every query "
     "head has its own K/V head (8 of them) (set model.group_query_attention: true, or leave "
     "num_query_groups out)"},
    {"rope_odd_head.yaml",
     ":8:28: model.position_embedding_type: rope needs an even head size, but hidden_size / "
     "num_attention_heads = 72 / 8 = 9 (RoPE rotates pairs of a head's dimensions)"},
    {"rotary_percent.yaml",
     ":9:19: model.rotary_percent: 0.5 is not supported: RoPE rotates whole heads here (1.0, as "
     "in Llama); partial rotary (GPT-NeoX's, Megatron's --rotary-percent below 1) is "
     "refused"},
    {"swiglu_ffn_unset.yaml",
     ":8:11: model.ffn_hidden_size: swiglu needs ffn_hidden_size set: 0 means 4*hidden_size "
     "(1024), GPT's MLP width, but a SwiGLU MLP has three matrices and Llama's width is about "
     "8/3*hidden_size (e.g. 14336 at hidden_size 4096)"},
    {"rope_seq_max_pos.yaml",
     ":7:15: model.seq_length: seq_length (4096) must be <= max_position_embeddings (2048) "
     "(with rope it bounds the positions the model trains and generates at, as in Megatron)"},
    // the Llama block: each key's type or enum
    {"enum_normalization.yaml", ":8:18: model.normalization: 'rmsnorm' is not allowed (expected "
                                "one of LayerNorm, RMSNorm)"},
    {"range_norm_epsilon.yaml",
     ":8:17: model.norm_epsilon: 0 is out of range (expected a number > 0)"},
    {"enum_position_embedding.yaml", ":8:28: model.position_embedding_type: 'rotary' is not "
                                     "allowed (expected one of learned_absolute, rope)"},
    {"type_rotary_base.yaml",
     ":8:16: model.rotary_base: '500k' is not a number (expected a number > 0)"},
    {"type_rotary_percent.yaml",
     ":8:19: model.rotary_percent: 'half' is not a number (expected a number > 0)"},
    {"type_swiglu.yaml", ":8:11: model.swiglu: 'yes' is not a boolean (expected true or false)"},
    {"type_group_query_attention.yaml", ":8:26: model.group_query_attention: '1' is not a "
                                        "boolean (expected true or false)"},
    {"range_num_query_groups.yaml",
     ":8:21: model.num_query_groups: 0 is out of range (expected an integer in [1, 4096])"},
    {"type_untie.yaml", ":8:40: model.untie_embeddings_and_output_weights: 'on' is not a boolean "
                        "(expected true or false)"},
    {"type_add_bias_linear.yaml",
     ":8:20: model.add_bias_linear: 'none' is not a boolean (expected true or false)"},
    // DiLoCo's fragment schedule
    {"diloco_fragments.yaml", ":16:14: diloco.fragments: 4 must divide sync_interval (10): "
                              "Streaming DiLoCo syncs the fragments sync_interval / fragments "
                              "steps apart"},
    {"diloco_overlap.yaml", ":17:18: diloco.overlap_steps: 5 must be below sync_interval / "
                            "fragments (20 / 4 = 5): a fragment's outer all-reduce is applied "
                            "before the next fragment's starts"},
    {"sharding_alias.yaml",
     ":14:36: parallel.data_parallel_sharding_strategy: optim_grads disagrees with "
     "parallel.use_distributed_optimizer: false (both are stated; use_distributed_optimizer is "
     "strategy optim's older name: set it true with optim, optim_grads or optim_grads_params, "
     "false with no_shard, or state only one of them)"},
};

TEST(Config, DefaultsAreMegatronLike) {
    tpd_config c;
    tpd_config_defaults(&c);
    EXPECT_EQ(c.model.ffn_hidden_size, 0);
    EXPECT_EQ(c.model.max_position_embeddings, 0);
    EXPECT_DOUBLE_EQ(c.model.init_method_std, 0.02);
    EXPECT_EQ(c.model.make_vocab_size_divisible_by, 128);
    // GPT-2's block unless a config asks for Llama's; Megatron's defaults for each key
    EXPECT_STREQ(tpd_config_choice("model.normalization", c.model.normalization), "LayerNorm");
    EXPECT_DOUBLE_EQ(c.model.norm_epsilon, 1e-5);
    EXPECT_STREQ(
        tpd_config_choice("model.position_embedding_type", c.model.position_embedding_type),
        "learned_absolute");
    EXPECT_DOUBLE_EQ(c.model.rotary_base, 10000.0);
    EXPECT_DOUBLE_EQ(c.model.rotary_percent, 1.0);
    EXPECT_EQ(c.model.swiglu, 0);
    EXPECT_EQ(c.model.group_query_attention, 0);
    EXPECT_EQ(c.model.num_query_groups, 1);
    EXPECT_EQ(c.model.untie_embeddings_and_output_weights, 0);
    EXPECT_EQ(c.model.add_bias_linear, 1);
    EXPECT_EQ(tpd_config_kv_heads(&c), c.model.num_attention_heads);
    EXPECT_EQ(c.parallel.tensor_model_parallel_size, 1);
    EXPECT_EQ(c.parallel.pipeline_model_parallel_size, 1);
    EXPECT_EQ(c.parallel.data_parallel_size, 0);
    EXPECT_EQ(c.parallel.num_pipeline_layers, 0);
    EXPECT_EQ(c.parallel.use_distributed_optimizer, 0);
    EXPECT_EQ(c.parallel.ddp_bucket_size, 40000000);
    EXPECT_EQ(c.parallel.sequence_parallel, 0);
    EXPECT_EQ(c.parallel.virtual_pipeline_model_parallel_size, 1);
    EXPECT_STREQ(tpd_config_choice("parallel.pipeline_schedule", c.parallel.pipeline_schedule),
                 "1f1b");
    EXPECT_EQ(c.training.seed, 1234u);
    EXPECT_STREQ(tpd_config_choice("training.precision", c.training.precision), "fp32");
    EXPECT_STREQ(tpd_config_choice("training.device", c.training.device), "cpu");
    EXPECT_STREQ(tpd_config_choice("training.recompute", c.training.recompute), "none");
    EXPECT_STREQ(tpd_config_choice("training.attention", c.training.attention), "fused");
    EXPECT_EQ(c.training.num_threads, 0);
    EXPECT_DOUBLE_EQ(c.optimizer.lr, 3e-4);
    EXPECT_DOUBLE_EQ(c.optimizer.min_lr, 0.0);
    EXPECT_STREQ(tpd_config_choice("optimizer.lr_decay_style", c.optimizer.lr_decay_style),
                 "cosine");
    EXPECT_EQ(c.optimizer.lr_warmup_iters, 0);
    EXPECT_EQ(c.optimizer.lr_decay_iters, 0);
    EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 0.1);
    EXPECT_DOUBLE_EQ(c.optimizer.adam_beta1, 0.9);
    EXPECT_DOUBLE_EQ(c.optimizer.adam_beta2, 0.95);
    EXPECT_DOUBLE_EQ(c.optimizer.adam_eps, 1e-8);
    EXPECT_DOUBLE_EQ(c.optimizer.clip_grad, 1.0);
    EXPECT_STREQ(c.data.data_path, "");
    EXPECT_EQ(c.data.shuffle, 1);
    EXPECT_STREQ(c.data.split, "949,50,1");
    EXPECT_EQ(c.logging.log_interval, 1);
    EXPECT_STREQ(c.logging.metrics_file, "");
    EXPECT_EQ(c.logging.eval_interval, 0);
    EXPECT_EQ(c.logging.eval_iters, 10);
    EXPECT_STREQ(c.logging.trace_file, "");
    EXPECT_STREQ(c.checkpoint.save, "");
    EXPECT_STREQ(c.checkpoint.load, "");
    EXPECT_EQ(c.checkpoint.save_interval, 0);
    EXPECT_EQ(c.checkpoint.keep_last, 0);
    EXPECT_STREQ(tpd_config_choice("checkpoint.fallback", c.checkpoint.fallback), "none");
    EXPECT_EQ(c.checkpoint.finetune, 0);
    EXPECT_DOUBLE_EQ(c.comm.timeout_s, 300.0);
    EXPECT_STREQ(c.source_path, "");
}

TEST(Config, DefaultsOnlyLoadPassesEveryCheckAndResolves) {
    tpd_config d;
    tpd_config_defaults(&d);
    Loaded r = Load("");
    ASSERT_EQ(r.st, TPD_OK) << r.err;
    EXPECT_EQ(r.err, "");
    EXPECT_EQ(r.cfg.model.ffn_hidden_size, 4 * d.model.hidden_size);
    EXPECT_EQ(r.cfg.model.max_position_embeddings, d.model.seq_length);
    r.cfg.model.ffn_hidden_size = 0;
    r.cfg.model.max_position_embeddings = 0;
    ExpectSameConfig(d, r.cfg);
    EXPECT_EQ(tpd_config_check_world(&r.cfg, 1), TPD_OK) << tpd_last_error();
    EXPECT_EQ(tpd_config_check_trainable(&r.cfg), TPD_OK) << tpd_last_error();
}

// A config built in code resolves its derived fields as a load does: from the fields set
// after the defaults, and only where they are still 0.
TEST(Config, ResolveFillsTheDerivedFieldsFromTheFieldsSetInCode) {
    tpd_config c;
    tpd_config_defaults(&c);
    c.model.hidden_size = 96;
    c.model.num_attention_heads = 6;
    c.model.seq_length = 48;
    tpd_last_error_clear();
    ASSERT_EQ(tpd_config_resolve(&c), TPD_OK) << tpd_last_error();
    EXPECT_STREQ(tpd_last_error(), "");
    EXPECT_EQ(c.model.ffn_hidden_size, 4 * 96);
    EXPECT_EQ(c.model.max_position_embeddings, 48);
    // resolved fields are stated ones now: a second resolve after a change keeps them
    c.model.hidden_size = 120;
    ASSERT_EQ(tpd_config_resolve(&c), TPD_OK) << tpd_last_error();
    EXPECT_EQ(c.model.ffn_hidden_size, 4 * 96);
    // values set in code win over the rules
    tpd_config s;
    tpd_config_defaults(&s);
    s.model.hidden_size = 96;
    s.model.ffn_hidden_size = 200;
    s.model.max_position_embeddings = 1024;
    ASSERT_EQ(tpd_config_resolve(&s), TPD_OK) << tpd_last_error();
    EXPECT_EQ(s.model.ffn_hidden_size, 200);
    EXPECT_EQ(s.model.max_position_embeddings, 1024);
    // a SwiGLU MLP has no default width: refused, the config untouched
    tpd_config g;
    tpd_config_defaults(&g);
    g.model.swiglu = 1;
    EXPECT_EQ(tpd_config_resolve(&g), TPD_ERR_INVALID);
    EXPECT_EQ(std::string(tpd_last_error())
                  .rfind("<defaults>: model.ffn_hidden_size: swiglu needs "
                         "ffn_hidden_size set: 0 means 4*hidden_size (256)",
                         0),
              0u)
        << tpd_last_error();
    EXPECT_EQ(g.model.ffn_hidden_size, 0);
    EXPECT_EQ(g.model.max_position_embeddings, 0);
    EXPECT_EQ(tpd_config_resolve(&g), TPD_ERR_INVALID); // refused again, logged again
    // a width built in code past what 4x fits in an int
    tpd_config w;
    tpd_config_defaults(&w);
    w.model.hidden_size = INT32_MAX / 4 + 1;
    EXPECT_EQ(tpd_config_resolve(&w), TPD_ERR_INVALID);
    EXPECT_EQ(std::string(tpd_last_error())
                  .rfind("<defaults>: model.hidden_size: 536870912 is too large", 0),
              0u)
        << tpd_last_error();
    EXPECT_EQ(w.model.ffn_hidden_size, 0);
}

// The same model stated in a file and built in code is the same config after each path.
TEST(Config, LoadedFromYamlEqualsBuiltInCode) {
    tpd_config code;
    tpd_config_defaults(&code);
    // each key as the file states it and the field code sets
    const struct {
        const char *section, *key;
        int value;
        int *field;
    } keys[] = {
        {"model", "num_layers", 3, &code.model.num_layers},
        {"model", "hidden_size", 96, &code.model.hidden_size},
        {"model", "num_attention_heads", 6, &code.model.num_attention_heads},
        {"model", "vocab_size", 300, &code.model.vocab_size},
        {"model", "seq_length", 48, &code.model.seq_length},
        {"training", "micro_batch_size", 2, &code.training.micro_batch_size},
        {"training", "global_batch_size", 8, &code.training.global_batch_size},
        {"training", "train_iters", 5, &code.training.train_iters},
    };
    std::string path =
        ::testing::TempDir() + "tripod_config_resolve_" + std::to_string(getpid()) + ".yaml";
    {
        std::ofstream out(path);
        std::string section;
        for (const auto &k : keys) {
            if (section != k.section) out << (section = k.section) << ":\n";
            out << "  " << k.key << ": " << k.value << "\n";
            *k.field = k.value;
        }
    }
    Loaded file = Load(path);
    std::remove(path.c_str());
    ASSERT_EQ(file.st, TPD_OK) << file.err;
    ASSERT_EQ(tpd_config_resolve(&code), TPD_OK);
    EXPECT_EQ(file.cfg.model.ffn_hidden_size, 384);
    EXPECT_EQ(file.cfg.model.max_position_embeddings, 48);
    ExpectSameConfig(file.cfg, code);
}

TEST(Config, EveryShippedConfigLoadsAndIsTrainable) {
    std::vector<std::string> names = YamlFilesIn(kSource + "/configs");
    for (const char *want : {"demo.yaml", "gpt2-124m.yaml", "gpt2-350m.yaml", "gpt2-1.5b.yaml",
                             "gpt3-175b.yaml", "gpt-1t.yaml", "demo-llama.yaml", "llama3-8b.yaml",
                             "llama3-70b.yaml", "llama3-405b.yaml"})
        EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
    for (const std::string &n : names) {
        Loaded r = Load(ConfigPath(n));
        EXPECT_EQ(r.st, TPD_OK) << n << ": " << r.err;
        EXPECT_EQ(std::string(r.cfg.source_path), ConfigPath(n));
        // (mixtral-8x7b.yaml, MoE in bf16 on cuda, included)
        EXPECT_EQ(tpd_config_check_trainable(&r.cfg), TPD_OK) << n << ": " << tpd_last_error();
    }
}

TEST(Config, DemoRunsOnEightRanksAsTwoByTwoByTwo) {
    Loaded r = Load(ConfigPath("demo.yaml"));
    ASSERT_EQ(r.st, TPD_OK) << r.err;
    const tpd_config &c = r.cfg;
    EXPECT_EQ(c.model.num_layers, 4);
    EXPECT_EQ(c.model.hidden_size, 128);
    EXPECT_EQ(c.model.num_attention_heads, 4);
    EXPECT_EQ(c.model.vocab_size, 257);
    EXPECT_EQ(c.model.seq_length, 128);
    EXPECT_EQ(c.model.ffn_hidden_size, 512);
    EXPECT_EQ(c.model.max_position_embeddings, 128);
    EXPECT_EQ(c.training.micro_batch_size, 4);
    EXPECT_EQ(c.training.global_batch_size, 64);
    EXPECT_EQ(c.training.train_iters, 300);
    EXPECT_DOUBLE_EQ(c.optimizer.lr, 3e-3);
    EXPECT_DOUBLE_EQ(c.optimizer.min_lr, 3e-4);
    EXPECT_EQ(c.optimizer.lr_warmup_iters, 30);
    EXPECT_STREQ(c.data.data_path, "data/fortunes");
    EXPECT_STREQ(c.logging.metrics_file, "runs/demo/metrics.jsonl");
    EXPECT_EQ(c.logging.eval_interval, 100);
    EXPECT_EQ(c.logging.eval_iters, 4);
    EXPECT_EQ(c.logging.log_interval, 10);
    EXPECT_EQ(tpd_config_padded_vocab(&c, 1), 320);
    EXPECT_EQ(tpd_config_padded_vocab(&c, 2), 384);

    Loaded t = Load(ConfigPath("demo.yaml"), {"parallel.tensor_model_parallel_size=2",
                                              "parallel.pipeline_model_parallel_size=2"});
    ASSERT_EQ(t.st, TPD_OK) << t.err;
    EXPECT_EQ(tpd_config_check_world(&t.cfg, 8), TPD_OK) << tpd_last_error();
    EXPECT_EQ(tpd_config_check_trainable(&t.cfg), TPD_OK) << tpd_last_error();
    EXPECT_EQ(tpd_config_dp(&t.cfg, 8), 2);
    EXPECT_EQ(tpd_config_num_micro_batches(&t.cfg, 2), 8);
    EXPECT_EQ(tpd_config_check_world(&r.cfg, 1), TPD_OK) << tpd_last_error();
    EXPECT_EQ(tpd_config_num_micro_batches(&r.cfg, tpd_config_dp(&r.cfg, 1)), 16);
}

// Llama 3's published shapes (Dubey et al. 2024, Table 3).
TEST(Config, Llama3PresetsHaveThePublishedShapes) {
    const struct {
        const char *file;
        int layers, hidden, heads, ffn;
    } presets[] = {
        {"llama3-8b.yaml", 32, 4096, 32, 14336},
        {"llama3-70b.yaml", 80, 8192, 64, 28672},
        {"llama3-405b.yaml", 126, 16384, 128, 53248},
    };
    for (const auto &p : presets) {
        SCOPED_TRACE(p.file);
        Loaded r = Load(ConfigPath(p.file));
        ASSERT_EQ(r.st, TPD_OK) << r.err;
        const tpd_config_model &m = r.cfg.model;
        EXPECT_EQ(m.num_layers, p.layers);
        EXPECT_EQ(m.hidden_size, p.hidden);
        EXPECT_EQ(m.num_attention_heads, p.heads);
        EXPECT_EQ(m.ffn_hidden_size, p.ffn);
        EXPECT_EQ(m.vocab_size, 128256);
        EXPECT_EQ(m.seq_length, 8192);
        EXPECT_EQ(m.max_position_embeddings, 8192);
        EXPECT_EQ(m.hidden_size / m.num_attention_heads, 128);
        EXPECT_TRUE(m.group_query_attention);
        EXPECT_EQ(tpd_config_kv_heads(&r.cfg), 8);
        EXPECT_TRUE(m.swiglu);
        EXPECT_EQ(m.normalization, TPD_NORM_RMSNORM);
        EXPECT_DOUBLE_EQ(m.norm_epsilon, 1e-5);
        EXPECT_EQ(m.position_embedding_type, TPD_POS_ROPE);
        EXPECT_DOUBLE_EQ(m.rotary_base, 500000.0);
        EXPECT_DOUBLE_EQ(m.rotary_percent, 1.0);
        EXPECT_TRUE(m.untie_embeddings_and_output_weights);
        EXPECT_FALSE(m.add_bias_linear);
        EXPECT_EQ(r.cfg.training.precision, TPD_PRECISION_BF16);
        EXPECT_EQ(r.cfg.training.device, TPD_DEVICE_CUDA);
        // 16M tokens per step: Table 4's batch (published for 405B; assumed for 8B and 70B)
        EXPECT_EQ((long)r.cfg.training.global_batch_size * m.seq_length, 16777216L);
    }
}

// The Llama demo trains what the GPT-2 demo trains (data, steps, batch, context, schedule),
// with the Llama block at about the same parameter count, and runs TP2 x PP2 on 8 ranks.
TEST(Config, DemoLlamaTrainsWhatTheDemoTrains) {
    Loaded g = Load(ConfigPath("demo.yaml"));
    Loaded l = Load(ConfigPath("demo-llama.yaml"));
    ASSERT_EQ(g.st, TPD_OK) << g.err;
    ASSERT_EQ(l.st, TPD_OK) << l.err;
    EXPECT_STREQ(l.cfg.data.data_path, g.cfg.data.data_path);
    EXPECT_STREQ(l.cfg.data.split, g.cfg.data.split);
    EXPECT_EQ(l.cfg.training.train_iters, g.cfg.training.train_iters);
    EXPECT_EQ(l.cfg.training.global_batch_size, g.cfg.training.global_batch_size);
    EXPECT_EQ(l.cfg.training.micro_batch_size, g.cfg.training.micro_batch_size);
    EXPECT_EQ(l.cfg.training.seed, g.cfg.training.seed);
    EXPECT_EQ(l.cfg.model.seq_length, g.cfg.model.seq_length);
    EXPECT_EQ(l.cfg.model.vocab_size, g.cfg.model.vocab_size);
    EXPECT_EQ(l.cfg.model.hidden_size, g.cfg.model.hidden_size);
    EXPECT_EQ(l.cfg.model.num_layers, g.cfg.model.num_layers);
    EXPECT_DOUBLE_EQ(l.cfg.optimizer.lr, g.cfg.optimizer.lr);
    EXPECT_DOUBLE_EQ(l.cfg.optimizer.min_lr, g.cfg.optimizer.min_lr);
    EXPECT_EQ(l.cfg.optimizer.lr_warmup_iters, g.cfg.optimizer.lr_warmup_iters);
    EXPECT_EQ(l.cfg.logging.eval_interval, g.cfg.logging.eval_interval);
    EXPECT_EQ(l.cfg.logging.eval_iters, g.cfg.logging.eval_iters);
    // 2 K/V groups of 4 query heads
    const tpd_config_model &m = l.cfg.model;
    EXPECT_TRUE(m.group_query_attention);
    EXPECT_EQ(m.num_attention_heads, 8);
    EXPECT_EQ(tpd_config_kv_heads(&l.cfg), 2);
    EXPECT_EQ(m.normalization, TPD_NORM_RMSNORM);
    EXPECT_EQ(m.position_embedding_type, TPD_POS_ROPE);
    EXPECT_TRUE(m.swiglu);
    EXPECT_TRUE(m.untie_embeddings_and_output_weights);
    EXPECT_FALSE(m.add_bias_linear);
    // its own run directory
    EXPECT_STRNE(l.cfg.checkpoint.save, g.cfg.checkpoint.save);
    EXPECT_STRNE(l.cfg.logging.metrics_file, g.cfg.logging.metrics_file);

    Loaded t = Load(ConfigPath("demo-llama.yaml"), {"parallel.tensor_model_parallel_size=2",
                                                    "parallel.pipeline_model_parallel_size=2"});
    ASSERT_EQ(t.st, TPD_OK) << t.err;
    EXPECT_EQ(tpd_config_check_world(&t.cfg, 8), TPD_OK) << tpd_last_error();
    EXPECT_EQ(tpd_config_check_trainable(&t.cfg), TPD_OK) << tpd_last_error();
    // TP 4 would need K/V heads replicated: a config error that names the file's line
    Loaded tp4 = Load(ConfigPath("demo-llama.yaml"), {"parallel.tensor_model_parallel_size=4"});
    EXPECT_EQ(tp4.st, TPD_ERR_INVALID);
    EXPECT_NE(tp4.err.find("demo-llama.yaml:"), std::string::npos) << tp4.err;
    EXPECT_NE(tp4.err.find("model.num_query_groups: num_query_groups (2) must be a multiple of "
                           "tensor_model_parallel_size (4)"),
              std::string::npos)
        << tp4.err;
}

// What the Llama rules allow at their edges, and where their messages point.
TEST(Config, LlamaRulesAtTheirEdges) {
    // MHA spelled as grouped-query attention with one group per head
    Loaded mha = Load("", {"model.group_query_attention=true", "model.num_query_groups=4"});
    ASSERT_EQ(mha.st, TPD_OK) << mha.err;
    EXPECT_EQ(tpd_config_kv_heads(&mha.cfg), 4);
    // one group for all heads (multi-query attention) splits over no more than one TP rank
    Loaded mqa = Load("", {"model.group_query_attention=true"});
    ASSERT_EQ(mqa.st, TPD_OK) << mqa.err;
    EXPECT_EQ(tpd_config_kv_heads(&mqa.cfg), 1);
    Loaded mqa2 =
        Load("", {"model.group_query_attention=true", "parallel.tensor_model_parallel_size=2"});
    EXPECT_EQ(mqa2.st, TPD_ERR_INVALID);
    EXPECT_EQ(mqa2.err, "<override>: model.num_query_groups: num_query_groups (1) must be a "
                        "multiple of tensor_model_parallel_size (2): the K/V heads are split "
                        "over the TP ranks by whole groups and never replicated (use "
                        "tensor_model_parallel_size 1, or more query groups)");
    // without group_query_attention, a count equal to the heads says nothing new: allowed
    Loaded same = Load("", {"model.num_query_groups=4"});
    ASSERT_EQ(same.st, TPD_OK) << same.err;
    EXPECT_EQ(tpd_config_kv_heads(&same.cfg), 4);
    // the groups' line in the file is named though an override broke the relation
    std::string path = kBadDir + "gqa_groups_tp.yaml";
    Loaded ok = Load(path, {"parallel.tensor_model_parallel_size=2"});
    ASSERT_EQ(ok.st, TPD_OK) << ok.err;
    Loaded f = Load(path, {"parallel.tensor_model_parallel_size=8"});
    EXPECT_EQ(f.st, TPD_ERR_INVALID);
    EXPECT_EQ(f.err.rfind(path + ":9:21: model.num_query_groups: num_query_groups (2) must be a "
                                 "multiple of tensor_model_parallel_size (8)",
                          0),
              0u)
        << f.err;
    // SwiGLU with its width stated; stated rotary_percent 1.0; an even head size
    Loaded glu = Load("", {"model.swiglu=true", "model.ffn_hidden_size=172",
                           "model.position_embedding_type=rope", "model.rotary_percent=1.0"});
    ASSERT_EQ(glu.st, TPD_OK) << glu.err;
    EXPECT_EQ(glu.cfg.model.ffn_hidden_size, 172);
    // an explicit 0 is the unset width: refused, pointing at it
    Loaded zero = Load("", {"model.swiglu=true", "model.ffn_hidden_size=0"});
    EXPECT_EQ(zero.st, TPD_ERR_INVALID);
    EXPECT_EQ(zero.err.rfind("<override>: model.ffn_hidden_size: swiglu needs ffn_hidden_size set: "
                             "0 means 4*hidden_size (256)",
                             0),
              0u)
        << zero.err;
    // rope with a head size of 16 + 1: odd
    Loaded odd = Load("", {"model.position_embedding_type=rope", "model.hidden_size=68"});
    EXPECT_EQ(odd.st, TPD_ERR_INVALID);
    EXPECT_EQ(odd.err, "<override>: model.position_embedding_type: rope needs an even head size, "
                       "but hidden_size / num_attention_heads = 68 / 4 = 17 (RoPE rotates pairs "
                       "of a head's dimensions)");
    // learned positions: the head size may be odd
    EXPECT_EQ(Load("", {"model.hidden_size=68"}).st, TPD_OK);
}

TEST(Config, OverridesApplyAfterTheFileInOrder) {
    Loaded r = Load(ConfigPath("demo.yaml"),
                    {"model.num_layers=8", "optimizer.lr=1e-3", "optimizer.lr=5e-3",
                     "data.data_path=other/prefix", "parallel.pipeline_model_parallel_size=2",
                     "parallel.pipeline_layers=[3, 5]", "data.shuffle=false",
                     "training.seed=18446744073709551615", "checkpoint.save=\"\""});
    ASSERT_EQ(r.st, TPD_OK) << r.err;
    EXPECT_EQ(r.cfg.model.num_layers, 8);
    EXPECT_DOUBLE_EQ(r.cfg.optimizer.lr, 5e-3);
    EXPECT_STREQ(r.cfg.data.data_path, "other/prefix");
    EXPECT_EQ(r.cfg.data.shuffle, 0);
    EXPECT_EQ(r.cfg.training.seed, UINT64_MAX);
    EXPECT_STREQ(r.cfg.checkpoint.save, "");
    ASSERT_EQ(r.cfg.parallel.num_pipeline_layers, 2);
    EXPECT_EQ(r.cfg.parallel.pipeline_layers[0], 3);
    EXPECT_EQ(r.cfg.parallel.pipeline_layers[1], 5);
    EXPECT_EQ(r.cfg.model.hidden_size, 128); // untouched keys keep the file's value

    Loaded bare = Load(ConfigPath("demo.yaml"),
                       {"model.num_layers=8", "parallel.pipeline_model_parallel_size=2",
                        "parallel.pipeline_layers=6,2"});
    ASSERT_EQ(bare.st, TPD_OK) << bare.err;
    ASSERT_EQ(bare.cfg.parallel.num_pipeline_layers, 2);
    EXPECT_EQ(bare.cfg.parallel.pipeline_layers[0], 6);
    EXPECT_EQ(bare.cfg.parallel.pipeline_layers[1], 2);
    int first = -1;
    EXPECT_EQ(tpd_config_stage_layers(&bare.cfg, 2, 1, 1, TPD_CONFIG_ALL_CHUNKS, &first), 2);
    EXPECT_EQ(first, 6);

    Loaded cleared = Load("", {"parallel.pipeline_layers=[2]", "parallel.pipeline_layers=[]"});
    ASSERT_EQ(cleared.st, TPD_OK) << cleared.err;
    EXPECT_EQ(cleared.cfg.parallel.num_pipeline_layers, 0);
}

TEST(Config, OverrideErrorsUseTheSameRulesAsTheFile) {
    const struct {
        const char *override_;
        const char *message;
    } cases[] = {
        {"model.num_layers=abc", "<override>: model.num_layers: 'abc' is not an integer (expected "
                                 "an integer in [1, 1024])"},
        {"model.num_layer=3",
         "<override>: model.num_layer: unknown key (did you mean 'model.num_layers'?)"},
        {"num_layers=3", "<override>: num_layers: unknown key (did you mean 'model.num_layers'?)"},
        {"modle.num_layers=3",
         "<override>: modle.num_layers: unknown key (did you mean 'model.num_layers'?)"},
        {"model.num_layers", "<override>: 'model.num_layers' is not of the form section.key=value"},
        {"parallel.pipeline_layers=[3,x]",
         "<override>: parallel.pipeline_layers: 'x' is not an integer (expected a list of "
         "integers in [1, 1024], e.g. [3, 5])"},
        {"optimizer.adam_beta2=1",
         "<override>: optimizer.adam_beta2: 1 is out of range (expected a number in [0, 1))"},
        {"training.device=gpu",
         "<override>: training.device: 'gpu' is not allowed (expected one of cpu, cuda)"},
        {"training.seed=-1", "<override>: training.seed: '-1' is not a non-negative integer "
                             "(expected an integer)"},
        {"model.vocab_size=", "<override>: model.vocab_size: has no value (expected an integer "
                              "in [1, 16777216])"},
    };
    for (const auto &c : cases) {
        Loaded r = Load(ConfigPath("demo.yaml"), {c.override_});
        EXPECT_EQ(r.st, TPD_ERR_INVALID) << c.override_;
        EXPECT_EQ(r.err, c.message) << c.override_;
    }
}

TEST(Config, FileErrorsComeBeforeOverrideErrors) {
    Loaded r = Load(kBadDir + "type_int.yaml", {"model.num_layers=abc"});
    EXPECT_EQ(r.st, TPD_ERR_INVALID);
    EXPECT_EQ(r.err, kBadDir + "type_int.yaml:3:15: model.num_layers: 'twelve' is not an "
                               "integer (expected an integer in [1, 1024])");
}

TEST(Config, RelationErrorsPointAtWhereTheValueWasSet) {
    // Heads keep their default; the override that broke the relation is named.
    Loaded r = Load("", {"parallel.tensor_model_parallel_size=8"});
    EXPECT_EQ(r.st, TPD_ERR_INVALID);
    EXPECT_EQ(r.err, "<override>: model.num_attention_heads: num_attention_heads (4) must be a "
                     "multiple of tensor_model_parallel_size (8)");
    // Heads come from the file: their line is named even though an override broke it.
    std::string path = kBadDir + "gbs_mbs.yaml";
    Loaded f =
        Load(path, {"training.global_batch_size=32", "parallel.tensor_model_parallel_size=8"});
    EXPECT_EQ(f.st, TPD_ERR_INVALID);
    EXPECT_EQ(f.err, path + ":5:24: model.num_attention_heads: num_attention_heads (12) must be a "
                            "multiple of tensor_model_parallel_size (8)");
    // An override can also repair what the file got wrong.
    Loaded fixed = Load(path, {"training.global_batch_size=32"});
    EXPECT_EQ(fixed.st, TPD_OK) << fixed.err;
}

TEST(Config, MissingFileIsAnIoError) {
    std::string path = kBadDir + "no_such_file.yaml";
    Loaded r = Load(path);
    EXPECT_EQ(r.st, TPD_ERR_IO);
    EXPECT_EQ(r.err, path + ": cannot read: No such file or directory");
}

TEST(Config, FailedLoadLeavesTheOutputUntouched) {
    tpd_config c;
    std::memset(&c, 0x5a, sizeof c);
    tpd_config before;
    std::memcpy(&before, &c, sizeof c);
    const char *ov[] = {"model.num_layers=0"};
    EXPECT_EQ(tpd_config_load(nullptr, 1, ov, &c), TPD_ERR_INVALID);
    EXPECT_EQ(std::memcmp(&c, &before, sizeof c), 0);
}

TEST(Config, PrintedConfigLoadsBackTheSame) {
    for (const std::string &n : YamlFilesIn(kSource + "/configs")) {
        Loaded r = Load(ConfigPath(n));
        ASSERT_EQ(r.st, TPD_OK) << r.err;
        ExpectRoundTrip(r.cfg, n);
    }
    // Strings that YAML would read as something else unless quoted, odd doubles, a list.
    Loaded odd = Load(
        "", {"data.data_path=my data/a \"quoted\": part #not a comment\\x",
             "logging.metrics_file=true", "logging.trace_file=123", "checkpoint.save=-dash",
             "checkpoint.load=auto", "optimizer.lr=0.1", "optimizer.min_lr=3.3333333333333335e-05",
             "optimizer.adam_eps=1e-300", "comm.timeout_s=12.5", "model.num_layers=9",
             "parallel.pipeline_model_parallel_size=3", "parallel.pipeline_layers=[2,3,4]",
             "data.split=1, 0, 0", "parallel.ddp_bucket_size=10000000000",
             "training.seed=18446744073709551615", "data.shuffle=false"});
    ASSERT_EQ(odd.st, TPD_OK) << odd.err;
    EXPECT_STREQ(odd.cfg.data.data_path, "my data/a \"quoted\": part #not a comment\\x");
    EXPECT_STREQ(odd.cfg.data.split, "1,0,0");
    ExpectRoundTrip(odd.cfg, "odd values");
    // Quoted so that any YAML reader, not only ours, reads strings back as strings.
    std::string text = Print(odd.cfg);
    for (const char *line :
         {"  metrics_file: \"true\" ", "  trace_file: \"123\" ", "  save: \"-dash\" ",
          "  load: auto ", "  pipeline_layers: [2, 3, 4] "})
        EXPECT_NE(text.find(std::string("\n") + line), std::string::npos) << line << "\n" << text;
}

TEST(Config, PrintShowsEverySectionWithComments) {
    Loaded r = Load(ConfigPath("demo.yaml"));
    ASSERT_EQ(r.st, TPD_OK) << r.err;
    std::string text = Print(r.cfg);
    for (const char *line :
         {"model:", "  num_layers: 4 ", "  ffn_hidden_size: 512 ",
          "parallel:", "  pipeline_layers: [] ", "training:", "optimizer:", "  lr: 0.003 ",
          "  clip_grad: 1.0 ", "data:", "  data_path: data/fortunes ", "  split: \"949,50,1\" ",
          "logging:", "  trace_file: \"\" ", "checkpoint:", "comm:", "  timeout_s: 300.0 "})
        EXPECT_NE(text.find(std::string("\n") + line), std::string::npos) << line;
    EXPECT_NE(text.find("# transformer layers\n"), std::string::npos);
    EXPECT_LT(text.find("\nmodel:"), text.find("\ncomm:"));
}

TEST(Config, BadConfigsReportTheExactError) {
    std::set<std::string> listed;
    for (const BadCase &b : kBadCases) {
        std::string path = kBadDir + b.file;
        Loaded r = Load(path);
        EXPECT_NE(r.st, TPD_OK) << b.file;
        EXPECT_EQ(r.st, TPD_ERR_INVALID) << b.file;
        EXPECT_EQ(r.err, path + b.message) << b.file;
        listed.insert(b.file);
    }
    // Every file in the folder is checked here, and there are enough of them.
    std::vector<std::string> files = YamlFilesIn(kBadDir);
    EXPECT_GE(files.size(), 20u);
    for (const std::string &f : files)
        EXPECT_TRUE(listed.count(f)) << f << " has no expected message";
    EXPECT_EQ(listed.size(), files.size());
}

TEST(Config, TripodConfigShowExitsTwoOnEachBadConfig) {
    for (const BadCase &b : kBadCases) {
        std::string path = kBadDir + b.file;
        // stderr only (a bad config prints nothing to stdout)
        std::string out;
        int code =
            tpdtest::run({TPD_TRIPOD_BIN, "config", "show", path.c_str()}, TPD_SPAWN_STDERR, &out);
        EXPECT_EQ(code, 2) << b.file << ": " << out;
        std::string want = std::string("tripod: error: ") + path + b.message;
        EXPECT_NE(out.find(want), std::string::npos) << b.file << ":\n"
                                                     << out << "\nwant\n"
                                                     << want;
    }
}

TEST(Config, TripodConfigShowPrintsAGoodConfig) {
    std::string demo = ConfigPath("demo.yaml");
    std::string out;
    int code = tpdtest::run({TPD_TRIPOD_BIN, "config", "show", demo.c_str(), "model.num_layers=6"},
                            TPD_SPAWN_STDOUT | TPD_SPAWN_STDERR, &out);
    EXPECT_EQ(code, 0) << out;
    EXPECT_NE(out.find("num_layers: 6"), std::string::npos) << out;
    EXPECT_NE(out.find("data_path: data/fortunes"), std::string::npos) << out;
}

TEST(Config, CheckWorldUsesMegatronWording) {
    std::string path = ConfigPath("demo.yaml");
    const std::string tp2pp2[] = {"parallel.tensor_model_parallel_size=2",
                                  "parallel.pipeline_model_parallel_size=2"};

    Loaded r = Load(path, {tp2pp2[0], tp2pp2[1]});
    ASSERT_EQ(r.st, TPD_OK) << r.err;
    EXPECT_EQ(tpd_config_check_world(&r.cfg, 6), TPD_ERR_INVALID);
    EXPECT_EQ(std::string(tpd_last_error()),
              path + ": world size (6) is not divisible by total_model_size (4)");

    Loaded dp = Load(path, {tp2pp2[0], tp2pp2[1], "parallel.data_parallel_size=4"});
    ASSERT_EQ(dp.st, TPD_OK) << dp.err;
    EXPECT_EQ(tpd_config_check_world(&dp.cfg, 8), TPD_ERR_INVALID);
    EXPECT_EQ(std::string(tpd_last_error()),
              path + ": parallel.data_parallel_size (4) does not match world size (8) / "
                     "(tensor_model_parallel_size 2 * pipeline_model_parallel_size 2) = 2");
    EXPECT_EQ(tpd_config_check_world(&dp.cfg, 16), TPD_OK) << tpd_last_error();
    EXPECT_EQ(tpd_config_dp(&dp.cfg, 16), 4);

    Loaded gbs = Load(path);
    ASSERT_EQ(gbs.st, TPD_OK) << gbs.err;
    EXPECT_EQ(tpd_config_check_world(&gbs.cfg, 32), TPD_ERR_INVALID);
    EXPECT_EQ(std::string(tpd_last_error()),
              path + ": global batch size (64) is not divisible by micro "
                     "batch size (4) times data parallel size (32)");
    EXPECT_EQ(tpd_config_check_world(&gbs.cfg, 8), TPD_OK) << tpd_last_error();

    // Megatron's rule for the interleaved schedule: micro-batches a multiple of PP
    Loaded il = Load(path, {"parallel.pipeline_model_parallel_size=2",
                            "parallel.virtual_pipeline_model_parallel_size=2"});
    ASSERT_EQ(il.st, TPD_OK) << il.err;
    EXPECT_EQ(tpd_config_check_world(&il.cfg, 32), TPD_ERR_INVALID);
    EXPECT_EQ(std::string(tpd_last_error()),
              path + ": training.global_batch_size: the interleaved schedule needs the "
                     "micro-batches of a step (global_batch_size / (micro_batch_size * data "
                     "parallel size) = 64 / (4 * 16) = 1) to be a multiple of "
                     "pipeline_model_parallel_size (2): each group of 2 micro-batches walks the "
                     "model chunks together (Megatron's rule)");
    EXPECT_EQ(tpd_config_check_world(&il.cfg, 16), TPD_OK) << tpd_last_error();
}

TEST(Config, CheckTrainableRejectsPlannerOnlyKnobs) {
    // bf16 trains on both backends: the cpu one runs the cuda backend's recipe.
    std::string path = ConfigPath("demo.yaml");
    Loaded f = Load(path, {"training.precision=bf16"});
    ASSERT_EQ(f.st, TPD_OK) << f.err;
    EXPECT_EQ(tpd_config_check_trainable(&f.cfg), TPD_OK) << tpd_last_error();
    Loaded cuda = Load(path, {"training.precision=bf16", "training.device=cuda"});
    ASSERT_EQ(cuda.st, TPD_OK) << cuda.err;
    EXPECT_EQ(tpd_config_check_trainable(&cuda.cfg), TPD_OK) << tpd_last_error();
    // every schedule the planner models, the trainer runs
    for (std::vector<std::string> o :
         {std::vector<std::string>{"parallel.pipeline_model_parallel_size=2",
                                   "parallel.virtual_pipeline_model_parallel_size=2"},
          std::vector<std::string>{"parallel.pipeline_model_parallel_size=2",
                                   "parallel.virtual_pipeline_model_parallel_size=2",
                                   "parallel.pipeline_schedule=interleaved"},
          std::vector<std::string>{"parallel.pipeline_model_parallel_size=2",
                                   "parallel.pipeline_schedule=zb-h1"}}) {
        Loaded r = Load(path, o);
        ASSERT_EQ(r.st, TPD_OK) << r.err;
        EXPECT_EQ(tpd_config_check_trainable(&r.cfg), TPD_OK) << tpd_last_error();
        EXPECT_EQ(tpd_config_schedule(&r.cfg), o.size() == 2 && o[1].find("zb") != std::string::npos
                                                   ? TPD_SCHEDULE_ZB_H1
                                                   : TPD_SCHEDULE_INTERLEAVED);
    }
}

TEST(Config, DerivedQuantities) {
    Loaded g = Load(ConfigPath("gpt2-124m.yaml"));
    ASSERT_EQ(g.st, TPD_OK) << g.err;
    EXPECT_EQ(tpd_config_padded_vocab(&g.cfg, 1), 50304);
    EXPECT_EQ(tpd_config_padded_vocab(&g.cfg, 8), 51200); // multiple of 1024
    EXPECT_EQ(tpd_config_dp(&g.cfg, 8), 8);
    EXPECT_EQ(tpd_config_num_micro_batches(&g.cfg, 8), 512 / (32 * 8));

    Loaded even = Load("", {"model.num_layers=12", "parallel.pipeline_model_parallel_size=4"});
    ASSERT_EQ(even.st, TPD_OK) << even.err;
    int first = -1;
    EXPECT_EQ(tpd_config_stage_layers(&even.cfg, 4, 1, 0, TPD_CONFIG_ALL_CHUNKS, &first), 3);
    EXPECT_EQ(first, 0);
    EXPECT_EQ(tpd_config_stage_layers(&even.cfg, 4, 1, 3, TPD_CONFIG_ALL_CHUNKS, &first), 3);
    EXPECT_EQ(first, 9);
    EXPECT_EQ(tpd_config_stage_layers(&even.cfg, 4, 1, 2, TPD_CONFIG_ALL_CHUNKS, nullptr), 3);
    first = -1;
    EXPECT_EQ(tpd_config_stage_layers(&even.cfg, 4, 1, 4, TPD_CONFIG_ALL_CHUNKS, &first),
              -1); // no such stage
    EXPECT_EQ(first, -1);

    // Virtual stages: chunk c of stage s is virtual stage c*PP + s (Megatron's order)
    Loaded vs = Load("", {"model.num_layers=12", "parallel.pipeline_model_parallel_size=2",
                          "parallel.virtual_pipeline_model_parallel_size=3"});
    ASSERT_EQ(vs.st, TPD_OK) << vs.err;
    EXPECT_EQ(tpd_config_schedule(&vs.cfg), TPD_SCHEDULE_INTERLEAVED);
    EXPECT_EQ(tpd_config_stage_layers(&vs.cfg, 2, 3, 1, 0, &first), 2);
    EXPECT_EQ(first, 2);
    EXPECT_EQ(tpd_config_stage_layers(&vs.cfg, 2, 3, 0, 2, &first), 2);
    EXPECT_EQ(first, 8);
    EXPECT_EQ(tpd_config_stage_layers(&vs.cfg, 2, 3, 1, 2, &first), 2);
    EXPECT_EQ(first, 10);
    EXPECT_EQ(tpd_config_stage_layers(&vs.cfg, 2, 3, 0, 3, nullptr), -1); // no such chunk
    EXPECT_EQ(tpd_config_stage_layers(&vs.cfg, 2, 3, 1, TPD_CONFIG_ALL_CHUNKS, &first), 6);
    EXPECT_EQ(first, 2); // chunk 0's first layer
    // uneven: parallel.pipeline_layers per virtual stage
    Loaded uv = Load("", {"model.num_layers=7", "parallel.pipeline_model_parallel_size=2",
                          "parallel.virtual_pipeline_model_parallel_size=2",
                          "parallel.pipeline_layers=[1,2,3,1]"});
    ASSERT_EQ(uv.st, TPD_OK) << uv.err;
    EXPECT_EQ(tpd_config_stage_layers(&uv.cfg, 2, 2, 0, 1, &first), 3);
    EXPECT_EQ(first, 3);
    EXPECT_EQ(tpd_config_stage_layers(&uv.cfg, 2, 2, 0, TPD_CONFIG_ALL_CHUNKS, nullptr), 4);
    EXPECT_EQ(tpd_config_stage_layers(&uv.cfg, 2, 2, 1, TPD_CONFIG_ALL_CHUNKS, nullptr), 3);

    Loaded uneven = Load("", {"model.num_layers=10", "parallel.pipeline_model_parallel_size=3",
                              "parallel.pipeline_layers=[4,4,2]"});
    ASSERT_EQ(uneven.st, TPD_OK) << uneven.err;
    int total = 0;
    for (int s = 0; s < 3; s++) {
        int n = tpd_config_stage_layers(&uneven.cfg, 3, 1, s, TPD_CONFIG_ALL_CHUNKS, &first);
        EXPECT_EQ(first, total) << s;
        total += n;
    }
    EXPECT_EQ(total, 10);
    EXPECT_EQ(tpd_config_stage_layers(&uneven.cfg, 3, 1, 2, TPD_CONFIG_ALL_CHUNKS, &first), 2);
    EXPECT_EQ(first, 8);
    // another pipeline than the listed one: the even split of the layers
    EXPECT_EQ(tpd_config_stage_layers(&uneven.cfg, 2, 1, 1, TPD_CONFIG_ALL_CHUNKS, &first), 5);
    EXPECT_EQ(first, 5);
    EXPECT_EQ(tpd_config_stage_layers(&uneven.cfg, 2, 2, 1, 1, &first), 2); // virtual stage 3 of 4
    EXPECT_EQ(first, 8);
    // no such pipeline, stage or chunk
    EXPECT_EQ(tpd_config_stage_layers(&uneven.cfg, 0, 1, 0, 0, nullptr), -1);
    EXPECT_EQ(tpd_config_stage_layers(&uneven.cfg, 3, 1, -1, 0, nullptr), -1);
    EXPECT_EQ(tpd_config_stage_layers(&uneven.cfg, 3, 1, 0, -2, nullptr), -1);
    EXPECT_EQ(tpd_config_stage_layers(&uneven.cfg, 11, 1, 0, 0, nullptr), -1); // PP > layers
}

} // namespace
