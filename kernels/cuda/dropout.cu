// dropout.cu: dropout with the Philox4x32-10 counter-based generator.
//
// The mask must be bit-identical to kernels/cpu/dropout.c, so this file
// repeats its layout exactly: element i uses counter
// (i/4 lo, i/4 hi, stream lo, stream hi) under key (seed lo, seed hi), takes
// word i%4, forms uniform = (word >> 8) * 2^-24 (exact in fp32) and keeps the
// element when uniform >= p. One thread per group of 4 elements, so each
// Philox call is used whole. Kept values are x * (1/(1-p)) with the scale
// computed on the host by the CPU's expression; the backward's add is kept
// apart from the multiply (__fmul_rn / __fadd_rn: no FMA), so forward and
// backward outputs are bit-identical to the CPU as well, and the backward's
// bf16 form (dx16) rounds those same values with the CPU's rounding.
#include "cuda_ops.h"
#include "cuda_kernel_util.cuh"
#include "philox.h"

#define DROPOUT_THREADS 256u

// ---- kernels ---------------------------------------------------------------------

// out[i] = keep(first + i) ? x[i] * scale : 0, or out[i] += that with
// accumulate (first_block = first / 4: the window starts on a whole block).
// out may alias x: every element is read and written by one thread.
// out16 instead of out (dropout_bwd_at's dx16; never accumulated): each of
// those values stored as its bf16 bits (tp_bf16_bits: to_bf16's rounding of
// the very value the fp32 form writes), a whole aligned group of 4 with one
// 16-byte load and one 8-byte store.
__global__ void dropout_kernel(float *out,       // (n_elems) or NULL
                               uint16_t *out16,  // (n_elems) or NULL
                               const float *x,   // (n_elems)
                               size_t n_elems, uint64_t first_block, float p, float scale, uint32_t seed_lo,
                               uint32_t seed_hi, uint64_t stream_id, const StepVars *step, bool accumulate) {
    const size_t n_groups = (n_elems + 3) / 4;
    const uint32_t key[2] = {seed_lo, seed_hi};
    const uint64_t s = tp_step_stream(step, stream_id);
    const uint32_t stream_lo = (uint32_t)s, stream_hi = (uint32_t)(s >> 32);
    const bool vec16 = out16 && ((uintptr_t)out16 % 8 == 0) && ((uintptr_t)x % 16 == 0);
    for (size_t grp = blockIdx.x * (size_t)blockDim.x + threadIdx.x; grp < n_groups;
         grp += (size_t)gridDim.x * blockDim.x) {
        uint32_t words[4];
        dropout_block_words(first_block + grp, key, stream_lo, stream_hi, words);
        const size_t base = grp * 4;
        if (vec16 && base + 4 <= n_elems) {
            const float4 v = *(const float4 *)(x + base);
            const float in[4] = {v.x, v.y, v.z, v.w};
            uint16_t h[4];
#pragma unroll
            for (int w = 0; w < 4; w++)
                h[w] = tp_bf16_bits(dropout_keeps(words[w], p) ? __fmul_rn(in[w], scale) : 0.0f);
            *(uint2 *)(out16 + base) = make_uint2(h[0] | (uint32_t)h[1] << 16, h[2] | (uint32_t)h[3] << 16);
            continue;
        }
#pragma unroll
        for (int w = 0; w < 4; w++) {
            const size_t i = base + w;
            if (i < n_elems) {
                const float val = dropout_keeps(words[w], p) ? __fmul_rn(x[i], scale) : 0.0f;
                if (out16) out16[i] = tp_bf16_bits(val);
                else out[i] = accumulate ? __fadd_rn(out[i], val) : val;
            }
        }
    }
}

// The window form (dropout_fwd_win / _bwd_win): element (r, c) of the
// (rows, cols) operand is element first + r*ld + c of the mask, any first and
// ld. One thread per group of 4 consecutive columns of a row: their mask
// elements lie in at most two Philox blocks, each drawn once.
__global__ void dropout_win_kernel(float *out,      // (rows, cols)
                                   const float *x,  // (rows, cols)
                                   size_t rows, size_t cols, uint64_t ld, uint64_t first, float p, float scale,
                                   uint32_t seed_lo, uint32_t seed_hi, uint64_t stream_id, const StepVars *step,
                                   bool accumulate) {
    const size_t per_row = (cols + 3) / 4, n_groups = rows * per_row;
    const uint32_t key[2] = {seed_lo, seed_hi};
    const uint64_t s = tp_step_stream(step, stream_id);
    const uint32_t stream_lo = (uint32_t)s, stream_hi = (uint32_t)(s >> 32);
    for (size_t grp = blockIdx.x * (size_t)blockDim.x + threadIdx.x; grp < n_groups;
         grp += (size_t)gridDim.x * blockDim.x) {
        const size_t r = grp / per_row, c0 = (grp % per_row) * 4;
        const uint64_t g0 = first + r * ld + c0, b0 = g0 / 4;
        uint32_t words[8];
        dropout_block_words(b0, key, stream_lo, stream_hi, words);
        if (g0 % 4) dropout_block_words(b0 + 1, key, stream_lo, stream_hi, words + 4);
#pragma unroll
        for (int w = 0; w < 4; w++) {
            const size_t c = c0 + w;
            if (c < cols) {
                const size_t i = r * cols + c;
                const float val = dropout_keeps(words[g0 % 4 + w], p) ? __fmul_rn(x[i], scale) : 0.0f;
                out[i] = accumulate ? __fadd_rn(out[i], val) : val;
            }
        }
    }
}

// ---- launchers ---------------------------------------------------------------------

static void dropout_launch(float *out, uint16_t *out16, const float *x, size_t n_elems, uint64_t first, float p,
                           uint64_t seed, uint64_t stream_id, const StepVars *step, bool accumulate,
                           cudaStream_t stream) {
    const float scale = dropout_scale(p);  // the CPU's expression (philox.h)
    const size_t n_groups = (n_elems + 3) / 4;
    dropout_kernel<<<tp_grid_1d(n_groups, DROPOUT_THREADS), DROPOUT_THREADS, 0, stream>>>(
        out, out16, x, n_elems, first / 4, p, scale, (uint32_t)seed, (uint32_t)(seed >> 32), stream_id, step,
        accumulate);
    CUDA_CHECK(cudaGetLastError());
}

static void dropout_win_launch(float *out, const float *x, size_t rows, size_t cols, uint64_t ld, uint64_t first,
                               float p, uint64_t seed, uint64_t stream_id, const StepVars *step, bool accumulate,
                               cudaStream_t stream) {
    const float scale = dropout_scale(p);
    const size_t n_groups = rows * ((cols + 3) / 4);
    dropout_win_kernel<<<tp_grid_1d(n_groups, DROPOUT_THREADS), DROPOUT_THREADS, 0, stream>>>(
        out, x, rows, cols, ld, first, p, scale, (uint32_t)seed, (uint32_t)(seed >> 32), stream_id, step,
        accumulate);
    CUDA_CHECK(cudaGetLastError());
}

// ---- exported ops ---------------------------------------------------------------------

// The checks both ops make (names: the output's and the input's, for the
// message); false when there is nothing to do (n_elems = 0).
static bool dropout_args_ok(const char *op, const char *const names[2], const void *out, const void *in,
                            size_t n_elems, uint64_t first, float p) {
    TP_CHECK(p >= 0.0f && p <= 1.0f, "%s: p = %g outside [0, 1]", op, (double)p);
    TP_CHECK(first % 4 == 0, "%s: window start %llu is not a multiple of 4", op, (unsigned long long)first);
    if (n_elems == 0) return false;
    TP_CHECK(out != NULL, "%s: %s is NULL", op, names[0]);
    TP_CHECK(in != NULL, "%s: %s is NULL", op, names[1]);
    return true;
}

extern "C" void cuda_op_dropout_fwd_at(float *out, const float *x, size_t n_elems, uint64_t first, float p,
                                       uint64_t seed, uint64_t stream_id, const StepVars *step,
                                       cudaStream_t stream) {
    static const char *const names[2] = {"out", "x"};
    if (!dropout_args_ok("cuda_op_dropout_fwd_at", names, out, x, n_elems, first, p)) return;
    if (p == 0.0f) {
        // a plain copy: out is x (no-op) or does not overlap it (ops.h)
        cuda_op_copy_bytes(out, x, n_elems * sizeof(float), NULL, stream);
        return;
    }
    dropout_launch(out, NULL, x, n_elems, first, p, seed, stream_id, step, false, stream);
}

extern "C" void cuda_op_dropout_bwd_at(float *dx, uint16_t *dx16, GradMode mode, const float *dy, size_t n_elems,
                                       uint64_t first, float p, uint64_t seed, uint64_t stream_id,
                                       const StepVars *step, cudaStream_t stream) {
    static const char *const names[2] = {"dx and dx16", "dy"};
    const char *op = "cuda_op_dropout_bwd_at";
    TP_CHECK(grad_mode_valid(mode), "%s: unknown gradient mode %d", op, (int)mode);
    TP_CHECK(!(dx && dx16), "%s: give exactly one of dx and dx16", op);
    TP_CHECK(!dx16 || mode == GRAD_WRITE, "%s: dx16 is written (GRAD_WRITE), not accumulated", op);
    if (!dropout_args_ok(op, names, dx ? (const void *)dx : dx16, dy, n_elems, first, p)) return;
    const bool add = mode == GRAD_ADD;
    if (p == 0.0f) {
        if (dx16) cuda_op_to_bf16(dx16, dy, n_elems, stream);
        else if (add) cuda_op_accumulate(dx, dy, n_elems, stream);
        else cuda_op_copy_bytes(dx, dy, n_elems * sizeof(float), NULL, stream);  // dx is dy (no-op) or apart
        return;
    }
    dropout_launch(dx, dx16, dy, n_elems, first, p, seed, stream_id, step, add, stream);
}

// The window ops' checks; false when there is nothing to do.
static bool dropout_win_ok(const char *op, const char *const names[2], const void *out, const void *in, size_t rows,
                           size_t cols, uint64_t ld, float p) {
    TP_CHECK(p >= 0.0f && p <= 1.0f, "%s: p = %g outside [0, 1]", op, (double)p);
    TP_CHECK(rows <= 1 || ld >= cols, "%s: rows of %zu elements %llu apart overlap in the mask", op, cols,
             (unsigned long long)ld);
    if (rows == 0 || cols == 0) return false;
    TP_CHECK(out != NULL, "%s: %s is NULL", op, names[0]);
    TP_CHECK(in != NULL, "%s: %s is NULL", op, names[1]);
    return true;
}

extern "C" void cuda_op_dropout_fwd_win(float *out, const float *x, size_t rows, size_t cols, uint64_t ld,
                                        uint64_t first, float p, uint64_t seed, uint64_t stream_id,
                                        const StepVars *step, cudaStream_t stream) {
    static const char *const names[2] = {"out", "x"};
    if (!dropout_win_ok("cuda_op_dropout_fwd_win", names, out, x, rows, cols, ld, p)) return;
    if (p == 0.0f) {
        if (out != x) cuda_op_copy_bytes(out, x, rows * cols * sizeof(float), NULL, stream);
        return;
    }
    dropout_win_launch(out, x, rows, cols, ld, first, p, seed, stream_id, step, false, stream);
}

extern "C" void cuda_op_dropout_bwd_win(float *dx, GradMode mode, const float *dy, size_t rows, size_t cols,
                                        uint64_t ld, uint64_t first, float p, uint64_t seed, uint64_t stream_id,
                                        const StepVars *step, cudaStream_t stream) {
    static const char *const names[2] = {"dx", "dy"};
    TP_CHECK(grad_mode_valid(mode), "cuda_op_dropout_bwd_win: unknown gradient mode %d", (int)mode);
    if (!dropout_win_ok("cuda_op_dropout_bwd_win", names, dx, dy, rows, cols, ld, p)) return;
    const bool add = mode == GRAD_ADD;
    if (p == 0.0f) {
        if (add) cuda_op_accumulate(dx, dy, rows * cols, stream);
        else if (dx != dy) cuda_op_copy_bytes(dx, dy, rows * cols * sizeof(float), NULL, stream);
        return;
    }
    dropout_win_launch(dx, dy, rows, cols, ld, first, p, seed, stream_id, step, add, stream);
}
