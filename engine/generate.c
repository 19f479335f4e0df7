#include "engine/generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "engine/checkpoint_internal.h"
#include "engine/data.h"

/* rng stream of the sampling draws (the init and data streams use others) */
#define GEN_RNG_STREAM 777

static int cmp_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

int tpd_generate_sample(const float *logits, int n, double temperature, int top_k, double u) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    if (temperature <= 0 || n < 2) return best;
    /* top-k: keep the logits >= the k-th largest */
    float cut = -INFINITY;
    if (top_k > 0 && top_k < n) {
        float *s = malloc((size_t)n * sizeof *s);
        if (!s) return best;
        memcpy(s, logits, (size_t)n * sizeof *s);
        qsort(s, (size_t)n, sizeof *s, cmp_desc);
        cut = s[top_k - 1];
        free(s);
    }
    double max = logits[best], total = 0;
    for (int i = 0; i < n; i++)
        if (logits[i] >= cut) total += exp((logits[i] - max) / temperature);
    double target = u * total, acc = 0;
    int last = best;
    for (int i = 0; i < n; i++) {
        if (logits[i] < cut) continue;
        acc += exp((logits[i] - max) / temperature);
        last = i;
        if (acc > target) return i;
    }
    return last;
}

tpd_status tpd_generate(const char *checkpoint, const tpd_gen_opts *o, int32_t **tokens_p,
                        size_t *n_p) {
    tpd_ckpt_info info;
    TPD_CHECK(tpd_ckpt_open(checkpoint, &info));
    tpd_config cfg = info.cfg;
    tpd_status st = TPD_OK;
    tpd_kern_backend kb;
    tpd_model *m = NULL;
    tpd_dp_plan dpp;
    int have_kb = 0, have_dpp = 0;
    int32_t *out = NULL, *ctx = NULL, *batch = NULL;
    float *row = NULL;
    int V = cfg.model.vocab_size;
    if (V < 256)
        TPD_CKPT_FAIL_GOTO(TPD_ERR_UNSUPPORTED, st, done,
                      "generate %s: vocab_size %d is not byte-level (needs 256 bytes)",
                      info.dir, V);
    cfg.training.micro_batch_size = 1;
    cfg.training.global_batch_size = 1;
    cfg.parallel.tensor_model_parallel_size = 1;
    cfg.parallel.pipeline_model_parallel_size = 1;
    cfg.parallel.use_distributed_optimizer = 0;
    if (cfg.model.seq_length > cfg.model.max_position_embeddings)
        cfg.model.seq_length = cfg.model.max_position_embeddings;
    tpd_kern_config kc = TPD_KERN_CONFIG_INIT;
    kc.num_threads = o->num_threads;
    TPD_CHECK_GOTO(tpd_kern_cpu_create(&kc, &kb), st, done);
    have_kb = 1;
    TPD_CHECK_GOTO(tpd_model_create(&cfg, &kb, NULL, 1, 0, 1, 1, 0, &m), st, done);
    TPD_CHECK_GOTO(tpd_dp_plan_init(m->plan.lay.numel, (size_t)cfg.parallel.ddp_bucket_size, 1, 0,
                                    0, &dpp),
                   st, done);
    have_dpp = 1;
    TPD_CHECK_GOTO(tpd_ckpt_load_model(&info, m, &dpp), st, done);

    int T = m->d.T, Vl = m->d.Vl;
    size_t plen = strlen(o->prompt), cap = plen + (size_t)o->max_new_tokens + 1;
    ctx = malloc(cap * sizeof *ctx);
    out = malloc(((size_t)o->max_new_tokens + 1) * sizeof *out);
    batch = calloc((size_t)T + 1, sizeof *batch);
    row = malloc((size_t)Vl * sizeof *row);
    if (!ctx || !out || !batch || !row)
        TPD_CKPT_FAIL_GOTO(TPD_ERR_NOMEM, st, done, "generate: out of memory");
    size_t n = 0, made = 0;
    for (size_t i = 0; i < plen; i++) ctx[n++] = (unsigned char)o->prompt[i];
    if (n == 0) ctx[n++] = V > TPD_BYTE_EOD ? TPD_BYTE_EOD : 0;
    for (int step = 0; step < o->max_new_tokens; step++) {
        /* the window: the last T tokens; causal attention ignores what follows them */
        size_t w0 = n > (size_t)T ? n - (size_t)T : 0, len = n - w0;
        memset(batch, 0, ((size_t)T + 1) * sizeof *batch);
        memcpy(batch, ctx + w0, len * sizeof *batch);
        TPD_CHECK_GOTO(tpd_model_set_batch(m, 0, batch), st, done);
        TPD_CHECK_GOTO(tpd_model_forward(m, 0), st, done);
        const char *logits = m->acts + m->plan.s_logits + (len - 1) * (size_t)Vl * m->plan.act_size;
        TPD_CHECK_GOTO(kb.ops->copy_to_host(kb.ctx, row, logits, (size_t)Vl * 4), st, done);
        int tok = tpd_generate_sample(row, V, o->temperature, o->top_k,
                                      tpd_rng_uniform(o->seed, GEN_RNG_STREAM, (uint64_t)step));
        ctx[n++] = tok;
        out[made++] = tok;
    }
    *tokens_p = out;
    *n_p = made;
    out = NULL;
done:
    free(row);
    free(batch);
    free(ctx);
    free(out);
    if (have_dpp) tpd_dp_plan_free(&dpp);
    tpd_model_destroy(m);
    if (have_kb) tpd_kern_backend_destroy(&kb);
    tpd_ckpt_close(&info);
    return st;
}
