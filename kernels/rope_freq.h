/* Rotary embedding frequencies, one definition for the host and the device.
 *
 * Pair i of a head of size HS rotates by theta_i = p * inv_freq_i at position p, with
 * inv_freq_i = base^(-2i/HS). Llama 3.1's "llama3" scaling (factor > 0) stretches the long
 * wavelengths lambda_i = 2 pi / inv_freq_i of a model trained on `original` positions:
 *   lambda_i < original / high_freq_factor:  unchanged (high frequencies);
 *   lambda_i > original / low_freq_factor:   inv_freq_i / factor;
 *   in between: (1 - s) inv_freq_i / factor + s inv_freq_i,
 *               s = (original / lambda_i - low_freq_factor) / (high - low),
 * as transformers' _compute_llama3_parameters computes it. In double. */
#ifndef TPD_KERNELS_ROPE_FREQ_H
#define TPD_KERNELS_ROPE_FREQ_H

#include <math.h>

#ifdef __CUDACC__
#define TPD_ROPE_HD __host__ __device__
#else
#define TPD_ROPE_HD
#endif

typedef struct tpd_rope {
    double base;
    double factor; /* llama3 scaling; 0: none */
    double low_freq_factor, high_freq_factor;
    double original_max_positions;
} tpd_rope;

static inline TPD_ROPE_HD double tpd_rope_inv_freq(const tpd_rope *r, int i, int HS) {
    double inv = pow(r->base, -2.0 * (double)i / (double)HS);
    if (!(r->factor > 0)) return inv;
    double wavelen = 2.0 * 3.14159265358979323846 / inv;
    double low_wavelen = r->original_max_positions / r->low_freq_factor;
    double high_wavelen = r->original_max_positions / r->high_freq_factor;
    if (wavelen < high_wavelen) return inv;
    if (wavelen > low_wavelen) return inv / r->factor;
    double s = (r->original_max_positions / wavelen - r->low_freq_factor) /
               (r->high_freq_factor - r->low_freq_factor);
    return (1.0 - s) * inv / r->factor + s * inv;
}

#endif
