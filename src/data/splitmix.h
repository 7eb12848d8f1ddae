/* splitmix.h: SplitMix64, the one generator behind the data layer's seeded
 * choices (the epoch's shuffles in dataset.c, the tokenizer's sample in
 * corpus_scan.c): a 64-bit state advanced by a constant, the output mixed. */
#ifndef TPTRAIN_SPLITMIX_H
#define TPTRAIN_SPLITMIX_H

#include <stdint.h>

static inline uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

#endif
