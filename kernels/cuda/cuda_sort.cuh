/* The stable radix sort of (key, value) int32 pairs that the deterministic scatters share
 * (the embedding backward, the experts' scatter-add): keys in [0, max_key], the four arrays
 * and cub's temp in backend scratch as kernels/scratch.c plans them
 * (tpd_kern_embed_sort_array, tpd_kern_embed_sort_temp_bound), with `extra` bytes for the
 * caller after the arrays. Fill keys_in/vals_in, then tpd_cuda_sort_run. */
#ifndef TPD_KERNELS_CUDA_SORT_CUH
#define TPD_KERNELS_CUDA_SORT_CUH

#include "kernels/cuda/cuda_common.cuh"

#include <cub/cub.cuh>

typedef struct tpd_cuda_sort {
    int32_t *keys_in, *vals_in, *keys_out, *vals_out;
    void *extra, *temp;
    size_t temp_bytes;
    int N, end_bit;
} tpd_cuda_sort;

static inline tpd_status tpd_cuda_sort_begin(tpd_kern_ctx *ctx, const char *op, int N, int max_key,
                                             size_t extra, tpd_cuda_sort *s) {
    s->N = N;
    s->end_bit = 1; /* sort only the bits a key in [0, max_key] can set */
    while (s->end_bit < 31 && ((int64_t)1 << s->end_bit) <= (int64_t)max_key)
        s->end_bit++;
    s->temp_bytes = 0;
    TPD_CHECK(TPD_CUDA(cub::DeviceRadixSort::SortPairs(
        NULL, s->temp_bytes, (const int32_t *)NULL, (int32_t *)NULL, (const int32_t *)NULL,
        (int32_t *)NULL, N, 0, s->end_bit, ctx->stream)));
    /* cub's temp must fit the bound planned for it */
    size_t arr = tpd_kern_embed_sort_array(N), temp_bound = tpd_kern_embed_sort_temp_bound(N);
    if (s->temp_bytes > temp_bound) {
        tpd_log_warn("%s: cub's radix sort of N=%d wants %zu bytes of temp, the plan's bound is "
                     "%zu (kernels/scratch.c)",
                     op, N, s->temp_bytes, temp_bound);
        temp_bound = s->temp_bytes;
    }
    void *scratch = NULL;
    TPD_CHECK(tpd_cuda_scratch(ctx, 4 * arr + extra + temp_bound, &scratch));
    char *base = (char *)scratch;
    s->keys_in = (int32_t *)base;
    s->vals_in = (int32_t *)(base + arr);
    s->keys_out = (int32_t *)(base + 2 * arr);
    s->vals_out = (int32_t *)(base + 3 * arr);
    s->extra = base + 4 * arr;
    s->temp = base + 4 * arr + extra;
    return TPD_OK;
}

static inline tpd_status tpd_cuda_sort_run(tpd_kern_ctx *ctx, const tpd_cuda_sort *s) {
    size_t temp_bytes = s->temp_bytes;
    return TPD_CUDA(cub::DeviceRadixSort::SortPairs(s->temp, temp_bytes, s->keys_in, s->keys_out,
                                                    s->vals_in, s->vals_out, s->N, 0, s->end_bit,
                                                    ctx->stream));
}

#endif
