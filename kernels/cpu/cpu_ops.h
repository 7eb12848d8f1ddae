/* cpu_ops.h: the fp32 CPU reference of every op, the oracle of the tests.
 *
 * cpu_<name> is ops.h's op_<name> without the backend argument, on host
 * pointers. The prototypes come from ops_list.h, which states each contract
 * (shapes, accumulation, masks) once, so a reference whose signature drifts
 * from its entry does not compile. The CPU backend (backend_cpu.c) puts
 * these in its table; tests call them directly as the reference. Two of
 * them return the count of non-ignored rows (cpu_xent_fwd, cpu_xent_vp_loss:
 * COUNT in the list); the multi-tensor ones take the host segment array
 * (below), and a few host-side helpers follow.
 */
#ifndef TPTRAIN_CPU_OPS_H
#define TPTRAIN_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "backend.h"  // Activation, OpSeg, the list's helpers

#define CPU_REF_REF(name, params) void cpu_##name params;
#define CPU_REF_COUNT(name, params) int cpu_##name params;
#define CPU_REF_OWN(name, params)
#define OP(name, cls, cpu, cuda, params, args) CPU_REF_##cpu(name, params)
#include "ops_list.h"

/* The OWN entries. cpu_sumsq_acc(acc + s.acc, x + s.x_at, s.n) for each
 * segment in order; cpu_adamw over each segment (p at x_at, g at g_at, m and
 * v at s_at; wd where decay, else 0), in order. */
void cpu_sumsq_segs(float *acc, const float *x, const OpSeg *segs, int n_segs);
void cpu_adamw_segs(float *p, const float *g, float *m, float *v, const OpSeg *segs, int n_segs, float lr,
                    float beta1, float beta2, float eps, float wd, int t);

/* The fused residual + dropout + LayerNorm forward with an fp32 output
 * (the op's y16 form is this, then cpu_to_bf16: backend_cpu.c). */
void cpu_residual_ln_fwd(float *res_out, float *y, float *mean, float *rstd, const float *res_in,
                         const float *branch, const float *bias, const float *gamma, const float *beta, int N, int C,
                         float eps, uint64_t first, float p, uint64_t seed, uint64_t stream);
/* residual_ln_bwd's fp32 d_branch (the backend's entry adds d_branch16) */
void cpu_residual_ln_bwd(float *d_res, float *d_branch, float *dgamma, float *dbeta, float *d_bias, const float *dy,
                         const float *x, const float *mean, const float *rstd, const float *gamma, int N, int C,
                         uint64_t first, float p, uint64_t seed, uint64_t stream);

/* The x16 linear layers and attention have no reference of their own: the
 * CPU backend widens x16 (exact) and runs cpu_linear_fwd / cpu_linear_bwd
 * (whose bf16 mode would round x to those very values) or cpu_attention_*. */

/* The attention_flash ops' reference on the widened bf16 q, k, v (exact),
 * with work room of cpu_attention_flash_work(Tq, Tk, D) floats; the
 * backward's delta is its scratch. */
size_t cpu_attention_flash_work(int Tq, int Tk, int D);
void cpu_attention_flash_fwd(uint16_t *out16, float *lse, const float *q, const float *k, const float *v,
                             const int32_t *k_len, int B, int H, int Tq, int Tk, int D, bool causal, float *work);
void cpu_attention_flash_bwd(float *dq, float *dk, float *dv, GradMode mode, const float *dout, const float *lse,
                             const float *q, const float *k, const float *v, const int32_t *k_len, float *delta,
                             int B, int H, int Tq, int Tk, int D, bool causal, float *work);

/* The attention_drop ops' reference on fp32 q, k, v (the backend widens
 * bf16 ones, as for the _x16 ops); stream without the StepVars' base. */
void cpu_attention_drop_fwd(float *out, float *P, float *Pd, const float *q, const float *k, const float *v,
                            const int32_t *k_len, int B, int H, int Tq, int Tk, int D, bool causal, uint64_t first,
                            uint64_t ld, float p, uint64_t seed, uint64_t stream);
void cpu_attention_drop_bwd(float *dq, float *dk, float *dv, GradMode mode, const float *dout, const float *P,
                            const float *q, const float *k, const float *v, float *scratch, int B, int H, int Tq,
                            int Tk, int D, uint64_t first, uint64_t ld, float p, uint64_t seed, uint64_t stream);

/* The ReLU bit-mask of linear_relu_fwd16 from the fp32 pre-activation h
 * (N, cols): bit set where h > 0, a row's padding bits 0. */
void cpu_relu_mask(uint8_t *mask, const float *h, int N, int cols);
/* linear_bwd16_drelu's mask: d16 (N, cols) bf16 bits set to +0 where the
 * mask's bit is clear, in place. */
void cpu_relu_mask_apply(uint16_t *d16, const uint8_t *mask, int N, int cols);

/* Sum of squares of x, in double (the tests' host-side figure). */
double cpu_sumsq(const float *x, size_t n_elems);
/* Dropout over a whole tensor (the window at 0). */
void cpu_dropout_fwd(float *out, const float *x, size_t n_elems, float p, uint64_t seed, uint64_t stream_id);
void cpu_dropout_bwd(float *dx, GradMode mode, const float *dy, size_t n_elems, float p, uint64_t seed,
                     uint64_t stream_id);
void philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
uint64_t dropout_stream(uint32_t step, uint32_t micro, uint32_t layer,
                        uint32_t site, uint32_t tp_rank);

#endif
