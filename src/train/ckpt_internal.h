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

/* What one rank writes of a checkpoint, from host memory: the views of a
 * synchronous save, or an asynchronous save's snapshot (ckpt_async.c). tab
 * and opt give the layout only (fixed for the run): the values are read
 * from params (the master weights) and om, ov (the AdamW moments). */
typedef struct {
    Mesh mesh;
    const ParamTable *tab;
    const AdamW *opt;
    const float *params, *om, *ov;
    char *meta;  // shard_meta_json(tab)
} CkptShards;

/* The tensors' labels and global shapes, the shards' "tensors" metadata (caller frees). */
char *shard_meta_json(const ParamTable *tab);
/* Collective: the step's work folder DIR/step_N.tmp made afresh by rank 0
 * (into tmp) after the checks that DIR holds nothing newer; 0 or -1 + err on every rank. */
int save_prepare(const char *dir, const Runtime *rt, const TrainState *st, char *tmp, size_t tmp_len, char *err,
                 size_t err_len);
/* This rank's model shard (dp rank 0) and optimizer shard into tmp, each fsynced. 0 or -1 + err naming the file. */
int write_shards(const char *tmp, const CkptShards *s, char *err, size_t err_len);
/* tmp/spm.model, a durable copy of spm_path. */
int save_tokenizer(const char *tmp, const char *spm_path, char *err, size_t err_len);
/* The manifest's fields but its "files" (caller deletes), from the state at the save's step. */
cJSON *manifest_start(const Runtime *rt, const Model *m, const AdamW *opt, const TrainState *st);
/* Adds the size and CRC-32C of every file of the layout mesh (re-read from
 * tmp) to o and writes it sealed as tmp/manifest.json. 0 or -1 + err. */
int manifest_finish(const char *tmp, cJSON *o, const Mesh *mesh, bool has_spm, char *err, size_t err_len);
/* Rank 0: tmp fsynced and renamed to DIR/step_N, `latest` replaced, older
 * steps pruned (keep_last > 0). 0 or -1 + err. */
int publish(const char *dir, const char *tmp, int64_t step, int keep_last, char *err, size_t err_len);

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
