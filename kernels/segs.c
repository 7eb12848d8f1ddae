/* segs.c: the segment tables of the multi-tensor ops (op_sumsq_segs,
 * op_adamw_segs; kernels/ops.h). A table is built on the host and uploaded
 * once, as one tagged buffer, so a step's norm or AdamW update is a single
 * launch that reads its work list on the device; the chunking (a GPU
 * block's share) is fixed here, independent of the backend, so it is part
 * of the table rather than of each launch. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "ops.h"

#define SEG_ALIGN ((size_t)16)

static size_t round_up(size_t n) { return (n + SEG_ALIGN - 1) / SEG_ALIGN * SEG_ALIGN; }

/* Where each part of the device buffer starts; returns its size. */
static size_t seg_layout(int n_segs, size_t n_chunks, size_t off[4]) {
    off[0] = round_up((size_t)n_segs * sizeof(OpSeg));
    off[1] = off[0] + round_up((size_t)(n_segs + 1) * sizeof(int32_t));
    off[2] = off[1] + round_up(n_chunks * sizeof(OpSegChunk));
    off[3] = off[2] + round_up(n_chunks * sizeof(double));
    return off[3] + SEG_ALIGN;  // the counter
}

size_t op_segs_bytes(int n_segs, size_t n_chunks) {
    size_t off[4];
    return seg_layout(n_segs, n_chunks, off);
}

size_t op_segs_chunks(size_t n_elems) { return (n_elems + OP_SEG_CHUNK_ELEMS - 1) / OP_SEG_CHUNK_ELEMS; }

/* Keeps the segments with n > 0 and counts their chunks. */
static void seg_keep(OpSegTable *t, const OpSeg *segs, int n_segs) {
    TP_CHECK(n_segs >= 0, "op_segs_create: %d segments", n_segs);
    t->segs = TP_MALLOC((size_t)(n_segs > 0 ? n_segs : 1) * sizeof *t->segs);
    size_t chunks = 0;
    for (int i = 0; i < n_segs; i++) {
        const OpSeg *s = &segs[i];
        TP_CHECK(s->acc >= 0 && s->acc < OP_SEG_MAX_ACC, "op_segs_create: segment %d names accumulator %d (0..%d)", i,
                 (int)s->acc, OP_SEG_MAX_ACC - 1);
        if (s->n == 0) continue;
        t->segs[t->n_segs++] = *s;
        chunks += op_segs_chunks((size_t)s->n);
        TP_CHECK(chunks <= INT_MAX, "op_segs_create: %zu chunks of %u elements exceed an int", chunks,
                 OP_SEG_CHUNK_ELEMS);
    }
    t->n_chunks = (int)chunks;
}

/* The host image of the device buffer: segments, first chunks, chunks
 * (partials and the counter start at zero). Returns its size. */
static size_t seg_image(const OpSegTable *t, char **out, size_t off[4]) {
    const int ns = t->n_segs;
    const size_t bytes = seg_layout(ns, (size_t)t->n_chunks, off);
    char *img = TP_CALLOC(1, bytes);
    memcpy(img, t->segs, (size_t)ns * sizeof(OpSeg));
    int32_t *first = (int32_t *)(img + off[0]);
    OpSegChunk *ch = (OpSegChunk *)(img + off[1]);
    int c = 0;
    for (int i = 0; i < ns; i++) {
        first[i] = c;
        for (uint64_t lo = 0; lo < t->segs[i].n; lo += OP_SEG_CHUNK_ELEMS) ch[c++] = (OpSegChunk){.seg = i, .lo = lo};
    }
    first[ns] = c;
    *out = img;
    return bytes;
}

OpSegTable *op_segs_create(Backend *be, const OpSeg *segs, int n_segs, MemTag tag) {
    OpSegTable *t = TP_CALLOC(1, sizeof *t);
    seg_keep(t, segs, n_segs);
    char *img = NULL;
    size_t off[4];
    const size_t bytes = seg_image(t, &img, off);
    t->dev = backend_alloc(be, bytes, tag);
    backend_upload(be, t->dev, img, bytes);
    free(img);
    char *d = t->dev;
    t->d_segs = (const OpSeg *)d;
    t->d_first = (const int32_t *)(d + off[0]);
    t->d_chunks = (const OpSegChunk *)(d + off[1]);
    t->d_partials = (double *)(d + off[2]);
    t->d_ticket = (uint32_t *)(d + off[3]);
    return t;
}

void op_segs_free(Backend *be, OpSegTable *t) {
    if (!t) return;
    backend_free(be, t->dev);
    free(t->segs);
    free(t);
}
