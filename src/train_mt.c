/* train_mt.c: the trainer.
 *
 * This build trains on a synthetic task (copy or reverse) so the model, the
 * optimizer and the logging can be exercised end to end without a corpus;
 * the corpus reader plugs in as another batch source. Flags follow
 * Megatron/fairseq names. Output: one log line per --log-interval steps on
 * stdout, the same figures as JSON Lines with --metrics FILE, and the final
 * model exported under --save DIR.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "data/synthetic.h"
#include "err.h"
#include "transformer/export.h"
#include "transformer/model.h"
#include "transformer/optim.h"

typedef struct {
    const char *preset;
    ModelConfig cfg;
    OptimConfig opt;
    SynthTask task;
    int batch_size, min_len, max_len;
    int max_steps, log_interval, eval_interval;
    unsigned long long seed;
    const char *save_dir, *metrics_path;
} TrainArgs;

static void usage(FILE *f) {
    fprintf(f,
            "usage: train_mt [options]\n"
            "  --preset NAME          tiny | small | base | big (default tiny)\n"
            "  --d-model N --heads N --ffn-hidden-size N --layers N (encoder and decoder)\n"
            "  --encoder-layers N --decoder-layers N --vocab-size N --max-len N\n"
            "  --dropout P --label-smoothing E --activation relu|gelu\n"
            "  --task copy|reverse    synthetic task (default copy)\n"
            "  --batch-size N         sequences per batch (default 32)\n"
            "  --min-len N --seq-len N  synthetic sequence lengths (default 4..12)\n"
            "  --lr LR --warmup N --weight-decay W --clip-grad C --adam-beta1 B --adam-beta2 B --adam-eps E\n"
            "  --max-steps N          (default 300)\n"
            "  --log-interval N       (default 10)\n"
            "  --eval-interval N      held-out loss every N steps (default 100)\n"
            "  --seed N               (default 1)\n"
            "  --save DIR             export the final model (config.json + model.safetensors)\n"
            "  --metrics FILE         JSON Lines log: step, loss, lr, grad_norm, tokens_per_s[, dev_loss]\n");
}

/* Integer flag value, refusing junk with the flag's name. */
static long parse_long(const char *flag, const char *s, long lo, long hi) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "train_mt: %s expects an integer in [%ld, %ld], got '%s'\n", flag, lo, hi, s);
        exit(2);
    }
    return v;
}

static float parse_float(const char *flag, const char *s) {
    char *end;
    float v = strtof(s, &end);
    if (*s == '\0' || *end != '\0' || !isfinite(v)) {
        fprintf(stderr, "train_mt: %s expects a number, got '%s'\n", flag, s);
        exit(2);
    }
    return v;
}

enum {
    O_PRESET = 256, O_DMODEL, O_HEADS, O_FFN, O_LAYERS, O_ENC, O_DEC, O_VOCAB, O_MAXLEN, O_DROPOUT, O_LS, O_ACT,
    O_TASK, O_BS, O_MINLEN, O_SEQLEN, O_LR, O_WARMUP, O_WD, O_CLIP, O_B1, O_B2, O_EPS, O_STEPS, O_LOGI, O_EVALI,
    O_SEED, O_SAVE, O_METRICS, O_HELP,
};

static void parse_args(int argc, char **argv, TrainArgs *a) {
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
        {"log-interval", required_argument, 0, O_LOGI}, {"eval-interval", required_argument, 0, O_EVALI},
        {"seed", required_argument, 0, O_SEED},       {"save", required_argument, 0, O_SAVE},
        {"metrics", required_argument, 0, O_METRICS}, {"help", no_argument, 0, O_HELP},
        {0, 0, 0, 0},
    };
    char err[256];
    memset(a, 0, sizeof *a);
    a->preset = "tiny";
    /* The preset is applied first so explicit flags override it, whatever their order. */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--preset") == 0 && i + 1 < argc) a->preset = argv[i + 1];
        else if (strncmp(argv[i], "--preset=", 9) == 0) a->preset = argv[i] + 9;
    }
    if (config_preset(a->preset, &a->cfg, err, sizeof err)) {
        fprintf(stderr, "train_mt: --preset: %s\n", err);
        exit(2);
    }
    a->opt = optim_defaults();
    a->opt.lr = 1e-3f;
    a->opt.warmup = 100;
    a->task = SYNTH_COPY;
    a->batch_size = 32;
    a->min_len = 4;
    a->max_len = 12;
    a->max_steps = 300;
    a->log_interval = 10;
    a->eval_interval = 100;
    a->seed = 1;
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case O_PRESET: break;
        case O_DMODEL: a->cfg.d_model = (int)parse_long("--d-model", optarg, 1, 65536); break;
        case O_HEADS: a->cfg.n_heads = (int)parse_long("--heads", optarg, 1, 1024); break;
        case O_FFN: a->cfg.d_ff = (int)parse_long("--ffn-hidden-size", optarg, 1, 1 << 20); break;
        case O_LAYERS:
            a->cfg.enc_layers = a->cfg.dec_layers = (int)parse_long("--layers", optarg, 0, 255);
            break;
        case O_ENC: a->cfg.enc_layers = (int)parse_long("--encoder-layers", optarg, 0, 255); break;
        case O_DEC: a->cfg.dec_layers = (int)parse_long("--decoder-layers", optarg, 0, 255); break;
        case O_VOCAB: a->cfg.vocab_size = (int)parse_long("--vocab-size", optarg, 1, 1 << 24); break;
        case O_MAXLEN: a->cfg.max_len = (int)parse_long("--max-len", optarg, 2, 1 << 16); break;
        case O_DROPOUT: a->cfg.dropout = parse_float("--dropout", optarg); break;
        case O_LS: a->cfg.label_smoothing = parse_float("--label-smoothing", optarg); break;
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
            break;
        case O_BS: a->batch_size = (int)parse_long("--batch-size", optarg, 1, 1 << 20); break;
        case O_MINLEN: a->min_len = (int)parse_long("--min-len", optarg, 1, 1 << 16); break;
        case O_SEQLEN: a->max_len = (int)parse_long("--seq-len", optarg, 1, 1 << 16); break;
        case O_LR: a->opt.lr = parse_float("--lr", optarg); break;
        case O_WARMUP: a->opt.warmup = (int)parse_long("--warmup", optarg, 0, 1 << 30); break;
        case O_WD: a->opt.weight_decay = parse_float("--weight-decay", optarg); break;
        case O_CLIP: a->opt.clip_norm = parse_float("--clip-grad", optarg); break;
        case O_B1: a->opt.beta1 = parse_float("--adam-beta1", optarg); break;
        case O_B2: a->opt.beta2 = parse_float("--adam-beta2", optarg); break;
        case O_EPS: a->opt.eps = parse_float("--adam-eps", optarg); break;
        case O_STEPS: a->max_steps = (int)parse_long("--max-steps", optarg, 1, 1 << 30); break;
        case O_LOGI: a->log_interval = (int)parse_long("--log-interval", optarg, 1, 1 << 30); break;
        case O_EVALI: a->eval_interval = (int)parse_long("--eval-interval", optarg, 1, 1 << 30); break;
        case O_SEED: a->seed = (unsigned long long)parse_long("--seed", optarg, 0, 0x7fffffffL); break;
        case O_SAVE: a->save_dir = optarg; break;
        case O_METRICS: a->metrics_path = optarg; break;
        case O_HELP: usage(stdout); exit(0);
        default: usage(stderr); exit(2);
        }
    }
    if (optind < argc) {
        fprintf(stderr, "train_mt: unexpected argument '%s'\n", argv[optind]);
        exit(2);
    }
    if (config_validate(&a->cfg, err, sizeof err)) {
        fprintf(stderr, "train_mt: invalid model configuration: %s\n", err);
        exit(2);
    }
    if (a->min_len > a->max_len || a->max_len + 1 > a->cfg.max_len) {
        fprintf(stderr, "train_mt: --min-len %d / --seq-len %d must satisfy min <= seq and seq + 1 <= max-len %d\n",
                a->min_len, a->max_len, a->cfg.max_len);
        exit(2);
    }
    if (!(a->opt.lr > 0.0f) || !(a->opt.beta1 >= 0.0f && a->opt.beta1 < 1.0f) ||
        !(a->opt.beta2 >= 0.0f && a->opt.beta2 < 1.0f) || !(a->opt.eps > 0.0f) || a->opt.weight_decay < 0.0f) {
        fprintf(stderr, "train_mt: optimizer settings out of range (need lr > 0, betas in [0, 1), eps > 0, "
                        "weight decay >= 0)\n");
        exit(2);
    }
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Held-out loss: fixed batches from a seed the training stream never uses. */
static float eval_loss(Model *m, const TrainArgs *a) {
    double sum = 0.0;
    long n_tok = 0;
    for (int i = 0; i < 4; i++) {
        OwnedBatch b;
        synth_batch(&b, a->task, &m->cfg, a->batch_size, a->min_len, a->max_len, a->seed ^ 0xE7A1ULL, i);
        int n = 0;
        float loss = model_forward(m, &b.view, false, (DropoutKey){0}, &n);
        sum += (double)loss * n;
        n_tok += n;
        owned_batch_free(&b);
    }
    return n_tok ? (float)(sum / n_tok) : 0.0f;
}

int main(int argc, char **argv) {
    TrainArgs a;
    parse_args(argc, argv, &a);
    char err[512];
    Model m;
    if (model_create(&m, &a.cfg, a.seed, err, sizeof err)) {
        fprintf(stderr, "train_mt: %s\n", err);
        return 2;
    }
    AdamW opt;
    adamw_init(&opt, &a.opt, m.tab.n_elems);
    FILE *metrics = NULL;
    if (a.metrics_path) {
        metrics = fopen(a.metrics_path, "w");
        if (!metrics) {
            fprintf(stderr, "train_mt: --metrics %s: %s\n", a.metrics_path, strerror(errno));
            return 2;
        }
    }
    printf("train_mt: preset %s, d_model %d, heads %d, ffn %d, layers %d+%d, vocab %d, %zu parameters; "
           "synthetic %s task\n",
           a.preset, a.cfg.d_model, a.cfg.n_heads, a.cfg.d_ff, a.cfg.enc_layers, a.cfg.dec_layers, a.cfg.vocab_size,
           m.tab.n_elems, a.task == SYNTH_COPY ? "copy" : "reverse");
    fflush(stdout);

    double t_window = now_s();
    long tok_window = 0;
    for (int step = 1; step <= a.max_steps; step++) {
        OwnedBatch b;
        synth_batch(&b, a.task, &a.cfg, a.batch_size, a.min_len, a.max_len, a.seed, (uint64_t)step);
        DropoutKey key = {.seed = a.seed, .step = (uint32_t)step};
        int n_tok = 0;
        model_zero_grad(&m);
        float loss = model_forward(&m, &b.view, true, key, &n_tok);
        model_backward(&m, &b.view, true, key, n_tok > 0 ? 1.0f / (float)n_tok : 0.0f);
        float gnorm = grad_global_norm(m.grads, m.tab.n_elems);
        if (!isfinite(loss) || !isfinite(gnorm)) {
            fprintf(stderr, "train_mt: step %d: loss %g, gradient norm %g is not finite; stopping "
                            "(lower --lr or raise --warmup)\n", step, loss, gnorm);
            return 1;
        }
        clip_grads(m.grads, m.tab.n_elems, gnorm, a.opt.clip_norm);
        float lr = lr_at(&a.opt, step);
        adamw_step(&opt, m.params, m.grads, &m.tab, lr);
        tok_window += n_tok;
        owned_batch_free(&b);

        bool log = step % a.log_interval == 0 || step == a.max_steps || step == 1;
        bool eval = step % a.eval_interval == 0 || step == a.max_steps;
        if (log) {
            double t = now_s();
            double tps = tok_window / (t - t_window > 1e-9 ? t - t_window : 1e-9);
            printf("step %6d/%d | loss %.4f | lr %.3e | grad_norm %.3f | %.0f tok/s\n", step, a.max_steps, loss, lr,
                   gnorm, tps);
            if (metrics)
                fprintf(metrics, "{\"step\": %d, \"loss\": %.6f, \"lr\": %.6e, \"grad_norm\": %.6f, "
                                 "\"tokens_per_s\": %.1f}\n", step, loss, lr, gnorm, tps);
            t_window = now_s();
            tok_window = 0;
        }
        if (eval) {
            float dev = eval_loss(&m, &a);
            printf("step %6d/%d | held-out loss %.4f\n", step, a.max_steps, dev);
            if (metrics) fprintf(metrics, "{\"step\": %d, \"dev_loss\": %.6f}\n", step, dev);
            t_window = now_s();
        }
        fflush(stdout);
        if (metrics) fflush(metrics);
    }
    int rc = 0;
    if (a.save_dir) {
        if (model_export(&m, a.save_dir, err, sizeof err)) {
            fprintf(stderr, "train_mt: --save: %s\n", err);
            rc = 1;
        } else {
            printf("train_mt: model saved to %s\n", a.save_dir);
        }
    }
    if (metrics && fclose(metrics) != 0) {
        fprintf(stderr, "train_mt: --metrics %s: write failed\n", a.metrics_path);
        rc = 1;
    }
    adamw_free(&opt);
    model_free(&m);
    return rc;
}
