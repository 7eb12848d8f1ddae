/* export.h: a whole model as one directory: config.json + model.safetensors
 * (global names, fp32), the format documented in docs/model-and-export.md
 * and loaded by PyTorch. */
#ifndef TPTRAIN_EXPORT_H
#define TPTRAIN_EXPORT_H

#include <stddef.h>
#include "transformer/model.h"

/* Creates dir if needed and writes both files atomically. 0 or -1 + err. */
int model_export(const Model *m, const char *dir, char *err, size_t err_len);

/* Reads dir/config.json, builds the model and loads dir/model.safetensors.
 * Every tensor must be present with its shape and dtype F32, and no unknown
 * tensor may appear. 0, or -1 with one sentence naming file and field. */
int model_load(Model *m, const char *dir, char *err, size_t err_len);
/* The same on backend be (NULL: the model's own CPU backend). */
int model_load_on(Model *m, Backend *be, const char *dir, char *err, size_t err_len);

/* Reads a whole file (NUL-terminated after its bytes, caller frees); its
 * size goes to *n_bytes when non-NULL. NULL + err. */
void *read_file_bytes(const char *path, size_t *n_bytes, char *err, size_t err_len);
char *read_text_file(const char *path, char *err, size_t err_len);

/* Copies a file, writing the copy atomically. 0 or -1 + err. */
int copy_file_atomic(const char *from, const char *to, char *err, size_t err_len);

/* Writes a file atomically (tmp + fsync + rename). 0 or -1 + err. */
int write_file_atomic(const char *path, const void *data, size_t n_bytes, char *err, size_t err_len);

#endif
