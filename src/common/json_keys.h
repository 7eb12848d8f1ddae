/* json_keys.h: a JSON object whose key repeats is refused. cJSON keeps both
 * members and its lookups return the first, while Python's json (and most
 * readers) take the last: a file holding "step": 4 and "step": 99 would mean
 * 4 here and 99 to every other tool. The loaders of files a user may edit
 * or a program may have damaged (the checkpoint manifest, best.json, a
 * model's config.json) ask this first; safetensors headers have their own
 * check, naming the tensor. */
#ifndef TPTRAIN_JSON_KEYS_H
#define TPTRAIN_JSON_KEYS_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

/* Whether any object in the tree under `item` (itself included) holds a key
 * twice; if so, where ("config.d_model", "[3].name") goes to `where`. */
bool json_duplicate_key(const cJSON *item, char *where, size_t where_len);

/* 0, or -1 with the refusal in err ("WHAT: key 'K' appears twice; ...";
 * WHAT may be "" for a caller that names the file itself). */
int json_refuse_duplicate_keys(const cJSON *item, const char *what, char *err, size_t err_len);

#endif
