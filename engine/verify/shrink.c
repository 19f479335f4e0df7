/* The rehearsal config of `tripod verify` (tiny widths, the real structure) and the check
 * that its ranks fit in this machine. */
#include <stdarg.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "engine/plan/plan.h"
#include "engine/verify/verify.h"

static tpd_status fail(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return TPD_ERR_INVALID;
}

static int round_up(int x, int unit) {
    return unit > 1 ? (x + unit - 1) / unit * unit : x;
}

/* Parameters one rank of a stage holds, roughly (embedding share included): for keeping
 * the number of DP buckets per stage. */
static double stage_params(const tpd_config *c) {
    int tp = c->parallel.tensor_model_parallel_size, pp = c->parallel.pipeline_model_parallel_size;
    return tpd_plan_params_count(c) / ((double)tp * pp);
}

tpd_status tpd_verify_shrink(const tpd_config *real, int dp, int steps, tpd_config *small,
                             char *err, size_t errlen) {
    const tpd_config_model *rm = &real->model;
    int tp = real->parallel.tensor_model_parallel_size;
    int pp = real->parallel.pipeline_model_parallel_size;
    if (dp < 1 || steps < 1 || tp < 1 || pp < 1 || rm->num_attention_heads < 1)
        return fail(err, errlen, "verify: cannot shrink a layout of DP %d for %d steps", dp, steps);
    tpd_config c = *real;
    tpd_config_model *m = &c.model;

    /* widths: the head count (and K/V groups) stay, so every head split over TP stays */
    int nh = rm->num_attention_heads, real_hs = rm->hidden_size / nh;
    int hs = 64 / nh;
    hs = hs < 2 ? 2 : hs + (hs & 1);
    if (hs > real_hs && real_hs >= 2) hs = real_hs - (real_hs & 1);
    m->hidden_size = nh * hs;
    /* heads of another size than hidden_size / heads (kv_channels) keep their ratio to it,
     * even and at least 2 */
    if (rm->kv_channels > 0 && rm->kv_channels * nh != rm->hidden_size) {
        int kv = (int)((double)hs * rm->kv_channels * nh / rm->hidden_size + 0.5);
        kv += kv & 1;
        m->kv_channels = kv < 2 ? 2 : kv;
    } else {
        m->kv_channels = 0;
    }
    int real_f = rm->ffn_hidden_size;
    int f = round_up(m->hidden_size / 2 > 8 ? m->hidden_size / 2 : 8, tp);
    m->ffn_hidden_size = f < real_f ? f : round_up(real_f, tp);
    /* the mixture of experts: the experts and routing stay, their widths shrink alike */
    if (rm->num_moe_experts > 0) {
        int real_fe = tpd_config_moe_ffn(real), real_fs = rm->moe_shared_expert_intermediate_size;
        m->moe_ffn_hidden_size = f < real_fe ? f : round_up(real_fe, tp);
        if (real_fs > 0)
            m->moe_shared_expert_intermediate_size = f < real_fs ? f : round_up(real_fs, tp);
    }
    /* vocabulary: the real one's remainder against the padding unit, so the padded rows
     * (and their absence) stay */
    int unit = m->make_vocab_size_divisible_by * tp;
    int rem = rm->vocab_size % unit;
    int vocab = rem == 0 ? round_up(64, unit) : (rem >= 16 ? rem : rem + unit);
    m->vocab_size = vocab < rm->vocab_size ? vocab : rm->vocab_size;
    /* sequence: 8, a multiple of TP under sequence parallelism, and under context
     * parallelism of 2 x CP chunks (each CP rank's share a multiple of TP under SP): the
     * same split of the sequence */
    int cp = tpd_config_cp(&c), unit_seq = c.parallel.sequence_parallel ? tp : 1;
    if (cp > 1) unit_seq *= 2 * cp;
    int seq = round_up(8, unit_seq);
    m->seq_length = seq < rm->seq_length ? seq : rm->seq_length;
    m->max_position_embeddings = m->seq_length;

    /* the layout; every structural key of parallel.* stays */
    c.parallel.data_parallel_size = dp;
    /* EP splits DP: at a smaller DP the rehearsal keeps the largest EP that divides both
     * (the experts, their all-to-alls and the expert-DP reduction run as at the real EP) */
    int ep = tpd_config_ep(&c);
    while (ep > 1 && dp % ep)
        ep--;
    while (ep > 1 && tpd_config_ep(real) % ep)
        ep--;
    if (rm->num_moe_experts > 0) c.parallel.expert_model_parallel_size = ep;
    int M = pp > 2 ? pp : 2;
    c.training.global_batch_size = c.training.micro_batch_size * dp * M;
    /* as many DP buckets per stage as the real model has */
    double real_buckets = stage_params(real) / (double)real->parallel.ddp_bucket_size;
    if (real_buckets < 1) real_buckets = 1;
    double b = stage_params(&c) / real_buckets;
    c.parallel.ddp_bucket_size = b < 64 ? 64 : (int64_t)b;

    /* cpu, fp32, short: the run itself */
    c.training.train_iters = steps + 1;
    c.training.precision = TPD_PRECISION_FP32;
    c.training.device = TPD_DEVICE_CPU;
    c.training.num_threads = 1;
    c.training.exit_interval = 0;
    c.training.exit_duration_in_mins = 0;
    c.optimizer.lr_decay_style = TPD_LR_DECAY_CONSTANT; /* no warmup: every step moves */
    c.optimizer.lr_warmup_iters = 0;
    c.optimizer.lr_decay_iters = 0;
    c.optimizer.lr_wsd_decay_iters = 0;
    /* The key bias gets no gradient in exact arithmetic (softmax ignores it): Adam's first
     * steps turn its rounding noise, which differs between layouts, into steps of about
     * lr x noise / eps. At eps 1e-6 those stay far below the parameter tolerance, while the
     * gradients that carry signal are orders of magnitude above eps. */
    if (c.optimizer.adam_eps < 1e-6) c.optimizer.adam_eps = 1e-6;
    c.data.data_path[0] = 0;
    snprintf(c.data.split, sizeof c.data.split, "1,0,0");
    c.logging.log_interval = 1000000;
    c.logging.metrics_file[0] = 0;
    c.logging.eval_interval = 0;
    c.logging.trace_file[0] = 0;
    c.logging.log_params_norm = 1;
    c.logging.log_timers = 0;
    c.checkpoint.save[0] = 0;
    c.checkpoint.load[0] = 0;
    c.checkpoint.save_interval = 0;
    c.checkpoint.keep_last = 0;
    c.checkpoint.async_save = 0;
    c.checkpoint.finetune = 0;
    *small = c;
    return TPD_OK;
}

/* MemAvailable of /proc/meminfo, bytes; 0 when unknown */
static double mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    double kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lf kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb * 1024.0;
}

/* this process's resident bytes: what each rank costs before its model */
static double resident_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    double size = 0, rss = 0;
    if (f) {
        if (fscanf(f, "%lf %lf", &size, &rss) != 2) rss = 0;
        fclose(f);
    }
    return rss * (double)sysconf(_SC_PAGESIZE);
}

static double gib(double b) {
    return b / (1024.0 * 1024.0 * 1024.0);
}

tpd_status tpd_verify_check_machine(const tpd_config *small, int ranks, int world, char *err,
                                    size_t errlen) {
    int tp = small->parallel.tensor_model_parallel_size;
    int pp = small->parallel.pipeline_model_parallel_size, cp = tpd_config_cp(small);
    int dp = ranks / (tp * pp * cp), copy = tp * pp * cp; /* the ranks of one model copy */
    char lay_s[64];
    snprintf(lay_s, sizeof lay_s, "TP %d x PP %d x DP %d", tp, pp, dp);
    if (cp > 1) snprintf(lay_s + strlen(lay_s), sizeof lay_s - strlen(lay_s), " x CP %d", cp);
    if (tpd_config_ep(small) > 1)
        snprintf(lay_s + strlen(lay_s), sizeof lay_s - strlen(lay_s), " (EP %d)",
                 tpd_config_ep(small));
    /* the planner's bytes of the largest rank of the layout, and of the one-rank run */
    tpd_plan_layout lay, one;
    tpd_plan_layout_from_config(small, ranks, &lay);
    double per_rank = 0;
    for (int s = 0; s < pp; s++) {
        tpd_plan_stage_mem mem;
        TPD_CHECK(tpd_plan_cpu_memory(small, &lay, s, &mem));
        if (mem.total > per_rank) per_rank = mem.total;
    }
    const tpd_config_layout one_rank = TPD_CONFIG_LAYOUT_INIT; /* as verify runs it */
    tpd_config c1;
    tpd_config_relayout(small, &one_rank, &c1);
    tpd_plan_layout_from_config(&c1, 1, &one);
    tpd_plan_stage_mem ref;
    TPD_CHECK(tpd_plan_cpu_memory(&c1, &one, 0, &ref));
    /* rank 0 also holds a few global copies of the parameters to compare */
    double copies = 6.0 * 4.0 * tpd_plan_params_count(small);
    double rss = resident_bytes();
    double need = ranks * (rss + per_rank) + ref.total + copies;
    double avail = mem_available() + world * rss; /* the launched ranks are already in */
    if (avail > 0 && need > avail)
        return fail(err, errlen,
                    "verify: the layout %s needs %d ranks, about %d x "
                    "(%.0f MiB per process + %.1f MiB of model) + %.1f MiB for the one-rank run "
                    "= %.2f GiB, and this machine has %.2f GiB available: pass --ranks N (a "
                    "multiple of TP x PP%s = %d) to shrink DP",
                    lay_s, ranks, ranks, rss / 1048576.0, per_rank / 1048576.0,
                    (ref.total + copies) / 1048576.0, gib(need), gib(avail), cp > 1 ? " x CP" : "",
                    copy);
    if (ranks > world)
        return fail(err, errlen,
                    "verify: the layout %s needs %d ranks and this job has "
                    "%d: launch it with mpirun -np %d, or pass --ranks N (a multiple of TP x PP%s "
                    "= %d) to shrink DP",
                    lay_s, ranks, world, ranks, cp > 1 ? " x CP" : "", copy);
    return TPD_OK;
}
