/* flags_show.c: what the flag table shows (see flags.h): --help grouped by
 * group, the effective value of a flag as text, and the echo of the whole
 * configuration as a text block and as JSON. Apart from parsing so that
 * either can be read alone; both walk the same table, so a flag added to
 * it is parsed, documented and echoed at once. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "flags.h"
#include "parse.h"

#define HELP_WIDTH 100  // --help lines are wrapped at this column
#define HELP_COL 25     // where the help text starts, after "  --name METAVAR"

/* The shortest %g form of v that reads back as the same value of its type
 * (a float field shows 0.002, not 0.00200000009). */
static void real_text(double v, bool is_float, char *buf, size_t len) {
    for (int digits = 6; digits <= 17; digits++) {
        snprintf(buf, len, "%.*g", digits, v);
        const double back = strtod(buf, NULL);
        if (is_float ? (float)back == (float)v : back == v) return;
    }
}

/* Choice name of stored value v, or "" when none stores it. */
static void choice_name(const Flag *f, int v, char *buf, size_t len) {
    buf[0] = '\0';
    const char *p = f->choices;
    for (int i = 0; p; i++) {
        const char *bar = strchr(p, '|');
        const int stores = f->values ? f->values[i] : i;
        if (stores == v) {
            const size_t n = bar ? (size_t)(bar - p) : strlen(p);
            snprintf(buf, len, "%.*s", (int)n, p);
            return;
        }
        p = bar ? bar + 1 : NULL;
    }
}

void flags_value_text(const Flag *f, const void *args, char *buf, size_t len) {
    buf[0] = '\0';
    if (f->show) {
        f->show(args, f, buf, len);
        return;
    }
    const char *at = (const char *)args + f->offset;
    double num = 0.0;
    switch (f->field) {
    case FIELD_NONE: return;
    case FIELD_STR: {
        const char *s = *(const char *const *)at;
        snprintf(buf, len, "%s", s ? s : "");
        return;
    }
    case FIELD_INT: num = *(const int *)at; break;
    case FIELD_U64: num = (double)*(const unsigned long long *)at; break;
    case FIELD_FLOAT: num = *(const float *)at; break;
    case FIELD_DOUBLE: num = *(const double *)at; break;
    case FIELD_BOOL: num = *(const bool *)at; break;
    }
    if (f->kind == FLAG_CHOICE) choice_name(f, (int)num, buf, len);
    else if (f->kind == FLAG_SWITCH) snprintf(buf, len, "%s", num != 0.0 ? "true" : "");
    else if (f->field == FIELD_U64) snprintf(buf, len, "%llu", *(const unsigned long long *)at);
    else if (f->field == FIELD_FLOAT || f->field == FIELD_DOUBLE) real_text(num, f->field == FIELD_FLOAT, buf, len);
    else snprintf(buf, len, "%.0f", num);
}

/* Writes text wrapped at HELP_WIDTH from column col (at HELP_COL, nothing
 * written there yet), continuation lines indented to HELP_COL. */
static void wrap(FILE *f, const char *text, int col) {
    bool fresh = true;  // nothing written on this line after the indent
    for (const char *p = text; *p;) {
        while (*p == ' ') p++;
        if (!*p) break;
        const char *end = p;
        while (*end && *end != ' ') end++;
        const int word = (int)(end - p);
        if (!fresh && col + 1 + word > HELP_WIDTH) {
            fprintf(f, "\n%*s", HELP_COL, "");
            col = HELP_COL;
            fresh = true;
        }
        if (!fresh) {
            fputc(' ', f);
            col++;
        }
        fprintf(f, "%.*s", word, p);
        col += word;
        fresh = false;
        p = end;
    }
    fputc('\n', f);
}

/* Whether v, a value text of f, is a setting: not empty, and a number in
 * the flag's range (outside it, 0 for --epochs, is the program's "not set",
 * which a user could not type). */
static bool is_set(const Flag *f, const char *v) {
    if (!v[0]) return false;
    if ((f->kind != FLAG_INT && f->kind != FLAG_REAL) || f->show) return true;
    const double x = atof(v);
    const bool lo_ok = (f->open & PARSE_LO_OPEN) ? x > f->lo : x >= f->lo;
    const bool hi_ok = (f->open & PARSE_HI_OPEN) ? x < f->hi : x <= f->hi;
    return lo_ok && hi_ok;
}

/* The help line's tail: "(default X; N in [lo, hi])" as far as known. */
static void help_tail(const Flag *f, const void *defaults, char *buf, size_t len) {
    char d[256] = "", range[128] = "";
    if (f->dflt) snprintf(d, sizeof d, "default %s", f->dflt);
    else if (f->dflt_note) snprintf(d, sizeof d, "default %s", f->dflt_note);
    else if (defaults) {
        char v[200];
        flags_value_text(f, defaults, v, sizeof v);
        if (f->kind != FLAG_SWITCH && is_set(f, v)) snprintf(d, sizeof d, "default %s", v);
    }
    if (f->kind == FLAG_INT) snprintf(range, sizeof range, "%.0f to %.0f", f->lo, f->hi);
    if (f->kind == FLAG_REAL)
        snprintf(range, sizeof range, "in %c%g, %g%c", (f->open & PARSE_LO_OPEN) ? '(' : '[', f->lo, f->hi,
                 (f->open & PARSE_HI_OPEN) ? ')' : ']');
    buf[0] = '\0';
    if (d[0] || range[0]) snprintf(buf, len, "(%s%s%s)", d, d[0] && range[0] ? "; " : "", range);
}

static void help_flag(FILE *out, const Flag *f, const void *defaults) {
    char head[160], tail[512], text[2048];
    /* a choice shows its choices, whatever its metavar */
    const char *mv = f->kind == FLAG_SWITCH ? NULL : f->kind == FLAG_CHOICE ? f->choices : f->metavar ? f->metavar : "X";
    snprintf(head, sizeof head, "  --%s%s%s", f->name, mv ? " " : "", mv ? mv : "");
    help_tail(f, defaults, tail, sizeof tail);
    snprintf(text, sizeof text, "%s%s%s", f->help ? f->help : "", tail[0] ? " " : "", tail);
    const int col = (int)strlen(head);
    fputs(head, out);
    if (col >= HELP_COL - 1) fprintf(out, "\n%*s", HELP_COL, "");
    else fprintf(out, "%*s", HELP_COL - col, "");
    wrap(out, text, HELP_COL);
}

static const char *group_of(const Flag *f) { return f->group ? f->group : "Options"; }

/* Whether entry i is the first of its group: groups are shown in the order
 * they first appear, each with all its flags wherever they stand. */
static bool group_first(const FlagTable *t, int i) {
    for (int k = 0; k < i; k++)
        if (strcmp(group_of(&t->flags[k]), group_of(&t->flags[i])) == 0) return false;
    return true;
}

void flags_help(FILE *f, const FlagTable *t, const void *defaults) {
    fputs(t->usage, f);
    for (int i = 0; i < t->n; i++) {
        if (!group_first(t, i)) continue;
        const char *g = group_of(&t->flags[i]);
        fprintf(f, "%s:\n", g);
        for (int k = i; k < t->n; k++)
            if (strcmp(group_of(&t->flags[k]), g) == 0) help_flag(f, &t->flags[k], defaults);
    }
    fprintf(f, "  --help                 this text\n");
    if (t->epilog) fputs(t->epilog, f);
}

void flags_echo(FILE *f, const FlagTable *t, const void *args) {
    fprintf(f, "%s: configuration\n", t->prog);
    for (int i = 0; i < t->n; i++) {
        if (!group_first(t, i)) continue;
        const char *g = group_of(&t->flags[i]);
        int shown = 0;
        for (int k = i; k < t->n; k++) {
            const Flag *fk = &t->flags[k];
            if (strcmp(group_of(fk), g) != 0) continue;
            char v[512];
            flags_value_text(fk, args, v, sizeof v);
            if (!is_set(fk, v)) continue;
            if (shown++ == 0) fprintf(f, "  %-12s", g);
            if (fk->kind == FLAG_SWITCH) fprintf(f, " --%s", fk->name);
            else if (strchr(v, ' ') || strchr(v, '|')) fprintf(f, " --%s '%s'", fk->name, v);
            else fprintf(f, " --%s %s", fk->name, v);
        }
        if (shown) fputc('\n', f);
    }
}

/* Whether text is a whole JSON number (as real_text and %.0f write them). */
static bool json_number(const char *s) {
    char *end;
    if (!*s) return false;
    strtod(s, &end);
    return *end == '\0' && (s[0] == '-' || (s[0] >= '0' && s[0] <= '9'));
}

char *flags_echo_json(const FlagTable *t, const void *args) {
    cJSON *o = cJSON_CreateObject();
    TP_CHECK(o, "out of memory writing the configuration");
    for (int i = 0; i < t->n; i++) {
        const Flag *f = &t->flags[i];
        char v[512];
        flags_value_text(f, args, v, sizeof v);
        cJSON *item;
        if (f->kind == FLAG_SWITCH) item = cJSON_CreateBool(v[0] != '\0');
        else if (!is_set(f, v)) item = cJSON_CreateNull();  // not set, or a setter's flag without show
        else if (f->kind != FLAG_STRING && f->kind != FLAG_CHOICE && json_number(v)) item = cJSON_CreateRaw(v);
        else item = cJSON_CreateString(v);
        TP_CHECK(item, "out of memory writing the configuration");
        cJSON_AddItemToObject(o, f->name, item);
    }
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    TP_CHECK(text, "out of memory writing the configuration");
    return text;
}
