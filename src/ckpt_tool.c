/* ckpt_tool.c: the `ckpt` command, for checkpoints written by train_mt --save.
 *
 *   ckpt inspect PATH            what a checkpoint holds, then a full integrity check
 *   ckpt export [--strict] PATH OUT_DIR
 *                                one consolidated model (config.json, model.safetensors, spm.model);
 *                                damaged optimizer shards warned about (--strict: an error)
 *   ckpt average --last N DIR OUT   the mean of DIR's newest N complete checkpoints
 *   ckpt average OUT CKPT1 CKPT2 ...  the mean of the checkpoints named
 *
 * PATH is what --resume accepts: a checkpoint directory or a folder of them
 * (its latest). Both commands sit on the library's own readers
 * (ckpt_resolve, ckpt_read_manifest, ckpt_load, mt_save), so the tool can
 * never disagree with a resume about what a checkpoint means. inspect streams
 * every listed file through CRC-32C, then runs every check a load runs
 * (ckpt_verify: headers, names, labels, shapes, the optimizer's tensors),
 * one shard group in memory at a time.
 * Exit status: 0 ok, 1 a problem with the checkpoint or the output, 2 usage.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/spm.h"
#include "err.h"
#include "fileio.h"
#include "flags.h"
#include "mt.h"
#include "safetensors.h"
#include "train/checkpoint.h"
#include "train/ckpt_average.h"
#include "transformer/export.h"

/* The flags of the commands, one table: --strict belongs to export, --last to average. */
typedef struct {
    bool strict;
    int last;  // 0: not given
} CkptArgs;

static const Flag CKPT_FLAGS[] = {
    {.name = "strict", .kind = FLAG_SWITCH, .group = "export", FLAG_AT(CkptArgs, strict),
     .help = "a damaged optimizer shard is an error (exit 1), not a warning"},
    {.name = "last", .kind = FLAG_INT, .group = "average", .metavar = "N", .lo = 1, .hi = 1000000,
     FLAG_AT(CkptArgs, last), .help = "average DIR's newest N complete step_N checkpoints"},
};

static const FlagTable CKPT_TABLE = {
    .prog = "ckpt",
    .usage = "usage: ckpt inspect PATH\n"
             "       ckpt export [--strict] PATH OUT_DIR\n"
             "       ckpt average --last N DIR OUT\n"
             "       ckpt average OUT CKPT1 CKPT2 ...\n"
             "  PATH     a checkpoint directory (step_N, with manifest.json) or a folder of checkpoints\n"
             "           (train_mt --save DIR: its latest, or else its newest complete step)\n"
             "  inspect  prints step, model, saved layout, data cursor, optimizer, a --max-minutes run's\n"
             "           clock and every file, then checks each file's size and CRC-32C against the\n"
             "           manifest (exit 1 on a problem)\n"
             "  export   assembles the whole model from any layout and writes OUT_DIR/config.json,\n"
             "           model.safetensors and spm.model (the tokenizer, when the run trained on a corpus),\n"
             "           the format of docs/model-and-export.md; a damaged optimizer shard (which the export\n"
             "           does not need) is a warning naming the file, an error (exit 1) with --strict\n"
             "  average  writes OUT, a new checkpoint whose weights are the exact mean of the inputs (summed in\n"
             "           double, rounded once), loaded from whatever layouts they were saved with; the inputs\n"
             "           must be one model. Optimizer state, step and tokenizer are the newest input's, so OUT\n"
             "           loads with --resume, translate_mt --model and ckpt export\n"
             "Flags by command:\n",
    .flags = CKPT_FLAGS,
    .n = sizeof CKPT_FLAGS / sizeof CKPT_FLAGS[0],
    .options = FLAGS_DASH_H,
};

/* PATH -> the checkpoint directory in out; 0, or -1 after printing why. */
static int resolve(const char *arg, char *out, size_t out_len) {
    char err[1024];
    struct stat sb;
    if (stat(arg, &sb) != 0) {
        fprintf(stderr, "ckpt: %s: %s\n", arg, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "ckpt: %s: not a directory (give a checkpoint directory or a folder of checkpoints)\n", arg);
        return -1;
    }
    int found = ckpt_resolve_model(arg, out, out_len, err, sizeof err);
    if (found < 0) {
        fprintf(stderr, "ckpt: %s\n", err);
        return -1;
    }
    if (found == 0) {
        fprintf(stderr, "ckpt: %s: no checkpoint there (no manifest.json, no 'latest', no complete step_N)\n", arg);
        return -1;
    }
    return 0;
}

/* The manifest's "files" object (caller deletes *root); NULL after printing
 * why. The manifest is read through ckpt_manifest (its checksum checked
 * first); ckpt_read_manifest has already validated everything else in it. */
static const cJSON *manifest_files(const char *dir, cJSON **root) {
    char err[1024];
    *root = ckpt_manifest(dir, err, sizeof err);
    if (!*root) {
        fprintf(stderr, "ckpt: %s\n", err);
        return NULL;
    }
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(*root, "files");
    if (!cJSON_IsObject(files)) {
        fprintf(stderr, "ckpt: %s/manifest.json: field 'files' is not an object\n", dir);
        cJSON_Delete(*root);
        return NULL;
    }
    return files;
}

static int cmd_inspect(const char *arg) {
    char dir[4096], err[1024];
    if (resolve(arg, dir, sizeof dir)) return 1;
    ModelConfig cfg;
    OptimConfig oc;
    TrainState st;
    int tp, dp, adam_t;
    if (ckpt_read_manifest(dir, &cfg, &tp, &dp, &oc, &adam_t, &st, err, sizeof err)) {
        fprintf(stderr, "ckpt: %s\n", err);
        return 1;
    }
    cJSON *root = NULL;
    const cJSON *files = manifest_files(dir, &root);
    if (!files) return 1;
    ParamTable whole;
    param_table_build(&cfg, 1, &whole);

    printf("checkpoint %s\n", dir);
    printf("step       %lld\n", (long long)st.step);
    printf("model      d_model %d, heads %d, ffn %d, layers %d+%d, vocab %d, max_len %d, %s, dropout %g "
           "(attention %g, activation %g), label smoothing %g, ln_eps %g; %zu parameters in %d tensors\n",
           cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.enc_layers, cfg.dec_layers, cfg.vocab_size, cfg.max_len,
           activation_name(cfg.act), cfg.dropout, cfg.attn_dropout, cfg.act_dropout, cfg.label_smoothing, cfg.ln_eps,
           whole.n_elems, whole.n);
    printf("mesh       tp %d x dp %d x pp %d (saved layout; any layout loads it)\n", tp, dp, st.pp);
    printf("stages     %s\n", st.pp_layout);
    if (st.corpus)
        printf("data       corpus: epoch %lld, next batch %lld of the epoch; seed %llu\n", (long long)st.cursor.epoch,
               (long long)st.cursor.position, (unsigned long long)st.seed);
    else
        printf("data       synthetic task: position %llu of its batch stream; seed %llu\n", (unsigned long long)st.synth_index,
               (unsigned long long)st.seed);
    printf("optimizer  adamw: lr %g, warmup %d, betas (%g, %g), eps %g, weight decay %g, clip norm %g; t %d\n", oc.lr,
           oc.warmup, oc.beta1, oc.beta2, oc.eps, oc.weight_decay, oc.clip_norm, adam_t);
    if (st.has_clock)
        printf("clock      %.1f s of training (--max-minutes), the last step %.3f s; warm-up %s\n", st.train_s,
               st.step_s, st.warmup_end_s >= 0.0 ? "over" : "not over");
    if (st.zero_stage > 0)
        printf("           state saved as ZeRO-%d pieces (buckets of %llu elements), each dp rank its own\n",
               st.zero_stage, (unsigned long long)st.zero_bucket_elems);
    param_table_free(&whole);

    printf("files\n");
    double total = 0;
    int n_files = 0, rc = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, files) {
        double n_bytes;
        const char *crc;
        if (ckpt_manifest_entry(e, dir, &n_bytes, &crc, err, sizeof err)) {
            fprintf(stderr, "ckpt: %s\n", err);
            rc = 1;
            break;
        }
        printf("  %-40s %12.0f bytes  crc32c %s\n", e->string, n_bytes, crc);
        total += n_bytes;
        n_files++;
    }
    if (rc == 0) printf("total      %.0f bytes (%.2f MiB) in %d files, plus manifest.json\n", total,
                        total / (1024.0 * 1024.0), n_files);

    /* Every shard a load needs must be listed; then every listed file must match. */
    for (int p = 0; p < st.pp && rc == 0; p++) {
        for (int t = 0; t < tp && rc == 0; t++) {
            for (int d = -1; d < dp && rc == 0; d++) {
                char name[96];
                if (d < 0) snprintf(name, sizeof name, "model-tp%d-pp%d.safetensors", t, p);
                else snprintf(name, sizeof name, "optim-tp%d-pp%d-dp%d.safetensors", t, p, d);
                if (!cJSON_GetObjectItemCaseSensitive(files, name)) {
                    tp_error_set(err, sizeof err, "%s/manifest.json: '%s' is not listed, but a tp %d x dp %d x pp %d "
                                 "checkpoint has it", dir, name, tp, dp, st.pp);
                    rc = 1;
                }
            }
        }
    }
    cJSON_ArrayForEach(e, files) {
        if (rc) break;
        if (ckpt_verify_file(dir, files, e->string, err, sizeof err)) rc = 1;
    }
    cJSON_Delete(root);
    /* then what a load checks inside the files (headers, names, labels, shapes, ZeRO pieces) */
    if (rc == 0 && ckpt_verify(dir, CKPT_VERIFY_ALL, err, sizeof err)) rc = 1;
    if (rc) {
        printf("verify     FAILED: %s\n", err);
        fprintf(stderr, "ckpt: %s\n", err);
        return 1;
    }
    printf("verify     ok (%d files read in full: sizes and CRC-32C match the manifest; every shard loads: headers, "
           "labels, shapes, optimizer state)\n", n_files);
    return 0;
}

/* 1 when a and b name the same existing directory. */
/* The optimizer shards an export does not read, checked as a resume would
 * read them: a damaged one is a warning naming the file (the exported model
 * is right, but the checkpoint cannot be resumed), an error with --strict. */
static int check_optimizer(const char *dir, bool strict) {
    char err[1024];
    if (ckpt_verify(dir, CKPT_VERIFY_OPTIM, err, sizeof err) == 0) return 0;
    fprintf(stderr, "ckpt: %s: %s; the model is exported from the weights, but this checkpoint cannot be resumed%s\n",
            strict ? "error (--strict)" : "warning", err, strict ? "" : " (--strict makes this an error)");
    return strict ? -1 : 0;
}

static int cmd_export(const char *arg, const char *out_dir, bool strict) {
    char dir[4096], err[1024], path[4096];
    if (resolve(arg, dir, sizeof dir)) return 1;
    if (paths_same(dir, out_dir)) {
        fprintf(stderr, "ckpt: %s is the checkpoint itself; export to another directory\n", out_dir);
        return 1;
    }
    char holds[4096];
    if (ckpt_resolve(out_dir, holds, sizeof holds, err, sizeof err) > 0) {
        fprintf(stderr, "ckpt: %s holds checkpoints (the newest %s): an export there would stand beside them and go "
                        "stale as they go on; export to a folder of its own\n", out_dir, holds);
        return 1;
    }
    ModelConfig cfg;
    int tp, dp;
    TrainState st;
    if (ckpt_read_manifest(dir, &cfg, &tp, &dp, NULL, NULL, &st, err, sizeof err)) {
        fprintf(stderr, "ckpt: %s\n", err);
        return 1;
    }
    /* The tokenizer goes with the model when the run had one; it is checked
     * against the manifest and the config before anything is written. */
    cJSON *root = NULL;
    const cJSON *files = manifest_files(dir, &root);
    if (!files) return 1;
    const cJSON *spm_entry = cJSON_GetObjectItemCaseSensitive(files, "spm.model");
    int rc = spm_entry ? ckpt_verify_file(dir, files, "spm.model", err, sizeof err) : 0;
    cJSON_Delete(root);
    if (rc) {
        fprintf(stderr, "ckpt: %s\n", err);
        return 1;
    }
    char spm_path[4096];
    pathf(spm_path, sizeof spm_path, "%s/spm.model", dir);
    if (spm_entry) {
        Spm *spm = spm_load(spm_path, err, sizeof err);
        if (!spm) {
            fprintf(stderr, "ckpt: %s\n", err);
            return 1;
        }
        int v = spm_vocab_size(spm);
        spm_free(spm);
        if (v != cfg.vocab_size) {
            fprintf(stderr, "ckpt: %s has %d pieces but the manifest's config says vocab_size %d\n", spm_path, v,
                    cfg.vocab_size);
            return 1;
        }
    } else {
        /* A stale tokenizer next to a model it does not belong to would make
         * the export load with the wrong vocabulary. */
        pathf(path, sizeof path, "%s/spm.model", out_dir);
        if (access(path, F_OK) == 0) {
            fprintf(stderr, "ckpt: the checkpoint has no tokenizer, but %s exists from something else; remove it "
                            "or export to another directory\n", path);
            return 1;
        }
    }

    /* The optimizer shards first: with --strict a damaged one refuses the
     * export before anything is written (a script that only checks for the
     * folder must not find a complete export next to an error). */
    if (check_optimizer(dir, strict)) return 1;
    Model m;
    /* no gradients, no initial values: ckpt_load writes every tensor */
    if (model_create_ex(&m, NULL, &cfg, NULL, 0, MODEL_NO_GRAD_BUFFER | MODEL_NO_INIT, err, sizeof err)) {
        fprintf(stderr, "ckpt: %s\n", err);
        return 1;
    }
    rc = ckpt_load(dir, &m, NULL, err, sizeof err);
    if (rc == 0)
        rc = spm_entry ? mt_save(&m, spm_path, out_dir, err, sizeof err) : model_export(&m, out_dir, err, sizeof err);
    if (rc) fprintf(stderr, "ckpt: %s\n", err);
    else
        printf("ckpt: step %lld (saved as tp %d x dp %d) exported to %s: config.json, model.safetensors%s\n",
               (long long)st.step, tp, dp, out_dir,
               spm_entry ? ", spm.model" : "; no tokenizer (a synthetic-task run): spm.model is absent");
    model_free(&m);
    return rc ? 1 : 0;
}

/* ckpt average: --last N DIR OUT (operands DIR OUT), or OUT CKPT1 CKPT2 ... */
static int cmd_average(int n_last, int argc, char **argv) {
    char err[1024];
    const bool last = n_last > 0;
    if (last ? argc != 2 : argc < 2) {
        fprintf(stderr, "ckpt: average takes --last N DIR OUT, or OUT CKPT1 CKPT2 ...\n");
        return 2;
    }
    const int n = last ? n_last : argc - 1;
    const char *out = last ? argv[1] : argv[0];
    char (*dirs)[4096] = TP_CALLOC((size_t)n, sizeof *dirs);
    const char **in = TP_CALLOC((size_t)n, sizeof *in);
    int rc = 0;
    if (last) {
        int64_t *steps;
        const int have = ckpt_list_complete(argv[0], &steps);
        if (have < n) {
            fprintf(stderr, "ckpt: average --last %d: %s holds %d complete checkpoint%s\n", n, argv[0], have,
                    have == 1 ? "" : "s");
            rc = 1;
        }
        for (int i = 0; i < n && rc == 0; i++)  // oldest first: the order of the sum
            pathf(dirs[i], sizeof dirs[i], "%s/step_%08lld", argv[0], (long long)steps[n - 1 - i]);
        free(steps);
    } else {
        for (int i = 0; i < n && rc == 0; i++) rc = resolve(argv[1 + i], dirs[i], sizeof dirs[i]) ? 1 : 0;
    }
    for (int i = 0; i < n; i++) in[i] = dirs[i];
    if (rc == 0 && ckpt_average(in, n, out, false, err, sizeof err)) {
        fprintf(stderr, "ckpt: average: %s\n", err);
        rc = 1;
    }
    if (rc == 0) {
        printf("ckpt: the mean of %d checkpoint%s written to %s:", n, n == 1 ? "" : "s", out);
        for (int i = 0; i < n; i++) printf(" %s", in[i]);
        printf("\n");
    }
    free(dirs);
    free(in);
    return rc;
}

/* A command's flags and operands; the exit status of a refusal (printed),
 * or -1 when all is well. A flag of another command is refused by name. */
static int command_args(const char *cmd, int argc, char **argv, CkptArgs *a, FlagsParsed *p) {
    memset(a, 0, sizeof *a);
    const int rc = flags_parse(&CKPT_TABLE, argc, argv, a, p);
    if (rc == 1) flags_help(stdout, &CKPT_TABLE, NULL);
    if (rc) return rc == 1 ? 0 : 2;
    for (int i = 0; i < CKPT_TABLE.n; i++)
        if (p->given[i] && strcmp(CKPT_FLAGS[i].group, cmd) != 0) {
            fprintf(stderr, "ckpt: --%s belongs to ckpt %s, not to %s\n", CKPT_FLAGS[i].name, CKPT_FLAGS[i].group,
                    cmd);
            return 2;
        }
    return -1;
}

static int run_command(const char *cmd, int argc, char **argv) {
    CkptArgs a;
    FlagsParsed p;
    int rc = command_args(cmd, argc, argv, &a, &p);
    const int n = p.n_operands;
    if (rc < 0 && strcmp(cmd, "average") == 0) rc = cmd_average(a.last, n, p.operands);
    else if (rc < 0 && strcmp(cmd, "inspect") == 0 && n == 1) rc = cmd_inspect(p.operands[0]);
    else if (rc < 0 && strcmp(cmd, "export") == 0 && n == 2) rc = cmd_export(p.operands[0], p.operands[1], a.strict);
    else if (rc < 0) {
        fprintf(stderr, "ckpt: %s takes %s\n", cmd, strcmp(cmd, "inspect") == 0 ? "PATH" : "PATH OUT_DIR [--strict]");
        rc = 2;
    }
    flags_parsed_free(&p);
    return rc;
}

int main(int argc, char **argv) {
    static const char *const commands[] = {"inspect", "export", "average"};
    if (argc < 2) {
        flags_help(stderr, &CKPT_TABLE, NULL);
        return 2;
    }
    if (argv[1][0] == '-') {  // before a command only --help; one sentence for anything else
        const FlagTable top = {.prog = "ckpt", .usage = "", .options = FLAGS_DASH_H};
        if (flags_check(&top, 2, argv)) return 2;
        flags_help(stdout, &CKPT_TABLE, NULL);
        return 0;
    }
    for (int i = 0; i < 3; i++)
        if (strcmp(argv[1], commands[i]) == 0) return run_command(argv[1], argc - 1, argv + 1);
    const char *near = flag_nearest(argv[1], commands, 3);
    if (near) fprintf(stderr, "ckpt: unknown command '%s'; did you mean %s?\n", argv[1], near);
    else fprintf(stderr, "ckpt: unknown command '%s'; the commands are inspect, export and average (ckpt --help)\n",
                 argv[1]);
    return 2;
}
