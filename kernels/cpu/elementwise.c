/* elementwise.c: activations, element-wise arithmetic, embedding lookup and
 * sinusoidal positions on the CPU.
 *
 * These are memory-bound one-liners; each is a plain loop so the CUDA kernels
 * have an obvious meaning to match. GELU and the positional table are
 * evaluated in double (erf, exp, sin, cos) and rounded once, which makes this
 * the more accurate side of any CPU/GPU comparison. The embedding skips ids
 * outside this shard's rows, which is what a vocab-parallel embedding needs.
 */
#include <math.h>

#include "bf16.h"
#include "cpu_ops.h"
#include "err.h"

static const double INV_SQRT2 = 0.70710678118654752440;
static const double INV_SQRT_2PI = 0.39894228040143267794;

static inline float act_value(float x, Activation act) {
    if (act == ACT_RELU) return x > 0.0f ? x : 0.0f;
    const double xi = x;
    return (float)(0.5 * xi * (1.0 + erf(xi * INV_SQRT2)));
}

void cpu_act_fwd(float *y,        // (n_elems)
                const float *x,  // (n_elems)
                size_t n_elems, Activation act) {
    for (size_t i = 0; i < n_elems; i++) y[i] = act_value(x[i], act);
}

void cpu_act_fwd16(uint16_t *y16,   // (n_elems) bf16 bits
                   const float *x,  // (n_elems)
                   size_t n_elems, Activation act) {
    for (size_t i = 0; i < n_elems; i++) y16[i] = tp_f32_to_bf16(act_value(x[i], act));
}

void cpu_relu_mask(uint8_t *mask,   // (N, relu_mask_row_bytes(cols))
                   const float *h,  // (N, cols)
                   int N, int cols) {
    const size_t row_bytes = relu_mask_row_bytes(cols);
    for (int n = 0; n < N; n++) {
        uint8_t *row = mask + (size_t)n * row_bytes;
        for (size_t k = 0; k < row_bytes; k++) row[k] = 0;
        for (int j = 0; j < cols; j++)
            if (h[(size_t)n * cols + j] > 0.0f) row[j >> 3] |= (uint8_t)(1u << (j & 7));
    }
}

void cpu_relu_mask_apply(uint16_t *d16,        // (N, cols) bf16 bits
                         const uint8_t *mask,  // (N, relu_mask_row_bytes(cols))
                         int N, int cols) {
    const size_t row_bytes = relu_mask_row_bytes(cols);
    for (int n = 0; n < N; n++) {
        const uint8_t *row = mask + (size_t)n * row_bytes;
        for (int j = 0; j < cols; j++)
            if (!((row[j >> 3] >> (j & 7)) & 1u)) d16[(size_t)n * cols + j] = 0;
    }
}

/* One element of act_bwd: dx += (ReLU: untouched where x <= 0) or = the
 * gradient. */
static inline void act_grad(float *dx, bool add, float dy, float x, Activation act) {
    if (act == ACT_RELU) {
        if (add) {
            if (x > 0.0f) *dx += dy;
        } else {
            *dx = x > 0.0f ? dy : 0.0f;
        }
        return;
    }
    // d/dx [x Phi(x)] = Phi(x) + x phi(x)
    const double xi = x;
    const double cdf = 0.5 * (1.0 + erf(xi * INV_SQRT2));
    const double pdf = INV_SQRT_2PI * exp(-0.5 * xi * xi);
    const float g = (float)(dy * (cdf + xi * pdf));
    *dx = add ? *dx + g : g;
}

void cpu_act_bwd(float *dx,        // (n_elems) accumulated, or written (GRAD_WRITE)
                GradMode mode,
                const float *dy,  // (n_elems)
                const float *x,   // (n_elems)
                size_t n_elems, Activation act) {
    TP_CHECK(grad_mode_valid(mode), "op_act_bwd: unknown gradient mode %d", (int)mode);
    for (size_t i = 0; i < n_elems; i++) act_grad(&dx[i], mode == GRAD_ADD, dy[i], x[i], act);
}

void cpu_act_bwd_x16(float *dx,           // (n_elems) accumulated, or written (GRAD_WRITE)
                     GradMode mode,
                     const float *dy,     // (n_elems)
                     const uint16_t *x16, // (n_elems) bf16 bits
                     size_t n_elems, Activation act) {
    TP_CHECK(grad_mode_valid(mode), "op_act_bwd_x16: unknown gradient mode %d", (int)mode);
    for (size_t i = 0; i < n_elems; i++) act_grad(&dx[i], mode == GRAD_ADD, dy[i], tp_bf16_to_f32(x16[i]), act);
}

void cpu_add(float *out,      // (n_elems), may alias a or b
            const float *a,  // (n_elems)
            const float *b,  // (n_elems)
            size_t n_elems) {
    for (size_t i = 0; i < n_elems; i++) out[i] = a[i] + b[i];
}

void cpu_accumulate(float *y,        // (n_elems)
                   const float *x,  // (n_elems)
                   size_t n_elems) {
    for (size_t i = 0; i < n_elems; i++) y[i] += x[i];
}

void cpu_scale(float *x,  // (n_elems)
              float s, size_t n_elems) {
    for (size_t i = 0; i < n_elems; i++) x[i] *= s;
}

double cpu_sumsq(const float *x,  // (n_elems)
                size_t n_elems) {
    double sum = 0.0;
    for (size_t i = 0; i < n_elems; i++) sum += (double)x[i] * x[i];
    return sum;
}

void cpu_sum_acc(float *acc, const float *x, size_t n_elems) {
    if (n_elems == 0) return;  // adds nothing (and leaves a -0 alone)
    double sum = 0.0;
    for (size_t i = 0; i < n_elems; i++) sum += x[i];
    acc[0] = (float)((double)acc[0] + sum);
}

void cpu_sumsq_acc(float *acc, const float *x, size_t n_elems) {
    if (n_elems == 0) return;
    acc[0] = (float)((double)acc[0] + cpu_sumsq(x, n_elems));
}

void cpu_sumsq_segs(float *acc, const float *x, const OpSeg *segs, int n_segs) {
    for (int i = 0; i < n_segs; i++) cpu_sumsq_acc(acc + segs[i].acc, x + segs[i].x_at, (size_t)segs[i].n);
}

void cpu_clip_coef(float *norm_coef, const float *sumsq, int n_parts, float max_norm) {
    double ss = 0.0;
    for (int i = 0; i < n_parts; i++) ss += sumsq[i];
    float norm = (float)sqrt(ss);
    float coef = max_norm > 0.0f ? max_norm / (norm + 1e-6f) : 1.0f;
    norm_coef[0] = norm;
    norm_coef[1] = coef < 1.0f ? coef : 1.0f;
}

void cpu_scale_by(float *x, const float *s, size_t n_elems) {
    const float f = s[0];
    for (size_t i = 0; i < n_elems; i++) x[i] *= f;
}

void cpu_to_bf16(uint16_t *dst, const float *src, size_t n_elems) {
    for (size_t i = 0; i < n_elems; i++) dst[i] = tp_f32_to_bf16(src[i]);
}

void cpu_from_bf16(float *dst, const uint16_t *src, size_t n_elems) {
    for (size_t i = 0; i < n_elems; i++) dst[i] = tp_bf16_to_f32(src[i]);
}

void cpu_round_bf16(float *x, size_t n_elems) {
    for (size_t i = 0; i < n_elems; i++) x[i] = tp_bf16_round(x[i]);
}

void cpu_embedding_fwd(float *out,           // (N, C)
                      const int32_t *ids,   // (N)
                      const float *table,   // (V_local, C)
                      float scale, int N, int C, int vocab_start, int V_local) {
    for (int n = 0; n < N; n++) {
        float *row = out + (size_t)n * C;
        int local = ids[n] - vocab_start;
        if (local >= 0 && local < V_local) {
            const float *src = table + (size_t)local * C;
            for (int c = 0; c < C; c++) row[c] = scale * src[c];
        } else {
            for (int c = 0; c < C; c++) row[c] = 0.0f;
        }
    }
}

void cpu_embedding_bwd(float *dtable,       // (V_local, C) accumulated
                      const float *dout,   // (N, C)
                      const int32_t *ids,  // (N)
                      float scale, int N, int C, int vocab_start, int V_local) {
    for (int n = 0; n < N; n++) {
        int local = ids[n] - vocab_start;
        if (local < 0 || local >= V_local) continue;
        float *dst = dtable + (size_t)local * C;
        const float *src = dout + (size_t)n * C;
        for (int c = 0; c < C; c++) dst[c] += scale * src[c];
    }
}

void cpu_add_positions(float *x,  // (B, T, C)
                      int B, int T, int C) {
    TP_CHECK(C % 2 == 0, "op_add_positions: C must be even, got %d", C);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < C / 2; i++) {
            double angle = t * pow(10000.0, -(2.0 * i) / C);
            float s = (float)sin(angle), c = (float)cos(angle);
            for (int b = 0; b < B; b++) {
                float *row = x + ((size_t)b * T + t) * C;
                row[2 * i] += s;
                row[2 * i + 1] += c;
            }
        }
}
