/* test_decode.c: incremental decoding agrees with the full forward pass,
 * beam search with beam 1 equals greedy search, batching does not change
 * results, and a model trained on the copy task decodes copies. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "data/synthetic.h"
#include "transformer/decode.h"
#include "transformer/optim.h"

/* Incremental and full forward passes use the same fp32 ops in another
 * order of rows; sums of ~10 log-probabilities agree to ~1e-5 relative. */
#define SCORE_RTOL 1e-4

static void train_copy(Model *m, int steps) {
    OptimConfig oc = optim_defaults();
    oc.lr = 5e-3f;
    oc.warmup = 50;
    AdamW opt;
    adamw_init(&opt, m->be, &oc, m->tab.n_elems);
    for (int step = 1; step <= steps; step++) {
        OwnedBatch b;
        synth_batch(&b, SYNTH_COPY, config_tokens(&m->cfg), 32, 4, 12, 3, (uint64_t)step);
        int n = 0;
        model_zero_grad(m);
        model_forward(m, &b.view, false, (DropoutKey){0}, &n);
        model_backward(m, &b.view, false, (DropoutKey){0}, 1.0f / (float)n);
        float g = grad_global_norm(m->be, &m->tab, m->grads, NULL);
        clip_grads(m->be, m->grads, m->tab.n_elems, g, 1.0f);
        adamw_step(&opt, m->params, m->grads, &m->tab, lr_at(&oc, step));
        owned_batch_free(&b);
    }
    adamw_free(&opt);
}

int main(void) {
    char err[256];
    ModelConfig cfg;
    config_preset("tiny", &cfg, err, sizeof err);
    Model m;
    CHECK(model_create(&m, NULL, &cfg, NULL, 11, err, sizeof err) == 0, "%s", err);
    train_copy(&m, 400);

    OwnedBatch ob;
    const int n = 16;
    synth_batch(&ob, SYNTH_COPY, config_tokens(&cfg), n, 4, 12, 77, 1);
    SrcBatch sb = {.n = n, .S = ob.view.S, .src = ob.src, .src_len = ob.src_len};
    Hypotheses g, b1, b4;
    decode_greedy(&m, &sb, &g);
    decode_beam(&m, &sb, 1, 1.0f, &b1);
    decode_beam(&m, &sb, 4, 1.0f, &b4);

    int exact = 0, exact4 = 0;
    for (int i = 0; i < n; i++) {
        CHECK(g.len[i] == b1.len[i] && memcmp(g.hyp[i], b1.hyp[i], (size_t)g.len[i] * sizeof(int32_t)) == 0,
              "sentence %d: beam 1 differs from greedy", i);
        exact += g.len[i] == ob.src_len[i] &&
                 memcmp(g.hyp[i], ob.src + i * ob.view.S, (size_t)g.len[i] * sizeof(int32_t)) == 0;
        exact4 += b4.len[i] == ob.src_len[i] &&
                  memcmp(b4.hyp[i], ob.src + i * ob.view.S, (size_t)b4.len[i] * sizeof(int32_t)) == 0;
    }
    printf("copies decoded exactly: greedy %d/%d, beam 4 %d/%d\n", exact, n, exact4, n);
    CHECK(exact >= n / 2, "greedy decoded only %d of %d copies exactly", exact, n);
    CHECK(exact4 >= n / 2, "beam 4 decoded only %d of %d copies exactly", exact4, n);

    /* Teacher-forced scores of the greedy outputs equal the scores greedy
     * accumulated step by step: the cached decoder equals the full one. */
    int T = 0;
    for (int i = 0; i < n; i++) T = g.len[i] + 1 > T ? g.len[i] + 1 : T;
    int32_t *tin = malloc((size_t)n * T * sizeof(int32_t)), *tout = malloc((size_t)n * T * sizeof(int32_t));
    int32_t tlen[16];
    for (int i = 0; i < n; i++) {
        for (int t = 0; t < T; t++) tin[i * T + t] = tout[i * T + t] = cfg.pad_id;
        tin[i * T] = cfg.bos_id;
        for (int t = 0; t < g.len[i]; t++) {
            tin[i * T + t + 1] = g.hyp[i][t];
            tout[i * T + t] = g.hyp[i][t];
        }
        tout[i * T + g.len[i]] = cfg.eos_id;
        tlen[i] = g.len[i] + 1;
    }
    Batch fb = {.B = n, .S = sb.S, .T = T, .src = sb.src, .src_len = sb.src_len, .tgt_in = tin, .tgt_out = tout,
                .tgt_len = tlen};
    CHECK(model_check_batch(&m, &fb, err, sizeof err) == 0, "%s", err);
    double scores[16];
    model_score(&m, &fb, scores);
    int ended = 0;
    for (int i = 0; i < n; i++) {
        if (g.len[i] >= decode_max_len(&cfg, sb.src_len[i])) continue;  // stopped by the limit, no eos
        ended++;
        CHECK_CLOSE(g.score[i], scores[i], SCORE_RTOL, 1e-5, "greedy score vs teacher-forced score");
        CHECK_CLOSE(b1.score[i], scores[i], SCORE_RTOL, 1e-5, "beam-1 score vs teacher-forced score");
    }
    CHECK(ended > 0, "no greedy output ended with eos");

    /* One sentence at a time gives the same output as the padded batch. */
    for (int i = 0; i < n; i += 5) {
        SrcBatch one = {.n = 1, .S = sb.src_len[i], .src = sb.src + i * sb.S, .src_len = sb.src_len + i};
        Hypotheses h;
        decode_beam(&m, &one, 4, 1.0f, &h);
        CHECK(h.len[0] == b4.len[i] && memcmp(h.hyp[0], b4.hyp[i], (size_t)h.len[0] * sizeof(int32_t)) == 0,
              "sentence %d decoded alone differs from the batch", i);
        hypotheses_free(&h);
    }
    free(tin);
    free(tout);
    hypotheses_free(&g);
    hypotheses_free(&b1);
    hypotheses_free(&b4);
    owned_batch_free(&ob);
    model_free(&m);
    return check_report("test_decode");
}
