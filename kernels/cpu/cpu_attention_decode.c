/* One new position over a key/value cache (decoding), grouped-query: each query head's
 * scores against the len cached keys of its K/V head, the softmax, and the weighted sum of
 * the cached values. The arithmetic follows the position's row of attention_fwd
 * (cpu_attention.c): fp32 dot products scaled after the sum, the max subtracted, expf, the
 * normalizer summed in double and applied as one fp32 reciprocal, fp32 sums of p * V. The
 * heads are independent and own their columns of out, so the parallel loop is over them. */
#include "kernels/cpu/cpu_internal.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>

tpd_status tpd_kern_cpu_attention_decode(tpd_kern_ctx *ctx, void *out_v, const void *q_v,
                                         const void *kcache_v, const void *vcache_v, int len,
                                         int NH, int NKV, int HS) {
    TPD_CPU_REQUIRE(len >= 1 && NH > 0 && NKV > 0 && HS > 0 && NH % NKV == 0,
                    "attention_decode: bad shape len=%d NH=%d NKV=%d HS=%d (NKV must divide NH)",
                    len, NH, NKV, HS);
    float *out = out_v;             /* (NH*HS) */
    const float *q = q_v;           /* (NH*HS) */
    const float *kcache = kcache_v; /* (len, NKV*HS) */
    const float *vcache = vcache_v; /* (len, NKV*HS) */
    const size_t KV = (size_t)NKV * HS;
    const float scale = (float)(1.0 / sqrt((double)HS));
    const int G = NH / NKV; /* query heads per K/V head */
    int nt = tpd_kern_cpu_threads(ctx);
    if (nt > NH) nt = NH;
    float *p = malloc((size_t)NH * len * sizeof *p); /* (NH, len) probabilities */
    if (p == NULL) {
        tpd_log_error("attention_decode: out of memory for %zu bytes of scores",
                      (size_t)NH * len * sizeof *p);
        return TPD_ERR_NOMEM;
    }

#pragma omp parallel for num_threads(nt) schedule(static)
    for (int h = 0; h < NH; h++) {
        const float *qh = q + (size_t)h * HS;
        const float *k = kcache + (size_t)(h / G) * HS, *v = vcache + (size_t)(h / G) * HS;
        float *ph = p + (size_t)h * len, *o = out + (size_t)h * HS;
        float mx = -INFINITY;
        for (int t = 0; t < len; t++) {
            const float *kt = k + (size_t)t * KV;
            float dot = 0.0f;
            for (int i = 0; i < HS; i++)
                dot += qh[i] * kt[i];
            ph[t] = scale * dot;
            mx = ph[t] > mx ? ph[t] : mx;
        }
        double sum = 0.0;
        for (int t = 0; t < len; t++) {
            ph[t] = expf(ph[t] - mx);
            sum += ph[t];
        }
        float inv = (float)(1.0 / sum);
        for (int i = 0; i < HS; i++)
            o[i] = 0.0f;
        for (int t = 0; t < len; t++) {
            const float *vt = v + (size_t)t * KV;
            float w = ph[t] * inv;
            for (int i = 0; i < HS; i++)
                o[i] += w * vt[i];
        }
    }
    free(p);
    return TPD_OK;
}
