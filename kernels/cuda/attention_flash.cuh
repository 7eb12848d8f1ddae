// attention_flash.cuh: what the two CUDA implementations of ops_list.h's
// attention_flash_fwd / attention_flash_bwd share: their arguments, the
// contract's key mask, and the short-sequence kernels' entry points
// (attention_short.cu), which attention_flash.cu's op entry points try
// before its own tiled kernels. Private to kernels/cuda (CUDA C++ only).
#ifndef TPTRAIN_ATTENTION_FLASH_CUH
#define TPTRAIN_ATTENTION_FLASH_CUH

#include <stdint.h>

#include "cuda_common.h"

struct FlashArgs {
    const uint16_t *q, *k, *v;  // bf16 bits, (B, T, H*D)
    const int32_t *k_len;       // (B)
    int B, H, Tq, Tk;
    bool causal;
    float scale;                // 1/sqrt(D)
};

// Keys query row i may see: the first min(k_len, Tk), and (causal) at most
// i + 1 of them (ops_list.h's attention_fwd masks).
__device__ __forceinline__ int flash_valid_keys(int k_len, int i, int Tk, bool causal) {
    int n = k_len < Tk ? k_len : Tk;
    if (causal && n > i + 1) n = i + 1;
    return n < 0 ? 0 : n;
}

// The short-sequence kernels (attention_short.cu): each returns false,
// having launched nothing, where the shape or the device is not theirs
// (a sequence longer than CUDA_FLASH_SHORT_MAX_T, a head width other than 16,
// 32, 64 or 128, operands not 4-byte aligned, or more shared memory than
// the device grants); the caller then runs the tiled kernels. Tq, Tk > 0.
bool flash_short_fwd(const FlashArgs &a, int D, uint16_t *out16, float *lse, cudaStream_t stream);
bool flash_short_bwd(const FlashArgs &a, int D, float *dq, float *dk, float *dv, bool add, const float *dout,
                     const float *lse, float *delta, cudaStream_t stream);

#endif
