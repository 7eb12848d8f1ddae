/* ckpt_internal.h: what the pieces of checkpoint.h share and nothing else
 * includes: ckpt_save.c (writing, publishing), ckpt_dir.c (the checkpoint
 * folder: step names, best, resolve), ckpt_manifest.c (the manifest's seal
 * and fields), ckpt_load.c (reading shards into any layout) and
 * ckpt_verify.c (a load's checks without a model). Private to src/train.
 */
#ifndef TPTRAIN_CKPT_INTERNAL_H
#define TPTRAIN_CKPT_INTERNAL_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "safetensors.h"
#include "train/checkpoint.h"
#include "transformer/params.h"

/* A manifest lists a few hundred files at most; anything past this is not one. */
#define MANIFEST_MAX_BYTES (64u << 20)

/* ---- ckpt_save.c ---- */

/* "step_%08lld" of step into buf. */
void step_name(char *buf, size_t n, int64_t step);
/* 0 when every rank's ok is set; -1 + err on every rank otherwise. */
int agree(const Runtime *rt, int ok, char *err, size_t err_len);
/* The size and CRC-32C (8 hex digits) of the file at path. */
int file_crc(const char *path, size_t *n, char crc[16], char *err, size_t err_len);

/* ---- ckpt_dir.c ---- */

/* Step directories in dir, newest first (caller frees); their count. */
int list_steps(const char *dir, int64_t **steps_out);
/* Whether dir holds a complete checkpoint (a manifest). */
bool is_checkpoint(const char *dir);
/* The newest complete step in dir; -1 when none. */
int64_t newest_complete(const char *dir);
/* Whether the published final equals the fresh tmp of the same step (or is absent). */
int same_or_absent(const char *final, const char *tmp, int64_t step, char *err, size_t err_len);
/* The steps best.json records and the best link points at (-1 when none). */
void best_steps(const char *dir, int64_t *recorded, int64_t *linked);

/* ---- ckpt_manifest.c ---- */

/* The manifest text with its checksum line first (caller frees). */
char *sealed_manifest(const cJSON *o);
/* DIR/manifest.json read, its seal checked and parsed (path gets its name); NULL + err. */
cJSON *load_manifest(const char *dir, char *path, size_t path_len, char *err, size_t err_len);

/* ---- ckpt_load.c ---- */

/* The saved layout's files, read on first use: slot ((p * tp) + t) * per + k
 * holds stage p's model shard of tp rank t (k = 0) or its optimizer shard
 * of dp rank k - 1. */
typedef struct {
    const char *dir;
    const cJSON *files;
    int tp, dp, pp, per;
    const ParamTable *tabs;  // per saved stage
    StFile *f;
    bool *loaded;
    char (*path)[4096];
} SavedFiles;

/* A checkpoint opened for reading (what a load and a verify both start
 * from): its manifest's figures, the saved stages with their parameter
 * tables, and the files, read on first use; with_optim counts the
 * optimizer shards among them. saved_close frees all of it, also after a
 * failed saved_open. */
typedef struct {
    ModelConfig cfg;
    int tp, dp;
    TrainState *saved;
    cJSON *man;
    ModelStage *st;    // [saved->pp]
    ParamTable *tabs;  // [saved->pp]
    SavedFiles sf;
} SavedCkpt;

int saved_open(SavedCkpt *c, const char *dir, bool with_optim, char *err, size_t err_len);
void saved_close(SavedCkpt *c);
int saved_slot(const SavedFiles *sf, int p, int t, int k);
/* The file of slot (p, t, k), read and checked when first asked for; NULL + err. */
const StFile *saved_file(SavedFiles *sf, int p, int t, int k, char *err, size_t err_len);
/* The tensor name of shard f, checked against the saved layout's entry old; NULL + err. */
const StTensor *shard_tensor(const StFile *f, const char *name, const ParamInfo *old, const char *path,
                             char *err, size_t err_len);
/* Tensor i of saved stage p (kind 0: weights, 1 / 2: the AdamW moments), read whole and cut to my_tp's shard. */
int read_saved(SavedFiles *sf, int p, int i, int kind, bool pieces, int my_tp, float *whole, float *loc,
               char *err, size_t err_len);

#endif
