/* harness.c: checks, device buffers and comparisons of test_backend_ops
 * (harness.h explains the scheme). */
#include "harness.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"

static int g_n_checks, g_n_failures;

void tcheck(bool ok, const char *file, int line, const char *fmt, ...) {
    g_n_checks++;
    if (ok) return;
    g_n_failures++;
    fprintf(stderr, "FAIL %s:%d: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
}

int tcheck_failures(void) { return g_n_failures; }

int tcheck_report(const char *name) {
    if (g_n_checks == 0) {
        fprintf(stderr, "%s: no checks ran\n", name);
        return 1;
    }
    printf("%s: %d checks, %d failed\n", name, g_n_checks, g_n_failures);
    return g_n_failures ? 1 : 0;
}

double tol(const Target *t, double gpu_tol) { return t->is_cpu ? 0.0 : gpu_tol; }

/* ---- buffers ---------------------------------------------------------------------- */

float *dev_from(const Target *t, const float *h, size_t n) {
    float *d = backend_alloc(t->be, (n ? n : 1) * sizeof(float), MEM_ACT);
    backend_upload(t->be, d, h, n * sizeof(float));
    return d;
}

int32_t *dev_from_i32(const Target *t, const int32_t *h, size_t n) {
    int32_t *d = backend_alloc(t->be, (n ? n : 1) * sizeof(int32_t), MEM_ACT);
    backend_upload(t->be, d, h, n * sizeof(int32_t));
    return d;
}

uint16_t *dev_bits(const Target *t, const float *xb, size_t n) {
    uint16_t *h = TP_MALLOC((n ? n : 1) * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &xb[i], 4);
        h[i] = (uint16_t)(u >> 16);  // a bf16 value: the low half is zero
    }
    uint16_t *d = backend_alloc(t->be, (n ? n : 1) * sizeof(uint16_t), MEM_ACT);
    backend_upload(t->be, d, h, n * sizeof(uint16_t));
    free(h);
    return d;
}

float *dev_fetch_bits(const Target *t, const uint16_t *d, size_t n) {
    uint16_t *h = TP_MALLOC((n ? n : 1) * sizeof(uint16_t));
    backend_download(t->be, h, d, n * sizeof(uint16_t));
    float *f = TP_MALLOC((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        const uint32_t u = (uint32_t)h[i] << 16;
        memcpy(&f[i], &u, 4);
    }
    free(h);
    return f;
}

uint16_t *dev_nan_bits(const Target *t, size_t n) {
    uint16_t *h = TP_MALLOC((n ? n : 1) * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) h[i] = 0x7fc0;  // a quiet NaN
    uint16_t *d = backend_alloc(t->be, (n ? n : 1) * sizeof(uint16_t), MEM_ACT);
    backend_upload(t->be, d, h, n * sizeof(uint16_t));
    free(h);
    return d;
}

float *dev_nan(const Target *t, size_t n) {
    float *h = TP_MALLOC((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = NAN;
    float *d = dev_from(t, h, n);  // queued on the backend's stream: ordered before the op
    free(h);
    return d;
}

float *dev_fetch(const Target *t, const float *d, size_t n) {
    float *h = host_alloc(n);
    backend_download(t->be, h, d, n * sizeof(float));  // waits for the ops queued before
    return h;
}

void dev_free(const Target *t, void *d) { backend_free(t->be, d); }

float *host_copy(const float *src, size_t n) {
    float *x = TP_MALLOC((n ? n : 1) * sizeof(float));
    if (n) memcpy(x, src, n * sizeof(float));
    return x;
}

float *host_alloc(size_t n) { return TP_CALLOC(n ? n : 1, sizeof(float)); }

float ref_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return x;  // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1u);                 // round to nearest, ties to even
    u &= 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

float *host_bf16(const float *x, size_t n) {
    float *y = TP_MALLOC((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) y[i] = ref_bf16(x[i]);
    return y;
}

float *host_abs(const float *x, size_t n) {
    float *y = TP_MALLOC((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) y[i] = fabsf(x[i]);
    return y;
}

/* ---- comparisons ------------------------------------------------------------------ */

void check_exact(const Target *t, const char *what, const float *got, const float *want, size_t n) {
    size_t n_bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(got + i, want + i, sizeof(float)) != 0 && n_bad++ == 0) first = i;
    TCHECK(n_bad == 0, "%s: %s: %zu of %zu elements differ, first [%zu]: got %.9g want %.9g", t->name, what, n_bad,
           n, first, n_bad ? (double)got[first] : 0.0, n_bad ? (double)want[first] : 0.0);
}

void check_attn_grads16(const Target *t, const char *what, uint16_t *const d_h[3], float *const d_f[3],
                        const size_t n[3]) {
    static const char *names[3] = {"dq16", "dk16", "dv16"};
    for (int i = 0; i < 3; i++) {
        float *got = dev_fetch_bits(t, d_h[i], n[i]), *want = dev_fetch(t, d_f[i], n[i]);
        for (size_t e = 0; e < n[i]; e++) want[e] = ref_bf16(want[e]);
        char full[256];
        snprintf(full, sizeof full, "%s %s = bf16 of the fp32 form", what, names[i]);
        check_exact(t, full, got, want, n[i]);
        free(got), free(want);
    }
}

void check_rel(const Target *t, const char *what, const float *got, const float *want, const float *start,
               size_t n, double rtol) {
    double scale = 0.0, err = 0.0;
    size_t worst = 0;
    for (size_t i = 0; i < n; i++) {
        double s = start ? start[i] : 0.0;
        double dw = (double)want[i] - s, dg = (double)got[i] - s;
        if (fabs(dw) > scale) scale = fabs(dw);
        double e = fabs(dg - dw);
        if (!(e <= err)) {  // NaN counts as the worst
            err = isnan(e) ? INFINITY : e;
            worst = i;
        }
    }
    TCHECK(scale >= MIN_SIGNAL, "%s: %s: compared values are all below %g (max %g)", t->name, what, MIN_SIGNAL,
           scale);
    TCHECK(err <= rtol * scale, "%s: %s: max error %.3g > %.1g * %.3g at [%zu]: got %.9g want %.9g", t->name, what,
           err, rtol, scale, worst, n ? (double)got[worst] : 0.0, n ? (double)want[worst] : 0.0);
}

double rel_err(const float *got, const float *want, const float *start, size_t n) {
    double scale = 0.0, err = 0.0;
    for (size_t i = 0; i < n; i++) {
        double s = start ? start[i] : 0.0;
        double dw = (double)want[i] - s, e = fabs((double)got[i] - want[i]);
        if (isnan(e)) return INFINITY;
        if (fabs(dw) > scale) scale = fabs(dw);
        if (e > err) err = e;
    }
    return scale > 0.0 ? err / scale : err;
}

void check_exact_where(const Target *t, const char *what, const float *got, const float *want,
                       const unsigned char *mask, size_t n) {
    size_t n_bad = 0, n_set = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        if (!mask[i]) continue;
        n_set++;
        if (memcmp(got + i, want + i, sizeof(float)) != 0 && n_bad++ == 0) first = i;
    }
    TCHECK(n_bad == 0, "%s: %s: %zu of %zu selected elements differ, first [%zu]: got %.9g want %.9g", t->name, what,
           n_bad, n_set, first, n_bad ? (double)got[first] : 0.0, n_bad ? (double)want[first] : 0.0);
}

size_t terms_violations(const float *got, const float *want, const float *mag, size_t n, double rtol) {
    size_t n_bad = 0;
    for (size_t i = 0; i < n; i++) n_bad += !(fabs((double)got[i] - want[i]) <= rtol * mag[i]);
    return n_bad;
}

void check_terms(const Target *t, const char *what, const float *got, const float *want, const float *mag, size_t n,
                 double rtol) {
    size_t first = n;
    double worst = 0.0;  // error over its bound
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]), r = mag[i] > 0 ? e / (rtol * mag[i]) : e > 0 ? INFINITY : 0.0;
        if (first == n && terms_violations(got + i, want + i, mag + i, 1, rtol)) first = i;
        if (!(r <= worst)) worst = isnan(r) ? INFINITY : r;
    }
    const size_t n_bad = terms_violations(got, want, mag, n, rtol);
    TCHECK(n_bad == 0, "%s: %s: %zu of %zu beyond %.3g of their terms' magnitude (worst %.3g of it), first [%zu]: "
           "got %.9g want %.9g (terms %.3g)", t->name, what, n_bad, n, rtol, worst * rtol, first,
           n_bad ? (double)got[first] : 0.0, n_bad ? (double)want[first] : 0.0, n_bad ? (double)mag[first] : 0.0);
}

void check_close(const Target *t, const char *what, const float *got, const float *want, size_t n, double rtol,
                 double atol) {
    size_t n_bad = 0, first = 0;
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]);
        if (!(e <= atol + rtol * fabs((double)want[i])) && n_bad++ == 0) first = i;
        if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
    }
    TCHECK(n_bad == 0, "%s: %s: %zu of %zu beyond tolerance (worst %.3g), first [%zu]: got %.9g want %.9g", t->name,
           what, n_bad, n, worst, first, n_bad ? (double)got[first] : 0.0, n_bad ? (double)want[first] : 0.0);
}
