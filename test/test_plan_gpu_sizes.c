/* test_plan_gpu_sizes.c: the planner's GPU-only memory against the size
 * functions the run allocates with, on the CPU. A layout planned for a GPU
 * differs from the same layout planned for the CPU (fp32 both, so no bf16
 * copies) by exactly:
 *  - workspace: backend_gemm_workspace_bytes(BACKEND_CUDA), the cuBLASLt
 *    workspace backend_cuda_create allocates (test_rank_device gpu checks
 *    the allocation against the same function);
 *  - comm, when the ranks share a GPU (staged): comm_shm_stage_bytes of
 *    each of its tp, dp and pp groups (test_comm_staged and test_rank_device
 *    check the groups' allocations against it); page-locked host memory,
 *    so the allocator's device peak does not include it;
 * plus the batch ids a GPU uploads (activations), which this test leaves to
 * test_plan. */
#include <string.h>

#include "check.h"
#include "tp/comm_shm.h"
#include "train/planner.h"

static void plan(const ModelConfig *cfg, const ModelStage *st, int tp, int dp, int pp, bool gpu, bool staged, int rank,
                 PlanRank *out) {
    static PlanShape shapes[64];
    for (int i = 0; i < 64; i++) shapes[i] = (PlanShape){4, 9, 10};
    PlanInput in = {.cfg = *cfg, .tp = tp, .dp = dp, .pp = pp, .micro = 2, .stages = st,
                    .grad = {.zero = 0, .dtype = COMM_F32, .bucket_elems = 1 << 16}, .gpu = gpu, .staged = staged,
                    .dtype = DTYPE_F32, .train = shapes, .n_steps = 1, .eval = shapes, .n_eval = 1};
    planner_memory(&in, rank, out);
}

int main(void) {
    ModelConfig cfg;
    char err[256];
    CHECK(config_preset("tiny", &cfg, err, sizeof err) == 0, "tiny preset: %s", err);
    cfg.vocab_size = 64;
    const int layouts[][3] = {{1, 1, 1}, {2, 1, 1}, {1, 2, 1}, {2, 2, 1}, {1, 1, 2}, {2, 2, 2}, {4, 1, 1}};
    for (size_t k = 0; k < sizeof layouts / sizeof *layouts; k++) {
        const int tp = layouts[k][0], dp = layouts[k][1], pp = layouts[k][2];
        ModelStage st[2];
        if (pp == 1) st[0] = model_stage_whole(&cfg);
        else CHECK(model_stages_make(&cfg, pp, NULL, st, err, sizeof err) == 0, "stages: %s", err);
        const size_t want_stage = comm_shm_stage_bytes(tp) + comm_shm_stage_bytes(dp) + comm_shm_stage_bytes(pp);
        for (int r = 0; r < tp * dp * pp; r++) {
            PlanRank cpu, gpu, shared;
            plan(&cfg, st, tp, dp, pp, false, false, r, &cpu);
            plan(&cfg, st, tp, dp, pp, true, false, r, &gpu);
            plan(&cfg, st, tp, dp, pp, true, true, r, &shared);
            const double ws = gpu.tag[MEM_WORKSPACE] - cpu.tag[MEM_WORKSPACE];
            CHECK(ws == (double)backend_gemm_workspace_bytes(BACKEND_CUDA) && ws == (double)(32 << 20),
                  "tp %d dp %d pp %d rank %d: the GPU's workspace exceeds the CPU's by %.0f B, not cuBLASLt's %zu", tp,
                  dp, pp, r, ws, backend_gemm_workspace_bytes(BACKEND_CUDA));
            CHECK(gpu.tag[MEM_COMM] == cpu.tag[MEM_COMM] && gpu.staging == 0.0,
                  "tp %d dp %d pp %d rank %d: a GPU per rank (NCCL) stages nothing", tp, dp, pp, r);
            CHECK(shared.tag[MEM_COMM] - gpu.tag[MEM_COMM] == (double)want_stage && shared.staging == (double)want_stage,
                  "tp %d dp %d pp %d rank %d: ranks sharing a GPU stage %.0f B, the groups allocate %zu", tp, dp, pp, r,
                  shared.tag[MEM_COMM] - gpu.tag[MEM_COMM], want_stage);
            CHECK(shared.allocator_peak == gpu.allocator_peak,
                  "tp %d dp %d pp %d rank %d: page-locked staging is not in the device allocator's peak", tp, dp, pp, r);
            CHECK(gpu.allocator_peak - cpu.allocator_peak >= ws, "the workspace is in the allocator's peak");
        }
        CHECK((tp * dp * pp == 1) == (want_stage == 0), "tp %d dp %d pp %d: a world of one stages nothing", tp, dp, pp);
    }
    return check_report("test_plan_gpu_sizes");
}
