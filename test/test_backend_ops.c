/* test_backend_ops.c: every op of kernels/backend.h through every backend
 * present, against the fp32 CPU reference (kernels/cpu), in the manner of
 * ggml's test-backend-ops.
 *
 *   test_backend_ops cpu   the CPU backend in fp32 and in bf16 (its GEMM
 *                          operand rounding checked against an independent
 *                          one); ctest label cpu
 *   test_backend_ops gpu   the CUDA backend in fp32 and in bf16; ctest label
 *                          gpu (fails with one line where no GPU is visible)
 *
 * Each target runs the same cases (the files in backend_ops/): memory and copies,
 * the collectives' staging copies (backend_comm_copy: none on the CPU),
 * element-wise ops, device scalars, bias, embedding, positions, LayerNorm,
 * dropout, the fused residual + dropout + LayerNorm, AdamW, softmax,
 * attention (T >= 128 among them), cross-entropy full-row and vocab-parallel, GEMM and linear layers (fused epilogues and
 * separate kernels on CUDA, weights inside and outside a registered master
 * range), compute weights, launches beyond 65,535 blocks, and the check that
 * no op allocates behind the allocator (backend_ops/ops_memory.c). Bad
 * arguments are tried first, in forked children, before this process
 * touches CUDA (a CUDA context does not survive fork).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend_ops/harness.h"
#include "err.h"

/* ---- bad input, in forked children ---------------------------------------------------- */

static Backend *child_backend(bool gpu) {
    char err[256];
    Backend *be = backend_create(gpu ? DEVICE_CUDA : DEVICE_CPU, DTYPE_F32, 0, err, sizeof err);
    if (!be) {
        fprintf(stderr, "%s\n", err);
        _exit(3);
    }
    return be;
}

typedef void (*BadCall)(Backend *be);

static void bad_bias_negative(Backend *be) { op_bias_add(be, NULL, NULL, -1, 3); }
static void bad_zero_null(Backend *be) { op_zero(be, NULL, 10); }
static void bad_dropout_p(Backend *be) { op_dropout_fwd(be, NULL, NULL, 4, 1.5f, 1, 2); }
/* dropout_bwd_at's dx16: instead of dx, and written only */
static void bad_dropout_dx16_both(Backend *be) {
    float *x = backend_alloc(be, 8 * sizeof(float), MEM_ACT);
    uint16_t *h = backend_alloc(be, 8 * sizeof(uint16_t), MEM_ACT);
    op_dropout_bwd_at(be, x, h, GRAD_WRITE, x, 8, 0, 0.1f, 1, 2);
}
static void bad_dropout_dx16_add(Backend *be) {
    float *x = backend_alloc(be, 8 * sizeof(float), MEM_ACT);
    uint16_t *h = backend_alloc(be, 8 * sizeof(uint16_t), MEM_ACT);
    op_dropout_bwd_at(be, NULL, h, GRAD_ADD, x, 8, 0, 0.1f, 1, 2);
}
static void bad_adamw_step(Backend *be) { op_adamw(be, NULL, NULL, NULL, NULL, 0, 1e-3f, 0.9f, 0.999f, 1e-8f, 0, 0); }
static void bad_segs_acc(Backend *be) {
    const OpSeg s = {.n = 4, .acc = OP_SEG_MAX_ACC};
    op_segs_create(be, &s, 1, MEM_OPTIM);
}
/* The fused residual op's outputs alias what they must not. */
static void bad_residual_ln_alias(Backend *be) {
    float *x = backend_alloc(be, 8 * sizeof(float), MEM_ACT);
    op_residual_ln_fwd(be, x, x, NULL, x, x, x, x, NULL, x, x, 1, 8, 1e-5f, 0, 0.1f, 1, 2);
}
static void bad_residual_ln_bwd_alias(Backend *be) {
    float *x = backend_alloc(be, 8 * sizeof(float), MEM_ACT), *y = backend_alloc(be, 8 * sizeof(float), MEM_ACT);
    op_residual_ln_bwd(be, y, x, NULL, y, y, NULL, x, y, y, y, y, 1, 8, 0, 0.1f, 1, 2);
}
static void bad_positions_odd(Backend *be) { op_add_positions(be, NULL, 1, 1, 3); }
static void bad_gemm_negative(Backend *be) { op_gemm(be, false, false, -1, 2, 2, 1.0f, NULL, NULL, 0.0f, NULL); }
static void bad_attention_dim(Backend *be) {
    op_attention_fwd(be, NULL, NULL, NULL, NULL, NULL, NULL, 1, 1, 1, 1, -2, false);
}
static void bad_softmax_klen(Backend *be) {
    float *x = backend_alloc(be, sizeof(float), MEM_ACT);
    op_softmax_fwd(be, x, x, NULL, 1, 1, 1, 1, 1.0f, false);
}
static void bad_vp_valid(Backend *be) {
    float *x = backend_alloc(be, 4 * sizeof(float), MEM_ACT);
    op_xent_vp_max(be, x, x, 1, 4, 5);
}
/* A target outside [0, V): the CPU dies at the row, CUDA at the next sync. */
static void bad_target(Backend *be, bool vp, bool sync) {
    enum { N = 3, V = 5 };
    const int32_t targets[N] = {1, 7, 2};
    float *logits = backend_alloc(be, N * V * sizeof(float), MEM_ACT);
    float *out = backend_alloc(be, 3 * N * sizeof(float), MEM_ACT);
    int32_t *d_t = backend_alloc(be, sizeof targets, MEM_ACT);
    backend_upload(be, d_t, targets, sizeof targets);
    if (vp) op_xent_vp_loss(be, out, out + N, out, out, d_t, N, V, 0.1f, -1);
    else op_xent_fwd(be, out, out + N, logits, d_t, N, V, 0.1f, -1);
    if (!sync) _exit(7);  // the op itself did not stop the process
    backend_sync(be);
}
static void bad_xent_target(Backend *be) { bad_target(be, false, true); }
static void bad_xent_vp_target(Backend *be) { bad_target(be, true, true); }
static void xent_target_unsynced(Backend *be) { bad_target(be, false, false); }
/* Control: zero sizes are legal no-ops even with NULL pointers. */
static void ok_zero_sizes(Backend *be) {
    op_bias_add(be, NULL, NULL, 0, 3);
    op_zero(be, NULL, 0);
    op_copy(be, NULL, NULL, 0);
    op_embedding_bwd(be, NULL, NULL, NULL, 1.0f, 0, 8, 0, 4);
    op_layernorm_bwd(be, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, 8);
    op_residual_ln_fwd(be, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, 8, 1e-5f, 0, 0.1f, 1, 2);
    op_residual_ln_bwd(be, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, 8, 0, 0.1f, 1, 2);
    op_dropout_bwd_at(be, NULL, NULL, GRAD_WRITE, NULL, 0, 0, 0.1f, 1, 2);
    op_sum_acc(be, NULL, NULL, 0);
    op_gemm(be, false, false, 0, 5, 5, 1.0f, NULL, NULL, 0.0f, NULL);
    backend_sync(be);
}

/* Runs call in a child on a fresh backend; returns its exit status (or
 * 128 + signal) and what it wrote to stderr (up to len - 1 bytes). */
static int run_child(bool gpu, BadCall call, char *out, size_t len) {
    int fds[2];
    if (pipe(fds) != 0) tp_die(__FILE__, __LINE__, "pipe failed");
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) tp_die(__FILE__, __LINE__, "fork failed");
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], 2);
        Backend *be = child_backend(gpu);
        call(be);
        backend_destroy(be);  // frees what the call allocated (leak checkers stay quiet)
        exit(0);
    }
    close(fds[1]);
    size_t used = 0;
    ssize_t got;
    while ((got = read(fds[0], out + used, len - 1 - used)) > 0) used += (size_t)got;
    out[used] = '\0';
    close(fds[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0) {}
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

static void test_bad_input(bool gpu) {
    const char *name = gpu ? "cuda" : "cpu";
    static const struct {
        const char *what;
        BadCall call;
        bool cpu_checks;  // the CPU reference checks this argument too (else only CUDA is tried)
        int status;       // expected exit status
        const char *says; // expected in the message, or NULL
    } cases[] = {
        {"bias_add N < 0", bad_bias_negative, false, 1, NULL},
        {"zero NULL", bad_zero_null, false, 1, NULL},
        {"dropout p > 1", bad_dropout_p, true, 1, "outside [0, 1]"},
        {"dropout_bwd_at dx and dx16", bad_dropout_dx16_both, true, 1, "exactly one of dx and dx16"},
        {"dropout_bwd_at dx16 accumulated", bad_dropout_dx16_add, true, 1, "not accumulated"},
        {"adamw t = 0", bad_adamw_step, true, 1, "t = 0"},
        {"segment accumulator out of range", bad_segs_acc, true, 1, "names accumulator 4"},
        {"residual_ln y aliases res_in", bad_residual_ln_alias, true, 1, "must not alias"},
        {"residual_ln_bwd d_branch aliases dy", bad_residual_ln_bwd_alias, true, 1, "must not alias"},
        {"positions odd C", bad_positions_odd, true, 1, "even"},
        {"gemm M < 0", bad_gemm_negative, true, 1, "negative"},
        {"attention D < 0", bad_attention_dim, true, 1, NULL},
        {"softmax k_len NULL", bad_softmax_klen, false, 1, "k_len"},
        {"vp_max V_valid > V_local", bad_vp_valid, false, 1, "V_valid"},
        {"xent target >= V", bad_xent_target, true, 1, "target"},
        {"xent_vp_loss target >= V", bad_xent_vp_target, true, 1, "op_xent_vp_loss"},
        {"xent bad target, no sync: the op returns", xent_target_unsynced, false, 7, NULL},
        {"zero sizes with NULL pointers", ok_zero_sizes, true, 0, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (!gpu && !cases[i].cpu_checks) continue;
        char out[2048];
        int status = run_child(gpu, cases[i].call, out, sizeof out);
        TCHECK(status == cases[i].status, "%s: bad input '%s': exit status %d, want %d; it said: %s", name,
               cases[i].what, status, cases[i].status, out);
        if (cases[i].says)
            TCHECK(strstr(out, cases[i].says) != NULL, "%s: bad input '%s': the message lacks '%s': %s", name,
                   cases[i].what, cases[i].says, out);
    }
}

/* ---- targets ------------------------------------------------------------------------------ */

static void run_target(const Target *t, Rng *rng) {
    printf("test_backend_ops: %s on %s\n", t->name, t->be->device_name);
    fflush(stdout);
    test_memory_ops(t, rng);
    test_comm_copy(t, rng);
    test_elementwise(t, rng);
    test_scalars(t, rng);
    test_bf16_convert(t, rng);
    test_bias(t, rng);
    test_embedding(t, rng);
    test_positions(t, rng);
    test_layernorm(t, rng);
    test_dropout(t, rng);
    test_dropout_win(t, rng);
    test_residual_ln(t, rng);
    test_step_vars(t, rng);
    test_adamw(t, rng);
    test_multi_tensor(t, rng);
    test_softmax(t, rng);
    test_attention(t, rng);
    test_attention_flash(t, rng);
    test_attention_drop(t, rng);
    test_xent(t, rng);
    test_gemm(t, rng);
    test_linear(t, rng);
    test_linear_drelu(t, rng);
    test_compute_weights(t, rng);
    test_big_grids(t, rng);
    test_no_hidden_allocs(t, rng);
}

int main(int argc, char **argv) {
    const bool gpu = argc > 1 && strcmp(argv[1], "gpu") == 0;
    if (argc != 2 || (!gpu && strcmp(argv[1], "cpu") != 0)) {
        fprintf(stderr, "usage: test_backend_ops cpu|gpu\n");
        return 2;
    }
#ifndef TPTRAIN_TEST_CUDA
    if (gpu) {
        fprintf(stderr, "test_backend_ops: FAIL: this build has no CUDA backend (nvcc was not found)\n");
        return 1;
    }
#endif
    if (gpu) {  // is there a GPU? asked in a child: this process must not touch CUDA before forking
        char out[1024];
        if (run_child(true, ok_zero_sizes, out, sizeof out) == 3) {
            fprintf(stderr, "test_backend_ops: FAIL: the gpu part needs a GPU (ctest label gpu): %s", out);
            return 1;
        }
    }
    test_bad_input(gpu);

    const Dtype dtypes[2] = {DTYPE_F32, DTYPE_BF16};
    for (int i = 0; i < 2; i++) {
        char err[256], name[32];
        Backend *be = backend_create(gpu ? DEVICE_CUDA : DEVICE_CPU, dtypes[i], 0, err, sizeof err);
        TP_CHECK(be, "test_backend_ops: %s", err);
        snprintf(name, sizeof name, "%s %s", gpu ? "cuda" : "cpu", dtype_name(dtypes[i]));
        Target t = {.name = name, .be = be, .is_cpu = !gpu, .bf16 = dtypes[i] == DTYPE_BF16};
        Rng rng = {20240611u};  // the same inputs for every target
        run_target(&t, &rng);
        backend_destroy(be);
    }
    return tcheck_report("test_backend_ops");
}
