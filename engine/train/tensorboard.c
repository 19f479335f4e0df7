/* TensorBoard event files: protobuf-c events in TFRecord framing. */
#include "engine/train/tensorboard.h"

#include <errno.h>
#include <isa-l/crc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/file.h"
#include "tb_event.pb-c.h"

#define TB_MAX_SCALARS 32

struct tpd_tb_writer {
    FILE *f;
    char path[4096];
};

uint32_t tpd_tb_masked_crc(const void *data, size_t n) {
    /* crc32_iscsi takes and returns the register without the final inversion */
    uint32_t crc = ~crc32_iscsi((unsigned char *)data, (int)n, 0xFFFFFFFFu);
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

static tpd_status put_record(tpd_tb_writer *w, const uint8_t *data, size_t n) {
    uint8_t head[12];
    uint64_t len = n;
    for (int i = 0; i < 8; i++)
        head[i] = (uint8_t)(len >> (8 * i));
    uint32_t lc = tpd_tb_masked_crc(head, 8), dc = tpd_tb_masked_crc(data, n);
    for (int i = 0; i < 4; i++)
        head[8 + i] = (uint8_t)(lc >> (8 * i));
    uint8_t tail[4];
    for (int i = 0; i < 4; i++)
        tail[i] = (uint8_t)(dc >> (8 * i));
    if (fwrite(head, 1, 12, w->f) != 12 || fwrite(data, 1, n, w->f) != n ||
        fwrite(tail, 1, 4, w->f) != 4 || fflush(w->f) != 0) {
        tpd_log_error("logging.tensorboard_dir: writing '%s' failed: %s", w->path, strerror(errno));
        return TPD_ERR_IO;
    }
    return TPD_OK;
}

static tpd_status put_event(tpd_tb_writer *w, const TpdTb__Event *ev) {
    size_t n = tpd_tb__event__get_packed_size(ev);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) return tpd_fail_nomem("a TensorBoard event", n ? n : 1);
    tpd_tb__event__pack(ev, buf);
    tpd_status st = put_record(w, buf, n);
    free(buf);
    return st;
}

static double wall_time(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

tpd_status tpd_tb_open(const char *dir, tpd_tb_writer **w_p) {
    int e = 0;
    if (tpd_file_mkdirs(dir, &e) != TPD_OK) {
        tpd_log_error("logging.tensorboard_dir: cannot create '%s': %s", dir, strerror(e));
        return TPD_ERR_IO;
    }
    tpd_tb_writer *w = calloc(1, sizeof *w);
    if (!w) return tpd_fail_nomem("the TensorBoard writer", sizeof *w);
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    double now = wall_time();
    snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%lld.%s.%d", dir, (long long)now,
             host, (int)getpid());
    w->f = fopen(w->path, "wbx"); /* never another run's file */
    if (!w->f) {
        tpd_log_error("logging.tensorboard_dir: cannot create '%s': %s", w->path, strerror(errno));
        free(w);
        return TPD_ERR_IO;
    }
    TpdTb__Event ev = TPD_TB__EVENT__INIT;
    ev.wall_time = now;
    ev.file_version = "brain.Event:2";
    tpd_status st = put_event(w, &ev);
    if (st != TPD_OK) {
        tpd_tb_close(w);
        return st;
    }
    *w_p = w;
    return TPD_OK;
}

const char *tpd_tb_path(const tpd_tb_writer *w) {
    return w->path;
}

tpd_status tpd_tb_scalars(tpd_tb_writer *w, int64_t step, int n, const char *const *tags,
                          const double *values) {
    if (n > TB_MAX_SCALARS) return TPD_ERR_INVALID;
    TpdTb__SummaryValue vals[TB_MAX_SCALARS], *ptrs[TB_MAX_SCALARS];
    for (int i = 0; i < n; i++) {
        tpd_tb__summary_value__init(&vals[i]);
        vals[i].tag = (char *)tags[i];
        vals[i].value_case = TPD_TB__SUMMARY_VALUE__VALUE_SIMPLE_VALUE;
        vals[i].simple_value = (float)values[i];
        ptrs[i] = &vals[i];
    }
    TpdTb__Summary sum = TPD_TB__SUMMARY__INIT;
    sum.n_value = (size_t)n;
    sum.value = ptrs;
    TpdTb__Event ev = TPD_TB__EVENT__INIT;
    ev.wall_time = wall_time();
    ev.step = step;
    ev.summary = &sum;
    return put_event(w, &ev);
}

tpd_status tpd_tb_record(tpd_tb_writer *w, const tpd_iter_record *r, const tpd_step_timers *t) {
    const char *tags[TB_MAX_SCALARS];
    double v[TB_MAX_SCALARS];
    int n = 0;
#define TB_ADD(tag, value)                                                                         \
    do {                                                                                           \
        tags[n] = (tag);                                                                           \
        v[n++] = (value);                                                                          \
    } while (0)
    /* Megatron's tags where it has them */
    TB_ADD("lm loss", r->lm_loss);
    TB_ADD("learning-rate", r->lr);
    TB_ADD("grad-norm", r->grad_norm);
    if (r->has_params_norm) TB_ADD("params-norm", r->params_norm);
    if (!isnan(r->val_loss)) TB_ADD("lm loss validation", r->val_loss);
    TB_ADD("skipped-iterations", r->skipped_iterations);
    TB_ADD("consumed-samples", (double)r->consumed_samples);
    TB_ADD("iteration-time-ms", r->elapsed_ms);
    TB_ADD("throughput/tokens-per-s", r->tokens_per_s);
    TB_ADD("throughput/tflops-per-gpu", r->tflops_per_gpu);
    if (r->mfu >= 0) TB_ADD("throughput/mfu", r->mfu);
    if (t) {
        TB_ADD("timers/forward-backward-compute-ms", t->compute_ms);
        TB_ADD("timers/tp-comm-ms", t->tp_comm_ms);
        TB_ADD("timers/pipeline-wait-ms", t->pp_wait_ms);
        TB_ADD("timers/pipeline-idle-fraction", t->idle_fraction);
        TB_ADD("timers/grads-reduce-exposed-ms", t->reduce_ms);
        TB_ADD("timers/params-gather-wait-ms", t->param_wait_ms);
        TB_ADD("timers/optimizer-ms", t->optimizer_ms);
    }
#undef TB_ADD
    return tpd_tb_scalars(w, r->iteration, n, tags, v);
}

void tpd_tb_close(tpd_tb_writer *w) {
    if (!w) return;
    if (w->f) fclose(w->f);
    free(w);
}
