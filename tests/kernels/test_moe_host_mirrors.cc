// The mixture of experts on a backend whose memory the host cannot address (the cuda
// backend's tpd_kern_device_memory), without a GPU: the cpu backend dressed as one. The
// model then routes over its planned host mirrors and copies the logits, the gate and the
// routing between them and the buffers, as on cuda (engine/model/model_moe.c); objective,
// gradients and statistics must be the plain cpu run's bits. Here rather than beside
// test_model_moe.cc because the dressing needs the ops table (kernels_internal.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "common/tiny.h"

extern "C" {
#include "engine/model/model.h"
#include "engine/model/model_memory.h"
#include "kernels/kernels.h"
#include "kernels/kernels_internal.h"
}

namespace {

// training.device cuda plans the mirrors and the cuda backend's scratch, which this backend
// reserves without using.
tpd_status reserve_cuda_plan(tpd_kern_ctx *, const tpd_kern_shapes *s, size_t *bytes_p) {
    tpd_kern_scratch plan;
    tpd_status st = tpd_kern_scratch_plan("cuda", s, &plan);
    if (st == TPD_OK) *bytes_p = plan.total;
    return st;
}

struct DeviceLike {
    tpd_kern_ops ops;
    tpd_kern_backend be;
    explicit DeviceLike(const tpd_kern_backend *cpu) : ops(*cpu->ops), be(*cpu) {
        ops.scratch_reserve = reserve_cuda_plan;
        be.ops = &ops;
        be.device_memory = 1;
    }
};

struct MoeModel {
    tpd_kern_backend *kb = nullptr;
    DeviceLike *dev = nullptr;
    tpd_model *m = nullptr;
    std::vector<int32_t> tok;
    MoeModel(tpd_config cfg, bool device_like) {
        tpd_kern_config kc = TPD_KERN_CONFIG_INIT;
        kc.num_threads = 1;
        EXPECT_EQ(tpd_kern_cpu_create(&kc, &kb), TPD_OK);
        const tpd_kern_backend *use = kb;
        if (device_like) {
            dev = new DeviceLike(kb);
            use = &dev->be;
            cfg.training.device = TPD_DEVICE_CUDA;
        }
        EXPECT_EQ(tpd_model_create(&cfg, use, nullptr, 1, 0, 1, 1, 0, &m), TPD_OK);
        for (int i = 0; i < cfg.training.micro_batch_size * (cfg.model.seq_length + 1); i++)
            tok.push_back((i * 5 + 3) % cfg.model.vocab_size);
    }
    ~MoeModel() {
        tpd_model_destroy(m);
        delete dev;
        tpd_kern_backend_destroy(kb);
    }
};

TEST(MoeHostMirrors, RouteAsTheBuffersDo) {
    for (int variant = 0; variant < 3; variant++) { // GPT-2, Llama, GPT-2 with a capacity
        tpd_config cfg = tiny::moe_small(variant == 1);
        if (variant == 2) cfg.model.moe_expert_capacity_factor = 0.5;
        MoeModel a(cfg, false), b(cfg, true);
        ASSERT_NE(a.m, nullptr);
        ASSERT_NE(b.m, nullptr);
        EXPECT_EQ(a.m->plan.moe_host, 0);
        EXPECT_EQ(b.m->plan.moe_host, 1);
        EXPECT_GT(b.m->plan.host_bytes, a.m->plan.host_bytes);
        tpd_mem_breakdown mem;
        ASSERT_EQ(tpd_model_memory(&b.m->cfg, 1, 1, 1, 0, &mem), TPD_OK);
        EXPECT_EQ(b.m->bytes_allocated, mem.total) << "the mirrors are planned";
        // the same parameters (off their init, so that every bias and gate works)
        tpd_dp_plan dpp;
        size_t n = a.m->plan.lay.numel;
        ASSERT_EQ(b.m->plan.lay.numel, n);
        ASSERT_EQ(tpd_dp_plan_init(n, 1 << 20, 1, 0, 0, &dpp), TPD_OK);
        ASSERT_EQ(tpd_model_init_params(a.m, &dpp), TPD_OK);
        tpd_dp_plan_free(&dpp);
        float *p = (float *)a.m->params;
        for (size_t i = 0; i < n; i++)
            p[i] += 0.05f * (float)std::sin(0.7 * i);
        std::memcpy(b.m->params, a.m->params, n * 4);
        const tpd_model_mb at = {0, 0, 0};
        double loss[2];
        MoeModel *runs[2] = {&a, &b};
        for (int k = 0; k < 2; k++) {
            tpd_model *m = runs[k]->m;
            ASSERT_EQ(tpd_model_zero_grads(m), TPD_OK);
            m->moe.aux = m->moe.z = m->moe.aux_raw = m->moe.dropped = m->moe.assigned = 0;
            ASSERT_EQ(tpd_model_set_batch(m, &at, runs[k]->tok.data()), TPD_OK);
            ASSERT_EQ(tpd_model_forward(m, &at), TPD_OK);
            ASSERT_EQ(tpd_model_loss_sum(m, &at, &loss[k]), TPD_OK);
            ASSERT_EQ(tpd_model_backward(m, &at, 1.0f), TPD_OK);
        }
        SCOPED_TRACE(variant);
        EXPECT_EQ(loss[0], loss[1]);
        EXPECT_GT(a.m->moe.aux, 0.0);
        EXPECT_EQ(a.m->moe.aux, b.m->moe.aux);
        EXPECT_EQ(a.m->moe.z, b.m->moe.z);
        EXPECT_EQ(a.m->moe.dropped, b.m->moe.dropped);
        if (variant == 2) EXPECT_GT(b.m->moe.dropped, 0);
        EXPECT_EQ(std::memcmp(a.m->grads, b.m->grads, n * 4), 0) << "the gradients differ";
    }
}

} // namespace
