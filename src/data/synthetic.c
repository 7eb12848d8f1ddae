/* synthetic.c: copy / reverse batches from the counter-based generator. */
#include "data/synthetic.h"

#include <string.h>
#include "err.h"
#include "kernels/ops.h" /* philox4x32_10 */

typedef struct { uint32_t key[2]; uint64_t ctr; uint32_t buf[4]; int left; uint32_t lane; } SynthRng;

static uint32_t next_u32(SynthRng *r) {
    if (r->left == 0) {
        uint32_t c[4] = {(uint32_t)r->ctr, (uint32_t)(r->ctr >> 32), r->lane, 0x5EEDu};
        philox4x32_10(c, r->key, r->buf);
        r->ctr++;
        r->left = 4;
    }
    return r->buf[--r->left];
}

int synth_task_parse(const char *s, SynthTask *task) {
    if (strcmp(s, "copy") == 0) { *task = SYNTH_COPY; return 0; }
    if (strcmp(s, "reverse") == 0) { *task = SYNTH_REVERSE; return 0; }
    return -1;
}

const char *synth_task_name(SynthTask task) { return task == SYNTH_REVERSE ? "reverse" : "copy"; }

void synth_batch(OwnedBatch *out, SynthTask task, TokenSpec tok, int B, int min_len, int max_len, uint64_t seed,
                 uint64_t index) {
    TP_CHECK(min_len >= 1 && max_len >= min_len && max_len + 1 <= tok.max_len,
             "synthetic lengths [%d, %d] must lie in [1, max_len - 1 = %d]", min_len, max_len, tok.max_len - 1);
    TP_CHECK(tok.vocab_size > 4, "synthetic tasks need vocab_size > 4");
    const int S = max_len, T = max_len + 1;
    owned_batch_alloc(out, B, S, T, tok.pad_id);
    SynthRng r = {.key = {(uint32_t)seed, (uint32_t)(seed >> 32)}, .lane = (uint32_t)index,
                  .ctr = index >> 32 << 40};
    const int n_sym = tok.vocab_size - 4;
    for (int b = 0; b < B; b++) {
        int len = min_len + (int)(next_u32(&r) % (uint32_t)(max_len - min_len + 1));
        int32_t *s = out->src + (size_t)b * S, *ti = out->tgt_in + (size_t)b * T, *to = out->tgt_out + (size_t)b * T;
        for (int t = 0; t < S; t++) s[t] = t < len ? 4 + (int32_t)(next_u32(&r) % (uint32_t)n_sym) : tok.pad_id;
        ti[0] = tok.bos_id;
        for (int t = 0; t < len; t++) {
            int32_t y = task == SYNTH_COPY ? s[t] : s[len - 1 - t];
            to[t] = y;
            ti[t + 1] = y;
        }
        to[len] = tok.eos_id;
        out->src_len[b] = len;
        out->tgt_len[b] = len + 1;
    }
}
