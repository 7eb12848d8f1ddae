/* textnorm.h: how a model's training text was normalized, so plain text a
 * user types is brought into the same form and the output given back as
 * plain text.
 *
 * small_parallel_enja is not raw text: its English was tokenized (Stanford
 * tokenizer: punctuation and clitics split off as words, "don 't",
 * "o 'clock", "station ?") and lower-cased; its Japanese was split into
 * words by KyTea, with spaces. A model trained on it has only seen that
 * form: "Where is the station?" is another sentence to it than "where is
 * the station ?". train_mt measures the form on the training text
 * (textnorm_detect) and saves it with the model (config.json's "text" and
 * the checkpoint manifest's config); translate_mt brings its input into it
 * (textnorm_source) and joins the output back (textnorm_detok).
 *
 * The source rules are the corpus's English ones; a Japanese source is only
 * mapped as far as a character rule can (quotes, ASCII case): its word
 * segmentation needs the corpus's segmenter. Both functions are idempotent
 * on text already in the corpus's form, which is why a model saved before
 * the record existed can be assumed to be in it (textnorm_assumed).
 */
#ifndef TPTRAIN_TEXTNORM_H
#define TPTRAIN_TEXTNORM_H

#include <stdbool.h>
#include <stddef.h>

typedef enum { TEXT_LANG_NONE = 0, TEXT_LANG_EN, TEXT_LANG_JA } TextLang;

typedef struct {
    bool recorded;        // false: the model predates the record, textnorm_assumed's values
    TextLang source, target;
    bool lowercase;       // the source side is lower-cased
    bool split_punct;     // the source side has punctuation and clitics as words of their own
    bool target_spaced;   // the target side is split into words with spaces (joined back for output)
} TextNorm;

/* "en", "ja", "none" and back; -1 for another name. */
const char *text_lang_name(TextLang l);
int text_lang_parse(const char *s, TextLang *out);

/* What a model without the record is taken to have: small_parallel_enja's
 * en->ja form (lower-cased, split, a spaced target), recorded = false. */
TextNorm textnorm_assumed(void);

/* No normalization at all (synthetic tasks: ids, not text). */
TextNorm textnorm_none(void);

/* Measures the form of a training pair of files (one sentence per line):
 * lower-cased when at most TEXTNORM_CASED_FRACTION of the source's ASCII
 * letters are capitals; split when at least TEXTNORM_SPLIT_FRACTION of its
 * . , ? ! ; : stand alone between spaces; the target spaced when (Japanese)
 * at least TEXTNORM_SPACED_FRACTION of its lines have a space between two
 * non-ASCII characters, or (English) when its punctuation stands alone as
 * the source's does. 0, or -1 + err naming the file. */
int textnorm_detect(const char *src_path, const char *tgt_path, TextLang source, TextLang target, TextNorm *out,
                    char *err, size_t err_len);

/* The measurements behind textnorm_detect, one side's counts, so a corpus
 * read once (data/corpus.c, line by line) can keep them with its token
 * files and a later start decides the form without reading the text.
 * textnorm_count_line adds one non-empty line (after CR stripping). */
typedef struct {
    long upper, letters;       // ASCII letters
    long marks, alone;         // . , ? ! ; : in all / standing between spaces or line ends
    long lines, spaced_lines;  // lines / lines with a space between two non-ASCII characters
} TextFormCount;

void textnorm_count_line(const char *line, size_t n, TextFormCount *f);
/* into += x (the counts of several corpora are their sum). */
void textnorm_count_add(TextFormCount *into, const TextFormCount *x);
/* textnorm_detect's decision from the two sides' counts. */
TextNorm textnorm_from_counts(const TextFormCount *src, const TextFormCount *tgt, TextLang source, TextLang target);

/* A line of user text in the model's source form (malloc'ed). */
char *textnorm_source(const TextNorm *t, const char *line);

/* A line of model output as plain text (malloc'ed): for a spaced Japanese
 * target the spaces go, except those between two Latin-script letters or
 * digits ("new york", "ｃｄ ２"); for a spaced English target punctuation
 * and clitics join their word again ("don 't ." -> "don't."). Unchanged
 * when the target is not spaced. */
char *textnorm_detok(const TextNorm *t, const char *text);

#endif
