// row_prims.h: the few device operations that colsum.cuh's and
// layernorm_row.cuh's block code (and residual_ln_row.cuh's) is written
// in, so that code compiles for the device and the host alike:
// test/test_ln_rows.cc runs it on the CPU over an emulated block
// (test/warp_emu.h) against the CPU reference, where no GPU runs it.
// flash_core.h does the same for the short attention kernels with its own
// set; these are the row kernels'.
//
// Under nvcc they are the device's (what the kernels called before: the
// same loads, the same roundings). Elsewhere the includer defines them
// before including any of those headers:
//   RP_FN                 the functions' qualifier (inline on the host)
//   RP_UNROLL             #pragma unroll (nothing on the host)
//   rp_sync()             __syncthreads()
//   rp_warp_sum(x)        the warp's sum of a double by the xor butterfly
//                         (cuda_kernel_util.cuh's tp_warp_sum)
//   rp_fadd, rp_fsub, rp_fmul (float a, float b): __fadd_rn and friends,
//                         the operation rounded alone (never fused)
//   rp_dfma(a, b, c)      __fma_rn on doubles: a * b + c rounded once
//   rp_ld4(v, p)          float4 load of 4 floats at a 16-byte aligned p
//   rp_st4(p, v)          float4 store of v[0..3]
//   rp_st4h(p, h)         ushort4 store of 4 bf16 bits at an 8-byte aligned p
//   rp_ld_in(x, i)        element i of fp32 or bf16-bit x as fp32 (ld_in)
//   rp_step_stream(s, id) a dropout's stream id with StepVars' base
//                         (tp_step_stream)
#ifndef TPTRAIN_ROW_PRIMS_H
#define TPTRAIN_ROW_PRIMS_H

#include <stddef.h>
#include <stdint.h>

#include "bf16.h"     // tp_f32_to_bf16: the rounding, host and device
#include "backend.h"  // StepVars

#define RP_WARP 32  // threads of a warp (cuda_kernel_util.cuh's TP_WARP)

#ifdef __CUDACC__
#include "cuda_kernel_util.cuh"
static_assert(RP_WARP == TP_WARP, "one warp");
#define RP_FN __device__ __forceinline__
#define RP_UNROLL _Pragma("unroll")
RP_FN void rp_sync() { __syncthreads(); }
RP_FN double rp_warp_sum(double x) { return tp_warp_sum(x); }
RP_FN float rp_ld_in(const float *x, size_t i) { return ld_in(x, (long long)i); }
RP_FN float rp_ld_in(const uint16_t *x, size_t i) { return ld_in(x, (long long)i); }
RP_FN uint64_t rp_step_stream(const StepVars *step, uint64_t id) { return tp_step_stream(step, id); }
RP_FN float rp_fadd(float a, float b) { return __fadd_rn(a, b); }
RP_FN float rp_fsub(float a, float b) { return __fsub_rn(a, b); }
RP_FN float rp_fmul(float a, float b) { return __fmul_rn(a, b); }
RP_FN double rp_dfma(double a, double b, double c) { return __fma_rn(a, b, c); }
RP_FN void rp_ld4(float (&v)[4], const float *p) {
    const float4 t = *(const float4 *)p;
    v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
}
RP_FN void rp_st4(float *p, const float (&v)[4]) { *(float4 *)p = make_float4(v[0], v[1], v[2], v[3]); }
RP_FN void rp_st4h(uint16_t *p, const uint16_t (&h)[4]) {
    ushort4 u;
    u.x = h[0], u.y = h[1], u.z = h[2], u.w = h[3];
    *(ushort4 *)p = u;
}
#endif

#endif
