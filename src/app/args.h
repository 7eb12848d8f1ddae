/* args.h: train_mt's arguments. TrainArgs is the whole of a run's settings
 * as the command line gives them; parse_args fills it from the flag table
 * in args.c (each flag declared once there: parsing, --help, the range
 * refusals and the configuration echo come from it) and then checks every
 * rule between flags in one place (validate_args). */
#ifndef TPTRAIN_APP_ARGS_H
#define TPTRAIN_APP_ARGS_H

#include <stdbool.h>
#include <stdio.h>

#include "data/dataset.h"
#include "data/synthetic.h"
#include "kernels/backend.h"
#include "tp/runtime.h"
#include "train/grad_sync.h"
#include "transformer/config.h"
#include "transformer/model.h"
#include "transformer/optim.h"

enum { MAX_PP = 1024 };  // pipeline stages (a stage holds at least one layer)
enum { KEEP_NONE, KEEP_BLEU, KEEP_LOSS };  // --keep-best

enum { GRAPHS_OFF = 0, GRAPHS_ON = 1, GRAPHS_AUTO = 2 };  // --cuda-graphs
enum { SAVE_SYNC = 0, SAVE_ASYNC = 1 };                      // --save-mode

typedef struct {
    const char *preset;
    ModelConfig cfg;
    OptimConfig opt;
    bool synthetic;          // --task given: no corpus
    SynthTask task;
    int batch_size, min_len, max_len;
    const char *data_dir, *cache_dir;
    Direction dir;
    int batch_tokens, spm_vocab;
    int spm_sample;          // --spm-sample: sentences the tokenizer trains on
    int prep_workers;        // --prep-workers: encoding threads (0: one per core)
    int length_bucket;       // --length-bucket: padded lengths are multiples of this (1: none)
    double spm_alpha;        // --spm-alpha: subword sampling's smoothing (0: off, the token files' best segmentation)
    int spm_nbest;           // --spm-nbest: sample over the n best segmentations (-1: the whole lattice)
    bool profile;            // --profile: time per class of operation
    int cuda_graphs;         // --cuda-graphs: GRAPHS_ON, GRAPHS_OFF or GRAPHS_AUTO (run.c resolves it; train/graphs.h)
    int micro_batches;  // per dp rank and step (gradient accumulation)
    bool strict;
    int max_steps, epochs, log_interval, eval_interval, beam;
    bool steps_given;        // --max-steps on the command line (not the preset's)
    unsigned long long seed;
    const char *save_dir, *metrics_path, *resume, *export_dir;
    const char *dump_batches; // --dump-batches FILE, or NULL
    double max_minutes;       // --max-minutes: wall time after which the run ends (0: none)
    int save_interval, keep_last;
    int save_mode;            // --save-mode: SAVE_ASYNC (written in the background) or SAVE_SYNC
    int keep_best;            // --keep-best: KEEP_NONE, KEEP_BLEU or KEEP_LOSS
    int patience;             // --patience N: evaluations without improvement that end the run (0: none)
    int average_last;         // --average-last N: average the newest N checkpoints at the end (0: none)
    int tp, dp;               // 0: automatic
    int pp;                   // pipeline stages (1: none)
    const char *pp_layout;    // --pp-layout, or NULL: balanced by cost
    ModelRecompute recompute; // --recompute
    ModelAttention attention; // --attention
    bool seq_par;             // --sequence-parallel
    RuntimeComm comm;         // --comm
    double comm_timeout;
    DeviceChoice device;
    Dtype dtype;
    bool dtype_given;
    GradSyncConfig grad;      // --zero, --grad-bucket-mb, --grad-comm-dtype, --grad-overlap
    bool plan;                // --plan: predict memory and step time, train nothing
    double memory_limit;      // --memory-limit in bytes (0: default_memory_limit)
    const char *plan_cache;   // --plan-cache FILE: the machine's calibration
    bool layout_auto;         // --layout auto
    const char *layout_flag;  // a layout flag given (--tp, --dp, ...), which --layout auto refuses
} TrainArgs;

/* Bounds of the run length: steps are counted in int (and the dropout key's
 * 32-bit step), so a run, however it is asked for, stays below this. */
#define MAX_RUN_STEPS (1L << 30)
#define MAX_EPOCHS (1L << 20)

/* Fills a from argv: the preset's values, then the flags in order (a later
 * flag wins), then the cross-flag rules. A refusal is one sentence on
 * stderr and exit 2; --help prints the flags and exits 0. */
void parse_args(int argc, char **argv, TrainArgs *a);

/* Whether the run will be on a GPU: what `--preset auto` and the default dtype follow. */
bool device_is_gpu(DeviceChoice d);

/* The effective configuration at the start of a run (rank 0): a block of
 * flags on log and, with --metrics FILE, one JSON line {"first_step": N,
 * "config": {...}} written to FILE.config.jsonl (appended to when the run
 * resumes, as the metrics are). 0, or -1 after printing why. */
int args_echo(const TrainArgs *a, FILE *log, int first_step);

#endif
