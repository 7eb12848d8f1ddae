/* train_mt.c: the trainer.
 *
 * Trains on a parallel corpus folder (--data; prepared and cached by
 * data/corpus.h, batched by data/dataset.h) or, with --task, on a synthetic
 * copy/reverse task that needs no corpus. Flags follow Megatron/fairseq
 * names. Output: a log line per --log-interval steps (and, on a terminal, a
 * progress line updated in place), the same figures as JSON Lines with
 * --metrics FILE, dev loss and dev BLEU every --eval-interval steps, and the
 * final model (+ tokenizer) under --save DIR for translate_mt.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>

#include <unistd.h>

#include "app/args.h"
#include "data/batch_dump.h"
#include "data/bleu.h"
#include "data/corpus.h"
#include "data/dataset.h"
#include "data/synthetic.h"
#include "clock.h"
#include "profile.h"
#include "err.h"
#include "fileio.h"
#include "mt.h"
#include "tp/comm_shm.h"
#include "tp/runtime.h"
#include "tp/threads.h"
#include "train/checkpoint.h"
#include "train/ckpt_average.h"
#include "train/device.h"
#include "train/step.h"
#include "transformer/export.h"
#include "train/pipeline.h"
#include "train/planner.h"
#include "train/preempt.h"
#include "transformer/model.h"
#include "transformer/optim.h"

/* Steps of the run: --max-steps (or the preset's), or --epochs passes over
 * n_batches global batches, counted in 64 bits and bounded so the step
 * counter never wraps. A run too long for it is refused (exit 2). */
static int run_steps(const TrainArgs *a, int n_batches) {
    if (!a->epochs) return a->max_steps;
    const int64_t steps = (int64_t)a->epochs * (int64_t)n_batches;
    if (steps < 1 || steps > MAX_RUN_STEPS) {
        fprintf(stderr, "train_mt: --epochs %d is %lld steps at %d batches per epoch; a run takes 1 to %ld steps\n",
                a->epochs, (long long)steps, n_batches, MAX_RUN_STEPS);
        exit(2);
    }
    return (int)steps;
}

/* Where batches come from: the corpus, or a synthetic task. */
typedef struct {
    const TrainArgs *args;
    const ModelConfig *cfg;
    const Mesh *mesh;
    /* corpus */
    Spm *spm;
    char spm_path[4096];
    TokenFile train_tf, dev_tf;
    Dataset train, dev;
    /* synthetic */
    uint64_t synth_index;
} Source;

/* Rank 0 prepares the corpus cache (tokenizer, token files); the others
 * wait for it and then map the same files. */
static int source_open(Source *src, const TrainArgs *a, ModelConfig *cfg, const Runtime *rt, char *err,
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
    if (corpus_cache_dir(root, a->spm_vocab, cache, sizeof cache, err, err_len)) return -1;
    int rc = 0;
    if (rt->mesh.rank == 0) rc = corpus_adopt_old_layout(root, a->spm_vocab, true, err, err_len) < 0 ? -1 : 0;
    if (rt->mesh.rank == 0 && rc == 0) {
        CorpusConfig cc = {.data_dir = a->data_dir, .cache_dir = cache, .vocab_size = a->spm_vocab,
                           .strict = a->strict, .verbose = true};
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
    snprintf(src->spm_path, sizeof src->spm_path, "%s/spm.model", cache);
    src->spm = spm_load(src->spm_path, err, err_len);
    if (!src->spm) return -1;
    cfg->vocab_size = spm_vocab_size(src->spm);
    /* the text's form, saved with the model for translate_mt (data/textnorm.h) */
    const bool en_ja = a->dir == DIR_EN_JA;
    char src_txt[1100], tgt_txt[1100];
    snprintf(src_txt, sizeof src_txt, "%s/train.%s", a->data_dir, en_ja ? "en" : "ja");
    snprintf(tgt_txt, sizeof tgt_txt, "%s/train.%s", a->data_dir, en_ja ? "ja" : "en");
    if (textnorm_detect(src_txt, tgt_txt, en_ja ? TEXT_LANG_EN : TEXT_LANG_JA, en_ja ? TEXT_LANG_JA : TEXT_LANG_EN,
                        &cfg->text, err, err_len))
        return -1;
    if (rt->mesh.rank == 0)
        printf("train_mt: the training text's form, saved with the model for translate_mt: source %s%s%s, target %s%s\n",
               text_lang_name(cfg->text.source), cfg->text.lowercase ? " lower-cased" : " cased",
               cfg->text.split_punct ? ", punctuation split" : "", text_lang_name(cfg->text.target),
               cfg->text.target_spaced ? " with words split by spaces" : " as plain text");
    cfg->pad_id = SPM_PAD_ID;
    cfg->unk_id = SPM_UNK_ID;
    cfg->bos_id = SPM_BOS_ID;
    cfg->eos_id = SPM_EOS_ID;
    snprintf(path, sizeof path, "%s/train.tok", cache);
    if (token_file_open(&src->train_tf, path, cfg->vocab_size, err, err_len)) return -1;
    snprintf(path, sizeof path, "%s/dev.tok", cache);
    if (token_file_open(&src->dev_tf, path, cfg->vocab_size, err, err_len)) return -1;
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
    return 0;
}

static void source_close(Source *src) {
    if (src->args->synthetic) return;
    dataset_free(&src->train);
    dataset_free(&src->dev);
    token_file_close(&src->train_tf);
    token_file_close(&src->dev_tf);
    spm_free(src->spm);
}

/* This rank's micro-batches b[0..M) of the next global batch (share
 * dp_rank + i dp of dp x M); *global_tokens = target tokens of the whole
 * global batch (the divisor of the mean loss). */
static void source_next(Source *src, OwnedBatch *b, long *global_tokens) {
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

/* --profile: the data groups' collectives counted as communication. */
static void prof_comm_begin(void *be) { backend_profile_region_begin(be, PROF_COMM); }
static void prof_comm_end(void *be) { backend_profile_region_end(be); }
static void profile_start(Backend *be, Runtime *rt) {
    backend_profile_enable(be);
    const CommTimer t = {.begin = prof_comm_begin, .end = prof_comm_end, .ctx = be};
    comm_set_timer(rt->tp, t);
    comm_set_timer(rt->dp, t);
    comm_set_timer(rt->pp, t);
}

typedef struct { float loss; float bleu; bool has_bleu; } EvalResult;

/* Token-weighted mean loss over batches, no dropout. */
static void add_loss(Model *m, const Batch *b, double *sum, long *n_tok) {
    int n = 0;
    float loss = model_forward(m, b, false, (DropoutKey){0}, &n);
    *sum += (double)loss * n;
    *n_tok += n;
}

/* Dev loss on the (sharded) model, and for a corpus dev BLEU of greedy/beam
 * translations by the whole model (`whole`, non-NULL on the rank that
 * decodes), both detokenized back to the corpus tokenization. Called by
 * every rank of one tp group. */
static EvalResult evaluate(Model *m, Model *whole, Source *src) {
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
        mt_translate_ids(whole, (const int32_t *const *)srcs, slen, k, a->beam, 1.0f, 64, &h);
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

static void fmt_duration(char *buf, size_t n, double s) {
    long t = s > 0 ? (long)(s + 0.5) : 0;
    if (t >= 3600) snprintf(buf, n, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
}

/* Memory of every rank by tag (kernels/backend.h), gathered over the host
 * control communicator: per rank the peak of each tag, the allocator's
 * total peak (what torch.cuda.max_memory_allocated reports), the library
 * overhead, the process's peak resident set and, on a GPU, the device's
 * used memory (cudaMemGetInfo, sampled here: the largest figure seen so
 * far; it counts every process on that GPU). */
enum { MEMF_TOTAL = MEM_N_TAGS, MEMF_RSS, MEMF_TP, MEMF_DP, MEMF_PP, MEMF_HAS_DEV, MEMF_DEV_USED, MEMF_N };

static double *memory_gather(const Runtime *rt, Backend *be) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double mine[MEMF_N];
    for (int t = 0; t < MEM_N_TAGS; t++) mine[t] = (double)be->mem.peak[t];
    mine[MEMF_TOTAL] = (double)be->mem.total_peak;
    mine[MEMF_RSS] = (double)ru.ru_maxrss * 1024.0;
    mine[MEMF_HAS_DEV] = backend_device_used(be, NULL);
    mine[MEMF_DEV_USED] = (double)be->mem.device_used_peak;
    mine[MEMF_TP] = rt->mesh.tp_rank;
    mine[MEMF_DP] = rt->mesh.dp_rank;
    mine[MEMF_PP] = rt->mesh.pp_rank;
    /* an allgather copies bits, so the counts travel as 64-bit integers (two floats' worth each) */
    uint64_t enc[MEMF_N];
    for (int i = 0; i < MEMF_N; i++) enc[i] = (uint64_t)mine[i];
    const int W = rt->mesh.world;
    uint64_t *all = TP_MALLOC((size_t)W * MEMF_N * sizeof(uint64_t));
    TP_CHECK(comm_allgather(rt->ctrl, (const float *)enc, (float *)all, (size_t)MEMF_N * 2) == 0, "%s",
             comm_error(rt->ctrl));
    double *out = TP_MALLOC((size_t)W * MEMF_N * sizeof(double));
    for (int i = 0; i < W * MEMF_N; i++) out[i] = (double)all[i];
    free(all);
    return out;
}

/* One JSON line of --metrics, written through at once: a failed write (a
 * full disk) ends the run naming the file instead of leaving it truncated. */
__attribute__((format(printf, 3, 4))) static void metrics_line(FILE *f, const char *path, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vfprintf(f, fmt, ap);
    va_end(ap);
    if (k < 0 || fflush(f) != 0 || ferror(f)) {
        fprintf(stderr, "train_mt: --metrics %s: writing the file failed (%s)\n", path, strerror(errno));
        exit(1);
    }
}

/* The metrics record of every rank's peak bytes per tag (from memory_gather). */
static void memory_record(FILE *out, const char *path, const Runtime *rt, const double *all, int step) {
    if (out) {
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        TP_CHECK(f, "out of memory formatting the metrics record");
        fprintf(f, "{\"step\": %d, \"memory\": [", step);
        for (int r = 0; r < rt->mesh.world; r++) {
            const double *x = all + (size_t)r * MEMF_N;
            fprintf(f, "%s{\"rank\": %d, \"tp\": %d, \"dp\": %d, \"pp\": %d", r ? ", " : "", r, (int)x[MEMF_TP],
                    (int)x[MEMF_DP], (int)x[MEMF_PP]);
            for (int t = 0; t < MEM_N_TAGS; t++) fprintf(f, ", \"%s\": %.0f", mem_tag_name((MemTag)t), x[t]);
            fprintf(f, ", \"allocator_peak\": %.0f, \"peak_rss\": %.0f", x[MEMF_TOTAL], x[MEMF_RSS]);
            if (x[MEMF_HAS_DEV]) fprintf(f, ", \"device_used\": %.0f", x[MEMF_DEV_USED]);  // absent on the CPU
            fprintf(f, "}");
        }
        fprintf(f, "]}\n");
        TP_CHECK(fclose(f) == 0, "out of memory formatting the metrics record");
        metrics_line(out, path, "%s", text);
        free(text);
    }
}

static void memory_table(const Runtime *rt, const Backend *be, const double *all, const char *when) {
    if (rt->mesh.rank == 0) {
        const double mib = 1.0 / (1024.0 * 1024.0);
        printf("peak memory per rank (MiB, %s; device %s):\n", when, be->device_name);
        printf("  rank (tp,dp,pp) |");
        for (int t = 0; t < MEM_N_TAGS; t++) printf(" %11s", mem_tag_name((MemTag)t));
        printf(" | allocator |  peak RSS | device used\n");
        for (int r = 0; r < rt->mesh.world; r++) {
            const double *x = all + (size_t)r * MEMF_N;
            printf("  %4d (%d,%d,%d)    |", r, (int)x[MEMF_TP], (int)x[MEMF_DP], (int)x[MEMF_PP]);
            for (int t = 0; t < MEM_N_TAGS; t++) printf(" %11.2f", x[t] * mib);
            printf(" | %9.2f | %9.1f |", x[MEMF_TOTAL] * mib, x[MEMF_RSS] * mib);
            if (x[MEMF_HAS_DEV]) printf(" %11.2f\n", x[MEMF_DEV_USED] * mib);
            else printf(" %11s\n", "-");
        }
        fflush(stdout);
    }
}

/* At a log point: the table and the per-tag metrics record when a peak of
 * some rank grew since they were last given (the first time, always), so
 * the log shows every new peak without repeating an unchanged table. *last
 * (world x MEMF_N, NULL at first) keeps what was given. Collective. */
static void memory_report_if_grown(const Runtime *rt, Backend *be, FILE *metrics, const char *path, int step,
                                   double **last, const char *when) {
    double *all = memory_gather(rt, be);
    const size_t n = (size_t)rt->mesh.world * MEMF_N;
    bool grown = *last == NULL;
    for (size_t i = 0; !grown && i < n; i++)  // the tags and the allocator total (not RSS: it creeps)
        grown = i % MEMF_N <= MEMF_TOTAL && all[i] > (*last)[i];
    if (grown) {
        memory_table(rt, be, all, when);
        memory_record(metrics, path, rt, all, step);
        free(*last);
        *last = all;
    } else {
        free(all);
    }
}

/* Every rank's allocator peak and peak RSS in the metrics record, in MiB:
 * keys "mem_peak_mib" and "mem_rss_mib", arrays indexed by rank, and on a
 * GPU "mem_device_used_mib" (null for a rank without a device; the key is
 * absent when no rank has one). Collective: every rank calls it; the text
 * (to free) only where want is true. */
static char *memory_metrics(const Runtime *rt, Backend *be, bool want) {
    double *all = memory_gather(rt, be);
    char *text = NULL;
    size_t len = 0;
    if (want) {
        FILE *f = open_memstream(&text, &len);
        TP_CHECK(f, "out of memory formatting the metrics record");
        const double mib = 1.0 / (1024.0 * 1024.0);
        for (int k = 0; k < 2; k++) {
            fprintf(f, "%s", k == 0 ? ", \"mem_peak_mib\": [" : ", \"mem_rss_mib\": [");
            for (int r = 0; r < rt->mesh.world; r++)
                fprintf(f, "%s%.2f", r ? ", " : "", all[(size_t)r * MEMF_N + (k == 0 ? MEMF_TOTAL : MEMF_RSS)] * mib);
            fprintf(f, "]");
        }
        bool any_dev = false;
        for (int r = 0; r < rt->mesh.world; r++) any_dev = any_dev || all[(size_t)r * MEMF_N + MEMF_HAS_DEV] != 0.0;
        if (any_dev) {
            fprintf(f, ", \"mem_device_used_mib\": [");
            for (int r = 0; r < rt->mesh.world; r++) {
                const double *x = all + (size_t)r * MEMF_N;
                if (x[MEMF_HAS_DEV]) fprintf(f, "%s%.2f", r ? ", " : "", x[MEMF_DEV_USED] * mib);
                else fprintf(f, "%snull", r ? ", " : "");
            }
            fprintf(f, "]");
        }
        TP_CHECK(fclose(f) == 0, "out of memory formatting the metrics record");
    }
    free(all);
    return text;
}

static void comm_ok(int rc, const Comm *c) { TP_CHECK(rc == 0, "%s", comm_error(c)); }

/* Loads the checkpoint --resume names into this layout and moves the data
 * source to where it stood; *first_step receives the next step to run. */
static int resume(const TrainArgs *a, const Runtime *rt, Model *m, AdamW *opt, Source *src, int total, int *first_step,
                  char *err, size_t err_len) {
    const bool is_auto = strcmp(a->resume, "auto") == 0;
    const char *where = is_auto ? a->save_dir : a->resume;
    char dir[4096];
    int found = ckpt_resolve(where, dir, sizeof dir, err, err_len);
    if (found < 0) return -1;
    if (found == 0) {
        if (!is_auto) {
            tp_error_set(err, err_len, "%s holds no complete checkpoint", where);
            return -1;
        }
        if (rt->mesh.rank == 0) printf("train_mt: no checkpoint in %s yet: starting from step 1\n", where);
        return 0;
    }
    double t0 = tp_now_s();
    ModelConfig cfg;
    TrainState st;
    int old_tp, old_dp;
    if (ckpt_read_manifest(dir, &cfg, &old_tp, &old_dp, NULL, NULL, &st, err, err_len)) return -1;
    if (st.seed != a->seed) {
        tp_error_set(err, err_len, "%s was saved with --seed %llu, this run has --seed %llu (the data order and the "
                     "dropout masks follow the seed)", dir, (unsigned long long)st.seed, a->seed);
        return -1;
    }
    if (st.corpus != !a->synthetic) {
        tp_error_set(err, err_len, "%s was saved from a %s run, this run trains on a %s", dir,
                     st.corpus ? "corpus" : "synthetic-task", a->synthetic ? "synthetic task" : "corpus");
        return -1;
    }
    /* Nothing of a run that ends before the checkpoint's step may be saved:
     * it would file step-N weights under a smaller step number. */
    if (st.step > total) {
        tp_error_set(err, err_len, "%s is at step %lld, past this run's last step %d (--max-steps / --epochs): raise "
                     "it to continue that run; nothing was trained or saved", dir, (long long)st.step, total);
        return -1;
    }
    if (st.corpus && ckpt_check_tokenizer(dir, src->spm_path, err, err_len)) return -1;
    if (ckpt_load(dir, m, opt, err, err_len)) return -1;
    if (st.step == total && rt->mesh.rank == 0)
        printf("train_mt: %s is already at step %d, this run's last step: nothing to train\n", dir, total);
    if (st.corpus) {
        char why[512];
        if (dataset_seek(&src->train, st.cursor, why, sizeof why)) {
            tp_error_set(err, err_len, "%s: data cursor: %s", dir, why);
            return -1;
        }
    } else {
        src->synth_index = st.synth_index;
    }
    *first_step = (int)st.step + 1;
    if (rt->mesh.rank == 0)
        printf("train_mt: resumed from %s: step %lld, saved as tp %d x dp %d x pp %d, loaded as tp %d x dp %d x pp %d "
               "in %.2f s\n", dir, (long long)st.step, old_tp, old_dp, st.pp, rt->mesh.tp, rt->mesh.dp, rt->mesh.pp,
               tp_now_s() - t0);
    return 0;
}

/* Writes checkpoint `step` (collective); a failed save ends the run. */
static void save(const TrainArgs *a, const Runtime *rt, const Model *m, const AdamW *opt, Source *src,
                 const char *pp_layout, int step) {
    TrainState st = {.step = step, .seed = a->seed, .corpus = !a->synthetic, .synth_index = src->synth_index};
    snprintf(st.pp_layout, sizeof st.pp_layout, "%s", pp_layout);
    if (!a->synthetic) st.cursor = dataset_cursor(&src->train);
    char err[1024];
    double t0 = tp_now_s();
    if (ckpt_save(a->save_dir, rt, m, opt, &st, a->synthetic ? NULL : src->spm_path, a->keep_last, err, sizeof err)) {
        fprintf(stderr, "train_mt: saving step %d: %s\n", step, err);
        exit(1);
    }
    if (rt->mesh.rank == 0) printf("train_mt: checkpoint step %d saved to %s in %.2f s\n", step, a->save_dir, tp_now_s() - t0);
}

/* ---- --keep-best, --patience, --average-last ------------------------------ */

/* Rank 0's record of the kept figure: the best so far, its step, and the
 * evaluations since (what --patience counts). */
typedef struct {
    bool have;
    double value;
    int step, bad_evals;
} Best;

static const char *keep_name(int keep) { return keep == KEEP_BLEU ? "bleu" : "loss"; }
static const char *keep_label(int keep) { return keep == KEEP_BLEU ? "dev BLEU" : "dev loss"; }

/* On resume: the --save folder's record, so a resumed run never replaces a
 * better best; the evaluations since it count toward --patience. */
static void best_restore(const TrainArgs *a, int first_step, bool lead, Best *b) {
    if (!a->keep_best || first_step <= 1) return;
    int64_t step;
    char metric[16], err[1024];
    double v;
    const int r = ckpt_best_read(a->save_dir, &step, metric, sizeof metric, &v, err, sizeof err);
    if (r < 0) {
        fprintf(stderr, "train_mt: --keep-best: %s\n", err);
        exit(1);
    }
    if (r == 0) return;
    if (strcmp(metric, keep_name(a->keep_best)) != 0) {
        if (lead)
            printf("train_mt: %s/best keeps the best %s; this run keeps the best %s: its record starts afresh\n",
                   a->save_dir, metric, keep_name(a->keep_best));
        return;
    }
    const int since = (first_step - 1) / a->eval_interval - (int)(step / a->eval_interval);
    *b = (Best){.have = true, .value = v, .step = (int)step, .bad_evals = since > 0 ? since : 0};
    if (lead)
        printf("train_mt: best so far: %s %.4f at step %d (%d evaluation%s since)\n", keep_label(a->keep_best), v,
               b->step, b->bad_evals, b->bad_evals == 1 ? "" : "s");
}

/* Rank 0, after an evaluation: updates the record; returns 1 when v is the
 * best so far, 2 when --patience has run out (0: neither). */
static int best_update(const TrainArgs *a, Best *b, double v, int step) {
    if (!b->have || (a->keep_best == KEEP_BLEU ? v > b->value : v < b->value)) {
        *b = (Best){.have = true, .value = v, .step = step, .bad_evals = 0};
        return 1;
    }
    b->bad_evals++;
    return a->patience && b->bad_evals >= a->patience ? 2 : 0;
}

/* Rank 0: points DIR/best at the step just saved; a failure ends the run. */
static void best_publish(const TrainArgs *a, const Best *b, FILE *metrics) {
    char err[1024];
    if (ckpt_best_write(a->save_dir, b->step, keep_name(a->keep_best), b->value, err, sizeof err)) {
        fprintf(stderr, "train_mt: --keep-best: %s\n", err);
        exit(1);
    }
    printf("train_mt: best %s so far, %.4f at step %d: kept as %s/best\n", keep_label(a->keep_best), b->value,
           b->step, a->save_dir);
    if (metrics)
        metrics_line(metrics, a->metrics_path, "{\"step\": %d, \"best\": \"%s\", \"best_value\": %.9g}\n", b->step,
                     keep_name(a->keep_best), b->value);
}

/* Rank 0: the line and the metrics record of a run ended by --patience. */
static void early_stop_report(const TrainArgs *a, const Best *b, int step, int total, FILE *metrics) {
    printf("train_mt: early stop at step %d of %d: %s has not improved for %d evaluations (--patience %d); best "
           "%.4f at step %d, kept as %s/best\n", step, total, keep_label(a->keep_best), b->bad_evals, a->patience,
           b->value, b->step, a->save_dir);
    if (metrics)
        metrics_line(metrics, a->metrics_path, "{\"step\": %d, \"early_stop\": true, \"reason\": \"patience\", "
                     "\"patience\": %d, \"metric\": \"%s\", \"best_step\": %d, \"best_value\": %.9g}\n", step,
                     a->patience, keep_name(a->keep_best), b->step, b->value);
}

/* Rank 0, at the end: DIR/averaged, the mean of the newest --average-last
 * checkpoints, and its dev figures beside the best single evaluation's
 * (top: the best dev BLEU, or the lowest dev loss for a --task run). 0 or 1. */
static int average_report(const TrainArgs *a, Backend *be, Source *src, double top, int top_step, FILE *metrics) {
    int64_t *steps;
    const int have = ckpt_list_complete(a->save_dir, &steps);
    const int n = have < a->average_last ? have : a->average_last;
    char (*dirs)[4096] = TP_CALLOC((size_t)(n > 0 ? n : 1), sizeof *dirs), out[4096], err[1024];
    const char **in = TP_CALLOC((size_t)(n > 0 ? n : 1), sizeof *in);
    for (int i = 0; i < n; i++) {  // oldest first: the order of the sum
        pathf(dirs[i], sizeof dirs[i], "%s/step_%08lld", a->save_dir, (long long)steps[n - 1 - i]);
        in[i] = dirs[i];
    }
    pathf(out, sizeof out, "%s/averaged", a->save_dir);
    int rc = 0;
    if (n < a->average_last)
        printf("train_mt: --average-last %d: %s holds %d checkpoint%s; averaging those\n", a->average_last,
               a->save_dir, n, n == 1 ? "" : "s");
    if (n < 1 || ckpt_average(in, n, out, true, err, sizeof err)) {
        fprintf(stderr, "train_mt: --average-last: %s\n", n < 1 ? "no checkpoint to average" : err);
        rc = 1;
    }
    Model avg;
    if (rc == 0 && (model_create_ex(&avg, be, &src->args->cfg, NULL, a->seed, MODEL_NO_GRAD_BUFFER, err, sizeof err) ||
                    ckpt_load(out, &avg, NULL, err, sizeof err))) {
        fprintf(stderr, "train_mt: --average-last: %s\n", err);
        rc = 1;
    } else if (rc == 0) {
        const EvalResult ev = evaluate(&avg, a->synthetic ? NULL : &avg, src);
        const double fig = ev.has_bleu ? ev.bleu : ev.loss;
        const char *what = ev.has_bleu ? "dev BLEU" : "held-out loss";
        printf("train_mt: averaged the newest %d checkpoints (steps %lld to %lld) into %s: %s %.4f; best single "
               "checkpoint: %s %.4f at step %d\n", n, (long long)steps[n - 1], (long long)steps[0], out, what, fig,
               what, top, top_step);
        char bleu[64] = "";
        if (ev.has_bleu) snprintf(bleu, sizeof bleu, ", \"dev_bleu\": %.4f", ev.bleu);
        if (metrics)
            metrics_line(metrics, a->metrics_path, "{\"averaged\": %d, \"first_step\": %lld, \"last_step\": %lld, "
                         "\"dev_loss\": %.9g%s, \"best_single_%s\": %.9g, \"best_single_step\": %d}\n", n,
                         (long long)steps[n - 1], (long long)steps[0], ev.loss, bleu,
                         ev.has_bleu ? "dev_bleu" : "dev_loss", top, top_step);
        model_free(&avg);
    }
    free(steps);
    free(dirs);
    free(in);
    return rc;
}

/* After the step every rank agreed to stop at (a signal reached some rank):
 * the checkpoint of that step, where it is and how to go on; without
 * --save, a clear word that nothing is saved. Collective. */
static void stop_on_signal(const TrainArgs *a, const Runtime *rt, const Model *m, const AdamW *opt, Source *src,
                           const char *pp_layout, int step, int saved_step, int sig, int total) {
    const bool lead = rt->mesh.rank == 0;
    if (!a->save_dir) {
        if (lead)
            fprintf(stderr, "train_mt: %s received: stopping after step %d of %d; no --save DIR was given, so "
                    "nothing is saved (exit status %d)\n", preempt_signal_name(sig), step, total, 128 + sig);
        return;
    }
    if (lead) {
        printf("train_mt: %s received: stopping after step %d of %d and saving it\n", preempt_signal_name(sig), step,
               total);
        fflush(stdout);
    }
    if (saved_step != step) save(a, rt, m, opt, src, pp_layout, step);
    if (lead) {
        printf("train_mt: saved on %s: %s/step_%08d; continue with --resume auto --save %s (exit status %d)\n",
               preempt_signal_name(sig), a->save_dir, step, a->save_dir, TP_EXIT_SAVED_ON_SIGNAL);
        fflush(stdout);
    }
}

/* ---- --plan and --layout auto: memory per rank and step time before launch */

enum { PLAN_MAX_STEPS = 5000, PLAN_TOP = 10 };  // steps whose batch shapes are read (the largest recur every epoch)

static int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

/* The shapes a layout's run would see: every dp rank's micro-batches of the
 * first steps, the evaluation batches and the decode batch. */
typedef struct {
    PlanShape *train, *eval;
    int n_steps, n_eval;
    int decode_n, decode_S;
} PlanShapes;

static void plan_shapes_free(PlanShapes *ps) {
    free(ps->train);
    free(ps->eval);
    memset(ps, 0, sizeof *ps);
}

/* For dp ranks of M micro-batches of <= btok tokens (the copy task: the
 * --batch-size sentences of a step split into dp x M). 0, or -1 with err. */
static int plan_shapes(const TrainArgs *a, Source *src, int dp, int M, int btok, PlanShapes *ps, char *err,
                       size_t err_len) {
    memset(ps, 0, sizeof *ps);
    if (a->synthetic) {
        if (a->batch_size < dp * M) {
            tp_error_set(err, err_len, "the copy task's %d sentences per step do not split into dp %d x %d micro-batches",
                         a->batch_size, dp, M);
            return -1;
        }
        const int total = run_steps(a, 0), n_steps = total < PLAN_MAX_STEPS ? total : PLAN_MAX_STEPS;
        ps->n_steps = n_steps;
        ps->train = TP_MALLOC((size_t)n_steps * dp * M * sizeof *ps->train);
        for (int g = 0; g < n_steps; g++) {
            OwnedBatch whole;
            synth_batch(&whole, a->task, config_tokens(src->cfg), a->batch_size, a->min_len, a->max_len, a->seed,
                        (uint64_t)g + 1);
            for (int r = 0; r < dp; r++)
                for (int i = 0; i < M; i++) {
                    OwnedBatch part;
                    owned_batch_rows(&whole, r + i * dp, dp * M, &part);
                    ps->train[((size_t)g * dp + r) * M + i] = (PlanShape){part.view.B, part.view.S, part.view.T};
                    owned_batch_free(&part);
                }
            owned_batch_free(&whole);
        }
        ps->n_eval = 4;
        ps->eval = TP_MALLOC(4 * sizeof *ps->eval);
        for (int i = 0; i < 4; i++) {
            OwnedBatch e;
            synth_batch(&e, a->task, config_tokens(src->cfg), a->batch_size, a->min_len, a->max_len,
                        a->seed ^ 0xE7A1ULL, (uint64_t)i);
            ps->eval[i] = (PlanShape){e.view.B, e.view.S, e.view.T};
            owned_batch_free(&e);
        }
        return 0;
    }
    const ModelConfig *cfg = src->cfg;
    char why[512];
    OwnedBatch *b = TP_MALLOC((size_t)M * sizeof *b);
    for (int r = 0; r < dp; r++) {
        Dataset ds;
        if (dataset_init(&ds, &src->train_tf, a->dir, cfg->max_len, btok, r, dp * M, a->seed, cfg->pad_id,
                         cfg->bos_id, cfg->eos_id, why, sizeof why) ||
            dataset_set_length_bucket(&ds, a->length_bucket, why, sizeof why)) {
            tp_error_set(err, err_len, "train split: %s", why);
            free(b);
            plan_shapes_free(ps);
            return -1;
        }
        if (r == 0) {
            const int total = run_steps(a, ds.n_batches);
            ps->n_steps = total < PLAN_MAX_STEPS ? total : PLAN_MAX_STEPS;
            ps->train = TP_MALLOC((size_t)ps->n_steps * dp * M * sizeof *ps->train);
        }
        for (int g = 0; g < ps->n_steps; g++) {
            dataset_next_micro(&ds, M, b, NULL);
            for (int i = 0; i < M; i++) {
                ps->train[((size_t)g * dp + r) * M + i] = (PlanShape){b[i].view.B, b[i].view.S, b[i].view.T};
                owned_batch_free(&b[i]);
            }
        }
        dataset_free(&ds);
    }
    free(b);
    Dataset dev;  // evaluation batches are cut with the same token budget
    if (dataset_init(&dev, &src->dev_tf, a->dir, cfg->max_len, btok, 0, 1, a->seed, cfg->pad_id, cfg->bos_id,
                     cfg->eos_id, why, sizeof why) ||
        dataset_set_length_bucket(&dev, a->length_bucket, why, sizeof why)) {
        tp_error_set(err, err_len, "dev split: %s", why);
        plan_shapes_free(ps);
        return -1;
    }
    ps->n_eval = dataset_eval_batches(&dev);
    ps->eval = TP_MALLOC((size_t)(ps->n_eval ? ps->n_eval : 1) * sizeof *ps->eval);
    int32_t *index = TP_MALLOC((size_t)(dev.n_usable ? dev.n_usable : 1) * sizeof(int32_t));
    int longest = 0;
    for (int i = 0; i < ps->n_eval; i++) {
        OwnedBatch e;
        dataset_eval_batch(&dev, i, &e, index);
        ps->eval[i] = (PlanShape){e.view.B, e.view.S, e.view.T};
        for (int row = 0; row < e.view.B; row++) longest = e.src_len[row] - 1 > longest ? e.src_len[row] - 1 : longest;
        owned_batch_free(&e);
    }
    free(index);
    /* evaluate() decodes every dev sentence, 64 at a time, longest first */
    ps->decode_n = dev.n_usable < 64 ? dev.n_usable : 64;
    ps->decode_S = (longest < cfg->max_len - 1 ? longest : cfg->max_len - 1) + 1;
    dataset_free(&dev);
    return 0;
}

/* One layout of the world's ranks, and its plan. */
typedef struct {
    int tp, dp, pp, micro, zero, batch_tokens;
    bool sp;
    ModelRecompute rc;
    const ModelStage *stages;  // [pp]
    int set;                   // its batch shapes: shape_sets[set]
    char why[256];             // why it was dropped; "" while it stands
    double peak, step, compute, comm, bubble;  // the largest rank's peak (library included) and the slowest step
    int worst;                 // the rank with that peak
} Layout;

typedef struct {
    int pp;
    ModelStage *st;
    char err[256];  // "": made
} StageSet;

typedef struct {
    int dp, micro, batch_tokens;
    PlanShapes ps;
    char err[256];  // "": read
} ShapeSet;

static void layout_text(const Layout *l, const TrainArgs *a, char *buf, size_t len) {
    char stages[400] = "", micro[64];
    if (l->pp > 1 && l->stages) {
        char st[380];
        model_stages_format(l->stages, l->pp, st, sizeof st);
        snprintf(stages, sizeof stages, ", stages %s", st);
    }
    if (a->synthetic) snprintf(micro, sizeof micro, "%d micro-batch%s", l->micro, l->micro > 1 ? "es" : "");
    else snprintf(micro, sizeof micro, "%d micro-batch%s of <= %d tokens", l->micro, l->micro > 1 ? "es" : "",
                  l->batch_tokens);
    snprintf(buf, len, "tp %d x dp %d x pp %d, %s, ZeRO %d, recompute %s%s%s", l->tp, l->dp, l->pp, micro, l->zero,
             model_recompute_name(l->rc), l->sp ? ", sequence parallel" : "", stages);
}

/* The train_mt flags that run the layout. */
static void layout_flags(const Layout *l, const TrainArgs *a, char *buf, size_t len) {
    char btok[48] = "";
    if (!a->synthetic) snprintf(btok, sizeof btok, " --batch-tokens %d", l->batch_tokens);
    snprintf(buf, len, "--tp %d --dp %d --pp %d --micro-batches %d --zero %d --recompute %s%s%s", l->tp, l->dp, l->pp,
             l->micro, l->zero, model_recompute_name(l->rc), l->sp ? " --sequence-parallel" : "", btok);
}

/* Ranks that compute at once without slowing each other: the GPUs, or
 * the cores over each rank's threads. */
static int plan_slots(bool gpu, int threads) {
    int n_gpus = 0;
    if (gpu) backend_cuda_available(&n_gpus);
    const int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    return gpu ? n_gpus : (cores / threads > 1 ? cores / threads : 1);
}

static PlanInput plan_input(const TrainArgs *a, const Layout *l, bool gpu, int threads, const PlanShapes *ps) {
    GradSyncConfig grad = a->grad;
    grad.zero = l->zero;
    PlanInput in = {.cfg = a->cfg, .tp = l->tp, .dp = l->dp, .pp = l->pp, .micro = l->micro, .stages = l->stages,
                    .recompute = l->rc, .seq_par = l->sp && l->tp > 1, .grad = grad, .gpu = gpu, .dtype = a->dtype,
                    .slots = plan_slots(gpu, threads), .train = ps->train, .n_steps = ps->n_steps, .eval = ps->eval,
                    .n_eval = ps->n_eval, .beam = a->beam};
    /* ranks sharing a GPU stage their groups' buffers through host memory
     * (the run's runtime_choose_comm, for one node of W ranks) */
    const int W = l->tp * l->dp * l->pp;
    RuntimeComm comm = RUNTIME_COMM_SHM;
    char why[256];
    in.staged = gpu && W > 1 &&
                (runtime_choose_comm(a->comm, runtime_have_nccl(), true, W, W, in.slots, &comm, why, sizeof why) != 0 ||
                 comm == RUNTIME_COMM_SHM);
    in.nccl = gpu && W > 1 && !in.staged;  // a GPU per rank: NCCL communicators
    in.gather_at_eval = !a->synthetic;  // the decoding rank, or a corpus with tp > 1 (a tp 1 group gathers on rank 0 only)
    in.decode = !a->synthetic;
    in.decode_n = ps->decode_n;
    in.decode_S = ps->decode_S;
    return in;
}

/* Threads per rank: what OpenBLAS is told (OMP_NUM_THREADS; tprun sets it
 * to cores / ranks), else every core. */
static int env_threads(void) {
    const int t = env_int("OMP_NUM_THREADS", 0);
    return t > 0 ? t : (int)sysconf(_SC_NPROCESSORS_ONLN);
}

static void calib_key(const Backend *be, int threads, char *key, size_t len) {
    char host[128] = "host";
    gethostname(host, sizeof host - 1);
    char cpu[128] = "cpu";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f))
            if (strncmp(line, "model name", 10) == 0) {
                const char *v = strchr(line, ':');
                if (v) snprintf(cpu, sizeof cpu, "%s", v + 2);
                cpu[strcspn(cpu, "\n")] = 0;
                break;
            }
        fclose(f);
    }
    snprintf(key, len, "%s | %s | %s %s | %ld cores | %d threads per rank", host, cpu, be->device_name,
             dtype_name(be->dtype), sysconf(_SC_NPROCESSORS_ONLN), be->host_visible ? threads : 1);
}

/* The rates were measured with c->ranks ranks computing at once; in the
 * run `world` ranks share the machine. A rank's share: on CPU 1 / ranks
 * (tprun gives each rank cores / ranks threads, so the ranks fill the
 * cores), on GPUs a whole device while there are as many as ranks. */
static double rank_share(bool gpu, int slots, int n) {
    n = n > 0 ? n : 1;
    return gpu ? (slots >= n ? 1.0 : (double)(slots > 0 ? slots : 1) / n) : 1.0 / n;
}

/* What a rank may use when --memory-limit is not given: on a GPU its
 * device's memory, shared by the ranks on it (ranks go to the visible GPUs
 * by LOCAL_RANK modulo their count, so ceil(W / GPUs) share the fullest);
 * on a CPU the machine's RAM over its ranks. */
static double default_memory_limit(const Backend *be, int W) {
    if (!be->host_visible && be->device_total_bytes > 0) {
        int n_gpus = 0;
        if (!backend_cuda_available(&n_gpus) || n_gpus < 1) n_gpus = 1;
        return (double)be->device_total_bytes / ((W + n_gpus - 1) / n_gpus);
    }
    return (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE) / W;
}

static PlanCalib calib_for_run(const PlanCalib *c, int world, bool gpu, int slots) {
    PlanCalib k = *c;
    const double s = rank_share(gpu, slots, world) / rank_share(gpu, slots, c->ranks);
    for (int i = 0; i < k.n_gemm; i++) k.gemm[i].flops_per_s *= s;
    k.mem_bw *= s;
    k.attn_flops_per_s *= s;
    for (int i = 0; i < k.n_elem; i++) k.elem[i].per_float /= s, k.elem[i].fixed_per_layer /= s;
    return k;
}

/* Every rank's plan of layout l: the largest peak and the slowest step into
 * l; the per-rank table printed when print, and written to json. */
static void plan_layout(const TrainArgs *a, const PlanInput *in, const PlanCalib *c, Layout *l, bool print,
                        const char *text, double limit, FILE *json) {
    const int W = in->tp * in->dp * in->pp;
    const double mib = 1.0 / (1024.0 * 1024.0);
    if (print) {
        printf("predicted peak memory per rank (MiB; limit %.0f MiB per rank) and step time (s), %s:\n", limit * mib,
               text);
        printf("  rank (tp,dp,pp) |");
        for (int t = 0; t < MEM_N_TAGS; t++) printf(" %11s", mem_tag_name((MemTag)t));
        printf(" | allocator |  step  compute    comm  bubble\n");
    }
    l->peak = l->step = 0.0, l->worst = 0;
    if (json) {
        char flags[256];
        layout_flags(l, a, flags, sizeof flags);
        fprintf(json, "{\"plan\": \"%s\", \"flags\": \"%s\", \"limit\": %.0f, \"ranks\": [", text, flags, limit);
    }
    PlanRank *ranks = TP_MALLOC((size_t)W * sizeof *ranks);
    for (int r = 0; r < W; r++) planner_memory(in, r, &ranks[r]);
    planner_time(in, c, ranks);
    for (int r = 0; r < W; r++) {
        PlanRank pr = ranks[r];
        pr.tag[MEM_LIBRARY] += c->library_bytes;  // NCCL's buffers (planned) and the measured context
        if (print) {
            printf("  %4d (%d,%d,%d)    |", r, pr.tp, pr.dp, pr.pp);  // the run's memory table, predicted
            for (int t = 0; t < MEM_N_TAGS; t++) printf(" %11.2f", pr.tag[t] * mib);
            printf(" | %9.2f | %6.3f %7.3f %7.3f %7.3f\n", pr.allocator_peak * mib, pr.t_step, pr.t_compute, pr.t_comm,
                   pr.t_bubble);
        }
        if (json) {
            fprintf(json, "%s{\"rank\": %d, \"tp\": %d, \"dp\": %d, \"pp\": %d", r ? ", " : "", r, pr.tp, pr.dp, pr.pp);
            for (int t = 0; t < MEM_N_TAGS; t++) fprintf(json, ", \"%s\": %.0f", mem_tag_name((MemTag)t), pr.tag[t]);
            fprintf(json, ", \"allocator_peak\": %.0f, \"step_s\": %.6f, \"compute_s\": %.6f, \"comm_s\": %.6f, "
                    "\"bubble_s\": %.6f}", pr.allocator_peak, pr.t_step, pr.t_compute, pr.t_comm, pr.t_bubble);
        }
        if (pr.allocator_peak + pr.tag[MEM_LIBRARY] > l->peak) l->peak = pr.allocator_peak + pr.tag[MEM_LIBRARY], l->worst = r;
        if (pr.t_step >= l->step) l->step = pr.t_step, l->compute = pr.t_compute, l->comm = pr.t_comm, l->bubble = pr.t_bubble;
    }
    free(ranks);
    if (json) fprintf(json, "]");
    if (print) fflush(stdout);
}

static int by_step(const void *x, const void *y) {
    const Layout *a = *(Layout *const *)x, *b = *(Layout *const *)y;
    if (!!a->why[0] != !!b->why[0]) return a->why[0] ? 1 : -1;  // the layouts that stand first
    if (a->why[0]) return (a->peak > b->peak) - (a->peak < b->peak);
    if (a->step != b->step) return (a->step > b->step) - (a->step < b->step);
    return (a->peak > b->peak) - (a->peak < b->peak);  // as fast: the leaner
}

/* The layouts --layout auto weighs for W ranks: every tp that divides the
 * heads and the ffn, pp up to the layers, dp the rest; micro-batches 1 to
 * 8 (the global batch kept: --batch-tokens x W tokens, or --batch-size
 * sentences on the copy task), ZeRO 0-2 where dp > 1, sequence
 * parallelism where tp > 1, and each recomputation. */
static int layouts_enumerate(const TrainArgs *a, int W, Layout **out) {
    int n = 0, cap = 64;
    Layout *ls = TP_MALLOC((size_t)cap * sizeof *ls);
    const ModelRecompute rcs[3] = {MODEL_RECOMPUTE_NONE, MODEL_RECOMPUTE_SELECTIVE, MODEL_RECOMPUTE_FULL};
    for (int pp = 1; pp <= W; pp++) {
        if (W % pp) continue;
        for (int tp = 1; tp <= W / pp; tp++) {
            if ((W / pp) % tp) continue;
            const int dp = W / pp / tp;
            for (int M = 1; M <= 8; M *= 2)
                for (int zero = 0; zero <= (dp > 1 ? 2 : 0); zero++)
                    for (int sp = 0; sp <= (tp > 1); sp++)
                        for (int r = 0; r < 3; r++) {
                            if (n == cap) ls = realloc(ls, (size_t)(cap *= 2) * sizeof *ls);
                            TP_CHECK(ls, "out of memory");
                            ls[n++] = (Layout){.tp = tp, .dp = dp, .pp = pp, .micro = M, .zero = zero, .sp = sp,
                                               .rc = rcs[r], .batch_tokens = a->batch_tokens * W / (dp * M), .set = -1};
                        }
        }
    }
    *out = ls;
    return n;
}

/* The choice among the layouts that stand (order: fastest predicted
 * first): of those within PLAN_TIE of the fastest, the one with the least
 * predicted communication and bubble (the least certain parts of a
 * prediction: on CPU ranks sharing cores they carry the scheduler's noise),
 * of equal ones (within 0.1% of a step) the faster. */
#define PLAN_TIE 0.05
static int layout_pick(Layout **order, int n) {
    int pick = 0;
    for (int i = 1; i < n && !order[i]->why[0] && order[i]->step <= (1.0 + PLAN_TIE) * order[0]->step; i++)
        if (order[i]->comm + order[i]->bubble < order[pick]->comm + order[pick]->bubble - 1e-3 * order[0]->step)
            pick = i;
    return pick;
}

static void print_ranking(Layout **order, int n, const TrainArgs *a, int W, int top, int pick) {
    int standing = 0;
    for (int i = 0; i < n; i++) standing += !order[i]->why[0];
    printf("train_mt: --layout auto: %d layouts of %d rank%s weighed (global batch %d %s per step), %d fit:\n", n, W,
           W > 1 ? "s" : "", a->synthetic ? a->batch_size : a->batch_tokens * W, a->synthetic ? "sentences" : "tokens",
           standing);
    printf("     # | step (s) compute    comm  bubble | peak MiB (rank) | layout\n");
    char text[600];
    for (int i = 0; i < standing && i < top; i++) {
        const Layout *l = order[i];
        layout_text(l, a, text, sizeof text);
        printf("  %c%3d | %8.3f %7.3f %7.3f %7.3f | %9.1f (%2d)  | %s\n", i == pick ? '*' : ' ', i + 1, l->step,
               l->compute, l->comm, l->bubble,
               l->peak / 1048576.0, l->worst, text);
    }
    if (standing > top) printf("  ... and %d more that fit, slower\n", standing - top);
    if (pick >= top && pick < standing) {
        const Layout *l = order[pick];
        layout_text(l, a, text, sizeof text);
        printf("  *%3d | %8.3f %7.3f %7.3f %7.3f | %9.1f (%2d)  | %s\n", pick + 1, l->step, l->compute, l->comm,
               l->bubble, l->peak / 1048576.0, l->worst, text);
    }
    if (pick < standing)
        printf("  (*: the choice: of the layouts within %.0f%% of the fastest, the least communication and bubble)\n",
               100.0 * PLAN_TIE);
    /* the dropped, each reason once with how many layouts it struck */
    int shown = 0;
    for (int i = standing; i < n; i++) {
        bool seen = false;
        for (int j = standing; j < i && !seen; j++) seen = strcmp(order[j]->why, order[i]->why) == 0;
        if (seen) continue;
        int count = 0;
        for (int j = i; j < n; j++) count += strcmp(order[j]->why, order[i]->why) == 0;
        if (shown++ == top) {
            printf("  ... more dropped\n");
            break;
        }
        layout_text(order[i], a, text, sizeof text);
        printf("  dropped %d like %s: %s\n", count, text, order[i]->why);
    }
}

/* --plan, and --layout auto's choice. choose: pick the fastest layout that
 * fits, set it in a and return 0 for the run to go on (every rank learns
 * rank 0's choice); else print and return the exit status. */
static int plan_main(TrainArgs *a, bool choose) {
    char err[1024];
    if (!a->dtype_given) a->dtype = device_is_gpu(a->device) ? DTYPE_BF16 : DTYPE_F32;
    Backend *be = rank_backend_create(a->device, a->dtype, err, sizeof err);
    if (!be) {
        fprintf(stderr, "train_mt: %s\n", err);
        return 2;
    }
    const int world = env_int("WORLD_SIZE", 1), local_world = env_int("LOCAL_WORLD_SIZE", world);
    /* through tprun the ranks meet to measure the collectives; alone, the layout's size is planned */
    Runtime rt;
    RuntimeOptions ro = {.tp = 1, .dp = 0, .pp = 1, .n_heads = a->cfg.n_heads, .d_ff = a->cfg.d_ff,
                         .timeout_s = a->comm_timeout, .comm = RUNTIME_COMM_SHM};
    CommDeviceCopy hooks;
    rank_device_options(be, &ro, &hooks);
    if (runtime_init(&rt, &ro, err, sizeof err)) {
        fprintf(stderr, "train_mt: --plan: %s\n", err);
        backend_destroy(be);
        return 2;
    }
    const bool lead = rt.mesh.rank == 0;
    Layout *ls = NULL;
    int n = 0, W = world;
    if (a->layout_auto) {
        n = layouts_enumerate(a, W, &ls);
    } else {
        int tp = a->tp, dp = a->dp;
        const int pp = a->pp;
        W = world > 1 ? world : (tp ? tp : 1) * (dp ? dp : 1) * pp;
        if (W % pp) {
            fprintf(stderr, "train_mt: --plan: --pp %d does not divide the world size %d\n", pp, W);
            runtime_free(&rt);
            backend_destroy(be);
            return 2;
        }
        if (!tp && !dp) tp = runtime_auto_tp(W / pp, world > 1 ? local_world : W, a->cfg.n_heads, a->cfg.d_ff);
        if (!tp) tp = W / pp / dp;
        if (!dp) dp = W / pp / tp;
        if (tp * dp * pp != W || a->cfg.n_heads % tp || a->cfg.d_ff % tp) {
            fprintf(stderr, "train_mt: --plan: tp %d x dp %d x pp %d does not fit %d ranks and the model (heads %d, "
                            "ffn %d)\n", tp, dp, pp, W, a->cfg.n_heads, a->cfg.d_ff);
            runtime_free(&rt);
            backend_destroy(be);
            return 2;
        }
        n = 1;
        ls = TP_MALLOC(sizeof *ls);
        ls[0] = (Layout){.tp = tp, .dp = dp, .pp = pp, .micro = a->micro_batches, .zero = a->grad.zero,
                         .sp = a->seq_par && tp > 1, .rc = a->recompute, .batch_tokens = a->batch_tokens, .set = -1};
    }
    /* the stages of each pp (balanced by cost, or --pp-layout), made once */
    StageSet *stage_sets = TP_CALLOC((size_t)n, sizeof *stage_sets);
    int n_stage_sets = 0;
    for (int i = 0; i < n; i++) {
        Layout *l = &ls[i];
        if (a->cfg.n_heads % l->tp || a->cfg.d_ff % l->tp) {
            snprintf(l->why, sizeof l->why, "tp %d does not divide the heads (%d) and the ffn (%d)", l->tp,
                     a->cfg.n_heads, a->cfg.d_ff);
            continue;
        }
        int k = 0;
        while (k < n_stage_sets && stage_sets[k].pp != l->pp) k++;
        if (k == n_stage_sets) {
            StageSet *s = &stage_sets[n_stage_sets++];
            s->pp = l->pp;
            s->st = TP_MALLOC((size_t)l->pp * sizeof *s->st);
            if (model_stages_make(&a->cfg, l->pp, a->layout_auto ? NULL : a->pp_layout, s->st, s->err, sizeof s->err) &&
                !s->err[0])
                snprintf(s->err, sizeof s->err, "%d stages cannot be made", l->pp);
        }
        if (stage_sets[k].err[0]) snprintf(l->why, sizeof l->why, "%s", stage_sets[k].err);
        l->stages = stage_sets[k].st;
    }
    int rc = 0;
    Source src;
    ShapeSet *sets = TP_CALLOC((size_t)n, sizeof *sets);
    int n_sets = 0;
    if (!a->layout_auto && ls[0].why[0]) {
        fprintf(stderr, "train_mt: %s\n", ls[0].why);
        rc = 2;
        goto done;
    }
    if (source_open(&src, a, &a->cfg, &rt, err, sizeof err)) {
        fprintf(stderr, "train_mt: %s\n", err);
        source_close(&src);
        rc = 1;
        goto done;
    }
    /* the batch shapes, read once per (dp, micro-batches, tokens) */
    for (int i = 0; i < n; i++) {
        Layout *l = &ls[i];
        if (l->why[0]) continue;
        int k = 0;
        while (k < n_sets && !(sets[k].dp == l->dp && sets[k].micro == l->micro && sets[k].batch_tokens == l->batch_tokens))
            k++;
        if (k == n_sets) {
            sets[k] = (ShapeSet){.dp = l->dp, .micro = l->micro, .batch_tokens = l->batch_tokens};
            if (plan_shapes(a, &src, l->dp, l->micro, l->batch_tokens, &sets[k].ps, sets[k].err, sizeof sets[k].err) &&
                !sets[k].err[0])
                snprintf(sets[k].err, sizeof sets[k].err, "its batches cannot be read");
            n_sets++;
        }
        l->set = k;
        if (sets[k].err[0]) snprintf(l->why, sizeof l->why, "%s", sets[k].err);
    }
    if (!a->layout_auto && ls[0].why[0]) {
        fprintf(stderr, "train_mt: %s\n", ls[0].why);
        source_close(&src);
        rc = 1;
        goto done;
    }
    const bool gpu = !be->host_visible;
    const int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    const int t_cal = env_threads();
    /* the run's threads per rank: this process's (through tprun, or OMP_NUM_THREADS given), else tprun's share */
    const int t_run = world > 1 || getenv("OMP_NUM_THREADS") ? t_cal : (W > 1 ? (int)tp_threads_per_worker(W) : cores);
    /* The calibration: every rank measures the rates the layouts need at
     * once, in step (the contention of the run; rank 0's figures count),
     * then the collectives; the cache keeps what was measured on this
     * machine with this many ranks. */
    const char *cache = a->plan_cache ? a->plan_cache : "cache/plan_calibration.json";
    PlanCalib cal;
    memset(&cal, 0, sizeof cal);
    calib_key(be, t_cal, cal.key, sizeof cal.key);
    const bool had = planner_calib_load(cache, &cal) == 0;
    if (had && cal.ranks != world) {  // other contention: the compute rates again, the collectives kept
        PlanCalib keep = cal;
        memset(&cal, 0, sizeof cal);
        memcpy(cal.key, keep.key, sizeof cal.key);
        memcpy(cal.ar_lat, keep.ar_lat, sizeof cal.ar_lat), memcpy(cal.ar_bw, keep.ar_bw, sizeof cal.ar_bw);
        memcpy(cal.ar_loaded, keep.ar_loaded, sizeof cal.ar_loaded);
        cal.p2p_lat = keep.p2p_lat, cal.p2p_bw = keep.p2p_bw;
    }
    cal.ranks = world;
    for (int i = 0; i < n; i++)
        if (!ls[i].why[0]) {
            const PlanInput in = plan_input(a, &ls[i], gpu, t_run, &sets[ls[i].set].ps);
            planner_calibrate_compute(be, &in, &cal, world > 1 ? rt.ctrl : NULL);
        }
    if (world > 1) {
        comm_ok(comm_barrier(rt.ctrl), rt.ctrl);
        for (int g = 2; g <= world && g <= PLAN_MAX_GROUP; g++) {  // groups of g consecutive ranks, all at once
            if (world % g || cal.ar_bw[g] > 0.0) continue;  // measured once per machine (every rank read the same cache)
            char name[64];
            snprintf(name, sizeof name, "plan.g%d.k%d", g, rt.mesh.rank / g);
            Comm *c = comm_shm_create(rt.job_id, name, rt.mesh.rank % g, g, a->comm_timeout, err, sizeof err);
            TP_CHECK(c, "%s", err);
            planner_calibrate_comm(be, c, &cal);
            comm_free(c);
        }
    }
    if (backend_device_used(be, NULL)) cal.library_bytes = (double)be->mem.cur[MEM_LIBRARY];
    int32_t choice[9] = {0};  // ok, tp, dp, pp, micro, zero, sp, recompute, batch tokens
    if (lead) {
        char why[512], text[600];
        mkdir("cache", 0755);
        if (planner_calib_save(cache, &cal, why, sizeof why))
            fprintf(stderr, "train_mt: --plan: the calibration was not saved: %s\n", why);
        const PlanCalib run = calib_for_run(&cal, W, gpu, plan_slots(gpu, t_run));
        double limit = a->memory_limit;
        if (limit <= 0.0) limit = default_memory_limit(be, W);
        printf("train_mt: plan for preset %s (%d+%d layers, d_model %d, vocab %d) on %s, %d rank%s of %d thread%s; "
               "calibration %s%s%s\n", a->preset, a->cfg.enc_layers, a->cfg.dec_layers, a->cfg.d_model,
               a->cfg.vocab_size, be->device_name, W, W > 1 ? "s" : "", t_run, t_run > 1 ? "s" : "", cache,
               had ? " (completed)" : " (new)",
               world == 1 && W > 1 ? (cal.ar_bw[2] > 0 ? "; collectives from an earlier run through tprun"
                                                       : "; collectives not measured: run --plan through tprun once")
                                   : "");
        if (gpu)
            printf("train_mt: --plan: not counted: the CUDA context and libraries, about %.0f MiB measured on %s at "
                   "start (in use once they exist, less the allocator's; in the library column, beyond the planner's "
                   "control; every process on a GPU has its own); modelled: cuBLASLt's %zu MiB workspace and the ops' "
                   "scratch arena (workspace), %zu MiB of page-locked staging per group with peers for ranks sharing a "
                   "GPU (comm), NCCL's buffers with a GPU per rank (library: %zu MiB x %d channels per ring peer per "
                   "communicator, NCCL's documented sizes; the channel count assumed unless NCCL_MAX_NCHANNELS is set)\n",
                   cal.library_bytes / 1048576.0, be->device_name, backend_gemm_workspace_bytes(BACKEND_CUDA) >> 20,
                   comm_shm_stage_bytes(2) >> 20, planner_nccl_buffsize() >> 20, planner_nccl_channels());
        else
            printf("train_mt: --plan: not counted: a GPU's CUDA context and libraries (not measured on the CPU)\n");
        fflush(stdout);
        for (int i = 0; i < n; i++) {
            Layout *l = &ls[i];
            if (l->why[0]) continue;
            const PlanInput in = plan_input(a, l, gpu, t_run, &sets[l->set].ps);
            plan_layout(a, &in, &run, l, false, NULL, limit, NULL);
            if (l->peak > limit)
                snprintf(l->why, sizeof l->why, "does not fit: rank %d needs %.1f MiB, the limit is %.1f MiB", l->worst,
                         l->peak / 1048576.0, limit / 1048576.0);
        }
        Layout **order = TP_MALLOC((size_t)n * sizeof *order);
        for (int i = 0; i < n; i++) order[i] = &ls[i];
        qsort(order, (size_t)n, sizeof *order, by_step);
        const int pick = layout_pick(order, n);
        if (a->layout_auto) print_ranking(order, n, a, W, choose ? 5 : PLAN_TOP, pick);
        /* the chosen (or the only) layout: its table and verdict */
        Layout *best = order[pick];
        layout_text(best, a, text, sizeof text);
        FILE *json = NULL;
        if (!choose && a->metrics_path && !(json = fopen(a->metrics_path, "w"))) {
            fprintf(stderr, "train_mt: --metrics %s: %s\n", a->metrics_path, strerror(errno));
            rc = 2;
        }
        if (rc == 0 && (!best->why[0] || !a->layout_auto)) {
            const PlanInput in = plan_input(a, best, gpu, t_run, &sets[best->set].ps);
            plan_layout(a, &in, &run, best, true, text, limit, json);
        }
        if (json) {
            if (a->layout_auto) {
                fprintf(json, "%s\"candidates\": [", best->why[0] ? "{" : ", ");
                for (int i = 0; i < n; i++) {
                    char flags[256], desc[600];
                    layout_text(order[i], a, desc, sizeof desc);
                    layout_flags(order[i], a, flags, sizeof flags);
                    fprintf(json, "%s{\"layout\": \"%s\", \"flags\": \"%s\", \"tp\": %d, \"dp\": %d, \"pp\": %d, "
                            "\"micro\": %d, \"zero\": %d, \"sp\": %s, \"recompute\": \"%s\", \"batch_tokens\": %d, "
                            "\"fits\": %s, \"chosen\": %s, \"why\": \"%s\", \"step_s\": %.6f, \"comm_s\": %.6f, "
                            "\"bubble_s\": %.6f, \"peak\": %.0f}", i ? ", " : "", desc, flags,
                            order[i]->tp, order[i]->dp, order[i]->pp, order[i]->micro, order[i]->zero,
                            order[i]->sp ? "true" : "false", model_recompute_name(order[i]->rc), order[i]->batch_tokens,
                            order[i]->why[0] ? "false" : "true", i == pick && !best->why[0] ? "true" : "false",
                            order[i]->why, order[i]->step, order[i]->comm, order[i]->bubble, order[i]->peak);
                }
                fprintf(json, "]");
            }
            fprintf(json, "}\n");
            if (fclose(json) != 0) {
                fprintf(stderr, "train_mt: --metrics %s: writing the file failed\n", a->metrics_path);
                rc = 1;
            }
        }
        if (rc == 0 && best->why[0]) {
            if (a->layout_auto) printf("train_mt: no layout of %d ranks fits: the smallest, %s, %s\n", W, text, best->why);
            else printf("train_mt: %s\n", best->why);
            rc = 3;
        } else if (rc == 0) {
            printf("train_mt: fits: the largest rank (%d) needs %.1f MiB of %.1f MiB; predicted step %.3f s\n",
                   best->worst, best->peak / 1048576.0, limit / 1048576.0, best->step);
            if (a->layout_auto) {
                char flags[256];
                layout_flags(best, a, flags, sizeof flags);
                printf("train_mt: --layout auto: %s %s (%s)\n", choose ? "training" : "would train", text, flags);
            }
            choice[0] = 1, choice[1] = best->tp, choice[2] = best->dp, choice[3] = best->pp, choice[4] = best->micro;
            choice[5] = best->zero, choice[6] = best->sp, choice[7] = (int32_t)best->rc, choice[8] = best->batch_tokens;
        }
        fflush(stdout);
        free(order);
    }
    if (choose) {  // every rank trains what rank 0 chose
        comm_ok(comm_broadcast(rt.ctrl, choice, sizeof choice, 0), rt.ctrl);
        if (choice[0]) {
            a->tp = choice[1], a->dp = choice[2], a->pp = choice[3], a->micro_batches = choice[4], a->grad.zero = choice[5];
            a->seq_par = choice[6], a->recompute = (ModelRecompute)choice[7], a->batch_tokens = choice[8];
            rc = 0;
        } else if (rc == 0) {
            rc = 3;
        }
    }
    source_close(&src);
done:
    for (int k = 0; k < n_sets; k++) plan_shapes_free(&sets[k].ps);
    free(sets);
    for (int k = 0; k < n_stage_sets; k++) free(stage_sets[k].st);
    free(stage_sets);
    free(ls);
    runtime_free(&rt);
    backend_destroy(be);
    return rc;
}

int main(int argc, char **argv) {
    TrainArgs a;
    parse_args(argc, argv, &a);
    if (a.plan) return plan_main(&a, false);
    if (a.layout_auto) {  // choose the layout, then train it
        const int rc = plan_main(&a, true);
        if (rc) return rc;
    }
    char err[1024];
    /* The backend first: where the model's buffers live decides the data
     * groups' communicator (NCCL on its stream, or shm staged through its
     * page-locked buffers, or plain shm on the CPU). */
    if (!a.dtype_given) a.dtype = device_is_gpu(a.device) ? DTYPE_BF16 : DTYPE_F32;
    Backend *be = rank_backend_create(a.device, a.dtype, err, sizeof err);
    if (!be) {
        fprintf(stderr, "train_mt: %s\n", err);
        return 2;
    }
    Runtime rt;
    /* The stages first: an impossible --pp or --pp-layout is refused before any rank meets. */
    static ModelStage stages[MAX_PP];  // static: no early return has it to free
    if (model_stages_make(&a.cfg, a.pp, a.pp_layout, stages, err, sizeof err)) {
        fprintf(stderr, "train_mt: %s\n", err);
        backend_destroy(be);
        return 2;
    }
    static char pp_layout[CKPT_MAX_LAYOUT];  // what checkpoints record of the stages
    model_stages_format(stages, a.pp, pp_layout, sizeof pp_layout);
    RuntimeOptions ro = {.tp = a.tp, .dp = a.dp, .pp = a.pp, .n_heads = a.cfg.n_heads, .d_ff = a.cfg.d_ff,
                         .timeout_s = a.comm_timeout, .comm = a.comm};
    CommDeviceCopy hooks;
    rank_device_options(be, &ro, &hooks);
    if (runtime_init(&rt, &ro, err, sizeof err)) {
        fprintf(stderr, "train_mt: %s\n", err);
        backend_destroy(be);
        return 2;
    }
    backend_note_library(be, runtime_library_bytes(&rt));  // NCCL's buffers (0 with shm)
    const Mesh *mesh = &rt.mesh;
    const bool lead = mesh->rank == 0;  // prints, writes metrics and saves
    if (mesh->world > 1) tp_set_log_rank(mesh->rank);
    if (a.dump_batches && (mesh->world > 1 || check_writable_path(a.dump_batches, err, sizeof err))) {
        if (lead && mesh->world > 1)  // each rank reads other batches: one file would hold one rank's
            fprintf(stderr, "train_mt: --dump-batches writes the batches of a one-rank run; this run has %d ranks\n",
                    mesh->world);
        else if (lead)  // refused now, not after the run
            fprintf(stderr, "train_mt: --dump-batches: %s\n", err);
        runtime_free(&rt);
        backend_destroy(be);
        return 2;
    }
    Source src;
    if (source_open(&src, &a, &a.cfg, &rt, err, sizeof err)) {
        fprintf(stderr, "train_mt: %s\n", err);
        source_close(&src);
        runtime_free(&rt);  // before the backend: NCCL works on its stream
        backend_destroy(be);
        return 1;
    }
    /* A --save folder holding another model's checkpoints is refused now,
     * not at the first save (its `latest` would name the wrong model). */
    if (a.save_dir && ckpt_check_save_folder(a.save_dir, &a.cfg, !a.synthetic, src.spm_path, err, sizeof err)) {
        fprintf(stderr, "train_mt: %s\n", err);
        source_close(&src);
        runtime_free(&rt);
        backend_destroy(be);
        return 2;
    }
    Model m;
    TpGroup tpg = {.size = mesh->tp, .rank = mesh->tp_rank, .comm = rt.tp};
    const int pp = mesh->pp;
    if (model_create_stage(&m, be, &a.cfg, &tpg, &stages[mesh->pp_rank], a.seed,
                           a.grad.zero >= 2 ? MODEL_NO_GRAD_BUFFER : 0, err, sizeof err)) {
        fprintf(stderr, "train_mt: %s\n", err);
        return 2;
    }
    model_set_recompute(&m, a.recompute);
    if (model_set_sequence_parallel(&m, a.seq_par, err, sizeof err)) {
        fprintf(stderr, "train_mt: --sequence-parallel: %s\n", err);
        return 2;
    }
    /* With stages, evaluation and export assemble the whole stack (tp
     * shards) on the first stage's ranks of dp rank 0. */
    Model stack;
    const bool stack_here = pp > 1 && mesh->pp_rank == 0 && mesh->dp_rank == 0;
    if (stack_here && model_create_ex(&stack, be, &a.cfg, &tpg, a.seed, MODEL_NO_GRAD_BUFFER, err, sizeof err)) {
        fprintf(stderr, "train_mt: %s\n", err);
        return 2;
    }
    Model *evm = pp > 1 ? (stack_here ? &stack : NULL) : &m;  // the model evaluate() runs
    /* Dev BLEU decodes with the whole model, assembled on rank 0 (no
     * gradient buffer: it only decodes, and the memory table counts it). */
    Model whole;
    bool decode_here = lead && !a.synthetic;
    if (decode_here && model_create_ex(&whole, be, &a.cfg, NULL, a.seed, MODEL_NO_GRAD_BUFFER, err, sizeof err)) {
        fprintf(stderr, "train_mt: %s\n", err);
        return 2;
    }
    int total = run_steps(&a, a.synthetic ? 0 : src.train.n_batches);
    a.opt.decay_steps = total;
    a.grad.staged = pp > 1;
    GradSync *gsync = grad_sync_create(be, rt.dp, &m, &a.grad);
    AdamW opt;
    grad_sync_adamw_init(gsync, &opt, be, &a.opt);
    int first_step = 1;
    if (a.resume && resume(&a, &rt, &m, &opt, &src, total, &first_step, err, sizeof err)) {
        fprintf(stderr, "train_mt: --resume: %s\n", err);
        adamw_free(&opt);
        grad_sync_free(gsync);
        if (decode_here) model_free(&whole);
        model_free(&m);
        source_close(&src);
        runtime_free(&rt);  // before the backend: NCCL works on its stream
        backend_destroy(be);
        return 1;
    }
    FILE *metrics = NULL;
    if (a.metrics_path && lead) {
        metrics = fopen(a.metrics_path, first_step > 1 ? "a" : "w");
        if (!metrics) {
            fprintf(stderr, "train_mt: --metrics %s: %s\n", a.metrics_path, strerror(errno));
            return 2;
        }
    }
    if (lead && args_echo(&a, stdout, first_step)) return 2;  // the effective configuration, from the flag table
    if (lead) {
        printf("train_mt: preset %s, d_model %d, heads %d, ffn %d, layers %d+%d, vocab %d; %s; %d steps\n", a.preset,
               a.cfg.d_model, a.cfg.n_heads, a.cfg.d_ff, a.cfg.enc_layers, a.cfg.dec_layers, a.cfg.vocab_size,
               a.synthetic ? (a.task == SYNTH_COPY ? "synthetic copy task" : "synthetic reverse task")
                           : (a.dir == DIR_EN_JA ? "en->ja" : "ja->en"),
               total);
        printf("train_mt: %d rank%s: tp %d x dp %d x pp %d; %zu parameters per rank; device %s, %s; "
               "collectives %s; recompute %s%s\n", mesh->world, mesh->world > 1 ? "s" : "", mesh->tp, mesh->dp,
               mesh->pp, m.tab.n_elems, be->device_name, dtype_name(be->dtype),
               mesh->world == 1             ? "none (one rank)"
               : rt.comm == RUNTIME_COMM_NCCL ? "nccl"
               : rt.staged                  ? "shm (device buffers staged through page-locked host memory)"
                                            : "shm",
               model_recompute_name(a.recompute), m.seq_par ? "; sequence parallel" : "");
        if (pp > 1) {
            char layout[512];
            model_stages_format(stages, pp, layout, sizeof layout);
            printf("train_mt: pipeline: %d stages %s, 1F1B over %d micro-batch%s; ideal bubble %.1f%%\n", pp, layout,
                   a.micro_batches, a.micro_batches > 1 ? "es" : "", 100.0 * pipeline_bubble_theory(pp, a.micro_batches));
        }
        fflush(stdout);
    }
    if (a.profile) profile_start(be, &rt);
    Trainer trainer;
    trainer_init(&trainer, &m, &opt, rt.tp, rt.dp, gsync, a.opt.clip_norm);
    trainer_set_pipeline(&trainer, rt.pp);
    const bool tty = lead && isatty(STDOUT_FILENO);
    const double t_start = tp_now_s();
    double t_window = t_start, t_eval = 0.0, t_comm = 0.0, t_exposed = 0.0, t_pp_wait = 0.0;
    CommStats tp_steps = {0};
    double *mem_last = NULL;  // the memory figures last reported
    long tok_window = 0;
    double pad_slots = 0.0, all_slots = 0.0;  // the window's padded and total batch slots (source + target)
    int saved_step = first_step - 1;
    Best best = {0};
    best_restore(&a, first_step, lead, &best);
    double top = 0.0;  // the best single evaluation's dev BLEU (lowest loss for a --task run), for --average-last
    int top_step = 0, early_stop = 0;
    BatchDump *dump = a.dump_batches ? batch_dump_new(first_step, a.micro_batches) : NULL;
    /* From here a signal saves and stops at a step boundary (preempt.h);
     * before it, there is nothing new to save and a signal ends the job at once. */
    preempt_install();
    int stop_sig = 0;
    for (int step = first_step; step <= total; step++) {
        OwnedBatch *b = TP_MALLOC((size_t)a.micro_batches * sizeof *b);
        Batch *views = TP_MALLOC((size_t)a.micro_batches * sizeof *views);
        long n_global = 0;
        source_next(&src, b, &n_global);
        for (int i = 0; i < a.micro_batches; i++) {
            views[i] = b[i].view;
            const double slots = (double)views[i].B * (views[i].S + views[i].T);
            pad_slots += batch_pad_fraction(&views[i]) * slots;
            all_slots += slots;
        }
        /* Masks differ across data-parallel ranks (other sentences), never across tp ranks. */
        DropoutKey key = {.seed = a.seed, .step = (uint32_t)step, .micro = (uint32_t)mesh->dp_rank};
        StepResult sr;
        const float lr = lr_at(&a.opt, step);
        const CommStats tp0 = rt.tp ? comm_stats(rt.tp) : (CommStats){0};
        const double t_step = tp_now_s();
        backend_profile_step_begin(be);
        train_step(&trainer, views, a.micro_batches, n_global, key, lr, &sr);
        backend_profile_step_end(be, tp_now_s() - t_step);
        if (rt.tp) {  // the training steps' tp collectives (evaluation left out)
            const CommStats tp1 = comm_stats(rt.tp);
            tp_steps.allreduce += tp1.allreduce - tp0.allreduce;
            tp_steps.reduce_scatter += tp1.reduce_scatter - tp0.reduce_scatter;
            tp_steps.allgather += tp1.allgather - tp0.allgather;
        }
        t_pp_wait += sr.pp_wait_s;
        for (int i = 0; i < a.micro_batches; i++) {
            if (dump) batch_dump_take(dump, step, i, &b[i]);
            owned_batch_free(&b[i]);  // (emptied by the dump)
        }
        free(b);
        free(views);
        t_comm += sr.comm_s;
        t_exposed += sr.exposed_comm_s;
        const float loss = sr.loss, gnorm = sr.grad_norm;
        if (!isfinite(loss) || !isfinite(gnorm)) {
            fprintf(stderr, "%strain_mt: step %d: loss %g, gradient norm %g is not finite; stopping "
                            "(lower --lr or raise --warmup)\n", tty ? "\n" : "", step, loss, gnorm);
            return 1;
        }
        tok_window += n_global;
        if (a.max_minutes > 0.0 && step < total && step % a.log_interval == 0) {  // rank 0's clock decides for all
            int stop = lead && tp_now_s() - t_start >= 60.0 * a.max_minutes;
            comm_ok(comm_broadcast(rt.ctrl, &stop, sizeof stop, 0), rt.ctrl);
            if (stop) {
                if (lead)
                    printf("%strain_mt: --max-minutes %g reached at step %d of %d: ending the run here\n",
                           tty ? "\r\033[K" : "", a.max_minutes, step, total);
                total = step;
            }
        }

        double t = tp_now_s();
        if (tty) {
            double per_step = (t - t_start - t_eval) / step;
            char eta[32];
            fmt_duration(eta, sizeof eta, per_step * (total - step));
            printf("\r\033[K%d/%d | loss %.4f | %.0f tok/s | ETA %s", step, total, loss,
                   tok_window / (t - t_window > 1e-9 ? t - t_window : 1e-9), eta);
            fflush(stdout);
        }
        if (step % a.log_interval == 0 || step == total || step == 1) {
            double tps = tok_window / (t - t_window > 1e-9 ? t - t_window : 1e-9);
            const double pad = all_slots > 0 ? pad_slots / all_slots : 0.0;  // this rank's batches in the window
            char *mem = memory_metrics(&rt, be, lead && metrics);
            char launch[64] = "";
            if (step == first_step) snprintf(launch, sizeof launch, ", \"since_launch_s\": %.3f", tp_process_age_s());
            if (lead) {
                printf("%sstep %6d/%d | loss %.4f | lr %.3e | grad_norm %.3f | %.0f tok/s | pad %.1f%%\n",
                       tty ? "\r\033[K" : "", step, total, loss, lr, gnorm, tps, 100.0 * pad);
                if (metrics)
                    metrics_line(metrics, a.metrics_path, "{\"step\": %d, \"loss\": %.9g, \"lr\": %.6e, "
                                 "\"grad_norm\": %.9g, \"tokens_per_s\": %.1f, \"pad_frac\": %.4f, \"elapsed_s\": "
                                 "%.3f%s%s}\n", step, loss, lr, gnorm, tps, pad, t - t_start, launch, mem ? mem : "");
            }
            pad_slots = all_slots = 0.0;
            free(mem);
            if (step != total) {
                char when[64];
                snprintf(when, sizeof when, "step %d", step);
                memory_report_if_grown(&rt, be, lead ? metrics : NULL, a.metrics_path, step, &mem_last, when);
            }
            t_window = tp_now_s();
            tok_window = 0;
        }
        if (a.eval_interval && (step % a.eval_interval == 0 || step == total)) {
            double t0 = tp_now_s();
            if (mesh->dp_rank == 0 && pp > 1) model_stage_collect(&m, rt.pp, stages, pp, evm);
            EvalResult ev = {0};
            if (mesh->dp_rank == 0 && evm) {  // one tp group evaluates; the others wait at the barrier
                if (decode_here || (!a.synthetic && mesh->tp > 1)) model_gather(evm, decode_here ? &whole : NULL);
                ev = evaluate(evm, decode_here ? &whole : NULL, &src);
                const double fig = ev.has_bleu ? ev.bleu : ev.loss;
                if (lead && (!top_step || (ev.has_bleu ? fig > top : fig < top))) top = fig, top_step = step;
                if (lead && ev.has_bleu) {
                    printf("%sstep %6d/%d | dev loss %.4f | dev BLEU %.2f\n", tty ? "\r\033[K" : "", step, total,
                           ev.loss, ev.bleu);
                    if (metrics)
                        metrics_line(metrics, a.metrics_path, "{\"step\": %d, \"dev_loss\": %.9g, \"dev_bleu\": %.4f, "
                                     "\"elapsed_s\": %.3f}\n", step, ev.loss, ev.bleu, t0 - t_start);
                } else if (lead) {
                    printf("%sstep %6d/%d | held-out loss %.4f\n", tty ? "\r\033[K" : "", step, total, ev.loss);
                    if (metrics)
                        metrics_line(metrics, a.metrics_path, "{\"step\": %d, \"dev_loss\": %.9g, \"elapsed_s\": %.3f}\n",
                                     step, ev.loss, t0 - t_start);
                }
            }
            comm_ok(comm_barrier(rt.ctrl), rt.ctrl);
            if (a.keep_best) {  // rank 0's figures decide for every rank
                int kept = lead ? best_update(&a, &best, a.keep_best == KEEP_BLEU ? ev.bleu : ev.loss, step) : 0;
                comm_ok(comm_broadcast(rt.ctrl, &kept, sizeof kept, 0), rt.ctrl);
                if (kept == 1 && saved_step != step) {
                    save(&a, &rt, &m, &opt, &src, pp_layout, step);
                    saved_step = step;
                }
                if (kept == 1 && lead) best_publish(&a, &best, metrics);
                early_stop = kept == 2 && step < total;
            }
            const double dt = tp_now_s() - t0;
            t_eval += dt;
            t_window += dt;  // tokens/s counts training time only (the window keeps its tokens)
        }
        if (a.save_dir && a.save_interval && step % a.save_interval == 0 && saved_step != step) {
            save(&a, &rt, &m, &opt, &src, pp_layout, step);
            saved_step = step;
        }
        if (lead && !tty) fflush(stdout);
        if (metrics) fflush(metrics);
        if (early_stop) {  // evaluated above; saved after the loop
            if (lead) early_stop_report(&a, &best, step, total, metrics);
            total = step;
            break;
        }
        if (step < total && (stop_sig = preempt_agree(rt.ctrl)) != 0) {  // one small allreduce per step
            comm_ok(stop_sig < 0 ? -1 : 0, rt.ctrl);
            stop_on_signal(&a, &rt, &m, &opt, &src, pp_layout, step, saved_step, stop_sig, total);
            saved_step = total = step;
            break;
        }
    }
    if (a.save_dir && saved_step != total) save(&a, &rt, &m, &opt, &src, pp_layout, total);
    int rc = 0;
    if (lead && a.keep_best && best.have)
        printf("train_mt: best checkpoint: step %d, %s %.4f: %s/best\n", best.step, keep_label(a.keep_best),
               best.value, a.save_dir);
    if (a.average_last && !stop_sig) {
        if (lead) rc = average_report(&a, be, &src, top, top_step, metrics);
        comm_ok(comm_barrier(rt.ctrl), rt.ctrl);
    }
    if (lead) {
        char took[32];
        fmt_duration(took, sizeof took, tp_now_s() - t_start);
        printf("train_mt: %d steps in %s (%.1f s training, with %.1f s data-parallel communication of which "
               "%.1f s exposed; %.1f s evaluation)\n", total, took, tp_now_s() - t_start - t_eval, t_comm, t_exposed,
               t_eval);
        CommStats ts = comm_stats(rt.tp);
        const double steps_run = total >= first_step ? total - first_step + 1 : 1;
        if (mesh->tp > 1)
            printf("train_mt: tensor-parallel allreduces: %ld (%.1f MiB), %.1f s; per training step %.2f "
                   "allreduces, %.2f reduce-scatters, %.2f allgathers\n", ts.allreduce,
                   ts.allreduce_bytes / (1024.0 * 1024.0), ts.seconds, (double)tp_steps.allreduce / steps_run,
                   (double)tp_steps.reduce_scatter / steps_run, (double)tp_steps.allgather / steps_run);
    }
    if (pp > 1 && mesh->tp_rank == 0 && mesh->dp_rank == 0) {  // one line per stage
        char layout[256];
        model_stages_format(&stages[mesh->pp_rank], 1, layout, sizeof layout);
        const double train_s = tp_now_s() - t_start - t_eval;
        printf("train_mt: pipeline stage %d (%s): %.1f%% of %.1f s training waiting in exchanges (measured bubble "
               "and transfers; ideal 1F1B bubble %.1f%%); %ld messages sent and %ld received in %d steps\n",
               mesh->pp_rank, layout, train_s > 0 ? 100.0 * t_pp_wait / train_s : 0.0, train_s,
               100.0 * pipeline_bubble_theory(pp, a.micro_batches), trainer.pp_sent, trainer.pp_received,
               total - first_step + 1);
        fflush(stdout);
    }
    if (a.profile && lead) {  // rank 0's steps (each rank times its own)
        const ProfTotals pt = backend_profile_totals(be);
        prof_print_table(stdout, &pt, be->device_name);
        if (metrics) {
            char json[2048];
            metrics_line(metrics, a.metrics_path, "{\"step\": %d, \"profile\": %s}\n", total,
                         prof_json(&pt, json, sizeof json));
        }
        fflush(stdout);
    }
    {
        double *all = memory_gather(&rt, be);
        memory_table(&rt, be, all, "end of training");
        memory_record(lead ? metrics : NULL, a.metrics_path, &rt, all, total);
        free(all);
        free(mem_last);
    }
    if (dump) {
        char *json = config_to_json(&m.cfg);
        if (batch_dump_write(dump, a.dump_batches, json, err, sizeof err)) {
            fprintf(stderr, "train_mt: --dump-batches: %s\n", err);
            rc = 1;
        } else {
            printf("train_mt: %d steps' batches written to %s\n", total - first_step + 1, a.dump_batches);
        }
        free(json);
        batch_dump_free(dump);
    }
    if (a.export_dir && stop_sig) {
        if (lead) printf("train_mt: --export skipped: the run stopped on %s before its last step\n",
                         preempt_signal_name(stop_sig));
    } else if (a.export_dir) {
        Model full;
        bool writer = lead;
        if (mesh->dp_rank == 0 && pp > 1) model_stage_collect(&m, rt.pp, stages, pp, evm);
        if (mesh->dp_rank == 0 && evm) {
            Model *dst = decode_here ? &whole : NULL;
            if (writer && !dst) {
                TP_CHECK(model_create_ex(&full, be, &m.cfg, NULL, a.seed, MODEL_NO_GRAD_BUFFER, err, sizeof err) == 0,
                         "%s", err);
                dst = &full;
            }
            model_gather(evm, dst);
            if (writer) {
                int s = a.synthetic ? model_export(dst, a.export_dir, err, sizeof err)
                                    : mt_save(dst, src.spm_path, a.export_dir, err, sizeof err);
                if (s) {
                    fprintf(stderr, "train_mt: --export: %s\n", err);
                    rc = 1;
                } else {
                    printf("train_mt: model exported to %s\n", a.export_dir);
                }
                if (dst == &full) model_free(&full);
            }
        }
        comm_ok(comm_barrier(rt.ctrl), rt.ctrl);
    }
    if (metrics && fclose(metrics) != 0) {
        fprintf(stderr, "train_mt: --metrics %s: writing the file failed (%s)\n", a.metrics_path, strerror(errno));
        rc = 1;
    }
    trainer_free(&trainer);
    adamw_free(&opt);
    grad_sync_free(gsync);
    if (decode_here) model_free(&whole);
    if (stack_here) model_free(&stack);
    model_free(&m);
    source_close(&src);
    runtime_free(&rt);  // before the backend: the groups' staging buffers and NCCL's stream are the backend's
    backend_destroy(be);
    if (rc == 0 && stop_sig) rc = a.save_dir ? TP_EXIT_SAVED_ON_SIGNAL : 128 + stop_sig;
    return rc;
}
