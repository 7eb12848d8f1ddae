/* textnorm.c: the corpus's text form, measured, applied and undone (see
 * textnorm.h). Byte-level rules on UTF-8: every rule looks at ASCII
 * punctuation, ASCII letters and whole code points, so a multi-byte
 * character is never cut. Strings grow at most 3x (a space on each side of
 * every byte), so each function sizes its output once. */
#include "data/textnorm.h"

#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "fileio.h"

/* Thresholds of textnorm_detect: a handful of stray capitals (names an
 * annotator missed) or attached marks (abbreviations "mr.", "u.s.") must
 * not flip a corpus's form, while raw text is far past them. */
#define TEXTNORM_CASED_FRACTION 0.001
#define TEXTNORM_SPLIT_FRACTION 0.9
#define TEXTNORM_SPACED_FRACTION 0.5

const char *text_lang_name(TextLang l) { return l == TEXT_LANG_EN ? "en" : l == TEXT_LANG_JA ? "ja" : "none"; }

int text_lang_parse(const char *s, TextLang *out) {
    if (strcmp(s, "en") == 0) *out = TEXT_LANG_EN;
    else if (strcmp(s, "ja") == 0) *out = TEXT_LANG_JA;
    else if (strcmp(s, "none") == 0) *out = TEXT_LANG_NONE;
    else return -1;
    return 0;
}

TextNorm textnorm_assumed(void) {
    return (TextNorm){.recorded = false, .source = TEXT_LANG_EN, .target = TEXT_LANG_JA, .lowercase = true,
                      .split_punct = true, .target_spaced = true};
}

TextNorm textnorm_none(void) { return (TextNorm){.recorded = true}; }

/* ---- code points ------------------------------------------------------------ */

/* The code point starting at s (n bytes of it in *len); invalid bytes are
 * taken one at a time as themselves. */
static uint32_t cp_at(const unsigned char *s, int *len) {
    if (s[0] < 0x80) return *len = 1, s[0];
    int n = s[0] >= 0xf0 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc0 ? 2 : 1;
    uint32_t c = n == 1 ? s[0] : (uint32_t)(s[0] & (0x3f >> (n - 1)));
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80) return *len = 1, s[0];
        c = (c << 6) | (s[i] & 0x3f);
    }
    return *len = n, c;
}

/* The code point ending just before s[end] (start in *start). */
static uint32_t cp_before(const unsigned char *s, size_t end, size_t *start) {
    size_t b = end - 1;
    while (b > 0 && (s[b] & 0xc0) == 0x80 && end - b < 4) b--;
    int len;
    uint32_t c = cp_at(s + b, &len);
    if (b + (size_t)len != end) b = end - 1, c = s[end - 1];
    *start = b;
    return c;
}

/* Latin-script letters and digits: ASCII, Latin-1 and Latin Extended-A/B
 * letters, full-width Latin letters and digits. */
static bool latin_word_char(uint32_t c) {
    return (c < 0x80 && isalnum((int)c)) || (c >= 0xc0 && c <= 0x24f && c != 0xd7 && c != 0xf7) ||
           (c >= 0xff10 && c <= 0xff19) || (c >= 0xff21 && c <= 0xff3a) || (c >= 0xff41 && c <= 0xff5a);
}

/* ---- measuring a corpus --------------------------------------------------------- */

static bool is_mark(unsigned char c) { return c && strchr(".,?!;:", c) != NULL; }

void textnorm_count_line(const char *line, size_t n, TextFormCount *f) {
    const unsigned char *s = (const unsigned char *)line;
    bool spaced = false;
    for (size_t i = 0; i < n; i++) {
        if (isalpha(s[i])) f->letters++, f->upper += isupper(s[i]) != 0;
        if (is_mark(s[i])) {
            f->marks++;
            f->alone += (i == 0 || s[i - 1] == ' ') && (i + 1 == n || s[i + 1] == ' ');
        }
        if (s[i] == ' ' && i > 0 && i + 1 < n && s[i - 1] >= 0x80 && s[i + 1] >= 0x80) spaced = true;
    }
    f->lines++;
    f->spaced_lines += spaced;
}

void textnorm_count_add(TextFormCount *into, const TextFormCount *x) {
    into->upper += x->upper;
    into->letters += x->letters;
    into->marks += x->marks;
    into->alone += x->alone;
    into->lines += x->lines;
    into->spaced_lines += x->spaced_lines;
}

static int count_file(const char *path, TextFormCount *f, char *err, size_t err_len) {
    memset(f, 0, sizeof *f);
    size_t n_bytes = 0;
    char *text = read_file_bytes(path, &n_bytes, err, err_len);
    if (!text) return -1;
    size_t start = 0;
    for (size_t i = 0; i <= n_bytes; i++)
        if (i == n_bytes || text[i] == '\n') {
            size_t end = i;
            if (end > start && text[end - 1] == '\r') end--;
            if (end > start) textnorm_count_line(text + start, end - start, f);
            start = i + 1;
        }
    free(text);
    return 0;
}

static bool split_form(const TextFormCount *f) { return f->marks == 0 || (double)f->alone >= TEXTNORM_SPLIT_FRACTION * (double)f->marks; }

int textnorm_detect(const char *src_path, const char *tgt_path, TextLang source, TextLang target, TextNorm *out,
                    char *err, size_t err_len) {
    TextFormCount s, t;
    if (count_file(src_path, &s, err, err_len) || count_file(tgt_path, &t, err, err_len)) return -1;
    *out = textnorm_from_counts(&s, &t, source, target);
    return 0;
}

TextNorm textnorm_from_counts(const TextFormCount *s, const TextFormCount *t, TextLang source, TextLang target) {
    TextNorm out = {.recorded = true, .source = source, .target = target};
    out.lowercase = (double)s->upper <= TEXTNORM_CASED_FRACTION * (double)s->letters;
    out.split_punct = split_form(s);
    out.target_spaced = target == TEXT_LANG_JA
                            ? (double)t->spaced_lines >= TEXTNORM_SPACED_FRACTION * (double)(t->lines ? t->lines : 1)
                            : split_form(t);
    return out;
}

/* ---- the source form ---------------------------------------------------------- */

typedef struct {
    char *s;
    size_t n;
} Out;

static void put(Out *o, const char *p, size_t n) {
    memcpy(o->s + o->n, p, n);
    o->n += n;
}

/* A word boundary: one space between words, none at the start. */
static void space(Out *o) {
    if (o->n > 0 && o->s[o->n - 1] != ' ') o->s[o->n++] = ' ';
}

static void word(Out *o, const char *p, size_t n) {
    if (n == 0) return;
    space(o);
    put(o, p, n);
}

static bool lead_mark(char c) { return c && strchr("\"'([{.,?!;:", c) != NULL; }
static bool trail_mark(char c) { return c && strchr("\"')]}.,?!;:", c) != NULL; }
static bool inner_mark(char c) { return c && strchr(",?!;:()[]{}", c) != NULL; }

/* Abbreviations the corpus keeps with their period ("mr.", "u.s.", "p.m."). */
static bool abbreviation(const char *w, size_t n) {
    static const char *const k[] = {"mr", "mrs", "ms", "dr", "st", "jr", "vs", "no"};
    if (n < 2 || w[n - 1] != '.') return false;
    if (memchr(w, '.', n - 1)) return true;  // u.s. p.m. o.k.
    for (size_t i = 0; i < sizeof k / sizeof *k; i++)
        if (strlen(k[i]) == n - 1 && strncasecmp(w, k[i], n - 1) == 0) return true;
    return false;
}

/* The middle of a word: marks between letters become words; an apostrophe
 * between letters starts a clitic ("don't" -> "don 't", "o'clock"). */
static void split_core(Out *o, const char *w, size_t n) {
    size_t start = 0;
    for (size_t i = 0; i < n; i++) {
        const bool digits = i > 0 && i + 1 < n && isdigit((unsigned char)w[i - 1]) && isdigit((unsigned char)w[i + 1]);
        if (inner_mark(w[i]) && !(digits && (w[i] == ',' || w[i] == ':'))) {
            word(o, w + start, i - start);
            word(o, w + i, 1);
            start = i + 1;
        } else if (w[i] == '\'' && i > start && i + 1 < n && isalpha((unsigned char)w[i + 1])) {
            word(o, w + start, i - start);
            start = i;
        }
    }
    word(o, w + start, n - start);
}

/* A clitic the corpus writes as a word of its own ("'t", "'ll", "o 'clock"):
 * its apostrophe is not a quotation mark. */
static bool clitic(const char *w, size_t n) {
    static const char *const k[] = {"'t", "'s", "'m", "'d", "'ll", "'ve", "'re", "'clock", "'em"};
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) {
        const size_t len = strlen(k[i]);
        if (n >= len && strncmp(w, k[i], len) == 0 && (n == len || !isalpha((unsigned char)w[len]))) return true;
    }
    return false;
}

/* One space-separated word in the corpus's English form. */
static void split_word(Out *o, const char *w, size_t n) {
    size_t a = 0, b = n;
    while (a < b && lead_mark(w[a]) && !(w[a] == '.' && b - a >= 3 && strncmp(w + a, "...", 3) == 0) &&
           !(w[a] == '\'' && clitic(w + a, b - a))) {
        const size_t len = b - a >= 2 && strncmp(w + a, "''", 2) == 0 ? 2 : 1;  // the corpus's double quote
        word(o, w + a, len);
        a += len;
    }
    size_t tail[32], n_tail = 0;  // where trailing marks start, in reverse (each runs to the next)
    while (b > a && trail_mark(w[b - 1]) && n_tail < sizeof tail / sizeof *tail) {
        if (w[b - 1] == '.' && b - a >= 3 && strncmp(w + b - 3, "...", 3) == 0) break;
        if (w[b - 1] == '.' && abbreviation(w + a, b - a)) break;
        b -= b - a >= 2 && strncmp(w + b - 2, "''", 2) == 0 ? 2 : 1;
        tail[n_tail++] = b;
    }
    const size_t end = n;
    if (b - a >= 3 && strncmp(w + b - 3, "...", 3) == 0) {  // "wait..." -> "wait ..."
        split_core(o, w + a, b - a - 3);
        word(o, "...", 3);
    } else {
        split_core(o, w + a, b - a);
    }
    for (size_t k = n_tail; k > 0; k--) word(o, w + tail[k - 1], (k > 1 ? tail[k - 2] : end) - tail[k - 1]);
}

/* Quotes as the corpus writes them: curly single ones (a phone's keyboard
 * types them) straight, every double quote as two apostrophes. */
static const char *straighten(const unsigned char *s, int *len) {
    uint32_t c = cp_at(s, len);
    if (c == 0x2018 || c == 0x2019) return "'";
    if (c == 0x201c || c == 0x201d || c == '"') return "''";
    return NULL;
}

char *textnorm_source(const TextNorm *t, const char *line) {
    const size_t n = strlen(line);
    char *flat = malloc(2 * n + 1);
    TP_CHECK(flat, "out of memory normalizing a line");
    size_t m = 0;
    for (size_t i = 0; i < n;) {  // quotes straightened, ASCII case folded, tabs as spaces
        int len;
        const char *q = straighten((const unsigned char *)line + i, &len);
        if (q) {
            memcpy(flat + m, q, strlen(q)), m += strlen(q);
        } else if (len == 1) {
            char c = line[i] == '\t' ? ' ' : line[i];
            flat[m++] = t->lowercase && c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c;
        } else {
            memcpy(flat + m, line + i, (size_t)len), m += (size_t)len;
        }
        i += (size_t)len;
    }
    flat[m] = '\0';
    Out o = {.s = malloc(3 * m + 1), .n = 0};
    TP_CHECK(o.s, "out of memory normalizing a line");
    const bool split = t->split_punct && t->source == TEXT_LANG_EN;
    for (size_t i = 0; i < m;) {
        while (i < m && flat[i] == ' ') i++;
        size_t j = i;
        while (j < m && flat[j] != ' ') j++;
        if (j > i) {
            if (split) split_word(&o, flat + i, j - i);
            else word(&o, flat + i, j - i);
        }
        i = j;
    }
    o.s[o.n] = '\0';
    free(flat);
    return o.s;
}

/* ---- the target as plain text ------------------------------------------------------ */

/* Japanese: a space stays only between two Latin-script letters or digits. */
static char *detok_ja(const char *text) {
    const unsigned char *s = (const unsigned char *)text;
    const size_t n = strlen(text);
    char *out = malloc(n + 1);
    TP_CHECK(out, "out of memory joining a line");
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != ' ') {
            out[m++] = (char)s[i];
            continue;
        }
        size_t j = i;
        while (j < n && s[j] == ' ') j++;
        if (m > 0 && j < n) {
            size_t start;
            int len;
            const uint32_t before = cp_before((const unsigned char *)out, m, &start), after = cp_at(s + j, &len);
            if (latin_word_char(before) && latin_word_char(after)) out[m++] = ' ';
        }
        i = j - 1;
    }
    out[m] = '\0';
    return out;
}

/* English: marks and clitics join the word before them, opening marks the
 * word after them. */
static char *detok_en(const char *text) {
    const size_t n = strlen(text);
    Out o = {.s = malloc(n + 1), .n = 0};
    TP_CHECK(o.s, "out of memory joining a line");
    bool glue_next = false;
    for (size_t i = 0; i < n;) {
        while (i < n && text[i] == ' ') i++;
        size_t j = i;
        while (j < n && text[j] != ' ') j++;
        if (j == i) break;
        const size_t len = j - i;
        const bool closing = (len == 1 && strchr(".,?!;:)]}%", text[i])) || (len == 3 && strncmp(text + i, "...", 3) == 0) ||
                             (len >= 2 && text[i] == '\'' && isalpha((unsigned char)text[i + 1])) ||
                             (len == 3 && strncmp(text + i, "n't", 3) == 0);
        if (o.n > 0 && !closing && !glue_next) o.s[o.n++] = ' ';
        put(&o, text + i, len);
        glue_next = len == 1 && strchr("([{$", text[i]);
        i = j;
    }
    o.s[o.n] = '\0';
    return o.s;
}

char *textnorm_detok(const TextNorm *t, const char *text) {
    if (t->target_spaced && t->target == TEXT_LANG_JA) return detok_ja(text);
    if (t->target_spaced && t->target == TEXT_LANG_EN) return detok_en(text);
    char *copy = strdup(text);
    TP_CHECK(copy, "out of memory copying a line");
    return copy;
}
