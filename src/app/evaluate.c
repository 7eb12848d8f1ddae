/* evaluate.c: dev loss and dev BLEU (see evaluate.h). The loss runs on
 * every rank of one tp group (the model is sharded); BLEU decodes on the
 * one rank that holds the whole model, and scores the detokenized text as
 * the corpus wrote it, as translate_mt's BLEU does.
 */
#include "app/evaluate.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "data/bleu.h"
#include "data/synthetic.h"
#include "err.h"
#include "mt.h"

/* Sentences decoded together for dev BLEU. A GPU's decode step should cost
 * about the same for 64 rows as for 256 (its kernels are launch-bound at
 * these sizes; not yet timed on a GPU), so it takes fewer, larger batches; a
 * CPU's work grows with the rows. (The sentences are sorted by length
 * first, so padding stays small.) */
#define EVAL_DECODE_BATCH_CPU 64
#define EVAL_DECODE_BATCH_GPU 256

/* Token-weighted mean loss over batches, no dropout. */
static void add_loss(Model *m, const Batch *b, double *sum, long *n_tok) {
    int n = 0;
    float loss = model_forward(m, b, false, (DropoutKey){0}, &n);
    *sum += (double)loss * n;
    *n_tok += n;
}

EvalResult evaluate(Model *m, Model *whole, Source *src) {
    const TrainArgs *a = src->args;
    EvalResult r = {0};
    double sum = 0.0;
    long n_tok = 0;
    if (a->synthetic) {
        for (int i = 0; i < 4; i++) {
            OwnedBatch b;
            synth_batch(&b, a->task, config_tokens(&m->cfg), a->batch_size, a->min_len, a->max_len,
                        a->seed ^ 0xE7A1ULL, i);
            add_loss(m, &b.view, &sum, &n_tok);
            owned_batch_free(&b);
        }
        r.loss = n_tok ? (float)(sum / n_tok) : 0.0f;
        return r;
    }
    Dataset *dev = &src->dev;
    const int nb = dataset_eval_batches(dev), n = dev->n_usable;
    int32_t **srcs = TP_CALLOC((size_t)n, sizeof(int32_t *)), **refs = TP_CALLOC((size_t)n, sizeof(int32_t *));
    int *slen = TP_CALLOC((size_t)n, sizeof(int)), *rlen = TP_CALLOC((size_t)n, sizeof(int));
    int32_t *index = TP_MALLOC((size_t)n * sizeof(int32_t));
    int k = 0;
    for (int i = 0; i < nb; i++) {
        OwnedBatch b;
        dataset_eval_batch(dev, i, &b, index);
        add_loss(m, &b.view, &sum, &n_tok);
        for (int row = 0; row < b.view.B && k < n; row++, k++) {
            slen[k] = b.src_len[row] - 1;  // without eos
            rlen[k] = b.tgt_len[row] - 1;
            srcs[k] = TP_MALLOC((size_t)(slen[k] + 1) * sizeof(int32_t));
            refs[k] = TP_MALLOC((size_t)(rlen[k] + 1) * sizeof(int32_t));
            memcpy(srcs[k], b.src + (size_t)row * b.view.S, (size_t)slen[k] * sizeof(int32_t));
            memcpy(refs[k], b.tgt_out + (size_t)row * b.view.T, (size_t)rlen[k] * sizeof(int32_t));
        }
        owned_batch_free(&b);
    }
    free(index);
    r.loss = n_tok ? (float)(sum / n_tok) : 0.0f;
    if (whole) {
        Hypotheses h;
        const int batch = whole->be->kind == BACKEND_CUDA ? EVAL_DECODE_BATCH_GPU : EVAL_DECODE_BATCH_CPU;
        mt_translate_ids(whole, (const int32_t *const *)srcs, slen, k, a->beam, 1.0f, batch, &h);
        BleuStats bs;
        bleu_init(&bs);
        for (int i = 0; i < k; i++) {
            char *hyp = spm_decode(src->spm, h.hyp[i], h.len[i]);
            char *ref = spm_decode(src->spm, refs[i], rlen[i]);
            TP_CHECK(hyp && ref, "the tokenizer failed to decode a dev sentence");
            bleu_add(&bs, hyp, ref);
            free(hyp);
            free(ref);
        }
        r.bleu = (float)bleu_score(&bs, NULL, NULL);
        r.has_bleu = true;
        hypotheses_free(&h);
    }
    for (int i = 0; i < k; i++) {
        free(srcs[i]);
        free(refs[i]);
    }
    free(srcs);
    free(refs);
    free(slen);
    free(rlen);
    return r;
}
