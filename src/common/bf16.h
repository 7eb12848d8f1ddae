/* bf16.h: fp32 <-> bfloat16 on the host, the project's one copy.
 *
 * A bf16 value is kept as its 16 raw bits (uint16_t): the upper half of the
 * fp32 with the same value. fp32 -> bf16 rounds to nearest, ties to even
 * (what CUDA's __float2bfloat16_rn does for finite values); overflow rounds
 * to infinity; a NaN stays a NaN (made quiet, so a payload that lived only
 * in the dropped bits cannot turn it into an infinity). bf16 -> fp32 is
 * exact. Header-only (static inline) so that hot loops inline it; in CUDA
 * code the same functions are host and device functions (the fused
 * attention's tile loops, kernels/cuda/attn_tile.h, store bf16 with them).
 */
#ifndef TPTRAIN_BF16_H
#define TPTRAIN_BF16_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define TP_BF16_FN __host__ __device__ __forceinline__
#else
#define TP_BF16_FN static inline
#endif

TP_BF16_FN uint16_t tp_f32_to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);  // NaN: keep sign, quiet
    u += 0x7fffu + ((u >> 16) & 1u);  // round half to even on the 16 dropped bits
    return (uint16_t)(u >> 16);
}

TP_BF16_FN float tp_bf16_to_f32(uint16_t b) {
    const uint32_t u = (uint32_t)b << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* x rounded to the nearest bf16, as an fp32. */
TP_BF16_FN float tp_bf16_round(float x) { return tp_bf16_to_f32(tp_f32_to_bf16(x)); }

#endif
