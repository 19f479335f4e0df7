/* Private to engine/checkpoint*.c, interchange.c and generate.c: shard maps, the parsed
 * manifest, and file helpers. */
#ifndef TPD_ENGINE_CHECKPOINT_INTERNAL_H
#define TPD_ENGINE_CHECKPOINT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "engine/checkpoint/checkpoint.h"
#include "engine/model/model_layout.h"

#define TPD_CKPT_FORMAT "tripod-checkpoint"
#define TPD_CKPT_VERSION 1
#define TPD_CKPT_MANIFEST "manifest.json"
#define TPD_CKPT_MANIFEST_SHA "manifest.sha256"

/* ---- shard maps (checkpoint_map.c): pure arithmetic on the layout ---- */

/* `n` elements at global element g of a tensor, at element `local` of a rank's array
 * (the flat parameter buffer, or the optimizer-state shard) and at element `file` of the
 * rank's file block. */
typedef struct tpd_ckpt_seg {
    int64_t g, n, local, file;
} tpd_ckpt_seg;

typedef struct tpd_ckpt_segs {
    tpd_ckpt_seg *v;
    size_t n, cap;
} tpd_ckpt_segs;

void tpd_ckpt_segs_free(tpd_ckpt_segs *s);

/* The coordinates and plans of one rank of a layout. */
typedef struct tpd_ckpt_rank {
    int tp, pp, dp; /* dp: the rank in its replica's DP group (all of DP without DiLoCo), or
                       under HSDP in its shard group */
    int replica;    /* DiLoCo replica (0 otherwise); its files carry the suffix _rRR */
    int tp_size, pp_size, dp_size, zero;
    int edp;    /* EP: dp / EP, the rank in its expert-DP group (dp at EP 1): the first of
                   each writes the experts */
    int silent; /* HSDP: a shard group other than the first, whose state is the first's
                   copy: writes no files */
    tpd_model_layout lay;
    tpd_dp_plan dpp;
} tpd_ckpt_rank;

tpd_status tpd_ckpt_rank_init(const tpd_config *cfg, int tp_size, int pp_size, int dp_size, int tp,
                              int pp, int dp, tpd_ckpt_rank *r_p);
void tpd_ckpt_rank_free(tpd_ckpt_rank *r);

/* Segments of tensor p held by the rank: parameters (local = flat buffer element) or
 * optimizer state (local = shard element). `writer` keeps only the elements this rank
 * writes (one copy of each global element over the whole job); otherwise every element
 * the rank holds (what it must load). Sorted by g; adjacent segments merged. Padding
 * (vocab rows >= V, the DP padding) never appears. */
tpd_status tpd_ckpt_segs_param(const tpd_ckpt_rank *r, tpd_param p, int writer, tpd_ckpt_segs *out);
tpd_status tpd_ckpt_segs_state(const tpd_ckpt_rank *r, tpd_param p, int writer, tpd_ckpt_segs *out);

/* File names of a rank's shards. */
void tpd_ckpt_model_file(int tp, int pp, char *buf, size_t n);
void tpd_ckpt_optim_file(int tp, int pp, int dp, char *buf, size_t n);
/* The same for DiLoCo replica `replica` (0: the names above). */
void tpd_ckpt_model_file_r(int tp, int pp, int replica, char *buf, size_t n);
/* A model file of DP rank dp > 0, which under EP holds its experts (dp 0: the names
 * above). */
void tpd_ckpt_model_file_dp(int tp, int pp, int dp, int replica, char *buf, size_t n);
void tpd_ckpt_optim_file_r(int tp, int pp, int dp, int replica, char *buf, size_t n);

/* Bit k set: the optimizer file holds kind k (TPD_CKPT_EXP_AVG ... TPD_CKPT_OUTER_MOM),
 * block after block in kind order, each state_numel elements. */
#define TPD_CKPT_KIND_BIT(k) (1 << (k))
/* The block of kind k in a file holding `kinds`. */
int tpd_ckpt_kind_slot(int kinds, int k);

/* What a rank writes: per tensor, the writer segments with `file` set to the element
 * offset in the rank's model file (params) and optimizer file (state block; kind k lives
 * at k * state_numel elements). */
typedef struct tpd_ckpt_rank_plan {
    tpd_ckpt_segs param[TPD_P_COUNT];
    tpd_ckpt_segs state[TPD_P_COUNT];
    int64_t param_numel; /* elements in the model file */
    int64_t state_numel; /* elements per kind in the optimizer file */
} tpd_ckpt_rank_plan;

tpd_status tpd_ckpt_rank_plan_init(const tpd_ckpt_rank *r, tpd_ckpt_rank_plan *plan_p);
void tpd_ckpt_rank_plan_free(tpd_ckpt_rank_plan *plan);

/* ---- manifest (checkpoint_manifest.c) ---- */

typedef struct tpd_ckpt_run {
    int file;                            /* index into the manifest's files */
    int64_t g, n, repeat, gstride, foff; /* elements; foff in bytes */
} tpd_ckpt_run;

typedef struct tpd_ckpt_file {
    char name[64];
    int tp, pp, dp, replica;
    uint64_t bytes;
    char sha256[65]; /* hex */
} tpd_ckpt_file;

typedef struct tpd_ckpt_manifest {
    int nfiles;
    tpd_ckpt_file *files;
    tpd_ckpt_run *runs[TPD_P_COUNT][TPD_CKPT_KIND_COUNT];
    int nruns[TPD_P_COUNT][TPD_CKPT_KIND_COUNT];
    /* DiLoCo: the runs of replicas 1 .. nrep (their files are in `files` above, which these
     * share) */
    int nrep;
    struct tpd_ckpt_manifest *rep;
} tpd_ckpt_manifest;

void tpd_ckpt_manifest_free(tpd_ckpt_manifest *m);
/* The manifest's name of each state kind (param, exp_avg, ..., outer_momentum). */
extern const char *const tpd_ckpt_kind_names[TPD_CKPT_KIND_COUNT];

/* 1 with *v when the cJSON item j is a whole number within +-2^53 (exact in a double); 0
 * otherwise, where a cast (of 1e300, -1e30, 0.5) would be undefined or lossy. */
struct cJSON;
int tpd_ckpt_json_whole(const struct cJSON *j, int64_t *v);

/* The run state written beside the tensors. */
typedef struct tpd_ckpt_state {
    int iteration, skipped_iterations, weights_only;
    uint64_t consumed_samples;
} tpd_ckpt_state;

/* Builds manifest.json for cfg's layout (tp, pp, dp sizes, ZeRO from cfg; dp is one
 * replica's DP size, of `replicas` replicas under DiLoCo, else replicas = 1) from the
 * per-file hashes and sizes (files in rank order: world rank w's model file, then its
 * optimizer file; an empty name means the rank wrote none). kinds: the state kinds of
 * replica 0's optimizer files (TPD_CKPT_KIND_BIT); replicas r > 0 hold those but the outer
 * state. Returns a malloc'd string. */
tpd_status tpd_ckpt_manifest_build(const tpd_config *cfg, int tp, int pp, int dp, int replicas,
                                   int kinds, const tpd_ckpt_state *state, int nfiles,
                                   const tpd_ckpt_file *files, char **json_p);

/* Parses dir/manifest.json (after checking it against manifest.sha256) into info and its
 * manifest; with verify, also checks the size and SHA-256 of every file (ALL) or of the
 * files that hold the weights a load reads (WEIGHTS: fp32 masters when saved, else the
 * parameters). */
enum { TPD_CKPT_VERIFY_NONE = 0, TPD_CKPT_VERIFY_ALL = 1, TPD_CKPT_VERIFY_WEIGHTS = 2 };
tpd_status tpd_ckpt_manifest_read(const char *dir, int verify, tpd_ckpt_info *info);

/* "checkpoint DIR: model.KEY is A in the checkpoint but B in the config" when the model
 * shapes differ. */
tpd_status tpd_ckpt_check_model(const tpd_ckpt_info *info, const tpd_config *cfg);

/* Reads the runs of (p, kind) that intersect `want` (sorted by g) into dst[want.local...]
 * (fp32). fds: one open descriptor per manifest file (-1 = open on demand). */
tpd_status tpd_ckpt_gather(const tpd_ckpt_info *info, tpd_param p, tpd_ckpt_kind k,
                           const tpd_ckpt_segs *want, float *dst, int *fds);

/* "a/b" into buf (n bytes); 0 when it did not fit (then buf holds a cut path that names
 * no real file). */
int tpd_ckpt_join(char *buf, size_t n, const char *a, const char *b);

/* ---- resolving and loading (checkpoint_read.c) ---- */

/* A checkpoint directory from `path`: the path itself when it holds manifest.json, else
 * the directory that path/latest names. Errors name the file (a `latest` pointing at
 * garbage names `latest`). dir holds TPD_CONFIG_STR + 64 bytes. */
tpd_status tpd_ckpt_resolve(const char *path, char *dir);

/* Older checkpoints than `dir` in its save directory (iter_NNNNNNN, no .tmp), newest
 * first; `save_dir` is searched when dir is empty. Returns the count written (<= cap). */
int tpd_ckpt_list_older(const char *save_dir, const char *dir, char (*out)[TPD_CONFIG_STR + 64],
                        int cap);

/* Fills model (parameters; with !weights_only also m, v and master) of rank r from a
 * checkpoint, from the files of replica `replica` (0 .. info->replicas - 1). Master
 * weights absent from the checkpoint, or a weights-only load, start from the parameters;
 * fresh optimizer state is zero, as is m, v of a checkpoint without them (plain SGD).
 * A model with DiLoCo outer state gets the checkpoint's (replica 0's) when `outer` and the
 * checkpoint holds it, else the loaded parameters and zero momentum. */
tpd_status tpd_ckpt_load_local(const tpd_ckpt_info *info, const tpd_ckpt_rank *r, tpd_model *m,
                               int weights_only, int replica, int outer);

/* ---- files (checkpoint_io.c) ---- */

/* A file written sequentially with a running SHA-256; fsynced and closed by finish. */
typedef struct tpd_ckpt_writer tpd_ckpt_writer;
tpd_status tpd_ckpt_writer_open(const char *path, tpd_ckpt_writer **w_p);
tpd_status tpd_ckpt_writer_put(tpd_ckpt_writer *w, const void *data, size_t bytes);
/* fsync, close, and the hex digest (65 bytes) and size. Frees w, also on failure. */
tpd_status tpd_ckpt_writer_finish(tpd_ckpt_writer *w, char *sha_hex, uint64_t *bytes_p);
void tpd_ckpt_writer_abort(tpd_ckpt_writer *w);

/* Whole-file helpers. write_file: write, fsync, close (not atomic by itself). */
tpd_status tpd_ckpt_write_file(const char *path, const void *data, size_t bytes);
tpd_status tpd_ckpt_read_file(const char *path, char **data_p, size_t *bytes_p);
tpd_status tpd_ckpt_sha256_file(const char *path, char *hex, uint64_t *bytes_p);
void tpd_ckpt_sha256_hex(const void *data, size_t bytes, char *hex);
tpd_status tpd_ckpt_fsync_dir(const char *dir);
tpd_status tpd_ckpt_mkdirs(const char *dir);
/* rm -r of a directory of plain files (checkpoints hold no subdirectories). */
tpd_status tpd_ckpt_remove_dir(const char *dir);

/* Interchange: the global fp32 tensors of cfg's model, zeroed (g gets the global layout);
 * NULL when the model has GPT-2's block and shapes, else what it has instead. */
tpd_status tpd_ckpt_alloc_weights(const tpd_config *cfg, float *global[TPD_P_COUNT],
                                  tpd_model_layout *g);
const char *tpd_ckpt_gpt2_only(const tpd_config *cfg);
/* Imported weights must be finite (a NaN or infinity would only surface as a NaN loss):
 * fails naming the file, the tensor and the first bad element's index (in file order). */
tpd_status tpd_ckpt_check_finite(const float *x, size_t n, const char *file, const char *tensor);
int tpd_ckpt_is_dir(const char *path);
int tpd_ckpt_is_file(const char *path);
/* Full pread; a short read is an error naming the file. */
tpd_status tpd_ckpt_pread(int fd, const char *path, void *buf, size_t bytes, uint64_t off);

/* Test hook: called by the writer after each put with the bytes written so far (lets a
 * test stop a writer mid-file). NULL in normal runs. */
extern void (*tpd_ckpt_write_hook)(const char *path, uint64_t bytes);

/* HF name of tensor p at layer l (l ignored for tensors that are not per layer), with the
 * "transformer." prefix; `pattern` gives "{i}" for the layer. Weights of Conv1D layers
 * (c_attn, c_proj, c_fc) are stored transposed by Hugging Face: *conv1d_p = 1. */
void tpd_ckpt_hf_name(tpd_param p, int l, int pattern, char *buf, size_t n, int *conv1d_p);

#endif
