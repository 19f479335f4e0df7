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
 * Tolerances are those of the equivalence tests (tests/engine/train/test_equivalence.cc). */
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
} tpd_verify_options;

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
    double real_hbm_bytes; /* that cluster's usable device memory per rank */
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
