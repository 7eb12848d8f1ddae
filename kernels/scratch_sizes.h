/* scratch_sizes.h: how much temporary device memory each CUDA op asks of the
 * backend's workspace arena, and how large that arena grows, in plain C.
 *
 * Why here and not in kernels/cuda: the planner (src/train/planner.c) must
 * predict the arena on a build without CUDA, and a prediction computed from
 * a copy of the formulas would drift from the allocation the first time a
 * kernel changed its partials. So the arithmetic lives once, here, compiled
 * in every build; the CUDA ops' cuda_*_scratch_bytes functions and their
 * carving use these functions and constants (the chunk heights and block
 * counts the kernels launch with), and the planner calls the same ones.
 *
 * Every region an op carves starts on SCRATCH_ALIGN bytes; the functions
 * include that padding. A size of 0 means the op takes no scratch.
 */
#ifndef TPTRAIN_SCRATCH_SIZES_H
#define TPTRAIN_SCRATCH_SIZES_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SCRATCH_ALIGN ((size_t)256)
#define SCRATCH_BIAS_CHUNK_ROWS 64   // rows per partial of the bias-gradient column sums (colsum.cuh)
#define SCRATCH_LN_CHUNK_ROWS 64     // rows per partial of the LayerNorm gamma/beta sums (colsum.cuh)
#define SCRATCH_SUM_THREADS 256u     // threads per block of the sum reductions (reduce.cu)
#define SCRATCH_SUM_MAX_BLOCKS 1024u // blocks of the first pass at most (= threads of the final pass)
/* The embedding backward sorts (token id, row) pairs with CUB's radix sort.
 * Its temporary storage is CUB's to decide; embedding.cu checks at every
 * call that CUB asks no more than scratch_sort_pairs_bound (from CUB's
 * one-sweep layout: per-pass digit bins, a lookback row per tile, the
 * alternate keys and values, counters), so the planned size stays an upper
 * bound or the op names the difference. */
#define SCRATCH_SORT_DIGIT_BITS 8   // CUB's one-sweep radix digit
#define SCRATCH_SORT_MIN_TILE 256   // items per one-sweep tile, at least
/* The arena is never grown by less than a step of this geometric grid, so a
 * run whose requests creep upwards reallocates rarely, and its final size is
 * a function of its largest request alone, whatever the order. */
#define SCRATCH_ARENA_MIN ((size_t)64 << 10)

size_t scratch_round(size_t n_bytes);

/* GEMM operands: a bf16 copy of an fp32 operand (n_elems) in bf16 mode when
 * the caller holds no bf16 twin of it; none in fp32. */
size_t scratch_gemm_operand(bool bf16, size_t n_elems, bool has_twin);
size_t scratch_gemm(bool bf16, int M, int N, int K, bool a_twin, bool b_twin);
/* An operand given as bf16 bits alone (the x16 linear layers' x): nothing
 * in bf16 mode, its widened fp32 copy in fp32. */
size_t scratch_gemm_operand_x16(bool bf16, size_t n_elems);
/* A linear layer's bias in bf16 mode, where it enters rounded to bf16 as its
 * weight does (ops_list.h): room for the (out) rounded vector, fp32 for an
 * fp32 output or bf16 for a bf16 one (when the caller holds no aligned
 * bf16 twin of it); nothing in fp32 or without a bias. */
size_t scratch_bias_rounded(bool bf16, int out, bool bias);
/* x16: x comes as bf16 bits (op_linear_fwd_x16 / op_linear_bwd_x16); bias:
 * the layer has one (scratch_bias_rounded, after the operands). */
size_t scratch_linear_fwd(bool bf16, int N, int in, int out, bool w_twin, bool x16, bool bias);
/* fused_bgrad: the bias gradient is tried in the dW GEMM's epilogue (fused
 * epilogues on: the CUDA backend's default, fp32 and bf16), whose (out)
 * vector takes scratch too. */
size_t scratch_linear_bwd(bool bf16, bool fused_bgrad, bool want_dx, bool want_dW, bool want_db, int N, int in,
                          int out, bool w_twin, bool x16);

/* linear_fwd16 (ops_list.h). has_tmp: the caller gave (N, out) fp32 room for
 * the fallback; without it the fallback runs in row chunks of
 * scratch_out16_rows rows through fp32 room in scratch, SCRATCH_OUT16_CHUNK_ELEMS
 * floats at most (one row more when a row is longer). */
#define SCRATCH_OUT16_CHUNK_ELEMS ((size_t)4 << 20)
int scratch_out16_rows(int N, int out);
size_t scratch_linear_fwd16(bool bf16, int N, int in, int out, bool w_twin, bool x16, bool bias, bool has_tmp);
/* linear_bwd_relu_x16: in bf16 with db, dx or dW wanted and in > 0, the
 * bias pass masks dy as it copies it: linear_bwd's x16 bytes; otherwise
 * the masked fp32 dy is made first, (N, out) floats more. */
size_t scratch_linear_bwd_relu(bool bf16, bool fused_bgrad, bool want_dx, bool want_dW, bool want_db, int N, int in,
                               int out, bool w_twin);
/* linear_bwd16 (ops_list.h): x16, dy16: given as bf16 bits alone; relu: a
 * ReLU mask; want_dx16: dx stored as bf16, with room for the fallback's
 * fp32 row chunks (scratch_out16_rows rows of in floats). */
size_t scratch_linear_bwd16(bool bf16, bool fused_bgrad, bool want_dx, bool want_dx16, bool want_dW, bool want_db,
                            int N, int in, int out, bool w_twin, bool x16, bool dy16, bool relu);
/* linear_bwd16_drelu (ops_list.h): linear_bwd16 writing dx16 from x16, plus
 * the epilogue's (in) bias-gradient vector and the fallback pass's partials
 * over (N, in). */
size_t scratch_linear_bwd16_drelu(bool bf16, bool fused_bgrad, bool want_dW, bool want_db, int N, int in, int out,
                                  bool w_twin, bool dy16);
/* linear_bwd_dy16: dy as bf16 bits (multiplied as they are in bf16,
 * widened in fp32), no bias. */
size_t scratch_linear_bwd_dy16(bool bf16, bool want_dx, bool want_dW, int N, int in, int out, bool w_twin);

int scratch_bias_chunks(int N);
size_t scratch_bias_bwd(int N, int C);
int scratch_ln_chunks(int N);
size_t scratch_layernorm_bwd(int N, int C);
/* The fused residual + dropout + LayerNorm backward (residual_ln.cu): the
 * gamma, beta and bias partials in one region, in LayerNorm chunks (which
 * equal the bias gradient's, so its sums are bias.cu's). */
size_t scratch_residual_ln_bwd(int N, int C);
unsigned scratch_sum_blocks(size_t n_elems);
size_t scratch_sum(size_t n_elems);
/* The bits a radix sort of keys 0..V_local must look at. */
int scratch_key_bits(int V_local);
size_t scratch_sort_pairs_bound(int N, int key_bits);
size_t scratch_embedding_bwd(int N, int V_local);

/* The arena backend_workspace holds once its largest request was n_bytes
 * (0: none made, no arena). */
size_t scratch_arena_bytes(size_t n_bytes);

#ifdef __cplusplus
}
#endif

#endif
