/* test_cuda_ops.c: every op of kernels/cuda/cuda_ops.h against the CPU
 * reference (kernels/ops.h) on the same seeded random inputs.
 *
 * Each case builds host inputs, runs the CPU op, uploads the same inputs,
 * runs the CUDA op on a non-blocking stream and compares. Outputs that the
 * ops accumulate into start from random values on both sides and the test
 * compares the increments (result - start), so an op that overwrote instead
 * of accumulating fails by O(1). Masks get their edge cases (k_len < Tk,
 * k_len > Tk, k_len == 0, causal with Tq != Tk), masked scores and padded
 * vocabulary columns hold NaN (an op that reads them fails), and the
 * deterministic reductions are run twice and compared bit for bit.
 *
 * Bad arguments are checked first, in forked children, before this process
 * touches CUDA. Without a GPU the test fails with a one-line reason (it is
 * labeled gpu, so CPU-only CI skips it).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cpu_ops.h"
#include "err.h"
#include "cuda/cuda_common.h"
#include "cuda/cuda_ops.h"
#include "check.h"
#include "testrng.h"

/* ---- tolerances ----------------------------------------------------------------
 * Bit-exact (compared with memcmp): copies, fills, single IEEE operations
 * (add, accumulate, scale, ReLU, bias add, embedding lookup), dropout masks
 * and values, and the embedding scatter-add (the kernel adds in the CPU's
 * order with unfused multiply and add).
 *
 * SUM_RTOL, relative to the largest magnitude of the compared tensor (or
 * increment): fp32 results whose sums run in another order than the CPU's
 * (warp trees vs loops and OpenBLAS, expf vs glibc's). With the O(1) inputs
 * used and at most a few hundred terms per sum the differences are a few
 * 1e-7 of the tensor's scale; 1e-5 keeps a 10x margin, while a wrong index,
 * mask or missing term moves values by O(max).
 * ATTN_BWD_RTOL: attention backward chains three such products and the
 * cancellation dP - rowsum(dP * P), so one more order of magnitude. */
static const double SUM_RTOL = 1e-5;
static const double ATTN_BWD_RTOL = 5e-5;
/* GELU: the kernel's fp32 erfcf/expf (<= 4 ulp) against the CPU's double
 * evaluation rounded once: |diff| <= GELU_TOL * (1 + |want|). */
static const double GELU_TOL = 1e-6;
/* Positions: both sides evaluate pow/sin/cos in double and round once to
 * fp32; libm and CUDA may differ in the last double bit, which can flip one
 * fp32 rounding: 1 ulp of values below 4 is 4.8e-7. */
static const double POS_ATOL = 1e-6;
/* sumsq is accumulated in double on both sides (squares of floats are exact
 * in double); a different order costs at most n * 2^-53 relative, 1.1e-10
 * for the 1e6 elements here. */
static const double SUMSQ_RTOL = 2e-10;
/* AdamW: the kernel rounds every operation as the CPU's fp32 code does, so
 * results are expected identical; 1e-6 of the tensor's scale (about 8 ulp of
 * p ~ 1, 13 of m ~ 0.1) leaves room for a CPU build that contracts into FMA
 * and still catches a wrong term (a missing decay moves p by lr*wd*|p| =
 * 1e-3, a wrong bias correction by a good part of a ~1e-2 step). */
static const double ADAM_RTOL = 1e-6;
/* Increments smaller than this across a whole tensor mean the case tests
 * nothing: every compared tensor must carry at least this much signal. */
static const double MIN_SIGNAL = 1e-3;

/* ---- host helpers ------------------------------------------------------------- */


static float *host_copy(const float *src, size_t n) {
    float *x = TP_MALLOC((n ? n : 1) * sizeof(float));
    if (n) memcpy(x, src, n * sizeof(float));
    return x;
}

static float *host_alloc(size_t n) { return TP_CALLOC(n ? n : 1, sizeof(float)); }

/* ---- device helpers ------------------------------------------------------------ */

#define TEST_CUDA(call)                                                                  \
    do {                                                                                 \
        cudaError_t e_ = (call);                                                         \
        if (e_ != cudaSuccess) {                                                         \
            fprintf(stderr, "test_cuda_ops: %s failed: %s (%s:%d)\n", #call,              \
                    cudaGetErrorString(e_), __FILE__, __LINE__);                         \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

static cudaStream_t g_stream;

static void *dev_upload_bytes(const void *h, size_t n_bytes) {
    void *d = NULL;
    TEST_CUDA(cudaMalloc(&d, n_bytes ? n_bytes : 4));
    if (n_bytes) TEST_CUDA(cudaMemcpy(d, h, n_bytes, cudaMemcpyHostToDevice));
    TEST_CUDA(cudaDeviceSynchronize());  // the op runs on a non-blocking stream
    return d;
}
static float *dev_upload(const float *h, size_t n) {
    return dev_upload_bytes(h, n * sizeof(float));
}
static int32_t *dev_upload_i32(const int32_t *h, size_t n) {
    return dev_upload_bytes(h, n * sizeof(int32_t));
}
/* Waits for everything queued (and surfaces kernel faults), then copies. */
static void dev_download(float *h, const float *d, size_t n) {
    TEST_CUDA(cudaDeviceSynchronize());
    if (n) TEST_CUDA(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost));
}
static float *dev_fetch(const float *d, size_t n) {
    float *h = host_alloc(n);
    dev_download(h, d, n);
    return h;
}
static void dev_free(void *d) { TEST_CUDA(cudaFree(d)); }

/* ---- comparisons ----------------------------------------------------------------- */

static void check_exact(const char *what, const float *got, const float *want, size_t n) {
    size_t n_bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(got + i, want + i, sizeof(float)) != 0 && n_bad++ == 0) first = i;
    CHECK(n_bad == 0, "%s: %zu of %zu elements differ, first [%zu]: got %.9g want %.9g", what,
          n_bad, n, first, n_bad ? (double)got[first] : 0.0, n_bad ? (double)want[first] : 0.0);
}

/* max |(got - start) - (want - start)| <= rtol * max |want - start|, start may
 * be NULL (zeros). The scale must show some signal. */
static void check_rel(const char *what, const float *got, const float *want, const float *start,
                      size_t n, double rtol) {
    double scale = 0.0, err = 0.0;
    size_t worst = 0;
    for (size_t i = 0; i < n; i++) {
        double s = start ? start[i] : 0.0;
        double dw = (double)want[i] - s, dg = (double)got[i] - s;
        if (fabs(dw) > scale) scale = fabs(dw);
        double e = fabs(dg - dw);
        if (!(e <= err)) {  // NaN counts as the worst
            err = isnan(e) ? INFINITY : e;
            worst = i;
        }
    }
    CHECK(scale >= MIN_SIGNAL, "%s: compared values are all below %g (max %g)", what,
          MIN_SIGNAL, scale);
    CHECK(err <= rtol * scale, "%s: max error %.3g > %.1g * %.3g at [%zu]: got %.9g want %.9g",
          what, err, rtol, scale, worst, (double)got[worst], (double)want[worst]);
}

/* Elements where mask[i] is set are exactly equal (none set passes). */
static void check_exact_where(const char *what, const float *got, const float *want,
                              const unsigned char *mask, size_t n) {
    size_t n_bad = 0, n_set = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        if (!mask[i]) continue;
        n_set++;
        if (memcmp(got + i, want + i, sizeof(float)) != 0 && n_bad++ == 0) first = i;
    }
    CHECK(n_bad == 0, "%s: %zu of %zu selected elements differ, first [%zu]: got %.9g want %.9g",
          what, n_bad, n_set, first, n_bad ? (double)got[first] : 0.0,
          n_bad ? (double)want[first] : 0.0);
}

/* ---- bad input (forked children, before CUDA is initialised here) --------------- */

typedef void (*BadCall)(void);

static void bad_bias_negative(void) { cuda_op_bias_add(NULL, NULL, -1, 3, 0); }
static void bad_zero_null(void) { cuda_op_zero(NULL, 10, 0); }
static void bad_dropout_p(void) { cuda_op_dropout_fwd(NULL, NULL, 4, 1.5f, 1, 2, 0); }
static void bad_adamw_step(void) { cuda_op_adamw(NULL, NULL, NULL, NULL, 0, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 0, 0); }
static void bad_positions_odd(void) { cuda_op_add_positions(NULL, 1, 1, 3, 0); }
static void bad_softmax_klen(void) {
    float dummy = 0.0f;
    cuda_op_softmax_fwd(&dummy, &dummy, NULL, 1, 1, 1, 1, 1.0f, false, 0);
}
static void bad_vp_valid(void) {
    float dummy = 0.0f;
    cuda_op_xent_vp_max(&dummy, &dummy, 1, 4, 5, 0);
}
static void bad_attention_dim(void) {
    cuda_op_attention_fwd(NULL, NULL, NULL, NULL, NULL, NULL, 1, 1, 1, 1, -2, false, 0);
}
/* The device-side target check: a target outside [0, V) dies after the sync. */
static void bad_xent_target(void) {
    const int N = 3, V = 5;
    float logits[15] = {0};
    int32_t targets[3] = {1, 7, 2};
    float *d_logits = dev_upload(logits, (size_t)N * V);
    int32_t *d_t = dev_upload_i32(targets, N);
    float *d_loss = dev_upload(logits, N), *d_lse = dev_upload(logits, N);
    cuda_op_xent_fwd(d_loss, d_lse, d_logits, d_t, N, V, 0.1f, -1, 0);
}
/* Control: zero sizes are legal no-ops even with NULL pointers. */
static void ok_zero_sizes(void) {
    cuda_op_bias_add(NULL, NULL, 0, 3, 0);
    cuda_op_zero(NULL, 0, 0);
    cuda_op_embedding_bwd(NULL, NULL, NULL, 1.0f, 0, 8, 0, 4, 0);
    cuda_op_layernorm_bwd(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, 8, 0);
}

/* Runs call in a child with stderr silenced; returns its exit status (or
 * 128 + signal). */
static int run_child(BadCall call) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        exit(1);
    }
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stderr)) _exit(99);
        call();
        exit(0);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0) {}
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

static void test_bad_input(void) {
    static const struct {
        const char *name;
        BadCall call;
    } bad[] = {
        {"bias_add N < 0", bad_bias_negative},     {"zero NULL", bad_zero_null},
        {"dropout p > 1", bad_dropout_p},          {"adamw t = 0", bad_adamw_step},
        {"positions odd C", bad_positions_odd},    {"softmax k_len NULL", bad_softmax_klen},
        {"vp_max V_valid > V_local", bad_vp_valid}, {"attention D < 0", bad_attention_dim},
        {"xent target >= V", bad_xent_target},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int status = run_child(bad[i].call);
        CHECK(status == 1, "bad input '%s': exit status %d, want 1 (a TP_CHECK message)",
              bad[i].name, status);
    }
    int status = run_child(ok_zero_sizes);
    CHECK(status == 0, "zero-size calls: exit status %d, want 0", status);
}

/* ---- memory ------------------------------------------------------------------------ */

static void test_memory(Rng *rng) {
    const size_t n = 1001, pad = 9;
    float *h = rand_floats(n + pad, rng, -1, 1);
    float *d = dev_upload(h, n + pad);

    // zero: the first n become 0, the rest stay
    float *want = host_copy(h, n + pad);
    cpu_zero(want, n);
    cuda_op_zero(d, n, g_stream);
    float *got = dev_fetch(d, n + pad);
    check_exact("zero", got, want, n + pad);
    free(got);

    // copy between disjoint buffers
    float *src = rand_floats(n, rng, -1, 1);
    float *d_src = dev_upload(src, n);
    cuda_op_copy(d, d_src, n, g_stream);
    memcpy(want, src, n * sizeof(float));
    got = dev_fetch(d, n + pad);
    check_exact("copy", got, want, n + pad);
    free(got);

    // overlapping copies, both directions: memmove semantics
    for (int dir = 0; dir < 2; dir++) {
        float *buf = rand_floats(n + pad, rng, -1, 1);
        float *d_buf = dev_upload(buf, n + pad);
        float *dst = dir ? buf : buf + pad, *s = dir ? buf + pad : buf;
        cpu_copy(dst, s, n);
        cuda_op_copy(dir ? d_buf : d_buf + pad, dir ? d_buf + pad : d_buf, n, g_stream);
        got = dev_fetch(d_buf, n + pad);
        check_exact(dir ? "copy overlapping backward" : "copy overlapping forward", got, buf,
                    n + pad);
        // dst == src is a no-op
        cuda_op_copy(d_buf, d_buf, n, g_stream);
        float *again = dev_fetch(d_buf, n + pad);
        check_exact("copy onto itself", again, buf, n + pad);
        free(again);
        free(got);
        free(buf);
        dev_free(d_buf);
    }
    free(h);
    free(want);
    free(src);
    dev_free(d);
    dev_free(d_src);
}

/* ---- element-wise -------------------------------------------------------------------- */

static void check_gelu(const char *what, const float *got, const float *want, size_t n) {
    size_t n_bad = 0, first = 0;
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]) / (1.0 + fabs((double)want[i]));
        if (!(e <= GELU_TOL) && n_bad++ == 0) first = i;
        if (e > worst) worst = e;
    }
    CHECK(n_bad == 0, "%s: %zu of %zu beyond %g (worst %.3g), first [%zu]: got %.9g want %.9g",
          what, n_bad, n, GELU_TOL, worst, first, n_bad ? (double)got[first] : 0.0,
          n_bad ? (double)want[first] : 0.0);
}

static void test_elementwise(Rng *rng) {
    const size_t n = 100003;
    float *x = rand_floats(n, rng, -6, 6);
    x[0] = 0.0f;
    x[1] = -0.0f;
    float *dy = rand_floats(n, rng, -1, 1);
    float *dx0 = rand_floats(n, rng, -1, 1);
    float *d_x = dev_upload(x, n), *d_dy = dev_upload(dy, n);

    for (int act = 0; act < 2; act++) {
        const char *name = act == ACT_RELU ? "relu" : "gelu";
        char what[64];
        float *y = host_alloc(n);
        cpu_act_fwd(y, x, n, (Activation)act);
        float *d_y = dev_upload(dx0, n);  // garbage: the forward overwrites
        cuda_op_act_fwd(d_y, d_x, n, (Activation)act, g_stream);
        float *got = dev_fetch(d_y, n);
        snprintf(what, sizeof what, "%s fwd", name);
        if (act == ACT_RELU)
            check_exact(what, got, y, n);
        else
            check_gelu(what, got, y, n);

        float *dx = host_copy(dx0, n);
        cpu_act_bwd(dx, dy, x, n, (Activation)act);
        float *d_dx = dev_upload(dx0, n);
        cuda_op_act_bwd(d_dx, d_dy, d_x, n, (Activation)act, g_stream);
        float *got_dx = dev_fetch(d_dx, n);
        snprintf(what, sizeof what, "%s bwd", name);
        if (act == ACT_RELU)
            check_exact(what, got_dx, dx, n);
        else
            check_gelu(what, got_dx, dx, n);
        // in place (y aliases x)
        float *d_xx = dev_upload(x, n);
        cuda_op_act_fwd(d_xx, d_xx, n, (Activation)act, g_stream);
        float *got_in = dev_fetch(d_xx, n);
        snprintf(what, sizeof what, "%s fwd in place", name);
        check_exact(what, got_in, got, n);
        free(y);
        free(got);
        free(dx);
        free(got_dx);
        free(got_in);
        dev_free(d_y);
        dev_free(d_dx);
        dev_free(d_xx);
    }

    // add, aliased add, accumulate, scale: single IEEE operations, exact
    float *a = rand_floats(n, rng, -2, 2), *b = rand_floats(n, rng, -2, 2);
    float *d_a = dev_upload(a, n), *d_b = dev_upload(b, n);
    float *want = host_alloc(n);
    cpu_add(want, a, b, n);
    float *d_out = dev_upload(dx0, n);
    cuda_op_add(d_out, d_a, d_b, n, g_stream);
    float *got = dev_fetch(d_out, n);
    check_exact("add", got, want, n);
    cuda_op_add(d_a, d_a, d_b, n, g_stream);  // out aliases a
    float *got_alias = dev_fetch(d_a, n);
    check_exact("add in place", got_alias, want, n);

    float *acc = host_copy(dx0, n);
    cpu_accumulate(acc, b, n);
    float *d_acc = dev_upload(dx0, n);
    cuda_op_accumulate(d_acc, d_b, n, g_stream);
    float *got_acc = dev_fetch(d_acc, n);
    check_exact("accumulate", got_acc, acc, n);

    cpu_scale(acc, -0.37f, n);
    cuda_op_scale(d_acc, -0.37f, n, g_stream);
    dev_download(got_acc, d_acc, n);
    check_exact("scale", got_acc, acc, n);

    // sumsq: double on both sides, deterministic on the GPU
    const size_t n_big = 1000003;
    float *big = rand_floats(n_big, rng, -1, 1);
    float *d_big = dev_upload(big, n_big);
    double want_ss = cpu_sumsq(big, n_big);
    double got_ss = cuda_op_sumsq(d_big, n_big, g_stream);
    double got_ss2 = cuda_op_sumsq(d_big, n_big, g_stream);
    CHECK(fabs(got_ss - want_ss) <= SUMSQ_RTOL * want_ss, "sumsq: got %.17g want %.17g", got_ss,
          want_ss);
    CHECK(memcmp(&got_ss, &got_ss2, sizeof got_ss) == 0, "sumsq not deterministic: %.17g %.17g",
          got_ss, got_ss2);
    double one = cuda_op_sumsq(d_big, 1, g_stream);
    CHECK(one == (double)big[0] * big[0], "sumsq of one element: %.17g", one);
    CHECK(cuda_op_sumsq(d_big, 0, g_stream) == 0.0, "sumsq of nothing must be 0");

    free(x);
    free(dy);
    free(dx0);
    free(a);
    free(b);
    free(want);
    free(got);
    free(got_alias);
    free(acc);
    free(got_acc);
    free(big);
    dev_free(d_x);
    dev_free(d_dy);
    dev_free(d_a);
    dev_free(d_b);
    dev_free(d_out);
    dev_free(d_acc);
    dev_free(d_big);
}

/* ---- bias ------------------------------------------------------------------------ */

static void test_bias(Rng *rng) {
    const int N = 700, C = 70;  // 700 rows: three row chunks, the last partial
    const size_t nc = (size_t)N * C;
    float *y = rand_floats(nc, rng, -1, 1), *b = rand_floats(C, rng, -1, 1);
    float *d_y = dev_upload(y, nc), *d_b = dev_upload(b, C);
    cpu_bias_add(y, b, N, C);
    cuda_op_bias_add(d_y, d_b, N, C, g_stream);
    float *got = dev_fetch(d_y, nc);
    check_exact("bias_add", got, y, nc);

    float *dy = rand_floats(nc, rng, -1, 1), *db0 = rand_floats(C, rng, -1, 1);
    float *db = host_copy(db0, C);
    cpu_bias_bwd(db, dy, N, C);
    float *d_dy = dev_upload(dy, nc), *d_db = dev_upload(db0, C), *d_db2 = dev_upload(db0, C);
    cuda_op_bias_bwd(d_db, d_dy, N, C, g_stream);
    cuda_op_bias_bwd(d_db2, d_dy, N, C, g_stream);
    float *got_db = dev_fetch(d_db, C), *got_db2 = dev_fetch(d_db2, C);
    check_rel("bias_bwd", got_db, db, db0, C, SUM_RTOL);
    check_exact("bias_bwd run to run", got_db2, got_db, C);

    free(y);
    free(b);
    free(got);
    free(dy);
    free(db0);
    free(db);
    free(got_db);
    free(got_db2);
    dev_free(d_y);
    dev_free(d_b);
    dev_free(d_dy);
    dev_free(d_db);
    dev_free(d_db2);
}

/* ---- embedding and positions -------------------------------------------------------- */

static void embedding_case(const char *name, int N, int C, int V, int vocab_start, int V_local,
                           Rng *rng) {
    char what[96];
    const size_t nc = (size_t)N * C, vc = (size_t)V_local * C;
    int32_t *ids = TP_MALLOC((size_t)N * sizeof(int32_t));
    for (int n = 0; n < N; n++) ids[n] = (int32_t)(rng_next(rng) % (uint64_t)V);
    ids[0] = vocab_start;                 // first row of the shard
    ids[N - 1] = vocab_start + V_local - 1;  // last row of the shard
    float *table = rand_floats(vc, rng, -1, 1);
    float scale = sqrtf((float)C);
    int32_t *d_ids = dev_upload_i32(ids, N);
    float *d_table = dev_upload(table, vc);

    float *out0 = rand_floats(nc, rng, -1, 1);  // garbage: the forward overwrites
    float *out = host_copy(out0, nc);
    cpu_embedding_fwd(out, ids, table, scale, N, C, vocab_start, V_local);
    float *d_out = dev_upload(out0, nc);
    cuda_op_embedding_fwd(d_out, d_ids, d_table, scale, N, C, vocab_start, V_local, g_stream);
    float *got = dev_fetch(d_out, nc);
    snprintf(what, sizeof what, "embedding fwd %s", name);
    check_exact(what, got, out, nc);

    float *dout = rand_floats(nc, rng, -1, 1);
    float *dtable0 = rand_floats(vc, rng, -1, 1);
    float *dtable = host_copy(dtable0, vc);
    cpu_embedding_bwd(dtable, dout, ids, scale, N, C, vocab_start, V_local);
    float *d_dout = dev_upload(dout, nc), *d_dtable = dev_upload(dtable0, vc);
    cuda_op_embedding_bwd(d_dtable, d_dout, d_ids, scale, N, C, vocab_start, V_local, g_stream);
    float *got_dt = dev_fetch(d_dtable, vc);
    snprintf(what, sizeof what, "embedding bwd %s", name);
    check_exact(what, got_dt, dtable, vc);
    check_rel(what, got_dt, dtable, dtable0, vc, SUM_RTOL);  // and it did add something

    free(ids);
    free(table);
    free(out0);
    free(out);
    free(got);
    free(dout);
    free(dtable0);
    free(dtable);
    free(got_dt);
    dev_free(d_ids);
    dev_free(d_table);
    dev_free(d_out);
    dev_free(d_dout);
    dev_free(d_dtable);
}

static void test_embedding(Rng *rng) {
    embedding_case("one shard", 300, 96, 40, 0, 40, rng);
    embedding_case("shard 10..23 of 40", 300, 96, 40, 10, 13, rng);
    embedding_case("wide rows, many repeats", 1000, 300, 7, 2, 4, rng);
    embedding_case("one row", 1, 33, 5, 0, 5, rng);
}

static void test_positions(Rng *rng) {
    const int shapes[2][3] = {{3, 67, 64}, {2, 513, 128}};
    for (int s = 0; s < 2; s++) {
        int B = shapes[s][0], T = shapes[s][1], C = shapes[s][2];
        size_t n = (size_t)B * T * C;
        float *x = rand_floats(n, rng, -1, 1);
        float *d_x = dev_upload(x, n);
        cpu_add_positions(x, B, T, C);
        cuda_op_add_positions(d_x, B, T, C, g_stream);
        float *got = dev_fetch(d_x, n);
        double worst = 0.0;
        for (size_t i = 0; i < n; i++) {
            double e = fabs((double)got[i] - x[i]);
            if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
        }
        CHECK(worst <= POS_ATOL, "positions (%d, %d, %d): max error %.3g", B, T, C, worst);
        free(x);
        free(got);
        dev_free(d_x);
    }
}

/* ---- layernorm ---------------------------------------------------------------------- */

static void layernorm_case(int N, int C, Rng *rng) {
    char what[96];
    const size_t nc = (size_t)N * C;
    const float eps = 1e-5f;
    float *x = rand_floats(nc, rng, -1, 1);
    for (size_t i = 0; i < nc; i++) x[i] += 3.0f;  // an offset the two-pass mean must remove
    float *gamma = rand_floats(C, rng, 0.5f, 1.5f), *beta = rand_floats(C, rng, -0.5f, 0.5f);
    float *y = host_alloc(nc), *mean = host_alloc(N), *rstd = host_alloc(N);
    cpu_layernorm_fwd(y, mean, rstd, x, gamma, beta, N, C, eps);
    float *d_x = dev_upload(x, nc), *d_gamma = dev_upload(gamma, C), *d_beta = dev_upload(beta, C);
    float *d_y = dev_upload(x, nc), *d_mean = dev_upload(x, N), *d_rstd = dev_upload(x, N);
    cuda_op_layernorm_fwd(d_y, d_mean, d_rstd, d_x, d_gamma, d_beta, N, C, eps, g_stream);
    float *got_y = dev_fetch(d_y, nc), *got_mean = dev_fetch(d_mean, N),
          *got_rstd = dev_fetch(d_rstd, N);
    snprintf(what, sizeof what, "layernorm fwd y (%d, %d)", N, C);
    check_rel(what, got_y, y, NULL, nc, SUM_RTOL);
    snprintf(what, sizeof what, "layernorm fwd mean (%d, %d)", N, C);
    check_rel(what, got_mean, mean, NULL, N, SUM_RTOL);
    snprintf(what, sizeof what, "layernorm fwd rstd (%d, %d)", N, C);
    check_rel(what, got_rstd, rstd, NULL, N, SUM_RTOL);

    // backward from the CPU's saved statistics
    float *dy = rand_floats(nc, rng, -1, 1);
    float *dx0 = rand_floats(nc, rng, -1, 1), *dg0 = rand_floats(C, rng, -1, 1),
          *db0 = rand_floats(C, rng, -1, 1);
    float *dx = host_copy(dx0, nc), *dg = host_copy(dg0, C), *db = host_copy(db0, C);
    cpu_layernorm_bwd(dx, dg, db, dy, x, mean, rstd, gamma, N, C);
    float *d_dy = dev_upload(dy, nc);
    dev_free(d_mean);
    dev_free(d_rstd);
    d_mean = dev_upload(mean, N);
    d_rstd = dev_upload(rstd, N);
    float *got_dx[2], *got_dg[2], *got_db[2];
    for (int run = 0; run < 2; run++) {
        float *d_dx = dev_upload(dx0, nc), *d_dg = dev_upload(dg0, C), *d_db = dev_upload(db0, C);
        cuda_op_layernorm_bwd(d_dx, d_dg, d_db, d_dy, d_x, d_mean, d_rstd, d_gamma, N, C,
                              g_stream);
        got_dx[run] = dev_fetch(d_dx, nc);
        got_dg[run] = dev_fetch(d_dg, C);
        got_db[run] = dev_fetch(d_db, C);
        dev_free(d_dx);
        dev_free(d_dg);
        dev_free(d_db);
    }
    snprintf(what, sizeof what, "layernorm bwd dx (%d, %d)", N, C);
    check_rel(what, got_dx[0], dx, dx0, nc, SUM_RTOL);
    snprintf(what, sizeof what, "layernorm bwd dgamma (%d, %d)", N, C);
    check_rel(what, got_dg[0], dg, dg0, C, SUM_RTOL);
    snprintf(what, sizeof what, "layernorm bwd dbeta (%d, %d)", N, C);
    check_rel(what, got_db[0], db, db0, C, SUM_RTOL);
    snprintf(what, sizeof what, "layernorm bwd run to run (%d, %d)", N, C);
    check_exact(what, got_dx[1], got_dx[0], nc);
    check_exact(what, got_dg[1], got_dg[0], C);
    check_exact(what, got_db[1], got_db[0], C);

    float *host_bufs[] = {x, gamma, beta, y, mean, rstd, got_y, got_mean, got_rstd, dy, dx0,
                          dg0, db0, dx, dg, db, got_dx[0], got_dx[1], got_dg[0], got_dg[1],
                          got_db[0], got_db[1]};
    for (size_t i = 0; i < sizeof host_bufs / sizeof host_bufs[0]; i++) free(host_bufs[i]);
    float *dev_bufs[] = {d_x, d_gamma, d_beta, d_y, d_mean, d_rstd, d_dy};
    for (size_t i = 0; i < sizeof dev_bufs / sizeof dev_bufs[0]; i++) dev_free(dev_bufs[i]);
}

static void test_layernorm(Rng *rng) {
    layernorm_case(37, 300, rng);   // C not a multiple of 32
    layernorm_case(700, 64, rng);   // three row chunks for dgamma / dbeta
    layernorm_case(5, 1024, rng);
}

/* ---- softmax and attention -------------------------------------------------------------- */

/* The CPU's mask rule, written out again: keys [0, n) of row i are valid. */
static int ref_valid_keys(int k_len, int i, int Tk, bool causal) {
    int n = k_len < Tk ? k_len : Tk;
    if (causal && n > i + 1) n = i + 1;
    return n < 0 ? 0 : n;
}

/* mask[(b, h, i, j)] = 1 where key j of row i is masked. */
static unsigned char *masked_entries(const int32_t *k_len, int B, int H, int Tq, int Tk,
                                     bool causal) {
    unsigned char *m = TP_CALLOC((size_t)B * H * Tq * Tk + 1, 1);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < Tq; i++) {
                int nv = ref_valid_keys(k_len[b], i, Tk, causal);
                for (int j = nv; j < Tk; j++) m[(((size_t)b * H + h) * Tq + i) * Tk + j] = 1;
            }
    return m;
}

static void softmax_case(const int32_t *k_len, int B, int H, int Tq, int Tk, bool causal,
                         Rng *rng) {
    char what[128];
    const size_t n = (size_t)B * H * Tq * Tk;
    const float scale = 0.7f;
    unsigned char *masked = masked_entries(k_len, B, H, Tq, Tk, causal);
    float *S = rand_floats(n, rng, -3, 3);
    for (size_t i = 0; i < n; i++)
        if (masked[i]) S[i] = NAN;  // masked scores must never be read
    float *P = host_alloc(n);
    cpu_softmax_fwd(P, S, k_len, B, H, Tq, Tk, scale, causal);
    float *d_S = dev_upload(S, n), *d_P = dev_upload(S, n);
    int32_t *d_klen = dev_upload_i32(k_len, B);
    cuda_op_softmax_fwd(d_P, d_S, d_klen, B, H, Tq, Tk, scale, causal, g_stream);
    float *got = dev_fetch(d_P, n);
    snprintf(what, sizeof what, "softmax fwd B%d H%d Tq%d Tk%d%s", B, H, Tq, Tk,
             causal ? " causal" : "");
    check_rel(what, got, P, NULL, n, SUM_RTOL);
    check_exact_where(what, got, P, masked, n);  // exact zeros

    // in place, as attention uses it
    cuda_op_softmax_fwd(d_S, d_S, d_klen, B, H, Tq, Tk, scale, causal, g_stream);
    float *got_in = dev_fetch(d_S, n);
    snprintf(what, sizeof what, "softmax fwd in place B%d Tk%d", B, Tk);
    check_exact(what, got_in, got, n);

    // backward: dS += scale * P * (dP - sum(dP * P)), also with dS == dP
    float *dP = rand_floats(n, rng, -1, 1), *dS0 = rand_floats(n, rng, -1, 1);
    float *dS = host_copy(dS0, n);
    cpu_softmax_bwd(dS, dP, P, B, H, Tq, Tk, scale);
    float *d_dP = dev_upload(dP, n), *d_dS = dev_upload(dS0, n);
    dev_free(d_P);
    d_P = dev_upload(P, n);
    cuda_op_softmax_bwd(d_dS, d_dP, d_P, B, H, Tq, Tk, scale, g_stream);
    float *got_dS = dev_fetch(d_dS, n);
    snprintf(what, sizeof what, "softmax bwd B%d Tk%d", B, Tk);
    check_rel(what, got_dS, dS, dS0, n, SUM_RTOL);

    float *alias = host_copy(dP, n);
    cpu_softmax_bwd(alias, alias, P, B, H, Tq, Tk, scale);
    cuda_op_softmax_bwd(d_dP, d_dP, d_P, B, H, Tq, Tk, scale, g_stream);
    float *got_alias = dev_fetch(d_dP, n);
    snprintf(what, sizeof what, "softmax bwd dS == dP B%d Tk%d", B, Tk);
    check_rel(what, got_alias, alias, dP, n, SUM_RTOL);

    float *host_bufs[] = {S, P, got, got_in, dP, dS0, dS, got_dS, alias, got_alias};
    for (size_t i = 0; i < sizeof host_bufs / sizeof host_bufs[0]; i++) free(host_bufs[i]);
    free(masked);
    dev_free(d_S);
    dev_free(d_P);
    dev_free(d_klen);
    dev_free(d_dP);
    dev_free(d_dS);
}

static void test_softmax(Rng *rng) {
    const int32_t k_len3[3] = {20, 0, 50};  // k_len < Tk, an empty row, k_len > Tk
    softmax_case(k_len3, 3, 2, 5, 37, false, rng);
    softmax_case(k_len3, 3, 2, 5, 37, true, rng);
    const int32_t k_len2[2] = {40, 33};
    softmax_case(k_len2, 2, 3, 40, 40, true, rng);
    const int32_t k_len1[1] = {300};
    softmax_case(k_len1, 1, 1, 3, 300, false, rng);  // rows much longer than a warp
}

static void attention_case(const char *name, const int32_t *k_len, int B, int H, int Tq, int Tk,
                           int D, bool causal, Rng *rng) {
    char what[160];
    const int HD = H * D;
    const size_t nq = (size_t)B * Tq * HD, nk = (size_t)B * Tk * HD;
    const size_t np = (size_t)B * H * Tq * Tk;
    unsigned char *masked = masked_entries(k_len, B, H, Tq, Tk, causal);
    float *q = rand_floats(nq, rng, -1, 1), *k = rand_floats(nk, rng, -1, 1),
          *v = rand_floats(nk, rng, -1, 1);
    float *out0 = rand_floats(nq, rng, -1, 1);  // garbage: the forward overwrites
    float *out = host_copy(out0, nq), *P = host_alloc(np);
    cpu_attention_fwd(out, P, q, k, v, k_len, B, H, Tq, Tk, D, causal);

    float *d_q = dev_upload(q, nq), *d_k = dev_upload(k, nk), *d_v = dev_upload(v, nk);
    int32_t *d_klen = dev_upload_i32(k_len, B);
    float *d_out = dev_upload(out0, nq), *d_P = dev_upload(P, np);
    TEST_CUDA(cudaMemset(d_P, 0xff, np * sizeof(float)));  // NaN garbage
    cuda_op_attention_fwd(d_out, d_P, d_q, d_k, d_v, d_klen, B, H, Tq, Tk, D, causal, g_stream);
    float *got_out = dev_fetch(d_out, nq), *got_P = dev_fetch(d_P, np);
    snprintf(what, sizeof what, "attention fwd out %s", name);
    check_rel(what, got_out, out, NULL, nq, SUM_RTOL);
    snprintf(what, sizeof what, "attention fwd P %s", name);
    check_rel(what, got_P, P, NULL, np, SUM_RTOL);
    check_exact_where(what, got_P, P, masked, np);
    // rows of a batch without keys are zeros (by value: the sign of a sum
    // of zero products depends on the summation)
    for (int b = 0; b < B; b++) {
        if (k_len[b] > 0) continue;
        size_t n_nonzero = 0;
        for (size_t i = 0; i < (size_t)Tq * HD; i++)
            n_nonzero += got_out[(size_t)b * Tq * HD + i] != 0.0f;
        CHECK(n_nonzero == 0, "attention fwd out %s: batch %d has no keys but %zu nonzero outputs",
              name, b, n_nonzero);
    }

    // backward from the CPU's P, into random starting gradients
    float *dout = rand_floats(nq, rng, -1, 1);
    float *dq0 = rand_floats(nq, rng, -1, 1), *dk0 = rand_floats(nk, rng, -1, 1),
          *dv0 = rand_floats(nk, rng, -1, 1);
    float *dq = host_copy(dq0, nq), *dk = host_copy(dk0, nk), *dv = host_copy(dv0, nk);
    float *scratch = host_alloc(np);
    cpu_attention_bwd(dq, dk, dv, dout, P, q, k, v, scratch, B, H, Tq, Tk, D);
    float *d_dout = dev_upload(dout, nq), *d_dq = dev_upload(dq0, nq), *d_dk = dev_upload(dk0, nk),
          *d_dv = dev_upload(dv0, nk), *d_scratch = dev_upload(P, np);
    TEST_CUDA(cudaMemset(d_scratch, 0xff, np * sizeof(float)));
    dev_free(d_P);
    d_P = dev_upload(P, np);
    cuda_op_attention_bwd(d_dq, d_dk, d_dv, d_dout, d_P, d_q, d_k, d_v, d_scratch, B, H, Tq, Tk,
                          D, g_stream);
    float *got_dq = dev_fetch(d_dq, nq), *got_dk = dev_fetch(d_dk, nk),
          *got_dv = dev_fetch(d_dv, nk);
    snprintf(what, sizeof what, "attention bwd dq %s", name);
    check_rel(what, got_dq, dq, dq0, nq, ATTN_BWD_RTOL);
    snprintf(what, sizeof what, "attention bwd dk %s", name);
    check_rel(what, got_dk, dk, dk0, nk, ATTN_BWD_RTOL);
    snprintf(what, sizeof what, "attention bwd dv %s", name);
    check_rel(what, got_dv, dv, dv0, nk, ATTN_BWD_RTOL);

    float *host_bufs[] = {q, k, v, out0, out, P, got_out, got_P, dout, dq0, dk0, dv0,
                          dq, dk, dv, scratch, got_dq, got_dk, got_dv};
    for (size_t i = 0; i < sizeof host_bufs / sizeof host_bufs[0]; i++) free(host_bufs[i]);
    free(masked);
    float *dev_bufs[] = {d_q, d_k, d_v, d_out, d_P, d_dout, d_dq, d_dk, d_dv, d_scratch};
    for (size_t i = 0; i < sizeof dev_bufs / sizeof dev_bufs[0]; i++) dev_free(dev_bufs[i]);
    dev_free(d_klen);
}

static void test_attention(Rng *rng) {
    const int32_t cross_len[2] = {4, 0};  // padding and a batch with no keys
    attention_case("cross Tq5 Tk7 D16", cross_len, 2, 3, 5, 7, 16, false, rng);
    const int32_t self_len[2] = {40, 33};
    attention_case("causal Tq=Tk=40 D64", self_len, 2, 2, 40, 40, 64, true, rng);
    const int32_t long_len[1] = {100};  // k_len > Tk
    attention_case("Tq33 Tk70 D24", long_len, 1, 4, 33, 70, 24, false, rng);
    const int32_t rect_len[2] = {9, 3};
    attention_case("causal Tq6 Tk9 D8", rect_len, 2, 1, 6, 9, 8, true, rng);

    // Tk == 0: every output row is zero
    const int B = 2, H = 2, Tq = 3, D = 4;
    const size_t nq = (size_t)B * Tq * H * D;
    float *garbage = rand_floats(nq, rng, -1, 1), *zeros = host_alloc(nq);
    float *d_out = dev_upload(garbage, nq);
    const int32_t no_keys[2] = {0, 0};
    int32_t *d_klen = dev_upload_i32(no_keys, B);
    cuda_op_attention_fwd(d_out, NULL, d_out, d_out, d_out, d_klen, B, H, Tq, 0, D, false,
                          g_stream);
    float *got = dev_fetch(d_out, nq);
    check_exact("attention fwd Tk = 0", got, zeros, nq);
    free(garbage);
    free(zeros);
    free(got);
    dev_free(d_out);
    dev_free(d_klen);
}

/* ---- dropout ------------------------------------------------------------------------ */

static void dropout_case(size_t n, float p, uint64_t seed, uint64_t stream, Rng *rng) {
    char what[128];
    float *x = rand_floats(n, rng, 0.5f, 1.5f);  // nonzero, so a zero output means dropped
    float *garbage = rand_floats(n, rng, -1, 1);
    float *y = host_alloc(n);
    cpu_dropout_fwd(y, x, n, p, seed, stream);
    float *d_x = dev_upload(x, n), *d_y = dev_upload(garbage, n);
    cuda_op_dropout_fwd(d_y, d_x, n, p, seed, stream, g_stream);
    float *got = dev_fetch(d_y, n);
    snprintf(what, sizeof what, "dropout fwd n=%zu p=%g", n, (double)p);
    check_exact(what, got, y, n);

    float *d_in = dev_upload(x, n);  // in place
    cuda_op_dropout_fwd(d_in, d_in, n, p, seed, stream, g_stream);
    float *got_in = dev_fetch(d_in, n);
    snprintf(what, sizeof what, "dropout fwd in place n=%zu p=%g", n, (double)p);
    check_exact(what, got_in, y, n);

    float *dy = rand_floats(n, rng, -1, 1), *dx0 = rand_floats(n, rng, -1, 1);
    float *dx = host_copy(dx0, n);
    cpu_dropout_bwd(dx, dy, n, p, seed, stream);
    float *d_dy = dev_upload(dy, n), *d_dx = dev_upload(dx0, n);
    cuda_op_dropout_bwd(d_dx, d_dy, n, p, seed, stream, g_stream);
    float *got_dx = dev_fetch(d_dx, n);
    snprintf(what, sizeof what, "dropout bwd n=%zu p=%g", n, (double)p);
    check_exact(what, got_dx, dx, n);

    float *host_bufs[] = {x, garbage, y, got, got_in, dy, dx0, dx, got_dx};
    for (size_t i = 0; i < sizeof host_bufs / sizeof host_bufs[0]; i++) free(host_bufs[i]);
    float *dev_bufs[] = {d_x, d_y, d_in, d_dy, d_dx};
    for (size_t i = 0; i < sizeof dev_bufs / sizeof dev_bufs[0]; i++) dev_free(dev_bufs[i]);
}

static void test_dropout(Rng *rng) {
    uint64_t stream = dropout_stream(5, 3, 2, 1, 7);  // both 32-bit halves non-zero
    uint64_t seed = 0x9234567890abcdefull;            // both halves, top bit set
    dropout_case((1u << 17) + 3, 0.1f, seed, stream, rng);  // a partial last group
    dropout_case(1001, 0.5f, seed + 1, stream + 1, rng);
    dropout_case(4, 0.3f, seed, dropout_stream(0xffffffffu, 255, 255, 63, 1023), rng);
    dropout_case(999, 0.0f, seed, stream, rng);  // copies / accumulates
    dropout_case(999, 1.0f, seed, stream, rng);  // drops everything

    // the mask is not trivial: about p of the elements are dropped
    const size_t n = 1u << 16;
    float *ones = host_alloc(n);
    for (size_t i = 0; i < n; i++) ones[i] = 1.0f;
    float *d = dev_upload(ones, n);
    cuda_op_dropout_fwd(d, d, n, 0.25f, seed, stream, g_stream);
    float *got = dev_fetch(d, n);
    size_t dropped = 0;
    for (size_t i = 0; i < n; i++) dropped += got[i] == 0.0f;
    double frac = (double)dropped / n, sd = sqrt(0.25 * 0.75 / n);
    CHECK(fabs(frac - 0.25) < 6 * sd, "dropout dropped fraction %.4f, want 0.25", frac);
    free(ones);
    free(got);
    dev_free(d);
}

/* ---- cross-entropy ---------------------------------------------------------------------- */

static void xent_case(int N, int V, Rng *rng) {
    char what[96];
    const float eps = 0.1f, dloss = 1.0f / 7.0f;
    const int32_t ignore_id = 3;  // a real vocabulary id, as a pad id is
    const size_t nv = (size_t)N * V;
    float *logits = rand_floats(nv, rng, -4, 4);
    int32_t *targets = TP_MALLOC((size_t)N * sizeof(int32_t));
    for (int n = 0; n < N; n++) targets[n] = (int32_t)(rng_next(rng) % (uint64_t)V);
    targets[0] = 0;
    targets[1] = ignore_id;
    targets[2] = V - 1;
    targets[N - 1] = ignore_id;
    float *losses = host_alloc(N), *lse = host_alloc(N);
    int n_valid = cpu_xent_fwd(losses, lse, logits, targets, N, V, eps, ignore_id);

    float *d_logits = dev_upload(logits, nv);
    int32_t *d_t = dev_upload_i32(targets, N);
    float *garbage = rand_floats(N, rng, 1, 2);
    float *d_losses = dev_upload(garbage, N), *d_lse = dev_upload(garbage, N);
    int got_valid =
        cuda_op_xent_fwd(d_losses, d_lse, d_logits, d_t, N, V, eps, ignore_id, g_stream);
    float *got_losses = dev_fetch(d_losses, N), *got_lse = dev_fetch(d_lse, N);
    snprintf(what, sizeof what, "xent fwd N%d V%d", N, V);
    CHECK(got_valid == n_valid, "%s: %d valid rows, want %d", what, got_valid, n_valid);
    check_rel(what, got_losses, losses, NULL, N, SUM_RTOL);
    check_rel(what, got_lse, lse, NULL, N, SUM_RTOL);

    float *dl0 = rand_floats(nv, rng, -1, 1);
    float *dl = host_copy(dl0, nv);
    cpu_xent_bwd(dl, logits, lse, targets, dloss, N, V, eps, ignore_id);
    float *d_dl = dev_upload(dl0, nv);
    dev_free(d_lse);
    d_lse = dev_upload(lse, N);
    cuda_op_xent_bwd(d_dl, d_logits, d_lse, d_t, dloss, N, V, eps, ignore_id, g_stream);
    float *got_dl = dev_fetch(d_dl, nv);
    snprintf(what, sizeof what, "xent bwd N%d V%d", N, V);
    check_rel(what, got_dl, dl, dl0, nv, SUM_RTOL);
    snprintf(what, sizeof what, "xent bwd ignored rows N%d V%d", N, V);
    check_exact(what, got_dl + V, dl0 + V, (size_t)V);

    float *host_bufs[] = {logits, losses, lse, garbage, got_losses, got_lse, dl0, dl, got_dl};
    for (size_t i = 0; i < sizeof host_bufs / sizeof host_bufs[0]; i++) free(host_bufs[i]);
    free(targets);
    float *dev_bufs[] = {d_logits, d_losses, d_lse, d_dl};
    for (size_t i = 0; i < sizeof dev_bufs / sizeof dev_bufs[0]; i++) dev_free(dev_bufs[i]);
    dev_free(d_t);
}

/* Vocab-parallel pieces on a 2-way split of V = 50 real columns padded to
 * 52: shard s holds columns [26 s, 26 s + 26), shard 1 has 24 real ones and
 * two NaN padding columns. Every piece is compared with the CPU on both
 * shards; then the GPU pieces, reduced on the host, must give the full-row
 * loss of op_xent_fwd. */
static void test_xent_vp(Rng *rng) {
    enum { N = 11, V = 50, TP = 2, V_LOCAL = 26 };
    const float eps = 0.1f, dloss = 0.25f;
    const int32_t ignore_id = 0;
    float *full = rand_floats((size_t)N * V, rng, -4, 4);  // (N, V)
    int32_t targets[N];
    for (int n = 0; n < N; n++) targets[n] = (int32_t)(rng_next(rng) % V);
    targets[0] = ignore_id;
    targets[1] = 25;  // last of shard 0
    targets[2] = 26;  // first of shard 1
    targets[3] = V - 1;
    targets[4] = ignore_id;
    int32_t *d_t = dev_upload_i32(targets, N);
    char what[96];

    float *shard[TP], *d_shard[TP];
    int v_valid[TP];
    float max_cpu[TP][N], max_gpu[TP][N];
    for (int s = 0; s < TP; s++) {
        v_valid[s] = V - s * V_LOCAL < V_LOCAL ? V - s * V_LOCAL : V_LOCAL;
        shard[s] = host_alloc((size_t)N * V_LOCAL);
        for (int n = 0; n < N; n++)
            for (int j = 0; j < V_LOCAL; j++)
                shard[s][(size_t)n * V_LOCAL + j] =
                    j < v_valid[s] ? full[(size_t)n * V + s * V_LOCAL + j] : NAN;
        d_shard[s] = dev_upload(shard[s], (size_t)N * V_LOCAL);
        cpu_xent_vp_max(max_cpu[s], shard[s], N, V_LOCAL, v_valid[s]);
        float *d_max = dev_upload(shard[s], N);
        cuda_op_xent_vp_max(d_max, d_shard[s], N, V_LOCAL, v_valid[s], g_stream);
        dev_download(max_gpu[s], d_max, N);
        snprintf(what, sizeof what, "xent_vp_max shard %d", s);
        check_exact(what, max_gpu[s], max_cpu[s], N);
        dev_free(d_max);
    }
    float row_max[N];  // the MAX reduction
    for (int n = 0; n < N; n++)
        row_max[n] = max_gpu[0][n] > max_gpu[1][n] ? max_gpu[0][n] : max_gpu[1][n];
    float *d_row_max = dev_upload(row_max, N);

    float stats_gpu[N * 3] = {0}, stats_cpu[N * 3];
    for (int s = 0; s < TP; s++) {
        float st_cpu[N * 3], st_gpu[N * 3];
        cpu_xent_vp_sums(st_cpu, shard[s], row_max, targets, N, V_LOCAL, v_valid[s], s * V_LOCAL,
                        ignore_id);
        float *d_st = dev_upload(full, N * 3);  // garbage
        cuda_op_xent_vp_sums(d_st, d_shard[s], d_row_max, d_t, N, V_LOCAL, v_valid[s],
                             s * V_LOCAL, ignore_id, g_stream);
        dev_download(st_gpu, d_st, N * 3);
        for (int c = 0; c < 3; c++) {  // sum exp, sum x, target logit: apart
            float a[N], b[N];
            for (int n = 0; n < N; n++) {
                a[n] = st_gpu[n * 3 + c];
                b[n] = st_cpu[n * 3 + c];
            }
            snprintf(what, sizeof what, "xent_vp_sums shard %d stat %d", s, c);
            if (c == 2)
                check_exact(what, a, b, N);
            else
                check_rel(what, a, b, NULL, N, SUM_RTOL);
        }
        for (int i = 0; i < N * 3; i++) stats_gpu[i] += st_gpu[i];  // the SUM reduction
        dev_free(d_st);
    }
    memcpy(stats_cpu, stats_gpu, sizeof stats_cpu);
    float *d_stats = dev_upload(stats_gpu, N * 3);

    float losses[N], lse[N], got_losses[N], got_lse[N];
    int n_valid = cpu_xent_vp_loss(losses, lse, row_max, stats_cpu, targets, N, V, eps, ignore_id);
    float *d_losses = dev_upload(full, N), *d_lse = dev_upload(full, N);
    int got_valid = cuda_op_xent_vp_loss(d_losses, d_lse, d_row_max, d_stats, d_t, N, V, eps,
                                         ignore_id, g_stream);
    dev_download(got_losses, d_losses, N);
    dev_download(got_lse, d_lse, N);
    CHECK(got_valid == n_valid, "xent_vp_loss: %d valid rows, want %d", got_valid, n_valid);
    check_rel("xent_vp_loss losses", got_losses, losses, NULL, N, SUM_RTOL);
    check_rel("xent_vp_loss lse", got_lse, lse, NULL, N, SUM_RTOL);

    // the whole protocol equals the full-row loss
    float full_losses[N], full_lse[N];
    int full_valid = cpu_xent_fwd(full_losses, full_lse, full, targets, N, V, eps, ignore_id);
    CHECK(full_valid == got_valid, "xent_vp: %d valid rows, full rows %d", got_valid, full_valid);
    check_rel("xent_vp protocol vs full-row loss", got_losses, full_losses, NULL, N, SUM_RTOL);

    for (int s = 0; s < TP; s++) {
        const size_t nl = (size_t)N * V_LOCAL;
        float *dl0 = rand_floats(nl, rng, -1, 1);
        float *dl = host_copy(dl0, nl);
        cpu_xent_vp_bwd(dl, shard[s], lse, targets, dloss, N, V_LOCAL, v_valid[s], s * V_LOCAL, V,
                       eps, ignore_id);
        float *d_dl = dev_upload(dl0, nl);
        float *d_lse_cpu = dev_upload(lse, N);
        cuda_op_xent_vp_bwd(d_dl, d_shard[s], d_lse_cpu, d_t, dloss, N, V_LOCAL, v_valid[s],
                            s * V_LOCAL, V, eps, ignore_id, g_stream);
        float *got = dev_fetch(d_dl, nl);
        snprintf(what, sizeof what, "xent_vp_bwd shard %d", s);
        check_rel(what, got, dl, dl0, nl, SUM_RTOL);
        // padding columns and ignored rows are untouched
        unsigned char keep[N * V_LOCAL];
        for (int n = 0; n < N; n++)
            for (int j = 0; j < V_LOCAL; j++)
                keep[n * V_LOCAL + j] = j >= v_valid[s] || targets[n] == ignore_id;
        snprintf(what, sizeof what, "xent_vp_bwd shard %d untouched", s);
        check_exact_where(what, got, dl0, keep, nl);
        free(dl0);
        free(dl);
        free(got);
        dev_free(d_dl);
        dev_free(d_lse_cpu);
    }

    for (int s = 0; s < TP; s++) {
        free(shard[s]);
        dev_free(d_shard[s]);
    }
    free(full);
    dev_free(d_t);
    dev_free(d_row_max);
    dev_free(d_stats);
    dev_free(d_losses);
    dev_free(d_lse);
}

static void test_xent(Rng *rng) {
    xent_case(9, 1000, rng);  // rows wider than a block
    xent_case(6, 37, rng);    // rows narrower than a block
    test_xent_vp(rng);
}

/* ---- adamw ------------------------------------------------------------------------ */

static void test_adamw(Rng *rng) {
    const size_t n = 10007;
    const float lr = 1e-2f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, wd = 0.1f;
    float *p = rand_floats(n, rng, -1, 1), *m = rand_floats(n, rng, -0.1f, 0.1f),
          *v = rand_floats(n, rng, 0.0f, 0.01f);
    float *d_p = dev_upload(p, n), *d_m = dev_upload(m, n), *d_v = dev_upload(v, n);
    float *p0 = host_copy(p, n);
    for (int t = 1; t <= 3; t++) {  // three steps, new gradients each
        float *g = rand_floats(n, rng, -0.1f, 0.1f);
        float *d_g = dev_upload(g, n);
        cpu_adamw(p, g, m, v, n, lr, beta1, beta2, eps, wd, t);
        cuda_op_adamw(d_p, d_g, d_m, d_v, n, lr, beta1, beta2, eps, wd, t, g_stream);
        free(g);
        dev_free(d_g);
    }
    float *got_p = dev_fetch(d_p, n), *got_m = dev_fetch(d_m, n), *got_v = dev_fetch(d_v, n);
    // p is compared against its own scale (~1): a few ulp; the update itself
    // (steps of up to ~1e-2) must be there
    check_rel("adamw p", got_p, p, NULL, n, ADAM_RTOL);
    double moved = 0.0;
    for (size_t i = 0; i < n; i++) moved = fmax(moved, fabs((double)p[i] - p0[i]));
    CHECK(moved > 1e-3, "adamw: the CPU update moved p by at most %g", moved);
    check_rel("adamw m", got_m, m, NULL, n, ADAM_RTOL);
    check_rel("adamw v", got_v, v, NULL, n, ADAM_RTOL);
    size_t n_same = 0;
    for (size_t i = 0; i < n; i++) n_same += memcmp(got_p + i, p + i, sizeof(float)) == 0;
    printf("test_cuda_ops: adamw bit-identical to the CPU on %zu of %zu parameters\n", n_same, n);

    float *host_bufs[] = {p, m, v, p0, got_p, got_m, got_v};
    for (size_t i = 0; i < sizeof host_bufs / sizeof host_bufs[0]; i++) free(host_bufs[i]);
    dev_free(d_p);
    dev_free(d_m);
    dev_free(d_v);
}

/* ---- main ---------------------------------------------------------------------------- */

int main(void) {
    test_bad_input();  // before this process initialises CUDA (the children fork)

    CudaDeviceInfo info;
    char err[256];
    if (cuda_device_init(0, &info, err, sizeof err) != 0) {
        fprintf(stderr, "test_cuda_ops: FAIL: %s; this test needs a GPU (ctest label gpu)\n",
                err);
        return 1;
    }
    printf("test_cuda_ops: %s (sm_%d%d)\n", info.name, info.sm_major, info.sm_minor);
    TEST_CUDA(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));

    Rng rng = {20240611u};
    test_memory(&rng);
    test_elementwise(&rng);
    test_bias(&rng);
    test_embedding(&rng);
    test_positions(&rng);
    test_layernorm(&rng);
    test_softmax(&rng);
    test_attention(&rng);
    test_dropout(&rng);
    test_xent(&rng);
    test_adamw(&rng);

    TEST_CUDA(cudaStreamDestroy(g_stream));
    return check_report("test_cuda_ops");
}
