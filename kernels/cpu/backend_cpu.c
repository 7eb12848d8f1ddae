/* backend_cpu.c: the CPU backend: the fp32 reference ops (cpu_ops.h) in the
 * table, host memory as "device" memory, copies as memcpy.
 *
 * bf16 mode emulates the GPU's mixed precision at the same points: the
 * operands of gemm and the linear layers are rounded to bf16 (round to
 * nearest even) in the workspace arena and multiplied with fp32
 * accumulation; biases, bias gradients and everything else stay fp32. A
 * CPU run in bf16 therefore shows what the rounding does to training
 * without a GPU. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "backend.h"
#include "bf16.h"
#include "clock.h"
#include "cpu_ops.h"
#include "err.h"
#include "graph_record.h"

/* Every buffer comes zeroed and 64-byte aligned, its size rounded up to 64
 * bytes, straight from the kernel's zero pages rather than written with
 * zeros: calloc for small ones, and for large ones an anonymous mapping on
 * 2 MiB boundaries marked for transparent huge pages, so that first
 * touching a parameter, gradient or moment buffer costs one fault per
 * 2 MiB, not per 4 KiB (faults dominated a CPU run's first step). Either
 * way the pages are only faulted in where they are used. The word pair
 * before the returned pointer holds what cpu_dev_free needs: calloc's
 * pointer, or the mapping and its length. */
#define CPU_ALIGN ((size_t)64)
#define CPU_HUGE ((size_t)2 << 20)
#define CPU_MAP_MIN ((size_t)4 << 20)  // from here, a mapping of its own
typedef struct { void *raw; size_t map_len; } CpuBlock;  // map_len 0: calloc's
/* Under AddressSanitizer every buffer is its own heap block of exactly the
 * rounded size, so a read or write past its end is reported (a mapping or
 * a block with a header and slack would hide it). */
#if defined(__SANITIZE_ADDRESS__)
#define CPU_EXACT_BLOCKS 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CPU_EXACT_BLOCKS 1
#endif
#endif
static void *cpu_dev_alloc(Backend *be, size_t n_bytes) {
    (void)be;
    const size_t rounded = (n_bytes + CPU_ALIGN - 1) & ~(CPU_ALIGN - 1);
    if (rounded < n_bytes || rounded > SIZE_MAX / 2) return NULL;
#ifdef CPU_EXACT_BLOCKS
    void *exact = NULL;
    if (posix_memalign(&exact, CPU_ALIGN, rounded ? rounded : CPU_ALIGN)) return NULL;
    memset(exact, 0, rounded);
    return exact;
#endif
    CpuBlock *p;
    if (rounded >= CPU_MAP_MIN) {
        const size_t len = rounded + 2 * CPU_HUGE;  // room for the header and both alignments
        char *raw = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (raw == MAP_FAILED) return NULL;
        char *start = (char *)(((uintptr_t)raw + CPU_HUGE - 1) & ~(uintptr_t)(CPU_HUGE - 1));
        if (start - raw < (ptrdiff_t)CPU_ALIGN) start += CPU_HUGE;
        (void)madvise(start, (rounded + CPU_HUGE - 1) & ~(CPU_HUGE - 1), MADV_HUGEPAGE);  // advice only
        p = (CpuBlock *)start;
        p[-1] = (CpuBlock){.raw = raw, .map_len = len};
        return p;
    }
    char *raw = calloc(1, rounded + 2 * CPU_ALIGN);
    if (!raw) return NULL;
    p = (CpuBlock *)(((uintptr_t)raw + sizeof(CpuBlock) + CPU_ALIGN - 1) & ~(uintptr_t)(CPU_ALIGN - 1));
    p[-1] = (CpuBlock){.raw = raw, .map_len = 0};
    return p;
}
static void cpu_dev_free(Backend *be, void *p) {
    (void)be;
    if (!p) return;
#ifdef CPU_EXACT_BLOCKS
    free(p);
    return;
#endif
    const CpuBlock b = ((CpuBlock *)p)[-1];
    if (b.map_len) munmap(b.raw, b.map_len);
    else free(b.raw);
}
static void cpu_upload(Backend *be, void *dst, const void *src, size_t n) { (void)be; if (dst != src) memcpy(dst, src, n); }
static void cpu_download(Backend *be, void *dst, const void *src, size_t n) { (void)be; if (dst != src) memcpy(dst, src, n); }
static void cpu_sync(Backend *be) { (void)be; }
/* Host memory is all the CPU has: "page-locked" is plain here (never asked
 * for by the trainer: backend_comm_copy gives no hooks on a host backend). */
static void *cpu_host_alloc(Backend *be, size_t n_bytes) { return cpu_dev_alloc(be, n_bytes); }
static void cpu_host_free(Backend *be, void *p) { cpu_dev_free(be, p); }
static void *cpu_stream(Backend *be) { (void)be; return NULL; }
static bool cpu_device_used(Backend *be, size_t *used_bytes) {
    (void)be;
    *used_bytes = 0;
    return false;
}
static void cpu_recast(Backend *be, void *c, const float *m, size_t n) {  // never called: no copies on the CPU
    (void)be, (void)c, (void)m, (void)n;
}
static void cpu_destroy(Backend *be) { free(be); }

/* The table's op entries, t_<name>, declared from ops_list.h: a definition
 * below that differs from its entry does not compile. */
#define OP(name, cls, cpu, cuda, params, args) static void t_##name TP_OP_WITH_BE params;
#include "ops_list.h"

/* The StepVars' values where they are set (backend.h; host memory here),
 * read as the op runs: in a graph's replay too. */
static uint64_t step_stream(const Backend *be, uint64_t stream_id) {
    return be->step_vars ? be->step_vars->stream_base + stream_id : stream_id;
}
static float step_scale(const Backend *be, float dloss) { return be->step_vars ? be->step_vars->loss_scale : dloss; }

/* ---- bf16 emulation of the GEMM operands ---------------------------------------- */

static const float *rounded(const float *x, size_t n, float *dst) {
    for (size_t i = 0; i < n; i++) dst[i] = tp_bf16_round(x[i]);
    return dst;
}

static float *operand_space(Backend *be, size_t n_elems) {
    return backend_workspace(be, n_elems * sizeof(float));
}

static void t_gemm(Backend *be, bool ta, bool tb, int M, int N, int K, float alpha, const float *A, const float *B,
                   float beta, float *C) {
    if (be->dtype == DTYPE_BF16) {
        const size_t nA = (size_t)M * K, nB = (size_t)K * N;
        float *ws = operand_space(be, nA + nB);
        A = rounded(A, nA, ws);
        B = rounded(B, nB, ws + nA);
    }
    cpu_gemm(ta, tb, M, N, K, alpha, A, B, beta, C);
}

/* The forward's operands as the GEMM multiplies them, in the workspace
 * after its first `skip` floats: x (fp32, or x16 widened), W and the bias
 * (or NULL), rounded to bf16 in bf16 mode, the bias as its weight is
 * (autocast's rule; x16 needs no rounding: it is bf16 already). */
static void fwd_operands(Backend *be, size_t skip, const float **x, const uint16_t *x16, const float **W,
                         const float **b, int N, int in, int out) {
    const size_t nx = (size_t)N * in, nW = (size_t)out * in, nb = *b ? (size_t)out : 0;
    const bool bf16 = be->dtype == DTYPE_BF16;
    if (!bf16 && !x16) return;
    float *ws = operand_space(be, skip + nx + nW + nb) + skip;
    if (x16) cpu_from_bf16(ws, x16, nx);
    else rounded(*x, nx, ws);
    *x = ws;
    if (!bf16) return;
    *W = rounded(*W, nW, ws + nx);
    if (*b) *b = rounded(*b, nb, ws + nx + nW);
}

static void t_linear_fwd(Backend *be, float *y, const float *x, const float *W, const float *b, int N, int in,
                         int out) {
    fwd_operands(be, 0, &x, NULL, &W, &b, N, in, out);
    cpu_linear_fwd(y, x, W, b, N, in, out);
}

/* linear_bwd with its operands in the workspace after `skip` floats. */
static void linear_bwd_at(Backend *be, size_t skip, float *dx, GradMode dx_mode, float *dW, float *db,
                          const float *dy, const float *x, const float *W, int N, int in, int out) {
    if (be->dtype == DTYPE_BF16) {
        const size_t ndy = (size_t)N * out, nx = (size_t)N * in, nW = (size_t)out * in;
        float *ws = operand_space(be, skip + ndy + nx + nW) + skip;
        dy = rounded(dy, ndy, ws);
        if (dW) x = rounded(x, nx, ws + ndy);
        if (dx) W = rounded(W, nW, ws + ndy + nx);
    }
    cpu_linear_bwd(dx, dx_mode, dW, db, dy, x, W, N, in, out);  // db: the sum of dy as the GEMMs read it
}
static void t_linear_bwd(Backend *be, float *dx, GradMode dx_mode, float *dW, float *db, const float *dy,
                         const float *x, const float *W, int N, int in, int out) {
    linear_bwd_at(be, 0, dx, dx_mode, dW, db, dy, x, W, N, in, out);
}

/* x16 widened into the workspace, after its first `skip` floats and before
 * room for `also` more. */
static const float *widened_at(Backend *be, size_t skip, const uint16_t *x16, size_t n, size_t also, float **rest) {
    float *ws = operand_space(be, skip + n + also) + skip;
    cpu_from_bf16(ws, x16, n);
    *rest = ws + n;
    return ws;
}
static const float *widened(Backend *be, const uint16_t *x16, size_t n, size_t also, float **rest) {
    return widened_at(be, 0, x16, n, also, rest);
}

static void t_linear_fwd_x16(Backend *be, float *y, const uint16_t *x16, const float *W, const float *b, int N,
                             int in, int out) {
    const float *x = NULL;
    fwd_operands(be, 0, &x, x16, &W, &b, N, in, out);
    cpu_linear_fwd(y, x, W, b, N, in, out);
}

/* linear_bwd_x16 with its operands in the workspace after `skip` floats;
 * the floats it takes there after them (linear_bwd_x16_floats). */
static size_t linear_bwd_x16_floats(const Backend *be, bool want_dW, int N, int in, int out) {
    const size_t ndy = (size_t)N * out, nx = want_dW ? (size_t)N * in : 0, nW = (size_t)out * in;
    return nx + (be->dtype == DTYPE_BF16 ? ndy + nW : 0);
}
static void linear_bwd_x16_at(Backend *be, size_t skip, float *dx, GradMode dx_mode, float *dW, float *db,
                              const float *dy, const uint16_t *x16, const float *W, int N, int in, int out) {
    const size_t ndy = (size_t)N * out, nx = dW ? (size_t)N * in : 0, nW = (size_t)out * in;
    const bool bf16 = be->dtype == DTYPE_BF16;
    float *rest = NULL;
    const float *x = widened_at(be, skip, x16, nx, bf16 ? ndy + nW : 0, &rest);
    if (bf16) {
        dy = rounded(dy, ndy, rest);
        if (dx) W = rounded(W, nW, rest + ndy);
    }
    cpu_linear_bwd(dx, dx_mode, dW, db, dy, dW ? x : NULL, W, N, in, out);  // db: the sum of dy as the GEMMs read it
}

static void t_linear_bwd_x16(Backend *be, float *dx, GradMode dx_mode, float *dW, float *db, const float *dy,
                             const uint16_t *x16, const float *W, int N, int in, int out) {
    linear_bwd_x16_at(be, 0, dx, dx_mode, dW, db, dy, x16, W, N, in, out);
}

/* The masked dy at the workspace's start, linear_bwd_x16's operands after
 * it (the whole room asked for first: the arena never moves in between). */
static void t_linear_bwd_relu_x16(Backend *be, float *dx, GradMode dx_mode, float *dW, float *db, const float *dy,
                                  const uint16_t *relu16, const uint16_t *x16, const float *W, int N, int in,
                                  int out) {
    const size_t n = (size_t)(N > 0 ? N : 0) * (size_t)(out > 0 ? out : 0);
    float *masked = operand_space(be, n + linear_bwd_x16_floats(be, dW != NULL, N, in, out));
    cpu_act_bwd_x16(masked, GRAD_WRITE, dy, relu16, n, ACT_RELU);
    linear_bwd_x16_at(be, n, dx, dx_mode, dW, db, masked, x16, W, N, in, out);
}

/* The workspace: [dy widened and masked | dx in fp32 | the operands], the
 * whole asked for first (the arena never moves in between). */
static void t_linear_bwd16(Backend *be, float *dx, uint16_t *dx16, GradMode dx_mode, float *dW, float *db,
                           const float *dy, const uint16_t *dy16, const uint16_t *relu16, const float *x,
                           const uint16_t *x16, const float *W, int N, int in, int out) {
    TP_CHECK((dy == NULL) != (dy16 == NULL), "op_linear_bwd16: give exactly one of dy and dy16");
    TP_CHECK(!(x && x16), "op_linear_bwd16: give at most one of x and x16");
    TP_CHECK(!(dx && dx16), "op_linear_bwd16: give at most one of dx and dx16");
    TP_CHECK(!dx16 || dx_mode == GRAD_WRITE, "op_linear_bwd16: dx16 is written (GRAD_WRITE), not accumulated");
    TP_CHECK(!dW || x || x16 || N <= 0 || in <= 0 || out <= 0, "op_linear_bwd16: dW wanted but x is NULL");
    if (N <= 0 || out < 0 || in < 0) return;
    const size_t ndy = (size_t)N * out, nx = (size_t)N * in, nW = (size_t)out * in;
    const size_t n_dy = dy16 || relu16 ? ndy : 0, n_dx = dx16 ? nx : 0;
    float *ws = operand_space(be, n_dy + n_dx + ndy + nx + nW);
    if (dy16) cpu_from_bf16(ws, dy16, ndy);
    if (relu16) cpu_act_bwd_x16(ws, GRAD_WRITE, dy16 ? ws : dy, relu16, ndy, ACT_RELU);
    if (n_dy) dy = ws;
    float *dxf = dx16 ? ws + n_dy : dx;
    if (x16) linear_bwd_x16_at(be, n_dy + n_dx, dxf, dx_mode, dW, db, dy, x16, W, N, in, out);
    else linear_bwd_at(be, n_dy + n_dx, dxf, dx_mode, dW, db, dy, x, W, N, in, out);
    if (dx16) cpu_to_bf16(dx16, dxf, nx);
}

/* linear_fwd16's fp32 product (N, out) into tmp, or with tmp NULL into the
 * workspace, ahead of the operands; returns where it went. */
static float *linear_fwd16_product(Backend *be, const char *op, float *tmp, const float *x, const uint16_t *x16,
                                   const float *W, const float *b, int N, int in, int out) {
    TP_CHECK((x == NULL) != (x16 == NULL), "%s: give exactly one of x and x16", op);
    const size_t n = (size_t)(N > 0 ? N : 0) * (size_t)(out > 0 ? out : 0);
    const size_t skip = tmp ? 0 : n;
    if (!tmp) tmp = operand_space(be, n + (size_t)N * in + (size_t)out * in + (b ? (size_t)out : 0));
    fwd_operands(be, skip, &x, x16, &W, &b, N, in, out);
    cpu_linear_fwd(tmp, x, W, b, N, in, out);
    return tmp;
}

static void t_linear_fwd16(Backend *be, uint16_t *y16, float *tmp, const float *x, const uint16_t *x16,
                           const float *W, const float *b, bool relu, int N, int in, int out) {
    tmp = linear_fwd16_product(be, "op_linear_fwd16", tmp, x, x16, W, b, N, in, out);
    const size_t n = (size_t)(N > 0 ? N : 0) * (size_t)(out > 0 ? out : 0);
    if (relu) cpu_act_fwd16(y16, tmp, n, ACT_RELU);
    else cpu_to_bf16(y16, tmp, n);
}

/* linear_fwd16 with relu, the mask from the same fp32 pre-activation. */
static void t_linear_relu_fwd16(Backend *be, uint16_t *y16, float *tmp, uint8_t *mask, const float *x,
                                const uint16_t *x16, const float *W, const float *b, int N, int in, int out) {
    TP_CHECK(mask || N <= 0 || out <= 0, "op_linear_relu_fwd16: mask is NULL");
    tmp = linear_fwd16_product(be, "op_linear_relu_fwd16", tmp, x, x16, W, b, N, in, out);
    const size_t n = (size_t)(N > 0 ? N : 0) * (size_t)(out > 0 ? out : 0);
    cpu_act_fwd16(y16, tmp, n, ACT_RELU);
    if (n) cpu_relu_mask(mask, tmp, N, out);
}

/* linear_bwd16 writing dh16, the mask, then dh16's column sums (bias_bwd's,
 * in the workspace the GEMMs are done with). */
static void t_linear_bwd16_drelu(Backend *be, uint16_t *dh16, float *dW, float *db, float *db_h, const float *dy,
                                 const uint16_t *dy16, const uint8_t *mask, const uint16_t *x16, const float *W,
                                 int N, int in, int out) {
    TP_CHECK(N <= 0 || in <= 0 || (dh16 && db_h && mask && x16), "op_linear_bwd16_drelu: NULL dh16, db_h, mask or x16");
    t_linear_bwd16(be, NULL, dh16, GRAD_WRITE, dW, db, dy, dy16, NULL, NULL, x16, W, N, in, out);
    if (N <= 0 || in <= 0) return;
    const size_t nh = (size_t)N * in;
    cpu_relu_mask_apply(dh16, mask, N, in);
    float *h = operand_space(be, nh);
    cpu_from_bf16(h, dh16, nh);
    cpu_bias_bwd(db_h, h, N, in);
}

static void t_linear_bwd_dy16(Backend *be, float *dx, GradMode dx_mode, float *dW, const uint16_t *dy16,
                              const float *x, const float *W, int N, int in, int out) {
    const size_t ndy = (size_t)N * out, nx = (size_t)N * in, nW = (size_t)out * in;
    float *rest = NULL;
    const float *dy = widened(be, dy16, ndy, be->dtype == DTYPE_BF16 ? nx + nW : 0, &rest);
    if (be->dtype == DTYPE_BF16) {
        if (dW) x = rounded(x, nx, rest);
        if (dx) W = rounded(W, nW, rest + nx);
    }
    cpu_linear_bwd(dx, dx_mode, dW, NULL, dy, x, W, N, in, out);
}

/* ---- the rest: the reference as it is ------------------------------------------ */

static void t_zero(Backend *be, float *x, size_t n) { (void)be; cpu_zero(x, n); }
static void t_copy(Backend *be, float *d, const float *s, size_t n) { (void)be; cpu_copy(d, s, n); }
static void t_copy_ids(Backend *be, int32_t *d, const int32_t *s, size_t n) { (void)be; cpu_copy_ids(d, s, n); }
static void t_bias_add(Backend *be, float *y, const float *b, int N, int C) { (void)be; cpu_bias_add(y, b, N, C); }
/* In bf16 mode the sum of dy's bf16 rounding (ops_list.h): linear_bwd's db. */
static void t_bias_bwd(Backend *be, float *db, const float *dy, int N, int C) {
    const size_t n = (size_t)(N > 0 ? N : 0) * (size_t)(C > 0 ? C : 0);
    if (be->dtype == DTYPE_BF16) dy = rounded(dy, n, operand_space(be, n));
    cpu_bias_bwd(db, dy, N, C);
}
static void t_embedding_fwd(Backend *be, float *out, const int32_t *ids, const float *table, float scale, int N, int C,
                            int vs, int Vl) {
    (void)be;
    cpu_embedding_fwd(out, ids, table, scale, N, C, vs, Vl);
}
static void t_embedding_bwd(Backend *be, float *dt, const float *dout, const int32_t *ids, float scale, int N, int C,
                            int vs, int Vl) {
    (void)be;
    cpu_embedding_bwd(dt, dout, ids, scale, N, C, vs, Vl);
}
static void t_add_positions(Backend *be, float *x, int B, int T, int C) { (void)be; cpu_add_positions(x, B, T, C); }
static void t_layernorm_fwd(Backend *be, float *y, float *mean, float *rstd, const float *x, const float *g,
                            const float *b, int N, int C, float eps) {
    (void)be;
    cpu_layernorm_fwd(y, mean, rstd, x, g, b, N, C, eps);
}
static void t_layernorm_bwd(Backend *be, float *dx, float *dg, float *db, const float *dy, const float *x,
                            const float *mean, const float *rstd, const float *g, int N, int C) {
    (void)be;
    cpu_layernorm_bwd(dx, dg, db, dy, x, mean, rstd, g, N, C);
}
/* y16: the fp32 output made in the workspace, then rounded. */
static void t_residual_ln_fwd(Backend *be, float *ro, float *y, uint16_t *y16, float *mean, float *rstd,
                              const float *ri, const float *br, const float *bias, const float *g, const float *b,
                              int N, int C, float eps, uint64_t first, float p, uint64_t seed, uint64_t st) {
    const size_t n_elems = (size_t)(N > 0 ? N : 0) * (size_t)(C > 0 ? C : 0);
    TP_CHECK(n_elems == 0 || (y == NULL) != (y16 == NULL), "op_residual_ln_fwd: give exactly one of y and y16");
    float *out = y ? y : backend_workspace(be, (n_elems ? n_elems : 1) * sizeof(float));
    cpu_residual_ln_fwd(ro, out, mean, rstd, ri, br, bias, g, b, N, C, eps, first, p, seed, step_stream(be, st));
    if (y16) cpu_to_bf16(y16, out, n_elems);
}
/* d_branch16: d_branch made in the workspace, rounded, and the bias summed
 * over the rounded values (t_bias_bwd's bits: bf16 mode only rounds). */
static void t_residual_ln_bwd(Backend *be, float *dr, float *dbr, uint16_t *dbr16, float *dg, float *db, float *dbias,
                              const float *dy, const float *x, const float *mean, const float *rstd, const float *g,
                              int N, int C, uint64_t first, float p, uint64_t seed, uint64_t st) {
    const size_t n_elems = (size_t)(N > 0 ? N : 0) * (size_t)(C > 0 ? C : 0);
    TP_CHECK(n_elems == 0 || (dbr == NULL) != (dbr16 == NULL),
             "op_residual_ln_bwd: give exactly one of d_branch and d_branch16");
    const bool bf16 = be->dtype == DTYPE_BF16;  // the ROW bias's gradient as linear_bwd's (t_bias_bwd)
    float *out = dbr ? dbr : backend_workspace(be, (n_elems ? n_elems : 1) * sizeof(float));
    cpu_residual_ln_bwd(dr, out, dg, db, bf16 || dbr16 ? NULL : dbias, dy, x, mean, rstd, g, N, C, first, p, seed,
                        step_stream(be, st));
    if (dbr16) {
        cpu_to_bf16(dbr16, out, n_elems);
        if (dbias) {  // the rounded values, widened back (exact)
            cpu_from_bf16(out, dbr16, n_elems);
            cpu_bias_bwd(dbias, out, N, C);
        }
    } else if (bf16 && dbias) {
        t_bias_bwd(be, dbias, dbr, N, C);
    }
}
static void t_act_fwd(Backend *be, float *y, const float *x, size_t n, Activation a) { (void)be; cpu_act_fwd(y, x, n, a); }
static void t_act_bwd_x16(Backend *be, float *dx, GradMode mode, const float *dy, const uint16_t *x, size_t n,
                          Activation a) {
    (void)be;
    cpu_act_bwd_x16(dx, mode, dy, x, n, a);
}
static void t_act_fwd16(Backend *be, uint16_t *y, const float *x, size_t n, Activation a) {
    (void)be;
    cpu_act_fwd16(y, x, n, a);
}
static void t_act_bwd(Backend *be, float *dx, GradMode mode, const float *dy, const float *x, size_t n, Activation a) {
    (void)be;
    cpu_act_bwd(dx, mode, dy, x, n, a);
}
static void t_add(Backend *be, float *o, const float *a, const float *b, size_t n) { (void)be; cpu_add(o, a, b, n); }
static void t_accumulate(Backend *be, float *y, const float *x, size_t n) { (void)be; cpu_accumulate(y, x, n); }
static void t_scale(Backend *be, float *x, float s, size_t n) { (void)be; cpu_scale(x, s, n); }
static void t_sum_acc(Backend *be, float *acc, const float *x, size_t n) { (void)be; cpu_sum_acc(acc, x, n); }
static void t_sumsq_acc(Backend *be, float *acc, const float *x, size_t n) { (void)be; cpu_sumsq_acc(acc, x, n); }
static void t_clip_coef(Backend *be, float *nc, const float *ss, int k, float max_norm) {
    (void)be;
    cpu_clip_coef(nc, ss, k, max_norm);
}
static void t_scale_by(Backend *be, float *x, const float *s, size_t n) { (void)be; cpu_scale_by(x, s, n); }
static void t_to_bf16(Backend *be, uint16_t *d, const float *s, size_t n) { (void)be; cpu_to_bf16(d, s, n); }
static void t_from_bf16(Backend *be, float *d, const uint16_t *s, size_t n) { (void)be; cpu_from_bf16(d, s, n); }
static void t_round_bf16(Backend *be, float *x, size_t n) { (void)be; cpu_round_bf16(x, n); }
static void t_softmax_fwd(Backend *be, float *P, const float *S, const int32_t *kl, int B, int H, int Tq, int Tk,
                          float scale, bool causal) {
    (void)be;
    cpu_softmax_fwd(P, S, kl, B, H, Tq, Tk, scale, causal);
}
static void t_softmax_bwd(Backend *be, float *dS, const float *dP, const float *P, int B, int H, int Tq, int Tk,
                          float scale) {
    (void)be;
    cpu_softmax_bwd(dS, dP, P, B, H, Tq, Tk, scale);
}
static void t_attention_fwd(Backend *be, float *out, float *P, const float *q, const float *k, const float *v,
                            const int32_t *kl, int B, int H, int Tq, int Tk, int D, bool causal) {
    (void)be;
    cpu_attention_fwd(out, P, q, k, v, kl, B, H, Tq, Tk, D, causal);
}
static void t_attention_bwd(Backend *be, float *dq, float *dk, float *dv, GradMode mode, const float *dout,
                            const float *P, const float *q, const float *k, const float *v, float *scratch, int B,
                            int H, int Tq, int Tk, int D) {
    (void)be;
    cpu_attention_bwd(dq, dk, dv, mode, dout, P, q, k, v, scratch, B, H, Tq, Tk, D);
}
/* q (B, Tq, H*D), k and v (B, Tk, H*D) widened into the workspace, one
 * after the other (negative sizes: empty here, refused by the reference),
 * and with out_room a (B, Tq, H*D) fp32 output after them (else NULL). */
static float *widen_qkv_room(Backend *be, const uint16_t *q16, const uint16_t *k16, const uint16_t *v16, int B,
                             int H, int Tq, int Tk, int D, const float **q, const float **k, const float **v,
                             size_t room) {
    const size_t bhd = (size_t)(B > 0 ? B : 0) * (size_t)(H > 0 ? H : 0) * (size_t)(D > 0 ? D : 0);
    const size_t nq = bhd * (size_t)(Tq > 0 ? Tq : 0), nk = bhd * (size_t)(Tk > 0 ? Tk : 0);
    float *ws = backend_workspace(be, (nq + 2 * nk + room + 1) * sizeof(float));
    cpu_from_bf16(ws, q16, nq);
    cpu_from_bf16(ws + nq, k16, nk);
    cpu_from_bf16(ws + nq + nk, v16, nk);
    *q = ws, *k = ws + nq, *v = ws + nq + nk;
    return room ? ws + nq + 2 * nk : NULL;
}
static float *widen_qkv(Backend *be, const uint16_t *q16, const uint16_t *k16, const uint16_t *v16, int B, int H,
                        int Tq, int Tk, int D, const float **q, const float **k, const float **v, bool out_room) {
    const size_t nq = (size_t)(B > 0 ? B : 0) * (H > 0 ? H : 0) * (D > 0 ? D : 0) * (Tq > 0 ? Tq : 0);
    return widen_qkv_room(be, q16, k16, v16, B, H, Tq, Tk, D, q, k, v, out_room ? nq : 0);
}

/* The attention backward's gradients as the reference makes them: the
 * caller's fp32 dq, dk, dv, or with the bf16 set (ops_list.h: dq16, dk16,
 * dv16, GRAD_WRITE only) fp32 room `at` in the workspace, rounded into that
 * set afterwards (attn_grads_store): the fp32 form's values, rounded. */
typedef struct {
    float *dq, *dk, *dv;
    uint16_t *dq16, *dk16, *dv16;
    size_t nq, nk;  // elements of dq and of dk, dv
} AttnGrads;

/* Checks the pair of sets; the fp32 room the bf16 one needs (else 0). */
static size_t attn_grads_of(AttnGrads *g, const char *op, GradMode mode, float *dq, float *dk, float *dv,
                            uint16_t *dq16, uint16_t *dk16, uint16_t *dv16, int B, int H, int Tq, int Tk, int D) {
    const bool h = attn_grads_bf16(op, mode, dq, dk, dv, dq16, dk16, dv16);
    const size_t bhd = (size_t)(B > 0 ? B : 0) * (size_t)(H > 0 ? H : 0) * (size_t)(D > 0 ? D : 0);
    *g = (AttnGrads){dq, dk, dv, dq16, dk16, dv16, bhd * (size_t)(Tq > 0 ? Tq : 0), bhd * (size_t)(Tk > 0 ? Tk : 0)};
    return h ? g->nq + 2 * g->nk : 0;
}
static void attn_grads_at(AttnGrads *g, float *at) {
    if (!g->dq16 && !g->dk16 && !g->dv16) return;
    g->dq = at, g->dk = at + g->nq, g->dv = at + g->nq + g->nk;
}
/* What the reference wrote (GRAD_WRITE: all three, zeros where it has no
 * product), rounded into the bf16 set. */
static void attn_grads_store(const AttnGrads *g) {
    if (!g->dq16 && !g->dk16 && !g->dv16) return;
    cpu_to_bf16(g->dq16, g->dq, g->nq);
    cpu_to_bf16(g->dk16, g->dk, g->nk);
    cpu_to_bf16(g->dv16, g->dv, g->nk);
}

/* The flash ops' q, k, v widened and their work room, when there is a
 * product to take (else NULL: with Tq or Tk 0 the reference reads none),
 * and `extra` floats of room after it at *extra_at (NULL when 0). */
static float *widen_flash(Backend *be, const uint16_t *q16, const uint16_t *k16, const uint16_t *v16, int B, int H,
                          int Tq, int Tk, int D, const float **q, const float **k, const float **v, size_t extra,
                          float **extra_at) {
    *q = *k = *v = NULL;
    *extra_at = NULL;
    if (B <= 0 || H <= 0 || Tq <= 0 || Tk <= 0 || D <= 0) {
        if (extra) *extra_at = backend_workspace(be, extra * sizeof(float));
        return NULL;
    }
    const size_t work = cpu_attention_flash_work(Tq, Tk, D);
    float *room = widen_qkv_room(be, q16, k16, v16, B, H, Tq, Tk, D, q, k, v, work + extra);
    if (extra) *extra_at = room + work;
    return room;
}
static void t_attention_flash_fwd(Backend *be, uint16_t *out16, float *lse, const uint16_t *q16, const uint16_t *k16,
                                  const uint16_t *v16, const int32_t *kl, int B, int H, int Tq, int Tk, int D,
                                  bool causal) {
    const float *q, *k, *v;
    float *none;
    float *work = widen_flash(be, q16, k16, v16, B, H, Tq, Tk, D, &q, &k, &v, 0, &none);
    cpu_attention_flash_fwd(out16, lse, q, k, v, kl, B, H, Tq, Tk, D, causal, work);
}
static void t_attention_flash_bwd(Backend *be, float *dq, float *dk, float *dv, uint16_t *dq16, uint16_t *dk16,
                                  uint16_t *dv16, GradMode mode, const float *dout, const float *lse,
                                  const uint16_t *q16, const uint16_t *k16, const uint16_t *v16, const int32_t *kl,
                                  float *scratch, int B, int H, int Tq, int Tk, int D, bool causal) {
    AttnGrads g;
    const size_t n16 = attn_grads_of(&g, "op_attention_flash_bwd", mode, dq, dk, dv, dq16, dk16, dv16, B, H, Tq, Tk, D);
    const float *q, *k, *v;
    float *at;
    float *work = widen_flash(be, q16, k16, v16, B, H, Tq, Tk, D, &q, &k, &v, n16, &at);
    attn_grads_at(&g, at);
    cpu_attention_flash_bwd(g.dq, g.dk, g.dv, mode, dout, lse, q, k, v, kl, scratch, B, H, Tq, Tk, D, causal, work);
    attn_grads_store(&g);
}

/* out16: the fp32 output made in the workspace, then rounded. */
static void t_attention_fwd_x16(Backend *be, float *out, uint16_t *out16, float *P, const uint16_t *q16,
                                const uint16_t *k16, const uint16_t *v16, const int32_t *kl, int B, int H, int Tq,
                                int Tk, int D, bool causal) {
    TP_CHECK(!(out && out16), "op_attention_fwd_x16: give at most one of out and out16");
    const float *q, *k, *v;
    float *room = widen_qkv(be, q16, k16, v16, B, H, Tq, Tk, D, &q, &k, &v, out16 != NULL);
    cpu_attention_fwd(out16 ? room : out, P, q, k, v, kl, B, H, Tq, Tk, D, causal);
    if (out16 && B > 0 && H > 0 && Tq > 0 && D > 0) cpu_to_bf16(out16, room, (size_t)B * Tq * H * D);
}

static void t_attention_bwd_x16(Backend *be, float *dq, float *dk, float *dv, uint16_t *dq16, uint16_t *dk16,
                                uint16_t *dv16, GradMode mode, const float *dout, const float *P, const uint16_t *q16,
                                const uint16_t *k16, const uint16_t *v16, float *scratch, int B, int H, int Tq, int Tk,
                                int D) {
    AttnGrads g;
    const size_t n16 = attn_grads_of(&g, "op_attention_bwd_x16", mode, dq, dk, dv, dq16, dk16, dv16, B, H, Tq, Tk, D);
    const float *q, *k, *v;
    attn_grads_at(&g, widen_qkv_room(be, q16, k16, v16, B, H, Tq, Tk, D, &q, &k, &v, n16));
    cpu_attention_bwd(g.dq, g.dk, g.dv, mode, dout, P, q, k, v, scratch, B, H, Tq, Tk, D);
    attn_grads_store(&g);
}

static void t_dropout_fwd_at(Backend *be, float *o, const float *x, size_t n, uint64_t first, float p, uint64_t seed,
                          uint64_t st) {
    cpu_dropout_fwd_at(o, x, n, first, p, seed, step_stream(be, st));
}
static void t_dropout_bwd_at(Backend *be, float *dx, uint16_t *dx16, GradMode mode, const float *dy, size_t n,
                             uint64_t first, float p, uint64_t seed, uint64_t st) {
    cpu_dropout_bwd_at(dx, dx16, mode, dy, n, first, p, seed, step_stream(be, st));
}
static void t_dropout_fwd_win(Backend *be, float *o, const float *x, size_t rows, size_t cols, uint64_t ld,
                              uint64_t first, float p, uint64_t seed, uint64_t st) {
    cpu_dropout_fwd_win(o, x, rows, cols, ld, first, p, seed, step_stream(be, st));
}
static void t_dropout_bwd_win(Backend *be, float *dx, GradMode mode, const float *dy, size_t rows, size_t cols,
                              uint64_t ld, uint64_t first, float p, uint64_t seed, uint64_t st) {
    cpu_dropout_bwd_win(dx, mode, dy, rows, cols, ld, first, p, seed, step_stream(be, st));
}
/* fp32 q, k, v as they are, or bf16 ones widened (then with `room` floats
 * after them: the forward's fp32 output for out16, the backward's fp32
 * gradients for the bf16 set), as the _x16 ops. */
static float *drop_qkv(Backend *be, const char *op, const float **q, const float **k, const float **v,
                       const uint16_t *q16, const uint16_t *k16, const uint16_t *v16, int B, int H, int Tq, int Tk,
                       int D, size_t room) {
    TP_CHECK((*q != NULL) != (q16 != NULL), "%s: give q, k, v as fp32 or as bf16, exactly one of them", op);
    if (q16) return widen_qkv_room(be, q16, k16, v16, B, H, Tq, Tk, D, q, k, v, room);
    return room ? backend_workspace(be, (room + 1) * sizeof(float)) : NULL;
}
static void t_attention_drop_fwd(Backend *be, float *out, uint16_t *out16, float *P, float *Pd, const float *q,
                                 const float *k, const float *v, const uint16_t *q16, const uint16_t *k16,
                                 const uint16_t *v16, const int32_t *kl, int B, int H, int Tq, int Tk, int D,
                                 bool causal, uint64_t first, uint64_t ld, float p, uint64_t seed, uint64_t st) {
    TP_CHECK(!(out && out16), "op_attention_drop_fwd: give at most one of out and out16");
    const size_t nq = (size_t)(B > 0 ? B : 0) * (H > 0 ? H : 0) * (D > 0 ? D : 0) * (Tq > 0 ? Tq : 0);
    float *room = drop_qkv(be, "op_attention_drop_fwd", &q, &k, &v, q16, k16, v16, B, H, Tq, Tk, D, out16 ? nq : 0);
    cpu_attention_drop_fwd(out16 ? room : out, P, Pd, q, k, v, kl, B, H, Tq, Tk, D, causal, first, ld, p, seed,
                           step_stream(be, st));
    if (out16 && B > 0 && H > 0 && Tq > 0 && D > 0) cpu_to_bf16(out16, room, (size_t)B * Tq * H * D);
}
static void t_attention_drop_bwd(Backend *be, float *dq, float *dk, float *dv, uint16_t *dq16, uint16_t *dk16,
                                 uint16_t *dv16, GradMode mode, const float *dout, const float *P, const float *q,
                                 const float *k, const float *v, const uint16_t *q16, const uint16_t *k16,
                                 const uint16_t *v16, float *scratch, int B, int H, int Tq, int Tk, int D,
                                 uint64_t first, uint64_t ld, float p, uint64_t seed, uint64_t st) {
    AttnGrads g;
    const size_t n16 = attn_grads_of(&g, "op_attention_drop_bwd", mode, dq, dk, dv, dq16, dk16, dv16, B, H, Tq, Tk, D);
    attn_grads_at(&g, drop_qkv(be, "op_attention_drop_bwd", &q, &k, &v, q16, k16, v16, B, H, Tq, Tk, D, n16));
    cpu_attention_drop_bwd(g.dq, g.dk, g.dv, mode, dout, P, q, k, v, scratch, B, H, Tq, Tk, D, first, ld, p, seed,
                           step_stream(be, st));
    attn_grads_store(&g);
}
static void t_xent_fwd(Backend *be, float *losses, float *lse, const float *logits, const int32_t *t, int N, int V,
                       float eps, int32_t ig) {
    (void)be;
    (void)cpu_xent_fwd(losses, lse, logits, t, N, V, eps, ig);
}
static void t_xent_bwd(Backend *be, float *dl, const float *logits, const float *lse, const int32_t *t, float dloss,
                       int N, int V, float eps, int32_t ig) {
    (void)be;
    cpu_xent_bwd(dl, logits, lse, t, dloss, N, V, eps, ig);
}
static void t_xent_vp_max(Backend *be, float *rm, const float *logits, int N, int Vl, int Vv) {
    (void)be;
    cpu_xent_vp_max(rm, logits, N, Vl, Vv);
}
static void t_xent_vp_sums(Backend *be, float *st, const float *logits, const float *rm, const int32_t *t, int N,
                           int Vl, int Vv, int vs, int32_t ig) {
    (void)be;
    cpu_xent_vp_sums(st, logits, rm, t, N, Vl, Vv, vs, ig);
}
static void t_xent_vp_loss(Backend *be, float *losses, float *lse, const float *rm, const float *st, const int32_t *t,
                           int N, int V, float eps, int32_t ig) {
    (void)be;
    (void)cpu_xent_vp_loss(losses, lse, rm, st, t, N, V, eps, ig);
}
static void t_xent_vp_bwd(Backend *be, float *dl, const float *logits, const float *lse, const int32_t *t,
                          float dloss, int N, int Vl, int Vv, int vs, int V, float eps, int32_t ig) {
    (void)be;
    cpu_xent_vp_bwd(dl, logits, lse, t, dloss, N, Vl, Vv, vs, V, eps, ig);
}
static void t_xent_vp_grad_inplace(Backend *be, float *logits, const float *lse, const int32_t *t, float dloss, int N,
                                   int Vl, int Vv, int vs, int V, float eps, int32_t ig) {
    cpu_xent_vp_grad_inplace(logits, lse, t, step_scale(be, dloss), N, Vl, Vv, vs, V, eps, ig);
}
static void t_xent_vp_max16(Backend *be, float *rm, const uint16_t *logits, int N, int Vl, int Vv) {
    (void)be;
    cpu_xent_vp_max16(rm, logits, N, Vl, Vv);
}
static void t_xent_vp_sums16(Backend *be, float *st, const uint16_t *logits, const float *rm, const int32_t *t,
                             int N, int Vl, int Vv, int vs, int32_t ig) {
    (void)be;
    cpu_xent_vp_sums16(st, logits, rm, t, N, Vl, Vv, vs, ig);
}
static void t_xent_vp_grad_inplace16(Backend *be, uint16_t *logits, const float *lse, const int32_t *t, float dloss,
                                     int N, int Vl, int Vv, int vs, int V, float eps, int32_t ig) {
    cpu_xent_vp_grad_inplace16(logits, lse, t, step_scale(be, dloss), N, Vl, Vv, vs, V, eps, ig);
}
static void t_adamw(Backend *be, float *p, const float *g, float *m, float *v, size_t n, float lr, float b1, float b2,
                    float eps, float wd, int t) {
    (void)be;
    cpu_adamw(p, g, m, v, n, lr, b1, b2, eps, wd, t);
}

/* --profile's marks: wall-clock readings, taken as the ops run (they run in place). */
static void *cpu_marks_new(Backend *be, int n) {
    (void)be;
    return TP_CALLOC((size_t)(n > 0 ? n : 1), sizeof(double));
}
static void cpu_mark(Backend *be, void *marks, int i) {
    (void)be;
    ((double *)marks)[i] = tp_now_s();
}
static void cpu_marks_read(Backend *be, void *marks, int n, double *seconds) {
    (void)be;
    const double *t = marks;
    for (int i = 0; i < n; i++) seconds[i] = t[i] - t[0];
}
static void cpu_marks_free(Backend *be, void *marks) {
    (void)be;
    free(marks);
}
static void t_sumsq_segs(Backend *be, float *acc, const float *x, const OpSegTable *s) {
    (void)be;
    cpu_sumsq_segs(acc, x, s->segs, s->n_segs);
}
static void t_adamw_segs(Backend *be, float *p, const float *g, float *m, float *v, const OpSegTable *s, float lr,
                         float b1, float b2, float eps, float wd, int t) {
    (void)be;
    cpu_adamw_segs(p, g, m, v, s->segs, s->n_segs, lr, b1, b2, eps, wd, t);
}

static const BackendOps CPU_OPS = {
    .name = "cpu",
    .dev_alloc = cpu_dev_alloc, .dev_free = cpu_dev_free, .upload = cpu_upload, .download = cpu_download,
    .sync = cpu_sync, .host_alloc = cpu_host_alloc, .host_free = cpu_host_free, .upload_wait = cpu_upload,
    .stream = cpu_stream, .device_used = cpu_device_used, .recast = cpu_recast, .destroy = cpu_destroy,
#define OP(name, cls, cpu, cuda, params, args) .name = t_##name,
#include "ops_list.h"
    .marks_new = cpu_marks_new, .mark = cpu_mark, .marks_read = cpu_marks_read, .marks_free = cpu_marks_free,
    .capture_begin = cpu_capture_begin, .capture_end = cpu_capture_end, .graph_launch = cpu_graph_launch,
    .graph_free = cpu_graph_free,
};

static Backend *backend_cpu_create(Dtype dtype, int local_rank, char *err, size_t err_len) {
    (void)local_rank, (void)err, (void)err_len;
    Backend *be = TP_CALLOC(1, sizeof *be);
    be->ops = &CPU_OPS;
    be->kind = BACKEND_CPU;
    be->dtype = dtype;
    be->host_visible = true;
    be->device = -1;
    snprintf(be->device_name, sizeof be->device_name, "CPU");
    return be;
}

static int cpu_device_count(void) { return 1; }

/* The seam's entry for this backend (backend.h; backend_list.c lists it). */
const BackendEntry backend_cpu_entry = {BACKEND_CPU, cpu_device_count, backend_cpu_create};
