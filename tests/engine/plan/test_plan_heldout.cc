// The planner's time model on published training runs it was not fitted to
// (tests/engine/plan/published/*.csv, each file naming its source): a few profile constants
// are fitted on one part of the runs, and the error is printed and bounded on the rest.
//
// Split. Fitted on SC21 Table 1 (Narayanan et al. 2021) and Korthikanti et al. 2022 Table 5:
// Megatron on Selene (DGX A100 80GB, 8 HDR per node), the cluster configs/clusters/
// dgx-a100-80g.yaml describes. Held out: MT-NLG 530B (DeepSpeed + Megatron, Selene, 2240 to
// 3360 GPUs), BLOOM 176B (Megatron-DeepSpeed on Jean Zay, a slower network), MegaScale's
// Megatron-LM baseline (175B at a fixed batch on 256 to 12288 GPUs), Llama 3 405B (Meta's
// stack, H100, 8192 and 16384 GPUs) and NVIDIA's NeMo/Megatron-Core recipes on DGX H100 (GPT-3
// 175B, Nemotron-4 15B and 340B, 16 to 2048 GPUs, TP communication overlap on): other
// frameworks, clusters, GPUs and scales.
//
// Fit. Each entry of kFitted scales one value (or a whole curve) of every profile a row uses,
// so the fitted factors say what the profiles miss, and the held-out rows on other profiles
// see the same factors. Coordinate descent, a golden-section search per constant over its
// range, minimizing the mean over sources of the mean |log(predicted speed / published speed)|
// of a source's fitted rows;
// fixed sweeps and iterations, no random start: the same numbers every run. A new constant
// is one more entry in kFitted.
//
// Leave one source out (PlanHeldout.LeaveOneSourceOut): every source, the two FSDP ones too
// (MosaicML's llm-foundry and torchtitan), in turn predicted from all the others, each row on
// its framework profile's constants (configs/frameworks/) and the hardware's factors (kHardware)
// fitted without it; per-source and overall figures, the band each class of profile prints
// (plan/heldout.c), and the order of the layouts of one model a source measured.
//
// Error: predicted speed / published speed - 1 in the published figure's own kind (a step
// time, hardware or model TFLOP/s); positive = the planner is optimistic.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "plan_fit.h"

#ifdef __GLIBC__
#include <malloc.h>
#endif

using namespace plan_test;

namespace {

#ifdef __GLIBC__
// A fit evaluates each row hundreds of times, and every evaluation allocates and frees the
// pipeline simulation's arrays: left to its defaults, glibc hands that memory back to the
// kernel and faults it in again each time (half the run's time). Keep it.
const int kKeepHeap = [] {
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    mallopt(M_MMAP_THRESHOLD, 1 << 25);
    return 0;
}();
#endif

// Bounds the suite holds today, before the time model has TP communication overlap, bucketed
// reduce-scatter, scale effects (the slowest of N ranks) and network topology. They are loose
// where the planner is known to be weak (other frameworks, strong scaling to 10k GPUs) and are
// to be tightened as those terms land. Fractions of the published speed.
constexpr double kFitMeanMax = 0.05;    // fitted rows: mean |error| (today 2.8%)
constexpr double kFitWorstMax = 0.10;   // fitted rows: any one row (today 5.6%)
constexpr double kHeldMeanMax = 0.20;   // held-out rows: mean |error| (today 19.0%)
constexpr double kHeldBiasMax = 0.20;   // held-out rows: |mean signed error| (today +19.0%)
constexpr double kHeldWorstMax = 0.35;  // held-out rows: any one row (today 31.4%, NeMo)
constexpr double kSourceMeanMax = 0.32; // held-out rows: mean |error| of each source

const std::set<std::string> kFitSources = {"sc21", "korthikanti2022"};
const char *const kFitFiles[] = {"korthikanti2022"}; // + kSc21
const char *const kHeldSources[] = {"mtnlg2022", "bloom2022", "megascale2024", "llama3_2024",
                                    "megatron_core_h100"};

// SC21 + Korthikanti fitted, the other sources held out.
struct HeldoutValidation : Validation {
    explicit HeldoutValidation(double gemm_mutation)
        : Validation(gemm_mutation, {kFitFiles, kFitFiles + 1},
                     {kHeldSources, kHeldSources + sizeof kHeldSources / sizeof kHeldSources[0]}) {
        for (const char *src : kHeldSources)
            EXPECT_EQ(kFitSources.count(src), 0u) << src << " is both fitted and held out";
    }
};

// Evaluates every row with the fitted factors f, prints them by source (when `print`), and
// returns what breaks the bounds ("" when none does).
std::string check(Validation &v, const std::vector<double> &f, bool print) {
    std::string broken;
    auto fail = [&](const std::string &what, double got, double max) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "%s %.1f%% > %.1f%%; ", what.c_str(), 100 * got, 100 * max);
        broken += buf;
    };
    Stats fit_all, held_all;
    std::map<std::string, Stats> by_source;
    std::vector<std::string> order;
    for (const std::vector<PubRow> *rows : {&v.fit_rows(), &v.held_rows()})
        for (const PubRow &r : *rows) {
            RowResult x = v.evaluate(r, f);
            bool fitted = kFitSources.count(r.source) > 0;
            if (!by_source.count(r.source)) {
                order.push_back(r.source);
                if (print)
                    std::printf("  %s (%s, %s):\n", r.source.c_str(),
                                fitted ? "fitted" : "held out", r.framework.c_str());
            }
            by_source[r.source].add(x);
            (fitted ? fit_all : held_all).add(x);
            if (print) print_row(x);
            if (!x.ok) broken += r.source + " " + r.model + " rejected: " + x.reason + "; ";
        }
    if (print)
        std::printf("\n  %-16s %5s %10s %9s %9s\n", "source", "rows", "mean|err|", "worst", "bias");
    for (const std::string &s : order) {
        const Stats &st = by_source[s];
        if (print)
            std::printf("  %-16s %5d %9.1f%% %8.1f%% %+8.1f%%%s\n", s.c_str(), st.n,
                        100 * st.mean(), 100 * st.worst, 100 * st.bias(),
                        kFitSources.count(s) ? "  (fitted)" : "");
        if (!kFitSources.count(s) && st.mean() > kSourceMeanMax)
            fail(s + " mean |error|", st.mean(), kSourceMeanMax);
    }
    if (print) {
        std::printf("  %-16s %5d %9.1f%% %8.1f%% %+8.1f%%\n", "fitted, all", fit_all.n,
                    100 * fit_all.mean(), 100 * fit_all.worst, 100 * fit_all.bias());
        std::printf("  %-16s %5d %9.1f%% %8.1f%% %+8.1f%%\n", "held out, all", held_all.n,
                    100 * held_all.mean(), 100 * held_all.worst, 100 * held_all.bias());
    }
    if (fit_all.mean() > kFitMeanMax) fail("fitted mean |error|", fit_all.mean(), kFitMeanMax);
    if (fit_all.worst > kFitWorstMax) fail("fitted worst", fit_all.worst, kFitWorstMax);
    if (held_all.mean() > kHeldMeanMax)
        fail("held-out mean |error|", held_all.mean(), kHeldMeanMax);
    if (held_all.worst > kHeldWorstMax) fail("held-out worst", held_all.worst, kHeldWorstMax);
    if (std::fabs(held_all.bias()) > kHeldBiasMax)
        fail("held-out |bias|", std::fabs(held_all.bias()), kHeldBiasMax);
    return broken;
}

TEST(PlanHeldout, PublishedRunsWithinBounds) {
    HeldoutValidation v(1.0);
    ASSERT_GE(v.fit_rows().size(), 19u);
    ASSERT_GE(v.held_rows().size(), 14u);
    std::vector<double> f = v.fit();
    std::printf("  fitted on SC21 Table 1 + Korthikanti 2022 (%zu rows), factors on every "
                "profile:\n",
                v.fit_rows().size());
    for (size_t i = 0; i < kAll.size(); i++) {
        // at an end of its range: the range, not the fitted rows, chose the value
        double span = kFitted[i].hi - kFitted[i].lo;
        bool at_end = f[i] < kFitted[i].lo + 0.01 * span || f[i] > kFitted[i].hi - 0.01 * span;
        bool seen = false; // some fitted row is on a profile the constant applies to
        for (const PubRow &r : v.fit_rows())
            seen = seen || applies(kFitted[i], v.base(r.cluster));
        std::printf("    %-30s %s %.3f  (searched %.2f..%.2f)%s\n", kFitted[i].name,
                    kFitted[i].absolute ? "=" : "x", f[i], kFitted[i].lo, kFitted[i].hi,
                    !seen    ? "  not fitted: no fitted row on such a profile"
                    : at_end ? "  at the end of its range"
                             : "");
    }
    std::printf("  error = predicted speed / published speed - 1 (positive: optimistic)\n");
    std::string broken = check(v, f, true);
    EXPECT_EQ(broken, "");
}

// The bounds are real: with every profile's GEMM efficiency doubled (then refitted, as a
// wrong profile would be) the same check fails.
TEST(PlanHeldout, BoundsFailWithTheGemmCurveDoubled) {
    HeldoutValidation v(2.0);
    std::vector<double> f = v.fit();
    std::string broken = check(v, f, false);
    std::printf("  GEMM curve x2, refitted: %s\n", broken.c_str());
    EXPECT_NE(broken, "");
}

// ---- Leave one source out ----
//
// Every published source in turn is held out, and its rows are predicted from the others only.
// Each row runs on its framework profile's constants (configs/frameworks/, the `framework`
// column), and the fit on the other sources has two parts, run in turn kRounds times from the
// default profile (tripod) everywhere: the hardware's constants (kHardware, factors on every
// profile a row uses) on all their rows; then each framework's constants (kFwFitted) on its
// one named source (calibrated_from), with those hardware factors. The framework calibrated on
// the held-out source is calibrated instead on the other sources of its kind (megatron,
// deepspeed, ...), or where there are none keeps the default profile's values. So every row's
// error is an error on a source neither the hardware's nor the frameworks' constants saw. (The
// shipped profiles are the same calibration against the clusters as shipped, no factors:
// test_plan_framework.cc.)
constexpr int kRounds = 2;

struct Fold {
    std::string source;
    std::vector<double> f;       // the hardware's factors fitted without `source`
    FwSet fws;                   // every framework's values fitted without `source`
    std::string stand_in;        // what replaced the profile calibrated on `source`
    std::vector<RowResult> rows; // `source`'s rows, predicted with f and fws
};

// The frameworks' constants with `source` held out, given the hardware factors f (see above);
// `note` says what replaced a profile calibrated on `source`.
FwSet frameworks_without(Validation &v, const std::string &source,
                         const std::vector<PubRow> &others, const std::vector<double> &f,
                         std::string *note) {
    FwSet fws = v.shipped();
    note->clear();
    for (const auto &kv : v.frameworks()) {
        const tpd_plan_framework &fw = kv.second;
        if (!fw.calibrated_from[0]) continue;
        std::vector<PubRow> on;
        std::set<std::string> from;
        for (const PubRow &r : others)
            if (source != fw.calibrated_from
                    ? r.source == fw.calibrated_from
                    : v.frameworks().at(r.framework).kind == std::string(fw.kind)) {
                on.push_back(r);
                from.insert(r.source);
            }
        if (source == fw.calibrated_from) {
            *note += kv.first + ": ";
            if (on.empty()) {
                *note += "tripod's values (no other source of kind " + std::string(fw.kind) + ")";
            } else {
                *note += "calibrated on";
                for (const std::string &s : from)
                    *note += " " + s;
            }
        }
        fws[kv.first] =
            on.empty() ? fws.at("tripod") : v.calibrate(on, fws.at(kv.first), kHardware, f);
    }
    return fws;
}

std::vector<Fold> leave_one_source_out(Validation &v) {
    std::vector<PubRow> all = v.all_rows();
    std::vector<Fold> folds;
    for (const PubRow &r : all)
        if (folds.empty() || folds.back().source != r.source)
            folds.push_back({r.source, {}, {}, "", {}});
    for (Fold &fold : folds) {
        std::vector<PubRow> train;
        for (const PubRow &r : all)
            if (r.source != fold.source) train.push_back(r);
        FwSet tripod = v.shipped();
        for (auto &kv : tripod)
            kv.second = v.shipped().at("tripod");
        fold.fws = tripod;
        for (int round = 0; round < kRounds; round++) {
            fold.f = v.fit(train, kHardware, &fold.fws);
            fold.fws = frameworks_without(v, fold.source, train, fold.f, &fold.stand_in);
        }
        for (const PubRow &r : all)
            if (r.source == fold.source)
                fold.rows.push_back(v.evaluate(r, kHardware, fold.f, &fold.fws));
    }
    return folds;
}

// Held-out figures per source and over every row of every source.
struct LosoFigures {
    std::map<std::string, Stats> by_source;
    Stats all;
};

LosoFigures loso_figures(const std::vector<Fold> &folds) {
    LosoFigures out;
    for (const Fold &fold : folds)
        for (const RowResult &x : fold.rows) {
            out.by_source[fold.source].add(x);
            out.all.add(x);
        }
    return out;
}

// A row's speed per GPU in the unit of its kind (a step time becomes sequences per second per
// GPU), so rows of one model at different GPU counts or batches compare as throughput.
double speed_per_gpu(const PubRow &r, double figure) {
    if (r.kind == "step_s" || r.kind == "tflops_8nt") return r.gbs / (figure * r.gpus);
    if (r.kind == "tokens_per_s") return figure / r.gpus;
    return figure; // TFLOP/s per GPU, MFU
}

// The order of the layouts a source measured of one model (one shape, one cluster, one kind of
// figure): Kendall's tau between the planner's and the measured speed per GPU over the pairs
// inside each such group, and every pair more than kRankGap apart measured that the planner
// puts the other way round.
constexpr double kRankGap = 0.05;
constexpr double kTauMin = 0.8; // each source's tau (today 0.86 the lowest, MegaScale)

struct Ranking {
    std::string source;
    int groups = 0, pairs = 0, concordant = 0, discordant = 0;
    int wide_pairs = 0; // measured more than kRankGap apart
    std::vector<std::string> violations;
    double tau() const {
        return pairs ? (double)(concordant - discordant) / pairs : 0;
    }
};

std::vector<Ranking> rankings(const std::vector<Fold> &folds) {
    std::vector<Ranking> out;
    for (const Fold &fold : folds) {
        std::map<std::string, std::vector<const RowResult *>> groups;
        for (const RowResult &x : fold.rows) {
            if (!x.ok) continue;
            const PubRow &r = x.row;
            char key[200];
            std::snprintf(key, sizeof key, "%s %d %d %d %d %d %d %d %s %s", r.family.c_str(),
                          r.layers, r.hidden, r.heads, r.kv_heads, r.ffn, r.vocab, r.seq,
                          r.cluster.c_str(), r.kind.c_str());
            groups[key].push_back(&x);
        }
        Ranking rk;
        rk.source = fold.source;
        for (const auto &g : groups) {
            const std::vector<const RowResult *> &m = g.second;
            if (m.size() < 2) continue;
            rk.groups++;
            for (size_t i = 0; i < m.size(); i++)
                for (size_t j = i + 1; j < m.size(); j++) {
                    double pa = speed_per_gpu(m[i]->row, m[i]->pub);
                    double pb = speed_per_gpu(m[j]->row, m[j]->pub);
                    double qa = speed_per_gpu(m[i]->row, m[i]->pred);
                    double qb = speed_per_gpu(m[j]->row, m[j]->pred);
                    // a time kind: a larger figure is slower, so per GPU it is already inverted
                    double s = (pa - pb) * (qa - qb);
                    rk.pairs++;
                    if (s > 0) rk.concordant++;
                    if (s < 0) rk.discordant++;
                    if (std::fmax(pa, pb) / std::fmin(pa, pb) - 1 > kRankGap) {
                        rk.wide_pairs++;
                        if (s <= 0) {
                            char buf[300];
                            std::snprintf(buf, sizeof buf,
                                          "%s vs %s: measured %+.1f%%, predicted %+.1f%%",
                                          m[i]->row.model.c_str(), m[j]->row.model.c_str(),
                                          100 * (pa / pb - 1), 100 * (qa / qb - 1));
                            rk.violations.push_back(buf);
                        }
                    }
                }
        }
        if (rk.groups) out.push_back(rk);
    }
    return out;
}

void print_loso(const std::vector<Fold> &folds, const LosoFigures &fig) {
    for (const Fold &fold : folds) {
        std::printf("  %s held out; fitted on the other sources:", fold.source.c_str());
        for (size_t i = 0; i < kHardware.size(); i++)
            std::printf(" %s x%.3f", kHardware[i].name, fold.f[i]);
        std::printf("\n    frameworks: each calibrated on its source%s%s\n",
                    fold.stand_in.empty() ? "" : "; ", fold.stand_in.c_str());
        for (const auto &kv : fold.fws) {
            std::printf("      %-18s", kv.first.c_str());
            for (size_t i = 0; i < kNumFw; i++)
                if (!std::isnan(kv.second[i]))
                    std::printf(" %s %.4g", kFwFitted[i].key, kv.second[i] * kFwFitted[i].to_file);
            std::printf("\n");
        }
        for (const RowResult &x : fold.rows)
            print_row(x);
    }
    std::printf("\n  leave one source out (each source predicted by a fit on the others):\n");
    std::printf("  %-18s %5s %10s %9s %9s\n", "source", "rows", "mean|err|", "worst", "bias");
    for (const Fold &fold : folds) {
        const Stats &st = fig.by_source.at(fold.source);
        std::printf("  %-18s %5d %9.1f%% %8.1f%% %+8.1f%%\n", fold.source.c_str(), st.n,
                    100 * st.mean(), 100 * st.worst, 100 * st.bias());
    }
    std::printf("  %-18s %5d %9.1f%% %8.1f%% %+8.1f%%\n", "all rows", fig.all.n,
                100 * fig.all.mean(), 100 * fig.all.worst, 100 * fig.all.bias());
}

// What the suite holds the leave-one-source-out figures to: the figures reached, with a small
// margin (the targets are a mean of 8%, a worst of 15% and a bias within 4%).
constexpr double kLosoMeanMax = 0.085; // mean |error| of every row (today 8.1%)
constexpr double kLosoWorstMax = 0.18; // any one row (today 17.2%, Korthikanti)
constexpr double kLosoBiasMax = 0.025; // |mean signed error| (today -1.8%)

std::string loso_broken(const LosoFigures &fig) {
    std::string broken;
    auto fail = [&](const char *what, double got, double max) {
        if (got <= max) return;
        char buf[160];
        std::snprintf(buf, sizeof buf, "%s %.1f%% > %.1f%%; ", what, 100 * got, 100 * max);
        broken += buf;
    };
    fail("held-out mean |error|", fig.all.mean(), kLosoMeanMax);
    fail("held-out worst", fig.all.worst, kLosoWorstMax);
    fail("held-out |bias|", std::fabs(fig.all.bias()), kLosoBiasMax);
    if (fig.all.rejected) broken += "rows rejected; ";
    return broken;
}

TEST(PlanHeldout, LeaveOneSourceOut) {
    AllSources v(1.0);
    std::vector<Fold> folds = leave_one_source_out(v);
    ASSERT_GE(folds.size(), 9u);
    LosoFigures fig = loso_figures(folds);
    std::printf("  error = predicted speed / published speed - 1 (positive: optimistic)\n");
    print_loso(folds, fig);
    EXPECT_EQ(loso_broken(fig), "");

    // The band each prediction prints (plan/heldout.c): the lowest and highest held-out error
    // of the rows of its class, as this run finds them.
    std::map<std::string, Stats> cls_stats;
    std::map<std::string, double> cls_lo, cls_hi;
    std::map<std::string, tpd_plan_band> shipped;
    for (const Fold &fold : folds)
        for (const RowResult &x : fold.rows) {
            tpd_plan_band b;
            tpd_plan_heldout_band(&v.base(x.row.cluster), &b);
            ASSERT_NE(b.cls, nullptr) << x.row.cluster << " has no class";
            std::string c = b.cls;
            if (!cls_stats[c].n) cls_lo[c] = cls_hi[c] = x.err;
            cls_stats[c].add(x);
            cls_lo[c] = std::fmin(cls_lo[c], x.err);
            cls_hi[c] = std::fmax(cls_hi[c], x.err);
            shipped[c] = b;
        }
    std::printf("\n  held-out error by class (the band a prediction prints):\n");
    for (const auto &kv : cls_stats) {
        const std::string &c = kv.first;
        std::printf("  %-18s %5d runs, %+.1f%%..%+.1f%%, mean |error| %.1f%%, bias %+.1f%%\n",
                    c.c_str(), kv.second.n, 100 * cls_lo[c], 100 * cls_hi[c],
                    100 * kv.second.mean(), 100 * kv.second.bias());
        EXPECT_EQ(shipped[c].runs, kv.second.n) << c << ": plan/heldout.c is out of date";
        EXPECT_NEAR(shipped[c].lo, cls_lo[c], 0.0015) << c << ": plan/heldout.c is out of date";
        EXPECT_NEAR(shipped[c].hi, cls_hi[c], 0.0015) << c << ": plan/heldout.c is out of date";
    }

    std::printf("\n  ranking: layouts of one model a source measured, speed per GPU, "
                "held-out predictions\n");
    std::printf("  %-18s %6s %6s %7s %11s %10s\n", "source", "groups", "pairs", "tau", "pairs >5%",
                "misordered");
    for (const Ranking &rk : rankings(folds)) {
        std::printf("  %-18s %6d %6d %+7.2f %11d %10zu\n", rk.source.c_str(), rk.groups, rk.pairs,
                    rk.tau(), rk.wide_pairs, rk.violations.size());
        for (const std::string &s : rk.violations)
            std::printf("    misordered: %s\n", s.c_str());
        // what holds today: no pair more than 5% apart comes out the other way round, and
        // tau is 1 but for MegaScale's (0.86: pairs of its 8 runs closer than 5% swap)
        EXPECT_EQ(rk.violations.size(), 0u) << rk.source;
        EXPECT_GE(rk.tau(), kTauMin) << rk.source;
    }
}

// The leave-one-source-out bounds are real too: with every profile's GEMM efficiency x1.5
// (each fold refitted, as a wrong profile would be) they break.
TEST(PlanHeldout, LeaveOneSourceOutFailsWithTheGemmCurveX15) {
    AllSources v(1.5);
    std::string broken = loso_broken(loso_figures(leave_one_source_out(v)));
    std::printf("  GEMM curve x1.5, each fold refitted: %s\n", broken.c_str());
    EXPECT_NE(broken, "");
}

} // namespace
