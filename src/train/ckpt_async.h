/* ckpt_async.h: asynchronous checkpoint saves (train_mt --save-mode async).
 *
 * ckpt_writer_save copies this rank's part of checkpoint step N (master
 * weights, AdamW moments, the manifest's fields) into host memory at the
 * step boundary and returns; a background thread then writes the files,
 * and on rank 0 seals and publishes the checkpoint, exactly as ckpt_save
 * does (same bytes, same order of fsyncs and renames), while training goes
 * on. At most one write is in flight: the next save, and anything that
 * needs the checkpoint on disk (the end of the run, a stop on a signal,
 * averaging), first calls ckpt_writer_wait. The protocol and its
 * guarantees are in ckpt_async.c's first comment and docs/checkpoints.md.
 */
#ifndef TPTRAIN_CKPT_ASYNC_H
#define TPTRAIN_CKPT_ASYNC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "train/checkpoint.h"

typedef struct CkptWriter CkptWriter;

/* A writer for this rank's model m and optimizer opt (their layout is
 * fixed for the run): the snapshot buffer (MEM_CKPT, page-locked on CUDA)
 * is allocated now, so the memory report shows it from the first step and
 * no save pays for it. timeout_s bounds rank 0's wait for the other ranks'
 * files (--comm-timeout). */
CkptWriter *ckpt_writer_new(double timeout_s, const Model *m, const AdamW *opt, const Mesh *mesh);

/* What --keep-best records once the step is published (metric NULL: nothing). */
typedef struct {
    const char *metric;  // "bleu" or "loss"
    double value;
} CkptBestRecord;

/* Collective: waits for the write in flight (as ckpt_writer_wait), checks
 * and makes the step's work folder (as ckpt_save), snapshots this rank's
 * part and starts writing it. best (rank 0; NULL: none) is written as
 * DIR/best once the step is published. 0 when the write started, -1 + err
 * on every rank when the previous write failed or this one could not start. */
int ckpt_writer_save(CkptWriter *w, const char *dir, const Runtime *rt, const Model *m, const AdamW *opt,
                     const TrainState *st, const char *spm_path, int keep_last, const CkptBestRecord *best,
                     char *err, size_t err_len);

/* What ckpt_writer_wait reports of the write it joined. */
typedef struct {
    int64_t step;       // the step written (-1: none was in flight)
    double start_s;     // what its save held the run up: the checks, the work folder, the snapshot
    double write_s;     // its seconds in the background (files, seal, publication)
} CkptWriteTimes;

/* Collective: joins the write in flight, if any, and agrees on its outcome:
 * 0 when every rank's files are durable and rank 0 published the step (or
 * nothing was in flight), -1 + err on every rank otherwise (rank 0's err
 * names the file that failed; nothing was published). times (NULL: not
 * wanted) gets the joined write's figures. */
int ckpt_writer_wait(CkptWriter *w, const Runtime *rt, CkptWriteTimes *times, char *err, size_t err_len);

/* The step being written (-1: none in flight). */
int64_t ckpt_writer_pending(const CkptWriter *w);

/* Frees the snapshot; a write still in flight is joined first (its outcome is dropped). */
void ckpt_writer_free(CkptWriter *w);

#endif
