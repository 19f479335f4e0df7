/* The learning-rate schedule: Megatron's linear warmup, then the decay style of
 * optimizer.lr_decay_style (cosine, linear, constant, inverse-square-root, WSD). A pure
 * function of the config and the iteration, shared by the trainer and the checkpoint
 * manifest. */
#ifndef TPD_ENGINE_OPTIM_LR_H
#define TPD_ENGINE_OPTIM_LR_H

#include "engine/config/config.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Learning rate of iteration `it` (0-based). */
double tpd_lr_at(const tpd_config *cfg, int it);

#ifdef __cplusplus
}
#endif
#endif
