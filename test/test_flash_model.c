/* test_flash_model.c: the model with flash attention (model_set_attention).
 *
 * On the CPU backend's bf16 emulation (the GPU's roundings), a model of two
 * encoder and two decoder layers, heads of width 16, dropout on, two
 * micro-batches of different shapes in flight (two activation slots):
 *   - recompute selective and full give the loss and every gradient of
 *     recompute none bit for bit, with flash as without it (the forward
 *     that full recomputation repeats is the same op on the same inputs);
 *   - flash against exact attention: the loss and the gradients within the
 *     bf16 roundings the flash ops add (their op test bounds each op; here
 *     the whole model's), and the activation bytes fewer;
 *   - one rank and tp 2 (ranks forked, over shared memory), with and
 *     without sequence parallelism;
 *   - model_set_attention refuses fp32 mode and a head width that is not
 *     a multiple of 16, naming why.
 */
#include "micro_runs.h"

#include <math.h>
#include <string.h>

/* The oracle is exact attention in fp32. bf16 mode's gradients are off it
 * by a few percent of the largest (every GEMM operand rounded); flash adds
 * its own roundings (p, dout, ds) to those of exact attention in bf16, a
 * far smaller share, so its error may not exceed GRAD_FACTOR times exact
 * bf16's, while a wrong mask or a missing term moves gradients by O(1).
 * The loss: within bf16's rounding of the logits. */
#define GRAD_FACTOR 2.0
#define LOSS_RTOL 1e-3

static ModelConfig test_config(void) {
    ModelConfig c;
    char err[256];
    config_preset("tiny", &c, err, sizeof err);
    c.n_heads = 2;  // d_model 32: heads of 16
    c.enc_layers = 2;
    c.dec_layers = 2;
    c.dropout = 0.1f;
    return c;
}

/* The two micro-batches on a fresh model: the second's lengths past one
 * 32-wide tile of the flash kernels. */
static MicroRun run(Backend *be, const ModelConfig *cfg, const TpGroup *g, bool sp, ModelRecompute rc,
                    ModelAttention att) {
    char err[256];
    Model m;
    CHECK(model_create(&m, be, cfg, g, 3, err, sizeof err) == 0, "%s", err);
    CHECK(model_set_sequence_parallel(&m, sp, err, sizeof err) == 0, "%s", err);
    model_set_recompute(&m, rc);
    CHECK(model_set_attention(&m, att, err, sizeof err) == 0, "%s", err);
    const MicroRun r = micro_run(&m, (const int[MICRO_N]){9, 39});
    model_free(&m);
    return r;
}

static size_t n_grads(const ModelConfig *cfg, const TpGroup *g) {
    ParamTable tab;
    param_table_build_stage(cfg, g->size, NULL, &tab);
    const size_t n = tab.n_elems;
    param_table_free(&tab);
    return n;
}

static void same_bits(const char *what, const MicroRun *a, const MicroRun *b, size_t n) {
    CHECK(memcmp(&a->loss, &b->loss, sizeof a->loss) == 0, "%s: loss %.9g against %.9g", what, a->loss, b->loss);
    size_t n_diff = 0;
    for (size_t k = 0; k < n; k++) n_diff += memcmp(&a->grads[k], &b->grads[k], 4) != 0;
    CHECK(n_diff == 0, "%s: %zu of %zu gradients differ", what, n_diff, n);
}

/* max |a - ref| / max |ref| over the gradients (infinity for a NaN). */
static double grad_err(const MicroRun *a, const MicroRun *ref, size_t n) {
    double max_g = 0, max_d = 0;
    for (size_t k = 0; k < n; k++) {
        max_g = fmax(max_g, fabs(ref->grads[k]));
        const double d = fabs((double)a->grads[k] - ref->grads[k]);
        max_d = isnan(d) ? INFINITY : fmax(max_d, d);
    }
    CHECK(max_g > 1e-3, "the gradients carry no signal (max %.3g)", max_g);
    return max_d / max_g;
}

/* flash and exact attention in bf16, each against exact attention in fp32
 * (the oracle): flash's loss and gradients no further from it than bf16's
 * own error allows. Returns flash's gradient error. */
static double close_to_fp32(const char *what, const MicroRun *flash, const MicroRun *exact, const MicroRun *fp32, size_t n) {
    const double loss_flash = fabs(flash->loss - fp32->loss);
    CHECK(loss_flash <= LOSS_RTOL * fabs(fp32->loss), "%s: loss %.9g flash, %.9g fp32 (exact bf16 %.9g)", what,
          flash->loss, fp32->loss, exact->loss);
    const double e_flash = grad_err(flash, fp32, n), e_exact = grad_err(exact, fp32, n);
    CHECK(e_flash <= GRAD_FACTOR * e_exact, "%s: gradients off fp32's by %.3g of the largest, exact bf16's by %.3g",
          what, e_flash, e_exact);
    return e_flash;
}

static void compare_all(Backend *be, Backend *be32, const TpGroup *g, const char *who) {
    const ModelConfig cfg = test_config();
    const size_t n = n_grads(&cfg, g);
    for (int sp = 0; sp <= (g->size > 1); sp++) {
        MicroRun flash[3], exact[3];
        MicroRun fp32 = run(be32, &cfg, g, sp, MODEL_RECOMPUTE_NONE, MODEL_ATTENTION_EXACT);
        for (int rc = MODEL_RECOMPUTE_NONE; rc <= MODEL_RECOMPUTE_FULL; rc++) {
            flash[rc] = run(be, &cfg, g, sp, (ModelRecompute)rc, MODEL_ATTENTION_FLASH);
            exact[rc] = run(be, &cfg, g, sp, (ModelRecompute)rc, MODEL_ATTENTION_EXACT);
        }
        char what[160];
        for (int rc = MODEL_RECOMPUTE_SELECTIVE; rc <= MODEL_RECOMPUTE_FULL; rc++) {
            snprintf(what, sizeof what, "%s%s flash: recompute %s against none", who, sp ? " sequence parallel" : "",
                     model_recompute_name((ModelRecompute)rc));
            same_bits(what, &flash[rc], &flash[MODEL_RECOMPUTE_NONE], n);
        }
        for (int rc = MODEL_RECOMPUTE_NONE; rc <= MODEL_RECOMPUTE_FULL; rc++) {
            snprintf(what, sizeof what, "%s%s recompute %s: flash against exact", who, sp ? " sequence parallel" : "",
                     model_recompute_name((ModelRecompute)rc));
            const double err = close_to_fp32(what, &flash[rc], &exact[rc], &fp32, n);
            if (rc != MODEL_RECOMPUTE_FULL)  // full keeps one layer's attention tensors either way
                CHECK(flash[rc].act_bytes < exact[rc].act_bytes, "%s: %zu activation bytes flash, %zu exact", what,
                      flash[rc].act_bytes, exact[rc].act_bytes);
            if (g->rank == 0)
                printf("%s: gradients within %.2e of fp32's largest (exact bf16: %.2e); activations %zu -> %zu "
                       "bytes\n", what, err, grad_err(&exact[rc], &fp32, n), exact[rc].act_bytes, flash[rc].act_bytes);
        }
        for (int rc = 0; rc < 3; rc++) free(flash[rc].grads), free(exact[rc].grads);
        free(fp32.grads);
    }
}

/* One tp rank's comparisons (micro_fork_ranks). */
static void rank_compare(const TpGroup *g) {
    Backend *be = micro_cpu_backend(DTYPE_BF16), *be32 = micro_cpu_backend(DTYPE_F32);
    char who[32];
    snprintf(who, sizeof who, "tp %d rank %d", g->size, g->rank);
    if (be && be32) compare_all(be, be32, g, who);
    if (be) backend_destroy(be);
    if (be32) backend_destroy(be32);
}

/* fp32 mode and a head width of 8 are refused with their reasons. */
static void refusals(void) {
    char err[256];
    ModelConfig cfg = test_config();
    Model m;
    CHECK(model_create(&m, NULL, &cfg, NULL, 3, err, sizeof err) == 0, "%s", err);
    CHECK(model_set_attention(&m, MODEL_ATTENTION_FLASH, err, sizeof err) == -1 && strstr(err, "bf16"),
          "fp32 mode: flash attention not refused for want of bf16 (%s)", err);
    CHECK(m.attention == MODEL_ATTENTION_EXACT, "a refused flash attention was kept");
    model_free(&m);
    Backend *be = micro_cpu_backend(DTYPE_BF16);
    cfg.n_heads = 4;  // heads of 8
    CHECK(model_create(&m, be, &cfg, NULL, 3, err, sizeof err) == 0, "%s", err);
    CHECK(model_set_attention(&m, MODEL_ATTENTION_FLASH, err, sizeof err) == -1 && strstr(err, "= 8"),
          "heads of 8: flash attention not refused naming the width (%s)", err);
    model_free(&m);
    backend_destroy(be);
}

int main(void) {
    refusals();
    const TpGroup one = {.size = 1, .rank = 0, .comm = NULL};
    rank_compare(&one);
    micro_fork_ranks("fm", 2, rank_compare);
    return check_report("test_flash_model");
}
