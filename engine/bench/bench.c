#include "engine/bench/bench.h"

#include <string.h>

tpd_status tpd_bench_measure(tpd_trainer *tr, int warmup, int steps, tpd_bench_report *r_p) {
    const tpd_mesh *ms = tpd_trainer_mesh(tr);
    const tpd_config *cfg = tpd_trainer_config(tr);
    int P = ms->pp_size, n = 0;
    double sum = 0;
    /* [0] pipeline compute, [1] pipeline wait, [2 + s] stage s compute per rank (s) */
    double acc[2 + TPD_CONFIG_MAX_STAGES];
    memset(acc, 0, sizeof acc);
    for (int i = 0; i < warmup + steps; i++) {
        tpd_step_stats s;
        TPD_CHECK(tpd_trainer_step(tr, &s));
        if (i < warmup) continue;
        n++;
        sum += s.elapsed_s;
        acc[0] += s.pipe.compute_s;
        acc[1] += s.pipe.wait_s;
        acc[2 + ms->pp] += s.pipe.compute_s / (ms->tp_size * ms->dp_size);
    }
    TPD_CHECK(tpd_comm_allreduce(tpd_trainer_host_comms(tr)->world, acc, acc, 2 + (size_t)P,
                                 TPD_DTYPE_F64, TPD_COMM_OP_SUM, NULL));
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
    for (int s = 0; s < P && n > 0; s++)
        r.stage_compute_s[s] = acc[2 + s] / n;
    *r_p = r;
    return TPD_OK;
}
