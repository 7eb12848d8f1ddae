/* source.c: the data source of a run (see source.h). One rank prepares
 * the corpus cache and the others map what it wrote, so a job of many
 * ranks trains one tokenizer once; each rank then reads its own share of
 * every global batch.
 */
#include "app/source.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data/synthetic.h"
#include "data/textnorm.h"
#include "err.h"
#include "tp/comm.h"

int run_steps(const TrainArgs *a, int n_batches) {
    if (!a->epochs) return a->max_steps;
    const int64_t steps = (int64_t)a->epochs * (int64_t)n_batches;
    if (steps < 1 || steps > MAX_RUN_STEPS) {
        fprintf(stderr, "train_mt: --epochs %d is %lld steps at %d batches per epoch; a run takes 1 to %ld steps\n",
                a->epochs, (long long)steps, n_batches, MAX_RUN_STEPS);
        exit(2);
    }
    return (int)steps;
}

int source_open(Source *src, const TrainArgs *a, ModelConfig *cfg, const Runtime *rt, Startup *boot, char *err,
                size_t err_len) {
    memset(src, 0, sizeof *src);
    src->args = a;
    src->cfg = cfg;
    src->mesh = &rt->mesh;
    if (a->synthetic) return 0;
    char root[1024], cache[2048], path[4096], why[1024];
    if (strlen(a->data_dir) > 900 || (a->cache_dir && strlen(a->cache_dir) > 900)) {
        tp_error_set(err, err_len, "--data / --cache-dir paths longer than 900 characters are not supported");
        return -1;
    }
    if (a->cache_dir) {
        snprintf(root, sizeof root, "%s", a->cache_dir);
    } else {
        const char *base = strrchr(a->data_dir, '/');
        base = base && base[1] ? base + 1 : a->data_dir;
        snprintf(root, sizeof root, "cache/%s", base);
        if (rt->mesh.rank == 0) mkdir("cache", 0755);
    }
    /* one tokenizer per configuration: presets of other vocabulary sizes share the root */
    if (corpus_cache_dir(root, a->spm_vocab, a->spm_sample, cache, sizeof cache, err, err_len)) return -1;
    int rc = 0;
    if (rt->mesh.rank == 0) rc = corpus_adopt_old_layout(root, a->spm_vocab, true, err, err_len) < 0 ? -1 : 0;
    if (rt->mesh.rank == 0 && rc == 0) {
        CorpusConfig cc = {.data_dir = a->data_dir, .cache_dir = cache, .vocab_size = a->spm_vocab,
                           .spm_sample = a->spm_sample, .workers = a->prep_workers, .strict = a->strict,
                           .verbose = true};
        const char *splits[2] = {"train", "dev"};
        CorpusStats st[2];
        rc = corpus_prepare(&cc, splits, 2, st, err, err_len);
    }
    /* Every rank learns whether the preparation worked (the flag rides on a broadcast). */
    int32_t ok = rc == 0;
    TP_CHECK(comm_broadcast(rt->ctrl, &ok, sizeof ok, 0) == 0, "%s", comm_error(rt->ctrl));
    if (!ok) {
        if (rt->mesh.rank != 0) tp_error_set(err, err_len, "rank 0 could not prepare the corpus");
        return -1;
    }
    startup_mark(boot, "corpus");  // the cache checked (or built) and agreed on
    snprintf(src->spm_path, sizeof src->spm_path, "%s/spm.model", cache);
    src->spm = spm_load(src->spm_path, err, err_len);
    if (!src->spm) return -1;
    startup_mark(boot, "tokenizer");
    cfg->vocab_size = spm_vocab_size(src->spm);
    /* the text's form, saved with the model for translate_mt (data/textnorm.h), from the counts
     * the preparation kept with the token file: no rank reads the text again */
    const bool en_ja = a->dir == DIR_EN_JA;
    CorpusSplitInfo info;
    if (corpus_split_info(cache, "train", &info, err, err_len)) return -1;
    cfg->text = textnorm_from_counts(en_ja ? &info.form_en : &info.form_ja, en_ja ? &info.form_ja : &info.form_en,
                                     en_ja ? TEXT_LANG_EN : TEXT_LANG_JA, en_ja ? TEXT_LANG_JA : TEXT_LANG_EN);
    startup_mark(boot, "text_form");
    if (rt->mesh.rank == 0)
        printf("train_mt: the training text's form, saved with the model for translate_mt: source %s%s%s, target %s%s\n",
               text_lang_name(cfg->text.source), cfg->text.lowercase ? " lower-cased" : " cased",
               cfg->text.split_punct ? ", punctuation split" : "", text_lang_name(cfg->text.target),
               cfg->text.target_spaced ? " with words split by spaces" : " as plain text");
    cfg->pad_id = SPM_PAD_ID;
    cfg->unk_id = SPM_UNK_ID;
    cfg->bos_id = SPM_BOS_ID;
    cfg->eos_id = SPM_EOS_ID;
    /* rank 0's preparation has just checked every byte of these files */
    snprintf(path, sizeof path, "%s/train.tok", cache);
    if (token_file_open_checked(&src->train_tf, path, cfg->vocab_size, err, err_len)) return -1;
    snprintf(path, sizeof path, "%s/dev.tok", cache);
    if (token_file_open_checked(&src->dev_tf, path, cfg->vocab_size, err, err_len)) return -1;
    /* dp x M shares per global batch: rank r's micro-batch i is share r + i dp */
    if (dataset_init(&src->train, &src->train_tf, a->dir, cfg->max_len, a->batch_tokens, rt->mesh.dp_rank,
                     rt->mesh.dp * a->micro_batches, a->seed, cfg->pad_id, cfg->bos_id, cfg->eos_id, why, sizeof why) ||
        dataset_set_length_bucket(&src->train, a->length_bucket, why, sizeof why)) {
        tp_error_set(err, err_len, "train split: %s", why);
        return -1;
    }
    if (dataset_init(&src->dev, &src->dev_tf, a->dir, cfg->max_len, a->batch_tokens, 0, 1, a->seed, cfg->pad_id,
                     cfg->bos_id, cfg->eos_id, why, sizeof why) ||
        dataset_set_length_bucket(&src->dev, a->length_bucket, why, sizeof why)) {
        tp_error_set(err, err_len, "dev split: %s", why);
        return -1;
    }
    if (rt->mesh.rank == 0)
        printf("train_mt: train: %d pairs usable, %ld longer than --max-len %d skipped; dev: %d pairs; "
               "%d batches per epoch of <= %d tokens per data-parallel rank\n",
               src->train.n_usable, src->train.n_too_long, cfg->max_len, src->dev.n_usable, src->train.n_batches,
               a->batch_tokens);
    startup_mark(boot, "batching");  // token files mapped, batches of both splits made
    return 0;
}

void source_close(Source *src) {
    if (src->args->synthetic) return;
    dataset_free(&src->train);
    dataset_free(&src->dev);
    token_file_close(&src->train_tf);
    token_file_close(&src->dev_tf);
    spm_free(src->spm);
}

void source_next(Source *src, OwnedBatch *b, long *global_tokens) {
    const TrainArgs *a = src->args;
    const int M = a->micro_batches, dp = src->mesh->dp;
    if (a->synthetic) {
        OwnedBatch whole;
        synth_batch(&whole, a->task, config_tokens(src->cfg), a->batch_size, a->min_len, a->max_len, a->seed,
                    ++src->synth_index);
        *global_tokens = 0;
        for (int i = 0; i < whole.view.B; i++) *global_tokens += whole.tgt_len[i];
        for (int i = 0; i < M; i++) owned_batch_rows(&whole, src->mesh->dp_rank + i * dp, dp * M, &b[i]);
        owned_batch_free(&whole);
        return;
    }
    dataset_next_micro(&src->train, M, b, global_tokens);
}
