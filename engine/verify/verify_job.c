/* One run of the trainer on a layout for `tripod verify`, and the two checks that look at
 * the built ranks themselves: the structure (layers per stage and chunk, against the
 * planner's split) and the memory (each rank's allocation against the planner's bytes). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/plan/plan.h"
#include "engine/train/train.h"
#include "engine/verify/verify_internal.h"
#include "kernels/cpu/cpu.h"

void tpd_verify_job_free(tpd_verify_job *j) {
    free(j->loss);
    free(j->norm);
    for (int p = 0; p < TPD_P_COUNT; p++) {
        free(j->loaded[p]);
        free(j->at_save[p]);
        free(j->final_[p]);
        free(j->initial[p]);
    }
    j->loss = j->norm = NULL;
    memset(j->loaded, 0, sizeof j->loaded);
    memset(j->at_save, 0, sizeof j->at_save);
    memset(j->final_, 0, sizeof j->final_);
    memset(j->initial, 0, sizeof j->initial);
}

tpd_status tpd_verify_tied_copies_differ(tpd_trainer *tr, int32_t *differ_p) {
    const tpd_model *m = tpd_trainer_model(tr);
    tpd_comm *emb = tpd_trainer_host_comms(tr)->emb;
    int32_t diff = 0;
    tpd_status st = TPD_OK;
    if (emb && tpd_comm_size(emb) == 2 && m->d.tied) {
        /* elementwise max of w and of -w over the two copies agree only where they are equal;
         * wte is one block of the flat buffer (not per layer) */
        const tpd_param_slice *s = &m->plan.lay.p[TPD_P_WTE];
        float *all = malloc((m->plan.numel_padded + 1) * sizeof *all);
        float *lo = malloc((s->numel + 1) * sizeof *lo);
        if (!all || !lo) st = TPD_ERR_NOMEM;
        if (st == TPD_OK) st = tpd_trainer_params_f32(tr, all);
        float *hi = all ? all + s->offset : NULL;
        for (size_t i = 0; st == TPD_OK && i < s->numel; i++)
            lo[i] = -hi[i];
        if (st == TPD_OK)
            st = tpd_comm_allreduce(emb, hi, hi, s->numel, TPD_DTYPE_F32, TPD_COMM_OP_MAX, NULL);
        if (st == TPD_OK)
            st = tpd_comm_allreduce(emb, lo, lo, s->numel, TPD_DTYPE_F32, TPD_COMM_OP_MAX, NULL);
        for (size_t i = 0; st == TPD_OK && i < s->numel; i++)
            diff += hi[i] != -lo[i];
        free(all);
        free(lo);
        if (st == TPD_ERR_NOMEM) tpd_log_error("verify: out of memory");
    }
    TPD_CHECK(st);
    TPD_CHECK(tpd_comm_allreduce(tpd_trainer_host_comms(tr)->world, &diff, &diff, 1, TPD_DTYPE_I32,
                                 TPD_COMM_OP_SUM, NULL));
    *differ_p = diff;
    return TPD_OK;
}

/* every global tensor onto root: the parameters, or with masters the optimizer's fp32 copy */
static tpd_status gather_tensors(tpd_trainer *tr, int root, int masters, float *out[TPD_P_COUNT]) {
    const tpd_model_layout *lay = &tpd_trainer_model(tr)->plan.lay;
    for (int p = 0; p < TPD_P_COUNT; p++) {
        size_t n = tpd_model_layout_global_numel(lay, (tpd_param)p);
        out[p] = root ? calloc(n ? n : 1, sizeof(float)) : NULL;
        if (root && !out[p]) {
            tpd_log_error("verify: out of memory for the parameters");
            return TPD_ERR_NOMEM;
        }
        TPD_CHECK(masters ? tpd_trainer_gather_master(tr, (tpd_param)p, out[p])
                          : tpd_trainer_gather_param(tr, (tpd_param)p, out[p]));
    }
    return TPD_OK;
}

tpd_status tpd_verify_gather_params(tpd_trainer *tr, int root, float *out[TPD_P_COUNT]) {
    return gather_tensors(tr, root, 0, out);
}

/* The rows of one rank in the structure check: stage, tp, dp, layers, then per chunk its
 * layers and its first global layer. */
#define ROW_HEAD 4

/* Stage and chunk layers as built, against the planner's split of the config (the split
 * `train` runs: parallel.pipeline_layers, or even, or balanced). Collective over the job's
 * communicator `jc`; sets j->structure_ok on every rank. */
static tpd_status check_structure(tpd_verify_job *j, tpd_trainer *tr, tpd_comm *jc,
                                  tpd_verify_report *rep) {
    const tpd_model_dims *d = &tpd_trainer_model(tr)->d;
    const tpd_mesh *ms = tpd_trainer_mesh(tr);
    int v = d->v, width = ROW_HEAD + 2 * v, n = tpd_comm_size(jc), me = tpd_comm_rank(jc);
    int32_t *row = calloc((size_t)width, sizeof *row);
    int32_t *all = me == 0 ? calloc((size_t)width * n, sizeof *all) : NULL;
    tpd_status st = TPD_OK;
    if (!row || (me == 0 && !all)) {
        free(row);
        free(all);
        tpd_log_error("verify: out of memory");
        return TPD_ERR_NOMEM;
    }
    row[0] = ms->pp;
    row[1] = ms->tp;
    row[2] = ms->dp;
    row[3] = d->Ls;
    for (int c = 0; c < v; c++) {
        row[ROW_HEAD + 2 * c] = d->chunk_layers[c];
        row[ROW_HEAD + 2 * c + 1] = d->chunk_g0[c];
    }
    st = tpd_comm_gather(jc, row, all, (size_t)width, TPD_DTYPE_I32, 0);
    int32_t ok = 1;
    if (st == TPD_OK && me == 0) {
        const tpd_config *cfg = &j->cfg;
        tpd_verify_check *c = tpd_verify_add(rep, "structure", 0);
        tpd_plan_layout lay;
        tpd_plan_layout_from_config(cfg, n, &lay);
        int pp = lay.pp, L = cfg->model.num_layers;
        int *built = calloc((size_t)L + 1, sizeof *built);
        int bad_ranks = 0;
        for (int r = 0; r < n && built; r++) {
            const int32_t *w = all + (size_t)r * width;
            int s = w[0], expect = tpd_plan_stage_layers(cfg, &lay, s), first = 0, bad = 0;
            for (int k = 0; k < v; k++) { /* the first layer of virtual stage k*PP + s */
                first = 0;
                for (int u = 0; u < k * pp + s; u++)
                    first += tpd_plan_chunk_layers(cfg, &lay, u % pp, u / pp);
                int want = tpd_plan_chunk_layers(cfg, &lay, s, k);
                int have = w[ROW_HEAD + 2 * k], g0 = w[ROW_HEAD + 2 * k + 1];
                if (w[1] == 0 && w[2] == 0)
                    for (int l = g0; l < g0 + have && l < L; l++)
                        built[l]++;
                if ((have != want || (have > 0 && g0 != first)) && bad++ == 0 && bad_ranks == 0)
                    tpd_verify_fail(c,
                                    "stage %d of %d holds %d layers, expected %d (rank %d, TP %d "
                                    "DP %d: chunk %d holds %d layers from layer %d, expected %d "
                                    "from layer %d)",
                                    s, pp, w[3], expect, r, w[1], w[2], k, have, g0, want, first);
            }
            if (w[3] != expect && bad++ == 0 && bad_ranks == 0)
                tpd_verify_fail(c, "stage %d of %d holds %d layers, expected %d (rank %d)", s, pp,
                                w[3], expect, r);
            bad_ranks += bad > 0;
        }
        int missing = -1, twice = -1, total = 0;
        for (int l = 0; built && l < L; l++) {
            total += built[l];
            if (built[l] == 0 && missing < 0) missing = l;
            if (built[l] > 1 && twice < 0) twice = l;
        }
        if (!built) {
            tpd_verify_fail(c, "out of memory");
        } else if (c->verdict == TPD_VERIFY_PASS && (missing >= 0 || twice >= 0)) {
            tpd_verify_fail(c, "the stages build %d of %d layers (layer %d %s)", total, L,
                            missing >= 0 ? missing : twice,
                            missing >= 0 ? "is built by no stage" : "is built twice");
        } else if (c->verdict != TPD_VERIFY_PASS && missing >= 0) {
            size_t k = strlen(c->detail);
            snprintf(c->detail + k, sizeof c->detail - k,
                     "; the stages build %d of %d layers, layer %d by none", total, L, missing);
        }
        c->worst = bad_ranks;
        if (c->verdict == TPD_VERIFY_PASS) {
            int lo = L, hi = 0;
            for (int s = 0; s < pp; s++) {
                int k = tpd_plan_stage_layers(cfg, &lay, s);
                lo = k < lo ? k : lo;
                hi = k > hi ? k : hi;
            }
            snprintf(c->detail, sizeof c->detail,
                     "%d stages x %d chunks on %d ranks: %d of %d layers, each once, %d..%d per "
                     "stage as train splits them",
                     pp, v, n, total, L, lo, hi);
        }
        free(built);
        ok = c->verdict == TPD_VERIFY_PASS;
    }
    if (st == TPD_OK) st = tpd_comm_broadcast(jc, &ok, 1, TPD_DTYPE_I32, 0, NULL);
    j->structure_ok = ok;
    free(all);
    free(row);
    return st;
}

/* Each rank's allocation against the planner's cpu figure for its stage: the bytes the
 * cpu backend counts as allocated once the trainer is built (every device buffer, the
 * model's and any other) plus the model's host staging, and the model's own count. Both
 * must equal the plan to the byte. Collective over jc. */
static tpd_status check_memory(tpd_verify_job *j, tpd_trainer *tr, tpd_comm *jc,
                               tpd_verify_report *rep) {
    const tpd_model *m = tpd_trainer_model(tr);
    const tpd_mesh *ms = tpd_trainer_mesh(tr);
    int n = tpd_comm_size(jc), me = tpd_comm_rank(jc);
    tpd_plan_layout lay;
    tpd_plan_layout_from_config(&j->cfg, n, &lay);
    tpd_plan_stage_mem pm;
    memset(&pm, 0, sizeof pm);
    tpd_status pst = tpd_plan_cpu_memory(&j->cfg, &lay, ms->pp, &pm);
    double host = (double)(m->plan.mem.workspace - m->plan.ws_bytes);
    double row[5] = {(double)tpd_kern_cpu_bytes_allocated(m->kb) + host, (double)m->bytes_allocated,
                     pst == TPD_OK ? pm.total : -1, ms->pp, ms->tp};
    double *all = me == 0 ? calloc((size_t)n * 5, sizeof *all) : NULL;
    if (me == 0 && !all) {
        tpd_log_error("verify: out of memory");
        return TPD_ERR_NOMEM;
    }
    tpd_status st = tpd_comm_gather(jc, row, all, 5, TPD_DTYPE_F64, 0);
    if (st == TPD_OK && me == 0) {
        tpd_verify_check *c = tpd_verify_add(rep, "memory", 0);
        double worst = 0, lo = INFINITY, hi = 0;
        for (int r = 0; r < n; r++) {
            const double *w = all + 5 * r;
            double diff = fmax(fabs(w[0] - w[2]), fabs(w[1] - w[2]));
            lo = w[0] < lo ? w[0] : lo;
            hi = w[0] > hi ? w[0] : hi;
            if (diff > worst) {
                if (worst == 0)
                    tpd_verify_fail(c,
                                    "rank %d (stage %d, TP %d) allocated %.0f bytes (the model "
                                    "counts %.0f), the planner says %.0f (%+.0f)",
                                    r, (int)w[3], (int)w[4], w[0], w[1], w[2], w[0] - w[2]);
                worst = diff;
            }
        }
        c->worst = worst;
        rep->small_mem_max = hi;
        if (c->verdict == TPD_VERIFY_PASS)
            snprintf(c->detail, sizeof c->detail,
                     "%d ranks allocate %.2f..%.2f MiB each, the planner's figure to the byte", n,
                     lo / 1048576.0, hi / 1048576.0);
    }
    free(all);
    return st;
}

static tpd_status run_member(tpd_verify_job *j, tpd_comm *jc, int root, tpd_verify_report *rep) {
    tpd_trainer *tr = NULL;
    TPD_CHECK(tpd_trainer_create(&j->cfg, jc, &tr));
    tpd_status st = TPD_OK;
    int total = j->steps + j->more;
    if (root) {
        j->loss = calloc((size_t)total + 1, sizeof *j->loss);
        j->norm = calloc((size_t)total + 1, sizeof *j->norm);
    }
    j->structure_ok = 1;
    if (j->check_layout) {
        TPD_CHECK_GOTO(check_structure(j, tr, jc, rep), st, out);
        if (!j->no_memory) TPD_CHECK_GOTO(check_memory(j, tr, jc, rep), st, out);
        if (!j->structure_ok) goto out; /* a broken model is not trained or compared */
    }
    int ms = j->masters;
    if (j->load && j->load[0]) TPD_CHECK_GOTO(gather_tensors(tr, root, ms, j->loaded), st, out);
    if (ms) TPD_CHECK_GOTO(gather_tensors(tr, root, ms, j->initial), st, out);
    for (int i = 0; i < total; i++) {
        if (i == j->steps && j->steps > 0) {
            TPD_CHECK_GOTO(gather_tensors(tr, root, ms, j->at_save), st, out);
            TPD_CHECK_GOTO(tpd_verify_tied_copies_differ(tr, &j->tied_differ), st, out);
            if (j->save) TPD_CHECK_GOTO(tpd_trainer_save(tr, j->save), st, out);
        }
        tpd_step_stats s;
        TPD_CHECK_GOTO(tpd_trainer_step(tr, &s), st, out);
        if (root) {
            j->loss[i] = s.lm_loss;
            j->norm[i] = s.grad_norm;
        }
    }
    if (j->more == 0) {
        TPD_CHECK_GOTO(gather_tensors(tr, root, ms, j->at_save), st, out);
        TPD_CHECK_GOTO(tpd_verify_tied_copies_differ(tr, &j->tied_differ), st, out);
        if (j->save) TPD_CHECK_GOTO(tpd_trainer_save(tr, j->save), st, out);
    } else {
        TPD_CHECK_GOTO(gather_tensors(tr, root, ms, j->final_), st, out);
    }
out:
    tpd_trainer_destroy(tr);
    return st;
}

tpd_status tpd_verify_job_run(tpd_verify_job *j, tpd_comm *world, tpd_verify_report *rep) {
    int me = tpd_comm_rank(world), member = me < j->ranks;
    tpd_comm *jc = NULL;
    TPD_CHECK(tpd_comm_split(world, member ? 0 : -1, me, "verify", &jc));
    tpd_status st = TPD_OK;
    if (member) {
        snprintf(j->cfg.checkpoint.load, sizeof j->cfg.checkpoint.load, "%s",
                 j->load ? j->load : "");
        j->cfg.parallel.data_parallel_size = 0; /* derived from the job's ranks */
        st = run_member(j, jc, me == 0, rep);
        tpd_comm_destroy(jc);
    }
    /* every rank learns whether the run failed, and whether its structure held */
    int32_t v[2] = {st != TPD_OK, member ? !j->structure_ok : 0};
    tpd_status cst = tpd_comm_allreduce(world, v, v, 2, TPD_DTYPE_I32, TPD_COMM_OP_MAX, NULL);
    if (cst != TPD_OK) return cst;
    j->structure_ok = !v[1];
    if (v[0] && st == TPD_OK) st = TPD_ERR_INTERNAL; /* another rank logged it */
    return st;
}
