// Published training runs (tests/engine/plan/published/*.csv and SC21 Table 1) as planner
// inputs: one row is a model shape, a layout, a cluster profile and one measured figure.
// Read by the held-out validation (test_plan_heldout.cc) and the Korthikanti check
// (test_plan_throughput.cc).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "plan_test_util.h"

extern "C" {
#include "base/file.h"
}

namespace plan_test {

struct PubRow {
    std::string source; // the file's name without .csv ("sc21" for kSc21)
    std::string model, family, framework, cluster, kind, attention, recompute;
    int layers = 0, hidden = 0, heads = 0, kv_heads = 0, ffn = 0, vocab = 0, seq = 0;
    int gpus = 0, tp = 1, pp = 1, dp = 1, vpp = 1, mbs = 1, gbs = 1;
    int sp = 0, dist_opt = 0, dp_overlap = 0;
    int tp_comm_overlap = 0; // Megatron-Core's --tp-comm-overlap (column optional: 0 if absent)
    int grads_fp32 = 1;      // accumulate_allreduce_grads_in_fp32 (column optional: 1 if absent)
    // parallel.data_parallel_sharding_strategy (column optional: optim with dist_opt, else
    // no_shard); FSDP's FULL_SHARD is optim_grads_params over all of DP
    std::string sharding;
    std::vector<int> pipeline_layers; // empty: an even split
    double published = 0;
};

inline std::string published_dir() {
    return std::string(tpd_source_dir()) + "/tests/engine/plan/published";
}

// Splits one CSV line on commas (the files quote nothing: no field holds a comma).
inline std::vector<std::string> csv_fields(const std::string &line) {
    std::vector<std::string> out;
    std::stringstream ss(line);
    std::string f;
    while (std::getline(ss, f, ','))
        out.push_back(f);
    if (!line.empty() && line.back() == ',') out.push_back("");
    return out;
}

// Reads tests/engine/plan/published/NAME.csv. Lines starting with '#' and blank lines are
// skipped; the first other line names the columns. Returns "" or what is wrong, as
// "FILE:LINE: ...".
inline std::string read_published(const std::string &name, std::vector<PubRow> *rows) {
    std::string path = published_dir() + "/" + name + ".csv";
    std::ifstream f(path);
    if (!f) return path + ": cannot open";
    std::vector<std::string> cols;
    std::string line;
    for (int lineno = 1; std::getline(f, line); lineno++) {
        if (line.empty() || line[0] == '#') continue;
        std::vector<std::string> v = csv_fields(line);
        if (cols.empty()) {
            cols = v;
            continue;
        }
        std::string at = path + ":" + std::to_string(lineno) + ": ";
        if (v.size() != cols.size())
            return at + std::to_string(v.size()) + " fields, the header has " +
                   std::to_string(cols.size());
        std::map<std::string, std::string> m;
        for (size_t i = 0; i < cols.size(); i++)
            m[cols[i]] = v[i];
        PubRow r;
        r.source = name;
        const struct {
            const char *key;
            std::string *out;
        } strs[] = {{"model", &r.model},        {"family", &r.family}, {"framework", &r.framework},
                    {"cluster", &r.cluster},    {"kind", &r.kind},     {"attention", &r.attention},
                    {"recompute", &r.recompute}};
        for (const auto &s : strs) {
            if (!m.count(s.key) || m[s.key].empty()) return at + "no " + s.key;
            *s.out = m[s.key];
        }
        if (m.count("sharding")) {
            r.sharding = m["sharding"];
            if (tpd_config_choice_value("parallel.data_parallel_sharding_strategy",
                                        r.sharding.c_str()) < 0)
                return at + "sharding '" + r.sharding + "' is not a sharding strategy";
        }
        const struct {
            const char *key;
            int *out;
            bool optional; // a column older files lack: the field keeps its default
        } ints[] = {{"layers", &r.layers},
                    {"hidden", &r.hidden},
                    {"heads", &r.heads},
                    {"kv_heads", &r.kv_heads},
                    {"ffn", &r.ffn},
                    {"vocab", &r.vocab},
                    {"seq", &r.seq},
                    {"gpus", &r.gpus},
                    {"tp", &r.tp},
                    {"pp", &r.pp},
                    {"dp", &r.dp},
                    {"vpp", &r.vpp},
                    {"mbs", &r.mbs},
                    {"gbs", &r.gbs},
                    {"sp", &r.sp},
                    {"dist_opt", &r.dist_opt},
                    {"dp_overlap", &r.dp_overlap},
                    {"tp_comm_overlap", &r.tp_comm_overlap, true},
                    {"grads_fp32", &r.grads_fp32, true}};
        for (const auto &n : ints) {
            if (n.optional && !m.count(n.key)) continue;
            char *end = nullptr;
            const std::string &s = m[n.key];
            long x = std::strtol(s.c_str(), &end, 10);
            if (s.empty() || *end || x < 0 || x > (1L << 30))
                return at + n.key + " '" + s + "' is not a whole number";
            *n.out = (int)x;
        }
        char *end = nullptr;
        r.published = std::strtod(m["published"].c_str(), &end);
        if (m["published"].empty() || *end || !(r.published > 0))
            return at + "published '" + m["published"] + "' is not a positive number";
        if (m["pipeline_layers"] != "-") {
            std::stringstream pl(m["pipeline_layers"]);
            for (int n; pl >> n;)
                r.pipeline_layers.push_back(n);
        }
        if ((long)r.tp * r.pp * r.dp != r.gpus)
            return at + "tp*pp*dp is not gpus (" + std::to_string(r.gpus) + ")";
        rows->push_back(r);
    }
    return cols.empty() ? path + ": no header" : "";
}

// SC21 Table 1 (kSc21) as rows: 2021 Megatron, full recomputation, unfused attention, the
// DP all-reduce after the backward; the figure is Eq. 3's hardware TFLOP/s.
inline std::vector<PubRow> sc21_rows() {
    std::vector<PubRow> out;
    for (const Sc21Row &s : kSc21) {
        PubRow r;
        r.source = "sc21";
        char name[32];
        std::snprintf(name, sizeof name, "%.1fB", s.params_b);
        r.model = name;
        r.family = "gpt";
        r.framework = "megatron-2021";
        r.cluster = "dgx-a100-80g";
        r.kind = "hw_tflops_per_gpu";
        r.attention = "unfused";
        r.recompute = "full";
        r.layers = s.layers, r.hidden = s.hidden, r.heads = r.kv_heads = s.heads;
        r.ffn = 4 * s.hidden, r.vocab = 51200, r.seq = 2048;
        r.gpus = s.gpus, r.tp = s.tp, r.pp = s.pp, r.dp = s.dp;
        r.vpp = s.v, r.mbs = s.mbs, r.gbs = s.batch;
        r.published = s.tflops;
        out.push_back(r);
    }
    return out;
}

// The config a row trains: the GPT block of gpt() or the Llama block of llama(), the row's
// shape and batch, its attention and (2021 Megatron) one gradient bucket.
inline tpd_config config_of(const PubRow &r) {
    tpd_config c = r.family == "llama" ? llama(r.layers, r.hidden, r.heads, r.kv_heads, r.ffn)
                                       : gpt(r.heads, r.hidden, r.layers, r.gbs, r.mbs);
    c.model.group_query_attention = r.kv_heads != r.heads;
    c.model.num_query_groups = r.kv_heads;
    c.model.ffn_hidden_size = r.ffn;
    c.model.vocab_size = r.vocab;
    c.model.seq_length = c.model.max_position_embeddings = r.seq;
    c.training.global_batch_size = r.gbs;
    c.training.micro_batch_size = r.mbs;
    c.training.attention = r.attention == "unfused" ? TPD_ATTENTION_UNFUSED : TPD_ATTENTION_FUSED;
    c.training.recompute =
        (tpd_recompute)tpd_config_choice_value("training.recompute", r.recompute.c_str());
    c.parallel.tensor_model_parallel_size = r.tp;
    c.parallel.pipeline_model_parallel_size = r.pp;
    c.parallel.data_parallel_size = r.dp;
    c.parallel.virtual_pipeline_model_parallel_size = r.vpp;
    c.parallel.sequence_parallel = r.sp;
    c.parallel.use_distributed_optimizer = r.dist_opt;
    if (!r.sharding.empty())
        c.parallel.data_parallel_sharding_strategy = (tpd_dp_sharding)tpd_config_choice_value(
            "parallel.data_parallel_sharding_strategy", r.sharding.c_str());
    c.parallel.tp_comm_overlap = r.tp_comm_overlap;
    c.training.accumulate_allreduce_grads_in_fp32 = r.grads_fp32;
    c.parallel.num_pipeline_layers = (int)r.pipeline_layers.size();
    for (size_t i = 0; i < r.pipeline_layers.size() && i < TPD_CONFIG_MAX_STAGES; i++)
        c.parallel.pipeline_layers[i] = r.pipeline_layers[i];
    // 2021 Megatron all-reduced the whole contiguous gradient buffer at once
    if (r.framework == "megatron-2021") c.parallel.ddp_bucket_size = INT64_MAX;
    return c;
}

inline tpd_plan_layout layout_of(const PubRow &r) {
    tpd_plan_layout l;
    std::memset(&l, 0, sizeof l);
    l.tp = r.tp, l.pp = r.pp, l.dp = r.dp;
    l.micro_batch_size = r.mbs;
    l.virtual_stages = r.vpp;
    l.schedule = r.vpp > 1 ? TPD_SCHEDULE_INTERLEAVED : TPD_SCHEDULE_1F1B;
    l.recompute = (tpd_recompute)tpd_config_choice_value("training.recompute", r.recompute.c_str());
    l.sequence_parallel = r.sp;
    l.distributed_optimizer = r.dist_opt;
    if (!r.sharding.empty())
        l.sharding = (tpd_dp_sharding)tpd_config_choice_value(
            "parallel.data_parallel_sharding_strategy", r.sharding.c_str());
    l.overlap_grad_reduce = r.dp_overlap;
    l.overlap_param_gather = r.dp_overlap && r.dist_opt;
    l.tp_comm_overlap = r.tp_comm_overlap;
    return l;
}

// The planner's figure for a row, in the row's kind; 0 when the kind is unknown.
// tflops_8nt (8 x parameters x tokens per second per GPU) is turned into the step time it
// implies (parameters: the planner's count), so the planner's own FLOP count does not enter.
inline double predicted_in_kind(const PubRow &r, const tpd_plan_result &res) {
    if (r.kind == "step_s" || r.kind == "tflops_8nt") return res.step_time_s;
    if (r.kind == "hw_tflops_per_gpu") return res.hw_tflops_per_gpu;
    if (r.kind == "model_tflops_per_gpu") return res.tflops_per_gpu;
    if (r.kind == "mfu") return res.mfu;
    if (r.kind == "tokens_per_s") return res.tokens_per_s;
    return 0;
}

// The published figure in the unit predicted_in_kind returns.
inline double published_in_kind(const PubRow &r, const tpd_config &cfg) {
    if (r.kind != "tflops_8nt") return r.published;
    double tokens = (double)r.gbs * r.seq;
    return 8.0 * tpd_plan_params_count(&cfg) * tokens / (r.published * 1e12 * r.gpus);
}

// Signed error in speed: predicted speed / published speed - 1, whatever the kind, so a
// positive error is an optimistic planner (a step time predicted too short, or a throughput
// too high).
inline double speed_error(const PubRow &r, double predicted, double published) {
    bool is_time = r.kind == "step_s" || r.kind == "tflops_8nt";
    return is_time ? published / predicted - 1.0 : predicted / published - 1.0;
}

// Evaluates one row on cluster cl: the layout as published (no stage balancing: the runs
// split their layers evenly or as pipeline_layers says). Returns the signed speed error and
// fills the predicted and published figures; false when the planner rejects the layout.
inline bool evaluate_published(const PubRow &r, const tpd_plan_cluster &cl, tpd_plan_result *res,
                               double *pred, double *pub, double *err) {
    tpd_config cfg = config_of(r);
    tpd_plan_layout lay = layout_of(r);
    tpd_plan_options opt = TPD_PLAN_OPTIONS_INIT;
    opt.gpus = r.gpus;
    opt.dp_overlap = r.dp_overlap;
    opt.param_gather_overlap = r.dp_overlap && r.dist_opt;
    opt.balance_stages = 0;
    if (tpd_plan_evaluate(&cfg, &cl, &lay, &opt, res) != TPD_OK || res->stages == 0 ||
        !(res->step_time_s > 0))
        return false;
    *pred = predicted_in_kind(r, *res);
    *pub = published_in_kind(r, cfg);
    if (!(*pred > 0)) return false;
    *err = speed_error(r, *pred, *pub);
    return true;
}

} // namespace plan_test
