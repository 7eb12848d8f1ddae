/* xent.c: label-smoothed cross-entropy over full logit rows on the CPU.
 *
 * Per row, with lse = log sum_v exp(x_v):
 *   -log p_y = lse - x_y,   (1/V) sum_v -log p_v = lse - mean_v(x_v),
 * so loss = (1-eps)(lse - x_y) + eps (lse - mean(x)): one max pass and one
 * exp-sum pass (in double), never materialising log-probabilities. The lse is
 * saved so backward needs a single pass. Rows whose target is ignore_id give
 * loss 0 and no gradient.
 */
#include <math.h>

#include "cpu_ops.h"
#include "err.h"

int cpu_xent_fwd(float *losses,           // (N)
                float *lse,              // (N)
                const float *logits,     // (N, V)
                const int32_t *targets,  // (N)
                int N, int V, float eps, int32_t ignore_id) {
    int n_valid = 0;
    for (int n = 0; n < N; n++) {
        int32_t y = targets[n];
        if (y == ignore_id) {
            losses[n] = 0.0f;
            lse[n] = 0.0f;
            continue;
        }
        TP_CHECK(y >= 0 && y < V, "op_xent_fwd: target %d outside [0, %d)", (int)y, V);
        const float *row = logits + (size_t)n * V;
        float max = row[0];
        for (int v = 1; v < V; v++)
            if (row[v] > max) max = row[v];
        double sum_exp = 0.0, sum_x = 0.0;
        for (int v = 0; v < V; v++) {
            sum_exp += expf(row[v] - max);
            sum_x += row[v];
        }
        double row_lse = max + log(sum_exp);
        double nll = row_lse - row[y];
        double smooth = row_lse - sum_x / V;
        losses[n] = (float)((1.0 - eps) * nll + eps * smooth);
        lse[n] = (float)row_lse;
        n_valid++;
    }
    return n_valid;
}

void cpu_xent_bwd(float *dlogits,         // (N, V) accumulated
                 const float *logits,    // (N, V)
                 const float *lse,       // (N)
                 const int32_t *targets, // (N)
                 float dloss, int N, int V, float eps, int32_t ignore_id) {
    float smooth = eps / (float)V;
    for (int n = 0; n < N; n++) {
        int32_t y = targets[n];
        if (y == ignore_id) continue;
        const float *row = logits + (size_t)n * V;
        float *drow = dlogits + (size_t)n * V;
        for (int v = 0; v < V; v++) {
            float p = expf(row[v] - lse[n]);
            float target = (v == y ? 1.0f - eps : 0.0f) + smooth;
            drow[v] += dloss * (p - target);
        }
    }
}
