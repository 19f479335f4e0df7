// The planner's closed-form cpu memory against what the engine allocates, under the
// schedules that hold more than 1F1B: interleaved (v model chunks per stage, slots shared
// by the chunks and sized for the largest one, per-chunk recompute, a gradient send buffer
// on every virtual stage but the very first) and ZB-H1 (every stage holds min(PP, M)
// micro-batches until their W), and under the sharded DP strategies (optim_grads,
// optim_grads_params: unit-aligned shards and their staging slots, `gather`). The model's own
// buffer plan is not consulted: the bytes come from tpd_model_create on the cpu backend,
// which counts what it allocates (bf16 on the cuda backend: its buffer plan, which the cuda
// engine allocates).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/tiny.h"

extern "C" {
#include "engine/model/model.h"
#include "engine/model/model_flops.h"
#include "engine/plan/plan.h"
#include "engine/plan/plan_internal.h"
#include "kernels/cpu/cpu.h"
#include "kernels/kernels.h"
}

namespace {

struct Split {
    int pp, v;
    std::vector<int> layers; // parallel.pipeline_layers (PP*v entries), empty: even
    int num_layers;
};

// The buffer plan's bytes, category by category, against the planner's.
void expect_categories(const tpd_mem_breakdown &mb, const tpd_plan_stage_mem &pred,
                       const std::string &where) {
    EXPECT_EQ((double)mb.params, pred.params) << where;
    EXPECT_EQ((double)mb.grads, pred.grads) << where;
    EXPECT_EQ((double)mb.gather, pred.gather) << where;
    EXPECT_EQ((double)(mb.optimizer + mb.master), pred.optimizer) << where;
    EXPECT_EQ((double)mb.activations, pred.activations) << where;
    EXPECT_EQ((double)mb.workspace, pred.workspace) << where;
    EXPECT_EQ((double)mb.total, pred.total) << where;
}

// One layout's every stage: the plan's bytes, category by category, are the allocation's.
// Returns the number of stages checked.
int check_layout(tpd_kern_backend *kb, const tpd_config &cfg, int tp, int pp, int dp,
                 const std::string &what) {
    tpd_plan_layout lay; // the world is TP x CP x DP x PP; dp is the data-parallel size
    tpd_plan_layout_from_config(&cfg, tp * pp * dp * tpd_config_cp(&cfg), &lay);
    int checked = 0;
    for (int stage = 0; stage < pp; stage++) {
        std::string where = what + " stage " + std::to_string(stage);
        tpd_plan_stage_mem pred;
        EXPECT_EQ(tpd_plan_cpu_memory(&cfg, &lay, stage, &pred), TPD_OK) << where;
        size_t before = tpd_kern_cpu_bytes_allocated(kb);
        tpd_model *m = nullptr;
        EXPECT_EQ(tpd_model_create(&cfg, kb, nullptr, tp, 0, pp, dp, stage, &m), TPD_OK) << where;
        if (!m) continue;
        size_t device = tpd_kern_cpu_bytes_allocated(kb) - before;
        // token staging: inputs and targets per activation slot (a CP rank's seq/CP of each)
        size_t host = (size_t)m->plan.nslots * 2 * cfg.training.micro_batch_size *
                      (cfg.model.seq_length / tpd_config_cp(&cfg)) * 4;
        EXPECT_EQ((double)(device + host), pred.total) << where;
        EXPECT_EQ((double)m->bytes_allocated, pred.total) << where;
        expect_categories(m->plan.mem, pred, where);
        // the plan's layer count is the engine's
        EXPECT_EQ(tpd_plan_stage_layers(&cfg, &lay, stage), m->d.Ls) << where;
        tpd_model_destroy(m);
        checked++;
    }
    return checked;
}

// The same against the engine's buffer plan (tpd_model_memory) without allocating: for the
// cuda backend's bf16, which the cpu backend cannot allocate.
int check_plan(const tpd_config &cfg, int tp, int pp, int dp, const std::string &what) {
    tpd_plan_layout lay;
    tpd_plan_layout_from_config(&cfg, tp * pp * dp * tpd_config_cp(&cfg), &lay);
    int checked = 0;
    for (int stage = 0; stage < pp; stage++) {
        std::string where = what + " stage " + std::to_string(stage);
        tpd_plan_stage_mem pred;
        tpd_mem_breakdown mb;
        EXPECT_EQ(tpd_plan_cpu_memory(&cfg, &lay, stage, &pred), TPD_OK) << where;
        EXPECT_EQ(tpd_model_memory(&cfg, tp, pp, dp, stage, &mb), TPD_OK) << where;
        expect_categories(mb, pred, where);
        checked++;
    }
    return checked;
}

class PlanMemory : public ::testing::Test {
  protected:
    void SetUp() override {
        tpd_kern_config kc = TPD_KERN_CONFIG_INIT;
        ASSERT_EQ(tpd_kern_cpu_create(&kc, &kb), TPD_OK);
    }
    void TearDown() override {
        tpd_kern_backend_destroy(kb);
    }
    tpd_kern_backend *kb = nullptr;
};

// Interleaved: v in {2,3} at PP {2,4}, even and uneven virtual stages, every recompute mode
// (full of all layers and of the first one of each chunk), SP, ZeRO.
TEST_F(PlanMemory, InterleavedAllocationEqualsPlan) {
    const Split splits[] = {
        {2, 2, {}, 12}, {2, 2, {4, 2, 3, 3}, 12},
        {2, 3, {}, 12}, {2, 3, {3, 1, 2, 2, 1, 3}, 12},
        {4, 2, {}, 8},  {4, 2, {2, 1, 2, 1, 1, 2, 1, 2}, 12},
        {4, 3, {}, 12}, {4, 3, {2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2}, 14},
    };
    int checked = 0;
    for (const Split &sp_ : splits)
        for (int tp : {1, 2})
            for (int zero : {0, 1})
                for (int sp : {0, 1})
                    for (const char *rc : {"none", "selective", "full", "full-1"}) {
                        if (sp && tp == 1) continue;
                        tpd_config cfg = tiny::config("");
                        cfg.model.num_layers = sp_.num_layers;
                        cfg.parallel.tensor_model_parallel_size = tp;
                        cfg.parallel.pipeline_model_parallel_size = sp_.pp;
                        cfg.parallel.virtual_pipeline_model_parallel_size = sp_.v;
                        tiny::set(cfg.parallel.pipeline_schedule, "parallel.pipeline_schedule",
                                  "interleaved");
                        cfg.parallel.num_pipeline_layers = (int)sp_.layers.size();
                        for (size_t i = 0; i < sp_.layers.size(); i++)
                            cfg.parallel.pipeline_layers[i] = sp_.layers[i];
                        cfg.parallel.use_distributed_optimizer = zero;
                        cfg.parallel.sequence_parallel = sp;
                        cfg.training.recompute_num_layers = strcmp(rc, "full-1") == 0;
                        tiny::set(cfg.training.recompute, "training.recompute",
                                  std::string(rc, strcspn(rc, "-")).c_str());
                        std::string what = "pp " + std::to_string(sp_.pp) + " v " +
                                           std::to_string(sp_.v) + " split " +
                                           std::to_string(sp_.layers.size()) + " tp " +
                                           std::to_string(tp) + " zero " + std::to_string(zero) +
                                           " sp " + std::to_string(sp) + " recompute " + rc;
                        checked += check_layout(kb, cfg, tp, sp_.pp, 2, what);
                    }
    EXPECT_GT(checked, 400);
}

// ZB-H1 at PP {2,4}: min(PP, M) slots on every stage (full recompute cannot run with it).
TEST_F(PlanMemory, ZbH1AllocationEqualsPlan) {
    int checked = 0;
    for (int pp : {2, 4})
        for (int gbs : {16, 2}) // M = gbs / DP: more and fewer micro-batches than stages
            for (int tp : {1, 2})
                for (int zero : {0, 1})
                    for (int sp : {0, 1})
                        for (const char *rc : {"none", "selective"}) {
                            if (sp && tp == 1) continue;
                            tpd_config cfg = tiny::config("");
                            cfg.parallel.tensor_model_parallel_size = tp;
                            cfg.parallel.pipeline_model_parallel_size = pp;
                            tiny::set(cfg.parallel.pipeline_schedule, "parallel.pipeline_schedule",
                                      "zb-h1");
                            cfg.training.global_batch_size = gbs;
                            cfg.parallel.use_distributed_optimizer = zero;
                            cfg.parallel.sequence_parallel = sp;
                            tiny::set(cfg.training.recompute, "training.recompute", rc);
                            std::string what = "zb-h1 pp " + std::to_string(pp) + " gbs " +
                                               std::to_string(gbs) + " tp " + std::to_string(tp) +
                                               " zero " + std::to_string(zero) + " sp " +
                                               std::to_string(sp) + " recompute " + rc;
                            checked += check_layout(kb, cfg, tp, pp, 2, what);
                        }
    EXPECT_GT(checked, 80);
    // and the slots are min(PP, M) on every stage: the last stage of PP 4 at M = 8 holds 4
    tpd_config cfg = tiny::config("");
    cfg.parallel.pipeline_model_parallel_size = 4;
    tiny::set(cfg.parallel.pipeline_schedule, "parallel.pipeline_schedule", "zb-h1");
    tpd_plan_layout zb, one;
    tpd_plan_layout_from_config(&cfg, 8, &zb);
    one = zb;
    one.schedule = TPD_SCHEDULE_1F1B;
    tpd_plan_stage_mem mz, m1;
    ASSERT_EQ(tpd_plan_cpu_memory(&cfg, &zb, 3, &mz), TPD_OK);
    ASSERT_EQ(tpd_plan_cpu_memory(&cfg, &one, 3, &m1), TPD_OK);
    EXPECT_GT(mz.activations, 3 * m1.activations);
    EXPECT_EQ(mz.params, m1.params);
}

// fp32 main gradients (training.accumulate_allreduce_grads_in_fp32, the default) on a GPU
// cluster: a middle stage's gradient buffer is 4 bytes per parameter of its TP/PP share,
// twice the bf16 gradients kept with the key false; weights and optimizer state do not
// change. Bytes per parameter of model and optimizer state: 18 and, under ZeRO-1 over d
// (Megatron's distributed optimizer: master, m and v sharded, the gradient buffer whole),
// 6 + 12/d; 16 and 4 + 12/d with bf16 gradients. The DP wire bytes follow.
TEST(PlanMemoryGrads, Fp32MainGradientsAreFourBytesPerParameter) {
    tpd_plan_cluster cl;
    ASSERT_EQ(tpd_plan_cluster_load("h200", &cl), TPD_OK);
    tpd_config c = tiny::config("");
    c.model.num_layers = 8;
    c.model.hidden_size = 256;
    c.model.num_attention_heads = 8;
    c.model.ffn_hidden_size = 1024;
    c.training.global_batch_size = 16;
    tiny::set(c.training.precision, "training.precision", "bf16");
    tiny::set(c.training.device, "training.device", "cuda");
    const int tp = 2, pp = 4, dp = 4;
    double bytes_per_param[2][2]; // [key][zero]
    double grads[2], emb[2];
    for (int key : {1, 0})
        for (int zero : {0, 1}) {
            std::string what =
                std::string("key ") + (key ? "on" : "off") + " zero " + std::to_string(zero);
            tpd_config k = c;
            k.training.accumulate_allreduce_grads_in_fp32 = key;
            tpd_plan_result r;
            memset(&r, 0, sizeof r);
            r.layout = {tp, pp, dp, 1, 1, TPD_RECOMPUTE_NONE, 0, zero};
            ASSERT_EQ(tpd_plan_memory(&k, &cl, &r), TPD_OK) << what;
            // stage 1 holds 8/4 layers of TP-sharded weights and no embeddings
            double n = (double)c.model.num_layers / pp * tpd_plan_layer_params(&c, tp);
            ASSERT_DOUBLE_EQ(tpd_plan_stage_params(&k, &r.layout, 1), n) << what;
            const tpd_plan_stage_mem &m = r.mem[1];
            EXPECT_DOUBLE_EQ(m.grads, (key ? 4.0 : 2.0) * n) << what;
            EXPECT_DOUBLE_EQ(m.params, 2.0 * n) << what;
            EXPECT_DOUBLE_EQ(m.optimizer, 12.0 * n / (zero ? dp : 1)) << what;
            bytes_per_param[key][zero] = (m.params + m.grads + m.optimizer) / n;
            grads[key] = m.grads;
            EXPECT_EQ(tpd_plan_grad_wire_bytes(&k), key ? 4.0 : 2.0) << what;
            // the DP reduction moves the gradient buffer's elements
            tpd_plan_dp_cost dpc;
            tpd_plan_gpu_dp_cost(&k, &cl, &r.layout, &dpc);
            EXPECT_EQ(dpc.grad_bytes, key ? 4.0 : 2.0) << what;
            EXPECT_EQ(dpc.param_bytes, 2.0) << what;
            emb[key] = dpc.emb_allreduce;
        }
    // the tied embedding's all-reduce between the first and last stage moves them too
    EXPECT_GT(emb[1], emb[0]);
    EXPECT_DOUBLE_EQ(grads[1], 2.0 * grads[0]);
    EXPECT_DOUBLE_EQ(bytes_per_param[1][0], 18.0);
    EXPECT_DOUBLE_EQ(bytes_per_param[1][1], 6.0 + 12.0 / dp);
    EXPECT_DOUBLE_EQ(bytes_per_param[0][0], 16.0);
    EXPECT_DOUBLE_EQ(bytes_per_param[0][1], 4.0 + 12.0 / dp);
    // fp32 precision: 4-byte gradients whatever the key says
    tiny::set(c.training.precision, "training.precision", "fp32");
    for (int key : {1, 0}) {
        c.training.accumulate_allreduce_grads_in_fp32 = key;
        EXPECT_EQ(tpd_plan_grad_wire_bytes(&c), 4.0);
    }
}

// The engine's buffer plan (what `tripod train` allocates) and the planner's closed form
// agree on the gradient buffer under both settings of the key, bf16 on the cuda backend and
// fp32 (where the key does nothing) on the cpu one, whose allocation is counted.
TEST_F(PlanMemory, GradientBufferFollowsTheKeyInPlanAndEngine) {
    for (const char *precision : {"bf16", "fp32"})
        for (int key : {1, 0})
            for (int zero : {0, 1}) {
                tpd_config cfg = tiny::config("");
                cfg.parallel.tensor_model_parallel_size = 2;
                cfg.parallel.pipeline_model_parallel_size = 2;
                cfg.parallel.use_distributed_optimizer = zero;
                cfg.training.accumulate_allreduce_grads_in_fp32 = key;
                tiny::set(cfg.training.precision, "training.precision", precision);
                int bf16 = strcmp(precision, "bf16") == 0;
                if (bf16) tiny::set(cfg.training.device, "training.device", "cuda");
                std::string what = std::string(precision) + " key " + std::to_string(key) +
                                   " zero " + std::to_string(zero);
                tpd_plan_layout lay;
                tpd_plan_layout_from_config(&cfg, 8, &lay);
                for (int stage = 0; stage < 2; stage++) {
                    tpd_plan_stage_mem pred;
                    ASSERT_EQ(tpd_plan_cpu_memory(&cfg, &lay, stage, &pred), TPD_OK) << what;
                    tpd_mem_breakdown mb;
                    ASSERT_EQ(tpd_model_memory(&cfg, 2, 2, 2, stage, &mb), TPD_OK) << what;
                    EXPECT_EQ((double)mb.grads, pred.grads) << what;
                    EXPECT_EQ((double)mb.total, pred.total) << what;
                    // 4 bytes per element unless bf16 keeps bf16 gradients
                    EXPECT_EQ(mb.grads, mb.params / (bf16 ? 2 : 4) * (bf16 && !key ? 2 : 4))
                        << what;
                }
                if (!bf16) EXPECT_EQ(check_layout(kb, cfg, 2, 2, 2, what), 2);
            }
}

// bf16 on the cpu backend (the cuda backend's recipe): what the model allocates is what the
// planner predicts, category by category, with fp32 main gradients or bf16 ones, under TP, PP,
// ZeRO-1, ZeRO-3, SP, the Llama block, the MoE block and context parallelism.
TEST(PlanMemoryBf16, CpuAllocationEqualsPlan) {
    for (int key : {1, 0}) {
        tpd_kern_config kc = TPD_KERN_CONFIG_INIT;
        kc.dtype = TPD_DTYPE_BF16;
        kc.fp32_grads = key;
        tpd_kern_backend *kb = nullptr;
        ASSERT_EQ(tpd_kern_cpu_create(&kc, &kb), TPD_OK);
        struct Case {
            int tp, pp, dp;
            tpd_dp_sharding sharding;
            bool sp, llama, moe;
            int cp = 1;
            bool a2a = false;
        } cases[] = {
            {1, 1, 1, TPD_DP_SHARDING_NO_SHARD, false, false, false},
            {2, 2, 2, TPD_DP_SHARDING_NO_SHARD, false, false, false},
            {2, 2, 2, TPD_DP_SHARDING_OPTIM, true, false, false},
            {1, 2, 4, TPD_DP_SHARDING_OPTIM_GRADS_PARAMS, false, false, false},
            {2, 2, 2, TPD_DP_SHARDING_OPTIM, false, true, false},
            {2, 1, 2, TPD_DP_SHARDING_NO_SHARD, false, false, true},
            {1, 2, 2, TPD_DP_SHARDING_OPTIM, false, false, false, 2, false},  // the ring
            {2, 1, 1, TPD_DP_SHARDING_NO_SHARD, false, true, false, 2, true}, // the all-to-all
        };
        int checked = 0;
        for (const Case &c : cases) {
            tpd_config cfg = tiny::config("");
            if (c.llama) tiny::llama(cfg);
            if (c.moe) {
                cfg.model.num_moe_experts = 4;
                cfg.model.moe_router_topk = 2;
                cfg.model.moe_ffn_hidden_size = 32;
            }
            cfg.training.precision = TPD_PRECISION_BF16;
            cfg.training.accumulate_allreduce_grads_in_fp32 = key;
            cfg.parallel.tensor_model_parallel_size = c.tp;
            cfg.parallel.pipeline_model_parallel_size = c.pp;
            cfg.parallel.data_parallel_sharding_strategy = c.sharding;
            cfg.parallel.use_distributed_optimizer = c.sharding != TPD_DP_SHARDING_NO_SHARD;
            cfg.parallel.sequence_parallel = c.sp;
            cfg.parallel.context_parallel_size = c.cp;
            cfg.parallel.cp_comm_type = c.a2a ? TPD_CP_COMM_A2A : TPD_CP_COMM_P2P;
            std::string what = "bf16 key " + std::to_string(key) + " TP " + std::to_string(c.tp) +
                               " PP " + std::to_string(c.pp) + " DP " + std::to_string(c.dp) +
                               " sharding " + std::to_string((int)c.sharding) +
                               (c.llama ? " Llama" : "") + (c.moe ? " MoE" : "") + " CP " +
                               std::to_string(c.cp) + (c.a2a ? " a2a" : "");
            checked += check_layout(kb, cfg, c.tp, c.pp, c.dp, what);
        }
        EXPECT_EQ(checked, 1 + 2 + 2 + 2 + 2 + 1 + 2 + 1);
        tpd_kern_backend_destroy(kb);
    }
}

// The sharded strategies the engine trains over all of DP: optim_grads (ZeRO-2) and
// optim_grads_params (ZeRO-3/FSDP) cut each hook unit of the flat buffer (the embedding, each
// layer, the final unit) in DP parts and stage full units in slots (the `gather` category).
// DP 2, 4, 8 at TP 1/2 and PP 1/2/4; GPT-2's block tied and untied, with learned and rotary
// positions, and the Llama block untied and tied; 1F1B, ZB-H1 (a layer's gradient slot open
// from B to W: more slots) at PP 2 and 4 with more and fewer micro-batches than stages, and
// interleaved v = 2; fsdp_units_in_flight 2 and 3. fp32 on the cpu backend, counted where it
// allocates; bf16 on the cuda backend against its buffer plan.
TEST_F(PlanMemory, ShardedStrategiesAllocationEqualsPlan) {
    struct Model {
        const char *name;
        bool llama, untied, rope;
    };
    const Model models[] = {{"gpt", false, false, false},
                            {"gpt-untied", false, true, false},
                            {"gpt-rope", false, false, true},
                            {"llama", true, true, true},
                            {"llama-tied", true, false, true}};
    struct Pipe {
        int pp;
        const char *schedule;
        int v;
    };
    const Pipe pipes[] = {{1, "1f1b", 1},       {2, "1f1b", 1},  {4, "1f1b", 1},
                          {2, "zb-h1", 1},      {4, "zb-h1", 1}, {2, "interleaved", 2},
                          {4, "interleaved", 2}};
    int checked = 0, planned = 0;
    double gather_zb = 0, gather_1f1b = 0; // stage 0 of GPT, PP 4, DP 2, TP 1, optim_grads
    for (const char *strategy : {"optim_grads", "optim_grads_params"})
        for (int dp : {2, 4, 8})
            for (int tp : {1, 2})
                for (const Pipe &pi : pipes)
                    for (const Model &mo : models)
                        for (int few : {0, 1, 2}) { // ZB-H1: M = 1, fewer micro-batches than
                                                    // stages; 2: HSDP, shard groups of 2
                            bool zb = std::strcmp(pi.schedule, "zb-h1") == 0;
                            if ((few == 1 && !zb) || (few == 2 && (dp < 4 || pi.v > 1))) continue;
                            tpd_config cfg = tiny::config("");
                            if (mo.llama) tiny::llama(cfg);
                            cfg.model.untie_embeddings_and_output_weights = mo.untied;
                            if (mo.rope) cfg.model.position_embedding_type = TPD_POS_ROPE;
                            cfg.model.num_layers = pi.v > 1 ? 8 : 4;
                            cfg.parallel.tensor_model_parallel_size = tp;
                            cfg.parallel.pipeline_model_parallel_size = pi.pp;
                            cfg.parallel.virtual_pipeline_model_parallel_size = pi.v;
                            tiny::set(cfg.parallel.pipeline_schedule, "parallel.pipeline_schedule",
                                      pi.schedule);
                            tiny::set(cfg.parallel.data_parallel_sharding_strategy,
                                      "parallel.data_parallel_sharding_strategy", strategy);
                            cfg.parallel.use_distributed_optimizer = 1;
                            cfg.parallel.fsdp_units_in_flight = dp == 4 ? 3 : 2;
                            cfg.training.global_batch_size = few == 1 ? dp : 64;
                            cfg.parallel.data_parallel_shard_size = few == 2 ? 2 : 0;
                            std::string what = std::string(strategy) + " dp " + std::to_string(dp) +
                                               " tp " + std::to_string(tp) + " pp " +
                                               std::to_string(pi.pp) + " " + pi.schedule + " v " +
                                               std::to_string(pi.v) + " " + mo.name + " gbs " +
                                               std::to_string(cfg.training.global_batch_size) +
                                               (few == 2 ? " HSDP shard 2" : "");
                            checked += check_layout(kb, cfg, tp, pi.pp, dp, what);
                            // and the same layout in bf16 on the cuda backend, planned
                            tpd_config bf = cfg;
                            tiny::set(bf.training.precision, "training.precision", "bf16");
                            tiny::set(bf.training.device, "training.device", "cuda");
                            planned += check_plan(bf, tp, pi.pp, dp, what + " bf16 cuda");
                            if (std::strcmp(strategy, "optim_grads") == 0 && dp == 2 && tp == 1 &&
                                pi.pp == 4 && few == 0 && std::strcmp(mo.name, "gpt") == 0) {
                                tpd_plan_layout lay;
                                tpd_plan_layout_from_config(&cfg, 8, &lay);
                                tpd_plan_stage_mem m;
                                EXPECT_EQ(tpd_plan_cpu_memory(&cfg, &lay, 0, &m), TPD_OK);
                                (zb ? gather_zb : gather_1f1b) = m.gather;
                            }
                        }
    EXPECT_GT(checked, 1000);
    EXPECT_EQ(planned, checked);
    // ZB-H1 keeps a gradient slot per layer whose W is pending: more than 1F1B's two
    EXPECT_GT(gather_1f1b, 0.0);
    EXPECT_GT(gather_zb, gather_1f1b);
}

// The sharded bytes in closed form on one layout, beside the unsharded ones: GPT-2's tiny
// block at DP 4, one stage (tied; wte and wpe in the embedding unit, the final LayerNorm
// alone in the last), fp32 on the cpu backend.
TEST_F(PlanMemory, ShardedBytesByUnit) {
    const tpd_config base = tiny::config("");
    const size_t dp = 4, C = 32, T = 16, F = 128, Vl = (size_t)tpd_config_padded_vocab(&base, 1);
    const size_t layer = 2 * 2 * C + 3 * C * C + 3 * C + C * C + C + F * C + F + C * F + C;
    const size_t emb = Vl * C + T * C, fin = 2 * C, L = 4;
    auto part = [&](size_t n) { return (n + dp - 1) / dp; };
    const size_t n = emb + L * layer + fin, shard = part(emb) + L * part(layer) + part(fin);
    const size_t padded = (n + dp - 1) / dp * dp;
    for (const char *strategy : {"optim_grads", "optim_grads_params"})
        for (int k : {2, 3}) {
            tpd_config cfg = base;
            tiny::set(cfg.parallel.data_parallel_sharding_strategy,
                      "parallel.data_parallel_sharding_strategy", strategy);
            cfg.parallel.use_distributed_optimizer = 1;
            cfg.parallel.fsdp_units_in_flight = k;
            bool gp = std::strcmp(strategy, "optim_grads_params") == 0;
            std::string what = std::string(strategy) + " k " + std::to_string(k);
            tpd_plan_layout lay;
            tpd_plan_layout_from_config(&cfg, (int)dp, &lay);
            tpd_plan_stage_mem m;
            ASSERT_EQ(tpd_plan_cpu_memory(&cfg, &lay, 0, &m), TPD_OK) << what;
            EXPECT_EQ(m.params, (double)((gp ? shard : n) * 4)) << what;
            EXPECT_EQ(m.grads, (double)(shard * 4)) << what;
            EXPECT_EQ(m.optimizer, (double)(shard * 8)) << what; // AdamW's m and v, fp32
            // slots of DP parts: max(k, 2) of the largest unit's parameters (a layer here,
            // 12704 elements against the embedding's 8960), two of a layer's gradients, the
            // embedding's own
            const size_t eslot = part(emb) * dp, gslot = part(layer) * dp;
            ASSERT_GT(layer, emb);
            const size_t pool = gp ? (size_t)(k > 2 ? k : 2) : 0;
            EXPECT_EQ(m.gather, (double)(pool * gslot * 4 + (2 * gslot + eslot) * 4)) << what;
            EXPECT_EQ(m.params_full, (double)(padded * 4)) << what;
            EXPECT_EQ(m.grads_full, (double)(padded * 4)) << what;
            EXPECT_EQ(m.optimizer_full, (double)(padded * 8)) << what;
            EXPECT_EQ(check_layout(kb, cfg, 1, 1, (int)dp, what), 1);
        }
}

// Context parallelism (parallel.context_parallel_size 2 and 4): each rank's seq/CP tokens in
// every slot, head, workspace and staging buffer, the ring's log-sum-exp per layer (kept under
// selective recompute too) and its K/V, dK/dV, running-state and position buffers (p2p), or
// the head-split attention state of whole sequences and the all-to-all blocks (a2a); the
// weights whole, padded and sharded over DP x CP. GPT-2's block and the Llama block, TP 1/2
// (SP), PP 1/2, every recompute mode, ZeRO-1 and ZeRO-3; a2a where the heads and K/V heads
// divide by TP x CP; GPT-2's at 16 tokens, Llama's at 1024. fp32 on the cpu backend, counted where
// it allocates; bf16 on the cuda backend against its buffer plan (planned only: `tripod train` runs
// CP on the cpu).
TEST_F(PlanMemory, ContextParallelAllocationEqualsPlan) {
    int checked = 0, planned = 0;
    for (int llama : {0, 1})
        for (int cp : {1, 2, 4})
            for (const char *comm : {"p2p", "a2a"})
                for (int tp : {1, 2})
                    for (int pp : {1, 2})
                        for (int sp : {0, 1})
                            for (const char *rc : {"none", "selective", "full"})
                                for (const char *sh : {"no_shard", "optim", "optim_grads_params"}) {
                                    bool a2a = std::strcmp(comm, "a2a") == 0;
                                    if ((cp == 1 && a2a) || (sp && tp == 1)) continue;
                                    tpd_config cfg = tiny::config("");
                                    if (llama) tiny::llama(cfg);
                                    /* Llama at 1024 tokens: the regions too big for the
                                     * alignment to hide a term (the ring's positions) */
                                    if (llama)
                                        cfg.model.seq_length = cfg.model.max_position_embeddings =
                                            1024;
                                    const int heads = cfg.model.num_attention_heads;
                                    const int kv = tpd_config_kv_heads(&cfg);
                                    if (a2a && (heads % (tp * cp) || kv % (tp * cp))) continue;
                                    cfg.parallel.tensor_model_parallel_size = tp;
                                    cfg.parallel.pipeline_model_parallel_size = pp;
                                    cfg.parallel.context_parallel_size = cp;
                                    tiny::set(cfg.parallel.cp_comm_type, "parallel.cp_comm_type",
                                              comm);
                                    cfg.parallel.sequence_parallel = sp;
                                    tiny::set(cfg.training.recompute, "training.recompute", rc);
                                    tiny::set(cfg.parallel.data_parallel_sharding_strategy,
                                              "parallel.data_parallel_sharding_strategy", sh);
                                    cfg.parallel.use_distributed_optimizer =
                                        std::strcmp(sh, "no_shard") != 0;
                                    std::string what =
                                        std::string(llama ? "llama" : "gpt") + " cp " +
                                        std::to_string(cp) + " " + comm + " tp " +
                                        std::to_string(tp) + " pp " + std::to_string(pp) + " sp " +
                                        std::to_string(sp) + " recompute " + rc + " " + sh;
                                    checked += check_layout(kb, cfg, tp, pp, 2, what);
                                    tpd_config bf = cfg;
                                    tiny::set(bf.training.precision, "training.precision", "bf16");
                                    tiny::set(bf.training.device, "training.device", "cuda");
                                    planned += check_plan(bf, tp, pp, 2, what + " bf16 cuda");
                                }
    EXPECT_GT(checked, 500);
    EXPECT_EQ(planned, checked);
}

} // namespace

// The mixture of experts (model.num_moe_experts): every expert on the rank, the routing
// and the experts' rows per layer, the MoE workspace; GELU and SwiGLU experts, a shared
// expert with and without its gate, TP 2 with SP, PP 2, every recompute mode, ZeRO-1 and
// ZeRO-3, under EP too, dropless and with a capacity; the cpu allocation and the cuda bf16
// plan.
TEST_F(PlanMemory, MoeAllocationEqualsPlan) {
    int checked = 0;
    // freq: model.moe_layer_freq; 2 and 3 mix dense layers (ffn_hidden_size) in, so that a
    // stage (of PP 2) holds one kind or both
    for (int freq : {1, 2, 3})
        for (bool llama : {false, true})
            for (int shared : {0, 16})
                for (int tp : {1, 2})
                    for (const char *rc : {"none", "selective", "full"}) {
                        if (freq == 3 && (shared == 0 || tp == 2)) continue;
                        tpd_config cfg = tiny::config("");
                        if (llama) tiny::llama(cfg);
                        cfg.model.moe_layer_freq = freq;
                        cfg.model.num_moe_experts = 4;
                        cfg.model.moe_router_topk = 2;
                        cfg.model.moe_ffn_hidden_size = 32;
                        cfg.model.moe_shared_expert_intermediate_size = shared;
                        cfg.model.moe_shared_expert_gate = shared > 0 && !llama;
                        cfg.model.moe_expert_capacity_factor = llama ? 1.25 : 0.0;
                        cfg.parallel.tensor_model_parallel_size = tp;
                        cfg.parallel.sequence_parallel = tp > 1;
                        tiny::set(cfg.training.recompute, "training.recompute", rc);
                        std::string what = std::string(llama ? "Llama" : "GPT-2") + " MoE every " +
                                           std::to_string(freq) + " shared " +
                                           std::to_string(shared) + " TP " + std::to_string(tp) +
                                           " recompute " + rc;
                        checked += check_layout(kb, cfg, tp, 1, 1, what);
                        cfg.parallel.pipeline_model_parallel_size = 2;
                        checked += check_layout(kb, cfg, tp, 2, 1, what + " PP 2");
                        cfg.parallel.pipeline_model_parallel_size = 1;
                        cfg.parallel.use_distributed_optimizer = 1;
                        cfg.parallel.data_parallel_sharding_strategy =
                            rc[0] == 'f' ? TPD_DP_SHARDING_OPTIM_GRADS_PARAMS
                                         : TPD_DP_SHARDING_OPTIM;
                        checked += check_layout(kb, cfg, tp, 1, 2, what + " DP 2 sharded");
                        // expert parallelism: E / EP experts, the received rows' worst case
                        cfg.parallel.use_distributed_optimizer = 0;
                        cfg.parallel.data_parallel_sharding_strategy = TPD_DP_SHARDING_NO_SHARD;
                        // (Llama's capacity 1.25 bounds the received rows: EP El ceil(f N k / E))
                        cfg.parallel.expert_model_parallel_size = 2;
                        checked += check_layout(kb, cfg, tp, 1, 2, what + " DP 2 EP 2");
                        cfg.parallel.expert_model_parallel_size = 4;
                        cfg.parallel.pipeline_model_parallel_size = 2;
                        checked += check_layout(kb, cfg, tp, 2, 4, what + " PP 2 DP 4 EP 4");
                        cfg.parallel.pipeline_model_parallel_size = 1;
                        // ZeRO-1 under EP: the experts' state over expert DP
                        cfg.parallel.use_distributed_optimizer = 1;
                        cfg.parallel.data_parallel_sharding_strategy = TPD_DP_SHARDING_OPTIM;
                        cfg.parallel.expert_model_parallel_size = 2;
                        checked += check_layout(kb, cfg, tp, 1, 4, what + " DP 4 EP 2 ZeRO-1");
                        // ZeRO-2 and ZeRO-3 under EP: the experts' units over expert DP, staged
                        // in expert slots beside their layer's
                        cfg.parallel.data_parallel_sharding_strategy =
                            rc[0] == 'f' ? TPD_DP_SHARDING_OPTIM_GRADS_PARAMS
                                         : TPD_DP_SHARDING_OPTIM_GRADS;
                        checked += check_layout(kb, cfg, tp, 1, 4, what + " DP 4 EP 2 ZeRO-2/3");
                        cfg.parallel.pipeline_model_parallel_size = 2;
                        cfg.parallel.expert_model_parallel_size = 4; // expert DP 1
                        checked +=
                            check_layout(kb, cfg, tp, 2, 4, what + " PP 2 DP 4 EP 4 ZeRO-2/3");
                        cfg.parallel.pipeline_model_parallel_size = 1;
                        // HSDP under EP: shard groups of 2 (one EP run) at DP 4
                        cfg.parallel.expert_model_parallel_size = 2;
                        cfg.parallel.data_parallel_shard_size = 2;
                        checked +=
                            check_layout(kb, cfg, tp, 1, 4, what + " DP 4 HSDP 2 EP 2 ZeRO-2/3");
                        cfg.parallel.data_parallel_shard_size = 0;
                        cfg.parallel.expert_model_parallel_size = 1;
                        cfg.parallel.data_parallel_sharding_strategy =
                            rc[0] == 'f' ? TPD_DP_SHARDING_OPTIM_GRADS_PARAMS
                                         : TPD_DP_SHARDING_OPTIM;
                        cfg.training.precision = TPD_PRECISION_BF16;
                        cfg.training.device = TPD_DEVICE_CUDA;
                        checked += check_plan(cfg, tp, 1, 2, what + " cuda bf16");
                    }
    EXPECT_EQ(checked, (2 * 2 * 2 * 3 * 2 + 2 * 3) * 13);
}

// MoE FLOPs count what a token runs: k experts of width Fe and the shared ones count as a
// dense MLP of width k Fe + Fs, plus the router's h E; one expert of the dense width, top-1,
// is the dense model plus its router.
TEST(PlanMoe, ActiveParameterFlops) {
    tpd_config dense = tiny::config("");
    tiny::llama(dense);
    dense.model.ffn_hidden_size = 400;
    tpd_config moe = dense;
    moe.model.num_moe_experts = 8;
    moe.model.moe_router_topk = 2;
    moe.model.moe_ffn_hidden_size = 200;
    double h = dense.model.hidden_size, L = dense.model.num_layers;
    double tokens = 64.0 * dense.model.seq_length;
    double router = 3.0 * tokens * L * 2.0 * h * 8; // 3x (fwd + 2 bwd) of the (h, E) GEMM
    EXPECT_NEAR(tpd_model_flops(&moe, 64, 320) - tpd_model_flops(&dense, 64, 320), router,
                1e-9 * router);
    moe.model.moe_router_topk = 1;
    moe.model.num_moe_experts = 1; // not a valid config, but the count's identity
    moe.model.moe_ffn_hidden_size = 400;
    EXPECT_NEAR(tpd_model_flops(&moe, 64, 320) - tpd_model_flops(&dense, 64, 320),
                3.0 * tokens * L * 2.0 * h, 1e-6);
    // parameters count every expert: 8 of width 200 are four dense MLPs of 400, plus router
    moe.model.num_moe_experts = 8;
    moe.model.moe_router_topk = 2;
    moe.model.moe_ffn_hidden_size = 200;
    double mlp = 3.0 * h * 400;
    EXPECT_NEAR(tpd_plan_layer_params(&moe, 1) - tpd_plan_layer_params(&dense, 1),
                3.0 * mlp + 8 * h, 1e-6);
}
