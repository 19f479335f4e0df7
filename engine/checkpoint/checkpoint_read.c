/* Finding and reading checkpoints in one process: `latest`, the fallback candidates, the
 * global tensors, and the local load of one rank's slice (whatever layout wrote it). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/progress.h"
#include "engine/checkpoint/checkpoint_internal.h"

#define PATH_CAP (TPD_CONFIG_STR + 64)

/* "iter_NNNNNNN" exactly: returns the iteration, -1 otherwise. */
static int iter_of(const char *name) {
    if (strncmp(name, "iter_", 5) != 0 || strlen(name) != 12) return -1;
    int v = 0;
    for (int i = 5; i < 12; i++) {
        if (name[i] < '0' || name[i] > '9') return -1;
        v = v * 10 + (name[i] - '0');
    }
    return v;
}

tpd_status tpd_ckpt_resolve(const char *path, char *dir) {
    char probe[PATH_CAP + 32];
    tpd_ckpt_join(probe, sizeof probe, path, TPD_CKPT_MANIFEST);
    if (tpd_ckpt_is_file(probe)) {
        snprintf(dir, PATH_CAP, "%s", path);
        return TPD_OK;
    }
    snprintf(probe, sizeof probe, "%s/latest", path);
    if (!tpd_ckpt_is_file(probe)) {
        if (tpd_ckpt_is_file(path))
            return tpd_fail(TPD_ERR_IO,
                            "checkpoint %s: is a file; a checkpoint is a directory "
                            "(iter_NNNNNNN holding %s) or a save directory holding latest",
                            path, TPD_CKPT_MANIFEST);
        if (!tpd_ckpt_is_dir(path))
            return tpd_fail(TPD_ERR_IO, "checkpoint %s: no such directory", path);
        return tpd_fail(TPD_ERR_IO,
                        "checkpoint %s: neither a checkpoint (no %s) nor a save directory "
                        "(no latest)",
                        path, TPD_CKPT_MANIFEST);
    }
    char *text = NULL;
    size_t n = 0;
    TPD_CHECK(tpd_ckpt_read_file(probe, &text, &n));
    while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == ' '))
        text[--n] = 0;
    tpd_status st = TPD_OK;
    char sub[PATH_CAP + 32];
    snprintf(sub, sizeof sub, "%s/%s/%s", path, text, TPD_CKPT_MANIFEST);
    if (iter_of(text) < 0 || !tpd_ckpt_is_file(sub)) {
        /* show the start of it, printable bytes only */
        char shown[40];
        size_t k = 0;
        for (; k < n && k + 1 < sizeof shown; k++)
            shown[k] = (text[k] >= 32 && text[k] < 127) ? text[k] : '?';
        shown[k] = 0;
        st = tpd_fail(TPD_ERR_FORMAT,
                      "checkpoint %s: names '%s', which is not a checkpoint directory "
                      "(iter_NNNNNNN holding %s)",
                      probe, shown, TPD_CKPT_MANIFEST);
    } else {
        tpd_ckpt_join(dir, PATH_CAP, path, text);
    }
    free(text);
    return st;
}

static int cmp_desc(const void *a, const void *b) {
    return strcmp((const char *)b, (const char *)a);
}

int tpd_ckpt_list_older(const char *save_dir, const char *dir, char (*out)[PATH_CAP], int cap) {
    char parent[PATH_CAP];
    int limit = -1;
    if (dir && dir[0]) {
        snprintf(parent, sizeof parent, "%s", dir);
        char *slash = strrchr(parent, '/');
        const char *base = slash ? slash + 1 : parent;
        limit = iter_of(base);
        if (slash)
            *slash = 0;
        else
            snprintf(parent, sizeof parent, ".");
    } else {
        snprintf(parent, sizeof parent, "%s", save_dir);
    }
    DIR *d = opendir(parent);
    if (!d) return 0;
    char(*names)[16] = NULL;
    int n = 0, ncap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int it = iter_of(e->d_name);
        if (it < 0 || (limit >= 0 && it >= limit)) continue;
        if (n == ncap) {
            ncap = ncap ? 2 * ncap : 16;
            char(*v)[16] = realloc(names, (size_t)ncap * sizeof *names);
            if (!v) break;
            names = v;
        }
        snprintf(names[n++], 16, "%.15s", e->d_name); /* iter_NNNNNNN: 12 bytes */
    }
    closedir(d);
    if (n > 1) qsort(names, (size_t)n, sizeof *names, cmp_desc); /* fixed width: newest first */
    int k = 0;
    for (; k < n && k < cap; k++)
        tpd_ckpt_join(out[k], PATH_CAP, parent, names[k]);
    free(names);
    return k;
}

static tpd_status open_verified(const char *path, int verify, tpd_ckpt_info *info_p) {
    char dir[PATH_CAP];
    TPD_CHECK(tpd_ckpt_resolve(path, dir));
    return tpd_ckpt_manifest_read(dir, verify, info_p);
}

tpd_status tpd_ckpt_open(const char *path, tpd_ckpt_info *info_p) {
    return open_verified(path, TPD_CKPT_VERIFY_ALL, info_p);
}

tpd_status tpd_ckpt_open_weights(const char *path, tpd_ckpt_info *info_p) {
    return open_verified(path, TPD_CKPT_VERIFY_WEIGHTS, info_p);
}

void tpd_ckpt_close(tpd_ckpt_info *info) {
    tpd_ckpt_manifest_free(info->man);
    info->man = NULL;
}

static int *open_fds(const tpd_ckpt_info *info) {
    int n = info->man->nfiles ? info->man->nfiles : 1;
    int *fds = malloc((size_t)n * sizeof *fds);
    for (int i = 0; fds && i < n; i++)
        fds[i] = -1;
    return fds;
}

static void close_fds(const tpd_ckpt_info *info, int *fds) {
    if (!fds) return;
    for (int i = 0; i < info->man->nfiles; i++)
        if (fds[i] >= 0) close(fds[i]);
    free(fds);
}

tpd_status tpd_ckpt_read_global(const tpd_ckpt_info *info, tpd_param p, tpd_ckpt_kind k,
                                float *out) {
    tpd_model_layout g;
    TPD_CHECK(tpd_model_layout_init(&info->cfg, 1, 0, 1, 0, &g));
    tpd_ckpt_seg all = {0, (int64_t)tpd_model_layout_global_numel(&g, p), 0, 0};
    tpd_ckpt_segs want = {&all, 1, 1};
    int *fds = open_fds(info);
    if (!fds) return tpd_fail(TPD_ERR_NOMEM, "checkpoint: out of memory");
    tpd_status st = tpd_ckpt_gather(info, p, k, &want, out, fds);
    close_fds(info, fds);
    return st;
}

tpd_status tpd_ckpt_load_local(const tpd_ckpt_info *info, const tpd_ckpt_rank *r, tpd_model *m,
                               int weights_only, int replica, int outer) {
    /* replica r > 0: its own runs over the shared files; the outer state is replica 0's */
    const tpd_ckpt_info *base = info;
    tpd_ckpt_info rinfo = *info;
    if (replica > 0 && (!info->man || replica > info->man->nrep))
        return tpd_fail(TPD_ERR_FORMAT, "checkpoint %s: holds no replica %d", info->dir, replica);
    if (replica > 0) {
        rinfo.man = &info->man->rep[replica - 1];
        info = &rinfo;
    }
    const tpd_kern_backend *kb = m->kb;
    size_t np = m->plan.numel_padded, ns = m->plan.shard_numel;
    float *params = calloc(np ? np : 1, 4), *state = calloc(ns ? ns : 1, 4);
    int *fds = open_fds(info);
    tpd_status st = TPD_OK;
    tpd_ckpt_segs want = {0};
    if (!params || !state || !fds)
        TPD_FAIL_GOTO(TPD_ERR_NOMEM, st, out, "checkpoint: out of memory");
    /* fp32 master weights, when saved, are the exact values behind bf16 parameters */
    tpd_ckpt_kind pk = info->has_kind[TPD_CKPT_MASTER] ? TPD_CKPT_MASTER : TPD_CKPT_PARAM;
    /* the first rank of the mesh shows its progress (parameters, then optimizer state) */
    tpd_progress prog;
    double done = 0;
    tpd_progress_begin(
        &prog, "checkpoint load (rank 0's slice)",
        4.0 * ((double)np + (weights_only ? 0 : !!m->opt_m + !!m->opt_v) * (double)ns +
               (m->master && !weights_only && info->has_kind[TPD_CKPT_MASTER] ? (double)ns : 0)),
        "MB", 1e6);
    if (r->tp || r->pp || r->dp) prog.active = 0;
    for (int p = 0; p < TPD_P_COUNT; p++) {
        TPD_CHECK_GOTO(tpd_ckpt_segs_param(r, (tpd_param)p, 0, &want), st, out);
        TPD_CHECK_GOTO(tpd_ckpt_gather(info, (tpd_param)p, pk, &want, params, fds), st, out);
        for (size_t i = 0; i < want.n; i++)
            done += 4.0 * (double)want.v[i].n;
        tpd_progress_update(&prog, done);
        tpd_ckpt_segs_free(&want);
    }
    /* all of them, or this rank's shard where the strategy keeps only that */
    TPD_CHECK_GOTO(tpd_model_load_params_f32(m, &r->dpp, params), st, out);
    /* m, v, master, then the outer state; each a full pass over the shard */
    for (int k = TPD_CKPT_EXP_AVG; k < TPD_CKPT_KIND_COUNT; k++) {
        float *dst = k == TPD_CKPT_EXP_AVG      ? m->opt_m
                     : k == TPD_CKPT_EXP_AVG_SQ ? m->opt_v
                     : k == TPD_CKPT_MASTER     ? m->master
                     : k == TPD_CKPT_OUTER_SYNC ? m->outer_sync
                                                : m->outer_mom;
        if (!dst || ns == 0) continue;
        memset(state, 0, ns * 4);
        /* the outer state lives in replica 0's runs (has_kind is replica 0's) */
        const tpd_ckpt_info *src = k >= TPD_CKPT_OUTER_SYNC ? base : info;
        int have = !weights_only && base->has_kind[k] && (k < TPD_CKPT_OUTER_SYNC || outer);
        if (k == TPD_CKPT_OUTER_MOM && !have) {
            /* no outer state: no momentum yet */
        } else if ((k == TPD_CKPT_MASTER || k == TPD_CKPT_OUTER_SYNC) && !have) {
            /* master weights restart from the parameters of the owned ranges */
            for (int i = 0; i < r->dpp.nranges; i++) {
                const tpd_dp_range *rg = &r->dpp.ranges[i];
                memcpy(state + rg->state, params + rg->begin, (rg->end - rg->begin) * 4);
            }
        } else if (have) { /* else m, v absent (plain SGD wrote it) start at zero */
            for (int p = 0; p < TPD_P_COUNT; p++) {
                TPD_CHECK_GOTO(tpd_ckpt_segs_state(r, (tpd_param)p, 0, &want), st, out);
                TPD_CHECK_GOTO(
                    tpd_ckpt_gather(src, (tpd_param)p, (tpd_ckpt_kind)k, &want, state, fds), st,
                    out);
                for (size_t i = 0; i < want.n; i++)
                    done += 4.0 * (double)want.v[i].n;
                tpd_progress_update(&prog, done);
                tpd_ckpt_segs_free(&want);
            }
        }
        TPD_CHECK_GOTO(tpd_kern_copy_to_device(kb, dst, state, ns * 4), st, out);
    }
    TPD_CHECK_GOTO(tpd_model_zero_grads(m), st, out);
    TPD_CHECK_GOTO(tpd_kern_synchronize(kb), st, out);
    tpd_progress_end(&prog, prog.total); /* padding rows are not in the files */
out:
    tpd_ckpt_segs_free(&want);
    close_fds(info, fds);
    free(state);
    free(params);
    return st;
}

tpd_status tpd_ckpt_load_model(const tpd_ckpt_info *info, tpd_model *m, const tpd_dp_plan *dpp) {
    tpd_ckpt_rank r;
    memset(&r, 0, sizeof r);
    r.tp_size = r.pp_size = r.dp_size = 1;
    r.lay = m->plan.lay;
    r.dpp = *dpp;
    r.zero = dpp->zero;
    TPD_CHECK(tpd_ckpt_check_model(info, &m->cfg));
    return tpd_ckpt_load_local(info, &r, m, 1, 0, 0);
}

tpd_status tpd_ckpt_write_weights(const tpd_config *cfg, int tp, int pp, int dp,
                                  float *const global[TPD_P_COUNT], const char *dir) {
    char path[PATH_CAP + 80];
    tpd_ckpt_join(path, sizeof path, dir, TPD_CKPT_MANIFEST);
    if (tpd_ckpt_is_file(path))
        return tpd_fail(TPD_ERR_INVALID, "checkpoint %s: already holds a checkpoint", dir);
    TPD_CHECK(tpd_ckpt_mkdirs(dir));
    tpd_config_layout lay;
    tpd_config_layout_get(cfg, &lay);
    lay.tp = tp;
    lay.pp = pp;
    lay.dp = dp;
    lay.distributed_optimizer = 0; /* weights only: no optimizer state to shard */
    lay.ep = 1;                    /* and the files of dp 0 hold every expert */
    tpd_config c;
    tpd_config_relayout(cfg, &lay, &c);
    int world = tp * pp * dp;
    tpd_ckpt_file *files = calloc((size_t)world * 2, sizeof *files);
    char *json = NULL;
    tpd_status st = TPD_OK;
    if (!files) return tpd_fail(TPD_ERR_NOMEM, "checkpoint: out of memory");
    for (int s = 0; s < pp; s++)
        for (int t = 0; t < tp; t++) {
            tpd_ckpt_rank r;
            tpd_ckpt_rank_plan pl;
            TPD_CHECK_GOTO(tpd_ckpt_rank_init(&c, tp, pp, dp, t, s, 0, &r), st, out);
            st = tpd_ckpt_rank_plan_init(&r, &pl);
            tpd_ckpt_rank_free(&r);
            if (st != TPD_OK) goto out;
            tpd_ckpt_file *f = &files[2 * (t + tp * dp * s)];
            f->tp = t;
            f->pp = s;
            tpd_ckpt_model_file(t, s, f->name, sizeof f->name);
            tpd_ckpt_join(path, sizeof path, dir, f->name);
            tpd_ckpt_writer *w = NULL;
            st = tpd_ckpt_writer_open(path, &w);
            for (int p = 0; st == TPD_OK && p < TPD_P_COUNT; p++)
                for (size_t i = 0; st == TPD_OK && i < pl.param[p].n; i++)
                    st = tpd_ckpt_writer_put(w, global[p] + pl.param[p].v[i].g,
                                             (size_t)pl.param[p].v[i].n * 4);
            if (st == TPD_OK)
                st = tpd_ckpt_writer_finish(w, f->sha256, &f->bytes);
            else if (w)
                tpd_ckpt_writer_abort(w);
            tpd_ckpt_rank_plan_free(&pl);
            if (st != TPD_OK) goto out;
        }
    tpd_ckpt_state state = {0, 0, 1, 0};
    TPD_CHECK_GOTO(tpd_ckpt_manifest_build(&c, tp, pp, dp, 1, 0, &state, world * 2, files, &json),
                   st, out);
    char hex[65];
    tpd_ckpt_sha256_hex(json, strlen(json), hex);
    tpd_ckpt_join(path, sizeof path, dir, TPD_CKPT_MANIFEST_SHA);
    TPD_CHECK_GOTO(tpd_ckpt_write_file(path, hex, 64), st, out);
    /* the manifest last: a directory without it is not a checkpoint */
    tpd_ckpt_join(path, sizeof path, dir, TPD_CKPT_MANIFEST);
    TPD_CHECK_GOTO(tpd_ckpt_write_file(path, json, strlen(json)), st, out);
    TPD_CHECK_GOTO(tpd_ckpt_fsync_dir(dir), st, out);
out:
    free(json);
    free(files);
    return st;
}
