/* scratch_sizes.c: the CUDA ops' scratch sizes and the arena's growth, in
 * plain C for the ops and the planner alike (see scratch_sizes.h). */
#include "scratch_sizes.h"

#include <stdint.h>

size_t scratch_round(size_t n_bytes) { return (n_bytes + SCRATCH_ALIGN - 1) / SCRATCH_ALIGN * SCRATCH_ALIGN; }

size_t scratch_gemm_operand(bool bf16, size_t n_elems, bool has_twin) {
    if (!bf16 || has_twin || n_elems == 0) return 0;
    return scratch_round(n_elems * sizeof(uint16_t));
}

size_t scratch_gemm(bool bf16, int M, int N, int K, bool a_twin, bool b_twin) {
    if (M <= 0 || N <= 0 || K <= 0) return 0;
    return scratch_gemm_operand(bf16, (size_t)M * K, a_twin) + scratch_gemm_operand(bf16, (size_t)K * N, b_twin);
}

size_t scratch_gemm_operand_x16(bool bf16, size_t n_elems) {
    if (bf16 || n_elems == 0) return 0;
    return scratch_round(n_elems * sizeof(float));
}

static size_t scratch_x(bool bf16, size_t n_elems, bool x16) {
    return x16 ? scratch_gemm_operand_x16(bf16, n_elems) : scratch_gemm_operand(bf16, n_elems, false);
}

size_t scratch_bias_rounded(bool bf16, int out, bool bias) {
    if (!bf16 || !bias || out <= 0) return 0;
    return scratch_round((size_t)out * sizeof(float));
}

size_t scratch_linear_fwd(bool bf16, int N, int in, int out, bool w_twin, bool x16, bool bias) {
    if (N <= 0 || out <= 0) return 0;
    const size_t b = scratch_bias_rounded(bf16, out, bias);
    if (in <= 0) return b;
    return scratch_x(bf16, (size_t)N * in, x16) + scratch_gemm_operand(bf16, (size_t)out * in, w_twin) + b;
}

int scratch_out16_rows(int N, int out) {
    if (N <= 0 || out <= 0) return 0;
    const size_t rows = SCRATCH_OUT16_CHUNK_ELEMS / (size_t)out;
    return rows < 1 ? 1 : rows < (size_t)N ? (int)rows : N;
}

size_t scratch_linear_fwd16(bool bf16, int N, int in, int out, bool w_twin, bool x16, bool bias, bool has_tmp) {
    const size_t whole = scratch_linear_fwd(bf16, N, in, out, w_twin, x16, bias);
    if (has_tmp || N <= 0 || in <= 0 || out <= 0) return whole;
    const int R = scratch_out16_rows(N, out);  // the row chunks through fp32, should the one GEMM be refused
    const size_t chunks =
        scratch_round((size_t)R * out * sizeof(float)) + scratch_linear_fwd(bf16, R, in, out, w_twin, x16, bias);
    return whole > chunks ? whole : chunks;
}

static size_t linear_bwd_bytes(bool bf16, bool fused_bgrad, bool want_dx, bool want_dW, bool want_db, int N, int in,
                               int out, bool w_twin, bool x16, bool dy16) {
    if (N <= 0 || out <= 0) return 0;
    size_t n_bytes = 0;
    if (want_db)  // the epilogue's vector, and the separate kernel's partials should cuBLASLt refuse it
        n_bytes += (fused_bgrad && want_dW && in > 0 ? scratch_round((size_t)out * sizeof(float)) : 0) +
                   scratch_bias_bwd(N, out);
    if (in <= 0) return n_bytes;
    if (want_dx || want_dW) n_bytes += scratch_x(bf16, (size_t)N * out, dy16);          // dy
    if (want_dx) n_bytes += scratch_gemm_operand(bf16, (size_t)out * in, w_twin);  // W
    if (want_dW) n_bytes += scratch_x(bf16, (size_t)N * in, x16);                  // x
    return n_bytes;
}

size_t scratch_linear_bwd(bool bf16, bool fused_bgrad, bool want_dx, bool want_dW, bool want_db, int N, int in,
                          int out, bool w_twin, bool x16) {
    return linear_bwd_bytes(bf16, fused_bgrad, want_dx, want_dW, want_db, N, in, out, w_twin, x16, false);
}

/* Whether linear_bwd_relu masks dy in the bias pass (no fp32 copy of it). */
static bool relu_in_bias_pass(bool bf16, bool want_dx, bool want_dW, bool want_db, int in) {
    return bf16 && want_db && in > 0 && (want_dx || want_dW);
}

size_t scratch_linear_bwd_relu(bool bf16, bool fused_bgrad, bool want_dx, bool want_dW, bool want_db, int N, int in,
                               int out, bool w_twin) {
    const bool in_pass = relu_in_bias_pass(bf16, want_dx, want_dW, want_db, in);  // db from that pass, not the epilogue
    const size_t core =
        linear_bwd_bytes(bf16, fused_bgrad && !in_pass, want_dx, want_dW, want_db, N, in, out, w_twin, true, false);
    if (N <= 0 || out <= 0 || in_pass) return core;
    return scratch_round((size_t)N * out * sizeof(float)) + core;
}

size_t scratch_linear_bwd_dy16(bool bf16, bool want_dx, bool want_dW, int N, int in, int out, bool w_twin) {
    return linear_bwd_bytes(bf16, false, want_dx, want_dW, false, N, in, out, w_twin, false, true);
}

size_t scratch_linear_bwd16(bool bf16, bool fused_bgrad, bool want_dx, bool want_dx16, bool want_dW, bool want_db,
                            int N, int in, int out, bool w_twin, bool x16, bool dy16, bool relu) {
    if (N <= 0 || out <= 0) return 0;
    size_t n_bytes = 0;
    bool db_left = want_db;  // the bias gradient still to make after a ReLU mask
    if (relu && dy16) {      // the masked bf16 copy, its sum (db, or one carved) and the sum's partials
        n_bytes += scratch_round((size_t)N * out * sizeof(uint16_t)) +
                   (want_db ? 0 : scratch_round((size_t)out * sizeof(float))) + scratch_bias_bwd(N, out);
        db_left = false;
    }
    const bool dx_any = want_dx || want_dx16;
    const bool in_pass = relu && !dy16 && relu_in_bias_pass(bf16, dx_any, want_dW, db_left, in);
    if (relu && !dy16 && !in_pass) n_bytes += scratch_round((size_t)N * out * sizeof(float));  // the masked fp32 dy
    if (want_dx16 && in > 0) n_bytes += scratch_round((size_t)scratch_out16_rows(N, in) * in * sizeof(float));
    return n_bytes + linear_bwd_bytes(bf16, fused_bgrad && !in_pass, dx_any, want_dW, db_left, N, in, out, w_twin,
                                      x16, dy16);
}

size_t scratch_linear_bwd16_drelu(bool bf16, bool fused_bgrad, bool want_dW, bool want_db, int N, int in, int out,
                                  bool w_twin, bool dy16) {
    if (N <= 0 || out <= 0) return 0;
    const size_t core =
        scratch_linear_bwd16(bf16, fused_bgrad, false, true, want_dW, want_db, N, in, out, w_twin, true, dy16, false);
    if (in <= 0) return core;
    return core + scratch_round((size_t)in * sizeof(float)) + scratch_bias_bwd(N, in);
}

int scratch_bias_chunks(int N) { return (N + SCRATCH_BIAS_CHUNK_ROWS - 1) / SCRATCH_BIAS_CHUNK_ROWS; }

size_t scratch_bias_bwd(int N, int C) {
    if (N <= 0 || C <= 0) return 0;
    return scratch_round((size_t)scratch_bias_chunks(N) * (size_t)C * sizeof(double));
}

int scratch_ln_chunks(int N) { return (N + SCRATCH_LN_CHUNK_ROWS - 1) / SCRATCH_LN_CHUNK_ROWS; }

size_t scratch_layernorm_bwd(int N, int C) {  // the gamma and the beta partials
    if (N <= 0 || C <= 0) return 0;
    return 2 * scratch_round((size_t)scratch_ln_chunks(N) * (size_t)C * sizeof(double));
}

size_t scratch_residual_ln_bwd(int N, int C) {  // the gamma, beta and bias partials
    if (N <= 0 || C <= 0) return 0;
    return scratch_round(3 * (size_t)scratch_ln_chunks(N) * (size_t)C * sizeof(double));
}

unsigned scratch_sum_blocks(size_t n_elems) {
    size_t g = (n_elems + SCRATCH_SUM_THREADS - 1) / SCRATCH_SUM_THREADS;
    if (g == 0) g = 1;
    return g > SCRATCH_SUM_MAX_BLOCKS ? SCRATCH_SUM_MAX_BLOCKS : (unsigned)g;
}

size_t scratch_sum(size_t n_elems) { return n_elems ? scratch_round(scratch_sum_blocks(n_elems) * sizeof(double)) : 0; }

int scratch_key_bits(int V_local) {
    int end_bit = 0;
    while (end_bit < 32 && ((uint64_t)1 << end_bit) <= (uint64_t)V_local) end_bit++;
    return end_bit;
}

/* CUB's one-sweep layout for N (uint32 key, int32 value) pairs: the digit
 * bins of every pass (offsets of up to 8 bytes), a lookback row per tile,
 * the alternate keys and values (more than one pass), a counter per pass;
 * each region 256-aligned, plus the alignment of the whole. */
size_t scratch_sort_pairs_bound(int N, int key_bits) {
    if (N <= 0) return 0;
    const size_t digits = (size_t)1 << SCRATCH_SORT_DIGIT_BITS;
    const size_t passes = key_bits > 0 ? ((size_t)key_bits + SCRATCH_SORT_DIGIT_BITS - 1) / SCRATCH_SORT_DIGIT_BITS : 1;
    const size_t tiles = ((size_t)N + SCRATCH_SORT_MIN_TILE - 1) / SCRATCH_SORT_MIN_TILE;
    return SCRATCH_ALIGN + scratch_round(passes * digits * sizeof(uint64_t)) +
           scratch_round(tiles * digits * sizeof(int32_t)) + 2 * scratch_round((size_t)N * sizeof(uint32_t)) +
           scratch_round(passes * sizeof(int32_t));
}

size_t scratch_embedding_bwd(int N, int V_local) {  // keys and rows in and out, then the sort's storage
    if (N <= 0 || V_local <= 0) return 0;
    return 4 * scratch_round((size_t)N * sizeof(uint32_t)) +
           scratch_round(scratch_sort_pairs_bound(N, scratch_key_bits(V_local)));
}

/* The grid: SCRATCH_ARENA_MIN, then 2^k and 3 * 2^(k-1) bytes in turn. */
size_t scratch_arena_bytes(size_t n_bytes) {
    if (n_bytes == 0) return 0;
    size_t p = SCRATCH_ARENA_MIN;
    for (;;) {
        if (n_bytes <= p) return p;
        if (n_bytes <= p + p / 2) return p + p / 2;
        p *= 2;
    }
}
