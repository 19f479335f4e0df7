// The whole model against an independent double-precision GPT-2 and Llama written here from
// the definitions: GPT-2 (learned positions, pre-LN with eps 1e-5 and biased variance, tanh
// GELU, causal attention scaled by 1/sqrt(head_dim), head tied to wte) and the Llama block
// (RMSNorm, rotary positions in the rotate-half layout with base^(-2i/HS), SwiGLU
// down(silu(gate) * up), grouped-query attention, an untied output layer, no linear
// biases); padded vocab rows kept out of the softmax. The fp32 forward loss must match it,
// and every parameter gradient of the fp32 backward must match central finite differences
// of it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/tiny.h"

extern "C" {
#include "base/align.h"
#include "engine/plan/plan.h"
#include "engine/model/model.h"
#include "kernels/cpu/cpu.h"
#include "kernels/kernels.h"
}

namespace {

struct Ref {
    const tpd_model_layout *lay;
    int B, T;
    std::vector<int32_t> tok; // (B, T+1)

    const double *P(const std::vector<double> &w, tpd_param p, int l = 0) const {
        return w.data() + tpd_model_layout_piece(lay, p, l);
    }

    // the layout's tensor, or nullptr when the model has none (biases, norms' b, wpe)
    const double *Q(const std::vector<double> &w, tpd_param p, int l = 0) const {
        return lay->p[p].present ? P(w, p, l) : nullptr;
    }

    // LayerNorm (w, b) or RMSNorm (w; b == nullptr under rms)
    void norm(const double *x, const double *w, const double *b, double *y, int C) const {
        double eps = 1e-5;
        if (lay->d.rms) {
            double ss = 0;
            for (int i = 0; i < C; i++)
                ss += x[i] * x[i];
            double rstd = 1.0 / std::sqrt(ss / C + eps);
            for (int i = 0; i < C; i++)
                y[i] = x[i] * rstd * w[i];
            return;
        }
        double mean = 0, var = 0;
        for (int i = 0; i < C; i++)
            mean += x[i];
        mean /= C;
        for (int i = 0; i < C; i++)
            var += (x[i] - mean) * (x[i] - mean);
        var /= C;
        double rstd = 1.0 / std::sqrt(var + eps);
        for (int i = 0; i < C; i++)
            y[i] = (x[i] - mean) * rstd * w[i] + b[i];
    }
    // Qwen3's QK norm of one head vector: RMSNorm over its HS
    static void head_norm(double *v, const double *w, int HS) {
        double ss = 0;
        for (int i = 0; i < HS; i++)
            ss += v[i] * v[i];
        double rstd = 1.0 / std::sqrt(ss / HS + 1e-5);
        for (int i = 0; i < HS; i++)
            v[i] = v[i] * rstd * w[i];
    }
    // rotate-half RoPE of one head vector at position t
    static void rope(double *v, int HS, int t, double base) {
        for (int i = 0; i < HS / 2; i++) {
            double th = t * std::pow(base, -2.0 * i / HS), c = std::cos(th), s = std::sin(th);
            double a = v[i], b = v[i + HS / 2];
            v[i] = a * c - b * s;
            v[i + HS / 2] = a * s + b * c;
        }
    }
    // y(OC) = W(OC,C) x + b
    static void linear(const double *x, const double *W, const double *b, double *y, int C,
                       int OC) {
        for (int o = 0; o < OC; o++) {
            double s = b ? b[o] : 0;
            for (int i = 0; i < C; i++)
                s += W[(size_t)o * C + i] * x[i];
            y[o] = s;
        }
    }
    static double gelu(double x) {
        return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    }

    double loss(const std::vector<double> &w) const {
        const tpd_model_dims &d = lay->d;
        int C = d.C, F = d.F, NH = d.NH, HS = d.HS, KV = d.NKV * HS, G = d.NH / d.NKV;
        int QKV = C + 2 * KV, FC = d.glu ? 2 * F : F;
        double base = 10000.0;
        double total = 0;
        for (int b = 0; b < B; b++) {
            std::vector<std::vector<double>> x(T, std::vector<double>(C));
            for (int t = 0; t < T; t++) {
                int v = tok[(size_t)b * (T + 1) + t];
                const double *wpe = Q(w, TPD_P_WPE);
                for (int i = 0; i < C; i++)
                    x[t][i] =
                        P(w, TPD_P_WTE)[(size_t)v * C + i] + (wpe ? wpe[(size_t)t * C + i] : 0);
            }
            for (int l = 0; l < d.L; l++) {
                std::vector<std::vector<double>> qkv(T, std::vector<double>(QKV)),
                    y(T, std::vector<double>(C));
                std::vector<double> ln(C);
                for (int t = 0; t < T; t++) {
                    norm(x[t].data(), P(w, TPD_P_LN1W, l), Q(w, TPD_P_LN1B, l), ln.data(), C);
                    linear(ln.data(), P(w, TPD_P_QKVW, l), Q(w, TPD_P_QKVB, l), qkv[t].data(), C,
                           QKV);
                    if (d.qkn) // the Q heads, then the K heads, each normalized before RoPE
                        for (int h = 0; h < NH + d.NKV; h++)
                            head_norm(qkv[t].data() + (size_t)h * HS,
                                      P(w, h < NH ? TPD_P_QNORMW : TPD_P_KNORMW, l), HS);
                    if (d.rope)
                        for (int h = 0; h < NH + d.NKV; h++) // the Q heads, then the K heads
                            rope(qkv[t].data() + (size_t)h * HS, HS, t, base);
                }
                for (int h = 0; h < NH; h++)
                    for (int t = 0; t < T; t++) {
                        int g = h / G; // the query head's K/V head
                        std::vector<double> a(t + 1);
                        double mx = -1e300, sum = 0;
                        for (int s = 0; s <= t; s++) {
                            double dot = 0;
                            for (int i = 0; i < HS; i++)
                                dot += qkv[t][h * HS + i] * qkv[s][C + g * HS + i];
                            a[s] = dot / std::sqrt((double)HS);
                            mx = std::max(mx, a[s]);
                        }
                        for (int s = 0; s <= t; s++)
                            sum += (a[s] = std::exp(a[s] - mx));
                        for (int i = 0; i < HS; i++) {
                            double o = 0;
                            for (int s = 0; s <= t; s++)
                                o += a[s] / sum * qkv[s][C + KV + g * HS + i];
                            y[t][h * HS + i] = o;
                        }
                    }
                for (int t = 0; t < T; t++) {
                    std::vector<double> proj(C), ln2(C), fc(FC), act(F), out(C);
                    linear(y[t].data(), P(w, TPD_P_ATTPROJW, l), Q(w, TPD_P_ATTPROJB, l),
                           proj.data(), C, C);
                    for (int i = 0; i < C; i++)
                        x[t][i] += proj[i];
                    norm(x[t].data(), P(w, TPD_P_LN2W, l), Q(w, TPD_P_LN2B, l), ln2.data(), C);
                    linear(ln2.data(), P(w, TPD_P_FCW, l), Q(w, TPD_P_FCB, l), fc.data(), C, FC);
                    for (int i = 0; i < F; i++) // gelu(fc), or silu(gate) * up of [gate | up]
                        act[i] = d.glu ? fc[i] / (1 + std::exp(-fc[i])) * fc[F + i] : gelu(fc[i]);
                    linear(act.data(), P(w, TPD_P_FCPROJW, l), Q(w, TPD_P_FCPROJB, l), out.data(),
                           F, C);
                    for (int i = 0; i < C; i++)
                        x[t][i] += out[i];
                }
            }
            for (int t = 0; t < T; t++) {
                std::vector<double> ln(C), logits(d.V);
                norm(x[t].data(), P(w, TPD_P_LNFW), Q(w, TPD_P_LNFB), ln.data(), C);
                linear(ln.data(), P(w, d.tied ? TPD_P_WTE : TPD_P_LMHEAD), nullptr, logits.data(),
                       C, d.V); // real rows only
                double mx = -1e300, sum = 0;
                for (double v : logits)
                    mx = std::max(mx, v);
                for (double v : logits)
                    sum += std::exp(v - mx);
                total += std::log(sum) + mx - logits[tok[(size_t)b * (T + 1) + t + 1]];
            }
        }
        return total / (B * T);
    }
};

class ModelGrad : public ::testing::TestWithParam<const char *> {};

// recompute none keeps every activation; full keeps each layer's input and recomputes the
// layer forward in the backward: both must give the reference's gradients. "llama-...":
// the same with the Llama block (4 query heads in 2 K/V groups); "qwen3-...": Llama's with
// Qwen3's QK norm (2 query heads of size 4 over one K/V head).
TEST_P(ModelGrad, ForwardAndBackwardMatchDoubleReference) {
    tpd_config cfg = tiny::config("");
    // "full-2": full recompute of the first 2 layers only (Megatron's block method)
    std::string param = GetParam();
    bool qwen3 = param.rfind("qwen3-", 0) == 0;
    bool llama = qwen3 || param.rfind("llama-", 0) == 0;
    if (llama) param = param.substr(6);
    size_t dash = param.find('-');
    if (dash != std::string::npos)
        cfg.training.recompute_num_layers = std::stoi(param.substr(dash + 1));
    tiny::set(cfg.training.recompute, "training.recompute", param.substr(0, dash).c_str());
    cfg.model.num_layers = 2;
    cfg.model.hidden_size = 8;
    cfg.model.num_attention_heads = 2;
    cfg.model.ffn_hidden_size = 12;
    cfg.model.vocab_size = 11;
    cfg.model.make_vocab_size_divisible_by = 8; // Vp = 16: five padded rows
    cfg.model.seq_length = 5;
    cfg.model.max_position_embeddings = 6;
    cfg.model.init_method_std = 0.3; // large enough that every path matters
    cfg.training.micro_batch_size = 2;
    cfg.training.global_batch_size = 2;
    if (llama) {
        tiny::llama(cfg);
        cfg.model.num_attention_heads = 4; // head size 2: RoPE rotates one pair per head
        cfg.model.num_query_groups = 2;
        cfg.model.ffn_hidden_size = 6; // gate and up
        cfg.model.max_position_embeddings = 5;
    }
    if (qwen3) {
        cfg.model.qk_layernorm = 1;
        cfg.model.num_attention_heads = 2; // head size 4
        cfg.model.num_query_groups = 1;
    }

    tpd_kern_config kc = TPD_KERN_CONFIG_INIT;
    kc.num_threads = 1;
    tpd_kern_backend *kb = nullptr;
    ASSERT_EQ(tpd_kern_cpu_create(&kc, &kb), TPD_OK);
    tpd_model *m = nullptr;
    ASSERT_EQ(tpd_model_create(&cfg, kb, nullptr, 1, 0, 1, 1, 0, &m), TPD_OK);
    tpd_dp_plan dpp;
    ASSERT_EQ(tpd_dp_plan_init(m->plan.lay.numel, 1 << 20, 1, 0, 0, &dpp), TPD_OK);
    ASSERT_EQ(tpd_model_init_params(m, &dpp), TPD_OK);
    // Non-trivial LayerNorm and bias values too.
    std::vector<float> pf(m->plan.lay.numel);
    memcpy(pf.data(), m->params, pf.size() * 4);
    for (size_t i = 0; i < pf.size(); i++)
        pf[i] += 0.05f * (float)std::sin(0.7 * i);
    for (int r = cfg.model.vocab_size; r < m->d.Vp; r++) // padding rows stay zero
        for (int c = 0; c < m->d.C; c++)
            pf[tpd_model_layout_row_local(&m->plan.lay, TPD_P_WTE, r) + c] = 0;
    memcpy(m->params, pf.data(), pf.size() * 4);

    Ref ref{&m->plan.lay, 2, 5, {}};
    for (int i = 0; i < 2 * 6; i++)
        ref.tok.push_back((i * 5 + 3) % 11);
    const tpd_model_mb at = {0, 0, 0};
    ASSERT_EQ(tpd_model_set_batch(m, &at, ref.tok.data()), TPD_OK);
    ASSERT_EQ(tpd_model_zero_grads(m), TPD_OK);
    ASSERT_EQ(tpd_model_forward(m, &at), TPD_OK);
    double sum = 0;
    ASSERT_EQ(tpd_model_loss_sum(m, &at, &sum), TPD_OK);
    int N = 2 * 5;
    // The backend-side accumulator the trainer reads once a step: the same sum, divided and
    // added in double (the same bits), and zero again once taken.
    double acc = -1;
    ASSERT_EQ(tpd_model_loss_acc(m, &at, (double)N), TPD_OK);
    ASSERT_EQ(tpd_model_loss_acc(m, &at, (double)N), TPD_OK);
    ASSERT_EQ(tpd_model_loss_take(m, &acc), TPD_OK);
    EXPECT_EQ(acc, sum / N + sum / N);
    ASSERT_EQ(tpd_model_loss_take(m, &acc), TPD_OK);
    EXPECT_EQ(acc, 0.0);
    ASSERT_EQ(tpd_model_backward(m, &at, 1.0f / N), TPD_OK);

    std::vector<double> w(pf.begin(), pf.end());
    double ref_loss = ref.loss(w);
    EXPECT_NEAR(sum / N, ref_loss, 1e-5 * std::fabs(ref_loss));

    const float *g = (const float *)m->grads;
    const double h = 1e-5;
    double worst = 0;
    for (int p = 0; p < TPD_P_COUNT; p++) {
        const tpd_param_slice &s = m->plan.lay.p[p];
        if (!s.present) continue;
        for (size_t k = 0; k < s.numel; k++) { // element k of the tensor: layer piece by piece
            size_t piece = (size_t)s.rows * s.cols;
            size_t i =
                tpd_model_layout_piece(&m->plan.lay, (tpd_param)p, (int)(k / piece)) + k % piece;
            double save = w[i];
            w[i] = save + h;
            double lp = ref.loss(w);
            w[i] = save - h;
            double lm = ref.loss(w);
            w[i] = save;
            double fd = (lp - lm) / (2 * h);
            double err = std::fabs(fd - g[i]);
            worst = std::max(worst, err);
            // fp32 backward vs double FD: absolute 2e-5 plus 1e-3 relative
            ASSERT_LE(err, 2e-5 + 1e-3 * std::fabs(fd))
                << tpd_param_get_info((tpd_param)p)->name << " element " << k << " fd " << fd
                << " backward " << g[i];
        }
    }
    printf("model backward vs double finite differences: worst abs error %.3g\n", worst);
    tpd_dp_plan_free(&dpp);
    tpd_model_destroy(m);
    tpd_kern_backend_destroy(kb);
}

INSTANTIATE_TEST_SUITE_P(Recompute, ModelGrad,
                         ::testing::Values("none", "selective", "full", "full-1", "llama-none",
                                           "llama-selective", "llama-full-1", "qwen3-none",
                                           "qwen3-full-1"),
                         [](const testing::TestParamInfo<const char *> &i) {
                             std::string n = i.param;
                             for (char &ch : n)
                                 ch = ch == '-' ? '_' : ch;
                             return n;
                         });

// Every view of a rank's buffers lies inside its block: parameters in the flat buffer,
// each slot region inside a slot, each workspace region inside the workspace.
void ExpectViewsInsideBlocks(const tpd_model *m, const std::string &where) {
    const tpd_buffer_plan &b = m->plan;
    const tpd_model_dims &d = b.lay.d;
    // the parameter pieces tile [0, numel) without overlap (layer-major buffer)
    std::vector<std::pair<size_t, size_t>> pieces;
    for (int p = 0; p < TPD_P_COUNT; p++) {
        const tpd_param_slice &s = b.lay.p[p];
        if (!s.present) continue;
        for (int l = 0; l < s.layers; l++)
            pieces.push_back(
                {tpd_model_layout_piece(&b.lay, (tpd_param)p, l), (size_t)s.rows * s.cols});
    }
    std::sort(pieces.begin(), pieces.end());
    size_t end = 0;
    for (const auto &pc : pieces) {
        EXPECT_EQ(pc.first, end) << where << " a parameter piece follows the one before";
        end = pc.first + pc.second;
    }
    EXPECT_EQ(end, b.lay.numel) << where;
    EXPECT_LE(end, b.numel_padded) << where;
    size_t N = (size_t)d.B * d.T, NL = (size_t)d.Nl, C = (size_t)d.C, a = b.act_size;
    int kept_max = 0; // layers a chunk keeps whole
    for (int c = 0; c < d.v; c++)
        kept_max = std::max(kept_max, d.chunk_layers[c] - b.recompute[c]);
    struct Region {
        size_t at, bytes, block;
        const char *name;
    } regions[] = {
        {b.s_tokens, N * 4, b.slot_bytes, "tokens"},
        {b.s_targets, N * 4, b.slot_bytes, "targets"},
        {b.s_x0, NL * C * a, b.slot_bytes, "stage input"},
        {b.layer.ln1, NL * C * a, b.layer.bytes, "ln1"},
        {b.layer.qkv, N * 3 * (size_t)d.Cl * a, b.layer.bytes, "qkv"},
        {b.layer.atty, N * (size_t)d.Cl * a, b.layer.bytes, "attention out"},
        {b.layer.fch_gelu, N * (size_t)d.Fl * a, b.layer.bytes, "fc gelu"},
        {b.layer.out, NL * C * a, b.layer.bytes, "layer out"},
        {b.s_layers, b.layer.bytes * (size_t)kept_max, b.slot_bytes, "layers"},
        {b.s_outs, tpd_align_up(NL * C * a) * (size_t)b.recompute_max, b.slot_bytes,
         "recomputed outputs"},
        {b.w_dres, NL * C * a, b.ws_bytes, "dres"},
        {b.w_dln, N * C * a, b.ws_bytes, "dln"},
        {b.w_dqkv, N * 3 * (size_t)d.Cl * a, b.ws_bytes, "dqkv"},
        {b.w_dfch, N * (size_t)d.Fl * a, b.ws_bytes, "dfch"},
    };
    for (const Region &r : regions)
        EXPECT_LE(r.at + r.bytes, r.block) << where << " " << r.name;
    if (d.last) EXPECT_LE(b.h_logits + N * (size_t)d.Vl * a, b.head_bytes) << where << " logits";
    if (d.last) EXPECT_LE(b.h_loss + N * 4, b.head_bytes) << where << " loss";
    if (b.recompute_max) EXPECT_LE(b.w_layer + b.layer.bytes, b.ws_bytes) << where << " w_layer";
    if (b.selective) EXPECT_LE(b.w_att + b.att_saved, b.ws_bytes) << where << " w_att";
}

TEST(ModelMemory, AllocationEqualsPlan) {
    // The bytes the model allocates (counted by the cpu backend) are the bytes that
    // tripod plan predicts, which the planner computes in closed form without the
    // engine's buffer plan: an independent computation of the same memory. GPT-2 and the
    // Llama block (2 K/V groups: TP up to 2), and Qwen3's (Llama's with the QK norm).
    tpd_kern_config kc = TPD_KERN_CONFIG_INIT;
    tpd_kern_backend *kb = nullptr;
    ASSERT_EQ(tpd_kern_cpu_create(&kc, &kb), TPD_OK);
    int checked = 0;
    for (int block : {0, 1, 2}) // GPT-2, Llama, Qwen3
        for (int tp : {1, 2, 4})
            for (int pp : {1, 2, 4})
                for (int dp : {1, 2}) {
                    bool llama = block > 0;
                    if (llama && tp == 4) continue;
                    tpd_config cfg = tiny::config("");
                    if (llama) tiny::llama(cfg);
                    cfg.model.qk_layernorm = block == 2;
                    cfg.parallel.tensor_model_parallel_size = tp;
                    cfg.parallel.pipeline_model_parallel_size = pp;
                    for (int zero : {0, 1})
                        for (int sp : {0, 1})
                            for (const char *rc : {"none", "selective", "full", "full-1"}) {
                                if (sp && tp == 1) continue;
                                cfg.training.recompute_num_layers = strcmp(rc, "full-1") == 0;
                                cfg.parallel.use_distributed_optimizer = zero;
                                cfg.parallel.sequence_parallel = sp;
                                tiny::set(cfg.training.recompute, "training.recompute",
                                          std::string(rc, strcspn(rc, "-")).c_str());
                                tpd_plan_layout lay;
                                tpd_plan_layout_from_config(&cfg, tp * pp * dp, &lay);
                                for (int stage = 0; stage < pp; stage++) {
                                    std::string where =
                                        "tp " + std::to_string(tp) + " pp " + std::to_string(pp) +
                                        " dp " + std::to_string(dp) + " stage " +
                                        std::to_string(stage) + " zero " + std::to_string(zero) +
                                        " sp " + std::to_string(sp) + " recompute " + rc +
                                        (block == 2 ? " Qwen3"
                                         : llama    ? " Llama"
                                                    : "");
                                    tpd_plan_stage_mem pred;
                                    ASSERT_EQ(tpd_plan_cpu_memory(&cfg, &lay, stage, &pred),
                                              TPD_OK);
                                    size_t before = tpd_kern_cpu_bytes_allocated(kb);
                                    tpd_model *m = nullptr;
                                    ASSERT_EQ(tpd_model_create(&cfg, kb, nullptr, tp, 0, pp, dp,
                                                               stage, &m),
                                              TPD_OK);
                                    size_t device = tpd_kern_cpu_bytes_allocated(kb) - before;
                                    // token staging: inputs and targets per slot
                                    size_t host = (size_t)m->plan.nslots * 2 *
                                                  cfg.training.micro_batch_size *
                                                  cfg.model.seq_length * 4;
                                    EXPECT_EQ((double)(device + host), pred.total) << where;
                                    EXPECT_EQ((double)m->bytes_allocated, pred.total) << where;
                                    // category by category, for a message that says which one moved
                                    EXPECT_EQ((double)m->plan.mem.params, pred.params) << where;
                                    EXPECT_EQ((double)m->plan.mem.grads, pred.grads) << where;
                                    EXPECT_EQ((double)(m->plan.mem.optimizer + m->plan.mem.master),
                                              pred.optimizer)
                                        << where;
                                    EXPECT_EQ((double)m->plan.mem.activations, pred.activations)
                                        << where;
                                    EXPECT_EQ((double)m->plan.mem.workspace, pred.workspace)
                                        << where;
                                    ExpectViewsInsideBlocks(m, where);
                                    tpd_model_destroy(m);
                                    checked++;
                                }
                            }
                }
    EXPECT_GT(checked, 350);
    tpd_kern_backend_destroy(kb);
}

} // namespace
