/* json_seal.c: a JSON file's checksum line (see json_seal.h). */
#include "json_seal.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "safetensors.h" /* crc32c */

#define SEAL_TAIL "\",\n"

/* "{\n\t\"FIELD\":\t\"" into head; its length. */
static size_t seal_head(char *head, size_t cap, const char *field) {
    const int n = snprintf(head, cap, "{\n\t\"%s\":\t\"", field);
    TP_CHECK(n > 0 && (size_t)n < cap, "checksum field name too long: %s", field);
    return (size_t)n;
}

char *json_seal_print(const cJSON *o, const char *field) {
    char head[128];
    const size_t n_head = seal_head(head, sizeof head, field);
    char *body = cJSON_Print(o); /* "{\n\t\"first\": ..." */
    TP_CHECK(body && strncmp(body, "{\n\t", 3) == 0, "cJSON_Print did not print the object as expected");
    const char *rest = body + 2; /* from the first member on */
    const size_t n_rest = strlen(rest), n_line = n_head + 8 + sizeof SEAL_TAIL - 1;
    char *out = TP_MALLOC(n_line + n_rest + 1);
    snprintf(out, n_line + 1, "%s%08x" SEAL_TAIL, head, crc32c(0, rest, n_rest));
    memcpy(out + n_line, rest, n_rest + 1);
    cJSON_free(body);
    return out;
}

int json_seal_check(const char *text, size_t n, const char *field, char *found, char *computed) {
    char head[128];
    const size_t n_head = seal_head(head, sizeof head, field), n_line = n_head + 8 + sizeof SEAL_TAIL - 1;
    bool hex = n >= n_line && memcmp(text, head, n_head) == 0 &&
               memcmp(text + n_head + 8, SEAL_TAIL, sizeof SEAL_TAIL - 1) == 0;
    for (size_t i = 0; hex && i < 8; i++) hex = text[n_head + i] && strchr("0123456789abcdef", text[n_head + i]);
    if (!hex) return 1;
    char have[9];
    snprintf(have, sizeof have, "%08x", crc32c(0, text + n_line, n - n_line));
    if (found) snprintf(found, 9, "%.8s", text + n_head);
    if (computed) memcpy(computed, have, 9);
    return memcmp(have, text + n_head, 8) == 0 ? 0 : 2;
}
