#include "engine/bench/bench.h"

#include <string.h>

tpd_status tpd_bench_measure(tpd_trainer *tr, int warmup, int steps, tpd_bench_report *r_p) {
    const tpd_mesh *ms = tpd_trainer_mesh(tr);
    const tpd_config *cfg = tpd_trainer_config(tr);
    int P = ms->pp_size, n = 0;
    if (P > TPD_CONFIG_MAX_STAGES) return TPD_ERR_INVALID;
    double sum = 0;
    /* summed over ranks: [0] pipeline compute, [1] pipeline wait, [2] pipeline time,
     * [K + s] stage s compute per rank (s); max over ranks: [0] reduction, [1] gathers */
    enum { K = 3 };
    double acc[K + TPD_CONFIG_MAX_STAGES], mx[2] = {0, 0};
    memset(acc, 0, sizeof acc);
    for (int i = 0; i < warmup + steps; i++) {
        tpd_step_stats s;
        TPD_CHECK(tpd_trainer_step(tr, &s));
        if (i < warmup) continue;
        n++;
        sum += s.elapsed_s;
        acc[0] += s.pipe.compute_s;
        acc[1] += s.pipe.wait_s;
        acc[2] += s.pipe.total_s;
        acc[K + ms->pp] += s.pipe.compute_s / (ms->tp_size * ms->dp_size);
        mx[0] += s.t_reduce_s;
        mx[1] += s.t_param_wait_s;
    }
    tpd_comm *world = tpd_trainer_host_comms(tr)->world;
    TPD_CHECK(
        tpd_comm_allreduce(world, acc, acc, K + (size_t)P, TPD_DTYPE_F64, TPD_COMM_OP_SUM, NULL));
    TPD_CHECK(tpd_comm_allreduce(world, mx, mx, 2, TPD_DTYPE_F64, TPD_COMM_OP_MAX, NULL));
    tpd_bench_report r;
    memset(&r, 0, sizeof r);
    r.steps = n;
    r.step_s = n > 0 ? sum / n : 0;
    r.flops_per_step = tpd_trainer_flops_per_iteration(tr);
    r.tokens_per_s =
        r.step_s > 0 ? (double)cfg->training.global_batch_size * cfg->model.seq_length / r.step_s
                     : 0;
    r.world = ms->world_size;
    r.tp = ms->tp_size;
    r.pp = P;
    r.dp = ms->dp_size;
    r.micro_batches = tpd_trainer_micro_batches(tr);
    r.pipe_compute_s = acc[0];
    r.pipe_wait_s = acc[1];
    r.pipe_total_s = acc[2];
    r.idle_fraction = acc[2] > 0 ? 1.0 - acc[0] / acc[2] : 0.0;
    r.reduce_s = n > 0 ? mx[0] / n : 0;
    r.param_wait_s = n > 0 ? mx[1] / n : 0;
    for (int s = 0; s < P && n > 0; s++)
        r.stage_compute_s[s] = acc[K + s] / n;
    *r_p = r;
    return TPD_OK;
}

tpd_status tpd_bench_predict(const tpd_config *cfg, const tpd_plan_cluster *cl, int world,
                             tpd_plan_result *res_p) {
    tpd_plan_layout lay;
    tpd_plan_layout_from_config(cfg, world, &lay);
    tpd_plan_options opt = TPD_PLAN_OPTIONS_INIT; /* the layout's own overlap flags */
    opt.gpus = world;
    opt.balance_stages = 0; /* the split the config runs */
    return tpd_plan_evaluate(cfg, cl, &lay, &opt, res_p);
}
