/* dropout.c: dropout driven by the Philox4x32-10 counter-based generator.
 *
 * A mask bit is a pure function of (seed, stream, element index): no RNG
 * state is carried, so backward recomputes the forward mask, a resumed run
 * draws the same masks, and the CUDA kernel (one thread per 4 elements)
 * produces bit-identical masks. Element i uses counter
 * (i/4 lo, i/4 hi, stream lo, stream hi) with key (seed lo, seed hi) and
 * takes word i%4; its uniform is (word >> 8) * 2^-24 in [0, 1), exact in fp32,
 * and the element is kept when uniform >= p.
 */
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

/* out[i] = keep(first + i) ? x[i] * scale : 0, for the Philox mask of
 * (seed, stream). With accumulate, out[i] += instead. out may alias x. */
static void apply_mask(float *out, const float *x, size_t n_elems, uint64_t first, float p,
                       uint64_t seed, uint64_t stream, bool accumulate) {
    const float scale = dropout_scale(p);
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    for (size_t base = 0; base < n_elems; base += 4) {
        uint32_t words[4];
        dropout_block_words((first + base) / 4, key, (uint32_t)stream, (uint32_t)(stream >> 32), words);
        for (size_t w = 0; w < 4 && base + w < n_elems; w++) {
            size_t i = base + w;
            float val = dropout_keeps(words[w], p) ? x[i] * scale : 0.0f;
            out[i] = accumulate ? out[i] + val : val;
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
    apply_mask(out, x, n_elems, first, p, seed, stream, false);
}

void cpu_dropout_bwd_at(float *dx,        // (n_elems) accumulated, or written (GRAD_WRITE)
                        GradMode mode,
                        const float *dy,  // (n_elems)
                        size_t n_elems, uint64_t first, float p, uint64_t seed, uint64_t stream) {
    TP_CHECK(grad_mode_valid(mode), "op_dropout_bwd: unknown gradient mode %d", (int)mode);
    TP_CHECK(p >= 0.0f && p <= 1.0f, "op_dropout_bwd: p = %g outside [0, 1]", (double)p);
    TP_CHECK(first % 4 == 0, "op_dropout_bwd: window start %llu is not a multiple of 4", (unsigned long long)first);
    const bool add = mode == GRAD_ADD;
    if (p == 0.0f) {
        if (add) cpu_accumulate(dx, dy, n_elems);
        else cpu_copy(dx, dy, n_elems);
        return;
    }
    apply_mask(dx, dy, n_elems, first, p, seed, stream, add);
}

void cpu_dropout_fwd(float *out, const float *x, size_t n_elems, float p, uint64_t seed, uint64_t stream) {
    cpu_dropout_fwd_at(out, x, n_elems, 0, p, seed, stream);
}

void cpu_dropout_bwd(float *dx, GradMode mode, const float *dy, size_t n_elems, float p, uint64_t seed,
                     uint64_t stream) {
    cpu_dropout_bwd_at(dx, mode, dy, n_elems, 0, p, seed, stream);
}
