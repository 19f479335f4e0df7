/* Save and load of one rank's view of a run (collective over its world). The commit
 * protocol is described in checkpoint.h. */
#include "engine/checkpoint/checkpoint.h"
#include "base/clock.h"
#include "base/fault.h"
#include "base/progress.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/checkpoint/checkpoint_internal.h"
#include "engine/optim/grad_sync.h"

#define PATH_CAP (TPD_CONFIG_STR + 64)

/* ---- save ---- */

/* What each rank tells rank 0 in the one agreement collective (int32 words). */
enum { REC_OK = 0, REC_MBYTES = 1, REC_OBYTES = 3, REC_MSHA = 5, REC_OSHA = 21, REC_WORDS = 37 };

static void put_u64(int32_t *w, uint64_t v) {
    w[0] = (int32_t)(uint32_t)(v & 0xffffffffu);
    w[1] = (int32_t)(uint32_t)(v >> 32);
}

static uint64_t get_u64(const int32_t *w) {
    return (uint64_t)(uint32_t)w[0] | ((uint64_t)(uint32_t)w[1] << 32);
}

typedef struct ckpt_async ckpt_async;

struct tpd_ckpt_saver {
    tpd_ckpt_view view;
    ckpt_async *async; /* a save being written in the background */
    int committed;     /* iteration of the last committed save, -1: none */
};

static tpd_status write_segs(tpd_ckpt_writer *w, const tpd_ckpt_segs *segs, int nsegs,
                             const float *src, tpd_progress *prog, double *done) {
    for (int p = 0; p < nsegs; p++)
        for (size_t i = 0; i < segs[p].n; i++) {
            TPD_CHECK(tpd_ckpt_writer_put(w, src + segs[p].v[i].local, (size_t)segs[p].v[i].n * 4));
            *done += (double)segs[p].v[i].n * 4;
            if (prog) tpd_progress_update(prog, *done);
        }
    return TPD_OK;
}

/* This rank's coordinates and buffer layout, as the shard map needs them. */
static tpd_ckpt_rank rank_of(const tpd_ckpt_view *v) {
    const tpd_mesh *ms = v->mesh;
    tpd_ckpt_rank r;
    memset(&r, 0, sizeof r);
    /* DiLoCo: a replica's state is sharded over its own inner DP group */
    int inner = tpd_config_dp_inner(v->cfg, ms->data_dp_size);
    /* HSDP: a shard group's ranks hold what the other groups hold; the first group writes */
    int H = tpd_config_dp_shard_engine(v->cfg, ms->data_dp_size);
    r.tp = ms->tp;
    r.pp = ms->pp;
    r.dp = (ms->dp % inner) % H;
    r.edp = r.dp / tpd_config_ep(v->cfg); /* EP: the first of an expert-DP group writes */
    r.replica = ms->dp / inner;
    r.silent = (ms->dp % inner) / H > 0;
    r.tp_size = ms->tp_size;
    r.pp_size = ms->pp_size;
    r.dp_size = H;
    r.lay = v->model->plan.lay;
    r.dpp = *v->dpp;
    r.zero = v->dpp->zero;
    return r;
}

/* The state arrays of a model, kind k = TPD_CKPT_EXP_AVG + i; NULL where it keeps none. */
static void state_arrays(const tpd_model *m, const float *a[TPD_CKPT_KIND_COUNT]) {
    a[TPD_CKPT_PARAM] = NULL;
    a[TPD_CKPT_EXP_AVG] = m->opt_m;
    a[TPD_CKPT_EXP_AVG_SQ] = m->opt_v;
    a[TPD_CKPT_MASTER] = m->master;
    a[TPD_CKPT_OUTER_SYNC] = m->outer_sync;
    a[TPD_CKPT_OUTER_MOM] = m->outer_mom;
}

/* The kinds a rank's optimizer file holds: what its model keeps, the outer state (equal
 * on every replica) from replica 0 only. */
static int kinds_of(const tpd_model *m, int replica) {
    const float *a[TPD_CKPT_KIND_COUNT];
    state_arrays(m, a);
    int kinds = 0;
    for (int k = TPD_CKPT_EXP_AVG; k < TPD_CKPT_KIND_COUNT; k++)
        if (a[k] && (replica == 0 || k < TPD_CKPT_OUTER_SYNC)) kinds |= TPD_CKPT_KIND_BIT(k);
    return kinds;
}

/* Where a rank's arrays come from when its files are written: copied from the backend
 * into one scratch buffer, one array at a time (a synchronous save), or a host snapshot
 * taken at the save point (an asynchronous one, written by its thread). */
typedef struct shard_source {
    const tpd_model *m;                      /* sync: read now */
    float *scratch;                          /* sync: (max(numel_padded, shard)) */
    const float *params;                     /* async: fp32 parameters (numel_padded) */
    const float *state[TPD_CKPT_KIND_COUNT]; /* async: the kinds' arrays (shard each) or NULL */
    int kinds;                               /* what the optimizer file holds */
} shard_source;

static tpd_status source_params(shard_source *s, const float **out) {
    if (s->params) {
        *out = s->params;
        return TPD_OK;
    }
    TPD_CHECK(tpd_model_params_f32(s->m, s->scratch));
    *out = s->scratch;
    return TPD_OK;
}

/* State array of kind k; *out NULL when the rank keeps none. */
static tpd_status source_state(shard_source *s, int k, size_t ns, const float **out) {
    if (!s->m) {
        *out = s->state[k];
        return TPD_OK;
    }
    const float *arrays[TPD_CKPT_KIND_COUNT];
    state_arrays(s->m, arrays);
    *out = NULL;
    if (!arrays[k]) return TPD_OK;
    TPD_CHECK(tpd_kern_copy_to_host(s->m->kb, s->scratch, arrays[k], ns * 4));
    *out = s->scratch;
    return TPD_OK;
}

/* Closes a shard file: its size and SHA-256 go to rec at bytes_at and sha_at. */
static tpd_status finish_file(tpd_ckpt_writer *w, int32_t *rec, int bytes_at, int sha_at) {
    char hex[65];
    uint64_t bytes;
    TPD_CHECK(tpd_ckpt_writer_finish(w, hex, &bytes));
    put_u64(rec + bytes_at, bytes);
    memcpy(rec + sha_at, hex, 64);
    return TPD_OK;
}

/* Writes this rank's model and optimizer files into tmp; rec gets sizes and hashes. */
/* show: draw a progress line of this rank's bytes (world rank 0 of a synchronous save; an
 * asynchronous one writes behind the training log). */
static tpd_status write_rank_files(const tpd_ckpt_rank *r, size_t ns, shard_source *src,
                                   const char *tmp, int32_t *rec, int show) {
    if (r->silent) return TPD_OK; /* HSDP: another shard group's copy */
    tpd_ckpt_rank_plan pl;
    TPD_CHECK(tpd_ckpt_rank_plan_init(r, &pl));
    tpd_status st = TPD_OK;
    tpd_progress prog, *pr = NULL;
    double done = 0;
    if (show) {
        /* parameters, then m, v, (bf16 training) the master weights, the outer state */
        int nstate = __builtin_popcount((unsigned)src->kinds);
        double total = 4.0 * ((double)pl.param_numel + nstate * (double)pl.state_numel);
        tpd_progress_begin(&prog, "checkpoint save (rank 0's files)", total, "MB", 1e6);
        pr = &prog;
    }
    char name[64], path[PATH_CAP + 80];
    tpd_ckpt_writer *w = NULL;
    const float *a = NULL;
    if (pl.param_numel > 0) {
        TPD_CHECK_GOTO(source_params(src, &a), st, out);
        tpd_ckpt_model_file_dp(r->tp, r->pp, r->dp, r->replica, name, sizeof name);
        tpd_ckpt_join(path, sizeof path, tmp, name);
        TPD_CHECK_GOTO(tpd_ckpt_writer_open(path, &w), st, out);
        TPD_CHECK_GOTO(write_segs(w, pl.param, TPD_P_COUNT, a, pr, &done), st, out);
        st = finish_file(w, rec, REC_MBYTES, REC_MSHA);
        w = NULL;
        if (st != TPD_OK) goto out;
    }
    if (pl.state_numel > 0 && src->kinds) {
        tpd_ckpt_optim_file_r(r->tp, r->pp, r->dp, r->replica, name, sizeof name);
        tpd_ckpt_join(path, sizeof path, tmp, name);
        TPD_CHECK_GOTO(tpd_ckpt_writer_open(path, &w), st, out);
        for (int k = TPD_CKPT_EXP_AVG; k < TPD_CKPT_KIND_COUNT; k++) {
            if (!(src->kinds & TPD_CKPT_KIND_BIT(k))) continue;
            TPD_CHECK_GOTO(source_state(src, k, ns, &a), st, out);
            if (!a)
                TPD_FAIL_GOTO(TPD_ERR_INTERNAL, st, out, "checkpoint %s: no state of kind %d", path,
                              k);
            TPD_CHECK_GOTO(write_segs(w, pl.state, TPD_P_COUNT, a, pr, &done), st, out);
        }
        st = finish_file(w, rec, REC_OBYTES, REC_OSHA);
        w = NULL;
    }
out:
    if (pr) tpd_progress_end(pr, done);
    tpd_ckpt_writer_abort(w);
    tpd_ckpt_rank_plan_free(&pl);
    return st;
}

/* Older checkpoints beyond keep_last go; never the one just committed. */
static void prune(const char *save_dir, const char *newest, int keep_last) {
    if (keep_last <= 0) return;
    char(*older)[PATH_CAP] = malloc(1024 * sizeof *older);
    if (!older) return;
    int n = tpd_ckpt_list_older(save_dir, newest, older, 1024);
    for (int i = keep_last - 1; i < n; i++)
        if (tpd_ckpt_remove_dir(older[i]) != TPD_OK)
            tpd_log_warn("checkpoint %s: could not prune", older[i]);
    free(older);
}

/* Rank 0's part after every rank agreed: manifest, rename, `latest`, prune. */
static tpd_status commit(const tpd_ckpt_view *v, const tpd_ckpt_state *state, const char *save_dir,
                         const char *tmp, const char *final, const int32_t *recs) {
    const tpd_mesh *ms = v->mesh;
    int world = ms->world_size;
    tpd_ckpt_file *files = calloc((size_t)world * 2, sizeof *files);
    char *json = NULL, path[PATH_CAP + 80], hex[65];
    tpd_status st = TPD_OK;
    if (!files) return tpd_fail(TPD_ERR_NOMEM, "checkpoint: out of memory");
    int inner = tpd_config_dp_inner(v->cfg, ms->data_dp_size);
    int H =
        tpd_config_dp_shard_engine(v->cfg, ms->data_dp_size); /* HSDP: the first group's files */
    for (int w = 0; w < world; w++) {
        const int32_t *rec = recs + (size_t)w * REC_WORDS;
        int t, d, s;
        tpd_mesh_coords_of(ms, w, &t, &d, &s);
        for (int k = 0; k < 2; k++) {
            tpd_ckpt_file *f = &files[2 * w + k];
            f->tp = t;
            f->pp = s;
            f->dp = (d % inner) % H;
            f->replica = d / inner;
            f->bytes = get_u64(rec + (k ? REC_OBYTES : REC_MBYTES));
            if (!f->bytes) continue;
            memcpy(f->sha256, rec + (k ? REC_OSHA : REC_MSHA), 64);
            if (k)
                tpd_ckpt_optim_file_r(t, s, f->dp, f->replica, f->name, sizeof f->name);
            else
                tpd_ckpt_model_file_dp(t, s, f->dp, f->replica, f->name, sizeof f->name);
        }
    }
    TPD_CHECK_GOTO(tpd_ckpt_manifest_build(v->cfg, ms->tp_size, ms->pp_size, H, ms->dp_size / inner,
                                           kinds_of(v->model, 0), state, world * 2, files, &json),
                   st, out);
    tpd_ckpt_sha256_hex(json, strlen(json), hex);
    tpd_ckpt_join(path, sizeof path, tmp, TPD_CKPT_MANIFEST_SHA);
    TPD_CHECK_GOTO(tpd_ckpt_write_file(path, hex, 64), st, out);
    tpd_ckpt_join(path, sizeof path, tmp, TPD_CKPT_MANIFEST);
    TPD_CHECK_GOTO(tpd_ckpt_write_file(path, json, strlen(json)), st, out);
    TPD_CHECK_GOTO(tpd_ckpt_fsync_dir(tmp), st, out);
    /* A directory of the same iteration (a rerun from an older checkpoint) is replaced:
     * moved aside first, since rename() does not replace a non-empty directory. */
    if (tpd_ckpt_is_dir(final)) {
        snprintf(path, sizeof path, "%s.old", final);
        tpd_ckpt_remove_dir(path);
        if (rename(final, path) != 0)
            TPD_FAIL_GOTO(TPD_ERR_IO, st, out, "checkpoint %s: cannot move the old one aside",
                          final);
    }
    if (rename(tmp, final) != 0)
        TPD_FAIL_GOTO(TPD_ERR_IO, st, out, "checkpoint %s: cannot rename to %s", tmp, final);
    TPD_CHECK_GOTO(tpd_ckpt_fsync_dir(save_dir), st, out);
    snprintf(path, sizeof path, "%s.old", final);
    if (tpd_ckpt_is_dir(path)) tpd_ckpt_remove_dir(path);
    /* only now does `latest` move */
    char latest[PATH_CAP + 16], latest_tmp[PATH_CAP + 16], line[32];
    snprintf(latest, sizeof latest, "%s/latest", save_dir);
    snprintf(latest_tmp, sizeof latest_tmp, "%s/latest.tmp", save_dir);
    snprintf(line, sizeof line, "iter_%07d\n", state->iteration);
    TPD_CHECK_GOTO(tpd_ckpt_write_file(latest_tmp, line, strlen(line)), st, out);
    if (rename(latest_tmp, latest) != 0)
        TPD_FAIL_GOTO(TPD_ERR_IO, st, out, "checkpoint %s: cannot rename to %s", latest_tmp,
                      latest);
    TPD_CHECK_GOTO(tpd_ckpt_fsync_dir(save_dir), st, out);
    prune(save_dir, final, v->cfg->checkpoint.keep_last);
out:
    free(json);
    free(files);
    return st;
}

static tpd_status bcast_int(tpd_comm *c, int *v) {
    int32_t x = *v;
    if (tpd_comm_size(c) > 1) TPD_CHECK(tpd_comm_broadcast(c, &x, 1, TPD_DTYPE_I32, 0, NULL));
    *v = x;
    return TPD_OK;
}

/* Rank 0 prepares a clean tmp directory (a killed save may have left one); all agree. */
static tpd_status prepare_dirs(tpd_comm *world, const char *save_dir, const char *tmp) {
    int ok = 1;
    if (tpd_comm_rank(world) == 0)
        ok = tpd_ckpt_mkdirs(save_dir) == TPD_OK && tpd_ckpt_remove_dir(tmp) == TPD_OK &&
             tpd_ckpt_mkdirs(tmp) == TPD_OK;
    TPD_CHECK(bcast_int(world, &ok));
    return ok ? TPD_OK : TPD_ERR_IO;
}

/* The agreement after every rank wrote (rec[REC_OK] says how): every rank sees every rank's
 * record, rank 0 commits when all succeeded, and all learn the outcome. */
static tpd_status agree_and_commit(tpd_ckpt_saver *sv, const tpd_ckpt_state *state,
                                   const char *save_dir, const char *tmp, const char *final,
                                   const int32_t *rec, double t0, const char *how) {
    const tpd_ckpt_view *v = &sv->view;
    tpd_comm *world = v->world;
    int32_t *recs = calloc((size_t)tpd_comm_size(world) * REC_WORDS, sizeof *recs);
    if (!recs) return tpd_fail(TPD_ERR_NOMEM, "checkpoint: out of memory");
    tpd_status st = tpd_comm_size(world) > 1
                        ? tpd_comm_allgather(world, rec, recs, REC_WORDS, TPD_DTYPE_I32, NULL)
                        : TPD_OK;
    if (tpd_comm_size(world) == 1) memcpy(recs, rec, REC_WORDS * sizeof *rec);
    if (st != TPD_OK) {
        free(recs);
        return st;
    }
    int all_ok = 1;
    for (int w = 0; w < tpd_comm_size(world); w++)
        all_ok &= recs[(size_t)w * REC_WORDS + REC_OK];
    int ok = all_ok;
    if (tpd_comm_rank(world) == 0) {
        if (!all_ok)
            tpd_fail(TPD_ERR_IO,
                     "checkpoint %s: a rank failed to write its shard; "
                     "abandoned (latest unchanged)",
                     tmp);
        else
            ok = commit(v, state, save_dir, tmp, final, recs) == TPD_OK;
        /* a failed save's files go at once: on a full disk they would keep it full */
        if (!ok && tpd_ckpt_is_dir(tmp) && tpd_ckpt_remove_dir(tmp) != TPD_OK)
            tpd_log_warn("checkpoint %s: could not remove the failed save", tmp);
    }
    free(recs);
    TPD_CHECK(bcast_int(world, &ok));
    if (!ok) return TPD_ERR_IO;
    sv->committed = state->iteration;
    if (v->is_logger)
        tpd_log_info("saved checkpoint %s (iteration %d, %.2f s%s)", final, state->iteration,
                     tpd_clock_s() - t0, how);
    return TPD_OK;
}

/* An asynchronous save in flight (checkpoint.async_save): the host snapshot of this
 * rank's arrays, written by a thread while training goes on. Only file I/O runs there;
 * the agreement and the commit happen on the main thread at a later boundary. */
struct ckpt_async {
    pthread_t thread;
    atomic_int done;
    int32_t rec[REC_WORDS];
    tpd_ckpt_rank rank;
    size_t ns;
    shard_source src;
    float *snap; /* params (numel_padded), then up to 3 shard arrays */
    tpd_ckpt_state state;
    char save_dir[PATH_CAP], tmp[PATH_CAP + 8], final[PATH_CAP];
    double t0;
};

tpd_status tpd_ckpt_saver_create(const tpd_ckpt_view *view, tpd_ckpt_saver **saver_p) {
    tpd_ckpt_saver *s = calloc(1, sizeof *s);
    if (!s) return tpd_fail(TPD_ERR_NOMEM, "checkpoint: out of memory");
    s->view = *view;
    s->committed = -1;
    *saver_p = s;
    return TPD_OK;
}

int tpd_ckpt_saver_in_flight(const tpd_ckpt_saver *s) {
    return s && s->async != NULL;
}

int tpd_ckpt_saver_committed(const tpd_ckpt_saver *s) {
    return s ? s->committed : -1;
}

static void *async_writer(void *arg) {
    ckpt_async *a = arg;
    a->rec[REC_OK] = write_rank_files(&a->rank, a->ns, &a->src, a->tmp, a->rec, 0) == TPD_OK;
    atomic_store(&a->done, 1);
    return NULL;
}

static void async_free(ckpt_async *a) {
    if (!a) return;
    free(a->snap);
    free(a);
}

tpd_status tpd_ckpt_saver_finish(tpd_ckpt_saver *sv, int wait) {
    ckpt_async *a = sv->async;
    if (!a) return TPD_OK;
    /* every rank must be done before any agrees: one reduction of the flags */
    int32_t busy = wait ? 0 : !atomic_load(&a->done);
    tpd_comm *world = sv->view.world;
    if (!wait && tpd_comm_size(world) > 1)
        TPD_CHECK(tpd_comm_allreduce(world, &busy, &busy, 1, TPD_DTYPE_I32, TPD_COMM_OP_MAX, NULL));
    if (busy) return TPD_OK;
    pthread_join(a->thread, NULL);
    sv->async = NULL;
    tpd_status st = agree_and_commit(sv, &a->state, a->save_dir, a->tmp, a->final, a->rec, a->t0,
                                     ", written in the background");
    async_free(a);
    return st;
}

void tpd_ckpt_saver_destroy(tpd_ckpt_saver *sv) {
    if (!sv) return;
    if (sv->async) {
        pthread_join(sv->async->thread, NULL); /* its tmp directory is never committed */
        async_free(sv->async);
    }
    free(sv);
}

/* All of this rank's parameters as fp32 in host memory (numel_padded): collective over DP
 * where they are sharded, so every rank calls it at the save point. */
static tpd_status snapshot_params(const tpd_ckpt_view *v, float *out) {
    if (v->gsync) return tpd_grad_sync_params_f32(v->gsync, out);
    return tpd_model_params_f32(v->model, out);
}

/* Snapshot now, write in a thread. */
static tpd_status save_async(tpd_ckpt_saver *sv, const tpd_ckpt_counters *c, const char *save_dir,
                             const char *tmp, const char *final, double t0) {
    const tpd_model *m = sv->view.model;
    ckpt_async *a = calloc(1, sizeof *a);
    size_t np = m->plan.numel_padded, ns = m->plan.shard_numel;
    const float *arrays[TPD_CKPT_KIND_COUNT];
    state_arrays(m, arrays);
    tpd_ckpt_rank r = rank_of(&sv->view);
    int kinds = kinds_of(m, r.replica);
    int nstate = __builtin_popcount((unsigned)kinds);
    if (a) a->snap = malloc((np + (size_t)nstate * ns) * 4 + 4);
    if (!a || !a->snap) {
        async_free(a);
        return tpd_fail(TPD_ERR_NOMEM, "checkpoint: out of memory for the snapshot of an "
                                       "asynchronous save");
    }
    tpd_status st = snapshot_params(&sv->view, a->snap);
    for (int k = TPD_CKPT_EXP_AVG, i = 0; k < TPD_CKPT_KIND_COUNT && st == TPD_OK; k++) {
        if (!(kinds & TPD_CKPT_KIND_BIT(k))) continue;
        float *dst = a->snap + np + (size_t)i++ * ns;
        st = tpd_kern_copy_to_host(m->kb, dst, arrays[k], ns * 4);
        a->src.state[k] = dst;
    }
    a->src.kinds = kinds;
    if (st != TPD_OK) {
        async_free(a);
        return st;
    }
    a->src.params = a->snap;
    a->rank = r;
    a->ns = ns;
    a->state = (tpd_ckpt_state){c->iteration, c->skipped_iterations, 0, c->consumed_samples};
    snprintf(a->save_dir, sizeof a->save_dir, "%s", save_dir);
    snprintf(a->tmp, sizeof a->tmp, "%s", tmp);
    snprintf(a->final, sizeof a->final, "%s", final);
    a->t0 = t0;
    atomic_init(&a->done, 0);
    if (pthread_create(&a->thread, NULL, async_writer, a) != 0) {
        async_free(a);
        return tpd_fail(TPD_ERR_IO, "checkpoint %s: cannot start the writer thread", tmp);
    }
    sv->async = a;
    return TPD_OK;
}

tpd_status tpd_ckpt_save(tpd_ckpt_saver *sv, const tpd_ckpt_counters *c, const char *save_dir) {
    /* one save at a time: a previous asynchronous one commits first */
    TPD_CHECK(tpd_ckpt_saver_finish(sv, 1));
    const tpd_ckpt_view *v = &sv->view;
    const tpd_config_diloco *dl = &v->cfg->diloco;
    /* an outer all-reduce in flight: its averaged pseudo-gradient (outer_delta) is not part
     * of a checkpoint yet, and a resume without it would not be bit-exact */
    if (v->model->outer_delta && dl->overlap_steps > 0 &&
        tpd_diloco_pending_fragment(v->cfg, c->iteration) >= 0)
        return tpd_fail(TPD_ERR_INVALID,
                        "checkpoint %s: iteration %d has fragment %d's outer step in flight "
                        "(diloco.overlap_steps %d); checkpoints are taken only where no outer "
                        "step is pending (diloco.overlap_steps 0, or another iteration)",
                        save_dir, c->iteration, tpd_diloco_pending_fragment(v->cfg, c->iteration),
                        dl->overlap_steps);
    char tmp[PATH_CAP + 8], final[PATH_CAP];
    snprintf(final, sizeof final, "%s/iter_%07d", save_dir, c->iteration);
    snprintf(tmp, sizeof tmp, "%s.tmp", final);
    double t0 = tpd_clock_s();
    TPD_CHECK(prepare_dirs(v->world, save_dir, tmp));
    if (v->cfg->checkpoint.async_save) return save_async(sv, c, save_dir, tmp, final, t0);

    const tpd_model *m = v->model;
    size_t ns = m->plan.shard_numel;
    int32_t rec[REC_WORDS];
    memset(rec, 0, sizeof rec);
    shard_source src = {m,
                        malloc((m->plan.numel_padded > ns ? m->plan.numel_padded : ns) * 4 + 4),
                        NULL,
                        {NULL},
                        0};
    tpd_ckpt_rank r = rank_of(v);
    src.kinds = kinds_of(m, r.replica);
    /* sharded parameters are gathered by every rank now (dp 0 writes them) */
    if (src.scratch && m->plan.sharding == TPD_DP_SHARDING_OPTIM_GRADS_PARAMS) {
        tpd_status gst = snapshot_params(v, src.scratch);
        if (gst != TPD_OK) {
            free(src.scratch);
            return gst;
        }
        src.params = src.scratch;
    }
    rec[REC_OK] = src.scratch &&
                  write_rank_files(&r, ns, &src, tmp, rec, tpd_comm_rank(v->world) == 0) == TPD_OK;
    if (!src.scratch) tpd_fail(TPD_ERR_NOMEM, "checkpoint: out of memory");
    free(src.scratch);
    tpd_ckpt_state state = {c->iteration, c->skipped_iterations, 0, c->consumed_samples};
    return agree_and_commit(sv, &state, save_dir, tmp, final, rec, t0, "");
}

/* ---- load ---- */

/* Rank 0: the directory to load, verified; with fallback the newest older one that
 * verifies. A model-shape mismatch is a config error, never a reason to fall back. */
static tpd_status choose(const tpd_config *cfg, const char *path, char *dir) {
    tpd_ckpt_info info;
    tpd_status st = tpd_ckpt_resolve(path, dir);
    if (st == TPD_OK) st = tpd_ckpt_manifest_read(dir, TPD_CKPT_VERIFY_ALL, &info);
    if (st != TPD_OK && cfg->checkpoint.fallback == TPD_FALLBACK_PREVIOUS) {
        char first_error[1024];
        snprintf(first_error, sizeof first_error, "%s", tpd_last_error());
        char(*older)[PATH_CAP] = malloc(1024 * sizeof *older);
        int n = older ? tpd_ckpt_list_older(path, dir, older, 1024) : 0;
        for (int i = 0; i < n && st != TPD_OK; i++) {
            if (tpd_ckpt_manifest_read(older[i], TPD_CKPT_VERIFY_ALL, &info) != TPD_OK) continue;
            tpd_log_warn("checkpoint: falling back to %s (%s)", older[i], first_error);
            snprintf(dir, PATH_CAP, "%s", older[i]);
            st = TPD_OK;
        }
        free(older);
        if (st != TPD_OK)
            tpd_fail(st, "checkpoint %s: no checkpoint verifies (first error: %s)", path,
                     first_error);
    }
    if (st != TPD_OK) return st;
    st = tpd_ckpt_check_model(&info, cfg);
    tpd_ckpt_close(&info);
    return st;
}

/* tpd_ckpt_load; loaded (PATH_CAP bytes, may be NULL) gets the directory it loaded. */
static tpd_status load_from(const tpd_ckpt_view *v, const char *path, tpd_ckpt_counters *c_p,
                            int *continues_p, char *loaded) {
    tpd_comm *world = v->world;
    char dir[PATH_CAP];
    memset(dir, 0, sizeof dir);
    int32_t verdict = TPD_OK;
    if (tpd_comm_rank(world) == 0) verdict = choose(v->cfg, path, dir);
    if (tpd_comm_size(world) > 1) {
        int32_t msg[1 + PATH_CAP / 4];
        msg[0] = verdict;
        memcpy(msg + 1, dir, sizeof dir);
        TPD_CHECK(tpd_comm_broadcast(world, msg, 1 + PATH_CAP / 4, TPD_DTYPE_I32, 0, NULL));
        verdict = msg[0];
        memcpy(dir, msg + 1, sizeof dir);
        dir[PATH_CAP - 1] = 0;
    }
    if (verdict != TPD_OK) return (tpd_status)verdict;

    tpd_ckpt_info info;
    tpd_status st = tpd_ckpt_manifest_read(dir, TPD_CKPT_VERIFY_NONE, &info);
    int fresh = 0;
    if (st == TPD_OK) {
        fresh = info.weights_only || v->cfg->checkpoint.finetune;
        tpd_ckpt_rank r = rank_of(v);
        /* test-only (base/fault.h): a resume that reads another rank's slice */
        if (r.tp_size > 1 && tpd_fault("wrong-shard", 0, NULL))
            st = tpd_model_layout_init(v->cfg, r.tp_size, (r.tp + 1) % r.tp_size, r.pp_size, r.pp,
                                       &r.lay);
        /* DiLoCo with the checkpoint's replica count: each replica its own state; any other
         * run replica 0's */
        int diloco = v->cfg->parallel.dp_sync == TPD_DP_SYNC_DILOCO;
        int replicas = v->mesh->dp_size / r.dp_size;
        int own = diloco && info.dp_sync == TPD_DP_SYNC_DILOCO && info.replicas == replicas;
        if (st == TPD_OK)
            st = tpd_ckpt_load_local(&info, &r, v->model, fresh, own ? r.replica : 0, diloco);
        if (st == TPD_OK && v->is_logger) {
            if (info.replicas > 1 && !own)
                tpd_log_warn("checkpoint %s: holds %d DiLoCo replicas; this run (%s, %d "
                             "replica%s) loads replica 0's parameters and optimizer state",
                             dir, info.replicas, diloco ? "diloco" : "every_step", replicas,
                             replicas == 1 ? "" : "s");
            if (v->model->outer_sync && (fresh || !info.has_kind[TPD_CKPT_OUTER_SYNC]))
                tpd_log_info("checkpoint %s: %s; the DiLoCo outer state starts at the loaded "
                             "parameters with zero outer momentum",
                             dir, fresh ? "weights only" : "holds no outer state");
            if (v->model->opt_m && !fresh && !info.has_kind[TPD_CKPT_EXP_AVG])
                tpd_log_info("checkpoint %s: holds no AdamW m, v (optimizer.type sgd wrote it); "
                             "they start at zero",
                             dir);
        }
    }
    /* every rank learns whether any rank failed */
    int32_t bad = st != TPD_OK;
    if (tpd_comm_size(world) > 1)
        TPD_CHECK(tpd_comm_allreduce(world, &bad, &bad, 1, TPD_DTYPE_I32, TPD_COMM_OP_MAX, NULL));
    if (bad) {
        if (st == TPD_OK) tpd_ckpt_close(&info);
        return st != TPD_OK ? st : TPD_ERR_IO;
    }
    c_p->iteration = fresh ? 0 : info.iteration;
    c_p->consumed_samples = fresh ? 0 : info.consumed_samples;
    c_p->skipped_iterations = fresh ? 0 : info.skipped_iterations;
    if (continues_p) *continues_p = !fresh;
    if (v->is_logger) {
        char reps[48] = ""; /* DiLoCo: the DP of a replica, times the replicas */
        if (info.replicas > 1) snprintf(reps, sizeof reps, " x %d DiLoCo replicas", info.replicas);
        tpd_log_info("loaded checkpoint %s (saved at iteration %d under TP %d PP %d DP %d%s%s)%s",
                     dir, info.iteration, info.tp, info.pp, info.dp, reps,
                     info.zero ? " with sharded optimizer state" : "",
                     fresh ? ": weights only, starting at iteration 0" : "");
    }
    tpd_ckpt_close(&info);
    if (loaded) snprintf(loaded, PATH_CAP, "%s", dir);
    return TPD_OK;
}

tpd_status tpd_ckpt_load(const tpd_ckpt_view *v, const char *path, tpd_ckpt_counters *c_p,
                         int *continues_p) {
    return load_from(v, path, c_p, continues_p, NULL);
}

tpd_status tpd_ckpt_resume(const tpd_ckpt_view *v, tpd_ckpt_counters *c_p, int *continues_p,
                           char *loaded_dir) {
    const tpd_config_checkpoint *c = &v->cfg->checkpoint;
    if (loaded_dir) loaded_dir[0] = 0;
    if (!c->load[0]) return TPD_OK;
    if (strcmp(c->load, "auto") != 0) return load_from(v, c->load, c_p, continues_p, loaded_dir);
    if (!c->save[0]) {
        tpd_fail(TPD_ERR_INVALID, "checkpoint.load: 'auto' needs checkpoint.save");
        return TPD_ERR_INVALID;
    }
    char latest[PATH_CAP + 16];
    snprintf(latest, sizeof latest, "%s/latest", c->save);
    /* every rank sees the same file system: the same answer without a collective */
    if (tpd_ckpt_is_file(latest)) return load_from(v, c->save, c_p, continues_p, loaded_dir);
    /* No `latest` (deleted, or lost with its disk): the checkpoints are still the run's,
     * and starting fresh would overwrite them. Resume from the newest; choose() verifies
     * it and, with fallback previous, passes over the ones that fail. */
    char newest[1][PATH_CAP];
    if (tpd_ckpt_list_older(c->save, "", newest, 1) == 0) {
        if (v->is_logger) tpd_log_info("checkpoint: no checkpoint in %s, starting fresh", c->save);
        return TPD_OK;
    }
    if (v->is_logger && c->fallback == TPD_FALLBACK_PREVIOUS)
        tpd_log_warn("checkpoint: %s is missing; resuming from the newest checkpoint there "
                     "that verifies, from %s down",
                     latest, newest[0]);
    else if (v->is_logger)
        tpd_log_warn("checkpoint: %s is missing; resuming from the newest checkpoint there, %s "
                     "(checkpoint.fallback: previous would try the older ones should it not "
                     "verify)",
                     latest, newest[0]);
    return load_from(v, newest[0], c_p, continues_p, loaded_dir);
}
