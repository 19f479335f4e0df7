/* `tripod verify`: the order of the rehearsal. One rank alone trains the reference; the
 * layout trains the same steps, checks its structure and memory, saves and steps once
 * more; the checkpoint is then loaded at the same layout, into one rank and into another
 * layout, each stepping once from it. (--device cuda: verify_device.c instead, after the
 * same shrinking, data and config checks.) */
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/clock.h"
#include "engine/data/data.h"
#include "engine/plan/plan.h"
#include "engine/verify/verify_internal.h"

/* Deterministic tokens below the shrunken vocabulary: documents of 997 tokens from a
 * linear congruential sequence with a little structure (a token often repeats its
 * predecessor's successor), enough samples for every step. Written by world rank 0. */
static tpd_status write_data(const char *prefix, const tpd_config *c) {
    int V = c->model.vocab_size;
    size_t need = (size_t)(c->training.train_iters + 2) * c->training.global_batch_size *
                  (c->model.seq_length + 1);
    size_t n = need * 2 + 4096, docs = n / 997 + 1;
    int32_t *tok = malloc(n * sizeof *tok);
    uint64_t *off = malloc((docs + 1) * sizeof *off);
    tpd_status st = TPD_ERR_NOMEM;
    if (tok && off) {
        uint64_t x = 0x9e3779b97f4a7c15ull;
        for (size_t i = 0; i < n; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            tok[i] = (x >> 33) % 4 == 0 || i == 0 ? (int32_t)((x >> 40) % (uint64_t)V)
                                                  : (tok[i - 1] * 7 + 3) % V;
        }
        size_t k = 0;
        for (size_t d = 0; d <= docs; d++)
            off[k++] = d * 997 < n ? d * 997 : n;
        while (k > 1 && off[k - 1] == off[k - 2])
            k--;
        st = tpd_indexed_write(prefix, tok, off, k - 1, V);
    } else {
        tpd_log_error("verify: out of memory for the data");
    }
    free(off);
    free(tok);
    return st;
}

/* The one-rank form of a layout's config: TP = PP = DP = 1, no virtual stages, 1F1B,
 * nothing that needs more ranks. */
static tpd_config one_rank(const tpd_config *c) {
    const tpd_config_layout one = TPD_CONFIG_LAYOUT_INIT;
    tpd_config o;
    tpd_config_relayout(c, &one, &o);
    return o;
}

/* A layout other than the rehearsal's for the checkpoint to be resharded into, on at most
 * `ranks` ranks: TP 1 at the same pipeline, else TP 2, else no pipeline. 0 when none fits. */
static int other_layout(const tpd_config *c, int ranks, tpd_config *o) {
    int tp = c->parallel.tensor_model_parallel_size, pp = c->parallel.pipeline_model_parallel_size;
    int cand[3][2] = {{1, pp}, {2, pp}, {tp, 1}};
    for (int i = 0; i < 3; i++) {
        int t = cand[i][0], p = cand[i][1];
        if ((t == tp && p == pp) || t * p > ranks) continue;
        tpd_config_layout lay;
        tpd_config_layout_get(c, &lay);
        lay.tp = t;
        lay.pp = p;
        lay.dp = 1;
        lay.cp = 1; /* a context-parallel checkpoint loads where no sequence is split */
        lay.distributed_optimizer = 0;
        tpd_config_relayout(c, &lay, o);
        int kv = tpd_config_kv_heads(o);
        if (o->model.num_attention_heads % t || kv % t || o->model.ffn_hidden_size % t ||
            (o->parallel.sequence_parallel && o->model.seq_length % t))
            continue;
        tpd_log_quiet_begin(); /* a layout that does not fit is only passed over */
        tpd_status fits = tpd_config_check_world(o, t * p);
        tpd_log_quiet_end();
        if (fits != TPD_OK) continue;
        return 1;
    }
    return 0;
}

/* The planner's bytes per rank of the real model at the rehearsal's layout (the config's
 * DP when it states one), on the real config's cluster profile. */
static void real_memory(const tpd_config *real, const tpd_verify_options *opt, int dp,
                        tpd_verify_report *rep) {
    const char *name = opt->cluster                              ? opt->cluster
                       : real->training.device == TPD_DEVICE_CPU ? "cpu"
                                                                 : "h200";
    snprintf(rep->real_cluster, sizeof rep->real_cluster, "%s", name);
    tpd_plan_cluster cl;
    if (tpd_plan_cluster_load(name, &cl) != TPD_OK) return;
    tpd_plan_result *res = calloc(1, sizeof *res);
    if (!res) return;
    int tp = real->parallel.tensor_model_parallel_size;
    int pp = real->parallel.pipeline_model_parallel_size;
    tpd_plan_layout_from_config(real, tp * pp * tpd_config_cp(real) * dp, &res->layout);
    if (tpd_plan_memory(real, &cl, res) == TPD_OK) {
        rep->real_mem_max = res->memory_bytes;
        rep->real_mem_stage = res->max_mem_stage;
        rep->real_hbm_bytes = cl.hbm_bytes * cl.hbm_usable_fraction;
    }
    free(res);
}

static void skip(tpd_verify_report *rep, const char *name, const char *why) {
    tpd_verify_check *c = tpd_verify_add(rep, name, 0);
    if (!c) return;
    c->verdict = TPD_VERIFY_SKIP;
    snprintf(c->detail, sizeof c->detail, "not run: %s", why);
}

/* Loads the checkpoint `dir` into cfg's layout, steps once, and checks: the loaded
 * tensors byte-equal to the saved ones, the step's loss and the parameters after it
 * against the layout's own continuation (bit-identical when tol is 0). */
static tpd_status resume_check(const char *name, const tpd_config *cfg, int ranks, const char *dir,
                               const tpd_verify_job *lay, tpd_comm *world, double tol,
                               tpd_verify_report *rep) {
    tpd_verify_job j;
    memset(&j, 0, sizeof j);
    j.cfg = *cfg;
    j.ranks = ranks;
    j.load = dir;
    j.more = 1;
    tpd_status st = tpd_verify_job_run(&j, world, rep);
    if (st == TPD_OK && tpd_comm_rank(world) == 0) {
        tpd_verify_check *c = tpd_verify_add(rep, name, 0);
        char when[64];
        snprintf(when, sizeof when, "after loading iteration %d", rep->steps);
        tpd_verify_cmp_params(c, cfg, j.loaded, lay->at_save, when);
        if (c) c->tolerance = tol;
        tpd_verify_cmp_series(c, "resumed loss", j.loss, lay->loss + rep->steps, 1, rep->steps + 1,
                              "the layout's own");
        snprintf(when, sizeof when, "after the resumed step %d", rep->steps + 1);
        tpd_verify_cmp_params(c, cfg, j.final_, lay->final_, when);
        if (c && c->verdict == TPD_VERIFY_PASS)
            snprintf(c->detail, sizeof c->detail,
                     "loaded tensors byte-equal to the saved ones; step %d %s the layout's own",
                     rep->steps + 1, tol > 0 ? "within tolerance of" : "bit-identical to");
    }
    tpd_verify_job_free(&j);
    return st;
}

static void layout_name(const tpd_config *c, char *buf, size_t n) {
    snprintf(buf, n, "TP %d PP %d DP 1", c->parallel.tensor_model_parallel_size,
             c->parallel.pipeline_model_parallel_size);
}

/* world rank 0 decides; every rank learns the verdict and the message */
static tpd_status agree(tpd_comm *world, tpd_status st, const char *err) {
    int32_t v = st;
    TPD_CHECK(tpd_comm_broadcast(world, &v, 1, TPD_DTYPE_I32, 0, NULL));
    if (v != TPD_OK && tpd_comm_rank(world) == 0 && err && err[0]) tpd_log_error("%s", err);
    return (tpd_status)v;
}

/* DiLoCo's reference (tpd_verify_diloco_reference) on world rank 0 alone, into the job
 * record the comparisons read. Collective over world. */
static tpd_status diloco_reference(const tpd_config *small, const tpd_verify_report *rep,
                                   tpd_comm *world, tpd_verify_job *ref) {
    int me = tpd_comm_rank(world) == 0;
    tpd_comm *one = NULL;
    TPD_CHECK(tpd_comm_split(world, me ? 0 : -1, 0, "verify", &one));
    tpd_status st = TPD_OK;
    if (me) {
        ref->loss = calloc((size_t)rep->steps + 1, sizeof *ref->loss);
        ref->norm = calloc((size_t)rep->steps + 1, sizeof *ref->norm);
        st = ref->loss && ref->norm
                 ? tpd_verify_diloco_reference(small, rep->dp, rep->steps, one, ref->loss,
                                               ref->norm, ref->at_save)
                 : tpd_fail_nomem("the reference's losses", 16 * rep->steps);
        tpd_comm_destroy(one);
    }
    int32_t bad = st != TPD_OK;
    TPD_CHECK(tpd_comm_allreduce(world, &bad, &bad, 1, TPD_DTYPE_I32, TPD_COMM_OP_MAX, NULL));
    return bad ? (st != TPD_OK ? st : TPD_ERR_INTERNAL) : TPD_OK;
}

static tpd_status rehearse(const tpd_verify_options *opt, tpd_comm *world, tpd_verify_report *rep,
                           const char *data) {
    int me = tpd_comm_rank(world), K = rep->steps;
    tpd_config *small = &rep->small;
    /* the reference: one rank alone */
    tpd_verify_job ref, lay;
    memset(&ref, 0, sizeof ref);
    memset(&lay, 0, sizeof lay);
    ref.cfg = one_rank(small);
    ref.ranks = 1;
    ref.steps = K;
    int diloco = small->parallel.dp_sync == TPD_DP_SYNC_DILOCO;
    int noref = diloco && !tpd_verify_diloco_has_reference(small, rep->dp);
    const char *ref_name = diloco ? "the one-rank DiLoCo reference" : "one rank";
    tpd_status st = noref    ? TPD_OK
                    : diloco ? diloco_reference(small, rep, world, &ref)
                             : tpd_verify_job_run(&ref, world, rep);
    /* the layout: structure, memory, K steps, save, one more */
    char ckpt[TPD_CONFIG_STR + 32], dir[TPD_CONFIG_STR + 48];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", opt->scratch);
    snprintf(dir, sizeof dir, "%s/iter_%07d", ckpt, K);
    lay.cfg = *small;
    lay.ranks = rep->ranks;
    lay.steps = K;
    lay.more = 1;
    lay.save = ckpt;
    lay.check_layout = 1;
    if (st == TPD_OK) st = tpd_verify_job_run(&lay, world, rep);
    if (st == TPD_OK && !lay.structure_ok) {
        if (me == 0)
            for (int i = 0; i < 6; i++) {
                static const char *const names[] = {
                    "train: loss",          "train: grad norm",
                    "train: params",        "checkpoint: same layout",
                    "checkpoint: one rank", "checkpoint: other layout"};
                skip(rep, names[i], "the structure check failed");
            }
    } else if (st == TPD_OK) {
        if (me == 0 && noref) {
            static const char why[] = "fragments are spans of each rank's own shard: a one-rank "
                                      "reference of them exists at TP = PP = 1 without ZeRO-1";
            skip(rep, "train: loss", why);
            skip(rep, "train: grad norm", why);
            skip(rep, "train: params", why);
        } else if (me == 0) {
            tpd_verify_check *c = tpd_verify_add(rep, "train: loss", TPD_VERIFY_TOL_LOSS);
            tpd_verify_cmp_series(c, "loss", lay.loss, ref.loss, K, 1, ref_name);
            if (c && c->verdict == TPD_VERIFY_PASS)
                snprintf(c->detail, sizeof c->detail, "%d steps against %s", K, ref_name);
            c = tpd_verify_add(rep, "train: grad norm", TPD_VERIFY_TOL_NORM);
            tpd_verify_cmp_series(c, "grad norm", lay.norm, ref.norm, K, 1, ref_name);
            if (c && c->verdict == TPD_VERIFY_PASS)
                snprintf(c->detail, sizeof c->detail, "%d steps against %s", K, ref_name);
            c = tpd_verify_add(rep, "train: params", TPD_VERIFY_TOL_PARAM);
            char when[64];
            snprintf(when, sizeof when, "after step %d", K);
            tpd_verify_cmp_params(c, small, lay.at_save, ref.at_save, when);
            if (lay.tied_differ)
                tpd_verify_fail(c,
                                "the tied embedding's copies on stage 0 and stage %d differ in "
                                "%d elements after step %d",
                                small->parallel.pipeline_model_parallel_size - 1,
                                (int)lay.tied_differ, K);
            if (c && c->verdict == TPD_VERIFY_PASS)
                snprintf(c->detail, sizeof c->detail,
                         "every tensor of every layer after step %d, against %s%s", K, ref_name,
                         small->model.untie_embeddings_and_output_weights ||
                                 small->parallel.pipeline_model_parallel_size == 1
                             ? ""
                             : "; both copies of the tied embedding bit-identical");
        }
        tpd_verify_job_free(&ref);
        st = resume_check("checkpoint: same layout", small, rep->ranks, dir, &lay, world, 0, rep);
        tpd_config one = one_rank(small), other;
        if (diloco) {
            /* another replica count trains another algorithm: nothing to continue against */
            if (st == TPD_OK && me == 0) {
                skip(rep, "checkpoint: one rank", "a DiLoCo checkpoint continues at its replicas");
                skip(rep, "checkpoint: other layout",
                     "a DiLoCo checkpoint continues at its replicas");
            }
        } else {
            if (st == TPD_OK)
                st = resume_check("checkpoint: one rank", &one, 1, dir, &lay, world,
                                  TPD_VERIFY_TOL_PARAM, rep);
            if (st == TPD_OK && other_layout(small, rep->ranks, &other)) {
                char name[96];
                layout_name(&other, rep->other_layout, sizeof rep->other_layout);
                snprintf(name, sizeof name, "checkpoint: %s", rep->other_layout);
                st = resume_check(name, &other,
                                  other.parallel.tensor_model_parallel_size *
                                      other.parallel.pipeline_model_parallel_size,
                                  dir, &lay, world, TPD_VERIFY_TOL_PARAM, rep);
            } else if (st == TPD_OK && me == 0) {
                skip(rep, "checkpoint: other layout", "no other layout fits these ranks");
            }
        }
    }
    (void)data;
    tpd_verify_job_free(&ref);
    tpd_verify_job_free(&lay);
    return st;
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

/* The scratch directory and everything in it: the data, the config and the checkpoints. */
static void remove_scratch(const char *dir) {
    if (nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        tpd_log_warn("verify: could not remove %s", dir);
}

/* DiLoCo: an outer step inside the rehearsal's steps. H shrinks to the least the
 * fragments and overlap allow (at least 2, so that inner steps differ between replicas),
 * the steps cover every fragment's first outer step, and the save falls where no outer
 * all-reduce is in flight. */
static void diloco_steps(tpd_verify_report *rep) {
    tpd_config *c = &rep->small;
    if (c->parallel.dp_sync != TPD_DP_SYNC_DILOCO) return;
    tpd_config_diloco *d = &c->diloco;
    int F = d->fragments > 0 ? d->fragments : 1, H = F * (d->overlap_steps + 1);
    if (H < 2) H = F * 2;
    if (H < d->sync_interval) {
        tpd_log_info("verify: DiLoCo rehearsed with diloco.sync_interval %d (the config's %d): "
                     "outer steps inside the rehearsal",
                     H, d->sync_interval);
        d->sync_interval = H;
    }
    if (rep->steps < d->sync_interval + d->overlap_steps)
        rep->steps = d->sync_interval + d->overlap_steps;
    while (tpd_diloco_pending_fragment(c, rep->steps) >= 0)
        rep->steps++;
    if (c->training.train_iters < rep->steps + 1) c->training.train_iters = rep->steps + 1;
}

tpd_status tpd_verify_run(const tpd_config *real, const tpd_verify_options *opt, tpd_comm *world,
                          tpd_verify_report *rep) {
    double t0 = tpd_clock_s();
    memset(rep, 0, sizeof *rep);
    rep->real = *real;
    rep->world = tpd_comm_size(world);
    rep->steps = opt->steps > 0 ? opt->steps : 3;
    rep->device = opt->device;
    if (opt->device == TPD_DEVICE_CUDA) {
        const char *stand = getenv(TPD_VERIFY_DEVICE_ENV);
        rep->device_stand_in = stand && !strcmp(stand, "cpu");
    }
    int me = tpd_comm_rank(world);
    int tp = real->parallel.tensor_model_parallel_size;
    int pp = real->parallel.pipeline_model_parallel_size;
    rep->real_dp = real->parallel.data_parallel_size;
    int cp = tpd_config_cp(real), copy = tp * pp * cp; /* the ranks of one model copy */
    int ranks = opt->ranks > 0 ? opt->ranks : rep->real_dp > 0 ? copy * rep->real_dp : rep->world;
    char err[1024] = {0};
    tpd_status st = TPD_OK;
    if (ranks % copy)
        st = snprintf(err, sizeof err,
                      "verify: %d ranks do not hold whole copies of the model: a multiple of "
                      "TP x PP%s = %d x %d%s = %d is needed (--ranks N shrinks DP)",
                      ranks, cp > 1 ? " x CP" : "", tp, pp, cp > 1 ? " x CP" : "", copy) > 0
                 ? TPD_ERR_INVALID
                 : TPD_ERR_INVALID;
    rep->ranks = ranks;
    rep->tp = tp;
    rep->pp = pp;
    rep->cp = cp;
    rep->dp = ranks / copy;
    rep->v = real->parallel.virtual_pipeline_model_parallel_size;
    if (st == TPD_OK)
        st = tpd_verify_shrink(real, rep->dp, rep->steps, &rep->small, err, sizeof err);
    if (st == TPD_OK) diloco_steps(rep);
    if (st == TPD_OK && me == 0)
        st = tpd_verify_check_machine(&rep->small, ranks, rep->world, err, sizeof err);
    TPD_CHECK(agree(world, st, err));

    /* the data, and the shrunken config through the loader's every rule */
    char data[TPD_CONFIG_STR], yaml[TPD_CONFIG_STR + 16];
    snprintf(data, sizeof data, "%s/data", opt->scratch);
    snprintf(yaml, sizeof yaml, "%s/verify.yaml", opt->scratch);
    snprintf(rep->small.data.data_path, sizeof rep->small.data.data_path, "%s", data);
    if (me == 0) {
        if (mkdir(opt->scratch, 0755) != 0 && errno != EEXIST) {
            snprintf(err, sizeof err, "verify: cannot create %s: %s", opt->scratch,
                     strerror(errno));
            st = TPD_ERR_IO;
        }
        if (st == TPD_OK) st = write_data(data, &rep->small);
        FILE *f = st == TPD_OK ? fopen(yaml, "w") : NULL;
        if (f) {
            tpd_config_print(&rep->small, f);
            fclose(f);
            tpd_config check;
            st = tpd_config_load(yaml, 0, NULL, &check);
        } else if (st == TPD_OK) {
            snprintf(err, sizeof err, "verify: cannot write %s", yaml);
            st = TPD_ERR_IO;
        }
        real_memory(real, opt, rep->real_dp > 0 ? rep->real_dp : rep->dp, rep);
    }
    st = agree(world, st, err);
    if (st == TPD_OK)
        st = opt->device == TPD_DEVICE_CUDA ? tpd_verify_rehearse_device(world, rep)
                                            : rehearse(opt, world, rep, data);
    tpd_comm_barrier(world);
    if (me == 0) remove_scratch(opt->scratch);
    rep->wall_s = tpd_clock_s() - t0;
    /* a check that does not apply (no other layout on one rank) is skipped, not failed;
     * the checks skipped after a failed structure check come with that failure */
    rep->passed = rep->n_checks > 0;
    for (int i = 0; i < rep->n_checks; i++)
        if (rep->checks[i].verdict == TPD_VERIFY_FAIL) rep->passed = 0;
    return st;
}
