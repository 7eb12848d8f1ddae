/* test_ln_rows.cc: the LayerNorm and residual + dropout + LayerNorm CUDA
 * kernels (kernels/cuda/layernorm.cu, residual_ln.cu) proven on the CPU,
 * where no GPU runs them. Their row, block and column-sum code lives in
 * layernorm_row.cuh, colsum.cuh and residual_ln_row.cuh, written in
 * row_prims.h's primitives; here it runs as written on an emulated block
 * (test/warp_emu.h: a thread per CUDA thread, the warp butterfly and
 * __syncthreads as barriers, shared memory all one bits), the float4 loads
 * and stores checked for their alignment, each fp32 operation rounded alone.
 * Grids are cut to two blocks, so the grid-stride loops run.
 *
 * Each shape runs every path the launchers may take for it (rows in
 * registers or read from memory, float4 or scalar loads, column sums in
 * shared memory or by the column kernel) and holds each to the CPU
 * reference (cpu_residual_ln_fwd / _bwd, cpu_layernorm_fwd / _bwd,
 * cpu_bias_bwd) with the op test's band (harness.h's SUM_RTOL of the
 * tensor's or the increment's largest magnitude): res_out bit for bit, y,
 * mean, rstd, d_res, dgamma, dbeta and the bias gradient within the band,
 * d_branch exactly the CPU's dropout backward of the kernel's own d_res.
 * The paths must agree bit for bit (the kernels' one order of sums), the
 * plain LayerNorm ops must give the fused ops' bits, y16 and d_branch16
 * must be the fp32 forms rounded, and the bf16 bias gradient (summed over
 * bf16 d_branch) the same bits in both its forms. */
#include <atomic>
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

/* ---- row_prims.h's primitives on the emulated block ------------------------------------------- */

static std::atomic<long> g_misaligned{0};  // vector accesses a GPU would fault on

#define RP_FN inline
#define RP_UNROLL
inline void rp_sync() { emu::sync(); }
inline double rp_warp_sum(double v) {  // cuda_kernel_util.cuh's butterfly
    for (int o = emu::WARP / 2; o > 0; o >>= 1) v += emu::shfl_xor(v, o);
    return v;
}
inline float rp_fadd(float a, float b) {
    volatile float r = a + b;  // rounded alone
    return r;
}
inline float rp_fsub(float a, float b) {
    volatile float r = a - b;
    return r;
}
inline float rp_fmul(float a, float b) {
    volatile float r = a * b;
    return r;
}
inline double rp_dfma(double a, double b, double c) { return fma(a, b, c); }
static inline void rp_align(const void *p, uintptr_t to) {
    if ((uintptr_t)p % to) g_misaligned++;
}
inline void rp_ld4(float (&v)[4], const float *p) {
    rp_align(p, 16);
    memcpy(v, p, sizeof v);
}
inline void rp_st4(float *p, const float (&v)[4]) {
    rp_align(p, 16);
    memcpy(p, v, sizeof v);
}
inline void rp_st4h(uint16_t *p, const uint16_t (&h)[4]) {
    rp_align(p, 8);
    memcpy(p, h, sizeof h);
}
inline float rp_ld_in(const float *x, size_t i) { return x[i]; }
inline float rp_ld_in(const uint16_t *x, size_t i) { return tp_bf16_to_f32(x[i]); }
inline uint64_t rp_step_stream(const StepVars *step, uint64_t id) { return step ? step->stream_base + id : id; }

#include "residual_ln_row.cuh"

static_assert(RP_WARP == emu::WARP, "one warp");

/* ---- the launches, emulated ---------------------------------------------------------------------- */

#define EMU_GRID 2         // blocks of a grid at most: fewer than the rows need, so blocks stride
#define EPS 1e-5f          // the model's LayerNorm epsilon (ops_fused.c's)
#define SUM_RTOL 1e-5      // test/backend_ops/harness.h's band for sums in another order
#define MIN_SIGNAL 1e-3    // and its floor for a compared tensor's scale

static int grid_of(int n) { return n < 1 ? 1 : (n < EMU_GRID ? n : EMU_GRID); }

template <int NJ, bool VEC, typename Src, typename OutT>
static void emu_fwd(const Src &src, OutT *y, float *mean, float *rstd, const float *gamma, const float *beta, int N,
                    int C) {
    const int grid = grid_of((N + LN_ROWS_PER_BLOCK - 1) / LN_ROWS_PER_BLOCK);
    for (int b = 0; b < grid; b++)
        emu::run_block(LN_THREADS, 0, [&](unsigned char *) {
            ln_fwd_block<NJ, VEC>(src, y, mean, rstd, gamma, beta, N, C, EPS, b, grid, emu::tid());
        });
}

/* pass 2 (colsum_final_block) over the sums with a destination (a block
 * without one returns at once: not run) */
static void emu_colsum_final(const ColsumPlanes &pl, int N, int C) {
    const int n_chunks = colsum_chunks(N);
    for (int bx = 0; bx < (C + COLSUM_COLS - 1) / COLSUM_COLS; bx++)
        for (int which = 0; which < COLSUM_MAX_SUMS; which++) {
            if (pl.dst[which] == NULL) continue;
            emu::run_block(COLSUM_COLS * COLSUM_FIN_ROWT, sizeof(double) * COLSUM_FIN_ROWT * COLSUM_COLS,
                           [&](unsigned char *smem) {
                               const int t = emu::tid();
                               colsum_final_block(pl, n_chunks, C, (double(*)[COLSUM_COLS])smem, bx, which,
                                                  t % COLSUM_COLS, t / COLSUM_COLS);
                           });
        }
}

/* ln_bwd_launch's sequence: the row blocks (with ACC their column sums),
 * else the column blocks, then pass 2. */
template <int NJ, bool VEC, bool ACC, typename Tail>
static void emu_bwd(const Tail &tail, const LnBwdRows &rows, const ColsumPlanes &pl, int n_sums, int N, int C) {
    const int n_chunks = colsum_chunks(N), grid = grid_of(n_chunks);
    for (int b = 0; b < grid; b++)
        emu::run_block(LN_THREADS, ACC ? ln_acc_bytes(NJ, n_sums) : 0, [&](unsigned char *smem) {
            ln_bwd_block<NJ, VEC, ACC>(tail, rows, pl, n_sums, n_chunks, N, C, (double *)smem, b, grid, emu::tid());
        });
    if (!ACC)
        for (int bx = 0; bx < (C + COLSUM_COLS - 1) / COLSUM_COLS; bx++)
            for (int by = 0; by < grid; by++)
                emu::run_block(COLSUM_COLS * COLSUM_STREAMS, sizeof(double) * 3 * COLSUM_STREAMS * COLSUM_COLS,
                               [&](unsigned char *smem) {
                                   const int t = emu::tid();
                                   ln_bwd_partial_block(tail, rows, pl, N, C,
                                                        (double(*)[COLSUM_STREAMS][COLSUM_COLS])smem, bx, by, grid,
                                                        t % COLSUM_COLS, t / COLSUM_COLS);
                               });
    emu_colsum_final(pl, N, C);
}

/* ---- device-like buffers and checks --------------------------------------------------------------- */

/* n values starting `offset` elements past a 64-byte aligned address. */
template <typename T>
struct Buf {
    std::vector<T> store;
    T *p;
    size_t n;
    Buf(size_t n_, int offset, T fill) : store(n_ + 64 / sizeof(T) + offset + 1, fill), n(n_) {
        p = (T *)(((uintptr_t)store.data() + 63) & ~(uintptr_t)63) + offset;
    }
    Buf(const float *src, size_t n_, int offset) : Buf(n_, offset, T()) { memcpy(p, src, n_ * sizeof(T)); }
    std::vector<T> get() const { return std::vector<T>(p, p + n); }
};

/* got within rtol of the largest |want - start| (start NULL: 0); NaN fails. */
static void check_band(const char *what, const char *name, const float *got, const float *want, const float *start,
                       size_t n) {
    double scale = 0.0, err = 0.0;
    size_t worst = 0;
    for (size_t i = 0; i < n; i++) {
        const double s = start ? start[i] : 0.0, dw = (double)want[i] - s, e = fabs((double)got[i] - (double)want[i]);
        scale = fmax(scale, fabs(dw));
        if (!(e <= err)) err = isnan(e) ? INFINITY : e, worst = i;
    }
    CHECK(scale >= MIN_SIGNAL, "%s %s: compared values all below %g", what, name, MIN_SIGNAL);
    CHECK(err <= SUM_RTOL * scale, "%s %s: error %.3g > %g * %.3g at [%zu]: got %.9g want %.9g", what, name, err,
          SUM_RTOL, scale, worst, n ? got[worst] : 0.0, n ? want[worst] : 0.0);
}

template <typename T>
static void check_same(const char *what, const char *name, const T *got, const T *want, size_t n) {
    size_t bad = 0, first = n;
    for (size_t i = 0; i < n; i++)
        if (memcmp(got + i, want + i, sizeof(T)) != 0) bad++, first = first < n ? first : i;
    CHECK(bad == 0, "%s %s: %zu of %zu differ, first [%zu]", what, name, bad, n, first);
}

/* ---- the shapes -------------------------------------------------------------------------------------- */

struct Case {
    const char *name;
    int N, C;
    float p;         // dropout (0: off)
    bool bias;
    uint64_t first;  // the mask window's start
    int offset;      // floats by which every tensor starts past an aligned address (not 0: scalar loads)
};

static const uint64_t SEED = 0x9234567890abcdefull, STREAM = 0x1234000000005ull;

struct Data {  // the inputs, and the CPU's forward (the backward's x, mean, rstd)
    std::vector<float> res_in, branch, bias, gamma, beta, dy, dres0, dg0, db0, dbias0;
    std::vector<float> res_out, y, mean, rstd;
};

struct Out {  // one path's outputs: forward (a, b: res_out, y) or backward (a, b: d_res, d_branch)
    std::vector<float> a, b, mean, rstd, dg, db, dbias;
    std::vector<uint16_t> b16;
};

static std::vector<float> randv(size_t n, Rng *rng) {
    float *r = rand_floats(n, rng, -1, 1);
    std::vector<float> v(r, r + n);
    free(r);
    return v;
}

/* The residual forward on one path (OutT uint16_t: y as bf16 bits) or, with plain, layernorm.cu's on res_out. */
template <int NJ, bool VEC, typename OutT>
static Out fwd_path(const Case &k, const Data &d, bool plain) {
    const int N = k.N, C = k.C, off = k.offset;
    const size_t nc = (size_t)N * C;
    Buf<float> ri(d.res_in.data(), nc, off), br(d.branch.data(), nc, off), bias(d.bias.data(), C, off);
    Buf<float> g(d.gamma.data(), C, off), be(d.beta.data(), C, off), ro(nc, off, NAN), y(nc, off, NAN);
    Buf<float> x(d.res_out.data(), nc, off);
    Buf<uint16_t> y16(nc, off, 0xffffu);
    Out o;
    o.mean.assign(N, NAN), o.rstd.assign(N, NAN);
    OutT *yp = (OutT *)(sizeof(OutT) == 2 ? (void *)y16.p : (void *)y.p);
    if (plain) {
        const LnSrcPlain src = {x.p};
        emu_fwd<NJ, VEC>(src, yp, o.mean.data(), o.rstd.data(), g.p, be.p, N, C);
    } else {
        const RlnSrc src = {rln_drop_of(k.first, k.p, SEED, STREAM, NULL), ro.p, ri.p, br.p, k.bias ? bias.p : NULL};
        emu_fwd<NJ, VEC>(src, yp, o.mean.data(), o.rstd.data(), g.p, be.p, N, C);
    }
    o.a = ro.get(), o.b = y.get(), o.b16 = y16.get();
    return o;
}

/* The residual backward on one path: d_branch fp32 (bias terms rounded with
 * round_bias) or, OutT uint16_t, bf16 bits; with plain, layernorm.cu's. */
template <int NJ, bool VEC, bool ACC, typename OutT>
static Out bwd_path(const Case &k, const Data &d, bool round_bias, bool plain) {
    const int N = k.N, C = k.C, off = k.offset, n_chunks = colsum_chunks(N);
    const size_t nc = (size_t)N * C, plane = (size_t)n_chunks * C;
    Buf<float> dy(d.dy.data(), nc, off), x(d.res_out.data(), nc, off), g(d.gamma.data(), C, off);
    Buf<float> dres(d.dres0.data(), nc, off), dbr(nc, off, NAN);
    Buf<uint16_t> dbr16(nc, off, 0xffffu);
    Out o;
    o.dg = d.dg0, o.db = d.db0, o.dbias = d.dbias0;
    std::vector<double> part(3 * plane, NAN);  // unwritten partials poison the sums
    const bool bias = k.bias && !plain;
    const ColsumPlanes pl = {{part.data(), part.data() + plane, part.data() + 2 * plane},
                             {o.dg.data(), o.db.data(), bias ? o.dbias.data() : NULL}};
    const LnBwdRows rows = {dres.p, dy.p, x.p, d.mean.data(), d.rstd.data(), g.p};
    const RlnDrop drop = rln_drop_of(k.first, k.p, SEED, STREAM, NULL);
    if (plain) {
        emu_bwd<NJ, VEC, ACC>(LnTailNone(), rows, pl, 2, N, C);
    } else if (sizeof(OutT) == 2) {
        const RlnTail<uint16_t> tail = {drop, dbr16.p, true};
        emu_bwd<NJ, VEC, ACC>(tail, rows, pl, bias ? 3 : 2, N, C);
    } else {
        const RlnTail<float> tail = {drop, dbr.p, round_bias};
        emu_bwd<NJ, VEC, ACC>(tail, rows, pl, bias ? 3 : 2, N, C);
    }
    o.a = dres.get(), o.b = dbr.get(), o.b16 = dbr16.get();
    return o;
}

/* Calls f(NJ, VEC) for every forward path of rows C wide: the groups the
 * launcher picks and 0 (rows read from memory), scalar and (vec) float4. */
template <typename F>
static void each_fwd_path(int C, bool vec, F f) {
    ln_dispatch_nj(ln_groups(C), [&](auto njc) {
        constexpr int NJ = decltype(njc)::value;
        const std::integral_constant<int, 0> zero;
        f(njc, std::false_type());
        if (vec) f(njc, std::true_type());
        if (NJ > 0) f(zero, std::false_type());
        if (NJ > 0 && vec) f(zero, std::true_type());
    });
}

static void check_fwd(const Case &k, const Data &d, const Out &o, const Out &first, const char *path) {
    const size_t nc = (size_t)k.N * k.C;
    char what[160];
    snprintf(what, sizeof what, "%s fwd %s", k.name, path);
    check_same(what, "res_out", o.a.data(), d.res_out.data(), nc);
    check_band(what, "y", o.b.data(), d.y.data(), NULL, nc);
    check_band(what, "mean", o.mean.data(), d.mean.data(), NULL, k.N);
    check_band(what, "rstd", o.rstd.data(), d.rstd.data(), NULL, k.N);
    check_same(what, "y (against the first path)", o.b.data(), first.b.data(), nc);
    check_same(what, "mean (against the first path)", o.mean.data(), first.mean.data(), k.N);
    check_same(what, "rstd (against the first path)", o.rstd.data(), first.rstd.data(), k.N);
}

/* Every forward path against the CPU; on the launcher's path also the y16
 * form (y rounded, the rest the same bits) and the plain op (the same bits). */
static void run_fwd(const Case &k, const Data &d) {
    const size_t nc = (size_t)k.N * k.C;
    const bool vec = k.C % 4 == 0 && k.offset == 0;
    Out first;
    bool have = false;
    each_fwd_path(k.C, vec, [&](auto njc, auto vc) {
        constexpr int NJ = decltype(njc)::value;
        constexpr bool VEC = decltype(vc)::value;
        const Out o = fwd_path<NJ, VEC, float>(k, d, false);
        if (!have) first = o, have = true;
        char path[64];
        snprintf(path, sizeof path, "NJ=%d %s", NJ, VEC ? "float4" : "scalar");
        check_fwd(k, d, o, first, path);
    });
    ln_dispatch_nj(ln_groups(k.C), [&](auto njc) {
        constexpr int NJ = decltype(njc)::value;
        const Out o16 = vec ? fwd_path<NJ, true, uint16_t>(k, d, false) : fwd_path<NJ, false, uint16_t>(k, d, false);
        const Out pl = vec ? fwd_path<NJ, true, float>(k, d, true) : fwd_path<NJ, false, float>(k, d, true);
        char what[160];
        snprintf(what, sizeof what, "%s fwd y16", k.name);
        std::vector<uint16_t> want16(nc);
        for (size_t i = 0; i < nc; i++) want16[i] = tp_f32_to_bf16(first.b[i]);
        check_same(what, "y16 (the fp32 y rounded)", o16.b16.data(), want16.data(), nc);
        check_same(what, "res_out", o16.a.data(), first.a.data(), nc);
        check_same(what, "mean", o16.mean.data(), first.mean.data(), k.N);
        check_same(what, "rstd", o16.rstd.data(), first.rstd.data(), k.N);
        snprintf(what, sizeof what, "%s layernorm fwd on res_out", k.name);
        check_same(what, "y (the fused op's)", pl.b.data(), first.b.data(), nc);
        check_same(what, "mean", pl.mean.data(), first.mean.data(), k.N);
        check_same(what, "rstd", pl.rstd.data(), first.rstd.data(), k.N);
    });
}

/* Calls f(NJ, VEC, ACC) for every backward path: each forward path with
 * the column kernel, and those holding the row in registers also with the
 * sums in shared memory. */
template <typename F>
static void each_bwd_path(int C, bool vec, F f) {
    each_fwd_path(C, vec, [&](auto njc, auto vc) {
        constexpr int NJ = decltype(njc)::value;
        if constexpr (NJ > 0) f(njc, vc, std::true_type());
        f(njc, vc, std::false_type());
    });
}

struct BwdRef {  // the CPU's backward: fp32, and the bias gradient over bf16 d_branch
    std::vector<float> dres, dbr, dg, db, dbias, dbias16;
};

static BwdRef bwd_reference(const Case &k, const Data &d) {
    const int N = k.N, C = k.C;
    const size_t nc = (size_t)N * C;
    BwdRef r = {d.dres0, std::vector<float>(nc, 0.0f), d.dg0, d.db0, d.dbias0, d.dbias0};
    cpu_residual_ln_bwd(r.dres.data(), r.dbr.data(), r.dg.data(), r.db.data(), k.bias ? r.dbias.data() : NULL,
                        d.dy.data(), d.res_out.data(), d.mean.data(), d.rstd.data(), d.gamma.data(), N, C, k.first,
                        k.p, SEED, STREAM);
    std::vector<float> dbr16(nc);
    for (size_t i = 0; i < nc; i++) dbr16[i] = tp_bf16_round(r.dbr[i]);
    cpu_bias_bwd(r.dbias16.data(), dbr16.data(), N, C);
    return r;
}

static void check_bwd(const Case &k, const Data &d, const BwdRef &r, const Out &o, const Out &first,
                      const char *path) {
    const size_t nc = (size_t)k.N * k.C;
    char what[160];
    snprintf(what, sizeof what, "%s bwd %s", k.name, path);
    check_band(what, "d_res", o.a.data(), r.dres.data(), d.dres0.data(), nc);
    std::vector<float> own(nc, 0.0f);  // d_branch: the mask applied to the kernel's own d_res
    cpu_dropout_bwd_at(own.data(), NULL, GRAD_ADD, o.a.data(), nc, k.first, k.p, SEED, STREAM);
    check_same(what, "d_branch (the CPU's dropout backward of d_res)", o.b.data(), own.data(), nc);
    check_band(what, "dgamma", o.dg.data(), r.dg.data(), d.dg0.data(), k.C);
    check_band(what, "dbeta", o.db.data(), r.db.data(), d.db0.data(), k.C);
    if (k.bias) check_band(what, "d_bias", o.dbias.data(), r.dbias.data(), d.dbias0.data(), k.C);
    else check_same(what, "d_bias (untouched)", o.dbias.data(), d.dbias0.data(), k.C);
    check_same(what, "d_res (against the first path)", o.a.data(), first.a.data(), nc);
    check_same(what, "dgamma (against the first path)", o.dg.data(), first.dg.data(), k.C);
    check_same(what, "dbeta (against the first path)", o.db.data(), first.db.data(), k.C);
    check_same(what, "d_bias (against the first path)", o.dbias.data(), first.dbias.data(), k.C);
}

/* Every backward path against the CPU; on the launcher's path also the
 * plain op (the fused op's d_res, dgamma, dbeta bits) and the bf16 forms. */
static void run_bwd(const Case &k, const Data &d) {
    const size_t nc = (size_t)k.N * k.C;
    const bool vec = k.C % 4 == 0 && k.offset == 0;
    const BwdRef r = bwd_reference(k, d);
    Out first;
    bool have = false;
    each_bwd_path(k.C, vec, [&](auto njc, auto vc, auto ac) {
        constexpr int NJ = decltype(njc)::value;
        constexpr bool VEC = decltype(vc)::value, ACC = decltype(ac)::value;
        const Out o = bwd_path<NJ, VEC, ACC, float>(k, d, false, false);
        if (!have) first = o, have = true;
        char path[64];
        snprintf(path, sizeof path, "NJ=%d %s %s", NJ, VEC ? "float4" : "scalar",
                 ACC ? "sums in shared memory" : "column kernel");
        check_bwd(k, d, r, o, first, path);
    });
    ln_dispatch_nj(ln_groups(k.C), [&](auto njc) {
        constexpr int NJ = decltype(njc)::value;
        constexpr bool ACC = NJ > 0;
        const Out pl = vec ? bwd_path<NJ, true, ACC, float>(k, d, false, true)
                           : bwd_path<NJ, false, ACC, float>(k, d, false, true);
        const Out rb = vec ? bwd_path<NJ, true, ACC, float>(k, d, true, false)
                           : bwd_path<NJ, false, ACC, float>(k, d, true, false);
        const Out o16 = vec ? bwd_path<NJ, true, ACC, uint16_t>(k, d, true, false)
                            : bwd_path<NJ, false, ACC, uint16_t>(k, d, true, false);
        char what[160];
        snprintf(what, sizeof what, "%s layernorm bwd", k.name);
        check_same(what, "dx (the fused op's d_res)", pl.a.data(), first.a.data(), nc);
        check_same(what, "dgamma", pl.dg.data(), first.dg.data(), k.C);
        check_same(what, "dbeta", pl.db.data(), first.db.data(), k.C);
        snprintf(what, sizeof what, "%s bwd bf16 forms", k.name);
        std::vector<uint16_t> want16(nc);
        for (size_t i = 0; i < nc; i++) want16[i] = tp_f32_to_bf16(rb.b[i]);
        check_same(what, "d_branch16 (the fp32 d_branch rounded)", o16.b16.data(), want16.data(), nc);
        check_same(what, "d_branch (rounded bias terms change nothing else)", rb.b.data(), first.b.data(), nc);
        check_same(what, "d_res", o16.a.data(), first.a.data(), nc);
        check_same(what, "dgamma", o16.dg.data(), first.dg.data(), k.C);
        check_same(what, "dbeta", o16.db.data(), first.db.data(), k.C);
        check_same(what, "d_bias (both bf16 forms)", o16.dbias.data(), rb.dbias.data(), k.C);
        if (k.bias) check_band(what, "d_bias over bf16 d_branch", rb.dbias.data(), r.dbias16.data(), d.dbias0.data(), k.C);
    });
}

static Data make_data(const Case &k, Rng *rng) {
    const int N = k.N, C = k.C;
    const size_t nc = (size_t)N * C;
    Data d;
    d.res_in = randv(nc, rng), d.branch = randv(nc, rng), d.bias = randv(C, rng), d.gamma = randv(C, rng);
    d.beta = randv(C, rng), d.dy = randv(nc, rng), d.dres0 = randv(nc, rng), d.dg0 = randv(C, rng);
    d.db0 = randv(C, rng), d.dbias0 = randv(C, rng);
    d.res_out.assign(nc, NAN), d.y.assign(nc, NAN), d.mean.assign(N, NAN), d.rstd.assign(N, NAN);
    cpu_residual_ln_fwd(d.res_out.data(), d.y.data(), d.mean.data(), d.rstd.data(), d.res_in.data(),
                        d.branch.data(), k.bias ? d.bias.data() : NULL, d.gamma.data(), d.beta.data(), N, C, EPS,
                        k.first, k.p, SEED, STREAM);
    return d;
}

int main(void) {
    Rng rng = {20261129};
    /* layernorm_row.cuh's paths: a lane holds 128-column groups; float4
     * loads where C % 4 == 0 and the pointers are aligned; rows past 1024
     * read from memory; a chunk of column sums is 64 rows */
    static const Case cases[] = {
        {"d_model 512, float4, two chunks", 70, 512, 0.1f, true, 0, 0},
        {"d_model 512 misaligned by 3 floats: scalar", 12, 512, 0.1f, true, 4, 3},
        {"C 300 (partial groups), no bias", 20, 300, 0.1f, false, 96, 0},
        {"C 301 odd: scalar, words across row ends", 10, 301, 0.5f, true, 0, 0},
        {"C 1028 wider than the registers, float4, dropout off", 9, 1028, 0.0f, false, 0, 0},
        {"C 1030 wider, C % 4 = 2", 9, 1030, 0.1f, true, 8, 0},
        {"C 64, 200 rows: four chunks, a block takes two, dropout off", 200, 64, 0.0f, true, 0, 0},
    };
    for (const Case &k : cases) {
        const Data d = make_data(k, &rng);
        run_fwd(k, d);
        run_bwd(k, d);
    }
    CHECK(g_misaligned == 0, "%ld float4 / ushort4 accesses misaligned", (long)g_misaligned);
    return check_report("test_ln_rows");
}
