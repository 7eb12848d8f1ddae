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
 * This file holds main, the table of contents of a run; its flags are
 * src/app/args.c (the flag table), and each job is a file of src/app/:
 * run.c (set-up and the step loop), source.c (the data), evaluate.c (dev
 * loss, BLEU), report.c (memory, profile, closing lines), persist.c
 * (resume, save, keep-best, average, signals), plan_cli.c and layouts.c
 * (--plan, --layout auto).
 */
#include "app/args.h"
#include "app/plan_cli.h"
#include "app/run.h"
#include "app/startup.h"

int main(int argc, char **argv) {
    Startup boot;  // the phases before the first step (app/startup.h)
    startup_begin(&boot);
    TrainArgs a;
    parse_args(argc, argv, &a);
    if (a.plan) return plan_main(&a, false);  // predict memory and step time, train nothing
    startup_mark(&boot, "arguments");
    if (a.layout_auto) {  // choose the layout, then train it
        const int rc = plan_main(&a, true);
        if (rc) return rc;
        startup_mark(&boot, "layout");
    }
    static Run r;  // static: it holds the stages' table and the layout text; no early return has it to free
    int rc = run_setup(&r, &a, &boot);  // device, ranks, data, model, optimizer, --resume, --metrics
    if (rc || (rc = run_train(&r)) != 0) return rc;  // the steps: train, log, evaluate, save, stop
    rc = run_finish(&r);                             // the last checkpoint, the best one, --average-last
    run_report(&r);                                  // time, collectives, pipeline stages, profile, memory
    if (run_outputs(&r)) rc = 1;                     // --dump-batches, --export
    return run_close(&r, rc);
}
