/* checkpoint.h: sharded, crash-safe checkpoints that load into any layout.
 *
 * A checkpoint is a directory DIR/step_XXXXXXXX holding
 *   model-tp{t}-pp{p}.safetensors       one per (tp, pp) shard: the fp32
 *                                       master weights of pipeline stage p's
 *                                       tensors (the tied embedding on every
 *                                       stage of the embedding group) under
 *                                       their global names
 *   optim-tp{t}-pp{p}-dp{d}.safetensors one per dp shard of the optimizer
 *                                       state: AdamW moments (exp_avg.NAME,
 *                                       exp_avg_sq.NAME) of the tensors dealt
 *                                       to dp rank d (tensor i of the stage
 *                                       -> i % dp), or its ZeRO pieces
 *   spm.model                           the tokenizer, when training on a corpus
 *   manifest.json                       written last: format version, config,
 *                                       mesh, step, data cursor, RNG and
 *                                       schedule state, and the size and
 *                                       CRC-32C of every file
 * Each shard file's metadata gives every tensor's split label, global shape
 * and the shard's tp rank, so a loader of any layout reassembles and
 * re-splits tensors without a conversion step. The format is documented in
 * docs/checkpoints.md.
 *
 * Saving writes into step_XXXXXXXX.tmp, fsyncs every file and the directory,
 * renames it into place, then replaces DIR/latest atomically and prunes old
 * steps (--keep-last) only after that. A crash at any point leaves the
 * previous complete checkpoint as the newest one a resume finds.
 */
#ifndef TPTRAIN_CHECKPOINT_H
#define TPTRAIN_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "data/dataset.h"
#include "tp/runtime.h"
#include "transformer/model.h"
#include "transformer/optim.h"

/* 2: manifest.json begins with its own checksum line (docs/checkpoints.md). */
#define CKPT_FORMAT_VERSION 2

/* Room for the stages' layout text (model_stages_format): at most 255 + 255
 * layers, so at most 510 stages of "enc:A-B|" (12 characters) or fewer. */
#define CKPT_MAX_LAYOUT 8192

/* Everything besides tensors that a resume needs to continue bit for bit. */
typedef struct {
    int64_t step;           // optimizer steps taken
    DataCursor cursor;      // corpus position after `step` steps
    uint64_t synth_index;   // synthetic task position after `step` steps
    uint64_t seed;          // run seed: dropout masks are Philox(seed, step, ...)
    int corpus;             // 1 = corpus cursor valid, 0 = synthetic task
    double spm_alpha;       // subword sampling of the corpus (--spm-alpha; 0: off; absent before the record: 0)
    int spm_nbest;          // its --spm-nbest (-1: the lattice)
    char task[16];          // the synthetic task ("copy", "reverse"); "" for a corpus or a manifest before the record
    int zero_stage;         // read: the optimizer files' layout (0: whole tensors; 1, 2: ZeRO pieces)
    uint64_t zero_bucket_elems;  // read: the bucket length those pieces were cut with
    int pp;                 // read: the pipeline stages of the saved layout (1: none)
    char pp_layout[CKPT_MAX_LAYOUT];  // the stages' layers (model_stages_format); written from it
                                      // when the run has pp > 1, read back for any pp
    /* --max-minutes: the schedule's clock, so a resumed run goes on along
     * the same time horizon (the manifest's "clock", written when has_clock). */
    int has_clock;
    double train_s;       // training seconds spent by the end of `step` (over the runs it resumed)
    double step_s;        // the last step's seconds
    double warmup_end_s;  // train_s when the warmup ended (< 0: not yet)
} TrainState;

/* Saves step st->step under dir. Collective over rt->world: every rank
 * calls it. spm_path may be NULL. keep_last > 0 prunes older steps after
 * the new one is complete. A save never replaces a newer or equal
 * checkpoint with other contents: it is refused when dir holds a complete
 * checkpoint of a later step, or one of the same step whose manifest
 * differs from the new one. Pruning and clean-up never follow symbolic
 * links. 0, or -1 with one sentence in err (on every rank). */
int ckpt_save(const char *dir, const Runtime *rt, const Model *m, const AdamW *opt, const TrainState *st,
              const char *spm_path, int keep_last, char *err, size_t err_len);

/* Writes one complete checkpoint directory at `out` (not a step folder of a
 * --save folder: no `latest`, no pruning), from a one-rank runtime: saved
 * whole into out.partial, then renamed into place. An existing out is
 * refused unless replace. 0 or -1 + err. */
int ckpt_save_as(const char *out, bool replace, const Runtime *rt, const Model *m, const AdamW *opt,
                 const TrainState *st, const char *spm_path, char *err, size_t err_len);

/* The kept best checkpoint of a --save folder (train_mt --keep-best):
 * DIR/best.json records {"step", "metric" ("bleu" or "loss"), "value"} and
 * DIR/best is a symbolic link to its step_N, so DIR/best resolves like any
 * checkpoint directory. --keep-last never prunes the step best.json or the
 * link names. ckpt_best_write: the record first, then the link, each
 * replaced atomically; the step must be complete. ckpt_best_read: 1 and the
 * record, 0 when there is none, -1 + err when it is malformed. */
int ckpt_best_write(const char *dir, int64_t step, const char *metric, double value, char *err, size_t err_len);
int ckpt_best_read(const char *dir, int64_t *step, char *metric, size_t metric_len, double *value, char *err,
                   size_t err_len);

/* The complete step_N checkpoints in dir, newest first (caller frees). */
int ckpt_list_complete(const char *dir, int64_t **steps_out);

/* Resolves what --resume names: a checkpoint directory (with manifest.json),
 * or a folder of checkpoints (its `latest`, or else its newest complete
 * step). Incomplete step directories are reported on stderr and skipped.
 * Returns 1 and the path in out, 0 when the folder holds no checkpoint, -1
 * with err on error. */
int ckpt_resolve(const char *arg, char *out, size_t out_len, char *err, size_t err_len);

/* ckpt_resolve for a loader of the model (translate_mt --model, ckpt
 * inspect, export and average): a folder that holds both checkpoints and an
 * exported model (config.json) is refused (-1 + err naming the newest
 * checkpoint): the export may be older than the checkpoints, and which is
 * meant cannot be told. */
int ckpt_resolve_model(const char *arg, char *out, size_t out_len, char *err, size_t err_len);

/* Reads and validates DIR/manifest.json: its checksum line first, then the
 * model config, the layout it was saved with, the state (every number an
 * integer or a finite number within its range) and the list of files (the
 * shards of that layout, their sizes consistent with the config). */
int ckpt_read_manifest(const char *ckpt_dir, ModelConfig *cfg, int *tp, int *dp, OptimConfig *oc, int *adam_t,
                       TrainState *st, char *err, size_t err_len);

/* The verified manifest as JSON (checksum, format and version checked; the
 * caller frees it with cJSON_Delete), or NULL + err. */
struct cJSON *ckpt_manifest(const char *ckpt_dir, char *err, size_t err_len);
/* The size and CRC-32C (8 hex digits) of the manifest's entry e (an item of
 * its "files", named by e->string) of checkpoint dir; 0, or -1 with one
 * sentence in err when the entry lacks either. */
int ckpt_manifest_entry(const struct cJSON *e, const char *dir, double *n_bytes, const char **crc, char *err,
                        size_t err_len);

/* 0 when the checkpoint's tokenizer (spm.model as the manifest records it)
 * has the same bytes as spm_path, else -1 with one sentence. */
int ckpt_check_tokenizer(const char *ckpt_dir, const char *spm_path, char *err, size_t err_len);

/* Streams DIR/NAME (a regular file; a named pipe or device is refused)
 * through CRC-32C in constant memory and compares its size and CRC with
 * the entry `files` (the manifest's "files" object) lists. 0 or -1 + err. */
int ckpt_verify_file(const char *dir, const struct cJSON *files, const char *name, char *err, size_t err_len);

/* Every check a load runs, for every file of the saved layout, without a
 * model: the manifest, then each shard read as ckpt_load reads it (size and
 * CRC-32C, the safetensors header: duplicate names, offsets; the metadata's
 * labels and global shapes; every tensor present as an F32 shard of its
 * shape: weights, AdamW moments or ZeRO pieces covering each tensor exactly
 * once) and the tokenizer. One (stage, tp rank)'s files in memory at a time.
 * what: CKPT_VERIFY_MODEL (model shards, spm.model) and/or CKPT_VERIFY_OPTIM
 * (optimizer shards). 0, or -1 + err naming the file. */
enum { CKPT_VERIFY_MODEL = 1, CKPT_VERIFY_OPTIM = 2, CKPT_VERIFY_ALL = 3 };
int ckpt_verify(const char *dir, int what, char *err, size_t err_len);

/* Before a run trains: 0 when every complete checkpoint in save_dir (a
 * folder of checkpoints; absent or empty is fine) is of the model this run
 * trains (config, corpus or synthetic task, tokenizer spm_path when
 * corpus), else -1 with one sentence naming the checkpoint and the first
 * difference, whose value is the checkpoint's and whose this run's. Links
 * to folders elsewhere and manifests that cannot be read are not compared
 * (the first are never the folder's own, the second say why when loaded). */
int ckpt_check_save_folder(const char *save_dir, const ModelConfig *cfg, bool corpus, const char *spm_path, char *err,
                           size_t err_len);

/* Loads weights (and, when opt is non-NULL, the optimizer state) into a
 * model of any tp layout and any pipeline stage (m->stage, the whole model
 * by default) whose config equals the checkpoint's, whatever stages it was
 * saved with: each tensor is read from a saved stage that holds it; every file
 * read is checked against the manifest (size, CRC-32C) and every tensor
 * against its label and shapes. Needs no communication. 0 or -1 + err. */
int ckpt_load(const char *ckpt_dir, Model *m, AdamW *opt, char *err, size_t err_len);

/* Test-only fault hook: when TPTRAIN_FAULT_POINT=N is set, the N-th save
 * point reached by rank TPTRAIN_FAULT_RANK (default 0) kills the process
 * with SIGKILL; with TPTRAIN_FAULT_FAIL=N, the N-th point before a file is
 * written (a shard, the tokenizer, the manifest) fails that write as a full
 * disk would (ENOSPC, the file named). The points are the same, in the same
 * order, in a synchronous and an asynchronous save (whose writer thread
 * passes most of them; ckpt_async.c also has TPTRAIN_FAULT_WRITE_DELAY_S).
 * Returns the number of points this rank has passed. */
int ckpt_fault_point(const char *what);

#endif
