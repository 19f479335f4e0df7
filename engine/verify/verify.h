/* `tripod verify`: a dress rehearsal of a config's exact parallel layout on cpu ranks.
 *
 * The config is shrunk to tiny widths while every structural choice is kept (TP, PP, DP or
 * a smaller stated DP, virtual stages, schedule, SP, ZeRO-1, recompute, overlap, the stage
 * split, the layer count, the model family and its options); then, inside one MPI job:
 *   - structure: every rank's stage and chunks hold the layers the split assigns them;
 *   - memory: every rank allocates exactly the planner's figure for the shrunken model;
 *   - train: K steps on the layout against one rank alone (world rank 0) from the same
 *     weights and data: per-step loss and grad norm, and the final parameters;
 *   - checkpoint: saved at the layout, reloaded at the same layout, into one rank and into
 *     another layout: the loaded tensors are byte-equal to the saved ones, and the resumed
 *     step is bit-identical at the same layout, within the training tolerance elsewhere.
 *
 * Tolerances are those of the equivalence tests (tests/engine/train/test_equivalence.cc).
 *
 * With --device cuda the same shrunken layout trains instead on the cuda backend (bf16)
 * and on the cpu (fp32) in one job, and losses, grad norms and parameters are held to the
 * bf16 budget below (the structure check runs on the cuda ranks; memory and checkpoints
 * stay the cpu rehearsal's). */
#ifndef TPD_ENGINE_VERIFY_VERIFY_H
#define TPD_ENGINE_VERIFY_VERIFY_H

#include <stdint.h>
#include <stdio.h>

#include "engine/config/config.h"
#include "engine/train/train.h"
#include "parallel/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TPD_VERIFY_TOL_LOSS 1e-5  /* relative, per step */
#define TPD_VERIFY_TOL_NORM 1e-5  /* relative, per step (grad norm) */
#define TPD_VERIFY_TOL_PARAM 1e-4 /* ||a - b|| / ||b|| per tensor and layer */
#define TPD_VERIFY_MAX_CHECKS 12

typedef struct tpd_verify_options {
    int ranks;           /* ranks of the rehearsal (--ranks): shrinks DP; 0: the config's DP,
                            else the world */
    int steps;           /* K training steps compared (--steps) */
    const char *scratch; /* directory for the data and checkpoints (created, then removed) */
    const char *cluster; /* planner profile for the real model's figure; NULL: by device */
    tpd_device device;   /* --device: TPD_DEVICE_CPU, the rehearsal above; TPD_DEVICE_CUDA,
                            the layout on the cuda backend in bf16 against the same layout on
                            the cpu in fp32, within the bf16 budget (below) */
} tpd_verify_options;

#define TPD_VERIFY_OPTIONS_INIT                                                                    \
    { 0, 3, NULL, NULL, TPD_DEVICE_CPU }

/* ---- `verify --device cuda`: the bf16 budget (verify_budget.c derives it) ----
 * The layout trains K steps twice in one job, from the same weights and tokens: on the cuda
 * backend with the bf16 recipe it trains with (bf16 weights and activations, fp32 master
 * weights, the config's main-gradient dtype) and on the cpu backend in fp32 at the same
 * layout. Then, with u = 2^-8 (bf16's unit roundoff), R rounding points per layer (15 for
 * GPT's block, +2 for SwiGLU, +1 for RoPE), L layers, K_f the deepest forward GEMM (max of
 * hidden, FFN and sequence), K_b = max(K_f, tokens per step) the deepest weight gradient,
 * r_g the extra roundings of bf16 main gradients (0 under fp32 ones), N the step's tokens
 * and S = K:
 *   e_fwd = u sqrt(R L + 5) + K_f 2^-24              (the logits' relative error)
 *   e_bwd = u sqrt(2 (R L + 5) + r_g) + K_b 2^-24    (a weight gradient's)
 *   loss at step s:       |l_cuda - l_cpu| / l_cpu             <= e_fwd s / sqrt(N)
 *   grad norm at step s:  |g_cuda - g_cpu| / g_cpu             <= e_bwd s
 *   each tensor's layer after S: ||w_cuda - w_cpu|| / ||w_cpu - w_0|| <= 2 sqrt(kappa e_bwd S)
 * (kappa = sqrt(2/pi); w_cuda are the fp32 master weights, w_0 the initial weights). */
#define TPD_VERIFY_BF16_U 0.00390625               /* 2^-8 */
#define TPD_VERIFY_FP32_U 5.9604644775390625e-08   /* 2^-24 */
#define TPD_VERIFY_BUDGET_ROUNDS_OUTSIDE 5         /* embedding, final norm, head, logits */
#define TPD_VERIFY_BUDGET_KAPPA 0.7978845608028654 /* sqrt(2/pi) */
/* A stand-in for the device, for tests only (never a user option): with this variable set
 * to "cpu", `verify --device cuda` trains its device run on the cpu backend in fp32, so the
 * whole comparison runs (and must pass, far inside the budget) on a machine without a GPU.
 * A fault planted through TRIPOD_TEST_FAULT (base/fault.h) then applies to the device run
 * only: the reference stays the truth. */
#define TPD_VERIFY_DEVICE_ENV "TRIPOD_TEST_VERIFY_DEVICE"

typedef struct tpd_verify_budget_in {
    int layers;           /* L */
    int rounds_per_layer; /* R */
    int depth_fwd;        /* K_f */
    double depth_wgrad;   /* K_b */
    double tokens;        /* N: tokens of one step (global batch x sequence) */
    int grad_rounds;      /* r_g */
    int steps;            /* S */
} tpd_verify_budget_in;

typedef struct tpd_verify_budget {
    tpd_verify_budget_in in;
    double eps_fwd, eps_bwd; /* e_fwd, e_bwd */
    double params;           /* the parameters' bound after S steps */
} tpd_verify_budget;

/* R for cfg's block. */
int tpd_verify_budget_rounds_per_layer(const tpd_config *cfg);
/* The inputs for the device run's config (its precision and main-gradient dtype), S steps
 * on dp data-parallel ranks. */
void tpd_verify_budget_shape(const tpd_config *dev, int steps, int dp, tpd_verify_budget_in *in);
void tpd_verify_budget_compute(const tpd_verify_budget_in *in, tpd_verify_budget *b_p);
/* The loss's and the grad norm's bounds at step s (1-based). */
double tpd_verify_budget_loss(const tpd_verify_budget *b, int step);
double tpd_verify_budget_norm(const tpd_verify_budget *b, int step);
/* The parameters' measure: ||got - ref|| / ||ref - init|| over n elements, in double (0
 * when got equals ref; +inf where ref did not move and got did, and for NaN). */
double tpd_verify_moved_diff(const float *got, const float *ref, const float *init, size_t n);

/* The rehearsal config: `real` with tiny widths and every structural choice kept, for a
 * layout of dp data-parallel ranks and `steps` + 1 iterations on the cpu backend (fp32).
 * Widths: head size 2..64/heads (even), hidden = heads x head size, FFN about half the
 * hidden (a multiple of TP), vocabulary the real one's remainder against
 * make_vocab_size_divisible_by x TP (so padding stays), sequence 8 rounded up to TP under
 * SP; micro-batches per step PP (at least 2); DP buckets as many per stage as the real
 * model's; a constant learning rate and adam_eps at least 1e-6 (see shrink.c).
 * data.data_path is left to the caller. Fails with a line in err when `real`
 * cannot be shrunk (e.g. dp < 1). */
tpd_status tpd_verify_shrink(const tpd_config *real, int dp, int steps, tpd_config *small,
                             char *err, size_t errlen);

typedef enum tpd_verify_verdict {
    TPD_VERIFY_PASS = 0,
    TPD_VERIFY_FAIL = 1,
    TPD_VERIFY_SKIP = 2, /* not run: an earlier check failed or it does not apply */
} tpd_verify_verdict;

typedef struct tpd_verify_check {
    char name[40];
    tpd_verify_verdict verdict;
    double worst;     /* worst error seen (relative, or bytes for memory) */
    double tolerance; /* the bound; 0: must be exact */
    char detail[512]; /* the first failure: rank, stage, parameter, step; or what passed */
} tpd_verify_check;

typedef struct tpd_verify_report {
    tpd_config real, small;
    int tp, pp, dp, real_dp, v; /* the rehearsal's layout; real_dp: the config's (0: derived) */
    int cp;                     /* parallel.context_parallel_size, kept */
    int ranks, world;
    int steps;
    char other_layout[64]; /* the layout the checkpoint was resharded into */
    double small_mem_max;  /* planner's bytes, largest rank of the shrunken model */
    double real_mem_max;   /* planner's bytes, largest rank of the real model (its cluster) */
    int real_mem_stage;
    char real_cluster[64];
    double real_hbm_bytes;    /* that cluster's usable device memory per rank */
    tpd_device device;        /* the options' */
    int device_stand_in;      /* --device cuda trained on the cpu (TPD_VERIFY_DEVICE_ENV) */
    tpd_verify_budget budget; /* --device cuda */
    tpd_verify_check checks[TPD_VERIFY_MAX_CHECKS];
    int n_checks;
    double wall_s;
    int passed; /* 1 when no check failed (a check that does not apply is skipped) */
} tpd_verify_report;

/* Refuses (TPD_ERR_INVALID, logged with the figures) a rehearsal whose ranks would not fit
 * in this machine's memory, or that needs more ranks than the world has. Deterministic on
 * every rank but for the memory read from /proc (rank 0 decides; callers broadcast). */
tpd_status tpd_verify_check_machine(const tpd_config *small, int ranks, int world, char *err,
                                    size_t errlen);

/* Runs every check. Collective over `world`; the report is complete on world rank 0
 * (other ranks hold the layout and the configs). Returns a failure only when the
 * rehearsal itself could not run; failed checks are in the report. */
tpd_status tpd_verify_run(const tpd_config *real, const tpd_verify_options *opt, tpd_comm *world,
                          tpd_verify_report *rep);

/* ||a - b|| / ||b|| over n elements in double (||a - b|| when b is 0; +inf for NaN): the
 * parameter measure of `verify` and of the equivalence tests. */
double tpd_verify_rel_diff(const float *a, const float *b, size_t n);
/* Elements where the tied embedding's two copies (wte on the first and on the last stage)
 * differ, summed over the trainer's world: 0 when they are bit-identical, as the embedding
 * group's gradient sum must keep them (0 too when untied or PP = 1). Collective over the
 * trainer's world. */
tpd_status tpd_verify_tied_copies_differ(tpd_trainer *tr, int32_t *differ_p);

/* The one-rank reference of DiLoCo (parallel.dp_sync diloco), the algorithm written out to
 * hold a parallel run to (verify's train checks, tests). cfg: the parallel run's config at
 * DP `dp`, so R = tpd_config_dp_replicas(cfg, dp) replicas. On this rank alone (`one`, a
 * communicator of one rank): one single-rank every-step trainer per replica, with global
 * batch GB/R reading that replica's share of each global batch (tpd_trainer_set_samples),
 * and after each step the outer step in plain loops on their fp32 weights, on the schedule
 * of tpd_diloco_sync_fragment, summing the replicas' pseudo-gradients in replica order.
 * Fragments are spans of the parallel run's state shard, which is the one-rank flat buffer
 * (padded to the inner DP) only at TP = PP = 1 without ZeRO-1: fragments > 1 at any other
 * layout is TPD_ERR_UNSUPPORTED. Fills loss[i] (the replicas' mean, rounded to fp32 as the
 * run's log is) and norm[i] (replica 0's) for i < steps, and params[p]: replica 0's global
 * tensors after `steps`, malloc'd. */
/* 1 when that reference exists for cfg at DP `dp` (one fragment, or TP = PP = 1 without
 * ZeRO-1 inside a replica). */
int tpd_verify_diloco_has_reference(const tpd_config *cfg, int dp);
tpd_status tpd_verify_diloco_reference(const tpd_config *cfg, int dp, int steps, tpd_comm *one,
                                       double *loss, double *norm, float *params[TPD_P_COUNT]);

/* The shrunken config beside the real one's widths, then the table of checks. */
void tpd_verify_print(FILE *f, const tpd_verify_report *rep);
/* The report as JSON (malloc'd, caller frees), or NULL. */
char *tpd_verify_json(const tpd_verify_report *rep);

#ifdef __cplusplus
}
#endif
#endif
