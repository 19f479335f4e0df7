// The planner's closed-form cpu memory against what the engine allocates, under the
// schedules that hold more than 1F1B: interleaved (v model chunks per stage, slots shared
// by the chunks and sized for the largest one, per-chunk recompute, a gradient send buffer
// on every virtual stage but the very first) and ZB-H1 (every stage holds min(PP, M)
// micro-batches until their W). The model's own buffer plan is not consulted: the bytes
// come from tpd_model_create on the cpu backend, which counts what it allocates.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/tiny.h"

extern "C" {
#include "engine/model/model.h"
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

// One layout's every stage: the plan's bytes, category by category, are the allocation's.
// Returns the number of stages checked.
int check_layout(tpd_kern_backend *kb, const tpd_config &cfg, int tp, int pp, int dp,
                 const std::string &what) {
    tpd_plan_layout lay;
    tpd_plan_layout_from_config(&cfg, tp * pp * dp, &lay);
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
        // token staging: inputs and targets per activation slot
        size_t host =
            (size_t)m->plan.nslots * 2 * cfg.training.micro_batch_size * cfg.model.seq_length * 4;
        EXPECT_EQ((double)(device + host), pred.total) << where;
        EXPECT_EQ((double)m->bytes_allocated, pred.total) << where;
        EXPECT_EQ((double)m->plan.mem.params, pred.params) << where;
        EXPECT_EQ((double)m->plan.mem.grads, pred.grads) << where;
        EXPECT_EQ((double)(m->plan.mem.optimizer + m->plan.mem.master), pred.optimizer) << where;
        EXPECT_EQ((double)m->plan.mem.activations, pred.activations) << where;
        EXPECT_EQ((double)m->plan.mem.workspace, pred.workspace) << where;
        // the plan's layer count is the engine's
        EXPECT_EQ(tpd_plan_stage_layers(&cfg, &lay, stage), m->d.Ls) << where;
        tpd_model_destroy(m);
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

} // namespace
