/* test_model_grad.c: the whole model's loss gradient against central finite
 * differences, on a tiny config with padding in source and target, with and
 * without dropout, and with dropout on the attention probabilities and the
 * FFN activations as well (masks are a pure function of their key, so the
 * loss is a deterministic function of the parameters either way).
 *
 * Tolerance: fp32 loss of magnitude ~4 carries rounding noise of about
 * 4 * 6e-8 * sqrt(#ops) ~ 1e-5; with step h = 1e-2 the central difference
 * has noise ~1e-5 / 2e-2 = 5e-4 per element and truncation error O(h^2) ~ 1e-4.
 * Comparing each tensor's sampled gradient vector norm-wise,
 * ||fd - analytic|| <= FD_RTOL * ||analytic|| + FD_ATOL * sqrt(k), with
 * FD_RTOL = 2e-2 and FD_ATOL = 1e-3, leaves room for that noise while a
 * wrong factor, a missing term or a swapped index (errors of order 1) fail.
 * The PyTorch reference (test/reference) checks the same gradients to 1e-4.
 */
#include <math.h>
#include <string.h>

#include "check.h"
#include "transformer/model.h"
#include "testmodel.h"
#include "cpu_ops.h"

#define FD_H 1e-2f
#define FD_RTOL 2e-2
#define FD_ATOL 1e-3
#define FD_SAMPLES 12

static const int32_t SRC[3 * 5] = {5, 6, 7, 8, 9, 10, 11, 0, 0, 0, 12, 13, 14, 15, 0};
static const int32_t SRC_LEN[3] = {5, 2, 4};
static const int32_t TGT_IN[3 * 6] = {2, 16, 17, 18, 0, 0, 2, 19, 20, 21, 22, 23, 2, 7, 0, 0, 0, 0};
static const int32_t TGT_OUT[3 * 6] = {16, 17, 18, 3, 0, 0, 19, 20, 21, 22, 23, 3, 7, 3, 0, 0, 0, 0};
static const int32_t TGT_LEN[3] = {4, 6, 2};

static float loss_of(Model *m, const Batch *b, bool train, DropoutKey key) {
    int n;
    return model_forward(m, b, train, key, &n);
}

static void run(float dropout, float attn_dropout, float act_dropout, Activation act) {
    char err[256];
    ModelConfig cfg = test_model_config(16, 2, 24, 24, 2, dropout);  // 2 layers each: the tiny preset's
    cfg.attn_dropout = attn_dropout;
    cfg.act_dropout = act_dropout;
    cfg.act = act;
    Model m;
    CHECK(model_create(&m, NULL, &cfg, NULL, 7, err, sizeof err) == 0, "%s", err);
    Batch b = {.B = 3, .S = 5, .T = 6, .src = SRC, .src_len = SRC_LEN, .tgt_in = TGT_IN, .tgt_out = TGT_OUT,
               .tgt_len = TGT_LEN};
    CHECK(model_check_batch(&m, &b, err, sizeof err) == 0, "%s", err);
    bool train = dropout > 0.0f || attn_dropout > 0.0f || act_dropout > 0.0f;
    DropoutKey key = {.seed = 99, .step = 3};
    int n_tok = 0;
    model_zero_grad(&m);
    model_forward(&m, &b, train, key, &n_tok);
    CHECK(n_tok == 12, "non-padding target tokens %d, expected 12", n_tok);
    model_backward(&m, &b, train, key, 1.0f / (float)n_tok);

    double worst = 0.0;
    const char *worst_name = "";
    for (int i = 0; i < m.tab.n; i++) {
        const ParamInfo *p = &m.tab.t[i];
        int k = p->n_elems < FD_SAMPLES ? (int)p->n_elems : FD_SAMPLES;
        double diff2 = 0.0, ref2 = 0.0;
        for (int s = 0; s < k; s++) {
            size_t j = p->offset + (size_t)s * p->n_elems / (size_t)k + (size_t)(s * 7919) % (p->n_elems / k);
            float save = m.params[j];
            m.params[j] = save + FD_H;
            float lp = loss_of(&m, &b, train, key);
            m.params[j] = save - FD_H;
            float lm = loss_of(&m, &b, train, key);
            m.params[j] = save;
            double fd = ((double)lp - (double)lm) / (2.0 * FD_H);
            double an = m.grads[j];
            diff2 += (fd - an) * (fd - an);
            ref2 += an * an;
        }
        double err_n = sqrt(diff2), tol = FD_RTOL * sqrt(ref2) + FD_ATOL * sqrt((double)k);
        CHECK(err_n <= tol, "%s (dropout %g, attention %g, activation %g, %s): ||fd - grad|| = %.3e > tol %.3e "
              "(||grad|| = %.3e)", p->name, dropout, attn_dropout, act_dropout, activation_name(act), err_n, tol,
              sqrt(ref2));
        double rel = err_n / (sqrt(ref2) + 1e-12);
        if (rel > worst && sqrt(ref2) > 1e-3) {
            worst = rel;
            worst_name = p->name;
        }
    }
    printf("dropout %.2f, attention %.2f, activation %.2f, %s: worst relative gradient error %.2e (%s)\n", dropout,
           attn_dropout, act_dropout, activation_name(act), worst, worst_name);
    /* Every tensor must receive a gradient: a dead branch would pass FD
     * trivially with zeros only if its true gradient were zero too. */
    for (int i = 0; i < m.tab.n; i++) {
        const ParamInfo *p = &m.tab.t[i];
        double s = cpu_sumsq(m.grads + p->offset, p->n_elems);
        CHECK(s > 0.0, "%s received no gradient", p->name);
    }
    model_free(&m);
}

int main(void) {
    /* GELU only: ReLU's kink makes a central difference wrong wherever a
     * pre-activation lies within h of 0 (some always do in a whole model).
     * ReLU is checked by test_ops away from 0 and by the PyTorch reference. */
    run(0.0f, 0.0f, 0.0f, ACT_GELU);
    run(0.3f, 0.0f, 0.0f, ACT_GELU);
    run(0.1f, 0.3f, 0.3f, ACT_GELU);  // every site: the sub-blocks' outputs, the probabilities, the activations
    return check_report("test_model_grad");
}
