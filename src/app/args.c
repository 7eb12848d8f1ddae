/* args.c: train_mt's command line, as one flag table (common/flags.h).
 *
 * Each flag is declared once below: kind, range, default, group, help and
 * the TrainArgs field it sets. Parsing, --help, the range refusals and the
 * echo of the effective configuration all come from the table. What no
 * table says lives in three named steps: the preset (applied before the
 * flags, so an explicit flag overrides it whatever the order), the
 * bookkeeping of which flags were given (--max-steps against the preset's,
 * --dtype against the device's), and validate_args, every rule between
 * flags in one place (Megatron's validate_args).
 */
#include "app/args.h"

#include "data/corpus_list.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "fileio.h"
#include "flags.h"
#include "parse.h"

#define STR_(x) #x
#define STR(x) STR_(x)

/* Training defaults per preset. cpu: the candidate with the best dev BLEU
 * after about 5 minutes of training with 4 ranks on 2 cores (the main job,
 * docs/cpu-default.md): cosine decay to 0 at the last step, a 4000-piece
 * tokenizer; lr 3e-3 from the recipe table of docs/quality.md; 1300 steps
 * (about 8 minutes there) rather than 900, since its dev BLEU still rose at
 * step 900 (docs/quality.md's CPU table: 29.70 against 25.95). tiny: the unit tests' model. base: the GPU recipe
 * measured best (docs/quality.md: 1000 warm-up steps, with the preset's dropout 0.3), and a length a user can run
 * as it is, not 100,000 steps far past its best: 20,000 steps of 4k tokens (about 3.5 minutes on an H200 at
 * 10 ms a step). Dropout 0.1 peaked near 3,000 steps; 0.3 peaks later, where exactly is still to be measured
 * (the main job bounds by --max-minutes and keeps its best checkpoint instead). The others follow the usual
 * recipes for their size. */
typedef struct {
    const char *preset;
    float lr;
    int warmup, max_steps, eval_interval, spm_vocab;
    LrSchedule schedule;
} RunDefaults;
static const RunDefaults RUN_DEFAULTS[] = {
    {"tiny", 2e-3f, 200, 1200, 400, 8000, LR_INV_SQRT},
    {"cpu", 3e-3f, 100, 1300, 150, 4000, LR_COSINE},
    {"small", 1e-3f, 1000, 10000, 1000, 8000, LR_INV_SQRT},
    {"base", 7e-4f, 1000, 20000, 1000, 8000, LR_INV_SQRT},
    {"big", 5e-4f, 4000, 100000, 2000, 8000, LR_INV_SQRT},
};

static const RunDefaults *run_defaults(const char *preset) {
    for (size_t i = 0; i < sizeof RUN_DEFAULTS / sizeof RUN_DEFAULTS[0]; i++)
        if (strcmp(RUN_DEFAULTS[i].preset, preset) == 0) return &RUN_DEFAULTS[i];
    return &RUN_DEFAULTS[0];
}

static DeviceChoice parse_device(const char *s) {
    DeviceChoice d;
    if (device_choice_parse(s, &d) == 0) return d;
    fprintf(stderr, "train_mt: --device must be auto, cpu or cuda, got '%s'\n", s);
    exit(2);
}

bool device_is_gpu(DeviceChoice d) {
    return d == DEVICE_CUDA || (d == DEVICE_AUTO && backend_cuda_available(NULL));
}

/* ---- setters of the flags that are not one field ---------------------------- */

#define ARGS(p) ((TrainArgs *)(p))
#define CARGS(p) ((const TrainArgs *)(p))
#define UNUSED_SETTER (void)f, (void)s, (void)num, (void)err, (void)err_len

/* --preset is applied before the flags (preset_and_defaults); here only checked for a value. */
static int set_preset(void *a, const Flag *f, const char *s, double num, char *err, size_t err_len) {
    (void)a, UNUSED_SETTER;
    return 0;
}
static void show_preset(const void *a, const Flag *f, char *buf, size_t len) {
    (void)f;
    snprintf(buf, len, "%s", CARGS(a)->preset);
}
static int set_layers(void *a, const Flag *f, const char *s, double num, char *err, size_t err_len) {
    UNUSED_SETTER;
    ARGS(a)->cfg.enc_layers = ARGS(a)->cfg.dec_layers = (int)num;
    return 0;
}
static void show_task(const void *a, const Flag *f, char *buf, size_t len) {
    (void)f;
    snprintf(buf, len, "%s", !CARGS(a)->synthetic ? "" : CARGS(a)->task == SYNTH_COPY ? "copy" : "reverse");
}
static int set_zero(void *a, const Flag *f, const char *s, double num, char *err, size_t err_len) {
    UNUSED_SETTER;
    if (num > 2) {  // 3 parses, to be refused by name
        tp_error_set(err, err_len, "--zero %d (ZeRO-%d: sharded parameters) is not built; use 0, 1 or 2", (int)num,
                     (int)num);
        return -1;
    }
    ARGS(a)->grad.zero = (int)num;
    return 0;
}
static void show_zero(const void *a, const Flag *f, char *buf, size_t len) {
    (void)f;
    snprintf(buf, len, "%d", CARGS(a)->grad.zero);
}
static int set_bucket(void *a, const Flag *f, const char *s, double num, char *err, size_t err_len) {
    UNUSED_SETTER;
    ARGS(a)->grad.bucket_elems = bucket_elems_for_mb(num);
    return 0;
}
static void show_bucket(const void *a, const Flag *f, char *buf, size_t len) {
    (void)f;
    snprintf(buf, len, "%.6g", (double)CARGS(a)->grad.bucket_elems * sizeof(float) / (1024.0 * 1024.0));
}
static int set_memory_limit(void *a, const Flag *f, const char *s, double num, char *err, size_t err_len) {
    UNUSED_SETTER;
    ARGS(a)->memory_limit = num * 1048576.0;
    return 0;
}
static void show_memory_limit(const void *a, const Flag *f, char *buf, size_t len) {
    (void)f;
    if (CARGS(a)->memory_limit > 0) snprintf(buf, len, "%.6g", CARGS(a)->memory_limit / 1048576.0);
    else buf[0] = '\0';
}
static int set_layout(void *a, const Flag *f, const char *s, double num, char *err, size_t err_len) {
    (void)f, (void)num;
    if (strcmp(s, "auto") != 0) {
        tp_error_set(err, err_len, "--layout: '%s' is not a layout choice (auto; or give --tp, --dp, --pp)", s);
        return -1;
    }
    ARGS(a)->layout_auto = true;
    return 0;
}
static void show_layout(const void *a, const Flag *f, char *buf, size_t len) {
    (void)f;
    snprintf(buf, len, "%s", CARGS(a)->layout_auto ? "auto" : "");
}

/* ---- the table -------------------------------------------------------------- */

static const int ACT_VALUES[] = {ACT_RELU, ACT_GELU};
static const int TASK_VALUES[] = {SYNTH_COPY, SYNTH_REVERSE};
static const int SCHED_VALUES[] = {LR_INV_SQRT, LR_COSINE};
static const int DIR_VALUES[] = {DIR_EN_JA, DIR_JA_EN};
static const int DEVICE_VALUES[] = {DEVICE_AUTO, DEVICE_CPU, DEVICE_CUDA};
static const int DTYPE_VALUES[] = {DTYPE_F32, DTYPE_BF16};
static const int COMM_VALUES[] = {RUNTIME_COMM_AUTO, RUNTIME_COMM_NCCL, RUNTIME_COMM_SHM};
static const int GDTYPE_VALUES[] = {COMM_F32, COMM_BF16};
static const int ONOFF_VALUES[] = {1, 0};
static const int GRAPHS_VALUES[] = {GRAPHS_ON, GRAPHS_OFF, GRAPHS_AUTO};
static const int RECOMPUTE_VALUES[] = {MODEL_RECOMPUTE_NONE, MODEL_RECOMPUTE_SELECTIVE, MODEL_RECOMPUTE_FULL};
static const int ATTENTION_VALUES[] = {MODEL_ATTENTION_EXACT, MODEL_ATTENTION_FLASH};
static const int KEEP_VALUES[] = {KEEP_BLEU, KEEP_LOSS};
static const int SAVE_MODE_VALUES[] = {SAVE_SYNC, SAVE_ASYNC};

#define T TrainArgs
#define PRESET_NOTE "from the preset"
#define INT_(n, g, mv, field, l, h) .name = n, .kind = FLAG_INT, .group = g, .metavar = mv, .lo = l, .hi = h, FLAG_AT(T, field)
#define REAL_(n, g, mv, field, l, h, o) \
    .name = n, .kind = FLAG_REAL, .group = g, .metavar = mv, .lo = l, .hi = h, .open = o, FLAG_AT(T, field)
#define STRING_(n, g, mv, field) .name = n, .kind = FLAG_STRING, .group = g, .metavar = mv, FLAG_AT(T, field)
#define SWITCH_(n, g, field) .name = n, .kind = FLAG_SWITCH, .group = g, FLAG_AT(T, field)
#define CHOICE_(n, g, ch, vals, field) .name = n, .kind = FLAG_CHOICE, .group = g, .choices = ch, .values = vals, FLAG_AT(T, field)

static const Flag TRAIN_FLAGS[] = {
    /* Data */
    {STRING_("data", "Data", "DIR[:N],...", data_dir), .dflt = "data/small_parallel_enja",
     .help = "corpus folder with train/dev/test .en/.ja; several (comma-separated) train on the union of their "
             "training pairs, each taken N times an epoch (default 1), with the first's dev and test"},
    {STRING_("cache-dir", "Data", "DIR", cache_dir), .dflt_note = "cache/<corpus folder name>",
     .help = "tokenizers and token files, one folder per --spm-vocab-size and --spm-sample"},
    {CHOICE_("direction", "Data", "en-ja|ja-en", DIR_VALUES, dir), .metavar = "D", .dflt = "en-ja",
     .help = "the translation direction"},
    {INT_("spm-vocab-size", "Data", "N", spm_vocab, 16, 1 << 20),
     .dflt_note = "from the preset: 4000 for cpu, else 8000",
     .help = "SentencePiece pieces when the tokenizer is trained"},
    {INT_("spm-sample", "Data", "N", spm_sample, 1000, 2000000000), .dflt = "2000000",
     .help = "sentences the tokenizer trains on: a uniform seeded sample of the training text (all of it when "
             "smaller); part of the cache folder's name"},
    {INT_("prep-workers", "Data", "N", prep_workers, 0, 1024), .dflt = "0",
     .help = "threads that encode the corpus when its cache is built (0: one per core)"},
    {SWITCH_("strict", "Data", strict), .help = "bad corpus lines are errors instead of skipped"},
    {REAL_("spm-alpha", "Data", "A", spm_alpha, 0.0, 100.0, 0), .dflt = "0",
     .help = "subword regularization (Kudo 2018, fairseq's --sentencepiece-enable-sampling, Marian's "
             "--sentencepiece-alphas): each epoch every training sentence's segmentation is drawn anew, with "
             "probabilities smoothed by A (0.1 to 0.5 typical; 0: off, the best segmentation); dev and test keep "
             "the best"},
    {INT_("spm-nbest", "Data", "N", spm_nbest, -1, 10000), .dflt = "-1",
     .help = "--spm-alpha draws over the N best segmentations (at least 2), or -1: over all of them (the "
             "lattice)"},
    {INT_("batch-tokens", "Data", "N", batch_tokens, 1, 1 << 30), .dflt = "4096",
     .help = "padded tokens per batch, like fairseq's max_tokens"},
    {INT_("length-bucket", "Data", "N", length_bucket, 1, 4096), .dflt = "1",
     .help = "pad each batch's source and target lengths up to multiples of N (at most --max-len), within "
             "--batch-tokens, so batch shapes repeat"},
    {CHOICE_("task", "Data", "copy|reverse", TASK_VALUES, task), .show = show_task,
     .help = "train on a synthetic task instead of a corpus"},
    {INT_("batch-size", "Data", "N", batch_size, 1, 1 << 20), .dflt = "32", .help = "synthetic batches: sequences"},
    {INT_("min-len", "Data", "N", min_len, 1, 1 << 16), .dflt = "4", .help = "synthetic batches: shortest sequence"},
    {INT_("seq-len", "Data", "N", max_len, 1, 1 << 16), .dflt = "12", .help = "synthetic batches: longest sequence"},
    /* Model */
    {.name = "preset", .kind = FLAG_STRING, .group = "Model", .metavar = "NAME", .dflt = "auto", .set = set_preset,
     .show = show_preset,
     .help = "auto | tiny | cpu | small | base | big (auto: base on a GPU; on a CPU cpu for a corpus, tiny for a "
             "--task); it also sets --lr, --warmup, --lr-schedule, --max-steps, --eval-interval, --spm-vocab-size"},
    {INT_("d-model", "Model", "N", cfg.d_model, 1, 65536), .dflt_note = PRESET_NOTE, .help = "model width"},
    {INT_("heads", "Model", "N", cfg.n_heads, 1, 1024), .dflt_note = PRESET_NOTE, .help = "attention heads"},
    {INT_("ffn-hidden-size", "Model", "N", cfg.d_ff, 1, 1 << 20), .dflt_note = PRESET_NOTE,
     .help = "feed-forward hidden size"},
    {.name = "layers", .kind = FLAG_INT, .group = "Model", .metavar = "N", .lo = 0, .hi = 255, .set = set_layers,
     .dflt_note = PRESET_NOTE, .help = "encoder and decoder layers"},
    {INT_("encoder-layers", "Model", "N", cfg.enc_layers, 0, 255), .dflt_note = PRESET_NOTE, .help = "encoder layers"},
    {INT_("decoder-layers", "Model", "N", cfg.dec_layers, 0, 255), .dflt_note = PRESET_NOTE, .help = "decoder layers"},
    {INT_("vocab-size", "Model", "N", cfg.vocab_size, 1, 1 << 24), .dflt_note = PRESET_NOTE,
     .help = "vocabulary of a --task run (a corpus's tokenizer sets it)"},
    {INT_("max-len", "Model", "N", cfg.max_len, 2, 1 << 16), .dflt_note = PRESET_NOTE,
     .help = "longest sequence, in pieces"},
    {REAL_("dropout", "Model", "P", cfg.dropout, 0.0, 1.0, PARSE_HI_OPEN), .dflt_note = PRESET_NOTE,
     .help = "dropout probability (embeddings and every sub-block's output)"},
    {REAL_("attention-dropout", "Model", "P", cfg.attn_dropout, 0.0, 1.0, PARSE_HI_OPEN), .dflt = "0",
     .help = "dropout on the attention probabilities after the softmax (fairseq's --attention-dropout; needs "
             "--attention exact: the probabilities are dropped where they are held, each rank's heads a window of "
             "the whole mask)"},
    {REAL_("activation-dropout", "Model", "P", cfg.act_dropout, 0.0, 1.0, PARSE_HI_OPEN), .dflt = "0",
     .help = "dropout on the feed-forward hidden activations after the activation, before the second linear "
             "layer (fairseq's --activation-dropout)"},
    {REAL_("label-smoothing", "Model", "E", cfg.label_smoothing, 0.0, 1.0, PARSE_HI_OPEN), .dflt_note = PRESET_NOTE,
     .help = "label smoothing of the loss"},
    {CHOICE_("activation", "Model", "relu|gelu", ACT_VALUES, cfg.act), .dflt_note = PRESET_NOTE,
     .help = "the feed-forward activation"},
    /* Training */
    {REAL_("lr", "Training", "LR", opt.lr, 0.0, 10.0, PARSE_LO_OPEN), .dflt_note = PRESET_NOTE,
     .help = "peak learning rate"},
    {INT_("warmup", "Training", "N", opt.warmup, 0, 1 << 30), .dflt_note = PRESET_NOTE,
     .help = "linear warmup steps"},
    {CHOICE_("lr-schedule", "Training", "inv-sqrt|cosine", SCHED_VALUES, opt.schedule), .metavar = "S",
     .dflt_note = PRESET_NOTE,
     .help = "after the warmup: inv-sqrt (lr * sqrt(warmup / step)) or cosine (to 0 at the last step, or when "
             "--max-minutes runs out if that comes first)"},
    {REAL_("weight-decay", "Training", "W", opt.weight_decay, 0.0, 100.0, PARSE_CLOSED), .help = "AdamW weight decay"},
    {REAL_("clip-grad", "Training", "C", opt.clip_norm, 0.0, 1e6, PARSE_CLOSED),
     .help = "clip the global gradient norm to C (0: no clipping)"},
    {REAL_("adam-beta1", "Training", "B", opt.beta1, 0.0, 1.0, PARSE_HI_OPEN), .help = "AdamW beta1"},
    {REAL_("adam-beta2", "Training", "B", opt.beta2, 0.0, 1.0, PARSE_HI_OPEN), .help = "AdamW beta2"},
    {REAL_("adam-eps", "Training", "E", opt.eps, 0.0, 1.0, PARSE_LO_OPEN), .help = "AdamW epsilon"},
    {INT_("max-steps", "Training", "N", max_steps, 1, MAX_RUN_STEPS), .dflt_note = PRESET_NOTE,
     .help = "length of the run in steps (or --epochs)"},
    {INT_("epochs", "Training", "N", epochs, 1, MAX_EPOCHS), .help = "length of the run in passes over the corpus"},
    {REAL_("max-minutes", "Training", "M", max_minutes, 0.0, 1e7, PARSE_LO_OPEN),
     .help = "end the run after the step that passes M minutes of training time (from the first step, set-up left "
             "out; a --resume goes on from the time its checkpoint had spent), with its last evaluation, save and "
             "export as at --max-steps, which still bounds the run; the cosine schedule ends at whichever of the two "
             "comes first (the warmup stays in steps)"},
    {INT_("seed", "Training", "N", seed, 0, 0x7fffffffL), .dflt = "1", .help = "initialisation, data order, dropout"},
    /* Parallelism */
    {INT_("tp", "Parallelism", "N", tp, 1, 4096),
     .dflt_note = "ranks per node as far as the heads allow", .help = "tensor-parallel size (start the ranks with "
                                                                      "tprun)"},
    {INT_("dp", "Parallelism", "N", dp, 1, 1 << 20), .dflt_note = "the ranks --tp and --pp leave",
     .help = "data-parallel size"},
    {CHOICE_("comm", "Parallelism", "auto|nccl|shm", COMM_VALUES, comm), .dflt = "auto",
     .help = "the data groups' collectives (auto: NCCL when every rank has its own GPU, else shared memory)"},
    {REAL_("comm-timeout", "Parallelism", "S", comm_timeout, 0.0, 1e6, PARSE_LO_OPEN), .dflt = "300",
     .help = "a peer silent this long ends the job"},
    {.name = "zero", .kind = FLAG_INT, .group = "Parallelism", .metavar = "0|1|2", .lo = 0, .hi = 3, .dflt = "0",
     .set = set_zero, .show = show_zero,
     .help = "ZeRO stage: 1 shards the AdamW state over dp (reduce-scatter, sharded update, allgather of the "
             "weights); 2 also the gradients (each bucket's storage released after its reduce-scatter); 0: "
             "allreduce"},
    {.name = "grad-bucket-mb", .kind = FLAG_REAL, .group = "Parallelism", .metavar = "M", .lo = 0.0, .hi = 1e6,
     .open = PARSE_LO_OPEN, .dflt = STR(GRAD_BUCKET_MB_DEFAULT), .set = set_bucket, .show = show_bucket,
     .help = "gradient buckets reduced as backward finishes them"},
    {CHOICE_("grad-comm-dtype", "Parallelism", "fp32|bf16", GDTYPE_VALUES, grad.dtype), .metavar = "D",
     .dflt = "fp32", .help = "the data-parallel gradient reduction's type"},
    {CHOICE_("grad-overlap", "Parallelism", "on|off", ONOFF_VALUES, grad.overlap), .dflt = "on",
     .help = "reduce buckets while backward runs (CPU ranks only so far)"},
    {INT_("micro-batches", "Parallelism", "M", micro_batches, 1, 1 << 16), .dflt = "1",
     .help = "micro-batches per dp rank and step, their gradients accumulated (global batch: --batch-tokens x dp x "
             "M)"},
    {INT_("pp", "Parallelism", "N", pp, 1, MAX_PP), .dflt = "1",
     .help = "pipeline stages (1F1B over the micro-batches)"},
    {STRING_("pp-layout", "Parallelism", "L", pp_layout), .dflt_note = "balanced by cost",
     .help = "the stages' layers, e.g. enc:0-3|enc:4-5,dec:0-1|dec:2-5"},
    {CHOICE_("recompute", "Parallelism", "none|selective|full", RECOMPUTE_VALUES, recompute), .metavar = "R",
     .dflt = "none",
     .help = "none, selective (attention probabilities and the streams between a layer's sub-blocks recomputed "
             "in backward) or full (only each layer's input kept; the layer run again in backward); results are "
             "bit for bit those of none"},
    {CHOICE_("attention", "Parallelism", "exact|flash", ATTENTION_VALUES, attention), .metavar = "A",
     .dflt = "exact",
     .help = "exact (the probabilities kept for backward, or recomputed with --recompute) or flash (bf16 only, "
             "head width a multiple of 16 up to 128: a log-sum-exp per row kept instead, the probabilities rebuilt "
             "tile by tile on tensor cores; no (B, H, T, T) tensor at all, results within bf16 rounding of exact)"},
    {SWITCH_("sequence-parallel", "Parallelism", seq_par),
     .help = "with tp > 1: LayerNorms, dropout and residual streams hold 1/tp of the tokens per rank (allgather "
             "and reduce-scatter in place of the tp allreduces; stage messages carry a rank's rows)"},
    {CHOICE_("device", "Parallelism", "auto|cpu|cuda", DEVICE_VALUES, device), .dflt = "auto",
     .help = "where the model runs (auto: cuda when a GPU is visible; LOCAL_RANK picks the GPU)"},
    {CHOICE_("cuda-graphs", "Parallelism", "on|off|auto", GRAPHS_VALUES, cuda_graphs), .dflt = "auto",
     .help = "one rank only: each batch shape's forward and backward captured once as a graph (CUDA graphs; on "
             "the CPU a recording) and replayed whenever the shape comes again, one launch instead of one per op; "
             "results are bit for bit those of off (--length-bucket makes shapes repeat); auto: on for one CUDA "
             "rank with --length-bucket above 1 and no --profile, else off"},
    {CHOICE_("dtype", "Parallelism", "fp32|bf16", DTYPE_VALUES, dtype), .dflt_note = "bf16 on cuda, fp32 on cpu",
     .help = "precision: bf16 GEMM operands (linear biases too, as autocast) with fp32 accumulation, activations "
             "kept in bf16 where backward reads them only as GEMM operands, attention on bf16 q, k, v; fp32 master "
             "weights and optimizer"},
    /* Evaluation */
    {INT_("eval-interval", "Evaluation", "N", eval_interval, 0, 1 << 30), .dflt_note = PRESET_NOTE,
     .help = "dev loss and dev BLEU every N steps and at the end; 0: never"},
    {INT_("beam", "Evaluation", "K", beam, 0, 100), .dflt = "0", .help = "beam for dev BLEU (0: greedy)"},
    /* Checkpoints */
    {STRING_("save", "Checkpoints", "DIR", save_dir),
     .help = "checkpoints: DIR/step_N (sharded; see docs/checkpoints.md), at the end and every --save-interval "
             "steps; SIGTERM, SIGINT or SIGUSR1 (to any rank or to tprun) saves after the current step and exits "
             "75, \"saved on signal\" (--resume auto goes on)"},
    {INT_("save-interval", "Checkpoints", "N", save_interval, 1, 1 << 30), .help = "save every N steps"},
    {INT_("keep-last", "Checkpoints", "K", keep_last, 1, 1 << 20), .help = "keep the newest K checkpoints"},
    {CHOICE_("save-mode", "Checkpoints", "sync|async", SAVE_MODE_VALUES, save_mode), .dflt = "async",
     .help = "async: a save copies this rank's shards to host memory at the step and writes them in a background "
             "thread while training goes on (one write at a time; the end, a signal and --max-minutes wait for "
             "it); sync: training waits for the files. Both publish only a complete checkpoint "
             "(docs/checkpoints.md)"},
    {CHOICE_("keep-best", "Checkpoints", "bleu|loss", KEEP_VALUES, keep_best),
     .help = "keep the checkpoint of the best dev BLEU (or lowest dev loss) as DIR/best (a link to its step_N, the "
             "figure in DIR/best.json), saved at the evaluation that finds it; --keep-last never prunes it"},
    {INT_("patience", "Checkpoints", "N", patience, 1, 1 << 20),
     .help = "end the run after N evaluations without a better --keep-best figure (evaluated, saved and reported "
             "as an early stop)"},
    {INT_("average-last", "Checkpoints", "N", average_last, 1, 1 << 20),
     .help = "at the end, DIR/averaged: the mean of the newest N checkpoints (ckpt average), with its dev BLEU "
             "beside the best single checkpoint's"},
    {STRING_("resume", "Checkpoints", "DIR|auto", resume),
     .help = "continue from a checkpoint (auto: the newest in --save), any layout"},
    {STRING_("export", "Checkpoints", "DIR", export_dir),
     .help = "the final model as one file: config.json, model.safetensors, spm.model"},
    /* Planner */
    {SWITCH_("plan", "Planner", plan),
     .help = "print the predicted peak memory per rank (by tag) and step time (compute, exposed communication, "
             "pipeline bubble) of this layout and exit: 0 if it fits, 3 if a rank does not (through tprun the "
             "ranks also calibrate the collectives; alone, the layout is --tp x --dp x --pp)"},
    {.name = "memory-limit", .kind = FLAG_REAL, .group = "Planner", .metavar = "MIB", .lo = 0.0, .hi = 1e12,
     .open = PARSE_LO_OPEN, .set = set_memory_limit, .show = show_memory_limit,
     .dflt_note = "on a CPU the machine's memory, on a GPU the device's, shared by the ranks on it",
     .help = "what a rank may use"},
    {.name = "layout", .kind = FLAG_STRING, .group = "Planner", .metavar = "auto", .set = set_layout,
     .show = show_layout,
     .help = "search tp, dp, pp, micro-batches, ZeRO, sequence parallelism and recomputation for the world size at "
             "the global batch of --batch-tokens x ranks, keep those that fit, train the predicted fastest (with "
             "--plan: print the ranking and why the others were dropped)"},
    {STRING_("plan-cache", "Planner", "FILE", plan_cache), .dflt_note = "cache/plan_calibration.json",
     .help = "the machine's calibration"},
    /* Output */
    {INT_("log-interval", "Output", "N", log_interval, 1, 1 << 30), .dflt = "50", .help = "a log line every N steps"},
    {STRING_("metrics", "Output", "FILE", metrics_path),
     .help = "JSON Lines: step, loss, lr, grad_norm, tokens_per_s, elapsed_s; step, dev_loss, dev_bleu, elapsed_s; "
             "the configuration in FILE.config.jsonl"},
    {SWITCH_("profile", "Output", profile),
     .help = "time per class of operation (GEMM, attention, LayerNorm, ...) and per op (linear_fwd, "
             "attention_bwd, ...) over the training steps: two tables at the end and a record in --metrics (CUDA "
             "events on a GPU, the wall clock on the CPU)"},
    {STRING_("dump-batches", "Output", "FILE", dump_batches),
     .help = "the training batches of the run, as it read them, written to FILE at the end (safetensors; one rank "
             "only) for replaying them in another framework"},
};
#undef T

static const FlagTable TRAIN_TABLE = {
    .prog = "train_mt",
    .usage = "usage: train_mt [options]\n"
             "Trains the translation model on a corpus folder (--data) or a synthetic --task; start several ranks\n"
             "with tprun. Flags take --flag value or --flag=value; a later flag wins.\n",
    .flags = TRAIN_FLAGS,
    .n = sizeof TRAIN_FLAGS / sizeof TRAIN_FLAGS[0],
};

/* The flags that set the layout, which --layout auto refuses. */
static const char *const LAYOUT_FLAGS[] = {"tp", "dp", "pp", "pp-layout", "micro-batches", "zero", "recompute",
                                           "sequence-parallel", NULL};

/* ---- the steps of parse_args ------------------------------------------------- */

/* The preset (and --device, which `--preset auto` follows) before any other
 * flag, then the defaults: the preset's model and run defaults, the
 * optimizer's, then the table's. The last --preset given counts. */
static void preset_and_defaults(int argc, char **argv, TrainArgs *a) {
    char err[256];
    memset(a, 0, sizeof *a);
    a->preset = "auto";
    bool task = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--task") == 0 || strncmp(argv[i], "--task=", 7) == 0) task = true;
        if (strcmp(argv[i], "--preset") == 0 && i + 1 < argc) a->preset = argv[i + 1];
        else if (strncmp(argv[i], "--preset=", 9) == 0) a->preset = argv[i] + 9;
        else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) a->device = parse_device(argv[i + 1]);
        else if (strncmp(argv[i], "--device=", 9) == 0) a->device = parse_device(argv[i] + 9);
    }
    /* auto: the textbook base model on a GPU; on a CPU the one chosen by
     * time to BLEU for a corpus, the unit tests' tiny one for a --task */
    if (strcmp(a->preset, "auto") == 0) a->preset = device_is_gpu(a->device) ? "base" : task ? "tiny" : "cpu";
    if (config_preset(a->preset, &a->cfg, err, sizeof err)) {
        fprintf(stderr, "train_mt: --preset: %s\n", err);
        exit(2);
    }
    a->opt = optim_defaults();
    const RunDefaults *rd = run_defaults(a->preset);
    a->opt.lr = rd->lr;
    a->opt.warmup = rd->warmup;
    a->opt.schedule = rd->schedule;
    a->spm_vocab = rd->spm_vocab;
    a->max_steps = rd->max_steps;
    a->eval_interval = rd->eval_interval;
    const DeviceChoice device = a->device;
    const char *preset = a->preset;
    if (flags_defaults(&TRAIN_TABLE, a)) exit(2);
    a->device = device;  // its table default, auto, does not undo a --device given
    a->preset = preset;
}

static void usage(FILE *f, const TrainArgs *defaults) { flags_help(f, &TRAIN_TABLE, defaults); }

/* The rules between the checkpoint flags (--save, --resume, --export, --keep-best, --patience, --average-last,
 * --save-interval); each refusal one sentence, exit 2. */
static void validate_checkpoint_args(const TrainArgs *a) {
    if (a->export_dir && a->save_dir && paths_same(a->export_dir, a->save_dir)) {
        fprintf(stderr, "train_mt: --export and --save name the same folder (%s): the export would stand beside "
                        "checkpoints that go on after it; export to a folder of its own\n", a->save_dir);
        exit(2);
    }
    if (a->resume && strcmp(a->resume, "auto") == 0 && !a->save_dir) {
        fprintf(stderr, "train_mt: --resume auto looks in the --save folder; give --save DIR\n");
        exit(2);
    }
    if (a->keep_best && !a->save_dir) {
        fprintf(stderr, "train_mt: --keep-best keeps a checkpoint in the --save folder; give --save DIR\n");
        exit(2);
    }
    if (a->keep_best && !a->eval_interval) {
        fprintf(stderr, "train_mt: --keep-best compares evaluations; give --eval-interval N > 0\n");
        exit(2);
    }
    if (a->keep_best == KEEP_BLEU && a->synthetic) {
        fprintf(stderr, "train_mt: --keep-best bleu needs a corpus (a --task run has no dev BLEU); use --keep-best "
                        "loss\n");
        exit(2);
    }
    if (a->patience && (!a->keep_best || !a->eval_interval)) {
        fprintf(stderr, "train_mt: --patience %d counts evaluations without a better --keep-best figure; give "
                        "--keep-best bleu|loss and --eval-interval N > 0\n", a->patience);
        exit(2);
    }
    if (a->average_last && !a->save_dir) {
        fprintf(stderr, "train_mt: --average-last averages the checkpoints of the --save folder; give --save DIR\n");
        exit(2);
    }
    if (a->average_last && a->keep_last && a->keep_last < a->average_last) {
        fprintf(stderr, "train_mt: --average-last %d needs the newest %d checkpoints, but --keep-last %d keeps "
                        "fewer; raise --keep-last\n", a->average_last, a->average_last, a->keep_last);
        exit(2);
    }
    if (a->save_interval && !a->save_dir) {
        fprintf(stderr, "train_mt: --save-interval needs --save DIR\n");
        exit(2);
    }
}

/* Every rule between flags (the checkpoint flags' in validate_checkpoint_args); each refusal one sentence,
 * exit 2.
 * vocab_given: --vocab-size was on the command line. */
static void validate_args(TrainArgs *a, bool vocab_given) {
    char err[256];
    if (a->epochs && a->steps_given) {
        fprintf(stderr, "train_mt: --epochs %d and --max-steps %d both set the length of the run; give one of them\n",
                a->epochs, a->max_steps);
        exit(2);
    }
    if (a->epochs && a->synthetic) {
        fprintf(stderr, "train_mt: --epochs %d counts passes over a corpus; a --task run takes --max-steps\n",
                a->epochs);
        exit(2);
    }
    if (!a->synthetic && vocab_given) {
        fprintf(stderr, "train_mt: --vocab-size applies to --task runs; with a corpus the tokenizer sets it "
                        "(see --spm-vocab-size)\n");
        exit(2);
    }
    CorpusList corpora;
    if (!a->synthetic && corpus_list_parse(a->data_dir, &corpora, err, sizeof err)) {
        fprintf(stderr, "train_mt: %s\n", err);
        exit(2);
    }
    if (!a->synthetic) a->cfg.vocab_size = a->spm_vocab; /* checked against the tokenizer once loaded */
    if (config_validate(&a->cfg, err, sizeof err)) {
        fprintf(stderr, "train_mt: invalid model configuration: %s\n", err);
        exit(2);
    }
    if (a->synthetic && (a->min_len > a->max_len || a->max_len + 1 > a->cfg.max_len)) {
        fprintf(stderr, "train_mt: --min-len %d / --seq-len %d must satisfy min <= seq and seq + 1 <= max-len %d\n",
                a->min_len, a->max_len, a->cfg.max_len);
        exit(2);
    }
    if (a->spm_nbest == 0 || a->spm_nbest == 1) {
        fprintf(stderr, "train_mt: --spm-nbest %d: give -1 (the whole lattice) or at least 2; no sampling is "
                        "--spm-alpha 0\n", a->spm_nbest);
        exit(2);
    }
    if (a->synthetic && a->spm_alpha > 0) {
        fprintf(stderr, "train_mt: --spm-alpha samples a corpus's segmentations; a --task has no tokenizer\n");
        exit(2);
    }
    if (a->synthetic && a->length_bucket > 1) {
        fprintf(stderr, "train_mt: --length-bucket pads a corpus's batches; a --task batch has one length per batch "
                        "already (--seq-len)\n");
        exit(2);
    }
    if (a->cuda_graphs == GRAPHS_ON && a->profile) {
        fprintf(stderr, "train_mt: --cuda-graphs on and --profile do not mix: the profile times every op; drop one "
                        "of them\n");
        exit(2);
    }
    if (a->cuda_graphs == GRAPHS_ON && (a->tp > 1 || a->dp > 1 || a->pp > 1 || a->layout_auto)) {
        fprintf(stderr, "train_mt: --cuda-graphs on needs one rank (tp, dp and pp 1: the collectives are not "
                        "captured); drop %s\n", a->layout_auto ? "--layout auto" : a->tp > 1 ? "--tp" : a->dp > 1 ? "--dp" : "--pp");
        exit(2);
    }
    if (a->layout_auto && a->layout_flag) {
        fprintf(stderr, "train_mt: --layout auto chooses tp, dp, pp, micro-batches, ZeRO, sequence parallelism and "
                        "recomputation; drop --%s (or drop --layout auto)\n", a->layout_flag);
        exit(2);
    }
    if (a->attention == MODEL_ATTENTION_FLASH && a->cfg.attn_dropout > 0.0f) {
        fprintf(stderr, "train_mt: --attention-dropout %g needs --attention exact: flash attention never holds the "
                        "probabilities it would drop\n", (double)a->cfg.attn_dropout);
        exit(2);
    }
    if (a->pp_layout && a->pp == 1) {
        fprintf(stderr, "train_mt: --pp-layout needs --pp N with N > 1 stages\n");
        exit(2);
    }
    validate_checkpoint_args(a);
    if (!(a->comm_timeout > 0.0)) {
        fprintf(stderr, "train_mt: --comm-timeout must be positive\n");
        exit(2);
    }
    if (!(a->opt.lr > 0.0f) || !(a->opt.beta1 >= 0.0f && a->opt.beta1 < 1.0f) ||
        !(a->opt.beta2 >= 0.0f && a->opt.beta2 < 1.0f) || !(a->opt.eps > 0.0f) || a->opt.weight_decay < 0.0f) {
        fprintf(stderr, "train_mt: optimizer settings out of range (need lr > 0, betas in [0, 1), eps > 0, "
                        "weight decay >= 0)\n");
        exit(2);
    }
}

void parse_args(int argc, char **argv, TrainArgs *a) {
    if (flags_check(&TRAIN_TABLE, argc, argv)) exit(2);  // exact names: no prefixes, one-line refusals
    preset_and_defaults(argc, argv, a);
    const TrainArgs defaults = *a;
    FlagsParsed p;
    const int rc = flags_parse(&TRAIN_TABLE, argc, argv, a, &p);
    if (rc == 1) {
        usage(stdout, &defaults);
        exit(0);
    }
    if (rc) exit(2);
    if (p.n_operands > 0) {
        fprintf(stderr, "train_mt: unexpected argument '%s'\n", p.operands[0]);
        exit(2);
    }
    /* what was given, as against the preset's or the device's */
    a->synthetic = flags_given(&TRAIN_TABLE, &p, "task");
    a->steps_given = flags_given(&TRAIN_TABLE, &p, "max-steps");
    a->dtype_given = flags_given(&TRAIN_TABLE, &p, "dtype");
    a->layout_flag = flags_last_given(&TRAIN_TABLE, &p, LAYOUT_FLAGS);
    const bool vocab_given = flags_given(&TRAIN_TABLE, &p, "vocab-size");
    flags_parsed_free(&p);
    validate_args(a, vocab_given);
}

int args_echo(const TrainArgs *a, FILE *log, int first_step) {
    flags_echo(log, &TRAIN_TABLE, a);
    fflush(log);
    if (!a->metrics_path) return 0;
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s.config.jsonl", a->metrics_path) >= sizeof path) {
        fprintf(stderr, "train_mt: --metrics %s: the path is too long\n", a->metrics_path);
        return -1;
    }
    FILE *f = fopen(path, first_step > 1 ? "a" : "w");
    if (!f) {
        fprintf(stderr, "train_mt: %s: %s\n", path, strerror(errno));
        return -1;
    }
    char *json = flags_echo_json(&TRAIN_TABLE, a);
    const int k = fprintf(f, "{\"first_step\": %d, \"config\": %s}\n", first_step, json);
    free(json);
    if (fclose(f) != 0 || k < 0) {
        fprintf(stderr, "train_mt: %s: writing the file failed (%s)\n", path, strerror(errno));
        return -1;
    }
    return 0;
}
