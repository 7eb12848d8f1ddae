/* batch.c: allocation of owned batches, shared by every batch source. */
#include "data/batch.h"

#include <string.h>
#include "err.h"

static int32_t *ids(size_t n, int32_t fill) {
    int32_t *p = TP_MALLOC((n ? n : 1) * sizeof(int32_t));
    for (size_t i = 0; i < n; i++) p[i] = fill;
    return p;
}

void owned_batch_alloc(OwnedBatch *b, int B, int S, int T, int32_t pad_id) {
    memset(b, 0, sizeof *b);
    b->src = ids((size_t)B * S, pad_id);
    b->tgt_in = ids((size_t)B * T, pad_id);
    b->tgt_out = ids((size_t)B * T, pad_id);
    b->src_len = ids((size_t)B, 0);
    b->tgt_len = ids((size_t)B, 0);
    b->view = (Batch){.B = B, .S = S, .T = T, .src = b->src, .src_len = b->src_len, .tgt_in = b->tgt_in,
                      .tgt_out = b->tgt_out, .tgt_len = b->tgt_len};
}

void owned_batch_free(OwnedBatch *b) {
    free(b->src);
    free(b->src_len);
    free(b->tgt_in);
    free(b->tgt_out);
    free(b->tgt_len);
    memset(b, 0, sizeof *b);
}

void owned_batch_rows(const OwnedBatch *src, int start, int stride, OwnedBatch *out) {
    const Batch *g = &src->view;
    int B = start < g->B ? (g->B - start + stride - 1) / stride : 0;
    owned_batch_alloc(out, B, g->S, g->T, 0);
    for (int r = 0; r < B; r++) {
        int i = start + r * stride;
        memcpy(out->src + (size_t)r * g->S, g->src + (size_t)i * g->S, (size_t)g->S * sizeof(int32_t));
        memcpy(out->tgt_in + (size_t)r * g->T, g->tgt_in + (size_t)i * g->T, (size_t)g->T * sizeof(int32_t));
        memcpy(out->tgt_out + (size_t)r * g->T, g->tgt_out + (size_t)i * g->T, (size_t)g->T * sizeof(int32_t));
        out->src_len[r] = g->src_len[i];
        out->tgt_len[r] = g->tgt_len[i];
    }
}

double batch_pad_fraction(const Batch *b) {
    const double slots = (double)b->B * (b->S + b->T);
    if (slots <= 0) return 0.0;
    long real = 0;
    for (int i = 0; i < b->B; i++) real += (long)b->src_len[i] + b->tgt_len[i];
    return 1.0 - (double)real / slots;
}
