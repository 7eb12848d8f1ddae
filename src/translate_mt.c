/* translate_mt.c: decoding and evaluation with a saved model directory.
 *
 *   translate_mt --model DIR [--beam K] [--lenpen A] < input.en > output.ja
 *   translate_mt --model DIR --src test.en --ref test.ja     # + corpus BLEU and chrF on stderr
 *   translate_mt --model DIR --src test.en --ref test.ja --score   # log p(ref | src) per line
 *
 * Input is plain text: it is brought into the form the model was trained
 * on (the "text" record of its config: lower-casing, punctuation split),
 * and the output is joined back into plain text (--tokenized: as the model
 * writes it, the corpus's form). BLEU and chrF always compare the model's
 * own form with --ref, which is the corpus's.
 *
 * Translations go to stdout in input order, one per line; reports go to
 * stderr so stdout stays machine-readable. The model is loaded onto the
 * backend --device names (auto: a GPU when one is visible) and decoded
 * there; --dtype sets its GEMM precision as in train_mt. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/bleu.h"
#include "data/chrf.h"
#include "data/textnorm.h"
#include "err.h"
#include "flags.h"
#include "mt.h"
#include "parse.h"

/* Flag bounds: beyond them a run is a typo, not a setting. */
#define MAX_BEAM 1000
#define MAX_LENPEN 10.0
#define MAX_BATCH (1 << 20)

typedef struct {
    char **line;
    int n, cap;
} Lines;

/* Reads every line (CRLF and LF stripped). -1 + err on I/O failure. */
static void free_lines(Lines *l) {
    for (int i = 0; i < l->n; i++) free(l->line[i]);
    free(l->line);
    memset(l, 0, sizeof *l);
}

static int read_lines(FILE *f, const char *name, Lines *out, char *err, size_t err_len) {
    memset(out, 0, sizeof *out);
    char *buf = NULL;
    size_t cap = 0;
    ssize_t got;
    while ((got = getline(&buf, &cap, f)) >= 0) {
        while (got > 0 && (buf[got - 1] == '\n' || buf[got - 1] == '\r')) buf[--got] = '\0';
        if (out->n == out->cap) {
            out->cap = out->cap ? 2 * out->cap : 1024;
            out->line = realloc(out->line, (size_t)out->cap * sizeof(char *));
            TP_CHECK(out->line, "out of memory reading %s", name);
        }
        out->line[out->n++] = strdup(buf);
    }
    free(buf);
    if (ferror(f)) {
        tp_error_set(err, err_len, "%s: read error (%s)", name, strerror(errno));
        free_lines(out);
        return -1;
    }
    return 0;
}

static int load_lines(const char *path, Lines *out) {
    char err[512];
    memset(out, 0, sizeof *out);
    FILE *f = path ? fopen(path, "r") : stdin;
    if (!f) {
        fprintf(stderr, "translate_mt: %s: %s\n", path, strerror(errno));
        return -1;
    }
    int rc = read_lines(f, path ? path : "<stdin>", out, err, sizeof err);
    if (path) fclose(f);
    if (rc) fprintf(stderr, "translate_mt: %s\n", err);
    return rc;
}

/* Encodes all lines (each first brought into the training text's form when
 * norm is given); counts lines longer than the model accepts. */
static int32_t **encode_all(const Spm *spm, const TextNorm *norm, const Lines *l, int **len_out, int max_pieces,
                            const char *name) {
    int32_t **ids = TP_CALLOC((size_t)(l->n > 0 ? l->n : 1), sizeof(int32_t *));
    int *len = TP_CALLOC((size_t)(l->n > 0 ? l->n : 1), sizeof(int));
    int cut = 0;
    for (int i = 0; i < l->n; i++) {
        char *line = norm ? textnorm_source(norm, l->line[i]) : l->line[i];
        ids[i] = mt_encode_line(spm, line, &len[i]);
        if (norm) free(line);
        TP_CHECK(ids[i], "%s:%d: the tokenizer failed on this line", name, i + 1);
        if (len[i] > max_pieces) cut++;
    }
    if (cut)
        fprintf(stderr, "translate_mt: %s: %d lines longer than %d pieces were cut to that length\n", name, cut,
                max_pieces);
    *len_out = len;
    return ids;
}

/* ---- flags --------------------------------------------------------------- */

typedef struct {
    const char *model_dir, *src_path, *ref_path;
    int beam, batch;
    float lenpen;
    bool score, tokenized;
    DeviceChoice device;
    Dtype dtype;
    bool dtype_given;  // else the device's: bf16 on a GPU, fp32 on the CPU
} TranslateArgs;

static const int DEVICE_VALUES[] = {DEVICE_AUTO, DEVICE_CPU, DEVICE_CUDA};
static const int DTYPE_VALUES[] = {DTYPE_F32, DTYPE_BF16};

#define T TranslateArgs
static const Flag TRANSLATE_FLAGS[] = {
    {.name = "model", .kind = FLAG_STRING, .group = "Model", .metavar = "DIR", FLAG_AT(T, model_dir),
     .help = "a model directory saved by train_mt --save (required)"},
    {.name = "device", .kind = FLAG_CHOICE, .group = "Model", .choices = "auto|cpu|cuda", .values = DEVICE_VALUES,
     .dflt = "auto", FLAG_AT(T, device), .help = "where the model runs (auto: cuda when a GPU is visible)"},
    {.name = "dtype", .kind = FLAG_CHOICE, .group = "Model", .choices = "fp32|bf16", .values = DTYPE_VALUES,
     .dflt_note = "bf16 on cuda, fp32 on cpu", FLAG_AT(T, dtype), .help = "GEMM precision"},
    {.name = "src", .kind = FLAG_STRING, .group = "Data", .metavar = "FILE", FLAG_AT(T, src_path),
     .dflt_note = "stdin",
     .help = "source sentences, one per line, plain text: brought into the form of the model's training text "
             "(lower-cased, punctuation split) first"},
    {.name = "tokenized", .kind = FLAG_SWITCH, .group = "Data", FLAG_AT(T, tokenized),
     .help = "write the output as the model writes it (the corpus's form, words split with spaces), not joined "
             "back into plain text"},
    {.name = "ref", .kind = FLAG_STRING, .group = "Evaluation", .metavar = "FILE", FLAG_AT(T, ref_path),
     .help = "references in the corpus's form: print corpus BLEU-4 and chrF2 on stderr, scored on the model's "
             "tokenized output"},
    {.name = "score", .kind = FLAG_SWITCH, .group = "Evaluation", FLAG_AT(T, score),
     .help = "with --ref: print log p(ref | src) of each pair instead of translating"},
    {.name = "beam", .kind = FLAG_INT, .group = "Decoding", .metavar = "K", .lo = 0, .hi = MAX_BEAM, .dflt = "5",
     FLAG_AT(T, beam), .help = "beam size (0: greedy)"},
    {.name = "lenpen", .kind = FLAG_REAL, .group = "Decoding", .metavar = "A", .lo = 0.0, .hi = MAX_LENPEN,
     .dflt = "1.0", FLAG_AT(T, lenpen), .help = "length penalty: score / length^A"},
    {.name = "batch-size", .kind = FLAG_INT, .group = "Decoding", .metavar = "N", .lo = 1, .hi = MAX_BATCH,
     .dflt = "64", FLAG_AT(T, batch), .help = "sentences decoded together"},
};
#undef T

static const FlagTable TRANSLATE_TABLE = {
    .prog = "translate_mt",
    .usage = "usage: translate_mt --model DIR [--src FILE] [--ref FILE] [--score] [--beam K] [--lenpen A]\n"
             "                    [--batch-size N] [--device auto|cpu|cuda] [--dtype fp32|bf16] [--tokenized]\n",
    .flags = TRANSLATE_FLAGS,
    .n = sizeof TRANSLATE_FLAGS / sizeof TRANSLATE_FLAGS[0],
};

/* Flags into a, checked before the model is read: -1 when all is well, else
 * the exit status (0 after --help, 2 after one sentence). */
static int parse_args(int argc, char **argv, TranslateArgs *a) {
    memset(a, 0, sizeof *a);
    if (flags_defaults(&TRANSLATE_TABLE, a)) return 2;
    FlagsParsed p;
    const int rc = flags_parse(&TRANSLATE_TABLE, argc, argv, a, &p);
    const bool operand = rc == 0 && p.n_operands > 0;
    if (operand) fprintf(stderr, "translate_mt: unexpected argument '%s'\n", p.operands[0]);
    a->dtype_given = flags_given(&TRANSLATE_TABLE, &p, "dtype");
    flags_parsed_free(&p);
    if (rc == 1) {
        flags_help(stdout, &TRANSLATE_TABLE, NULL);
        return 0;
    }
    if (rc || operand) return 2;
    if (!a->model_dir) {
        fprintf(stderr, "translate_mt: --model DIR is required (a model directory saved by train_mt --save); see "
                        "translate_mt --help\n");
        return 2;
    }
    if (a->score && !a->ref_path) {
        fprintf(stderr, "translate_mt: --score needs --ref (the targets to score)\n");
        return 2;
    }
    if (!a->dtype_given)
        a->dtype = a->device == DEVICE_CUDA || (a->device == DEVICE_AUTO && backend_cuda_available(NULL)) ? DTYPE_BF16
                                                                                                      : DTYPE_F32;
    return -1;
}

/* ---- the run ------------------------------------------------------------- */

/* The backend and the model on it; the exit status on failure (printed). */
static int open_model(const TranslateArgs *a, Backend **be, MtModel *mt) {
    char err[1024];
    *be = backend_create(a->device, a->dtype, 0, err, sizeof err);  // one process: the first visible GPU
    if (!*be) {
        fprintf(stderr, "translate_mt: %s\n", err);
        return 2;
    }
    if (mt_load_on(mt, *be, a->model_dir, err, sizeof err)) {
        fprintf(stderr, "translate_mt: %s\n", err);
        backend_destroy(*be);
        return 1;
    }
    if (!mt->model.cfg.text.recorded)
        fprintf(stderr, "translate_mt: %s does not record its training text's form (saved before the record "
                "existed): assuming small_parallel_enja's, English lower-cased with punctuation split, Japanese "
                "words split with spaces\n", a->model_dir);
    return 0;
}

/* --src (or stdin) and --ref, which must have as many lines. 0, or -1
 * (printed, and nothing left allocated). */
static int read_inputs(const TranslateArgs *a, Lines *src, Lines *ref) {
    memset(src, 0, sizeof *src);
    memset(ref, 0, sizeof *ref);
    if (load_lines(a->src_path, src)) return -1;
    if (a->ref_path && load_lines(a->ref_path, ref)) {
        free_lines(src);
        return -1;
    }
    if (a->ref_path && ref->n != src->n) {
        fprintf(stderr, "translate_mt: %s has %d lines but %s has %d\n", a->src_path ? a->src_path : "<stdin>",
                src->n, a->ref_path, ref->n);
        free_lines(src);
        free_lines(ref);
        return -1;
    }
    return 0;
}

/* --score: log p(ref | src) of each pair, one per line. */
static void score_pairs(const TranslateArgs *a, MtModel *mt, int32_t **src_ids, const int *src_len, const Lines *ref,
                        int n) {
    int *ref_len = NULL;
    int32_t **ref_ids = encode_all(mt->spm, NULL, ref, &ref_len, mt->model.cfg.max_len - 1, a->ref_path);
    double *s = TP_MALLOC((size_t)(n > 0 ? n : 1) * sizeof(double));
    mt_score_ids(&mt->model, (const int32_t *const *)src_ids, src_len, (const int32_t *const *)ref_ids, ref_len, n,
                 a->batch, s);
    for (int i = 0; i < n; i++) printf("%.6f\n", s[i]);
    for (int i = 0; i < ref->n; i++) free(ref_ids[i]);
    free(ref_ids);
    free(ref_len);
    free(s);
}

static void print_scores(const BleuStats *bs, const ChrfStats *cs) {
    double bp, p[4];
    double bleu = bleu_score(bs, &bp, p);
    fprintf(stderr, "BLEU = %.2f %.1f/%.1f/%.1f/%.1f (BP = %.3f, hyp_len = %ld, ref_len = %ld)\n", bleu, 100 * p[0],
            100 * p[1], 100 * p[2], 100 * p[3], bp, bs->hyp_len, bs->ref_len);
    double cp, cr;
    double chrf = chrf_score(cs, &cp, &cr);
    fprintf(stderr, "chrF2 = %.2f (character 1..%d-grams: P = %.1f, R = %.1f)\n", chrf, CHRF_ORDER, 100 * cp,
            100 * cr);
}

/* The translations on stdout in input order; BLEU and chrF on stderr with --ref. */
static void translate(const TranslateArgs *a, MtModel *mt, int32_t **src_ids, const int *src_len, const Lines *ref,
                      int n) {
    const TextNorm *norm = &mt->model.cfg.text;
    Hypotheses h;
    mt_translate_ids(&mt->model, (const int32_t *const *)src_ids, src_len, n, a->beam, a->lenpen, a->batch, &h);
    BleuStats bs;
    ChrfStats cs;
    bleu_init(&bs);
    chrf_init(&cs);
    for (int i = 0; i < n; i++) {
        char *text = spm_decode(mt->spm, h.hyp[i], h.len[i]);
        TP_CHECK(text, "the tokenizer failed to decode output %d", i + 1);
        if (a->tokenized) {
            printf("%s\n", text);
        } else {
            char *plain = textnorm_detok(norm, text);
            printf("%s\n", plain);
            free(plain);
        }
        if (a->ref_path) {
            bleu_add(&bs, text, ref->line[i]);
            chrf_add(&cs, text, ref->line[i]);
        }
        free(text);
    }
    if (a->ref_path) print_scores(&bs, &cs);
    hypotheses_free(&h);
}

int main(int argc, char **argv) {
    TranslateArgs a;
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0) return rc;
    Lines src, ref;
    if (read_inputs(&a, &src, &ref)) return 1;  // before the model: a bad --src or --ref costs no loading
    Backend *be;
    MtModel mt;
    if ((rc = open_model(&a, &be, &mt))) {
        free_lines(&src);
        free_lines(&ref);
        return rc;
    }
    int *src_len = NULL;
    int32_t **src_ids = encode_all(mt.spm, &mt.model.cfg.text, &src, &src_len, mt.model.cfg.max_len - 1,
                                   a.src_path ? a.src_path : "<stdin>");
    if (a.score) score_pairs(&a, &mt, src_ids, src_len, &ref, src.n);
    else translate(&a, &mt, src_ids, src_len, &ref, src.n);
    rc = 0;
    if (fflush(stdout) != 0) {
        fprintf(stderr, "translate_mt: writing the output failed\n");
        rc = 1;
    }
    for (int i = 0; i < src.n; i++) free(src_ids[i]);
    free(src_ids);
    free(src_len);
    free_lines(&src);
    free_lines(&ref);
    mt_free(&mt);
    backend_destroy(be);
    return rc;
}
