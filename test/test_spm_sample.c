/* test_spm_sample.c CORPUS_DIR: subword sampling (spm_sample_ids,
 * data/resample.h, the dataset's per-epoch files) on the real corpus, with
 * a tokenizer of VOCAB pieces (byte fallback) prepared into a scratch cache:
 *   - every sample spells its sentence (decoded, it is the best's text);
 *   - the same seed gives the same ids, another seed others, and samples
 *     differ from the best (at ALPHA, for most sentences);
 *   - at alpha LARGE_ALPHA every sample is SentencePiece's own best: the
 *     lattice rebuilt here is SentencePiece's;
 *   - n-best sampling: spells its sentence, is deterministic, and varies;
 *   - an epoch: the same bytes on 1 and 3 workers, and from a fresh
 *     resampler asked for it straight away (another rank, a resume);
 *     epochs 0 and 1 differ; no side is longer than max_pieces;
 *   - batches: a dataset seeked to a position mid-epoch 1 gives the
 *     batches a straight walk gave there, and the epochs' batches differ.
 */
#define _GNU_SOURCE
#include <string.h>

#include "check.h"
#include "data/corpus.h"
#include "data/dataset.h"
#include "data/resample.h"
#include "data/spm.h"
#include "testfs.h"

#define VOCAB 2000
#define ALPHA 0.1f
#define LARGE_ALPHA 1000.0f  // exp(-1000 x any score gap) is 0: only the best path has weight
#define NBEST 8
#define N_SENT 2000          // sentences of each check on single ids
#define MAX_IDS 1024
#define MAX_PIECES 40        // short enough that some samples fall back to the best
#define MIN_DIFFER_SHARE 0.5 // of sentences whose two seeds' samples differ (measured: about 0.9 at ALPHA)

static char *decode(const Spm *spm, const int32_t *ids, int n) { return spm_decode(spm, ids, n); }

static bool same_ids(const int32_t *a, int na, const int32_t *b, int nb) {
    return na == nb && memcmp(a, b, (size_t)na * sizeof *a) == 0;
}

/* The single-sentence checks over the first N_SENT sides of tf. */
static void check_sentences(const Spm *spm, const TokenFile *tf) {
    int32_t s1[MAX_IDS], s2[MAX_IDS], s3[MAX_IDS];
    int n_differ_seed = 0, n_differ_best = 0, n_checked = 0, n_nbest_differ = 0, bad_text = 0, bad_large = 0;
    for (int i = 0; i < N_SENT; i++) {
        const int side = i % 2, p = i / 2;
        const uint64_t *off = side ? tf->ja_off : tf->en_off;
        const int32_t *best = tf->tokens + off[p];
        const int nb = (int)(off[p + 1] - off[p]);
        const int n1 = spm_sample_ids(spm, best, nb, -1, ALPHA, 11u + (uint64_t)i, s1, MAX_IDS);
        const int n2 = spm_sample_ids(spm, best, nb, -1, ALPHA, 11u + (uint64_t)i, s2, MAX_IDS);
        const int n3 = spm_sample_ids(spm, best, nb, -1, ALPHA, 99u + (uint64_t)i, s3, MAX_IDS);
        CHECK(n1 > 0 && n1 <= MAX_IDS && n3 > 0 && n3 <= MAX_IDS, "sentence %d: %d / %d ids", i, n1, n3);
        if (n1 <= 0 || n1 > MAX_IDS || n3 <= 0 || n3 > MAX_IDS) continue;
        n_checked++;
        CHECK(same_ids(s1, n1, s2, n2), "sentence %d: the same seed gave other ids", i);
        n_differ_seed += !same_ids(s1, n1, s3, n3);
        n_differ_best += !same_ids(s1, n1, best, nb);
        char *want = decode(spm, best, nb), *got = decode(spm, s1, n1);
        bad_text += !want || !got || strcmp(want, got) != 0;
        free(got);
        const int nl = spm_sample_ids(spm, best, nb, -1, LARGE_ALPHA, 5u + (uint64_t)i, s2, MAX_IDS);
        bad_large += !same_ids(s2, nl, best, nb);
        if (i < N_SENT / 10) {  // n-best: slower (SentencePiece's search), fewer sentences
            const int a = spm_sample_ids(spm, best, nb, NBEST, ALPHA, 7u + (uint64_t)i, s2, MAX_IDS);
            const int b = spm_sample_ids(spm, best, nb, NBEST, ALPHA, 7u + (uint64_t)i, s3, MAX_IDS);
            CHECK(a > 0 && same_ids(s2, a, s3, b), "sentence %d: n-best sampling is not deterministic", i);
            got = a > 0 ? decode(spm, s2, a) : NULL;
            CHECK(got && want && strcmp(got, want) == 0, "sentence %d: an n-best sample spells '%s', not '%s'", i,
                  got ? got : "(none)", want ? want : "(none)");
            n_nbest_differ += a > 0 && !same_ids(s2, a, best, nb);
            free(got);
        }
        free(want);
    }
    CHECK(n_checked == N_SENT, "%d of %d sentences sampled", n_checked, N_SENT);
    CHECK(bad_text == 0, "%d samples do not spell their sentence", bad_text);
    CHECK(bad_large == 0, "%d samples at alpha %g are not SentencePiece's best", bad_large, (double)LARGE_ALPHA);
    CHECK(n_differ_seed >= MIN_DIFFER_SHARE * N_SENT, "only %d of %d sentences differ between two seeds",
          n_differ_seed, N_SENT);
    CHECK(n_differ_best >= MIN_DIFFER_SHARE * N_SENT, "only %d of %d samples differ from the best", n_differ_best,
          N_SENT);
    CHECK(n_nbest_differ > 0, "no n-best sample differs from the best");
    printf("test_spm_sample: %d sentences: %d differ between seeds, %d from the best; %d n-best samples differ\n",
           N_SENT, n_differ_seed, n_differ_best, n_nbest_differ);
    CHECK(spm_sample_ids(spm, tf->tokens, 1, 1, ALPHA, 1, s1, MAX_IDS) < 0, "nbest 1 accepted");
}

static bool same_file(const TokenFile *a, const TokenFile *b) {
    return a->n_pairs == b->n_pairs && a->n_tokens == b->n_tokens &&
           !memcmp(a->en_off, b->en_off, (size_t)(a->n_pairs + 1) * 8) &&
           !memcmp(a->ja_off, b->ja_off, (size_t)(a->n_pairs + 1) * 8) &&
           !memcmp(a->tokens, b->tokens, (size_t)a->n_tokens * 4);
}

static void check_epochs(const Spm *spm, const TokenFile *tf) {
    Resampler one, three, fresh;
    char err[512];
    const TokenFile *tfs[1] = {tf};
    CHECK(resampler_init(&one, spm, tfs, 1, ALPHA, -1, 5, MAX_PIECES, 1, err, sizeof err) == 0, "%s", err);
    CHECK(resampler_init(&three, spm, tfs, 1, ALPHA, -1, 5, MAX_PIECES, 3, err, sizeof err) == 0, "%s", err);
    CHECK(resampler_init(&fresh, spm, tfs, 1, ALPHA, -1, 5, MAX_PIECES, 2, err, sizeof err) == 0, "%s", err);
    const TokenFile *e0 = resampler_epoch(&one, 0)[0];
    const TokenFile *t0 = resampler_epoch(&three, 0)[0];
    CHECK(same_file(e0, t0), "epoch 0 on 1 and 3 workers differs");
    long too_long = 0, kept_best = 0;
    for (int i = 0; i < tf->n_pairs; i++)
        for (int side = 0; side < 2; side++) {
            const uint64_t *o = side ? e0->ja_off : e0->en_off, *b = side ? tf->ja_off : tf->en_off;
            const uint64_t n = o[i + 1] - o[i], nb = b[i + 1] - b[i];
            too_long += n > MAX_PIECES && n != nb;
            kept_best += n == nb && !memcmp(e0->tokens + o[i], tf->tokens + b[i], n * 4);
        }
    CHECK(too_long == 0, "%ld sides longer than %d pieces", too_long, MAX_PIECES);
    CHECK(kept_best < tf->n_pairs, "%ld of %d sides kept their best segmentation", kept_best, 2 * tf->n_pairs);
    const TokenFile *e1 = resampler_epoch(&one, 1)[0];  // drawn in the background meanwhile
    const TokenFile *f1 = resampler_epoch(&fresh, 1)[0];
    CHECK(same_file(e1, f1), "epoch 1 asked straight away differs from epoch 1 after epoch 0");
    CHECK(e1->n_tokens != tf->n_tokens && !same_file(e1, resampler_epoch(&three, 0)[0]),
          "epochs 0 and 1 draw the same segmentations");
    resampler_free(&one);
    resampler_free(&three);
    resampler_free(&fresh);
}

#define BATCH_TOKENS 2048
#define SEEK_AT 7  // the position a resume starts from, in epoch 1

static bool same_batch(const OwnedBatch *a, const OwnedBatch *b) {
    const Batch *x = &a->view, *y = &b->view;
    return x->B == y->B && x->S == y->S && x->T == y->T &&
           !memcmp(a->src, b->src, (size_t)x->B * x->S * 4) && !memcmp(a->tgt_out, b->tgt_out, (size_t)x->B * x->T * 4);
}

static void check_batches(const Spm *spm, const TokenFile *tf) {
    Dataset straight, resumed;
    Resampler r1, r2;
    char err[512];
    const TokenFile *tfs[1] = {tf};
    CHECK(dataset_init(&straight, tf, DIR_EN_JA, 64, BATCH_TOKENS, 0, 1, 3, 0, 2, 3, err, sizeof err) == 0, "%s", err);
    CHECK(dataset_init(&resumed, tf, DIR_EN_JA, 64, BATCH_TOKENS, 0, 1, 3, 0, 2, 3, err, sizeof err) == 0, "%s", err);
    const int n_best_batches = straight.n_batches;
    CHECK(resampler_init(&r1, spm, tfs, 1, ALPHA, -1, 3, dataset_max_pieces(&straight), 2, err, sizeof err) == 0, "%s",
          err);
    CHECK(resampler_init(&r2, spm, tfs, 1, ALPHA, -1, 3, dataset_max_pieces(&straight), 1, err, sizeof err) == 0, "%s",
          err);
    dataset_set_epoch_files(&straight, resampler_epoch_files, &r1);
    CHECK(straight.n_batches != n_best_batches, "epoch 0 has the best segmentation's %d batches", n_best_batches);
    OwnedBatch first0, b;
    dataset_next(&straight, &first0, NULL);
    while (straight.cursor.epoch == 0) dataset_next(&straight, &b, NULL), owned_batch_free(&b);
    OwnedBatch want[3];
    for (int k = 0; k < SEEK_AT; k++) dataset_next(&straight, &b, NULL), owned_batch_free(&b);
    for (int k = 0; k < 3; k++) dataset_next(&straight, &want[k], NULL);
    dataset_set_epoch_files(&resumed, resampler_epoch_files, &r2);
    CHECK(dataset_seek(&resumed, (DataCursor){.seed = 3, .epoch = 1, .position = SEEK_AT}, err, sizeof err) == 0,
          "%s", err);
    for (int k = 0; k < 3; k++) {
        dataset_next(&resumed, &b, NULL);
        CHECK(same_batch(&b, &want[k]), "batch %d after the seek differs from the straight walk's", SEEK_AT + k);
        owned_batch_free(&b);
        owned_batch_free(&want[k]);
    }
    dataset_seek(&resumed, (DataCursor){.seed = 3, .epoch = 1, .position = 0}, err, sizeof err);
    dataset_next(&resumed, &b, NULL);
    CHECK(!same_batch(&b, &first0), "epoch 1's first batch is epoch 0's");
    owned_batch_free(&b);
    owned_batch_free(&first0);
    dataset_free(&straight);
    dataset_free(&resumed);
    resampler_free(&r1);
    resampler_free(&r2);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: test_spm_sample CORPUS_DIR\n");
        return 2;
    }
    char root[64], cache[128], path[256], err[1024];
    if (!make_scratch_dir(root, sizeof root, "test_spm_sample")) return 1;
    snprintf(cache, sizeof cache, "%s/cache", root);
    const char *splits[1] = {"train"};
    CorpusConfig cfg = {.data_dir = argv[1], .cache_dir = cache, .vocab_size = VOCAB};
    int rc = corpus_prepare(&cfg, splits, 1, NULL, err, sizeof err);
    CHECK(rc == 0, "corpus_prepare: %s", err);
    snprintf(path, sizeof path, "%s/spm.model", cache);
    Spm *spm = rc == 0 ? spm_load(path, err, sizeof err) : NULL;
    TokenFile tf;
    snprintf(path, sizeof path, "%s/train.tok", cache);
    if (spm && token_file_open(&tf, path, VOCAB, err, sizeof err) == 0) {
        check_sentences(spm, &tf);
        check_epochs(spm, &tf);
        check_batches(spm, &tf);
        token_file_close(&tf);
    } else {
        CHECK(false, "tokenizer or token file: %s", err);
    }
    spm_free(spm);
    remove_tree(root);
    return check_report("test_spm_sample");
}
