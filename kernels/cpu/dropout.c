/* dropout.c: dropout driven by the Philox4x32-10 counter-based generator.
 *
 * A mask bit is a pure function of (seed, stream, element index): no RNG
 * state is carried, so backward recomputes the forward mask, a resumed run
 * draws the same masks, and the CUDA kernel (one thread per 4 elements)
 * produces bit-identical masks. Element i uses counter
 * (i/4 lo, i/4 hi, stream lo, stream hi) with key (seed lo, seed hi) and
 * takes word i%4; its uniform is (word >> 8) * 2^-24 in [0, 1), exact in fp32,
 * and the element is kept when uniform >= p. The backward can store its
 * written values as their bf16 rounding (dx16, bf16.h's): the dy of the
 * linear backward that reads it in bf16 mode.
 */
#include "bf16.h"
#include "cpu_ops.h"
#include "philox.h"
#include "err.h"

void philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    philox4x32_10_inline(ctr, key, out);
}

uint64_t dropout_stream(uint32_t step, uint32_t micro, uint32_t layer,
                        uint32_t site, uint32_t tp_rank) {
    TP_CHECK(micro < (1u << 8) && layer < (1u << 8) && site < (1u << 6) &&
                 tp_rank < (1u << 10),
             "dropout_stream: field out of range (micro %u, layer %u, site %u, tp %u)",
             micro, layer, site, tp_rank);
    return ((uint64_t)step << 32) | ((uint64_t)micro << 24) | ((uint64_t)layer << 16) |
           ((uint64_t)site << 10) | (uint64_t)tp_rank;
}

/* out[r*cols + c] = keep(first + r*ld + c) ? x[r*cols + c] * scale : 0, for
 * the Philox mask of (seed, stream): a window of rows of a larger mask (one
 * row: the window at first). With accumulate, out[.] += instead. out may
 * alias x. out16 instead of out (not accumulated): each of those values
 * stored as its bf16 rounding. A block's four words are drawn once while
 * the window stays in it. */
static void apply_mask(float *out, uint16_t *out16, const float *x, size_t rows, size_t cols, uint64_t ld,
                       uint64_t first, float p, uint64_t seed, uint64_t stream, bool accumulate) {
    const float scale = dropout_scale(p);
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    for (size_t r = 0; r < rows; r++) {
        const uint64_t at = first + r * ld;
        uint64_t block = UINT64_MAX;
        uint32_t words[4];
        for (size_t c = 0; c < cols; c++) {
            const uint64_t g = at + c;
            if (g / 4 != block) {
                block = g / 4;
                dropout_block_words(block, key, (uint32_t)stream, (uint32_t)(stream >> 32), words);
            }
            const size_t i = r * cols + c;
            const float val = dropout_keeps(words[g % 4], p) ? x[i] * scale : 0.0f;
            if (out16) out16[i] = tp_f32_to_bf16(val);
            else out[i] = accumulate ? out[i] + val : val;
        }
    }
}

void cpu_dropout_fwd_at(float *out,      // (n_elems), may alias x
                        const float *x,  // (n_elems)
                        size_t n_elems, uint64_t first, float p, uint64_t seed, uint64_t stream) {
    TP_CHECK(p >= 0.0f && p <= 1.0f, "op_dropout_fwd: p = %g outside [0, 1]", (double)p);
    TP_CHECK(first % 4 == 0, "op_dropout_fwd: window start %llu is not a multiple of 4", (unsigned long long)first);
    if (p == 0.0f) {
        if (out != x)
            for (size_t i = 0; i < n_elems; i++) out[i] = x[i];
        return;
    }
    apply_mask(out, NULL, x, 1, n_elems, 0, first, p, seed, stream, false);
}

void cpu_dropout_bwd_at(float *dx,        // (n_elems) accumulated, or written (GRAD_WRITE); or NULL
                        uint16_t *dx16,   // (n_elems) bf16 bits written, or NULL
                        GradMode mode,
                        const float *dy,  // (n_elems)
                        size_t n_elems, uint64_t first, float p, uint64_t seed, uint64_t stream) {
    TP_CHECK(grad_mode_valid(mode), "op_dropout_bwd: unknown gradient mode %d", (int)mode);
    TP_CHECK(p >= 0.0f && p <= 1.0f, "op_dropout_bwd: p = %g outside [0, 1]", (double)p);
    TP_CHECK(first % 4 == 0, "op_dropout_bwd: window start %llu is not a multiple of 4", (unsigned long long)first);
    TP_CHECK(n_elems == 0 || (dx == NULL) != (dx16 == NULL), "op_dropout_bwd: give exactly one of dx and dx16");
    TP_CHECK(!dx16 || mode == GRAD_WRITE, "op_dropout_bwd: dx16 is written (GRAD_WRITE), not accumulated");
    const bool add = mode == GRAD_ADD;
    if (p == 0.0f) {
        if (dx16) cpu_to_bf16(dx16, dy, n_elems);
        else if (add) cpu_accumulate(dx, dy, n_elems);
        else cpu_copy(dx, dy, n_elems);
        return;
    }
    apply_mask(dx, dx16, dy, 1, n_elems, 0, first, p, seed, stream, add);
}

void cpu_dropout_fwd(float *out, const float *x, size_t n_elems, float p, uint64_t seed, uint64_t stream) {
    cpu_dropout_fwd_at(out, x, n_elems, 0, p, seed, stream);
}

void cpu_dropout_bwd(float *dx, GradMode mode, const float *dy, size_t n_elems, float p, uint64_t seed,
                     uint64_t stream) {
    cpu_dropout_bwd_at(dx, NULL, mode, dy, n_elems, 0, p, seed, stream);
}

/* The checks of both window ops (name: the op's, for the message). */
static void win_check(const char *op, size_t rows, size_t cols, uint64_t ld, float p) {
    TP_CHECK(p >= 0.0f && p <= 1.0f, "%s: p = %g outside [0, 1]", op, (double)p);
    TP_CHECK(rows <= 1 || ld >= cols, "%s: rows of %zu elements %llu apart overlap in the mask", op, cols,
             (unsigned long long)ld);
}

void cpu_dropout_fwd_win(float *out, const float *x, size_t rows, size_t cols, uint64_t ld, uint64_t first, float p,
                         uint64_t seed, uint64_t stream) {
    win_check("op_dropout_fwd_win", rows, cols, ld, p);
    if (p == 0.0f) {
        if (out != x) cpu_copy(out, x, rows * cols);
        return;
    }
    apply_mask(out, NULL, x, rows, cols, ld, first, p, seed, stream, false);
}

void cpu_dropout_bwd_win(float *dx, GradMode mode, const float *dy, size_t rows, size_t cols, uint64_t ld,
                         uint64_t first, float p, uint64_t seed, uint64_t stream) {
    TP_CHECK(grad_mode_valid(mode), "op_dropout_bwd_win: unknown gradient mode %d", (int)mode);
    win_check("op_dropout_bwd_win", rows, cols, ld, p);
    const bool add = mode == GRAD_ADD;
    if (p == 0.0f) {
        if (add) cpu_accumulate(dx, dy, rows * cols);
        else if (dx != dy) cpu_copy(dx, dy, rows * cols);
        return;
    }
    apply_mask(dx, NULL, dy, rows, cols, ld, first, p, seed, stream, add);
}
