// attention_flash.cuh: the short-sequence kernels' entry points
// (attention_short.cu), which attention_flash.cu's op entry points try
// before its own tiled kernels; what the two share besides is flash_core.h.
// Private to kernels/cuda (CUDA C++ only).
#ifndef TPTRAIN_ATTENTION_FLASH_CUH
#define TPTRAIN_ATTENTION_FLASH_CUH

#include <stdint.h>

#include "cuda_common.h"
#include "flash_core.h"  // FlashArgs, flash_valid_keys

// The short-sequence kernels (attention_short.cu): each returns false,
// having launched nothing, where the shape or the device is not theirs
// (a sequence longer than CUDA_FLASH_SHORT_MAX_T, a head width other than
// 16, 32, 64 or 128, operands not 4-byte aligned, or more shared memory than
// the device grants); the caller then runs the tiled kernels. Tq, Tk > 0.
bool flash_short_fwd(const FlashArgs &a, int D, uint16_t *out16, float *lse, cudaStream_t stream);
// g16: dq16, dk16, dv16 (each NULL, or all given: then dq, dk, dv are NULL).
bool flash_short_bwd(const FlashArgs &a, int D, float *dq, float *dk, float *dv, uint16_t *const g16[3], bool add,
                     const float *dout, const float *lse, float *delta, cudaStream_t stream);

#endif
