/* fuzz_config.c: config_from_json (config.json of every export) on any
 * text. A config it accepts must validate and survive a round trip through
 * config_to_json unchanged (an infinite float would come back as null). */
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "transformer/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = 0;
    ModelConfig cfg;
    char err[512] = "";
    int rc = config_from_json(text, &cfg, err, sizeof err);
    free(text);
    if (rc != 0) {
        if (!err[0]) fuzz_fail("config_from_json refused without a message");
        return 0;
    }
    if (config_validate(&cfg, err, sizeof err) != 0) fuzz_fail("accepted config fails validation: %s", err);
    char *json = config_to_json(&cfg);
    ModelConfig back;
    if (config_from_json(json, &back, err, sizeof err) != 0) fuzz_fail("round trip refused: %s\n%s", err, json);
    char diff[256];
    if (config_diff(&cfg, "the parsed config", &back, "its round trip", diff, sizeof diff))
        fuzz_fail("round trip changed the config: %s", diff);
    free(json);
    return 0;
}
