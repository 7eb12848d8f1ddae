/* test_keep_bf16.c: keeping the GEMM-only activations in bf16
 * (model_set_keep_bf16) changes the memory, not the results.
 *
 * In bf16 mode the GEMMs multiply bf16 roundings of their operands, so a
 * LayerNorm output, an attention output or an FFN activation that backward
 * needs only as a GEMM operand can be kept as that rounding: the CPU
 * backend's bf16 emulation rounds where the GPU does, and this test runs
 * there. For ReLU and GELU, recompute none, selective and full, one rank and
 * tp 2 with and without sequence parallelism (ranks forked, talking over
 * shared memory), two micro-batches of different shapes in flight (two
 * activation slots: F0 F1 B0 B1) with dropout on (attention and activation
 * dropout too; and for ReLU once without activation dropout, where the
 * kept-bf16 FFN passes its hidden gradient in bf16, op_linear_bwd16; and
 * without sequence parallelism the attention sub-block's output gradient
 * flows in bf16 from residual_ln_bwd's d_branch16 into out_proj's
 * backward; and once more without attention dropout; with q, k, v kept in
 * bf16 the attention backward writes their gradients as bf16 bits, dq16,
 * dk16, dv16, which the q, k, v projections' backward reads, with the mask
 * on the probabilities and without: attention_drop_bwd, attention_bwd_x16;
 * and the FFN keeps its ReLU's bit-mask, from which fc2's backward masks the
 * hidden gradient and sums fc1's bias gradient, op_linear_bwd16_drelu, whose
 * mask bytes the planner's walk counts, mask_accounting; and without
 * sequence parallelism the FFN's output gradient, which the layer
 * boundary's dropout backward makes, is stored as bf16 bits by that
 * dropout, op_dropout_bwd_at's dx16, and read so by fc2's backward,
 * linear_bwd16's dy16, in every configuration: each FFN of both
 * micro-batches takes that route kept in bf16 and none kept in fp32,
 * counted through the backend's table, so a wrong rounding in the
 * dropout's bf16 store moves fc2's weight and input gradients and fails
 * the comparison): the loss sum and every gradient of the rank's shard are
 * bitwise those of keeping them in fp32 (where the gradients stay fp32 and
 * the GEMMs round them), and the activation bytes are fewer. In fp32 mode
 * the switch does nothing.
 */
#include "micro_runs.h"

#include <string.h>

static ModelConfig test_config(Activation act, float act_dropout, float attn_dropout) {
    ModelConfig c;
    char err[256];
    config_preset("tiny", &c, err, sizeof err);
    c.act = act;
    c.enc_layers = 2;
    c.dec_layers = 2;
    c.dropout = 0.1f;
    c.attn_dropout = attn_dropout;  // 0.1: attention_drop_bwd; 0: attention_bwd_x16 (both with dq16, dk16, dv16)
    c.act_dropout = act_dropout;  // 0: the FFN's hidden gradient in bf16 (ReLU kept in bf16), fc2 to fc1
    return c;
}

/* The backend's dropout_bwd_at counted by form: the bf16-storing one
 * (dx16) is the FFN's output gradient for fc2 (model_bwd.c's fc2_grad16). */
static const BackendOps *g_real;
static long g_drop16;
static void c_drop_bwd(Backend *be, float *dx, uint16_t *dx16, GradMode mode, const float *dy, size_t n, uint64_t f,
                       float p, uint64_t seed, uint64_t st) {
    g_drop16 += dx16 != NULL;
    g_real->dropout_bwd_at(be, dx, dx16, mode, dy, n, f, p, seed, st);
}

/* Two micro-batches forward, then both backward, on a fresh model. */
static MicroRun run(Backend *be, const ModelConfig *cfg, const TpGroup *g, bool sp, ModelRecompute rc, bool keep) {
    char err[256];
    Model m;
    CHECK(model_create(&m, be, cfg, g, 3, err, sizeof err) == 0, "%s", err);
    CHECK(model_set_sequence_parallel(&m, sp, err, sizeof err) == 0, "%s", err);
    model_set_recompute(&m, rc);
    model_set_keep_bf16(&m, keep);
    CHECK(m.keep_bf16 == keep, "keep_bf16 %d after asking for %d in bf16 mode", m.keep_bf16, keep);
    const MicroRun r = micro_run(&m, (const int[MICRO_N]){9, 6});
    model_free(&m);
    return r;
}

/* keep on against keep off for every configuration this rank runs. */
static void compare_all(Backend *be, const TpGroup *g, const char *who) {
    /* ReLU three times: with activation dropout (the hidden gradient in fp32) and without (in bf16, fc2 to
     * fc1), then also without attention dropout (the attention backward without a mask, attention_bwd_x16) */
    const Activation acts[4] = {ACT_RELU, ACT_GELU, ACT_RELU, ACT_RELU};
    const float act_p[4] = {0.1f, 0.1f, 0.0f, 0.0f}, attn_p[4] = {0.1f, 0.1f, 0.1f, 0.0f};
    for (int a = 0; a < 4; a++) {
        const ModelConfig cfg = test_config(acts[a], act_p[a], attn_p[a]);
        for (int rc = MODEL_RECOMPUTE_NONE; rc <= MODEL_RECOMPUTE_FULL; rc++)
            for (int sp = 0; sp <= (g->size > 1); sp++) {
                g_drop16 = 0;
                const MicroRun off = run(be, &cfg, g, sp, (ModelRecompute)rc, false);
                const long off16 = g_drop16;
                const MicroRun on = run(be, &cfg, g, sp, (ModelRecompute)rc, true);
                const long on16 = g_drop16 - off16;
                char what[160];
                snprintf(what, sizeof what, "%s %s act dropout %g attn dropout %g recompute %s%s", who,
                         activation_name(acts[a]), (double)act_p[a], (double)attn_p[a],
                         model_recompute_name((ModelRecompute)rc), sp ? " sequence parallel" : "");
                const long want16 = sp ? 0 : (long)(cfg.enc_layers + cfg.dec_layers) * MICRO_N;
                CHECK(off16 == 0 && on16 == want16,
                      "%s: the FFN's output gradient stored in bf16 %ld times kept in fp32, %ld kept in bf16; want "
                      "0 and %ld", what, off16, on16, want16);
                CHECK(memcmp(&on.loss, &off.loss, sizeof on.loss) == 0, "%s: loss %.9g kept in bf16, %.9g in fp32",
                      what, on.loss, off.loss);
                ParamTable tab;
                param_table_build_stage(&cfg, g->size, NULL, &tab);
                size_t n_diff = 0;
                for (size_t k = 0; k < tab.n_elems; k++) n_diff += memcmp(&on.grads[k], &off.grads[k], 4) != 0;
                CHECK(n_diff == 0, "%s: %zu of %zu gradients differ", what, n_diff, tab.n_elems);
                param_table_free(&tab);
                CHECK(on.act_bytes < off.act_bytes, "%s: %zu activation bytes kept in bf16, %zu in fp32", what,
                      on.act_bytes, off.act_bytes);
                if (g->rank == 0)
                    printf("%s: bitwise equal; activations %zu -> %zu bytes (%.2fx)\n", what, off.act_bytes,
                           on.act_bytes, (double)on.act_bytes / (double)off.act_bytes);
                free(on.grads);
                free(off.grads);
            }
    }
}

/* One tp rank's comparisons (micro_fork_ranks). */
static void rank_compare(const TpGroup *g) {
    Backend *be = micro_cpu_backend(DTYPE_BF16);
    if (!be) return;
    BackendOps counted = *be->ops;
    g_real = be->ops;
    counted.dropout_bwd_at = c_drop_bwd;
    be->ops = &counted;
    char who[32];
    snprintf(who, sizeof who, "tp %d rank %d", g->size, g->rank);
    compare_all(be, g, who);
    be->ops = g_real;
    backend_destroy(be);
}

/* The ReLU bit-mask's activation bytes (model_ffn_mask_kept), as the
 * planner counts them (model_plan_activations, the model's own walk): per
 * FFN layer relu_mask_row_bytes(d_ff/tp) bytes a token, 1 bit an element
 * with rows padded to 128 bits, in 64-byte slices; none with activation
 * dropout, GELU or fp32 keeping. */
static void mask_accounting(void) {
    const int B = 3, S = 9, T = 6;
    for (int tp = 1; tp <= 2; tp++) {
        const ModelConfig relu = test_config(ACT_RELU, 0.0f, 0.1f), drop = test_config(ACT_RELU, 0.1f, 0.1f);
        size_t with[2], without[2], fp32[2];
        model_plan_activations(&relu, tp, NULL, MODEL_RECOMPUTE_NONE, false, true, false, B, S, T, &with[0], &with[1]);
        model_plan_activations(&drop, tp, NULL, MODEL_RECOMPUTE_NONE, false, true, false, B, S, T, &without[0],
                               &without[1]);
        model_plan_activations(&relu, tp, NULL, MODEL_RECOMPUTE_NONE, false, false, false, B, S, T, &fp32[0],
                               &fp32[1]);
        const size_t row = relu_mask_row_bytes(relu.d_ff / tp);
        size_t want = 0;  // floats, each layer's mask in a 16-float slice
        for (int l = 0; l < relu.enc_layers + relu.dec_layers; l++) {
            const size_t N = (size_t)B * (l < relu.enc_layers ? S : T);
            want += ((N * row + 3) / 4 + 15) & ~(size_t)15;
        }
        CHECK(model_ffn_mask_kept(&relu, true, tp) && !model_ffn_mask_kept(&drop, true, tp) &&
                  !model_ffn_mask_kept(&relu, false, tp),
              "tp %d: the mask kept exactly with bf16 keeping, ReLU and no activation dropout", tp);
        CHECK(with[0] - without[0] == want && with[1] == without[1],
              "tp %d: the masks take %zu floats of the slot (scratch %zu against %zu), want %zu", tp,
              with[0] - without[0], with[1], without[1], want);
        CHECK(row == 16 && fp32[0] > with[0], "tp %d: a mask row of %zu bytes; fp32 keeping %zu floats", tp, row,
              fp32[0]);
    }
}

int main(void) {
    mask_accounting();
    /* fp32: nothing to keep in bf16 */
    char err[256];
    const ModelConfig cfg = test_config(ACT_RELU, 0.1f, 0.1f);
    Model m;
    CHECK(model_create(&m, NULL, &cfg, NULL, 3, err, sizeof err) == 0, "%s", err);
    model_set_keep_bf16(&m, true);
    CHECK(!m.keep_bf16, "fp32 mode keeps activations in bf16");
    model_free(&m);

    const TpGroup one = {.size = 1, .rank = 0, .comm = NULL};
    rank_compare(&one);
    micro_fork_ranks("kb", 2, rank_compare);
    return check_report("test_keep_bf16");
}
