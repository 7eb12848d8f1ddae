/* bf16.h: bfloat16 as its 16 raw bits (the upper half of an fp32), with
 * round-to-nearest-even and NaN kept quiet: the conversion the GPU's
 * __float2bfloat16_rn does, so host emulation and device agree bit for bit. */
#ifndef TPTRAIN_BF16_H
#define TPTRAIN_BF16_H

#include <stdint.h>
#include <string.h>

static inline uint16_t bf16_from_f32(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return (uint16_t)((u >> 16) | 0x0040u);  // NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* x rounded to the nearest bf16 value, as an fp32. */
static inline float bf16_round(float x) { return bf16_to_f32(bf16_from_f32(x)); }

#endif
