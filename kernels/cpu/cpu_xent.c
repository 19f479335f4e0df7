/* Softmax cross-entropy in vocab-parallel pieces (Megatron's vocab-parallel loss).
 *
 * logits(N,Vl) hold this rank's columns [v0, v0+Vl); the first Vvalid are real tokens and
 * the rest are padding that never enters the softmax. Between the pieces the caller
 * all-reduces maxv (MAX), then sumexp and tgt (SUM), so every rank ends with the global
 * softmax statistics without gathering the logits. The logits (and the gradient written
 * over them) are in the activation dtype; the statistics are fp32, the sums double. */
#include "kernels/cpu/cpu_internal.h"

#include <math.h>

static int xent_shape_ok(const char *op, int N, int Vl, int Vvalid) {
    if (N >= 0 && Vl >= 0 && Vvalid >= 0 && Vvalid <= Vl) return 1;
    tpd_log_error("%s: bad shape N=%d Vl=%d Vvalid=%d (need 0 <= Vvalid <= Vl)", op, N, Vl, Vvalid);
    return 0;
}

tpd_status tpd_kern_cpu_xent_max(tpd_kern_ctx *ctx, float *maxv, const void *logits_v, int N,
                                 int Vl, int Vvalid) {
    if (!xent_shape_ok("xent_max", N, Vl, Vvalid)) return TPD_ERR_INVALID;
    const int ab = ctx->act_bf16; /* logits (N,Vl) */
    int nt = tpd_kern_cpu_threads(ctx);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int n = 0; n < N; n++) {
        const size_t l = (size_t)n * Vl;
        float mx = -INFINITY;
        for (int j = 0; j < Vvalid; j++) {
            float x = tpd_cpu_ld(logits_v, l + j, ab);
            mx = x > mx ? x : mx;
        }
        maxv[n] = mx; /* (N) */
    }
    return TPD_OK;
}

/* sumexp(N) = sum_j exp(l_j - maxv) over valid columns (accumulated in double);
 * tgt(N) = the target's logit when this rank holds it, else 0, so the SUM all-reduce
 * yields the target logit exactly. */
tpd_status tpd_kern_cpu_xent_sumexp(tpd_kern_ctx *ctx, float *sumexp, float *tgt,
                                    const void *logits_v, const float *maxv, const int32_t *targets,
                                    int N, int Vl, int Vvalid, int v0) {
    if (!xent_shape_ok("xent_sumexp", N, Vl, Vvalid)) return TPD_ERR_INVALID;
    const int ab = ctx->act_bf16; /* logits (N,Vl) */
    int nt = tpd_kern_cpu_threads(ctx);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int n = 0; n < N; n++) {
        const size_t l = (size_t)n * Vl;
        float mx = maxv[n];
        double s = 0.0;
        for (int j = 0; j < Vvalid; j++)
            s += expf(tpd_cpu_ld(logits_v, l + j, ab) - mx);
        sumexp[n] = (float)s;
        int64_t col = (int64_t)targets[n] - v0;
        tgt[n] = (col >= 0 && col < Vvalid) ? tpd_cpu_ld(logits_v, l + (size_t)col, ab) : 0.0f;
    }
    return TPD_OK;
}

/* loss = -log softmax(target) = log(sum_j exp(l_j - max)) + max - l_target. */
tpd_status tpd_kern_cpu_xent_loss(tpd_kern_ctx *ctx, float *loss, const float *maxv,
                                  const float *sumexp, const float *tgt, int N) {
    TPD_CPU_REQUIRE(N >= 0, "xent_loss: bad N=%d", N);
    int nt = tpd_kern_cpu_threads(ctx);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int n = 0; n < N; n++)
        loss[n] = logf(sumexp[n]) + maxv[n] - tgt[n];
    return TPD_OK;
}

/* Backward of the line above with upstream gradient dloss per row:
 *   dl_j = (exp(l_j - max) / sumexp - [v0 + j == target]) * dloss,
 * written over the logits; padded columns get 0 since they never entered the softmax. */
tpd_status tpd_kern_cpu_xent_bwd(tpd_kern_ctx *ctx, void *logits_v, const float *maxv,
                                 const float *sumexp, const int32_t *targets, float dloss, int N,
                                 int Vl, int Vvalid, int v0) {
    if (!xent_shape_ok("xent_bwd", N, Vl, Vvalid)) return TPD_ERR_INVALID;
    const int ab = ctx->act_bf16; /* logits (N,Vl), in place */
    int nt = tpd_kern_cpu_threads(ctx);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int n = 0; n < N; n++) {
        const size_t l = (size_t)n * Vl;
        float mx = maxv[n];
        float inv = 1.0f / sumexp[n];
        int64_t col = (int64_t)targets[n] - v0;
        int has_target = col >= 0 && col < Vvalid;
        float lt = has_target ? tpd_cpu_ld(logits_v, l + (size_t)col, ab) : 0.0f;
        for (int j = 0; j < Vvalid; j++)
            tpd_cpu_st(logits_v, l + j, expf(tpd_cpu_ld(logits_v, l + j, ab) - mx) * inv * dloss,
                       ab);
        for (int j = Vvalid; j < Vl; j++)
            tpd_cpu_st(logits_v, l + j, 0.0f, ab);
        /* the target's element again from its logit read above, -dloss added before the one
         * rounding of a bf16 store (the same fp32 bits as subtracting after the loop) */
        if (has_target)
            tpd_cpu_st(logits_v, l + (size_t)col, expf(lt - mx) * inv * dloss - dloss, ab);
    }
    return TPD_OK;
}

tpd_status tpd_kern_cpu_sum_f32(tpd_kern_ctx *ctx, const float *x, size_t n, double *sum_p) {
    return tpd_kern_cpu_reduce(ctx, x, n, TPD_KERN_CPU_REDUCE_SUM_F32, sum_p);
}
