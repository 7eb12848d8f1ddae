/* philox.h: Philox4x32-10 (Salmon et al., Random123) as one inline function
 * for host and device, so the CPU reference (kernels/cpu/dropout.c) and the
 * CUDA dropout kernel draw from the same code and give bit-identical masks.
 * Header-only, no state; compiles as C and as CUDA.
 */
#ifndef TPTRAIN_PHILOX_H
#define TPTRAIN_PHILOX_H

#include <stdint.h>

#ifdef __CUDACC__
#define PHILOX_FN static __host__ __device__ __forceinline__
#else
#define PHILOX_FN static inline
#endif

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

/* 4 output words for counter ctr under key; ten rounds, the key bumped
 * before every round but the first. */
PHILOX_FN void philox4x32_10_inline(const uint32_t ctr[4], const uint32_t key[2],
                                       uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        if (round > 0) {
            k0 += PHILOX_W0;
            k1 += PHILOX_W1;
        }
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* The dropout mask, one definition for the CPU reference and every CUDA
 * kernel that drops: block b (elements 4b..4b+3) of the (seed, stream)
 * mask is Philox of counter {b lo, b hi, stream lo, stream hi} under key
 * {seed lo, seed hi}; an element keeps when (word >> 8) * 2^-24 (exact in
 * fp32) >= p, and a kept value is scaled by dropout_scale(p). */
PHILOX_FN void dropout_block_words(uint64_t block, const uint32_t key[2], uint32_t stream_lo, uint32_t stream_hi,
                                   uint32_t out[4]) {
    const uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), stream_lo, stream_hi};
    philox4x32_10_inline(ctr, key, out);
}
PHILOX_FN int dropout_keeps(uint32_t word, float p) { return (float)(word >> 8) * (1.0f / 16777216.0f) >= p; }
PHILOX_FN float dropout_scale(float p) { return p < 1.0f ? 1.0f / (1.0f - p) : 0.0f; }

#endif
