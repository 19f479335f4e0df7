// Framework profiles (configs/frameworks/*.yaml) on the published runs: each profile's
// constants are calibrated on one named source (its calibrated_from), against the cluster
// profiles as shipped, and validated on the other sources of its kind (megatron, deepspeed,
// ...). tripod plan --framework NAME applies exactly these values, so what is checked here is
// what the command predicts with the profile (no fitted hardware factors: those stay inside
// the leave-one-source-out test).
//
// Error: predicted speed / published speed - 1; positive = the planner is optimistic.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "plan_fit.h"

using namespace plan_test;

namespace {

// Bounds, from the figures reached (the issue: the fitted sources stay within 5% mean).
constexpr double kOwnMeanMax = 0.06;   // a profile on its own source: mean |error|
constexpr double kValueTol = 0.02;     // shipped vs calibrated value: share of its range
constexpr double kObjectiveTol = 2e-3; // shipped vs calibrated objective (mean |log|)

std::vector<PubRow> rows_of(const Validation &v, const std::string &source) {
    std::vector<PubRow> out;
    for (const PubRow &r : v.fit_rows())
        if (r.source == source) out.push_back(r);
    return out;
}

// Rows predicted with every row's framework set to `values` (hardware as shipped).
Stats stats_with(Validation &v, const std::vector<PubRow> &rows, const FwValues &values,
                 double *objective_p) {
    FwSet s;
    for (const PubRow &r : rows)
        s[r.framework] = values;
    Stats st;
    for (const PubRow &r : rows)
        st.add(v.evaluate(r, {}, {}, &s));
    if (objective_p) *objective_p = v.objective(rows, {}, {}, &s);
    return st;
}

std::string file_value(size_t i, double si) {
    char buf[32];
    if (std::isnan(si)) return "-";
    std::snprintf(buf, sizeof buf, "%.4g", si * kFwFitted[i].to_file);
    return buf;
}

// Each shipped profile is what its calibration finds; on its own source it is within
// kOwnMeanMax and no worse than the default profile (tripod); on the other sources of its kind
// it is printed beside the default (the validation), and no worse than the default where its
// framework is the row's own.
TEST(PlanHeldout, FrameworkProfilesCalibrated) {
    AllSources v;
    FwSet shipped = v.shipped();
    ASSERT_GE(v.frameworks().size(), 8u);
    std::printf("  framework profiles, each calibrated on one source (clusters as shipped):\n");
    for (const auto &kv : v.frameworks()) {
        const tpd_plan_framework &fw = kv.second;
        if (!fw.calibrated_from[0]) continue;
        std::vector<PubRow> own = rows_of(v, fw.calibrated_from);
        ASSERT_FALSE(own.empty()) << kv.first << ": no rows of " << fw.calibrated_from;
        FwValues cal = v.calibrate(own, shipped.at(kv.first));
        double obj_cal = 0, obj_shipped = 0;
        stats_with(v, own, cal, &obj_cal);
        stats_with(v, own, shipped.at(kv.first), &obj_shipped);
        std::printf("  %-18s (%s, calibrated on %s):", kv.first.c_str(), fw.kind,
                    fw.calibrated_from);
        for (size_t i = 0; i < kNumFw; i++) {
            std::printf(" %s %s", kFwFitted[i].key, file_value(i, shipped.at(kv.first)[i]).c_str());
            if (std::isnan(shipped.at(kv.first)[i]) != std::isnan(cal[i]) ||
                (!std::isnan(cal[i]) && std::fabs(cal[i] - shipped.at(kv.first)[i]) >
                                            kValueTol * (kFwFitted[i].hi - kFwFitted[i].lo)))
                std::printf(" (calibration: %s)", file_value(i, cal[i]).c_str());
        }
        std::printf("\n");
        EXPECT_LE(obj_shipped, obj_cal + kObjectiveTol)
            << kv.first << ": the shipped values are not what the calibration on "
            << fw.calibrated_from << " finds";
        for (size_t i = 0; i < kNumFw; i++) {
            if (std::isnan(cal[i])) continue;
            EXPECT_NEAR(shipped.at(kv.first)[i], cal[i],
                        kValueTol * (kFwFitted[i].hi - kFwFitted[i].lo))
                << kv.first << " " << kFwFitted[i].key;
        }
    }

    std::printf("\n  validation: each profile on the sources of its kind, beside the default "
                "(tripod), clusters as shipped\n");
    std::printf("  %-18s %-18s %5s %10s %9s %9s   %10s %9s\n", "profile", "source", "rows",
                "mean|err|", "worst", "bias", "tripod: mean", "bias");
    std::vector<std::string> sources = {"sc21"};
    sources.insert(sources.end(), kCsvSources, kCsvSources + kNumCsvSources);
    for (const auto &kv : v.frameworks()) {
        const tpd_plan_framework &fw = kv.second;
        if (!fw.calibrated_from[0]) continue;
        for (const std::string &src : sources) {
            std::vector<PubRow> rows = rows_of(v, src);
            if (rows.empty() || v.frameworks().at(rows[0].framework).kind != std::string(fw.kind))
                continue;
            double obj = 0, obj_default = 0;
            Stats st = stats_with(v, rows, shipped.at(kv.first), &obj);
            Stats def = stats_with(v, rows, shipped.at("tripod"), &obj_default);
            bool own = src == fw.calibrated_from;
            std::printf("  %-18s %-18s %5d %9.1f%% %8.1f%% %+8.1f%%   %9.1f%% %+8.1f%%%s\n",
                        kv.first.c_str(), src.c_str(), st.n, 100 * st.mean(), 100 * st.worst,
                        100 * st.bias(), 100 * def.mean(), 100 * def.bias(),
                        own                             ? "  (calibrated here)"
                        : rows[0].framework == kv.first ? "  (its framework)"
                                                        : "");
            EXPECT_EQ(st.rejected, 0) << kv.first << " on " << src;
            if (own) EXPECT_LE(st.mean(), kOwnMeanMax) << kv.first << " on " << src;
            // the row's own framework's profile beats (or equals) the default
            if (rows[0].framework == kv.first)
                EXPECT_LE(obj, obj_default + 1e-9) << kv.first << " on " << src;
        }
    }
}

// The bounds can fail: each profile's own source predicted with another framework's values
// (the profiles in a ring: each takes the next one's) breaks the own-source bound.
TEST(PlanHeldout, FrameworkProfilesWrongProfileBreaksBounds) {
    AllSources v;
    FwSet shipped = v.shipped();
    std::vector<std::string> names;
    for (const auto &kv : v.frameworks())
        if (kv.second.calibrated_from[0]) names.push_back(kv.first);
    ASSERT_GE(names.size(), 2u);
    int broken = 0;
    for (size_t i = 0; i < names.size(); i++) {
        const std::string &wrong = names[(i + 1) % names.size()];
        std::vector<PubRow> own = rows_of(v, v.frameworks().at(names[i]).calibrated_from);
        Stats st = stats_with(v, own, shipped.at(wrong), nullptr);
        std::printf("  %s's source with %s's values: mean |error| %.1f%%, bias %+.1f%%\n",
                    names[i].c_str(), wrong.c_str(), 100 * st.mean(), 100 * st.bias());
        broken += st.mean() > kOwnMeanMax;
    }
    EXPECT_GT(broken, 0);
}

} // namespace
