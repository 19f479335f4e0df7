/* The held-out error of a prediction's class: how far the planner was off on published runs
 * it was not fitted to, for the profiles of one class. The figures are the leave-one-source-
 * out residuals (`ctest -R PlanHeldout -V`: each published source predicted by the profile
 * constants fitted on all the others, each run on its framework profile's constants
 * calibrated without it); PlanHeldout.LeaveOneSourceOut fails when they
 * drift from what that run prints. Error = predicted speed / published speed - 1, so a
 * positive error is an optimistic prediction (a step time that came out too short).
 *
 * Class rule: a cuda profile's GPU, told by its peak (H100 class from 500 TFLOP/s dense bf16,
 * A100 class below); a cpu profile has none (no published run to hold it to). The data
 * supports no finer class: two sources on H100 profiles, seven on A100 ones. */
#include <string.h>

#include "plan.h"

/* clang-format off */
static const tpd_plan_band kBands[] = {
    /* class           runs  lowest  highest */
    {"A100 profiles",    38, -0.172, +0.122}, /* SC21, Korthikanti, MT-NLG, BLOOM, MegaScale,
                                                llm-foundry, torchtitan */
    {"H100 profiles",    11, -0.167, +0.135}, /* Llama 3 405B, NeMo/Megatron-Core */
};
/* clang-format on */

void tpd_plan_heldout_band(const tpd_plan_cluster *cl, tpd_plan_band *band_p) {
    memset(band_p, 0, sizeof *band_p);
    if (!cl || cl->backend != TPD_PLAN_BACKEND_CUDA || !(cl->peak_flops > 0)) return;
    *band_p = kBands[cl->peak_flops >= 500e12 ? 1 : 0];
}
