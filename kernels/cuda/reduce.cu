// reduce.cu: the device scalars of a step: sums into an accumulator (the
// loss sum, the squared norms), the global norm with its clip factor, and
// scaling by a factor that stays on the device. The host reads these once
// per step (backend_download), so none of them synchronises.
//
// The sums are deterministic, with no atomics: pass 1 runs a grid that
// depends only on n_elems (at most SUM_MAX_BLOCKS blocks); each thread sums
// its grid-stride elements in double, each block reduces in a fixed tree
// and writes one partial into the caller's scratch; pass 2, one block,
// reduces the partials in the same fixed tree and adds the total to acc[0]
// as the CPU does: acc = (float)((double)acc + sum). Squares of floats are
// exact in double, so sumsq differs from the CPU's loop only by the order of
// double additions (n * 2^-53 relative at most).
//
// sumsq_segs is the same sum over a table of segments (kernels/segs.c) in
// one launch: blocks take whole chunks, and the last block to finish (a
// ticket taken after a fence) adds up each segment's chunks in order and
// then adds the segment totals to their accumulators in table order, one
// rounding to float per segment as the CPU's loop of sumsq_acc does.
//
// clip_coef and scale_by are the CPU's expressions rounded the same way
// (sqrt and the division in IEEE arithmetic), so bit-identical.
#include "cuda_ops.h"
#include "cuda_kernel_util.cuh"

#define SUM_THREADS SCRATCH_SUM_THREADS        // kernels/scratch_sizes.h (the scratch size)
#define SUM_MAX_BLOCKS SCRATCH_SUM_MAX_BLOCKS  // = threads of the final pass
#define SCALE_THREADS 256u
#define SEGS_THREADS 256u

// ---- kernels ---------------------------------------------------------------------

// Pass 1: partials[blockIdx.x] = sum of x[i] (or x[i]^2) over this block's elements.
template <bool SQUARE>
__global__ void sum_partial_kernel(double *partials,  // (gridDim.x)
                                   const float *x,    // (n_elems)
                                   size_t n_elems) {
    __shared__ double smem[TP_WARP];
    double acc = 0.0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_elems;
         i += (size_t)gridDim.x * blockDim.x) {
        const double xi = x[i];
        acc += SQUARE ? xi * xi : xi;
    }
    acc = tp_block_sum(acc, smem);
    if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// Pass 2 (one block of SUM_MAX_BLOCKS threads): acc[0] += sum of the partials.
__global__ void sum_final_kernel(float *acc,               // (1)
                                 const double *partials,   // (n_partials)
                                 int n_partials) {
    __shared__ double smem[TP_WARP];
    double v = (int)threadIdx.x < n_partials ? partials[threadIdx.x] : 0.0;
    v = tp_block_sum(v, smem);
    if (threadIdx.x == 0) acc[0] = (float)((double)acc[0] + v);
}

// Chunk c's sum of squares into partials[c], every block grid-stride over the chunks.
__device__ void sumsq_chunks(double *partials, const float *x, const OpSeg *segs,
                             const OpSegChunk *chunks, int n_chunks, double *smem) {
    for (int c = blockIdx.x; c < n_chunks; c += gridDim.x) {
        const OpSegChunk ch = chunks[c];
        const OpSeg s = segs[ch.seg];
        const uint64_t left = s.n - ch.lo;
        const unsigned len = left < OP_SEG_CHUNK_ELEMS ? (unsigned)left : OP_SEG_CHUNK_ELEMS;
        const float *xs = x + s.x_at + ch.lo;
        double a = 0.0;
        for (unsigned i = threadIdx.x; i < len; i += blockDim.x) {
            const double xi = xs[i];
            a += xi * xi;  // exact in double
        }
        a = tp_block_sum(a, smem);
        if (threadIdx.x == 0) partials[c] = a;
    }
}

// The last block: segment totals (threads in parallel, a batch of SEGS_THREADS at a
// time), added to acc by thread 0 in table order.
__device__ void sumsq_segs_finish(float *acc, const OpSeg *segs, const int32_t *first,
                                  const double *partials, int n_segs) {
    __shared__ double seg_sum[SEGS_THREADS];
    __shared__ int seg_acc[SEGS_THREADS];
    float a[OP_SEG_MAX_ACC];
    bool used[OP_SEG_MAX_ACC] = {false};
    for (int base = 0; base < n_segs; base += blockDim.x) {
        const int j = base + threadIdx.x;
        if (j < n_segs) {
            double t = 0.0;
            for (int c = first[j]; c < first[j + 1]; c++) t += __ldcg(&partials[c]);
            seg_sum[threadIdx.x] = t;
            seg_acc[threadIdx.x] = segs[j].acc;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            const int n = n_segs - base < (int)blockDim.x ? n_segs - base : (int)blockDim.x;
            for (int k = 0; k < n; k++) {
                const int q = seg_acc[k];
                if (!used[q]) a[q] = acc[q], used[q] = true;
                a[q] = (float)((double)a[q] + seg_sum[k]);
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0)
        for (int q = 0; q < OP_SEG_MAX_ACC; q++)
            if (used[q]) acc[q] = a[q];
}

// Blocks of SEGS_THREADS threads; the ticket is 0 on entry and again on exit.
__global__ void sumsq_segs_kernel(float *acc,                // (OP_SEG_MAX_ACC) at most: those named
                                  const float *x,            // (every segment's x_at + n)
                                  const OpSeg *segs,         // (n_segs)
                                  const int32_t *first,      // (n_segs + 1) first chunk of each
                                  const OpSegChunk *chunks,  // (n_chunks)
                                  double *partials,          // (n_chunks)
                                  unsigned *ticket,          // (1)
                                  int n_segs, int n_chunks) {
    __shared__ double smem[TP_WARP];
    __shared__ bool last;
    sumsq_chunks(partials, x, segs, chunks, n_chunks, smem);
    __threadfence();  // this block's partials are visible before its ticket
    if (threadIdx.x == 0) last = atomicAdd(ticket, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    sumsq_segs_finish(acc, segs, first, partials, n_segs);
    if (threadIdx.x == 0) *ticket = 0u;
}

// One thread: the CPU's cpu_clip_coef.
__global__ void clip_coef_kernel(float *norm_coef,    // (2)
                                 const float *sumsq,  // (n_parts)
                                 int n_parts, float max_norm) {
    double ss = 0.0;
    for (int i = 0; i < n_parts; i++) ss += sumsq[i];
    const float norm = (float)sqrt(ss);
    const float coef = max_norm > 0.0f ? __fdiv_rn(max_norm, __fadd_rn(norm, 1e-6f)) : 1.0f;
    norm_coef[0] = norm;
    norm_coef[1] = coef < 1.0f ? coef : 1.0f;
}

__global__ void scale_by_kernel(float *x,        // (n_elems)
                                const float *s,  // (1)
                                size_t n_elems) {
    const float f = s[0];
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_elems;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] *= f;
}

// ---- launchers ---------------------------------------------------------------------

static unsigned sum_blocks(size_t n_elems) {
    return scratch_sum_blocks(n_elems);
}

static void sum_launch(float *acc, const float *x, size_t n_elems, bool square,
                       double *partials,  // (sum_blocks(n_elems))
                       cudaStream_t stream) {
    const unsigned n_blocks = sum_blocks(n_elems);
    if (square)
        sum_partial_kernel<true><<<n_blocks, SUM_THREADS, 0, stream>>>(partials, x, n_elems);
    else
        sum_partial_kernel<false><<<n_blocks, SUM_THREADS, 0, stream>>>(partials, x, n_elems);
    CUDA_CHECK(cudaGetLastError());
    sum_final_kernel<<<1, SUM_MAX_BLOCKS, 0, stream>>>(acc, partials, (int)n_blocks);
    CUDA_CHECK(cudaGetLastError());
}

static void sumsq_segs_launch(float *acc, const float *x, const OpSegTable *t,
                              cudaStream_t stream) {
    const unsigned n_blocks = t->n_chunks < (int)TP_MAX_GRID ? (unsigned)t->n_chunks : TP_MAX_GRID;
    sumsq_segs_kernel<<<n_blocks, SEGS_THREADS, 0, stream>>>(
        acc, x, t->d_segs, t->d_first, t->d_chunks, t->d_partials, (unsigned *)t->d_ticket,
        t->n_segs, t->n_chunks);
    CUDA_CHECK(cudaGetLastError());
}

static void clip_coef_launch(float *norm_coef, const float *sumsq, int n_parts, float max_norm,
                             cudaStream_t stream) {
    clip_coef_kernel<<<1, 1, 0, stream>>>(norm_coef, sumsq, n_parts, max_norm);
    CUDA_CHECK(cudaGetLastError());
}

static void scale_by_launch(float *x, const float *s, size_t n_elems, cudaStream_t stream) {
    scale_by_kernel<<<tp_grid_1d(n_elems, SCALE_THREADS), SCALE_THREADS, 0, stream>>>(x, s,
                                                                                     n_elems);
    CUDA_CHECK(cudaGetLastError());
}

// ---- exported ops ---------------------------------------------------------------------

extern "C" size_t cuda_sum_scratch_bytes(size_t n_elems) {
    return scratch_sum(n_elems);
}

static void sum_op(const char *op, float *acc, const float *x, size_t n_elems, bool square,
                   void *scratch, cudaStream_t stream) {
    if (n_elems == 0) return;  // adds nothing
    TP_NEED_PTR(op, acc);
    TP_NEED_PTR(op, x);
    TpCarver cv = tp_carver(scratch, cuda_sum_scratch_bytes(n_elems), op);
    double *partials = (double *)tp_carve(&cv, sum_blocks(n_elems) * sizeof(double));
    sum_launch(acc, x, n_elems, square, partials, stream);
}

extern "C" void cuda_op_sum_acc(float *acc, const float *x, size_t n_elems, void *scratch,
                                cudaStream_t stream) {
    sum_op("cuda_op_sum_acc", acc, x, n_elems, false, scratch, stream);
}

extern "C" void cuda_op_sumsq_acc(float *acc, const float *x, size_t n_elems, void *scratch,
                                  cudaStream_t stream) {
    sum_op("cuda_op_sumsq_acc", acc, x, n_elems, true, scratch, stream);
}

extern "C" void cuda_op_sumsq_segs(float *acc, const float *x, const OpSegTable *segs,
                                   cudaStream_t stream) {
    TP_NEED_PTR("cuda_op_sumsq_segs", segs);
    if (segs->n_chunks == 0) return;  // adds nothing
    TP_NEED_PTR("cuda_op_sumsq_segs", acc);
    TP_NEED_PTR("cuda_op_sumsq_segs", x);
    sumsq_segs_launch(acc, x, segs, stream);
}

extern "C" void cuda_op_clip_coef(float *norm_coef, const float *sumsq, int n_parts,
                                  float max_norm, cudaStream_t stream) {
    TP_NEED_SIZE("cuda_op_clip_coef", n_parts);
    TP_NEED_PTR("cuda_op_clip_coef", norm_coef);
    if (n_parts > 0) TP_NEED_PTR("cuda_op_clip_coef", sumsq);
    clip_coef_launch(norm_coef, sumsq, n_parts, max_norm, stream);
}

extern "C" void cuda_op_scale_by(float *x, const float *s, size_t n_elems, cudaStream_t stream) {
    if (n_elems == 0) return;
    TP_NEED_PTR("cuda_op_scale_by", x);
    TP_NEED_PTR("cuda_op_scale_by", s);
    scale_by_launch(x, s, n_elems, stream);
}
