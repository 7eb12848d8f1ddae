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
#include <unistd.h>

#include "data/corpus_list.h"
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

/* The cache root: --cache-dir, else cache/<first corpus's folder name>[+<next's>...]. */
static int cache_root(const TrainArgs *a, const CorpusList *list, int rank, char *root, size_t root_len, char *err,
                      size_t err_len) {
    if (a->cache_dir) {
        if (snprintf(root, root_len, "%s", a->cache_dir) >= (int)root_len) goto too_long;
        return 0;
    }
    if (snprintf(root, root_len, "cache/") >= (int)root_len) goto too_long;
    for (int k = 0; k < list->n; k++) {
        const char *dir = list->dir[k];
        size_t len = strlen(dir);
        while (len > 1 && dir[len - 1] == '/') len--;
        const char *base = dir + len;
        while (base > dir && base[-1] != '/') base--;
        const size_t used = strlen(root);
        if (snprintf(root + used, root_len - used, "%s%.*s", k ? "+" : "", (int)(dir + len - base), base) >=
            (int)(root_len - used))
            goto too_long;
    }
    if (rank == 0) mkdir("cache", 0755);
    return 0;
too_long:
    tp_error_set(err, err_len, "--data / --cache-dir: the cache folder name is longer than %zu characters", root_len - 1);
    return -1;
}

/* Rank 0 prepares every corpus's splits into the cache folder; every rank
 * learns whether it worked. */
static int prepare_corpora(const TrainArgs *a, const CorpusList *list, const char *root, const char *cache,
                           const Runtime *rt, char (*stems)[32], char *err, size_t err_len) {
    int rc = 0;
    if (rt->mesh.rank == 0 && list->n == 1)
        rc = corpus_adopt_old_layout(root, a->spm_vocab, true, err, err_len) < 0 ? -1 : 0;
    if (rt->mesh.rank == 0 && rc == 0) {
        CorpusPart parts[DATASET_MAX_CORPORA + 1];
        int n = 0;
        parts[n++] = (CorpusPart){.data_dir = list->dir[0], .split = "train", .stem = stems[0], .tokenizer = true};
        parts[n++] = (CorpusPart){.data_dir = list->dir[0], .split = "dev", .stem = "dev"};
        for (int k = 1; k < list->n; k++)
            parts[n++] = (CorpusPart){.data_dir = list->dir[k], .split = "train", .stem = stems[k], .tokenizer = true};
        CorpusConfig cc = {.cache_dir = cache, .vocab_size = a->spm_vocab, .spm_sample = a->spm_sample,
                           .workers = a->prep_workers, .strict = a->strict, .verbose = true};
        rc = corpus_prepare_parts(&cc, parts, n, NULL, err, err_len);
    }
    int32_t ok = rc == 0;
    TP_CHECK(comm_broadcast(rt->ctrl, &ok, sizeof ok, 0) == 0, "%s", comm_error(rt->ctrl));
    if (!ok && rt->mesh.rank != 0) tp_error_set(err, err_len, "rank 0 could not prepare the corpus");
    return ok ? 0 : -1;
}

/* The text form of the training corpora, from the counts their records keep. */
static int text_form(const TrainArgs *a, const char *cache, char (*stems)[32], int n, TextNorm *out, char *err,
                     size_t err_len) {
    TextFormCount en = {0}, ja = {0};
    for (int k = 0; k < n; k++) {
        CorpusSplitInfo info;
        if (corpus_split_info(cache, stems[k], &info, err, err_len)) return -1;
        textnorm_count_add(&en, &info.form_en);
        textnorm_count_add(&ja, &info.form_ja);
    }
    const bool en_ja = a->dir == DIR_EN_JA;
    *out = textnorm_from_counts(en_ja ? &en : &ja, en_ja ? &ja : &en, en_ja ? TEXT_LANG_EN : TEXT_LANG_JA,
                                en_ja ? TEXT_LANG_JA : TEXT_LANG_EN);
    return 0;
}

int source_train_dataset(const Source *src, Dataset *ds, int dp_rank, int shares, int batch_tokens, char *why,
                         size_t why_len) {
    const TrainArgs *a = src->args;
    const ModelConfig *cfg = src->cfg;
    const TokenFile *tfs[DATASET_MAX_CORPORA];
    for (int k = 0; k < src->n_train; k++) tfs[k] = &src->train_tf[k];
    if (dataset_init_mix(ds, tfs, src->train_copies, src->n_train, a->dir, cfg->max_len, batch_tokens, dp_rank,
                         shares, a->seed, cfg->pad_id, cfg->bos_id, cfg->eos_id, why, why_len) ||
        dataset_set_length_bucket(ds, a->length_bucket, why, why_len))
        return -1;
    return 0;
}

/* --spm-alpha: the training pairs' segmentations drawn anew each epoch
 * (data/resample.h), on --prep-workers threads (0: this node's cores shared
 * by its ranks); the first epoch now, each next one while the one before trains. */
static int sampling_start(Source *src, const Runtime *rt, char *err, size_t err_len) {
    const TrainArgs *a = src->args;
    const TokenFile *tfs[DATASET_MAX_CORPORA];
    for (int k = 0; k < src->n_train; k++) tfs[k] = &src->train_tf[k];
    int workers = a->prep_workers;
    if (workers <= 0) {
        const long cores = sysconf(_SC_NPROCESSORS_ONLN);
        workers = (int)((cores > 0 ? cores : 1) / (rt->local_world > 0 ? rt->local_world : 1));
        if (workers < 1) workers = 1;
    }
    if (resampler_init(&src->resample, src->spm, tfs, src->n_train, (float)a->spm_alpha, a->spm_nbest, a->seed,
                       dataset_max_pieces(&src->train), workers, err, err_len))
        return -1;
    src->sampling = true;
    dataset_set_epoch_files(&src->train, resampler_epoch_files, &src->resample);
    if (rt->mesh.rank == 0) {
        const ResampleEpoch *e = &src->resample.slot[src->resample.cur];
        uint64_t best = 0, drawn = 0;
        for (int k = 0; k < src->n_train; k++) best += src->train_tf[k].n_tokens, drawn += e->tf[k].n_tokens;
        printf("train_mt: subword sampling (--spm-alpha %g, --spm-nbest %d): epoch %lld's segmentations drawn in "
               "%.2f s on %d thread%s (%.0f pieces/s), %.3fx the pieces of the best; each next epoch is drawn while "
               "the one before trains; dev keeps the best\n", a->spm_alpha, a->spm_nbest, (long long)e->epoch,
               e->seconds, workers, workers == 1 ? "" : "s", e->seconds > 0 ? (double)drawn / e->seconds : 0.0,
               best ? (double)drawn / (double)best : 1.0);
    }
    return 0;
}

int source_open(Source *src, const TrainArgs *a, ModelConfig *cfg, const Runtime *rt, Startup *boot, char *err,
                size_t err_len) {
    memset(src, 0, sizeof *src);
    src->args = a;
    src->cfg = cfg;
    src->mesh = &rt->mesh;
    if (a->synthetic) return 0;
    CorpusList list;
    if (corpus_list_parse(a->data_dir, &list, err, err_len)) return -1;
    char root[2048], cache[2200], path[2400], why[1024];
    char stems[DATASET_MAX_CORPORA][32];
    for (int k = 0; k < list.n; k++) {
        if (k == 0) snprintf(stems[k], sizeof stems[k], "train");
        else snprintf(stems[k], sizeof stems[k], "train.c%d", k);
        src->train_copies[k] = list.copies[k];
    }
    if (cache_root(a, &list, rt->mesh.rank, root, sizeof root, err, err_len)) return -1;
    /* one tokenizer per configuration: presets of other vocabulary sizes share the root */
    if (corpus_cache_dir(root, a->spm_vocab, a->spm_sample, cache, sizeof cache, err, err_len)) return -1;
    if (prepare_corpora(a, &list, root, cache, rt, stems, err, err_len)) return -1;
    startup_mark(boot, "corpus");  // the cache checked (or built) and agreed on
    snprintf(src->spm_path, sizeof src->spm_path, "%s/spm.model", cache);
    src->spm = spm_load(src->spm_path, err, err_len);
    if (!src->spm) return -1;
    startup_mark(boot, "tokenizer");
    cfg->vocab_size = spm_vocab_size(src->spm);
    /* the text's form, saved with the model for translate_mt (data/textnorm.h), from the counts
     * the preparation kept with the token files: no rank reads the text again */
    if (text_form(a, cache, stems, list.n, &cfg->text, err, err_len)) return -1;
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
    for (int k = 0; k < list.n; k++) {
        snprintf(path, sizeof path, "%s/%s.tok", cache, stems[k]);
        if (token_file_open_checked(&src->train_tf[k], path, cfg->vocab_size, err, err_len)) return -1;
        src->n_train = k + 1;
    }
    snprintf(path, sizeof path, "%s/dev.tok", cache);
    if (token_file_open_checked(&src->dev_tf, path, cfg->vocab_size, err, err_len)) return -1;
    /* dp x M shares per global batch: rank r's micro-batch i is share r + i dp */
    if (source_train_dataset(src, &src->train, rt->mesh.dp_rank, rt->mesh.dp * a->micro_batches, a->batch_tokens,
                             why, sizeof why)) {
        tp_error_set(err, err_len, "train split: %s", why);
        return -1;
    }
    if (a->spm_alpha > 0 && sampling_start(src, rt, err, err_len)) return -1;
    if (dataset_init(&src->dev, &src->dev_tf, a->dir, cfg->max_len, a->batch_tokens, 0, 1, a->seed, cfg->pad_id,
                     cfg->bos_id, cfg->eos_id, why, sizeof why) ||
        dataset_set_length_bucket(&src->dev, a->length_bucket, why, sizeof why)) {
        tp_error_set(err, err_len, "dev split: %s", why);
        return -1;
    }
    if (rt->mesh.rank == 0)
        printf("train_mt: train: %d pairs usable%s, %ld longer than --max-len %d skipped; dev: %d pairs; "
               "%d batches per epoch of <= %d tokens per data-parallel rank\n",
               src->train.n_usable, list.n > 1 ? " an epoch (every corpus's copies counted)" : "",
               src->train.n_too_long, cfg->max_len, src->dev.n_usable, src->train.n_batches, a->batch_tokens);
    startup_mark(boot, "batching");  // token files mapped, batches of both splits made
    return 0;
}

void source_close(Source *src) {
    if (src->args->synthetic) return;
    dataset_free(&src->train);
    dataset_free(&src->dev);
    if (src->sampling) resampler_free(&src->resample);
    for (int k = 0; k < src->n_train; k++) token_file_close(&src->train_tf[k]);
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
