/* startup.c: the start-up phases (see startup.h). */
#include "app/startup.h"

#include "clock.h"

void startup_begin(Startup *st) {
    st->n = 0;
    st->t_last = tp_now_s();
    const double age = tp_process_age_s();
    if (age >= 0.0) {
        st->name[0] = "launch";
        st->s[0] = age;
        st->n = 1;
    }
}

void startup_mark(Startup *st, const char *name) {
    if (!st) return;
    const double t = tp_now_s();
    if (st->n < STARTUP_MAX_PHASES) {
        st->name[st->n] = name;
        st->s[st->n++] = t - st->t_last;
    } else {  // (never with train_mt's marks) the rest goes to the last phase
        st->s[st->n - 1] += t - st->t_last;
    }
    st->t_last = t;
}

double startup_total(const Startup *st) {
    double sum = 0.0;
    for (int i = 0; i < st->n; i++) sum += st->s[i];
    return sum;
}

void startup_print(const Startup *st, const char *prog, FILE *f) {
    fprintf(f, "%s: start-up %.2f s:", prog, startup_total(st));
    for (int i = 0; i < st->n; i++) fprintf(f, "%s %s %.2f", i ? "," : "", st->name[i], st->s[i]);
    fputc('\n', f);
}

void startup_json(const Startup *st, char *buf, size_t len) {
    size_t k = (size_t)snprintf(buf, len, ", \"startup_s\": {");
    for (int i = 0; i < st->n && k < len; i++)
        k += (size_t)snprintf(buf + k, len - k, "%s\"%s\": %.4f", i ? ", " : "", st->name[i], st->s[i]);
    if (k < len) snprintf(buf + k, len - k, "}");
}
