/* corpus_list.h: the corpora of one run, as --data names them:
 * "DIR[:COPIES],DIR[:COPIES]...". A run trains on the union of their
 * training splits (corpus k's pairs taken COPIES times an epoch, 1 when
 * not given: fairseq's and Marian's up-sampling of a smaller corpus); the
 * dev and test splits come from the first. A ':' followed by digits only
 * ends an item with its copies; any other ':' belongs to the folder name.
 */
#ifndef TPTRAIN_CORPUS_LIST_H
#define TPTRAIN_CORPUS_LIST_H

#include <stddef.h>

#include "data/dataset.h"

typedef struct {
    int n;
    char dir[DATASET_MAX_CORPORA][1024];
    int copies[DATASET_MAX_CORPORA];
} CorpusList;

/* 0, or -1 + err naming the item (empty, copies outside 1..
 * DATASET_MAX_COPIES, too many corpora, a folder named twice). */
int corpus_list_parse(const char *spec, CorpusList *out, char *err, size_t err_len);

#endif
