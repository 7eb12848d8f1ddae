/* test_flags.c: the flag table (common/flags.h) on a small table of every
 * kind: parsing (each kind, "=value", a later flag winning, operands),
 * range and choice refusals, exact names with the nearest-flag sentence,
 * --help grouped by group with defaults and ranges, the launcher's options
 * (FLAGS_STOP, FLAGS_UNDERSCORE, -h), and the configuration echo as text and
 * JSON. The programs' own tables are checked end to end by cli_input,
 * tprun and readme_flags. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "flags.h"
#include "parse.h"

typedef struct {
    int count;
    float rate;
    double limit_bytes;
    const char *name;
    bool verbose;
    int mode;
    unsigned long long seed;
    const char *out;
    int a, b;  // --both sets the two
} Args;

static int set_both(void *args, const Flag *f, const char *s, double num, char *err, size_t err_len) {
    (void)f, (void)s, (void)err, (void)err_len;
    ((Args *)args)->a = ((Args *)args)->b = (int)num;
    return 0;
}
static int set_limit(void *args, const Flag *f, const char *s, double num, char *err, size_t err_len) {
    (void)f, (void)s, (void)err, (void)err_len;
    ((Args *)args)->limit_bytes = num * 1024.0;
    return 0;
}
static void show_limit(const void *args, const Flag *f, char *buf, size_t len) {
    (void)f;
    snprintf(buf, len, "%g", ((const Args *)args)->limit_bytes / 1024.0);
}

static const int MODE_VALUES[] = {10, 20, 30};
static const Flag FLAGS[] = {
    {.name = "count", .kind = FLAG_INT, .group = "Model", .metavar = "N", .help = "how many", .lo = 1, .hi = 100,
     .dflt = "5", FLAG_AT(Args, count)},
    {.name = "rate", .kind = FLAG_REAL, .group = "Training", .metavar = "R", .help = "a rate", .lo = 0, .hi = 1,
     .open = PARSE_LO_OPEN, FLAG_AT(Args, rate)},
    {.name = "name", .kind = FLAG_STRING, .group = "Data", .metavar = "S", .help = "a name", FLAG_AT(Args, name)},
    {.name = "verbose", .kind = FLAG_SWITCH, .group = "Model", .help = "say more", FLAG_AT(Args, verbose)},
    {.name = "mode", .kind = FLAG_CHOICE, .group = "Training", .choices = "a|b|c", .values = MODE_VALUES,
     .help = "the mode", .dflt = "a", FLAG_AT(Args, mode)},
    {.name = "seed", .kind = FLAG_INT, .group = "Training", .metavar = "N", .help = "the seed", .lo = 0,
     .hi = 2147483647, .dflt = "1", FLAG_AT(Args, seed)},
    {.name = "out", .kind = FLAG_STRING, .group = "Data", .metavar = "FILE", .help = "where", FLAG_AT(Args, out)},
    {.name = "both", .kind = FLAG_INT, .group = "Model", .metavar = "N", .help = "sets a and b", .lo = 0, .hi = 9,
     .dflt_note = "from the preset", .set = set_both},
    {.name = "limit", .kind = FLAG_REAL, .group = "Model", .metavar = "KIB", .help = "a limit", .lo = 0, .hi = 1e6,
     .open = PARSE_LO_OPEN, .set = set_limit, .show = show_limit},
};
static const FlagTable TABLE = {.prog = "demo", .usage = "usage: demo [options] FILE...\n", .epilog = "the end\n",
                                .flags = FLAGS, .n = sizeof FLAGS / sizeof FLAGS[0]};

/* Runs flags_parse on words (NULL-ended) with stderr captured into err. */
static int parse_words(const FlagTable *t, const char *const *words, Args *a, FlagsParsed *p, char *err,
                       size_t err_len) {
    char *argv[32];
    int argc = 0;
    argv[argc++] = (char *)"demo";
    for (int i = 0; words[i]; i++) argv[argc++] = (char *)words[i];
    argv[argc] = NULL;
    fflush(stderr);
    FILE *tmp = tmpfile();
    const int saved = dup(2);
    dup2(fileno(tmp), 2);
    const int rc = flags_parse(t, argc, argv, a, p);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(tmp);
    const size_t n = fread(err, 1, err_len - 1, tmp);
    err[n] = '\0';
    if (n && err[n - 1] == '\n') err[n - 1] = '\0';
    fclose(tmp);
    return rc;
}

static void defaults(Args *a) {
    memset(a, 0, sizeof *a);
    CHECK(flags_defaults(&TABLE, a) == 0, "defaults refused");
}

/* words are refused with exactly the sentence want. */
static void refused(const char *want, const char *const *words) {
    Args a;
    defaults(&a);
    FlagsParsed p;
    char err[1024];
    const int rc = parse_words(&TABLE, words, &a, &p, err, sizeof err);
    CHECK(rc == -1 && strcmp(err, want) == 0, "rc %d, stderr '%s', want '%s'", rc, err, want);
    flags_parsed_free(&p);
}

static void test_kinds(void) {
    Args a;
    defaults(&a);
    CHECK(a.count == 5 && a.mode == 10 && a.seed == 1 && !a.name && !a.verbose, "defaults: %d %d %llu", a.count,
          a.mode, a.seed);
    FlagsParsed p;
    char err[1024];
    const char *w[] = {"--count", "7",    "in1",     "--rate=0.25", "--name", "x",     "--verbose", "--mode", "c",
                       "--seed",  "123",  "--both", "4",           "--limit", "2",     "--count",   "9",     "in2",
                       "--",      "--x",  NULL};
    int rc = parse_words(&TABLE, w, &a, &p, err, sizeof err);
    CHECK(rc == 0, "rc %d: %s", rc, err);
    CHECK(a.count == 9, "the later --count wins: %d", a.count);
    CHECK(a.rate == 0.25f && strcmp(a.name, "x") == 0 && a.verbose && a.mode == 30 && a.seed == 123ULL, "values");
    CHECK(a.a == 4 && a.b == 4 && a.limit_bytes == 2048.0, "setters: %d %d %g", a.a, a.b, a.limit_bytes);
    CHECK(p.n_operands == 3 && strcmp(p.operands[0], "in1") == 0 && strcmp(p.operands[1], "in2") == 0 &&
              strcmp(p.operands[2], "--x") == 0,
          "operands: %d", p.n_operands);
    CHECK(flags_given(&TABLE, &p, "rate") && !flags_given(&TABLE, &p, "out"), "given");
    static const char *const pair[] = {"both", "rate", NULL};
    const char *last = flags_last_given(&TABLE, &p, pair);
    CHECK(last && strcmp(last, "both") == 0, "last given: %s", last ? last : "none");
    static const char *const none[] = {"out", NULL};
    CHECK(flags_last_given(&TABLE, &p, none) == NULL, "none given");
    flags_parsed_free(&p);
    const char *h[] = {"--count", "3", "--help", "--count", "4", NULL};
    rc = parse_words(&TABLE, h, &a, &p, err, sizeof err);
    CHECK(rc == 1 && p.help && a.count == 3, "--help: rc %d, count %d", rc, a.count);
    flags_parsed_free(&p);
}

static void test_refusals(void) {
    refused("demo: --count expects an integer in [1, 100], got '101'", (const char *[]){"--count", "101", NULL});
    refused("demo: --count expects an integer in [1, 100], got '4x'", (const char *[]){"--count=4x", NULL});
    refused("demo: --rate expects a number in (0, 1], got '0'", (const char *[]){"--rate", "0", NULL});
    refused("demo: --rate expects a number in (0, 1], got 'nan'", (const char *[]){"--rate", "nan", NULL});
    refused("demo: --mode must be a, b or c, got 'd'", (const char *[]){"--mode", "d", NULL});
    refused("demo: unknown flag --coutn; did you mean --count?", (const char *[]){"--coutn", "3", NULL});
    refused("demo: unknown flag --coun; did you mean --count?", (const char *[]){"--coun=3", NULL});
    refused("demo: unknown flag --zzzzzzzz; see demo --help", (const char *[]){"--zzzzzzzz", NULL});
    refused("demo: unknown flag -c; see demo --help", (const char *[]){"-c", NULL});
    refused("demo: --verbose takes no value, got '--verbose=1'", (const char *[]){"--verbose=1", NULL});
    refused("demo: --name needs a value", (const char *[]){"--name", NULL});
    /* the names are checked before any value: the typo is named, not the bad number */
    refused("demo: unknown flag --nmae; did you mean --name?", (const char *[]){"--count", "0", "--nmae", "x", NULL});
    /* a value that looks like a flag belongs to the flag before it */
    Args a;
    defaults(&a);
    FlagsParsed p;
    char err[1024];
    CHECK(parse_words(&TABLE, (const char *[]){"--out", "--coutn", NULL}, &a, &p, err, sizeof err) == 0 &&
              strcmp(a.out, "--coutn") == 0,
          "value as flag: %s", err);
    flags_parsed_free(&p);
}

static void test_launcher_options(void) {
    static const Flag F[] = {
        {.name = "nproc_per_node", .kind = FLAG_INT, .metavar = "N", .lo = 1, .hi = 8, FLAG_AT(Args, count)},
        {.name = "standalone", .kind = FLAG_SWITCH, FLAG_AT(Args, verbose)},
    };
    const FlagTable t = {.prog = "run", .usage = "usage: run\n", .flags = F, .n = 2,
                         .options = FLAGS_STOP | FLAGS_UNDERSCORE | FLAGS_DASH_H};
    Args a = {0};
    FlagsParsed p;
    char err[1024];
    int rc = parse_words(&t, (const char *[]){"--nproc-per-node=2", "--standalone", "prog", "--count", "x", NULL}, &a,
                         &p, err, sizeof err);
    CHECK(rc == 0 && a.count == 2 && a.verbose, "rc %d: %s", rc, err);
    CHECK(p.n_operands == 3 && strcmp(p.operands[0], "prog") == 0 && strcmp(p.operands[1], "--count") == 0,
          "the program's own flags are its: %d", p.n_operands);
    flags_parsed_free(&p);
    rc = parse_words(&t, (const char *[]){"--nproc-per-nod=2", "prog", NULL}, &a, &p, err, sizeof err);
    CHECK(rc == -1 && strcmp(err, "run: unknown flag --nproc_per_nod; did you mean --nproc_per_node?") == 0, "'%s'",
          err);
    flags_parsed_free(&p);
    rc = parse_words(&t, (const char *[]){"-h", NULL}, &a, &p, err, sizeof err);
    CHECK(rc == 1 && p.help, "-h: rc %d", rc);
    flags_parsed_free(&p);
}

static char *help_text(const void *defaults_of) {
    FILE *f = tmpfile();
    flags_help(f, &TABLE, defaults_of);
    const long len = ftell(f);
    rewind(f);
    char *text = calloc((size_t)len + 1, 1);
    CHECK(text && fread(text, 1, (size_t)len, f) == (size_t)len, "reading the help back");
    fclose(f);
    return text;
}

static void test_help(void) {
    Args d;
    defaults(&d);
    d.rate = 0.5f;
    char *h = help_text(&d);
    const char *model = strstr(h, "\nModel:\n"), *training = strstr(h, "\nTraining:\n"), *data = strstr(h, "\nData:\n");
    CHECK(strncmp(h, "usage: demo [options] FILE...\n", 30) == 0, "usage first: %.40s", h);
    CHECK(model && training && data && model < training && training < data, "groups in order of first use:\n%s", h);
    /* every flag under its own group, --both (declared after Data's first flag) under Model */
    const char *both = strstr(h, "  --both N"), *count = strstr(h, "  --count N"), *seed = strstr(h, "  --seed N");
    const char *out = strstr(h, "  --out FILE");
    CHECK(both && count && model < count && count < both && both < training, "Model's flags:\n%s", h);
    CHECK(seed && training < seed && seed < data && out && data < out, "Training's and Data's flags:\n%s", h);
    CHECK(strstr(h, "how many (default 5; 1 to 100)"), "the default and range of --count:\n%s", h);
    CHECK(strstr(h, "a rate (default 0.5; in (0, 1])"), "--rate's default from the defaults given:\n%s", h);
    CHECK(strstr(h, "sets a and b (default from the preset; 0 to 9)"), "a default note:\n%s", h);
    CHECK(strstr(h, "  --mode a|b|c"), "a choice's metavar: its choices:\n%s", h);
    CHECK(strstr(h, "  --verbose              say more\n"), "a switch:\n%s", h);
    CHECK(strstr(h, "  --help ") && strstr(h, "the end\n"), "--help and the epilog:\n%s", h);
    free(h);
    d.rate = 0.0f;  // outside (0, 1]: the program's "not set", shown as no default
    h = help_text(&d);
    CHECK(strstr(h, "a rate (in (0, 1])"), "no default outside the range:\n%s", h);
    free(h);
}

static void test_echo(void) {
    Args a;
    defaults(&a);
    FlagsParsed p;
    char err[1024];
    CHECK(parse_words(&TABLE, (const char *[]){"--count", "7", "--rate", "0.002", "--mode", "b", "--limit", "3",
                                               "--name", "two words", NULL},
                      &a, &p, err, sizeof err) == 0,
          "%s", err);
    flags_parsed_free(&p);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    flags_echo(f, &TABLE, &a);
    fclose(f);
    CHECK(strncmp(text, "demo: configuration\n", 20) == 0, "heading: %s", text);
    CHECK(strstr(text, "  Model        --count 7 --limit 3\n"), "Model's line (switch off, no show for --both):\n%s",
          text);
    CHECK(strstr(text, "  Training     --rate 0.002 --mode b --seed 1\n"), "Training's line:\n%s", text);
    CHECK(strstr(text, "  Data         --name 'two words'\n"), "Data's line:\n%s", text);
    free(text);
    char *json = flags_echo_json(&TABLE, &a);
    cJSON *o = cJSON_Parse(json);
    CHECK(o, "not JSON: %s", json);
    if (o) {
        const cJSON *c = cJSON_GetObjectItem(o, "count"), *r = cJSON_GetObjectItem(o, "rate");
        CHECK(cJSON_IsNumber(c) && c->valueint == 7, "count: %s", json);
        CHECK(cJSON_IsNumber(r) && r->valuedouble == 0.002, "rate as typed, not 0.00200000009: %s", json);
        CHECK(cJSON_IsString(cJSON_GetObjectItem(o, "mode")) &&
                  strcmp(cJSON_GetObjectItem(o, "mode")->valuestring, "b") == 0,
              "mode: %s", json);
        CHECK(cJSON_IsFalse(cJSON_GetObjectItem(o, "verbose")), "switch off: %s", json);
        CHECK(cJSON_IsNull(cJSON_GetObjectItem(o, "out")), "unset string: %s", json);
        CHECK(cJSON_IsNumber(cJSON_GetObjectItem(o, "limit")), "a shown setter: %s", json);
        CHECK(cJSON_GetArraySize(o) == TABLE.n, "every flag: %d of %d", cJSON_GetArraySize(o), TABLE.n);
        cJSON_Delete(o);
    }
    free(json);
    a.count = 0;  // outside [1, 100]: "not set", left out of the text, null in JSON
    f = open_memstream(&text, &len);
    flags_echo(f, &TABLE, &a);
    fclose(f);
    CHECK(strstr(text, "  Model        --limit 3\n"), "a number out of range left out:\n%s", text);
    free(text);
    json = flags_echo_json(&TABLE, &a);
    CHECK(strstr(json, "\"count\":null"), "out of range as null: %s", json);
    free(json);
}

int main(void) {
    test_kinds();
    test_refusals();
    test_launcher_options();
    test_help();
    test_echo();
    return check_report("test_flags");
}
