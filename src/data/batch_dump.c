/* batch_dump.c: see batch_dump.h. The batches are kept whole in host memory
 * until the end of the run (a few MiB for a benchmark's tens of steps) and
 * written by the safetensors writer, which checksums the data. */
#include "data/batch_dump.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "err.h"
#include "safetensors.h"

struct BatchDump {
    int first_step, micro_batches;
    int n, cap;             // batches kept
    OwnedBatch *b;          // (n) step first_step + k / M, micro-batch k % M
};

BatchDump *batch_dump_new(int first_step, int micro_batches) {
    BatchDump *d = TP_MALLOC(sizeof *d);
    *d = (BatchDump){.first_step = first_step, .micro_batches = micro_batches};
    return d;
}

void batch_dump_take(BatchDump *d, int step, int i, OwnedBatch *b) {
    const int k = (step - d->first_step) * d->micro_batches + i;
    TP_CHECK(k == d->n && i >= 0 && i < d->micro_batches, "batch dump: step %d micro-batch %d out of order", step, i);
    if (d->n == d->cap) {
        d->cap = d->cap ? 2 * d->cap : 64;
        d->b = TP_REALLOC(d->b, (size_t)d->cap * sizeof *d->b);
    }
    d->b[d->n++] = *b;
    memset(b, 0, sizeof *b);
}

int batch_dump_write(const BatchDump *d, const char *path, const char *config_json, char *err, size_t err_len) {
    enum { FIELDS = 5 };
    static const char *const field[FIELDS] = {"src", "src_len", "tgt_in", "tgt_out", "tgt_len"};
    StWriter *w = st_writer_new();
    char (*names)[64] = TP_MALLOC(((size_t)d->n * FIELDS + 1) * sizeof *names);
    int64_t (*shapes)[2] = TP_MALLOC(((size_t)d->n * FIELDS + 1) * sizeof *shapes);
    for (int k = 0; k < d->n; k++) {
        const Batch *v = &d->b[k].view;
        const void *data[FIELDS] = {v->src, v->src_len, v->tgt_in, v->tgt_out, v->tgt_len};
        const int64_t cols[FIELDS] = {v->S, 1, v->T, v->T, 1};  // 1: a vector of B
        for (int f = 0; f < FIELDS; f++) {
            const int j = k * FIELDS + f;
            snprintf(names[j], sizeof names[j], "step%d.%d.%s", d->first_step + k / d->micro_batches,
                     k % d->micro_batches, field[f]);
            shapes[j][0] = v->B;
            shapes[j][1] = cols[f];
            st_writer_add(w, names[j], ST_I32, cols[f] == 1 ? 1 : 2, shapes[j], data[f]);
        }
    }
    char first[16], steps[16], micro[16];
    snprintf(first, sizeof first, "%d", d->first_step);
    snprintf(steps, sizeof steps, "%d", d->n / d->micro_batches);
    snprintf(micro, sizeof micro, "%d", d->micro_batches);
    st_writer_meta(w, "format", "tptrain-batches");
    st_writer_meta(w, "format_version", "1");
    st_writer_meta(w, "config", config_json);
    st_writer_meta(w, "first_step", first);
    st_writer_meta(w, "steps", steps);
    st_writer_meta(w, "micro_batches", micro);
    int rc = st_writer_write(w, path, err, err_len);
    st_writer_free(w);
    free(names);
    free(shapes);
    return rc;
}

void batch_dump_free(BatchDump *d) {
    if (!d) return;
    for (int k = 0; k < d->n; k++) owned_batch_free(&d->b[k]);
    free(d->b);
    free(d);
}
