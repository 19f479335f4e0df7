#include "base/rng.h"

#include <math.h>

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint64_t tpd_rng_bits(uint64_t seed, uint64_t stream, uint64_t index) {
    uint64_t k = mix64(seed + 0x9e3779b97f4a7c15ULL);
    k = mix64(k ^ (stream * 0xd1342543de82ef95ULL + 0x632be59bd9b4e019ULL));
    return mix64(k ^ (index + 0x9e3779b97f4a7c15ULL * (index >> 32 | 1)));
}

double tpd_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
    return (double)(tpd_rng_bits(seed, stream, index) >> 11) * (1.0 / 9007199254740992.0);
}

double tpd_rng_normal(uint64_t seed, uint64_t stream, uint64_t index) {
    uint64_t a = tpd_rng_bits(seed, stream, 2 * index);
    uint64_t b = tpd_rng_bits(seed, stream, 2 * index + 1);
    double u1 = ((double)(a >> 11) + 0.5) * (1.0 / 9007199254740992.0); /* (0,1) */
    double u2 = (double)(b >> 11) * (1.0 / 9007199254740992.0);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

uint64_t tpd_rng_below(uint64_t seed, uint64_t stream, uint64_t index, uint64_t n) {
    unsigned __int128 p = (unsigned __int128)tpd_rng_bits(seed, stream, index) * n;
    return (uint64_t)(p >> 64);
}
