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
#include <getopt.h>
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
        return -1;
    }
    return 0;
}

static void free_lines(Lines *l) {
    for (int i = 0; i < l->n; i++) free(l->line[i]);
    free(l->line);
    memset(l, 0, sizeof *l);
}

static int load_lines(const char *path, Lines *out) {
    char err[512];
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

static void usage(FILE *f) {
    fprintf(f, "usage: translate_mt --model DIR [--src FILE] [--ref FILE] [--score] [--beam K] [--lenpen A]\n"
               "                    [--batch-size N] [--device auto|cpu|cuda] [--dtype fp32|bf16] [--tokenized]\n"
               "  --model DIR     a model directory saved by train_mt --save\n"
               "  --src FILE      source sentences, one per line, plain text (default: stdin): brought into the\n"
               "                  form of the model's training text (lower-cased, punctuation split) first\n"
               "  --ref FILE      references in the corpus's form: print corpus BLEU-4 and chrF2 on stderr,\n"
               "                  scored on the model's tokenized output\n"
               "  --tokenized     write the output as the model writes it (the corpus's form, words split with\n"
               "                  spaces), not joined back into plain text\n"
               "  --score         with --ref: print log p(ref | src) of each pair instead of translating\n"
               "  --beam K        beam size, 0 to 1000 (default 5; 0 = greedy)\n"
               "  --lenpen A      length penalty: score / length^A, A in [0, 10] (default 1.0)\n"
               "  --batch-size N  sentences decoded together, 1 to 1048576 (default 64)\n"
               "  --device D      auto | cpu | cuda: where the model runs (default auto: cuda when a GPU is\n"
               "                  visible)\n"
               "  --dtype T       fp32 | bf16: GEMM precision (default bf16 on cuda, fp32 on cpu)\n");
}

int main(int argc, char **argv) {
    const char *model_dir = NULL, *src_path = NULL, *ref_path = NULL;
    int beam = 5, batch = 64, score = 0, tokenized = 0;
    float lenpen = 1.0f;
    DeviceChoice device = DEVICE_AUTO;
    Dtype dtype = DTYPE_F32;
    bool dtype_given = false;
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'}, {"src", required_argument, 0, 's'},
        {"ref", required_argument, 0, 'r'},   {"score", no_argument, 0, 'S'},
        {"beam", required_argument, 0, 'b'},  {"lenpen", required_argument, 0, 'l'},
        {"batch-size", required_argument, 0, 'B'}, {"device", required_argument, 0, 'd'},
        {"dtype", required_argument, 0, 't'},     {"help", no_argument, 0, 'h'},
        {"tokenized", no_argument, 0, 'T'},
        {0, 0, 0, 0},
    };
    int c;
    long v;
    double d;
    char perr[256];
    if (flags_check_exact("translate_mt", argc, argv, opts)) return 2;  // exact names, one-line refusals
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case 'm': model_dir = optarg; break;
        case 's': src_path = optarg; break;
        case 'r': ref_path = optarg; break;
        case 'S': score = 1; break;
        case 'T': tokenized = 1; break;
        case 'b':
            bad = parse_int("--beam", optarg, 0, MAX_BEAM, &v, perr, sizeof perr);
            if (!bad) beam = (int)v;
            break;
        case 'l':
            bad = parse_double("--lenpen", optarg, 0.0, MAX_LENPEN, &d, perr, sizeof perr);
            if (!bad) lenpen = (float)d;
            break;
        case 'B':
            bad = parse_int("--batch-size", optarg, 1, MAX_BATCH, &v, perr, sizeof perr);
            if (!bad) batch = (int)v;
            break;
        case 'd':
            if (device_choice_parse(optarg, &device)) {
                fprintf(stderr, "translate_mt: --device must be auto, cpu or cuda, got '%s'\n", optarg);
                return 2;
            }
            break;
        case 't':
            if (dtype_parse(optarg, &dtype)) {
                fprintf(stderr, "translate_mt: --dtype must be fp32 or bf16, got '%s'\n", optarg);
                return 2;
            }
            dtype_given = true;
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (bad) {
            fprintf(stderr, "translate_mt: %s\n", perr);
            return 2;
        }
    }
    if (!model_dir || optind < argc) {
        usage(stderr);
        return 2;
    }
    if (score && !ref_path) {
        fprintf(stderr, "translate_mt: --score needs --ref (the targets to score)\n");
        return 2;
    }
    char err[1024];
    if (!dtype_given) dtype = device == DEVICE_CUDA || (device == DEVICE_AUTO && backend_cuda_available(NULL))
                                  ? DTYPE_BF16 : DTYPE_F32;
    Backend *be = backend_create(device, dtype, 0, err, sizeof err);  // one process: the first visible GPU
    if (!be) {
        fprintf(stderr, "translate_mt: %s\n", err);
        return 2;
    }
    MtModel mt;
    if (mt_load_on(&mt, be, model_dir, err, sizeof err)) {
        fprintf(stderr, "translate_mt: %s\n", err);
        backend_destroy(be);
        return 1;
    }
    const int max_pieces = mt.model.cfg.max_len - 1;
    const TextNorm *norm = &mt.model.cfg.text;
    if (!norm->recorded)
        fprintf(stderr, "translate_mt: %s does not record its training text's form (saved before the record "
                "existed): assuming small_parallel_enja's, English lower-cased with punctuation split, Japanese "
                "words split with spaces\n", model_dir);
    Lines src, ref = {0};
    if (load_lines(src_path, &src)) return 1;
    if (ref_path && load_lines(ref_path, &ref)) return 1;
    if (ref_path && ref.n != src.n) {
        fprintf(stderr, "translate_mt: %s has %d lines but %s has %d\n", src_path ? src_path : "<stdin>", src.n,
                ref_path, ref.n);
        return 1;
    }
    int *src_len = NULL, *ref_len = NULL;
    int32_t **src_ids = encode_all(mt.spm, norm, &src, &src_len, max_pieces, src_path ? src_path : "<stdin>");
    int rc = 0;
    if (score) {
        int32_t **ref_ids = encode_all(mt.spm, NULL, &ref, &ref_len, max_pieces, ref_path);
        double *s = TP_MALLOC((size_t)(src.n > 0 ? src.n : 1) * sizeof(double));
        mt_score_ids(&mt.model, (const int32_t *const *)src_ids, src_len, (const int32_t *const *)ref_ids, ref_len,
                     src.n, batch, s);
        for (int i = 0; i < src.n; i++) printf("%.6f\n", s[i]);
        for (int i = 0; i < ref.n; i++) free(ref_ids[i]);
        free(ref_ids);
        free(s);
    } else {
        Hypotheses h;
        mt_translate_ids(&mt.model, (const int32_t *const *)src_ids, src_len, src.n, beam, lenpen, batch, &h);
        BleuStats bs;
        ChrfStats cs;
        bleu_init(&bs);
        chrf_init(&cs);
        for (int i = 0; i < src.n; i++) {
            char *text = spm_decode(mt.spm, h.hyp[i], h.len[i]);
            TP_CHECK(text, "the tokenizer failed to decode output %d", i + 1);
            if (tokenized) {
                printf("%s\n", text);
            } else {
                char *plain = textnorm_detok(norm, text);
                printf("%s\n", plain);
                free(plain);
            }
            if (ref_path) {
                bleu_add(&bs, text, ref.line[i]);
                chrf_add(&cs, text, ref.line[i]);
            }
            free(text);
        }
        if (ref_path) {
            double bp, p[4];
            double bleu = bleu_score(&bs, &bp, p);
            fprintf(stderr, "BLEU = %.2f %.1f/%.1f/%.1f/%.1f (BP = %.3f, hyp_len = %ld, ref_len = %ld)\n", bleu,
                    100 * p[0], 100 * p[1], 100 * p[2], 100 * p[3], bp, bs.hyp_len, bs.ref_len);
            double cp, cr;
            double chrf = chrf_score(&cs, &cp, &cr);
            fprintf(stderr, "chrF2 = %.2f (character 1..%d-grams: P = %.1f, R = %.1f)\n", chrf, CHRF_ORDER, 100 * cp,
                    100 * cr);
        }
        hypotheses_free(&h);
    }
    if (fflush(stdout) != 0) {
        fprintf(stderr, "translate_mt: writing the output failed\n");
        rc = 1;
    }
    for (int i = 0; i < src.n; i++) free(src_ids[i]);
    free(src_ids);
    free(src_len);
    free(ref_len);
    free_lines(&src);
    free_lines(&ref);
    mt_free(&mt);
    backend_destroy(be);
    return rc;
}
