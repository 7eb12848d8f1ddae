/* plan_cli.h: train_mt's --plan and --layout auto: the predicted peak
 * memory per rank and step time of a layout before anything trains, and
 * the choice of the fastest layout that fits.
 */
#ifndef TPTRAIN_APP_PLAN_CLI_H
#define TPTRAIN_APP_PLAN_CLI_H

#include <stdbool.h>

#include "app/args.h"

/* --plan, and --layout auto's choice. choose: pick the fastest layout that
 * fits, set it in a and return 0 for the run to go on (every rank learns
 * rank 0's choice); else print and return the exit status (0 fits, 3 does
 * not, 2 a bad layout, 1 unreadable data). */
int plan_main(TrainArgs *a, bool choose);

#endif
