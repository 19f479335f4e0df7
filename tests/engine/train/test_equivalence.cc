// 3D-parallel equivalence: the same global batch trained under every TP x PP x DP layout
// (with and without ZeRO-1; and with sequence parallel, uneven stages and full recompute
// on a few; under the interleaved schedule and ZB-H1; with the DP communication overlapped
// or not) must match the single-rank run:
//   per-step loss within relative 1e-5 over 10 steps,
//   gradient norm within relative 1e-5,
//   final gathered parameters within relative 1e-4 (per tensor, ||a-b|| / ||b||);
// and the optimizer's copy gathered from its owners (tpd_trainer_gather_master) equals the
// gathered parameters bit for bit (fp32 on either backend).
// All layouts run inside one mpirun: each uses the first TP*PP*DP world ranks as its
// world (a split communicator), the rest wait at the next collective.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <vector>

#include "common/gpu.h"
#include "common/tiny.h"
#include "common/mpi_tests.h"

extern "C" {
#include "base/bf16.h"
#include "engine/train/train.h"
#include "engine/verify/verify.h"
#include "kernels/kernels.h"
#include "parallel/comm.h"
}

namespace {

tpd_comm *g_world = nullptr;
std::string g_data;
const int kSteps = 10;
// --device=cuda: the layouts run on the cuda backend (fp32; the ranks share the GPU, so
// the communicators stage through host memory) against the cpu single-rank reference.
bool g_cuda = false;

struct Result {
    std::vector<double> loss, norm, pnorm;  // pnorm: the weights' norm after each update
    std::vector<double> aux;                // MoE: the load-balancing loss of each step
    int tied_mismatch = 0;                  // elements where the first and last stage's wte differ
    std::vector<std::vector<float>> params; // per tensor, world rank 0 only
};

struct Layout {
    int tp, pp, dp, zero;
    bool cuda = false;
    std::vector<int> stage_layers;  // parallel.pipeline_layers; empty: even split
    const char *recompute = "none"; // training.recompute
    bool sp = false;                // parallel.sequence_parallel
    int recompute_layers = 0;       // training.recompute_num_layers
    int v = 1;                      // parallel.virtual_pipeline_model_parallel_size
    const char *schedule = "1f1b";  // parallel.pipeline_schedule
    int layers = 0;                 // model.num_layers; 0: tiny's 4
    bool overlap = true;            // parallel.overlap_grad_reduce and overlap_param_gather
    bool llama = false;             // the Llama block (tiny::llama)
    // parallel.data_parallel_sharding_strategy; -1: optim with zero, else no_shard
    int sharding = -1;
    int steps = kSteps;
    int gbs = 0;        // training.global_batch_size; 0: tiny's 16
    int shard_size = 0; // parallel.data_parallel_shard_size (HSDP); 0: all of DP
    int in_flight = 0;  // parallel.fsdp_units_in_flight; 0: the default
    int cp = 1;         // parallel.context_parallel_size
    bool a2a = false;   // parallel.cp_comm_type a2a (else p2p)
    int experts = 0;    // model.num_moe_experts (a MoE block of top-2 over them, with a
                        // gated shared expert and both router losses)
    int ep = 1;         // parallel.expert_model_parallel_size
    int moe_freq = 1;   // model.moe_layer_freq: layers i % moe_freq == 0 MoE, the rest dense
    bool bf16 = false;  // training.precision bf16 (the cpu backend's bf16 recipe)
    bool qkn = false;   // model.qk_layernorm (Qwen3's QK norm; with llama)
    int head_dim = 0;   // model.kv_channels (0: hidden_size / heads)
};

// bf16 on the cpu backend: bf16 weights and activations, fp32 master weights and main
// gradients.
Layout bf16(Layout L) {
    L.bf16 = true;
    return L;
}

// The mixture of experts: top-2 of 4 experts (a gated shared expert under GPT-2; under
// Llama, HF's softmax-then-top-k with renormalized weights), both router losses.
Layout moe(Layout L) {
    L.experts = 4;
    return L;
}

// A stack that mixes dense and MoE layers: every freq-th layer MoE (layer 0 first), the
// others dense MLPs of ffn_hidden_size.
Layout mixed(Layout L, int freq) {
    L.moe_freq = freq;
    return L;
}

// Expert parallelism: the MoE block with its experts split over ep of the DP ranks.
Layout epar(Layout L, int ep) {
    L = moe(L);
    L.ep = ep;
    return L;
}

// Context parallelism: cp ranks split each sequence, attention by the ring (p2p) or the
// all-to-all (a2a).
Layout cpar(Layout L, int cp, bool a2a) {
    L.cp = cp;
    L.a2a = a2a;
    return L;
}

int ranks(const Layout &L) {
    return L.tp * L.pp * L.dp * L.cp;
}

// Hybrid sharding: shard groups of h DP ranks, replicated across.
Layout hsdp(Layout L, int h) {
    L.shard_size = h;
    return L;
}

// A layout under a sharding strategy, trained for `steps` steps.
Layout sharded(Layout L, int strategy, int steps) {
    L.sharding = strategy;
    L.zero = strategy != TPD_DP_SHARDING_NO_SHARD;
    L.steps = steps;
    return L;
}

Layout llama(Layout L) {
    L.llama = true;
    return L;
}

// Qwen3's block: Llama's with an RMSNorm on every Q and K head before RoPE.
Layout qwen3(Layout L) {
    L = llama(L);
    L.qkn = true;
    return L;
}

// Heads of 12 (kv_channels) where hidden_size / heads is 8: the query heads span 48 of the
// hidden size's 32, as Qwen3's 128-wide heads do in most of its models.
Layout wide_heads(Layout L) {
    L.head_dim = 12;
    return L;
}

// A layout under another schedule or model depth: fields past the first four by name.
Layout with(Layout L, int v, const char *schedule, int layers) {
    L.v = v;
    L.schedule = schedule;
    L.layers = layers;
    return L;
}

// The tied embedding lives on the first and the last stage; after training both copies
// must be bit-identical (tpd_verify_tied_copies_differ: the count of differing elements,
// summed over the world). Collective over the trainer's world.
int tied_copies_differ(tpd_trainer *tr) {
    int32_t diff = -1;
    EXPECT_EQ(tpd_verify_tied_copies_differ(tr, &diff), TPD_OK);
    return diff;
}

// bf16 tolerances, against the bf16 single-rank run. u = 2^-8 is bf16's relative spacing
// (8 significant bits). A layout moves the points where partial sums are rounded to bf16
// (TP's all-reduce of partial activations, SP's reduce-scatter, the pipeline's split of
// micro-batches) and the order of the fp32 main gradients' sums (DP), so instead of fp32's
// 1e-5 / 1e-4:
// - the loss, a mean over the batch's 2048 tokens of fp32 log-softmaxes of bf16 logits with
//   independent rounding errors, within u/20 ~ 2e-4 per step (also the params' norm and
//   the load-balancing loss);
// - the gradient norm, a norm of gradients computed from bf16 activations, within u ~ 4e-3;
// - each parameter tensor after 10 AdamW steps within 8u ~ 3e-2: AdamW divides by
//   sqrt(v), so a relative error of a gradient becomes the same relative error of its step,
//   and steps add up.
// The QKV bias is left out of the per-tensor check: its K part has a zero gradient in exact
// arithmetic (a shift of every key's score by the same q.b is cancelled by the softmax), so
// AdamW turns pure rounding noise into full-sized steps there (under fp32 too, but below its
// tolerance).
constexpr double kBf16Loss = 2e-4, kBf16Norm = 4e-3, kBf16Param = 3e-2;

// Whether the per-tensor parameter check covers p under L (see the bf16 tolerances).
bool param_checked(const Layout &L, int p) {
    return !(L.bf16 && p == TPD_P_QKVB);
}

// Runs a layout on the first tp*pp*dp ranks. Collective over g_world.
Result run(const Layout &L) {
    Result r;
    int n = ranks(L);
    tpd_comm *sub = nullptr;
    int member = tpd_comm_rank(g_world) < n;
    EXPECT_EQ(tpd_comm_split(g_world, member ? 0 : -1, tpd_comm_rank(g_world), "layout", &sub),
              TPD_OK);
    if (member) {
        tpd_config cfg = tiny::config(g_data);
        cfg.parallel.tensor_model_parallel_size = L.tp;
        cfg.parallel.pipeline_model_parallel_size = L.pp;
        cfg.parallel.use_distributed_optimizer = L.zero;
        cfg.parallel.data_parallel_sharding_strategy =
            L.sharding >= 0 ? (tpd_dp_sharding)L.sharding
                            : (L.zero ? TPD_DP_SHARDING_OPTIM : TPD_DP_SHARDING_NO_SHARD);
        if (L.gbs) cfg.training.global_batch_size = L.gbs;
        cfg.parallel.data_parallel_shard_size = L.shard_size;
        if (L.in_flight) cfg.parallel.fsdp_units_in_flight = L.in_flight;
        cfg.training.train_iters = L.steps;
        cfg.logging.log_params_norm = 1;
        if (L.cuda) cfg.training.device = TPD_DEVICE_CUDA;
        if (L.bf16) cfg.training.precision = TPD_PRECISION_BF16;
        tiny::set(cfg.training.recompute, "training.recompute", L.recompute);
        cfg.parallel.sequence_parallel = L.sp;
        cfg.training.recompute_num_layers = L.recompute_layers;
        cfg.parallel.virtual_pipeline_model_parallel_size = L.v;
        tiny::set(cfg.parallel.pipeline_schedule, "parallel.pipeline_schedule", L.schedule);
        if (L.llama) tiny::llama(cfg);
        cfg.model.qk_layernorm = L.qkn;
        cfg.model.kv_channels = L.head_dim;
        if (L.layers) cfg.model.num_layers = L.layers;
        if (L.experts) {
            cfg.model.num_moe_experts = L.experts;
            cfg.model.moe_router_topk = 2;
            cfg.model.moe_ffn_hidden_size = 32;
            cfg.model.moe_aux_loss_coeff = 0.01;
            cfg.model.moe_z_loss_coeff = 0.001;
            if (L.llama) {
                cfg.model.moe_router_pre_softmax = 1;
                cfg.model.moe_norm_topk_prob = 1;
            } else {
                cfg.model.moe_shared_expert_intermediate_size = 16;
                cfg.model.moe_shared_expert_gate = 1;
            }
        }
        cfg.model.moe_layer_freq = L.moe_freq;
        cfg.parallel.expert_model_parallel_size = L.ep;
        cfg.parallel.context_parallel_size = L.cp;
        cfg.parallel.cp_comm_type = L.a2a ? TPD_CP_COMM_A2A : TPD_CP_COMM_P2P;
        cfg.parallel.overlap_grad_reduce = L.overlap;
        cfg.parallel.overlap_param_gather = L.overlap;
        cfg.parallel.num_pipeline_layers = (int)L.stage_layers.size();
        for (size_t i = 0; i < L.stage_layers.size(); i++)
            cfg.parallel.pipeline_layers[i] = L.stage_layers[i];
        tpd_trainer *tr = nullptr;
        EXPECT_EQ(tpd_trainer_create(&cfg, sub, &tr), TPD_OK);
        if (tr) {
            for (int i = 0; i < L.steps; i++) {
                tpd_step_stats s;
                EXPECT_EQ(tpd_trainer_step(tr, &s), TPD_OK);
                r.loss.push_back(s.lm_loss);
                r.norm.push_back(s.grad_norm);
                r.pnorm.push_back(s.params_norm);
                if (s.moe) r.aux.push_back(s.moe_aux_loss);
            }
            EXPECT_EQ(tpd_trainer_sync_params(tr), TPD_OK);
            r.tied_mismatch = tied_copies_differ(tr);
            for (int p = 0; p < TPD_P_COUNT; p++) {
                std::vector<float> g(
                    tpd_model_layout_global_numel(&tpd_trainer_model(tr)->plan.lay, (tpd_param)p));
                EXPECT_EQ(tpd_trainer_gather_param(tr, (tpd_param)p,
                                                   tpd_comm_rank(sub) == 0 ? g.data() : nullptr),
                          TPD_OK);
                // the optimizer's own copy, from each element's owner in the DP plan (what
                // `verify --device cuda` reads as the master weights): the same bits in fp32,
                // and under bf16 the parameters are the master rounded to bf16
                std::vector<float> o(g.size());
                EXPECT_EQ(tpd_trainer_gather_master(tr, (tpd_param)p,
                                                    tpd_comm_rank(sub) == 0 ? o.data() : nullptr),
                          TPD_OK);
                if (L.bf16)
                    for (float &x : o)
                        x = tpd_bf16_to_f32(tpd_bf16_from_f32(x));
                if (tpd_comm_rank(sub) == 0 && !g.empty())
                    EXPECT_EQ(std::memcmp(o.data(), g.data(), g.size() * 4), 0)
                        << "tpd_trainer_gather_master differs from tpd_trainer_gather_param in "
                        << tpd_param_get_info((tpd_param)p)->name << " at TP " << L.tp << " PP "
                        << L.pp << " DP " << L.dp << " CP " << L.cp << " zero " << L.zero
                        << " sharding " << L.sharding << " shard size " << L.shard_size;
                r.params.push_back(g);
            }
            tpd_trainer_destroy(tr);
        }
        tpd_comm_destroy(sub);
    }
    tpd_comm_barrier(g_world);
    return r;
}

// Checks one layout's run against the reference run (world rank 0 only; 1 when it was).
int check_layout(const Result &ref, const Layout &L) {
    Result r = run(L);
    if (tpd_comm_rank(g_world) != 0) return 0;
    std::string stages;
    for (int n : L.stage_layers)
        stages += (stages.empty() ? " stages " : ",") + std::to_string(n);
    if (strcmp(L.recompute, "none")) stages += std::string(" recompute ") + L.recompute;
    if (L.recompute_layers) stages += " of " + std::to_string(L.recompute_layers) + " layer(s)";
    if (L.sp) stages += " sequence parallel";
    if (strcmp(L.schedule, "1f1b")) stages += std::string(" ") + L.schedule;
    if (L.v > 1) stages += " v " + std::to_string(L.v);
    if (L.layers) stages += " (" + std::to_string(L.layers) + " layers)";
    if (!L.overlap) stages += " no overlap";
    if (L.llama) stages += L.qkn ? " Qwen3 (QK norm)" : " Llama";
    if (L.head_dim) stages += " heads of " + std::to_string(L.head_dim);
    static const char *const kStrategy[] = {"no_shard", "optim", "optim_grads",
                                            "optim_grads_params"};
    if (L.sharding >= 0) stages += std::string(" ") + kStrategy[L.sharding];
    if (L.shard_size) stages += " HSDP shard " + std::to_string(L.shard_size);
    if (L.in_flight) stages += " " + std::to_string(L.in_flight) + " units in flight";
    if (L.cp > 1) stages += " CP " + std::to_string(L.cp) + (L.a2a ? " a2a" : " p2p");
    if (L.experts) stages += " MoE " + std::to_string(L.experts) + " experts";
    if (L.experts && L.moe_freq > 1) stages += " every " + std::to_string(L.moe_freq) + " layers";
    if (L.bf16) stages += " bf16";
    SCOPED_TRACE(testing::Message() << "TP " << L.tp << " PP " << L.pp << " DP " << L.dp
                                    << " ZeRO-1 " << L.zero << stages);
    EXPECT_EQ(r.loss.size(), ref.loss.size());
    if (r.loss.size() != ref.loss.size()) return 0;
    EXPECT_EQ(r.aux.size(), ref.aux.size()) << "MoE on one side only";
    double worst_loss = 0, worst_norm = 0, worst_param = 0;
    // fp32: 1e-5 for the loss, the norms and the load-balancing loss, 1e-4 for parameters.
    // bf16: see Bf16MatchesSingleRankBf16 (kBf16*).
    const double tol = L.bf16 ? kBf16Loss : 1e-5, tol_norm = L.bf16 ? kBf16Norm : 1e-5;
    const double tol_param = L.bf16 ? kBf16Param : 1e-4;
    for (size_t i = 0; i < r.loss.size(); i++) {
        double el = std::fabs(r.loss[i] - ref.loss[i]) / std::fabs(ref.loss[i]);
        double en = std::fabs(r.norm[i] - ref.norm[i]) / std::fabs(ref.norm[i]);
        EXPECT_LE(el, tol) << "step " << i + 1 << " loss " << r.loss[i] << " vs " << ref.loss[i];
        EXPECT_LE(en, tol_norm) << "step " << i + 1 << " grad norm " << r.norm[i] << " vs "
                                << ref.norm[i];
        // every parameter once: TP-replicated ones and the tied embedding too
        EXPECT_LE(std::fabs(r.pnorm[i] - ref.pnorm[i]) / ref.pnorm[i], tol)
            << "step " << i + 1 << " params norm " << r.pnorm[i] << " vs " << ref.pnorm[i];
        if (i < ref.aux.size() && i < r.aux.size())
            EXPECT_LE(std::fabs(r.aux[i] - ref.aux[i]) / ref.aux[i], tol)
                << "step " << i + 1 << " load-balancing loss " << r.aux[i] << " vs " << ref.aux[i];
        worst_loss = std::max(worst_loss, el);
        worst_norm = std::max(worst_norm, en);
    }
    EXPECT_EQ(r.tied_mismatch, 0) << "the first and last stage's wte copies differ";
    for (int p = 0; p < TPD_P_COUNT; p++) {
        if (!param_checked(L, p)) continue;
        double e =
            tpd_verify_rel_diff(r.params[p].data(), ref.params[p].data(), ref.params[p].size());
        EXPECT_LE(e, tol_param) << "parameter " << tpd_param_get_info((tpd_param)p)->name;
        worst_param = std::max(worst_param, e);
    }
    printf("TP %d PP %d DP %d ZeRO-1 %d%s%s: worst relative error loss %.2e, grad norm %.2e, "
           "params %.2e\n",
           L.tp, L.pp, L.dp, L.zero, stages.c_str(),
           L.ep > 1 ? (" EP " + std::to_string(L.ep)).c_str() : "", worst_loss, worst_norm,
           worst_param);
    return 1;
}

// Runs layout L with fault planted (TRIPOD_TEST_FAULT) and expects the run to leave the
// reference: its worst relative loss or parameter error above 1e-3 (bf16: above the bf16
// tolerances, the loss's or a checked parameter's). Collective.
void expect_fault_caught(const Result &ref, const char *fault, const Layout &L) {
    setenv("TRIPOD_TEST_FAULT", fault, 1);
    Result r = run(L);
    unsetenv("TRIPOD_TEST_FAULT");
    if (tpd_comm_rank(g_world) != 0) return;
    SCOPED_TRACE(fault);
    ASSERT_EQ(r.loss.size(), ref.loss.size());
    // errors in units of their tolerance
    const double tl = L.bf16 ? kBf16Loss : 1e-3, tp = L.bf16 ? kBf16Param : 1e-3;
    double worst = 0;
    for (size_t i = 0; i < r.loss.size(); i++)
        worst = std::max(worst, std::fabs(r.loss[i] - ref.loss[i]) / ref.loss[i] / tl);
    for (int p = 0; p < TPD_P_COUNT; p++)
        if (param_checked(L, p))
            worst = std::max(worst, tpd_verify_rel_diff(r.params[p].data(), ref.params[p].data(),
                                                        ref.params[p].size()) /
                                        tp);
    EXPECT_GT(worst, 1.0) << "the fault went unnoticed";
    printf("fault %s: worst error %.2e times its tolerance\n", fault, worst);
}

TEST(Equivalence, EveryLayoutMatchesSingleRank) {
    if (g_cuda) GTEST_SKIP() << "cpu matrix not run with --device=cuda";
    Result ref = run({1, 1, 1, 0});
    std::vector<Layout> layouts;
    for (int tp : {1, 2, 4})
        for (int pp : {1, 2, 4})
            for (int dp : {1, 2, 4, 8})
                for (int zero : {0, 1}) {
                    if (tp * pp * dp > tpd_comm_size(g_world) ||
                        (tp == 1 && pp == 1 && dp == 1 && !zero))
                        continue;
                    if (zero && dp == 1) continue;
                    layouts.push_back({tp, pp, dp, zero});
                }
    // uneven stages (parallel.pipeline_layers)
    if (tpd_comm_size(g_world) >= 8) layouts.push_back({2, 2, 2, 1, false, {3, 1}});
    if (tpd_comm_size(g_world) >= 6) layouts.push_back({1, 3, 2, 0, false, {1, 2, 1}});
    // activation recompute, full and selective
    layouts.push_back({1, 1, 1, 0, false, {}, "full"});
    layouts.push_back({1, 1, 1, 0, false, {}, "selective"});
    if (tpd_comm_size(g_world) >= 8) {
        layouts.push_back({2, 2, 2, 1, false, {}, "full"});
        layouts.push_back({2, 2, 2, 1, false, {}, "selective"});
        // the block method: only the first of each stage's two layers is recomputed
        layouts.push_back({2, 2, 2, 0, false, {}, "full", false, 1});
    }
    // sequence parallel: alone, with PP (p2p of N/TP rows), ZeRO-1, uneven stages, recompute
    layouts.push_back({2, 1, 1, 0, false, {}, "none", true});
    if (tpd_comm_size(g_world) >= 8) {
        layouts.push_back({4, 2, 1, 0, false, {}, "none", true});
        layouts.push_back({2, 2, 2, 1, false, {1, 3}, "none", true});
        layouts.push_back({2, 2, 2, 0, false, {}, "full", true});
        layouts.push_back({4, 1, 2, 1, false, {}, "selective", true});
    }
    int checked = 0;
    for (const Layout &L : layouts)
        checked += check_layout(ref, L);
    if (tpd_comm_rank(g_world) == 0) EXPECT_EQ(checked, (int)layouts.size());
}

// Megatron's interleaved schedule (v model chunks per stage) and ZB-H1 (the backward
// split into B and W) against the single-rank run of the same model. Depths are chosen so
// that every chunk has whole layers: PP x v divides num_layers.
TEST(Equivalence, InterleavedAndZbH1MatchSingleRank) {
    if (g_cuda) GTEST_SKIP() << "cpu matrix not run with --device=cuda";
    int world = tpd_comm_size(g_world);
    std::vector<Layout> layouts;
    auto il = [&](Layout L, int v, int layers) {
        if (L.tp * L.pp * L.dp <= world) layouts.push_back(with(L, v, "interleaved", layers));
    };
    auto zb = [&](Layout L) {
        if (L.tp * L.pp * L.dp <= world) layouts.push_back(with(L, 1, "zb-h1", 0));
    };
    // interleaved, v = 2 and 3 at PP = 2 and 4, with TP, DP, ZeRO-1, SP, every recompute
    // mode and an uneven split (pipeline_layers per virtual stage)
    il({1, 2, 1, 0}, 2, 4);
    il({2, 2, 2, 1}, 2, 4);
    il({1, 2, 4, 1}, 2, 4);
    il({2, 2, 1, 0, false, {}, "none", true}, 2, 4);
    il({1, 2, 2, 0, false, {}, "selective"}, 2, 4);
    il({2, 2, 2, 0, false, {}, "full"}, 2, 8);
    il({2, 2, 2, 1, false, {}, "full", false, 1}, 2, 8);
    il({1, 2, 1, 0}, 3, 6);
    il({2, 2, 2, 1}, 3, 6);
    il({1, 4, 1, 0}, 2, 8);
    il({2, 4, 1, 0, false, {}, "none", true}, 2, 8);
    il({1, 4, 2, 1}, 2, 8);
    il({1, 4, 2, 0, false, {}, "selective"}, 3, 12);
    il({2, 2, 2, 1, false, {1, 2, 2, 1}}, 2, 6);
    il({1, 4, 2, 0, false, {1, 2, 1, 1, 1, 1, 2, 1}, "full"}, 2, 10);
    // ZB-H1 at PP = 2 and 4, with and without TP and DP
    zb({1, 2, 1, 0});
    zb({1, 4, 1, 0});
    zb({2, 2, 2, 1});
    zb({1, 4, 2, 0});
    zb({2, 4, 1, 0, false, {}, "none", true});
    zb({1, 2, 4, 1, false, {}, "selective"});
    zb({2, 2, 2, 0, false, {3, 1}});
    std::map<int, Result> refs; // single-rank runs by depth
    int checked = 0;
    for (const Layout &L : layouts) {
        int depth = L.layers ? L.layers : 4;
        if (!refs.count(depth)) refs[depth] = run(with({1, 1, 1, 0}, 1, "1f1b", depth));
        checked += check_layout(refs[depth], L);
    }
    if (tpd_comm_rank(g_world) == 0) EXPECT_EQ(checked, (int)layouts.size());
}

// The Llama block (RMSNorm, RoPE, SwiGLU, 4 query heads in 2 K/V groups, untied output
// layer, no biases) under TP (K/V groups split whole), PP (uneven), DP with ZeRO-1, SP,
// recompute, the interleaved schedule and ZB-H1, against its single-rank run.
TEST(Equivalence, LlamaMatchesSingleRank) {
    if (g_cuda) GTEST_SKIP() << "cpu matrix not run with --device=cuda";
    int world = tpd_comm_size(g_world);
    std::vector<Layout> layouts;
    auto add = [&](Layout L) {
        if (L.tp * L.pp * L.dp <= world) layouts.push_back(llama(L));
    };
    add({2, 1, 1, 0});                             // TP2: one K/V group per rank
    add({1, 2, 1, 0, false, {3, 1}});              // PP2 uneven
    add({2, 2, 2, 1});                             // TP2 PP2 DP2 ZeRO-1
    add({2, 1, 2, 0, false, {}, "none", true});    // SP
    add({2, 2, 1, 0, false, {}, "selective"});     // selective recompute
    add({1, 2, 2, 1, false, {}, "full"});          // full recompute
    add({2, 2, 2, 0, false, {}, "full", true, 1}); // block recompute under SP
    add(with({2, 2, 2, 1}, 2, "interleaved", 4));  // interleaved v=2
    add(with({1, 4, 2, 0}, 1, "zb-h1", 0));        // ZB-H1
    add({1, 1, 8, 1});                             // DP8 ZeRO-1
    Result ref = run(llama({1, 1, 1, 0}));
    int checked = 0;
    for (const Layout &L : layouts)
        checked += check_layout(ref, L);
    if (tpd_comm_rank(g_world) == 0) EXPECT_EQ(checked, (int)layouts.size());
}

// Qwen3's QK norm (Llama's block with an RMSNorm of each Q and K head, weights replicated
// over TP, whose gradients each TP rank computes from its own heads) under TP (one K/V group
// a rank), SP, PP, DP with ZeRO-1 and ZeRO-3, recompute, ZB-H1, context parallelism (the
// ring and the all-to-all, which moves the normalized heads) and the MoE block with EP,
// against its single-rank run (the MoE rows against the single-rank MoE run); and heads wider
// than hidden_size / heads (kv_channels) under TP, PP, DP, CP and EP against theirs.
TEST(Equivalence, QkNormMatchesSingleRank) {
    if (g_cuda) GTEST_SKIP() << "cpu matrix not run with --device=cuda";
    int world = tpd_comm_size(g_world);
    std::vector<Layout> dense, mix;
    auto add = [&](std::vector<Layout> &to, Layout L) {
        if (ranks(L) <= world) to.push_back(qwen3(L));
    };
    add(dense, {2, 1, 1, 0});                          // TP2: one K/V group a rank
    add(dense, {2, 1, 2, 0, false, {}, "none", true}); // SP
    add(dense, {1, 2, 1, 0, false, {3, 1}});           // PP2 uneven
    add(dense, {2, 2, 2, 1});                          // TP2 PP2 DP2 ZeRO-1
    add(dense, {2, 2, 1, 0, false, {}, "selective"});  // selective recompute
    add(dense, {2, 1, 2, 0, false, {}, "full"});       // full recompute
    add(dense, with({2, 2, 1, 0}, 1, "zb-h1", 0));     // ZB-H1
    add(dense, sharded({2, 1, 4, 0}, TPD_DP_SHARDING_OPTIM_GRADS_PARAMS, kSteps)); // ZeRO-3
    add(dense, cpar({1, 1, 1, 0}, 2, false));                                      // CP2 ring
    add(dense, cpar({1, 1, 2, 1}, 2, true)); // CP2 all-to-all, DP2 ZeRO-1
    add(mix, epar({2, 1, 2, 0}, 2));         // Qwen3-MoE: TP2 EP2
    add(mix, epar({1, 2, 4, 1}, 2));         // PP2 DP4 EP2 ZeRO-1
    Result ref = run(qwen3({1, 1, 1, 0}));
    int checked = 0;
    for (const Layout &L : dense)
        checked += check_layout(ref, L);
    Result mref = run(qwen3(moe({1, 1, 1, 0})));
    for (const Layout &L : mix)
        checked += check_layout(mref, L);
    std::vector<Layout> wide, wide_moe;
    add(wide, wide_heads({2, 2, 2, 1}));                      // TP2 PP2 DP2 ZeRO-1
    add(wide, wide_heads(with({2, 2, 1, 0}, 1, "zb-h1", 0))); // ZB-H1
    add(wide, wide_heads(cpar({2, 1, 1, 0}, 2, false)));      // TP2 CP2 ring
    add(wide, wide_heads(cpar({1, 1, 1, 0}, 2, true)));       // CP2 all-to-all
    add(wide_moe, wide_heads(epar({2, 1, 2, 0}, 2)));         // Qwen3-MoE's shape: TP2 EP2
    Result wref = run(qwen3(wide_heads({1, 1, 1, 0})));
    for (const Layout &L : wide)
        checked += check_layout(wref, L);
    Result wmref = run(qwen3(wide_heads(moe({1, 1, 1, 0}))));
    for (const Layout &L : wide_moe)
        checked += check_layout(wmref, L);
    if (tpd_comm_rank(g_world) == 0)
        EXPECT_EQ(checked, (int)(dense.size() + mix.size() + wide.size() + wide_moe.size()));
}

// bf16 on the cpu backend (the cuda backend's recipe) under TP, PP, DP with ZeRO-1 and
// ZeRO-3, SP, the interleaved schedule and ZB-H1, the MoE block with EP, and Llama, against
// the bf16 single-rank run, with the bf16 tolerances above; and context parallelism, the ring
// and the all-to-all.
TEST(Equivalence, Bf16MatchesSingleRankBf16) {
    if (g_cuda) GTEST_SKIP() << "cpu matrix not run with --device=cuda";
    int world = tpd_comm_size(g_world);
    std::vector<Layout> gpt, lla;
    auto add = [&](std::vector<Layout> &v, Layout L) {
        if (ranks(L) <= world) v.push_back(bf16(L));
    };
    add(gpt, {2, 1, 1, 0});
    add(gpt, {1, 2, 1, 0});
    add(gpt, {1, 1, 2, 1});
    add(gpt, {2, 2, 2, 1});
    add(gpt, {4, 1, 2, 0, false, {}, "selective", true});
    add(gpt, with({1, 2, 4, 1}, 2, "interleaved", 4));
    add(gpt, sharded({1, 1, 4, 1}, TPD_DP_SHARDING_OPTIM_GRADS_PARAMS, kSteps));
    add(gpt, epar({1, 1, 2, 0}, 2));
    add(gpt, cpar({1, 1, 2, 1}, 2, false)); // the ring: bf16 K/V blocks, fp32 running state
    add(gpt, cpar({1, 1, 1, 0}, 4, true));  // the all-to-all: bf16 rows
    add(gpt, cpar({2, 2, 1, 0}, 2, true));
    add(lla, llama({2, 2, 2, 1}));
    add(lla, llama(cpar({1, 1, 1, 0}, 4, false))); // GQA over the ring
    add(lla, llama(with({1, 4, 2, 0}, 1, "zb-h1", 0)));
    Result ref_gpt = run(bf16({1, 1, 1, 0})), ref_moe = run(bf16(moe({1, 1, 1, 0})));
    Result ref_lla = run(bf16(llama({1, 1, 1, 0})));
    int checked = 0;
    for (const Layout &L : gpt)
        checked += check_layout(L.experts ? ref_moe : ref_gpt, L);
    for (const Layout &L : lla)
        checked += check_layout(ref_lla, L);
    if (tpd_comm_rank(g_world) == 0) EXPECT_EQ(checked, (int)(gpt.size() + lla.size()));
    // and the bf16 tolerances still catch a lost DP reduction (layer 1's bucket)
    if (world >= 2)
        expect_fault_caught(ref_gpt, "skip-dp-bucket:2",
                            bf16(sharded({1, 1, 2, 1}, TPD_DP_SHARDING_OPTIM_GRADS, kSteps)));
}

// Context parallelism (parallel.context_parallel_size): CP 2 and 4, the ring (p2p) and
// the all-to-all (a2a), alone and with TP (and SP), PP (1F1B, interleaved, ZB-H1), DP with
// ZeRO-1 and the sharded strategies, full and selective recompute, GPT-2 and the Llama
// block (GQA: the ring carries only the 2 K/V groups), against the single-rank run under
// the matrix's tolerances. The tiny model's 16 positions make chunks of 4 (CP 2) and 2
// (CP 4) positions.
TEST(Equivalence, ContextParallelMatchesSingleRank) {
    if (g_cuda) GTEST_SKIP() << "cpu matrix not run with --device=cuda";
    int world = tpd_comm_size(g_world);
    std::vector<Layout> gpt, lla;
    auto add = [&](std::vector<Layout> &v, Layout L) {
        if (ranks(L) <= world) v.push_back(L);
    };
    for (bool a2a : {false, true}) {
        add(gpt, cpar({1, 1, 1, 0}, 2, a2a));                            // CP 2
        add(gpt, cpar({1, 1, 1, 0}, 4, a2a));                            // CP 4
        add(gpt, cpar({2, 1, 1, 0, false, {}, "none", true}, 2, a2a));   // TP 2 + SP
        add(gpt, cpar({1, 1, 2, 1}, 2, a2a));                            // DP 2, ZeRO-1
        add(gpt, cpar({1, 1, 1, 0, false, {}, "selective"}, 2, a2a));    // selective
        add(gpt, cpar(with({1, 2, 1, 0}, 2, "interleaved", 4), 2, a2a)); // PP 2 interleaved
    }
    add(gpt, cpar({2, 1, 1, 0}, 4, false));                      // TP 2 x CP 4
    add(gpt, cpar({2, 2, 1, 0}, 2, true));                       // TP 2 PP 2 a2a
    add(gpt, cpar({1, 1, 1, 0, false, {}, "full"}, 2, false));   // full recompute
    add(gpt, cpar(with({1, 2, 1, 0}, 1, "zb-h1", 0), 2, false)); // ZB-H1
    add(gpt, cpar({1, 2, 2, 1}, 2, false));                      // PP 2 DP 2 ZeRO-1
    add(gpt, cpar(sharded({1, 1, 2, 1}, TPD_DP_SHARDING_OPTIM_GRADS, kSteps), 2, false));
    add(gpt, cpar(sharded({1, 1, 2, 1}, TPD_DP_SHARDING_OPTIM_GRADS_PARAMS, kSteps), 2, true));
    add(gpt, cpar(sharded({2, 1, 1, 1}, TPD_DP_SHARDING_OPTIM_GRADS_PARAMS, kSteps), 4, false));
    add(lla, llama(cpar({1, 1, 1, 0}, 2, false))); // GQA over the ring
    add(lla, llama(cpar({1, 1, 1, 0}, 4, false)));
    add(lla, llama(cpar({1, 1, 1, 0}, 2, true)));                           // 2 K/V groups, CP 2
    add(lla, llama(cpar({2, 1, 1, 0, false, {}, "none", true}, 2, false))); // TP 2: 1 group each
    add(lla, llama(cpar(with({2, 2, 1, 0}, 2, "interleaved", 4), 2, false)));
    add(lla, llama(cpar({1, 1, 2, 1, false, {}, "selective"}, 4, false)));
    int checked = 0;
    Result ref = run({1, 1, 1, 0});
    for (const Layout &L : gpt)
        checked += check_layout(ref, L);
    Result lref = run(llama({1, 1, 1, 0}));
    for (const Layout &L : lla)
        checked += check_layout(lref, L);
    if (tpd_comm_rank(g_world) == 0) EXPECT_EQ(checked, (int)(gpt.size() + lla.size()));
}

// The mixture of experts (dropless top-2 of 4, both router losses; a gated shared expert
// under GPT-2, HF's renormalized softmax-then-top-k under Llama), every expert on every
// rank (EP 1), with TP 2 (experts split like the dense MLP) and SP, PP 2 (1F1B, interleaved,
// ZB-H1), DP 2 with ZeRO-1 and ZeRO-3, full and selective recompute, against the single-rank
// run under the matrix's tolerances, the load-balancing loss too. Top-k ties go to the
// lower expert index; the router's logits agree across layouts to rounding, far from a tie.
TEST(Equivalence, MoeMatchesSingleRank) {
    if (g_cuda) GTEST_SKIP() << "cpu matrix not run with --device=cuda";
    int world = tpd_comm_size(g_world);
    std::vector<Layout> gpt, lla;
    auto add = [&](std::vector<Layout> &v, Layout L) {
        if (ranks(L) <= world) v.push_back(L);
    };
    add(gpt, moe({2, 1, 1, 0}));
    add(gpt, moe({2, 1, 2, 0, false, {}, "none", true}));
    add(gpt, moe({1, 2, 1, 0}));
    add(gpt, moe(with({1, 2, 1, 0}, 2, "interleaved", 4)));
    add(gpt, moe(with({1, 2, 2, 0}, 1, "zb-h1", 0)));
    add(gpt, moe({1, 1, 2, 1}));
    add(gpt, moe(sharded({1, 1, 2, 1}, TPD_DP_SHARDING_OPTIM_GRADS_PARAMS, kSteps)));
    add(gpt, moe({1, 1, 1, 0, false, {}, "full"}));
    add(gpt, moe({2, 2, 1, 0, false, {}, "selective"}));
    add(gpt, moe({2, 2, 2, 1}));
    add(lla, llama(moe({2, 1, 1, 0})));
    add(lla, llama(moe({1, 2, 2, 1})));
    add(lla, llama(moe(with({2, 2, 2, 0}, 2, "interleaved", 4))));
    // expert parallelism: EP 2 and 4 over DP (one expert per rank at EP 4), expert DP 2
    // beside EP 2, with TP 2 + SP, PP 2 (1F1B, interleaved, ZB-H1), full recompute
    add(gpt, epar({1, 1, 2, 0}, 2));
    add(gpt, epar({1, 1, 4, 0}, 4));
    add(gpt, epar({1, 1, 4, 0}, 2));
    add(gpt, epar({2, 1, 2, 0, false, {}, "none", true}, 2));
    add(gpt, epar({1, 2, 2, 0}, 2));
    add(gpt, epar(with({1, 2, 2, 0}, 2, "interleaved", 4), 2));
    add(gpt, epar({1, 1, 2, 0, false, {}, "full"}, 2));
    add(gpt, epar({2, 2, 2, 0}, 2));
    add(lla, llama(epar({1, 1, 4, 0}, 4)));
    add(lla, llama(epar({2, 1, 2, 0}, 2)));
    add(lla, llama(epar(with({1, 2, 2, 0}, 1, "zb-h1", 0), 2)));
    add(lla, llama(epar({1, 1, 8, 0}, 4)));
    // ZeRO-1 under EP: the experts' state sharded over expert DP, the rest over DP
    add(gpt, epar({1, 1, 4, 1}, 2));
    add(gpt, epar({2, 2, 2, 1}, 2));
    add(gpt, epar(with({1, 2, 2, 1}, 2, "interleaved", 4), 2));
    add(lla, llama(epar({1, 1, 4, 1}, 4)));
    add(lla, llama(epar({1, 1, 8, 1}, 2)));
    // ZeRO-2 and ZeRO-3 under EP: each layer's experts a unit of their own, sharded over
    // expert DP, the rest over DP; with TP 2 and PP 2, ZB-H1, and EP = DP (expert DP 1)
    add(gpt, epar(sharded({1, 1, 4, 1}, TPD_DP_SHARDING_OPTIM_GRADS, kSteps), 2));
    add(gpt, epar(sharded({1, 1, 4, 1}, TPD_DP_SHARDING_OPTIM_GRADS_PARAMS, kSteps), 2));
    add(gpt, epar(sharded({2, 2, 2, 1}, TPD_DP_SHARDING_OPTIM_GRADS_PARAMS, kSteps), 2));
    add(lla, llama(epar(sharded({1, 1, 4, 1}, TPD_DP_SHARDING_OPTIM_GRADS_PARAMS, kSteps), 4)));
    add(lla, llama(epar(sharded(with({1, 2, 4, 1}, 1, "zb-h1", 0),
                                TPD_DP_SHARDING_OPTIM_GRADS_PARAMS, kSteps),
                        2)));
    // HSDP under EP: shard groups of whole EP runs, the experts over their ranks of one EP
    // index there (2 of them at DP 8, H 4, EP 2), both shards summed across the groups
    add(gpt, hsdp(epar(sharded({1, 1, 8, 1}, TPD_DP_SHARDING_OPTIM_GRADS_PARAMS, kSteps), 2), 4));
    add(lla, llama(hsdp(epar(sharded({1, 2, 4, 1}, TPD_DP_SHARDING_OPTIM_GRADS, kSteps), 2), 2)));
    int checked = 0;
    Result ref = run(moe({1, 1, 1, 0}));
    for (const Layout &L : gpt)
        checked += check_layout(ref, L);
    Result lref = run(llama(moe({1, 1, 1, 0})));
    for (const Layout &L : lla)
        checked += check_layout(lref, L);
    if (tpd_comm_rank(g_world) == 0) EXPECT_EQ(checked, (int)(gpt.size() + lla.size()));
}

// Stacks that mix dense and MoE layers (model.moe_layer_freq 2: layers 0 and 2 MoE, 1 and 3
// dense; 3: layers 0 and 3): each stage and virtual stage holds its own mix (PP 2 gives each
// stage one of each, interleaved chunks alternate kinds, at freq 3 PP 2's second stage
// starts dense, at PP 4 two stages hold no MoE layer), with TP 2 + SP, ZB-H1, ZeRO-1 and
// ZeRO-3, full and selective recompute, and EP over DP (a dense layer's expert unit is
// empty) with ZeRO-1 and ZeRO-3.
TEST(Equivalence, MoeMixedStackMatchesSingleRank) {
    if (g_cuda) GTEST_SKIP() << "cpu matrix not run with --device=cuda";
    int world = tpd_comm_size(g_world);
    std::vector<Layout> f2, f3, lla;
    auto add = [&](std::vector<Layout> &v, Layout L) {
        if (ranks(L) <= world) v.push_back(L);
    };
    add(f2, mixed(moe({2, 1, 1, 0, false, {}, "none", true}), 2));
    add(f2, mixed(moe({1, 2, 1, 0}), 2));
    add(f2, mixed(moe(with({1, 2, 1, 0}, 2, "interleaved", 4)), 2));
    add(f2, mixed(moe(with({1, 2, 2, 0}, 1, "zb-h1", 0)), 2));
    add(f2, mixed(moe({1, 1, 2, 1, false, {}, "full"}), 2));
    add(f2, mixed(moe(sharded({2, 1, 2, 1}, TPD_DP_SHARDING_OPTIM_GRADS_PARAMS, kSteps)), 2));
    add(f2, mixed(epar({1, 1, 4, 1}, 2), 2));
    add(f2, mixed(epar(sharded({1, 2, 4, 1}, TPD_DP_SHARDING_OPTIM_GRADS_PARAMS, kSteps), 2), 2));
    add(f2, mixed(epar({1, 4, 2, 1}, 2), 2)); // stages 1 and 3 dense only: no expert on them
    add(f3, mixed(moe({1, 2, 1, 0, false, {}, "selective"}), 3));
    add(f3, mixed(epar({2, 2, 2, 0}, 2), 3));
    add(lla, mixed(llama(moe({2, 2, 2, 1})), 2));
    add(lla, mixed(llama(epar(sharded({1, 1, 4, 1}, TPD_DP_SHARDING_OPTIM_GRADS, kSteps), 4)), 2));
    int checked = 0;
    Result r2 = run(mixed(moe({1, 1, 1, 0}), 2)), r3 = run(mixed(moe({1, 1, 1, 0}), 3));
    for (const Layout &L : f2)
        checked += check_layout(r2, L);
    for (const Layout &L : f3)
        checked += check_layout(r3, L);
    Result lref = run(mixed(llama(moe({1, 1, 1, 0})), 2));
    for (const Layout &L : lla)
        checked += check_layout(lref, L);
    if (tpd_comm_rank(g_world) == 0) EXPECT_EQ(checked, (int)(f2.size() + f3.size() + lla.size()));
}

// The EP rows can fail: experts whose gradients are not summed over their expert-DP group
// (each copy updated from its own EP group's tokens) leave the single-rank run, with the
// experts' gradients all-reduced (no ZeRO) or reduce-scattered (ZeRO-3).
TEST(Equivalence, MoeExpertParallelFaultIsCaught) {
    if (g_cuda) GTEST_SKIP() << "cpu matrix not run with --device=cuda";
    if (tpd_comm_size(g_world) < 4) GTEST_SKIP() << "needs 4 ranks";
    Result ref = run(moe({1, 1, 1, 0}));
    expect_fault_caught(ref, "ep-skip-expert-reduce", epar({1, 1, 4, 0}, 2));
    // and under ZeRO-3, where the experts' units are reduce-scattered over expert DP
    expect_fault_caught(ref, "ep-skip-expert-reduce",
                        epar(sharded({1, 1, 4, 1}, TPD_DP_SHARDING_OPTIM_GRADS_PARAMS, kSteps), 2));
}

// The CP matrix can fail: a ring step that never receives its block, or a log-sum-exp
// merge that rescales to the wrong maximum, drives the run away from the single-rank one.
TEST(Equivalence, ContextParallelFaultsAreCaught) {
    if (g_cuda) GTEST_SKIP() << "cpu matrix not run with --device=cuda";
    if (tpd_comm_size(g_world) < 4) GTEST_SKIP() << "needs 4 ranks";
    Result ref = run({1, 1, 1, 0});
    for (const char *fault : {"cp-skip-ring-step:1", "cp-lse-wrong-max"})
        expect_fault_caught(ref, fault, cpar({1, 1, 1, 0}, 4, false));
}

// Overlapping the DP communication with the pipeline changes when the buckets are
// reduced, not what they sum: losses, norms and parameters are bit-identical with the
// overlap on and off, with and without ZeRO-1. And ZB-H1 only reorders the weight
// gradients' work, so it is bit-identical to 1F1B.
TEST(Equivalence, OverlapAndZbH1AreBitIdentical) {
    if (g_cuda) GTEST_SKIP() << "cpu matrix not run with --device=cuda";
    if (tpd_comm_size(g_world) < 8) GTEST_SKIP() << "needs 8 ranks";
    struct Pair {
        Layout a, b;
        const char *what;
    };
    Layout off = {1, 2, 4, 0};
    off.overlap = false;
    Layout zoff = {2, 1, 4, 1};
    zoff.overlap = false;
    Layout ioff = with({1, 2, 4, 1}, 2, "interleaved", 4);
    ioff.overlap = false;
    Layout soff = {2, 2, 2, 1, false, {}, "none", true};
    soff.overlap = false;
    std::vector<Pair> pairs = {
        {{1, 2, 4, 0}, off, "overlap on vs off, DP 4"},
        {{2, 1, 4, 1}, zoff, "overlap on vs off, ZeRO-1 over DP 4"},
        {with({1, 2, 4, 1}, 2, "interleaved", 4), ioff, "overlap on vs off, interleaved, ZeRO-1"},
        {{2, 2, 2, 1, false, {}, "none", true}, soff, "overlap on vs off, SP and ZeRO-1"},
        {with({2, 2, 2, 1}, 1, "zb-h1", 0), {2, 2, 2, 1}, "ZB-H1 vs 1F1B"},
        {with({1, 4, 2, 0}, 1, "zb-h1", 0), {1, 4, 2, 0}, "ZB-H1 vs 1F1B, PP 4"},
    };
    for (const Pair &pr : pairs) {
        Result a = run(pr.a), b = run(pr.b);
        if (tpd_comm_rank(g_world) != 0) continue;
        SCOPED_TRACE(pr.what);
        if (a.loss.size() != (size_t)kSteps || b.loss.size() != (size_t)kSteps) {
            ADD_FAILURE() << "a run did not complete its steps"; // the other ranks go on
            continue;
        }
        for (int i = 0; i < kSteps; i++) {
            EXPECT_EQ(a.loss[i], b.loss[i]) << "step " << i + 1;
            EXPECT_EQ(a.norm[i], b.norm[i]) << "step " << i + 1;
            EXPECT_EQ(a.pnorm[i], b.pnorm[i]) << "step " << i + 1;
        }
        for (int p = 0; p < TPD_P_COUNT; p++) { // a tied model's lmhead is empty (data() NULL)
            EXPECT_EQ(a.params[p].size(), b.params[p].size()); // not ASSERT: the others go on
            if (a.params[p].empty() || a.params[p].size() != b.params[p].size()) continue;
            EXPECT_EQ(0, memcmp(a.params[p].data(), b.params[p].data(), a.params[p].size() * 4))
                << tpd_param_get_info((tpd_param)p)->name;
        }
        printf("%s: bit-identical over %d steps\n", pr.what, kSteps);
    }
}

// The sharded strategies (parallel.data_parallel_sharding_strategy optim_grads, ZeRO-2,
// and optim_grads_params, ZeRO-3/FSDP) in 20 layouts each over 30 steps, against the
// single-rank run of the same model: DP 2, 4 and 8; with TP, SP, PP (the tied embedding
// summed between the first and the last stage), uneven stages, the interleaved schedule,
// ZB-H1, full, selective and block recompute, the DP overlap off, three units in flight,
// the Llama block, and hybrid sharding (HSDP 2 x 2, 4 groups of 2, 2 groups of 4; with TP
// and SP, with PP). The tolerances are the matrix's: each micro-batch's gradients are
// reduce-scattered into the shard on their own, so the sums run in another order than one
// reduction of the accumulated gradients.
const int kShardSteps = 30;

TEST(Equivalence, ShardedStrategiesMatchSingleRank) {
    if (g_cuda) GTEST_SKIP() << "cpu matrix not run with --device=cuda";
    int world = tpd_comm_size(g_world);
    std::vector<Layout> layouts;
    for (int sh : {TPD_DP_SHARDING_OPTIM_GRADS, TPD_DP_SHARDING_OPTIM_GRADS_PARAMS}) {
        auto add = [&](Layout L) {
            if (L.tp * L.pp * L.dp <= world) layouts.push_back(sharded(L, sh, kShardSteps));
        };
        Layout no_overlap = {1, 2, 4, 1};
        no_overlap.overlap = false;
        add({1, 1, 2, 1});                               // DP2
        add({1, 1, 4, 1});                               // DP4
        add({1, 1, 8, 1});                               // DP8
        add({2, 1, 2, 1, false, {}, "none", true});      // TP2 SP DP2
        add({1, 2, 2, 1});                               // PP2: the tied wte on two stages
        add({2, 2, 2, 1});                               // TP2 PP2 DP2
        add(with({2, 2, 2, 1}, 1, "zb-h1", 0));          // TP2 PP2 DP2 ZB-H1
        add(with({1, 2, 4, 1}, 2, "interleaved", 4));    // interleaved v=2 DP4
        add({1, 2, 2, 1, false, {3, 1}, "full"});        // uneven stages, full recompute
        add({2, 2, 2, 1, false, {}, "selective", true}); // selective recompute under SP
        add({1, 2, 4, 1, false, {}, "full", false, 1});  // block recompute
        add(no_overlap);                                 // the overlap keys off
        add(llama({2, 2, 2, 1}));                        // Llama TP2 PP2 DP2
        add(llama({1, 1, 8, 1}));                        // Llama DP8
        Layout three = {1, 2, 2, 1};
        three.in_flight = 3;
        add(three); // three units in flight
        // hybrid sharding: 2 x 2 on 4 ranks, 4 groups of 2 at DP 8, with TP and SP, with PP
        add(hsdp({1, 1, 4, 1}, 2));
        add(hsdp({1, 1, 8, 1}, 2));
        add(hsdp({2, 1, 4, 1, false, {}, "none", true}, 2));
        add(hsdp({1, 2, 4, 1}, 2));
        add(llama(hsdp({1, 1, 8, 1}, 4)));
    }
    std::map<int, Result> refs; // single-rank runs: depth, Llama
    int checked = 0;
    for (const Layout &L : layouts) {
        int depth = L.layers ? L.layers : 4, key = depth * 2 + L.llama;
        if (!refs.count(key)) {
            Layout R = with({1, 1, 1, 0}, 1, "1f1b", depth);
            R.llama = L.llama;
            R.steps = kShardSteps;
            refs[key] = run(R);
        }
        checked += check_layout(refs[key], L);
    }
    if (tpd_comm_rank(g_world) == 0) EXPECT_EQ(checked, (int)layouts.size());
}

// Where the reductions sum the same values in the same order the strategies agree bit for
// bit: one micro-batch per step (global batch = DP) over DP 2, where every element's sum
// is a + b in any order. With more micro-batches optim_grads and optim_grads_params sum
// each micro-batch's reduction into the shard ((g1 + g1') + (g2 + g2')) where optim
// reduces the accumulated gradients once ((g1 + g2) + (g1' + g2')): equal within the
// matrix's tolerances only (ShardedStrategiesMatchSingleRank).
TEST(Equivalence, ShardedStrategiesAreBitIdenticalToOptim) {
    if (g_cuda) GTEST_SKIP() << "cpu matrix not run with --device=cuda";
    if (tpd_comm_size(g_world) < 4) GTEST_SKIP() << "needs 4 ranks";
    for (Layout base : {Layout{1, 1, 2, 1}, Layout{2, 1, 2, 1, false, {}, "none", true}}) {
        base.gbs = 2;
        Result a = run(sharded(base, TPD_DP_SHARDING_OPTIM, kSteps));
        for (int sh : {TPD_DP_SHARDING_OPTIM_GRADS, TPD_DP_SHARDING_OPTIM_GRADS_PARAMS}) {
            Result b = run(sharded(base, sh, kSteps));
            if (tpd_comm_rank(g_world) != 0) continue;
            SCOPED_TRACE(testing::Message() << "strategy " << sh << " TP " << base.tp);
            ASSERT_EQ(a.loss.size(), b.loss.size());
            // the gradient norm's partial sums run over other shard boundaries (buckets
            // for optim, units for the others): equal to double rounding, not bit for bit
            for (size_t i = 0; i < a.loss.size(); i++) {
                EXPECT_EQ(a.loss[i], b.loss[i]) << "step " << i + 1;
                EXPECT_LE(std::fabs(a.norm[i] - b.norm[i]), 1e-12 * a.norm[i]) << "step " << i + 1;
            }
            for (int p = 0; p < TPD_P_COUNT; p++) {
                if (a.params[p].empty() || a.params[p].size() != b.params[p].size()) continue;
                EXPECT_EQ(0, memcmp(a.params[p].data(), b.params[p].data(), a.params[p].size() * 4))
                    << tpd_param_get_info((tpd_param)p)->name;
            }
        }
    }
}

// The matrix can fail: a unit whose reduce-scatter is lost, or a gathered unit that keeps
// its copy from before the update, drives the sharded run away from the single-rank one.
TEST(Equivalence, ShardedFaultsAreCaught) {
    if (g_cuda) GTEST_SKIP() << "cpu matrix not run with --device=cuda";
    if (tpd_comm_size(g_world) < 2) GTEST_SKIP() << "needs 2 ranks";
    Layout R = {1, 1, 1, 0};
    Result ref = run(R);
    const struct {
        const char *fault;
        int strategy;
    } cases[] = {
        {"skip-dp-bucket:2", TPD_DP_SHARDING_OPTIM_GRADS},            // layer 1's reduction
        {"stale-param-gather:0", TPD_DP_SHARDING_OPTIM_GRADS_PARAMS}, // layer 0 kept stale
    };
    for (const auto &c : cases)
        expect_fault_caught(ref, c.fault, sharded({1, 1, 2, 1}, c.strategy, kSteps));
}

// TP=2, PP=2, DP=2 on the GPU (1F1B, with SP, interleaved, ZB-H1, the sharded strategies
// and HSDP at DP 4) against the cpu
// single-rank run. The tolerances are looser
// than the cpu matrix: cuBLASLt and OpenBLAS sum in different orders, and attention and
// the reductions take other paths.
TEST(Equivalence, CudaLayoutMatchesCpuSingleRank) {
    if (!g_cuda) GTEST_SKIP() << "run with --device=cuda";
    TPD_SKIP_WITHOUT_GPU();
    if (tpd_comm_size(g_world) < 8) GTEST_SKIP() << "needs 8 ranks";
    Result ref = run({1, 1, 1, 0});
    Layout gpu = {2, 2, 2, 1, true};
    Layout gpu_sp = gpu;
    gpu_sp.sp = true;
    const struct {
        Layout L;
        const char *what;
    } cases[] = {
        {gpu, "1F1B"},
        {gpu_sp, "1F1B, sequence parallel"},
        {with(gpu, 2, "interleaved", 0), "interleaved v 2"},
        {with(gpu, 1, "zb-h1", 0), "ZB-H1"},
        {sharded(gpu, TPD_DP_SHARDING_OPTIM_GRADS, kSteps), "optim_grads (ZeRO-2)"},
        {sharded(gpu, TPD_DP_SHARDING_OPTIM_GRADS_PARAMS, kSteps), "optim_grads_params (FSDP)"},
        {hsdp(sharded({1, 2, 4, 1, true}, TPD_DP_SHARDING_OPTIM_GRADS_PARAMS, kSteps), 2),
         "optim_grads_params, HSDP 2 x 2"},
    };
    for (const auto &c : cases) {
        Result r = run(c.L);
        if (tpd_comm_rank(g_world) != 0) continue;
        SCOPED_TRACE(c.what);
        if (r.loss.size() != ref.loss.size()) {
            ADD_FAILURE() << "the run did not complete its steps"; // the other ranks go on
            continue;
        }
        for (int i = 0; i < kSteps; i++) {
            EXPECT_LE(std::fabs(r.loss[i] - ref.loss[i]) / ref.loss[i], 1e-4) << "step " << i + 1;
            EXPECT_LE(std::fabs(r.norm[i] - ref.norm[i]) / ref.norm[i], 1e-3) << "step " << i + 1;
        }
        for (int p = 0; p < TPD_P_COUNT; p++)
            EXPECT_LE(
                tpd_verify_rel_diff(r.params[p].data(), ref.params[p].data(), ref.params[p].size()),
                1e-3)
                << tpd_param_get_info((tpd_param)p)->name;
    }
}

// The mixture of experts on the GPU (fp32; top-2 of 4 experts with a gated shared expert
// under GPT-2, HF's renormalized softmax under Llama), its router on the host, against the
// cpu single-rank run at the tolerances above: one rank, and expert parallelism over DP
// (EP 2, EP 2 beside TP 2 and PP 2, EP 4 under Llama), whose all-to-alls carry device rows.
TEST(Equivalence, CudaMoeMatchesCpuSingleRank) {
    if (!g_cuda) GTEST_SKIP() << "run with --device=cuda";
    TPD_SKIP_WITHOUT_GPU();
    if (tpd_comm_size(g_world) < 8) GTEST_SKIP() << "needs 8 ranks";
    auto on_gpu = [](Layout L) {
        L.cuda = true;
        return L;
    };
    const struct {
        Layout L;
        const char *what;
    } gpt[] =
        {
            {on_gpu(moe({1, 1, 1, 0})), "one rank"},
            {on_gpu(epar({1, 1, 2, 0}, 2)), "EP 2"},
            {on_gpu(epar({2, 2, 2, 0}, 2)), "EP 2 with TP 2 and PP 2"},
        },
      lla[] = {
          {on_gpu(llama(epar({1, 1, 4, 0}, 4))), "Llama, EP 4"},
      };
    for (int family = 0; family < 2; family++) {
        Result ref = run(family ? llama(moe({1, 1, 1, 0})) : moe({1, 1, 1, 0}));
        auto *cases = family ? lla : gpt;
        size_t n = family ? sizeof lla / sizeof lla[0] : sizeof gpt / sizeof gpt[0];
        for (size_t k = 0; k < n; k++) {
            Result r = run(cases[k].L);
            if (tpd_comm_rank(g_world) != 0) continue;
            SCOPED_TRACE(cases[k].what);
            if (r.loss.size() != ref.loss.size() || r.aux.size() != ref.aux.size()) {
                ADD_FAILURE() << "the run did not complete its steps";
                continue;
            }
            for (int i = 0; i < kSteps; i++) {
                EXPECT_LE(std::fabs(r.loss[i] - ref.loss[i]) / ref.loss[i], 1e-4)
                    << "step " << i + 1;
                EXPECT_LE(std::fabs(r.norm[i] - ref.norm[i]) / ref.norm[i], 1e-3)
                    << "step " << i + 1;
                EXPECT_LE(std::fabs(r.aux[i] - ref.aux[i]) / ref.aux[i], 1e-4)
                    << "step " << i + 1 << ": load-balancing loss";
            }
            for (int p = 0; p < TPD_P_COUNT; p++)
                EXPECT_LE(tpd_verify_rel_diff(r.params[p].data(), ref.params[p].data(),
                                              ref.params[p].size()),
                          1e-3)
                    << tpd_param_get_info((tpd_param)p)->name;
        }
    }
}

} // namespace

int main(int argc, char **argv) {
    ::testing::InitGoogleTest(&argc, argv);
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--device=cuda")) g_cuda = true;
    tpd_comm_mpi_start(&g_world);
    // One corpus for all ranks: rank 0 names and writes it.
    char path[256] = {0};
    if (tpd_comm_rank(g_world) == 0) {
        snprintf(path, sizeof path, "%s", tiny::temp_prefix("equiv").c_str());
        tiny::write_corpus(path);
    }
    tpd_comm_broadcast(g_world, path, sizeof path, TPD_DTYPE_U8, 0, nullptr);
    g_data = path;
    int rc = tiny::mpi_run_all_tests(g_world);
    if (tpd_comm_rank(g_world) == 0) tiny::remove_corpus(g_data);
    tpd_comm_mpi_finish(g_world);

    return rc;
}
