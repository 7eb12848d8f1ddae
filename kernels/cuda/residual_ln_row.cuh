// residual_ln_row.cuh: residual_ln.cu's rows (the source of the forward,
// the tail of the backward, both for layernorm_row.cuh's block code) and
// the dropout they draw, in row_prims.h's primitives: the device's under
// nvcc, test/test_ln_rows.cc's on the CPU (an emulated block against the
// CPU reference). residual_ln.cu's header says what the op computes and
// why it is shaped so. Private to kernels/cuda.
#ifndef TPTRAIN_RESIDUAL_LN_ROW_CUH
#define TPTRAIN_RESIDUAL_LN_ROW_CUH

#include "layernorm_row.cuh"
#include "philox.h"

// The dropout of one run: the mask of philox.h, as dropout.cu draws it.
typedef struct {
    uint64_t first;           // the window's first element in the whole mask
    float p, scale;           // scale = 1/(1-p), the CPU's expression
    uint32_t key[2];          // seed lo, hi
    uint64_t stream;          // the stream id; with step, step->stream_base is added (rln_resolve)
    const StepVars *step;     // the backend's StepVars, or NULL
    bool on;                  // p > 0 (p == 0 copies, as op_dropout_fwd does)
} RlnDrop;

// ---- the dropout ------------------------------------------------------------------

// The run's stream with the StepVars' base added, read once per thread
// at a kernel's start (the kernels' own copy of d).
RP_FN void rln_resolve(RlnDrop &d) {
    d.stream = rp_step_stream(d.step, d.stream);
    d.step = NULL;
}

RP_FN void rln_words(const RlnDrop &d, uint64_t block, uint32_t w[4]) {
    dropout_block_words(block, d.key, (uint32_t)d.stream, (uint32_t)(d.stream >> 32), w);
}

// Dropout of v with its mask word: v * scale or 0 (v itself when off).
RP_FN float rln_drop(const RlnDrop &d, float v, uint32_t word) {
    if (!d.on) return v;
    return dropout_keeps(word, d.p) ? rp_fmul(v, d.scale) : 0.0f;
}

// The word of element i (an index into the window) for the scalar loads.
RP_FN uint32_t rln_word_of(const RlnDrop &d, size_t i) {
    if (!d.on) return 0;
    uint32_t w[4];
    const uint64_t g = d.first + i;
    rln_words(d, g / 4, w);
    return w[g % 4];
}

// res_in + Dropout(branch + bias) for one element.
RP_FN float rln_resid(const RlnDrop &d, float r_in, float b, const float *bias, int c,
                                           uint32_t word) {
    const float v = bias ? rp_fadd(b, bias[c]) : b;
    return rp_fadd(r_in, rln_drop(d, v, word));
}

// ---- forward ---------------------------------------------------------------------

// The forward's source (layernorm_row.cuh): row n's res_out = res_in +
// Dropout(branch + bias), written, and kept as the LayerNorm's input (in
// registers; NJ = 0: read back from res_out, each lane its own elements).
struct RlnSrc {
    RlnDrop d;
    float *res_out;        // (N, C)
    const float *res_in;   // (N, C)
    const float *branch;   // (N, C)
    const float *bias;     // (C) or NULL
    RP_FN void begin() { rln_resolve(d); }
    template <int NJ, bool VEC>
    RP_FN void row(LnRow<NJ> &x, int n, int C, int lane) {
        const size_t at = (size_t)n * C;
        float *ro = res_out + at;
        const float *ri = res_in + at, *br = branch + at;
        const int nj = ln_nk<NJ>(C) / 4;
RP_UNROLL
        for (int j = 0; j < nj; j++) {
            const int c0 = LN_GROUP * j + 4 * lane;
            float o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            if (VEC) {
                if (c0 < C) {
                    float b[4], r[4];
                    rp_ld4(b, br + c0);
                    rp_ld4(r, ri + c0);
                    uint32_t w[4] = {0, 0, 0, 0};
                    if (d.on) rln_words(d, (d.first + at + c0) / 4, w);  // one Philox block: C % 4 == 0
RP_UNROLL
                    for (int e = 0; e < 4; e++) o[e] = rln_resid(d, r[e], b[e], bias, c0 + e, w[e]);
                    ln_st4(ro + c0, o);
                }
            } else {
RP_UNROLL
                for (int e = 0; e < 4; e++)
                    if (c0 + e < C) {
                        const int c = c0 + e;
                        o[e] = rln_resid(d, ri[c], br[c], bias, c, rln_word_of(d, at + c));
                        ro[c] = o[e];
                    }
            }
            if (NJ > 0) ln_keep4(x, j, o);
        }
        if (NJ == 0) ln_load<NJ, VEC>(x, ro, C, lane);
    }
};

// ---- backward ----------------------------------------------------------------------

// The backward's tail (layernorm_row.cuh): d_branch = Dropout backward of
// the new d_res (written; 0 + value, as the unfused zeroing and
// accumulation give), fp32 or its bf16 rounding (OutT), and the bias
// gradient's term of each element: the value, or in bf16 mode (round_bias,
// or stored as bf16) its bf16 rounding.
template <typename OutT>
struct RlnTail {
    RlnDrop d;
    OutT *d_branch;   // (N, C) written
    bool round_bias;  // bias terms rounded to bf16 (always so for bf16 storage)
    RP_FN void begin() { rln_resolve(d); }
    RP_FN float term_of(float v) const { return round_bias ? tp_bf16_round(v) : v; }
    RP_FN void group4(size_t at, int c0, const float (&v)[4], float (&term)[4]) const {
        uint32_t w[4] = {0, 0, 0, 0};
        if (d.on) rln_words(d, (d.first + at + c0) / 4, w);
        float o[4];
RP_UNROLL
        for (int e = 0; e < 4; e++) {
            o[e] = rp_fadd(0.0f, rln_drop(d, v[e], w[e]));
            term[e] = term_of(o[e]);
        }
        ln_st4(d_branch + at + c0, o);
    }
    RP_FN float one(size_t at, int c, float v) const {
        const float o = rp_fadd(0.0f, rln_drop(d, v, rln_word_of(d, at + c)));
        ln_st1(d_branch + at + c, o);
        return term_of(o);
    }
    // The term of element i read back from d_branch (the column kernel's).
    RP_FN float term(size_t i) const { return term_of(rp_ld_in(d_branch, i)); }
};

static inline RlnDrop rln_drop_of(uint64_t first, float p, uint64_t seed, uint64_t stream_id, const StepVars *step) {
    RlnDrop d;
    d.first = first;
    d.p = p;
    d.scale = dropout_scale(p);  // the CPU's expression (philox.h)
    d.key[0] = (uint32_t)seed;
    d.key[1] = (uint32_t)(seed >> 32);
    d.stream = stream_id;
    d.step = step;
    d.on = p > 0.0f;
    return d;
}

#endif
