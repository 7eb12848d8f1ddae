/* cuda_ops.h: the CUDA kernels behind kernels/backend.h, op for op.
 * PRIVATE to kernels/cuda (and the GPU tests): the model reaches these only
 * through the Backend table that backend_cuda.cu fills.
 *
 * cuda_op_<name> has the arguments of ops.h's op_<name>, in the same order
 * and with the same meaning (accumulating backward ops, masks, Philox
 * counter layout, vocab-parallel protocol: see ops_list.h), minus the
 * backend and plus, where the op needs temporary device memory, a `scratch`
 * pointer, and a final stream: the prototypes below are generated from
 * ops_list.h, so a launcher that drifts from its entry does not compile. All tensor pointers, k_len, ids and targets included,
 * are DEVICE pointers. Every op is enqueued on `stream` and returns at
 * once: none synchronises and none returns a value. The GEMM and linear
 * ops live in gemm.cu (cuBLASLt) and are declared in cuda_gemm.h.
 *
 * Scratch: no op allocates. An op that needs temporary device memory has a
 * cuda_<op>_scratch_bytes(...) function of its arguments; the caller passes
 * at least that many bytes, aligned to 256, as `scratch` (the backend takes
 * them from its workspace arena, backend_workspace). The scratch may be
 * reused by the next op on the same stream.
 *
 * Every op checks its sizes (non-negative) and pointers (non-NULL when the
 * sizes make them used) and dies with a message on bad input, as the rest
 * of the project does. Where ops.h lets an output alias an input (op_add,
 * op_act_*, op_dropout_fwd, op_softmax_bwd dS == dP), so do these.
 *
 * Differences from the CPU that a caller may notice:
 *  - cuda_op_xent_fwd / cuda_op_xent_vp_loss check targets on the device and
 *    record a bad one in a CudaOpStatus (host memory mapped into the device)
 *    instead of dying at the bad row; the backend reads it at its next
 *    synchronisation (backend_sync, backend_download) and dies there with
 *    cuda_status_message's sentence. Bad rows get loss 0 meanwhile.
 *  - Reductions (sums into device scalars, bias/LayerNorm column sums,
 *    embedding scatter-add, xent statistics) are deterministic: the same
 *    inputs give the same bits on every run, independent of scheduling, with
 *    no float atomics. The embedding backward, dropout, clip_coef,
 *    scale_by and the bf16 conversions are bit-identical to the CPU
 *    reference. The embedding backward adds each table row's occurrences
 *    in increasing n, as the CPU does; bias_bwd and the device-scalar sums
 *    sum in double in a fixed order (within a few 1e-16 relative of the
 *    CPU's loop); sumsq_segs sums chunks in double per block and the last
 *    block to finish adds each segment's total in table order, as one
 *    cuda_op_sumsq_acc per segment would.
 *
 * dropout_stream() and philox4x32_10() stay host functions of the CPU
 * library; the device generator is kernels/philox.h. The dropout ops name the
 * Philox stream `stream_id`, since `stream` is the CUDA stream here.
 */
#ifndef TPTRAIN_CUDA_OPS_H
#define TPTRAIN_CUDA_OPS_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "backend.h"  // Activation (ops.h states the contract these mirror)

/* ---- Status reported by the device ----------------------------------------- */
/* Filled by the cross-entropy ops when a target is outside [0, V); lives in
 * host memory mapped into the device (the backend's). Zero = nothing seen. */
typedef struct {
    int n_bad_targets;     // bad targets seen so far
    int first_bad_row;     // of the first op call that saw one
    int first_bad_target;
    int V;
    int op;                // CUDA_STATUS_XENT_FWD or CUDA_STATUS_XENT_VP_LOSS
} CudaOpStatus;
enum { CUDA_STATUS_XENT_FWD = 1, CUDA_STATUS_XENT_VP_LOSS = 2 };
/* One sentence for a status that saw bad targets; false when it saw none. */
bool cuda_status_message(const volatile CudaOpStatus *status, char *buf, size_t len);

/* cuda_op_<name>(parameters, tail) for every entry of ops_list.h, the tail
 * by its cuda column (OWN: the GEMM family, cuda_gemm.h). */
#define CUDA_OP_STREAM(name, params) void cuda_op_##name(TP_OP_BARE params, cudaStream_t stream);
#define CUDA_OP_SCRATCH(name, params) void cuda_op_##name(TP_OP_BARE params, void *scratch, cudaStream_t stream);
#define CUDA_OP_STATUS(name, params) \
    void cuda_op_##name(TP_OP_BARE params, CudaOpStatus *status, cudaStream_t stream);
#define CUDA_OP_STEP(name, params) \
    void cuda_op_##name(TP_OP_BARE params, const StepVars *step, cudaStream_t stream);
#define CUDA_OP_STEP_SCRATCH(name, params) \
    void cuda_op_##name(TP_OP_BARE params, const StepVars *step, void *scratch, cudaStream_t stream);
#define CUDA_OP_OWN(name, params)
#define OP(name, cls, cpu, cuda, params, args) CUDA_OP_##cuda(name, params)
#include "ops_list.h"

/* The scratch of the SCRATCH entries, in bytes (a function of their sizes).
 * copy and copy_ids: memmove semantics, overlapping ranges go through
 * scratch: n_bytes when the ranges overlap, else 0 (scratch may be NULL then). */
size_t cuda_copy_scratch_bytes(const void *dst, const void *src, size_t n_bytes);
size_t cuda_bias_bwd_scratch_bytes(int N, int C);
size_t cuda_embedding_bwd_scratch_bytes(int N, int V_local);
size_t cuda_layernorm_bwd_scratch_bytes(int N, int C);
size_t cuda_residual_ln_bwd_scratch_bytes(int N, int C);
size_t cuda_sum_scratch_bytes(size_t n_elems);  // sum_acc and sumsq_acc
/* The bytes version of cuda_op_copy. */
void cuda_op_copy_bytes(void *dst, const void *src, size_t n_bytes, void *scratch, cudaStream_t stream);
/* y16 = bf16(relu(h)) and the ReLU bit-mask of h > 0 (ops_list.h's
 * linear_relu_fwd16, whose fallback it is), one pass over h (N, cols). */
void cuda_op_relu_fwd16_mask(uint16_t *y16, uint8_t *mask, const float *h, int N, int cols, cudaStream_t stream);
/* cuda_op_bias_bwd summing the bf16 rounding of each dy (bias_bwd in bf16
 * mode: the sum of the dy a linear layer's bf16 GEMMs read). The scratch
 * is cuda_bias_bwd_scratch_bytes's, as for the three below. */
void cuda_op_bias_bwd_rounded(float *db, const float *dy, int N, int C, void *scratch, cudaStream_t stream);
/* The same from dy given as bf16 bits (dy16), masked first by a ReLU's
 * gradient where relu16 is given (relu16 > 0 ? dy : 0), else not. */
void cuda_op_bias_bwd_x16(float *db, const uint16_t *dy16, const uint16_t *relu16, int N, int C, void *scratch,
                          cudaStream_t stream);
/* cuda_op_bias_bwd_rounded that also writes dy's bf16 copy (round to
 * nearest even, as the GEMMs' operand copies) as it reads dy: the same db
 * bits and the same copy, one pass over dy instead of two (linear_bwd in
 * bf16). */
void cuda_op_bias_bwd_bf16_copy(float *db, uint16_t *dy16, const float *dy, int N, int C, void *scratch,
                                cudaStream_t stream);
/* The same on dy masked by a ReLU's gradient (relu16 > 0 ? dy : 0, the
 * kept ReLU output's bf16 bits; act_bwd_x16's values): db and the copy of
 * the masked values (db their sum), the masked fp32 dy never written. */
void cuda_op_bias_bwd_relu_bf16_copy(float *db, uint16_t *dy16, const float *dy, const uint16_t *relu16, int N, int C,
                                     void *scratch, cudaStream_t stream);
/* The same from bf16 bits dy16: the masked bits into copy16 (the GEMMs'
 * operand) and their sum into db, one pass. */
void cuda_op_bias_bwd_relu_x16_copy(float *db, uint16_t *copy16, const uint16_t *dy16, const uint16_t *relu16, int N,
                                    int C, void *scratch, cudaStream_t stream);
/* cuda_op_residual_ln_bwd with d_bias the sum of d_branch's bf16 rounding
 * (residual_ln_bwd in bf16 mode: the ROW bias's gradient as linear_bwd's). */
void cuda_op_residual_ln_bwd_bias16(float *d_res, float *d_branch, uint16_t *d_branch16, float *dgamma, float *dbeta,
                                    float *d_bias,
                                    const float *dy, const float *x, const float *mean, const float *rstd,
                                    const float *gamma, int N, int C, uint64_t first, float p, uint64_t seed,
                                    uint64_t stream_id, const StepVars *step, void *scratch, cudaStream_t stream);
/* Attention's fused path (one (b, h) pair per block, out of shared memory;
 * on by default): off sends every call down the general path, which gives
 * the same bits. For the tests that prove that. Process-wide. */
void cuda_attention_set_fused(bool on);
/* Which kernels run attention_flash_fwd / _bwd: the tiled ones
 * (attention_flash.cu: tiles of 32 x 32, any length; the default) or the
 * short-sequence ones (attention_short.cu: a block per (batch, head),
 * sequences up to 128, head widths 16, 32, 64 and 128), which fall back to
 * the tiled ones for any other shape. TPTRAIN_FLASH_KERNEL=tiled|short,
 * read at the first call, chooses for a process; the setter is for the
 * tests, and the counts say which ran (a captured graph's call counts once). */
#define CUDA_FLASH_KERNEL_ENV "TPTRAIN_FLASH_KERNEL"
#define CUDA_FLASH_SHORT_MAX_T 128  // the longest query or key sequence of the short kernels
typedef enum { CUDA_FLASH_TILED, CUDA_FLASH_SHORT } CudaFlashKernel;
void cuda_flash_set_kernel(CudaFlashKernel k);
typedef struct {
    long tiled_fwd, tiled_bwd, short_fwd, short_bwd;  // calls that ran each
} CudaFlashCounts;
CudaFlashCounts cuda_flash_counts(void);

#ifdef __cplusplus
}
#endif
#endif
