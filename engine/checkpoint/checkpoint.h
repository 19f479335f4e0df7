/* Checkpoints: atomic sharded save, bit-exact resume, and loading under any layout.
 *
 * A checkpoint is a directory SAVE/iter_NNNNNNN/ holding
 *   manifest.json          run state, the config, and where every global tensor lives
 *   manifest.sha256        SHA-256 of manifest.json (hex), so a flipped byte is caught
 *   model_tpTT_ppPP.bin    fp32 parameter rows of one TP/PP slice (written by dp == 0)
 *   optim_tpTT_ppPP_dpDD.bin  fp32 AdamW m, v (and master weights) of one rank's owned
 *                          optimizer-state ranges (its ZeRO-1 shard, or dp == 0's full
 *                          state without ZeRO), then under DiLoCo the outer state (the
 *                          parameters at the last sync, the outer momentum) of the same
 *                          ranges; plain SGD has no m, v
 *   model_..._rRR.bin, optim_..._rRR.bin  parallel.dp_sync diloco: replica r > 0's own
 *                          parameters and inner optimizer state (replicas differ between
 *                          two syncs); DD is then the rank in the replica's inner DP group,
 *                          and the outer state (equal on all replicas) is replica 0's only
 * Each global element (of the unpadded, llm.c-ordered global tensors wte ... lnfb) is
 * stored exactly once: replicated copies (over DP, over TP for LayerNorms and row-parallel
 * biases, the tied wte of the last stage) are not written. The manifest maps each global
 * tensor to runs {file, rank [tp,pp,dp], global_offset, count, repeat, global_stride,
 * file_offset}: `repeat` blocks of `count` elements, block k at global element
 * global_offset + k*global_stride, stored back to back from byte file_offset.
 *
 * Commit protocol (a crash at any point leaves `latest` on a complete checkpoint):
 *   1. every rank writes its files into iter_NNNNNNN.tmp/ and fsyncs them;
 *   2. one collective (an all-gather of success flags and file hashes) makes every rank
 *      agree; a failed rank makes all abandon;
 *   3. rank 0 writes the manifest, fsyncs it and the directory, renames the directory to
 *      iter_NNNNNNN/, then writes latest.tmp, fsyncs it and renames it to `latest`;
 *   4. checkpoint.keep_last prunes older iter_* directories (never the newest).
 * A save that fails (a rank's write, the commit) removes its .tmp directory at once;
 * tpd_ckpt_prune_tmp clears those a kill left, before a run's first save.
 *
 * Loading reads the runs of every global tensor that this rank's slice needs, whatever
 * layout wrote them, so TP, PP, DP and ZeRO-1 may all change between save and load.
 * DiLoCo: a run with the checkpoint's replica count loads each replica's own parameters
 * and inner state (a bit-exact resume, also between two syncs); any other run (another
 * replica count, every_step, one rank) loads replica 0's, with a warning when there were
 * more. A DiLoCo run loading a checkpoint without outer state (every_step, finetune,
 * weights only) starts it at the loaded parameters with zero momentum; an every_step run
 * ignores it. Optimizer state: an AdamW run loading a plain-SGD checkpoint starts m, v at
 * zero (a line says so); an SGD run ignores a checkpoint's m, v.
 *
 * Errors are logged once by the function that finds them, naming the file (tpd_fail,
 * base/status.h); tests and fallbacks read the text back with tpd_last_error. */
#ifndef TPD_ENGINE_CHECKPOINT_H
#define TPD_ENGINE_CHECKPOINT_H

#include <stdint.h>

#include "engine/config/config.h"
#include "engine/model/model.h"
#include "parallel/comm.h"
#include "parallel/data/dp.h"
#include "parallel/mesh.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of a checkpoint directory path (a save directory plus "/iter_NNNNNNN"). */
#define TPD_CKPT_PATH (TPD_CONFIG_STR + 64)

/* One rank's part in a save or a load: its model's buffers and plans, where it sits in
 * the mesh, and the host (MPI) world communicator. The checkpoint code sees nothing else
 * of a run. */
typedef struct tpd_ckpt_view {
    const tpd_config *cfg;
    tpd_model *model;
    const tpd_dp_plan *dpp;
    const tpd_mesh *mesh;
    tpd_comm *world;
    int is_logger;               /* prints the "saved" and "loaded" lines */
    struct tpd_grad_sync *gsync; /* gathers sharded parameters for a save (optim_grads_params);
                                    NULL where the model keeps them whole */
} tpd_ckpt_view;

/* The run's counters, saved beside the tensors and restored by a load. */
typedef struct tpd_ckpt_counters {
    int iteration; /* completed iterations */
    int skipped_iterations;
    uint64_t consumed_samples;
} tpd_ckpt_counters;

/* ---- save (collective over the view's world) ---- */

/* A rank's saver: it holds the save in flight (checkpoint.async_save) between the save
 * point and the commit. */
typedef struct tpd_ckpt_saver tpd_ckpt_saver;

tpd_status tpd_ckpt_saver_create(const tpd_ckpt_view *view, tpd_ckpt_saver **saver_p);
/* Joins a save still in flight without committing it (error paths). NULL is a no-op. */
void tpd_ckpt_saver_destroy(tpd_ckpt_saver *s);

/* Writes SAVE/iter_NNNNNNN (NNNNNNN = c->iteration) with the commit protocol above and
 * prunes per checkpoint.keep_last; with checkpoint.async_save, takes the host snapshot and
 * leaves the writing to a thread (tpd_ckpt_saver_finish commits). Every rank returns the
 * same status. */
tpd_status tpd_ckpt_save(tpd_ckpt_saver *s, const tpd_ckpt_counters *c, const char *save_dir);
/* checkpoint.async_save: commits a save whose writer threads have finished on every rank
 * (collective: one reduction), or with wait, waits for them first. No-op when none is in
 * flight. */
tpd_status tpd_ckpt_saver_finish(tpd_ckpt_saver *s, int wait);
/* 1 while a save is written in the background and not yet committed. */
int tpd_ckpt_saver_in_flight(const tpd_ckpt_saver *s);
/* Iteration of the last save this saver committed; -1 when none. */
int tpd_ckpt_saver_committed(const tpd_ckpt_saver *s);

/* ---- load (collective over the view's world) ---- */

/* Loads `path` into the view's model: parameters, optimizer state, master weights, and
 * *c_p the counters; a weights-only checkpoint, or checkpoint.finetune, loads the weights
 * and starts at iteration 0 with fresh optimizer state (zero counters). *continues_p
 * (may be NULL) is 1 when the run continues the checkpoint's (not fresh). path may be a
 * checkpoint directory or a save directory holding `latest`. With checkpoint.fallback
 * "previous" a checkpoint that fails verification is passed over for the newest older one
 * that verifies. Rank 0 verifies (SHA-256 of every file, the model shape against the
 * config) and broadcasts the verdict; every rank returns the same status. */
tpd_status tpd_ckpt_load(const tpd_ckpt_view *view, const char *path, tpd_ckpt_counters *c_p,
                         int *continues_p);

/* What a run does with the checkpoint section: checkpoint.load "auto" resumes from
 * checkpoint.save's `latest`; when `latest` is missing but iter_NNNNNNN folders are there,
 * from the newest of them that verifies (with a warning; without checkpoint.fallback
 * previous a newest one that fails is an error), and with no checkpoint at all it starts
 * fresh. Another non-empty value loads that path. *c_p and *continues_p as for
 * tpd_ckpt_load; untouched when nothing is loaded. loaded_dir (TPD_CKPT_PATH bytes, may be
 * NULL) gets the checkpoint directory loaded, "" when none. */
tpd_status tpd_ckpt_resume(const tpd_ckpt_view *view, tpd_ckpt_counters *c_p, int *continues_p,
                           char *loaded_dir);

/* ---- the save directory of a run (not collective: every rank sees the same files) ---- */

/* A run never writes over a checkpoint it did not load from: TPD_ERR_INVALID, with a
 * message naming checkpoint.save and its newest checkpoint, when that directory holds
 * iter_NNNNNNN folders and the run neither continues (continues = 1, full state) from one
 * of them nor is the weights-only start from the only one there. checkpoint.overwrite
 * lifts the rule. */
tpd_status tpd_ckpt_check_save_dir(const tpd_config *cfg, const char *loaded_dir, int continues);
/* Removes the iter_NNNNNNN.tmp folders of saves that never committed (a kill, a full
 * disk); returns how many. One rank calls it, before its run saves. */
int tpd_ckpt_prune_tmp(const char *save_dir);
/* One run per save directory: an exclusive, non-blocking flock(2) on SAVE/.tripod.lock
 * (created with SAVE), taken by the rank that writes the directory's top level and held
 * until tpd_ckpt_unlock_save_dir (the trainer holds it from its creation, before
 * checkpoint.load=auto reads the directory, until it is destroyed). Two runs on one directory would
 * otherwise both pass the check above, and one would remove the other's iter_NNNNNNN.tmp and
 * replace its checkpoints. A directory held by another open of the file (another process, or
 * another open in this one): TPD_ERR_INVALID naming the directory and the holder's pid and host
 * (the file's content). A file system without flock support (ENOLCK, EOPNOTSUPP): a warning, and
 * *fd_p = -1. */
tpd_status tpd_ckpt_lock_save_dir(const char *save_dir, int *fd_p);
/* Releases the lock (closes fd); fd < 0 is a no-op. */
void tpd_ckpt_unlock_save_dir(int fd);

/* ---- reading checkpoints in one process (export, generation, tests) ---- */

typedef enum tpd_ckpt_kind {
    TPD_CKPT_PARAM = 0,
    TPD_CKPT_EXP_AVG = 1,    /* AdamW m */
    TPD_CKPT_EXP_AVG_SQ = 2, /* AdamW v */
    TPD_CKPT_MASTER = 3,     /* fp32 master weights */
    TPD_CKPT_OUTER_SYNC = 4, /* DiLoCo: the parameters at the last outer sync */
    TPD_CKPT_OUTER_MOM = 5,  /* DiLoCo: the outer momentum */
    TPD_CKPT_KIND_COUNT = 6
} tpd_ckpt_kind;

typedef struct tpd_ckpt_info {
    char dir[TPD_CONFIG_STR]; /* the resolved checkpoint directory */
    int iteration, skipped_iterations, weights_only;
    uint64_t consumed_samples, seed;
    int tp, pp, dp, zero;              /* layout that wrote it */
    int has_kind[TPD_CKPT_KIND_COUNT]; /* replica 0's */
    /* the DP synchronization that wrote it: parallel.dp_sync, and under diloco the replica
     * count (replica r > 0's files carry the suffix _rRR), diloco.fragments, overlap_steps
     * and sync_interval; dp above is then the DP size of one replica */
    int dp_sync, replicas, fragments, overlap_steps, sync_interval;
    tpd_config cfg;      /* defaults with the checkpoint's model section (and, for checkpoints
                            written by training, the training seed and seq_length) */
    int nfiles;          /* files the manifest lists (manifest excluded) */
    uint64_t file_bytes; /* their size in all */
    struct tpd_ckpt_manifest *man; /* parsed runs; owned, freed by tpd_ckpt_close */
} tpd_ckpt_info;

/* Resolves `path` (a checkpoint directory, or a directory holding `latest`), verifies
 * every file's SHA-256 and reads the manifest's run state. Not collective. */
tpd_status tpd_ckpt_open(const char *path, tpd_ckpt_info *info_p);
/* The same for readers of the weights alone (generate, export): verifies only the files
 * that hold them, not the optimizer state of an fp32 run. */
tpd_status tpd_ckpt_open_weights(const char *path, tpd_ckpt_info *info_p);
void tpd_ckpt_close(tpd_ckpt_info *info);
/* A model value (norm_epsilon, rotary_base, ...) as the manifest stores it: a decimal that
 * reads back as exactly x, so a config holding the printed text matches the checkpoint at
 * load. buf holds at least 32 bytes. */
void tpd_ckpt_format_value(double x, char *buf, size_t n);

/* Global fp32 tensor (tpd_model_layout_global_numel elements) of parameter p, kind k,
 * assembled from whatever layout wrote it. Not collective; reads only. */
tpd_status tpd_ckpt_read_global(const tpd_ckpt_info *info, tpd_param p, tpd_ckpt_kind k,
                                float *out);

/* Loads the parameters of a single-rank model (TP = PP = DP = 1) from a checkpoint
 * written under any layout (generation). */
tpd_status tpd_ckpt_load_model(const tpd_ckpt_info *info, tpd_model *m, const tpd_dp_plan *dpp);

/* Writes a weights-only checkpoint of the global fp32 tensors `global[p]` (as in
 * tpd_ckpt_read_global) into dir (created; must not hold a checkpoint) sharded for the
 * layout tp, pp, dp of cfg. Single process (import). */
tpd_status tpd_ckpt_write_weights(const tpd_config *cfg, int tp, int pp, int dp,
                                  float *const global[TPD_P_COUNT], const char *dir);

#ifdef __cplusplus
}
#endif
#endif
