/* harness.h: what the parts of test_backend_ops share: the backends under
 * test ("targets"), device buffers through the backend's allocator and copy
 * points, comparisons, and the tolerances with their reasons.
 *
 * Every case computes its reference on the host with the fp32 CPU reference
 * (kernels/cpu, cpu_ops.h) and runs the op through ops.h on the target's
 * backend, from the same seeded inputs. Outputs that ops accumulate into
 * start from random values on both sides and cases compare the increments,
 * so an op that overwrote instead of accumulating fails by O(1).
 *
 * The CPU targets run the reference itself, so every op is compared
 * exactly (tolerance 0) except the bf16 GEMMs, which are compared exactly
 * with the fp32 reference on operands rounded to bf16 here, independently
 * of the backend's own rounding. The CUDA targets use the named tolerances
 * below. */
#ifndef TPTRAIN_TEST_BACKEND_OPS_HARNESS_H
#define TPTRAIN_TEST_BACKEND_OPS_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "cpu_ops.h"
#include "ops.h"
#include "testrng.h"

/* ---- tolerances (CUDA targets; the CPU targets use 0) ------------------------
 * SUM_RTOL, relative to the largest magnitude of the compared tensor (or
 * increment): fp32 results whose sums run in another order than the CPU's
 * (warp trees vs loops and OpenBLAS, expf vs glibc's). With O(1) inputs and
 * at most a few hundred terms per sum the differences are a few 1e-7 of the
 * tensor's scale; 1e-5 keeps a 10x margin, while a wrong index, mask or
 * missing term moves values by O(max). */
#define SUM_RTOL 1e-5
/* Attention backward chains three such products and the cancellation
 * dP - rowsum(dP * P), over up to a few hundred keys: one more order. */
#define ATTN_BWD_RTOL 5e-5
/* GELU: the kernel's fp32 erfcf/expf (<= 4 ulp) against the CPU's double
 * evaluation rounded once: |diff| <= GELU_TOL * (1 + |want|). */
#define GELU_TOL 1e-6
/* Positions: both sides evaluate pow/sin/cos in double and round once to
 * fp32; libm and CUDA may differ in the last double bit, which can flip one
 * fp32 rounding: 1 ulp of values below 4 is 4.8e-7. */
#define POS_ATOL 1e-6
/* Sums into a float scalar (sum_acc, sumsq_acc): both sides add in double
 * (n * 2^-53 relative apart at most) and round once to fp32, which can then
 * differ by one ulp: 2^-23 relative. */
#define SCALAR_RTOL 1.2e-7
/* sumsq_segs rounds to fp32 once per segment on both sides, from double
 * sums that differ as above; a rounding that flips on one segment carries a
 * one-ulp difference into the later ones: 4 ulp (2^-21) for a case with a
 * hundred segments per accumulator, far below a missing segment's share. */
#define SEGS_SCALAR_RTOL 4.8e-7
/* AdamW: the kernel rounds every operation as the CPU's fp32 code does, so
 * results are expected identical; 1e-6 of the tensor's scale leaves room
 * for a CPU build that contracts into FMA and still catches a wrong term (a
 * missing decay moves p by lr*wd*|p| = 1e-3). */
#define ADAM_RTOL 1e-6
/* fp32 GEMM: both sides multiply fp32 values with fp32 accumulation, in
 * different orders: for K <= 1024 a random walk of ~sqrt(K) u of the
 * partial sums, below 1e-6 of max |C|; 1e-5 leaves a 10x margin, while an
 * indexing, transpose or accumulate mistake is an O(1) error. */
#define FP32_TOL 1e-5
/* The bias gradient from cuBLASLt's BGRADB epilogue (fp32 only) is an fp32
 * sum over N tokens against the CPU's double: up to N u = 3e-5 for N = 512. */
#define BGRAD_FP32_TOL 1e-4
/* bf16 GEMM against the reference on the same bf16-rounded operands: every
 * product is exact in fp32 (8 x 8 significant bits), only the fp32
 * accumulation differs (tensor cores may truncate when aligning partial
 * sums: <= 2^-23 per step, K/16 steps): 1e-4 is 10x above that for K <=
 * 1024, far below the ~2^-9 error of a wrong rounding. */
#define BF16_SAME_INPUT_TOL 1e-4
/* bf16 GEMM against the fp32 reference, per element: each operand is off
 * by up to 2^-9 relative, so each product by up to 2^-8 (plus 2^-18), and
 * the sum by up to 2^-8 of the sum of its terms' magnitudes (plus fp32
 * accumulation, ~K 2^-24): 2^-7 of sum |a b| leaves a 2x margin. Measured
 * against that magnitude, not max |C|: with few terms of opposite signs C
 * can be far smaller than its terms (an H200 saw 2.0% of max |C| for K = 5,
 * within 0.3% of sum |a b|). */
#define BF16_TERM_TOL 0x1p-7
/* A bf16-stored GEMM result against the same GEMM stored in fp32 and
 * rounded after: the fp32 sums (ordered by another kernel) differ by
 * ~BF16_SAME_INPUT_TOL of max |C|, which moves a rounding by at most one
 * bf16 step, 2^-8 relative at most, of a value near a tie; 2^-7 doubles
 * that. The absolute part covers results near 0, where ReLU or a sum's
 * cancellation leaves no relative scale: BF16_SAME_INPUT_TOL of the O(1)
 * values these cases make. */
#define BF16_STEP_RTOL 0x1p-7
#define BF16_STEP_ATOL 1e-4
/* Every compared tensor must carry at least this much signal, or the case
 * tests nothing. */
#define MIN_SIGNAL 1e-3

/* ---- checks (one count for the whole test) ------------------------------------- */
void tcheck(bool ok, const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
#define TCHECK(cond, ...) tcheck((cond), __FILE__, __LINE__, __VA_ARGS__)
int tcheck_report(const char *name);
int tcheck_failures(void);

/* ---- targets -------------------------------------------------------------------- */
typedef struct {
    const char *name;  // "cpu fp32", "cuda bf16", ...
    Backend *be;
    bool is_cpu;       // runs the reference itself: exact comparisons
    bool bf16;
} Target;

/* The tolerance for a target: 0 on the CPU (the reference itself). */
double tol(const Target *t, double gpu_tol);

/* ---- buffers (device memory of the target, MEM_ACT) ------------------------------ */
float *dev_from(const Target *t, const float *h, size_t n);
int32_t *dev_from_i32(const Target *t, const int32_t *h, size_t n);
float *dev_nan(const Target *t, size_t n);  // NaN garbage, written on the backend's stream
float *dev_fetch(const Target *t, const float *d, size_t n);  // a malloc'd host copy
/* bf16 tensors as raw bits: xb's values (already bf16, e.g. host_bf16's)
 * uploaded as their bits; bits downloaded and widened to a host fp32 copy. */
uint16_t *dev_bits(const Target *t, const float *xb, size_t n);
float *dev_fetch_bits(const Target *t, const uint16_t *d, size_t n);
uint16_t *dev_nan_bits(const Target *t, size_t n);  // bf16 NaN garbage for an output the op must write whole
void dev_free(const Target *t, void *d);

float *host_copy(const float *src, size_t n);
float *host_alloc(size_t n);  // zeros
/* x rounded to the nearest bf16 (ties to even, NaN kept), written out here
 * rather than taken from bf16.h so the backends' rounding is checked
 * against an independent one. */
float ref_bf16(float x);
float *host_bf16(const float *x, size_t n);
float *host_abs(const float *x, size_t n);  // |x|, element-wise

/* ---- comparisons (what is prefixed with the target's name) ------------------------ */
void check_exact(const Target *t, const char *what, const float *got, const float *want, size_t n);
/* An attention backward's bf16 gradients d_h (its dq16, dk16, dv16; n[i]
 * elements each) against its fp32 ones d_f written (GRAD_WRITE) on the
 * same inputs, rounded here with ref_bf16: exactly, on every backend
 * (ops_list.h: the same products, only the store narrows). */
void check_attn_grads16(const Target *t, const char *what, uint16_t *const d_h[3], float *const d_f[3],
                        const size_t n[3]);
/* max |(got - start) - (want - start)| <= rtol * max |want - start|; start
 * may be NULL (zeros). The increments must show MIN_SIGNAL. */
void check_rel(const Target *t, const char *what, const float *got, const float *want, const float *start,
               size_t n, double rtol);
/* The error check_rel measures, max |diff| / max |want - start| (infinity
 * for NaN), without checking: for negative controls. */
double rel_err(const float *got, const float *want, const float *start, size_t n);
/* Elements where mask[i] is set are exactly equal. */
void check_exact_where(const Target *t, const char *what, const float *got, const float *want,
                       const unsigned char *mask, size_t n);
/* |got - want| <= atol + rtol |want| elementwise. */
/* Elements with |got - want| > rtol * mag[i] (NaN counts). */
size_t terms_violations(const float *got, const float *want, const float *mag, size_t n, double rtol);
/* |got - want| <= rtol * mag[i] for every element (mag: the sum of the
 * magnitudes of the terms of want[i]). */
void check_terms(const Target *t, const char *what, const float *got, const float *want, const float *mag, size_t n,
                 double rtol);
void check_close(const Target *t, const char *what, const float *got, const float *want, size_t n, double rtol,
                 double atol);

/* ---- the GEMM epilogues' modes (ops_gemm.c) ---------------------------------------------
 * How many modes a target runs the linear cases in (CUDA: 0 fused
 * epilogues, 1 the separate kernels; the CPU: 0 alone), and the switch. */
int n_modes(const Target *t);
void set_mode(const Target *t, int mode);

/* ---- the parts ----------------------------------------------------------------------- */
void test_memory_ops(const Target *t, Rng *rng);
void test_comm_copy(const Target *t, Rng *rng);  // ops_memory.c
void test_elementwise(const Target *t, Rng *rng);
void test_scalars(const Target *t, Rng *rng);
void test_bf16_convert(const Target *t, Rng *rng);
void test_bias(const Target *t, Rng *rng);
void test_embedding(const Target *t, Rng *rng);
void test_positions(const Target *t, Rng *rng);
void test_layernorm(const Target *t, Rng *rng);
void test_dropout(const Target *t, Rng *rng);
void test_dropout_win(const Target *t, Rng *rng);     // ops_dropout_inner.c
void test_attention_drop(const Target *t, Rng *rng);  // ops_dropout_inner.c
void test_residual_ln(const Target *t, Rng *rng);  // ops_fused.c
void test_step_vars(const Target *t, Rng *rng);    // ops_step.c
void test_adamw(const Target *t, Rng *rng);
void test_multi_tensor(const Target *t, Rng *rng);  // ops_multi.c
void test_big_grids(const Target *t, Rng *rng);
void test_softmax(const Target *t, Rng *rng);
void test_attention(const Target *t, Rng *rng);
void test_attention_flash(const Target *t, Rng *rng);  // ops_flash.c
void test_xent(const Target *t, Rng *rng);
void test_gemm(const Target *t, Rng *rng);
void test_linear(const Target *t, Rng *rng);
void test_compute_weights(const Target *t, Rng *rng);
void test_linear_drelu(const Target *t, Rng *rng);  // ops_drelu.c
/* No op allocates behind the allocator: host allocations (wrapped malloc)
 * and, on CUDA, device memory, counted around passes over every op. */
void test_no_hidden_allocs(const Target *t, Rng *rng);

#ifdef TPTRAIN_TEST_CUDA
/* CUDA-only views (gpu/backend_ops_cuda.c). */
size_t gpu_free_bytes(void);
size_t gpu_pool_reserved_bytes(const Backend *be);  // the device's default cudaMallocAsync pool
void gpu_set_fused_epilogues(const Backend *be, bool on);
/* attention's fused kernels on (the default) or off: cuda_attention_set_fused */
void gpu_set_fused_attention(bool on);
/* attention_flash's short-sequence kernels (on) or its tiled ones (off,
 * the default), and the calls each ran: cuda_flash_set_kernel / _counts */
void gpu_set_flash_short(bool on);
typedef struct {
    long tiled_fwd, tiled_bwd, short_fwd, short_bwd;
} GpuFlashCounts;
GpuFlashCounts gpu_flash_counts(void);
int gpu_flash_short_max_t(void);  // CUDA_FLASH_SHORT_MAX_T
typedef struct {
    long bias_fused, bias_separate, bgrad_fused, bgrad_separate, refusals, plans, evictions;
    long out16_fused, out16_separate, out16_unplanned;  // unplanned: of the separate, no plan, no operand copied
    long dx16_fused, dx16_separate;  // linear_bwd16's bf16 dx: stored by the GEMM / fp32 then rounded
    long relu_mask_fused, relu_mask_separate;  // linear_relu_fwd16's mask: RELU_AUX_BIAS / the rounding pass
    long drelu_fused, drelu_separate;          // linear_bwd16_drelu: DRELU_BGRAD / the masking bias pass
    /* the weight-gradient GEMMs' tuning (cuda_gemm.h's CudaGemmStats) */
    long tuned, tune_changed, tune_single, tune_captured, tune_skipped, tune_recalled;
    double tune_ms;
} GpuGemmCounts;
GpuGemmCounts gpu_gemm_counts(const Backend *be);
/* the GEMM context's tuning switch (cuda_gemm_set_tuning) */
void gpu_set_gemm_tuning(const Backend *be, bool on);
#endif

#endif
