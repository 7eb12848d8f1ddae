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
//   3. one block per (group of columns, sorted position); the blocks that
//      start a run of equal keys own that table row and add the run's dout
//      rows into it, in increasing n, one fp32 multiply and add at a time
//      (the __fmul_rn / __fadd_rn intrinsics stop nvcc from fusing them
//      into an FMA).
// That is exactly the CPU's order of operations per table element, so the
// result is bit-identical to op_embedding_bwd and independent of scheduling.
// Cost: O(N log V_local) to sort, O(N * C) to add. A token repeated r times
// (EOS, BOS, padding, punctuation: thousands of times in a batch) still needs
// r dependent adds per column (splitting a run would break bit-equality with
// the CPU), so the latency of the loads is what a long run must hide: each
// warp owns 32 columns of the run (one per lane) and walks it 32 rows at a
// time: the lanes read the chunk's keys and rows at once (the ballot of equal
// keys finds the run's end: no serial scan), all 32 dout values are loaded
// into registers, and only then added, in order; the next chunk's keys and
// rows are read while those loads are in flight. The column groups of one
// run are separate blocks launched side by side, and runs start in key
// order, so the long runs of the small special ids (padding, BOS, EOS)
// start first rather than queueing behind short ones.
// The keys, values and CUB's temporary storage live in the caller's scratch
// (cuda_embedding_bwd_scratch_bytes): no allocation.
//
// add_positions adds the sinusoid of (t, i), computed once per thread in
// double as the CPU does, to EMB_POS_BATCH rows of the batch per thread.
#include <cub/device/device_radix_sort.cuh>

#include "cuda_ops.h"
#include "cuda_kernel_util.cuh"

#define EMB_MAX_THREADS 256
#define EMB_RUN_CHUNK TP_WARP  // rows of a run one warp has in flight
#define EMB_POS_BATCH 8        // rows of the batch one add_positions thread updates

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

// One warp's 32 columns (c = first column + lane) of the run of `key` that
// starts at sorted position s: acc = dst[c], then + scale * dout row for each
// row of the run in increasing position, EMB_RUN_CHUNK rows at a time.
__device__ void embedding_run_columns(float *dst, const float *__restrict__ dout,
                                      const uint32_t *__restrict__ keys,
                                      const int32_t *__restrict__ vals, uint32_t key, int s,
                                      float scale, int N, int C, int c) {
    const int lane = threadIdx.x % TP_WARP;
    const bool col = c < C;
    float acc = col ? dst[c] : 0.0f;
    int p = s + lane;
    bool in = p < N && keys[p] == key;
    int32_t row = p < N ? vals[p] : 0;
    for (;;) {
        // keys are sorted: the lanes in the run are a prefix of the warp
        const int cnt = __popc(__ballot_sync(TP_FULL_MASK, in));
        float v[EMB_RUN_CHUNK];
#pragma unroll
        for (int k = 0; k < EMB_RUN_CHUNK; k++) {
            const int32_t r = __shfl_sync(TP_FULL_MASK, row, k);
            v[k] = (col && k < cnt) ? dout[(size_t)r * C + c] : 0.0f;
        }
        p += EMB_RUN_CHUNK;  // the next chunk's keys and rows, read while v[] arrives
        const bool more = cnt == EMB_RUN_CHUNK && p < N;
        in = more && keys[p] == key;
        row = more ? vals[p] : 0;
#pragma unroll
        for (int k = 0; k < EMB_RUN_CHUNK; k++)
            if (k < cnt) acc = __fadd_rn(acc, __fmul_rn(scale, v[k]));
        if (cnt < EMB_RUN_CHUNK) break;
    }
    if (col) dst[c] = acc;
}

// Grid (column groups of blockDim.x, sorted positions): a run's column
// groups are neighbours in launch order. Only the first position of a run
// works. Every warp's loop bounds are uniform across it.
__global__ void embedding_bwd_runs_kernel(float *dtable,                    // (V_local, C) accumulated
                                          const float *__restrict__ dout,   // (N, C)
                                          const uint32_t *__restrict__ keys,  // (N) sorted
                                          const int32_t *__restrict__ vals,   // (N) row of each key
                                          float scale, int N, int C, int V_local) {
    const int warp_col = blockIdx.x * blockDim.x + threadIdx.x / TP_WARP * TP_WARP;
    const int col_stride = gridDim.x * blockDim.x;
    for (int s = blockIdx.y; s < N; s += gridDim.y) {
        const uint32_t key = keys[s];
        if (key >= (uint32_t)V_local) continue;      // another shard's id
        if (s > 0 && keys[s - 1] == key) continue;   // not the start of the run
        float *dst = dtable + (size_t)key * C;
        for (int c0 = warp_col; c0 < C; c0 += col_stride)
            embedding_run_columns(dst, dout, keys, vals, key, s, scale, N, C, c0 + threadIdx.x % TP_WARP);
    }
}

// Grid (pairs (t, i), groups of EMB_POS_BATCH rows of the batch): the angle
// once per thread, then the group's loads all issued before its stores (a
// loop of read-modify-writes over b would wait out each load in turn: the
// compiler cannot prove the rows apart).
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
        for (int b0 = blockIdx.y * EMB_POS_BATCH; b0 < B; b0 += gridDim.y * EMB_POS_BATCH) {
            float *base = x + ((size_t)b0 * T + t) * C + 2 * i;
            const size_t step = (size_t)T * C;  // one row of the batch
            float even[EMB_POS_BATCH], odd[EMB_POS_BATCH];
#pragma unroll
            for (int q = 0; q < EMB_POS_BATCH; q++)
                if (b0 + q < B) even[q] = base[q * step], odd[q] = base[q * step + 1];
#pragma unroll
            for (int q = 0; q < EMB_POS_BATCH; q++)
                if (b0 + q < B) base[q * step] = even[q] + s, base[q * step + 1] = odd[q] + c;
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
    const unsigned threads = row_threads(C);
    const dim3 grid(tp_grid_1d((size_t)C, threads), tp_grid_1d((size_t)N, 1));
    embedding_bwd_runs_kernel<<<grid, threads, 0, stream>>>(dtable, dout, keys_out, vals_out, scale,
                                                            N, C, V_local);
    CUDA_CHECK(cudaGetLastError());
}

static void add_positions_launch(float *x, int B, int T, int C, cudaStream_t stream) {
    const size_t n_pairs = (size_t)T * (C / 2);
    const dim3 grid(tp_grid_1d(n_pairs, 256), tp_grid_1d((size_t)B, EMB_POS_BATCH));
    add_positions_kernel<<<grid, 256, 0, stream>>>(x, B, T, C);
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
