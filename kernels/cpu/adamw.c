/* adamw.c: the AdamW update on the CPU, element by element.
 *
 * Written in the same order of operations as torch.optim.AdamW (single
 * tensor, no amsgrad): decay the weight first, update the moments, then step
 * by lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps). The bias
 * corrections are computed once per call in double.
 */
#include <math.h>

#include "cpu_ops.h"
#include "err.h"

void cpu_adamw(float *p,        // (n_elems) parameters, updated
              const float *g,  // (n_elems) gradients
              float *m,        // (n_elems) first moment, updated
              float *v,        // (n_elems) second moment, updated
              size_t n_elems, float lr, float beta1, float beta2, float eps,
              float wd, int t) {
    TP_CHECK(t >= 1, "op_adamw: step t = %d, must be >= 1", t);
    double bias1 = 1.0 - pow(beta1, t);
    double bias2 = 1.0 - pow(beta2, t);
    float step_size = (float)(lr / bias1);
    float inv_sqrt_bias2 = (float)(1.0 / sqrt(bias2));
    float decay = 1.0f - lr * wd;
    for (size_t i = 0; i < n_elems; i++) {
        float gi = g[i];
        float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        float denom = sqrtf(vi) * inv_sqrt_bias2 + eps;
        p[i] = p[i] * decay - step_size * mi / denom;
        m[i] = mi;
        v[i] = vi;
    }
}

void cpu_adamw_segs(float *p, const float *g, float *m, float *v, const OpSeg *segs, int n_segs, float lr,
                    float beta1, float beta2, float eps, float wd, int t) {
    TP_CHECK(t >= 1, "op_adamw_segs: step t = %d, must be >= 1", t);
    for (int i = 0; i < n_segs; i++) {
        const OpSeg *s = &segs[i];
        cpu_adamw(p + s->x_at, g + s->g_at, m + s->s_at, v + s->s_at, (size_t)s->n, lr, beta1, beta2, eps,
                  s->decay ? wd : 0.0f, t);
    }
}
