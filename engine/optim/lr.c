#include "engine/optim/lr.h"

#include <math.h>

double tpd_lr_at(const tpd_config *cfg, int it) {
    const tpd_config_optimizer *o = &cfg->optimizer;
    const double pi = 3.14159265358979323846;
    int warm = o->lr_warmup_iters;
    int decay = tpd_config_lr_decay_iters(cfg);
    if (it < warm) return o->lr * (double)(it + 1) / (double)warm;
    if (o->lr_decay_style == TPD_LR_DECAY_CONSTANT) return o->lr;
    if (o->lr_decay_style == TPD_LR_DECAY_INVERSE_SQRT) {
        double lr = o->lr * sqrt((double)(warm > 1 ? warm : 1)) / sqrt((double)it + 1.0);
        return lr > o->min_lr ? lr : o->min_lr;
    }
    if (it >= decay) return o->min_lr;
    if (o->lr_decay_style == TPD_LR_DECAY_WSD) {
        /* warmup, stable at lr, then the anneal over the last lr_wsd_decay_iters */
        int start = decay - o->lr_wsd_decay_iters;
        if (it < start || o->lr_wsd_decay_iters <= 0) return o->lr;
        double r = (double)(it - start) / (double)o->lr_wsd_decay_iters, coeff;
        switch (o->lr_wsd_decay_style) {
        case TPD_WSD_DECAY_LINEAR:
            coeff = 1.0 - r;
            break;
        case TPD_WSD_DECAY_COSINE:
            coeff = 0.5 * (1.0 + cos(pi * r));
            break;
        case TPD_WSD_DECAY_MINUS_SQRT:
            coeff = 1.0 - sqrt(r);
            break;
        default:
            coeff = 2.0 * pow(0.5, r) - 1.0;
            break; /* exponential */
        }
        return o->min_lr + coeff * (o->lr - o->min_lr);
    }
    double ratio = decay > warm ? (double)(it - warm) / (double)(decay - warm) : 1.0;
    double coeff =
        o->lr_decay_style == TPD_LR_DECAY_LINEAR ? 1.0 - ratio : 0.5 * (1.0 + cos(pi * ratio));
    return o->min_lr + coeff * (o->lr - o->min_lr);
}
