/* bf16 <-> fp32 on the host. bf16 is the top half of an fp32, so widening is exact;
 * narrowing rounds to nearest, ties to even (add 0x7fff plus the lowest kept bit, then
 * truncate), and keeps a NaN a NaN (quiet bit set) instead of rounding it into an
 * infinity. The one definition used by the cpu kernels, the host-side communicators and
 * the tests. IEEE fp16 widens exactly too (for reading fp16 safetensors). */
#ifndef TPD_BASE_BF16_H
#define TPD_BASE_BF16_H

#include <stdint.h>
#include <string.h>

static inline float tpd_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t tpd_bf16_from_f32(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    /* branch-free (a select), so that loops of conversions vectorize */
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t quiet = (u >> 16) | 0x0040u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

/* fp16 (1 sign, 5 exponent, 10 mantissa bits) -> fp32, exact: subnormals are normalised,
 * infinities and NaNs keep their class. */
static inline float tpd_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        u = sign | ((exp + 112u) << 23) | (man << 13); /* rebias 15 -> 127 */
    } else if (man == 0) {
        u = sign;
    } else { /* subnormal: shift the leading one into the implicit bit */
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400u));
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#endif
