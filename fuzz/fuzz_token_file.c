/* fuzz_token_file.c: token_file_open (the corpus cache's <split>.tok) on
 * any bytes. The checksums would stop nearly every mutation at the door, so
 * the target recomputes them before writing the file (corpus.h: version 1,
 * a 32-byte header whose bytes 28..31 are the CRC-32C of bytes 0..27;
 * version 2, a 40-byte header with the body's CRC-32C at 28 and the
 * header's, of bytes 0..35, at 36): the sizes, offsets, line numbers and
 * token checks behind them get fuzzed instead (the comparisons themselves
 * are one line each, covered by test_corpus). An accepted file must keep
 * every sentence's tokens inside the mapping and every id inside the
 * vocabulary it was opened for. */
#include <stdlib.h>
#include <string.h>

#include "data/corpus.h"
#include "fuzz_util.h"
#include "safetensors.h"  // crc32c

/* The vocabulary the cache is opened for (the corpus tokenizer's size). */
#define FUZZ_VOCAB 8000

/* Little-endian on every machine this runs on, as the format is. */
static void put_crc(uint8_t *at, uint32_t crc) { memcpy(at, &crc, 4); }

static void fix_checksums(uint8_t *b, size_t size) {
    if (size < 12) return;
    uint32_t version;
    memcpy(&version, b + 8, 4);
    if (version == 1 && size >= 32) {
        put_crc(b + 28, crc32c(0, b, 28));
    } else if (version == 2 && size >= 40) {
        put_crc(b + 28, crc32c(0, b + 40, size - 40));
        put_crc(b + 36, crc32c(0, b, 36));
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *buf = malloc(size ? size : 1);
    memcpy(buf, data, size);
    fix_checksums(buf, size);
    const char *path = fuzz_write("in.tok", buf, size);
    free(buf);
    TokenFile tf;
    char err[512] = "";
    if (token_file_open(&tf, path, FUZZ_VOCAB, err, sizeof err) != 0) {
        if (!err[0]) fuzz_fail("token_file_open refused without a message");
        return 0;
    }
    int64_t sum = 0;
    for (int i = 0; i < tf.n_pairs; i++) {
        const uint64_t offs[2][2] = {{tf.en_off[i], tf.en_off[i + 1]}, {tf.ja_off[i], tf.ja_off[i + 1]}};
        for (int side = 0; side < 2; side++) {
            if (offs[side][0] > offs[side][1] || offs[side][1] > tf.n_tokens) fuzz_fail("pair %d: bad offsets", i);
            for (uint64_t k = offs[side][0]; k < offs[side][1]; k++) {
                const int32_t id = tf.tokens[k];  // ASan: in the mapping
                if (id < 0 || id >= FUZZ_VOCAB) fuzz_fail("pair %d: token id %d outside the vocabulary", i, (int)id);
                sum += id;
            }
        }
        (void)tf.line[i];
    }
    (void)sum;
    token_file_close(&tf);
    return 0;
}
