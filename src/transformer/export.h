/* export.h: a whole model as one directory: config.json + model.safetensors
 * (global names, fp32), the format documented in docs/model-and-export.md
 * and loaded by PyTorch. */
#ifndef TPTRAIN_EXPORT_H
#define TPTRAIN_EXPORT_H

#include <stddef.h>
#include "fileio.h" /* read_file_bytes, write_file_atomic, copy_file_atomic, fsync_path */
#include "transformer/model.h"

/* Creates dir if needed and writes config.json and model.safetensors, plus a
 * copy of the tokenizer spm_path as spm.model when spm_path is non-NULL.
 * Every file is first written in full under a staging name and renamed into
 * place only when all are written: on failure (a full disk) the staged
 * files are removed (and dir, when this call created it), so no partial
 * export is left. 0 or -1 + err. */
int model_export_files(const Model *m, const char *spm_path, const char *dir, char *err, size_t err_len);
int model_export(const Model *m, const char *dir, char *err, size_t err_len);

/* Reads dir/config.json, builds the model and loads dir/model.safetensors.
 * Every tensor must be present with its shape and dtype F32, and no unknown
 * tensor may appear. 0, or -1 with one sentence naming file and field. */
int model_load(Model *m, const char *dir, char *err, size_t err_len);
/* The same on backend be (NULL: the model's own CPU backend). */
int model_load_on(Model *m, Backend *be, const char *dir, char *err, size_t err_len);

#endif
