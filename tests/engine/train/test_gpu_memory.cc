// CUDA memory is planned, not discovered (label gpu; skips without a device, fails under
// TRIPOD_REQUIRE_GPU=1): the device memory one training step of GPT-2 124M (mbs 4, seq
// 1024, bf16, fused attention, one rank) takes, from before the trainer exists to after
// its first step, is within 3% of the engine's buffer plan (tpd_model_memory, which holds
// the kernels' scratch, reserved once at model creation: no op allocates during the step)
// and within 3% of what `tripod plan` reports for that rank on the h200 profile.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

#include "common/gpu.h"
#include "common/tiny.h"

extern "C" {
#include "engine/plan/plan.h"
#include "engine/train/train.h"
#include "kernels/kernels.h"
#include "parallel/comm.h"
}

namespace {

tpd_comm *g_world = nullptr;
std::string g_data;

tpd_config gpt2_124m() {
    tpd_config c = tiny::config(g_data);
    c.model.num_layers = 12;
    c.model.hidden_size = 768;
    c.model.num_attention_heads = 12;
    c.model.ffn_hidden_size = 3072;
    c.model.vocab_size = 50257;
    c.model.make_vocab_size_divisible_by = 128;
    c.model.seq_length = 1024;
    c.model.max_position_embeddings = 1024;
    c.training.micro_batch_size = 4;
    c.training.global_batch_size = 4;
    c.training.train_iters = 1;
    tiny::set(c.training.device, "training.device", "cuda");
    tiny::set(c.training.precision, "training.precision", "bf16");
    tiny::set(c.training.attention, "training.attention", "fused");
    return c;
}

size_t device_used() {
    size_t free_b = 0, total_b = 0;
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemGetInfo(&free_b, &total_b), cudaSuccess);
    return total_b - free_b;
}

TEST(GpuMemory, TrainingStepWithinThreePercentOfPlan) {
    TPD_SKIP_WITHOUT_GPU();
    tpd_config cfg = gpt2_124m();
    // The CUDA context and the libraries' start-up are not the plan's: the baseline is taken
    // after they exist. Kernel modules load eagerly (main sets CUDA_MODULE_LOADING=EAGER
    // before the first CUDA call), and a first backend runs a GEMM and the fused attention
    // forward and backward, so that cuBLASLt's and cuDNN's lazily opened libraries and their
    // plans' code are in place too. (One rank: no NCCL communicator is created.)
    tpd_kern_config kc = TPD_KERN_CONFIG_INIT;
    kc.dtype = TPD_DTYPE_BF16;
    kc.fused_attention = 1;
    tpd_kern_backend *warm = nullptr;
    ASSERT_EQ(tpd_kern_cuda_create(&kc, &warm), TPD_OK);
    {
        const int B = 1, T = 128, NH = 2, HS = 64, C = NH * HS;
        size_t saved_b = tpd_kern_attention_saved_bytes(warm, B, T, NH, HS);
        void *qkv = nullptr, *out = nullptr, *dout = nullptr, *dqkv = nullptr, *saved = nullptr;
        ASSERT_EQ(tpd_kern_alloc(warm, (size_t)B * T * 3 * C * 2, &qkv), TPD_OK);
        ASSERT_EQ(tpd_kern_alloc(warm, (size_t)B * T * 3 * C * 2, &dqkv), TPD_OK);
        ASSERT_EQ(tpd_kern_alloc(warm, (size_t)B * T * C * 2, &out), TPD_OK);
        ASSERT_EQ(tpd_kern_alloc(warm, (size_t)B * T * C * 2, &dout), TPD_OK);
        ASSERT_EQ(tpd_kern_alloc(warm, saved_b, &saved), TPD_OK);
        ASSERT_EQ(tpd_kern_zero(warm, qkv, (size_t)B * T * 3 * C * 2), TPD_OK);
        ASSERT_EQ(tpd_kern_zero(warm, dout, (size_t)B * T * C * 2), TPD_OK);
        ASSERT_EQ(tpd_kern_matmul_fwd(warm, out, qkv, qkv, nullptr, T, C, C), TPD_OK);
        ASSERT_EQ(tpd_kern_attention_fwd(warm, out, saved, qkv, B, T, NH, NH, HS), TPD_OK);
        ASSERT_EQ(tpd_kern_attention_bwd(warm, dqkv, dout, qkv, out, saved, B, T, NH, NH, HS),
                  TPD_OK);
        ASSERT_EQ(tpd_kern_synchronize(warm), TPD_OK);
        for (void *p : {qkv, dqkv, out, dout, saved})
            tpd_kern_free(warm, p);
    }
    size_t before = device_used();

    tpd_trainer *tr = nullptr;
    ASSERT_EQ(tpd_trainer_create(&cfg, g_world, &tr), TPD_OK);
    tpd_step_stats s;
    ASSERT_EQ(tpd_trainer_step(tr, &s), TPD_OK);
    double measured = (double)(device_used() - before);

    tpd_plan_cluster cl;
    ASSERT_EQ(tpd_plan_cluster_load("h200", &cl), TPD_OK);
    tpd_plan_result res;
    memset(&res, 0, sizeof res);
    tpd_plan_layout_from_config(&cfg, 1, &res.layout);
    ASSERT_EQ(tpd_plan_memory(&cfg, &cl, &res), TPD_OK);
    const tpd_plan_stage_mem &p = res.mem[0];
    const tpd_mem_breakdown &e = tpd_trainer_model(tr)->plan.mem;
    std::printf("GPT-2 124M mbs 4 seq 1024 bf16 fused, one rank:\n"
                "  measured  %.1f MiB (cudaMemGetInfo, trainer creation + first step)\n"
                "  planned   %.1f MiB: params %.1f grads %.1f optimizer %.1f activations %.1f "
                "workspace %.1f\n"
                "  engine    %.1f MiB: params %.1f grads %.1f optimizer+master %.1f "
                "activations %.1f workspace %.1f (scratch %.1f)\n",
                measured / 1048576, p.total / 1048576, p.params / 1048576, p.grads / 1048576,
                p.optimizer / 1048576, p.activations / 1048576, p.workspace / 1048576,
                (double)e.total / 1048576, (double)e.params / 1048576, (double)e.grads / 1048576,
                (double)(e.optimizer + e.master) / 1048576, (double)e.activations / 1048576,
                (double)e.workspace / 1048576,
                (double)tpd_trainer_model(tr)->plan.scratch_bytes / 1048576);
    // The engine allocates its buffer plan (host staging aside) and the backend its
    // cuBLASLt workspace (32 MiB, kernels/cuda/cuda_internal.h): the scratch is in the plan.
    const tpd_buffer_plan &b = tpd_trainer_model(tr)->plan;
    double engine = (double)(e.total - b.host_bytes) + 32.0 * 1048576;
    EXPECT_NEAR(measured, engine, 0.03 * engine)
        << "measured " << measured / 1048576 << " MiB, the engine's buffer plan "
        << engine / 1048576 << " MiB";
    // `tripod plan`'s figure for the rank
    EXPECT_NEAR(measured, p.total, 0.03 * p.total)
        << "measured " << measured / 1048576 << " MiB, planned " << p.total / 1048576 << " MiB";
    tpd_trainer_destroy(tr);
    tpd_kern_backend_destroy(warm);
}

} // namespace

int main(int argc, char **argv) {
    // every kernel module loads with the context, before the baseline (see the test)
    setenv("CUDA_MODULE_LOADING", "EAGER", 1);
    ::testing::InitGoogleTest(&argc, argv);
    tpd_comm_mpi_start(&g_world);
    g_data = tiny::write_corpus(tiny::temp_prefix("gpu_mem_corpus"));
    int rc = RUN_ALL_TESTS();
    tiny::remove_corpus(g_data);
    tpd_comm_mpi_finish(g_world);
    return rc;
}
