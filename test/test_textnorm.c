/* test_textnorm.c: the training text's form (data/textnorm.h): plain
 * English brought into small_parallel_enja's form (case, punctuation,
 * clitics, quotes), the corpus's own lines left as they are, Japanese and
 * English output joined back into plain text, the form measured on corpus
 * and raw files, and its record in config JSON (absent: assumed). With the
 * corpus folder as argument, every line of its train.en is checked too. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "data/textnorm.h"
#include "transformer/config.h"

/* A corpus line may be changed by the rules this often at most: the
 * corpus's tokenizer split some abbreviations our rules keep ("so do i."). */
#define MAX_CHANGED_CORPUS_FRACTION 0.005

static void check_source(const TextNorm *t, const char *in, const char *want) {
    char *got = textnorm_source(t, in);
    CHECK(strcmp(got, want) == 0, "source '%s': got '%s', want '%s'", in, got, want);
    char *again = textnorm_source(t, got);
    CHECK(strcmp(again, got) == 0, "not idempotent: '%s' -> '%s'", got, again);
    free(again);
    free(got);
}

static void check_detok(const TextNorm *t, const char *in, const char *want) {
    char *got = textnorm_detok(t, in);
    CHECK(strcmp(got, want) == 0, "detok '%s': got '%s', want '%s'", in, got, want);
    free(got);
}

static void test_source(void) {
    const TextNorm t = textnorm_assumed();
    check_source(&t, "Where is the station?", "where is the station ?");
    check_source(&t, "where is the station ?", "where is the station ?");
    check_source(&t, "I can't tell who'll arrive first.", "i can 't tell who 'll arrive first .");
    check_source(&t, "He said to me, 'Let's play catch.'", "he said to me , ' let 's play catch . '");
    check_source(&t, "It's 3.5 miles, about 1,000 yards!", "it 's 3.5 miles , about 1,000 yards !");
    check_source(&t, "The movie starts at ten o'clock;", "the movie starts at ten o 'clock ;");
    check_source(&t, "After ten minutes' walk we came to the museum.", "after ten minutes ' walk we came to the museum .");
    check_source(&t, "Mr. Brown lives in the U.S.", "mr. brown lives in the u.s.");
    check_source(&t, "Wait...", "wait ...");
    check_source(&t, "  Don\u2019t   go (please)\u201d  ", "don 't go ( please ) ''");
    check_source(&t, "He said, \"It's nine o'clock.\"", "he said , '' it 's nine o 'clock . ''");
    check_source(&t, "She is good-natured, isn't she?", "she is good-natured , isn 't she ?");
    check_source(&t, "Tokyo\tIS big", "tokyo is big");
    const TextNorm cased = {.recorded = true, .source = TEXT_LANG_EN, .target = TEXT_LANG_JA, .split_punct = true};
    check_source(&cased, "Where is Tokyo?", "Where is Tokyo ?");
    const TextNorm none = textnorm_none();
    check_source(&none, "Where is Tokyo?", "Where is Tokyo?");
}

static void test_detok(void) {
    const TextNorm ja = textnorm_assumed();
    check_detok(&ja, "駅 は どこ で す か 。", "駅はどこですか。");
    check_detok(&ja, "new york に 行 き た い", "new yorkに行きたい");
    check_detok(&ja, "ｃｄ を ２ 枚 買 っ た", "ｃｄを２枚買った");
    check_detok(&ja, "１ ２ 人", "１ ２人");
    check_detok(&ja, "  私 は  学生 で す 。 ", "私は学生です。");
    const TextNorm en = {.recorded = true, .source = TEXT_LANG_JA, .target = TEXT_LANG_EN, .lowercase = true,
                         .split_punct = true, .target_spaced = true};
    check_detok(&en, "i can 't tell who 'll arrive first .", "i can't tell who'll arrive first.");
    check_detok(&en, "he said , ( maybe ) yes !", "he said, (maybe) yes!");
    const TextNorm none = textnorm_none();
    check_detok(&none, "a b c", "a b c");
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "cannot write %s", path);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static void test_detect(void) {
    char dir[] = "/tmp/test_textnorm_XXXXXX", en[64], ja[64], raw_en[64], raw_ja[64], err[512];
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(en, sizeof en, "%s/c.en", dir);
    snprintf(ja, sizeof ja, "%s/c.ja", dir);
    snprintf(raw_en, sizeof raw_en, "%s/r.en", dir);
    snprintf(raw_ja, sizeof raw_ja, "%s/r.ja", dir);
    write_file(en, "where is the station ?\ni can 't tell , really .\nmr. brown is here .\nyes , it is .\n"
                   "no , it is not !\nreally ?\nwhy ?\n");
    write_file(ja, "駅 は どこ で す か 。\n本当 に 分か り ま せ ん 。\nブラウン さん は ここ で す 。\nはい 。\n"
                   "いいえ 。\n本当 ？\nなぜ ？\n");
    write_file(raw_en, "Where is the station?\nI can't tell, really.\nMr. Brown is here.\nYes, it is.\n"
                       "No, it is not!\nReally?\nWhy?\n");
    write_file(raw_ja, "駅はどこですか。\n本当に分かりません。\nブラウンさんはここです。\nはい。\nいいえ。\n本当？\nなぜ？\n");
    TextNorm t;
    CHECK(textnorm_detect(en, ja, TEXT_LANG_EN, TEXT_LANG_JA, &t, err, sizeof err) == 0, "%s", err);
    CHECK(t.recorded && t.lowercase && t.split_punct && t.target_spaced && t.source == TEXT_LANG_EN &&
              t.target == TEXT_LANG_JA, "corpus form: lc %d split %d spaced %d", t.lowercase, t.split_punct,
          t.target_spaced);
    CHECK(textnorm_detect(raw_en, raw_ja, TEXT_LANG_EN, TEXT_LANG_JA, &t, err, sizeof err) == 0, "%s", err);
    CHECK(!t.lowercase && !t.split_punct && !t.target_spaced, "raw text: lc %d split %d spaced %d", t.lowercase,
          t.split_punct, t.target_spaced);
    CHECK(textnorm_detect(ja, en, TEXT_LANG_JA, TEXT_LANG_EN, &t, err, sizeof err) == 0 && t.target_spaced,
          "an English target in the corpus's form is spaced");
    CHECK(textnorm_detect("/nonexistent/x.en", ja, TEXT_LANG_EN, TEXT_LANG_JA, &t, err, sizeof err) == -1 &&
              strstr(err, "/nonexistent/x.en"), "a missing file is named: %s", err);
    unlink(en), unlink(ja), unlink(raw_en), unlink(raw_ja), rmdir(dir);
}

static void test_json(void) {
    ModelConfig c, back;
    char err[512];
    CHECK(config_preset("tiny", &c, err, sizeof err) == 0, "%s", err);
    c.text = (TextNorm){.recorded = true, .source = TEXT_LANG_JA, .target = TEXT_LANG_EN, .lowercase = true,
                        .split_punct = false, .target_spaced = true};
    char *json = config_to_json(&c);
    CHECK(config_from_json(json, &back, err, sizeof err) == 0, "%s", err);
    CHECK(memcmp(&back.text, &c.text, sizeof c.text) == 0, "the text record did not round-trip: %s", json);
    /* an older config: no "text", the corpus's form assumed and not written back */
    char *cut = strstr(json, ",\n\t\"text\"");
    CHECK(cut != NULL, "no text record in %s", json);
    if (cut) strcpy(cut, "\n}");
    CHECK(config_from_json(json, &back, err, sizeof err) == 0 && !back.text.recorded && back.text.lowercase &&
              back.text.split_punct && back.text.target_spaced && back.text.target == TEXT_LANG_JA,
          "an older config: %s", err);
    char *again = config_to_json(&back);
    CHECK(strstr(again, "\"text\"") == NULL, "an assumed form was written as if recorded");
    free(again);
    free(json);
    const char *bad = "{\"format\": \"tptrain-model\", \"format_version\": 1, \"d_model\": 32, \"n_heads\": 4, "
                      "\"d_ff\": 64, \"enc_layers\": 1, \"dec_layers\": 1, \"vocab_size\": 64, \"max_len\": 16, "
                      "\"dropout\": 0, \"label_smoothing\": 0.1, \"activation\": \"relu\", \"ln_eps\": 1e-5, "
                      "\"pad_id\": 0, \"bos_id\": 2, \"eos_id\": 3, \"unk_id\": 1, \"text\": {\"source\": \"fr\"}}";
    CHECK(config_from_json(bad, &back, err, sizeof err) == -1 && strstr(err, "'text'"), "a bad record: %s", err);
}

/* The corpus's own lines are already in its form: the rules leave them. */
static void test_corpus(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/train.en", dir);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL, "cannot open %s", path);
    if (!f) return;
    const TextNorm t = textnorm_assumed();
    char *line = NULL;
    size_t cap = 0;
    long n = 0, changed = 0;
    ssize_t got;
    while ((got = getline(&line, &cap, f)) > 0) {
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = '\0';
        char *norm = textnorm_source(&t, line);
        if (strcmp(norm, line) != 0 && changed++ < 5) printf("  changed: '%s' -> '%s'\n", line, norm);
        free(norm);
        n++;
    }
    free(line);
    fclose(f);
    printf("%s: %ld of %ld lines changed by the source rules\n", path, changed, n);
    CHECK(n > 0 && (double)changed <= MAX_CHANGED_CORPUS_FRACTION * (double)n, "%ld of %ld corpus lines changed",
          changed, n);
}

int main(int argc, char **argv) {
    test_source();
    test_detok();
    test_detect();
    test_json();
    if (argc > 1 && argv[1][0]) test_corpus(argv[1]);
    return check_report("test_textnorm");
}
