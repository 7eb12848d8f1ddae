/* train_mt.c: the trainer.
 *
 * Trains on a parallel corpus folder (--data; prepared and cached by
 * data/corpus.h, batched by data/dataset.h) or, with --task, on a synthetic
 * copy/reverse task that needs no corpus. Flags follow Megatron/fairseq
 * names. Output: a log line per --log-interval steps (and, on a terminal, a
 * progress line updated in place), the same figures as JSON Lines with
 * --metrics FILE, dev loss and dev BLEU every --eval-interval steps, and the
 * final model (+ tokenizer) under --save DIR for translate_mt.
 *
 * This file holds the flags and main, the table of contents of a run; each
 * job is a file of src/app/: run.c (set-up and the step loop), source.c
 * (the data), evaluate.c (dev loss, BLEU), report.c (memory, profile,
 * closing lines), persist.c (resume, save, keep-best, average, signals),
 * plan_cli.c and layouts.c (--plan, --layout auto).
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/app.h"
#include "app/args.h"
#include "app/plan_cli.h"
#include "app/run.h"
#include "flags.h"
#include "parse.h"
#include "train/device.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: train_mt [options]\n"
            "data:\n"
            "  --data DIR             corpus folder with train/dev/test .en/.ja (default data/small_parallel_enja)\n"
            "  --cache-dir DIR        tokenizers and token files, one folder per --spm-vocab-size (default\n"
            "                         cache/<corpus folder name>)\n"
            "  --direction D          en-ja (default) or ja-en\n"
            "  --spm-vocab-size N     SentencePiece pieces when the tokenizer is trained (default from the\n"
            "                         preset: 4000 for cpu, else 8000)\n"
            "  --strict               bad corpus lines are errors instead of skipped\n"
            "  --batch-tokens N       padded tokens per batch, like fairseq's max_tokens (default 4096)\n"
            "  --length-bucket N      pad each batch's source and target lengths up to multiples of N (at most\n"
            "                         --max-len), within --batch-tokens, so batch shapes repeat (default 1)\n"
            "  --task copy|reverse    train on a synthetic task instead of a corpus\n"
            "  --batch-size N --min-len N --seq-len N   synthetic batches (default 32 sequences of 4..12)\n"
            "model:\n"
            "  --preset NAME          auto | tiny | cpu | small | base | big (default auto: base on a GPU; on a\n"
            "                         CPU cpu for a corpus, tiny for a --task; it also sets --lr, --warmup,\n"
            "                         --lr-schedule, --max-steps, --eval-interval, --spm-vocab-size)\n"
            "  --d-model N --heads N --ffn-hidden-size N --layers N (encoder and decoder)\n"
            "  --encoder-layers N --decoder-layers N --vocab-size N (synthetic only) --max-len N\n"
            "  --dropout P --label-smoothing E --activation relu|gelu\n"
            "optimizer:\n"
            "  --lr LR --warmup N --weight-decay W --clip-grad C --adam-beta1 B --adam-beta2 B --adam-eps E\n"
            "  --lr-schedule S        after the warmup: inv-sqrt (lr * sqrt(warmup / step)) or cosine (to 0 at\n"
            "                         the last step) (default from the preset)\n"
            "parallelism (start the ranks with tprun):\n"
            "  --tp N --dp N          tensor- and data-parallel sizes (default: tp = ranks per node as far as\n"
            "                         the heads allow, dp = the rest)\n"
            "  --comm auto|nccl|shm   the data groups' collectives (default auto: NCCL when every rank has its\n"
            "                         own GPU, else shared memory)\n"
            "  --comm-timeout S       a peer silent this long ends the job (default 300)\n"
            "  --zero 0|1|2           ZeRO stage: 1 shards the AdamW state over dp (reduce-scatter, sharded\n"
            "                         update, allgather of the weights); 2 also the gradients (each bucket's\n"
            "                         storage released after its reduce-scatter) (default 0: allreduce)\n"
            "  --grad-bucket-mb M     gradient buckets reduced as backward finishes them (default 25)\n"
            "  --grad-comm-dtype D    fp32 or bf16: the data-parallel gradient reduction's type (default fp32)\n"
            "  --grad-overlap on|off  reduce buckets while backward runs (default on; CPU ranks only so far)\n"
            "  --micro-batches M      micro-batches per dp rank and step, their gradients accumulated (global\n"
            "                         batch: --batch-tokens x dp x M; default 1)\n"
            "  --pp N                 pipeline stages (1F1B over the micro-batches; default 1)\n"
            "  --pp-layout L          the stages' layers, e.g. enc:0-3|enc:4-5,dec:0-1|dec:2-5 (default:\n"
            "                         balanced by cost)\n"
            "memory:\n"
            "  --recompute R          none, selective (attention probabilities recomputed in backward) or\n"
            "                         full (only each layer's input kept; the layer run again in backward);\n"
            "                         results are bit for bit those of none (default none)\n"
            "  --sequence-parallel    with tp > 1: LayerNorms, dropout and residual streams hold 1/tp of the\n"
            "                         tokens per rank (allgather and reduce-scatter in place of the tp\n"
            "                         allreduces; stage messages carry a rank's rows)\n"
            "planning:\n"
            "  --plan                 print the predicted peak memory per rank (by tag) and step time (compute,\n"
            "                         exposed communication, pipeline bubble) of this layout and exit: 0 if it\n"
            "                         fits, 3 if a rank does not (through tprun the ranks also calibrate the\n"
            "                         collectives; alone, the layout is --tp x --dp x --pp)\n"
            "  --memory-limit MIB     what a rank may use (default: on a CPU the machine's memory, on a GPU the\n"
            "                         device's, shared by the ranks on it)\n"
            "  --layout auto          search tp, dp, pp, micro-batches, ZeRO, sequence parallelism and\n"
            "                         recomputation for the world size at the global batch of --batch-tokens x\n"
            "                         ranks, keep those that fit, train the predicted fastest (with --plan:\n"
            "                         print the ranking and why the others were dropped)\n"
            "  --plan-cache FILE      the machine's calibration (default cache/plan_calibration.json)\n"
            "device:\n"
            "  --device auto|cpu|cuda where the model runs (default auto: cuda when a GPU is visible;\n"
            "                         LOCAL_RANK picks the GPU)\n"
            "  --dtype fp32|bf16      GEMM precision: bf16 operands with fp32 accumulation, fp32 master\n"
            "                         weights and optimizer (default bf16 on cuda, fp32 on cpu)\n"
            "run:\n"
            "  --max-steps N | --epochs N   length of the run (default from the preset)\n"
            "  --max-minutes M        end the run at the first log step after M minutes of wall time (its last\n"
            "                         evaluation, save and export as at --max-steps; the schedule is unchanged)\n"
            "  --log-interval N       (default 50)\n"
            "  --eval-interval N      dev loss and dev BLEU every N steps (default from the preset) and at the end;\n"
            "                         0: never\n"
            "  --beam K               beam for dev BLEU (default 0 = greedy)\n"
            "  --seed N               (default 1)\n"
            "  --save DIR             checkpoints: DIR/step_N (sharded; see docs/checkpoints.md), at the end\n"
            "                         and every --save-interval N steps; --keep-last K keeps the newest K;\n"
            "                         SIGTERM, SIGINT or SIGUSR1 (to any rank or to tprun) saves after the\n"
            "                         current step and exits 75, \"saved on signal\" (--resume auto goes on)\n"
            "  --keep-best bleu|loss  keep the checkpoint of the best dev BLEU (or lowest dev loss) as DIR/best\n"
            "                         (a link to its step_N, the figure in DIR/best.json), saved at the\n"
            "                         evaluation that finds it; --keep-last never prunes it\n"
            "  --patience N           end the run after N evaluations without a better --keep-best figure\n"
            "                         (evaluated, saved and reported as an early stop)\n"
            "  --average-last N       at the end, DIR/averaged: the mean of the newest N checkpoints (ckpt\n"
            "                         average), with its dev BLEU beside the best single checkpoint's\n"
            "  --resume DIR|auto      continue from a checkpoint (auto: the newest in --save), any layout\n"
            "  --export DIR           the final model as one file: config.json, model.safetensors, spm.model\n"
            "  --metrics FILE         JSON Lines: step, loss, lr, grad_norm, tokens_per_s, elapsed_s; step, dev_loss,\n"
            "                         dev_bleu, elapsed_s\n"
            "  --profile              time per class of operation (GEMM, attention, LayerNorm, ...) over the\n"
            "                         training steps: a table at the end and a record in --metrics (CUDA events\n"
            "                         on a GPU, the wall clock on the CPU)\n"
            "  --dump-batches FILE    the training batches of the run, as it read them, written to FILE at the end\n"
            "                         (safetensors; one rank only) for replaying them in another framework\n");
}

/* Flag values through the project's strict parser (common/parse.h): a
 * refusal is one sentence naming the flag and the value, then exit 2. */
static long flag_int(const char *flag, const char *s, long lo, long hi) {
    char err[256];
    long v;
    if (parse_int(flag, s, lo, hi, &v, err, sizeof err)) {
        fprintf(stderr, "train_mt: %s\n", err);
        exit(2);
    }
    return v;
}

/* A real in [lo, hi] with the ends opened by `open` (PARSE_LO_OPEN, PARSE_HI_OPEN). */
static double flag_real(const char *flag, const char *s, double lo, double hi, int open) {
    char err[256];
    double v;
    if (parse_double_in(flag, s, lo, hi, open, &v, err, sizeof err)) {
        fprintf(stderr, "train_mt: %s\n", err);
        exit(2);
    }
    return v;
}

/* Bounds of the run length: MAX_RUN_STEPS (app/args.h) and the passes over a corpus. */
#define MAX_EPOCHS (1L << 20)

/* Training defaults per preset. cpu: the candidate with the best dev BLEU
 * after about 5 minutes of training with 4 ranks on 2 cores (the main job,
 * docs/cpu-default.md): cosine decay to 0 at the last step, a 4000-piece
 * tokenizer. tiny: the unit tests' model. The others follow the usual
 * recipes for their size. */
typedef struct {
    const char *preset;
    float lr;
    int warmup, max_steps, eval_interval, spm_vocab;
    LrSchedule schedule;
} RunDefaults;
static const RunDefaults RUN_DEFAULTS[] = {
    {"tiny", 2e-3f, 200, 1200, 400, 8000, LR_INV_SQRT},
    {"cpu", 2e-3f, 100, 900, 150, 4000, LR_COSINE},
    {"small", 1e-3f, 1000, 10000, 1000, 8000, LR_INV_SQRT},
    {"base", 7e-4f, 4000, 100000, 2000, 8000, LR_INV_SQRT},
    {"big", 5e-4f, 4000, 100000, 2000, 8000, LR_INV_SQRT},
};

static const RunDefaults *run_defaults(const char *preset) {
    for (size_t i = 0; i < sizeof RUN_DEFAULTS / sizeof RUN_DEFAULTS[0]; i++)
        if (strcmp(RUN_DEFAULTS[i].preset, preset) == 0) return &RUN_DEFAULTS[i];
    return &RUN_DEFAULTS[0];
}

enum {
    O_PRESET = 256, O_DMODEL, O_HEADS, O_FFN, O_LAYERS, O_ENC, O_DEC, O_VOCAB, O_MAXLEN, O_DROPOUT, O_LS, O_ACT,
    O_TASK, O_BS, O_MINLEN, O_SEQLEN, O_LR, O_WARMUP, O_WD, O_CLIP, O_B1, O_B2, O_EPS, O_STEPS, O_EPOCHS, O_LOGI,
    O_EVALI, O_SEED, O_SAVE, O_SAVEI, O_KEEP, O_RESUME, O_EXPORT, O_DUMPB, O_LBUCKET, O_PROFILE, O_KEEPBEST, O_PATIENCE, O_AVGLAST, O_MAXMIN, O_METRICS, O_DATA, O_CACHE, O_DIR, O_SPMV, O_STRICT, O_BTOK, O_BEAM, O_TP, O_DP,
    O_CTIMEOUT, O_DEVICE, O_DTYPE, O_COMM, O_SCHED, O_ZERO, O_BUCKET, O_GDTYPE, O_GOVERLAP, O_MICRO, O_PP, O_PPLAYOUT, O_RECOMPUTE, O_SEQPAR, O_PLAN, O_MEMLIMIT, O_PLANCACHE, O_LAYOUT, O_HELP,
};

static DeviceChoice parse_device(const char *s) {
    DeviceChoice d;
    if (device_choice_parse(s, &d) == 0) return d;
    fprintf(stderr, "train_mt: --device must be auto, cpu or cuda, got '%s'\n", s);
    exit(2);
}

void parse_args(int argc, char **argv, TrainArgs *a) {
    static const struct option opts[] = {
        {"preset", required_argument, 0, O_PRESET},   {"d-model", required_argument, 0, O_DMODEL},
        {"heads", required_argument, 0, O_HEADS},     {"ffn-hidden-size", required_argument, 0, O_FFN},
        {"layers", required_argument, 0, O_LAYERS},   {"encoder-layers", required_argument, 0, O_ENC},
        {"decoder-layers", required_argument, 0, O_DEC}, {"vocab-size", required_argument, 0, O_VOCAB},
        {"max-len", required_argument, 0, O_MAXLEN},  {"dropout", required_argument, 0, O_DROPOUT},
        {"label-smoothing", required_argument, 0, O_LS}, {"activation", required_argument, 0, O_ACT},
        {"task", required_argument, 0, O_TASK},       {"batch-size", required_argument, 0, O_BS},
        {"min-len", required_argument, 0, O_MINLEN},  {"seq-len", required_argument, 0, O_SEQLEN},
        {"lr", required_argument, 0, O_LR},           {"warmup", required_argument, 0, O_WARMUP},
        {"weight-decay", required_argument, 0, O_WD}, {"clip-grad", required_argument, 0, O_CLIP},
        {"adam-beta1", required_argument, 0, O_B1},   {"adam-beta2", required_argument, 0, O_B2},
        {"adam-eps", required_argument, 0, O_EPS},    {"max-steps", required_argument, 0, O_STEPS},
        {"epochs", required_argument, 0, O_EPOCHS},   {"log-interval", required_argument, 0, O_LOGI},
        {"eval-interval", required_argument, 0, O_EVALI}, {"seed", required_argument, 0, O_SEED},
        {"save", required_argument, 0, O_SAVE},       {"metrics", required_argument, 0, O_METRICS},
        {"save-interval", required_argument, 0, O_SAVEI}, {"keep-last", required_argument, 0, O_KEEP},
        {"resume", required_argument, 0, O_RESUME},   {"export", required_argument, 0, O_EXPORT},
        {"data", required_argument, 0, O_DATA},       {"cache-dir", required_argument, 0, O_CACHE},
        {"direction", required_argument, 0, O_DIR},   {"spm-vocab-size", required_argument, 0, O_SPMV},
        {"strict", no_argument, 0, O_STRICT},         {"batch-tokens", required_argument, 0, O_BTOK},
        {"beam", required_argument, 0, O_BEAM},       {"tp", required_argument, 0, O_TP},
        {"dp", required_argument, 0, O_DP},           {"comm-timeout", required_argument, 0, O_CTIMEOUT},
        {"device", required_argument, 0, O_DEVICE},   {"dtype", required_argument, 0, O_DTYPE},
        {"comm", required_argument, 0, O_COMM},       {"lr-schedule", required_argument, 0, O_SCHED},
        {"zero", required_argument, 0, O_ZERO},      {"grad-bucket-mb", required_argument, 0, O_BUCKET},
        {"grad-comm-dtype", required_argument, 0, O_GDTYPE}, {"grad-overlap", required_argument, 0, O_GOVERLAP},
        {"micro-batches", required_argument, 0, O_MICRO},
        {"pp", required_argument, 0, O_PP},           {"pp-layout", required_argument, 0, O_PPLAYOUT},
        {"recompute", required_argument, 0, O_RECOMPUTE}, {"sequence-parallel", no_argument, 0, O_SEQPAR},
        {"plan", no_argument, 0, O_PLAN},            {"memory-limit", required_argument, 0, O_MEMLIMIT},
        {"plan-cache", required_argument, 0, O_PLANCACHE}, {"layout", required_argument, 0, O_LAYOUT},
        {"dump-batches", required_argument, 0, O_DUMPB}, {"max-minutes", required_argument, 0, O_MAXMIN},
        {"length-bucket", required_argument, 0, O_LBUCKET}, {"profile", no_argument, 0, O_PROFILE},
        {"keep-best", required_argument, 0, O_KEEPBEST}, {"patience", required_argument, 0, O_PATIENCE},
        {"average-last", required_argument, 0, O_AVGLAST},
        {"help", no_argument, 0, O_HELP},
        {0, 0, 0, 0},
    };
    char err[256];
    if (flags_check_exact("train_mt", argc, argv, opts)) exit(2);  // exact names: no prefixes, one-line refusals
    memset(a, 0, sizeof *a);
    a->preset = "auto";
    /* The preset is applied first so explicit flags override it, whatever their order. */
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
    a->task = SYNTH_COPY;
    a->batch_size = 32;
    a->min_len = 4;
    a->max_len = 12;
    a->data_dir = "data/small_parallel_enja";
    a->dir = DIR_EN_JA;
    a->batch_tokens = 4096;
    a->length_bucket = 1;
    a->micro_batches = 1;
    a->pp = 1;
    a->spm_vocab = rd->spm_vocab;
    a->grad = (GradSyncConfig){.zero = 0, .dtype = COMM_F32, .bucket_elems = bucket_elems_for_mb(GRAD_BUCKET_MB_DEFAULT),
                               .overlap = true};
    a->max_steps = rd->max_steps;
    a->log_interval = 50;
    a->eval_interval = rd->eval_interval;
    a->seed = 1;
    a->comm_timeout = 300.0;
    bool vocab_given = false;
    int c;
    int opt_index = 0;
    while ((c = getopt_long(argc, argv, "", opts, &opt_index)) != -1) {
        if (c == O_TP || c == O_DP || c == O_PP || c == O_PPLAYOUT || c == O_MICRO || c == O_ZERO || c == O_RECOMPUTE ||
            c == O_SEQPAR)
            a->layout_flag = opts[opt_index].name;
        switch (c) {
        case O_PRESET: break;
        case O_DMODEL: a->cfg.d_model = (int)flag_int("--d-model", optarg, 1, 65536); break;
        case O_HEADS: a->cfg.n_heads = (int)flag_int("--heads", optarg, 1, 1024); break;
        case O_FFN: a->cfg.d_ff = (int)flag_int("--ffn-hidden-size", optarg, 1, 1 << 20); break;
        case O_LAYERS:
            a->cfg.enc_layers = a->cfg.dec_layers = (int)flag_int("--layers", optarg, 0, 255);
            break;
        case O_ENC: a->cfg.enc_layers = (int)flag_int("--encoder-layers", optarg, 0, 255); break;
        case O_DEC: a->cfg.dec_layers = (int)flag_int("--decoder-layers", optarg, 0, 255); break;
        case O_VOCAB:
            a->cfg.vocab_size = (int)flag_int("--vocab-size", optarg, 1, 1 << 24);
            vocab_given = true;
            break;
        case O_MAXLEN: a->cfg.max_len = (int)flag_int("--max-len", optarg, 2, 1 << 16); break;
        case O_DROPOUT: a->cfg.dropout = (float)flag_real("--dropout", optarg, 0.0, 1.0, PARSE_HI_OPEN); break;
        case O_LS: a->cfg.label_smoothing = (float)flag_real("--label-smoothing", optarg, 0.0, 1.0, PARSE_HI_OPEN); break;
        case O_ACT:
            if (activation_parse(optarg, &a->cfg.act)) {
                fprintf(stderr, "train_mt: --activation must be relu or gelu, got '%s'\n", optarg);
                exit(2);
            }
            break;
        case O_TASK:
            if (synth_task_parse(optarg, &a->task)) {
                fprintf(stderr, "train_mt: --task must be copy or reverse, got '%s'\n", optarg);
                exit(2);
            }
            a->synthetic = true;
            break;
        case O_BS: a->batch_size = (int)flag_int("--batch-size", optarg, 1, 1 << 20); break;
        case O_MINLEN: a->min_len = (int)flag_int("--min-len", optarg, 1, 1 << 16); break;
        case O_SEQLEN: a->max_len = (int)flag_int("--seq-len", optarg, 1, 1 << 16); break;
        case O_LR: a->opt.lr = (float)flag_real("--lr", optarg, 0.0, 10.0, PARSE_LO_OPEN); break;
        case O_WARMUP: a->opt.warmup = (int)flag_int("--warmup", optarg, 0, 1 << 30); break;
        case O_SCHED:
            if (lr_schedule_parse(optarg, &a->opt.schedule)) {
                fprintf(stderr, "train_mt: --lr-schedule must be inv-sqrt or cosine, got '%s'\n", optarg);
                exit(2);
            }
            break;
        case O_WD: a->opt.weight_decay = (float)flag_real("--weight-decay", optarg, 0.0, 100.0, 0); break;
        case O_CLIP: a->opt.clip_norm = (float)flag_real("--clip-grad", optarg, 0.0, 1e6, 0); break;
        case O_B1: a->opt.beta1 = (float)flag_real("--adam-beta1", optarg, 0.0, 1.0, PARSE_HI_OPEN); break;
        case O_B2: a->opt.beta2 = (float)flag_real("--adam-beta2", optarg, 0.0, 1.0, PARSE_HI_OPEN); break;
        case O_EPS: a->opt.eps = (float)flag_real("--adam-eps", optarg, 0.0, 1.0, PARSE_LO_OPEN); break;
        case O_STEPS:
            a->max_steps = (int)flag_int("--max-steps", optarg, 1, MAX_RUN_STEPS);
            a->steps_given = true;
            break;
        case O_EPOCHS: a->epochs = (int)flag_int("--epochs", optarg, 1, MAX_EPOCHS); break;
        case O_LOGI: a->log_interval = (int)flag_int("--log-interval", optarg, 1, 1 << 30); break;
        case O_EVALI: a->eval_interval = (int)flag_int("--eval-interval", optarg, 0, 1 << 30); break;
        case O_SEED: a->seed = (unsigned long long)flag_int("--seed", optarg, 0, 0x7fffffffL); break;
        case O_SAVE: a->save_dir = optarg; break;
        case O_SAVEI: a->save_interval = (int)flag_int("--save-interval", optarg, 1, 1 << 30); break;
        case O_KEEP: a->keep_last = (int)flag_int("--keep-last", optarg, 1, 1 << 20); break;
        case O_RESUME: a->resume = optarg; break;
        case O_EXPORT: a->export_dir = optarg; break;
        case O_DUMPB: a->dump_batches = optarg; break;
        case O_LBUCKET: a->length_bucket = (int)flag_int("--length-bucket", optarg, 1, 4096); break;
        case O_PROFILE: a->profile = true; break;
        case O_KEEPBEST:
            if (strcmp(optarg, "bleu") == 0) a->keep_best = KEEP_BLEU;
            else if (strcmp(optarg, "loss") == 0) a->keep_best = KEEP_LOSS;
            else {
                fprintf(stderr, "train_mt: --keep-best must be bleu or loss, got '%s'\n", optarg);
                exit(2);
            }
            break;
        case O_PATIENCE: a->patience = (int)flag_int("--patience", optarg, 1, 1 << 20); break;
        case O_AVGLAST: a->average_last = (int)flag_int("--average-last", optarg, 1, 1 << 20); break;
        case O_MAXMIN: a->max_minutes = flag_real("--max-minutes", optarg, 0.0, 1e7, PARSE_LO_OPEN); break;
        case O_METRICS: a->metrics_path = optarg; break;
        case O_DATA: a->data_dir = optarg; break;
        case O_CACHE: a->cache_dir = optarg; break;
        case O_DIR:
            if (direction_parse(optarg, &a->dir)) {
                fprintf(stderr, "train_mt: --direction must be en-ja or ja-en, got '%s'\n", optarg);
                exit(2);
            }
            break;
        case O_SPMV: a->spm_vocab = (int)flag_int("--spm-vocab-size", optarg, 16, 1 << 20); break;
        case O_STRICT: a->strict = true; break;
        case O_BTOK: a->batch_tokens = (int)flag_int("--batch-tokens", optarg, 1, 1 << 30); break;
        case O_MICRO: a->micro_batches = (int)flag_int("--micro-batches", optarg, 1, 1 << 16); break;
        case O_PP: a->pp = (int)flag_int("--pp", optarg, 1, MAX_PP); break;
        case O_PPLAYOUT: a->pp_layout = optarg; break;
        case O_RECOMPUTE:
            if (strcmp(optarg, "none") == 0) a->recompute = MODEL_RECOMPUTE_NONE;
            else if (strcmp(optarg, "selective") == 0) a->recompute = MODEL_RECOMPUTE_SELECTIVE;
            else if (strcmp(optarg, "full") == 0) a->recompute = MODEL_RECOMPUTE_FULL;
            else {
                fprintf(stderr, "train_mt: --recompute must be none, selective or full, got '%s'\n", optarg);
                exit(2);
            }
            break;
        case O_SEQPAR: a->seq_par = true; break;
        case O_BEAM: a->beam = (int)flag_int("--beam", optarg, 0, 100); break;
        case O_TP: a->tp = (int)flag_int("--tp", optarg, 1, 4096); break;
        case O_DP: a->dp = (int)flag_int("--dp", optarg, 1, 1 << 20); break;
        case O_CTIMEOUT: a->comm_timeout = flag_real("--comm-timeout", optarg, 0.0, 1e6, PARSE_LO_OPEN); break;
        case O_DEVICE: a->device = parse_device(optarg); break;
        case O_DTYPE:
            if (dtype_parse(optarg, &a->dtype)) {
                fprintf(stderr, "train_mt: --dtype must be fp32 or bf16, got '%s'\n", optarg);
                exit(2);
            }
            a->dtype_given = true;
            break;
        case O_COMM:
            if (runtime_comm_parse(optarg, &a->comm)) {
                fprintf(stderr, "train_mt: --comm must be auto, nccl or shm, got '%s'\n", optarg);
                exit(2);
            }
            break;
        case O_ZERO:  // 3 parses, to be refused by name
            a->grad.zero = (int)flag_int("--zero", optarg, 0, 3);
            if (a->grad.zero > 2) {
                fprintf(stderr, "train_mt: --zero %d (ZeRO-%d: sharded parameters) is not built; use 0, 1 or 2\n",
                        a->grad.zero, a->grad.zero);
                exit(2);
            }
            break;
        case O_BUCKET:
            a->grad.bucket_elems = bucket_elems_for_mb(flag_real("--grad-bucket-mb", optarg, 0.0, 1e6, PARSE_LO_OPEN));
            break;
        case O_GDTYPE:
            if (strcmp(optarg, "fp32") == 0) a->grad.dtype = COMM_F32;
            else if (strcmp(optarg, "bf16") == 0) a->grad.dtype = COMM_BF16;
            else {
                fprintf(stderr, "train_mt: --grad-comm-dtype must be fp32 or bf16, got '%s'\n", optarg);
                exit(2);
            }
            break;
        case O_GOVERLAP:
            if (strcmp(optarg, "on") == 0 || strcmp(optarg, "off") == 0) a->grad.overlap = strcmp(optarg, "on") == 0;
            else {
                fprintf(stderr, "train_mt: --grad-overlap must be on or off, got '%s'\n", optarg);
                exit(2);
            }
            break;
        case O_PLAN: a->plan = true; break;
        case O_MEMLIMIT: a->memory_limit = flag_real("--memory-limit", optarg, 0.0, 1e12, PARSE_LO_OPEN) * 1048576.0; break;
        case O_PLANCACHE: a->plan_cache = optarg; break;
        case O_LAYOUT:
            if (strcmp(optarg, "auto") != 0) {
                fprintf(stderr, "train_mt: --layout: '%s' is not a layout choice (auto; or give --tp, --dp, --pp)\n", optarg);
                exit(2);
            }
            a->layout_auto = true;
            break;
        case O_HELP: usage(stdout); exit(0);
        default: usage(stderr); exit(2);
        }
    }
    if (optind < argc) {
        fprintf(stderr, "train_mt: unexpected argument '%s'\n", argv[optind]);
        exit(2);
    }
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
    if (a->synthetic && a->length_bucket > 1) {
        fprintf(stderr, "train_mt: --length-bucket pads a corpus's batches; a --task batch has one length per batch "
                        "already (--seq-len)\n");
        exit(2);
    }
    if (a->resume && strcmp(a->resume, "auto") == 0 && !a->save_dir) {
        fprintf(stderr, "train_mt: --resume auto looks in the --save folder; give --save DIR\n");
        exit(2);
    }
    if (a->layout_auto && a->layout_flag) {
        fprintf(stderr, "train_mt: --layout auto chooses tp, dp, pp, micro-batches, ZeRO, sequence parallelism and "
                        "recomputation; drop --%s (or drop --layout auto)\n", a->layout_flag);
        exit(2);
    }
    if (a->pp_layout && a->pp == 1) {
        fprintf(stderr, "train_mt: --pp-layout needs --pp N with N > 1 stages\n");
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

int main(int argc, char **argv) {
    TrainArgs a;
    parse_args(argc, argv, &a);
    if (a.plan) return plan_main(&a, false);  // predict memory and step time, train nothing
    if (a.layout_auto) {  // choose the layout, then train it
        const int rc = plan_main(&a, true);
        if (rc) return rc;
    }
    static Run r;  // static: it holds the stages' table and the layout text; no early return has it to free
    int rc = run_setup(&r, &a);  // device, ranks, data, model, optimizer, --resume, --metrics
    if (rc || (rc = run_train(&r)) != 0) return rc;  // the steps: train, log, evaluate, save, stop
    rc = run_finish(&r);                             // the last checkpoint, the best one, --average-last
    run_report(&r);                                  // time, collectives, pipeline stages, profile, memory
    if (run_outputs(&r)) rc = 1;                     // --dump-batches, --export
    return run_close(&r, rc);
}
