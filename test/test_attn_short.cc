/* test_attn_short.cc: the short-sequence flash attention kernels
 * (kernels/cuda/attention_short.cu) proven on the CPU, where no GPU runs
 * them. Their block and warp code lives in kernels/cuda/flash_core.h,
 * written for the device and the host; here it runs as written, each block's
 * 128 threads as host threads (test/warp_emu.h), over an emulated warp:
 *   - mma.sync m16n8k16 (.bf16, fp32 accumulate) built from the PTX ISA's
 *     fragment tables alone (which lane and register holds A(row, k),
 *     B(k, col) and C(row, col)), independently of the kernels' loads;
 *   - __shfl_xor_sync and __syncthreads as barriers over the warp's and the
 *     block's threads.
 * A wrong fragment index, mask, chunk bound, shared-memory offset or phase
 * order then shows as it would on a GPU. Each shape (cross and causal,
 * ragged lengths, a batch without keys, every head width and both register
 * sizes the kernels instantiate) is held to the CPU reference
 * (cpu_attention_flash_fwd / _bwd) with the op test's GPU tolerances: out
 * and the gradients within 2^-7 of each tensor's largest value, lse within
 * 1e-5 relative, delta within 1e-4; written gradients equal to added ones
 * into zeros bit for bit, those written as bf16 bits (dq16, dk16, dv16) the
 * written fp32 ones rounded, exactly, and padding keys' dk and dv rows
 * zeros. */
#include <vector>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "check.h"
#include "warp_emu.h"

extern "C" {  // C headers without guards of their own
#include "cpu_ops.h"
#include "testrng.h"
}

/* ---- the emulated device (warp_emu.h) and its mma.sync ---------------------------------------- */

namespace mma {

inline float half(uint32_t reg, int hi) { return tp_bf16_to_f32((uint16_t)(hi ? reg >> 16 : reg & 0xffffu)); }

/* A lane's posted words: a0..a3, b0, b1. PTX ISA, mma.m16n8k16 with .bf16:
 * a_i (i = 0..7, register i / 2, half i & 1) sits at row groupID for i in
 * {0, 1, 4, 5}, groupID + 8 otherwise, column 2 threadID_in_group + (i & 1),
 * + 8 for i >= 4; lane = 4 groupID + threadID_in_group. */
inline float a_at(const emu::Warp &w, int row, int k) {
    const int lane = 4 * (row % 8) + (k % 8) / 2, i = (row >= 8 ? 2 : 0) + (k >= 8 ? 4 : 0) + (k & 1);
    return half(w.words[lane][i / 2], i & 1);
}
/* b_i (i = 0..3, register i / 2, half i & 1) at row 2 threadID_in_group +
 * (i & 1), + 8 for i >= 2, column groupID. */
inline float b_at(const emu::Warp &w, int k, int col) {
    const int lane = 4 * col + (k % 8) / 2, i = (k >= 8 ? 2 : 0) + (k & 1);
    return half(w.words[lane][4 + i / 2], i & 1);
}

}  // namespace mma

#define SC_FN inline
inline int sc_tid() { return emu::tid(); }
inline void sc_sync() { emu::sync(); }
inline float sc_xor(float x, int m) { return emu::shfl_xor(x, m); }
inline float sc_mul(float a, float b) {
    volatile float r = a * b;  // rounded alone
    return r;
}
/* c_i (i = 0..3) at row groupID (+ 8 for i >= 2), column 2
 * threadID_in_group + (i & 1): each lane its four sums over k. */
inline void sc_mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    const uint32_t regs[6] = {a[0], a[1], a[2], a[3], b0, b1};
    emu::exchange_begin(regs, sizeof regs);
    const emu::Warp &w = emu::warp();
    const int lane = emu::lane(), g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 4; i++) {
        const int row = g + 8 * (i / 2), col = 2 * t + (i & 1);
        float acc = 0.0f;
        for (int k = 0; k < 16; k++) acc += mma::a_at(w, row, k) * mma::b_at(w, k, col);
        c[i] += acc;
    }
    emu::exchange_end();
}
inline uint32_t sc_ld32(const uint16_t *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}
inline void sc_st32(uint16_t *p, uint32_t v) { memcpy(p, &v, sizeof v); }
inline void sc_copy16(uint16_t *d, const uint16_t *s) { memcpy(d, s, 16); }
inline void sc_zero16(uint16_t *d) { memset(d, 0, 16); }

#include "flash_core.h"

static_assert(SC_WARP == emu::WARP && SC_THREADS % SC_WARP == 0, "the emulated block is the kernels' block");

/* One block's body on SC_THREADS host threads. */
template <class Body>
static void run_block(size_t smem_bytes, Body body) {
    emu::run_block(SC_THREADS, smem_bytes, body);
}

/* ---- the shapes against the reference --------------------------------------------------------- */

#define OUT_RTOL 0x1p-7  /* test/backend_ops/ops_flash.c's FLASH_GPU_RTOL */
#define LSE_RTOL 1e-5    /* its FLASH_LSE_TOL */
#define DELTA_RTOL 1e-4  /* a sum of Tk products in another order */

struct Shape {
    const char *name;
    std::vector<int32_t> k_len;
    int H, Tq, Tk, D;
    bool causal;
};

/* got within rtol of the tensor's largest |want|; NaN anywhere fails. */
static void check_scaled(const char *what, const Shape &s, const float *got, const float *want, size_t n,
                         double rtol) {
    double scale = 0.0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs((double)want[i]));
    size_t bad = 0, first = n;
    for (size_t i = 0; i < n; i++)
        if (!(fabs((double)got[i] - (double)want[i]) <= rtol * scale + 1e-30)) {
            if (first == n) first = i;
            bad++;
        }
    CHECK(bad == 0, "%s %s: %zu of %zu beyond %g of %g, first [%zu]: got %.9g want %.9g", what, s.name, bad, n, rtol,
          scale, first, first < n ? got[first] : 0.0, first < n ? want[first] : 0.0);
}

static std::vector<uint16_t> bf16_bits(const float *x, size_t n) {
    std::vector<uint16_t> b(n);
    for (size_t i = 0; i < n; i++) b[i] = tp_f32_to_bf16(x[i]);
    return b;
}

template <int D, int C>
static void run_shape(const Shape &s, Rng *rng) {
    const int B = (int)s.k_len.size(), H = s.H, Tq = s.Tq, Tk = s.Tk;
    const size_t HD = (size_t)H * D, nq = (size_t)B * Tq * HD, nk = (size_t)B * Tk * HD, nl = (size_t)B * H * Tq;
    float *raw[4] = {rand_floats(nq, rng, -1, 1), rand_floats(nk, rng, -1, 1), rand_floats(nk, rng, -1, 1),
                     rand_floats(nq, rng, -1, 1)};
    std::vector<uint16_t> q16 = bf16_bits(raw[0], nq), k16 = bf16_bits(raw[1], nk), v16 = bf16_bits(raw[2], nk);
    std::vector<float> q(nq), k(nk), v(nk), dout(raw[3], raw[3] + nq);
    for (size_t i = 0; i < nq; i++) q[i] = tp_bf16_to_f32(q16[i]);
    for (size_t i = 0; i < nk; i++) k[i] = tp_bf16_to_f32(k16[i]), v[i] = tp_bf16_to_f32(v16[i]);
    for (int i = 0; i < 4; i++) free(raw[i]);

    // the reference: out, lse; the written gradients and delta
    std::vector<float> work(cpu_attention_flash_work(Tq, Tk, D) + 1);
    std::vector<uint16_t> ref_out16(nq);
    std::vector<float> ref_lse(nl), ref_dq(nq), ref_dk(nk), ref_dv(nk), ref_delta(nl);
    cpu_attention_flash_fwd(ref_out16.data(), ref_lse.data(), q.data(), k.data(), v.data(), s.k_len.data(), B, H, Tq,
                            Tk, D, s.causal, work.data());
    cpu_attention_flash_bwd(ref_dq.data(), ref_dk.data(), ref_dv.data(), GRAD_WRITE, dout.data(), ref_lse.data(),
                            q.data(), k.data(), v.data(), s.k_len.data(), ref_delta.data(), B, H, Tq, Tk, D, s.causal,
                            work.data());

    const FlashArgs a = {q16.data(), k16.data(), v16.data(), s.k_len.data(), B, H, Tq, Tk, s.causal,
                         1.0f / sqrtf((float)D)};
    std::vector<uint16_t> out16(nq, 0xffffu);  // a NaN where nothing was stored
    std::vector<float> lse(nl, NAN);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            run_block(fwd_smem(D, Tk),
                      [&](unsigned char *smem) { short_fwd_block<D, C>(a, smem, b, h, out16.data(), lse.data()); });
    std::vector<float> out(nq), ref_out(nq);
    for (size_t i = 0; i < nq; i++) out[i] = tp_bf16_to_f32(out16[i]), ref_out[i] = tp_bf16_to_f32(ref_out16[i]);
    check_scaled("out", s, out.data(), ref_out.data(), nq, OUT_RTOL);
    size_t lse_bad = 0;
    for (size_t i = 0; i < nl; i++)
        lse_bad += isinf(ref_lse[i]) ? !(isinf(lse[i]) && lse[i] < 0)
                                     : !(fabsf(lse[i] - ref_lse[i]) <= LSE_RTOL * (1 + fabsf(ref_lse[i])));
    CHECK(lse_bad == 0, "lse %s: %zu of %zu rows off", s.name, lse_bad, nl);

    // backward from the reference's lse: written over NaN, then added into zeros
    std::vector<float> g_put[3] = {std::vector<float>(nq, NAN), std::vector<float>(nk, NAN),
                                   std::vector<float>(nk, NAN)};
    std::vector<float> g_add[3] = {std::vector<float>(nq, 0.0f), std::vector<float>(nk, 0.0f),
                                   std::vector<float>(nk, 0.0f)};
    std::vector<uint16_t> g16[3] = {std::vector<uint16_t>(nq, 0xffffu), std::vector<uint16_t>(nk, 0xffffu),
                                    std::vector<uint16_t>(nk, 0xffffu)};
    std::vector<float> delta(nl, NAN);
    for (int pass = 0; pass < 3; pass++) {  // written, added into zeros, written as bf16
        std::vector<float> *g = pass == 1 ? g_add : g_put;
        const FlashGrads gr = pass == 2 ? FlashGrads{NULL, NULL, NULL, g16[0].data(), g16[1].data(), g16[2].data()}
                                        : FlashGrads{g[0].data(), g[1].data(), g[2].data(), NULL, NULL, NULL};
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++)
                run_block(bwd_smem(D, Tq, Tk), [&](unsigned char *smem) {
                    short_bwd_block<D, C>(a, smem, b, h, dout.data(), ref_lse.data(), delta.data(), gr, pass == 1);
                });
    }
    check_scaled("delta", s, delta.data(), ref_delta.data(), nl, DELTA_RTOL);
    const char *names[3] = {"dq", "dk", "dv"};
    const std::vector<float> *ref[3] = {&ref_dq, &ref_dk, &ref_dv};
    for (int i = 0; i < 3; i++) {
        check_scaled(names[i], s, g_put[i].data(), ref[i]->data(), g_put[i].size(), OUT_RTOL);
        CHECK(memcmp(g_put[i].data(), g_add[i].data(), g_put[i].size() * sizeof(float)) == 0,
              "%s %s: written differs from added into zeros", names[i], s.name);
        size_t off16 = 0;
        for (size_t e = 0; e < g_put[i].size(); e++) off16 += g16[i][e] != tp_f32_to_bf16(g_put[i][e]);
        CHECK(off16 == 0, "%s %s: %zu bf16 values not the written fp32 rounded", names[i], s.name, off16);
    }
    size_t pad_nonzero = 0;
    for (int b = 0; b < B; b++)
        for (size_t e = (size_t)(s.k_len[b] < Tk ? (s.k_len[b] > 0 ? s.k_len[b] : 0) : Tk) * HD; e < (size_t)Tk * HD;
             e++)
            pad_nonzero += (g_put[1][(size_t)b * Tk * HD + e] != 0.0f) + (g_put[2][(size_t)b * Tk * HD + e] != 0.0f);
    CHECK(pad_nonzero == 0, "%s: %zu elements of padding keys' dk or dv rows nonzero", s.name, pad_nonzero);
}

int main(void) {
    Rng rng = {20261128};
    // C = 4: registers for 64 keys (attention_short.cu's SHORT_BY_SHAPE takes it up to 64)
    run_shape<16, 4>({"cross Tq5 Tk7 D16 (no keys in batch 1)", {4, 0}, 3, 5, 7, 16, false}, &rng);
    run_shape<64, 4>({"Tq=Tk=32 D64", {32, 20}, 2, 32, 32, 64, false}, &rng);
    run_shape<64, 4>({"causal Tq=Tk=33 D64", {33, 7}, 1, 33, 33, 64, true}, &rng);
    run_shape<32, 4>({"causal Tq=Tk=64 D32 (four query tiles)", {64, 41}, 1, 64, 64, 32, true},
                     &rng);
    run_shape<128, 4>({"cross Tq20 Tk40 D128", {40, 23}, 1, 20, 40, 128, false}, &rng);
    // C = 8: up to 128
    run_shape<32, 8>({"causal Tq=Tk=70 D32 (warp 0 takes a second tile)", {70, 41}, 1, 70, 70, 32, true}, &rng);
    run_shape<64, 8>({"cross Tq17 Tk100 D64", {100, 57, 1}, 1, 17, 100, 64, false}, &rng);
    run_shape<16, 8>({"causal Tq=Tk=128 D16", {128}, 1, 128, 128, 16, true}, &rng);
    return check_report("test_attn_short");
}
