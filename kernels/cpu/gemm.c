/* gemm.c: GEMM, linear layers and bias on the CPU.
 *
 * Every matrix product goes through OpenBLAS sgemm: it is the only place in
 * the CPU reference where speed matters enough to leave plain loops. The
 * linear layer is written as GEMM calls with PyTorch's W[out, in] layout, so
 * the CUDA backend can mirror it call for call. Bias reductions accumulate
 * in double so long token batches do not lose low bits; like every op they
 * allocate nothing (the accumulators are a stack block of columns).
 */
#include <cblas.h>

#include "cpu_ops.h"
#include "err.h"

void cpu_gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
             const float *A,  // (M, K), or (K, M) when trans_a
             const float *B,  // (K, N), or (N, K) when trans_b
             float beta,
             float *C) {      // (M, N)
    TP_CHECK(M >= 0 && N >= 0 && K >= 0, "op_gemm: negative size M=%d N=%d K=%d",
             M, N, K);
    if (M == 0 || N == 0) return;
    if (K == 0) {
        /* op(A) @ op(B) is an (M, N) zero matrix: only the beta term is left.
         * beta == 0 overwrites, so stale NaNs in C do not survive. */
        size_t n_elems = (size_t)M * N;
        for (size_t i = 0; i < n_elems; i++) C[i] = beta == 0.0f ? 0.0f : beta * C[i];
        return;
    }
    int lda = trans_a ? M : K;
    int ldb = trans_b ? K : N;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B,
                ldb, beta, C, N);
}

void cpu_linear_fwd(float *y,        // (N, out)
                   const float *x,  // (N, in)
                   const float *W,  // (out, in)
                   const float *b,  // (out) or NULL
                   int N, int in, int out) {
    cpu_gemm(false, true, N, out, in, 1.0f, x, W, 0.0f, y);  // y = x W^T
    if (b) cpu_bias_add(y, b, N, out);
}

/* The shapes of every argument: ops_list.h's linear_bwd. */
void cpu_linear_bwd(float *dx, GradMode dx_mode, float *dW, float *db, const float *dy, const float *x, const float *W,
                    int N, int in, int out) {
    TP_CHECK(grad_mode_valid(dx_mode), "op_linear_bwd: unknown gradient mode %d", (int)dx_mode);
    if (dx) cpu_gemm(false, false, N, in, out, 1.0f, dy, W, dx_mode == GRAD_ADD ? 1.0f : 0.0f, dx);  // dx (+)= dy W
    if (dW) cpu_gemm(true, false, out, in, N, 1.0f, dy, x, 1.0f, dW);   // dW += dy^T x
    if (db) cpu_bias_bwd(db, dy, N, out);
}

void cpu_bias_add(float *y,        // (N, C)
                 const float *b,  // (C)
                 int N, int C) {
    for (int n = 0; n < N; n++) {
        float *row = y + (size_t)n * C;
        for (int c = 0; c < C; c++) row[c] += b[c];
    }
}

void cpu_bias_bwd(float *db,        // (C)
                 const float *dy,  // (N, C)
                 int N, int C) {
    /* Column sums in double, rows in order, over blocks of COL_BLOCK columns
     * so the accumulators live on the stack (no op allocates). */
    enum { COL_BLOCK = 64 };
    if (N <= 0) return;  // adds nothing
    for (int c0 = 0; c0 < C; c0 += COL_BLOCK) {
        const int nc = C - c0 < COL_BLOCK ? C - c0 : COL_BLOCK;
        double acc[COL_BLOCK] = {0};  // (nc) column sums
        for (int n = 0; n < N; n++) {
            const float *row = dy + (size_t)n * C + c0;
            for (int c = 0; c < nc; c++) acc[c] += row[c];
        }
        for (int c = 0; c < nc; c++) db[c0 + c] += (float)acc[c];
    }
}
