// xent.cu: label-smoothed cross-entropy, over full logit rows and in the
// vocab-parallel pieces of ops.h.
//
// Rows are a vocabulary wide (tens of thousands), so one block per row:
// threads stride the row, the max is a block max, sum exp(x - max) and
// sum x are accumulated in double (as the CPU) and reduced in a fixed tree,
// so every statistic is deterministic. No softmax copy is ever stored: the
// backward recomputes exp(x - lse) per element from the saved lse.
//
// Targets live on the device, so the forward ops cannot die at a bad row
// as the CPU does, and they must not synchronise to ask. A separate
// one-block kernel counts the targets outside [0, V) (an integer block sum
// and a block min for the first bad row: no atomics) and, only when it finds
// some, records them in the caller's CudaOpStatus, which lives in host
// memory mapped into the device. The backend reads it at its next
// synchronisation and dies there with cuda_status_message's sentence. Bad
// rows get loss 0 meanwhile.
#include <stdio.h>

#include "cuda_ops.h"
#include "cuda_kernel_util.cuh"

#define XENT_THREADS 256u
#define XENT_CHECK_THREADS 1024u

// ---- kernels ---------------------------------------------------------------------

// Records targets outside [0, V) (ignore_id aside) in *status; one block.
// Writes nothing when every target is valid.
__global__ void xent_check_kernel(CudaOpStatus *status,    // (1) host memory, mapped
                                  const int32_t *targets,  // (N)
                                  int N, int V, int32_t ignore_id, int op) {
    __shared__ int smem[TP_WARP];
    int bad = 0, first = INT_MAX;
    for (int n = threadIdx.x; n < N; n += blockDim.x) {
        const int32_t y = targets[n];
        if (y == ignore_id || (y >= 0 && y < V)) continue;
        bad++;
        first = min(first, n);
    }
    bad = tp_block_sum(bad, smem);
    first = tp_block_min(first, smem);
    if (threadIdx.x == 0 && bad > 0) {
        if (status->n_bad_targets == 0) {
            status->first_bad_row = first;
            status->first_bad_target = targets[first];
            status->V = V;
            status->op = op;
        }
        status->n_bad_targets += bad;
    }
}

// One block per row: losses[n], lse[n] of the full row.
__global__ void xent_fwd_kernel(float *losses,           // (N)
                                float *lse,              // (N)
                                const float *logits,     // (N, V)
                                const int32_t *targets,  // (N)
                                int N, int V, float eps, int32_t ignore_id) {
    __shared__ float smem_f[TP_WARP];
    __shared__ double smem_d[TP_WARP];
    for (int n = blockIdx.x; n < N; n += gridDim.x) {
        const int32_t y = targets[n];  // the same for the whole block
        if (y == ignore_id || y < 0 || y >= V) {
            if (threadIdx.x == 0) {
                losses[n] = 0.0f;
                lse[n] = 0.0f;
            }
            continue;
        }
        const float *row = logits + (size_t)n * V;
        float max = -INFINITY;
        for (int v = threadIdx.x; v < V; v += blockDim.x) max = fmaxf(max, row[v]);
        max = tp_block_max(max, smem_f);
        double sum_exp = 0.0, sum_x = 0.0;
        for (int v = threadIdx.x; v < V; v += blockDim.x) {
            sum_exp += expf(row[v] - max);
            sum_x += row[v];
        }
        sum_exp = tp_block_sum(sum_exp, smem_d);
        sum_x = tp_block_sum(sum_x, smem_d);
        if (threadIdx.x == 0) {
            const double row_lse = max + log(sum_exp);
            const double nll = row_lse - row[y];
            const double smooth = row_lse - sum_x / V;
            losses[n] = (float)((1.0 - eps) * nll + eps * smooth);
            lse[n] = (float)row_lse;
        }
    }
}

// An output element: fp32, or rounded to bf16 bits as it is stored.
__device__ __forceinline__ void st_out(float *x, long long i, float v) { x[i] = v; }
__device__ __forceinline__ void st_out(uint16_t *x, long long i, float v) { x[i] = tp_bf16_bits(v); }

// g[n, v] = dloss * (exp(x - lse) - (1-eps)[v == local] - smooth) for
// v < V_valid; local = targets[n] - vocab_start. The full-row backward is the
// one-shard case (V_local = V_valid = V, vocab_start = 0).
// grid (column blocks, row blocks). T: the logits' storage (fp32, or bf16
// bits read widened: the same arithmetic on the same values).
//   IN_PLACE false (op_xent_vp_bwd): dlogits += g; ignored rows and padding
//     columns are left as they are.
//   IN_PLACE true (op_xent_vp_grad_inplace, _inplace16): out is logits, and
//     g is written over the logit it is computed from (each element read and
//     written by one thread; to bf16 rounded as stored); ignored rows and
//     padding columns become 0.
// step: the backend's StepVars (backend.h), whose loss_scale replaces dloss
// (read on the device: a graph's replay reads the new one), or NULL.
template <bool IN_PLACE, typename T>
__global__ void xent_bwd_kernel(float *dlogits,          // (N, V_local): !IN_PLACE
                                T *out,                  // (N, V_local): IN_PLACE, = logits
                                const T *logits,         // (N, V_local)
                                const float *lse,        // (N)
                                const int32_t *targets,  // (N)
                                float dloss, const StepVars *step, float smooth, int N, int V_local,
                                int V_valid, int vocab_start, float eps, int32_t ignore_id) {
    if (step) dloss = step->loss_scale;
    for (int n = blockIdx.y; n < N; n += gridDim.y) {
        const int32_t y = targets[n];
        if (!IN_PLACE && y == ignore_id) continue;
        const int valid = y == ignore_id ? 0 : V_valid;
        const long long local = (long long)y - vocab_start;
        const float row_lse = lse[n];
        const T *row = logits + (size_t)n * V_local;
        const int end = IN_PLACE ? V_local : V_valid;
        for (int v = blockIdx.x * blockDim.x + threadIdx.x; v < end; v += gridDim.x * blockDim.x) {
            float g = 0.0f;
            if (v < valid) {
                const float p = expf(ld_in(row, v) - row_lse);
                const float target = (v == local ? 1.0f - eps : 0.0f) + smooth;
                g = dloss * (p - target);
            }
            if (IN_PLACE) st_out(out + (size_t)n * V_local, v, g);
            else dlogits[(size_t)n * V_local + v] += g;
        }
    }
}

// One block per row: the shard's max over its V_valid real columns.
template <typename T>
__global__ void xent_vp_max_kernel(float *row_max,    // (N)
                                   const T *logits,   // (N, V_local)
                                   int N, int V_local, int V_valid) {
    __shared__ float smem[TP_WARP];
    for (int n = blockIdx.x; n < N; n += gridDim.x) {
        const T *row = logits + (size_t)n * V_local;
        float max = -INFINITY;
        for (int v = threadIdx.x; v < V_valid; v += blockDim.x) max = fmaxf(max, ld_in(row, v));
        max = tp_block_max(max, smem);
        if (threadIdx.x == 0) row_max[n] = max;
    }
}

// One block per row: {sum exp(x - max), sum x, x_target or 0} of the shard.
template <typename T>
__global__ void xent_vp_sums_kernel(float *stats,            // (N, 3)
                                    const T *logits,         // (N, V_local)
                                    const float *row_max,    // (N) global
                                    const int32_t *targets,  // (N)
                                    int N, int V_local, int V_valid, int vocab_start,
                                    int32_t ignore_id) {
    __shared__ double smem[TP_WARP];
    for (int n = blockIdx.x; n < N; n += gridDim.x) {
        float *st = stats + (size_t)n * 3;
        const int32_t y = targets[n];
        if (y == ignore_id) {
            if (threadIdx.x == 0) st[0] = st[1] = st[2] = 0.0f;
            continue;
        }
        const T *row = logits + (size_t)n * V_local;
        const float max = row_max[n];
        double sum_exp = 0.0, sum_x = 0.0;
        for (int v = threadIdx.x; v < V_valid; v += blockDim.x) {
            const float x = ld_in(row, v);
            sum_exp += expf(x - max);
            sum_x += x;
        }
        sum_exp = tp_block_sum(sum_exp, smem);
        sum_x = tp_block_sum(sum_x, smem);
        if (threadIdx.x == 0) {
            const long long local = (long long)y - vocab_start;
            st[0] = (float)sum_exp;
            st[1] = (float)sum_x;
            st[2] = (local >= 0 && local < V_valid) ? ld_in(row, local) : 0.0f;
        }
    }
}

// One thread per row: loss and lse from the reduced statistics.
__global__ void xent_vp_loss_kernel(float *losses,           // (N)
                                    float *lse,              // (N)
                                    const float *row_max,    // (N) global
                                    const float *stats,      // (N, 3) reduced
                                    const int32_t *targets,  // (N)
                                    int N, int V, float eps, int32_t ignore_id) {
    for (int n = blockIdx.x * blockDim.x + threadIdx.x; n < N; n += gridDim.x * blockDim.x) {
        const int32_t y = targets[n];
        if (y == ignore_id || y < 0 || y >= V) {
            losses[n] = 0.0f;
            lse[n] = 0.0f;
            continue;
        }
        const float *st = stats + (size_t)n * 3;
        const double row_lse = (double)row_max[n] + log((double)st[0]);
        const double nll = row_lse - st[2];
        const double smooth = row_lse - (double)st[1] / V;
        losses[n] = (float)((1.0 - eps) * nll + eps * smooth);
        lse[n] = (float)row_lse;
    }
}

// ---- launchers ---------------------------------------------------------------------

static void check_targets_launch(CudaOpStatus *status, const int32_t *targets, int N, int V,
                                 int32_t ignore_id, int op, cudaStream_t stream) {
    xent_check_kernel<<<1, XENT_CHECK_THREADS, 0, stream>>>(status, targets, N, V, ignore_id, op);
    CUDA_CHECK(cudaGetLastError());
}

static unsigned row_grid(int N) { return tp_grid_1d((size_t)N, 1); }

static void xent_fwd_launch(float *losses, float *lse, const float *logits,
                            const int32_t *targets, int N, int V, float eps, int32_t ignore_id,
                            CudaOpStatus *status, cudaStream_t stream) {
    xent_fwd_kernel<<<row_grid(N), XENT_THREADS, 0, stream>>>(losses, lse, logits, targets, N, V,
                                                             eps, ignore_id);
    CUDA_CHECK(cudaGetLastError());
    check_targets_launch(status, targets, N, V, ignore_id, CUDA_STATUS_XENT_FWD, stream);
}

static void xent_bwd_launch(float *dlogits, const float *logits, const float *lse,
                            const int32_t *targets, float dloss, int N, int V_local, int V_valid,
                            int vocab_start, int V, float eps, int32_t ignore_id,
                            cudaStream_t stream) {
    const float smooth = eps / (float)V;  // the CPU's expression
    dim3 grid(tp_grid_1d((size_t)V_valid, XENT_THREADS), row_grid(N));
    xent_bwd_kernel<false, float><<<grid, XENT_THREADS, 0, stream>>>(
        dlogits, (float *)NULL, logits, lse, targets, dloss, (const StepVars *)NULL, smooth, N, V_local, V_valid,
        vocab_start, eps, ignore_id);
    CUDA_CHECK(cudaGetLastError());
}

template <typename T>
static void xent_grad_inplace_launch(T *logits, const float *lse, const int32_t *targets,
                                     float dloss, const StepVars *step, int N, int V_local, int V_valid,
                                     int vocab_start, int V, float eps, int32_t ignore_id, cudaStream_t stream) {
    const float smooth = eps / (float)V;  // the CPU's expression
    dim3 grid(tp_grid_1d((size_t)V_local, XENT_THREADS), row_grid(N));
    xent_bwd_kernel<true, T><<<grid, XENT_THREADS, 0, stream>>>(
        (float *)NULL, logits, logits, lse, targets, dloss, step, smooth, N, V_local, V_valid, vocab_start, eps,
        ignore_id);
    CUDA_CHECK(cudaGetLastError());
}

template <typename T>
static void xent_vp_max_launch(float *row_max, const T *logits, int N, int V_local,
                               int V_valid, cudaStream_t stream) {
    xent_vp_max_kernel<T><<<row_grid(N), XENT_THREADS, 0, stream>>>(row_max, logits, N, V_local,
                                                                   V_valid);
    CUDA_CHECK(cudaGetLastError());
}

template <typename T>
static void xent_vp_sums_launch(float *stats, const T *logits, const float *row_max,
                                const int32_t *targets, int N, int V_local, int V_valid,
                                int vocab_start, int32_t ignore_id, cudaStream_t stream) {
    xent_vp_sums_kernel<T><<<row_grid(N), XENT_THREADS, 0, stream>>>(
        stats, logits, row_max, targets, N, V_local, V_valid, vocab_start, ignore_id);
    CUDA_CHECK(cudaGetLastError());
}

static void xent_vp_loss_launch(float *losses, float *lse, const float *row_max,
                                const float *stats, const int32_t *targets, int N, int V,
                                float eps, int32_t ignore_id, CudaOpStatus *status,
                                cudaStream_t stream) {
    xent_vp_loss_kernel<<<tp_grid_1d((size_t)N, XENT_THREADS), XENT_THREADS, 0, stream>>>(
        losses, lse, row_max, stats, targets, N, V, eps, ignore_id);
    CUDA_CHECK(cudaGetLastError());
    check_targets_launch(status, targets, N, V, ignore_id, CUDA_STATUS_XENT_VP_LOSS, stream);
}

// ---- exported ops ---------------------------------------------------------------------

extern "C" bool cuda_status_message(const volatile CudaOpStatus *status, char *buf, size_t len) {
    if (status->n_bad_targets == 0) return false;
    snprintf(buf, len,
             "%s: %d target%s outside [0, %d) (the first: %d in row %d; found on the device, "
             "reported at the next synchronisation)",
             status->op == CUDA_STATUS_XENT_VP_LOSS ? "op_xent_vp_loss" : "op_xent_fwd",
             status->n_bad_targets, status->n_bad_targets == 1 ? "" : "s", status->V,
             status->first_bad_target, status->first_bad_row);
    return true;
}

extern "C" void cuda_op_xent_fwd(float *losses, float *lse, const float *logits,
                                 const int32_t *targets, int N, int V, float eps,
                                 int32_t ignore_id, CudaOpStatus *status, cudaStream_t stream) {
    const char *op = "cuda_op_xent_fwd";
    TP_NEED_SIZE(op, N);
    TP_NEED_SIZE(op, V);
    if (N == 0) return;
    TP_NEED_PTR(op, losses);
    TP_NEED_PTR(op, lse);
    if (V > 0) TP_NEED_PTR(op, logits);  // V == 0: every row must be ignored
    TP_NEED_PTR(op, targets);
    TP_NEED_PTR(op, status);
    xent_fwd_launch(losses, lse, logits, targets, N, V, eps, ignore_id, status, stream);
}

extern "C" void cuda_op_xent_bwd(float *dlogits, const float *logits, const float *lse,
                                 const int32_t *targets, float dloss, int N, int V, float eps,
                                 int32_t ignore_id, cudaStream_t stream) {
    const char *op = "cuda_op_xent_bwd";
    TP_NEED_SIZE(op, N);
    TP_NEED_SIZE(op, V);
    if (N == 0 || V == 0) return;
    TP_NEED_PTR(op, dlogits);
    TP_NEED_PTR(op, logits);
    TP_NEED_PTR(op, lse);
    TP_NEED_PTR(op, targets);
    xent_bwd_launch(dlogits, logits, lse, targets, dloss, N, V, V, 0, V, eps, ignore_id, stream);
}

static void check_vp(const char *op, int N, int V_local, int V_valid) {
    TP_NEED_SIZE(op, N);
    TP_NEED_SIZE(op, V_local);
    TP_CHECK(V_valid >= 0 && V_valid <= V_local, "%s: V_valid = %d outside [0, V_local = %d]",
             op, V_valid, V_local);
}

template <typename T>
static void vp_max(const char *op, float *row_max, const T *logits, int N, int V_local, int V_valid,
                   cudaStream_t stream) {
    check_vp(op, N, V_local, V_valid);
    if (N == 0) return;
    TP_NEED_PTR(op, row_max);
    if (V_valid > 0) TP_NEED_PTR(op, logits);
    xent_vp_max_launch(row_max, logits, N, V_local, V_valid, stream);
}

extern "C" void cuda_op_xent_vp_max(float *row_max, const float *logits, int N, int V_local,
                                    int V_valid, cudaStream_t stream) {
    vp_max("cuda_op_xent_vp_max", row_max, logits, N, V_local, V_valid, stream);
}

extern "C" void cuda_op_xent_vp_max16(float *row_max, const uint16_t *logits16, int N, int V_local,
                                      int V_valid, cudaStream_t stream) {
    vp_max("cuda_op_xent_vp_max16", row_max, logits16, N, V_local, V_valid, stream);
}

template <typename T>
static void vp_sums(const char *op, float *stats, const T *logits, const float *row_max,
                    const int32_t *targets, int N, int V_local, int V_valid, int vocab_start,
                    int32_t ignore_id, cudaStream_t stream) {
    check_vp(op, N, V_local, V_valid);
    TP_NEED_SIZE(op, vocab_start);
    if (N == 0) return;
    TP_NEED_PTR(op, stats);
    TP_NEED_PTR(op, row_max);
    TP_NEED_PTR(op, targets);
    if (V_valid > 0) TP_NEED_PTR(op, logits);
    xent_vp_sums_launch(stats, logits, row_max, targets, N, V_local, V_valid, vocab_start,
                        ignore_id, stream);
}

extern "C" void cuda_op_xent_vp_sums(float *stats, const float *logits, const float *row_max,
                                     const int32_t *targets, int N, int V_local, int V_valid,
                                     int vocab_start, int32_t ignore_id, cudaStream_t stream) {
    vp_sums("cuda_op_xent_vp_sums", stats, logits, row_max, targets, N, V_local, V_valid,
            vocab_start, ignore_id, stream);
}

extern "C" void cuda_op_xent_vp_sums16(float *stats, const uint16_t *logits16, const float *row_max,
                                       const int32_t *targets, int N, int V_local, int V_valid,
                                       int vocab_start, int32_t ignore_id, cudaStream_t stream) {
    vp_sums("cuda_op_xent_vp_sums16", stats, logits16, row_max, targets, N, V_local, V_valid,
            vocab_start, ignore_id, stream);
}

extern "C" void cuda_op_xent_vp_loss(float *losses, float *lse, const float *row_max,
                                     const float *stats, const int32_t *targets, int N, int V,
                                     float eps, int32_t ignore_id, CudaOpStatus *status,
                                     cudaStream_t stream) {
    const char *op = "cuda_op_xent_vp_loss";
    TP_NEED_SIZE(op, N);
    TP_NEED_SIZE(op, V);
    if (N == 0) return;
    TP_NEED_PTR(op, losses);
    TP_NEED_PTR(op, lse);
    TP_NEED_PTR(op, row_max);
    TP_NEED_PTR(op, stats);
    TP_NEED_PTR(op, targets);
    TP_NEED_PTR(op, status);
    xent_vp_loss_launch(losses, lse, row_max, stats, targets, N, V, eps, ignore_id, status,
                        stream);
}

extern "C" void cuda_op_xent_vp_bwd(float *dlogits, const float *logits, const float *lse,
                                    const int32_t *targets, float dloss, int N, int V_local,
                                    int V_valid, int vocab_start, int V, float eps,
                                    int32_t ignore_id, cudaStream_t stream) {
    const char *op = "cuda_op_xent_vp_bwd";
    check_vp(op, N, V_local, V_valid);
    TP_NEED_SIZE(op, vocab_start);
    TP_NEED_SIZE(op, V);
    if (N == 0 || V_valid == 0) return;
    TP_CHECK(V > 0, "%s: V = 0 with real columns in the shard", op);
    TP_NEED_PTR(op, dlogits);
    TP_NEED_PTR(op, logits);
    TP_NEED_PTR(op, lse);
    TP_NEED_PTR(op, targets);
    xent_bwd_launch(dlogits, logits, lse, targets, dloss, N, V_local, V_valid, vocab_start, V, eps,
                    ignore_id, stream);
}

template <typename T>
static void vp_grad_inplace(const char *op, T *logits, const float *lse, const int32_t *targets,
                            float dloss, const StepVars *step, int N, int V_local, int V_valid,
                            int vocab_start, int V, float eps, int32_t ignore_id, cudaStream_t stream) {
    check_vp(op, N, V_local, V_valid);
    TP_NEED_SIZE(op, vocab_start);
    TP_NEED_SIZE(op, V);
    if (N == 0) return;
    TP_CHECK(V > 0 || V_valid == 0, "%s: V = 0 with real columns in the shard", op);
    TP_NEED_PTR(op, logits);
    TP_NEED_PTR(op, lse);
    TP_NEED_PTR(op, targets);
    xent_grad_inplace_launch(logits, lse, targets, dloss, step, N, V_local, V_valid, vocab_start,
                             V > 0 ? V : 1, eps, ignore_id, stream);
}

extern "C" void cuda_op_xent_vp_grad_inplace(float *logits, const float *lse,
                                             const int32_t *targets, float dloss, int N,
                                             int V_local, int V_valid, int vocab_start, int V,
                                             float eps, int32_t ignore_id, const StepVars *step,
                                             cudaStream_t stream) {
    vp_grad_inplace("cuda_op_xent_vp_grad_inplace", logits, lse, targets, dloss, step, N, V_local,
                    V_valid, vocab_start, V, eps, ignore_id, stream);
}

extern "C" void cuda_op_xent_vp_grad_inplace16(uint16_t *logits16, const float *lse,
                                               const int32_t *targets, float dloss, int N,
                                               int V_local, int V_valid, int vocab_start, int V,
                                               float eps, int32_t ignore_id, const StepVars *step,
                                               cudaStream_t stream) {
    vp_grad_inplace("cuda_op_xent_vp_grad_inplace16", logits16, lse, targets, dloss, step, N, V_local,
                    V_valid, vocab_start, V, eps, ignore_id, stream);
}
