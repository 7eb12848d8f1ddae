/* fuzz_manifest.c: ckpt_read_manifest (manifest.json of a checkpoint, read
 * by --resume, ckpt inspect and ckpt export) on any text. Accepted or
 * refused, it must not crash or meet undefined behaviour; a refusal comes
 * with a sentence; what it accepts is a valid config and a sane layout.
 * A manifest that opens with a checksum line ({ LF TAB "manifest_crc32c":
 * TAB "XXXXXXXX", LF: the CRC-32C of every byte after it) gets that line
 * recomputed first, so mutations reach the fields behind the checksum. */
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "safetensors.h"  // crc32c
#include "train/checkpoint.h"

static const char SEAL_HEAD[] = "{\n\t\"manifest_crc32c\":\t\"";
static const char SEAL_TAIL[] = "\",\n";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const size_t head = sizeof SEAL_HEAD - 1, line = head + 8 + sizeof SEAL_TAIL - 1;
    uint8_t *buf = malloc(size ? size : 1);
    memcpy(buf, data, size);
    if (size >= line && memcmp(buf, SEAL_HEAD, head) == 0 && memcmp(buf + head + 8, SEAL_TAIL, line - head - 8) == 0) {
        char hex[9];
        snprintf(hex, sizeof hex, "%08x", crc32c(0, buf + line, size - line));
        memcpy(buf + head, hex, 8);
    }
    fuzz_write("manifest.json", buf, size);
    free(buf);
    ModelConfig cfg;
    OptimConfig oc;
    TrainState st;
    int tp = 0, dp = 0, adam_t = 0;
    char err[1024] = "";
    if (ckpt_read_manifest(fuzz_dir(), &cfg, &tp, &dp, &oc, &adam_t, &st, err, sizeof err) != 0) {
        if (!err[0]) fuzz_fail("ckpt_read_manifest refused without a message");
        return 0;
    }
    if (config_validate(&cfg, err, sizeof err) != 0) fuzz_fail("accepted manifest with a bad config: %s", err);
    if (tp < 1 || dp < 1) fuzz_fail("accepted layout tp %d x dp %d", tp, dp);
    if (st.step < 0 || adam_t < 0) fuzz_fail("accepted step %lld, optimizer step %d", (long long)st.step, adam_t);
    return 0;
}
