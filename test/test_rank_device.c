/* test_rank_device.c: a rank's backend and the device facts runtime_init
 * takes from it (src/train/device.c), with forked ranks as tprun makes them.
 *
 *   test_rank_device cpu     label cpu
 *   test_rank_device gpu     label gpu (built with CUDA; needs a GPU)
 *
 * cpu: a bad LOCAL_RANK is refused in one sentence naming it; the CPU
 * backend gives runtime_init no hooks, no stream, device -1 and "not a
 * GPU", so a world of one gets plain shm and --comm nccl is refused for a
 * model in host memory; two ranks (tp 2) reduce backend buffers unstaged and
 * make no staging buffer; page-locked allocations count in their tag and in
 * mem.host_*, never in the device total, and backend_free returns them.
 *
 * gpu: two ranks share GPU 0 (LOCAL_RANK 0 and 1), each with its CUDA
 * backend: the options say GPU, with the backend's stream and hooks, and
 * --comm auto picks shared memory staged through host memory (--comm shm is
 * asked for when two or more GPUs are visible, where auto would take NCCL);
 * every collective and a send / recv on device buffers larger than one
 * staging piece (4 MiB) give bitwise the result of the same call on host
 * buffers over a plain shm group of the same ranks; the staging buffer is
 * page-locked memory tagged comm, 4 MiB for the one group that staged, not
 * in the device total, and returned by runtime_free; with one GPU, --comm
 * nccl is refused in the runtime's sentence. The parent never touches CUDA
 * (a CUDA context does not survive fork): only the ranks do.
 */
#define _GNU_SOURCE
#include "check.h"
#include "comm_ranks.h"

#include "bf16.h"
#include "train/device.h"

#define STAGE_BYTES_T ((size_t)4 << 20)  // STAGE_BYTES of comm_shm_impl.h
#define GPU_N_ELEMS ((size_t)3 << 19)    // 6 MiB of floats: two staging pieces

/* ---- cpu ---- */

static void check_cpu_solo(void) {
    char err[512] = "";
    rank_env_clear();
    setenv("LOCAL_RANK", "1x", 1);
    CHECK(rank_backend_create(DEVICE_CPU, DTYPE_F32, err, sizeof err) == NULL && strstr(err, "LOCAL_RANK") &&
              strstr(err, "1x") && !strchr(err, '\n'),
          "a bad LOCAL_RANK is refused naming it: %s", err);
    rank_env_clear();
    Backend *be = rank_backend_create(DEVICE_CPU, DTYPE_F32, err, sizeof err);
    CHECK(be != NULL, "cpu backend: %s", err);
    if (!be) return;
    CHECK(be->mem.cur[MEM_WORKSPACE] == backend_gemm_workspace_bytes(BACKEND_CPU) && be->mem.cur[MEM_WORKSPACE] == 0,
          "the CPU backend's GEMM workspace at creation: %zu bytes, the planner's figure %zu",
          be->mem.cur[MEM_WORKSPACE], backend_gemm_workspace_bytes(BACKEND_CPU));
    RuntimeOptions ro = {.n_heads = 4, .d_ff = 8, .timeout_s = 5.0, .comm = RUNTIME_COMM_AUTO};
    CommDeviceCopy hooks;
    memset(&hooks, 0xA5, sizeof hooks);
    ro.stream = &ro;  // must be overwritten
    rank_device_options(be, &ro, &hooks);
    CHECK(!ro.device_is_gpu && ro.device_copy == NULL && ro.stream == NULL && ro.device == -1 &&
              ro.n_visible_gpus == 0,
          "CPU options: gpu %d, hooks %p, stream %p, device %d, visible %d", ro.device_is_gpu, (void *)ro.device_copy,
          ro.stream, ro.device, ro.n_visible_gpus);
    BackendCommCopy bc;
    CHECK(!backend_comm_copy(be, &bc), "a host-visible backend has no staging hooks");
    size_t used = 1;
    CHECK(!backend_device_used(be, &used) && used == 0 && be->mem.device_used_peak == 0, "no device memory on the CPU");
    Runtime rt;
    CHECK(runtime_init(&rt, &ro, err, sizeof err) == 0 && rt.comm == RUNTIME_COMM_SHM && !rt.staged,
          "a world of one on the CPU: plain shm (%s)", err);
    runtime_free(&rt);
    ro.comm = RUNTIME_COMM_NCCL;
    CHECK(runtime_init(&rt, &ro, err, sizeof err) == -1 && strstr(err, "--comm nccl") && !strchr(err, '\n'),
          "--comm nccl with the model in host memory is refused: %s", err);

    // Page-locked host memory: in its tag and host_*, not in the device total.
    const MemStats before = be->mem;
    void *h = backend_alloc_host(be, 1000, MEM_COMM);
    CHECK(h != NULL && be->mem.cur[MEM_COMM] == before.cur[MEM_COMM] + 1000 && be->mem.host_cur == 1000 &&
              be->mem.host_peak == 1000 && be->mem.total_cur == before.total_cur &&
              be->mem.total_peak == before.total_peak && be->mem.n_allocs == before.n_allocs + 1,
          "host allocation: comm %zu, host %zu, total %zu", be->mem.cur[MEM_COMM], be->mem.host_cur,
          be->mem.total_cur);
    memset(h, 1, 1000);
    void *d = backend_alloc(be, 64, MEM_COMM);
    CHECK(be->mem.cur[MEM_COMM] == before.cur[MEM_COMM] + 1064 && be->mem.total_cur == before.total_cur + 64 &&
              be->mem.host_cur == 1000,
          "a device allocation of the same tag goes to the total");
    backend_free(be, h);
    CHECK(be->mem.cur[MEM_COMM] == before.cur[MEM_COMM] + 64 && be->mem.host_cur == 0 && be->mem.host_peak == 1000 &&
              be->mem.peak[MEM_COMM] >= 1064,
          "backend_free returns host memory: comm %zu, host %zu", be->mem.cur[MEM_COMM], be->mem.host_cur);
    backend_free(be, d);
    backend_destroy(be);
}

/* Rank rank of n's backend on device, from the launcher's variables; NULL
 * when refused (reported, the reason in err). */
static Backend *rank_open(int rank, int n, DeviceChoice device, char *err, size_t err_len) {
    rank_env_clear();
    rank_env_set(rank, n);
    Backend *be = rank_backend_create(device, DTYPE_F32, err, err_len);
    CHECK(be != NULL, "rank %d: %s", rank, err);
    return be;
}

static void rank_cpu(int rank, int n, int fd, void *arg) {
    (void)fd, (void)arg;
    char err[512] = "";
    Backend *be = rank_open(rank, n, DEVICE_CPU, err, sizeof err);
    if (!be) return;
    RuntimeOptions ro = {.n_heads = 4, .d_ff = 8, .timeout_s = 20.0, .tp = n};
    CommDeviceCopy hooks;
    rank_device_options(be, &ro, &hooks);
    Runtime rt;
    const int rc = runtime_init(&rt, &ro, err, sizeof err);
    CHECK(rc == 0, "rank %d: %s", rank, err);
    if (rc) return;
    CHECK(rt.comm == RUNTIME_COMM_SHM && !rt.staged && rt.mesh.tp == n, "CPU ranks: plain shm, tp %d", rt.mesh.tp);
    const size_t m = CHUNK_ELEMS + 5;  // past one shm slot
    float *x = backend_alloc(be, m * sizeof(float), MEM_ACT);
    for (size_t i = 0; i < m; i++) x[i] = val(rank, i, 1);
    CHECK(comm_allreduce(rt.tp, x, m, COMM_SUM) == 0, "allreduce: %s", comm_error(rt.tp));
    size_t bad = 0;
    for (size_t i = 0; i < m; i++) {
        float want = 0.0f;
        for (int r = 0; r < n; r++) want += val(r, i, 1);
        bad += x[i] != want;
    }
    CHECK(bad == 0, "rank %d: %zu elements differ from the sum in rank order", rank, bad);
    CHECK(be->mem.peak[MEM_COMM] == 0 && be->mem.host_peak == 0, "no staging buffer on the CPU (comm %zu)",
          be->mem.peak[MEM_COMM]);
    backend_free(be, x);
    runtime_free(&rt);
    backend_destroy(be);
}

/* ---- gpu ---- */

/* One collective, staged on device buffers through rt.tp and plain on host
 * buffers through `plain`, from the same inputs: the outputs must be equal
 * bit for bit. */
typedef enum { OP_ALLREDUCE, OP_ALLREDUCE_BF16, OP_REDUCE_SCATTER, OP_ALLGATHER, OP_BROADCAST, OP_SENDRECV, OP_N } Op;
static const char *const OP_NAME[OP_N] = {"allreduce", "allreduce bf16", "reduce_scatter", "allgather", "broadcast",
                                          "send/recv"};

static int run_op(Comm *c, Op op, void *in, void *out, size_t m, int rank, int n) {
    switch (op) {
    case OP_ALLREDUCE: return comm_allreduce(c, in, m, COMM_SUM);
    case OP_ALLREDUCE_BF16: return comm_allreduce_t(c, in, m, COMM_BF16, COMM_SUM);
    case OP_REDUCE_SCATTER: return comm_reduce_scatter(c, in, out, m);
    case OP_ALLGATHER: return comm_allgather(c, in, out, m);
    case OP_BROADCAST: return comm_broadcast(c, in, m * sizeof(float), n - 1);
    case OP_SENDRECV:
        return rank == 0 ? comm_send(c, in, m * sizeof(float), 1) : comm_recv(c, in, m * sizeof(float), 0);
    default: return -1;
    }
}

static void check_op(Backend *be, Comm *staged, Comm *plain, Op op, int rank, int n) {
    const size_t m = GPU_N_ELEMS;
    const size_t in_elems = op == OP_REDUCE_SCATTER ? (size_t)n * m : m;
    const size_t out_elems = op == OP_ALLGATHER ? (size_t)n * m : op == OP_REDUCE_SCATTER ? m : 0;
    float *host_in = alloc_floats(in_elems), *host_out = alloc_floats(out_elems);
    for (size_t i = 0; i < in_elems; i++) host_in[i] = val(rank, i, (int)op + 10);
    if (op == OP_ALLREDUCE_BF16) {
        uint16_t *b = (uint16_t *)host_in;  // m bf16 values in the first half
        for (size_t i = 0; i < m; i++) b[i] = tp_f32_to_bf16(val(rank, i, 99));
    }
    float *dev_in = backend_alloc(be, in_elems * sizeof(float), MEM_ACT);
    float *dev_out = out_elems ? backend_alloc(be, out_elems * sizeof(float), MEM_ACT) : NULL;
    backend_upload(be, dev_in, host_in, in_elems * sizeof(float));
    CHECK(run_op(staged, op, dev_in, dev_out, m, rank, n) == 0, "%s staged: %s", OP_NAME[op], comm_error(staged));
    CHECK(run_op(plain, op, host_in, host_out, m, rank, n) == 0, "%s plain: %s", OP_NAME[op], comm_error(plain));
    const bool in_place = out_elems == 0;
    const size_t res_elems = in_place ? in_elems : out_elems;
    float *got = alloc_floats(res_elems);
    backend_download(be, got, in_place ? dev_in : dev_out, res_elems * sizeof(float));
    const void *want = in_place ? host_in : host_out;
    CHECK(memcmp(got, want, res_elems * sizeof(float)) == 0, "rank %d: %s staged on the GPU differs from plain shm",
          rank, OP_NAME[op]);
    if (op == OP_ALLREDUCE) {  // and the plain one is the sum in rank order
        size_t bad = 0;
        for (size_t i = 0; i < m; i++) {
            float w = 0.0f;
            for (int r = 0; r < n; r++) w += val(r, i, (int)op + 10);
            bad += got[i] != w;
        }
        CHECK(bad == 0, "rank %d: %zu sums differ from the rank-order sum", rank, bad);
    }
    free(got);
    backend_free(be, dev_in);
    backend_free(be, dev_out);
    free(host_in);
    free(host_out);
}

static void rank_gpu(int rank, int n, int fd, void *arg) {
    (void)fd, (void)arg;
    char err[512] = "";
    Backend *be = rank_open(rank, n, DEVICE_CUDA, err, sizeof err);
    if (!be) return;
    CHECK(be->mem.cur[MEM_WORKSPACE] == backend_gemm_workspace_bytes(BACKEND_CUDA) &&
              be->mem.cur[MEM_WORKSPACE] == ((size_t)32 << 20),
          "the cuBLASLt workspace the CUDA backend allocates: %zu bytes, the planner's figure %zu",
          be->mem.cur[MEM_WORKSPACE], backend_gemm_workspace_bytes(BACKEND_CUDA));
    int n_gpus = 0;
    backend_cuda_available(&n_gpus);
    CHECK(be->device == rank % n_gpus, "LOCAL_RANK %d picks GPU %d of %d, got %d", rank, rank % n_gpus, n_gpus,
          be->device);
    RuntimeOptions ro = {.n_heads = 4, .d_ff = 8, .timeout_s = 60.0, .tp = n,
                         .comm = n_gpus >= n ? RUNTIME_COMM_SHM : RUNTIME_COMM_AUTO};
    CommDeviceCopy hooks;
    rank_device_options(be, &ro, &hooks);
    CHECK(ro.device_is_gpu && ro.device_copy == &hooks && ro.stream != NULL && ro.stream == backend_stream(be) &&
              ro.device == be->device && ro.n_visible_gpus == n_gpus,
          "GPU options: gpu %d, hooks %p, stream %p, device %d, visible %d", ro.device_is_gpu,
          (void *)ro.device_copy, ro.stream, ro.device, ro.n_visible_gpus);
    CHECK(hooks.ctx == be && hooks.to_host && hooks.to_device && hooks.host_alloc && hooks.host_free,
          "the backend's staging hooks");
    if (n_gpus < n) {  // ranks share a GPU: NCCL cannot have them
        RuntimeOptions bad = ro;
        bad.comm = RUNTIME_COMM_NCCL;
        Runtime r2;
        char want[256];
        snprintf(want, sizeof want, "--comm nccl needs one GPU per rank: %d ranks share %d GPU%s on this node", n,
                 n_gpus, n_gpus == 1 ? "" : "s");
        CHECK(runtime_init(&r2, &bad, err, sizeof err) == -1 &&
                  (runtime_have_nccl() ? strcmp(err, want) == 0 : strstr(err, "no NCCL") != NULL),
              "--comm nccl with %d ranks on %d GPU(s): %s", n, n_gpus, err);
    }
    Runtime rt;
    const int rc = runtime_init(&rt, &ro, err, sizeof err);
    CHECK(rc == 0, "rank %d: %s", rank, err);
    if (rc) return;
    CHECK(rt.comm == RUNTIME_COMM_SHM && rt.staged, "ranks on GPU buffers over shm are staged");
    Comm *plain = create_or_report("plain", rank, n, 60.0);
    if (!plain) return;
    const MemStats before = be->mem;
    for (int op = 0; op < OP_N; op++) check_op(be, rt.tp, plain, (Op)op, rank, n);
    const size_t stage = comm_shm_stage_bytes(n);  // the planner's figure for the one group called (tp)
    CHECK(stage == STAGE_BYTES_T && be->mem.peak[MEM_COMM] == before.peak[MEM_COMM] + stage && be->mem.host_peak == stage &&
              be->mem.total_peak - before.total_peak <= (size_t)(2 * n + 1) * GPU_N_ELEMS * sizeof(float),
          "the staging buffer: %zu bytes tagged comm, %zu page-locked (want %zu each), not in the device total",
          be->mem.peak[MEM_COMM] - before.peak[MEM_COMM], be->mem.host_peak, STAGE_BYTES_T);
    size_t used = 0;
    CHECK(backend_device_used(be, &used) && used > be->mem.total_cur && be->mem.device_used_peak >= used,
          "device memory in use %zu above this rank's allocations %zu", used, be->mem.total_cur);
    comm_free(plain);
    runtime_free(&rt);
    CHECK(be->mem.cur[MEM_COMM] == 0 && be->mem.host_cur == 0, "runtime_free returns the staging buffer (%zu left)",
          be->mem.cur[MEM_COMM]);
    backend_destroy(be);
}

int main(int argc, char **argv) {
    const bool gpu = argc == 2 && strcmp(argv[1], "gpu") == 0;
    if (argc != 2 || (!gpu && strcmp(argv[1], "cpu") != 0)) {
        fprintf(stderr, "usage: test_rank_device cpu|gpu\n");
        return 2;
    }
    init_job("trd");
    Run *run = malloc(sizeof *run);
    if (gpu) {
        run_ranks("two ranks on GPU buffers", 2, rank_gpu, NULL, run);
        check_all_ok("two ranks on GPU buffers", run);
    } else {
        check_cpu_solo();
        run_ranks("two CPU ranks", 2, rank_cpu, NULL, run);
        check_all_ok("two CPU ranks", run);
    }
    CHECK(shm_leftovers() == 0, "segments left in /dev/shm");
    free(run);
    return check_report("test_rank_device");
}
