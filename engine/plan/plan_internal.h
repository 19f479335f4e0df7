/* Helpers shared by the planner's files; not part of its public API. */
#ifndef TPD_ENGINE_PLAN_PLAN_INTERNAL_H
#define TPD_ENGINE_PLAN_PLAN_INTERNAL_H

#include "engine/plan/plan.h"

/* Per-layer parameters on one TP rank (h hidden, f ffn). */
double tpd_plan_layer_params(double h, double f, int tp);
/* Vocab padded to a multiple of make_vocab_size_divisible_by * tp (Megatron's). */
int tpd_plan_padded_vocab(const tpd_config *cfg, int tp);
/* Parameters of one rank of `stage`. */
double tpd_plan_stage_params(const tpd_config *cfg, const tpd_plan_layout *lay, int stage);
int tpd_plan_is_bf16(const tpd_config *cfg);
int tpd_plan_uses_flash(const tpd_config *cfg);
/* The layout the config itself states (TP, PP, DP for `gpus`, mbs, v, recompute, SP,
 * ZeRO). */
void tpd_plan_layout_from_config(const tpd_config *cfg, int gpus, tpd_plan_layout *lay_p);
/* "TP=8 PP=4 DP=32 mbs=1 v=2 full SP ZeRO" into buf. */
void tpd_plan_layout_str(const tpd_plan_layout *lay, char *buf, size_t len);

/* The source tree (configs/, tools/), as configured at build time. */
const char *tpd_plan_source_dir(void);
/* The cpu backend's per-micro-batch stage time (plan/timing_cpu.c); same contract as
 * tpd_plan_stage_time. */
void tpd_plan_cpu_stage_time(const tpd_config *cfg, const tpd_plan_cluster *cl,
                             const tpd_plan_layout *lay, int stage, double *fwd_p,
                             double *bwd_p, double *tp_comm_p);
/* The cpu backend's whole-step model (pipeline simulated as on cuda). */
tpd_status tpd_plan_cpu_time_evaluate(const tpd_config *cfg, const tpd_plan_cluster *cl,
                                      const tpd_plan_options *opt, int split_bubble,
                                      tpd_plan_result *res);
/* Forward FLOPs of one call of the cpu attention kernel (blocked causal: a block of
 * query rows sees the keys up to its end), B x NH heads of T x HS. */
double tpd_plan_cpu_attention_flops(double B, double T, double NH, double HS);

#endif
