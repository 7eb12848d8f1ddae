// embedding.cu: token embedding lookup and its scatter-add backward.
//
// The forward is a gather: one block per output row, out = scale * table row
// (or zeros for ids of another vocab shard), bit-identical to the CPU.
//
// The backward must add several rows of dout into one table row when a token
// repeats, and must do it deterministically, so no float atomics. It groups
// the rows by token with a stable sort instead:
//   1. key[n] = ids[n] - vocab_start, or V_local for another shard's id;
//      val[n] = n;
//   2. CUB's radix sort of (key, val) pairs: stable, so rows of one token
//      stay in increasing n;
//   3. one block per sorted position; the block that starts a run of equal
//      keys owns that table row and adds the run's dout rows into it, in
//      increasing n, one fp32 multiply and add at a time (the __fmul_rn /
//      __fadd_rn intrinsics stop nvcc from fusing them into an FMA).
// That is exactly the CPU's order of operations per table element, so the
// result is bit-identical to op_embedding_bwd and independent of scheduling.
// Cost: O(N log V_local) to sort, O(N * C) to add; a token repeated r times
// is summed serially by one block (r steps), which is fine at these batch
// sizes (splitting long runs would break bit-equality with the CPU).
// The keys, values and CUB's temporary storage live in the caller's scratch
// (cuda_embedding_bwd_scratch_bytes): no allocation.
#include <cub/device/device_radix_sort.cuh>

#include "cuda_ops.h"
#include "cuda_kernel_util.cuh"

#define EMB_MAX_THREADS 256

// ---- kernels ---------------------------------------------------------------------

__global__ void embedding_fwd_kernel(float *out,          // (N, C)
                                     const int32_t *ids,  // (N)
                                     const float *table,  // (V_local, C)
                                     float scale, int N, int C, int vocab_start,
                                     int V_local) {
    for (int n = blockIdx.x; n < N; n += gridDim.x) {
        const long long local = (long long)ids[n] - vocab_start;
        const bool own = local >= 0 && local < V_local;
        float *row = out + (size_t)n * C;
        const float *src = own ? table + (size_t)local * C : NULL;
        for (int c = threadIdx.x; c < C; c += blockDim.x) row[c] = own ? scale * src[c] : 0.0f;
    }
}

__global__ void embedding_keys_kernel(uint32_t *keys,      // (N)
                                      int32_t *vals,       // (N)
                                      const int32_t *ids,  // (N)
                                      int N, int vocab_start, int V_local) {
    for (int n = blockIdx.x * blockDim.x + threadIdx.x; n < N; n += gridDim.x * blockDim.x) {
        const long long local = (long long)ids[n] - vocab_start;
        keys[n] = (local >= 0 && local < V_local) ? (uint32_t)local : (uint32_t)V_local;
        vals[n] = n;
    }
}

// One block per sorted position s; only the first position of a run works.
__global__ void embedding_bwd_runs_kernel(float *dtable,           // (V_local, C) accumulated
                                          const float *dout,       // (N, C)
                                          const uint32_t *keys,    // (N) sorted
                                          const int32_t *vals,     // (N) row of each key
                                          float scale, int N, int C, int V_local) {
    for (int s = blockIdx.x; s < N; s += gridDim.x) {
        const uint32_t key = keys[s];
        if (key >= (uint32_t)V_local) continue;      // another shard's id
        if (s > 0 && keys[s - 1] == key) continue;   // not the start of the run
        int end = s + 1;
        while (end < N && keys[end] == key) end++;
        float *dst = dtable + (size_t)key * C;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            float acc = dst[c];
            for (int j = s; j < end; j++)
                acc = __fadd_rn(acc, __fmul_rn(scale, dout[(size_t)vals[j] * C + c]));
            dst[c] = acc;
        }
    }
}

__global__ void add_positions_kernel(float *x,  // (B, T, C)
                                     int B, int T, int C) {
    const int half = C / 2;
    const size_t n_pairs = (size_t)T * half;
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < n_pairs;
         k += (size_t)gridDim.x * blockDim.x) {
        const int t = (int)(k / half), i = (int)(k % half);
        // the CPU's expression, in double, rounded once
        const double angle = t * pow(10000.0, -(2.0 * i) / C);
        const float s = (float)sin(angle), c = (float)cos(angle);
        for (int b = 0; b < B; b++) {
            float *row = x + ((size_t)b * T + t) * C;
            row[2 * i] += s;
            row[2 * i + 1] += c;
        }
    }
}

// ---- launchers ---------------------------------------------------------------------

static unsigned row_threads(int C) {
    int t = (C + TP_WARP - 1) / TP_WARP * TP_WARP;
    return (unsigned)(t > EMB_MAX_THREADS ? EMB_MAX_THREADS : t);
}

static void embedding_fwd_launch(float *out, const int32_t *ids, const float *table, float scale,
                                 int N, int C, int vocab_start, int V_local,
                                 cudaStream_t stream) {
    embedding_fwd_kernel<<<tp_grid_1d((size_t)N, 1), row_threads(C), 0, stream>>>(
        out, ids, table, scale, N, C, vocab_start, V_local);
    CUDA_CHECK(cudaGetLastError());
}

// Keys take values 0..V_local: sort only the bits that can be set.
static int key_bits(int V_local) { return scratch_key_bits(V_local); }

// CUB's temporary storage for sorting N pairs (a size query: nothing runs).
static size_t sort_temp_bytes(int N, int V_local) {
    size_t n_bytes = 0;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(NULL, n_bytes, (const uint32_t *)NULL,
                                               (uint32_t *)NULL, (const int32_t *)NULL,
                                               (int32_t *)NULL, N, 0, key_bits(V_local)));
    return n_bytes;
}

static void embedding_bwd_launch(float *dtable, const float *dout, const int32_t *ids,
                                 float scale, int N, int C, int vocab_start, int V_local,
                                 TpCarver *cv, cudaStream_t stream) {
    const size_t arr_bytes = (size_t)N * sizeof(uint32_t);
    uint32_t *keys_in = (uint32_t *)tp_carve(cv, arr_bytes);   // (N)
    uint32_t *keys_out = (uint32_t *)tp_carve(cv, arr_bytes);  // (N)
    int32_t *vals_in = (int32_t *)tp_carve(cv, arr_bytes);     // (N)
    int32_t *vals_out = (int32_t *)tp_carve(cv, arr_bytes);    // (N)
    // CUB's temporary storage: the planned bound (kernels/scratch_sizes.h),
    // which what this CUB asks for must not exceed
    size_t sort_bytes = scratch_sort_pairs_bound(N, key_bits(V_local));  // (CUB takes it by reference)
    const size_t cub_bytes = sort_temp_bytes(N, V_local);
    TP_CHECK(cub_bytes <= sort_bytes,
             "cuda_op_embedding_bwd: CUB's radix sort of %d pairs asks for %zu bytes of temporary storage, more than "
             "the %zu of scratch_sort_pairs_bound (kernels/scratch_sizes.c): raise the bound", N, cub_bytes, sort_bytes);
    void *sort_temp = tp_carve(cv, sort_bytes);

    embedding_keys_kernel<<<tp_grid_1d((size_t)N, 256), 256, 0, stream>>>(keys_in, vals_in, ids,
                                                                          N, vocab_start, V_local);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(sort_temp, sort_bytes, keys_in, keys_out, vals_in,
                                               vals_out, N, 0, key_bits(V_local), stream));
    embedding_bwd_runs_kernel<<<tp_grid_1d((size_t)N, 1), row_threads(C), 0, stream>>>(
        dtable, dout, keys_out, vals_out, scale, N, C, V_local);
    CUDA_CHECK(cudaGetLastError());
}

static void add_positions_launch(float *x, int B, int T, int C, cudaStream_t stream) {
    const size_t n_pairs = (size_t)T * (C / 2);
    add_positions_kernel<<<tp_grid_1d(n_pairs, 256), 256, 0, stream>>>(x, B, T, C);
    CUDA_CHECK(cudaGetLastError());
}

// ---- exported ops ---------------------------------------------------------------------

static void check_embedding(const char *op, int N, int C, int vocab_start, int V_local) {
    TP_NEED_SIZE(op, N);
    TP_NEED_SIZE(op, C);
    TP_NEED_SIZE(op, vocab_start);
    TP_NEED_SIZE(op, V_local);
}

extern "C" void cuda_op_embedding_fwd(float *out, const int32_t *ids, const float *table,
                                      float scale, int N, int C, int vocab_start, int V_local,
                                      cudaStream_t stream) {
    check_embedding("cuda_op_embedding_fwd", N, C, vocab_start, V_local);
    if (N == 0 || C == 0) return;
    TP_NEED_PTR("cuda_op_embedding_fwd", out);
    TP_NEED_PTR("cuda_op_embedding_fwd", ids);
    if (V_local > 0) TP_NEED_PTR("cuda_op_embedding_fwd", table);
    embedding_fwd_launch(out, ids, table, scale, N, C, vocab_start, V_local, stream);
}

extern "C" size_t cuda_embedding_bwd_scratch_bytes(int N, int V_local) {
    return scratch_embedding_bwd(N, V_local);
}

extern "C" void cuda_op_embedding_bwd(float *dtable, const float *dout, const int32_t *ids,
                                      float scale, int N, int C, int vocab_start, int V_local,
                                      void *scratch, cudaStream_t stream) {
    check_embedding("cuda_op_embedding_bwd", N, C, vocab_start, V_local);
    if (N == 0 || C == 0 || V_local == 0) return;  // no row of this shard is touched
    TP_NEED_PTR("cuda_op_embedding_bwd", dtable);
    TP_NEED_PTR("cuda_op_embedding_bwd", dout);
    TP_NEED_PTR("cuda_op_embedding_bwd", ids);
    TpCarver cv = tp_carver(scratch, cuda_embedding_bwd_scratch_bytes(N, V_local),
                            "cuda_op_embedding_bwd");
    embedding_bwd_launch(dtable, dout, ids, scale, N, C, vocab_start, V_local, &cv, stream);
}

extern "C" void cuda_op_add_positions(float *x, int B, int T, int C, cudaStream_t stream) {
    TP_NEED_SIZE("cuda_op_add_positions", B);
    TP_NEED_SIZE("cuda_op_add_positions", T);
    TP_NEED_SIZE("cuda_op_add_positions", C);
    TP_CHECK(C % 2 == 0, "cuda_op_add_positions: C must be even, got %d", C);
    if (B == 0 || T == 0 || C == 0) return;
    TP_NEED_PTR("cuda_op_add_positions", x);
    add_positions_launch(x, B, T, C, stream);
}
