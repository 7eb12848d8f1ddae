/* json_seal.h: a JSON file that carries the CRC-32C of its own bytes.
 *
 * The file begins with the line  {\n\t"FIELD":\t"xxxxxxxx",\n  whose eight
 * hex digits are the CRC-32C of every byte after that line, to the end of
 * the file. The checksum is over the bytes as written, not over a
 * re-serialization, so checking it needs no JSON parser (and cannot depend
 * on how one prints numbers), and it is checked before any field is read.
 * The checkpoint manifest (FIELD manifest_crc32c) and the corpus cache's
 * record (record_crc32c) are sealed so. */
#ifndef TPTRAIN_JSON_SEAL_H
#define TPTRAIN_JSON_SEAL_H

#include <stddef.h>

#include <cjson/cJSON.h>

/* o printed (cJSON_Print) with its checksum line first (caller frees). */
char *json_seal_print(const cJSON *o, const char *field);

/* 0: text (n bytes) begins with field's checksum line and it matches; 1: it
 * does not begin with that line; 2: the line's digits (found) differ from the
 * rest's checksum (computed). found and computed: 9 bytes, may be NULL. */
int json_seal_check(const char *text, size_t n, const char *field, char *found, char *computed);

#endif
