/* Private to engine/verify/: the record of one run on one layout, and the comparisons that
 * turn two records into a check (verify_check.c). */
#ifndef TPD_ENGINE_VERIFY_VERIFY_INTERNAL_H
#define TPD_ENGINE_VERIFY_VERIFY_INTERNAL_H

#include "engine/model/model_layout.h"
#include "engine/verify/verify.h"

/* One run of the trainer on world ranks 0 .. ranks-1: create (loading `load` when set),
 * `steps` steps, save into `save` when set, `more` steps. World rank 0 keeps the losses,
 * grad norms and the global parameters at three points. */
typedef struct tpd_verify_job {
    tpd_config cfg; /* the layout's config */
    int ranks;
    const char *load, *save;
    int steps, more;
    int check_layout;            /* run the structure and memory checks into the report */
    int no_memory;               /* with check_layout: the structure check only (a cuda backend's
                                    memory is not the cpu backend's count) */
    int masters;                 /* gather the optimizer's fp32 copy (tpd_trainer_gather_master) */
    float *initial[TPD_P_COUNT]; /* before the first step, when masters */
    /* world rank 0 */
    double *loss, *norm;         /* steps + more */
    float *loaded[TPD_P_COUNT];  /* after create, when load */
    float *at_save[TPD_P_COUNT]; /* after `steps` */
    float *final_[TPD_P_COUNT];  /* after steps + more, when more > 0 */
    int32_t tied_differ;         /* after `steps`: tpd_verify_tied_copies_differ */
    int structure_ok;            /* every rank: the structure check passed (1 when not run) */
} tpd_verify_job;

void tpd_verify_job_free(tpd_verify_job *j);
/* Every global parameter tensor onto world rank 0 of the trainer (out[p] malloc'd there
 * when root, NULL elsewhere). Collective over the trainer's world. */
tpd_status tpd_verify_gather_params(tpd_trainer *tr, int root, float *out[TPD_P_COUNT]);
/* Runs the job; collective over world. */
tpd_status tpd_verify_job_run(tpd_verify_job *j, tpd_comm *world, tpd_verify_report *rep);

/* A new check in the report (NULL when full). */
tpd_verify_check *tpd_verify_add(tpd_verify_report *rep, const char *name, double tolerance);
void tpd_verify_fail(tpd_verify_check *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Per-step series `got` against `ref` (n steps, the first at iteration first_iter):
 * relative error, or bit-identity when tolerance is 0. */
void tpd_verify_cmp_series(tpd_verify_check *c, const char *what, const double *got,
                           const double *ref, int n, int first_iter, const char *ref_name);
/* Global parameters `got` against `ref`, per tensor and layer: ||got - ref|| / ||ref||
 * within c->tolerance, or byte-equal when it is 0. A failure names the parameter, the
 * layer, the stage, the chunk and the ranks of `cfg`'s layout that hold it. */
void tpd_verify_cmp_params(tpd_verify_check *c, const tpd_config *cfg, float *const got[],
                           float *const ref[], const char *when);
/* The same per tensor, each layer's piece measured against how far the reference moved it
 * from init: ||got - ref|| / ||ref - init|| within c->tolerance (tpd_verify_moved_diff). */
void tpd_verify_cmp_moved(tpd_verify_check *c, const tpd_config *cfg, float *const got[],
                          float *const ref[], float *const init[], const char *when);
/* Per-step series of the device `got` against the reference `ref` (n steps from step 1),
 * step s within bound(b, s): relative error |got - ref| / |ref|. */
typedef double (*tpd_verify_bound_fn)(const tpd_verify_budget *b, int step);
void tpd_verify_cmp_budget(tpd_verify_check *c, const char *what, const double *got,
                           const double *ref, int n, const tpd_verify_budget *b,
                           tpd_verify_bound_fn bound);
/* `verify --device cuda`: the layout on the device against the same layout on the cpu
 * (verify_device.c). Collective over world. */
tpd_status tpd_verify_rehearse_device(tpd_comm *world, tpd_verify_report *rep);

#endif
