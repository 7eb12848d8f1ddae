/* bench_ln_ops.c: the LayerNorm ops alone, timed, as memory bandwidth.
 *
 *   bench_ln_ops [cpu|cuda] [REPS]
 *
 * The row ops of a pre-LN boundary (layernorm_fwd / _bwd, residual_ln_fwd
 * with y16, residual_ln_bwd with d_branch16 and a bias, the base preset's
 * bf16 forms) on (N, C) rows of the model's shapes: one line per op and
 * shape with the time per call and the bytes the op must move (each tensor
 * read or written once: see bytes_of) over that time, in GB/s, against the
 * device's peak (an H200's 4.8 TB/s). Not a test (no pass or fail): the
 * figure scripts/gpu_kernel_times.sh reports beside its kernel table, so
 * a GPU run measures what layernorm_row.cuh's changes bought. On a CPU it
 * runs as well (a smoke check of the program, at CPU speed).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "clock.h"
#include "ops.h"

typedef enum { LN_FWD, LN_BWD, RLN_FWD16, RLN_BWD16, N_OPS } OpKind;
static const char *const OP_NAMES[N_OPS] = {"layernorm_fwd", "layernorm_bwd", "residual_ln_fwd y16",
                                            "residual_ln_bwd d_branch16+bias"};

/* Bytes per element each op must move at least: fp32 tensors 4, bf16 2. */
static double bytes_of(OpKind op) {
    switch (op) {
        case LN_FWD: return 4 + 4;                  // x read, y written
        case LN_BWD: return 4 + 4 + 4 + 4;          // dy, x, dx read, dx written
        case RLN_FWD16: return 4 + 4 + 4 + 2;       // res_in, branch read, res_out, y16 written
        case RLN_BWD16: return 4 + 4 + 4 + 4 + 2;   // dy, x, d_res read, d_res, d_branch16 written
        default: return 0;
    }
}

typedef struct {
    float *a, *b, *c, *d, *mean, *rstd, *gamma, *beta, *bias, *dg, *db, *dbias;
    uint16_t *h;
} Bufs;

static void run_op(Backend *be, OpKind op, Bufs *u, int N, int C) {
    const float p = 0.3f;  // the base preset's dropout
    switch (op) {
        case LN_FWD: op_layernorm_fwd(be, u->b, u->mean, u->rstd, u->a, u->gamma, u->beta, N, C, 1e-5f); break;
        case LN_BWD: op_layernorm_bwd(be, u->c, u->dg, u->db, u->d, u->a, u->mean, u->rstd, u->gamma, N, C); break;
        case RLN_FWD16:
            op_residual_ln_fwd(be, u->c, NULL, u->h, u->mean, u->rstd, u->a, u->b, u->bias, u->gamma, u->beta, N, C,
                               1e-5f, 0, p, 1234, 7);
            break;
        case RLN_BWD16:
            op_residual_ln_bwd(be, u->c, NULL, u->h, u->dg, u->db, u->dbias, u->d, u->a, u->mean, u->rstd, u->gamma, N,
                               C, 0, p, 1234, 7);
            break;
        default: break;
    }
}

static float *filled(Backend *be, size_t n, float v) {
    float *h = malloc(n * sizeof(float)), *d = backend_alloc(be, n * sizeof(float), MEM_ACT);
    if (!h) { fprintf(stderr, "bench_ln_ops: out of host memory\n"); exit(1); }
    for (size_t i = 0; i < n; i++) h[i] = v + (float)(i % 97) * 0.01f;
    backend_upload(be, d, h, n * sizeof(float));
    free(h);
    return d;
}

static void bench_shape(Backend *be, int N, int C, int reps) {
    const size_t nc = (size_t)N * C;
    Bufs u = {filled(be, nc, 1.0f), filled(be, nc, 0.5f), filled(be, nc, 0.0f), filled(be, nc, -0.25f),
              filled(be, N, 0.0f), filled(be, N, 1.0f), filled(be, C, 1.0f), filled(be, C, 0.0f), filled(be, C, 0.1f),
              filled(be, C, 0.0f), filled(be, C, 0.0f), filled(be, C, 0.0f),
              backend_alloc(be, nc * sizeof(uint16_t), MEM_ACT)};
    for (int op = 0; op < N_OPS; op++) {
        run_op(be, (OpKind)op, &u, N, C);  // warm-up: plans, shared-memory opt-in, the workspace
        backend_sync(be);
        const double t0 = tp_now_s();
        for (int r = 0; r < reps; r++) run_op(be, (OpKind)op, &u, N, C);
        backend_sync(be);
        const double per = (tp_now_s() - t0) / reps;
        const double gbs = bytes_of((OpKind)op) * (double)nc / per / 1e9;
        printf("%-34s N %6d C %5d  %9.1f us  %8.1f GB/s\n", OP_NAMES[op], N, C, per * 1e6, gbs);
    }
    float *bufs[] = {u.a, u.b, u.c, u.d, u.mean, u.rstd, u.gamma, u.beta, u.bias, u.dg, u.db, u.dbias};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) backend_free(be, bufs[i]);
    backend_free(be, u.h);
}

int main(int argc, char **argv) {
    DeviceChoice dev = DEVICE_CUDA;
    if (argc > 1 && device_choice_parse(argv[1], &dev) != 0) {
        fprintf(stderr, "usage: bench_ln_ops [cpu|cuda] [REPS]\n");
        return 2;
    }
    const int reps = argc > 2 ? atoi(argv[2]) : 50;
    if (reps < 1) {
        fprintf(stderr, "bench_ln_ops: REPS must be a whole number >= 1, got %s\n", argv[2]);
        return 2;
    }
    char err[256];
    Backend *be = backend_create(dev, DTYPE_BF16, 0, err, sizeof err);
    if (!be) {
        fprintf(stderr, "bench_ln_ops: %s\n", err);
        return 1;
    }
    /* base preset at 16k and 4k tokens, big preset at 16k; on a CPU one small shape */
    static const int shapes[][2] = {{16384, 512}, {4096, 512}, {16384, 1024}};
    const bool cpu = dev == DEVICE_CPU;
    for (size_t i = 0; i < (cpu ? 1 : sizeof shapes / sizeof shapes[0]); i++)
        bench_shape(be, cpu ? 256 : shapes[i][0], shapes[i][1], reps);
    backend_destroy(be);
    return 0;
}
