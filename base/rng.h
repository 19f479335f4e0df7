/* Counter-based random numbers.
 *
 * A value depends only on (seed, stream, index), never on how many values were drawn
 * before it. So a parameter element gets the same initial value on every parallel layout
 * (each rank draws only its own shard), and the data order of sample g depends only on
 * (seed, g). The mixer is SplitMix64's finalizer applied to a combined key. */
#ifndef TPD_BASE_RNG_H
#define TPD_BASE_RNG_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 64 well-mixed bits for (seed, stream, index). */
uint64_t tpd_rng_bits(uint64_t seed, uint64_t stream, uint64_t index);

/* Uniform in [0, 1) with 53 bits. */
double tpd_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index);

/* Standard normal (Box-Muller on two derived uniforms). */
double tpd_rng_normal(uint64_t seed, uint64_t stream, uint64_t index);

/* Uniform integer in [0, n) (n > 0), by 128-bit multiply (Lemire), unbiased enough for
 * n << 2^64. */
uint64_t tpd_rng_below(uint64_t seed, uint64_t stream, uint64_t index, uint64_t n);

#ifdef __cplusplus
}
#endif
#endif
