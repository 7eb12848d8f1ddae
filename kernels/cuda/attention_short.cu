// attention_short.cu: attention without the probabilities (ops_list.h's
// attention_flash_fwd / attention_flash_bwd) for the short sequences of
// translation: a sentence of 10 to 60 tokens, at most CUDA_FLASH_SHORT_MAX_T.
//
// Why a second implementation: the tiled kernels (attention_flash.cu) cut
// queries and keys into tiles of 32 and run each (batch, head, tile) as a
// block that stages every product through shared memory (wmma fragments
// stored as fp32 tiles, the softmax read back from there) in two passes over
// the keys. For a 20-token sentence most of each 32 x 32 tile is padding and
// the staging is most of the work. Here one block holds a (batch, head)
// pair's whole K and V in shared memory, each warp owns 16 query rows (or,
// in the backward's second phase, 16 keys), and everything between the
// products stays in registers:
//   - the products are mma.sync m16n8k16 (bf16 in, fp32 accumulate; sm_80
//     and newer, which the build targets): keys in steps of 8, so a 20-key
//     sentence costs 24 columns, not 32;
//   - a row's scores all sit in its warp's accumulators (at most
//     CUDA_FLASH_SHORT_MAX_T / 8 fragments of 4), so the softmax is exact, not
//     online: the true maximum, the sum, lse, then p = exp(z - lse) rounded
//     to bf16, which is the contract's p bit for bit up to the order of the
//     sum (the tiled kernels rescale a running sum);
//   - an accumulator fragment of two adjacent 8-key tiles is, element for
//     element, the A operand of the next product (p V, ds K, p^T dout,
//     ds^T q), so p and ds never leave the registers;
//   - the backward is one block per (batch, head), no atomics: phase 1 (a
//     warp per 16 queries) rebuilds p and dp, writes delta and dq; phase 2
//     (a warp per 16 keys) rebuilds p^T and dp^T from K Q^T and V dout^T
//     with phase 1's delta, and writes dk and dv. Every result is a
//     function of the shapes alone, run after run.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with .bf16): lane = 4 g + t;
// A (16 x 16, row major) in 4 registers of 2 bf16: rows g, g+8, g, g+8,
// columns 2t (+1), 2t, 2t + 8, 2t + 8; B (16 x 8) in 2: rows (k) 2t (+1)
// and 2t + 8 (+1), column g; C (16 x 8 fp32): rows g (c0, c1) and g + 8
// (c2, c3), columns 2t and 2t + 1. A register's lower 16 bits hold the
// element of the lower column (A) or row (B).
//
// Precision: the contract's roundings with tp_bf16_bits (nearest even):
// dout to bf16 as it is staged, p and ds before their products, out as it
// is stored; z = scale * s rounded alone (__fmul_rn); ds = (scale * p) *
// (dp - delta) as the reference writes it. What differs from the reference
// is the order of the fp32 sums (tensor cores, then the four lanes of a
// row in a fixed butterfly) and the device's expf / logf, as for the tiled
// kernels; the op test holds both to the same tolerances.
//
// Shared memory (bf16 rows padded to D + 8: 16-byte aligned rows, and the
// 32-bit fragment loads of 8 rows at 4 words each fall in 32 distinct
// banks): forward K and V, 2 Tk' (D + 8) * 2 bytes with Tk' = Tk rounded
// up to 16 (36,864 at Tk = 128, D = 64); backward Q, dout, K and V plus a
// row's lse and delta, 2 (Tq' + Tk') (D + 8) * 2 + 8 Tq' bytes (74,752 at
// 128 and 64; 140,288 at 128 and 128, which an H100 or H200 grants and a
// smaller device may not: then the tiled kernels run).
#include <cuda_bf16.h>

#include "cuda_ops.h"
#include "cuda_kernel_util.cuh"
#include "attention_flash.cuh"  // flash_core.h: the block and warp code

namespace {

template <int D, int C>
__global__ void __launch_bounds__(SC_THREADS) short_fwd_kernel(FlashArgs a, uint16_t *out16, float *lse) {
    extern __shared__ __align__(128) unsigned char smem[];
    for (int b = blockIdx.y; b < a.B; b += gridDim.y) short_fwd_block<D, C>(a, smem, b, blockIdx.x, out16, lse);
}

template <int D, int C>
__global__ void __launch_bounds__(SC_THREADS) short_bwd_kernel(FlashArgs a, const float *dout, const float *lse,
                                                               float *delta, FlashGrads gr, bool add) {
    extern __shared__ __align__(128) unsigned char smem[];
    for (int b = blockIdx.y; b < a.B; b += gridDim.y)
        short_bwd_block<D, C>(a, smem, b, blockIdx.x, dout, lse, delta, gr, add);
}

// ---- launchers --------------------------------------------------------------------------------

dim3 short_grid(const FlashArgs &a) { return dim3((unsigned)a.H, (unsigned)(a.B < 65535 ? a.B : 65535)); }

// Whether this shape, these operands and this device suit the kernels.
bool short_fits(const FlashArgs &a, int D, size_t smem, const void *const *ptrs, int n_ptrs) {
    if (a.Tq > CUDA_FLASH_SHORT_MAX_T || a.Tk > CUDA_FLASH_SHORT_MAX_T || a.Tq <= 0 || a.Tk <= 0) return false;
    if (D != 16 && D != 32 && D != 64 && D != 128) return false;
    for (int i = 0; i < n_ptrs; i++)
        if (((uintptr_t)ptrs[i] & 3) != 0) return false;
    const int limit = tp_smem_optin_limit();
    return limit > 0 && smem <= (size_t)limit;
}

template <int D, int C>
void fwd_launch(const FlashArgs &a, uint16_t *out16, float *lse, size_t smem, cudaStream_t stream) {
    tp_smem_optin(short_fwd_kernel<D, C>, smem, "op_attention_flash_fwd");
    short_fwd_kernel<D, C><<<short_grid(a), SC_THREADS, smem, stream>>>(a, out16, lse);
    CUDA_CHECK(cudaGetLastError());
}

template <int D, int C>
void bwd_launch(const FlashArgs &a, const FlashGrads &gr, bool add, const float *dout, const float *lse, float *delta,
                size_t smem, cudaStream_t stream) {
    tp_smem_optin(short_bwd_kernel<D, C>, smem, "op_attention_flash_bwd");
    short_bwd_kernel<D, C><<<short_grid(a), SC_THREADS, smem, stream>>>(a, dout, lse, delta, gr, add);
    CUDA_CHECK(cudaGetLastError());
}

// The instantiation for a head width and a longest sequence: registers for
// 64 keys (C = 4) where that suffices, else CUDA_FLASH_SHORT_MAX_T (C = 8).
static_assert(CUDA_FLASH_SHORT_MAX_T == 128, "C = 8 chunks of 16 cover the longest sequence");
#define SHORT_BY_SHAPE(D, T, CALL)                              \
    do {                                                        \
        const bool c4 = (T) <= 64;                              \
        switch (D) {                                            \
        case 16: c4 ? CALL(16, 4) : CALL(16, 8); break;         \
        case 32: c4 ? CALL(32, 4) : CALL(32, 8); break;         \
        case 64: c4 ? CALL(64, 4) : CALL(64, 8); break;         \
        default: c4 ? CALL(128, 4) : CALL(128, 8); break;       \
        }                                                       \
    } while (0)

}  // namespace

bool flash_short_fwd(const FlashArgs &a, int D, uint16_t *out16, float *lse, cudaStream_t stream) {
    const size_t smem = fwd_smem(D, a.Tk);
    const void *ptrs[] = {a.q, out16};  // fragments read and stored 32 bits at a time
    if (!short_fits(a, D, smem, ptrs, 2)) return false;
#define SHORT_FWD(DD, CC) fwd_launch<DD, CC>(a, out16, lse, smem, stream)
    SHORT_BY_SHAPE(D, a.Tk, SHORT_FWD);
#undef SHORT_FWD
    return true;
}

bool flash_short_bwd(const FlashArgs &a, int D, float *dq, float *dk, float *dv, uint16_t *const g16[3], bool add,
                     const float *dout, const float *lse, float *delta, cudaStream_t stream) {
    const size_t smem = bwd_smem(D, a.Tq, a.Tk);
    const void *ptrs[] = {g16[0], g16[1], g16[2]};  // bf16 pairs stored 32 bits at a time (NULL passes)
    if (!short_fits(a, D, smem, ptrs, 3)) return false;
    const FlashGrads gr = {dq, dk, dv, g16[0], g16[1], g16[2]};
    const int T = a.Tq > a.Tk ? a.Tq : a.Tk;
#define SHORT_BWD(DD, CC) bwd_launch<DD, CC>(a, gr, add, dout, lse, delta, smem, stream)
    SHORT_BY_SHAPE(D, T, SHORT_BWD);
#undef SHORT_BWD
    return true;
}
