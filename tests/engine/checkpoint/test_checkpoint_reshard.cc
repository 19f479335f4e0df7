// Resharding on load, inside one mpirun -np 8: a checkpoint saved under layout S is loaded
// under layout T (TP, PP, DP, ZeRO-1, the virtual stages and the schedule may all change)
// and saved again at once. The two
// checkpoints must hold byte-equal global tensors (parameters, AdamW m and v), and the
// training continued under T must reproduce the loss S itself continued with, within the
// equivalence tolerance (relative 1e-5); at the same layout, bit-identically.
// Each layout runs on the first TP*PP*DP*CP world ranks (a split communicator).
#include <gtest/gtest.h>

#include <cjson/cJSON.h>

#include <cmath>
#include <map>
#include <set>

#include "ckpt_test_util.h"
#include "common/mpi_tests.h"

extern "C" {
#include "engine/generate/generate.h"
}

namespace {

tpd_comm *g_world = nullptr;
std::string g_data, g_root;
const int kBefore = 2, kAfter = 2;

struct Layout {
    int tp, pp, dp, zero;
    int v = 1;          // parallel.virtual_pipeline_model_parallel_size
    bool zb = false;    // parallel.pipeline_schedule zb-h1
    bool llama = false; // the Llama block (tiny::llama)
    int sharding = -1;  // parallel.data_parallel_sharding_strategy; -1: by zero
    int shard_size = 0; // parallel.data_parallel_shard_size (HSDP)
    int cp = 1;         // parallel.context_parallel_size
    bool a2a = false;   // parallel.cp_comm_type a2a
    bool moe = false;   // a mixture of 4 experts, top-2, with a gated shared expert
    int ep = 1;         // parallel.expert_model_parallel_size
    int moe_freq = 1;   // model.moe_layer_freq: 2 mixes dense layers (1, 3) in
    std::string name() const {
        return std::string(llama ? "llama_" : "") + "tp" + std::to_string(tp) + "pp" +
               std::to_string(pp) + "dp" + std::to_string(dp) + (zero ? "z" : "") +
               (sharding > 1 ? std::to_string(sharding) : "") +
               (shard_size ? "h" + std::to_string(shard_size) : "") +
               (v > 1 ? "v" + std::to_string(v) : "") + (zb ? "zb" : "") +
               (cp > 1 ? "cp" + std::to_string(cp) + (a2a ? "a" : "") : "") + (moe ? "moe" : "") +
               (ep > 1 ? "ep" + std::to_string(ep) : "") +
               (moe_freq > 1 ? "f" + std::to_string(moe_freq) : "");
    }
};

void moe_model(tpd_config &cfg) {
    cfg.model.num_moe_experts = 4;
    cfg.model.moe_router_topk = 2;
    cfg.model.moe_ffn_hidden_size = 32;
    cfg.model.moe_shared_expert_intermediate_size = 16;
    cfg.model.moe_shared_expert_gate = 1;
    cfg.model.moe_aux_loss_coeff = 0.01;
}

Layout moe(Layout L) {
    L.moe = true;
    return L;
}

// a stack of MoE layers (0, 2) and dense ones (1, 3)
Layout mixed(Layout L) {
    L.moe = true;
    L.moe_freq = 2;
    return L;
}

// expert parallelism: the experts split over ep DP ranks (each writes its own)
Layout epar(Layout L, int ep) {
    L.moe = true;
    L.ep = ep;
    return L;
}

// context parallelism: CP ranks per sequence (they hold no weights of their own)
Layout cpar(Layout L, int cp, bool a2a = false) {
    L.cp = cp;
    L.a2a = a2a;
    return L;
}

// ZeRO-2 (optim_grads) and ZeRO-3 (optim_grads_params)
Layout zero2(Layout L) {
    L.zero = 1;
    L.sharding = TPD_DP_SHARDING_OPTIM_GRADS;
    return L;
}

Layout zero3(Layout L) {
    L.zero = 1;
    L.sharding = TPD_DP_SHARDING_OPTIM_GRADS_PARAMS;
    return L;
}

// hybrid sharding over groups of h DP ranks
Layout hsdp(Layout L, int h) {
    L.shard_size = h;
    return L;
}

Layout llama(Layout L) {
    L.llama = true;
    return L;
}

Layout chunks(Layout L, int v) {
    L.v = v;
    return L;
}

Layout zbh1(Layout L) {
    L.zb = true;
    return L;
}

// On the layout's ranks: load `load` (or start fresh and train kBefore steps), save into
// `save`, train kAfter steps. Returns the kAfter losses (on every member). Collective over
// g_world.
std::vector<double> run(const Layout &L, const std::string &load, const std::string &save) {
    std::vector<double> losses;
    int n = L.tp * L.pp * L.dp * L.cp, member = tpd_comm_rank(g_world) < n;
    tpd_comm *sub = nullptr;
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
        cfg.parallel.data_parallel_shard_size = L.shard_size;
        if (L.llama) tiny::llama(cfg);
        if (L.moe) moe_model(cfg);
        cfg.model.moe_layer_freq = L.moe_freq;
        cfg.parallel.expert_model_parallel_size = L.ep;
        cfg.parallel.context_parallel_size = L.cp;
        cfg.parallel.cp_comm_type = L.a2a ? TPD_CP_COMM_A2A : TPD_CP_COMM_P2P;
        cfg.parallel.virtual_pipeline_model_parallel_size = L.v;
        if (L.zb) tiny::set(cfg.parallel.pipeline_schedule, "parallel.pipeline_schedule", "zb-h1");
        snprintf(cfg.checkpoint.load, sizeof cfg.checkpoint.load, "%s", load.c_str());
        tpd_trainer *tr = nullptr;
        EXPECT_EQ(tpd_trainer_create(&cfg, sub, &tr), TPD_OK);
        if (tr) {
            tpd_step_stats s;
            if (load.empty())
                for (int i = 0; i < kBefore; i++)
                    EXPECT_EQ(tpd_trainer_step(tr, &s), TPD_OK);
            EXPECT_EQ(tpd_trainer_iteration(tr), kBefore);
            EXPECT_EQ(tpd_trainer_save(tr, save.c_str()), TPD_OK);
            for (int i = 0; i < kAfter; i++) {
                EXPECT_EQ(tpd_trainer_step(tr, &s), TPD_OK);
                losses.push_back(s.lm_loss);
            }
            tpd_trainer_destroy(tr);
        }
        tpd_comm_destroy(sub);
    }
    tpd_comm_barrier(g_world);
    return losses;
}

// The files of a checkpoint that no tensor reads (empty when every file is read): a rank
// that writes a copy of what another rank's file holds (EP: ranks of one expert-DP group
// past its first; HSDP: a shard group past the first) wastes the disk and the save.
std::vector<std::string> unread_files(const std::string &dir) {
    cJSON *m = cJSON_Parse(tiny::slurp(dir + "/manifest.json").c_str());
    if (!m) return {"(" + dir + "/manifest.json does not parse)"};
    std::set<std::string> read;
    const cJSON *t, *kind, *seg, *f;
    cJSON_ArrayForEach(t, cJSON_GetObjectItem(m, "tensors")) {
        for (kind = t->child; kind; kind = kind->next)
            if (cJSON_IsArray(kind)) cJSON_ArrayForEach(seg, kind) {
                    const cJSON *name = cJSON_GetObjectItem(seg, "file");
                    if (cJSON_IsString(name)) read.insert(name->valuestring);
                }
    }
    std::vector<std::string> out;
    cJSON_ArrayForEach(f, cJSON_GetObjectItem(m, "files")) {
        const cJSON *name = cJSON_GetObjectItem(f, "name");
        if (cJSON_IsString(name) && !read.count(name->valuestring))
            out.push_back(name->valuestring);
    }
    cJSON_Delete(m);
    return out;
}

std::string ckpt_dir(const std::string &save) {
    char it[32];
    snprintf(it, sizeof it, "/iter_%07d", kBefore);
    return save + it;
}

TEST(Reshard, RoundTripIsExactAndTrainingContinues) {
    const Layout pairs[][2] = {
        {{2, 2, 2, 0}, {1, 1, 1, 0}},
        {{1, 1, 1, 0}, {2, 2, 2, 0}},
        {{4, 1, 2, 0}, {1, 4, 2, 0}},
        {{1, 4, 2, 0}, {4, 1, 2, 0}},
        {{2, 2, 2, 1}, {2, 2, 2, 0}},
        {{2, 2, 2, 0}, {2, 2, 2, 1}},
        {{2, 2, 2, 1}, {2, 2, 2, 1}}, // same layout: bit-identical resume on 8 ranks
        // across virtual stages and schedules: v=2 to one rank, to v=1 at another PP, and back
        {chunks({2, 2, 2, 0}, 2), {1, 1, 1, 0}},
        {chunks({1, 2, 4, 1}, 2), {1, 4, 2, 0}},
        {{1, 1, 1, 0}, chunks({1, 2, 4, 1}, 2)},
        {zbh1({1, 4, 2, 0}), chunks({2, 2, 2, 1}, 2)},
        {chunks({2, 2, 2, 1}, 2), chunks({2, 2, 2, 1}, 2)},
        // the Llama block: to one rank, across TP/PP/ZeRO, and a bit-exact resume
        {llama({2, 2, 2, 0}), llama({1, 1, 1, 0})},
        {llama({1, 4, 2, 1}), llama({2, 2, 2, 0})},
        {llama({2, 2, 2, 1}), llama({2, 2, 2, 1})},
        // the sharded strategies: each rank's shards out, any strategy and layout in, and
        // the same layout's resume bit-exact
        {zero3({2, 2, 2, 1}), {1, 1, 1, 0}},
        {{1, 1, 1, 0}, zero3({1, 1, 8, 1})},
        {zero2({2, 2, 2, 1}), zero3({2, 2, 2, 1})},
        {zero3({2, 2, 2, 1}), zero3({2, 2, 2, 1})},
        {zero2({1, 2, 4, 1}), zero2({1, 2, 4, 1})},
        {{2, 2, 2, 1}, zero2({1, 2, 4, 1})},
        {zero3(chunks({1, 2, 4, 1}, 2)), {2, 2, 2, 0}},
        {llama(zero3(zbh1({1, 4, 2, 1}))), llama(zero2({2, 2, 2, 1}))},
        {llama(zero3({2, 2, 2, 1})), llama(zero3({2, 2, 2, 1}))},
        // hybrid sharding: the first shard group writes, every group loads
        {hsdp(zero3({1, 1, 4, 1}), 2), {1, 1, 1, 0}},
        {{1, 1, 1, 0}, hsdp(zero2({2, 1, 4, 1}), 2)},
        {hsdp(zero3({1, 2, 4, 1}), 2), hsdp(zero3({1, 2, 4, 1}), 2)},
        {hsdp(zero2({1, 1, 8, 1}), 4), zero3({2, 2, 2, 1})},
        // context parallelism: the ZeRO shards span DP x CP; a CP run loads anywhere
        {cpar({2, 1, 2, 1}, 2), {1, 1, 1, 0}},
        {{1, 1, 1, 0}, cpar(zero3({1, 2, 1, 1}), 4)},
        {llama(cpar(zero2({1, 2, 2, 1}), 2)), llama({2, 2, 2, 1})},
        {cpar({1, 1, 2, 1}, 4, true), cpar({1, 1, 2, 1}, 4, true)},
        {cpar(zero3({2, 1, 2, 1}), 2), cpar({2, 2, 1, 0}, 2)},
        // the mixture of experts: router, stacked experts and the shared expert's gate
        {moe({2, 2, 2, 1}), moe({1, 1, 1, 0})},
        {moe({1, 1, 1, 0}), moe(zero3({2, 1, 4, 1}))},
        {moe(llama({1, 2, 2, 1})), moe(llama({1, 2, 2, 1}))},
        // expert parallelism: EP 2 and 4 load into EP 1, other EPs and themselves
        {epar({1, 1, 4, 0}, 4), moe({1, 1, 1, 0})},
        {moe({2, 1, 2, 1}), epar({2, 2, 2, 0}, 2)},
        {epar({1, 2, 4, 0}, 2), epar({1, 1, 4, 0}, 4)},
        {epar(llama({2, 1, 4, 0}), 4), epar(llama({2, 1, 4, 0}), 4)},
        // ZeRO-1 under EP: the experts' shards over expert DP
        {epar({1, 1, 4, 1}, 2), moe({1, 1, 2, 1})},
        {moe({1, 1, 1, 0}), epar({2, 1, 4, 1}, 4)},
        {epar({1, 2, 4, 1}, 2), epar({1, 2, 4, 1}, 2)},
        // ZeRO-2 and ZeRO-3 under EP: the experts' units over expert DP, the rest over DP
        {epar(zero3({1, 1, 4, 1}), 2), moe({1, 1, 1, 0})},
        {epar({1, 1, 4, 1}, 2), epar(zero3({2, 1, 4, 1}), 4)},
        {epar(zero2({1, 2, 4, 1}), 2), epar(zero3({1, 2, 4, 1}), 2)},
        // HSDP under EP: the first shard group writes, its first ranks of each EP index the
        // experts
        {hsdp(epar(zero3({1, 1, 8, 1}), 2), 4), moe({1, 1, 1, 0})},
        {hsdp(epar(zero2({1, 2, 4, 1}), 2), 2), hsdp(epar(zero2({1, 2, 4, 1}), 2), 2)},
        // a stack that mixes dense and MoE layers: each kind's tensors stacked over its own
        // layers, loaded across PP, TP, EP and the sharding strategies
        {mixed(epar({1, 2, 4, 1}, 2)), mixed({1, 1, 1, 0})},
        {mixed({2, 1, 1, 0}), mixed(epar(zero3({1, 2, 4, 1}), 4))},
    };
    std::map<std::string, std::vector<double>> source_loss;
    for (const auto &pr : pairs) {
        const Layout &S = pr[0], &T = pr[1];
        std::string ssave = g_root + "/" + S.name();
        if (!source_loss.count(S.name())) source_loss[S.name()] = run(S, "", ssave);
        std::string tsave = g_root + "/" + S.name() + "_to_" + T.name();
        std::vector<double> tl = run(T, ckpt_dir(ssave), tsave);
        if (tpd_comm_rank(g_world) != 0) continue;
        // the checks of rank 0 in a function of their own: a failed ASSERT ends the pair,
        // not the loop that the other ranks are still running
        [&] {
            SCOPED_TRACE(S.name() + " -> " + T.name());
            ckt::Globals a = ckt::read_globals(ckpt_dir(ssave)),
                         b = ckt::read_globals(ckpt_dir(tsave));
            ASSERT_EQ(a.iteration, kBefore);
            ASSERT_EQ(b.iteration, kBefore);
            EXPECT_EQ(unread_files(ckpt_dir(ssave)), std::vector<std::string>{});
            int compared = 0;
            for (int p = 0; p < TPD_P_COUNT; p++)
                for (int k = 0; k < TPD_CKPT_KIND_COUNT; k++) {
                    ASSERT_EQ(a.t[p][k].size(), b.t[p][k].size());
                    if (a.t[p][k].empty()) continue;
                    EXPECT_EQ(0, memcmp(a.t[p][k].data(), b.t[p][k].data(), a.t[p][k].size() * 4))
                        << tpd_param_get_info((tpd_param)p)->name << " kind " << k;
                    compared++;
                }
            tpd_config model = tiny::config(g_data);
            if (S.llama) tiny::llama(model);
            if (S.moe) moe_model(model);
            model.model.moe_layer_freq = S.moe_freq;
            int tensors = 0; // the model's own: GPT-2 has no lmhead, Llama no biases, wpe, ...
            for (int p = 0; p < TPD_P_COUNT; p++)
                tensors += tpd_model_has_param(&model, (tpd_param)p);
            EXPECT_EQ(compared, 3 * tensors); // params, m, v (no master weights on cpu)
            const std::vector<double> &sl = source_loss[S.name()];
            ASSERT_EQ(sl.size(), (size_t)kAfter);
            ASSERT_EQ(tl.size(), (size_t)kAfter);
            double worst = 0;
            for (int i = 0; i < kAfter; i++) {
                double e = std::fabs(tl[i] - sl[i]) / std::fabs(sl[i]);
                EXPECT_LE(e, 1e-5)
                    << "step " << kBefore + i + 1 << ": " << tl[i] << " vs " << sl[i];
                if (S.name() == T.name()) EXPECT_EQ(0, memcmp(&tl[i], &sl[i], sizeof(double)));
                worst = std::max(worst, e);
            }
            printf(
                "%s -> %s: global tensors byte-equal, continued loss worst relative error %.2e\n",
                S.name().c_str(), T.name().c_str(), worst);
            // one rank reads a checkpoint of any layout: generate gives byte-equal logits from
            // the source and the resharded copy
            std::vector<int32_t> prompt = {3, 1, 4, 1, 5, 9, 2, 6};
            std::vector<float> la(TPD_BYTE_VOCAB), lb(TPD_BYTE_VOCAB);
            ASSERT_EQ(tpd_generate_logits(ckpt_dir(ssave).c_str(), prompt.data(), prompt.size(), 0,
                                          la.data()),
                      TPD_OK);
            ASSERT_EQ(tpd_generate_logits(ckpt_dir(tsave).c_str(), prompt.data(), prompt.size(), 0,
                                          lb.data()),
                      TPD_OK);
            EXPECT_EQ(0, memcmp(la.data(), lb.data(), la.size() * 4)) << "generate's logits";
        }();
    }
}

} // namespace

int main(int argc, char **argv) {
    ::testing::InitGoogleTest(&argc, argv);
    tpd_comm_mpi_start(&g_world);
    char path[256] = {0};
    if (tpd_comm_rank(g_world) == 0) {
        snprintf(path, sizeof path, "%s", tiny::temp_prefix("reshard").c_str());
        ckt::fresh_dir(path);
        tiny::write_corpus(std::string(path) + "_corpus");
    }
    tpd_comm_broadcast(g_world, path, sizeof path, TPD_DTYPE_U8, 0, nullptr);
    g_root = path;
    g_data = g_root + "_corpus";
    int rc = tiny::mpi_run_all_tests(g_world);
    tpd_comm_mpi_finish(g_world);

    return rc;
}
