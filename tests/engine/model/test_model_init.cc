// tpd_model_init_params fills the host copy in parallel (OpenMP): the values must be
// bit-identical whatever the thread count, and equal to the counter-based formula
// (tpd_model_init_value at each element's global index) evaluated serially here.
#include <gtest/gtest.h>

#include <omp.h>

#include <cstring>
#include <vector>

#include "common/tiny.h"

extern "C" {
#include "engine/model/model.h"
#include "engine/model/model_layout.h"
#include "kernels/kernels.h"
}

namespace {

// The parameters after init on a cpu backend, with `threads` OpenMP threads for the fill.
std::vector<float> init_with(const tpd_config &cfg, int threads, int tp_size, int tp_rank) {
    std::vector<float> host;
    tpd_kern_config kc = TPD_KERN_CONFIG_INIT;
    kc.num_threads = 1;
    tpd_kern_backend *kb = nullptr;
    EXPECT_EQ(tpd_kern_cpu_create(&kc, &kb), TPD_OK);
    if (kb == nullptr) return host;
    tpd_model *m = nullptr;
    tpd_dp_plan dpp{};
    omp_set_num_threads(threads);
    // tp_comm NULL: the layout of rank tp_rank is all the fill reads
    EXPECT_EQ(tpd_model_create(&cfg, kb, nullptr, tp_size, tp_rank, 1, 1, 0, &m), TPD_OK);
    if (m != nullptr) {
        EXPECT_EQ(tpd_dp_plan_init(m->plan.lay.numel, 1 << 20, 1, 0, 0, &dpp), TPD_OK);
        EXPECT_EQ(tpd_model_init_params(m, &dpp), TPD_OK);
        host.resize(m->plan.numel_padded);
        EXPECT_EQ(tpd_model_params_f32(m, host.data()), TPD_OK);
        tpd_dp_plan_free(&dpp);
        tpd_model_destroy(m);
    }
    tpd_kern_backend_destroy(kb);
    omp_set_num_threads(1);
    return host;
}

TEST(ModelInit, ParallelFillIsBitIdenticalToOneThread) {
    tpd_config cfg = tiny::config("");
    std::vector<float> one = init_with(cfg, 1, 1, 0);
    ASSERT_FALSE(one.empty());
    for (int threads : {2, 3, 8}) {
        std::vector<float> many = init_with(cfg, threads, 1, 0);
        ASSERT_EQ(many.size(), one.size());
        EXPECT_EQ(std::memcmp(many.data(), one.data(), one.size() * sizeof(float)), 0)
            << threads << " threads";
    }
}

TEST(ModelInit, ValuesAreTheCounterFormulaAtTheGlobalIndex) {
    tpd_config cfg = tiny::config("");
    tpd_kern_config kc = TPD_KERN_CONFIG_INIT;
    tpd_kern_backend *kb = nullptr;
    ASSERT_EQ(tpd_kern_cpu_create(&kc, &kb), TPD_OK);
    tpd_model *m = nullptr;
    ASSERT_EQ(tpd_model_create(&cfg, kb, nullptr, 2, 1, 1, 1, 0, &m), TPD_OK);
    std::vector<float> got = init_with(cfg, 4, 2, 1); // TP rank 1 of 2: global != local
    ASSERT_EQ(got.size(), m->plan.numel_padded);
    const tpd_model_layout *lay = &m->plan.lay;
    size_t checked = 0, nonzero = 0;
    for (int p = 0; p < TPD_P_COUNT; p++) {
        const tpd_param_slice *s = &lay->p[p];
        if (!s->present) continue;
        for (int64_t r = 0; r < (int64_t)s->layers * s->rows; r++) {
            int64_t g = tpd_model_layout_row_global(lay, (tpd_param)p, r);
            size_t at = tpd_model_layout_row_local(lay, (tpd_param)p, r);
            for (int c = 0; c < s->cols; c++, checked++) {
                float want = g < 0 ? 0.0f : tpd_model_init_value(&cfg, (tpd_param)p, g + c);
                ASSERT_EQ(std::memcmp(&got[at + c], &want, sizeof want), 0)
                    << "param " << p << " row " << r << " col " << c;
                nonzero += want != 0.0f;
            }
        }
    }
    EXPECT_EQ(checked, lay->numel);
    EXPECT_GT(nonzero, checked / 2); // the random parts dominate: not all zeros
    tpd_model_destroy(m);
    tpd_kern_backend_destroy(kb);
}

} // namespace
