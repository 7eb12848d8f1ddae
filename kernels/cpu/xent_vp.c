/* xent_vp.c: the vocabulary-parallel cross-entropy, split into the pieces a
 * tensor-parallel caller interleaves with its reductions (ops.h explains
 * the protocol). Sums are accumulated in double; padding columns past
 * V_valid are never read. */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

#include "err.h"
#include "cpu_ops.h"

void cpu_xent_vp_max(float *row_max, const float *logits, int N, int V_local, int V_valid) {
    for (int n = 0; n < N; n++) {
        const float *row = logits + (size_t)n * V_local;
        float mx = -INFINITY;
        for (int v = 0; v < V_valid; v++) mx = row[v] > mx ? row[v] : mx;
        row_max[n] = mx;
    }
}

void cpu_xent_vp_sums(float *stats, const float *logits, const float *row_max, const int32_t *targets, int N,
                     int V_local, int V_valid, int vocab_start, int32_t ignore_id) {
    for (int n = 0; n < N; n++) {
        const float *row = logits + (size_t)n * V_local;
        float *st = stats + (size_t)n * 3;
        if (targets[n] == ignore_id) {
            st[0] = st[1] = st[2] = 0.0f;
            continue;
        }
        double sum_exp = 0.0, sum_x = 0.0;
        for (int v = 0; v < V_valid; v++) {
            sum_exp += expf(row[v] - row_max[n]);
            sum_x += row[v];
        }
        int local = targets[n] - vocab_start;
        st[0] = (float)sum_exp;
        st[1] = (float)sum_x;
        st[2] = (local >= 0 && local < V_valid) ? row[local] : 0.0f;
    }
}

int cpu_xent_vp_loss(float *losses, float *lse, const float *row_max, const float *stats, const int32_t *targets,
                    int N, int V, float eps, int32_t ignore_id) {
    int n_valid = 0;
    for (int n = 0; n < N; n++) {
        if (targets[n] == ignore_id) {
            losses[n] = 0.0f;
            lse[n] = 0.0f;
            continue;
        }
        TP_CHECK(targets[n] >= 0 && targets[n] < V, "op_xent_vp_loss: target %d outside [0, %d)", (int)targets[n],
                 V);
        const float *st = stats + (size_t)n * 3;
        double row_lse = (double)row_max[n] + log((double)st[0]);
        double nll = row_lse - st[2];
        double smooth = row_lse - (double)st[1] / V;
        losses[n] = (float)((1.0 - eps) * nll + eps * smooth);
        lse[n] = (float)row_lse;
        n_valid++;
    }
    return n_valid;
}

/* One row's gradient over its V_valid real columns, dloss * (softmax -
 * smoothed target): added to drow, or with in_place (drow == row) written
 * over the logits it is computed from. */
static void grad_row(float *drow, const float *row, float lse, int local, int V_valid, float dloss, float eps,
                     float smooth, bool in_place) {
    for (int v = 0; v < V_valid; v++) {
        float p = expf(row[v] - lse);
        float target = (v == local ? 1.0f - eps : 0.0f) + smooth;
        float g = dloss * (p - target);
        drow[v] = in_place ? g : drow[v] + g;
    }
}

void cpu_xent_vp_grad_inplace(float *logits, const float *lse, const int32_t *targets, float dloss, int N, int V_local,
                              int V_valid, int vocab_start, int V, float eps, int32_t ignore_id) {
    const float smooth = eps / (float)V;
    for (int n = 0; n < N; n++) {
        float *row = logits + (size_t)n * V_local;
        const int valid = targets[n] == ignore_id ? 0 : V_valid;  // an ignored row: all zero
        grad_row(row, row, lse[n], targets[n] - vocab_start, valid, dloss, eps, smooth, true);
        for (int v = valid; v < V_local; v++) row[v] = 0.0f;
    }
}

void cpu_xent_vp_bwd(float *dlogits, const float *logits, const float *lse, const int32_t *targets, float dloss,
                    int N, int V_local, int V_valid, int vocab_start, int V, float eps, int32_t ignore_id) {
    const float smooth = eps / (float)V;
    for (int n = 0; n < N; n++) {
        if (targets[n] == ignore_id) continue;
        grad_row(dlogits + (size_t)n * V_local, logits + (size_t)n * V_local, lse[n], targets[n] - vocab_start,
                 V_valid, dloss, eps, smooth, false);
    }
}

/* ---- the same on bf16 logits -------------------------------------------------
 * Each row is widened (exactly) into a buffer and handed to the fp32 op as a
 * one-row call: the very arithmetic, so the fp32 op's bits. */

static float *row_buffer(int V_local) { return TP_MALLOC((size_t)(V_local > 0 ? V_local : 1) * sizeof(float)); }

void cpu_xent_vp_max16(float *row_max, const uint16_t *logits16, int N, int V_local, int V_valid) {
    float *row = row_buffer(V_local);
    for (int n = 0; n < N; n++) {
        cpu_from_bf16(row, logits16 + (size_t)n * V_local, (size_t)V_valid);
        cpu_xent_vp_max(row_max + n, row, 1, V_local, V_valid);
    }
    free(row);
}

void cpu_xent_vp_sums16(float *stats, const uint16_t *logits16, const float *row_max, const int32_t *targets, int N,
                        int V_local, int V_valid, int vocab_start, int32_t ignore_id) {
    float *row = row_buffer(V_local);
    for (int n = 0; n < N; n++) {
        cpu_from_bf16(row, logits16 + (size_t)n * V_local, (size_t)V_valid);
        cpu_xent_vp_sums(stats + (size_t)n * 3, row, row_max + n, targets + n, 1, V_local, V_valid, vocab_start,
                         ignore_id);
    }
    free(row);
}

void cpu_xent_vp_grad_inplace16(uint16_t *logits16, const float *lse, const int32_t *targets, float dloss, int N,
                                int V_local, int V_valid, int vocab_start, int V, float eps, int32_t ignore_id) {
    float *row = row_buffer(V_local);
    for (int n = 0; n < N; n++) {
        uint16_t *row16 = logits16 + (size_t)n * V_local;
        cpu_from_bf16(row, row16, (size_t)V_local);
        cpu_xent_vp_grad_inplace(row, lse + n, targets + n, dloss, 1, V_local, V_valid, vocab_start, V, eps,
                                 ignore_id);
        cpu_to_bf16(row16, row, (size_t)V_local);
    }
    free(row);
}
