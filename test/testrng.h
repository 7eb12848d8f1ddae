/* testrng.h: the tests' random numbers (splitmix64): fixed seeds, the same
 * sequence on every machine, nothing shared between tests. */
#ifndef TPTRAIN_TEST_TESTRNG_H
#define TPTRAIN_TEST_TESTRNG_H
#include <stddef.h>
#include <stdint.h>
#include "err.h"

typedef struct {
    uint64_t state;
} Rng;

static inline uint64_t rng_next(Rng *r) {
    uint64_t z = (r->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [lo, hi) with 24 random bits. */
static inline float rng_uniform(Rng *r, float lo, float hi) {
    return lo + (hi - lo) * (float)((rng_next(r) >> 40) * 0x1p-24);
}

/* n uniform floats in [lo, hi) (caller frees). */
static inline float *rand_floats(size_t n, Rng *r, float lo, float hi) {
    float *x = (float *)TP_MALLOC((n ? n : 1) * sizeof(float));  // a cast, for the C++ tests
    for (size_t i = 0; i < n; i++) x[i] = rng_uniform(r, lo, hi);
    return x;
}
#endif
