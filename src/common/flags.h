/* flags.h: every program's command line, declared once as a table.
 *
 * Each flag is one Flag entry: name, kind (integer, real, string, switch,
 * choice), range, default, group, metavar, help, and where its value goes
 * (an offsetof into the program's argument struct, or a setter for the odd
 * ones). From the table come the parsing, `--help` grouped by group, the
 * refusals (each one sentence naming the flag), and the echo of the
 * effective configuration (a text block and a JSON object). A program keeps
 * only what no table can say: its cross-flag rules, in one validate step.
 *
 * Names match exactly: getopt_long's prefixes (--max-step for --max-steps)
 * would let a typo silently become another setting. An unknown flag is one
 * sentence with the nearest known flag:
 *   train_mt: unknown flag --max-stpes; did you mean --max-steps?
 * A flag's value is the next word whatever it looks like (--metrics --x),
 * or the part after '='.
 */
#ifndef TPTRAIN_FLAGS_H
#define TPTRAIN_FLAGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* The known name (without dashes) nearest to `name` (without dashes) by
 * edit distance, or NULL when none is close enough to be a typo of it. */
const char *flag_nearest(const char *name, const char *const *known, int n_known);

/* Prints "PROG: unknown flag ARG; did you mean --NEAR?" (or "; see PROG
 * --help" when nothing is near) on stderr. arg is the flag as typed; a
 * "=value" part is left out of the message. */
void flag_unknown(const char *prog, const char *arg, const char *const *known, int n_known);

/* ---- the table ------------------------------------------------------------ */

typedef enum {
    FLAG_INT,     // an integer in [lo, hi]
    FLAG_REAL,    // a finite real in lo..hi, ends opened by `open` (PARSE_LO_OPEN, PARSE_HI_OPEN)
    FLAG_STRING,  // any text (a path, a name)
    FLAG_SWITCH,  // no value: present means true
    FLAG_CHOICE,  // one of `choices` ("relu|gelu"); stores values[i] (or i)
} FlagKind;

/* The C type of the field a value is stored into; FIELD_NONE: only the setter. */
typedef enum { FIELD_NONE, FIELD_INT, FIELD_U64, FIELD_FLOAT, FIELD_DOUBLE, FIELD_BOOL, FIELD_STR } FlagField;

typedef struct Flag Flag;

/* A setter for a flag whose value is not one field (--layers sets two, a
 * size in MiB is stored in bytes). `s` is the value as typed, `num` its
 * number (FLAG_INT, FLAG_REAL; the stored value of a FLAG_CHOICE; 1 for a
 * switch), already range-checked. 0, or -1 with one sentence in err. */
typedef int (*FlagSetter)(void *args, const Flag *f, const char *s, double num, char *err, size_t err_len);
/* The effective value of such a flag as text for the echo, or "" to leave it out. */
typedef void (*FlagShow)(const void *args, const Flag *f, char *buf, size_t len);

struct Flag {
    const char *name;     // without dashes
    FlagKind kind;
    const char *group;    // --help's heading ("Model", "Data", ...), in the order of first use
    const char *metavar;  // "N", "DIR"; NULL for a switch
    const char *help;     // one sentence or a few; --help wraps it
    double lo, hi;        // FLAG_INT, FLAG_REAL
    int open;             // FLAG_REAL: PARSE_LO_OPEN | PARSE_HI_OPEN
    const char *choices;  // FLAG_CHOICE: "a|b|c"
    const int *values;    // FLAG_CHOICE: what each choice stores (NULL: its index)
    const char *dflt;     // the default as a user would type it, set by flags_defaults; NULL: none
    const char *dflt_note; // --help's default when the program sets it ("from --preset"); NULL: dflt
    size_t offset;        // where the value goes in the argument struct
    FlagField field;
    FlagSetter set;       // instead of storing at offset
    FlagShow show;        // the echo of a setter's flag
};

/* The field type of a struct member, for FLAG_AT. */
#define FLAG_FIELD_OF(T, m)                                                                                         \
    _Generic(((T *)0)->m, int: FIELD_INT, unsigned long long: FIELD_U64, float: FIELD_FLOAT, double: FIELD_DOUBLE, \
             bool: FIELD_BOOL, const char *: FIELD_STR, default: FIELD_INT)
/* .offset and .field of member m of struct T, for an initializer. */
#define FLAG_AT(T, m) .offset = offsetof(T, m), .field = FLAG_FIELD_OF(T, m)

/* Parsing options. */
enum {
    FLAGS_UNDERSCORE = 1,  // '-' and '_' alike in names, shown with '_' (torchrun's --nproc-per-node)
    FLAGS_STOP = 2,        // the first word that is no flag ends the flags (a launcher's PROGRAM ARGS...)
    FLAGS_DASH_H = 4,      // "-h" is --help
};

typedef struct {
    const char *prog;    // the name in every message
    const char *usage;   // --help's first lines (the synopsis), ending in a newline
    const char *epilog;  // --help's last lines, or NULL
    const Flag *flags;
    int n;
    int options;         // FLAGS_*
} FlagTable;

#define FLAGS_MAX 128  // entries of one table

typedef struct {
    int given[FLAGS_MAX];  // per entry: the argv index of its last occurrence, 0 when not given
    char **operands;       // the words that are no flags, in order (FLAGS_STOP: the rest of argv)
    int n_operands;
    bool help;             // --help was given (and printed to stdout)
} FlagsParsed;

/* The entry named `name`, or NULL. */
const Flag *flags_find(const FlagTable *t, const char *name);

/* Sets every entry with a default (dflt) to it, as if typed. 0, or -1
 * after printing (a table whose default is out of its own range). */
int flags_defaults(const FlagTable *t, void *args);

/* Checks the names in argv (exact names, values where needed, no value for
 * a switch) without storing anything: a typo is found before any value is
 * read. 0, or -1 after printing one sentence. */
int flags_check(const FlagTable *t, int argc, char *const *argv);

/* Parses argv into args in order (a later flag wins): flags_check, then
 * each value through the strict parser (common/parse.h) and the table's
 * range. At --help it returns 1 and the caller prints flags_help (args
 * then hold what was parsed before it); 0 ok; -1 after printing one
 * sentence (an operand is no error: the caller judges p->operands). p may
 * be NULL; p->operands points into argv (free with flags_parsed_free). */
int flags_parse(const FlagTable *t, int argc, char **argv, void *args, FlagsParsed *p);
void flags_parsed_free(FlagsParsed *p);

/* The name of the flag among names (NULL-ended) given last on the command
 * line, or NULL when none was given; and whether one flag was given. */
const char *flags_last_given(const FlagTable *t, const FlagsParsed *p, const char *const *names);
bool flags_given(const FlagTable *t, const FlagsParsed *p, const char *name);

/* --help: the usage lines, then each group's flags ("  --name METAVAR",
 * the help wrapped beside it, then the default and the range), then the
 * epilog. defaults (NULL: only dflt texts) supplies the shown default of
 * entries that have neither dflt nor dflt_note. */
void flags_help(FILE *f, const FlagTable *t, const void *defaults);

/* The effective value of an entry as text (a string in no quotes; "" for a
 * NULL string or a switch that is off). */
void flags_value_text(const Flag *f, const void *args, char *buf, size_t len);

/* The echo of the effective configuration: "PROG: configuration" and one
 * line per group of "--name value" pairs, as a user could type them again:
 * switches that are off, unset strings and numbers outside the flag's range
 * (a program's "not set", as 0 for --epochs) are left out. */
void flags_echo(FILE *f, const FlagTable *t, const void *args);

/* The same as one JSON object {"name": value, ...} of every flag: numbers
 * as numbers, switches as booleans, what the text leaves out as null.
 * Returns malloc'd text. */
char *flags_echo_json(const FlagTable *t, const void *args);

#endif
