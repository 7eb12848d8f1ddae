/* evaluate.h: a run's dev figures: the held-out loss of the (sharded)
 * model and, for a corpus, dev BLEU of the whole model's translations.
 */
#ifndef TPTRAIN_APP_EVALUATE_H
#define TPTRAIN_APP_EVALUATE_H

#include <stdbool.h>

#include "app/source.h"
#include "transformer/model.h"

typedef struct { float loss; float bleu; bool has_bleu; } EvalResult;

/* Dev loss on the (sharded) model, and for a corpus dev BLEU of greedy/beam
 * translations by the whole model (`whole`, non-NULL on the rank that
 * decodes), both detokenized back to the corpus tokenization. Called by
 * every rank of one tp group. */
EvalResult evaluate(Model *m, Model *whole, Source *src);

#endif
