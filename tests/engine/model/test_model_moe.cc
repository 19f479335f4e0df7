// The mixture-of-experts block (engine/model/model_moe.c) on one rank: every parameter
// gradient (the router, the experts, the shared experts and their gate, and the rest of
// the model) against central finite differences of the objective the backward
// differentiates (the lm loss plus the load-balancing and z losses), for the GPT-2 family
// (GELU experts, Mixtral's top-k softmax) and the Llama family (SwiGLU experts, HF's
// softmax-then-top-k with renormalized weights); and the capacity factor's drops.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "common/tiny.h"

extern "C" {
#include "engine/model/model.h"
#include "engine/model/model_layout.h"
#include "kernels/kernels.h"
}

namespace {

struct MoeRun {
    tpd_kern_backend *kb = nullptr;
    tpd_model *m = nullptr;
    std::vector<int32_t> tok;
    explicit MoeRun(const tpd_config &cfg) {
        tpd_kern_config kc = TPD_KERN_CONFIG_INIT;
        kc.num_threads = 1;
        EXPECT_EQ(tpd_kern_cpu_create(&kc, &kb), TPD_OK);
        EXPECT_EQ(tpd_model_create(&cfg, kb, nullptr, 1, 0, 1, 1, 0, &m), TPD_OK);
        tpd_dp_plan dpp;
        EXPECT_EQ(tpd_dp_plan_init(m->plan.lay.numel, 1 << 20, 1, 0, 0, &dpp), TPD_OK);
        EXPECT_EQ(tpd_model_init_params(m, &dpp), TPD_OK);
        tpd_dp_plan_free(&dpp);
        for (int i = 0; i < cfg.training.micro_batch_size * (cfg.model.seq_length + 1); i++)
            tok.push_back((i * 5 + 3) % cfg.model.vocab_size);
    }
    ~MoeRun() {
        tpd_model_destroy(m);
        tpd_kern_backend_destroy(kb);
    }
    // The objective at the current parameters: the summed per-token loss plus N x (the
    // two MoE losses), which the backward with dloss 1 differentiates.
    double objective() {
        const tpd_model_mb at = {0, 0, 0};
        m->moe.aux = m->moe.z = 0;
        EXPECT_EQ(tpd_model_set_batch(m, &at, tok.data()), TPD_OK);
        EXPECT_EQ(tpd_model_forward(m, &at), TPD_OK);
        double sum = 0;
        EXPECT_EQ(tpd_model_loss_sum(m, &at, &sum), TPD_OK);
        return sum + (double)m->d.B * m->d.T * (m->moe.aux + m->moe.z);
    }
};

// freq: model.moe_layer_freq (2: layer 0 MoE, layer 1 a dense MLP of ffn_hidden_size)
void check_gradients(bool llama, int freq = 1) {
    tpd_config cfg = tiny::moe_small(llama);
    cfg.model.moe_layer_freq = freq;
    MoeRun r(cfg);
    tpd_model *m = r.m;
    ASSERT_NE(m, nullptr);
    float *p = (float *)m->params;
    size_t n = m->plan.lay.numel;
    for (size_t i = 0; i < n; i++) // every bias and norm weight off its init
        p[i] += 0.05f * (float)std::sin(0.7 * i);
    for (int row = cfg.model.vocab_size; row < m->d.Vp; row++)
        for (int c = 0; c < m->d.C; c++)
            p[tpd_model_layout_row_local(&m->plan.lay, TPD_P_WTE, row) + c] = 0;
    const tpd_model_mb at = {0, 0, 0};
    ASSERT_EQ(tpd_model_zero_grads(m), TPD_OK);
    double j0 = r.objective();
    ASSERT_GT(m->moe.aux, 0.0);
    ASSERT_GT(m->moe.z, 0.0);
    ASSERT_EQ(tpd_model_backward(m, &at, 1.0f), TPD_OK);
    std::vector<float> g((const float *)m->grads, (const float *)m->grads + n);
    // the routing at the base point: an element whose step flips a top-k choice (or the
    // order of the expert blocks) is skipped, the objective being discontinuous there
    const tpd_act_layer &o = m->plan.layer;
    auto routing = [&]() {
        std::vector<int32_t> t;
        for (int l = 0; l < m->d.Ls; l++) {
            if (!tpd_model_dims_layer_moe(&m->d, l)) continue;
            const char *b = m->acts + m->plan.s_layers + tpd_act_layers_bytes(&m->plan, 0, 0, l);
            const int32_t *ti = (const int32_t *)(b + o.moe_topi);
            t.insert(t.end(), ti, ti + (size_t)m->d.B * m->d.T * m->d.topk);
        }
        return t;
    };
    std::vector<int32_t> base = routing();
    const double h = 3e-3;
    double worst = 0;
    int checked = 0, skipped = 0;
    for (int q = 0; q < TPD_P_COUNT; q++) {
        const tpd_param_slice &s = m->plan.lay.p[q];
        if (!s.present) continue;
        int checked_q = 0;
        for (size_t k = 0; k < s.numel; k++) {
            size_t piece = (size_t)s.rows * s.cols;
            size_t i =
                tpd_model_layout_piece(&m->plan.lay, (tpd_param)q, (int)(k / piece)) + k % piece;
            if (q == TPD_P_WTE && (int)(k / s.cols) >= cfg.model.vocab_size) continue;
            float save = p[i];
            p[i] = save + (float)h;
            double jp = r.objective();
            bool same = routing() == base;
            p[i] = save - (float)h;
            double jm = r.objective();
            same = same && routing() == base;
            p[i] = save;
            if (!same) {
                skipped++;
                continue;
            }
            double fd = (jp - jm) / (2 * h);
            double err = std::fabs(fd - g[i]);
            worst = std::max(worst, err / (1e-3 + std::fabs(fd)));
            // fp32 forward: the objective's rounding (about 1e-6 of j0) over 2h, and the
            // central difference's h^2 term
            EXPECT_LE(err, 3e-3 + 2e-2 * std::fabs(fd))
                << tpd_param_get_info((tpd_param)q)->name << " element " << k << " fd " << fd
                << " backward " << g[i];
            checked++;
            checked_q++;
        }
        EXPECT_GT(checked_q, 0) << tpd_param_get_info((tpd_param)q)->name << " never checked";
    }
    EXPECT_LT(skipped, checked / 8) << "too many routing flips to trust the check";
    printf("%s MoE (every %d layers): %d gradients against finite differences (%d skipped at "
           "routing flips), worst relative error %.3g, objective %.6f\n",
           llama ? "Llama" : "GPT-2", freq, checked, skipped, worst, j0);
}

TEST(ModelMoe, GradientsMatchFiniteDifferencesGpt2) {
    check_gradients(false);
}

TEST(ModelMoe, GradientsMatchFiniteDifferencesLlama) {
    check_gradients(true);
}

// A stack that mixes a MoE layer (0) and a dense one (1): the dense layer's fcw .. fcprojb
// (ffn_hidden_size wide) and the MoE layer's router, experts and shared experts each hold
// one layer, and every one of their gradients is checked.
TEST(ModelMoe, GradientsMatchFiniteDifferencesMixedStack) {
    tpd_config cfg = tiny::moe_small(false);
    cfg.model.moe_layer_freq = 2;
    tpd_model_layout lay;
    ASSERT_EQ(tpd_model_layout_init(&cfg, 1, 0, 1, 0, &lay), TPD_OK);
    for (tpd_param p : {TPD_P_FCW, TPD_P_FCPROJW, TPD_P_ROUTERW, TPD_P_EXPFCW, TPD_P_SHFCW}) {
        EXPECT_EQ(lay.p[p].layers, 1) << tpd_param_get_info(p)->name;
        EXPECT_EQ(lay.p[p].g_layers, 1) << tpd_param_get_info(p)->name;
    }
    EXPECT_EQ(lay.p[TPD_P_FCPROJW].g_cols, cfg.model.ffn_hidden_size);
    EXPECT_EQ(lay.p[TPD_P_SHPROJW].g_cols, cfg.model.moe_shared_expert_intermediate_size);
    EXPECT_EQ(lay.p[TPD_P_QKVW].layers, 2);
    check_gradients(false, 2);
    check_gradients(true, 2);
}

// moe_expert_capacity_factor: an expert keeps at most ceil(factor x N x k / E) of its
// assignments, first come in token order; the rest are dropped and counted.
TEST(ModelMoe, CapacityDropsAndCounts) {
    tpd_config cfg = tiny::moe_small(false);
    cfg.model.moe_expert_capacity_factor = 0.5;
    MoeRun r(cfg);
    ASSERT_NE(r.m, nullptr);
    r.m->moe.dropped = r.m->moe.assigned = 0;
    double j = r.objective();
    EXPECT_TRUE(std::isfinite(j));
    const tpd_model *m = r.m;
    int N = m->d.B * m->d.T, k = m->d.topk, E = m->d.E;
    int cap = (int)std::ceil(0.5 * N * k / E);
    const tpd_act_layer &o = m->plan.layer;
    int dropped = 0;
    for (int l = 0; l < m->d.Ls; l++) {
        const char *b = m->acts + m->plan.s_layers + (size_t)l * o.bytes;
        const int32_t *counts = (const int32_t *)(b + o.moe_counts);
        const int32_t *pos = (const int32_t *)(b + o.moe_pos);
        const int32_t *ti = (const int32_t *)(b + o.moe_topi);
        std::vector<int> seen(E, 0);
        int kept = 0;
        for (int e = 0; e < E; e++) {
            EXPECT_LE(counts[e], cap);
            kept += counts[e];
        }
        EXPECT_EQ(counts[E], kept);
        for (int a = 0; a < N * k; a++) { // first come: once an expert is full, it stays full
            if (pos[a] < 0) {
                EXPECT_EQ(seen[ti[a]], cap) << "dropped before its expert was full";
                dropped++;
            } else {
                seen[ti[a]]++;
            }
        }
    }
    EXPECT_GT(dropped, 0);
    EXPECT_EQ(m->moe.dropped, dropped);
    EXPECT_EQ(m->moe.assigned, (double)N * k * m->d.Ls);
}

} // namespace
