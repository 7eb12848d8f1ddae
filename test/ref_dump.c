/* ref_dump.c: writes one case for the PyTorch reference
 * (test/reference/check_reference.py): an export of the weights, a padded
 * batch, and what the C model computes from them: logits, loss, every
 * parameter gradient, the gradient norm, and the weights after one clipped
 * AdamW step. Usage: ref_dump OUT_DIR relu|gelu
 *
 * The weights are first moved away from their initial values by a few
 * training steps, so LayerNorm gains and biases are not 1 and 0. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "data/synthetic.h"
#include "err.h"
#include "safetensors.h"
#include "transformer/export.h"
#include "transformer/model.h"
#include "transformer/optim.h"
#include "testmodel.h"

/* Right-padded batch: B = 3, S = 7, T = 8, every row a different length. */
static const int32_t SRC[3 * 7] = {5, 9, 12, 30, 7, 0, 0, 11, 0, 0, 0, 0, 0, 0, 4, 8, 15, 16, 23, 38, 39};
static const int32_t SRC_LEN[3] = {5, 1, 7};
static const int32_t TGT_IN[3 * 8] = {2, 17, 18, 19, 0, 0, 0, 0, 2, 21, 22, 23, 24, 25, 26, 27,
                                      2, 33, 0, 0, 0, 0, 0, 0};
static const int32_t TGT_OUT[3 * 8] = {17, 18, 19, 3, 0, 0, 0, 0, 21, 22, 23, 24, 25, 26, 27, 3,
                                       33, 3, 0, 0, 0, 0, 0, 0};
static const int32_t TGT_LEN[3] = {4, 8, 2};

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: ref_dump OUT_DIR relu|gelu\n");
        return 2;
    }
    const char *out = argv[1];
    char err[512], path[4096];
    ModelConfig cfg = test_model_config(32, 4, 48, 40, 2, 0.0f);
    TP_CHECK(activation_parse(argv[2], &cfg.act) == 0, "activation must be relu or gelu");
    Model m;
    TP_CHECK(model_create(&m, NULL, &cfg, NULL, 1234, err, sizeof err) == 0, "%s", err);

    /* A few steps on the copy task, so no parameter keeps its initial value. */
    OptimConfig oc = optim_defaults();
    oc.lr = 3e-3f;
    oc.warmup = 0;
    AdamW warm;
    adamw_init(&warm, m.be, &oc, m.tab.n_elems);
    for (int step = 1; step <= 5; step++) {
        OwnedBatch b;
        synth_batch(&b, SYNTH_COPY, config_tokens(&cfg), 8, 2, 6, 5, (uint64_t)step);
        int n = 0;
        model_zero_grad(&m);
        model_forward(&m, &b.view, false, (DropoutKey){0}, &n);
        model_backward(&m, &b.view, false, (DropoutKey){0}, 1.0f / (float)n);
        adamw_step(&warm, m.params, m.grads, &m.tab, oc.lr);
        owned_batch_free(&b);
    }
    adamw_free(&warm);

    mkdir(out, 0755);
    snprintf(path, sizeof path, "%s/model", out);
    TP_CHECK(model_export(&m, path, err, sizeof err) == 0, "%s", err);

    Batch b = {.B = 3, .S = 7, .T = 8, .src = SRC, .src_len = SRC_LEN, .tgt_in = TGT_IN, .tgt_out = TGT_OUT,
               .tgt_len = TGT_LEN};
    TP_CHECK(model_check_batch(&m, &b, err, sizeof err) == 0, "%s", err);
    int n_tok = 0;
    model_zero_grad(&m);
    float loss = model_forward(&m, &b, false, (DropoutKey){0}, &n_tok);
    const size_t n_logits = (size_t)b.B * b.T * cfg.vocab_size;  // kept: backward writes their gradient over them
    float *logits = TP_MALLOC(n_logits * sizeof *logits);
    memcpy(logits, model_logits(&m), n_logits * sizeof *logits);
    model_backward(&m, &b, false, (DropoutKey){0}, 1.0f / (float)n_tok);
    float gnorm = grad_global_norm(m.be, &m.tab, m.grads, NULL);

    /* One optimizer step from fresh AdamW state, clipping active (clip < norm). */
    OptimConfig step_cfg = {.lr = 1e-3f, .warmup = 0, .beta1 = 0.9f, .beta2 = 0.98f, .eps = 1e-8f,
                            .weight_decay = 0.01f, .clip_norm = 0.5f * gnorm};
    float *grads_clipped = TP_MALLOC(m.tab.n_elems * sizeof(float));
    float *updated = TP_MALLOC(m.tab.n_elems * sizeof(float));
    memcpy(grads_clipped, m.grads, m.tab.n_elems * sizeof(float));
    memcpy(updated, m.params, m.tab.n_elems * sizeof(float));
    clip_grads(m.be, grads_clipped, m.tab.n_elems, gnorm, step_cfg.clip_norm);
    AdamW opt;
    adamw_init(&opt, m.be, &step_cfg, m.tab.n_elems);
    adamw_step(&opt, updated, grads_clipped, &m.tab, step_cfg.lr);

    StWriter *w = st_writer_new();
    const int64_t sh_src[2] = {3, 7}, sh_tgt[2] = {3, 8}, sh_b[1] = {3}, sh_one[1] = {1};
    const int64_t sh_logits[3] = {3, 8, cfg.vocab_size};
    st_writer_add(w, "src", ST_I32, 2, sh_src, SRC);
    st_writer_add(w, "src_len", ST_I32, 1, sh_b, SRC_LEN);
    st_writer_add(w, "tgt_in", ST_I32, 2, sh_tgt, TGT_IN);
    st_writer_add(w, "tgt_out", ST_I32, 2, sh_tgt, TGT_OUT);
    st_writer_add(w, "tgt_len", ST_I32, 1, sh_b, TGT_LEN);
    st_writer_add(w, "logits", ST_F32, 3, sh_logits, logits);
    st_writer_add(w, "loss", ST_F32, 1, sh_one, &loss);
    st_writer_add(w, "grad_norm", ST_F32, 1, sh_one, &gnorm);
    char (*names)[128] = TP_MALLOC((size_t)m.tab.n * 2 * sizeof *names);
    for (int i = 0; i < m.tab.n; i++) {
        const ParamInfo *p = &m.tab.t[i];
        int64_t shape[2] = {p->shape[0], p->shape[1]};
        snprintf(names[2 * i], sizeof names[0], "grad.%s", p->name);
        snprintf(names[2 * i + 1], sizeof names[0], "adamw.%s", p->name);
        st_writer_add(w, names[2 * i], ST_F32, p->ndim, shape, m.grads + p->offset);
        st_writer_add(w, names[2 * i + 1], ST_F32, p->ndim, shape, updated + p->offset);
    }
    const struct { const char *key; double value; } meta[] = {
        {"lr", step_cfg.lr}, {"beta1", step_cfg.beta1}, {"beta2", step_cfg.beta2}, {"adam_eps", step_cfg.eps},
        {"weight_decay", step_cfg.weight_decay}, {"clip_norm", step_cfg.clip_norm}};
    for (size_t i = 0; i < sizeof meta / sizeof meta[0]; i++) {
        char buf[64];
        snprintf(buf, sizeof buf, "%.9g", meta[i].value);
        st_writer_meta(w, meta[i].key, buf);
    }
    snprintf(path, sizeof path, "%s/case.safetensors", out);
    TP_CHECK(st_writer_write(w, path, err, sizeof err) == 0, "%s", err);
    st_writer_free(w);
    printf("ref_dump: %s: loss %.6f over %d tokens, grad norm %.6f, %d tensors\n", out, loss, n_tok, gnorm, m.tab.n);
    free(names);
    free(grads_clipped);
    free(updated);
    free(logits);
    adamw_free(&opt);
    model_free(&m);
    return 0;
}
